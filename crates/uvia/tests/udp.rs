//! Two real processes over the udp provider on loopback: every size class on
//! every reliability level, scatter and gather, RDMA write and read with
//! immediate data, the fault injector at 5% loss with exactly-once checks,
//! connection errors, and a peer killed mid-transfer. Each test re-runs this
//! binary as its peer.

mod peer;

use peer::*;
use std::time::{Duration, Instant};
use uvia::*;

const SIZES: &[usize] = &[0, 1, 8, 1000, 1408, 1409, 4096, 65536, 300_000, 1 << 20];

fn levels() -> [Reliability; 3] {
    [
        Reliability::Unreliable,
        Reliability::ReliableDelivery,
        Reliability::ReliableReception,
    ]
}

const LOSSY: &str = "loss=0.05,dup=0.01,reorder=0.02,delay=50us,corrupt=0.002,seed=";

fn lossy(seed: u32) -> NicOptions {
    NicOptions {
        inject: Some(format!("{LOSSY}{seed}")),
        ..NicOptions::default()
    }
}

#[test]
fn every_size_class_on_the_reliable_levels() {
    let inst = udp_instance();
    if let Some(a) = peer_arg() {
        let (lvl, d) = a.split_once(':').unwrap();
        let level = levels()[lvl.parse::<usize>().unwrap()];
        return echo_server(&inst, &NicOptions::default(), level, d.parse().unwrap());
    }
    for li in [1usize, 2] {
        let level = levels()[li];
        let d = 300 + li as u64;
        let peer = Peer::spawn(
            "every_size_class_on_the_reliable_levels",
            &inst,
            &format!("{li}:{d}"),
        );
        let mut e = end(&inst, |p| ViAttributes::new(p).reliability(level));
        connect(&e, d);
        for (k, &n) in SIZES.iter().enumerate() {
            let data = pattern(n, k as u8 + 1);
            e.buf.as_mut_slice()[..n].copy_from_slice(&data);
            e.vi.post_recv(Box::new(Descriptor::recv(&[e
                .buf
                .segment(1 << 20, 1 << 20)])))
                .unwrap();
            assert_eq!(send(&e, 0, n).result(), Ok(n as u32), "{level:?} {n} B");
            let r = e.vi.recv_wait(Some(T)).unwrap();
            assert_eq!(r.result(), Ok(n as u32), "{level:?} {n} B echo");
            assert_eq!(&e.buf.as_slice()[1 << 20..(1 << 20) + n], &data[..]);
        }
        stop(&mut e);
        e.vi.disconnect();
        peer.join();
    }
}

#[test]
fn unreliable_carries_every_size_on_a_clean_loopback() {
    let inst = udp_instance();
    if let Some(d) = peer_arg() {
        return echo_server(
            &inst,
            &NicOptions::default(),
            Reliability::Unreliable,
            d.parse().unwrap(),
        );
    }
    let peer = Peer::spawn(
        "unreliable_carries_every_size_on_a_clean_loopback",
        &inst,
        "310",
    );
    let mut e = end(&inst, |p| {
        ViAttributes::new(p).reliability(Reliability::Unreliable)
    });
    connect(&e, 310);
    // Loopback loses nothing while one message is in flight at a time.
    for (k, &n) in SIZES.iter().enumerate().filter(|(_, &n)| n <= 65536) {
        let data = pattern(n, k as u8 + 3);
        e.buf.as_mut_slice()[..n].copy_from_slice(&data);
        e.vi.post_recv(Box::new(Descriptor::recv(&[e
            .buf
            .segment(1 << 20, 1 << 20)])))
            .unwrap();
        assert_eq!(send(&e, 0, n).result(), Ok(n as u32));
        let r = e.vi.recv_wait(Some(T)).unwrap();
        assert_eq!(r.result(), Ok(n as u32), "{n} B echo");
        assert_eq!(&e.buf.as_slice()[1 << 20..(1 << 20) + n], &data[..]);
    }
    stop(&mut e);
    e.vi.disconnect();
    peer.join();
}

