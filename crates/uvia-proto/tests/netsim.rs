//! The engine between two simulated hosts: every reliability level under
//! loss, duplication, reordering, delay and corruption, with exactly-once
//! in-order delivery checked for the reliable levels and at-most-once
//! in-order delivery for the unreliable one.

mod sim;

use sim::{message, Faults, Sim};
use std::time::Duration;
use uvia_proto::{Config, Event, FailReason, Level, Outcome};

const SIZES: [usize; 7] = [1, 100, 1_400, 5_000, 65_536, 300_000, 1 << 20];

fn faults(loss: f64) -> Faults {
    Faults {
        loss,
        dup: 0.01,
        reorder: 0.02,
        reorder_by: Duration::from_micros(200),
        corrupt: 0.005,
        delay: Duration::from_micros(20),
    }
}

fn config(level: Level) -> Config {
    Config {
        level,
        // Short enough that 20% loss on both directions recovers quickly in
        // virtual time, long enough that a slow ack is not a silent peer.
        idle_timeout: Duration::from_secs(2),
        ..Config::default()
    }
}

struct Outcome_ {
    received: Vec<u32>,
    elapsed: Duration,
    bytes: u64,
}

/// Sends `count` messages of each size from side 0 to side 1 and returns
/// which arrived (by index), checking every one that did byte for byte.
fn transfer(seed: u64, level: Level, f: Faults, count: u32) -> Outcome_ {
    let mut s = Sim::new(seed, config(level), f);
    assert!(s.connect(Duration::from_secs(3)), "connects (seed {seed})");
    let t0 = s.now;
    let total = count * SIZES.len() as u32;
    for i in 0..total {
        s.sides[1].recv(1 << 20);
        let len = SIZES[i as usize % SIZES.len()];
        s.sides[0].send(message(i, len), Some(i));
    }
    let mut received = vec![];
    let mut bytes = 0u64;
    let done = s.run_until(Duration::from_secs(60), |s| {
        for (data, imm, outcome) in s.sides[1].take_recvs() {
            if outcome != Outcome::Ok {
                continue;
            }
            let i = imm.expect("immediate data");
            assert_eq!(
                data,
                message(i, SIZES[i as usize % SIZES.len()]),
                "message {i} intact"
            );
            received.push(i);
            bytes += data.len() as u64;
        }
        let sent = s.sides[0].sends_done().len() as u32 == total;
        let all_in = if level == Level::Unreliable {
            s.in_flight() == 0
        } else {
            received.len() as u32 == total
        };
        sent && all_in
    });
    assert!(done, "transfer finished (level {level:?}, seed {seed})");
    assert!(!s.sides[0].failed() && !s.sides[1].failed(), "no failure");
    for (k, (msn, outcome)) in s.sides[0].sends_done().into_iter().enumerate() {
        assert_eq!(msn, k as u32, "sends complete in order");
        assert_eq!(outcome, Outcome::Ok);
    }
    Outcome_ {
        received,
        elapsed: s.now - t0,
        bytes,
    }
}

#[test]
fn reliable_levels_deliver_exactly_once_in_order_under_faults() {
    println!(
        "{:<20} {:>6} {:>12} {:>14}",
        "level", "loss", "virtual ms", "goodput MB/s"
    );
    for level in [Level::ReliableDelivery, Level::ReliableReception] {
        for (k, loss) in [0.0, 0.01, 0.05, 0.20].into_iter().enumerate() {
            let r = transfer(11 + k as u64, level, faults(loss), 3);
            let want: Vec<u32> = (0..3 * SIZES.len() as u32).collect();
            assert_eq!(
                r.received, want,
                "exactly once, in order ({level:?}, loss {loss})"
            );
            println!(
                "{:<20} {:>5.0}% {:>12.2} {:>14.1}",
                format!("{level:?}"),
                loss * 100.0,
                r.elapsed.as_secs_f64() * 1e3,
                r.bytes as f64 / r.elapsed.as_secs_f64() / 1e6
            );
        }
    }
}

#[test]
fn unreliable_delivers_at_most_once_in_order_and_intact() {
    for (k, loss) in [0.0, 0.01, 0.05, 0.20].into_iter().enumerate() {
        let r = transfer(21 + k as u64, Level::Unreliable, faults(loss), 3);
        assert!(
            r.received.windows(2).all(|w| w[0] < w[1]),
            "in order, at most once (loss {loss}): {:?}",
            r.received
        );
        if loss == 0.0 {
            // Only the checksum's catches and the reordering lose anything.
            assert!(r.received.len() >= 3 * SIZES.len() / 2, "{:?}", r.received);
        }
    }
}

#[test]
fn a_silent_peer_ends_in_error_within_the_timeout() {
    for level in [
        Level::Unreliable,
        Level::ReliableDelivery,
        Level::ReliableReception,
    ] {
        let mut s = Sim::new(5, config(level), Faults::default());
        assert!(s.connect(Duration::from_secs(1)));
        // The peer goes silent: nothing it sends arrives any more.
        s.faults[1].loss = 1.0;
        let now = s.now;
        let t0 = now;
        s.sides[0].send(message(1, 10_000), None);
        s.sides[0].recv(100);
        let timeout = s.sides[0].cfg.idle_timeout;
        let ok = s.run_until(timeout * 2, |s| s.sides[0].failed());
        assert!(ok, "{level:?}: failed");
        assert!(
            s.now - t0 <= timeout + Duration::from_millis(1),
            "{level:?}: within the timeout"
        );
        let reason = s.sides[0].events.iter().find_map(|e| match e {
            Event::Failed(r) => Some(*r),
            _ => None,
        });
        assert!(
            matches!(
                reason,
                Some(FailReason::PeerSilent | FailReason::RetriesExhausted)
            ),
            "{reason:?}"
        );
        // Every descriptor completed.
        let sends = s.sides[0].sends_done();
        assert_eq!(sends.len(), 1);
        if level.is_reliable() {
            assert_eq!(sends[0].1, Outcome::Transport);
        }
        let recvs = s.sides[0].take_recvs();
        assert_eq!(recvs.len(), 1);
        assert_ne!(recvs[0].2, Outcome::Ok);
    }
}

