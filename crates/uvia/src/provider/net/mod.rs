//! The network providers, `udp` and `xdp`: the I/O-free protocol engine
//! ([`uvia_proto`]) over a frame medium ([`uvia_net::Medium`]): kernel UDP
//! sockets, or raw Ethernet through AF_XDP.
//!
//! The Nic half (here) opens the medium, keeps the table of connections and
//! listeners, and hands each arriving frame to the VI it names; the VI half
//! (`vi`) drives one connection's engine.

mod closing;
mod deadlines;
mod peers;
mod share;
mod vi;
mod watch;
#[cfg(test)]
pub(crate) use vi::held_frames;
#[cfg(test)]
use vi::{acks_sent, keeps_watch};

use deadlines::{Deadlines, Due, Noted};
use share::Share;
pub(crate) use vi::{NetVi, Sleep};

use crate::cm::{
    check_compatible, ConnRequest, Discriminator, NetAddress, Patience, RemoteViAttributes,
};
use crate::error::{ConnectError, OpenError};
use crate::lock::SpinLock;
use crate::nic::{Nic, NicAttributes, NicOptions, NicShared};
use crate::provider::{Answer as AnyAnswer, NicOps, NicProvider, Opened, Transport, TransportOps};
use crate::vi::{Queues, Reliability, Vi, ViAttributes, ViInner, ViShared, ViState};
use std::cell::Cell;
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use uvia_net::{Addr, Medium, OutFrame, RecvBatch};
use uvia_proto::endpoint::{Endpoint, EndpointConfig, EndpointEvent};
use uvia_proto::wire::{self, ConnAttrs, PrivateData, RejectReason, Repr};
use uvia_proto::{Clock, Config, Conn, Event, Level, RnrPolicy};

/// Most frames gathered before one call to the medium.
pub(super) const TX_BATCH: usize = 32;
/// Pause before a message the receiver was not ready for goes again.
const RNR_DELAY: Duration = Duration::from_micros(200);
use crate::nic::DEFAULT_IDLE_TIMEOUT as IDLE_TIMEOUT;

/// A connection request waiting for a server's answer.
pub(crate) type Incoming = uvia_proto::endpoint::Incoming<Addr>;

/// Makes a medium for one connection: on an address of its own, taking
/// frames from anyone until [`Medium::connect`] names its peer.
pub(crate) type OwnMediumFactory = Box<dyn Fn() -> Option<Box<dyn Medium>> + Send + Sync>;

/// The network half of a Nic: its medium, the protocol engine's endpoint
/// (which connection a frame is for, listeners, refusals, rendezvous) and
/// the VI behind each connection.
pub(crate) struct NetNic {
    pub medium: Box<dyn Medium>,
    /// Makes a connection a medium of its own (a UDP socket on a port of
    /// its own), when the medium allows it.
    pub own_medium: Option<OwnMediumFactory>,
    pub max_frame: usize,
    /// The medium delivers frames intact or not at all: checksums are not
    /// verified here, and peers are told they may leave them out.
    pub(super) intact: bool,
    /// The medium lends its buffers: frames are parsed where they arrived
    /// and built where they leave from, with no copy in between.
    pub lends: bool,
    /// The interface of an Ethernet medium: peers' MAC addresses are
    /// looked up in its neighbour table.
    iface: Option<String>,
    pub idle_timeout: Duration,
    /// The job key this Nic's requests carry (0: none).
    job: u64,
    endpoint: SpinLock<Endpoint<Addr>>,
    /// Local connection id -> its VI.
    vis: SpinLock<HashMap<u32, Weak<ViShared>>>,
    rx: std::sync::Mutex<RxState>,
    /// When the VIs' timers are next due: what a sweep looks at.
    deadlines: Deadlines,
    /// The own sockets of the VIs with no timers: which have frames, for
    /// every sweep.
    watch: watch::Watch,
    /// This Nic's token, announced in its connections' handshakes: peers
    /// know by it which of their connections end here.
    token: u64,
    /// What the connections to each peer Nic know of it together
    /// ([`peers`]: one keep-alive for all of them).
    peers: peers::Peers,
    /// Frames of a VI's own medium that did not parse, or named another
    /// connection.
    pub malformed: AtomicU64,
    /// The device address, when it is shared with other processes of the
    /// user (a udp Nic on a port named).
    share: Option<Arc<Share>>,
    /// Connections whose VI is gone, kept while they close ([`closing`]).
    closer: Arc<closing::Closer>,
    /// Frames for VIs that were held when they came ([`Parked`]), and
    /// whether there are any (read by every poll).
    parked: SpinLock<Vec<Parked>>,
    parked_any: AtomicBool,
}

/// A frame the Nic's medium brought for a VI whose lock was held: by
/// another thread, or by the polling thread itself further up its stack (a
/// VI's timers sweep the Nic's other VIs, whose polls may find the first
/// one's frames). Taking that lock would wait on a thread that waits on
/// this one, or on this thread itself: the frame waits here instead, and
/// the next poll of the Nic hands it over. (A poll takes a VI's lock while
/// it holds its own: never waiting for one is what keeps two of them from
/// each waiting on the other's.)
struct Parked {
    id: u32,
    from: Addr,
    bytes: Vec<u8>,
}

/// Most frames parked at once; one more is dropped (and sent again by its
/// peer, as a lost frame is).
const PARKED_MOST: usize = 256;

/// Most connections with frames waiting that one sweep reads for their
/// programs ([`watch`]); a later sweep takes the rest.
const READY_MOST: usize = 256;

