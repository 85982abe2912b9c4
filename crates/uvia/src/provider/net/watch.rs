//! The sockets of a network Nic's VIs in one epoll set, for the Nic's
//! sweeps ([`NetNic::sweep`](super::NetNic::sweep)): one `epoll_wait` names
//! the connections whose sockets have frames waiting, and a sweep reads
//! those with the ones whose timers are due.
//!
//! A VI with no timers (idle, its peer's Nic kept alive by another
//! connection, [`peers`](super::peers)) is otherwise looked at only when
//! its program polls it: a ping or a message to a VI nobody polls would
//! wait until the peer gave up. Asking each socket would cost a system
//! call per VI, most finding nothing.
//!
//! epoll is used directly through `libc`, as in the CQ's ready list
//! (`crate::ready`): plain descriptors owned by the VIs, nothing else to
//! fit. A socket leaves the set by itself when it is closed, and a new one
//! given the same number is added when its VI takes it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Events taken per `epoll_wait`.
const BATCH: usize = 64;

pub(super) struct Watch {
    /// `None` where epoll cannot be had: the walk then reads only the VIs
    /// whose timers are due, as a program's own polls do.
    ep: Option<OwnedFd>,
}

impl Watch {
    pub(super) fn new() -> Watch {
        // SAFETY: plain epoll creation.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        Watch {
            // SAFETY: a fresh descriptor we own.
            ep: (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) }),
        }
    }

    /// Watches `fd`, connection `id`'s own socket, for frames. A socket
    /// watched already stays so.
    pub(super) fn add(&self, fd: RawFd, id: u32) {
        let Some(ep) = &self.ep else {
            return;
        };
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: u64::from(id),
        };
        // SAFETY: a valid epoll descriptor and event struct. EEXIST (the
        // socket is watched already) is the only failure that can follow
        // from a live descriptor, and leaves it watched.
        unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
    }

    /// Stops watching `fd`.
    pub(super) fn remove(&self, fd: RawFd) {
        let Some(ep) = &self.ep else {
            return;
        };
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: a valid epoll descriptor and event struct; a descriptor
        // not watched (ENOENT) stays so.
        unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
    }

    /// The connections whose sockets have frames waiting now, appended to
    /// `out`, at most `most` of them (each call of a level-triggered set
    /// names the next ones).
    pub(super) fn ready(&self, out: &mut Vec<u32>, most: usize) {
        let Some(ep) = &self.ep else {
            return;
        };
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; BATCH];
        let mut taken = 0;
        while taken < most {
            // SAFETY: `evs` has room for BATCH events.
            let n = unsafe { libc::epoll_wait(ep.as_raw_fd(), evs.as_mut_ptr(), BATCH as i32, 0) };
            let n = n.max(0) as usize;
            out.extend(evs.iter().take(n).map(|e| e.u64 as u32));
            taken += n;
            if n < BATCH {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    #[test]
    fn names_the_connections_whose_sockets_have_frames() {
        let w = Watch::new();
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        w.add(a.as_raw_fd(), 7);
        w.add(b.as_raw_fd(), 9);
        w.add(b.as_raw_fd(), 9);
        let ready = || {
            let mut v = Vec::new();
            w.ready(&mut v, 100);
            v
        };
        assert!(ready().is_empty(), "nothing sent yet");
        a.send_to(b"x", b.local_addr().unwrap()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let r = loop {
            let r = ready();
            if !r.is_empty() || std::time::Instant::now() > deadline {
                break r;
            }
        };
        assert_eq!(r, vec![9]);
        let mut buf = [0u8; 8];
        b.recv(&mut buf).unwrap();
        assert!(ready().is_empty(), "read");
        w.remove(b.as_raw_fd());
        a.send_to(b"y", b.local_addr().unwrap()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(ready().is_empty(), "no longer watched");
    }
}
