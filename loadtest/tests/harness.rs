//! The load harness end to end on the `direct` scenario, with the echo backend in-process;
//! the tunnel scenarios too when the proxy and mock edge binaries have been built.

use std::path::PathBuf;
use std::time::Duration;

use cftunnel_loadtest::harness::progress::Progress;
use cftunnel_loadtest::harness::report_files;
use cftunnel_loadtest::harness::results::{Machine, Outcome, Results};
use cftunnel_loadtest::harness::scenario::Scenario;
use cftunnel_loadtest::harness::{run, RunConfig};

/// What the echo backend lists for a load request that crossed a tunnel (it leaves `Host` out).
const TUNNEL_ORIGIN_HEADERS: [&str; 7] = [
    "cdn-loop",
    "cf-connecting-ip",
    "cf-ray",
    "cf-visitor",
    "cf-warp-tag-id",
    "x-forwarded-for",
    "x-forwarded-proto",
];

fn config(scenarios: Vec<Scenario>) -> RunConfig {
    RunConfig {
        scenarios,
        duration: Duration::from_millis(400),
        warmup: Duration::from_millis(100),
        connections: 4,
        rate: None,
        rounds: 1,
        workers: 1,
        tunnel_connections: 4,
        path: "/loadtest".to_owned(),
        proxy_bin: PathBuf::from("/nonexistent/cftunnel-proxy"),
        edge_bin: PathBuf::from("/nonexistent/cftunnel-mock-edge"),
        echo_bin: None,
        nginx_bin: None,
        cloudflared_bin: None,
        server_cpus: None,
        echo_cpus: None,
        load_cpus: None,
        keep_scratch: false,
        bare_requests: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_scenario_measures_the_echo_backend() {
    let progress = Progress::collect();
    let report = tokio::time::timeout(
        Duration::from_secs(20),
        run(&config(vec![Scenario::Direct]), &progress),
    )
    .await
    .expect("run finishes within its bound")
    .expect("run starts");
    // One step line per scenario round, with its rate and latency.
    let lines = progress.lines();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("round 1/1 · direct: ") && l.contains(" req/s, p50 ")),
        "{lines:?}"
    );
    assert_eq!(report.scenarios.len(), 1);
    let direct = &report.scenarios[0];
    assert_eq!(direct.outcome, Outcome::Ok, "{:?}", direct.reason);
    let load = direct.load.as_ref().expect("direct was measured");
    assert!(load.requests > 0);
    assert_eq!(load.errors, 0);
    assert!(load.p50_us > 0 && load.p50_us <= load.p99_us && load.p99_us <= load.max_us);
    assert!(report.comparisons.is_empty());
    // The origin got the headers a tunnel path would have added, and no others.
    assert_eq!(direct.origin_headers, TUNNEL_ORIGIN_HEADERS);
    // The results file carries the measured curve and reads back equal, chart beside it.
    let results = report.results(
        Machine::default(),
        "cftunnel-loadtest --scenarios direct".to_owned(),
        "2026-10-20T13:40:05Z".to_owned(),
    );
    let series = &results.groups[0].series[0];
    let measured = series.measured.as_ref().expect("measured");
    assert_eq!(series.name, "direct");
    assert_eq!(measured.requests, load.requests);
    assert_eq!(measured.percentiles.len(), 11);
    assert!(measured
        .percentiles
        .windows(2)
        .all(|w| w[0].latency_us <= w[1].latency_us));
    assert!(results.details.is_some(), "the full report is kept");
    let dir = std::env::temp_dir().join(format!("cftunnel-harness-report-{}", std::process::id()));
    let files = report_files::write(&results, &dir, "harness-test").expect("written");
    // Measured rates are arbitrary floats: compared to the last bit only where JSON keeps
    // them exactly (the unit tests), here to within rounding.
    let back = Results::read(&files.json).expect("reads back");
    let back_measured = back.groups[0].series[0]
        .measured
        .as_ref()
        .expect("measured");
    assert_eq!(back_measured.percentiles, measured.percentiles);
    assert_eq!(back_measured.requests, measured.requests);
    assert!((back_measured.rps - measured.rps).abs() <= measured.rps * 1e-12);
    assert_eq!(back.command, results.command);
    assert!(std::fs::read_to_string(&files.svg)
        .expect("chart")
        .contains("direct  p50 "));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_requests_carry_only_the_host() {
    let mut cfg = config(vec![Scenario::Direct]);
    cfg.bare_requests = true;
    let report = tokio::time::timeout(Duration::from_secs(20), run(&cfg, &Progress::collect()))
        .await
        .expect("run finishes within its bound")
        .expect("run starts");
    let direct = &report.scenarios[0];
    assert_eq!(direct.outcome, Outcome::Ok, "{:?}", direct.reason);
    // The echo backend lists every header but `Host`, as Go's request does.
    assert!(
        direct.origin_headers.is_empty(),
        "{:?}",
        direct.origin_headers
    );
    assert!(report.settings.bare_requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_servers_are_skipped_with_a_reason() {
    let report = tokio::time::timeout(
        Duration::from_secs(20),
        run(
            &config(vec![Scenario::Proxy, Scenario::Nginx]),
            &Progress::collect(),
        ),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnel_scenarios_without_binaries_are_skipped_with_a_reason() {
    let mut cfg = config(vec![Scenario::TunnelQuic, Scenario::TunnelHttp2]);
    cfg.proxy_bin = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let report = tokio::time::timeout(Duration::from_secs(20), run(&cfg, &Progress::collect()))
        .await
        .expect("run finishes within its bound")
        .expect("run starts");
    assert_eq!(report.scenarios.len(), 2);
    for r in &report.scenarios {
        assert_eq!(r.outcome, Outcome::Skipped, "{:?}", r.scenario);
    }
    assert!(report.tunnel_overhead.is_empty());
    let table = report.render_table();
    assert!(table.contains("cftunnel-mock-edge not found"), "{table}");
    assert!(table.contains("-p cftunnel-testkit"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudflared_scenarios_without_a_binary_are_skipped_with_a_reason() {
    let cfg = config(vec![
        Scenario::CloudflaredQuicEdge,
        Scenario::CloudflaredHttp2Edge,
    ]);
    let report = tokio::time::timeout(Duration::from_secs(20), run(&cfg, &Progress::collect()))
        .await
        .expect("run finishes within its bound")
        .expect("run starts");
    for r in &report.scenarios {
        assert_eq!(r.outcome, Outcome::Skipped, "{:?}", r.scenario);
    }
    let table = report.render_table();
    assert!(table.contains("no cloudflared binary"), "{table}");
}

/// `cftunnel-proxy` and `cftunnel-mock-edge` from the workspace's target directory (release
/// first); `None` when either has not been built.
fn built_binaries() -> Option<(PathBuf, PathBuf)> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    ["release", "debug"].iter().find_map(|profile| {
        let proxy = target.join(profile).join("cftunnel-proxy");
        let edge = target.join(profile).join("cftunnel-mock-edge");
        (proxy.is_file() && edge.is_file()).then_some((proxy, edge))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnel_scenarios_measure_the_proxy_behind_the_mock_edge() {
    let Some((proxy_bin, edge_bin)) = built_binaries() else {
        eprintln!(
            "skipped: build cftunnel-proxy and cftunnel-mock-edge first \
             (cargo build --release -p cftunnel-proxy -p cftunnel-testkit)"
        );
        return;
    };
    let mut cfg = config(vec![
        Scenario::Proxy,
        Scenario::TunnelQuic,
        Scenario::TunnelHttp2,
        Scenario::TunnelQuicEdge,
        Scenario::TunnelHttp2Edge,
    ]);
    cfg.proxy_bin = proxy_bin;
    cfg.edge_bin = edge_bin;
    let report = tokio::time::timeout(Duration::from_secs(120), run(&cfg, &Progress::collect()))
        .await
        .expect("run finishes within its bound")
        .expect("run starts");
    for r in &report.scenarios {
        assert_eq!(r.outcome, Outcome::Ok, "{:?}: {:?}", r.scenario, r.reason);
        let load = r.load.as_ref().expect("measured");
        assert!(load.requests > 0, "{:?}", r.scenario);
        assert_eq!(load.errors, 0, "{:?}", r.scenario);
        assert!(
            r.memory_idle.is_some(),
            "{:?}: the proxy's memory",
            r.scenario
        );
        assert!(r.server_cpu.is_some(), "{:?}: the proxy's CPU", r.scenario);
        // A mock edge child has its CPU reported; an in-process one is part of the load.
        assert_eq!(
            r.edge_cpu.is_some(),
            matches!(r.scenario, Scenario::TunnelQuic | Scenario::TunnelHttp2),
            "{:?}",
            r.scenario
        );
    }
    // The origin gets the same header names on the plain path as through the tunnel.
    let proxy = &report.scenarios[0];
    assert_eq!(proxy.scenario, Scenario::Proxy);
    assert_eq!(proxy.origin_headers, TUNNEL_ORIGIN_HEADERS);
    for r in &report.scenarios[1..] {
        assert_eq!(
            r.origin_headers, proxy.origin_headers,
            "{:?} against proxy",
            r.scenario
        );
    }
    let names: Vec<&str> = report
        .tunnel_overhead
        .iter()
        .map(|o| o.scenario.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "tunnel-quic",
            "tunnel-http2",
            "tunnel-quic-edge",
            "tunnel-http2-edge"
        ]
    );
    assert!(report
        .tunnel_overhead
        .iter()
        .all(|o| o.p50_ratio.is_some_and(|r| r > 0.0)));
    let table = report.render_table();
    assert!(table.contains("tunnel-quic/proxy"), "{table}");
}
