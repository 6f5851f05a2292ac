//! A Prometheus histogram whose `observe` takes no lock.
//!
//! prometheus-client's `Histogram` (0.24, and still 0.26) takes a lock on every observation, so
//! with one worker thread per CPU every request to a hostname contends on it. [`AtomicHistogram`]
//! keeps the same state in atomics, a copy per worker thread, and encodes through the same
//! `MetricEncoder::encode_histogram`, so `/metrics` reads byte for byte as prometheus-client's
//! for the same observations (proxy contract, Metrics: the names and shape are fixed).
//! See docs/design/latency-histograms.md.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};
use std::cell::Cell;
use std::iter::once;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// The most copies of the counters a histogram keeps, whatever the worker count.
///
/// A copy is two 128-byte lines per hostname with the proxy's 16 duration bounds (the sum and
/// the first 15 counts fill one line's 16 cells, the counts from 60 s up the other), so at
/// this cap a hostname's duration histogram takes 4 KiB and a table of 10,000 hostnames that
/// all see requests 40 MB. Past 16 workers (a pod without a CPU limit on a
/// large node takes one per CPU of the node) workers share copies: with 64, four to a copy.
pub const MAX_SHARDS: usize = 16;

/// Counters per line: 16 x 8 bytes, the 128-byte pair of cache lines that adjacent-line
/// prefetchers move together, so two shards never share one.
const CELLS: usize = 16;

/// How many copies of its counters an [`AtomicHistogram`] keeps: one per worker thread, up to
/// [`MAX_SHARDS`].
///
/// Memory per histogram is `shards x ceil((bounds + 2) / 16) x 128` bytes: with the proxy's 16
/// bounds, 256 bytes per worker per hostname, 4 KiB per hostname at the cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shards(NonZeroUsize);

// === impl Shards ===

impl Shards {
    /// One copy, for a runtime with one worker thread (nothing to share it with).
    pub const ONE: Self = Self(NonZeroUsize::MIN);

    /// A copy per worker thread, at most [`MAX_SHARDS`]; 0 is taken as 1.
    pub fn for_workers(workers: usize) -> Self {
        Self(NonZeroUsize::new(workers.clamp(1, MAX_SHARDS)).unwrap_or(NonZeroUsize::MIN))
    }

    pub fn get(self) -> usize {
        self.0.get()
    }
}

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
/// Each thread observes into one of the [`Shards`] copies of the counters (thread `i`, numbered
/// as threads first observe, into copy `i mod shards`) and a scrape adds the copies up. `_count`
/// is the buckets' total plus the NaN/`+Inf` tally; a racing scrape's `_sum` may include a few
/// observations in progress that its buckets lack, never the reverse.
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
    /// `shards` copies of `[sum, one count per bound]`, each `lines_per_shard` lines long.
    /// The sum sits beside the buckets of fast requests, so an observation under 60 s writes
    /// one line; it is f64 bits, updated by compare-exchange, to print prometheus-client's
    /// `_sum`.
    lines: Box<[Line]>,
    lines_per_shard: usize,
    shards: NonZeroUsize,
    /// Observations in no bucket (NaN, `+Inf`): rare, so one counter for all threads.
    unbucketed: AtomicU64,
}

#[repr(align(128))]
#[derive(Debug)]
struct Line([AtomicU64; CELLS]);

/// This thread's number, in the order threads first observe into any histogram.
///
/// The counter is the one process-wide state here: it only numbers threads.
fn thread_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX
        .try_with(|index| {
            if index.get() == usize::MAX {
                index.set(NEXT.fetch_add(1, Ordering::Relaxed));
            }
            index.get()
        })
        .unwrap_or(0)
}

// === impl AtomicHistogram ===

impl AtomicHistogram {
    /// A histogram with the given upper bounds plus `+Inf`, taken as given (not sorted), as
    /// prometheus-client's `Histogram::new` takes them, keeping `shards` copies of its counters.
    pub fn new(buckets: impl IntoIterator<Item = f64>, shards: Shards) -> Self {
        let bounds: Arc<[f64]> = buckets.into_iter().chain(once(f64::MAX)).collect();
        // The sum, then a count per bound; the sum's bits start as those of 0.0, which are 0.
        let lines_per_shard = (1 + bounds.len()).div_ceil(CELLS);
        let lines = (0..shards.get() * lines_per_shard)
            .map(|_| Line(std::array::from_fn(|_| AtomicU64::new(0))))
            .collect();
        Self {
            bounds,
            counts: Arc::new(Counts {
                lines,
                lines_per_shard,
                shards: shards.0,
                unbucketed: AtomicU64::new(0),
            }),
        }
    }

    /// Records one value.
    pub fn observe(&self, v: f64) {
        let shard = self.counts.shard();
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
                let n = (0..self.counts.shards.get())
                    .fold(0u64, |n, shard| n.saturating_add(load(shard, 1 + i)));
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
        let sum = (0..self.counts.shards.get()).fold(0.0, |sum, shard| {
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
    /// The copy this thread observes into: its own while there are no more threads than
    /// copies (no division on that path), else one it shares.
    fn shard(&self) -> usize {
        let index = thread_index();
        if index < self.shards.get() {
            index
        } else {
            index % self.shards
        }
    }

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
