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
//!
//! A waiter ([`Cq::wait`]) sleeps in one system call and is woken by one:
//! where the attached VIs sleep on futex doorbells (shm), on the one VI's
//! doorbell, or on all of them and a futex word of the CQ's own at once
//! (`futex_waitv`), so a peer's message wakes it with the same single
//! `FUTEX_WAKE` that wakes a VI's own waiter; else in `poll` on the eventfd
//! and the VIs' sockets (udp, xdp), which their frames make readable.
//! Another thread of the process that makes a notice wakes the sleeper
//! through that doorbell, the CQ's word or the eventfd; the waiter's own
//! progress, which makes most notices, wakes nobody.
//!
//! A CQ of many network VIs keeps their sockets in an epoll set (a ready
//! list, [`crate::ready`]): a poll drives only the VIs whose frames arrived
//! and, every millisecond, the Nic's due timers; a waiter sleeps on the set
//! instead of on every socket.

use crate::count::CountGuard;
use crate::desc::Descriptor;
use crate::error::{CqError, WaitError};
use crate::lock::{Guard, SpinLock};
use crate::nic::{Nic, NicShared};
use crate::ready::ReadySet;
use crate::vi::{Queue, Vi, ViShared, DEFAULT_WAIT_SPIN};
use std::cell::Cell;
use std::collections::VecDeque;
use std::hint::spin_loop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
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
    /// Counts [`Cq::interrupt`] calls: a wait that sees it change ends.
    kicks: AtomicU32,
    /// The attached VIs. Walked on every empty poll, changed only when a
    /// VI attaches: a spin lock, released by a plain store.
    members: SpinLock<Vec<Weak<ViShared>>>,
    /// Threads that want the eventfd signalled on each notice: waiters
    /// asleep in `poll` on it, and programs' event loops
    /// ([`Cq::keep_signalled`]).
    waiters: AtomicU32,
    /// Waiters asleep on the VIs' futex doorbells and on `word`: a notice
    /// made by another thread of the process moves `word` and wakes them.
    sleepers: AtomicU32,
    word: AtomicU32,
    /// The doorbell a waiter of a CQ with one VI sleeps on alone (as that
    /// VI's own waiter would, in `FUTEX_WAIT`): another thread's notice
    /// rings it. Locked only around a sleep and by such a notice.
    lone: Mutex<Option<crate::provider::Sleep>>,
    /// False once `futex_waitv` failed (an old kernel): waiters sleep in
    /// `poll` from then on.
    futex_ok: AtomicBool,
    /// Waiters asleep in a VI's receive ([`Cq::sleep_in_recv`]), and
    /// whether waits may still sleep so (false once another thread's
    /// notice found one there).
    recv_sleepers: AtomicU32,
    recv_ok: AtomicBool,
    /// How long [`Cq::wait`] polls before it sleeps, in nanoseconds.
    spin_ns: AtomicU64,
    /// Threads in [`Cq::wait`]'s sleep phase: they drive the attached VIs.
    in_wait: AtomicU32,
    /// The longest sleep before a look at the peers' health, in
    /// nanoseconds ([`SLEEP_SLICE`]; tests make it long, so that a lost
    /// wake-up shows as a timeout).
    slice_ns: AtomicU64,
    /// Keeps no notices: polls walk the members' queues.
    direct: bool,
    /// Where a direct CQ's next walk starts.
    next: AtomicUsize,
    /// The members' sockets in an epoll set, for a CQ of many network VIs.
    ready: Mutex<Ready>,
    /// The members or a member's socket changed: the ready set is brought
    /// in step before its next use.
    resync: AtomicBool,
    /// True while polls go through the ready set.
    ready_on: AtomicBool,
    /// Members with frames held back for a burst (doorbell coalescing),
    /// which their sockets would not name: the next poll drives them.
    held: Mutex<Vec<Weak<ViShared>>>,
    held_any: AtomicBool,
    /// The lists a waiter sleeping in `poll` builds, kept for its next
    /// sleep (taken with `try_lock`: a second waiter at the same time
    /// builds its own).
    scratch: Mutex<Scratch>,
    /// Which members an empty poll of a large CQ without a ready list
    /// looks at ([`Rota`]).
    rota: SpinLock<Rota<usize>>,
}

/// From this many members up, a poll of a CQ whose VIs have no ready list
/// (shm) looks at the few members that moved lately, and at quiet members
/// in turn, not at every member: a walk of 1,000 shm VIs takes some 60 us,
/// which a busy pair among them waited for on every message. A look that
/// finds a quiet member moving goes on to the next while they move (many
/// are busy: one poll finds a run of them). A quiet member's message waits
/// about as long as a walk of every member took (`examples/cq_poll_cost.rs`).
const ROTA_FROM: usize = 32;
/// Members that moved lately, looked at by every poll.
const HOT: usize = 4;
/// A member found moving after this many fruitless looks at quiet ones
/// becomes hot; one found among moving neighbours (a round of messages to
/// all) is left to the turns, so the hot polls are not spent on members
/// that have just been served.
const HEAT_AFTER: u32 = 2;
/// Polls of a hot member that find nothing before it goes back to its turn.
const HOT_IDLE: u32 = 256;
/// While quiet members' looks find nothing, one is looked at every this
/// many polls: a look at a member the caches have let go costs about twice
/// a poll of a busy one, and a busy member's messages are found that much
/// later. A quiet member of N is then looked at within `N * QUIET_EVERY`
/// polls. (Every 4 polls, one pair among 1,000 went as fast, and a quiet
/// member's message waited 2–3 times as long as a walk of all.)
const QUIET_EVERY: u32 = 2;
/// Fruitless looks in a row before the looks slow down to [`QUIET_EVERY`].
const QUIET_AFTER: u32 = 64;

/// A large CQ's choice of members to poll: the few that moved lately
/// every poll, the quiet ones less often. Members are named by a key `K`:
/// on a CQ without a ready list ([`ROTA_FROM`]) their index in the
/// members list, which attaching and detaching may shift (an index that
/// moved names another member, looked at once too many, or its turn comes
/// round again); through a ready list ([`Ready::Set`]) the VI itself.
struct Rota<K> {
    /// Members that moved lately, and the polls since each last did.
    hot: [Option<(K, u32)>; HOT],
    /// The quiet member looked at last (the walk without a ready list).
    next: usize,
    /// Polls so far, and the looks at quiet members in a row that found
    /// nothing.
    polls: u32,
    fruitless: u32,
}

impl<K: PartialEq> Rota<K> {
    fn new() -> Rota<K> {
        Rota {
            hot: std::array::from_fn(|_| None),
            next: 0,
            polls: 0,
            fruitless: 0,
        }
    }

    fn is_hot(&self, k: &K) -> bool {
        self.hot.iter().flatten().any(|(h, _)| h == k)
    }

    /// Member `k` moved: it is looked at by every poll from now on, in
    /// the place of the hot member idle longest.
    fn heat(&mut self, k: K) {
        if self.is_hot(&k) {
            return;
        }
        let slot = self
            .hot
            .iter_mut()
            .min_by_key(|h| h.as_ref().map_or(0, |(_, idle)| u64::MAX - *idle as u64))
            .expect("HOT > 0");
        *slot = Some((k, 0));
    }

    /// A hot member's poll: it moved (its count starts again), or it did
    /// not, and after [`HOT_IDLE`] such polls it goes back to its turn.
    fn polled(slot: &mut Option<(K, u32)>, moved: bool) {
        if let Some((_, idle)) = slot {
            if moved {
                *idle = 0;
            } else {
                *idle += 1;
                if *idle >= HOT_IDLE {
                    *slot = None;
                }
            }
        }
    }

    /// True if this poll looks at quiet members: every poll while their
    /// looks find something, every [`QUIET_EVERY`] after a run of
    /// fruitless ones.
    fn looks_now(&mut self) -> bool {
        self.polls = self.polls.wrapping_add(1);
        self.fruitless < QUIET_AFTER || self.polls.is_multiple_of(QUIET_EVERY)
    }

