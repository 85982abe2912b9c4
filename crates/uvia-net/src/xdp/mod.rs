//! Raw Ethernet through AF_XDP: uvia frames travel in Ethernet frames of a
//! local experimental EtherType, sent and received through an AF_XDP socket
//! bound to one queue of an interface. A small XDP program ([`bpf`]) steers
//! frames of that EtherType to the socket and passes everything else to the
//! kernel; it is detached when the medium is dropped or its process dies.
//!
//! Receiving reads the rx ring with no system call. Sending writes the tx
//! ring and wakes the kernel only when it asks to be woken (need_wakeup).
//! The UMEM is one anonymous mapping cut in two: frames lent to the kernel
//! for receiving (through the fill ring, handed back as soon as their bytes
//! are copied out) and frames for sending (returned by the completion ring).
//! Addresses are MAC addresses; like M-VIA, the medium reaches only its LAN.

pub mod bpf;
pub mod pingpong;
mod ring;

use crate::{Addr, Caps, MacAddr, Medium, MediumStats, OutFrame, RecvBatch};
use ring::{Consumer, Producer, RingMap};
use std::collections::VecDeque;
use std::ffi::CString;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// IEEE 802 Local Experimental EtherType 1: never assigned to a protocol,
/// so nothing else on a LAN uses it.
pub const ETHERTYPE: u16 = 0x88b5;
/// Destination MAC, source MAC, EtherType.
pub const ETH_HEADER: usize = 14;
/// One UMEM chunk: a frame of the largest standard MTU, and the headroom
/// the kernel keeps in front of received frames.
const CHUNK: u32 = 2048;
/// Chunks lent to the kernel for receiving, 2 MiB: four windows of full
/// frames. The kernel fills them in the order they were lent, so a chunk
/// comes back around after all the others: with 2,048 (4 MiB, twice a
/// core's L2 here) the lines of every arriving frame had left the cores'
/// caches, and the kernel's copy into them and the reader's loads went
/// further. Measured alternately against 2,048 (`uvia bw -p xdp --netns`,
/// 4 pairs): 64 KiB 1,406 against 1,312 MB/s, 1 KiB 899 against 851 MB/s;
/// `uvia pingpong -p xdp --netns` 8 B p50 1,525 against 1,575 ns (8 pairs).
/// 512 streamed no faster (1,400 MB/s at 64 KiB) and absorbs half the
/// bursts; 256 streamed slower (1,397 MB/s).
const RX_CHUNKS: u32 = 1024;
const TX_CHUNKS: u32 = 2048;
/// Slots of each of the four rings.
const RING_SLOTS: u32 = 2048;
/// Most frames one receive call takes.
const BATCH: usize = 64;
/// Frames whose chunks are fetched ahead of their entries' reads.
const PREFETCH: usize = 4;
/// Cache lines fetched of each: a small message's frame (the Ethernet
/// header, uvia's 64-byte data header, the payload) spans two.
const PREFETCH_LINES: usize = 2;
/// How long opening waits for a queue that a closed socket still holds:
/// the kernel lets it go from a work queue, whose worker competes with the
/// programs that poll. On a 2-vCPU host under the test suite it ran more
/// than 2 s after a killed process's exit (`uvia torture`, which opens the
/// queue again at once). A queue this process's own media serve is
/// reported busy at once ([`QueueClaim`]).
const BIND_WAIT: Duration = Duration::from_secs(10);
/// Wake-ups in a row that move no frame before a send leaves the rest in
/// the ring for the next one.
const KICKS_WITHOUT_PROGRESS: u32 = 8;
/// How long a send waits for the kernel to return sent frames when every
/// send chunk is in flight.
const TX_STALL: Duration = Duration::from_secs(1);

/// Opening an xdp medium failed.
#[derive(Debug, thiserror::Error)]
pub enum XdpError {
    /// No interface of that name in this network namespace.
    #[error("no network interface named {0:?}")]
    NoInterface(String),
    /// The process lacks the privileges AF_XDP and XDP programs need.
    #[error("AF_XDP needs root (CAP_NET_RAW, CAP_NET_ADMIN and CAP_BPF): {0}")]
    Permission(io::Error),
    /// The kernel was built without AF_XDP sockets or BPF.
    #[error("the kernel has no {what}: {err}")]
    Unsupported { what: &'static str, err: io::Error },
    /// Another XDP program is attached to the interface already.
    #[error("an XDP program is already attached to {0} (another uvia Nic on it?)")]
    Busy(String),
    /// Another AF_XDP socket serves that queue.
    #[error("queue {queue} of {iface} is served by another AF_XDP socket")]
    QueueBusy { iface: String, queue: u32 },
    /// A step of the set-up failed.
    #[error("{what}: {err}")]
    Io { what: &'static str, err: io::Error },
}

impl XdpError {
    fn io(what: &'static str, err: io::Error) -> XdpError {
        match err.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => XdpError::Permission(err),
            _ => XdpError::Io { what, err },
        }
    }
}

/// Where the XDP program runs and which queue the socket serves.
#[derive(Clone, Debug, Default)]
pub struct XdpOptions {
    /// The interface's receive queue (0 unless the interface has several).
    pub queue: u32,
    /// `None`: [`Interface::preferred_mode`], falling back to generic.
    pub mode: Option<bpf::Mode>,
    /// Busy polling: the socket prefers to have the queue's NAPI context
    /// run by this process's own calls (`SO_PREFER_BUSY_POLL`,
    /// `SO_BUSY_POLL`, `SO_BUSY_POLL_BUDGET`, Linux 5.11), and a poll that
    /// finds the ring empty makes one such call (a non-blocking receive)
    /// before it looks again. Off by default: on the veth pairs of this
    /// project's test hosts it moved neither latency nor bandwidth beyond
    /// the run-to-run spread, in either mode (docs/BENCHMARKS.md); it is
    /// for drivers whose queues the kernel polls in interrupts otherwise.
    pub busy_poll: bool,
}

/// How long a receive call busy-polls the queue (`SO_BUSY_POLL`, in
/// microseconds): a non-blocking one runs the NAPI context once whatever
/// the value; a blocking wait spins this long before it sleeps.
const BUSY_POLL_US: libc::c_int = 20;

/// Frames one busy poll may take from the driver (`SO_BUSY_POLL_BUDGET`;
/// the kernel's own is 8, less than a burst of a stream).
const BUSY_POLL_BUDGET: libc::c_int = 64;

/// The UMEM: one anonymous mapping the kernel pins while the socket lives.
struct Umem {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory; which chunk belongs to whom is kept by the rings
// and the free list under the medium's locks.
unsafe impl Send for Umem {}
// SAFETY: as above.
unsafe impl Sync for Umem {}

impl Umem {
    fn new(len: usize) -> io::Result<Umem> {
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Umem {
            base: NonNull::new(p as *mut u8).ok_or_else(io::Error::last_os_error)?,
            len,
        })
    }