#[test]
fn rdma_read_is_checked_on_the_target() {
    let inst = udp_instance();
    let rdma = |p| ViAttributes::new(p).rdma(true, true);
    if peer_arg().is_some() {
        // The target: tells its buffer's address and handle, then serves.
        let mut e = end(&inst, rdma);
        accept(&e, 320);
        let addr = e.buf.as_slice().as_ptr() as u64;
        e.buf.as_mut_slice()[..8].copy_from_slice(&addr.to_le_bytes());
        let h = e.buf.handle().0;
        e.buf.as_mut_slice()[8..12].copy_from_slice(&h.to_le_bytes());
        e.buf.as_mut_slice()[4096..4096 + 100_000].copy_from_slice(&pattern(100_000, 77));
        send(&e, 0, 12);
        // The client's bad read breaks the connection on both sides.
        until_peer_leaves(&e);
        return;
    }
    let peer = Peer::spawn("rdma_read_is_checked_on_the_target", &inst, "x");
    let e = end(&inst, rdma);
    e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(0, 64)])))
        .unwrap();
    connect(&e, 320);
    let r = e.vi.recv_wait(Some(T)).unwrap();
    assert_eq!(r.result(), Ok(12));
    let raddr = u64::from_le_bytes(e.buf.as_slice()[..8].try_into().unwrap());
    let rh = MemHandle(u32::from_le_bytes(
        e.buf.as_slice()[8..12].try_into().unwrap(),
    ));
    // RDMA read of 100 000 bytes.
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
    // A read past the end of the target's region is refused by the target.
    e.vi.post_send(Box::new(Descriptor::rdma_read(
        Segment::remote(raddr + (2 << 20) - 10, rh),
        &[e.buf.segment(0, 100)],
    )))
    .unwrap();
    let bad = e.vi.send_wait(Some(T)).unwrap();
    assert!(bad.error().is_some(), "out-of-bounds read must fail");
    assert_eq!(e.vi.state(), ViState::Error);
    drop(e);
    peer.join();
}

#[test]
fn rdma_write_with_immediate_data_lands_in_order() {
    let inst = udp_instance();
    let rdma = |p| ViAttributes::new(p).rdma(true, true);
    if peer_arg().is_some() {
        let mut e = end(&inst, rdma);
        e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(64, 16)])))
            .unwrap();
        accept(&e, 330);
        let addr = e.buf.as_slice().as_ptr() as u64;
        e.buf.as_mut_slice()[..8].copy_from_slice(&addr.to_le_bytes());
        let h = e.buf.handle().0;
        e.buf.as_mut_slice()[8..12].copy_from_slice(&h.to_le_bytes());
        send(&e, 0, 12);
        let r = e.vi.recv_wait(Some(T)).unwrap();
        assert_eq!(r.immediate(), Some(0xabcd));
        assert_eq!(&e.buf.as_slice()[200_000..250_000], &pattern(50_000, 5)[..]);
        send(&e, 0, 1);
        until_peer_leaves(&e);
        return;
    }
    let peer = Peer::spawn("rdma_write_with_immediate_data_lands_in_order", &inst, "x");
    let mut e = end(&inst, rdma);
    for _ in 0..2 {
        e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(0, 64)])))
            .unwrap();
    }
    connect(&e, 330);
    let r = e.vi.recv_wait(Some(T)).unwrap();
    assert_eq!(r.result(), Ok(12));
    let raddr = u64::from_le_bytes(e.buf.as_slice()[..8].try_into().unwrap());
    let rh = MemHandle(u32::from_le_bytes(
        e.buf.as_slice()[8..12].try_into().unwrap(),
    ));
    e.buf.as_mut_slice()[4096..4096 + 50_000].copy_from_slice(&pattern(50_000, 5));
    let d = Descriptor::rdma_write(
        Segment::remote(raddr + 200_000, rh),
        &[e.buf.segment(4096, 50_000)],
    )
    .with_immediate(0xabcd);
    e.vi.post_send(Box::new(d)).unwrap();
    assert_eq!(e.vi.send_wait(Some(T)).unwrap().result(), Ok(50_000));
    // The target's acknowledgement comes after it checked the bytes.
    let r = e.vi.recv_wait(Some(T)).unwrap();
    assert_eq!(r.result(), Ok(1));
    e.vi.disconnect();
    peer.join();
}

