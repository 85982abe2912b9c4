//! MPI jobs over the provider: the project's MPI test program
//! (`tests/c/mpi_suite.c`) built with an MPI's own compiler wrapper, run by
//! `scripts/uvia-mpirun` as a user runs it, on this host or across two test
//! hosts (network namespaces joined by a veth pair) under the MPI's own
//! launcher with `scripts/netns-agent` in ssh's place.
#![allow(dead_code)]

use super::{ProviderDir, WithProvider};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use uvia_net::netns::{Side, TestHosts, ALIKE};

/// An MPI: its launcher and the suite built with its compiler wrapper.
pub struct Mpi {
    pub launcher: PathBuf,
    pub suite: PathBuf,
    pub flavour: Flavour,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Flavour {
    OpenMpi,
    Mpich,
}

impl Mpi {
    /// The launcher's arguments for `ranks` ranks on this host.
    fn ranks_here(&self, ranks: usize) -> Vec<String> {
        let mut a = vec!["-n".to_string(), ranks.to_string()];
        if self.flavour == Flavour::OpenMpi {
            // More ranks than cores.
            a.insert(0, "--oversubscribe".into());
        }
        a
    }

    /// Runs the suite on `ranks` ranks of this host on `domain`, with `env`.
    pub fn run_here(&self, test: &str, domain: &str, ranks: usize, env: &[(&str, &str)]) {
        let dir = ProviderDir::new(test);
        let o = uvia_mpirun(&dir, &self.launcher, domain, 120, &[])
            .args(self.ranks_here(ranks))
            .arg(&self.suite)
            .envs(env.iter().copied())
            .output()
            .expect("timeout (coreutils)");
        assert_passed(&format!("{domain}, {ranks} ranks"), &o, ranks, &[]);
    }

    /// Runs the suite on `per_host` ranks on each of two test hosts whose
    /// interfaces are both [`ALIKE`], over `medium` on it: the launcher on
    /// host a, reaching host b through `scripts/netns-agent`. Skipped with
    /// the reason printed without root or, on xdp, AF_XDP.
    pub fn run_across_hosts(&self, test: &str, medium: &str, per_host: usize) {
        let hosts = match TestHosts::available()
            .and_then(|()| TestHosts::create_alike(test).map_err(|e| e.to_string()))
        {
            Ok(h) => h,
            Err(why) => {
                println!("skipped: {why}");
                return;
            }
        };
        if medium == "xdp" {
            let _a = hosts.enter(Side::A).unwrap();
            if let Err(e) = uvia::Nic::open(&format!("xdp:{ALIKE}")) {
                println!("skipped: AF_XDP: {e}");
                return;
            }
        }
        let dir = ProviderDir::new(test);
        let (a, b) = (hosts.ipv4(Side::A), hosts.ipv4(Side::B));
        let agent = repo().join("scripts/netns-agent");
        let host_list = format!("{a}:{per_host},{b}:{per_host}");
        let hosts_flag = match self.flavour {
            Flavour::OpenMpi => "--host",
            Flavour::Mpich => "-hosts",
        };
        // The launcher itself runs on host a, started the way the agent
        // starts what runs on host b; its command line goes through the
        // agent's shell.
        let job = uvia_mpirun(&dir, &self.launcher, &format!("{medium}:{ALIKE}"), 120, &[])
            .arg("--agent")
            .arg(&agent)
            .args(["-n", &(2 * per_host).to_string(), hosts_flag, &host_list])
            .arg(&self.suite)
            .get_args()
            .map(|s| format!("'{}'", s.to_string_lossy().replace('\'', r"'\''")))
            .collect::<Vec<_>>()
            .join(" ");
        let o = Command::new(&agent)
            .arg(a.to_string())
            .arg(format!("exec timeout {job}"))
            .with_provider(&dir)
            .output()
            .expect("scripts/netns-agent");
        assert_passed(
            &format!("{medium} across hosts, {} ranks", 2 * per_host),
            &o,
            2 * per_host,
            &[hosts.name(Side::A), hosts.name(Side::B)],
        );
    }
}

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds the MPI test program with `mpicc` (a path) into the test target
/// folder under `name`.
pub fn build_suite(mpicc: &Path, name: &str) -> Result<PathBuf, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mpi_suite.c");
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    super::remove_stale(tmp, name);
    let exe = tmp.join(format!("{name}-{}", std::process::id()));
    let o = Command::new(mpicc)
        .args(["-O2", "-Wall", "-Wextra", "-Werror"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .map_err(|e| format!("{}: {e}", mpicc.display()))?;
    if !o.status.success() {
        return Err(format!(
            "{} failed: {}",
            mpicc.display(),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(exe)
}

/// `scripts/uvia-mpirun` with this build's provider, on `domain`, through
/// `launcher`, killed after `secs` seconds; `args` go to the launcher.
pub fn uvia_mpirun(
    dir: &ProviderDir,
    launcher: &Path,
    domain: &str,
    secs: u32,
    args: &[&str],
) -> Command {
    let mut c = Command::new("timeout");
    c.arg(secs.to_string())
        .arg(repo().join("scripts/uvia-mpirun"))
        .args(["--domain", domain, "--launcher"])
        .arg(launcher)
        .args(args)
        .with_provider(dir)
        // A failed job's output then says why (the middle layer logs the
        // provider's error text at this level).
        .env("FI_LOG_LEVEL", "warn");
    c
}

/// Checks that the suite passed on `ranks` ranks: every part and the
/// closing line; with `hosts`, that the ranks ran on those hosts.
pub fn assert_passed(what: &str, o: &Output, ranks: usize, hosts: &[&str]) {
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && out.lines().any(|l| l == "mpi suite: ok"),
        "{what}: exit {:?}\n{out}\n{err}",
        o.status.code()
    );
    let parts = out
        .lines()
        .filter(|l| l.ends_with(&format!(" ok ({ranks} ranks)")))
        .count();
    assert_eq!(parts, 9, "{what}: {out}");
    for h in hosts {
        assert!(
            out.lines()
                .any(|l| l.starts_with("mpi suite: hosts ") && l.contains(h)),
            "{what}: no rank on {h}: {out}"
        );
    }
}
