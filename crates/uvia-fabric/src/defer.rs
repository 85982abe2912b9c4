//! Receives posted at the next CQ read: on shm an `fi_recv` queues its
//! operation here, and the next read of the CQ that the receive queue
//! reports to posts it to the VI before it looks for messages.
//!
//! A ping-pong reposts its receive between taking a message and answering
//! it (`fi_pingpong` does, and `ofi_rxm` reposts its buffers as it handles
//! each completion), so the post (the VI's lock, the descriptor's checks,
//! its queue slot: about 200 instructions) sat on the path of every
//! message. Queued here it costs a biased lock and a push, and the post
//! runs in the read that then waits for the answer, while the message
//! travels.
//!
//! Nothing is received earlier or later for it. On shm the receiver
//! places each message itself, in its own reads (`FI_PROGRESS_MANUAL`):
//! a message that comes before its receive is posted waits in the ring for
//! one (the VI's receiver-not-ready retry), and every read posts what waits
//! here before it looks at the ring; so does an EQ read that finds the peer
//! gone with messages still in the ring (`Eq::watch`), so that a program
//! waiting for `FI_SHUTDOWN` receives them before the connection fails.
//! Network media place messages in
//! their drive thread too, so their receives are posted at once.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use uvia::{status, BiasedLock, Descriptor, PostError, Vi};

/// An endpoint's receives waiting for the next CQ read.
pub struct Deferred {
    /// Biased ([`BiasedLock`]): the thread that posts the receives is
    /// nearly always the one that reads the CQ, and the push is on the
    /// message's path (`fi_recv` between taking a message and answering).
    pending: BiasedLock<Vec<Pending>>,
    /// `pending` is not empty: read without its lock on every CQ read.
    any: AtomicBool,
}

impl Default for Deferred {
    fn default() -> Deferred {
        let pending = BiasedLock::default();
        pending.allow_bias(true);
        Deferred {
            pending,
            any: AtomicBool::new(false),
        }
    }
}

/// A receive's descriptor (its operation's, see `cq::Op`).
struct Pending(NonNull<Descriptor>);

// SAFETY: the descriptor is the endpoint's pool slot, handed from the
// posting thread to the reading one under the lock.
unsafe impl Send for Pending {}

impl Deferred {
    /// Queues a receive the endpoint has checked; posted by the next
    /// [`flush`](Self::flush). True if `sleepers` (the CQ's threads in a
    /// blocking read) counted one: the caller then posts it at once.
    ///
    /// The count is read under the queue's lock, and a blocking read counts
    /// itself before it takes the lock to look (`flush` with `sleeping`):
    /// whichever of the two takes the lock second sees the other's step.
    /// (A sequentially consistent flag did the same and cost a fenced
    /// store on every receive.)
    pub fn push(&self, d: NonNull<Descriptor>, sleepers: Option<&AtomicU32>) -> bool {
        let mut p = self.pending.lock();
        p.push(Pending(d));
        self.any.store(true, Ordering::Release);
        sleepers.is_some_and(|n| n.load(Ordering::Relaxed) > 0)
    }

    /// Posts the waiting receives to `vi`, in order. A receive the VI
    /// refuses for a reason other than a full queue comes back completed
    /// with the matching error status, for the CQ to report (the ones after
    /// it wait for the next flush); on a full queue the rest wait for the
    /// next. `sleeping`: a blocking read about to sleep, which looks under
    /// the lock (see [`push`](Self::push)); a polling one looks at the flag
    /// first, and a push it misses is posted by its next read.
    #[inline]
    pub fn flush(&self, vi: &Vi, sleeping: bool) -> Option<NonNull<Descriptor>> {
        // The look every polling read makes, inlined into it: the call
        // and its frame cost more than the flag.
        if !sleeping && !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.post_pending(vi)
    }

    #[inline(never)]
    fn post_pending(&self, vi: &Vi) -> Option<NonNull<Descriptor>> {
        self.post(vi, false).1
    }

    /// Posts the waiting receives the VI takes, in order, and leaves the
    /// rest for the next flush (a receive the VI refuses is reported by a
    /// CQ read's flush, which this caller cannot do): an EQ read's look at
    /// a connection whose peer left with messages waiting, so that they
    /// find the receives the program posted before the connection fails.
    /// True if any was posted.
    pub fn post_accepted(&self, vi: &Vi) -> bool {
        self.waiting() && self.post(vi, true).0 > 0
    }

