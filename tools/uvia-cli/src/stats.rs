//! Summary statistics over samples.

use serde::{Deserialize, Serialize};

/// min / median / 99th percentile / mean of a set of samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub min: f64,
    pub p50: f64,
    pub p99: f64,
    pub mean: f64,
}

/// The nearest-rank percentile `p` (0..=100) of sorted samples; 0 for none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let n = sorted.len();
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// The median of unsorted values (the lower middle for an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    percentile(&v, 50.0)
}

/// The median of values read on a clock that moves in steps of `step`
/// (the same unit): the values near the median are taken as spread evenly
/// across the step they were read in, and the median is placed within that
/// step by how many of them it needs (the median of grouped data). The
/// plain median of such values lands on a step, up to half a step from the
/// true one; a sum of several such medians gathers those errors, which
/// matter where the stages are a few steps long. With no step (0) it is
/// the plain median.
pub fn fine_median(values: &[f64], step: f64) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    let m = percentile(&v, 50.0);
    if step <= 0.0 || v.is_empty() {
        return m;
    }
    let (lo, hi) = (m - step / 2.0, m + step / 2.0);
    let below = v.partition_point(|&x| x < lo);
    let within = v.partition_point(|&x| x < hi) - below;
    if within == 0 {
        return m;
    }
    let half = v.len() as f64 / 2.0;
    lo + step * ((half - below as f64) / within as f64).clamp(0.0, 1.0)
}

impl Stats {
    /// Summarises the samples (all zero for none; non-finite samples are dropped).
    pub fn of(samples: &[f64]) -> Stats {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Stats::default();
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        Stats {
            min: v[0],
            p50: percentile(&v, 50.0),
            p99: percentile(&v, 99.0),
            mean,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_median_read_in_steps_is_placed_within_its_step() {
        // A true 4-unit stage read on a 10-unit clock: 60% of readings
        // show 0, 40% show 10. The plain median says 0, the mean 4.
        let v: Vec<f64> = (0..100).map(|i| if i < 60 { 0.0 } else { 10.0 }).collect();
        assert_eq!(median(&v), 0.0);
        let m = fine_median(&v, 10.0);
        assert!((m - 3.33).abs() < 0.01, "{m}");
        // Evenly spread values: the same as the plain median.
        let v: Vec<f64> = (1..=1001).map(f64::from).collect();
        assert!((fine_median(&v, 1.0) - 501.0).abs() <= 0.5);
        assert_eq!(fine_median(&v, 0.0), 501.0);
        assert_eq!(fine_median(&[], 10.0), 0.0);
    }

    #[test]
    fn percentiles_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        let s = Stats::of(&v);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.p50, 50.0);
        assert_eq!(s.p99, 99.0);
        assert_eq!(s.mean, 50.5);
    }

    #[test]
    fn unsorted_and_small() {
        let s = Stats::of(&[3.0, 1.0, 2.0]);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.p50, 2.0);
        assert_eq!(s.p99, 3.0);
        assert_eq!(Stats::of(&[7.0]).p99, 7.0);
        assert_eq!(Stats::of(&[]), Stats::default());
        assert_eq!(Stats::of(&[f64::NAN, 5.0]).p50, 5.0);
        assert_eq!(median(&[4.0, 1.0, 9.0]), 4.0);
    }
}
