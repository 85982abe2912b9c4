//! Two processes over the xdp provider, one on each of two test hosts
//! (network namespaces joined by a veth pair): every size on each
//! reliability level, RDMA write and read checked on the target, 5%
//! injected loss with exactly-once delivery, a peer killed mid-transfer,
//! and the XDP program gone after close and after the peer is killed.
//! Skipped with a reason where test hosts or AF_XDP cannot be had.

mod peer;

use peer::*;
use std::time::{Duration, Instant};
use uvia::*;
use uvia_net::netns::{Side, TestHosts};

const SIZES: &[usize] = &[0, 1, 8, 1000, 1436, 1437, 4096, 65536, 300_000, 1 << 20];

/// Why xdp tests cannot run here, if they cannot.
fn unavailable(hosts: &TestHosts) -> Option<String> {
    let _a = hosts.enter(Side::A).ok()?;
    match Nic::open(&format!("xdp:{}", hosts.iface(Side::A))) {
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// Whether an XDP program is attached to a host's end of the pair.
fn attached(hosts: &TestHosts, side: Side) -> bool {
    let out = std::process::Command::new("ip")
        .args(["-n", hosts.name(side), "-d", "link", "show", "dev"])
        .arg(hosts.iface(side))
        .output()
        .expect("ip link show");
    String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
}

/// Runs `body` on test host a with an xdp instance whose peer runs on host
/// b; skips with a reason where that cannot be done.
fn across_hosts(test: &str, body: impl FnOnce(&TestHosts, &str, &dyn Fn(&str) -> Peer)) {
    if let Err(why) = TestHosts::available() {
        println!("skipped: {why}");
        return;
    }
    let hosts = TestHosts::create("xi").unwrap();
    if let Some(why) = unavailable(&hosts) {
        println!("skipped: {why}");
        return;
    }
    let inst = xdp_hosts_instance(
        &hosts.iface(Side::A),
        &hosts.iface(Side::B),
        hosts.ipv4(Side::A).into(),
        hosts.ipv4(Side::B).into(),
    );
    let ns_b = hosts.name(Side::B).to_string();
    let spawn = |arg: &str| Peer::spawn_in(&ns_b, test, &inst, arg);
    {
        let _on_a = hosts.enter(Side::A).unwrap();
        body(&hosts, &inst, &spawn);
    }
    assert!(!attached(&hosts, Side::A), "the program left with the Nic");
    drop(hosts);
}

fn lossy(seed: u32) -> NicOptions {
    NicOptions {
        inject: Some(format!("loss=0.05,dup=0.01,seed={seed}")),
        ..NicOptions::default()
    }
}

fn level_of(arg: &str) -> Reliability {
    match arg {
        "unreliable" => Reliability::Unreliable,
        "reception" => Reliability::ReliableReception,
        _ => Reliability::ReliableDelivery,
    }
}

/// Sends each size and checks the echo, byte for byte.
fn echo_client(inst: &str, opts: &NicOptions, level: Reliability, d: u64, sizes: &[usize]) {
    let mut e = end_with(inst, opts, |p| ViAttributes::new(p).reliability(level));
    connect(&e, d);
    for (k, &n) in sizes.iter().enumerate() {
        let data = pattern(n, k as u8 + 3);
        e.buf.as_mut_slice()[..n].copy_from_slice(&data);
        e.vi.post_recv(Box::new(Descriptor::recv(&[e
            .buf
            .segment(1 << 20, 1 << 20)])))
            .unwrap();
        assert_eq!(send(&e, 0, n).result(), Ok(n as u32), "{n} B ({level:?})");
        let r = e.vi.recv_wait(Some(T)).unwrap();
        assert_eq!(r.result(), Ok(n as u32), "{n} B echo ({level:?})");
        assert_eq!(&e.buf.as_slice()[1 << 20..(1 << 20) + n], &data[..]);
    }
    stop(&mut e);
    e.vi.disconnect();
}

#[test]
fn every_size_on_every_level_across_two_test_hosts() {
    let name = "every_size_on_every_level_across_two_test_hosts";
    if let Some(a) = peer_arg() {
        let inst = std::env::var("UVIA_TEST_INSTANCE").unwrap();
        return echo_server(&inst, &NicOptions::default(), level_of(&a), 510);
    }
    across_hosts(name, |_, inst, spawn| {
        for (arg, sizes) in [
            ("delivery", SIZES),
            ("reception", SIZES),
            // Nothing is sent twice: sizes that fit in few frames.
            ("unreliable", &SIZES[..7]),
        ] {
            let peer = spawn(arg);
            echo_client(inst, &NicOptions::default(), level_of(arg), 510, sizes);
            peer.join();
        }
    });
}

#[test]
fn exactly_once_at_5_percent_loss() {
    let name = "exactly_once_at_5_percent_loss";
    if let Some(a) = peer_arg() {
        let inst = std::env::var("UVIA_TEST_INSTANCE").unwrap();
        return echo_server(&inst, &lossy(11), level_of(&a), 520);
    }
    across_hosts(name, |_, inst, spawn| {
        for arg in ["delivery", "reception"] {
            let peer = spawn(arg);
            // Each echo is checked byte for byte and the next message
            // would be refused if one arrived twice (one receive posted).
            let sizes: Vec<usize> = (0..60).map(|i| [8, 1000, 4096, 70_000][i % 4]).collect();
            echo_client(inst, &lossy(12), level_of(arg), 520, &sizes);
            peer.join();
        }
    });
}

#[test]
fn rdma_write_and_read_are_checked_on_the_target() {
    let name = "rdma_write_and_read_are_checked_on_the_target";
    let rdma = |p| ViAttributes::new(p).rdma(true, true);
    if peer_arg().is_some() {
        // The target: tells its buffer's address and handle, then serves
        // the client's RDMA until it says it is done.
        let inst = std::env::var("UVIA_TEST_INSTANCE").unwrap();
        let mut e = end(&inst, rdma);
        e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(1 << 20, 64)])))
            .unwrap();
        accept(&e, 530);
        let addr = e.buf.as_slice().as_ptr() as u64;
        e.buf.as_mut_slice()[..8].copy_from_slice(&addr.to_le_bytes());
        let h = e.buf.handle().0;
        e.buf.as_mut_slice()[8..12].copy_from_slice(&h.to_le_bytes());
        e.buf.as_mut_slice()[4096..4096 + 100_000].copy_from_slice(&pattern(100_000, 77));
        send(&e, 0, 12);
        // "Done" comes after the write completed: the bytes are there.
        assert_eq!(e.vi.recv_wait(Some(T)).unwrap().result(), Ok(1));
        assert_eq!(
            &e.buf.as_slice()[300_000..350_000],
            &pattern(50_000, 5)[..],
            "the RDMA write landed"
        );
        // The client's bad read breaks the connection on both sides.
        until_peer_leaves(&e);
        return;
    }
    across_hosts(name, |_, inst, spawn| {
        let peer = spawn("x");
        let mut e = end(inst, rdma);
        e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(0, 64)])))
            .unwrap();
        connect(&e, 530);
        assert_eq!(e.vi.recv_wait(Some(T)).unwrap().result(), Ok(12));
        let raddr = u64::from_le_bytes(e.buf.as_slice()[..8].try_into().unwrap());
        let rh = MemHandle(u32::from_le_bytes(
            e.buf.as_slice()[8..12].try_into().unwrap(),
        ));
        e.buf.as_mut_slice()[1000..51_000].copy_from_slice(&pattern(50_000, 5));
        e.vi.post_send(Box::new(Descriptor::rdma_write(
            Segment::remote(raddr + 300_000, rh),
            &[e.buf.segment(1000, 50_000)],
        )))
        .unwrap();
        assert_eq!(e.vi.send_wait(Some(T)).unwrap().result(), Ok(50_000));
        e.vi.post_send(Box::new(Descriptor::rdma_read(
            Segment::remote(raddr + 4096, rh),
            &[e.buf.segment(1 << 20, 100_000)],
        )))
        .unwrap();
        assert_eq!(e.vi.send_wait(Some(T)).unwrap().result(), Ok(100_000));
        assert_eq!(
            &e.buf.as_slice()[1 << 20..(1 << 20) + 100_000],
            &pattern(100_000, 77)[..]
        );
        e.buf.as_mut_slice()[0] = 1;
        assert_eq!(send(&e, 0, 1).result(), Ok(1));
        // Past the end of the target's region: refused there.
        e.vi.post_send(Box::new(Descriptor::rdma_read(
            Segment::remote(raddr + (2 << 20) - 10, rh),
            &[e.buf.segment(0, 100)],
        )))
        .unwrap();
        assert!(
            e.vi.send_wait(Some(T)).unwrap().error().is_some(),
            "out-of-bounds read must fail"
        );
        assert_eq!(e.vi.state(), ViState::Error);
        drop(e);
        peer.join();
    });
}

