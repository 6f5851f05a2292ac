//! The run's result: per-scenario numbers, ratios between scenarios, as a table or JSON.

use std::fmt::Write as _;

use serde::Serialize;

use super::procfs::Memory;
use super::results::{Group, Machine, Measured, Outcome, Results, Series, SCHEMA};
use super::scenario::Scenario;
use super::stats::ratio;
use super::stats::{Comparison, LoadSummary, TunnelOverhead, TUNNEL_P50_TARGET};

/// The run's settings, echoed in the report so numbers can be compared across runs.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub duration_s: f64,
    pub warmup_s: f64,
    pub connections: usize,
    /// Offered req/s when the load was paced; `None`: closed loop.
    pub rate: Option<f64>,
    /// Rounds run; each scenario's numbers are from its median round: by req/s in a closed
    /// loop, by p50 when paced (every paced round serves the offered rate, so req/s would
    /// pick one at random).
    pub rounds: usize,
    pub workers: usize,
    /// HA tunnel connections in the tunnel scenarios.
    pub tunnel_connections: usize,
    pub path: String,
    /// The plain paths got only `Host`, not the headers a tunnel path adds.
    pub bare_requests: bool,
    pub load_cpus: Option<String>,
    pub server_cpus: Option<String>,
    pub echo_cpus: Option<String>,
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
    /// CPU time of the mock edge (tunnel scenarios) during the measurement window; it runs on
    /// the load CPUs and is not part of `server_cpu`.
    pub edge_cpu: Option<ServerCpu>,
    /// Busy fraction of the load CPUs during the measurement window (all processes on them;
    /// 1.0 = all busy); `None` when the load is not pinned.
    pub load_cpus_busy: Option<f64>,
    /// req/s of every measured round, in run order.
    pub rounds_rps: Vec<f64>,
    /// p50 of every measured round, in run order.
    pub rounds_p50_us: Vec<u64>,
    /// Header names the echo backend got with the first request (lower case, sorted): the
    /// same on the plain and tunnel paths unless the run sent bare requests.
    pub origin_headers: Vec<String>,
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
            edge_cpu: None,
            load_cpus_busy: None,
            rounds_rps: Vec::new(),
            rounds_p50_us: Vec::new(),
            origin_headers: Vec::new(),
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

/// Picks a scenario's report from its rounds: the median among measured rounds (the lower
/// middle one for an even count) by req/s, or by p50 when `paced`; the last round if none was
/// measured.
pub fn median_round(mut rounds: Vec<ScenarioReport>, paced: bool) -> Option<ScenarioReport> {
    let load = |r: &ScenarioReport| r.load.clone().filter(|_| r.outcome == Outcome::Ok);
    let loads: Vec<LoadSummary> = rounds.iter().filter_map(load).collect();
    let key = |l: &LoadSummary| if paced { l.p50_us as f64 } else { l.rps };
    let mut measured: Vec<(f64, ScenarioReport)> = Vec::new();
    let mut last = None;
    for r in rounds.drain(..) {
        match load(&r) {
            Some(l) => measured.push((key(&l), r)),
            None => last = Some(r),
        }
    }
    if measured.is_empty() {
        return last;
    }
    measured.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (_, mut chosen) = measured.swap_remove((measured.len() - 1) / 2);
    chosen.rounds_rps = loads.iter().map(|l| l.rps).collect();
    chosen.rounds_p50_us = loads.iter().map(|l| l.p50_us).collect();
    Some(chosen)
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub settings: Settings,
    pub scenarios: Vec<ScenarioReport>,
    /// Every measured scenario against `direct`, every proxying scenario against `nginx`,
    /// and every tunnel scenario against `proxy`.
    pub comparisons: Vec<Comparison>,
    /// Median latency each measured tunnel scenario adds over `proxy`.
    pub tunnel_overhead: Vec<TunnelOverhead>,
}

