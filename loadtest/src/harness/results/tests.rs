use std::collections::BTreeMap;

use super::*;
use crate::harness::chart;
use crate::harness::report_files;
use crate::harness::stats::{Percentile, CURVE_PERCENTILES};

fn curve(scale: u64) -> Vec<Percentile> {
    CURVE_PERCENTILES
        .iter()
        .enumerate()
        .map(|(i, &p)| Percentile {
            percentile: p,
            latency_us: scale * (i as u64 + 1),
        })
        .collect()
}

fn measured(rps: f64, p99_us: u64, cpu: f64) -> Measured {
    Measured {
        requests: 320_000,
        errors: 0,
        seconds: 8.0,
        rps,
        p50_us: p99_us / 4,
        p99_us,
        max_us: p99_us * 2,
        percentiles: curve(p99_us / 8),
        rounds_rps: vec![rps, rps * 0.5, rps * 1.5],
        rounds_p99_us: vec![p99_us, p99_us + 250, p99_us.saturating_sub(250)],
        server_cpu_us_per_request: Some(cpu),
        server_user_us_per_request: Some(cpu / 4.0),
        vs_baseline: None,
    }
}

fn ok(name: &str, m: Measured) -> Series {
    Series {
        name: name.to_owned(),
        outcome: Outcome::Ok,
        reason: None,
        measured: Some(m),
    }
}

/// A comparison-shaped file: two groups, a skipped row, ratios against nginx.
fn sample() -> Results {
    let group = |name: &str, scale: f64| {
        Group {
            name: name.to_owned(),
            baseline: None,
            series: vec![
                ok("direct", measured(50_000.0 * scale, 1_000, 0.0)),
                ok("cftunnel-proxy", measured(40_000.0 * scale, 2_000, 25.0)),
                ok("nginx", measured(32_000.0 * scale, 2_500, 20.0)),
                Series {
                    name: "haproxy".to_owned(),
                    outcome: Outcome::Skipped,
                    reason: Some(
                        "haproxy is not installed (apt-get install -y haproxy)".to_owned(),
                    ),
                    measured: None,
                },
            ],
        }
        .with_baseline("nginx")
    };
    Results {
        schema: SCHEMA.to_owned(),
        kind: "compare".to_owned(),
        title: "Side by side & <escaped>".to_owned(),
        generated_at: "2026-10-20T13:40:05Z".to_owned(),
        command: "loadtest/compare.sh --rounds 3".to_owned(),
        machine: Machine {
            cpu_model: "AMD EPYC".to_owned(),
            cpus: 2,
            memory_mib: Some(24_014),
            kernel: "6.18.44".to_owned(),
            load_average: Some("0.50 0.40 0.30".to_owned()),
            revision: Some("abc1234567".to_owned()),
            tools: BTreeMap::from([("wrk".to_owned(), "wrk 4.1.0".to_owned())]),
        },
        setup: vec!["load: taskset -c 0 wrk -t1 -c<N> -d8s --latency".to_owned()],
        groups: vec![
            group("wrk -t1 -c64 -d8s", 1.0),
            group("wrk -t1 -c32 -d8s", 0.5),
        ],
        details: Some(serde_json::json!({"anything": [1, 2]})),
    }
}

#[test]
fn ratios_are_taken_against_the_baseline_of_each_group() {
    let r = sample();
    let g = &r.groups[0];
    assert_eq!(g.baseline.as_deref(), Some("nginx"));
    let vs = |name: &str| {
        g.series
            .iter()
            .find(|s| s.name == name)
            .and_then(|s| s.measured.as_ref())
            .and_then(|m| m.vs_baseline)
    };
    let proxy = vs("cftunnel-proxy").expect("ratios");
    assert_eq!(proxy.rps, Some(1.25));
    assert_eq!(proxy.p99, Some(0.8));
    assert_eq!(proxy.cpu_per_request, Some(1.25));
    assert_eq!(vs("nginx"), None, "the baseline has no ratio to itself");
    // Without the baseline measured, nothing is compared.
    let alone = Group {
        name: "g".to_owned(),
        baseline: None,
        series: vec![ok("direct", measured(1.0, 1, 1.0))],
    }
    .with_baseline("nginx");
    assert_eq!(alone.baseline, None);
    assert_eq!(
        alone.series[0]
            .measured
            .as_ref()
            .and_then(|m| m.vs_baseline),
        None
    );
}

