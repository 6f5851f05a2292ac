//! Writes that failed, held back until a wait is over. Rounds come with every change in the
//! cluster, and a write that fails at each (an apply refused by a webhook, a tunnel deleted in
//! the dashboard) would be sent again at each, holding up the round or spending an API rate
//! limit. Meanwhile it fails with the same error, word for word, so the conditions that carry
//! it are not rewritten. The wait doubles with each failure in a row; other work under the
//! same key (a changed document, a changed render) is tried at once.
//!
//! A quiet cluster starts no round, so a write whose wait is over would wait on for the next
//! resync. Told of a wake ([`Held::waking`]), each failure tells it as its wait ends: one timer
//! per key, replaced when the key fails again, stopped when a write under it succeeds, when
//! the key is forgotten or when the `Held` is dropped.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::alarm::Alarm;

/// The last failed write of each key, with the digest of what it wrote.
pub struct Held<K> {
    failures: HashMap<K, Failure>,
    first: Duration,
    max: Duration,
    /// Told as each failure's wait ends, to start the round that tries it again.
    wake: Option<Arc<Notify>>,
}

struct Failure {
    digest: Vec<u8>,
    error: String,
    wait: Duration,
    until: Instant,
    /// Tells the wake at `until`; stopped with the failure.
    _alarm: Option<Alarm>,
}

