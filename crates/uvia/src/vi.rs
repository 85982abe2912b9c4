//! Virtual interfaces: a send queue and a receive queue joined to one peer.
//!
//! Posting validates the descriptor at once (nothing is queued when it is
//! refused) and, when the ring has room, writes the message straight into the
//! ring: the doorbell is that store. Progress (copying arrived messages into
//! posted receive buffers, serving the peer's RDMA, noticing the peer's
//! consumption) runs inside the caller's done and wait calls and the CQ's;
//! there is no thread behind the caller's back. Descriptors complete in
//! order on each queue and carry their status like VIPL's.

use crate::bias::{BiasedLock, Guard};
use crate::cm::{Discriminator, NetAddress, Patience, RemoteViAttributes};
use crate::cq::{Cq, CqShared};
use crate::desc::{control, status, Descriptor, MemHandle, Op, Segment, MAX_SEGMENTS};
use crate::error::{ConnectError, PostError, Rejected, ViAttrError, WaitError};
use crate::mem::{AccessError, Ptag};
use crate::nic::{Nic, NicShared};
use crate::provider::Transport;
use std::ffi::CStr;
use std::hint::spin_loop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uvia_shm::cma::LocalRange;

/// VIA's reliability levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Reliability {
    /// At most once; a receive error does not break the connection.
    Unreliable = 0,
    /// Exactly once, in order; a send completes when the peer's Nic has it.
    ReliableDelivery = 1,
    /// As above, and a send completes only when the data is in the peer's
    /// receive buffer and its descriptor is complete.
    ReliableReception = 2,
}

impl Reliability {
    pub(crate) fn from_u8(v: u8) -> Option<Reliability> {
        match v {
            0 => Some(Reliability::Unreliable),
            1 => Some(Reliability::ReliableDelivery),
            2 => Some(Reliability::ReliableReception),
            _ => None,
        }
    }
}

/// Why a connected VI went to Error, where the provider knows
/// ([`Vi::broken_by`]): what a transport error means in a log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Broken {
    /// Nothing came from the peer for the Nic's idle timeout.
    PeerSilent = 1,
    /// Retransmission timeouts ran out without an acknowledgement.
    RetriesExhausted,
    /// The peer had no receive posted for the idle timeout's worth of
    /// receiver-not-ready retries.
    ReceiverNotReady,
    /// The peer reported a fatal error in this side's traffic.
    PeerReported,
    /// This side found a fatal error in the peer's traffic.
    PeerMalformed,
    /// The peer disconnected.
    PeerDisconnected,
}

impl Broken {
    /// The reason `b as u8` names, if any.
    pub fn from_u8(v: u8) -> Option<Broken> {
        use Broken::*;
        [
            PeerSilent,
            RetriesExhausted,
            ReceiverNotReady,
            PeerReported,
            PeerMalformed,
            PeerDisconnected,
        ]
        .into_iter()
        .find(|b| *b as u8 == v)
    }

    /// The reason in words (C text, for the C faces' error strings).
    pub fn text(self) -> &'static CStr {
        match self {
            Broken::PeerSilent => {
                c"VIA transport error: nothing came from the peer for the idle timeout"
            }
            Broken::RetriesExhausted => {
                c"VIA transport error: retransmissions ran out without an acknowledgement"
            }
            Broken::ReceiverNotReady => {
                c"VIA transport error: the peer had no receive posted for the idle timeout's worth of retries"
            }
            Broken::PeerReported => {
                c"VIA transport error: the peer reported a fatal error in this side's traffic"
            }
            Broken::PeerMalformed => {
                c"VIA transport error: this side found a fatal error in the peer's traffic"
            }
            Broken::PeerDisconnected => c"VIA transport error: the peer disconnected",
        }
    }
}

/// A VI's connection state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ViState {
    Idle = 0,
    PendingConnect = 1,
    Connected = 2,
    Error = 3,
}

/// Which queue of a VI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    Send,
    Recv,
}

/// What a VI is created with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViAttributes {
    pub reliability: Reliability,
    pub ptag: Ptag,
    /// Largest message or RDMA transfer, in bytes.
    pub max_transfer_size: u32,
    /// The peer may RDMA-write into this side's regions (that allow it).
    pub enable_rdma_write: bool,
    /// The peer may RDMA-read from this side's regions (that allow it).
    pub enable_rdma_read: bool,
    pub send_queue_depth: u32,
    pub recv_queue_depth: u32,
    /// On a reliable network VI, a message that finds no posted receive
    /// descriptor is sent again later instead of breaking the connection
    /// (VIA's behaviour, the default, is the error). `shm` always holds
    /// such a message in its ring until a descriptor is posted.
    pub rnr_retry: bool,
}

impl ViAttributes {
    /// Reliable delivery, 1 MiB transfers, no RDMA, 256-deep queues.
    pub fn new(ptag: Ptag) -> ViAttributes {
        ViAttributes {
            reliability: Reliability::ReliableDelivery,
            ptag,
            max_transfer_size: 1 << 20,
            enable_rdma_write: false,
            enable_rdma_read: false,
            send_queue_depth: 256,
            recv_queue_depth: 256,
            rnr_retry: false,
        }
    }

    pub fn rnr_retry(mut self, on: bool) -> Self {
        self.rnr_retry = on;
        self
    }

    pub fn reliability(mut self, r: Reliability) -> Self {
        self.reliability = r;
        self
    }

    pub fn rdma(mut self, write: bool, read: bool) -> Self {
        self.enable_rdma_write = write;
        self.enable_rdma_read = read;
        self
    }

    pub fn max_transfer_size(mut self, n: u32) -> Self {
        self.max_transfer_size = n;
        self
    }

    pub fn queue_depths(mut self, send: u32, recv: u32) -> Self {
        self.send_queue_depth = send;
        self.recv_queue_depth = recv;
        self
    }
}

/// Spin this long in a wait before sleeping, unless changed with
/// [`Vi::set_wait_spin`].
pub const DEFAULT_WAIT_SPIN: Duration = Duration::from_micros(20);
/// A sleeping waiter looks at its peer's health this often.
const SLEEP_SLICE: Duration = Duration::from_millis(20);
/// The longest sleep in a network VI's receive ([`Vi::sleep_in_recv`]); the
/// kernel rounds it up to whole ticks.
pub(crate) const RECV_NAP: Duration = Duration::from_millis(1);
/// A wait sleeps in the receive only with at least this long left: the
/// kernel's rounding (a tick or two, 4–8 ms at 250 Hz) must not carry it
/// past the wait's timeout.
const RECV_NAP_LEFT: Duration = Duration::from_millis(10);

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryState {
    Queued,
    InFlight,
    Done,
}

/// The registered region a local range lies in.
#[derive(Clone, Copy)]
pub(crate) struct Source {
    pub handle: MemHandle,
    pub serial: u32,
    /// The region's memfd, or -1 for caller memory.
    pub fd: i32,
    /// Offset of the range's start in the memfd (wrapping: "negative" when
    /// the range starts before the part of the region the memfd backs).
    pub offset: u64,
    /// Bytes of the memfd mapped in the region: the range's bytes in
    /// `[0, fd_len)` of the memfd a peer can map, the others it cannot.
    pub fd_len: u64,
}

impl Source {
    /// True when all `len` bytes of the range lie in the part a peer can map.
    #[inline]
    pub fn mappable(&self, len: u64) -> bool {
        self.fd >= 0
            && self
                .offset
                .checked_add(len)
                .is_some_and(|e| e <= self.fd_len)
    }

    /// The range of `len` bytes cut where the mappable part begins and
    /// ends: up to three pieces in order, each `(length, mappable)`; the
    /// mappable piece starts at offset `self.offset.max(0)` of the memfd.
    pub fn pieces(&self, len: u64) -> ([(u64, bool); 3], usize) {
        let mut out = [(0, false); 3];
        if self.fd < 0 {
            out[0] = (len, false);
            return (out, 1);
        }
        // Signed: a range may start before the window (caller memory whose
        // first page is shared with other data). Addresses and lengths are
        // below 2^63, so nothing here overflows.
        let start = self.offset as i64;
        let end = start + len as i64;
        let (lo, hi) = (0i64, self.fd_len as i64);
        let mut n = 0;
        for (a, b, m) in [
            (start, end.min(lo), false),
            (start.max(lo), end.min(hi), true),
            (start.max(hi), end, false),
        ] {
            if b > a {
                out[n] = ((b - a) as u64, m);
                n += 1;
            }
        }
        (out, n)
    }

    const NONE: Source = Source {
        handle: MemHandle(0),
        serial: 0,
        fd: -1,
        offset: 0,
        fd_len: 0,
    };
}

/// A posted descriptor with what the post checked, so that progress never
/// re-reads (or trusts) the caller's segments.
pub(crate) struct Posted {
    pub desc: NonNull<Descriptor>,
    pub owned: bool,
    pub op: Op,
    pub fence: bool,
    pub imm: Option<u32>,
    pub ranges: [LocalRange; MAX_SEGMENTS],
    /// Where each range lives: its region, to share it with the peer.
    pub src: [Source; MAX_SEGMENTS],
    pub nranges: u8,
    pub total: u64,
    pub remote: (u64, MemHandle),
    /// The transport's number for it (a ring message id, an engine msn/rsn).
    pub id: u32,
    /// Where the transport's medium is just past this message once sent
    /// (the shm ring's index), for completing it when the peer consumed it.
    pub end: u64,
    pub needs_ack: bool,
    pub state: EntryState,
}

