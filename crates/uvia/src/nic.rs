//! The Nic: an opened provider instance and the owner of protection tags,
//! registered memory, VIs and completion queues.

use crate::cq::Cq;
use crate::desc::{MemHandle, Segment};
use crate::error::{MemError, OpenError, PtagError, ViAttrError};
use crate::mem::{Backing, MemAttributes, Ptag, RegionInfo, RegionTable};
use crate::provider::NicProvider;
use crate::vi::{Reliability, Vi, ViAttributes};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use uvia_shm::Segment as ShmSegment;

/// What a Nic can do, fixed when it is opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicAttributes {
    /// The name it was opened with.
    pub name: String,
    /// The provider behind it.
    pub provider: &'static str,
    /// The address peers connect to (for `shm`, the instance name).
    pub address: String,
    pub max_transfer_size: u32,
    pub max_segments_per_desc: usize,
    pub max_queue_depth: u32,
    pub max_cq_entries: usize,
    pub max_ptags: usize,
    pub max_registered_regions: usize,
    /// Largest message sent inline in the ring; larger ones are copied once, by reference.
    pub inline_threshold: usize,
    /// Largest message the provider carries itself from memory a peer
    /// cannot map; a longer one from memory with a shared window
    /// ([`Nic::register_shared_mem`], [`Nic::set_region_backing`]) is copied
    /// once out of the peer's mapping of it, and from other memory read by
    /// cross-memory attach. `None` where no peer maps memory (the network
    /// providers).
    pub shared_window_from: Option<usize>,
    /// Smallest message whose copy the receiver shares with a polling
    /// sender, which writes its part straight into the receive buffer:
    /// into a mapping of it where the buffer lies in a memfd (memory the
    /// Nic allocated, or with a shared window), else by cross-memory
    /// attach. `None` where no peer maps memory.
    pub shared_copy_from: Option<usize>,
    pub reliability_levels: &'static [Reliability],
    pub rdma_read: bool,
    pub rdma_write: bool,
    /// Peer-to-peer connection ([`Vi::connect_peer_request`]) is offered.
    pub peer_to_peer: bool,
    /// Peers live on this host only: a host address names a Nic instance
    /// here, and this host's own names stand for this Nic's address.
    pub host_local: bool,
    /// The provider's protocol has timers (acknowledgements,
    /// retransmissions, keep-alives) that run only inside library calls: a
    /// program that may go long without a done or wait call should call
    /// [`Vi::drive`] now and then, or its peers see it fall silent.
    pub needs_driving: bool,
}

impl NicAttributes {
    /// What every provider offers today: 16 MiB transfers, the queue, CQ,
    /// tag and region limits, all three reliability levels and RDMA both
    /// ways; a provider's open sets its own inline threshold and
    /// capabilities on top.
    pub(crate) fn common(name: &str, provider: &'static str, address: String) -> NicAttributes {
        NicAttributes {
            name: name.to_string(),
            provider,
            address,
            max_transfer_size: MAX_TRANSFER,
            max_segments_per_desc: crate::desc::MAX_SEGMENTS,
            max_queue_depth: 4096,
            max_cq_entries: 1 << 16,
            max_ptags: 256,
            max_registered_regions: 4096,
            inline_threshold: 0,
            shared_window_from: None,
            shared_copy_from: None,
            reliability_levels: &[
                Reliability::Unreliable,
                Reliability::ReliableDelivery,
                Reliability::ReliableReception,
            ],
            rdma_read: true,
            rdma_write: true,
            peer_to_peer: false,
            host_local: false,
            needs_driving: false,
        }
    }
}

/// The largest transfer every provider's Nic takes (its attributes'
/// `max_transfer_size`): 16 MiB.
pub const MAX_TRANSFER: u32 = 16 << 20;

/// A network peer silent this long is dead, unless
/// [`NicOptions::idle_timeout`] says otherwise: every outstanding descriptor
/// of its connections then completes with an error. Keep-alives go at a
/// quarter of it, so a live but idle peer answers three times before it is
/// given up.
pub const DEFAULT_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

