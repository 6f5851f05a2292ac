//! `observe` on the request-duration histogram: prometheus-client's `Histogram` (a lock per
//! observation) against the proxy's `AtomicHistogram`, from one thread and from two threads
//! observing the same histogram back to back, as two workers serving one hostname would at
//! worst.

/// The allocator the proxy binary uses, so the numbers are the binary's.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use cftunnel_proxy::metrics::histogram::AtomicHistogram;
use cftunnel_proxy::metrics::DURATION_BUCKETS;
use criterion::{criterion_group, criterion_main, Criterion};
use prometheus_client::metrics::histogram::Histogram;
use std::hint::black_box;
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Request durations in seconds spread over the buckets, so the bucket search varies.
const SAMPLES: [f64; 8] = [0.0004, 0.0012, 0.003, 0.0071, 0.02, 0.04, 0.3, 1.2];

trait Observe: Clone + Send + 'static {
    fn observe(&self, v: f64);
}

impl Observe for Histogram {
    fn observe(&self, v: f64) {
        Histogram::observe(self, v);
    }
}

impl Observe for AtomicHistogram {
    fn observe(&self, v: f64) {
        AtomicHistogram::observe(self, v);
    }
}

fn run(h: &impl Observe, iters: u64, offset: usize) -> Duration {
    let t = Instant::now();
    for i in 0..iters as usize {
        h.observe(black_box(SAMPLES[(i + offset) % SAMPLES.len()]));
    }
    t.elapsed()
}

/// A second thread that lives as long as the benchmark, as a runtime's workers do (a thread
/// per sample would take a new shard number every time).
struct Peer {
    start: Arc<Barrier>,
    iters: Option<mpsc::Sender<u64>>,
    elapsed: mpsc::Receiver<Duration>,
    thread: Option<JoinHandle<()>>,
}

impl Peer {
    fn new(h: &impl Observe) -> Self {
        let h = h.clone();
        let start = Arc::new(Barrier::new(2));
        let (iters_tx, iters_rx) = mpsc::channel::<u64>();
        let (elapsed_tx, elapsed) = mpsc::channel();
        let barrier = start.clone();
        let thread = std::thread::spawn(move || {
            for iters in iters_rx {
                barrier.wait();
                if elapsed_tx.send(run(&h, iters, 3)).is_err() {
                    return;
                }
            }
        });
        Self {
            start,
            iters: Some(iters_tx),
            elapsed,
            thread: Some(thread),
        }
    }

    /// Wall time for both threads to make `iters` observations each from a common start;
    /// criterion divides by `iters`, so the figure is per observation per thread.
    fn both(&self, h: &impl Observe, iters: u64) -> Duration {
        if let Some(tx) = &self.iters {
            let _ = tx.send(iters);
        }
        self.start.wait();
        let mine = run(h, iters, 0);
        mine.max(self.elapsed.recv().unwrap_or(mine))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.iters = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn observe(c: &mut Criterion) {
    let locked = Histogram::new(DURATION_BUCKETS);
    let atomic = AtomicHistogram::new(DURATION_BUCKETS);

    let mut group = c.benchmark_group("observe_1_thread");
    group.bench_function("prometheus_client", |b| {
        b.iter_custom(|iters| run(&locked, iters, 0))
    });
    group.bench_function("atomic", |b| b.iter_custom(|iters| run(&atomic, iters, 0)));
    group.finish();

    let mut group = c.benchmark_group("observe_2_threads");
    let peer = Peer::new(&locked);
    group.bench_function("prometheus_client", |b| {
        b.iter_custom(|iters| peer.both(&locked, iters))
    });
    drop(peer);
    let peer = Peer::new(&atomic);
    group.bench_function("atomic", |b| {
        b.iter_custom(|iters| peer.both(&atomic, iters))
    });
    drop(peer);
    group.finish();
}

criterion_group!(benches, observe);
criterion_main!(benches);
