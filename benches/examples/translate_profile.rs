//! Translates the benchmarks' synthetic cluster (default 1,000 Gateways with 10 HTTPRoutes
//! each) once cold and then K more times with the contract's cache warm (default 5), as the
//! controller's rounds do, weighing each plane's regexes after each ([`Output::costs`]), and
//! prints the time of each phase. For profilers (`perf record`,
//! callgrind), which want one plain process rather than criterion's harness: the instructions
//! of K warm rounds are those of a run with K minus those of a run with 0.
//!
//! `cargo run --release -p cftunnel-benches --example translate_profile -- 1000 10 5`

use cftunnel_config::valid;
use cftunnel_controller_core::render::Plans;
use cftunnel_controller_core::translate::{translate_with, Options, Output};
use std::hint::black_box;
use std::time::Instant;

/// The allocator the controller binary uses, so the profile is the binary's.
#[global_allocator]
static ALLOC: cftunnel_alloc::Mimalloc = cftunnel_alloc::Mimalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut number = |default: usize| -> Result<usize, String> {
        match args.next() {
            Some(arg) => arg.parse().map_err(|e| format!("{arg:?}: {e}")),
            None => Ok(default),
        }
    };
    let gateways = number(1_000)?;
    let routes = number(10)?;
    let rounds = number(5)?;
    let snapshot = cftunnel_benches::cluster::snapshot(gateways, routes);
    let options = Options::default();
    let plans = Plans::new();
    let mut contract = valid::Cache::default();

    // What a round of the controller starts with: its own snapshot of the watch caches.
    let start = Instant::now();
    for _ in 0..rounds {
        black_box(snapshot.clone());
    }
    let copy = start.elapsed() / u32::try_from(rounds.max(1))?;

    let start = Instant::now();
    black_box(translate_with(&snapshot, &options, &plans, &mut contract));
    let cold = start.elapsed();

    let mut warm = std::time::Duration::ZERO;
    let mut weigh = std::time::Duration::ZERO;
    for _ in 0..rounds {
        let start = Instant::now();
        let output = translate_with(&snapshot, &options, &plans, &mut contract);
        warm += start.elapsed();
        let start = Instant::now();
        weigh_planes(&output, &mut contract);
        weigh += start.elapsed();
        black_box(output);
    }
    let per_round = u32::try_from(rounds.max(1))?;
    println!(
        "{gateways} Gateways, {} routes: cold {:.1} ms, warm {:.1} ms (mean of {rounds}), \
         weighing the planes' regexes {:.1} ms; the round's snapshot {:.1} ms",
        gateways * routes,
        cold.as_secs_f64() * 1e3,
        (warm / per_round).as_secs_f64() * 1e3,
        (weigh / per_round).as_secs_f64() * 1e3,
        copy.as_secs_f64() * 1e3,
    );
    Ok(())
}

/// What the controller's round does with a translation before it pushes.
fn weigh_planes(output: &Output, contract: &mut valid::Cache) {
    for plane in output.configs.keys() {
        black_box(output.costs(plane, contract));
    }
}
