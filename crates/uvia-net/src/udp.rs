//! Kernel UDP as a frame medium: one socket on a port of its own (IPv4 or
//! IPv6), unconnected, or connected to one peer once [`Medium::connect`]
//! names it; batched with `sendmmsg`/`recvmmsg`, with UDP segmentation
//! offload on send and receive offload on receive where the kernel has them.
//!
//! The socket is blocking, so a send waits while the kernel's send buffer is
//! full (back-pressure, not loss); receives pass `MSG_DONTWAIT`, so a poll
//! never sleeps. Nothing is allocated per call: message headers, I/O vectors
//! and control buffers live in fixed arrays on the stack.

use crate::{Addr, Caps, GatherFrame, Medium, MediumStats, OutFrame, Placed, Placement, RecvBatch};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

// From linux/udp.h (not in every libc target's constants).
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

/// Most datagrams per system call.
const BATCH: usize = 64;
/// Most segments the kernel takes in one GSO send.
const GSO_MAX_SEGMENTS: usize = 64;
/// Datagrams found queued in one read that switch receive offload on
/// ([`UdpOptions::gro_while_streaming`]).
const STREAM_DATAGRAMS: usize = 4;
/// Reads in a row of one lone frame that switch it off again.
const LONE_READS: u32 = 64;
/// Most bytes of one UDP datagram (IPv4; IPv6 allows 20 more).
const MAX_DATAGRAM: usize = 65_507;

/// Most datagrams of one placed receive ([`Medium::recv_placed`]).
const PLACED_MAX: usize = 16;
/// Control-message room per received datagram (one `UDP_GRO` int).
const RECV_CMSG: usize = 64;

#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub(crate) struct RecvCmsg([u8; RECV_CMSG]);

/// `recvmmsg` headers of a receive batch, pointing at its slots: built once
/// so that a poll that finds nothing costs one system call and no set-up.
pub(crate) struct RecvHeaders {
    hdrs: Box<[libc::mmsghdr]>,
    _iovs: Box<[libc::iovec]>,
    names: Box<[libc::sockaddr_storage]>,
    _cmsgs: Box<[RecvCmsg]>,
}

// SAFETY: the raw pointers inside point only at the batch's own heap
// buffers and the boxes above, which move with the batch between threads.
unsafe impl Send for RecvHeaders {}

impl RecvHeaders {
    fn new(base: *mut u8, slot_len: usize, n: usize) -> Box<RecvHeaders> {
        // SAFETY: plain C structures; zero is a valid value.
        let mut hdrs: Box<[libc::mmsghdr]> = (0..n).map(|_| unsafe { zeroed() }).collect();
        let mut iovs: Box<[libc::iovec]> = (0..n)
            .map(|i| libc::iovec {
                // SAFETY: slot `i` lies within the batch buffer.
                iov_base: unsafe { base.add(i * slot_len) } as *mut libc::c_void,
                iov_len: slot_len,
            })
            .collect();
        // SAFETY: as above.
        let mut names: Box<[libc::sockaddr_storage]> =
            (0..n).map(|_| unsafe { zeroed() }).collect();
        let mut cmsgs: Box<[RecvCmsg]> = vec![RecvCmsg([0; RECV_CMSG]); n].into_boxed_slice();
        for i in 0..n {
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = &mut names[i] as *mut _ as *mut libc::c_void;
            h.msg_iov = &mut iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = cmsgs[i].0.as_mut_ptr() as *mut libc::c_void;
        }
        Box::new(RecvHeaders {
            hdrs,
            _iovs: iovs,
            names,
            _cmsgs: cmsgs,
        })
    }
}

/// Settings for [`UdpMedium::bind`].
#[derive(Clone, Debug)]
pub struct UdpOptions {
    /// Largest frame; `None` picks the bound interface's MTU less the IP
    /// and UDP headers (1472 for IPv4, 1452 for IPv6 on Ethernet; about
    /// 64 KiB on loopback), or the Ethernet values when it cannot be learned.
    pub max_frame: Option<usize>,
    /// Use UDP segmentation offload for runs of equal-size frames.
    pub gso: bool,
    /// Use UDP receive offload.
    pub gro: bool,
    /// Switch UDP receive offload on while datagrams queue up and off
    /// again when they come one at a time (the medium's receive does it,
    /// see [`UdpMedium::gro_active`]). Only for a socket one reader at a
    /// time reads (a connection's own): the switch is made by the reader.
    /// Ignored with `gro`.
    pub gro_while_streaming: bool,
    /// Socket send and receive buffer sizes.
    pub buffer_bytes: usize,
}

impl Default for UdpOptions {
    fn default() -> UdpOptions {
        UdpOptions {
            max_frame: None,
            gso: true,
            gro: true,
            gro_while_streaming: false,
            buffer_bytes: 4 << 20,
        }
    }
}

/// Opening a UDP medium failed.
#[derive(Debug, thiserror::Error)]
pub enum UdpError {
    /// The socket could not be created.
    #[error("creating a UDP socket: {0}")]
    Socket(io::Error),
    /// Another socket holds the address: a medium's port is its own, never
    /// shared with another medium (the kernel would split datagrams
    /// between them).
    #[error("binding UDP to {addr}: the port is held by another socket (EADDRINUSE)")]
    InUse { addr: SocketAddr },
    /// The address could not be bound (not local, no permission, ...).
    #[error("binding UDP to {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    /// A socket option the medium needs was refused.
    #[error("setting {name} on the UDP socket: {source}")]
    Option {
        name: &'static str,
        source: io::Error,
    },
}

