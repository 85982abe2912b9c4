//! Writes one frame of each kind as seed inputs for the fuzz targets, and a
//! few whole exchanges for the `conn` and `endpoint` targets:
//! `cargo run -p uvia-proto --example fuzz_seeds -- crates/uvia-proto/fuzz/corpus`.

use uvia_proto::wire::{ConnAttrs, DataHeader, NakCode, Op, RejectReason, Repr, SackList};

fn main() -> std::io::Result<()> {
    let dir = std::path::PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "crates/uvia-proto/fuzz/corpus".into()),
    );
    let attrs = ConnAttrs {
        reliability: 1,
        rdma_write: true,
        rdma_read: false,
        max_frame: 1472,
        max_transfer: 1 << 20,
        initial_psn: 100,
        intact: false,
        job: 0,
        nic: 0,
    };
    let data = |op, flags, payload: &'static [u8]| Repr::Data {
        header: DataHeader {
            psn: 100,
            ack: 1000,
            msn: 0,
            op,
            flags,
            offset: 0,
            total: payload.len() as u32,
            imm: 7,
            rkey: 7,
            raddr: 0x1000,
            rsn: 0,
            done: 0,
        },
        payload,
    };
    let mut sack = SackList::default();
    sack.push(1002, 1005);
    sack.push(1009, 1010);
    let frames: Vec<(&str, Repr<'_>)> = vec![
        (
            "request",
            Repr::ConnRequest {
                attrs,
                discriminator: b"echo",
                private: b"",
            },
        ),
        (
            "accept",
            Repr::ConnAccept {
                attrs,
                private: b"",
            },
        ),
        (
            "peer-request",
            Repr::PeerRequest {
                attrs,
                discriminator: b"peer",
                private: b"",
            },
        ),
        (
            "reject",
            Repr::ConnReject {
                reason: RejectReason::NoListener,
                private: b"",
            },
        ),
        ("confirm", Repr::ConnConfirm),
        ("disconnect", Repr::Disconnect { ack: 1000, done: 0 }),
        ("disconnect-ack", Repr::DisconnectAck),
        ("send", data(Op::Send, 2 | 1, b"hello, VI")),
        ("write", data(Op::RdmaWrite, 0, b"remote bytes")),
        ("read-request", data(Op::ReadRequest, 0, b"")),
        ("read-response", data(Op::ReadResponse, 0, b"read back")),
        (
            "ack",
            Repr::Ack {
                ack: 1001,
                done: 1,
                flags: 0,
                sack,
            },
        ),
        (
            "nak",
            Repr::Nak {
                code: NakCode::ReceiverNotReady,
                psn: 101,
                ack: 1001,
            },
        ),
    ];
    std::fs::create_dir_all(dir.join("frame"))?;
    std::fs::create_dir_all(dir.join("conn"))?;
    for (name, r) in &frames {
        let mut b = vec![0u8; r.buffer_len()];
        let n = r.emit(&mut b, 5, 9);
        std::fs::write(dir.join("frame").join(name), &b[..n])?;
        // The conn target reads a level byte, then length-prefixed frames.
        let mut c = vec![1u8, n.min(255) as u8];
        c.extend_from_slice(&b[..n.min(255)]);
        std::fs::write(dir.join("conn").join(name), c)?;
    }
    // Whole exchanges for the conn target: its first byte picks the level
    // (modulo 3) and, with 0x10, a client still connecting; a zero length
    // lets 300 ms pass.
    let frame = |name: &str| {
        let (_, r) = frames.iter().find(|(n, _)| *n == name).expect("frame");
        let mut b = vec![0u8; r.buffer_len()];
        let n = r.emit(&mut b, 5, 9);
        let mut c = vec![n as u8];
        c.extend_from_slice(&b[..n]);
        c
    };
    let sessions: [(&str, u8, &[&str]); 4] = [
        (
            "session-server",
            1,
            &["send", "ack", "", "read-response", "disconnect"],
        ),
        (
            "session-reception",
            2,
            &["write", "read-request", "ack", "", "", "nak"],
        ),
        (
            "session-client",
            0x11,
            &["accept", "send", "ack", "", "disconnect-ack"],
        ),
        (
            "session-unreliable",
            0,
            &["send", "write", "", "send", "disconnect"],
        ),
    ];
    for (name, sel, parts) in sessions {
        let mut c = vec![sel];
        for p in parts {
            if p.is_empty() {
                c.push(0);
            } else {
                c.extend(frame(p));
            }
        }
        std::fs::write(dir.join("conn").join(name), c)?;
    }
    endpoint_seeds(&dir.join("endpoint"), attrs)
}