#[test]
fn a_killed_peer_fails_every_outstanding_descriptor_and_leaves_no_program() {
    let name = "a_killed_peer_fails_every_outstanding_descriptor_and_leaves_no_program";
    if peer_arg().is_some() {
        return killed_peer_server(&std::env::var("UVIA_TEST_INSTANCE").unwrap());
    }
    across_hosts(name, |hosts, inst, spawn| {
        killed_peer_client(inst, spawn("x"), || {
            assert!(attached(hosts, Side::B), "the peer's program is attached");
        });
        // SIGKILL closed the peer's link descriptor: its program is gone.
        let start = Instant::now();
        while attached(hosts, Side::B) && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            !attached(hosts, Side::B),
            "the killed peer's program is gone"
        );
    });
}

#[test]
fn opening_fails_clearly() {
    match Nic::open("xdp:uvia-none0") {
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.contains("uvia-none0") || text.contains("root"),
                "the error names what is missing: {text}"
            );
        }
        Ok(_) => panic!("opened a missing interface"),
    }
    assert!(matches!(
        Nic::open("xdp:"),
        Err(OpenError::BadAddress { .. })
    ));
    // Well-formed names get as far as the missing interface.
    for good in [
        "xdp:uvia-none0:busypoll",
        "xdp:uvia-none0:0:native:busypoll",
    ] {
        match Nic::open(good) {
            Err(OpenError::BadAddress { .. }) => panic!("{good} is a well-formed name"),
            Err(_) => {}
            Ok(_) => panic!("opened a missing interface"),
        }
    }
    for bad in [
        "xdp:eth0:x",
        "xdp:eth0:0:turbo",
        "xdp:eth0:generic:0",
        "xdp:eth0:native:generic",
        "xdp:eth0:0:1",
        "xdp::0",
        "xdp:eth0:busypoll:native",
        "xdp:eth0:busypoll:busypoll",
        "xdp:eth0:busy",
    ] {
        assert!(
            matches!(Nic::open(bad), Err(OpenError::BadAddress { .. })),
            "{bad}"
        );
    }
}

