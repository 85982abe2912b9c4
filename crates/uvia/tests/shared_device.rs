//! One udp device address shared by several processes of the user, as
//! VIA's host device is: requests to the host address reach the process
//! that waits on their discriminator, whichever opened the device first;
//! a port held by another program, or a device of another user, is refused;
//! the owner's exit hands the address to a process that shares it. Each
//! test re-runs this binary as its peers.

mod peer;

use peer::*;
use std::time::{Duration, Instant};
use uvia::*;

/// A loopback device address with a free port: `udp:127.0.0.1:<P>`, and
/// its host address `127.0.0.1:<P>`.
fn free_device() -> (String, String) {
    if let Ok(i) = std::env::var("UVIA_TEST_INSTANCE") {
        let host = i.trim_start_matches("udp:").to_string();
        return (i, host);
    }
    // A port below the kernel's ephemeral range, free now: the tests here
    // let the device's address go (its owner exits) and take it again,
    // and an ephemeral port could be handed to another program's socket
    // in between (seen once in CI). Nothing binds below the range unasked.
    let below = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let from = 10_000.min(below / 2);
    let span = u64::from(below - from);
    let mut seed = {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    };
    for _ in 0..1000 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let port = from + ((seed >> 33) % span) as u16;
        let host = format!("127.0.0.1:{port}");
        if std::net::UdpSocket::bind(&host).is_ok() {
            return (format!("udp:{host}"), host);
        }
    }
    panic!("no free udp port below {below} on 127.0.0.1");
}

