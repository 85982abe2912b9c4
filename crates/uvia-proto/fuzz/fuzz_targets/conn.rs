//! A connected engine fed arbitrary frames (checksums fixed up so the
//! bytes reach the protocol logic) never panics, and keeps answering.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::time::{Duration, Instant};
use uvia_proto::wire::{self, ConnAttrs, NakCode};
use uvia_proto::{Config, Conn, Level, Memory, SendKind, SendOp};

struct Mem;

impl Memory for Mem {
    fn read_send(&mut self, _: u32, _: u32, buf: &mut [u8]) {
        buf.fill(7);
    }
    fn write_recv(&mut self, _: u32, _: u32, _: &[u8]) {}
    fn write_read(&mut self, _: u32, _: u32, _: &[u8]) {}
    fn check_rdma(&mut self, rkey: u32, _: u64, _: u32, _: bool) -> Result<(), NakCode> {
        if rkey == 7 {
            Ok(())
        } else {
            Err(NakCode::Protection)
        }
    }
    fn rdma_write(&mut self, rkey: u32, _: u64, _: &[u8]) -> Result<(), NakCode> {
        self.check_rdma(rkey, 0, 0, true)
    }
    fn rdma_read(&mut self, _: u32, _: u64, buf: &mut [u8]) {
        buf.fill(9);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let level = match sel % 3 {
        0 => Level::Unreliable,
        1 => Level::ReliableDelivery,
        _ => Level::ReliableReception,
    };
    let cfg = Config {
        level,
        ..Config::default()
    };
    let t0 = Instant::now();
    let peer = ConnAttrs {
        reliability: level as u8,
        rdma_write: true,
        rdma_read: true,
        max_frame: 1472,
        max_transfer: 1 << 20,
        initial_psn: 100,
    };
    let mut c = Conn::accept(t0, cfg, 5, 1000, 9, peer);
    let mut mem = Mem;
    for _ in 0..4 {
        let _ = c.post_recv(4096);
    }
    let _ = c.post_send(t0, SendOp { kind: SendKind::Send, len: 3000, imm: Some(1) });
    let _ = c.post_send(
        t0,
        SendOp { kind: SendKind::RdmaRead { raddr: 0, rkey: 7 }, len: 100, imm: None },
    );
    let mut buf = vec![0u8; 2048];
    // The input is a sequence of frames, each preceded by a length byte.
    let mut at = 0;
    let mut now = t0;
    while at < rest.len() {
        let n = rest[at] as usize;
        at += 1;
        let end = (at + n).min(rest.len());
        let mut f = rest[at..end].to_vec();
        at = end;
        if f.len() >= wire::HEADER_LEN {
            // Aim it at this connection and make the checksum right.
            f[0] = wire::VERSION;
            f[4..8].copy_from_slice(&5u32.to_be_bytes());
            f[8..12].copy_from_slice(&9u32.to_be_bytes());
            wire::fill_checksum(&mut f);
        }
        if let Ok((_, src, repr)) = wire::parse(&f) {
            c.handle_frame(now, src, &repr, &mut mem);
        }
        now += Duration::from_micros(n as u64 * 37);
        if c.poll_timeout().is_some_and(|t| t <= now) {
            c.handle_timeout(now);
        }
        while c.poll_transmit(now, &mut buf, &mut mem).is_some() {}
        while c.poll_event().is_some() {}
    }
});