    /// Asks for the `lines` cache lines from `addr` ahead of their reads,
    /// if inside the UMEM. A hint: it changes no memory.
    fn prefetch(&self, addr: u64, lines: usize) {
        if addr as usize + lines * 64 > self.len {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        for k in 0..lines {
            // SAFETY: inside the mapping (checked above); a prefetch reads
            // nothing the program sees.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(
                    self.base.as_ptr().add(addr as usize + k * 64) as *const i8
                );
            }
        }
    }

    /// The bytes at `addr..addr + len`, if inside the UMEM.
    fn slice(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let end = (addr as usize).checked_add(len)?;
        (end <= self.len).then(|| {
            // SAFETY: in bounds; the chunk is ours (received, not yet
            // handed back to the fill ring).
            unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(addr as usize), len) }
        })
    }

    /// The chunk at `addr`, to fill before sending.
    #[allow(clippy::mut_from_ref)]
    fn chunk_mut(&self, addr: u64) -> &mut [u8] {
        debug_assert!(addr as usize + CHUNK as usize <= self.len);
        // SAFETY: `addr` is a send chunk from the free list, so neither the
        // kernel nor another caller (the tx lock is held) touches it.
        unsafe {
            std::slice::from_raw_parts_mut(self.base.as_ptr().add(addr as usize), CHUNK as usize)
        }
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped, once.
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len) };
    }
}

struct Tx {
    ring: Producer<libc::xdp_desc>,
    done: Consumer<u64>,
    /// Send chunks not in the kernel's hands.
    free: Vec<u64>,
}

struct Rx {
    ring: Consumer<libc::xdp_desc>,
    fill: Producer<u64>,
    /// The chunks of the entries the last receive read (empty once given
    /// back); those entries are released with them. Both are
    /// given back by a later receive (or before a sleep, [`settle`]), not
    /// at the end of the receive that read them. The kernel's core reads
    /// the rx ring's consumer index and the fill ring, so a store there
    /// leaves this core's store buffer only once that core has given the
    /// line up, and the next locked instruction (the release of this lock,
    /// then the Nic's) waits for it: some 125 ns of every message's way
    /// to the application (docs/BENCHMARKS.md). They go with the next
    /// frames, or in the second empty poll after them: a caller that
    /// reads again at once (libfabric's rxm reads its CQ until it finds
    /// nothing) is on the message's way still. At most a batch of the
    /// receive chunks is held back, and the ring has room for them.
    ///
    /// [`settle`]: Medium::settle
    held: Vec<u64>,
    /// The last receive found nothing.
    quiet: bool,
    /// Where the next frames will lie.
    lent: Lent,
}

/// The receive chunks lent to the fill ring, oldest first. The kernel
/// fills them in that order, so where the frames it just announced lie is
/// known before their entries are read, and they are fetched meanwhile
/// ([`XdpMedium::take_frames`]). Only guesses depend on it.
#[derive(Default)]
struct Lent {
    chunks: VecDeque<u64>,
    /// Where in its chunk the kernel put the last frame: its headroom.
    headroom: u64,
}

impl Lent {
    fn lend(&mut self, chunk: u64) {
        self.chunks.push_back(chunk);
    }

    /// Notes that the kernel put a frame at `addr`; returns its chunk. The
    /// chunk is the oldest lent unless the kernel dropped frames or fills
    /// out of order: then the lent ones before it are forgotten too (as
    /// far as a batch's looks find it), so that the next guesses follow
    /// the kernel again.
    fn took(&mut self, addr: u64) -> u64 {
        let chunk = addr - addr % u64::from(CHUNK);
        self.headroom = addr - chunk;
        if self.chunks.front() == Some(&chunk) {
            self.chunks.pop_front();
        } else if let Some(i) = self.chunks.iter().take(BATCH).position(|&c| c == chunk) {
            self.chunks.drain(..=i);
        }
        // Never more than the ring holds, whatever the kernel did.
        while self.chunks.len() > RX_CHUNKS as usize {
            self.chunks.pop_front();
        }
        chunk
    }

    /// Where the next `n` frames will lie, as far as known.
    fn next(&self, n: usize) -> impl Iterator<Item = u64> + '_ {
        self.chunks.iter().take(n).map(|c| c + self.headroom)
    }
}

impl Rx {
    /// Gives back what the last receive held back (see [`Rx::held`]).
    fn publish(&mut self) {
        // Every entry read left its chunk here.
        if self.held.is_empty() {
            return;
        }
        self.ring.release();
        for &chunk in &self.held {
            // The fill ring has room for every chunk it lent out.
            if self.fill.free(1) > 0 {
                self.fill.push(chunk);
                self.lent.lend(chunk);
            }
        }
        self.held.clear();
        self.fill.submit();
    }
}

/// A queue of an interface in a network namespace (the inode of the
/// thread's `/proc/thread-self/ns/net`: interface indices repeat between
/// namespaces).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct QueueKey {
    netns: u64,
    ifindex: u32,
    queue: u32,
}

impl QueueKey {
    fn here(ifindex: u32, queue: u32) -> QueueKey {
        use std::os::unix::fs::MetadataExt;
        let netns = std::fs::metadata("/proc/thread-self/ns/net").map_or(0, |m| m.ino());
        QueueKey {
            netns,
            ifindex,
            queue,
        }
    }
}

/// The queues this process's open media serve.
static HELD: Mutex<Vec<QueueKey>> = Mutex::new(Vec::new());

/// A medium's claim on its queue, so that another open of it in this
/// process fails at once: the socket that holds it will not close while
/// the open waits, as a socket of a process that exited does.
struct QueueClaim(QueueKey);

impl QueueClaim {
    fn new(key: QueueKey) -> QueueClaim {
        HELD.lock().unwrap_or_else(|p| p.into_inner()).push(key);
        QueueClaim(key)
    }

    fn held(key: QueueKey) -> bool {
        HELD.lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&key)
    }
}

impl Drop for QueueClaim {
    fn drop(&mut self) {
        let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = held.iter().position(|k| *k == self.0) {
            held.swap_remove(i);
        }
    }
}

