//! One network address's share of the protocol: which connection an
//! arriving frame is for, and the answers given without a connection
//! (connection requests queued for listeners or refused, disconnects of
//! connections already gone, peer-to-peer rendezvous).
//!
//! The caller feeds every frame its medium delivers to [`Endpoint::handle`]
//! and acts on the one [`EndpointEvent`] it returns: a frame for a
//! connection's [`Conn::handle_frame`](crate::Conn::handle_frame), a request
//! now waiting on a listener, or a reply already built to send. It owns no
//! socket, no clock and no lock; the address type `A` is the medium's.
//!
//!
//! Requests come from a peer's Nic, but a connection may send from an
//! address of its own (a UDP socket per connection, on a port of its own):
//! until [`Endpoint::joined`] names the address the peer's connection sends
//! from, frames naming a connection are taken from any address of its
//! peer's host ([`Endpoint::with_hosts`] says which are), then from that
//! one only.
//!
//! Several processes of a host may share one network address (a device, in
//! VIA's words): the endpoint that holds the address forwards a request
//! whose discriminator another process's endpoint waits on
//! ([`Endpoint::forward`]) to that process, which takes it in with
//! [`Endpoint::handle`] as if it had come from the requester, and answers
//! from its own addresses. Peer-to-peer requests are therefore taken from
//! any address of the peer's host.

use crate::conn::Conn;
use crate::wire::{self, ConnAttrs, PrivateData, RejectReason, Repr};
use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// An endpoint's settings.
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    /// The medium delivers frames intact or not at all: checksums are not
    /// verified ([`wire::parse_intact`]); otherwise every frame's is
    /// ([`wire::parse`]). As [`Config::intact`](crate::Config::intact).
    pub intact: bool,
    /// Where connection ids start. Choose it anew for each endpoint (from
    /// the time, the process id), so that frames of an earlier run's
    /// connection do not land on a new one.
    pub id_seed: u32,
    /// Most requests a listener holds, waiting to be taken or taken and
    /// not yet answered; one more is refused with [`RejectReason::Busy`].
    pub max_pending: usize,
    /// A request held this long without a repetition is dropped when room
    /// is needed: its client has stopped asking (clients repeat every
    /// [`Config::handshake_retry`](crate::Config::handshake_retry)).
    pub pending_timeout: Duration,
    /// How many refusals are remembered, so a repetition of a refused
    /// request gets the same answer without asking anyone.
    pub max_rejects: usize,
    /// Most refusals sent per second; requests refused beyond it get no
    /// answer (their clients ask again, and give up at their own timeout).
    /// A flood of requests then costs no reply each.
    pub refusals_per_second: u32,
    /// The job key listeners require (0: none): a request that carries
    /// another key, or none, is refused with [`RejectReason::WrongJob`].
    /// Keeps jobs that share hosts and discriminators apart; the key goes
    /// on the wire as it is, so it is no defence against a peer that can
    /// read the traffic.
    pub job: u64,
}

impl Default for EndpointConfig {
    fn default() -> EndpointConfig {
        EndpointConfig {
            intact: false,
            id_seed: 1,
            max_pending: 64,
            pending_timeout: Duration::from_secs(1),
            max_rejects: 64,
            refusals_per_second: 2_000,
            job: 0,
        }
    }
}

/// A connection request waiting for an answer: accept it with
/// [`Conn::accept`](crate::Conn::accept) (then [`Endpoint::register`] and
/// [`Endpoint::established`]), or refuse it with [`Endpoint::reject`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incoming<A> {
    /// The client's address.
    pub from: A,
    /// The client's connection id.
    pub peer_id: u32,
    /// The client VI's attributes.
    pub attrs: ConnAttrs,
    /// What the client's request carried for the server.
    pub private: PrivateData,
}

/// What [`Endpoint::handle`] made of a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointEvent<'a, A> {
    /// A frame for live connection `id`: hand `repr` and `src` to its
    /// [`Conn::handle_frame`](crate::Conn::handle_frame).
    Frame { id: u32, src: u32, repr: Repr<'a> },
    /// A new request waits on the listener of `discriminator`: take it with
    /// [`Endpoint::take_request`].
    Request { discriminator: &'a [u8] },
    /// An answer given without a connection (a reject, a disconnect ack)
    /// is in `reply[..len]`: send it to `to`.
    Transmit { to: A, len: usize },
    /// A request for a discriminator that process `member` of the host
    /// waits on ([`Endpoint::forward`]): hand it the frame as it came, with
    /// the address it came from.
    Forward { member: u32 },
}

/// What a process sharing the address waits on, in [`Endpoint::forward`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wait {
    /// A listener: client requests naming the discriminator.
    Listen,
    /// A peer-to-peer connection being made: peer requests naming it.
    Peer,
}

/// Counters of frames the endpoint dropped or answered itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Frames that failed the checksum or did not parse.
    pub malformed: u64,
    /// Frames for no live connection, or for connection 0 that nobody
    /// waits for (a disconnect among them is answered all the same).
    pub unknown: u64,
    /// Frames naming a live connection, from an address other than its peer's.
    pub stray: u64,
    /// Requests answered with a reject by the endpoint: nobody listening,
    /// a refusal remembered, or a listener full.
    pub refused: u64,
    /// Requests refused because their listener held [`EndpointConfig::max_pending`].
    pub busy: u64,
    /// Refusals not sent: over [`EndpointConfig::refusals_per_second`].
    pub unanswered: u64,
    /// Requests refused for their job key ([`EndpointConfig::job`]).
    pub wrong_job: u64,
    /// Requests (and their repetitions) forwarded to another process.
    pub forwarded: u64,
}

/// Why [`Endpoint::peer_connect`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RendezvousError {
    /// Another connection already waits on that discriminator.
    #[error("a connection already waits on that discriminator")]
    InUse,
}

/// A live connection.
#[derive(Clone, Copy, Debug)]
struct Link<A> {
    /// The peer's Nic: where its requests come from.
    peer: A,
    /// The peer's connection id, once [`Endpoint::established`] named it.
    peer_id: Option<u32>,
    /// Where the peer's connection sends from, once [`Endpoint::joined`]
    /// named it; until then, any address of the peer's host.
    from: Option<A>,
}

impl<A: Eq> Link<A> {
    /// True if a frame from `addr` may be the peer connection's.
    fn takes(&self, addr: &A, same_host: fn(&A, &A) -> bool) -> bool {
        match &self.from {
            Some(f) => f == addr,
            None => same_host(&self.peer, addr),
        }
    }
}