impl Posted {
    pub fn ranges(&self) -> &[LocalRange] {
        &self.ranges[..self.nranges as usize]
    }

    /// True while every region the descriptor names is still the one that
    /// was registered when it was posted. Checked before the Nic touches the
    /// memory later than the post itself, so memory deregistered (and perhaps
    /// freed) in between is never written or read.
    #[inline(always)]
    pub fn still_registered(&self, regions: &crate::mem::RegionTable) -> bool {
        if self.nranges == 1 {
            // One buffer, the common case, without the loop.
            return regions.is_current(self.src[0].handle, self.src[0].serial);
        }
        self.src[..self.nranges as usize]
            .iter()
            .all(|s| regions.is_current(s.handle, s.serial))
    }
}

// SAFETY: a `Posted` names memory the caller handed to the VI for the time
// the descriptor is outstanding; the VI is the only one touching it then.
unsafe impl Send for Posted {}

impl Posted {
    fn empty() -> Posted {
        Posted {
            desc: NonNull::dangling(),
            owned: false,
            op: Op::SendRecv,
            fence: false,
            imm: None,
            ranges: [LocalRange {
                ptr: std::ptr::null_mut(),
                len: 0,
            }; MAX_SEGMENTS],
            src: [Source::NONE; MAX_SEGMENTS],
            nranges: 0,
            total: 0,
            remote: (0, MemHandle(0)),
            id: 0,
            end: 0,
            needs_ack: false,
            state: EntryState::Done,
        }
    }
}

/// A descriptor queue: a fixed ring of entries filled in place, so posting
/// moves no entry and allocates nothing.
pub(crate) struct SlotQueue {
    slots: Box<[Posted]>,
    head: usize,
    len: usize,
}

impl SlotQueue {
    pub fn new(depth: u32) -> SlotQueue {
        SlotQueue {
            slots: (0..depth.max(1)).map(|_| Posted::empty()).collect(),
            head: 0,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn slot(&self, i: usize) -> usize {
        let at = self.head + i;
        if at >= self.slots.len() {
            at - self.slots.len()
        } else {
            at
        }
    }

    /// No free slot: `next_free` would give none.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.len == self.slots.len()
    }

    /// The free slot after the last entry, to fill before `commit`.
    pub fn next_free(&mut self) -> Option<&mut Posted> {
        if self.len == self.slots.len() {
            return None;
        }
        let i = self.slot(self.len);
        Some(&mut self.slots[i])
    }

    pub fn commit(&mut self) {
        self.len += 1;
    }

    pub fn front(&self) -> Option<&Posted> {
        (self.len > 0).then(|| &self.slots[self.head])
    }

    #[inline(always)]
    pub fn pop_front(&mut self) -> Option<(NonNull<Descriptor>, bool)> {
        let e = self.front()?;
        let r = (e.desc, e.owned);
        // SAFETY: a queued descriptor is valid until it is handed back,
        // which this is.
        unsafe { release(e.desc) };
        self.head = self.slot(1);
        self.len -= 1;
        Some(r)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Posted> {
        let (len, head, cap) = (self.len, self.head, self.slots.len());
        let (a, b) = self.slots.split_at_mut(head);
        b.iter_mut().chain(a.iter_mut()).take(len.min(cap))
    }
}

/// What a queued descriptor carries in its control segment's reserved word
/// (from its own address, so a fresh descriptor holds it only by a 1 in 2^32
/// chance): a post finds a descriptor posted twice by it.
fn posted_mark(d: NonNull<Descriptor>) -> u32 {
    ((d.as_ptr() as usize as u64 >> 6) as u32) ^ 0x5649_4131
}

/// Marks `d` queued, or refuses it if it is queued already.
///
/// # Safety
/// `d` points at a descriptor the caller may write.
unsafe fn claim(d: NonNull<Descriptor>) -> Result<(), PostError> {
    // SAFETY: per the contract.
    let cs = unsafe { &mut (*d.as_ptr()).cs };
    if cs.reserved == posted_mark(d) {
        return Err(PostError::AlreadyPosted);
    }
    cs.reserved = posted_mark(d);
    Ok(())
}

/// Clears the mark of [`claim`]: the descriptor leaves its queue.
///
/// # Safety
/// As for [`claim`].
unsafe fn release(d: NonNull<Descriptor>) {
    // SAFETY: per the contract.
    unsafe { (*d.as_ptr()).cs.reserved = 0 };
}

impl std::ops::Index<usize> for SlotQueue {
    type Output = Posted;
    fn index(&self, i: usize) -> &Posted {
        &self.slots[self.slot(i)]
    }
}

impl std::ops::IndexMut<usize> for SlotQueue {
    fn index_mut(&mut self, i: usize) -> &mut Posted {
        let i = self.slot(i);
        &mut self.slots[i]
    }
}

/// What every provider's VI shares: attributes and the two descriptor
/// queues. A provider's transport reads and completes entries here.
pub(crate) struct Queues {
    pub attrs: ViAttributes,
    pub remote: Option<RemoteViAttributes>,
    pub sq: SlotQueue,
    /// Entries of `sq` handed to the transport (a prefix; the rest wait
    /// for room in the medium or for a fence).
    pub sq_sent: usize,
    pub rq: SlotQueue,
    /// Completed entries at the front of `rq`.
    pub rq_done: usize,
    /// The id the next send gets, where the transport does not number them.
    pub next_id: u32,
    pub spin: Duration,
    /// Private data the peer's accept or reject carried.
    pub remote_private: Vec<u8>,
    /// The VI still counts as a user of its protection tag and a member of
    /// its CQs: until [`Vi::destroy`] or the last clone's drop, whichever
    /// comes first. Another thread may hold the VI a moment after the
    /// program destroyed it (the shm agent serving it), and the tag and
    /// CQs must be free for the program's next call all the same.
    pub counted: bool,
}

pub(crate) struct ViInner {
    pub q: Queues,
    /// The connection, over whichever provider carries it.
    pub t: Transport,
}

pub(crate) struct ViShared {
    pub id: u32,
    pub nic: Arc<NicShared>,
    pub send_cq: Option<Arc<CqShared>>,
    pub recv_cq: Option<Arc<CqShared>>,
    state: AtomicU8,
    /// Why it went to Error (a [`Broken`], 0 for not known).
    broken: AtomicU8,
    /// The program's word for this VI ([`Vi::set_tag`]).
    tag: AtomicUsize,
    pub inner: BiasedLock<ViInner>,
}

/// A virtual interface. Clones name the same VI; it is destroyed when the
/// last clone is dropped (or by [`destroy`](Vi::destroy)).
#[derive(Clone)]
pub struct Vi {
    pub(crate) s: Arc<ViShared>,
}

impl std::fmt::Debug for Vi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vi")
            .field("id", &self.s.id)
            .field("state", &self.state())
            .finish()
    }
}

impl Vi {
    pub(crate) fn create(
        nic: &Nic,
        attrs: ViAttributes,
        send_cq: Option<&Cq>,
        recv_cq: Option<&Cq>,
    ) -> Result<Vi, ViAttrError> {
        check_attrs(&nic.s, &attrs)?;
        for cq in [send_cq, recv_cq].into_iter().flatten() {
            if !Arc::ptr_eq(&cq.s.nic, &nic.s) {
                return Err(ViAttrError::ForeignCq);
            }
        }
        if !nic.s.hold_ptag(attrs.ptag, 1) {
            return Err(ViAttrError::InvalidPtag(attrs.ptag.raw()));
        }
        let vi = Vi {
            s: Arc::new(ViShared {
                id: nic.s.next_vi.fetch_add(1, Ordering::Relaxed),
                nic: nic.s.clone(),
                send_cq: send_cq.map(|c| c.s.clone()),
                recv_cq: recv_cq.map(|c| c.s.clone()),
                state: AtomicU8::new(ViState::Idle as u8),
                broken: AtomicU8::new(0),
                tag: AtomicUsize::new(0),
                inner: BiasedLock::new(ViInner {
                    q: Queues {
                        attrs,
                        remote: None,
                        sq: SlotQueue::new(attrs.send_queue_depth),
                        sq_sent: 0,
                        rq: SlotQueue::new(attrs.recv_queue_depth),
                        rq_done: 0,
                        next_id: 1,
                        spin: DEFAULT_WAIT_SPIN,
                        remote_private: Vec::new(),
                        counted: true,
                    },
                    t: Transport::None,
                }),
            }),
        };
        for cq in [send_cq, recv_cq].into_iter().flatten() {
            cq.s.attach(&vi.s);
        }
        Ok(vi)
    }

    /// A small number naming this VI within its Nic.
    pub fn id(&self) -> u32 {
        self.s.id
    }

    /// Keeps a word with the VI for the program (an API layer's handle
    /// for it), which every clone and every completion's VI reads back
    /// with [`tag`](Self::tag): naming a CQ completion's VI then needs no
    /// table. 0 until set.
    pub fn set_tag(&self, tag: usize) {
        self.s.tag.store(tag, Ordering::Release);
    }

    /// The word [`set_tag`](Self::set_tag) kept (0: none).
    pub fn tag(&self) -> usize {
        self.s.tag.load(Ordering::Acquire)
    }

    #[inline]
    pub fn state(&self) -> ViState {
        match self.s.state.load(Ordering::Acquire) {
            0 => ViState::Idle,
            1 => ViState::PendingConnect,
            2 => ViState::Connected,
            _ => ViState::Error,
        }
    }

    pub fn attributes(&self) -> ViAttributes {
        self.lock().q.attrs
    }

