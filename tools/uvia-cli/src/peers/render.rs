//! The peers' tables and plots.

use super::analyse::{against_bare, difference, form_name};
use super::defs::peers;
use super::defs::{Form, Medium, Stat};
use super::{Comparison, PeersResult};
use crate::report::{fmt_ns, md_table, push, text_table, Series};
use crate::size::human;
use crate::stats::median;
use anyhow::Result;
use std::path::Path;

fn fmt_val(v: Option<f64>, unit: &str) -> String {
    match v {
        Some(v) if unit == "ns" => fmt_ns(v),
        Some(v) => format!("{v:.0} MB/s"),
        None => "-".into(),
    }
}

/// How a comparison ends for uvia.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Wins,
    /// The median pair is even: the two figures in one step of the clock,
    /// or of the peer's print.
    Ties,
    Loses,
}

/// Whether uvia wins a comparison (lower time, higher bandwidth).
fn outcome(c: &Comparison) -> Option<Outcome> {
    c.ratio.map(|r| {
        let better = if c.form == Form::Latency {
            r < 1.0
        } else {
            r > 1.0
        };
        match (better, r == 1.0) {
            (_, true) => Outcome::Ties,
            (true, false) => Outcome::Wins,
            (false, false) => Outcome::Loses,
        }
    })
}

/// The peers table: one row per comparison.
pub fn table_rows(res: &PeersResult) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let head = vec![
        "peer",
        "medium",
        "form",
        "size",
        "stat",
        "uvia (median)",
        "peer (median)",
        "uvia / peer (median of pairs)",
        "pair range",
        "uvia wins",
    ];
    let rows = res
        .comparisons
        .iter()
        .map(|c| {
            let range = if c.pairs.is_empty() {
                "-".into()
            } else {
                let rs: Vec<f64> = c.pairs.iter().map(|p| p.ratio).collect();
                let lo = rs.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = rs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                format!("{lo:.2}-{hi:.2}")
            };
            let (ratio, wins) = match (&c.error, c.ratio) {
                (Some(e), None) => (e.clone(), "-".into()),
                (_, Some(r)) => (
                    format!("{r:.2}x"),
                    match outcome(c) {
                        Some(Outcome::Wins) => "yes".into(),
                        Some(Outcome::Ties) => "even".into(),
                        Some(Outcome::Loses) => "NO".into(),
                        None => "-".into(),
                    },
                ),
                (None, None) => ("-".into(), "-".into()),
            };
            vec![
                c.peer.clone(),
                format!("{:?}", c.medium).to_lowercase(),
                form_name(c.form).into(),
                human(c.size),
                if c.form == Form::Latency {
                    c.stat.name().into()
                } else {
                    // Bandwidth: bytes over the run's time.
                    match c.stat {
                        Stat::BestMean => "bytes/time, best of 3".into(),
                        _ => "bytes/time".into(),
                    }
                },
                fmt_val(c.uvia_median, &c.unit),
                fmt_val(c.peer_median, &c.unit),
                ratio,
                range,
                wins,
            ]
        })
        .collect();
    (head, rows)
}

/// How the section was measured, for the report.
pub const ABOUT: &str = "Each peer is measured by its own tool, its two processes pinned to cores 0 and 1 (NetPIPE: `mpirun --bind-to core`), interleaved with the matching uvia run (shm for the shared-memory peers, udp at reliable delivery for the loopback ones): uvia, peer, uvia, peer, ... The ratio is uvia / peer per pair and the table gives the median of the pair ratios and their range; below 1 uvia is faster for latency, above 1 uvia moves more for bandwidth. Each pair compares the same statistic: the one-way median where the tool reports one (ucx_perftest, sockperf), else the mean (fi_pingpong; NetPIPE reports the lowest of three trials' means, so its uvia pair is the lowest of three runs' means, for latency and bandwidth alike); streamed bandwidth (ucx_perftest's bandwidth tests) against `uvia bw`, ping-pong bandwidth (size / one-way mean) against `uvia pingpong`. MB/s are 10^6 B/s (ucx_perftest's MiB/s are converted). Against ucx_perftest and sockperf, which print microseconds with three decimals, uvia's latency is given to the whole nanosecond too, so that two figures the peer's print cannot tell apart compare equal. sockperf cannot send fewer than 14 B, so its latency (and its uvia pair) is at 14 B. Every peer's two sides poll, as uvia's do: sockperf runs with `--nonblocked` (by default it sleeps in `epoll_wait`, and each message pays a wake-up).";

