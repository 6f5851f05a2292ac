//! The load harness end to end on the `direct` scenario, with the echo backend in-process.

use std::path::PathBuf;
use std::time::Duration;

use cftunnel_loadtest::harness::report::Outcome;
use cftunnel_loadtest::harness::scenario::Scenario;
use cftunnel_loadtest::harness::{run, RunConfig};

fn config(scenarios: Vec<Scenario>) -> RunConfig {
    RunConfig {
        scenarios,
        duration: Duration::from_millis(400),
        warmup: Duration::from_millis(100),
        connections: 4,
        rounds: 1,
        workers: 1,
        path: "/loadtest".to_owned(),
        proxy_bin: PathBuf::from("/nonexistent/cftunnel-proxy"),
        echo_bin: None,
        nginx_bin: None,
        server_cpus: None,
        echo_cpus: None,
        load_cpus: None,
        keep_scratch: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_scenario_measures_the_echo_backend() {
    let report = tokio::time::timeout(
        Duration::from_secs(20),
        run(&config(vec![Scenario::Direct]), &|_| {}),
    )
    .await
    .expect("run finishes within its bound")
    .expect("run starts");
    assert_eq!(report.scenarios.len(), 1);
    let direct = &report.scenarios[0];
    assert_eq!(direct.outcome, Outcome::Ok, "{:?}", direct.reason);
    let load = direct.load.as_ref().expect("direct was measured");
    assert!(load.requests > 0);
    assert_eq!(load.errors, 0);
    assert!(load.p50_us > 0 && load.p50_us <= load.p99_us && load.p99_us <= load.max_us);
    assert!(report.comparisons.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_servers_are_skipped_with_a_reason() {
    let report = tokio::time::timeout(
        Duration::from_secs(20),
        run(&config(vec![Scenario::Proxy, Scenario::Nginx]), &|_| {}),
    )
    .await
    .expect("run finishes within its bound")
    .expect("run starts");
    for r in &report.scenarios {
        assert_eq!(r.outcome, Outcome::Skipped, "{:?}", r.scenario);
        assert!(r.reason.as_deref().is_some_and(|s| !s.is_empty()));
    }
    let table = report.render_table();
    assert!(table.contains("cftunnel-proxy not found"), "{table}");
    assert!(table.contains("nginx is not installed"), "{table}");
}
