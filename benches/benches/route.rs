//! Route lookup at 10, 1,000 and 10,000 rules, and compiling a 10,000-rule document.

use cftunnel_benches::{config, probes};

/// The allocator the proxy binary uses, so the numbers are the binary's.
#[global_allocator]
static ALLOC: cftunnel_alloc::Mimalloc = cftunnel_alloc::Mimalloc;

use cftunnel_proxy::config::{compile, Cache};
use cftunnel_proxy::metrics::ProxyMetrics;
use cftunnel_proxy::route::RequestView;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use http::{HeaderMap, HeaderValue, Method};
use std::hint::black_box;

fn version_header() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("x-version", HeaderValue::from_static("v2"));
    h
}

fn lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("lookup");
    for n in [10usize, 1_000, 10_000] {
        let metrics = ProxyMetrics::register(&mut Default::default());
        let routes =
            compile(&config(n), &metrics, &mut Cache::default()).expect("bench config compiles");
        let probes = probes(n);
        let hits = probes
            .iter()
            .filter(|(h, p)| {
                let headers = version_header();
                let view = RequestView {
                    method: &Method::GET,
                    path: p,
                    query: None,
                    headers: &headers,
                };
                routes.table().find(h, &view).is_some()
            })
            .count();
        assert_eq!(hits, 3, "three probes hit, the last one misses");
        let headers = version_header();
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                for (host, path) in &probes {
                    let view = RequestView {
                        method: &Method::GET,
                        path,
                        query: None,
                        headers: &headers,
                    };
                    black_box(routes.table().find(black_box(host), &view).is_some());
                }
            })
        });
    }
    group.finish();
}

fn compile_large(c: &mut Criterion) {
    let doc = config(10_000);
    let metrics = ProxyMetrics::register(&mut Default::default());
    let mut group = c.benchmark_group("compile");
    group.sample_size(20);
    group.bench_function("10000/cold", |b| {
        b.iter(|| {
            // A fresh cache: every backend client and every pattern is built.
            let routes =
                compile(black_box(&doc), &metrics, &mut Cache::default()).expect("compiles");
            black_box(routes.rule_count())
        })
    });
    let mut warm = Cache::default();
    compile(&doc, &metrics, &mut warm).expect("compiles");
    group.bench_function("10000/repush", |b| {
        b.iter(|| {
            // The same document again, as a controller re-pushes after a small change.
            let routes = compile(black_box(&doc), &metrics, &mut warm).expect("compiles");
            black_box(routes.rule_count())
        })
    });
    group.finish();
}

criterion_group!(benches, lookup, compile_large);
criterion_main!(benches);
