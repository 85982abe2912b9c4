//! A single-producer single-consumer ring of 64-byte lines in shared memory.
//!
//! A record is a small header (stamp, length) and a body, laid over whole
//! lines; a small message is one line, so the consumer sees it with a single
//! cache-line transfer. The producer builds the body in place and publishes it
//! by storing the stamp last; the consumer waits for the stamp it expects at its
//! position, so there is no shared head index at all. The consumer's index
//! (`tail`) lives on its own line and the producer reads it only when its cached
//! copy says the ring is full. A record never wraps: when it would, the
//! producer fills the rest of the ring with a pad record.
//!
//! The bytes come from another process and are not trusted: a length that does
//! not fit the ring is reported as [`Corrupt`], never followed.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Size of one ring line; records occupy whole lines.
pub const LINE: usize = 64;
/// Bytes of the record header at the start of each record's first line.
pub const RECORD_HEADER: usize = 8;
/// Length value of a pad record: skip to the end of the ring.
const PAD: u32 = u32::MAX;

/// The shared part of a ring that is not lines: the consumer's index, alone
/// on a 128-byte block (two lines, so the adjacent-line prefetcher does not
/// pull it together with a neighbour).
#[repr(C, align(128))]
pub struct RingHeader {
    tail: AtomicU64,
}

/// Alignment the ring memory must have.
pub const RING_ALIGN: usize = std::mem::align_of::<RingHeader>();

#[repr(C)]
struct RecordHeader {
    stamp: AtomicU32,
    len: AtomicU32,
}

/// The stamp a record starting at line index `pos` carries. Never zero on the
/// first lap, so zero-filled memory reads as empty; on later laps a stale
/// stamp differs because the ring is far smaller than 2^32 lines.
#[inline(always)]
fn stamp_for(pos: u64) -> u32 {
    (pos as u32).wrapping_add(1)
}

#[inline(always)]
fn lines_for(body_len: usize) -> u64 {
    (RECORD_HEADER + body_len).div_ceil(LINE) as u64
}

/// Bytes a ring of `nlines` lines needs, header included.
pub fn ring_bytes(nlines: usize) -> usize {
    std::mem::size_of::<RingHeader>() + nlines * LINE
}

/// The consumer found bytes that cannot be a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("corrupt ring record at line {pos}: length {len} does not fit")]
pub struct Corrupt {
    pub pos: u64,
    pub len: u32,
}

struct Shared {
    header: *const RingHeader,
    lines: *mut u8,
    nlines: u64,
}

impl Shared {
    /// # Safety
    /// `base` points to `ring_bytes(nlines)` bytes of memory aligned to a line,
    /// zero-filled before first use and alive as long as the returned value.
    unsafe fn new(base: *mut u8, nlines: usize) -> Shared {
        assert!(
            nlines.is_power_of_two() && nlines >= 4,
            "ring lines must be a power of two >= 4"
        );
        assert_eq!(
            base as usize % RING_ALIGN,
            0,
            "ring memory must be aligned to RING_ALIGN"
        );
        Shared {
            header: base as *const RingHeader,
            // SAFETY: the caller guarantees the lines follow the header.
            lines: unsafe { base.add(std::mem::size_of::<RingHeader>()) },
            nlines: nlines as u64,
        }
    }

    fn tail(&self) -> &AtomicU64 {
        // SAFETY: `header` is valid for the life of `self` (constructor contract).
        unsafe { &(*self.header).tail }
    }

    /// The record header at line index `pos`.
    #[inline(always)]
    fn record(&self, pos: u64) -> &RecordHeader {
        let off = ((pos & (self.nlines - 1)) as usize) * LINE;
        // SAFETY: `off` is inside the line array and line aligned.
        unsafe { &*(self.lines.add(off) as *const RecordHeader) }
    }

    #[inline(always)]
    fn body(&self, pos: u64) -> *mut u8 {
        let off = ((pos & (self.nlines - 1)) as usize) * LINE + RECORD_HEADER;
        // SAFETY: inside the line array.
        unsafe { self.lines.add(off) }
    }
}

/// The writing end of a ring. Not shared between threads.
pub struct Producer {
    ring: Shared,
    head: u64,
    cached_tail: u64,
    /// Lines the reserved-but-unpublished record takes (0: none).
    reserved: u64,
}

// SAFETY: the producer is the only writer of its lines; moving it to another
// thread moves that role with it.
unsafe impl Send for Producer {}

impl Producer {
    /// # Safety
    /// As for the ring memory: `base` is `ring_bytes(nlines)` line-aligned
    /// bytes, zero-filled before either end first uses it, alive while the
    /// producer is, and written by no other producer.
    pub unsafe fn new(base: *mut u8, nlines: usize) -> Producer {
        // SAFETY: forwarded from the caller.
        let ring = unsafe { Shared::new(base, nlines) };
        Producer {
            ring,
            head: 0,
            cached_tail: 0,
            reserved: 0,
        }
    }

