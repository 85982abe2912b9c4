//! One UDP device address shared by the processes of a user on a host, as
//! VIA's host device is: the first process to bind the address owns it and
//! listens on a local (Unix, abstract namespace) socket named after it; a
//! later process of the same user, finding the address bound, joins
//! there, tells the owner what it waits on, and is handed the connection
//! requests for those. This module moves those messages and checks who
//! is at the other end; which request goes where is the protocol's.
//!
//! The local socket is a sequenced-packet socket, so every message keeps
//! its bounds. Its name lives in the network namespace, as the address
//! does. Each end checks the other's user id with `SO_PEERCRED`: a process
//! of another user never shares the address.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Largest message: a request frame (header, attributes, discriminator,
/// private data: well under 1 KiB) with its source address.
pub const MAX_MESSAGE: usize = 2048;

/// What a member waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Interest {
    /// Client requests naming a discriminator.
    Listen,
    /// Peer-to-peer requests naming a discriminator.
    Peer,
}

/// What the owner heard from its members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// Member `member` waits on `discriminator`.
    Waits {
        member: u32,
        interest: Interest,
        discriminator: Vec<u8>,
    },
    /// Member `member` waits on `discriminator` no more.
    Withdraws {
        member: u32,
        interest: Interest,
        discriminator: Vec<u8>,
    },
    /// Member `member` has closed the device (or exited).
    Gone { member: u32 },
}

/// Sharing a device address failed.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    /// The port is bound by a socket that is no uvia device (or by a
    /// device of a uvia that cannot share it): its traffic is not ours.
    #[error(
        "{addr} is held by another program (no uvia device listens for it on this host); \
         choose another port"
    )]
    Foreign { addr: SocketAddr },
    /// The device is another user's: its traffic is not shared.
    #[error("{addr} is opened by a process of user {uid}; a device is shared only by one user's processes")]
    OtherUser { addr: SocketAddr, uid: u32 },
    /// The device's owner would not take this process in.
    #[error("{addr}: the process holding the device refused to share it")]
    Refused { addr: SocketAddr },
    #[error("sharing {addr}: {source}")]
    Io { addr: SocketAddr, source: io::Error },
}

