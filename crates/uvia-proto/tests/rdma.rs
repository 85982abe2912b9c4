//! RDMA in the simulated network: writes (with and without immediate data)
//! and reads under loss, duplication and reordering land exactly once and
//! byte for byte; the target's protection checks fail the initiator's
//! descriptor with a protection error, break both sides, and leave memory
//! untouched.

mod sim;

use sim::{message, Faults, Sim, REGION_ADDR, REGION_KEY};
use std::time::Duration;
use uvia_proto::wire::NakCode;
use uvia_proto::{Config, Event, FailReason, Level, Outcome, SendKind, SendOp};

fn lossy() -> Faults {
    Faults {
        loss: 0.05,
        dup: 0.01,
        reorder: 0.02,
        reorder_by: Duration::from_micros(100),
        corrupt: 0.005,
        delay: Duration::from_micros(20),
    }
}

fn config(level: Level) -> Config {
    Config {
        level,
        idle_timeout: Duration::from_secs(2),
        ..Config::default()
    }
}

fn write(raddr: u64, len: usize, imm: Option<u32>) -> SendOp {
    SendOp {
        kind: SendKind::RdmaWrite {
            raddr,
            rkey: REGION_KEY,
        },
        len: len as u32,
        imm,
    }
}

fn read(raddr: u64, len: usize) -> SendOp {
    SendOp {
        kind: SendKind::RdmaRead {
            raddr,
            rkey: REGION_KEY,
        },
        len: len as u32,
        imm: None,
    }
}

/// Writes in four slots of the target's region, each slot written many
/// times: a frame of an older write applied late (a duplicate, or a
/// retransmission of something already placed) would show as stale bytes
/// in the slot's final contents.
#[test]
fn rdma_writes_land_exactly_once_under_loss() {
    const SLOT: usize = 20_000;
    for level in [Level::ReliableDelivery, Level::ReliableReception] {
        for seed in 0..4 {
            let mut s = Sim::new(seed, config(level), lossy());
            s.sides[1].mem.region = vec![0; 4 * SLOT];
            assert!(s.connect(Duration::from_secs(1)));
            let writes = 40u32;
            let mut last = vec![None; 4];
            let mut imms = vec![];
            for i in 0..writes {
                let slot = (i as usize * 7) % 4;
                // Lengths that end mid-frame, on a frame boundary, and past it.
                let len = [SLOT, 1408, 1409, 1][i as usize % 4];
                let imm = (i % 3 == 0).then_some(0x1000 + i);
                if let Some(x) = imm {
                    s.sides[1].recv(0);
                    imms.push((x, len as u32));
                }
                let data = message(i, len);
                let at = REGION_ADDR + (slot * SLOT) as u64;
                s.sides[0].post(write(at, len, imm), data.clone());
                // The slot's expected bytes: this write over the ones before.
                let mut want: Vec<u8> = last[slot].take().unwrap_or(vec![0; SLOT]);
                want[..len].copy_from_slice(&data);
                last[slot] = Some(want);
            }
            let mut recvs = vec![];
            let done = s.run_until(Duration::from_secs(5), |s| {
                recvs.extend(s.sides[1].take_recvs_full());
                s.sides[0].sends_done().len() as u32 == writes && recvs.len() == imms.len()
            });
            assert!(done, "{level:?} seed {seed}: finished");
            let sends = s.sides[0].sends_done();
            assert_eq!(
                sends,
                (0..writes).map(|m| (m, Outcome::Ok)).collect::<Vec<_>>(),
                "every write completes once, in order"
            );
            for (slot, want) in last.iter().enumerate() {
                let got = &s.sides[1].mem.region[slot * SLOT..(slot + 1) * SLOT];
                assert!(
                    got == &want.as_ref().unwrap()[..],
                    "{level:?} seed {seed}: slot {slot} holds the last write"
                );
            }
            // Writes with immediate data consumed a receive each, in order.
            let got: Vec<(u32, u32)> = recvs
                .iter()
                .map(|r| {
                    assert_eq!(r.outcome, Outcome::Ok);
                    assert!(r.remote_write, "consumed by a write, not a send");
                    (r.imm.expect("immediate data"), r.len)
                })
                .collect();
            assert_eq!(got, imms, "{level:?} seed {seed}");
            assert!(!s.sides[0].failed() && !s.sides[1].failed());
        }
    }
}