    /// The peer's attributes, once connected.
    pub fn remote_attributes(&self) -> Option<RemoteViAttributes> {
        self.lock().q.remote.clone()
    }

    /// Changes attributes of an idle VI.
    pub fn set_attributes(&self, attrs: ViAttributes) -> Result<(), ViAttrError> {
        let mut g = self.lock();
        let q = &mut g.q;
        if self.state() != ViState::Idle {
            return Err(ViAttrError::InvalidState(self.state()));
        }
        check_attrs(&self.s.nic, &attrs)?;
        if attrs.send_queue_depth != q.attrs.send_queue_depth && !q.sq.is_empty()
            || attrs.recv_queue_depth != q.attrs.recv_queue_depth && !q.rq.is_empty()
        {
            return Err(ViAttrError::InvalidState(ViState::Idle));
        }
        if attrs.ptag != q.attrs.ptag {
            if !self.s.nic.hold_ptag(attrs.ptag, 1) {
                return Err(ViAttrError::InvalidPtag(attrs.ptag.raw()));
            }
            self.s.nic.hold_ptag(q.attrs.ptag, -1);
        }
        if attrs.send_queue_depth != q.attrs.send_queue_depth {
            q.sq = SlotQueue::new(attrs.send_queue_depth);
        }
        if attrs.recv_queue_depth != q.attrs.recv_queue_depth {
            q.rq = SlotQueue::new(attrs.recv_queue_depth);
        }
        q.attrs = attrs;
        Ok(())
    }

    /// True when queue `q` holds no descriptor, completed or not (VipQueryVi).
    pub fn queue_is_empty(&self, q: Queue) -> bool {
        let g = self.lock();
        match q {
            Queue::Send => g.q.sq.is_empty(),
            Queue::Recv => g.q.rq.is_empty(),
        }
    }

    /// How long waits spin before they sleep (0: sleep at once).
    pub fn set_wait_spin(&self, spin: Duration) {
        self.lock().q.spin = spin;
    }

