//! Completion queues: one place to learn that any of many VI queues has a
//! completed descriptor.
//!
//! A CQ holds notices (VI, queue), not descriptors: after [`Cq::done`] names a
//! queue, the caller takes the descriptor with that VI's done call, as in
//! VIPL. Polling a CQ drives progress on every VI attached to it. For event
//! loops the CQ has an eventfd: [`Cq::arm`] asks for a wake-up, the fd becomes
//! readable when a notice may be waiting.
//!
//! A direct CQ ([`Nic::create_direct_cq`]) keeps no notices: a poll looks
//! at the head of each attached queue in turn, starting one VI further
//! each time, and [`Cq::take_raw`] takes the completed descriptor in the
//! same call, through the VI's own done path (on shm, the few-instruction
//! receive). Completions of different VIs then come in no set order; each
//! queue's stay in order.

use crate::desc::Descriptor;
use crate::error::{CqError, WaitError};
use crate::lock::{Guard, SpinLock};
use crate::nic::{Nic, NicShared};
use crate::vi::{Queue, Vi, ViShared};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

struct Notices {
    q: VecDeque<(Weak<ViShared>, Queue)>,
    cap: usize,
    overflowed: bool,
}

pub(crate) struct CqShared {
    pub nic: Arc<NicShared>,
    pub efd: OwnedFd,
    notices: Mutex<Notices>,
    /// Notices waiting, plus one once overflowed: what a poll reads,
    /// without the lock, to learn that there is nothing to pop. Written
    /// under the notices' lock, sequentially consistent against
    /// `waiters` (a waiter adds itself, then looks; a notifier publishes,
    /// then looks for waiters).
    queued: AtomicUsize,
    /// The attached VIs. Walked on every empty poll, changed only when a
    /// VI attaches: a spin lock, released by a plain store.
    members: SpinLock<Vec<Weak<ViShared>>>,
    waiters: AtomicU32,
    /// Keeps no notices: polls walk the members' queues.
    direct: bool,
    /// Where a direct CQ's next walk starts.
    next: AtomicUsize,
}

/// A completion notice: `queue` of `vi` has a completed descriptor at its head.
#[derive(Debug, Clone)]
pub struct CqCompletion {
    pub vi: Vi,
    pub queue: Queue,
}

/// A completion queue. Clones name the same CQ.
#[derive(Clone)]
pub struct Cq {
    pub(crate) s: Arc<CqShared>,
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("entries", &self.s.lock_notices().cap)
            .finish()
    }
}

/// Spin this long in [`Cq::wait`] before sleeping.
const CQ_WAIT_SPIN: Duration = Duration::from_micros(20);

