//! One shm VI's transport: its connection's rings, driven by the VI's post,
//! done and wait calls (there is no thread behind the caller's back).
//!
//! A post writes the message straight into the ring when it has room: the
//! doorbell is that store. Progress copies arrived messages into posted
//! receive buffers, serves the peer's RDMA, and notices the peer's
//! consumption of this side's messages.

use super::conn::{block_in, claim_chunk, local_span, mark_chunk, write_range};
use super::conn::{
    flag, kind, MsgHeader, ShmConn, WireRange, DIRECT_MAX, INLINE_MAX, INLINE_MAX_UNMAPPED,
    MSG_HEADER, PIECE, PIECES_FROM, RANGE_BYTES,
};
use crate::desc::{control, status, Descriptor, Op, Segment, MAX_SEGMENTS};
use crate::error::PostError;
use crate::nic::NicShared;
use crate::provider::{NicProvider, TransportOps};
use crate::vi::{check_rdma, prepare, EntryState, Posted, Queue, Queues, Reliability, Vi, ViState};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uvia_shm::cma::{self, LocalRange, RemoteRange};
use uvia_shm::{doorbell, Segment as ShmSegment};

/// Empty polls between two looks at the peer's health (a system call).
const IDLE_CHECK_EVERY: u32 = 4096;
/// Least time between two looks at the peer's health when a CQ waiter
/// arms the VI: a waiter over many VIs arms them all at every wake-up, and
/// a look is two system calls (the socket, the peer's `/proc` state), which
/// for 1,000 VIs every slice kept a fifth of a CPU busy. A dead peer is
/// then noticed within this and a slice.
const ARM_CHECK_EVERY: Duration = Duration::from_millis(250);
/// Empty polls between two looks at the clock while the peer has not
/// consumed what this side wrote.
const STALL_CHECK_EVERY: u32 = 64;
/// How long this side waits for the peer to consume its messages before it
/// asks the peer's agent to (`agent`): well above what a peer that polls or
/// sleeps in a wait call takes, so that such a peer is never disturbed.
pub(crate) const AGENT_AFTER: Duration = Duration::from_micros(50);
/// Longest pause between two asks while the peer still does not consume
/// (it waits for a receive its program has not posted yet): each ask wakes
/// the peer's agent, so the pause doubles from [`AGENT_AFTER`] up to this.
const AGENT_BACKOFF_MAX: Duration = Duration::from_millis(10);
/// Longest time a connection whose peer left stays up for the messages the
/// peer wrote before it left that wait for receives this side's program
/// has yet to post ([`ShmVi::check_peer`]): a send at Reliable Delivery
/// completes when written, so its sender may well be gone before the
/// receive is posted. A program posts its receives within microseconds of
/// taking a completion; one that has not within this loses what is left.
const DRAIN_LIMIT: Duration = Duration::from_secs(1);

/// A connected shm VI.
pub(crate) struct ShmVi {
    pub(super) conn: ShmConn,
    pub(super) seg: Arc<ShmSegment>,
    /// Messages written but waiting for the peer to consume them.
    awaiting_ack: usize,
    /// Polls since anything moved.
    idle: u32,
    /// Set when an error reported by the peer should end the connection.
    failed: Option<u32>,
    /// The server's listening socket, on the client side of a connection.
    pub(super) server_socket: Option<PathBuf>,
    /// Whether the peer process is stopped, and since when.
    stopped: Option<Arc<StopWatch>>,
    /// Since when the peer has not consumed what this side wrote while this
    /// side waits on it, and the pause before the next ask of its agent.
    stall: Option<(Instant, Duration)>,
    /// This side has sends the peer has yet to consume or make room for.
    waits_on_peer: bool,
    /// When a CQ waiter's arm last looked at the peer's health.
    armed_check_at: Option<Instant>,
    /// Bytes already written of the send at `sq_sent` when it goes in pieces.
    sent_pieces: u64,
    /// The message arriving in pieces, from its first piece to its last.
    inbound: Option<Inbound>,
    /// This side cannot write into the peer's memory (cross-memory attach
    /// refused): it no longer claims chunks of the peer's shared copies.
    no_help: bool,
    /// The peer has left with messages waiting here for receives: until
    /// when they may still be taken (nothing more is sent meanwhile).
    draining: Option<Instant>,
}

/// A message arriving in pieces ([`flag::FRAG`]) between its first piece and
/// its last.
#[derive(Clone, Copy)]
struct Inbound {
    id: u32,
    kind: u8,
    /// The whole message's bytes, as its first piece said.
    len: u32,
    /// Bytes received so far: where the next piece starts.
    got: u32,
    /// The first piece failed the receiver's checks: the rest is dropped.
    discard: bool,
}

/// How long a peer may stay stopped (SIGSTOP, a shell's ^Z) before its
/// connection fails. A stopped process keeps its socket open, so only its
/// state shows it: shm has no protocol timer that a silent peer would run
/// out, and a peer that is alive but does not call (computing) is not
/// silent in this sense and is never failed.
pub(crate) const STOPPED_LIMIT: Duration = Duration::from_millis(500);

/// How often the state of a peer process is read, whoever of its
/// connections asks: a server of 1,000 VIs of one client, each looking
/// every [`ARM_CHECK_EVERY`], read it 4,000 times a second before.
const STOP_LOOK_EVERY: Duration = Duration::from_millis(50);

/// Watches a peer process's state in `/proc/<pid>/stat` for all of this
/// process's connections to it: opened when the first is made (the poll
/// path allocates nothing), read again from the start at most every
/// [`STOP_LOOK_EVERY`] (one system call).
struct StopWatch {
    stat: std::fs::File,
    state: std::sync::Mutex<StopState>,
}

#[derive(Default)]
struct StopState {
    /// When the file was last read.
    looked: Option<Instant>,
    /// Since when the peer has been seen stopped.
    since: Option<Instant>,
}

