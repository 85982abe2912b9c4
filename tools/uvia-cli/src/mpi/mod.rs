//! `uvia mpi` and the MPI section of `uvia bench`: source document 001's
//! study of MPI over VI (its section 5, Figures 7 to 9), redone with real
//! MPI libraries over uvia through libfabric instead of an MPI of our own.
//!
//! One MPI ping-pong (`c/mpi_pingpong.c`, built with each MPI's `mpicc`)
//! runs under every variant, interleaved with uvia's own ping-pong, in
//! `pairs` rounds; each size's figure is the median of the rounds' p50s:
//!
//! - native uvia (`uvia pingpong`, reliable delivery) on udp and shm, and
//!   blocking on udp: the "spin" effect (Open MPI's MPI_Recv always polls,
//!   so the effect is shown where uvia offers both waits);
//! - Open MPI over `uvia;ofi_rxm` on udp (reliable VIs, no
//!   acknowledgements of MPI's own) and over the provider's own
//!   reliable-datagram endpoints on shm (`FI_PROVIDER=uvia`);
//! - Open MPI over `udp;ofi_rxd`: acknowledgements in software over
//!   unreliable datagrams, the closest to the source's MPI over unreliable
//!   VIs that libfabric offers (uvia's provider has no datagram endpoint):
//!   the "no ack" effect;
//! - Open MPI over uvia with every message eager (copied through ofi_rxm's
//!   bounce buffers) against the default, rendezvous from the registered
//!   user buffer above 16 KiB: the "no copy" effect;
//! - beside them Open MPI over libfabric's `tcp;ofi_rxm`, Open MPI's own
//!   TCP and shared-memory paths, and MPICH (ch4:ofi, from the `mpich`
//!   wheel, named by `--mpich`) over uvia and over libfabric's `shm`
//!   provider, which Debian's Open MPI 4.1 cannot use (it asks for
//!   `FI_REMOTE_COMM`).
//!
//! `defs` names the variants, `exec` builds the ping-pong and runs a
//! variant under its MPI's launcher, `across` makes the row between two
//! test hosts, `render` the tables and plots; this module runs the rounds
//! and reads the rows out of them.

use crate::bench::Headline;
use crate::stats::median;
use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

mod across;
mod defs;
mod exec;
mod render;

use across::{across_hosts, ACROSS_RUNS};
pub use defs::{rounds, variants, Runner, Variant, ABOUT, QUICK_SIZES, SIZES};
use exec::Setup;
pub use render::{plots, tables};

/// One variant's figures over the rounds.
#[derive(Serialize, Clone, Debug)]
pub struct Curve {
    pub key: &'static str,
    pub label: &'static str,
    pub runner: Runner,
    pub medium: Option<&'static str>,
    /// Per size: the p50 of each round, in nanoseconds.
    pub rounds_p50_ns: Vec<Vec<f64>>,
    /// Per size: the median of the rounds' p50s, and of their p99s.
    pub p50_ns: Vec<Option<f64>>,
    pub p99_ns: Vec<Option<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The study's result.
#[derive(Serialize)]
pub struct Study {
    pub sizes: Vec<usize>,
    pub pairs: usize,
    pub curves: Vec<Curve>,
    pub headline: Vec<Headline>,
}

impl Study {
    fn curve(&self, key: &str) -> Option<&Curve> {
        self.curves
            .iter()
            .find(|c| c.key == key && c.error.is_none())
    }

    fn at(&self, key: &str, size: usize) -> Option<f64> {
        let i = self.sizes.iter().position(|&s| s == size)?;
        self.curve(key)?.p50_ns[i]
    }

