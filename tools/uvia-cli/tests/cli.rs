//! Runs the built `uvia` binary: ping-pong over the kernel providers, the JSON
//! shape, and clear errors for bad input. Asserts behaviour, never timings.

use std::process::Command;

fn uvia() -> Command {
    Command::new(env!("CARGO_BIN_EXE_uvia"))
}

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("uvia-test-{}-{name}", std::process::id()))
}

fn check_run_json(
    path: &std::path::Path,
    command: &str,
    provider: &str,
    mode: &str,
    sizes: &[u64],
) {
    let text = std::fs::read_to_string(path).expect("the JSON file was written");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(v["command"], command);
    assert_eq!(v["provider"], provider);
    assert_eq!(v["mode"], mode);
    let results = v["results"].as_array().expect("results array");
    assert_eq!(results.len(), sizes.len());
    for (r, &size) in results.iter().zip(sizes) {
        assert_eq!(r["size"].as_u64(), Some(size));
        assert!(r["iters"].as_u64().unwrap() > 0);
        for k in ["min", "p50", "p99", "mean"] {
            let x = r["lat_ns"][k]
                .as_f64()
                .unwrap_or_else(|| panic!("lat_ns.{k} is a number"));
            assert!(x.is_finite() && x > 0.0, "lat_ns.{k} = {x}");
        }
        let lat = &r["lat_ns"];
        assert!(
            lat["min"].as_f64() <= lat["p50"].as_f64()
                && lat["p50"].as_f64() <= lat["p99"].as_f64()
        );
        for k in ["mbytes_per_s", "msgs_per_s"] {
            let x = r[k].as_f64().unwrap();
            assert!(x.is_finite() && x > 0.0, "{k} = {x}");
        }
        for k in ["client", "server"] {
            let x = r["cpu"][k].as_f64().unwrap();
            assert!(x.is_finite() && x >= 0.0, "cpu.{k} = {x}");
        }
    }
    let _ = std::fs::remove_file(path);
}

fn pingpong(provider: &str, extra: &[&str], mode: &str) {
    let json = tmp(&format!("pp-{provider}-{mode}.json"));
    let out = uvia()
        .args([
            "pingpong",
            "--provider",
            provider,
            "--sizes",
            "8",
            "--iters",
            "2000",
        ])
        .args(extra)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "uvia pingpong failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_run_json(&json, "pingpong", provider, mode, &[8]);
}

#[test]
fn pingpong_kernel_udp() {
    pingpong("kernel-udp", &[], "polling");
}

#[test]
fn pingpong_kernel_tcp() {
    pingpong("kernel-tcp", &[], "polling");
}

