//! Latency and throughput arithmetic: percentiles from an HDR histogram, and the ratios the
//! report prints between scenarios.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies are recorded in microseconds, from 1 µs to 60 s, with 3 significant digits.
pub const LATENCY_MAX_US: u64 = 60_000_000;

/// A fresh latency histogram with the bounds above.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 3)
        .expect("constant bounds satisfy low >= 1, high >= 2 * low, sigfig <= 5")
}

/// Records one latency, clamped into the histogram's range.
pub fn record_latency(hist: &mut Histogram<u64>, latency: Duration) {
    let us = u64::try_from(latency.as_micros()).unwrap_or(LATENCY_MAX_US);
    let _ = hist.record(us.clamp(1, LATENCY_MAX_US));
}

/// What one measured load run produced.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadSummary {
    /// Requests answered with 2xx inside the measurement window.
    pub requests: u64,
    /// Failed requests inside the window: connection errors, timeouts and non-2xx answers.
    pub errors: u64,
    /// Length of the measurement window in seconds.
    pub seconds: f64,
    /// `requests / seconds`.
    pub rps: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    pub mean_us: f64,
}

impl LoadSummary {
    /// Summarises successful-request latencies recorded over a window of `window`.
    pub fn from_histogram(hist: &Histogram<u64>, errors: u64, window: Duration) -> Self {
        let requests = hist.len();
        let seconds = window.as_secs_f64();
        let empty = requests == 0;
        let q = |q: f64| if empty { 0 } else { hist.value_at_quantile(q) };
        Self {
            requests,
            errors,
            seconds,
            rps: if seconds > 0.0 {
                requests as f64 / seconds
            } else {
                0.0
            },
            p50_us: q(0.50),
            p90_us: q(0.90),
            p99_us: q(0.99),
            max_us: if empty { 0 } else { hist.max() },
            mean_us: if empty { 0.0 } else { hist.mean() },
        }
    }
}

/// `value / baseline`, or `None` when the baseline is zero (or either is not finite).
pub fn ratio(value: f64, baseline: f64) -> Option<f64> {
    if baseline == 0.0 || !baseline.is_finite() || !value.is_finite() {
        return None;
    }
    Some(value / baseline)
}

/// One scenario compared with another from the same run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// e.g. `proxy/direct`.
    pub name: String,
    /// Throughput ratio: above 1 means the scenario served more requests per second.
    pub rps: Option<f64>,
    /// Median latency ratio: above 1 means slower.
    pub p50: Option<f64>,
    /// 99th percentile latency ratio: above 1 means slower.
    pub p99: Option<f64>,
    /// Server CPU time per request ratio: above 1 means more CPU per request. Only when
    /// both scenarios have a server process (not `direct`).
    pub cpu_per_request: Option<f64>,
}

impl Comparison {
    /// Compares `value` (named `name`) against `baseline` (named `base`).
    pub fn between(name: &str, value: &LoadSummary, base: &str, baseline: &LoadSummary) -> Self {
        Self {
            name: format!("{name}/{base}"),
            rps: ratio(value.rps, baseline.rps),
            p50: ratio(value.p50_us as f64, baseline.p50_us as f64),
            p99: ratio(value.p99_us as f64, baseline.p99_us as f64),
            cpu_per_request: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: u64, b: u64) -> bool {
        // 3 significant digits: values within 0.1 % of each other are the same bucket.
        a.abs_diff(b) * 1000 <= b
    }

    #[test]
    fn percentiles_come_from_the_recorded_latencies() {
        let mut hist = latency_histogram();
        for ms in 1..=100u64 {
            record_latency(&mut hist, Duration::from_millis(ms));
        }
        let s = LoadSummary::from_histogram(&hist, 3, Duration::from_secs(4));
        assert_eq!(s.requests, 100);
        assert_eq!(s.errors, 3);
        assert_eq!(s.rps, 25.0);
        assert!(close(s.p50_us, 50_000), "p50 {}", s.p50_us);
        assert!(close(s.p90_us, 90_000), "p90 {}", s.p90_us);
        assert!(close(s.p99_us, 99_000), "p99 {}", s.p99_us);
        assert!(close(s.max_us, 100_000), "max {}", s.max_us);
        assert!((s.mean_us - 50_500.0).abs() < 100.0, "mean {}", s.mean_us);
    }

    #[test]
    fn empty_run_has_zero_percentiles_and_no_ratios() {
        let s = LoadSummary::from_histogram(&latency_histogram(), 7, Duration::from_secs(1));
        assert_eq!((s.requests, s.rps, s.p50_us, s.p99_us), (0, 0.0, 0, 0));
        let c = Comparison::between("proxy", &s, "direct", &s);
        assert_eq!((c.rps, c.p50, c.p99), (None, None, None));
    }

    #[test]
    fn latencies_outside_the_range_are_clamped() {
        let mut hist = latency_histogram();
        record_latency(&mut hist, Duration::ZERO);
        record_latency(&mut hist, Duration::from_secs(3600));
        assert_eq!(hist.len(), 2);
        assert_eq!(hist.min(), 1);
        assert!(close(hist.max(), LATENCY_MAX_US));
    }

    #[test]
    fn ratios_divide_by_the_baseline() {
        assert_eq!(ratio(50.0, 100.0), Some(0.5));
        assert_eq!(ratio(3.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
        let summary = |rps: f64, p50_us, p99_us| LoadSummary {
            requests: 1,
            errors: 0,
            seconds: 1.0,
            rps,
            p50_us,
            p90_us: 0,
            p99_us,
            max_us: 0,
            mean_us: 0.0,
        };
        let c = Comparison::between(
            "proxy",
            &summary(8000.0, 300, 900),
            "direct",
            &summary(10000.0, 200, 600),
        );
        assert_eq!(c.name, "proxy/direct");
        assert_eq!(c.rps, Some(0.8));
        assert_eq!(c.p50, Some(1.5));
        assert_eq!(c.p99, Some(1.5));
    }
}