/// Exchanges for the endpoint target. A record is a control byte and, for
/// a frame, a length byte and its bytes: the control byte's low two bits
/// are the sender's address and the next two let time pass (300 ms
/// each); with 0x80 it is instead one of the listener's moves (0x80 take
/// and accept, 0x81 take and refuse, 0x82 take and hold, 0x83/0x84 accept
/// or refuse the oldest held, 0x85 the oldest connection goes, 0x86 stop or
/// start listening, 0x87 end or start the rendezvous; 0x08 picks listener
/// "b" over "a").
fn endpoint_seeds(dir: &std::path::Path, attrs: ConnAttrs) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let frame = |ctl: u8, r: Repr<'_>, dst: u32, src: u32| {
        let mut b = vec![0u8; r.buffer_len()];
        let n = r.emit(&mut b, dst, src);
        let mut c = vec![ctl, n as u8];
        c.extend_from_slice(&b[..n]);
        c
    };
    let request = |ctl, src, d: &'static [u8], private: &'static [u8]| {
        let r = Repr::ConnRequest {
            attrs,
            discriminator: d,
            private,
        };
        frame(ctl, r, 0, src)
    };
    let peer_request = |ctl, src, d: &'static [u8]| {
        let r = Repr::PeerRequest {
            attrs,
            discriminator: d,
            private: b"peer",
        };
        frame(ctl, r, 0, src)
    };
    let disconnect = |ctl, dst, src| frame(ctl, Repr::Disconnect { ack: 1, done: 0 }, dst, src);
    let seeds: [(&str, Vec<Vec<u8>>); 5] = [
        (
            "accepted",
            vec![
                request(1, 50, b"a", b"hello"),
                request(1, 50, b"a", b"hello"),
                vec![0x80],
                request(1, 50, b"a", b"hello"),
                frame(1, Repr::ConnConfirm, 10, 50),
                disconnect(1, 10, 50),
            ],
        ),
        (
            "refused",
            vec![
                request(1, 51, b"b", b""),
                vec![0x89],
                request(1, 51, b"b", b""),
                request(2, 52, b"zz", b""),
            ],
        ),
        (
            "bound",
            vec![
                request(1, 60, b"a", b""),
                request(1, 61, b"a", b""),
                vec![0x82],
                request(1, 62, b"a", b""),
                request(1, 63, b"a", b""),
                request(1 | 0x0c, 61, b"a", b""),
                request(2, 64, b"a", b""),
                vec![0x83, 0x82, 0x84],
            ],
        ),
        (
            "rendezvous",
            vec![
                peer_request(3, 70, b"p"),
                peer_request(1, 70, b"p"),
                vec![0x87],
                peer_request(3, 71, b"p"),
                vec![0x87],
                peer_request(3, 71, b"p"),
                disconnect(1, 99, 5),
            ],
        ),
        (
            "stopped",
            vec![
                request(1, 80, b"a", b""),
                vec![0x86],
                request(1, 80, b"a", b""),
                vec![0x86, 0x85, 0x85],
                request(1, 80, b"a", b""),
                frame(2, Repr::ConnConfirm, 11, 7),
            ],
        ),
    ];
    for (name, records) in seeds {
        std::fs::write(dir.join(name), records.concat())?;
    }
    Ok(())
}
