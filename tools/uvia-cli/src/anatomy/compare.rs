//! `uvia anatomy --compare`: the anatomy of kernel UDP and of each uvia
//! provider at one size, category by category, as 000's Table III set UDP
//! beside M-VIA; with the categories stacked per provider and each
//! provider's message drawn on a time line (000's Figs. 3 and 9).

use super::plot::{self, Bar, Chart, StackedColumn};
use super::{categories, Anatomy, CATEGORIES};
use crate::report::{md_table, text_table};
use crate::run::Provider;
use anyhow::Result;
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A provider to measure, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    pub label: String,
    pub provider: Provider,
    /// Between two test hosts (network namespaces joined by a veth pair).
    pub netns: bool,
}

fn want(provider: Provider, netns: bool) -> Want {
    Want {
        label: if netns {
            format!("{} netns", provider.name())
        } else {
            provider.name().to_string()
        },
        provider,
        netns,
    }
}

/// The providers a comparison measures, and those it leaves out (with the
/// reason). Kernel UDP, shm and udp on this host; xdp runs only between
/// two test hosts, so where they can be made (root) xdp is measured there
/// beside kernel UDP on the same veth pair. With `--netns` (`netns`) every
/// network provider runs between the test hosts, and not being able to
/// make them is an error. `hosts` is whether they can be made.
pub fn wants(netns: bool, hosts: Result<(), String>) -> Result<(Vec<Want>, Vec<String>)> {
    use Provider::*;
    match (netns, hosts) {
        (true, Err(why)) => anyhow::bail!("--netns: {why}"),
        (true, Ok(())) => Ok((
            vec![
                want(KernelUdp, true),
                want(Shm, false),
                want(Udp, true),
                want(Xdp, true),
            ],
            Vec::new(),
        )),
        (false, Ok(())) => Ok((
            vec![
                want(KernelUdp, false),
                want(Shm, false),
                want(Udp, false),
                want(KernelUdp, true),
                want(Xdp, true),
            ],
            Vec::new(),
        )),
        (false, Err(why)) => Ok((
            vec![want(KernelUdp, false), want(Shm, false), want(Udp, false)],
            vec![format!("xdp (it runs between two test hosts): {why}")],
        )),
    }
}

/// One provider's column: its anatomy, or why there is none.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Column {
    pub label: String,
    pub provider: String,
    pub netns: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anatomy: Option<Anatomy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The JSON of `uvia anatomy --compare`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Compare {
    pub command: String,
    pub size: usize,
    pub pairs: usize,
    pub iters: usize,
    pub columns: Vec<Column>,
    /// Providers left out, with the reason.
    pub skipped: Vec<String>,
    /// The plots written (file names in the plot folder).
    #[serde(default)]
    pub plots: Vec<String>,
}

/// Measures each of `wants` with `measure` (which places it and runs its
/// anatomy, counting its pairs on the bar); a provider that fails is
/// reported in its column and the others go on.
pub fn run(
    wants: &[Want],
    skipped: Vec<String>,
    size: usize,
    pairs: usize,
    iters: usize,
    pb: &ProgressBar,
    measure: &mut dyn FnMut(&Want) -> Result<Anatomy>,
) -> Compare {
    let mut columns = Vec::new();
    for w in wants {
        pb.set_message(format!("anatomy of {}", w.label));
        let before = pb.position();
        let r = measure(w);
        // A provider that failed part-way still moves the bar past its pairs.
        pb.set_position(before + pairs as u64);
        let (anatomy, error) = match r {
            Ok(a) => (Some(a), None),
            Err(e) => {
                super::say(Some(pb), format!("anatomy of {}: failed: {e:#}", w.label));
                (None, Some(format!("{e:#}")))
            }
        };
        columns.push(Column {
            label: w.label.clone(),
            provider: w.provider.name().into(),
            netns: w.netns,
            anatomy,
            error,
        });
    }
    Compare {
        command: "anatomy --compare".into(),
        size,
        pairs,
        iters,
        columns,
        skipped,
        plots: Vec::new(),
    }
}

