//! Round-trip time estimate and retransmission timeout, after RFC 6298:
//! a smoothed mean and mean deviation of samples from frames sent once
//! (Karn's rule: a retransmitted frame's ack could answer either copy).

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
    /// The smallest sample: the path's round trip without queueing.
    min_rtt: Option<Duration>,
    /// The timeout from the samples, before back-off.
    base: Duration,
    /// Expirations in a row without progress: each doubles the timeout.
    backoff: u32,
    min: Duration,
    max: Duration,
}

impl RttEstimator {
    pub fn new(initial: Duration, min: Duration, max: Duration) -> RttEstimator {
        RttEstimator {
            srtt: None,
            rttvar: Duration::ZERO,
            min_rtt: None,
            base: initial.clamp(min, max),
            backoff: 0,
            min,
            max,
        }
    }

    /// Takes one measured round trip.
    pub fn sample(&mut self, r: Duration) {
        if self.min_rtt.is_none_or(|m| r < m) {
            self.min_rtt = Some(r);
        }
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let dev = s.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + dev) / 4;
                self.srtt = Some((s * 7 + r) / 8);
            }
        }
        let s = self.srtt.unwrap_or(r);
        self.base = (s + self.rttvar * 4).clamp(self.min, self.max);
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
        (self.base * (1u32 << self.backoff)).min(self.max)
    }

    /// How much later than a later-sent frame's ack a frame's own ack may
    /// come before it counts as lost (reordering allowance): a quarter of
    /// the smallest round trip, at least `floor` (RACK's choice: a queue
    /// that lengthens every round trip says nothing about reordering).
    pub fn reorder_window(&self, floor: Duration) -> Duration {
        self.min_rtt.map_or(floor, |m| (m / 4).max(floor))
    }

    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }

    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
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
}
