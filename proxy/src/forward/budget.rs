//! How many retries a backend's requests may take between them.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// The retries a backend's requests may take between them: one for each request sent to it
/// under a retry policy, plus ten a second whatever the traffic, banked up to a hundred. A
/// policy's `attempts` is a most: against a backend that fails every try, a rule asking for
/// thousands of retries a request about doubles its load rather than multiplying it a
/// thousandfold (Finagle and Linkerd budget retries for the same reason, at a fifth of the
/// requests; a whole retry a request lets every request that needs one have it, as Gateway
/// API's conformance probes do, several retries apiece for a while).
#[derive(Debug)]
pub(crate) struct RetryBudget {
    /// Thousandths of a retry.
    balance: AtomicI64,
    /// When the ten a second were last added, in milliseconds since `epoch`.
    refilled: AtomicU64,
    epoch: std::time::Instant,
}

impl RetryBudget {
    const RETRY: i64 = 1000;
    const PER_REQUEST: i64 = Self::RETRY;
    const PER_SECOND: i64 = 10 * Self::RETRY;
    const MOST: i64 = 100 * Self::RETRY;

    /// A budget that starts full, so a new backend's first failures are retried.
    pub(crate) fn new() -> Self {
        Self {
            balance: AtomicI64::new(Self::MOST),
            refilled: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        }
    }

    /// A request that may be retried was sent.
    pub(crate) fn deposit(&self) {
        self.add(Self::PER_REQUEST);
    }

    /// Takes one retry from the budget, if it holds one.
    pub(crate) fn withdraw(&self) -> bool {
        self.withdraw_at(u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    /// [`Self::withdraw`] `now` milliseconds after the budget was made.
    fn withdraw_at(&self, now: u64) -> bool {
        let last = self.refilled.load(Ordering::Relaxed);
        if now > last
            && self
                .refilled
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let ms = i64::try_from(now - last).unwrap_or(i64::MAX);
            self.add(ms.saturating_mul(Self::PER_SECOND / 1000));
        }
        self.balance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                (b >= Self::RETRY).then_some(b - Self::RETRY)
            })
            .is_ok()
    }

    fn add(&self, amount: i64) {
        let _ = self
            .balance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_add(amount).min(Self::MOST))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::RetryBudget;

    fn taken(budget: &RetryBudget, now: u64, n: usize) -> usize {
        (0..n).filter(|_| budget.withdraw_at(now)).count()
    }

    #[test]
    fn a_new_budget_starts_full() {
        let budget = RetryBudget::new();
        assert_eq!(taken(&budget, 0, 500), 100);
    }

    #[test]
    fn each_request_earns_a_retry() {
        let budget = RetryBudget::new();
        assert_eq!(taken(&budget, 0, 500), 100);
        for _ in 0..25 {
            budget.deposit();
        }
        assert_eq!(taken(&budget, 0, 50), 25);
    }

    #[test]
    fn ten_retries_a_second_come_whatever_the_traffic_up_to_a_hundred() {
        let budget = RetryBudget::new();
        assert_eq!(taken(&budget, 0, 500), 100);
        assert_eq!(taken(&budget, 500, 50), 5, "half a second");
        assert_eq!(taken(&budget, 500, 50), 0, "counted once");
        assert_eq!(
            taken(&budget, 60_500, 500),
            100,
            "a quiet minute banks a hundred"
        );
    }
}
