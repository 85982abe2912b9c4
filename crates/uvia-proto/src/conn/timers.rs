//! A connection's deadlines in one table: each [`Timer`] is armed or not,
//! and the connection's next wake-up is the earliest armed one. Handlers
//! stop or re-arm their own timer, so walking the table in [`Timer::ALL`]
//! order at a wake-up runs each expired one once.

use std::time::Instant;

/// The deadlines a [`Conn`](crate::Conn) keeps, in the order its
/// `handle_timeout` looks at them. Each state keeps its own: a client
/// connecting the first two, a side closing `Close`, a connected side the
/// rest; a closed or failed one none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timer {
    /// A client that has had no answer gives up.
    ConnectTimeout = 0,
    /// The request (client) or the accept (server) goes out again: armed
    /// when one goes, and for a client from the start, so its first
    /// request goes at once.
    Handshake = 1,
    /// The disconnect goes out again, or after the last try the side
    /// stops waiting for its answer.
    Close = 2,
    /// Nothing has come from the peer for the idle timeout: it is gone.
    /// Before the others, so a silent peer fails rather than retries.
    Idle = 3,
    /// A keep-alive is due: nothing has come from the peer, nor been asked
    /// of it, for the keep-alive interval. Sent by `poll_transmit`.
    KeepAlive = 4,
    /// A delayed ack is due.
    Ack = 5,
    /// The pause a receiver-not-ready nak asked for is over.
    Rnr = 6,
    /// A frame sent before one already acked counts as lost if its own
    /// ack has not come (time-based loss detection, as RACK does).
    Loss = 7,
    /// A tail-loss probe goes out: the last frame again, so that a loss at
    /// the end of a burst is found by the ack it draws rather than by the
    /// retransmission timeout.
    Probe = 8,
    /// The retransmission timeout.
    Rto = 9,
}

impl Timer {
    pub(crate) const ALL: [Timer; 10] = [
        Timer::ConnectTimeout,
        Timer::Handshake,
        Timer::Close,
        Timer::Idle,
        Timer::KeepAlive,
        Timer::Ack,
        Timer::Rnr,
        Timer::Loss,
        Timer::Probe,
        Timer::Rto,
    ];
}

/// When each [`Timer`] fires, if armed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TimerTable {
    at: [Option<Instant>; Timer::ALL.len()],
}

impl TimerTable {
    pub(crate) fn set(&mut self, timer: Timer, at: Instant) {
        self.at[timer as usize] = Some(at);
    }

    pub(crate) fn get(&self, timer: Timer) -> Option<Instant> {
        self.at[timer as usize]
    }

    pub(crate) fn stop(&mut self, timer: Timer) {
        self.at[timer as usize] = None;
    }

    pub(crate) fn is_set(&self, timer: Timer) -> bool {
        self.at[timer as usize].is_some()
    }

    /// True if `timer` is armed for `now` or earlier.
    pub(crate) fn expired(&self, timer: Timer, now: Instant) -> bool {
        self.get(timer).is_some_and(|at| now >= at)
    }

    /// True unless `timer` is armed for later than `now`: a frame that
    /// repeats goes out when its timer is not waiting.
    pub(crate) fn due(&self, timer: Timer, now: Instant) -> bool {
        self.get(timer).is_none_or(|at| now >= at)
    }

    /// Stops every timer.
    pub(crate) fn clear(&mut self) {
        *self = TimerTable::default();
    }

    /// The earliest armed deadline.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.at.iter().flatten().min().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn next_is_the_earliest_armed() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut t = TimerTable::default();
        assert_eq!(t.next(), None);
        t.set(Timer::Rto, t0 + ms(30));
        t.set(Timer::Ack, t0 + ms(10));
        assert_eq!(t.next(), Some(t0 + ms(10)));
        assert!(t.expired(Timer::Ack, t0 + ms(10)));
        assert!(!t.expired(Timer::Rto, t0 + ms(10)));
        assert!(!t.expired(Timer::Probe, t0 + ms(99)), "not armed");
        t.stop(Timer::Ack);
        assert!(!t.is_set(Timer::Ack));
        assert_eq!(t.next(), Some(t0 + ms(30)));
        assert!(t.due(Timer::Handshake, t0), "not armed");
        assert!(!t.due(Timer::Rto, t0 + ms(29)));
        assert!(t.due(Timer::Rto, t0 + ms(30)));
        t.stop(Timer::Rto);
        assert_eq!(t.next(), None);
        t.set(Timer::Idle, t0);
        t.clear();
        assert_eq!(t.next(), None);
    }
}
