//! Protection tags and registered memory.
//!
//! A region is a range of this process's memory that the Nic may read or
//! write. Its handle names a slot of a fixed table plus a generation, so a
//! stale handle is recognised. Lookups on the data path read the slot with
//! atomic loads and take no lock; registration and deregistration (slow path)
//! take the table's mutex.

use crate::desc::MemHandle;
use crate::error::MemError;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

/// A protection tag. Every region and every VI carries one; a descriptor may
/// use only memory whose tag matches its VI's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ptag(pub(crate) u32);

impl Ptag {
    /// The raw value (for the C API).
    pub fn raw(self) -> u32 {
        self.0
    }

    /// A tag from its raw value (the C API's handles). A value that names no
    /// tag of a Nic is refused by that Nic's calls, never trusted.
    pub fn from_raw(v: u32) -> Ptag {
        Ptag(v)
    }
}

/// What a region lets the peer do and which tag guards it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemAttributes {
    pub ptag: Ptag,
    /// A peer may RDMA-write into the region.
    pub enable_rdma_write: bool,
    /// A peer may RDMA-read from the region.
    pub enable_rdma_read: bool,
    /// Only read: by this side's sends and RDMA writes and by the peer's
    /// RDMA reads; never a receive's buffer, an RDMA read's destination or
    /// an RDMA write's target. Such a region may be read-only memory. Not
    /// VIA's (whose registration pins memory for writing): libfabric's
    /// registrations for sending alone.
    pub read_only: bool,
}

impl MemAttributes {
    pub fn new(ptag: Ptag) -> MemAttributes {
        MemAttributes {
            ptag,
            enable_rdma_write: false,
            enable_rdma_read: false,
            read_only: false,
        }
    }

    pub fn rdma_write(mut self, on: bool) -> Self {
        self.enable_rdma_write = on;
        self
    }

    pub fn rdma_read(mut self, on: bool) -> Self {
        self.enable_rdma_read = on;
        self
    }

    pub fn read_only(mut self, on: bool) -> Self {
        self.read_only = on;
        self
    }

    /// The region's flags as stored.
    fn flags(&self) -> u32 {
        (self.enable_rdma_write as u32 * FLAG_RDMA_WRITE)
            | (self.enable_rdma_read as u32 * FLAG_RDMA_READ)
            | (self.read_only as u32 * FLAG_READ_ONLY)
    }
}

/// What a region lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    pub start: u64,
    pub len: u64,
    pub attrs: MemAttributes,
    /// The memfd behind the region (shareable with a peer), or -1.
    pub(crate) fd: i32,
    /// The address the memfd's offset 0 is mapped at, and how many bytes
    /// of it are mapped there: the part of the region a peer can map. The
    /// whole region for memory the Nic allocated; the whole pages of caller
    /// memory a face placed in a memfd (see [`crate::Nic::register_shared_mem`]).
    pub(crate) fd_base: u64,
    pub(crate) fd_len: u64,
    /// Distinguishes registrations that reuse a handle's slot and generation.
    pub(crate) serial: u32,
}

impl RegionInfo {
    /// True when `[addr, addr + len)` lies inside the region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.start
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.start + self.len)
    }
}

/// Why a handle did not pass a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error("memory handle {0:#x} does not name a registered region")]
    NotRegistered(u32),
    #[error("memory handle {handle:#x} has protection tag {region} but the VI has {vi}")]
    WrongPtag { handle: u32, region: u32, vi: u32 },
    #[error("range {addr:#x}+{len} lies outside region {handle:#x} ({start:#x}+{region_len})")]
    OutOfBounds {
        handle: u32,
        addr: u64,
        len: u64,
        start: u64,
        region_len: u64,
    },
    #[error("region {0:#x} does not allow remote RDMA write")]
    RdmaWriteDisabled(u32),
    #[error("region {0:#x} does not allow remote RDMA read")]
    RdmaReadDisabled(u32),
    #[error("region {0:#x} was registered to be read only, and this would write into it")]
    ReadOnly(u32),
}

const FLAG_RDMA_WRITE: u32 = 1;
const FLAG_RDMA_READ: u32 = 2;
const FLAG_READ_ONLY: u32 = 4;
const INDEX_BITS: u32 = 16;

