//! The picture beside a results file: one SVG, a heading with the machine and the command,
//! then per group a latency percentile chart (one curve per series, percentiles on a
//! "nines" axis so the tail gets as much room as the median) and a throughput bar chart.
//! Drawn with plotters' SVG backend and its built-in size estimate for text, so no font
//! files are needed.

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::results::{Group, Measured, Results, Series};
use super::stats::format_thousands;

const WIDTH: u32 = 1280;
const GROUP_HEIGHT: u32 = 400;
/// Left margin plus the latency chart's y label area: where its plot, and its legend, start.
const PLOT_LEFT: i32 = 12 + 64;
const LINE: u32 = 18;
/// Share of the width the latency chart takes; the throughput bars get the rest.
const LATENCY_SHARE: f64 = 0.62;
/// The nines axis ends a little right of 99.99 %.
const NINES_MAX: f64 = 4.2;
const FONT: &str = "sans-serif";
/// Tableau's ten colours: distinct, readable on white, in the same order in every group.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0xba, 0xb0, 0xac),
];

/// Drawing failed (plotters' error, as text: its type is generic over the backend).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ChartError(String);

fn chart_err<E: std::fmt::Display>(e: E) -> ChartError {
    ChartError(e.to_string())
}

/// Position of a percentile on the nines axis: 90 % at 1, 99 % at 2, 99.9 % at 3.
pub fn nines(percentile: f64) -> f64 {
    let rest = (1.0 - percentile / 100.0).max(1e-9);
    -rest.log10()
}

/// The percentile at a point of the nines axis, as a label: `0`, `90`, `99`, `99.9` ...
pub fn nines_label(x: f64) -> String {
    let p = 100.0 * (1.0 - 10f64.powf(-x));
    let decimals = (x.round() as i64 - 2).clamp(0, 6) as usize;
    format!("{p:.decimals$}%")
}

/// The colour of the `index`-th series of a group.
fn colour(index: usize) -> RGBColor {
    PALETTE[index % PALETTE.len()]
}

/// The whole picture as SVG text.
pub fn render_svg(results: &Results) -> Result<String, ChartError> {
    let header_lines = 3 + results.setup.len() as u32;
    let header = 16 + LINE * header_lines + 8;
    let height = header
        + results
            .groups
            .iter()
            .map(|g| GROUP_HEIGHT + legend_height(g))
            .sum::<u32>()
            .max(GROUP_HEIGHT);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(chart_err)?;
        let (top, body) = root.split_vertically(header);
        draw_heading(&top, results)?;
        let mut rest = body;
        for group in &results.groups {
            let (row, below) = rest.split_vertically(GROUP_HEIGHT + legend_height(group));
            rest = below;
            let split = (f64::from(WIDTH) * LATENCY_SHARE) as u32;
            let (left, right) = row.split_horizontally(split);
            let (plot, legend) = left.split_vertically(GROUP_HEIGHT);
            draw_latency(&plot, group)?;
            draw_legend(&legend, group)?;
            let (bars, _) = right.split_vertically(GROUP_HEIGHT);
            draw_throughput(&bars, group)?;
        }
        root.present().map_err(chart_err)?;
    }
    Ok(svg)
}

fn draw_heading<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    results: &Results,
) -> Result<(), ChartError> {
    let m = &results.machine;
    let mut machine = format!(
        "{} · {}, {} CPUs",
        results.generated_at, m.cpu_model, m.cpus
    );
    if let Some(mib) = m.memory_mib {
        machine.push_str(&format!(", {} MiB", format_thousands(mib as f64)));
    }
    machine.push_str(&format!(", Linux {}", m.kernel));
    if let Some(load) = &m.load_average {
        machine.push_str(&format!(", load average {load}"));
    }
    if let Some(rev) = &m.revision {
        machine.push_str(&format!(" · revision {rev}"));
    }
    let mut lines: Vec<(String, TextStyle)> = vec![
        (
            results.title.clone(),
            (FONT, 20)
                .into_font()
                .style(FontStyle::Bold)
                .into_text_style(area),
        ),
        (machine, (FONT, 13).into_text_style(area)),
        (
            format!("$ {}", results.command),
            (FONT, 13).into_text_style(area),
        ),
    ];
    for line in &results.setup {
        lines.push((
            line.clone(),
            (FONT, 12)
                .into_font()
                .color(&RGBColor(0x55, 0x55, 0x55))
                .into_text_style(area),
        ));
    }
    let mut y = 12;
    for (i, (text, style)) in lines.iter().enumerate() {
        area.draw(&Text::new(text.as_str(), (16, y), style.clone()))
            .map_err(chart_err)?;
        y += if i == 0 { LINE as i32 + 6 } else { LINE as i32 };
    }
    Ok(())
}

