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
//! - Open MPI over `uvia;ofi_rxm` on udp and shm (reliable VIs, no
//!   acknowledgements of MPI's own);
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

use crate::bench::Headline;
use crate::report::{fmt_ns, md_table, push, text_table, Series};
use crate::stats::median;
use anyhow::{anyhow, bail, Context, Result};
use indicatif::ProgressBar;
use serde::Serialize;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The ping-pong every MPI variant runs, compiled at run time with the
/// MPI's own compiler wrapper.
const PINGPONG_C: &str = include_str!("../c/mpi_pingpong.c");

/// The sizes of the study: 1 B to 1 MiB.
pub const SIZES: [usize; 8] = [1, 8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20];
/// The sizes of a quick run: what the headlines need and one in between.
pub const QUICK_SIZES: [usize; 3] = [8, 64 << 10, 1 << 20];

/// The study's rounds in `uvia bench`, whose `--pairs` counts the
/// headline pairs: at most 3, each round running every variant.
pub fn rounds(pairs: usize) -> usize {
    pairs.clamp(1, 3)
}

/// How the study is made, for the report.
pub const ABOUT: &str = "One MPI ping-pong (`tools/uvia-cli/c/mpi_pingpong.c`, built with each MPI's `mpicc`; rank r pinned to core r) under every variant, interleaved with `uvia pingpong` at reliable delivery, in rounds whose order turns; each figure is the median of the rounds' p50 one-way times. The source's MPI over unreliable VIs with acknowledgements of its own has no exact equal: uvia's provider offers no datagram endpoint, so the \"no ack\" line sets libfabric's `udp;ofi_rxd` (software acknowledgements over kernel UDP datagrams) against uvia's reliable VIs. Open MPI's MPI_Recv always polls, so the \"spin\" line is uvia's own blocking against polling waits. Debian's Open MPI 4.1 cannot use libfabric's `shm` provider (it asks for `FI_REMOTE_COMM`), so the shm comparison uses MPICH (`UVIA_MPICH`, the `mpich` wheel that scripts/bench installs). As root, one more row runs the ping-pong at 8 B across two test hosts (network namespaces joined by a veth pair, one rank on each, the launcher reaching the second host through `scripts/netns-agent` as through ssh): Open MPI over uvia on xdp against Open MPI's own TCP path.";

/// Which program runs a variant.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize)]
pub enum Runner {
    /// `uvia pingpong`.
    Native,
    OpenMpi,
    Mpich,
}

/// One line of the study.
#[derive(Clone, Debug)]
pub struct Variant {
    pub key: &'static str,
    pub label: &'static str,
    runner: Runner,
    /// The medium whose native ping-pong it is compared with (`None`:
    /// none; kernel paths).
    pub medium: Option<&'static str>,
    /// Environment for the ranks (`FI_*`, `MPIR_CVAR_*`).
    env: &'static [(&'static str, &'static str)],
    /// Open MPI's `--mca` pairs, or `uvia pingpong`'s arguments.
    args: &'static [&'static str],
    /// Runs through the uvia provider (needs `FI_PROVIDER_PATH`).
    uvia: bool,
}

const OMPI_OFI: &[&str] = &["pml", "cm", "mtl", "ofi", "btl", "self"];
/// Open MPI leaves libfabric's own sockets providers out unless told.
const OMPI_OFI_ANY: &[&str] = &[
    "pml",
    "cm",
    "mtl",
    "ofi",
    "btl",
    "self",
    "mtl_ofi_provider_exclude",
    "none",
];
const UVIA_UDP: &[(&str, &str)] = &[("FI_PROVIDER", "uvia;ofi_rxm"), ("FI_UVIA_DOMAIN", "udp")];
const UVIA_SHM: &[(&str, &str)] = &[("FI_PROVIDER", "uvia;ofi_rxm"), ("FI_UVIA_DOMAIN", "shm")];
const MPICH_OFI: [(&str, &str); 2] = [("MPIR_CVAR_CH4_NETMOD", "ofi"), ("MPIR_CVAR_NOLOCAL", "1")];

