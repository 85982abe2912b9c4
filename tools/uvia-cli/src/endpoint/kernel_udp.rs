//! Kernel UDP on 127.0.0.1 (or a test host's address).
//!
//! Every datagram starts with a 32-byte header: kind, fragment offset, message
//! total, and the sender's cumulative count of messages and bytes received
//! (a piggy-backed acknowledgement). Messages larger than [`FRAG`] bytes are
//! split into datagrams of at most [`FRAG`] payload bytes and reassembled in
//! place (sendmsg/recvmsg scatter-gather: no extra copy). Flow control keeps
//! a bandwidth sender from overflowing the receiver's socket buffer: at most
//! `window` messages and a byte budget (a quarter of the receive buffer) may be
//! unacknowledged; the receiver sends a small credit datagram whenever it has
//! taken half of either since it last told the sender. In ping-pong every reply
//! carries the acknowledgement, so no credit datagram is ever sent.
//!
//! A lost or reordered datagram is reported as an error, and a receive that
//! waits longer than [`IO_TIMEOUT`](crate::sock::IO_TIMEOUT) fails rather than hangs.

use crate::endpoint::{Endpoint, EndpointConfig, Listener, Mode};
use crate::sock::{self as sys, SpinDeadline, IO_TIMEOUT};
use anyhow::{anyhow, bail, Context, Result};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

/// Largest payload in one datagram.
pub const FRAG: usize = 60000;
const HDR: usize = 32;
const KIND_DATA: u32 = 1;
const KIND_CREDIT: u32 = 2;
const KIND_HELLO: u32 = 3;
const SOCK_BUF: i32 = 4 << 20;
/// The largest message a run takes: one in flight fills the receiver's
/// socket buffer, and a larger one is lost in part.
pub const MAX_MESSAGE: usize = SOCK_BUF as usize;

#[derive(Clone, Copy, Default, Debug)]
#[repr(C)]
struct Hdr {
    kind: u32,
    offset: u32,
    total: u32,
    _pad: u32,
    acked_msgs: u64,
    acked_bytes: u64,
}

const _: () = assert!(std::mem::size_of::<Hdr>() == HDR);

pub struct UdpEndpoint {
    /// Owns the descriptor `fd`.
    _sock: UdpSocket,
    fd: RawFd,
    mode: Mode,
    window: u64,
    byte_budget: u64,
    send: Vec<u8>,
    recv: Vec<u8>,
    scratch: Vec<u8>,
    last_len: usize,
    /// Messages and bytes sent, and how many of them the peer has acknowledged.
    sent_msgs: u64,
    sent_bytes: u64,
    peer_msgs: u64,
    peer_bytes: u64,
    /// Messages and bytes received, and the counts last reported to the peer.
    got_msgs: u64,
    got_bytes: u64,
    told_msgs: u64,
    told_bytes: u64,
}

fn bind_socket(ip: std::net::IpAddr) -> Result<UdpSocket> {
    let sock = UdpSocket::bind((ip, 0)).with_context(|| format!("binding a UDP socket on {ip}"))?;
    let fd = sock.as_raw_fd();
    sys::set_buf(fd, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, SOCK_BUF);
    sys::set_buf(fd, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, SOCK_BUF);
    sys::set_rcv_timeout(fd, IO_TIMEOUT)?;
    Ok(sock)
}