/// The measured series of a group with their colour index.
fn measured(group: &Group) -> Vec<(usize, &Series, &Measured)> {
    group
        .series
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.measured.as_ref().map(|m| (i, s, m)))
        .collect()
}

/// A measured series' curve in (nines, milliseconds), with its maximum at the right edge.
fn curve(m: &Measured) -> Vec<(f64, f64)> {
    m.percentiles
        .iter()
        .map(|p| (nines(p.percentile), p.latency_us.max(1) as f64 / 1000.0))
        .collect()
}

fn draw_latency<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    group: &Group,
) -> Result<(), ChartError> {
    let series = measured(group);
    let values = series
        .iter()
        .flat_map(|(_, _, m)| curve(m))
        .map(|(_, ms)| ms);
    let (lo, hi) = values.fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if lo.is_finite() && hi > 0.0 {
        (lo * 0.8, hi * 1.25)
    } else {
        (0.1, 10.0)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{}: latency by percentile", group.name), (FONT, 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..NINES_MAX, (lo..hi).log_scale())
        .map_err(chart_err)?;
    chart
        .configure_mesh()
        .x_labels(5)
        .x_label_formatter(&|x| nines_label(*x))
        .y_label_formatter(&|ms| format_ms(*ms))
        .x_desc("percentile")
        .y_desc("latency (ms, log scale)")
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .draw()
        .map_err(chart_err)?;
    for (i, _, m) in &series {
        let c = colour(*i);
        let points = curve(m);
        chart
            .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))
            .map_err(chart_err)?;
        chart
            .draw_series(points.into_iter().map(|p| Circle::new(p, 3, c.filled())))
            .map_err(chart_err)?;
    }
    if series.is_empty() {
        chart
            .draw_series(std::iter::once(Text::new(
                "nothing measured",
                (0.2, lo * 2.0),
                (FONT, 14),
            )))
            .map_err(chart_err)?;
    }
    Ok(())
}

/// Legend entries per row under a latency chart.
const LEGEND_COLUMNS: usize = 2;

/// Height of the legend under a group's latency chart: a row per two measured series.
fn legend_height(group: &Group) -> u32 {
    let entries = measured(group).len();
    if entries == 0 {
        return 0;
    }
    (entries.div_ceil(LEGEND_COLUMNS) as u32) * LINE + 8
}

/// The latency chart's legend, below its plot rather than on it, so that no curve's tail is
/// hidden: a swatch and `name  p50 ..  p99 ..` per measured series, in columns.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    group: &Group,
) -> Result<(), ChartError> {
    let (width, _) = area.dim_in_pixel();
    let column = (width as i32 - PLOT_LEFT - 12) / LEGEND_COLUMNS as i32;
    let style = (FONT, 13).into_text_style(area);
    for (n, (i, s, m)) in measured(group).into_iter().enumerate() {
        let x = PLOT_LEFT + column * (n % LEGEND_COLUMNS) as i32;
        let y = 4 + LINE as i32 * (n / LEGEND_COLUMNS) as i32;
        let c = colour(i);
        area.draw(&PathElement::new(
            vec![(x, y + 7), (x + 18, y + 7)],
            c.stroke_width(3),
        ))
        .map_err(chart_err)?;
        area.draw(&Text::new(legend_label(s, m), (x + 24, y), style.clone()))
            .map_err(chart_err)?;
    }
    Ok(())
}

