//! Latency and throughput arithmetic: percentiles from an HDR histogram, and the ratios the
//! report prints between scenarios.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

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
    /// The latency curve at [`CURVE_PERCENTILES`]; empty without requests.
    pub percentiles: Vec<Percentile>,
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
            percentiles: if empty {
                Vec::new()
            } else {
                CURVE_PERCENTILES
                    .iter()
                    .map(|&p| Percentile {
                        percentile: p,
                        latency_us: hist.value_at_percentile(p),
                    })
                    .collect()
            },
        }
    }
}

/// A count with thousands separated by commas: `41,230`; rounded to a whole number.
pub fn format_thousands(value: f64) -> String {
    let whole = format!("{:.0}", value.abs());
    let mut out = String::with_capacity(whole.len() + whole.len() / 3 + 1);
    if value < 0.0 && whole != "0" {
        out.push('-');
    }
    for (i, digit) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
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

/// Tunnel p50 over proxy p50 below which the tunnel's added latency is acceptable, at equal
/// load.
pub const TUNNEL_P50_TARGET: f64 = 1.30;

/// How far apart closed-loop throughputs may be for the two runs to count as equal load.
/// Closed-loop connections send as fast as answers come back, so a path with more work per
/// request also gets fewer requests per second, and its median then measures the queue,
/// not the path; paced runs (`--rate`) offer both the same load by construction.
pub const EQUAL_LOAD_TOLERANCE: f64 = 0.05;

/// What a tunnel scenario adds to the median latency of the same proxy without the tunnel,
/// from the same run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TunnelOverhead {
    /// The tunnel scenario, e.g. `tunnel-quic`.
    pub scenario: String,
    pub p50_us: u64,
    pub proxy_p50_us: u64,
    /// `p50_us - proxy_p50_us`; negative when the tunnel run was faster.
    pub added_p50_us: i64,
    /// `p50_us / proxy_p50_us`; `None` when the proxy's p50 is zero.
    pub p50_ratio: Option<f64>,
    /// The bound `p50_ratio` is held to ([`TUNNEL_P50_TARGET`]).
    pub target: f64,
    /// `p50_ratio < target`; `None` without a ratio, or when a closed-loop run did not put
    /// equal load on both paths ([`EQUAL_LOAD_TOLERANCE`]).
    pub within_target: Option<bool>,
    /// Throughput ratio, to judge how equal the load was: closed-loop connections send as
    /// fast as answers come back, so a slower path also gets fewer requests per second.
    pub rps_ratio: Option<f64>,
    /// Per-round p50 ratios, the tunnel's round i over the proxy's round i. Rounds run
    /// interleaved, so each pair was measured seconds apart, under the same state of a shared
    /// machine; empty unless both scenarios have the same number of measured rounds.
    pub rounds_p50_ratio: Vec<f64>,
    /// Median of `rounds_p50_ratio`, from [`MIN_PAIRED_ROUNDS`] rounds on. When present it is
    /// the ratio `within_target` judges: drift between rounds moves both runs of a pair, so it
    /// cancels out of the pair's ratio but not out of a ratio of two separately chosen medians.
    pub paired_p50_ratio: Option<f64>,
}

/// Rounds from which the median of per-round ratios is used for the verdict.
pub const MIN_PAIRED_ROUNDS: usize = 3;