static NIC_SERIAL: AtomicU32 = AtomicU32::new(1);

pub(crate) struct NicShared {
    pub attrs: NicAttributes,
    pub serial: u32,
    pub regions: RegionTable,
    /// Per allocated tag: how many VIs use it.
    ptags: Mutex<Vec<Option<usize>>>,
    /// The provider's half of the Nic.
    pub provider: NicProvider,
    pub next_vi: AtomicU32,
}

/// Settings for [`Nic::open_with`].
#[derive(Clone, Debug, Default)]
pub struct NicOptions {
    /// Faults to inject on a network Nic's receive path, as
    /// `loss=0.05,dup=0.01,reorder=0.01,delay=100us,corrupt=0.001,seed=7`.
    /// `None` reads the `UVIA_INJECT` environment variable.
    pub inject: Option<String>,
    /// Silence from a peer longer than this breaks its connections
    /// (network Nics; default [`DEFAULT_IDLE_TIMEOUT`]).
    pub idle_timeout: Option<std::time::Duration>,
    /// A job key, any text: every connection request this Nic sends
    /// carries it, and this Nic's listeners refuse requests that carry
    /// another or none ([`ConnectError::WrongJob`](crate::ConnectError::WrongJob)),
    /// so two jobs on the same hosts and discriminators stay apart, as a
    /// launcher's job id keeps them. `None` reads `UVIA_JOB_KEY`; unset or
    /// empty, no key (the default). The key travels as a 64-bit hash in
    /// the clear: it keeps jobs apart, it is no secret from a peer that
    /// reads the traffic.
    pub job_key: Option<String>,
    /// A network Nic's protocol timers run only in the program's calls
    /// (and a face's own thread): the library's progress thread, which
    /// otherwise serves the timers of a network Nic nobody sweeps for a
    /// while (see `progress.rs`), leaves this one alone. A program that
    /// waits on one Nic's connection while another Nic's peer waits for an
    /// acknowledgement then leaves that peer waiting.
    pub manual_progress: bool,
}

/// The 64-bit form of a job key ([`NicOptions::job_key`], else
/// `UVIA_JOB_KEY`); 0 for none.
pub(crate) fn job_key(opts: &NicOptions) -> u64 {
    let key = match &opts.job_key {
        Some(k) => k.clone(),
        None => std::env::var("UVIA_JOB_KEY").unwrap_or_default(),
    };
    if key.is_empty() {
        return 0;
    }
    // FNV-1a by hand: every process of a job must hash its key alike,
    // whatever it was built with, which std's hasher does not promise.
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    });
    h.max(1)
}

/// An opened provider instance. Cheap to clone; closed when the last clone,
/// VI, CQ and region are gone.
#[derive(Clone)]
pub struct Nic {
    pub(crate) s: Arc<NicShared>,
}

/// A reference to a Nic that does not keep it open ([`Nic::downgrade`]):
/// for a table of the Nics a process has open, where a medium allows one
/// Nic per interface.
#[derive(Clone, Debug)]
pub struct WeakNic(std::sync::Weak<NicShared>);

impl WeakNic {
    /// The Nic, if it is still open.
    pub fn upgrade(&self) -> Option<Nic> {
        self.0.upgrade().map(|s| Nic { s })
    }
}

impl std::fmt::Debug for Nic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nic")
            .field("name", &self.s.attrs.name)
            .finish()
    }
}

impl Nic {
    /// A reference that does not keep the Nic open.
    pub fn downgrade(&self) -> WeakNic {
        WeakNic(Arc::downgrade(&self.s))
    }

    /// Opens a provider by name: `shm` (instance `0`) or `shm:<instance>`
    /// (instances are separate address spaces for discriminators on one
    /// host); `udp` (127.0.0.1, any port) or `udp:<ip>[:<port>]`, IPv6 in
    /// brackets; `xdp:<interface>[:<queue>][:native|:generic][:busypoll]` (raw
    /// Ethernet, root only).
    pub fn open(name: &str) -> Result<Nic, OpenError> {
        Nic::open_with(name, &NicOptions::default())
    }