#[test]
fn a_written_results_file_reads_back_equal() {
    let dir = std::env::temp_dir().join(format!("cftunnel-results-{}", std::process::id()));
    let results = sample();
    let files = report_files::write(&results, &dir, "compare-20261020T134005Z").expect("written");
    assert_eq!(files.json, dir.join("compare-20261020T134005Z.json"));
    let back = Results::read(&files.json).expect("read back");
    assert_eq!(back, results);
    // The schema is checked, and a file of another shape is refused with its path.
    let mut other = serde_json::to_value(&results).expect("encodes");
    other["schema"] = "something-else/9".into();
    std::fs::write(&files.json, other.to_string()).expect("write");
    let err = Results::read(&files.json).expect_err("another schema");
    assert!(err.to_string().contains("something-else/9"), "{err}");
    std::fs::write(&files.json, "{\"schema\": 1}").expect("write");
    assert!(matches!(
        Results::read(&files.json),
        Err(ReadError::Decode { .. })
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_json_names_its_fields_as_documented() {
    let value = serde_json::to_value(sample()).expect("encodes");
    assert_eq!(value["schema"], SCHEMA);
    let proxy = &value["groups"][0]["series"][1];
    assert_eq!(proxy["name"], "cftunnel-proxy");
    assert_eq!(proxy["outcome"], "ok");
    assert_eq!(proxy["measured"]["rps"], 40_000.0);
    assert_eq!(proxy["measured"]["vs_baseline"]["rps"], 1.25);
    assert_eq!(proxy["measured"]["percentiles"][3]["percentile"], 50.0);
    assert_eq!(value["groups"][0]["series"][3]["outcome"], "skipped");
    assert_eq!(value["machine"]["tools"]["wrk"], "wrk 4.1.0");
}

/// Every `<text>` of an SVG document, in order.
fn texts(doc: &roxmltree::Document<'_>) -> Vec<String> {
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_owned())
        .collect()
}

#[test]
fn the_chart_is_well_formed_svg_with_a_curve_and_a_bar_per_series() {
    let results = sample();
    let svg = chart::render_svg(&results).expect("drawn");
    let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
    let root = doc.root_element();
    assert!(root.has_tag_name("svg"));
    assert_eq!(root.attribute("width"), Some("1280"));
    let texts = texts(&doc);
    let has = |needle: &str| texts.iter().any(|t| t.contains(needle));
    // Heading: title (escaped), machine, command.
    assert!(has("Side by side & <escaped>"), "{texts:?}");
    assert!(has("AMD EPYC, 2 CPUs"), "{texts:?}");
    assert!(has("$ loadtest/compare.sh --rounds 3"), "{texts:?}");
    for group in ["wrk -t1 -c64 -d8s", "wrk -t1 -c32 -d8s"] {
        assert!(has(&format!("{group}: latency by percentile")), "{texts:?}");
    }
    // Each measured series: a legend entry with p50 and p99, a throughput label with the
    // ratio to nginx; the skipped one says why.
    assert!(
        has("cftunnel-proxy  p50 0.500 ms  p99 2.00 ms"),
        "{texts:?}"
    );
    assert!(has("cftunnel-proxy  40,000 (1.25× nginx)"), "{texts:?}");
    assert!(has("cftunnel-proxy  20,000 (1.25× nginx)"), "{texts:?}");
    assert!(has("nginx  32,000"), "{texts:?}");
    assert!(
        has("haproxy: skipped (haproxy is not installed"),
        "{texts:?}"
    );
    // The percentile axis reads in nines.
    assert!(has("99.9%"), "{texts:?}");
    // One curve per measured series per group (legend swatches are lines too), and a bar
    // per measured series.
    let curves = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .filter(|n| {
            n.attribute("points")
                .is_some_and(|p| p.split_whitespace().count() == CURVE_PERCENTILES.len())
        })
        .count();
    assert_eq!(curves, 3 * 2, "three measured series in two groups");
    let rects = doc.descendants().filter(|n| n.has_tag_name("rect")).count();
    assert!(
        rects >= 3 * 2 * 2,
        "a filled and an outlined bar per measured series: {rects}"
    );
    // Each group's legend lies under its curves and above the next group's: no curve's
    // tail is hidden behind it.
    let curve_ys: Vec<(f64, f64)> = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .filter_map(|n| n.attribute("points"))
        .filter(|p| p.split_whitespace().count() == CURVE_PERCENTILES.len())
        .map(|p| {
            let ys = p
                .split_whitespace()
                .filter_map(|xy| xy.split(',').nth(1)?.parse::<f64>().ok());
            ys.fold((f64::INFINITY, 0f64), |(lo, hi), y| (lo.min(y), hi.max(y)))
        })
        .collect();
    let legend_ys: Vec<f64> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter(|n| n.text().is_some_and(|t| t.contains("  p50 ")))
        .filter_map(|n| n.attribute("y")?.parse().ok())
        .collect();
    assert_eq!((curve_ys.len(), legend_ys.len()), (6, 6));
    let lowest = |curves: &[(f64, f64)]| curves.iter().map(|c| c.1).fold(0f64, f64::max);
    let highest = |curves: &[(f64, f64)]| curves.iter().map(|c| c.0).fold(f64::INFINITY, f64::min);
    for y in &legend_ys[..3] {
        assert!(
            *y > lowest(&curve_ys[..3]) && *y < highest(&curve_ys[3..]),
            "{y} {curve_ys:?}"
        );
    }
    for y in &legend_ys[3..] {
        assert!(*y > lowest(&curve_ys[3..]), "{y} {curve_ys:?}");
    }
}

#[test]
fn a_run_with_nothing_measured_still_draws() {
    let mut results = sample();
    for g in &mut results.groups {
        for s in &mut g.series {
            s.measured = None;
            s.outcome = Outcome::Failed;
        }
    }
    let svg = chart::render_svg(&results).expect("drawn");
    let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
    let texts = texts(&doc);
    assert!(texts.iter().any(|t| t == "nothing measured"), "{texts:?}");
}

#[test]
fn file_stems_carry_the_kind_and_a_compact_time() {
    assert_eq!(
        file_stem("compare", "2026-10-20T13:40:05Z"),
        "compare-20261020T134005Z"
    );
    let now = now_rfc3339();
    assert_eq!(now.len(), "2026-10-20T13:40:05Z".len(), "{now}");
    assert!(now.ends_with('Z'), "{now}");
}