impl Drop for NetNic {
    fn drop(&mut self) {
        self.closer.nic_gone();
        if let Some(s) = &self.share {
            s.stop();
        }
    }
}

struct RxState {
    batch: RecvBatch,
    /// For frames answered without a VI (rejects, disconnect acks).
    reply: Vec<u8>,
}

impl NetNic {
    fn new(
        medium: Box<dyn Medium>,
        own_medium: Option<OwnMediumFactory>,
        iface: Option<String>,
        idle_timeout: Duration,
        job: u64,
        share: Option<Arc<Share>>,
    ) -> NetNic {
        let caps = medium.caps().clone();
        // Connection ids start somewhere different in each Nic, so frames of
        // an earlier run's connection do not land on a new one.
        let seed = std::process::id()
            ^ (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
                << 8);
        let endpoint = Endpoint::new(EndpointConfig {
            intact: caps.intact,
            id_seed: seed | 1,
            job,
            ..EndpointConfig::default()
        })
        .with_hosts(same_host);
        NetNic {
            max_frame: caps.max_frame,
            intact: caps.intact,
            lends: caps.lends,
            iface,
            idle_timeout,
            job,
            endpoint: SpinLock::new(endpoint),
            vis: SpinLock::new(HashMap::new()),
            rx: std::sync::Mutex::new(RxState {
                // A medium that lends its frames needs no batch of its own.
                batch: match caps.lends {
                    true => RecvBatch::new(1, 1),
                    false => RecvBatch::new(caps.max_batch.clamp(1, 64), 65_536),
                },
                reply: vec![0; wire::MAX_REPLY_LEN],
            }),
            malformed: AtomicU64::new(0),
            deadlines: Deadlines::new(Instant::now()),
            watch: watch::Watch::new(),
            token: peers::new_token(),
            peers: peers::Peers::default(),
            medium,
            own_medium,
            share,
            closer: Arc::default(),
            parked: SpinLock::new(Vec::new()),
            parked_any: AtomicBool::new(false),
        }
    }

