//! `uvia bench`: the main job.
//!
//! 1. The physical limits (`limit`).
//! 2. Every provider and mode, ping-pong and bandwidth, each measurement in
//!    its own client process (`uvia pingpong|bw ... --json FILE`, which starts
//!    its own server), under a time limit: a provider that fails or hangs is
//!    reported as failed with its error and the others go on.
//! 3. The headline comparisons, measured in short interleaved rounds (contender,
//!    baseline, contender, baseline, ...) so that both see the same state of a
//!    noisy host; each pair gives a ratio and the headline is the median ratio.
//!    The xdp provider's run between two test hosts made for each measurement
//!    (root only; otherwise reported as skipped, with the reason).
//! 4. Where the time goes: `uvia anatomy --compare` from the build with
//!    checkpoints (built first, except with --quick, which takes the one
//!    there is; skipped with the reason without it or without root), its
//!    table and plots in the report.
//! 5. The peers (`uvia peers`: UCX, libfabric, Open MPI and sockperf by
//!    their own tools, interleaved with the matching uvia run): with
//!    --peers, or in a full bench whenever a peer is installed.
//! 6. The report folder: report.md, results.json, latency.svg, bandwidth.svg,
//!    peers-latency.svg, peers-bandwidth.svg, anatomy-categories.svg and
//!    anatomy-timeline-<provider>.svg.
//!
//! This module runs the sections in turn; `rows` holds the comparisons of
//! each provider, `child` runs each measurement in a process of its own,
//! `pairs` interleaves a contender with its baseline and makes the
//! headline rows, `anatomy` the rows from the build with checkpoints, and
//! `render` the printed summary, the report and its plots.

use crate::anatomy::compare::Compare;
use crate::limit::{self, LimitResult};
use crate::run::RunResult;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::ProgressBar;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod anatomy;
mod child;
mod pairs;
mod render;
mod rows;

use anatomy::{anatomy_compare, anatomy_streams, traced_build};
pub(crate) use child::{measure, progress_style, sub, sub_json};
pub(crate) use pairs::{headline_rows, headline_text, interleave, placement_note, Headline};

/// One provider/mode configuration.
#[derive(Clone, Copy)]
struct Config {
    provider: &'static str,
    /// CLI flag selecting the mode.
    flag: &'static str,
    /// Label in tables and plots.
    label: &'static str,
}

const CONFIGS: [Config; 8] = [
    Config {
        provider: "shm",
        flag: "--polling",
        label: "shm polling",
    },
    Config {
        provider: "shm",
        flag: "--blocking",
        label: "shm blocking",
    },
    Config {
        provider: "udp",
        flag: "--polling",
        label: "udp polling",
    },
    Config {
        provider: "udp",
        flag: "--blocking",
        label: "udp blocking",
    },
    Config {
        provider: "kernel-udp",
        flag: "--busy-poll",
        label: "kernel-udp busy-poll",
    },
    Config {
        provider: "kernel-udp",
        flag: "--blocking",
        label: "kernel-udp blocking",
    },
    Config {
        provider: "kernel-tcp",
        flag: "--polling",
        label: "kernel-tcp polling",
    },
    Config {
        provider: "kernel-tcp",
        flag: "--blocking",
        label: "kernel-tcp blocking",
    },
];

const UDP_BP: &str = "kernel-udp busy-poll";

#[derive(Serialize)]
struct RunEntry {
    label: String,
    provider: String,
    mode: String,
    kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<RunResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Serialize)]
struct Blocked {
    label: String,
    interval_us: u64,
    receiver_cpu: Option<f64>,
    one_way_p50_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Serialize)]
struct BenchResult {
    command: String,
    quick: bool,
    limit: Option<LimitResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit_error: Option<String>,
    headline: Vec<Headline>,
    blocked_receiver: Vec<Blocked>,
    runs: Vec<RunEntry>,
    /// `uvia anatomy --compare` from the build with checkpoints, or why
    /// there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    anatomy: Option<Compare>,
    #[serde(skip_serializing_if = "Option::is_none")]
    anatomy_skipped: Option<String>,
    /// `uvia mpi`: source document 001's study with real MPIs, or why
    /// there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    mpi: Option<crate::mpi::Study>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mpi_skipped: Option<String>,
    /// `uvia peers`: UCX, libfabric, Open MPI and sockperf against uvia,
    /// or why the section did not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    peers: Option<crate::peers::PeersResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    peers_skipped: Option<String>,
}

