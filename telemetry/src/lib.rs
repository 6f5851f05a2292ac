//! How the proxy and the controller report on themselves, set up the same way in both.
//!
//! Logs go to stderr, one line per event: JSON (one object per line, fields as keys, the span
//! path as `spans`, for log collectors) or text (for people). ANSI colours only when stderr is a
//! terminal, so a collector never stores escape codes. The level filter is `RUST_LOG` when set,
//! else `info`.
//!
//! Traces ([`traces`]) are OpenTelemetry spans sent over OTLP (gRPC or HTTP/protobuf), off
//! unless an OTLP endpoint is configured, with the standard `OTEL_*` variables as flags
//! ([`TraceArgs`]). The crate starts the exporter and hands out tracers; what is traced is the
//! caller's business: the proxy starts its request spans itself, the controller exports the
//! `tracing` spans of the modules it names ([`init_logs_and_spans`]).

pub mod traces;

pub use traces::{StartError, TraceArgs, TraceSettings, Traces};

use std::io::IsTerminal as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer, Registry};

/// The shape of log lines (`--log-format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    #[default]
    Text,
}

/// Installs the process's log subscriber. Call once, before anything logs.
///
/// # Errors
/// A subscriber is already installed.
pub fn init_logs(format: LogFormat) -> Result<(), tracing_subscriber::util::TryInitError> {
    init_logs_and_spans(format, None)
}

/// Which `tracing` spans leave the process as OpenTelemetry spans, and through what.
#[derive(Debug)]
pub struct ExportedSpans<'a> {
    pub traces: &'a Traces,
    /// Instrumentation scope of the exported spans (the program's name).
    pub scope: &'static str,
    /// Targets (module paths) whose spans, and their events at `info` and above, are exported;
    /// others only log. A span's parent is its nearest exported ancestor.
    pub targets: &'static [&'static str],
}

/// As [`init_logs`], and with `spans` the `tracing` spans of its targets are exported too,
/// whatever `RUST_LOG` lets through to the log lines.
///
/// # Errors
/// A subscriber is already installed.
pub fn init_logs_and_spans(
    format: LogFormat,
    spans: Option<ExportedSpans<'_>>,
) -> Result<(), tracing_subscriber::util::TryInitError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = Vec::with_capacity(2);
    layers.push(match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
    });
    if let Some(spans) = spans {
        let targets = spans.targets;
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(spans.traces.tracer(spans.scope))
                // Time spent polled and idle, and the thread: not what these spans are about.
                .with_tracked_inactivity(false)
                .with_threads(false)
                .with_filter(tracing_subscriber::filter::filter_fn(move |meta| {
                    (meta.is_span() || *meta.level() <= tracing::Level::INFO)
                        && targets.iter().any(|t| meta.target().starts_with(t))
                }))
                .boxed(),
        );
    }
    tracing_subscriber::registry().with(layers).try_init()
}
