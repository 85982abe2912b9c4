//! Virtual interfaces: a send queue and a receive queue joined to one peer.
//!
//! Posting validates the descriptor at once (nothing is queued when it is
//! refused) and, when the ring has room, writes the message straight into the
//! ring: the doorbell is that store. Progress (copying arrived messages into
//! posted receive buffers, serving the peer's RDMA, noticing the peer's
//! consumption) runs inside the caller's done and wait calls and the CQ's;
//! there is no thread behind the caller's back. Descriptors complete in
//! order on each queue and carry their status like VIPL's.

use crate::cm::{check_compatible, socket_name, Discriminator, NetAddress, RemoteViAttributes};
use crate::cq::{Cq, CqShared};
use crate::desc::{control, status, Descriptor, MemHandle, Op, Segment, MAX_SEGMENTS};
use crate::error::{ConnectError, PostError, Rejected, ViAttrError, WaitError};
use crate::mem::{AccessError, Ptag};
use crate::nic::{Nic, NicShared};
use crate::shm::hello::{self, Hello};
use crate::shm::{flag, kind, MsgHeader, ShmConn, WireRange, INLINE_MAX};
use spin::{Mutex, MutexGuard};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uvia_shm::cma::{self, LocalRange, RemoteRange};
use uvia_shm::{doorbell, Segment as ShmSegment, Stream};

pub(crate) mod net;

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
/// Empty polls between two looks at the peer's health (a system call).
const IDLE_CHECK_EVERY: u32 = 4096;
/// Longest sleep of a network VI's waiter: the engine's timers (delayed
/// acks, retransmissions, keep-alives) run in its progress.
const NET_NAP: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, PartialEq, Eq)]
enum EntryState {
    Queued,
    InFlight,
    Done,
}

/// The registered region a local range lies in.
#[derive(Clone, Copy)]
struct Source {
    handle: MemHandle,
    serial: u32,
    /// The region's memfd, or -1 for caller memory.
    fd: i32,
    /// Offset of the range in the region.
    offset: u64,
}

impl Source {
    const NONE: Source = Source {
        handle: MemHandle(0),
        serial: 0,
        fd: -1,
        offset: 0,
    };
}

/// A posted descriptor with what the post checked, so that progress never
/// re-reads (or trusts) the caller's segments.
struct Posted {
    desc: NonNull<Descriptor>,
    owned: bool,
    op: Op,
    fence: bool,
    imm: Option<u32>,
    ranges: [LocalRange; MAX_SEGMENTS],
    /// Where each range lives: its region, to share it with the peer.
    src: [Source; MAX_SEGMENTS],
    nranges: u8,
    total: u64,
    remote: (u64, MemHandle),
    id: u32,
    /// Ring index just past this message once sent.
    end: u64,
    needs_ack: bool,
    state: EntryState,
}

impl Posted {
    fn ranges(&self) -> &[LocalRange] {
        &self.ranges[..self.nranges as usize]
    }

