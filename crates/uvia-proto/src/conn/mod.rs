//! One VI connection: handshake, fragmentation and reassembly, RDMA, and
//! VIA's three reliability levels.
//!
//! The caller feeds frames addressed to this connection to
//! [`Conn::handle_frame`], lets time pass with [`Conn::handle_timeout`], and
//! pulls out frames to send ([`Conn::poll_transmit`]), the next deadline
//! ([`Conn::poll_timeout`]) and completions ([`Conn::poll_event`]). Payload
//! bytes never pass through the engine's own buffers: it asks the caller's
//! [`Memory`] to copy them straight between frames and descriptors.

use crate::rtt::RttEstimator;
use crate::seq::{self, SeqWindow};
use crate::wire::{
    self, ack_flags, data_flags, ConnAttrs, DataHeader, NakCode, Op, PrivateData, RejectReason,
    Repr, SackList, DATA_HEADER_LEN, MAX_SACK,
};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use timers::{Timer, TimerTable};

mod timers;

/// VIA's reliability levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    /// At most once, in order; corrupt or incomplete messages are dropped
    /// and counted; nothing is sent twice.
    Unreliable = 0,
    /// Exactly once, in order; a send completes when the peer has it.
    ReliableDelivery = 1,
    /// Exactly once, in order; a send completes when its data is in the
    /// peer's receive buffer and that descriptor is complete.
    ReliableReception = 2,
}

impl Level {
    pub fn from_wire(v: u8) -> Option<Level> {
        Some(match v {
            0 => Level::Unreliable,
            1 => Level::ReliableDelivery,
            2 => Level::ReliableReception,
            _ => return None,
        })
    }

    pub fn is_reliable(self) -> bool {
        self != Level::Unreliable
    }
}

/// What to do when a message arrives for a receive descriptor that is not
/// posted yet (reliable levels only; the unreliable level drops it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RnrPolicy {
    /// VIA's behaviour: the connection breaks, both sides in Error.
    Fail,
    /// Tell the sender to try again after `delay`, at most `limit` times in
    /// a row.
    Retry { delay: Duration, limit: u32 },
}

/// A connection's settings. Both sides should use the same window.
#[derive(Clone, Debug)]
pub struct Config {
    pub level: Level,
    /// Largest frame this side sends or accepts, header included.
    pub max_frame: u32,
    /// Largest message.
    pub max_transfer: u32,
    pub rdma_write: bool,
    pub rdma_read: bool,
    /// Most frames in flight (and the receive window).
    pub window: u32,
    /// Most payload bytes in flight; keep it below the receiver's socket buffer.
    pub window_bytes: u32,
    /// How long an acknowledgement may wait for a frame to ride on.
    pub ack_delay: Duration,
    /// Acknowledge at once after this many unacknowledged frames.
    pub ack_every: u32,
    pub initial_rto: Duration,
    pub min_rto: Duration,
    pub max_rto: Duration,
    /// Retransmission timeouts in a row, without progress, before the
    /// connection breaks.
    pub retry_limit: u32,
    /// Silence from the peer longer than this breaks the connection.
    pub idle_timeout: Duration,
    /// Ping a silent peer this often.
    pub keepalive: Duration,
    pub rnr: RnrPolicy,
    /// Repeat a connection request (or accept, or disconnect) this often.
    pub handshake_retry: Duration,
    /// Give up a connection request after this long.
    pub connect_timeout: Duration,
    /// This side's medium delivers frames intact or not at all (it
    /// checksums them itself): the peer is told it may leave the checksum
    /// of data frames out, and the caller parses what arrives with
    /// [`wire::parse_intact`]. Off by default: the engine's own CRC-32 then
    /// guards every frame.
    pub intact: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            level: Level::ReliableDelivery,
            max_frame: 1472,
            max_transfer: 16 << 20,
            rdma_write: true,
            rdma_read: true,
            window: 256,
            window_bytes: 4 << 20,
            ack_delay: Duration::from_micros(50),
            ack_every: 16,
            initial_rto: Duration::from_millis(20),
            min_rto: Duration::from_millis(1),
            max_rto: Duration::from_millis(500),
            retry_limit: 12,
            idle_timeout: Duration::from_secs(5),
            keepalive: Duration::from_secs(1),
            rnr: RnrPolicy::Fail,
            handshake_retry: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(5),
            intact: false,
        }
    }
}

impl Config {
    fn attrs(&self, initial_psn: u32) -> ConnAttrs {
        ConnAttrs {
            reliability: self.level as u8,
            rdma_write: self.rdma_write,
            rdma_read: self.rdma_read,
            max_frame: self.max_frame,
            max_transfer: self.max_transfer,
            initial_psn,
            intact: self.intact,
        }
    }
}

/// The operation of a posted send-queue descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendKind {
    Send,
    RdmaWrite { raddr: u64, rkey: u32 },
    RdmaRead { raddr: u64, rkey: u32 },
}

/// A send-queue descriptor as the engine sees it: what, how long, and the
/// immediate data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendOp {
    pub kind: SendKind,
    pub len: u32,
    pub imm: Option<u32>,
}

/// Why a post was refused (nothing was queued).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The connection is not established, or has ended.
    #[error("connection is not established")]
    State,
    /// Longer than this side's or the peer's largest message.
    #[error("message of {len} bytes exceeds the largest transfer {max}")]
    TooLong { len: u32, max: u32 },
    /// RDMA read needs a reliable level and a peer that allows it.
    #[error("RDMA read is not available on this connection")]
    ReadUnavailable,
    /// The peer does not allow RDMA write.
    #[error("RDMA write is not enabled by the peer")]
    WriteUnavailable,
}

/// How a descriptor ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// The message did not fit the receive descriptor.
    Length,
    /// The peer refused the operation: its code says why.
    Remote(NakCode),
    /// The connection broke while the descriptor was being carried.
    Transport,
    /// The connection broke before the descriptor was started.
    Flushed,
}

/// Why a connection ended in Error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailReason {
    /// The peer stayed silent past the idle timeout.
    PeerSilent,
    /// Retransmissions ran out.
    RetriesExhausted,
    /// Receiver-not-ready retries ran out.
    RnrExhausted,
    /// The peer reported a fatal error.
    Remote(NakCode),
    /// This side found a fatal error in the peer's traffic.
    Local(NakCode),
}

/// What happened, in the order it happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Connected,
    Rejected(RejectReason),
    ConnectTimedOut,
    /// Send-queue descriptor `msn` completed (in posting order).
    SendDone {
        msn: u32,
        outcome: Outcome,
    },
    /// Receive descriptor `rsn` completed (in posting order). `len` is the
    /// message length (for an RDMA write with immediate data, the length
    /// written); `imm` its immediate data.
    RecvDone {
        rsn: u32,
        len: u32,
        imm: Option<u32>,
        /// True when an RDMA write with immediate data consumed it (not a send).
        remote_write: bool,
        outcome: Outcome,
    },
    /// The peer disconnected.
    Disconnected,
    /// The connection is in Error; every descriptor has been completed.
    Failed(FailReason),
}

/// The caller's memory, as the engine moves bytes through it. The engine
/// has checked lengths against what was posted; RDMA targets are checked
/// here, by the owner of the memory table.
pub trait Memory {
    /// Copies bytes `offset..offset + buf.len()` of send-queue descriptor
    /// `msn` (a send or RDMA write source) into `buf`.
    fn read_send(&mut self, msn: u32, offset: u32, buf: &mut [u8]);
    /// Places received bytes of receive descriptor `rsn` at `offset`.
    fn write_recv(&mut self, rsn: u32, offset: u32, data: &[u8]);
    /// Places read-response bytes into RDMA-read descriptor `msn` at `offset`.
    fn write_read(&mut self, msn: u32, offset: u32, data: &[u8]);
    /// Checks that the peer may access `[raddr, raddr + len)` under `rkey`
    /// (`write`: for RDMA write, else read).
    fn check_rdma(&mut self, rkey: u32, raddr: u64, len: u32, write: bool) -> Result<(), NakCode>;
    /// RDMA write target: stores `data` at `raddr`. `check_rdma` passed for
    /// the whole message when its first frame came; the memory is checked
    /// again here because it may have been deregistered since.
    fn rdma_write(&mut self, rkey: u32, raddr: u64, data: &[u8]) -> Result<(), NakCode>;
    /// RDMA read target: loads bytes at `raddr` into `buf`.
    fn rdma_read(&mut self, rkey: u32, raddr: u64, buf: &mut [u8]);
}

