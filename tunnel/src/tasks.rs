//! Request-stream tasks of one edge connection: tracked so a drain can wait
//! for them, cancelled when the connection ends so no service future
//! outlives its stream.

use std::future::Future;

use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

#[derive(Clone, Default)]
pub(crate) struct StreamTasks {
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl StreamTasks {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        // Boxed once here: a stream future runs to kilobytes, and spawning moves
        // its task several times on the way to the scheduler.
        let fut = Box::pin(fut);
        let cancel = self.cancel.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                () = fut => {}
                () = cancel.cancelled() => {}
            }
        });
    }

    /// Resolves once every task has finished (after [`close`](Self::close)).
    pub(crate) async fn wait(&self) {
        self.tracker.wait().await;
    }

    pub(crate) fn close(&self) {
        self.tracker.close();
    }

    /// Cancels every task when the returned guard drops.
    pub(crate) fn cancel_on_drop(&self) -> DropGuard {
        self.cancel.clone().drop_guard()
    }
}