/// Scenarios others are compared with, in this order.
const BASELINES: [Scenario; 5] = [
    Scenario::Direct,
    Scenario::Nginx,
    Scenario::Proxy,
    Scenario::CloudflaredQuicEdge,
    Scenario::CloudflaredHttp2Edge,
];

/// Whether `scenario` is compared with `base`: `direct` is never compared with anything,
/// nothing with itself, only the tunnel and `cloudflared` scenarios with `proxy` (the same
/// path without a tunnel), and a `cloudflared` scenario only with the proxy's tunnel
/// scenario on the same path and transport.
fn compared(scenario: Scenario, base: Scenario) -> bool {
    if scenario == base || scenario == Scenario::Direct {
        return false;
    }
    if base.is_cloudflared() {
        return scenario.cloudflared_counterpart() == Some(base);
    }
    base != Scenario::Proxy || scenario.is_tunnel() || scenario.is_cloudflared()
}

impl Report {
    /// The report as a results file: one group, a series per scenario, ratios
    /// against `nginx` when it was measured, and the full report in `details`.
    pub fn results(&self, machine: Machine, command: String, at: String) -> Results {
        let s = &self.settings;
        let load = match s.rate {
            Some(r) => format!("{} connections paced at {r:.0} req/s", s.connections),
            None => format!("{} connections, closed loop", s.connections),
        };
        let series = self
            .scenarios
            .iter()
            .map(|r| Series {
                name: r.scenario.name().to_owned(),
                outcome: r.outcome,
                reason: r.reason.clone(),
                measured: r
                    .load
                    .as_ref()
                    .filter(|_| r.outcome == Outcome::Ok)
                    .map(|l| Measured {
                        requests: l.requests,
                        errors: l.errors,
                        seconds: l.seconds,
                        rps: l.rps,
                        p50_us: l.p50_us,
                        p99_us: l.p99_us,
                        max_us: l.max_us,
                        percentiles: l.percentiles.clone(),
                        rounds_rps: r.rounds_rps.clone(),
                        rounds_p99_us: Vec::new(),
                        server_cpu_us_per_request: r.server_cpu.and_then(|c| c.us_per_request),
                        server_user_us_per_request: None,
                        vs_baseline: None,
                    }),
            })
            .collect();
        let cpus = |c: &Option<String>| c.clone().unwrap_or_else(|| "any".to_owned());
        Results {
            schema: SCHEMA.to_owned(),
            kind: "harness".to_owned(),
            title: format!("cftunnel-loadtest: {load}"),
            generated_at: at,
            command,
            machine,
            setup: vec![
                format!(
                    "load: the harness's HTTP/1.1 client, {load}, GET {}, {:.1} s measured after {:.1} s warm-up, median of {} round(s)",
                    s.path, s.duration_s, s.warmup_s, s.rounds
                ),
                format!(
                    "CPUs: load {}, server under test {}, echo backend {}; {} worker(s)",
                    cpus(&s.load_cpus),
                    cpus(&s.server_cpus),
                    cpus(&s.echo_cpus),
                    s.workers
                ),
            ],
            groups: vec![Group {
                name: load,
                baseline: None,
                series,
            }
            .with_baseline("nginx")],
            details: serde_json::to_value(self).ok(),
        }
    }

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
                if !compared(r.scenario, base) {
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
        let rounds_p50 = |s: Scenario| {
            scenarios
                .iter()
                .find(|r| r.scenario == s && r.outcome == Outcome::Ok)
                .map_or(&[][..], |r| r.rounds_p50_us.as_slice())
        };
        let paced = settings.rate.is_some();
        let tunnel_overhead = measured(Scenario::Proxy)
            .map(|proxy| {
                scenarios
                    .iter()
                    .filter(|r| r.scenario.is_tunnel())
                    .filter_map(|r| {
                        measured(r.scenario).map(|t| {
                            TunnelOverhead::over_proxy(r.scenario.name(), t, proxy, paced)
                                .paired_by_round(
                                    rounds_p50(r.scenario),
                                    rounds_p50(Scenario::Proxy),
                                    paced,
                                )
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            settings,
            scenarios,
            comparisons,
            tunnel_overhead,
        }
    }

    /// A plain-text table of the scenarios, then the ratios.
    pub fn render_table(&self) -> String {
        let s = &self.settings;
        let mut out = String::new();
        let cpus = |c: &Option<String>| c.clone().unwrap_or_else(|| "any".to_owned());
        let _ = writeln!(
            out,
            "{} connections{}, {:.1}s measured after {:.1}s warm-up, median of {} round(s), GET {} ({}), {} worker(s); CPUs: load {}, server {}, echo {}",
            s.connections,
            s.rate
                .map_or(String::new(), |r| format!(" paced at {r:.0} req/s")),
            s.duration_s,
            s.warmup_s,
            s.rounds,
            s.path,
            if s.bare_requests {
                "Host only on every path"
            } else {
                "the tunnel's headers on every path"
            },
            s.workers,
            cpus(&s.load_cpus),
            cpus(&s.server_cpus),
            cpus(&s.echo_cpus),
        );
        // Name columns as wide as the longest name, so the numbers line up.
        let w = self
            .scenarios
            .iter()
            .map(|r| r.scenario.name().len())
            .max()
            .unwrap_or(0)
            .max(13);
        let _ = writeln!(
            out,
            "\n{:<w$} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>14} {:>14} {:>11} {:>9} {:>10}",
            "scenario",
            "req/s",
            "requests",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "errors",
            "RSS idle MiB",
            "RSS/peak MiB",
            "CPU us/req",
            "CPU util",
            "load busy"
        );
        for r in &self.scenarios {
            let Some(l) = r.load.as_ref().filter(|_| r.outcome == Outcome::Ok) else {
                let _ = writeln!(
                    out,
                    "{:<w$} {}: {}",
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
            let load_busy = r
                .load_cpus_busy
                .map_or("-".to_owned(), |b| format!("{b:.2}"));
            let _ = writeln!(
                out,
                "{:<w$} {:>10.0} {:>10} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>8} {:>14} {:>14} {:>11} {:>9} {:>10}",
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
                cpu_util,
                load_busy
            );
        }
        if !self.comparisons.is_empty() {
            let rw = self
                .comparisons
                .iter()
                .map(|c| c.name.len())
                .max()
                .unwrap_or(0)
                .max(20);
            let _ = writeln!(
                out,
                "\n{:<rw$} {:>10} {:>9} {:>9} {:>11}",
                "ratio", "req/s", "p50", "p99", "CPU/req"
            );
            let fmt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.3}"));
            for c in &self.comparisons {
                let _ = writeln!(
                    out,
                    "{:<rw$} {:>10} {:>9} {:>9} {:>11}",
                    c.name,
                    fmt(c.rps),
                    fmt(c.p50),
                    fmt(c.p99),
                    fmt(c.cpu_per_request)
                );
            }
        }
        if !self.tunnel_overhead.is_empty() {
            let _ = writeln!(
                out,
                "\ntunnel latency over proxy (p50 ratio target < {TUNNEL_P50_TARGET:.2} at equal load: {})",
                s.rate.map_or("closed loop, judged only where req/s came out equal".to_owned(), |r| format!("{r:.0} req/s offered"))
            );
            for o in &self.tunnel_overhead {
                let _ = writeln!(out, "{}", o.summary_line());
            }
        }
        let edges: Vec<_> = self
            .scenarios
            .iter()
            .filter(|r| r.outcome == Outcome::Ok)
            .filter_map(|r| r.edge_cpu.map(|c| (r.scenario, c)))
            .collect();
        if !edges.is_empty() {
            let _ = writeln!(
                out,
                "\nmock edge CPU (on the load CPUs, not in the proxy's CPU/req)"
            );
            for (scenario, cpu) in edges {
                let us = cpu
                    .us_per_request
                    .map_or("-".to_owned(), |us| format!("{us:.1}"));
                let _ = writeln!(
                    out,
                    "{:<w$} {us} us/req, util {:.2}",
                    scenario.name(),
                    cpu.utilisation
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
