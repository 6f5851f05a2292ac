//! When the next round runs if nothing in the cluster changes: a resync period after the last
//! round began, or sooner while a pod lacks its plane's config, or when something kept ends
//! with time alone (a plane with no pod listed comes to count as scaled to zero).
//!
//! A pod whose push fails changes nothing a watch sees (its EndpointSlice entry stays not
//! ready until it has a config, and a push that fails fast wakes nothing), so without a retry
//! of its own a new or restarted pod, listed before its config port listens, would wait out a
//! whole resync period serving nothing: the proxy registers its tunnel connectors only once it
//! has a config. A pod left behind is retried after as long as it has been behind, at least
//! [`RETRY_FIRST`] and at most the resync period: the waits double while it stays down, rounds
//! that other changes bring do not lengthen them, and a pod down for good costs no more rounds
//! than the resync does. Each pod has its own wait, so a pod that has just failed is retried
//! soon even while another has been down for long.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

/// The shortest wait before a round retries a pod left without its config.
pub(super) const RETRY_FIRST: Duration = Duration::from_secs(1);

/// The next round's time, kept across rounds. Pure: the caller says when rounds run and which
/// pods (`K`) they left behind.
#[derive(Debug)]
pub(super) struct Schedule<K> {
    resync: Duration,
    /// The pods the last round left without their plane's config, each with the end of the
    /// first round in a row that did.
    behind: HashMap<K, Instant>,
    next: Instant,
}

impl<K: Eq + Hash> Schedule<K> {
    /// The first round is due at `now`.
    pub(super) fn new(resync: Duration, now: Instant) -> Self {
        Self {
            resync,
            behind: HashMap::new(),
            next: now,
        }
    }

    /// When the next round is due.
    pub(super) fn next(&self) -> Instant {
        self.next
    }

    /// The round due at [`Schedule::next`] ran, or was skipped (this replica does not lead):
    /// the next is a resync period from `now`, until a round that runs says otherwise.
    pub(super) fn passed(&mut self, now: Instant) {
        self.next = now + self.resync;
    }

    /// A round is due at `at` too, if that is sooner: something then changes with time alone
    /// (a plane with no pod listed comes to count as scaled to zero, or an earlier leader's
    /// report on a plane no push reaches is kept no longer).
    pub(super) fn also_at(&mut self, at: Instant) {
        self.next = self.next.min(at);
    }

    /// A round that began at `started` ended at `ended`, leaving the pods `behind` without
    /// their plane's config: the next is a resync period after its start, or sooner to retry
    /// a pod left behind.
    pub(super) fn ran(
        &mut self,
        started: Instant,
        ended: Instant,
        behind: impl IntoIterator<Item = K>,
    ) {
        let mut was = std::mem::take(&mut self.behind);
        self.behind = behind
            .into_iter()
            .map(|pod| {
                let since = was.remove(&pod).unwrap_or(ended);
                (pod, since)
            })
            .collect();
        self.next = started + self.resync;
        // The pod behind for the shortest time has the shortest wait.
        if let Some(since) = self.behind.values().max() {
            let wait = ended
                .saturating_duration_since(*since)
                .max(RETRY_FIRST)
                .min(self.resync);
            self.next = self.next.min(ended + wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESYNC: Duration = Duration::from_secs(30);

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_round_with_every_pod_current_is_followed_a_resync_after_its_start() {
        let t0 = Instant::now();
        let mut s = Schedule::<&str>::new(RESYNC, t0);
        assert_eq!(s.next(), t0);
        s.ran(t0, t0 + secs(2), []);
        assert_eq!(s.next(), t0 + RESYNC);
    }

    #[test]
    fn a_pod_left_behind_is_retried_after_waits_that_double_up_to_the_resync() {
        let t0 = Instant::now();
        let mut s = Schedule::new(RESYNC, t0);
        let mut at = t0;
        let mut waits = Vec::new();
        for _ in 0..9 {
            s.ran(at, at, ["a"]);
            waits.push(s.next() - at);
            at = s.next();
        }
        assert_eq!(waits, [1, 1, 2, 4, 8, 16, 30, 30, 30].map(secs));
        // Current again: back to the resync, and a later failure is retried after 1 s again.
        s.ran(at, at, []);
        assert_eq!(s.next(), at + RESYNC);
        s.ran(at, at, ["a"]);
        assert_eq!(s.next(), at + RETRY_FIRST);
    }

    #[test]
    fn rounds_other_changes_bring_do_not_lengthen_a_pods_wait() {
        let t0 = Instant::now();
        let mut s = Schedule::new(RESYNC, t0);
        for ms in [0, 100, 200, 300, 400, 500] {
            let at = t0 + Duration::from_millis(ms);
            s.ran(at, at, ["a"]);
        }
        assert_eq!(s.next(), t0 + Duration::from_millis(1500));
    }

    #[test]
    fn a_pod_that_just_failed_is_retried_soon_beside_one_down_for_long() {
        let t0 = Instant::now();
        let mut s = Schedule::new(RESYNC, t0);
        s.ran(t0, t0, ["down"]);
        let later = t0 + secs(120);
        s.ran(later, later, ["down", "new"]);
        assert_eq!(s.next(), later + RETRY_FIRST);
        s.ran(later + secs(1), later + secs(1), ["down"]);
        assert_eq!(
            s.next(),
            later + secs(1) + RESYNC,
            "only the one down for long"
        );
    }

    #[test]
    fn a_retry_waits_from_the_rounds_end_but_never_past_a_resync_from_its_start() {
        let t0 = Instant::now();
        let resync = Duration::from_millis(1500);
        let mut s = Schedule::new(resync, t0);
        s.ran(t0, t0 + Duration::from_millis(200), ["a"]);
        assert_eq!(s.next(), t0 + Duration::from_millis(1200));
        let at = t0 + secs(10);
        s.ran(at, at, ["a"]);
        assert_eq!(
            s.next(),
            at + resync,
            "behind for 10 s, waiting at most the resync"
        );
    }

    #[test]
    fn a_round_due_sooner_for_what_changes_with_time_comes_then() {
        let start = Instant::now();
        let mut schedule = Schedule::<u8>::new(RESYNC, start);
        schedule.ran(start, start + secs(1), []);
        schedule.also_at(start + secs(5));
        assert_eq!(schedule.next(), start + secs(5));
        schedule.also_at(start + secs(45));
        assert_eq!(
            schedule.next(),
            start + secs(5),
            "a later one changes nothing"
        );
    }

    #[test]
    fn a_skipped_round_waits_a_whole_resync() {
        let t0 = Instant::now();
        let mut s = Schedule::new(RESYNC, t0);
        s.ran(t0, t0, ["a"]);
        s.passed(t0 + secs(1));
        assert_eq!(s.next(), t0 + secs(1) + RESYNC);
    }
}