/// Every variant, in the order of the tables.
pub fn variants() -> Vec<Variant> {
    let v = |key, label, runner, medium, env, args, uvia| Variant {
        key,
        label,
        runner,
        medium,
        env,
        args,
        uvia,
    };
    use Runner::*;
    vec![
        v(
            "native-udp",
            "uvia udp (native)",
            Native,
            Some("udp"),
            &[],
            &["--provider", "udp"],
            false,
        ),
        v(
            "native-udp-blocking",
            "uvia udp, blocking waits (native)",
            Native,
            Some("udp"),
            &[],
            &["--provider", "udp", "--blocking"],
            false,
        ),
        v(
            "native-shm",
            "uvia shm (native)",
            Native,
            Some("shm"),
            &[],
            &["--provider", "shm"],
            false,
        ),
        v(
            "ompi-uvia-udp",
            "Open MPI over uvia;ofi_rxm, udp",
            OpenMpi,
            Some("udp"),
            UVIA_UDP,
            OMPI_OFI,
            true,
        ),
        v(
            "ompi-uvia-udp-eager",
            "Open MPI over uvia, udp, every message eager (copied)",
            OpenMpi,
            Some("udp"),
            &[
                ("FI_PROVIDER", "uvia;ofi_rxm"),
                ("FI_UVIA_DOMAIN", "udp"),
                // 1 MiB and ofi_rxm's header in one bounce buffer; fewer of
                // them than the default 1,024 keep memory in check.
                ("FI_OFI_RXM_BUFFER_SIZE", "1048704"),
                ("FI_OFI_RXM_RX_SIZE", "64"),
                ("FI_OFI_RXM_MSG_RX_SIZE", "64"),
            ],
            OMPI_OFI,
            true,
        ),
        v(
            "ompi-uvia-shm",
            "Open MPI over uvia;ofi_rxm, shm",
            OpenMpi,
            Some("shm"),
            UVIA_SHM,
            OMPI_OFI,
            true,
        ),
        v(
            "ompi-rxd",
            "Open MPI over udp;ofi_rxd (acks in software)",
            OpenMpi,
            Some("udp"),
            &[("FI_PROVIDER", "udp;ofi_rxd")],
            OMPI_OFI_ANY,
            false,
        ),
        v(
            "ompi-tcp-rxm",
            "Open MPI over tcp;ofi_rxm",
            OpenMpi,
            Some("udp"),
            &[("FI_PROVIDER", "tcp;ofi_rxm"), ("FI_TCP_IFACE", "lo")],
            OMPI_OFI_ANY,
            false,
        ),
        v(
            "ompi-tcp",
            "Open MPI's own TCP (ob1, btl tcp)",
            OpenMpi,
            Some("udp"),
            &[],
            &["pml", "ob1", "btl", "tcp,self", "btl_tcp_if_include", "lo"],
            false,
        ),
        v(
            "ompi-sm",
            "Open MPI's own shared memory (ob1, btl vader)",
            OpenMpi,
            Some("shm"),
            &[],
            &["pml", "ob1", "btl", "vader,self"],
            false,
        ),
        v(
            "mpich-uvia-shm",
            "MPICH over uvia;ofi_rxm, shm",
            Mpich,
            Some("shm"),
            UVIA_SHM,
            &[],
            true,
        ),
        v(
            "mpich-shm",
            "MPICH over libfabric shm",
            Mpich,
            Some("shm"),
            &[("FI_PROVIDER", "shm")],
            &[],
            false,
        ),
    ]
}

/// Round trips for `size` at `scale` of the tool's default.
fn iters(size: usize, scale: f64) -> usize {
    ((crate::run::default_pp_iters(size) as f64 * scale) as usize).max(100)
}

/// One variant's run: each size's p50 and p99 one-way, in nanoseconds.
type Figures = Vec<(usize, f64, f64)>;

/// An MPI ready to run: its launcher and the ping-pong built with its
/// compiler wrapper.
struct Mpi {
    launcher: PathBuf,
    exe: PathBuf,
}

