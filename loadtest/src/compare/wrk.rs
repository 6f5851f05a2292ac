//! `wrk` as the load generator of the side-by-side comparison: its command line, a `done`
//! hook that prints the run's totals and latency curve in a form read back exactly, and the
//! parser for its output.
//!
//! The hook defines no `request` or `response` function, so wrk keeps its static request
//! and does not hand answers to Lua: the load is what `wrk -t1 -c64 -d8s --latency` makes
//! without a script. Plain wrk output (no hook lines) is read too, from its `--latency`
//! distribution, at wrk's printed precision.

use std::path::Path;
use std::time::Duration;

use crate::harness::results::Measured;
use crate::harness::stats::{Percentile, CURVE_PERCENTILES};

/// Prefix of every line the hook prints.
const MARK: &str = "cftunnel-loadtest";

/// The Lua `done` hook, sampling the curve at [`CURVE_PERCENTILES`].
pub fn report_script() -> String {
    let points: Vec<String> = CURVE_PERCENTILES.iter().map(|p| format!("{p}")).collect();
    format!(
        r#"-- Written by cftunnel-loadtest compare: prints wrk's totals and latency curve when the
-- run is done. No request or response hook, so the load is as without a script.
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("{MARK} summary requests=%d duration_us=%d connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout))
  io.write(string.format("{MARK} latency min_us=%d max_us=%d\n", latency.min, latency.max))
  for _, p in ipairs({{ {points} }}) do
    io.write(string.format("{MARK} percentile p=%g us=%d\n", p, latency:percentile(p)))
  end
end
"#,
        points = points.join(", ")
    )
}

/// wrk's arguments: `-t<threads> -c<connections> -d<seconds>s --latency [-s script] url`.
pub fn args(
    threads: usize,
    connections: usize,
    duration: Duration,
    script: Option<&Path>,
    url: &str,
) -> Vec<String> {
    let mut args = vec![
        format!("-t{threads}"),
        format!("-c{connections}"),
        format!("-d{}s", duration.as_secs().max(1)),
        "--latency".to_owned(),
    ];
    if let Some(script) = script {
        args.push("-s".to_owned());
        args.push(script.display().to_string());
    }
    args.push(url.to_owned());
    args
}

/// What one wrk run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct WrkRun {
    /// Answers wrk counted as successful (every answer but non-2xx/3xx).
    pub requests: u64,
    /// Connect, read, write and timeout errors plus non-2xx/3xx answers.
    pub errors: u64,
    pub seconds: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    pub percentiles: Vec<Percentile>,
}

