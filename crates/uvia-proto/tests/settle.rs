//! What a message's way does not wait for waits for `Conn::settle`: the
//! acknowledgement a data frame carries is applied after the frame's
//! payload has reached the application (the answer leaves first), and the
//! timers of a frame built, and a frame's delayed ack, are armed once the
//! caller's transmission is done. Nothing may wait on it: a full window, a
//! lost frame's retransmission and a close settle themselves.

use direct::{built, connected, deliver, send, settled, Buf};
use std::time::Instant;
use uvia_proto::{Config, Conn, Event, Level, Outcome};

mod direct;

fn events(c: &mut Conn) -> Vec<Event> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

fn sends_done(events: &[Event]) -> Vec<(u32, Outcome)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::SendDone { msn, outcome } => Some((*msn, *outcome)),
            _ => None,
        })
        .collect()
}

fn received(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Event::RecvDone { .. }))
        .count()
}

/// A client and a server at reliable delivery, connected, each with
/// receives posted.
fn pair(window: u32) -> (Conn, Buf, Conn, Buf) {
    let cfg = Config {
        level: Level::ReliableDelivery,
        window,
        ..Config::default()
    };
    let (mut client, mc, mut server, ms) = connected(cfg, Buf(vec![1; 8]), Buf(vec![2; 8]));
    for _ in 0..4 {
        client.post_recv(8).expect("post receive");
        server.post_recv(8).expect("post receive");
    }
    (client, mc, server, ms)
}

/// The client's ping taken in by the server, and the server's reply
/// (which acknowledges it) sent, not yet delivered: the ping's message
/// number and the reply's frames.
fn ping_answered(
    client: &mut Conn,
    mc: &mut Buf,
    server: &mut Conn,
    ms: &mut Buf,
) -> (u32, Vec<Vec<u8>>) {
    let ping = send(client);
    let f = settled(client, mc);
    deliver(server, &f, ms);
    events(server);
    send(server);
    (ping, settled(server, ms))
}

#[test]
fn the_answer_leaves_before_the_acknowledgement_it_answers_is_applied() {
    let (mut client, mut mc, mut server, mut ms) = pair(64);
    let ping = send(&mut client);
    let f = settled(&mut client, &mut mc);
    deliver(&mut server, &f, &mut ms);
    assert_eq!(received(&events(&mut server)), 1);

    // The reply carries the ack of the ping.
    send(&mut server);
    let reply = settled(&mut server, &mut ms);
    deliver(&mut client, &reply, &mut mc);
    let got = events(&mut client);
    assert_eq!(received(&got), 1, "the reply is delivered at once");
    assert!(sends_done(&got).is_empty(), "the ack waits: {got:?}");
    assert!(client.unsettled());

    // The client's answer is built with the ack still waiting ...
    send(&mut client);
    let answer = built(&mut client, &mut mc);
    assert!(!answer.is_empty(), "the answer goes");
    assert!(sends_done(&events(&mut client)).is_empty());
    // ... and applied once the caller has sent it.
    client.settle(Instant::now());
    assert!(!client.unsettled());
    assert_eq!(sends_done(&events(&mut client)), vec![(ping, Outcome::Ok)]);

    // The answer reached the server whole, with the reply's ack.
    deliver(&mut server, &answer, &mut ms);
    assert_eq!(received(&events(&mut server)), 1);
    send(&mut server);
    assert_eq!(built(&mut server, &mut ms).len(), 1);
    assert_eq!(sends_done(&events(&mut server)).len(), 0);
    server.settle(Instant::now());
    assert_eq!(
        sends_done(&events(&mut server)).len(),
        1,
        "the reply is done"
    );
}

#[test]
fn a_full_window_applies_the_waiting_acknowledgement_itself() {
    // One frame in flight at most: the next send needs the ack.
    let (mut client, mut mc, mut server, mut ms) = pair(1);
    let first = send(&mut client);
    let f = settled(&mut client, &mut mc);
    assert_eq!(f.len(), 1);
    let second = send(&mut client);
    assert!(
        settled(&mut client, &mut mc).is_empty(),
        "the window is full"
    );
    deliver(&mut server, &f, &mut ms);
    events(&mut server);
    send(&mut server);
    let reply = settled(&mut server, &mut ms);
    deliver(&mut client, &reply, &mut mc);
    assert!(client.unsettled());

    // No settle by the caller: the transmission applies the ack it needs.
    let f = settled(&mut client, &mut mc);
    assert_eq!(f.len(), 1, "the second send goes on the ack it waited for");
    let done = sends_done(&events(&mut client));
    assert_eq!(done, vec![(first, Outcome::Ok)]);
    deliver(&mut server, &f, &mut ms);
    assert_eq!(received(&events(&mut server)), 1);
    assert!(second > first);
}

