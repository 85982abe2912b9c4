//! The `shm` provider: VIs between processes of one host.
//!
//! A connection is one memfd segment created by the client and passed to the
//! server over the rendezvous socket. It holds a header, one control block per
//! side (a doorbell to wake that side, an error report, a closed flag) and two
//! rings of cache lines, one per direction. A message is one ring record:
//! a small header and either the data itself (inline, built in place by the
//! sender) or, for large transfers, the sender's address ranges, which the
//! receiver copies in one step from its mapping of the sender's region
//! (from [`SHARE_COPY_FROM`] on, sharing the chunks of that copy with a
//! sender that polls, [`Help`]). A
//! large message from memory the peer cannot map goes through the ring in
//! pieces instead, the sender copying the next piece in while the receiver
//! copies the last one out. This module owns the layout and the message
//! format; the VI logic that drives it is in `vi`.

use crate::desc::{MemHandle, MAX_SEGMENTS};
use crate::vi::Source;
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use uvia_shm::cma::{LocalRange, RemoteRange};
use uvia_shm::{
    ring_bytes, Consumer, Doorbell, PeerEventfd, Producer, Segment, Stream, RING_ALIGN,
};

pub(crate) const SEG_MAGIC: u64 = u64::from_le_bytes(*b"UVIA-SHM");
pub(crate) const VERSION: u8 = 5;
/// Lines per ring direction (64 KiB).
pub(crate) const RING_LINES: usize = 1024;
/// Largest payload sent inline; larger ones go by reference (one copy).
/// Measured crossover: from 1 KiB up the single copy out of a shared
/// mapping beats two copies through the ring (docs/DESIGN.md).
pub(crate) const INLINE_MAX: usize = 512;
/// Largest payload sent inline when the peer cannot map its memory
/// (memory the caller registered, not a region the Nic allocated): by
/// reference that would be a cross-memory-attach system call per message,
/// about 1.5 us here even at 4 KiB, where two copies through the ring take
/// a fraction of that. A quarter of the ring, so a stream keeps several in
/// flight.
pub(crate) const INLINE_MAX_UNMAPPED: usize = 16 << 10;
/// Smallest message from memory the peer cannot map that goes through the
/// ring in pieces ([`flag::FRAG`]) rather than by cross-memory attach.
/// Measured with `fi_pingpong -e msg` on shm (malloc'd buffers, interleaved
/// runs): by cross-memory attach 3.8–5.2 us at 32 KiB, 8.0–8.6 at 64 KiB and
/// 26–29 at 256 KiB against 5.6–6.1, 9.6–10.0 and 29–30 in pieces, even at
/// 512 KiB, and in pieces 1.1–1.2x faster at 1 MiB, 1.4x at 2 and 4 MiB.
/// (The receiver's one copy reads source lines a ping-pong leaves in its
/// caches; pieces cross between the cores every time, but the system call
/// pins every page, which costs more once the message outgrows the caches.)
pub(crate) const PIECES_FROM: usize = 512 << 10;
/// Payload bytes of one piece of a message sent in pieces ([`flag::FRAG`]):
/// a quarter of the ring, so the sender writes the next pieces while the
/// receiver copies one out, and each piece's copy stays in the caches the
/// two cores share.
pub(crate) const PIECE: usize = 16 << 10;
/// Largest region shared with the peer by mapping (larger ones are copied
/// by cross-memory attach). Peer regions are mapped lazily, so this bounds
/// the address space a peer can make this side reserve per region.
pub(crate) const MAX_SHARED_REGION: usize = 64 << 30;
/// Most peer regions mapped at once on one connection.
pub(crate) const MAX_PEER_REGIONS: usize = 4096;
/// Smallest by-reference message whose copy the receiver shares with the
/// sender ([`Help`]). Measured with `uvia bw -p shm`, alternated with the
/// receiver copying alone: 256 KiB 0.91–1.04x (its copy stays in the
/// caches), 512 KiB 1.05–1.26x, 1 MiB 1.75–2.2x, 2 MiB 1.8–2.0x.
pub(crate) const SHARE_COPY_FROM: usize = 512 << 10;
/// Longest the receiver waits for the chunks the sender claimed in a
/// shared copy before it copies them itself, as for a sender stopped: a
/// chunk takes well under a millisecond, so only a sender that claims and
/// never copies (faulty or hostile) is waited for this long, where the
/// wait once lasted as long as the sender lived. A sender that was merely
/// late by a second would write the same bytes after the receive
/// completed, as a stopped one that resumes would.
const HELP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);
/// Least bytes of one chunk of a shared copy (a chunk is at least a
/// [`MAX_CHUNKS`]th of the message) where the sender writes its chunks by
/// cross-memory attach. With 16 KiB chunks the claims cost more than they
/// balance: 1 MiB 1.3–1.6x, not 1.75–2.2x.
const SHARE_CHUNK: usize = 64 << 10;
/// The same where the sender writes its chunks into a mapping of the
/// receive (a memfd). Each claim moves the offer's line between the two
/// cores, and on a host whose cores copy 512 KiB in 3 us that trip is a
/// share of a chunk's copy: `uvia pingpong -p shm`, 64 KiB / 256 KiB
/// chunks alternated, 3 rounds, one-way p50: 512 KiB 3.4–3.8 / 3.1 us,
/// 1 MiB 8.8–10.0 / 8.2–8.3 us, 2 MiB 17.7–18.1 / 16.8 us (128 KiB in
/// between); `uvia bw` 512 KiB 181–193 / 211–217 GB/s.
const SHARE_CHUNK_MAPPED: usize = 256 << 10;
/// Most chunks of one shared copy: their bits share a word with the offer
/// they belong to ([`Help::done`]).
const MAX_CHUNKS: usize = 32;

/// What side X of a connection observes; written by the other side.
#[repr(C, align(128))]
pub(crate) struct SideBlock {
    /// Rung by the peer after it publishes something X may wait for.
    pub bell: Doorbell,
    /// `(id << 32) | status bits` of the first message of X's that failed at the peer.
    pub error: AtomicU64,
    /// Set by the peer when it disconnects.
    pub closed: AtomicU32,
    /// Set by the peer when it has waited for X to consume its messages and
    /// asks X's agent to serve them (`agent`); cleared by the agent.
    pub want: AtomicU32,
    /// X's offer to the peer to copy part of the large message X is taking.
    pub help: Help,
    /// Set by the peer while it writes into X's memory itself ([`Grants`]).
    pub busy: Busy,
    /// The peer's grants to X of its memory ([`Grants`]).
    pub grants: Grants,
}

/// Set by the initiator while it writes into the target's memory, on a
/// line of its own: the initiator keeps it in its cache.
#[repr(C, align(128))]
pub(crate) struct Busy {
    pub busy: AtomicU32,
    /// Set once by an initiator that writes `busy` with a plain store and
    /// leaves the barrier to the withdrawal ([`fence`]).
    pub light: AtomicU32,
}

/// The asymmetric barrier of direct writes ([`Grants`]): an initiator
/// registered for `membarrier(2)`'s global expedited barriers sets `busy`
/// with a plain store and reads `revoked` with no barrier between (a
/// locked exchange there cost about 6 ns a write, a fifth of the post); a
/// withdrawal then runs the barrier on every CPU that runs such a process,
/// between its `revoked` and its read of `busy`. The pattern of user-space
/// read-copy-update. Where the kernel lacks the command, the initiator
/// keeps the locked exchange.
pub(crate) mod fence {
    use crate::membarrier::{self, Scope};

    /// Registers this process for global expedited barriers, once; true
    /// when the kernel has them.
    pub fn register() -> bool {
        membarrier::register(Scope::Global)
    }

    /// A full barrier on every CPU running a registered process.
    pub fn global() {
        membarrier::run(Scope::Global)
    }
}

/// RDMA writes placed by the initiator: a target that has placed an RDMA
/// write into one of its regions from the ring, and may let the peer place
/// the next ones itself, grants the region (its memfd, writable, with the
/// window of target addresses it holds) over the rendezvous socket, once
/// per connection. The initiator then writes an RDMA write into that window
/// directly and completes it at once, while the target computes or sleeps,
/// as a NIC would; the target's protection checks were made when it granted
/// (region registered, its tag the VI's, RDMA write enabled on both).
///
/// Withdrawing (a region deregistered or changed, the VI disconnected): the
/// target adds one to the initiator's [`Grants::revoked`] and then waits for
/// [`Busy::busy`] to clear; the initiator sets `busy` and then reads
/// `revoked` before it writes. With a full barrier between the store and
/// the load on each side (a sequentially consistent read-modify-write, or
/// on the initiator's side the withdrawal's [`fence`]), either the
/// initiator sees the withdrawal and goes through the ring (where the
/// target checks), or the target sees it busy and waits for the write to
/// end, however long the peer is stopped in the middle of it (a dead peer
/// ends the wait): no direct write lands after the withdrawal returns.
///
/// These words are the target's, on a line the initiator only reads.
#[repr(C, align(128))]
pub(crate) struct Grants {
    /// Grant messages the target has sent on the socket.
    pub sent: AtomicU32,
    /// Withdrawals of every grant so far.
    pub revoked: AtomicU32,
}

/// A receiver's offer to the sender to copy chunks of one large message
/// into the receive buffer itself, while the receiver copies the others
/// ([`ShmConn::gather_shared`]). Written by the receiver; the sender claims
/// chunks from its progress, so a sender that polls for its send's
/// completion lends its core to the copy, and one that sleeps or computes
/// costs the receiver one compare-and-swap a chunk.
#[repr(C, align(128))]
pub(crate) struct Help {
    /// `(offer << 32) | next chunk`, opened by the receiver and claimed by
    /// both sides with a compare-and-swap, so that a claim names its offer
    /// and the fields below stay as they are while a claimed chunk is copied.
    pub claim: AtomicU64,
    /// `(offer << 32) | chunks`: the chunks of the open offer the sender
    /// has written, a bit each ([`mark_chunk`]). The offer in the word
    /// keeps a sender that claimed a chunk, stopped and came back after the
    /// receiver gave up on it from marking the next offer's chunk.
    pub done: AtomicU64,
    /// The chunks the sender claimed and could not write, as `done`.
    pub failed: AtomicU64,
    /// The message: the sender's ring message id and its bytes.
    pub id: AtomicU32,
    pub len: AtomicU32,
    pub chunk: AtomicU32,
    pub nchunks: AtomicU32,
    pub nranges: AtomicU32,
    /// Where the message goes, checked by the receiver against its posted
    /// receive: `[offset, length, (handle << 32) | serial]` in a region the
    /// receiver announced writable, or `[address, length, 0]` in its
    /// address space (written by cross-memory attach).
    pub ranges: [[AtomicU64; 3]; MAX_SEGMENTS],
}