/// True once some socket holds `host` (a peer has opened the device).
fn held(host: &str) -> bool {
    std::net::UdpSocket::bind(host).is_err()
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < T, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A VI with a 64 KiB buffer on `nic`.
struct Side {
    vi: Vi,
    buf: MemoryRegion,
}

fn side(nic: &Nic) -> Side {
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let buf = nic
        .alloc_region(64 << 10, MemAttributes::new(ptag))
        .unwrap();
    Side { vi, buf }
}

/// Sends `bytes` from the front of the buffer.
fn say(s: &mut Side, bytes: &[u8]) {
    s.buf.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
    s.vi.post_send(Box::new(Descriptor::send(&[s.buf.segment(0, bytes.len())])))
        .unwrap();
    assert_eq!(
        s.vi.send_wait(Some(T)).unwrap().result(),
        Ok(bytes.len() as u32)
    );
}

/// Posts a receive at 32 KiB of the buffer.
fn expect(s: &Side) {
    s.vi.post_recv(Box::new(Descriptor::recv(&[s.buf.segment(32 << 10, 1024)])))
        .unwrap();
}

/// Waits for the receive posted by `expect`: its bytes.
fn heard(s: &Side) -> Vec<u8> {
    let d = s.vi.recv_wait(Some(T)).unwrap();
    let n = d.result().unwrap() as usize;
    s.buf.as_slice()[32 << 10..(32 << 10) + n].to_vec()
}

/// A server process on `device`: accepts one client on `d`, answers its
/// message with `<tag>:<message>`, then waits for the client to go.
fn tag_server(device: &str, d: u64, tag: &str) {
    let nic = Nic::open(device).unwrap();
    let mut s = side(&nic);
    expect(&s);
    let mut req = nic.connect_wait(&disc(d), Some(T)).unwrap();
    req.accept(&s.vi).unwrap();
    let got = heard(&s);
    let mut answer = format!("{tag}:").into_bytes();
    answer.extend_from_slice(&got);
    say(&mut s, &answer);
    until_gone(&s);
}

/// Waits until the peer disconnects: a receive posted comes back flushed,
/// or cannot be posted once the disconnect was seen.
fn until_gone(s: &Side) {
    match s
        .vi
        .post_recv(Box::new(Descriptor::recv(&[s.buf.segment(0, 64)])))
    {
        Ok(()) => {
            let d = s.vi.recv_wait(Some(T)).unwrap();
            assert!(
                d.error().is_some(),
                "expected the disconnect, got a message"
            );
        }
        Err(r) => assert!(matches!(r.error, PostError::ViError), "{:?}", r.error),
    }
    assert_eq!(s.vi.state(), ViState::Error);
}

/// Connects `s` to `d` at `host`, says `msg`, and returns the answer.
fn ask(s: &mut Side, host: &str, d: u64, msg: &[u8]) -> Vec<u8> {
    s.vi.connect_request(&NetAddress::new(host, disc(d)), T)
        .unwrap();
    expect(s);
    say(s, msg);
    heard(s)
}

#[test]
fn two_servers_on_one_device_are_both_reachable() {
    let (device, host) = free_device();
    if let Some(a) = peer_arg() {
        let (d, tag) = a.split_once(':').unwrap();
        return tag_server(&device, d.parse().unwrap(), tag);
    }
    // The first server owns the device; the second, opened after it, shares it.
    let test = "two_servers_on_one_device_are_both_reachable";
    let first = Peer::spawn(test, &device, "501:first");
    wait_until("the first server holds the device", || held(&host));
    let second = Peer::spawn(test, &device, "502:second");
    let client = Nic::open("udp:127.0.0.1").unwrap();
    // The second server may not listen yet: a client asks again until it does.
    let mut b = side(&client);
    assert_eq!(ask(&mut b, &host, 502, b"to two"), b"second:to two");
    let mut a = side(&client);
    assert_eq!(ask(&mut a, &host, 501, b"to one"), b"first:to one");
    for s in [&a, &b] {
        s.vi.disconnect();
    }
    first.join();
    second.join();
}

#[test]
fn a_device_opened_by_a_process_that_waits_on_nothing_hands_requests_on() {
    let (device, host) = free_device();
    if let Some(a) = peer_arg() {
        let (d, tag) = a.split_once(':').unwrap();
        return tag_server(&device, d.parse().unwrap(), tag);
    }
    // This process opens the device first and never waits on it; two
    // servers of other processes share it.
    let owner = Nic::open(&device).unwrap();
    assert_eq!(owner.attributes().address, host);
    let test = "a_device_opened_by_a_process_that_waits_on_nothing_hands_requests_on";
    let one = Peer::spawn(test, &device, "511:one");
    let two = Peer::spawn(test, &device, "512:two");
    let client = Nic::open("udp:127.0.0.1").unwrap();
    let mut a = side(&client);
    let mut b = side(&client);
    assert_eq!(ask(&mut a, &host, 511, b"hello"), b"one:hello");
    assert_eq!(ask(&mut b, &host, 512, b"hi"), b"two:hi");
    // Nobody waits on a third discriminator: refused, as on any Nic.
    let c = side(&client);
    let r = c.vi.connect_request(
        &NetAddress::new(&host, disc(513)),
        Duration::from_millis(300),
    );
    assert!(matches!(r, Err(ConnectError::NoListener { .. })), "{r:?}");
    a.vi.disconnect();
    b.vi.disconnect();
    one.join();
    two.join();
    drop(owner);
}

#[test]
fn peer_to_peer_reaches_a_process_sharing_the_device() {
    let (device, host) = free_device();
    if let Some(other) = peer_arg() {
        // Shares the device; asks the test's Nic peer to peer.
        let nic = Nic::open(&device).unwrap();
        assert_eq!(nic.attributes().address, host);
        let mut s = side(&nic);
        expect(&s);
        s.vi.connect_peer_request(&disc(521), &NetAddress::new(&other, disc(522)), T)
            .unwrap();
        say(&mut s, b"from the member");
        assert_eq!(heard(&s), b"from the other side");
        until_gone(&s);
        return;
    }
    let owner = Nic::open(&device).unwrap();
    let mine = Nic::open("udp:127.0.0.1").unwrap();
    let my_host = mine.attributes().address.clone();
    let member = Peer::spawn(
        "peer_to_peer_reaches_a_process_sharing_the_device",
        &device,
        &my_host,
    );
    let mut s = side(&mine);
    expect(&s);
    // Named by the device's address, the peer is whichever process waits
    // there on its discriminator.
    s.vi.connect_peer_request(&disc(522), &NetAddress::new(&host, disc(521)), T)
        .unwrap();
    assert_eq!(heard(&s), b"from the member");
    say(&mut s, b"from the other side");
    s.vi.disconnect();
    member.join();
    drop(owner);
}

#[test]
fn a_port_held_by_another_program_is_refused_clearly() {
    if peer_arg().is_some() {
        return;
    }
    let foreign = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = foreign.local_addr().unwrap();
    let err = Nic::open(&format!("udp:{addr}")).expect_err("the port is not a device");
    let text = err.to_string();
    assert!(text.contains("held by another program"), "{text}");
    assert!(text.contains(&addr.to_string()), "{text}");
    // The foreign socket still has its port to itself.
    let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    probe.send_to(b"x", addr).unwrap();
    let mut b = [0u8; 4];
    foreign
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(foreign.recv(&mut b).unwrap(), 1);
}

#[test]
fn when_the_owner_exits_a_process_sharing_the_device_takes_it_over() {
    let (device, host) = free_device();
    if peer_arg().is_some() {
        // Owns the device until its one client leaves, then exits.
        return tag_server(&device, 531, "owner");
    }
    let owner = Peer::spawn(
        "when_the_owner_exits_a_process_sharing_the_device_takes_it_over",
        &device,
        "x",
    );
    wait_until("the owner holds the device", || held(&host));
    let shared = Nic::open(&device).unwrap();
    let client = Nic::open("udp:127.0.0.1").unwrap();
    let mut a = side(&client);
    assert_eq!(ask(&mut a, &host, 531, b"bye"), b"owner:bye");
    // This process listens on two discriminators: one it is asked on
    // through the owner, one after the owner has gone.
    let mut early = side(&shared);
    let mut late = side(&shared);
    let server = std::thread::spawn({
        let shared = shared.clone();
        move || {
            expect(&early);
            let mut req = shared.connect_wait(&disc(533), Some(T)).unwrap();
            req.accept(&early.vi).unwrap();
            assert_eq!(heard(&early), b"before");
            expect(&early);
            say(&mut early, b"one");
            assert_eq!(heard(&early), b"after the owner");
            say(&mut early, b"two");
            expect(&late);
            let mut req = shared.connect_wait(&disc(532), Some(T * 2)).unwrap();
            req.accept(&late.vi).unwrap();
            assert_eq!(heard(&late), b"after");
            say(&mut late, b"still here");
            (early, late)
        }
    });
    let mut c = side(&client);
    assert_eq!(ask(&mut c, &host, 533, b"before"), b"one");
    a.vi.disconnect();
    owner.join();
    // A connection made through the owner goes on without it: its data
    // never passed through the owner.
    expect(&c);
    say(&mut c, b"after the owner");
    assert_eq!(heard(&c), b"two");
    // The owner is gone; this process holds the address now, and a
    // request to it reaches the listener here.
    let mut b = side(&client);
    assert_eq!(ask(&mut b, &host, 532, b"after"), b"still here");
    // Going acknowledges the answers, which completes the server's sends.
    b.vi.disconnect();
    c.vi.disconnect();
    let _sides = server.join().unwrap();
    assert!(held(&host));
}

#[test]
fn another_users_process_is_refused_the_device() {
    let test = "another_users_process_is_refused_the_device";
    let (device, _host) = free_device();
    if peer_arg().is_some() {
        // This process runs as another user than the device's owner.
        let err = Nic::open(&device).expect_err("another user's device is not shared");
        let text = err.to_string();
        assert!(text.contains("opened by a process of user 0"), "{text}");
        return;
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: starting a process of another user needs root");
        return;
    }
    let owner = Nic::open(&device).unwrap();
    use std::os::unix::process::CommandExt;
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("UVIA_TEST_PEER", "x")
        .env("UVIA_TEST_INSTANCE", &device)
        .gid(65534)
        .uid(65534)
        .status()
        .unwrap();
    assert!(status.success(), "the other user's process: {status}");
    drop(owner);
}
