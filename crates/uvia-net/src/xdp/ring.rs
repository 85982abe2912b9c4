//! The four single-producer, single-consumer rings an AF_XDP socket shares
//! with the kernel: fill and tx (we produce), rx and completion (we
//! consume).
//!
//! Each side keeps a cached copy of the other side's index and reads the
//! shared one only when the cache says the ring is full (producer) or empty
//! (consumer), so most operations touch no line the kernel writes. Indices
//! run freely and wrap at 2^32; the slot is the index masked by the size.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// A mapped ring: where its indices, flags and slots lie in the mapping.
pub(crate) struct RingMap {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; the ring types below say who
// writes what.
unsafe impl Send for RingMap {}

impl RingMap {
    /// Maps the ring at `pgoff` of the socket `fd`: `desc` is the offset of
    /// the slots and `size` their count, `elem` bytes each.
    pub(crate) fn map(
        fd: std::os::fd::RawFd,
        pgoff: libc::off_t,
        off: &libc::xdp_ring_offset,
        size: u32,
        elem: usize,
    ) -> io::Result<RingMap> {
        let len = off.desc as usize + size as usize * elem;
        // SAFETY: a fresh shared mapping of the socket's ring; the kernel
        // checks offset and length.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(RingMap {
            base: NonNull::new(p as *mut u8).ok_or_else(io::Error::last_os_error)?,
            len,
        })
    }

    fn at<T>(&self, off: u64) -> NonNull<T> {
        // SAFETY (of the arithmetic): the kernel's offsets lie inside the
        // mapping it sized.
        unsafe { self.base.add(off as usize).cast() }
    }
}

impl Drop for RingMap {
    fn drop(&mut self) {
        // SAFETY: unmapping what `map` mapped, once.
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// The shared parts of a ring.
struct Shared<T> {
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    flags: NonNull<AtomicU32>,
    slots: NonNull<T>,
    mask: u32,
    _map: RingMap,
}

impl<T> Shared<T> {
    fn new(map: RingMap, off: &libc::xdp_ring_offset, size: u32) -> Shared<T> {
        debug_assert!(size.is_power_of_two());
        Shared {
            producer: map.at(off.producer),
            consumer: map.at(off.consumer),
            flags: map.at(off.flags),
            slots: map.at(off.desc),
            mask: size - 1,
            _map: map,
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: an aligned u32 inside the live mapping.
        unsafe { self.producer.as_ref() }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as in `producer`.
        unsafe { self.consumer.as_ref() }
    }

    fn slot(&self, idx: u32) -> *mut T {
        // SAFETY (of the arithmetic): masked into the ring.
        unsafe { self.slots.as_ptr().add((idx & self.mask) as usize) }
    }

    /// The kernel asks to be woken (with a system call) to make progress.
    fn needs_wakeup(&self) -> bool {
        // SAFETY: as in `producer`. Relaxed: a hint; a stale value costs
        // one needless system call or one poll of delay.
        unsafe { self.flags.as_ref() }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }
}

/// A ring we fill and the kernel drains (fill, tx).
pub(crate) struct Producer<T> {
    s: Shared<T>,
    /// Next index we write.
    prod: u32,
    /// The kernel's consumer index plus the ring size, as last read: we may
    /// write up to (not including) it.
    limit: u32,
}

// SAFETY: only the owner writes our side; the kernel's side is atomics.
unsafe impl<T> Send for Producer<T> {}

impl<T: Copy> Producer<T> {
    pub(crate) fn new(map: RingMap, off: &libc::xdp_ring_offset, size: u32) -> Producer<T> {
        let s = Shared::new(map, off, size);
        let prod = s.producer().load(Ordering::Relaxed);
        let limit = s.consumer().load(Ordering::Relaxed).wrapping_add(size);
        Producer { s, prod, limit }
    }

    /// Free slots, reading the kernel's index only when the cached one
    /// shows fewer than `want`.
    pub(crate) fn free(&mut self, want: u32) -> u32 {
        let free = self.limit.wrapping_sub(self.prod);
        if free >= want {
            return free;
        }
        // Acquire: pairs with the kernel's release of its consumer index,
        // so it has finished reading the slots we are about to reuse.
        self.limit = self
            .s
            .consumer()
            .load(Ordering::Acquire)
            .wrapping_add(self.s.mask + 1);
        self.limit.wrapping_sub(self.prod)
    }

    /// Writes `v` into the next slot; call [`free`](Self::free) first. It
    /// is not visible to the kernel until [`submit`](Self::submit).
    pub(crate) fn push(&mut self, v: T) {
        debug_assert!(self.limit.wrapping_sub(self.prod) > 0);
        // SAFETY: the slot lies in the ring and the kernel has consumed it.
        unsafe { self.s.slot(self.prod).write(v) };
        self.prod = self.prod.wrapping_add(1);
    }

    /// Publishes every slot pushed so far.
    pub(crate) fn submit(&mut self) {
        // Release: the slots' contents are written before the kernel can
        // see the index that covers them.
        self.s.producer().store(self.prod, Ordering::Release);
    }

    pub(crate) fn needs_wakeup(&self) -> bool {
        self.s.needs_wakeup()
    }

    /// Slots submitted that the kernel has not taken yet.
    pub(crate) fn pending(&self) -> u32 {
        // Acquire: as in `free`.
        self.prod
            .wrapping_sub(self.s.consumer().load(Ordering::Acquire))
    }
}

/// A ring the kernel fills and we drain (rx, completion).
pub(crate) struct Consumer<T> {
    s: Shared<T>,
    /// Next index we read.
    cons: u32,
    /// The kernel's producer index as last read.
    avail_to: u32,
}

// SAFETY: as for `Producer`.
unsafe impl<T> Send for Consumer<T> {}

impl<T: Copy> Consumer<T> {
    pub(crate) fn new(map: RingMap, off: &libc::xdp_ring_offset, size: u32) -> Consumer<T> {
        let s = Shared::new(map, off, size);
        let cons = s.consumer().load(Ordering::Relaxed);
        Consumer {
            s,
            cons,
            avail_to: cons,
        }
    }

    /// Entries ready, reading the kernel's index only when the cached one
    /// shows none.
    pub(crate) fn ready(&mut self) -> u32 {
        let n = self.avail_to.wrapping_sub(self.cons);
        if n > 0 {
            return n;
        }
        // Acquire: pairs with the kernel's release of its producer index,
        // so the entries it covers are visible before we read them.
        self.avail_to = self.s.producer().load(Ordering::Acquire);
        self.avail_to.wrapping_sub(self.cons)
    }

    /// Asks for the next entry's cache line ahead of its read. A hint.
    pub(crate) fn prefetch(&self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the slot lies in the ring's mapping; a prefetch reads
        // nothing the program sees.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(self.s.slot(self.cons) as *const i8);
        }
    }

    /// Reads the next entry; call [`ready`](Self::ready) first. Its slot
    /// stays ours until [`release`](Self::release).
    pub(crate) fn pop(&mut self) -> T {
        debug_assert!(self.avail_to.wrapping_sub(self.cons) > 0);
        // SAFETY: the kernel published this slot (see `ready`).
        let v = unsafe { self.s.slot(self.cons).read() };
        self.cons = self.cons.wrapping_add(1);
        v
    }

    /// Hands every slot read so far back to the kernel.
    pub(crate) fn release(&mut self) {
        // Release: our reads of the slots happen before the kernel may
        // overwrite them.
        self.s.consumer().store(self.cons, Ordering::Release);
    }
}
