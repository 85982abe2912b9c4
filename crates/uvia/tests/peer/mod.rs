//! Two-process test support: a test re-runs its own binary as the peer.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use uvia::*;

pub const T: Duration = Duration::from_secs(10);

/// The peer's argument when this process is the peer of a test.
pub fn peer_arg() -> Option<String> {
    std::env::var("UVIA_TEST_PEER").ok()
}

/// The Nic instance (`shm:<instance>`) of one test run, shared by both of
/// its processes: tests running side by side each get their own socket
/// names. The peer learns it from the environment.
pub fn instance(test: &str) -> String {
    if let Ok(i) = std::env::var("UVIA_TEST_INSTANCE") {
        return i;
    }
    format!("t{}-{test}", std::process::id())
}

/// A test run over the udp provider on loopback: `udp:127.0.0.1:<P>`,
/// where the peer process binds port P and the test process P + 1 (both
/// free when chosen).
pub fn udp_instance() -> String {
    if let Ok(i) = std::env::var("UVIA_TEST_INSTANCE") {
        return i;
    }
    loop {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let p = a.local_addr().unwrap().port();
        if p < u16::MAX && std::net::UdpSocket::bind(("127.0.0.1", p + 1)).is_ok() {
            return format!("udp:127.0.0.1:{p}");
        }
    }
}

/// A test run over the udp provider between two test hosts: the test
/// process on `a`, its peer on `b` (started there with `Peer::spawn_in`),
/// both on port `port`: `udp2:<a>|<b>|<port>`.
pub fn udp_hosts_instance(a: std::net::IpAddr, b: std::net::IpAddr, port: u16) -> String {
    format!("udp2:{a}|{b}|{port}")
}

/// A test run over the xdp provider between two test hosts: the test
/// process on the veth end `if_a` (address `a`), its peer on `if_b` (`b`);
/// a peer is named by its IPv4 address, which the Nic turns into a MAC
/// address through the neighbour table: `xdp2:<if_a>|<if_b>|<a>|<b>`.
pub fn xdp_hosts_instance(
    if_a: &str,
    if_b: &str,
    a: std::net::IpAddr,
    b: std::net::IpAddr,
) -> String {
    format!("xdp2:{if_a}|{if_b}|{a}|{b}")
}

/// The Nic name this process opens for `inst`, and the host its peer's
/// Nic answers at.
fn nic_and_peer(inst: &str) -> (String, String) {
    if let Some(rest) = inst.strip_prefix("xdp2:") {
        let f: Vec<&str> = rest.split('|').collect();
        let (mine, theirs) = if peer_arg().is_some() { (1, 0) } else { (0, 1) };
        return (format!("xdp:{}", f[mine]), f[2 + theirs].to_string());
    }
    if let Some(rest) = inst.strip_prefix("udp2:") {
        let mut it = rest.split('|');
        let (a, b, port) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        let (mine, theirs) = if peer_arg().is_some() { (b, a) } else { (a, b) };
        let fmt = |ip: &str| match ip.parse::<std::net::IpAddr>().unwrap() {
            std::net::IpAddr::V6(v6) => format!("[{v6}]:{port}"),
            v4 => format!("{v4}:{port}"),
        };
        return (format!("udp:{}", fmt(mine)), fmt(theirs));
    }
    let Some(rest) = inst.strip_prefix("udp:") else {
        return (format!("shm:{inst}"), inst.to_string());
    };
    let (ip, port) = rest.rsplit_once(':').unwrap();
    let base: u16 = port.parse().unwrap();
    let (mine, theirs) = if peer_arg().is_some() {
        (base, base + 1)
    } else {
        (base + 1, base)
    };
    (format!("udp:{ip}:{mine}"), format!("{ip}:{theirs}"))
}

/// The socket directory the library uses when nothing is configured.
fn default_socket_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("UVIA_SOCKET_DIR") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(p).join("uvia");
    }
    // SAFETY: getuid cannot fail.
    PathBuf::from(format!("/tmp/uvia-{}", unsafe { libc::getuid() }))
}

