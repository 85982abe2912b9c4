//! A CQ's ready list for network VIs: their sockets in one epoll set.
//!
//! Without it a poll of a CQ asks every attached VI's socket for frames, a
//! system call each: with a thousand VIs a poll costs a thousand calls
//! whether one of them or none has anything. A NIC feeds its completion
//! queue from the VIs that moved; this is the nearest a socket-based medium
//! comes to that: one `epoll_wait` names the sockets that have frames, and
//! only their VIs are driven. The set is kept in step with the members'
//! sockets (a VI's socket changes when it connects) when a member says its
//! socket changed or the members change.
//!
//! epoll is used directly through `libc` (as `poll` is elsewhere in the
//! crate): the set holds plain descriptors owned by the VIs, with no event
//! loop or registry of its own to fit.

use crate::vi::{Vi, ViShared};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Weak};

/// Events taken per look.
const BATCH: usize = 64;

pub(crate) struct ReadySet {
    ep: OwnedFd,
    /// Each socket in the set and the members that wake on it: a VI that
    /// has not connected yet wakes on its Nic's medium, which several share.
    by_fd: HashMap<RawFd, Vec<Weak<ViShared>>>,
    /// Members with no socket yet (not connected): driven on every look,
    /// as without the set (their progress finds nothing to do at once).
    loose: Vec<Weak<ViShared>>,
    /// Looks so far (`epoll_wait` calls), for tests.
    looks: u64,
}

impl ReadySet {
    /// An empty set, or `None` where epoll cannot be had.
    pub(crate) fn new() -> Option<ReadySet> {
        // SAFETY: plain epoll creation.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        Some(ReadySet {
            // SAFETY: a fresh descriptor we own.
            ep: unsafe { OwnedFd::from_raw_fd(fd) },
            by_fd: HashMap::new(),
            loose: Vec::new(),
            looks: 0,
        })
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.ep.as_raw_fd()
    }

    /// Puts the members' sockets in the set and takes out those no member
    /// uses any more. False if the set refused a socket: the caller then
    /// walks every member instead.
    pub(crate) fn sync(&mut self, members: &[Arc<ViShared>]) -> bool {
        let mut by_fd: HashMap<RawFd, Vec<Weak<ViShared>>> = HashMap::with_capacity(members.len());
        let mut loose = Vec::new();
        for vi in members {
            match Vi::wake_fd(vi) {
                Some(fd) => by_fd.entry(fd).or_default().push(Arc::downgrade(vi)),
                None => loose.push(Arc::downgrade(vi)),
            }
        }
        for fd in self.by_fd.keys() {
            if !by_fd.contains_key(fd) {
                // A closed socket has left the set by itself: an error
                // here only says so.
                self.ctl(libc::EPOLL_CTL_DEL, *fd);
            }
        }
        for (fd, vis) in &by_fd {
            // Added again where the members behind a number changed: the
            // number may have been closed and given to a new socket, which
            // is not in the set yet (an add of one that is fails harmlessly
            // with EEXIST).
            let same = self.by_fd.get(fd).is_some_and(|old| {
                old.len() == vis.len() && old.iter().zip(vis).all(|(a, b)| a.ptr_eq(b))
            });
            if !same && !self.ctl(libc::EPOLL_CTL_ADD, *fd) && last_errno() != libc::EEXIST {
                return false;
            }
        }
        self.by_fd = by_fd;
        self.loose = loose;
        true
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd) -> bool {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: a valid epoll descriptor and event struct.
        unsafe { libc::epoll_ctl(self.ep.as_raw_fd(), op, fd, &mut ev) == 0 }
    }

    /// The members whose sockets have frames now (without waiting), and
    /// those with no socket.
    pub(crate) fn ready(&mut self) -> Vec<Arc<ViShared>> {
        self.looks += 1;
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; BATCH];
        // SAFETY: `evs` has room for BATCH events.
        let n = unsafe { libc::epoll_wait(self.ep.as_raw_fd(), evs.as_mut_ptr(), BATCH as i32, 0) };
        let mut out: Vec<Arc<ViShared>> = self.loose.iter().filter_map(Weak::upgrade).collect();
        for ev in evs.iter().take(n.max(0) as usize) {
            let fd = ev.u64 as RawFd;
            if let Some(vis) = self.by_fd.get(&fd) {
                out.extend(vis.iter().filter_map(Weak::upgrade));
            }
        }
        out
    }
}

impl ReadySet {
    /// Looks at the set so far.
    #[cfg(test)]
    pub(crate) fn looks(&self) -> u64 {
        self.looks
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
