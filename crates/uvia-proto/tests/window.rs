//! How much a sender keeps in flight, and when a receiver acknowledges
//! large frames: a message of a MiB goes out whole on a path that has lost
//! nothing, the lossy window bounds what follows a loss until enough has
//! gone through cleanly, and the last frame of a message waits for the
//! answer that may carry its ack.

use direct::{connected, deliver, send_len as send, settled, Buf};
use std::time::Instant;
use uvia_proto::wire::{self, Repr, DATA_HEADER_LEN};
use uvia_proto::{Config, Conn, Event, Level, Outcome};

mod direct;

const FRAME: u32 = 65_504;
const PAYLOAD: u32 = FRAME - DATA_HEADER_LEN as u32;
const MIB: u32 = 1 << 20;

/// The payload bytes of the data frames among `frames`.
fn data_bytes(frames: &[Vec<u8>]) -> u32 {
    frames
        .iter()
        .map(|f| match wire::parse(f) {
            Ok((_, _, Repr::Data { payload, .. })) => payload.len() as u32,
            _ => 0,
        })
        .sum()
}

fn is_data(f: &[u8]) -> bool {
    matches!(wire::parse(f), Ok((_, _, Repr::Data { .. })))
}

fn sends_done(c: &mut Conn) -> Vec<(u32, Outcome)> {
    std::iter::from_fn(|| c.poll_event())
        .filter_map(|e| match e {
            Event::SendDone { msn, outcome } => Some((msn, outcome)),
            _ => None,
        })
        .collect()
}

/// A client and a server at reliable delivery with frames of 64 KB,
/// connected, the server with `recvs` receives of a MiB posted.
fn pair(recvs: usize) -> (Conn, Buf, Conn, Buf) {
    let cfg = Config {
        level: Level::ReliableDelivery,
        max_frame: FRAME,
        ..Config::default()
    };
    let (client, mc, mut server, ms) =
        connected(cfg, Buf(vec![1; MIB as usize]), Buf(vec![0; MIB as usize]));
    for _ in 0..recvs {
        server.post_recv(MIB).expect("post receive");
    }
    (client, mc, server, ms)
}

/// Moves frames both ways until neither side has any to send, the
/// server's delayed ack let go when nothing else is left.
fn exchange(client: &mut Conn, mc: &mut Buf, server: &mut Conn, ms: &mut Buf) {
    for _ in 0..1000 {
        let out = settled(client, mc);
        deliver(server, &out, ms);
        if out.is_empty() && server.owes_ack() {
            server.handle_timeout(Instant::now() + Config::default().ack_delay * 2);
        }
        let back = settled(server, ms);
        deliver(client, &back, mc);
        if out.is_empty() && back.is_empty() {
            return;
        }
    }
    panic!("the exchange never went quiet");
}

/// A MiB goes out at once on a clean path; after a loss the lossy window
/// (512 KiB) bounds the next one; after 16 lossy windows acknowledged with
/// nothing lost, a MiB goes at once again.
#[test]
fn a_mib_goes_whole_until_a_loss_and_again_once_the_path_is_clean() {
    let (mut client, mut mc, mut server, mut ms) = pair(32);
    let lossy = Config::default().lossy_window_bytes;
    assert!(
        Config::default().window_bytes > MIB,
        "the open window holds a MiB"
    );

    let first = send(&mut client, MIB);
    let out = settled(&mut client, &mut mc);
    assert_eq!(data_bytes(&out), MIB, "the whole MiB before any ack");

    // The third frame is lost; the rest arrive and are acknowledged.
    let kept: Vec<_> = out
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 2)
        .map(|(_, f)| f.clone())
        .collect();
    deliver(&mut server, &kept, &mut ms);
    let acks = settled(&mut server, &mut ms);
    assert!(!acks.is_empty(), "the gap is acknowledged at once");
    deliver(&mut client, &acks, &mut mc);

    // The lost frame goes again, and of the next MiB no more than the
    // lossy window less what is still unacknowledged.
    let second = send(&mut client, MIB);
    let out = settled(&mut client, &mut mc);
    let new = data_bytes(&out) - PAYLOAD;
    assert!(
        new < lossy,
        "after a loss {new} bytes of new data went, the lossy window is {lossy}"
    );
    deliver(&mut server, &out, &mut ms);
    exchange(&mut client, &mut mc, &mut server, &mut ms);
    assert_eq!(
        sends_done(&mut client),
        vec![(first, Outcome::Ok), (second, Outcome::Ok)]
    );

    // 8 MiB through with no loss: the window opens again.
    for _ in 0..8 {
        send(&mut client, MIB);
        exchange(&mut client, &mut mc, &mut server, &mut ms);
    }
    assert_eq!(sends_done(&mut client).len(), 8, "every send completed");
    while server.poll_event().is_some() {}
    send(&mut client, MIB);
    let out = settled(&mut client, &mut mc);
    assert_eq!(data_bytes(&out), MIB, "the whole MiB again");
}