    /// Largest body a single record may carry: half the ring, so that a
    /// record plus the pad before it always fits in an empty ring.
    pub fn max_body(&self) -> usize {
        (self.ring.nlines as usize / 2) * LINE - RECORD_HEADER
    }

    /// Line index just past the last published record.
    #[inline]
    pub fn head(&self) -> u64 {
        self.head
    }

    /// The consumer's index: every record ending at or before it is consumed.
    pub fn consumed(&self) -> u64 {
        // Acquire: what the consumer did before releasing (for example writing
        // a reply that tells of an error) is visible once we see its index.
        self.ring.tail().load(Ordering::Acquire)
    }

    /// Reserves a record with a body of `len` bytes and returns a pointer to
    /// the body, or `None` while the ring is full. `len` must not exceed
    /// [`max_body`](Self::max_body). The record is invisible to the consumer
    /// until [`commit`](Self::commit).
    #[inline(always)]
    pub fn reserve(&mut self, len: usize) -> Option<*mut u8> {
        debug_assert!(len <= self.max_body());
        debug_assert_eq!(self.reserved, 0, "reserve twice without commit");
        let lines = lines_for(len);
        let nlines = self.ring.nlines;
        // The common case in a few instructions: the record fits before
        // the ring's end (no pad) in room the consumer is known to have left.
        if (self.head & (nlines - 1)) + lines <= nlines
            && self.head + lines - self.cached_tail <= nlines
        {
            self.reserved = lines;
            let rec = self.ring.record(self.head);
            rec.len.store(len as u32, Ordering::Relaxed);
            return Some(self.ring.body(self.head));
        }
        self.reserve_slow(len, lines)
    }

    /// [`reserve`](Self::reserve) when the record needs a pad before it or
    /// the cached consumer index says the ring may be full.
    #[cold]
    fn reserve_slow(&mut self, len: usize, lines: u64) -> Option<*mut u8> {
        let at = self.head & (self.ring.nlines - 1);
        let pad = if at + lines > self.ring.nlines {
            self.ring.nlines - at
        } else {
            0
        };
        let need = self.head + pad + lines;
        if need - self.cached_tail > self.ring.nlines {
            self.cached_tail = self.consumed();
            if need - self.cached_tail > self.ring.nlines {
                return None;
            }
        }
        if pad > 0 {
            let rec = self.ring.record(self.head);
            rec.len.store(PAD, Ordering::Relaxed);
            // Release: the pad's length is visible before its stamp.
            rec.stamp.store(stamp_for(self.head), Ordering::Release);
            self.head += pad;
        }
        self.reserved = lines;
        self.ring
            .record(self.head)
            .len
            .store(len as u32, Ordering::Relaxed);
        Some(self.ring.body(self.head))
    }

    /// Publishes the record reserved last.
    #[inline(always)]
    pub fn commit(&mut self) {
        debug_assert!(self.reserved > 0, "commit without reserve");
        // Release: the body written through the reserved pointer is visible
        // to a consumer that reads this stamp with Acquire.
        self.ring
            .record(self.head)
            .stamp
            .store(stamp_for(self.head), Ordering::Release);
        self.head += self.reserved;
        self.reserved = 0;
    }

    /// Copies `body` into a new record and publishes it; `false` if full.
    pub fn push(&mut self, body: &[u8]) -> bool {
        match self.reserve(body.len()) {
            Some(p) => {
                // SAFETY: `reserve` returned room for `body.len()` bytes.
                unsafe { std::ptr::copy_nonoverlapping(body.as_ptr(), p, body.len()) };
                self.commit();
                true
            }
            None => false,
        }
    }
}

/// A record the consumer is looking at.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    body: *const u8,
    len: usize,
    /// Line index just past this record.
    pub end: u64,
}

impl Record {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pointer to the body; valid until the consumer releases the record.
    pub fn as_ptr(&self) -> *const u8 {
        self.body
    }

    /// Copies `dst.len()` bytes starting at `offset` of the body out.
    /// Panics if the range is outside the body.
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        assert!(offset + dst.len() <= self.len, "read past the record body");
        // SAFETY: in bounds of the body, which stays valid until release.
        unsafe {
            std::ptr::copy_nonoverlapping(self.body.add(offset), dst.as_mut_ptr(), dst.len())
        };
    }
}

/// The reading end of a ring. Not shared between threads.
pub struct Consumer {
    ring: Shared,
    pos: u64,
}

// SAFETY: the consumer is the only reader that releases lines; moving it to
// another thread moves that role with it.
unsafe impl Send for Consumer {}

impl Consumer {
    /// # Safety
    /// As for [`Producer::new`], with "read by no other consumer".
    pub unsafe fn new(base: *mut u8, nlines: usize) -> Consumer {
        // SAFETY: forwarded from the caller.
        let ring = unsafe { Shared::new(base, nlines) };
        Consumer { ring, pos: 0 }
    }

