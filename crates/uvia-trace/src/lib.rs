//! Checkpoint tracing: where a message's time goes, stage by stage.
//!
//! A checkpoint ([`mark!`]) records a [`Stage`] and a timestamp into a
//! buffer of the calling thread. Without the `enabled` feature it compiles
//! to nothing, so the fast path of a normal build is untouched; with it, a
//! checkpoint is one relaxed load while tracing is off and a time-stamp
//! counter read and a 16-byte store while it is on.
//!
//! Timestamps are taken from the time-stamp counter (cheap, and the same
//! counter in every process of the host) and turned into `CLOCK_MONOTONIC`
//! nanoseconds when the trace is taken, by a straight line fitted between
//! the counter and the clock at [`start`] and at [`take`]. That clock is
//! the one the kernel's own event timestamps use, so the checkpoints of two
//! processes and the kernel's events land on one time line.
//!
//! The cost of a checkpoint is measured by [`start`] and reported with the
//! trace, to be subtracted from the stages (the source documents measured
//! theirs the same way).

pub mod kernel;
mod stage;

pub use stage::Stage;

#[cfg(feature = "enabled")]
mod buf;
#[cfg(feature = "enabled")]
pub use buf::{record, take};

/// Records a checkpoint: nothing at all in a build without tracing.
#[cfg(not(feature = "enabled"))]
#[inline(always)]
pub fn record(_: Stage) {}

/// Takes the trace: empty in a build without tracing.
#[cfg(not(feature = "enabled"))]
pub fn take() -> Trace {
    Trace::default()
}

/// Whether checkpoints are compiled in.
pub const COMPILED_IN: bool = cfg!(feature = "enabled");

/// One checkpoint of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    /// `CLOCK_MONOTONIC`, in nanoseconds.
    pub ns: u64,
    /// Time-stamp counter ticks since the trace started (cycles, where the
    /// counter runs at the nominal clock rate).
    pub ticks: u64,
    pub stage: Stage,
    /// Which thread of the process made it (in the order threads first
    /// made one).
    pub thread: u32,
}

/// A trace taken from a process: its checkpoints in time order.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub marks: Vec<Mark>,
    /// What one checkpoint costs, in nanoseconds (measured at start).
    pub mark_cost_ns: f64,
    /// Counter ticks per nanosecond (the fitted line's slope).
    pub ticks_per_ns: f64,
    /// Checkpoints left out because a thread's buffer was full.
    pub dropped: u64,
}

/// Records a checkpoint; compiled out unless the `enabled` feature is on.
#[macro_export]
macro_rules! mark {
    ($stage:ident) => {
        $crate::record($crate::Stage::$stage)
    };
}

/// Starts recording: every thread's buffer holds up to `per_thread`
/// checkpoints (the rest are counted as dropped). Measures the cost of a
/// checkpoint first. Without the `enabled` feature it does nothing.
pub fn start(per_thread: usize) {
    #[cfg(feature = "enabled")]
    buf::start(per_thread);
    #[cfg(not(feature = "enabled"))]
    let _ = per_thread;
}

/// Reads the time-stamp counter (`CLOCK_MONOTONIC` where there is none).
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86_64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        monotonic_ns()
    }
}

/// The step the counter is seen to move in, in ticks: the most common
/// non-zero difference between back-to-back reads. Where the counter
/// counts every cycle that is the cost of a read; under some hypervisors
/// the counter itself moves in coarser steps (tens of cycles), and a time
/// read from it is only good to a step.
pub fn counter_step() -> u64 {
    let mut diffs: Vec<u64> = Vec::with_capacity(4096);
    let mut last = ticks();
    while diffs.len() < diffs.capacity() {
        let t = ticks();
        if t != last {
            diffs.push(t.wrapping_sub(last));
        }
        last = t;
    }
    diffs.sort_unstable();
    // The longest run of equal differences.
    let (mut best, mut best_len, mut i) = (diffs[0], 0, 0);
    while i < diffs.len() {
        let j = diffs.partition_point(|&d| d <= diffs[i]);
        if j - i > best_len {
            (best, best_len) = (diffs[i], j - i);
        }
        i = j;
    }
    best
}

/// `CLOCK_MONOTONIC` in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_counter_moves_in_steps_shorter_than_a_microsecond() {
        let step = super::counter_step();
        let (t0, ns0) = (super::ticks(), super::monotonic_ns());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let per_ns = (super::ticks() - t0) as f64 / (super::monotonic_ns() - ns0) as f64;
        assert!(step > 0);
        assert!(
            (step as f64 / per_ns) < 1000.0,
            "{step} ticks at {per_ns}/ns"
        );
    }
}