/// Sends `count` numbered messages of mixed sizes through the echo server
/// over a lossy medium and checks each comes back once, in order, intact.
fn lossy_echo(test: &str, level: Reliability, d: u64, count: usize) {
    let sizes = [1usize, 64, 1500, 9000, 65536, 200_000];
    echo_through(test, lossy, level, d, count, &sizes, Wait::Sleep);
}

/// How the client takes its completions.
#[derive(Clone, Copy, PartialEq)]
enum Wait {
    /// `send_wait` and `recv_wait`, which may sleep in the receive itself.
    Sleep,
    /// `send_done` and `recv_done` in a loop: frames come only through
    /// polls (and, on udp, are placed where they belong).
    Poll,
}

/// [`lossy_echo`] through Nics made by `nic(seed)`, with messages of
/// `sizes`, the client taking its completions as `wait` says.
fn echo_through(
    test: &str,
    nic: fn(u32) -> NicOptions,
    level: Reliability,
    d: u64,
    count: usize,
    sizes: &[usize],
    wait: Wait,
) {
    let inst = udp_instance();
    if peer_arg().is_some() {
        return echo_server(&inst, &nic(2), level, d);
    }
    let peer = Peer::spawn(test, &inst, "x");
    let mut e = end_with(&inst, &nic(1), |p| ViAttributes::new(p).reliability(level));
    connect(&e, d);
    for i in 0..count {
        let n = sizes[i % sizes.len()];
        let mut data = pattern(n.max(4), i as u8);
        data[..4].copy_from_slice(&(i as u32).to_le_bytes());
        data.truncate(n.max(4));
        let n = data.len();
        e.buf.as_mut_slice()[..n].copy_from_slice(&data);
        e.vi.post_recv(Box::new(Descriptor::recv(&[e
            .buf
            .segment(1 << 20, 1 << 20)])))
            .unwrap();
        let (sent, got) = match wait {
            Wait::Sleep => {
                let sent = send(&e, 0, n);
                (sent, e.vi.recv_wait(Some(T)).unwrap())
            }
            Wait::Poll => {
                e.vi.post_send(Box::new(Descriptor::send(&[e.buf.segment(0, n)])))
                    .unwrap();
                let (mut sent, mut got) = (None, None);
                let start = Instant::now();
                while (sent.is_none() || got.is_none()) && start.elapsed() < T {
                    sent = sent.or_else(|| e.vi.send_done());
                    got = got.or_else(|| e.vi.recv_done());
                }
                match (sent, got) {
                    (Some(s), Some(g)) => (s, g),
                    _ => panic!("message {i} of {n} B: no echo within {T:?} to a poller"),
                }
            }
        };
        assert_eq!(sent.result(), Ok(n as u32), "message {i}");
        assert_eq!(got.result(), Ok(n as u32), "echo of message {i}");
        assert_eq!(
            &e.buf.as_slice()[1 << 20..(1 << 20) + n],
            &data[..],
            "message {i}"
        );
    }
    stop(&mut e);
    e.vi.disconnect();
    peer.join();
}

#[test]
fn reliable_delivery_is_exactly_once_at_5_percent_loss() {
    lossy_echo(
        "reliable_delivery_is_exactly_once_at_5_percent_loss",
        Reliability::ReliableDelivery,
        340,
        120,
    );
}

/// Loss alone leaves the receiver placing large messages' frames straight
/// into the descriptor's memory (`Conn::expected`); a frame lost, or sent
/// again out of turn, lands where another was expected, and the message
/// must still arrive whole.
#[test]
fn large_messages_placed_in_memory_arrive_whole_at_5_percent_loss() {
    fn loss(seed: u32) -> NicOptions {
        NicOptions {
            inject: Some(format!("loss=0.05,seed={seed}")),
            ..NicOptions::default()
        }
    }
    echo_through(
        "large_messages_placed_in_memory_arrive_whole_at_5_percent_loss",
        loss,
        Reliability::ReliableDelivery,
        342,
        40,
        &[1 << 20, 300_000, 64, 200_001, 65536 * 3],
        Wait::Sleep,
    );
}

