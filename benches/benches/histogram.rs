//! `observe` on the request-duration histogram: prometheus-client's `Histogram` (a lock per
//! observation) against the proxy's `AtomicHistogram`, from one thread, and from 2 and 8
//! threads observing the same histogram back to back, as workers serving one hostname would
//! at worst.
//!
//! Threads are numbered once, in a fixed order, before anything is measured: the bench's own
//! thread is 0 and the peers 1 to 7, so thread `i` observes into copy `i mod shards`. With 2
//! threads, `atomic_2_shards` gives each its own copy (the proxy with 2 workers) and
//! `atomic_1_shard` makes them share one (counters shared by all threads, the design copies
//! replace); with 8, `atomic_4_shards` puts two threads on each copy (more workers than
//! copies, as past the cap) and `atomic_8_shards` gives each its own.

/// The allocator the proxy binary uses, so the numbers are the binary's.
#[global_allocator]
static ALLOC: cftunnel_alloc::Mimalloc = cftunnel_alloc::Mimalloc;

use cftunnel_proxy::metrics::histogram::{AtomicHistogram, Shards};
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

/// The most threads a case uses.
const MAX_THREADS: usize = 8;

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

/// Takes this thread's number in the order threads first observe (what picks its copy).
fn take_thread_number() {
    AtomicHistogram::new([1.0], Shards::ONE).observe(0.0);
}

/// One batch of observations for a peer: waits at the barrier, then observes.
type Job = Box<dyn FnOnce() -> Duration + Send>;

/// A thread that lives as long as the benchmark, as a runtime's workers do (a thread per
/// sample would take a new number, and so maybe another copy, every time).
struct Peer {
    jobs: Option<mpsc::Sender<Job>>,
    elapsed: mpsc::Receiver<Duration>,
    thread: Option<JoinHandle<()>>,
}

impl Peer {
    /// Returns once the new thread has taken its number.
    fn new() -> Self {
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let (elapsed_tx, elapsed) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            take_thread_number();
            if elapsed_tx.send(Duration::ZERO).is_err() {
                return;
            }
            for job in jobs_rx {
                if elapsed_tx.send(job()).is_err() {
                    return;
                }
            }
        });
        let _ = elapsed.recv();
        Self {
            jobs: Some(jobs_tx),
            elapsed,
            thread: Some(thread),
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The bench's thread (number 0) and `MAX_THREADS - 1` peers numbered 1, 2, ... in order.
struct Crew {
    peers: Vec<Peer>,
}

impl Crew {
    fn new() -> Self {
        take_thread_number();
        Self {
            peers: (1..MAX_THREADS).map(|_| Peer::new()).collect(),
        }
    }

    /// Wall time for `threads` threads (this one and the first peers) to make `iters`
    /// observations each from a common start; criterion divides by `iters`, so the figure is
    /// per observation per thread.
    fn observe(&self, h: &impl Observe, threads: usize, iters: u64) -> Duration {
        let peers = self
            .peers
            .get(..threads.saturating_sub(1))
            .unwrap_or(&self.peers);
        let start = Arc::new(Barrier::new(peers.len() + 1));
        for (n, peer) in peers.iter().enumerate() {
            let (h, start) = (h.clone(), start.clone());
            if let Some(jobs) = &peer.jobs {
                let _ = jobs.send(Box::new(move || {
                    start.wait();
                    run(&h, iters, n + 1)
                }));
            }
        }
        start.wait();
        let mine = run(h, iters, 0);
        peers
            .iter()
            .map(|peer| peer.elapsed.recv().unwrap_or(mine))
            .fold(mine, Duration::max)
    }
}

fn observe(c: &mut Criterion) {
    let crew = Crew::new();
    let atomic = |shards| AtomicHistogram::new(DURATION_BUCKETS, Shards::for_workers(shards));
    let cases: [(usize, &[usize]); 3] = [(1, &[1]), (2, &[2, 1]), (8, &[4, 8])];
    for (threads, shard_counts) in cases {
        let name = match threads {
            1 => "observe_1_thread".to_owned(),
            n => format!("observe_{n}_threads"),
        };
        let mut group = c.benchmark_group(name);
        let locked = Histogram::new(DURATION_BUCKETS);
        group.bench_function("prometheus_client", |b| {
            b.iter_custom(|iters| crew.observe(&locked, threads, iters))
        });
        for &shards in shard_counts {
            let h = atomic(shards);
            let id = match shards {
                1 => "atomic_1_shard".to_owned(),
                n => format!("atomic_{n}_shards"),
            };
            group.bench_function(id, |b| {
                b.iter_custom(|iters| crew.observe(&h, threads, iters))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, observe);
criterion_main!(benches);
