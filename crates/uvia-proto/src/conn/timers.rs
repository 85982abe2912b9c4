//! A connection's deadlines in one table, and what it does when one
//! expires. Each [`Timer`] is armed or not, and the connection's next
//! wake-up is the earliest armed one. Handlers stop or re-arm their own
//! timer, so walking the table in [`Timer::ALL`] order at a wake-up runs
//! each expired one once.

use super::{Conn, Event, FailReason, Sent, State, CLOSE_TRIES};
use std::time::{Duration, Instant};

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

impl Conn {
    /// When [`handle_timeout`](Self::handle_timeout) must next be called.
    /// Ask again after every other call.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Lets time pass: retransmission and handshake timers, delayed acks,
    /// keep-alives and the idle timeout.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.settle(now);
        // Each timer is looked at in its turn, after the ones before it ran:
        // a handler may stop or move a later one (a timeout stops the probe,
        // a failure all of them).
        for timer in Timer::ALL {
            if !self.timers.expired(timer, now) {
                continue;
            }
            match timer {
                Timer::ConnectTimeout => {
                    self.enter(State::Closed);
                    self.events.push_back(Event::ConnectTimedOut);
                }
                // The frame goes again from `poll_transmit`, which re-arms
                // the timer; so does the keep-alive.
                Timer::Handshake | Timer::KeepAlive => {}
                Timer::Close => {
                    // After the last try, its answer has had its time.
                    if let State::Closing {
                        tries: CLOSE_TRIES..,
                    } = self.state
                    {
                        self.enter(State::Closed);
                    }
                }
                Timer::Idle => self.fail(FailReason::PeerSilent, None),
                Timer::Ack => {
                    self.ack_now = true;
                    self.ack_for_window = false;
                    self.timers.stop(Timer::Ack);
                }
                Timer::Rnr => self.timers.stop(Timer::Rnr),
                Timer::Loss => self.detect_by_time(now, None),
                Timer::Probe => self.on_probe(),
                Timer::Rto => self.on_rto(now),
            }
        }
    }

    /// When a frame last came from the peer (or, told by
    /// [`heard_elsewhere`](Self::heard_elsewhere), from its Nic).
    pub fn last_heard(&self) -> Instant {
        self.last_rx
    }

    /// True if a keep-alive is due at `now`: nothing has come from the
    /// peer, nor been asked of it, for the keep-alive interval.
    pub fn keepalive_due(&self, now: Instant) -> bool {
        self.timers.expired(Timer::KeepAlive, now)
    }

    /// Another connection between the same two Nics (the peer's
    /// [`peer_nic`](Self::peer_nic) is the same) last heard from the peer's
    /// Nic at `heard`, and last pinged it at `pinged`. A connection's end
    /// lives as long as its Nic (a closing side says so with its
    /// disconnect), so what proves the Nic alive proves the peer: this
    /// connection counts the other's frames and keep-alives as its own,
    /// and of many connections to one Nic only one keeps it alive. If the
    /// Nic falls silent, all of them fail together, at the idle timeout
    /// after the last frame any of them heard.
    pub fn heard_elsewhere(&mut self, heard: Instant, pinged: Option<Instant>) {
        if heard <= self.last_rx && pinged <= self.last_ping {
            return;
        }
        self.last_rx = self.last_rx.max(heard);
        if pinged > self.last_ping {
            self.last_ping = pinged;
            self.kept_elsewhere = true;
        }
        self.arm_liveness();
    }

    /// Another connection between the same two Nics keeps the peer's Nic
    /// alive and fails when it falls silent (`true`), or this one does
    /// (`false`, the default). A kept connection arms neither its
    /// keep-alive nor its idle timeout, so of a thousand idle connections
    /// to one Nic one has timers and the others none; it learns that the
    /// Nic fell silent from [`peer_silent`](Self::peer_silent). Given back
    /// its watch, it counts both from the last frame heard, here or (told
    /// by [`heard_elsewhere`](Self::heard_elsewhere)) elsewhere.
    pub fn set_kept(&mut self, kept: bool) {
        if self.kept == kept {
            return;
        }
        self.kept = kept;
        if kept {
            self.timers.stop(Timer::Idle);
            self.timers.stop(Timer::KeepAlive);
        } else {
            self.arm_liveness();
        }
    }

    /// True if another connection keeps the peer's Nic alive
    /// ([`set_kept`](Self::set_kept)).
    pub fn is_kept(&self) -> bool {
        self.kept
    }

    /// The connection that keeps the peer's Nic found it silent for the
    /// idle timeout: this one fails as that one did.
    pub fn peer_silent(&mut self) {
        if self.is_connected() {
            self.fail(FailReason::PeerSilent, None);
        }
    }

    /// A frame came from the peer.
    pub(super) fn heard(&mut self, now: Instant) {
        self.last_rx = now;
        self.arm_liveness();
    }

    /// Arms the idle timeout and the keep-alive from the last frame heard
    /// and the last keep-alive sent; only a connected side keeps them.
    ///
    /// A connection that another connection to the same Nic keeps alive
    /// waits half an idle timeout, not a keep-alive interval: it need only
    /// take over before the peer's idle timeout if the other goes quiet.
    /// Of a thousand connections to one Nic, one then pings every interval
    /// and the others' timers come due every second interval or so, not
    /// every one (each a look at the VI while nothing happens).
    pub(super) fn arm_liveness(&mut self) {
        if !self.is_connected() || self.kept {
            return;
        }
        self.timers
            .set(Timer::Idle, self.last_rx + self.cfg.idle_timeout);
        let base = self.last_rx.max(self.last_ping.unwrap_or(self.last_rx));
        let every = if self.kept_elsewhere {
            self.cfg.keepalive.max(self.cfg.idle_timeout / 2)
        } else {
            self.cfg.keepalive
        };
        self.timers.set(Timer::KeepAlive, base + every);
    }

    /// The retransmission timer restarts on every ack that brings progress
    /// (RFC 6298, 5.3): it measures silence, not the age of the oldest
    /// frame, which a long queue of our own frames can make older than a
    /// timeout without anything being lost. The tail-loss probe follows it.
    pub(super) fn arm_timers(&mut self, now: Instant, progress: bool) {
        if !self.outstanding() {
            self.timers.stop(Timer::Rto);
            self.timers.stop(Timer::Probe);
            return;
        }
        if progress || !self.timers.is_set(Timer::Rto) {
            self.timers.set(Timer::Rto, now + self.rtt.rto());
        }
        if progress {
            self.arm_probe(now);
        }
    }

    /// Two smoothed round trips (and the peer's ack delay) after the last
    /// transmission or progress, a probe goes out, unless the timeout
    /// comes first or a probe already went for this tail.
    pub(super) fn arm_probe(&mut self, now: Instant) {
        self.timers.stop(Timer::Probe);
        if self.probes > 0 || self.lost > 0 {
            return;
        }
        let Some(srtt) = self.rtt.srtt() else {
            return;
        };
        let at = now + srtt * 2 + self.cfg.ack_delay;
        if self.timers.get(Timer::Rto).is_none_or(|r| at < r) {
            self.timers.set(Timer::Probe, at);
        }
    }

    /// The probe is due: the newest frame still unacked goes again, with a
    /// request for an immediate ack.
    fn on_probe(&mut self) {
        self.timers.stop(Timer::Probe);
        if self.lost > 0 {
            return;
        }
        if let Some(s) = self.inflight.iter_mut().rev().find(|s| !s.acked) {
            s.lost = true;
            s.probe = true;
            self.lost += 1;
            self.probes += 1;
            self.stats.probes += 1;
        }
    }

    /// Marks lost every frame sent before the newest acked one whose ack
    /// is now overdue: later than that frame's own round trip plus the
    /// reordering allowance (RACK, RFC 8985). Arms a timer for those not
    /// yet overdue. `acked`: the newest frame an ack just covered, and its
    /// round trip.
    pub(super) fn detect_by_time(&mut self, now: Instant, acked: Option<(&Sent, Duration)>) {
        if let Some((s, rtt)) = acked {
            // The ack of a frame sent more than once may answer an earlier
            // copy that was only late (Karn's ambiguity): taken as "sent
            // last", it would make every frame sent in between look lost.
            // Such acks are left out; frames sent after the retransmission
            // find it lost if it is. A probe is the exception: it went out
            // two round trips after the copy before it, whose ack would
            // have come by then.
            let ambiguous = s.transmissions > 1 && !s.probe;
            if !ambiguous && self.rack.is_none_or(|(o, _)| o < s.order) {
                self.rack = Some((s.order, rtt));
            }
        }
        let Some((rack, rack_rtt)) = self.rack else {
            return;
        };
        self.timers.stop(Timer::Loss);
        if self
            .inflight
            .iter()
            .all(|s| s.acked || s.lost || s.order >= rack)
        {
            // Nothing sent before the newest frame acked waits (a
            // ping-pong's every ack).
            return;
        }
        let wait = rack_rtt + self.rtt.reorder_window(Duration::from_micros(20));
        for s in self.inflight.iter_mut() {
            if s.acked || s.lost || s.order >= rack {
                continue;
            }
            let due = s.sent_at + wait;
            if now >= due {
                s.lost = true;
                s.probe = false;
                self.lost += 1;
                self.clean_bytes = 0;
            } else if self.timers.get(Timer::Loss).is_none_or(|d| due < d) {
                self.timers.set(Timer::Loss, due);
            }
        }
    }

    fn on_rto(&mut self, now: Instant) {
        self.stats.rto_expired += 1;
        self.timeouts_in_a_row += 1;
        if self.timeouts_in_a_row > self.cfg.retry_limit {
            self.fail(FailReason::RetriesExhausted, None);
            return;
        }
        self.rtt.back_off();
        // A whole timeout without progress: the oldest frame goes again,
        // and every other one whose ack is overdue by a round trip and the
        // reordering allowance (RFC 8985, 6.3); frames sent since may still
        // be on their way.
        let rtt = self
            .rack
            .map_or(self.rtt.srtt().unwrap_or(self.cfg.initial_rto), |r| r.1);
        let wait = rtt + self.rtt.reorder_window(Duration::from_micros(20));
        let mut first = true;
        for s in self.inflight.iter_mut() {
            if s.acked {
                continue;
            }
            if !s.lost && (first || now.saturating_duration_since(s.sent_at) >= wait) {
                s.lost = true;
                s.probe = false;
                self.lost += 1;
                self.clean_bytes = 0;
            }
            first = false;
        }
        self.timers.stop(Timer::Probe);
        self.timers.set(Timer::Rto, now + self.rtt.rto());
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
