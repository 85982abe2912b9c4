//! Completion queues: a direct uvia CQ of the domain's Nic (one that keeps
//! no notices) that both queues of each bound endpoint report to. A read
//! takes completed descriptors straight off the endpoints' queues (the VI's
//! done call, which also drives the provider's progress) and writes the
//! entries in the format the program asked for. Every posted operation is an [`Op`]: the descriptor
//! and what the completion must hand back.

use crate::defer::Deferred;
use crate::domain::Domain;
use crate::guard::{self, lock};
use crate::inject::Bounce;
use crate::nosys;
use crate::sys::*;
use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use uvia::{status, BiasedLock, Broken, CountGuard, Descriptor, Queue, SpinLock, Vi};

/// One posted operation: the descriptor first, so the descriptor a done
/// call hands back is the operation.
#[repr(C)]
pub struct Op {
    pub desc: Descriptor,
    pub context: *mut c_void,
    /// Completion flags (`FI_SEND | FI_MSG`, `FI_RMA | FI_WRITE`, ...).
    pub flags: u64,
    /// Bytes the operation moves (a receive's come from the descriptor).
    pub len: usize,
    /// The receive buffer, for `FI_CQ_FORMAT_DATA`.
    pub buf: *mut c_void,
    /// The bounce buffers an injected operation's bytes sit in (NULL for
    /// none) and its slot there, given back when it completes.
    pub bounce: *const Bounce,
    pub slot: u32,
    /// Completes without an entry (`fi_inject*`); a failure still writes
    /// an error entry.
    pub silent: bool,
    /// The pool the operation sits in and its slot there, set by
    /// [`OpPool::post`].
    pool: *const OpPool,
    index: u32,
}

impl Op {
    /// An operation that hands `context` back with `flags` when `desc`
    /// completes.
    pub fn new(desc: Descriptor, context: *mut c_void, flags: u64, len: usize) -> Op {
        Op {
            desc,
            context,
            flags,
            len,
            buf: std::ptr::null_mut(),
            bounce: std::ptr::null(),
            slot: 0,
            silent: false,
            pool: std::ptr::null(),
            index: 0,
        }
    }

    /// Takes back the operation of a descriptor [`OpPool::post`] gave up:
    /// what its completion entry needs, read in place; its slot in the
    /// pool and its bounce slot go back (the descriptor is done with both).
    ///
    /// # Safety
    /// `d` came from [`OpPool::post`] and the queue has handed it back or
    /// refused it; the pool and the bounce buffers are still there (an
    /// endpoint takes back all its descriptors before it frees them).
    pub unsafe fn take(d: NonNull<Descriptor>) -> Taken {
        // SAFETY: per the contract the slot holds an Op, the descriptor its
        // first field, ours until its index goes back below.
        let op = unsafe { &*d.cast::<Op>().as_ptr() };
        let t = Taken {
            context: op.context,
            flags: op.flags,
            len: op.len,
            buf: op.buf,
            silent: op.silent,
            status: op.desc.cs.status,
            length: op.desc.cs.length,
            immediate: op.desc.cs.immediate_data,
        };
        // SAFETY: per the contract.
        if let Some(b) = unsafe { op.bounce.as_ref() } {
            b.release(op.slot);
        }
        // SAFETY: per the contract.
        if let Some(p) = unsafe { op.pool.as_ref() } {
            p.release(op.index);
        }
        t
    }
}

/// What a completion entry needs of an operation taken back.
pub struct Taken {
    pub context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub silent: bool,
    /// The descriptor's status, length and immediate data.
    pub status: u32,
    pub length: u32,
    pub immediate: u32,
}

impl Taken {
    /// False for an operation that completes without an entry and
    /// succeeded (an inject).
    pub fn has_entry(&self) -> bool {
        !self.silent || self.status & status::ERROR_MASK != 0
    }
}

/// The operations of one of an endpoint's queues: a slot for each entry of
/// the VI's queue, made when the endpoint is enabled, so that a post
/// allocates nothing (a boxed `Op`, 64-byte aligned like its descriptor,
/// took malloc's slow aligned path on every message). A post that finds
/// every slot in use finds its queue full as well.
///
/// A slot is claimed by setting its flag, from a cursor that follows the
/// last claim or the last slot given back (either is almost always free),
/// and given back with a plain store: the lock and list a free list needs
/// were four atomic read-modify-writes a message, two on each side.
/// Claims are serialized by a biased lock ([`BiasedLock`]): the thread
/// that posts takes it with a store and a load, where a compare-and-swap
/// of the flag was a locked instruction on the path of every `fi_recv`.
pub struct OpPool {
    slots: Box<[UnsafeCell<MaybeUninit<Op>>]>,
    busy: Box<[AtomicBool]>,
    /// Where the next claim starts looking (a hint: any value is safe).
    next: AtomicUsize,
    /// Held while a claim looks for a free flag and sets it.
    claiming: BiasedLock<()>,
}

// SAFETY: a slot is touched only by whoever took its index off `free`: the
// poster, then the queue, then the CQ read that takes it back and returns
// the index; the free list is under its lock.
unsafe impl Sync for OpPool {}
// SAFETY: as for Sync; the pool owns its slots.
unsafe impl Send for OpPool {}

impl OpPool {
    /// Room for `slots` operations in flight.
    pub fn new(slots: u32) -> OpPool {
        OpPool {
            // Written once here, so that `post_with` may fill a slot in
            // place.
            slots: (0..slots)
                .map(|_| {
                    UnsafeCell::new(MaybeUninit::new(Op::new(
                        Descriptor::default(),
                        std::ptr::null_mut(),
                        0,
                        0,
                    )))
                })
                .collect(),
            busy: (0..slots).map(|_| AtomicBool::new(false)).collect(),
            next: AtomicUsize::new(0),
            claiming: {
                let l = BiasedLock::new(());
                l.allow_bias(true);
                l
            },
        }
    }

