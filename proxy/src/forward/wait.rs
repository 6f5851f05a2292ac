//! What one try may wait for, and for how long, while its backend has as many connections
//! open as it may: an HTTP/1.1 connection to come back, a share of an HTTP/2 one to come free,
//! or room to dial. And which of a gRPC call's bounds hold once its connection has said what
//! protocol it speaks.

use super::error::ForwardError;
use crate::body::QuietState;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::time::Instant;

/// How long a try may wait for a connection, whether it is waiting now (so a timeout that ends
/// the wait is told apart from one that ends the exchange), and whether it went out over
/// HTTP/2, which changes a gRPC call's bounds.
#[derive(Debug)]
pub(super) struct Wait {
    /// The end of a wait for an HTTP/1.1 connection (`None`: no end).
    http1: Option<Instant>,
    /// The end of a wait for room on an HTTP/2 connection: a gRPC call's own deadline, where
    /// the call sets one, rather than the proxy's default.
    http2: Option<Instant>,
    waiting: AtomicBool,
    over_http2: AtomicBool,
    /// A gRPC call's request-body stall bound, which holds only while the call may go over
    /// HTTP/1.1: its client's word alone must not lift it.
    quiet: Option<Arc<QuietState>>,
}

impl Wait {
    /// A wait that ends at `until` (`None`: never), whatever the protocol.
    #[cfg(test)]
    pub(super) fn until(until: Option<Instant>) -> Self {
        Self::new(until, until, None)
    }

    /// A wait that ends at `http1` for an HTTP/1.1 connection and at `http2` for room on an
    /// HTTP/2 one; `quiet` is lifted once the try goes over HTTP/2.
    pub(super) fn new(
        http1: Option<Instant>,
        http2: Option<Instant>,
        quiet: Option<Arc<QuietState>>,
    ) -> Self {
        Self {
            http1,
            http2,
            waiting: AtomicBool::new(false),
            over_http2: AtomicBool::new(false),
            quiet,
        }
    }

    /// Whether the try is (or was, when its wait was cut off) waiting for a connection.
    pub(super) fn is_waiting(&self) -> bool {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The try goes out on an HTTP/2 connection: a gRPC call's stream may now be quiet for as
    /// long as its peers like.
    pub(super) fn goes_over_http2(&self) {
        self.over_http2.store(true, Ordering::Relaxed);
        if let Some(quiet) = &self.quiet {
            quiet.lift();
        }
    }

    /// Whether the try went out on an HTTP/2 connection.
    pub(super) fn went_over_http2(&self) -> bool {
        self.over_http2.load(Ordering::Relaxed)
    }

    /// Runs `found`, a wait for an HTTP/1.1 connection, counted in `waiters` while it runs.
    pub(super) async fn for_http1<T>(
        &self,
        waiters: &AtomicUsize,
        found: impl Future<Output = Result<T, ForwardError>>,
    ) -> Result<T, ForwardError> {
        self.run(self.http1, waiters, found).await
    }

    /// Runs `found`, a wait for room on an HTTP/2 connection, counted in `waiters` while it
    /// runs.
    pub(super) async fn for_http2<T>(
        &self,
        waiters: &AtomicUsize,
        found: impl Future<Output = Result<T, ForwardError>>,
    ) -> Result<T, ForwardError> {
        self.run(self.http2, waiters, found).await
    }

    /// Runs `found` until `until`, then fails with `Saturated`. `waiters` counts it from
    /// before `found` first looks for room (so whoever makes room after that look sees the
    /// count, and signals) until the wait ends or is dropped.
    async fn run<T>(
        &self,
        until: Option<Instant>,
        waiters: &AtomicUsize,
        found: impl Future<Output = Result<T, ForwardError>>,
    ) -> Result<T, ForwardError> {
        self.waiting.store(true, Ordering::Relaxed);
        waiters.fetch_add(1, Ordering::SeqCst);
        let _counted = Waiting(waiters);
        let found = match until {
            Some(at) => tokio::time::timeout_at(at, found)
                .await
                .unwrap_or(Err(ForwardError::Saturated)),
            None => found.await,
        };
        // Left set when this future is dropped mid-wait: the caller's timeout reads it.
        self.waiting.store(false, Ordering::Relaxed);
        found
    }
}

/// Uncounts a request waiting at the limit when its wait ends or is dropped.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
