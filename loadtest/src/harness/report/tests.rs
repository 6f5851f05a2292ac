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
        rounds: 1,
        workers: 1,
        path: "/".to_owned(),
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
fn the_median_round_by_throughput_is_reported() {
    let rounds = vec![
        measured(Scenario::Proxy, 900.0, 1),
        measured(Scenario::Proxy, 100.0, 2),
        measured(Scenario::Proxy, 500.0, 3),
    ];
    let chosen = median_round(rounds).expect("one round chosen");
    assert_eq!(chosen.load.as_ref().map(|l| l.rps), Some(500.0));
    assert_eq!(chosen.rounds_rps, [900.0, 100.0, 500.0]);

    let mut failed = ScenarioReport::new(Scenario::Proxy);
    failed.reason = Some("boom".to_owned());
    let chosen = median_round(vec![failed.clone(), measured(Scenario::Proxy, 7.0, 1)])
        .expect("one round chosen");
    assert_eq!(chosen.outcome, Outcome::Ok);
    let chosen = median_round(vec![failed]).expect("one round chosen");
    assert_eq!(chosen.outcome, Outcome::Failed);
    assert!(median_round(Vec::new()).is_none());
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
