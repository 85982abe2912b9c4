//! What the integration tests share: the provider as libfabric loads it.

use std::path::{Path, PathBuf};
use std::process::Command;

pub mod mpi;
pub mod pingpong;
pub mod suite;

/// A temporary provider folder holding this build's library under the name
/// libfabric loads (`FI_PROVIDER_PATH` names it).
pub struct ProviderDir(pub PathBuf);

impl ProviderDir {
    pub fn new(test: &str) -> ProviderDir {
        // The test binary is target/<profile>/deps/<name>; the library cargo
        // built with it is beside it (and copied up a folder only when built
        // anew, so the copy there may be missing).
        let exe = std::env::current_exe().unwrap();
        let lib = exe.parent().unwrap().join("libuvia_fi.so");
        assert!(lib.exists(), "{} not built", lib.display());
        let dir = std::env::temp_dir().join(format!("uvia-fi-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(&lib, dir.join("libuvia-fi.so")).unwrap();
        ProviderDir(dir)
    }
}

/// A command run against this build's provider: libfabric loads it from
/// `dir`, and no setting of the caller's (a provider, domain, faults or
/// reliability level named in the environment the tests run in) chooses for
/// it; the test names its own after this.
pub trait WithProvider {
    fn with_provider(&mut self, dir: &ProviderDir) -> &mut Self;
}

impl WithProvider for Command {
    fn with_provider(&mut self, dir: &ProviderDir) -> &mut Command {
        self.env("FI_PROVIDER_PATH", &dir.0);
        for k in [
            "FI_PROVIDER",
            "FI_UVIA_DOMAIN",
            "FI_UVIA_INJECT",
            "FI_UVIA_RELIABILITY",
        ] {
            self.env_remove(k);
        }
        self
    }
}

impl Drop for ProviderDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes the programs named `<name>-<pid>` that earlier test runs
/// compiled into `tmp` and whose process is gone (each run compiles its
/// own: test binaries run side by side).
pub fn remove_stale(tmp: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    let prefix = format!("{name}-");
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(pid) = file
            .to_str()
            .and_then(|n| n.strip_prefix(prefix.as_str()))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Compiles the C `sources` with the `cc` on PATH against the installed
/// libfabric into `<tmp>/<name>-<pid>` (removing earlier runs' stale
/// copies); fails the test with the compiler's words if it does not build.
pub fn compile_c(name: &str, sources: &[PathBuf], flags: &[&str]) -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    remove_stale(tmp, name);
    let exe = tmp.join(format!("{name}-{}", std::process::id()));
    let o = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
        .args(flags)
        .args(sources)
        .arg("-o")
        .arg(&exe)
        .arg("-lfabric")
        .output()
        .expect("cc (apt-get install gcc libc6-dev)");
    assert!(
        o.status.success(),
        "{name} does not compile (libfabric-dev installed?):\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    exe
}
