use super::{AtomicHistogram, Shards, MAX_SHARDS};
use crate::metrics::{HostLabels, DURATION_BUCKETS};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::borrow::Cow;

/// `/metrics` text of a registry holding `metric` the way the proxy registers the duration
/// family: under a prefix, with a registry-wide label, in a family keyed by hostname.
fn exposition<M>(metric: M) -> String
where
    M: prometheus_client::registry::Metric + Clone,
{
    let mut registry =
        Registry::with_labels([(Cow::Borrowed("pod"), Cow::Borrowed("proxy-0"))].into_iter());
    registry
        .sub_registry_with_prefix("cftunnel_proxy")
        .register("request_duration_seconds", "Time", metric);
    let mut text = String::new();
    encode(&mut text, &registry).expect("encoding into a String cannot fail");
    text
}

/// Both histograms fed `values`, each as the one child of a hostname family.
fn both(values: &[f64]) -> (String, String) {
    let host = HostLabels {
        hostname: "*.example.com".to_owned(),
    };
    let old = Family::<HostLabels, Histogram, _>::new_with_constructor(|| {
        Histogram::new(DURATION_BUCKETS)
    });
    let new = Family::<HostLabels, AtomicHistogram, _>::new_with_constructor(|| {
        AtomicHistogram::new(DURATION_BUCKETS, Shards::for_workers(4))
    });
    for v in values {
        old.get_or_create(&host).observe(*v);
        new.get_or_create(&host).observe(*v);
    }
    (exposition(old), exposition(new))
}

#[test]
fn encodes_byte_for_byte_as_prometheus_client() {
    let cases: [(&str, Vec<f64>); 9] = [
        ("no observations", vec![]),
        ("every bound exactly", DURATION_BUCKETS.to_vec()),
        (
            "just above every bound",
            DURATION_BUCKETS.iter().map(|b| b.next_up()).collect(),
        ),
        ("zeros and negatives", vec![0.0, -0.0, -1.0, f64::MIN]),
        (
            "tiny and huge",
            vec![f64::MIN_POSITIVE, 5e-324, 31.0, 1e300, f64::MAX],
        ),
        (
            "typical latencies",
            vec![
                0.0004, 0.0012, 0.003, 0.0071, 0.02, 0.04, 0.3, 1.2, 7.5, 0.33,
            ],
        ),
        ("+Inf counts but fills no bucket", vec![0.2, f64::INFINITY]),
        (
            "-Inf goes to the first bucket",
            vec![f64::NEG_INFINITY, 0.2],
        ),
        ("NaN counts but fills no bucket", vec![0.2, f64::NAN, 0.5]),
    ];
    for (name, values) in cases {
        let (old, new) = both(&values);
        assert_eq!(new, old, "{name}");
    }
}

#[test]
fn encodes_as_prometheus_client_without_labels() {
    let old = Histogram::new([1.0, 2.0, 4.0]);
    let new = AtomicHistogram::new([1.0, 2.0, 4.0], Shards::ONE);
    for v in [0.5, 1.0, 3.0, 4.0, 9.0, f64::NAN] {
        old.observe(v);
        new.observe(v);
    }
    assert_eq!(exposition(new), exposition(old));
}

#[test]
fn clones_share_one_series() {
    let h = AtomicHistogram::new([1.0], Shards::for_workers(2));
    h.clone().observe(0.5);
    h.observe(2.0);
    assert_eq!(h.snapshot(), (2.5, 2, vec![(1.0, 1), (f64::MAX, 1)]));
}

#[test]
fn shards_follow_the_worker_count_up_to_the_cap() {
    let shards = |workers| Shards::for_workers(workers).get();
    assert_eq!(
        [0, 1, 2, 4, 7, 16, 17, 64].map(shards),
        [1, 1, 2, 4, 7, MAX_SHARDS, MAX_SHARDS, MAX_SHARDS]
    );
    // Two 128-byte lines per copy with the proxy's bounds (the sum and 17 counts).
    let h = AtomicHistogram::new(DURATION_BUCKETS, Shards::for_workers(64));
    assert_eq!(
        (h.counts.lines.len(), std::mem::size_of::<super::Line>()),
        (2 * MAX_SHARDS, 128)
    );
    let h = AtomicHistogram::new(DURATION_BUCKETS, Shards::ONE);
    assert_eq!(h.counts.lines.len(), 2);
}