#[derive(Default)]
struct Slot {
    /// Generation of the current registration; 0 while free.
    gen: AtomicU32,
    start: AtomicU64,
    len: AtomicU64,
    ptag: AtomicU32,
    flags: AtomicU32,
    fd: std::sync::atomic::AtomicI32,
    fd_base: AtomicU64,
    fd_len: AtomicU64,
    serial: AtomicU32,
}

/// The memfd behind a region and the window of it mapped at `base`
/// (see [`RegionInfo::fd_base`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backing {
    pub fd: i32,
    pub base: u64,
    pub len: u64,
}

impl Backing {
    /// Caller memory no peer can map.
    pub const NONE: Backing = Backing {
        fd: -1,
        base: 0,
        len: 0,
    };

    /// Memfd `fd` mapped at `addr` for `len` bytes; refused if it names no
    /// memory (no descriptor, empty, or wrapping the address space).
    pub fn window(fd: i32, addr: *mut u8, len: usize) -> Result<Backing, MemError> {
        let base = addr as u64;
        if fd < 0 || len == 0 || base.checked_add(len as u64).is_none() {
            return Err(MemError::BadBacking);
        }
        Ok(Backing {
            fd,
            base,
            len: len as u64,
        })
    }
}

/// The Nic's region table.
pub(crate) struct RegionTable {
    slots: Box<[Slot]>,
    alloc: Mutex<TableAlloc>,
}

struct TableAlloc {
    free: Vec<u32>,
    next_gen: u32,
    next_serial: u32,
}