    /// The VI's state lock (see [`BiasedLock`]: a plain store releases it,
    /// and the thread that drives the VI comes to take it with no locked
    /// instruction).
    /// Nothing sleeps or makes a long call while holding it.
    pub(crate) fn lock(&self) -> Guard<'_, ViInner> {
        self.s.inner.lock()
    }

    pub(crate) fn set_state(&self, st: ViState) {
        if matches!(st, ViState::Idle | ViState::PendingConnect) {
            // A new connection: the last one's reason is gone with it.
            self.s.broken.store(0, Ordering::Relaxed);
        }
        self.s.state.store(st as u8, Ordering::Release);
    }

    /// Why the VI went to Error, if the provider said: set before the
    /// state, so one who sees Error and a completion with a transport
    /// error finds it.
    pub fn broken_by(&self) -> Option<Broken> {
        Broken::from_u8(self.s.broken.load(Ordering::Acquire))
    }

    pub(crate) fn set_broken(&self, why: Broken) {
        self.s.broken.store(why as u8, Ordering::Release);
    }

    /// Posts a send, RDMA write or RDMA read.
    pub fn post_send(&self, d: Box<Descriptor>) -> Result<(), Rejected> {
        let p = NonNull::from(Box::leak(d));
        // SAFETY: `p` is a live descriptor we own; on refusal it is turned
        // back into the box it came from.
        unsafe { self.post_send_raw(p, true) }.map_err(|error| Rejected {
            error,
            descriptor: unsafe { Box::from_raw(p.as_ptr()) },
        })
    }

    /// Posts a receive.
    pub fn post_recv(&self, d: Box<Descriptor>) -> Result<(), Rejected> {
        let p = NonNull::from(Box::leak(d));
        // SAFETY: as in `post_send`.
        unsafe { self.post_recv_raw(p, true) }.map_err(|error| Rejected {
            error,
            descriptor: unsafe { Box::from_raw(p.as_ptr()) },
        })
    }

    /// Posts a descriptor that lives in the caller's memory (the C API).
    ///
    /// # Safety
    /// `d` points to a control segment followed by `seg_count` segments that
    /// stay valid, and are not touched by the caller, until the descriptor is
    /// handed back by a done or wait call. `owned` must be false unless `d`
    /// came from `Box::into_raw`.
    pub unsafe fn post_send_raw(
        &self,
        d: NonNull<Descriptor>,
        owned: bool,
    ) -> Result<(), PostError> {
        uvia_trace::mark!(AppSend);
        // SAFETY: forwarded from the caller.
        unsafe { claim(d)? };
        let r = {
            let mut g = self.lock();
            match self.state() {
                ViState::Connected => {
                    let ViInner { q, t } = &mut *g;
                    // SAFETY: forwarded from the caller.
                    unsafe { t.post_send(self, q, d, owned) }
                }
                ViState::Error => Err(PostError::ViError),
                st => Err(PostError::NotConnected(st)),
            }
        };
        if r.is_err() {
            // SAFETY: refused, so not queued: the caller's again.
            unsafe { release(d) };
        }
        uvia_trace::mark!(AppSendReturned);
        r
    }

    /// Sends the bytes of `parts`, one after the other, as one message
    /// (with immediate data if `imm`), copied before the call returns: no
    /// descriptor, no completion, the caller's memory need not be
    /// registered. It goes in order after every send posted before it. A
    /// uvia extension for faces that promise a caller its buffer back at
    /// once (libfabric's inject).
    ///
    /// `Ok(false)`: the transport cannot send it this way now (the
    /// message is larger than its inline limit, sends are queued ahead,
    /// the ring is full, the reliability level needs an acknowledgement
    /// per message (shm), or the VI holds as many unacknowledged copies as
    /// it keeps (network)); post a descriptor instead.
    pub fn send_copy(&self, parts: &[&[u8]], imm: Option<u32>) -> Result<bool, PostError> {
        self.by_copy(|t, q| t.send_copy(self, q, parts, imm))
    }

    /// Writes the bytes of `parts`, one after the other, into the peer's
    /// registered memory at `remote` (an address segment, as
    /// [`MemoryRegion::remote`](crate::MemoryRegion::remote) gives), copied before the
    /// call returns: no descriptor, no completion, the caller's memory need
    /// not be registered. It lands in order after every send and write
    /// posted before it. A uvia extension, libfabric's `fi_inject_write`
    /// and UCX's short put.
    ///
    /// `Ok(false)`: the transport cannot write it this way now (it has no
    /// direct path to the peer's memory, the peer has not granted this
    /// window yet, the range leaves it, the message is larger than a
    /// direct write or in more pieces than it gathers (two on shm), or
    /// sends are queued ahead); post an RDMA write descriptor instead,
    /// which also earns the grant.
    #[inline]
    pub fn write_copy(&self, parts: &[&[u8]], remote: Segment) -> Result<bool, PostError> {
        self.by_copy(|t, q| t.write_copy(self, q, parts, remote))
    }

    /// [`send_copy`](Self::send_copy) and [`write_copy`](Self::write_copy):
    /// `op` under the VI's lock on a connected VI.
    #[inline(always)]
    fn by_copy(
        &self,
        op: impl FnOnce(&mut Transport, &mut Queues) -> bool,
    ) -> Result<bool, PostError> {
        uvia_trace::mark!(AppSend);
        let mut g = self.lock();
        let r = match self.state() {
            ViState::Connected => {
                let ViInner { q, t } = &mut *g;
                Ok(op(t, q))
            }
            ViState::Error => Err(PostError::ViError),
            st => Err(PostError::NotConnected(st)),
        };
        drop(g);
        uvia_trace::mark!(AppSendReturned);
        r
    }

    /// Posts a receive that lives in the caller's memory (the C API).
    ///
    /// # Safety
    /// As for [`post_send_raw`](Self::post_send_raw).
    pub unsafe fn post_recv_raw(
        &self,
        d: NonNull<Descriptor>,
        owned: bool,
    ) -> Result<(), PostError> {
        // SAFETY: forwarded from the caller.
        unsafe { claim(d)? };
        let mut g = self.lock();
        let r = (|| {
            if self.state() == ViState::Error {
                return Err(PostError::ViError);
            }
            let ViInner { q, t } = &mut *g;
            let len = q.rq.len();
            let Some(slot) = q.rq.next_free() else {
                return Err(PostError::QueueFull("receive", len));
            };
            // SAFETY: forwarded from the caller.
            unsafe { prepare(&self.s.nic, &q.attrs, slot, d, owned, Queue::Recv)? };
            q.rq.commit();
            t.posted_recv(q);
            Ok(())
        })();
        if r.is_err() {
            // SAFETY: refused, so not queued: the caller's again.
            unsafe { release(d) };
        }
        r
    }

    /// Writes a completed send's status into its descriptor and tells the CQ.
    pub(crate) fn complete_send(&self, e: &mut Posted, err_bits: u32) {
        let op_bits = match e.op {
            Op::SendRecv => status::OP_SEND,
            Op::RdmaWrite => status::OP_RDMA_WRITE,
            Op::RdmaRead => status::OP_RDMA_READ,
        };
        // SAFETY: the descriptor is ours until it is handed back.
        unsafe {
            let cs = &mut (*e.desc.as_ptr()).cs;
            cs.length = e.total as u32;
            cs.status = status::DONE | op_bits | err_bits;
        }
        e.state = EntryState::Done;
        if let Some(cq) = &self.s.send_cq {
            cq.notify(&self.s, Queue::Send);
        }
    }

    /// Writes a completed receive's status into its descriptor and tells the CQ.
    pub(crate) fn complete_recv(
        &self,
        e: &mut Posted,
        op_bits: u32,
        len: u32,
        imm: Option<u32>,
        err_bits: u32,
    ) {
        // SAFETY: the descriptor is ours until it is handed back.
        unsafe {
            let cs = &mut (*e.desc.as_ptr()).cs;
            cs.length = len;
            if let Some(v) = imm {
                cs.immediate_data = v;
            }
            cs.status = status::DONE
                | op_bits
                | err_bits
                | if imm.is_some() { status::IMMEDIATE } else { 0 };
        }
        e.state = EntryState::Done;
        uvia_trace::mark!(ViCompleted);
        if let Some(cq) = &self.s.recv_cq {
            cq.notify(&self.s, Queue::Recv);
        }
    }

    /// Moves the VI to Error: sends in flight complete with `inflight_bits`,
    /// everything else outstanding is flushed.
    pub(crate) fn fail(&self, q: &mut Queues, inflight_bits: u32) {
        self.set_state(ViState::Error);
        self.flush(q, inflight_bits);
    }

    fn flush(&self, q: &mut Queues, inflight_bits: u32) {
        for e in q.sq.iter_mut() {
            match e.state {
                EntryState::Done => {}
                EntryState::InFlight => self.complete_send(e, inflight_bits),
                EntryState::Queued => self.complete_send(e, status::DESC_FLUSHED_ERROR),
            }
        }
        q.sq_sent = q.sq.len();
        for e in q.rq.iter_mut().skip(q.rq_done) {
            self.complete_recv(e, status::OP_RECEIVE, 0, None, status::DESC_FLUSHED_ERROR);
        }
        q.rq_done = q.rq.len();
    }

    /// The head of `queue` if it has completed.
    #[inline(always)]
    pub(crate) fn pop(
        &self,
        q: &mut Queues,
        queue: Queue,
        owned: bool,
    ) -> Option<NonNull<Descriptor>> {
        let head = match queue {
            Queue::Send => q.sq.front(),
            // Counted: an empty look at the receives (every poll's) reads
            // one word, not the head's slot.
            Queue::Recv if q.rq_done == 0 => return None,
            Queue::Recv => q.rq.front(),
        }?;
        if head.state != EntryState::Done || head.owned != owned {
            return None;
        }
        let (desc, _) = match queue {
            Queue::Send => {
                q.sq_sent -= 1;
                q.sq.pop_front()
            }
            Queue::Recv => {
                q.rq_done -= 1;
                uvia_trace::mark!(AppReceived);
                q.rq.pop_front()
            }
        }?;
        Some(desc)
    }

    /// Inlined into each done call, so that each is specialised to its
    /// queue and kind of descriptor (a ping-pong's round trip 76
    /// instructions shorter under `examples/path_cost`).
    #[inline(always)]
    fn done_inner(&self, queue: Queue, owned: bool) -> Option<NonNull<Descriptor>> {
        let mut g = self.lock();
        let ViInner { q, t } = &mut *g;
        if let Some(d) = self.pop(q, queue, owned) {
            return Some(d);
        }
        t.poll(self, q, queue, owned)
    }

    /// The oldest send-queue descriptor if it has completed (VipSendDone).
    pub fn send_done(&self) -> Option<Box<Descriptor>> {
        // SAFETY: only descriptors posted with `owned = true` (from a Box) are popped here.
        self.done_inner(Queue::Send, true)
            .map(|p| unsafe { Box::from_raw(p.as_ptr()) })
    }

    /// The oldest receive-queue descriptor if it has completed (VipRecvDone).
    pub fn recv_done(&self) -> Option<Box<Descriptor>> {
        // SAFETY: as in `send_done`.
        self.done_inner(Queue::Recv, true)
            .map(|p| unsafe { Box::from_raw(p.as_ptr()) })
    }

    /// Like [`send_done`](Self::send_done) for descriptors posted raw.
    pub fn send_done_raw(&self) -> Option<NonNull<Descriptor>> {
        self.done_inner(Queue::Send, false)
    }

    /// Like [`recv_done`](Self::recv_done) for descriptors posted raw.
    pub fn recv_done_raw(&self) -> Option<NonNull<Descriptor>> {
        self.done_inner(Queue::Recv, false)
    }

    /// [`send_done_raw`](Self::send_done_raw) or
    /// [`recv_done_raw`](Self::recv_done_raw) by queue.
    pub fn done_raw(&self, queue: Queue) -> Option<NonNull<Descriptor>> {
        self.done_inner(queue, false)
    }

    /// [`done_raw`](Self::done_raw) over several queues of this VI under
    /// one hold of its lock: a finished head of any of them first, else one
    /// poll of the transport, then their heads again. A direct CQ reporting
    /// both queues of a VI looks here, one lock where a done call per queue
    /// took two.
    ///
    /// One poll moves every queue of the VI forward (a network transport's
    /// poll is its progress: a receive system call; shm's looks at the ring
    /// and at what waits for an acknowledgement), so it is made once, for
    /// the receive queue when it is among `queues` (shm's fast path takes a
    /// message there); a poll per queue made two receive calls on every
    /// empty look of a network VI.
    pub fn done_raw_of(&self, queues: &[Queue]) -> Option<(Queue, NonNull<Descriptor>)> {
        let mut g = self.lock();
        let ViInner { q, t } = &mut *g;
        // A head can be taken only if a receive is counted done or the
        // sends are looked at: a polling read over its receive queue
        // usually finds neither and goes straight to the poll.
        if q.rq_done > 0 || queues.contains(&Queue::Send) {
            if let Some(found) = self.pop_of(q, queues) {
                return Some(found);
            }
        }
        let first = match queues {
            [] => return None,
            _ if queues.contains(&Queue::Recv) => Queue::Recv,
            [one, ..] => *one,
        };
        if let Some(d) = t.poll(self, q, first, false) {
            return Some((first, d));
        }
        // What the poll moved forward on the other queues; with one queue
        // there is none (the poll hands back its head when it completes).
        match queues {
            [_] => None,
            _ => self.pop_of(q, queues),
        }
    }

    /// Like [`done_raw_of`](Self::done_raw_of) without the transport's poll:
    /// only a head that has already completed. A reader that has just taken
    /// a completion looks here for more: the poll that found it moved every
    /// queue forward, and another so soon finds nothing new (on shm it is
    /// most of an empty look's cost, on a network VI a system call).
    pub fn finished_raw_of(&self, queues: &[Queue]) -> Option<(Queue, NonNull<Descriptor>)> {
        let mut g = self.lock();
        self.pop_of(&mut g.q, queues)
    }

    /// The first of `queues` whose head has completed, taken off it.
    fn pop_of(&self, q: &mut Queues, queues: &[Queue]) -> Option<(Queue, NonNull<Descriptor>)> {
        queues
            .iter()
            .find_map(|&queue| Some((queue, self.pop(q, queue, false)?)))
    }

    /// True if the head of `queue` has completed, after moving forward
    /// what can move; takes nothing off the queue.
    pub(crate) fn head_done(&self, queue: Queue) -> bool {
        let mut g = self.lock();
        let ViInner { q, t } = &mut *g;
        let done = |q: &Queues| {
            match queue {
                Queue::Send => q.sq.front(),
                Queue::Recv => q.rq.front(),
            }
            .is_some_and(|e| e.state == EntryState::Done)
        };
        if done(q) {
            return true;
        }
        t.progress(self, q);
        done(q)
    }

    /// Waits for the oldest send to complete (VipSendWait): spins for the
    /// wait-spin time, then sleeps. `None` waits forever.
    pub fn send_wait(&self, timeout: Option<Duration>) -> Result<Box<Descriptor>, WaitError> {
        // SAFETY: owned descriptors only, as in `send_done`.
        self.wait(Queue::Send, timeout, true)
            .map(|p| unsafe { Box::from_raw(p.as_ptr()) })
    }

    /// Waits for the oldest receive to complete (VipRecvWait).
    pub fn recv_wait(&self, timeout: Option<Duration>) -> Result<Box<Descriptor>, WaitError> {
        // SAFETY: owned descriptors only, as in `send_done`.
        self.wait(Queue::Recv, timeout, true)
            .map(|p| unsafe { Box::from_raw(p.as_ptr()) })
    }

    /// Waits for a raw-posted descriptor (the C API).
    pub fn wait_raw(
        &self,
        q: Queue,
        timeout: Option<Duration>,
    ) -> Result<NonNull<Descriptor>, WaitError> {
        self.wait(q, timeout, false)
    }

    fn wait(
        &self,
        queue: Queue,
        timeout: Option<Duration>,
        owned: bool,
    ) -> Result<NonNull<Descriptor>, WaitError> {
        let bound = match queue {
            Queue::Send => self.s.send_cq.is_some(),
            Queue::Recv => self.s.recv_cq.is_some(),
        };
        if bound {
            return Err(WaitError::BoundToCq);
        }
        let start = Instant::now();
        // The spin is part of the wait: never longer than its timeout.
        let spin = self.lock().q.spin.min(timeout.unwrap_or(Duration::MAX));
        // Spin phase: poll without sleeping; look at the clock every 64
        // rounds. With no spin time, go straight to sleep (the sleep phase
        // polls once after arming).
        let mut k = 0u32;
        while !spin.is_zero() {
            if let Some(d) = self.done_inner(queue, owned) {
                return Ok(d);
            }
            // A pause between looks: a look every few cycles keeps taking
            // a shm ring's line back from the sender's store.
            spin_loop();
            k = k.wrapping_add(1);
            if k.is_multiple_of(64) && start.elapsed() >= spin {
                break;
            }
        }
        // Sleep phase: announce, re-check, sleep on what the transport names.
        let mut look_at_peer = false;
        let mut timers = false;
        // The first sleep of a network VI may be in its receive (see
        // `Vi::sleep_in_recv`); later ones in `poll`, to the millisecond.
        let mut first = true;
        loop {
            let sleep = {
                let mut g = self.lock();
                let ViInner { q, t } = &mut *g;
                if let Some(d) = self.pop(q, queue, owned) {
                    return Ok(d);
                }
                // Look before arming: after a wake-up the message is usually
                // here, and an armed bell would cost the next sender a wake call.
                t.progress(self, q);
                if let Some(d) = self.pop(q, queue, owned) {
                    return Ok(d);
                }
                // Nothing came after a sleep: the protocol's timers, which
                // a message's wake-up leaves off its path.
                if timers {
                    t.run_timers(self, q);
                    if let Some(d) = self.pop(q, queue, owned) {
                        return Ok(d);
                    }
                }
                let sleep = t.arm(&self.s.nic);
                // Re-check after arming: a message published before the arm
                // is seen here (a descriptor that stays readable while input
                // waits needs no look).
                if sleep.needs_recheck() {
                    t.progress(self, q);
                }
                if look_at_peer {
                    t.check_peer(self, q);
                }
                if let Some(d) = self.pop(q, queue, owned) {
                    t.disarm();
                    return Ok(d);
                }
                sleep
            };
            let left = match timeout {
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(l) if !l.is_zero() => l,
                    _ => return Err(WaitError::Timeout),
                },
                None => SLEEP_SLICE,
            };
            let nap = left.min(SLEEP_SLICE);
            if std::mem::take(&mut first) && Vi::sleep_in_recv(&self.s, nap).is_some() {
                continue;
            }
            let t0 = Instant::now();
            timers = sleep.runs_timers();
            sleep.sleep(&self.s.nic, nap);
            // A full slice without a wake-up: look at the peer's health next round.
            look_at_peer = t0.elapsed() + Duration::from_millis(1) >= SLEEP_SLICE;
        }
    }

    /// Connects to a server waiting on `remote` (VipConnectRequest). Waits up
    /// to `timeout` for a listener to appear and for its answer.
    pub fn connect_request(
        &self,
        remote: &NetAddress,
        timeout: Duration,
    ) -> Result<RemoteViAttributes, ConnectError> {
        self.connect_request_with(remote, timeout, &[])
    }

    /// [`connect_request`](Self::connect_request) carrying up to
    /// [`MAX_PRIVATE_DATA`](crate::cm::MAX_PRIVATE_DATA) bytes for the
    /// server ([`ConnRequest::private_data`](crate::ConnRequest::private_data));
    /// the server's answer carries its own
    /// ([`peer_private_data`](Self::peer_private_data)).
    pub fn connect_request_with(
        &self,
        remote: &NetAddress,
        timeout: Duration,
        private: &[u8],
    ) -> Result<RemoteViAttributes, ConnectError> {
        self.connect_client(remote, timeout, timeout, private)
    }

    /// [`connect_request_with`](Self::connect_request_with) to a server
    /// that listens already: a request that finds nobody listening fails
    /// at once with [`ConnectError::NoListener`] instead of asking again
    /// until the timeout, as a socket's connect is refused. For callers
    /// whose peers listen before their addresses are handed out (the
    /// libfabric provider), where nobody listening means a wrong address
    /// or a peer gone.
    pub fn connect_request_listening(
        &self,
        remote: &NetAddress,
        timeout: Duration,
        private: &[u8],
    ) -> Result<RemoteViAttributes, ConnectError> {
        self.connect_client(remote, timeout, Duration::ZERO, private)
    }

    /// A client's request, asking again for `listener` while nobody listens.
    fn connect_client(
        &self,
        remote: &NetAddress,
        timeout: Duration,
        listener: Duration,
        private: &[u8],
    ) -> Result<RemoteViAttributes, ConnectError> {
        self.connect(remote, None, Patience { timeout, listener }, private)
    }

    /// Connects peer to peer (VipConnectPeerRequest and VipConnectPeerWait
    /// in one call): this VI waits on `local` while it asks the VI waiting
    /// on `remote`; the other side does the same with the discriminators
    /// swapped, and whichever request arrives first connects both. Offered
    /// where [`NicAttributes::peer_to_peer`](crate::NicAttributes) says so.
    pub fn connect_peer_request(
        &self,
        local: &Discriminator,
        remote: &NetAddress,
        timeout: Duration,
    ) -> Result<RemoteViAttributes, ConnectError> {
        if !self.s.nic.attrs.peer_to_peer {
            return Err(ConnectError::Unsupported(
                "peer-to-peer connection on this provider",
            ));
        }
        let wait = Patience {
            timeout,
            listener: timeout,
        };
        self.connect(remote, Some(local), wait, &[])
    }

    fn connect(
        &self,
        remote: &NetAddress,
        local: Option<&Discriminator>,
        wait: Patience,
        private: &[u8],
    ) -> Result<RemoteViAttributes, ConnectError> {
        crate::cm::check_private(private)?;
        {
            let _g = self.lock();
            let st = self.state();
            if st != ViState::Idle {
                return Err(ConnectError::InvalidState(st));
            }
            self.set_state(ViState::PendingConnect);
        }
        let r = self
            .s
            .nic
            .provider
            .connect(self, remote, local, wait, private);
        if r.is_err() {
            self.set_state(ViState::Idle);
        }
        r
    }

    /// The private data the peer's answer carried (its accept, or its
    /// reject after a refused connect); empty if none.
    pub fn peer_private_data(&self) -> Vec<u8> {
        self.lock().q.remote_private.clone()
    }

    /// Makes `t` this VI's connection to a peer with attributes `remote`
    /// and moves it to Connected (a provider's connect or accept).
    pub(crate) fn install(&self, g: &mut ViInner, t: Transport, remote: RemoteViAttributes) {
        self.s.inner.allow_bias(t.biased());
        g.t = t;
        g.q.remote = Some(remote);
        self.set_state(ViState::Connected);
    }

    /// Ends the connection (VipDisconnect): the peer sees its VI fail, every
    /// outstanding descriptor here completes as flushed, and the VI is Idle.
    pub fn disconnect(&self) {
        let mut g = self.lock();
        let ViInner { q, t } = &mut *g;
        t.disconnect(self, q);
        self.flush(q, status::DESC_FLUSHED_ERROR);
        q.remote = None;
        self.set_state(ViState::Idle);
    }

    /// Destroys the VI (VipDestroyVi): refused while connected or while
    /// descriptors are still queued.
    pub fn destroy(self) -> Result<(), (Vi, ViAttrError)> {
        let st = self.state();
        let busy = {
            let g = self.lock();
            !g.q.sq.is_empty() || !g.q.rq.is_empty()
        };
        if st == ViState::Connected || st == ViState::PendingConnect || busy {
            return Err((self, ViAttrError::InvalidState(st)));
        }
        self.s.uncount();
        drop(self);
        Ok(())
    }

    /// Does what a NIC's processor would do between the program's calls:
    /// takes in what has arrived, sends what a burst of posts deferred, and
    /// runs the protocol's timers (acknowledgements, retransmissions,
    /// keep-alives). The done and wait calls do this themselves; a program
    /// that may go long without them (the C API's library thread) calls this
    /// now and then. Takes no descriptor off a queue.
    pub fn drive(&self) {
        let mut g = self.lock();
        let ViInner { q, t } = &mut *g;
        t.progress(self, q);
        t.run_timers(self, q);
    }

    /// [`drive`](Self::drive) if no other thread holds the VI now; false
    /// if one does, or waits on one of its CQs (it is driving the VI itself). For a thread that drives
    /// VIs in the background and must never wait on a polling one.
    pub fn try_drive(&self) -> bool {
        self.try_drive_looking(false)
    }

    /// [`try_drive`](Self::try_drive), then a look at the peer's health
    /// (it may cost a system call), which progress makes only now and
    /// then: for a program that waits on a connection's events (a
    /// disconnect) and makes no done call in between.
    pub fn try_watch(&self) -> bool {
        self.try_drive_looking(true)
    }

    /// True if the peer has left with messages still waiting for
    /// receives (shm: the connection stays up until they are taken, a
    /// second at most): a face that holds receives back from the VI
    /// posts them now. False if another thread holds the VI.
    pub fn peer_leaving(&self) -> bool {
        self.s.inner.try_lock().is_some_and(|g| g.t.peer_leaving())
    }

    fn try_drive_looking(&self, look: bool) -> bool {
        // A thread asleep in a wait on one of the VI's CQs drives it itself
        // (it wakes on the VI's input and runs its timers): a frame taken
        // here would reach it through one more wake-up, a thread later.
        let waited = |c: &Option<Arc<CqShared>>| c.as_ref().is_some_and(|c| c.driven_by_waiter());
        if waited(&self.s.recv_cq) || waited(&self.s.send_cq) {
            return false;
        }
        let Some(mut g) = self.s.inner.try_lock() else {
            return false;
        };
        let ViInner { q, t } = &mut *g;
        t.progress(self, q);
        t.run_timers(self, q);
        if look {
            t.check_peer(self, q);
        }
        true
    }

    /// Completes what can complete without waiting (used by CQs); true if
    /// anything moved.
    pub(crate) fn poll_progress(s: Arc<ViShared>) -> bool {
        let vi = Vi { s };
        let mut g = vi.lock();
        let ViInner { q, t } = &mut *g;
        t.progress(&vi, q)
    }

    /// Sleeps up to `nap` in the receive of the VI's own medium, then
    /// moves the VI forward with what arrived: a waiter on this VI (or a
    /// CQ of it alone) makes one system call where a `poll` and a receive
    /// are two. `None` (nothing slept) if the VI has no such medium now
    /// (`NetVi::lend_recv`), or if less than [`RECV_NAP_LEFT`] of the
    /// wait's `nap` is left. Nothing but a frame or the time ends such a
    /// sleep, and the kernel counts the time in whole ticks: it lasts
    /// [`RECV_NAP`] rounded up so, and callers make only a wait's first
    /// sleep so.
    pub(crate) fn sleep_in_recv(s: &Arc<ViShared>, nap: std::time::Duration) -> Option<bool> {
        if nap < RECV_NAP_LEFT {
            return None;
        }
        let nap = nap.min(RECV_NAP);
        let vi = Vi { s: s.clone() };
        let mut lent = vi.lock().t.lend_recv()?;
        let n = lent.recv_wait(nap);
        let mut g = vi.lock();
        let ViInner { q, t } = &mut *g;
        Some(t.slept_in_recv(&vi, q, lent, n))
    }

    /// Runs the VI's protocol timers (a CQ waiter that has slept).
    pub(crate) fn run_timers(s: Arc<ViShared>) {
        let vi = Vi { s };
        let mut g = vi.lock();
        let ViInner { q, t } = &mut *g;
        t.run_timers(&vi, q);
    }

    /// Arms this VI's doorbell for an eventfd wake-up; `true` if something
    /// is already waiting to be served.
    pub(crate) fn arm_eventfd(s: Arc<ViShared>) -> bool {
        let vi = Vi { s };
        let mut g = vi.lock();
        let ViInner { q, t } = &mut *g;
        t.arm_eventfd(&vi, q)
    }

    /// Arms this VI's wake-up for a CQ waiter that sleeps on its VIs'
    /// doorbells at once ([`Sleep::watch`](crate::provider::Sleep::watch)).
    /// Progress is to be looked at once more before sleeping
    /// ([`poll_progress`](Self::poll_progress)).
    pub(crate) fn arm_sleep(s: &Arc<ViShared>) -> crate::provider::Sleep {
        s.inner.lock().t.arm(&s.nic)
    }

    /// Looks at the peer's health (a CQ waiter that slept a full slice);
    /// true if anything changed.
    pub(crate) fn check_peer(s: Arc<ViShared>) -> bool {
        let vi = Vi { s };
        let mut g = vi.lock();
        let ViInner { q, t } = &mut *g;
        t.check_peer(&vi, q)
    }

    /// What a CQ waiter polls for this VI's input beside its eventfd.
    pub(crate) fn wake_fd(s: &Arc<ViShared>) -> Option<std::os::fd::RawFd> {
        s.inner.lock().t.wake_fd(&s.nic)
    }
}

