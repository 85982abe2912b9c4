//! Text tables, the markdown report and the SVG plots.
//!
//! Plots use plotters' SVG backend without any font feature: plotters then
//! sizes text with its built-in estimate and writes `<text>` elements that the
//! viewer renders, so no system font is needed at build or run time.

use crate::limit::LimitResult;
use crate::run::{RunResult, SizeResult};
use crate::size::human;
use anyhow::{anyhow, Result};
use plotters::prelude::*;
use std::fmt::Write;
use std::path::Path;

/// A duration in ns as people read it.
pub fn fmt_ns(ns: f64) -> String {
    if !ns.is_finite() {
        "-".into()
    } else if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.2} us", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}

pub fn fmt_rate(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

pub fn fmt_pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// Left-aligned first column, right-aligned others, padded to the widest cell.
pub fn text_table(head: &[&str], rows: &[Vec<String>]) -> String {
    let n = head.len();
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let pad = w[i].saturating_sub(c.chars().count());
            if i == 0 {
                s += c;
                s += &" ".repeat(pad);
            } else {
                s += "  ";
                s += &" ".repeat(pad);
                s += c;
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(head.iter().map(|s| s.to_string()).collect());
    out += &line(w.iter().map(|&x| "-".repeat(x)).collect());
    for r in rows {
        out += &line(r.clone());
    }
    out
}

/// A markdown table.
pub fn md_table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = format!("| {} |\n", head.join(" | "));
    s += &format!(
        "|{}\n",
        head.iter()
            .enumerate()
            .map(|(i, _)| if i == 0 { " --- |" } else { " ---: |" })
            .collect::<String>()
    );
    for r in rows {
        s += &format!("| {} |\n", r.join(" | "));
    }
    s
}

pub fn run_rows(r: &RunResult) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let lat = if r.command == "bw" {
        "per msg"
    } else {
        "one-way"
    };
    let head = if lat == "one-way" {
        vec![
            "size",
            "iters",
            "one-way min",
            "p50",
            "p99",
            "mean",
            "MB/s",
            "msgs/s",
            "cpu client",
            "cpu server",
        ]
    } else {
        vec![
            "size",
            "msgs",
            "per msg min",
            "p50",
            "p99",
            "mean",
            "MB/s",
            "msgs/s",
            "cpu client",
            "cpu server",
        ]
    };
    let row = |x: &SizeResult, label: String| {
        vec![
            label,
            x.iters.to_string(),
            fmt_ns(x.lat_ns.min),
            fmt_ns(x.lat_ns.p50),
            fmt_ns(x.lat_ns.p99),
            fmt_ns(x.lat_ns.mean),
            format!("{:.1}", x.mbytes_per_s),
            fmt_rate(x.msgs_per_s),
            fmt_pct(x.cpu.client),
            fmt_pct(x.cpu.server),
        ]
    };
    let mut rows = Vec::new();
    for (i, x) in r.results.iter().enumerate() {
        match r.lossless.get(i) {
            // The faulty connection and its lossless twin, batches
            // alternated in one run; the CPU columns are the two's together.
            Some(t) => {
                rows.push(row(x, format!("{} faults", human(x.size))));
                rows.push(row(t, format!("{} lossless", human(t.size))));
            }
            None => rows.push(row(x, human(x.size))),
        }
    }
    (head, rows)
}

/// With a lossless twin: each size's goodput at the faults over the
/// twin's, one line each.
fn twin_ratios(r: &RunResult) -> String {
    r.results
        .iter()
        .zip(&r.lossless)
        .filter(|(_, t)| t.mbytes_per_s > 0.0)
        .map(|(x, t)| {
            format!(
                "{}: goodput at the faults / lossless twin = {:.2}x\n",
                human(x.size),
                x.mbytes_per_s / t.mbytes_per_s
            )
        })
        .collect()
}

pub fn run_table(r: &RunResult) -> String {
    let (head, rows) = run_rows(r);
    format!(
        "{} {} ({})\n{}{}",
        r.command,
        r.provider,
        r.mode,
        text_table(&head, &rows),
        twin_ratios(r)
    )
}