    /// Opens a provider with settings.
    pub fn open_with(name: &str, opts: &NicOptions) -> Result<Nic, OpenError> {
        let provider =
            crate::provider::lookup(name).ok_or_else(|| OpenError::UnknownProvider(name.into()))?;
        let (attrs, provider) = (provider.open)(name, opts)?;
        let serial = NIC_SERIAL.fetch_add(1, Ordering::Relaxed) & 0xffff;
        let s = Arc::new(NicShared {
            regions: RegionTable::new(attrs.max_registered_regions),
            ptags: Mutex::new(vec![None; attrs.max_ptags]),
            provider,
            next_vi: AtomicU32::new(1),
            serial,
            attrs,
        });
        s.provider.opened(&Arc::downgrade(&s));
        if s.attrs.needs_driving && !opts.manual_progress {
            crate::progress::watch(&s);
        }
        Ok(Nic { s })
    }

    pub fn attributes(&self) -> &NicAttributes {
        &self.s.attrs
    }

    /// True if `host` is written as an address of this Nic's provider (an
    /// `ip:port` on udp, a MAC address on xdp) or is this Nic's own address.
    /// On `shm`, whose instance names are any word, only the Nic's own is.
    /// Says nothing of whether anyone answers there.
    pub fn is_host_address(&self, host: &str) -> bool {
        if host == self.s.attrs.address {
            return true;
        }
        self.s.provider.is_address(host)
    }

    /// Creates a protection tag.
    pub fn create_ptag(&self) -> Result<Ptag, PtagError> {
        let mut t = self.s.ptags.lock().unwrap_or_else(|p| p.into_inner());
        let idx = t
            .iter()
            .position(Option::is_none)
            .ok_or(PtagError::TableFull(t.len()))?;
        t[idx] = Some(0);
        Ok(Ptag((self.s.serial << 16) | idx as u32))
    }

    /// Destroys a tag that no region and no VI uses.
    pub fn destroy_ptag(&self, ptag: Ptag) -> Result<(), PtagError> {
        let mut t = self.s.ptags.lock().unwrap_or_else(|p| p.into_inner());
        let idx = self.s.ptag_index(ptag).ok_or(PtagError::Invalid(ptag.0))?;
        match t[idx] {
            None => Err(PtagError::Invalid(ptag.0)),
            Some(n) if n > 0 || self.s.regions.uses_ptag(ptag) => Err(PtagError::InUse(ptag.0)),
            Some(_) => {
                t[idx] = None;
                Ok(())
            }
        }
    }