    /// True when a record (or pad) is waiting. One load; for spin loops.
    #[inline]
    pub fn ready(&self) -> bool {
        self.ring.record(self.pos).stamp.load(Ordering::Relaxed) == stamp_for(self.pos)
    }

    /// The next record, if one has been published. Calling it again without
    /// `release` returns the same record.
    #[inline(always)]
    pub fn peek(&mut self) -> Result<Option<Record>, Corrupt> {
        loop {
            let rec = self.ring.record(self.pos);
            // Acquire: pairs with the producer's Release of the stamp, so the
            // length and body written before it are visible.
            if rec.stamp.load(Ordering::Acquire) != stamp_for(self.pos) {
                return Ok(None);
            }
            let len = rec.len.load(Ordering::Relaxed);
            let at = self.pos & (self.ring.nlines - 1);
            if len == PAD {
                self.pos += self.ring.nlines - at;
                continue;
            }
            let lines = lines_for(len as usize);
            if at + lines > self.ring.nlines {
                return Err(Corrupt { pos: self.pos, len });
            }
            return Ok(Some(Record {
                body: self.ring.body(self.pos),
                len: len as usize,
                end: self.pos + lines,
            }));
        }
    }

    /// Gives the lines of `rec` (and any pad before it) back to the producer.
    #[inline(always)]
    pub fn release(&mut self, rec: Record) {
        self.pos = rec.end;
        // Release: our reads of the body (and anything we wrote before, such
        // as a reply) happen before the producer may reuse the lines.
        self.ring.tail().store(self.pos, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C, align(128))]
    struct Mem([u8; 128 + 16 * 64]);

    fn ring() -> (Box<Mem>, Producer, Consumer) {
        let mut m = Box::new(Mem([0; 128 + 16 * 64]));
        let base = m.0.as_mut_ptr();
        // SAFETY: the memory is zeroed, aligned, sized for 16 lines and outlives both ends in the test.
        let (p, c) = unsafe { (Producer::new(base, 16), Consumer::new(base, 16)) };
        (m, p, c)
    }

    #[test]
    fn push_peek_release_in_order_across_wrap() {
        let (_m, mut p, mut c) = ring();
        for round in 0u8..200 {
            let len = (round as usize * 37) % (p.max_body() + 1);
            let body: Vec<u8> = (0..len).map(|i| round.wrapping_add(i as u8)).collect();
            assert!(p.push(&body), "room in an empty ring, round {round}");
            let rec = c.peek().unwrap().expect("record published");
            assert_eq!(rec.len(), len);
            let mut out = vec![0; len];
            rec.read(0, &mut out);
            assert_eq!(out, body);
            c.release(rec);
            assert!(c.peek().unwrap().is_none());
        }
    }

    #[test]
    fn full_ring_refuses_until_released() {
        let (_m, mut p, mut c) = ring();
        let mut n = 0;
        while p.push(&[7; 56]) {
            n += 1;
        }
        assert_eq!(n, 16, "one-line records fill every line");
        let rec = c.peek().unwrap().unwrap();
        c.release(rec);
        assert!(p.push(&[8; 56]));
        assert!(!p.push(&[9; 1]));
    }

    #[test]
    fn unpublished_record_is_invisible() {
        let (_m, mut p, c) = ring();
        let b = p.reserve(10).unwrap();
        // SAFETY: 10 bytes reserved.
        unsafe { std::ptr::write_bytes(b, 1, 10) };
        assert!(!c.ready());
        p.commit();
        assert!(c.ready());
    }

    #[test]
    fn corrupt_length_is_reported_not_followed() {
        let (mut m, _p, mut c) = ring();
        // A peer writes a record claiming more lines than the ring holds.
        let hdr = &mut m.0[128..136];
        hdr[0..4].copy_from_slice(&1u32.to_ne_bytes());
        hdr[4..8].copy_from_slice(&5000u32.to_ne_bytes());
        assert_eq!(c.peek().unwrap_err(), Corrupt { pos: 0, len: 5000 });
    }

    #[test]
    fn two_threads_stream_in_order() {
        let (m, mut p, mut c) = ring();
        const N: u32 = 200_000;
        let t = std::thread::spawn(move || {
            for i in 0..N {
                let len = 4 + (i as usize % 100);
                let mut body = vec![0u8; len];
                body[..4].copy_from_slice(&i.to_ne_bytes());
                while !p.push(&body) {
                    std::hint::spin_loop();
                }
            }
        });
        for i in 0..N {
            let rec = loop {
                if let Some(r) = c.peek().unwrap() {
                    break r;
                }
                std::hint::spin_loop();
            };
            assert_eq!(rec.len(), 4 + (i as usize % 100));
            let mut v = [0u8; 4];
            rec.read(0, &mut v);
            assert_eq!(u32::from_ne_bytes(v), i);
            c.release(rec);
        }
        t.join().unwrap();
        drop(m);
    }
}
