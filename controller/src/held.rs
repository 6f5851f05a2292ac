//! Writes that failed, held back until a wait is over. Rounds come with every change in the
//! cluster, and a write that fails at each (an apply refused by a webhook, a tunnel deleted in
//! the dashboard) would be sent again at each, holding up the round or spending an API rate
//! limit. Meanwhile it fails with the same error, word for word, so the conditions that carry
//! it are not rewritten. The wait doubles with each failure in a row; other work under the
//! same key (a changed document, a changed render) is tried at once.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

/// The last failed write of each key, with the digest of what it wrote.
pub struct Held<K> {
    failures: HashMap<K, Failure>,
    first: Duration,
    max: Duration,
}

struct Failure {
    digest: Vec<u8>,
    error: String,
    wait: Duration,
    until: Instant,
}

impl<K: Eq + Hash> Held<K> {
    /// A failed write waits `first`, doubling with each failure in a row up to `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            failures: HashMap::new(),
            first,
            max: max.max(first),
        }
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

    /// Writing `digest` under `key` failed with `error`; how long it is held back.
    pub fn failed(&mut self, key: K, digest: Vec<u8>, error: String) -> Duration {
        let wait = self
            .failures
            .get(&key)
            .map_or(self.first, |f| f.wait.saturating_mul(2).min(self.max));
        let until = Instant::now() + wait;
        self.failures.insert(
            key,
            Failure {
                digest,
                error,
                wait,
                until,
            },
        );
        wait
    }

    /// A write under `key` succeeded.
    pub fn succeeded(&mut self, key: &K) {
        self.failures.remove(key);
    }

    /// Forgets the keys `keep` does not keep.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.failures.retain(|k, _| keep(k));
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
}