/// `name  p50 0.41 ms  p99 1.20 ms`.
fn legend_label(s: &Series, m: &Measured) -> String {
    format!(
        "{}  p50 {} ms  p99 {} ms",
        s.name,
        format_ms(m.p50_us as f64 / 1000.0),
        format_ms(m.p99_us as f64 / 1000.0)
    )
}

/// Milliseconds with three significant digits.
fn format_ms(ms: f64) -> String {
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else if ms >= 10.0 {
        format!("{ms:.1}")
    } else if ms >= 1.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.3}")
    }
}

fn draw_throughput<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    group: &Group,
) -> Result<(), ChartError> {
    let rows = group.series.len().max(1);
    let top = group
        .series
        .iter()
        .filter_map(|s| s.measured.as_ref().map(|m| m.rps))
        .fold(0f64, f64::max);
    let x_max = if top > 0.0 { top * 1.1 } else { 1.0 };
    let mut chart: ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>> =
        ChartBuilder::on(area)
            .caption("throughput (req/s)", (FONT, 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(8)
            .build_cartesian_2d(0f64..x_max, 0f64..rows as f64)
            .map_err(chart_err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_labels(5)
        .x_label_formatter(&|v| format_thousands(*v))
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .draw()
        .map_err(chart_err)?;
    for (i, s) in group.series.iter().enumerate() {
        // The first series on top.
        let y = (rows - 1 - i) as f64;
        let c = colour(i);
        let label = match &s.measured {
            Some(m) => {
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(0.0, y + 0.15), (m.rps, y + 0.85)],
                        c.mix(0.45).filled(),
                    )))
                    .map_err(chart_err)?;
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(0.0, y + 0.15), (m.rps, y + 0.85)],
                        c.stroke_width(1),
                    )))
                    .map_err(chart_err)?;
                let ratio = m
                    .vs_baseline
                    .and_then(|r| r.rps)
                    .zip(group.baseline.as_deref())
                    .map_or(String::new(), |(r, base)| format!(" ({r:.2}× {base})"));
                format!("{}  {}{ratio}", s.name, format_thousands(m.rps))
            }
            None => format!(
                "{}: {}{}",
                s.name,
                s.outcome.as_str(),
                s.reason
                    .as_deref()
                    .map_or(String::new(), |r| format!(" ({})", first_line(r, 40)))
            ),
        };
        let style =
            (FONT, 13)
                .into_font()
                .color(&BLACK)
                .pos(plotters::style::text_anchor::Pos::new(
                    plotters::style::text_anchor::HPos::Left,
                    plotters::style::text_anchor::VPos::Center,
                ));
        chart
            .draw_series(std::iter::once(Text::new(
                label,
                (x_max * 0.015, y + 0.5),
                style,
            )))
            .map_err(chart_err)?;
    }
    Ok(())
}

/// The first line of `text`, cut to `max` characters.
fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    if line.chars().count() <= max {
        return line.to_owned();
    }
    let cut: String = line.chars().take(max).collect();
    format!("{cut}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nines_axis_puts_each_nine_one_step_further() {
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.0) - 2.0).abs() < 1e-9);
        assert!((nines(99.99) - 4.0).abs() < 1e-6);
        assert_eq!(nines(0.0), 0.0);
        assert!(nines(100.0).is_finite(), "the maximum stays on the chart");
        let labels: Vec<String> = (0..5).map(|x| nines_label(f64::from(x))).collect();
        assert_eq!(labels, ["0%", "90%", "99%", "99.9%", "99.99%"]);
    }

    #[test]
    fn milliseconds_keep_three_significant_digits() {
        assert_eq!(format_ms(0.4123), "0.412");
        assert_eq!(format_ms(1.234), "1.23");
        assert_eq!(format_ms(12.34), "12.3");
        assert_eq!(format_ms(123.4), "123");
    }

    #[test]
    fn long_reasons_are_cut_to_their_first_line() {
        assert_eq!(first_line("short\nmore", 60), "short");
        assert_eq!(first_line("abcdef", 3), "abc…");
    }
}