    /// Each size's time of `a` over `b`'s.
    fn ratio(&self, a: &str, b: &str, size: usize) -> Option<f64> {
        Some(self.at(a, size)? / self.at(b, size)?)
    }
}

/// Runs the study: `pairs` rounds of every variant, interleaved.
pub fn run_study(
    pb: &ProgressBar,
    quick: bool,
    pairs: usize,
    mpich_root: Option<&Path>,
) -> Result<Study> {
    let sizes: Vec<usize> = if quick {
        QUICK_SIZES.to_vec()
    } else {
        SIZES.to_vec()
    };
    let scale = if quick { 0.02 } else { 0.1 };
    let timeout = Duration::from_secs(if quick { 90 } else { 300 });
    let setup = Setup::new(mpich_root)?;
    if let Err(why) = &setup.ompi {
        bail!("Open MPI: {why}");
    }
    let vs = variants();
    let mut rounds: Vec<Vec<Vec<(f64, f64)>>> = vec![vec![Vec::new(); sizes.len()]; vs.len()];
    let mut errors: Vec<Option<String>> = vec![None; vs.len()];
    for r in 0..pairs {
        // The order turns from round to round, so that no variant always
        // follows the same other.
        for k in 0..vs.len() {
            let i = (k + r) % vs.len();
            let v = &vs[i];
            if errors[i].is_none() {
                pb.set_message(format!("mpi: {} (round {}/{pairs})", v.label, r + 1));
                match setup.run(v, &sizes, scale, timeout) {
                    Ok(f) => {
                        for (j, &(_, p50, p99)) in f.iter().enumerate() {
                            rounds[i][j].push((p50, p99));
                        }
                    }
                    Err(e) => errors[i] = Some(format!("{e:#}")),
                }
            }
            pb.inc(1);
        }
    }
    let curves: Vec<Curve> = vs
        .iter()
        .zip(rounds)
        .zip(errors)
        .map(|((v, per_size), error)| {
            let med = |f: fn(&(f64, f64)) -> f64| -> Vec<Option<f64>> {
                per_size
                    .iter()
                    .map(|xs| {
                        (!xs.is_empty()).then(|| median(&xs.iter().map(f).collect::<Vec<_>>()))
                    })
                    .collect()
            };
            Curve {
                key: v.key,
                label: v.label,
                runner: v.runner,
                medium: v.medium,
                p50_ns: med(|x| x.0),
                p99_ns: med(|x| x.1),
                rounds_p50_ns: per_size
                    .iter()
                    .map(|xs| xs.iter().map(|x| x.0).collect())
                    .collect(),
                error,
            }
        })
        .collect();
    let mut study = Study {
        sizes,
        pairs,
        curves,
        headline: Vec::new(),
    };
    study.headline = headlines(&study, &setup, &vs, pb, pairs, scale, timeout);
    study.headline.push(across_hosts(&setup, pb, pairs, quick));
    Ok(study)
}

/// Issue 18's rows on one host ([`headlines`]): a progress step per pair.
const PAIRED_ROWS: usize = 4;

/// Progress steps of one round (or pair) of the study: a run per variant,
/// the across-hosts row's runs and a pair of each row on one host.
pub fn steps_per_round() -> usize {
    variants().len() + ACROSS_RUNS + PAIRED_ROWS
}

/// A row of [`headlines`]: name, contender's and baseline's keys, size,
/// target, whether the ratio is of bandwidth (baseline time over the
/// contender's), the test of the ratio.
type Row = (
    &'static str,
    &'static str,
    &'static str,
    usize,
    &'static str,
    bool,
    fn(f64) -> bool,
);

const ROWS: [Row; PAIRED_ROWS] = [
    (
        "MPI 8 B on udp: Open MPI over uvia;ofi_rxm vs over tcp;ofi_rxm",
        "ompi-uvia-udp",
        "ompi-tcp-rxm",
        8,
        "<= 0.6x",
        false,
        |r| r <= 0.6,
    ),
    (
        "MPI 8 B on udp: Open MPI over uvia vs native uvia udp",
        "ompi-uvia-udp",
        "native-udp",
        8,
        "<= 1.5x",
        false,
        |r| r <= 1.5,
    ),
    (
        "MPI 8 B on shm: MPICH over uvia vs MPICH over libfabric shm",
        "mpich-uvia-shm",
        "mpich-shm",
        8,
        "<= 1.0x",
        false,
        |r| r <= 1.0,
    ),
    (
        "MPI 1 MiB bandwidth on udp: Open MPI over uvia vs over tcp;ofi_rxm",
        "ompi-uvia-udp",
        "ompi-tcp-rxm",
        1 << 20,
        ">= 1.0x",
        true,
        |r| r >= 1.0,
    ),
];

/// Issue 18's rows on one host, their pairs measured after the study's
/// rounds: the contender's run and the baseline's back to back, at the
/// row's one size, with the cores' placement read around them and the pair
/// measured again where the host moved the cores
/// ([`crate::bench::interleave`]). In the rounds every other variant runs
/// between two such runs, tens of seconds apart, and a host that moves its
/// cores every few seconds put them in different placements.
fn headlines(
    s: &Study,
    setup: &Setup,
    vs: &[Variant],
    pb: &ProgressBar,
    pairs: usize,
    scale: f64,
    timeout: Duration,
) -> Vec<Headline> {
    ROWS.iter()
        .map(|&(name, a, b, size, target, bandwidth, pass)| {
            let ratio_is = if bandwidth {
                "bytes per one-way time: baseline time / contender time"
            } else {
                "contender p50 / baseline p50"
            };
            // A variant the study could not run is not tried again.
            let failed = [a, b].iter().find_map(|&k| {
                let c = s.curves.iter().find(|c| c.key == k);
                match c.and_then(|c| c.error.as_ref().map(|e| (c.label, e))) {
                    Some((label, e)) => Some(match e.strip_prefix("skipped: ") {
                        Some(why) => format!("skipped: {label}: {why}"),
                        None => format!("{label}: {e}"),
                    }),
                    None if c.is_none() => Some(format!("no variant {k}")),
                    None => None,
                }
            });
            let (va, vb) = match (
                vs.iter().find(|v| v.key == a),
                vs.iter().find(|v| v.key == b),
            ) {
                (Some(va), Some(vb)) if failed.is_none() => (va, vb),
                _ => {
                    pb.inc(pairs as u64);
                    let why = failed.unwrap_or_else(|| format!("no variant {a} or {b}"));
                    return Headline::skipped(name, ratio_is, "ns", target, why);
                }
            };
            let one = |v: &Variant| -> Result<f64> {
                pb.set_message(format!("mpi: {name}"));
                match setup.run(v, &[size], scale, timeout)?.as_slice() {
                    [(_, p50, _)] => Ok(*p50),
                    f => bail!("{}: the MPI ping-pong reported {f:?}", v.label),
                }
            };
            crate::bench::interleave(
                pb,
                name,
                ratio_is,
                "ns",
                target,
                pairs,
                || one(va),
                || one(vb),
                move |c, b| if bandwidth { b / c } else { c / b },
                pass,
            )
        })
        .collect()
}

/// `uvia mpi`: the study on its own.
pub fn run(
    quick: bool,
    pairs: usize,
    mpich_root: Option<&Path>,
    json: Option<&Path>,
    plot_dir: Option<&Path>,
) -> Result<()> {
    if pairs == 0 {
        bail!("--pairs must be at least 1");
    }
    if let Some(r) = mpich_root {
        if !r.join("bin/mpiexec").is_file() || !r.join("bin/mpicc").is_file() {
            bail!(
                "--mpich {}: no bin/mpiexec and bin/mpicc there (a folder such as a Python \
                 virtual environment with `pip install mpich`)",
                r.display()
            );
        }
    }
    if let Some(f) = json {
        crate::check_output("--json", f)?;
    }
    if let Some(d) = plot_dir {
        std::fs::create_dir_all(d)
            .with_context(|| format!("--plot-dir: creating {}", d.display()))?;
    }
    let pb = ProgressBar::new((pairs * steps_per_round()) as u64);
    pb.set_style(crate::bench::progress_style());
    pb.enable_steady_tick(Duration::from_millis(200));
    let s = run_study(&pb, quick, pairs, mpich_root);
    pb.finish_and_clear();
    let s = s?;
    out!("{}", crate::bench::headline_text(&s.headline));
    outln!();
    out!("{}", tables(&s).0);
    if let Some(p) = json {
        std::fs::write(p, serde_json::to_string_pretty(&s)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(d) = plot_dir {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        for p in plots(&s, d)? {
            outln!("plot: {}", p.display());
        }
    }
    Ok(())
}