/// Duplicated and reordered frames, intact: the injector cannot place
/// (it holds and copies frames), and a receiver that polls must take them
/// the usual way, not keep asking for a placed receive it was refused.
#[test]
fn large_messages_arrive_whole_to_a_poller_where_the_medium_cannot_place() {
    fn shuffled(seed: u32) -> NicOptions {
        NicOptions {
            inject: Some(format!("dup=0.02,reorder=0.05,seed={seed}")),
            ..NicOptions::default()
        }
    }
    echo_through(
        "large_messages_arrive_whole_to_a_poller_where_the_medium_cannot_place",
        shuffled,
        Reliability::ReliableDelivery,
        343,
        5,
        &[1 << 20, 300_000, 64, 200_001],
        Wait::Poll,
    );
}

/// A receive descriptor shorter than the frame that comes for it is never
/// written past its end, whether or not the frame was expected there: after
/// a large send, the next send's first frame is expected at the start of
/// the next descriptor, and one too long for it completes it with a length
/// error, every byte after it as it was. Polled, so that frames are placed.
#[test]
fn a_short_receive_descriptor_is_never_written_past() {
    let inst = udp_instance();
    let reliable = |p| ViAttributes::new(p).reliability(Reliability::ReliableDelivery);
    const MIB: usize = 1 << 20;
    const SHORT: usize = 4096;
    if peer_arg().is_some() {
        let mut e = end(&inst, reliable);
        accept(&e, 344);
        e.buf.as_mut_slice()[..MIB].copy_from_slice(&pattern(MIB, 3));
        assert_eq!(send(&e, 0, MIB).result(), Ok(MIB as u32));
        // Too long for the peer's next descriptor: the connection breaks.
        e.vi.post_send(Box::new(Descriptor::send(&[e.buf.segment(0, 60_000)])))
            .unwrap();
        let _ = e.vi.send_wait(Some(T));
        return;
    }
    let peer = Peer::spawn(
        "a_short_receive_descriptor_is_never_written_past",
        &inst,
        "x",
    );
    let mut e = end(&inst, reliable);
    e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(0, MIB)])))
        .unwrap();
    e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(MIB, SHORT)])))
        .unwrap();
    e.buf.as_mut_slice()[MIB + SHORT..].fill(0xa5);
    connect(&e, 344);
    let mut done = Vec::new();
    let start = Instant::now();
    while done.len() < 2 && start.elapsed() < T {
        done.extend(e.vi.recv_done());
    }
    assert_eq!(done.len(), 2, "both receives complete within {T:?}");
    assert_eq!(done[0].result(), Ok(MIB as u32));
    let want = pattern(MIB, 3);
    let wrong = e.buf.as_slice()[..MIB]
        .iter()
        .zip(&want)
        .position(|(a, b)| a != b);
    assert_eq!(wrong, None, "the 1 MiB message differs at this byte");
    assert!(
        done[1].error().is_some(),
        "a send longer than the descriptor fails it"
    );
    let past = &e.buf.as_slice()[MIB + SHORT..];
    let touched = past.iter().position(|&b| b != 0xa5);
    assert_eq!(
        touched, None,
        "bytes past the short descriptor were written"
    );
    drop(e);
    peer.join();
}

#[test]
fn reliable_reception_is_exactly_once_at_5_percent_loss() {
    lossy_echo(
        "reliable_reception_is_exactly_once_at_5_percent_loss",
        Reliability::ReliableReception,
        341,
        60,
    );
}