    /// Takes a free slot; `None` when every slot is in use.
    fn claim(&self) -> Option<u32> {
        // Only claims set a flag, one at a time; `release` only clears one
        // that is set.
        let _claiming = self.claiming.lock();
        let n = self.busy.len();
        // No `%` on the path: a division costs more than the rest.
        let mut i = self.next.load(Ordering::Relaxed);
        for _ in 0..n {
            if i >= n {
                i = 0;
            }
            let b = &self.busy[i];
            // Acquire: the slot's last user gave it back (Release in
            // `release`) after it last read the operation there.
            if !b.load(Ordering::Acquire) {
                b.store(true, Ordering::Relaxed);
                self.next.store(i + 1, Ordering::Relaxed);
                return Some(i as u32);
            }
            i += 1;
        }
        None
    }

    /// Gives slot `i` back, its operation read, and makes it the next
    /// claim's first look: a ping-pong then reuses one slot, warm in the
    /// cache, where following the cursor walked all of them (a slot is
    /// three cache lines; a pool of 512 is 96 KiB, more than the L1).
    fn release(&self, i: u32) {
        self.busy[i as usize].store(false, Ordering::Release);
        self.next.store(i as usize, Ordering::Relaxed);
    }

    /// Fills a free slot in place with `fill` and gives up the slot to the
    /// queue (taken back with [`Op::take`]): the receive path's post, which
    /// writes the few fields a one-buffer receive needs instead of moving a
    /// whole operation (a 128-byte descriptor) through three copies. `fill`
    /// gets a slot that held an earlier operation (or a blank one) and must
    /// set every field the completion reads. `None` when every slot is in use.
    pub fn post_with(&self, fill: impl FnOnce(&mut Op)) -> Option<NonNull<Descriptor>> {
        let i = self.claim()?;
        let slot = self.slots[i as usize].get();
        // SAFETY: the index came off the free list, so the slot is ours
        // alone; every slot was written once when the pool was made
        // (`new`), so it holds an initialised Op.
        unsafe {
            let op = (*slot).assume_init_mut();
            fill(op);
            op.pool = self;
            op.index = i;
            Some(NonNull::new_unchecked(slot as *mut Descriptor))
        }
    }

    /// Places `op` in a free slot and gives up the slot to the queue
    /// (taken back with [`Op::take`]); hands `op` back when every slot is
    /// in use.
    // The rejected operation comes back whole (its bounce slot is still
    // taken); boxing it would put an allocation back on the path.
    #[allow(clippy::result_large_err)]
    pub fn post(&self, mut op: Op) -> Result<NonNull<Descriptor>, Op> {
        let Some(i) = self.claim() else {
            return Err(op);
        };
        op.pool = self;
        op.index = i;
        let slot = self.slots[i as usize].get();
        // SAFETY: the index came off the free list, so the slot is ours
        // alone; MaybeUninit<Op> has Op's layout, whose first field is the
        // descriptor.
        unsafe {
            (*slot).write(op);
            Ok(NonNull::new_unchecked(slot as *mut Descriptor))
        }
    }
}

/// An endpoint's VI as a CQ reads it: the queues it reports here, and
/// its receives waiting for a read (on shm).
struct Member {
    vi: Vi,
    queues: [Queue; 2],
    n: usize,
    deferred: Option<Arc<Deferred>>,
}

/// How soon after the end of a read that returned entries the next one
/// skips its poll of a network medium ([`Cq::just_read`]), in
/// [`uvia_trace::ticks`]' units: on x86_64 time-stamp counter ticks (about
/// 10 ns to read, where the vDSO's clock takes 21, and two are read per
/// message on `ofi_rxm`'s way), 20–100 us at 1–5 GHz; elsewhere 100 us.
/// `ofi_rxm`'s next read comes within a microsecond or two; a program that
/// reads now and then has each read poll.
const READ_AGAIN_WITHIN: u64 = 100_000;

/// A completion queue. `#[repr(C)]` with libfabric's `fid_cq` first.
#[repr(C)]
pub struct Cq {
    pub fid: fid_cq,
    domain: *const Domain,
    pub cq: uvia::Cq,
    /// The bound endpoints' VIs, held here so that a read looks at them
    /// without the core CQ's walk: that walk upgrades a weak reference to
    /// each VI and drops it again, two atomic read-modify-writes on every
    /// empty poll, which were a fifth of a polling `fi_cq_read`'s time.
    members: SpinLock<Vec<Member>>,
    /// Where the next read starts, with several members (a hint).
    next: AtomicUsize,
    /// Threads asleep in `fi_cq_sread` on this CQ: a receive posted
    /// meanwhile is posted at once rather than left for their next read
    /// (`defer`).
    pub sleepers: AtomicU32,
    /// The last `fi_cq_read` returned entries: the next one posts no
    /// deferred receive and, with `poll_after_entries` false and within
    /// [`READ_AGAIN_WITHIN`] of it, does not poll the transport either: it
    /// takes only what has already completed. `ofi_rxm` reads its CQ until
    /// it comes back empty, on the way from the message it took to its
    /// answer: the receives it reposted would be posted there, and on udp
    /// the look was a receive call that found nothing, a third of a
    /// microsecond. The read after it does both, with the answer sent.
    just_read: AtomicBool,
    /// The domain's VIs are host-local (shm): a poll is a look at a ring,
    /// cheaper than a second read's, so the read after entries polls too
    /// (MPICH's 8 B over `uvia;ofi_rxm` on shm took 4% longer without).
    poll_after_entries: bool,
    /// When the last polling read that returned entries ended
    /// ([`uvia_trace::ticks`]; network domains only): a program that
    /// reads now and then has every read poll, so that nothing it could
    /// take waits a period.
    entries_at: AtomicU64,
    format: fi_cq_format,
    /// Operations of closed endpoints that had completed before the
    /// close, read before anything else: completions a CQ holds outlive
    /// the endpoint (`ofi_rxm` closes a connection's endpoint when its
    /// peer shuts down and then reads what the CQ still holds of it, the
    /// peer's last messages among them).
    left: Mutex<VecDeque<Taking>>,
    /// `left` is not empty: read without its lock on every CQ read.
    has_left: AtomicBool,
    /// The core CQ's interruptions (`uvia::Cq::interrupt`) that were
    /// `detach` waking readers for `left`, not an `fi_cq_signal`.
    left_kicks: AtomicU32,
    /// Failed operations, read with `fi_cq_readerr`.
    errors: Mutex<VecDeque<fi_cq_err_entry>>,
    /// `errors` is not empty: read without its lock on every CQ read.
    erred: AtomicBool,
    /// The wait object asked for (`FI_WAIT_NONE`, `FI_WAIT_UNSPEC`, `FI_WAIT_FD`).
    wait_obj: fi_wait_obj,
    /// The fd `FI_GETWAIT` hands out, made by the first such call.
    wait_fd: OnceLock<WaitFd>,
    pub refs: AtomicUsize,
}