#[repr(C, align(128))]
struct SegHeader {
    magic: AtomicU64,
    version: AtomicU32,
    ring_lines: AtomicU32,
}

const HEADER_BYTES: usize = std::mem::size_of::<SegHeader>();
const BLOCK_BYTES: usize = std::mem::size_of::<SideBlock>();
// The raw peers of tests/multi_process.rs build this layout by hand.
const _: () = assert!(HEADER_BYTES == 128 && BLOCK_BYTES == 640);

fn layout(lines: usize) -> (usize, usize, usize) {
    let ring = ring_bytes(lines).next_multiple_of(RING_ALIGN);
    let ring0 = HEADER_BYTES + 2 * BLOCK_BYTES;
    (ring0, ring0 + ring, ring0 + 2 * ring)
}

/// Message kinds on a ring.
pub(crate) mod kind {
    pub const SEND: u8 = 1;
    pub const RDMA_WRITE: u8 = 2;
    pub const RDMA_READ: u8 = 3;
}

/// Message flags.
pub(crate) mod flag {
    /// `imm` carries immediate data.
    pub const IMM: u8 = 1;
    /// The data is named by address ranges in the sender, not carried inline.
    pub const BY_REF: u8 = 2;
    /// The sender waits for this message to be consumed: ring its bell after release.
    pub const ACK: u8 = 4;
    /// The record holds one piece of a message copied through the ring in
    /// pieces: a piece extension after the header gives the piece's offset
    /// in the message and its length (`len` is the whole message's). The
    /// pieces of a message follow each other on the ring, in order, with
    /// nothing between them.
    pub const FRAG: u8 = 8;
}

/// Bytes of the common message header.
pub(crate) const MSG_HEADER: usize = 16;
/// Bytes of the RDMA extension after the common header.
pub(crate) const RDMA_HEADER: usize = 16;
/// Bytes of the piece extension of a record with [`flag::FRAG`].
pub(crate) const FRAG_HEADER: usize = 8;
/// Bytes of one address range in a by-reference message.
pub(crate) const RANGE_BYTES: usize = 24;

/// One range of a by-reference message: an offset into a region the sender
/// has shared (`handle` non-zero; the receiver copies from its read-only
/// mapping) or an address in the sender's memory (`handle` zero; copied by
/// cross-memory attach).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WireRange {
    pub addr: u64,
    pub len: u64,
    pub handle: MemHandle,
    pub serial: u32,
}

/// Tag of a region announcement on the rendezvous socket.
const REGION_MAGIC: [u8; 4] = *b"UVRG";
/// Tag of an announcement of a region the peer may write ([`Help`]).
const WRITABLE_MAGIC: [u8; 4] = *b"UVRW";
/// Tag of a grant of a window the peer may write RDMA writes into itself
/// ([`Grants`]): the tag, the handle, the withdrawals the target had seen,
/// four zero bytes, then the window's first and end target addresses and
/// the target address of the memfd's first byte.
const GRANT_MAGIC: [u8; 4] = *b"UVRD";
const GRANT_BYTES: usize = 40;
/// The nap of a withdrawal ([`Grants`]) that waits for a direct write in
/// progress after a thousand yields: a write is one copy of at most
/// [`DIRECT_MAX`] bytes, so only a peer stopped in the middle of one makes
/// it wait this long, and between two naps it looks whether the peer died.
const REVOKE_NAP: std::time::Duration = std::time::Duration::from_millis(1);
/// Largest RDMA write the initiator places itself ([`Grants`]); larger ones
/// go through the ring, where the target shares the copy with the sender
/// ([`SHARE_COPY_FROM`]).
pub(crate) const DIRECT_MAX: usize = SHARE_COPY_FROM - 1;

/// A window of the peer's memory this side may write RDMA writes into
/// itself ([`Grants`]).
struct Window {
    /// The target's handle of the region.
    handle: u32,
    /// The target addresses it covers, `[start, end)`.
    start: u64,
    end: u64,
    /// The target address of the mapping's first byte.
    base: u64,
    /// The withdrawals the target had made when it granted the window: a
    /// grant from before the last withdrawal is stale.
    epoch: u32,
    seg: Segment,
}

/// A message header as parsed from (or written to) a ring record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MsgHeader {
    pub kind: u8,
    pub flags: u8,
    pub nranges: u8,
    pub imm: u32,
    pub len: u32,
    pub id: u32,
    pub raddr: u64,
    pub rhandle: MemHandle,
    /// With [`flag::FRAG`]: where this piece starts in the message.
    pub piece_at: u32,
    /// With [`flag::FRAG`]: the piece's bytes, which follow the header.
    pub piece_len: u32,
}

impl MsgHeader {
    #[inline(always)]
    fn rdma_size(&self) -> usize {
        if self.kind == kind::SEND {
            0
        } else {
            RDMA_HEADER
        }
    }

    pub fn size(&self) -> usize {
        MSG_HEADER
            + self.rdma_size()
            + if self.flags & flag::FRAG != 0 {
                FRAG_HEADER
            } else {
                0
            }
    }

    /// Writes the header at `p`.
    ///
    /// # Safety
    /// `p` is valid for `self.size()` bytes of writes.
    #[inline(always)]
    pub unsafe fn write(&self, p: *mut u8) {
        let w0 = self.kind as u32 | (self.flags as u32) << 8 | (self.nranges as u32) << 16;
        let common = w0 as u128
            | (self.imm as u128) << 32
            | (self.len as u128) << 64
            | (self.id as u128) << 96;
        // SAFETY: the caller guarantees room for `size()` bytes; fixed-size
        // unaligned stores keep this a few instructions.
        unsafe {
            std::ptr::write_unaligned(p as *mut [u8; 16], common.to_le_bytes());
            if self.kind != kind::SEND {
                let rdma = self.raddr as u128 | (self.rhandle.0 as u128) << 64;
                std::ptr::write_unaligned(p.add(MSG_HEADER) as *mut [u8; 16], rdma.to_le_bytes());
            }
            if self.flags & flag::FRAG != 0 {
                let piece = self.piece_at as u64 | (self.piece_len as u64) << 32;
                std::ptr::write_unaligned(
                    p.add(MSG_HEADER + self.rdma_size()) as *mut [u8; 8],
                    piece.to_le_bytes(),
                );
            }
        }
    }

    /// Parses a header from the start of a record body of `avail` bytes.
    /// `None` if the bytes cannot be a header.
    #[inline(always)]
    pub fn parse(body: &[u8]) -> Option<MsgHeader> {
        let b = body.get(..MSG_HEADER)?;
        let u32_at = |s: &[u8], o: usize| u32::from_le_bytes([s[o], s[o + 1], s[o + 2], s[o + 3]]);
        let mut h = MsgHeader {
            kind: b[0],
            flags: b[1],
            nranges: b[2],
            imm: u32_at(b, 4),
            len: u32_at(b, 8),
            id: u32_at(b, 12),
            ..MsgHeader::default()
        };
        match h.kind {
            kind::SEND => {}
            kind::RDMA_WRITE | kind::RDMA_READ => {
                let r = body.get(MSG_HEADER..MSG_HEADER + RDMA_HEADER)?;
                h.raddr = u64::from_le_bytes(r[0..8].try_into().ok()?);
                h.rhandle = MemHandle(u32_at(r, 8));
            }
            _ => return None,
        }
        if h.flags & flag::FRAG != 0 {
            let at = MSG_HEADER + h.rdma_size();
            let f = body.get(at..at + FRAG_HEADER)?;
            h.piece_at = u32_at(f, 0);
            h.piece_len = u32_at(f, 4);
        }
        Some(h)
    }

    /// Reads the address ranges of a by-reference message from `body`.
    pub fn ranges(&self, body: &[u8], out: &mut [WireRange]) -> Option<usize> {
        let n = self.nranges as usize;
        if n > out.len() {
            return None;
        }
        let start = self.size();
        let bytes = body.get(start..start + n * RANGE_BYTES)?;
        for (i, o) in out.iter_mut().take(n).enumerate() {
            let r = &bytes[i * RANGE_BYTES..(i + 1) * RANGE_BYTES];
            *o = WireRange {
                addr: u64::from_le_bytes(r[0..8].try_into().ok()?),
                len: u64::from_le_bytes(r[8..16].try_into().ok()?),
                handle: MemHandle(u32::from_le_bytes(r[16..20].try_into().ok()?)),
                serial: u32::from_le_bytes(r[20..24].try_into().ok()?),
            };
        }
        Some(n)
    }
}

/// Writes address range `i` of a by-reference message after its header.
///
/// # Safety
/// `body` is valid for `hdr.size() + (i + 1) * RANGE_BYTES` bytes.
pub(crate) unsafe fn write_range(body: *mut u8, hdr: &MsgHeader, i: usize, w: &WireRange) {
    let mut r = [0u8; RANGE_BYTES];
    r[0..8].copy_from_slice(&w.addr.to_le_bytes());
    r[8..16].copy_from_slice(&w.len.to_le_bytes());
    r[16..20].copy_from_slice(&w.handle.0.to_le_bytes());
    r[20..24].copy_from_slice(&w.serial.to_le_bytes());
    // SAFETY: the caller guarantees the room.
    unsafe {
        std::ptr::copy_nonoverlapping(
            r.as_ptr(),
            body.add(hdr.size() + i * RANGE_BYTES),
            RANGE_BYTES,
        )
    };
}