    /// Registers `len` bytes at `addr` and returns their handle.
    ///
    /// # Safety
    /// The memory must stay allocated until it is deregistered, and while a
    /// descriptor that names it is posted the caller must not touch the bytes
    /// the descriptor will read or write: the Nic (and, through RDMA enabled
    /// here, the peer) accesses them concurrently.
    pub unsafe fn register_mem(
        &self,
        addr: *mut u8,
        len: usize,
        attrs: MemAttributes,
    ) -> Result<MemHandle, MemError> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.register_backed(addr, len, attrs, Backing::NONE) }
    }

    /// Registers `len` bytes at `addr`, where the `fd_len` bytes at
    /// `fd_addr` are a shared mapping of memfd `fd` from its offset 0, so
    /// the `shm` provider lets a peer map the part of the range that lies
    /// in that window and copy from it once, as from memory
    /// [`alloc_region`](Self::alloc_region) allocated; the rest of the range
    /// goes by cross-memory attach. The window may reach past the range (a
    /// memfd shared by several registrations): only bytes inside the range
    /// are ever named to a peer.
    ///
    /// # Safety
    /// As [`register_mem`](Self::register_mem); besides, `fd` must be a
    /// memfd sealed against shrinking (`uvia_shm::segment::SEALS`), mapped
    /// shared at `fd_addr` for `fd_len` bytes, and stay open until the
    /// region is deregistered.
    pub unsafe fn register_shared_mem(
        &self,
        addr: *mut u8,
        len: usize,
        attrs: MemAttributes,
        fd: std::os::fd::RawFd,
        fd_addr: *mut u8,
        fd_len: usize,
    ) -> Result<MemHandle, MemError> {
        let back = Backing::window(fd, fd_addr, fd_len)?;
        // SAFETY: the caller's promise, passed on.
        unsafe { self.register_backed(addr, len, attrs, back) }
    }

    /// Gives region `h`, registered with [`register_mem`](Self::register_mem),
    /// the memfd its memory has been moved into since: from the next post
    /// on, the `shm` provider lets a peer map the part of the region that
    /// lies in the window, as if it had been registered with
    /// [`register_shared_mem`](Self::register_shared_mem). Descriptors
    /// posted before keep reading the memory as before.
    ///
    /// # Safety
    /// As for [`register_shared_mem`](Self::register_shared_mem): `fd` a
    /// memfd sealed against shrinking, mapped shared at `fd_addr` for
    /// `fd_len` bytes, open until the region is deregistered.
    pub unsafe fn set_region_backing(
        &self,
        h: MemHandle,
        fd: std::os::fd::RawFd,
        fd_addr: *mut u8,
        fd_len: usize,
    ) -> Result<(), MemError> {
        let back = Backing::window(fd, fd_addr, fd_len)?;
        self.s.regions.set_backing(h, back)
    }

    unsafe fn register_backed(
        &self,
        addr: *mut u8,
        len: usize,
        attrs: MemAttributes,
        back: Backing,
    ) -> Result<MemHandle, MemError> {
        if len == 0 {
            return Err(MemError::Empty);
        }
        if (addr as u64).checked_add(len as u64).is_none() {
            return Err(MemError::Wraps {
                addr: addr as u64,
                len: len as u64,
            });
        }
        if !is_mapped(addr, len) {
            return Err(MemError::Unmapped {
                addr: addr as u64,
                len: len as u64,
            });
        }
        if !ends_accessible(addr, len, !attrs.read_only) {
            return Err(MemError::NotAccessible {
                addr: addr as u64,
                len: len as u64,
                write: !attrs.read_only,
            });
        }
        self.register(addr, len, attrs, back)
    }

    fn register(
        &self,
        addr: *mut u8,
        len: usize,
        attrs: MemAttributes,
        back: Backing,
    ) -> Result<MemHandle, MemError> {
        if attrs.read_only && attrs.enable_rdma_write {
            return Err(MemError::ReadOnlyRdmaWrite);
        }
        self.s
            .check_ptag(attrs.ptag)
            .map_err(|_| MemError::InvalidPtag(attrs.ptag.0))?;
        self.s
            .regions
            .insert(addr as u64, len as u64, attrs, back)
            .ok_or(MemError::TableFull(self.s.regions.capacity()))
    }

    /// Deregisters a region registered with [`register_mem`](Self::register_mem).
    pub fn deregister_mem(&self, h: MemHandle) -> Result<(), MemError> {
        self.s
            .regions
            .remove(h)
            .ok_or(MemError::NotRegistered(h.0))?;
        self.s.provider.regions_changed(&self.s);
        Ok(())
    }

    /// What a handle names.
    #[inline]
    pub fn query_mem(&self, h: MemHandle) -> Result<RegionInfo, MemError> {
        self.s.regions.lookup(h).ok_or(MemError::NotRegistered(h.0))
    }

    /// Changes a region's tag and RDMA enable bits.
    /// A region registered to be read only stays so (its memory was not
    /// checked for writing).
    pub fn set_mem_attributes(&self, h: MemHandle, attrs: MemAttributes) -> Result<(), MemError> {
        self.s
            .check_ptag(attrs.ptag)
            .map_err(|_| MemError::InvalidPtag(attrs.ptag.0))?;
        let was = self.query_mem(h)?;
        let attrs = attrs.read_only(was.attrs.read_only);
        if attrs.read_only && attrs.enable_rdma_write {
            return Err(MemError::ReadOnlyRdmaWrite);
        }
        self.s
            .regions
            .set_attributes(h, attrs)
            .ok_or(MemError::NotRegistered(h.0))?;
        self.s.provider.regions_changed(&self.s);
        Ok(())
    }

    /// Allocates `len` zeroed, page-aligned bytes and registers them.
    ///
    /// The memory is a memfd mapping, so the `shm` provider can let a peer
    /// map it read-only and copy large messages out of it once, with a plain
    /// memory copy (memory registered with [`register_mem`](Self::register_mem)
    /// is copied by cross-memory attach instead).
    pub fn alloc_region(&self, len: usize, attrs: MemAttributes) -> Result<MemoryRegion, MemError> {
        if len == 0 {
            return Err(MemError::Empty);
        }
        let seg = ShmSegment::create(c"uvia-region", len).map_err(|e| MemError::Alloc {
            len,
            reason: e.to_string(),
        })?;
        let back = Backing {
            fd: seg.fd(),
            base: seg.as_ptr() as u64,
            len: len as u64,
        };
        let handle = self.register(seg.as_ptr(), len, attrs, back)?;
        Ok(MemoryRegion {
            nic: self.clone(),
            seg,
            len,
            handle,
        })
    }

    /// Creates a VI. Completions of its send and receive queues are reported
    /// to the given CQs, if any.
    pub fn create_vi(
        &self,
        attrs: ViAttributes,
        send_cq: Option<&Cq>,
        recv_cq: Option<&Cq>,
    ) -> Result<Vi, ViAttrError> {
        Vi::create(self, attrs, send_cq, recv_cq)
    }

    /// Creates a completion queue with room for `entries` notices.
    pub fn create_cq(&self, entries: usize) -> Result<Cq, crate::CqError> {
        Cq::create(self, entries, false)
    }

    /// Creates a completion queue that keeps no notices: [`Cq::take_raw`]
    /// and [`Cq::done`] look at the head of each attached VI queue in turn
    /// instead (see [`Cq`]). For faces that take descriptors straight off
    /// the CQ and need no order across VIs (libfabric's CQs).
    pub fn create_direct_cq(&self, entries: usize) -> Result<Cq, crate::CqError> {
        Cq::create(self, entries, true)
    }
}

