//! VIs between hosts: the protocol engine ([`uvia_proto::Conn`], one per
//! VI) driven over a network medium ([`uvia_net::Medium`], one per Nic).
//!
//! Progress runs inside the caller's post, done and wait calls, as on `shm`:
//! whoever polls reads what the medium has, hands each frame to the VI it
//! names (by connection id) and sends what the engines want sent. The engine
//! moves payload straight between frames and the descriptors' registered
//! memory through [`ViMem`]; completions come back as engine events and are
//! written into the descriptors here.

use super::{EntryState, Posted, SlotQueue, Vi, ViInner, ViShared, ViState};
use crate::cm::{Discriminator, NetAddress, RemoteViAttributes};
use crate::desc::{status, Descriptor, MemHandle, Op};
use crate::error::{ConnectError, PostError};
use crate::mem::RegionTable;
use crate::vi::{Queue, Reliability, ViAttributes};
use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, ToSocketAddrs};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use uvia_net::{Addr, Medium, OutFrame, RecvBatch};
use uvia_proto::wire::{self, ConnAttrs, NakCode, RejectReason, Repr};
use uvia_proto::{Config, Conn, Event, Level, Memory, Outcome, RnrPolicy, SendKind, SendOp};

/// Most frames gathered before one call to the medium.
const TX_BATCH: usize = 32;
/// A post this soon after the previous transmission joins a burst.
const COALESCE: Duration = Duration::from_micros(5);
/// Empty polls between two looks at a network VI's timers.
const TIMER_EVERY: u32 = 16;
/// Pause before a message the receiver was not ready for goes again.
const RNR_DELAY: Duration = Duration::from_micros(200);
/// Requests refused recently, answered again without asking anyone.
const REJECTED_MEMORY: usize = 64;

/// A connection request waiting for a server's answer.
#[derive(Clone, Debug)]
pub(crate) struct Incoming {
    pub from: Addr,
    pub peer_id: u32,
    pub attrs: ConnAttrs,
}

/// Makes a per-peer medium.
pub(crate) type OwnMediumFactory = Box<dyn Fn(Addr) -> Option<Box<dyn Medium>> + Send + Sync>;

/// The network half of a Nic: its medium and the table of connections.
pub(crate) struct NetNic {
    pub medium: Box<dyn Medium>,
    /// Makes a VI a medium of its own for one peer (a connected UDP
    /// socket on the Nic's address), when the medium allows it.
    pub own_medium: Option<OwnMediumFactory>,
    pub max_frame: usize,
    /// The medium delivers frames intact or not at all: checksums are not
    /// verified here, and peers are told they may leave them out.
    intact: bool,
    /// The medium lends its buffers: frames are parsed where they arrived
    /// and built where they leave from, with no copy in between.
    pub lends: bool,
    /// The interface of an Ethernet medium: peers' MAC addresses are
    /// looked up in its neighbour table.
    iface: Option<String>,
    pub idle_timeout: Duration,
    /// Local connection id -> its VI.
    conns: spin::Mutex<HashMap<u32, Weak<ViShared>>>,
    /// (peer address, peer connection id) -> local id, so a repeated
    /// request reaches the connection it made.
    accepted: spin::Mutex<HashMap<(Addr, u32), u32>>,
    /// Discriminators someone waits on, with requests not yet taken.
    listening: spin::Mutex<HashMap<Vec<u8>, VecDeque<Incoming>>>,
    rejected: spin::Mutex<VecDeque<(Addr, u32, RejectReason)>>,
    /// Peer-to-peer connections being made: our discriminator -> (the
    /// peer's address, our connection id).
    peers: spin::Mutex<HashMap<Vec<u8>, (Addr, u32)>>,
    rx: std::sync::Mutex<RxState>,
    next_id: AtomicU32,
    /// Frames that failed the checksum or did not parse.
    pub malformed: AtomicU64,
    /// Frames a VI's own medium received for another connection, or a
    /// connection request: two connections to one peer share the 4-tuple
    /// of their connected sockets, so either socket may get the other's
    /// frames (and a request for a new one). They wait here for the next
    /// look at the Nic's socket, which hands them on as it hands on its own.
    strays: spin::Mutex<Vec<(Addr, Vec<u8>)>>,
    has_strays: std::sync::atomic::AtomicBool,
}

struct RxState {
    batch: RecvBatch,
    /// For frames answered without a VI (rejects, disconnect acks).
    reply: Vec<u8>,
}

