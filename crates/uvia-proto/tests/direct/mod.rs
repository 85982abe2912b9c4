//! Connections driven by hand, frame by frame, with no simulated network
//! between them: the memory their payloads come from and go to, and the
//! steps the tests that drive them share.

// Each test file that includes this module takes the steps it needs.
#![allow(dead_code)]

use std::time::Instant;
use uvia_proto::wire::{self, NakCode};
use uvia_proto::{Config, Conn, Event, Memory, SendKind, SendOp};

/// One buffer for every send and receive: a payload is read from and
/// written at its offset; RDMA is refused.
pub struct Buf(pub Vec<u8>);

impl Memory for Buf {
    fn read_send(&mut self, _: u32, offset: u32, buf: &mut [u8]) {
        let o = offset as usize;
        buf.copy_from_slice(&self.0[o..o + buf.len()]);
    }
    fn write_recv(&mut self, _: u32, offset: u32, data: &[u8]) -> bool {
        let o = offset as usize;
        self.0[o..o + data.len()].copy_from_slice(data);
        true
    }
    fn write_read(&mut self, _: u32, _: u32, _: &[u8]) {}
    fn check_rdma(&mut self, _: u32, _: u64, _: u32, _: bool) -> Result<(), NakCode> {
        Err(NakCode::Protection)
    }
    fn rdma_write(&mut self, _: u32, _: u64, _: &[u8]) -> Result<(), NakCode> {
        Err(NakCode::Protection)
    }
    fn rdma_read(&mut self, _: u32, _: u64, _: &mut [u8]) {}
}

/// Every frame `from` has to send now, as bytes (not settled).
pub fn built(from: &mut Conn, mem: &mut Buf) -> Vec<Vec<u8>> {
    let mut out = vec![];
    let mut b = vec![0u8; 1 << 16];
    while let Some(n) = from.poll_transmit(Instant::now(), &mut b, mem) {
        out.push(b[..n].to_vec());
    }
    out
}

/// Every frame `from` has to send now, settled once built, as a provider
/// settles once its frames are out.
pub fn settled(from: &mut Conn, mem: &mut Buf) -> Vec<Vec<u8>> {
    let out = built(from, mem);
    from.settle(Instant::now());
    out
}

/// Hands `frames` to `to`, each parsed as a checksummed frame.
pub fn deliver(to: &mut Conn, frames: &[Vec<u8>], mem: &mut Buf) {
    for f in frames {
        let (_, src, repr) = wire::parse(f).expect("a frame of the engine parses");
        to.handle_frame(Instant::now(), src, &repr, mem);
    }
}

/// Posts a send of 8 bytes; its message number.
pub fn send(c: &mut Conn) -> u32 {
    send_len(c, 8)
}

/// Posts a send of `len` bytes; its message number.
pub fn send_len(c: &mut Conn, len: u32) -> u32 {
    let op = SendOp {
        kind: SendKind::Send,
        len,
        imm: None,
    };
    c.post_send(op).expect("post send")
}

/// A client and a server on `cfg`, connected by hand (request, accept,
/// confirm), each with its memory; the server's events drained.
pub fn connected(cfg: Config, mut mc: Buf, mut ms: Buf) -> (Conn, Buf, Conn, Buf) {
    let now = Instant::now();
    let mut client = Conn::connect(now, cfg.clone(), 1, 10, b"direct");
    let req = settled(&mut client, &mut mc).remove(0);
    let Ok((_, _, wire::Repr::ConnRequest { attrs, .. })) = wire::parse(&req) else {
        panic!("the first frame is the request");
    };
    let mut server = Conn::accept(now, cfg, 2, 500, 1, attrs);
    let accept = settled(&mut server, &mut ms);
    deliver(&mut client, &accept, &mut mc);
    assert_eq!(client.poll_event(), Some(Event::Connected));
    let confirm = settled(&mut client, &mut mc);
    deliver(&mut server, &confirm, &mut ms);
    while server.poll_event().is_some() {}
    (client, mc, server, ms)
}