/// One connected VI's medium: the segment, this side's ends of the rings,
/// the rendezvous socket (kept open to notice a dead peer) and the peer's
/// completion-queue eventfds.
pub(crate) struct ShmConn {
    // Rings and blocks point into the segment: it must outlive them, so it
    // is declared (and dropped) last.
    pub tx: Producer,
    pub rx: Consumer,
    pub stream: Stream,
    pub peer_pid: i32,
    peer_eventfds: Vec<PeerEventfd>,
    /// The eventfd of the peer process's agent.
    peer_agent: Option<PeerEventfd>,
    /// Regions of ours the peer has been given: (handle, serial).
    announced: Vec<(u32, u32)>,
    /// Regions of ours the peer may write, given: (handle, serial).
    announced_writable: Vec<(u32, u32)>,
    /// The peer's regions we have mapped read-only: handle -> (serial, mapping).
    peer_regions: HashMap<u32, (u32, Segment)>,
    /// The peer's regions it announced writable, mapped for writing.
    peer_regions_writable: HashMap<u32, (u32, Segment)>,
    /// The last shared copy this side offered ([`Help::claim`]'s high half).
    offers: u32,
    /// Windows of the peer's memory granted to this side, one per handle,
    /// and the one the last direct write used (looked at first).
    windows: Vec<Window>,
    hot: usize,
    /// Grant messages read from the socket.
    grants_read: u32,
    /// The withdrawals seen, as of the windows kept.
    seen_revoked: u32,
    /// Handles of this side's regions granted to the peer since the
    /// withdrawal count `grant_epoch`.
    granted: Vec<u32>,
    grant_epoch: u32,
    /// This side has granted the peer a window once.
    granted_any: bool,
    /// This side writes into the peer's windows with the light barrier
    /// ([`fence`]).
    light: bool,
    /// The CPU has `prefetchw` ([`claim_target`](Self::claim_target)).
    prefetchw: bool,
    side: usize,
    blocks: Blocks,
    seg: Arc<Segment>,
}

/// This side's block and the peer's in the segment, found once: a direct
/// write reads or writes them four times, and finding one from the
/// segment's mapping took a few instructions each time (17 of a write by
/// copy's 157).
struct Blocks {
    mine: NonNull<SideBlock>,
    peers: NonNull<SideBlock>,
}

// SAFETY: the blocks are atomics that both processes share by design, and
// the pointers stay valid while the connection holds the segment.
unsafe impl Send for Blocks {}

/// The bytes of a direct write ([`ShmConn::write_direct`]), in pieces
/// written one after the other: a descriptor's local ranges, or a caller's
/// slices (`Vi::write_copy`, taken as they are: gathering them into ranges
/// first cost 7 instructions a write, on a ping-pong's reply).
pub(crate) trait Pieces {
    /// Each piece's start and length, in order.
    fn piece(&self, i: usize) -> (*const u8, usize);
    fn count(&self) -> usize;
}

impl Pieces for [LocalRange] {
    #[inline(always)]
    fn piece(&self, i: usize) -> (*const u8, usize) {
        (self[i].ptr, self[i].len)
    }
    #[inline(always)]
    fn count(&self) -> usize {
        self.len()
    }
}

impl Pieces for [&[u8]] {
    #[inline(always)]
    fn piece(&self, i: usize) -> (*const u8, usize) {
        (self[i].as_ptr(), self[i].len())
    }
    #[inline(always)]
    fn count(&self) -> usize {
        self.len()
    }
}

/// Writes the 16 bytes of `src` (one piece, or two of 8) to `dst` with
/// one store, where the CPU has 16-byte registers. A small one-sided write
/// is often a message and its flag word (8 and 8 bytes) that the target
/// spins on: written as two pieces, four stores (`copy::copy` moves 8
/// bytes with two), the target's looks could take the line back between
/// them, and each time the writer's next store had to fetch it again.
/// The bytes go through registers: gathered in memory first, the 16-byte
/// load of two 8-byte stores just made waits for them to leave the core.
/// False (nothing written) for any other shape.
///
/// # Safety
/// `dst` is valid for 16 bytes of writes; the pieces of `src` are valid
/// for reads.
#[inline(always)]
unsafe fn store_16<P: Pieces + ?Sized>(dst: *mut u8, src: &P) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_set_epi64x, _mm_storeu_si128};
        use std::ptr::read_unaligned;
        // SAFETY: each piece read is within its length (checked by the
        // match), and `dst` is valid for 16 bytes (caller); SSE2 is part
        // of x86_64, and the unaligned forms take any address.
        unsafe {
            let v = match src.count() {
                1 if src.piece(0).1 == 16 => _mm_loadu_si128(src.piece(0).0 as *const __m128i),
                2 if src.piece(0).1 == 8 && src.piece(1).1 == 8 => _mm_set_epi64x(
                    read_unaligned(src.piece(1).0 as *const i64),
                    read_unaligned(src.piece(0).0 as *const i64),
                ),
                _ => return false,
            };
            _mm_storeu_si128(dst as *mut __m128i, v);
            true
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dst, src);
        false
    }
}

impl ShmConn {
    /// The client creates the segment.
    pub fn create_segment() -> io::Result<Segment> {
        let (ring0, ring1, total) = layout(RING_LINES);
        let name = CString::new("uvia-vi").map_err(io::Error::other)?;
        // The header, the sides' blocks and each ring's first page are made
        // now; the rest of a ring (64 KiB) when the ring first reaches it.
        // A connection that moves few messages then costs a few pages, not
        // the whole segment (populated, every page of it was resident in
        // both processes: about 69 KiB a VI at the server, `uvia scale`);
        // one that moves many meets each page's fault once.
        let seg = Segment::create_lazy(&name, total)?;
        seg.populate(0..ring0 + 1);
        seg.populate(ring1..ring1 + 1);
        // SAFETY: the segment is at least `total` bytes, page aligned, and the
        // header is written before the segment is shared.
        let hdr = unsafe { &*(seg.as_ptr() as *const SegHeader) };
        hdr.magic.store(SEG_MAGIC, Ordering::Relaxed);
        hdr.version.store(VERSION as u32, Ordering::Relaxed);
        hdr.ring_lines.store(RING_LINES as u32, Ordering::Release);
        Ok(seg)
    }

    /// The size of a connection segment: exactly what the layout needs.
    pub fn segment_len() -> usize {
        layout(RING_LINES).2
    }

