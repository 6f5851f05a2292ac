//! Writes in flight, each a task of its own, at most one per key. A write can take up to its
//! API's timeout (an admission webhook that hangs, a Cloudflare API that never answers); a round
//! that waited for its writes would hold every tenant's pushes and statuses behind the slowest,
//! and a replica that starts leading would write every plane one after another before its first
//! push. So a round starts those due, a bounded number at a time, and reads those finished; one
//! finishing wakes the run loop for the next round, once its outcome can be read: it is put
//! where [`InFlight::finished`] reads it before the wake, since a task's own return becomes
//! visible to a join only after the task has ended, which a round woken at once can miss. Plane
//! applies ([`crate::runtime`]) read
//! theirs in the next round; tunnel writes ([`crate::cloudflare::TunnelSync`]) wait for theirs
//! briefly, since they mostly take milliseconds.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;
use tokio::task::{AbortHandle, Id, JoinError, JoinSet};
use tokio::time::Instant;

/// A write that finished: its key, the digest of what it wrote, and its outcome (`None` for one
/// that panicked, a bug in the write).
pub type Finished<K, T> = (K, Vec<u8>, Option<T>);

/// The writes running, at most one per key, each of one version of what it writes (its digest).
pub struct InFlight<K, T> {
    /// The tasks, joined to free their places and to learn of panics; their outcomes come
    /// through `ended`.
    tasks: JoinSet<()>,
    /// Outcomes of the writes that ended, each put here by its task before it wakes the loop.
    ended: Arc<Mutex<Vec<(Id, K, T)>>>,
    running: HashMap<K, Running>,
    /// Writes of earlier versions, dropped for a later one: one that had already finished
    /// still wrote, and its outcome is still read.
    superseded: HashMap<Id, Vec<u8>>,
    wake: Arc<Notify>,
    limit: usize,
}

struct Running {
    digest: Vec<u8>,
    task: AbortHandle,
}

