//! `fi_pingpong` (from libfabric-bin) between two processes of this host.
#![allow(dead_code)]

use super::{ProviderDir, WithProvider};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Seconds a side of `fi_pingpong` may take (a run of every size takes a
/// few).
const RUN_LIMIT: u32 = 120;

/// Runs the client of `fi_pingpong` once `server` listens: the server opens
/// its control socket some time after it starts (seconds on a loaded
/// machine) and the client does not retry, so a client refused while the
/// server still runs is started again, for up to 30 s.
pub fn client_after_server(server: &mut Child, client: impl Fn() -> Output) -> Output {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut wait = Duration::from_millis(150);
    loop {
        std::thread::sleep(wait);
        wait = Duration::from_millis(100);
        let out = client();
        let refused = String::from_utf8_lossy(&out.stderr).contains("Connection refused");
        let server_gone = matches!(server.try_wait(), Ok(Some(_)));
        if out.status.success() || !refused || server_gone || Instant::now() > deadline {
            return out;
        }
    }
}

/// Runs `fi_pingpong` server and client in two processes over `provider`,
/// endpoint type `ep` and `domain`, with its data check, over all its sizes
/// (20 iterations each), with `env` added to their environment, and checks
/// that each of `sizes` ran.
pub fn pingpong(
    test: &str,
    provider: &str,
    ep: &str,
    domain: &str,
    sizes: &[&str],
    env: &[(&str, &str)],
) {
    // One pair at a time: two pairs on a small machine starve each other's
    // servers of the time to open their control sockets.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = ProviderDir::new(test);
    // A control port of this run's and this test's own, so parallel runs
    // do not meet, below the kernel's ephemeral range (32768 and up by
    // default), where any program's outgoing connection may hold a port;
    // a port held all the same (the server's bind fails) gives way to the
    // next one.
    let salt = test
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
    let first = std::process::id().wrapping_add(salt) % 12_000;
    // A side that waits for ever (fi_pingpong's reads have no timeout)
    // is ended after RUN_LIMIT, exit status 124, so that the test fails
    // with both sides' output instead of hanging the run.
    let run = |extra: &[&str]| {
        let mut c = Command::new("timeout");
        c.arg(RUN_LIMIT.to_string())
            .arg("fi_pingpong")
            .args([
                "-p", provider, "-e", ep, "-d", domain, "-c", "-I", "20", "-S", "all",
            ])
            .args(extra)
            .with_provider(&dir)
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c.spawn()
            .expect("fi_pingpong (apt-get install libfabric-bin)")
    };
    let held = |o: &Output| String::from_utf8_lossy(&o.stderr).contains("Address already in use");
    let mut attempt = 0;
    let (client, server) = loop {
        let port = (20_000 + (first + attempt * 997) % 12_000).to_string();
        let mut server = run(&["-B", &port]);
        let client = client_after_server(&mut server, || {
            run(&["-P", &port, "127.0.0.1"]).wait_with_output().unwrap()
        });
        let server = server.wait_with_output().unwrap();
        attempt += 1;
        if held(&server) && !client.status.success() && attempt < 3 {
            continue;
        }
        break (client, server);
    };
    let out = text(&client);
    assert!(
        client.status.success(),
        "client: {client:?}\nserver: {server:?}"
    );
    assert!(server.status.success(), "server: {server:?}");
    for size in sizes {
        assert!(
            out.lines()
                .any(|l| l.starts_with(size) && l.contains("=20")),
            "{size}: {out}"
        );
    }
}
