//! Request-stream tasks of one edge connection: cancelled when the connection
//! ends so no service future outlives its stream.

use std::future::Future;

use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::{CancellationToken, DropGuard};

/// One request stream, counted in the active-streams gauge for as long as it lives. It
/// goes with the stream's task, or after an upgrade with the upgraded connection.
pub(crate) struct InFlight {
    gauge: Gauge,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

#[derive(Clone, Default)]
pub(crate) struct StreamTasks {
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
        tokio::spawn(async move {
            tokio::select! {
                () = fut => {}
                () = cancel.cancelled() => {}
            }
        });
    }

    /// Counts a new request stream in `gauge`.
    pub(crate) fn in_flight(&self, gauge: &Gauge) -> InFlight {
        gauge.inc();
        InFlight {
            gauge: gauge.clone(),
        }
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
