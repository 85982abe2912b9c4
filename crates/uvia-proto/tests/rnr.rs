//! Flow control: a reliable message that finds no posted receive descriptor
//! breaks the connection by default (VIA's rule), and with the retry option
//! is delivered once the receiver posts one. Also length and protection
//! errors on the target, in the simulated network.

mod sim;

use sim::{message, Faults, Sim, REGION_ADDR, REGION_KEY};
use std::time::Duration;
use uvia_proto::wire::NakCode;
use uvia_proto::{Config, Event, FailReason, Level, Outcome, RnrPolicy, SendKind, SendOp};

fn config(rnr: RnrPolicy) -> Config {
    Config {
        level: Level::ReliableDelivery,
        rnr,
        idle_timeout: Duration::from_secs(2),
        ..Config::default()
    }
}

fn failed_with(events: &[Event]) -> Option<FailReason> {
    events.iter().find_map(|e| match e {
        Event::Failed(r) => Some(*r),
        _ => None,
    })
}

#[test]
fn no_descriptor_breaks_both_sides_by_default() {
    let mut s = Sim::new(1, config(RnrPolicy::Fail), Faults::default());
    assert!(s.connect(Duration::from_secs(1)));
    s.sides[0].send(message(1, 100), None);
    assert!(s.run_until(Duration::from_secs(1), |s| s.sides[0].failed()
        && s.sides[1].failed()));
    assert_eq!(
        failed_with(&s.sides[0].events),
        Some(FailReason::Remote(NakCode::NoDescriptor))
    );
    assert_eq!(
        s.sides[0].sends_done(),
        vec![(0, Outcome::Remote(NakCode::NoDescriptor))]
    );
}

#[test]
fn with_retry_the_message_waits_for_a_descriptor() {
    let rnr = RnrPolicy::Retry {
        delay: Duration::from_micros(200),
        limit: 10_000,
    };
    let mut s = Sim::new(2, config(rnr), Faults::default());
    assert!(s.connect(Duration::from_secs(1)));
    for i in 0..3 {
        s.sides[0].send(message(i, 5000), Some(i));
    }
    // A while with nothing posted: the sender is told to wait, nothing breaks.
    s.run_until(Duration::from_millis(20), |_| false);
    assert!(!s.sides[0].failed() && !s.sides[1].failed());
    assert!(s.sides[0].sends_done().is_empty());
    for _ in 0..3 {
        s.sides[1].recv(8192);
    }
    let mut got = vec![];
    assert!(s.run_until(Duration::from_secs(1), |s| {
        got.extend(s.sides[1].take_recvs());
        got.len() == 3 && s.sides[0].sends_done().len() == 3
    }));
    for (i, (data, imm, outcome)) in got.into_iter().enumerate() {
        assert_eq!(outcome, Outcome::Ok);
        assert_eq!(imm, Some(i as u32));
        assert_eq!(
            data,
            message(i as u32, 5000),
            "message {i} intact, once, in order"
        );
    }
}

#[test]
fn the_retry_limit_ends_in_error() {
    let rnr = RnrPolicy::Retry {
        delay: Duration::from_micros(200),
        limit: 5,
    };
    let mut s = Sim::new(3, config(rnr), Faults::default());
    assert!(s.connect(Duration::from_secs(1)));
    s.sides[0].send(message(1, 100), None);
    let ok = s.run_until(Duration::from_secs(1), |s| s.sides[0].failed());
    let st = s.sides[0].conn().stats();
    assert!(ok, "{:?} {:?}", s.sides[0].events, st);
    assert_eq!(
        failed_with(&s.sides[0].events),
        Some(FailReason::RnrExhausted)
    );
}

#[test]
fn a_short_receive_buffer_is_a_length_error_on_both_sides() {
    let mut s = Sim::new(4, config(RnrPolicy::Fail), Faults::default());
    assert!(s.connect(Duration::from_secs(1)));
    s.sides[1].recv(10);
    s.sides[0].send(message(1, 100), None);
    assert!(s.run_until(Duration::from_secs(1), |s| s.sides[0].failed()
        && s.sides[1].failed()));
    assert_eq!(
        s.sides[0].sends_done(),
        vec![(0, Outcome::Remote(NakCode::Length))]
    );
    let r = s.sides[1].take_recvs();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].2, Outcome::Length);
}