/// The section as text and markdown.
pub fn render(res: &PeersResult) -> (String, String) {
    let mut text = String::new();
    let mut md = String::new();
    let (head, rows) = table_rows(res);
    let (hh, hrows) = crate::bench::headline_rows(&res.headline);
    push(&mut text, "Peers: the issue's comparisons");
    text += &text_table(
        &hh[..5],
        &hrows.iter().map(|r| r[..5].to_vec()).collect::<Vec<_>>(),
    );
    if let Some(note) = &res.placement {
        push(&mut text, note);
    }
    push(&mut text, "");
    push(
        &mut text,
        "Peers: every comparison (uvia / peer; median of interleaved pairs)",
    );
    text += &text_table(&head, &rows);
    let peer_rows: Vec<Vec<String>> = res
        .peers
        .iter()
        .map(|p| {
            vec![
                p.name.clone(),
                p.tool.clone(),
                p.version.clone().unwrap_or_else(|| "-".into()),
                p.missing
                    .clone()
                    .map(|m| format!("MISSING: {m}"))
                    .unwrap_or_else(|| "installed".into()),
            ]
        })
        .collect();
    push(&mut text, "");
    text += &text_table(&["peer", "tool", "version", "status"], &peer_rows);
    let losses: Vec<String> = res
        .comparisons
        .iter()
        .filter(|c| outcome(c) == Some(Outcome::Loses))
        .map(|c| {
            let mut l = format!(
                "{} {} {}: uvia {} vs {} (x{:.2})",
                c.peer,
                form_name(c.form),
                human(c.size),
                fmt_val(c.uvia_median, &c.unit),
                fmt_val(c.peer_median, &c.unit),
                c.ratio.unwrap_or(f64::NAN)
            );
            if let Some(d) = difference(c) {
                l += &format!(": {d}");
            }
            l
        })
        .collect();
    let failed: Vec<String> = res
        .comparisons
        .iter()
        .filter_map(|c| {
            c.error
                .as_ref()
                .map(|e| format!("{} {} {}: {e}", c.peer, form_name(c.form), human(c.size)))
        })
        .collect();

    push(
        &mut md,
        "## Peers: uvia against UCX, libfabric, Open MPI and sockperf",
    );
    push(&mut md, "");
    push(&mut md, ABOUT);
    push(&mut md, "");
    md += &md_table(&hh, &hrows);
    push(&mut md, "");
    if let Some(note) = &res.placement {
        push(&mut md, note);
        push(&mut md, "");
    }
    md += &md_table(&head, &rows);
    push(&mut md, "");
    push(
        &mut md,
        "![peers: one-way latency by size](peers-latency.svg)",
    );
    push(&mut md, "");
    push(&mut md, "![peers: bandwidth by size](peers-bandwidth.svg)");
    push(&mut md, "");
    push(&mut md, "### The peers");
    push(&mut md, "");
    md += &md_table(&["peer", "tool", "version", "status"], &peer_rows);
    push(&mut md, "");
    push(&mut md, "### Where uvia loses");
    push(&mut md, "");
    if losses.is_empty() {
        push(&mut md, "Nowhere in this run.");
        push(&mut text, "\nuvia loses: nowhere in this run");
    } else {
        push(&mut text, "\nuvia loses:");
        for l in &losses {
            push(&mut md, format!("- {l}"));
            push(&mut text, format!("  {l}"));
        }
    }
    push(&mut md, "");
    if let Some(f) = &res.bare {
        let lines = against_bare(&res.comparisons, f);
        let head = format!(
            "The bare exchange on these cores: {:.0} ns one way at the run's start, {:.0} at \
             its end (`uvia limit`'s cache-line ping-pong, a line each way watched with uvia's \
             wait between looks: uvia's one-sided shared-memory path with no work of its own; a \
             peer whose wait loop differs may read below it). At 8 B, against the lower \
             reading:",
            f.start_ns, f.end_ns
        );
        if !lines.is_empty() {
            push(&mut md, "### Against the bare exchange");
            push(&mut md, "");
            push(&mut md, &head);
            push(&mut md, "");
            push(&mut text, format!("\n{head}"));
            for l in &lines {
                push(&mut md, format!("- {l}"));
                push(&mut text, format!("  {l}"));
            }
            push(&mut md, "");
        }
    }
    if !failed.is_empty() {
        push(&mut md, "### Not measured or failed");
        push(&mut md, "");
        push(&mut text, "\nnot measured or failed:");
        for f in &failed {
            push(&mut md, format!("- {f}"));
            push(&mut text, format!("  {f}"));
        }
        push(&mut md, "");
    }
    push(&mut md, "### Commands");
    push(&mut md, "");
    push(
        &mut md,
        "One line per comparison: the peer's, then the uvia run it is paired with.",
    );
    push(&mut md, "");
    push(&mut md, "```");
    for c in &res.comparisons {
        push(&mut md, &c.peer_command);
        push(&mut md, format!("  paired with: {}", c.uvia_command));
    }
    push(&mut md, "```");
    push(&mut md, "");
    (text, md)
}

