//! One endpoint with two listeners, live connections and a peer-to-peer
//! rendezvous, fed arbitrary frames from a few addresses (some aimed and
//! resealed so they reach the logic) between the listener's own moves
//! (take, accept, refuse, hold, stop), with time jumping. It never panics;
//! a reply fits its buffer and parses; every frame it hands on names a live
//! connection of the address it came from; no listener holds more than its
//! bound; a request waiting for its answer is never queued a second time
//! (unless its client fell silent long enough to be forgotten).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use uvia_proto::wire::{self, RejectReason, Repr};
use uvia_proto::{Endpoint, EndpointConfig, EndpointEvent, Incoming, PrivateData};

const LISTENERS: [&[u8]; 2] = [b"a", b"b"];
const RENDEZVOUS: &[u8] = b"p";
/// Connection ids a resealed frame may be aimed at (0: a request).
const AIMS: [u32; 4] = [0, 10, 11, 12];

/// What the harness knows the endpoint should hold.
struct Model {
    /// Live connection ids and their peer's address.
    live: HashMap<u32, u8>,
    /// Requests queued or taken and not answered: (address, client id) ->
    /// (listener, when it or a repetition came).
    outstanding: HashMap<(u8, u32), (Vec<u8>, Instant)>,
    /// Requests taken and not answered yet.
    taken: Vec<Incoming<u8>>,
}

fuzz_target!(|data: &[u8]| {
    let cfg = EndpointConfig {
        max_pending: 3,
        max_rejects: 4,
        id_seed: 100,
        ..EndpointConfig::default()
    };
    let (bound, timeout) = (cfg.max_pending, cfg.pending_timeout);
    let mut ep = Endpoint::<u8>::new(cfg);
    let mut m = Model {
        live: HashMap::new(),
        outstanding: HashMap::new(),
        taken: vec![],
    };
    for (id, peer) in [(10, 1), (11, 2), (12, 3)] {
        ep.register(id, peer);
        m.live.insert(id, peer);
    }
    assert!(ep.established(2, 7, 11));
    ep.peer_connect(RENDEZVOUS, 3, 12).expect("free");
    let mut rendezvous = true;
    let mut listening = [true, true];
    for d in LISTENERS {
        ep.listen(d);
    }
    let mut now = Instant::now();
    let mut reply = [0u8; wire::MAX_REPLY_LEN];
    let mut out = [0u8; wire::MAX_REPLY_LEN];
    let mut at = 0;
    // Records: a control byte, then for a frame a length byte and the bytes.
    while at < data.len() {
        let ctl = data[at];
        at += 1;
        if ctl & 0x80 != 0 {
            act(
                ctl & 0x7f,
                &mut ep,
                &mut m,
                &mut listening,
                &mut rendezvous,
                &mut out,
            );
            continue;
        }
        let from = ctl & 3;
        now += Duration::from_millis(300) * ((ctl >> 2) & 3) as u32;
        let Some(&n) = data.get(at) else {
            break;
        };
        at += 1;
        let end = (at + n as usize).min(data.len());
        let mut f = data[at..end].to_vec();
        at = end;
        if ctl & 0x10 != 0 && f.len() >= wire::HEADER_LEN {
            // Aimed and resealed: past the checksum, at a known id.
            f[0] = wire::VERSION;
            f[1] = 1 + f[1] % 10;
            let aim = AIMS[(ctl >> 5) as usize & 3];
            f[4..8].copy_from_slice(&aim.to_be_bytes());
            wire::fill_checksum(&mut f);
        }
        let request = match wire::parse(&f) {
            Ok((0, src, Repr::ConnRequest { discriminator, .. })) => {
                Some(((from, src), discriminator.to_vec()))
            }
            _ => None,
        };
        // Held by the endpoint, as far as the harness can tell: queued or
        // taken, unanswered, and its client asked within the timeout (a
        // request silent longer may have been forgotten to make room).
        let held = request.as_ref().is_some_and(|(key, _)| {
            m.outstanding
                .get(key)
                .is_some_and(|(_, heard)| now.saturating_duration_since(*heard) < timeout)
        });
        let ev = ep.handle(now, from, &f, &mut reply);
        match ev {
            Some(EndpointEvent::Frame { id, .. }) => {
                assert_eq!(
                    m.live.get(&id),
                    Some(&from),
                    "a live connection of that address"
                );
            }
            Some(EndpointEvent::Transmit { to, len }) => {
                assert!(len <= reply.len());
                assert_eq!(to, from);
                let parsed = wire::parse(&reply[..len]).map(|(_, _, r)| r);
                assert!(
                    matches!(parsed, Ok(Repr::ConnReject { .. } | Repr::DisconnectAck)),
                    "{parsed:?}"
                );
                if let Some((key, _)) = &request {
                    assert!(!held, "a request held is not refused");
                    m.outstanding.remove(key);
                }
            }
            Some(EndpointEvent::Request { discriminator }) => {
                let (key, d) = request.clone().expect("only a request queues");
                assert_eq!(discriminator, &d[..]);
                assert!(!held, "queued twice while its client still asks");
                // Forgotten and queued anew: the copy taken before is stale.
                m.taken.retain(|r| (r.from, r.peer_id) != key);
                m.outstanding.insert(key, (d, now));
            }
            Some(EndpointEvent::Forward { .. }) => {
                panic!("nothing is forwarded: no process shares the address")
            }
            None => {
                if let Some(o) = request.and_then(|(key, _)| m.outstanding.get_mut(&key)) {
                    // A repetition of a request held: the client still asks.
                    o.1 = now;
                }
            }
        }
        for d in LISTENERS {
            assert!(ep.pending(d) <= bound, "a listener holds at most its bound");
        }
    }
});