impl<K, T> InFlight<K, T>
where
    K: Eq + Hash + Clone + Send + 'static,
    T: Send + 'static,
{
    /// At most `limit` at once (at least one); `wake` is notified as each finishes.
    pub fn new(limit: usize, wake: Arc<Notify>) -> Self {
        Self {
            tasks: JoinSet::new(),
            ended: Arc::new(Mutex::new(Vec::new())),
            running: HashMap::new(),
            superseded: HashMap::new(),
            wake,
            limit: limit.max(1),
        }
    }

    /// The digest of what is being written under `key`, while a write runs.
    pub fn running<Q>(&self, key: &Q) -> Option<&[u8]>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.running.get(key).map(|r| r.digest.as_slice())
    }

    /// The keys writes run under.
    pub fn running_keys(&self) -> impl Iterator<Item = &K> {
        self.running.keys()
    }

    /// Whether another write would pass the limit.
    pub fn is_full(&self) -> bool {
        self.running.len() >= self.limit
    }

    /// Starts `write`, of the version `digest`, under `key`. A write of an earlier version
    /// under it is dropped: what it was writing is superseded. (One that finished meanwhile is
    /// read all the same: what it wrote stands until this one lands.) Dropping stops the task,
    /// not a request it already sent, which may still land after the new one's: a caller
    /// whose writes must land in order starts none under a key while one runs.
    pub fn start(
        &mut self,
        key: K,
        digest: Vec<u8>,
        write: impl Future<Output = T> + Send + 'static,
    ) {
        if let Some(earlier) = self.running.remove(&key) {
            earlier.task.abort();
            self.superseded.insert(earlier.task.id(), earlier.digest);
        }
        let wake = Arc::clone(&self.wake);
        let ended = Arc::clone(&self.ended);
        let id = key.clone();
        let task = self.tasks.spawn(async move {
            let outcome = write.await;
            ended.lock().unwrap_or_else(PoisonError::into_inner).push((
                tokio::task::id(),
                id,
                outcome,
            ));
            wake.notify_one();
        });
        self.running.insert(key, Running { digest, task });
    }

    /// Drops the write under `key`, if one runs, and its outcome.
    pub fn abort<Q>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        if let Some(running) = self.running.remove(key) {
            running.task.abort();
        }
    }

    /// Drops the writes under the keys `keep` does not keep.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.running.retain(|key, running| {
            let kept = keep(key);
            if !kept {
                running.task.abort();
            }
            kept
        });
    }

    /// Drops every write running.
    pub fn abort_all(&mut self) {
        self.running.clear();
        self.superseded.clear();
        self.tasks.abort_all();
        self.ended
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The writes finished since the last call, each with its key and the digest it wrote, in
    /// the order they finished. One dropped is not among them; one superseded is, if it
    /// finished before it was dropped.
    pub fn finished(&mut self) -> Vec<Finished<K, T>> {
        let mut done = Vec::new();
        self.collect(&mut done);
        done
    }

    /// [`InFlight::finished`], once none of `keys` is running or `deadline` (`None`: never) is
    /// past, whichever comes first.
    pub async fn finished_by(
        &mut self,
        keys: &[K],
        deadline: Option<Instant>,
    ) -> Vec<Finished<K, T>> {
        let mut done = self.finished();
        while keys.iter().any(|k| self.running.contains_key(k)) {
            let next = self.tasks.join_next_with_id();
            let joined = match deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline, next).await {
                    Ok(joined) => joined,
                    Err(_) => break,
                },
                None => next.await,
            };
            let Some(joined) = joined else { break };
            self.reap(joined, &mut done);
            self.collect(&mut done);
        }
        done
    }

    /// Reaps the tasks that ended, then reads the outcomes told: every task reaped told its
    /// outcome before it ended, so none is left behind with its key still running. (One that
    /// tells its outcome meanwhile is read now, and reaped by a later call.)
    fn collect(&mut self, done: &mut Vec<Finished<K, T>>) {
        while let Some(joined) = self.tasks.try_join_next_with_id() {
            self.reap(joined, done);
        }
        let ended = std::mem::take(&mut *self.ended.lock().unwrap_or_else(PoisonError::into_inner));
        for (id, key, outcome) in ended {
            if let Some(digest) = self.superseded.remove(&id) {
                done.push((key, digest, Some(outcome)));
            } else if self.running.get(&key).is_some_and(|r| r.task.id() == id) {
                if let Some(running) = self.running.remove(&key) {
                    done.push((key, running.digest, Some(outcome)));
                }
            }
        }
    }

    /// A task that ended without telling an outcome: dropped (nothing to tell) or panicked
    /// (told as a failure of its write). One that returned told its outcome through `ended`.
    fn reap(&mut self, joined: Result<(Id, ()), JoinError>, done: &mut Vec<Finished<K, T>>) {
        let Err(e) = joined else { return };
        self.superseded.remove(&e.id());
        if !e.is_panic() {
            return;
        }
        let running = self.running.iter().find(|(_, r)| r.task.id() == e.id());
        let key = running.map(|(key, _)| key.clone());
        if let Some(running) = key.and_then(|key| self.running.remove_entry(&key)) {
            done.push((running.0, running.1.digest, None));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn settle<T: Send + 'static>(
        writes: &mut InFlight<String, T>,
    ) -> Vec<(String, Vec<u8>, Option<T>)> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        writes.finished()
    }

    #[tokio::test]
    async fn a_finished_write_is_read_once_and_wakes_the_loop() {
        let wake = Arc::new(Notify::new());
        let mut writes = InFlight::new(2, Arc::clone(&wake));
        writes.start("a".into(), vec![1], async { "done" });
        assert_eq!(writes.running("a"), Some(&[1u8][..]));
        tokio::time::timeout(Duration::from_secs(5), wake.notified())
            .await
            .expect("woken");
        assert_eq!(
            settle(&mut writes).await,
            vec![("a".to_owned(), vec![1], Some("done"))]
        );
        assert_eq!(writes.running("a"), None);
        assert!(writes.finished().is_empty());
    }

    /// The loop reads a write's outcome as soon as its wake comes, with the write's task on
    /// another thread still ending.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_is_read_by_the_round_its_wake_brings() {
        let wake = Arc::new(Notify::new());
        let mut writes = InFlight::new(1, Arc::clone(&wake));
        for n in 0..2_000u32 {
            writes.start(n, vec![1], async move {
                tokio::task::yield_now().await;
                n
            });
            tokio::time::timeout(Duration::from_secs(5), wake.notified())
                .await
                .expect("woken");
            assert_eq!(
                writes.finished(),
                vec![(n, vec![1], Some(n))],
                "write {n} was read by the round it woke"
            );
        }
    }

    #[tokio::test]
    async fn a_new_version_supersedes_the_write_of_the_old_one() {
        let mut writes = InFlight::new(4, Arc::new(Notify::new()));
        // The old render's apply finishes before the new one starts: it was written, and its
        // outcome is read, before the new one's.
        writes.start("a".into(), vec![1], async { "old" });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        writes.start("a".into(), vec![2], async move {
            let _ = released.await;
            "new"
        });
        assert_eq!(
            settle(&mut writes).await,
            vec![("a".to_owned(), vec![1], Some("old"))]
        );
        assert_eq!(writes.running("a"), Some(&[2u8][..]));
        // One still running when superseded is dropped, outcome and all.
        writes.start("a".into(), vec![3], async { "newest" });
        let _ = release.send(());
        assert_eq!(
            settle(&mut writes).await,
            vec![("a".to_owned(), vec![3], Some("newest"))]
        );
    }

    #[tokio::test]
    async fn a_panicking_write_frees_its_place() {
        let mut writes = InFlight::new(1, Arc::new(Notify::new()));
        writes.start("a".into(), vec![1], async {
            panic!("a bug in an apply");
            #[allow(unreachable_code)]
            "never"
        });
        assert!(writes.is_full());
        assert_eq!(
            settle(&mut writes).await,
            vec![("a".to_owned(), vec![1], None)],
            "told as a failure of its render"
        );
        assert!(!writes.is_full());
        assert_eq!(writes.running("a"), None);
    }

    #[tokio::test]
    async fn dropped_writes_stop_and_report_nothing() {
        let mut writes = InFlight::new(2, Arc::new(Notify::new()));
        let hang = || std::future::pending::<&str>();
        writes.start("a".into(), vec![1], hang());
        writes.start("b".into(), vec![1], hang());
        assert!(writes.is_full());
        writes.retain(|uid| uid == "b");
        assert!(!writes.is_full());
        assert_eq!(writes.running("a"), None);
        writes.abort("b");
        writes.start("c".into(), vec![1], hang());
        writes.abort_all();
        assert_eq!(writes.running("c"), None);
        assert!(settle(&mut writes).await.is_empty());
    }

    #[tokio::test]
    async fn a_wait_for_some_writes_ends_when_they_finish_or_at_its_deadline() {
        let mut writes = InFlight::new(4, Arc::new(Notify::new()));
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        writes.start("quick".into(), vec![1], async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            "quick"
        });
        writes.start("slow".into(), vec![2], async move {
            let _ = released.await;
            "slow"
        });
        writes.start("hung".into(), vec![3], std::future::pending());
        let by = Instant::now() + Duration::from_secs(30);
        assert_eq!(
            writes.finished_by(&["quick".into()], Some(by)).await,
            vec![("quick".to_owned(), vec![1], Some("quick"))],
            "ends as the writes waited for finish"
        );
        let started = Instant::now();
        let by = started + Duration::from_millis(200);
        assert!(writes
            .finished_by(&["hung".into()], Some(by))
            .await
            .is_empty());
        assert!(Instant::now() >= by, "waits until its deadline");
        assert!(Instant::now() < started + Duration::from_secs(5));
        assert_eq!(
            writes.running("hung"),
            Some(&[3u8][..]),
            "and leaves it running"
        );
        let _ = release.send(());
        assert_eq!(
            writes.finished_by(&["slow".into()], None).await,
            vec![("slow".to_owned(), vec![2], Some("slow"))],
            "no deadline: until they finish"
        );
    }
}
