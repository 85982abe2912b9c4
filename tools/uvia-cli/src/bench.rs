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

use crate::anatomy::compare::{self, Compare};
use crate::limit::{self, LimitResult};
use crate::report::{self, fmt_ns, fmt_pct, md_table, push, text_table, Series};
use crate::run::RunResult;
use crate::size::human;
use crate::stats::{median, Stats};
use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

#[derive(Serialize, Clone)]
struct Pair {
    contender: f64,
    baseline: f64,
    ratio: f64,
    /// The cores' cache-line one-way (ns) read before the contender,
    /// between the two and after the baseline ([`crate::placement`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    line_ns: Option<[f64; 3]>,
    /// Times the pair was measured: more than once where the host moved
    /// the cores during it.
    tries: usize,
}

impl Pair {
    /// Whether the host moved the cores during the measurement kept.
    fn moved(&self) -> bool {
        self.line_ns.is_some_and(|l| crate::placement::moved(&l))
    }
}

#[derive(Serialize, Clone)]
pub(crate) struct Headline {
    pub name: String,
    /// How the ratio is formed.
    ratio_is: String,
    unit: String,
    target: String,
    pairs: Vec<Pair>,
    /// Median of the pair ratios.
    pub ratio: Option<f64>,
    pub pass: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
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

/// Runs `uvia <args> --json FILE` as a child process under a time limit.
pub(crate) fn sub(args: &[String], timeout: Duration) -> Result<RunResult> {
    let text = sub_json(&crate::self_exe()?, args, timeout)?;
    serde_json::from_str::<RunResult>(&text).context("parsing the measurement's JSON")
}

/// Runs `<exe> <args> --json FILE` as a child process under a time limit;
/// returns the JSON it wrote, or its error.
pub(crate) fn sub_json(exe: &Path, args: &[String], timeout: Duration) -> Result<String> {
    let tmp = std::env::temp_dir().join(format!(
        "uvia-bench-{}-{}.json",
        std::process::id(),
        COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&tmp);
    let mut child = Command::new(exe)
        .args(args)
        .arg("--json")
        .arg(&tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting a measurement process")?;
    let mut stderr = child.stderr.take();
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let err_text = errs.join().unwrap_or_default();
    let msg = err_text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim_start_matches("uvia: error: ").trim().to_string())
        .collect::<Vec<_>>()
        .join("; ");
    let r = match status {
        None => Err(anyhow!(
            "did not finish within {timeout:?}{}",
            if msg.is_empty() {
                String::new()
            } else {
                format!(" ({msg})")
            }
        )),
        Some(st) if !st.success() => Err(anyhow!(
            "{}",
            if msg.is_empty() {
                format!("exited with {st}")
            } else {
                msg
            }
        )),
        Some(_) => std::fs::read_to_string(&tmp).context("reading the measurement's JSON"),
    };
    let _ = std::fs::remove_file(&tmp);
    r
}

static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

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

impl Headline {
    /// The measured (contender, baseline) pairs.
    pub(crate) fn pair_values(&self) -> Vec<(f64, f64)> {
        self.pairs
            .iter()
            .map(|p| (p.contender, p.baseline))
            .collect()
    }

    /// Of `runs`, one value per call of the contender in the order the
    /// calls were made, those of the measurements kept: the last try of
    /// each pair. Runs the pairs do not account for (a comparison ended by
    /// an error) are kept as they are.
    pub(crate) fn kept<T>(&self, runs: Vec<T>) -> Vec<T> {
        let tries: usize = self.pairs.iter().map(|p| p.tries).sum();
        if self.pairs.is_empty() || tries != runs.len() {
            return runs;
        }
        let mut runs = runs.into_iter();
        self.pairs
            .iter()
            .filter_map(|p| runs.by_ref().take(p.tries).last())
            .collect()
    }

    /// The same pairs judged by their worst ratio (the smallest: for a
    /// target of "at least"), as a comparison of its own.
    pub(crate) fn worst(&self, name: &str, target: &str, pass: impl Fn(f64) -> bool) -> Headline {
        let worst = self.pairs.iter().map(|p| p.ratio).reduce(f64::min);
        Headline {
            name: name.into(),
            ratio_is: format!("{} (the smallest of the pairs)", self.ratio_is),
            unit: self.unit.clone(),
            target: target.into(),
            pairs: self.pairs.clone(),
            ratio: worst,
            pass: worst.map(pass),
            error: self.error.clone(),
        }
    }

    /// A comparison that could not run, with the reason.
    pub(crate) fn skipped(
        name: &str,
        ratio_is: &str,
        unit: &str,
        target: &str,
        why: String,
    ) -> Headline {
        Headline {
            name: name.into(),
            ratio_is: ratio_is.into(),
            unit: unit.into(),
            target: target.into(),
            pairs: Vec::new(),
            ratio: None,
            pass: None,
            error: Some(why),
        }
    }

    /// A comparison from measured (contender, baseline) pairs, or the
    /// reason there are none; `ratio(c, b)` per pair, `pass` on their
    /// median.
    pub(crate) fn from_pairs(
        name: &str,
        ratio_is: &str,
        unit: &str,
        target: &str,
        pairs: std::result::Result<Vec<(f64, f64)>, String>,
        ratio: impl Fn(f64, f64) -> f64,
        pass: impl Fn(f64) -> bool,
    ) -> Headline {
        let pairs = match pairs {
            Ok(p) if !p.is_empty() => p,
            Ok(_) => return Headline::skipped(name, ratio_is, unit, target, "no pairs".into()),
            Err(why) => return Headline::skipped(name, ratio_is, unit, target, why),
        };
        let pairs = pairs
            .into_iter()
            .map(|(contender, baseline)| crate::placement::Measured {
                contender,
                baseline,
                line_ns: None,
                tries: 1,
            })
            .collect();
        Headline::from_measured(name, ratio_is, unit, target, pairs, ratio, pass)
    }

    /// A comparison from pairs measured with the cores' placement read
    /// around them ([`crate::placement::pair`]).
    pub(crate) fn from_measured(
        name: &str,
        ratio_is: &str,
        unit: &str,
        target: &str,
        pairs: Vec<crate::placement::Measured>,
        ratio: impl Fn(f64, f64) -> f64,
        pass: impl Fn(f64) -> bool,
    ) -> Headline {
        if pairs.is_empty() {
            return Headline::skipped(name, ratio_is, unit, target, "no pairs".into());
        }
        let pairs: Vec<Pair> = pairs
            .into_iter()
            .map(|m| Pair {
                contender: m.contender,
                baseline: m.baseline,
                ratio: ratio(m.contender, m.baseline),
                line_ns: m.line_ns,
                tries: m.tries,
            })
            .collect();
        let r = median(&pairs.iter().map(|p| p.ratio).collect::<Vec<_>>());
        Headline {
            name: name.into(),
            ratio_is: ratio_is.into(),
            unit: unit.into(),
            target: target.into(),
            pairs,
            ratio: Some(r),
            pass: Some(pass(r)),
            error: None,
        }
    }
}

/// One measurement of the first size of `uvia <args>` in its own process.
pub(crate) fn measure(args: &[&str], timeout: Duration) -> Result<crate::run::SizeResult> {
    let a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let r = sub(&a, timeout)?;
    Ok(first(&r)?.clone())
}

pub(crate) fn progress_style() -> ProgressStyle {
    ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// Interleaves `pairs` rounds of contender and baseline; `ratio(c, b)`.
/// Each pair is measured with the cores' placement read around it, and
/// again where the host moved the cores during it ([`crate::placement`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn interleave(
    pb: &ProgressBar,
    name: &str,
    ratio_is: &str,
    unit: &str,
    target: &str,
    pairs: usize,
    mut contender: impl FnMut() -> Result<f64>,
    mut baseline: impl FnMut() -> Result<f64>,
    ratio: impl Fn(f64, f64) -> f64,
    pass: impl Fn(f64) -> bool,
) -> Headline {
    let mut measured = Vec::new();
    let mut error = None;
    for i in 0..pairs {
        pb.set_message(format!("headline: {name} (pair {}/{pairs})", i + 1));
        // Which side failed is said with its error.
        let m = crate::placement::pair(
            || contender().map_err(|e| anyhow!("contender: {e:#}")),
            || baseline().map_err(|e| anyhow!("baseline: {e:#}")),
            crate::placement::read,
        );
        match m {
            Ok(m) => measured.push(m),
            Err(e) => {
                error = Some(format!("{e:#}"));
                break;
            }
        }
        pb.inc(1);
    }
    match error {
        Some(e) => Headline::skipped(name, ratio_is, unit, target, e),
        None => Headline::from_measured(name, ratio_is, unit, target, measured, ratio, pass),
    }
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
/// Its line (0.95x) sits a few hundredths under what the loss costs (the
/// frames sent again and copied twice: 0.87–1.11x, median 0.97x, in 14
/// pairs that all fell in one of the host's slow stretches), while this
/// host halves and restores a stream's speed every few seconds: a pair
/// whose two runs fall on either side of such a change reads about 0.5x
/// or 2x. In 15 pairs of `uvia bw -p udp --sizes 64K` 7 did (5 one way, 2
/// the other). With few pairs one such pair moves the median by a pair's
/// step; more pairs make each matter less.
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
    let mut runs = Vec::new();
    for kind in ["pingpong", "bw"] {
        for c in &CONFIGS {
            pb.set_message(format!("{kind} {}", c.label));
            let r = sub(&args(kind, c, sizes, &["--scale", scale]), timeout);
            let (result, error) = match r {
                Ok(r) => (Some(r), None),
                Err(e) => {
                    pb.println(format!("{kind} {}: failed: {e:#}", c.label));
                    (None, Some(format!("{e:#}")))
                }
            };
            runs.push(RunEntry {
                label: c.label.into(),
                provider: c.provider.into(),
                mode: if c.flag == "--blocking" {
                    "blocking".into()
                } else {
                    "polling".into()
                },
                kind: kind.into(),
                result,
                error,
            });
            pb.inc(1);
        }
    }

    // 3. Headlines, interleaved.
    let pp_iters = if quick { "20000" } else { "100000" };
    let lim_rounds = if quick { 20_000 } else { 100_000 };
    let shm_p = cfg("shm polling");
    let shm_b = cfg("shm blocking");
    let udp = cfg(UDP_BP);
    let p50_of = |c: &Config, kind: &str, size: &str, iters: &str| -> Result<f64> {
        Ok(
            first(&sub(&args(kind, c, size, &["--iters", iters]), timeout)?)?
                .lat_ns
                .p50,
        )
    };
    let mut headline = Vec::new();
    headline.push(interleave(
        &pb,
        "shm 8 B one-way p50 vs cache-line ping-pong (a line each way)",
        "shm p50 / cache-line p50",
        "ns",
        "<= 2.5x",
        pairs,
        || p50_of(shm_p, "pingpong", "8", pp_iters),
        || Ok(Stats::of(&limit::cacheline(lim_rounds, limit::Lines::EachWay)?).p50),
        |c, b| c / b,
        |r| r <= 2.5,
    ));
    let udp_iters = if quick { "5000" } else { "20000" };
    headline.push(interleave(
        &pb,
        "shm 8 B one-way p50 vs kernel UDP busy-poll 8 B",
        "UDP busy-poll p50 / shm p50 (times lower)",
        "ns",
        ">= 15x lower",
        pairs,
        || p50_of(shm_p, "pingpong", "8", pp_iters),
        || p50_of(udp, "pingpong", "8", udp_iters),
        |c, b| b / c,
        |r| r >= 15.0,
    ));
    let bw_iters = if quick { "300" } else { "2000" };
    let copy_reps = if quick { 50 } else { 300 };
    headline.push(interleave(
        &pb,
        "shm 1 MiB bandwidth vs cross-core copy 1 MiB",
        "shm MB/s / cross-core copy MB/s",
        "MB/s",
        ">= 0.8x",
        pairs,
        || {
            Ok(first(&sub(
                &args("bw", shm_p, "1M", &["--iters", bw_iters]),
                timeout,
            )?)?
            .mbytes_per_s)
        },
        || Ok(median(&limit::cross_core_copy(1 << 20, copy_reps)?)),
        |c, b| c / b,
        |r| r >= 0.8,
    ));
    let blk_iters = if quick { "5000" } else { "20000" };
    headline.push(interleave(
        &pb,
        "shm blocking 8 B one-way p50 vs futex hand-off",
        "shm blocking p50 / futex p50",
        "ns",
        "<= 1.3x",
        pairs,
        || p50_of(shm_b, "pingpong", "8", blk_iters),
        || Ok(Stats::of(&limit::futex_pingpong(if quick { 5_000 } else { 20_000 })?).p50),
        |c, b| c / b,
        |r| r <= 1.3,
    ));

    // The udp provider (reliable delivery) against kernel UDP on the same
    // loopback path.
    let udp_p = cfg("udp polling");
    headline.push(interleave(
        &pb,
        "udp 8 B one-way p50 vs kernel UDP busy-poll 8 B (reliable delivery)",
        "udp p50 / UDP busy-poll p50",
        "ns",
        "<= 1.15x",
        pairs,
        || p50_of(udp_p, "pingpong", "8", udp_iters),
        || p50_of(udp, "pingpong", "8", udp_iters),
        |c, b| c / b,
        |r| r <= 1.15,
    ));
    let rate_iters = if quick { "20000" } else { "100000" };
    let rate_of = |c: &Config, extra: &[&str]| -> Result<f64> {
        let mut a = vec!["--iters", rate_iters];
        a.extend_from_slice(extra);
        Ok(first(&sub(&args("bw", c, "64", &a), timeout)?)?.msgs_per_s)
    };
    headline.push(interleave(
        &pb,
        "udp 64 B message rate vs one-send-per-message kernel UDP",
        "udp msgs/s / kernel UDP msgs/s",
        "msgs/s",
        ">= 1.5x",
        pairs,
        || rate_of(udp_p, &[]),
        || rate_of(udp, &[]),
        |c, b| c / b,
        |r| r >= 1.5,
    ));
    // Bandwidth against kernel UDP busy-poll on the same loopback.
    let bw_of = |c: &Config, size: &str, iters: &str| -> Result<f64> {
        Ok(first(&sub(&args("bw", c, size, &["--iters", iters]), timeout)?)?.mbytes_per_s)
    };
    for (size, name, iters, want) in [
        (
            "1M",
            "udp 1 MiB bandwidth vs kernel UDP busy-poll 1 MiB (reliable delivery)",
            if quick { "200" } else { "1000" },
            1.0,
        ),
        (
            "64K",
            "udp 64 KiB bandwidth vs kernel UDP busy-poll 64 KiB (reliable delivery)",
            if quick { "2000" } else { "10000" },
            1.2,
        ),
    ] {
        headline.push(interleave(
            &pb,
            name,
            "udp MB/s / kernel UDP MB/s",
            "MB/s",
            &format!(">= {want}x"),
            pairs,
            || bw_of(udp_p, size, iters),
            || bw_of(udp, size, iters),
            |c, b| c / b,
            |r| r >= want,
        ));
    }
    // Goodput at injected loss: each pair a lossy run (seed 1, 2, ... so
    // that the pairs lose different frames) and a lossless one; at 5% at
    // least LOSS_PAIRS of them in the full bench, whose worst is judged,
    // at 1% at least LIGHT_LOSS_PAIRS.
    let lossy_iters = if quick { "3000" } else { "20000" };
    let goodput = |extra: &[&str]| -> Result<f64> {
        let mut a = vec!["--iters", lossy_iters];
        a.extend_from_slice(extra);
        Ok(first(&sub(&args("bw", udp_p, "64K", &a), timeout)?)?.mbytes_per_s)
    };
    for (loss, pct, want, worst, least) in [
        (0.05, 5, 0.8, Some(0.6), LOSS_PAIRS),
        (0.01, 1, 0.95, None, LIGHT_LOSS_PAIRS),
    ] {
        let seed = std::cell::Cell::new(0u32);
        let h = interleave(
            &pb,
            &format!("udp 64 KiB goodput at {pct}% injected loss vs lossless (reliable delivery)"),
            &format!("MB/s at {pct}% loss / MB/s lossless"),
            "MB/s",
            &format!(">= {want}x"),
            loss_pairs(quick, pairs, least),
            || {
                seed.set(seed.get() + 1);
                goodput(&["--inject", &format!("loss={loss},seed={}", seed.get())])
            },
            || goodput(&[]),
            |c, b| c / b,
            |r| r >= want,
        );
        if let Some(w) = worst {
            headline.push(h.clone());
            headline.push(h.worst(
                &format!("udp 64 KiB goodput at {pct}% injected loss, the worst pair"),
                &format!(">= {w}x"),
                |r| r >= w,
            ));
        } else {
            headline.push(h);
        }
    }

    // The xdp provider against kernel UDP between two test hosts made for
    // each measurement (root only; skipped with the reason otherwise).
    let xdp = Config {
        provider: "xdp",
        flag: "--polling",
        label: "xdp polling",
    };
    let xdp_names = [
        (
            "xdp 8 B one-way p50 vs kernel UDP busy-poll 8 B, two test hosts (reliable delivery)",
            "xdp p50 / UDP busy-poll p50",
            "ns",
            "<= 0.5x",
        ),
        (
            "xdp 64 B message rate vs one-send-per-message kernel UDP, two test hosts",
            "xdp msgs/s / kernel UDP msgs/s",
            "msgs/s",
            ">= 2x",
        ),
        (
            "xdp 8 B one-way p50 vs the bare AF_XDP medium 8 B, two test hosts (reliable delivery)",
            "xdp p50 / AF_XDP medium p50",
            "ns",
            "<= 1.1x",
        ),
        (
            "xdp 64 KiB bandwidth vs kernel UDP 64 KiB, two test hosts (reliable delivery)",
            "xdp MB/s / kernel UDP MB/s",
            "MB/s",
            ">= 2x",
        ),
    ];
    match uvia_net::netns::TestHosts::available() {
        Ok(()) => {
            // Each side's last run is kept for the ping-pong table (its p99
            // and mean beside the p50 the headline compares).
            let last_xdp = std::cell::RefCell::new(None);
            let last_udp = std::cell::RefCell::new(None);
            let netns_p50 = |c: &Config, keep: &std::cell::RefCell<Option<RunResult>>| {
                let a = ["--iters", udp_iters, "--netns"];
                let r = sub(&args("pingpong", c, "8", &a), timeout)?;
                let p50 = first(&r)?.lat_ns.p50;
                *keep.borrow_mut() = Some(r);
                Ok(p50)
            };
            let (n, r, u, t) = xdp_names[0];
            headline.push(interleave(
                &pb,
                n,
                r,
                u,
                t,
                pairs,
                || netns_p50(&xdp, &last_xdp),
                || netns_p50(udp, &last_udp),
                |c, b| c / b,
                |r| r <= 0.5,
            ));
            let (n, r, u, t) = xdp_names[1];
            headline.push(interleave(
                &pb,
                n,
                r,
                u,
                t,
                pairs,
                || rate_of(&xdp, &["--netns"]),
                || rate_of(udp, &["--netns"]),
                |c, b| c / b,
                |r| r >= 2.0,
            ));
            let (n, r, u, t) = xdp_names[2];
            let bare_rounds = if quick { 20_000 } else { 100_000 };
            headline.push(interleave(
                &pb,
                n,
                r,
                u,
                t,
                pairs,
                || netns_p50(&xdp, &std::cell::RefCell::new(None)),
                || Ok(Stats::of(&limit::xdp_medium(8, bare_rounds)?).p50),
                |c, b| c / b,
                |r| r <= 1.1,
            ));
            let (n, r, u, t) = xdp_names[3];
            let xdp_bw = |c: &Config| -> Result<f64> {
                let a = ["--iters", if quick { "1000" } else { "5000" }, "--netns"];
                Ok(first(&sub(&args("bw", c, "64K", &a), timeout)?)?.mbytes_per_s)
            };
            headline.push(interleave(
                &pb,
                n,
                r,
                u,
                t,
                pairs,
                || xdp_bw(&xdp),
                || xdp_bw(udp),
                |c, b| c / b,
                |r| r >= 2.0,
            ));
            for (label, provider, kept) in [
                (NETNS_XDP, "xdp", last_xdp),
                (NETNS_UDP_BP, "kernel-udp", last_udp),
            ] {
                if let Some(result) = kept.into_inner() {
                    runs.push(RunEntry {
                        label: label.into(),
                        provider: provider.into(),
                        mode: "polling".into(),
                        kind: "pingpong".into(),
                        result: Some(result),
                        error: None,
                    });
                }
            }
        }
        Err(why) => {
            for (n, r, u, t) in xdp_names {
                headline.push(Headline::skipped(n, r, u, t, format!("skipped: {why}")));
                pb.inc(pairs as u64);
            }
        }
    }

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
    let mut blocked = Vec::new();
    for label in ["shm blocking", "udp blocking", "kernel-udp blocking"] {
        pb.set_message(format!("blocked receiver CPU: {label}"));
        let c = cfg(label);
        let interval = 1000u64;
        let n = if quick { "300" } else { "1000" };
        let r = sub(
            &args(
                "pingpong",
                c,
                "8",
                &[
                    "--iters",
                    n,
                    "--warmup",
                    "20",
                    "--interval-us",
                    &interval.to_string(),
                ],
            ),
            timeout,
        );
        blocked.push(
            match r.and_then(|r| first(&r).map(|x| (x.cpu.server, x.lat_ns.p50))) {
                Ok((cpu, p50)) => Blocked {
                    label: label.into(),
                    interval_us: interval,
                    receiver_cpu: Some(cpu),
                    one_way_p50_ns: Some(p50),
                    error: None,
                },
                Err(e) => Blocked {
                    label: label.into(),
                    interval_us: interval,
                    receiver_cpu: None,
                    one_way_p50_ns: None,
                    error: Some(format!("{e:#}")),
                },
            },
        );
        pb.inc(1);
    }

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
    let (text, md) = render(&res, out);
    std::fs::write(out.join("report.md"), md)
        .with_context(|| format!("writing {}", out.join("report.md").display()))?;
    print!("{text}");
    println!("\nreport: {}", out.join("report.md").display());
    Ok(())
}

/// The command that builds the tool with checkpoints.
const TRACED_BUILD: &str =
    "cargo build --release -p uvia-cli --features trace --target-dir target/trace";

/// The build with checkpoints: the one `UVIA_TRACED_BIN` names, else the
/// workspace's `target/trace/release/uvia` (the workspace is the current
/// folder, as `scripts/bench` runs it), built or brought up to date by
/// cargo first unless `quick` (which takes it as it is). The error is the
/// reason the section is skipped.
fn traced_build(quick: bool, pb: &ProgressBar) -> std::result::Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("UVIA_TRACED_BIN") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "UVIA_TRACED_BIN names {}, which is not there",
                p.display()
            ))
        };
    }
    let root = std::env::current_dir().map_err(|e| format!("the current folder: {e}"))?;
    let bin = root.join("target/trace/release/uvia");
    if !root.join("tools/uvia-cli/Cargo.toml").is_file() {
        return Err(
            "no build with checkpoints: run from the workspace, or name one in UVIA_TRACED_BIN"
                .into(),
        );
    }
    if quick {
        return if bin.is_file() {
            Ok(bin)
        } else {
            Err(format!(
                "no build with checkpoints in target/trace (--quick does not build it; {TRACED_BUILD})"
            ))
        };
    }
    pb.set_message("anatomy: building the tool with checkpoints (target/trace)");
    let out = Command::new("cargo")
        .args(TRACED_BUILD.split(' ').skip(1))
        .current_dir(&root)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running cargo to build it: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| l.contains("error"))
            .unwrap_or("");
        return Err(format!("building it failed ({TRACED_BUILD}): {last}"));
    }
    Ok(bin)
}