#[test]
fn a_close_completes_the_acknowledged_sends_as_done() {
    let (mut client, mut mc, mut server, mut ms) = pair(64);
    let (ping, reply) = ping_answered(&mut client, &mut mc, &mut server, &mut ms);
    // A second send of the client's, never acknowledged.
    let later = send(&mut client);
    settled(&mut client, &mut mc);
    deliver(&mut client, &reply, &mut mc);
    assert!(client.unsettled());

    client.close(Instant::now());
    let done = sends_done(&events(&mut client));
    assert_eq!(done.first(), Some(&(ping, Outcome::Ok)), "{done:?}");
    assert!(done.iter().all(|&(m, o)| m != later || o != Outcome::Ok));
}

#[test]
fn a_frame_the_waiting_acknowledgement_covers_is_not_sent_again() {
    let (mut client, mut mc, mut server, mut ms) = pair(64);
    let (ping, reply) = ping_answered(&mut client, &mut mc, &mut server, &mut ms);

    // The client's timer runs out before the reply arrives: the ping is
    // taken for lost ...
    let late = Instant::now() + std::time::Duration::from_secs(2);
    client.handle_timeout(late);
    let before = client.retransmitted();
    // ... and the reply, which acknowledges it, comes before it goes again.
    deliver(&mut client, &reply, &mut mc);
    assert!(client.unsettled());
    let again = settled(&mut client, &mut mc);
    assert_eq!(
        client.retransmitted(),
        before,
        "{} frames sent",
        again.len()
    );
    assert_eq!(sends_done(&events(&mut client)), vec![(ping, Outcome::Ok)]);
}

#[test]
fn a_frame_sent_is_timed_once_settled_and_goes_again_when_its_ack_never_comes() {
    let (mut client, mut mc, _server, _ms) = pair(64);
    let start = Instant::now();
    send(&mut client);
    assert_eq!(settled(&mut client, &mut mc).len(), 1);
    // The frame is lost. Its timers are armed by the settle after the
    // transmission, within the initial retransmission timeout.
    client.settle(Instant::now());
    let due = client.poll_timeout().expect("a deadline");
    assert!(
        due <= Instant::now() + Config::default().initial_rto,
        "the next deadline is {:?} away",
        due - start
    );
    let mut at = due;
    for _ in 0..4 {
        client.handle_timeout(at);
        if client.retransmitted() > 0 {
            break;
        }
        at = client.poll_timeout().expect("a deadline");
    }
    let again = settled(&mut client, &mut mc);
    assert_eq!(client.retransmitted(), 1);
    assert_eq!(again.len(), 1, "the frame goes again");
}

#[test]
fn a_delayed_ack_is_armed_at_the_settle_unless_an_answer_carried_it() {
    let (mut client, mut mc, mut server, mut ms) = pair(64);
    let delay = Config::default().ack_delay;

    // A message nobody answers: its ack goes when the delay runs out.
    send(&mut client);
    let f = settled(&mut client, &mut mc);
    deliver(&mut server, &f, &mut ms);
    assert!(server.unsettled());
    server.settle(Instant::now());
    let due = server.poll_timeout().expect("a deadline");
    assert!(
        due <= Instant::now() + delay,
        "the ack is due within the delay"
    );
    let acks = server.stats().acks_sent;
    server.handle_timeout(due);
    let out = settled(&mut server, &mut ms);
    assert_eq!(server.stats().acks_sent, acks + 1, "{} frames", out.len());
    deliver(&mut client, &out, &mut mc);
    events(&mut client);

    // A message answered at once: the answer carries the ack, and no
    // separate one follows.
    send(&mut client);
    let f = settled(&mut client, &mut mc);
    deliver(&mut server, &f, &mut ms);
    send(&mut server);
    assert_eq!(settled(&mut server, &mut ms).len(), 1, "the answer");
    server.settle(Instant::now());
    let acks = server.stats().acks_sent;
    let later = Instant::now() + delay * 4;
    server.handle_timeout(later);
    settled(&mut server, &mut ms);
    assert_eq!(server.stats().acks_sent, acks, "no ack of its own");
}