#[test]
fn pingpong_kernel_udp_blocking_large() {
    // 100 KiB messages are split into several datagrams and put back together.
    let json = tmp("pp-udp-large.json");
    let out = uvia()
        .args([
            "pingpong",
            "--provider",
            "kernel-udp",
            "--blocking",
            "--sizes",
            "1,100K",
            "--iters",
            "200",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_run_json(
        &json,
        "pingpong",
        "kernel-udp",
        "blocking",
        &[1, 100 * 1024],
    );
}

#[test]
fn bw_kernel_providers() {
    for provider in ["kernel-udp", "kernel-tcp"] {
        let json = tmp(&format!("bw-{provider}.json"));
        let out = uvia()
            .args([
                "bw",
                "--provider",
                provider,
                "--sizes",
                "8,1M",
                "--iters",
                "300",
                "--json",
            ])
            .arg(&json)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{provider}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        check_run_json(&json, "bw", provider, "polling", &[8, 1 << 20]);
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    for args in [
        vec!["pingpong", "--provider", "kernel-udp", "--sizes", "abc"],
        vec!["pingpong", "--provider", "kernel-udp", "--sizes", "0"],
        vec!["pingpong", "--provider", "kernel-udp", "--iters", "0"],
        vec!["pingpong", "--provider", "nope"],
        vec!["bw", "--provider", "kernel-tcp", "--window", "0"],
    ] {
        let out = uvia().args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
        assert!(!err.trim().is_empty(), "{args:?} gave no message");
    }
    // A bad fault spec is named before any server starts.
    let out = uvia()
        .args([
            "pingpong",
            "--provider",
            "udp",
            "--inject",
            "loss=2",
            "--sizes",
            "8",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--inject") && err.contains("from 0 to 1"),
        "{err}"
    );
    assert!(
        !err.contains("server"),
        "reported before a server runs: {err}"
    );
}

#[test]
fn limit_json_shape() {
    let json = tmp("limit.json");
    let out = uvia()
        .args(["limit", "--quick", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["command"], "limit");
    for x in [
        &v["cacheline_one_way_ns"]["p50"],
        &v["cacheline_one_way_ns"]["min"],
        &v["futex_one_way_ns"]["p50"],
    ] {
        assert!(x.as_f64().is_some_and(|x| x.is_finite() && x > 0.0), "{x}");
    }
    let sizes = |k: &str| {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["size"].as_u64().unwrap(),
                    e["mbytes_per_s"].as_f64().unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    let m = sizes("memcpy");
    assert_eq!(
        m.iter().map(|x| x.0).collect::<Vec<_>>(),
        vec![65536, 1 << 20, 16 << 20]
    );
    let c = sizes("cross_core_copy");
    assert_eq!(
        c.iter().map(|x| x.0).collect::<Vec<_>>(),
        vec![65536, 1 << 20]
    );
    assert!(m.iter().chain(&c).all(|x| x.1.is_finite() && x.1 > 0.0));
    let _ = std::fs::remove_file(&json);
}

#[test]
fn server_death_is_a_clear_error_not_a_hang() {
    for provider in ["kernel-udp", "kernel-tcp"] {
        let start = std::time::Instant::now();
        let out = uvia()
            .args([
                "pingpong",
                "--provider",
                provider,
                "--sizes",
                "8",
                "--iters",
                "100000000",
            ])
            .env("UVIA_TEST_SERVER_DIES_AFTER", "500")
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "{provider}: should fail when the server dies"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("server") || err.contains("peer"),
            "{provider}: unclear error: {err}"
        );
        assert!(!err.contains("panicked"), "{provider}: {err}");
        // Not a timing assertion on the measurement: only that it gives up instead of hanging.
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "{provider}: took too long to give up"
        );
    }
}

#[test]
fn anatomy_without_checkpoints_says_how_to_build_them() {
    if cfg!(feature = "trace") {
        eprintln!("skipped: this build has checkpoints");
        return;
    }
    let out = uvia()
        .args(["anatomy", "--provider", "shm", "--iters", "10"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--features trace"), "{err}");
}

/// Runs `uvia anatomy` from the build with checkpoints that the test
/// script names in UVIA_TRACED_BIN, and checks the JSON it writes.
fn anatomy(provider: &str, must_see: &[&str]) {
    let Some(bin) = std::env::var_os("UVIA_TRACED_BIN") else {
        eprintln!(
            "skipped: UVIA_TRACED_BIN names no build with checkpoints (scripts/test sets it)"
        );
        return;
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: kernel tracing needs root");
        return;
    }
    let json = tmp(&format!("anatomy-{provider}.json"));
    let out = Command::new(bin)
        .args([
            "anatomy",
            "--provider",
            provider,
            "--size",
            "1",
            "--iters",
            "300",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("sum of measured stages"), "{text}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(v["provider"], provider);
    assert_eq!(v["size"], 1);
    assert!(v["one_way_ns"].as_f64().unwrap() > 0.0);
    let stages = v["stages"].as_array().unwrap();
    let sum: f64 = stages.iter().map(|s| s["ns"].as_f64().unwrap()).sum();
    assert!((sum - v["sum_ns"].as_f64().unwrap()).abs() < 1.0);
    // Every one-way message is followed in both directions.
    assert!(v["messages_kept"].as_u64().unwrap() > 300, "{v}");
    let cats = [
        "user application",
        "protocol processing (send)",
        "protocol processing (recv)",
        "OS overhead (send)",
        "OS overhead (recv)",
        "data movement",
    ];
    for s in stages {
        assert!(cats.contains(&s["category"].as_str().unwrap()), "{s}");
        assert!(matches!(s["side"].as_str(), Some("send" | "recv")), "{s}");
        assert!(
            s["ns"].as_f64().unwrap() >= 0.0 && s["measured"] == true,
            "{s}"
        );
    }
    // The path runs from the send call, through the points named, to the
    // application's return.
    assert_eq!(stages[0]["from"], "app-send");
    let to: Vec<&str> = stages.iter().map(|s| s["to"].as_str().unwrap()).collect();
    for want in must_see.iter().chain(&["app-received"]) {
        assert!(to.contains(want), "{want} not in {to:?}");
    }
}

#[test]
fn anatomy_of_shared_memory_follows_the_ring() {
    anatomy("shm", &["medium-queued", "rx-found"]);
}

#[test]
fn anatomy_of_kernel_udp_sees_the_kernel_path() {
    anatomy(
        "kernel-udp",
        &[
            "sys_enter",
            "net_dev_queue",
            "netif_receive_skb",
            "sk_data_ready",
        ],
    );
}
