//! Open MPI over `uvia;ofi_rxm` (its `ofi` MTL, its own shared-memory and
//! TCP paths off), started by `scripts/uvia-mpirun` as a user starts it:
//! the project's MPI test program on 2 and 4 ranks on shm and udp, at 5%
//! injected loss, and across two test hosts under mpirun's own launcher,
//! `scripts/netns-agent` in ssh's place, over udp and xdp. Skipped with a
//! reason without Open MPI (`apt-get install openmpi-bin libopenmpi-dev`),
//! root or AF_XDP. MPICH runs the same program in `tests/libfabric2.rs`.

mod common;

use common::mpi::{build_suite, Flavour, Mpi};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// Runs `body` with Open MPI, or says why it is skipped. One job at a
/// time: on a small machine two jobs' ranks starve each other, and a test
/// host's address must name one namespace only.
fn with_open_mpi(body: impl FnOnce(&Mpi)) {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    static BUILT: OnceLock<Result<Mpi, String>> = OnceLock::new();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let built = BUILT.get_or_init(|| {
        let version = Command::new("mpirun")
            .arg("--version")
            .output()
            .map_err(|_| "no mpirun (apt-get install openmpi-bin libopenmpi-dev)")?;
        let text = String::from_utf8_lossy(&version.stdout);
        if !text.contains("Open MPI") {
            return Err(format!("mpirun is not Open MPI's: {}", text.trim()));
        }
        Ok(Mpi {
            launcher: PathBuf::from("mpirun"),
            suite: build_suite(Path::new("mpicc"), "mpi_suite-ompi")?,
            flavour: Flavour::OpenMpi,
        })
    });
    match built {
        Ok(mpi) => body(mpi),
        Err(why) => println!("skipped: {why}"),
    }
}

#[test]
fn open_mpi_runs_the_suite_on_shm() {
    with_open_mpi(|mpi| {
        mpi.run_here("ompishm", "shm", 2, &[]);
        mpi.run_here("ompishm4", "shm", 4, &[]);
    });
}

#[test]
fn open_mpi_runs_the_suite_on_udp() {
    with_open_mpi(|mpi| {
        mpi.run_here("ompiudp", "udp", 2, &[]);
        mpi.run_here("ompiudp4", "udp", 4, &[]);
    });
}

/// Every data check passes with 5% of frames dropped on receive, at the
/// reliable level the provider uses by default.
#[test]
fn open_mpi_runs_the_suite_at_5_percent_loss() {
    let loss = [("FI_UVIA_INJECT", "loss=0.05,seed=7")];
    with_open_mpi(|mpi| {
        mpi.run_here("ompiloss", "udp", 2, &loss);
        mpi.run_here("ompiloss4", "udp", 4, &loss);
    });
}

/// Two ranks on each host, over kernel UDP across the veth pair.
#[test]
fn open_mpi_runs_the_suite_across_two_test_hosts_on_udp() {
    with_open_mpi(|mpi| mpi.run_across_hosts("ompihudp", "udp", 2));
}

/// One rank on each host (an interface's AF_XDP socket serves one
/// process), raw Ethernet frames across the veth pair.
#[test]
fn open_mpi_runs_the_suite_across_two_test_hosts_on_xdp() {
    with_open_mpi(|mpi| mpi.run_across_hosts("ompihxdp", "xdp", 1));
}

/// Ready-made MPI programs run as they come: the project's mpi4py
/// ping-pong (`tests/py/pingpong.py`, every size checked) under Debian's
/// python3-mpi4py, and NetPIPE's MPI build up to 1 MiB, over udp.
#[test]
fn mpi4py_and_netpipe_run_over_uvia() {
    with_open_mpi(|mpi| {
        let dir = common::ProviderDir::new("ompiready");
        let python = Path::new("/usr/bin/python3");
        let has_mpi4py = Command::new(python)
            .args(["-c", "import mpi4py"])
            .status()
            .is_ok_and(|s| s.success());
        if has_mpi4py {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/pingpong.py");
            let o = common::mpi::uvia_mpirun(&dir, &mpi.launcher, "udp", 120, &[])
                .args(["-n", "2"])
                .arg(python)
                .arg(&script)
                .args(["--iters", "20"])
                .output()
                .expect("timeout (coreutils)");
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(
                o.status.success() && out.lines().any(|l| l == "mpi4py pingpong: ok"),
                "{out}\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(out.contains(" 1048576 B "), "{out}");
        } else {
            println!("skipped mpi4py: no python3-mpi4py for /usr/bin/python3");
        }
        if Command::new("NPopenmpi").arg("-h").output().is_err() {
            println!("skipped NetPIPE: no NPopenmpi (apt-get install netpipe-openmpi)");
            return;
        }
        let report = std::env::temp_dir().join(format!("uvia-np-{}.out", std::process::id()));
        let o = common::mpi::uvia_mpirun(&dir, &mpi.launcher, "udp", 120, &[])
            .args(["-n", "2", "NPopenmpi", "-u", "1048576", "-n", "20", "-o"])
            .arg(&report)
            .output()
            .expect("timeout (coreutils)");
        let table = std::fs::read_to_string(&report).unwrap_or_default();
        let _ = std::fs::remove_file(&report);
        assert!(
            o.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        // NetPIPE's table: bytes, Mbit/s, seconds, a row per size.
        let rate = table.lines().find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some("1048576")).then(|| f.next()?.parse::<f64>().ok())?
        });
        assert!(rate.is_some_and(|r| r > 0.0), "{table}");
    });
}