/// An xdp Nic is one AF_XDP socket on one interface queue, which the
/// kernel lets one socket serve: unlike a udp device, it is not shared, and
/// a second open, from this process or another, says why it fails.
#[test]
fn a_second_open_of_an_xdp_queue_fails_clearly() {
    if let Some(name) = peer_arg() {
        let err = Nic::open(&name).expect_err("the queue is served already");
        assert!(
            err.to_string().contains("served by another AF_XDP socket"),
            "{err}"
        );
        return;
    }
    if let Err(why) = TestHosts::available() {
        println!("skipped: {why}");
        return;
    }
    let hosts = TestHosts::create("xq").unwrap();
    if let Some(why) = unavailable(&hosts) {
        println!("skipped: {why}");
        return;
    }
    let _on_a = hosts.enter(Side::A).unwrap();
    let name = format!("xdp:{}", hosts.iface(Side::A));
    let first = Nic::open(&name).unwrap();
    // This process's own medium serves it: no wait for a release that
    // cannot come (another process's open waits some seconds first).
    let t0 = std::time::Instant::now();
    let err = Nic::open(&name).expect_err("the queue is served already");
    assert!(
        err.to_string().contains("served by another AF_XDP socket"),
        "{err}"
    );
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        t0.elapsed()
    );
    // Another process on the same host (it starts in this thread's namespace).
    Peer::spawn("a_second_open_of_an_xdp_queue_fails_clearly", "", &name).join();
    // Closed, the queue is free again.
    drop(first);
    drop(Nic::open(&name).unwrap());
}
