//! The bench's report: the printed summary, report.md and the plots.

use super::{headline_rows, placement_note, BenchResult, NETNS_UDP_BP, TWO_HOSTS, UDP_BP};
use crate::anatomy::compare;
use crate::limit;
use crate::report::{self, fmt_ns, fmt_pct, md_table, push, text_table, Series};
use crate::size::human;
use std::path::{Path, PathBuf};

/// The printed summary and the markdown report; writes the plots.
pub(super) fn render(res: &BenchResult, out: &Path) -> (String, String) {
    let mut text = String::new();
    let mut md = String::new();
    push(
        &mut md,
        format!("# uvia bench{}", if res.quick { " (quick)" } else { "" }),
    );
    push(&mut md, "");
    push(&mut md, "Two processes pinned to cores 0 and 1; times from the TSC; one-way latency = round trip / 2. Ratios in the headline come from interleaved pairs (contender, baseline, contender, ...); the headline ratio is the median of the pair ratios.");
    push(&mut md, "");

    // Headline.
    let (head, rows) = headline_rows(&res.headline);
    let mut brows: Vec<Vec<String>> = Vec::new();
    for b in &res.blocked_receiver {
        let cpu = b.receiver_cpu.map(fmt_pct).unwrap_or_else(|| "-".into());
        let v = match (b.receiver_cpu, &b.error) {
            (_, Some(_)) => "FAILED".to_string(),
            (Some(c), None) if b.label.starts_with("shm") => {
                if c < 0.05 { "met" } else { "not met" }.into()
            }
            _ => "(reference)".into(),
        };
        brows.push(vec![
            format!(
                "{} receiver CPU, one 8 B round trip per {} us",
                b.label, b.interval_us
            ),
            cpu,
            if b.label.starts_with("shm") {
                "< 5%".into()
            } else {
                "-".into()
            },
            v,
        ]);
    }
    push(&mut text, "Headline");
    text += &text_table(
        &head[..5],
        &rows.iter().map(|r| r[..5].to_vec()).collect::<Vec<_>>(),
    );
    text += &text_table(&["blocked receiver", "cpu", "target", "verdict"], &brows);
    push(&mut md, "## Headline");
    push(&mut md, "");
    md += &md_table(&head, &rows);
    push(&mut md, "");
    md += &md_table(&["blocked receiver", "cpu", "target", "verdict"], &brows);
    push(&mut md, "");
    if let Some(note) = placement_note(&res.headline) {
        push(&mut text, &note);
        push(&mut md, &note);
        push(&mut md, "");
    }
    let mut errs = Vec::new();
    for h in &res.headline {
        if let Some(e) = &h.error {
            errs.push(format!("{}: {e}", h.name));
        }
    }
    for b in &res.blocked_receiver {
        if let Some(e) = &b.error {
            errs.push(format!("blocked receiver {}: {e}", b.label));
        }
    }
    for e in &errs {
        push(&mut md, format!("- failed: {e}"));
        push(&mut text, format!("failed: {e}"));
    }
    if !errs.is_empty() {
        push(&mut md, "");
    }

    // Limits.
    push(&mut md, "## Physical limits");
    push(&mut md, "");
    push(&mut md, limit::HOW);
    push(&mut md, "");
    push(&mut text, "");
    match (&res.limit, &res.limit_error) {
        (Some(l), _) => {
            text += &report::limit_table(l);
            md += &md_table(&["probe", "value"], &report::limit_rows(l));
        }
        (None, e) => {
            let e = e.clone().unwrap_or_default();
            push(&mut text, format!("limits: failed: {e}"));
            push(&mut md, format!("failed: {e}"));
        }
    }
    push(&mut md, "");

    // Side by side.
    let cl = res
        .limit
        .as_ref()
        .map(|l| l.cacheline_each_way_one_way_ns.p50)
        .filter(|x| *x > 0.0);
    let xc = res
        .limit
        .as_ref()
        .and_then(|l| l.cross_core_copy.iter().find(|x| x.size == 1 << 20))
        .map(|x| x.mbytes_per_s)
        .filter(|x| *x > 0.0);
    let find = |kind: &str, label: &str| {
        res.runs
            .iter()
            .find(|r| r.kind == kind && r.label == label)
            .and_then(|r| r.result.as_ref())
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    };
    let mut lat_rows = Vec::new();
    let mut bw_rows = Vec::new();
    for kind in ["pingpong", "bw"] {
        for r in res.runs.iter().filter(|r| r.kind == kind) {
            match (&r.result, &r.error) {
                (Some(rr), _) => {
                    for x in &rr.results {
                        // Rows between two test hosts against kernel UDP there.
                        let base = match r.label.ends_with(TWO_HOSTS) {
                            true => NETNS_UDP_BP,
                            false => UDP_BP,
                        };
                        let udp = find(kind, base)
                            .and_then(|u| u.results.iter().find(|y| y.size == x.size));
                        if kind == "pingpong" {
                            lat_rows.push(vec![
                                r.label.clone(),
                                human(x.size),
                                fmt_ns(x.lat_ns.p50),
                                fmt_ns(x.lat_ns.p99),
                                fmt_ns(x.lat_ns.mean),
                                format!("{:.2}", x.lat_ns.mean / x.lat_ns.p50),
                                format!("{:.0}", x.mbytes_per_s),
                                format!("{} / {}", fmt_pct(x.cpu.client), fmt_pct(x.cpu.server)),
                                ratio(Some(x.lat_ns.p50), cl),
                                ratio(udp.map(|u| u.lat_ns.p50), Some(x.lat_ns.p50)),
                            ]);
                        } else {
                            bw_rows.push(vec![
                                r.label.clone(),
                                human(x.size),
                                format!("{:.0}", x.mbytes_per_s),
                                report::fmt_rate(x.msgs_per_s),
                                format!("{} / {}", fmt_pct(x.cpu.client), fmt_pct(x.cpu.server)),
                                ratio(Some(x.mbytes_per_s), xc),
                                ratio(Some(x.mbytes_per_s), udp.map(|u| u.mbytes_per_s)),
                            ]);
                        }
                    }
                }
                (None, e) => {
                    let e = format!("FAILED: {}", e.clone().unwrap_or_default());
                    let row = if kind == "pingpong" {
                        &mut lat_rows
                    } else {
                        &mut bw_rows
                    };
                    let mut v = vec![r.label.clone(), e];
                    v.resize(if kind == "pingpong" { 10 } else { 7 }, String::new());
                    row.push(v);
                }
            }
        }
    }
    let lat_head = [
        "provider / mode",
        "size",
        "one-way p50",
        "p99",
        "mean",
        "mean / p50",
        "MB/s",
        "cpu cli/srv",
        "x limit",
        "UDP-bp / this",
    ];
    let bw_head = [
        "provider / mode",
        "size",
        "MB/s",
        "msgs/s",
        "cpu cli/srv",
        "/ copy 1 MiB",
        "/ UDP-bp",
    ];
    push(&mut text, "");
    push(&mut text, "Ping-pong (x limit = one-way p50 / cache-line one-way p50, a line each way; UDP-bp / this = kernel UDP busy-poll p50 / this p50)");
    text += &text_table(&lat_head, &lat_rows);
    push(&mut text, "");
    push(&mut text, "Bandwidth (/ copy 1 MiB = MB/s / cross-core copy at 1 MiB; / UDP-bp = MB/s / kernel UDP busy-poll MB/s)");
    text += &text_table(&bw_head, &bw_rows);
    push(&mut md, "## Ping-pong: one-way latency");
    push(&mut md, "");
    push(&mut md, "`x limit` = one-way p50 / cache-line one-way p50 with a line each way (lower is better, 1 is the hardware a message exchange runs on). `UDP-bp / this` = kernel UDP busy-poll p50 / this p50 (how many times lower than UDP). `mean / p50` well above 1 means something on the path waits now and then (a sleep, a preemption, a retransmission) that the p50 hides. CPU is (user + system time) / wall time of each process over the measured loop.");
    push(&mut md, "");
    md += &md_table(&lat_head, &lat_rows);
    push(&mut md, "");
    push(&mut md, "![one-way latency vs size](latency.svg)");
    push(&mut md, "");
    push(&mut md, "## Bandwidth");
    push(&mut md, "");
    push(&mut md, "The client sends back-to-back messages (up to 64 outstanding) in batches; the server answers each batch with one 8-byte ack. MB/s = bytes / total batch time (1 MB = 1e6 B). In results.json the `lat_ns` of a bandwidth run is the time per message from per-batch samples (batch time / messages in the batch). `/ copy 1 MiB` = MB/s / cross-core copy bandwidth at 1 MiB.");
    push(&mut md, "");
    md += &md_table(&bw_head, &bw_rows);
    push(&mut md, "");
    push(&mut md, "![bandwidth vs size](bandwidth.svg)");
    push(&mut md, "");

    // Plots.
    let series = |kind: &str, f: &dyn Fn(&crate::run::SizeResult) -> f64| -> Vec<Series> {
        res.runs
            .iter()
            .filter(|r| r.kind == kind)
            .filter_map(|r| {
                r.result.as_ref().map(|rr| Series {
                    label: r.label.clone(),
                    points: rr.results.iter().map(|x| (x.size as f64, f(x))).collect(),
                    dashed: false,
                })
            })
            .collect()
    };
    let mut lat = series("pingpong", &|x| x.lat_ns.p50 / 1e3);
    if let (Some(c), Some(l)) = (cl, res.limit.as_ref()) {
        let (lo, hi) = lat
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .fold((f64::MAX, 0f64), |(a, b), x| (a.min(x), b.max(x)));
        if hi > 0.0 {
            lat.push(Series {
                label: "limit: cache-line one-way p50, a line each way".into(),
                points: vec![(lo, c / 1e3), (hi, c / 1e3)],
                dashed: true,
            });
            lat.push(Series {
                label: "limit: futex hand-off one-way p50".into(),
                points: vec![
                    (lo, l.futex_one_way_ns.p50 / 1e3),
                    (hi, l.futex_one_way_ns.p50 / 1e3),
                ],
                dashed: true,
            });
        }
    }
    let mut bw = series("bw", &|x| x.mbytes_per_s);
    if let Some(l) = &res.limit {
        bw.push(Series {
            label: "limit: cross-core copy".into(),
            points: l
                .cross_core_copy
                .iter()
                .map(|x| (x.size as f64, x.mbytes_per_s))
                .collect(),
            dashed: true,
        });
        bw.push(Series {
            label: "limit: memcpy".into(),
            points: l
                .memcpy
                .iter()
                .map(|x| (x.size as f64, x.mbytes_per_s))
                .collect(),
            dashed: true,
        });
    }
    for (file, title, y, s) in [
        (
            "latency.svg",
            "One-way latency (p50) vs message size",
            "one-way latency (us)",
            &lat,
        ),
        (
            "bandwidth.svg",
            "Bandwidth vs message size",
            "bandwidth (MB/s)",
            &bw,
        ),
    ] {
        let p: PathBuf = out.join(file);
        if let Err(e) = report::plot(&p, title, y, s) {
            push(&mut text, format!("plot {file}: {e:#}"));
            push(&mut md, format!("(plot {file} failed: {e:#})"));
        }
    }

    match (&res.peers, &res.peers_skipped) {
        (Some(p), _) => {
            let (t, m) = crate::peers::render(p);
            push(&mut text, "");
            text += &t;
            md += &m;
        }
        (None, Some(why)) => {
            push(
                &mut md,
                "## Peers: uvia against UCX, libfabric, Open MPI and sockperf",
            );
            push(&mut md, "");
            push(&mut md, format!("Not measured: {why}."));
            push(&mut md, "");
            push(&mut text, format!("peers: not measured: {why}"));
        }
        (None, None) => {}
    }

    // Where the time goes.
    push(&mut md, "## MPI over uvia (source document 001, section 5)");
    push(&mut md, "");
    match (&res.mpi, &res.mpi_skipped) {
        (Some(study), _) => {
            push(&mut md, crate::mpi::ABOUT);
            push(&mut md, "");
            md += &crate::mpi::tables(study).1;
            push(&mut md, "");
            push(&mut md, "![MPI one-way latency by size](mpi-latency.svg)");
            push(&mut md, "");
            push(
                &mut md,
                "![MPI variants against native uvia](mpi-vs-native.svg)",
            );
        }
        (None, Some(why)) => push(&mut md, format!("Not measured: {why}")),
        (None, None) => {}
    }
    push(&mut md, "");
    push(&mut md, "## Where the time goes: anatomy by category");
    push(&mut md, "");
    push(&mut text, "");
    match (&res.anatomy, &res.anatomy_skipped) {
        (Some(c), _) => {
            push(&mut md, "`uvia anatomy --compare` from the build with checkpoints: each one-way message followed through the library's checkpoints and the kernel's tracepoints, its stages grouped as 000's Table III grouped UDP's and M-VIA's (docs/ANATOMY.md).");
            push(&mut md, "");
            md += &compare::markdown(c);
            push(&mut md, "");
            if c.plots.iter().any(|p| p == compare::STACKED_SVG) {
                push(
                    &mut md,
                    format!("![categories per provider]({})", compare::STACKED_SVG),
                );
                push(&mut md, "");
            }
            let lines: Vec<String> = c
                .columns
                .iter()
                .filter(|x| c.plots.contains(&compare::timeline_svg(&x.label)))
                .map(|x| format!("[{}]({})", x.label, compare::timeline_svg(&x.label)))
                .collect();
            if !lines.is_empty() {
                push(
                    &mut md,
                    format!(
                        "One message's stages on a time line (000's Figs. 3 and 9): {}.",
                        lines.join(", ")
                    ),
                );
                push(&mut md, "");
            }
            text += &compare::table(c);
        }
        (None, why) => {
            let why = why.clone().unwrap_or_default();
            push(&mut md, format!("Skipped: {why}."));
            push(&mut md, "");
            push(&mut text, format!("anatomy: skipped: {why}"));
        }
    }
    (text, md)
}
