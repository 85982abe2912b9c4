//! One VI connection: handshake, fragmentation and reassembly, RDMA, and
//! VIA's three reliability levels.
//!
//! The caller feeds frames addressed to this connection to
//! [`Conn::handle_frame`], lets time pass with [`Conn::handle_timeout`], and
//! pulls out frames to send ([`Conn::poll_transmit`]), the next deadline
//! ([`Conn::poll_timeout`]) and completions ([`Conn::poll_event`]). Payload
//! bytes never pass through the engine's own buffers: it asks the caller's
//! [`Memory`] to copy them straight between frames and descriptors.
//!
//! This file holds the connection's types, its state and the calls that
//! post work; the rest of `Conn` is split by concern: `handshake` (request,
//! accept, disconnect), `recv` (frames coming in), `send` (frames going
//! out, and the acks that answer them) and `timers` (the deadline table and
//! what each expiry does).

mod handshake;
mod place;

pub use place::{Expected, Place, PLACE_FROM};
mod recv;
mod send;
mod timers;

use crate::rtt::RttEstimator;
use crate::seq::SeqWindow;
use crate::wire::{ConnAttrs, NakCode, Op, PrivateData, RejectReason};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use timers::{Timer, TimerTable};

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
    /// Most payload bytes in flight and not yet acknowledged on a path that
    /// has lost nothing lately; keep it below the receiver's socket buffer.
    /// The default, 2 MiB, lets a message of a MiB go out whole: with 512
    /// KiB its sender waited for acks half-way, and a udp ping-pong of 1
    /// MiB took 5-11% longer.
    pub window_bytes: u32,
    /// The same bound once a frame has been lost, until
    /// [`CLEAN_TO_REOPEN`] windows' worth have been acknowledged with no
    /// loss. A frame sent again waits behind everything in flight, and so
    /// does every completion after it: at 5% loss a 2 MiB window moved 64
    /// KiB messages at 6% of the lossless rate, 512 KiB at about 90%. The
    /// default, 512 KiB, is some ten times what a 10 Gb/s link holds over
    /// a 40 us round trip. Acknowledgements of large frames come every
    /// quarter of it, so that a sender held to it never stalls.
    pub lossy_window_bytes: u32,
    /// How long an acknowledgement may wait for a frame to ride on: long
    /// enough for a reply made at once (a ping-pong's comes within a
    /// microsecond or two), short, since a send at reliable delivery
    /// completes on its ack. With 50 us, Open MPI over `uvia;ofi_rxm`
    /// paid it once per rendezvous message (256 KiB one way: 103 us, 56 us
    /// with 5 us, 51 us with 2 us; the native ping-pong takes 37 us): the
    /// one-way control message that ends a rendezvous gets no reply, and
    /// its send's completion is waited on. 1 us acknowledged a stream
    /// whose frames come further apart one frame at a time (the engine's
    /// simulation of 64 KiB messages: five times the acks, 80% of lossless
    /// goodput at 5% loss where 2 and 5 us give 85%).
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
    /// The job key a request carries (0: none): see
    /// [`EndpointConfig::job`](crate::EndpointConfig::job).
    pub job: u64,
    /// This side's Nic token, announced in its request or accept (0:
    /// none): see [`ConnAttrs::nic`].
    pub nic: u64,
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
            window_bytes: 2 << 20,
            lossy_window_bytes: 512 << 10,
            ack_delay: Duration::from_micros(2),
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
            job: 0,
            nic: 0,
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
            job: self.job,
            nic: self.nic,
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
    /// The receive descriptor's memory could not be written
    /// ([`Memory::write_recv`] refused it).
    Protection,
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
    /// `false` if the descriptor's memory can no longer be written (it was
    /// deregistered after the post): nothing is written, and the descriptor
    /// completes with [`Outcome::Protection`].
    fn write_recv(&mut self, rsn: u32, offset: u32, data: &[u8]) -> bool;
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

/// How far past the oldest unacknowledged frame a sender may go, in
/// windows: [`Config::window`] bounds the frames in flight and not yet
/// acknowledged, and a lost frame's retransmission, which waits behind
/// every frame queued before it, does not stop the stream while it travels.
/// The receiver keeps this many windows of arrivals.
const SPAN: u32 = 4;

/// Most RDMA reads a target answers at once: a peer has at most a send
/// queue's worth outstanding (a uvia VI's queues hold up to 4,096
/// descriptors), and the answers owed are kept until acknowledged.
const MAX_READS_OWED: usize = 4096;

/// Lossy windows' worth of bytes acknowledged with no frame lost before the
/// sender's byte window opens again ([`Config::lossy_window_bytes`]): 8 MiB
/// at the defaults, some hundred 64 KiB messages. At 1% loss a frame goes
/// missing every 6.5 MB of 64 KiB frames, so the window stays narrow.
const CLEAN_TO_REOPEN: u32 = 16;