impl<K: Eq + Hash> Held<K> {
    /// A failed write waits `first`, doubling with each failure in a row up to `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            failures: HashMap::new(),
            first,
            max: max.max(first),
            wake: None,
        }
    }

    /// Tells `wake` as each failure's wait ends, so the write is tried again then rather
    /// than at whatever round comes next. [`Held::failed`] then starts a timer on the current
    /// tokio runtime.
    #[must_use]
    pub fn waking(mut self, wake: Arc<Notify>) -> Self {
        self.wake = Some(wake);
        self
    }

    /// The error to answer writing `digest` under `key` with, while its wait lasts.
    pub fn error(&self, key: &K, digest: &[u8]) -> Option<&str> {
        self.failures
            .get(key)
            .filter(|f| f.digest == digest && f.until > Instant::now())
            .map(|f| f.error.as_str())
    }

    /// The error the last write under `key` failed with, whatever it wrote and however long
    /// ago, until a write under it succeeds.
    pub fn last_error(&self, key: &K) -> Option<&str> {
        self.failures.get(key).map(|f| f.error.as_str())
    }

    /// The error the last write under `key` failed with, while its wait lasts, whatever it
    /// wrote.
    pub fn waiting(&self, key: &K) -> Option<&str> {
        self.failures
            .get(key)
            .filter(|f| f.until > Instant::now())
            .map(|f| f.error.as_str())
    }

    /// Writing `digest` under `key` failed with `error`; how long it is held back. With a wake
    /// ([`Held::waking`]), it is told as that wait ends, unless the key fails again first (it
    /// is told as the new wait ends instead), succeeds or is forgotten.
    pub fn failed(&mut self, key: K, digest: Vec<u8>, error: String) -> Duration {
        let wait = self
            .failures
            .get(&key)
            .map_or(self.first, |f| f.wait.saturating_mul(2).min(self.max));
        let until = Instant::now() + wait;
        let alarm = self.wake.as_ref().and_then(|wake| Alarm::at(until, wake));
        // The key's earlier failure, and its timer, go.
        self.failures.insert(
            key,
            Failure {
                digest,
                error,
                wait,
                until,
                _alarm: alarm,
            },
        );
        wait
    }

    /// A write under `key` succeeded: nothing under it is held back, nor waited for.
    pub fn succeeded(&mut self, key: &K) {
        self.failures.remove(key);
    }

    /// Forgets the keys `keep` does not keep.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.failures.retain(|k, _| keep(k));
    }

    /// Whether no failure is held, and so no wake is waited for.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.failures.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_failure_is_held_for_its_wait_which_doubles_in_a_row() {
        let mut held = Held::new(Duration::from_secs(5), Duration::from_secs(12));
        held.failed("a", b"doc".to_vec(), "refused".to_owned());
        assert_eq!(held.error(&"a", b"doc"), Some("refused"));
        assert_eq!(held.error(&"a", b"other"), None, "other work is tried");
        assert_eq!(held.error(&"b", b"doc"), None);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(held.error(&"a", b"doc"), None, "the wait is over");
        held.failed("a", b"doc".to_vec(), "refused".to_owned());
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(
            held.error(&"a", b"doc"),
            Some("refused"),
            "10 s the second time"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        held.failed("a", b"doc".to_vec(), "refused".to_owned());
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(held.error(&"a", b"doc"), Some("refused"), "capped at 12 s");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(held.error(&"a", b"doc"), None);
        held.succeeded(&"a");
        held.failed("a", b"doc".to_vec(), "refused".to_owned());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(held.error(&"a", b"doc"), None, "a success starts over");
    }

    /// Whether `wake` is told within `within`, paused time running on meanwhile.
    async fn told(wake: &Notify, within: Duration) -> bool {
        tokio::time::timeout(within, wake.notified()).await.is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_wakes_the_round_as_its_wait_ends() {
        let wake = Arc::new(Notify::new());
        let mut held =
            Held::new(Duration::from_secs(5), Duration::from_secs(60)).waking(Arc::clone(&wake));
        held.failed("a", b"doc".to_vec(), "refused".to_owned());
        assert!(
            !told(&wake, Duration::from_millis(4_900)).await,
            "not before"
        );
        assert!(told(&wake, Duration::from_millis(200)).await, "at its end");
        assert_eq!(held.error(&"a", b"doc"), None, "tried again when told");
        assert!(!told(&wake, Duration::from_secs(600)).await, "told once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_succeeds_or_is_forgotten_wakes_nothing() {
        let wake = Arc::new(Notify::new());
        let mut held =
            Held::new(Duration::from_secs(5), Duration::from_secs(60)).waking(Arc::clone(&wake));
        held.failed("a", b"doc".to_vec(), "refused".to_owned());
        held.failed("b", b"doc".to_vec(), "refused".to_owned());
        tokio::time::advance(Duration::from_secs(1)).await;
        held.succeeded(&"a");
        held.retain(|k| *k != "b");
        assert!(!told(&wake, Duration::from_secs(600)).await);

        held.failed("c", b"doc".to_vec(), "refused".to_owned());
        drop(held);
        assert!(
            !told(&wake, Duration::from_secs(600)).await,
            "no timer outlives its Held"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_again_replaces_the_wake_of_the_one_before() {
        let wake = Arc::new(Notify::new());
        let mut held =
            Held::new(Duration::from_secs(5), Duration::from_secs(60)).waking(Arc::clone(&wake));
        held.failed("a", b"doc".to_vec(), "refused".to_owned());
        tokio::time::advance(Duration::from_secs(3)).await;
        // A changed document, tried at once, fails too: 10 s from now.
        held.failed("a", b"changed".to_vec(), "refused".to_owned());
        assert!(
            !told(&wake, Duration::from_millis(9_900)).await,
            "not at the first failure's end"
        );
        assert!(
            told(&wake, Duration::from_millis(200)).await,
            "at the second's"
        );
        assert!(!told(&wake, Duration::from_secs(600)).await, "told once");
    }

    #[test]
    fn outside_a_runtime_a_failure_is_held_all_the_same() {
        let mut held = Held::new(Duration::from_secs(5), Duration::from_secs(60));
        held.failed("a", b"doc".to_vec(), "refused".to_owned());
        assert_eq!(held.error(&"a", b"doc"), Some("refused"));
        let mut waking = Held::new(Duration::from_secs(5), Duration::from_secs(60))
            .waking(Arc::new(Notify::new()));
        waking.failed("a", b"doc".to_vec(), "refused".to_owned());
        assert_eq!(
            waking.error(&"a", b"doc"),
            Some("refused"),
            "no timer, no panic"
        );
    }
}