/// The comparison as rows: one column per provider, a row per category
/// (ns and the share of the stages' sum), then the sum, the untraced
/// one-way latency and their ratio.
pub fn rows(c: &Compare) -> (Vec<String>, Vec<Vec<String>>) {
    let mut head = vec!["category".to_string()];
    head.extend(c.columns.iter().map(|x| x.label.clone()));
    let cell = |x: &Column, f: &dyn Fn(&Anatomy) -> String| {
        x.anatomy.as_ref().map_or_else(|| "failed".to_string(), f)
    };
    let mut rows = Vec::new();
    for (k, cat) in CATEGORIES.iter().enumerate() {
        let mut r = vec![cat.to_string()];
        for x in &c.columns {
            r.push(cell(x, &|a| {
                let ns = categories(a)[k].1.max(0.0);
                format!("{ns:.0} ({:.1}%)", 100.0 * ns / a.sum_ns.max(1.0))
            }));
        }
        rows.push(r);
    }
    let mut add = |name: &str, f: &dyn Fn(&Anatomy) -> String| {
        let mut r = vec![name.to_string()];
        r.extend(c.columns.iter().map(|x| cell(x, f)));
        rows.push(r);
    };
    add("total: sum of the stages", &|a| format!("{:.0}", a.sum_ns));
    add("one-way latency, untraced (median of rounds)", &|a| {
        format!("{:.0}", a.one_way_ns)
    });
    add("sum / one-way (median of the rounds')", &|a| {
        format!("{:.2}", a.ratio)
    });
    add("messages followed", &|a| {
        format!("{} of {}", a.messages_kept, a.messages)
    });
    (head, rows)
}

fn header(c: &Compare) -> String {
    format!(
        "anatomy of a {} B one-way message by category, ns (share of the stages' sum); {} {} of an untraced, a checkpoints-only and a traced ping-pong of {} round trips per provider",
        c.size,
        c.pairs,
        if c.pairs == 1 { "round" } else { "rounds" },
        c.iters
    )
}

fn footer(c: &Compare) -> Vec<String> {
    let mut out = vec![
        "Figures are comparable within this run only: the machine is shared and its cores move; each provider's column is the median of its own rounds.".to_string(),
    ];
    for x in &c.columns {
        if let Some(e) = &x.error {
            out.push(format!("{}: failed: {e}", x.label));
        }
    }
    for s in &c.skipped {
        out.push(format!("not measured: {s}"));
    }
    out
}

/// The printed table.
pub fn table(c: &Compare) -> String {
    let (head, rows) = rows(c);
    let head: Vec<&str> = head.iter().map(|s| s.as_str()).collect();
    let mut s = header(c) + "\n";
    s += &text_table(&head, &rows);
    for l in footer(c) {
        s += &l;
        s.push('\n');
    }
    for p in &c.plots {
        s += &format!("plot: {p}\n");
    }
    s
}

/// The table in markdown (for the bench report).
pub fn markdown(c: &Compare) -> String {
    let (head, rows) = rows(c);
    let head: Vec<&str> = head.iter().map(|s| s.as_str()).collect();
    let mut s = header(c) + ".\n\n";
    s += &md_table(&head, &rows);
    s.push('\n');
    for l in footer(c) {
        s += &format!("- {l}\n");
    }
    s
}

/// The file of the stacked categories.
pub const STACKED_SVG: &str = "anatomy-categories.svg";

/// The file of a provider's time line.
pub fn timeline_svg(label: &str) -> String {
    format!("anatomy-timeline-{}.svg", label.replace(' ', "-"))
}

/// The rows and bars of a message's time line: its stages' medians laid
/// end to end from the send call, on the sender's row (its CPU, where on
/// loopback the receive softirq runs too) or the receiver's.
pub fn timeline_bars(a: &Anatomy) -> (Vec<String>, Vec<Bar>, Vec<String>) {
    let rows = vec![
        "sender (its CPU)".to_string(),
        "receiver (its CPU)".to_string(),
    ];
    let mut bars = Vec::new();
    let mut notes = Vec::new();
    let mut t = 0.0;
    for (i, s) in a.stages.iter().enumerate() {
        let end = t + s.ns.max(0.0);
        bars.push(Bar {
            row: if s.side == "send" { 0 } else { 1 },
            start: t,
            end,
            color: plot::category_color(&s.category),
            text: Some(format!("t{}", i + 1)),
        });
        notes.push(format!(
            "t{}: {} ({}), {:.0} ns",
            i + 1,
            s.name,
            s.category,
            s.ns
        ));
        t = end;
    }
    notes.push(format!(
        "Each stage's median over {} messages, laid end to end: {:.0} ns in all; the untraced one-way latency was {:.0} ns.",
        a.messages_kept, a.sum_ns, a.one_way_ns
    ));
    (rows, bars, notes)
}

