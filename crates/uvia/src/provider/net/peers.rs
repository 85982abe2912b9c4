//! Keep-alives shared by the connections to one peer Nic.
//!
//! Every connection could keep its peer alive on its own: after a
//! keep-alive interval of silence it pings, and the peer answers. A server
//! holding a thousand idle VIs from one client Nic then sends and takes
//! about two thousand frames a second (a ping and its answer per VI per
//! interval, each side), and looks at every VI as often, which keeps its
//! CPU busy while nothing happens.
//!
//! A connection's end lives as long as the peer's Nic: a closing VI says so
//! with its disconnect, and a process that dies takes its Nic with it. So
//! the connections to one Nic (known by the token each side announces in
//! its request or accept, [`uvia_proto::wire::ConnAttrs::nic`]) share the
//! watch over it here. One of them, the keeper, keeps the engine's
//! keep-alive and idle timeout, counting every frame any of them heard
//! ([`Conn::heard_elsewhere`]); the others arm neither ([`Conn::set_kept`])
//! and have no timer at all while idle, so an idle second costs the Nic a
//! look at one VI per peer, not at every VI. The keeper's pings go to
//! whichever of the peer's connections it is paired with; the peer's Nic
//! reads that one's socket at its next sweep, timers or not (the sockets
//! of connections without timers are in its [`watch`](super::watch),
//! [`NetNic::sweep`](super::NetNic::sweep)). If the keeper finds the Nic
//! silent for the idle timeout it fails, and the others fail with it at
//! their next look.
//!
//! The keeper is the first connection to look once there is none: a
//! keeper that closes or fails lets go, and one that has not looked for
//! half an idle timeout (gone without a word, or so busy with traffic that
//! its keep-alive never came due; an idle keeper looks every keep-alive
//! interval, a quarter of it) is replaced by the next that looks. Every VI
//! is looked at in the Nic's walk, at least once a second. A kept
//! connection that carries traffic ([`BUSY_FRAMES`] frames within a tell)
//! takes the watch over from a keeper that carried none for
//! [`TAKE_OVER_AFTER`]: its socket then leaves the watch, whose epoll set
//! every datagram to a socket in it wakes; the old keeper stands aside at
//! its next look. (A keeper's hearing from the peer is a look.)
//!
//! Left alone: a peer VI destroyed with every try of its disconnect lost
//! leaves an idle connection here that nothing tests any more until it
//! sends (its frames then draw a reset from the peer's endpoint).

use crate::lock::SpinLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use uvia_net::Addr;
use uvia_proto::Conn;

/// A connection tells its peer's record that it heard from the peer at most
/// this often: each frame costs a comparison, not a store to a line every
/// connection to the peer reads. Small against the keep-alive interval
/// (a quarter of the idle timeout, seconds).
pub(super) const TELL_EVERY: Duration = Duration::from_millis(100);

/// Frames a kept connection takes in between two tells that make it busy:
/// it takes the watch over from a keeper that has not looked for
/// [`TAKE_OVER_AFTER`]. A busy connection kept without timers has its
/// socket in the Nic's watch, and each of its datagrams wakes that epoll
/// set in the sender's system call (0.17 us a one-way message of a pair
/// among 1,000, `uvia scale -p udp`); a keeper's socket is not in it.
/// (Keep-alives and their answers are one or two frames.)
pub(super) const BUSY_FRAMES: u32 = 16;

/// How long a keeper must have carried no traffic of its own before a
/// busy connection takes the watch over from it: two busy connections to
/// one peer do not take it from each other (a busy keeper says so every
/// [`BUSY_FRAMES`] frames).
pub(super) const TAKE_OVER_AFTER: Duration = Duration::from_millis(200);

/// What the connections to one peer Nic know of it together. Times are
/// nanoseconds after `epoch`, plus one (zero: never).
pub(super) struct PeerLive {
    epoch: Instant,
    heard: AtomicU64,
    pinged: AtomicU64,
    /// The connection (its id on this Nic) that keeps the peer's Nic; 0:
    /// none.
    keeper: AtomicU32,
    /// When the keeper last looked.
    kept_at: AtomicU64,
    /// When the keeper last carried traffic of its own (see
    /// [`take_over`](Self::take_over)).
    busy_at: AtomicU64,
    /// The keeper found the Nic silent for the idle timeout: every
    /// connection to it fails.
    silent: AtomicBool,
    /// A keeper that has not looked for this long is taken for gone
    /// (nanoseconds): half the Nic's idle timeout.
    lease: u64,
}

