//! OpenTelemetry traces: settings from the standard `OTEL_*` variables (each also a flag), and
//! the exporter that sends finished spans to an OTLP collector.
//!
//! Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and
//! `OTEL_SDK_DISABLED` is not `true`, nor `OTEL_TRACES_EXPORTER` `none`). Settings are checked
//! at start ([`TraceArgs::settings`]) and a malformed one names its variable.
//!
//! Guarantees: a finished span is handed to a bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`) and
//! exported in batches from a thread of its own; when the queue is full, because the collector
//! is slow or down, spans are dropped, never waited for, so the code that ends a span is never
//! held up by the collector. [`Traces::shutdown`] flushes what is queued within a deadline.

mod export;
mod settings;
#[cfg(test)]
mod tests;

pub use settings::{
    Protocol, Sampler, SamplerName, SettingError, TraceArgs, TraceSettings, TracesExporter,
};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use std::time::Duration;

/// The span exporter of a process: hands out tracers, flushes at shutdown. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Traces {
    provider: SdkTracerProvider,
}

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Started outside a tokio runtime, which the exporter's connections run on.
    #[error("the trace exporter must start inside a tokio runtime")]
    NoRuntime,
    #[error("the OTLP trace exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("TLS for the OTLP collector: {0}")]
    Tls(String),
    #[error("the gRPC channel to the OTLP collector: {0}")]
    Channel(String),
}

impl Traces {
    /// Starts the exporter `settings` describe: a batch processor on a thread of its own whose
    /// exports run on the current tokio runtime (gRPC through tonic, HTTP through hyper).
    ///
    /// # Errors
    /// No current tokio runtime, or an exporter that cannot be built (TLS roots).
    pub fn start(settings: &TraceSettings) -> Result<Self, StartError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| StartError::NoRuntime)?;
        let exporter = export::build(settings, runtime)?;
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(settings.batch.max_queue_size)
            .with_max_export_batch_size(settings.batch.max_export_batch_size)
            .with_scheduled_delay(settings.batch.schedule_delay)
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(settings.sampler.to_sdk())
            .with_resource(settings.resource())
            .build();
        Ok(Self { provider })
    }

    /// A tracer whose spans carry `scope` as their instrumentation scope.
    pub fn tracer(&self, scope: &'static str) -> opentelemetry_sdk::trace::SdkTracer {
        self.provider.tracer(scope)
    }

    /// Exports what is queued and stops, waiting at most `within`; spans ended later are
    /// dropped. Runs off the async workers (the processor's shutdown blocks).
    ///
    /// Returns whether everything queued was exported in time.
    pub async fn shutdown(self, within: Duration) -> bool {
        let provider = self.provider;
        let done = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(within));
        // The blocking call returns by `within`; the margin covers the thread's start.
        match tokio::time::timeout(within + Duration::from_secs(1), done).await {
            Ok(Ok(Ok(()))) => true,
            Ok(Ok(Err(e))) => {
                tracing::warn!(error = %e, "spans not exported at shutdown");
                false
            }
            _ => {
                tracing::warn!("spans not exported at shutdown: the exporter did not stop in time");
                false
            }
        }
    }
}