/// Writes the stacked categories and each provider's time line into
/// `dir`; returns the files written and the failures.
pub fn plots(c: &Compare, dir: &Path) -> (Vec<String>, Vec<String>) {
    let (mut done, mut failed) = (Vec::new(), Vec::new());
    let measured: Vec<(&str, &Anatomy)> = c
        .columns
        .iter()
        .filter_map(|x| Some((x.label.as_str(), x.anatomy.as_ref()?)))
        .collect();
    let cats: Vec<Vec<(String, f64)>> = measured.iter().map(|(_, a)| categories(a)).collect();
    let cols: Vec<StackedColumn> = measured
        .iter()
        .zip(&cats)
        .map(|((label, a), cats)| StackedColumn {
            label,
            categories: cats,
            one_way_ns: a.one_way_ns,
        })
        .collect();
    let title = format!(
        "Where a {} B one-way message's time goes, by category",
        c.size
    );
    match plot::stacked(&dir.join(STACKED_SVG), &title, &cols) {
        Ok(()) => done.push(STACKED_SVG.to_string()),
        Err(e) => failed.push(format!("{STACKED_SVG}: {e:#}")),
    }
    let legend: Vec<(String, plotters::style::RGBColor)> = CATEGORIES
        .iter()
        .map(|c| (c.to_string(), plot::category_color(c)))
        .collect();
    for x in &c.columns {
        let Some(a) = &x.anatomy else { continue };
        let file = timeline_svg(&x.label);
        let (rows, bars, notes) = timeline_bars(a);
        let title = format!(
            "{}: one {} B message from the send call to the receiver's return",
            x.label, c.size
        );
        let r = plot::chart(
            &dir.join(&file),
            &Chart {
                title: &title,
                rows: &rows,
                bars: &bars,
                legend: &legend,
                notes: &notes,
            },
        );
        match r {
            Ok(()) => done.push(file),
            Err(e) => failed.push(format!("{file}: {e:#}")),
        }
    }
    (done, failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::anatomy::StageOut;

    fn stage(category: &str, side: &str, ns: f64) -> StageOut {
        StageOut {
            name: format!("a {category} stage"),
            from: "a".into(),
            to: "b".into(),
            category: category.into(),
            side: side.into(),
            ns,
            cycles: ns * 2.0,
            measured: true,
        }
    }

    pub(crate) fn anatomy(provider: &str, stages: Vec<StageOut>) -> Anatomy {
        let sum = stages.iter().map(|s| s.ns).sum();
        Anatomy {
            provider: provider.into(),
            size: 1,
            one_way_ns: 1000.0,
            traced_one_way_ns: 1100.0,
            marks_one_way_ns: 1050.0,
            sum_ns: sum,
            pair_ratios: vec![1.0],
            ratio: 1.0,
            stages,
            messages_kept: 10,
            messages: 10,
            mark_cost_ns: 10.0,
            mark_path_cost_ns: 8.0,
            syscall_event_cost_ns: 100.0,
            kernel_event_cost_ns: 80.0,
            kernel_events_per_message: 2.0,
            kernel_events_path_ns: 50.0,
            missing: Vec::new(),
        }
    }

    fn compare() -> Compare {
        let udp = anatomy(
            "kernel-udp",
            vec![
                stage("OS overhead (send)", "send", 200.0),
                stage("protocol processing (send)", "send", 1400.0),
                stage("protocol processing (send)", "send", 200.0),
                stage("data movement", "send", 250.0),
                stage("OS overhead (recv)", "recv", 900.0),
                stage("user application", "recv", 50.0),
            ],
        );
        let shm = anatomy(
            "shm",
            vec![
                stage("protocol processing (send)", "send", 40.0),
                stage("user application", "recv", 30.0),
                stage("protocol processing (recv)", "recv", 30.0),
            ],
        );
        let col = |label: &str, a: Option<Anatomy>| Column {
            label: label.into(),
            provider: label.into(),
            netns: false,
            error: a.is_none().then(|| "it broke".to_string()),
            anatomy: a,
        };
        Compare {
            command: "anatomy --compare".into(),
            size: 1,
            pairs: 1,
            iters: 10,
            columns: vec![
                col("kernel-udp", Some(udp)),
                col("shm", Some(shm)),
                col("udp", None),
            ],
            skipped: vec!["xdp: no test hosts".into()],
            plots: Vec::new(),
        }
    }

    #[test]
    fn one_column_per_provider_and_categories_sum_to_the_stages() {
        let c = compare();
        let (head, rows) = rows(&c);
        assert_eq!(head, ["category", "kernel-udp", "shm", "udp"]);
        assert!(rows.iter().all(|r| r.len() == head.len()));
        // The six categories, then the sum.
        let names: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
        assert_eq!(names[..6], CATEGORIES);
        assert_eq!(names[6], "total: sum of the stages");
        for (k, x) in c.columns.iter().enumerate() {
            let Some(a) = &x.anatomy else {
                assert!(rows.iter().all(|r| r[k + 1] == "failed"));
                continue;
            };
            let cats: f64 = rows[..6]
                .iter()
                .map(|r| r[k + 1].split(' ').next().unwrap().parse::<f64>().unwrap())
                .sum();
            let stages: f64 = a.stages.iter().map(|s| s.ns).sum();
            assert_eq!(cats, stages);
            assert_eq!(rows[6][k + 1], format!("{stages:.0}"));
        }
        // Two protocol (send) stages of kernel UDP are one category: 1600 of 3000.
        assert_eq!(rows[1][1], "1600 (53.3%)");
        let t = table(&c);
        assert!(t.contains("udp: failed: it broke"), "{t}");
        assert!(t.contains("not measured: xdp"), "{t}");
        let md = markdown(&c);
        assert!(md.contains("| category | kernel-udp | shm | udp |"), "{md}");
    }

    #[test]
    fn xdp_joins_only_where_test_hosts_can_be_made() {
        let labels = |w: &[Want]| w.iter().map(|x| x.label.clone()).collect::<Vec<_>>();
        let (w, skipped) = wants(false, Err("needs root".into())).unwrap();
        assert_eq!(labels(&w), ["kernel-udp", "shm", "udp"]);
        assert!(skipped[0].contains("needs root"));
        let (w, skipped) = wants(false, Ok(())).unwrap();
        assert_eq!(
            labels(&w),
            ["kernel-udp", "shm", "udp", "kernel-udp netns", "xdp netns"]
        );
        assert!(skipped.is_empty());
        let (w, _) = wants(true, Ok(())).unwrap();
        assert_eq!(
            labels(&w),
            ["kernel-udp netns", "shm", "udp netns", "xdp netns"]
        );
        assert!(w.iter().all(|x| x.netns != (x.provider == Provider::Shm)));
        let e = wants(true, Err("needs root".into())).unwrap_err();
        assert!(e.to_string().contains("--netns: needs root"), "{e}");
    }

    #[test]
    fn a_time_line_lays_the_stages_end_to_end_on_their_sides() {
        let c = compare();
        let a = c.columns[0].anatomy.as_ref().unwrap();
        let (rows, bars, notes) = timeline_bars(a);
        assert_eq!(rows.len(), 2);
        assert_eq!(bars.len(), a.stages.len());
        for w in bars.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        assert_eq!(bars.last().unwrap().end, a.sum_ns);
        assert_eq!(bars[0].row, 0);
        assert_eq!(bars[4].row, 1);
        assert!(notes[1].starts_with("t2: a protocol processing (send) stage"));
    }

    #[test]
    fn plots_are_written_for_each_provider_measured() {
        let dir = std::env::temp_dir().join(format!("uvia-compare-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (done, failed) = plots(&compare(), &dir);
        assert!(failed.is_empty(), "{failed:?}");
        assert_eq!(
            done,
            [
                STACKED_SVG,
                "anatomy-timeline-kernel-udp.svg",
                "anatomy-timeline-shm.svg"
            ]
        );
        for f in &done {
            assert!(dir.join(f).exists());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