pub fn limit_rows(r: &LimitResult) -> Vec<Vec<String>> {
    let mut rows = vec![
        vec![
            "cache-line ping-pong, one line, one-way p50".into(),
            fmt_ns(r.cacheline_one_way_ns.p50),
        ],
        vec![
            "cache-line ping-pong, one line, one-way min".into(),
            fmt_ns(r.cacheline_one_way_ns.min),
        ],
        vec![
            "cache-line ping-pong, a line each way, one-way p50".into(),
            fmt_ns(r.cacheline_each_way_one_way_ns.p50),
        ],
        vec![
            "cache-line ping-pong, a line each way, one-way min".into(),
            fmt_ns(r.cacheline_each_way_one_way_ns.min),
        ],
        vec![
            "cache-line ping-pong, a line each way, uvia's wait between looks, one-way p50".into(),
            fmt_ns(r.cacheline_paced_one_way_ns.p50),
        ],
        vec![
            "cache-line ping-pong, a line each way, uvia's wait between looks, one-way min".into(),
            fmt_ns(r.cacheline_paced_one_way_ns.min),
        ],
        vec![
            "futex hand-off, one-way p50".into(),
            fmt_ns(r.futex_one_way_ns.p50),
        ],
    ];
    for m in &r.memcpy {
        rows.push(vec![
            format!("memcpy {}", human(m.size)),
            format!("{:.0} MB/s", m.mbytes_per_s),
        ]);
    }
    for m in &r.cross_core_copy {
        rows.push(vec![
            format!("cross-core copy {}", human(m.size)),
            format!("{:.0} MB/s", m.mbytes_per_s),
        ]);
    }
    let xdp = "AF_XDP medium ping-pong 8 B, two test hosts, one-way p50";
    match (&r.xdp_medium_one_way_ns, &r.xdp_medium_skipped) {
        (Some(m), _) => rows.push(vec![xdp.into(), fmt_ns(m.p50)]),
        (None, Some(why)) => rows.push(vec![xdp.into(), format!("skipped: {why}")]),
        (None, None) => {}
    }
    rows
}

pub fn limit_table(r: &LimitResult) -> String {
    format!(
        "physical limits (cores 0 and 1)\n{}",
        text_table(&["probe", "value"], &limit_rows(r))
    )
}

/// One line of a plot: a label and (size, value) points.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(90, 90, 90),
];

/// An axis label for a decimal tick: 10, 100, 1k, 10k, 1M.
fn decimal(x: f64) -> String {
    let r = |v: f64| {
        format!("{v:.1}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    };
    if x >= 1e6 {
        format!("{}M", r(x / 1e6))
    } else if x >= 1e3 {
        format!("{}k", r(x / 1e3))
    } else {
        r(x)
    }
}

/// A log-log line plot of value against message size.
pub fn plot(path: &Path, title: &str, y_label: &str, series: &[Series]) -> Result<()> {
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|(x, y)| *x > 0.0 && *y > 0.0 && y.is_finite())
        .collect();
    if pts.is_empty() {
        return Err(anyhow!("nothing to plot for {title}"));
    }
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, 0f64, f64::MAX, 0f64);
    for (x, y) in &pts {
        x0 = x0.min(*x);
        x1 = x1.max(*x);
        y0 = y0.min(*y);
        y1 = y1.max(*y);
    }
    let (x0, x1) = (x0 / 1.5, x1 * 1.5);
    let (y0, y1) = (y0 / 2.0, y1 * 2.0);
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc(y_label)
        .x_label_formatter(&|x| decimal(*x))
        .y_label_formatter(&|y| {
            if *y >= 1000.0 {
                format!("{:.0}", y)
            } else {
                format!("{:.3}", y)
                    .trim_end_matches('0')
                    .trim_end_matches('.')
                    .to_string()
            }
        })
        .draw()
        .map_err(|e| err(&e))?;
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let p: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|(x, y)| *x > 0.0 && *y > 0.0 && y.is_finite())
            .collect();
        if p.is_empty() {
            continue;
        }
        let style = c.stroke_width(2);
        if s.dashed {
            chart
                .draw_series(DashedLineSeries::new(p.clone(), 8, 6, style))
                .map_err(|e| err(&e))?
                .label(s.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
        } else {
            chart
                .draw_series(LineSeries::new(p.clone(), style))
                .map_err(|e| err(&e))?
                .label(s.label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
            chart
                .draw_series(p.iter().map(|&(x, y)| Circle::new((x, y), 3, c.filled())))
                .map_err(|e| err(&e))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Appends a line to a String (ignoring the infallible error).
pub fn push(s: &mut String, line: impl AsRef<str>) {
    let _ = writeln!(s, "{}", line.as_ref());
}
