//! One network VI's transport: the protocol engine ([`uvia_proto::Conn`])
//! of its connection, driven over the Nic's medium or a medium of its own.
//!
//! Progress runs inside the caller's post, done and wait calls, as on `shm`:
//! whoever polls reads what the medium has, hands each frame to the VI it
//! names (through the Nic's endpoint) and sends what the engines want sent.
//! The engine moves payload straight between frames and the descriptors'
//! registered memory through [`ViMem`]; completions come back as engine
//! events and are written into the descriptors here.

use super::closing::Closing;
use super::peers::{PeerLive, BUSY_FRAMES, TELL_EVERY};
use super::{NetNic, Noted, TX_BATCH};
use crate::desc::{status, Descriptor, MemHandle, Op};
use crate::error::PostError;
use crate::mem::RegionTable;
use crate::nic::NicShared;
use crate::provider::TransportOps;
use crate::vi::{check_rdma, prepare, EntryState, Posted, Queue, Queues, SlotQueue, Vi};
use crate::vi::{Broken, ViAttributes, ViState};
use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uvia_net::{Addr, GatherFrame, Medium, OutFrame, Placed, Placement, RecvBatch};
use uvia_proto::wire::{self, NakCode, Repr, DATA_HEADER_LEN};
use uvia_proto::{
    Clock, Conn, Event, Expected, FailReason, Memory, Outcome, Place, SendKind, SendOp,
};

/// A post this soon after the previous transmission joins a burst.
const COALESCE: Duration = Duration::from_micros(5);
/// Empty polls between two looks at a network VI's timers.
const TIMER_EVERY: u32 = 16;
/// Empty polls between two looks at an armed delayed acknowledgement.
const ACK_LOOK_EVERY: u32 = 2;
/// Least time between two looks at the Nic's own medium by a VI whose
/// frames all reach a medium of its own: only requests and other VIs'
/// handshakes arrive there, and a flood of requests then costs a busy VI
/// at most one batch per look (the rest wait, or the kernel drops them).
const NIC_LOOK_EVERY: Duration = Duration::from_millis(1);
/// Longest sleep of a network VI's waiter: the engine's timers (delayed
/// acks, retransmissions, keep-alives) run in its progress.
const NAP: Duration = Duration::from_millis(1);

/// Frames `vi` holds back for a burst (tests).
#[cfg(test)]
pub(crate) fn held_frames(vi: &Vi) -> u32 {
    match &vi.lock().t {
        crate::provider::Transport::Net(n) => n.deferred,
        _ => 0,
    }
}

/// Acknowledgements `vi`'s engine sent: keep-alives and their answers,
/// on an idle connection (tests).
#[cfg(test)]
pub(crate) fn acks_sent(vi: &Vi) -> u64 {
    match &vi.lock().t {
        crate::provider::Transport::Net(n) => n.conn.stats().acks_sent,
        _ => 0,
    }
}

/// `vi`'s connection keeps the watch of its peer's Nic: it has timers and
/// its socket is out of the Nic's watch (tests).
#[cfg(test)]
pub(crate) fn keeps_watch(vi: &Vi) -> bool {
    match &vi.lock().t {
        crate::provider::Transport::Net(n) => !n.conn.is_kept() && !n.watched,
        _ => false,
    }
}

/// Largest message a network VI sends by copy ([`TransportOps::send_copy`]):
/// libfabric's inject size, and what `ofi_rxm` injects (its header and a
/// small payload).
const COPY_MAX: usize = 256;

/// Copied messages in flight per VI, at most: past it a copy is refused and
/// the caller posts a descriptor (a bounded queue, as a send queue is).
const COPIES_IN_FLIGHT: usize = 64;

/// A message sent by copy: its bytes stay here until the peer acknowledges
/// them, for the engine to read again if a frame of it is lost.
struct Copied {
    msn: u32,
    bytes: [u8; COPY_MAX],
}

/// A VI's network connection.
pub(crate) struct NetVi {
    pub conn: Conn,
    pub peer: Addr,
    pub id: u32,
    /// Frames built and not yet handed to the medium.
    tx: Vec<u8>,
    tx_lens: Vec<usize>,
    /// The last handshake event, for the connecting call.
    pub(super) handshake: Option<Event>,
    /// When frames last went to the medium.
    last_tx: Option<Instant>,
    /// A message arrived since frames last went: a post now answers it.
    answering: bool,
    /// Posts whose frames wait for the next progress call (coalesced).
    deferred: u32,
    /// Polls since the timers were last looked at.
    idle: u32,
    /// When a VI with a medium of its own next looks at the Nic's.
    nic_look_at: Option<Instant>,
    /// Where its next deadline is noted with the Nic.
    pub(super) noted: Noted,
    /// The connection's own medium, when the Nic's allows one (a UDP
    /// socket on a port of its own): every frame of the connection comes
    /// and goes there, so two connections between the same two Nics are
    /// two pairs of addresses, and no frame needs a table lookup.
    own: Option<Arc<dyn Medium>>,
    own_batch: Option<RecvBatch>,
    /// The frames the last placed receive expected, and their places
    /// ([`recv_placed`](Self::recv_placed)). Kept here rather than
    /// returned: moved through every poll's result, its 1.1 KB were a
    /// `memcpy` on each, the one that found a message included.
    places: Places,
    /// `peer` is the address the peer's connection sends from, learned
    /// from its first frame that is not a request (a client's from the
    /// server's accept, a server's from the client's confirm); until then
    /// it is the peer's Nic, and arriving frames go through the Nic's
    /// endpoint, which takes them from any address of the peer's host.
    /// Joined, the own medium is connected to the peer and takes only its
    /// frames.
    joined: bool,
    /// What this and the Nic's other connections to the peer's Nic know of
    /// it (see [`peers`](super::peers)), once connected to a peer that
    /// names its Nic.
    peer_live: Option<Arc<PeerLive>>,
    /// When this connection last told `peer_live` it heard the peer.
    told: Option<Instant>,
    /// Data came that `peer_live` has not been told of: a poll that read
    /// no clock for it tells at the next settle.
    untold: bool,
    /// Frames taken in since then.
    heard_frames: u32,
    /// Its own medium is in the Nic's watch (while another connection
    /// keeps the peer's Nic alive, and this one has no timers).
    watched: bool,
    /// The engine's count of frames sent again when last looked at, and
    /// the sleeps since it last grew ([`lend_recv`](Self::lend_recv)).
    sent_again: u64,
    quiet_sleeps: u32,
    /// Messages sent by copy and not yet acknowledged, oldest first.
    copies: VecDeque<Copied>,
}

/// Sleeps in `poll` after a retransmission before a waiter may sleep in
/// the receive again ([`NetVi::lend_recv`]).
const QUIET_SLEEPS: u32 = 64;

/// What a sleeping waiter of a network VI waits on: a frame on its own
/// medium or the Nic's, or its engine's next timer.
#[derive(Clone)]
pub(crate) struct Sleep(Option<Arc<dyn Medium>>);

impl Sleep {
    pub fn sleep(self, nic: &NicShared, nap: Duration) {
        let nap = Some(nap.min(NAP));
        let _ = match (self.0, NetNic::of(nic)) {
            (Some(m), _) => m.wait(nap),
            (None, Some(n)) => n.medium.wait(nap),
            (None, None) => Ok(()),
        };
    }
}

impl NetVi {
    pub(super) fn new(conn: Conn, peer: Addr, id: u32, max_frame: usize) -> Box<NetVi> {
        Box::new(NetVi {
            conn,
            peer,
            id,
            tx: vec![0; TX_BATCH * max_frame],
            tx_lens: Vec::with_capacity(TX_BATCH),
            handshake: None,
            last_tx: None,
            answering: false,
            deferred: 0,
            idle: 0,
            nic_look_at: None,
            noted: Noted::default(),
            own: None,
            own_batch: None,
            places: Places::default(),
            joined: false,
            peer_live: None,
            told: None,
            untold: false,
            heard_frames: 0,
            watched: false,
            sent_again: 0,
            quiet_sleeps: QUIET_SLEEPS,
            copies: VecDeque::new(),
        })
    }

