//! How the proxy and the controller report on themselves, set up the same way in both.
//!
//! Logs go to stderr, one line per event: JSON (one object per line, fields as keys, the span
//! path as `spans`, for log collectors) or text (for people). ANSI colours only when stderr is a
//! terminal, so a collector never stores escape codes. The level filter is `RUST_LOG` when set,
//! else `info`.

use std::io::IsTerminal as _;

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
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(true)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    }
}