/// An AF_XDP socket on one queue of an interface, with its XDP program.
pub struct XdpMedium {
    // Field order is drop order: the program goes first, so no frame is
    // steered to a socket that is closing.
    _link: OwnedFd,
    _prog: OwnedFd,
    _map: OwnedFd,
    tx: Mutex<Tx>,
    rx: Mutex<Rx>,
    fd: OwnedFd,
    umem: Umem,
    mac: MacAddr,
    iface: String,
    mode: bpf::Mode,
    caps: Caps,
    frames_sent: AtomicU64,
    frames_received: AtomicU64,
    wakeups: AtomicU64,
    /// [`XdpOptions::busy_poll`].
    busy_poll: bool,
    /// Taken first when the medium drops ([`Drop`]): from then on another
    /// open in this process waits for the queue as for any closed socket's.
    claim: Option<QueueClaim>,
}

impl Drop for XdpMedium {
    fn drop(&mut self) {
        self.claim.take();
    }
}

/// Has the queue's NAPI context run by the socket's own calls (see
/// [`XdpOptions::busy_poll`]). Root may set a busy-poll time above the
/// system's `net.core.busy_poll`; the kernel checks that.
fn busy_poll(fd: RawFd) -> Result<(), XdpError> {
    let opts = [
        (libc::SO_PREFER_BUSY_POLL, 1, "SO_PREFER_BUSY_POLL"),
        (libc::SO_BUSY_POLL, BUSY_POLL_US, "SO_BUSY_POLL"),
        (
            libc::SO_BUSY_POLL_BUDGET,
            BUSY_POLL_BUDGET,
            "SO_BUSY_POLL_BUDGET",
        ),
    ];
    for (name, v, what) in opts {
        // SAFETY: an int of the size passed.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                &v as *const libc::c_int as *const libc::c_void,
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r < 0 {
            let err = io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                Some(libc::ENOPROTOOPT) => XdpError::Unsupported {
                    what: "busy polling of sockets (SO_PREFER_BUSY_POLL, Linux 5.11)",
                    err,
                },
                _ => XdpError::io(what, err),
            });
        }
    }
    Ok(())
}