/// The listener's and the application's moves.
fn act(
    op: u8,
    ep: &mut Endpoint<u8>,
    m: &mut Model,
    listening: &mut [bool; 2],
    rendezvous: &mut bool,
    out: &mut [u8],
) {
    let d = LISTENERS[(op >> 3) as usize & 1];
    match op & 7 {
        // Take a request and accept it.
        0 => {
            if let Some(req) = ep.take_request(d) {
                accept(ep, m, &req);
            }
        }
        // Take a request and refuse it.
        1 => {
            if let Some(req) = ep.take_request(d) {
                refuse(ep, m, &req, out);
            }
        }
        // Take a request and think about it.
        2 => {
            if let Some(req) = ep.take_request(d) {
                m.taken.push(req);
            }
        }
        // Answer the oldest request thought about.
        3 | 4 => {
            if !m.taken.is_empty() {
                let req = m.taken.remove(0);
                match op & 7 {
                    3 => accept(ep, m, &req),
                    _ => refuse(ep, m, &req, out),
                }
            }
        }
        // The oldest connection goes.
        5 => {
            if let Some(&id) = m.live.keys().min() {
                ep.unregister(id);
                m.live.remove(&id);
            }
        }
        // A listener stops, or starts again.
        6 => {
            let i = (op >> 3) as usize & 1;
            if listening[i] {
                ep.stop_listening(d);
                m.outstanding.retain(|_, (l, _)| l != d);
            } else {
                ep.listen(d);
            }
            listening[i] = !listening[i];
        }
        // The rendezvous ends, or starts again (its connection may be gone).
        _ => {
            if *rendezvous {
                ep.peer_done(RENDEZVOUS);
            } else {
                ep.peer_connect(RENDEZVOUS, 3, 12).expect("ended before");
            }
            *rendezvous = !*rendezvous;
        }
    }
}

fn accept(ep: &mut Endpoint<u8>, m: &mut Model, req: &Incoming<u8>) {
    let id = ep.new_id();
    assert!(id != 0 && !m.live.contains_key(&id), "a fresh id");
    ep.register(id, req.from);
    assert!(ep.established(req.from, req.peer_id, id));
    m.live.insert(id, req.from);
    m.outstanding.remove(&(req.from, req.peer_id));
}

fn refuse(ep: &mut Endpoint<u8>, m: &mut Model, req: &Incoming<u8>, out: &mut [u8]) {
    let private = PrivateData::new(b"no").expect("short");
    let n = ep.reject(req, RejectReason::Refused, &private, out);
    let parsed = wire::parse(&out[..n]).map(|(_, _, r)| r);
    assert_eq!(
        parsed,
        Ok(Repr::ConnReject {
            reason: RejectReason::Refused,
            private: b"no",
        })
    );
    m.outstanding.remove(&(req.from, req.peer_id));
}