/// An idle connection that another connection to the same Nic keeps alive
/// has its timers come due about every half idle timeout, where one that
/// keeps itself alive has them every keep-alive interval: a provider looks
/// at a thousand such VIs half as often or less.
#[test]
fn a_connection_another_keeps_alive_is_looked_at_less_often() {
    // The default timeouts (the suite's idle timeout is two keep-alives).
    let cfg = Config {
        level: Level::ReliableDelivery,
        ..Config::default()
    };
    let mut looks = [0; 2];
    for (k, elsewhere) in [None, Some(Duration::from_millis(100))]
        .into_iter()
        .enumerate()
    {
        let mut s = Sim::new(9, cfg.clone(), Faults::default());
        assert!(s.connect(Duration::from_secs(1)));
        s.elsewhere[0] = elsewhere;
        let before = s.timer_looks[0];
        let span = s.sides[0].cfg.idle_timeout * 4;
        assert!(!s.run_until(span, |s| s.sides[0].failed()), "stays up");
        looks[k] = s.timer_looks[0] - before;
    }
    let own = (cfg.idle_timeout * 4).as_secs_f64() / cfg.keepalive.as_secs_f64();
    assert!(
        looks[0] as f64 >= own * 0.9,
        "keeping itself alive: {} looks in four idle timeouts",
        looks[0]
    );
    assert!(
        looks[1] * 2 <= looks[0],
        "kept alive elsewhere: {} looks against {} on its own",
        looks[1],
        looks[0]
    );
}

#[test]
fn a_kept_connection_has_no_liveness_timers_answers_pings_and_fails_when_told() {
    let mut s = Sim::new(11, config(Level::ReliableDelivery), Faults::default());
    assert!(s.connect(Duration::from_secs(1)));
    // Side 1's Nic is kept alive by another connection: this one keeps
    // no timer while nothing is in flight. Side 0 keeps its own.
    s.sides[1].conn().set_kept(true);
    assert!(s.sides[1].conn().is_kept());
    // What the handshake left (its last acknowledgement) goes first.
    assert!(!s.run_until(Duration::from_millis(50), |_| false));
    assert_eq!(s.sides[1].conn().poll_timeout(), None, "no timer armed");
    let idle = s.sides[0].cfg.idle_timeout;
    let looks = s.timer_looks;
    let acks = s.sides[1].conn().stats().acks_sent;
    assert!(
        !s.run_until(idle * 4, |s| s.sides[0].failed() || s.sides[1].failed()),
        "both stay up for four idle timeouts"
    );
    assert_eq!(
        s.timer_looks[1], looks[1],
        "the kept side's timers never came due"
    );
    assert!(
        s.timer_looks[0] > looks[0],
        "the other side kept itself alive"
    );
    // Its only frames are the answers to side 0's pings.
    let answers = s.sides[1].conn().stats().acks_sent - acks;
    assert!(answers > 0, "it answered the pings");
    assert_eq!(s.sides[1].conn().poll_timeout(), None, "still none");
    // Given back its watch, it counts from the last frame heard.
    s.sides[1].conn().set_kept(false);
    let heard = s.sides[1].conn().last_heard();
    let next = s.sides[1].conn().poll_timeout().expect("armed again");
    assert!(
        next > heard && next <= heard + idle,
        "from the last frame heard"
    );
    s.sides[1].conn().set_kept(true);
    // Told that the Nic fell silent, it fails as its keeper did.
    s.sides[1].conn().peer_silent();
    assert!(s.run_until(Duration::from_millis(10), |s| s.sides[1].failed()));
    assert!(s.sides[1]
        .events
        .iter()
        .any(|e| matches!(e, Event::Failed(FailReason::PeerSilent))));
}

#[test]
fn a_connection_another_keeps_alive_sends_no_keep_alives_and_fails_with_the_nic() {
    let mut s = Sim::new(7, config(Level::ReliableDelivery), Faults::default());
    assert!(s.connect(Duration::from_secs(1)));
    // Nothing side 1 sends reaches side 0 any more: only what another
    // connection to the same Nic hears and asks keeps side 0's alive.
    s.faults[1].loss = 1.0;
    s.elsewhere[0] = Some(Duration::from_millis(100));
    let idle = s.sides[0].cfg.idle_timeout;
    let acks = s.sides[0].conn().stats().acks_sent;
    let kept = s.run_until(idle * 3, |s| s.sides[0].failed());
    assert!(
        !kept,
        "alive for three idle timeouts while the Nic is heard"
    );
    assert_eq!(
        s.sides[0].conn().stats().acks_sent,
        acks,
        "no keep-alive of its own"
    );
    // The other connection hears nothing more: this one fails an idle
    // timeout after the last frame heard, having pinged the peer itself.
    s.elsewhere[0] = None;
    let last = s.now;
    assert!(s.run_until(idle * 2, |s| s.sides[0].failed()));
    assert!(s.now <= last + idle, "within the timeout");
    assert!(
        s.sides[0].conn().stats().acks_sent > acks,
        "pinged on its own"
    );
}