impl WrkRun {
    /// Successful requests per second.
    pub fn rps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.requests as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// As a results-file series, with the server's CPU per request (all of it, and in user
    /// space) when it was measured.
    pub fn into_measured(self, server_cpu_us_per_request: Option<(f64, f64)>) -> Measured {
        Measured {
            requests: self.requests,
            errors: self.errors,
            seconds: self.seconds,
            rps: self.rps(),
            p50_us: self.p50_us,
            p99_us: self.p99_us,
            max_us: self.max_us,
            percentiles: self.percentiles,
            rounds_rps: Vec::new(),
            rounds_p99_us: Vec::new(),
            server_cpu_us_per_request: server_cpu_us_per_request.map(|(all, _)| all),
            server_user_us_per_request: server_cpu_us_per_request.map(|(_, user)| user),
            vs_baseline: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("no request count in wrk's output (expected \"N requests in T\")")]
    NoTotals,
    #[error("no latency distribution in wrk's output (run it with --latency)")]
    NoLatency,
    #[error("wrk's output line {line:?}: {why}")]
    Line { line: String, why: &'static str },
}

/// Reads a run from wrk's stdout: the hook's lines when present, else wrk's own summary.
pub fn parse(output: &str) -> Result<WrkRun, ParseError> {
    match parse_hook(output)? {
        Some(run) => Ok(run),
        None => parse_plain(output),
    }
}

/// `key=value` pairs of a hook line.
fn fields(line: &str) -> impl Iterator<Item = (&str, &str)> {
    line.split_whitespace().filter_map(|kv| kv.split_once('='))
}

fn parse_hook(output: &str) -> Result<Option<WrkRun>, ParseError> {
    let bad = |line: &str, why| ParseError::Line {
        line: line.to_owned(),
        why,
    };
    let mut totals = None;
    let mut max_us = None;
    let mut percentiles = Vec::new();
    for line in output.lines() {
        let Some(rest) = line.trim().strip_prefix(MARK) else {
            continue;
        };
        let rest = rest.trim_start();
        if let Some(kv) = rest.strip_prefix("summary ") {
            let get = |key: &str| -> Result<u64, ParseError> {
                fields(kv)
                    .find(|(k, _)| *k == key)
                    .and_then(|(_, v)| v.parse().ok())
                    .ok_or_else(|| bad(line, "a summary field is missing or not a number"))
            };
            let requests = get("requests")?;
            let duration_us = get("duration_us")?;
            let status = get("status")?;
            let socket = get("connect")? + get("read")? + get("write")? + get("timeout")?;
            totals = Some((requests, duration_us, status, socket));
        } else if let Some(kv) = rest.strip_prefix("latency ") {
            max_us = fields(kv)
                .find(|(k, _)| *k == "max_us")
                .and_then(|(_, v)| v.parse::<u64>().ok());
        } else if let Some(kv) = rest.strip_prefix("percentile ") {
            let p = fields(kv)
                .find(|(k, _)| *k == "p")
                .and_then(|(_, v)| v.parse::<f64>().ok());
            let us = fields(kv)
                .find(|(k, _)| *k == "us")
                .and_then(|(_, v)| v.parse::<u64>().ok());
            match p.zip(us) {
                Some((percentile, latency_us)) => percentiles.push(Percentile {
                    percentile,
                    latency_us,
                }),
                None => return Err(bad(line, "expected p=<percentile> us=<latency>")),
            }
        }
    }
    let Some((requests, duration_us, status, socket)) = totals else {
        return Ok(None);
    };
    let at = |q: f64| {
        percentiles
            .iter()
            .find(|p| p.percentile == q)
            .map(|p| p.latency_us)
    };
    let (Some(p50_us), Some(p99_us)) = (at(50.0), at(99.0)) else {
        return Err(ParseError::NoLatency);
    };
    Ok(Some(WrkRun {
        requests: requests.saturating_sub(status),
        errors: status + socket,
        seconds: duration_us as f64 / 1e6,
        p50_us,
        p99_us,
        max_us: max_us.unwrap_or(p99_us),
        percentiles,
    }))
}

/// A wrk time such as `612.00us`, `3.43ms`, `1.02s` or `1.50m`, in microseconds.
pub fn parse_time_us(text: &str) -> Option<f64> {
    let text = text.trim();
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let scale = match unit {
        "us" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        "m" => 60e6,
        "h" => 3600e6,
        _ => return None,
    };
    Some(value * scale)
}

fn parse_plain(output: &str) -> Result<WrkRun, ParseError> {
    let mut totals = None;
    let mut percentiles = Vec::new();
    let mut max_us = None;
    let mut status_errors = 0;
    let mut socket_errors = 0;
    for line in output.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            // `24982 requests in 2.03s, 3.50MB read`
            [n, "requests", "in", time, ..] => {
                let n = n.parse::<u64>().ok();
                let secs = parse_time_us(time.trim_end_matches(',')).map(|us| us / 1e6);
                totals = n.zip(secs);
            }
            // `50%    3.43ms` in the latency distribution
            [p, time] if p.ends_with('%') => {
                if let (Ok(percentile), Some(us)) =
                    (p.trim_end_matches('%').parse::<f64>(), parse_time_us(time))
                {
                    percentiles.push(Percentile {
                        percentile,
                        latency_us: us.round() as u64,
                    });
                }
            }
            // `Latency     4.18ms    3.41ms  17.32ms   76.16%`
            ["Latency", _avg, _stdev, max, ..] => {
                max_us = parse_time_us(max).map(|us| us.round() as u64);
            }
            ["Non-2xx", "or", "3xx", "responses:", n] => {
                status_errors = n.parse().unwrap_or(0);
            }
            // `Socket errors: connect 0, read 12, write 0, timeout 3`
            ["Socket", "errors:", rest @ ..] => {
                socket_errors = rest
                    .iter()
                    .filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok())
                    .sum();
            }
            _ => {}
        }
    }
    let (requests, seconds) = totals.ok_or(ParseError::NoTotals)?;
    let at = |q: f64| {
        percentiles
            .iter()
            .find(|p| p.percentile == q)
            .map(|p| p.latency_us)
    };
    let (Some(p50_us), Some(p99_us)) = (at(50.0), at(99.0)) else {
        return Err(ParseError::NoLatency);
    };
    Ok(WrkRun {
        requests: requests.saturating_sub(status_errors),
        errors: status_errors + socket_errors,
        seconds,
        p50_us,
        p99_us,
        max_us: max_us.unwrap_or(p99_us),
        percentiles,
    })
}

#[cfg(test)]
mod tests;