/// `uvia anatomy --compare` at 1 byte from the build with checkpoints, its
/// plots into `out`; the error is why there is none.
fn anatomy_compare(
    traced: &std::result::Result<PathBuf, String>,
    quick: bool,
    out: &Path,
    pb: &ProgressBar,
) -> std::result::Result<Compare, String> {
    let bin = traced.clone()?;
    pb.set_message("anatomy: kernel UDP and uvia's providers, category by category");
    let mut args: Vec<String> = ["anatomy", "--compare", "--size", "1", "--plot-dir"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(out.display().to_string());
    if quick {
        args.extend(["--pairs", "1", "--iters", "500"].map(String::from));
    }
    let timeout = Duration::from_secs(if quick { 120 } else { 600 });
    let text = sub_json(&bin, &args, timeout).map_err(|e| format!("{e:#}"))?;
    serde_json::from_str(&text).map_err(|e| format!("reading its JSON: {e}"))
}

/// `uvia anatomy --stream 16 -p udp` at 64 KiB and 1 KiB, `runs` times
/// each from the build with checkpoints: the measured throughput against
/// the bound of two CPUs (size over the busier side's time per message,
/// its layers summed), with the layer that bounds the stream named.
fn anatomy_streams(
    traced: &std::result::Result<PathBuf, String>,
    quick: bool,
    runs: usize,
    out: &Path,
    pb: &ProgressBar,
) -> Vec<Headline> {
    let names = [("64K", "64 KiB", 1usize << 16), ("1K", "1 KiB", 1 << 10)];
    let name = |what: &str| format!("udp {what} stream (anatomy --stream 16) vs the two-CPU bound");
    let (ratio_is, unit, target) = (
        "measured MB/s / the two-CPU bound's MB/s",
        "MB/s",
        ">= 0.9x",
    );
    let bin = match traced {
        Ok(b) => b,
        Err(why) => {
            pb.inc((names.len() * runs) as u64);
            return names
                .iter()
                .map(|(_, what, _)| {
                    Headline::skipped(
                        &name(what),
                        ratio_is,
                        unit,
                        target,
                        format!("skipped: {why}"),
                    )
                })
                .collect();
        }
    };
    let timeout = Duration::from_secs(if quick { 120 } else { 600 });
    names
        .iter()
        .map(|&(arg, what, size)| {
            pb.set_message(format!("anatomy: a udp stream of {what} messages"));
            let mut pairs = Vec::new();
            let mut bound_by = None;
            let mut error = None;
            for _ in 0..runs {
                let dir = out.join(format!("stream-{arg}"));
                let args: Vec<String> = ["anatomy", "-p", "udp", "--size", arg, "--stream", "16"]
                    .iter()
                    .map(|s| s.to_string())
                    .chain(["--plot-dir".to_string(), dir.display().to_string()])
                    .collect();
                let r = sub_json(bin, &args, timeout).and_then(|text| {
                    serde_json::from_str::<crate::anatomy::stream::StreamOut>(&text)
                        .context("reading its JSON")
                });
                pb.inc(1);
                match r {
                    Ok(s) if s.size == size && s.two_cpu_max_bytes_per_s > 0.0 => {
                        pairs.push((
                            s.measured_bytes_per_s / 1e6,
                            s.two_cpu_max_bytes_per_s / 1e6,
                        ));
                        bound_by = s
                            .layers
                            .get(s.bottleneck)
                            .map(|l| format!("{} ({})", l.name, l.side));
                    }
                    Ok(_) => error = Some("its report has no two-CPU bound".to_string()),
                    Err(e) => error = Some(format!("{e:#}")),
                }
            }
            // The report names the layer that bounds the stream.
            let name = match &bound_by {
                Some(b) => format!("{}; its slowest layer: {b}", name(what)),
                None => name(what),
            };
            let pairs = match error {
                Some(e) if pairs.is_empty() => Err(e),
                _ => Ok(pairs),
            };
            Headline::from_pairs(
                &name,
                ratio_is,
                unit,
                target,
                pairs,
                |c, b| c / b,
                |r| r >= 0.9,
            )
        })
        .collect()
}

fn verdict(h: &Headline) -> String {
    match (&h.error, h.pass) {
        // A side that was not there to run (a peer or MPI not installed or
        // not named), with the reason in the error.
        (Some(e), _) if e.starts_with("skipped") => "skipped".into(),
        (Some(_), _) => "FAILED".into(),
        (None, Some(true)) => "met".into(),
        (None, Some(false)) => "not met".into(),
        _ => "-".into(),
    }
}

fn fmt_val(v: f64, unit: &str) -> String {
    match unit {
        "ns" => fmt_ns(v),
        // Small figures (seconds, CPU percent) keep their tenths.
        _ if v.abs() < 100.0 => format!("{v:.2} {unit}"),
        _ => format!("{v:.0} {unit}"),
    }
}

/// The printed summary and the markdown report; writes the plots.
/// The headline table's columns and rows.
pub(crate) fn headline_rows(hs: &[Headline]) -> ([&'static str; 6], Vec<Vec<String>>) {
    let head = [
        "comparison",
        "ratio (median of pairs)",
        "target",
        "verdict",
        "pair ratios",
        "contender / baseline (median)",
    ];
    let rows: Vec<Vec<String>> = hs
        .iter()
        .map(|h| {
            let pr = h
                .pairs
                .iter()
                .map(|p| format!("{:.2}{}", p.ratio, if p.moved() { "*" } else { "" }))
                .collect::<Vec<_>>()
                .join(" ");
            let cb = if h.pairs.is_empty() {
                "-".into()
            } else {
                format!(
                    "{} / {}",
                    fmt_val(
                        median(&h.pairs.iter().map(|p| p.contender).collect::<Vec<_>>()),
                        &h.unit
                    ),
                    fmt_val(
                        median(&h.pairs.iter().map(|p| p.baseline).collect::<Vec<_>>()),
                        &h.unit
                    )
                )
            };
            let ratio = h
                .ratio
                .map(|r| format!("{r:.2}x"))
                .unwrap_or_else(|| "-".into());
            vec![h.name.clone(), ratio, h.target.clone(), verdict(h), pr, cb]
        })
        .collect();
    (head, rows)
}

/// What the placement readings around the pairs of `hs` showed: their
/// range, the pairs measured again and those kept though the cores moved
/// (marked `*` in the pair ratios); `None` where no pair was read.
pub(crate) fn placement_note(hs: &[Headline]) -> Option<String> {
    let pairs: Vec<&Pair> = hs.iter().flat_map(|h| &h.pairs).collect();
    let readings: Vec<f64> = pairs.iter().filter_map(|p| p.line_ns).flatten().collect();
    if readings.is_empty() {
        return None;
    }
    let lo = readings.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = readings.iter().copied().fold(0.0, f64::max);
    let again: usize = pairs.iter().map(|p| p.tries.saturating_sub(1)).sum();
    let kept = pairs.iter().filter(|p| p.moved()).count();
    Some(format!(
        "Placement of the two cores, read before, between and after the two runs of each pair (the cache-line ping-pong of `uvia limit`, a line each way, {} round trips): {lo:.0}-{hi:.0} ns one way over this run's {} pairs. Readings within a pair more than {}x apart mean the host moved the cores during it; such a pair is measured again, up to {} times: {again} measurements were made again{}.",
        crate::placement::ROUNDS,
        pairs.len(),
        crate::placement::MOVED,
        crate::placement::TRIES,
        if kept > 0 {
            format!("; pairs kept though the cores moved in every try (marked * in the pair ratios): {kept}")
        } else {
            String::new()
        }
    ))
}

/// The headline table as text, with the medians of both sides,
/// and what the placement readings around the pairs showed.
pub(crate) fn headline_text(hs: &[Headline]) -> String {
    let (head, rows) = headline_rows(hs);
    let mut text = text_table(&head, &rows);
    if let Some(note) = placement_note(hs) {
        push(&mut text, note);
    }
    text
}

fn render(res: &BenchResult, out: &Path) -> (String, String) {
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

    #[test]
    fn the_worst_pair_is_judged_on_its_own() {
        let h = Headline::from_pairs(
            "goodput",
            "lossy / lossless",
            "MB/s",
            ">= 0.8x",
            Ok(vec![(90.0, 100.0), (55.0, 100.0), (85.0, 100.0)]),
            |c, b| c / b,
            |r| r >= 0.8,
        );
        assert_eq!(h.ratio, Some(0.85));
        assert_eq!(h.pass, Some(true));
        let w = h.worst("goodput, the worst pair", ">= 0.6x", |r| r >= 0.6);
        assert_eq!(w.ratio, Some(0.55));
        assert_eq!(w.pass, Some(false));
        assert_eq!(w.pair_values().len(), 3);
        // No pairs: no worst either, and the reason carried over.
        let none = Headline::from_pairs(
            "goodput",
            "lossy / lossless",
            "MB/s",
            ">= 0.8x",
            Err("the run failed".into()),
            |c, b| c / b,
            |r| r >= 0.8,
        );
        let w = none.worst("worst", ">= 0.6x", |r| r >= 0.6);
        assert_eq!((w.ratio, w.pass), (None, None));
        assert_eq!(w.error.as_deref(), Some("the run failed"));
    }

    #[test]
    fn the_report_marks_pairs_the_host_moved_and_says_what_was_measured_again() {
        use crate::placement::Measured;
        let m = |c: f64, line_ns: Option<[f64; 3]>, tries: usize| Measured {
            contender: c,
            baseline: 100.0,
            line_ns,
            tries,
        };
        let h = Headline::from_measured(
            "latency",
            "uvia / peer",
            "ns",
            "<= 1.0x",
            vec![
                m(90.0, Some([40.0, 45.0, 50.0]), 1),
                m(80.0, Some([300.0, 290.0, 310.0]), 2),
                m(120.0, Some([40.0, 300.0, 300.0]), 3),
            ],
            |c, b| c / b,
            |r| r <= 1.0,
        );
        assert_eq!(h.ratio, Some(0.9));
        let (_, rows) = headline_rows(std::slice::from_ref(&h));
        assert_eq!(rows[0][4], "0.90 0.80 1.20*");
        let note = placement_note(std::slice::from_ref(&h)).unwrap();
        assert!(
            note.contains("40-310 ns one way over this run's 3 pairs"),
            "{note}"
        );
        assert!(note.contains("3 measurements were made again"), "{note}");
        assert!(
            note.contains("moved in every try (marked * in the pair ratios): 1."),
            "{note}"
        );
        // Pairs without readings (the MPI study's own rounds) say nothing.
        let plain = Headline::from_pairs(
            "x",
            "a / b",
            "ns",
            "<= 1.0x",
            Ok(vec![(1.0, 2.0)]),
            |c, b| c / b,
            |r| r <= 1.0,
        );
        assert_eq!(placement_note(&[plain]), None);
    }

    #[test]
    fn the_runs_kept_are_the_last_try_of_each_pair() {
        use crate::placement::Measured;
        let m = |tries: usize| Measured {
            contender: 1.0,
            baseline: 1.0,
            line_ns: None,
            tries,
        };
        let h = Headline::from_measured(
            "x",
            "a / b",
            "ns",
            "<= 1.0x",
            vec![m(1), m(3), m(2)],
            |c, b| c / b,
            |r| r <= 1.0,
        );
        // Six calls of the contender: pair 1 once, pair 2 three times, pair 3 twice.
        assert_eq!(
            h.kept(vec!["a", "b1", "b2", "b3", "c1", "c2"]),
            ["a", "b3", "c2"]
        );
        // Runs that do not match the tries (an error ended the pairs) stay.
        assert_eq!(h.kept(vec!["a", "b"]), ["a", "b"]);
    }
}