/// A bound UDP socket carrying frames.
pub struct UdpMedium {
    fd: OwnedFd,
    local: SocketAddr,
    /// The peer of a connected socket: set once, by [`Medium::connect`].
    peer: OnceLock<SocketAddr>,
    /// The receive timeout last set on the socket, in milliseconds (0:
    /// none), for [`Medium::recv_wait`].
    rcv_timeout_ms: AtomicU64,
    caps: Caps,
    /// Cleared when the kernel refuses a segmented send.
    gso: AtomicBool,
    /// Receive offload may be switched on while streaming.
    gro_adaptive: bool,
    /// The socket's receive offload is on (switched by the reader).
    gro_on: AtomicBool,
    /// A coalesced datagram may be queued: every read needs its control
    /// message. Set before the offload goes on; cleared by a read that
    /// finds the queue empty once it is off again.
    coalesced: AtomicBool,
    /// Reads in a row, with the offload on, that found one lone frame.
    lone_reads: AtomicU32,
    frames_sent: AtomicU64,
    frames_received: AtomicU64,
    datagrams_sent: AtomicU64,
    datagrams_received: AtomicU64,
    send_errors: AtomicU64,
}

/// The segment size of a datagram the kernel coalesced (receive offload),
/// from its `UDP_GRO` control message; 0 if none.
///
/// # Safety
///
/// `h`'s control buffer must be one the kernel filled.
unsafe fn gro_segment(h: &libc::msghdr) -> usize {
    let mut seg = 0;
    // SAFETY: the caller's promise; the macros walk within the buffer.
    unsafe {
        let mut cm = libc::CMSG_FIRSTHDR(h);
        while !cm.is_null() {
            if (*cm).cmsg_level == libc::SOL_UDP && (*cm).cmsg_type == UDP_GRO {
                seg = std::ptr::read_unaligned(libc::CMSG_DATA(cm) as *const libc::c_int) as usize;
            }
            cm = libc::CMSG_NXTHDR(h, cm);
        }
    }
    seg
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: a valid fd and a pointer to a live c_int of the right size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const libc::c_int as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A socket address in the kernel's form.
fn to_raw(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all zeros is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_flowinfo = v6.flowinfo();
            sin6.sin6_scope_id = v6.scope_id();
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

pub(crate) fn from_raw(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                sin6.sin6_addr.s6_addr.into(),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// The MTU of the interface that holds `ip`, from the kernel's interface
/// list ([`crate::iface`]) and `/sys/class/net/<name>/mtu`.
fn interface_mtu(ip: IpAddr) -> Option<usize> {
    if ip.is_loopback() {
        return std::fs::read_to_string("/sys/class/net/lo/mtu")
            .ok()
            .and_then(|s| s.trim().parse().ok());
    }
    let name = crate::iface::addresses()
        .into_iter()
        .find(|a| a.ip == ip)?
        .name;
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

fn default_max_frame(ip: IpAddr) -> usize {
    let fallback = match ip {
        IpAddr::V4(_) => 1472,
        IpAddr::V6(_) => 1452,
    };
    match interface_mtu(ip).and_then(|mtu| unfragmented_payload(ip, mtu)) {
        Some(frame) => frame.min(MAX_DATAGRAM),
        None => fallback,
    }
}

/// The largest UDP payload that fills an interface of `mtu` in one IP
/// packet. For IPv4 the packet also stays within the kernel's largest
/// fragment (the room after the IP header rounded down to 8 bytes): on
/// Ethernet that is the whole MTU less the headers (1472), on loopback
/// (MTU 65,536) it is 65,504 where 65,507 would fit, and datagrams past it
/// (65,505 or 65,507 bytes) took 2–3x as long to copy out on receive as
/// datagrams of 65,504 (`uvia bw -p udp` at 64 KiB and 1 MiB, frame sizes
/// alternated). IPv6 keeps the whole MTU less its headers (1452 on
/// Ethernet, 65,488 on loopback).
fn unfragmented_payload(ip: IpAddr, mtu: usize) -> Option<usize> {
    const UDP_HEADER: usize = 8;
    let room = match ip {
        IpAddr::V4(_) => mtu.checked_sub(20)? & !7,
        IpAddr::V6(_) => mtu.checked_sub(40)?,
    };
    room.checked_sub(UDP_HEADER).filter(|&n| n > 0)
}

/// A frame's destination as a socket address; `send` has refused any
/// other kind of address before this is asked.
fn ip_of(a: Addr) -> SocketAddr {
    match a {
        Addr::Ip(s) => s,
        Addr::Mac(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
    }
}

impl UdpMedium {
    /// Binds a UDP socket to `addr` (port 0 picks one; `local_addr` tells).
    /// The port is the medium's own: if another socket holds it, this fails
    /// with [`UdpError::InUse`], whatever that socket's options. No socket
    /// sets `SO_REUSEPORT`, so nobody can join it either (the kernel would
    /// split datagrams between the sockets sharing a port).
    pub fn bind(addr: SocketAddr, opts: UdpOptions) -> Result<UdpMedium, UdpError> {
        let family = if addr.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        // SAFETY: plain socket creation; the result is checked.
        let raw = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(UdpError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let opt = |name, r: io::Result<()>| r.map_err(|source| UdpError::Option { name, source });
        let buf = opts.buffer_bytes.min(i32::MAX as usize) as libc::c_int;
        // The FORCE variants pass the system limit when privileged; the
        // plain ones are the fallback (capped by the limit).
        if setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, buf).is_err() {
            opt(
                "SO_RCVBUF",
                setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, buf),
            )?;
        }
        if setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, buf).is_err() {
            opt(
                "SO_SNDBUF",
                setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_SNDBUF, buf),
            )?;
        }
        if family == libc::AF_INET6 {
            opt(
                "IPV6_V6ONLY",
                setsockopt_int(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1),
            )?;
        }
        let gro = opts.gro && setsockopt_int(raw, libc::SOL_UDP, UDP_GRO, 1).is_ok();
        let (ss, len) = to_raw(&addr);
        // SAFETY: `ss` holds a socket address of `len` bytes.
        if unsafe { libc::bind(raw, &ss as *const _ as *const libc::sockaddr, len) } != 0 {
            let source = io::Error::last_os_error();
            return Err(match source.raw_os_error() {
                Some(libc::EADDRINUSE) => UdpError::InUse { addr },
                _ => UdpError::Bind { addr, source },
            });
        }
        // SAFETY: sockaddr_storage is plain data.
        let mut got: libc::sockaddr_storage = unsafe { zeroed() };
        let mut glen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: `got` has room for any address.
        unsafe { libc::getsockname(raw, &mut got as *mut _ as *mut libc::sockaddr, &mut glen) };
        let local = from_raw(&got).unwrap_or(addr);
        let max_frame = opts
            .max_frame
            .unwrap_or_else(|| default_max_frame(addr.ip()))
            .clamp(64, MAX_DATAGRAM);
        Ok(UdpMedium {
            fd,
            local,
            peer: OnceLock::new(),
            rcv_timeout_ms: AtomicU64::new(0),
            caps: Caps {
                name: "udp",
                max_frame,
                max_batch: BATCH,
                gso: opts.gso,
                gro,
                // The UDP checksum covers every datagram (the kernel
                // computes and checks it; loopback cannot corrupt).
                intact: true,
                lends: false,
                gathers: true,
            },
            gso: AtomicBool::new(opts.gso),
            gro_adaptive: opts.gro_while_streaming && !gro,
            gro_on: AtomicBool::new(false),
            coalesced: AtomicBool::new(false),
            lone_reads: AtomicU32::new(0),
            frames_sent: AtomicU64::new(0),
            frames_received: AtomicU64::new(0),
            datagrams_sent: AtomicU64::new(0),
            datagrams_received: AtomicU64::new(0),
            send_errors: AtomicU64::new(0),
        })
    }

    /// The address and port it is bound to.
    pub fn local_ip(&self) -> SocketAddr {
        self.local
    }

    /// True while the socket's receive offload is on.
    pub fn gro_active(&self) -> bool {
        self.caps.gro || self.gro_on.load(Ordering::Relaxed)
    }

    /// A queued datagram may hold several frames: a read must take the
    /// control message that says where they split.
    fn may_coalesce(&self) -> bool {
        self.caps.gro || self.coalesced.load(Ordering::Relaxed)
    }

    /// Receive offload while streaming, after a read of `datagrams`
    /// holding `frames`. A stream's segmented sends then arrive whole,
    /// one datagram and one copy for up to 64 frames, where without it
    /// the kernel splits them and a read takes each alone. But with it on
    /// every read needs its control message, and a ping-pong's poll, a
    /// `recvmsg` in place of a `recvfrom`, cost 0.4 us more a message. So
    /// it goes on when a read finds [`STREAM_DATAGRAMS`] queued, and off
    /// after [`LONE_READS`] reads in a row that found one lone frame;
    /// reads go on taking the control message until the queue has been
    /// found empty. Measured with `uvia bw -p udp` against the build
    /// without it, alternated: 64 B messages 768k–863k a second against
    /// 505k–536k, 1 KiB 619k–778k against 424k–484k; 8 B ping-pong the
    /// same.
    fn adapt_gro(&self, datagrams: usize, frames: usize) {
        let on = self.gro_on.load(Ordering::Relaxed);
        if datagrams >= STREAM_DATAGRAMS {
            self.lone_reads.store(0, Ordering::Relaxed);
            if !on {
                // Reads take the control message before anything can
                // come coalesced.
                self.coalesced.store(true, Ordering::Relaxed);
                if setsockopt_int(self.fd.as_raw_fd(), libc::SOL_UDP, UDP_GRO, 1).is_ok() {
                    self.gro_on.store(true, Ordering::Relaxed);
                }
            }
        } else if on {
            // Counted only while it is on: a read with it off writes nothing.
            let lone = match frames {
                1 => self.lone_reads.load(Ordering::Relaxed) + 1,
                _ => 0,
            };
            if lone >= LONE_READS
                && setsockopt_int(self.fd.as_raw_fd(), libc::SOL_UDP, UDP_GRO, 0).is_ok()
            {
                self.gro_on.store(false, Ordering::Relaxed);
                self.lone_reads.store(0, Ordering::Relaxed);
            } else {
                self.lone_reads.store(lone, Ordering::Relaxed);
            }
        }
    }

    /// One datagram with `recvfrom`: the cheapest look at the socket (no
    /// message header to copy in), usable when datagrams are never
    /// coalesced (receive offload off).
    fn recv_one(&self, batch: &mut RecvBatch, flags: libc::c_int) -> io::Result<usize> {
        // SAFETY: sockaddr_storage is plain data.
        let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
        let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // A connected socket only takes its peer's datagrams: the kernel
        // need not copy the source address out.
        let (name, name_len) = match self.peer.get() {
            Some(_) => (std::ptr::null_mut(), std::ptr::null_mut()),
            None => (&mut ss as *mut _ as *mut libc::sockaddr, &mut len as *mut _),
        };
        let cap = batch.slot_len.min(batch.buf.len());
        // SAFETY: the first slot of the batch holds `cap` writable bytes;
        // `name`, when not null, is `ss`, which has room for any address.
        let r = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                batch.buf.as_mut_ptr() as *mut libc::c_void,
                cap,
                flags,
                name,
                name_len,
            )
        };
        if r < 0 {
            batch.streak = 0;
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        uvia_trace::mark!(RxFound);
        // Two datagrams in two looks: they are queueing, take batches.
        batch.streak += 1;
        batch.wide = batch.streak >= 2;
        let Some(from) = self.peer.get().copied().or_else(|| from_raw(&ss)) else {
            return Ok(0);
        };
        batch.frames.push((Addr::Ip(from), 0, r as usize));
        batch.used = batch.buf.len();
        self.datagrams_received.fetch_add(1, Ordering::Relaxed);
        self.frames_received.fetch_add(1, Ordering::Relaxed);
        Ok(1)
    }

    /// One frame, one `sendto`: the ping-pong case, without building
    /// message headers.
    fn send_one(&self, f: &OutFrame<'_>) -> io::Result<()> {
        let to = ip_of(f.to);
        let connected = self.peer.get() == Some(&to);
        loop {
            uvia_trace::mark!(SyscallEnter);
            // SAFETY: `f.bytes` is a live slice; `ss` holds an address of
            // `len` bytes (built only for a socket not connected to `to`).
            let r = unsafe {
                if connected {
                    libc::send(
                        self.fd.as_raw_fd(),
                        f.bytes.as_ptr() as *const libc::c_void,
                        f.bytes.len(),
                        0,
                    )
                } else {
                    let (ss, len) = to_raw(&to);
                    libc::sendto(
                        self.fd.as_raw_fd(),
                        f.bytes.as_ptr() as *const libc::c_void,
                        f.bytes.len(),
                        0,
                        &ss as *const _ as *const libc::sockaddr,
                        len,
                    )
                }
            };
            uvia_trace::mark!(SyscallExit);
            if r >= 0 {
                break;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH) => {
                    self.send_errors.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                _ => return Err(e),
            }
        }
        self.datagrams_sent.fetch_add(1, Ordering::Relaxed);
        self.frames_sent.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Sends every frame in batches of datagrams (segmented where runs of
    /// equal-size frames allow).
    fn send_all<F: Pieces>(&self, mut frames: &[F]) -> io::Result<()> {
        if let Some(f) = frames.iter().find(|f| !matches!(f.to(), Addr::Ip(_))) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the udp medium sends to IP addresses, not {}", f.to()),
            ));
        }
        while !frames.is_empty() {
            let gso = self.gso.load(Ordering::Relaxed);
            match self.send_chunk(frames, gso) {
                Ok(n) => frames = &frames[n..],
                Err(e) if gso && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                    // The kernel or device refuses segmentation: send plain
                    // datagrams from now on.
                    self.gso.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sends up to `BATCH` datagrams built from `frames` (all to one
    /// address per datagram); returns how many frames went. A frame is one
    /// or two pieces ([`Pieces`]), each an I/O vector of its datagram.
    fn send_chunk<F: Pieces>(&self, frames: &[F], gso: bool) -> io::Result<usize> {
        const CMSG_SPACE: usize = 32;
        #[repr(C, align(8))]
        struct Cmsg([u8; CMSG_SPACE]);
        // SAFETY: these are plain C structures; zero is a valid initial value.
        let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        let mut iovs: [libc::iovec; 2 * BATCH] = unsafe { zeroed() };
        let mut names: [libc::sockaddr_storage; BATCH] = unsafe { zeroed() };
        let mut cmsgs: [Cmsg; BATCH] = unsafe { zeroed() };
        let mut n_iov = 0;
        let mut n_msg = 0;
        let mut i = 0;
        while i < frames.len() && n_msg < BATCH && n_iov < BATCH {
            let f = &frames[i];
            let to = ip_of(f.to());
            // A run of equal-size frames to one address (the last may be
            // shorter) goes as one segmented datagram.
            let seg = f.len();
            let mut run = 1;
            if gso && seg > 0 {
                let mut total = seg;
                while i + run < frames.len()
                    && run < GSO_MAX_SEGMENTS
                    && n_iov + run < BATCH
                    && frames[i + run].to() == f.to()
                    && frames[i + run].len() <= seg
                    && total + frames[i + run].len() <= MAX_DATAGRAM
                    && frames[i + run - 1].len() == seg
                {
                    total += frames[i + run].len();
                    run += 1;
                }
            }
            let first_iov = n_iov;
            for k in 0..run {
                let (head, tail) = frames[i + k].pieces();
                for b in [head, tail] {
                    if !b.is_empty() {
                        iovs[n_iov] = libc::iovec {
                            iov_base: b.as_ptr() as *mut libc::c_void,
                            iov_len: b.len(),
                        };
                        n_iov += 1;
                    }
                }
            }
            let (ss, len) = to_raw(&to);
            names[n_msg] = ss;
            let h = &mut hdrs[n_msg].msg_hdr;
            h.msg_name = &mut names[n_msg] as *mut _ as *mut libc::c_void;
            h.msg_namelen = len;
            h.msg_iov = &mut iovs[first_iov];
            h.msg_iovlen = (n_iov - first_iov) as _;
            if run > 1 {
                let c = &mut cmsgs[n_msg];
                h.msg_control = c.0.as_mut_ptr() as *mut libc::c_void;
                // SAFETY: CMSG_SPACE of a u16 fits the 32-byte buffer.
                h.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as _;
                // SAFETY: the control buffer is set and large enough for one header.
                unsafe {
                    let cm = libc::CMSG_FIRSTHDR(h);
                    (*cm).cmsg_level = libc::SOL_UDP;
                    (*cm).cmsg_type = UDP_SEGMENT;
                    (*cm).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(cm) as *mut u16, seg as u16);
                }
            }
            n_msg += 1;
            i += run;
        }
        let mut sent_msgs = 0;
        while sent_msgs < n_msg {
            uvia_trace::mark!(SyscallEnter);
            // SAFETY: `hdrs[sent_msgs..n_msg]` are filled headers pointing at
            // live names, vectors, control buffers and frame bytes.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    hdrs.as_mut_ptr().add(sent_msgs),
                    (n_msg - sent_msgs) as u32,
                    0,
                )
            };
            uvia_trace::mark!(SyscallExit);
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH) => {
                        // About the peer, not us: count it, drop the datagram.
                        self.send_errors.fetch_add(1, Ordering::Relaxed);
                        sent_msgs += 1;
                        continue;
                    }
                    _ => return Err(e),
                }
            }
            sent_msgs += r as usize;
        }
        self.datagrams_sent
            .fetch_add(n_msg as u64, Ordering::Relaxed);
        self.frames_sent.fetch_add(i as u64, Ordering::Relaxed);
        Ok(i)
    }
}