impl NicShared {
    fn ptag_index(&self, p: Ptag) -> Option<usize> {
        let idx = (p.0 & 0xffff) as usize;
        (p.0 >> 16 == self.serial && idx < self.attrs.max_ptags).then_some(idx)
    }

    pub(crate) fn check_ptag(&self, p: Ptag) -> Result<(), ()> {
        let t = self.ptags.lock().unwrap_or_else(|e| e.into_inner());
        match self.ptag_index(p) {
            Some(i) if t[i].is_some() => Ok(()),
            _ => Err(()),
        }
    }

    /// Counts a VI's use of `p`; `false` if the tag is not ours.
    pub(crate) fn hold_ptag(&self, p: Ptag, delta: isize) -> bool {
        let mut t = self.ptags.lock().unwrap_or_else(|e| e.into_inner());
        match self.ptag_index(p).and_then(|i| t[i].as_mut()) {
            Some(n) => {
                *n = n.saturating_add_signed(delta);
                true
            }
            None => false,
        }
    }
}

/// Memory the Nic allocated and registered; deregistered and freed on drop.
pub struct MemoryRegion {
    nic: Nic,
    seg: ShmSegment,
    len: usize,
    handle: MemHandle,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("handle", &self.handle)
            .field("len", &self.len)
            .finish()
    }
}