impl NetNic {
    pub fn new(
        medium: Box<dyn Medium>,
        own_medium: Option<OwnMediumFactory>,
        iface: Option<String>,
        idle_timeout: Duration,
    ) -> NetNic {
        let caps = medium.caps().clone();
        // Connection ids start somewhere different in each Nic, so frames of
        // an earlier run's connection do not land on a new one.
        let seed = std::process::id()
            ^ Instant::now().elapsed().subsec_nanos()
            ^ (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
                << 8);
        NetNic {
            max_frame: caps.max_frame,
            intact: caps.intact,
            lends: caps.lends,
            iface,
            idle_timeout,
            conns: spin::Mutex::new(HashMap::new()),
            accepted: spin::Mutex::new(HashMap::new()),
            listening: spin::Mutex::new(HashMap::new()),
            rejected: spin::Mutex::new(VecDeque::new()),
            peers: spin::Mutex::new(HashMap::new()),
            rx: std::sync::Mutex::new(RxState {
                // A medium that lends its frames needs no batch of its own.
                batch: match caps.lends {
                    true => RecvBatch::new(1, 1),
                    false => RecvBatch::new(caps.max_batch.clamp(1, 64), 65_536),
                },
                reply: vec![0; 256],
            }),
            next_id: AtomicU32::new(seed | 1),
            malformed: AtomicU64::new(0),
            strays: spin::Mutex::new(Vec::new()),
            has_strays: std::sync::atomic::AtomicBool::new(false),
            medium,
            own_medium,
        }
    }

