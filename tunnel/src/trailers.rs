//! Response trailers a QUIC stream cannot carry. The edge has no way to take them over QUIC
//! (nor has `cloudflared`'s QUIC transport), so they are dropped; gRPC's status is one, and its
//! clients then fail every call with nothing said at the connector. Each drop is counted, and
//! a warning naming the fix goes out at most once per [`WARN_EVERY`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

/// The least time between two warnings: a tunnel that drops the trailers of every gRPC call
/// would otherwise log a line per call.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(60);

/// The connector's count of dropped trailers and when it last warned of them. Touched only
/// when a response has trailers to drop.
#[derive(Debug)]
pub(crate) struct DroppedTrailers {
    counter: Counter,
    start: Instant,
    /// Milliseconds after `start` before which no other warning goes out.
    quiet_until: AtomicU64,
}

impl DroppedTrailers {
    pub(crate) fn new(counter: Counter) -> Self {
        Self {
            counter,
            start: Instant::now(),
            quiet_until: AtomicU64::new(0),
        }
    }

    /// Counts a response whose trailers were dropped, and warns unless a warning went out
    /// less than [`WARN_EVERY`] ago.
    pub(crate) fn record(&self) {
        let total = self.counter.inc().saturating_add(1);
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        if claim(&self.quiet_until, now, WARN_EVERY.as_millis() as u64) {
            tracing::warn!(
                dropped_total = total,
                "response trailers dropped: the QUIC tunnel transport cannot carry them, so \
                 gRPC responses lose their status (clients see INTERNAL); set \
                 PROXY_TUNNEL_PROTOCOL=http2"
            );
        }
    }
}

/// Whether a warning is due at `now` (milliseconds), claiming the next `every` when it is:
/// of callers racing at the same moment, one gets `true`.
fn claim(quiet_until: &AtomicU64, now: u64, every: u64) -> bool {
    let until = quiet_until.load(Ordering::Relaxed);
    now >= until
        && quiet_until
            .compare_exchange(
                until,
                now.saturating_add(every),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_is_due_at_the_first_drop_then_once_per_interval() {
        let quiet_until = AtomicU64::new(0);
        let due: Vec<bool> = [0, 1, 59_999, 60_000, 60_001, 200_000, 259_999, 260_000]
            .into_iter()
            .map(|now| claim(&quiet_until, now, 60_000))
            .collect();
        assert_eq!(
            due,
            [true, false, false, true, false, true, false, true],
            "warned at 0, 60 000, 200 000, 260 000"
        );
    }

    #[test]
    fn every_drop_is_counted_whether_or_not_it_warns() {
        let counter = Counter::default();
        let dropped = DroppedTrailers::new(counter.clone());
        for _ in 0..3 {
            dropped.record();
        }
        assert_eq!(counter.get(), 3);
    }
}
