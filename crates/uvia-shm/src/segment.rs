//! Shared-memory segments: anonymous memfds, mapped read-write by both peers.
//!
//! A memfd has no name in any file system, so nothing is left in `/dev/shm`
//! whatever happens to the processes: the memory is freed when the last
//! mapping and the last descriptor are gone.

use crate::cvt;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

/// A mapped shared segment. Unmapped on drop.
#[derive(Debug)]
pub struct Segment {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access to its contents
// goes through raw pointers whose users synchronise with atomics.
unsafe impl Send for Segment {}
// SAFETY: as above; `Segment` itself holds no interior state besides the mapping.
unsafe impl Sync for Segment {}

/// Seals every segment carries from its creation: its size is fixed for
/// life, so no holder of the descriptor (the peer included) can take pages
/// away from under a mapping (the next access would be SIGBUS), and no seal
/// can be added later (`F_SEAL_FUTURE_WRITE` would turn a peer's mapping
/// read-only).
pub const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// The system's page size.
pub fn page_size() -> usize {
    // SAFETY: a plain query.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

/// A memfd of `len` zero bytes, close-on-exec, sealed with [`SEALS`].
fn sealed_memfd(name: &CStr, len: usize) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid C string; flags are constants.
    let fd = cvt(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    } as _)?;
    // SAFETY: memfd_create returned a fresh descriptor we now own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    // SAFETY: plain system calls on our own descriptor.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } as _)?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } as _)?;
    Ok(fd)
}

impl Segment {
    /// Creates a zero-filled segment of `len` bytes, close-on-exec, sealed
    /// with [`SEALS`].
    pub fn create(name: &CStr, len: usize) -> io::Result<Segment> {
        // Our own memory: populating it spares the data path the first faults.
        Segment::map(
            sealed_memfd(name, len)?,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_POPULATE,
        )
    }

    /// As [`create`](Self::create), but no page is made until it is
    /// touched or [`populate`](Self::populate)d: a segment most of which a
    /// quiet connection never uses costs only the pages it does.
    pub fn create_lazy(name: &CStr, len: usize) -> io::Result<Segment> {
        Segment::map(
            sealed_memfd(name, len)?,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            0,
        )
    }

