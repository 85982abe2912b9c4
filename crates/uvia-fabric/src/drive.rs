//! Driving a domain's VIs between the program's calls.
//!
//! A network Nic's protocol has timers (delayed acknowledgements,
//! retransmissions, keep-alives) that run only inside library calls
//! (`NicAttributes::needs_driving`). A libfabric program may stop calling
//! the provider while its peer still waits on it: `fi_pingpong`'s client
//! reads its last message and then blocks on its control socket, while the
//! server waits for that message's acknowledgement, which the client's
//! engine would send 50 us later from a timer nobody runs; after the idle
//! timeout the server's send fails with a transport error. So a domain on
//! such a Nic keeps a thread that drives each of its VIs every
//! millisecond, as the VIPL face's library thread does, and CQ reads drive
//! them too (a busy reader runs the timers sooner than the thread). While
//! the reads drive, the thread sleeps longer ([`MAX_TICK`]).
//!
//! While the program reads its CQs the thread stays off the VIs: its drive
//! would take a VI's lock from under a reader polling on the same core
//! (a reader that then waits for a thread that is not running), and the
//! reads already run the timers.

use crate::guard::lock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use uvia::Vi;

/// How often the thread drives the VIs: the core's CQ wait looks at
/// network VIs' timers as often.
const TICK: Duration = Duration::from_millis(1);

/// The longest the thread sleeps while CQ reads drive the VIs. It shares
/// the core of the thread that polls (it inherits its affinity), so each
/// wake-up takes that core from the polling thread, some 950 times a second
/// at [`TICK`] (counted on `fi_pingpong` over udp), and lands on a message
/// in flight. While reads drive, the thread doubles its sleep up to this;
/// the first tick without them brings it back to [`TICK`]. A program that
/// stops reading has its timers run within this much (an acknowledgement
/// it owes comes that much later; the peer's retransmission covers it).
const MAX_TICK: Duration = Duration::from_millis(16);

/// Least time between two drives from CQ reads: an empty read already
/// takes in what arrived (the core's done call); this only adds the timers,
/// and a VI's own polls already look at those every 16 polls (at an armed
/// delayed acknowledgement every second); this is for the VIs a read does
/// not poll.
const READ_DRIVE_EVERY: Duration = Duration::from_micros(50);

/// Empty reads between two looks at the clock for [`READ_DRIVE_EVERY`]: an
/// empty read on a network medium takes about half a microsecond (its
/// receive call), so 16 of them stay well inside the 50 us, and a poll
/// reads no clock (a vDSO call, some 30 cycles of a 1,000-cycle poll here).
const READS_PER_CLOCK: u32 = 16;

/// The VIs of one domain and, on a Nic that needs driving, the thread that
/// drives them.
pub struct Driver {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The VIs need driving (the thread was asked for).
    driven: bool,
    /// When a CQ read last drove the VIs (microseconds since `epoch`).
    last: AtomicU64,
    /// Empty reads since the clock was last looked at.
    reads: AtomicU32,
    epoch: Instant,
}

struct Shared {
    vis: Mutex<Vec<Vi>>,
    stop: AtomicBool,
    /// Counts the CQ reads' drives: the thread leaves the VIs alone for a
    /// tick in which it moved.
    reads_drove: AtomicU64,
    /// The thread's wake-ups and its own drives (read by the tests).
    wakes: AtomicU64,
    thread_drove: AtomicU64,
}