    /// Posts the waiting receives in order until the VI's queue is full or
    /// it refuses one: the number it took, and the refused one, completed
    /// as flushed and taken off the list, unless `keep_refused` (then it
    /// waits for the next flush).
    fn post(&self, vi: &Vi, keep_refused: bool) -> (usize, Option<NonNull<Descriptor>>) {
        let mut p = self.pending.lock();
        let mut posted = 0;
        let mut refused = None;
        for d in p.iter() {
            // SAFETY: an operation of the endpoint's pool, given up to us
            // by `push` and to the queue now; a refused one stays ours.
            match unsafe { vi.post_recv_raw(d.0, false) } {
                Ok(()) => posted += 1,
                Err(PostError::QueueFull(..)) => break,
                Err(_) if keep_refused => break,
                Err(e) => {
                    // Refused for the VI's state: flushed, as the VI's
                    // own receives are when it leaves the connected state.
                    let why = match e.status_bits() {
                        0 => status::DESC_FLUSHED_ERROR,
                        bits => bits,
                    };
                    // SAFETY: refused, so ours: its status tells the CQ.
                    unsafe { (*d.0.as_ptr()).cs.status = status::DONE | status::OP_RECEIVE | why };
                    refused = Some(d.0);
                    break;
                }
            }
        }
        let taken = posted + usize::from(refused.is_some());
        p.drain(..taken);
        self.any.store(!p.is_empty(), Ordering::Release);
        (posted, refused)
    }

    /// True if receives wait for a flush.
    pub fn waiting(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Takes back every waiting receive (the endpoint closes).
    pub fn take_all(&self) -> Vec<NonNull<Descriptor>> {
        let mut p = self.pending.lock();
        self.any.store(false, Ordering::Release);
        p.drain(..).map(|d| d.0).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uvia::{MemAttributes, Nic, ViAttributes};

    /// Receives wait until a flush, go to the VI in the order they came,
    /// and those that find its queue full wait for the next flush.
    #[test]
    fn receives_are_posted_in_order_by_the_flushes_as_room_allows() {
        let nic = Nic::open("shm").unwrap();
        let ptag = nic.create_ptag().unwrap();
        let region = nic.alloc_region(4096, MemAttributes::new(ptag)).unwrap();
        let vi = nic
            .create_vi(ViAttributes::new(ptag).queue_depths(4, 2), None, None)
            .unwrap();
        let descs: Vec<NonNull<Descriptor>> = (0..3)
            .map(|i| {
                let d = Box::new(Descriptor::recv(&[region.segment(i * 64, 64)]));
                NonNull::from(Box::leak(d))
            })
            .collect();
        let df = Deferred::default();
        assert!(df.flush(&vi, false).is_none(), "nothing waits");
        let sleepers = AtomicU32::new(0);
        assert!(!df.push(descs[0], Some(&sleepers)), "nobody sleeps");
        sleepers.store(1, Ordering::Relaxed);
        assert!(df.push(descs[1], Some(&sleepers)), "a sleeper is seen");
        assert!(!df.push(descs[2], None), "no CQ: nobody to see");
        // Room for two: the first two are posted, the third waits.
        assert!(df.flush(&vi, true).is_none());
        assert!(df.any.load(Ordering::Acquire), "the third still waits");
        assert_eq!(df.pending.lock().len(), 1);
        assert_eq!(df.pending.lock()[0].0, descs[2]);
        // The endpoint closes: what waits comes back, and the VI gives
        // back the two it holds (flushed as it goes).
        assert_eq!(df.take_all(), vec![descs[2]]);
        assert!(!df.any.load(Ordering::Acquire));
        vi.disconnect();
        let mut back = Vec::new();
        while let Some(d) = vi.recv_done_raw() {
            back.push(d);
        }
        assert_eq!(back, descs[..2].to_vec(), "posted in the order pushed");
        for d in descs {
            // SAFETY: leaked above, taken back from the VI or the list.
            drop(unsafe { Box::from_raw(d.as_ptr()) });
        }
    }
}