/// The target verdict for a p50 ratio; see [`TunnelOverhead::over_proxy`].
fn verdict(p50_ratio: Option<f64>, rps_ratio: Option<f64>, paced: bool) -> Option<bool> {
    let equal_load = rps_ratio.is_some_and(|r| (r - 1.0).abs() <= EQUAL_LOAD_TOLERANCE);
    let kept_up = rps_ratio.is_some_and(|r| r >= 1.0 - EQUAL_LOAD_TOLERANCE);
    match p50_ratio {
        Some(r) if paced => Some(kept_up && r < TUNNEL_P50_TARGET),
        Some(r) if equal_load => Some(r < TUNNEL_P50_TARGET),
        _ => None,
    }
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

impl TunnelOverhead {
    /// Compares `tunnel` (named `scenario`) with the `proxy` scenario's numbers. `paced`: both
    /// were offered the same request rate. A paced tunnel run that served noticeably fewer
    /// requests than the proxy did not keep up, which misses the target whatever its median
    /// (a connection waiting for a late answer sends late, and that wait is in no latency); a
    /// closed-loop run is judged only when the two rates came out equal.
    pub fn over_proxy(
        scenario: &str,
        tunnel: &LoadSummary,
        proxy: &LoadSummary,
        paced: bool,
    ) -> Self {
        let signed = |us: u64| i64::try_from(us).unwrap_or(i64::MAX);
        let p50_ratio = ratio(tunnel.p50_us as f64, proxy.p50_us as f64);
        let rps_ratio = ratio(tunnel.rps, proxy.rps);
        let within_target = verdict(p50_ratio, rps_ratio, paced);
        Self {
            scenario: scenario.to_owned(),
            p50_us: tunnel.p50_us,
            proxy_p50_us: proxy.p50_us,
            added_p50_us: signed(tunnel.p50_us).saturating_sub(signed(proxy.p50_us)),
            p50_ratio,
            target: TUNNEL_P50_TARGET,
            within_target,
            rps_ratio,
            rounds_p50_ratio: Vec::new(),
            paired_p50_ratio: None,
        }
    }

    /// Adds the per-round ratios from each round's p50 (in round order) and, with
    /// [`MIN_PAIRED_ROUNDS`] or more, judges their median instead of the ratio of the median
    /// rounds. `paced` as in [`over_proxy`](Self::over_proxy).
    pub fn paired_by_round(mut self, tunnel: &[u64], proxy: &[u64], paced: bool) -> Self {
        if tunnel.len() != proxy.len() {
            return self;
        }
        self.rounds_p50_ratio = tunnel
            .iter()
            .zip(proxy)
            .filter_map(|(t, p)| ratio(*t as f64, *p as f64))
            .collect();
        if self.rounds_p50_ratio.len() >= MIN_PAIRED_ROUNDS {
            self.paired_p50_ratio = median(&self.rounds_p50_ratio);
            self.within_target = verdict(self.paired_p50_ratio, self.rps_ratio, paced);
        }
        self
    }

    /// One line for the table report, e.g.
    /// `tunnel-quic   p50 1.200 ms vs proxy 1.000 ms: +0.200 ms, ratio 1.200 (within target), req/s ratio 0.900`.
    pub fn summary_line(&self) -> String {
        let ms = |us: i64| us as f64 / 1000.0;
        let verdict = match (self.within_target, self.p50_ratio) {
            (Some(true), _) => "within target",
            (Some(false), _) => "over target",
            (None, Some(_)) => "unequal load, no verdict: compare with --rate",
            (None, None) => "no ratio",
        };
        let fmt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.3}"));
        let paired = self.paired_p50_ratio.map_or(String::new(), |r| {
            format!(
                ", paired by round {r:.3} (median of {})",
                self.rounds_p50_ratio.len()
            )
        });
        format!(
            "{:<13} p50 {:.3} ms vs proxy {:.3} ms: {:+.3} ms, ratio {}{paired} ({verdict}), req/s ratio {}",
            self.scenario,
            self.p50_us as f64 / 1000.0,
            self.proxy_p50_us as f64 / 1000.0,
            ms(self.added_p50_us),
            fmt(self.p50_ratio),
            fmt(self.rps_ratio),
        )
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
        let curve: Vec<(f64, u64)> = s
            .percentiles
            .iter()
            .map(|p| (p.percentile, p.latency_us))
            .collect();
        assert_eq!(curve.len(), CURVE_PERCENTILES.len());
        assert!(curve.windows(2).all(|w| w[0].1 <= w[1].1), "{curve:?}");
        let at = |q: f64| curve.iter().find(|(p, _)| *p == q).map(|(_, us)| *us);
        assert!(at(50.0).is_some_and(|us| close(us, 50_000)), "{curve:?}");
        assert!(at(10.0).is_some_and(|us| close(us, 10_000)), "{curve:?}");
    }

    #[test]
    fn counts_are_grouped_by_thousands() {
        assert_eq!(format_thousands(0.0), "0");
        assert_eq!(format_thousands(999.4), "999");
        assert_eq!(format_thousands(1000.0), "1,000");
        assert_eq!(format_thousands(41_230.6), "41,231");
        assert_eq!(format_thousands(1_234_567.0), "1,234,567");
        assert_eq!(format_thousands(-12_000.0), "-12,000");
    }

    #[test]
    fn empty_run_has_zero_percentiles_and_no_ratios() {
        let s = LoadSummary::from_histogram(&latency_histogram(), 7, Duration::from_secs(1));
        assert_eq!((s.requests, s.rps, s.p50_us, s.p99_us), (0, 0.0, 0, 0));
        assert!(s.percentiles.is_empty());
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

    fn summary(rps: f64, p50_us: u64) -> LoadSummary {
        LoadSummary {
            requests: 1,
            errors: 0,
            seconds: 1.0,
            rps,
            p50_us,
            p90_us: p50_us,
            p99_us: p50_us,
            max_us: p50_us,
            mean_us: p50_us as f64,
            percentiles: Vec::new(),
        }
    }

    #[test]
    fn tunnel_overhead_is_the_p50_difference_and_ratio_over_proxy() {
        let o = TunnelOverhead::over_proxy(
            "tunnel-quic",
            &summary(9800.0, 1200),
            &summary(10000.0, 1000),
            true,
        );
        assert_eq!(o.scenario, "tunnel-quic");
        assert_eq!(
            (o.p50_us, o.proxy_p50_us, o.added_p50_us),
            (1200, 1000, 200)
        );
        assert_eq!(o.p50_ratio, Some(1.2));
        assert_eq!(o.within_target, Some(true));
        assert_eq!(o.rps_ratio, Some(0.98));
        assert_eq!(o.target, TUNNEL_P50_TARGET);
        assert_eq!(
            o.summary_line(),
            "tunnel-quic   p50 1.200 ms vs proxy 1.000 ms: +0.200 ms, ratio 1.200 (within target), req/s ratio 0.980"
        );
    }

    #[test]
    fn tunnel_overhead_at_or_over_the_target_misses_it() {
        let at = TunnelOverhead::over_proxy(
            "tunnel-http2",
            &summary(1.0, 1300),
            &summary(1.0, 1000),
            true,
        );
        assert_eq!(at.within_target, Some(false), "the bound is strict");
        let over = TunnelOverhead::over_proxy(
            "tunnel-http2",
            &summary(1.0, 2500),
            &summary(1.0, 1000),
            true,
        );
        assert_eq!(
            (over.p50_ratio, over.within_target),
            (Some(2.5), Some(false))
        );
        assert!(
            over.summary_line().contains("(over target)"),
            "{}",
            over.summary_line()
        );
    }

    #[test]
    fn closed_loop_runs_are_judged_only_at_equal_throughput() {
        let unequal = TunnelOverhead::over_proxy(
            "tunnel-quic",
            &summary(6000.0, 1500),
            &summary(10000.0, 1000),
            false,
        );
        assert_eq!(unequal.p50_ratio, Some(1.5));
        assert_eq!(unequal.within_target, None);
        assert!(
            unequal.summary_line().contains("(unequal load, no verdict"),
            "{}",
            unequal.summary_line()
        );
        let equal = TunnelOverhead::over_proxy(
            "tunnel-quic",
            &summary(9600.0, 1500),
            &summary(10000.0, 1000),
            false,
        );
        assert_eq!(equal.within_target, Some(false));
        let paced_short = TunnelOverhead::over_proxy(
            "tunnel-quic",
            &summary(6000.0, 1100),
            &summary(10000.0, 1000),
            true,
        );
        assert_eq!(
            paced_short.within_target,
            Some(false),
            "a paced run that did not keep up misses, whatever its median"
        );
    }

    #[test]
    fn rounds_are_paired_and_their_median_ratio_is_judged() {
        // The median rounds (1,000 and 1,350 us) give 1.35; round by round the tunnel is
        // 1.20, 1.25, 1.10, 1.50 and 1.22 times the proxy.
        let o = TunnelOverhead::over_proxy(
            "tunnel-quic",
            &summary(2000.0, 1350),
            &summary(2000.0, 1000),
            true,
        )
        .paired_by_round(
            &[1200, 1250, 1350, 1500, 1220],
            &[1000, 1000, 1227, 1000, 1000],
            true,
        );
        assert_eq!(o.p50_ratio, Some(1.35));
        assert_eq!(o.rounds_p50_ratio.len(), 5);
        let paired = o.paired_p50_ratio.expect("five rounds");
        assert!((paired - 1.22).abs() < 1e-9, "{paired}");
        assert_eq!(o.within_target, Some(true));
        assert!(
            o.summary_line()
                .contains("ratio 1.350, paired by round 1.220 (median of 5) (within target)"),
            "{}",
            o.summary_line()
        );
        // An even count takes the middle two; a slow paced run still misses.
        let even = TunnelOverhead::over_proxy(
            "tunnel-quic",
            &summary(1800.0, 1000),
            &summary(2000.0, 1000),
            true,
        )
        .paired_by_round(&[1100, 1200, 1300, 1400], &[1000; 4], true);
        assert!((even.paired_p50_ratio.unwrap_or_default() - 1.25).abs() < 1e-9);
        assert_eq!(even.within_target, Some(false), "did not keep up");
        // Too few rounds, or rounds that do not pair up, leave the verdict to the medians.
        let few = TunnelOverhead::over_proxy(
            "tunnel-quic",
            &summary(2000.0, 1400),
            &summary(2000.0, 1000),
            true,
        )
        .paired_by_round(&[1100, 1100], &[1000, 1000], true);
        assert_eq!(
            (few.paired_p50_ratio, few.within_target),
            (None, Some(false))
        );
        assert_eq!(few.rounds_p50_ratio.len(), 2);
        let unpaired = TunnelOverhead::over_proxy(
            "tunnel-quic",
            &summary(2000.0, 1400),
            &summary(2000.0, 1000),
            true,
        )
        .paired_by_round(&[1100, 1100, 1100], &[1000, 1000], true);
        assert!(unpaired.rounds_p50_ratio.is_empty());
        assert_eq!(unpaired.within_target, Some(false));
    }

    #[test]
    fn a_faster_tunnel_run_adds_negative_latency() {
        let o = TunnelOverhead::over_proxy(
            "tunnel-quic",
            &summary(1.0, 900),
            &summary(1.0, 1000),
            true,
        );
        assert_eq!(o.added_p50_us, -100);
        assert!(
            o.summary_line().contains(": -0.100 ms,"),
            "{}",
            o.summary_line()
        );
        assert_eq!(o.p50_ratio, Some(0.9));
        assert_eq!(o.within_target, Some(true));
    }

    #[test]
    fn tunnel_overhead_without_a_proxy_p50_has_no_ratio() {
        let o =
            TunnelOverhead::over_proxy("tunnel-quic", &summary(1.0, 900), &summary(0.0, 0), true);
        assert_eq!(o.added_p50_us, 900);
        assert_eq!(
            (o.p50_ratio, o.within_target, o.rps_ratio),
            (None, None, None)
        );
        let huge = TunnelOverhead::over_proxy(
            "tunnel-quic",
            &summary(1.0, 0),
            &summary(1.0, u64::MAX),
            true,
        );
        assert_eq!(huge.added_p50_us, -i64::MAX);
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
            percentiles: Vec::new(),
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
