use std::time::Duration;

use super::*;

fn measured(scenario: Scenario, rps: f64, p50_us: u64) -> ScenarioReport {
    let mut r = ScenarioReport::new(scenario);
    r.outcome = Outcome::Ok;
    r.load = Some(LoadSummary {
        requests: 100,
        errors: 0,
        seconds: 1.0,
        rps,
        p50_us,
        p90_us: p50_us,
        p99_us: p50_us * 2,
        max_us: p50_us * 3,
        mean_us: p50_us as f64,
        percentiles: Vec::new(),
    });
    r
}

fn with_cpu(mut r: ScenarioReport, us_per_request: f64) -> ScenarioReport {
    r.server_cpu = Some(ServerCpu {
        seconds: 1.0,
        utilisation: 1.0,
        us_per_request: Some(us_per_request),
    });
    r
}

#[test]
fn server_cpu_is_per_request_and_per_window() {
    let cpu = ServerCpu::new(Duration::from_millis(500), Duration::from_secs(2), 10_000);
    assert_eq!(cpu.seconds, 0.5);
    assert_eq!(cpu.utilisation, 0.25);
    assert_eq!(cpu.us_per_request, Some(50.0));
    assert_eq!(
        ServerCpu::new(Duration::ZERO, Duration::from_secs(1), 0).us_per_request,
        None
    );
}

fn settings() -> Settings {
    Settings {
        duration_s: 1.0,
        warmup_s: 0.0,
        connections: 1,
        rate: None,
        rounds: 1,
        workers: 1,
        tunnel_connections: 4,
        path: "/".to_owned(),
        bare_requests: false,
        load_cpus: None,
        server_cpus: None,
        echo_cpus: None,
    }
}

#[test]
fn comparisons_cover_direct_and_nginx_baselines() {
    let report = Report::new(
        settings(),
        vec![
            measured(Scenario::Direct, 1000.0, 100),
            with_cpu(measured(Scenario::Proxy, 500.0, 200), 60.0),
            with_cpu(measured(Scenario::Nginx, 800.0, 150), 40.0),
        ],
    );
    let names: Vec<&str> = report.comparisons.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["proxy/direct", "nginx/direct", "proxy/nginx"]);
    assert_eq!(report.comparisons[0].rps, Some(0.5));
    assert_eq!(report.comparisons[0].p50, Some(2.0));
    assert_eq!(report.comparisons[2].rps, Some(0.625));
    assert_eq!(report.comparisons[2].cpu_per_request, Some(1.5));
    let table = report.render_table();
    assert!(table.contains("proxy/nginx"), "{table}");
}

#[test]
fn the_median_round_by_throughput_or_paced_by_p50_is_reported() {
    let rounds = vec![
        measured(Scenario::Proxy, 900.0, 1),
        measured(Scenario::Proxy, 100.0, 2),
        measured(Scenario::Proxy, 500.0, 3),
    ];
    let chosen = median_round(rounds.clone(), false).expect("one round chosen");
    assert_eq!(chosen.load.as_ref().map(|l| l.rps), Some(500.0));
    assert_eq!(chosen.rounds_rps, [900.0, 100.0, 500.0]);
    assert_eq!(chosen.rounds_p50_us, [1, 2, 3]);
    let paced = median_round(rounds, true).expect("one round chosen");
    assert_eq!(
        paced.load.as_ref().map(|l| (l.rps, l.p50_us)),
        Some((100.0, 2)),
        "paced rounds all serve the offered rate: the median is taken by p50"
    );

    let mut failed = ScenarioReport::new(Scenario::Proxy);
    failed.reason = Some("boom".to_owned());
    let chosen = median_round(
        vec![failed.clone(), measured(Scenario::Proxy, 7.0, 1)],
        false,
    )
    .expect("one round chosen");
    assert_eq!(chosen.outcome, Outcome::Ok);
    let chosen = median_round(vec![failed], true).expect("one round chosen");
    assert_eq!(chosen.outcome, Outcome::Failed);
    assert!(median_round(Vec::new(), false).is_none());
}