/// A request a listener holds: waiting in its queue, or taken and not yet
/// answered (so that its repetitions do not make it a second time).
#[derive(Clone, Debug)]
struct Held {
    discriminator: Box<[u8]>,
    /// The request or its latest repetition came then.
    heard: Instant,
    /// Out of the queue, in the listener's hands.
    taken: bool,
}

#[derive(Debug)]
struct Listener<A> {
    queue: VecDeque<Incoming<A>>,
    /// Requests of this listener in [`Endpoint::held`].
    held: usize,
    /// When a full listener may next look for stale requests: a pass over
    /// what it holds, at most every [`EXPIRE_EVERY`] of the pending
    /// timeout, so a flood of new requests costs one look each, not a pass.
    expire_at: Option<Instant>,
}

/// A full listener looks for stale requests at most this many times per
/// [`EndpointConfig::pending_timeout`].
const EXPIRE_EVERY: u32 = 8;

/// The window [`EndpointConfig::refusals_per_second`] is counted over.
const REFUSAL_WINDOW: Duration = Duration::from_millis(100);

/// Refusals sent in the current [`REFUSAL_WINDOW`].
#[derive(Clone, Copy, Debug, Default)]
struct RefusalBudget {
    since: Option<Instant>,
    sent: u32,
}

/// A refusal remembered.
#[derive(Clone, Copy, Debug)]
struct Refusal {
    reason: RejectReason,
    private: PrivateData,
}

/// The connections and listeners of one network address. See the module
/// documentation.
#[derive(Debug)]
pub struct Endpoint<A> {
    cfg: EndpointConfig,
    next_id: u32,
    /// Live connections by local id.
    conns: HashMap<u32, Link<A>>,
    /// (peer address, peer's connection id) -> local id, so a repeated
    /// request reaches the connection it made.
    established: HashMap<(A, u32), u32>,
    /// True if two addresses name one host (see [`Endpoint::with_hosts`]).
    same_host: fn(&A, &A) -> bool,
    listeners: HashMap<Box<[u8]>, Listener<A>>,
    /// Requests listeners hold, by (client address, client's id): a
    /// repetition is found here at once.
    held: HashMap<(A, u32), Held>,
    rejected: HashMap<(A, u32), Refusal>,
    /// Keys of `rejected`, oldest first, to forget the oldest.
    rejected_order: VecDeque<(A, u32)>,
    /// Peer-to-peer connections being made: the discriminator our
    /// connection waits on -> (the peer's address, our connection id).
    peers: HashMap<Box<[u8]>, (A, u32)>,
    /// What other processes sharing the address wait on -> which process.
    forwards: HashMap<(Wait, Box<[u8]>), u32>,
    /// Requests forwarded, by (client address, client's id) -> process, so
    /// that their repetitions go where the first went (the most recent
    /// [`EndpointConfig::max_rejects`] are remembered).
    sent_on: HashMap<(A, u32), u32>,
    sent_on_order: VecDeque<(A, u32)>,
    refusals: RefusalBudget,
    stats: EndpointStats,
}

impl<A: Copy + Eq + Hash + Debug> Endpoint<A> {
    /// An endpoint with no connection, listener or rendezvous yet.
    pub fn new(cfg: EndpointConfig) -> Endpoint<A> {
        Endpoint {
            next_id: cfg.id_seed,
            cfg,
            conns: HashMap::new(),
            established: HashMap::new(),
            same_host: |a, b| a == b,
            listeners: HashMap::new(),
            held: HashMap::new(),
            rejected: HashMap::new(),
            rejected_order: VecDeque::new(),
            peers: HashMap::new(),
            forwards: HashMap::new(),
            sent_on: HashMap::new(),
            sent_on_order: VecDeque::new(),
            refusals: RefusalBudget::default(),
            stats: EndpointStats::default(),
        }
    }

    /// Says which addresses name one host: those of a medium whose
    /// connections answer from addresses of their own (another UDP port of
    /// the same IP address). Without it, every address is a host of its
    /// own.
    pub fn with_hosts(mut self, same_host: fn(&A, &A) -> bool) -> Endpoint<A> {
        self.same_host = same_host;
        self
    }

    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    /// Counters of frames dropped or answered here; read them whenever
    /// (they only grow).
    pub fn stats(&self) -> EndpointStats {
        self.stats
    }

    // ------------------------------------------------------------------
    // Connections.

