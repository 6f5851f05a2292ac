//! Request mirrors: copies of a request sent to other backends, whose answers are read and
//! dropped.
//!
//! A copy never delays the original: it is sent from a task of its own once the original's
//! body has been buffered, at most [`MAX_MIRRORS_IN_FLIGHT`] at once, and beyond that it is
//! dropped and counted rather than queued.

use super::request::upstream_request;
use super::{TryBody, TryBounds, Upstream};
use crate::body;
use crate::trace::RequestTrace;
use bytes::Bytes;
use http_body_util::BodyExt;
use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Mirror copies in flight at once; beyond this, copies are dropped (never queued behind).
pub const MAX_MIRRORS_IN_FLIGHT: usize = 256;
/// A mirror copy gets this long before it is abandoned.
const MIRROR_TIMEOUT: Duration = Duration::from_secs(10);
/// Most of a mirror's answer read (and dropped) so its connection can go back to the pool.
const MIRROR_DRAIN_LIMIT: usize = 1024 * 1024;

/// Sends the proxy's mirror copies; one per proxy, shared by its requests.
#[derive(Debug)]
pub(crate) struct Mirrors {
    permits: Arc<Semaphore>,
    /// Copies not sent: too many in flight, or the original's body was streamed.
    dropped: Counter,
}

/// Whether a mirror copies this request, its `share` of the time.
fn takes(share: cftunnel_config::Fraction) -> bool {
    share.numerator >= share.denominator
        || rand::random_range(0..share.denominator) < share.numerator
}

impl Mirrors {
    pub(crate) fn new(dropped: Counter) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(MAX_MIRRORS_IN_FLIGHT)),
            dropped,
        }
    }

    /// Counts the copy for a mirror that cannot be sent because the original's body was
    /// streamed, not buffered: when its `share` would have taken this request.
    pub(crate) fn count_unsent(&self, share: cftunnel_config::Fraction) {
        if takes(share) {
            self.dropped.inc();
        }
    }

    /// Sends a copy of the request to a mirror, its `share` of the time, never delaying the
    /// original; with `trace`, the copy gets a client span of its own under the request's.
    pub(crate) fn send(
        &self,
        upstream: &Arc<Upstream>,
        share: cftunnel_config::Fraction,
        parts: &http::request::Parts,
        body: Bytes,
        trace: Option<&RequestTrace>,
    ) {
        if !takes(share) {
            return;
        }
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            self.dropped.inc();
            return;
        };
        let Ok(mut req) = upstream_request(
            parts,
            parts.headers.clone(),
            upstream,
            body::full(body.clone()),
        ) else {
            return;
        };
        let span = trace.map(|t| t.start_mirror(&mut req, upstream));
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match upstream
                .send(
                    req,
                    TryBounds::same(Some(MIRROR_TIMEOUT)),
                    TryBody::Held(body),
                )
                .await
            {
                Ok((resp, _)) => {
                    let span = span.map(|mut span| {
                        span.answered(resp.status().as_u16());
                        span
                    });
                    // Read and dropped frame by frame, so the connection can be reused; a
                    // mirror answering more than that is cut off rather than held.
                    let drain = async {
                        let mut body = resp.into_body();
                        let mut left = MIRROR_DRAIN_LIMIT;
                        while let Some(Ok(frame)) = body.frame().await {
                            let len = frame.data_ref().map_or(0, Bytes::len);
                            match left.checked_sub(len) {
                                Some(rest) => left = rest,
                                None => break,
                            }
                        }
                    };
                    let _ = tokio::time::timeout(MIRROR_TIMEOUT, drain).await;
                    if let Some(span) = span {
                        span.end();
                    }
                }
                Err(e) => {
                    if let Some(span) = span {
                        span.failed(e.label());
                    }
                    tracing::debug!(error = %e, "mirror request failed");
                }
            }
        });
    }
}