/// The two plots: one-way latency and bandwidth by size, uvia (the median
/// over its pairs at each size) and each peer.
pub fn plots(res: &PeersResult, dir: &Path) -> Result<()> {
    for (file, title, y, lat) in [
        (
            "peers-latency.svg",
            "uvia and its peers: one-way latency by size",
            "one-way latency (us)",
            true,
        ),
        (
            "peers-bandwidth.svg",
            "uvia and its peers: bandwidth by size",
            "bandwidth (MB/s)",
            false,
        ),
    ] {
        let scale = if lat { 1e-3 } else { 1.0 };
        let mut series: Vec<Series> = Vec::new();
        let chosen: Vec<&Comparison> = res
            .comparisons
            .iter()
            .filter(|c| (c.form == Form::Latency) == lat && c.peer_median.is_some())
            .collect();
        // uvia's lines: one per medium and form, the median over its pairs.
        for medium in [Medium::Shm, Medium::Loopback] {
            for form in [Form::Latency, Form::Stream, Form::PingpongBw] {
                let mut pts: Vec<(f64, f64)> = Vec::new();
                let mut sizes: Vec<usize> = chosen
                    .iter()
                    .filter(|c| c.medium == medium && c.form == form)
                    .map(|c| c.size)
                    .collect();
                sizes.sort();
                sizes.dedup();
                for s in sizes {
                    let v: Vec<f64> = chosen
                        .iter()
                        .filter(|c| c.medium == medium && c.form == form && c.size == s)
                        .flat_map(|c| c.pairs.iter().map(|p| p.uvia))
                        .collect();
                    pts.push((s as f64, median(&v) * scale));
                }
                if !pts.is_empty() {
                    series.push(Series {
                        label: format!(
                            "uvia {} ({})",
                            if medium == Medium::Shm { "shm" } else { "udp" },
                            form_name(form)
                        ),
                        points: pts,
                        dashed: false,
                    });
                }
            }
        }
        for p in peers() {
            for form in [Form::Latency, Form::Stream, Form::PingpongBw] {
                let pts: Vec<(f64, f64)> = chosen
                    .iter()
                    .filter(|c| c.peer == p.name && c.form == form)
                    .map(|c| (c.size as f64, c.peer_median.unwrap_or(f64::NAN) * scale))
                    .collect();
                if !pts.is_empty() {
                    series.push(Series {
                        label: if lat {
                            p.name.to_string()
                        } else {
                            format!("{} ({})", p.name, form_name(form))
                        },
                        points: pts,
                        dashed: true,
                    });
                }
            }
        }
        if series.is_empty() {
            continue;
        }
        crate::report::plot(&dir.join(file), title, y, &series)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_ratio(form: Form, ratio: f64) -> Comparison {
        Comparison {
            peer: "ucx-uct-put".into(),
            medium: Medium::Shm,
            form,
            size: 8,
            stat: Stat::P50,
            unit: "ns".into(),
            iters: 1,
            peer_command: String::new(),
            uvia_command: String::new(),
            pairs: Vec::new(),
            uvia_median: None,
            peer_median: None,
            ratio: Some(ratio),
            error: None,
        }
    }

    #[test]
    fn an_even_pair_is_neither_a_win_nor_a_loss() {
        let lat = |r| outcome(&with_ratio(Form::Latency, r));
        assert_eq!(lat(0.9), Some(Outcome::Wins));
        assert_eq!(lat(1.0), Some(Outcome::Ties));
        assert_eq!(lat(1.001), Some(Outcome::Loses));
        let bw = |r| outcome(&with_ratio(Form::Stream, r));
        assert_eq!(bw(1.2), Some(Outcome::Wins));
        assert_eq!(bw(1.0), Some(Outcome::Ties));
        assert_eq!(bw(0.8), Some(Outcome::Loses));
        let mut none = with_ratio(Form::Latency, 1.0);
        none.ratio = None;
        assert_eq!(outcome(&none), None);
    }
}
