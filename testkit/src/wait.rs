//! Waiting in tests for a state that other tasks bring about.

use std::time::Duration;

/// How often [`wait_until`] checks.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Polls `f` every [`POLL_INTERVAL`] until it holds. Unbounded: the test's own timeout
/// bounds it.
pub async fn wait_until(mut f: impl FnMut() -> bool) {
    while !f() {
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
