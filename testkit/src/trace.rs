//! Logs for tests.

/// Installs a `tracing` subscriber for this test binary: the filter from `RUST_LOG`
/// (default `warn`), written through the test harness, so a test's lines are shown only
/// when it fails. Later calls do nothing.
pub fn trace_init() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}
