//! Reconnect backoff and the QUIC to HTTP/2 fallback decision (pure).

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Exponential backoff with full jitter, as `cloudflared`'s: the n-th retry
/// since a reset waits a uniformly random time below `base * 2^n`, the
/// exponent capped at `max_retries` (with base 1 s and 5 retries: up to 2 s,
/// 4 s, ... 32 s, then 32 s forever). The retry count stops at `max_retries`
/// too; it is what `numPreviousAttempts` reports.
///
/// `cloudflared`'s log line ("Retrying connection in up to ...") reads 2 s, 4 s,
/// ... 32 s, then 64 s forever, but only the line says 64: it is worked out
/// before the retry is counted, with one doubling more (`GetMaxBackoffDuration`,
/// `base << (retries + 1)`), while the wait itself is drawn once the count has
/// stopped at the cap (`BackoffTimer`, `base << retries`), so it stays below
/// 32 s. Both in `retry/backoffhandler.go`.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    base: Duration,
    max_retries: u32,
    retries: u32,
}

impl Backoff {
    pub(crate) fn new(base: Duration, max_retries: u32) -> Self {
        Self {
            base,
            max_retries,
            retries: 0,
        }
    }

    /// Retries so far, at most `max_retries` (sent as `numPreviousAttempts`).
    pub(crate) fn retries(&self) -> u32 {
        self.retries
    }

    /// Upper bound of the next wait.
    pub(crate) fn max_wait(&self) -> Duration {
        let exp = (self.retries + 1).min(self.max_retries);
        self.base.saturating_mul(1u32 << exp.min(20))
    }

    /// Next wait for a uniform `jitter` in `[0, 1)`; counts one retry.
    pub(crate) fn next_wait(&mut self, jitter: f64) -> Duration {
        let wait = self.max_wait().mul_f64(jitter.clamp(0.0, 1.0));
        self.retries = (self.retries + 1).min(self.max_retries);
        wait
    }

    /// A random time below `base * 2^(retries+2)` after which the count may
    /// start over (`cloudflared`'s grace period).
    fn grace(&self, jitter: f64) -> Duration {
        let exp = (self.retries + 2).min(20);
        self.base
            .saturating_mul(1u32 << exp)
            .mul_f64(jitter.clamp(0.0, 1.0))
    }

    pub(crate) fn reset(&mut self) {
        self.retries = 0;
    }

    /// Whether the retry count has reached its cap (`cloudflared`'s
    /// `ReachedMaxRetries`).
    pub(crate) fn exhausted(&self) -> bool {
        self.retries == self.max_retries
    }
}

/// The wait `cloudflared`'s supervisor adds before it restarts a failed
/// connection other than the first, after that connection's own backoff. One
/// timer serves them all: a connection that fails while it runs restarts when
/// it ends. Its retry count starts over once every one of these connections
/// has registered and a random grace period has passed.
#[derive(Debug)]
pub(crate) struct SharedBackoff {
    inner: Mutex<SharedState>,
}

#[derive(Debug)]
struct SharedState {
    backoff: Backoff,
    timer: Option<Instant>,
    reset_after: Option<Instant>,
    /// Connections starting, or waiting to restart, that have not registered.
    unsettled: usize,
}

impl SharedBackoff {
    pub(crate) fn new(base: Duration, max_retries: u32) -> Self {
        Self {
            inner: Mutex::new(SharedState {
                backoff: Backoff::new(base, max_retries),
                timer: None,
                reset_after: None,
                unsettled: 0,
            }),
        }
    }

    /// When a connection that failed at `now` may restart: the end of the
    /// running timer, or of a new one drawn with `jitter`.
    pub(crate) fn restart_at(&self, now: Instant, jitter: f64) -> Instant {
        let Ok(mut s) = self.inner.lock() else {
            return now;
        };
        if let Some(end) = s.timer.filter(|end| *end > now) {
            return end;
        }
        if s.reset_after.is_some_and(|r| now > r) {
            s.backoff.reset();
            s.reset_after = None;
        }
        let end = now + s.backoff.next_wait(jitter);
        s.timer = Some(end);
        end
    }

    /// A connection starts, or restarts after it was lost.
    pub(crate) fn connecting(&self) {
        if let Ok(mut s) = self.inner.lock() {
            s.unsettled += 1;
        }
    }

    /// A connection registered; when none is left to register, the retry count
    /// is due to start over after a grace period drawn with `jitter`.
    pub(crate) fn registered(&self, now: Instant, jitter: f64) {
        if let Ok(mut s) = self.inner.lock() {
            s.unsettled = s.unsettled.saturating_sub(1);
            if s.unsettled == 0 {
                s.reset_after = Some(now + s.backoff.grace(jitter));
            }
        }
    }
}

/// Transport a connection uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Quic,
    Http2,
}