/// What a program sleeps on for a CQ in its own event loop: an epoll set
/// of the core CQ's eventfd and its network VIs' sockets (one fd whatever
/// the medium; `fi_trywait` adds the sockets of VIs attached since).
struct WaitFd {
    epoll: OwnedFd,
}

impl WaitFd {
    fn new(cq: &uvia::Cq) -> Result<WaitFd, c_int> {
        // SAFETY: plain epoll creation; the descriptor is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(-FI_EMFILE);
        }
        // SAFETY: a fresh descriptor we own.
        let w = WaitFd {
            epoll: unsafe { OwnedFd::from_raw_fd(fd) },
        };
        // Completions made by another thread (a network domain's driver)
        // must wake the sleeper too.
        cq.keep_signalled();
        w.add(cq);
        Ok(w)
    }

    /// Adds the CQ's wake-up descriptors not in the set yet.
    fn add(&self, cq: &uvia::Cq) {
        for fd in cq.wake_fds() {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: fd as u64,
            };
            // SAFETY: live descriptors; one already in the set fails with
            // EEXIST, which is what we want.
            unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        }
    }
}

static FI_OPS: fi_ops = fi_ops {
    size: std::mem::size_of::<fi_ops>(),
    close: Some(close),
    bind: Some(nosys::bind),
    control: Some(control),
    ops_open: Some(nosys::ops_open),
    tostr: Some(nosys::tostr),
    ops_set: Some(nosys::ops_set),
};

static OPS: fi_ops_cq = fi_ops_cq {
    size: std::mem::size_of::<fi_ops_cq>(),
    read: Some(read),
    readfrom: Some(readfrom),
    readerr: Some(readerr),
    sread: Some(sread),
    sreadfrom: Some(sreadfrom),
    signal: Some(signal),
    strerror: Some(strerror),
};

/// `fi_cq_open`.
pub unsafe extern "C" fn open(
    d: *mut fid_domain,
    attr: *mut fi_cq_attr,
    cq: *mut *mut fid_cq,
    context: *mut c_void,
) -> c_int {
    guard::call("cq_open", || {
        // SAFETY: libfabric passes the domain it was given and an attribute struct.
        let domain = unsafe { Domain::from_fid(d) }?;
        let attr = unsafe { attr.as_ref() }.ok_or(err::EINVAL)?;
        if cq.is_null() {
            return Err(err::EINVAL);
        }
        let format = match attr.format {
            FI_CQ_FORMAT_UNSPEC => FI_CQ_FORMAT_CONTEXT,
            f @ (FI_CQ_FORMAT_CONTEXT | FI_CQ_FORMAT_MSG | FI_CQ_FORMAT_DATA) => f,
            _ => return Err(err::ENOSYS),
        };
        match attr.wait_obj {
            FI_WAIT_NONE | FI_WAIT_UNSPEC | FI_WAIT_FD => {}
            _ => return Err(err::ENOSYS),
        }
        let max = domain.nic.attributes().max_cq_entries;
        // Room for both queues of many endpoints: notices are small.
        let entries = attr.size.max(1024).min(max);
        let ucq = domain
            .nic
            .create_direct_cq(entries)
            .map_err(|_| err::ENOMEM)?;
        let q = Box::new(Cq {
            fid: fid_cq {
                fid: fid {
                    fclass: FI_CLASS_CQ as usize,
                    context,
                    ops: &FI_OPS as *const fi_ops as *mut fi_ops,
                },
                ops: &OPS as *const fi_ops_cq as *mut fi_ops_cq,
            },
            domain,
            cq: ucq,
            members: SpinLock::new(Vec::new()),
            next: AtomicUsize::new(0),
            sleepers: AtomicU32::new(0),
            just_read: AtomicBool::new(false),
            poll_after_entries: domain.nic.attributes().host_local,
            entries_at: AtomicU64::new(0),
            format,
            left: Mutex::new(VecDeque::new()),
            has_left: AtomicBool::new(false),
            left_kicks: AtomicU32::new(0),
            errors: Mutex::new(VecDeque::new()),
            erred: AtomicBool::new(false),
            wait_obj: attr.wait_obj,
            wait_fd: OnceLock::new(),
            refs: AtomicUsize::new(0),
        });
        domain.refs.fetch_add(1, Ordering::AcqRel);
        // SAFETY: checked non-NULL above.
        unsafe { *cq = Box::into_raw(q) as *mut fid_cq };
        Ok(())
    })
}

