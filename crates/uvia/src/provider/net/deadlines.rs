//! When a network Nic's VIs next need their timers run, so that a sweep
//! ([`NetNic::sweep`](super::NetNic::sweep)) looks only at the VIs that are
//! due, not at every VI.
//!
//! Every VI notes its engine's next deadline as its output ends (or, after
//! a poll that took frames in and has nothing to send, is marked due at
//! once, [`Deadlines::note_due`], and notes the exact one later). Deadlines
//! within [`SOON`] (an acknowledgement owed, a retransmission) go on a short
//! list that each sweep takes whole; later ones (keep-alives, the idle
//! timeout) go into a queue ordered by deadline, rounded up to moments
//! that deadlines of one size due close together share ([`slot`]), of which
//! a sweep takes only the front. One bound, `next_due`, says when anything is due at all: a
//! sweep before it costs a load, and a sleeping waiter sleeps until it.
//!
//! A queue entry may be stale: its VI's deadline moved later (a keep-alive
//! moves with every frame heard), or the VI noted an earlier one since. A
//! sweep that takes a stale entry looks at the VI once for nothing, and the
//! VI notes its deadline anew; a deadline that moved later is queued again
//! only once its queued one has come, so a busy VI queues about one entry a
//! keep-alive interval. Written by hand: the standard binary heap orders the
//! entries, and what is particular here is only this rule.

use crate::lock::SpinLock;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Least time between two sweeps of a Nic's VIs for due timers: a VI nobody
/// polls acknowledges within about this.
pub(super) const SWEEP_EVERY: Duration = Duration::from_millis(1);
/// Longest time between two sweeps even when no VI has said its timers are
/// due sooner.
const SWEEP_AT_LEAST: Duration = Duration::from_millis(100);
/// Longest time between two walks of every VI: bounds the delay of a
/// deadline some path armed without noting it, at the cost of one look at
/// each VI.
const WALK_AT_LEAST: Duration = Duration::from_secs(1);
/// A deadline this close is "soon": its VI goes on the short list.
const SOON: Duration = Duration::from_millis(20);

/// Where a VI's next deadline is noted ([`Deadlines::note`]); kept by the VI.
#[derive(Debug, Default)]
pub(super) struct Noted {
    /// On the short list; cleared by the sweep that takes it off.
    pub(super) soon: bool,
    /// The deadline of its latest entry in the queue of later ones
    /// (nanoseconds after the epoch; 0: none).
    later: u64,
}

/// What a sweep is to look at.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Due {
    /// Every VI.
    All,
    /// These connections (one may be listed twice).
    These(Vec<u32>),
}

/// The book of a Nic's VIs' next deadlines.
pub(super) struct Deadlines {
    epoch: Instant,
    /// When a sweep may next look.
    sweep_at: SpinLock<Instant>,
    /// Nothing is due before this many nanoseconds after `epoch`. Lowered
    /// by every note, set again by each sweep from what it leaves.
    next_due: AtomicU64,
    /// When the next walk of every VI is due (nanoseconds after `epoch`).
    next_walk: AtomicU64,
    /// Connections that noted a deadline within [`SOON`].
    soon: SpinLock<Vec<u32>>,
    /// The later deadlines, earliest first: (nanoseconds after `epoch`,
    /// connection).
    later: SpinLock<BinaryHeap<Reverse<(u64, u32)>>>,
    /// Sweeps made ([`take_due`](Self::take_due) calls that found one due).
    sweeps: AtomicU64,
}

impl Deadlines {
    pub(super) fn new(now: Instant) -> Deadlines {
        Deadlines {
            epoch: now,
            sweep_at: SpinLock::new(now),
            next_due: AtomicU64::new(0),
            next_walk: AtomicU64::new(0),
            soon: SpinLock::new(Vec::new()),
            later: SpinLock::new(BinaryHeap::new()),
            sweeps: AtomicU64::new(0),
        }
    }