    /// Checks and parses a frame from a VI's own medium.
    pub(super) fn parse<'a>(
        &self,
        bytes: &'a [u8],
    ) -> Result<(u32, u32, Repr<'a>), wire::WireError> {
        parse(self.intact, bytes)
    }

    /// Starts queueing requests for `discriminator` (and, on a shared
    /// device, has them handed over by its owner).
    pub fn listen(&self, discriminator: &[u8]) {
        self.endpoint.lock().listen(discriminator);
        if let Some(s) = &self.share {
            s.tell(uvia_net::share::Interest::Listen, discriminator, true);
        }
    }

    /// The oldest request waiting on `discriminator`.
    pub fn take_request(&self, discriminator: &[u8]) -> Option<Incoming> {
        self.endpoint.lock().take_request(discriminator)
    }

    /// Answers a request with a refusal, now and for its repetitions.
    pub fn reject(&self, req: &Incoming, reason: RejectReason, private: &PrivateData) {
        let mut buf = [0u8; wire::MAX_REPLY_LEN];
        let n = self.endpoint.lock().reject(req, reason, private, &mut buf);
        if n > 0 {
            let _ = self.medium.send(&[OutFrame {
                to: req.from,
                bytes: &buf[..n],
            }]);
        }
    }

    /// A new connection to `peer`, driven by `vi`: its id.
    fn register(&self, vi: &Arc<ViShared>, peer: Addr) -> u32 {
        let id = {
            let mut ep = self.endpoint.lock();
            let id = ep.new_id();
            ep.register(id, peer);
            id
        };
        self.vis.lock().insert(id, Arc::downgrade(vi));
        id
    }

    /// Connection `id` to `peer` is joined to the peer's `peer_id`.
    fn established(&self, peer: Addr, peer_id: u32, id: u32) {
        self.endpoint.lock().established(peer, peer_id, id);
    }

    /// The peer's side of connection `id` sends from `from`.
    pub(super) fn joined(&self, id: u32, from: Addr) {
        self.endpoint.lock().joined(id, from);
    }

    /// What the endpoint makes of a frame a connecting VI's own medium
    /// received from `from`: the frame for connection `id`, or nothing
    /// (another connection's, another host's, or not a frame).
    pub(super) fn handshake_frame<'a>(
        &self,
        now: Instant,
        id: u32,
        from: Addr,
        bytes: &'a [u8],
    ) -> Option<(u32, Repr<'a>)> {
        // Nothing but frames naming the connection: a request sent to a
        // connection's address is no request to the Nic's listeners.
        let dst = self.parse(bytes).ok()?.0;
        if dst != id {
            self.malformed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        // No reply to write: a frame for a live connection needs none.
        match self.endpoint.lock().handle(now, from, bytes, &mut []) {
            Some(EndpointEvent::Frame { id: got, src, repr }) if got == id => Some((src, repr)),
            _ => None,
        }
    }

    pub fn unregister(&self, id: u32) {
        self.endpoint.lock().unregister(id);
        self.vis.lock().remove(&id);
    }

    /// Connection `id`'s VI is gone, but the connection stays in the
    /// endpoint while it closes ([`closing`]): its frames go to the closer.
    fn forget_vi(&self, id: u32) {
        self.vis.lock().remove(&id);
    }

    /// Reads what has arrived and hands each frame to its VI. `me` is the
    /// calling VI, already locked. Returns the time the frames were taken
    /// in, if any arrived (the caller's timers need no clock read of their
    /// own then). Only one caller polls at a time; the others return at
    /// once (they are served by the one polling).
    pub fn poll(&self, mut me: Option<(&Vi, &mut Queues, &mut NetVi)>) -> Option<Instant> {
        let Ok(mut rx) = self.rx.try_lock() else {
            return None;
        };
        let RxState { batch, reply } = &mut *rx;
        // The clock is read only when something arrived; on a medium that
        // lends its frames, while they are fetched.
        let now = Cell::new(None);
        let read_clock = || match now.get() {
            Some(t) => t,
            None => {
                let t = Instant::now();
                now.set(Some(t));
                t
            }
        };
        if self.parked_any.load(Ordering::Acquire) {
            self.unpark(&mut me, read_clock());
        }
        let mut on_frame = |from: Addr, bytes: &[u8]| {
            self.dispatch(from, bytes, &mut me, read_clock(), reply);
        };
        let n = if self.lends {
            // Frames are read where the medium holds them.
            self.medium.recv_lent(
                &mut || {
                    read_clock();
                },
                &mut on_frame,
            )
        } else {
            self.medium.recv(batch).inspect(|&n| {
                for i in 0..n {
                    let (from, bytes) = batch.frame(i);
                    on_frame(from, bytes);
                }
            })
        };
        // A device address taken over from its exited owner is read too.
        let host = match self.share.as_ref().and_then(|s| s.host()) {
            Some(h) => h.recv(batch).inspect(|&n| {
                for i in 0..n {
                    let (from, bytes) = batch.frame(i);
                    on_frame(from, bytes);
                }
            }),
            None => Ok(0),
        };
        // Every frame handed over read the clock first.
        let got = n.is_ok_and(|n| n > 0) || host.is_ok_and(|n| n > 0);
        now.get().filter(|_| got)
    }

    /// Serves the Nic's other VIs whose protocol timers are due, if
    /// nobody holds them now: they read their media, acknowledge, send
    /// again and keep alive as if polled. A VI's frames reach it only
    /// through its own polls when it has a medium of its own, so without
    /// this a VI its program has stopped polling for a while (waiting on
    /// another) would leave its peer waiting for an acknowledgement — a
    /// peer that may be waiting for that before it answers the VI being
    /// waited on. Called with a polling VI's timers, at most every
    /// [`deadlines::SWEEP_EVERY`]; `me` is the caller's connection, already
    /// in hand.
    ///
    /// A sweep looks only at the VIs whose deadlines have come (see
    /// [`deadlines`]): a waiter over many idle VIs pays a load a wake-up,
    /// and a look at the few that are due; every VI about once a second.
    pub(super) fn sweep(&self, now: Instant, me: u32) {
        let Some(due) = self.deadlines.take_due(now, me) else {
            return;
        };
        // The VIs whose sockets have frames are read too: one with no
        // timers (its peer's Nic kept alive by another connection) is
        // otherwise read only when its program polls it.
        let mut ready = Vec::new();
        self.watch.ready(&mut ready, READY_MOST);
        ready.retain(|&id| id != me);
        let others: Vec<(u32, Arc<ViShared>)> = {
            let vis = self.vis.lock();
            let ready = ready
                .iter()
                .filter_map(|&id| Some((id, vis.get(&id)?.upgrade()?)));
            match due {
                Due::All => vis
                    .iter()
                    .filter(|(&id, _)| id != me)
                    .filter_map(|(&id, w)| Some((id, w.upgrade()?)))
                    .collect(),
                // A VI listed twice is looked at twice: the second look
                // finds nothing due and notes its deadline again.
                Due::These(ids) => ids
                    .iter()
                    .filter_map(|&id| Some((id, vis.get(&id)?.upgrade()?)))
                    .chain(ready)
                    .collect(),
            }
        };
        for (id, s) in others {
            // A VI in someone's hands is served by them; it goes (back) on
            // the short list and is looked at again soon, in case they only
            // passed by. (Listed twice at worst: a later sweep takes both.)
            let Some(mut g) = s.inner.try_lock() else {
                self.deadlines.put_back(id, now);
                continue;
            };
            let vi = Vi { s: s.clone() };
            let ViInner { q, t } = &mut *g;
            if let Transport::Net(t) = t {
                t.noted.soon = false;
                let shared = t.share_if_changed(now, self);
                let frames = ready.contains(&id);
                match t.conn.poll_timeout() {
                    Some(d) if d <= now => {
                        t.progress(&vi, q);
                        t.run_timers(&vi, q);
                    }
                    // (Unsettled: an ack that came with data its program
                    // took; the sends it completes go to their queue now.)
                    _ if frames || shared || t.conn.unsettled() => {
                        t.progress(&vi, q);
                        t.run_timers(&vi, q);
                    }
                    d => self.deadlines.note(d, now, t.id, &mut t.noted),
                }
            }
        }
    }

    /// Connection `id`'s engine has its next deadline at `at` (seen at
    /// `now`): a sweep serves it then ([`Deadlines::note`]).
    fn note_deadline(&self, at: Option<Instant>, now: Instant, id: u32, noted: &mut Noted) {
        self.deadlines.note(at, now, id, noted);
    }

    /// Hands one arrived frame to what the endpoint says it is for.
    fn dispatch(
        &self,
        from: Addr,
        bytes: &[u8],
        me: &mut Option<(&Vi, &mut Queues, &mut NetVi)>,
        now: Instant,
        reply: &mut [u8],
    ) {
        // The polling VI's own frames, from the address its peer's
        // connection sends from, go straight to it: the endpoint would find
        // the same connection under its lock and in its table.
        if let Some((vi, q, t)) = me {
            if t.takes_from(from) {
                if let Ok((dst, src, repr)) = self.parse(bytes) {
                    if dst == t.id {
                        t.input(vi, q, from, src, &repr, &mut Clock::at(now));
                        return;
                    }
                }
            }
        }
        let ev = self.endpoint.lock().handle(now, from, bytes, reply);
        match ev {
            Some(EndpointEvent::Frame { id, src, repr }) => {
                if let Some((vi, q, t)) = me {
                    if t.id == id {
                        t.input(vi, q, from, src, &repr, &mut Clock::at(now));
                        return;
                    }
                }
                self.hand_to(id, from, src, &repr, bytes, me, now);
            }
            Some(EndpointEvent::Transmit { to, len }) => {
                let _ = self.medium.send(&[OutFrame {
                    to,
                    bytes: &reply[..len],
                }]);
            }
            Some(EndpointEvent::Forward { member }) => {
                if let Some(s) = &self.share {
                    s.forward(member, from, bytes);
                }
            }
            // A listener takes it in its connect-wait (woken, on a shared
            // device, if another thread took the request in).
            Some(EndpointEvent::Request { .. }) => {
                if let Some(s) = &self.share {
                    s.queued();
                }
            }
            None => {}
        }
    }

    /// Hands frame `bytes` (parsed: `repr`) to connection `id`'s engine:
    /// the polling VI's own, or another VI's under its lock (which then
    /// sends what the frame produced), or, if the VI is gone, the
    /// connection's while it closes. If another VI's lock is held, the
    /// frame is parked for a later poll.
    #[allow(clippy::too_many_arguments)]
    fn hand_to(
        &self,
        id: u32,
        from: Addr,
        src: u32,
        repr: &Repr<'_>,
        bytes: &[u8],
        me: &mut Option<(&Vi, &mut Queues, &mut NetVi)>,
        now: Instant,
    ) {
        // (The table's lock is let go before the frame is handed over.)
        let target = self.vis.lock().get(&id).and_then(Weak::upgrade);
        let Some(target) = target else {
            // A connection whose VI is gone, closing.
            self.closer.deliver(id, now, src, repr);
            return;
        };
        match me {
            Some((vi, q, t)) if Arc::ptr_eq(&vi.s, &target) => {
                t.input(vi, q, from, src, repr, &mut Clock::at(now))
            }
            _ => {
                let vi = Vi { s: target };
                let Some(mut g) = vi.s.inner.try_lock() else {
                    self.park(id, from, bytes);
                    return;
                };
                let ViInner { q, t } = &mut *g;
                if let Transport::Net(t) = t {
                    t.input(&vi, q, from, src, repr, &mut Clock::at(now));
                    t.output(&vi, q, now);
                }
            }
        }
    }

    /// Keeps a frame for connection `id` until a later poll ([`Parked`]).
    #[cold]
    fn park(&self, id: u32, from: Addr, bytes: &[u8]) {
        let mut p = self.parked.lock();
        if p.len() >= PARKED_MOST {
            return;
        }
        p.push(Parked {
            id,
            from,
            bytes: bytes.to_vec(),
        });
        self.parked_any.store(true, Ordering::Release);
    }

    /// Hands the parked frames over (under the Nic's receive lock, as
    /// arriving ones): to `me` directly, to others under their locks if
    /// free, else they stay parked.
    #[cold]
    fn unpark(&self, me: &mut Option<(&Vi, &mut Queues, &mut NetVi)>, now: Instant) {
        let parked = {
            let mut p = self.parked.lock();
            self.parked_any.store(false, Ordering::Relaxed);
            std::mem::take(&mut *p)
        };
        for f in parked {
            if let Ok((_, src, repr)) = self.parse(&f.bytes) {
                self.hand_to(f.id, f.from, src, &repr, &f.bytes, me, now);
            }
        }
    }

    /// The network half of `nic`, if it is a network Nic (every network
    /// VI's Nic is).
    #[inline]
    pub(super) fn of(nic: &NicShared) -> Option<&NetNic> {
        match &nic.provider {
            NicProvider::Net(n) => Some(n),
            _ => None,
        }
    }
}

