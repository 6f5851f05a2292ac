//! Plane applies in flight. An apply is a handful of API calls, and each can take up to the API
//! timeout while an admission webhook hangs; a round that waited for its applies would hold
//! every tenant's pushes and statuses behind the slowest plane, and a replica that starts
//! leading would apply every plane one after another before its first push. So each apply runs
//! as a task of its own, a bounded number at a time: a round starts those due and reads those
//! finished, and one finishing wakes the run loop for the next round.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::task::{AbortHandle, Id, JoinSet};

/// Applies at once, at most. Each is a few requests in a row, so this many keep the API server
/// busy enough at start without a burst its priority and fairness limits would queue.
pub const AT_ONCE: usize = 16;

/// The applies running, at most one per Gateway uid, each of one render (its digest).
pub struct Applies<T> {
    tasks: JoinSet<(String, T)>,
    running: HashMap<String, Running>,
    /// Applies of earlier renders, dropped for a later one: one that had already finished still
    /// wrote its render, and its outcome is still read.
    superseded: HashMap<Id, Vec<u8>>,
    wake: Arc<Notify>,
    limit: usize,
}

struct Running {
    digest: Vec<u8>,
    task: AbortHandle,
}

impl<T: Send + 'static> Applies<T> {
    /// At most `limit` at once (at least one); `wake` is notified as each finishes.
    pub fn new(limit: usize, wake: Arc<Notify>) -> Self {
        Self {
            tasks: JoinSet::new(),
            running: HashMap::new(),
            superseded: HashMap::new(),
            wake,
            limit: limit.max(1),
        }
    }

    /// The digest of the render being applied under `uid`, while one is.
    pub fn running(&self, uid: &str) -> Option<&[u8]> {
        self.running.get(uid).map(|r| r.digest.as_slice())
    }

    /// Whether another apply would pass the limit.
    pub fn is_full(&self) -> bool {
        self.running.len() >= self.limit
    }

    /// Starts `apply`, of the render `digest`, under `uid`. An apply of an earlier render under
    /// it is dropped: what it was writing is superseded. (One that finished meanwhile is read
    /// all the same: its render is what the plane runs until this one lands.)
    pub fn start(
        &mut self,
        uid: String,
        digest: Vec<u8>,
        apply: impl Future<Output = T> + Send + 'static,
    ) {
        if let Some(earlier) = self.running.remove(&uid) {
            earlier.task.abort();
            self.superseded.insert(earlier.task.id(), earlier.digest);
        }
        let wake = Arc::clone(&self.wake);
        let key = uid.clone();
        let task = self.tasks.spawn(async move {
            let outcome = apply.await;
            wake.notify_one();
            (key, outcome)
        });
        self.running.insert(uid, Running { digest, task });
    }

    /// Drops the apply under `uid`, if one runs, and its outcome.
    pub fn abort(&mut self, uid: &str) {
        if let Some(running) = self.running.remove(uid) {
            running.task.abort();
        }
    }

    /// Drops the applies under the uids `keep` does not keep.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.running.retain(|uid, running| {
            let kept = keep(uid);
            if !kept {
                running.task.abort();
            }
            kept
        });
    }

    /// Drops every apply running.
    pub fn abort_all(&mut self) {
        self.running.clear();
        self.superseded.clear();
        self.tasks.abort_all();
    }

    /// The applies finished since the last call, each with its uid and the digest it applied,
    /// in the order they finished; `None` for one that panicked (the apply's bug). One dropped
    /// is not among them; one superseded is, if it finished before it was dropped.
    pub fn finished(&mut self) -> Vec<(String, Vec<u8>, Option<T>)> {
        let mut done = Vec::new();
        while let Some(joined) = self.tasks.try_join_next_with_id() {
            let (id, uid, outcome) = match joined {
                Ok((id, (uid, outcome))) => (id, uid, outcome),
                Err(e) => {
                    self.superseded.remove(&e.id());
                    let running = self.running.iter().find(|(_, r)| r.task.id() == e.id());
                    let uid = running.map(|(uid, _)| uid.clone());
                    if let Some(running) = uid.and_then(|uid| self.running.remove_entry(&uid)) {
                        if e.is_panic() {
                            done.push((running.0, running.1.digest, None));
                        }
                    }
                    continue;
                }
            };
            if let Some(digest) = self.superseded.remove(&id) {
                done.push((uid, digest, Some(outcome)));
            } else if self.running.get(&uid).is_some_and(|r| r.task.id() == id) {
                if let Some(running) = self.running.remove(&uid) {
                    done.push((uid, running.digest, Some(outcome)));
                }
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn settle<T: Send + 'static>(
        applies: &mut Applies<T>,
    ) -> Vec<(String, Vec<u8>, Option<T>)> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        applies.finished()
    }

    #[tokio::test]
    async fn a_finished_apply_is_read_once_and_wakes_the_loop() {
        let wake = Arc::new(Notify::new());
        let mut applies = Applies::new(2, Arc::clone(&wake));
        applies.start("a".into(), vec![1], async { "done" });
        assert_eq!(applies.running("a"), Some(&[1u8][..]));
        tokio::time::timeout(Duration::from_secs(5), wake.notified())
            .await
            .expect("woken");
        assert_eq!(
            settle(&mut applies).await,
            vec![("a".to_owned(), vec![1], Some("done"))]
        );
        assert_eq!(applies.running("a"), None);
        assert!(applies.finished().is_empty());
    }

    #[tokio::test]
    async fn a_new_render_supersedes_the_apply_of_the_old_one() {
        let mut applies = Applies::new(4, Arc::new(Notify::new()));
        // The old render's apply finishes before the new one starts: it was written, and its
        // outcome is read, before the new one's.
        applies.start("a".into(), vec![1], async { "old" });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        applies.start("a".into(), vec![2], async move {
            let _ = released.await;
            "new"
        });
        assert_eq!(
            settle(&mut applies).await,
            vec![("a".to_owned(), vec![1], Some("old"))]
        );
        assert_eq!(applies.running("a"), Some(&[2u8][..]));
        // One still running when superseded is dropped, outcome and all.
        applies.start("a".into(), vec![3], async { "newest" });
        let _ = release.send(());
        assert_eq!(
            settle(&mut applies).await,
            vec![("a".to_owned(), vec![3], Some("newest"))]
        );
    }

    #[tokio::test]
    async fn a_panicking_apply_frees_its_place() {
        let mut applies = Applies::new(1, Arc::new(Notify::new()));
        applies.start("a".into(), vec![1], async {
            panic!("a bug in an apply");
            #[allow(unreachable_code)]
            "never"
        });
        assert!(applies.is_full());
        assert_eq!(
            settle(&mut applies).await,
            vec![("a".to_owned(), vec![1], None)],
            "told as a failure of its render"
        );
        assert!(!applies.is_full());
        assert_eq!(applies.running("a"), None);
    }

    #[tokio::test]
    async fn dropped_applies_stop_and_report_nothing() {
        let mut applies = Applies::new(2, Arc::new(Notify::new()));
        let hang = || std::future::pending::<&str>();
        applies.start("a".into(), vec![1], hang());
        applies.start("b".into(), vec![1], hang());
        assert!(applies.is_full());
        applies.retain(|uid| uid == "b");
        assert!(!applies.is_full());
        assert_eq!(applies.running("a"), None);
        applies.abort("b");
        applies.start("c".into(), vec![1], hang());
        applies.abort_all();
        assert_eq!(applies.running("c"), None);
        assert!(settle(&mut applies).await.is_empty());
    }
}