fn setsockopt<T>(fd: RawFd, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` is a live value of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            name,
            v as *const T as *const libc::c_void,
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// What opening needs to know of an interface.
#[derive(Clone, Debug)]
pub struct Interface {
    pub index: u32,
    pub mac: MacAddr,
    pub mtu: u32,
    /// The driver's name (`veth`, `mlx5_core`, ...), if it tells.
    pub driver: Option<String>,
}

impl Interface {
    /// The mode the XDP program runs in when none is asked for: generic on
    /// veth, native elsewhere (falling back to generic where the driver has
    /// no native XDP). A veth's native XDP turns every frame sent through
    /// it into an XDP frame and back, which costs more than running the
    /// program on the frame as it is: a ping-pong between two test hosts
    /// measures about 1.45 us one way in generic mode and 1.8 us in native
    /// (`cargo run --release -p uvia-net --example xdp_pingpong`).
    pub fn preferred_mode(&self) -> bpf::Mode {
        match self.driver.as_deref() {
            Some("veth") => bpf::Mode::Generic,
            _ => bpf::Mode::Native,
        }
    }
}

/// The driver's name through the ethtool ioctl, if the driver answers it.
fn driver(s: RawFd, name: &str) -> Option<String> {
    // struct ethtool_drvinfo: the command, then the driver's name in 32
    // bytes, then fields not needed here (196 bytes in all).
    #[repr(C)]
    struct DrvInfo {
        cmd: u32,
        driver: [u8; 32],
        rest: [u8; 160],
    }
    const ETHTOOL_GDRVINFO: u32 = 0x3;
    let mut info = DrvInfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        rest: [0; 160],
    };
    // SAFETY: ifreq is plain data.
    let mut r: libc::ifreq = unsafe { zeroed() };
    for (d, b) in r.ifr_name.iter_mut().zip(name.bytes()) {
        *d = b as libc::c_char;
    }
    r.ifr_ifru.ifru_data = (&mut info as *mut DrvInfo).cast();
    // SAFETY: SIOCETHTOOL with GDRVINFO writes into the DrvInfo the ifreq
    // points at, which is live and large enough.
    if unsafe { libc::ioctl(s, libc::SIOCETHTOOL, &mut r) } < 0 {
        return None;
    }
    let n = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    Some(String::from_utf8_lossy(&info.driver[..n]).into_owned()).filter(|d| !d.is_empty())
}

/// An interface's index, MAC address, MTU and driver, in this thread's
/// namespace.
pub fn interface(name: &str) -> Result<Interface, XdpError> {
    let c = CString::new(name).map_err(|_| XdpError::NoInterface(name.into()))?;
    // SAFETY: a valid C string.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 || name.len() >= libc::IFNAMSIZ {
        return Err(XdpError::NoInterface(name.into()));
    }
    // SAFETY: a plain datagram socket for two ioctls.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(XdpError::io(
            "a socket for interface ioctls",
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: the descriptor was just returned to us.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    let req = || {
        // SAFETY: ifreq is plain data.
        let mut r: libc::ifreq = unsafe { zeroed() };
        for (d, b) in r.ifr_name.iter_mut().zip(name.bytes()) {
            *d = b as libc::c_char;
        }
        r
    };
    let mut r = req();
    // SAFETY: SIOCGIFHWADDR fills the ifreq it is given.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFHWADDR, &mut r) } < 0 {
        return Err(XdpError::io(
            "reading the interface's MAC address",
            io::Error::last_os_error(),
        ));
    }
    let mut mac = [0u8; 6];
    // SAFETY: the ioctl wrote the hardware address into this union member.
    let data = unsafe { r.ifr_ifru.ifru_hwaddr.sa_data };
    for (m, d) in mac.iter_mut().zip(data) {
        *m = d as u8;
    }
    let mut r = req();
    // SAFETY: SIOCGIFMTU fills the ifreq it is given.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFMTU, &mut r) } < 0 {
        return Err(XdpError::io(
            "reading the interface's MTU",
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: the ioctl wrote the MTU into this union member.
    let mtu = unsafe { r.ifr_ifru.ifru_mtu }.max(0) as u32;
    Ok(Interface {
        index,
        mac: MacAddr(mac),
        mtu,
        driver: driver(s.as_raw_fd(), name),
    })
}

impl XdpMedium {
    /// Opens queue `opts.queue` of interface `iface`: the socket, its UMEM
    /// and rings, and the XDP program. Nothing stays attached on failure.
    pub fn open(iface: &str, opts: &XdpOptions) -> Result<XdpMedium, XdpError> {
        let info = interface(iface)?;
        let (ifindex, mac, mtu) = (info.index, info.mac, info.mtu);
        // SAFETY: creating a socket has no preconditions.
        let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            let err = io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                Some(libc::EAFNOSUPPORT) => XdpError::Unsupported {
                    what: "AF_XDP sockets (CONFIG_XDP_SOCKETS)",
                    err,
                },
                _ => XdpError::io("creating the AF_XDP socket", err),
            });
        }
        // SAFETY: the descriptor was just returned to us.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        let umem = Umem::new(((RX_CHUNKS + TX_CHUNKS) * CHUNK) as usize)
            .map_err(|e| XdpError::io("mapping the UMEM", e))?;
        let reg = libc::xdp_umem_reg {
            addr: umem.base.as_ptr() as u64,
            len: umem.len as u64,
            chunk_size: CHUNK,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(raw, libc::XDP_UMEM_REG, &reg)
            .map_err(|e| XdpError::io("registering the UMEM", e))?;
        for ring in [
            libc::XDP_UMEM_FILL_RING,
            libc::XDP_UMEM_COMPLETION_RING,
            libc::XDP_RX_RING,
            libc::XDP_TX_RING,
        ] {
            setsockopt(raw, ring, &RING_SLOTS).map_err(|e| XdpError::io("sizing the rings", e))?;
        }
        // SAFETY: plain data, filled by the kernel.
        let mut off: libc::xdp_mmap_offsets = unsafe { zeroed() };
        let mut len = size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: `off` has room for the offsets.
        let r = unsafe {
            libc::getsockopt(
                raw,
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                &mut off as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        if r < 0 {
            return Err(XdpError::io(
                "reading the ring offsets",
                io::Error::last_os_error(),
            ));
        }
        let desc = size_of::<libc::xdp_desc>();
        let map = |pgoff: u64, o: &libc::xdp_ring_offset, elem: usize| {
            RingMap::map(raw, pgoff as libc::off_t, o, RING_SLOTS, elem)
                .map_err(|e| XdpError::io("mapping a ring", e))
        };
        let mut fill = Producer::new(
            map(libc::XDP_UMEM_PGOFF_FILL_RING, &off.fr, 8)?,
            &off.fr,
            RING_SLOTS,
        );
        let done = Consumer::new(
            map(libc::XDP_UMEM_PGOFF_COMPLETION_RING, &off.cr, 8)?,
            &off.cr,
            RING_SLOTS,
        );
        let rx_ring = Consumer::new(
            map(libc::XDP_PGOFF_RX_RING as u64, &off.rx, desc)?,
            &off.rx,
            RING_SLOTS,
        );
        let tx_ring = Producer::new(
            map(libc::XDP_PGOFF_TX_RING as u64, &off.tx, desc)?,
            &off.tx,
            RING_SLOTS,
        );
        // Lend the kernel every receive chunk.
        let n = fill.free(RX_CHUNKS);
        let mut lent = Lent::default();
        for i in 0..n.min(RX_CHUNKS) {
            fill.push(u64::from(i * CHUNK));
            lent.lend(u64::from(i * CHUNK));
        }
        fill.submit();
        let free = (0..TX_CHUNKS)
            .map(|i| u64::from((RX_CHUNKS + i) * CHUNK))
            .collect();

        let bind = |flags: u16| {
            let sa = libc::sockaddr_xdp {
                sxdp_family: libc::AF_XDP as u16,
                sxdp_flags: flags,
                sxdp_ifindex: ifindex,
                sxdp_queue_id: opts.queue,
                sxdp_shared_umem_fd: 0,
            };
            // SAFETY: a valid sockaddr_xdp of the size passed.
            let r = unsafe {
                libc::bind(
                    raw,
                    &sa as *const _ as *const libc::sockaddr,
                    size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            };
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        // Zero-copy where the driver offers it, else copy mode. A socket
        // closed a moment ago may still hold the queue: the kernel releases
        // it from a work queue, so a busy queue is asked again for a while,
        // unless a medium of this process serves it.
        let key = QueueKey::here(ifindex, opts.queue);
        let ours = QueueClaim::held(key);
        let start = Instant::now();
        loop {
            let r = bind(libc::XDP_USE_NEED_WAKEUP)
                .or_else(|_| bind(libc::XDP_USE_NEED_WAKEUP | libc::XDP_COPY));
            match r {
                Ok(()) => break,
                Err(e)
                    if e.raw_os_error() == Some(libc::EBUSY)
                        && !ours
                        && start.elapsed() < BIND_WAIT =>
                {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    return Err(XdpError::QueueBusy {
                        iface: iface.into(),
                        queue: opts.queue,
                    })
                }
                Err(e) => return Err(XdpError::io("binding the AF_XDP socket to the queue", e)),
            }
        }
        // Bound: this process's other opens of the queue fail at once from
        // here (dropped with the socket if what follows fails).
        let claim = QueueClaim::new(key);
        if opts.busy_poll {
            busy_poll(raw)?;
        }

        let bpf_err = |what: &'static str, e: io::Error| match e.raw_os_error() {
            Some(libc::ENOSYS) => XdpError::Unsupported {
                what: "bpf system call",
                err: e,
            },
            _ => XdpError::io(what, e),
        };
        let sockets =
            bpf::socket_map(opts.queue + 1).map_err(|e| bpf_err("creating the socket map", e))?;
        bpf::set_socket(&sockets, opts.queue, raw)
            .map_err(|e| bpf_err("adding the socket to the map", e))?;
        let prog =
            bpf::load(&sockets, ETHERTYPE).map_err(|e| bpf_err("loading the XDP program", e))?;
        let attach = |mode| {
            bpf::attach(&prog, ifindex, mode).map_err(|err| match err.raw_os_error() {
                Some(libc::EBUSY | libc::EEXIST) => XdpError::Busy(iface.into()),
                _ => XdpError::io("attaching the XDP program", err),
            })
        };
        let (link, mode) = match opts.mode {
            Some(m) => (attach(m)?, m),
            None => match info.preferred_mode() {
                bpf::Mode::Generic => (attach(bpf::Mode::Generic)?, bpf::Mode::Generic),
                bpf::Mode::Native => match attach(bpf::Mode::Native) {
                    Ok(l) => (l, bpf::Mode::Native),
                    Err(XdpError::Busy(i)) => return Err(XdpError::Busy(i)),
                    Err(_) => (attach(bpf::Mode::Generic)?, bpf::Mode::Generic),
                },
            },
        };
        // The chunk holds the kernel's headroom, the Ethernet header and the
        // frame; the MTU counts neither header.
        let max_frame = (mtu as usize).min(CHUNK as usize - 256 - ETH_HEADER);
        Ok(XdpMedium {
            _link: link,
            _prog: prog,
            _map: sockets,
            tx: Mutex::new(Tx {
                ring: tx_ring,
                done,
                free,
            }),
            rx: Mutex::new(Rx {
                ring: rx_ring,
                fill,
                held: Vec::with_capacity(BATCH),
                quiet: false,
                lent,
            }),
            fd,
            umem,
            mac,
            iface: iface.into(),
            mode,
            caps: Caps {
                name: "xdp",
                max_frame,
                max_batch: BATCH,
                gso: false,
                gro: false,
                // Ethernet's frame check sequence (on a wire; a veth pair
                // never corrupts).
                intact: true,
                lends: true,
                gathers: false,
            },
            frames_sent: AtomicU64::new(0),
            frames_received: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            busy_poll: opts.busy_poll,
            claim: Some(claim),
        })
    }

    /// Where the program runs: in the driver or generic.
    pub fn mode(&self) -> bpf::Mode {
        self.mode
    }

    pub fn interface(&self) -> &str {
        &self.iface
    }

    /// [`XdpOptions::busy_poll`], as opened.
    pub fn is_busy_polled(&self) -> bool {
        self.busy_poll
    }

    /// System calls made to wake the kernel (tx kicks, fill wake-ups and
    /// busy polls).
    pub fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    /// Tells the kernel to look at the rings.
    fn kick(&self) {
        self.wakeups.fetch_add(1, Ordering::Relaxed);
        uvia_trace::mark!(SyscallEnter);
        // SAFETY: a zero-length send on our socket: the kernel's signal to
        // process the tx ring.
        unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        uvia_trace::mark!(SyscallExit);
    }

    /// The MAC address a frame of `len` bytes goes to, if it can go.
    fn check_frame(&self, to: Addr, len: usize) -> io::Result<MacAddr> {
        let Addr::Mac(mac) = to else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the xdp medium sends to MAC addresses, not {to}"),
            ));
        };
        if len > self.caps.max_frame {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "frame of {len} bytes over the MTU ({})",
                    self.caps.max_frame
                ),
            ));
        }
        Ok(mac)
    }

    /// A send chunk with a tx ring slot for it, if one is free or one
    /// wake-up of the kernel (which sends what is queued and returns its
    /// chunks, in copy mode) frees one.
    fn try_chunk(&self, tx: &mut Tx) -> Option<u64> {
        for attempt in 0..2 {
            if tx.free.is_empty() {
                Self::reap(tx);
            }
            if tx.ring.free(1) > 0 {
                if let Some(addr) = tx.free.pop() {
                    return Some(addr);
                }
            }
            if attempt == 0 {
                tx.ring.submit();
                self.kick();
            }
        }
        None
    }

    /// A send chunk with a tx ring slot for it, waiting for the kernel to
    /// send what is queued for a second at most.
    fn take_chunk(&self, tx: &mut Tx) -> io::Result<u64> {
        let mut stalled: Option<Instant> = None;
        loop {
            if let Some(addr) = self.try_chunk(tx) {
                return Ok(addr);
            }
            if stalled.get_or_insert_with(Instant::now).elapsed() > TX_STALL {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the kernel sent nothing for a second (interface down?)",
                ));
            }
            std::thread::yield_now();
        }
    }

    /// Writes the Ethernet header into send chunk `addr`; returns the rest
    /// of the chunk, where the frame goes.
    #[allow(clippy::mut_from_ref)]
    fn framed(&self, addr: u64, to: MacAddr) -> &mut [u8] {
        let chunk = self.umem.chunk_mut(addr);
        chunk[..6].copy_from_slice(&to.0);
        chunk[6..12].copy_from_slice(&self.mac.0);
        chunk[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        &mut chunk[ETH_HEADER..]
    }

    /// Publishes the frames pushed to the tx ring and has the kernel send
    /// them.
    fn transmit(&self, tx: &mut Tx, frames: usize) {
        tx.ring.submit();
        uvia_trace::mark!(MediumQueued);
        // In copy mode the kernel always asks to be woken: the send system
        // call is where it moves frames, a few dozen per call. Wake it
        // until the ring is empty or it stops taking frames (a full
        // device queue: what is left goes with the next send).
        let mut left = tx.ring.pending();
        let mut idle = 0;
        while left > 0 && tx.ring.needs_wakeup() && idle < KICKS_WITHOUT_PROGRESS {
            self.kick();
            let now_left = tx.ring.pending();
            idle = if now_left < left { 0 } else { idle + 1 };
            left = now_left;
        }
        // Only this thread writes the counter (under the tx lock): a load
        // and a store, not a locked add.
        let sent = self.frames_sent.load(Ordering::Relaxed);
        self.frames_sent
            .store(sent + frames as u64, Ordering::Relaxed);
    }

    /// Hands up to `max` (at most [`BATCH`]) arrived frames of uvia's
    /// EtherType to `f`, where they lie in the UMEM; their chunks go back to
    /// the kernel in a later call ([`Rx::held`]). `arrived` is called once
    /// before them if any came ([`Medium::recv_lent`]).
    fn take_frames(
        &self,
        max: usize,
        arrived: &mut dyn FnMut(),
        f: &mut dyn FnMut(Addr, &[u8]),
    ) -> io::Result<usize> {
        let mut rx = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        let mut n = rx.ring.ready().min(max as u32);
        if n == 0 {
            // A zero-copy driver that ran out of fill chunks waits for us;
            // a busy-polled queue is run by this very call.
            let wake = rx.fill.needs_wakeup();
            if !wake && !self.busy_poll {
                if std::mem::replace(&mut rx.quiet, true) {
                    rx.publish();
                }
                return Ok(0);
            }
            // The driver is to have every chunk it may fill.
            rx.publish();
            self.wakeups.fetch_add(1, Ordering::Relaxed);
            // SAFETY: a zero-length, non-blocking receive on our socket.
            unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            n = rx.ring.ready().min(max as u32);
            if n == 0 {
                rx.quiet = true;
                return Ok(0);
            }
        }
        // The kernel's core wrote the entries and the frames: read one
        // after the other, each would wait for its transfer. The first
        // entry and the frames' chunks (guessed, see [`Lent`]) are fetched
        // at once instead.
        for at in rx.lent.next((n as usize).min(PREFETCH)) {
            self.umem.prefetch(at, PREFETCH_LINES);
        }
        rx.ring.prefetch();
        // The caller's work before the frames goes while they come.
        arrived();
        // Frames to take: the ones before them go back first.
        rx.publish();
        rx.quiet = false;
        uvia_trace::mark!(RxFound);
        let mut got = 0;
        for _ in 0..n {
            let d = rx.ring.pop();
            // The kernel wrote the frame after its headroom; the chunk goes
            // back to the fill ring by its base, once `f` is done with it.
            if let Some(b) = self.umem.slice(d.addr, d.len as usize) {
                if b.len() > ETH_HEADER && b[12..14] == ETHERTYPE.to_be_bytes() {
                    let mut src = [0u8; 6];
                    src.copy_from_slice(&b[6..12]);
                    f(Addr::Mac(MacAddr(src)), &b[ETH_HEADER..]);
                    got += 1;
                }
            }
            let chunk = rx.lent.took(d.addr);
            rx.held.push(chunk);
        }
        // Only this thread writes the counter (under the rx lock).
        let r = self.frames_received.load(Ordering::Relaxed);
        self.frames_received
            .store(r + got as u64, Ordering::Relaxed);
        Ok(got)
    }

    /// Takes back the send chunks the kernel is done with.
    fn reap(tx: &mut Tx) {
        let n = tx.done.ready();
        for _ in 0..n {
            tx.free.push(tx.done.pop());
        }
        if n > 0 {
            tx.done.release();
        }
    }
}

impl Medium for XdpMedium {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn local_addr(&self) -> Addr {
        Addr::Mac(self.mac)
    }

    fn send(&self, frames: &[OutFrame<'_>]) -> io::Result<()> {
        let mut tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        Self::reap(&mut tx);
        for (i, f) in frames.iter().enumerate() {
            let taken = self
                .check_frame(f.to, f.bytes.len())
                .and_then(|to| Ok((to, self.take_chunk(&mut tx)?)));
            let (to, addr) = match taken {
                Ok(t) => t,
                Err(e) => {
                    // The frames before this one go.
                    self.transmit(&mut tx, i);
                    return Err(e);
                }
            };
            let chunk = self.framed(addr, to);
            chunk[..f.bytes.len()].copy_from_slice(f.bytes);
            tx.ring.push(libc::xdp_desc {
                addr,
                len: (ETH_HEADER + f.bytes.len()) as u32,
                options: 0,
            });
        }
        self.transmit(&mut tx, frames.len());
        Ok(())
    }

    fn send_built(
        &self,
        to: Addr,
        max: usize,
        build: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize> {
        let mut tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        Self::reap(&mut tx);
        let to = self.check_frame(to, 0)?;
        let mut built = 0;
        while built < max {
            // No waiting here: the caller may have nothing to send, and
            // what it has stays with it (unbuilt) for its next call.
            let Some(addr) = self.try_chunk(&mut tx) else {
                break;
            };
            let room = &mut self.umem.chunk_mut(addr)[ETH_HEADER..ETH_HEADER + self.caps.max_frame];
            // A length over the room given is a builder's bug: that frame
            // is not sent.
            match build(room) {
                Some(n) if n <= self.caps.max_frame => {
                    self.framed(addr, to);
                    tx.ring.push(libc::xdp_desc {
                        addr,
                        len: (ETH_HEADER + n) as u32,
                        options: 0,
                    });
                    built += 1;
                }
                _ => {
                    tx.free.push(addr);
                    break;
                }
            }
        }
        // Most calls after an arrival find nothing to send: they leave the
        // rings alone.
        if built > 0 {
            self.transmit(&mut tx, built);
        }
        Ok(built)
    }

    fn recv(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        batch.clear();
        let max = batch.slots.min(BATCH);
        // A frame that does not fit the batch is lost, as on a full socket.
        self.take_frames(max, &mut || {}, &mut |from, bytes| {
            batch.push(from, bytes);
        })?;
        Ok(batch.len())
    }

    fn recv_lent(
        &self,
        arrived: &mut dyn FnMut(),
        f: &mut dyn FnMut(Addr, &[u8]),
    ) -> io::Result<usize> {
        self.take_frames(BATCH, arrived, f)
    }

    fn settle(&self) {
        self.rx.lock().unwrap_or_else(|p| p.into_inner()).publish();
    }

    fn wait(&self, timeout: Option<Duration>) -> io::Result<()> {
        // Entries read but not released would keep the socket readable.
        self.settle();
        crate::wait_readable(self.fd.as_raw_fd(), timeout)
    }

    fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn stats(&self) -> MediumStats {
        let sent = self.frames_sent.load(Ordering::Relaxed);
        let got = self.frames_received.load(Ordering::Relaxed);
        MediumStats {
            frames_sent: sent,
            frames_received: got,
            datagrams_sent: sent,
            datagrams_received: got,
            send_errors: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns::{Side, TestHosts};
    use std::process::Command;

    /// The guesses of where frames lie follow the kernel: in the order the
    /// chunks were lent, after a frame the kernel dropped (its chunk taken
    /// and never announced), and never past the ring's size.
    #[test]
    fn where_frames_lie_is_guessed_in_the_order_chunks_were_lent() {
        let c = u64::from(CHUNK);
        let mut lent = Lent::default();
        for i in 0..8 {
            lent.lend(i * c);
        }
        assert_eq!(lent.took(256), 0);
        assert_eq!(lent.next(2).collect::<Vec<_>>(), [c + 256, 2 * c + 256]);
        // The frame in chunk 1 was dropped: chunk 2 comes next.
        assert_eq!(lent.took(2 * c + 256), 2 * c);
        assert_eq!(lent.next(1).collect::<Vec<_>>(), [3 * c + 256]);
        // Given back, a chunk is guessed again after the others.
        lent.lend(0);
        assert_eq!(lent.next(9).last(), Some(256));
        // A chunk not lent leaves the order alone (the headroom follows
        // the last frame).
        lent.took(100 * c);
        assert_eq!(lent.next(1).collect::<Vec<_>>(), [3 * c]);
        for _ in 0..2 * RX_CHUNKS {
            lent.lend(5 * c);
        }
        lent.took(3 * c);
        assert!(lent.chunks.len() <= RX_CHUNKS as usize);
    }

    /// Whether an XDP program is attached to the host's end of the pair.
    fn attached(hosts: &TestHosts, side: Side) -> bool {
        let out = Command::new("ip")
            .args(["-n", hosts.name(side), "-d", "link", "show", "dev"])
            .arg(hosts.iface(side))
            .output()
            .expect("ip link show");
        let text = String::from_utf8_lossy(&out.stdout);
        text.contains("prog/xdp") || text.contains(" xdp")
    }

    fn open(hosts: &TestHosts, side: Side, mode: Option<bpf::Mode>) -> Result<XdpMedium, XdpError> {
        open_with(hosts, side, mode, false)
    }

    fn open_with(
        hosts: &TestHosts,
        side: Side,
        mode: Option<bpf::Mode>,
        busy_poll: bool,
    ) -> Result<XdpMedium, XdpError> {
        let _in = hosts.enter(side).expect("entering the test host");
        XdpMedium::open(
            &hosts.iface(side),
            &XdpOptions {
                queue: 0,
                mode,
                busy_poll,
            },
        )
    }

    /// Test hosts and side A's medium, or `None` (said why) where the
    /// host or the kernel cannot have them.
    fn hosts_and_a(name: &str, mode: bpf::Mode, busy_poll: bool) -> Option<(TestHosts, XdpMedium)> {
        if let Err(why) = TestHosts::available() {
            println!("skipped: {why}");
            return None;
        }
        let hosts = TestHosts::create(name).expect("test hosts");
        match open_with(&hosts, Side::A, Some(mode), busy_poll) {
            Ok(a) => Some((hosts, a)),
            Err(e @ XdpError::Unsupported { .. }) => {
                println!("skipped: {e}");
                None
            }
            Err(e) => panic!("opening xdp on A ({mode:?}): {e}"),
        }
    }

    /// The socket option `name` of `m` (level SOL_SOCKET).
    fn sockopt(m: &XdpMedium, name: libc::c_int) -> libc::c_int {
        let mut v: libc::c_int = -1;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: an int and its length to write into.
        let r = unsafe {
            libc::getsockopt(
                m.fd(),
                libc::SOL_SOCKET,
                name,
                &mut v as *mut libc::c_int as *mut libc::c_void,
                &mut len,
            )
        };
        assert_eq!(r, 0, "getsockopt {name}: {}", io::Error::last_os_error());
        v
    }

    /// Whether `m`'s socket polls readable now.
    fn readable(m: &XdpMedium) -> bool {
        let mut p = libc::pollfd {
            fd: m.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    /// A receive gives its ring entries and chunks back later, off the
    /// message's path; a sleeper's `settle` (which `wait` makes) gives them
    /// back first, so that the socket sleeps; and no chunk is lost on the
    /// way (more frames cross than the receive chunks).
    #[test]
    fn a_receive_gives_its_entries_back_later_and_a_wait_still_sleeps() {
        let Some((hosts, a)) = hosts_and_a("xrel", bpf::Mode::Generic, false) else {
            return;
        };
        let b = open(&hosts, Side::B, Some(bpf::Mode::Generic)).expect("opening xdp on B");
        let frames: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 100]).collect();
        assert_eq!(exchange(&a, &b, &frames).len(), 3);
        assert!(readable(&b), "the entries read are not given back yet");
        b.settle();
        assert!(!readable(&b), "settled, the socket has nothing to say");
        for settle_first in [true, false] {
            assert_eq!(exchange(&a, &b, &frames).len(), 3);
            if settle_first {
                b.settle();
            }
            let t0 = Instant::now();
            b.wait(Some(Duration::from_millis(60))).expect("wait");
            assert!(
                t0.elapsed() >= Duration::from_millis(50),
                "the wait slept {:?}",
                t0.elapsed()
            );
        }
        // Three times the receive chunks, in runs the tx ring takes, taken
        // by receives alone (no wait): every chunk comes back to the fill
        // ring from a receive after the one that read it.
        let run: Vec<Vec<u8>> = (0..500u32).map(|i| i.to_le_bytes().to_vec()).collect();
        let mut batch = RecvBatch::new(BATCH, 2048);
        for r in 0..(3 * RX_CHUNKS as usize).div_ceil(run.len()) {
            a.send(&out_frames(&b, &run)).expect("send");
            let (mut got, start) = (0, Instant::now());
            while got < run.len() && start.elapsed() < Duration::from_secs(5) {
                got += b.recv(&mut batch).expect("recv");
            }
            assert_eq!(got, run.len(), "run {r}");
        }
    }

    /// A busy-polled socket has the options set, and frames cross the
    /// pair in both modes with every empty poll a receive call.
    #[test]
    fn busy_polled_sockets_carry_frames_in_both_modes() {
        for mode in [bpf::Mode::Native, bpf::Mode::Generic] {
            let Some((hosts, a)) = hosts_and_a("xbp", mode, true) else {
                return;
            };
            let b = open_with(&hosts, Side::B, Some(mode), true).expect("opening xdp on B");
            assert!(a.is_busy_polled() && b.is_busy_polled());
            assert_eq!(sockopt(&a, libc::SO_PREFER_BUSY_POLL), 1);
            // (The budget can be set, not read back.)
            assert_eq!(sockopt(&a, libc::SO_BUSY_POLL), BUSY_POLL_US);
            // An empty poll of a busy-polled queue is a receive call.
            let mut batch = RecvBatch::new(BATCH, 2048);
            let before = b.wakeups();
            assert_eq!(b.recv(&mut batch).expect("recv"), 0);
            assert_eq!(b.wakeups(), before + 1, "{mode:?}");
            let frames: Vec<Vec<u8>> = (1..=20u8).map(|i| vec![i; i as usize * 50]).collect();
            for (x, y) in [(&a, &b), (&b, &a)] {
                let got = exchange(x, y, &frames);
                let bytes: Vec<Vec<u8>> = got.into_iter().map(|(_, f)| f).collect();
                assert_eq!(bytes, frames, "{mode:?}");
            }
        }
        // Without the option, an empty poll makes no call.
        let Some((_hosts, a)) = hosts_and_a("xbp", bpf::Mode::Generic, false) else {
            return;
        };
        assert_eq!(sockopt(&a, libc::SO_PREFER_BUSY_POLL), 0);
        let mut batch = RecvBatch::new(BATCH, 2048);
        let before = a.wakeups();
        assert_eq!(a.recv(&mut batch).expect("recv"), 0);
        assert_eq!(a.wakeups(), before);
    }

    /// `frames`, addressed to `to`.
    fn out_frames<'a>(to: &XdpMedium, frames: &'a [Vec<u8>]) -> Vec<OutFrame<'a>> {
        let to = to.local_addr();
        frames.iter().map(|f| OutFrame { to, bytes: f }).collect()
    }

    /// Sends `frames` from `a` to `b` until they all arrive; returns them.
    fn exchange(a: &XdpMedium, b: &XdpMedium, frames: &[Vec<u8>]) -> Vec<(Addr, Vec<u8>)> {
        a.send(&out_frames(b, frames)).expect("send");
        let mut got = vec![];
        let mut batch = RecvBatch::new(BATCH, 2048);
        let start = Instant::now();
        while got.len() < frames.len() && start.elapsed() < Duration::from_secs(5) {
            b.wait(Some(Duration::from_millis(20))).expect("wait");
            b.recv(&mut batch).expect("recv");
            got.extend(batch.iter().map(|(from, f)| (from, f.to_vec())));
        }
        got
    }

    #[test]
    fn frames_cross_the_pair_in_both_modes_and_the_program_leaves_with_the_medium() {
        if let Err(why) = TestHosts::available() {
            println!("skipped: {why}");
            return;
        }
        let hosts = TestHosts::create("xdp").expect("test hosts");
        for mode in [bpf::Mode::Native, bpf::Mode::Generic] {
            let a = match open(&hosts, Side::A, Some(mode)) {
                Ok(m) => m,
                Err(XdpError::Unsupported { what, .. }) => {
                    println!("skipped: the kernel has no {what}");
                    return;
                }
                Err(e) => panic!("opening xdp on A ({mode:?}): {e}"),
            };
            let b = open(&hosts, Side::B, Some(mode)).expect("opening xdp on B");
            assert!(attached(&hosts, Side::A) && attached(&hosts, Side::B));
            assert_eq!(a.mode(), mode);
            assert!(a.caps().max_frame >= 1400, "{}", a.caps().max_frame);
            // Every size up to the MTU, both ways, intact and from the
            // sender's MAC address.
            let sizes = [1usize, 8, 64, 1000, a.caps().max_frame];
            let frames: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect())
                .collect();
            for (x, y) in [(&a, &b), (&b, &a)] {
                let got = exchange(x, y, &frames);
                assert_eq!(got.len(), frames.len(), "{mode:?}");
                for ((from, bytes), sent) in got.iter().zip(&frames) {
                    assert_eq!(*from, x.local_addr());
                    assert_eq!(bytes, sent);
                }
            }
            // Frames built in the send chunks arrive, read where they lie;
            // a builder that stops early sends only what it built, and one
            // that claims more than the room is refused that frame.
            let mut k = 0u8;
            let sent = a
                .send_built(b.local_addr(), 8, &mut |room: &mut [u8]| {
                    assert_eq!(room.len(), a.caps().max_frame);
                    k += 1;
                    (k <= 5).then(|| {
                        room[..k as usize].fill(k);
                        k as usize
                    })
                })
                .expect("send_built");
            assert_eq!(sent, 5);
            // The caller hears once that frames came, before the first,
            // and not when none did.
            let mut lent = vec![];
            let start = Instant::now();
            while lent.len() < 5 && start.elapsed() < Duration::from_secs(5) {
                let arrived = std::cell::Cell::new(0);
                let n = b
                    .recv_lent(&mut || arrived.set(arrived.get() + 1), &mut |from, f| {
                        assert_eq!(arrived.get(), 1, "{mode:?}: a frame before its arrival");
                        lent.push((from, f.to_vec()))
                    })
                    .expect("recv_lent");
                assert_eq!(arrived.get(), usize::from(n > 0), "{mode:?}: {n} frames");
            }
            let want: Vec<(Addr, Vec<u8>)> = (1..=5u8)
                .map(|k| (a.local_addr(), vec![k; k as usize]))
                .collect();
            assert_eq!(lent, want, "{mode:?}");
            let over = a.send_built(b.local_addr(), 1, &mut |room: &mut [u8]| {
                Some(room.len() + 1)
            });
            assert_eq!(over.expect("send_built"), 0);
            assert!(a
                .send_built(Addr::Ip("127.0.0.1:1".parse().unwrap()), 1, &mut |_| None)
                .is_err());
            // More frames than one ring's worth of send chunks: the
            // completion ring gives them back.
            let many: Vec<Vec<u8>> = (0..3000u32).map(|i| i.to_be_bytes().to_vec()).collect();
            let mut got = 0;
            let mut batch = RecvBatch::new(BATCH, 2048);
            for chunk in many.chunks(500) {
                a.send(&out_frames(&b, chunk)).expect("send");
                let start = Instant::now();
                while start.elapsed() < Duration::from_millis(500) && got < many.len() {
                    if b.recv(&mut batch).expect("recv") == 0 {
                        b.wait(Some(Duration::from_millis(5))).expect("wait");
                    }
                    got += batch.len();
                }
            }
            // A veth pair may drop under a burst; most must pass.
            assert!(
                got > many.len() / 2,
                "{got} of {} frames ({mode:?})",
                many.len()
            );
            // Other traffic still reaches the kernel: UDP between the hosts.
            let rx = {
                let _in = hosts.enter(Side::B).unwrap();
                std::net::UdpSocket::bind((hosts.ipv4(Side::B), 0)).unwrap()
            };
            rx.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let tx = {
                let _in = hosts.enter(Side::A).unwrap();
                std::net::UdpSocket::bind((hosts.ipv4(Side::A), 0)).unwrap()
            };
            let mut buf = [0u8; 16];
            let mut passed = false;
            for _ in 0..20 {
                tx.send_to(b"kernel", rx.local_addr().unwrap()).unwrap();
                if let Ok((n, _)) = rx.recv_from(&mut buf) {
                    passed = &buf[..n] == b"kernel";
                    break;
                }
            }
            assert!(passed, "UDP passes the program to the kernel ({mode:?})");
            drop(a);
            drop(b);
            assert!(
                !attached(&hosts, Side::A) && !attached(&hosts, Side::B),
                "detached"
            );
        }
    }

    #[test]
    fn a_veth_is_known_by_its_driver_and_gets_the_generic_hook_unless_told() {
        if let Err(why) = TestHosts::available() {
            println!("skipped: {why}");
            return;
        }
        let hosts = TestHosts::create("xdm").expect("test hosts");
        let info = {
            let _in = hosts.enter(Side::A).unwrap();
            interface(&hosts.iface(Side::A)).expect("the interface")
        };
        assert_eq!(info.driver.as_deref(), Some("veth"));
        assert_eq!(info.preferred_mode(), bpf::Mode::Generic);
        // The loopback device has no ethtool driver information.
        let lo = interface("lo").expect("loopback");
        assert_eq!(lo.preferred_mode(), bpf::Mode::Native);
        let m = match open(&hosts, Side::A, None) {
            Ok(m) => m,
            Err(XdpError::Unsupported { what, .. }) => {
                println!("skipped: the kernel has no {what}");
                return;
            }
            Err(e) => panic!("opening xdp: {e}"),
        };
        assert_eq!(m.mode(), bpf::Mode::Generic);
        drop(m);
        let m = open(&hosts, Side::A, Some(bpf::Mode::Native)).expect("native on a veth");
        assert_eq!(m.mode(), bpf::Mode::Native);
    }

    #[test]
    fn a_missing_interface_is_named() {
        match XdpMedium::open("uvia-none0", &XdpOptions::default()) {
            Err(XdpError::NoInterface(n)) => assert_eq!(n, "uvia-none0"),
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("opened a missing interface"),
        }
    }
}