impl Cq {
    /// # Safety
    /// `p` is NULL or a fid this provider handed out and has not freed.
    pub unsafe fn from_fid<'a>(p: *mut fid) -> Result<&'a Cq, c_int> {
        // SAFETY: per the contract, with the class checked.
        match unsafe { p.as_ref() } {
            // Both CQ kinds share the class; the ops table tells them apart.
            Some(f)
                if f.fclass == FI_CLASS_CQ as usize
                    && std::ptr::eq(unsafe { (*(p as *const fid_cq)).ops }, &OPS) =>
            {
                Ok(unsafe { &*(p as *const Cq) })
            }
            _ => Err(err::EINVAL),
        }
    }

    pub(crate) fn domain(&self) -> &Domain {
        // SAFETY: a CQ keeps its domain open.
        unsafe { &*self.domain }
    }

    /// Reads `vi`'s completions from `queues` (an endpoint bound here
    /// was enabled).
    pub fn attach(&self, vi: &Vi, queues: &[Queue], deferred: Option<Arc<Deferred>>) {
        let mut m = Member {
            vi: vi.clone(),
            queues: [Queue::Recv; 2],
            n: queues.len().min(2),
            deferred,
        };
        m.queues[..m.n].copy_from_slice(&queues[..m.n]);
        self.members.lock().push(m);
    }

    /// Stops reading `vi` (its endpoint closes). A read under way ends
    /// before this returns. What had completed on its queues stays to be
    /// read: the operations are taken back here, while the endpoint's
    /// pools are still there, and their entries kept (`left`); what is
    /// still posted is the endpoint's to free.
    pub fn detach(&self, vi: &Vi) {
        let mut members = self.members.lock();
        let Some(i) = members.iter().position(|m| m.vi.id() == vi.id()) else {
            return;
        };
        let gone = members.remove(i);
        let mut kept = Vec::new();
        while let Some((_, d)) = gone.vi.finished_raw_of(&gone.queues[..gone.n]) {
            let broken = broken_by(&gone.vi, d);
            // SAFETY: every descriptor the provider posts is an Op; its
            // endpoint frees its pools only after this returns.
            let op = unsafe { Op::take(d) };
            if op.has_entry() {
                kept.push((op, broken));
            }
        }
        drop(members);
        if !kept.is_empty() {
            let mut left = lock(&self.left);
            left.extend(kept);
            self.has_left.store(true, Ordering::Release);
            drop(left);
            // A thread asleep in `fi_cq_sread` or on the wait fd looks
            // again: counted first, so that `sread` tells this wake-up
            // from an `fi_cq_signal` and reads the entries rather than end.
            self.left_kicks.fetch_add(1, Ordering::SeqCst);
            self.cq.interrupt();
        }
    }

    /// The oldest entry a closed endpoint left (`left`).
    fn take_left(&self) -> Option<Taking> {
        let mut left = lock(&self.left);
        let t = left.pop_front();
        if left.is_empty() {
            self.has_left.store(false, Ordering::Release);
        }
        t
    }

    /// Queues the error entry of a failed operation for `fi_cq_readerr`.
    fn push_error(&self, op: &Taken, flags: u64, len: usize, data: u64, broken: Option<Broken>) {
        let st = op.status;
        lock(&self.errors).push_back(fi_cq_err_entry {
            op_context: op.context,
            flags,
            len,
            buf: op.buf,
            data,
            tag: 0,
            olen: 0,
            err: error_code(st),
            prov_errno: prov_errno(st, broken),
            err_data: std::ptr::null_mut(),
            err_data_size: 0,
        });
        self.erred.store(true, Ordering::Release);
    }

    /// Posts every member's receives waiting for a read; true if one was
    /// refused (its error entry is then queued).
    pub fn post_deferred(&self) -> bool {
        let refused: Vec<Taken> = {
            let m = self.members.lock();
            m.iter()
                .filter_map(|m| m.deferred.as_ref().and_then(|df| df.flush(&m.vi, true)))
                // SAFETY: every descriptor posted here is an Op; a refused
                // receive is ours again; taken under the members' lock,
                // while its endpoint cannot close (`detach`).
                .map(|d| unsafe { Op::take(d) })
                .collect()
        };
        for op in &refused {
            self.push_error(op, op.flags, 0, 0, None);
        }
        !refused.is_empty()
    }

    /// The operation a blocking wait's notice names, taken under the
    /// members' lock, if its endpoint is still a member (one that closed
    /// meanwhile has freed its operations).
    fn take_noticed(&self, c: &uvia::CqCompletion) -> Option<Taking> {
        let m = self.members.lock();
        if !m.iter().any(|m| m.vi.id() == c.vi.id()) {
            return None;
        }
        let d = c.vi.done_raw(c.queue)?;
        let broken = broken_by(&c.vi, d);
        // SAFETY: every descriptor the provider posts is an Op, and its
        // endpoint is a member until `detach`, which waits for this lock.
        Some((unsafe { Op::take(d) }, broken))
    }

    /// A completed operation off any member's queue, one member further
    /// on than the last read started; drives each member's progress
    /// (its done call) while none is found, if `poll`.
    /// Also gives, for an operation its connection's failure ended, why
    /// it failed. The operation is taken back under the members' lock: an
    /// endpoint closing in another thread (`detach`) waits for it before
    /// it frees its operations.
    fn take(&self, post: bool, sleeping: bool, poll: bool) -> Option<Taking> {
        if self.has_left.load(Ordering::Acquire) {
            if let Some(t) = self.take_left() {
                return Some(t);
            }
        }
        let m = self.members.lock();
        // Receives waiting for a read are posted first, with `post` (a
        // refused one is reported as a flushed receive).
        let look = |m: &Member| {
            if let Some(refused) = m
                .deferred
                .as_ref()
                .filter(|_| post)
                .and_then(|df| df.flush(&m.vi, sleeping))
            {
                return Some((refused, None));
            }
            let queues = &m.queues[..m.n];
            match poll {
                true => m.vi.done_raw_of(queues),
                false => m.vi.finished_raw_of(queues),
            }
            .map(|(_, d)| (d, broken_by(&m.vi, d)))
        };
        let found = match &m[..] {
            [] => None,
            // The usual case (an endpoint per CQ): no turn to take, and no
            // division on the path.
            [one] => look(one),
            all => {
                let start = self.next.fetch_add(1, Ordering::Relaxed) % all.len();
                let (a, b) = all.split_at(start);
                b.iter().chain(a).find_map(look)
            }
        };
        // SAFETY: every descriptor the provider posts is an Op; `m` holds
        // the members' lock until this returns.
        found.map(|(d, broken)| (unsafe { Op::take(d) }, broken))
    }