#[test]
fn concurrent_observers_lose_nothing_and_scrapes_stay_well_formed() {
    const SHARDS: usize = 4;
    // More threads than copies of the counters, so some threads share one.
    const THREADS: usize = SHARDS + 2;
    const PER_THREAD: usize = 100_000;
    // Dyadic values: every partial sum is exact, so the total does not depend on the order,
    // and each lands in its own bucket (0.0 in the first, 0.25, 0.5, and 2.0 in 2.5's).
    const VALUES: [f64; 4] = [0.0, 0.25, 0.5, 2.0];
    let h = AtomicHistogram::new(DURATION_BUCKETS, Shards::for_workers(SHARDS));
    let bucket = |buckets: &[(f64, u64)], bound: f64| {
        buckets
            .iter()
            .find(|(b, _)| *b == bound)
            .map(|(_, n)| *n)
            .expect("a bucket with that bound")
    };
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let scraper = s.spawn(|| {
            let (mut scrapes, mut last) = (0, (0.0, 0));
            while !done.load(std::sync::atomic::Ordering::Relaxed) || scrapes == 0 {
                let (sum, count, buckets) = h.snapshot();
                assert!(sum >= last.0 && count >= last.1, "series only grow");
                last = (sum, count);
                // Each observation adds to its copy's sum before its bucket, and a scrape
                // reads the buckets before the sums, so every observation the buckets show
                // is in the sum (it may hold more: ones whose bucket is not counted yet).
                let shown = 0.25 * bucket(&buckets, 0.25) as f64
                    + 0.5 * bucket(&buckets, 0.5) as f64
                    + 2.0 * bucket(&buckets, 2.5) as f64;
                assert!(
                    sum >= shown,
                    "_sum {sum} is less than its buckets show: {shown}"
                );
                assert!(sum.is_finite());
                let text = exposition(h.clone());
                assert!(text.ends_with("# EOF\n"), "{text}");
                scrapes += 1;
            }
            scrapes
        });
        let observers: Vec<_> = (0..THREADS)
            .map(|t| {
                let h = h.clone();
                s.spawn(move || {
                    for i in 0..PER_THREAD {
                        h.observe(VALUES[(i + t) % VALUES.len()]);
                    }
                })
            })
            .collect();
        for o in observers {
            o.join().expect("observer thread");
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(scraper.join().expect("scraper thread") > 0);
    });

    let (sum, count, buckets) = h.snapshot();
    let n = (THREADS * PER_THREAD) as u64;
    assert_eq!(count, n);
    assert_eq!(buckets.iter().map(|(_, n)| n).sum::<u64>(), n);
    assert_eq!(
        sum,
        VALUES.iter().sum::<f64>() * (n / VALUES.len() as u64) as f64
    );
    // Every value was observed equally often, so one thread feeding them in turn must agree.
    let sequential = Histogram::new(DURATION_BUCKETS);
    for i in 0..THREADS * PER_THREAD {
        sequential.observe(VALUES[i % VALUES.len()]);
    }
    assert_eq!(exposition(h), exposition(sequential));
}

#[test]
fn proxy_metrics_expose_observed_durations_as_a_histogram() {
    let mut registry = Registry::default();
    let metrics = crate::metrics::ProxyMetrics::register_for_workers(&mut registry, 4);
    metrics.host("a.example").duration.observe(0.003);
    let mut text = String::new();
    encode(&mut text, &registry).expect("encoding into a String cannot fail");
    let name = "cftunnel_proxy_request_duration_seconds";
    for line in [
        format!("# TYPE {name} histogram"),
        format!("{name}_count{{hostname=\"a.example\"}} 1"),
        format!("{name}_bucket{{le=\"0.0025\",hostname=\"a.example\"}} 0"),
        format!("{name}_bucket{{le=\"0.005\",hostname=\"a.example\"}} 1"),
        format!("{name}_bucket{{le=\"+Inf\",hostname=\"a.example\"}} 1"),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
}
