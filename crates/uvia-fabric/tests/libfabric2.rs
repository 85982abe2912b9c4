//! The provider, built against the installed libfabric 1.x headers, loaded
//! by a libfabric 2.x library: the one the MPICH wheel bundles
//! (`pip install mpich` into a virtual environment under the target
//! folder, once; `UVIA_LIBFABRIC2=<folder of libfabric.so.1>` names
//! another). The 1.x programs (`fi_info`, `fi_pingpong`, the C suite) run
//! with that library first on `LD_LIBRARY_PATH`; the suite asks for a 2.x
//! interface version, as a program built against 2.x headers does; and
//! MPICH itself (its ch4:ofi netmod asks for 2.5) runs the project's MPI
//! test program over `uvia;ofi_rxm`, on this host and across two test
//! hosts under its own launcher. Skipped with a reason where no 2.x library can be
//! had (no python3 venv, no network).

mod common;

use common::mpi::{build_suite, Flavour, Mpi};
use common::pingpong::pingpong;
use common::suite::conformance;
use common::{ProviderDir, WithProvider};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The newest interface the provider claims (`prov::FI_VERSION_IMPLEMENTED`).
const CLAIMED: (u32, u32) = (2, 5);

/// A libfabric 2.x library: the folder holding its `libfabric.so.1`, its
/// version, and the MPICH around it (`None` for one `UVIA_LIBFABRIC2`
/// names).
struct Library {
    dir: PathBuf,
    version: (u32, u32),
    mpich: Option<PathBuf>,
}

impl Library {
    /// The environment a program runs with to load it.
    fn env(&self) -> [(&str, &str); 1] {
        [("LD_LIBRARY_PATH", self.dir.to_str().unwrap_or_default())]
    }

    /// The interface version a program built against this library's
    /// headers asks for, as far as the provider claims one.
    fn api(&self) -> String {
        let (major, minor) = self.version.min(CLAIMED);
        format!("{major}.{minor}")
    }
}

/// The first file named `name` under `dir`.
fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(f) = find(&p, name) {
                return Some(f);
            }
        } else if e.file_name() == name {
            return Some(p);
        }
    }
    None
}

/// A virtual environment with the MPICH wheel in it, made once and kept
/// under the target folder; why there is none, in one line.
fn mpich_wheel() -> Result<PathBuf, String> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mpich-venv");
    if venv.join("installed").exists() {
        return Ok(venv);
    }
    // Made aside and renamed into place, so concurrent runs do not meet.
    let fresh = venv.with_extension(std::process::id().to_string());
    let _ = std::fs::remove_dir_all(&fresh);
    let ok = |c: &mut Command| {
        c.stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ok(Command::new("python3").arg("-m").arg("venv").arg(&fresh)) {
        return Err("python3 with venv is not installed (apt-get install python3-venv)".into());
    }
    if !ok(Command::new(fresh.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "mpich"])
        .env("PIP_DEFAULT_TIMEOUT", "30"))
    {
        let _ = std::fs::remove_dir_all(&fresh);
        return Err("`pip install mpich` failed (no network or no registry?)".into());
    }
    std::fs::write(fresh.join("installed"), b"").map_err(|e| e.to_string())?;
    if std::fs::rename(&fresh, &venv).is_err() {
        // Another run put one in place first.
        let _ = std::fs::remove_dir_all(&fresh);
    }
    Ok(venv)
}

/// The library's version, as `fi_info --version` reports the one it loaded.
fn version(dir: &Path) -> Result<(u32, u32), String> {
    let o = Command::new("fi_info")
        .arg("--version")
        .env("LD_LIBRARY_PATH", dir)
        .output()
        .map_err(|e| format!("fi_info: {e} (apt-get install libfabric-bin)"))?;
    let out = String::from_utf8_lossy(&o.stdout);
    let v = out
        .lines()
        .find_map(|l| l.strip_prefix("libfabric: "))
        .ok_or_else(|| format!("fi_info --version said {out:?}"))?;
    let mut it = v.trim().split('.').map(|n| n.parse::<u32>());
    match (it.next(), it.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => Ok((major, minor)),
        _ => Err(format!("libfabric version {v:?}")),
    }
}