    fn entry_size(&self) -> usize {
        match self.format {
            FI_CQ_FORMAT_MSG => std::mem::size_of::<fi_cq_msg_entry>(),
            FI_CQ_FORMAT_DATA => std::mem::size_of::<fi_cq_data_entry>(),
            _ => std::mem::size_of::<fi_cq_entry>(),
        }
    }

    /// Up to `count` entries into `buf`: their number, `-FI_EAGAIN` for
    /// none, `-FI_EAVAIL` when an error waits at the head.
    /// `first` is a notice a blocking wait already took. `polling`: an
    /// `fi_cq_read`, which may leave deferred receives and the transport's
    /// poll to the next read (see `just_read`); a blocking read always
    /// posts them and polls.
    fn read_entries(
        &self,
        buf: *mut c_void,
        count: usize,
        mut first: Option<uvia::CqCompletion>,
        polling: bool,
    ) -> Result<isize, c_int> {
        let after_entries = polling && self.just_read.load(Ordering::Relaxed);
        if after_entries {
            self.just_read.store(false, Ordering::Relaxed);
        }
        // The read after one with entries skips its poll only soon after
        // it (the clock is read there and where a read returns entries,
        // not by the empty reads of a program that waits).
        let poll = !after_entries
            || self.poll_after_entries
            || uvia_trace::ticks().wrapping_sub(self.entries_at.load(Ordering::Relaxed))
                > READ_AGAIN_WITHIN;
        let mut n = 0;
        while n < count {
            if self.erred.load(Ordering::Acquire) {
                break;
            }
            let d = match first.take() {
                Some(c) => self.take_noticed(&c),
                // Once this read has found something, the transport has
                // just been polled: the looks after it take only what has
                // already completed.
                None => match self.take(!after_entries, !polling, n == 0 && poll) {
                    Some(d) => Some(d),
                    None => break,
                },
            };
            let Some((op, broken)) = d else { continue };
            let st = op.status;
            let len = if op.flags & FI_RECV != 0 {
                op.length as usize
            } else {
                op.len
            };
            let mut flags = op.flags;
            let mut data = 0;
            if st & status::IMMEDIATE != 0 {
                flags |= FI_REMOTE_CQ_DATA;
                data = op.immediate as u64;
            }
            if st & status::OP_MASK == status::OP_REMOTE_RDMA_WRITE {
                flags = (flags & !(FI_MSG | FI_RECV)) | FI_RMA | FI_REMOTE_WRITE;
            }
            if !op.has_entry() {
                continue;
            }
            if st & status::ERROR_MASK != 0 {
                self.push_error(&op, flags, len, data, broken);
                break;
            }
            // SAFETY: the caller's buffer holds `count` entries of the
            // format; written unaligned, as the caller's memory may be.
            unsafe {
                let at = (buf as *mut u8).add(n * self.entry_size());
                match self.format {
                    FI_CQ_FORMAT_MSG => {
                        (at as *mut fi_cq_msg_entry).write_unaligned(fi_cq_msg_entry {
                            op_context: op.context,
                            flags,
                            len,
                        })
                    }
                    FI_CQ_FORMAT_DATA => {
                        (at as *mut fi_cq_data_entry).write_unaligned(fi_cq_data_entry {
                            op_context: op.context,
                            flags,
                            len,
                            buf: op.buf,
                            data,
                        })
                    }
                    _ => (at as *mut fi_cq_entry).write_unaligned(fi_cq_entry {
                        op_context: op.context,
                    }),
                }
            }
            n += 1;
        }
        if n > 0 {
            if polling {
                self.just_read.store(true, Ordering::Relaxed);
            }
            if polling && !self.poll_after_entries {
                self.entries_at
                    .store(uvia_trace::ticks(), Ordering::Relaxed);
            }
            Ok(n as isize)
        } else if self.erred.load(Ordering::Acquire) {
            Err(-(FI_EAVAIL as c_int))
        } else {
            if poll {
                self.domain().driver.drive_from_read();
            }
            Err(-FI_EAGAIN)
        }
    }
}

/// VIA's completion errors as libfabric error codes (the entry's `err`);
/// the status bits themselves are its `prov_errno`, which
/// [`fi_cq_strerror`](strerror) turns into text.
fn error_code(st: u32) -> c_int {
    use uvia::CompletionError as E;
    match E::from_status(st) {
        Some(E::Flushed) => FI_ECANCELED,
        Some(E::Length) => FI_ETRUNC as c_int,
        Some(E::Protection | E::RdmaProtection) => FI_EACCES,
        Some(E::Transport) => FI_EIO,
        Some(E::RemoteDescriptor) => FI_EREMOTEIO,
        Some(E::Format | E::Partial) | None => FI_EIO,
    }
}

/// A completed operation taken back and, if its connection's failure
/// ended it, why.
type Taking = (Taken, Option<Broken>);

/// Why `vi`'s connection failed, if `d` (done) ended with a transport
/// error and the provider said.
fn broken_by(vi: &uvia::Vi, d: NonNull<Descriptor>) -> Option<Broken> {
    // SAFETY: a done descriptor is the reader's until it is taken.
    let st = unsafe { d.as_ref() }.cs.status;
    match st & status::TRANSPORT_ERROR {
        0 => None,
        _ => vi.broken_by(),
    }
}