    /// Maps a segment received from a client and checks it before its rings
    /// are used: sealed against shrinking, exactly [`segment_len`] bytes
    /// (`Segment::open_exact`), and a header this version knows.
    ///
    /// [`segment_len`]: Self::segment_len
    pub fn open_segment(fd: OwnedFd) -> Result<Segment, &'static str> {
        let seg = Segment::open_exact(fd, Self::segment_len())
            .map_err(|_| "shared segment not sealed or not of the layout's size")?;
        // SAFETY: the segment is the full layout long (checked above).
        let hdr = unsafe { &*(seg.as_ptr() as *const SegHeader) };
        if hdr.magic.load(Ordering::Acquire) != SEG_MAGIC
            || hdr.version.load(Ordering::Relaxed) != VERSION as u32
            || hdr.ring_lines.load(Ordering::Relaxed) != RING_LINES as u32
        {
            return Err("shared segment has an unknown layout");
        }
        Ok(seg)
    }

    /// Builds this side's view. `side` 0 is the client, 1 the server.
    pub fn new(
        seg: Arc<Segment>,
        side: usize,
        stream: Stream,
        peer_pid: i32,
        peer_agent: Option<PeerEventfd>,
        peer_eventfds: Vec<PeerEventfd>,
    ) -> ShmConn {
        let (r0, r1, _) = layout(RING_LINES);
        let (tx_off, rx_off) = if side == 0 { (r0, r1) } else { (r1, r0) };
        // SAFETY: offsets are inside the segment (its size was checked), aligned
        // to RING_ALIGN, zero-filled by memfd; this side is the only producer of
        // its tx ring and the only consumer of its rx ring.
        let (tx, rx) = unsafe {
            (
                Producer::new(seg.as_ptr().add(tx_off), RING_LINES),
                Consumer::new(seg.as_ptr().add(rx_off), RING_LINES),
            )
        };
        ShmConn {
            tx,
            rx,
            stream,
            peer_pid,
            peer_eventfds,
            peer_agent,
            announced: Vec::new(),
            announced_writable: Vec::new(),
            peer_regions: HashMap::new(),
            peer_regions_writable: HashMap::new(),
            offers: 0,
            windows: Vec::new(),
            hot: 0,
            grants_read: 0,
            seen_revoked: 0,
            granted: Vec::new(),
            grant_epoch: 0,
            granted_any: false,
            light: false,
            prefetchw: uvia_shm::prefetch::has_prefetchw(),
            side,
            blocks: Blocks {
                mine: NonNull::from(block_in(&seg, side)),
                peers: NonNull::from(block_in(&seg, 1 - side)),
            },
            seg,
        }
    }

    /// 0 for the client, 1 for the server.
    pub fn side(&self) -> usize {
        self.side
    }

    /// What this side observes.
    #[inline(always)]
    pub fn mine(&self) -> &SideBlock {
        // SAFETY: a block of the segment this connection holds (`Blocks`).
        unsafe { self.blocks.mine.as_ref() }
    }

    /// What the peer observes.
    #[inline(always)]
    pub fn peers(&self) -> &SideBlock {
        // SAFETY: as for `mine`.
        unsafe { self.blocks.peers.as_ref() }
    }

    /// Wakes the peer if it sleeps (futex) or waits on a completion queue
    /// (eventfd). One fence and one load when it does neither.
    #[inline(always)]
    pub fn wake_peer(&self) {
        let how = self.peers().bell.ring();
        if how & uvia_shm::doorbell::EVENTFD != 0 {
            self.signal_peer_eventfds();
        }
    }

    /// Asks the peer process's agent to serve this connection: once until
    /// the agent has looked (the `want` word), so a peer that stays busy
    /// costs one system call, not one per look.
    #[cold]
    pub fn ask_peer_agent(&self) {
        if self.peers().want.swap(1, Ordering::AcqRel) == 0 {
            if let Some(a) = &self.peer_agent {
                a.signal();
            }
        }
    }

    #[cold]
    fn signal_peer_eventfds(&self) {
        for fd in &self.peer_eventfds {
            fd.signal();
        }
    }

    /// Gives the peer a read-only descriptor of region (`handle`, `serial`)
    /// backed by memfd `fd`, once per connection. Sent before any ring
    /// message that names the region: a Unix socket queues it at the peer
    /// before `send` returns, so the peer finds it when it needs it.
    pub fn announce(&mut self, handle: MemHandle, serial: u32, fd: RawFd) -> io::Result<()> {
        self.announce_as(handle, serial, fd, false)
    }

    /// [`announce`](Self::announce) with a descriptor the peer may write
    /// through: for the chunks of a shared copy the peer writes into this
    /// side's receive buffer ([`Help`]).
    pub fn announce_writable(
        &mut self,
        handle: MemHandle,
        serial: u32,
        fd: RawFd,
    ) -> io::Result<()> {
        self.announce_as(handle, serial, fd, true)
    }

    fn announce_as(
        &mut self,
        handle: MemHandle,
        serial: u32,
        fd: RawFd,
        writable: bool,
    ) -> io::Result<()> {
        let list = if writable {
            &self.announced_writable
        } else {
            &self.announced
        };
        if list.contains(&(handle.0, serial)) {
            return Ok(());
        }
        if region_len(fd)? > MAX_SHARED_REGION {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "region too large to share by mapping",
            ));
        }
        let mut m = [0u8; 12];
        m[0..4].copy_from_slice(if writable {
            &WRITABLE_MAGIC
        } else {
            &REGION_MAGIC
        });
        m[4..8].copy_from_slice(&handle.0.to_le_bytes());
        m[8..12].copy_from_slice(&serial.to_le_bytes());
        if writable {
            self.stream.send(&m, &[fd])?;
            self.announced_writable.push((handle.0, serial));
        } else {
            let ro = reopen_read_only(fd)?;
            self.stream.send(&m, &[ro.as_raw_fd()])?;
            self.announced.push((handle.0, serial));
        }
        Ok(())
    }

    /// The peer's region (`handle`, `serial`), mapped read-only; reads the
    /// announcements waiting on the socket when it is not mapped yet. A
    /// region that is not sealed against shrinking, larger than
    /// [`MAX_SHARED_REGION`] or beyond [`MAX_PEER_REGIONS`] is not used.
    pub fn peer_region(&mut self, handle: MemHandle, serial: u32) -> Option<&Segment> {
        self.mapped(handle, serial, false)
    }

    /// [`peer_region`](Self::peer_region) for a region the peer announced
    /// writable, mapped for writing.
    pub fn peer_region_writable(&mut self, handle: MemHandle, serial: u32) -> Option<&Segment> {
        self.mapped(handle, serial, true)
    }

    fn mapped(&mut self, handle: MemHandle, serial: u32, writable: bool) -> Option<&Segment> {
        let current =
            |m: &HashMap<u32, (u32, Segment)>| m.get(&handle.0).is_some_and(|(s, _)| *s == serial);
        while !current(if writable {
            &self.peer_regions_writable
        } else {
            &self.peer_regions
        }) {
            self.take_announcement()?;
        }
        let map = if writable {
            &self.peer_regions_writable
        } else {
            &self.peer_regions
        };
        map.get(&handle.0).map(|(_, seg)| seg)
    }

    /// Reads the next announcement waiting on the socket and files it.
    /// `None` if none waits or it is malformed; a region that cannot be
    /// used is read and not filed.
    fn take_announcement(&mut self) -> Option<()> {
        let mut m = [0u8; GRANT_BYTES + 8];
        let (n, mut fds) = self
            .stream
            .recv(&mut m, Some(std::time::Duration::ZERO))
            .ok()??;
        if n >= 4 && m[0..4] == GRANT_MAGIC {
            // Counted even when malformed, so that `read_grants` stops.
            self.grants_read = self.grants_read.wrapping_add(1);
        }
        if fds.len() != 1 || n < 12 {
            return None;
        }
        let fd = fds.remove(0);
        let u32_at = |o: usize| u32::from_le_bytes([m[o], m[o + 1], m[o + 2], m[o + 3]]);
        let u64_at = |o: usize| u64::from(u32_at(o)) | u64::from(u32_at(o + 4)) << 32;
        let h = u32_at(4);
        if m[0..4] == GRANT_MAGIC {
            if n != GRANT_BYTES {
                return None;
            }
            let (epoch, start, end, base) = (u32_at(8), u64_at(16), u64_at(24), u64_at(32));
            let seg = Segment::open_writable(fd, MAX_SHARED_REGION).ok()?;
            let fits = base <= start && start < end && end - base <= seg.len() as u64;
            let w = Window {
                handle: h,
                start,
                end,
                base,
                epoch,
                seg,
            };
            match self.windows.iter().position(|w| w.handle == h) {
                _ if !fits => {}
                Some(i) => self.windows[i] = w,
                None if self.windows.len() < MAX_PEER_REGIONS => self.windows.push(w),
                None => {}
            }
            return Some(());
        }
        let w = m[0..4] == WRITABLE_MAGIC;
        if n != 12 || !(w || m[0..4] == REGION_MAGIC) {
            return None;
        }
        let s = u32_at(8);
        let seg = if w {
            Segment::open_writable(fd, MAX_SHARED_REGION)
        } else {
            Segment::open_read_only(fd, MAX_SHARED_REGION)
        }
        .ok()?;
        let map = if w {
            &mut self.peer_regions_writable
        } else {
            &mut self.peer_regions
        };
        if map.len() >= MAX_PEER_REGIONS && !map.contains_key(&h) {
            return None;
        }
        map.insert(h, (s, seg));
        Some(())
    }

    /// Starts taking the cache line a direct write at `raddr` into the
    /// window written last would store to, before the checks that decide
    /// the write ([`write_direct`](Self::write_direct)): the target's core
    /// holds that line, watching it for the write, and its transfer then
    /// overlaps the checks instead of following them. Measured in one
    /// process at 8 B, pinned, a write by copy answering each message went
    /// from a step of the clock (5 ns) above two bare stores' exchange to
    /// even with it. Only a hint: an address outside the window, or a
    /// window since withdrawn, costs nothing (a prefetch never faults),
    /// and the checks still decide.
    #[inline(always)]
    pub fn claim_target(&self, raddr: u64) {
        if let Some(w) = self.windows.get(self.hot) {
            let at = w
                .seg
                .as_ptr()
                .wrapping_add(raddr.wrapping_sub(w.base) as usize);
            uvia_shm::prefetch::for_store(at, self.prefetchw);
        }
    }

    /// Places an RDMA write of `len` bytes from `src` at the peer's address
    /// `raddr` in its region `handle` itself, if the peer granted this side
    /// a window that holds it ([`Grants`]). `false` if it did not (the
    /// caller sends the write through the ring, where the peer checks it).
    ///
    /// # Safety
    /// `src` is readable for `len` bytes in all.
    #[inline(always)]
    pub unsafe fn write_direct<P: Pieces + ?Sized>(
        &mut self,
        handle: MemHandle,
        raddr: u64,
        src: &P,
        len: usize,
    ) -> bool {
        // The common case in few instructions, inlined into the write's
        // call (a ping-pong's reply waits for each one): no grant or
        // withdrawal since the last write, into the window written last.
        // Anything else goes the long way, out of line.
        let grants = &self.mine().grants;
        if grants.revoked.load(Ordering::Acquire) != self.seen_revoked
            || grants.sent.load(Ordering::Acquire) != self.grants_read
            || self
                .windows
                .get(self.hot)
                .is_none_or(|w| w.handle != handle.0)
        {
            return self.write_direct_found(handle, raddr, src, len);
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.write_hot(raddr, src, len) }
    }

    /// [`write_direct`](Self::write_direct) after news of grants or
    /// withdrawals, or into another window than the last one.
    ///
    /// # Safety
    /// As for `write_direct`.
    #[cold]
    #[inline(never)]
    unsafe fn write_direct_found<P: Pieces + ?Sized>(
        &mut self,
        handle: MemHandle,
        raddr: u64,
        src: &P,
        len: usize,
    ) -> bool {
        let mine = &self.mine().grants;
        let revoked = mine.revoked.load(Ordering::Acquire);
        let news = mine.sent.load(Ordering::Acquire) != self.grants_read;
        if revoked != self.seen_revoked {
            // (Grants read since, by `mapped`, may carry the new count.)
            self.drop_withdrawn_windows();
        }
        if news {
            self.read_grants();
        }
        if self
            .windows
            .get(self.hot)
            .is_none_or(|w| w.handle != handle.0)
        {
            match self.windows.iter().position(|w| w.handle == handle.0) {
                Some(i) => self.hot = i,
                None => return false,
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.write_hot(raddr, src, len) }
    }

    /// The write into window `hot`, which holds the handle written to.
    ///
    /// # Safety
    /// As for `write_direct`; `hot` indexes a window.
    #[inline(always)]
    unsafe fn write_hot<P: Pieces + ?Sized>(&mut self, raddr: u64, src: &P, len: usize) -> bool {
        let w = &self.windows[self.hot];
        let fits = raddr >= w.start
            && raddr
                .checked_add(len as u64)
                .is_some_and(|end| end <= w.end);
        if w.epoch != self.seen_revoked || !fits {
            return false;
        }
        let mine = &self.mine().grants;
        let busy = &self.peers().busy.busy;
        // The target's withdrawal adds to `revoked` and then reads `busy`
        // ([`Grants`]): the barrier between this store and the load below
        // is the withdrawal's where the initiator is light ([`fence`]).
        if self.light {
            busy.store(1, Ordering::Relaxed);
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
        } else {
            busy.swap(1, Ordering::SeqCst);
        }
        if mine.revoked.load(Ordering::SeqCst) != self.seen_revoked {
            busy.store(0, Ordering::Release);
            return false;
        }
        // SAFETY: `[raddr, raddr + len)` lies in the window, which lies in
        // the mapping (checked when the grant was read); `src` is the
        // caller's.
        unsafe {
            let at = w.seg.as_ptr().add((raddr - w.base) as usize);
            if len != 16 || !store_16(at, src) {
                let mut at = at;
                for i in 0..src.count() {
                    let (p, n) = src.piece(i);
                    crate::copy::copy(at, p, n);
                    at = at.add(n);
                }
            }
        }
        busy.store(0, Ordering::Release);
        true
    }

    /// Unmaps the windows a withdrawal made stale ([`Grants`]).
    #[cold]
    pub fn drop_withdrawn_windows(&mut self) {
        let revoked = self.mine().grants.revoked.load(Ordering::Acquire);
        if revoked != self.seen_revoked {
            self.windows.retain(|w| w.epoch == revoked);
            self.hot = 0;
            self.seen_revoked = revoked;
        }
    }

    /// Reads the grants the peer has sent ([`Grants::sent`]).
    #[cold]
    fn read_grants(&mut self) {
        if !self.light && fence::register() {
            // Before any write that relies on it: a withdrawal that does
            // not see it yet comes before this in their order, and the
            // writes after this see the withdrawal.
            self.peers().busy.light.swap(1, Ordering::SeqCst);
            self.light = true;
        }
        let sent = self.mine().grants.sent.load(Ordering::Acquire);
        while self.grants_read != sent {
            if self.take_announcement().is_none() {
                // Not there, or a malformed message in the way: stop looking
                // until the peer grants again (a grant missed here leaves
                // its region's writes to the ring), not a system call a write.
                self.grants_read = sent;
                return;
            }
        }
    }

    /// Withdraws the grants this side gave the peer, if it gave any, and
    /// waits for a write of the peer's in progress ([`revoke`]).
    pub fn withdraw(&self) {
        if self.granted_any {
            revoke(&self.seg, self.side, self.peer_pid);
        }
    }

    /// Neither side has reported an error or closed: the connection may
    /// still carry a write placed by this side ([`write_direct`]).
    ///
    /// [`write_direct`]: Self::write_direct
    #[inline]
    pub fn unbroken(&self) -> bool {
        let mine = self.mine();
        mine.error.load(Ordering::Acquire) == 0 && mine.closed.load(Ordering::Acquire) == 0
    }

    /// True when region `handle` was granted to the peer and no
    /// withdrawal followed: the look before [`grant`](Self::grant).
    #[inline]
    pub fn granted(&self, handle: MemHandle) -> bool {
        self.granted.contains(&handle.0)
            && self.peers().grants.revoked.load(Ordering::Relaxed) == self.grant_epoch
    }

    /// Grants the peer this side's region `handle` for RDMA writes it
    /// places itself, once per connection ([`Grants`]): called after an
    /// RDMA write from the ring was placed in it, with `regions` this
    /// side's and `ptag` the VI's. Nothing if the region cannot be mapped
    /// by the peer or does not allow RDMA write, or the grant cannot be sent.
    #[cold]
    pub fn grant(
        &mut self,
        regions: &crate::mem::RegionTable,
        handle: MemHandle,
        ptag: crate::mem::Ptag,
        grants: &std::sync::atomic::AtomicBool,
    ) {
        // Read before the region is looked up: a withdrawal that follows a
        // deregistration after the lookup makes this grant stale.
        let epoch = self.peers().grants.revoked.load(Ordering::SeqCst);
        if epoch != self.grant_epoch {
            self.granted.clear();
            self.grant_epoch = epoch;
        }
        if self.granted.contains(&handle.0) || self.granted.len() >= MAX_PEER_REGIONS {
            return;
        }
        let window = || {
            let r = regions.lookup(handle)?;
            let start = r.start.max(r.fd_base);
            let end = (r.start + r.len).min(r.fd_base + r.fd_len);
            let ok = r.fd >= 0 && r.attrs.enable_rdma_write && r.attrs.ptag == ptag;
            (ok && start < end).then_some((r, start, end))
        };
        if window().is_none() {
            return;
        }
        // Counted before the lookup that decides: a region's change
        // withdraws nothing on a Nic that never tried a grant
        // (`ShmNic::withdraw_grants`).
        grants.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        let Some((r, start, end)) = window() else {
            return;
        };
        let mut m = [0u8; GRANT_BYTES];
        m[0..4].copy_from_slice(&GRANT_MAGIC);
        m[4..8].copy_from_slice(&handle.0.to_le_bytes());
        m[8..12].copy_from_slice(&epoch.to_le_bytes());
        m[16..24].copy_from_slice(&start.to_le_bytes());
        m[24..32].copy_from_slice(&end.to_le_bytes());
        m[32..40].copy_from_slice(&r.fd_base.to_le_bytes());
        // The descriptor the lookup named is the region's only while the
        // region is registered (its owner closes it after): a copy taken
        // while it still is cannot be another file that took the number.
        // SAFETY: dup of a descriptor number; the result is checked.
        let fd = unsafe { libc::fcntl(r.fd, libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return;
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        if !regions.is_current(handle, r.serial) {
            return;
        }
        if self.stream.send(&m, &[fd.as_raw_fd()]).is_ok() {
            self.peers().grants.sent.fetch_add(1, Ordering::Release);
            self.granted.push(handle.0);
            self.granted_any = true;
        }
    }

    /// Copies the data a by-reference message names into `local`, in order.
    /// `false` if a range cannot be read (unknown region, out of bounds, or
    /// the peer's memory is gone).
    pub fn gather(&mut self, ranges: &[WireRange], local: &[LocalRange]) -> bool {
        let mut cur = Cursor {
            local,
            i: 0,
            off: 0,
        };
        for r in ranges {
            let len = r.len as usize;
            if r.handle.0 == 0 {
                let mut sub = [LocalRange {
                    ptr: std::ptr::null_mut(),
                    len: 0,
                }; crate::desc::MAX_SEGMENTS];
                let Some(n) = cur.take(len, &mut sub) else {
                    return false;
                };
                let remote = [RemoteRange {
                    addr: r.addr,
                    len: r.len,
                }];
                // SAFETY: local sub-ranges lie in registered receive memory.
                if unsafe { uvia_shm::cma::read(self.peer_pid, &sub[..n], &remote, len) }.is_err() {
                    return false;
                }
            } else {
                let Some(seg) = self.peer_region(r.handle, r.serial) else {
                    return false;
                };
                if r.addr
                    .checked_add(r.len)
                    .is_none_or(|end| end > seg.len() as u64)
                {
                    return false;
                }
                // SAFETY: the range was checked against the mapping's length.
                let src = unsafe { seg.as_ptr().add(r.addr as usize) };
                let mut sub = [LocalRange {
                    ptr: std::ptr::null_mut(),
                    len: 0,
                }; crate::desc::MAX_SEGMENTS];
                let Some(n) = cur.take(len, &mut sub) else {
                    return false;
                };
                let mut at = 0;
                for d in &sub[..n] {
                    // SAFETY: `d` is registered receive memory; the source
                    // range lies inside the peer's mapping (checked above).
                    unsafe { std::ptr::copy_nonoverlapping(src.add(at), d.ptr, d.len) };
                    at += d.len;
                }
            }
        }
        true
    }

    /// Copies bytes `at..at + n` of a by-reference message into the same
    /// bytes of `local`. `false` as for [`gather`](Self::gather).
    fn gather_span(
        &mut self,
        ranges: &[WireRange],
        local: &[LocalRange],
        at: usize,
        n: usize,
    ) -> bool {
        let mut wire = [WireRange::default(); MAX_SEGMENTS];
        let mut nw = 0;
        span_pieces(ranges.iter().map(|r| r.len as usize), at, n, |i, off, k| {
            wire[nw] = WireRange {
                addr: ranges[i].addr + off as u64,
                len: k as u64,
                ..ranges[i]
            };
            nw += 1;
        });
        let (dst, nd) = local_span(local, at, n);
        self.gather(&wire[..nw], &dst[..nd])
    }

    /// [`gather`](Self::gather) for a large message, the copy shared with
    /// the sender: the message is offered in chunks ([`Help`]), this side
    /// copies the chunks it claims and waits for those the sender claimed.
    /// A chunk the sender could not write, or left unwritten because it
    /// died or stayed stopped (`stopped`), is copied here. `id` is the
    /// message's ring id; `local` was checked against the posted receive,
    /// `dest` says where its ranges lie (empty: nowhere the peer can map).
    pub fn gather_shared(
        &mut self,
        id: u32,
        ranges: &[WireRange],
        local: &[LocalRange],
        dest: &[Source],
        stopped: impl Fn() -> bool,
    ) -> bool {
        let len: usize = ranges.iter().map(|r| r.len as usize).sum();
        if len < SHARE_COPY_FROM || local.len() > MAX_SEGMENTS || len > u32::MAX as usize {
            return self.gather(ranges, local);
        }
        self.offers = self.offers.wrapping_add(1).max(1);
        let offer = self.offers;
        let seg = self.seg.clone();
        let help = &block_in(&seg, self.side).help;
        help.id.store(id, Ordering::Relaxed);
        help.len.store(len as u32, Ordering::Relaxed);
        help.nranges.store(local.len() as u32, Ordering::Relaxed);
        let mut mapped = true;
        for (i, (slot, r)) in help.ranges.iter().zip(local).enumerate() {
            // The sender writes into a writable mapping of the region where
            // the receive lies in a memfd, else by cross-memory attach.
            let (addr, tag) = match dest.get(i) {
                Some(s)
                    if s.mappable(r.len as u64)
                        && self.announce_writable(s.handle, s.serial, s.fd).is_ok() =>
                {
                    (s.offset, (s.handle.0 as u64) << 32 | s.serial as u64)
                }
                _ => {
                    mapped = false;
                    (r.ptr as u64, 0)
                }
            };
            slot[0].store(addr, Ordering::Relaxed);
            slot[1].store(r.len as u64, Ordering::Relaxed);
            slot[2].store(tag, Ordering::Relaxed);
        }
        let least = if mapped {
            SHARE_CHUNK_MAPPED
        } else {
            SHARE_CHUNK
        };
        let chunk = least.max(len.div_ceil(MAX_CHUNKS).next_multiple_of(4096));
        let n = len.div_ceil(chunk) as u32;
        help.chunk.store(chunk as u32, Ordering::Relaxed);
        help.nchunks.store(n, Ordering::Relaxed);
        help.done.store((offer as u64) << 32, Ordering::Relaxed);
        help.failed.store((offer as u64) << 32, Ordering::Relaxed);
        // Release: the fields above are in place before a claim can succeed.
        help.claim.store((offer as u64) << 32, Ordering::Release);
        let span = |c: u32| {
            let at = c as usize * chunk;
            (at, chunk.min(len - at))
        };
        let mut ok = true;
        let mut mine = 0u64;
        while let Some(c) = claim_chunk(help, offer, n) {
            let (at, k) = span(c);
            ok &= self.gather_span(ranges, local, at, k);
            mine |= 1 << c;
        }
        let theirs = chunk_mask(n) & !mine;
        let mut spins = 0u32;
        let mut since = None;
        // Acquire: the sender's bytes of a chunk are in place before its bit.
        let marked = |w: &AtomicU64| chunks_of(w.load(Ordering::Acquire), offer);
        while (marked(&help.done) | marked(&help.failed)) & theirs != theirs {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            // The sender copies a claimed chunk at once: only one that died
            // or was stopped in between leaves it unwritten, or one that
            // claims and never copies (a faulty or hostile peer), waited
            // for at most HELP_PATIENCE: its chunks are copied here below.
            if spins.is_multiple_of(4096)
                && (self.mine().closed.load(Ordering::Acquire) != 0
                    || self.stream.peer_gone()
                    || stopped()
                    || since.get_or_insert_with(std::time::Instant::now).elapsed() >= HELP_PATIENCE)
            {
                break;
            }
        }
        let mut redo = theirs & !marked(&help.done);
        while redo != 0 {
            let c = redo.trailing_zeros();
            redo &= redo - 1;
            let (at, k) = span(c);
            ok &= self.gather_span(ranges, local, at, k);
        }
        ok
    }

    /// The sender's part of a shared copy: writes bytes `at..at + k` of a
    /// message whose bytes are `src` (this side's registered memory) where
    /// the peer's offer `help` says, through a writable mapping of its
    /// region or by cross-memory attach. `false` if it could not.
    pub fn write_chunk(&mut self, help: &Help, src: &[LocalRange], at: usize, k: usize) -> bool {
        let nranges = (help.nranges.load(Ordering::Relaxed) as usize).min(MAX_SEGMENTS);
        // (tag, address or offset, bytes, offset in the message)
        let mut dst = [(0u64, 0u64, 0usize, 0usize); MAX_SEGMENTS];
        let mut nd = 0;
        let mut mo = at;
        span_pieces(
            help.ranges[..nranges]
                .iter()
                .map(|r| r[1].load(Ordering::Relaxed) as usize),
            at,
            k,
            |i, off, n| {
                let r = &help.ranges[i];
                let addr = r[0].load(Ordering::Relaxed).wrapping_add(off as u64);
                dst[nd] = (r[2].load(Ordering::Relaxed), addr, n, mo);
                nd += 1;
                mo += n;
            },
        );
        for &(tag, addr, n, mo) in &dst[..nd] {
            let (from, nf) = local_span(src, mo, n);
            if tag == 0 {
                let to = [RemoteRange {
                    addr,
                    len: n as u64,
                }];
                // SAFETY: `from` is this side's registered memory; the
                // destination is what the peer offered.
                if unsafe { uvia_shm::cma::write(self.peer_pid, &from[..nf], &to, n) }.is_err() {
                    return false;
                }
                continue;
            }
            let Some(seg) = self.peer_region_writable(MemHandle((tag >> 32) as u32), tag as u32)
            else {
                return false;
            };
            if addr
                .checked_add(n as u64)
                .is_none_or(|end| end > seg.len() as u64)
            {
                return false;
            }
            // SAFETY: inside the mapping (checked above).
            let mut to = unsafe { seg.as_ptr().add(addr as usize) };
            for f in &from[..nf] {
                // SAFETY: `f` is registered memory of this side; `to` stays
                // inside the `n` bytes checked above.
                unsafe {
                    std::ptr::copy_nonoverlapping(f.ptr, to, f.len);
                    to = to.add(f.len);
                }
            }
        }
        true
    }

    /// Tells the peer this side is going away and closes the socket.
    pub fn close(&self) {
        self.withdraw();
        self.peers().closed.store(1, Ordering::Release);
        self.wake_peer();
        self.stream.shutdown();
    }
}

/// Claims the next chunk of shared copy `offer` of `n` chunks in `help`;
/// `None` once all are claimed or another offer has replaced it.
#[inline]
pub(crate) fn claim_chunk(help: &Help, offer: u32, n: u32) -> Option<u32> {
    let mut w = help.claim.load(Ordering::Acquire);
    loop {
        let c = w as u32;
        if (w >> 32) as u32 != offer || c >= n {
            return None;
        }
        match help
            .claim
            .compare_exchange_weak(w, w + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return Some(c),
            Err(now) => w = now,
        }
    }
}

/// The bits of chunks `0..n` (`n` <= [`MAX_CHUNKS`]).
pub(crate) fn chunk_mask(n: u32) -> u64 {
    (1u64 << n.min(MAX_CHUNKS as u32)) - 1
}

/// The chunk bits of `w`, a [`Help::done`] or [`Help::failed`] word, if it
/// belongs to `offer`.
fn chunks_of(w: u64, offer: u32) -> u64 {
    if (w >> 32) as u32 == offer {
        w & 0xffff_ffff
    } else {
        0
    }
}

/// Sets chunk `c`'s bit in `word` (the sender's [`Help::done`] or
/// [`Help::failed`]) if the word still belongs to `offer`, the offer the
/// chunk was claimed from. Release: the chunk's bytes are in place before
/// its bit.
pub(crate) fn mark_chunk(word: &AtomicU64, offer: u32, c: u32) {
    let mut w = word.load(Ordering::Relaxed);
    while (w >> 32) as u32 == offer {
        match word.compare_exchange_weak(w, w | 1 << c, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return,
            Err(now) => w = now,
        }
    }
}

/// Calls `f(i, off, k)` for each piece of bytes `at..at + n` of a list of
/// ranges of lengths `lens`: `k` bytes from offset `off` in range `i`.
fn span_pieces(
    lens: impl Iterator<Item = usize>,
    mut at: usize,
    mut n: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    for (i, len) in lens.enumerate() {
        if n == 0 {
            break;
        }
        if at >= len {
            at -= len;
            continue;
        }
        let k = (len - at).min(n);
        f(i, at, k);
        n -= k;
        at = 0;
    }
}

/// Bytes `at..at + n` of the concatenation of `ranges`, as ranges of
/// their own (at most one per range, so at most [`MAX_SEGMENTS`]).
pub(crate) fn local_span(
    ranges: &[LocalRange],
    at: usize,
    n: usize,
) -> ([LocalRange; MAX_SEGMENTS], usize) {
    let mut out = [LocalRange {
        ptr: std::ptr::null_mut(),
        len: 0,
    }; MAX_SEGMENTS];
    let mut k = 0;
    span_pieces(ranges.iter().map(|r| r.len), at, n, |i, off, len| {
        out[k] = LocalRange {
            ptr: ranges[i].ptr.wrapping_add(off),
            len,
        };
        k += 1;
    });
    (out, k)
}

/// Walks a list of local ranges, handing out consecutive pieces.
struct Cursor<'a> {
    local: &'a [LocalRange],
    i: usize,
    off: usize,
}

impl Cursor<'_> {
    /// The next `len` bytes as sub-ranges in `out`; `None` if the local
    /// ranges are too short or too fragmented for `out`.
    fn take(&mut self, mut len: usize, out: &mut [LocalRange]) -> Option<usize> {
        let mut n = 0;
        while len > 0 {
            let r = self.local.get(self.i)?;
            let k = (r.len - self.off).min(len);
            if k > 0 {
                *out.get_mut(n)? = LocalRange {
                    ptr: r.ptr.wrapping_add(self.off),
                    len: k,
                };
                n += 1;
            }
            len -= k;
            self.off += k;
            if self.off == r.len {
                self.i += 1;
                self.off = 0;
            }
        }
        Some(n)
    }
}