#[test]
fn rdma_reads_return_the_targets_bytes_under_loss() {
    for level in [Level::ReliableDelivery, Level::ReliableReception] {
        for seed in 10..14 {
            let mut s = Sim::new(seed, config(level), lossy());
            let region = message(77, 200_000);
            s.sides[1].mem.region = region.clone();
            assert!(s.connect(Duration::from_secs(1)));
            let reads: Vec<(usize, usize)> = vec![
                (0, 200_000),
                (5, 0),
                (1000, 1),
                (3, 1408),
                (1408, 1409),
                (199_000, 1000),
                (17, 65_536),
            ];
            for &(at, len) in &reads {
                s.sides[0].post(read(REGION_ADDR + at as u64, len), vec![0; len]);
            }
            let n = reads.len();
            let done = s.run_until(Duration::from_secs(5), |s| {
                s.sides[0].sends_done().len() == n
            });
            assert!(done, "{level:?} seed {seed}: finished");
            assert_eq!(
                s.sides[0].sends_done(),
                (0..n as u32).map(|m| (m, Outcome::Ok)).collect::<Vec<_>>()
            );
            for (k, &(at, len)) in reads.iter().enumerate() {
                let (msn, got) = &s.sides[0].mem.reads[k];
                assert_eq!(*msn, k as u32);
                assert!(got[..] == region[at..at + len], "read {k} byte-exact");
            }
            assert_eq!(s.sides[1].mem.region, region, "a read changes nothing");
        }
    }
}

/// One protection case: `op` is refused by the target.
fn refused(name: &str, op: SendOp, prepare: impl Fn(&mut Sim)) {
    for level in [Level::ReliableDelivery, Level::ReliableReception] {
        let mut s = Sim::new(3, config(level), Faults::default());
        assert!(s.connect(Duration::from_secs(1)));
        prepare(&mut s);
        s.sides[1].mem.region = message(5, 1 << 16);
        let before = s.sides[1].mem.region.clone();
        // A send that succeeds first, then the bad operation, then a send
        // behind it.
        s.sides[1].recv(3000);
        s.sides[1].recv(3000);
        s.sides[0].recv(100);
        s.sides[0].send(message(1, 3000), None);
        s.sides[0].post(op, vec![0xee; op.len as usize]);
        s.sides[0].send(message(2, 3000), None);
        let done = s.run_until(Duration::from_secs(1), |s| {
            s.sides[0].failed() && s.sides[1].failed()
        });
        assert!(done, "{name} ({level:?}): both sides fail");
        let sends = s.sides[0].sends_done();
        assert_eq!(
            sends[..2],
            [(0, Outcome::Ok), (1, Outcome::Remote(NakCode::Protection))],
            "{name} ({level:?})"
        );
        // The one behind it was on the wire already, or not yet.
        assert_eq!(sends.len(), 3);
        assert!(matches!(
            sends[2],
            (2, Outcome::Transport | Outcome::Flushed)
        ));
        let reason = |evs: &[Event]| {
            evs.iter().find_map(|e| match e {
                Event::Failed(r) => Some(*r),
                _ => None,
            })
        };
        assert_eq!(
            reason(&s.sides[0].events),
            Some(FailReason::Remote(NakCode::Protection)),
            "{name}"
        );
        assert_eq!(
            reason(&s.sides[1].events),
            Some(FailReason::Local(NakCode::Protection)),
            "{name}"
        );
        assert_eq!(s.sides[1].mem.region, before, "{name}: memory untouched");
        // Every receive descriptor completed: the first send's normally,
        // the rest with an error.
        let r = s.sides[1].take_recvs();
        assert_eq!(r.len(), 2, "{name}");
        assert_eq!((&r[0].0, r[0].2), (&message(1, 3000), Outcome::Ok));
        assert_ne!(r[1].2, Outcome::Ok);
        let r = s.sides[0].take_recvs();
        assert_eq!(r.len(), 1, "{name}");
        assert_ne!(r[0].2, Outcome::Ok);
        if let SendKind::RdmaRead { .. } = op.kind {
            assert!(
                s.sides[0].mem.reads[0].1.iter().all(|&b| b == 0xee),
                "{name}: nothing placed in the read buffer"
            );
        }
    }
}

#[test]
fn rdma_protection_is_checked_on_the_target() {
    let bad_key = SendOp {
        kind: SendKind::RdmaWrite {
            raddr: REGION_ADDR,
            rkey: REGION_KEY + 1,
        },
        len: 10,
        imm: None,
    };
    refused("write with a bad key", bad_key, |_| {});
    refused(
        "write past the end",
        write(REGION_ADDR + (1 << 16) - 5_000, 5_001, None),
        |_| {},
    );
    refused(
        "write before the start",
        write(REGION_ADDR - 1, 10, None),
        |_| {},
    );
    refused(
        "write with immediate data past the end",
        write(REGION_ADDR + (1 << 16), 1, Some(9)),
        |_| {},
    );
    refused(
        "write to a region without write",
        write(REGION_ADDR, 10, None),
        |s| {
            s.sides[1].mem.region_writable = false;
        },
    );
    let bad_read_key = SendOp {
        kind: SendKind::RdmaRead {
            raddr: REGION_ADDR,
            rkey: 0,
        },
        len: 10,
        imm: None,
    };
    refused("read with a bad key", bad_read_key, |_| {});
    refused("read past the end", read(REGION_ADDR + 10, 1 << 16), |_| {});
    refused(
        "read of a region without read",
        read(REGION_ADDR, 10),
        |s| {
            s.sides[1].mem.region_readable = false;
        },
    );
}
