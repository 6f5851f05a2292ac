//! The controller's translation of a large cluster: 1,000 Gateways with 10 HTTPRoutes each
//! (10,000 routes) on the shared data plane, into the proxy document and every status.

use cftunnel_benches::cluster;
use cftunnel_config::valid;
use cftunnel_controller_core::render::Plans;
use cftunnel_controller_core::translate::{translate_with, Options, PlaneKey};
use criterion::{criterion_group, criterion_main, Criterion};

/// The allocator the controller binary uses, so the numbers are the binary's.
#[global_allocator]
static ALLOC: cftunnel_alloc::Mimalloc = cftunnel_alloc::Mimalloc;
use std::hint::black_box;

fn translate_large(c: &mut Criterion) {
    let snapshot = cluster::snapshot(1_000, 10);
    let options = Options::default();
    // Every Gateway is on the shared plane: there is no dedicated plane to render.
    let plans = Plans::new();
    let mut contract = valid::Cache::default();
    let out = translate_with(&snapshot, &options, &plans, &mut contract);
    let rules = out
        .configs
        .get(&PlaneKey::Shared)
        .map_or(0, |c| c.rules.len());
    assert!(
        rules >= 10_000,
        "every route is served: {rules} rules in the shared document"
    );
    assert_eq!(
        out.statuses.routes.len(),
        10_000,
        "every route has a status"
    );

    let mut group = c.benchmark_group("translate");
    group.sample_size(10);
    group.bench_function("1000gw-10000routes/warm", |b| {
        // As the controller runs it: the contract's cache kept from the previous translation.
        b.iter(|| black_box(translate_with(&snapshot, &options, &plans, &mut contract)))
    });
    group.bench_function("1000gw-10000routes/cold", |b| {
        b.iter(|| {
            let mut fresh = valid::Cache::default();
            black_box(translate_with(&snapshot, &options, &plans, &mut fresh))
        })
    });
    group.finish();
}

criterion_group!(benches, translate_large);
criterion_main!(benches);
