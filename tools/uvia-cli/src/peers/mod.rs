//! `uvia peers` and the peers section of `uvia bench`: uvia against what a
//! user would pick instead, each measured by its own tool in the same run,
//! interleaved with the matching uvia run.
//!
//! On shared memory: UCX's UCT active messages and put, and UCP's tag
//! matching (`ucx_perftest`, from `ucx-utils`), libfabric's `shm` provider
//! (`fi_pingpong`, from `libfabric-bin`) and Open MPI's shared-memory path
//! (NetPIPE's `NPopenmpi` under `mpirun --mca btl self,vader`). On loopback:
//! libfabric's `udp`, `tcp` and `udp;ofi_rxd` (`fi_pingpong`) and kernel UDP
//! under `sockperf`, against uvia's udp provider (reliable delivery).
//!
//! Each peer runs its two processes pinned to cores 0 and 1, like uvia's
//! (`taskset`-style affinity set before exec; `mpirun --bind-to core` for
//! NetPIPE). A comparison is one peer at one size in one form; it is
//! measured in pairs (uvia, then the peer) and its ratio is the median of
//! the pair ratios. Each pair compares like with like: the peer's own
//! statistic (median one-way time where the tool gives one, else its mean)
//! against the same statistic of uvia's run; streamed bandwidth against
//! `uvia bw`, ping-pong bandwidth (size / one-way time) against `uvia
//! pingpong`. A peer that is not installed, cannot do a size, or fails is
//! listed with the reason.
//!
//! A pipeline: `defs` (the peers and their tools), `record` (runs each
//! tool and uvia's matching run in pairs), `parse` (a tool's output into
//! its figure), `analyse` (the pairs into uvia-shaped rows and the issue's
//! headline rows, no process or file touched) and `render` (tables, plots).

use crate::bench::Headline;
use crate::run::RunResult;
use anyhow::{bail, Context, Result};
use defs::peers;
use indicatif::ProgressBar;
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

mod analyse;
mod defs;
mod parse;
mod record;
mod render;

pub use defs::{any_installed, Form, Medium, Stat, PACKAGES};
pub use record::run_all;
pub use render::{plots, render};

/// One peer at one size in one form, against the matching uvia run.
#[derive(Serialize, Clone)]
pub struct Comparison {
    /// The peer's name (the `provider` of its rows).
    pub peer: String,
    pub medium: Medium,
    pub form: Form,
    pub size: usize,
    pub stat: Stat,
    /// `ns` (one way) or `MB/s`.
    pub unit: String,
    pub iters: usize,
    pub peer_command: String,
    pub uvia_command: String,
    /// (uvia, peer) per pair; `ratio` is uvia / peer.
    pub pairs: Vec<PairVal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uvia_median: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_median: Option<f64>,
    /// Median of the pair ratios (uvia / peer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// Why it was not measured, or how it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Serialize, Clone, Copy)]
pub struct PairVal {
    pub uvia: f64,
    pub peer: f64,
    pub ratio: f64,
}

/// A peer's entry: installed or not (with the reason), its version.
#[derive(Serialize, Clone)]
pub struct PeerInfo {
    pub name: String,
    pub medium: Medium,
    pub tool: String,
    pub package: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
}

/// A peer's figures in the shape of uvia's own rows (`provider` names the
/// peer); figures the tool does not report are null.
#[derive(Serialize, Clone)]
pub struct PeerRun {
    #[serde(flatten)]
    pub run: RunResult,
    pub version: String,
}

/// What `uvia peers` measured.
#[derive(Serialize, Clone)]
pub struct PeersResult {
    pub command: String,
    pub quick: bool,
    pub pairs: usize,
    pub peers: Vec<PeerInfo>,
    pub comparisons: Vec<Comparison>,
    /// The comparisons, with targets.
    pub headline: Vec<Headline>,
    pub runs: Vec<PeerRun>,
    /// What the placement readings around every pair showed
    /// ([`crate::bench::placement_note`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    /// The bare exchange with uvia's wait on these two cores, read at the
    /// run's start and end; `None` where no shared-memory peer ran or the
    /// probe could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bare: Option<Bare>,
}

/// The one-way p50 of `uvia limit`'s cache-line ping-pong with a line each
/// way watched with uvia's wait between looks
/// ([`crate::limit::Lines::EachWayPaced`]): what uvia's one-sided
/// shared-memory path would read with no work of its own between a look
/// that finds a message and the store of the answer. A peer whose wait
/// loop differs may read below it.
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct Bare {
    pub start_ns: f64,
    pub end_ns: f64,
}

impl Bare {
    /// The lower of the two readings: the placement the cores were in at
    /// their best during the run.
    pub fn ns(&self) -> f64 {
        self.start_ns.min(self.end_ns)
    }
}

/// What to run: the peers (all, or those named), sizes.
pub struct Options {
    pub quick: bool,
    pub pairs: usize,
    pub only: Vec<String>,
}

/// The sizes measured: latency and bandwidth.
fn sizes(quick: bool) -> (Vec<usize>, Vec<usize>) {
    if quick {
        (vec![8], vec![64 << 10, 1 << 20])
    } else {
        (vec![8, 1 << 10], vec![4 << 10, 64 << 10, 1 << 20])
    }
}

/// Checks the names given to `--only`.
pub fn check_only(only: &[String]) -> Result<()> {
    let known: Vec<&str> = peers().iter().map(|p| p.name).collect();
    for o in only {
        if !known.contains(&o.as_str()) {
            bail!("no peer named {o:?}; the peers are: {}", known.join(", "));
        }
    }
    Ok(())
}

/// How many pairs the run will measure at most (for a progress bar).
pub fn planned(o: &Options) -> u64 {
    let (lat, bw) = sizes(o.quick);
    peers()
        .iter()
        .filter(|p| o.only.is_empty() || o.only.iter().any(|n| n == p.name))
        .map(|_| (lat.len() + bw.len()) as u64 * o.pairs as u64)
        .sum()
}

pub fn run(o: &Options, json: Option<&Path>, out: Option<&Path>) -> Result<()> {
    if o.pairs == 0 {
        bail!("--pairs must be at least 1");
    }
    check_only(&o.only)?;
    if let Some(f) = json {
        crate::check_output("--json", f)?;
    }
    if let Some(d) = out {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let pb = ProgressBar::new(planned(o));
    pb.set_style(crate::bench::progress_style());
    pb.enable_steady_tick(Duration::from_millis(200));
    let timeout = Duration::from_secs(if o.quick { 60 } else { 300 });
    let res = run_all(&pb, o, timeout);
    pb.finish_and_clear();
    let (text, md) = render(&res);
    out!("{text}");
    if let Some(f) = json {
        let j = serde_json::to_string_pretty(&res)? + "\n";
        std::fs::write(f, j).with_context(|| format!("writing {}", f.display()))?;
    }
    if let Some(d) = out {
        if let Err(e) = plots(&res, d) {
            outln!("plots: {e:#}");
        }
        std::fs::write(d.join("peers.md"), format!("# uvia peers\n\n{md}"))
            .with_context(|| format!("writing {}", d.join("peers.md").display()))?;
        outln!("report: {}", d.join("peers.md").display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_peer_is_named_with_the_list() {
        let e = check_only(&["ucx-nope".into()]).unwrap_err().to_string();
        assert!(e.contains("ucx-nope") && e.contains("ucx-uct-am"), "{e}");
        assert!(check_only(&["sockperf-udp".into()]).is_ok());
    }
}