    /// A look at quiet members found `found` of them moving; `first` is
    /// the first. One found after fruitless looks is busy among quiet
    /// members: it becomes hot. One found among moving neighbours (a
    /// round of messages to all) is left to the looks, so the hot polls
    /// are not spent on members that have just been served.
    fn looked(&mut self, found: usize, first: Option<K>) {
        match first {
            Some(k) if found > 0 => {
                if self.fruitless >= HEAT_AFTER {
                    self.heat(k);
                }
                self.fruitless = 0;
            }
            _ => self.fruitless = self.fruitless.saturating_add(1),
        }
    }
}

/// A member of a CQ polled through its ready list, named by its VI.
struct Member(Weak<ViShared>);

impl PartialEq for Member {
    fn eq(&self, other: &Member) -> bool {
        self.0.ptr_eq(&other.0)
    }
}

/// A CQ's ready list (see [`crate::ready`]).
enum Ready {
    /// Not made yet (too few members so far).
    Unused,
    Set {
        set: ReadySet,
        /// When a poll next runs the Nic's due timers.
        timers_at: Instant,
        /// The members that moved lately, polled directly by every poll,
        /// and how often the set is looked at for the others.
        rota: Box<Rota<Member>>,
    },
    /// Not for this CQ: its VIs have no sockets (shm), or epoll failed.
    Off,
}

/// From this many members up, a network CQ drives its VIs from a ready
/// list; below, a poll asks each VI (a socket look each, cheaper than an
/// `epoll_wait` for a few).
const READY_SET_FROM: usize = 8;

/// How often a poll through the ready list runs the Nic's due timers (the
/// Nic's sweep: every VI whose timer is due, connected or not, in the
/// program's hands or idle).
const READY_TIMERS_EVERY: Duration = Duration::from_millis(1);

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

/// A waiter's first nap before it looks at its VIs' peers (a peer that died
/// while the VIs were busy is noticed within this time).
const SLEEP_SLICE: Duration = Duration::from_millis(20);
/// The longest nap a waiter takes after naps that ended with nothing (a
/// dead peer is seen within about this; a network VI's timers cut it
/// short when due).
const IDLE_SLICE: Duration = Duration::from_millis(250);

/// A `poll` sleeper's lists ([`Cq::sleep_poll`]): its VIs and the
/// descriptors it sleeps on. Empty between sleeps (no VI is kept alive by
/// them); their room stays.
#[derive(Default)]
struct Scratch {
    members: Vec<Arc<ViShared>>,
    fds: Vec<libc::pollfd>,
}

/// How a thread in [`Cq::wait`] is counted while it sleeps.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Asleep {
    /// In `sleepers` (futex).
    Futex,
    /// In `waiters` (eventfd and `poll`).
    Poll,
}

thread_local! {
    /// The CQ this thread is about to sleep on, and how it is counted: the
    /// notices its own progress makes wake nobody (it looks at the notices
    /// before it sleeps).
    static ASLEEP_ON: Cell<Option<(*const CqShared, Asleep)>> = const { Cell::new(None) };
}

/// Counts this thread as a sleeper of `cq` (and marks it, see [`ASLEEP_ON`])
/// until dropped.
struct Counted<'a> {
    cq: &'a CqShared,
    how: Asleep,
}

