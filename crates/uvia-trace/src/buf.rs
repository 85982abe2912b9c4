//! The per-thread buffers behind [`record`](crate::record).
//!
//! Each thread that records gets a buffer of its own, allocated at its
//! first checkpoint and written only by it; a registry keeps every buffer so
//! that [`take`] can read them all. The writer publishes an entry by storing
//! the buffer's length with release ordering after writing the entry, and
//! the reader loads the length with acquire ordering before reading the
//! entries below it, so no lock is taken on the path.

use crate::{ticks, Mark, Stage, Trace};
use std::cell::{RefCell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Clone, Copy)]
struct Raw {
    ticks: u64,
    stage: u16,
}

struct ThreadBuf {
    index: u32,
    entries: Box<[UnsafeCell<Raw>]>,
    len: AtomicUsize,
    dropped: AtomicU64,
}

// SAFETY: entries are written only by the owning thread, below no index a
// reader has been shown (see the module's ordering rule).
unsafe impl Sync for ThreadBuf {}

struct Registry {
    buffers: Vec<Arc<ThreadBuf>>,
    next_index: u32,
    per_thread: usize,
    /// (counter, CLOCK_MONOTONIC ns) when recording started.
    origin: (u64, u64),
    mark_cost_ticks: f64,
}

static ON: AtomicBool = AtomicBool::new(false);
static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    buffers: Vec::new(),
    next_index: 0,
    per_thread: 0,
    origin: (0, 0),
    mark_cost_ticks: 0.0,
});

/// The size [`start`] asked for, read by threads whose buffer is smaller.
static PER_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MINE: RefCell<Option<Arc<ThreadBuf>>> = const { RefCell::new(None) };
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

fn new_buffer() -> Arc<ThreadBuf> {
    let mut r = registry();
    let b = Arc::new(ThreadBuf {
        index: r.next_index,
        entries: (0..r.per_thread.max(1))
            .map(|_| UnsafeCell::new(Raw { ticks: 0, stage: 0 }))
            .collect(),
        len: AtomicUsize::new(0),
        dropped: AtomicU64::new(0),
    });
    r.next_index += 1;
    r.buffers.push(b.clone());
    b
}

/// Records `stage` now, if tracing is on.
#[inline(always)]
pub fn record(stage: Stage) {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    let t = ticks();
    push(t, stage);
}

#[inline(never)]
fn push(t: u64, stage: Stage) {
    // A thread being torn down has no buffer left: its checkpoint is lost.
    let _ = MINE.try_with(|m| {
        let mut m = m.borrow_mut();
        // A thread's first checkpoint, or its first since a start that
        // asked for more room than its buffer has: a buffer of the size
        // asked for (the old one leaves the registry at the next take).
        let b = match &*m {
            Some(b)
                if b.entries.len() >= PER_THREAD.load(Ordering::Relaxed)
                    || b.len.load(Ordering::Relaxed) > 0 =>
            {
                b
            }
            _ => m.insert(new_buffer()),
        };
        let n = b.len.load(Ordering::Relaxed);
        if n == b.entries.len() {
            b.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // SAFETY: only this thread writes its buffer, and no reader looks
        // at index n before the store of n + 1 below.
        unsafe {
            *b.entries[n].get() = Raw {
                ticks: t,
                stage: stage as u16,
            }
        };
        b.len.store(n + 1, Ordering::Release);
    });
}

/// A (counter, clock) pair read as close together as the machine allows:
/// the tightest of a few tries.
fn clock_pair() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..16 {
        let a = ticks();
        let ns = crate::monotonic_ns();
        let b = ticks();
        if b.wrapping_sub(a) < best.0 {
            best = (b.wrapping_sub(a), a / 2 + b / 2, ns);
        }
    }
    (best.1, best.2)
}

/// Empties every buffer and starts recording.
pub(crate) fn start(per_thread: usize) {
    ON.store(false, Ordering::SeqCst);
    {
        let mut r = registry();
        r.per_thread = per_thread;
        PER_THREAD.store(per_thread.max(1), Ordering::Relaxed);
        for b in &r.buffers {
            b.len.store(0, Ordering::Relaxed);
            b.dropped.store(0, Ordering::Relaxed);
        }
    }
    // What a checkpoint costs the code around it: a stretch of ordinary
    // work (loads, stores and arithmetic on a small table, about as long
    // as the library's code between two checkpoints) timed with a
    // checkpoint after each piece and without, the difference per
    // checkpoint. Checkpoints timed back to back would cost more: there
    // the counter reads queue behind each other, while on a message's path
    // the processor overlaps them with the work around them. The median of
    // several timings, so that one interrupted timing does not set it.
    ON.store(true, Ordering::SeqCst);
    const N: u32 = 256;
    const TIMINGS: usize = 15;
    let forget = || {
        let _ = MINE.try_with(|m| {
            if let Some(b) = &*m.borrow() {
                b.len.store(0, Ordering::Relaxed);
                b.dropped.store(0, Ordering::Relaxed);
            }
        });
    };
    record(Stage::AppSend);
    let mut table = [0u64; 64];
    let mut timings = [0f64; TIMINGS];
    for t in &mut timings {
        forget();
        let t0 = ticks();
        for i in 0..N {
            work(&mut table, i);
        }
        let t1 = ticks();
        for i in 0..N {
            work(&mut table, i);
            record(std::hint::black_box(Stage::AppSend));
        }
        let t2 = ticks();
        *t = ((t2 - t1) as f64 - (t1 - t0) as f64) / f64::from(N);
    }
    std::hint::black_box(&table);
    forget();
    timings.sort_by(f64::total_cmp);
    let cost = timings[TIMINGS / 2].max(0.0);
    let mut r = registry();
    r.mark_cost_ticks = cost;
    r.origin = clock_pair();
}