    /// How many sweeps were made, by anyone.
    pub(super) fn sweeps(&self) -> u64 {
        self.sweeps.load(Ordering::Relaxed)
    }

    /// Nanoseconds from the epoch to `t` (0 before it), in 64 bits (585
    /// years), without the 128-bit arithmetic of `Duration::as_nanos`.
    fn nanos(&self, t: Instant) -> u64 {
        let d = t.saturating_duration_since(self.epoch);
        d.as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(d.subsec_nanos()))
    }

    /// Connection `id`'s engine has its next deadline at `at` (seen at
    /// `now`): a sweep takes it then, from the short list if it is soon
    /// (within a sixteenth of the time left after it), else from the queue
    /// at its [`slot`]. A few comparisons and a load when nothing changes.
    pub(super) fn note(&self, at: Option<Instant>, now: Instant, id: u32, noted: &mut Noted) {
        let Some(at) = at else {
            return;
        };
        // On the path of every message: a clock subtraction or two, the
        // rest in integers.
        let at = self.nanos(at);
        // Listed already, with a sweep due by then: that sweep looks at the
        // VI, which notes its deadline anew (a note that would queue a
        // later deadline waits for it). Nothing to change, and no second
        // subtraction.
        if noted.soon && self.next_due.load(Ordering::Relaxed) <= at {
            return;
        }
        let now = self.nanos(now);
        let left = at.saturating_sub(now);
        if left <= SOON.as_nanos() as u64 {
            if !noted.soon {
                self.soon.lock().push(id);
                noted.soon = true;
            }
            let ns = at + left / 16;
            if ns < self.next_due.load(Ordering::Relaxed) {
                self.next_due.fetch_min(ns, Ordering::AcqRel);
            }
            return;
        }
        let ns = slot(at, left);
        if ns < noted.later || noted.later <= now {
            // Earlier than the one queued, or that one has come (and been
            // taken, or is being): queued, and the bound lowered under the
            // queue's lock (see `take_due`).
            let mut later = self.later.lock();
            later.push(Reverse((ns, id)));
            noted.later = ns;
            self.next_due.fetch_min(ns, Ordering::AcqRel);
            return;
        }
        if ns < self.next_due.load(Ordering::Relaxed) {
            self.next_due.fetch_min(ns, Ordering::AcqRel);
        }
    }

    /// Connection `id` has a deadline it has not worked out yet (frames
    /// came in, and it notes the exact one at its next output): the next
    /// sweep looks at it, as if it were due now. No clock read, where
    /// [`note`](Self::note) makes two subtractions and the engine's
    /// earliest timer is looked up first; a VI polled by its program notes
    /// the exact deadline on its next send or timer round, and one left
    /// alone is served by that sweep.
    pub(super) fn note_due(&self, id: u32, noted: &mut Noted) {
        if !noted.soon {
            self.soon.lock().push(id);
            noted.soon = true;
        }
        // Due since the book began: any sweep takes it.
        if self.next_due.load(Ordering::Relaxed) > 0 {
            self.next_due.fetch_min(0, Ordering::AcqRel);
        }
    }

    /// What a sweep at `now` is to look at, or `None` when nothing is due
    /// yet or the last sweep was less than [`SWEEP_EVERY`] ago. `me` (the
    /// caller's connection, in hand, which notes its own deadline after
    /// its call; 0 for none) is never returned, and stays listed.
    pub(super) fn take_due(&self, now: Instant, me: u32) -> Option<Due> {
        let now_ns = self.nanos(now);
        if now_ns < self.next_due.load(Ordering::Acquire) {
            return None;
        }
        {
            let mut at = self.sweep_at.lock();
            if now < *at {
                return None;
            }
            *at = now + SWEEP_EVERY;
        }
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        let walk = now_ns >= self.next_walk.load(Ordering::Acquire);
        if walk {
            self.next_walk
                .store(now_ns + WALK_AT_LEAST.as_nanos() as u64, Ordering::Release);
        }
        // Set before the look: a deadline noted from here on lowers it
        // again, and every one noted before is taken below.
        self.next_due.store(
            (now_ns + SWEEP_AT_LEAST.as_nanos() as u64).min(self.next_walk.load(Ordering::Acquire)),
            Ordering::Release,
        );
        let mut due = std::mem::take(&mut *self.soon.lock());
        if me != 0 && due.contains(&me) {
            self.soon.lock().push(me);
        }
        {
            let mut later = self.later.lock();
            while let Some(&Reverse((ns, id))) = later.peek() {
                if ns > now_ns {
                    // Under the queue's lock, as a note lowers it: no
                    // deadline queued from here on is missed.
                    self.next_due.fetch_min(ns, Ordering::AcqRel);
                    break;
                }
                later.pop();
                due.push(id);
            }
        }
        if walk {
            return Some(Due::All);
        }
        due.retain(|&id| id != me);
        Some(Due::These(due))
    }

    /// The next sweep walks every VI (at once, not when the walk is next
    /// due): a connection that kept a peer's Nic alive let go, and another
    /// is to take over before the peer's idle timeout.
    pub(super) fn walk_soon(&self, now: Instant) {
        let ns = self.nanos(now);
        self.next_walk.fetch_min(ns, Ordering::AcqRel);
        self.next_due.fetch_min(ns, Ordering::AcqRel);
    }

    /// Connection `id` was due but in someone else's hands: it goes back on
    /// the short list, looked at again a sweep later in case they only
    /// passed by.
    pub(super) fn put_back(&self, id: u32, now: Instant) {
        self.soon.lock().push(id);
        self.next_due
            .fetch_min(self.nanos(now + SWEEP_EVERY), Ordering::AcqRel);
    }

    /// How long a sleeping waiter may sleep before a sweep has something to
    /// do: until the earliest deadline noted (every sweep puts one within
    /// [`SWEEP_AT_LEAST`]), at least [`SWEEP_EVERY`], which is also what it
    /// is when a deadline has passed and no sweep has taken it yet.
    pub(super) fn due_in(&self, now: Instant) -> Duration {
        let due = self.next_due.load(Ordering::Acquire);
        Duration::from_nanos(due.saturating_sub(self.nanos(now))).max(SWEEP_EVERY)
    }
}

