//! The route table's lifecycle: a compiled config ([`Routes`]) is swapped in whole on each
//! push (`LiveRoutes`) and loaded once per request, so readers never lock and a request
//! finishes on the table it started with. A replaced table is retired off the request path
//! once its last request has ended, and the metric series of hostnames that went away with it
//! are dropped then, so `/metrics` does not grow with every hostname ever served.

use crate::metrics::{HostMetrics, ProxyMetrics};
use crate::route::Table;
use crate::rule::Rule;
use arc_swap::ArcSwap;
use std::collections::HashSet;
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
    h2c_backend: bool,
}

impl Routes {
    pub(crate) fn new(
        table: Table<Rule>,
        metrics: ProxyMetrics,
        version: i64,
        has_grpc: bool,
        h2c_backend: bool,
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
            h2c_backend,
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

    /// Whether a rule sends requests to a backend the config marks `h2c` (see
    /// [`Upstream::h2c`](crate::forward::Upstream::h2c)): gRPC served through an HTTPRoute
    /// reaches its backend this way, and its responses end in trailers.
    pub fn has_h2c_backend(&self) -> bool {
        self.h2c_backend
    }

    /// The hostname pattern a bucket serves (`*` for rules without hostnames), as the metrics
    /// label it; empty for no bucket.
    pub(crate) fn host_label(&self, bucket: Option<usize>) -> &str {
        bucket
            .and_then(|b| self.table.bucket(b))
            .map_or("", |b| &b.pattern)
    }

    /// A bucket's metric children, fetched on its first request ([`ProxyMetrics::host`] waits
    /// for a turn with the dropping of hostnames' series); later requests only read the slot.
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
    retire_within(old, metrics, serving, RETIRE_WAIT);
}

/// [`retire`], waiting at most `wait` for the last request on `old`.
fn retire_within(
    old: Arc<Routes>,
    metrics: ProxyMetrics,
    serving: impl Fn() -> Arc<Routes> + Send + 'static,
    wait: Duration,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let until = Instant::now() + wait;
        while Arc::strong_count(&old) > 1 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Past the wait a request may still hold it (a gRPC watch without a deadline, a rule
        // whose timeouts are off): its hostnames' series go all the same, and the table is
        // freed wherever that request ends. Off the workers: a series' removal waits for a
        // `/metrics` encode of its family, and each turn at the series for a request's first
        // fetch queued before it.
        let _ = tokio::task::spawn_blocking(move || {
            forget_hostnames(&old, &serving, &metrics);
            if Arc::strong_count(&old) == 1 {
                drop(old);
                crate::memory::release_freed();
            }
        })
        .await;
    });
}

/// Drops the metric series of hostname patterns `old` served and the table `serving` returns
/// does not (the unmatched series stays), so `/metrics` does not grow with every hostname ever
/// served.
///
/// Each hostname dropped takes a turn of its own ([`ProxyMetrics::host_series`]): dropping one
/// can wait for a `/metrics` encoding under way, and a request fetching its hostname's series
/// for the first time waits for the turns before its own, not for the whole pass.
///
/// Within a turn the table in service is read again, and the decision that a hostname is gone
/// and its dropping happen together. A fetch for a table that serves the hostname again thus
/// takes its turn either after, and creates fresh children that `/metrics` lists, or before:
/// the table it fetched for was then swapped in before this turn, so the read returns that
/// table, which keeps the series, or one pushed since; if that one lacks the hostname, the
/// fetching table is being retired too and its series would go with it anyway. A hostname a
/// read finds served takes no turn: the retirement of the table serving it decides for it.
fn forget_hostnames(old: &Routes, serving: impl Fn() -> Arc<Routes>, metrics: &ProxyMetrics) {
    let labels = || {
        old.table
            .buckets()
            .map(|b| &*b.pattern)
            .filter(|l| !l.is_empty())
    };
    let served: HashSet<&str> = labels().collect();
    // `now` is held, so a table read later at the same address is the same table: the kept
    // set is rebuilt only when a push swapped another in, not once per hostname.
    let mut now = serving();
    let mut kept = kept_of(&served, &now);
    for label in labels() {
        if kept.contains(label) {
            continue;
        }
        let series = metrics.host_series();
        let current = serving();
        if !Arc::ptr_eq(&current, &now) {
            kept = kept_of(&served, &current);
            now = current;
        }
        if !kept.contains(label) {
            series.forget(label);
        }
    }
}