#[test]
fn connection_errors_are_clear() {
    let inst = udp_instance();
    if let Some(a) = peer_arg() {
        let e = end(&inst, |p| {
            ViAttributes::new(p).reliability(Reliability::ReliableDelivery)
        });
        match a.as_str() {
            "reject" => {
                let mut req = e.nic.connect_wait(&disc(351), Some(T)).unwrap();
                req.reject().unwrap();
            }
            _ => {
                // Accepts with a VI of another level: a mismatch.
                let mut req = e.nic.connect_wait(&disc(352), Some(T)).unwrap();
                assert!(req.accept(&e.vi).is_err());
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        return;
    }
    // Nobody listens: a clear error after the timeout.
    let e = end(&inst, ViAttributes::new);
    let t0 = Instant::now();
    let r = e.vi.connect_request(
        &NetAddress::new(&peer_host(&inst), disc(350)),
        Duration::from_millis(300),
    );
    assert!(
        matches!(
            r,
            Err(ConnectError::NoListener { .. } | ConnectError::NoAnswer { .. })
        ),
        "{r:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(e.vi.state(), ViState::Idle);
    // Nothing bound at the port: a request to a server that listens
    // already (the libfabric provider's) is refused at once.
    let free = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let t0 = Instant::now();
    let r = e.vi.connect_request_listening(
        &NetAddress::new(&format!("127.0.0.1:{port}"), disc(350)),
        T,
        &[],
    );
    assert!(matches!(r, Err(ConnectError::NoListener { .. })), "{r:?}");
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(e.vi.state(), ViState::Idle);
    drop(e);
    let peer = Peer::spawn("connection_errors_are_clear", &inst, "reject");
    let e = end(&inst, ViAttributes::new);
    let r =
        e.vi.connect_request(&NetAddress::new(&peer_host(&inst), disc(351)), T);
    assert!(matches!(r, Err(ConnectError::Rejected)), "{r:?}");
    drop(e);
    peer.join();
    let peer = Peer::spawn("connection_errors_are_clear", &inst, "mismatch");
    let e = end(&inst, |p| {
        ViAttributes::new(p).reliability(Reliability::Unreliable)
    });
    let r =
        e.vi.connect_request(&NetAddress::new(&peer_host(&inst), disc(352)), T);
    assert!(matches!(r, Err(ConnectError::Mismatch(_))), "{r:?}");
    peer.join();
    // A host that does not parse.
    let r =
        e.vi.connect_request(&NetAddress::new("no such host:1", disc(1)), T);
    assert!(matches!(r, Err(ConnectError::BadAddress(_))), "{r:?}");
    // Addresses no single peer can answer from: refused at once, not
    // asked until the timeout.
    for host in [
        "0.0.0.0:7000",
        "[::]:7000",
        "127.0.0.1:0",
        "255.255.255.255:7000",
        "224.0.0.1:7000",
    ] {
        let t0 = Instant::now();
        let r = e.vi.connect_request(&NetAddress::new(host, disc(1)), T);
        assert!(
            matches!(r, Err(ConnectError::BadAddress(_))),
            "{host}: {r:?}"
        );
        assert!(t0.elapsed() < Duration::from_millis(100), "{host}");
        assert_eq!(e.vi.state(), ViState::Idle);
    }
}

#[test]
fn a_killed_peer_fails_every_outstanding_descriptor() {
    let name = "a_killed_peer_fails_every_outstanding_descriptor";
    if peer_arg().is_some() {
        return killed_peer_server(&udp_instance());
    }
    let inst = udp_instance();
    killed_peer_client(&inst, Peer::spawn(name, &inst, "x"), || {});
    across_hosts(name, false, |inst, spawn| {
        killed_peer_client(inst, spawn("x"), || {})
    });
}

/// Runs `body` on test host a with an instance whose peer runs on host b;
/// skips with a reason where test hosts cannot be made.
fn across_hosts(test: &str, v6: bool, body: impl FnOnce(&str, &dyn Fn(&str) -> Peer)) {
    use uvia_net::netns::{Side, TestHosts};
    if let Err(why) = TestHosts::available() {
        println!("skipped: {why}");
        return;
    }
    let hosts = TestHosts::create("it").unwrap();
    let (a, b): (std::net::IpAddr, std::net::IpAddr) = if v6 {
        (hosts.ipv6(Side::A).into(), hosts.ipv6(Side::B).into())
    } else {
        (hosts.ipv4(Side::A).into(), hosts.ipv4(Side::B).into())
    };
    let inst = udp_hosts_instance(a, b, 7331);
    let ns_b = hosts.name(Side::B).to_string();
    let spawn = |arg: &str| Peer::spawn_in(&ns_b, test, &inst, arg);
    {
        let _on_a = hosts.enter(Side::A).unwrap();
        body(&inst, &spawn);
    }
    drop(hosts);
}

#[test]
fn across_two_test_hosts_every_size_arrives_once_ipv4_and_ipv6() {
    if let Some(a) = peer_arg() {
        let inst = std::env::var("UVIA_TEST_INSTANCE").unwrap();
        let opts = if a == "lossy" {
            lossy(5)
        } else {
            NicOptions::default()
        };
        return echo_server(&inst, &opts, Reliability::ReliableDelivery, 370);
    }
    for (v6, lossy_run) in [(false, false), (true, false), (false, true)] {
        across_hosts(
            "across_two_test_hosts_every_size_arrives_once_ipv4_and_ipv6",
            v6,
            |inst, spawn| {
                let peer = spawn(if lossy_run { "lossy" } else { "clean" });
                let opts = if lossy_run {
                    lossy(6)
                } else {
                    NicOptions::default()
                };
                let mut e = end_with(inst, &opts, |p| {
                    ViAttributes::new(p).reliability(Reliability::ReliableDelivery)
                });
                connect(&e, 370);
                for (k, &n) in SIZES.iter().enumerate() {
                    let data = pattern(n, k as u8 + 9);
                    e.buf.as_mut_slice()[..n].copy_from_slice(&data);
                    e.vi.post_recv(Box::new(Descriptor::recv(&[e
                        .buf
                        .segment(1 << 20, 1 << 20)])))
                        .unwrap();
                    assert_eq!(send(&e, 0, n).result(), Ok(n as u32), "{n} B (v6 {v6})");
                    let r = e.vi.recv_wait(Some(T)).unwrap();
                    assert_eq!(r.result(), Ok(n as u32), "{n} B echo (v6 {v6})");
                    assert_eq!(&e.buf.as_slice()[1 << 20..(1 << 20) + n], &data[..]);
                }
                stop(&mut e);
                e.vi.disconnect();
                peer.join();
            },
        );
    }
}

#[test]
fn a_cq_waits_for_network_vis() {
    let inst = udp_instance();
    if peer_arg().is_some() {
        // Two messages, some time apart, so the client's CQ wait sleeps.
        let mut e = end(&inst, ViAttributes::new);
        accept(&e, 380);
        for k in 0..2u8 {
            std::thread::sleep(Duration::from_millis(50));
            e.buf.as_mut_slice()[..100].fill(k);
            assert_eq!(send(&e, 0, 100).result(), Ok(100));
        }
        until_peer_leaves(&e);
        return;
    }
    let peer = Peer::spawn("a_cq_waits_for_network_vis", &inst, "x");
    let nic = Nic::open(&my_nic(&inst)).unwrap();
    let ptag = nic.create_ptag().unwrap();
    let cq = nic.create_cq(16).unwrap();
    let vi = nic
        .create_vi(ViAttributes::new(ptag), None, Some(&cq))
        .unwrap();
    let buf = nic.alloc_region(4096, MemAttributes::new(ptag)).unwrap();
    for _ in 0..2 {
        vi.post_recv(Box::new(Descriptor::recv(&[buf.segment(0, 4096)])))
            .unwrap();
    }
    vi.connect_request(&NetAddress::new(&peer_host(&inst), disc(380)), T)
        .unwrap();
    for k in 0..2u8 {
        let c = cq.wait(Some(T)).unwrap();
        assert_eq!(c.queue, Queue::Recv);
        let d =
            c.vi.recv_done()
                .expect("the notice names a completed receive");
        assert_eq!(d.result(), Ok(100));
        assert_eq!(buf.as_slice()[0], k);
    }
    vi.disconnect();
    peer.join();
}

#[test]
fn peer_to_peer_connects_two_clients() {
    let inst = udp_instance();
    let (mine, theirs) = if peer_arg().is_some() {
        (391, 390)
    } else {
        (390, 391)
    };
    let peer = peer_arg()
        .is_none()
        .then(|| Peer::spawn("peer_to_peer_connects_two_clients", &inst, "x"));
    let mut e = end(&inst, ViAttributes::new);
    e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(4096, 64)])))
        .unwrap();
    let remote =
        e.vi.connect_peer_request(
            &disc(mine),
            &NetAddress::new(&peer_host(&inst), disc(theirs)),
            T,
        )
        .unwrap();
    assert_eq!(remote.reliability, Reliability::ReliableDelivery);
    assert_eq!(e.vi.state(), ViState::Connected);
    // Each side says who it is; each hears the other.
    e.buf.as_mut_slice()[0] = mine as u8;
    assert_eq!(send(&e, 0, 1).result(), Ok(1));
    let r = e.vi.recv_wait(Some(T)).unwrap();
    assert_eq!(r.result(), Ok(1));
    assert_eq!(e.buf.as_slice()[4096], theirs as u8);
    if let Some(p) = peer {
        e.vi.disconnect();
        p.join();
    } else {
        until_peer_leaves(&e);
    }
}