#[test]
fn skipped_scenarios_are_not_compared() {
    let mut nginx = ScenarioReport::new(Scenario::Nginx);
    nginx.outcome = Outcome::Skipped;
    nginx.reason = Some("nginx is not installed".to_owned());
    let report = Report::new(
        settings(),
        vec![measured(Scenario::Direct, 1000.0, 100), nginx],
    );
    assert!(report.comparisons.is_empty());
    assert!(report
        .render_table()
        .contains("skipped: nginx is not installed"));
}

#[test]
fn tunnel_scenarios_are_compared_with_proxy_and_their_overhead_reported() {
    let runs = |quic_rps, http2_rps| {
        vec![
            measured(Scenario::Direct, 1000.0, 100),
            with_cpu(measured(Scenario::Proxy, 500.0, 200), 60.0),
            with_cpu(measured(Scenario::TunnelQuic, quic_rps, 250), 90.0),
            with_cpu(measured(Scenario::TunnelHttp2, http2_rps, 300), 75.0),
            with_cpu(measured(Scenario::Nginx, 800.0, 150), 40.0),
        ]
    };
    let closed_loop = Report::new(settings(), runs(400.0, 450.0));
    let verdicts: Vec<Option<bool>> = closed_loop
        .tunnel_overhead
        .iter()
        .map(|o| o.within_target)
        .collect();
    assert_eq!(verdicts, [None, None], "req/s differ by 10-20 %");
    assert!(closed_loop
        .render_table()
        .contains("ratio 1.250 (unequal load, no verdict"));
    let paced = Settings {
        rate: Some(500.0),
        ..settings()
    };
    let short = Report::new(paced.clone(), runs(400.0, 500.0));
    let verdicts: Vec<Option<bool>> = short
        .tunnel_overhead
        .iter()
        .map(|o| o.within_target)
        .collect();
    assert_eq!(
        verdicts,
        [Some(false), Some(false)],
        "QUIC fell short of the offered rate, HTTP/2 is over the p50 target"
    );
    let report = Report::new(paced, runs(500.0, 500.0));
    let names: Vec<&str> = report.comparisons.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "proxy/direct",
            "tunnel-quic/direct",
            "tunnel-http2/direct",
            "nginx/direct",
            "proxy/nginx",
            "tunnel-quic/nginx",
            "tunnel-http2/nginx",
            "tunnel-quic/proxy",
            "tunnel-http2/proxy",
        ]
    );
    let quic = &report.comparisons[7];
    assert_eq!(quic.p50, Some(1.25));
    assert_eq!(quic.cpu_per_request, Some(1.5));
    let overhead: Vec<(&str, i64, Option<bool>)> = report
        .tunnel_overhead
        .iter()
        .map(|o| (o.scenario.as_str(), o.added_p50_us, o.within_target))
        .collect();
    assert_eq!(
        overhead,
        [
            ("tunnel-quic", 50, Some(true)),
            ("tunnel-http2", 100, Some(false))
        ]
    );
    let mut report = report;
    report.scenarios[2].edge_cpu = Some(ServerCpu::new(
        Duration::from_millis(300),
        Duration::from_secs(1),
        10_000,
    ));
    report.scenarios[2].load_cpus_busy = Some(0.914);
    let table = report.render_table();
    let quic_row = table
        .lines()
        .find(|l| l.starts_with("tunnel-quic "))
        .unwrap_or_default();
    assert!(quic_row.ends_with(" 0.91"), "{table}");
    assert!(table.contains("load busy"), "{table}");
    assert!(
        table.contains("tunnel-quic   30.0 us/req, util 0.30"),
        "{table}"
    );
    assert!(table.contains("tunnel-http2/proxy"), "{table}");
    assert!(table.contains("tunnel latency over proxy"), "{table}");
    assert!(table.contains("ratio 1.500 (over target)"), "{table}");
}