impl StopWatch {
    /// The watch of process `pid`, shared with the other connections to
    /// it; `None` where its state cannot be read (another pid namespace).
    fn of(pid: i32) -> Option<Arc<StopWatch>> {
        static WATCHES: std::sync::Mutex<Vec<(i32, std::sync::Weak<StopWatch>)>> =
            std::sync::Mutex::new(Vec::new());
        if pid <= 0 {
            return None;
        }
        let mut all = WATCHES.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|(_, w)| w.strong_count() > 0);
        // A watch of a process that has gone is of an earlier process the
        // pid named: a new one is made.
        if let Some(w) = all
            .iter()
            .filter(|(p, _)| *p == pid)
            .find_map(|(_, w)| w.upgrade().filter(|w| w.read_state().is_some()))
        {
            return Some(w);
        }
        let stat = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
        let w = Arc::new(StopWatch {
            stat,
            state: std::sync::Mutex::new(StopState::default()),
        });
        all.push((pid, Arc::downgrade(&w)));
        Some(w)
    }

    /// The state letter of the process, `None` once it has gone.
    fn read_state(&self) -> Option<u8> {
        let mut buf = [0u8; 512];
        let n = std::os::unix::fs::FileExt::read_at(&self.stat, &mut buf, 0).ok()?;
        // "pid (comm) S ...": the state follows the last ')'; the name may
        // hold any character.
        let text = &buf[..n];
        let i = text.iter().rposition(|&b| b == b')')?;
        text.get(i + 2).copied()
    }

    /// True once the peer has been stopped for [`STOPPED_LIMIT`]. 'T' is a
    /// stop by signal; a debugger's stop ('t') is left alone.
    fn stopped_too_long(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if s.looked
            .is_none_or(|t| now.duration_since(t) >= STOP_LOOK_EVERY)
        {
            s.looked = Some(now);
            if self.read_state() == Some(b'T') {
                s.since.get_or_insert(now);
            } else {
                s.since = None;
            }
        }
        s.since
            .is_some_and(|t| now.duration_since(t) >= STOPPED_LIMIT)
    }
}

/// What a sleeping waiter of a shm VI waits on: its side's doorbell.
#[derive(Clone)]
pub(crate) struct Sleep {
    seg: Arc<ShmSegment>,
    side: usize,
    seq: u32,
    /// Longest sleep: until this side is due to ask the peer's agent.
    cap: Duration,
}

impl Sleep {
    pub fn sleep(self, nap: Duration) {
        block_in(&self.seg, self.side)
            .bell
            .sleep(self.seq, nap.min(self.cap));
    }

    /// The doorbell's futex word, for a waiter that sleeps on several.
    pub fn watch(&self) -> doorbell::Watch<'_> {
        block_in(&self.seg, self.side).bell.watch(self.seq)
    }

    /// Wakes the waiter sleeping on this doorbell (another thread of its
    /// process).
    pub fn wake(&self) {
        block_in(&self.seg, self.side).bell.wake();
    }
}

impl ShmVi {
    pub(super) fn new(conn: ShmConn, seg: Arc<ShmSegment>) -> ShmVi {
        let conn_pid = conn.peer_pid;
        ShmVi {
            conn,
            seg,
            awaiting_ack: 0,
            idle: 0,
            failed: None,
            server_socket: None,
            stopped: StopWatch::of(conn_pid),
            stall: None,
            waits_on_peer: false,
            armed_check_at: None,
            sent_pieces: 0,
            inbound: None,
            no_help: false,
            draining: None,
        }
    }

    /// Looks at the clock while the peer has not consumed what this side
    /// wrote, and asks the peer's agent once that has lasted long enough.
    /// Returns how long until the next ask is due (`None`: nothing waits
    /// on the peer).
    #[cold]
    fn check_stall(&mut self) -> Option<Duration> {
        if !self.waits_on_peer || self.conn.tx.consumed() >= self.conn.tx.head() {
            self.stall = None;
            return None;
        }
        let now = Instant::now();
        let (since, pause) = *self.stall.get_or_insert((now, AGENT_AFTER));
        let waited = now.duration_since(since);
        if waited < pause {
            return Some(pause - waited);
        }
        self.conn.ask_peer_agent();
        let next = (pause * 2).min(AGENT_BACKOFF_MAX);
        self.stall = Some((now, next));
        Some(next)
    }

    fn fail(&mut self, vi: &Vi, q: &mut Queues, inflight_bits: u32) {
        // A broken connection takes no more writes from the peer.
        self.conn.withdraw();
        vi.fail(q, inflight_bits);
        self.awaiting_ack = 0;
        self.sent_pieces = 0;
        self.inbound = None;
        self.draining = None;
    }