/// Socket files of `instance` left in the socket directory.
pub fn leftovers(instance: &str) -> Vec<String> {
    let prefix = format!("shm-{instance}.");
    std::fs::read_dir(default_socket_dir())
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// The peer process; killed if the test ends without waiting for it.
pub struct Peer(pub Option<Child>);

impl Peer {
    /// Starts this test binary running only `test`, as the peer of Nic
    /// instance `inst`, with `arg`.
    pub fn spawn(test: &str, inst: &str, arg: &str) -> Peer {
        let exe = std::env::current_exe().unwrap();
        let child = Command::new(exe)
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env("UVIA_TEST_PEER", arg)
            .env("UVIA_TEST_INSTANCE", inst)
            .spawn()
            .unwrap();
        Peer(Some(child))
    }

    /// Like `spawn`, with the peer's standard input a pipe from this
    /// process (a peer can sleep in a read of it until told to go on).
    pub fn spawn_piped(test: &str, inst: &str, arg: &str) -> (Peer, std::process::ChildStdin) {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new(exe)
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env("UVIA_TEST_PEER", arg)
            .env("UVIA_TEST_INSTANCE", inst)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        (Peer(Some(child)), stdin)
    }

    /// Like `spawn`, with the peer on another test host (network namespace).
    pub fn spawn_in(netns: &str, test: &str, inst: &str, arg: &str) -> Peer {
        let exe = std::env::current_exe().unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", netns])
            .arg(exe)
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env("UVIA_TEST_PEER", arg)
            .env("UVIA_TEST_INSTANCE", inst)
            .spawn()
            .unwrap();
        Peer(Some(child))
    }

    /// Waits for the peer (at most `T`) and asserts it succeeded.
    pub fn join(mut self) {
        let mut c = self.0.take().unwrap();
        let start = std::time::Instant::now();
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                assert!(st.success(), "peer failed: {st}");
                return;
            }
            if start.elapsed() > T * 3 {
                let _ = c.kill();
                panic!("peer did not finish");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn kill(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.0 = None;
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Nic, a tag, a VI and a 2 MiB buffer (RDMA enabled) on one side.
pub struct End {
    pub inst: String,
    pub nic: Nic,
    pub ptag: Ptag,
    pub vi: Vi,
    pub buf: MemoryRegion,
}

pub fn end(inst: &str, attrs: impl Fn(Ptag) -> ViAttributes) -> End {
    end_with(inst, &NicOptions::default(), attrs)
}

pub fn end_with(inst: &str, opts: &NicOptions, attrs: impl Fn(Ptag) -> ViAttributes) -> End {
    let nic = Nic::open_with(&nic_and_peer(inst).0, opts).unwrap();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(attrs(ptag), None, None).unwrap();
    let buf = nic
        .alloc_region(
            2 << 20,
            MemAttributes::new(ptag).rdma_write(true).rdma_read(true),
        )
        .unwrap();
    End {
        inst: inst.to_string(),
        nic,
        ptag,
        vi,
        buf,
    }
}

pub fn disc(n: u64) -> Discriminator {
    Discriminator::from_u64(0xD15C_0000_0000 | n)
}

/// Accepts one client on `d`.
pub fn accept(e: &End, d: u64) {
    let mut req = e.nic.connect_wait(&disc(d), Some(T)).unwrap();
    req.accept(&e.vi).unwrap();
}

pub fn connect(e: &End, d: u64) {
    e.vi.connect_request(&NetAddress::new(&peer_host(&e.inst), disc(d)), T)
        .unwrap();
}

/// The Nic name this process opens for `inst`.
pub fn my_nic(inst: &str) -> String {
    nic_and_peer(inst).0
}

/// The host address of the peer's Nic.
pub fn peer_host(inst: &str) -> String {
    nic_and_peer(inst).1
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Posts a receive of `len` bytes at `off` of the buffer and waits for it.
pub fn recv(e: &End, off: usize, len: usize) -> Box<Descriptor> {
    e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(off, len)])))
        .unwrap();
    e.vi.recv_wait(Some(T)).unwrap()
}

/// Sends `len` bytes at `off` of the buffer and waits for the send.
pub fn send(e: &End, off: usize, len: usize) -> Box<Descriptor> {
    e.vi.post_send(Box::new(Descriptor::send(&[e.buf.segment(off, len)])))
        .unwrap();
    e.vi.send_wait(Some(T)).unwrap()
}

/// Waits until the peer disconnects: a posted receive comes back flushed.
pub fn until_peer_leaves(e: &End) {
    match e
        .vi
        .post_recv(Box::new(Descriptor::recv(&[e.buf.segment(0, 64)])))
    {
        Ok(()) => {
            let d = e.vi.recv_wait(Some(T)).unwrap();
            assert!(
                d.error().is_some(),
                "expected the peer's disconnect, got a message"
            );
        }
        // The disconnect was seen already.
        Err(r) => assert!(matches!(r.error, PostError::ViError), "{:?}", r.error),
    }
    assert_eq!(e.vi.state(), ViState::Error);
}

/// Echoes every message back until a one-byte 0xff. Keeps a receive
/// posted at all times (a network VI has nowhere to hold a message that
/// finds none) and echoes from a copy, so the next message never lands in
/// bytes still being sent.
pub fn echo_server(inst: &str, opts: &NicOptions, level: Reliability, d: u64) {
    let mut e = end_with(inst, opts, |p| ViAttributes::new(p).reliability(level));
    const R: usize = 1 << 20;
    e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(R, R)])))
        .unwrap();
    accept(&e, d);
    loop {
        let r = e.vi.recv_wait(Some(T)).unwrap();
        let n = r.result().unwrap() as usize;
        if n == 1 && e.buf.as_slice()[R] == 0xff {
            break;
        }
        e.buf.as_mut_slice().copy_within(R..R + n, 0);
        let mut r = r;
        *r = Descriptor::recv(&[e.buf.segment(R, R)]);
        e.vi.post_recv(r).unwrap();
        assert_eq!(send(&e, 0, n).result(), Ok(n as u32));
    }
    until_peer_leaves(&e);
}

