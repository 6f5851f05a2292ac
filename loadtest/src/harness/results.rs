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

use super::stats::{ratio, Percentile};

/// The `schema` value of files this version writes; bumped when a field changes meaning.
pub const SCHEMA: &str = "cftunnel-loadtest.results/1";

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

/// How a series (a harness scenario, a compare row) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The latency curve at [`CURVE_PERCENTILES`](super::stats::CURVE_PERCENTILES).
    pub percentiles: Vec<Percentile>,
    /// Every round's req/s, in run order.
    pub rounds_rps: Vec<f64>,
    /// Every round's p99, in run order.
    pub rounds_p99_us: Vec<u64>,
    /// CPU time of the server under test per successful request.
    pub server_cpu_us_per_request: Option<f64>,
    /// Of that, the time in user space; the rest was the kernel's (system calls, the network
    /// stack), which a faster server cannot save.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_user_us_per_request: Option<f64>,
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
