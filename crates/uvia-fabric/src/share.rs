//! Caller memory a peer can map: on `shm`, the whole pages of a registered
//! range that lie in private anonymous memory are moved into a memfd
//! mapped over the same addresses, so a large message from them is one
//! copy out of the peer's mapping instead of a cross-memory-attach call.
//!
//! No kernel interface lets another process map a process's private
//! memory; a memfd is what memory the Nic allocates already is
//! (`Nic::alloc_region`), and `fi_mr_reg` hands us the caller's memory,
//! not a chance to allocate it. So when a registered range is first the
//! source of a large message (`Domain::share_sources`), or the buffer of a
//! receive long enough for the sender to share the copy
//! (`Domain::share_destinations`), the pages that hold
//! data are copied into a new memfd, which is then mapped `MAP_SHARED |
//! MAP_FIXED` at the same addresses: same addresses, same contents, now
//! shareable.
//! Another thread's writes to the pages meanwhile are held, not lost: the
//! pages are write-protected through a userfaultfd for the copy and the
//! remap, and a writer sleeps in its page fault until the new mapping is
//! in place, then writes there ([`WriteHold`]); where the kernel or the
//! process's rights offer no such hold, the memory is left as it is. What
//! sharing changes for the program (fork, `MADV_DONTNEED`, hugepages) is in
//! the provider's docs (docs/DESIGN.md, "Registered memory on shm"); on by
//! default, `FI_UVIA_SHARE_MR=0` turns it off.
//!
//! A remap outlives its registration: the pages stay the memfd's until the
//! program unmaps them (`free` of a large block, `munmap`), since the
//! program may still be using them and no call could put them back without
//! the same race with its writes. The remap is kept while the program has
//! it mapped, so a later registration over the same pages shares its memfd
//! instead of copying them again: `ofi_rxm` registers a rendezvous
//! message's buffer for each message, and a copy into a new memfd (which
//! the peer then maps afresh) made every 1 MiB MPI message take 2 to 4 ms.
//! A remap the program no longer has wholly mapped is let go at the next
//! registration (once no registration holds it), which frees its memory.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use uvia_shm::segment::page_size;
use uvia_shm::Segment;

/// Fewest bytes of whole pages worth remapping. Messages up to 16 KiB of
/// memory a peer cannot map go inline through the ring anyway
/// (`INLINE_MAX_UNMAPPED` in the shm provider); a remap pays a copy of the
/// range and two system calls.
pub const MIN_SHARE: usize = 64 << 10;

/// Most bytes one registration remaps: the copy takes
/// about 50 ms a GiB and holds the pages twice until the remap, so larger
/// ranges are left as they are (and read by cross-memory attach).
pub const MAX_SHARE: usize = 1 << 30;

/// One memfd mapped over caller memory at `start`, `len` bytes.
#[derive(Debug)]
pub struct Remap {
    seg: Segment,
    start: usize,
    len: usize,
    /// The memfd's inode and device, to recognise its mappings in
    /// `/proc/self/maps`.
    ino: u64,
    dev: (u32, u32),
}

impl Remap {
    pub fn fd(&self) -> i32 {
        self.seg.fd()
    }

