//! Compiles the benchmarks' synthetic document of N rules (default 10,000) once cold and then
//! K more times with the cache warm (default 20), as repeated pushes do, from its JSON text as
//! a push is read and from the parsed document, and prints the time of each phase, the heap the parsed document and the compiled table hold, and the process's
//! peak resident set. For profilers (`perf record`, callgrind), which want one plain process
//! rather than criterion's harness.
//!
//! `cargo run --release -p cftunnel-benches --example compile -- 10000 20`

use cftunnel_proxy::config::{compile, compile_json, Cache};
use cftunnel_proxy::metrics::ProxyMetrics;
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The allocator the proxy binary uses, so the numbers are the binary's, counting the bytes
/// allocated and not yet freed.
#[global_allocator]
static ALLOC: Counting = Counting(cftunnel_alloc::Mimalloc);

struct Counting(cftunnel_alloc::Mimalloc);

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
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As the proxy binary runs.
    cftunnel_proxy::memory::disable_huge_pages();
    let mut args = std::env::args().skip(1);
    let mut number = |default: usize| -> Result<usize, String> {
        match args.next() {
            Some(arg) => arg.parse().map_err(|e| format!("{arg:?}: {e}")),
            None => Ok(default),
        }
    };
    let rules = number(10_000)?;
    let repushes = number(20)?;
    let metrics = ProxyMetrics::register(&mut Default::default());
    let mut cache = Cache::default();

    let base = LIVE.load(Ordering::Relaxed);
    let doc = cftunnel_benches::config(rules);
    let doc_heap = LIVE.load(Ordering::Relaxed) - base;

    let base = LIVE.load(Ordering::Relaxed);
    let start = Instant::now();
    let routes = compile(&doc, &metrics, &mut cache)?;
    let cold = start.elapsed();
    let table_heap = LIVE.load(Ordering::Relaxed) - base;

    // Each push compiles the next table while the previous one still serves.
    let mut serving = routes;
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let start = Instant::now();
    for _ in 0..repushes {
        let next = compile(&doc, &metrics, &mut cache)?;
        drop(std::mem::replace(&mut serving, next));
    }
    let warm = start.elapsed() / u32::try_from(repushes.max(1))?;
    let repush_heap = PEAK.load(Ordering::Relaxed) - base;
    drop(serving);

    // The same from the document's JSON text, as `PUT /config` reads it, with a cache of its own.
    let text = serde_json::to_vec(&doc)?;
    let mut cache = Cache::default();
    let start = Instant::now();
    let mut serving = compile_json(&text, 0, &metrics, &mut cache)?;
    let text_cold = start.elapsed();
    let start = Instant::now();
    for _ in 0..repushes {
        let next = compile_json(&text, 0, &metrics, &mut cache)?;
        drop(std::mem::replace(&mut serving, next));
    }
    let text_warm = start.elapsed() / u32::try_from(repushes.max(1))?;
    drop(serving);
    // What reading every rule into the config type costs, which a re-push skips for each rule
    // whose text is unchanged.
    let start = Instant::now();
    for _ in 0..repushes {
        drop(serde_json::from_slice::<cftunnel_config::Config>(&text)?);
    }
    let parse = start.elapsed() / u32::try_from(repushes.max(1))?;
    println!(
        "{rules} rules from JSON text ({}): cold {:.1} ms, re-push {:.1} ms (mean of {repushes}); \
         reading the whole text into the config type alone {:.1} ms",
        mib(text.len()),
        text_cold.as_secs_f64() * 1e3,
        text_warm.as_secs_f64() * 1e3,
        parse.as_secs_f64() * 1e3,
    );
    println!(
        "{rules} rules parsed: cold {:.1} ms, re-push {:.1} ms (mean of {repushes}); heap: document {}, \
         table and caches {}, a re-push adds up to {}; peak RSS {}",
        cold.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e3,
        mib(doc_heap),
        mib(table_heap),
        mib(repush_heap),
        peak_rss().unwrap_or_else(|| "unknown".to_owned()),
    );
    Ok(())
}

/// `VmHWM` from /proc/self/status (Linux).
fn peak_rss() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.trim_start_matches("VmHWM:").trim().to_owned())
}