impl NetNic {
    /// A medium for one connection, if the Nic's allows one.
    pub(super) fn own_socket(&self) -> Option<Arc<dyn Medium>> {
        self.own_medium.as_ref()?().map(Arc::from)
    }
}

/// True if two medium addresses are one host's: IP addresses with any
/// ports (a connection answers from a socket of its own), or one MAC
/// address.
fn same_host(a: &Addr, b: &Addr) -> bool {
    match (a, b) {
        (Addr::Ip(a), Addr::Ip(b)) => a.ip() == b.ip(),
        _ => a == b,
    }
}

/// The faults to inject: the Nic's options, else `UVIA_INJECT`.
fn fault_spec(opts: &NicOptions) -> Result<Option<uvia_net::inject::FaultSpec>, OpenError> {
    let spec = match &opts.inject {
        Some(s) => Some(s.clone()),
        None => std::env::var("UVIA_INJECT").ok().filter(|s| !s.is_empty()),
    };
    spec.map(|s| {
        s.parse()
            .map_err(|e: uvia_net::inject::FaultSpecError| OpenError::BadInject(e.to_string()))
    })
    .transpose()
}

/// `m`, wrapped in the fault injector when faults are asked for.
fn with_faults<M: uvia_net::Medium + 'static>(
    m: M,
    fault: &Option<uvia_net::inject::FaultSpec>,
) -> Box<dyn uvia_net::Medium> {
    match fault {
        None => Box::new(m),
        Some(f) => Box::new(uvia_net::inject::Inject::new(m, f.clone())),
    }
}

