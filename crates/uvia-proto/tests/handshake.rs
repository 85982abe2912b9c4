//! The handshake in the simulated network: repeated requests make one
//! connection, a refusal reaches the client as `Rejected`, a request nobody
//! answers ends in `ConnectTimedOut`, lost handshake frames are repeated
//! until both sides are connected, and private data crosses both ways.

mod sim;

use sim::{message, Answer, Faults, Sim};
use std::time::Duration;
use uvia_proto::wire::{ConnAttrs, RejectReason, Repr};
use uvia_proto::{Config, Event, Level, Outcome, PostError, PrivateData, SendKind, SendOp};

fn config(level: Level) -> Config {
    Config {
        level,
        idle_timeout: Duration::from_secs(2),
        ..Config::default()
    }
}

fn count(events: &[Event], e: Event) -> usize {
    events.iter().filter(|x| **x == e).count()
}

/// Sends `n` messages from side 0 to side 1 and checks they arrive once,
/// in order, intact.
fn exchange(s: &mut Sim, n: u32) {
    let base = s.sides[0].sends_done().len() as u32;
    for i in 0..n {
        s.sides[1].recv(4000);
        s.sides[0].send(message(base + i, 3000), Some(base + i));
    }
    let mut got = vec![];
    let ok = s.run_until(Duration::from_secs(2), |s| {
        got.extend(s.sides[1].take_recvs());
        got.len() as u32 == n && s.sides[0].sends_done().len() as u32 == base + n
    });
    assert!(
        ok,
        "{:?}\n{:?}\n{got:?}",
        s.sides[0].events, s.sides[1].events
    );
    for (i, (data, imm, outcome)) in got.into_iter().enumerate() {
        let i = i as u32 + base;
        assert_eq!((imm, outcome), (Some(i), Outcome::Ok));
        assert_eq!(data, message(i, 3000));
    }
}

#[test]
fn repeated_requests_make_one_connection() {
    for level in [
        Level::Unreliable,
        Level::ReliableDelivery,
        Level::ReliableReception,
    ] {
        // Every frame of the client doubled while it connects.
        let mut s = Sim::new(1, config(level), Faults::default());
        s.faults[0].dup = 1.0;
        assert!(s.connect(Duration::from_secs(1)), "{level:?}");
        s.faults[0].dup = 0.0;
        assert!(s.sides[1].requests >= 2, "the request came twice");
        // A stale copy of the request much later, in the middle of traffic.
        let attrs = ConnAttrs {
            reliability: level as u8,
            rdma_write: true,
            rdma_read: true,
            max_frame: 1472,
            max_transfer: 16 << 20,
            initial_psn: 1000,
            intact: false,
            job: 0,
            nic: 0,
        };
        let req = Repr::ConnRequest {
            attrs,
            discriminator: b"sim",
            private: b"",
        };
        let mut b = vec![0u8; req.buffer_len()];
        req.emit(&mut b, 0, s.sides[0].id);
        exchange(&mut s, 3);
        s.inject(1, b.clone());
        exchange(&mut s, 3);
        s.inject(1, b);
        s.run_until(Duration::from_millis(5), |_| false);
        assert_eq!(count(&s.sides[0].events, Event::Connected), 1, "{level:?}");
        for side in 0..2 {
            assert!(!s.sides[side].failed());
            assert!(s.sides[side].conn().is_connected(), "{level:?} side {side}");
        }
        exchange(&mut s, 2);
    }
}

#[test]
fn the_handshake_survives_heavy_loss() {
    for seed in 0..20 {
        let f = Faults {
            loss: 0.5,
            dup: 0.1,
            reorder: 0.2,
            reorder_by: Duration::from_millis(20),
            ..Faults::default()
        };
        let mut s = Sim::new(seed, config(Level::ReliableDelivery), f);
        assert!(s.connect(Duration::from_secs(4)), "seed {seed}");
        s.faults = [Faults::default(); 2];
        exchange(&mut s, 2);
        // (A server's connection is made connected; only the client is told.)
        assert_eq!(count(&s.sides[0].events, Event::Connected), 1);
    }
}

#[test]
fn a_refused_request_is_rejected() {
    for reason in [
        RejectReason::Refused,
        RejectReason::NoListener,
        RejectReason::Mismatch,
    ] {
        let mut s = Sim::new(2, config(Level::ReliableDelivery), Faults::default());
        s.sides[1].answer = Answer::Reject(reason);
        assert!(s.run_until(Duration::from_secs(1), |s| {
            s.sides[0].events.contains(&Event::Rejected(reason))
        }));
        let c = s.sides[0].conn();
        assert!(c.is_closed() && !c.is_connected());
        let op = SendOp {
            kind: SendKind::Send,
            len: 1,
            imm: None,
        };
        assert_eq!(s.sides[0].conn().post_send(op), Err(PostError::State));
        // Nothing more goes out: the client has stopped asking.
        let asked = s.sides[1].requests;
        s.run_until(Duration::from_secs(1), |_| false);
        assert_eq!(s.sides[1].requests, asked, "{reason:?}");
        assert!(s.sides[1].conn.is_none(), "the server keeps no state");
    }
}