#[test]
fn peer_to_peer_is_refused_clearly_on_shm() {
    if peer_arg().is_some() {
        return;
    }
    let nic = Nic::open("shm").unwrap();
    let vi = nic
        .create_vi(ViAttributes::new(nic.create_ptag().unwrap()), None, None)
        .unwrap();
    let r = vi.connect_peer_request(&disc(1), &NetAddress::new("0", disc(2)), T);
    assert!(matches!(r, Err(ConnectError::Unsupported(_))), "{r:?}");
    assert_eq!(vi.state(), ViState::Idle);
}

#[test]
fn a_nic_on_any_port_has_a_port_of_its_own() {
    let inst = udp_instance();
    if peer_arg().is_some() {
        // Holds its port while the test tries to open a second Nic there.
        let e = end(&inst, ViAttributes::new);
        accept(&e, 392);
        until_peer_leaves(&e);
        return;
    }
    let peer = Peer::spawn("a_nic_on_any_port_has_a_port_of_its_own", &inst, "x");
    let e = end(&inst, ViAttributes::new);
    connect(&e, 392);
    // A port named is the host's device, shared by the user's processes:
    // a second Nic there, from this process or another, joins it and is
    // known by the device's address (tests/shared_device.rs shows requests
    // reaching each).
    let held = format!("udp:{}", peer_host(&inst));
    let second = Nic::open(&held).expect("the device is shared");
    assert_eq!(second.attributes().address, peer_host(&inst));
    let again = Nic::open(&my_nic(&inst)).expect("shared here too");
    assert_eq!(again.attributes().address, e.nic.attributes().address);
    // Nics on any port never share one.
    let nics: Vec<Nic> = (0..32).map(|_| Nic::open("udp").unwrap()).collect();
    let mut addrs: Vec<String> = nics
        .iter()
        .map(|n| n.attributes().address.clone())
        .collect();
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), nics.len());
    e.vi.disconnect();
    peer.join();
}

