//! A deterministic simulated network between two engines: virtual time, a
//! seeded random source, and faults (loss, duplication, reordering, delay,
//! bit corruption) applied to every frame in both directions. Each side's
//! frames go through its own [`Endpoint`] (addresses are side numbers), as
//! they would over a real medium: requests, refusals and rendezvous are the
//! engine's, not the simulator's.

#![allow(dead_code)]

use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};
use uvia_proto::wire::{self, Kind, NakCode, RejectReason};
use uvia_proto::{
    Config, Conn, Endpoint, EndpointConfig, EndpointEvent, Event, Incoming, Memory, Outcome,
    PrivateData, SendKind, SendOp,
};

/// The discriminator side 1 listens on and side 0 asks.
pub const DISCRIMINATOR: &[u8] = b"sim";

/// splitmix64: small, seeded, and the same on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub loss: f64,
    pub dup: f64,
    /// Chance a frame is held back by up to `reorder_by`.
    pub reorder: f64,
    pub reorder_by: Duration,
    pub corrupt: f64,
    /// One-way delay of every frame.
    pub delay: Duration,
}

/// Base address and key of each side's RDMA-enabled region.
pub const REGION_ADDR: u64 = 0x10_0000;
pub const REGION_KEY: u32 = 7;

/// One side's memory: send sources by msn, receive buffers by rsn, read
/// destinations by msn, and one RDMA region.
#[derive(Default)]
pub struct Mem {
    pub sends: VecDeque<(u32, Vec<u8>)>,
    pub recvs: VecDeque<(u32, Vec<u8>)>,
    pub reads: VecDeque<(u32, Vec<u8>)>,
    pub region: Vec<u8>,
    pub region_writable: bool,
    pub region_readable: bool,
}

fn find(q: &mut VecDeque<(u32, Vec<u8>)>, k: u32) -> Option<&mut Vec<u8>> {
    q.iter_mut().find(|(n, _)| *n == k).map(|(_, b)| b)
}

impl Memory for Mem {
    fn read_send(&mut self, msn: u32, offset: u32, buf: &mut [u8]) {
        let src = find(&mut self.sends, msn).expect("send source");
        buf.copy_from_slice(&src[offset as usize..offset as usize + buf.len()]);
    }

