//! `fi_msg_bw` (tools/uvia-cli/c, the stream `uvia fabric` sets beside
//! `uvia bw`) over the provider: every byte of every message checked (`-c`),
//! sizes from 1 B to 1 MiB, on shm and udp; and its answers to bad input.

mod common;

use common::{ProviderDir, WithProvider};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn program() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/uvia-cli/c/fi_msg_bw.c");
        common::compile_c("fi_msg_bw", &[src], &["-O2"])
    })
}

fn run(dir: &ProviderDir, args: &[&str]) -> Output {
    Command::new(program())
        .args(args)
        .args(["-t", "60"])
        .with_provider(dir)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Checked streams of each size on `domain`: each run succeeds and reports
/// every message it was asked for, at a message rate above zero.
fn checked_streams(domain: &str) {
    let dir = ProviderDir::new(&format!("msg-bw-{domain}"));
    for (size, iters, window) in [
        ("1", "3000", "64"),
        ("4000", "2000", "64"),
        ("65536", "500", "16"),
        ("1048576", "60", "4"),
    ] {
        let o = run(
            &dir,
            &["-d", domain, "-c", "-S", size, "-I", iters, "-W", window],
        );
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "{domain} {size} B: {out}\n{err}");
        let f: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(f.first(), Some(&"size"), "{out}");
        assert_eq!(f.get(1), Some(&size), "{out}");
        // 20 batches of the messages asked for, rounded up.
        let asked: usize = iters.parse().unwrap();
        let got: usize = f.get(3).and_then(|s| s.parse().ok()).unwrap_or(0);
        assert!(
            got >= asked && got < asked + 20,
            "{domain} {size} B: {got} messages for {asked}: {out}"
        );
        let rate: f64 = f.get(9).and_then(|s| s.parse().ok()).unwrap_or(0.0);
        assert!(rate > 0.0, "{out}");
    }
}

#[test]
fn checked_streams_on_shm() {
    checked_streams("shm");
}

#[test]
fn checked_streams_on_udp() {
    checked_streams("udp");
}

#[test]
fn bad_input_is_refused_clearly() {
    let dir = ProviderDir::new("msg-bw-bad");
    let o = run(&dir, &["-S", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("-S must be a number from 1 to"));
    let o = run(&dir, &["-W", "lots"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("-W must be a number from 1 to 4096"));
    // A domain the provider does not have: the receiver says so, and the
    // sender does not wait for it.
    let t0 = std::time::Instant::now();
    let o = run(&dir, &["-d", "no-such-medium", "-I", "10"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("fi_getinfo for provider uvia, domain no-such-medium"),
        "{}",
        text(&o.stderr)
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(20));
}
