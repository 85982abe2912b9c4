//! Cycle-accurate timing.
//!
//! On x86_64 the time stamp counter is read with `rdtsc` fenced by `lfence` on
//! both sides (so the read is neither hoisted above earlier work nor sunk below
//! later work); the tick length is calibrated once against
//! [`std::time::Instant`] over about 50 ms. Elsewhere ticks are nanoseconds
//! from `Instant`.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A raw timestamp in ticks.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn ticks() -> u64 {
    // SAFETY: rdtsc and lfence have no memory-safety preconditions on x86_64.
    unsafe {
        core::arch::x86_64::_mm_lfence();
        let t = core::arch::x86_64::_rdtsc();
        core::arch::x86_64::_mm_lfence();
        t
    }
}

/// A raw timestamp in ticks (nanoseconds since the first call on this target).
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub fn ticks() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Nanoseconds per tick, calibrated on first use.
pub fn ns_per_tick() -> f64 {
    static NS: OnceLock<f64> = OnceLock::new();
    *NS.get_or_init(calibrate)
}

#[cfg(target_arch = "x86_64")]
fn calibrate() -> f64 {
    let span = Duration::from_millis(50);
    let t0 = Instant::now();
    let c0 = ticks();
    while t0.elapsed() < span {
        std::hint::spin_loop();
    }
    let c1 = ticks();
    let ns = t0.elapsed().as_nanos() as f64;
    let t = (c1.wrapping_sub(c0)) as f64;
    if t > 0.0 && ns > 0.0 {
        ns / t
    } else {
        1.0
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn calibrate() -> f64 {
    1.0
}

/// Converts a tick difference to nanoseconds.
#[inline]
pub fn to_ns(ticks: u64) -> f64 {
    ticks as f64 * ns_per_tick()
}