#[test]
fn rdma_is_checked_on_the_target_and_moves_bytes_exactly() {
    let mut s = Sim::new(
        5,
        config(RnrPolicy::Fail),
        Faults {
            loss: 0.05,
            dup: 0.01,
            reorder: 0.02,
            reorder_by: Duration::from_micros(100),
            ..Faults::default()
        },
    );
    assert!(s.connect(Duration::from_secs(1)));
    let src = message(9, 30_000);
    s.sides[1].mem.region[..30_000].copy_from_slice(&src);
    // Write 20 000 bytes at offset 1000 of the target's region, then read
    // 30 000 bytes from its start back.
    let w = message(3, 20_000);
    s.sides[0].post(
        SendOp {
            kind: SendKind::RdmaWrite {
                raddr: REGION_ADDR + 40_000,
                rkey: REGION_KEY,
            },
            len: 20_000,
            imm: None,
        },
        w.clone(),
    );
    s.sides[0].post(
        SendOp {
            kind: SendKind::RdmaRead {
                raddr: REGION_ADDR,
                rkey: REGION_KEY,
            },
            len: 30_000,
            imm: None,
        },
        vec![0; 30_000],
    );
    assert!(
        s.run_until(Duration::from_secs(2), |s| s.sides[0].sends_done().len()
            == 2)
    );
    assert_eq!(
        s.sides[0].sends_done(),
        vec![(0, Outcome::Ok), (1, Outcome::Ok)]
    );
    assert_eq!(&s.sides[1].mem.region[40_000..60_000], &w[..]);
    assert_eq!(s.sides[0].mem.reads[0].1, src);
    // A write outside the region: a protection error, memory untouched.
    let before = s.sides[1].mem.region.clone();
    s.sides[0].post(
        SendOp {
            kind: SendKind::RdmaWrite {
                raddr: REGION_ADDR + (1 << 16) - 10,
                rkey: REGION_KEY,
            },
            len: 100,
            imm: None,
        },
        vec![0xee; 100],
    );
    assert!(s.run_until(Duration::from_secs(2), |s| s.sides[0].failed()));
    assert_eq!(
        s.sides[0].sends_done().last(),
        Some(&(2, Outcome::Remote(NakCode::Protection)))
    );
    assert_eq!(s.sides[1].mem.region, before);
    assert!(s.run_until(Duration::from_secs(1), |s| s.sides[1].failed()));
}

#[test]
fn peer_to_peer_connects_whichever_request_arrives_first() {
    for (seed, loss) in [(11, 0.0), (12, 0.2), (13, 0.5)] {
        let cfg = config(RnrPolicy::Fail);
        let mut s = Sim::new(
            seed,
            cfg.clone(),
            Faults {
                loss,
                ..Faults::default()
            },
        );
        // Side 0 asks side 1's connection waiting on "b", and waits on "a".
        s.connect_peer(0, 10, b"b", b"a");
        s.connect_peer(1, 20, b"a", b"b");
        assert!(s.connect(Duration::from_secs(3)), "loss {loss}");
        let ids = (s.sides[0].id, s.sides[1].id);
        assert_eq!(s.sides[0].conn().peer_id(), ids.1);
        assert_eq!(s.sides[1].conn().peer_id(), ids.0);
        // And data flows both ways.
        s.sides[1].recv(100);
        s.sides[0].recv(100);
        s.sides[0].send(message(1, 50), None);
        s.sides[1].send(message(2, 60), None);
        let mut a = vec![];
        let mut b = vec![];
        assert!(s.run_until(Duration::from_secs(3), |s| {
            a.extend(s.sides[0].take_recvs());
            b.extend(s.sides[1].take_recvs());
            a.len() == 1 && b.len() == 1
        }));
        assert_eq!(a[0].0, message(2, 60));
        assert_eq!(b[0].0, message(1, 50));
    }
}