    fn write_recv(&mut self, rsn: u32, offset: u32, data: &[u8]) -> bool {
        let dst = find(&mut self.recvs, rsn).expect("receive buffer");
        dst[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        true
    }

    fn write_read(&mut self, msn: u32, offset: u32, data: &[u8]) {
        let dst = find(&mut self.reads, msn).expect("read destination");
        dst[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    }

    fn check_rdma(&mut self, rkey: u32, raddr: u64, len: u32, write: bool) -> Result<(), NakCode> {
        let ok_bits = if write {
            self.region_writable
        } else {
            self.region_readable
        };
        let end = raddr.checked_add(len as u64);
        if rkey != REGION_KEY
            || !ok_bits
            || raddr < REGION_ADDR
            || end.is_none_or(|e| e > REGION_ADDR + self.region.len() as u64)
        {
            return Err(NakCode::Protection);
        }
        Ok(())
    }

    fn rdma_write(&mut self, rkey: u32, raddr: u64, data: &[u8]) -> Result<(), NakCode> {
        self.check_rdma(rkey, raddr, data.len() as u32, true)?;
        let at = (raddr - REGION_ADDR) as usize;
        self.region[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn rdma_read(&mut self, _rkey: u32, raddr: u64, buf: &mut [u8]) {
        let at = (raddr - REGION_ADDR) as usize;
        buf.copy_from_slice(&self.region[at..at + buf.len()]);
    }
}

/// How a side without a connection answers a connection request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Accept,
    /// Refused by the listener; `NoListener` by not listening at all (the
    /// endpoint answers).
    Reject(RejectReason),
    /// A listener that never takes its requests: they go unanswered.
    Silent,
}

/// A completed receive descriptor.
#[derive(Clone, Debug)]
pub struct Recv {
    pub rsn: u32,
    /// Its buffer, cut to the completion's length.
    pub data: Vec<u8>,
    pub len: u32,
    pub imm: Option<u32>,
    pub remote_write: bool,
    pub outcome: Outcome,
}

pub struct Side {
    pub conn: Option<Conn>,
    pub endpoint: Endpoint<usize>,
    pub answer: Answer,
    /// Private data of this side's accept or reject.
    pub answer_private: PrivateData,
    /// Connection requests that reached this side.
    pub requests: u32,
    /// Requests this side's listener took, in order.
    pub incoming: Vec<Incoming<usize>>,
    /// Peer-to-peer: the discriminator this side's connection waits on.
    pub waits_on: Option<Vec<u8>>,
    pub mem: Mem,
    pub events: Vec<Event>,
    pub cfg: Config,
    pub id: u32,
}

impl Side {
    pub fn conn(&mut self) -> &mut Conn {
        self.conn.as_mut().expect("connection")
    }

    /// Posts a send of `data`; returns its msn.
    pub fn send(&mut self, data: Vec<u8>, imm: Option<u32>) -> u32 {
        let len = data.len() as u32;
        let msn = self
            .conn()
            .post_send(SendOp {
                kind: SendKind::Send,
                len,
                imm,
            })
            .expect("post send");
        self.mem.sends.push_back((msn, data));
        msn
    }

    pub fn post(&mut self, op: SendOp, data: Vec<u8>) -> u32 {
        let msn = self.conn().post_send(op).expect("post");
        match op.kind {
            SendKind::RdmaRead { .. } => self.mem.reads.push_back((msn, data)),
            _ => self.mem.sends.push_back((msn, data)),
        }
        msn
    }

    pub fn recv(&mut self, capacity: u32) -> u32 {
        let rsn = self.conn().post_recv(capacity).expect("post recv");
        self.mem.recvs.push_back((rsn, vec![0; capacity as usize]));
        rsn
    }

    /// Completed receives with everything their completion said, in order,
    /// since the last call.
    pub fn take_recvs_full(&mut self) -> Vec<Recv> {
        let mut out = vec![];
        let evs = std::mem::take(&mut self.events);
        for e in evs {
            if let Event::RecvDone {
                rsn,
                len,
                imm,
                remote_write,
                outcome,
            } = e
            {
                let i = self
                    .mem
                    .recvs
                    .iter()
                    .position(|(n, _)| *n == rsn)
                    .expect("receive buffer of a completion");
                let (_, mut data) = self.mem.recvs.remove(i).expect("index");
                data.truncate((len as usize).min(data.len()));
                out.push(Recv {
                    rsn,
                    data,
                    len,
                    imm,
                    remote_write,
                    outcome,
                });
            } else {
                self.events.push(e);
            }
        }
        out
    }

    /// Completed receives with their data, in order, since the last call.
    pub fn take_recvs(&mut self) -> Vec<(Vec<u8>, Option<u32>, Outcome)> {
        let mut out = vec![];
        let evs = std::mem::take(&mut self.events);
        for e in evs {
            if let Event::RecvDone {
                rsn,
                len,
                imm,
                outcome,
                ..
            } = e
            {
                let i = self
                    .mem
                    .recvs
                    .iter()
                    .position(|(n, _)| *n == rsn)
                    .expect("receive buffer of a completion");
                let (_, mut b) = self.mem.recvs.remove(i).expect("index");
                b.truncate((len as usize).min(b.len()));
                out.push((b, imm, outcome));
            } else {
                self.events.push(e);
            }
        }
        out
    }

    pub fn sends_done(&self) -> Vec<(u32, Outcome)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::SendDone { msn, outcome } => Some((*msn, *outcome)),
                _ => None,
            })
            .collect()
    }

    pub fn failed(&self) -> bool {
        self.events.iter().any(|e| matches!(e, Event::Failed(_)))
    }
}

struct InFlight {
    at: Instant,
    to: usize,
    bytes: Vec<u8>,
    seq: u64,
}

// Ordered by arrival (time, then the order frames were put on the wire),
// earliest first out of the max-heap.
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}

impl Eq for InFlight {}

pub struct Sim {
    pub now: Instant,
    pub start: Instant,
    pub rng: Rng,
    pub faults: [Faults; 2],
    pub sides: [Side; 2],
    net: BinaryHeap<InFlight>,
    seq: u64,
    /// Frames handed to the sides' endpoints.
    pub delivered: u64,
    /// Link rate of each direction in bytes per second (frames queue
    /// behind each other, so goodput means something).
    pub rate: f64,
    link_free: [Instant; 2],
    /// Another connection from each side to the other's Nic, hearing
    /// from it and pinging it this often (as a provider tells a
    /// connection when its timers come due; see `Conn::heard_elsewhere`).
    pub elsewhere: [Option<Duration>; 2],
    /// Times each side's timers came due (a provider's look at the VI).
    pub timer_looks: [u64; 2],
    buf: Vec<u8>,
    reply: [u8; wire::MAX_REPLY_LEN],
}