impl UdpEndpoint {
    fn new(sock: UdpSocket, cfg: &EndpointConfig) -> UdpEndpoint {
        let fd = sock.as_raw_fd();
        // The kernel reports the doubled value; keep a quarter of it unacknowledged at most.
        let rcvbuf = sys::get_int_opt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)
            .unwrap_or(212992)
            .max(65536) as u64;
        let max = cfg.max_size.max(8);
        let mut ep = UdpEndpoint {
            _sock: sock,
            fd,
            mode: cfg.mode,
            window: cfg.window.max(1) as u64,
            byte_budget: (rcvbuf / 4).max(FRAG as u64 * 2),
            send: vec![0x5a; max],
            recv: vec![0; max],
            scratch: vec![0; 65536],
            last_len: 0,
            sent_msgs: 0,
            sent_bytes: 0,
            peer_msgs: 0,
            peer_bytes: 0,
            got_msgs: 0,
            got_bytes: 0,
            told_msgs: 0,
            told_bytes: 0,
        };
        ep.recv.fill(0);
        ep
    }

    fn hdr(&mut self, kind: u32, offset: usize, total: usize) -> Hdr {
        self.told_msgs = self.got_msgs;
        self.told_bytes = self.got_bytes;
        Hdr {
            kind,
            offset: offset as u32,
            total: total as u32,
            _pad: 0,
            acked_msgs: self.got_msgs,
            acked_bytes: self.got_bytes,
        }
    }

    fn send_dgram(&self, hdr: &Hdr, payload: &[u8]) -> Result<()> {
        let iov = [
            libc::iovec {
                iov_base: hdr as *const Hdr as *mut libc::c_void,
                iov_len: HDR,
            },
            libc::iovec {
                iov_base: payload.as_ptr() as *mut libc::c_void,
                iov_len: payload.len(),
            },
        ];
        // SAFETY: msghdr points at two live iovecs.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = if payload.is_empty() { 1 } else { 2 };
        loop {
            uvia_trace::mark!(SyscallEnter);
            // SAFETY: fd is our socket; msg is valid for the call.
            let n = unsafe { libc::sendmsg(self.fd, &msg, 0) };
            uvia_trace::mark!(SyscallExit);
            if n >= 0 {
                if n as usize != HDR + payload.len() {
                    bail!(
                        "UDP send was cut short ({n} of {} bytes)",
                        HDR + payload.len()
                    );
                }
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ENOBUFS) => continue,
                Some(libc::ECONNREFUSED) => {
                    bail!("UDP send: the peer is gone (connection refused)")
                }
                _ => return Err(anyhow!("UDP send: {e}")),
            }
        }
    }

    /// Receives one datagram: header into `hdr`, payload into the receive
    /// buffer at `offset` (or the scratch buffer when `offset` is None).
    /// Returns the payload length.
    fn recv_dgram(&mut self, hdr: &mut Hdr, offset: Option<usize>) -> Result<usize> {
        let (ptr, len) = match offset {
            Some(off) => {
                let end = (off + FRAG).min(self.recv.len());
                (self.recv[off..end].as_mut_ptr(), end - off)
            }
            None => (self.scratch.as_mut_ptr(), self.scratch.len()),
        };
        let iov = [
            libc::iovec {
                iov_base: hdr as *mut Hdr as *mut libc::c_void,
                iov_len: HDR,
            },
            libc::iovec {
                iov_base: ptr as *mut libc::c_void,
                iov_len: len,
            },
        ];
        // SAFETY: zeroed msghdr, then pointed at two live iovecs.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = 2;
        let flags = if self.mode == Mode::Polling {
            libc::MSG_DONTWAIT
        } else {
            0
        };
        let mut spin = SpinDeadline::new();
        loop {
            // SAFETY: fd is our socket; the iovecs point into live buffers.
            let n = unsafe { libc::recvmsg(self.fd, &mut msg, flags) };
            if n >= 0 {
                uvia_trace::mark!(RxFound);
                if msg.msg_flags & libc::MSG_TRUNC != 0 {
                    bail!("UDP datagram larger than expected (truncated)");
                }
                if (n as usize) < HDR {
                    bail!("UDP datagram of {n} bytes is shorter than the header");
                }
                return Ok(n as usize - HDR);
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) if self.mode == Mode::Polling => {
                    if spin.expired() {
                        bail!(
                            "UDP receive timed out after {:?}: peer gone or datagram lost",
                            IO_TIMEOUT
                        );
                    }
                }
                Some(libc::EAGAIN) => bail!(
                    "UDP receive timed out after {:?}: peer gone or datagram lost",
                    IO_TIMEOUT
                ),
                Some(libc::EINTR) => {}
                Some(libc::ECONNREFUSED) => {
                    bail!("UDP receive: the peer is gone (connection refused)")
                }
                _ => return Err(anyhow!("UDP receive: {e}")),
            }
        }
    }

    fn note_ack(&mut self, h: &Hdr) {
        if h.acked_msgs > self.peer_msgs {
            self.peer_msgs = h.acked_msgs;
            self.peer_bytes = h.acked_bytes;
        }
    }

    /// Waits until a message of `len` bytes may be sent without overflowing the peer.
    fn wait_credit(&mut self, len: usize) -> Result<()> {
        loop {
            let msgs = self.sent_msgs - self.peer_msgs;
            let bytes = self.sent_bytes - self.peer_bytes;
            if msgs == 0 || (msgs < self.window && bytes + len as u64 <= self.byte_budget) {
                return Ok(());
            }
            let mut h = Hdr::default();
            self.recv_dgram(&mut h, None)?;
            self.note_ack(&h);
            if h.kind != KIND_CREDIT && h.kind != KIND_HELLO {
                bail!("UDP: the peer sent data while this side waited for flow-control credit (both sides sending bulk data is not supported)");
            }
        }
    }
}

impl Endpoint for UdpEndpoint {
    fn send_buf(&mut self) -> &mut [u8] {
        &mut self.send
    }

