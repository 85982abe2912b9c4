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
//! Nic keeps a closing connection's engine and its own medium here until
//! the peer answers the disconnect or its tries are spent
//! ([`uvia_proto::Conn::close`]: three, [`Config::handshake_retry`] apart,
//! each carrying the acknowledgement), and while the peer still sends
//! after that. A thread of the Nic's, alive only while connections close,
//! reads what the peer sends, answers each of its data frames with the
//! disconnect and sends the disconnect again when due; it needs nothing
//! of the Nic, which the program may close at once.
//!
//! [`Config::handshake_retry`]: uvia_proto::Config::handshake_retry

use super::vi::NoMemory;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uvia_net::{Addr, Medium, OutFrame, RecvBatch};
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

/// One closing connection: its engine (closing, then closed) and the
/// medium its peer sends to.
pub(super) struct Closing {
    conn: Conn,
    medium: Arc<dyn Medium>,
    peer: Addr,
    id: u32,
    intact: bool,
    batch: RecvBatch,
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
        Closing {
            conn,
            medium,
            peer,
            id,
            intact,
            batch: RecvBatch::new(slots, 65_536),
            until: Instant::now() + KEEP_AT_MOST,
            heard: Instant::now(),
        }
    }

    /// Takes in what the peer sent, runs the engine's timers and sends
    /// what it has to (a closed engine answers the peer's data with the
    /// disconnect). False once it is closed and the peer quiet, or kept
    /// [`KEEP_AT_MOST`].
    fn drive(&mut self, now: Instant, buf: &mut [u8]) -> bool {
        if let Ok(n) = self.medium.recv(&mut self.batch) {
            for i in 0..n {
                let (_, bytes) = self.batch.frame(i);
                if let Ok((dst, src, repr)) = super::parse(self.intact, bytes) {
                    if dst == self.id {
                        self.heard = now;
                        self.conn.handle_frame(now, src, &repr, &mut NoMemory);
                    }
                }
            }
        }
        if self.conn.poll_timeout().is_some_and(|t| t <= now) {
            self.conn.handle_timeout(now);
        }
        while let Some(n) = self.conn.poll_transmit(now, buf, &mut NoMemory) {
            let f = [OutFrame {
                to: self.peer,
                bytes: &buf[..n],
            }];
            let _ = self.medium.send(&f);
        }
        let done = self.conn.is_closed() && now >= self.heard + QUIET;
        !done && now < self.until
    }
}

/// A Nic's closing connections, and whether its thread runs.
#[derive(Default)]
pub(super) struct Closer {
    list: Mutex<Vec<Closing>>,
    running: AtomicBool,
}

impl Closer {
    /// Keeps `c` until it is done closing, starting the thread if it is not
    /// running. If no thread can be started, the connection is let go as
    /// before: its peer's idle timeout covers a lost disconnect.
    pub(super) fn keep(self: &Arc<Closer>, c: Closing) {
        self.list.lock().unwrap_or_else(|e| e.into_inner()).push(c);
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        let started = std::thread::Builder::new()
            .name("uvia-closing".into())
            .spawn(move || me.run());
        if started.is_err() {
            self.running.store(false, Ordering::Release);
            self.list.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    fn run(&self) {
        let mut buf = vec![0u8; 65_536];
        loop {
            let now = Instant::now();
            {
                let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
                list.retain_mut(|c| c.drive(now, &mut buf));
                if list.is_empty() {
                    // Under the lock: a connection added after this sees
                    // the thread gone and starts another.
                    self.running.store(false, Ordering::Release);
                    return;
                }
            }
            std::thread::sleep(LOOK_EVERY);
        }
    }
}