/// Longest send that goes into a bundle with others: the per-frame costs a
/// bundle shares (a medium's system call and its kernel path, the
/// receiver's frame handling) outweigh a copy only for small messages.
const BUNDLE_MAX_MSG: u32 = 256;
/// Most sends in one bundle.
const BUNDLE_MAX_COUNT: usize = 64;

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
    /// Whole sends the frame carries from `msn` on: 1, or more for a
    /// bundle (see [`wire::bundle`](crate::wire::bundle)).
    count: u16,
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
    /// That descriptor's memory refused a frame: it completes with a
    /// protection error.
    refused: bool,
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
    /// The last keep-alive to the peer's Nic went from another connection
    /// ([`heard_elsewhere`](Self::heard_elsewhere)): this one's keep-alive
    /// timer waits longer ([`arm_liveness`](Self::arm_liveness)).
    kept_elsewhere: bool,
    /// Another connection to the peer's Nic keeps it alive and watches it
    /// for silence ([`set_kept`](Self::set_kept)): this one arms neither
    /// its keep-alive nor its idle timeout.
    kept: bool,

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
    /// Payload bytes acknowledged since a frame was last found lost (from
    /// the start: a new connection's path is taken as clean). Below
    /// [`CLEAN_TO_REOPEN`] windows the lossy window bounds what is in
    /// flight.
    clean_bytes: u32,
    /// Frames in flight not yet acknowledged (cumulatively or selectively):
    /// what [`Config::window`] bounds.
    pipe: u32,
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
    /// The acknowledgement that came on the last data frame, not yet
    /// applied: the frame's payload reaches the application first (see
    /// [`settle`](Self::settle)). Its `ack` and `done`.
    piggybacked: Option<(u32, u32)>,
    /// Data frames built since the last settle, the newest records of
    /// `inflight`: their time and timers are the settle's.
    sent_unarmed: u32,
    /// A data frame was heard whose liveness timers (idle, keep-alive)
    /// are not moved yet.
    heard_unarmed: bool,
    /// A data frame was taken in whose delayed ack is not armed yet (none
    /// is, if an answer carried the ack first).
    ack_unarmed: bool,

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
    /// The frame expected after the newest one taken in, where a large
    /// message is in progress ([`expected`](Self::expected)).
    next_in: Option<place::Expected>,
    /// Payload bytes received since the last ack.
    ack_bytes: u32,
    ack_now: bool,
    /// `ack_now` was set by the byte rule alone (a quarter of the lossy
    /// window taken in), for the frames of a message still arriving: if
    /// its last frame comes before the ack goes out (in the same receive
    /// batch), the ack waits for the delay like any message's, and the
    /// answer it may bring carries it.
    ack_for_window: bool,
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
            rcv: SeqWindow::new(0, cfg.window * SPAN),
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
            kept_elsewhere: false,
            kept: false,
            msgs: VecDeque::new(),
            frame_cursor: 0,
            responses: VecDeque::new(),
            next_msn: 0,
            next_rsn: 0,
            snd_una: initial_psn,
            snd_nxt: initial_psn,
            inflight: VecDeque::new(),
            inflight_bytes: 0,
            clean_bytes: u32::MAX,
            pipe: 0,
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
            piggybacked: None,
            sent_unarmed: 0,
            heard_unarmed: false,
            ack_unarmed: false,
            in_msgs: VecDeque::new(),
            in_base: 0,
            recvs: VecDeque::new(),
            recv_base: 0,
            recvs_bound: 0,
            ack_pending: 0,
            newest_rx: None,
            next_in: None,
            ack_bytes: 0,
            ack_for_window: false,
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

    /// The peer's Nic token, if its request or accept named one
    /// ([`ConnAttrs::nic`]).
    pub fn peer_nic(&self) -> Option<u64> {
        self.peer.map(|a| a.nic).filter(|&n| n != 0)
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// An acknowledgement is owed the peer: its timer runs, or it is due.
    #[inline]
    pub fn owes_ack(&self) -> bool {
        self.ack_pending > 0 || self.ack_now
    }

    /// When the delayed acknowledgement goes if no frame carries it first
    /// (armed by the settle after the data came; none while the answer
    /// carried it).
    #[inline]
    pub fn ack_deadline(&self) -> Option<Instant> {
        self.timers.get(Timer::Ack)
    }

    /// Frames sent again so far ([`Stats::retransmitted`]).
    #[inline]
    pub fn retransmitted(&self) -> u64 {
        self.stats.retransmitted
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
    pub fn post_send(&mut self, op: SendOp) -> Result<u32, PostError> {
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

    /// The next event, if any. Call after each `handle_*`, `post_*`,
    /// `poll_transmit` and [`settle`](Self::settle) until it returns `None`.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The failure or disconnection among the events not yet taken, if
    /// any: it comes after the completions it flushed, and a caller
    /// naming the reason beside them looks ahead for it.
    pub fn pending_end(&self) -> Option<Event> {
        self.events
            .iter()
            .copied()
            .find(|e| matches!(e, Event::Failed(_) | Event::Disconnected))
    }

    /// True while work left for [`settle`](Self::settle) waits.
    #[inline]
    pub fn unsettled(&self) -> bool {
        self.piggybacked.is_some()
            || self.sent_unarmed > 0
            || self.heard_unarmed
            || self.ack_unarmed
    }

    /// Does the bookkeeping a message's way does not wait for: applies the
    /// acknowledgement the last data frame carried, moves the liveness
    /// timers it restarts and arms its delayed ack, and arms the timers of
    /// the data frames built since the last call. The sends the
    /// acknowledgement completes become events.
    ///
    /// A data frame's payload reaches the application first; its
    /// acknowledgement of this side's earlier frames (their records
    /// dropped, a round trip sampled, the timers moved, the sends
    /// completed) waits, and a ping-pong's reply leaves before it, carrying
    /// the ack the frame is owed (whose timer then needs no arming). A
    /// frame built leaves before its retransmission timer and probe are
    /// armed. Each timer is a clock addition or two, some 50 instructions
    /// each. A caller settles once its frames are out,
    /// and before it asks [`poll_timeout`](Self::poll_timeout); every
    /// method that reads or changes the sending side settles first
    /// (`handle_*`, `close`, and `poll_transmit` where a lost frame or a
    /// full window may be the acknowledgement's to clear).
    ///
    /// `now` is the time of the call: the data frames since the last one
    /// count as heard then, and their acknowledgement's round trip is
    /// measured to then. A caller that answers at once (a ping-pong's every
    /// message) settles within its answer's time, its clock read for the
    /// send; one that does not settles at its next poll.
    #[inline]
    pub fn settle(&mut self, now: Instant) {
        let sent = self.sent_unarmed as usize;
        if sent > 0 {
            // They left in the caller's transmission, just done.
            let n = self.inflight.len();
            for s in self.inflight.range_mut(n.saturating_sub(sent)..) {
                s.sent_at = now;
            }
        }
        let progress = match self.piggybacked.take() {
            Some((ack, done)) => self.on_ack(now, ack, done, &[]),
            None => false,
        };
        if sent > 0 {
            self.sent_unarmed = 0;
            self.arm_sent(now, progress);
        }
        if std::mem::take(&mut self.heard_unarmed) {
            self.last_rx = self.last_rx.max(now);
            self.arm_liveness();
        }
        if std::mem::take(&mut self.ack_unarmed) {
            self.arm_ack(now);
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
        // Sends the peer has acknowledged complete as such. (The connection
        // ends: the time its round trip would be measured to is no matter.)
        let last = self.last_rx;
        self.settle(last);
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
        self.pipe = 0;
        self.lost = 0;
        self.in_msgs.clear();
        self.timers.stop(Timer::Rto);
        self.timers.stop(Timer::Loss);
        self.timers.stop(Timer::Probe);
        self.timers.stop(Timer::Ack);
    }
}

/// The time for [`Conn::handle_frame_with`] and
/// [`Conn::poll_transmit_with`]: given, or read through the caller's clock
/// when first asked for, and kept for the rest of the call. A data frame
/// taken in on a settled connection, or a new one built, does not ask: a
/// poll that takes in one message, and the answer's transmission, read no
/// clock on the message's way. (The engine has no clock of its own: a
/// clock given no time reads through the caller's `source`.)
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    read: Option<Instant>,
    /// A time known to have passed, for what may be judged late (a
    /// keep-alive due): the last the caller read.
    floor: Option<Instant>,
    /// Where a time not given is read (never, for a clock given one).
    source: fn() -> Instant,
}

impl Clock {
    /// A clock that asks `source` (the system's, `Instant::now`) when first
    /// asked, and knows that `floor`, if any, has passed.
    pub fn since(floor: Option<Instant>, source: fn() -> Instant) -> Clock {
        Clock {
            read: None,
            floor,
            source,
        }
    }

    /// A clock that says `now`.
    pub fn at(now: Instant) -> Clock {
        Clock {
            read: Some(now),
            floor: None,
            source: Instant::now,
        }
    }

    /// The time: the one given or read first.
    #[inline]
    pub fn now(&mut self) -> Instant {
        *self.read.get_or_insert_with(self.source)
    }

    /// The time, if it was given or read.
    pub fn read(&self) -> Option<Instant> {
        self.read
    }

    /// A time not after now: the one given or read, else the floor, else
    /// now. What is due by it is due; what is not may be by now.
    pub fn at_least(&mut self) -> Instant {
        match self.read.or(self.floor) {
            Some(t) => t,
            None => self.now(),
        }
    }
}