    /// Makes the pages of `range` (bytes, rounded out to pages, cut at the
    /// end) present and writable now, so the data path meets no fault
    /// there. Only for a segment nobody else writes yet: where the kernel
    /// lacks `MADV_POPULATE_WRITE` (before 5.14), each page is made by
    /// writing a zero byte over the zero it holds.
    pub fn populate(&self, range: std::ops::Range<usize>) {
        let page = page_size();
        let start = range.start / page * page;
        let end = range.end.min(self.len).next_multiple_of(page).min(self.len);
        if start >= end {
            return;
        }
        // SAFETY: advice on pages of our own mapping, inside its length.
        let r = unsafe {
            libc::madvise(
                self.as_ptr().add(start) as *mut libc::c_void,
                end - start,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r != 0 {
            for at in (start..end).step_by(page) {
                // SAFETY: inside the mapping; the segment is fresh and
                // zero-filled, and nobody else writes it yet.
                unsafe { std::ptr::write_volatile(self.as_ptr().add(at), 0) };
            }
        }
    }

    /// Maps, read-write, a segment a peer passed. It must be sealed against
    /// shrinking and exactly `len` bytes long (its size is read from the
    /// file, not taken from the peer's word). Not populated: the pages are
    /// the peer's to provide.
    pub fn open_exact(fd: OwnedFd, len: usize) -> io::Result<Segment> {
        let size = sealed_size(&fd)?;
        if size != len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("shared segment is {size} bytes, expected {len}"),
            ));
        }
        Segment::map(fd, len, libc::PROT_READ | libc::PROT_WRITE, 0)
    }

    /// Maps a peer's segment for reading only (the descriptor may be
    /// read-only). It must be sealed against shrinking and at most `max_len`
    /// bytes long; it is mapped at its size, lazily.
    pub fn open_read_only(fd: OwnedFd, max_len: usize) -> io::Result<Segment> {
        Segment::open_sealed(fd, max_len, libc::PROT_READ)
    }

    /// [`open_read_only`](Self::open_read_only), mapped for reading and
    /// writing.
    pub fn open_writable(fd: OwnedFd, max_len: usize) -> io::Result<Segment> {
        Segment::open_sealed(fd, max_len, libc::PROT_READ | libc::PROT_WRITE)
    }

    fn open_sealed(fd: OwnedFd, max_len: usize, prot: libc::c_int) -> io::Result<Segment> {
        let size = sealed_size(&fd)?;
        if size > max_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("shared segment is {size} bytes, more than {max_len}"),
            ));
        }
        Segment::map(fd, size, prot, 0)
    }

    /// A read-only descriptor for the same memory, to hand to a peer that
    /// may read but not write (or resize) it.
    pub fn read_only_fd(&self) -> io::Result<OwnedFd> {
        let path = std::ffi::CString::new(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
            .map_err(io::Error::other)?;
        // SAFETY: a valid C string path; flags are constants.
        let fd = cvt(unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) } as _)?;
        // SAFETY: a fresh descriptor we own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }

    fn map(fd: OwnedFd, len: usize, prot: libc::c_int, flags: libc::c_int) -> io::Result<Segment> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "empty shared segment",
            ));
        }
        // SAFETY: mapping a descriptor we own; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED | flags,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            NonNull::new(p as *mut u8).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Segment { fd, base, len })
    }

    #[inline(always)]
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The descriptor, to pass to the peer.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the range `map` created; no references into
        // it outlive the segment (users hold the `Segment` while they use it).
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// The size of a peer's segment, once it is known that the size can no
/// longer shrink: without `F_SEAL_SHRINK` (or without seals at all: not a
/// memfd) the peer could truncate it after we mapped it.
fn sealed_size(fd: &OwnedFd) -> io::Result<usize> {
    // SAFETY: plain system call on a descriptor we own.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "shared segment is not sealed against shrinking",
        ));
    }
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid pointer for the duration of the call.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } as _)?;
    Ok(st.st_size as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dup(fd: RawFd) -> OwnedFd {
        // SAFETY: duplicating a descriptor we own.
        unsafe { OwnedFd::from_raw_fd(libc::dup(fd)) }
    }

    /// A memfd of `len` bytes as a careless or hostile peer makes it: no seals.
    fn unsealed(len: usize) -> OwnedFd {
        // SAFETY: a literal name; flags are constants.
        let fd = unsafe { libc::memfd_create(c"bare".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain call on our descriptor.
        assert_eq!(
            unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) },
            0
        );
        fd
    }

    /// Which of the segment's pages are resident.
    fn resident(seg: &Segment) -> Vec<bool> {
        let page = page_size();
        let mut v = vec![0u8; seg.len().div_ceil(page)];
        // SAFETY: our own mapping, its length, and a vector of one byte per page.
        let r =
            unsafe { libc::mincore(seg.as_ptr() as *mut libc::c_void, seg.len(), v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", io::Error::last_os_error());
        v.iter().map(|b| b & 1 != 0).collect()
    }

    #[test]
    fn a_lazy_segment_has_only_the_pages_populated_or_touched() {
        let page = page_size();
        let seg = Segment::create_lazy(c"lazy", 8 * page).unwrap();
        assert!(
            resident(&seg).iter().all(|&r| !r),
            "no page before any is asked for"
        );
        // Ranges round out to pages and stop at the end.
        seg.populate(page + 1..2 * page + 1);
        seg.populate(7 * page + 5..100 * page);
        let want = [false, true, true, false, false, false, false, true];
        assert_eq!(resident(&seg), want);
        // Populated pages read as zero; a touch makes another page.
        // SAFETY: inside the 8-page mapping, which only this test uses.
        unsafe {
            assert_eq!(*seg.as_ptr().add(page + 9), 0);
            *seg.as_ptr().add(4 * page) = 7;
        }
        assert!(resident(&seg)[4]);
        // What one mapping made, another of the same memory sees.
        let other = Segment::open_exact(dup(seg.fd()), 8 * page).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { *other.as_ptr().add(4 * page) }, 7);
    }

    #[test]
    fn create_and_reopen_share_memory() {
        let a = Segment::create(c"t", 8192).unwrap();
        let b = Segment::open_exact(dup(a.fd()), 8192).unwrap();
        assert_eq!(b.len(), 8192);
        // SAFETY: both mappings are 8192 bytes long.
        unsafe {
            *a.as_ptr().add(100) = 42;
            assert_eq!(*b.as_ptr().add(100), 42);
        }
    }

    #[test]
    fn read_only_view_sees_writes_and_cannot_write() {
        let a = Segment::create(c"t", 4096).unwrap();
        let b = Segment::open_read_only(a.read_only_fd().unwrap(), 4096).unwrap();
        // SAFETY: both mappings are 4096 bytes long.
        unsafe {
            *a.as_ptr().add(7) = 9;
            assert_eq!(*b.as_ptr().add(7), 9);
        }
        // The descriptor itself refuses writes.
        let fd = a.read_only_fd().unwrap();
        // SAFETY: writing one byte from a live buffer to our descriptor.
        let n = unsafe { libc::write(fd.as_raw_fd(), [1u8].as_ptr() as *const libc::c_void, 1) };
        assert_eq!(n, -1);
    }

    #[test]
    fn a_segment_of_another_size_is_refused() {
        let a = Segment::create(c"t", 4096).unwrap();
        for len in [8192, 2048] {
            let err = Segment::open_exact(dup(a.fd()), len).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{len}: {err}");
        }
        let err = Segment::open_read_only(a.read_only_fd().unwrap(), 4095).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }

    /// Nobody, the creator included, can shrink or grow a segment once it
    /// exists: a peer's mapping never loses its pages.
    #[test]
    fn segments_are_sealed_against_resizing() {
        let a = Segment::create(c"t", 4096).unwrap();
        for len in [0, 8192] {
            // SAFETY: plain call on our descriptor.
            let r = unsafe { libc::ftruncate(a.fd(), len) };
            assert_eq!(r, -1, "resize to {len}");
            assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EPERM));
        }
        // SAFETY: plain call on our descriptor.
        let seals = unsafe { libc::fcntl(a.fd(), libc::F_GET_SEALS) };
        assert_eq!(seals, SEALS);
    }

    #[test]
    fn an_unsealed_segment_is_refused() {
        let err = Segment::open_exact(unsealed(4096), 4096).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        let err = Segment::open_read_only(unsealed(4096), 4096).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        // Not a memfd at all.
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        let err = Segment::open_read_only(f.into(), usize::MAX).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }
}