/// The hostname patterns of `served` that `now` serves too.
fn kept_of<'a>(served: &HashSet<&'a str>, now: &Routes) -> HashSet<&'a str> {
    now.table
        .buckets()
        .filter_map(|b| served.get(&*b.pattern).copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{compile, Cache};

    fn table(hosts: &[&str], metrics: &ProxyMetrics, cache: &mut Cache) -> Arc<Routes> {
        let doc: cftunnel_config::Config = serde_json::from_value(serde_json::json!({
            "rules": [{"hostnames": hosts, "backends": []}]
        }))
        .expect("a document");
        Arc::new(compile(&doc, metrics, cache).expect("compiles"))
    }

    /// A request that holds the replaced table past the wait does not keep the series of the
    /// hostnames only that table served on `/metrics`.
    #[tokio::test]
    async fn a_table_held_past_the_wait_still_gives_up_its_hostnames_series() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = ProxyMetrics::register(&mut registry);
        let mut cache = Cache::default();
        let old = table(&["old.example", "kept.example"], &metrics, &mut cache);
        let now = table(&["kept.example"], &metrics, &mut cache);
        for bucket in 0..old.table.buckets().count() {
            old.host_metrics(Some(bucket));
        }
        let text = |registry: &prometheus_client::registry::Registry| {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, registry).expect("encodes");
            text
        };
        assert!(text(&registry).contains("hostname=\"old.example\""));

        let held = Arc::clone(&old);
        let wait = Duration::from_millis(300);
        retire_within(old, metrics.clone(), move || Arc::clone(&now), wait);
        tokio::time::sleep(wait * 3).await;
        let after = text(&registry);
        assert!(!after.contains("hostname=\"old.example\""), "{after}");
        assert!(after.contains("hostname=\"kept.example\""), "{after}");
        drop(held);
    }

    /// A table that serves a hostname again, swapped in while the table that last had it is
    /// retired, keeps counting it on `/metrics` if a request on it fetched the hostname's
    /// series before the retirement dropped the ones no table served.
    #[test]
    fn a_hostname_served_again_during_a_retirement_keeps_its_series() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = ProxyMetrics::register(&mut registry);
        let mut cache = Cache::default();
        let retired = table(&["a.example"], &metrics, &mut cache);
        let without = table(&[], &metrics, &mut cache);
        let again = table(&["a.example"], &metrics, &mut cache);
        let bucket = again
            .table
            .buckets()
            .position(|b| &*b.pattern == "a.example");
        assert!(bucket.is_some(), "a bucket for a.example");
        // The first request on the table serving it again, before the series are dropped.
        let a = Arc::clone(again.host_metrics(bucket));

        // The retirement first reads the table without it, then the one serving it again.
        let reads = std::sync::atomic::AtomicUsize::new(0);
        let serving = || {
            if reads.fetch_add(1, Ordering::SeqCst) == 0 {
                Arc::clone(&without)
            } else {
                Arc::clone(&again)
            }
        };
        forget_hostnames(&retired, serving, &metrics);
        a.request(crate::metrics::StatusClass::S2xx).inc();

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(
            text.contains(
                "cftunnel_proxy_requests_total{hostname=\"a.example\",status_class=\"2xx\"} 1\n"
            ),
            "{text}"
        );
    }

    /// A request fetching its hostname's series while a retirement drops a thousand others
    /// waits for the hostname being dropped, not for the whole pass.
    #[test]
    fn a_first_request_waits_for_one_dropped_hostname_not_the_whole_pass() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = ProxyMetrics::register(&mut registry);
        let mut cache = Cache::default();
        let names: Vec<String> = (0..1000).map(|i| format!("h{i}.example")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let retired = table(&names, &metrics, &mut cache);
        for bucket in 0..retired.table.buckets().count() {
            retired.host_metrics(Some(bucket));
        }
        let pushed = table(&["new.example"], &metrics, &mut cache);
        let bucket = pushed
            .table
            .buckets()
            .position(|b| &*b.pattern == "new.example");
        assert!(bucket.is_some(), "a bucket for new.example");
        let encode = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
            text
        };

        let reads = std::sync::atomic::AtomicUsize::new(0);
        let fetched_before_the_next_drop = std::sync::OnceLock::new();
        let first_request_on = &pushed;
        std::thread::scope(|scope| {
            let serving = || {
                match reads.fetch_add(1, Ordering::SeqCst) {
                    // In the first hostname's turn: the first request on the pushed table
                    // comes, and waits for a turn.
                    1 => {
                        let (asking, asked) = std::sync::mpsc::channel();
                        scope.spawn(move || {
                            let _ = asking.send(());
                            first_request_on.host_metrics(bucket);
                        });
                        asked.recv().expect("the fetch starts");
                        // From its signal to waiting for the turn it has a few instructions
                        // to run; without them run, it would come after the next drop and
                        // fail the test, never pass it wrongly.
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    // In the next hostname's turn.
                    2 => {
                        let _ = fetched_before_the_next_drop
                            .set(encode().contains("hostname=\"new.example\""));
                    }
                    _ => {}
                }
                Arc::clone(&pushed)
            };
            forget_hostnames(&retired, serving, &metrics);
        });

        assert_eq!(
            fetched_before_the_next_drop.get(),
            Some(&true),
            "the request fetched its series between two hostnames' drops"
        );
        let after = encode();
        assert!(!after.contains("hostname=\"h999.example\""), "{after}");
        assert!(after.contains("hostname=\"new.example\""), "{after}");
    }
}