/// Counters of what happened on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub frames_sent: u64,
    pub frames_received: u64,
    pub retransmitted: u64,
    pub duplicates: u64,
    /// Frames outside the receive window, from a stale connection, or out of place.
    pub dropped: u64,
    /// Unreliable messages dropped for a missing or incomplete piece.
    pub messages_dropped: u64,
    pub rto_expired: u64,
    /// Tail-loss probes: the newest frame sent again because no ack came.
    pub probes: u64,
    pub rnr_naks: u64,
    pub acks_sent: u64,
}

/// Disconnects a closing side sends before it stops waiting for an answer.
const CLOSE_TRIES: u32 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Client: the request goes out until an answer comes (each time
    /// [`Timer::Handshake`] is due), or [`Timer::ConnectTimeout`] expires.
    Connecting,
    /// Server: connected; the accept goes out until the client confirms
    /// (at once, then each time [`Timer::Handshake`] expires).
    Accepting,
    Connected,
    /// Our disconnect goes out until it is answered (a few tries, one
    /// each time [`Timer::Close`] is due).
    Closing {
        tries: u32,
    },
    Closed,
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OutKind {
    Send,
    Write {
        raddr: u64,
        rkey: u32,
    },
    ReadRequest {
        raddr: u64,
        rkey: u32,
    },
    /// Bytes of our memory the peer asked for with its read `msn`.
    ReadResponse {
        raddr: u64,
        rkey: u32,
    },
}

/// A message going out.
#[derive(Clone, Debug)]
struct OutMsg {
    /// Our msn, or for a read response the reader's.
    msn: u32,
    kind: OutKind,
    /// Bytes carried (a read request carries none; `len` is the read's size).
    len: u32,
    imm: Option<u32>,
    rsn: Option<u32>,
    /// Bytes put in frames so far.
    framed: u32,
    /// Frames sent but not yet acknowledged.
    unacked: u32,
    /// Read responses arrived (read requests).
    read_got: u32,
    /// Frames sent at least once.
    started: bool,
}

impl OutMsg {
    fn payload_len(&self) -> u32 {
        match self.kind {
            OutKind::ReadRequest { .. } => 0,
            _ => self.len,
        }
    }

    fn fully_framed(&self) -> bool {
        self.started && self.framed >= self.payload_len()
    }

    fn op(&self) -> Op {
        match self.kind {
            OutKind::Send => Op::Send,
            OutKind::Write { .. } => Op::RdmaWrite,
            OutKind::ReadRequest { .. } => Op::ReadRequest,
            OutKind::ReadResponse { .. } => Op::ReadResponse,
        }
    }
}

/// A frame in flight: enough to build it again.
#[derive(Clone, Copy, Debug)]
struct Sent {
    response: bool,
    msn: u32,
    offset: u32,
    len: u32,
    sent_at: Instant,
    /// Place of its latest transmission among all of this side's
    /// transmissions: "sent after" for time-based loss detection, exact
    /// even when many frames leave at the same instant.
    order: u64,
    transmissions: u16,
    acked: bool,
    /// Declared lost: to be sent again.
    lost: bool,
    /// Its latest transmission is a tail-loss probe.
    probe: bool,
}

/// A message coming in.
#[derive(Clone, Copy, Debug)]
struct InMsg {
    op: Op,
    total: u32,
    got: u32,
    imm: Option<u32>,
    /// The receive descriptor it fills (unreliable binds on arrival).
    bound: Option<u32>,
}

/// One VI connection's transport state.
pub struct Conn {
    cfg: Config,
    state: State,
    local_id: u32,
    peer_id: u32,
    peer: Option<ConnAttrs>,
    discriminator: Vec<u8>,
    /// What this side's request or accept carries for the peer.
    private: PrivateData,
    /// What the peer's accept, reject or peer request carried.
    peer_private: PrivateData,
    /// Payload bytes per data frame.
    frag: u32,
    events: VecDeque<Event>,
    stats: Stats,
    /// When a frame last came from the peer ([`Timer::Idle`] and
    /// [`Timer::KeepAlive`] count from it).
    last_rx: Instant,
    /// When our last keep-alive went.
    last_ping: Option<Instant>,

    // Sending.
    msgs: VecDeque<OutMsg>,
    /// Index in `msgs` of the first message not fully framed.
    frame_cursor: usize,
    responses: VecDeque<OutMsg>,
    next_msn: u32,
    next_rsn: u32,
    /// Oldest unacknowledged psn; `inflight[0]` is its record.
    snd_una: u32,
    snd_nxt: u32,
    inflight: VecDeque<Sent>,
    inflight_bytes: u32,
    /// Frames marked lost, waiting to go again.
    lost: u32,
    largest_acked: Option<u32>,
    rtt: RttEstimator,
    /// Every deadline: the handshake's and the disconnect's retries, the
    /// connect, idle and keep-alive timeouts, retransmission, loss, probe,
    /// receiver-not-ready and delayed ack.
    timers: TimerTable,
    /// The most recently sent frame acked so far: its transmission order
    /// and the round trip its ack measured.
    rack: Option<(u64, Duration)>,
    /// Transmissions of data frames so far (the next one's `order`).
    sent_order: u64,
    /// Probes sent since the last progress (one per tail).
    probes: u32,
    timeouts_in_a_row: u32,
    /// Peer's count of our messages completed at its side.
    peer_done: u32,
    rnr_in_a_row: u32,

    // Receiving.
    rcv: SeqWindow,
    in_msgs: VecDeque<Option<InMsg>>,
    /// The peer's msn of `in_msgs[0]`; also the count of its messages
    /// completed here.
    in_base: u32,
    /// Capacities of posted receive descriptors, from `recv_base`.
    recvs: VecDeque<u32>,
    recv_base: u32,
    /// Receive descriptors the unreliable level has bound (from `recv_base`).
    recvs_bound: u32,
    ack_pending: u32,
    /// The psn of the newest data frame taken in: its range leads the
    /// selective acks.
    newest_rx: Option<u32>,
    /// Payload bytes received since the last ack.
    ack_bytes: u32,
    ack_now: bool,
    /// The peer pinged: answer even on the unreliable level.
    pong_due: bool,
    /// The psn we told the peer we were not ready for.
    rnr_nak_at: Option<u32>,
    nak: Option<(NakCode, u32)>,
    confirm_due: bool,
    disconnect_ack_due: bool,
    /// The peer sent data after we closed: say it again.
    disconnect_due: bool,
    /// Peer-to-peer: requests go out as `PeerRequest`.
    peer_mode: bool,
}

impl Conn {
    fn new(now: Instant, cfg: Config, local_id: u32, initial_psn: u32) -> Conn {
        let rtt = RttEstimator::new(cfg.initial_rto, cfg.min_rto, cfg.max_rto);
        Conn {
            rcv: SeqWindow::new(0, cfg.window),
            cfg,
            state: State::Closed,
            local_id,
            peer_id: 0,
            peer: None,
            discriminator: Vec::new(),
            private: PrivateData::EMPTY,
            peer_private: PrivateData::EMPTY,
            frag: 0,
            events: VecDeque::with_capacity(64),
            stats: Stats::default(),
            last_rx: now,
            last_ping: None,
            msgs: VecDeque::new(),
            frame_cursor: 0,
            responses: VecDeque::new(),
            next_msn: 0,
            next_rsn: 0,
            snd_una: initial_psn,
            snd_nxt: initial_psn,
            inflight: VecDeque::new(),
            inflight_bytes: 0,
            lost: 0,
            largest_acked: None,
            rtt,
            timers: TimerTable::default(),
            rack: None,
            sent_order: 0,
            probes: 0,
            timeouts_in_a_row: 0,
            peer_done: 0,
            rnr_in_a_row: 0,
            in_msgs: VecDeque::new(),
            in_base: 0,
            recvs: VecDeque::new(),
            recv_base: 0,
            recvs_bound: 0,
            ack_pending: 0,
            newest_rx: None,
            ack_bytes: 0,
            ack_now: false,
            pong_due: false,
            rnr_nak_at: None,
            nak: None,
            confirm_due: false,
            disconnect_ack_due: false,
            disconnect_due: false,
            peer_mode: false,
        }
    }

    /// A client connection: asks `discriminator` at the peer for a
    /// connection. Frames go to the server's address with destination id 0.
    pub fn connect(
        now: Instant,
        cfg: Config,
        local_id: u32,
        initial_psn: u32,
        discriminator: &[u8],
    ) -> Conn {
        let mut c = Conn::new(now, cfg, local_id, initial_psn);
        c.discriminator = wire::cut_discriminator(discriminator).to_vec();
        c.state = State::Connecting;
        c.timers
            .set(Timer::ConnectTimeout, now + c.cfg.connect_timeout);
        // The first request goes at once.
        c.timers.set(Timer::Handshake, now);
        c
    }

    /// A peer-to-peer connection: asks the VI waiting on `discriminator` at
    /// the peer's address, while that VI asks this one; whichever request
    /// arrives first connects the two (the caller hands this connection the
    /// peer's [`Repr::PeerRequest`] when one comes for it).
    pub fn connect_peer(
        now: Instant,
        cfg: Config,
        local_id: u32,
        initial_psn: u32,
        discriminator: &[u8],
    ) -> Conn {
        let mut c = Conn::connect(now, cfg, local_id, initial_psn, discriminator);
        c.peer_mode = true;
        c
    }

    /// A server connection answering a request from `peer_id` with
    /// `peer_attrs`. Connected at once; the accept repeats until the client
    /// confirms it. The caller has checked the attributes match.
    pub fn accept(
        now: Instant,
        cfg: Config,
        local_id: u32,
        initial_psn: u32,
        peer_id: u32,
        peer_attrs: ConnAttrs,
    ) -> Conn {
        let mut c = Conn::new(now, cfg, local_id, initial_psn);
        c.establish(peer_id, peer_attrs);
        c.enter(State::Accepting);
        c
    }

    /// Gives the handshake private data: the request of a client (or of a
    /// peer-to-peer side), the accept of a server. Call right after
    /// [`connect`](Self::connect), [`connect_peer`](Self::connect_peer) or
    /// [`accept`](Self::accept), before the first
    /// [`poll_transmit`](Self::poll_transmit), so every copy of the frame
    /// carries the same bytes. Its length was checked where it was made
    /// ([`PrivateData::new`]).
    pub fn with_private(mut self, private: PrivateData) -> Conn {
        self.private = private;
        self
    }

    fn establish(&mut self, peer_id: u32, attrs: ConnAttrs) {
        self.peer_id = peer_id;
        self.peer = Some(attrs);
        self.rcv = SeqWindow::new(attrs.initial_psn, self.cfg.window);
        let frame = self.cfg.max_frame.min(attrs.max_frame);
        self.frag = frame.saturating_sub(DATA_HEADER_LEN as u32).max(1);
    }

    /// The frame a server sends to refuse a request; it keeps no state, so
    /// a repeated request gets the same answer.
    pub fn reject_frame(buf: &mut [u8], peer_id: u32, reason: RejectReason) -> usize {
        Conn::reject_frame_with(buf, peer_id, reason, &PrivateData::EMPTY)
    }

    /// [`reject_frame`](Self::reject_frame) carrying private data for the
    /// client. `buf` must hold [`wire::MAX_REPLY_LEN`] bytes.
    pub fn reject_frame_with(
        buf: &mut [u8],
        peer_id: u32,
        reason: RejectReason,
        private: &PrivateData,
    ) -> usize {
        let private = private.as_slice();
        Repr::ConnReject { reason, private }.emit(buf, peer_id, 0)
    }

    /// The frame that answers a disconnect for a connection that no longer exists.
    pub fn disconnect_ack_frame(buf: &mut [u8], peer_id: u32, local_id: u32) -> usize {
        Repr::DisconnectAck.emit(buf, peer_id, local_id)
    }

    pub fn local_id(&self) -> u32 {
        self.local_id
    }

    /// The peer's connection id (0 until it is known).
    pub fn peer_id(&self) -> u32 {
        self.peer_id
    }

    pub fn peer_attrs(&self) -> Option<ConnAttrs> {
        self.peer
    }

    /// The private data the peer's answer carried: at a client, the
    /// server's accept or reject; at a peer-to-peer side, the other side's
    /// request or accept. Empty until then, and at a server (the client's
    /// request's private data reaches it with the request, in
    /// [`Incoming`](crate::endpoint::Incoming)).
    pub fn peer_private(&self) -> &[u8] {
        self.peer_private.as_slice()
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// True once the handshake is done and until the connection ends.
    pub fn is_connected(&self) -> bool {
        matches!(self.state, State::Accepting | State::Connected)
    }

    /// True when the connection has ended (closed, refused or failed).
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed | State::Failed)
    }

    pub fn is_failed(&self) -> bool {
        self.state == State::Failed
    }

    /// Send-queue descriptors not yet completed.
    pub fn sends_outstanding(&self) -> usize {
        self.msgs.len()
    }

    /// Queues a send-queue descriptor; returns its msn (sequential from 0),
    /// which its [`Event::SendDone`] names.
    pub fn post_send(&mut self, now: Instant, op: SendOp) -> Result<u32, PostError> {
        if !self.is_connected() {
            return Err(PostError::State);
        }
        let peer = self.peer.ok_or(PostError::State)?;
        let max = self.cfg.max_transfer.min(peer.max_transfer);
        if op.len > max {
            return Err(PostError::TooLong { len: op.len, max });
        }
        let kind = match op.kind {
            SendKind::Send => OutKind::Send,
            SendKind::RdmaWrite { raddr, rkey } => {
                if !peer.rdma_write {
                    return Err(PostError::WriteUnavailable);
                }
                OutKind::Write { raddr, rkey }
            }
            SendKind::RdmaRead { raddr, rkey } => {
                if !self.cfg.level.is_reliable() || !peer.rdma_read {
                    return Err(PostError::ReadUnavailable);
                }
                OutKind::ReadRequest { raddr, rkey }
            }
        };
        let consumes = matches!(kind, OutKind::Send)
            || matches!(kind, OutKind::Write { .. }) && op.imm.is_some();
        let rsn = consumes.then(|| {
            let r = self.next_rsn;
            self.next_rsn = r.wrapping_add(1);
            r
        });
        let msn = self.next_msn;
        self.next_msn = msn.wrapping_add(1);
        self.msgs.push_back(OutMsg {
            msn,
            kind,
            len: op.len,
            imm: op.imm,
            rsn,
            framed: 0,
            unacked: 0,
            read_got: 0,
            started: false,
        });
        let _ = now;
        Ok(msn)
    }

    /// Posts a receive descriptor of `capacity` bytes; returns its rsn
    /// (sequential from 0), which its [`Event::RecvDone`] names.
    pub fn post_recv(&mut self, capacity: u32) -> Result<u32, PostError> {
        if self.is_closed() {
            return Err(PostError::State);
        }
        let rsn = self.recv_base.wrapping_add(self.recvs.len() as u32);
        self.recvs.push_back(capacity);
        // A message may have been waiting for this descriptor.
        if self.rnr_nak_at.is_some() {
            self.rnr_nak_at = None;
        }
        Ok(rsn)
    }

    /// Starts a disconnect: outstanding descriptors complete as flushed,
    /// and the peer is told.
    pub fn close(&mut self, now: Instant) {
        if self.is_closed() || matches!(self.state, State::Closing { .. }) {
            return;
        }
        let was_connecting = self.state == State::Connecting;
        let owe_ack = self.ack_pending > 0 || self.timers.is_set(Timer::Ack) || self.ack_now;
        self.flush(Outcome::Flushed);
        self.ack_now = owe_ack && self.cfg.level.is_reliable();
        self.enter(if was_connecting {
            State::Closed
        } else {
            State::Closing { tries: 0 }
        });
        let _ = now;
    }

    /// The next event, if any. Call after each `handle_*`, `post_*` and
    /// `poll_transmit` until it returns `None`.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    // ------------------------------------------------------------------
    // Input.

    /// Takes in a frame whose destination id is this connection's (or, for
    /// a client still connecting, an answer to its request). `src` is the
    /// frame's source connection id. Returns false if the frame was dropped.
    pub fn handle_frame(
        &mut self,
        now: Instant,
        src: u32,
        frame: &Repr<'_>,
        mem: &mut dyn Memory,
    ) -> bool {
        self.stats.frames_received += 1;
        match (self.state, frame) {
            (State::Connecting, Repr::ConnAccept { attrs, private }) => {
                self.peer_private = PrivateData::of_frame(private);
                if Level::from_wire(attrs.reliability) != Some(self.cfg.level) {
                    self.enter(State::Closed);
                    self.events
                        .push_back(Event::Rejected(RejectReason::Mismatch));
                    return true;
                }
                self.establish(src, *attrs);
                self.heard(now);
                self.enter(State::Connected);
                self.confirm_due = true;
                self.events.push_back(Event::Connected);
                return true;
            }
            (State::Connecting, Repr::PeerRequest { attrs, private, .. }) if self.peer_mode => {
                // The other side asked first: answer as a server would.
                self.peer_private = PrivateData::of_frame(private);
                if Level::from_wire(attrs.reliability) != Some(self.cfg.level) {
                    self.enter(State::Closed);
                    self.events
                        .push_back(Event::Rejected(RejectReason::Mismatch));
                    return true;
                }
                self.establish(src, *attrs);
                self.heard(now);
                self.enter(State::Accepting);
                self.events.push_back(Event::Connected);
                return true;
            }
            (State::Connecting, Repr::ConnReject { reason, private }) => {
                self.peer_private = PrivateData::of_frame(private);
                self.enter(State::Closed);
                self.events.push_back(Event::Rejected(*reason));
                return true;
            }
            (State::Connecting, _) => {
                self.stats.dropped += 1;
                return false;
            }
            _ => {}
        }
        if src != self.peer_id {
            self.stats.dropped += 1;
            return false;
        }
        self.heard(now);
        match frame {
            Repr::ConnAccept { .. } => {
                // Our confirm was lost: say it again.
                self.confirm_due = true;
                true
            }
            Repr::ConnRequest { .. } | Repr::PeerRequest { .. } => {
                // A repeated request: the accept goes out again.
                if self.is_connected() {
                    self.enter(State::Accepting);
                }
                true
            }
            Repr::ConnConfirm => {
                self.confirmed();
                true
            }
            Repr::ConnReject { .. } => {
                self.stats.dropped += 1;
                false
            }
            Repr::Disconnect { ack, done } => {
                self.disconnect_ack_due = true;
                if self.is_connected() {
                    // What the peer had before it left completes normally.
                    self.on_ack(now, *ack, *done, &[]);
                }
                if !self.is_closed() {
                    if !matches!(self.state, State::Closing { .. }) {
                        self.flush(Outcome::Transport);
                        self.events.push_back(Event::Disconnected);
                    }
                    self.enter(State::Closed);
                }
                true
            }
            Repr::DisconnectAck => {
                if matches!(self.state, State::Closing { .. }) {
                    self.enter(State::Closed);
                }
                true
            }
            Repr::Ack {
                ack,
                done,
                flags,
                sack,
            } => {
                self.confirmed();
                if !self.is_connected() {
                    return false;
                }
                if flags & ack_flags::PING != 0 {
                    self.pong_due = true;
                }
                self.on_ack(now, *ack, *done, sack.as_slice());
                true
            }
            Repr::Nak { code, psn, ack } => {
                self.confirmed();
                if !self.is_connected() {
                    return false;
                }
                self.on_ack(now, *ack, self.peer_done, &[]);
                self.on_nak(now, *code, *psn);
                true
            }
            Repr::Data { header, payload } => {
                self.confirmed();
                if !self.is_connected() {
                    if self.state == State::Failed && self.nak.is_none() {
                        // Our first word of the failure may have been lost.
                        self.nak = Some((NakCode::Failed, header.psn));
                    }
                    if self.state == State::Closed && self.peer.is_some() {
                        // Every copy of our disconnect was lost, and the
                        // peer still waits for the ack it carries.
                        self.disconnect_due = true;
                    }
                    self.stats.dropped += 1;
                    return false;
                }
                if self.cfg.level.is_reliable() {
                    self.on_ack(now, header.ack, header.done, &[]);
                }
                self.on_data(now, header, payload, mem)
            }
        }
    }

    /// Anything from the peer after our accept means it has the accept.
    fn confirmed(&mut self) {
        if self.state == State::Accepting {
            self.enter(State::Connected);
        }
    }

    fn on_data(
        &mut self,
        now: Instant,
        h: &DataHeader,
        payload: &[u8],
        mem: &mut dyn Memory,
    ) -> bool {
        let reliable = self.cfg.level.is_reliable();
        if !reliable {
            if !self.rcv.in_window(h.psn) {
                if seq::lt(h.psn, self.rcv.base()) {
                    self.stats.dropped += 1;
                    return false;
                }
                // Far ahead: what lay between is lost for good.
                let to = h.psn.wrapping_sub(self.rcv.size() - 1);
                self.rcv.advance(to);
            }
            if self.rcv.contains(h.psn) {
                self.stats.duplicates += 1;
                return false;
            }
        } else if self.rcv.contains(h.psn) {
            // Seen before: our ack was lost, so say it again soon.
            self.stats.duplicates += 1;
            self.ack_now = true;
            return false;
        } else if !self.rcv.in_window(h.psn) {
            self.stats.dropped += 1;
            return false;
        }
        let accepted = match h.op {
            Op::ReadResponse => self.on_read_response(h, payload, mem),
            _ => self.on_message_frame(now, h, payload, mem),
        };
        if !accepted {
            return false;
        }
        self.rcv.insert(h.psn);
        if !reliable {
            return true;
        }
        self.newest_rx = Some(h.psn);
        self.ack_pending += 1;
        self.ack_bytes = self.ack_bytes.saturating_add(payload.len() as u32);
        if h.flags & data_flags::ACK_NOW != 0
            || self.ack_pending >= self.cfg.ack_every
            // Large frames: a quarter of the sender's byte window, so it
            // never stalls waiting for an ack.
            || self.ack_bytes >= self.cfg.window_bytes / 4
            || self.rcv.has_gap()
        {
            self.ack_now = true;
        } else if !self.timers.is_set(Timer::Ack) {
            self.timers.set(Timer::Ack, now + self.cfg.ack_delay);
        }
        true
    }

    fn on_read_response(&mut self, h: &DataHeader, payload: &[u8], mem: &mut dyn Memory) -> bool {
        let Some(i) = self.msg_index(h.msn) else {
            self.stats.dropped += 1;
            return false;
        };
        let m = &mut self.msgs[i];
        let end = h.offset as u64 + payload.len() as u64;
        if !matches!(m.kind, OutKind::ReadRequest { .. }) || end > m.len as u64 {
            self.stats.dropped += 1;
            return false;
        }
        mem.write_read(h.msn, h.offset, payload);
        m.read_got += payload.len() as u32;
        if h.total == 0 {
            m.read_got = m.len;
        }
        self.complete_sends();
        true
    }

    /// Index in `msgs` of our message `msn`.
    fn msg_index(&self, msn: u32) -> Option<usize> {
        let first = self.msgs.front()?.msn;
        let i = msn.wrapping_sub(first) as usize;
        (i < self.msgs.len()).then_some(i)
    }

    fn on_message_frame(
        &mut self,
        now: Instant,
        h: &DataHeader,
        payload: &[u8],
        mem: &mut dyn Memory,
    ) -> bool {
        let reliable = self.cfg.level.is_reliable();
        let at = h.msn.wrapping_sub(self.in_base);
        if at >= self.cfg.window {
            // Below the base (already completed) or absurdly far ahead.
            self.stats.dropped += 1;
            return false;
        }
        let at = at as usize;
        let consumes = h.flags & data_flags::CONSUMES != 0;
        // The operation must be allowed here.
        let allowed = match h.op {
            Op::Send => consumes,
            Op::RdmaWrite => self.cfg.rdma_write,
            Op::ReadRequest => self.cfg.rdma_read && reliable,
            Op::ReadResponse => false,
        };
        if !allowed {
            return self.refuse(h.psn, NakCode::Operation, None);
        }
        if h.total > self.cfg.max_transfer {
            // Larger than this VI takes: a peer that ignored the
            // attributes it was given (or garbage).
            return self.refuse(h.psn, NakCode::Length, None);
        }
        let at = if !reliable && at > 0 {
            // A newer message: the ones still in assembly will never be
            // complete at this level (nothing is sent twice), and order
            // must hold, so they are dropped.
            self.abandon(at);
            0
        } else {
            at
        };
        if self.in_msgs.len() == at {
            // The next message, the usual case.
            self.in_msgs.push_back(None);
        } else if self.in_msgs.len() < at {
            self.in_msgs.resize(at + 1, None);
        }
        if self.in_msgs[at].is_none() {
            // First frame of this message to arrive.
            let bound = if !consumes {
                None
            } else if reliable {
                let idx = h.rsn.wrapping_sub(self.recv_base);
                if idx as usize >= self.recvs.len() {
                    return self.not_ready(h.psn);
                }
                Some(h.rsn)
            } else {
                if self.recvs_bound as usize >= self.recvs.len() {
                    self.stats.messages_dropped += 1;
                    return false;
                }
                let r = self.recv_base.wrapping_add(self.recvs_bound);
                self.recvs_bound += 1;
                Some(r)
            };
            if let Some(r) = bound {
                let cap = self.recvs[r.wrapping_sub(self.recv_base) as usize];
                if h.op == Op::Send && h.total > cap {
                    // Too long for the descriptor: it completes with a
                    // length error (and a reliable connection breaks).
                    self.in_msgs[at] = Some(InMsg {
                        op: h.op,
                        total: h.total,
                        got: h.total,
                        imm: None,
                        bound: Some(r),
                    });
                    if reliable {
                        self.complete_recv_error(r, h.total, Outcome::Length);
                        return self.refuse(h.psn, NakCode::Length, None);
                    }
                    self.deliver_in_order();
                    return true;
                }
            }
            if matches!(h.op, Op::RdmaWrite | Op::ReadRequest) {
                let write = h.op == Op::RdmaWrite;
                if let Err(code) = mem.check_rdma(h.rkey, h.raddr, h.total, write) {
                    if reliable {
                        return self.refuse(h.psn, code, None);
                    }
                    self.stats.messages_dropped += 1;
                    if let Some(r) = bound {
                        // Unbind: the descriptor stays for the next message.
                        let _ = r;
                        self.recvs_bound -= 1;
                    }
                    return false;
                }
            }
            self.in_msgs[at] = Some(InMsg {
                op: h.op,
                total: h.total,
                got: 0,
                imm: (h.flags & data_flags::IMM != 0).then_some(h.imm),
                bound,
            });
        }
        let Some(m) = self.in_msgs[at] else {
            return false;
        };
        if m.op != h.op || m.total != h.total {
            self.stats.dropped += 1;
            return false;
        }
        match h.op {
            Op::Send => {
                if let Some(r) = m.bound {
                    let cap = self.recvs[r.wrapping_sub(self.recv_base) as usize];
                    if h.offset as u64 + payload.len() as u64 <= cap as u64 {
                        mem.write_recv(r, h.offset, payload);
                    }
                }
            }
            Op::RdmaWrite => {
                let at = h.raddr.wrapping_add(h.offset as u64);
                if let Err(code) = mem.rdma_write(h.rkey, at, payload) {
                    return self.refuse(h.psn, code, None);
                }
            }
            Op::ReadRequest => {
                self.responses.push_back(OutMsg {
                    msn: h.msn,
                    kind: OutKind::ReadResponse {
                        raddr: h.raddr,
                        rkey: h.rkey,
                    },
                    len: h.total,
                    imm: None,
                    rsn: None,
                    framed: 0,
                    unacked: 0,
                    read_got: 0,
                    started: false,
                });
            }
            Op::ReadResponse => {}
        }
        let got = if h.op == Op::ReadRequest {
            h.total
        } else {
            m.got + payload.len() as u32
        };
        if let Some(Some(mm)) = self.in_msgs.get_mut(at) {
            mm.got = got;
        }
        let _ = now;
        self.deliver_in_order();
        true
    }

    /// Drops the first `n` incoming messages (unreliable level): their
    /// descriptors go to the messages after them.
    fn abandon(&mut self, n: usize) {
        for _ in 0..n {
            if let Some(Some(m)) = self.in_msgs.pop_front() {
                self.stats.messages_dropped += 1;
                if m.bound.is_some() {
                    self.recvs_bound -= 1;
                }
            }
            self.in_base = self.in_base.wrapping_add(1);
        }
    }

    /// Completes incoming messages whose every byte is here, in order.
    fn deliver_in_order(&mut self) {
        loop {
            let front_done = matches!(self.in_msgs.front(), Some(Some(m)) if m.got >= m.total);
            if !front_done {
                return;
            }
            let Some(Some(m)) = self.in_msgs.pop_front() else {
                return;
            };
            self.in_base = self.in_base.wrapping_add(1);
            if let Some(r) = m.bound {
                let cap = self.recvs[r.wrapping_sub(self.recv_base) as usize];
                let outcome = if m.op == Op::Send && m.total > cap {
                    Outcome::Length
                } else {
                    Outcome::Ok
                };
                self.complete_recv(m.total, m.imm, m.op == Op::RdmaWrite, outcome);
            }
        }
    }

    /// Completes the oldest receive descriptor.
    fn complete_recv(&mut self, len: u32, imm: Option<u32>, remote_write: bool, outcome: Outcome) {
        if self.recvs.pop_front().is_none() {
            return;
        }
        let rsn = self.recv_base;
        self.recv_base = self.recv_base.wrapping_add(1);
        if !self.cfg.level.is_reliable() {
            self.recvs_bound = self.recvs_bound.saturating_sub(1);
        }
        self.events.push_back(Event::RecvDone {
            rsn,
            len,
            imm,
            remote_write,
            outcome,
        });
    }

    /// Completes receive descriptor `r` with an error, completing those
    /// before it as flushed (a reliable connection is about to break).
    fn complete_recv_error(&mut self, r: u32, len: u32, outcome: Outcome) {
        while seq::lt(self.recv_base, r) && !self.recvs.is_empty() {
            self.complete_recv(0, None, false, Outcome::Flushed);
        }
        self.complete_recv(len, None, false, outcome);
    }

    /// No descriptor for a reliable message yet.
    fn not_ready(&mut self, psn: u32) -> bool {
        self.stats.rnr_naks += 1;
        match self.cfg.rnr {
            RnrPolicy::Retry { .. } => {
                if self.rnr_nak_at.is_none_or(|p| seq::le(psn, p)) {
                    self.rnr_nak_at = Some(psn);
                    self.nak = Some((NakCode::ReceiverNotReady, psn));
                }
                false
            }
            RnrPolicy::Fail => self.refuse(psn, NakCode::NoDescriptor, None),
        }
    }

    /// A fatal error in the peer's traffic: tell it, and break.
    fn refuse(&mut self, psn: u32, code: NakCode, _outcome: Option<Outcome>) -> bool {
        if !self.cfg.level.is_reliable() {
            self.stats.messages_dropped += 1;
            return false;
        }
        self.nak = Some((code, psn));
        self.fail(FailReason::Local(code), None);
        false
    }

    fn on_ack(&mut self, now: Instant, ack: u32, done: u32, sack: &[(u32, u32)]) {
        if !self.cfg.level.is_reliable() {
            return;
        }
        // Ignore acks of psns we never sent.
        if seq::lt(self.snd_nxt, ack) {
            return;
        }
        let mut progress = false;
        // The most recently sent frame this ack covers.
        let mut newest: Option<Sent> = None;
        let mut note = |s: &Sent| {
            if newest.is_none_or(|n| n.order < s.order) {
                newest = Some(*s);
            }
        };
        while seq::lt(self.snd_una, ack) {
            if let Some(s) = self.inflight.pop_front() {
                if s.lost {
                    self.lost -= 1;
                }
                if !s.acked {
                    note(&s);
                    self.frame_acked(now, &s);
                    progress = true;
                }
            }
            self.snd_una = self.snd_una.wrapping_add(1);
        }
        // Offsets from `snd_una` bound every range by what is in flight,
        // whatever numbers the peer sent.
        let flight = self.inflight.len() as u32;
        for &(start, end) in sack {
            let hi = end.wrapping_sub(self.snd_una);
            if hi == 0 || hi > flight {
                continue;
            }
            let lo = if seq::lt(start, self.snd_una) {
                0
            } else {
                start.wrapping_sub(self.snd_una)
            };
            if lo >= hi {
                continue;
            }
            for i in lo as usize..hi as usize {
                let s = self.inflight[i];
                if !s.acked {
                    if s.lost {
                        self.inflight[i].lost = false;
                        self.lost -= 1;
                    }
                    self.inflight[i].acked = true;
                    note(&s);
                    self.frame_acked(now, &s);
                    progress = true;
                }
            }
            let last = end.wrapping_sub(1);
            if self.largest_acked.is_none_or(|l| seq::lt(l, last)) {
                self.largest_acked = Some(last);
            }
        }
        if self
            .largest_acked
            .is_none_or(|l| seq::lt(l, ack.wrapping_sub(1)))
        {
            self.largest_acked = Some(ack.wrapping_sub(1));
        }
        // Fast retransmit: three later frames arrived, this one did not.
        if let Some(l) = self.largest_acked.filter(|_| !self.inflight.is_empty()) {
            for i in 0..self.inflight.len() {
                let psn = self.snd_una.wrapping_add(i as u32);
                if !seq::lt(psn.wrapping_add(3), l.wrapping_add(1)) {
                    break;
                }
                let s = &mut self.inflight[i];
                if !s.acked && !s.lost && s.transmissions == 1 {
                    s.lost = true;
                    self.lost += 1;
                }
            }
        }
        if let Some(s) = newest {
            self.detect_by_time(now, Some(&s));
        }
        if seq::lt(self.peer_done, done) && seq::le(done, self.next_msn) {
            self.peer_done = done;
            progress = true;
        }
        if progress {
            self.timeouts_in_a_row = 0;
            self.rnr_in_a_row = 0;
            self.probes = 0;
            self.rtt.reset_backoff();
            self.complete_sends();
        }
        self.arm_timers(now, progress);
    }

    /// True while a frame waits for its ack.
    fn outstanding(&self) -> bool {
        // The oldest record is almost always the one unacked.
        self.inflight.iter().any(|s| !s.acked)
    }

    /// The retransmission timer restarts on every ack that brings progress
    /// (RFC 6298, 5.3): it measures silence, not the age of the oldest
    /// frame, which a long queue of our own frames can make older than a
    /// timeout without anything being lost. The tail-loss probe follows it.
    fn arm_timers(&mut self, now: Instant, progress: bool) {
        if !self.outstanding() {
            self.timers.stop(Timer::Rto);
            self.timers.stop(Timer::Probe);
            return;
        }
        if progress || !self.timers.is_set(Timer::Rto) {
            self.timers.set(Timer::Rto, now + self.rtt.rto());
        }
        if progress {
            self.arm_probe(now);
        }
    }

    /// Two smoothed round trips (and the peer's ack delay) after the last
    /// transmission or progress, a probe goes out, unless the timeout
    /// comes first or a probe already went for this tail.
    fn arm_probe(&mut self, now: Instant) {
        self.timers.stop(Timer::Probe);
        if self.probes > 0 || self.lost > 0 {
            return;
        }
        let Some(srtt) = self.rtt.srtt() else {
            return;
        };
        let at = now + srtt * 2 + self.cfg.ack_delay;
        if self.timers.get(Timer::Rto).is_none_or(|r| at < r) {
            self.timers.set(Timer::Probe, at);
        }
    }

    /// The probe is due: the newest frame still unacked goes again, with a
    /// request for an immediate ack.
    fn on_probe(&mut self) {
        self.timers.stop(Timer::Probe);
        if self.lost > 0 {
            return;
        }
        if let Some(s) = self.inflight.iter_mut().rev().find(|s| !s.acked) {
            s.lost = true;
            s.probe = true;
            self.lost += 1;
            self.probes += 1;
            self.stats.probes += 1;
        }
    }

    /// Marks lost every frame sent before the newest acked one whose ack
    /// is now overdue: later than that frame's own round trip plus the
    /// reordering allowance (RACK, RFC 8985). Arms a timer for those not
    /// yet overdue.
    fn detect_by_time(&mut self, now: Instant, acked: Option<&Sent>) {
        if let Some(s) = acked {
            let rtt = now.saturating_duration_since(s.sent_at);
            // The ack of a frame sent more than once may answer an earlier
            // copy that was only late (Karn's ambiguity): taken as "sent
            // last", it would make every frame sent in between look lost.
            // Such acks are left out; frames sent after the retransmission
            // find it lost if it is. A probe is the exception: it went out
            // two round trips after the copy before it, whose ack would
            // have come by then.
            let ambiguous = s.transmissions > 1 && !s.probe;
            if !ambiguous && self.rack.is_none_or(|(o, _)| o < s.order) {
                self.rack = Some((s.order, rtt));
            }
        }
        let Some((rack, rack_rtt)) = self.rack else {
            return;
        };
        let wait = rack_rtt + self.rtt.reorder_window(Duration::from_micros(20));
        self.timers.stop(Timer::Loss);
        for s in self.inflight.iter_mut() {
            if s.acked || s.lost || s.order >= rack {
                continue;
            }
            let due = s.sent_at + wait;
            if now >= due {
                s.lost = true;
                s.probe = false;
                self.lost += 1;
            } else if self.timers.get(Timer::Loss).is_none_or(|d| due < d) {
                self.timers.set(Timer::Loss, due);
            }
        }
    }

    fn frame_acked(&mut self, now: Instant, s: &Sent) {
        self.inflight_bytes = self.inflight_bytes.saturating_sub(s.len);
        if s.transmissions == 1 {
            self.rtt.sample(now.saturating_duration_since(s.sent_at));
        }
        let m = if s.response {
            self.responses.iter_mut().find(|m| m.msn == s.msn)
        } else {
            match self.msg_index(s.msn) {
                Some(i) => self.msgs.get_mut(i),
                None => None,
            }
        };
        if let Some(m) = m {
            m.unacked = m.unacked.saturating_sub(1);
        }
        // Responses fully acknowledged are done.
        while matches!(self.responses.front(), Some(r) if r.fully_framed() && r.unacked == 0) {
            self.responses.pop_front();
        }
    }

    fn on_nak(&mut self, now: Instant, code: NakCode, psn: u32) {
        if code == NakCode::ReceiverNotReady {
            if let RnrPolicy::Retry { delay, limit } = self.cfg.rnr {
                self.rnr_in_a_row += 1;
                if self.rnr_in_a_row > limit {
                    self.fail(FailReason::RnrExhausted, None);
                    return;
                }
                self.timers.set(Timer::Rnr, now + delay);
            } else {
                self.timers.set(Timer::Rnr, now + self.rtt.rto());
            }
            // The peer answered: that is no silence, whatever it said. The
            // retry limit above ends a wait too long, not the timer.
            self.timeouts_in_a_row = 0;
            self.rtt.reset_backoff();
            self.timers.stop(Timer::Probe);
            match self.timers.get(Timer::Rnr) {
                Some(t) => self.timers.set(Timer::Rto, t + self.rtt.rto()),
                None => self.timers.stop(Timer::Rto),
            }
            // Everything from `psn` on goes again after the pause.
            for i in 0..self.inflight.len() {
                let p = self.snd_una.wrapping_add(i as u32);
                let s = &mut self.inflight[i];
                if !seq::lt(p, psn) && !s.acked && !s.lost {
                    s.lost = true;
                    s.probe = false;
                    self.lost += 1;
                }
            }
            return;
        }
        // A fatal error: the message it names completes with it.
        let msn = self
            .inflight
            .get(psn.wrapping_sub(self.snd_una) as usize)
            .filter(|s| !s.response)
            .map(|s| s.msn);
        self.fail(
            FailReason::Remote(code),
            msn.map(|m| (m, Outcome::Remote(code))),
        );
    }

    /// Completes finished send-queue descriptors, in posting order.
    fn complete_sends(&mut self) {
        let level = self.cfg.level;
        while let Some(m) = self.msgs.front() {
            let done = match m.kind {
                OutKind::ReadRequest { .. } => m.read_got >= m.len && m.fully_framed(),
                _ => match level {
                    Level::Unreliable => m.fully_framed(),
                    Level::ReliableDelivery => m.fully_framed() && m.unacked == 0,
                    Level::ReliableReception => seq::lt(m.msn, self.peer_done),
                },
            };
            if !done {
                break;
            }
            let msn = m.msn;
            self.msgs.pop_front();
            self.frame_cursor = self.frame_cursor.saturating_sub(1);
            self.events.push_back(Event::SendDone {
                msn,
                outcome: Outcome::Ok,
            });
        }
    }

    /// Breaks the connection: every outstanding descriptor completes with
    /// an error (`first` names one with a specific outcome).
    fn fail(&mut self, reason: FailReason, first: Option<(u32, Outcome)>) {
        if self.is_closed() {
            return;
        }
        if let Some((msn, outcome)) = first.filter(|(msn, _)| self.msg_index(*msn).is_some()) {
            // Those before it reached the target before it failed. One
            // whose every frame was acknowledged, after others that were
            // too, was complete there (messages complete in order, and an
            // error in it would have been named instead): it completes
            // normally, as on the reliable-delivery level it already has.
            let mut proven = true;
            while let Some(m) = self.msgs.front() {
                if m.msn == msn {
                    break;
                }
                proven &= match m.kind {
                    OutKind::ReadRequest { .. } => m.fully_framed() && m.read_got >= m.len,
                    _ => m.fully_framed() && m.unacked == 0,
                };
                let msn = m.msn;
                self.msgs.pop_front();
                self.frame_cursor = self.frame_cursor.saturating_sub(1);
                self.events.push_back(Event::SendDone {
                    msn,
                    outcome: if proven {
                        Outcome::Ok
                    } else {
                        Outcome::Transport
                    },
                });
            }
            if self.msgs.pop_front().is_some() {
                self.events.push_back(Event::SendDone { msn, outcome });
            }
        }
        self.flush(Outcome::Transport);
        self.enter(State::Failed);
        self.events.push_back(Event::Failed(reason));
    }

    /// Completes every outstanding descriptor: started sends with
    /// `started`, the rest flushed.
    fn flush(&mut self, started: Outcome) {
        while let Some(m) = self.msgs.pop_front() {
            let outcome = if m.started { started } else { Outcome::Flushed };
            self.events.push_back(Event::SendDone {
                msn: m.msn,
                outcome,
            });
        }
        let partial = self.in_msgs.iter().flatten().filter_map(|m| m.bound).next();
        while !self.recvs.is_empty() {
            let outcome = if Some(self.recv_base) == partial {
                started
            } else {
                Outcome::Flushed
            };
            self.complete_recv(0, None, false, outcome);
        }
        self.frame_cursor = 0;
        self.responses.clear();
        self.inflight.clear();
        self.inflight_bytes = 0;
        self.lost = 0;
        self.in_msgs.clear();
        self.timers.stop(Timer::Rto);
        self.timers.stop(Timer::Loss);
        self.timers.stop(Timer::Probe);
        self.timers.stop(Timer::Ack);
    }

    // ------------------------------------------------------------------
    // Time.

    /// When [`handle_timeout`](Self::handle_timeout) must next be called.
    /// Ask again after every other call.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Lets time pass: retransmission and handshake timers, delayed acks,
    /// keep-alives and the idle timeout.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Each timer is looked at in its turn, after the ones before it ran:
        // a handler may stop or move a later one (a timeout stops the probe,
        // a failure all of them).
        for timer in Timer::ALL {
            if !self.timers.expired(timer, now) {
                continue;
            }
            match timer {
                Timer::ConnectTimeout => {
                    self.enter(State::Closed);
                    self.events.push_back(Event::ConnectTimedOut);
                }
                // The frame goes again from `poll_transmit`, which re-arms
                // the timer; so does the keep-alive.
                Timer::Handshake | Timer::KeepAlive => {}
                Timer::Close => {
                    // After the last try, its answer has had its time.
                    if let State::Closing {
                        tries: CLOSE_TRIES..,
                    } = self.state
                    {
                        self.enter(State::Closed);
                    }
                }
                Timer::Idle => self.fail(FailReason::PeerSilent, None),
                Timer::Ack => {
                    self.ack_now = true;
                    self.timers.stop(Timer::Ack);
                }
                Timer::Rnr => self.timers.stop(Timer::Rnr),
                Timer::Loss => self.detect_by_time(now, None),
                Timer::Probe => self.on_probe(),
                Timer::Rto => self.on_rto(now),
            }
        }
    }

    /// Moves to `state` and stops the timers it does not keep: a connected
    /// side counts idleness and keep-alives from `last_rx`, and sends its
    /// accept at once; one closing keeps only the disconnect's timer,
    /// armed as the disconnect goes; one closed or failed keeps none.
    fn enter(&mut self, state: State) {
        self.state = state;
        match state {
            State::Connecting => {}
            State::Accepting | State::Connected => {
                self.timers.stop(Timer::ConnectTimeout);
                self.timers.stop(Timer::Handshake);
                self.arm_liveness();
            }
            State::Closing { .. } | State::Closed | State::Failed => self.timers.clear(),
        }
    }

    /// A frame came from the peer.
    fn heard(&mut self, now: Instant) {
        self.last_rx = now;
        self.arm_liveness();
    }

    /// Arms the idle timeout and the keep-alive from the last frame heard
    /// and the last keep-alive sent; only a connected side keeps them.
    fn arm_liveness(&mut self) {
        if !self.is_connected() {
            return;
        }
        self.timers
            .set(Timer::Idle, self.last_rx + self.cfg.idle_timeout);
        let base = self.last_rx.max(self.last_ping.unwrap_or(self.last_rx));
        self.timers.set(Timer::KeepAlive, base + self.cfg.keepalive);
    }

    fn on_rto(&mut self, now: Instant) {
        self.stats.rto_expired += 1;
        self.timeouts_in_a_row += 1;
        if self.timeouts_in_a_row > self.cfg.retry_limit {
            self.fail(FailReason::RetriesExhausted, None);
            return;
        }
        self.rtt.back_off();
        // A whole timeout without progress: the oldest frame goes again,
        // and every other one whose ack is overdue by a round trip and the
        // reordering allowance (RFC 8985, 6.3); frames sent since may still
        // be on their way.
        let rtt = self
            .rack
            .map_or(self.rtt.srtt().unwrap_or(self.cfg.initial_rto), |r| r.1);
        let wait = rtt + self.rtt.reorder_window(Duration::from_micros(20));
        let mut first = true;
        for s in self.inflight.iter_mut() {
            if s.acked {
                continue;
            }
            if !s.lost && (first || now.saturating_duration_since(s.sent_at) >= wait) {
                s.lost = true;
                s.probe = false;
                self.lost += 1;
            }
            first = false;
        }
        self.timers.stop(Timer::Probe);
        self.timers.set(Timer::Rto, now + self.rtt.rto());
    }

    // ------------------------------------------------------------------
    // Output.

    /// Builds the next frame to send into `buf` (at least `max_frame`
    /// bytes) and returns its length, or `None` when there is nothing to
    /// send now. Call after every `handle_*` and `post_*` until it returns
    /// `None`. Frames of a client still connecting go to the server's
    /// address with destination id 0; all others to the peer.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        mem: &mut dyn Memory,
    ) -> Option<usize> {
        let n = self.transmit(now, buf, mem)?;
        self.stats.frames_sent += 1;
        Some(n)
    }

    fn transmit(&mut self, now: Instant, buf: &mut [u8], mem: &mut dyn Memory) -> Option<usize> {
        let (dst, src) = (self.peer_id, self.local_id);
        match self.state {
            State::Connecting => {
                if self.timers.due(Timer::Handshake, now) {
                    self.timers
                        .set(Timer::Handshake, now + self.cfg.handshake_retry);
                    let attrs = self.cfg.attrs(self.snd_nxt);
                    let discriminator = &self.discriminator[..];
                    let private = self.private.as_slice();
                    let r = Repr::request(self.peer_mode, attrs, discriminator, private);
                    return Some(r.emit(buf, 0, src));
                }
                return None;
            }
            State::Accepting => {
                if self.timers.due(Timer::Handshake, now) {
                    self.timers
                        .set(Timer::Handshake, now + self.cfg.handshake_retry);
                    let r = Repr::ConnAccept {
                        attrs: self.cfg.attrs(self.snd_una),
                        private: self.private.as_slice(),
                    };
                    return Some(r.emit(buf, dst, src));
                }
            }
            State::Closing { tries } => {
                if tries == 0 && self.ack_now {
                    // Acknowledge what arrived before saying goodbye, so the
                    // peer's last sends complete rather than fail.
                    self.ack_now = false;
                    self.ack_pending = 0;
                    self.timers.stop(Timer::Ack);
                    self.stats.acks_sent += 1;
                    let r = Repr::Ack {
                        ack: self.rcv.base(),
                        done: self.in_base,
                        flags: 0,
                        sack: SackList::default(),
                    };
                    return Some(r.emit(buf, dst, src));
                }
                if self.disconnect_ack_due {
                    self.disconnect_ack_due = false;
                    return Some(Repr::DisconnectAck.emit(buf, dst, src));
                }
                if tries < CLOSE_TRIES && self.timers.due(Timer::Close, now) {
                    self.state = State::Closing { tries: tries + 1 };
                    self.timers
                        .set(Timer::Close, now + self.cfg.handshake_retry);
                    let r = Repr::Disconnect {
                        ack: self.rcv.base(),
                        done: self.in_base,
                    };
                    return Some(r.emit(buf, dst, src));
                }
                return None;
            }
            State::Closed | State::Failed => {
                if self.disconnect_ack_due {
                    self.disconnect_ack_due = false;
                    return Some(Repr::DisconnectAck.emit(buf, dst, src));
                }
                if self.disconnect_due {
                    self.disconnect_due = false;
                    let r = Repr::Disconnect {
                        ack: self.rcv.base(),
                        done: self.in_base,
                    };
                    return Some(r.emit(buf, dst, src));
                }
                if let Some((code, psn)) = self.nak.take() {
                    let ack = self.rcv.base();
                    return Some(Repr::Nak { code, psn, ack }.emit(buf, dst, src));
                }
                return None;
            }
            State::Connected => {}
        }
        if self.confirm_due {
            self.confirm_due = false;
            return Some(Repr::ConnConfirm.emit(buf, dst, src));
        }
        if let Some((code, psn)) = self.nak.take() {
            let ack = self.rcv.base();
            return Some(Repr::Nak { code, psn, ack }.emit(buf, dst, src));
        }
        if !self.timers.is_set(Timer::Rnr) {
            if let Some(n) = self.retransmit(now, buf, mem) {
                return Some(n);
            }
            if let Some(n) = self.send_new(now, buf, mem) {
                return Some(n);
            }
        }
        let ping_due = self.timers.expired(Timer::KeepAlive, now);
        let ack_due = self.ack_now && self.cfg.level.is_reliable();
        if ack_due || ping_due || self.pong_due {
            self.ack_now = false;
            self.pong_due = false;
            let flags = if ping_due {
                self.last_ping = Some(now);
                self.arm_liveness();
                ack_flags::PING
            } else {
                0
            };
            self.ack_pending = 0;
            self.ack_bytes = 0;
            self.timers.stop(Timer::Ack);
            self.stats.acks_sent += 1;
            // The range of the newest arrival first, then the lowest ones:
            // every arrival is reported at least once even when more gaps
            // are open than an ack has room for.
            let mut sack = SackList::default();
            let newest = self.newest_rx.and_then(|n| self.rcv.range_of(n));
            if let Some((s, e)) = newest {
                sack.push(s, e);
            }
            self.rcv.ranges(MAX_SACK, |s, e| {
                if Some((s, e)) != newest {
                    sack.push(s, e);
                }
            });
            let r = Repr::Ack {
                ack: self.rcv.base(),
                done: self.in_base,
                flags,
                sack,
            };
            return Some(r.emit(buf, dst, src));
        }
        None
    }

    fn retransmit(&mut self, now: Instant, buf: &mut [u8], mem: &mut dyn Memory) -> Option<usize> {
        let (i, s, m) = loop {
            if self.lost == 0 {
                return None;
            }
            let Some(i) = self.inflight.iter().position(|s| s.lost && !s.acked) else {
                self.lost = 0;
                return None;
            };
            let s = self.inflight[i];
            let m = if s.response {
                self.responses.iter().find(|m| m.msn == s.msn).cloned()
            } else {
                self.msg_index(s.msn).map(|j| self.msgs[j].clone())
            };
            if let Some(m) = m {
                break (i, s, m);
            }
            // Its message is gone (completed on the peer's word); nothing
            // to send, and it no longer counts against the window.
            self.inflight[i].lost = false;
            self.inflight[i].acked = true;
            self.inflight_bytes = self.inflight_bytes.saturating_sub(s.len);
            self.lost -= 1;
        };
        let psn = self.snd_una.wrapping_add(i as u32);
        let order = self.next_order();
        let r = &mut self.inflight[i];
        r.lost = false;
        r.transmissions = s.transmissions.saturating_add(1);
        r.sent_at = now;
        r.order = order;
        self.lost -= 1;
        self.stats.retransmitted += 1;
        if !self.timers.is_set(Timer::Rto) {
            self.timers.set(Timer::Rto, now + self.rtt.rto());
        }
        if self.lost == 0 {
            self.arm_probe(now);
        }
        Some(self.emit_data(buf, psn, &m, s.offset, s.len, data_flags::ACK_NOW, mem))
    }

    fn next_order(&mut self) -> u64 {
        let o = self.sent_order;
        self.sent_order += 1;
        o
    }

    fn send_new(&mut self, now: Instant, buf: &mut [u8], mem: &mut dyn Memory) -> Option<usize> {
        let reliable = self.cfg.level.is_reliable();
        if reliable
            && (self.inflight.len() as u32 >= self.cfg.window
                || self.inflight_bytes >= self.cfg.window_bytes)
        {
            return None;
        }
        // Read responses first: the peer is waiting for them.
        let (response, idx) = if let Some(i) = self.responses.iter().position(|m| !m.fully_framed())
        {
            (true, i)
        } else if self.frame_cursor < self.msgs.len() {
            if reliable && self.waits_for_earlier(self.frame_cursor) {
                return None;
            }
            (false, self.frame_cursor)
        } else {
            return None;
        };
        let m = if response {
            &mut self.responses[idx]
        } else {
            &mut self.msgs[idx]
        };
        let offset = m.framed;
        let len = (m.payload_len() - offset).min(self.frag);
        m.framed += len;
        m.started = true;
        m.unacked += 1;
        let m = m.clone();
        let last = m.framed >= m.payload_len();
        if !response && last {
            self.frame_cursor += 1;
        }
        let psn = self.snd_nxt;
        self.snd_nxt = psn.wrapping_add(1);
        let more =
            self.frame_cursor < self.msgs.len() || self.responses.iter().any(|m| !m.fully_framed());
        let flags = if last && !more && self.cfg.level == Level::ReliableReception {
            // Reliable reception completes on the peer's word: ask for it now.
            data_flags::ACK_NOW
        } else {
            0
        };
        if reliable {
            let order = self.next_order();
            self.inflight.push_back(Sent {
                response,
                msn: m.msn,
                offset,
                len,
                sent_at: now,
                order,
                transmissions: 1,
                acked: false,
                lost: false,
                probe: false,
            });
            self.inflight_bytes += len;
            if !self.timers.is_set(Timer::Rto) {
                self.timers.set(Timer::Rto, now + self.rtt.rto());
            }
            self.arm_probe(now);
        }
        let n = self.emit_data(buf, psn, &m, offset, len, flags, mem);
        if !reliable {
            if let Some(j) = self.msg_index(m.msn).filter(|_| !response) {
                self.msgs[j].unacked = 0;
            }
            self.complete_sends();
        }
        Some(n)
    }

    /// True when message `i`, not started yet, must wait for an earlier
    /// one to reach the target first: the target places RDMA frames as
    /// they arrive, not in order, so a write (or a read) overlapping an
    /// earlier write still in flight could land before it and be
    /// overwritten by a retransmission of it, and a write overlapping an
    /// earlier read could change the bytes before the target has sent them.
    /// (Addresses alone are compared: two handles may name the same memory.)
    fn waits_for_earlier(&self, i: usize) -> bool {
        let m = &self.msgs[i];
        if m.started {
            return false;
        }
        let (at, len) = match m.kind {
            OutKind::Write { raddr, .. } | OutKind::ReadRequest { raddr, .. } => (raddr, m.len),
            _ => return false,
        };
        let overlaps = |a: u64, n: u32| {
            n > 0 && len > 0 && a < at.saturating_add(len as u64) && at < a.saturating_add(n as u64)
        };
        self.msgs.iter().take(i).any(|e| match e.kind {
            // A write is placed once every frame of it has arrived.
            OutKind::Write { raddr, .. } => {
                !(e.fully_framed() && e.unacked == 0) && overlaps(raddr, e.len)
            }
            // A read is served once every byte of it is back.
            OutKind::ReadRequest { raddr, .. } => {
                matches!(m.kind, OutKind::Write { .. })
                    && e.read_got < e.len
                    && overlaps(raddr, e.len)
            }
            _ => false,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn emit_data(
        &mut self,
        buf: &mut [u8],
        psn: u32,
        m: &OutMsg,
        offset: u32,
        len: u32,
        flags: u8,
        mem: &mut dyn Memory,
    ) -> usize {
        let (raddr, rkey) = match m.kind {
            OutKind::Send => (0, 0),
            OutKind::Write { raddr, rkey }
            | OutKind::ReadRequest { raddr, rkey }
            | OutKind::ReadResponse { raddr, rkey } => (raddr, rkey),
        };
        let mut f = flags;
        if m.imm.is_some() {
            f |= data_flags::IMM;
        }
        if m.rsn.is_some() {
            f |= data_flags::CONSUMES;
        }
        let h = DataHeader {
            psn,
            ack: self.rcv.base(),
            msn: m.msn,
            op: m.op(),
            flags: f,
            offset,
            total: m.len,
            imm: m.imm.unwrap_or(0),
            rkey,
            raddr,
            rsn: m.rsn.unwrap_or(0),
            done: self.in_base,
        };
        let end = DATA_HEADER_LEN + len as usize;
        h.emit(buf, self.peer_id, self.local_id);
        let payload = &mut buf[DATA_HEADER_LEN..end];
        match m.kind {
            OutKind::Send | OutKind::Write { .. } => mem.read_send(m.msn, offset, payload),
            OutKind::ReadResponse { raddr, rkey } => {
                mem.rdma_read(rkey, raddr.wrapping_add(offset as u64), payload)
            }
            OutKind::ReadRequest { .. } => {}
        }
        // Left out (zero) when the peer's medium checks frames itself: on
        // the udp provider that is two CRCs off every message's path.
        if !self.peer.is_some_and(|p| p.intact) {
            wire::fill_checksum(&mut buf[..end]);
        }
        // The frame carries our ack: no separate one is needed.
        if self.cfg.level.is_reliable() {
            self.ack_pending = 0;
            self.ack_bytes = 0;
            self.timers.stop(Timer::Ack);
            self.ack_now = false;
        }
        end
    }
}