/// The 2.x library, found once per test run.
fn library() -> Result<&'static Library, String> {
    static FOUND: OnceLock<Result<Library, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let (dir, mpich) = match std::env::var_os("UVIA_LIBFABRIC2") {
                Some(d) => (PathBuf::from(d), None),
                None => {
                    let venv = mpich_wheel()?;
                    let lib = find(&venv, "libfabric.so.1")
                        .ok_or("the mpich wheel has no libfabric.so.1")?;
                    (lib.parent().unwrap_or(&venv).to_path_buf(), Some(venv))
                }
            };
            let version = version(&dir)?;
            if version.0 < 2 {
                return Err(format!(
                    "the library is libfabric {}.{}",
                    version.0, version.1
                ));
            }
            Ok(Library {
                dir,
                version,
                mpich,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Runs `body` with the 2.x library, or says why it is skipped. One test
/// at a time: each runs two processes at once, and the machine may have
/// two cores.
fn with_library(body: impl FnOnce(&Library)) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    match library() {
        Ok(lib) => body(lib),
        Err(why) => println!("skipped: {why}"),
    }
}

#[test]
fn libfabric2_loads_and_lists_the_provider() {
    with_library(|lib| {
        let dir = ProviderDir::new("lf2-list");
        let fi_info = |args: &[&str]| {
            let o = Command::new("fi_info")
                .args(args)
                .with_provider(&dir)
                .envs(lib.env())
                .output()
                .expect("fi_info");
            String::from_utf8_lossy(&o.stdout).into_owned()
        };
        let out = fi_info(&["-l"]);
        assert!(out.contains("uvia:"), "{out}");
        let out = fi_info(&["-p", "uvia", "-t", "FI_EP_MSG", "-v"]);
        assert!(
            out.contains("name: shm") && out.contains("name: udp"),
            "{out}"
        );
        // The domain fields 2.x added are zero: no auth keys or groups.
        assert!(out.contains("max_group_id: 0"), "{out}");
        let out = fi_info(&["-p", "uvia;ofi_rxm", "-t", "FI_EP_RDM"]);
        assert!(out.contains("provider: uvia;ofi_rxm"), "{out}");
    });
}

/// The C suite, asking for the library's interface version (up to the
/// provider's claim), on shm and udp.
#[test]
fn the_c_suite_passes_under_libfabric2() {
    with_library(|lib| {
        let api = lib.api();
        let [ld] = lib.env();
        for domain in ["shm", "udp"] {
            conformance(domain, &[ld, ("FI_CONFORMANCE_API", &api)]);
        }
    });
}

/// `fi_pingpong` (a 1.x program) under the 2.x library, whose ofi_rxm
/// layers over the provider for `-e rdm`.
#[test]
fn fi_pingpong_runs_under_libfabric2() {
    with_library(|lib| {
        let sizes = ["1 ", "4k", "64k", "1m"];
        pingpong("lf2-msg", "uvia", "msg", "shm", &sizes, &lib.env());
        pingpong("lf2-rdm", "uvia;ofi_rxm", "rdm", "udp", &sizes, &lib.env());
    });
}

/// The MPICH wheel's `mpiexec` and the MPI test program built with its
/// `mpicc`, or why not.
fn mpich(lib: &Library) -> Result<Mpi, String> {
    let venv = lib
        .mpich
        .as_ref()
        .ok_or("UVIA_LIBFABRIC2 names a library without MPICH")?;
    Ok(Mpi {
        launcher: venv.join("bin/mpiexec"),
        suite: build_suite(&venv.join("bin/mpicc"), "mpi_suite-mpich")?,
        flavour: Flavour::Mpich,
    })
}

/// MPICH (ch4:ofi, its shared-memory path off) runs the project's MPI
/// test program over `uvia;ofi_rxm` on shm and udp, 2 and 4 ranks.
#[test]
fn mpich_runs_the_suite_over_the_provider() {
    with_library(|lib| match mpich(lib) {
        Ok(mpi) => {
            for domain in ["shm", "udp"] {
                mpi.run_here(&format!("lf2{domain}"), domain, 2, &[]);
                mpi.run_here(&format!("lf2{domain}4"), domain, 4, &[]);
            }
        }
        Err(why) => println!("skipped: {why}"),
    });
}

/// MPICH's hydra starts two ranks on each of two test hosts through
/// `scripts/netns-agent`, over udp across the veth pair.
#[test]
fn mpich_runs_the_suite_across_two_test_hosts() {
    with_library(|lib| match mpich(lib) {
        Ok(mpi) => mpi.run_across_hosts("lf2hosts", "udp", 2),
        Err(why) => println!("skipped: {why}"),
    });
}
