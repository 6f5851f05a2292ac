//! The route table's lifecycle: a compiled config ([`Routes`]) is swapped in whole on each
//! push (`LiveRoutes`) and loaded once per request, so readers never lock and a request
//! finishes on the table it started with. A replaced table is retired off the request path
//! once its last request has ended, and the metric series of hostnames that went away with it
//! are dropped then, so `/metrics` does not grow with every hostname ever served.

use crate::metrics::{HostMetrics, ProxyMetrics};
use crate::route::Table;
use crate::rule::Rule;
use arc_swap::ArcSwap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// A compiled config: the route table plus the per-hostname metrics its buckets use.
#[derive(Debug)]
pub struct Routes {
    pub(crate) table: Table<Rule>,
    /// Metric children of each bucket, fetched on the bucket's first request rather than at
    /// compile time, so a push of thousands of hostnames stays cheap. Shared, so a response
    /// still streaming holds its hostname's metrics and not the whole table it started on.
    hosts: Box<[std::sync::OnceLock<Arc<HostMetrics>>]>,
    unmatched: std::sync::OnceLock<Arc<HostMetrics>>,
    metrics: ProxyMetrics,
    pub(crate) version: i64,
    pub(crate) has_grpc: bool,
}

impl Routes {
    pub(crate) fn new(
        table: Table<Rule>,
        metrics: ProxyMetrics,
        version: i64,
        has_grpc: bool,
    ) -> Self {
        let hosts = table
            .buckets()
            .map(|_| std::sync::OnceLock::new())
            .collect();
        Self {
            table,
            hosts,
            unmatched: std::sync::OnceLock::new(),
            metrics,
            version,
            has_grpc,
        }
    }

    pub fn version(&self) -> i64 {
        self.version
    }

    pub fn rule_count(&self) -> usize {
        self.table.rule_count()
    }

    /// The compiled table, for lookups outside the request path (benchmarks, diagnostics).
    pub fn table(&self) -> &Table<Rule> {
        &self.table
    }

    /// Whether GRPCRoutes contributed to this table.
    pub fn has_grpc_route(&self) -> bool {
        self.has_grpc
    }

    /// The hostname pattern a bucket serves (`*` for rules without hostnames), as the metrics
    /// label it; empty for no bucket.
    pub(crate) fn host_label(&self, bucket: Option<usize>) -> &str {
        bucket
            .and_then(|b| self.table.bucket(b))
            .map_or("", |b| &b.pattern)
    }

    pub(crate) fn host_metrics(&self, bucket: Option<usize>) -> &Arc<HostMetrics> {
        match bucket.and_then(|b| Some((self.hosts.get(b)?, self.table.bucket(b)?))) {
            Some((slot, b)) => slot.get_or_init(|| Arc::new(self.metrics.host(&b.pattern))),
            None => self
                .unmatched
                .get_or_init(|| Arc::new(self.metrics.host(""))),
        }
    }
}

/// The table in service: swapped whole on each push, loaded once per request, never locked.
#[derive(Debug)]
pub(crate) struct LiveRoutes {
    routes: ArcSwap<Routes>,
    loaded: AtomicBool,
    /// Bumped on every swap, for what follows the table (not requests, which load it).
    swaps: watch::Sender<u64>,
}

impl LiveRoutes {
    pub(crate) fn new(routes: Routes) -> Self {
        Self {
            routes: ArcSwap::from_pointee(routes),
            loaded: AtomicBool::new(false),
            swaps: watch::Sender::new(0),
        }
    }

    /// The table being served now; a request keeps it to its end.
    pub(crate) fn load_full(&self) -> Arc<Routes> {
        self.routes.load_full()
    }

    /// Whether a table has been swapped in since start.
    pub(crate) fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Changes each time a table is swapped in.
    pub(crate) fn swaps(&self) -> watch::Receiver<u64> {
        self.swaps.subscribe()
    }

    /// Swaps in `routes` and returns the table it replaced, which requests already running
    /// keep until they end.
    pub(crate) fn swap(&self, routes: Routes) -> Arc<Routes> {
        let old = self.routes.swap(Arc::new(routes));
        self.loaded.store(true, Ordering::Release);
        self.swaps.send_modify(|n| *n += 1);
        old
    }
}

/// How long a retired table may wait for its last in-flight request before it is let go
/// wherever that request ends.
const RETIRE_WAIT: Duration = Duration::from_secs(300);

/// Frees a replaced table off the request path. Freeing a large table takes milliseconds, and
/// without this it would land on whichever request happened to hold the last reference.
///
/// `serving` reads the table in service once no request holds `old` any more: hostnames that
/// table serves keep their metric series, the others `old` served lose theirs.
pub(crate) fn retire(
    old: Arc<Routes>,
    metrics: ProxyMetrics,
    serving: impl Fn() -> Arc<Routes> + Send + 'static,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let until = Instant::now() + RETIRE_WAIT;
        while Arc::strong_count(&old) > 1 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if Arc::strong_count(&old) == 1 {
            // No request routes on it any more, so none can bring a series back through it.
            forget_hostnames(&old, &serving(), &metrics);
            let _ = tokio::task::spawn_blocking(move || {
                drop(old);
                crate::memory::release_freed();
            })
            .await;
        }
    });
}

/// Drops the metric series of hostname patterns `old` served and `now` does not (the
/// unmatched series stays), so `/metrics` does not grow with every hostname ever served.
fn forget_hostnames(old: &Routes, now: &Routes, metrics: &ProxyMetrics) {
    let kept: std::collections::HashSet<&str> = now.table.buckets().map(|b| &*b.pattern).collect();
    for label in old.table.buckets().map(|b| &*b.pattern) {
        if !label.is_empty() && !kept.contains(label) {
            metrics.forget_host(label);
        }
    }
}
