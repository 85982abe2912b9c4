//! Building the ping-pong with each MPI's compiler wrapper, running a
//! variant under its launcher, and reading its figures.

use super::defs::{Runner, Variant, MPICH_OFI, PINGPONG_C};
use anyhow::{anyhow, bail, Context, Result};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Round trips for `size` at `scale` of the tool's default.
pub(super) fn iters(size: usize, scale: f64) -> usize {
    ((crate::run::default_pp_iters(size) as f64 * scale) as usize).max(100)
}

/// One variant's run: each size's p50 and p99 one-way, in nanoseconds.
pub(super) type Figures = Vec<(usize, f64, f64)>;

/// An MPI ready to run: its launcher and the ping-pong built with its
/// compiler wrapper.
pub(super) struct Mpi {
    pub(super) launcher: PathBuf,
    pub(super) exe: PathBuf,
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
pub(super) fn parse(out: &str) -> Result<Figures> {
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
pub(super) fn output(mut c: Command, timeout: Duration) -> Result<String> {
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
pub(super) struct Setup {
    pub(super) ompi: std::result::Result<Mpi, String>,
    mpich: std::result::Result<Mpi, String>,
    pub(super) provider: crate::fabric::ProviderDir,
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
    pub(super) fn new(mpich_root: Option<&Path>) -> Result<Setup> {
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
    pub(super) fn run(
        &self,
        v: &Variant,
        sizes: &[usize],
        scale: f64,
        timeout: Duration,
    ) -> Result<Figures> {
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
}