fn region_len(fd: RawFd) -> io::Result<usize> {
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid pointer for the duration of the call.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_size as usize)
}

fn reopen_read_only(fd: RawFd) -> io::Result<OwnedFd> {
    let path = CString::new(format!("/proc/self/fd/{fd}")).map_err(io::Error::other)?;
    // SAFETY: a valid C string path; flags are constants.
    let r = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(r) })
}

/// Withdraws every grant side `side` of segment `seg` gave its peer
/// ([`Grants`]), without waiting: the first half of [`revoke`]. A grant
/// being sent meanwhile carries the count from before, so the peer finds it
/// stale. True when the peer writes with the light barrier ([`fence`]),
/// which must then run before [`revoke_wait`].
pub(crate) fn revoke_start(seg: &Segment, side: usize) -> bool {
    block_in(seg, 1 - side)
        .grants
        .revoked
        .fetch_add(1, Ordering::SeqCst);
    block_in(seg, side).busy.light.load(Ordering::SeqCst) != 0
}

/// The second half of [`revoke`]: waits for a direct write in progress of
/// the peer (process `peer_pid`) to end, however long the peer is stopped
/// in the middle of it (the memory must not change after its withdrawal
/// returns, as a NIC's DMA must be over when a deregistration returns); a
/// dead peer ends the wait.
pub(crate) fn revoke_wait(seg: &Segment, side: usize, peer_pid: i32) {
    let busy = &block_in(seg, side).busy.busy;
    let mut spins = 0u32;
    while busy.load(Ordering::SeqCst) != 0 {
        spins += 1;
        if spins < 1000 {
            std::thread::yield_now();
            continue;
        }
        // SAFETY: signal 0 only asks whether the process exists.
        if unsafe { libc::kill(peer_pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        {
            return;
        }
        std::thread::sleep(REVOKE_NAP);
    }
}

/// Withdraws every grant side `side` of segment `seg` gave its peer and
/// waits for a direct write in progress to end ([`revoke_start`],
/// [`fence`], [`revoke_wait`]).
pub(crate) fn revoke(seg: &Segment, side: usize, peer_pid: i32) {
    if revoke_start(seg, side) {
        fence::global();
    }
    revoke_wait(seg, side, peer_pid);
}

/// Side `side`'s control block in a connection segment (checked or created
/// by this module, so at least the full layout long).
#[inline(always)]
pub(crate) fn block_in(seg: &Segment, side: usize) -> &SideBlock {
    debug_assert!(side < 2 && seg.len() >= HEADER_BYTES + 2 * BLOCK_BYTES);
    // SAFETY: both blocks lie inside the segment after the header, aligned to
    // their type (the segment is page aligned, offsets are multiples of 128).
    unsafe { &*(seg.as_ptr().add(HEADER_BYTES + side * BLOCK_BYTES) as *const SideBlock) }
}

/// Connection messages on the rendezvous socket.
pub(crate) mod hello {
    use crate::cm::{Discriminator, MAX_DISCRIMINATOR, MAX_PRIVATE_DATA};
    use crate::vi::{Reliability, ViAttributes};

    pub const MAGIC: [u8; 4] = *b"UVIA";
    pub const REQUEST: u8 = 1;
    pub const ACCEPT: u8 = 2;
    pub const REJECT: u8 = 3;
    /// Where the private data starts.
    const PRIVATE_AT: usize = 24 + MAX_DISCRIMINATOR;
    pub const LEN: usize = PRIVATE_AT + MAX_PRIVATE_DATA;

    /// What one side tells the other about its VI.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Hello {
        pub kind: u8,
        pub reliability: Reliability,
        pub rdma_write: bool,
        pub rdma_read: bool,
        pub max_transfer_size: u32,
        pub discriminator: Discriminator,
        /// Why a reject: 0 the server's choice, [`MISMATCH`] attributes differ.
        pub reason: u8,
        /// The application's bytes for the other side (at most
        /// [`MAX_PRIVATE_DATA`]).
        pub private: Vec<u8>,
        /// A request's job key (0: none), bytes 16..24.
        pub job: u64,
    }

    /// Reject reason: the two VIs' attributes do not match.
    pub const MISMATCH: u8 = 1;
    /// Reject reason: the listener's job key is not the request's.
    pub const WRONG_JOB: u8 = 2;

    impl From<&Hello> for crate::cm::RemoteViAttributes {
        fn from(h: &Hello) -> Self {
            crate::cm::RemoteViAttributes {
                reliability: h.reliability,
                max_transfer_size: h.max_transfer_size,
                enable_rdma_write: h.rdma_write,
                enable_rdma_read: h.rdma_read,
            }
        }
    }

    impl Hello {
        pub fn new(kind: u8, a: &ViAttributes, d: &Discriminator) -> Hello {
            Hello {
                kind,
                reliability: a.reliability,
                rdma_write: a.enable_rdma_write,
                rdma_read: a.enable_rdma_read,
                max_transfer_size: a.max_transfer_size,
                discriminator: d.clone(),
                reason: 0,
                private: Vec::new(),
                job: 0,
            }
        }

        pub fn emit(&self) -> [u8; LEN] {
            let mut b = [0u8; LEN];
            b[0..4].copy_from_slice(&MAGIC);
            b[4] = super::VERSION;
            b[5] = self.kind;
            b[6] = self.reliability as u8;
            b[7] = self.rdma_write as u8 | (self.rdma_read as u8) << 1;
            b[8..12].copy_from_slice(&self.max_transfer_size.to_le_bytes());
            let d = self.discriminator.as_bytes();
            b[12] = d.len() as u8;
            b[13] = self.reason;
            let p = &self.private[..self.private.len().min(MAX_PRIVATE_DATA)];
            b[14] = p.len() as u8;
            b[16..24].copy_from_slice(&self.job.to_le_bytes());
            b[24..24 + d.len()].copy_from_slice(d);
            b[PRIVATE_AT..PRIVATE_AT + p.len()].copy_from_slice(p);
            b
        }

        pub fn parse(b: &[u8]) -> Result<Hello, &'static str> {
            if b.len() != LEN || b[0..4] != MAGIC {
                return Err("not a uvia connection message");
            }
            if b[4] != super::VERSION {
                return Err("unsupported protocol version");
            }
            if !matches!(b[5], REQUEST | ACCEPT | REJECT) {
                return Err("unknown connection message kind");
            }
            let reliability = Reliability::from_u8(b[6]).ok_or("unknown reliability level")?;
            let dlen = b[12] as usize;
            if dlen > MAX_DISCRIMINATOR {
                return Err("discriminator too long");
            }
            let discriminator =
                Discriminator::new(&b[24..24 + dlen]).map_err(|_| "discriminator too long")?;
            let plen = b[14] as usize;
            if plen > MAX_PRIVATE_DATA {
                return Err("private data too long");
            }
            Ok(Hello {
                kind: b[5],
                reliability,
                rdma_write: b[7] & 1 != 0,
                rdma_read: b[7] & 2 != 0,
                max_transfer_size: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
                discriminator,
                reason: b[13],
                private: b[PRIVATE_AT..PRIVATE_AT + plen].to_vec(),
                job: u64::from_le_bytes(b[16..24].try_into().unwrap_or_default()),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_header_bytes() {
        let h = MsgHeader {
            kind: kind::SEND,
            flags: flag::IMM | flag::ACK,
            nranges: 0,
            imm: 0x0102_0304,
            len: 8,
            id: 7,
            ..Default::default()
        };
        let mut b = [0xeeu8; 32];
        // SAFETY: 32 bytes of room.
        unsafe { h.write(b.as_mut_ptr()) };
        assert_eq!(&b[..16], &[1, 5, 0, 0, 4, 3, 2, 1, 8, 0, 0, 0, 7, 0, 0, 0]);
        assert_eq!(b[16], 0xee, "a send header is 16 bytes");
        assert_eq!(MsgHeader::parse(&b).unwrap(), h);
    }

    #[test]
    fn rdma_header_bytes_and_ranges() {
        let h = MsgHeader {
            kind: kind::RDMA_READ,
            flags: flag::BY_REF | flag::ACK,
            nranges: 1,
            len: 4096,
            id: 1,
            raddr: 0x1122,
            rhandle: MemHandle(0x10003),
            ..Default::default()
        };
        let mut b = [0u8; 64];
        // SAFETY: 64 bytes hold a 32-byte header and one range.
        unsafe {
            h.write(b.as_mut_ptr());
            write_range(
                b.as_mut_ptr(),
                &h,
                0,
                &WireRange {
                    addr: 0xdead_0000,
                    len: 4096,
                    handle: MemHandle(7),
                    serial: 9,
                },
            );
        }
        assert_eq!(
            &b[16..32],
            &[0x22, 0x11, 0, 0, 0, 0, 0, 0, 3, 0, 1, 0, 0, 0, 0, 0]
        );
        let p = MsgHeader::parse(&b).unwrap();
        assert_eq!(p, h);
        let mut r = [WireRange::default(); 4];
        assert_eq!(p.ranges(&b, &mut r), Some(1));
        let want = WireRange {
            addr: 0xdead_0000,
            len: 4096,
            handle: MemHandle(7),
            serial: 9,
        };
        assert_eq!(r[0], want);
        assert_eq!(&b[48..56], &[7, 0, 0, 0, 9, 0, 0, 0]);
    }

    /// A connection whose peer end is a bare socket the test writes to.
    fn conn_with_raw_peer(tag: &str) -> (ShmConn, Stream, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("uvia-conn-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let dir = uvia_shm::SocketDir::at(dir).unwrap();
        let l = uvia_shm::Listener::bind(&dir.socket("c")).unwrap();
        let t = std::time::Duration::from_secs(5);
        let ours = Stream::connect(&dir.socket("c"), t).unwrap();
        let theirs = l.accept(Some(t)).unwrap().unwrap();
        let seg = Arc::new(ShmConn::create_segment().unwrap());
        let conn = ShmConn::new(seg, 0, ours, std::process::id() as i32, None, Vec::new());
        (conn, theirs, dir.path().to_owned())
    }

    fn announcement(handle: u32, serial: u32) -> [u8; 12] {
        let mut m = [0u8; 12];
        m[0..4].copy_from_slice(&REGION_MAGIC);
        m[4..8].copy_from_slice(&handle.to_le_bytes());
        m[8..12].copy_from_slice(&serial.to_le_bytes());
        m
    }

    /// A region the peer could shrink after we mapped it (no seals) is never
    /// mapped: reading it later could kill this process with SIGBUS.
    #[test]
    fn an_unsealed_peer_region_is_not_used() {
        let (mut conn, peer, dir) = conn_with_raw_peer("unsealed");
        // SAFETY: a literal name; flags are constants.
        let fd = unsafe { libc::memfd_create(c"bare".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: plain calls on the fresh descriptor, closed at the end.
        unsafe { assert_eq!(libc::ftruncate(fd, 4096), 0) };
        peer.send(&announcement(7, 1), &[fd]).unwrap();
        // SAFETY: our own descriptor, no longer used.
        unsafe { libc::close(fd) };
        assert!(conn.peer_region(MemHandle(7), 1).is_none());

        let good = Segment::create(c"region", 4096).unwrap();
        let ro = good.read_only_fd().unwrap();
        peer.send(&announcement(8, 1), &[ro.as_raw_fd()]).unwrap();
        assert_eq!(
            conn.peer_region(MemHandle(8), 1).map(|s| s.len()),
            Some(4096)
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn piece_header_bytes() {
        let h = MsgHeader {
            kind: kind::RDMA_WRITE,
            flags: flag::FRAG | flag::ACK,
            len: 0x0002_0000,
            id: 3,
            raddr: 0x4000,
            rhandle: MemHandle(5),
            piece_at: 0x4000,
            piece_len: 0x4000,
            ..Default::default()
        };
        let mut b = [0xeeu8; 48];
        // SAFETY: 48 bytes hold the 40-byte header.
        unsafe { h.write(b.as_mut_ptr()) };
        // Common header: kind 2, flags FRAG|ACK, len 128 KiB, id 3.
        assert_eq!(&b[..16], &[2, 12, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 3, 0, 0, 0]);
        // Piece extension after the RDMA one: offset 16 KiB, length 16 KiB.
        assert_eq!(&b[32..40], &[0, 0x40, 0, 0, 0, 0x40, 0, 0]);
        assert_eq!(b[40], 0xee, "a piece of an RDMA write has a 40-byte header");
        assert_eq!(h.size(), 40);
        assert_eq!(MsgHeader::parse(&b).unwrap(), h);
        // A send's pieces carry no RDMA extension.
        let send = MsgHeader {
            kind: kind::SEND,
            raddr: 0,
            rhandle: MemHandle(0),
            ..h
        };
        // SAFETY: as above.
        unsafe { send.write(b.as_mut_ptr()) };
        assert_eq!(&b[16..24], &[0, 0x40, 0, 0, 0, 0x40, 0, 0]);
        assert_eq!(send.size(), 24);
        assert_eq!(MsgHeader::parse(&b[..24]).unwrap(), send);
        assert_eq!(
            MsgHeader::parse(&b[..20]),
            None,
            "piece extension cut short"
        );
    }

    #[test]
    fn hostile_headers_are_refused() {
        assert_eq!(MsgHeader::parse(&[1, 0, 0]), None, "short");
        assert_eq!(MsgHeader::parse(&[9; 32]), None, "unknown kind");
        assert_eq!(MsgHeader::parse(&[2; 20]), None, "RDMA header cut short");
        let h = MsgHeader {
            kind: kind::SEND,
            nranges: 200,
            ..Default::default()
        };
        let mut b = [0u8; 64];
        // SAFETY: room for the header.
        unsafe { h.write(b.as_mut_ptr()) };
        let mut r = [WireRange::default(); 6];
        assert_eq!(h.ranges(&b, &mut r), None, "more ranges than room");
    }

    /// The two uneven pieces of a test's receive buffer at `base`, with 64
    /// bytes between them.
    fn pieces_at(base: usize, n: usize) -> [LocalRange; 2] {
        let cut = n / 3 + 1;
        [
            LocalRange {
                ptr: base as *mut u8,
                len: cut,
            },
            LocalRange {
                ptr: (base + cut + 64) as *mut u8,
                len: n - cut,
            },
        ]
    }

    /// What the sender's stand-in in [`shared_copy`] does.
    #[derive(Clone, Copy, PartialEq)]
    enum Stand {
        /// Claims chunks and hands each to the helper.
        Helps,
        /// Claims one chunk and stops, and the receiver is told the
        /// sender is gone.
        Gone,
        /// Claims one chunk and never writes it, while the receiver
        /// finds the sender alive and running (a faulty or hostile peer).
        Stalls,
    }

    /// One shared copy of a 1 MiB and a bit message into a buffer of two
    /// pieces while a thread stands in for the sender (`stand`): helping,
    /// it claims chunks and hands each to `helper(chunk, at, len,
    /// buffer)`, which says whether it wrote it. The number of chunks the
    /// stand-in claimed.
    fn shared_copy(
        tag: &str,
        stand: Stand,
        helper: impl Fn(u32, usize, usize, &[LocalRange]) -> bool + Send + Sync,
    ) -> u32 {
        let (mut conn, _theirs, dir) = conn_with_raw_peer(tag);
        let src = message();
        let n = src.len();
        let mut dst = vec![0u8; n + 64];
        let base = dst.as_mut_ptr() as usize;
        let local = pieces_at(base, n);
        // Handle 0: read by cross-memory attach, from this process.
        let ranges = [WireRange {
            addr: src.as_ptr() as u64,
            len: n as u64,
            ..WireRange::default()
        }];
        let seg = conn.seg.clone();
        let side = conn.side();
        let claimed = std::sync::atomic::AtomicU32::new(0);
        let over = std::sync::atomic::AtomicBool::new(false);
        let running = std::sync::atomic::AtomicBool::new(false);
        let ok = std::thread::scope(|s| {
            s.spawn(|| {
                let help = &block_in(&seg, side).help;
                running.store(true, Ordering::Release);
                while !over.load(Ordering::Acquire) {
                    let w = help.claim.load(Ordering::Acquire);
                    let nc = help.nchunks.load(Ordering::Relaxed);
                    // Offer 0 is none yet: a claim made of it before the
                    // offer opens would count, and the receiver would never
                    // see it (the sender's own look skips it too).
                    let offer = (w >> 32) as u32;
                    let Some(c) = (offer != 0).then(|| claim_chunk(help, offer, nc)).flatten()
                    else {
                        std::hint::spin_loop();
                        continue;
                    };
                    claimed.fetch_add(1, Ordering::Relaxed);
                    if stand != Stand::Helps {
                        return; // claimed and never written
                    }
                    let chunk = help.chunk.load(Ordering::Relaxed) as usize;
                    let at = c as usize * chunk;
                    let bits = if helper(c, at, chunk.min(n - at), &pieces_at(base, n)) {
                        &help.done
                    } else {
                        &help.failed
                    };
                    mark_chunk(bits, offer, c);
                }
            });
            // The copy takes microseconds: the stand-in must be running
            // when the offer opens, or it claims nothing on a busy machine.
            while !running.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            let ok = conn.gather_shared(5, &ranges, &local, &[], || stand == Stand::Gone);
            over.store(true, Ordering::Release);
            ok
        });
        let cut = local[0].len;
        assert!(ok, "the copy succeeds");
        assert!(dst[..cut] == src[..cut], "first piece");
        assert!(
            dst[cut..cut + 64].iter().all(|&b| b == 0),
            "the gap untouched"
        );
        assert!(dst[cut + 64..] == src[cut..], "second piece");
        let _ = std::fs::remove_dir_all(dir);
        claimed.load(Ordering::Relaxed)
    }

    /// The test's message: 1 MiB and a bit, no two chunks alike.
    fn message() -> Vec<u8> {
        (0..(1usize << 20) + 12_345)
            .map(|i| (i * 7 + i / 4099) as u8)
            .collect()
    }

    #[test]
    fn a_chunk_marked_for_an_earlier_offer_is_not_counted() {
        let w = AtomicU64::new(7 << 32);
        mark_chunk(&w, 7, 3);
        assert_eq!(chunks_of(w.load(Ordering::Relaxed), 7), 1 << 3);
        // The receiver opens offer 8; a sender back from a stop marks a
        // chunk it claimed from offer 7.
        w.store(8 << 32, Ordering::Relaxed);
        mark_chunk(&w, 7, 5);
        assert_eq!(chunks_of(w.load(Ordering::Relaxed), 8), 0);
        assert_eq!(chunks_of(w.load(Ordering::Relaxed), 7), 0);
        assert_eq!(chunk_mask(32), 0xffff_ffff);
        assert_eq!(chunk_mask(3), 0b111);
    }

    #[test]
    fn a_shared_copy_takes_the_senders_chunks_and_redoes_what_it_could_not_write() {
        let src = message();
        // The stand-in writes even chunks and cannot write odd ones. Its
        // thread may start late and claim nothing: then try again.
        let mut helped = 0;
        for round in 0..50 {
            helped += shared_copy(&format!("share{round}"), Stand::Helps, |c, at, k, local| {
                if c % 2 == 1 {
                    return false;
                }
                let mut before = 0;
                span_pieces(local.iter().map(|r| r.len), at, k, |i, off, m| {
                    let from = local[..i].iter().map(|r| r.len).sum::<usize>() + off;
                    // SAFETY: inside the test's receive buffer.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            src[from..].as_ptr(),
                            local[i].ptr.add(off),
                            m,
                        )
                    };
                    before += m;
                });
                before == k
            });
            if helped >= 2 {
                break;
            }
        }
        assert!(
            helped >= 2,
            "the sender's stand-in never claimed two chunks"
        );
        // A sender gone after claiming: the receiver copies its chunk.
        let mut claimed = 0;
        for round in 0..50 {
            claimed += shared_copy(&format!("gone{round}"), Stand::Gone, |_, _, _, _| true);
            if claimed > 0 {
                break;
            }
        }
        assert!(
            claimed > 0,
            "the gone sender's stand-in never claimed a chunk"
        );
    }

    /// A sender that claims a chunk and never writes it, though alive and
    /// running, is waited for [`HELP_PATIENCE`], not for as long as it
    /// lives: the receiver then copies the chunk itself (the bytes are
    /// checked by `shared_copy`).
    #[test]
    fn a_chunk_claimed_and_never_written_is_copied_after_the_patience() {
        let (tx, rx) = std::sync::mpsc::channel();
        // On a thread of its own: a receive that waits for good must fail
        // the test, not hang it.
        std::thread::spawn(move || {
            for round in 0..50 {
                let start = std::time::Instant::now();
                let claimed =
                    shared_copy(&format!("stall{round}"), Stand::Stalls, |_, _, _, _| true);
                if claimed > 0 {
                    let _ = tx.send(start.elapsed());
                    return;
                }
            }
        });
        let waited = rx
            .recv_timeout(HELP_PATIENCE * 10)
            .expect("the receive still waits for the chunk its sender claimed");
        assert!(
            waited >= HELP_PATIENCE,
            "the receive ended after {waited:?}, before the patience ran out"
        );
    }
}
