//! Message sizes at the edges of a frame, receive descriptors too short for
//! their message, and disconnection, in the simulated network.

mod sim;

use sim::{message, Faults, Sim};
use std::time::Duration;
use uvia_proto::wire::{NakCode, DATA_HEADER_LEN};
use uvia_proto::{Config, Event, FailReason, Level, Outcome, PostError, SendKind, SendOp};

const LEVELS: [Level; 3] = [
    Level::Unreliable,
    Level::ReliableDelivery,
    Level::ReliableReception,
];

fn config(level: Level) -> Config {
    Config {
        level,
        idle_timeout: Duration::from_secs(2),
        ..Config::default()
    }
}

fn faults(level: Level) -> Faults {
    if level.is_reliable() {
        Faults {
            loss: 0.05,
            dup: 0.02,
            reorder: 0.05,
            reorder_by: Duration::from_micros(100),
            corrupt: 0.01,
            delay: Duration::from_micros(20),
        }
    } else {
        // Nothing is sent twice on this level: every message must arrive
        // for the sizes to be checked.
        Faults::default()
    }
}

fn failure(events: &[Event]) -> Option<FailReason> {
    events.iter().find_map(|e| match e {
        Event::Failed(r) => Some(*r),
        _ => None,
    })
}

#[test]
fn sizes_at_the_edges_of_a_frame() {
    let frag = Config::default().max_frame as usize - DATA_HEADER_LEN;
    let sizes = [0, 1, frag - 1, frag, frag + 1, 2 * frag, 2 * frag + 1, 0];
    for level in LEVELS {
        for seed in 0..3 {
            let mut s = Sim::new(seed, config(level), faults(level));
            assert!(s.connect(Duration::from_secs(1)));
            for (i, &len) in sizes.iter().enumerate() {
                // Receive buffers exactly as long as their message.
                s.sides[1].recv(len as u32);
                s.sides[0].send(message(i as u32, len), Some(i as u32));
            }
            let mut got = vec![];
            let n = sizes.len();
            assert!(s.run_until(Duration::from_secs(2), |s| {
                got.extend(s.sides[1].take_recvs_full());
                got.len() == n && s.sides[0].sends_done().len() == n
            }));
            for (i, r) in got.iter().enumerate() {
                assert_eq!(r.outcome, Outcome::Ok, "{level:?} size {}", sizes[i]);
                assert_eq!(r.len as usize, sizes[i]);
                assert_eq!(r.imm, Some(i as u32));
                assert!(!r.remote_write);
                assert_eq!(r.data, message(i as u32, sizes[i]), "{level:?} #{i}");
            }
            assert_eq!(
                s.sides[0].sends_done(),
                (0..n as u32).map(|m| (m, Outcome::Ok)).collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn a_short_receive_buffer_fails_reliable_levels_and_not_unreliable() {
    let frag = Config::default().max_frame - DATA_HEADER_LEN as u32;
    // One byte short of a one-frame message, of a message one byte past a
    // frame, and of a long one.
    for len in [frag, frag + 1, 100_000] {
        for level in LEVELS {
            let mut s = Sim::new(7, config(level), Faults::default());
            assert!(s.connect(Duration::from_secs(1)));
            s.sides[1].recv(len - 1);
            s.sides[1].recv(len);
            s.sides[0].send(message(1, len as usize), None);
            s.sides[0].send(message(2, len as usize), None);
            if level.is_reliable() {
                assert!(s.run_until(Duration::from_secs(1), |s| {
                    s.sides[0].failed() && s.sides[1].failed()
                }));
                let sends = s.sides[0].sends_done();
                assert_eq!(sends[0], (0, Outcome::Remote(NakCode::Length)), "{level:?}");
                assert_eq!(sends.len(), 2);
                assert_ne!(sends[1].1, Outcome::Ok);
                assert_eq!(
                    failure(&s.sides[0].events),
                    Some(FailReason::Remote(NakCode::Length))
                );
                assert_eq!(
                    failure(&s.sides[1].events),
                    Some(FailReason::Local(NakCode::Length))
                );
                let r = s.sides[1].take_recvs_full();
                assert_eq!(r.len(), 2);
                assert_eq!(r[0].outcome, Outcome::Length, "{level:?} {len}");
                assert_ne!(r[1].outcome, Outcome::Ok);
            } else {
                // The receiver's descriptor completes with a length error,
                // the sender never knows, and the next message arrives.
                let mut got = vec![];
                assert!(s.run_until(Duration::from_secs(1), |s| {
                    got.extend(s.sides[1].take_recvs_full());
                    got.len() == 2
                }));
                assert_eq!(got[0].outcome, Outcome::Length, "{len}");
                assert_eq!(got[1].outcome, Outcome::Ok);
                assert_eq!(got[1].data, message(2, len as usize));
                assert_eq!(
                    s.sides[0].sends_done(),
                    vec![(0, Outcome::Ok), (1, Outcome::Ok)]
                );
                assert!(!s.sides[0].failed() && !s.sides[1].failed());
                assert!(s.sides[0].conn().is_connected() && s.sides[1].conn().is_connected());
            }
        }
    }
}

#[test]
fn disconnect_flushes_both_sides_and_the_peer_is_told() {
    for level in LEVELS {
        for seed in 0..3 {
            let mut s = Sim::new(seed, config(level), faults(level));
            assert!(s.connect(Duration::from_secs(1)));
            // One message goes through first.
            s.sides[1].recv(10_000);
            s.sides[0].send(message(0, 10_000), None);
            let mut first = vec![];
            assert!(s.run_until(Duration::from_secs(1), |s| {
                first.extend(s.sides[1].take_recvs());
                !first.is_empty() && !s.sides[0].sends_done().is_empty()
            }));
            assert_eq!(first[0].2, Outcome::Ok);
            // Then descriptors on both sides that will never complete
            // normally, and side 0 disconnects at once.
            for _ in 0..3 {
                s.sides[1].recv(10_000);
                s.sides[0].recv(10_000);
            }
            let now = s.now;
            s.sides[1].send(message(7, 50_000), None);
            for i in 1..4 {
                s.sides[0].send(message(i, 50_000), None);
            }
            s.sides[0].conn().close(now);
            s.run_until(Duration::from_millis(1), |_| false);
            // The closing side: everything flushed, at once.
            let sends = s.sides[0].sends_done();
            assert_eq!(
                sends,
                vec![
                    (0, Outcome::Ok),
                    (1, Outcome::Flushed),
                    (2, Outcome::Flushed),
                    (3, Outcome::Flushed)
                ],
                "{level:?}"
            );
            let r = s.sides[0].take_recvs();
            assert_eq!(r.len(), 3);
            assert!(r.iter().all(|r| r.2 == Outcome::Flushed));
            assert_eq!(
                s.sides[0].conn().post_send(SendOp {
                    kind: SendKind::Send,
                    len: 1,
                    imm: None
                }),
                Err(PostError::State)
            );
            assert_eq!(s.sides[0].conn().post_recv(1), Err(PostError::State));
            // The peer hears of it, and its descriptors complete too.
            assert!(
                s.run_until(Duration::from_secs(1), |s| {
                    s.sides[1].events.contains(&Event::Disconnected)
                }),
                "{level:?} seed {seed}"
            );
            let sends = s.sides[1].sends_done();
            assert_eq!(sends.len(), 1, "{level:?}");
            if level.is_reliable() {
                // (Unreliable sends complete once on the wire.)
                assert_ne!(sends[0].1, Outcome::Ok, "{level:?}");
            }
            let r = s.sides[1].take_recvs();
            assert_eq!(r.len(), 3, "{level:?}");
            assert!(r.iter().all(|r| r.2 != Outcome::Ok), "{level:?}: {r:?}");
            assert!(
                !s.sides[0].failed() && !s.sides[1].failed(),
                "a disconnect is no failure"
            );
            // Both end closed, and quiet.
            assert!(s.run_until(Duration::from_secs(1), |s| {
                s.sides.iter_mut().all(|x| x.conn().is_closed())
            }));
            s.run_until(Duration::from_secs(1), |_| false);
            assert_eq!(s.in_flight(), 0);
            assert!(s
                .sides
                .iter_mut()
                .all(|x| x.conn().poll_timeout().is_none()));
        }
    }
}

#[test]
fn sends_the_peer_had_before_it_disconnected_complete() {
    for level in [Level::ReliableDelivery, Level::ReliableReception] {
        for seed in 0..5 {
            let mut f = faults(level);
            // Acks from the receiver are lost more often than not.
            let mut s = Sim::new(seed, config(level), f);
            assert!(s.connect(Duration::from_secs(1)));
            f.loss = 0.7;
            s.faults[1] = f;
            for i in 0..4 {
                s.sides[1].recv(5000);
                s.sides[0].send(message(i, 5000), None);
            }
            let mut got = vec![];
            assert!(s.run_until(Duration::from_secs(1), |s| {
                got.extend(s.sides[1].take_recvs());
                got.len() == 4
            }));
            // The receiver leaves as soon as it has them; its disconnect
            // (repeated) carries its acknowledgement.
            let now = s.now;
            s.sides[1].conn().close(now);
            assert!(s.run_until(Duration::from_secs(1), |s| {
                s.sides[0].sends_done().len() == 4
            }));
            let sends = s.sides[0].sends_done();
            assert!(
                sends.iter().all(|x| x.1 == Outcome::Ok),
                "{level:?} seed {seed}: {sends:?}"
            );
        }
    }
}

#[test]
fn a_receiver_not_ready_for_long_is_waited_for() {
    use uvia_proto::RnrPolicy;
    // The receiver answers "not ready" for seconds: the sender's
    // retransmission timer must not count that as silence.
    let cfg = Config {
        rnr: RnrPolicy::Retry {
            delay: Duration::from_micros(200),
            limit: 1_000_000,
        },
        ..config(Level::ReliableDelivery)
    };
    let mut s = Sim::new(9, cfg, Faults::default());
    assert!(s.connect(Duration::from_secs(1)));
    s.sides[0].send(message(1, 5000), None);
    s.run_until(Duration::from_secs(6), |s| s.sides[0].failed());
    assert!(!s.sides[0].failed(), "{:?}", s.sides[0].events);
    s.sides[1].recv(5000);
    let mut got = vec![];
    assert!(s.run_until(Duration::from_secs(1), |s| {
        got.extend(s.sides[1].take_recvs());
        got.len() == 1 && s.sides[0].sends_done().len() == 1
    }));
    assert_eq!(got[0].0, message(1, 5000));
}

/// A send nobody answers completes soon after it arrives, at reliable
/// delivery (which completes a send on its ack): a one-way control message
/// whose completion a protocol above waits on (`ofi_rxm`'s rendezvous ends
/// with one) must not wait long for the acknowledgement to find a frame to
/// ride on. With a 50 us ack delay this took 50 us of the simulated link's
/// few; it must be within 10 us.
#[test]
fn an_unanswered_send_completes_within_10_us() {
    for len in [8usize, 200_000] {
        let mut s = Sim::new(7, config(Level::ReliableDelivery), Faults::default());
        assert!(s.connect(Duration::from_secs(1)));
        s.sides[1].recv(len as u32);
        let start = s.now;
        s.sides[0].send(message(0, len), None);
        assert!(s.run_until(Duration::from_secs(1), |s| !s.sides[0]
            .sends_done()
            .is_empty()));
        // The link's own time: the frames' bytes at its rate.
        let frag = Config::default().max_frame as usize - DATA_HEADER_LEN;
        let bytes = len + len.div_ceil(frag).max(1) * DATA_HEADER_LEN;
        let wire = Duration::from_secs_f64(bytes as f64 / s.rate);
        let took = s.now - start;
        assert!(
            took <= wire + Duration::from_micros(10),
            "{len} B: completed after {took:?} ({wire:?} on the link)"
        );
        assert_eq!(s.sides[1].take_recvs().len(), 1);
    }
}