    /// Gives the connection a medium of its own (`None`: it uses the
    /// Nic's).
    pub(super) fn set_own(&mut self, own: Option<Arc<dyn Medium>>) {
        if let Some(m) = &own {
            let slots = m.caps().max_batch.clamp(1, 16);
            self.own_batch = Some(RecvBatch::new(slots, 65_536));
        }
        self.own = own;
    }

    /// A delayed acknowledgement armed and due, looked at every
    /// [`ACK_LOOK_EVERY`] empty polls (one clock read): an ack no answer
    /// carries (the last message of an exchange, as a rendezvous's closing
    /// one) holds up its sender's completion. At the timers' own pace,
    /// every 16 polls, Open MPI's MiB on udp saw that message acked 16 us
    /// after it (p50) where the delay is 5. No clock is read while none is
    /// armed: a ping-pong's answer carries its ack before the settle that
    /// would arm one.
    #[inline]
    fn ack_due(&self) -> bool {
        self.idle.is_multiple_of(ACK_LOOK_EVERY)
            && self
                .conn
                .ack_deadline()
                .is_some_and(|t| Instant::now() >= t)
    }

    /// Runs the engine's due timers, after counting what the Nic's other
    /// connections to the peer's Nic heard from it: of many idle
    /// connections to one Nic, one keeps it alive.
    fn timers_due(&mut self, now: Instant, nic: &NetNic) {
        self.share(nic, now);
        self.conn.handle_timeout(now);
    }

    /// Takes this connection's part in watching the peer's Nic (see
    /// [`peers`](super::peers)). Only a connection with a medium of its own
    /// may be kept without timers (the Nic's watch reads own media): one
    /// whose frames come through the Nic's (AF_XDP) keeps its own timers
    /// and shares what it heard. (Kept without timers there, three
    /// connections between two xdp Nics on a busy host lost all three now
    /// and then, 2 runs of 28.)
    fn share(&mut self, nic: &NetNic, now: Instant) {
        if self.peer_live.is_some() {
            // What the engine heard is settled first: the watch reads the
            // last frame's time and whether a keep-alive is due.
            self.settle(now);
        }
        if let Some(p) = &self.peer_live {
            let id = self.own.is_some().then_some(self.id);
            p.share(&mut self.conn, id, now);
            self.watch_if_kept(nic);
        }
    }

    /// A connection without timers (kept) has its own medium in the Nic's
    /// watch, so that a sweep reads what comes to it; one with timers reads
    /// its medium at their looks, and its frames do not wake the watch.
    fn watch_if_kept(&mut self, nic: &NetNic) {
        let kept = self.conn.is_kept() && self.peer_live.is_some();
        if kept == self.watched {
            return;
        }
        if let Some(m) = &self.own {
            match kept {
                true => nic.watch.add(m.fd(), self.id),
                false => nic.watch.remove(m.fd()),
            }
        }
        self.watched = kept;
    }

    /// Takes this connection's part in watching the peer's Nic at `now` if
    /// it changed: it became the keeper or stopped being it, or the Nic
    /// fell silent. True if it did.
    pub(super) fn share_if_changed(&mut self, now: Instant, nic: &NetNic) -> bool {
        let changed = self.own.is_some()
            && self
                .peer_live
                .as_ref()
                .is_some_and(|p| p.must_share(self.id, self.conn.is_kept(), now));
        if changed {
            self.share(nic, now);
        }
        changed
    }

    /// The connection stopped carrying the peer: it no longer takes part
    /// in watching the peer's Nic (`silent`: it failed for the Nic's
    /// silence, which the others then share).
    fn stop_sharing(&mut self, nic: &NetNic, silent: bool) {
        if let Some(p) = self.peer_live.take() {
            if p.leave(self.id, silent) {
                // The others look at once: one takes over, or all fail.
                nic.deadlines.walk_soon(Instant::now());
            }
            self.watch_if_kept(nic);
        }
    }

    /// The peer's connection has sent from `from`: its frames come from
    /// there from now on, and the own medium takes only those.
    #[cold]
    fn join(&mut self, vi: &Vi, from: Addr) {
        let Some(nic) = NetNic::of(&vi.s.nic) else {
            return;
        };
        if self.peer_live.is_none() {
            self.peer_live = self
                .conn
                .peer_nic()
                .map(|t| nic.peers.join(t, from, nic.idle_timeout));
            // Keeper or kept from the start: of many connections made to
            // one Nic, only the first keeps timers.
            self.share(nic, Instant::now());
        }
        self.joined = true;
        self.peer = from;
        if let Some(m) = &self.own {
            // If it cannot connect, it still takes the peer's frames among
            // others; the endpoint's check is then all there is.
            if m.connect(from).is_err() {
                self.joined = false;
            }
        }
        nic.joined(self.id, from);
    }

    /// True if frames from `from` are this connection's peer's, as the
    /// Nic's endpoint would find: joined, the peer's connection sends from
    /// there (the endpoint learned the same address in [`join`](Self::join)).
    pub(super) fn takes_from(&self, from: Addr) -> bool {
        self.joined && self.peer == from
    }

    /// Hands a frame to this VI's engine.
    pub(super) fn input(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        from: Addr,
        src: u32,
        repr: &Repr<'_>,
        clock: &mut Clock,
    ) {
        // Frames come from the own medium once it is connected to the
        // peer (the kernel checked the source), or through the endpoint,
        // which checked it.
        let mut mem = ViMem::new(vi, q, None);
        uvia_trace::mark!(ProtoIn);
        self.conn.handle_frame_with(clock, src, repr, &mut mem);
        uvia_trace::mark!(ProtoPlaced);
        if self.peer_live.is_some() {
            match clock.read() {
                Some(now) => self.tell_heard(now),
                None => self.untold = true,
            }
            // A connection kept without timers that takes in many frames
            // within one tell takes the watch over (see `BUSY_FRAMES`),
            // so that its datagrams wake no epoll set; it asks again after
            // as many more. A busy keeper says so, and keeps it.
            self.heard_frames += 1;
            if self.heard_frames >= BUSY_FRAMES && self.own.is_some() {
                self.heard_frames = 0;
                let now = clock.now();
                let kept = self.conn.is_kept();
                if self
                    .peer_live
                    .as_ref()
                    .is_some_and(|p| p.busy(self.id, kept, now))
                {
                    if let Some(nic) = NetNic::of(&vi.s.nic) {
                        self.share(nic, now);
                    }
                }
            }
        }
        // A request comes from the peer's Nic, not from its connection:
        // answers to it go there until the peer's connection is heard
        // (peer to peer, that may be another address of the host named,
        // when the peer shares its host's device with other processes).
        let request = matches!(repr, Repr::ConnRequest { .. } | Repr::PeerRequest { .. });
        if request && !self.joined {
            self.peer = from;
        }
        if !self.joined && self.conn.is_connected() && !request {
            self.join(vi, from);
        }
        self.events(vi, q);
    }

    /// Tells `peer_live` that the peer was heard (at most every
    /// `TELL_EVERY`).
    fn tell_heard(&mut self, now: Instant) {
        self.untold = false;
        if let Some(p) = &self.peer_live {
            if self.told.is_none_or(|t| now >= t + TELL_EVERY) {
                self.told = Some(now);
                self.heard_frames = 0;
                p.heard_by(self.id, now);
            }
        }
    }

    /// The engine's bookkeeping left for after the answer (see
    /// `Conn::settle`), at `now`, and the hearing not yet told.
    fn settle(&mut self, now: Instant) {
        self.conn.settle(now);
        if self.untold {
            self.tell_heard(now);
        }
    }

    /// Sends what the engine has to send and applies its events.
    pub(super) fn output(&mut self, vi: &Vi, q: &mut Queues, now: Instant) -> bool {
        self.output_with(vi, q, &mut Clock::at(now))
    }