/// The protocol an `auto` connection uses next, decided as `cloudflared`
/// decides it once the backoff after a failure that may change the protocol
/// is over (and only while no connection ever registered over QUIC): HTTP/2
/// when the retries are exhausted or QUIC looks broken, else back to QUIC
/// unless the connection is in a fallback that has not registered yet.
pub(crate) fn next_transport(
    current: Transport,
    in_fallback: bool,
    retries_exhausted: bool,
    quic_broken: bool,
) -> Transport {
    if retries_exhausted || quic_broken {
        Transport::Http2
    } else if in_fallback {
        current
    } else {
        Transport::Quic
    }
}

/// `cloudflared`'s default `--max-edge-addr-retries`.
pub(crate) const MAX_EDGE_ADDR_RETRIES: u8 = 8;

/// A connection's dial failures as `cloudflared` counts them: each moves the
/// connection to another address, and every one past [`MAX_EDGE_ADDR_RETRIES`]
/// also lets the protocol change, then counting starts over. Nothing else
/// resets the count, registering included.
#[derive(Debug, Default)]
pub(crate) struct DialFailures(u8);

impl DialFailures {
    /// Counts a failure; whether it may change the protocol.
    pub(crate) fn exhausted(&mut self) -> bool {
        if self.0 >= MAX_EDGE_ADDR_RETRIES {
            self.0 = 0;
            return true;
        }
        self.0 += 1;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_and_reset() {
        let mut b = Backoff::new(Duration::from_secs(1), 5);
        let maxes: Vec<u64> = (0..8)
            .map(|_| {
                let m = b.max_wait().as_secs();
                b.next_wait(0.5);
                m
            })
            .collect();
        // `cloudflared` logs 64 s from the sixth retry on, but waits below 32 s.
        assert_eq!(maxes, vec![2, 4, 8, 16, 32, 32, 32, 32]);
        assert_eq!(b.retries(), 5, "numPreviousAttempts stops at the cap");
        b.reset();
        assert_eq!(b.next_wait(0.5), Duration::from_secs(1));
        assert_eq!(b.next_wait(0.0), Duration::ZERO);
        let mut none = Backoff::new(Duration::from_secs(1), 0);
        assert_eq!(none.next_wait(0.5), Duration::from_millis(500));
        assert_eq!(none.retries(), 0);
    }

    #[test]
    fn connections_that_fail_together_wait_for_one_timer() {
        let shared = SharedBackoff::new(Duration::from_secs(10), 5);
        let t0 = Instant::now();
        let end = shared.restart_at(t0, 0.5);
        assert_eq!(end, t0 + Duration::from_secs(10));
        assert_eq!(shared.restart_at(t0 + Duration::from_secs(3), 0.9), end);
        // Once it has run out, a failure starts the next, longer timer.
        let later = end + Duration::from_millis(1);
        assert_eq!(
            shared.restart_at(later, 0.5),
            later + Duration::from_secs(20)
        );
        let mut now = later;
        for _ in 0..8 {
            now += Duration::from_secs(400);
            let end = shared.restart_at(now, 0.999_999);
            assert!(end - now <= Duration::from_secs(320), "{:?}", end - now);
        }
    }

    #[test]
    fn the_shared_count_starts_over_after_everyone_registered() {
        let shared = SharedBackoff::new(Duration::from_secs(10), 5);
        let mut now = Instant::now();
        shared.connecting();
        shared.connecting();
        for _ in 0..5 {
            now += Duration::from_secs(400);
            shared.restart_at(now, 0.0);
        }
        shared.registered(now, 0.5);
        now += Duration::from_secs(10_000);
        assert_eq!(
            shared.restart_at(now, 0.5),
            now + Duration::from_secs(160),
            "one connection has not registered yet"
        );
        shared.registered(now, 0.5);
        // The grace period: half of 10 s * 2^7.
        now += Duration::from_secs(641);
        assert_eq!(
            shared.restart_at(now, 0.5),
            now + Duration::from_secs(10),
            "counting starts over"
        );
    }

    #[test]
    fn the_protocol_changes_as_cloudflared_changes_it() {
        use Transport::{Http2, Quic};
        assert_eq!(next_transport(Quic, false, true, false), Http2);
        assert_eq!(next_transport(Quic, false, false, true), Http2);
        assert_eq!(next_transport(Quic, false, false, false), Quic);
        // Back to QUIC after a fallback that registered (no longer in fallback)...
        assert_eq!(next_transport(Http2, false, false, false), Quic);
        // ...but not from a fallback that has not.
        assert_eq!(next_transport(Http2, true, false, false), Http2);
        assert_eq!(next_transport(Http2, true, true, false), Http2);
    }

    #[test]
    fn every_ninth_dial_failure_may_change_the_protocol() {
        let mut d = DialFailures::default();
        let pattern: Vec<bool> = (0..18).map(|_| d.exhausted()).collect();
        let mut expected = [false; 18];
        expected[8] = true;
        expected[17] = true;
        assert_eq!(pattern, expected);
    }

    #[test]
    fn retries_are_exhausted_at_the_cap() {
        let mut b = Backoff::new(Duration::from_secs(1), 5);
        let exhausted: Vec<bool> = (0..6)
            .map(|_| {
                b.next_wait(0.5);
                b.exhausted()
            })
            .collect();
        assert_eq!(exhausted, [false, false, false, false, true, true]);
    }
}
