//! The engine's own cost per message: two connections in one thread pass an
//! 8-byte message back and forth with no medium between them (frames are
//! parsed and handed over in memory). Prints nanoseconds per one-way message
//! (post, frame, parse, handle, complete) as the network providers run it:
//! both sides' media deliver frames intact, so data frames carry no
//! checksum (`--crc` puts the engine's CRC-32 back on every frame). Profile
//! it with `perf record` to see where the engine's time goes.
//!
//!     cargo run --release -p uvia-proto --example engine_pingpong [ROUND_TRIPS] [--crc]

use std::time::Instant;
use uvia_proto::wire::{self, NakCode};
use uvia_proto::{Config, Conn, Level, Memory, SendKind, SendOp};

/// Every message reads and writes one small buffer.
struct Buf([u8; 64]);

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

/// Moves every frame `from` has to send into `to`.
fn pass(
    from: &mut Conn,
    to: &mut Conn,
    mem_from: &mut Buf,
    mem_to: &mut Buf,
    frame: &mut [u8],
    crc: bool,
) {
    let now = Instant::now();
    while let Some(n) = from.poll_transmit(now, frame, mem_from) {
        let parsed = match crc {
            true => wire::parse(&frame[..n]),
            false => wire::parse_intact(&frame[..n]),
        };
        if let Ok((_, src, repr)) = parsed {
            to.handle_frame(now, src, &repr, mem_to);
        }
    }
    while from.poll_event().is_some() {}
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let crc = args.iter().any(|a| a == "--crc");
    let rounds: u32 = args
        .iter()
        .find_map(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let cfg = Config {
        level: Level::ReliableDelivery,
        intact: !crc,
        ..Config::default()
    };
    let now = Instant::now();
    let mut a = Conn::connect(now, cfg.clone(), 1, 100, b"bench");
    let mut frame = vec![0u8; 2048];
    let n = a
        .poll_transmit(now, &mut frame, &mut Buf([0; 64]))
        .expect("request");
    let Ok((_, _, wire::Repr::ConnRequest { attrs, .. })) = wire::parse(&frame[..n]) else {
        panic!("the first frame is a connection request");
    };
    let mut b = Conn::accept(now, cfg, 2, 900, 1, attrs);
    let (mut ma, mut mb) = (Buf([1; 64]), Buf([0; 64]));
    pass(&mut b, &mut a, &mut mb, &mut ma, &mut frame, crc);
    pass(&mut a, &mut b, &mut ma, &mut mb, &mut frame, crc);
    let op = SendOp {
        kind: SendKind::Send,
        len: 8,
        imm: None,
    };
    let start = Instant::now();
    let one_way = |x: &mut Conn, y: &mut Conn, mx: &mut Buf, my: &mut Buf, f: &mut [u8]| {
        y.post_recv(64).expect("post receive");
        x.post_send(op).expect("post send");
        pass(x, y, mx, my, f, crc);
        while y.poll_event().is_some() {}
    };
    for _ in 0..rounds {
        one_way(&mut a, &mut b, &mut ma, &mut mb, &mut frame);
        one_way(&mut b, &mut a, &mut mb, &mut ma, &mut frame);
    }
    let ns = start.elapsed().as_nanos() as f64 / (2.0 * rounds as f64);
    let frames = if crc { "checksummed" } else { "intact" };
    println!("engine one-way message (reliable delivery, 8 B, {frames} frames): {ns:.0} ns");
}