/// A piece of ordinary work for the checkpoint's calibration: a walk over
/// a small table, each step a load, a multiply and a store.
#[inline(never)]
fn work(table: &mut [u64; 64], seed: u32) {
    let mut x = u64::from(seed) | 1;
    for i in 0..32 {
        let j = (x as usize ^ i) & 63;
        x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ table[j];
        table[j] = x;
    }
}

/// Stops recording and takes every thread's checkpoints, in time order.
/// The buffers are left empty; recording resumes with the next [`start`].
pub fn take() -> Trace {
    ON.store(false, Ordering::SeqCst);
    let end = clock_pair();
    let mut r = registry();
    let (t0, ns0) = r.origin;
    let span_ticks = end.0.saturating_sub(t0) as f64;
    let span_ns = end.1.saturating_sub(ns0) as f64;
    let ticks_per_ns = if span_ns > 0.0 && span_ticks > 0.0 {
        span_ticks / span_ns
    } else {
        1.0
    };
    let mut trace = Trace {
        marks: Vec::new(),
        mark_cost_ns: r.mark_cost_ticks / ticks_per_ns,
        ticks_per_ns,
        dropped: 0,
    };
    for b in &r.buffers {
        let n = b.len.load(Ordering::Acquire);
        for e in &b.entries[..n] {
            // SAFETY: below the published length; the writer is done with
            // these entries (see the module's ordering rule).
            let raw = unsafe { *e.get() };
            let Some(stage) = Stage::from_u16(raw.stage) else {
                continue;
            };
            let ticks = raw.ticks.saturating_sub(t0);
            trace.marks.push(Mark {
                ns: ns0 + (ticks as f64 / ticks_per_ns) as u64,
                ticks,
                stage,
                thread: b.index,
            });
        }
        trace.dropped += b.dropped.load(Ordering::Relaxed);
        b.len.store(0, Ordering::Relaxed);
        b.dropped.store(0, Ordering::Relaxed);
    }
    // Threads that have exited, or moved to a larger buffer, hold no
    // reference to their old one any more.
    r.buffers.retain(|b| Arc::strong_count(b) > 1);
    trace.marks.sort_by_key(|m| (m.ticks, m.thread));
    trace
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: recording is process-wide, so tests in parallel would
    // take each other's checkpoints.
    #[test]
    fn checkpoints_of_every_thread_come_back_in_order_on_the_monotonic_clock() {
        crate::start(4);
        let before = crate::monotonic_ns();
        crate::mark!(AppSend);
        std::thread::spawn(|| {
            crate::mark!(RxFound);
            crate::mark!(AppReceived);
        })
        .join()
        .unwrap();
        crate::mark!(AppSendReturned);
        for _ in 0..10 {
            crate::mark!(ViPosted);
        }
        let after = crate::monotonic_ns();
        let t = take();
        let stages: Vec<Stage> = t.marks.iter().map(|m| m.stage).collect();
        assert_eq!(
            &stages[..4],
            [
                Stage::AppSend,
                Stage::RxFound,
                Stage::AppReceived,
                Stage::AppSendReturned
            ]
        );
        // This thread's buffer holds four: two fit after AppSend and
        // AppSendReturned, the other eight are counted.
        assert_eq!(stages.len(), 6);
        assert_eq!(t.dropped, 8);
        assert_ne!(t.marks[0].thread, t.marks[1].thread);
        // The fitted clock puts them between two clock reads (a few
        // nanoseconds of slack for the fit).
        for m in &t.marks {
            assert!(m.ns + 50 >= before && m.ns <= after + 50, "{m:?}");
        }
        // The checkpoint's cost is a calibration (a median difference of
        // timed work, clamped at zero): a number, never negative; on a
        // loaded host it may read zero or large, so no bound is a test.
        assert!(
            t.mark_cost_ns.is_finite() && t.mark_cost_ns >= 0.0,
            "{}",
            t.mark_cost_ns
        );
        // Taken means stopped and emptied.
        crate::mark!(AppSend);
        assert!(take().marks.is_empty());
        // A later start with more room gives this thread a larger buffer.
        crate::start(16);
        for _ in 0..12 {
            crate::mark!(ViPosted);
        }
        let t = take();
        assert_eq!((t.marks.len(), t.dropped), (12, 0));
        // And one with less room keeps the larger buffer.
        crate::start(2);
        for _ in 0..5 {
            crate::mark!(ViPosted);
        }
        assert_eq!(take().marks.len(), 5);
    }
}
