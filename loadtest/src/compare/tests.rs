use super::*;
use crate::harness::stats::Percentile;

#[test]
fn rounds_rotate_the_row_order_and_cover_every_connection_count() {
    let rows = [Row::Direct, Row::CftunnelProxy, Row::Nginx, Row::Haproxy];
    let steps = plan(&rows, &[64, 32], 3);
    assert_eq!(steps.len(), 3 * 2 * 4);
    let order = |round: usize, c: usize| -> Vec<Row> {
        steps
            .iter()
            .filter(|s| s.round == round && s.connections == c)
            .map(|s| s.row)
            .collect()
    };
    assert_eq!(order(1, 64), rows);
    assert_eq!(
        order(2, 64),
        [Row::CftunnelProxy, Row::Nginx, Row::Haproxy, Row::Direct]
    );
    assert_eq!(
        order(3, 32),
        [Row::Nginx, Row::Haproxy, Row::Direct, Row::CftunnelProxy]
    );
    // Within a round, all of -c64 before -c32.
    let first_round: Vec<usize> = steps
        .iter()
        .filter(|s| s.round == 1)
        .map(|s| s.connections)
        .collect();
    assert_eq!(first_round, [64, 64, 64, 64, 32, 32, 32, 32]);
}

fn config() -> CompareConfig {
    CompareConfig {
        rows: DEFAULT_ROWS.to_vec(),
        rounds: 3,
        duration: Duration::from_secs(8),
        connections: vec![64, 32],
        threads: 1,
        warmup: Duration::ZERO,
        load_cpus: Some("0".parse().expect("cpu list")),
        server_cpus: Some("1".parse().expect("cpu list")),
        tunnel: Transport::Quic,
        tunnel_connections: 4,
        programs: Programs {
            wrk: Some("/usr/bin/wrk".into()),
            ..Programs::default()
        },
        keep_scratch: false,
    }
}

#[test]
fn the_wrk_command_is_pinned_to_the_load_cpu() {
    let cfg = config();
    assert_eq!(
        wrk_command(&cfg, 64, Path::new("/tmp/r.lua"), "http://127.0.0.1:9/"),
        "taskset -c 0 /usr/bin/wrk -t1 -c64 -d8s --latency -s /tmp/r.lua http://127.0.0.1:9/"
    );
    assert_eq!(group_name(&cfg, 32), "wrk -t1 -c32 -d8s");
}

fn round(rps_requests: u64, p99_us: u64, cpu: Option<f64>) -> Result<RoundResult, String> {
    Ok(RoundResult {
        run: wrk::WrkRun {
            requests: rps_requests,
            errors: 0,
            seconds: 1.0,
            p50_us: p99_us / 2,
            p99_us,
            max_us: p99_us * 2,
            percentiles: vec![
                Percentile {
                    percentile: 50.0,
                    latency_us: p99_us / 2,
                },
                Percentile {
                    percentile: 99.0,
                    latency_us: p99_us,
                },
            ],
        },
        cpu_us_per_request: cpu.map(|all| (all, all * 0.3)),
    })
}

fn running() -> RowState {
    RowState::Running(Box::new(Target {
        addr: "127.0.0.1:1".parse().expect("addr"),
        host: String::new(),
        server: None,
        helpers: Vec::new(),
        edge: None,
    }))
}

fn step(round: usize, row: Row) -> Step {
    Step {
        round,
        connections: 64,
        row,
    }
}

