//! The provider as libfabric loads it: `libuvia-fi.so` in a folder named by
//! `FI_PROVIDER_PATH`, listed by `fi_info` (from libfabric-bin), alone and
//! with `ofi_rxm` layered on top.

mod common;

use common::pingpong::pingpong;
use common::{ProviderDir, WithProvider};
use std::process::{Command, Output};

impl ProviderDir {
    fn fi_info(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut c = Command::new("fi_info");
        c.args(args).with_provider(self);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("fi_info (apt-get install libfabric-bin)")
    }
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The domain names of the `provider: <name>` entries, in order.
fn domains(out: &str, provider: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut current = false;
    for line in out.lines() {
        let line = line.trim();
        if let Some(p) = line.strip_prefix("provider: ") {
            current = p == provider;
        } else if let Some(d) = line.strip_prefix("domain: ").filter(|_| current) {
            found.push(d.to_string());
        }
    }
    found
}

#[test]
fn fi_info_lists_a_domain_per_medium() {
    let dir = ProviderDir::new("list");
    let o = dir.fi_info(&["-p", "uvia", "-t", "FI_EP_MSG"], &[]);
    assert!(o.status.success(), "{o:?}");
    // Then a udp domain per interface with an IPv4 address, loopback aside.
    let listed = domains(&text(&o), "uvia");
    assert_eq!(listed[..2], ["shm", "udp"]);
    assert!(
        listed[2..].iter().all(|d| d.starts_with("udp:")),
        "{listed:?}"
    );
    // FI_UVIA_DOMAIN lists its medium alone: programs that take the first
    // get it, and so do those that spread ranks over every entry.
    let o = dir.fi_info(
        &["-p", "uvia", "-t", "FI_EP_MSG"],
        &[("FI_UVIA_DOMAIN", "udp")],
    );
    assert_eq!(domains(&text(&o), "uvia"), ["udp"]);
    // A destination off this host is out of shm's reach.
    let o = dir.fi_info(
        &[
            "-p",
            "uvia",
            "-t",
            "FI_EP_MSG",
            "-n",
            "192.0.2.1",
            "-P",
            "9228",
        ],
        &[],
    );
    assert_eq!(domains(&text(&o), "uvia")[..1], ["udp"]);
    assert!(!domains(&text(&o), "uvia").contains(&"shm".to_string()));
}

#[test]
fn fi_info_returns_nothing_for_what_it_cannot_do() {
    let dir = ProviderDir::new("nodata");
    for args in [
        ["-p", "uvia", "-t", "FI_EP_DGRAM", "", ""],
        // (ofi_rxm would emulate atomics over uvia: asked of uvia alone.)
        ["-p", "uvia", "-t", "FI_EP_MSG", "-c", "FI_ATOMIC"],
        ["-p", "uvia", "-t", "FI_EP_MSG", "-a", "FI_SOCKADDR_IB"],
    ] {
        let args: Vec<&str> = args.into_iter().filter(|a| !a.is_empty()).collect();
        let o = dir.fi_info(&args, &[]);
        assert!(!o.status.success(), "{args:?}: {}", text(&o));
        assert_eq!(domains(&text(&o), "uvia"), Vec::<String>::new());
    }
}

/// A setting the provider cannot honour lists no domain, with a line
/// that says why, rather than a run on another medium or without the
/// faults asked for; a bad spin time is said and left to the default.
#[test]
fn settings_it_cannot_honour_list_nothing_and_say_why() {
    let dir = ProviderDir::new("refused");
    for (k, v, why) in [
        ("FI_UVIA_DOMAIN", "bogus", "not shm, udp"),
        (
            "FI_UVIA_DOMAIN",
            "udp:nosuchif0",
            "no interface \"nosuchif0\"",
        ),
        (
            "FI_UVIA_INJECT",
            "loss=2",
            "a rate must be a number from 0 to 1",
        ),
        ("FI_UVIA_INJECT", "loss=0.1,loss=0.2", "given twice"),
    ] {
        let o = dir.fi_info(&["-p", "uvia"], &[(k, v)]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{k}={v}: {}", text(&o));
        assert_eq!(domains(&text(&o), "uvia"), Vec::<String>::new(), "{k}={v}");
        assert!(err.contains(k) && err.contains(why), "{k}={v}: {err}");
    }
    let o = dir.fi_info(&["-p", "uvia"], &[("FI_UVIA_SPIN_US", "12abc")]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{o:?}");
    assert!(err.contains("FI_UVIA_SPIN_US=\"12abc\""), "{err}");
}

#[test]
fn ofi_rxm_layers_reliable_tagged_endpoints_on_top() {
    let dir = ProviderDir::new("rxm");
    // On the network domains by default; on shm only when asked for, as
    // shm has reliable datagrams of the provider's own.
    let o = dir.fi_info(&["-p", "uvia;ofi_rxm"], &[]);
    assert!(o.status.success(), "{o:?}");
    let out = text(&o);
    let layered = domains(&out, "uvia;ofi_rxm");
    assert!(layered.contains(&"udp".to_string()), "{out}");
    assert!(!layered.contains(&"shm".to_string()), "{out}");
    assert!(out.contains("type: FI_EP_RDM"), "{out}");
    let o = dir.fi_info(&["-p", "uvia;ofi_rxm"], &[("FI_UVIA_RXM_SHM", "1")]);
    let out = text(&o);
    assert!(
        domains(&out, "uvia;ofi_rxm").contains(&"shm".to_string()),
        "{out}"
    );
    let o = dir.fi_info(
        &[
            "-p",
            "uvia;ofi_rxm",
            "-t",
            "FI_EP_RDM",
            "-c",
            "FI_TAGGED",
            "-v",
        ],
        &[],
    );
    let out = text(&o);
    assert!(out.contains("prov_name: uvia;ofi_rxm"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("caps:") && l.contains("FI_TAGGED")),
        "{out}"
    );
}

/// The provider's own reliable-datagram endpoints: on shm only, tagged,
/// with directed receives; refused for what they do not offer.
#[test]
fn reliable_datagrams_of_its_own_are_listed_on_shm() {
    let dir = ProviderDir::new("rdm-info");
    let o = dir.fi_info(&["-p", "uvia", "-t", "FI_EP_RDM"], &[]);
    assert!(o.status.success(), "{o:?}");
    let out = text(&o);
    assert_eq!(domains(&out, "uvia"), vec!["shm".to_string()], "{out}");
    // With shm the one domain, ofi_rxm has nothing to layer on: the entry
    // is the provider's own.
    let o = dir.fi_info(
        &["-p", "uvia", "-t", "FI_EP_RDM", "-v"],
        &[("FI_UVIA_DOMAIN", "shm")],
    );
    let out = text(&o);
    assert!(out.contains("prov_name: uvia\n"), "{out}");
    assert!(!out.contains("ofi_rxm"), "{out}");
    let caps = out
        .lines()
        .find(|l| l.trim_start().starts_with("caps:"))
        .unwrap_or_default();
    for cap in ["FI_TAGGED", "FI_MSG", "FI_DIRECTED_RECV"] {
        assert!(caps.contains(cap), "{cap}: {out}");
    }
    // Asked of udp, or for RMA, there is none.
    let o = dir.fi_info(
        &["-p", "uvia", "-t", "FI_EP_RDM"],
        &[("FI_UVIA_DOMAIN", "udp")],
    );
    assert!(domains(&text(&o), "uvia").is_empty(), "{}", text(&o));
    let o = dir.fi_info(&["-p", "uvia", "-t", "FI_EP_RDM", "-c", "FI_RMA"], &[]);
    assert!(domains(&text(&o), "uvia").is_empty(), "{}", text(&o));
}

#[test]
fn fi_info_e_lists_the_parameters() {
    let dir = ProviderDir::new("params");
    let o = dir.fi_info(&["-e"], &[]);
    let out = text(&o);
    for p in [
        "FI_UVIA_DOMAIN",
        "FI_UVIA_RELIABILITY",
        "FI_UVIA_INJECT",
        "FI_UVIA_SPIN_US",
        "FI_UVIA_DRIVE_THREAD",
    ] {
        assert!(out.contains(p), "{p} missing");
    }
}

#[test]
fn a_panic_in_getinfo_is_an_error_not_an_abort() {
    let dir = ProviderDir::new("panic");
    let o = dir.fi_info(
        &["-p", "uvia", "-t", "FI_EP_MSG"],
        &[("UVIA_FI_TEST_PANIC", "getinfo")],
    );
    assert!(!o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("getinfo: internal error (panic)"), "{err}");
    // One line, not the default hook's report first.
    assert!(!err.contains("panicked at"), "{err}");
}

/// `fi_pingpong -e msg` on shm, sizes 1 B to 8 MiB.
#[test]
fn fi_pingpong_msg_runs_on_shm() {
    pingpong(
        "pp-shm",
        "uvia",
        "msg",
        "shm",
        &["1 ", "4k", "64k", "1m"],
        &[],
    );
}

/// `fi_pingpong -e msg` on shm with registered pages left private
/// (`FI_UVIA_SHARE_MR=0`): large messages are read by cross-memory attach,
/// and from 512 KiB go through the ring in pieces (by default they are
/// copied out of the peer's own mapping).
#[test]
fn fi_pingpong_msg_runs_on_shm_with_registered_pages_private() {
    pingpong(
        "pp-shm-private",
        "uvia",
        "msg",
        "shm",
        &["1 ", "4k", "64k", "1m"],
        &[("FI_UVIA_SHARE_MR", "0")],
    );
}

/// `fi_pingpong -e msg` on udp over loopback. The client reads its last
/// message and then blocks on its control socket: the acknowledgement the
/// server waits for comes from the domain's driver thread.
#[test]
fn fi_pingpong_msg_runs_on_udp() {
    pingpong(
        "pp-udp",
        "uvia",
        "msg",
        "udp",
        &["1 ", "4k", "64k", "1m"],
        &[],
    );
}

/// `fi_pingpong -e rdm` over the provider's own reliable datagrams on
/// shm: a link made by the first send, every size through the ring (a
/// megabyte in chunks), each message's bytes checked (`-c`).
#[test]
fn fi_pingpong_rdm_runs_on_the_providers_own_endpoints_on_shm() {
    pingpong(
        "pp-rdm-shm",
        "uvia",
        "rdm",
        "shm",
        &["1 ", "4k", "64k", "1m"],
        &[],
    );
}

/// `fi_pingpong -e rdm` over `uvia;ofi_rxm` on shm (offered to `ofi_rxm`
/// when `FI_UVIA_RXM_SHM=1`): ofi_rxm connects on the first send (its
/// connection data through the private data, the peer found by the
/// request's address), sends small messages eagerly and large ones by
/// rendezvous (an RDMA read from the receiver).
#[test]
fn fi_pingpong_rdm_runs_over_rxm_on_shm() {
    pingpong(
        "pp-rxm-shm",
        "uvia;ofi_rxm",
        "rdm",
        "shm",
        &["1 ", "4k", "64k", "1m"],
        &[("FI_UVIA_RXM_SHM", "1")],
    );
}

/// `fi_pingpong -e rdm` over `uvia;ofi_rxm` on udp: both sides connect to
/// each other at once (ofi_rxm keeps one connection by comparing names),
/// which needs `fi_connect` to return before the peer answers.
#[test]
fn fi_pingpong_rdm_runs_over_rxm_on_udp() {
    pingpong(
        "pp-rxm-udp",
        "uvia;ofi_rxm",
        "rdm",
        "udp",
        &["1 ", "4k", "64k", "1m"],
        &[],
    );
}
