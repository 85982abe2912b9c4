//! Round-trip time estimate and retransmission timeout, after RFC 6298:
//! a smoothed mean and mean deviation of samples from frames sent once
//! (Karn's rule: a retransmitted frame's ack could answer either copy).

use std::time::Duration;

/// Kept in whole nanoseconds: a sample is taken on nearly every ack, and
/// `Duration`'s arithmetic (seconds and nanoseconds apart, each product and
/// quotient normalised) cost more than the rest of the estimate.
#[derive(Clone, Debug)]
pub struct RttEstimator {
    /// Smoothed round trip (0: no sample yet; a real sample of 0 ns is
    /// taken as 1).
    srtt: u64,
    rttvar: u64,
    /// The smallest sample: the path's round trip without queueing (0: none).
    min_rtt: u64,
    /// The timeout from the samples, before back-off.
    base: u64,
    /// Expirations in a row without progress: each doubles the timeout.
    backoff: u32,
    min: u64,
    max: u64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl RttEstimator {
    pub fn new(initial: Duration, min: Duration, max: Duration) -> RttEstimator {
        let (min, max) = (nanos(min), nanos(max).max(nanos(min)));
        RttEstimator {
            srtt: 0,
            rttvar: 0,
            min_rtt: 0,
            base: nanos(initial).clamp(min, max),
            backoff: 0,
            min,
            max,
        }
    }

    /// Takes one measured round trip.
    pub fn sample(&mut self, r: Duration) {
        // (Round trips beyond 2^60 ns, some 36 years, saturate: the sums
        // below then stay within 64 bits.)
        let r = nanos(r).clamp(1, 1 << 60);
        if self.min_rtt == 0 || r < self.min_rtt {
            self.min_rtt = r;
        }
        if self.srtt == 0 {
            self.srtt = r;
            self.rttvar = r / 2;
        } else {
            let dev = self.srtt.abs_diff(r);
            self.rttvar = (self.rttvar * 3 + dev) / 4;
            self.srtt = (self.srtt * 7 + r) / 8;
        }
        self.base = self
            .srtt
            .saturating_add(self.rttvar.saturating_mul(4))
            .clamp(self.min, self.max);
    }

    /// Doubles the timeout after it expired (up to the maximum).
    pub fn back_off(&mut self) {
        self.backoff = (self.backoff + 1).min(16);
    }

    /// The peer answered: the timeout goes back to what the samples say.
    pub fn reset_backoff(&mut self) {
        self.backoff = 0;
    }

    pub fn rto(&self) -> Duration {
        Duration::from_nanos(self.base.saturating_mul(1 << self.backoff).min(self.max))
    }

    /// How much later than a later-sent frame's ack a frame's own ack may
    /// come before it counts as lost (reordering allowance): a quarter of
    /// the smallest round trip, at least `floor` (RACK's choice: a queue
    /// that lengthens every round trip says nothing about reordering).
    pub fn reorder_window(&self, floor: Duration) -> Duration {
        self.min_rtt().map_or(floor, |m| (m / 4).max(floor))
    }

    pub fn min_rtt(&self) -> Option<Duration> {
        (self.min_rtt > 0).then(|| Duration::from_nanos(self.min_rtt))
    }

    pub fn srtt(&self) -> Option<Duration> {
        (self.srtt > 0).then(|| Duration::from_nanos(self.srtt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_follows_samples_and_backs_off_within_bounds() {
        let ms = Duration::from_millis;
        let mut r = RttEstimator::new(ms(20), ms(1), ms(100));
        assert_eq!(r.rto(), ms(20));
        r.sample(ms(4));
        // srtt 4, rttvar 2: 4 + 8.
        assert_eq!(r.rto(), ms(12));
        for _ in 0..50 {
            r.sample(Duration::from_micros(10));
        }
        assert_eq!(r.rto(), ms(1), "clamped to the minimum");
        assert_eq!(r.min_rtt(), Some(Duration::from_micros(10)));
        assert_eq!(r.reorder_window(Duration::ZERO), Duration::from_nanos(2500));
        for _ in 0..10 {
            r.back_off();
        }
        assert_eq!(r.rto(), ms(100), "clamped to the maximum");
    }

    /// Absurd samples and bounds saturate instead of overflowing.
    #[test]
    fn extreme_samples_saturate() {
        let mut r = RttEstimator::new(Duration::MAX, Duration::ZERO, Duration::MAX);
        for _ in 0..20 {
            r.sample(Duration::MAX);
            r.back_off();
        }
        assert!(r.rto() >= Duration::from_nanos(1 << 60));
        r.sample(Duration::ZERO);
        assert_eq!(r.min_rtt(), Some(Duration::from_nanos(1)));
    }
}