impl CqShared {
    fn lock_notices(&self) -> MutexGuard<'_, Notices> {
        self.notices.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_members(&self) -> Guard<'_, Vec<Weak<ViShared>>> {
        self.members.lock()
    }

    /// Mirrors the notices' count into `queued` (under their lock).
    fn publish(&self, n: &Notices) {
        self.queued
            .store(n.q.len() + n.overflowed as usize, Ordering::SeqCst);
    }

    pub(crate) fn attach(&self, vi: &Arc<ViShared>) {
        let mut m = self.lock_members();
        m.retain(|w| w.strong_count() > 0);
        if !m.iter().any(|w| w.as_ptr() == Arc::as_ptr(vi)) {
            m.push(Arc::downgrade(vi));
        }
    }

    /// Called by a VI (under its lock) when a descriptor of `q` completes.
    pub(crate) fn notify(&self, vi: &Arc<ViShared>, q: Queue) {
        if self.direct {
            if self.waiters.load(Ordering::SeqCst) > 0 {
                write_eventfd(self.efd.as_raw_fd());
            }
            return;
        }
        let mut n = self.lock_notices();
        if n.q.len() >= n.cap {
            n.overflowed = true;
        } else {
            n.q.push_back((Arc::downgrade(vi), q));
        }
        self.publish(&n);
        drop(n);
        if self.waiters.load(Ordering::Acquire) > 0 {
            write_eventfd(self.efd.as_raw_fd());
        }
    }

    fn members(&self) -> Vec<Arc<ViShared>> {
        self.lock_members()
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

/// Adds one to an eventfd's counter (a wake-up).
pub(crate) fn write_eventfd(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writing 8 bytes from a live u64 to a descriptor we hold.
    unsafe { libc::write(fd, &one as *const u64 as *const libc::c_void, 8) };
}

impl Cq {
    pub(crate) fn create(nic: &Nic, entries: usize, direct: bool) -> Result<Cq, CqError> {
        let max = nic.attributes().max_cq_entries;
        if entries == 0 || entries > max {
            return Err(CqError::Size {
                asked: entries,
                max,
            });
        }
        // SAFETY: plain eventfd creation.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(CqError::Size {
                asked: entries,
                max: 0,
            });
        }
        Ok(Cq {
            s: Arc::new(CqShared {
                nic: nic.s.clone(),
                // SAFETY: a fresh descriptor we own.
                efd: unsafe { OwnedFd::from_raw_fd(fd) },
                notices: Mutex::new(Notices {
                    q: VecDeque::with_capacity(entries),
                    cap: entries,
                    overflowed: false,
                }),
                queued: AtomicUsize::new(0),
                members: SpinLock::new(Vec::new()),
                waiters: AtomicU32::new(0),
                direct,
                next: AtomicUsize::new(0),
            }),
        })
    }

    fn pop(&self) -> Result<Option<CqCompletion>, WaitError> {
        if self.s.queued.load(Ordering::SeqCst) == 0 {
            return Ok(None);
        }
        let mut n = self.s.lock_notices();
        if n.overflowed {
            return Err(WaitError::CqOverflow(n.cap));
        }
        let mut found = None;
        while let Some((w, queue)) = n.q.pop_front() {
            if let Some(s) = w.upgrade() {
                found = Some(CqCompletion {
                    vi: Vi { s },
                    queue,
                });
                break;
            }
        }
        self.s.publish(&n);
        Ok(found)
    }

    /// The queues of `vi` that report to this CQ.
    fn queues_of(&self, vi: &ViShared) -> [Option<Queue>; 2] {
        let mine =
            |c: &Option<Arc<CqShared>>| c.as_ref().is_some_and(|c| std::ptr::eq(&**c, &*self.s));
        [
            mine(&vi.recv_cq).then_some(Queue::Recv),
            mine(&vi.send_cq).then_some(Queue::Send),
        ]
    }

    /// A direct CQ's walk: each attached queue once, starting one VI
    /// further than the last walk, until `f` returns something.
    fn walk<R>(&self, mut f: impl FnMut(&Vi, Queue) -> Option<R>) -> Option<(Vi, R)> {
        let m = self.s.lock_members();
        let n = m.len();
        if n == 0 {
            return None;
        }
        let start = if n == 1 {
            0
        } else {
            self.s.next.fetch_add(1, Ordering::Relaxed) % n
        };
        for k in 0..n {
            let Some(s) = m[(start + k) % n].upgrade() else {
                continue;
            };
            let vi = Vi { s };
            for q in self.queues_of(&vi.s).into_iter().flatten() {
                if let Some(r) = f(&vi, q) {
                    return Some((vi, r));
                }
            }
        }
        None
    }

    /// Takes a completed descriptor posted raw ([`Vi::post_send_raw`],
    /// [`Vi::post_recv_raw`]) off any queue reporting here, with its VI
    /// and queue: on a direct CQ in one call per queue, on another the
    /// oldest notice's descriptor. Drives progress when nothing is done.
    pub fn take_raw(&self) -> Result<Option<(Vi, Queue, NonNull<Descriptor>)>, WaitError> {
        if self.s.direct {
            return Ok(self
                .walk(|vi, q| vi.done_raw(q).map(|d| (q, d)))
                .map(|(vi, (q, d))| (vi, q, d)));
        }
        while let Some(c) = self.done()? {
            if let Some(d) = c.vi.done_raw(c.queue) {
                return Ok(Some((c.vi, c.queue, d)));
            }
        }
        Ok(None)
    }

    /// The oldest notice, if any (VipCQDone). Drives progress on the
    /// attached VIs when none is waiting. On a direct CQ, the first queue
    /// found with a completed descriptor at its head.
    pub fn done(&self) -> Result<Option<CqCompletion>, WaitError> {
        if self.s.direct {
            return Ok(self
                .walk(|vi, q| vi.head_done(q).then_some(q))
                .map(|(vi, queue)| CqCompletion { vi, queue }));
        }
        if let Some(c) = self.pop()? {
            return Ok(Some(c));
        }
        // Walked under the members' lock, not copied out: an empty poll
        // allocates nothing. (A VI's progress takes its own lock and the
        // notices' lock, never this one.)
        for w in self.s.lock_members().iter() {
            if let Some(vi) = w.upgrade() {
                Vi::poll_progress(vi);
            }
        }
        self.pop()
    }

    /// Waits for a notice (VipCQWait): spins briefly, then sleeps on the
    /// eventfd. `None` waits forever.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<CqCompletion, WaitError> {
        let start = Instant::now();
        while start.elapsed() < CQ_WAIT_SPIN {
            if let Some(c) = self.done()? {
                return Ok(c);
            }
        }
        loop {
            self.s.waiters.fetch_add(1, Ordering::AcqRel);
            let ready = self.arm();
            let c = self.done();
            if !ready && !matches!(c, Ok(Some(_)) | Err(_)) {
                let left = match timeout {
                    Some(t) => t.saturating_sub(start.elapsed()),
                    None => Duration::from_millis(20),
                };
                // Network VIs have no doorbell: their frames wake the
                // waiter through their sockets, and their timers need a
                // look at least every millisecond.
                let net: Vec<RawFd> = self.s.members().iter().filter_map(Vi::wake_fd).collect();
                let cap = if net.is_empty() { 20 } else { 1 };
                let ms = left.min(Duration::from_millis(cap)).as_millis() as i32;
                let mut p: Vec<libc::pollfd> = std::iter::once(self.s.efd.as_raw_fd())
                    .chain(net)
                    .map(|fd| libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    })
                    .collect();
                // SAFETY: `p` holds `p.len()` valid pollfds.
                unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
                self.drain_eventfd();
                if p.len() > 1 {
                    for vi in self.s.members() {
                        Vi::run_timers(vi);
                    }
                }
            }
            self.s.waiters.fetch_sub(1, Ordering::AcqRel);
            if let Some(c) = c? {
                return Ok(c);
            }
            if let Some(c) = self.done()? {
                return Ok(c);
            }
            if timeout.is_some_and(|t| start.elapsed() >= t) {
                return Err(WaitError::Timeout);
            }
        }
    }

    /// The eventfd to put in an epoll set. It becomes readable after
    /// [`arm`](Self::arm) when a notice may be waiting; read it (or call
    /// [`drain_eventfd`](Self::drain_eventfd)), call `done` until it returns
    /// `None`, then arm again.
    pub fn eventfd(&self) -> RawFd {
        self.s.efd.as_raw_fd()
    }

    /// Asks the attached VIs' peers to signal the eventfd on their next
    /// message. Returns `true` if notices are already waiting (do not sleep).
    pub fn arm(&self) -> bool {
        let mut ready = false;
        for vi in self.s.members() {
            ready |= Vi::arm_eventfd(vi);
        }
        if self.s.direct {
            return ready || self.walk(|vi, q| vi.head_done(q).then_some(())).is_some();
        }
        ready || !self.s.lock_notices().q.is_empty()
    }

    /// Everything a program that sleeps on this CQ in its own event loop
    /// must watch: the eventfd, then each attached network VI's socket
    /// (frames wake the sleeper there, as in [`wait`](Self::wait)), each
    /// descriptor once. Attaching VIs may add to the list.
    pub fn wake_fds(&self) -> Vec<RawFd> {
        let mut fds = vec![self.s.efd.as_raw_fd()];
        for vi in self.s.members() {
            if let Some(fd) = Vi::wake_fd(&vi) {
                if !fds.contains(&fd) {
                    fds.push(fd);
                }
            }
        }
        fds
    }

    /// Signals the eventfd on every notice from now on, as while a thread
    /// waits in [`wait`](Self::wait): for a CQ that a program sleeps on in
    /// its own event loop, where a completion made by another thread (a
    /// network VI's timers, driven elsewhere) must wake it too. Each notice
    /// then costs a write to the eventfd.
    pub fn keep_signalled(&self) {
        self.s.waiters.fetch_add(1, Ordering::AcqRel);
    }

    /// Resets the eventfd's counter.
    pub fn drain_eventfd(&self) {
        let mut v = 0u64;
        // SAFETY: reading 8 bytes into a live u64 from our non-blocking eventfd.
        unsafe {
            libc::read(
                self.s.efd.as_raw_fd(),
                &mut v as *mut u64 as *mut libc::c_void,
                8,
            )
        };
    }

    /// Notices waiting.
    pub fn len(&self) -> usize {
        self.s.lock_notices().q.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Room for notices.
    pub fn capacity(&self) -> usize {
        self.s.lock_notices().cap
    }

    /// Changes the room for notices (VipResizeCQ); never below what it holds.
    pub fn resize(&self, entries: usize) -> Result<(), CqError> {
        let max = self.s.nic.attrs.max_cq_entries;
        if entries == 0 || entries > max {
            return Err(CqError::Size {
                asked: entries,
                max,
            });
        }
        let mut n = self.s.lock_notices();
        if entries < n.q.len() {
            return Err(CqError::TooSmall(n.q.len()));
        }
        n.cap = entries;
        let more = entries.saturating_sub(n.q.capacity());
        n.q.reserve(more);
        Ok(())
    }

    /// Destroys the CQ (VipDestroyCQ): refused while VIs are attached.
    pub fn destroy(self) -> Result<(), (Cq, CqError)> {
        let n = self.s.members().len();
        if n > 0 {
            return Err((self, CqError::InUse(n)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::vi::tests::connected_pair_with;
    use crate::*;
    use std::time::Duration;

    #[test]
    fn notices_name_each_vi_in_completion_order() {
        let nic = Nic::open("shm").unwrap();
        let cq = nic.create_cq(16).unwrap();
        let (a1, b1) = connected_pair_with(&nic, Some(&cq));
        let (a2, b2) = connected_pair_with(&nic, Some(&cq));
        let (r1, r2) = (b1.recv_buf(), b2.recv_buf());
        b1.vi
            .post_recv(Box::new(Descriptor::recv(&[r1.segment(0, 64)])))
            .unwrap();
        b2.vi
            .post_recv(Box::new(Descriptor::recv(&[r2.segment(0, 64)])))
            .unwrap();
        a2.send(b"second vi");
        a1.send(b"first vi");
        let n1 = cq.wait(Some(Duration::from_secs(5))).unwrap();
        let n2 = cq.wait(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(n1.queue, Queue::Recv);
        assert_eq!(n2.queue, Queue::Recv);
        let ids = [n1.vi.id(), n2.vi.id()];
        assert!(
            ids.contains(&b1.vi.id()) && ids.contains(&b2.vi.id()),
            "{ids:?}"
        );
        // The notice says the head is complete; the VI's done call hands it over.
        assert_eq!(b1.vi.recv_done().unwrap().result(), Ok(8));
        assert_eq!(b2.vi.recv_done().unwrap().result(), Ok(9));
        assert!(cq.done().unwrap().is_none());
        assert_eq!(
            b1.vi.recv_wait(Some(Duration::from_millis(1))).unwrap_err(),
            WaitError::BoundToCq
        );
        drop((a1, a2));
    }

    /// Posts a receive raw (the way a face posts descriptors it owns).
    fn post_raw(vi: &Vi, seg: Segment) -> std::ptr::NonNull<Descriptor> {
        let d = std::ptr::NonNull::from(Box::leak(Box::new(Descriptor::recv(&[seg]))));
        // SAFETY: a live descriptor, ours until taken back below.
        unsafe { vi.post_recv_raw(d, false) }.unwrap();
        d
    }

    #[test]
    fn a_direct_cq_hands_over_each_vis_completions_without_notices() {
        let nic = Nic::open("shm").unwrap();
        let cq = nic.create_direct_cq(4).unwrap();
        let (a1, b1) = connected_pair_with(&nic, Some(&cq));
        let (a2, b2) = connected_pair_with(&nic, Some(&cq));
        let (r1, r2) = (b1.recv_buf(), b2.recv_buf());
        let d1 = post_raw(&b1.vi, r1.segment(0, 64));
        let d2 = post_raw(&b2.vi, r2.segment(0, 64));
        let d3 = post_raw(&b1.vi, r1.segment(64, 64));
        assert!(cq.take_raw().unwrap().is_none(), "nothing arrived yet");
        // More messages than the CQ has entries for: a direct CQ keeps no
        // notices, so it cannot overflow.
        for _ in 0..3 {
            a2.send(b"second vi");
        }
        a1.send(b"first vi");
        a1.send(b"again");
        let mut got = Vec::new();
        let start = std::time::Instant::now();
        while got.len() < 3 && start.elapsed() < Duration::from_secs(5) {
            if let Some((vi, q, d)) = cq.take_raw().unwrap() {
                assert_eq!(q, Queue::Recv);
                // SAFETY: one of the descriptors posted above, handed back.
                let len = unsafe { d.as_ref() }.result().unwrap();
                got.push((vi.id(), d, len));
            }
        }
        assert_eq!(got.len(), 3, "{got:?}");
        let of = |d| got.iter().find(|g| g.1 == d).map(|g| (g.0, g.2));
        assert_eq!(of(d1), Some((b1.vi.id(), 8)));
        assert_eq!(
            of(d3),
            Some((b1.vi.id(), 5)),
            "each VI's queue stays in order"
        );
        assert_eq!(of(d2), Some((b2.vi.id(), 9)));
        assert_eq!(cq.len(), 0);
        // A blocking wait names the queue; the VI's done call takes it.
        let d4 = post_raw(&b2.vi, r2.segment(64, 64));
        let c = cq.wait(Some(Duration::from_secs(5))).unwrap();
        assert_eq!((c.vi.id(), c.queue), (b2.vi.id(), Queue::Recv));
        assert_eq!(c.vi.done_raw(Queue::Recv), Some(d4));
        for d in [d1, d2, d3, d4] {
            // SAFETY: each came from Box::leak above and is back with us.
            drop(unsafe { Box::from_raw(d.as_ptr()) });
        }
        drop((a1, a2));
    }

    #[test]
    fn eventfd_becomes_readable_when_armed_and_a_message_arrives() {
        let nic = Nic::open("shm").unwrap();
        let cq = nic.create_cq(4).unwrap();
        let (a, b) = connected_pair_with(&nic, Some(&cq));
        let r = b.recv_buf();
        b.vi.post_recv(Box::new(Descriptor::recv(&[r.segment(0, 64)])))
            .unwrap();
        assert!(!cq.arm(), "nothing pending yet");
        let mut pfd = libc::pollfd {
            fd: cq.eventfd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        assert_eq!(
            unsafe { libc::poll(&mut pfd, 1, 0) },
            0,
            "not readable before a message"
        );
        a.send(b"ping");
        // SAFETY: as above.
        assert_eq!(
            unsafe { libc::poll(&mut pfd, 1, 5000) },
            1,
            "readable after the message"
        );
        cq.drain_eventfd();
        assert!(cq.done().unwrap().is_some());
    }

    #[test]
    fn resize_and_destroy_rules() {
        let nic = Nic::open("shm").unwrap();
        assert!(matches!(nic.create_cq(0), Err(CqError::Size { .. })));
        let cq = nic.create_cq(2).unwrap();
        cq.resize(8).unwrap();
        assert_eq!(cq.capacity(), 8);
        let (_a, b) = connected_pair_with(&nic, Some(&cq));
        let (cq, err) = cq.destroy().unwrap_err();
        assert_eq!(err, CqError::InUse(1));
        drop(b);
        cq.destroy().unwrap();
    }
}
