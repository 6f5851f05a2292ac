//! The bound on a write of a response to the edge that cannot go through
//! ([`ConnectorOptions::send_timeout`](crate::ConnectorOptions::send_timeout)).

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// A write to the edge stayed blocked for the send timeout: the edge took nothing more of
/// the response, most likely because its eyeball stopped reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the edge took nothing of the response for {0:?} (send timeout)")]
pub(crate) struct SendTimedOut(pub(crate) Duration);

/// Polls `write` until it is ready or has been pending for `limit`. A write that is ready at
/// once costs no timer and no clock read: the timer is armed only once it has to wait.
pub(crate) async fn within<T>(
    limit: Duration,
    mut write: impl FnMut(&mut Context<'_>) -> Poll<T>,
) -> Result<T, SendTimedOut> {
    if let Poll::Ready(done) = poll_fn(|cx| Poll::Ready(write(cx))).await {
        return Ok(done);
    }
    let mut expired = pin!(tokio::time::sleep(limit));
    poll_fn(|cx| {
        if let Poll::Ready(done) = write(cx) {
            return Poll::Ready(Ok(done));
        }
        expired.as_mut().poll(cx).map(|()| Err(SendTimedOut(limit)))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ready_write_arms_no_timer_and_a_blocked_one_ends_at_the_limit() {
        let limit = Duration::from_millis(200);
        assert_eq!(within(limit, |_| Poll::Ready(7)).await, Ok(7));
        let start = tokio::time::Instant::now();
        assert_eq!(
            within(limit, |_| Poll::<()>::Pending).await,
            Err(SendTimedOut(limit))
        );
        assert!(start.elapsed() >= limit);
        // A write that goes through before the limit is not cut.
        let mut gate = pin!(tokio::time::sleep(Duration::from_millis(20)));
        assert_eq!(within(limit, |cx| gate.as_mut().poll(cx)).await, Ok(()));
    }
}