#[test]
fn a_level_mismatch_is_rejected_by_the_client() {
    let mut s = Sim::new(3, config(Level::ReliableDelivery), Faults::default());
    // The server accepts with its own level.
    s.sides[1].cfg.level = Level::ReliableReception;
    assert!(s.run_until(Duration::from_secs(1), |s| {
        s.sides[0]
            .events
            .contains(&Event::Rejected(RejectReason::Mismatch))
    }));
    assert!(!s.sides[0].events.contains(&Event::Connected));
}

#[test]
fn a_request_nobody_answers_times_out() {
    let cfg = config(Level::ReliableReception);
    let (timeout, retry) = (cfg.connect_timeout, cfg.handshake_retry);
    let mut s = Sim::new(4, cfg, Faults::default());
    s.sides[1].answer = Answer::Silent;
    let t0 = s.now;
    assert!(s.run_until(timeout * 2, |s| {
        s.sides[0].events.contains(&Event::ConnectTimedOut)
    }));
    assert_eq!(s.now - t0, timeout, "exactly at the timeout");
    let tries = (timeout.as_nanos() / retry.as_nanos()) as u32;
    let asked = s.sides[1].requests;
    assert!(
        (tries..=tries + 1).contains(&asked),
        "asked every {retry:?}: {asked}"
    );
    assert!(s.sides[0].conn().is_closed());
    assert_eq!(s.sides[0].conn().poll_timeout(), None, "no timer left");
    s.run_until(Duration::from_secs(1), |_| false);
    assert_eq!(s.sides[1].requests, asked, "the client has stopped asking");
}

fn private(b: &[u8]) -> PrivateData {
    PrivateData::new(b).expect("at most 64 bytes")
}

#[test]
fn private_data_crosses_both_ways_under_loss() {
    let f = Faults {
        loss: 0.3,
        dup: 0.2,
        reorder: 0.2,
        reorder_by: Duration::from_millis(10),
        ..Faults::default()
    };
    let asked = private(b"from the client");
    let longest = private(&[0xa5; 64]);
    for seed in 0..10 {
        // Accepted: the request's private data reaches the server's
        // listener (once, whatever the repetitions), the accept's the client.
        let mut s = Sim::new(seed, config(Level::ReliableDelivery), f);
        s.sides[0].conn = s.sides[0].conn.take().map(|c| c.with_private(asked));
        s.sides[1].answer_private = longest;
        assert!(s.connect(Duration::from_secs(4)), "seed {seed}");
        assert_eq!(s.sides[1].incoming.len(), 1, "seed {seed}");
        assert_eq!(s.sides[1].incoming[0].private, asked);
        assert_eq!(s.sides[0].conn().peer_private(), longest.as_slice());
        assert_eq!(
            s.sides[1].conn().peer_private(),
            b"",
            "a server's comes with the request"
        );

        // Refused: the reject's private data reaches the client, and so
        // does the same answer to every repetition.
        let mut s = Sim::new(seed, config(Level::ReliableDelivery), f);
        s.sides[0].conn = s.sides[0].conn.take().map(|c| c.with_private(asked));
        s.sides[1].answer = Answer::Reject(RejectReason::Refused);
        s.sides[1].answer_private = private(b"not today");
        assert!(s.run_until(Duration::from_secs(4), |s| {
            s.sides[0]
                .events
                .contains(&Event::Rejected(RejectReason::Refused))
        }));
        assert_eq!(
            s.sides[0].conn().peer_private(),
            b"not today",
            "seed {seed}"
        );
        assert_eq!(s.sides[1].incoming.len(), 1);
        assert_eq!(s.sides[1].incoming[0].private, asked);

        // Peer to peer: each side's request (or accept) carries its own.
        let mut s = Sim::new(seed, config(Level::ReliableDelivery), f);
        s.sides[0].answer_private = private(b"side 0");
        s.sides[1].answer_private = private(b"side 1");
        s.connect_peer(0, 10, b"b", b"a");
        s.connect_peer(1, 20, b"a", b"b");
        assert!(s.connect(Duration::from_secs(4)), "seed {seed}");
        assert_eq!(s.sides[0].conn().peer_private(), b"side 1");
        assert_eq!(s.sides[1].conn().peer_private(), b"side 0");
    }
    // Too long is refused where the data is made, never later.
    assert_eq!(
        PrivateData::new(&[0; 65]),
        Err(uvia_proto::PrivateDataTooLong(65))
    );
}