/// The udp provider's socket settings. Receive offload stays off: with it
/// on, a datagram's segment size comes only in a control message, so every
/// poll would need `recvmsg`; without it a poll is one `recvfrom`, about
/// 0.45 us less per message (measured with `uvia pingpong`, both settings
/// alternated), and segmented sends still arrive as separate datagrams.
/// A connection's own socket switches it on while a stream comes.
pub(super) fn udp_options() -> uvia_net::udp::UdpOptions {
    uvia_net::udp::UdpOptions {
        gro: false,
        ..uvia_net::udp::UdpOptions::default()
    }
}

/// `udp` (127.0.0.1, any port) or `udp:<ip>[:<port>]`, IPv6 in brackets.
pub(crate) fn open_udp(name: &str, opts: &NicOptions) -> Result<Opened, OpenError> {
    use std::net::{IpAddr, SocketAddr};
    let bad = |reason: &str| OpenError::bad_address(name, reason);
    let spec = name.strip_prefix("udp").unwrap_or("");
    let bind: SocketAddr = match spec.strip_prefix(':') {
        None | Some("") => SocketAddr::from(([127, 0, 0, 1], 0)),
        Some(a) => match a.parse::<SocketAddr>() {
            Ok(sa) => sa,
            Err(_) => match a.trim_matches(|c| c == '[' || c == ']').parse::<IpAddr>() {
                Ok(ip) => SocketAddr::new(ip, 0),
                Err(_) => return Err(bad("want <ip>, <ip>:<port> or [<ipv6>]:<port>")),
            },
        },
    };
    let io = |e: &dyn std::fmt::Display| OpenError::Io {
        provider: "udp",
        source: std::io::Error::other(e.to_string()),
    };
    // A port named is a device address the user's processes on the host
    // share: the first to open it owns it; a later one joins the owner and
    // sends from a port of its own on the same IP address.
    let (udp, share) = match uvia_net::udp::UdpMedium::bind(bind, udp_options()) {
        Ok(udp) if bind.port() != 0 => {
            let share = Share::owner(udp.local_ip()).map_err(|e| io(&e))?;
            (udp, Some(share))
        }
        Ok(udp) => (udp, None),
        Err(uvia_net::udp::UdpError::InUse { .. }) => {
            let share = Share::member(bind).map_err(|e| io(&e))?;
            let own_port = SocketAddr::new(bind.ip(), 0);
            let udp =
                uvia_net::udp::UdpMedium::bind(own_port, udp_options()).map_err(|e| io(&e))?;
            (udp, Some(share))
        }
        Err(e) => return Err(io(&e)),
    };
    let address = match share {
        Some(_) => bind.to_string(),
        None => udp.local_ip().to_string(),
    };
    let fault = fault_spec(opts)?;
    let local = udp.local_ip();
    let medium = with_faults(udp, &fault);
    // Each connection gets a socket of its own, on a port of its own of the
    // Nic's IP address, connected to its peer's once the handshake has
    // named it (faults injected there too, each from its own seed).
    let next_seed = std::sync::atomic::AtomicU64::new(1);
    let own: OwnMediumFactory = Box::new(move || {
        let any_port = SocketAddr::new(local.ip(), 0);
        // A connection's socket has one reader at a time (the VI's poll,
        // or the waiter it lends its batch to, or its closer): it may
        // switch receive offload on while a stream comes.
        let opts = uvia_net::udp::UdpOptions {
            gro_while_streaming: true,
            ..udp_options()
        };
        let m = uvia_net::udp::UdpMedium::bind(any_port, opts).ok()?;
        let mut f = fault.clone();
        if let Some(f) = &mut f {
            f.seed = f
                .seed
                .wrapping_add(next_seed.fetch_add(1, Ordering::Relaxed));
        }
        Some(with_faults(m, &f))
    });
    open_net(name, "udp", medium, address, Some(own), None, opts, share)
}

/// `xdp:<interface>[:<queue>][:native|:generic][:busypoll]`: raw Ethernet
/// through an AF_XDP socket (root only). Without a mode, the XDP program
/// runs where it is fastest for the driver (see
/// [`Interface::preferred_mode`](uvia_net::xdp::Interface::preferred_mode));
/// `busypoll` has the Nic's polls run the queue themselves
/// ([`XdpOptions::busy_poll`](uvia_net::xdp::XdpOptions::busy_poll)).
pub(crate) fn open_xdp(name: &str, opts: &NicOptions) -> Result<Opened, OpenError> {
    let (iface, xdp_opts) = xdp_spec(name)?;
    let xdp = uvia_net::xdp::XdpMedium::open(iface, &xdp_opts).map_err(|e| OpenError::Io {
        provider: "xdp",
        source: std::io::Error::other(e.to_string()),
    })?;
    let fault = fault_spec(opts)?;
    let medium = with_faults(xdp, &fault);
    let address = medium.local_addr().to_string();
    let iface = Some(iface.to_string());
    open_net(name, "xdp", medium, address, None, iface, opts, None)
}