impl Sim {
    /// Two sides; side 0 connects to side 1, which accepts any request.
    pub fn new(seed: u64, cfg: Config, faults: Faults) -> Sim {
        let start = Instant::now();
        let mk = |id| Side {
            conn: None,
            endpoint: Endpoint::new(EndpointConfig::default()),
            answer: Answer::Accept,
            answer_private: PrivateData::EMPTY,
            requests: 0,
            incoming: vec![],
            waits_on: None,
            mem: Mem {
                region: vec![0; 1 << 16],
                region_writable: true,
                region_readable: true,
                ..Mem::default()
            },
            events: vec![],
            cfg: cfg.clone(),
            id,
        };
        let mut sim = Sim {
            now: start,
            start,
            rng: Rng::new(seed),
            faults: [faults, faults],
            sides: [mk(0x0a00_0001), mk(0x0b00_0002)],
            net: BinaryHeap::new(),
            seq: 0,
            delivered: 0,
            rate: 1.25e9,
            link_free: [start, start],
            elsewhere: [None, None],
            timer_looks: [0, 0],
            buf: vec![0; 1 << 17],
            reply: [0; wire::MAX_REPLY_LEN],
        };
        let id = sim.sides[0].id;
        sim.sides[0].conn = Some(Conn::connect(start, cfg, id, 1000, DISCRIMINATOR));
        sim.sides[0].endpoint.register(id, 1);
        sim
    }

    /// Makes side `side` a peer-to-peer connection asking the other side's
    /// connection that waits on `asks`, while its own waits on `waits_on`.
    pub fn connect_peer(&mut self, side: usize, psn: u32, asks: &[u8], waits_on: &[u8]) {
        let s = &mut self.sides[side];
        let c = Conn::connect_peer(self.now, s.cfg.clone(), s.id, psn, asks);
        s.conn = Some(c.with_private(s.answer_private));
        s.endpoint.register(s.id, 1 - side);
        s.endpoint
            .peer_connect(waits_on, 1 - side, s.id)
            .expect("one rendezvous per side");
        s.waits_on = Some(waits_on.to_vec());
    }

    /// Frames that failed to parse at either side (corruption caught by
    /// the checksum).
    pub fn malformed(&self) -> u64 {
        self.sides
            .iter()
            .map(|s| s.endpoint.stats().malformed)
            .sum()
    }

    /// Frames on the wire.
    pub fn in_flight(&self) -> usize {
        self.net.len()
    }

    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Runs until both sides are connected (or `limit` of virtual time passes).
    pub fn connect(&mut self, limit: Duration) -> bool {
        self.run_until(limit, |s| {
            s.sides
                .iter()
                .all(|x| x.conn.as_ref().is_some_and(|c| c.is_connected()))
                && s.sides[1].conn.as_ref().is_some_and(|c| c.is_connected())
        })
    }

    fn transmit(&mut self) {
        for i in 0..2 {
            loop {
                let side = &mut self.sides[i];
                let Some(conn) = side.conn.as_mut() else {
                    break;
                };
                // Every frame of every run checks the engine's promise: a
                // connection that says it has nothing to send sends nothing.
                let may = conn.may_transmit(self.now);
                let Some(n) = conn.poll_transmit(self.now, &mut self.buf, &mut side.mem) else {
                    break;
                };
                assert!(may, "side {i} built a frame after may_transmit said none");
                let bytes = self.buf[..n].to_vec();
                self.inject(1 - i, bytes);
            }
            // As a provider does once its frames are out: the ack the last
            // data frame carried is applied now.
            if let Some(conn) = self.sides[i].conn.as_mut() {
                conn.settle(self.now);
            }
        }
    }

    /// Puts `bytes` on the wire towards side `to`, under the faults of the
    /// other side's direction.
    pub fn inject(&mut self, to: usize, mut bytes: Vec<u8>) {
        let f = self.faults[1 - to];
        let wire = Duration::from_secs_f64(bytes.len() as f64 / self.rate);
        let depart = self.now.max(self.link_free[to]) + wire;
        self.link_free[to] = depart;
        if self.rng.chance(f.loss) {
            return;
        }
        if self.rng.chance(f.corrupt) {
            let bit = self.rng.below(bytes.len() as u64 * 8);
            bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
        }
        let copies = if self.rng.chance(f.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let mut at = depart + f.delay;
            if self.rng.chance(f.reorder) {
                at += Duration::from_nanos(self.rng.below(f.reorder_by.as_nanos() as u64 + 1));
            }
            self.seq += 1;
            self.net.push(InFlight {
                at,
                to,
                bytes: bytes.clone(),
                seq: self.seq,
            });
        }
    }

