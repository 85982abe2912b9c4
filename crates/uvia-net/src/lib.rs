//! Network media: things that move opaque frames to and from peer addresses,
//! and nothing else. They know nothing of descriptors, VIs or the protocol;
//! the I/O-free engine builds and parses the frames they carry.
//!
//! A medium is a small trait with a capabilities struct ([`Medium`],
//! [`Caps`]); wrappers (the fault injector) hold an `inner` medium.

pub mod iface;
pub mod inject;
pub mod neigh;
pub mod netns;
pub mod share;
pub mod udp;
pub mod xdp;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

/// A peer's address on a medium.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Addr {
    /// An IP address and UDP port (the udp medium).
    Ip(SocketAddr),
    /// An Ethernet address (the xdp medium).
    Mac(MacAddr),
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Ip(a) => write!(f, "{a}"),
            Addr::Mac(m) => write!(f, "{m}"),
        }
    }
}

/// An Ethernet (MAC) address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl std::str::FromStr for MacAddr {
    type Err = String;

    /// Six hexadecimal bytes separated by colons (or dashes).
    fn from_str(s: &str) -> Result<MacAddr, String> {
        let mut m = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for b in m.iter_mut() {
            let p = parts.next().filter(|p| (1..=2).contains(&p.len()));
            *b = p
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| format!("{s:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"))?;
        }
        if parts.next().is_some() {
            return Err(format!("{s:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"));
        }
        Ok(MacAddr(m))
    }
}

/// What a medium can do, fixed when it is created.
#[derive(Clone, Debug)]
pub struct Caps {
    pub name: &'static str,
    /// Largest frame (datagram payload) it carries.
    pub max_frame: usize,
    /// Most frames per send or receive call.
    pub max_batch: usize,
    /// UDP segmentation offload is used on send.
    pub gso: bool,
    /// UDP receive offload is used (coalesced datagrams are split again).
    pub gro: bool,
    /// Frames arrive intact or not at all: the medium checksums them end to
    /// end itself (UDP does), so the engine's own checksum may be left out.
    pub intact: bool,
    /// Frames are lent where the medium holds them: [`Medium::recv_lent`]
    /// and [`Medium::send_built`] work, with no copy between the medium's
    /// buffers and the caller's.
    pub lends: bool,
    /// [`Medium::send_gathered`] works: a frame's payload is taken from
    /// where it lies (the kernel copies it once, from there).
    pub gathers: bool,
}

/// A frame to send.
#[derive(Clone, Copy, Debug)]
pub struct OutFrame<'a> {
    pub to: Addr,
    pub bytes: &'a [u8],
}

/// A frame in two pieces, sent as one: its `head` (the header, built in
/// the caller's transmit buffer) and its `tail` (the payload, left in the
/// memory it came from).
#[derive(Clone, Copy, Debug)]
pub struct GatherFrame<'a> {
    pub to: Addr,
    pub head: &'a [u8],
    pub tail: &'a [u8],
}

/// Where [`Medium::recv_placed`] puts the datagram it expects: its first
/// `head` bytes in the batch, the next `len` at `at`, anything after them
/// in the batch again.
#[derive(Clone, Copy, Debug)]
pub struct Placement {
    pub head: usize,
    pub at: *mut u8,
    pub len: usize,
}

/// What [`Medium::recv_placed`] found: `frames` frames in the batch, as
/// after [`Medium::recv`], but that a frame whose bit is set in `in_place`
/// is only the head of the datagram expected at its place, whose payload
/// lies there. Where a datagram was not the one expected, its place holds
/// junk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placed {
    pub frames: usize,
    pub in_place: u64,
}

impl Placed {
    /// Frame `i` is a head whose payload lies at its place.
    pub fn in_place(&self, i: usize) -> bool {
        i < 64 && self.in_place & (1 << i) != 0
    }
}

/// Counters of a medium.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MediumStats {
    pub frames_sent: u64,
    pub frames_received: u64,
    pub datagrams_sent: u64,
    pub datagrams_received: u64,
    /// Send errors about the peer (unreachable, refused) that were swallowed.
    pub send_errors: u64,
}