/// True if every page of `addr..addr + len` is mapped in this process.
/// `msync` with `MS_ASYNC` fails with ENOMEM on a range with a hole in it
/// and otherwise does nothing (the kernel writes dirty pages back on its
/// own schedule since 2.6.19): one system call whatever the length, no
/// page touched, no advice changed.
fn is_mapped(addr: *mut u8, len: usize) -> bool {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
    let start = addr as usize & !(page - 1);
    let end = (addr as usize).saturating_add(len);
    // SAFETY: msync reads no memory and, with MS_ASYNC, writes none; an
    // unmapped range is reported as ENOMEM.
    unsafe { libc::msync(start as *mut libc::c_void, end - start, libc::MS_ASYNC) == 0 }
}

/// True unless the first or the last page of `addr..addr + len` (mapped)
/// cannot be written (`write`) or read. Receives and the peer's RDMA
/// writes store into a registered region, sends read it; in read-only or
/// `PROT_NONE` memory the access would kill the process, where VIA's
/// registration, which pins the pages for writing, fails.
/// `MADV_POPULATE_WRITE` (`_READ`) faults a page in without touching its
/// bytes and fails where the access would fault (`EINVAL` for a mapping
/// without the permission, `EFAULT` where it would raise SIGBUS): two
/// system calls whatever the length (each page's would cost 80 us a MiB
/// here), so a region whose protection changes between its ends, or after
/// it is registered, is the program's error, not caught. Device mappings
/// (`VM_IO`, `VM_PFNMAP`) fail it too and are refused. A kernel without
/// the advice (before 5.14) checks nothing.
fn ends_accessible(addr: *mut u8, len: usize, write: bool) -> bool {
    if !populate_advice_known() {
        return true;
    }
    let advice = if write {
        libc::MADV_POPULATE_WRITE
    } else {
        libc::MADV_POPULATE_READ
    };
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
    let first = addr as usize & !(page - 1);
    let last = (addr as usize + len - 1) & !(page - 1);
    let ends = [first, last];
    ends[..if first == last { 1 } else { 2 }].iter().all(|&p| {
        // SAFETY: the page is mapped (`is_mapped`); the advice writes no
        // byte of it and changes no protection.
        unsafe { libc::madvise(p as *mut libc::c_void, page, advice) == 0 }
    })
}

/// Whether this kernel knows `MADV_POPULATE_WRITE` (Linux 5.14): asked
/// once, of a page of this process's own that is writable.
fn populate_advice_known() -> bool {
    static KNOWN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KNOWN.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
        let probe = std::alloc::Layout::from_size_align(page, page).expect("a page's layout");
        // SAFETY: a page-sized, page-aligned allocation, freed below.
        let p = unsafe { std::alloc::alloc(probe) };
        if p.is_null() {
            return false;
        }
        // SAFETY: the page just allocated, writable; the advice changes none of its bytes.
        let known = unsafe { libc::madvise(p.cast(), page, libc::MADV_POPULATE_WRITE) } == 0;
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(p, probe) };
        known
    })
}

impl MemoryRegion {
    pub fn handle(&self) -> MemHandle {
        self.handle
    }