impl<'a> Counted<'a> {
    fn new(cq: &'a CqShared, how: Asleep) -> Counted<'a> {
        ASLEEP_ON.with(|c| c.set(Some((cq as *const CqShared, how))));
        cq.counter(how).fetch_add(1, Ordering::SeqCst);
        Counted { cq, how }
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.cq.counter(self.how).fetch_sub(1, Ordering::SeqCst);
        ASLEEP_ON.with(|c| c.set(None));
    }
}

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
        self.resync.store(true, Ordering::SeqCst);
    }

    /// Takes `vi` off the members (the program destroyed it).
    pub(crate) fn detach(&self, vi: &Arc<ViShared>) {
        self.lock_members()
            .retain(|w| w.strong_count() > 0 && w.as_ptr() != Arc::as_ptr(vi));
        self.resync.store(true, Ordering::SeqCst);
    }

    /// A member's socket changed (it connected): the ready list is brought
    /// in step before its next use.
    pub(crate) fn socket_changed(&self) {
        self.resync.store(true, Ordering::SeqCst);
    }

    /// `vi` holds frames back for a burst: a poll through the ready set
    /// drives it next, as a walk over every member would.
    fn holds_frames(&self, vi: &Arc<ViShared>) {
        if !self.ready_on.load(Ordering::Relaxed) {
            return;
        }
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(vi));
        self.held_any.store(true, Ordering::Release);
    }

    /// Called by a VI (under its lock) when a descriptor of `q` completes.
    pub(crate) fn notify(&self, vi: &Arc<ViShared>, q: Queue) {
        if !self.direct {
            let mut n = self.lock_notices();
            if n.q.len() >= n.cap {
                n.overflowed = true;
            } else {
                n.q.push_back((Arc::downgrade(vi), q));
            }
            self.publish(&n);
        }
        self.wake();
    }

    /// True while a thread waits in [`Cq::wait`]'s sleep phase: it drives
    /// the attached VIs, so a background driver leaves them alone.
    pub(crate) fn driven_by_waiter(&self) -> bool {
        self.in_wait.load(Ordering::Relaxed) > 0
    }

    fn counter(&self, how: Asleep) -> &AtomicU32 {
        match how {
            Asleep::Futex => &self.sleepers,
            Asleep::Poll => &self.waiters,
        }
    }

    /// Wakes the sleepers after a notice was published (sequentially
    /// consistent against a sleeper's count: it counts itself, then looks
    /// at the notices). The thread that is itself about to sleep here does
    /// not count: it looks at the notices before sleeping.
    fn wake(&self) {
        // Nobody counted (the usual case: the notice is made by the thread
        // that will take it): nothing to wake, and no thread-local looked
        // at, which in a shared library is a call.
        if self.sleepers.load(Ordering::SeqCst) == 0 && self.waiters.load(Ordering::SeqCst) == 0 {
            return;
        }
        let me = ASLEEP_ON.with(|c| c.get());
        let others = |how: Asleep| {
            let n = self.counter(how).load(Ordering::SeqCst);
            let mine = me.is_some_and(|(cq, h)| std::ptr::eq(cq, self) && h == how);
            n > mine as u32
        };
        self.wake_asleep(others(Asleep::Futex), others(Asleep::Poll));
    }

    /// Wakes every sleeper, the calling thread's own count included (an
    /// interrupt comes from outside the waits).
    fn wake_all(&self) {
        self.wake_asleep(
            self.sleepers.load(Ordering::SeqCst) > 0,
            self.waiters.load(Ordering::SeqCst) > 0,
        );
    }

    /// Wakes the waiters asleep on futexes (`futex`) and in `poll`.
    fn wake_asleep(&self, futex: bool, poll: bool) {
        if futex {
            uvia_shm::doorbell::wake_local(&self.word);
            let lone = self.lone.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(s) = lone {
                s.wake();
            }
        }
        if poll {
            if self.recv_sleepers.load(Ordering::SeqCst) > 0 {
                // Another thread made a notice while the waiter sleeps in
                // a receive, which this cannot wake: waits here sleep
                // where the eventfd reaches them from now on.
                self.recv_ok.store(false, Ordering::Relaxed);
            }
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

/// `vi`'s socket changed (it connected): its CQs' ready lists are brought
/// in step before their next use.
pub(crate) fn socket_changed(vi: &ViShared) {
    for cq in [&vi.send_cq, &vi.recv_cq].into_iter().flatten() {
        cq.socket_changed();
    }
}

/// `vi` holds frames back for a burst: its CQs' next polls drive it.
pub(crate) fn holds_frames(vi: &Arc<ViShared>) {
    for cq in [&vi.send_cq, &vi.recv_cq].into_iter().flatten() {
        cq.holds_frames(vi);
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
                kicks: AtomicU32::new(0),
                members: SpinLock::new(Vec::new()),
                waiters: AtomicU32::new(0),
                sleepers: AtomicU32::new(0),
                word: AtomicU32::new(0),
                lone: Mutex::new(None),
                futex_ok: AtomicBool::new(true),
                recv_sleepers: AtomicU32::new(0),
                recv_ok: AtomicBool::new(true),
                spin_ns: AtomicU64::new(DEFAULT_WAIT_SPIN.as_nanos() as u64),
                in_wait: AtomicU32::new(0),
                slice_ns: AtomicU64::new(SLEEP_SLICE.as_nanos() as u64),
                direct,
                next: AtomicUsize::new(0),
                ready: Mutex::new(if nic.s.attrs.needs_driving {
                    Ready::Unused
                } else {
                    Ready::Off
                }),
                resync: AtomicBool::new(false),
                ready_on: AtomicBool::new(false),
                held: Mutex::new(Vec::new()),
                held_any: AtomicBool::new(false),
                scratch: Mutex::new(Scratch::default()),
                rota: SpinLock::new(Rota::new()),
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
        self.walk_vis(|vi, queues| queues.iter().find_map(|&q| f(vi, q)))
    }

    /// [`walk`](Self::walk) a VI at a time: `f` gets each attached VI with
    /// the queues it reports here (one or both).
    fn walk_vis<R>(&self, mut f: impl FnMut(&Vi, &[Queue]) -> Option<R>) -> Option<(Vi, R)> {
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
            let (mut queues, mut k) = ([Queue::Recv; 2], 0);
            for q in self.queues_of(&vi.s).into_iter().flatten() {
                queues[k] = q;
                k += 1;
            }
            if let Some(r) = f(&vi, &queues[..k]) {
                return Some((vi, r));
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
                .walk_vis(|vi, queues| vi.done_raw_of(queues))
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
        if !self.progress_ready() {
            // Walked under the members' lock, not copied out: an empty poll
            // allocates nothing. (A VI's progress takes its own lock and the
            // notices' lock, never this one.)
            let members = self.s.lock_members();
            if members.len() < ROTA_FROM || !self.progress_rota(&members) {
                for w in members.iter() {
                    if let Some(vi) = w.upgrade() {
                        Vi::poll_progress(vi);
                    }
                }
            }
        }
        self.pop()
    }

    /// Drives the hot members and the next quiet ones in turn ([`Rota`]);
    /// false if another thread is choosing (the caller walks them all).
    fn progress_rota(&self, members: &[Weak<ViShared>]) -> bool {
        let Some(mut rota) = self.s.rota.try_lock() else {
            return false;
        };
        let poll = |i: usize| {
            members
                .get(i)
                .and_then(Weak::upgrade)
                .is_some_and(Vi::poll_progress)
        };
        for h in rota.hot.iter_mut() {
            if let Some(&(i, _)) = h.as_ref() {
                let moved = poll(i);
                Rota::polled(h, moved);
            }
        }
        if !rota.looks_now() {
            return true;
        }
        // Quiet members in turn, while they have moved: when many are busy
        // (a round of messages to all of them), one poll finds a run of
        // them.
        let n = members.len();
        let mut i = rota.next;
        let (mut found, mut first) = (0, None);
        for _ in 0..n {
            i += 1;
            if i >= n {
                i = 0;
            }
            if rota.is_hot(&i) {
                continue;
            }
            if !poll(i) {
                break;
            }
            first = first.or(Some(i));
            found += 1;
        }
        rota.looked(found, first);
        rota.next = i;
        true
    }

    /// The ready set of a CQ of many network VIs, brought in step with the
    /// members; `None` where there is none (the caller walks every member).
    fn ready_set(&self) -> Option<MutexGuard<'_, Ready>> {
        // Looked at before the lock: an shm CQ's polls, and a few VIs',
        // pay nothing for the ready list.
        if !self.s.nic.attrs.needs_driving {
            return None;
        }
        if self.s.lock_members().len() < READY_SET_FROM {
            self.leave_ready_set();
            return None;
        }
        let mut r = self.s.ready.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(*r, Ready::Off) {
            self.leave_ready_set();
            return None;
        }
        if matches!(*r, Ready::Unused) {
            *r = match ReadySet::new() {
                Some(set) => Ready::Set {
                    set,
                    timers_at: Instant::now(),
                    rota: Box::new(Rota::new()),
                },
                None => Ready::Off,
            };
            self.s.resync.store(true, Ordering::SeqCst);
        }
        if self.s.resync.swap(false, Ordering::SeqCst) {
            let members = self.s.members();
            if let Ready::Set { set, .. } = &mut *r {
                if !set.sync(&members) {
                    *r = Ready::Off;
                }
            }
        }
        if !matches!(*r, Ready::Set { .. }) {
            drop(r);
            self.leave_ready_set();
            return None;
        }
        self.s.ready_on.store(true, Ordering::Relaxed);
        Some(r)
    }

    /// Makes the polls from now on look at the ready set, if the CQ has
    /// one, every time again until [`QUIET_AFTER`] looks have found
    /// nothing ([`Rota::looks_now`]): a waiter woken by one of the set's
    /// sockets takes its frames with its first poll, where a poll that
    /// left the set alone had it sleep again first (a `poll` call that
    /// returns at once, and a second look).
    fn look_at_set_next(&self) {
        if !self.s.ready_on.load(Ordering::Relaxed) {
            return;
        }
        if let Ready::Set { rota, .. } =
            &mut *self.s.ready.lock().unwrap_or_else(|e| e.into_inner())
        {
            rota.fruitless = 0;
        }
    }

    /// Polls walk every member again (too few, or the set failed): the
    /// held list, which only the ready set's polls drain, is let go.
    fn leave_ready_set(&self) {
        if self.s.ready_on.load(Ordering::Relaxed) {
            self.s.ready_on.store(false, Ordering::Relaxed);
            self.s.held_any.store(false, Ordering::Release);
            self.s
                .held
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
        }
    }

    /// Drives the members that moved lately, the others whose sockets
    /// have frames and, every [`READY_TIMERS_EVERY`], the Nic's due
    /// timers. False where the CQ has no ready set.
    ///
    /// A member that moved lately (one pair busy among many idle ones) is
    /// polled directly, a socket look as on a CQ of its own: through the
    /// set alone its message waited for an `epoll_wait` that names its
    /// socket and then for the receive, a system call more on every
    /// message. The set is looked at every poll while it names members
    /// that move, and every [`QUIET_EVERY`] polls after a run of looks
    /// that name none ([`Rota`]).
    fn progress_ready(&self) -> bool {
        let (hot, found, timers) = {
            let Some(mut r) = self.ready_set() else {
                return false;
            };
            let Ready::Set {
                set,
                timers_at,
                rota,
            } = &mut *r
            else {
                return false;
            };
            let now = Instant::now();
            let timers = now >= *timers_at;
            if timers {
                *timers_at = now + READY_TIMERS_EVERY;
            }
            let hot: [Option<Arc<ViShared>>; HOT] =
                std::array::from_fn(|i| rota.hot[i].as_ref().and_then(|(m, _)| m.0.upgrade()));
            let found = rota.looks_now().then(|| {
                let mut vis = set.ready();
                vis.retain(|vi| !hot.iter().flatten().any(|h| Arc::ptr_eq(h, vi)));
                vis
            });
            (hot, found, timers)
        };
        let hot_moved = hot.map(|vi| vi.map(Vi::poll_progress));
        let first = found.map(|vis| {
            let mut first = None;
            let mut n = 0;
            for vi in vis {
                let w = Arc::downgrade(&vi);
                if Vi::poll_progress(vi) {
                    first = first.or(Some(Member(w)));
                    n += 1;
                }
            }
            (n, first)
        });
        // (Another thread polling the CQ meanwhile may have changed the
        // hot members: a count then lands on another member, which at
        // worst goes back to the set's looks early.)
        {
            let mut r = self.s.ready.lock().unwrap_or_else(|e| e.into_inner());
            if let Ready::Set { rota, .. } = &mut *r {
                for (slot, moved) in rota.hot.iter_mut().zip(hot_moved) {
                    match moved {
                        Some(moved) => Rota::polled(slot, moved),
                        // Gone: its place is free.
                        None => *slot = None,
                    }
                }
                if let Some((n, first)) = first {
                    rota.looked(n, first);
                }
            }
        }
        self.progress_held();
        if timers {
            self.s.nic.provider.run_due_timers();
        }
        true
    }

    /// Drives the members that hold frames back for a burst; true if any
    /// moved.
    fn progress_held(&self) -> bool {
        let mut moved = false;
        if self.s.held_any.swap(false, Ordering::Acquire) {
            let held = std::mem::take(&mut *self.s.held.lock().unwrap_or_else(|e| e.into_inner()));
            for vi in held.iter().filter_map(Weak::upgrade) {
                moved |= Vi::poll_progress(vi);
            }
        }
        moved
    }

    /// How long [`wait`](Self::wait) polls before it sleeps (0: sleep at
    /// once; the default is [`DEFAULT_WAIT_SPIN`], as a VI's waits).
    pub fn set_wait_spin(&self, spin: Duration) {
        self.s.spin_ns.store(
            spin.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    /// Makes the longest sleep of a waiter `slice` (tests: a lost wake-up
    /// then shows as a timeout instead of a slice's delay).
    #[cfg(test)]
    pub(crate) fn set_sleep_slice(&self, slice: Duration) {
        self.s
            .slice_ns
            .store(slice.as_nanos() as u64, Ordering::Relaxed);
    }

    /// True while a thread is counted asleep here (tests).
    #[cfg(test)]
    pub(crate) fn has_sleeper(&self) -> bool {
        self.s.sleepers.load(Ordering::SeqCst) + self.s.waiters.load(Ordering::SeqCst) > 0
    }

    /// Waits for a notice (VipCQWait): polls for the wait-spin time, then
    /// sleeps until a VI's peer or another thread makes one (see the
    /// module's notes). `None` waits forever.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<CqCompletion, WaitError> {
        self.wait_unless_interrupted(timeout, self.interrupts())
    }

    /// How many times [`interrupt`](Self::interrupt) was called: taken
    /// before a caller's own look for work and handed to
    /// [`wait_unless_interrupted`](Self::wait_unless_interrupted), an
    /// interrupt that comes between the two still ends the wait.
    pub fn interrupts(&self) -> u32 {
        self.s.kicks.load(Ordering::SeqCst)
    }

    /// [`wait`](Self::wait), ended with [`WaitError::Interrupted`] as soon
    /// as [`interrupts`](Self::interrupts) is no longer `since`.
    pub fn wait_unless_interrupted(
        &self,
        timeout: Option<Duration>,
        since: u32,
    ) -> Result<CqCompletion, WaitError> {
        // A notice already waiting (a send's, made as it was posted) needs
        // neither the clock nor a look at the VIs.
        if !self.s.direct {
            if let Some(c) = self.pop()? {
                return Ok(c);
            }
        }
        let kicked = || self.s.kicks.load(Ordering::SeqCst) != since;
        let start = Instant::now();
        // A timeout too long to add is forever.
        let end = timeout.and_then(|t| start.checked_add(t));
        // The spin is part of the wait: never longer than its timeout.
        let spin = Duration::from_nanos(self.s.spin_ns.load(Ordering::Relaxed))
            .min(timeout.unwrap_or(Duration::MAX));
        // Spin phase: look at the clock every 64 rounds.
        let mut k = 0u32;
        while !spin.is_zero() {
            if let Some(c) = self.done()? {
                return Ok(c);
            }
            // A pause between looks, as in `Vi::wait`.
            spin_loop();
            k = k.wrapping_add(1);
            if k.is_multiple_of(64) {
                if kicked() {
                    return Err(WaitError::Interrupted);
                }
                if start.elapsed() >= spin {
                    break;
                }
            }
        }
        // Sleep phase: arming looks at progress once more, and after a
        // wake-up the notice is usually there for the look that follows.
        let _driving = CountGuard::new(&self.s.in_wait);
        let slice = Duration::from_nanos(self.s.slice_ns.load(Ordering::Relaxed));
        // Each nap that ends with nothing doubles the next, up to
        // IDLE_SLICE: a waiter over many idle shm VIs, each wake-up of which
        // arms and drives them all, wakes a few times a second, not fifty.
        let longest = slice.max(IDLE_SLICE);
        let mut naps = slice;
        let mut look_at_peers = false;
        // One clock read a nap (the first is the one taken above): a wait
        // that a message ends reads the clock once.
        let mut t0 = start;
        let mut first = true;
        loop {
            let nap = match end {
                Some(end) => match end.checked_duration_since(t0) {
                    Some(l) if !l.is_zero() => l.min(naps),
                    _ => return Err(WaitError::Timeout),
                },
                None => naps,
            };
            if kicked() {
                return Err(WaitError::Interrupted);
            }
            if !self.sleep_futex(nap, look_at_peers) {
                self.sleep_poll(nap, first);
                // What woke it is most likely a socket of the ready set.
                self.look_at_set_next();
            }
            first = false;
            if let Some(c) = self.done()? {
                return Ok(c);
            }
            if kicked() {
                return Err(WaitError::Interrupted);
            }
            // A full nap without a wake-up: look at the peers' health next
            // round, and sleep longer.
            let now = Instant::now();
            look_at_peers = now.duration_since(t0) + Duration::from_millis(1) >= nap;
            naps = match look_at_peers {
                true => (naps * 2).min(longest),
                false => slice,
            };
            t0 = now;
        }
    }

    /// Ends every [`wait`](Self::wait) on this CQ under way with
    /// [`WaitError::Interrupted`] (libfabric's `fi_cq_signal`); a wait
    /// that starts afterwards is not affected, unless it was handed an
    /// earlier count ([`wait_unless_interrupted`](Self::wait_unless_interrupted)).
    /// A waiter asleep wakes at once, as for a notice.
    pub fn interrupt(&self) {
        self.s.kicks.fetch_add(1, Ordering::SeqCst);
        self.s.wake_all();
    }

    /// True if a notice is waiting or the walk of a direct CQ finds one.
    fn ready(&self) -> bool {
        if self.s.direct {
            self.walk(|vi, q| vi.head_done(q).then_some(())).is_some()
        } else {
            self.s.queued.load(Ordering::SeqCst) > 0
        }
    }

    /// Sleeps up to `nap` on every attached VI's futex doorbell and the
    /// CQ's word at once, unless something is ready after arming. False if
    /// the VIs cannot be slept on so (network VIs, an old kernel, too many
    /// VIs): nothing was slept, and later waits sleep in `poll`.
    ///
    /// An armed doorbell is never disarmed here: another thread of the
    /// process may sleep on it too (in a VI's own wait), and a doorbell
    /// left armed costs its peer one needless wake call at most.
    fn sleep_futex(&self, nap: Duration, look_at_peers: bool) -> bool {
        if !self.s.futex_ok.load(Ordering::Relaxed) {
            return false;
        }
        // Counted before the members are copied out: a CQ of too many VIs
        // for one futex wait pays no copy of them all on every sleep, and
        // one of a single VI (a program's usual CQ) none at all.
        let one = {
            let m = self.s.lock_members();
            if m.len() >= uvia_shm::doorbell::SLEEP_ANY_MAX {
                return false;
            }
            match &m[..] {
                [w] => w.upgrade(),
                _ => None,
            }
        };
        if let Some(slept) = one.and_then(|vi| self.sleep_futex_one(vi, nap, look_at_peers)) {
            return slept;
        }
        let members = self.s.members();
        if members.len() >= uvia_shm::doorbell::SLEEP_ANY_MAX {
            return false;
        }
        let sleeps: Vec<_> = members.iter().map(Vi::arm_sleep).collect();
        if sleeps.iter().any(|s| s.watch().is_err()) {
            // The VIs of one Nic are all of its provider: this CQ's never
            // sleep on futexes.
            self.s.futex_ok.store(false, Ordering::Relaxed);
            return false;
        }
        let _counted = Counted::new(&self.s, Asleep::Futex);
        // Read after counting: a notice published from here on moves it.
        let seq = self.s.word.load(Ordering::SeqCst);
        // Re-check after arming and counting: a message published before
        // the arm, or a notice before the count, is seen here.
        let mut moved = false;
        for vi in &members {
            moved |= Vi::poll_progress(vi.clone());
            if look_at_peers {
                moved |= Vi::check_peer(vi.clone());
            }
        }
        if moved || self.ready() {
            return true;
        }
        // The VIs with a doorbell (one with no connection has nothing to
        // ring) and the CQ's own word.
        let mut words: Vec<_> = sleeps
            .iter()
            .filter_map(|s| s.watch().ok().flatten())
            .collect();
        words.push(uvia_shm::doorbell::Watch::local(&self.s.word, seq));
        if uvia_shm::doorbell::sleep_any(&words, nap).is_err() {
            // Nothing slept: a kernel before 5.16.
            self.s.futex_ok.store(false, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// [`sleep_futex`](Self::sleep_futex) for a CQ of one VI with a
    /// doorbell: on that alone, as its own waiter sleeps (plain FUTEX_WAIT,
    /// where futex_waitv allocates and parses a vector in the kernel on
    /// every sleep), with no list made or freed on the way. `None` for a VI
    /// with nothing to ring it (no connection): the general path sleeps on
    /// the CQ's word.
    fn sleep_futex_one(
        &self,
        vi: Arc<ViShared>,
        nap: Duration,
        look_at_peers: bool,
    ) -> Option<bool> {
        let sleep = Vi::arm_sleep(&vi);
        match sleep.watch() {
            Ok(Some(_)) => {}
            // Not a futex doorbell: this CQ's VIs never sleep on futexes.
            Err(()) => {
                self.s.futex_ok.store(false, Ordering::Relaxed);
                return Some(false);
            }
            Ok(None) => return None,
        }
        let _counted = Counted::new(&self.s, Asleep::Futex);
        // Re-check after arming and counting: a message published before
        // the arm, or a notice before the count, is seen here.
        let mut moved = Vi::poll_progress(vi.clone());
        if look_at_peers {
            moved |= Vi::check_peer(vi);
        }
        if moved || self.ready() {
            return Some(true);
        }
        // Another thread's notice rings the doorbell itself, through
        // `lone`: set before the re-check below, so that a notice the
        // re-check misses finds it.
        *self.s.lone.lock().unwrap_or_else(|e| e.into_inner()) = Some(sleep.clone());
        if !self.ready() {
            sleep.sleep(&self.s.nic, nap);
        }
        *self.s.lone.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Some(true)
    }

    /// Sleeps up to `nap` in `poll` on the eventfd and the attached VIs'
    /// sockets, unless something is ready after arming. A network VI's
    /// timers run here when nothing woke the sleeper (its waiter is then
    /// its only driver); a frame's wake-up goes to the frame first, and
    /// progress looks at the timers every few calls.
    ///
    /// With `in_recv` (a wait's first sleep), a CQ of one network VI sleeps
    /// in that VI's receive instead, where it can ([`Self::sleep_in_recv`]).
    fn sleep_poll(&self, nap: Duration, in_recv: bool) {
        let _counted = Counted::new(&self.s, Asleep::Poll);
        let mut own = Scratch::default();
        let mut kept = self.s.scratch.try_lock().ok();
        let sc = kept.as_deref_mut().unwrap_or(&mut own);
        self.sleep_poll_with(nap, in_recv, sc);
        sc.members.clear();
        sc.fds.clear();
    }

    fn sleep_poll_with(&self, nap: Duration, in_recv: bool, sc: &mut Scratch) {
        // Network VIs have no doorbell: their frames wake the waiter
        // through their sockets (or the ready set that holds them), and
        // their timers a look when the first is due.
        let set = self.ready_set().and_then(|r| match &*r {
            Ready::Set { set, .. } => Some(set.fd()),
            _ => None,
        });
        let mut ready = false;
        match set {
            // The ready set's VIs need no arming (their sockets wake the
            // sleeper through the set): only frames they hold back for a
            // burst are sent first, and a wake-up costs no walk of them all.
            Some(_) => ready |= self.progress_held(),
            None => {
                sc.members
                    .extend(self.s.lock_members().iter().filter_map(Weak::upgrade));
                for vi in &sc.members {
                    ready |= Vi::arm_eventfd(vi.clone());
                }
            }
        }
        if ready || self.ready() {
            return;
        }
        if in_recv
            && set.is_none()
            && sc.members.len() == 1
            && self.sleep_in_recv(&sc.members[0], nap)
        {
            return;
        }
        let pollin = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        sc.fds.push(pollin(self.s.efd.as_raw_fd()));
        // The Nic's medium may keep its socket readable with entries taken
        // but not yet given back.
        self.s.nic.provider.settle();
        match set {
            Some(fd) => sc.fds.push(pollin(fd)),
            None => sc
                .fds
                .extend(sc.members.iter().filter_map(Vi::wake_fd).map(pollin)),
        }
        // Network VIs' timers: no later than the first one due.
        let cap = match sc.fds.len() > 1 {
            false => nap,
            true => self
                .s
                .nic
                .provider
                .timers_due_in()
                .map_or(nap, |due| nap.min(due)),
        };
        // Rounded up: a sub-millisecond nap must not become a busy loop.
        let ms = cap.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: `fds` holds `fds.len()` valid pollfds.
        let n = unsafe { libc::poll(sc.fds.as_mut_ptr(), sc.fds.len() as libc::nfds_t, ms) };
        if sc.fds[0].revents & libc::POLLIN != 0 {
            self.drain_eventfd();
        }
        if n == 0 && sc.fds.len() > 1 {
            match set {
                Some(_) => self.s.nic.provider.run_due_timers(),
                None => {
                    for vi in sc.members.drain(..) {
                        Vi::run_timers(vi);
                    }
                }
            }
        }
    }

    /// Sleeps in the receive of `vi`, this CQ's one member, which takes in
    /// what arrives ([`Vi::sleep_in_recv`]): one system call where `poll`
    /// and a receive are two, about 7% of a blocking ping-pong's round
    /// trip. False if the VI cannot or this CQ no longer sleeps so.
    ///
    /// What it gives up, and how little: the eventfd does not wake such a
    /// sleep. A notice another thread makes meanwhile waits for the sleep's
    /// end (a kernel tick or two) and turns these sleeps off for the CQ for
    /// good ([`CqShared::wake`]). The kernel bounds the sleep in whole
    /// ticks, so only a wait's first sleep is made so, with 10 ms of the
    /// wait left at least, and the VI lends its receive only while its
    /// frames arrive without loss (a retransmission's timer is not kept
    /// waiting a tick).
    fn sleep_in_recv(&self, vi: &Arc<ViShared>, nap: Duration) -> bool {
        if !self.s.recv_ok.load(Ordering::Relaxed) {
            return false;
        }
        // Counted before the last look at the notices: a notice published
        // after it finds the count (see `wake`).
        let _in_recv = CountGuard::new(&self.s.recv_sleepers);
        if self.ready() {
            return true;
        }
        Vi::sleep_in_recv(vi, nap).is_some()
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
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    #[test]
    fn notices_name_each_vi_in_completion_order() {
        let nic = Nic::open("shm").unwrap();
        let cq = nic.create_cq(16).unwrap();
        let (a1, b1) = connected_pair_with(&nic, Some(&cq));
        let (a2, b2) = connected_pair_with(&nic, Some(&cq));
        let (r1, r2) = (b1.recv_buf(), b2.recv_buf());
        // The words an API layer keeps with its VIs (VIPL: their handles).
        b1.vi.set_tag(0x1111);
        b2.vi.clone().set_tag(0x2222);
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
        // Each notice's VI reads back the word kept with it.
        for n in [&n1, &n2] {
            let want = if n.vi.id() == b1.vi.id() {
                0x1111
            } else {
                0x2222
            };
            assert_eq!(n.vi.tag(), want, "VI {}", n.vi.id());
        }
        assert_eq!(a1.vi.tag(), 0, "a VI nobody tagged");
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

    /// One end of [`pair_on_cq`]: its VI, NIC and a region of 16 slots of
    /// 64 bytes, each slot's receive posted.
    struct End {
        vi: Vi,
        nic: Nic,
        ptag: Ptag,
        buf: MemoryRegion,
    }

    const SLOT: usize = 64;
    const SLOTS: usize = 16;

    /// A server VI on `name` with both queues on the CQ `cq_of` makes,
    /// connected from a client VI of a NIC of its own (shm: the same NIC).
    /// Returns (client, server, CQ).
    /// A VI of `nic` with its queues on the given CQs and a receive
    /// posted in each of its buffer's slots.
    fn end_on(nic: &Nic, send_cq: Option<&Cq>, recv_cq: Option<&Cq>) -> End {
        let ptag = nic.create_ptag().unwrap();
        let vi = nic
            .create_vi(ViAttributes::new(ptag), send_cq, recv_cq)
            .unwrap();
        let buf = nic
            .alloc_region(SLOT * SLOTS, MemAttributes::new(ptag))
            .unwrap();
        for k in 0..SLOTS {
            vi.post_recv(Box::new(Descriptor::recv(&[buf.segment(k * SLOT, SLOT)])))
                .unwrap();
        }
        End {
            vi,
            nic: nic.clone(),
            ptag,
            buf,
        }
    }

    fn pair_on_cq(name: &str, cq_of: impl Fn(&Nic) -> Cq) -> (End, End, Cq) {
        let sn = Nic::open(name).unwrap();
        let cn = if sn.attributes().host_local {
            sn.clone()
        } else {
            Nic::open(name).unwrap()
        };
        let cq = cq_of(&sn);
        let (server, client) = (end_on(&sn, Some(&cq), Some(&cq)), end_on(&cn, None, None));
        // One discriminator per pair: tests run side by side in one process.
        static PAIRS: AtomicU64 = AtomicU64::new(0);
        let disc = Discriminator::from_u64(
            (std::process::id() as u64) << 32 | 0x5eeb_0000 | PAIRS.fetch_add(1, Ordering::Relaxed),
        );
        let (n2, s2, d2) = (sn.clone(), server.vi.clone(), disc.clone());
        let t = std::thread::spawn(move || {
            let mut req = n2.connect_wait(&d2, Some(Duration::from_secs(5))).unwrap();
            req.accept(&s2).unwrap();
            n2.stop_listening(&d2);
        });
        client
            .vi
            .connect_request(
                &NetAddress::new(&sn.attributes().address, disc),
                Duration::from_secs(5),
            )
            .unwrap();
        t.join().unwrap();
        (client, server, cq)
    }

    /// Posts round `i` (4 bytes) from slot `i` of `buf`.
    fn post_round(vi: &Vi, buf: &mut MemoryRegion, i: u32) {
        let at = i as usize % SLOTS * SLOT;
        buf.as_mut_slice()[at..at + 4].copy_from_slice(&i.to_le_bytes());
        vi.post_send(Box::new(Descriptor::send(&[buf.segment(at, 4)])))
            .unwrap();
    }

    /// Takes the completed receive of round `i` on `e` (slot `i`), checks
    /// it carried `i`, and posts the slot again.
    fn take_round(e: &End, i: u32) {
        let d = e.vi.recv_done().expect("the notice names a receive");
        assert_eq!(d.result(), Ok(4));
        let at = i as usize % SLOTS * SLOT;
        let got = u32::from_le_bytes(e.buf.as_slice()[at..at + 4].try_into().unwrap());
        assert_eq!(got, i);
        e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(at, SLOT)])))
            .unwrap();
    }

    /// A CQ whose waits sleep at once, with a slice too long for a lost
    /// wake-up to hide in.
    fn sleepy_cq(nic: &Nic) -> Cq {
        let cq = nic.create_cq(64).unwrap();
        cq.set_wait_spin(Duration::ZERO);
        cq.set_sleep_slice(Duration::from_secs(60));
        cq
    }

    /// A wait that a wake-up ends: one that was lost would sleep the
    /// whole 60 s slice (as the doorbell's tests, a bound no scheduler
    /// delay comes near).
    fn woken_wait(cq: &Cq, round: u32) -> CqCompletion {
        let start = std::time::Instant::now();
        let c = cq.wait(None).unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "round {round}: the waiter slept its whole slice (a lost wake-up)"
        );
        c
    }

    /// Waits until a thread is counted asleep on `cq`; then, every other
    /// round, a moment more (it is in the kernel), else at once (racing
    /// its arming).
    fn until_asleep(cq: &Cq, round: u32) {
        let start = std::time::Instant::now();
        while !cq.has_sleeper() {
            assert!(start.elapsed() < Duration::from_secs(30), "never slept");
            std::thread::yield_now();
        }
        if round.is_multiple_of(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A second VI on the server's NIC and `cq`, never connected: the
    /// waiter then sleeps on several things at once (on shm, its one
    /// doorbell and the CQ's word in one `futex_waitv`).
    fn idle_vi_on(server: &End, cq: &Cq) -> Vi {
        server
            .nic
            .create_vi(ViAttributes::new(server.ptag), Some(cq), Some(cq))
            .unwrap()
    }

    /// The peer's message wakes a waiter that went to sleep before it
    /// came, round after round; with `idle`, a second VI shares the CQ.
    fn waiter_is_woken_by_each_message(name: &str, idle: bool) {
        let (client, server, cq) = pair_on_cq(name, sleepy_cq);
        let _idle = idle.then(|| idle_vi_on(&server, &cq));
        const ROUNDS: u32 = 200;
        let cq2 = cq.clone();
        let (vi, nic, ptag) = (client.vi.clone(), client.nic.clone(), client.ptag);
        let peer = std::thread::spawn(move || {
            let mut out = nic
                .alloc_region(SLOT * SLOTS, MemAttributes::new(ptag))
                .unwrap();
            for i in 0..ROUNDS {
                until_asleep(&cq2, i);
                post_round(&vi, &mut out, i);
                let d = vi.send_wait(Some(Duration::from_secs(10))).unwrap();
                assert_eq!(d.result(), Ok(4), "round {i}");
            }
        });
        for i in 0..ROUNDS {
            let c = woken_wait(&cq, i);
            assert_eq!((c.vi.id(), c.queue), (server.vi.id(), Queue::Recv));
            take_round(&server, i);
        }
        // The last send completes when this side acknowledges it (udp).
        while !peer.is_finished() {
            server.vi.drive();
            std::thread::sleep(Duration::from_millis(1));
        }
        peer.join().unwrap();
        client.vi.disconnect();
    }

    #[test]
    fn a_sleeping_waiter_is_woken_by_each_message_shm() {
        waiter_is_woken_by_each_message("shm", false);
        waiter_is_woken_by_each_message("shm", true);
    }

    /// On udp a sleep lasts 1 ms at most (the protocol's timers), so a
    /// lost wake-up would cost that much, not the slice: the rounds show
    /// that every message is handed over, in order, to a sleeping waiter.
    #[test]
    fn a_sleeping_waiter_is_woken_by_each_message_udp() {
        waiter_is_woken_by_each_message("udp:127.0.0.1", false);
        waiter_is_woken_by_each_message("udp:127.0.0.1", true);
    }

    /// A notice made by another thread of the process (a send that
    /// completes in the thread that posts it) wakes a waiter asleep on the
    /// VIs' doorbells, which no peer rings meanwhile: asleep on its one
    /// VI's doorbell alone, and with a second VI on the CQ.
    #[test]
    fn a_notice_made_by_another_thread_wakes_the_sleeper() {
        notice_of_another_thread_wakes(false);
        notice_of_another_thread_wakes(true);
    }

    fn notice_of_another_thread_wakes(idle: bool) {
        let (client, mut server, cq) = pair_on_cq("shm", sleepy_cq);
        let _idle = idle.then(|| idle_vi_on(&server, &cq));
        const ROUNDS: u32 = 50;
        let (cq2, vi, nic, ptag) = (
            cq.clone(),
            server.vi.clone(),
            server.nic.clone(),
            server.ptag,
        );
        let poster = std::thread::spawn(move || {
            let mut out = nic
                .alloc_region(SLOT * SLOTS, MemAttributes::new(ptag))
                .unwrap();
            for i in 0..ROUNDS {
                until_asleep(&cq2, i);
                post_round(&vi, &mut out, i);
            }
        });
        for i in 0..ROUNDS {
            let c = woken_wait(&cq, i);
            assert_eq!((c.vi.id(), c.queue), (server.vi.id(), Queue::Send));
            let d = server.vi.send_done().expect("the notice names a send");
            assert_eq!(d.result(), Ok(4));
            // The client takes each message, so that no ring fills.
            let start = std::time::Instant::now();
            loop {
                if client.vi.recv_done().is_some() {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "round {i} never arrived"
                );
            }
            let at = i as usize % SLOTS * SLOT;
            client
                .vi
                .post_recv(Box::new(Descriptor::recv(&[client.buf.segment(at, SLOT)])))
                .unwrap();
        }
        poster.join().unwrap();
        server.buf.as_mut_slice()[0] = 0;
        client.vi.disconnect();
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

    /// A CQ of many shm VIs polls the members that moved lately every time
    /// and the quiet ones in turn: a busy member's next message is found
    /// by the next poll, a quiet member's within its turn, and every
    /// member's messages arrive, once each.
    #[test]
    fn a_cq_of_many_shm_vis_polls_the_busy_ones_first_and_each_in_turn() {
        const PAIRS: usize = 2 * super::ROTA_FROM;
        let nic = Nic::open("shm").unwrap();
        let cq = nic.create_cq(256).unwrap();
        let servers: Vec<End> = (0..PAIRS).map(|_| end_on(&nic, None, Some(&cq))).collect();
        let mut clients: Vec<End> = (0..PAIRS).map(|_| end_on(&nic, None, None)).collect();
        let disc = Discriminator::from_u64((std::process::id() as u64) << 32 | 0x40fa_0001);
        let (n2, d2) = (nic.clone(), disc.clone());
        let vis: Vec<Vi> = servers.iter().map(|e| e.vi.clone()).collect();
        let t = std::thread::spawn(move || {
            for vi in &vis {
                let mut req = n2.connect_wait(&d2, Some(Duration::from_secs(5))).unwrap();
                req.accept(vi).unwrap();
            }
        });
        for c in &clients {
            c.vi.connect_request(&NetAddress::new("0", disc.clone()), Duration::from_secs(5))
                .unwrap();
        }
        t.join().unwrap();
        let ids: Vec<u32> = servers.iter().map(|e| e.vi.id()).collect();
        let index = |vi: &Vi| ids.iter().position(|&id| id == vi.id()).unwrap();
        // Polls until a notice comes; returns it with the polls it took.
        let until_notice = |limit: usize| -> (CqCompletion, usize) {
            for polls in 1..=limit {
                if let Some(n) = cq.done().unwrap() {
                    return (n, polls);
                }
            }
            panic!("no notice within {limit} polls");
        };
        // A message on every member: each arrives once.
        for c in clients.iter_mut() {
            post_round(&c.vi, &mut c.buf, 0);
        }
        let mut seen = [false; PAIRS];
        for _ in 0..PAIRS {
            let (n, _) = until_notice(100_000);
            let i = index(&n.vi);
            assert!(!seen[i], "member {i} named twice");
            seen[i] = true;
            take_round(&servers[i], 0);
        }
        assert!(cq.done().unwrap().is_none());
        // A busy pair among quiet ones: each of its messages after the
        // first is found by the first poll.
        for _ in 0..super::QUIET_AFTER {
            assert!(cq.done().unwrap().is_none());
        }
        let busy = 5;
        for k in 1..50u32 {
            let c = &mut clients[busy];
            post_round(&c.vi, &mut c.buf, k);
            let (n, polls) = until_notice(100_000);
            assert_eq!(index(&n.vi), busy);
            if k > 1 {
                assert_eq!(polls, 1, "message {k} of the busy member");
            }
            take_round(&servers[busy], k);
        }
        // A quiet member's message is found within its turn, with the
        // polls between looks at quiet members at their slowest.
        for _ in 0..super::QUIET_AFTER * super::QUIET_EVERY {
            assert!(cq.done().unwrap().is_none());
        }
        let quiet = PAIRS - 3;
        let c = &mut clients[quiet];
        post_round(&c.vi, &mut c.buf, 1);
        let turn = (PAIRS + 1) * super::QUIET_EVERY as usize;
        let (n, polls) = until_notice(turn);
        assert_eq!(index(&n.vi), quiet);
        eprintln!("the quiet member's message was found by poll {polls} of at most {turn}");
        take_round(&servers[quiet], 1);
    }

    /// A server of many udp VIs on one CQ (its ready list): every client's
    /// burst reaches it, and its own bursts of replies to one VI, held back
    /// to leave together, reach the client without anything else arriving
    /// on that VI's socket to drive them (the last of them would wait for
    /// a timer or for ever if the CQ's polls did not drive held frames).
    #[test]
    fn a_cq_of_many_udp_vis_serves_each_through_its_ready_list() {
        const PAIRS: usize = 12;
        const BURST: u32 = 3;
        let (cq, mut servers, mut clients) = udp_pairs_on_one_cq(PAIRS, 0x4ead_1157);
        // Each client sends a burst; the server answers each message at once.
        for (i, c) in clients.iter_mut().enumerate() {
            for k in 0..BURST {
                post_round(&c.vi, &mut c.buf, (i as u32) << 8 | k);
            }
        }
        let ids: Vec<u32> = servers.iter().map(|e| e.vi.id()).collect();
        let index = |vi: &Vi| ids.iter().position(|&id| id == vi.id()).unwrap();
        let mut got = vec![0u32; PAIRS];
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while got.iter().sum::<u32>() < PAIRS as u32 * BURST {
            assert!(
                std::time::Instant::now() < deadline,
                "the server got {got:?}"
            );
            // The clients' programs poll too: their bursts leave then.
            for c in &clients {
                if let Some(d) = c.vi.send_done() {
                    assert_eq!(d.result(), Ok(4));
                }
            }
            let Some(n) = cq.done().unwrap() else {
                continue;
            };
            let i = index(&n.vi);
            let d = n.vi.recv_done().unwrap();
            assert_eq!(d.result(), Ok(4));
            let seg = d.ds[0];
            let at = seg.addr as usize - servers[i].buf.addr() as usize;
            let v = u32::from_le_bytes(servers[i].buf.as_slice()[at..at + 4].try_into().unwrap());
            assert_eq!(v, (i as u32) << 8 | got[i], "VI {i}'s messages in order");
            got[i] += 1;
            n.vi.post_recv(Box::new(Descriptor::recv(&[seg]))).unwrap();
            // Two replies back to back: the second is held for a burst.
            // (Each from a slot of its own: a held frame is copied out
            // when it leaves.)
            let e = &mut servers[i];
            post_round(&e.vi, &mut e.buf, 0x8000 | v);
            post_round(&e.vi, &mut e.buf, 0x4008 | v);
        }
        assert!(
            cq.s.ready_on.load(std::sync::atomic::Ordering::Relaxed),
            "{PAIRS} network VIs: the CQ polls through its ready list"
        );
        // One poll sends what the server's VIs held back, as a walk over
        // every VI would: nothing waits for a timer or another arrival.
        cq.done().unwrap();
        for (i, e) in servers.iter().enumerate() {
            assert_eq!(crate::provider::net::held_frames(&e.vi), 0, "VI {i}");
        }
        // Every reply arrives; the server keeps polling its CQ meanwhile
        // (as a server does), which is what sends held-back replies.
        for (i, c) in clients.iter().enumerate() {
            for k in (0..BURST).flat_map(|k| [0x8000 | k, 0x4008 | k]) {
                let d = loop {
                    if let Some(d) = c.vi.recv_done() {
                        break d;
                    }
                    assert!(std::time::Instant::now() < deadline, "VI {i}'s reply {k}");
                    let _ = cq.done().unwrap();
                };
                assert_eq!(d.result(), Ok(4));
                let at = d.ds[0].addr as usize - c.buf.addr() as usize;
                let v = u32::from_le_bytes(c.buf.as_slice()[at..at + 4].try_into().unwrap());
                assert_eq!(v, (i as u32) << 8 | k, "VI {i}'s replies in order");
            }
        }
    }

    /// `pairs` udp VI pairs on loopback, the servers' receives all on one
    /// CQ (which polls through its ready list from `READY_SET_FROM`
    /// members up), connected: the CQ, the servers and the clients.
    fn udp_pairs_on_one_cq(pairs: usize, tag: u64) -> (Cq, Vec<End>, Vec<End>) {
        let sn = Nic::open("udp:127.0.0.1").unwrap();
        let cn = Nic::open("udp:127.0.0.1").unwrap();
        let cq = sn.create_cq(256).unwrap();
        let servers: Vec<End> = (0..pairs).map(|_| end_on(&sn, None, Some(&cq))).collect();
        let clients: Vec<End> = (0..pairs).map(|_| end_on(&cn, None, None)).collect();
        let disc = Discriminator::from_u64((std::process::id() as u64) << 32 | tag);
        let (n2, d2) = (sn.clone(), disc.clone());
        let vis: Vec<Vi> = servers.iter().map(|e| e.vi.clone()).collect();
        let t = std::thread::spawn(move || {
            for vi in &vis {
                let mut req = n2.connect_wait(&d2, Some(Duration::from_secs(5))).unwrap();
                req.accept(vi).unwrap();
            }
            n2.stop_listening(&d2);
        });
        for c in &clients {
            c.vi.connect_request(
                &NetAddress::new(&sn.attributes().address, disc.clone()),
                Duration::from_secs(5),
            )
            .unwrap();
        }
        t.join().unwrap();
        (cq, servers, clients)
    }

    /// A busy udp pair among quiet ones on a CQ with a ready list: its VI
    /// is polled directly by every poll, so its message is found by the
    /// first poll after it arrived while the set is looked at only every
    /// QUIET_EVERY polls (found through the set, each message made every
    /// poll look at it: an `epoll_wait` more per poll and per message).
    #[test]
    fn a_busy_udp_vi_among_quiet_ones_is_found_by_the_first_poll() {
        const PAIRS: usize = 2 * super::READY_SET_FROM;
        let (cq, servers, mut clients) = udp_pairs_on_one_cq(PAIRS, 0x4ead_b057);
        let ids: Vec<u32> = servers.iter().map(|e| e.vi.id()).collect();
        let index = |vi: &Vi| ids.iter().position(|&id| id == vi.id()).unwrap();
        // Looks at the set that find nothing: from here on the set is
        // looked at every QUIET_EVERY polls.
        for _ in 0..super::QUIET_AFTER {
            assert!(cq.done().unwrap().is_none());
        }
        let looks = || match &*cq.s.ready.lock().unwrap() {
            super::Ready::Set { set, .. } => set.looks(),
            _ => 0,
        };
        let busy = 5;
        // Counted after the first messages: one found by a look makes
        // the looks come every poll again until QUIET_AFTER of them have
        // found nothing.
        let (warm, rounds) = (2 * super::QUIET_AFTER, 100u32);
        let (mut first_poll, mut all_polls, mut all_looks) = (0, 0, 0);
        for k in 0..warm + rounds {
            let c = &mut clients[busy];
            post_round(&c.vi, &mut c.buf, k);
            // A post close behind the last one is held for a burst until
            // the program's next done call; acks of the last sends come
            // in with it.
            while c.vi.send_done().is_some() {}
            let looks_before = looks();
            let mut polls = 0;
            let n = loop {
                polls += 1;
                assert!(polls < 1_000_000, "message {k} never found");
                if let Some(n) = cq.done().unwrap() {
                    break n;
                }
            };
            assert_eq!(index(&n.vi), busy);
            take_round(&servers[busy], k);
            if k >= warm {
                first_poll += usize::from(polls == 1);
                all_polls += polls;
                all_looks += looks() - looks_before;
            }
        }
        assert!(
            cq.s.ready_on.load(std::sync::atomic::Ordering::Relaxed),
            "{PAIRS} network VIs: the CQ polls through its ready list"
        );
        // A frame sent on loopback is in the socket when the send returns;
        // a few may still come late on a busy host.
        assert!(
            first_poll as u32 >= rounds * 9 / 10,
            "{first_poll} of {rounds} messages found by the first poll"
        );
        // Found without the set: its looks stayed at one every
        // QUIET_EVERY polls (a look at every poll costs the system call
        // the direct polls save).
        assert!(
            all_looks * super::QUIET_EVERY as u64 <= all_polls as u64 + rounds as u64 / 4,
            "{all_looks} looks at the set in {all_polls} polls"
        );
    }

    /// Two threads polling one CQ of many udp VIs (through its ready list,
    /// whose hot members both keep, outside the set's lock) take every
    /// message, none twice.
    #[test]
    fn two_threads_polling_a_cq_of_many_udp_vis_take_every_message_once() {
        use std::sync::atomic::AtomicBool;
        use std::sync::{Arc, Mutex};
        const PAIRS: usize = 12;
        const BURST: u32 = 8;
        const ROUNDS: u32 = 30;
        let (cq, servers, mut clients) = udp_pairs_on_one_cq(PAIRS, 0x4ead_2707);
        let ids: Arc<Vec<u32>> = Arc::new(servers.iter().map(|e| e.vi.id()).collect());
        let got: Arc<Mutex<Vec<Vec<u32>>>> = Arc::new(Mutex::new(vec![Vec::new(); PAIRS]));
        let stop = Arc::new(AtomicBool::new(false));
        let bases: Arc<Vec<usize>> =
            Arc::new(servers.iter().map(|e| e.buf.addr() as usize).collect());
        let pollers: Vec<_> = (0..2)
            .map(|_| {
                let (cq, ids, got, stop, bases) = (
                    cq.clone(),
                    ids.clone(),
                    got.clone(),
                    stop.clone(),
                    bases.clone(),
                );
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let Some(n) = cq.done().unwrap() else {
                            continue;
                        };
                        let i = ids.iter().position(|&id| id == n.vi.id()).unwrap();
                        let d = n.vi.recv_done().expect("the notice names a receive");
                        assert_eq!(d.result(), Ok(4));
                        let seg = d.ds[0];
                        let at = seg.addr as usize - bases[i];
                        // SAFETY: the receive completed into this slot of the
                        // server's region, which lives until the test ends;
                        // it is posted again only after this read.
                        let v = unsafe { std::ptr::read_unaligned((bases[i] + at) as *const u32) };
                        got.lock().unwrap()[i].push(v);
                        n.vi.post_recv(Box::new(Descriptor::recv(&[seg]))).unwrap();
                    }
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        for r in 0..ROUNDS {
            for (i, c) in clients.iter_mut().enumerate() {
                for k in 0..BURST {
                    post_round(&c.vi, &mut c.buf, (i as u32) << 16 | (r * BURST + k));
                }
            }
            // Each round whole before the next: no VI is sent more than its
            // posted receives.
            let want = ((r + 1) * BURST) as usize;
            while got.lock().unwrap().iter().any(|v| v.len() < want) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "round {r} never arrived"
                );
                for c in &clients {
                    while c.vi.send_done().is_some() {}
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        for p in pollers {
            p.join().unwrap();
        }
        for (i, v) in got.lock().unwrap().iter_mut().enumerate() {
            v.sort_unstable();
            let want: Vec<u32> = (0..ROUNDS * BURST).map(|k| (i as u32) << 16 | k).collect();
            assert_eq!(*v, want, "VI {i}: every message once");
        }
    }
}
