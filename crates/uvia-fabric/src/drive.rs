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
//! them too (a busy reader runs the timers sooner than the thread).

use crate::guard::lock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use uvia::Vi;

/// How often the thread drives the VIs: the core's CQ wait looks at
/// network VIs' timers as often.
const TICK: Duration = Duration::from_millis(1);

/// Least time between two drives from CQ reads: an empty read already
/// takes in what arrived (the core's done call); this only adds the timers,
/// which need no finer grain than the shortest of them (the 50 us
/// acknowledgement delay).
const READ_DRIVE_EVERY: Duration = Duration::from_micros(50);

/// The VIs of one domain and, on a Nic that needs driving, the thread that
/// drives them.
pub struct Driver {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The VIs need driving (the thread was asked for).
    driven: bool,
    /// When a CQ read last drove the VIs (microseconds since `epoch`).
    last: AtomicU64,
    epoch: Instant,
}

struct Shared {
    vis: Mutex<Vec<Vi>>,
    stop: AtomicBool,
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
        });
        let handle = thread.then(|| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name("uvia-fi-drive".into())
                .spawn(move || {
                    while !s.stop.load(Ordering::Acquire) {
                        s.drive();
                        std::thread::park_timeout(TICK);
                    }
                })
        });
        Driver {
            shared,
            // A thread that could not start leaves the CQ reads to drive.
            thread: Mutex::new(handle.and_then(Result::ok)),
            driven,
            last: AtomicU64::new(0),
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