    /// A connection id for a new connection: never 0 (the id of "no
    /// connection yet") and not one of a live connection. Call once per
    /// [`Conn`], then [`register`](Self::register) it.
    pub fn new_id(&mut self) -> u32 {
        // Live connections are a sliver of the 2^32 ids: this ends at once.
        loop {
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1);
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    /// Makes connection `id`, whose frames come from `peer`, live: frames
    /// naming it from there are handed to it. Call when its [`Conn`] is made.
    pub fn register(&mut self, id: u32, peer: A) {
        if let Some(old) = self.conns.insert(
            id,
            Link {
                peer,
                peer_id: None,
                from: None,
            },
        ) {
            self.forget_link(id, old);
        }
    }

    /// Records that live connection `id` to `peer` is joined to the peer's
    /// connection `peer_id`, so that the peer's repeated requests reach it:
    /// call when a server accepts a request, and when a client (or a
    /// peer-to-peer side) sees [`Event::Connected`](crate::Event::Connected)
    /// (with [`Conn::peer_id`]). Returns false, recording nothing, if `id`
    /// is not live with that peer.
    pub fn established(&mut self, peer: A, peer_id: u32, id: u32) -> bool {
        let Some(link) = self.conns.get_mut(&id).filter(|l| l.peer == peer) else {
            return false;
        };
        let old = link.peer_id.replace(peer_id);
        if let Some(old) = old.filter(|&o| o != peer_id) {
            self.established.remove(&(peer, old));
        }
        self.established.insert((peer, peer_id), id);
        // Answered: its repetitions go to the connection from now on.
        self.release(peer, peer_id);
        true
    }

    /// Records that the peer's side of live connection `id` sends from
    /// `from` (an address of its own, or its Nic's): frames naming `id` are
    /// taken from there only from now on. Call when a frame of the peer's
    /// connection (not a request) has connected it, with that frame's
    /// source. Returns false, recording nothing, if `id` is not live, or
    /// `from` is not an address of its peer's host.
    pub fn joined(&mut self, id: u32, from: A) -> bool {
        let same_host = self.same_host;
        match self.conns.get_mut(&id) {
            Some(link) if link.takes(&from, same_host) => {
                link.from = Some(from);
                true
            }
            _ => false,
        }
    }

    /// Ends connection `id`: frames naming it are dropped from now on (a
    /// disconnect answered). Call when its [`Conn`] is dropped.
    pub fn unregister(&mut self, id: u32) {
        if let Some(old) = self.conns.remove(&id) {
            self.forget_link(id, old);
        }
    }

    /// The address connection `id`'s peer made its requests from: the
    /// peer's Nic as the connection was registered, or, peer to peer, the
    /// address its request came from (another of the host's, when the peer
    /// shares its host's address with other processes).
    pub fn peer_of(&self, id: u32) -> Option<A> {
        self.conns.get(&id).map(|l| l.peer)
    }

    fn forget_link(&mut self, id: u32, link: Link<A>) {
        if let Some(p) = link.peer_id {
            if self.established.get(&(link.peer, p)) == Some(&id) {
                self.established.remove(&(link.peer, p));
            }
        }
    }

    // ------------------------------------------------------------------
    // Listeners.

    /// Starts holding requests for `discriminator` (cut to
    /// [`wire::MAX_DISCRIMINATOR`] bytes, as requests carry it); until then they
    /// are refused with [`RejectReason::NoListener`]. Listening again
    /// changes nothing.
    pub fn listen(&mut self, discriminator: &[u8]) {
        let d = wire::cut_discriminator(discriminator);
        if !self.listeners.contains_key(d) {
            let l = Listener {
                queue: VecDeque::new(),
                held: 0,
                expire_at: None,
            };
            self.listeners.insert(d.into(), l);
        }
    }

    /// Stops listening on `discriminator`: the requests it held are
    /// forgotten (their clients' repetitions are refused). A request
    /// already taken may still be answered.
    pub fn stop_listening(&mut self, discriminator: &[u8]) {
        let d = wire::cut_discriminator(discriminator);
        if self.listeners.remove(d).is_some() {
            self.held.retain(|_, h| &*h.discriminator != d);
        }
    }

    /// The oldest request waiting on `discriminator`. Call after
    /// [`EndpointEvent::Request`] names it, or whenever the listener wants
    /// one; then accept or [`reject`](Self::reject) it. Until answered, its
    /// repetitions are not queued again.
    pub fn take_request(&mut self, discriminator: &[u8]) -> Option<Incoming<A>> {
        let d = wire::cut_discriminator(discriminator);
        let req = self.listeners.get_mut(d)?.queue.pop_front()?;
        if let Some(h) = self.held.get_mut(&(req.from, req.peer_id)) {
            h.taken = true;
        }
        Some(req)
    }

    /// Requests waiting on `discriminator`, not yet taken: for a listener
    /// that polls rather than waits for [`EndpointEvent::Request`].
    pub fn pending(&self, discriminator: &[u8]) -> usize {
        let d = wire::cut_discriminator(discriminator);
        self.listeners.get(d).map_or(0, |l| l.queue.len())
    }

    /// Refuses a request, now and for its repetitions (the most recent
    /// [`EndpointConfig::max_rejects`] refusals are remembered): writes the
    /// reject frame into `buf` and returns its length, to be sent to
    /// `req.from`. `buf` must hold [`wire::MAX_REPLY_LEN`] bytes; if it is
    /// shorter nothing is written and 0 returned (the refusal is still
    /// remembered).
    pub fn reject(
        &mut self,
        req: &Incoming<A>,
        reason: RejectReason,
        private: &PrivateData,
        buf: &mut [u8],
    ) -> usize {
        let key = (req.from, req.peer_id);
        self.release(req.from, req.peer_id);
        let refusal = Refusal {
            reason,
            private: *private,
        };
        if self.rejected.insert(key, refusal).is_none() {
            self.rejected_order.push_back(key);
            while self.rejected_order.len() > self.cfg.max_rejects {
                if let Some(old) = self.rejected_order.pop_front() {
                    self.rejected.remove(&old);
                }
            }
        }
        reject_into(buf, req.peer_id, &refusal)
    }

    /// Drops a held request: it has been answered.
    fn release(&mut self, from: A, peer_id: u32) {
        if let Some(h) = self.held.remove(&(from, peer_id)) {
            if let Some(l) = self.listeners.get_mut(&h.discriminator) {
                l.held -= 1;
                if !h.taken {
                    // Answered while queued: a request taken once, forgotten
                    // while it waited for its answer, and queued again by a
                    // repetition. The copy in the queue goes too.
                    l.queue.retain(|r| (r.from, r.peer_id) != (from, peer_id));
                }
            }
        }
    }

    // ------------------------------------------------------------------
    // Peer-to-peer.

    /// Connection `id` (live with `peer`) makes a peer-to-peer connection
    /// and waits on `discriminator`: a peer request from `peer` naming it
    /// goes to that connection. Call with
    /// [`Conn::connect_peer`](crate::Conn::connect_peer); end it with
    /// [`peer_done`](Self::peer_done) once connected or given up.
    pub fn peer_connect(
        &mut self,
        discriminator: &[u8],
        peer: A,
        id: u32,
    ) -> Result<(), RendezvousError> {
        let d = wire::cut_discriminator(discriminator);
        if self.peers.contains_key(d) {
            return Err(RendezvousError::InUse);
        }
        self.peers.insert(d.into(), (peer, id));
        Ok(())
    }

    /// The connection waiting on `discriminator` waits no more (connected:
    /// the peer's repetitions reach it through [`established`](Self::established)).
    pub fn peer_done(&mut self, discriminator: &[u8]) {
        let d = wire::cut_discriminator(discriminator);
        self.peers.remove(d);
    }

    // ------------------------------------------------------------------
    // Processes sharing the address.

    /// Process `member`, sharing this endpoint's address, waits on
    /// `discriminator` (as a listener, or peer to peer): requests naming it
    /// that nobody here waits on are forwarded there
    /// ([`EndpointEvent::Forward`]). A later call for the same
    /// discriminator moves it to the later process.
    pub fn forward(&mut self, wait: Wait, discriminator: &[u8], member: u32) {
        let d = wire::cut_discriminator(discriminator);
        self.forwards.insert((wait, d.into()), member);
    }

    /// Process `member` waits on `discriminator` no more.
    pub fn withdraw(&mut self, wait: Wait, discriminator: &[u8], member: u32) {
        let d = wire::cut_discriminator(discriminator);
        let key = (wait, Box::<[u8]>::from(d));
        if self.forwards.get(&key) == Some(&member) {
            self.forwards.remove(&key);
        }
    }

    /// Process `member` has gone: nothing is forwarded to it any more.
    pub fn withdraw_member(&mut self, member: u32) {
        self.forwards.retain(|_, m| *m != member);
        self.sent_on.retain(|_, m| *m != member);
        let sent_on = &self.sent_on;
        self.sent_on_order.retain(|k| sent_on.contains_key(k));
    }

    /// Forwards request (`from`, `peer_id`) to the process waiting on
    /// `discriminator`, if one does: to the one its first copy went to.
    fn forward_to<'a>(
        &mut self,
        wait: Wait,
        from: A,
        peer_id: u32,
        discriminator: &[u8],
    ) -> Option<EndpointEvent<'a, A>> {
        let key = (from, peer_id);
        let member = match self.sent_on.get(&key) {
            Some(&m) => m,
            None => {
                let m = *self
                    .forwards
                    .get(&(wait, Box::<[u8]>::from(discriminator)))?;
                self.sent_on.insert(key, m);
                self.sent_on_order.push_back(key);
                while self.sent_on_order.len() > self.cfg.max_rejects {
                    if let Some(old) = self.sent_on_order.pop_front() {
                        self.sent_on.remove(&old);
                    }
                }
                m
            }
        };
        self.stats.forwarded += 1;
        Some(EndpointEvent::Forward { member })
    }

    // ------------------------------------------------------------------
    // Input.

    /// Takes in one frame the medium delivered from `from`. Returns what to
    /// do with it, or `None` when it was dropped (and counted in
    /// [`stats`](Self::stats)). A reply is written into `reply`, which
    /// should hold [`wire::MAX_REPLY_LEN`] bytes (a reply that does not fit
    /// is not written). Call for every frame, in arrival order.
    ///
    /// A data frame for a live connection costs one parse and one table
    /// look-up, and allocates nothing.
    pub fn handle<'a>(
        &mut self,
        now: Instant,
        from: A,
        bytes: &'a [u8],
        reply: &mut [u8],
    ) -> Option<EndpointEvent<'a, A>> {
        let parsed = match self.cfg.intact {
            true => wire::parse_intact(bytes),
            false => wire::parse(bytes),
        };
        let Ok((dst, src, repr)) = parsed else {
            self.stats.malformed += 1;
            return None;
        };
        if dst != 0 {
            return match self.conns.get(&dst) {
                Some(link) if link.takes(&from, self.same_host) => {
                    Some(EndpointEvent::Frame { id: dst, src, repr })
                }
                Some(_) => {
                    self.stats.stray += 1;
                    None
                }
                None => {
                    self.stats.unknown += 1;
                    if !matches!(repr, Repr::Disconnect { .. }) {
                        return None;
                    }
                    // The connection is gone already; say so, so that the
                    // peer stops asking.
                    if reply.len() < Repr::DisconnectAck.buffer_len() {
                        return None;
                    }
                    let len = Conn::disconnect_ack_frame(reply, src, dst);
                    Some(EndpointEvent::Transmit { to: from, len })
                }
            };
        }
        // Connection 0: requests, whose client knows no id of ours yet.
        if let Some(&id) = self.established.get(&(from, src)) {
            // A repetition of a request already answered by connection
            // `id` (or of a peer request it answered): it answers again.
            if matches!(repr, Repr::ConnRequest { .. } | Repr::PeerRequest { .. }) {
                return Some(EndpointEvent::Frame { id, src, repr });
            }
        }
        match repr {
            Repr::ConnRequest {
                attrs,
                discriminator,
                private,
            } => self.on_request(now, from, src, attrs, discriminator, private, reply),
            Repr::PeerRequest { discriminator, .. } => {
                // A connection of ours asking that peer on this discriminator.
                // The peer may share its host's address with other
                // processes and ask from an address of its own: any address
                // of the host named is the peer's, and its requests' address
                // is the one its connection is known by from now on.
                let same_host = self.same_host;
                let waiting = self.peers.get(discriminator).copied();
                match waiting {
                    Some((peer, id))
                        if same_host(&peer, &from)
                            && self
                                .conns
                                .get(&id)
                                .is_some_and(|l| same_host(&l.peer, &from)) =>
                    {
                        if let Some(link) = self.conns.get_mut(&id) {
                            if link.peer_id.is_none() {
                                link.peer = from;
                            }
                        }
                        Some(EndpointEvent::Frame { id, src, repr })
                    }
                    _ => {
                        if let Some(ev) = self.forward_to(Wait::Peer, from, src, discriminator) {
                            return Some(ev);
                        }
                        // Nobody waits yet: the peer repeats its request
                        // until someone here asks it too.
                        self.stats.unknown += 1;
                        None
                    }
                }
            }
            _ => {
                self.stats.unknown += 1;
                None
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_request<'a>(
        &mut self,
        now: Instant,
        from: A,
        peer_id: u32,
        attrs: ConnAttrs,
        discriminator: &'a [u8],
        private: &[u8],
        reply: &mut [u8],
    ) -> Option<EndpointEvent<'a, A>> {
        let key = (from, peer_id);
        if let Some(refusal) = self.rejected.get(&key) {
            return self.refuse(now, from, peer_id, *refusal, reply);
        }
        if let Some(h) = self.held.get_mut(&key) {
            // A repetition of a request held: the client still asks.
            h.heard = now;
            return None;
        }
        let no_listener = Refusal {
            reason: RejectReason::NoListener,
            private: PrivateData::EMPTY,
        };
        if self.sent_on.contains_key(&key) {
            // Its first copy went to another process: so do the repetitions.
            return self.forward_to(Wait::Listen, from, peer_id, discriminator);
        }
        let Some(l) = self.listeners.get_mut(discriminator) else {
            if let Some(ev) = self.forward_to(Wait::Listen, from, peer_id, discriminator) {
                return Some(ev);
            }
            // Not remembered: a client asks again when nobody listens yet,
            // and the listener may have come by then.
            return self.refuse(now, from, peer_id, no_listener, reply);
        };
        if self.cfg.job != 0 && attrs.job != self.cfg.job {
            self.stats.wrong_job += 1;
            let wrong = Refusal {
                reason: RejectReason::WrongJob,
                private: PrivateData::EMPTY,
            };
            return self.refuse(now, from, peer_id, wrong, reply);
        }
        if l.held >= self.cfg.max_pending && l.expire_at.is_none_or(|at| now >= at) {
            l.expire_at = Some(now + self.cfg.pending_timeout / EXPIRE_EVERY);
            self.expire(now, discriminator);
        }
        let Some(l) = self.listeners.get_mut(discriminator) else {
            return self.refuse(now, from, peer_id, no_listener, reply);
        };
        if l.held >= self.cfg.max_pending {
            self.stats.busy += 1;
            let busy = Refusal {
                reason: RejectReason::Busy,
                private: PrivateData::EMPTY,
            };
            return self.refuse(now, from, peer_id, busy, reply);
        }
        l.held += 1;
        l.queue.push_back(Incoming {
            from,
            peer_id,
            attrs,
            private: PrivateData::of_frame(private),
        });
        self.held.insert(
            key,
            Held {
                discriminator: discriminator.into(),
                heard: now,
                taken: false,
            },
        );
        Some(EndpointEvent::Request { discriminator })
    }

    /// Makes room on a full listener: forgets the requests whose clients
    /// have not asked for [`EndpointConfig::pending_timeout`]. Runs only
    /// when the listener is full, so its cost (a pass over what it holds)
    /// is off every other path.
    fn expire(&mut self, now: Instant, discriminator: &[u8]) {
        let timeout = self.cfg.pending_timeout;
        let mut gone = 0;
        self.held.retain(|_, h| {
            let stale = &*h.discriminator == discriminator
                && now.saturating_duration_since(h.heard) >= timeout;
            gone += stale as usize;
            !stale
        });
        if gone == 0 {
            return;
        }
        if let Some(l) = self.listeners.get_mut(discriminator) {
            l.held -= gone;
            let held = &self.held;
            l.queue.retain(|r| held.contains_key(&(r.from, r.peer_id)));
        }
    }

    /// Answers a request with a reject built into `reply`, within the
    /// budget of [`EndpointConfig::refusals_per_second`].
    fn refuse<'a>(
        &mut self,
        now: Instant,
        to: A,
        peer_id: u32,
        refusal: Refusal,
        reply: &mut [u8],
    ) -> Option<EndpointEvent<'a, A>> {
        self.stats.refused += 1;
        let b = &mut self.refusals;
        if b.since
            .is_none_or(|t| now.saturating_duration_since(t) >= REFUSAL_WINDOW)
        {
            *b = RefusalBudget {
                since: Some(now),
                sent: 0,
            };
        }
        let budget = (self.cfg.refusals_per_second as u64 * REFUSAL_WINDOW.as_millis() as u64
            / 1000)
            .max(1) as u32;
        if b.sent >= budget {
            self.stats.unanswered += 1;
            return None;
        }
        b.sent += 1;
        match reject_into(reply, peer_id, &refusal) {
            0 => None,
            len => Some(EndpointEvent::Transmit { to, len }),
        }
    }
}

