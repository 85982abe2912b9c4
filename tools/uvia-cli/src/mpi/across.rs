//! The across-hosts row: Open MPI over uvia on xdp between two test
//! hosts, against Open MPI's own TCP path between them.

use super::exec::{output, parse, Setup};
use crate::bench::Headline;
use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The across-hosts row's name and target.
const ACROSS: &str =
    "MPI 8 B across two test hosts: Open MPI over uvia;ofi_rxm on xdp vs Open MPI's TCP path";

/// Runs of the across-hosts row per round: its contender and its baseline.
pub(super) const ACROSS_RUNS: usize = 2;

/// A script of the repository this program was built in (`scripts/NAME`),
/// found from this program's path (`target/release/uvia`) upwards.
fn repo_script(name: &str) -> Option<PathBuf> {
    let exe = std::fs::read_link("/proc/self/exe")
        .or_else(|_| std::env::current_exe())
        .ok()?;
    exe.ancestors()
        .skip(1)
        .take(5)
        .map(|d| d.join("scripts").join(name))
        .find(|p| p.is_file())
}

/// A word for the agent's shell: `s` in single quotes.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Issue 18's row across two test hosts, as on two machines: Open MPI over
/// `uvia;ofi_rxm` on xdp against Open MPI's own TCP path (`ob1`, `btl
/// tcp`) between the same hosts, 8 B, one rank on each host (pinned to
/// cores 0 and 1), the launcher on host a reaching host b through
/// `scripts/netns-agent` in ssh's place; `rounds` pairs, the two runs'
/// order turning. Skipped, with the reason, without root, AF_XDP, Open MPI
/// or the repository's scripts.
pub(super) fn across_hosts(
    setup: &Setup,
    pb: &ProgressBar,
    rounds: usize,
    quick: bool,
) -> Headline {
    use crate::placement::{pair, read, Measured};
    use uvia_net::netns::{Side, TestHosts, ALIKE};
    let (ratio_is, unit, target) = ("contender p50 / baseline p50", "ns", "<= 0.5x");
    let skip = |why: String| {
        pb.inc((rounds * ACROSS_RUNS) as u64);
        Headline::skipped(ACROSS, ratio_is, unit, target, format!("skipped: {why}"))
    };
    let ompi = match &setup.ompi {
        Ok(m) => m,
        Err(why) => return skip(format!("Open MPI: {why}")),
    };
    let (Some(agent), Some(mpirun)) = (repo_script("netns-agent"), repo_script("uvia-mpirun"))
    else {
        return skip(
            "scripts/netns-agent and scripts/uvia-mpirun not found beside this build".into(),
        );
    };
    if let Err(why) = TestHosts::available() {
        return skip(why);
    }
    let hosts = match TestHosts::create_alike("mpix") {
        Ok(h) => h,
        Err(e) => return skip(format!("making the test hosts: {e}")),
    };
    {
        let in_a = match hosts.enter(Side::A) {
            Ok(g) => g,
            Err(e) => return skip(format!("entering test host a: {e}")),
        };
        if let Err(e) = uvia::Nic::open(&format!("xdp:{ALIKE}")) {
            return skip(format!("AF_XDP: {e}"));
        }
        drop(in_a);
    }
    let (a, b) = (hosts.ipv4(Side::A), hosts.ipv4(Side::B));
    let iters = if quick { 5_000 } else { 20_000 };
    let timeout = Duration::from_secs(if quick { 60 } else { 120 });
    let q = |p: &Path| sh_quote(&p.to_string_lossy());
    let tail = format!("-n 2 --host {a}:1,{b}:1 {} 8 {iters}", q(&ompi.exe));
    let secs = timeout.as_secs();
    let uvia_job = format!(
        "exec timeout {secs} {} --domain xdp:{ALIKE} --launcher {} --agent {} {tail}",
        q(&mpirun),
        q(&ompi.launcher),
        q(&agent)
    );
    // SAFETY: geteuid has no preconditions.
    let root = if unsafe { libc::geteuid() } == 0 {
        "--allow-run-as-root "
    } else {
        ""
    };
    let tcp_job = format!(
        "exec timeout {secs} {} {root}--bind-to none --mca plm_rsh_agent {} --mca pml ob1 \
         --mca btl tcp,self --mca btl_tcp_if_include {ALIKE} --mca oob_tcp_if_include {ALIKE} \
         {tail}",
        q(&ompi.launcher),
        q(&agent)
    );
    let run = |job: &str, uvia: bool| -> Result<f64> {
        let mut c = Command::new(&agent);
        c.arg(a.to_string()).arg(job);
        for k in [
            "FI_PROVIDER",
            "FI_UVIA_INJECT",
            "FI_UVIA_RELIABILITY",
            "FI_LOG_LEVEL",
        ] {
            c.env_remove(k);
        }
        if uvia {
            c.env("FI_PROVIDER_PATH", setup.provider.path());
        }
        let f = parse(&output(c, timeout + Duration::from_secs(5))?)?;
        match f.as_slice() {
            [(8, p50, _)] => Ok(*p50),
            _ => bail!("the MPI ping-pong reported {f:?}, not one line for 8 B"),
        }
    };
    let mut pairs = Vec::new();
    let mut error = None;
    let one = |uvia: bool| -> Result<f64> {
        if uvia {
            run(&uvia_job, true).context("over uvia on xdp")
        } else {
            run(&tcp_job, false).context("Open MPI's TCP path")
        }
    };
    for r in 0..rounds {
        pb.set_message(format!(
            "mpi: across two test hosts (round {}/{rounds})",
            r + 1
        ));
        // Adjacent runs, the order turned each round, the cores' placement
        // read around them as in the bench's pairs.
        let got = if r % 2 == 0 {
            pair(|| one(true), || one(false), read)
        } else {
            pair(|| one(false), || one(true), read).map(|m| Measured {
                contender: m.baseline,
                baseline: m.contender,
                ..m
            })
        };
        match got {
            Ok(p) => {
                pairs.push(p);
                pb.inc(ACROSS_RUNS as u64);
            }
            Err(e) => {
                error = Some(format!("{e:#}"));
                // The runs not made, for the progress bar.
                pb.inc(((rounds - r) * ACROSS_RUNS) as u64);
                break;
            }
        }
    }
    drop(hosts);
    match error {
        Some(e) => Headline::skipped(ACROSS, ratio_is, unit, target, e),
        None => Headline::from_measured(
            ACROSS,
            ratio_is,
            unit,
            target,
            pairs,
            |c, b| c / b,
            |r| r <= 0.5,
        ),
    }
}
