//! `uvia scale`: many connected VI pairs measured, and bad input refused.
//! Asserts what a run reports, never how fast it was.

use std::process::Command;

fn uvia() -> Command {
    Command::new(env!("CARGO_BIN_EXE_uvia"))
}

fn run_scale(provider: &str, counts: &str) -> serde_json::Value {
    let json =
        std::env::temp_dir().join(format!("uvia-test-scale-{provider}-{}", std::process::id()));
    let out = uvia()
        .args([
            "scale",
            "-p",
            provider,
            "--vis",
            counts,
            "--iters",
            "200",
            "--rate-rounds",
            "3",
            "--idle-secs",
            "0.2",
            "--no-pin",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "uvia scale -p {provider} failed: {err}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    v
}

/// Every count asked for has its row: the VI count it was run with, a
/// ping-pong that measured something, every pair answering the rate run,
/// and a footprint counted per VI.
fn check(provider: &str) {
    let v = run_scale(provider, "1,5");
    assert_eq!(v["failed"].as_array().unwrap().len(), 0, "{v}");
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    for (row, n) in rows.iter().zip([1u64, 5]) {
        assert_eq!(row["provider"], provider);
        assert_eq!(row["vis"].as_u64(), Some(n));
        let p = &row["one_pair"];
        assert!(p["p50"].as_f64().unwrap() > 0.0, "{row}");
        assert!(
            p["p99"].as_f64().unwrap() >= p["p50"].as_f64().unwrap(),
            "{row}"
        );
        assert!(row["connect_s"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["rate_msgs_per_s"].as_f64().unwrap() > 0.0, "{row}");
        let idle = row["idle_cpu"].as_f64().unwrap();
        assert!((0.0..=2.0).contains(&idle), "{row}");
        // Each VI holds at least its own resources.
        assert!(row["server_fds_per_vi"].as_f64().unwrap() >= 0.0, "{row}");
    }
}

#[test]
fn scale_on_shm_reports_every_count() {
    check("shm");
}

#[test]
fn scale_on_udp_reports_every_count() {
    check("udp");
}

#[test]
fn scale_refuses_bad_counts_clearly() {
    for (vis, want) in [
        ("0", "1 to"),
        ("5000", "1 to"),
        ("x", "bad number"),
        ("", "bad number"),
    ] {
        let out = uvia()
            .args(["scale", "-p", "shm", "--vis", vis])
            .output()
            .unwrap();
        assert!(!out.status.success(), "--vis {vis:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "--vis {vis:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            !err.contains("server"),
            "refused before a server runs: {err}"
        );
    }
    let out = uvia()
        .args(["scale", "-p", "shm", "--idle-secs", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--idle-secs"));
}