/// The interface and options an `xdp:` name asks for.
fn xdp_spec(name: &str) -> Result<(&str, uvia_net::xdp::XdpOptions), OpenError> {
    use uvia_net::xdp::bpf::Mode;
    const FORM: &str = "want xdp:<interface>[:<queue>][:native|:generic][:busypoll]";
    let bad = |reason: &str| OpenError::bad_address(name, reason);
    let spec = name.strip_prefix("xdp:").unwrap_or("");
    let mut parts = spec.split(':');
    let iface = parts.next().unwrap_or("");
    if iface.is_empty() {
        return Err(bad(FORM));
    }
    let (mut queue, mut mode, mut busy_poll) = (None, None, false);
    for p in parts {
        match p {
            "busypoll" if !busy_poll => busy_poll = true,
            _ if busy_poll => return Err(bad(FORM)),
            "native" if mode.is_none() => mode = Some(Mode::Native),
            "generic" if mode.is_none() => mode = Some(Mode::Generic),
            q if queue.is_none() && mode.is_none() => {
                queue = Some(q.parse::<u32>().map_err(|_| {
                    bad("after the interface: a queue number, then native or generic, then busypoll")
                })?)
            }
            _ => return Err(bad(FORM)),
        }
    }
    let opts = uvia_net::xdp::XdpOptions {
        queue: queue.unwrap_or(0),
        mode,
        busy_poll,
    };
    Ok((iface, opts))
}

/// A Nic over a frame medium: the protocol engine drives its VIs.
/// `address` is the Nic's address as peers name it (a shared device's,
/// not the port its medium sends from).
#[allow(clippy::too_many_arguments)]
fn open_net(
    name: &str,
    provider: &'static str,
    medium: Box<dyn uvia_net::Medium>,
    address: String,
    own: Option<OwnMediumFactory>,
    iface: Option<String>,
    opts: &NicOptions,
    share: Option<Arc<Share>>,
) -> Result<Opened, OpenError> {
    let max_frame = medium.caps().max_frame;
    let attrs = NicAttributes {
        inline_threshold: max_frame.saturating_sub(uvia_proto::wire::DATA_HEADER_LEN),
        peer_to_peer: true,
        needs_driving: true,
        ..NicAttributes::common(name, provider, address)
    };
    let idle = opts.idle_timeout.unwrap_or(IDLE_TIMEOUT);
    let net = NetNic::new(medium, own, iface, idle, crate::nic::job_key(opts), share);
    Ok((attrs, NicProvider::Net(net)))
}

impl NetNic {
    /// Runs the due timers of the Nic's VIs ([`NicProvider::run_due_timers`]).
    pub(super) fn run_due_timers(&self) {
        // 0 is no connection's id: every VI is looked at.
        self.sweep(Instant::now(), 0);
    }

    /// Has the medium give back what its receives keep for later
    /// ([`Medium::settle`](uvia_net::Medium::settle)).
    pub(super) fn settle(&self) {
        self.medium.settle();
    }

    /// Sweeps made so far ([`Deadlines::sweeps`]).
    pub(super) fn sweeps(&self) -> u64 {
        self.deadlines.sweeps()
    }

    /// How long a sleeping waiter may sleep before one of the VIs' timers
    /// is due ([`Deadlines::due_in`]). A waiter that woke every
    /// millisecond to find nothing due cost an idle process about 1.6% of
    /// a CPU.
    pub(super) fn timers_due_in(&self) -> Duration {
        self.deadlines.due_in(Instant::now())
    }
}

/// Checks and parses a frame: its checksum is not looked at when the
/// medium delivers frames `intact`.
pub(super) fn parse(intact: bool, bytes: &[u8]) -> Result<(u32, u32, Repr<'_>), wire::WireError> {
    match intact {
        true => wire::parse_intact(bytes),
        false => wire::parse(bytes),
    }
}

