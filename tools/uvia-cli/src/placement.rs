//! Where the host has put the two cores, read around each pair of a
//! comparison, so that a pair compares its two runs on the same footing.
//!
//! A virtual machine's two cores are two threads of the host, and the host
//! moves them: on some days between two hardware threads of one core, two
//! cores sharing a cache and two cores that do not, every few seconds. A
//! cache line then crosses from one core to the other in 20 to 330 ns, and
//! every figure that moves lines between the cores (shm, and through the
//! kernel's loopback udp too) moves with it, by up to three times. A pair
//! whose contender ran in one placement and its baseline in another gives a
//! ratio of the host, not of the two.
//!
//! So the cache-line ping-pong of `uvia limit` (a line each way, a few
//! thousand round trips, some milliseconds) is read before the contender,
//! between the two and after the baseline. Where the three readings differ
//! by more than [`MOVED`] times, the host moved the cores during the pair,
//! and the pair is measured again, up to [`TRIES`] times in all; a pair
//! that moved every time is kept and marked. The report gives every pair's
//! readings, so a reader sees which placement each ratio comes from.

use crate::limit::{self, Lines};
use crate::stats::median;
use anyhow::Result;

/// Round trips of one reading.
pub const ROUNDS: usize = 4_000;
/// Readings of one pair further apart than this factor mean the host moved
/// the cores between them.
pub const MOVED: f64 = 2.0;
/// Times a pair is measured before one that moved is kept anyway.
pub const TRIES: usize = 3;

/// The cores' cache-line one-way now (ns, the median of a short ping-pong
/// with a line each way); `None` if the probe could not run.
pub fn read() -> Option<f64> {
    // On one core the ping-pong's two sides would take turns by the
    // scheduler's slices, seconds for a reading that says nothing.
    if std::thread::available_parallelism().map_or(true, |n| n.get() < 2) {
        return None;
    }
    limit::cacheline(ROUNDS, Lines::EachWay)
        .ok()
        .filter(|v| !v.is_empty())
        .map(|v| median(&v))
}

/// Whether readings show the cores moved: the largest more than [`MOVED`]
/// times the smallest.
pub fn moved(readings: &[f64]) -> bool {
    let lo = readings.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = readings.iter().copied().fold(0.0, f64::max);
    lo > 0.0 && hi > lo * MOVED
}

/// One pair of a comparison, measured with the placement read around it.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub contender: f64,
    pub baseline: f64,
    /// Before the contender, between the two, after the baseline (ns);
    /// `None` where a reading could not be made.
    pub line_ns: Option<[f64; 3]>,
    /// Times the pair was measured (1 unless the cores moved).
    pub tries: usize,
}

impl Measured {
    /// Whether the kept measurement itself saw the cores move.
    pub fn moved(&self) -> bool {
        self.line_ns.is_some_and(|l| moved(&l))
    }
}

/// Measures `contender` then `baseline`, with `read` around and between
/// them, again while the readings say the cores moved (at most [`TRIES`]
/// times in all). The first error of either side ends it.
pub fn pair(
    mut contender: impl FnMut() -> Result<f64>,
    mut baseline: impl FnMut() -> Result<f64>,
    mut read: impl FnMut() -> Option<f64>,
) -> Result<Measured> {
    let mut tries = 0;
    loop {
        tries += 1;
        let before = read();
        let c = contender()?;
        let between = read();
        let b = baseline()?;
        let after = read();
        let line_ns = match (before, between, after) {
            (Some(x), Some(y), Some(z)) => Some([x, y, z]),
            _ => None,
        };
        let m = Measured {
            contender: c,
            baseline: b,
            line_ns,
            tries,
        };
        if !m.moved() || tries >= TRIES {
            return Ok(m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::bail;
    use std::cell::Cell;

    #[test]
    fn readings_apart_by_more_than_the_factor_are_a_move() {
        assert!(!moved(&[40.0, 70.0, 79.0]));
        assert!(moved(&[40.0, 70.0, 81.0]));
        assert!(moved(&[300.0, 90.0, 300.0]));
        // No reading, or a zero one (a probe that measured nothing), is no move.
        assert!(!moved(&[]));
        assert!(!moved(&[0.0, 300.0]));
    }

    #[test]
    fn a_pair_the_host_moved_is_measured_again_until_it_stays() {
        // Readings: the first pair moves (40 -> 300), the second stays far.
        let readings = [40.0, 300.0, 300.0, 290.0, 310.0, 300.0];
        let at = Cell::new(0);
        let runs = Cell::new(0);
        let m = pair(
            || {
                runs.set(runs.get() + 1);
                Ok(runs.get() as f64)
            },
            || Ok(10.0),
            || {
                let r = readings[at.get()];
                at.set(at.get() + 1);
                Some(r)
            },
        )
        .unwrap();
        assert_eq!(m.tries, 2);
        assert_eq!(runs.get(), 2);
        assert_eq!(m.contender, 2.0, "the second measurement is the one kept");
        assert_eq!(m.line_ns, Some([290.0, 310.0, 300.0]));
        assert!(!m.moved());
    }

    #[test]
    fn a_pair_that_moves_every_time_is_kept_after_the_last_try_and_marked() {
        let flip = Cell::new(false);
        let m = pair(
            || Ok(1.0),
            || Ok(2.0),
            || {
                flip.set(!flip.get());
                Some(if flip.get() { 40.0 } else { 300.0 })
            },
        )
        .unwrap();
        assert_eq!(m.tries, TRIES);
        assert!(m.moved());
    }

    #[test]
    fn without_readings_a_pair_is_measured_once() {
        let runs = Cell::new(0);
        let m = pair(
            || {
                runs.set(runs.get() + 1);
                Ok(1.0)
            },
            || Ok(2.0),
            || None,
        )
        .unwrap();
        assert_eq!((m.tries, runs.get(), m.line_ns), (1, 1, None));
    }

    #[test]
    fn an_error_of_either_side_ends_the_pair() {
        let e = pair(|| Ok(1.0), || bail!("baseline broke"), || Some(50.0)).unwrap_err();
        assert!(format!("{e}").contains("baseline broke"));
    }
}
