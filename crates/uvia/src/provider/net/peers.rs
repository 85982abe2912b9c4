//! Keep-alives shared by the connections to one peer Nic.
//!
//! Every connection keeps its peer alive on its own: after a keep-alive
//! interval of silence it pings, and the peer answers. A server holding a
//! thousand idle VIs from one client Nic then sends and takes about two
//! thousand frames a second (a ping and its answer per VI per interval,
//! each side), which keeps its CPU busy while nothing happens.
//!
//! A connection's end lives as long as the peer's Nic: a closing VI says so
//! with its disconnect, and a process that dies takes its Nic with it. So
//! the connections to one Nic (known by the token each side announces in
//! its request or accept, [`uvia_proto::wire::ConnAttrs::nic`]) share what
//! they know of it here: when one last heard a frame from it, and when one
//! last pinged it. A connection whose timers come due counts those as its
//! own ([`Conn::heard_elsewhere`]); only one whose keep-alive is still due
//! after that pings, and the others' keep-alives then wait for the answer.
//! A Nic that falls silent fails all of its connections together, one idle
//! timeout after the last frame any of them heard.
//!
//! Left alone: a peer VI destroyed with every try of its disconnect lost
//! leaves an idle connection here that nothing tests any more until it
//! sends (its frames then draw a reset from the peer's endpoint).

use crate::lock::SpinLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use uvia_proto::Conn;

/// A connection tells its peer's record that it heard from the peer at most
/// this often: each frame costs a comparison, not a store to a line every
/// connection to the peer reads. Small against the keep-alive interval
/// (a quarter of the idle timeout, seconds).
pub(super) const TELL_EVERY: Duration = Duration::from_millis(100);

/// What the connections to one peer Nic know of it together. Times are
/// nanoseconds after `epoch`, plus one (zero: never).
pub(super) struct PeerLive {
    epoch: Instant,
    heard: AtomicU64,
    pinged: AtomicU64,
}

impl PeerLive {
    fn new() -> PeerLive {
        PeerLive {
            epoch: Instant::now(),
            heard: AtomicU64::new(0),
            pinged: AtomicU64::new(0),
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

    /// Gives `conn` what the others know; if its keep-alive is still due
    /// at `now`, it pings for all of them, and says so.
    pub(super) fn share(&self, conn: &mut Conn, now: Instant) {
        let heard = self.time(self.heard.load(Ordering::Relaxed));
        let pinged = self.time(self.pinged.load(Ordering::Relaxed));
        if let Some(heard) = heard {
            conn.heard_elsewhere(heard, pinged);
        }
        if conn.keepalive_due(now) {
            self.pinged.fetch_max(self.stamp(now), Ordering::Relaxed);
        }
    }
}

/// The Nic's records of its peers' Nics, by token.
#[derive(Default)]
pub(super) struct Peers {
    map: SpinLock<HashMap<u64, Weak<PeerLive>>>,
}

impl Peers {
    /// The record of the peer Nic `token`, which a connection to it holds
    /// while it lives. A record no connection holds is dropped when a new
    /// peer's is made.
    pub(super) fn join(&self, token: u64) -> Arc<PeerLive> {
        let mut map = self.map.lock();
        if let Some(p) = map.get(&token).and_then(Weak::upgrade) {
            return p;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let p = Arc::new(PeerLive::new());
        map.insert(token, Arc::downgrade(&p));
        p
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
    use super::super::acks_sent;
    use crate::*;
    use std::time::{Duration, Instant};

    /// Idle connections between two Nics, both sides driven as programs
    /// drive them (a server's CQ wait, a client polling one of its VIs):
    /// all stay connected through four idle timeouts on far fewer
    /// keep-alives than one per connection, and each still carries a
    /// message after.
    #[test]
    fn idle_connections_to_one_nic_share_one_keep_alive() {
        const PAIRS: usize = 8;
        let idle = Duration::from_millis(400);
        let opts = NicOptions {
            idle_timeout: Some(idle),
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
        let servers: Vec<_> = (0..PAIRS).map(|_| end(&sn, Some(&cq))).collect();
        let clients: Vec<_> = (0..PAIRS).map(|_| end(&cn, None)).collect();
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
        // acknowledgements each here. Shared, the pair of Nics needs that
        // many in all.
        let keepalive = idle / 4;
        let unshared = PAIRS as u64 * 2 * (span.as_millis() / keepalive.as_millis()) as u64;
        let sent = acks(&servers) + acks(&clients) - before;
        assert!(
            sent <= unshared / 3,
            "{sent} keep-alives and answers over {PAIRS} idle connections in {span:?} \
             (one each would be about {unshared})"
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
}