/// A frame as [`UdpMedium::send_chunk`] takes it: whole, or a head and a
/// tail that the kernel gathers into one datagram.
trait Pieces {
    fn to(&self) -> Addr;
    fn pieces(&self) -> (&[u8], &[u8]);
    fn len(&self) -> usize {
        let (h, t) = self.pieces();
        h.len() + t.len()
    }
}

impl Pieces for OutFrame<'_> {
    fn to(&self) -> Addr {
        self.to
    }
    fn pieces(&self) -> (&[u8], &[u8]) {
        (self.bytes, &[])
    }
}

impl Pieces for GatherFrame<'_> {
    fn to(&self) -> Addr {
        self.to
    }
    fn pieces(&self) -> (&[u8], &[u8]) {
        (self.head, self.tail)
    }
}

impl Medium for UdpMedium {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn local_addr(&self) -> Addr {
        Addr::Ip(self.local)
    }

    fn send(&self, frames: &[OutFrame<'_>]) -> io::Result<()> {
        if let [f] = frames {
            if matches!(f.to, Addr::Ip(_)) {
                return self.send_one(f);
            }
        }
        self.send_all(frames)
    }

    fn send_gathered(&self, frames: &[GatherFrame<'_>]) -> io::Result<()> {
        self.send_all(frames)
    }

    fn recv(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        batch.clear();
        let coalesced = self.may_coalesce();
        if !batch.wide && !coalesced {
            return self.recv_one(batch, libc::MSG_DONTWAIT);
        }
        // One datagram at a time while they come one at a time (a ping-pong:
        // asking for more costs a second look in the kernel per message);
        // whole batches once they queue up.
        let n = if batch.wide {
            batch.slots.min(BATCH)
        } else {
            1
        };
        let base = batch.buf.as_mut_ptr();
        let all = batch.slots.min(BATCH);
        let slot_len = batch.slot_len;
        let sys = batch
            .sys
            .get_or_insert_with(|| RecvHeaders::new(base, slot_len, all));
        for h in sys.hdrs[..n].iter_mut() {
            // The kernel shrinks these to what it wrote: give the room back.
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = RECV_CMSG as _;
        }
        // SAFETY: `hdrs[..n]` point at the batch's slots and at the
        // headers' own names and control buffers, all alive and unmoved
        // (boxed) for as long as the batch.
        let r = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                sys.hdrs.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => {
                    // Nothing queued: once the offload is off, nothing
                    // coalesced can come any more.
                    if coalesced && self.gro_adaptive && !self.gro_on.load(Ordering::Relaxed) {
                        self.coalesced.store(false, Ordering::Relaxed);
                    }
                    Ok(0)
                }
                io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        uvia_trace::mark!(RxFound);
        let (hdrs, names) = (&sys.hdrs, &sys.names);
        let got = r as usize;
        batch.wide = got > 1 || (n == 1 && got == 1);
        batch.streak = 0;
        for i in 0..got {
            let h = &hdrs[i].msg_hdr;
            let len = hdrs[i].msg_len as usize;
            let Some(from) = from_raw(&names[i]) else {
                continue;
            };
            // SAFETY: the kernel filled the header's control buffer.
            let seg = unsafe { gro_segment(h) };
            let at = i * batch.slot_len;
            RecvBatch::push_split(&mut batch.frames, Addr::Ip(from), at, len, seg);
        }
        batch.used = batch.buf.len();
        if self.gro_adaptive {
            self.adapt_gro(got, batch.frames.len());
        }
        self.datagrams_received
            .fetch_add(got as u64, Ordering::Relaxed);
        self.frames_received
            .fetch_add(batch.frames.len() as u64, Ordering::Relaxed);
        Ok(batch.frames.len())
    }

    /// One `recvmmsg` of a datagram per place, each into three I/O
    /// vectors: the head into its slot of the batch, the payload into its
    /// place, anything longer into the slot behind the head (as far as
    /// leaves room to put it back together there). Control messages are
    /// taken too: with receive offload on, a datagram may hold several
    /// frames.
    unsafe fn recv_placed(
        &self,
        batch: &mut RecvBatch,
        places: &[Placement],
        expected: &dyn Fn(usize, &[u8], usize) -> bool,
    ) -> io::Result<Placed> {
        let Some(&peer) = self.peer.get() else {
            return Err(io::ErrorKind::Unsupported.into());
        };
        batch.clear();
        let slot = batch.slot_len;
        let n = places.len().min(batch.slots).min(PLACED_MAX);
        if n == 0 {
            return Ok(Placed::default());
        }
        if places[..n].iter().any(|p| p.head + p.len > slot) {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let base = batch.buf.as_mut_ptr();
        // SAFETY: plain C structures; zero is a valid value.
        let mut hdrs: [libc::mmsghdr; PLACED_MAX] = unsafe { zeroed() };
        let mut iovs: [[libc::iovec; 3]; PLACED_MAX] = unsafe { zeroed() };
        let mut cmsgs = [RecvCmsg([0; RECV_CMSG]); PLACED_MAX];
        for (i, p) in places[..n].iter().enumerate() {
            // SAFETY: slot `i < slots` lies within the buffer, and
            // `head + len <= slot`.
            let at = unsafe { base.add(i * slot) };
            iovs[i] = [
                libc::iovec {
                    iov_base: at as *mut libc::c_void,
                    iov_len: p.head,
                },
                libc::iovec {
                    iov_base: p.at as *mut libc::c_void,
                    iov_len: p.len,
                },
                libc::iovec {
                    iov_base: unsafe { at.add(p.head) } as *mut libc::c_void,
                    iov_len: slot - p.head - p.len,
                },
            ];
            let h = &mut hdrs[i].msg_hdr;
            h.msg_iov = iovs[i].as_mut_ptr();
            h.msg_iovlen = 3;
            h.msg_control = cmsgs[i].0.as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = RECV_CMSG as _;
        }
        // SAFETY: the vectors point at the batch's slots and at the memory
        // the caller lends (its promise); the headers at live locals.
        let r = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                hdrs.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(Placed::default()),
                _ => Err(e),
            };
        }
        uvia_trace::mark!(RxFound);
        let from = Addr::Ip(peer);
        let mut in_place = 0u64;
        for (i, p) in places[..r as usize].iter().enumerate() {
            let h = &hdrs[i].msg_hdr;
            let len = hdrs[i].msg_len as usize;
            // SAFETY: the kernel filled the header's control buffer.
            let seg = unsafe { gro_segment(h) };
            let at = i * slot;
            let whole = seg == 0 || seg >= len;
            let head = len.min(p.head);
            let k = batch.frames.len();
            if whole && k < 64 && expected(i, &batch.buf[at..at + head], len) {
                batch.frames.push((from, at, head));
                in_place |= 1 << k;
                continue;
            }
            // Put back together in the slot: the bytes after the placed
            // ones move up behind them, the placed ones come back between.
            let placed = len.saturating_sub(p.head).min(p.len);
            let rest = len - head - placed;
            let tail = at + p.head;
            batch.buf.copy_within(tail..tail + rest, tail + placed);
            // SAFETY: the kernel wrote `placed` bytes at `p.at`, memory
            // the caller lends for the call, apart from the batch.
            let got = unsafe { std::slice::from_raw_parts(p.at, placed) };
            batch.buf[tail..tail + placed].copy_from_slice(got);
            RecvBatch::push_split(&mut batch.frames, from, at, len, seg);
        }
        batch.used = batch.buf.len();
        self.datagrams_received
            .fetch_add(r as u64, Ordering::Relaxed);
        self.frames_received
            .fetch_add(batch.frames.len() as u64, Ordering::Relaxed);
        Ok(Placed {
            frames: batch.frames.len(),
            in_place,
        })
    }

    /// Connects the socket to `to`: from now on the kernel hands it only
    /// `to`'s datagrams, a receive need not copy the source address out,
    /// and a send to `to` skips the route lookup of an unconnected socket.
    /// Once only: a second call fails with `AlreadyExists`.
    fn connect(&self, to: Addr) -> io::Result<()> {
        let Addr::Ip(to) = to else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the udp medium connects to IP addresses, not {to}"),
            ));
        };
        if self.peer.get().is_some() {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        let (ss, len) = to_raw(&to);
        // SAFETY: `ss` holds a socket address of `len` bytes.
        if unsafe {
            libc::connect(
                self.fd.as_raw_fd(),
                &ss as *const _ as *const libc::sockaddr,
                len,
            )
        } != 0
        {
            return Err(io::Error::last_os_error());
        }
        self.peer
            .set(to)
            .map_err(|_| io::Error::from(io::ErrorKind::AlreadyExists))
    }

    fn wait(&self, timeout: Option<Duration>) -> io::Result<()> {
        crate::wait_readable(self.fd.as_raw_fd(), timeout)
    }

    /// On a connected socket whose datagrams are never coalesced: one
    /// `recvfrom` that sleeps (bounded by `SO_RCVTIMEO`, set only when the
    /// bound changes), where a `poll` and a receive would be two calls.
    fn recv_wait(&self, batch: &mut RecvBatch, timeout: Duration) -> io::Result<usize> {
        if self.may_coalesce() || self.peer.get().is_none() {
            self.wait(Some(timeout))?;
            return self.recv(batch);
        }
        // Whole milliseconds (the kernel counts the bound in ticks): the
        // naps of a waiter are then the same few values, set once each.
        let ms = timeout.as_micros().div_ceil(1000).clamp(1, 1 << 30) as u64;
        if self.rcv_timeout_ms.swap(ms, Ordering::Relaxed) != ms {
            let tv = libc::timeval {
                tv_sec: (ms / 1000) as libc::time_t,
                tv_usec: ((ms % 1000) * 1000) as libc::suseconds_t,
            };
            // SAFETY: `tv` is a valid timeval of the size given.
            let r = unsafe {
                libc::setsockopt(
                    self.fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    &tv as *const _ as *const libc::c_void,
                    size_of::<libc::timeval>() as libc::socklen_t,
                )
            };
            if r != 0 {
                self.rcv_timeout_ms.store(0, Ordering::Relaxed);
                return Err(io::Error::last_os_error());
            }
        }
        batch.clear();
        self.recv_one(batch, 0)
    }

    fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn stats(&self) -> MediumStats {
        MediumStats {
            frames_sent: self.frames_sent.load(Ordering::Relaxed),
            frames_received: self.frames_received.load(Ordering::Relaxed),
            datagrams_sent: self.datagrams_sent.load(Ordering::Relaxed),
            datagrams_received: self.datagrams_received.load(Ordering::Relaxed),
            send_errors: self.send_errors.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn pair(ip: &str, opts: UdpOptions) -> (UdpMedium, UdpMedium) {
        let ip: IpAddr = ip.parse().unwrap();
        let a = UdpMedium::bind((ip, 0).into(), opts.clone()).unwrap();
        let b = UdpMedium::bind((ip, 0).into(), opts).unwrap();
        (a, b)
    }

    /// Receives `want` frames from `m` within a few seconds.
    fn collect(m: &UdpMedium, want: usize) -> Vec<Vec<u8>> {
        let mut batch = RecvBatch::new(64, 65_536);
        let mut out = vec![];
        let start = Instant::now();
        while out.len() < want && start.elapsed() < Duration::from_secs(5) {
            m.wait(Some(Duration::from_millis(50))).unwrap();
            m.recv(&mut batch).unwrap();
            out.extend(batch.iter().map(|(_, b)| b.to_vec()));
        }
        out
    }

    fn frames(sizes: &[usize]) -> Vec<Vec<u8>> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|k| (k * 7 + i * 13) as u8).collect())
            .collect()
    }

    /// Sends `data` from `a` to `b`, frame by frame in one call.
    fn send_all_to(a: &UdpMedium, b: &UdpMedium, data: &[Vec<u8>]) {
        let out: Vec<OutFrame<'_>> = data
            .iter()
            .map(|d| OutFrame {
                to: b.local_addr(),
                bytes: d,
            })
            .collect();
        a.send(&out).unwrap();
    }

    fn exchange(ip: &str, opts: UdpOptions) {
        let (a, b) = pair(ip, opts);
        // Runs that segment (equal sizes, a shorter tail) and lone frames.
        let mut sizes = vec![1200; 40];
        sizes.push(300);
        sizes.extend([1, 64, 1472, 9000, 1472, 1472]);
        sizes.extend(vec![1000; 100]);
        let data = frames(&sizes);
        send_all_to(&a, &b, &data);
        let got = collect(&b, data.len());
        assert_eq!(got.len(), data.len(), "every frame arrives ({ip})");
        assert_eq!(got, data, "identical and in order ({ip})");
    }

    /// As [`exchange`], each frame sent in two pieces (a head and a tail
    /// from elsewhere in memory, as the VIs lend payloads), some with an
    /// empty tail.
    fn exchange_gathered(ip: &str, opts: UdpOptions) {
        let (a, b) = pair(ip, opts);
        let mut sizes = vec![1200; 40];
        sizes.push(300);
        sizes.extend([1, 64, 1472, 9000, 1472, 1472, 60_000]);
        sizes.extend(vec![1000; 100]);
        let data = frames(&sizes);
        // The tails live in one buffer of their own, the heads in `data`.
        let tails: Vec<u8> = data
            .iter()
            .flat_map(|d| d[d.len() / 3..].to_vec())
            .collect();
        let mut at = 0;
        let out: Vec<GatherFrame<'_>> = data
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let cut = if i % 7 == 3 { d.len() } else { d.len() / 3 };
                let tail = &tails[at..at + d.len() - d.len() / 3];
                at += tail.len();
                GatherFrame {
                    to: b.local_addr(),
                    head: &d[..cut],
                    tail: if cut == d.len() { &[] } else { tail },
                }
            })
            .collect();
        assert!(a.caps().gathers);
        a.send_gathered(&out).unwrap();
        let got = collect(&b, data.len());
        assert_eq!(got.len(), data.len(), "every frame arrives ({ip})");
        assert_eq!(got, data, "identical and in order ({ip})");
    }

    #[test]
    fn frames_arrive_identical_and_in_order_v4_and_v6_with_and_without_offloads() {
        for ip in ["127.0.0.1", "::1"] {
            for opts in [
                UdpOptions::default(),
                UdpOptions {
                    gso: false,
                    gro: false,
                    ..UdpOptions::default()
                },
            ] {
                exchange(ip, opts.clone());
                exchange_gathered(ip, opts);
            }
        }
    }

    /// A placed receive: datagrams said to be the ones expected leave their
    /// head in the batch and the rest at their places; the others (a short
    /// one, one of another length, one said not to be expected) come back
    /// whole and identical, whatever junk they left at their places.
    #[test]
    fn placed_receives_split_the_expected_and_return_the_rest_whole() {
        // One datagram a frame: segmented sends could arrive coalesced,
        // and come back as several frames of one datagram.
        let one_each = UdpOptions {
            gso: false,
            ..UdpOptions::default()
        };
        let (a, b) = pair("127.0.0.1", one_each);
        b.connect(a.local_addr()).unwrap();
        const HEAD: usize = 64;
        const LEN: usize = 20_000;
        // 0, 2 and 5 as expected; 1 short; 3 longer than its place; 4 of
        // the right length but refused by the caller.
        let sizes = [
            HEAD + LEN,
            40,
            HEAD + LEN,
            HEAD + LEN + 3000,
            HEAD + LEN,
            HEAD + LEN,
        ];
        let data = frames(&sizes);
        let mut places_mem = vec![0u8; sizes.len() * LEN];
        let base = places_mem.as_mut_ptr();
        let places: Vec<Placement> = (0..sizes.len())
            .map(|i| Placement {
                head: HEAD,
                // SAFETY: within `places_mem`.
                at: unsafe { base.add(i * LEN) },
                len: LEN,
            })
            .collect();
        send_all_to(&a, &b, &data);
        let mut batch = RecvBatch::new(16, 65_536);
        let mut got = Vec::new();
        let mut whole = Vec::new();
        let start = Instant::now();
        while got.len() < sizes.len() && start.elapsed() < Duration::from_secs(5) {
            let k = got.len();
            let expected = |i: usize, head: &[u8], len: usize| {
                let i = k + i;
                i != 4 && len == HEAD + LEN && head == &data[i][..HEAD]
            };
            // SAFETY: each place is its own piece of `places_mem`, alive
            // and untouched by anything else during the call.
            let p = unsafe { b.recv_placed(&mut batch, &places[k..], &expected) }.unwrap();
            for f in 0..p.frames {
                let (_, bytes) = batch.frame(f);
                let i = k + batch.slot_of(f);
                if p.in_place(f) {
                    let mut back = bytes.to_vec();
                    back.extend_from_slice(&places_mem[i * LEN..(i + 1) * LEN]);
                    got.push(back);
                } else {
                    whole.push(i);
                    got.push(bytes.to_vec());
                }
            }
        }
        assert_eq!(got, data, "every datagram, identical and in order");
        assert_eq!(whole, [1, 3, 4], "which came back whole");
    }

    #[test]
    fn bad_bind_addresses_fail_clearly() {
        // An address no interface here has.
        let e = UdpMedium::bind("192.0.2.1:0".parse().unwrap(), UdpOptions::default())
            .err()
            .expect("bind must fail");
        assert!(e.to_string().contains("binding UDP to 192.0.2.1:0"), "{e}");
        // A port held by a socket that does not share it.
        let other = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let taken = other.local_addr().unwrap();
        let e = UdpMedium::bind(taken, UdpOptions::default())
            .err()
            .expect("port in use");
        assert!(e.to_string().contains(&taken.to_string()), "{e}");
    }

    #[test]
    fn a_bound_port_is_the_mediums_own() {
        let a = UdpMedium::bind("127.0.0.1:0".parse().unwrap(), UdpOptions::default()).unwrap();
        let held = a.local_ip();
        let e = UdpMedium::bind(held, UdpOptions::default())
            .err()
            .expect("a second medium on a held port must fail, never share it");
        assert!(matches!(e, UdpError::InUse { .. }), "{e:?}");
        assert!(e.to_string().contains("EADDRINUSE"), "{e}");
        // Nor can a plain socket join it.
        assert!(std::net::UdpSocket::bind(held).is_err());
        // Ephemeral ports never land on a held one.
        let more: Vec<UdpMedium> = (0..64)
            .map(|_| UdpMedium::bind("127.0.0.1:0".parse().unwrap(), UdpOptions::default()))
            .collect::<Result<_, _>>()
            .unwrap();
        let mut ports: Vec<u16> = more.iter().map(|m| m.local_ip().port()).collect();
        ports.push(held.port());
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 65, "every medium has a port of its own");
    }

    #[test]
    fn sending_to_a_closed_port_is_not_an_error() {
        let a = UdpMedium::bind("127.0.0.1:0".parse().unwrap(), UdpOptions::default()).unwrap();
        let closed = {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            s.local_addr().unwrap()
        };
        for _ in 0..3 {
            a.send(&[OutFrame {
                to: Addr::Ip(closed),
                bytes: b"nobody",
            }])
            .unwrap();
        }
    }

    #[test]
    fn a_connected_medium_takes_its_peers_datagrams_only() {
        let any = || UdpMedium::bind("127.0.0.1:0".parse().unwrap(), UdpOptions::default());
        let (own, peer, stranger) = (any().unwrap(), any().unwrap(), any().unwrap());
        own.connect(peer.local_addr()).unwrap();
        assert_eq!(
            own.connect(stranger.local_addr()).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists,
            "connected once"
        );
        stranger
            .send(&[OutFrame {
                to: own.local_addr(),
                bytes: b"from a stranger",
            }])
            .unwrap();
        peer.send(&[OutFrame {
            to: own.local_addr(),
            bytes: b"from the peer",
        }])
        .unwrap();
        // The stranger's datagram was sent first and never arrives.
        assert_eq!(collect(&own, 1), vec![b"from the peer".to_vec()]);
        // The source of what it takes is its peer's address.
        let mut b = RecvBatch::new(4, 2048);
        peer.send(&[OutFrame {
            to: own.local_addr(),
            bytes: b"again",
        }])
        .unwrap();
        let start = Instant::now();
        while b.is_empty() && start.elapsed() < Duration::from_secs(5) {
            own.wait(Some(Duration::from_millis(20))).unwrap();
            own.recv(&mut b).unwrap();
        }
        assert_eq!(b.frame(0), (peer.local_addr(), &b"again"[..]));
        // And it sends from its own port.
        own.send(&[OutFrame {
            to: peer.local_addr(),
            bytes: b"back",
        }])
        .unwrap();
        let mut b = RecvBatch::new(4, 2048);
        let start = Instant::now();
        while b.is_empty() && start.elapsed() < Duration::from_secs(5) {
            peer.wait(Some(Duration::from_millis(20))).unwrap();
            peer.recv(&mut b).unwrap();
        }
        assert_eq!(b.frame(0), (own.local_addr(), &b"back"[..]));
    }

    #[test]
    fn receive_offload_goes_on_for_a_stream_and_off_for_lone_frames() {
        let opts = UdpOptions {
            gro: false,
            gro_while_streaming: true,
            ..UdpOptions::default()
        };
        let (a, b) = pair("127.0.0.1", opts);
        let send = |data: &[Vec<u8>]| send_all_to(&a, &b, data);
        assert!(!b.gro_active());
        // A stream: runs of equal frames, sent segmented.
        for round in 0..4 {
            let mut sizes = vec![1000 + round; 40];
            sizes.push(77);
            let data = frames(&sizes);
            send(&data);
            assert_eq!(collect(&b, data.len()), data, "stream round {round}");
            assert!(b.gro_active(), "a stream switches receive offload on");
        }
        assert!(b.datagrams_received.load(Ordering::Relaxed) < 4 * 41);
        // Frames one at a time, each read alone, switch it off; reads keep
        // the control message until one finds the queue empty.
        let mut batch = RecvBatch::new(64, 65_536);
        for i in 0..LONE_READS as usize + 2 {
            let data = frames(&[100 + i]);
            send(&data);
            let start = Instant::now();
            while b.recv(&mut batch).unwrap() == 0 {
                assert!(start.elapsed() < Duration::from_secs(5), "lone frame {i}");
            }
            assert_eq!(
                batch.iter().map(|(_, f)| f.to_vec()).collect::<Vec<_>>(),
                data
            );
        }
        assert!(!b.gro_active(), "lone frames switch it off");
        assert!(b.coalesced.load(Ordering::Relaxed));
        assert_eq!(b.recv(&mut batch).unwrap(), 0);
        assert!(
            !b.coalesced.load(Ordering::Relaxed),
            "an empty queue ends it"
        );
        // A stream after that arrives whole again, offload back on.
        let data = frames(&[1400; 30]);
        send(&data);
        assert_eq!(collect(&b, data.len()), data);
        assert!(b.gro_active());
    }

    #[test]
    fn a_frame_fills_the_mtu_without_passing_the_fragment_bound() {
        let v4: IpAddr = "127.0.0.1".parse().unwrap();
        let v6: IpAddr = "::1".parse().unwrap();
        assert_eq!(unfragmented_payload(v4, 1500), Some(1472));
        assert_eq!(unfragmented_payload(v6, 1500), Some(1452));
        assert_eq!(unfragmented_payload(v4, 9000), Some(8968));
        assert_eq!(unfragmented_payload(v4, 65_536), Some(65_504));
        assert_eq!(unfragmented_payload(v6, 65_536), Some(65_488));
        assert_eq!(unfragmented_payload(v4, 20), None);
        assert_eq!(unfragmented_payload(v6, 40), None);
        let a = UdpMedium::bind("127.0.0.1:0".parse().unwrap(), UdpOptions::default()).unwrap();
        let lo_mtu = interface_mtu(v4).unwrap();
        assert_eq!(
            a.caps().max_frame,
            unfragmented_payload(v4, lo_mtu).unwrap().min(MAX_DATAGRAM)
        );
    }

    #[test]
    fn loopback_frames_are_large() {
        let a = UdpMedium::bind("127.0.0.1:0".parse().unwrap(), UdpOptions::default()).unwrap();
        assert!(a.caps().max_frame > 9000, "{}", a.caps().max_frame);
    }
}