fn args(kind: &str, c: &Config, sizes: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec![
        kind.into(),
        "--provider".into(),
        c.provider.into(),
        c.flag.into(),
        "--sizes".into(),
        sizes.into(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// The ping-pong table's rows of the runs between two test hosts.
const TWO_HOSTS: &str = ", two test hosts";
const NETNS_XDP: &str = "xdp polling, two test hosts";
const NETNS_UDP_BP: &str = "kernel-udp busy-poll, two test hosts";

fn first(r: &RunResult) -> Result<&crate::run::SizeResult> {
    r.results.first().ok_or_else(|| anyhow!("no result"))
}

fn cfg(label: &str) -> &'static Config {
    CONFIGS
        .iter()
        .find(|c| c.label == label)
        .expect("known configuration")
}

/// Whether the peers section runs: asked for, or a full bench with at
/// least one peer installed; otherwise the reason it does not.
fn peers_wanted(quick: bool, asked: bool) -> std::result::Result<(), String> {
    if asked {
        return Ok(());
    }
    if quick {
        return Err("not part of --quick (add --peers)".into());
    }
    if crate::peers::any_installed() {
        Ok(())
    } else {
        Err(format!(
            "no peer installed ({}; scripts/bench installs them as root)",
            crate::peers::PACKAGES
        ))
    }
}

/// Pairs of the goodput comparison at 5% loss in the full bench, at
/// least: its target is set on the worst of seven as well as on their
/// median, and where a run's losses fall decides more than in a lossless
/// run.
const LOSS_PAIRS: usize = 7;

/// Pairs of the goodput comparison at 1% loss in the full bench, at least.
/// Its line (0.95x) sits a few hundredths under what the loss costs, and
/// each pair's ratio moves with where a run's few losses fall: more pairs
/// make each matter less. (Each pair is one run of a lossy connection and
/// its lossless twin, batches alternated: when the two were separate runs,
/// this host's changes of a stream's speed every few seconds spoiled
/// about half the pairs, at 0.5x or 2x.)
const LIGHT_LOSS_PAIRS: usize = 15;

/// Pairs of a goodput-at-loss comparison with at least `least` in the
/// full bench ([`LOSS_PAIRS`], [`LIGHT_LOSS_PAIRS`]): `pairs`, or more.
fn loss_pairs(quick: bool, pairs: usize, least: usize) -> usize {
    if quick {
        pairs
    } else {
        pairs.max(least)
    }
}

pub fn bench(quick: bool, out: &Path, pairs: usize, with_peers: bool) -> Result<()> {
    if pairs == 0 {
        bail!("--pairs must be at least 1");
    }
    let peer_opts = crate::peers::Options {
        quick,
        pairs,
        only: Vec::new(),
    };
    let peers_go = peers_wanted(quick, with_peers);
    std::fs::create_dir_all(out)
        .with_context(|| format!("creating the report folder {}", out.display()))?;
    let sizes = if quick {
        "8,1K,64K,1M"
    } else {
        crate::DEFAULT_SIZES
    };
    let scale = if quick { "0.05" } else { "1" };
    let timeout = Duration::from_secs(if quick { 60 } else { 300 });
    let mpi_rounds = crate::mpi::rounds(pairs);
    let scale_pairs = if quick { 1 } else { pairs };
    let stream_runs = if quick { 1 } else { 3 };
    let total = 1
        + CONFIGS.len() as u64 * 2
        // Headlines: shm 4, udp 4 and the 2 at loss, xdp 4, the
        // libfabric provider 6; and the scale runs, shm and udp.
        + (12 + 6) * pairs as u64
        + (loss_pairs(quick, pairs, LOSS_PAIRS) + loss_pairs(quick, pairs, LIGHT_LOSS_PAIRS)) as u64
        + 2 * scale_pairs as u64
        + 2 * stream_runs as u64
        + (mpi_rounds * crate::mpi::steps_per_round()) as u64
        + 3
        + 1
        + if peers_go.is_ok() {
            crate::peers::planned(&peer_opts)
        } else {
            0
        };
    let pb = ProgressBar::new(total);
    pb.set_style(progress_style());
    pb.enable_steady_tick(Duration::from_millis(200));

    // 1. Limits.
    pb.set_message("physical limits");
    let (limit, limit_error) = match limit::run_all(quick) {
        Ok(l) => (Some(l), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    pb.inc(1);

    // 2. Every provider and mode.
    let run = rows::Run {
        pb: &pb,
        quick,
        pairs,
        timeout,
    };
    let mut runs = rows::every_provider(&run, sizes, scale);

    // 3. Headlines, interleaved.
    let mut headline = rows::shm(&run);
    headline.extend(rows::udp(&run));
    headline.extend(rows::loss(&run));
    headline.extend(rows::xdp(&run, &mut runs));

    // Many connected VIs (`uvia scale`): a pair of runs per provider in
    // the quick bench, `pairs` in the full one.
    headline.extend(crate::scale::headlines(&pb, scale_pairs, timeout));

    // The libfabric provider under libfabric's own ping-pong, against
    // libfabric's native providers and uvia's own tools.
    headline.extend(crate::fabric::headlines(&pb, quick, pairs, timeout));

    // MPI over uvia: source document 001's study with real MPIs.
    let mpich = std::env::var_os("UVIA_MPICH").map(PathBuf::from);
    let (mpi, mpi_skipped) = match crate::mpi::run_study(&pb, quick, mpi_rounds, mpich.as_deref()) {
        Ok(study) => {
            headline.extend(study.headline.iter().cloned());
            if let Err(e) = crate::mpi::plots(&study, out) {
                pb.println(format!("mpi: plots: {e:#}"));
            }
            (Some(study), None)
        }
        Err(why) => {
            pb.inc((mpi_rounds * crate::mpi::steps_per_round()) as u64);
            (None, Some(format!("{why:#}")))
        }
    };

    // The peers: UCX, libfabric, Open MPI and sockperf, each by its own
    // tool, interleaved with the matching uvia run.
    let (peers, peers_skipped) = match &peers_go {
        Ok(()) => {
            let r = crate::peers::run_all(&pb, &peer_opts, timeout);
            headline.extend(r.headline.iter().cloned());
            if let Err(e) = crate::peers::plots(&r, out) {
                pb.println(format!("peers: plots: {e:#}"));
            }
            (Some(r), None)
        }
        Err(why) => (None, Some(why.clone())),
    };

    // Blocked receiver: a paced ping-pong (one round trip per millisecond) in
    // blocking mode; the server spends nearly all its time waiting.
    let blocked = rows::blocked_receivers(&run);

    // Where the time goes: the anatomy comparison, from a build with
    // checkpoints.
    pb.set_message("anatomy: kernel UDP and uvia's providers, category by category");
    // The build with checkpoints both parts below run, or why there is none.
    // SAFETY: geteuid has no preconditions.
    let traced = if unsafe { libc::geteuid() } != 0 {
        Err("the kernel's tracepoints need root".to_string())
    } else {
        traced_build(quick, &pb)
    };
    let (anatomy, anatomy_skipped) = match anatomy_compare(&traced, quick, out, &pb) {
        Ok(c) => (Some(c), None),
        Err(why) => {
            pb.println(format!("anatomy: skipped: {why}"));
            (None, Some(why))
        }
    };
    pb.inc(1);
    // Streams through the udp provider against the bound of two CPUs.
    headline.extend(anatomy_streams(&traced, quick, stream_runs, out, &pb));
    pb.finish_and_clear();

    let res = BenchResult {
        command: "bench".into(),
        quick,
        limit,
        limit_error,
        headline,
        blocked_receiver: blocked,
        runs,
        anatomy,
        anatomy_skipped,
        mpi,
        mpi_skipped,
        peers,
        peers_skipped,
    };
    let json = serde_json::to_string_pretty(&res)? + "\n";
    std::fs::write(out.join("results.json"), json)
        .with_context(|| format!("writing {}", out.join("results.json").display()))?;
    let (text, md) = render::render(&res, out);
    std::fs::write(out.join("report.md"), md)
        .with_context(|| format!("writing {}", out.join("report.md").display()))?;
    out!("{text}");
    outln!("\nreport: {}", out.join("report.md").display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goodput_at_loss_takes_seven_pairs_at_least_at_5_percent_and_fifteen_at_1() {
        assert_eq!(loss_pairs(false, 5, LOSS_PAIRS), 7);
        assert_eq!(loss_pairs(false, 9, LOSS_PAIRS), 9);
        assert_eq!(loss_pairs(false, 5, LIGHT_LOSS_PAIRS), 15);
        assert_eq!(loss_pairs(false, 20, LIGHT_LOSS_PAIRS), 20);
        // The quick bench keeps what it was given.
        assert_eq!(loss_pairs(true, 5, LOSS_PAIRS), 5);
        assert_eq!(loss_pairs(true, 1, LIGHT_LOSS_PAIRS), 1);
    }
}