    fn deliver(&mut self, f: InFlight) {
        self.delivered += 1;
        let from = 1 - f.to;
        let side = &mut self.sides[f.to];
        let request = wire::Frame::new_checked(&f.bytes[..])
            .is_ok_and(|v| v.kind() == Kind::ConnRequest && v.dst_conn() == 0);
        side.requests += request as u32;
        match side.answer {
            Answer::Reject(RejectReason::NoListener) => side.endpoint.stop_listening(DISCRIMINATOR),
            _ => side.endpoint.listen(DISCRIMINATOR),
        }
        let ev = side
            .endpoint
            .handle(self.now, from, &f.bytes, &mut self.reply);
        match ev {
            None => {}
            Some(EndpointEvent::Frame { id, src, repr }) => {
                let conn = side.conn.as_mut().filter(|c| c.local_id() == id);
                let conn = conn.expect("the endpoint names only live connections");
                conn.handle_frame(self.now, src, &repr, &mut side.mem);
            }
            Some(EndpointEvent::Transmit { to, len }) => {
                let reply = self.reply[..len].to_vec();
                self.inject(to, reply);
            }
            Some(EndpointEvent::Request { .. }) => self.answer(f.to),
            Some(EndpointEvent::Forward { .. }) => {
                panic!("no process shares an address in the simulation")
            }
        }
    }

    /// Side `i`'s listener answers the requests it holds.
    fn answer(&mut self, i: usize) {
        let side = &mut self.sides[i];
        if side.answer == Answer::Silent || side.conn.is_some() {
            return;
        }
        let Some(req) = side.endpoint.take_request(DISCRIMINATOR) else {
            return;
        };
        side.incoming.push(req);
        match side.answer {
            Answer::Reject(reason) => {
                let mut b = [0u8; wire::MAX_REPLY_LEN];
                let n = side
                    .endpoint
                    .reject(&req, reason, &side.answer_private, &mut b);
                self.inject(req.from, b[..n].to_vec());
            }
            _ => {
                let c = Conn::accept(
                    self.now,
                    side.cfg.clone(),
                    side.id,
                    5000,
                    req.peer_id,
                    req.attrs,
                );
                side.conn = Some(c.with_private(side.answer_private));
                side.endpoint.register(side.id, req.from);
                side.endpoint.established(req.from, req.peer_id, side.id);
            }
        }
    }

    fn drain_events(&mut self) {
        for (i, s) in self.sides.iter_mut().enumerate() {
            if let Some(c) = s.conn.as_mut() {
                while let Some(e) = c.poll_event() {
                    if e == Event::Connected {
                        // Repeated requests of the peer reach it from now on.
                        s.endpoint.established(1 - i, c.peer_id(), c.local_id());
                        if let Some(d) = s.waits_on.take() {
                            s.endpoint.peer_done(&d);
                        }
                    }
                    s.events.push(e);
                }
            }
        }
    }

    /// Advances virtual time to the next thing that happens and does it.
    /// Returns false when nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.transmit();
        self.drain_events();
        let next_frame = self.net.peek().map(|f| (f.at, f.seq));
        let next_timer = self
            .sides
            .iter()
            .filter_map(|s| s.conn.as_ref().and_then(|c| c.poll_timeout()))
            .min();
        let t = match (next_frame, next_timer) {
            (None, None) => return false,
            (Some((f, _)), None) => f,
            (None, Some(t)) => t,
            (Some((f, _)), Some(t)) => f.min(t),
        };
        if t > self.now {
            self.now = t;
        }
        // Every frame due now, in arrival order.
        while self.net.peek().is_some_and(|f| f.at <= self.now) {
            let Some(f) = self.net.pop() else {
                break;
            };
            self.deliver(f);
        }
        for (i, s) in self.sides.iter_mut().enumerate() {
            if let Some(c) = s.conn.as_mut() {
                if c.poll_timeout().is_some_and(|d| d <= self.now) {
                    self.timer_looks[i] += 1;
                    if let Some(every) = self.elsewhere[i] {
                        let since = (self.now - self.start).as_nanos() % every.as_nanos();
                        let heard = self.now - Duration::from_nanos(since as u64);
                        c.heard_elsewhere(heard, Some(heard));
                    }
                    c.handle_timeout(self.now);
                }
            }
        }
        self.transmit();
        self.drain_events();
        true
    }

    /// Steps until `done` holds or `limit` of virtual time has passed.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Sim) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            if done(self) {
                return true;
            }
            if self.now > end || !self.step() {
                return done(self);
            }
        }
    }
}

/// Message `i`'s bytes: its index, then a pattern that depends on it.
pub fn message(i: u32, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len)
        .map(|k| (k as u32).wrapping_mul(31).wrapping_add(i.wrapping_mul(7)) as u8)
        .collect();
    for (k, b) in i.to_le_bytes().iter().enumerate() {
        if k < v.len() {
            v[k] = *b;
        }
    }
    v
}