/// Where a CQ error's `prov_errno` carries why the connection failed,
/// above the VIA status bits.
const BROKEN_SHIFT: u32 = 12;

/// A CQ error's `prov_errno`: the VIA status bits, and why the connection
/// failed if known.
fn prov_errno(st: u32, broken: Option<Broken>) -> c_int {
    let why = broken.map_or(0, |b| (b as u32) << BROKEN_SHIFT);
    ((st & (status::ERROR_MASK | status::DONE)) | why) as c_int
}

/// The text of a completion's VIA status (a CQ error's `prov_errno`).
fn status_text(st: u32) -> &'static CStr {
    use uvia::CompletionError as E;
    let broken = match st >> BROKEN_SHIFT {
        0 => None,
        v => Broken::from_u8(v as u8),
    };
    match E::from_status(st) {
        Some(E::Format) => c"VIA format error: the descriptor is malformed",
        Some(E::Protection) => {
            c"VIA protection error: a segment's memory is not registered under the endpoint's domain"
        }
        Some(E::Length) => {
            c"VIA length error: the message does not fit the receive buffers or exceeds the largest transfer"
        }
        Some(E::Partial) => c"VIA partial error: the data was only partly placed",
        Some(E::Flushed) => {
            c"VIA descriptor flushed: the endpoint left the connected state before the operation ran"
        }
        Some(E::Transport) => match broken {
            Some(b) => b.text(),
            None => {
                c"VIA transport error: the connection failed (peer gone, silent or unreachable)"
            }
        },
        Some(E::RdmaProtection) => {
            c"VIA RDMA protection error: the peer refused the remote address or key"
        }
        Some(E::RemoteDescriptor) => {
            c"VIA remote descriptor error: the peer's receive failed"
        }
        None => c"VIA status without an error bit",
    }
}

unsafe extern "C" fn read(cq: *mut fid_cq, buf: *mut c_void, count: usize) -> isize {
    guard::call_ssize("cq_read", || {
        // SAFETY: libfabric calls through the fid it was given.
        let q = unsafe { Cq::from_fid(cq as *mut fid) }?;
        if buf.is_null() && count > 0 {
            return Err(err::EINVAL);
        }
        q.read_entries(buf, count, None, true)
    })
}

/// fabric.h's `FI_ADDR_NOTAVAIL`, `((uint64_t) -1)`: a cast the generated
/// declarations do not carry over.
const FI_ADDR_NOTAVAIL: fi_addr_t = fi_addr_t::MAX;

/// `fi_cq_readfrom` and `fi_cq_sreadfrom`: as the reads without a source,
/// each entry's source `FI_ADDR_NOTAVAIL` (a connected endpoint's peer is
/// the connection's; there is no address vector to name it in).
///
/// # Safety
/// `src` is NULL or holds as many entries as `n` says were read.
unsafe fn no_sources(n: isize, src: *mut fi_addr_t) -> isize {
    if n > 0 && !src.is_null() {
        for i in 0..n as usize {
            // SAFETY: per the contract.
            unsafe { src.add(i).write_unaligned(FI_ADDR_NOTAVAIL) };
        }
    }
    n
}

unsafe extern "C" fn readfrom(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut fi_addr_t,
) -> isize {
    // SAFETY: forwarded; `src` holds `count` entries.
    unsafe { no_sources(read(cq, buf, count), src) }
}

unsafe extern "C" fn sreadfrom(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut fi_addr_t,
    cond: *const c_void,
    timeout_ms: c_int,
) -> isize {
    // SAFETY: forwarded; `src` holds `count` entries.
    unsafe { no_sources(sread(cq, buf, count, cond, timeout_ms), src) }
}

/// `fi_cq_signal`: ends the `fi_cq_sread` calls under way, which return
/// `-FI_EAGAIN`; only on a CQ with a wait object.
unsafe extern "C" fn signal(cq: *mut fid_cq) -> c_int {
    guard::call("cq_signal", || {
        // SAFETY: libfabric calls through the fid it was given.
        let q = unsafe { Cq::from_fid(cq as *mut fid) }?;
        if q.wait_obj == FI_WAIT_NONE {
            return Err(err::ENOSYS);
        }
        q.cq.interrupt();
        Ok(())
    })
}

unsafe extern "C" fn sread(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    _cond: *const c_void,
    timeout_ms: c_int,
) -> isize {
    guard::call_ssize("cq_sread", || {
        // SAFETY: as in read.
        let q = unsafe { Cq::from_fid(cq as *mut fid) }?;
        if buf.is_null() && count > 0 {
            return Err(err::EINVAL);
        }
        // No room for an entry: waiting would take a notice and have
        // nowhere to put it, losing the completion. Look once, as a read.
        if count == 0 {
            return q.read_entries(buf, 0, None, false);
        }
        let deadline = (timeout_ms >= 0)
            .then(|| std::time::Instant::now() + Duration::from_millis(timeout_ms as u64));
        // An `fi_cq_signal` from here on ends the read; a wake-up for the
        // entries a closed endpoint left (`left_kicks`) does not.
        let mut signals = q.cq.interrupts();
        let mut kicks = q.left_kicks.load(Ordering::SeqCst);
        loop {
            // Counted a sleeper before the look that precedes the sleep: a
            // receive posted from then on is posted at once
            // (`Ep::submit_recv`), not left for the read after the wake-up.
            let asleep = CountGuard::new(&q.sleepers);
            match q.read_entries(buf, count, None, false) {
                Err(e) if e == -FI_EAGAIN => {}
                r => return r,
            }
            let left = match deadline {
                Some(d) => d
                    .checked_duration_since(std::time::Instant::now())
                    .ok_or(-FI_EAGAIN)?,
                None => Duration::from_secs(1),
            };
            // The core's wait spins, then sleeps on the CQ; the notice it
            // takes is the first entry.
            // A silent operation's notice yields no entry: wait on.
            let woke = q.cq.wait_unless_interrupted(Some(left), signals);
            drop(asleep);
            match woke {
                Ok(c) => match q.read_entries(buf, count, Some(c), false) {
                    Err(e) if e == -FI_EAGAIN => {}
                    r => return r,
                },
                Err(uvia::WaitError::Timeout) => {}
                Err(uvia::WaitError::Interrupted) => {
                    // `detach` counts its wake-up before it interrupts, so
                    // more interruptions than its wake-ups since the last
                    // look are an fi_cq_signal: back to the caller with
                    // nothing read. Otherwise look again.
                    let now = q.cq.interrupts();
                    let ours = q.left_kicks.load(Ordering::SeqCst);
                    if now.wrapping_sub(signals) > ours.wrapping_sub(kicks) {
                        return Err(-FI_EAGAIN);
                    }
                    (signals, kicks) = (now, ours);
                }
                Err(_) => return Err(-FI_EOVERFLOW),
            }
        }
    })
}