    pub fn start(&self) -> *mut u8 {
        self.start as *mut u8
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Remaps held by registrations or still mapped by the program, to find
/// one a new registration lies in; the ones shared last at the back.
static REMAPS: Mutex<Vec<Arc<Remap>>> = Mutex::new(Vec::new());

/// Most remaps kept with no registration holding them. Each holds a
/// descriptor and a mapping of its memfd: a program that registers many
/// buffers in turn must not run out of descriptors for its own use. The
/// ones shared least recently go first (their pages stay shared; a later
/// registration over them copies them again).
const KEEP_UNHELD: usize = 64;

/// [`share`]'s answer from the kept remaps, `mapped(r, a, b)` telling
/// whether the program still maps `[a, b)` with `r`'s memfd: the remap
/// `[lo, hi)` lies in (`Some(Some)`, now the most recently shared), or
/// `Some(None)` where the range overlaps one only in part; `None` where no
/// kept remap the program still maps touches it. First lets go of the
/// remaps no registration holds and the program no longer maps wholly (one
/// whose pages it unmapped names other memory now).
fn find_kept(
    t: &mut Vec<Arc<Remap>>,
    lo: usize,
    hi: usize,
    mut mapped: impl FnMut(&Remap, usize, usize) -> bool,
) -> Option<Option<Arc<Remap>>> {
    t.retain(|r| Arc::strong_count(r) > 1 || mapped(r, r.start, r.start + r.len));
    let (i, inside) = t.iter().enumerate().find_map(|(i, r)| {
        let (a, b) = (r.start.max(lo), (r.start + r.len).min(hi));
        (a < b && mapped(r, a, b)).then_some((i, r.start <= lo && hi <= r.start + r.len))
    })?;
    Some(inside.then(|| {
        let r = t.remove(i);
        t.push(r.clone());
        r
    }))
}

/// Lets go of the least recently shared unheld remaps beyond
/// [`KEEP_UNHELD`].
fn trim(t: &mut Vec<Arc<Remap>>) {
    let unheld = t.iter().filter(|r| Arc::strong_count(r) == 1).count();
    let mut excess = unheld.saturating_sub(KEEP_UNHELD);
    t.retain(|r| {
        let drop = excess > 0 && Arc::strong_count(r) == 1;
        excess -= drop as usize;
        !drop
    });
}

/// The memfd behind the whole pages of `[buf, buf + len)`, remapping them
/// if they are private anonymous memory; `None` (the range stays as it is)
/// when there are too few whole pages or too many, when they are anything
/// else (file mappings, shared memory of the program's own, the stack),
/// when they overlap a live remap without lying inside it, or when a step
/// fails.
///
/// # Safety
/// `[buf, buf + len)` is memory the caller is registering: mapped. Other
/// threads may write to it meanwhile (their writes are held, then kept).
pub unsafe fn share(buf: *const u8, len: usize) -> Option<Arc<Remap>> {
    let page = page_size();
    let lo = (buf as usize).checked_add(page - 1)? & !(page - 1);
    let hi = (buf as usize).checked_add(len)? & !(page - 1);
    // (A live remap is never larger than MAX_SHARE, so a larger range
    // could not lie inside one either.)
    if hi <= lo || hi - lo < MIN_SHARE || hi - lo > MAX_SHARE {
        return None;
    }
    let mut t = REMAPS.lock().unwrap_or_else(|p| p.into_inner());
    trim(&mut t);
    // A registration over a kept remap (the same buffer registered again)
    // is answered by a few queries of single mappings, where the whole map
    // of a large program (an MPI rank's runs to a thousand lines) took
    // half a millisecond to read.
    if let Some(q) = MapQuery::open() {
        if let Some(found) = q.kept(&mut t, lo, hi) {
            return found;
        }
    }
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    if let Some(found) = find_kept(&mut t, lo, hi, |r, a, b| still_mapped(&maps, a, b, r.ino)) {
        return found;
    }
    if !remappable(&maps, lo, hi) {
        return None;
    }
    // SAFETY: the range is mapped read-write private anonymous memory (or
    // an earlier remap's, checked above).
    let seg = unsafe { remap(lo, hi - lo) }.ok()?;
    // fstat of our own descriptor does not fail; were it to, inode 0 matches
    // no line of the map and the remap would only never be shared.
    let (ino, dev) = inode(seg.fd()).unwrap_or((0, (0, 0)));
    let r = Arc::new(Remap {
        seg,
        start: lo,
        len: hi - lo,
        ino,
        dev,
    });
    t.push(r.clone());
    Some(r)
}

/// Copies the `len` bytes at `lo` into a new memfd and maps it over them,
/// holding other threads' writes to them meanwhile.
///
/// Only pages that hold something are copied (and made in the memfd):
/// pages of zeros, among them pages never touched (which the hold maps to
/// the zero page), are left as holes, which read as zeros. `ofi_rxm`
/// registers each 16 MiB chunk of its buffer pools, which it has just
/// cleared, on the path of a connection's first message: copying the
/// whole chunk into new pages took 20 to 45 ms a registration.
///
/// The registering thread only reads the range while the hold lasts, and
/// the hold stops writes alone: it never waits on its own hold. (Holding
/// the first touch of pages never made as well, to spare making them,
/// would: a page that reclaim takes away meanwhile, as it may one the
/// program gave back with `MADV_FREE`, becomes such a page under the
/// copy's read.)
///
/// # Safety
/// As [`share`], for the page-aligned range `[lo, lo + len)`.
unsafe fn remap(lo: usize, len: usize) -> io::Result<Segment> {
    let seg = Segment::create_lazy(c"uvia-mr", len)?;
    // Signals wait on this thread while the hold lasts: a handler that
    // wrote to the pages here would wait for the thread it interrupted.
    // (Declared first, so it is dropped after the hold.)
    let _signals = SignalsHeld::new();
    // Writers wait from here until the hold is dropped, after the remap
    // (or after private memory is put back, on failure).
    let _hold = WriteHold::new(lo, len)?;
    // SAFETY: the caller's mapped range, read only.
    let full = unsafe { nonzero_pages(lo, len) };
    for r in &full {
        // SAFETY: a run of the caller's range, read by the kernel into
        // our own memfd at the same offset (no fault of ours, no mapping
        // of the memfd's touched).
        unsafe { pwrite_all(seg.fd(), (lo + r.start) as *const u8, r.len(), r.start)? };
    }
    // SAFETY: replaces the pages at `lo` (the caller's, whose contents the
    // memfd now holds) with the memfd's.
    let p = unsafe {
        libc::mmap(
            lo as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            seg.fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        // A failed MAP_FIXED may have unmapped the old pages first: put
        // private memory back with the contents the memfd holds, so the
        // program loses nothing.
        // SAFETY: the same range, private anonymous again; the copy
        // source is our segment's own mapping.
        unsafe {
            let q = libc::mmap(
                lo as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
            if q != libc::MAP_FAILED {
                for r in &full {
                    std::ptr::copy_nonoverlapping(
                        seg.as_ptr().add(r.start),
                        (lo + r.start) as *mut u8,
                        r.len(),
                    );
                }
            }
        }
        return Err(e);
    }
    // The pages copied are mapped again now, sparing the program their
    // first faults (a failure leaves them to fault in as touched).
    for r in &full {
        // SAFETY: advice on the range just mapped, which reads what it holds.
        unsafe { libc::madvise((lo + r.start) as *mut _, r.len(), libc::MADV_POPULATE_WRITE) };
    }
    Ok(seg)
}

/// The runs of whole pages of `[lo, lo + len)`, as byte ranges from `lo`,
/// that are not all zeros.
///
/// # Safety
/// `[lo, lo + len)` is page-aligned, mapped and readable; other threads
/// do not write it meanwhile (the hold stops them).
unsafe fn nonzero_pages(lo: usize, len: usize) -> Vec<std::ops::Range<usize>> {
    let page = page_size();
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for at in (0..len).step_by(page) {
        // SAFETY: a whole page of the range, page-aligned, so also aligned
        // for u64; nobody writes it while it is read (above).
        let words = unsafe { std::slice::from_raw_parts((lo + at) as *const u64, page / 8) };
        // Or-ing a few words at a time lets the compiler use vectors and
        // still stop at the first page that holds data.
        if words.chunks(8).all(|c| c.iter().fold(0, |a, w| a | w) == 0) {
            continue;
        }
        match out.last_mut() {
            Some(o) if o.end == at => o.end = at + page,
            _ => out.push(at..at + page),
        }
    }
    out
}

/// Writes `len` bytes at `src` into the file `fd` at `offset`, all of
/// them.
///
/// # Safety
/// `[src, src + len)` is mapped and readable.
unsafe fn pwrite_all(fd: i32, src: *const u8, len: usize, offset: usize) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        // SAFETY: the caller's readable range, from `done` on.
        let n = unsafe {
            libc::pwrite(
                fd,
                src.add(done) as *const libc::c_void,
                len - done,
                (offset + done) as libc::off_t,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(io::ErrorKind::WriteZero.into()),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Holds writes to a range of private anonymous memory while it is copied
/// and remapped: the range is registered with a userfaultfd in
/// write-protect mode and protected, so a thread that writes to it, in its
/// own code or in a system call, sleeps in the page fault; closing the
/// descriptor (the drop) wakes it, and it retries the write on whatever
/// maps the range then. No kernel interface replaces a mapping's pages
/// with a copy atomically; this makes the copy and the replacement one
/// step for every other thread.
///
/// The userfaultfd is opened without `UFFD_USER_MODE_ONLY`, which needs
/// root, `CAP_SYS_PTRACE` or `vm.unprivileged_userfaultfd=1`: in user mode
/// only, a write from a system call (a `read` into the buffer) would fail
/// with `EFAULT` instead of waiting. Without those rights the hold cannot
/// be had and the memory is not shared.
struct WriteHold {
    _uffd: OwnedFd,
}

/// Blocks every signal on this thread until dropped, then restores the
/// thread's mask (signals that came meanwhile are delivered then).
struct SignalsHeld {
    old: libc::sigset_t,
}

impl SignalsHeld {
    fn new() -> SignalsHeld {
        // SAFETY: zeroed sigsets are valid out-parameters, filled below;
        // pthread_sigmask with valid sets has no other precondition.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            SignalsHeld { old }
        }
    }
}

impl Drop for SignalsHeld {
    fn drop(&mut self) {
        // SAFETY: the mask saved by `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// The ioctl interface of `linux/userfaultfd.h`, which the libc crate does
/// not declare: the structures as the header lays them out and the request
/// numbers from its `_IOWR(0xAA, nr, struct)`.
mod uffd {
    pub const API: u64 = 0xAA;
    pub const REGISTER_MODE_WP: u64 = 1 << 1;
    pub const WRITEPROTECT_MODE_WP: u64 = 1 << 0;

    #[repr(C)]
    pub struct Api {
        pub api: u64,
        pub features: u64,
        pub ioctls: u64,
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct Range {
        pub start: u64,
        pub len: u64,
    }

    #[repr(C)]
    pub struct Register {
        pub range: Range,
        pub mode: u64,
        pub ioctls: u64,
    }

    #[repr(C)]
    pub struct WriteProtect {
        pub range: Range,
        pub mode: u64,
    }

    /// `_IOWR(0xAA, nr, T)`: direction read|write, the size, the type, the number.
    const fn iowr<T>(nr: u64) -> u64 {
        (3 << 30) | ((std::mem::size_of::<T>() as u64) << 16) | (0xAA << 8) | nr
    }

    pub const IOC_API: u64 = iowr::<Api>(0x3F);
    pub const IOC_REGISTER: u64 = iowr::<Register>(0x00);
    pub const IOC_WRITEPROTECT: u64 = iowr::<WriteProtect>(0x06);
}

impl WriteHold {
    /// Holds writes to `[lo, lo + len)`.
    fn new(lo: usize, len: usize) -> io::Result<WriteHold> {
        // SAFETY: a system call with integer flags; a non-negative result
        // is a new descriptor we own.
        let fd =
            unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        let uffd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let ioctl = |req: u64, arg: *mut libc::c_void| {
            // SAFETY: each request is given the structure it is defined
            // with, alive for the call.
            if unsafe { libc::ioctl(fd as i32, req as _, arg) } < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        let mut api = uffd::Api {
            api: uffd::API,
            features: 0,
            ioctls: 0,
        };
        ioctl(uffd::IOC_API, &mut api as *mut _ as *mut _)?;
        // Write protection applies to pages that are mapped: map the ones
        // never touched yet (the zero page), or a first write to one would
        // fault as a missing page, which this hold does not watch.
        // SAFETY: the range is the caller's mapped memory; reading it in
        // changes no byte.
        if unsafe { libc::madvise(lo as *mut _, len, libc::MADV_POPULATE_READ) } != 0 {
            // (Kernels before 5.14.) One read per page does the same.
            for at in (lo..lo + len).step_by(page_size()) {
                // SAFETY: `at` lies in the mapped range.
                unsafe { std::ptr::read_volatile(at as *const u8) };
            }
        }
        let range = uffd::Range {
            start: lo as u64,
            len: len as u64,
        };
        let mut reg = uffd::Register {
            range,
            mode: uffd::REGISTER_MODE_WP,
            ioctls: 0,
        };
        ioctl(uffd::IOC_REGISTER, &mut reg as *mut _ as *mut _)?;
        let mut wp = uffd::WriteProtect {
            range,
            mode: uffd::WRITEPROTECT_MODE_WP,
        };
        ioctl(uffd::IOC_WRITEPROTECT, &mut wp as *mut _ as *mut _)?;
        Ok(WriteHold { _uffd: uffd })
    }
}

/// True when `/proc/self/maps` (`maps`) shows `[lo, hi)` wholly covered
/// by read-write private anonymous mappings (the heap included, the stack
/// not: it grows down and is the thread's) or by earlier remaps of ours
/// whose registrations are gone.
pub fn remappable(maps: &str, lo: usize, hi: usize) -> bool {
    covered(maps, lo, hi, |perms, inode, path| {
        let anon = perms == "rw-p" && inode == 0 && (path.is_empty() || path == "[heap]");
        let ours = perms == "rw-s" && path.starts_with("/memfd:uvia-mr");
        anon || ours
    })
}

/// True when `maps` shows `[lo, hi)` wholly mapped by the memfd whose
/// inode is `ino` (a live remap the program has not unmapped since).
fn still_mapped(maps: &str, lo: usize, hi: usize, ino: u64) -> bool {
    covered(maps, lo, hi, |perms, inode, path| {
        perms == "rw-s" && inode == ino && path.starts_with("/memfd:uvia-mr")
    })
}

/// True when the lines of `maps` cover `[lo, hi)` without a hole and each
/// line that overlaps it passes `ok(perms, inode, path)`.
fn covered(maps: &str, lo: usize, hi: usize, ok: impl Fn(&str, u64, &str) -> bool) -> bool {
    let mut at = lo;
    for line in maps.lines() {
        let mut f = line.split_ascii_whitespace();
        let (Some(range), Some(perms), Some(_off), Some(_dev), Some(inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            return false;
        };
        let path = f.collect::<Vec<_>>().join(" ");
        let Some((a, b)) = range.split_once('-') else {
            return false;
        };
        let (Ok(a), Ok(b), Ok(inode)) = (
            usize::from_str_radix(a, 16),
            usize::from_str_radix(b, 16),
            inode.parse::<u64>(),
        ) else {
            return false;
        };
        if b <= at {
            continue;
        }
        if a > at || !ok(perms, inode, &path) {
            // A hole (or lines out of order), or a mapping of another kind.
            return false;
        }
        at = b;
        if at >= hi {
            return true;
        }
    }
    false
}

fn inode(fd: i32) -> Option<(u64, (u32, u32))> {
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is valid for the call; `fd` is our segment's.
    (unsafe { libc::fstat(fd, &mut st) } == 0)
        .then(|| (st.st_ino, (libc::major(st.st_dev), libc::minor(st.st_dev))))
}

/// `struct procmap_query` of `linux/fs.h` (Linux 6.11): one mapping of
/// this process, by address. Written out here because the libc crate and
/// older system headers do not have it; its size is checked in the tests
/// against the ioctl number, which encodes it.
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong = 0xc068_6611;
const VMA_WRITABLE: u64 = 0x02;
const VMA_SHARED: u64 = 0x08;

/// The kernel answered a query with "no such ioctl" once: read the text.
static NO_QUERY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One mapping as [`PROCMAP_QUERY`] reports it: where it ends, its
/// `VMA_*` flags, and the inode and device of its file.
struct Mapping {
    end: usize,
    flags: u64,
    ino: u64,
    dev: (u32, u32),
}

/// `/proc/self/maps` opened for [`PROCMAP_QUERY`].
struct MapQuery(OwnedFd);

impl MapQuery {
    /// `None` where the kernel has no such query (before 6.11).
    fn open() -> Option<MapQuery> {
        if NO_QUERY.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        // SAFETY: a constant path; the descriptor is checked and owned.
        let fd = unsafe {
            libc::open(
                c"/proc/self/maps".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        // SAFETY: a fresh descriptor we own.
        (fd >= 0).then(|| MapQuery(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The mapping that covers `addr`; `Ok(None)` where nothing is mapped.
    fn at(&self, addr: usize) -> io::Result<Option<Mapping>> {
        let mut q = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_addr: addr as u64,
            ..ProcmapQuery::default()
        };
        // SAFETY: `q` is the struct the ioctl reads and writes, its size
        // in its first field; no name or build id is asked for.
        if unsafe { libc::ioctl(self.0.as_raw_fd(), PROCMAP_QUERY, &mut q) } < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(Mapping {
            end: q.vma_end as usize,
            flags: q.vma_flags,
            ino: q.inode,
            dev: (q.dev_major, q.dev_minor),
        }))
    }

    /// True when `[lo, hi)` is wholly mapped, shared and writable, by the
    /// memfd of `r`.
    fn mapped_by(&self, r: &Remap, lo: usize, hi: usize) -> io::Result<bool> {
        let mut at = lo;
        while at < hi {
            let Some(m) = self.at(at)? else {
                return Ok(false);
            };
            let shared_rw = m.flags & (VMA_SHARED | VMA_WRITABLE) == VMA_SHARED | VMA_WRITABLE;
            if !shared_rw || m.ino != r.ino || m.dev != r.dev || m.end <= at {
                return Ok(false);
            }
            at = m.end;
        }
        Ok(true)
    }

    /// [`find_kept`] with the mappings queried one by one; `None` also
    /// where a query failed (the caller then reads the whole map).
    fn kept(&self, t: &mut Vec<Arc<Remap>>, lo: usize, hi: usize) -> Option<Option<Arc<Remap>>> {
        let mut failed = false;
        let found = find_kept(t, lo, hi, |r, a, b| match self.mapped_by(r, a, b) {
            Ok(yes) => yes,
            Err(e) => {
                if e.raw_os_error() == Some(libc::ENOTTY) || e.raw_os_error() == Some(libc::EINVAL)
                {
                    NO_QUERY.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                // Kept, and no answer from here: the caller reads the map.
                failed = true;
                true
            }
        });
        if failed {
            None
        } else {
            found
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn remappable_reads_the_map() {
        let maps = "\
55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000100000 rw-p 00000000 00:00 0 
7f0000100000-7f0000200000 rw-s 00000000 00:01 1234                       /memfd:uvia-mr (deleted)
7f0000200000-7f0000300000 r--p 00000000 08:01 99                         /usr/lib/libc.so.6
7f0000300000-7f0000400000 rw-p 00000000 00:00 0 
7f0000500000-7f0000600000 rw-p 00000000 00:00 0                          [stack]
7f0000600000-7f0000700000 rw-s 00000000 00:01 77                         /memfd:app (deleted)
";
        assert!(remappable(maps, 0x55d0c0001000, 0x55d0c0020000), "heap");
        assert!(
            remappable(maps, 0x7f0000001000, 0x7f0000180000),
            "anon then ours"
        );
        assert!(!remappable(maps, 0x7f0000180000, 0x7f0000201000), "a file");
        assert!(!remappable(maps, 0x7f0000300000, 0x7f0000401000), "a hole");
        assert!(
            !remappable(maps, 0x7f0000500000, 0x7f0000501000),
            "the stack"
        );
        assert!(
            !remappable(maps, 0x7f0000600000, 0x7f0000601000),
            "the program's memfd"
        );
        assert!(
            !remappable(maps, 0x7f0000800000, 0x7f0000801000),
            "unmapped"
        );
    }

    #[test]
    fn share_keeps_contents_and_addresses() {
        if !hold_available() {
            return;
        }
        let len = 1 << 20;
        let mut v: Vec<u8> = (0..len + 100).map(|i| (i * 7 + 3) as u8).collect();
        let want = v.clone();
        // SAFETY: a live buffer no other thread touches.
        let r = unsafe { share(v.as_ptr().add(10), len) }.expect("a large heap buffer remaps");
        assert!(r.start() as usize >= v.as_ptr() as usize + 10);
        assert!(r.start() as usize + r.len() <= v.as_ptr() as usize + 10 + len);
        assert_eq!(v, want, "contents survive the remap");
        // The buffer is now the memfd: writes through either show in both.
        let first = r.start() as usize - v.as_ptr() as usize;
        v[first] = 0xab;
        // SAFETY: our segment's mapping, `len` bytes.
        assert_eq!(unsafe { *r.seg.as_ptr() }, 0xab);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps
            .lines()
            .find(|l| l.starts_with(&format!("{:x}-", r.start() as usize)))
            .expect("the remap has its own line");
        assert!(line.contains("/memfd:uvia-mr"), "{line}");
        // A second registration inside the first shares its memfd; one
        // overlapping its edge gets none.
        // SAFETY: as above.
        let r2 = unsafe { share(r.start().add(4096), MIN_SHARE) }.expect("inside a live remap");
        assert!(Arc::ptr_eq(&r, &r2));
        // SAFETY: as above.
        assert!(unsafe { share(r.start().add(r.len() - 4096), MIN_SHARE + 8192) }.is_none());
        let (ino, fd) = (r.ino, r.fd());
        drop((r, r2));
        // Once its registrations are gone the remap is kept while the
        // buffer is: registering the buffer again shares the same memfd,
        // contents kept, with no copy.
        let want = v.clone();
        // SAFETY: as above.
        let r3 = unsafe { share(v.as_ptr().add(10), len) }.expect("a kept remap is shared");
        assert_eq!(
            (r3.ino, r3.fd()),
            (ino, fd),
            "the same memfd, not a new copy"
        );
        assert_eq!(v, want);
    }

    /// A kept remap whose pages the program unmaps is let go at the next
    /// registration: its memory goes back.
    #[test]
    fn a_kept_remap_goes_with_its_pages() {
        if !hold_available() {
            return;
        }
        let len = 1 << 20;
        let p = anon(len);
        // SAFETY: our mapping, which no other thread touches.
        let r = unsafe { share(p as *const u8, len) }.expect("anonymous memory remaps");
        let kept = Arc::downgrade(&r);
        drop(r);
        let q = anon(len);
        // SAFETY: as above.
        let again = unsafe { share(p as *const u8, len) }.expect("still mapped: kept");
        assert!(kept.upgrade().is_some_and(|k| Arc::ptr_eq(&k, &again)));
        drop(again);
        // SAFETY: the test's own mapping, no longer used.
        unsafe { libc::munmap(p, len) };
        // SAFETY: as above, another mapping of ours.
        let other = unsafe { share(q as *const u8, len) };
        assert!(other.is_some());
        assert!(kept.upgrade().is_none(), "the unmapped remap was let go");
        drop(other);
        // SAFETY: as above.
        unsafe { libc::munmap(q, len) };
    }

    /// A dummy remap of `[start, start + len)` (no mapping of the program's).
    fn dummy(start: usize, len: usize) -> Arc<Remap> {
        Arc::new(Remap {
            seg: Segment::create(c"uvia-test", 4096).unwrap(),
            start,
            len,
            ino: 0,
            dev: (0, 0),
        })
    }

    /// The kept remaps' rules, whichever way the map is read: an unheld
    /// remap no longer mapped goes, a range inside one shares it (which
    /// becomes the most recently shared), one overlapping in part gets
    /// none, and one touching none is left to the caller.
    #[test]
    fn find_kept_shares_prunes_and_refuses_partial_overlaps() {
        let (a, b, gone) = (
            dummy(0x10000, 0x10000),
            dummy(0x40000, 0x10000),
            dummy(0x80000, 0x10000),
        );
        let mut t = vec![a.clone(), b.clone(), gone.clone()];
        let gone_start = gone.start;
        drop(gone);
        let mapped = |r: &Remap, _: usize, _: usize| r.start != gone_start;
        let r = find_kept(&mut t, 0x11000, 0x18000, mapped).expect("touches a");
        assert!(
            r.is_some_and(|r| Arc::ptr_eq(&r, &a)),
            "inside a: shares it"
        );
        assert_eq!(t.len(), 2, "the unheld remap no longer mapped went");
        assert!(Arc::ptr_eq(&t[1], &a), "a is now the most recently shared");
        assert_eq!(
            find_kept(&mut t, 0x4f000, 0x52000, mapped).map(|r| r.is_none()),
            Some(true)
        );
        assert!(
            find_kept(&mut t, 0x100000, 0x110000, mapped).is_none(),
            "touches none"
        );
        assert!(
            find_kept(&mut t, 0x41000, 0x42000, |_, _, _| false).is_none(),
            "b unmapped"
        );
        assert!(Arc::ptr_eq(&t[0], &b), "held remaps stay, mapped or not");
    }

    /// Unheld remaps beyond the bound go, the least recently shared first;
    /// held ones stay whatever their number.
    #[test]
    fn trim_keeps_the_bound_of_unheld_remaps() {
        if !hold_available() {
            return;
        }
        let len = 1 << 20;
        let p = anon(len);
        // SAFETY: our mapping, which no other thread touches.
        let r = unsafe { share(p as *const u8, len) }.expect("anonymous memory remaps");
        let held = r.clone();
        let mut t: Vec<Arc<Remap>> = vec![held];
        // The same remap many times over, unheld: only the bound stays.
        for _ in 0..KEEP_UNHELD + 10 {
            t.insert(0, dummy(0, 0));
        }
        trim(&mut t);
        assert_eq!(
            t.len(),
            KEEP_UNHELD + 1,
            "the bound of unheld, and the held one"
        );
        assert!(t.iter().any(|x| Arc::ptr_eq(x, &r)), "the held remap stays");
        drop((t, r));
        // SAFETY: the test's own mapping, no longer used.
        unsafe { libc::munmap(p, len) };
    }

    /// The hand-written `struct procmap_query` has the size its ioctl
    /// number encodes (bits 16 to 29).
    #[test]
    fn the_map_query_struct_has_the_kernels_size() {
        assert_eq!(
            std::mem::size_of::<ProcmapQuery>() as libc::c_ulong,
            (PROCMAP_QUERY >> 16) & 0x3fff
        );
    }

    /// A fresh private anonymous mapping of `len` bytes, for the test to unmap.
    fn anon(len: usize) -> *mut libc::c_void {
        // SAFETY: a new mapping of our own; no address is asked for.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p
    }

    /// Whether this process may hold writes (a userfaultfd with kernel
    /// faults: root, `CAP_SYS_PTRACE` or `vm.unprivileged_userfaultfd=1`).
    fn hold_available() -> bool {
        let len = 4 * page_size();
        let p = anon(len);
        let ok = WriteHold::new(p as usize, len).is_ok();
        // SAFETY: our mapping, no longer used.
        unsafe { libc::munmap(p, len) };
        if !ok {
            eprintln!("skipped: no userfaultfd for this process (not root, vm.unprivileged_userfaultfd=0)");
        }
        ok
    }

    /// A thread that writes to the pages while they are copied and remapped
    /// loses nothing: its writes wait in their page faults and land in the
    /// new pages.
    #[test]
    fn writes_during_the_remap_are_kept() {
        if !hold_available() {
            return;
        }
        let ps = page_size();
        let pages = 4096;
        let len = pages * ps;
        let p = anon(len);
        let base = p as usize;
        let running = Arc::new(AtomicBool::new(false));
        let r = running.clone();
        // Writes i + 1 into the first word of page i, page after page, one
        // page every 40 us: the registration's copy (the memfd's pages
        // allocated as it goes: about 30 ms for these 16 MiB) overtakes the
        // writer at once and ends long before its pass (160 ms), so without
        // the hold every page written between the copy and the remap would
        // keep its 0.
        let writer = std::thread::spawn(move || {
            for i in 0..pages {
                // SAFETY: page `i` of the mapping, which stays mapped (by
                // its private pages, then the memfd's).
                unsafe { std::ptr::write_volatile((base + i * ps) as *mut u64, i as u64 + 1) };
                r.store(true, Ordering::Relaxed);
                let t = std::time::Instant::now();
                while t.elapsed() < std::time::Duration::from_micros(40) {
                    std::hint::spin_loop();
                }
            }
        });
        while !running.load(Ordering::Relaxed) {
            std::hint::spin_loop();
        }
        // SAFETY: our mapping; the writer's stores are what the test is about.
        let remap = unsafe { share(p as *const u8, len) }.expect("anonymous memory remaps");
        assert_eq!(remap.len(), len);
        writer.join().unwrap();
        let lost: Vec<usize> = (0..pages)
            // SAFETY: page `i` of the mapping, no other user now.
            .filter(|&i| unsafe { std::ptr::read_volatile((base + i * ps) as *const u64) } != i as u64 + 1)
            .collect();
        assert!(
            lost.is_empty(),
            "{} writes lost, the first to page {}",
            lost.len(),
            lost[0]
        );
        drop(remap);
        // SAFETY: our mapping, no longer used.
        unsafe { libc::munmap(p, len) };
    }

    /// Pages never touched and pages of zeros are left as holes of the
    /// memfd: they cost no copy and no memory until written, read as
    /// zeros, and take writes; pages that hold data keep it.
    #[test]
    fn untouched_and_zero_pages_are_not_copied() {
        if !hold_available() {
            return;
        }
        let ps = page_size();
        let pages = 64;
        let len = pages * ps;
        let p = anon(len) as *mut u8;
        // Pages 0..16 cleared (made, all zeros), 16..24 written, the rest
        // never touched; one byte at the very end of page 40.
        // SAFETY: our mapping, `len` bytes, no other user.
        unsafe {
            p.write_bytes(0, 16 * ps);
            for i in 16 * ps..24 * ps {
                *p.add(i) = (i % 251) as u8 + 1;
            }
            *p.add(41 * ps - 1) = 9;
        }
        // SAFETY: as above.
        let r = unsafe { share(p, len) }.expect("anonymous memory remaps");
        // SAFETY: a stat of zeros is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: our own descriptor and an out-parameter.
        assert_eq!(unsafe { libc::fstat(r.fd(), &mut st) }, 0);
        let made = st.st_blocks as usize * 512 / ps;
        // (Where the kernel backs memfds with huge pages, one of those
        // holds the data pages and the count says nothing.)
        let huge = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
            .is_ok_and(|t| t.contains("[always]") || t.contains("[force]"));
        if huge {
            eprintln!("memfd pages not counted: shmem_enabled puts memfds on huge pages");
        } else {
            assert_eq!(
                made, 9,
                "only the 9 pages holding data are made in the memfd"
            );
        }
        // SAFETY: our mapping, now the memfd's.
        let b = unsafe { std::slice::from_raw_parts_mut(p, len) };
        assert!(b[..16 * ps].iter().all(|&x| x == 0));
        assert!((16 * ps..24 * ps).all(|i| b[i] == (i % 251) as u8 + 1));
        assert!(b[24 * ps..41 * ps - 1].iter().all(|&x| x == 0));
        assert_eq!(b[41 * ps - 1], 9);
        assert!(b[41 * ps..].iter().all(|&x| x == 0));
        // A hole written through the program's mapping shows in the memfd.
        b[3 * ps + 5] = 77;
        // SAFETY: the remap's own mapping of the memfd.
        assert_eq!(unsafe { *r.seg.as_ptr().add(3 * ps + 5) }, 77);
        drop(r);
        // SAFETY: our mapping.
        unsafe { libc::munmap(p as *mut libc::c_void, len) };
    }

    /// Pages of an earlier remap that this process never touched through
    /// its own mapping (data the memfd got another way: a peer's RDMA
    /// write into the shared pages) are kept when the range is remapped
    /// again after the first remap was let go.
    #[test]
    fn a_remap_of_an_earlier_remap_keeps_pages_not_mapped_here() {
        if !hold_available() {
            return;
        }
        let ps = page_size();
        let len = 32 * ps;
        let p = anon(len) as *mut u8;
        // SAFETY: our mapping, `len` bytes, no other user.
        unsafe { *p = 1 };
        // SAFETY: as above.
        let r = unsafe { share(p, len) }.expect("anonymous memory remaps");
        // Written through the memfd's other mapping, as a peer would: the
        // program's own page table has no entry for page 20.
        // SAFETY: the remap's segment mapping, `len` bytes.
        unsafe { *r.seg.as_ptr().add(20 * ps + 3) = 42 };
        // The remap is let go (as `trim` does to old unheld ones) while the
        // program still maps its memfd.
        REMAPS.lock().unwrap().retain(|k| !Arc::ptr_eq(k, &r));
        drop(r);
        // On a thread of its own, so that a remap that never returns (one
        // waiting on its own hold) fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let at = p as usize;
        std::thread::spawn(move || {
            // SAFETY: as above.
            let _ = tx.send(unsafe { share(at as *const u8, len) });
        });
        let r2 = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the remap finishes")
            .expect("an earlier remap remaps");
        // SAFETY: our mapping, now the new memfd's.
        let b = unsafe { std::slice::from_raw_parts(p, len) };
        assert_eq!(b[0], 1);
        assert_eq!(b[20 * ps + 3], 42, "a page never mapped here is kept");
        drop(r2);
        // SAFETY: our mapping.
        unsafe { libc::munmap(p as *mut libc::c_void, len) };
    }

    #[test]
    fn a_remap_the_program_unmapped_is_passed_over() {
        if !hold_available() {
            return;
        }
        let len = 256 << 10;
        let p = anon(len) as *mut u8;
        // SAFETY: our mapping, `len` bytes, no other user.
        unsafe { p.write_bytes(5, len) };
        // SAFETY: as above.
        let r = unsafe { share(p, len) }.expect("anonymous memory remaps");
        assert_eq!((r.start(), r.len()), (p, len));
        // The program frees the pages while registered and maps new ones
        // at the same place (an allocator reusing the address).
        // SAFETY: our mapping; replaced by fresh private memory.
        let q = unsafe {
            libc::munmap(p as *mut libc::c_void, len);
            libc::mmap(
                p as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            ) as *mut u8
        };
        assert_eq!(q, p);
        // SAFETY: as above.
        unsafe { q.write_bytes(6, len) };
        // SAFETY: as above.
        let r2 = unsafe { share(q, len) }.expect("the new pages remap");
        assert!(!Arc::ptr_eq(&r, &r2), "the stale memfd is not handed out");
        // SAFETY: the new remap's own segment mapping.
        assert_eq!(unsafe { *r2.seg.as_ptr().add(len - 1) }, 6);
        drop((r, r2));
        // SAFETY: our mapping.
        unsafe { libc::munmap(q as *mut libc::c_void, len) };
    }

    #[test]
    fn a_range_beyond_the_largest_remap_is_left_alone() {
        // Reserved, never touched: only the size is looked at.
        // SAFETY: a fresh private anonymous mapping of our own, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MAX_SHARE + 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: mapped; refused before anything reads it.
        assert!(unsafe { share(p as *const u8, MAX_SHARE + 4096) }.is_none());
        // SAFETY: our mapping.
        unsafe { libc::munmap(p, MAX_SHARE + 4096) };
    }

    #[test]
    fn small_and_file_ranges_are_left_alone() {
        let v = vec![1u8; MIN_SHARE];
        // Unaligned: fewer whole pages than MIN_SHARE.
        // SAFETY: a live buffer.
        assert!(unsafe { share(v.as_ptr().add(1), MIN_SHARE - 1) }.is_none());
        let text = remappable as *const u8;
        // SAFETY: mapped (our own code), never written: refused by the map check.
        assert!(unsafe { share(text, 1 << 20) }.is_none());
    }
}
