//! A wake told at an instant. A quiet cluster starts no round, so work that waits for a time
//! (a failed write's wait, a read back falling due) tells the round's wake itself then.

use std::sync::Arc;

use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// A timer task that tells a wake at an instant; stopped when dropped, so none outlives the
/// work it was set for.
pub(crate) struct Alarm {
    at: Instant,
    task: AbortHandle,
}

impl Alarm {
    /// `None` outside a tokio runtime: nothing could run the timer there, and nothing would
    /// wait on the wake.
    pub(crate) fn at(at: Instant, wake: &Arc<Notify>) -> Option<Self> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let wake = Arc::clone(wake);
        let task = runtime.spawn(async move {
            tokio::time::sleep_until(at).await;
            wake.notify_one();
        });
        Some(Self {
            at,
            task: task.abort_handle(),
        })
    }

    /// When it tells the wake.
    pub(crate) fn when(&self) -> Instant {
        self.at
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        self.task.abort();
    }
}
