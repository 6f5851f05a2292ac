//! Request-stream tasks of one edge connection: tracked so a drain can wait
//! for them, cancelled when the connection ends so no service future
//! outlives its stream.

use std::future::Future;

use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

/// One request stream, counted for as long as it lives: in the drain's wait and in the
/// active-streams gauge. It goes with the stream's task, or after an upgrade with the
/// upgraded connection, so a drain keeps the edge connection open for a live WebSocket
/// as it does for a request in flight.
pub(crate) struct InFlight {
    _token: TaskTrackerToken,
    gauge: Gauge,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

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

    /// Counts a new request stream in `gauge` and in this connection's drain.
    pub(crate) fn in_flight(&self, gauge: &Gauge) -> InFlight {
        gauge.inc();
        InFlight {
            _token: self.tracker.token(),
            gauge: gauge.clone(),
        }
    }

    /// Resolves once every task and every [`InFlight`] has ended (after
    /// [`close`](Self::close)).
    pub(crate) async fn wait(&self) {
        self.tracker.wait().await;
    }

    pub(crate) fn close(&self) {
        self.tracker.close();
    }

    /// Cancels every task now.
    pub(crate) fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Cancels every task when the returned guard drops.
    pub(crate) fn cancel_on_drop(&self) -> DropGuard {
        self.cancel.clone().drop_guard()
    }
}