    /// [`output`](Self::output), the time read from `clock` where the
    /// engine needs it, and after the transmission.
    fn output_with(&mut self, vi: &Vi, q: &mut Queues, clock: &mut Clock) -> bool {
        let Some(nic) = NetNic::of(&vi.s.nic) else {
            return false;
        };
        let mut sent = false;
        loop {
            // Moved out for the call, as the medium is: the engine reads
            // copied messages through `mem` while it borrows this VI (none
            // on a VI that sends none: nothing moved on its path).
            let copies = (!self.copies.is_empty()).then(|| std::mem::take(&mut self.copies));
            let mut mem = ViMem::new(vi, q, copies.as_ref());
            self.deferred = 0;
            // A local send failure is a lost frame to the engine: the
            // reliable levels send it again, the unreliable one lost it.
            // (The VI's own medium is moved out for the call, not cloned:
            // no reference count touched per send.)
            let own = self.own.take();
            // Requests go from the Nic's medium: the peer knows the Nic by
            // them, and finds a repetition by its source. Everything after
            // goes from the connection's own, which tells the peer its
            // address.
            let from_own = self.joined || self.conn.is_connected();
            let k = match &own {
                // Most outputs after an arrival have nothing to send: the
                // medium is not called (on AF_XDP two of three calls a
                // ping-pong message took a frame off the ring and gave it
                // back, some 250 instructions each).
                _ if !self.conn.may_transmit(clock.at_least()) => 0,
                Some(own) if from_own => self.send_copied(&**own, clock, &mut mem),
                _ if nic.lends => self.send_built(&*nic.medium, clock, &mut mem),
                _ => self.send_copied(&*nic.medium, clock, &mut mem),
            };
            self.own = own;
            if let Some(c) = copies {
                self.copies = c;
            }
            // After the call, off the message's way: the time the frames
            // left (an answer's post read none before them).
            let now = if k > 0 { Instant::now() } else { clock.now() };
            // The answer is out: now the acknowledgement its question
            // carried, and the frames' timers (see `Conn::settle`).
            self.settle(now);
            if k > 0 {
                // A burst is judged by the gap between the end of one
                // transmission and the next post. An answer's frames take
                // the time the post began where it was read, so that the
                // post after an answer looks further from it and goes at
                // once rather than waiting for a burst.
                self.last_tx = Some(match clock.read() {
                    Some(t) if self.answering => t,
                    _ => now,
                });
                self.answering = false;
                sent = true;
            }
            self.events(vi, q);
            if k < TX_BATCH {
                // Every change to the engine's timers ends here: the Nic's
                // sweeps learn when this VI's next one is due.
                let due = self.conn.poll_timeout();
                nic.note_deadline(due, now, self.id, &mut self.noted);
                return sent;
            }
        }
    }

    /// Sends a message just given to the engine, or holds its frames for
    /// the burst it is part of. Doorbell coalescing: a post that follows
    /// the last transmission closely is part of a burst; its frames leave
    /// with the burst, at the caller's next done or wait call (or once a
    /// batch is full), in one system call. A lone post goes at once, and so
    /// does the first post after a message arrived: that is an answer (a
    /// ping-pong's reply comes well within the burst gap of the previous
    /// send).
    ///
    /// An answer reads no clock before its frames leave: the engine builds
    /// a new data frame without the time, and the output reads it after
    /// the transmission.
    fn posted(&mut self, vi: &Vi, q: &mut Queues) {
        if self.answering {
            let mut clock = Clock::since(self.last_tx, Instant::now);
            self.output_with(vi, q, &mut clock);
            return;
        }
        let now = Instant::now();
        let burst = self
            .last_tx
            .is_some_and(|t| now.saturating_duration_since(t) < COALESCE);
        if burst && (self.deferred as usize) < TX_BATCH - 1 {
            if self.deferred == 0 {
                crate::cq::holds_frames(&vi.s);
            }
            self.deferred += 1;
            return;
        }
        self.output(vi, q, now);
    }

    /// Writes engine completions into the descriptors.
    fn events(&mut self, vi: &Vi, q: &mut Queues) -> bool {
        let mut moved = false;
        let mut silent = false;
        while let Some(ev) = self.conn.poll_event() {
            moved = true;
            if let Event::SendDone { outcome, .. } | Event::RecvDone { outcome, .. } = ev {
                if outcome == Outcome::Transport && vi.broken_by().is_none() {
                    // Named before the first completion it breaks is seen.
                    if let Some(why) = self.conn.pending_end().and_then(broken) {
                        vi.set_broken(why);
                    }
                }
            }
            match ev {
                Event::SendDone { msn, outcome } => {
                    // Sends complete in posting order: a copied one is the
                    // oldest copy, and has no descriptor to complete.
                    if self.copies.front().is_some_and(|c| c.msn == msn) {
                        self.copies.pop_front();
                        continue;
                    }
                    let first = q.sq.front().map(|e| e.id).unwrap_or(msn);
                    let i = msn.wrapping_sub(first) as usize;
                    if i < q.sq.len() {
                        let e = &mut q.sq[i];
                        if e.state != EntryState::Done {
                            vi.complete_send(e, outcome_bits(outcome));
                        }
                    }
                }
                Event::RecvDone {
                    rsn,
                    len,
                    imm,
                    remote_write,
                    outcome,
                } => {
                    let first = q.rq.front().map(|e| e.id).unwrap_or(rsn);
                    let i = rsn.wrapping_sub(first) as usize;
                    if i < q.rq.len() {
                        let op = if remote_write {
                            status::OP_REMOTE_RDMA_WRITE
                        } else {
                            status::OP_RECEIVE
                        };
                        let len = if outcome == Outcome::Ok { len } else { 0 };
                        let e = &mut q.rq[i];
                        if e.state != EntryState::Done {
                            vi.complete_recv(e, op, len, imm, outcome_bits(outcome));
                            q.rq_done += 1;
                        }
                        self.answering = true;
                    }
                }
                Event::Connected | Event::Rejected(_) | Event::ConnectTimedOut => {
                    self.handshake = Some(ev);
                }
                Event::Disconnected | Event::Failed(_) => {
                    // Every descriptor was completed by the engine first
                    // (a transport error among them named the reason then).
                    if let Some(why) = broken(ev) {
                        vi.set_broken(why);
                    }
                    self.copies.clear();
                    silent = matches!(ev, Event::Failed(FailReason::PeerSilent));
                    vi.set_state(ViState::Error);
                }
            }
        }
        // Closed, failed or closing at this side's word: it watches the
        // peer no more.
        if self.peer_live.is_some() && !self.conn.is_connected() {
            if let Some(nic) = NetNic::of(&vi.s.nic) {
                self.stop_sharing(nic, silent);
            }
        }
        moved
    }

    /// Reads the VI's own medium and hands the frames to its engine.
    /// Returns, if any arrived, the clock they were taken in by: read only
    /// if the engine asked for the time (a data frame on a settled
    /// connection does not).
    fn poll_own(&mut self, vi: &Vi, q: &mut Queues, nic: &NetNic) -> Option<Clock> {
        let mut batch = self.own_batch.take()?;
        let placed = self.recv_placed(vi, q, nic, &mut batch);
        let Some(own) = self.own.as_ref() else {
            self.own_batch = Some(batch);
            return None;
        };
        // Borrowed for the call, not cloned: no reference count touched
        // per poll.
        // A medium that cannot place (the fault injector with faults other
        // than loss) receives as usual.
        let (n, placed) = match placed {
            Some(Ok(p)) => (p.frames, p),
            Some(Err(_)) | None => (own.recv(&mut batch).unwrap_or(0), Placed::default()),
        };
        let mut at = None;
        if n > 0 {
            let clock = at.insert(Clock::since(self.last_tx, Instant::now));
            for i in 0..n {
                let (from, bytes) = batch.frame(i);
                if placed.in_place(i) {
                    let k = batch.slot_of(i);
                    let (Some(exp), Ok((_, src, Repr::Data { header, .. }))) =
                        (self.places.exp[k], wire::parse_placed(bytes, &[]))
                    else {
                        continue;
                    };
                    // SAFETY: the receive wrote the payload's bytes at its
                    // place, the memory `recv_placed` resolved (the frame
                    // was found to be the one expected there).
                    let payload = unsafe {
                        std::slice::from_raw_parts(self.places.at[k].at, exp.payload_len(&header))
                    };
                    let repr = Repr::Data { header, payload };
                    self.input(vi, q, from, src, &repr, clock);
                    continue;
                }
                if !self.joined {
                    // Connecting, and taking frames from anyone: the
                    // endpoint says which are the peer's.
                    let now = clock.now();
                    if let Some((src, repr)) = nic.handshake_frame(now, self.id, from, bytes) {
                        self.input(vi, q, from, src, &repr, clock);
                    }
                    continue;
                }
                self.input_joined(vi, q, nic, from, bytes, clock);
            }
        }
        self.own_batch = Some(batch);
        at
    }