    /// True while every region the descriptor names is still the one that
    /// was registered when it was posted. Checked before the Nic touches the
    /// memory later than the post itself, so memory deregistered (and perhaps
    /// freed) in between is never written or read.
    #[inline]
    fn still_registered(&self, regions: &crate::mem::RegionTable) -> bool {
        self.src[..self.nranges as usize].iter().all(|s| {
            regions
                .lookup(s.handle)
                .is_some_and(|r| r.serial == s.serial)
        })
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
struct SlotQueue {
    slots: Box<[Posted]>,
    head: usize,
    len: usize,
}

impl SlotQueue {
    fn new(depth: u32) -> SlotQueue {
        SlotQueue {
            slots: (0..depth.max(1)).map(|_| Posted::empty()).collect(),
            head: 0,
            len: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
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

    /// The free slot after the last entry, to fill before `commit`.
    fn next_free(&mut self) -> Option<&mut Posted> {
        if self.len == self.slots.len() {
            return None;
        }
        let i = self.slot(self.len);
        Some(&mut self.slots[i])
    }

    fn commit(&mut self) {
        self.len += 1;
    }

    fn front(&self) -> Option<&Posted> {
        (self.len > 0).then(|| &self.slots[self.head])
    }

    #[inline]
    fn pop_front(&mut self) -> Option<(NonNull<Descriptor>, bool)> {
        let e = self.front()?;
        let r = (e.desc, e.owned);
        self.head = self.slot(1);
        self.len -= 1;
        Some(r)
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut Posted> {
        let (len, head, cap) = (self.len, self.head, self.slots.len());
        let (a, b) = self.slots.split_at_mut(head);
        b.iter_mut().chain(a.iter_mut()).take(len.min(cap))
    }
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

pub(crate) struct ViInner {
    attrs: ViAttributes,
    conn: Option<ShmConn>,
    seg: Option<Arc<ShmSegment>>,
    remote: Option<RemoteViAttributes>,
    sq: SlotQueue,
    /// Entries of `sq` that have been written to the ring (a prefix).
    sq_sent: usize,
    /// Entries written but waiting for the peer to consume them.
    awaiting_ack: usize,
    rq: SlotQueue,
    /// Completed entries at the front of `rq`.
    rq_done: usize,
    next_id: u32,
    idle: u32,
    spin: Duration,
    /// Set when an error reported by the peer should end the connection.
    failed: Option<u32>,
    /// The server's listening socket, on the client side of a connection.
    server_socket: Option<std::path::PathBuf>,
    /// The network connection, on a network Nic.
    net: Option<Box<net::NetVi>>,
}

pub(crate) struct ViShared {
    pub id: u32,
    nic: Arc<NicShared>,
    send_cq: Option<Arc<CqShared>>,
    recv_cq: Option<Arc<CqShared>>,
    state: AtomicU8,
    inner: Mutex<ViInner>,
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
                inner: Mutex::new(ViInner {
                    attrs,
                    conn: None,
                    seg: None,
                    remote: None,
                    sq: SlotQueue::new(attrs.send_queue_depth),
                    sq_sent: 0,
                    awaiting_ack: 0,
                    rq: SlotQueue::new(attrs.recv_queue_depth),
                    rq_done: 0,
                    next_id: 1,
                    idle: 0,
                    spin: DEFAULT_WAIT_SPIN,
                    failed: None,
                    server_socket: None,
                    net: None,
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

    pub fn state(&self) -> ViState {
        match self.s.state.load(Ordering::Acquire) {
            0 => ViState::Idle,
            1 => ViState::PendingConnect,
            2 => ViState::Connected,
            _ => ViState::Error,
        }
    }

    pub fn attributes(&self) -> ViAttributes {
        self.lock().attrs
    }

    /// The peer's attributes, once connected.
    pub fn remote_attributes(&self) -> Option<RemoteViAttributes> {
        self.lock().remote.clone()
    }

    /// Changes attributes of an idle VI.
    pub fn set_attributes(&self, attrs: ViAttributes) -> Result<(), ViAttrError> {
        let mut g = self.lock();
        if self.state() != ViState::Idle {
            return Err(ViAttrError::InvalidState(self.state()));
        }
        check_attrs(&self.s.nic, &attrs)?;
        if attrs.send_queue_depth as usize != g.attrs.send_queue_depth as usize && !g.sq.is_empty()
            || attrs.recv_queue_depth != g.attrs.recv_queue_depth && !g.rq.is_empty()
        {
            return Err(ViAttrError::InvalidState(ViState::Idle));
        }
        if attrs.ptag != g.attrs.ptag {
            if !self.s.nic.hold_ptag(attrs.ptag, 1) {
                return Err(ViAttrError::InvalidPtag(attrs.ptag.raw()));
            }
            self.s.nic.hold_ptag(g.attrs.ptag, -1);
        }
        if attrs.send_queue_depth != g.attrs.send_queue_depth {
            g.sq = SlotQueue::new(attrs.send_queue_depth);
        }
        if attrs.recv_queue_depth != g.attrs.recv_queue_depth {
            g.rq = SlotQueue::new(attrs.recv_queue_depth);
        }
        g.attrs = attrs;
        Ok(())
    }

    /// True when queue `q` holds no descriptor, completed or not (VipQueryVi).
    pub fn queue_is_empty(&self, q: Queue) -> bool {
        let g = self.lock();
        match q {
            Queue::Send => g.sq.is_empty(),
            Queue::Recv => g.rq.is_empty(),
        }
    }

    /// How long waits spin before they sleep (0: sleep at once).
    pub fn set_wait_spin(&self, spin: Duration) {
        self.lock().spin = spin;
    }

    /// The VI's state lock. A spin lock, not `std::sync::Mutex`: its release
    /// is a plain store, where std's unlock is an exchange (a full barrier
    /// that waits for the ring store just made to reach the other core).
    /// Nothing sleeps or makes a long call while holding it.
    fn lock(&self) -> MutexGuard<'_, ViInner> {
        self.s.inner.lock()
    }

    fn set_state(&self, st: ViState) {
        self.s.state.store(st as u8, Ordering::Release);
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
        let r = unsafe { self.post_send_locked(d, owned) };
        uvia_trace::mark!(AppSendReturned);
        r
    }

    /// # Safety
    /// As for [`post_send_raw`](Self::post_send_raw).
    #[inline(always)]
    unsafe fn post_send_locked(
        &self,
        d: NonNull<Descriptor>,
        owned: bool,
    ) -> Result<(), PostError> {
        let mut g = self.lock();
        match self.state() {
            ViState::Connected => {}
            ViState::Error => return Err(PostError::ViError),
            st => return Err(PostError::NotConnected(st)),
        }
        if g.net.is_some() {
            // SAFETY: forwarded from the caller.
            return unsafe { self.net_post_send(&mut g, d, owned) };
        }
        // SAFETY: forwarded from the caller.
        if let Some(r) = unsafe { self.send_inline_fast(&mut g, d, owned) } {
            return r;
        }
        let (attrs, id) = (g.attrs, g.next_id);
        let nic = &self.s.nic;
        let len = g.sq.len();
        let Some(slot) = g.sq.next_free() else {
            return Err(PostError::QueueFull("send", len));
        };
        // SAFETY: forwarded from the caller.
        unsafe { prepare(nic, &attrs, slot, d, owned, Queue::Send)? };
        slot.id = id;
        g.next_id = id.wrapping_add(1);
        g.sq.commit();
        if g.sq_sent == g.sq.len() - 1 {
            self.send_queued(&mut g);
        }
        Ok(())
    }

    /// The common case in few instructions: a plain send of one segment that
    /// fits inline, nothing queued ahead of it, completing when written
    /// (Unreliable and Reliable Delivery). `None` leaves the descriptor to
    /// the general path, which gives the same result for these cases.
    ///
    /// # Safety
    /// As for [`post_send_raw`](Self::post_send_raw).
    #[inline]
    unsafe fn send_inline_fast(
        &self,
        g: &mut ViInner,
        d: NonNull<Descriptor>,
        owned: bool,
    ) -> Option<Result<(), PostError>> {
        // SAFETY: the caller guarantees a valid control segment.
        let cs = unsafe { &mut (*d.as_ptr()).cs };
        if cs.control & !control::IMMEDIATE != 0
            || cs.seg_count != 1
            || g.sq_sent != g.sq.len()
            || g.attrs.reliability == Reliability::ReliableReception
        {
            return None;
        }
        // SAFETY: one segment follows the control segment (caller's contract).
        let s = unsafe { *((d.as_ptr() as *const u8).add(32) as *const Segment) };
        let len = s.length as usize;
        if len > INLINE_MAX || s.length > g.attrs.max_transfer_size {
            return None;
        }
        if let Err(error) = self
            .s
            .nic
            .regions
            .check(s.handle, g.attrs.ptag, s.addr, len as u64)
        {
            return Some(Err(PostError::Segment { index: 0, error }));
        }
        let id = g.next_id;
        let ViInner { conn, sq, .. } = g;
        let slot = sq.next_free()?;
        let conn = conn.as_mut()?;
        let p = conn.tx.reserve(crate::shm::MSG_HEADER + len)?;
        let imm = cs.control & control::IMMEDIATE != 0;
        let hdr = MsgHeader {
            kind: kind::SEND,
            flags: imm as u8 * flag::IMM,
            imm: cs.immediate_data,
            len: len as u32,
            id,
            ..MsgHeader::default()
        };
        // SAFETY: `reserve` gave room for the header and `len` bytes; the
        // source was checked against registered memory above.
        unsafe {
            hdr.write(p);
            crate::copy::copy(p.add(crate::shm::MSG_HEADER), s.addr as *const u8, len);
        }
        uvia_trace::mark!(ProtoBuilt);
        conn.tx.commit();
        uvia_trace::mark!(MediumQueued);
        conn.wake_peer();
        cs.length = len as u32;
        cs.status = status::DONE | status::OP_SEND;
        slot.desc = d;
        slot.owned = owned;
        slot.op = Op::SendRecv;
        slot.total = len as u64;
        slot.nranges = 0;
        slot.id = id;
        slot.state = EntryState::Done;
        sq.commit();
        g.sq_sent += 1;
        g.next_id = id.wrapping_add(1);
        if let Some(cq) = &self.s.send_cq {
            cq.notify(&self.s, Queue::Send);
        }
        Some(Ok(()))
    }

    /// The receiving half of the common case: the next message is an inline
    /// send and the oldest receive is waiting for it. Completes and returns
    /// that receive; `None` leaves everything to the general path.
    #[inline]
    fn recv_inline_fast(&self, g: &mut ViInner, owned: bool) -> Option<NonNull<Descriptor>> {
        if g.rq_done != 0 || g.failed.is_some() {
            return None;
        }
        let max = g.attrs.max_transfer_size;
        let ViInner { conn, rq, idle, .. } = g;
        let e = rq.front()?;
        if e.owned != owned {
            return None;
        }
        let conn = conn.as_mut()?;
        let rec = conn.rx.peek().ok()??;
        uvia_trace::mark!(RxFound);
        // SAFETY: the record's body stays valid and unchanged until released.
        let body = unsafe { std::slice::from_raw_parts(rec.as_ptr(), rec.len()) };
        let h = MsgHeader::parse(body)?;
        let len = h.len as usize;
        if h.kind != kind::SEND
            || h.flags & (flag::BY_REF | flag::ACK) != 0
            || h.len as u64 > e.total
            || h.len > max
            || body.len() < crate::shm::MSG_HEADER + len
            || !e.still_registered(&self.s.nic.regions)
        {
            return None;
        }
        scatter(
            &body[crate::shm::MSG_HEADER..crate::shm::MSG_HEADER + len],
            e.ranges(),
        );
        let imm = h.flags & flag::IMM != 0;
        // SAFETY: the descriptor is ours until it is handed back.
        unsafe {
            let cs = &mut (*e.desc.as_ptr()).cs;
            cs.length = h.len;
            if imm {
                cs.immediate_data = h.imm;
            }
            cs.status = status::DONE | status::OP_RECEIVE | if imm { status::IMMEDIATE } else { 0 };
        }
        conn.rx.release(rec);
        uvia_trace::mark!(ViCompleted);
        *idle = 0;
        if let Some(cq) = &self.s.recv_cq {
            cq.notify(&self.s, Queue::Recv);
        }
        uvia_trace::mark!(AppReceived);
        rq.pop_front().map(|(desc, _)| desc)
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
        let mut g = self.lock();
        if self.state() == ViState::Error {
            return Err(PostError::ViError);
        }
        let attrs = g.attrs;
        let len = g.rq.len();
        let Some(slot) = g.rq.next_free() else {
            return Err(PostError::QueueFull("receive", len));
        };
        // SAFETY: forwarded from the caller.
        unsafe { prepare(&self.s.nic, &attrs, slot, d, owned, Queue::Recv)? };
        g.rq.commit();
        if g.net.is_some() {
            self.net_post_recv(&mut g);
        }
        Ok(())
    }

    /// Writes queued sends into the ring while it has room.
    fn send_queued(&self, g: &mut ViInner) {
        while g.sq_sent < g.sq.len() {
            let i = g.sq_sent;
            if g.sq[i].fence && (0..i).any(|k| g.sq[k].state != EntryState::Done) {
                return;
            }
            if !self.write_message(g, i) {
                return;
            }
            g.sq_sent += 1;
        }
    }

    /// Builds send-queue entry `i` in the ring. `false` if the ring is full.
    fn write_message(&self, g: &mut ViInner, i: usize) -> bool {
        let reliability = g.attrs.reliability;
        let ViInner {
            conn,
            sq,
            awaiting_ack,
            ..
        } = g;
        let Some(conn) = conn.as_mut() else {
            return false;
        };
        let e = &mut sq[i];
        let by_ref = e.op == Op::RdmaRead || e.total as usize > INLINE_MAX;
        if !by_ref && !e.still_registered(&self.s.nic.regions) {
            // Deregistered while the send waited for ring space.
            self.complete_send(e, status::PROTECTION_ERROR);
            return true;
        }
        e.needs_ack =
            by_ref || e.op != Op::SendRecv || reliability == Reliability::ReliableReception;
        let hdr = MsgHeader {
            kind: match e.op {
                Op::SendRecv => kind::SEND,
                Op::RdmaWrite => kind::RDMA_WRITE,
                Op::RdmaRead => kind::RDMA_READ,
            },
            flags: (e.imm.is_some() as u8 * flag::IMM)
                | (by_ref as u8 * flag::BY_REF)
                | (e.needs_ack as u8 * flag::ACK),
            nranges: if by_ref { e.nranges } else { 0 },
            imm: e.imm.unwrap_or(0),
            len: e.total as u32,
            id: e.id,
            raddr: e.remote.0,
            rhandle: e.remote.1,
        };
        let body_len = hdr.size()
            + if by_ref {
                e.nranges as usize * crate::shm::RANGE_BYTES
            } else {
                e.total as usize
            };
        let Some(p) = conn.tx.reserve(body_len) else {
            return false;
        };
        // SAFETY: `reserve` returned `body_len` writable bytes; local ranges
        // were checked against registered memory when posted.
        unsafe {
            hdr.write(p);
            if by_ref {
                for k in 0..e.nranges as usize {
                    let (r, src) = (e.ranges[k], e.src[k]);
                    // Data the peer reads comes from a shared mapping when
                    // the region can be shared; an RDMA read's ranges are
                    // written by the peer, so they stay addresses.
                    let shared = e.op != Op::RdmaRead
                        && src.fd >= 0
                        && conn.announce(src.handle, src.serial, src.fd).is_ok();
                    let w = if shared {
                        WireRange {
                            addr: src.offset,
                            len: r.len as u64,
                            handle: src.handle,
                            serial: src.serial,
                        }
                    } else {
                        WireRange {
                            addr: r.ptr as u64,
                            len: r.len as u64,
                            ..WireRange::default()
                        }
                    };
                    crate::shm::write_range(p, &hdr, k, &w);
                }
            } else {
                let mut at = p.add(hdr.size());
                for r in e.ranges() {
                    crate::copy::copy(at, r.ptr, r.len);
                    at = at.add(r.len);
                }
            }
        }
        uvia_trace::mark!(ProtoBuilt);
        conn.tx.commit();
        uvia_trace::mark!(MediumQueued);
        e.end = conn.tx.head();
        conn.wake_peer();
        if e.needs_ack {
            e.state = EntryState::InFlight;
            *awaiting_ack += 1;
        } else {
            self.complete_send(e, 0);
        }
        true
    }

    fn complete_send(&self, e: &mut Posted, err_bits: u32) {
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

    fn complete_recv(
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

    /// Moves everything forward that can move without waiting. Returns true
    /// if anything happened.
    fn progress(&self, g: &mut ViInner) -> bool {
        if g.net.is_some() {
            return self.net_progress(g);
        }
        if g.conn.is_none() || self.state() == ViState::Error {
            return false;
        }
        let mut moved = false;
        if g.awaiting_ack > 0 {
            moved |= self.reap_acks(g);
        } else if g.failed.is_none()
            && g.conn
                .as_ref()
                .is_some_and(|c| c.mine().error.load(Ordering::Acquire) != 0)
        {
            // The peer reported an error for a send that completed when it
            // was written: the reliable connection is broken all the same.
            g.failed = Some(status::TRANSPORT_ERROR);
            moved = true;
        }
        moved |= self.serve_incoming(g);
        if g.sq_sent < g.sq.len() {
            let before = g.sq_sent;
            self.send_queued(g);
            moved |= g.sq_sent != before;
        }
        if let Some(bits) = g.failed.take() {
            self.fail(g, bits);
            moved = true;
        }
        if moved {
            g.idle = 0;
        } else {
            g.idle += 1;
            if g.idle.is_multiple_of(IDLE_CHECK_EVERY) {
                moved = self.check_peer(g);
            }
        }
        moved
    }

    /// Completes sends the peer has consumed, with the error it reported, if any.
    fn reap_acks(&self, g: &mut ViInner) -> bool {
        let Some(conn) = g.conn.as_ref() else {
            return false;
        };
        let consumed = conn.tx.consumed();
        // Read after `consumed` (Acquire): the peer stores its report before it releases the message.
        let report = conn.mine().error.load(Ordering::Acquire);
        let mut moved = false;
        for i in 0..g.sq_sent {
            let e = &g.sq[i];
            if e.state != EntryState::InFlight {
                continue;
            }
            if e.end > consumed {
                break;
            }
            let bits = if report != 0 && (report >> 32) as u32 == e.id {
                report as u32 & status::ERROR_MASK
            } else {
                0
            };
            let e = &mut g.sq[i];
            self.complete_send(e, bits);
            g.awaiting_ack -= 1;
            moved = true;
            if bits != 0 {
                g.failed = Some(status::DESC_FLUSHED_ERROR);
                break;
            }
        }
        moved
    }

    /// Handles messages from the peer until the ring is empty or a message
    /// needs a receive descriptor that is not posted yet.
    fn serve_incoming(&self, g: &mut ViInner) -> bool {
        let mut moved = false;
        let reliable = g.attrs.reliability != Reliability::Unreliable;
        loop {
            let ViInner {
                conn,
                rq,
                rq_done,
                attrs,
                failed,
                ..
            } = &mut *g;
            let Some(conn) = conn.as_mut() else {
                return moved;
            };
            let rec = match conn.rx.peek() {
                Ok(Some(r)) => {
                    uvia_trace::mark!(RxFound);
                    r
                }
                Ok(None) => return moved,
                Err(_) => {
                    *failed = Some(status::TRANSPORT_ERROR);
                    return true;
                }
            };
            // SAFETY: the record's body stays valid and unchanged by the peer
            // until we release it.
            let body = unsafe { std::slice::from_raw_parts(rec.as_ptr(), rec.len()) };
            let Some(h) = MsgHeader::parse(body) else {
                *failed = Some(status::TRANSPORT_ERROR);
                return true;
            };
            let needs_recv =
                h.kind == kind::SEND || (h.kind == kind::RDMA_WRITE && h.flags & flag::IMM != 0);
            if needs_recv && *rq_done >= rq.len() {
                // Receiver not ready: the message waits in the ring (the sender
                // is held back by the ring, nothing is lost).
                return moved;
            }
            let mut remote = [WireRange::default(); MAX_SEGMENTS];
            let by_ref = h.flags & flag::BY_REF != 0;
            let mut nr = 0;
            let mut malformed = false;
            if by_ref {
                match h.ranges(body, &mut remote) {
                    Some(n) if remote[..n].iter().map(|r| r.len).sum::<u64>() == h.len as u64 => {
                        nr = n
                    }
                    _ => malformed = true,
                }
            } else if body.len() < h.size() + h.len as usize {
                malformed = true;
            }
            if malformed {
                *failed = Some(status::TRANSPORT_ERROR);
                return true;
            }
            let inline = &body[h.size()..];
            let imm = (h.flags & flag::IMM != 0).then_some(h.imm);
            // Error to report back to the sender (status bits), if any.
            let mut report = 0u32;
            match h.kind {
                kind::SEND => {
                    let e = &mut rq[*rq_done];
                    if h.len as u64 > e.total || h.len > attrs.max_transfer_size {
                        self.complete_recv(e, status::OP_RECEIVE, 0, imm, status::LENGTH_ERROR);
                        if reliable {
                            report = status::REMOTE_DESC_ERROR;
                        }
                    } else if !e.still_registered(&self.s.nic.regions) {
                        self.complete_recv(e, status::OP_RECEIVE, 0, imm, status::PROTECTION_ERROR);
                        if reliable {
                            report = status::REMOTE_DESC_ERROR;
                        }
                    } else {
                        let ok = if by_ref {
                            conn.gather(&remote[..nr], e.ranges())
                        } else {
                            scatter(&inline[..h.len as usize], e.ranges());
                            true
                        };
                        if ok {
                            self.complete_recv(e, status::OP_RECEIVE, h.len, imm, 0);
                        } else {
                            self.complete_recv(
                                e,
                                status::OP_RECEIVE,
                                0,
                                imm,
                                status::TRANSPORT_ERROR,
                            );
                            report = status::TRANSPORT_ERROR;
                        }
                    }
                    *rq_done += 1;
                }
                kind::RDMA_WRITE | kind::RDMA_READ => {
                    let write = h.kind == kind::RDMA_WRITE;
                    match self.check_rdma(attrs, &h, write) {
                        Err(_) => report = status::RDMA_PROT_ERROR,
                        Ok(()) => {
                            let target = [LocalRange {
                                ptr: h.raddr as *mut u8,
                                len: h.len as usize,
                            }];
                            let nt = (h.len > 0) as usize;
                            // SAFETY: the target range was checked against this
                            // side's registered regions, tag and enable bits.
                            let ok = unsafe {
                                match (write, by_ref) {
                                    (true, true) => conn.gather(&remote[..nr], &target[..nt]),
                                    (true, false) => {
                                        std::ptr::copy_nonoverlapping(
                                            inline.as_ptr(),
                                            h.raddr as *mut u8,
                                            h.len as usize,
                                        );
                                        true
                                    }
                                    (false, _) => {
                                        let mut dst =
                                            [RemoteRange { addr: 0, len: 0 }; MAX_SEGMENTS];
                                        for (d, r) in dst.iter_mut().zip(&remote[..nr]) {
                                            *d = RemoteRange {
                                                addr: r.addr,
                                                len: r.len,
                                            };
                                        }
                                        remote[..nr].iter().all(|r| r.handle.0 == 0)
                                            && cma::write(
                                                conn.peer_pid,
                                                &target[..nt],
                                                &dst[..nr],
                                                h.len as usize,
                                            )
                                            .is_ok()
                                    }
                                }
                            };
                            if !ok {
                                report = status::TRANSPORT_ERROR;
                            }
                        }
                    }
                    if write && imm.is_some() {
                        let e = &mut rq[*rq_done];
                        let err = if report != 0 {
                            status::TRANSPORT_ERROR
                        } else {
                            0
                        };
                        self.complete_recv(e, status::OP_REMOTE_RDMA_WRITE, h.len, imm, err);
                        *rq_done += 1;
                    }
                }
                _ => unreachable!("MsgHeader::parse accepts only known kinds"),
            }
            if report != 0 {
                // Release: the report is visible before the release below.
                conn.peers()
                    .error
                    .store(((h.id as u64) << 32) | report as u64, Ordering::Release);
            }
            conn.rx.release(rec);
            if h.flags & flag::ACK != 0 || report != 0 {
                conn.wake_peer();
            }
            moved = true;
            if report != 0 && (reliable || report == status::RDMA_PROT_ERROR) {
                *failed = Some(status::DESC_FLUSHED_ERROR);
                return true;
            }
        }
    }

    /// Target-side check of an RDMA request: handle, bounds, tag, enable bits.
    fn check_rdma(
        &self,
        attrs: &ViAttributes,
        h: &MsgHeader,
        write: bool,
    ) -> Result<(), AccessError> {
        let r = self
            .s
            .nic
            .regions
            .check(h.rhandle, attrs.ptag, h.raddr, h.len as u64)?;
        match write {
            true if !(r.attrs.enable_rdma_write && attrs.enable_rdma_write) => {
                Err(AccessError::RdmaWriteDisabled(h.rhandle.0))
            }
            false if !(r.attrs.enable_rdma_read && attrs.enable_rdma_read) => {
                Err(AccessError::RdmaReadDisabled(h.rhandle.0))
            }
            _ => Ok(()),
        }
    }

    /// Looks at the peer's health; fails the VI if it is gone.
    fn check_peer(&self, g: &mut ViInner) -> bool {
        let Some(conn) = g.conn.as_ref() else {
            return false;
        };
        let closed = conn.mine().closed.load(Ordering::Acquire) != 0;
        if closed || conn.stream.peer_gone() {
            if !closed {
                // The peer died without disconnecting. If it was the server,
                // its listening socket may be left behind: remove it if
                // nobody accepts on it any more.
                if let Some(path) = &g.server_socket {
                    let _ = uvia_shm::socket::remove_if_stale(path);
                }
            }
            // Messages the peer published before leaving are still delivered.
            self.serve_incoming(g);
            self.fail(g, status::TRANSPORT_ERROR);
            return true;
        }
        false
    }

    /// Moves the VI to Error: sends in flight complete with `inflight_bits`,
    /// everything else outstanding is flushed.
    fn fail(&self, g: &mut ViInner, inflight_bits: u32) {
        self.set_state(ViState::Error);
        self.flush(g, inflight_bits);
    }

    fn flush(&self, g: &mut ViInner, inflight_bits: u32) {
        let ViInner {
            sq,
            rq,
            rq_done,
            awaiting_ack,
            sq_sent,
            ..
        } = g;
        for e in sq.iter_mut() {
            match e.state {
                EntryState::Done => {}
                EntryState::InFlight => self.complete_send(e, inflight_bits),
                EntryState::Queued => self.complete_send(e, status::DESC_FLUSHED_ERROR),
            }
        }
        *awaiting_ack = 0;
        *sq_sent = sq.len();
        for e in rq.iter_mut().skip(*rq_done) {
            self.complete_recv(e, status::OP_RECEIVE, 0, None, status::DESC_FLUSHED_ERROR);
        }
        *rq_done = rq.len();
    }

    fn pop(&self, g: &mut ViInner, q: Queue, owned: bool) -> Option<NonNull<Descriptor>> {
        let head = match q {
            Queue::Send => g.sq.front(),
            Queue::Recv => g.rq.front(),
        }?;
        if head.state != EntryState::Done || head.owned != owned {
            return None;
        }
        let (desc, _) = match q {
            Queue::Send => {
                g.sq_sent -= 1;
                g.sq.pop_front()
            }
            Queue::Recv => {
                g.rq_done -= 1;
                uvia_trace::mark!(AppReceived);
                g.rq.pop_front()
            }
        }?;
        Some(desc)
    }

    fn done_inner(&self, q: Queue, owned: bool) -> Option<NonNull<Descriptor>> {
        let mut g = self.lock();
        if let Some(d) = self.pop(&mut g, q, owned) {
            return Some(d);
        }
        // An empty poll in a few instructions: nothing of ours in flight or
        // queued, and nothing published by the peer.
        if g.awaiting_ack == 0 && g.sq_sent == g.sq.len() && g.failed.is_none() {
            let quiet = match &g.conn {
                Some(c) => !c.rx.ready() && c.mine().error.load(Ordering::Relaxed) == 0,
                None if g.net.is_some() => false,
                None => return None,
            };
            if quiet {
                g.idle += 1;
                if g.idle.is_multiple_of(IDLE_CHECK_EVERY) && self.check_peer(&mut g) {
                    return self.pop(&mut g, q, owned);
                }
                return None;
            }
        }
        if q == Queue::Recv && self.state() == ViState::Connected {
            if let Some(d) = self.recv_inline_fast(&mut g, owned) {
                return Some(d);
            }
        }
        self.progress(&mut g);
        self.pop(&mut g, q, owned)
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
        q: Queue,
        timeout: Option<Duration>,
        owned: bool,
    ) -> Result<NonNull<Descriptor>, WaitError> {
        let bound = match q {
            Queue::Send => self.s.send_cq.is_some(),
            Queue::Recv => self.s.recv_cq.is_some(),
        };
        if bound {
            return Err(WaitError::BoundToCq);
        }
        let start = Instant::now();
        let spin = self.lock().spin;
        // Spin phase: poll without sleeping; look at the clock every 64
        // rounds. With no spin time, go straight to sleep (the sleep phase
        // polls once after arming).
        let mut k = 0u32;
        while !spin.is_zero() {
            if let Some(d) = self.done_inner(q, owned) {
                return Ok(d);
            }
            k = k.wrapping_add(1);
            if k.is_multiple_of(64) && start.elapsed() >= spin {
                break;
            }
        }
        // Sleep phase: announce, re-check, sleep on this side's doorbell.
        let mut look_at_peer = false;
        loop {
            let (armed, on_medium) = {
                let mut g = self.lock();
                if let Some(d) = self.pop(&mut g, q, owned) {
                    return Ok(d);
                }
                // Look before arming: after a wake-up the message is usually
                // here, and an armed bell would cost the next sender a wake call.
                self.progress(&mut g);
                if let Some(d) = self.pop(&mut g, q, owned) {
                    return Ok(d);
                }
                let armed = match (&g.conn, &g.seg) {
                    (Some(conn), Some(seg)) => Some((
                        seg.clone(),
                        conn.side(),
                        conn.mine().bell.arm(doorbell::FUTEX),
                    )),
                    _ => None,
                };
                let on_medium = g.net.is_some();
                // Re-check after arming: a message published before the arm is seen here.
                self.progress(&mut g);
                if look_at_peer {
                    self.check_peer(&mut g);
                }
                if let Some(d) = self.pop(&mut g, q, owned) {
                    if let Some(conn) = &g.conn {
                        conn.mine().bell.disarm(doorbell::FUTEX);
                    }
                    return Ok(d);
                }
                (armed, on_medium)
            };
            let left = match timeout {
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(l) if !l.is_zero() => l,
                    _ => return Err(WaitError::Timeout),
                },
                None => SLEEP_SLICE,
            };
            let nap = left.min(SLEEP_SLICE);
            let t0 = Instant::now();
            match armed {
                Some((seg, side, seq)) => crate::shm::block_in(&seg, side).bell.sleep(seq, nap),
                // A network VI sleeps until a frame arrives, or its engine's
                // next timer (a retransmission, a delayed ack) is due.
                None if on_medium => {
                    let own = self.net_wait_medium(&self.lock());
                    let nap = Some(nap.min(NET_NAP));
                    let _ = match own {
                        Some(m) => m.wait(nap),
                        None => self.s.nic.net().medium.wait(nap),
                    };
                }
                None => std::thread::sleep(nap.min(Duration::from_millis(1))),
            }
            if on_medium {
                let mut g = self.lock();
                self.net_timers(&mut g);
            }
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
        let attrs = {
            let g = self.lock();
            let st = self.state();
            if st != ViState::Idle {
                return Err(ConnectError::InvalidState(st));
            }
            self.set_state(ViState::PendingConnect);
            g.attrs
        };
        let r = self.connect_inner(remote, timeout, &attrs);
        if r.is_err() {
            self.set_state(ViState::Idle);
        }
        r
    }

    fn connect_inner(
        &self,
        remote: &NetAddress,
        timeout: Duration,
        attrs: &ViAttributes,
    ) -> Result<RemoteViAttributes, ConnectError> {
        if self.s.nic.net.is_some() {
            return self.net_connect(remote, None, timeout);
        }
        let start = Instant::now();
        let nic = &self.s.nic;
        let path = nic
            .shm
            .dir
            .socket(&socket_name(&remote.host, &remote.discriminator));
        let stream = Stream::connect(&path, timeout).map_err(|e| match e {
            uvia_shm::socket::ConnectError::NoListener(_) => ConnectError::NoListener {
                nic: remote.host.clone(),
                discriminator: remote.discriminator.to_string(),
                waited_ms: start.elapsed().as_millis() as u64,
            },
            uvia_shm::socket::ConnectError::Io(e) => ConnectError::Io(e),
        })?;
        let seg = ShmConn::create_segment()?;
        let mut fds: Vec<RawFd> = vec![seg.fd()];
        fds.extend(self.cq_eventfds());
        stream.send(
            &Hello::new(hello::REQUEST, attrs, &remote.discriminator).emit(),
            &fds,
        )?;
        let left = timeout.saturating_sub(start.elapsed());
        let mut buf = [0u8; hello::LEN + 16];
        let (n, peer_fds) = match stream.recv(&mut buf, Some(left)) {
            Ok(Some(x)) => x,
            Ok(None) => return Err(ConnectError::Timeout(start.elapsed().as_millis() as u64)),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(ConnectError::Rejected)
            }
            Err(e) => return Err(e.into()),
        };
        let reply = Hello::parse(&buf[..n]).map_err(ConnectError::Protocol)?;
        match reply.kind {
            hello::REJECT if reply.reason == hello::MISMATCH => {
                check_compatible(attrs, &reply)?;
                return Err(ConnectError::Rejected);
            }
            hello::REJECT => return Err(ConnectError::Rejected),
            hello::ACCEPT => {}
            _ => {
                return Err(ConnectError::Protocol(
                    "unexpected reply to a connection request",
                ))
            }
        }
        check_compatible(attrs, &reply)?;
        let (pid, _) = stream.peer_cred()?;
        let mut g = self.lock();
        self.install(&mut g, seg, 0, stream, pid, peer_fds, (&reply).into());
        g.server_socket = Some(path);
        Ok((&reply).into())
    }

    /// Connects peer to peer (VipConnectPeerRequest and VipConnectPeerWait
    /// in one call): this VI waits on `local` while it asks the VI waiting
    /// on `remote`; the other side does the same with the discriminators
    /// swapped, and whichever request arrives first connects both. Network
    /// providers only.
    pub fn connect_peer_request(
        &self,
        local: &Discriminator,
        remote: &NetAddress,
        timeout: Duration,
    ) -> Result<RemoteViAttributes, ConnectError> {
        if self.s.nic.net.is_none() {
            return Err(ConnectError::Unsupported(
                "peer-to-peer connection on the shm provider",
            ));
        }
        {
            let _g = self.lock();
            let st = self.state();
            if st != ViState::Idle {
                return Err(ConnectError::InvalidState(st));
            }
            self.set_state(ViState::PendingConnect);
        }
        let r = self.net_connect(remote, Some(local), timeout);
        if r.is_err() {
            self.set_state(ViState::Idle);
        }
        r
    }

    /// The server half of a connection, called by `ConnRequest::accept`.
    pub(crate) fn accept_from(
        &self,
        stream: Stream,
        mut fds: Vec<OwnedFd>,
        req: &Hello,
        pid: i32,
    ) -> Result<(), ConnectError> {
        let mut g = self.lock();
        let st = self.state();
        let refuse = |stream: &Stream| {
            let _ = stream.send(
                &Hello {
                    kind: hello::REJECT,
                    ..req.clone()
                }
                .emit(),
                &[],
            );
        };
        if st != ViState::Idle {
            refuse(&stream);
            return Err(ConnectError::InvalidState(st));
        }
        if let Err(e) = check_compatible(&g.attrs, req) {
            // Tell the client why, with this side's attributes.
            let mut why = Hello::new(hello::REJECT, &g.attrs, &req.discriminator);
            why.reason = hello::MISMATCH;
            let _ = stream.send(&why.emit(), &[]);
            return Err(e);
        }
        if fds.is_empty() {
            return Err(ConnectError::Protocol(
                "connection request without a shared segment",
            ));
        }
        let seg = ShmSegment::open(fds.remove(0), 0)?;
        ShmConn::check_segment(&seg).map_err(ConnectError::Protocol)?;
        stream.send(
            &Hello::new(hello::ACCEPT, &g.attrs, &req.discriminator).emit(),
            &self.cq_eventfds(),
        )?;
        self.install(&mut g, seg, 1, stream, pid, fds, req.into());
        Ok(())
    }

    fn cq_eventfds(&self) -> Vec<RawFd> {
        let mut v: Vec<RawFd> = [&self.s.send_cq, &self.s.recv_cq]
            .into_iter()
            .flatten()
            .map(|c| c.efd.as_raw_fd())
            .collect();
        v.dedup();
        v
    }

    #[allow(clippy::too_many_arguments)]
    fn install(
        &self,
        g: &mut ViInner,
        seg: ShmSegment,
        side: usize,
        stream: Stream,
        pid: i32,
        fds: Vec<OwnedFd>,
        remote: RemoteViAttributes,
    ) {
        let seg = Arc::new(seg);
        g.conn = Some(ShmConn::new(seg.clone(), side, stream, pid, fds));
        g.seg = Some(seg);
        g.remote = Some(remote);
        g.idle = 0;
        g.failed = None;
        g.server_socket = None;
        self.set_state(ViState::Connected);
    }

    /// Ends the connection (VipDisconnect): the peer sees its VI fail, every
    /// outstanding descriptor here completes as flushed, and the VI is Idle.
    pub fn disconnect(&self) {
        let mut g = self.lock();
        if g.net.is_some() {
            self.net_disconnect(&mut g);
        }
        if let Some(conn) = g.conn.take() {
            conn.close();
        }
        g.seg = None;
        self.flush(&mut g, status::DESC_FLUSHED_ERROR);
        g.remote = None;
        self.set_state(ViState::Idle);
    }

    /// Destroys the VI (VipDestroyVi): refused while connected or while
    /// descriptors are still queued.
    pub fn destroy(self) -> Result<(), (Vi, ViAttrError)> {
        let st = self.state();
        let busy = {
            let g = self.lock();
            !g.sq.is_empty() || !g.rq.is_empty()
        };
        if st == ViState::Connected || st == ViState::PendingConnect || busy {
            return Err((self, ViAttrError::InvalidState(st)));
        }
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
        self.progress(&mut g);
        if g.net.is_some() {
            self.net_timers(&mut g);
        }
    }

    /// Completes what can complete without waiting (used by CQs).
    pub(crate) fn poll_progress(s: &Arc<ViShared>) {
        let vi = Vi { s: s.clone() };
        let mut g = vi.lock();
        vi.progress(&mut g);
    }

    /// Runs a network VI's timers (a CQ waiter that has slept).
    pub(crate) fn run_net_timers(s: &Arc<ViShared>) {
        let vi = Vi { s: s.clone() };
        let mut g = vi.lock();
        if g.net.is_some() {
            vi.net_timers(&mut g);
        }
    }

    /// Arms this VI's doorbell for an eventfd wake-up; `true` if something
    /// is already waiting to be served.
    pub(crate) fn arm_eventfd(s: &Arc<ViShared>) -> bool {
        let vi = Vi { s: s.clone() };
        let mut g = vi.lock();
        match g.conn.as_ref() {
            Some(c) => {
                c.mine().bell.arm(doorbell::EVENTFD);
                vi.progress(&mut g) || vi.check_peer(&mut g)
            }
            // Frames wake the CQ's waiter through the medium's descriptor.
            None if g.net.is_some() => vi.progress(&mut g),
            None => false,
        }
    }
}

/// Checks a descriptor and captures what progress needs from it.
///
/// # Safety
/// `d` is valid as described in `post_send_raw`.
unsafe fn prepare(
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
            offset: s.addr - region.start,
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
        *r = LocalRange {
            ptr: s.addr as *mut u8,
            len: s.length as usize,
        };
        *src = Source {
            handle: s.handle,
            serial: region.serial,
            fd: region.fd,
            offset: s.addr - region.start,
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

#[inline(always)]
fn scatter(mut src: &[u8], dst: &[LocalRange]) {
    if let [r] = dst {
        // One receive buffer (the common case); its length was checked against `src`.
        let n = r.len.min(src.len());
        // SAFETY: `r` is registered receive memory checked at post; `n` <= its length.
        unsafe { crate::copy::copy(r.ptr, src.as_ptr(), n) };
        return;
    }
    for r in dst {
        if src.is_empty() {
            break;
        }
        let n = r.len.min(src.len());
        // SAFETY: `r` is registered receive memory checked at post; `n` <= its length.
        unsafe { crate::copy::copy(r.ptr, src.as_ptr(), n) };
        src = &src[n..];
    }
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
        if let Some(conn) = g.conn.take() {
            conn.close();
        }
        if let Some(n) = g.net.take() {
            net::NetVi::drop_connection(&self.nic, n);
        }
        for q in [&mut g.sq, &mut g.rq] {
            while let Some((desc, owned)) = q.pop_front() {
                if owned {
                    // SAFETY: owned descriptors came from `Box::leak` in post_*.
                    drop(unsafe { Box::from_raw(desc.as_ptr()) });
                }
            }
        }
        self.nic.hold_ptag(g.attrs.ptag, -1);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    static NEXT: AtomicU64 = AtomicU64::new(1);

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

    /// A client VI and a server VI of `nic` connected to each other; the
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
        client
            .connect_request(&NetAddress::new("0", disc), Duration::from_secs(5))
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

        let (a, _b) = connected_pair_with(&nic, None);
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
