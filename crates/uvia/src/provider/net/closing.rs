//! Connections that outlive their VI while they close.
//!
//! A VI destroyed or disconnected right after its last message leaves its
//! peer waiting for the acknowledgement of what it sent last. The closing
//! side's acknowledgement and disconnect went once, and with that frame
//! lost the peer sent its message again into a closed port until its idle
//! timeout, then failed a send that had arrived (one run in some thirty of
//! `uvia bw` at 1% injected loss).
//!
//! As a kernel keeps a closed TCP socket's last acknowledgement going, the
//! Nic keeps a closing connection's engine here until the peer answers the
//! disconnect or its tries are spent ([`uvia_proto::Conn::close`]: three,
//! [`Config::handshake_retry`] apart, each carrying the acknowledgement),
//! and while the peer still sends after that. A thread of the Nic's, alive
//! only while connections close, takes in what the peer sends, answers
//! each of its data frames with the disconnect and sends the disconnect
//! again when due.
//!
//! A connection with a medium of its own (udp) keeps that medium: it needs
//! nothing of the Nic, which the program may close at once. One whose
//! frames come to the Nic's medium (xdp) stays in the Nic's endpoint while
//! it closes: the thread polls the Nic, whose dispatch hands it its
//! frames, and it sends through the Nic's medium. It is kept while the Nic
//! is open; a Nic closed at once lets it go, and the peer's idle timeout
//! covers a lost disconnect.
//!
//! [`Config::handshake_retry`]: uvia_proto::Config::handshake_retry

use super::vi::NoMemory;
use super::NetNic;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use uvia_net::{Addr, Medium, OutFrame, RecvBatch};
use uvia_proto::wire::Repr;
use uvia_proto::Conn;

/// How long a closing connection is kept at most, whatever its engine
/// says: its tries take a few hundred milliseconds.
const KEEP_AT_MOST: Duration = Duration::from_secs(2);

/// How often the thread looks at the closing connections: far below the
/// engine's retry interval, far above a busy loop.
const LOOK_EVERY: Duration = Duration::from_millis(1);

/// A connection done closing is still kept while its peer sends: each of
/// its frames is answered with the disconnect, until it has been quiet
/// this long.
const QUIET: Duration = Duration::from_millis(200);

/// One closing connection: its engine (closing, then closed) and where
/// its peer's frames come.
pub(super) struct Closing {
    conn: Conn,
    /// The connection's own medium, connected to `peer`, and the batch it
    /// is read into; `None`: its frames come to the Nic's medium.
    own: Option<(Arc<dyn Medium>, RecvBatch)>,
    peer: Addr,
    id: u32,
    intact: bool,
    until: Instant,
    /// When the peer last sent.
    heard: Instant,
}

impl Closing {
    /// `conn` has just been closed ([`Conn::close`]) and its first frames
    /// sent; `medium` is the connection's own, connected to `peer`.
    pub(super) fn new(
        conn: Conn,
        medium: Arc<dyn Medium>,
        peer: Addr,
        id: u32,
        intact: bool,
    ) -> Closing {
        let slots = medium.caps().max_batch.clamp(1, 16);
        let mut c = Closing::on_nic(conn, peer, id, intact);
        c.own = Some((medium, RecvBatch::new(slots, 65_536)));
        c
    }

    /// As [`new`](Self::new) for a connection whose frames come to the
    /// Nic's medium, through which it also sends; it stays registered in
    /// the Nic's endpoint until it is let go.
    pub(super) fn on_nic(conn: Conn, peer: Addr, id: u32, intact: bool) -> Closing {
        let now = Instant::now();
        Closing {
            conn,
            own: None,
            peer,
            id,
            intact,
            until: now + KEEP_AT_MOST,
            heard: now,
        }
    }

    /// A frame from the peer.
    fn take(&mut self, now: Instant, src: u32, repr: &Repr<'_>) {
        self.heard = now;
        self.conn.handle_frame(now, src, repr, &mut NoMemory);
    }

    /// Takes in what the peer sent to its own medium, runs the engine's
    /// timers and sends what it has to (a closed engine answers the peer's
    /// data with the disconnect) through its own medium or else `nic`'s.
    /// False once it is closed and the peer quiet, or kept
    /// [`KEEP_AT_MOST`], or when its frames come to a Nic that is gone.
    fn drive(&mut self, now: Instant, buf: &mut [u8], nic: Option<&NetNic>) -> bool {
        if let Some((medium, batch)) = &mut self.own {
            let n = medium.recv(batch).unwrap_or(0);
            for i in 0..n {
                let (_, bytes) = batch.frame(i);
                if let Ok((dst, src, repr)) = super::parse(self.intact, bytes) {
                    if dst == self.id {
                        self.heard = now;
                        self.conn.handle_frame(now, src, &repr, &mut NoMemory);
                    }
                }
            }
        }
        let medium: &dyn Medium = match (&self.own, nic) {
            (Some((m, _)), _) => &**m,
            (None, Some(nic)) => &*nic.medium,
            (None, None) => return false,
        };
        if self.conn.poll_timeout().is_some_and(|t| t <= now) {
            self.conn.handle_timeout(now);
        }
        while let Some(n) = self.conn.poll_transmit(now, buf, &mut NoMemory) {
            let f = [OutFrame {
                to: self.peer,
                bytes: &buf[..n],
            }];
            let _ = medium.send(&f);
        }
        self.conn.settle(now);
        let done = self.conn.is_closed() && now >= self.heard + QUIET;
        !done && now < self.until
    }
}