    pub fn addr(&self) -> *mut u8 {
        self.seg.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes. Do not read bytes a posted descriptor is writing.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `len` initialised (zero-filled) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.seg.as_ptr(), self.len) }
    }

    /// The bytes, writable. Do not change bytes a posted descriptor is reading.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, with exclusive access through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.seg.as_ptr(), self.len) }
    }

    /// A data segment for `len` bytes at `offset`. Bounds are checked when
    /// the descriptor is posted, not here.
    pub fn segment(&self, offset: usize, len: usize) -> Segment {
        Segment::local(
            self.seg.as_ptr().wrapping_add(offset),
            self.handle,
            len as u32,
        )
    }

    /// An address segment naming `offset` of this region, for a peer's RDMA.
    pub fn remote(&self, offset: usize) -> Segment {
        Segment::remote(self.seg.as_ptr() as u64 + offset as u64, self.handle)
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // Deregister before the mapping goes (the segment drops after this).
        let _ = self.nic.deregister_mem(self.handle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_names() {
        assert!(Nic::open("shm").is_ok());
        assert!(Nic::open("shm:a-1").is_ok());
        assert!(matches!(
            Nic::open("shm:"),
            Err(OpenError::BadAddress { .. })
        ));
        assert!(matches!(
            Nic::open("shm:../x"),
            Err(OpenError::BadAddress { .. })
        ));
        assert!(matches!(
            Nic::open("shmem"),
            Err(OpenError::UnknownProvider(_))
        ));
        assert!(matches!(
            Nic::open("ib0"),
            Err(OpenError::UnknownProvider(_))
        ));
    }

    #[test]
    fn a_window_is_given_once_to_a_registered_region_and_must_name_memory() {
        let nic = Nic::open("shm").unwrap();
        let attrs = MemAttributes::new(nic.create_ptag().unwrap());
        let mut buf = vec![0u8; 8192];
        let p = buf.as_mut_ptr();
        // SAFETY: a live buffer, deregistered before it is dropped.
        let h = unsafe { nic.register_mem(p, 8192, attrs) }.unwrap();
        assert_eq!(nic.query_mem(h).unwrap().fd, -1);
        // SAFETY: each refused before it is used; the fd below is a memfd
        // standing in for the region's (no peer maps it in this test).
        unsafe {
            assert_eq!(
                nic.set_region_backing(h, -1, p, 8192),
                Err(MemError::BadBacking)
            );
            assert_eq!(
                nic.set_region_backing(h, 3, p, 0),
                Err(MemError::BadBacking)
            );
            let seg = uvia_shm::Segment::create(c"window-test", 8192).unwrap();
            let fd = seg.fd();
            assert_eq!(nic.set_region_backing(h, fd, p, 8192), Ok(()));
            assert_eq!(nic.query_mem(h).unwrap().fd, fd);
            assert_eq!(
                nic.set_region_backing(h, fd, p, 8192),
                Err(MemError::AlreadyBacked(h.0))
            );
            nic.deregister_mem(h).unwrap();
            assert_eq!(
                nic.set_region_backing(h, fd, p, 8192),
                Err(MemError::NotRegistered(h.0))
            );
        }
    }

    #[test]
    fn only_mapped_memory_registers() {
        let nic = Nic::open("shm").unwrap();
        let attrs = MemAttributes::new(nic.create_ptag().unwrap());
        let mut buf = vec![0u8; 10_000];
        // SAFETY: a live buffer, registered and deregistered at once.
        let h = unsafe { nic.register_mem(buf.as_mut_ptr().add(3), 9_000, attrs) }.unwrap();
        nic.deregister_mem(h).unwrap();
        // A range that runs 1 TiB past the buffer, and a page unmapped.
        // SAFETY: the calls must refuse both without touching them.
        let far = unsafe { nic.register_mem(buf.as_mut_ptr(), 1 << 40, attrs) };
        assert!(matches!(far, Err(MemError::Unmapped { .. })), "{far:?}");
        // SAFETY: a page mapped, then unmapped, so the address is free.
        let gone = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p, 4096);
            p as *mut u8
        };
        // SAFETY: as above.
        let r = unsafe { nic.register_mem(gone, 4096, attrs) };
        assert!(matches!(r, Err(MemError::Unmapped { .. })), "{r:?}");
    }

    /// Memory a receive or an RDMA write could not store into is refused
    /// (the store would kill the process), read-only or inaccessible, at
    /// either end of the range; writable memory of any protection history
    /// registers.
    #[test]
    fn only_writable_memory_registers() {
        let nic = Nic::open("shm").unwrap();
        let attrs = MemAttributes::new(nic.create_ptag().unwrap());
        let map = |prot| {
            // SAFETY: a fresh anonymous mapping of three pages.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    3 * 4096,
                    prot,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            p as *mut u8
        };
        for prot in [libc::PROT_READ, libc::PROT_NONE] {
            let p = map(prot);
            // SAFETY: a mapped range the call must refuse without writing.
            let r = unsafe { nic.register_mem(p.add(100), 8000, attrs) };
            assert!(
                matches!(r, Err(MemError::NotAccessible { write: true, .. })),
                "{prot}: {r:?}"
            );
            // Registered to be read only: read-only memory is fine,
            // inaccessible memory is not.
            // SAFETY: as above.
            let r = unsafe { nic.register_mem(p.add(100), 8000, attrs.read_only(true)) };
            if prot == libc::PROT_READ {
                nic.deregister_mem(r.unwrap()).unwrap();
            } else {
                assert!(
                    matches!(r, Err(MemError::NotAccessible { write: false, .. })),
                    "{r:?}"
                );
            }
            // SAFETY: the mapping made above.
            unsafe { libc::munmap(p.cast(), 3 * 4096) };
        }
        // Writable, then its last page made read-only: the end is checked.
        let p = map(libc::PROT_READ | libc::PROT_WRITE);
        // SAFETY: the last of the three pages made above.
        assert_eq!(
            unsafe { libc::mprotect(p.add(8192).cast(), 4096, libc::PROT_READ) },
            0
        );
        // SAFETY: as above.
        let r = unsafe { nic.register_mem(p, 3 * 4096, attrs) };
        assert!(
            matches!(r, Err(MemError::NotAccessible { write: true, .. })),
            "{r:?}"
        );
        // Read only with RDMA write enabled says nothing that holds.
        // SAFETY: as above.
        let r = unsafe { nic.register_mem(p, 4096, attrs.read_only(true).rdma_write(true)) };
        assert_eq!(r, Err(MemError::ReadOnlyRdmaWrite));
        // SAFETY: the first two pages, writable, registered and deregistered.
        let h = unsafe { nic.register_mem(p, 2 * 4096, attrs) }.unwrap();
        nic.deregister_mem(h).unwrap();
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p.cast(), 3 * 4096) };
    }

    #[test]
    fn ptags_are_per_nic_and_guarded() {
        let a = Nic::open("shm").unwrap();
        let b = Nic::open("shm").unwrap();
        let pa = a.create_ptag().unwrap();
        assert_eq!(
            b.destroy_ptag(pa),
            Err(PtagError::Invalid(pa.raw())),
            "another Nic's tag"
        );
        let r = a.alloc_region(100, MemAttributes::new(pa)).unwrap();
        assert_eq!(a.destroy_ptag(pa), Err(PtagError::InUse(pa.raw())));
        drop(r);
        assert_eq!(a.destroy_ptag(pa), Ok(()));
        assert_eq!(
            a.destroy_ptag(pa),
            Err(PtagError::Invalid(pa.raw())),
            "destroyed twice"
        );
        assert!(matches!(
            a.alloc_region(100, MemAttributes::new(pa)),
            Err(MemError::InvalidPtag(_))
        ));
    }

    #[test]
    fn register_query_set_deregister() {
        let nic = Nic::open("shm").unwrap();
        let p = nic.create_ptag().unwrap();
        let mut buf = vec![0u8; 256];
        // SAFETY: `buf` outlives the registration.
        let h = unsafe { nic.register_mem(buf.as_mut_ptr(), 256, MemAttributes::new(p)) }.unwrap();
        let q = nic.query_mem(h).unwrap();
        assert_eq!(
            (q.start, q.len, q.attrs.enable_rdma_read),
            (buf.as_ptr() as u64, 256, false)
        );
        nic.set_mem_attributes(h, MemAttributes::new(p).rdma_read(true))
            .unwrap();
        assert!(nic.query_mem(h).unwrap().attrs.enable_rdma_read);
        nic.deregister_mem(h).unwrap();
        assert_eq!(nic.deregister_mem(h), Err(MemError::NotRegistered(h.0)));
        assert_eq!(nic.query_mem(h), Err(MemError::NotRegistered(h.0)));
        // SAFETY: a zero-length range is refused before anything is kept.
        assert_eq!(
            unsafe { nic.register_mem(buf.as_mut_ptr(), 0, MemAttributes::new(p)) },
            Err(MemError::Empty)
        );
    }
}
