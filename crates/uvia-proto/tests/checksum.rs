//! The checksum is left out only toward a side whose medium delivers frames
//! intact: that side announces it in its attributes and parses with
//! `parse_intact`; the other side keeps getting checksummed frames, and a
//! frame corrupted on its way is still refused there.

use direct::{built, send, Buf};
use std::time::Instant;
use uvia_proto::wire::{self, Repr, WireError};
use uvia_proto::{Config, Conn, Event, Level, Outcome};

mod direct;

fn config(intact: bool) -> Config {
    Config {
        level: Level::ReliableDelivery,
        intact,
        ..Config::default()
    }
}

/// Hands `f` to `to`, parsed the way its side parses.
fn deliver(to: &mut Conn, intact: bool, f: &[u8], mem: &mut Buf) -> Result<(), WireError> {
    let (_, src, repr) = if intact {
        wire::parse_intact(f)?
    } else {
        wire::parse(f)?
    };
    to.handle_frame(Instant::now(), src, &repr, mem);
    Ok(())
}

#[test]
fn data_frames_skip_the_checksum_only_toward_an_intact_medium() {
    // The client's medium checks frames itself; the server's does not.
    let now = Instant::now();
    let mut client = Conn::connect(now, config(true), 1, 10, b"crc");
    let (mut mc, mut ms) = (Buf(vec![1; 8]), Buf(vec![2; 8]));
    let req = built(&mut client, &mut mc).remove(0);
    let Ok((_, _, Repr::ConnRequest { attrs, .. })) = wire::parse(&req) else {
        panic!("a handshake frame always carries its checksum");
    };
    assert!(attrs.intact, "the client announces its medium");
    let mut server = Conn::accept(now, config(false), 2, 500, 1, attrs);
    for f in built(&mut server, &mut ms) {
        deliver(&mut client, true, &f, &mut mc).expect("the accept parses");
    }
    assert_eq!(client.poll_event(), Some(Event::Connected));

    // Server to client: the checksum is left out (zero), which only the
    // intact parse accepts.
    client.post_recv(8).expect("post receive");
    send(&mut server);
    let out = built(&mut server, &mut ms);
    let data = out.last().expect("a data frame").clone();
    assert_eq!(&data[12..16], &[0; 4], "no checksum toward the client");
    assert_eq!(wire::parse(&data).err(), Some(WireError::Checksum));
    for f in &out {
        deliver(&mut client, true, f, &mut mc).expect("parses intact");
    }
    assert!(matches!(
        client.poll_event(),
        Some(Event::RecvDone {
            len: 8,
            outcome: Outcome::Ok,
            ..
        })
    ));
    assert_eq!(mc.0, vec![2; 8]);

    // Client to server: checksummed, and a flipped bit is refused there.
    server.post_recv(8).expect("post receive");
    mc.0 = vec![3; 8];
    send(&mut client);
    let out = built(&mut client, &mut mc);
    let data = out.last().expect("a data frame").clone();
    assert_ne!(&data[12..16], &[0; 4]);
    let mut bad = data.clone();
    bad[70] ^= 0x10;
    assert_eq!(
        deliver(&mut server, false, &bad, &mut ms),
        Err(WireError::Checksum)
    );
    for f in &out {
        deliver(&mut server, false, f, &mut ms).expect("a checksummed frame");
    }
    let got: Vec<Event> = std::iter::from_fn(|| server.poll_event()).collect();
    assert!(
        got.iter().any(|e| matches!(
            e,
            Event::RecvDone {
                len: 8,
                outcome: Outcome::Ok,
                ..
            }
        )),
        "{got:?}"
    );
    assert_eq!(ms.0, vec![3; 8]);
}