/// Target-side check of an RDMA request on `attrs`' VI: handle, bounds,
/// tag, the region's and the VI's enable bits.
pub(crate) fn check_rdma(
    regions: &crate::mem::RegionTable,
    attrs: &ViAttributes,
    handle: MemHandle,
    addr: u64,
    len: u64,
    write: bool,
) -> Result<(), AccessError> {
    let r = regions.check(handle, attrs.ptag, addr, len)?;
    match write {
        true if !(r.attrs.enable_rdma_write && attrs.enable_rdma_write) => {
            Err(AccessError::RdmaWriteDisabled(handle.0))
        }
        false if !(r.attrs.enable_rdma_read && attrs.enable_rdma_read) => {
            Err(AccessError::RdmaReadDisabled(handle.0))
        }
        _ => Ok(()),
    }
}

/// Checks a descriptor and captures what progress needs from it.
///
/// # Safety
/// `d` is valid as described in `post_send_raw`.
pub(crate) unsafe fn prepare(
    nic: &NicShared,
    attrs: &ViAttributes,
    e: &mut Posted,
    d: NonNull<Descriptor>,
    owned: bool,
    q: Queue,
) -> Result<(), PostError> {
    // SAFETY: the caller guarantees a valid control segment.
    let cs = unsafe { &mut (*d.as_ptr()).cs };
    if cs.control & control::RESERVED != 0 {
        return Err(PostError::Format("reserved control bits are set"));
    }
    let n = cs.seg_count as usize;
    if n > MAX_SEGMENTS {
        return Err(PostError::Format("more segments than the Nic supports"));
    }
    // SAFETY: `n` segments follow the control segment (caller's contract,
    // and at most MAX_SEGMENTS, which a `Descriptor` holds).
    let segs: &[Segment] = unsafe {
        std::slice::from_raw_parts((d.as_ptr() as *const u8).add(32) as *const Segment, n)
    };
    if cs.control & !control::IMMEDIATE == 0 && n == 1 {
        // One segment, send or receive: the common case, in few instructions.
        // SAFETY: one segment follows the control segment.
        let s = unsafe { *((d.as_ptr() as *const u8).add(32) as *const Segment) };
        let region = nic
            .regions
            .check(s.handle, attrs.ptag, s.addr, s.length as u64)
            .map_err(|error| PostError::Segment { index: 0, error })?;
        if q == Queue::Recv && region.attrs.read_only {
            return Err(PostError::Segment {
                index: 0,
                error: AccessError::ReadOnly(s.handle.0),
            });
        }
        if s.length > attrs.max_transfer_size {
            return Err(PostError::TooLong {
                len: s.length as u64,
                max: attrs.max_transfer_size,
            });
        }
        e.desc = d;
        e.owned = owned;
        e.op = Op::SendRecv;
        e.fence = false;
        e.imm = (cs.control & control::IMMEDIATE != 0).then_some(cs.immediate_data);
        e.state = EntryState::Queued;
        e.ranges[0] = LocalRange {
            ptr: s.addr as *mut u8,
            len: s.length as usize,
        };
        e.src[0] = Source {
            handle: s.handle,
            serial: region.serial,
            fd: region.fd,
            offset: s.addr.wrapping_sub(region.fd_base),
            fd_len: region.fd_len,
        };
        e.nranges = 1;
        e.total = s.length as u64;
        cs.status = 0;
        if q == Queue::Recv {
            cs.length = 0;
        }
        return Ok(());
    }
    let op = match cs.control & control::OP_MASK {
        control::OP_SENDRECV => Op::SendRecv,
        control::OP_RDMAWRITE => Op::RdmaWrite,
        control::OP_RDMAREAD => Op::RdmaRead,
        _ => return Err(PostError::Format("unknown operation")),
    };
    if q == Queue::Recv && op != Op::SendRecv {
        return Err(PostError::Format(
            "a receive descriptor must have the send/receive operation",
        ));
    }
    let (remote, local, first) = match op {
        Op::SendRecv => ((0, MemHandle(0)), segs, 0),
        Op::RdmaWrite | Op::RdmaRead => {
            let Some((r, rest)) = segs.split_first() else {
                return Err(PostError::Format(
                    "an RDMA descriptor needs an address segment",
                ));
            };
            ((r.addr, r.handle), rest, 1)
        }
    };
    if op == Op::RdmaRead && attrs.reliability == Reliability::Unreliable {
        return Err(PostError::NotEnabled(
            "RDMA read (VIA requires a reliable VI)",
        ));
    }
    if op == Op::RdmaRead && cs.control & control::IMMEDIATE != 0 {
        return Err(PostError::Format("RDMA read carries no immediate data"));
    }
    e.desc = d;
    e.owned = owned;
    e.op = op;
    e.fence = cs.control & control::QFENCE != 0;
    e.imm = (cs.control & control::IMMEDIATE != 0).then_some(cs.immediate_data);
    e.remote = remote;
    e.state = EntryState::Queued;
    let mut total = 0u64;
    let slots = e.ranges.iter_mut().zip(e.src.iter_mut());
    for (i, ((r, src), s)) in slots.zip(local).enumerate() {
        let region = nic
            .regions
            .check(s.handle, attrs.ptag, s.addr, s.length as u64)
            .map_err(|error| PostError::Segment {
                index: first + i,
                error,
            })?;
        // A receive's buffers and an RDMA read's destination are written.
        if region.attrs.read_only && (q == Queue::Recv || op == Op::RdmaRead) {
            return Err(PostError::Segment {
                index: first + i,
                error: AccessError::ReadOnly(s.handle.0),
            });
        }
        *r = LocalRange {
            ptr: s.addr as *mut u8,
            len: s.length as usize,
        };
        *src = Source {
            handle: s.handle,
            serial: region.serial,
            fd: region.fd,
            offset: s.addr.wrapping_sub(region.fd_base),
            fd_len: region.fd_len,
        };
        total += s.length as u64;
    }
    e.nranges = local.len() as u8;
    e.total = total;
    if e.total > attrs.max_transfer_size as u64 {
        return Err(PostError::TooLong {
            len: e.total,
            max: attrs.max_transfer_size,
        });
    }
    cs.status = 0;
    if q == Queue::Recv {
        cs.length = 0;
    }
    Ok(())
}