    fn send(&mut self, len: usize) -> Result<()> {
        if len > self.send.len() {
            bail!(
                "message of {len} bytes is larger than the endpoint's {} byte buffer",
                self.send.len()
            );
        }
        uvia_trace::mark!(AppSend);
        self.wait_credit(len)?;
        let mut off = 0;
        loop {
            let end = (off + FRAG).min(len);
            let h = self.hdr(KIND_DATA, off, len);
            self.send_dgram(&h, &self.send[off..end])?;
            off = end;
            if off >= len {
                break;
            }
        }
        self.sent_msgs += 1;
        self.sent_bytes += len as u64;
        uvia_trace::mark!(AppSendReturned);
        Ok(())
    }

    fn recv(&mut self) -> Result<usize> {
        let mut off = 0usize;
        let mut total: Option<usize> = None;
        loop {
            let mut h = Hdr::default();
            let n = self.recv_dgram(&mut h, Some(off.min(self.recv.len())))?;
            self.note_ack(&h);
            match h.kind {
                // A repeated hello from the connection set-up is harmless.
                KIND_CREDIT | KIND_HELLO => continue,
                KIND_DATA => {}
                k => bail!("UDP: unexpected datagram kind {k}"),
            }
            let t = h.total as usize;
            if t > self.recv.len() {
                bail!(
                    "UDP: message of {t} bytes is larger than the {} byte receive buffer",
                    self.recv.len()
                );
            }
            if h.offset as usize != off || total.is_some_and(|x| x != t) {
                bail!("UDP: a datagram was lost or reordered (expected offset {off}, got {} of a {t} byte message)", h.offset);
            }
            total = Some(t);
            off += n;
            if off >= t {
                break;
            }
        }
        let t = total.unwrap_or(0);
        self.last_len = t;
        self.got_msgs += 1;
        self.got_bytes += t as u64;
        let half_w = (self.window / 2).max(1);
        if self.got_msgs - self.told_msgs >= half_w
            || self.got_bytes - self.told_bytes >= self.byte_budget / 2
        {
            let h = self.hdr(KIND_CREDIT, 0, 0);
            self.send_dgram(&h, &[])?;
        }
        uvia_trace::mark!(AppReceived);
        Ok(t)
    }

    fn recv_buf(&self) -> &[u8] {
        &self.recv[..self.last_len]
    }

    fn flush(&mut self) -> Result<()> {
        // A datagram has left once sendmsg returns.
        Ok(())
    }
}

struct UdpListener {
    sock: UdpSocket,
    cfg: EndpointConfig,
}

pub fn listen(cfg: &EndpointConfig) -> Result<Box<dyn Listener>> {
    Ok(Box::new(UdpListener {
        sock: bind_socket(cfg.ip)?,
        cfg: cfg.clone(),
    }))
}

impl Listener for UdpListener {
    fn info(&self) -> String {
        self.sock
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    fn accept(self: Box<Self>) -> Result<Box<dyn Endpoint>> {
        let mut buf = [0u8; 64];
        let (n, from) = self
            .sock
            .recv_from(&mut buf)
            .context("waiting for the UDP client's hello")?;
        if n < 4 || u32::from_ne_bytes(buf[..4].try_into().unwrap()) != KIND_HELLO {
            bail!("UDP: expected a hello datagram from the client");
        }
        self.sock
            .connect(from)
            .context("connecting the UDP socket to the client")?;
        self.sock
            .send(&KIND_HELLO.to_ne_bytes())
            .context("answering the UDP client's hello")?;
        Ok(Box::new(UdpEndpoint::new(self.sock, &self.cfg)))
    }
}

pub fn connect(cfg: &EndpointConfig, info: &str) -> Result<Box<dyn Endpoint>> {
    let addr: SocketAddr = info
        .trim()
        .parse()
        .with_context(|| format!("bad UDP listener info {info:?} (expected ip:port)"))?;
    let sock = bind_socket(cfg.ip)?;
    sock.connect(addr).context("connecting the UDP socket")?;
    let start = Instant::now();
    sys::set_rcv_timeout(sock.as_raw_fd(), std::time::Duration::from_millis(200))?;
    loop {
        sock.send(&KIND_HELLO.to_ne_bytes())
            .context("sending the UDP hello")?;
        let mut buf = [0u8; 64];
        match sock.recv(&mut buf) {
            Ok(n) if n >= 4 && u32::from_ne_bytes(buf[..4].try_into().unwrap()) == KIND_HELLO => {
                break
            }
            Ok(_) => bail!("UDP: unexpected answer to the hello"),
            Err(e)
                if start.elapsed() < IO_TIMEOUT
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::ConnectionRefused
                    ) =>
            {
                continue
            }
            Err(e) => return Err(e).context("waiting for the UDP server's answer"),
        }
    }
    sys::set_rcv_timeout(sock.as_raw_fd(), IO_TIMEOUT)?;
    Ok(Box::new(UdpEndpoint::new(sock, cfg)))
}