#[test]
fn two_connections_between_the_same_two_nics() {
    let inst = udp_instance();
    if peer_arg().is_some() {
        // One Nic, two VIs, each accepted while the other is connected
        // and not polled; then each echoes one message.
        let e = end(&inst, ViAttributes::new);
        let vi2 = e
            .nic
            .create_vi(ViAttributes::new(e.ptag), None, None)
            .unwrap();
        for (k, vi) in [&e.vi, &vi2].into_iter().enumerate() {
            vi.post_recv(Box::new(Descriptor::recv(&[e
                .buf
                .segment(4096 * (k + 1), 64)])))
                .unwrap();
        }
        accept(&e, 393);
        let mut req = e.nic.connect_wait(&disc(394), Some(T)).unwrap();
        req.accept(&vi2).unwrap();
        for (k, vi) in [&vi2, &e.vi].into_iter().enumerate() {
            let r = vi.recv_wait(Some(T)).unwrap();
            assert_eq!(r.result(), Ok(1), "message on connection {}", 2 - k);
            vi.post_send(Box::new(Descriptor::send(&[e
                .buf
                .segment(4096 * (2 - k), 1)])))
                .unwrap();
            assert_eq!(vi.send_wait(Some(T)).unwrap().result(), Ok(1));
        }
        until_peer_leaves(&e);
        return;
    }
    let peer = Peer::spawn("two_connections_between_the_same_two_nics", &inst, "x");
    let mut e = end(&inst, ViAttributes::new);
    let vi2 = e
        .nic
        .create_vi(ViAttributes::new(e.ptag), None, None)
        .unwrap();
    connect(&e, 393);
    // The first connection is up and idle; the second goes to the same Nic.
    vi2.connect_request(&NetAddress::new(&peer_host(&inst), disc(394)), T)
        .expect("a second connection to the same Nic completes");
    for (k, vi) in [&vi2, &e.vi].into_iter().enumerate() {
        vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(8192 + k, 1)])))
            .unwrap();
        e.buf.as_mut_slice()[k] = 20 + k as u8;
        vi.post_send(Box::new(Descriptor::send(&[e.buf.segment(k, 1)])))
            .unwrap();
        assert_eq!(vi.send_wait(Some(T)).unwrap().result(), Ok(1));
        assert_eq!(vi.recv_wait(Some(T)).unwrap().result(), Ok(1));
        assert_eq!(
            e.buf.as_slice()[8192 + k],
            20 + k as u8,
            "echoed on its own VI"
        );
    }
    vi2.disconnect();
    e.vi.disconnect();
    peer.join();
}

