//! Shared helpers of the multi-process tests: every test re-runs its own test
//! binary as its peer (`UVIA_TEST_PEER` carries the peer's argument), in a
//! socket directory of its own (`UVIA_SOCKET_DIR`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use uvia::*;

/// The bound of every wait.
pub const T: Duration = Duration::from_secs(10);

/// Serialises "set `UVIA_SOCKET_DIR`, open a Nic": tests of one binary run
/// side by side in threads and the variable is process-wide.
static ENV_LOCK: Mutex<()> = Mutex::new(());

/// The peer's argument when this process is the peer of a test.
pub fn peer_arg() -> Option<String> {
    std::env::var("UVIA_TEST_PEER").ok()
}

/// A test's private socket directory (mode 0700), removed on drop.
pub struct SockDir(pub PathBuf);

impl SockDir {
    pub fn new(tag: &str) -> SockDir {
        let p = std::env::temp_dir().join(format!("uvia-mp-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(&p).unwrap();
        SockDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Names of the files in the directory.
    pub fn entries(&self) -> Vec<String> {
        entries(&self.0)
    }

    pub fn assert_empty(&self, when: &str) {
        let e = self.entries();
        assert!(e.is_empty(), "socket directory not empty {when}: {e:?}");
    }
}

impl Drop for SockDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Opens `shm` with its sockets in `dir` (the parent side; a peer inherits
/// `UVIA_SOCKET_DIR` from its environment and can use [`open_peer_nic`]).
pub fn open_nic(dir: &SockDir) -> Nic {
    let _g = ENV_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("UVIA_SOCKET_DIR", dir.path());
    let nic = Nic::open("shm").unwrap();
    std::env::remove_var("UVIA_SOCKET_DIR");
    nic
}

/// The Nic of a peer process (its environment names the socket directory).
pub fn open_peer_nic() -> Nic {
    assert!(
        std::env::var_os("UVIA_SOCKET_DIR").is_some(),
        "the peer runs in the test's socket directory"
    );
    Nic::open("shm").unwrap()
}

/// A discriminator unique to this test run: parent pid and a per-test number.
pub fn disc_base(test_no: u64) -> u64 {
    ((std::process::id() as u64) << 24) | (test_no << 8)
}

pub fn disc(v: u64) -> Discriminator {
    Discriminator::from_u64(v)
}

/// The peer process; killed (and reaped) if the test ends without joining it.
pub struct Peer(pub Option<Child>);

impl Peer {
    /// Re-runs this test binary, only `test`, as the peer, in socket dir `dir`.
    pub fn spawn(test: &str, dir: &SockDir, arg: &str) -> Peer {
        let child = Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env("UVIA_TEST_PEER", arg)
            .env("UVIA_SOCKET_DIR", dir.path())
            .spawn()
            .unwrap();
        Peer(Some(child))
    }

    pub fn pid(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    /// Waits (bounded) for the peer to exit and asserts it succeeded.
    pub fn join(mut self) {
        let mut c = self.0.take().unwrap();
        let start = Instant::now();
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                assert!(st.success(), "peer failed: {st}");
                return;
            }
            if start.elapsed() > T * 2 {
                let _ = c.kill();
                let _ = c.wait();
                panic!("peer did not finish within {:?}", T * 2);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Patterned bytes: no two neighbouring size classes look alike.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 24) as u8 ^ seed ^ (i >> 8) as u8)
        .collect()
}

pub fn levels() -> [Reliability; 3] {
    [
        Reliability::Unreliable,
        Reliability::ReliableDelivery,
        Reliability::ReliableReception,
    ]
}

pub fn level_from(s: &str) -> Reliability {
    levels()[s.parse::<usize>().unwrap()]
}

pub fn level_no(r: Reliability) -> usize {
    levels().iter().position(|&l| l == r).unwrap()
}

/// Calls `f` until it returns `Some`, at most `T`.
pub fn poll_until<R>(what: &str, mut f: impl FnMut() -> Option<R>) -> R {
    let start = Instant::now();
    loop {
        if let Some(r) = f() {
            return r;
        }
        assert!(start.elapsed() < T, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// Accepts one client on `d` into `vi`.
pub fn accept(nic: &Nic, vi: &Vi, d: u64) {
    let mut req = nic.connect_wait(&disc(d), Some(T)).unwrap();
    req.accept(vi).unwrap();
}

/// Connects `vi` to the server on `d` (instance `0`).
pub fn connect(vi: &Vi, d: u64) {
    vi.connect_request(&NetAddress::new("0", disc(d)), T)
        .unwrap();
}

/// Sends `len` bytes at `off` of `r` and waits for the send's completion.
pub fn send(vi: &Vi, r: &MemoryRegion, off: usize, len: usize) -> Box<Descriptor> {
    vi.post_send(Box::new(Descriptor::send(&[r.segment(off, len)])))
        .unwrap();
    vi.send_wait(Some(T)).unwrap()
}

/// Sends `bytes` (copied into `r` at `off` first) and asserts success.
pub fn send_bytes(vi: &Vi, r: &mut MemoryRegion, off: usize, bytes: &[u8]) {
    r.as_mut_slice()[off..off + bytes.len()].copy_from_slice(bytes);
    let d = send(vi, r, off, bytes.len());
    assert_eq!(
        d.result(),
        Ok(bytes.len() as u32),
        "send of {} B",
        bytes.len()
    );
}

/// Posts a receive of `len` bytes at `off` of `r`.
pub fn post_recv(vi: &Vi, r: &MemoryRegion, off: usize, len: usize) {
    vi.post_recv(Box::new(Descriptor::recv(&[r.segment(off, len)])))
        .unwrap();
}

/// Waits for the next receive completion and asserts success; its length.
pub fn recv_ok(vi: &Vi) -> usize {
    let d = vi.recv_wait(Some(T)).unwrap();
    d.result().unwrap_or_else(|e| panic!("receive failed: {e}")) as usize
}

/// Posts one receive and waits until the peer has gone: it must come back
/// with an error and the VI must be in the Error state.
pub fn until_peer_leaves(vi: &Vi, r: &MemoryRegion) {
    post_recv(vi, r, 0, 64);
    let d = vi.recv_wait(Some(T)).unwrap();
    assert!(
        d.error().is_some(),
        "expected the peer to leave, got a message of {:?}",
        d.result()
    );
    assert_eq!(vi.state(), ViState::Error);
}

/// Encodes an (address, handle) pair of a region for the peer.
pub fn encode_remote(s: Segment) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&s.addr.to_le_bytes());
    b[8..].copy_from_slice(&s.handle.0.to_le_bytes());
    b
}

pub fn decode_remote(b: &[u8]) -> Segment {
    Segment::remote(
        u64::from_le_bytes(b[..8].try_into().unwrap()),
        MemHandle(u32::from_le_bytes(b[8..12].try_into().unwrap())),
    )
}