impl RegionTable {
    pub(crate) fn new(capacity: usize) -> RegionTable {
        let capacity = capacity.clamp(1, 1 << INDEX_BITS);
        RegionTable {
            slots: (0..capacity).map(|_| Slot::default()).collect(),
            alloc: Mutex::new(TableAlloc {
                free: (0..capacity as u32).rev().collect(),
                next_gen: 1,
                next_serial: 1,
            }),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Registers a range; `back` is the memfd behind it, if any.
    pub(crate) fn insert(
        &self,
        start: u64,
        len: u64,
        attrs: MemAttributes,
        back: Backing,
    ) -> Option<MemHandle> {
        let mut a = self.alloc.lock().unwrap_or_else(|p| p.into_inner());
        let idx = a.free.pop()?;
        let gen = a.next_gen;
        a.next_gen = if a.next_gen == u16::MAX as u32 {
            1
        } else {
            a.next_gen + 1
        };
        let s = &self.slots[idx as usize];
        s.start.store(start, Ordering::Relaxed);
        s.len.store(len, Ordering::Relaxed);
        s.ptag.store(attrs.ptag.0, Ordering::Relaxed);
        s.flags.store(attrs.flags(), Ordering::Relaxed);
        s.fd.store(back.fd, Ordering::Relaxed);
        s.fd_base.store(back.base, Ordering::Relaxed);
        s.fd_len.store(back.len, Ordering::Relaxed);
        s.serial.store(a.next_serial, Ordering::Relaxed);
        a.next_serial = a.next_serial.wrapping_add(1);
        // Release: a lookup that sees this generation sees the fields above.
        s.gen.store(gen, Ordering::Release);
        Some(MemHandle((gen << INDEX_BITS) | idx))
    }

    pub(crate) fn remove(&self, h: MemHandle) -> Option<RegionInfo> {
        let info = self.lookup(h)?;
        let mut a = self.alloc.lock().unwrap_or_else(|p| p.into_inner());
        let idx = h.0 & ((1 << INDEX_BITS) - 1);
        // Re-check under the lock: a concurrent remove of the same handle wins once.
        if self.slots[idx as usize].gen.load(Ordering::Relaxed) != h.0 >> INDEX_BITS {
            return None;
        }
        self.slots[idx as usize].gen.store(0, Ordering::Release);
        a.free.push(idx);
        Some(info)
    }

    /// Gives region `h`, registered without one, the memfd behind it: the
    /// posts after this name it to peers (those before keep their view).
    pub(crate) fn set_backing(&self, h: MemHandle, back: Backing) -> Result<(), MemError> {
        let _a = self.alloc.lock().unwrap_or_else(|p| p.into_inner());
        let info = self.lookup(h).ok_or(MemError::NotRegistered(h.0))?;
        if info.fd >= 0 {
            return Err(MemError::AlreadyBacked(h.0));
        }
        let s = &self.slots[(h.0 & ((1 << INDEX_BITS) - 1)) as usize];
        s.fd_base.store(back.base, Ordering::Relaxed);
        s.fd_len.store(back.len, Ordering::Relaxed);
        // Release: a lookup that sees the descriptor (Acquire) sees the
        // window above; one that does not sees none.
        s.fd.store(back.fd, Ordering::Release);
        Ok(())
    }

    pub(crate) fn set_attributes(&self, h: MemHandle, attrs: MemAttributes) -> Option<()> {
        let _a = self.alloc.lock().unwrap_or_else(|p| p.into_inner());
        self.lookup(h)?;
        let s = &self.slots[(h.0 & ((1 << INDEX_BITS) - 1)) as usize];
        s.ptag.store(attrs.ptag.0, Ordering::Relaxed);
        s.flags.store(attrs.flags(), Ordering::Release);
        Some(())
    }

    /// True if `h` is registered under `ptag` and holds `addr..addr+len`:
    /// the answer of [`check`](Self::check) without building the region's
    /// description or an error, for a post's fast path (which asks `check`
    /// again for the error when this says no). Lock-free.
    #[inline(always)]
    pub(crate) fn allows(&self, h: MemHandle, ptag: Ptag, addr: u64, len: u64) -> bool {
        let idx = (h.0 & ((1 << INDEX_BITS) - 1)) as usize;
        let gen = h.0 >> INDEX_BITS;
        let Some(s) = self.slots.get(idx) else {
            return false;
        };
        // Acquire: pairs with the Release in `insert`; the second load
        // rejects fields read across a deregistration, as in `lookup`.
        if gen == 0 || s.gen.load(Ordering::Acquire) != gen {
            return false;
        }
        let (start, rlen) = (
            s.start.load(Ordering::Relaxed),
            s.len.load(Ordering::Relaxed),
        );
        s.ptag.load(Ordering::Relaxed) == ptag.0
            && addr >= start
            && addr.checked_add(len).is_some_and(|end| end <= start + rlen)
            && s.gen.load(Ordering::Acquire) == gen
    }

    /// True while `h` names the registration whose serial is `serial`: the
    /// check a posted descriptor's memory passes before the Nic touches it
    /// again. Lock-free, and lighter than [`lookup`](Self::lookup): two loads
    /// of the generation and one of the serial.
    #[inline]
    pub(crate) fn is_current(&self, h: MemHandle, serial: u32) -> bool {
        let idx = (h.0 & ((1 << INDEX_BITS) - 1)) as usize;
        let gen = h.0 >> INDEX_BITS;
        let Some(s) = self.slots.get(idx) else {
            return false;
        };
        // Acquire: pairs with the Release in `insert`; the second load
        // rejects a serial read across a deregistration, as in `lookup`.
        gen != 0
            && s.gen.load(Ordering::Acquire) == gen
            && s.serial.load(Ordering::Relaxed) == serial
            && s.gen.load(Ordering::Acquire) == gen
    }

    /// The region `h` names, if it is registered. Lock-free.
    #[inline]
    pub(crate) fn lookup(&self, h: MemHandle) -> Option<RegionInfo> {
        let idx = (h.0 & ((1 << INDEX_BITS) - 1)) as usize;
        let gen = h.0 >> INDEX_BITS;
        let s = self.slots.get(idx)?;
        // Acquire: pairs with the Release in `insert`.
        if gen == 0 || s.gen.load(Ordering::Acquire) != gen {
            return None;
        }
        let flags = s.flags.load(Ordering::Acquire);
        let info = RegionInfo {
            start: s.start.load(Ordering::Relaxed),
            len: s.len.load(Ordering::Relaxed),
            attrs: MemAttributes {
                ptag: Ptag(s.ptag.load(Ordering::Relaxed)),
                enable_rdma_write: flags & FLAG_RDMA_WRITE != 0,
                enable_rdma_read: flags & FLAG_RDMA_READ != 0,
                read_only: flags & FLAG_READ_ONLY != 0,
            },
            // Acquire: pairs with `set_backing`, which stores the window first.
            fd: s.fd.load(Ordering::Acquire),
            fd_base: s.fd_base.load(Ordering::Relaxed),
            fd_len: s.fd_len.load(Ordering::Relaxed),
            serial: s.serial.load(Ordering::Relaxed),
        };
        // A deregistration racing with this lookup changes the generation;
        // re-reading it rejects a torn view.
        if s.gen.load(Ordering::Acquire) != gen {
            return None;
        }
        Some(info)
    }

    /// Checks that `[addr, addr+len)` is inside region `h` under tag `ptag`.
    #[inline]
    pub(crate) fn check(
        &self,
        h: MemHandle,
        ptag: Ptag,
        addr: u64,
        len: u64,
    ) -> Result<RegionInfo, AccessError> {
        let r = self.lookup(h).ok_or(AccessError::NotRegistered(h.0))?;
        if r.attrs.ptag != ptag {
            return Err(AccessError::WrongPtag {
                handle: h.0,
                region: r.attrs.ptag.0,
                vi: ptag.0,
            });
        }
        if !r.contains(addr, len) {
            return Err(AccessError::OutOfBounds {
                handle: h.0,
                addr,
                len,
                start: r.start,
                region_len: r.len,
            });
        }
        Ok(r)
    }

    pub(crate) fn uses_ptag(&self, ptag: Ptag) -> bool {
        self.slots
            .iter()
            .any(|s| s.gen.load(Ordering::Acquire) != 0 && s.ptag.load(Ordering::Relaxed) == ptag.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_lookup_remove_and_stale_handle() {
        let t = RegionTable::new(4);
        let a = MemAttributes::new(Ptag(1)).rdma_write(true);
        let h = t.insert(0x1000, 0x100, a, Backing::NONE).unwrap();
        let r = t.lookup(h).unwrap();
        assert_eq!((r.start, r.len, r.attrs), (0x1000, 0x100, a));
        assert!(t.check(h, Ptag(1), 0x1080, 0x80).is_ok());
        assert!(matches!(
            t.check(h, Ptag(1), 0x1080, 0x81),
            Err(AccessError::OutOfBounds { .. })
        ));
        assert!(matches!(
            t.check(h, Ptag(2), 0x1000, 1),
            Err(AccessError::WrongPtag { .. })
        ));
        assert!(t.remove(h).is_some());
        assert!(t.lookup(h).is_none());
        assert!(t.remove(h).is_none(), "second removal of one handle fails");
        let h2 = t.insert(0x1000, 0x100, a, Backing::NONE).unwrap();
        assert_ne!(h, h2, "slot reuse gets a new generation");
        assert_eq!(
            t.check(h, Ptag(1), 0x1000, 1),
            Err(AccessError::NotRegistered(h.0))
        );
    }

    #[test]
    fn a_window_given_after_registration_is_seen_once() {
        let t = RegionTable::new(2);
        let a = MemAttributes::new(Ptag(1));
        let h = t.insert(0x1000, 0x2000, a, Backing::NONE).unwrap();
        assert_eq!(t.lookup(h).unwrap().fd, -1);
        let back = Backing {
            fd: 7,
            base: 0x1000,
            len: 0x2000,
        };
        assert_eq!(t.set_backing(h, back), Ok(()));
        let r = t.lookup(h).unwrap();
        assert_eq!((r.fd, r.fd_base, r.fd_len), (7, 0x1000, 0x2000));
        let other = Backing { fd: 8, ..back };
        assert_eq!(t.set_backing(h, other), Err(MemError::AlreadyBacked(h.0)));
        assert_eq!(t.lookup(h).unwrap().fd, 7, "the first window stays");
        t.remove(h).unwrap();
        assert_eq!(t.set_backing(h, back), Err(MemError::NotRegistered(h.0)));
    }

    #[test]
    fn table_full_and_overflowing_range() {
        let t = RegionTable::new(1);
        let a = MemAttributes::new(Ptag(1));
        let h = t.insert(u64::MAX - 10, 10, a, Backing::NONE).unwrap();
        assert!(t.insert(0, 1, a, Backing::NONE).is_none());
        assert!(matches!(
            t.check(h, Ptag(1), u64::MAX - 5, 100),
            Err(AccessError::OutOfBounds { .. })
        ));
        assert!(
            t.check(MemHandle(0), Ptag(1), 0, 0).is_err(),
            "handle 0 is never valid"
        );
    }
}