/// How a peer dies in [`a_dead_peer_fails_every_descriptor_of_a_busy_vi`].
const DEATHS: [&str; 2] = ["killed", "stopped"];

#[test]
fn a_dead_peer_fails_every_descriptor_of_a_busy_vi() {
    let test = "a_dead_peer_fails_every_descriptor_of_a_busy_vi";
    if let Some(a) = peer_arg() {
        // Answers one message, then waits inside the library (acknowledging,
        // as a live process does) until killed or stopped.
        let (li, d) = a.split_once(':').unwrap();
        let level = levels()[li.parse::<usize>().unwrap()];
        let e = end(&udp_instance(), |p| ViAttributes::new(p).reliability(level));
        for _ in 0..2 {
            e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(0, 4096)])))
                .unwrap();
        }
        accept(&e, d.parse().unwrap());
        e.vi.recv_wait(Some(T)).unwrap();
        send(&e, 0, 8);
        let _ = e.vi.recv_wait(Some(Duration::from_secs(60)));
        return;
    }
    let mut d = 400;
    for (li, level) in levels().into_iter().enumerate() {
        for death in DEATHS {
            d += 1;
            let inst = udp_instance();
            let mut peer = Peer::spawn(test, &inst, &format!("{li}:{d}"));
            let e = end(&inst, |p| ViAttributes::new(p).reliability(level));
            for k in 0..4 {
                e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(4096 * k, 64)])))
                    .unwrap();
            }
            connect(&e, d);
            assert_eq!(send(&e, 0, 8).result(), Ok(8));
            let first = e.vi.recv_wait(Some(T)).unwrap();
            assert_eq!(first.result(), Ok(8), "{level:?}: the peer's answer");
            match death {
                "killed" => peer.kill(),
                _ => {
                    let pid = peer.0.as_ref().unwrap().id() as i32;
                    // SAFETY: signals a child process this test started.
                    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
                    // Stopped, not merely signalled: it answers nothing more.
                    let stat = format!("/proc/{pid}/stat");
                    while !std::fs::read_to_string(&stat)
                        .unwrap()
                        .rsplit_once(") ")
                        .is_some_and(|(_, rest)| rest.starts_with('T'))
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
            // The application keeps posting and polling, never waiting
            // on an empty queue: every receive still fails.
            let t0 = Instant::now();
            let (mut failed, mut sends) = (0, 0);
            while failed < 3 && t0.elapsed() < T {
                if e.vi.state() == ViState::Connected && sends < 10_000 {
                    let s = Descriptor::send(&[e.buf.segment(0, 1000)]);
                    if e.vi.post_send(Box::new(s)).is_ok() {
                        sends += 1;
                    }
                }
                while e.vi.send_done().is_some() {}
                if let Some(r) = e.vi.recv_done() {
                    assert!(
                        r.error().is_some(),
                        "{level:?} {death}: a receive from a dead peer"
                    );
                    failed += 1;
                }
            }
            let took = t0.elapsed();
            eprintln!("{level:?}, peer {death}: every descriptor failed after {took:?}");
            assert_eq!(failed, 3, "{level:?} {death}: every receive failed");
            assert_eq!(e.vi.state(), ViState::Error, "{level:?} {death}");
            // Within the default idle timeout (2 s), and a margin for a busy
            // machine: a bound the application can count on, not a speed.
            assert!(took < Duration::from_secs(3), "{level:?} {death}: {took:?}");
            peer.kill();
        }
    }
}
