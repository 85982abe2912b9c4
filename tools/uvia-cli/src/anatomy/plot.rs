//! The anatomy's plots (SVG, without font features, as in `report`): the
//! categories stacked per provider (000's Table III drawn), one message's
//! time line (000's Figs. 3 and 9) and a stream's time chart (003's Figs.
//! 1 and 5). The last two are one drawing: bars on rows along a time axis.

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use std::path::Path;

/// The categories' colours, in [`super::CATEGORIES`]' order.
const CATEGORY_COLORS: [RGBColor; 6] = [
    RGBColor(148, 103, 189),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(214, 39, 40),
    RGBColor(140, 86, 75),
];

/// The colour of a category (grey for one that is not known).
pub fn category_color(cat: &str) -> RGBColor {
    super::CATEGORIES
        .iter()
        .position(|c| *c == cat)
        .map_or(RGBColor(120, 120, 120), |i| CATEGORY_COLORS[i])
}

/// Two colours that alternate message by message (003's charts do the same).
pub const ALTERNATE: [RGBColor; 2] = [RGBColor(31, 119, 180), RGBColor(255, 127, 14)];

fn err(path: &Path, e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing {}: {e}", path.display())
}

/// One provider's bar: its categories' times (ns) and the measured one-way
/// latency to compare them with.
pub struct StackedColumn<'a> {
    pub label: &'a str,
    pub categories: &'a [(String, f64)],
    pub one_way_ns: f64,
}

/// The categories stacked per provider, in microseconds, with each
/// provider's measured one-way latency marked.
pub fn stacked(path: &Path, title: &str, cols: &[StackedColumn]) -> Result<()> {
    if cols.is_empty() {
        return Err(anyhow!("nothing to plot for {title}"));
    }
    let top = cols
        .iter()
        .map(|c| {
            let sum: f64 = c.categories.iter().map(|x| x.1.max(0.0)).sum();
            sum.max(c.one_way_ns)
        })
        .fold(0.0, f64::max)
        / 1e3;
    // Room above the bars for the legend.
    let top = if top > 0.0 { top * 1.5 } else { 1.0 };
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    // A segmented range of integers has a segment for each end: 0..n-1
    // gives n.
    let n = cols.len() as i32;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((0..n - 1).into_segmented(), 0.0..top)
        .map_err(|e| err(path, e))?;
    let labels: Vec<String> = cols.iter().map(|c| c.label.to_string()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(cols.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("time per one-way message (us)")
        .draw()
        .map_err(|e| err(path, e))?;
    for cat in super::CATEGORIES {
        let color = category_color(cat);
        let mut bars = Vec::new();
        for (i, c) in cols.iter().enumerate() {
            let below: f64 = c
                .categories
                .iter()
                .take_while(|x| x.0 != cat)
                .map(|x| x.1.max(0.0))
                .sum();
            let Some((_, ns)) = c.categories.iter().find(|x| x.0 == cat) else {
                continue;
            };
            let (y0, y1) = (below / 1e3, (below + ns.max(0.0)) / 1e3);
            let mut r = Rectangle::new(
                [
                    (SegmentValue::Exact(i as i32), y0),
                    (SegmentValue::Exact(i as i32 + 1), y1),
                ],
                color.filled(),
            );
            r.set_margin(0, 0, 25, 25);
            bars.push(r);
        }
        chart
            .draw_series(bars)
            .map_err(|e| err(path, e))?
            .label(cat)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    let marks: Vec<_> = cols
        .iter()
        .enumerate()
        .filter(|(_, c)| c.one_way_ns > 0.0)
        .map(|(i, c)| {
            PathElement::new(
                vec![
                    (SegmentValue::Exact(i as i32), c.one_way_ns / 1e3),
                    (SegmentValue::Exact(i as i32 + 1), c.one_way_ns / 1e3),
                ],
                BLACK.stroke_width(2),
            )
        })
        .collect();
    chart
        .draw_series(marks)
        .map_err(|e| err(path, e))?
        .label("measured one-way latency (untraced)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], BLACK.stroke_width(2)));
    // Each bar's sum written above it (the smallest are hard to see).
    let sums: Vec<_> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let sum: f64 = c.categories.iter().map(|x| x.1.max(0.0)).sum();
            EmptyElement::at((SegmentValue::CenterOf(i as i32), sum / 1e3))
                + Text::new(
                    format!("{:.2} us", sum / 1e3),
                    (-18, -16),
                    ("sans-serif", 12).into_font().color(&BLACK),
                )
        })
        .collect();
    chart.draw_series(sums).map_err(|e| err(path, e))?;
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))?;
    Ok(())
}