#[test]
fn without_a_measured_proxy_there_is_no_tunnel_overhead() {
    let mut proxy = ScenarioReport::new(Scenario::Proxy);
    proxy.reason = Some("boom".to_owned());
    let report = Report::new(
        settings(),
        vec![proxy, measured(Scenario::TunnelQuic, 400.0, 250)],
    );
    assert!(report.tunnel_overhead.is_empty());
    assert!(report.comparisons.is_empty());
    assert!(!report.render_table().contains("tunnel latency over proxy"));
}

#[test]
fn cloudflared_is_compared_with_proxy_and_with_the_tunnel_on_its_path() {
    let paced = Settings {
        rate: Some(500.0),
        ..settings()
    };
    let report = Report::new(
        paced,
        vec![
            with_cpu(measured(Scenario::Proxy, 500.0, 200), 60.0),
            with_cpu(measured(Scenario::TunnelQuicEdge, 500.0, 250), 80.0),
            with_cpu(measured(Scenario::CloudflaredQuicEdge, 500.0, 500), 200.0),
            with_cpu(measured(Scenario::TunnelHttp2Edge, 500.0, 240), 75.0),
            with_cpu(measured(Scenario::CloudflaredHttp2Edge, 500.0, 400), 150.0),
        ],
    );
    let names: Vec<&str> = report.comparisons.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "tunnel-quic-edge/proxy",
            "cloudflared-quic-edge/proxy",
            "tunnel-http2-edge/proxy",
            "cloudflared-http2-edge/proxy",
            "tunnel-quic-edge/cloudflared-quic-edge",
            "tunnel-http2-edge/cloudflared-http2-edge",
        ]
    );
    assert_eq!(report.comparisons[4].p50, Some(0.5));
    assert_eq!(report.comparisons[4].cpu_per_request, Some(0.4));
    assert_eq!(report.comparisons[5].p50, Some(0.6));
    // Only the proxy's own tunnel gets a verdict against the target.
    let judged: Vec<&str> = report
        .tunnel_overhead
        .iter()
        .map(|o| o.scenario.as_str())
        .collect();
    assert_eq!(judged, ["tunnel-quic-edge", "tunnel-http2-edge"]);
    // Long names widen their column: every row of each table is as long as its header.
    let table = report.render_table();
    let lines: Vec<&str> = table.lines().collect();
    let width_of = |header: &str| {
        let start = lines
            .iter()
            .position(|l| l.starts_with(header))
            .unwrap_or_else(|| panic!("{header} in {table}"));
        let rows: Vec<usize> = lines[start..]
            .iter()
            .take_while(|l| !l.is_empty())
            .map(|l| l.len())
            .collect();
        assert!(rows.len() > 1, "{table}");
        assert!(rows.iter().all(|n| *n == rows[0]), "{table}");
    };
    width_of("scenario ");
    width_of("ratio ");
}

#[test]
fn interleaved_rounds_pair_up_in_the_tunnel_overhead() {
    let with_rounds = |mut r: ScenarioReport, rounds: &[u64]| {
        r.rounds_p50_us = rounds.to_vec();
        r
    };
    let paced = Settings {
        rate: Some(500.0),
        rounds: 3,
        ..settings()
    };
    // Median rounds: 200 against 270 (1.35); round by round 1.20, 1.35 and 1.20.
    let report = Report::new(
        paced,
        vec![
            with_rounds(measured(Scenario::Proxy, 500.0, 200), &[250, 200, 150]),
            with_rounds(measured(Scenario::TunnelQuic, 500.0, 270), &[300, 270, 180]),
        ],
    );
    let o = &report.tunnel_overhead[0];
    assert_eq!(o.p50_ratio, Some(1.35));
    assert_eq!(o.rounds_p50_ratio.len(), 3);
    assert!((o.paired_p50_ratio.unwrap_or_default() - 1.2).abs() < 1e-9);
    assert_eq!(o.within_target, Some(true));
    assert!(report
        .render_table()
        .contains("ratio 1.350, paired by round 1.200 (median of 3) (within target)"));
}
