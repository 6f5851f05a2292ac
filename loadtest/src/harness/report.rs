//! The run's result: per-scenario numbers, ratios between scenarios, as a table or JSON.

use std::fmt::Write as _;

use serde::Serialize;

use super::procfs::Memory;
use super::scenario::Scenario;
use super::stats::ratio;
use super::stats::{Comparison, LoadSummary};

/// The run's settings, echoed in the report so numbers can be compared across runs.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub duration_s: f64,
    pub warmup_s: f64,
    pub connections: usize,
    /// Rounds run; each scenario's numbers are from its median round by req/s.
    pub rounds: usize,
    pub workers: usize,
    pub path: String,
    pub load_cpus: Option<String>,
    pub server_cpus: Option<String>,
    pub echo_cpus: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Ok,
    Skipped,
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Skipped => "skipped",
            Self::Failed => "failed",
        }
    }
}

/// One scenario's result.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    pub scenario: Scenario,
    pub outcome: Outcome,
    /// Why the scenario was skipped or failed.
    pub reason: Option<String>,
    pub load: Option<LoadSummary>,
    /// Memory of the server under test after start-up and one request.
    pub memory_idle: Option<Memory>,
    /// Memory of the server under test right after the load.
    pub memory_after: Option<Memory>,
    /// CPU time of the server under test during the measurement window.
    pub server_cpu: Option<ServerCpu>,
    /// req/s of every measured round, in run order (the reported one is the median).
    pub rounds_rps: Vec<f64>,
}

impl ScenarioReport {
    pub fn new(scenario: Scenario) -> Self {
        Self {
            scenario,
            outcome: Outcome::Failed,
            reason: None,
            load: None,
            memory_idle: None,
            memory_after: None,
            server_cpu: None,
            rounds_rps: Vec::new(),
        }
    }
}

/// CPU used by the server under test while the load ran. Less sensitive to other work on
/// the machine than req/s: it is the cost per request, not the rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ServerCpu {
    /// User + system CPU seconds inside the window (all threads and worker processes).
    pub seconds: f64,
    /// `seconds / window`: 1.0 means one CPU fully busy.
    pub utilisation: f64,
    /// CPU microseconds per successful request; `None` without requests.
    pub us_per_request: Option<f64>,
}

impl ServerCpu {
    pub fn new(cpu: std::time::Duration, window: std::time::Duration, requests: u64) -> Self {
        let seconds = cpu.as_secs_f64();
        Self {
            seconds,
            utilisation: ratio(seconds, window.as_secs_f64()).unwrap_or(0.0),
            us_per_request: ratio(seconds * 1e6, requests as f64),
        }
    }
}

/// Picks a scenario's report from its rounds: the median by req/s among measured rounds
/// (the lower middle one for an even count), or the last round if none was measured.
pub fn median_round(mut rounds: Vec<ScenarioReport>) -> Option<ScenarioReport> {
    let rps = |r: &ScenarioReport| {
        r.load
            .as_ref()
            .filter(|_| r.outcome == Outcome::Ok)
            .map(|l| l.rps)
    };
    let all_rps: Vec<f64> = rounds.iter().filter_map(rps).collect();
    let mut measured: Vec<ScenarioReport> = Vec::new();
    let mut last = None;
    for r in rounds.drain(..) {
        if rps(&r).is_some() {
            measured.push(r);
        } else {
            last = Some(r);
        }
    }
    if measured.is_empty() {
        return last;
    }
    measured.sort_by(|a, b| rps(a).unwrap_or(0.0).total_cmp(&rps(b).unwrap_or(0.0)));
    let mut chosen = measured.swap_remove((measured.len() - 1) / 2);
    chosen.rounds_rps = all_rps;
    Some(chosen)
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub settings: Settings,
    pub scenarios: Vec<ScenarioReport>,
    /// Every measured scenario against `direct`, and every proxying scenario against `nginx`.
    pub comparisons: Vec<Comparison>,
}

/// Scenarios others are compared with, in this order.
const BASELINES: [Scenario; 2] = [Scenario::Direct, Scenario::Nginx];

