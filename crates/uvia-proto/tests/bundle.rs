//! Bundles: small sends queued together leave in one frame, at reliable
//! delivery, and arrive exactly once, in order and intact, under faults and
//! when the receiver posts fewer descriptors than a bundle holds.

mod sim;

use sim::{message, Faults, Sim};
use std::time::Duration;
use uvia_proto::{Config, Level, Outcome, RnrPolicy};

fn config(level: Level) -> Config {
    Config {
        level,
        rnr: RnrPolicy::Retry {
            delay: Duration::from_micros(200),
            limit: 100_000,
        },
        idle_timeout: Duration::from_secs(2),
        ..Config::default()
    }
}

/// Sizes from 0 to 300 bytes: most go into bundles, some (past 256) alone,
/// which ends a bundle in the middle of a burst.
fn size(i: u32) -> usize {
    (i as usize * 37) % 301
}

/// Posts `count` sends at once from side 0 (and as many receives on side
/// 1). Returns the sender's frame count and the messages received (each
/// checked byte for byte).
fn burst(seed: u64, level: Level, faults: Faults, count: u32) -> (u64, Vec<u32>) {
    let mut s = Sim::new(seed, config(level), faults);
    assert!(s.connect(Duration::from_secs(3)), "connects (seed {seed})");
    let frames_before = s.sides[0].conn().stats().frames_sent;
    for i in 0..count {
        s.sides[1].recv(512);
        s.sides[0].send(message(i, size(i)), Some(i));
    }
    let mut received = vec![];
    let done = s.run_until(Duration::from_secs(60), |s| {
        for (data, imm, outcome) in s.sides[1].take_recvs() {
            assert_eq!(outcome, Outcome::Ok);
            let i = imm.expect("immediate data");
            assert_eq!(data, message(i, size(i)), "message {i} intact");
            received.push(i);
        }
        received.len() as u32 == count && s.sides[0].sends_done().len() as u32 == count
    });
    assert!(done, "every message arrives and completes (seed {seed})");
    assert!(!s.sides[0].failed() && !s.sides[1].failed(), "no failure");
    let sends = s.sides[0].sends_done();
    assert_eq!(
        sends,
        (0..count).map(|m| (m, Outcome::Ok)).collect::<Vec<_>>(),
        "sends complete in order"
    );
    let frames = s.sides[0].conn().stats().frames_sent - frames_before;
    (frames, received)
}

#[test]
fn a_burst_of_small_sends_takes_few_frames() {
    let (frames, received) = burst(1, Level::ReliableDelivery, Faults::default(), 500);
    assert_eq!(received, (0..500).collect::<Vec<_>>());
    // Some 14% of the sizes are too long to share a frame; the rest share
    // them with up to a frame's worth of others.
    assert!(frames < 150, "{frames} frames for 500 sends");
}

#[test]
fn bundles_arrive_exactly_once_in_order_under_faults() {
    for (k, loss) in [0.01, 0.05, 0.20].into_iter().enumerate() {
        let f = Faults {
            loss,
            dup: 0.02,
            reorder: 0.05,
            reorder_by: Duration::from_micros(200),
            corrupt: 0.01,
            delay: Duration::from_micros(20),
        };
        let (_, received) = burst(7 + k as u64, Level::ReliableDelivery, f, 400);
        assert_eq!(
            received,
            (0..400).collect::<Vec<_>>(),
            "exactly once, in order (loss {loss})"
        );
    }
}

#[test]
fn other_levels_send_one_message_a_frame() {
    // At reliable reception a send completes on the peer's word about that
    // message; unreliable delivery loses messages one by one.
    let (frames, received) = burst(3, Level::ReliableReception, Faults::default(), 100);
    assert_eq!(received, (0..100).collect::<Vec<_>>());
    assert!(frames >= 100, "{frames} frames for 100 sends");
}

/// A receiver that keeps one descriptor posted, and posts the next when a
/// message fills it, still takes every message of a burst of bundles: each
/// try of a bundle places what has a descriptor.
#[test]
fn a_receiver_with_one_descriptor_posted_takes_every_bundled_message() {
    let mut s = Sim::new(5, config(Level::ReliableDelivery), Faults::default());
    assert!(s.connect(Duration::from_secs(1)));
    let count = 40u32;
    for i in 0..count {
        s.sides[0].send(message(i, 16), Some(i));
    }
    s.sides[1].recv(64);
    let mut received = vec![];
    let done = s.run_until(Duration::from_secs(20), |s| {
        for (data, imm, outcome) in s.sides[1].take_recvs() {
            assert_eq!(outcome, Outcome::Ok);
            let i = imm.expect("immediate data");
            assert_eq!(data, message(i, 16));
            received.push(i);
            if received.len() < count as usize {
                s.sides[1].recv(64);
            }
        }
        received.len() as u32 == count && s.sides[0].sends_done().len() as u32 == count
    });
    assert!(done, "{} of {count} arrived", received.len());
    assert_eq!(received, (0..count).collect::<Vec<_>>());
    assert!(!s.sides[0].failed() && !s.sides[1].failed());
    assert!(
        s.sides[1].conn().stats().rnr_naks > 0,
        "bundles waited for descriptors"
    );
}