/// `fi_control` on a CQ: `FI_GETWAIT` hands out the fd to sleep on (an
/// epoll set, readable when the CQ may have work), `FI_GETWAITOBJ` what
/// kind of wait object that is.
unsafe extern "C" fn control(p: *mut fid, command: c_int, arg: *mut c_void) -> c_int {
    guard::call("cq control", || {
        // SAFETY: libfabric passes the fid it was given.
        let q = unsafe { Cq::from_fid(p) }?;
        wait_control(q.wait_obj, command, arg, || {
            let w = match q.wait_fd.get() {
                Some(w) => w,
                None => {
                    let w = WaitFd::new(&q.cq)?;
                    q.wait_fd.get_or_init(|| w)
                }
            };
            Ok(w.epoll.as_raw_fd())
        })
    })
}

/// `fi_control`'s wait-object commands, for CQs and EQs alike:
/// `FI_GETWAIT` writes the fd `fd` gives (an int), `FI_GETWAITOBJ` the kind
/// (`FI_WAIT_FD`); a queue opened with `FI_WAIT_NONE` has neither.
pub fn wait_control(
    wait_obj: fi_wait_obj,
    command: c_int,
    arg: *mut c_void,
    fd: impl FnOnce() -> Result<c_int, c_int>,
) -> Result<(), c_int> {
    if arg.is_null() {
        return Err(err::EINVAL);
    }
    if wait_obj == FI_WAIT_NONE {
        return Err(-(FI_ENODATA as c_int));
    }
    match command as u32 {
        FI_GETWAIT => {
            let fd = fd()?;
            // SAFETY: for an fd wait object the argument is an int.
            unsafe { *(arg as *mut c_int) = fd };
            Ok(())
        }
        FI_GETWAITOBJ => {
            // SAFETY: the argument is an enum fi_wait_obj.
            unsafe { *(arg as *mut fi_wait_obj) = FI_WAIT_FD };
            Ok(())
        }
        _ => Err(err::ENOSYS),
    }
}

impl Cq {
    /// `fi_trywait` for this CQ: `Ok` when the program may sleep on its fd
    /// (the peers are asked to signal it), `-FI_EAGAIN` when work is
    /// already waiting (read the CQ first).
    pub fn trywait(&self) -> Result<(), c_int> {
        // Drained before the looks below: a wake-up written after them
        // stays for the program's poll (`detach` sets `has_left` before it
        // writes the eventfd).
        self.cq.drain_eventfd();
        if self.erred.load(Ordering::Acquire) || self.has_left.load(Ordering::Acquire) {
            return Err(-FI_EAGAIN);
        }
        if let Some(w) = self.wait_fd.get() {
            w.add(&self.cq);
        }
        // Receives waiting for a read are posted, so that a message they
        // match counts as work below; one refused is work too (its error).
        if self.post_deferred() {
            return Err(-FI_EAGAIN);
        }
        if self.cq.arm() {
            return Err(-FI_EAGAIN);
        }
        Ok(())
    }
}

unsafe extern "C" fn readerr(cq: *mut fid_cq, buf: *mut fi_cq_err_entry, _flags: u64) -> isize {
    guard::call_ssize("cq_readerr", || {
        // SAFETY: as in read; `buf` is the caller's entry.
        let q = unsafe { Cq::from_fid(cq as *mut fid) }?;
        if buf.is_null() {
            return Err(err::EINVAL);
        }
        let mut errors = lock(&q.errors);
        let e = errors.pop_front().ok_or(-FI_EAGAIN)?;
        q.erred.store(!errors.is_empty(), Ordering::Release);
        drop(errors);
        // SAFETY: a CQ keeps its domain, and the domain its fabric, open;
        // `buf` is the caller's entry.
        let api = unsafe { &*q.domain().fabric }.fid.api_version;
        unsafe { put_error(api, e, buf) };
        Ok(1)
    })
}

/// Writes error entry `e` into the caller's `buf` as a program of
/// interface `api` reads it: for 1.4 and older the entry of 1.0 (which
/// ends before `err_data_size`: the caller's struct may be no longer);
/// later, the whole entry, a buffer the caller offered for `err_data`
/// keeping its place with no bytes (the provider has no error data of its
/// own, fi_cq(3)).
///
/// # Safety
/// `buf` is the caller's entry, of the size its interface version has.
pub unsafe fn put_error(api: u32, mut e: fi_cq_err_entry, buf: *mut fi_cq_err_entry) {
    if version_lt(api, API_1_5) {
        let n = std::mem::offset_of!(fi_cq_err_entry, err_data_size);
        // SAFETY: the caller's entry holds the 1.0 fields; `e` is ours.
        unsafe {
            std::ptr::copy_nonoverlapping(
                &e as *const fi_cq_err_entry as *const u8,
                buf as *mut u8,
                n,
            )
        };
        return;
    }
    // SAFETY: the caller's entry, of the interface's whole size.
    let out = unsafe { &mut *buf };
    if out.err_data_size > 0 {
        e.err_data = out.err_data;
        e.err_data_size = 0;
    }
    *out = e;
}

