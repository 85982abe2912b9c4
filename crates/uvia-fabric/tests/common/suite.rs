//! The C conformance suite in `tests/c/`, compiled with the `cc` on PATH
//! against the installed libfabric headers, and its runs.
#![allow(dead_code)]

use super::{ProviderDir, WithProvider};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The suite, compiled once per test run.
pub fn suite() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
        super::compile_c(
            "fi_conformance",
            &[src.join("fi_conformance.c"), src.join("harness.c")],
            &["-O1", "-g"],
        )
    })
}

/// Runs the suite over `domain`, with `env` added to its environment, and
/// fails with its report unless every test passed.
pub fn conformance(domain: &str, env: &[(&str, &str)]) {
    // One domain at a time: each suite runs two processes at once, and the
    // machine may have two cores.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let exe = suite();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = ProviderDir::new(&format!("conformance-{domain}"));
    let o = Command::new(exe)
        .arg(domain)
        .with_provider(&dir)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    let summary = format!("fi conformance {domain}: ");
    assert!(
        o.status.success() && out.contains(&summary) && out.contains(" 0 failed"),
        "{out}\n{err}"
    );
    // Every test ran (the list is the suite's own).
    let listed = Command::new(exe)
        .args(["-l", domain])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let tests = String::from_utf8_lossy(&listed.stdout).lines().count();
    assert!(tests > 0);
    assert_eq!(
        out.lines().filter(|l| l.starts_with("ok ")).count(),
        tests,
        "{out}"
    );
}