/// The Nic a closer serves, while it is open.
struct NicRef(*const NetNic);

// SAFETY: a NetNic is Sync (its state is behind locks and atomics); the
// pointer is read only under the closer's lock, which the Nic takes to
// clear it before it goes ([`Closer::nic_gone`]).
unsafe impl Send for NicRef {}
// SAFETY: as above.
unsafe impl Sync for NicRef {}

/// A Nic's closing connections, and whether its thread runs.
#[derive(Default)]
pub(super) struct Closer {
    list: Mutex<Vec<Closing>>,
    running: AtomicBool,
    /// The Nic, for the connections whose frames come to its medium; held
    /// (read) through each look of the thread, so that the Nic goes in its
    /// program's thread, when the program closes it, never in this one.
    nic: RwLock<Option<NicRef>>,
}

impl Closer {
    /// Keeps `c` until it is done closing, starting the thread if it is not
    /// running. `nic` is the Nic whose closer this is. If no thread can be
    /// started, the connection is let go as before: its peer's idle
    /// timeout covers a lost disconnect.
    pub(super) fn keep(self: &Arc<Closer>, c: Closing, nic: &NetNic) {
        // Set once, by the first connection kept (before any thread looks):
        // later ones only read it.
        let known = self.nic.read().unwrap_or_else(|e| e.into_inner()).is_some();
        if !known {
            let mut at = self.nic.write().unwrap_or_else(|e| e.into_inner());
            at.get_or_insert(NicRef(nic));
        }
        self.lock().push(c);
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        let started = std::thread::Builder::new()
            .name("uvia-closing".into())
            .spawn(move || me.run());
        if started.is_err() {
            self.running.store(false, Ordering::Release);
            let gone = std::mem::take(&mut *self.lock());
            for c in gone.iter().filter(|c| c.own.is_none()) {
                nic.unregister(c.id);
            }
        }
    }

    /// The Nic is going: the connections whose frames come to its medium
    /// are let go at the thread's next look. Waits for a look under way.
    pub(super) fn nic_gone(&self) {
        *self.nic.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// A frame the Nic's endpoint found for connection `id`, whose VI is
    /// gone: taken by `id` if it is closing here. Never waits for the
    /// thread (which may be sending through the medium the caller is
    /// reading): a frame that finds the list busy is dropped, and the peer
    /// sends it again.
    pub(super) fn deliver(&self, id: u32, now: Instant, src: u32, repr: &Repr<'_>) {
        let Ok(mut list) = self.list.try_lock() else {
            return;
        };
        if let Some(c) = list.iter_mut().find(|c| c.id == id && c.own.is_none()) {
            c.take(now, src, repr);
        }
    }

    fn run(&self) {
        let mut buf = vec![0u8; 65_536];
        loop {
            let now = Instant::now();
            let on_nic = self.lock().iter().any(|c| c.own.is_none());
            // Held for this look only: a program that closes its Nic
            // meanwhile waits for the look, and the connections on it are
            // let go at the next.
            let nic = on_nic.then(|| self.nic.read().unwrap_or_else(|e| e.into_inner()));
            // SAFETY: the Nic clears the pointer (under the write lock)
            // before it goes, and the read lock is held while it is used.
            let net: Option<&NetNic> = nic
                .as_ref()
                .and_then(|g| g.as_ref())
                .map(|p| unsafe { &*p.0 });
            if let Some(net) = net {
                // Outside the list's lock: the Nic's dispatch takes it to
                // hand the closing connections their frames.
                net.poll(None);
            }
            let mut done = Vec::new();
            let stop = {
                let mut list = self.lock();
                list.retain_mut(|c| {
                    let keep = c.drive(now, &mut buf, net);
                    if !keep && c.own.is_none() {
                        done.push(c.id);
                    }
                    keep
                });
                // Under the lock: a connection added after this sees the
                // thread gone and starts another.
                let stop = list.is_empty();
                if stop {
                    self.running.store(false, Ordering::Release);
                }
                stop
            };
            if let Some(net) = net {
                for id in done {
                    net.unregister(id);
                }
            }
            if stop {
                return;
            }
            std::thread::sleep(LOOK_EVERY);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Closing>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }
}
