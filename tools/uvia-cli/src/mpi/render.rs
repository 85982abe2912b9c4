//! The study's tables and plots.

use super::{Curve, Runner, Study};
use crate::report::{fmt_ns, md_table, push, text_table, Series};
use anyhow::Result;
use std::path::{Path, PathBuf};

/// The study as text and markdown tables: one-way p50 by size for every
/// variant, each MPI variant's ratio to native uvia on its medium, and the
/// three effects of the source.
pub fn tables(s: &Study) -> (String, String) {
    let mut head: Vec<String> = vec!["variant".into()];
    head.extend(s.sizes.iter().map(|&b| crate::size::human(b)));
    let head_ref: Vec<&str> = head.iter().map(String::as_str).collect();
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for c in &s.curves {
        if let Some(e) = &c.error {
            failed.push(format!("{}: {e}", c.label));
            continue;
        }
        let mut row = vec![c.label.to_string()];
        row.extend(
            c.p50_ns
                .iter()
                .map(|p| p.map(fmt_ns).unwrap_or_else(|| "-".into())),
        );
        rows.push(row);
    }
    let mut ratio_rows = Vec::new();
    for c in s
        .curves
        .iter()
        .filter(|c| c.runner != Runner::Native && c.error.is_none())
    {
        let Some(m) = c.medium else { continue };
        let native = format!("native-{m}");
        let mut row = vec![format!("{} / uvia {m}", c.label)];
        row.extend(s.sizes.iter().map(|&b| {
            s.ratio(c.key, &native, b)
                .map(|r| format!("{r:.2}x"))
                .unwrap_or_else(|| "-".into())
        }));
        ratio_rows.push(row);
    }
    let effects = [
        (
            "no ack: software acks over datagrams / reliable VIs",
            "ompi-rxd",
            "ompi-uvia-udp",
        ),
        (
            "no copy: every message eager / rendezvous above 16 KiB",
            "ompi-uvia-udp-eager",
            "ompi-uvia-udp",
        ),
        (
            "spin: blocking waits / polling (native udp)",
            "native-udp-blocking",
            "native-udp",
        ),
        (
            "MPI over uvia / native (udp; the source: 2.5x at 4 B)",
            "ompi-uvia-udp",
            "native-udp",
        ),
    ];
    let mut effect_rows = Vec::new();
    for (name, a, b) in effects {
        let mut row = vec![name.to_string()];
        row.extend(s.sizes.iter().map(|&size| {
            s.ratio(a, b, size)
                .map(|r| format!("{r:.2}x"))
                .unwrap_or_else(|| "-".into())
        }));
        effect_rows.push(row);
    }
    let mut text = String::new();
    let mut md = String::new();
    push(
        &mut text,
        format!("one-way p50 by size (median of {} rounds)", s.pairs),
    );
    push(&mut text, text_table(&head_ref, &rows));
    push(
        &mut text,
        "each MPI variant against native uvia on its medium",
    );
    push(&mut text, text_table(&head_ref, &ratio_rows));
    push(
        &mut text,
        "the source's three effects (ratio of one-way times)",
    );
    push(&mut text, text_table(&head_ref, &effect_rows));
    push(
        &mut md,
        format!(
            "One-way p50 by size, the median of {} interleaved rounds:",
            s.pairs
        ),
    );
    push(&mut md, "");
    push(&mut md, md_table(&head_ref, &rows));
    push(
        &mut md,
        "Each MPI variant against native uvia on its medium:",
    );
    push(&mut md, "");
    push(&mut md, md_table(&head_ref, &ratio_rows));
    push(
        &mut md,
        "The source's three effects, as ratios of one-way times:",
    );
    push(&mut md, "");
    push(&mut md, md_table(&head_ref, &effect_rows));
    for f in &failed {
        push(&mut text, format!("not measured: {f}"));
        push(&mut md, format!("- not measured: {f}"));
    }
    (text, md)
}

/// The plots of the source's Figures 7 to 9: one-way time by size for
/// every variant, and each MPI variant's ratio to native uvia.
pub fn plots(s: &Study, dir: &Path) -> Result<Vec<PathBuf>> {
    let series = |f: &dyn Fn(&Curve, usize) -> Option<f64>, mpi_only: bool| -> Vec<Series> {
        s.curves
            .iter()
            .filter(|c| c.error.is_none() && (!mpi_only || c.runner != Runner::Native))
            .map(|c| Series {
                label: c.label.to_string(),
                points: s
                    .sizes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &b)| Some((b as f64, f(c, i)?)))
                    .collect(),
                dashed: c.runner == Runner::Native,
            })
            .collect()
    };
    let lat = dir.join("mpi-latency.svg");
    crate::report::plot(
        &lat,
        "MPI over uvia: one-way latency by size (p50)",
        "one-way latency (us)",
        &series(&|c, i| c.p50_ns[i].map(|ns| ns / 1000.0), false),
    )?;
    let ratio = dir.join("mpi-vs-native.svg");
    crate::report::plot(
        &ratio,
        "MPI variants against native uvia on the same medium",
        "one-way time / native uvia",
        &series(
            &|c, i| s.ratio(c.key, &format!("native-{}", c.medium?), s.sizes[i]),
            true,
        ),
    )?;
    Ok(vec![lat, ratio])
}