    /// Where a large message is coming in on the joined connection's own
    /// medium: one receive that puts the payloads of the frames expected
    /// next (`Conn::expected`, as many as the batch has slots) where they
    /// belong, each frame that came as expected left as its head in
    /// `batch` (see [`Placed`]), the frames and places in `self.places`.
    /// `None` where nothing is expected or the medium (or the memory, in
    /// more than one piece) does not allow it: the caller receives as
    /// usual.
    fn recv_placed(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        nic: &NetNic,
        batch: &mut RecvBatch,
    ) -> Option<std::io::Result<Placed>> {
        if !self.joined || !nic.intact {
            return None;
        }
        let first = self.conn.expected()?;
        let mem = ViMem::new(vi, q, None);
        let places = &mut self.places;
        places.n = 0;
        let mut next = Some(first);
        while let Some(exp) = next.filter(|_| places.n < PLACES) {
            let Some(at) = mem.place(&exp) else {
                break;
            };
            places.exp[places.n] = Some(exp);
            places.at[places.n] = Placement {
                head: DATA_HEADER_LEN,
                at,
                len: exp.len as usize,
            };
            places.n += 1;
            next = self.conn.expected_after(&exp);
        }
        if places.n == 0 {
            return None;
        }
        // A reference count per frame of 8 KiB or more.
        let own = self.own.clone()?;
        let id = self.id;
        let exps = &places.exp;
        let expected = |i: usize, head: &[u8], n: usize| {
            let (Some(exp), Some(len)) = (exps[i], n.checked_sub(DATA_HEADER_LEN)) else {
                return false;
            };
            matches!(wire::parse_placed(head, &[]),
                Ok((dst, _, Repr::Data { header, .. })) if dst == id && exp.matches(&header, len))
        };
        // SAFETY: each place is a posted descriptor's (or a checked
        // region's) memory, which stays so under the VI's lock, held for
        // the call; the places are consecutive pieces of messages, apart;
        // the engine has not written there (their frames have not
        // arrived) and the program may not read them before the
        // descriptor completes.
        Some(unsafe { own.recv_placed(batch, &places.at[..places.n], &expected) })
    }

    /// For a waiter that sleeps in the receive itself: the joined
    /// connection's own medium and its receive batch, lent out until
    /// [`slept_in_recv`](Self::slept_in_recv) (meanwhile other polls of
    /// the VI leave the medium to the sleeper). `None` where frames may
    /// come elsewhere (connecting, or no medium of its own) or deferred
    /// frames wait to go.
    ///
    /// The kernel bounds such a sleep in whole ticks (4 to 8 ms at 250 Hz),
    /// a `poll` to the millisecond: not while an acknowledgement is owed
    /// (the peer would send again), nor while frames are being lost (a
    /// retransmission is not to wait the difference). After a
    /// retransmission, [`QUIET_SLEEPS`] sleeps go by in `poll` first.
    pub(crate) fn lend_recv(&mut self) -> Option<(Arc<dyn Medium>, RecvBatch)> {
        if !self.joined || self.deferred > 0 || self.conn.owes_ack() {
            return None;
        }
        let sent_again = self.conn.retransmitted();
        if sent_again != self.sent_again {
            self.sent_again = sent_again;
            self.quiet_sleeps = 0;
        }
        if self.quiet_sleeps < QUIET_SLEEPS {
            self.quiet_sleeps += 1;
            return None;
        }
        let own = self.own.clone()?;
        let batch = self.own_batch.take()?;
        Some((own, batch))
    }

    /// Takes back what [`lend_recv`](Self::lend_recv) lent, with `n`
    /// frames the sleeper received into the batch, and moves the VI
    /// forward with them. True if anything moved.
    pub(crate) fn slept_in_recv(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        medium: &Arc<dyn Medium>,
        batch: RecvBatch,
        n: usize,
    ) -> bool {
        // The connection may have been replaced meanwhile: the frames were
        // an earlier one's, and its batch goes with it.
        let same = self.own.as_ref().is_some_and(|m| Arc::ptr_eq(m, medium));
        let Some(nic) = NetNic::of(&vi.s.nic).filter(|_| same) else {
            return false;
        };
        let now = Instant::now();
        let mut clock = Clock::at(now);
        for i in 0..n {
            let (from, bytes) = batch.frame(i);
            self.input_joined(vi, q, nic, from, bytes, &mut clock);
        }
        self.own_batch = Some(batch);
        // What a sleep that ended without frames owes: the timers.
        if n == 0 && self.conn.poll_timeout().is_some_and(|t| t <= now) {
            self.timers_due(now, nic);
        }
        self.output(vi, q, now) | (n > 0)
    }

    /// After [`close`](TransportOps::close) or
    /// [`disconnect`](TransportOps::disconnect): the connection, still
    /// closing, goes to the Nic's closer, which answers the peer until it
    /// has the disconnect ([`closing`](super::closing)). Only a joined
    /// connection can be kept so: with a medium of its own, that medium
    /// goes with it; without, it stays in the Nic's endpoint (see
    /// [`kept_on_nic`](Self::kept_on_nic)) and its frames reach the closer
    /// through the Nic's. Another is let go, and its peer's idle timeout
    /// covers a lost disconnect.
    pub(crate) fn keep_closing(self: Box<Self>, nic: &NicShared) {
        let Some(net) = NetNic::of(nic) else {
            return;
        };
        if !self.is_closing_joined() {
            return;
        }
        let NetVi {
            conn,
            peer,
            id,
            own,
            ..
        } = *self;
        let c = match own {
            Some(own) => Closing::new(conn, own, peer, id, net.intact),
            None => Closing::on_nic(conn, peer, id, net.intact),
        };
        net.closer.keep(c, net);
    }

    /// True if the connection, closing, is to stay in the Nic's endpoint
    /// after its VI is gone: its frames come to the Nic's medium and
    /// [`keep_closing`](Self::keep_closing) keeps it.
    fn kept_on_nic(&self) -> bool {
        self.own.is_none() && self.is_closing_joined()
    }

    /// Joined to its peer and closing: what the closer keeps.
    fn is_closing_joined(&self) -> bool {
        self.joined && !self.conn.is_closed() && !self.conn.is_connected()
    }

    /// The VI lets go of its connection id: the Nic forgets it, or, for a
    /// connection [kept on the Nic](Self::kept_on_nic), forgets only the VI.
    fn leave(&self, net: &NetNic) {
        if self.kept_on_nic() {
            net.forget_vi(self.id);
        } else {
            net.unregister(self.id);
        }
    }