fn check_attrs(nic: &NicShared, a: &ViAttributes) -> Result<(), ViAttrError> {
    if a.max_transfer_size > nic.attrs.max_transfer_size {
        return Err(ViAttrError::TransferTooLarge {
            asked: a.max_transfer_size,
            max: nic.attrs.max_transfer_size,
        });
    }
    for d in [a.send_queue_depth, a.recv_queue_depth] {
        if d == 0 || d > nic.attrs.max_queue_depth {
            return Err(ViAttrError::QueueDepth {
                asked: d,
                max: nic.attrs.max_queue_depth,
            });
        }
    }
    nic.check_ptag(a.ptag)
        .map_err(|_| ViAttrError::InvalidPtag(a.ptag.raw()))
}

impl Drop for ViShared {
    fn drop(&mut self) {
        let g = self.inner.get_mut();
        std::mem::replace(&mut g.t, Transport::None).drop_connection(&self.nic);
        for q in [&mut g.q.sq, &mut g.q.rq] {
            while let Some((desc, owned)) = q.pop_front() {
                if owned {
                    // SAFETY: owned descriptors came from `Box::leak` in post_*.
                    drop(unsafe { Box::from_raw(desc.as_ptr()) });
                }
            }
        }
        // A VI destroyed earlier no longer counts (its CQs hold only weak
        // references, which die with it).
        if std::mem::replace(&mut g.q.counted, false) {
            self.nic.hold_ptag(g.q.attrs.ptag, -1);
        }
    }
}