/// Builds the ping-pong with `mpicc` into `dir`.
fn build(mpicc: &Path, dir: &Path, name: &str) -> Result<PathBuf> {
    let src = dir.join("mpi_pingpong.c");
    std::fs::write(&src, PINGPONG_C).with_context(|| format!("writing {}", src.display()))?;
    let exe = dir.join(name);
    let o = Command::new(mpicc)
        .arg("-O2")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .with_context(|| format!("running {}", mpicc.display()))?;
    if !o.status.success() {
        bail!(
            "{} failed: {}",
            mpicc.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(exe)
}

/// Open MPI's mpirun and mpicc, when they are Open MPI's.
fn open_mpi(dir: &Path) -> Result<Mpi> {
    let v = Command::new("mpirun")
        .arg("--version")
        .output()
        .map_err(|_| anyhow!("no mpirun (apt-get install openmpi-bin libopenmpi-dev)"))?;
    let text = String::from_utf8_lossy(&v.stdout);
    if !text.contains("Open MPI") {
        bail!(
            "mpirun is not Open MPI's ({})",
            text.lines().next().unwrap_or("")
        );
    }
    Ok(Mpi {
        launcher: "mpirun".into(),
        exe: build(Path::new("mpicc"), dir, "mpi_pingpong-ompi")?,
    })
}

/// MPICH from the folder `root` (a virtual environment with the `mpich`
/// wheel: `bin/mpiexec`, `bin/mpicc`).
fn mpich(root: &Path, dir: &Path) -> Result<Mpi> {
    let launcher = root.join("bin/mpiexec");
    if !launcher.is_file() {
        bail!("{} is not there", launcher.display());
    }
    Ok(Mpi {
        launcher,
        exe: build(&root.join("bin/mpicc"), dir, "mpi_pingpong-mpich")?,
    })
}

/// Parses the ping-pong's lines.
fn parse(out: &str) -> Result<Figures> {
    let mut v = Vec::new();
    for line in out.lines().filter(|l| l.starts_with("size ")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> Result<f64> {
            f.get(i)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| anyhow!("a bad line from the MPI ping-pong: {line:?}"))
        };
        if f.len() != 10 || f[2] != "iters" || f[4] != "p50" || f[6] != "p99" {
            bail!("a bad line from the MPI ping-pong: {line:?}");
        }
        num(3)?;
        v.push((num(1)? as usize, num(5)?, num(7)?));
    }
    Ok(v)
}

/// Runs `c` until it exits or `timeout` passes; its stdout, or why it failed.
fn output(mut c: Command, timeout: Duration) -> Result<String> {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the MPI launcher")?;
    let (mut so, mut se) = (child.stdout.take(), child.stderr.take());
    let read = |p: Option<&mut dyn Read>| {
        let mut s = String::new();
        if let Some(p) = p {
            let _ = p.read_to_string(&mut s);
        }
        s
    };
    let err = std::thread::spawn(move || read(se.as_mut().map(|p| p as &mut dyn Read)));
    let out = std::thread::spawn(move || read(so.as_mut().map(|p| p as &mut dyn Read)));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if start.elapsed() > timeout {
            // The launcher takes its ranks down with it.
            // SAFETY: kill on our own child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            std::thread::sleep(Duration::from_millis(500));
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    let why = || {
        err.lines()
            .chain(out.lines())
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("---") && !l.starts_with("size "))
            .take(3)
            .collect::<Vec<_>>()
            .join("; ")
    };
    match status {
        None => bail!("did not finish within {timeout:?} ({})", why()),
        Some(st) if !st.success() => bail!("{st}: {}", why()),
        Some(_) => Ok(out),
    }
}

/// What the study runs with.
struct Setup {
    ompi: std::result::Result<Mpi, String>,
    mpich: std::result::Result<Mpi, String>,
    provider: crate::fabric::ProviderDir,
    _dir: TempDir,
}

/// A folder removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Setup {
    fn new(mpich_root: Option<&Path>) -> Result<Setup> {
        let dir = std::env::temp_dir().join(format!("uvia-mpi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = TempDir(dir);
        let ompi = open_mpi(&dir.0).map_err(|e| format!("{e:#}"));
        let mpich = match mpich_root {
            Some(r) => mpich(r, &dir.0).map_err(|e| format!("{e:#}")),
            None => Err(
                "skipped: no MPICH named (--mpich FOLDER: a virtual environment with \
                         `pip install mpich`; scripts/bench makes one)"
                    .into(),
            ),
        };
        Ok(Setup {
            ompi,
            mpich,
            provider: crate::fabric::ProviderDir::new()?,
            _dir: dir,
        })
    }

    /// Runs `v` once over `sizes`.
    fn run(&self, v: &Variant, sizes: &[usize], scale: f64, timeout: Duration) -> Result<Figures> {
        let list =
            |f: &dyn Fn(usize) -> String| sizes.iter().map(|&s| f(s)).collect::<Vec<_>>().join(",");
        let (size_list, iter_list) = (
            list(&|s| s.to_string()),
            list(&|s| iters(s, scale).to_string()),
        );
        let mpi = match v.runner {
            Runner::Native => {
                let mut a: Vec<String> = vec!["pingpong".into()];
                a.extend(v.args.iter().map(|s| s.to_string()));
                a.extend([
                    "--sizes".into(),
                    size_list,
                    "--scale".into(),
                    scale.to_string(),
                ]);
                let r = crate::bench::sub(&a, timeout)?;
                return Ok(r
                    .results
                    .iter()
                    .map(|s| (s.size, s.lat_ns.p50, s.lat_ns.p99))
                    .collect());
            }
            Runner::OpenMpi => self.ompi.as_ref(),
            Runner::Mpich => self.mpich.as_ref(),
        }
        .map_err(|why| anyhow!("{why}"))?;
        let mut c = Command::new(&mpi.launcher);
        if v.runner == Runner::OpenMpi {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } == 0 {
                c.arg("--allow-run-as-root");
            }
            // The ranks pin themselves (rank r to core r).
            c.args(["--bind-to", "none"]);
            for kv in v.args.chunks(2) {
                c.arg("--mca").args(kv);
            }
            for (k, _) in v.env.iter().chain(if v.uvia {
                &[("FI_PROVIDER_PATH", "")][..]
            } else {
                &[][..]
            }) {
                c.args(["-x", k]);
            }
        } else {
            c.envs(MPICH_OFI);
        }
        c.args(["-n", "2"])
            .arg(&mpi.exe)
            .args([&size_list, &iter_list]);
        c.envs(v.env.iter().copied());
        if v.uvia {
            c.env("FI_PROVIDER_PATH", self.provider.path());
        }
        // Nothing of the caller's choosing changes the variant.
        for k in ["FI_UVIA_INJECT", "FI_UVIA_RELIABILITY", "FI_LOG_LEVEL"] {
            c.env_remove(k);
        }
        if !v.env.iter().any(|(k, _)| *k == "FI_PROVIDER") {
            c.env_remove("FI_PROVIDER");
        }
        let figures = parse(&output(c, timeout)?)?;
        if figures.len() != sizes.len() {
            bail!(
                "the MPI ping-pong reported {} of {} sizes",
                figures.len(),
                sizes.len()
            );
        }
        Ok(figures)
    }
}

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

/// The across-hosts row's name and target.
const ACROSS: &str =
    "MPI 8 B across two test hosts: Open MPI over uvia;ofi_rxm on xdp vs Open MPI's TCP path";

/// Runs of the across-hosts row per round: its contender and its baseline.
const ACROSS_RUNS: usize = 2;

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
fn across_hosts(setup: &Setup, pb: &ProgressBar, rounds: usize, quick: bool) -> Headline {
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
    let pb = ProgressBar::new((pairs * steps_per_round()) as u64);
    pb.set_style(crate::bench::progress_style());
    pb.enable_steady_tick(Duration::from_millis(200));
    let s = run_study(&pb, quick, pairs, mpich_root);
    pb.finish_and_clear();
    let s = s?;
    print!("{}", crate::bench::headline_text(&s.headline));
    println!();
    print!("{}", tables(&s).0);
    if let Some(p) = json {
        std::fs::write(p, serde_json::to_string_pretty(&s)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(d) = plot_dir {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        for p in plots(&s, d)? {
            println!("plot: {}", p.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_ping_pongs_lines_and_refuses_others() {
        let out = "size 8 iters 100 p50 900.0 p99 1500.5 mean 950.0\n\
                   size 1048576 iters 100 p50 150000.0 p99 200000.0 mean 160000.0\n";
        let f = parse(out).unwrap();
        assert_eq!(f, vec![(8, 900.0, 1500.5), (1 << 20, 150000.0, 200000.0)]);
        assert!(parse("size 8 iters x p50 1 p99 2 mean 3\n").is_err());
        assert!(parse("size 8 p50 1\n").is_err());
        assert!(parse("nothing\n").unwrap().is_empty());
    }

    #[test]
    fn every_variant_has_a_native_baseline_on_its_medium() {
        let vs = variants();
        for v in &vs {
            if let Some(m) = v.medium {
                let native = format!("native-{m}");
                assert!(vs.iter().any(|n| n.key == native), "{}", v.key);
            }
        }
        let mut keys: Vec<_> = vs.iter().map(|v| v.key).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), vs.len(), "keys are unique");
    }
}