/// A bar of a time chart: on `row`, from `start` to `end` (ns).
#[derive(Clone, Debug)]
pub struct Bar {
    pub row: usize,
    pub start: f64,
    pub end: f64,
    pub color: RGBColor,
    /// A short label drawn over the bar.
    pub text: Option<String>,
}

/// A time chart: named rows (the first at the top), bars along a time axis
/// that starts at 0, a legend of colours, and lines of notes below.
pub struct Chart<'a> {
    pub title: &'a str,
    pub rows: &'a [String],
    pub bars: &'a [Bar],
    pub legend: &'a [(String, RGBColor)],
    pub notes: &'a [String],
}

/// Draws a time chart; the axis is in ns or us, whichever reads better.
/// The legend and the notes go below the chart, where they hide no bar.
pub fn chart(path: &Path, c: &Chart) -> Result<()> {
    if c.rows.is_empty() || c.bars.is_empty() {
        return Err(anyhow!("nothing to plot for {}", c.title));
    }
    const WIDTH: u32 = 1100;
    let end = c.bars.iter().map(|b| b.end).fold(0.0, f64::max);
    let (scale, unit) = if end >= 5_000.0 {
        (1e3, "us")
    } else {
        (1.0, "ns")
    };
    let x1 = if end > 0.0 { end / scale * 1.02 } else { 1.0 };
    let row_h = if c.rows.len() > 8 { 32 } else { 48 };
    let chart_h = 110 + row_h * c.rows.len() as u32;
    // The legend's entries, laid out in lines of the picture's width.
    let mut legend = Vec::new();
    let (mut x, mut line) = (20, 0);
    for (name, color) in c.legend {
        let w = 30 + 7 * name.chars().count() as i32;
        if x + w > WIDTH as i32 - 20 && x > 20 {
            (x, line) = (20, line + 1);
        }
        legend.push((x, line, name, *color));
        x += w;
    }
    let legend_h = if legend.is_empty() {
        0
    } else {
        20 * (line as u32 + 1) + 6
    };
    let notes_h = 12 + 17 * c.notes.len() as u32;
    let root = SVGBackend::new(path, (WIDTH, chart_h + legend_h + notes_h)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let (top, bottom) = root.split_vertically(chart_h);
    let (keys, notes) = bottom.split_vertically(legend_h);
    let n = c.rows.len() as i32;
    let label_w = c.rows.iter().map(|r| r.chars().count()).max().unwrap_or(8) as u32 * 7 + 20;
    // A segmented range of integers has a segment for each end: 0..n-1
    // gives n rows.
    let mut ch = ChartBuilder::on(&top)
        .caption(c.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(label_w.min(460))
        .build_cartesian_2d(0.0..x1, (0..n - 1).into_segmented())
        .map_err(|e| err(path, e))?;
    let rows = c.rows;
    ch.configure_mesh()
        .disable_y_mesh()
        .y_labels(c.rows.len())
        .y_label_formatter(&|v| match v {
            // Row 0 is drawn at the top.
            SegmentValue::CenterOf(i) if (*i as usize) < rows.len() => {
                rows[rows.len() - 1 - *i as usize].clone()
            }
            _ => String::new(),
        })
        .x_label_formatter(&|v| {
            if unit == "ns" {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        })
        .x_desc(format!("time ({unit})"))
        .draw()
        .map_err(|e| err(path, e))?;
    let seg = |row: usize| (n - 1 - row as i32).max(0);
    let rects: Vec<_> = c
        .bars
        .iter()
        .filter(|b| b.row < c.rows.len())
        .map(|b| {
            let s = seg(b.row);
            let mut r = Rectangle::new(
                [
                    (b.start / scale, SegmentValue::Exact(s)),
                    (b.end.max(b.start) / scale, SegmentValue::Exact(s + 1)),
                ],
                b.color.filled(),
            );
            r.set_margin(8, 8, 0, 0);
            r
        })
        .collect();
    ch.draw_series(rects).map_err(|e| err(path, e))?;
    // Labels above the bars, and every other one of a row below it, so
    // that the labels of short bars side by side do not run together.
    let mut count = vec![0usize; c.rows.len()];
    let mut texts = Vec::new();
    for b in c.bars.iter().filter(|b| b.row < c.rows.len()) {
        let Some(t) = b.text.clone() else { continue };
        let below = count[b.row] % 2 == 1;
        count[b.row] += 1;
        let at = (
            (b.start + b.end) / 2.0 / scale,
            SegmentValue::CenterOf(seg(b.row)),
        );
        let dy = if below {
            row_h as i32 / 2 - 8
        } else {
            -(row_h as i32) / 2
        };
        texts.push(
            EmptyElement::at(at)
                + Text::new(t, (-4, dy), ("sans-serif", 10).into_font().color(&BLACK)),
        );
    }
    ch.draw_series(texts).map_err(|e| err(path, e))?;
    for (x, line, name, color) in legend {
        let y = 4 + 20 * line;
        keys.draw(&Rectangle::new([(x, y), (x + 12, y + 12)], color.filled()))
            .map_err(|e| err(path, e))?;
        keys.draw(&Text::new(
            name.clone(),
            (x + 18, y),
            ("sans-serif", 13).into_font().color(&BLACK),
        ))
        .map_err(|e| err(path, e))?;
    }
    for (i, line) in c.notes.iter().enumerate() {
        notes
            .draw(&Text::new(
                line.clone(),
                (20, 4 + 17 * i as i32),
                ("sans-serif", 13).into_font().color(&BLACK),
            ))
            .map_err(|e| err(path, e))?;
    }
    root.present().map_err(|e| err(path, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("uvia-plot-{}-{name}", std::process::id()))
    }

    #[test]
    fn a_time_chart_draws_its_rows_and_notes() {
        let p = tmp("chart.svg");
        let rows = vec!["sender: send".to_string(), "receiver: copy".to_string()];
        let bars = vec![
            Bar {
                row: 0,
                start: 0.0,
                end: 300.0,
                color: ALTERNATE[0],
                text: Some("t1".into()),
            },
            Bar {
                row: 1,
                start: 300.0,
                end: 700.0,
                color: ALTERNATE[1],
                text: None,
            },
        ];
        let notes = vec!["t1 the send".to_string()];
        chart(
            &p,
            &Chart {
                title: "a chart",
                rows: &rows,
                bars: &bars,
                legend: &[("message 1".into(), ALTERNATE[0])],
                notes: &notes,
            },
        )
        .unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        for want in ["sender: send", "receiver: copy", "t1 the send", "time (ns)"] {
            assert!(svg.contains(want), "{want} is not in the SVG");
        }
        let empty = chart(
            &p,
            &Chart {
                title: "empty",
                rows: &rows,
                bars: &[],
                legend: &[],
                notes: &[],
            },
        );
        assert!(empty.is_err());
    }

    #[test]
    fn stacked_bars_name_each_provider_and_category() {
        let p = tmp("stacked.svg");
        let cats: Vec<(String, f64)> = super::super::CATEGORIES
            .iter()
            .map(|c| (c.to_string(), 100.0))
            .collect();
        stacked(
            &p,
            "categories",
            &[
                StackedColumn {
                    label: "kernel-udp",
                    categories: &cats,
                    one_way_ns: 650.0,
                },
                StackedColumn {
                    label: "shm",
                    categories: &cats[..2],
                    one_way_ns: 0.0,
                },
            ],
        )
        .unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        for want in [
            "kernel-udp",
            "shm",
            "OS overhead (recv)",
            "measured one-way",
        ] {
            assert!(svg.contains(want), "{want} is not in the SVG");
        }
    }
}
