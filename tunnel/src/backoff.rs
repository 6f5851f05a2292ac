//! Reconnect backoff and the QUIC to HTTP/2 fallback decision (pure).

use std::time::Duration;

/// Per-connection-index exponential backoff with full jitter: the n-th
/// retry waits a uniformly random time below `base * 2^(n+1)`, the
/// exponent capped at `max_retries` (with base 1 s and 5 retries: up to 2 s,
/// 4 s, ... 64 s, then 64 s forever). Reset once a connection registers.
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

    /// Retries so far (sent as `numPreviousAttempts`).
    pub(crate) fn retries(&self) -> u32 {
        self.retries
    }

    /// Upper bound of the next wait.
    pub(crate) fn max_wait(&self) -> Duration {
        let exp = self.retries.min(self.max_retries) + 1;
        self.base.saturating_mul(1u32 << exp.min(20))
    }

    /// Next wait for a uniform `jitter` in `[0, 1)`; counts one retry.
    pub(crate) fn next_wait(&mut self, jitter: f64) -> Duration {
        let wait = self.max_wait().mul_f64(jitter.clamp(0.0, 1.0));
        self.retries = self.retries.saturating_add(1);
        wait
    }

    pub(crate) fn reset(&mut self) {
        self.retries = 0;
    }
}

/// Transport a connection uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Quic,
    Http2,
}

/// Whether an `auto` connection that failed on QUIC should switch to
/// HTTP/2: QUIC looks broken (handshake timed out) or the retries on
/// connectivity errors are exhausted, and no connection of this connector
/// ever registered over QUIC.
pub(crate) fn should_fall_back(
    auto: bool,
    current: Transport,
    quic_ever_registered: bool,
    handshake_timed_out: bool,
    consecutive_dial_failures: u32,
    max_retries: u32,
) -> bool {
    auto && current == Transport::Quic
        && !quic_ever_registered
        && (handshake_timed_out || consecutive_dial_failures > max_retries)
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
        assert_eq!(maxes, vec![2, 4, 8, 16, 32, 64, 64, 64]);
        assert_eq!(b.retries(), 8);
        b.reset();
        assert_eq!(b.next_wait(0.5), Duration::from_secs(1));
        assert_eq!(b.next_wait(0.0), Duration::ZERO);
    }

    #[test]
    fn fallback_only_for_auto_quic_that_never_registered() {
        assert!(should_fall_back(true, Transport::Quic, false, true, 0, 5));
        assert!(should_fall_back(true, Transport::Quic, false, false, 6, 5));
        assert!(!should_fall_back(true, Transport::Quic, false, false, 5, 5));
        assert!(!should_fall_back(true, Transport::Quic, true, true, 9, 5));
        assert!(!should_fall_back(false, Transport::Quic, false, true, 9, 5));
        assert!(!should_fall_back(true, Transport::Http2, false, true, 9, 5));
    }
}