impl PeerLive {
    fn new(idle_timeout: Duration) -> PeerLive {
        PeerLive {
            lease: (idle_timeout / 2).as_nanos() as u64,
            epoch: Instant::now(),
            heard: AtomicU64::new(0),
            pinged: AtomicU64::new(0),
            keeper: AtomicU32::new(0),
            kept_at: AtomicU64::new(0),
            busy_at: AtomicU64::new(0),
            silent: AtomicBool::new(false),
        }
    }

    fn stamp(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64 + 1
    }

    fn time(&self, stamp: u64) -> Option<Instant> {
        (stamp != 0).then(|| self.epoch + Duration::from_nanos(stamp - 1))
    }

    /// A connection heard from the peer at `at`.
    pub(super) fn heard(&self, at: Instant) {
        self.heard.fetch_max(self.stamp(at), Ordering::Relaxed);
    }

    /// Connection `id` heard from the peer at `at`: if it is the keeper,
    /// that is a look.
    pub(super) fn heard_by(&self, id: u32, at: Instant) {
        self.heard(at);
        if self.keeper.load(Ordering::Relaxed) == id {
            self.kept_at.store(self.stamp(at), Ordering::Relaxed);
        }
    }

    /// Connection `id` carried [`BUSY_FRAMES`] frames at `now`. If it is
    /// kept, it takes the watch over from a keeper that carried none for
    /// [`TAKE_OVER_AFTER`] (or from none), and true says it did: it then
    /// shares as the keeper, and the old keeper stands aside at its next
    /// look ([`must_share`](Self::must_share)). A busy keeper says so.
    pub(super) fn busy(&self, id: u32, kept: bool, now: Instant) -> bool {
        let k = self.keeper.load(Ordering::Acquire);
        if k == id {
            self.busy_at.store(self.stamp(now), Ordering::Relaxed);
            return false;
        }
        if !kept || self.silent.load(Ordering::Relaxed) {
            return false;
        }
        let since = self
            .stamp(now)
            .saturating_sub(self.busy_at.load(Ordering::Relaxed));
        if k != 0 && since < TAKE_OVER_AFTER.as_nanos() as u64 {
            return false;
        }
        let won = self
            .keeper
            .compare_exchange(k, id, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if won {
            self.kept_at.store(self.stamp(now), Ordering::Relaxed);
            self.busy_at.store(self.stamp(now), Ordering::Relaxed);
        }
        won
    }

    /// The keeper, after taking over from one whose lease ran out by `now`.
    fn keeper_at(&self, id: u32, now: Instant) -> u32 {
        let k = self.keeper.load(Ordering::Acquire);
        let lapsed = k != 0
            && k != id
            && self
                .stamp(now)
                .saturating_sub(self.kept_at.load(Ordering::Relaxed))
                > self.lease;
        if k != 0 && !lapsed {
            return k;
        }
        match self
            .keeper
            .compare_exchange(k, id, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                self.kept_at.store(self.stamp(now), Ordering::Relaxed);
                id
            }
            Err(other) => other,
        }
    }

    /// True if connection `id`, whose engine keeps its own watch or not
    /// (`kept`), must share at `now`: the Nic fell silent, or its part
    /// changed. A few loads.
    pub(super) fn must_share(&self, id: u32, kept: bool, now: Instant) -> bool {
        if self.silent.load(Ordering::Relaxed) {
            return true;
        }
        let k = self.keeper.load(Ordering::Relaxed);
        if k == id {
            return kept;
        }
        // Not the keeper: it must stand aside, or take over from none or
        // from one gone quiet.
        !kept
            || k == 0
            || self
                .stamp(now)
                .saturating_sub(self.kept_at.load(Ordering::Relaxed))
                > self.lease
    }

