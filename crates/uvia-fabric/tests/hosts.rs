//! `fi_pingpong` between two test hosts (network namespaces joined by a
//! veth pair, addresses only inside them; see `uvia_net::netns`): the
//! server on host b, the client on host a, each run with `ip netns exec`,
//! on the domains that name a host's end of the pair (`udp:<interface>`,
//! `xdp:<interface>`), `-e msg` over uvia and `-e rdm` over `uvia;ofi_rxm`,
//! every size from 1 B with the data check. Skipped with a reason without
//! root, test hosts or AF_XDP.

mod common;

use common::pingpong::client_after_server;
use common::{ProviderDir, WithProvider};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};
use uvia_net::netns::{Side, TestHosts};

/// How long one side may run before it is killed: a pair takes a few
/// seconds, a hang would take forever.
const LIMIT: Duration = Duration::from_secs(45);

/// The control port; each pair has hosts of its own, so any will do.
const PORT: &str = "47592";

/// Waits for `child` up to `deadline`, killing it then.
fn finish(mut child: Child, deadline: Instant) -> Output {
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().expect("collect fi_pingpong")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Why xdp domains cannot run on these hosts, if they cannot.
fn xdp_unavailable(hosts: &TestHosts) -> Option<String> {
    let _a = hosts.enter(Side::A).ok()?;
    uvia::Nic::open(&format!("xdp:{}", hosts.iface(Side::A)))
        .err()
        .map(|e| e.to_string())
}

/// The test hosts for a test on `medium` (`udp` or `xdp`), or why there
/// are none.
fn hosts(tag: &str, medium: &str) -> Result<TestHosts, String> {
    TestHosts::available()?;
    let hosts = TestHosts::create(tag).map_err(|e| e.to_string())?;
    if medium == "xdp" {
        if let Some(why) = xdp_unavailable(&hosts) {
            return Err(format!("AF_XDP: {why}"));
        }
    }
    Ok(hosts)
}

/// Runs `fi_pingpong` over `provider` and endpoint type `ep`, its server
/// on host b and its client on host a, each on the `medium` domain of its
/// end of the pair, and checks that every size up to 1 MiB ran 20 times.
fn pingpong(test: &str, provider: &str, ep: &str, medium: &str) {
    // One pair at a time: two pairs on a small machine starve each other's
    // servers of the time to open their control sockets.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let hosts = match hosts(test, medium) {
        Ok(h) => h,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let dir = ProviderDir::new(test);
    let run = |side: Side, extra: &[&str]| {
        let domain = format!("{medium}:{}", hosts.iface(side));
        hosts
            .command(side, "fi_pingpong")
            .args([
                "-p", provider, "-e", ep, "-d", &domain, "-c", "-I", "20", "-S", "all",
            ])
            .args(extra)
            .with_provider(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("fi_pingpong (apt-get install libfabric-bin)")
    };
    let deadline = Instant::now() + LIMIT;
    let mut server = run(Side::B, &["-B", PORT]);
    let b = hosts.ipv4(Side::B).to_string();
    let client = client_after_server(&mut server, || {
        finish(run(Side::A, &["-P", PORT, &b]), deadline)
    });
    let server = finish(server, deadline);
    let out = text(&client);
    assert!(
        client.status.success(),
        "client: {client:?}\nserver: {server:?}"
    );
    assert!(server.status.success(), "server: {server:?}");
    for size in ["1 ", "64 ", "1k", "4k", "64k", "256k", "1m"] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(size) && l.contains("=20")),
            "{size}: {out}"
        );
    }
    drop(hosts);
}

/// Inside a test host `fi_info` lists a udp domain for its end of the
/// pair, at its address, beside the loopback ones.
#[test]
fn fi_info_in_a_test_host_lists_its_interface() {
    let hosts = match hosts("fiinfo", "udp") {
        Ok(h) => h,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let dir = ProviderDir::new("hosts-info");
    let o = hosts
        .command(Side::A, "fi_info")
        .args(["-p", "uvia", "-t", "FI_EP_MSG", "-v"])
        .with_provider(&dir)
        .output()
        .expect("fi_info (apt-get install libfabric-bin)");
    let out = text(&o);
    let domain = format!("name: udp:{}", hosts.iface(Side::A));
    assert!(out.contains(&domain), "{out}");
    let src = format!("src_addr: fi_sockaddr_in://{}:0", hosts.ipv4(Side::A));
    assert!(out.contains(&src), "{out}");
}

/// `-e msg` on udp: the server's listener is at host b's address, which
/// its name carries to the client.
#[test]
fn fi_pingpong_msg_runs_between_hosts_on_udp() {
    pingpong("hmsgudp", "uvia", "msg", "udp");
}

/// `-e rdm` over `uvia;ofi_rxm` on udp.
#[test]
fn fi_pingpong_rdm_runs_between_hosts_over_rxm_on_udp() {
    pingpong("hrdmudp", "uvia;ofi_rxm", "rdm", "udp");
}

/// `-e msg` on xdp: raw Ethernet frames across the veth pair, the peer's
/// MAC address found from its IPv4 address.
#[test]
fn fi_pingpong_msg_runs_between_hosts_on_xdp() {
    pingpong("hmsgxdp", "uvia", "msg", "xdp");
}

/// `-e rdm` over `uvia;ofi_rxm` on xdp: ofi_rxm's domain and listener
/// share the interface's Nic.
#[test]
fn fi_pingpong_rdm_runs_between_hosts_over_rxm_on_xdp() {
    pingpong("hrdmxdp", "uvia;ofi_rxm", "rdm", "xdp");
}