    /// Hands a frame from the joined connection's own medium to its
    /// engine. Only the peer's connection sends there, and only its own
    /// frames: anything else is a late frame of an earlier connection.
    fn input_joined(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        nic: &NetNic,
        from: Addr,
        bytes: &[u8],
        clock: &mut Clock,
    ) {
        match nic.parse(bytes) {
            Ok((dst, src, repr)) if dst == self.id => self.input(vi, q, from, src, &repr, clock),
            _ => {
                nic.malformed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Hands the engine every receive descriptor posted before it existed.
    pub(super) fn adopt_recvs(&mut self, q: &mut Queues) {
        for e in q.rq.iter_mut() {
            if e.state == EntryState::Done {
                continue;
            }
            if let Ok(rsn) = self.conn.post_recv(e.total.min(u32::MAX as u64) as u32) {
                e.id = rsn;
            }
        }
    }
}

impl NetVi {
    /// Up to a batch of the engine's frames, built in `tx` and handed to
    /// `medium` in one call. Returns how many frames there were.
    fn send_copied(
        &mut self,
        medium: &dyn Medium,
        clock: &mut Clock,
        mem: &mut ViMem<'_>,
    ) -> usize {
        let frame = self.tx.len() / TX_BATCH;
        self.tx_lens.clear();
        // Large payloads stay in registered memory for the kernel to
        // gather, where the medium can and the engine writes no checksum
        // over the frame (it would read the payload from the frame).
        mem.lend = medium.caps().gathers && self.conn.peer_attrs().is_some_and(|a| a.intact);
        mem.n_lent = 0;
        while self.tx_lens.len() < TX_BATCH {
            // After a frame, a few loads say whether another may follow,
            // where the engine's own look takes its every step (an
            // answer's second call built nothing: some 150 instructions).
            if !self.tx_lens.is_empty() && !self.conn.may_transmit(clock.at_least()) {
                break;
            }
            let at = self.tx_lens.len() * frame;
            match self
                .conn
                .poll_transmit_with(clock, &mut self.tx[at..at + frame], mem)
            {
                Some(n) => self.tx_lens.push(n),
                None => break,
            }
        }
        mem.lend = false;
        let k = self.tx_lens.len();
        if mem.n_lent > 0 {
            uvia_trace::mark!(ProtoBuilt);
            self.send_gathered(medium, mem.lent(), frame);
        } else if k > 0 {
            uvia_trace::mark!(ProtoBuilt);
            // Only the `k` frames built are written: a batch's worth of
            // addresses and slices (some 1.8 KB) written on every send was
            // a tenth of a ping-pong's path through the library.
            let mut frames = [const { MaybeUninit::<OutFrame<'_>>::uninit() }; TX_BATCH];
            for (slot, (i, &n)) in frames.iter_mut().zip(self.tx_lens.iter().enumerate()) {
                slot.write(OutFrame {
                    to: self.peer,
                    bytes: &self.tx[i * frame..i * frame + n],
                });
            }
            // SAFETY: the first `k` slots were written just above (`tx_lens`
            // has `k` entries, at most TX_BATCH), and an `OutFrame` has no
            // destructor to skip.
            let frames =
                unsafe { std::slice::from_raw_parts(frames.as_ptr().cast::<OutFrame<'_>>(), k) };
            let _ = medium.send(frames);
        }
        k
    }

    /// Sends the `tx_lens` frames just built (`frame` bytes apart in `tx`),
    /// the payloads `lent` gathered from where they lie. The engine writes
    /// a data frame's payload last; a lent payload that would not end its
    /// frame is copied into it instead, so a frame never goes short.
    fn send_gathered(&mut self, medium: &dyn Medium, lent: &[Lent], frame: usize) {
        let mut tails: [Option<(usize, &[u8])>; TX_BATCH] = [None; TX_BATCH];
        let base = self.tx.as_ptr() as usize;
        for l in lent {
            let off = l.at as usize - base;
            let i = off / frame;
            // SAFETY: `l.src` is registered memory of a posted send (or an
            // RDMA read's source, checked), readable for `l.len` bytes; it
            // stays posted (or registered, unless the program breaks the
            // contract) while the VI's lock is held, through the send below.
            let src = unsafe { std::slice::from_raw_parts(l.src, l.len) };
            match self.tx_lens.get(i) {
                Some(&n) if off + l.len == i * frame + n => tails[i] = Some((off - i * frame, src)),
                _ => self.tx[off..off + l.len].copy_from_slice(src),
            }
        }
        let mut frames = [const { MaybeUninit::<GatherFrame<'_>>::uninit() }; TX_BATCH];
        for (i, &n) in self.tx_lens.iter().enumerate() {
            let bytes = &self.tx[i * frame..i * frame + n];
            let (head, tail) = match tails[i] {
                Some((head, tail)) => (&bytes[..head], tail),
                None => (bytes, &[][..]),
            };
            frames[i].write(GatherFrame {
                to: self.peer,
                head,
                tail,
            });
        }
        // SAFETY: the first `tx_lens.len()` slots were written above.
        let frames = unsafe {
            std::slice::from_raw_parts(
                frames.as_ptr().cast::<GatherFrame<'_>>(),
                self.tx_lens.len(),
            )
        };
        let _ = medium.send_gathered(frames);
    }

    /// Up to a batch of the engine's frames, each built straight in the
    /// transmit buffer `medium` lends (one copy of the payload, from
    /// registered memory to where the kernel or device takes it).
    fn send_built(&mut self, medium: &dyn Medium, clock: &mut Clock, mem: &mut ViMem<'_>) -> usize {
        let conn = &mut self.conn;
        let mut build = |room: &mut [u8]| {
            let n = conn.poll_transmit_with(clock, room, mem);
            if n.is_some() {
                uvia_trace::mark!(ProtoBuilt);
            }
            n
        };
        medium
            .send_built(self.peer, TX_BATCH, &mut build)
            .unwrap_or(0)
    }
}

/// Memory of a VI whose descriptors are all gone: nothing to read or write.
pub(super) struct NoMemory;

impl Memory for NoMemory {
    fn read_send(&mut self, _: u32, _: u32, buf: &mut [u8]) {
        buf.fill(0);
    }
    fn write_recv(&mut self, _: u32, _: u32, _: &[u8]) -> bool {
        false
    }
    fn write_read(&mut self, _: u32, _: u32, _: &[u8]) {}
    fn check_rdma(&mut self, _: u32, _: u64, _: u32, _: bool) -> Result<(), NakCode> {
        Err(NakCode::Protection)
    }
    fn rdma_write(&mut self, _: u32, _: u64, _: &[u8]) -> Result<(), NakCode> {
        Err(NakCode::Protection)
    }
    fn rdma_read(&mut self, _: u32, _: u64, buf: &mut [u8]) {
        buf.fill(0);
    }
}

/// The engine's view of a VI's descriptors and of the Nic's registered
/// memory.
pub(super) struct ViMem<'a> {
    /// The VI's messages sent by copy, when it has any: read in place of
    /// a descriptor's memory.
    copies: Option<&'a VecDeque<Copied>>,
    regions: &'a RegionTable,
    attrs: &'a ViAttributes,
    sq: &'a SlotQueue,
    rq: &'a SlotQueue,
    /// Payloads of [`LEND_FROM`] bytes or more that lie in one piece are
    /// noted in `lent` instead of copied into the frame (the medium gathers
    /// them): set while frames are built for a medium that gathers.
    lend: bool,
    lent: [MaybeUninit<Lent>; TX_BATCH],
    n_lent: usize,
}

/// Most frames placed by one receive ([`NetVi::recv_placed`]).
const PLACES: usize = 16;

/// The frames a placed receive expects, and their places.
struct Places {
    n: usize,
    exp: [Option<Expected>; PLACES],
    at: [Placement; PLACES],
}

// SAFETY: the places are read only by the poll that wrote them, under the
// VI's lock (`poll_own`); between polls they are stale and never followed.
unsafe impl Send for Places {}

impl Default for Places {
    fn default() -> Places {
        let none = Placement {
            head: 0,
            at: std::ptr::null_mut(),
            len: 0,
        };
        Places {
            n: 0,
            exp: [None; PLACES],
            at: [none; PLACES],
        }
    }
}

/// A payload left where it lies: the `len` bytes at `src` belong at `at`,
/// the end of a frame in the transmit buffer.
#[derive(Clone, Copy)]
struct Lent {
    at: *const u8,
    src: *const u8,
    len: usize,
}

/// Least payload left in place for the medium to gather rather than copied
/// into its frame: below it a copy costs less than the kernel's second I/O
/// vector.
const LEND_FROM: usize = 4096;

impl<'a> ViMem<'a> {
    fn new(vi: &'a Vi, q: &'a Queues, copies: Option<&'a VecDeque<Copied>>) -> ViMem<'a> {
        ViMem {
            copies,
            regions: &vi.s.nic.regions,
            attrs: &q.attrs,
            sq: &q.sq,
            rq: &q.rq,
            lend: false,
            lent: [const { MaybeUninit::uninit() }; TX_BATCH],
            n_lent: 0,
        }
    }

    /// Notes `src..src + buf.len()` as the payload that belongs in `buf`
    /// if payloads are being lent and this one is large enough; false if
    /// the caller must copy it.
    fn lend(&mut self, buf: &[u8], src: *const u8) -> bool {
        if !self.lend || buf.len() < LEND_FROM || self.n_lent == TX_BATCH {
            return false;
        }
        self.lent[self.n_lent].write(Lent {
            at: buf.as_ptr(),
            src,
            len: buf.len(),
        });
        self.n_lent += 1;
        true
    }

    /// Where the payload of the frame `exp` names belongs, if in one piece
    /// of memory still posted (or, for a remote write, registered and
    /// open to the peer).
    fn place(&self, exp: &Expected) -> Option<*mut u8> {
        let len = exp.len as usize;
        let posted = |q: &'a SlotQueue, id: u32, offset: u32| {
            let e = entry(q, id)
                .filter(|e| e.state != EntryState::Done && e.still_registered(self.regions))?;
            one_piece(e, offset as usize, len).map(|p| p as *mut u8)
        };
        match exp.place {
            Place::Recv { rsn, offset } => posted(self.rq, rsn, offset),
            Place::Read { msn, offset } => posted(self.sq, msn, offset),
            Place::Write { rkey, addr } => {
                check(self.regions, self.attrs, rkey, addr, len as u64, true)
                    .ok()
                    .map(|_| addr as *mut u8)
            }
        }
    }

    /// The payloads noted since lending was turned on, in the order their
    /// frames were built.
    fn lent(&self) -> &[Lent] {
        // SAFETY: the first `n_lent` entries were written by `lend`.
        unsafe { std::slice::from_raw_parts(self.lent.as_ptr().cast::<Lent>(), self.n_lent) }
    }
}

/// Where the entry's bytes `offset..offset + len` lie, if in one range
/// that holds them all (a range shorter than that is not enough: a
/// receive placed there would run past it).
fn one_piece(e: &Posted, offset: usize, len: usize) -> Option<*const u8> {
    let mut at = None;
    let mut pieces = 0;
    self::pieces(e, offset, len, |p, _, n| {
        at = Some(p as *const u8).filter(|_| n == len);
        pieces += 1;
    });
    at.filter(|_| pieces == 1)
}

/// The copied message `msn`, if it is one. Copies are taken only while no
/// descriptor is on the send queue, so their numbers are consecutive but
/// where a descriptor's message came between two of them: the position
/// the number gives is tried first, then the rest.
fn copied(copies: &VecDeque<Copied>, msn: u32) -> Option<&Copied> {
    let first = copies.front()?.msn;
    let i = msn.wrapping_sub(first) as usize;
    match copies.get(i) {
        Some(c) if c.msn == msn => Some(c),
        _ => copies.iter().find(|c| c.msn == msn),
    }
}

/// The entry of `q` whose id is `id`: ids are consecutive from the front.
fn entry(q: &SlotQueue, id: u32) -> Option<&Posted> {
    let first = q.front()?.id;
    let i = id.wrapping_sub(first) as usize;
    (i < q.len()).then(|| &q[i])
}

/// Calls `f(range pointer, position in the caller's buffer, n)` for each
/// piece of the entry's ranges that covers `len` bytes from `offset`.
fn pieces(e: &Posted, mut offset: usize, len: usize, mut f: impl FnMut(*mut u8, usize, usize)) {
    let mut done = 0;
    for r in e.ranges() {
        if done == len {
            break;
        }
        if offset >= r.len {
            offset -= r.len;
            continue;
        }
        let n = (r.len - offset).min(len - done);
        // SAFETY (of the pointer arithmetic): `offset < r.len`.
        f(unsafe { r.ptr.add(offset) }, done, n);
        done += n;
        offset = 0;
    }
}

/// Copies the entry's bytes at `offset` into `buf`.
fn gather_at(e: &Posted, offset: usize, buf: &mut [u8]) {
    let dst = buf.as_mut_ptr();
    pieces(e, offset, buf.len(), |p, at, n| {
        // SAFETY: `p..p+n` lies in registered memory checked at post (and
        // re-checked by the caller with `still_registered`); `at + n` is
        // within `buf`.
        unsafe { std::ptr::copy_nonoverlapping(p, dst.add(at), n) }
    });
}

/// Copies `data` into the entry's ranges at `offset`: nothing where it
/// already lies there (a payload received in place).
fn scatter_at(e: &Posted, offset: usize, data: &[u8]) {
    pieces(e, offset, data.len(), |p, at, n| {
        // SAFETY: as in `gather_at`, the other way; a range either is
        // where the data lies or does not overlap it.
        unsafe {
            let src = data.as_ptr().add(at);
            if !std::ptr::eq(src, p) {
                std::ptr::copy_nonoverlapping(src, p, n)
            }
        }
    });
}

impl Memory for ViMem<'_> {
    fn read_send(&mut self, msn: u32, offset: u32, buf: &mut [u8]) {
        if let Some(c) = self.copies.and_then(|c| copied(c, msn)) {
            let at = offset as usize;
            buf.copy_from_slice(&c.bytes[at..at + buf.len()]);
            return;
        }
        match entry(self.sq, msn) {
            Some(e) if e.still_registered(self.regions) => {
                let lent = self.lend
                    && one_piece(e, offset as usize, buf.len()).is_some_and(|p| self.lend(buf, p));
                if !lent {
                    gather_at(e, offset as usize, buf)
                }
            }
            // Deregistered under a posted descriptor: the caller broke the
            // contract; send zeros rather than touch freed memory.
            _ => buf.fill(0),
        }
    }

    fn write_recv(&mut self, rsn: u32, offset: u32, data: &[u8]) -> bool {
        match entry(self.rq, rsn) {
            Some(e) if e.still_registered(self.regions) => {
                scatter_at(e, offset as usize, data);
                true
            }
            // Deregistered under a posted descriptor: not written, and the
            // descriptor completes with a protection error.
            _ => false,
        }
    }

    fn write_read(&mut self, msn: u32, offset: u32, data: &[u8]) {
        if let Some(e) = entry(self.sq, msn) {
            if e.still_registered(self.regions) {
                scatter_at(e, offset as usize, data);
            }
        }
    }

    fn check_rdma(&mut self, rkey: u32, raddr: u64, len: u32, write: bool) -> Result<(), NakCode> {
        check(self.regions, self.attrs, rkey, raddr, len as u64, write)
    }

    fn rdma_write(&mut self, rkey: u32, raddr: u64, data: &[u8]) -> Result<(), NakCode> {
        check(
            self.regions,
            self.attrs,
            rkey,
            raddr,
            data.len() as u64,
            true,
        )?;
        // Nothing to copy where the payload was received in place.
        if data.as_ptr() != raddr as *const u8 {
            // SAFETY: the range was just checked against this Nic's
            // registered regions, the VI's tag and the enable bits.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), raddr as *mut u8, data.len()) };
        }
        Ok(())
    }

    fn rdma_read(&mut self, rkey: u32, raddr: u64, buf: &mut [u8]) {
        if check(
            self.regions,
            self.attrs,
            rkey,
            raddr,
            buf.len() as u64,
            false,
        )
        .is_err()
        {
            // Deregistered since the request was checked: zeros, not freed memory.
            buf.fill(0);
            return;
        }
        if self.lend(buf, raddr as *const u8) {
            return;
        }
        // SAFETY: as in `rdma_write`, for reading.
        unsafe { std::ptr::copy_nonoverlapping(raddr as *const u8, buf.as_mut_ptr(), buf.len()) };
    }
}

fn check(
    regions: &RegionTable,
    attrs: &ViAttributes,
    rkey: u32,
    raddr: u64,
    len: u64,
    write: bool,
) -> Result<(), NakCode> {
    check_rdma(regions, attrs, MemHandle(rkey), raddr, len, write).map_err(|_| NakCode::Protection)
}

fn outcome_bits(o: Outcome) -> u32 {
    match o {
        Outcome::Ok => 0,
        Outcome::Length => status::LENGTH_ERROR,
        Outcome::Protection => status::PROTECTION_ERROR,
        Outcome::Remote(NakCode::Protection) | Outcome::Remote(NakCode::Operation) => {
            status::RDMA_PROT_ERROR
        }
        Outcome::Remote(_) => status::REMOTE_DESC_ERROR,
        Outcome::Transport => status::TRANSPORT_ERROR,
        Outcome::Flushed => status::DESC_FLUSHED_ERROR,
    }
}

impl TransportOps for NetVi {
    type Sleep = Sleep;
    const BIASED: bool = false;

    #[inline(always)]
    fn poll(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        queue: Queue,
        owned: bool,
    ) -> Option<NonNull<Descriptor>> {
        self.progress(vi, q);
        vi.pop(q, queue, owned)
    }

    /// Frames wake a CQ's waiter through the medium's descriptor, which
    /// stays readable while a frame waits there: nothing to arm and nothing
    /// to read first (a look would cost a system call that finds nothing
    /// before most sleeps). What a burst of posts deferred goes now: a
    /// sleeping waiter would hold it back.
    fn arm_eventfd(&mut self, vi: &Vi, q: &mut Queues) -> bool {
        self.deferred > 0 && self.output(vi, q, Instant::now())
    }

    /// The VI is gone: tell the peer and forget the connection id (the
    /// Nic may keep the connection while it closes, [`NetVi::keep_closing`]).
    fn close(&mut self, nic: &NicShared) {
        let Some(net) = NetNic::of(nic) else {
            return;
        };
        if self.conn.is_connected() {
            // Acknowledge what arrived, then say goodbye. Every descriptor
            // is gone, so the engine has no payload to ask for.
            let now = Instant::now();
            self.conn.close(now);
            let mut buf = [0u8; 256];
            for _ in 0..4 {
                let Some(len) = self.conn.poll_transmit(now, &mut buf, &mut NoMemory) else {
                    break;
                };
                let f = [OutFrame {
                    to: self.peer,
                    bytes: &buf[..len],
                }];
                let _ = match &self.own {
                    Some(m) => m.send(&f),
                    None => net.medium.send(&f),
                };
            }
        }
        self.stop_sharing(net, false);
        self.leave(net);
    }

    /// The descriptor a CQ waiter polls for this VI's frames.
    fn wake_fd(&self, nic: &NicShared) -> Option<RawFd> {
        match (&self.own, NetNic::of(nic)) {
            (Some(m), _) => Some(m.fd()),
            (None, Some(n)) => Some(n.medium.fd()),
            (None, None) => None,
        }
    }

    /// What a sleeping waiter of this VI waits on.
    fn arm(&mut self, _nic: &NicShared) -> Sleep {
        Sleep(self.own.clone())
    }

    /// Moves a network VI forward: reads the medium, runs timers, sends.
    fn progress(&mut self, vi: &Vi, q: &mut Queues) -> bool {
        let Some(nic) = NetNic::of(&vi.s.nic) else {
            return false;
        };
        // An acknowledgement the last poll's data carried, left for after
        // the application's answer (see `Conn::settle`), is applied by the
        // next poll if no answer came between: its completions go now.
        let mut settled = false;
        if self.conn.unsettled() || self.untold {
            self.settle(Instant::now());
            settled = self.events(vi, q);
        }
        // When frames arrived, if any: the clock they were taken in by.
        let arrived = match (self.own.is_some(), self.joined) {
            // Requests and other VIs' handshakes reach the Nic's medium:
            // looked at with the timers, below.
            (true, true) => self.poll_own(vi, q, nic),
            // Connecting: the answer comes to the own medium, a peer-to-peer
            // side's request to the Nic's.
            (true, false) => {
                let own = self.poll_own(vi, q, nic);
                let by_nic = nic.poll(Some((vi, &mut *q, &mut *self)));
                own.or(by_nic.map(Clock::at))
            }
            (false, _) => nic.poll(Some((vi, &mut *q, &mut *self))).map(Clock::at),
        };
        let got = arrived.is_some();
        // The timers are looked at every few polls, arrivals or not: they
        // are tens of microseconds apart at the least, and a look (a clock
        // read on an empty poll, the deadlines compared) kept off most
        // messages' path is that much less latency.
        self.idle = self.idle.wrapping_add(1);
        let timers = self.idle.is_multiple_of(TIMER_EVERY) || (!got && self.ack_due());
        if !got && self.deferred == 0 && !timers {
            return settled;
        }
        // The time frames arrived, if the engine read it, is recent enough
        // for the timers: a second clock read would sit on the message's
        // path.
        let mut clock = arrived.unwrap_or_else(|| Clock::since(self.last_tx, Instant::now));
        let mut moved = got || settled;
        if timers {
            let now = clock.now();
            if self.own.is_some() && self.joined && self.nic_look_at.is_none_or(|t| now >= t) {
                self.nic_look_at = Some(now + NIC_LOOK_EVERY);
                moved |= nic.poll(Some((vi, &mut *q, &mut *self))).is_some();
            }
            if self.conn.poll_timeout().is_some_and(|t| t <= now) {
                self.timers_due(now, nic);
                moved = true;
            }
            nic.sweep(now, self.id);
        }
        // Whether anything is to go needs the time only for a keep-alive:
        // where the frames were taken in without a clock read, the last
        // transmission's time serves (a keep-alive it misses goes at the
        // timer round).
        if got && !timers && self.deferred == 0 && !self.conn.may_transmit(clock.at_least()) {
            // Frames came and nothing is to go: the output would only note
            // the engine's next deadline, its earliest timer looked up and
            // two clock subtractions on the way to the application (some
            // 250 instructions, 25-60 ns of a udp message measured). The
            // Nic's book takes the VI as due at once instead, and the exact
            // deadline is noted by the next output (a send, a timer round,
            // a sweep's).
            nic.deadlines.note_due(self.id, &mut self.noted);
            return moved;
        }
        moved |= self.output(vi, q, clock.now());
        moved
    }

    /// Runs the engine's timers now and sends what they produced: for a
    /// waiter that has slept, whose few polls would otherwise leave the
    /// timers to the every-few-polls look.
    fn run_timers(&mut self, vi: &Vi, q: &mut Queues) {
        let now = Instant::now();
        let Some(nic) = NetNic::of(&vi.s.nic) else {
            return;
        };
        if self.conn.poll_timeout().is_some_and(|t| t <= now) {
            self.timers_due(now, nic);
        }
        // The sweep first: it resets the Nic's next deadline, which this
        // VI's output then notes its own in.
        nic.sweep(now, self.id);
        self.output(vi, q, now);
    }

    /// Posts a send-queue descriptor and sends what can go now.
    ///
    /// # Safety
    /// As for [`Vi::post_send_raw`].
    unsafe fn post_send(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        d: NonNull<Descriptor>,
        owned: bool,
    ) -> Result<(), PostError> {
        let attrs = q.attrs;
        let len = q.sq.len();
        let Some(slot) = q.sq.next_free() else {
            return Err(PostError::QueueFull("send", len));
        };
        // SAFETY: forwarded from the caller.
        unsafe { prepare(&vi.s.nic, &attrs, slot, d, owned, Queue::Send)? };
        let op = SendOp {
            kind: match slot.op {
                Op::SendRecv => SendKind::Send,
                Op::RdmaWrite => SendKind::RdmaWrite {
                    raddr: slot.remote.0,
                    rkey: slot.remote.1 .0,
                },
                Op::RdmaRead => SendKind::RdmaRead {
                    raddr: slot.remote.0,
                    rkey: slot.remote.1 .0,
                },
            },
            len: slot.total as u32,
            imm: slot.imm,
        };
        let msn = self.conn.post_send(op).map_err(|e| match e {
            uvia_proto::PostError::State => PostError::NotConnected(vi.state()),
            uvia_proto::PostError::TooLong { len, max } => PostError::TooLong {
                len: len as u64,
                max,
            },
            uvia_proto::PostError::ReadUnavailable => {
                PostError::NotEnabled("RDMA read (the peer does not allow it)")
            }
            uvia_proto::PostError::WriteUnavailable => {
                PostError::NotEnabled("RDMA write (the peer does not allow it)")
            }
        })?;
        uvia_trace::mark!(ViPosted);
        slot.id = msn;
        slot.state = EntryState::InFlight;
        q.sq.commit();
        q.sq_sent = q.sq.len();
        self.posted(vi, q);
        Ok(())
    }

    /// Sends a message by copy: its bytes go into the VI's own storage
    /// and the engine frames them from there (again, if a frame is lost),
    /// until the peer acknowledges it. No descriptor and no completion: a
    /// failure shows as the connection's. Refused (the caller posts a
    /// descriptor) above [`COPY_MAX`] bytes, with [`COPIES_IN_FLIGHT`]
    /// copies unacknowledged, or while a descriptor is on the send queue:
    /// a send-queue entry is found by its message's number counted from
    /// the first entry's, so the queue's messages stay consecutive.
    fn send_copy(&mut self, vi: &Vi, q: &mut Queues, bytes: &[&[u8]], imm: Option<u32>) -> bool {
        let len: usize = bytes.iter().map(|b| b.len()).sum();
        if len > COPY_MAX || !q.sq.is_empty() || self.copies.len() >= COPIES_IN_FLIGHT {
            return false;
        }
        let op = SendOp {
            kind: SendKind::Send,
            len: len as u32,
            imm,
        };
        // Refused by the engine (not connected, too long for the peer): the
        // caller's post reports why.
        let Ok(msn) = self.conn.post_send(op) else {
            return false;
        };
        let mut c = Copied {
            msn,
            bytes: [0; COPY_MAX],
        };
        let mut at = 0;
        for b in bytes {
            c.bytes[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        }
        self.copies.push_back(c);
        uvia_trace::mark!(ViPosted);
        self.posted(vi, q);
        true
    }

    /// Tells the engine of a receive descriptor just queued at the back.
    fn posted_recv(&mut self, q: &mut Queues) {
        let i = q.rq.len() - 1;
        let cap = q.rq[i].total.min(u32::MAX as u64) as u32;
        if let Ok(rsn) = self.conn.post_recv(cap) {
            q.rq[i].id = rsn;
        }
    }

    /// Ends the connection (VipDisconnect): the peer is told; the caller
    /// flushes the queues.
    fn disconnect(&mut self, vi: &Vi, q: &mut Queues) {
        let now = Instant::now();
        self.conn.close(now);
        self.output(vi, q, now);
        if let Some(nic) = NetNic::of(&vi.s.nic) {
            self.leave(nic);
        }
    }
}

/// Why a connection ended, in the core's words.
fn broken(ev: Event) -> Option<Broken> {
    Some(match ev {
        Event::Failed(FailReason::PeerSilent) => Broken::PeerSilent,
        Event::Failed(FailReason::RetriesExhausted) => Broken::RetriesExhausted,
        Event::Failed(FailReason::RnrExhausted) => Broken::ReceiverNotReady,
        Event::Failed(FailReason::Remote(_)) => Broken::PeerReported,
        Event::Failed(FailReason::Local(_)) => Broken::PeerMalformed,
        Event::Disconnected => Broken::PeerDisconnected,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use crate::provider::Transport;
    use crate::vi::tests::connected_pair_with;
    use crate::{Descriptor, Nic, Vi};
    use std::time::{Duration, Instant};

    /// The next receive `vi` completes, polled for (2 s at most).
    fn arrival(vi: &Vi) -> Box<Descriptor> {
        let start = Instant::now();
        loop {
            if let Some(d) = vi.recv_done() {
                return d;
            }
            assert!(start.elapsed() < Duration::from_secs(2), "never arrived");
        }
    }

    fn retransmitted(vi: &Vi) -> u64 {
        match &vi.lock().t {
            Transport::Net(t) => t.conn.retransmitted(),
            _ => panic!("a network VI"),
        }
    }

    /// A VI that takes a message in by a poll sends nothing then (its
    /// acknowledgement waits to go with an answer, and its next deadline
    /// is worked out later): left alone afterwards, while other VIs of its
    /// Nic are polled, it is acknowledged through their sweeps, and the
    /// sender's send completes before its retransmission timer (20 ms at
    /// first) would send the message again. A thread kept off its core
    /// that long by the machine's load can let the timer run out: the
    /// exchange is made again on new connections, up to three times (with
    /// nothing noted for the VI, every one of them sends again).
    #[test]
    fn a_receive_left_alone_is_acknowledged_through_the_nics_other_polls() {
        let nic = Nic::open("udp:127.0.0.1").unwrap();
        let mut tries = Vec::new();
        for _ in 0..3 {
            let (mut p, a) = connected_pair_with(&nic, None);
            let (_q, x) = connected_pair_with(&nic, None);
            a.vi.post_recv(Box::new(Descriptor::recv(&[a.buf.segment(0, 64)])))
                .unwrap();
            p.buf.as_mut_slice()[..8].copy_from_slice(b"left-one");
            p.vi.post_send(Box::new(Descriptor::send(&[p.buf.segment(0, 8)])))
                .unwrap();
            // The datagram is in A's socket: one poll takes it in.
            std::thread::sleep(Duration::from_millis(2));
            assert_eq!(arrival(&a.vi).result(), Ok(8));
            // A is left alone; X (no traffic) and the sender are polled.
            let start = Instant::now();
            let sent = loop {
                assert!(x.vi.recv_done().is_none());
                if let Some(d) = p.vi.send_done() {
                    break d;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "the send never completed"
                );
            };
            assert!(sent.result().is_ok());
            if retransmitted(&p.vi) == 0 {
                return;
            }
            tries.push(start.elapsed());
        }
        panic!("acknowledged only after the message went again, each time: {tries:?} after the receive");
    }

    /// A message nobody answers is acknowledged within a couple of the
    /// receiver's empty polls once its delay has passed (not at the
    /// timers' look every 16): its sender waits on that ack. Ten messages,
    /// each looked for after exactly two empty polls: at the every-16 pace
    /// a few would go unacknowledged.
    #[test]
    fn an_unanswered_message_is_acknowledged_within_two_polls_of_its_delay() {
        let nic = Nic::open("udp:127.0.0.1").unwrap();
        let (p, a) = connected_pair_with(&nic, None);
        let delay = uvia_proto::Config::default().ack_delay;
        let mut late = 0;
        for k in 0..10 {
            a.vi.post_recv(Box::new(Descriptor::recv(&[a.buf.segment(0, 64)])))
                .unwrap();
            p.vi.post_send(Box::new(Descriptor::send(&[p.buf.segment(0, 8)])))
                .unwrap();
            assert_eq!(arrival(&a.vi).result(), Ok(8));
            // The poll after the arrival arms the delayed ack.
            assert!(a.vi.recv_done().is_none());
            std::thread::sleep(delay * 4);
            for _ in 0..2 {
                assert!(a.vi.recv_done().is_none());
            }
            // The ack, if sent, is in P's socket: one poll finds it.
            std::thread::sleep(Duration::from_micros(200));
            match p.vi.send_done() {
                Some(d) => assert_eq!(d.result(), Ok(8)),
                None => {
                    late += 1;
                    let start = Instant::now();
                    while p.vi.send_done().is_none() {
                        assert!(start.elapsed() < Duration::from_secs(2), "message {k}");
                    }
                }
            }
        }
        assert_eq!(late, 0, "messages acknowledged late, of 10");
    }

    /// A frame the Nic's medium brings for a VI whose lock is held, here by
    /// the handing thread itself (a VI's timers sweep the Nic's other VIs
    /// under its lock, and their polls may find its frames: an MPI job's
    /// rank hung so, its connecting thread waiting on its own lock), is
    /// parked rather than waited for; the next poll after the lock is free
    /// hands it over. The frame: the peer's disconnect.
    #[test]
    fn a_frame_for_a_held_vi_waits_for_the_next_poll_not_for_the_lock() {
        use super::super::NetNic;
        use uvia_proto::wire::Repr;
        let nic = Nic::open("udp:127.0.0.1").unwrap();
        let (c, _s) = connected_pair_with(&nic, None);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let vi = c.vi.clone();
        std::thread::spawn(move || {
            let net = NetNic::of(&vi.s.nic).unwrap();
            let repr = Repr::Disconnect { ack: 0, done: 0 };
            let mut bytes = vec![0u8; repr.buffer_len()];
            let held = vi.lock();
            let (id, src, from) = match &held.t {
                Transport::Net(t) => (t.id, t.conn.peer_id(), t.peer),
                _ => panic!("a network VI"),
            };
            repr.emit(&mut bytes, id, src);
            net.hand_to(id, from, src, &repr, &bytes, &mut None, Instant::now());
            let parked = net.parked.lock().len();
            drop(held);
            let _ = done_tx.send(parked);
            net.poll(None);
        });
        let parked = done_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the handing thread waits for the lock it holds");
        assert_eq!(parked, 1, "the frame parked");
        let start = Instant::now();
        while c.vi.state() != crate::ViState::Error {
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "never handed over"
            );
            std::thread::yield_now();
        }
        assert_eq!(c.vi.broken_by(), Some(crate::vi::Broken::PeerDisconnected));
    }
}