/// `fi_cq_strerror`: the text of a completion's VIA status, the
/// `prov_errno` of its error entry.
unsafe extern "C" fn strerror(
    _cq: *mut fid_cq,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    let s = status_text(prov_errno as u32);
    // SAFETY: `buf` is NULL or holds `len` bytes.
    unsafe { crate::eq::copy_text(s, buf, len) }
}

unsafe extern "C" fn close(p: *mut fid) -> c_int {
    guard::call("cq close", || {
        // SAFETY: libfabric calls close through the fid it was given.
        let q = unsafe { Cq::from_fid(p) }?;
        if q.refs.load(Ordering::Acquire) != 0 {
            return Err(err::EBUSY);
        }
        // SAFETY: the box made in `open`; nothing refers to it any more.
        let q = unsafe { Box::from_raw(q as *const Cq as *mut Cq) };
        // SAFETY: a CQ keeps its domain open.
        unsafe { &*q.domain }.refs.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_op_pool_hands_out_each_slot_once_until_it_is_given_back() {
        let pool = OpPool::new(3);
        let mut got: Vec<u32> = (0..3).map(|_| pool.claim().unwrap()).collect();
        assert_eq!(pool.claim(), None, "every slot in use");
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2]);
        pool.release(1);
        assert_eq!(pool.claim(), Some(1), "the slot given back");
        assert_eq!(pool.claim(), None);
        pool.release(2);
        pool.release(0);
        let mut again = [pool.claim().unwrap(), pool.claim().unwrap()];
        again.sort_unstable();
        assert_eq!(again, [0, 2]);
        assert!(OpPool::new(0).claim().is_none(), "an empty pool");
    }

    /// Threads that claim and give back at once (one of them claiming
    /// most, so that it holds the claims' bias between the others'): no
    /// slot is ever held by two.
    #[test]
    fn threads_claiming_at_once_never_share_a_slot() {
        let pool = Arc::new(OpPool::new(4));
        let holders: Arc<Vec<AtomicU32>> = Arc::new((0..4).map(|_| AtomicU32::new(0)).collect());
        let start = Arc::new(std::sync::Barrier::new(3));
        let threads: Vec<_> = (0..3u32)
            .map(|t| {
                let (pool, holders, start) = (pool.clone(), holders.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let rounds = if t == 0 { 1_000_000 } else { 300_000 };
                    let mut claimed = 0u32;
                    for _ in 0..rounds {
                        let Some(i) = pool.claim() else { continue };
                        let h = &holders[i as usize];
                        assert_eq!(h.swap(t + 1, Ordering::Relaxed), 0, "slot {i} held twice");
                        std::hint::spin_loop();
                        h.store(0, Ordering::Relaxed);
                        pool.release(i);
                        claimed += 1;
                    }
                    claimed
                })
            })
            .collect();
        let claimed: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(claimed > 0);
        let all: Vec<u32> = (0..4).map(|_| pool.claim().unwrap()).collect();
        assert_eq!(all.len(), 4, "every slot back at the end");
    }

    #[test]
    fn completion_errors_map_to_libfabric_codes_and_text() {
        let done = status::DONE;
        assert_eq!(error_code(done | status::TRANSPORT_ERROR), FI_EIO);
        assert_eq!(error_code(done | status::DESC_FLUSHED_ERROR), FI_ECANCELED);
        assert_eq!(error_code(done | status::LENGTH_ERROR), FI_ETRUNC as c_int);
        assert_eq!(error_code(done | status::PROTECTION_ERROR), FI_EACCES);
        assert_eq!(error_code(done | status::RDMA_PROT_ERROR), FI_EACCES);
        assert_eq!(error_code(done | status::REMOTE_DESC_ERROR), FI_EREMOTEIO);
        // 0x41: what a failed connection's send completes with.
        let text = status_text(0x41).to_str().unwrap();
        assert!(text.starts_with("VIA transport error"), "{text}");
        let mut buf = [0 as c_char; 16];
        // SAFETY: a live buffer of its length.
        let p = unsafe {
            strerror(
                std::ptr::null_mut(),
                0x41,
                std::ptr::null(),
                buf.as_mut_ptr(),
                16,
            )
        };
        // SAFETY: the result is a NUL-terminated static string.
        assert_eq!(unsafe { CStr::from_ptr(p) }, status_text(0x41));
        // SAFETY: the copy is NUL-terminated within the buffer.
        assert_eq!(
            unsafe { CStr::from_ptr(buf.as_ptr()) }.to_bytes(),
            b"VIA transport e"
        );
    }

    /// A transport error's `prov_errno` carries why the connection failed,
    /// and its text says so; the status bits below are unchanged.
    #[test]
    fn a_transport_error_names_why_its_connection_failed() {
        let st = status::DONE | status::TRANSPORT_ERROR;
        let generic = status_text(prov_errno(st, None) as u32);
        let mut seen = vec![generic];
        for v in 1..=u8::MAX {
            let Some(why) = Broken::from_u8(v) else {
                continue;
            };
            let e = prov_errno(st, Some(why));
            assert_eq!(e as u32 & 0xfff, st, "{why:?}");
            assert_eq!(error_code(e as u32), FI_EIO);
            let text = status_text(e as u32);
            assert_eq!(text, why.text());
            assert!(!seen.contains(&text), "{why:?}: {text:?} twice");
            seen.push(text);
        }
        assert_eq!(seen.len(), 7, "the six reasons and the generic text");
    }
}