/// When a later deadline `at`, `left` away (nanoseconds), is taken: rounded
/// up to a multiple of the largest power of two nanoseconds within a
/// sixteenth of `left`. Late by less than that, and deadlines of one size
/// due close together round to one moment, so that one sweep serves them
/// all: the keep-alives of VIs whose clients came at different moments,
/// each due a little after the last, go out together a few times a second
/// instead of each on a wake-up of its own.
fn slot(at: u64, left: u64) -> u64 {
    let sixteenth = (left / 16).clamp(1, 1 << 40);
    let step = 1u64 << (63 - sixteenth.leading_zeros());
    at.div_ceil(step).saturating_mul(step)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A book after its first sweep (which walks every VI), at `t0`.
    fn book(t0: Instant) -> Deadlines {
        let d = Deadlines::new(t0);
        assert_eq!(d.take_due(t0, 0), Some(Due::All), "the first sweep walks");
        d
    }

    fn these(d: Option<Due>) -> Vec<u32> {
        match d {
            Some(Due::These(mut v)) => {
                v.sort_unstable();
                v
            }
            other => panic!("expected a list of due VIs, got {other:?}"),
        }
    }

    /// Notes at `t0` the deadlines of VIs 1 to `n`, the first `first`
    /// after `t0`, each next one `gap` later; their noted places.
    fn spread(d: &Deadlines, t0: Instant, n: u32, first: Duration, gap: Duration) -> Vec<Noted> {
        (0..n)
            .map(|i| {
                let mut noted = Noted::default();
                d.note(Some(t0 + first + gap * i), t0, i + 1, &mut noted);
                noted
            })
            .collect()
    }

    #[test]
    fn a_sweep_takes_only_the_vis_whose_later_deadline_has_come() {
        let t0 = Instant::now();
        let d = book(t0);
        // 1,000 keep-alives spread over half a second, as a server's whose
        // clients came at different moments.
        let _noted = spread(&d, t0, 1000, ms(100), Duration::from_micros(500));
        // The first deadline with its slack is beyond the longest interval.
        assert_eq!(d.due_in(t0), SWEEP_AT_LEAST);
        assert_eq!(d.take_due(t0 + ms(50), 0), None, "nothing is due yet");
        // 120 ms after t0: the deadlines up to 120 ms less their slack.
        let got = these(d.take_due(t0 + ms(120), 0));
        assert!(
            !got.is_empty() && got.len() < 50,
            "{} VIs taken, want the few due",
            got.len()
        );
        assert_eq!(
            got,
            (1..=got.len() as u32).collect::<Vec<_>>(),
            "the earliest first"
        );
        // Each later sweep takes the next few (or none, between two
        // moments deadlines were rounded to), never all of them.
        let mut seen = got.len();
        for k in 1..=30u64 {
            let got = match d.take_due(t0 + ms(120 + 10 * k), 0) {
                None => Vec::new(),
                due => these(due),
            };
            assert!(got.len() < 50, "sweep {k} took {} VIs", got.len());
            seen += got.len();
        }
        assert!(
            seen > 500,
            "the sweeps took {seen} of the 1,000 over 300 ms"
        );
        // A walk of every VI comes back once a second.
        assert_eq!(d.take_due(t0 + ms(1000), 0), Some(Due::All));
    }

    #[test]
    fn a_deadline_that_moved_later_is_queued_again_only_after_its_entry_came() {
        let t0 = Instant::now();
        let d = book(t0);
        let mut n = Noted::default();
        d.note(Some(t0 + ms(500)), t0, 7, &mut n);
        let queued = n.later;
        // Frames heard: the keep-alive moves later each time, and no entry
        // is added while the queued one has yet to come.
        for k in 1..100 {
            d.note(Some(t0 + ms(500 + k)), t0 + ms(k), 7, &mut n);
        }
        assert_eq!(d.later.lock().len(), 1);
        assert_eq!(n.later, queued);
        // An earlier one is queued at once.
        d.note(Some(t0 + ms(300)), t0 + ms(100), 7, &mut n);
        assert_eq!(d.later.lock().len(), 2);
        // Its entry comes: the sweep takes the VI, which notes its
        // (moved) deadline anew.
        assert_eq!(these(d.take_due(t0 + ms(400), 0)), vec![7]);
        d.note(Some(t0 + ms(900)), t0 + ms(400), 7, &mut n);
        assert!(n.later > queued);
        // The stale first entry, taken later, costs one look.
        assert_eq!(these(d.take_due(t0 + ms(600), 0)), vec![7]);
    }

    #[test]
    fn later_deadlines_due_close_together_are_taken_together() {
        let t0 = Instant::now();
        let d = book(t0);
        // 100 keep-alives 200 us apart, noted half a second ahead: rounded
        // to a few moments, each taken by one sweep.
        let _noted = spread(&d, t0, 100, ms(500), Duration::from_micros(200));
        let mut sweeps = 0;
        let mut taken = 0;
        let mut t = t0 + ms(500);
        while taken < 100 {
            assert!(t < t0 + ms(600), "{taken} of 100 taken by 600 ms");
            if let Some(due) = d.take_due(t, 0) {
                let got = these(Some(due));
                if !got.is_empty() {
                    sweeps += 1;
                    taken += got.len();
                }
            }
            t += ms(1);
        }
        assert!(
            sweeps <= 3,
            "100 keep-alives due within 20 ms took {sweeps} sweeps"
        );
        // None late by more than a sixteenth of the time it was noted ahead.
        assert!(t <= t0 + ms(500) + ms(20) + ms(500) / 16 + ms(2));
    }

    #[test]
    fn soon_deadlines_are_taken_whole_and_the_callers_own_stays_listed() {
        let t0 = Instant::now();
        let d = book(t0);
        let (mut a, mut b) = (Noted::default(), Noted::default());
        d.note(Some(t0 + ms(2)), t0, 1, &mut a);
        d.note(Some(t0 + ms(5)), t0, 2, &mut b);
        // Listed once, however often noted.
        d.note(Some(t0 + ms(3)), t0, 1, &mut a);
        assert_eq!(d.take_due(t0 + ms(1), 0), None, "before the first is due");
        assert_eq!(these(d.take_due(t0 + ms(3), 2)), vec![1]);
        // VI 2 was the caller's: still listed; it notes its deadline after
        // its call, and the next sweep of someone else takes it then.
        d.note(Some(t0 + ms(5)), t0 + ms(3), 2, &mut b);
        assert_eq!(d.take_due(t0 + ms(4), 0), None, "before VI 2's deadline");
        assert_eq!(these(d.take_due(t0 + ms(6), 0)), vec![2]);
        // A VI in someone's hands goes back for the next sweep.
        d.put_back(1, t0 + ms(6));
        assert_eq!(d.due_in(t0 + ms(6)), SWEEP_EVERY);
        assert_eq!(these(d.take_due(t0 + ms(7), 0)), vec![1]);
    }

    #[test]
    fn a_listed_vi_lowers_the_bound_for_a_sooner_deadline_and_waits_for_its_sweep_for_a_later_one()
    {
        let t0 = Instant::now();
        let d = book(t0);
        let mut noted = Noted::default();
        d.note(Some(t0 + ms(10)), t0, 7, &mut noted);
        assert!(noted.soon);
        // Listed, and its deadline comes sooner: the bound comes down with
        // it, and a sweep before the first deadline takes the VI.
        d.note(Some(t0 + ms(2)), t0, 7, &mut noted);
        assert_eq!(these(d.take_due(t0 + ms(3), 0)), vec![7]);
        // (The sweep's look clears the mark.)
        noted.soon = false;
        // Listed, and its deadline moves much later: no queue entry while
        // it is listed; the sweep that is due anyway takes it, and its look
        // notes the later deadline then.
        d.note(Some(t0 + ms(5)), t0 + ms(3), 7, &mut noted);
        d.note(Some(t0 + ms(400)), t0 + ms(3), 7, &mut noted);
        assert_eq!(noted.later, 0, "nothing queued while listed");
        assert_eq!(these(d.take_due(t0 + ms(6), 0)), vec![7]);
        noted.soon = false;
        d.note(Some(t0 + ms(400)), t0 + ms(6), 7, &mut noted);
        assert!(noted.later >= 400_000_000, "queued once the sweep looked");
    }

    /// A VI that took frames in and has not worked out its next deadline
    /// is taken by the next sweep, however far its noted one was: its
    /// acknowledgement must not wait for a keep-alive.
    #[test]
    fn a_deadline_not_worked_out_is_taken_by_the_next_sweep() {
        let t0 = Instant::now();
        let d = book(t0);
        let mut n = Noted::default();
        // A keep-alive a second ahead, in the queue of later ones.
        d.note(Some(t0 + ms(1000)), t0, 3, &mut n);
        assert!(!n.soon);
        assert_eq!(d.take_due(t0 + ms(2), 0), None, "nothing due yet");
        d.note_due(3, &mut n);
        assert!(n.soon);
        assert_eq!(d.due_in(t0 + ms(3)), SWEEP_EVERY);
        assert_eq!(these(d.take_due(t0 + ms(4), 0)), vec![3]);
        // The sweep that looks at it takes it off the short list
        // (`NetNic::sweep`); noted again, it is listed once, however often.
        n.soon = false;
        d.note_due(3, &mut n);
        d.note_due(3, &mut n);
        assert_eq!(these(d.take_due(t0 + ms(6), 0)), vec![3]);
    }
}