    /// Gives connection `id`'s engine its part at `now`: keeper or kept,
    /// failed if the Nic fell silent. The keeper counts what the others
    /// heard and, if its keep-alive is still due after that, pings for all.
    /// `id` is `None` for a connection that cannot go without timers (its
    /// frames come through the Nic's medium, which the watch does not
    /// read): it keeps its own watch, counting the others' frames and
    /// pings as its own, as a keeper does.
    pub(super) fn share(&self, conn: &mut Conn, id: Option<u32>, now: Instant) {
        if self.silent.load(Ordering::Relaxed) {
            conn.peer_silent();
            return;
        }
        let mut floor = None;
        if let Some(id) = id {
            if self.keeper_at(id, now) != id {
                conn.set_kept(true);
                return;
            }
            self.kept_at.store(self.stamp(now), Ordering::Relaxed);
            if conn.is_kept() {
                // Taking over a watch nobody kept for a while: the peer has
                // half an idle timeout to answer the first ping before it
                // counts as silent.
                floor = now.checked_sub(Duration::from_nanos(self.lease));
            }
        }
        let heard = self.time(self.heard.load(Ordering::Relaxed)).max(floor);
        let pinged = self.time(self.pinged.load(Ordering::Relaxed));
        if let Some(heard) = heard {
            conn.heard_elsewhere(heard, pinged);
        }
        conn.set_kept(false);
        if conn.keepalive_due(now) {
            self.pinged.fetch_max(self.stamp(now), Ordering::Relaxed);
        }
    }