#[test]
fn each_row_reports_its_median_round_with_every_round_kept() {
    let measured = vec![
        (step(1, Row::Nginx), round(40_000, 2000, Some(25.0))),
        (step(2, Row::Nginx), round(38_000, 2400, Some(26.0))),
        (step(3, Row::Nginx), round(42_000, 1800, Some(24.0))),
        (step(1, Row::Haproxy), round(30_000, 3000, Some(30.0))),
        (step(2, Row::Haproxy), Err("wrk exited".to_owned())),
        (step(3, Row::Haproxy), round(32_000, 3200, Some(31.0))),
    ];
    let nginx = series(Row::Nginx, &running(), 64, &measured);
    let m = nginx.measured.as_ref().expect("measured");
    assert_eq!(
        (m.rps, m.p99_us),
        (40_000.0, 2000),
        "the middle round by req/s"
    );
    assert_eq!(m.rounds_rps, [40_000.0, 38_000.0, 42_000.0]);
    assert_eq!(m.rounds_p99_us, [2000, 2400, 1800]);
    assert_eq!(m.server_cpu_us_per_request, Some(25.0));
    assert_eq!(m.server_user_us_per_request, Some(25.0 * 0.3));
    let haproxy = series(Row::Haproxy, &running(), 64, &measured);
    assert_eq!(haproxy.outcome, Outcome::Ok);
    assert_eq!(haproxy.reason.as_deref(), Some("1 of 3 rounds failed"));
    assert_eq!(
        haproxy.measured.as_ref().map(|m| m.rps),
        Some(30_000.0),
        "the lower middle of two"
    );
    let skipped = series(
        Row::TunnelCloudflared,
        &RowState::Skipped("set CLOUDFLARED".to_owned()),
        64,
        &measured,
    );
    assert_eq!(skipped.outcome, Outcome::Skipped);
    assert!(skipped.measured.is_none());
    let none = series(Row::Direct, &running(), 64, &measured);
    assert_eq!(none.outcome, Outcome::Failed);
}

#[test]
fn the_table_gives_ratios_against_nginx_and_names_skipped_rows() {
    let measured = vec![
        (step(1, Row::CftunnelProxy), round(44_000, 1500, Some(20.0))),
        (step(1, Row::Nginx), round(40_000, 2000, Some(25.0))),
        (
            step(1, Row::TunnelConnector),
            round(20_000, 4000, Some(40.0)),
        ),
        (
            step(1, Row::TunnelCloudflared),
            round(10_000, 8000, Some(100.0)),
        ),
    ];
    let rows = [
        Row::CftunnelProxy,
        Row::Nginx,
        Row::TunnelConnector,
        Row::TunnelCloudflared,
    ];
    let group = Group {
        name: "wrk -t1 -c64 -d8s".to_owned(),
        baseline: None,
        series: rows
            .iter()
            .map(|&r| series(r, &running(), 64, &measured))
            .chain(std::iter::once(series(
                Row::Haproxy,
                &RowState::Skipped("haproxy is not installed".to_owned()),
                64,
                &measured,
            )))
            .collect(),
    }
    .with_baseline("nginx");
    let results = Results {
        schema: SCHEMA.to_owned(),
        kind: "compare".to_owned(),
        title: "t".to_owned(),
        generated_at: "2026-01-01T00:00:00Z".to_owned(),
        command: "c".to_owned(),
        machine: Machine::default(),
        setup: Vec::new(),
        groups: vec![group],
        details: None,
    };
    let table = render_table(&results);
    assert!(
        table.contains("| wrk -t1 -c64 -d8s | cftunnel-proxy | 44,000 | 0.750 | 1.500 | 0 | 20.0 (6.0 user) | 1.10 | 0.75 | 0.80 | 44,000 |"),
        "{table}"
    );
    assert!(
        table.contains("| wrk -t1 -c64 -d8s | nginx | 40,000 | 1.000 | 2.000 | 0 | 25.0 (7.5 user) | 1.00 | 1.00 | 1.00 |"),
        "{table}"
    );
    assert!(
        table.contains("| haproxy | skipped: haproxy is not installed |"),
        "{table}"
    );
    assert!(
        table.contains(
            "tunnel cftunnel-proxy / cloudflared: req/s 2.00, p99 0.50, CPU per request 0.40"
        ),
        "{table}"
    );
}
