//! A Prometheus histogram whose `observe` takes no lock.
//!
//! prometheus-client's `Histogram` (0.24, and still 0.26) takes a lock on every observation, so
//! with one worker thread per CPU every request to a hostname contends on it. [`AtomicHistogram`]
//! keeps the same state in atomics, a copy per worker thread, and encodes through the same
//! `MetricEncoder::encode_histogram`, so `/metrics` reads byte for byte as prometheus-client's
//! for the same observations (proxy contract, Metrics: the names and shape are fixed).

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};
use std::cell::Cell;
use std::iter::once;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Copies of the counters, each written by its own threads. 4 covers the usual pod of 1-4
/// CPUs with one worker per CPU, so no two workers share one; on larger nodes workers share
/// a copy, still with a quarter of the contention. Costs 128 bytes per copy per hostname
/// with the proxy's 14 duration bounds.
const SHARDS: usize = 4;

/// Counters per line: 16 x 8 bytes, the 128-byte pair of cache lines that adjacent-line
/// prefetchers move together, so two shards never share one.
const CELLS: usize = 16;

/// A histogram with fixed bucket bounds whose [`observe`](Self::observe) takes no lock.
///
/// Clones share their counts, as prometheus-client's `Histogram` clones do, so the child a
/// `Family` hands out and the one stored in the route table are one series.
///
/// # Guarantees (the same as prometheus-client 0.24's `Histogram`)
/// - A value is counted in the first bound `>= v`, bounds in the order given, then `+Inf`.
/// - NaN and `+Inf` match no bound: they enter `_count` and `_sum` but no bucket, so `_count`
///   then exceeds the `+Inf` bucket by their number.
/// - `_sum` is the f64 sum of the values; from one thread it is bit-identical to
///   prometheus-client's, from several threads it differs only by the order of the rounding.
///
/// # Concurrency
/// Each thread observes into one of `SHARDS` (4) copies of the counters (threads are numbered
/// in the order they first observe, so the runtime's workers get distinct copies), and a
/// scrape adds the copies up. Counters shared by all threads were measured 2-3x slower than
/// prometheus-client's lock with two threads observing back to back: every observation moved
/// a cache line between cores, while the lock let one thread batch. Copies remove that.
///
/// `observe` is one compare-exchange loop on the sum and one `fetch_add` on a bucket, both in
/// the thread's copy. `_count` is not stored: a scrape adds up the buckets (and the NaN/`+Inf`
/// tally), so it always equals the `+Inf` bucket, even while requests complete. `_sum` may
/// run ahead: each observation adds to the sum before its bucket (release) and the scrape
/// reads every bucket (acquire) before any sum, so a racing scrape can include in `_sum` the
/// few observations in progress that its `_count` lacks, never the reverse. Go's client
/// avoids even that with hot/cold counters, at the price of another atomic per observation
/// and a scrape that waits for observers. Not worth it here: the skew is at most one
/// observation per worker thread for one scrape, every series stays monotonic, and
/// `rate(_sum) / rate(_count)` over any window absorbs it.
///
/// # Panics
/// None: neither `observe` nor encoding indexes or unwraps.
#[derive(Clone, Debug)]
pub struct AtomicHistogram {
    /// Upper bounds, the last `f64::MAX`, which prometheus-client's encoder writes as `+Inf`.
    /// Kept apart from the counters so the bucket search reads lines no observer writes.
    bounds: Arc<[f64]>,
    counts: Arc<Counts>,
}

#[derive(Debug)]
struct Counts {
    /// [`SHARDS`] copies of `[sum, one count per bound]`, each `lines_per_shard` lines long.
    /// The sum sits beside the buckets of fast requests, so an observation writes one line.
    ///
    /// The sum is f64 bits, updated by compare-exchange. Integer nanoseconds would allow a
    /// plain `fetch_add`, but u64 nanoseconds overflow after 584 years of summed latency
    /// (weeks at 10k req/s of 0.5 s), hold no NaN, and would print a different `_sum` than
    /// the f64 sum.
    lines: Box<[Line]>,
    lines_per_shard: usize,
    /// Observations in no bucket (NaN, `+Inf`): rare, so one counter for all threads.
    unbucketed: AtomicU64,
}

#[repr(align(128))]
#[derive(Debug)]
struct Line([AtomicU64; CELLS]);

/// The copy of the counters this thread observes into.
///
/// The counter is the one process-wide state here: it only numbers threads, in the order
/// they first observe.
fn shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SHARD
        .try_with(|shard| {
            if shard.get() == usize::MAX {
                shard.set(NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
            }
            shard.get()
        })
        .unwrap_or(0)
}

// === impl AtomicHistogram ===

impl AtomicHistogram {
    /// A histogram with the given upper bounds plus `+Inf`, taken as given (not sorted), as
    /// prometheus-client's `Histogram::new` takes them.
    pub fn new(buckets: impl IntoIterator<Item = f64>) -> Self {
        let bounds: Arc<[f64]> = buckets.into_iter().chain(once(f64::MAX)).collect();
        // The sum, then a count per bound; the sum's bits start as those of 0.0, which are 0.
        let lines_per_shard = (1 + bounds.len()).div_ceil(CELLS);
        let lines = (0..SHARDS * lines_per_shard)
            .map(|_| Line(std::array::from_fn(|_| AtomicU64::new(0))))
            .collect();
        Self {
            bounds,
            counts: Arc::new(Counts {
                lines,
                lines_per_shard,
                unbucketed: AtomicU64::new(0),
            }),
        }
    }

    /// Records one value.
    pub fn observe(&self, v: f64) {
        let shard = shard();
        if let Some(sum) = self.counts.cell(shard, 0) {
            // The closure always returns `Some`, so this cannot fail.
            let _ = sum.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
        }
        let count = match self.bounds.iter().position(|bound| *bound >= v) {
            Some(i) => self.counts.cell(shard, 1 + i),
            None => Some(&self.counts.unbucketed),
        };
        if let Some(count) = count {
            // Release: a scrape that sees this count also sees the sum above.
            count.fetch_add(1, Ordering::Release);
        }
    }

    /// `(sum, count, [(upper bound, count in this bucket alone)])`, as prometheus-client's
    /// encoder takes them.
    fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let load = |shard, j| {
            self.counts
                .cell(shard, j)
                .map_or(0, |c| c.load(Ordering::Acquire))
        };
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .enumerate()
            .map(|(i, bound)| {
                let n = (0..SHARDS).fold(0u64, |n, shard| n.saturating_add(load(shard, 1 + i)));
                (*bound, n)
            })
            .collect();
        let count = buckets.iter().fold(
            self.counts.unbucketed.load(Ordering::Acquire),
            |total, (_, n)| total.saturating_add(*n),
        );
        // Read after the buckets, so it covers at least the observations counted above.
        // A copy's sum starts at +0.0 and so is never -0.0; untouched copies add +0.0, which
        // changes nothing, so the sum of one thread's values comes out bit-exact.
        let sum = (0..SHARDS).fold(0.0, |sum, shard| {
            sum + f64::from_bits(
                self.counts
                    .cell(shard, 0)
                    .map_or(0, |c| c.load(Ordering::Relaxed)),
            )
        });
        (sum, count, buckets)
    }
}

// === impl Counts ===

impl Counts {
    /// Counter `j` (0 the sum, 1 + i bucket i) of copy `shard`.
    fn cell(&self, shard: usize, j: usize) -> Option<&AtomicU64> {
        self.lines
            .get(shard * self.lines_per_shard + j / CELLS)?
            .0
            .get(j % CELLS)
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.snapshot();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests;