    /// Connection `id` no longer watches the peer (it closed or failed;
    /// `silent`: it failed because the Nic fell silent). A keeper lets go,
    /// and one that found the Nic silent says so to the others (each
    /// fails at its next look).
    /// True if it was the keeper: another is to take over soon.
    pub(super) fn leave(&self, id: u32, silent: bool) -> bool {
        let was = self
            .keeper
            .compare_exchange(id, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if was && silent {
            self.silent.store(true, Ordering::Release);
        }
        was
    }
}

/// The Nic's records of its peers' Nics, by token and host.
#[derive(Default)]
pub(super) struct Peers {
    map: SpinLock<HashMap<(u64, Addr), Weak<PeerLive>>>,
}

impl Peers {
    /// The record of the peer Nic `token` on the host a connection hears
    /// from at `from`, which a connection to it holds while it lives. A
    /// record no connection holds is dropped when a new peer's is made.
    /// Keyed by the host as well: the token travels in clear, and a peer
    /// elsewhere that named another Nic's would otherwise join its record
    /// (and, as its keeper, fall silent for it or keep it alive).
    pub(super) fn join(&self, token: u64, from: Addr, idle_timeout: Duration) -> Arc<PeerLive> {
        let key = (token, host_of(from));
        let mut map = self.map.lock();
        // A Nic found silent is a new peer if it is heard again.
        if let Some(p) = map
            .get(&key)
            .and_then(Weak::upgrade)
            .filter(|p| !p.silent.load(Ordering::Relaxed))
        {
            return p;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let p = Arc::new(PeerLive::new(idle_timeout));
        map.insert(key, Arc::downgrade(&p));
        p
    }
}

/// The host part of a peer's address: its IP address (a Nic's connections
/// answer from ports of their own), or its MAC address.
fn host_of(a: Addr) -> Addr {
    match a {
        Addr::Ip(s) => Addr::Ip(std::net::SocketAddr::new(s.ip(), 0)),
        mac => mac,
    }
}

/// A token for a newly opened Nic: different for every Nic a peer may see
/// at once (its process, the clock, a count of the process's Nics, mixed).
pub(super) fn new_token() -> u64 {
    static OPENED: AtomicU64 = AtomicU64::new(0);
    let salt = OPENED.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    // SplitMix64's finaliser: every input bit reaches every output bit.
    let mut z = t ^ (u64::from(std::process::id()) << 40) ^ salt.rotate_left(17);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

#[cfg(test)]
mod tests {
    use super::super::{acks_sent, keeps_watch};
    use crate::*;
    use std::time::{Duration, Instant};

    /// One record for a peer Nic's connections from any of its host's
    /// ports; a record of its own for the same token heard from another
    /// host (a token travels in clear: another host may name it).
    #[test]
    fn a_token_from_another_host_is_another_peer() {
        let peers = super::Peers::default();
        let at =
            |ip: [u8; 4], port: u16| uvia_net::Addr::Ip(std::net::SocketAddr::from((ip, port)));
        let idle = Duration::from_secs(5);
        let first = peers.join(7, at([10, 0, 0, 1], 5000), idle);
        let same_host = peers.join(7, at([10, 0, 0, 1], 6000), idle);
        let elsewhere = peers.join(7, at([10, 0, 0, 2], 5000), idle);
        assert!(std::sync::Arc::ptr_eq(&first, &same_host));
        assert!(!std::sync::Arc::ptr_eq(&first, &elsewhere));
    }

    type End = (Vi, MemoryRegion);

    /// `pairs` connected VIs between two udp Nics whose idle timeout is
    /// `idle`; the server's VIs report to `cq` unless `no_cq`, and each VI
    /// has a 64-byte receive posted.
    fn connect_pairs(
        pairs: usize,
        idle: Duration,
        no_cq: bool,
    ) -> (Nic, Nic, Cq, Vec<End>, Vec<End>) {
        // Driven by the tests' own calls alone, as each test says: the
        // library's progress thread would keep a Nic they leave alone.
        let opts = NicOptions {
            idle_timeout: Some(idle),
            manual_progress: true,
            ..NicOptions::default()
        };
        let sn = Nic::open_with("udp:127.0.0.1", &opts).unwrap();
        let cn = Nic::open_with("udp:127.0.0.1", &opts).unwrap();
        let cq = sn.create_cq(64).unwrap();
        let end = |nic: &Nic, cq: Option<&Cq>| {
            let ptag = nic.create_ptag().unwrap();
            let vi = nic.create_vi(ViAttributes::new(ptag), None, cq).unwrap();
            let buf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
            vi.post_recv(Box::new(Descriptor::recv(&[buf.segment(0, 64)])))
                .unwrap();
            (vi, buf)
        };
        let servers: Vec<_> = (0..pairs)
            .map(|_| end(&sn, (!no_cq).then_some(&cq)))
            .collect();
        let clients: Vec<_> = (0..pairs).map(|_| end(&cn, None)).collect();
        let disc = Discriminator::from_u64((std::process::id() as u64) << 32 | 0x9ee5_0001);
        let (n2, d2) = (sn.clone(), disc.clone());
        let vis: Vec<Vi> = servers.iter().map(|(vi, _)| vi.clone()).collect();
        let t = std::thread::spawn(move || {
            for vi in &vis {
                let mut req = n2.connect_wait(&d2, Some(Duration::from_secs(5))).unwrap();
                req.accept(vi).unwrap();
            }
        });
        for (vi, _) in &clients {
            let to = NetAddress::new(&sn.attributes().address, disc.clone());
            vi.connect_request(&to, Duration::from_secs(5)).unwrap();
        }
        t.join().unwrap();
        (sn, cn, cq, servers, clients)
    }

    /// Idle connections between two Nics, both sides driven as programs
    /// drive them (a server's CQ wait, a client polling one of its VIs):
    /// all stay connected through four idle timeouts on the keep-alives of
    /// one connection, and each still carries a message after.
    #[test]
    fn idle_connections_to_one_nic_share_one_keep_alive() {
        const PAIRS: usize = 8;
        let idle = Duration::from_millis(400);
        let (_sn, _cn, cq, servers, clients) = connect_pairs(PAIRS, idle, false);
        let acks =
            |ends: &[(Vi, MemoryRegion)]| -> u64 { ends.iter().map(|(vi, _)| acks_sent(vi)).sum() };
        let before = acks(&servers) + acks(&clients);
        let span = idle * 4;
        let start = Instant::now();
        while start.elapsed() < span {
            assert!(
                cq.wait(Some(Duration::from_millis(5))).is_err(),
                "nothing was sent"
            );
            assert!(clients[0].0.recv_done().is_none());
        }
        for (k, (vi, _)) in servers.iter().chain(&clients).enumerate() {
            assert_eq!(vi.state(), ViState::Connected, "VI {k} after {span:?} idle");
        }
        // Unshared, each connection pings or answers about twice a
        // keep-alive interval (a quarter of the idle timeout): some 32
        // acknowledgements each here. Shared, one keeper on each side
        // pings and the other answers: about as many for the pair of Nics.
        let keepalive = idle / 4;
        let one = 2 * 2 * (span.as_millis() / keepalive.as_millis()) as u64;
        let sent = acks(&servers) + acks(&clients) - before;
        assert!(
            sent <= one + one / 2,
            "{sent} keep-alives and answers over {PAIRS} idle connections in {span:?} \
             (one connection's would be about {one})"
        );
        // Every connection still carries a message (the server's CQ wait
        // reads them, the client's polls take the acknowledgements).
        for (vi, buf) in &clients {
            vi.post_send(Box::new(Descriptor::send(&[buf.segment(0, 8)])))
                .unwrap();
        }
        let (mut got, mut sent) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(5);
        while got < PAIRS || sent < PAIRS {
            assert!(Instant::now() < deadline, "{got} arrived, {sent} sent");
            if let Ok(n) = cq.wait(Some(Duration::from_millis(1))) {
                assert_eq!(n.vi.recv_done().unwrap().result(), Ok(8));
                got += 1;
            }
            for (i, (vi, _)) in clients.iter().enumerate() {
                if let Some(d) = vi.send_done() {
                    assert_eq!(d.result(), Ok(8), "client {i}");
                    sent += 1;
                }
            }
        }
    }

    /// A connection that carries traffic while another keeps the watch
    /// takes the watch over once the keeper has not looked for a while
    /// (its datagrams then wake no epoll set); the old keeper stands aside,
    /// and every connection stays up and carries messages after.
    #[test]
    fn a_busy_connection_takes_the_watch_over() {
        const PAIRS: usize = 4;
        // Keep-alives a second apart: the keeper looks that seldom.
        let idle = Duration::from_secs(4);
        let (_sn, _cn, cq, servers, clients) = connect_pairs(PAIRS, idle, false);
        // The first connection made keeps the watch on each side.
        let keepers = |ends: &[End]| -> Vec<usize> {
            (0..ends.len())
                .filter(|&i| keeps_watch(&ends[i].0))
                .collect()
        };
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(300) {
            let _ = cq.wait(Some(Duration::from_millis(5)));
        }
        assert_eq!(keepers(&servers), vec![0], "before the traffic");
        // A ping-pong on the third pair.
        let (cv, cbuf) = &clients[2];
        let (sv, sbuf) = &servers[2];
        let deadline = Instant::now() + Duration::from_secs(5);
        for i in 0..100 {
            cv.post_send(Box::new(Descriptor::send(&[cbuf.segment(0, 8)])))
                .unwrap();
            let n = loop {
                assert!(Instant::now() < deadline, "round trip {i}");
                if let Ok(n) = cq.wait(Some(Duration::from_millis(5))) {
                    break n;
                }
                let _ = cv.send_done();
            };
            assert_eq!(n.vi.id(), sv.id());
            assert_eq!(sv.recv_done().unwrap().result(), Ok(8));
            sv.post_recv(Box::new(Descriptor::recv(&[sbuf.segment(0, 64)])))
                .unwrap();
            sv.post_send(Box::new(Descriptor::send(&[sbuf.segment(0, 8)])))
                .unwrap();
            let d = loop {
                assert!(Instant::now() < deadline, "answer {i}");
                if let Some(d) = cv.recv_done() {
                    break d;
                }
                let _ = sv.send_done();
            };
            assert_eq!(d.result(), Ok(8));
            cv.post_recv(Box::new(Descriptor::recv(&[cbuf.segment(0, 64)])))
                .unwrap();
            while sv.send_done().is_some() {}
            while cv.send_done().is_some() {}
        }
        // The busy connections keep the watch at once; an old keeper
        // stands aside at its next look (the Nic's walk of every VI, at
        // least once a second, or its keep-alive).
        assert!(keepers(&servers).contains(&2) && keepers(&clients).contains(&2));
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(2500)
            && (keepers(&servers) != vec![2] || keepers(&clients) != vec![2])
        {
            let _ = cq.wait(Some(Duration::from_millis(5)));
            let _ = clients[0].0.recv_done();
        }
        assert_eq!(keepers(&servers), vec![2], "the busy server connection");
        assert_eq!(keepers(&clients), vec![2], "the busy client connection");
        for (k, (vi, _)) in servers.iter().chain(&clients).enumerate() {
            assert_eq!(vi.state(), ViState::Connected, "VI {k}");
        }
        // Every other connection still carries a message.
        for i in [0, 1, 3] {
            let (vi, buf) = &clients[i];
            vi.post_send(Box::new(Descriptor::send(&[buf.segment(0, 8)])))
                .unwrap();
            let n = loop {
                assert!(
                    Instant::now() < deadline + Duration::from_secs(5),
                    "client {i}"
                );
                if let Ok(n) = cq.wait(Some(Duration::from_millis(5))) {
                    break n;
                }
                let _ = vi.send_done();
            };
            assert_eq!(n.vi.id(), servers[i].0.id());
            assert_eq!(n.vi.recv_done().unwrap().result(), Ok(8));
        }
    }

    /// The VIs that kept the peer's Nic go one by one; each time another
    /// takes the watch over, and the rest stay connected and carry
    /// messages.
    #[test]
    fn the_watch_passes_on_when_its_keeper_goes() {
        const PAIRS: usize = 4;
        let idle = Duration::from_millis(400);
        let (_sn, _cn, cq, mut servers, mut clients) = connect_pairs(PAIRS, idle, false);
        let drive = |span: Duration, cq: &Cq, clients: &[End]| {
            let start = Instant::now();
            while start.elapsed() < span {
                let _ = cq.wait(Some(Duration::from_millis(5)));
                for (k, (vi, _)) in clients.iter().enumerate() {
                    if let Some(d) = vi.recv_done() {
                        panic!(
                            "client {k} of {}: {:?} ({:?})",
                            clients.len(),
                            d.result(),
                            vi.state()
                        );
                    }
                }
            }
        };
        drive(idle, &cq, &clients);
        for _ in 0..PAIRS - 1 {
            // Gone from both sides at once: the first made is the keeper
            // on each (it joined first).
            let (s, _) = servers.remove(0);
            let (c, _) = clients.remove(0);
            s.disconnect();
            c.disconnect();
            drive(idle * 3, &cq, &clients);
            for (k, (vi, _)) in servers.iter().chain(&clients).enumerate() {
                assert_eq!(
                    vi.state(),
                    ViState::Connected,
                    "VI {k} after {:?} idle",
                    idle * 3
                );
            }
        }
        let (vi, buf) = &clients[0];
        vi.post_send(Box::new(Descriptor::send(&[buf.segment(0, 8)])))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let n = loop {
            assert!(Instant::now() < deadline, "the message did not arrive");
            if let Ok(n) = cq.wait(Some(Duration::from_millis(5))) {
                break n;
            }
            let _ = vi.send_done();
        };
        assert_eq!(n.vi.recv_done().unwrap().result(), Ok(8));
    }

    /// A peer Nic that nobody drives any more (its program stopped, as a
    /// killed one does) falls silent: every connection to it fails, kept
    /// or keeper, about an idle timeout after it was last heard.
    #[test]
    fn every_connection_to_a_silent_nic_fails() {
        const PAIRS: usize = 6;
        let idle = Duration::from_millis(400);
        let (_sn, _cn, cq, servers, _clients) = connect_pairs(PAIRS, idle, false);
        let start = Instant::now();
        let mut failed = None;
        while start.elapsed() < idle * 8 {
            let _ = cq.wait(Some(Duration::from_millis(5)));
            if servers.iter().all(|(vi, _)| vi.state() == ViState::Error) {
                failed = Some(start.elapsed());
                break;
            }
        }
        let states: Vec<_> = servers.iter().map(|(vi, _)| vi.state()).collect();
        let failed = failed.unwrap_or_else(|| panic!("after {:?}: {states:?}", idle * 8));
        // The keeper at the idle timeout; the others at the walk after it
        // (at least once a second).
        assert!(
            failed <= idle + Duration::from_millis(1_500),
            "all failed only after {failed:?}"
        );
        assert!(
            failed >= idle / 2,
            "failed after {failed:?}, before any timeout"
        );
    }

    /// A message to a VI its program does not poll (no CQ, and the program
    /// polls only another VI) is taken in by the Nic's walk and
    /// acknowledged: the sender completes it, and it is there when the VI
    /// is looked at.
    #[test]
    fn a_message_to_a_vi_nobody_polls_is_taken_in() {
        let idle = Duration::from_millis(400);
        let (_sn, _cn, _cq, servers, clients) = connect_pairs(3, idle, true);
        // Idle first: the connections settle into keeper and kept.
        let settle = Instant::now();
        while settle.elapsed() < idle * 2 {
            let _ = servers[0].0.recv_wait(Some(Duration::from_millis(5)));
            let _ = clients[0].0.recv_done();
        }
        let (vi, buf) = &clients[2];
        vi.post_send(Box::new(Descriptor::send(&[buf.segment(0, 8)])))
            .unwrap();
        let start = Instant::now();
        let done = loop {
            assert!(
                start.elapsed() < idle * 4,
                "the send did not complete in {:?}",
                idle * 4
            );
            // The server's program waits on its first VI only.
            let _ = servers[0].0.recv_wait(Some(Duration::from_millis(5)));
            if let Some(d) = vi.send_done() {
                break d;
            }
        };
        assert_eq!(done.result(), Ok(8));
        assert!(
            start.elapsed() <= Duration::from_millis(1_500),
            "taken in within a walk"
        );
        assert_eq!(servers[2].0.recv_done().unwrap().result(), Ok(8));
        for (k, (vi, _)) in servers.iter().chain(&clients).enumerate() {
            assert_eq!(vi.state(), ViState::Connected, "VI {k}");
        }
    }
}