impl NetNic {
    /// The engine's settings for a VI with `attrs` on this Nic.
    fn config(&self, attrs: &ViAttributes) -> Config {
        let net = self;
        Config {
            level: level(attrs.reliability),
            max_frame: net.max_frame as u32,
            max_transfer: attrs.max_transfer_size,
            rdma_write: attrs.enable_rdma_write,
            rdma_read: attrs.enable_rdma_read,
            idle_timeout: net.idle_timeout,
            keepalive: net.idle_timeout / 4,
            intact: net.intact,
            job: net.job,
            nic: net.token,
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

    #[allow(clippy::too_many_arguments)]
    fn connect_inner(
        &self,
        vi: &Vi,
        remote: &NetAddress,
        peer_to_peer: bool,
        to: Addr,
        id: u32,
        start: Instant,
        wait: Patience,
        private: &PrivateData,
    ) -> Result<RemoteViAttributes, ConnectError> {
        let nic = self;
        let timeout = wait.timeout;
        // One medium of its own for every try: the connection's frames go
        // from there once the peer has answered.
        let own = nic.own_socket();
        let nobody_there = match to {
            Addr::Ip(a) if wait.listener < timeout => NobodyThere::probe(a),
            _ => None,
        };
        let mut last_no_listener = false;
        loop {
            {
                let mut g = vi.lock();
                let mut cfg = self.config(&g.q.attrs);
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
                )
                .with_private(*private);
                let ViInner { q, t } = &mut *g;
                let mut n = NetVi::new(conn, to, id, nic.max_frame);
                n.set_own(own.clone());
                crate::cq::socket_changed(&vi.s);
                n.adopt_recvs(q);
                *t = Transport::Net(n);
            }
            // Drive the handshake until it ends one way or the other.
            let ev = loop {
                {
                    let mut g = vi.lock();
                    let ViInner { q, t } = &mut *g;
                    if let Transport::Net(t) = t {
                        // Timers every time round: each round waits for the
                        // medium, so progress's every-few-polls look at them
                        // would hold the first request back that many naps.
                        t.run_timers(vi, q);
                        t.progress(vi, q);
                        if let Some(ev) = t.handshake.take() {
                            // The answer's private data, for an accept and a reject alike.
                            q.remote_private = t.conn.peer_private().to_vec();
                            break ev;
                        }
                    }
                }
                if start.elapsed() >= timeout {
                    break Event::ConnectTimedOut;
                }
                if nobody_there.as_ref().is_some_and(NobodyThere::heard) {
                    break Event::Rejected(RejectReason::NoListener);
                }
                // Peer to peer on a shared device, the peer's request may
                // come handed over by the device's owner.
                nic.serve_share();
                nic.wait_nic(Duration::from_millis(5));
            };
            match ev {
                Event::Connected => {
                    let mut g = vi.lock();
                    let ViInner { q, t } = &mut *g;
                    let Transport::Net(t) = t else {
                        return Err(ConnectError::Protocol("connection lost while connecting"));
                    };
                    let Some(p) = t.conn.peer_attrs() else {
                        return Err(ConnectError::Protocol("accept without attributes"));
                    };
                    let remote = remote_attrs(&p);
                    q.remote = Some(remote.clone());
                    vi.set_state(ViState::Connected);
                    return Ok(remote);
                }
                Event::Rejected(RejectReason::NoListener)
                    if start.elapsed() < wait.listener.min(timeout) =>
                {
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
                Event::Rejected(RejectReason::WrongJob) => return Err(ConnectError::WrongJob),
                Event::Rejected(_) => return Err(ConnectError::Rejected),
                _ => {
                    if last_no_listener {
                        return Err(ConnectError::NoListener {
                            nic: remote.host.clone(),
                            discriminator: remote.discriminator.to_string(),
                            waited_ms: start.elapsed().as_millis() as u64,
                        });
                    }
                    return Err(ConnectError::NoAnswer {
                        peer: to.to_string(),
                        discriminator: remote.discriminator.to_string(),
                        waited_ms: start.elapsed().as_millis() as u64,
                    });
                }
            }
        }
    }
}

/// Whether any socket is bound at a peer's port: a datagram of one byte
/// from a socket connected there, which the host answers with ICMP "port
/// unreachable" when nothing is bound (the connected socket's next receive
/// fails with `ECONNREFUSED`). The request itself goes from a socket that
/// is not connected (the answer comes from another of the peer's ports),
/// which the kernel tells of no such error. A uvia Nic at the port drops
/// the byte as a frame that does not parse.
struct NobodyThere(std::net::UdpSocket);

impl NobodyThere {
    fn probe(to: SocketAddr) -> Option<NobodyThere> {
        let any: SocketAddr = match to {
            SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let s = std::net::UdpSocket::bind(any).ok()?;
        s.connect(to).ok()?;
        s.set_nonblocking(true).ok()?;
        s.send(&[0]).ok()?;
        Some(NobodyThere(s))
    }

    /// True once the peer's host has said that nothing is bound there.
    fn heard(&self) -> bool {
        matches!(
            self.0.recv(&mut [0u8; 1]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
        )
    }
}

/// What answering a request needs: the Nic it came to and the request.
pub(crate) struct Answer {
    nic: Nic,
    req: Incoming,
}

impl Answer {
    /// Connects `vi` (idle, same reliability level) to the client.
    pub fn accept(self, vi: &Vi, private: &[u8]) -> Result<(), ConnectError> {
        let Some(nic) = NetNic::of(&self.nic.s) else {
            return Err(ConnectError::Protocol("request from another provider"));
        };
        let req = &self.req;
        let mut g = vi.lock();
        let private =
            PrivateData::new(private).map_err(|e| ConnectError::PrivateDataTooLong(e.0))?;
        let st = vi.state();
        if st != ViState::Idle {
            nic.reject(req, RejectReason::Refused, &PrivateData::EMPTY);
            return Err(ConnectError::InvalidState(st));
        }
        let theirs = remote_attrs(&req.attrs);
        if let Err(e) = check_compatible(&g.q.attrs, &theirs) {
            nic.reject(req, RejectReason::Mismatch, &PrivateData::EMPTY);
            return Err(e);
        }
        // The connection lives on the VI's own Nic, which runs its
        // handshake and reads its frames. That may be another Nic of the
        // host than the listener's (libfabric's domain and passive
        // endpoint each open one): the listener then keeps the request
        // held, so its repetitions are taken for what they are until the
        // client hears the accept (and forgotten once stale), while the
        // accept and everything after go between the connections' own
        // addresses.
        let Some(home) = NetNic::of(&vi.s.nic) else {
            nic.reject(req, RejectReason::Mismatch, &PrivateData::EMPTY);
            return Err(ConnectError::Protocol("a VI of another provider"));
        };
        let id = home.register(&vi.s, req.from);
        let now = Instant::now();
        let cfg = home.config(&g.q.attrs);
        let conn = Conn::accept(now, cfg, id, initial_psn(id), req.peer_id, req.attrs)
            .with_private(private);
        let mut t = NetVi::new(conn, req.from, id, home.max_frame);
        // The accept goes from the connection's own medium, which tells the
        // client its address; the client's connection answers from its own.
        t.set_own(home.own_socket());
        crate::cq::socket_changed(&vi.s);
        t.adopt_recvs(&mut g.q);
        home.established(req.from, req.peer_id, id);
        vi.install(&mut g, Transport::Net(t), theirs);
        let ViInner { q, t } = &mut *g;
        if let Transport::Net(t) = t {
            t.output(vi, q, now);
        }
        Ok(())
    }

    /// Refuses the request, now and for its repetitions.
    pub fn reject(self, private: &[u8]) -> Result<(), ConnectError> {
        let private =
            PrivateData::new(private).map_err(|e| ConnectError::PrivateDataTooLong(e.0))?;
        if let Some(nic) = NetNic::of(&self.nic.s) {
            nic.reject(&self.req, RejectReason::Refused, &private);
        }
        Ok(())
    }
}

impl NetNic {
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
    let a = match host.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => host
            .to_socket_addrs()
            .ok()
            .and_then(|mut it| it.next())
            .ok_or_else(|| {
                ConnectError::BadAddress(format!(
                    "{host:?} (want ip:port, [ipv6]:port or name:port)"
                ))
            })?,
    };
    match unreachable_peer(&a) {
        Some(why) => Err(ConnectError::BadAddress(format!("{host:?}: {why}"))),
        None => Ok(Addr::Ip(a)),
    }
}

/// Why no peer can ever answer at `a`, if none can: a connection is one
/// peer's, and its answer must come from the address asked.
fn unreachable_peer(a: &SocketAddr) -> Option<&'static str> {
    let ip = a.ip();
    if a.port() == 0 {
        Some("port 0 is no peer's port")
    } else if ip.is_unspecified() {
        Some(
            "an unspecified address is no peer's (name the peer's address, 127.0.0.1 on this host)",
        )
    } else if ip.is_multicast() {
        Some("a multicast address is no single peer's")
    } else if matches!(ip, std::net::IpAddr::V4(v4) if v4.is_broadcast()) {
        Some("the broadcast address is no single peer's")
    } else {
        None
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

impl NicOps for NetNic {
    /// The client side of a connection (VipConnectRequest), or with
    /// `local` peer to peer.
    fn connect(
        &self,
        vi: &Vi,
        remote: &NetAddress,
        local: Option<&Discriminator>,
        wait: Patience,
        private: &[u8],
    ) -> Result<RemoteViAttributes, ConnectError> {
        let start = Instant::now();
        let nic = self;
        let to = nic.resolve(&remote.host)?;
        let private =
            PrivateData::new(private).map_err(|e| ConnectError::PrivateDataTooLong(e.0))?;
        let id = nic.register(&vi.s, to);
        if let Some(d) = local {
            if nic
                .endpoint
                .lock()
                .peer_connect(d.as_bytes(), to, id)
                .is_err()
            {
                nic.unregister(id);
                return Err(ConnectError::InUse(d.to_string()));
            }
            if let Some(s) = &nic.share {
                s.tell(uvia_net::share::Interest::Peer, d.as_bytes(), true);
            }
        }
        let r = self.connect_inner(vi, remote, local.is_some(), to, id, start, wait, &private);
        if let Some(d) = local {
            nic.endpoint.lock().peer_done(d.as_bytes());
            if let Some(s) = &nic.share {
                s.tell(uvia_net::share::Interest::Peer, d.as_bytes(), false);
            }
        }
        match &r {
            Err(_) => {
                nic.unregister(id);
                vi.lock().t = Transport::None;
            }
            Ok(_) => {
                // Repeated requests of the peer reach this connection.
                let pid = match &vi.lock().t {
                    Transport::Net(t) => Some(t.conn.peer_id()),
                    _ => None,
                };
                if let Some(pid) = pid {
                    // Peer to peer, the peer may have asked from another
                    // address of its host than the one named (a process
                    // sharing its host's device): the one it asked from.
                    let peer = nic.endpoint.lock().peer_of(id).unwrap_or(to);
                    nic.established(peer, pid, id);
                }
            }
        }
        r
    }

    /// Waits for a connection request on `discriminator`, serving the
    /// medium (frames of this Nic's connections too) meanwhile.
    fn connect_wait(
        &self,
        nic: &Nic,
        discriminator: &Discriminator,
        timeout: Option<Duration>,
    ) -> Result<ConnRequest, ConnectError> {
        let start = Instant::now();
        self.listen(discriminator.as_bytes());
        loop {
            self.serve_share();
            // Read the medium before looking for a request, so one that
            // came during the last wait is taken now, not after the next.
            // Past the deadline this is still one look without waiting: a
            // caller that polls never blocks, as with the shm listener.
            self.poll(None);
            // The connections accepted so far keep up their side (acks,
            // keep-alives) while a server accepts the next ones.
            self.sweep(Instant::now(), 0); // (0 is no connection's id)
            if let Some(req) = self.take_request(discriminator.as_bytes()) {
                return Ok(ConnRequest {
                    remote: remote_attrs(&req.attrs),
                    discriminator: discriminator.clone(),
                    private: req.private.as_slice().to_vec(),
                    peer_address: Some(req.from.to_string()),
                    peer_pid: 0,
                    answer: Some(AnyAnswer::Net(Answer {
                        nic: nic.clone(),
                        req,
                    })),
                });
            }
            let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(ConnectError::Timeout(start.elapsed().as_millis() as u64));
            }
            if let Some(e) = self.share_lost() {
                return Err(e);
            }
            let nap = left
                .unwrap_or(Duration::from_millis(20))
                .min(Duration::from_millis(20));
            self.wait_nic(nap);
        }
    }

    fn stop_listening(&self, discriminator: &Discriminator) {
        self.endpoint
            .lock()
            .stop_listening(discriminator.as_bytes());
        if let Some(s) = &self.share {
            s.tell(
                uvia_net::share::Interest::Listen,
                discriminator.as_bytes(),
                false,
            );
        }
    }

    fn opened(&self, nic: &Weak<crate::nic::NicShared>) {
        self.start_share(nic);
    }

    /// True if `host` is written as a literal address of this medium.
    fn is_address(&self, host: &str) -> bool {
        match self.medium.local_addr() {
            Addr::Mac(_) => host.parse::<uvia_net::MacAddr>().is_ok(),
            Addr::Ip(_) => host.parse::<SocketAddr>().is_ok(),
        }
    }
}
