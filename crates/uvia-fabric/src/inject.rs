//! Injected operations: `fi_inject`, `fi_injectdata`, `fi_inject_write`
//! and the `FI_INJECT` flag copy the caller's bytes into a bounce buffer
//! of the endpoint's own, so the caller may reuse its buffer (and need not
//! register it) as soon as the call returns.
//!
//! The buffers are slots of one region the endpoint allocates when it is
//! enabled, as many as its send queue is deep: a post that finds the queue
//! full fails before it needs a slot, so an inject never waits for a slot
//! more than for the queue. A slot goes back when the CQ read takes its
//! descriptor back; `fi_inject*` operations then write no entry.

use crate::guard::lock;
use std::sync::Mutex;
use uvia::{MemAttributes, MemoryRegion, Nic, Ptag, Segment};

/// Largest injected message: ofi_rxm's packet header (64 B) and a payload
/// of up to 192 B. ofi_rxm injects a small message on the msg endpoint only
/// when header and payload fit; otherwise it sends from a buffer of its own
/// and must take the send's completion back: one more CQ entry and buffer
/// per message. With 64 B, an 8 B rdm message missed by 8 B.
pub const INJECT_SIZE: usize = 256;

/// An endpoint's bounce buffers.
pub struct Bounce {
    region: MemoryRegion,
    free: Mutex<Vec<u32>>,
}

impl Bounce {
    /// `slots` buffers of [`INJECT_SIZE`] bytes, registered under `ptag`.
    pub fn new(nic: &Nic, ptag: Ptag, slots: u32) -> Option<Bounce> {
        let region = nic
            .alloc_region(slots as usize * INJECT_SIZE, MemAttributes::new(ptag))
            .ok()?;
        Some(Bounce {
            region,
            free: Mutex::new((0..slots).rev().collect()),
        })
    }

    /// Copies `bytes` (at most [`INJECT_SIZE`]) into a free slot: the slot
    /// and the segment that sends it. `None` when every slot is in use.
    pub fn fill(&self, bytes: &[&[u8]]) -> Option<(u32, Segment)> {
        let total: usize = bytes.iter().map(|b| b.len()).sum();
        debug_assert!(total <= INJECT_SIZE);
        let slot = lock(&self.free).pop()?;
        let offset = slot as usize * INJECT_SIZE;
        let mut at = offset;
        for b in bytes {
            // SAFETY: the slot lies inside the region (slot < slots) and is
            // ours alone until `release`; `total <= INJECT_SIZE` keeps the
            // copy inside it.
            unsafe {
                std::ptr::copy_nonoverlapping(b.as_ptr(), self.region.addr().add(at), b.len())
            };
            at += b.len();
        }
        Some((slot, self.region.segment(offset, total)))
    }

    /// Gives back a slot whose descriptor completed.
    pub fn release(&self, slot: u32) {
        lock(&self.free).push(slot);
    }
}
