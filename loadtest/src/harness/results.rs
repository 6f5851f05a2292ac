//! The results file both drivers write beside their table: the load harness (`cftunnel-loadtest`)
//! and the side-by-side comparison (`cftunnel-loadtest compare`, which drives `wrk`). One
//! schema, so one chart writer ([`super::chart`]) draws either, and runs from different days
//! can be read back and compared.
//!
//! A run is a list of groups (one per load shape, e.g. `wrk -c64` and `wrk -c32`), each a list
//! of series (one per server arrangement) with throughput, a latency percentile curve and,
//! where a baseline was measured in the same group, the ratios against it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::chart;
use super::report::{Outcome, Report};
use super::stats::ratio;

/// The `schema` value of files this version writes; bumped when a field changes meaning.
pub const SCHEMA: &str = "cftunnel-loadtest.results/1";

/// Percentiles every latency curve is sampled at, from the bulk to the far tail.
pub const CURVE_PERCENTILES: [f64; 11] = [
    1.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.99,
];

/// One point of a latency curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentile {
    /// 0 to 100.
    pub percentile: f64,
    pub latency_us: u64,
}

/// A whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// [`SCHEMA`].
    pub schema: String,
    /// What produced the file: `harness` or `compare`.
    pub kind: String,
    /// One line for the chart's heading.
    pub title: String,
    /// When the run finished, RFC 3339 UTC.
    pub generated_at: String,
    /// The command line that produced the run.
    pub command: String,
    pub machine: Machine,
    /// How the load was made and where each process ran, one fact per line.
    pub setup: Vec<String>,
    pub groups: Vec<Group>,
    /// The driver's own full report (the harness's per-scenario memory, CPU and ratios),
    /// kept as it was for anyone who needs more than the common fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
}

/// The machine a run was measured on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_mib: Option<u64>,
    /// `uname -r`.
    pub kernel: String,
    /// `/proc/loadavg`'s 1, 5 and 15 minute averages when the run started: other work on a
    /// shared machine shows here.
    pub load_average: Option<String>,
    /// The source revision (`git describe --always --dirty`), when run from a checkout.
    pub revision: Option<String>,
    /// Version line of each external program used (`wrk`, `nginx`, `haproxy`, ...).
    pub tools: BTreeMap<String, String>,
}

/// Series measured under the same load, comparable with each other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    /// e.g. `wrk -t1 -c64 -d8s`.
    pub name: String,
    /// The series the others' ratios are taken against, when it was measured.
    pub baseline: Option<String>,
    pub series: Vec<Series>,
}

/// One server arrangement under one load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub name: String,
    pub outcome: Outcome,
    /// Why it was skipped or failed.
    pub reason: Option<String>,
    pub measured: Option<Measured>,
}

/// What a measured series produced (its median round).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// Successful requests in the reported round.
    pub requests: u64,
    /// Connection errors, timeouts and non-2xx answers in the reported round.
    pub errors: u64,
    pub seconds: f64,
    pub rps: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    /// The latency curve at [`CURVE_PERCENTILES`].
    pub percentiles: Vec<Percentile>,
    /// Every round's req/s, in run order.
    pub rounds_rps: Vec<f64>,
    /// Every round's p99, in run order.
    pub rounds_p99_us: Vec<u64>,
    /// CPU time of the server under test per successful request.
    pub server_cpu_us_per_request: Option<f64>,
    /// Against the group's baseline; `None` for the baseline itself or without one.
    pub vs_baseline: Option<Ratios>,
}

/// Ratios of a series to its group's baseline: above 1 means more throughput, or slower, or
/// more CPU per request.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Ratios {
    pub rps: Option<f64>,
    pub p99: Option<f64>,
    pub cpu_per_request: Option<f64>,
}

impl Ratios {
    /// `value` against `baseline`.
    pub fn between(value: &Measured, baseline: &Measured) -> Self {
        Self {
            rps: ratio(value.rps, baseline.rps),
            p99: ratio(value.p99_us as f64, baseline.p99_us as f64),
            cpu_per_request: value
                .server_cpu_us_per_request
                .zip(baseline.server_cpu_us_per_request)
                .and_then(|(v, b)| ratio(v, b)),
        }
    }
}

impl Group {
    /// Fills in every measured series' ratios against `baseline`, when it was measured.
    pub fn with_baseline(mut self, baseline: &str) -> Self {
        let base = self
            .series
            .iter()
            .find(|s| s.name == baseline)
            .and_then(|s| s.measured.clone());
        self.baseline = base.as_ref().map(|_| baseline.to_owned());
        for s in &mut self.series {
            if let (Some(m), Some(b)) = (s.measured.as_mut(), base.as_ref()) {
                m.vs_baseline = (s.name != baseline).then(|| Ratios::between(m, b));
            }
        }
        self
    }
}

impl Results {
    /// The harness's report as a results file: one group, a series per scenario, ratios
    /// against `nginx` when it was measured, and the full report in `details`.
    pub fn from_harness(report: &Report, machine: Machine, command: String, at: String) -> Self {
        let s = &report.settings;
        let load = match s.rate {
            Some(r) => format!("{} connections paced at {r:.0} req/s", s.connections),
            None => format!("{} connections, closed loop", s.connections),
        };
        let series = report
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
                        vs_baseline: None,
                    }),
            })
            .collect();
        let cpus = |c: &Option<String>| c.clone().unwrap_or_else(|| "any".to_owned());
        Self {
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
            details: serde_json::to_value(report).ok(),
        }
    }

    /// Writes `<dir>/<stem>.json` and `<dir>/<stem>.svg` (the chart), creating `dir`.
    pub fn write(&self, dir: &Path, stem: &str) -> Result<ReportFiles, WriteError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| WriteError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let json = dir.join(format!("{stem}.json"));
        let svg = dir.join(format!("{stem}.svg"));
        let text = serde_json::to_string_pretty(self).map_err(WriteError::Encode)?;
        std::fs::write(&json, text + "\n").map_err(io(&json))?;
        std::fs::write(&svg, chart::render_svg(self)?).map_err(io(&svg))?;
        Ok(ReportFiles { json, svg })
    }

    /// Reads a results file back, refusing another schema.
    pub fn read(path: &Path) -> Result<Self, ReadError> {
        let text = std::fs::read_to_string(path).map_err(|source| ReadError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let results: Self = serde_json::from_str(&text).map_err(|source| ReadError::Decode {
            path: path.to_path_buf(),
            source,
        })?;
        if results.schema != SCHEMA {
            return Err(ReadError::Schema {
                path: path.to_path_buf(),
                found: results.schema,
            });
        }
        Ok(results)
    }
}

/// Where a report was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportFiles {
    pub json: PathBuf,
    pub svg: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("encoding the results: {0}")]
    Encode(serde_json::Error),
    #[error("drawing the chart: {0}")]
    Chart(#[from] chart::ChartError),
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a results file: {source}")]
    Decode {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: schema {found:?}, expected {SCHEMA:?}")]
    Schema { path: PathBuf, found: String },
}

/// The current time as RFC 3339 UTC to the second, e.g. `2026-10-20T13:40:05Z`.
pub fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc().replace_nanosecond(0);
    now.ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// A file-name stem from a kind and an RFC 3339 time: `compare-20261020T134005Z`.
pub fn file_stem(kind: &str, at: &str) -> String {
    let stamp: String = at.chars().filter(|c| !matches!(c, '-' | ':')).collect();
    format!("{kind}-{stamp}")
}

#[cfg(test)]
mod tests;