/// The local socket's name for device address `addr`, in the abstract
/// namespace (a leading zero byte: no file, gone with its last socket).
fn name_of(addr: SocketAddr) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain data; zero is a valid value.
    let mut un: libc::sockaddr_un = unsafe { zeroed() };
    un.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = format!("uvia-device/udp/{addr}");
    // Byte 0 stays 0: the abstract namespace. The name is short (an
    // address and a prefix), far below the 107 bytes there are.
    for (i, b) in name.bytes().take(un.sun_path.len() - 1).enumerate() {
        un.sun_path[i + 1] = b as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + 1 + name.len().min(un.sun_path.len() - 1);
    (un, len as libc::socklen_t)
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the result is checked.
    let raw = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The user id of the process at the other end of `fd`.
fn peer_uid(fd: RawFd) -> io::Result<u32> {
    // SAFETY: ucred is plain data.
    let mut cred: libc::ucred = unsafe { zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` has room for the option's value; `len` says so.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

fn my_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// Longest a member waits for room in the owner's queue: an owner that
/// takes nothing in for this long is stopped or stuck, and the member's
/// call returns rather than hang with it.
const SEND_PATIENCE: Duration = Duration::from_secs(1);

/// Sends one message; `Ok(false)` if the peer's queue is full (after
/// [`SEND_PATIENCE`] if `wait`).
fn send(fd: RawFd, bytes: &[u8], wait: bool) -> io::Result<bool> {
    let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
    let start = Instant::now();
    loop {
        // SAFETY: `bytes` is a live slice.
        let r = unsafe {
            libc::send(
                fd,
                bytes.as_ptr() as *const libc::c_void,
                bytes.len(),
                flags,
            )
        };
        if r >= 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock if wait && start.elapsed() < SEND_PATIENCE => {
                crate::wait_writable(fd, Some(Duration::from_millis(10)))?;
                continue;
            }
            io::ErrorKind::WouldBlock => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// Receives one message without waiting: `Ok(Some(n))`, `Ok(None)` if
/// there is none, or an error of kind `UnexpectedEof` once the peer has
/// closed.
fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        // SAFETY: `buf` is a live, writable slice.
        let r = unsafe {
            libc::recv(
                fd,
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if r > 0 {
            return Ok(Some(r as usize));
        }
        if r == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(None),
            // A connection never taken in, when its listener closed.
            io::ErrorKind::ConnectionReset => return Err(io::ErrorKind::UnexpectedEof.into()),
            _ => return Err(e),
        }
    }
}

const WAITS: u8 = 1;
const WITHDRAWS: u8 = 2;
const FRAME: u8 = 3;
/// Bytes of a source address in a forwarded frame: family, 16 address
/// bytes, port.
const ADDR_LEN: usize = 1 + 16 + 2;

struct Member {
    id: u32,
    fd: OwnedFd,
}

/// The owner's end: takes members in, hears what they wait on, hands them
/// requests.
pub struct DeviceOwner {
    addr: SocketAddr,
    listener: OwnedFd,
    members: Vec<Member>,
    next_id: u32,
    buf: Box<[u8; MAX_MESSAGE]>,
}

impl DeviceOwner {
    /// Starts taking in members for device address `addr` (which the
    /// caller has bound).
    pub fn listen(addr: SocketAddr) -> Result<DeviceOwner, ShareError> {
        let io = |source| ShareError::Io { addr, source };
        let fd = seqpacket().map_err(io)?;
        let (un, len) = name_of(addr);
        // The caller holds the address, so a name still bound is a
        // closing owner's, gone in a moment: try again for a while.
        let start = Instant::now();
        loop {
            // SAFETY: `un` is a valid sockaddr_un of `len` bytes.
            let r = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    &un as *const _ as *const libc::sockaddr,
                    len,
                )
            };
            if r == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EADDRINUSE) || start.elapsed() > JOIN_PATIENCE {
                return Err(io(e));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // SAFETY: a bound socket.
        if unsafe { libc::listen(fd.as_raw_fd(), 64) } != 0 {
            return Err(io(io::Error::last_os_error()));
        }
        Ok(DeviceOwner {
            addr,
            listener: fd,
            members: Vec::new(),
            next_id: 1,
            buf: Box::new([0; MAX_MESSAGE]),
        })
    }

    /// The descriptors that become readable when there is something to
    /// take in ([`poll`](Self::poll)): the listener's and each member's.
    pub fn fds(&self) -> Vec<RawFd> {
        let mut v = vec![self.listener.as_raw_fd()];
        v.extend(self.members.iter().map(|m| m.fd.as_raw_fd()));
        v
    }

    /// How many processes share the device with the owner.
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// Takes in new members and hears what the members say, without
    /// waiting; calls `on` for each notice.
    pub fn poll(&mut self, on: &mut dyn FnMut(Notice)) {
        loop {
            // SAFETY: accept on our listener; no address wanted.
            let raw = unsafe {
                libc::accept4(
                    self.listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                )
            };
            if raw < 0 {
                break;
            }
            // SAFETY: a fresh descriptor we own.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            // Another user's process is not taken in (closing tells it).
            if peer_uid(fd.as_raw_fd()).ok() != Some(my_uid()) {
                continue;
            }
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1).max(1);
            self.members.push(Member { id, fd });
        }
        let mut i = 0;
        while i < self.members.len() {
            let m = &self.members[i];
            match recv(m.fd.as_raw_fd(), &mut self.buf[..]) {
                Ok(Some(n)) => {
                    if let Some(notice) = parse_notice(m.id, &self.buf[..n]) {
                        on(notice);
                    }
                }
                Ok(None) => i += 1,
                Err(_) => {
                    let gone = self.members.swap_remove(i);
                    on(Notice::Gone { member: gone.id });
                }
            }
        }
    }

    /// Hands member `member` a frame that came from `from`. False if the
    /// member is gone or its queue is full (the sender repeats requests).
    pub fn forward(&mut self, member: u32, from: SocketAddr, frame: &[u8]) -> bool {
        let Some(m) = self.members.iter().find(|m| m.id == member) else {
            return false;
        };
        let n = 1 + ADDR_LEN + frame.len();
        if n > MAX_MESSAGE {
            return false;
        }
        let b = &mut self.buf[..n];
        b[0] = FRAME;
        put_addr(&mut b[1..1 + ADDR_LEN], from);
        b[1 + ADDR_LEN..].copy_from_slice(frame);
        send(m.fd.as_raw_fd(), b, false).unwrap_or(false)
    }

    /// The device address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

fn parse_notice(member: u32, b: &[u8]) -> Option<Notice> {
    let (&op, rest) = b.split_first()?;
    let (&kind, d) = rest.split_first()?;
    let interest = match kind {
        0 => Interest::Listen,
        1 => Interest::Peer,
        _ => return None,
    };
    let discriminator = d.to_vec();
    match op {
        WAITS => Some(Notice::Waits {
            member,
            interest,
            discriminator,
        }),
        WITHDRAWS => Some(Notice::Withdraws {
            member,
            interest,
            discriminator,
        }),
        _ => None,
    }
}

fn put_addr(b: &mut [u8], a: SocketAddr) {
    b.fill(0);
    match a {
        SocketAddr::V4(v4) => {
            b[0] = 4;
            b[1..5].copy_from_slice(&v4.ip().octets());
        }
        SocketAddr::V6(v6) => {
            b[0] = 6;
            b[1..17].copy_from_slice(&v6.ip().octets());
        }
    }
    b[17..19].copy_from_slice(&a.port().to_be_bytes());
}

fn get_addr(b: &[u8]) -> Option<SocketAddr> {
    let port = u16::from_be_bytes([b[17], b[18]]);
    match b[0] {
        4 => Some(SocketAddr::from(([b[1], b[2], b[3], b[4]], port))),
        6 => {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[1..17]);
            Some(SocketAddr::from((ip, port)))
        }
        _ => None,
    }
}

/// How long a process that found the address bound looks for its owner's
/// local socket: an owner binds the address a moment before it listens.
const JOIN_PATIENCE: Duration = Duration::from_millis(300);

/// A member's end: tells the owner what it waits on, takes the requests
/// handed to it.
pub struct DeviceMember {
    addr: SocketAddr,
    fd: OwnedFd,
}

impl DeviceMember {
    /// Joins the owner of device address `addr`, which this process found
    /// bound.
    pub fn join(addr: SocketAddr) -> Result<DeviceMember, ShareError> {
        let (un, len) = name_of(addr);
        let start = Instant::now();
        let fd = loop {
            let fd = seqpacket().map_err(|source| ShareError::Io { addr, source })?;
            // SAFETY: `un` is a valid sockaddr_un of `len` bytes. A
            // non-blocking connect on a local socket completes at once or
            // fails (EAGAIN: the owner's backlog is full).
            let r = unsafe {
                libc::connect(
                    fd.as_raw_fd(),
                    &un as *const _ as *const libc::sockaddr,
                    len,
                )
            };
            if r == 0 {
                break fd;
            }
            let e = io::Error::last_os_error();
            let again = matches!(
                e.raw_os_error(),
                Some(libc::ECONNREFUSED | libc::ENOENT | libc::EAGAIN)
            );
            if !again {
                return Err(ShareError::Io { addr, source: e });
            }
            if start.elapsed() > JOIN_PATIENCE {
                return Err(ShareError::Foreign { addr });
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let uid = peer_uid(fd.as_raw_fd()).map_err(|source| ShareError::Io { addr, source })?;
        if uid != my_uid() {
            return Err(ShareError::OtherUser { addr, uid });
        }
        Ok(DeviceMember { addr, fd })
    }

    /// Tells the owner this process waits (`on`) or no longer waits on
    /// `discriminator`. Fails once the owner has gone.
    pub fn tell(&self, interest: Interest, discriminator: &[u8], on: bool) -> io::Result<()> {
        let mut b = Vec::with_capacity(2 + discriminator.len());
        b.push(if on { WAITS } else { WITHDRAWS });
        b.push(match interest {
            Interest::Listen => 0,
            Interest::Peer => 1,
        });
        b.extend_from_slice(discriminator);
        match send(self.fd.as_raw_fd(), &b, true)? {
            true => Ok(()),
            false => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the process holding {} takes in nothing", self.addr),
            )),
        }
    }

    /// A frame the owner handed over, without waiting: its source and its
    /// length in `buf` (which should hold [`MAX_MESSAGE`] bytes), from
    /// `buf[0]`. An error of kind `UnexpectedEof` once the owner has gone.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<(SocketAddr, usize)>> {
        loop {
            let Some(n) = recv(self.fd.as_raw_fd(), buf)? else {
                return Ok(None);
            };
            if n < 1 + ADDR_LEN || buf[0] != FRAME {
                continue;
            }
            let Some(from) = get_addr(&buf[1..1 + ADDR_LEN]) else {
                continue;
            };
            buf.copy_within(1 + ADDR_LEN..n, 0);
            return Ok(Some((from, n - 1 - ADDR_LEN)));
        }
    }

    /// Readable when the owner has handed something over (or gone).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The device address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_addr() -> SocketAddr {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("a port");
        s.local_addr().expect("its address")
    }

    fn settle(owner: &mut DeviceOwner, want: usize) -> Vec<Notice> {
        let mut got = Vec::new();
        let start = Instant::now();
        while got.len() < want && start.elapsed() < Duration::from_secs(5) {
            owner.poll(&mut |n| got.push(n));
            std::thread::sleep(Duration::from_millis(1));
        }
        got
    }

    #[test]
    fn a_member_tells_what_it_waits_on_and_is_handed_frames() {
        let addr = free_addr();
        let mut owner = DeviceOwner::listen(addr).expect("listen");
        let member = DeviceMember::join(addr).expect("join");
        member.tell(Interest::Listen, b"srv", true).expect("tell");
        member.tell(Interest::Peer, b"p", false).expect("tell");
        let got = settle(&mut owner, 2);
        assert_eq!(
            got,
            vec![
                Notice::Waits {
                    member: 1,
                    interest: Interest::Listen,
                    discriminator: b"srv".to_vec()
                },
                Notice::Withdraws {
                    member: 1,
                    interest: Interest::Peer,
                    discriminator: b"p".to_vec()
                },
            ]
        );
        assert_eq!(owner.members(), 1);
        let from: SocketAddr = "[::1]:4000".parse().expect("an address");
        assert!(owner.forward(1, from, b"frame"));
        assert!(!owner.forward(2, from, b"frame"), "no such member");
        let mut buf = [0u8; MAX_MESSAGE];
        let start = Instant::now();
        let got = loop {
            if let Some(x) = member.recv(&mut buf).expect("recv") {
                break x;
            }
            assert!(start.elapsed() < Duration::from_secs(5));
        };
        assert_eq!(got, (from, 5));
        assert_eq!(&buf[..5], b"frame");
        drop(member);
        assert_eq!(settle(&mut owner, 1), vec![Notice::Gone { member: 1 }]);
        assert_eq!(owner.members(), 0);
    }

    #[test]
    fn the_owner_gone_is_seen_by_its_members() {
        let addr = free_addr();
        let mut owner = DeviceOwner::listen(addr).expect("listen");
        let member = DeviceMember::join(addr).expect("join");
        let member2 = DeviceMember::join(addr).expect("join");
        owner.poll(&mut |_| {});
        drop(owner);
        let mut buf = [0u8; MAX_MESSAGE];
        let e = member2.recv(&mut buf).expect_err("the owner is gone");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let mut buf = [0u8; MAX_MESSAGE];
        let e = member.recv(&mut buf).expect_err("the owner is gone");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn nobody_listening_for_a_bound_address_means_another_program_holds_it() {
        let addr = free_addr();
        let e = DeviceMember::join(addr).err().expect("no owner");
        assert!(matches!(e, ShareError::Foreign { .. }), "{e:?}");
        assert!(e.to_string().contains("held by another program"), "{e}");
    }
}
