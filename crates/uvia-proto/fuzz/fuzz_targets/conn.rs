//! One engine fed arbitrary frames (aimed at it, checksums made right, so
//! the bytes reach the protocol logic) with time jumping between them: it
//! never panics, completes descriptors in posting order and each once, and
//! once closed has completed every descriptor posted.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::time::{Duration, Instant};
use uvia_proto::wire::{self, ConnAttrs, NakCode};
use uvia_proto::{Config, Conn, Event, Level, Memory, RnrPolicy, SendKind, SendOp};

struct Mem;

impl Memory for Mem {
    fn read_send(&mut self, _: u32, _: u32, buf: &mut [u8]) {
        buf.fill(7);
    }
    fn write_recv(&mut self, _: u32, _: u32, _: &[u8]) -> bool {
        true
    }
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

/// Descriptors posted and completed, checked as events come.
#[derive(Default)]
struct Book {
    sends: u32,
    recvs: u32,
    sends_done: u32,
    recvs_done: u32,
    failed: bool,
}

impl Book {
    fn post(&mut self, c: &mut Conn) {
        for cap in [4096, 4096, 0, 100] {
            if c.post_recv(cap).is_ok() {
                self.recvs += 1;
            }
        }
        let ops = [
            (SendKind::Send, 3000, Some(1)),
            (SendKind::RdmaWrite { raddr: 0, rkey: 7 }, 5000, None),
            // Overlaps the write: waits for it.
            (
                SendKind::RdmaRead {
                    raddr: 100,
                    rkey: 7,
                },
                100,
                None,
            ),
            (SendKind::Send, 0, None),
            (SendKind::RdmaWrite { raddr: 64, rkey: 8 }, 10, Some(2)),
        ];
        for (kind, len, imm) in ops {
            if c.post_send(SendOp { kind, len, imm }).is_ok() {
                self.sends += 1;
            }
        }
    }

    fn drain(&mut self, c: &mut Conn) {
        while let Some(e) = c.poll_event() {
            match e {
                Event::SendDone { msn, .. } => {
                    assert_eq!(msn, self.sends_done, "sends complete in order, once");
                    self.sends_done += 1;
                }
                Event::RecvDone { rsn, .. } => {
                    assert_eq!(rsn, self.recvs_done, "receives complete in order, once");
                    self.recvs_done += 1;
                }
                Event::Failed(_) => {
                    assert!(!self.failed, "fails once");
                    self.failed = true;
                }
                _ => {}
            }
        }
        assert!(self.sends_done <= self.sends && self.recvs_done <= self.recvs);
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
    let client = sel & 0x10 != 0;
    let cfg = Config {
        level,
        window: 64,
        rnr: if sel & 0x20 != 0 {
            RnrPolicy::Retry {
                delay: Duration::from_micros(200),
                limit: 3,
            }
        } else {
            RnrPolicy::Fail
        },
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
        intact: false,
        job: 0,
        nic: 0,
    };
    let mut c = if client {
        // A client still connecting: the handshake's paths too.
        Conn::connect(t0, cfg, 5, 1000, b"fuzz")
    } else {
        Conn::accept(t0, cfg, 5, 1000, 9, peer)
    };
    let mut mem = Mem;
    let mut book = Book::default();
    let mut posted = false;
    let mut buf = vec![0u8; 2048];
    // The input is a sequence of frames, each preceded by a length byte; a
    // zero length lets a long time pass instead (timers, keep-alives, the
    // idle timeout).
    let mut at = 0;
    let mut now = t0;
    while at < rest.len() {
        if !posted && c.is_connected() {
            book.post(&mut c);
            posted = true;
        }
        let n = rest[at] as usize;
        at += 1;
        if n == 0 {
            now += Duration::from_millis(300);
        } else {
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
        }
        book.drain(&mut c);
        if c.poll_timeout().is_some_and(|t| t <= now) {
            c.handle_timeout(now);
        }
        let mut sent = 0;
        while c.poll_transmit(now, &mut buf, &mut mem).is_some() {
            sent += 1;
            assert!(sent < 10_000, "transmission ends");
        }
        book.drain(&mut c);
    }
    // Closing completes everything that is still outstanding.
    c.close(now);
    while c.poll_transmit(now, &mut buf, &mut mem).is_some() {}
    book.drain(&mut c);
    assert_eq!(book.sends_done, book.sends, "every send completed");
    assert_eq!(book.recvs_done, book.recvs, "every receive completed");
    // And time running on ends it for good.
    for _ in 0..10 {
        now += Duration::from_secs(1);
        c.handle_timeout(now);
        while c.poll_transmit(now, &mut buf, &mut mem).is_some() {}
    }
    assert!(c.is_closed());
});