impl ViShared {
    /// Ends the VI's use of its protection tag and its membership of its
    /// CQs, once (see [`Queues::counted`]). The CQs' member locks are taken
    /// after the VI's is let go: a CQ's poll takes them the other way round.
    fn uncount(self: &Arc<ViShared>) {
        let (was, ptag) = {
            let mut g = self.inner.lock();
            (std::mem::replace(&mut g.q.counted, false), g.q.attrs.ptag)
        };
        if was {
            self.nic.hold_ptag(ptag, -1);
            for cq in [&self.send_cq, &self.recv_cq].into_iter().flatten() {
                cq.detach(self);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    #[test]
    fn a_range_is_cut_where_the_shared_window_begins_and_ends() {
        let src = |offset: i64, fd_len: u64| super::Source {
            handle: MemHandle(1),
            serial: 1,
            fd: 3,
            offset: offset as u64,
            fd_len,
        };
        // Inside the window: one mappable piece.
        let one = |n| ([(n, true), (0, false), (0, false)], 1);
        assert_eq!(src(0, 8192).pieces(8192), one(8192));
        assert!(src(100, 8192).mappable(8092));
        assert!(!src(100, 8192).mappable(8093));
        // Starting 100 bytes before the window and ending 50 past it.
        let s = src(-100, 8192);
        assert!(!s.mappable(8342));
        assert_eq!(
            s.pieces(8342),
            ([(100, false), (8192, true), (50, false)], 3)
        );
        // Wholly before it, and memory no memfd backs.
        let before = ([(60, false), (0, false), (0, false)], 1);
        assert_eq!(src(-100, 8192).pieces(60), before);
        let none = super::Source {
            fd: -1,
            ..src(0, 0)
        };
        assert_eq!(none.pieces(60), before);
        assert!(!none.mappable(1));
    }

    static NEXT: AtomicU64 = AtomicU64::new(1);

    /// Another holder of a destroyed VI (the shm agent serving it at that
    /// moment) does not keep its tag or its CQ in use.
    #[test]
    fn a_destroyed_vi_frees_its_tag_and_cq_while_still_held_elsewhere() {
        let nic = Nic::open("shm").unwrap();
        let ptag = nic.create_ptag().unwrap();
        let cq = nic.create_cq(8).unwrap();
        let vi = nic
            .create_vi(ViAttributes::new(ptag), Some(&cq), Some(&cq))
            .unwrap();
        let held = vi.clone();
        assert!(matches!(nic.destroy_ptag(ptag), Err(PtagError::InUse(_))));
        vi.destroy().map_err(|(_, e)| e).unwrap();
        nic.destroy_ptag(ptag).unwrap();
        cq.destroy().map_err(|(_, e)| e).unwrap();
        // The last holder's drop counts nothing a second time.
        drop(held);
        let again = nic.create_ptag().unwrap();
        let vi = nic.create_vi(ViAttributes::new(again), None, None).unwrap();
        drop(vi);
        nic.destroy_ptag(again).unwrap();
    }

    /// One end of an in-process connection with its buffers.
    pub(crate) struct Side {
        pub vi: Vi,
        pub nic: Nic,
        pub ptag: Ptag,
        pub buf: MemoryRegion,
    }

    impl Side {
        pub fn recv_buf(&self) -> &MemoryRegion {
            &self.buf
        }

        /// Sends `data` from a fresh region and waits for the send to complete.
        pub fn send(&self, data: &[u8]) {
            let mut r = self
                .nic
                .alloc_region(data.len().max(1), MemAttributes::new(self.ptag))
                .unwrap();
            r.as_mut_slice()[..data.len()].copy_from_slice(data);
            self.vi
                .post_send(Box::new(Descriptor::send(&[r.segment(0, data.len())])))
                .unwrap();
            let d = self.vi.send_wait(Some(Duration::from_secs(5))).unwrap();
            assert_eq!(d.result(), Ok(data.len() as u32));
        }
    }

    /// A client VI and a server VI of `nic` connected to each other (on
    /// any medium: the client asks for the Nic's own address); the
    /// server's receive queue reports to `recv_cq`. Returns (client, server).
    pub(crate) fn connected_pair_with(nic: &Nic, recv_cq: Option<&Cq>) -> (Side, Side) {
        let attrs = |p| ViAttributes::new(p).rdma(true, true);
        let ptag = nic.create_ptag().unwrap();
        let client = nic.create_vi(attrs(ptag), None, None).unwrap();
        let server = nic.create_vi(attrs(ptag), None, recv_cq).unwrap();
        let disc = Discriminator::from_u64(
            (std::process::id() as u64) << 32 | NEXT.fetch_add(1, Ordering::Relaxed),
        );
        let (n2, s2, d2) = (nic.clone(), server.clone(), disc.clone());
        let t = std::thread::spawn(move || {
            let mut req = n2.connect_wait(&d2, Some(Duration::from_secs(5))).unwrap();
            req.accept(&s2).unwrap();
            n2.stop_listening(&d2);
        });
        let host = nic.attributes().address.clone();
        client
            .connect_request(&NetAddress::new(&host, disc), Duration::from_secs(5))
            .unwrap();
        t.join().unwrap();
        let side = |vi: Vi| Side {
            vi,
            nic: nic.clone(),
            ptag,
            buf: nic
                .alloc_region(
                    4096,
                    MemAttributes::new(ptag).rdma_write(true).rdma_read(true),
                )
                .unwrap(),
        };
        (side(client), side(server))
    }

    #[test]
    fn a_descriptor_is_posted_once_until_it_is_handed_back() {
        let nic = Nic::open("shm").unwrap();
        let (a, b) = connected_pair_with(&nic, None);
        let recv = Box::into_raw(Box::new(Descriptor::recv(&[b.buf.segment(0, 64)])));
        let recv = std::ptr::NonNull::new(recv).unwrap();
        // SAFETY: a live descriptor, handed back below before it is freed.
        unsafe {
            b.vi.post_recv_raw(recv, false).unwrap();
            assert_eq!(
                b.vi.post_recv_raw(recv, false),
                Err(PostError::AlreadyPosted),
                "a second post of a queued receive"
            );
        }
        a.send(b"hi");
        let back = loop {
            if let Some(d) = b.vi.recv_done_raw() {
                break d;
            }
        };
        assert_eq!(back, recv);
        // SAFETY: handed back: the program's again, posted once more.
        unsafe {
            assert_eq!((*back.as_ptr()).result(), Ok(2));
            *back.as_ptr() = Descriptor::recv(&[b.buf.segment(0, 64)]);
            b.vi.post_recv_raw(back, false).unwrap();
        }
        // A send refused (too long) is the caller's again at once.
        let big = Box::into_raw(Box::new(Descriptor::send(&[a.buf.segment(0, 4096)])));
        let big = std::ptr::NonNull::new(big).unwrap();
        // SAFETY: a live descriptor; refused, so never queued.
        unsafe {
            (*big.as_ptr()).ds[0].length = u32::MAX;
            assert!(a.vi.post_send_raw(big, false).is_err());
            assert_ne!(
                a.vi.post_send_raw(big, false),
                Err(PostError::AlreadyPosted)
            );
            drop(Box::from_raw(big.as_ptr()));
        }
        b.vi.disconnect();
        while b.vi.recv_done_raw().is_none() {}
        // SAFETY: handed back by the disconnect.
        drop(unsafe { Box::from_raw(recv.as_ptr()) });
    }

    /// A look over one queue hands back what its poll completed, and a
    /// look over both finds the other queue's head too (the receive's
    /// poll moves the sends forward as well).
    #[test]
    fn a_look_over_one_queue_or_both_takes_what_the_poll_completed() {
        let nic = Nic::open("shm").unwrap();
        let (a, b) = connected_pair_with(&nic, None);
        let raw = |d: Descriptor| std::ptr::NonNull::new(Box::into_raw(Box::new(d))).unwrap();
        let look = |vi: &Vi, queues: &[Queue]| {
            let t = std::time::Instant::now();
            loop {
                if let Some(found) = vi.done_raw_of(queues) {
                    break found;
                }
                assert!(t.elapsed() < Duration::from_secs(5), "nothing completed");
            }
        };
        let recv_b = raw(Descriptor::recv(&[b.buf.segment(0, 64)]));
        let recv_a = raw(Descriptor::recv(&[a.buf.segment(0, 64)]));
        let send_a = raw(Descriptor::send(&[a.buf.segment(64, 5)]));
        // SAFETY: live descriptors, each handed back below before it is freed.
        unsafe {
            b.vi.post_recv_raw(recv_b, false).unwrap();
            a.vi.post_recv_raw(recv_a, false).unwrap();
            a.vi.post_send_raw(send_a, false).unwrap();
        }
        assert_eq!(look(&b.vi, &[Queue::Recv]), (Queue::Recv, recv_b));
        assert_eq!(look(&a.vi, &[Queue::Send]), (Queue::Send, send_a));
        assert!(a.vi.done_raw_of(&[Queue::Send]).is_none(), "taken once");
        // Both queues: the answer's receive, then a send completed since.
        b.send(b"back");
        let send_a2 = raw(Descriptor::send(&[a.buf.segment(64, 3)]));
        // SAFETY: as above.
        unsafe { a.vi.post_send_raw(send_a2, false).unwrap() };
        let mut got = vec![look(&a.vi, &[Queue::Recv, Queue::Send])];
        got.push(look(&a.vi, &[Queue::Recv, Queue::Send]));
        got.sort_by_key(|(q, _)| *q == Queue::Send);
        assert_eq!(got, vec![(Queue::Recv, recv_a), (Queue::Send, send_a2)]);
        // SAFETY: handed back: the program's again.
        unsafe {
            assert_eq!((*recv_b.as_ptr()).result(), Ok(5));
            assert_eq!((*recv_a.as_ptr()).result(), Ok(4));
            for d in [recv_a, recv_b, send_a, send_a2] {
                drop(Box::from_raw(d.as_ptr()));
            }
        }
    }

    #[test]
    fn send_recv_with_immediate_and_in_order() {
        let nic = Nic::open("shm").unwrap();
        let (a, b) = connected_pair_with(&nic, None);
        for i in 0..5u8 {
            b.vi.post_recv(Box::new(Descriptor::recv(&[b
                .buf
                .segment(64 * i as usize, 64)])))
                .unwrap();
        }
        let mut src = nic.alloc_region(64, MemAttributes::new(a.ptag)).unwrap();
        for i in 0..5u8 {
            src.as_mut_slice()[0] = i;
            let d =
                Descriptor::send(&[src.segment(0, 1 + i as usize)]).with_immediate(100 + i as u32);
            a.vi.post_send(Box::new(d)).unwrap();
            a.vi.send_wait(Some(Duration::from_secs(5)))
                .unwrap()
                .result()
                .unwrap();
        }
        for i in 0..5u8 {
            let d = b.vi.recv_wait(Some(Duration::from_secs(5))).unwrap();
            assert_eq!(d.result(), Ok(1 + i as u32));
            assert_eq!(d.immediate(), Some(100 + i as u32));
            assert_eq!(b.buf.as_slice()[64 * i as usize], i);
        }
    }

    #[test]
    fn refused_posts_hand_the_descriptor_back_and_queue_nothing() {
        let nic = Nic::open("shm").unwrap();
        let ptag = nic.create_ptag().unwrap();
        let idle = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
        let r = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
        let rej = idle
            .post_send(Box::new(Descriptor::send(&[r.segment(0, 8)])))
            .unwrap_err();
        assert_eq!(rej.error, PostError::NotConnected(ViState::Idle));
        assert_eq!(
            rej.descriptor.ds[0].length, 8,
            "the same descriptor comes back"
        );

        let (a, b) = connected_pair_with(&nic, None);
        let beyond =
            a.vi.post_send(Box::new(Descriptor::send(&[a.buf.segment(4000, 200)])))
                .unwrap_err();
        assert!(matches!(
            beyond.error,
            PostError::Segment {
                index: 0,
                error: AccessError::OutOfBounds { .. }
            }
        ));
        let other = nic.create_ptag().unwrap();
        let foreign = nic.alloc_region(64, MemAttributes::new(other)).unwrap();
        let wrong =
            a.vi.post_send(Box::new(Descriptor::send(&[foreign.segment(0, 8)])))
                .unwrap_err();
        assert!(matches!(
            wrong.error,
            PostError::Segment {
                error: AccessError::WrongPtag { .. },
                ..
            }
        ));
        let bogus = Segment::local(a.buf.addr(), MemHandle(0x7777_0001), 8);
        let unreg =
            a.vi.post_send(Box::new(Descriptor::send(&[bogus])))
                .unwrap_err();
        assert!(matches!(
            unreg.error,
            PostError::Segment {
                error: AccessError::NotRegistered(_),
                ..
            }
        ));
        let too_many =
            a.vi.post_send(Box::new(Descriptor::send(&[a.buf.segment(0, 1); 7])))
                .unwrap_err();
        assert!(matches!(too_many.error, PostError::Format(_)));
        // Memory registered to be read only is sent from, never written:
        // not a receive's buffer, one segment or several, nor an RDMA
        // read's destination.
        let mut ro = vec![7u8; 256];
        // SAFETY: a live buffer, deregistered before it is dropped.
        let h = unsafe {
            nic.register_mem(
                ro.as_mut_ptr(),
                256,
                MemAttributes::new(a.ptag).read_only(true),
            )
        }
        .unwrap();
        let seg = |at: usize, n: u32| Segment::local(ro.as_ptr().wrapping_add(at) as *mut u8, h, n);
        let remote = Segment::remote(b.buf.addr() as u64, b.buf.handle());
        let refusals = [
            a.vi.post_recv(Box::new(Descriptor::recv(&[seg(0, 64)]))),
            a.vi.post_recv(Box::new(Descriptor::recv(&[
                a.buf.segment(0, 8),
                seg(64, 64),
            ]))),
            a.vi.post_send(Box::new(Descriptor::rdma_read(remote, &[seg(0, 8)]))),
        ];
        for r in refusals {
            let e = r.unwrap_err().error;
            assert!(
                matches!(
                    e,
                    PostError::Segment {
                        error: AccessError::ReadOnly(_),
                        ..
                    }
                ),
                "{e:?}"
            );
        }
        a.vi.post_send(Box::new(Descriptor::send(&[seg(0, 8)])))
            .expect("a send reads it");
        assert!(a
            .vi
            .send_wait(Some(Duration::from_secs(5)))
            .unwrap()
            .result()
            .is_ok());
        nic.deregister_mem(h).unwrap();
        assert!(a.vi.send_done().is_none(), "nothing was queued");
        assert_eq!(a.vi.state(), ViState::Connected, "the VI stays usable");
    }

    #[test]
    fn wait_times_out_and_disconnect_flushes_both_sides() {
        let nic = Nic::open("shm").unwrap();
        let (a, b) = connected_pair_with(&nic, None);
        b.vi.post_recv(Box::new(Descriptor::recv(&[b.buf.segment(0, 64)])))
            .unwrap();
        assert_eq!(
            b.vi.recv_wait(Some(Duration::from_millis(30))).unwrap_err(),
            WaitError::Timeout
        );
        // A spin longer than the wait's timeout is cut to it: the wait
        // ends at its timeout, not after the spin (a minute here).
        b.vi.set_wait_spin(Duration::from_secs(60));
        let t = std::time::Instant::now();
        assert_eq!(
            b.vi.recv_wait(Some(Duration::from_millis(30))).unwrap_err(),
            WaitError::Timeout
        );
        assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
        a.vi.disconnect();
        assert_eq!(a.vi.state(), ViState::Idle);
        let d = b.vi.recv_wait(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(d.error(), Some(CompletionError::Flushed));
        assert_eq!(b.vi.state(), ViState::Error);
    }

    #[test]
    fn rdma_write_and_read_are_checked_on_the_target() {
        let nic = Nic::open("shm").unwrap();
        let (a, b) = connected_pair_with(&nic, None);
        let mut src = nic.alloc_region(256, MemAttributes::new(a.ptag)).unwrap();
        src.as_mut_slice().fill(0xab);
        // The target serves requests inside its own calls: poll it from a thread.
        let target = b.vi.clone();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let t = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                let _ = target.recv_done();
            }
        });
        let w = Descriptor::rdma_write(b.buf.remote(100), &[src.segment(0, 50)]);
        a.vi.post_send(Box::new(w)).unwrap();
        assert_eq!(
            a.vi.send_wait(Some(Duration::from_secs(5)))
                .unwrap()
                .result(),
            Ok(50)
        );
        let mut dst = nic.alloc_region(64, MemAttributes::new(a.ptag)).unwrap();
        let r = Descriptor::rdma_read(b.buf.remote(100), &[dst.segment(0, 50)]);
        a.vi.post_send(Box::new(r)).unwrap();
        assert_eq!(
            a.vi.send_wait(Some(Duration::from_secs(5)))
                .unwrap()
                .result(),
            Ok(50)
        );
        assert!(dst.as_mut_slice()[..50].iter().all(|&x| x == 0xab));
        // Out of the target region's bounds: refused there, nothing written.
        let bad = Descriptor::rdma_write(b.buf.remote(4090), &[src.segment(0, 50)]);
        a.vi.post_send(Box::new(bad)).unwrap();
        let d = a.vi.send_wait(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(d.error(), Some(CompletionError::RdmaProtection));
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
        assert!(
            b.buf.as_slice()[4090..].iter().all(|&x| x == 0),
            "target memory untouched"
        );
        assert_eq!(a.vi.state(), ViState::Error);
    }
}