/// Sends the server a message of `frames` frames (the last a short one),
/// delivered in one batch: the server sends no ack of its own but owes one
/// on its delay, and its answer carries it, completing the client's send.
fn whole_message_acked_by_its_answer(
    client: &mut Conn,
    mc: &mut Buf,
    server: &mut Conn,
    ms: &mut Buf,
    frames: u32,
) {
    let msn = send(client, (frames - 1) * PAYLOAD + 200);
    let out = settled(client, mc);
    assert_eq!(out.len(), frames as usize);
    deliver(server, &out, ms);
    let now = settled(server, ms);
    assert!(
        now.is_empty(),
        "no ack of its own for a message taken whole ({} frames)",
        now.len()
    );
    assert!(server.owes_ack(), "the ack is owed, on its delay");

    client.post_recv(64).expect("post receive");
    send(server, 8);
    let answer = settled(server, ms);
    assert_eq!(answer.len(), 1);
    assert!(is_data(&answer[0]));
    assert!(!server.owes_ack(), "the answer carried the ack");
    deliver(client, &answer, mc);
    client.settle(Instant::now());
    assert_eq!(sends_done(client), vec![(msn, Outcome::Ok)]);
}

/// Large frames are acknowledged every quarter of the lossy window, but a
/// message's last frame is not: the answer carries its ack. A frame in the
/// middle of a message that passes the quarter is acknowledged at once.
#[test]
fn a_messages_last_frame_waits_for_the_answer_to_carry_its_ack() {
    let (mut client, mut mc, mut server, mut ms) = pair(4);
    let quarter = Config::default().lossy_window_bytes / 4;

    // Three frames whose bytes pass the quarter only with the last.
    assert!(2 * PAYLOAD < quarter && 3 * PAYLOAD > quarter);
    whole_message_acked_by_its_answer(&mut client, &mut mc, &mut server, &mut ms, 3);

    // Four frames whose bytes pass the quarter at the third: acked at
    // once, so that a sender held to the lossy window never waits.
    send(&mut client, 3 * PAYLOAD + 200);
    let out = settled(&mut client, &mut mc);
    assert_eq!(out.len(), 4);
    deliver(&mut server, &out[..3], &mut ms);
    let now = settled(&mut server, &mut ms);
    assert_eq!(now.len(), 1, "an ack at once");
    assert!(!is_data(&now[0]));
}

/// A message whose frames pass the quarter of the lossy window and whose
/// last frame comes in the same receive batch, before the window's ack
/// went out, is acknowledged as a message is: by its answer, or on the
/// delay. (A MiB's read response on udp ended in an ack of its own just
/// before the read's closing message, which carries the same ack.)
#[test]
fn a_message_whole_before_its_window_ack_went_out_waits_for_its_answer() {
    let (mut client, mut mc, mut server, mut ms) = pair(4);
    whole_message_acked_by_its_answer(&mut client, &mut mc, &mut server, &mut ms, 4);

    // A later frame in the middle of a message that passes the quarter
    // is still acked at once: the flag went with the answer.
    send(&mut client, 4 * PAYLOAD + 200);
    let out = settled(&mut client, &mut mc);
    assert_eq!(out.len(), 5);
    deliver(&mut server, &out[..4], &mut ms);
    let now = settled(&mut server, &mut ms);
    assert_eq!(now.len(), 1, "an ack at once");
    assert!(!is_data(&now[0]));
}

/// A stream of two-frame messages, each taken whole in one receive batch
/// and none answered: the window's ack waits for an answer only until half
/// the lossy window has come, so that a sender held to that window does not
/// stop for every ack (before, only `ack_every` frames brought one: the
/// whole lossy window at 64 KiB, and a stream at 1% loss, its window
/// narrow, moved 5% less).
#[test]
fn a_stream_of_whole_messages_is_acked_by_half_the_lossy_window() {
    let (mut client, mut mc, mut server, mut ms) = pair(8);
    let half = Config::default().lossy_window_bytes / 2;
    let len = PAYLOAD + 200;
    let mut came = 0;
    for k in 1..=8 {
        send(&mut client, len);
        let out = settled(&mut client, &mut mc);
        assert_eq!(out.len(), 2, "message {k} in two frames");
        deliver(&mut server, &out, &mut ms);
        came += len;
        let now = settled(&mut server, &mut ms);
        if now.is_empty() {
            assert!(came < half, "no ack with {came} bytes unacknowledged");
            continue;
        }
        assert!(
            came >= half,
            "acked at {came} bytes, before half the window"
        );
        assert!(!is_data(&now[0]), "an ack of its own");
        assert_eq!(k, 4, "at the fourth message of {len} bytes");
        return;
    }
    panic!("eight messages and no ack");
}
