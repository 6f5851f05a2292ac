//! scratch' synthetic document of N rules (default 10,000) once cold and then
//! K more times with the cache warm (default 20), as repeated pushes do, and prints the time of
//! each phase, the heap the parsed document and the compiled table hold, and the process's
//! peak resident set. For profilers (`perf record`, callgrind), which want one plain process
//! rather than criterion's harness.
//!
//! `cargo run --release -p cftunnel-benches --example compile -- 10000 20`

use cftunnel_proxy::config::{compile, Cache};
use cftunnel_proxy::metrics::ProxyMetrics;
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The allocator the proxy binary uses, so the numbers are the binary's, counting the bytes
/// allocated and not yet freed.
#[global_allocator]
static ALLOC: Counting = Counting(mimalloc::MiMalloc);

struct Counting(mimalloc::MiMalloc);

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to mimalloc; the counters only observe sizes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: as the caller promised for `layout`.
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with `layout`.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let live = if new_size >= layout.size() {
            LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size - layout.size()
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed) - (layout.size() - new_size)
        };
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: as the caller promised for `ptr`, `layout` and `new_size`.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

fn mib(bytes: usize) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}
fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}
fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10000);
    let doc = cftunnel_benches::config(n);
    let b = live();
    let mut vc = cftunnel_config::valid::Cache::default();
    let rules = cftunnel_config::valid::document(&doc, &mut vc).expect("ok");
    let all = live() - b;
    drop(rules);
    let cache_only = live() - b;
    println!(
        "valid rules+cache {} ; cache alone {}",
        mib(all),
        mib(cache_only)
    );
    // patterns alone
    let b = live();
    let pats: Vec<_> = (0..n / 10)
        .map(|i| {
            cftunnel_config::valid::Pattern::new(&format!("/re{i}/[a-z]+/[0-9]+")).expect("ok")
        })
        .collect();
    println!(
        "{} patterns {} ({} B each)",
        pats.len(),
        mib(live() - b),
        (live() - b) / pats.len().max(1)
    );
    // upstreams
    let b = live();
    let ts: Vec<_> = (0..n)
        .map(|i| {
            cftunnel_config::valid::Target::new(
                &format!(
                    "http://10.{}.{}.{}:8080",
                    (i >> 16) & 255,
                    (i >> 8) & 255,
                    i & 255
                ),
                Default::default(),
                false,
                None,
                false,
            )
            .expect("ok")
        })
        .collect();
    println!(
        "{} targets {} ({} B each)",
        ts.len(),
        mib(live() - b),
        (live() - b) / ts.len().max(1)
    );
    let b = live();
    let ups: Vec<_> = ts
        .iter()
        .map(|t| cftunnel_proxy::forward::Upstream::new(t, 256).expect("ok"))
        .collect();
    println!(
        "{} upstreams {} ({} B each)",
        ups.len(),
        mib(live() - b),
        (live() - b) / ups.len().max(1)
    );
    let metrics = cftunnel_proxy::metrics::ProxyMetrics::register(&mut Default::default());
    let mut cache = cftunnel_proxy::config::Cache::default();
    let b = live();
    let r = cftunnel_proxy::config::compile(&doc, &metrics, &mut cache).expect("ok");
    println!("compiled table + caches {}", mib(live() - b));
    let b2 = live();
    let r2 = cftunnel_proxy::config::compile(&doc, &metrics, &mut cache).expect("ok");
    println!("second table (shared rules) {}", mib(live() - b2));
    drop((r, r2));
}
