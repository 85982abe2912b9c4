//! A peer that breaks the protocol's rules with frames that parse: the
//! connection fails with the peer's fault named, and the process goes on.
//! Frames are built by a well-behaved sender, then rewritten as a faulty
//! or hostile one would send them.

use direct::{connected, deliver, send_len, settled, Buf};
use uvia_proto::wire::{self, NakCode, Repr};
use uvia_proto::{Config, Conn, Event, FailReason, Level, SendKind, SendOp};

mod direct;

fn config() -> Config {
    Config {
        level: Level::ReliableDelivery,
        // Small frames: a message of 3,000 bytes takes three.
        max_frame: 1024,
        ..Config::default()
    }
}

/// A receiver with four receives posted, and the frames of a message of
/// 3,000 bytes (three frames) and one of 100 that the sender built for it,
/// each rewritten by `change`: the first message's frames and the second's.
fn two_messages(change: fn(&mut wire::DataHeader)) -> (Conn, Buf, Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let (mut client, mut mc, mut server, ms) =
        connected(config(), Buf(vec![7; 8192]), Buf(vec![0; 8192]));
    for _ in 0..4 {
        server.post_recv(4096).unwrap();
    }
    send_len(&mut client, 3000);
    send_len(&mut client, 100);
    let frames: Vec<Vec<u8>> = settled(&mut client, &mut mc)
        .iter()
        .map(|f| rewritten(f, change))
        .collect();
    let of = |msn| -> Vec<Vec<u8>> {
        frames
            .iter()
            .filter(|f| msn_of(f) == Some(msn))
            .cloned()
            .collect()
    };
    (server, ms, of(0), of(1))
}

/// `f` rewritten: its data header changed by `change`, its checksum made
/// anew.
fn rewritten(f: &[u8], change: impl Fn(&mut wire::DataHeader)) -> Vec<u8> {
    let (dst, src, repr) = wire::parse(f).expect("a frame of the engine parses");
    let Repr::Data {
        mut header,
        payload,
    } = repr
    else {
        return f.to_vec();
    };
    change(&mut header);
    let repr = Repr::Data { header, payload };
    let mut out = vec![0u8; repr.buffer_len()];
    repr.emit(&mut out, dst, src);
    out
}

fn msn_of(f: &[u8]) -> Option<u32> {
    match wire::parse(f) {
        Ok((_, _, Repr::Data { header, .. })) => Some(header.msn),
        _ => None,
    }
}

fn failure(c: &mut Conn) -> Option<FailReason> {
    std::iter::from_fn(|| c.poll_event()).find_map(|e| match e {
        Event::Failed(r) => Some(r),
        _ => None,
    })
}

/// Two messages that name each other's receive descriptors (the first the
/// second descriptor, the second the first), the first still in assembly
/// when the second arrives whole: the receiver refuses the second and
/// breaks, where it once placed it and then indexed its descriptor list
/// below its start.
#[test]
fn messages_that_name_receives_out_of_order_break_the_connection() {
    for wrong in [
        // Swapped: message 0 takes receive 1 and message 1 receive 0.
        (|h: &mut wire::DataHeader| h.rsn ^= 1) as fn(&mut wire::DataHeader),
        // Both name receive 0.
        |h| h.rsn = 0,
        // Message 1 names a receive two beyond its place.
        |h| h.rsn = h.msn * 2,
    ] {
        let (mut server, mut ms, first, second) = two_messages(wrong);
        assert!(
            first.len() >= 2 && second.len() == 1,
            "{} and {} frames",
            first.len(),
            second.len()
        );
        // Message 0's first frame, message 1 whole, then the rest of 0.
        deliver(&mut server, &first[..1], &mut ms);
        deliver(&mut server, &second, &mut ms);
        deliver(&mut server, &first[1..], &mut ms);
        let reason = failure(&mut server);
        assert!(
            matches!(reason, Some(FailReason::Local(NakCode::Failed))),
            "{reason:?}"
        );
    }
}

/// The same messages as a well-behaved sender sends them, in the same
/// order of arrival, are both delivered whole (the check refuses only
/// what breaks the rules).
#[test]
fn messages_in_their_receives_order_arrive_whole() {
    let (mut server, mut ms, first, second) = two_messages(|_| {});
    deliver(&mut server, &first[..1], &mut ms);
    deliver(&mut server, &second, &mut ms);
    deliver(&mut server, &first[1..], &mut ms);
    let done: Vec<(u32, u32)> = std::iter::from_fn(|| server.poll_event())
        .filter_map(|e| match e {
            Event::RecvDone { rsn, len, .. } => Some((rsn, len)),
            Event::Failed(r) => panic!("failed: {r:?}"),
            _ => None,
        })
        .collect();
    assert_eq!(done, [(0, 3000), (1, 100)]);
}

/// Memory that lets every RDMA access through (the target's own checks
/// are not what these tests are about).
struct Open(Buf);

impl uvia_proto::Memory for Open {
    fn read_send(&mut self, rsn: u32, offset: u32, buf: &mut [u8]) {
        self.0.read_send(rsn, offset, buf)
    }
    fn write_recv(&mut self, rsn: u32, offset: u32, data: &[u8]) -> bool {
        self.0.write_recv(rsn, offset, data)
    }
    fn write_read(&mut self, _: u32, _: u32, _: &[u8]) {}
    fn check_rdma(&mut self, _: u32, _: u64, _: u32, _: bool) -> Result<(), NakCode> {
        Ok(())
    }
    fn rdma_write(&mut self, _: u32, _: u64, _: &[u8]) -> Result<(), NakCode> {
        Ok(())
    }
    fn rdma_read(&mut self, _: u32, _: u64, buf: &mut [u8]) {
        buf.fill(5);
    }
}

/// A peer that asks for more reads than a send queue holds and takes none
/// of the answers: the target refuses past its bound and breaks, rather
/// than keep every answer it owes.
#[test]
fn reads_asked_past_any_send_queue_break_the_connection() {
    let cfg = Config {
        level: Level::ReliableDelivery,
        rdma_read: true,
        // Room for every request in flight at once.
        window: 8192,
        ..Config::default()
    };
    let (mut client, mut mc, mut server, _) = connected(cfg, Buf(vec![0; 64]), Buf(vec![0; 64]));
    let mut ms = Open(Buf(vec![0; 64]));
    for _ in 0..5000 {
        let op = SendOp {
            kind: SendKind::RdmaRead { raddr: 0, rkey: 1 },
            len: 8,
            imm: None,
        };
        client.post_send(op).expect("post read");
    }
    let requests = settled(&mut client, &mut mc);
    let mut failed_at = None;
    for (i, f) in requests.iter().enumerate() {
        let (_, src, repr) = wire::parse(f).unwrap();
        server.handle_frame(std::time::Instant::now(), src, &repr, &mut ms);
        if let Some(r) = failure(&mut server) {
            assert_eq!(r, FailReason::Local(NakCode::Failed));
            failed_at = Some(i);
            break;
        }
    }
    assert_eq!(failed_at, Some(4096), "of {} requests", requests.len());
}