    /// Checks and parses a frame from the medium.
    fn parse<'a>(&self, bytes: &'a [u8]) -> Result<(u32, u32, Repr<'a>), wire::WireError> {
        if self.intact {
            wire::parse_intact(bytes)
        } else {
            wire::parse(bytes)
        }
    }

    fn new_id(&self) -> u32 {
        loop {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            if id != 0 {
                return id;
            }
        }
    }

    /// Starts queueing requests for `discriminator`.
    pub fn listen(&self, discriminator: &[u8]) {
        self.listening
            .lock()
            .entry(discriminator.to_vec())
            .or_default();
    }

    pub fn stop_listening(&self, discriminator: &[u8]) {
        self.listening.lock().remove(discriminator);
    }

    /// The oldest request waiting on `discriminator`.
    pub fn take_request(&self, discriminator: &[u8]) -> Option<Incoming> {
        self.listening
            .lock()
            .get_mut(discriminator)
            .and_then(|q| q.pop_front())
    }

    /// Answers a request with a refusal, now and for its repetitions.
    pub fn reject(&self, req: &Incoming, reason: RejectReason) {
        {
            let mut r = self.rejected.lock();
            if r.len() == REJECTED_MEMORY {
                r.pop_front();
            }
            r.push_back((req.from, req.peer_id, reason));
        }
        let mut buf = [0u8; 64];
        let n = Conn::reject_frame(&mut buf, req.peer_id, reason);
        let _ = self.medium.send(&[OutFrame {
            to: req.from,
            bytes: &buf[..n],
        }]);
    }

    fn register(&self, id: u32, vi: &Arc<ViShared>) {
        self.conns.lock().insert(id, Arc::downgrade(vi));
    }

    pub fn unregister(&self, id: u32) {
        self.conns.lock().remove(&id);
        self.accepted.lock().retain(|_, v| *v != id);
    }

    /// Reads what has arrived and hands each frame to its VI. `me` is the
    /// calling VI, already locked. Returns true if any frame arrived. Only
    /// one caller polls at a time; the others return at once (they are
    /// served by the one polling).
    pub fn poll(&self, mut me: Option<(&Vi, &mut ViInner)>) -> bool {
        let Ok(mut rx) = self.rx.try_lock() else {
            return false;
        };
        let RxState { batch, reply } = &mut *rx;
        // The polling VI's own frames (a ping-pong's every frame) go
        // straight to it, without the table.
        let my_id = me.as_ref().and_then(|(_, g)| g.net.as_ref()).map(|n| n.id);
        if self.has_strays.load(Ordering::Relaxed) && self.has_strays.swap(false, Ordering::Acquire)
        {
            let strays = std::mem::take(&mut *self.strays.lock());
            let now = Instant::now();
            for (from, bytes) in &strays {
                self.dispatch(*from, bytes, &mut me, my_id, now, reply);
            }
        }
        // The clock is read only when something arrived.
        let mut now = None;
        let mut on_frame = |from: Addr, bytes: &[u8]| {
            let now = *now.get_or_insert_with(Instant::now);
            self.dispatch(from, bytes, &mut me, my_id, now, reply);
        };
        let n = if self.lends {
            // Frames are read where the medium holds them.
            self.medium.recv_lent(&mut on_frame)
        } else {
            self.medium.recv(batch).inspect(|&n| {
                for i in 0..n {
                    let (from, bytes) = batch.frame(i);
                    on_frame(from, bytes);
                }
            })
        };
        n.is_ok_and(|n| n > 0)
    }

    /// Hands one arrived frame to the VI it is for.
    fn dispatch(
        &self,
        from: Addr,
        bytes: &[u8],
        me: &mut Option<(&Vi, &mut ViInner)>,
        my_id: Option<u32>,
        now: Instant,
        reply: &mut [u8],
    ) {
        let Ok((dst, src, repr)) = self.parse(bytes) else {
            self.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if dst == 0 {
            match repr {
                Repr::ConnRequest {
                    attrs,
                    discriminator,
                } => self.on_request(from, src, attrs, discriminator, me, now, reply),
                Repr::PeerRequest { discriminator, .. } => {
                    // Known already (a repetition), or a VI of ours asking
                    // that peer on this discriminator.
                    let known = self.accepted.lock().get(&(from, src)).copied();
                    let id = known.or_else(|| {
                        self.peers
                            .lock()
                            .get(discriminator)
                            .filter(|(a, _)| *a == from)
                            .map(|(_, id)| *id)
                    });
                    if let Some(id) = id {
                        self.deliver(id, from, src, &repr, me, now);
                    }
                }
                _ => {}
            }
            return;
        }
        if Some(dst) == my_id {
            if let Some((vi, g)) = me {
                vi.net_input(g, from, src, &repr, now);
                return;
            }
        }
        let target = self.conns.lock().get(&dst).and_then(Weak::upgrade);
        let Some(target) = target else {
            if matches!(repr, Repr::Disconnect { .. }) {
                // The connection is gone already; say so, so the peer does
                // not keep asking.
                let n = Conn::disconnect_ack_frame(reply, src, dst);
                let _ = self.medium.send(&[OutFrame {
                    to: from,
                    bytes: &reply[..n],
                }]);
            }
            return;
        };
        match me {
            Some((vi, g)) if Arc::ptr_eq(&vi.s, &target) => {
                vi.net_input(g, from, src, &repr, now);
            }
            _ => {
                let vi = Vi { s: target };
                let mut g = vi.lock();
                vi.net_input(&mut g, from, src, &repr, now);
                vi.net_output(&mut g, now);
            }
        }
    }

    /// Hands a frame to the VI of connection `id`.
    fn deliver(
        &self,
        id: u32,
        from: Addr,
        src: u32,
        repr: &Repr<'_>,
        me: &mut Option<(&Vi, &mut ViInner)>,
        now: Instant,
    ) {
        let Some(target) = self.conns.lock().get(&id).and_then(Weak::upgrade) else {
            return;
        };
        match me {
            Some((vi, g)) if Arc::ptr_eq(&vi.s, &target) => vi.net_input(g, from, src, repr, now),
            _ => {
                let vi = Vi { s: target };
                let mut g = vi.lock();
                vi.net_input(&mut g, from, src, repr, now);
                vi.net_output(&mut g, now);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_request(
        &self,
        from: Addr,
        peer_id: u32,
        attrs: ConnAttrs,
        discriminator: &[u8],
        me: &mut Option<(&Vi, &mut ViInner)>,
        now: Instant,
        reply: &mut [u8],
    ) {
        // A repetition of a request already accepted: its connection
        // answers (with the accept again).
        let known = self.accepted.lock().get(&(from, peer_id)).copied();
        if let Some(id) = known {
            let repr = Repr::ConnRequest {
                attrs,
                discriminator,
            };
            self.deliver(id, from, peer_id, &repr, me, now);
            return;
        }
        let refused = self
            .rejected
            .lock()
            .iter()
            .find(|(a, p, _)| *a == from && *p == peer_id)
            .map(|(_, _, r)| *r);
        let reason = match refused {
            Some(r) => Some(r),
            None => {
                let mut ls = self.listening.lock();
                match ls.get_mut(discriminator) {
                    Some(q) => {
                        if !q.iter().any(|r| r.from == from && r.peer_id == peer_id) {
                            q.push_back(Incoming {
                                from,
                                peer_id,
                                attrs,
                            });
                        }
                        None
                    }
                    None => Some(RejectReason::NoListener),
                }
            }
        };
        if let Some(reason) = reason {
            let n = Conn::reject_frame(reply, peer_id, reason);
            let _ = self.medium.send(&[OutFrame {
                to: from,
                bytes: &reply[..n],
            }]);
        }
    }
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
    handshake: Option<Event>,
    /// When frames last went to the medium.
    last_tx: Option<Instant>,
    /// A message arrived since frames last went: a post now answers it.
    answering: bool,
    /// Posts whose frames wait for the next progress call (coalesced).
    deferred: u32,
    /// The VI's own medium for its peer, when the Nic's allows one: frames
    /// of this connection come and go there, with no table lookup.
    own: Option<Arc<dyn Medium>>,
    own_batch: Option<RecvBatch>,
}

impl NetVi {
    /// The VI is gone: tell the peer (once; its idle timeout covers a lost
    /// frame) and forget the connection id.
    pub(crate) fn drop_connection(nic: &crate::nic::NicShared, mut n: Box<NetVi>) {
        let net = nic.net();
        if n.conn.is_connected() {
            // Acknowledge what arrived, then say goodbye (once; the peer's
            // idle timeout covers a lost frame). Every descriptor is gone,
            // so the engine has no payload to ask for.
            let now = Instant::now();
            n.conn.close(now);
            let mut buf = [0u8; 256];
            for _ in 0..4 {
                let Some(len) = n.conn.poll_transmit(now, &mut buf, &mut NoMemory) else {
                    break;
                };
                let f = [OutFrame {
                    to: n.peer,
                    bytes: &buf[..len],
                }];
                let _ = match &n.own {
                    Some(m) => m.send(&f),
                    None => net.medium.send(&f),
                };
            }
        }
        net.unregister(n.id);
    }

    fn new(conn: Conn, peer: Addr, id: u32, max_frame: usize) -> Box<NetVi> {
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
            own: None,
            own_batch: None,
        })
    }
}

impl NetVi {
    /// Up to a batch of the engine's frames, built in `tx` and handed to
    /// `medium` in one call. Returns how many frames there were.
    fn send_copied(&mut self, medium: &dyn Medium, now: Instant, mem: &mut ViMem<'_>) -> usize {
        let frame = self.tx.len() / TX_BATCH;
        self.tx_lens.clear();
        while self.tx_lens.len() < TX_BATCH {
            let at = self.tx_lens.len() * frame;
            match self
                .conn
                .poll_transmit(now, &mut self.tx[at..at + frame], mem)
            {
                Some(n) => self.tx_lens.push(n),
                None => break,
            }
        }
        let k = self.tx_lens.len();
        if k > 0 {
            uvia_trace::mark!(ProtoBuilt);
            let empty = OutFrame {
                to: self.peer,
                bytes: &[],
            };
            let mut frames: [OutFrame<'_>; TX_BATCH] = [empty; TX_BATCH];
            for (i, &n) in self.tx_lens.iter().enumerate() {
                frames[i].bytes = &self.tx[i * frame..i * frame + n];
            }
            let _ = medium.send(&frames[..k]);
        }
        k
    }

    /// Up to a batch of the engine's frames, each built straight in the
    /// transmit buffer `medium` lends (one copy of the payload, from
    /// registered memory to where the kernel or device takes it).
    fn send_built(&mut self, medium: &dyn Medium, now: Instant, mem: &mut ViMem<'_>) -> usize {
        let conn = &mut self.conn;
        let mut build = |room: &mut [u8]| {
            let n = conn.poll_transmit(now, room, mem);
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
struct NoMemory;

impl Memory for NoMemory {
    fn read_send(&mut self, _: u32, _: u32, buf: &mut [u8]) {
        buf.fill(0);
    }
    fn write_recv(&mut self, _: u32, _: u32, _: &[u8]) {}
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
struct ViMem<'a> {
    regions: &'a RegionTable,
    attrs: &'a ViAttributes,
    sq: &'a SlotQueue,
    rq: &'a SlotQueue,
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

/// Copies `data` into the entry's ranges at `offset`.
fn scatter_at(e: &Posted, offset: usize, data: &[u8]) {
    pieces(e, offset, data.len(), |p, at, n| {
        // SAFETY: as in `gather_at`, the other way.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(at), p, n) }
    });
}

impl Memory for ViMem<'_> {
    fn read_send(&mut self, msn: u32, offset: u32, buf: &mut [u8]) {
        match entry(self.sq, msn) {
            Some(e) if e.still_registered(self.regions) => gather_at(e, offset as usize, buf),
            // Deregistered under a posted descriptor: the caller broke the
            // contract; send zeros rather than touch freed memory.
            _ => buf.fill(0),
        }
    }

    fn write_recv(&mut self, rsn: u32, offset: u32, data: &[u8]) {
        if let Some(e) = entry(self.rq, rsn) {
            if e.still_registered(self.regions) {
                scatter_at(e, offset as usize, data);
            }
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
        check_rdma(self.regions, self.attrs, rkey, raddr, len as u64, write)
    }

    fn rdma_write(&mut self, rkey: u32, raddr: u64, data: &[u8]) -> Result<(), NakCode> {
        check_rdma(
            self.regions,
            self.attrs,
            rkey,
            raddr,
            data.len() as u64,
            true,
        )?;
        // SAFETY: the range was just checked against this Nic's registered
        // regions, the VI's tag and the enable bits.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), raddr as *mut u8, data.len()) };
        Ok(())
    }

    fn rdma_read(&mut self, rkey: u32, raddr: u64, buf: &mut [u8]) {
        if check_rdma(
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
        // SAFETY: as in `rdma_write`, for reading.
        unsafe { std::ptr::copy_nonoverlapping(raddr as *const u8, buf.as_mut_ptr(), buf.len()) };
    }
}

fn check_rdma(
    regions: &RegionTable,
    attrs: &ViAttributes,
    rkey: u32,
    raddr: u64,
    len: u64,
    write: bool,
) -> Result<(), NakCode> {
    let r = regions
        .check(MemHandle(rkey), attrs.ptag, raddr, len)
        .map_err(|_| NakCode::Protection)?;
    let allowed = if write {
        r.attrs.enable_rdma_write && attrs.enable_rdma_write
    } else {
        r.attrs.enable_rdma_read && attrs.enable_rdma_read
    };
    if allowed {
        Ok(())
    } else {
        Err(NakCode::Protection)
    }
}

fn level(r: Reliability) -> Level {
    match r {
        Reliability::Unreliable => Level::Unreliable,
        Reliability::ReliableDelivery => Level::ReliableDelivery,
        Reliability::ReliableReception => Level::ReliableReception,
    }
}

fn reliability(l: u8) -> Reliability {
    Reliability::from_u8(l).unwrap_or(Reliability::Unreliable)
}

fn outcome_bits(o: Outcome) -> u32 {
    match o {
        Outcome::Ok => 0,
        Outcome::Length => status::LENGTH_ERROR,
        Outcome::Remote(NakCode::Protection) | Outcome::Remote(NakCode::Operation) => {
            status::RDMA_PROT_ERROR
        }
        Outcome::Remote(_) => status::REMOTE_DESC_ERROR,
        Outcome::Transport => status::TRANSPORT_ERROR,
        Outcome::Flushed => status::DESC_FLUSHED_ERROR,
    }
}

impl NetNic {
    /// True if `host` is written as a literal address of this medium.
    pub(crate) fn is_address(&self, host: &str) -> bool {
        match self.medium.local_addr() {
            Addr::Mac(_) => host.parse::<uvia_net::MacAddr>().is_ok(),
            Addr::Ip(_) => host.parse::<SocketAddr>().is_ok(),
        }
    }

    /// The medium address of a [`NetAddress`]'s host: on an Ethernet
    /// medium a MAC address, or an IPv4 address or host name looked up in
    /// the interface's neighbour table; otherwise an IP address and port.
    pub(crate) fn resolve(&self, host: &str) -> Result<Addr, ConnectError> {
        match (&self.iface, self.medium.local_addr()) {
            (iface, Addr::Mac(_)) => uvia_net::neigh::resolve(host, iface.as_deref())
                .map(Addr::Mac)
                .map_err(|e| ConnectError::BadAddress(format!("{host:?}: {e}"))),
            (_, Addr::Ip(_)) => resolve(host),
        }
    }
}

/// Parses a host of a [`NetAddress`]: `ip:port`, `[v6]:port`, or
/// `name:port` resolved by the system.
pub(crate) fn resolve(host: &str) -> Result<Addr, ConnectError> {
    if let Ok(a) = host.parse::<SocketAddr>() {
        return Ok(Addr::Ip(a));
    }
    host.to_socket_addrs()
        .ok()
        .and_then(|mut it| it.next())
        .map(Addr::Ip)
        .ok_or_else(|| {
            ConnectError::BadAddress(format!("{host:?} (want ip:port, [ipv6]:port or name:port)"))
        })
}

impl Vi {
    fn net_config(&self, attrs: &ViAttributes) -> Config {
        let net = self.s.nic.net();
        Config {
            level: level(attrs.reliability),
            max_frame: net.max_frame as u32,
            max_transfer: attrs.max_transfer_size,
            rdma_write: attrs.enable_rdma_write,
            rdma_read: attrs.enable_rdma_read,
            idle_timeout: net.idle_timeout,
            keepalive: net.idle_timeout / 4,
            intact: net.intact,
            rnr: if attrs.rnr_retry {
                // Sent again every RNR_DELAY until the idle timeout's worth
                // of tries has passed.
                RnrPolicy::Retry {
                    delay: RNR_DELAY,
                    limit: (net.idle_timeout.as_micros() / RNR_DELAY.as_micros()).max(1) as u32,
                }
            } else {
                RnrPolicy::Fail
            },
            ..Config::default()
        }
    }

    /// Hands a frame to this VI's engine.
    fn net_input(&self, g: &mut ViInner, from: Addr, src: u32, repr: &Repr<'_>, now: Instant) {
        let ViInner {
            net, sq, rq, attrs, ..
        } = g;
        let Some(net) = net.as_mut() else {
            return;
        };
        if from != net.peer {
            return;
        }
        let mut mem = ViMem {
            regions: &self.s.nic.regions,
            attrs,
            sq,
            rq,
        };
        uvia_trace::mark!(ProtoIn);
        net.conn.handle_frame(now, src, repr, &mut mem);
        uvia_trace::mark!(ProtoPlaced);
        self.net_events(g);
    }

    /// Sends what the engine has to send and applies its events.
    pub(super) fn net_output(&self, g: &mut ViInner, now: Instant) -> bool {
        let nic = self.s.nic.net();
        let mut sent = false;
        loop {
            let ViInner {
                net, sq, rq, attrs, ..
            } = &mut *g;
            let Some(net) = net.as_mut() else {
                return sent;
            };
            let mut mem = ViMem {
                regions: &self.s.nic.regions,
                attrs,
                sq,
                rq,
            };
            net.deferred = 0;
            // A local send failure is a lost frame to the engine: the
            // reliable levels send it again, the unreliable one lost it.
            // (The VI's own medium is moved out for the call, not cloned:
            // no reference count touched per send.)
            let own = net.own.take();
            let k = match &own {
                Some(own) => net.send_copied(&**own, now, &mut mem),
                None if nic.lends => net.send_built(&*nic.medium, now, &mut mem),
                None => net.send_copied(&*nic.medium, now, &mut mem),
            };
            net.own = own;
            if k > 0 {
                // After the call: a burst is judged by the gap between the
                // end of one transmission and the next post.
                net.last_tx = Some(Instant::now());
                net.answering = false;
                sent = true;
            }
            self.net_events(g);
            if k < TX_BATCH {
                return sent;
            }
        }
    }

    /// Writes engine completions into the descriptors.
    fn net_events(&self, g: &mut ViInner) -> bool {
        let mut moved = false;
        loop {
            let Some(ev) = g.net.as_mut().and_then(|n| n.conn.poll_event()) else {
                return moved;
            };
            moved = true;
            match ev {
                Event::SendDone { msn, outcome } => {
                    let first = g.sq.front().map(|e| e.id).unwrap_or(msn);
                    let i = msn.wrapping_sub(first) as usize;
                    if i < g.sq.len() {
                        let e = &mut g.sq[i];
                        if e.state != EntryState::Done {
                            self.complete_send(e, outcome_bits(outcome));
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
                    let first = g.rq.front().map(|e| e.id).unwrap_or(rsn);
                    let i = rsn.wrapping_sub(first) as usize;
                    if i < g.rq.len() {
                        let op = if remote_write {
                            status::OP_REMOTE_RDMA_WRITE
                        } else {
                            status::OP_RECEIVE
                        };
                        let len = if outcome == Outcome::Ok { len } else { 0 };
                        let e = &mut g.rq[i];
                        if e.state != EntryState::Done {
                            self.complete_recv(e, op, len, imm, outcome_bits(outcome));
                            g.rq_done += 1;
                        }
                        if let Some(n) = g.net.as_mut() {
                            n.answering = true;
                        }
                    }
                }
                Event::Connected | Event::Rejected(_) | Event::ConnectTimedOut => {
                    if let Some(n) = g.net.as_mut() {
                        n.handshake = Some(ev);
                    }
                }
                Event::Disconnected | Event::Failed(_) => {
                    // Every descriptor was completed by the engine first.
                    self.set_state(ViState::Error);
                }
            }
        }
    }

    /// Reads the VI's own medium and hands the frames to its engine.
    /// Returns the time the frames were taken in, if any arrived.
    fn net_poll_own(&self, g: &mut ViInner) -> Option<Instant> {
        let net = g.net.as_mut()?;
        let (Some(own), Some(mut batch)) = (net.own.clone(), net.own_batch.take()) else {
            return None;
        };
        let n = own.recv(&mut batch).unwrap_or(0);
        let mut at = None;
        if n > 0 {
            let now = Instant::now();
            at = Some(now);
            let id = net.id;
            for i in 0..n {
                let (from, bytes) = batch.frame(i);
                let Ok((dst, src, repr)) = self.s.nic.net().parse(bytes) else {
                    self.s.nic.net().malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                if dst == id {
                    self.net_input(g, from, src, &repr, now);
                } else {
                    let nic = self.s.nic.net();
                    nic.strays.lock().push((from, bytes.to_vec()));
                    nic.has_strays.store(true, Ordering::Release);
                }
            }
        }
        if let Some(net) = g.net.as_mut() {
            net.own_batch = Some(batch);
        }
        at
    }

    /// Gives an established connection a medium of its own, if the Nic can.
    fn net_own_medium(&self, g: &mut ViInner) {
        let nic = self.s.nic.net();
        let (Some(make), Some(net)) = (&nic.own_medium, g.net.as_mut()) else {
            return;
        };
        if let Some(m) = make(net.peer) {
            let slots = m.caps().max_batch.clamp(1, 16);
            net.own_batch = Some(RecvBatch::new(slots, 65_536));
            net.own = Some(Arc::from(m));
        }
    }

    /// The descriptor a CQ waiter polls for this VI's frames, on a network VI.
    pub(crate) fn net_fd(s: &Arc<ViShared>) -> Option<std::os::fd::RawFd> {
        let g = s.inner.lock();
        let net = g.net.as_ref()?;
        Some(match &net.own {
            Some(m) => m.fd(),
            None => s.nic.net().medium.fd(),
        })
    }

    /// The medium a sleeping waiter of this VI waits on.
    pub(super) fn net_wait_medium(&self, g: &ViInner) -> Option<Arc<dyn Medium>> {
        g.net.as_ref().and_then(|n| n.own.clone())
    }

    /// Moves a network VI forward: reads the medium, runs timers, sends.
    pub(super) fn net_progress(&self, g: &mut ViInner) -> bool {
        let nic = self.s.nic.net();
        let mut arrived = None;
        let got = match g.net.as_ref().is_some_and(|n| n.own.is_some()) {
            true => {
                arrived = self.net_poll_own(g);
                // Stray frames (repeated handshakes, other VIs) reach the
                // Nic's socket: look there now and then.
                let every = g.idle.wrapping_add(1).is_multiple_of(TIMER_EVERY);
                arrived.is_some() | (every && nic.poll(Some((self, &mut *g))))
            }
            false => nic.poll(Some((self, &mut *g))),
        };
        let deferred = g.net.as_ref().is_some_and(|n| n.deferred > 0);
        // The timers are looked at every few polls, arrivals or not: they
        // are tens of microseconds apart at the least, and a look (a clock
        // read on an empty poll, the deadlines compared) kept off most
        // messages' path is that much less latency.
        g.idle = g.idle.wrapping_add(1);
        let timers = g.idle.is_multiple_of(TIMER_EVERY);
        if !got && !deferred && !timers {
            return false;
        }
        // The time frames arrived is recent enough for the timers: a
        // second clock read would sit on the message's path.
        let now = arrived.unwrap_or_else(Instant::now);
        let mut moved = got;
        if let Some(net) = g.net.as_mut().filter(|_| timers) {
            if net.conn.poll_timeout().is_some_and(|t| t <= now) {
                net.conn.handle_timeout(now);
                moved = true;
            }
        }
        moved |= self.net_output(g, now);
        moved
    }

    /// Runs the engine's timers now and sends what they produced: for a
    /// waiter that has slept, whose few polls would otherwise leave the
    /// timers to the every-few-polls look.
    pub(super) fn net_timers(&self, g: &mut ViInner) {
        let now = Instant::now();
        if let Some(net) = g.net.as_mut() {
            if net.conn.poll_timeout().is_some_and(|t| t <= now) {
                net.conn.handle_timeout(now);
            }
        }
        self.net_output(g, now);
    }

    /// Posts a send-queue descriptor on a network VI and sends what can go now.
    ///
    /// # Safety
    /// As for [`Vi::post_send_raw`].
    pub(super) unsafe fn net_post_send(
        &self,
        g: &mut ViInner,
        d: NonNull<Descriptor>,
        owned: bool,
    ) -> Result<(), PostError> {
        let attrs = g.attrs;
        let len = g.sq.len();
        let Some(slot) = g.sq.next_free() else {
            return Err(PostError::QueueFull("send", len));
        };
        // SAFETY: forwarded from the caller.
        unsafe { super::prepare(&self.s.nic, &attrs, slot, d, owned, Queue::Send)? };
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
        let now = Instant::now();
        let Some(net) = g.net.as_mut() else {
            return Err(PostError::NotConnected(self.state()));
        };
        let msn = net.conn.post_send(now, op).map_err(|e| match e {
            uvia_proto::PostError::State => PostError::NotConnected(self.state()),
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
        let Some(slot) = g.sq.next_free() else {
            return Err(PostError::QueueFull("send", len));
        };
        uvia_trace::mark!(ViPosted);
        slot.id = msn;
        slot.state = EntryState::InFlight;
        g.sq.commit();
        g.sq_sent = g.sq.len();
        // Doorbell coalescing: a post that follows the last transmission
        // closely is part of a burst; its frames leave with the burst, at
        // the caller's next done or wait call (or once a batch is full), in
        // one system call. A lone post goes at once, and so does the first
        // post after a message arrived: that is an answer (a ping-pong's
        // reply comes well within the burst gap of the previous send).
        if let Some(net) = g.net.as_mut() {
            let burst = !net.answering
                && net
                    .last_tx
                    .is_some_and(|t| now.saturating_duration_since(t) < COALESCE);
            if burst && (net.deferred as usize) < TX_BATCH - 1 {
                net.deferred += 1;
                return Ok(());
            }
        }
        self.net_output(g, now);
        Ok(())
    }

    /// Tells the engine of a receive descriptor just queued at the back.
    pub(super) fn net_post_recv(&self, g: &mut ViInner) {
        let Some(net) = g.net.as_mut() else {
            return;
        };
        let i = g.rq.len() - 1;
        let cap = g.rq[i].total.min(u32::MAX as u64) as u32;
        if let Ok(rsn) = net.conn.post_recv(cap) {
            g.rq[i].id = rsn;
        }
    }

    /// Hands the engine every receive descriptor posted before it existed.
    fn net_adopt_recvs(&self, g: &mut ViInner) {
        let ViInner { net, rq, .. } = g;
        let Some(net) = net.as_mut() else {
            return;
        };
        for e in rq.iter_mut() {
            if e.state == EntryState::Done {
                continue;
            }
            if let Ok(rsn) = net.conn.post_recv(e.total.min(u32::MAX as u64) as u32) {
                e.id = rsn;
            }
        }
    }

    /// The client side of a connection over the network (VipConnectRequest).
    pub(super) fn net_connect(
        &self,
        remote: &NetAddress,
        local: Option<&Discriminator>,
        timeout: Duration,
    ) -> Result<RemoteViAttributes, ConnectError> {
        let start = Instant::now();
        let nic = self.s.nic.net();
        let to = nic.resolve(&remote.host)?;
        let id = nic.new_id();
        nic.register(id, &self.s);
        if let Some(d) = local {
            let mut peers = nic.peers.lock();
            if peers.contains_key(d.as_bytes()) {
                nic.unregister(id);
                return Err(ConnectError::InUse(d.to_string()));
            }
            peers.insert(d.as_bytes().to_vec(), (to, id));
        }
        let r = self.net_connect_inner(remote, local.is_some(), to, id, start, timeout);
        if let Some(d) = local {
            nic.peers.lock().remove(d.as_bytes());
        }
        match &r {
            Err(_) => {
                nic.unregister(id);
                self.lock().net = None;
            }
            Ok(_) => {
                // Repeated requests of the peer reach this connection.
                if let Some(pid) = self.lock().net.as_ref().map(|n| n.conn.peer_id()) {
                    nic.accepted.lock().insert((to, pid), id);
                }
            }
        }
        r
    }

    fn net_connect_inner(
        &self,
        remote: &NetAddress,
        peer_to_peer: bool,
        to: Addr,
        id: u32,
        start: Instant,
        timeout: Duration,
    ) -> Result<RemoteViAttributes, ConnectError> {
        let nic = self.s.nic.net();
        let mut last_no_listener = false;
        loop {
            {
                let mut g = self.lock();
                let mut cfg = self.net_config(&g.attrs);
                cfg.connect_timeout = timeout.saturating_sub(start.elapsed());
                let make = if peer_to_peer {
                    Conn::connect_peer
                } else {
                    Conn::connect
                };
                let conn = make(
                    Instant::now(),
                    cfg,
                    id,
                    initial_psn(id),
                    remote.discriminator.as_bytes(),
                );
                g.net = Some(NetVi::new(conn, to, id, nic.max_frame));
                self.net_adopt_recvs(&mut g);
            }
            // Drive the handshake until it ends one way or the other.
            let ev = loop {
                {
                    let mut g = self.lock();
                    self.net_progress(&mut g);
                    if let Some(ev) = g.net.as_mut().and_then(|n| n.handshake.take()) {
                        break ev;
                    }
                }
                if start.elapsed() >= timeout {
                    break Event::ConnectTimedOut;
                }
                let _ = nic.medium.wait(Some(Duration::from_millis(5)));
            };
            match ev {
                Event::Connected => {
                    let mut g = self.lock();
                    let peer = g.net.as_ref().and_then(|n| n.conn.peer_attrs());
                    let Some(p) = peer else {
                        return Err(ConnectError::Protocol("accept without attributes"));
                    };
                    let remote = remote_attrs(&p);
                    g.remote = Some(remote.clone());
                    g.idle = 0;
                    self.net_own_medium(&mut g);
                    self.set_state(ViState::Connected);
                    return Ok(remote);
                }
                Event::Rejected(RejectReason::NoListener) if start.elapsed() < timeout => {
                    // Nobody waits there yet: ask again shortly, as a
                    // client of a local server waits for it to listen.
                    last_no_listener = true;
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                Event::Rejected(RejectReason::Mismatch) => {
                    return Err(ConnectError::Mismatch(
                        "the server's VI has another reliability level".to_string(),
                    ))
                }
                Event::Rejected(RejectReason::NoListener) => {
                    return Err(ConnectError::NoListener {
                        nic: remote.host.clone(),
                        discriminator: remote.discriminator.to_string(),
                        waited_ms: start.elapsed().as_millis() as u64,
                    })
                }
                Event::Rejected(_) => return Err(ConnectError::Rejected),
                _ => {
                    if last_no_listener {
                        return Err(ConnectError::NoListener {
                            nic: remote.host.clone(),
                            discriminator: remote.discriminator.to_string(),
                            waited_ms: start.elapsed().as_millis() as u64,
                        });
                    }
                    return Err(ConnectError::Timeout(start.elapsed().as_millis() as u64));
                }
            }
        }
    }

    /// The server side (ConnRequest::accept over the network).
    pub(crate) fn net_accept(&self, req: &Incoming) -> Result<(), ConnectError> {
        let nic = self.s.nic.net();
        let mut g = self.lock();
        let st = self.state();
        if st != ViState::Idle {
            nic.reject(req, RejectReason::Refused);
            return Err(ConnectError::InvalidState(st));
        }
        let theirs = reliability(req.attrs.reliability);
        if theirs != g.attrs.reliability {
            nic.reject(req, RejectReason::Mismatch);
            return Err(ConnectError::Mismatch(format!(
                "reliability level {:?} here, {:?} at the peer",
                g.attrs.reliability, theirs
            )));
        }
        let id = nic.new_id();
        let now = Instant::now();
        let cfg = self.net_config(&g.attrs);
        let conn = Conn::accept(now, cfg, id, initial_psn(id), req.peer_id, req.attrs);
        g.net = Some(NetVi::new(conn, req.from, id, nic.max_frame));
        self.net_own_medium(&mut g);
        self.net_adopt_recvs(&mut g);
        nic.register(id, &self.s);
        nic.accepted.lock().insert((req.from, req.peer_id), id);
        g.remote = Some(remote_attrs(&req.attrs));
        g.idle = 0;
        self.set_state(ViState::Connected);
        self.net_output(&mut g, now);
        Ok(())
    }

    /// Ends a network connection (VipDisconnect): the peer is told, every
    /// outstanding descriptor here completes as flushed.
    pub(super) fn net_disconnect(&self, g: &mut ViInner) {
        let now = Instant::now();
        if let Some(net) = g.net.as_mut() {
            net.conn.close(now);
        }
        self.net_output(g, now);
        if let Some(net) = g.net.take() {
            self.s.nic.net().unregister(net.id);
        }
    }
}

fn remote_attrs(a: &ConnAttrs) -> RemoteViAttributes {
    RemoteViAttributes {
        reliability: reliability(a.reliability),
        max_transfer_size: a.max_transfer,
        enable_rdma_write: a.rdma_write,
        enable_rdma_read: a.rdma_read,
    }
}

/// A first packet number that differs between connections, so a stale
/// frame of an earlier connection is unlikely to fall in the window.
fn initial_psn(id: u32) -> u32 {
    id.wrapping_mul(0x9e37_79b9) ^ 0x5bd1_e995
}