pub fn stop(e: &mut End) {
    e.buf.as_mut_slice()[0] = 0xff;
    send(e, 0, 1);
}

pub fn killed_peer_opts() -> NicOptions {
    NicOptions {
        idle_timeout: Some(Duration::from_millis(800)),
        ..NicOptions::default()
    }
}

pub fn killed_peer_server(inst: &str) {
    let e = end_with(inst, &killed_peer_opts(), ViAttributes::new);
    for _ in 0..4 {
        e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(0, 1 << 20)])))
            .unwrap();
    }
    accept(&e, 360);
    // Take a few messages, then wait inside the library (acknowledging
    // what arrives, as a live process does) until killed.
    for _ in 0..3 {
        e.vi.recv_wait(Some(T)).unwrap();
    }
    let _ = e.vi.recv_wait(Some(Duration::from_secs(60)));
}

pub fn killed_peer_client(inst: &str, mut peer: Peer, before_kill: impl FnOnce()) {
    let e = end_with(inst, &killed_peer_opts(), ViAttributes::new);
    connect(&e, 360);
    for _ in 0..3 {
        assert_eq!(send(&e, 0, 100_000).result(), Ok(100_000));
    }
    for _ in 0..4 {
        e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(0, 64)])))
            .unwrap();
    }
    before_kill();
    peer.kill();
    // Mid-transfer: these sends have no receive descriptor and no peer.
    for _ in 0..5 {
        e.vi.post_send(Box::new(Descriptor::send(&[e.buf.segment(0, 50_000)])))
            .unwrap();
    }
    let t0 = Instant::now();
    for _ in 0..5 {
        let d = e.vi.send_wait(Some(T)).unwrap();
        assert!(d.error().is_some(), "send to a dead peer must fail");
    }
    for _ in 0..4 {
        let d = e.vi.recv_wait(Some(T)).unwrap();
        assert!(d.error().is_some(), "receive from a dead peer must fail");
    }
    assert_eq!(e.vi.state(), ViState::Error);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "within the idle timeout"
    );
}