/// Writes a reject into `buf` if it fits; returns its length (0 if not).
fn reject_into(buf: &mut [u8], peer_id: u32, refusal: &Refusal) -> usize {
    let frame = Repr::ConnReject {
        reason: refusal.reason,
        private: refusal.private.as_slice(),
    };
    if buf.len() < frame.buffer_len() {
        return 0;
    }
    Conn::reject_frame_with(buf, peer_id, refusal.reason, &refusal.private)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{DataHeader, Op};

    const CLIENT: u8 = 1;
    const OTHER: u8 = 2;

    fn attrs() -> ConnAttrs {
        ConnAttrs {
            reliability: 1,
            rdma_write: true,
            rdma_read: true,
            max_frame: 1472,
            max_transfer: 1 << 20,
            initial_psn: 100,
            intact: false,
            job: 0,
            nic: 0,
        }
    }

    fn bytes(r: &Repr<'_>, dst: u32, src: u32) -> Vec<u8> {
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut b, dst, src);
        b
    }

    fn request(peer_id: u32, discriminator: &[u8], private: &[u8]) -> Vec<u8> {
        let r = Repr::ConnRequest {
            attrs: attrs(),
            discriminator,
            private,
        };
        bytes(&r, 0, peer_id)
    }

    fn peer_request(peer_id: u32, discriminator: &[u8]) -> Vec<u8> {
        let r = Repr::PeerRequest {
            attrs: attrs(),
            discriminator,
            private: b"",
        };
        bytes(&r, 0, peer_id)
    }

    fn data(dst: u32, src: u32) -> Vec<u8> {
        let header = DataHeader {
            psn: 100,
            ack: 1000,
            msn: 0,
            op: Op::Send,
            flags: 0,
            offset: 0,
            total: 3,
            imm: 0,
            rkey: 0,
            raddr: 0,
            rsn: 0,
            done: 0,
        };
        let r = Repr::Data {
            header,
            payload: b"abc",
        };
        bytes(&r, dst, src)
    }

    struct Bench {
        ep: Endpoint<u8>,
        now: Instant,
        reply: [u8; wire::MAX_REPLY_LEN],
    }

    impl Bench {
        fn new(cfg: EndpointConfig) -> Bench {
            Bench {
                ep: Endpoint::new(cfg),
                now: Instant::now(),
                reply: [0; wire::MAX_REPLY_LEN],
            }
        }

        /// What the endpoint makes of `b` from `from`, with a reply parsed.
        fn feed(&mut self, from: u8, b: &[u8]) -> Seen {
            match self.ep.handle(self.now, from, b, &mut self.reply) {
                None => Seen::Dropped,
                Some(EndpointEvent::Frame { id, src, .. }) => Seen::Frame { id, src },
                Some(EndpointEvent::Request { discriminator }) => {
                    Seen::Request(discriminator.to_vec())
                }
                Some(EndpointEvent::Forward { member }) => Seen::Forward(member),
                Some(EndpointEvent::Transmit { to, len }) => {
                    let (dst, src, r) = wire::parse(&self.reply[..len]).expect("a reply parses");
                    let r = match r {
                        Repr::ConnReject { reason, private } => {
                            Reply::Reject(reason, private.to_vec())
                        }
                        Repr::DisconnectAck => Reply::DisconnectAck,
                        other => panic!("unexpected reply {other:?}"),
                    };
                    Seen::Reply { to, dst, src, r }
                }
            }
        }
    }

    #[derive(Debug, PartialEq, Eq)]
    enum Reply {
        Reject(RejectReason, Vec<u8>),
        DisconnectAck,
    }

    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        Dropped,
        Frame {
            id: u32,
            src: u32,
        },
        Request(Vec<u8>),
        Forward(u32),
        Reply {
            to: u8,
            dst: u32,
            src: u32,
            r: Reply,
        },
    }

    fn reject(to: u8, dst: u32, reason: RejectReason, private: &[u8]) -> Seen {
        Seen::Reply {
            to,
            dst,
            src: 0,
            r: Reply::Reject(reason, private.to_vec()),
        }
    }

    #[test]
    fn ids_start_at_the_seed_and_skip_zero_and_live_ones() {
        let mut ep = Endpoint::<u8>::new(EndpointConfig {
            id_seed: u32::MAX,
            ..EndpointConfig::default()
        });
        assert_eq!(ep.new_id(), u32::MAX);
        ep.register(2, CLIENT);
        assert_eq!(ep.new_id(), 1, "0 is never an id");
        assert_eq!(ep.new_id(), 3, "2 is live");
    }

    #[test]
    fn frames_reach_live_connections_from_their_peer_only() {
        let mut b = Bench::new(EndpointConfig::default());
        b.ep.register(5, CLIENT);
        assert_eq!(b.feed(CLIENT, &data(5, 9)), Seen::Frame { id: 5, src: 9 });
        assert_eq!(b.feed(OTHER, &data(5, 9)), Seen::Dropped, "not its peer");
        assert_eq!(b.feed(CLIENT, &data(6, 9)), Seen::Dropped, "no such id");
        b.ep.unregister(5);
        assert_eq!(b.feed(CLIENT, &data(5, 9)), Seen::Dropped, "gone");
        let s = b.ep.stats();
        assert_eq!((s.stray, s.unknown), (1, 2));
    }

    #[test]
    fn a_disconnect_for_an_unknown_connection_is_acknowledged() {
        let mut b = Bench::new(EndpointConfig::default());
        let d = bytes(&Repr::Disconnect { ack: 1, done: 2 }, 77, 9);
        let ack = Seen::Reply {
            to: CLIENT,
            dst: 9,
            src: 77,
            r: Reply::DisconnectAck,
        };
        assert_eq!(b.feed(CLIENT, &d), ack);
        // Any other frame for it is dropped unanswered.
        assert_eq!(
            b.feed(CLIENT, &bytes(&Repr::ConnConfirm, 77, 9)),
            Seen::Dropped
        );
        assert_eq!(b.ep.stats().unknown, 2);
        // A reply buffer too short for the ack: nothing is written.
        let mut short = [0u8; 4];
        assert_eq!(b.ep.handle(b.now, CLIENT, &d, &mut short), None);
    }

    #[test]
    fn a_repeated_request_queues_once_and_then_reaches_its_connection() {
        let mut b = Bench::new(EndpointConfig::default());
        let req = request(9, b"srv", b"hello");
        assert_eq!(
            b.feed(CLIENT, &req),
            reject(CLIENT, 9, RejectReason::NoListener, b"")
        );
        b.ep.listen(b"srv");
        assert_eq!(b.feed(CLIENT, &req), Seen::Request(b"srv".to_vec()));
        assert_eq!(b.feed(CLIENT, &req), Seen::Dropped, "queued already");
        assert_eq!(b.ep.pending(b"srv"), 1);
        let inc = b.ep.take_request(b"srv").expect("the request");
        assert_eq!((inc.from, inc.peer_id), (CLIENT, 9));
        assert_eq!(inc.attrs, attrs());
        assert_eq!(inc.private.as_slice(), b"hello");
        assert_eq!(b.ep.take_request(b"srv"), None);
        // Taken, not answered yet: a repetition does not queue it again.
        assert_eq!(b.feed(CLIENT, &req), Seen::Dropped);
        assert_eq!(b.ep.pending(b"srv"), 0);
        // Accepted: repetitions go to the connection, which answers again.
        let id = b.ep.new_id();
        b.ep.register(id, CLIENT);
        assert!(b.ep.established(CLIENT, 9, id));
        assert!(!b.ep.established(OTHER, 9, id), "not its peer");
        assert_eq!(b.feed(CLIENT, &req), Seen::Frame { id, src: 9 });
        // The same client id from elsewhere is another client.
        assert_eq!(b.feed(OTHER, &req), Seen::Request(b"srv".to_vec()));
        // Once the connection is gone, a repetition is a new request.
        b.ep.unregister(id);
        assert_eq!(b.feed(CLIENT, &req), Seen::Request(b"srv".to_vec()));
    }

    #[test]
    fn a_refusal_is_remembered_for_the_repetitions() {
        let mut b = Bench::new(EndpointConfig {
            max_rejects: 2,
            ..EndpointConfig::default()
        });
        b.ep.listen(b"srv");
        for peer_id in [1, 2, 3] {
            b.feed(CLIENT, &request(peer_id, b"srv", b""));
        }
        let mut buf = [0u8; wire::MAX_REPLY_LEN];
        let no = PrivateData::new(b"not now").expect("short");
        for _ in 0..3 {
            let inc = b.ep.take_request(b"srv").expect("a request");
            let n = b.ep.reject(&inc, RejectReason::Refused, &no, &mut buf);
            let (dst, src, r) = wire::parse(&buf[..n]).expect("a reject");
            assert_eq!((dst, src), (inc.peer_id, 0));
            let private = no.as_slice();
            let reason = RejectReason::Refused;
            assert_eq!(r, Repr::ConnReject { reason, private });
        }
        // The last two are remembered; the first was forgotten and its
        // repetition is a request again.
        for peer_id in [2, 3] {
            let want = reject(CLIENT, peer_id, RejectReason::Refused, b"not now");
            assert_eq!(b.feed(CLIENT, &request(peer_id, b"srv", b"")), want);
        }
        assert_eq!(b.ep.pending(b"srv"), 0);
        let again = b.feed(CLIENT, &request(1, b"srv", b""));
        assert_eq!(again, Seen::Request(b"srv".to_vec()));
        assert_eq!(b.ep.stats().refused, 2);
        // A buffer too short: the refusal is remembered, nothing written.
        let inc = b.ep.take_request(b"srv").expect("a request");
        assert_eq!(
            b.ep.reject(&inc, RejectReason::Mismatch, &no, &mut [0; 8]),
            0
        );
        let want = reject(CLIENT, 1, RejectReason::Mismatch, b"not now");
        assert_eq!(b.feed(CLIENT, &request(1, b"srv", b"")), want);
    }

    #[test]
    fn a_full_listener_refuses_as_busy_until_a_silent_client_makes_room() {
        let cfg = EndpointConfig {
            max_pending: 2,
            ..EndpointConfig::default()
        };
        let timeout = cfg.pending_timeout;
        let mut b = Bench::new(cfg);
        b.ep.listen(b"srv");
        assert_eq!(
            b.feed(CLIENT, &request(1, b"srv", b"")),
            Seen::Request(b"srv".to_vec())
        );
        assert_eq!(
            b.feed(CLIENT, &request(2, b"srv", b"")),
            Seen::Request(b"srv".to_vec())
        );
        let busy = reject(CLIENT, 3, RejectReason::Busy, b"");
        assert_eq!(b.feed(CLIENT, &request(3, b"srv", b"")), busy);
        // Taken but not answered still counts against the bound.
        b.ep.take_request(b"srv").expect("request 1");
        assert_eq!(b.feed(CLIENT, &request(3, b"srv", b"")), busy);
        assert_eq!(b.ep.stats().busy, 2);
        // Client 1 keeps asking; client 2 goes silent for the timeout.
        b.now += timeout;
        assert_eq!(b.feed(CLIENT, &request(1, b"srv", b"")), Seen::Dropped);
        assert_eq!(
            b.feed(CLIENT, &request(3, b"srv", b"")),
            Seen::Request(b"srv".to_vec())
        );
        assert_eq!(b.ep.pending(b"srv"), 1);
        let inc = b.ep.take_request(b"srv").expect("request 3");
        assert_eq!(inc.peer_id, 3, "2 was dropped");
        // Still full (1 and 3 held, neither silent).
        assert_eq!(
            b.feed(CLIENT, &request(4, b"srv", b"")),
            reject(CLIENT, 4, RejectReason::Busy, b"")
        );
        // Answering frees a place.
        let mut buf = [0u8; wire::MAX_REPLY_LEN];
        b.ep.reject(&inc, RejectReason::Refused, &PrivateData::EMPTY, &mut buf);
        assert_eq!(
            b.feed(CLIENT, &request(4, b"srv", b"")),
            Seen::Request(b"srv".to_vec())
        );
    }

    #[test]
    fn a_listener_with_a_job_key_refuses_requests_without_it() {
        let key = 0x5eed_0000_0000_0001;
        let mut b = Bench::new(EndpointConfig {
            job: key,
            ..EndpointConfig::default()
        });
        b.ep.listen(b"srv");
        let with = |job| {
            let r = Repr::ConnRequest {
                attrs: ConnAttrs { job, ..attrs() },
                discriminator: b"srv",
                private: b"",
            };
            bytes(&r, 0, 1)
        };
        let wrong = reject(CLIENT, 1, RejectReason::WrongJob, b"");
        assert_eq!(b.feed(CLIENT, &request(1, b"srv", b"")), wrong, "no key");
        assert_eq!(b.feed(CLIENT, &with(key + 1)), wrong, "another key");
        assert_eq!(b.ep.stats().wrong_job, 2);
        assert_eq!(b.feed(CLIENT, &with(key)), Seen::Request(b"srv".to_vec()));
        let inc = b.ep.take_request(b"srv").expect("the request with the key");
        assert_eq!(inc.attrs.job, key);
        // A listener without a key takes any request.
        let mut open = Bench::new(EndpointConfig::default());
        open.ep.listen(b"srv");
        assert_eq!(
            open.feed(CLIENT, &with(key)),
            Seen::Request(b"srv".to_vec())
        );
    }

    #[test]
    fn refusals_beyond_the_budget_go_unanswered_until_the_next_window() {
        let cfg = EndpointConfig {
            refusals_per_second: 30,
            ..EndpointConfig::default()
        };
        let mut b = Bench::new(cfg);
        // 30 a second: 3 in each 100 ms window.
        for id in 1..=3 {
            let want = reject(CLIENT, id, RejectReason::NoListener, b"");
            assert_eq!(b.feed(CLIENT, &request(id, b"none", b"")), want);
        }
        for id in 4..=50 {
            assert_eq!(b.feed(CLIENT, &request(id, b"none", b"")), Seen::Dropped);
        }
        assert_eq!(b.ep.stats().refused, 50);
        assert_eq!(b.ep.stats().unanswered, 47);
        b.now += REFUSAL_WINDOW;
        let want = reject(CLIENT, 51, RejectReason::NoListener, b"");
        assert_eq!(b.feed(CLIENT, &request(51, b"none", b"")), want);
    }

    #[test]
    fn stopping_a_listener_forgets_what_it_held() {
        let mut b = Bench::new(EndpointConfig::default());
        b.ep.listen(b"srv");
        b.ep.listen(b"srv");
        b.feed(CLIENT, &request(1, b"srv", b""));
        b.ep.stop_listening(b"srv");
        assert_eq!(b.ep.take_request(b"srv"), None);
        let want = reject(CLIENT, 1, RejectReason::NoListener, b"");
        assert_eq!(b.feed(CLIENT, &request(1, b"srv", b"")), want);
        b.ep.listen(b"srv");
        assert_eq!(
            b.feed(CLIENT, &request(1, b"srv", b"")),
            Seen::Request(b"srv".to_vec())
        );
    }

    #[test]
    fn until_joined_a_connection_takes_frames_from_any_address_of_its_peers_host() {
        // Addresses 0xHP: host H, port P; port 0 is the Nic's.
        let hosts = |a: &u8, b: &u8| a >> 4 == b >> 4;
        let mut b = Bench::new(EndpointConfig::default());
        b.ep = Endpoint::new(EndpointConfig::default()).with_hosts(hosts);
        // A client asked the Nic at 0x10; the server's connection answers
        // from 0x11.
        b.ep.register(5, 0x10);
        assert!(b.ep.established(0x10, 9, 5));
        assert_eq!(b.feed(0x11, &data(5, 9)), Seen::Frame { id: 5, src: 9 });
        assert_eq!(b.feed(0x20, &data(5, 9)), Seen::Dropped, "another host");
        assert!(!b.ep.joined(5, 0x21), "another host");
        assert!(!b.ep.joined(6, 0x11), "no such connection");
        assert!(b.ep.joined(5, 0x11));
        // Joined: from that address only.
        assert_eq!(b.feed(0x11, &data(5, 9)), Seen::Frame { id: 5, src: 9 });
        assert_eq!(b.feed(0x10, &data(5, 9)), Seen::Dropped, "joined elsewhere");
        assert_eq!(b.feed(0x12, &data(5, 9)), Seen::Dropped, "joined elsewhere");
        // The peer's repeated request still comes from its Nic, and reaches it.
        assert_eq!(
            b.feed(0x10, &request(9, b"d", b"")),
            Seen::Frame { id: 5, src: 9 }
        );
        assert_eq!(b.ep.stats().stray, 3);

        // Without hosts, every address is a host of its own.
        let mut b = Bench::new(EndpointConfig::default());
        b.ep.register(5, 0x10);
        assert_eq!(b.feed(0x11, &data(5, 9)), Seen::Dropped);
        assert!(!b.ep.joined(5, 0x11));
        assert!(b.ep.joined(5, 0x10));
        assert_eq!(b.feed(0x10, &data(5, 9)), Seen::Frame { id: 5, src: 9 });
    }

    #[test]
    fn a_peer_request_reaches_the_connection_waiting_for_it_in_either_order() {
        // Ours waits first, then the peer's request comes.
        let mut b = Bench::new(EndpointConfig::default());
        b.ep.register(5, OTHER);
        b.ep.peer_connect(b"mine", OTHER, 5).expect("free");
        assert_eq!(
            b.ep.peer_connect(b"mine", OTHER, 6),
            Err(RendezvousError::InUse)
        );
        assert_eq!(
            b.feed(OTHER, &peer_request(8, b"mine")),
            Seen::Frame { id: 5, src: 8 }
        );
        assert_eq!(
            b.feed(CLIENT, &peer_request(8, b"mine")),
            Seen::Dropped,
            "another peer"
        );
        assert_eq!(
            b.feed(OTHER, &peer_request(8, b"yours")),
            Seen::Dropped,
            "another name"
        );
        // Connected: the rendezvous ends, repetitions still reach it.
        assert!(b.ep.established(OTHER, 8, 5));
        b.ep.peer_done(b"mine");
        assert_eq!(
            b.feed(OTHER, &peer_request(8, b"mine")),
            Seen::Frame { id: 5, src: 8 }
        );

        // The peer's request comes before ours waits: dropped (the peer
        // repeats it), then it finds ours.
        let mut b = Bench::new(EndpointConfig::default());
        assert_eq!(b.feed(OTHER, &peer_request(8, b"mine")), Seen::Dropped);
        assert_eq!(b.ep.stats().unknown, 1);
        b.ep.register(5, OTHER);
        b.ep.peer_connect(b"mine", OTHER, 5).expect("free");
        assert_eq!(
            b.feed(OTHER, &peer_request(8, b"mine")),
            Seen::Frame { id: 5, src: 8 }
        );
        // A rendezvous whose connection is gone hands nothing on.
        b.ep.unregister(5);
        assert_eq!(b.feed(OTHER, &peer_request(8, b"mine")), Seen::Dropped);
    }

    #[test]
    fn a_request_another_process_waits_for_is_forwarded_there_with_its_repetitions() {
        let mut b = Bench::new(EndpointConfig::default());
        b.ep.forward(Wait::Listen, b"srv", 7);
        assert_eq!(b.feed(CLIENT, &request(1, b"srv", b"")), Seen::Forward(7));
        assert_eq!(b.feed(CLIENT, &request(1, b"srv", b"")), Seen::Forward(7));
        // Nobody here or there waits on another name: refused as before.
        assert_eq!(
            b.feed(CLIENT, &request(2, b"none", b"")),
            reject(CLIENT, 2, RejectReason::NoListener, b"")
        );
        // A listener of its own comes first for new requests; a request
        // already sent on stays with the process it went to.
        b.ep.listen(b"srv");
        assert_eq!(
            b.feed(CLIENT, &request(3, b"srv", b"")),
            Seen::Request(b"srv".to_vec())
        );
        assert_eq!(b.feed(CLIENT, &request(1, b"srv", b"")), Seen::Forward(7));
        b.ep.stop_listening(b"srv");
        // A later process waiting on the name takes it over; withdrawing
        // a name another process now holds changes nothing.
        b.ep.forward(Wait::Listen, b"srv", 8);
        b.ep.withdraw(Wait::Listen, b"srv", 7);
        assert_eq!(b.feed(CLIENT, &request(4, b"srv", b"")), Seen::Forward(8));
        // Listening and peer waits are apart.
        assert_eq!(b.feed(CLIENT, &peer_request(5, b"srv")), Seen::Dropped);
        b.ep.forward(Wait::Peer, b"p2p", 8);
        assert_eq!(b.feed(OTHER, &peer_request(5, b"p2p")), Seen::Forward(8));
        assert_eq!(b.ep.stats().forwarded, 5);
        // The process has gone: nothing more goes there.
        b.ep.withdraw_member(8);
        assert_eq!(
            b.feed(CLIENT, &request(4, b"srv", b"")),
            reject(CLIENT, 4, RejectReason::NoListener, b"")
        );
        assert_eq!(b.feed(OTHER, &peer_request(5, b"p2p")), Seen::Dropped);
        b.ep.forward(Wait::Listen, b"srv", 9);
        b.ep.withdraw(Wait::Listen, b"srv", 9);
        assert_eq!(
            b.feed(CLIENT, &request(6, b"srv", b"")),
            reject(CLIENT, 6, RejectReason::NoListener, b"")
        );
    }

    #[test]
    fn a_peer_request_from_another_address_of_the_named_host_is_the_peers() {
        // Addresses 0xHP: host H, port P. The peer shares host 1's address
        // 0x10 with another process and asks from 0x12, its own.
        let hosts = |a: &u8, b: &u8| a >> 4 == b >> 4;
        let mut b = Bench::new(EndpointConfig::default());
        b.ep = Endpoint::new(EndpointConfig::default()).with_hosts(hosts);
        b.ep.register(5, 0x10);
        b.ep.peer_connect(b"mine", 0x10, 5).expect("free");
        assert_eq!(
            b.feed(0x20, &peer_request(8, b"mine")),
            Seen::Dropped,
            "another host"
        );
        assert_eq!(
            b.feed(0x12, &peer_request(8, b"mine")),
            Seen::Frame { id: 5, src: 8 }
        );
        // Known by that address from now on: its repetitions reach the
        // connection once it is established.
        assert_eq!(b.ep.peer_of(5), Some(0x12));
        assert!(b.ep.established(0x12, 8, 5));
        b.ep.peer_done(b"mine");
        assert_eq!(
            b.feed(0x12, &peer_request(8, b"mine")),
            Seen::Frame { id: 5, src: 8 }
        );
        assert_eq!(b.ep.peer_of(6), None);
    }

    #[test]
    fn malformed_frames_are_counted_and_the_checksum_follows_the_config() {
        let mut b = Bench::new(EndpointConfig::default());
        b.ep.register(5, CLIENT);
        let mut f = data(5, 9);
        assert_eq!(b.feed(CLIENT, &[]), Seen::Dropped);
        assert_eq!(b.feed(CLIENT, &f[..20]), Seen::Dropped);
        f[12..16].fill(0);
        assert_eq!(b.feed(CLIENT, &f), Seen::Dropped, "checksum left out");
        assert_eq!(b.ep.stats().malformed, 3);
        // A kind no frame has, checksum right: counted, not handed on.
        let mut u = data(5, 9);
        u[1] = 0x0b;
        wire::fill_checksum(&mut u);
        assert_eq!(b.feed(CLIENT, &u), Seen::Dropped, "unknown kind");
        assert_eq!(b.ep.stats().malformed, 4);
        // An intact medium: the checksum is not looked at.
        let mut b = Bench::new(EndpointConfig {
            intact: true,
            ..EndpointConfig::default()
        });
        b.ep.register(5, CLIENT);
        assert_eq!(b.feed(CLIENT, &f), Seen::Frame { id: 5, src: 9 });
        assert_eq!(b.ep.stats().malformed, 0);
        assert_eq!(b.feed(CLIENT, &u), Seen::Dropped, "unknown kind, intact");
        assert_eq!(b.ep.stats().malformed, 1);
    }
}
