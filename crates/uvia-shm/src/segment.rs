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

impl Segment {
    /// Creates a zero-filled segment of `len` bytes, close-on-exec.
    pub fn create(name: &CStr, len: usize) -> io::Result<Segment> {
        // SAFETY: `name` is a valid C string; flags are constants.
        let fd = cvt(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) } as _)?;
        // SAFETY: memfd_create returned a fresh descriptor we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        // SAFETY: plain system call on our own descriptor.
        cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } as _)?;
        Segment::map(fd, len)
    }

    /// Maps a segment received from a peer. Its size is read from the file,
    /// not trusted from the peer's word, and must be at least `min_len`.
    pub fn open(fd: OwnedFd, min_len: usize) -> io::Result<Segment> {
        // SAFETY: zeroed stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid pointer for the duration of the call.
        cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } as _)?;
        let len = st.st_size as usize;
        if len < min_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("shared segment is {len} bytes, expected at least {min_len}"),
            ));
        }
        Segment::map(fd, len)
    }

    /// Maps a peer's segment for reading only (the descriptor may be
    /// read-only). Its size is read from the file.
    pub fn open_read_only(fd: OwnedFd) -> io::Result<Segment> {
        // SAFETY: zeroed stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid pointer for the duration of the call.
        cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } as _)?;
        Segment::map_prot(fd, st.st_size as usize, libc::PROT_READ)
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

    fn map(fd: OwnedFd, len: usize) -> io::Result<Segment> {
        Segment::map_prot(fd, len, libc::PROT_READ | libc::PROT_WRITE)
    }

    fn map_prot(fd: OwnedFd, len: usize, prot: libc::c_int) -> io::Result<Segment> {
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
                libc::MAP_SHARED | libc::MAP_POPULATE,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_and_reopen_share_memory() {
        let a = Segment::create(c"t", 8192).unwrap();
        // SAFETY: duplicating a descriptor we own.
        let dup = unsafe { OwnedFd::from_raw_fd(libc::dup(a.fd())) };
        let b = Segment::open(dup, 4096).unwrap();
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
        let b = Segment::open_read_only(a.read_only_fd().unwrap()).unwrap();
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
    fn too_small_segment_is_refused() {
        let a = Segment::create(c"t", 4096).unwrap();
        // SAFETY: duplicating a descriptor we own.
        let dup = unsafe { OwnedFd::from_raw_fd(libc::dup(a.fd())) };
        let err = Segment::open(dup, 8192).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