pub trait Medium: Send + Sync {
    fn caps(&self) -> &Caps;
    fn local_addr(&self) -> Addr;
    /// Sends every frame, blocking only while the kernel's send buffer is
    /// full. Frames to one address leave in the order given. Errors about
    /// the peer (ICMP unreachable) are swallowed and counted: the protocol
    /// above copes with loss. `Err` is a local failure.
    fn send(&self, frames: &[OutFrame<'_>]) -> io::Result<()>;
    /// Sends frames as [`send`](Self::send) does, each gathered from its
    /// two pieces by the kernel: a large payload is not copied into a frame
    /// buffer first. Only media whose caps say `gathers` have it.
    fn send_gathered(&self, frames: &[GatherFrame<'_>]) -> io::Result<()> {
        let _ = frames;
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Receives what has arrived, without blocking, into `batch` (cleared
    /// first). Returns the number of frames.
    fn recv(&self, batch: &mut RecvBatch) -> io::Result<usize>;
    /// Receives without blocking as many datagrams as there are places (at
    /// most the batch's slots), each split as its [`Placement`] says: the
    /// payload of a frame the caller expects goes straight where it
    /// belongs. `expected(i, head, len)` is asked whether datagram `i`,
    /// whose first bytes are `head` and whose length is `len`, is the
    /// frame expected at place `i`; if not, or if it came coalesced with
    /// others, it is put back together in the batch. Only a medium
    /// connected to one peer has it; others say `Unsupported`.
    ///
    /// # Safety
    ///
    /// Each place's `at..at + len` must be memory the caller may write
    /// and that nothing else touches during the call, the places apart.
    unsafe fn recv_placed(
        &self,
        batch: &mut RecvBatch,
        places: &[Placement],
        expected: &dyn Fn(usize, &[u8], usize) -> bool,
    ) -> io::Result<Placed> {
        let _ = (batch, places, expected);
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Hands each frame that has arrived (a batch at most) to `f` where
    /// the medium holds it, without copying, and without blocking. Returns
    /// the number of frames. Only media whose caps say `lends` have it.
    /// `arrived` is called once before the frames, if any came, while
    /// their bytes are still on their way to this core: work the caller
    /// does there (a clock read) costs nothing on the frames' way.
    fn recv_lent(
        &self,
        arrived: &mut dyn FnMut(),
        f: &mut dyn FnMut(Addr, &[u8]),
    ) -> io::Result<usize> {
        let _ = (arrived, f);
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Sends frames to `to` that `build` writes straight into the medium's
    /// transmit buffers: `build` is given room for one frame (`max_frame`
    /// bytes) and returns its length, or `None` when it has no more; at
    /// most `max` frames. Returns the number sent. Blocks only as `send`
    /// does. Only media whose caps say `lends` have it.
    fn send_built(
        &self,
        to: Addr,
        max: usize,
        build: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize> {
        let _ = (to, max, build);
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Takes frames from `to` only, and sends to it the cheapest way, from
    /// now on: a medium made for one connection, once its peer is known.
    /// Media that cannot (or need not) say `Unsupported`.
    fn connect(&self, to: Addr) -> io::Result<()> {
        let _ = to;
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Gives the kernel back what receives keep for later (the AF_XDP
    /// medium's ring entries and chunks): for a caller about to sleep on
    /// [`fd`](Self::fd), which they would otherwise keep readable. [`wait`]
    /// does it itself.
    ///
    /// [`wait`]: Self::wait
    fn settle(&self) {}
    /// Sleeps until a frame may be ready or `timeout` passes (`None`: no
    /// limit). Spurious wake-ups are allowed.
    fn wait(&self, timeout: Option<Duration>) -> io::Result<()>;
    /// Sleeps in the receive itself until a frame arrives or about
    /// `timeout` passes, then receives as [`recv`](Self::recv) does.
    fn recv_wait(&self, batch: &mut RecvBatch, timeout: Duration) -> io::Result<usize> {
        self.wait(Some(timeout))?;
        self.recv(batch)
    }
    /// A descriptor that becomes readable when frames arrive.
    fn fd(&self) -> RawFd;
    fn stats(&self) -> MediumStats {
        MediumStats::default()
    }
}

impl<M: Medium + ?Sized> Medium for Box<M> {
    fn caps(&self) -> &Caps {
        (**self).caps()
    }
    fn local_addr(&self) -> Addr {
        (**self).local_addr()
    }
    fn send(&self, frames: &[OutFrame<'_>]) -> io::Result<()> {
        (**self).send(frames)
    }
    fn send_gathered(&self, frames: &[GatherFrame<'_>]) -> io::Result<()> {
        (**self).send_gathered(frames)
    }
    fn recv(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        (**self).recv(batch)
    }
    unsafe fn recv_placed(
        &self,
        batch: &mut RecvBatch,
        places: &[Placement],
        expected: &dyn Fn(usize, &[u8], usize) -> bool,
    ) -> io::Result<Placed> {
        // SAFETY: the caller's promise, passed on.
        unsafe { (**self).recv_placed(batch, places, expected) }
    }
    fn recv_lent(
        &self,
        arrived: &mut dyn FnMut(),
        f: &mut dyn FnMut(Addr, &[u8]),
    ) -> io::Result<usize> {
        (**self).recv_lent(arrived, f)
    }
    fn send_built(
        &self,
        to: Addr,
        max: usize,
        build: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize> {
        (**self).send_built(to, max, build)
    }
    fn connect(&self, to: Addr) -> io::Result<()> {
        (**self).connect(to)
    }
    fn settle(&self) {
        (**self).settle()
    }
    fn wait(&self, timeout: Option<Duration>) -> io::Result<()> {
        (**self).wait(timeout)
    }
    fn recv_wait(&self, batch: &mut RecvBatch, timeout: Duration) -> io::Result<usize> {
        (**self).recv_wait(batch, timeout)
    }
    fn fd(&self) -> RawFd {
        (**self).fd()
    }
    fn stats(&self) -> MediumStats {
        (**self).stats()
    }
}

/// Sleeps until `fd` is readable or `timeout` passes (`None`: no limit),
/// to the nanosecond: `ppoll`, since `poll`'s milliseconds would turn a
/// short nap into a spin. An interrupted sleep is a spurious wake-up.
pub(crate) fn wait_readable(fd: RawFd, timeout: Option<Duration>) -> io::Result<()> {
    let mut p = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    ppoll(&mut p, timeout)
}

/// Sleeps until `fd` can take a write or `timeout` passes.
pub(crate) fn wait_writable(fd: RawFd, timeout: Option<Duration>) -> io::Result<()> {
    wait_events(&mut [(fd, libc::POLLOUT)], timeout)
}

/// Sleeps until one of `fds` is readable or `timeout` passes (`None`: no
/// limit), as [`Medium::wait`] does for one. Spurious wake-ups are allowed.
pub fn wait_any(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<()> {
    let mut v: Vec<(RawFd, libc::c_short)> = fds.iter().map(|&fd| (fd, libc::POLLIN)).collect();
    wait_events(&mut v, timeout)
}

fn wait_events(fds: &mut [(RawFd, libc::c_short)], timeout: Option<Duration>) -> io::Result<()> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&(fd, events)| libc::pollfd {
            fd,
            events,
            revents: 0,
        })
        .collect();
    ppoll(&mut p, timeout)
}

/// `ppoll(2)` on `p` for at most `timeout` (`None`: no limit); an
/// interrupted sleep is a spurious wake-up, not an error.
fn ppoll(p: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<()> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `p` holds `p.len()` valid pollfds; `tsp` is null or points
    // at a live timespec.
    let r = unsafe {
        libc::ppoll(
            p.as_mut_ptr(),
            p.len() as libc::nfds_t,
            tsp,
            std::ptr::null(),
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Buffers for one receive call, allocated once and reused: `slots`
/// datagram buffers of `slot_len` bytes, and the frames found in them (a
/// coalesced datagram yields several).
pub struct RecvBatch {
    pub(crate) buf: Vec<u8>,
    pub(crate) slot_len: usize,
    pub(crate) slots: usize,
    /// (source, offset in `buf`, length) of each frame.
    pub(crate) frames: Vec<(Addr, usize, usize)>,
    /// Bytes of `buf` in use by pushed frames.
    pub(crate) used: usize,
    /// The UDP medium's message headers, built once on first use.
    pub(crate) sys: Option<Box<udp::RecvHeaders>>,
    /// The last receive found datagrams queued: ask for a whole batch.
    pub(crate) wide: bool,
    /// Single receives in a row that found a datagram.
    pub(crate) streak: u32,
}

impl RecvBatch {
    /// Room for `max_datagrams` datagrams of up to `max_datagram` bytes.
    pub fn new(max_datagrams: usize, max_datagram: usize) -> RecvBatch {
        let slots = max_datagrams.max(1);
        let slot_len = max_datagram.max(1);
        RecvBatch {
            buf: vec![0; slots * slot_len],
            slot_len,
            slots,
            // A coalesced datagram of 64 KiB holds at most 64 frames of
            // 1 KiB; leave room so splitting never allocates.
            frames: Vec::with_capacity(slots * 64),
            used: 0,
            sys: None,
            wide: true,
            streak: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    pub fn clear(&mut self) {
        self.frames.clear();
        self.used = 0;
    }

    /// Frame `i`: its source and bytes.
    pub fn frame(&self, i: usize) -> (Addr, &[u8]) {
        let (a, at, n) = self.frames[i];
        (a, &self.buf[at..at + n])
    }

    /// The slot frame `i` lies in (for a placed receive, the datagram's
    /// place: see [`Medium::recv_placed`]).
    pub fn slot_of(&self, i: usize) -> usize {
        self.frames[i].1 / self.slot_len
    }

    pub fn iter(&self) -> impl Iterator<Item = (Addr, &[u8])> {
        (0..self.len()).map(|i| self.frame(i))
    }

    /// Adds a frame by copying it in (used by wrappers and fakes).
    pub fn push(&mut self, from: Addr, bytes: &[u8]) -> bool {
        let used = self.used;
        if used + bytes.len() > self.buf.len() {
            return false;
        }
        self.buf[used..used + bytes.len()].copy_from_slice(bytes);
        self.frames.push((from, used, bytes.len()));
        self.used += bytes.len();
        true
    }

    /// Notes the `len` bytes at `at` from `from` as one frame, or as
    /// frames of `seg` bytes each where the kernel coalesced them (`seg`
    /// nonzero and shorter).
    pub(crate) fn push_split(
        frames: &mut Vec<(Addr, usize, usize)>,
        from: Addr,
        at: usize,
        len: usize,
        seg: usize,
    ) {
        if seg == 0 || seg >= len {
            frames.push((from, at, len));
            return;
        }
        let mut off = 0;
        while off < len {
            let n = seg.min(len - off);
            frames.push((from, at + off, n));
            off += n;
        }
    }

    /// The slot size: the largest datagram one receive takes.
    pub fn slot_len(&self) -> usize {
        self.slot_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_addresses_parse_and_print() {
        let m: MacAddr = "02:1a:ff:00:7:0b".parse().unwrap();
        assert_eq!(m, MacAddr([0x02, 0x1a, 0xff, 0x00, 0x07, 0x0b]));
        assert_eq!(m.to_string(), "02:1a:ff:00:07:0b");
        assert_eq!("02-1a-ff-00-07-0b".parse::<MacAddr>(), Ok(m));
        for bad in [
            "",
            "02:1a:ff:00:07",
            "02:1a:ff:00:07:0b:01",
            "02:1a:ff:00:07:zz",
            "021a:ff:00:07:0b:00",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad:?}");
        }
    }
}