    /// The common case in few instructions: a plain send of one segment that
    /// fits inline, nothing queued ahead of it, completing when written
    /// (Unreliable and Reliable Delivery). `false` leaves the descriptor to
    /// the general path, which gives the same result for these cases and
    /// names what is wrong with one it refuses (a flag in a register, where
    /// a result that could carry the error went through memory).
    ///
    /// # Safety
    /// As for [`Vi::post_send_raw`].
    #[inline(always)]
    unsafe fn send_inline_fast(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        d: NonNull<Descriptor>,
        owned: bool,
    ) -> bool {
        // SAFETY: the caller guarantees a valid control segment.
        let cs = unsafe { &mut (*d.as_ptr()).cs };
        if cs.control & !control::IMMEDIATE != 0
            || cs.seg_count != 1
            || q.sq_sent != q.sq.len()
            || q.attrs.reliability == Reliability::ReliableReception
            || self.draining.is_some()
        {
            return false;
        }
        // SAFETY: one segment follows the control segment (caller's contract).
        let s = unsafe { *((d.as_ptr() as *const u8).add(32) as *const Segment) };
        let len = s.length as usize;
        if len > INLINE_MAX
            || s.length > q.attrs.max_transfer_size
            || !vi
                .s
                .nic
                .regions
                .allows(s.handle, q.attrs.ptag, s.addr, len as u64)
        {
            return false;
        }
        let id = q.next_id;
        let Some(slot) = q.sq.next_free() else {
            return false;
        };
        let conn = &mut self.conn;
        let Some(p) = conn.tx.reserve(MSG_HEADER + len) else {
            return false;
        };
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
            crate::copy::copy(p.add(MSG_HEADER), s.addr as *const u8, len);
        }
        uvia_trace::mark!(ProtoBuilt);
        conn.tx.commit();
        uvia_trace::mark!(MediumQueued);
        conn.wake_peer();
        cs.length = len as u32;
        cs.status = status::DONE | status::OP_SEND;
        done_at_post(slot, d, owned, Op::SendRecv, len as u64, id);
        queue_done_at_post(vi, q, id);
        true
    }

    /// Whether an RDMA write may be placed here now: everything sent before
    /// has been consumed (so it lands after them), and the connection is
    /// not broken (by either side's error, or a close).
    #[inline(always)]
    fn may_write_directly(&self) -> bool {
        self.conn.tx.consumed() >= self.conn.tx.head()
            && self.failed.is_none()
            && self.conn.unbroken()
    }

    /// An RDMA write into a window the peer granted (`conn::Grants`), in
    /// few instructions: placed here and complete at the post, with nothing
    /// queued ahead of it and everything sent before consumed. `None`
    /// leaves the descriptor to the general path (which places it here too
    /// when it can, or sends it through the ring).
    ///
    /// # Safety
    /// As for [`Vi::post_send_raw`].
    #[inline]
    unsafe fn rdma_write_fast(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        d: NonNull<Descriptor>,
        owned: bool,
    ) -> Option<Result<(), PostError>> {
        // SAFETY: the caller guarantees a valid control segment.
        let cs = unsafe { &mut (*d.as_ptr()).cs };
        let n = cs.seg_count as usize;
        const MAX_LOCAL: usize = 2;
        if cs.control != control::OP_RDMAWRITE
            || !(2..=MAX_LOCAL + 1).contains(&n)
            || q.sq_sent != q.sq.len()
            || !self.may_write_directly()
        {
            return None;
        }
        // SAFETY: `n` segments follow the control segment (caller's contract).
        let segs: &[Segment] = unsafe {
            std::slice::from_raw_parts((d.as_ptr() as *const u8).add(32) as *const Segment, n)
        };
        let regions = &vi.s.nic.regions;
        let mut local = [LocalRange {
            ptr: std::ptr::null_mut(),
            len: 0,
        }; MAX_LOCAL];
        let mut total = 0u64;
        for (l, s) in local.iter_mut().zip(&segs[1..]) {
            if !regions.allows(s.handle, q.attrs.ptag, s.addr, s.length as u64) {
                return None;
            }
            *l = LocalRange {
                ptr: s.addr as *mut u8,
                len: s.length as usize,
            };
            total += s.length as u64;
        }
        if total > DIRECT_MAX as u64 || total > q.attrs.max_transfer_size as u64 {
            return None;
        }
        if q.sq.is_full() {
            return None;
        }
        let remote = segs[0];
        // SAFETY: the local ranges were checked against registered memory above.
        if !unsafe {
            self.conn
                .write_direct(remote.handle, remote.addr, &local[..n - 1], total as usize)
        } {
            return None;
        }
        // The queue's bookkeeping after the copy, off the way to the peer.
        uvia_trace::mark!(ProtoBuilt);
        let id = q.next_id;
        let slot =
            q.sq.next_free()
                .expect("a slot: the queue was not full above, under the VI's lock");
        cs.length = total as u32;
        cs.status = status::DONE | status::OP_RDMA_WRITE;
        done_at_post(slot, d, owned, Op::RdmaWrite, total, id);
        queue_done_at_post(vi, q, id);
        Some(Ok(()))
    }

    /// [`TransportOps::write_copy`]: the direct write of the fast path
    /// above, from the caller's bytes and without a descriptor: no slot,
    /// no completion, nothing to reap.
    #[inline(always)]
    fn write_inline(&mut self, q: &Queues, bytes: &[&[u8]], remote: Segment) -> bool {
        const MAX_PARTS: usize = 2;
        // First, while the checks below run.
        self.conn.claim_target(remote.addr);
        if bytes.len() > MAX_PARTS || q.sq_sent != q.sq.len() || !self.may_write_directly() {
            return false;
        }
        let len: usize = bytes.iter().map(|b| b.len()).sum();
        if len > DIRECT_MAX || len as u64 > q.attrs.max_transfer_size as u64 {
            return false;
        }
        // SAFETY: the pieces are the caller's live slices.
        unsafe {
            self.conn
                .write_direct(remote.handle, remote.addr, bytes, len)
        }
    }

    /// [`TransportOps::send_copy`]: the inline send of the fast path
    /// above, from the caller's bytes and without a descriptor.
    #[inline]
    fn copy_inline(&mut self, q: &mut Queues, bytes: &[&[u8]], imm: Option<u32>) -> bool {
        let len: usize = bytes.iter().map(|b| b.len()).sum();
        // A broken connection (the peer's report) leaves it to the post
        // of a descriptor, which fails the VI.
        if q.sq_sent != q.sq.len()
            || q.attrs.reliability == Reliability::ReliableReception
            || len > INLINE_MAX
            || len as u64 > q.attrs.max_transfer_size as u64
            || self.failed.is_some()
            || self.draining.is_some()
            || self.conn.mine().error.load(Ordering::Relaxed) != 0
        {
            return false;
        }
        let id = q.next_id;
        let conn = &mut self.conn;
        let Some(p) = conn.tx.reserve(MSG_HEADER + len) else {
            return false;
        };
        let hdr = MsgHeader {
            kind: kind::SEND,
            flags: imm.is_some() as u8 * flag::IMM,
            imm: imm.unwrap_or(0),
            len: len as u32,
            id,
            ..MsgHeader::default()
        };
        // SAFETY: `reserve` gave room for the header and `len` bytes; the
        // parts are the caller's live slices.
        unsafe {
            hdr.write(p);
            let mut at = p.add(MSG_HEADER);
            for b in bytes {
                crate::copy::copy(at, b.as_ptr(), b.len());
                at = at.add(b.len());
            }
        }
        uvia_trace::mark!(ProtoBuilt);
        conn.tx.commit();
        uvia_trace::mark!(MediumQueued);
        conn.wake_peer();
        q.next_id = id.wrapping_add(1);
        true
    }

    /// The receiving half of the common case: the next message is an inline
    /// send and the oldest receive is waiting for it. Completes and returns
    /// that receive; `None` leaves everything to the general path.
    #[inline]
    fn recv_inline_fast(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        owned: bool,
    ) -> Option<NonNull<Descriptor>> {
        if q.rq_done != 0 || self.failed.is_some() {
            return None;
        }
        let max = q.attrs.max_transfer_size;
        let e = q.rq.front()?;
        if e.owned != owned {
            return None;
        }
        let conn = &mut self.conn;
        let rec = conn.rx.peek().ok()??;
        uvia_trace::mark!(RxFound);
        // SAFETY: the record's body stays valid and unchanged until released.
        let body = unsafe { std::slice::from_raw_parts(rec.as_ptr(), rec.len()) };
        let h = MsgHeader::parse(body)?;
        let len = h.len as usize;
        if h.kind != kind::SEND
            || h.flags & (flag::BY_REF | flag::ACK | flag::FRAG) != 0
            || h.len as u64 > e.total
            || h.len > max
            || body.len() < MSG_HEADER + len
            || !e.still_registered(&vi.s.nic.regions)
        {
            return None;
        }
        scatter(&body[MSG_HEADER..MSG_HEADER + len], e.ranges());
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
        self.idle = 0;
        if let Some(cq) = &vi.s.recv_cq {
            cq.notify(&vi.s, Queue::Recv);
        }
        uvia_trace::mark!(AppReceived);
        q.rq.pop_front().map(|(desc, _)| desc)
    }

    /// Writes queued sends into the ring while it has room.
    fn send_queued(&mut self, vi: &Vi, q: &mut Queues) {
        // A peer that left takes nothing more (what is queued is flushed
        // when the connection fails).
        if self.draining.is_some() {
            return;
        }
        while q.sq_sent < q.sq.len() {
            let i = q.sq_sent;
            if q.sq[i].fence && (0..i).any(|k| q.sq[k].state != EntryState::Done) {
                return;
            }
            if !self.write_message(vi, q, i) {
                return;
            }
            q.sq_sent += 1;
        }
    }

    /// Builds send-queue entry `i` in the ring. `false` if the ring is full.
    fn write_message(&mut self, vi: &Vi, q: &mut Queues, i: usize) -> bool {
        let reliability = q.attrs.reliability;
        let e = &mut q.sq[i];
        // The peer reads a large payload straight from a mapping of the
        // region when it can map it; otherwise it is copied through the
        // ring in one record up to a larger size than a system call per
        // message would pay, read by cross-memory attach above it, and
        // through the ring in pieces once that costs more.
        let mappable = e.src[..e.nranges as usize]
            .iter()
            .zip(&e.ranges)
            .all(|(s, r)| s.mappable(r.len as u64));
        if !mappable && e.op != Op::RdmaRead && e.total as usize >= PIECES_FROM {
            return self.write_pieces(vi, q, i);
        }
        let direct = self.may_write_directly();
        let conn = &mut self.conn;
        // An RDMA write into a window the peer granted is placed here
        // (`conn::Grants`), and completes at once.
        if e.op == Op::RdmaWrite
            && e.imm.is_none()
            && e.total as usize <= DIRECT_MAX
            && direct
            && e.still_registered(&vi.s.nic.regions)
            // SAFETY: the local ranges were checked against registered
            // memory when posted, and are still registered.
            && unsafe { conn.write_direct(e.remote.1, e.remote.0, e.ranges(), e.total as usize) }
        {
            uvia_trace::mark!(ProtoBuilt);
            vi.complete_send(e, 0);
            return true;
        }
        let inline_max = if mappable {
            INLINE_MAX
        } else {
            INLINE_MAX_UNMAPPED
        };
        let by_ref = e.op == Op::RdmaRead || e.total as usize > inline_max;
        if !by_ref && !e.still_registered(&vi.s.nic.regions) {
            // Deregistered while the send waited for ring space.
            vi.complete_send(e, status::PROTECTION_ERROR);
            return true;
        }
        let mut wire = [WireRange::default(); MAX_SEGMENTS];
        let nwire = if by_ref {
            wire_ranges(conn, e, &mut wire)
        } else {
            0
        };
        e.needs_ack =
            by_ref || e.op != Op::SendRecv || reliability == Reliability::ReliableReception;
        let hdr = MsgHeader {
            nranges: nwire as u8,
            ..header_of(
                e,
                (by_ref as u8 * flag::BY_REF) | (e.needs_ack as u8 * flag::ACK),
            )
        };
        let body_len = hdr.size()
            + if by_ref {
                nwire * RANGE_BYTES
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
                for (k, w) in wire[..nwire].iter().enumerate() {
                    write_range(p, &hdr, k, w);
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
        self.written(vi, e);
        true
    }

    /// Entry `e`'s message is on the ring: complete now, or once the peer
    /// has consumed it if it must confirm it.
    fn written(&mut self, vi: &Vi, e: &mut Posted) {
        if e.needs_ack {
            e.state = EntryState::InFlight;
            self.awaiting_ack += 1;
        } else {
            vi.complete_send(e, 0);
        }
    }

    /// Writes send-queue entry `i`, a send or RDMA write too large for one
    /// record from memory the peer cannot map, through the ring in pieces,
    /// as many as the ring has room for: the peer copies each piece out
    /// while this side copies the next in, so the two copies of each byte
    /// overlap on the two cores ([`PIECES_FROM`] says when that beats
    /// cross-memory attach). `false` if the ring filled
    /// before the last piece; the next progress writes the rest.
    fn write_pieces(&mut self, vi: &Vi, q: &mut Queues, i: usize) -> bool {
        let reliability = q.attrs.reliability;
        let e = &mut q.sq[i];
        if !e.still_registered(&vi.s.nic.regions) {
            // Deregistered while the send waited for ring space.
            vi.complete_send(e, status::PROTECTION_ERROR);
            if self.sent_pieces != 0 {
                // Part of the message is on the ring and the rest will
                // never come: only ending the connection tells the peer.
                self.conn.close();
                self.failed = Some(status::DESC_FLUSHED_ERROR);
            }
            self.sent_pieces = 0;
            return true;
        }
        let conn = &mut self.conn;
        // Every piece asks the peer to ring after taking it: this side may
        // sleep waiting for the room.
        let mut hdr = header_of(e, flag::FRAG | flag::ACK);
        while self.sent_pieces < e.total {
            let at = self.sent_pieces as usize;
            let n = (e.total as usize - at).min(PIECE);
            hdr.piece_at = at as u32;
            hdr.piece_len = n as u32;
            let size = hdr.size();
            let Some(p) = conn.tx.reserve(size + n) else {
                return false;
            };
            // SAFETY: `reserve` returned `size + n` writable bytes; the local
            // ranges are registered memory, checked at post and still current.
            unsafe {
                hdr.write(p);
                for_span(e.ranges(), at, n, |src, off, k| {
                    std::ptr::copy_nonoverlapping(src, p.add(size + off), k)
                });
            }
            conn.tx.commit();
            conn.wake_peer();
            self.sent_pieces += n as u64;
        }
        self.sent_pieces = 0;
        e.end = conn.tx.head();
        // The bytes are in the ring: a send is done once written, unless
        // the peer must confirm it (an RDMA write's protection check,
        // Reliable Reception).
        e.needs_ack = e.op != Op::SendRecv || reliability == Reliability::ReliableReception;
        self.written(vi, e);
        true
    }

    /// Copies chunks of the message of ours the peer is taking, when it has
    /// offered to share the copy ([`Help`](super::conn::Help)): straight
    /// from the send's memory into the receive buffer the peer named
    /// ([`ShmConn::write_chunk`]). True if a chunk was copied. A chunk it
    /// cannot write is handed back to the peer, and this side stops
    /// claiming on this connection.
    fn help_peer(&mut self, vi: &Vi, q: &Queues) -> bool {
        if self.no_help {
            return false;
        }
        // A cheap look first: no offer, or none this side can take.
        let help = &self.conn.peers().help;
        let w = help.claim.load(Ordering::Acquire);
        if w >> 32 == 0 || w as u32 >= help.nchunks.load(Ordering::Relaxed) {
            return false;
        }
        let seg = self.seg.clone();
        let help = &block_in(&seg, 1 - self.conn.side()).help;
        let mut moved = false;
        loop {
            let w = help.claim.load(Ordering::Acquire);
            let offer = (w >> 32) as u32;
            let n = help.nchunks.load(Ordering::Relaxed);
            let Some(c) = claim_chunk(help, offer, n) else {
                return moved;
            };
            // The chunk is ours: the offer stays as it is until its bit is set.
            let id = help.id.load(Ordering::Relaxed);
            let len = help.len.load(Ordering::Relaxed) as usize;
            let chunk = help.chunk.load(Ordering::Relaxed) as usize;
            let at = c as usize * chunk;
            let k = chunk.min(len.saturating_sub(at));
            let e = (0..q.sq_sent)
                .map(|i| &q.sq[i])
                .find(|e| e.id == id && e.state == EntryState::InFlight)
                .filter(|e| {
                    e.total as usize == len && k > 0 && e.still_registered(&vi.s.nic.regions)
                });
            let written = e.is_some_and(|e| self.conn.write_chunk(help, e.ranges(), at, k));
            if written {
                mark_chunk(&help.done, offer, c);
                moved = true;
            } else {
                mark_chunk(&help.failed, offer, c);
                self.no_help = true;
                return moved;
            }
        }
    }

    /// Completes sends the peer has consumed, with the error it reported, if any.
    fn reap_acks(&mut self, vi: &Vi, q: &mut Queues) -> bool {
        let conn = &self.conn;
        let consumed = conn.tx.consumed();
        // Read after `consumed` (Acquire): the peer stores its report before it releases the message.
        let report = conn.mine().error.load(Ordering::Acquire);
        let mut moved = false;
        for i in 0..q.sq_sent {
            let e = &q.sq[i];
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
            vi.complete_send(&mut q.sq[i], bits);
            self.awaiting_ack -= 1;
            moved = true;
            if bits != 0 {
                self.failed = Some(status::DESC_FLUSHED_ERROR);
                break;
            }
        }
        moved
    }

    /// Handles messages from the peer until the ring is empty or a message
    /// needs a receive descriptor that is not posted yet.
    fn serve_incoming(&mut self, vi: &Vi, q: &mut Queues) -> bool {
        let mut moved = false;
        let reliable = q.attrs.reliability != Reliability::Unreliable;
        let Queues {
            rq, rq_done, attrs, ..
        } = q;
        let conn = &mut self.conn;
        let failed = &mut self.failed;
        let inbound = &mut self.inbound;
        let stopped = || self.stopped.as_ref().is_some_and(|w| w.stopped_too_long());
        loop {
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
            // A message in pieces takes its receive at the first piece.
            let needs_recv = h.piece_at == 0
                && (h.kind == kind::SEND
                    || (h.kind == kind::RDMA_WRITE && h.flags & flag::IMM != 0));
            if needs_recv && *rq_done >= rq.len() {
                // Receiver not ready: the message waits in the ring (the sender
                // is held back by the ring, nothing is lost).
                return moved;
            }
            let imm = (h.flags & flag::IMM != 0).then_some(h.imm);
            // Error to report back to the sender (status bits), if any.
            let mut report = 0u32;
            if h.flags & flag::FRAG != 0 {
                let Some(r) = serve_piece(vi, attrs, rq, rq_done, inbound, &h, body) else {
                    *failed = Some(status::TRANSPORT_ERROR);
                    return true;
                };
                report = r;
            } else {
                let mut remote = [WireRange::default(); MAX_SEGMENTS];
                let by_ref = h.flags & flag::BY_REF != 0;
                let mut nr = 0;
                let mut malformed = false;
                if by_ref {
                    match h.ranges(body, &mut remote) {
                        Some(n)
                            if remote[..n].iter().map(|r| r.len).sum::<u64>() == h.len as u64 =>
                        {
                            nr = n
                        }
                        _ => malformed = true,
                    }
                } else if body.len() < h.size() + h.len as usize {
                    malformed = true;
                }
                if malformed || inbound.is_some() {
                    // (A whole message between the pieces of another is malformed too.)
                    *failed = Some(status::TRANSPORT_ERROR);
                    return true;
                }
                let inline = &body[h.size()..];
                match h.kind {
                    kind::SEND => {
                        let e = &mut rq[*rq_done];
                        if h.len as u64 > e.total || h.len > attrs.max_transfer_size {
                            vi.complete_recv(e, status::OP_RECEIVE, 0, imm, status::LENGTH_ERROR);
                            if reliable {
                                report = status::REMOTE_DESC_ERROR;
                            }
                        } else if !e.still_registered(&vi.s.nic.regions) {
                            vi.complete_recv(
                                e,
                                status::OP_RECEIVE,
                                0,
                                imm,
                                status::PROTECTION_ERROR,
                            );
                            if reliable {
                                report = status::REMOTE_DESC_ERROR;
                            }
                        } else {
                            let ok = if by_ref {
                                conn.gather_shared(
                                    h.id,
                                    &remote[..nr],
                                    e.ranges(),
                                    &e.src[..e.nranges as usize],
                                    stopped,
                                )
                            } else {
                                scatter(&inline[..h.len as usize], e.ranges());
                                true
                            };
                            if ok {
                                vi.complete_recv(e, status::OP_RECEIVE, h.len, imm, 0);
                            } else {
                                vi.complete_recv(
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
                        match check_rdma(
                            &vi.s.nic.regions,
                            attrs,
                            h.rhandle,
                            h.raddr,
                            h.len as u64,
                            write,
                        ) {
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
                                        (true, true) => conn.gather_shared(
                                            h.id,
                                            &remote[..nr],
                                            &target[..nt],
                                            &[],
                                            stopped,
                                        ),
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
                                } else if write
                                    && imm.is_none()
                                    && h.len as usize <= DIRECT_MAX
                                    && !conn.granted(h.rhandle)
                                {
                                    if let NicProvider::Shm(n) = &vi.s.nic.provider {
                                        conn.grant(
                                            &vi.s.nic.regions,
                                            h.rhandle,
                                            attrs.ptag,
                                            &n.grants,
                                        );
                                    }
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
                            vi.complete_recv(e, status::OP_REMOTE_RDMA_WRITE, h.len, imm, err);
                            *rq_done += 1;
                        }
                    }
                    _ => unreachable!("MsgHeader::parse accepts only known kinds"),
                }
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
}

/// Fills the send-queue slot of descriptor `d`, finished during its post
/// (the fast paths: an inline send, an RDMA write placed here), as done.
#[inline(always)]
fn done_at_post(
    slot: &mut Posted,
    d: NonNull<Descriptor>,
    owned: bool,
    op: Op,
    total: u64,
    id: u32,
) {
    slot.desc = d;
    slot.owned = owned;
    slot.op = op;
    slot.total = total;
    slot.nranges = 0;
    slot.id = id;
    slot.state = EntryState::Done;
}

/// Queues the slot [`done_at_post`] filled, written and done, and tells the
/// send CQ.
#[inline(always)]
fn queue_done_at_post(vi: &Vi, q: &mut Queues, id: u32) {
    q.sq.commit();
    q.sq_sent += 1;
    q.next_id = id.wrapping_add(1);
    if let Some(cq) = &vi.s.send_cq {
        cq.notify(&vi.s, Queue::Send);
    }
}

/// The ring header of send-queue entry `e`, with `flags` besides its
/// immediate data's.
fn header_of(e: &Posted, flags: u8) -> MsgHeader {
    MsgHeader {
        kind: match e.op {
            Op::SendRecv => kind::SEND,
            Op::RdmaWrite => kind::RDMA_WRITE,
            Op::RdmaRead => kind::RDMA_READ,
        },
        flags: flags | (e.imm.is_some() as u8 * flag::IMM),
        imm: e.imm.unwrap_or(0),
        len: e.total as u32,
        id: e.id,
        raddr: e.remote.0,
        rhandle: e.remote.1,
        ..MsgHeader::default()
    }
}

/// Takes one piece of a message that arrives in pieces: checks it at its
/// first piece as a whole message is checked, copies each piece to its
/// place, completes it at its last. The error to report to the sender (0
/// for none), or `None` if the piece is malformed or out of order.
fn serve_piece(
    vi: &Vi,
    attrs: &crate::vi::ViAttributes,
    rq: &mut crate::vi::SlotQueue,
    rq_done: &mut usize,
    inbound: &mut Option<Inbound>,
    h: &MsgHeader,
    body: &[u8],
) -> Option<u32> {
    let (at, n) = (h.piece_at as usize, h.piece_len as usize);
    let in_order = match inbound {
        None => at == 0,
        Some(m) => m.id == h.id && m.kind == h.kind && m.len == h.len && m.got as usize == at,
    };
    if !in_order || n == 0 || at + n > h.len as usize || h.kind == kind::RDMA_READ {
        return None;
    }
    let data = body.get(h.size()..h.size() + n)?;
    let (first, last) = (at == 0, at + n == h.len as usize);
    let reliable = attrs.reliability != Reliability::Unreliable;
    let imm = (h.flags & flag::IMM != 0).then_some(h.imm);
    let mut discard = inbound.is_some_and(|m| m.discard);
    let mut report = 0;
    // The receive a send or a write with immediate data completes: taken
    // at the first piece (the caller waits for one to be posted), kept to
    // the last; without one the piece is out of order.
    let takes_recv = h.kind == kind::SEND || imm.is_some();
    if takes_recv && !discard && *rq_done >= rq.len() {
        return None;
    }
    if h.kind == kind::SEND {
        if discard {
            // The rest of a message whose receive already failed.
        } else {
            let e = &mut rq[*rq_done];
            let bits = if first && (h.len as u64 > e.total || h.len > attrs.max_transfer_size) {
                status::LENGTH_ERROR
            } else if !e.still_registered(&vi.s.nic.regions) {
                status::PROTECTION_ERROR
            } else {
                for_span(e.ranges(), at, n, |dst, off, k| {
                    // SAFETY: `dst` is registered receive memory checked at post
                    // and still current; the message fits the receive (checked at
                    // its first piece), so the span lies inside it.
                    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(off), dst, k) }
                });
                0
            };
            if bits != 0 {
                vi.complete_recv(e, status::OP_RECEIVE, 0, imm, bits);
                *rq_done += 1;
                discard = true;
                if reliable {
                    report = status::REMOTE_DESC_ERROR;
                }
            } else if last {
                vi.complete_recv(e, status::OP_RECEIVE, h.len, imm, 0);
                *rq_done += 1;
            }
        }
    } else if !discard {
        // An RDMA write: the whole target is checked at the first piece, so
        // a violation leaves memory untouched; each piece's own span again
        // (the region may have been deregistered in between).
        let (start, span) = if first {
            (h.raddr, h.len as u64)
        } else {
            (h.raddr.checked_add(at as u64)?, n as u64)
        };
        match check_rdma(&vi.s.nic.regions, attrs, h.rhandle, start, span, true) {
            Err(_) => {
                report = status::RDMA_PROT_ERROR;
                discard = true;
            }
            // SAFETY: the target span was checked against this side's
            // registered regions, tag and enable bits.
            Ok(()) => unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), (h.raddr as usize + at) as *mut u8, n)
            },
        }
        if imm.is_some() && (last || report != 0) {
            let err = if report != 0 {
                status::TRANSPORT_ERROR
            } else {
                0
            };
            vi.complete_recv(
                &mut rq[*rq_done],
                status::OP_REMOTE_RDMA_WRITE,
                h.len,
                imm,
                err,
            );
            *rq_done += 1;
        }
    }
    *inbound = (!last).then_some(Inbound {
        id: h.id,
        kind: h.kind,
        len: h.len,
        got: (at + n) as u32,
        discard,
    });
    Some(report)
}

/// Calls `f(address, offset, length)` for each part of bytes `[at, at + n)`
/// of the concatenation of `ranges`, `offset` counting from `at`.
fn for_span(ranges: &[LocalRange], at: usize, n: usize, mut f: impl FnMut(*mut u8, usize, usize)) {
    let (parts, k) = local_span(ranges, at, n);
    let mut done = 0;
    for p in &parts[..k] {
        f(p.ptr, done, p.len);
        done += p.len;
    }
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

impl TransportOps for ShmVi {
    type Sleep = Sleep;
    const BIASED: bool = true;

    /// Posts a send: the fast path when it applies, else checked, queued,
    /// and written to the ring if nothing waits ahead of it.
    ///
    /// # Safety
    /// As for [`Vi::post_send_raw`].
    #[inline(always)]
    unsafe fn post_send(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        d: NonNull<Descriptor>,
        owned: bool,
    ) -> Result<(), PostError> {
        // The peer reported an error: the connection is broken. A send at
        // Reliable Delivery completes when written, so without a look here
        // a sender that only posts and takes its completions would never
        // learn; the progress below fails the VI, and this post with it.
        if self.conn.mine().error.load(Ordering::Relaxed) != 0 {
            self.progress(vi, q);
            if vi.state() == ViState::Error {
                return Err(PostError::ViError);
            }
        }
        // SAFETY: forwarded from the caller: a valid control segment.
        let control = unsafe { (*d.as_ptr()).cs.control };
        // One fast path by the operation, the one-sided write's without
        // the send's looks first: a peer may be watching for it.
        // SAFETY (both fast paths): forwarded from the caller.
        if control == control::OP_RDMAWRITE {
            if let Some(r) = unsafe { self.rdma_write_fast(vi, q, d, owned) } {
                return r;
            }
        } else if unsafe { self.send_inline_fast(vi, q, d, owned) } {
            return Ok(());
        }
        let (attrs, id) = (q.attrs, q.next_id);
        let len = q.sq.len();
        let Some(slot) = q.sq.next_free() else {
            return Err(PostError::QueueFull("send", len));
        };
        // SAFETY: forwarded from the caller.
        unsafe { prepare(&vi.s.nic, &attrs, slot, d, owned, Queue::Send)? };
        slot.id = id;
        q.next_id = id.wrapping_add(1);
        q.sq.commit();
        if q.sq_sent == q.sq.len() - 1 {
            self.send_queued(vi, q);
        }
        Ok(())
    }

    /// A done call's look: an empty poll in a few instructions, the fast
    /// receive path, else full progress; then the head of `queue` if done.
    #[inline(always)]
    fn poll(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        queue: Queue,
        owned: bool,
    ) -> Option<NonNull<Descriptor>> {
        // A message waits and the oldest receive may take it: the receive
        // fast path first, before the looks that find nothing to do.
        if queue == Queue::Recv && q.rq_done == 0 && self.conn.rx.ready() {
            if vi.state() == ViState::Connected {
                if let Some(d) = self.recv_inline_fast(vi, q, owned) {
                    return Some(d);
                }
            }
            self.progress(vi, q);
            return vi.pop(q, queue, owned);
        }
        // Nothing of ours in flight or queued, and nothing published by the peer.
        if self.awaiting_ack == 0
            && q.sq_sent == q.sq.len()
            && self.failed.is_none()
            && !self.conn.rx.ready()
            && self.conn.mine().error.load(Ordering::Relaxed) == 0
        {
            self.idle += 1;
            if self.idle.is_multiple_of(IDLE_CHECK_EVERY) && self.check_peer(vi, q) {
                return vi.pop(q, queue, owned);
            }
            return None;
        }
        self.progress(vi, q);
        vi.pop(q, queue, owned)
    }

    /// Moves everything forward that can move without waiting. Returns true
    /// if anything happened.
    fn send_copy(&mut self, _vi: &Vi, q: &mut Queues, bytes: &[&[u8]], imm: Option<u32>) -> bool {
        self.copy_inline(q, bytes, imm)
    }

    #[inline(always)]
    fn write_copy(&mut self, _vi: &Vi, q: &mut Queues, bytes: &[&[u8]], remote: Segment) -> bool {
        self.write_inline(q, bytes, remote)
    }

    fn progress(&mut self, vi: &Vi, q: &mut Queues) -> bool {
        if vi.state() == ViState::Error {
            return false;
        }
        let mut moved = false;
        if self.awaiting_ack > 0 {
            moved |= self.help_peer(vi, q);
            moved |= self.reap_acks(vi, q);
        } else if self.failed.is_none() && self.conn.mine().error.load(Ordering::Acquire) != 0 {
            // The peer reported an error for a send that completed when it
            // was written: the reliable connection is broken all the same.
            self.failed = Some(status::TRANSPORT_ERROR);
            moved = true;
        }
        moved |= self.serve_incoming(vi, q);
        if self.draining.is_some() && self.failed.is_none() && !self.conn.rx.ready() {
            // The last message the peer left has been taken.
            self.failed = Some(status::TRANSPORT_ERROR);
        }
        // Nothing more is started once the connection broke: what is queued
        // is flushed below (an RDMA write placed here would land and
        // complete after the break).
        if q.sq_sent < q.sq.len() && self.failed.is_none() {
            let before = q.sq_sent;
            self.send_queued(vi, q);
            moved |= q.sq_sent != before;
        }
        if let Some(bits) = self.failed.take() {
            self.fail(vi, q, bits);
            moved = true;
        }
        self.waits_on_peer = self.awaiting_ack > 0 || q.sq_sent < q.sq.len();
        if moved {
            self.idle = 0;
            self.stall = None;
        } else {
            self.idle += 1;
            if self.idle.is_multiple_of(STALL_CHECK_EVERY) && self.waits_on_peer {
                let _ = self.check_stall();
            }
            if self.idle.is_multiple_of(IDLE_CHECK_EVERY) {
                moved = self.check_peer(vi, q);
            }
        }
        moved
    }

    /// Arms this side's doorbell for a futex wake-up. A waiter that sleeps
    /// on what the peer has yet to consume sleeps no longer than until its
    /// first ask of the peer's agent is due, and asks when it is: nothing
    /// else would move a peer whose program makes no call. Later asks come
    /// with the wait's own slices, which must stay whole: a slice without a
    /// wake-up is what makes the wait look at the peer's health.
    fn arm(&mut self, _nic: &NicShared) -> Sleep {
        let due = self.check_stall();
        let first = self.stall.is_some_and(|(_, pause)| pause == AGENT_AFTER);
        let cap = due.filter(|_| first).unwrap_or(Duration::MAX);
        Sleep {
            seg: self.seg.clone(),
            side: self.conn.side(),
            seq: self.conn.mine().bell.arm(doorbell::FUTEX),
            cap,
        }
    }

    fn disarm(&mut self) {
        self.conn.mine().bell.disarm(doorbell::FUTEX);
    }

    /// Arms the doorbell for a CQ's eventfd; true if something is already
    /// waiting to be served. Looks at the peer's health too, at most every
    /// [`ARM_CHECK_EVERY`].
    /// A CQ waiter that will sleep on what the peer has yet to consume
    /// asks the peer's agent at once: its sleep is the CQ's, which this VI
    /// cannot shorten to ask later as [`arm`](Self::arm) does.
    fn arm_eventfd(&mut self, vi: &Vi, q: &mut Queues) -> bool {
        self.conn.mine().bell.arm(doorbell::EVENTFD);
        let now = Instant::now();
        let look = self
            .armed_check_at
            .is_none_or(|t| now.duration_since(t) >= ARM_CHECK_EVERY);
        if look {
            self.armed_check_at = Some(now);
        }
        let moved = self.progress(vi, q) || (look && self.check_peer(vi, q));
        if !moved && self.waits_on_peer && self.conn.tx.consumed() < self.conn.tx.head() {
            self.conn.ask_peer_agent();
        }
        moved
    }

    /// Tells the peer this side is going away.
    fn disconnect(&mut self, _vi: &Vi, _q: &mut Queues) {
        self.conn.close();
    }

    fn close(&mut self, _nic: &NicShared) {
        self.conn.close();
    }

    fn peer_leaving(&self) -> bool {
        self.draining.is_some()
    }

    /// Looks at the peer's health; fails the VI if it is gone.
    fn check_peer(&mut self, vi: &Vi, q: &mut Queues) -> bool {
        // Windows the peer withdrew go now, not at this side's next write.
        self.conn.drop_withdrawn_windows();
        let conn = &self.conn;
        let closed = conn.mine().closed.load(Ordering::Acquire) != 0;
        if closed || conn.stream.peer_gone() {
            if !closed {
                // The peer died without disconnecting. If it was the server,
                // its listening socket may be left behind: remove it if
                // nobody accepts on it any more.
                if let Some(path) = &self.server_socket {
                    let _ = uvia_shm::socket::remove_if_stale(path);
                }
            }
            // Messages the peer published before leaving are still
            // delivered: to the receives posted now, and to those posted
            // within DRAIN_LIMIT.
            let moved = self.serve_incoming(vi, q);
            if self.failed.is_none() && self.conn.rx.ready() {
                let now = Instant::now();
                if now < *self.draining.get_or_insert(now + DRAIN_LIMIT) {
                    return moved;
                }
            }
            let bits = self.failed.take().unwrap_or(status::TRANSPORT_ERROR);
            self.fail(vi, q, bits);
            return true;
        }
        if self.stopped.as_ref().is_some_and(|w| w.stopped_too_long()) {
            self.serve_incoming(vi, q);
            self.conn.close();
            self.fail(vi, q, status::TRANSPORT_ERROR);
            return true;
        }
        false
    }
}

/// The ranges a by-reference message names, into `out`; their count.
/// Data the peer reads comes from its mapping of the region's memfd for
/// the part the memfd backs (announced to the peer first), by cross-memory
/// attach for the rest: a range of caller memory whose first or last page
/// holds other data too is cut in up to three. An RDMA read's ranges are
/// written by the peer, so they stay addresses, and so do all of a message
/// whose cut ranges would not fit [`MAX_SEGMENTS`] (what a receiver takes).
fn wire_ranges(conn: &mut ShmConn, e: &Posted, out: &mut [WireRange; MAX_SEGMENTS]) -> usize {
    let n = e.nranges as usize;
    let plain = |out: &mut [WireRange; MAX_SEGMENTS]| {
        for (w, r) in out.iter_mut().zip(&e.ranges[..n]) {
            *w = WireRange {
                addr: r.ptr as u64,
                len: r.len as u64,
                ..WireRange::default()
            };
        }
        n
    };
    if e.op == Op::RdmaRead || e.src[..n].iter().all(|s| s.fd < 0) {
        return plain(out);
    }
    let mut k = 0;
    for (r, src) in e.ranges[..n].iter().zip(&e.src[..n]) {
        let (pieces, np) = src.pieces(r.len as u64);
        let shared = src.fd >= 0 && conn.announce(src.handle, src.serial, src.fd).is_ok();
        let mut at = 0u64;
        for &(len, in_fd) in &pieces[..np] {
            let Some(w) = out.get_mut(k) else {
                return plain(out);
            };
            *w = if in_fd && shared {
                WireRange {
                    // The range's offset in the memfd, plus what went
                    // before the window (then exactly 0).
                    addr: src.offset.wrapping_add(at),
                    len,
                    handle: src.handle,
                    serial: src.serial,
                }
            } else {
                WireRange {
                    addr: r.ptr as u64 + at,
                    len,
                    ..WireRange::default()
                }
            };
            at += len;
            k += 1;
        }
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connections_to_one_process_share_one_watch_of_its_state() {
        // A child of its own: this process's watch is shared with the other
        // tests' shm connections, which keep it alive past the drop below.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep starts");
        let me = child.id() as i32;
        let a = StopWatch::of(me).expect("this process's state is readable");
        let b = StopWatch::of(me).expect("this process's state is readable");
        assert!(
            Arc::ptr_eq(&a, &b),
            "a second connection opened its own watch"
        );
        let state = a.read_state();
        // (A child just started may still sleep uninterruptibly, in its
        // exec, on a busy machine: 'D'.)
        assert!(
            matches!(state, Some(b'R' | b'S' | b'D')),
            "the child is running or sleeping, not {:?}",
            state.map(char::from)
        );
        assert!(!a.stopped_too_long());
        // Looked at once for both within the interval (unless this thread
        // was off its core for the whole interval in between).
        let looked = a.state.lock().unwrap().looked.expect("looked at");
        assert!(!b.stopped_too_long());
        if looked.elapsed() < STOP_LOOK_EVERY {
            assert_eq!(b.state.lock().unwrap().looked, Some(looked));
        }
        drop((a, b));
        // Without a connection left the watch goes; the next is new.
        let c = StopWatch::of(me).unwrap();
        assert!(c.state.lock().unwrap().looked.is_none());
        assert_eq!(StopWatch::of(0).map(|_| ()), None, "no pid: no watch");
        drop(c);
        let _ = child.kill();
        let _ = child.wait();
    }
}