impl Report {
    pub fn new(settings: Settings, scenarios: Vec<ScenarioReport>) -> Self {
        let measured = |s: Scenario| {
            scenarios
                .iter()
                .find(|r| r.scenario == s && r.outcome == Outcome::Ok)
                .and_then(|r| r.load.as_ref())
        };
        let cpu_per_request = |s: Scenario| {
            scenarios
                .iter()
                .find(|r| r.scenario == s && r.outcome == Outcome::Ok)
                .and_then(|r| r.server_cpu)
                .and_then(|c| c.us_per_request)
        };
        let mut comparisons = Vec::new();
        for base in BASELINES {
            let Some(baseline) = measured(base) else {
                continue;
            };
            for r in &scenarios {
                // direct is never compared with anything; nothing is compared with itself
                if r.scenario == base || r.scenario == Scenario::Direct {
                    continue;
                }
                if let Some(load) = measured(r.scenario) {
                    let mut c = Comparison::between(r.scenario.name(), load, base.name(), baseline);
                    c.cpu_per_request = cpu_per_request(r.scenario)
                        .zip(cpu_per_request(base))
                        .and_then(|(value, baseline)| ratio(value, baseline));
                    comparisons.push(c);
                }
            }
        }
        Self {
            settings,
            scenarios,
            comparisons,
        }
    }

    /// A plain-text table of the scenarios, then the ratios.
    pub fn render_table(&self) -> String {
        let s = &self.settings;
        let mut out = String::new();
        let cpus = |c: &Option<String>| c.clone().unwrap_or_else(|| "any".to_owned());
        let _ = writeln!(
            out,
            "{} connections, {:.1}s measured after {:.1}s warm-up, median of {} round(s), GET {}, {} worker(s); CPUs: load {}, server {}, echo {}",
            s.connections,
            s.duration_s,
            s.warmup_s,
            s.rounds,
            s.path,
            s.workers,
            cpus(&s.load_cpus),
            cpus(&s.server_cpus),
            cpus(&s.echo_cpus),
        );
        let _ = writeln!(
            out,
            "\n{:<10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>14} {:>14}",
            "scenario",
            "req/s",
            "requests",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "errors",
            "RSS idle MiB",
            "RSS/peak MiB"
        );
        for r in &self.scenarios {
            let Some(l) = r.load.as_ref().filter(|_| r.outcome == Outcome::Ok) else {
                let _ = writeln!(
                    out,
                    "{:<10} {}: {}",
                    r.scenario.name(),
                    r.outcome.as_str(),
                    r.reason.as_deref().unwrap_or("")
                );
                continue;
            };
            let mib = |kib: u64| kib as f64 / 1024.0;
            let idle = r
                .memory_idle
                .map_or("-".to_owned(), |m| format!("{:.1}", mib(m.rss_kib)));
            let after = r.memory_after.map_or("-".to_owned(), |m| {
                format!("{:.1}/{:.1}", mib(m.rss_kib), mib(m.hwm_kib))
            });
            let ms = |us: u64| us as f64 / 1000.0;
            let cpu_req = r
                .server_cpu
                .and_then(|c| c.us_per_request)
                .map_or("-".to_owned(), |us| format!("{us:.1}"));
            let cpu_util = r
                .server_cpu
                .map_or("-".to_owned(), |c| format!("{:.2}", c.utilisation));
            let _ = writeln!(
                out,
                "{:<10} {:>10.0} {:>10} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>8} {:>14} {:>14} {:>11} {:>9}",
                r.scenario.name(),
                l.rps,
                l.requests,
                ms(l.p50_us),
                ms(l.p90_us),
                ms(l.p99_us),
                ms(l.max_us),
                l.errors,
                idle,
                after,
                cpu_req,
                cpu_util
            );
        }
        if !self.comparisons.is_empty() {
            let _ = writeln!(
                out,
                "\n{:<16} {:>10} {:>9} {:>9} {:>11}",
                "ratio", "req/s", "p50", "p99", "CPU/req"
            );
            let fmt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.3}"));
            for c in &self.comparisons {
                let _ = writeln!(
                    out,
                    "{:<16} {:>10} {:>9} {:>9} {:>11}",
                    c.name,
                    fmt(c.rps),
                    fmt(c.p50),
                    fmt(c.p99),
                    fmt(c.cpu_per_request)
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
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
}