impl Driver {
    /// A driver for a domain's VIs: `driven`, CQ reads run their timers;
    /// with `thread` too, a thread that drives them until
    /// [`stop`](Self::stop).
    pub fn new(driven: bool, thread: bool) -> Driver {
        let thread = driven && thread;
        let shared = Arc::new(Shared {
            vis: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            reads_drove: AtomicU64::new(0),
            wakes: AtomicU64::new(0),
            thread_drove: AtomicU64::new(0),
        });
        let handle = thread.then(|| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name("uvia-fi-drive".into())
                .spawn(move || {
                    let mut seen = u64::MAX;
                    let mut tick = TICK;
                    while !s.stop.load(Ordering::Acquire) {
                        let now = s.reads_drove.load(Ordering::Relaxed);
                        s.wakes.fetch_add(1, Ordering::Relaxed);
                        tick = if now == seen {
                            s.drive();
                            s.thread_drove.fetch_add(1, Ordering::Relaxed);
                            TICK
                        } else {
                            (tick * 2).min(MAX_TICK)
                        };
                        seen = now;
                        std::thread::park_timeout(tick);
                    }
                })
        });
        Driver {
            shared,
            // A thread that could not start leaves the CQ reads to drive.
            thread: Mutex::new(handle.and_then(Result::ok)),
            driven,
            last: AtomicU64::new(0),
            reads: AtomicU32::new(0),
            epoch: Instant::now(),
        }
    }

    pub fn add(&self, vi: &Vi) {
        lock(&self.shared.vis).push(vi.clone());
    }

    pub fn remove(&self, vi: &Vi) {
        lock(&self.shared.vis).retain(|v| v.id() != vi.id());
    }

    /// Drives the VIs if the last read's drive is old enough (a CQ read
    /// that found nothing).
    pub fn drive_from_read(&self) {
        if !self.driven {
            return;
        }
        // Relaxed, and racy between readers: a count lost now and then
        // only moves the next look at the clock.
        let n = self.reads.load(Ordering::Relaxed).wrapping_add(1);
        self.reads.store(n, Ordering::Relaxed);
        if !n.is_multiple_of(READS_PER_CLOCK) {
            return;
        }
        let now = self.epoch.elapsed().as_micros() as u64;
        let last = self.last.load(Ordering::Relaxed);
        if now.saturating_sub(last) < READ_DRIVE_EVERY.as_micros() as u64 {
            return;
        }
        // One reader drives; the others go on.
        if self
            .last
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.shared.drive();
            self.shared.reads_drove.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Stops the thread and waits for it (the domain closes).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = lock(&self.thread).take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Shared {
    /// Drives every VI, under the list's lock: an endpoint that closes
    /// meanwhile waits for the round, so no VI outlives its endpoint here.
    fn drive(&self) {
        for vi in lock(&self.vis).iter() {
            vi.try_drive();
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While CQ reads drive, the thread wakes a few times where it woke
    /// every millisecond; once they stop, it drives within its longest
    /// sleep.
    #[test]
    fn the_thread_backs_off_while_reads_drive_and_drives_when_they_stop() {
        let d = Driver::new(true, true);
        let s = d.shared.clone();
        // Reads drive every 50 us for 300 ms (the first round of
        // wake-ups may fall before them).
        std::thread::sleep(Duration::from_millis(5));
        let start = Instant::now();
        let (wakes0, drove0) = (
            s.wakes.load(Ordering::Relaxed),
            s.thread_drove.load(Ordering::Relaxed),
        );
        while start.elapsed() < Duration::from_millis(300) {
            d.drive_from_read();
        }
        let wakes = s.wakes.load(Ordering::Relaxed) - wakes0;
        let drove = s.thread_drove.load(Ordering::Relaxed) - drove0;
        assert!(
            s.reads_drove.load(Ordering::Relaxed) > 100,
            "the reads drove"
        );
        // At TICK it would be about 300; at MAX_TICK about 19.
        assert!(wakes < 60, "{wakes} wake-ups in 300 ms of reads");
        // It drives only after a tick in which no read drove: the reading
        // loop descheduled for a tick or more (other tests share the two
        // cores) lets it drive now and then, never at most of its wake-ups.
        assert!(
            drove * 3 <= wakes.max(6),
            "the thread drove {drove} times in {wakes} wake-ups while reads did"
        );
        // The reads stop: the thread drives within its longest sleep
        // (and a margin for a loaded machine).
        let before = s.thread_drove.load(Ordering::Relaxed);
        let stop = Instant::now();
        while s.thread_drove.load(Ordering::Relaxed) == before {
            assert!(
                stop.elapsed() < MAX_TICK * 2 + Duration::from_millis(200),
                "the thread did not drive after the reads stopped"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        d.stop();
    }
}
