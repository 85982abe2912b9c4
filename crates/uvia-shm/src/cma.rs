//! Copies between address spaces (cross-memory attach), for one-copy transfers.
//!
//! `process_vm_readv` / `process_vm_writev` move bytes straight from one
//! process's buffer to another's in a single kernel copy. They need ptrace
//! access to the peer: same user and no Yama restriction, or CAP_SYS_PTRACE.

use std::io;

/// A range in another process's address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRange {
    pub addr: u64,
    pub len: u64,
}

/// A range in this process's address space.
#[derive(Debug, Clone, Copy)]
pub struct LocalRange {
    pub ptr: *mut u8,
    pub len: usize,
}

/// Most ranges per side in one call (kernel `UIO_MAXIOV` is 1024).
pub const MAX_RANGES: usize = 64;

fn iov_local(r: &[LocalRange]) -> ([libc::iovec; MAX_RANGES], usize) {
    let mut v = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_RANGES];
    for (d, s) in v.iter_mut().zip(r) {
        *d = libc::iovec {
            iov_base: s.ptr as *mut libc::c_void,
            iov_len: s.len,
        };
    }
    (v, r.len().min(MAX_RANGES))
}

fn iov_remote(r: &[RemoteRange]) -> ([libc::iovec; MAX_RANGES], usize) {
    let mut v = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_RANGES];
    for (d, s) in v.iter_mut().zip(r) {
        *d = libc::iovec {
            iov_base: s.addr as usize as *mut libc::c_void,
            iov_len: s.len as usize,
        };
    }
    (v, r.len().min(MAX_RANGES))
}

#[derive(Clone, Copy)]
enum Dir {
    Read,
    Write,
}

/// Copies up to `total` bytes between `local` (gathered/scattered in order)
/// and `remote` in process `pid`, resuming after partial transfers.
fn transfer(
    dir: Dir,
    pid: i32,
    local: &[LocalRange],
    remote: &[RemoteRange],
    total: usize,
) -> io::Result<()> {
    if local.len() > MAX_RANGES || remote.len() > MAX_RANGES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many ranges for one copy",
        ));
    }
    let (mut lv, ln) = iov_local(local);
    let (mut rv, rn) = iov_remote(remote);
    let (mut li, mut ri, mut done) = (0usize, 0usize, 0usize);
    while done < total {
        // SAFETY: the iovec arrays hold `ln`/`rn` valid entries from index
        // li/ri on; local ranges are writable (read) or readable (write)
        // memory of ours as the callers guarantee; remote ranges are checked by
        // the kernel against the peer's mappings.
        let n = unsafe {
            match dir {
                Dir::Read => libc::process_vm_readv(
                    pid,
                    lv[li..].as_ptr(),
                    (ln - li) as _,
                    rv[ri..].as_ptr(),
                    (rn - ri) as _,
                    0,
                ),
                Dir::Write => libc::process_vm_writev(
                    pid,
                    lv[li..].as_ptr(),
                    (ln - li) as _,
                    rv[ri..].as_ptr(),
                    (rn - ri) as _,
                    0,
                ),
            }
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "cross-memory copy made no progress",
            ));
        }
        let mut n = n as usize;
        done += n;
        // Advance both vectors past the bytes moved.
        let mut skip = n;
        while li < ln && skip >= lv[li].iov_len {
            skip -= lv[li].iov_len;
            li += 1;
        }
        if li < ln && skip > 0 {
            // SAFETY: advancing within the same buffer.
            lv[li].iov_base =
                unsafe { (lv[li].iov_base as *mut u8).add(skip) } as *mut libc::c_void;
            lv[li].iov_len -= skip;
        }
        while ri < rn && n >= rv[ri].iov_len {
            n -= rv[ri].iov_len;
            ri += 1;
        }
        if ri < rn && n > 0 {
            rv[ri].iov_base = (rv[ri].iov_base as usize + n) as *mut libc::c_void;
            rv[ri].iov_len -= n;
        }
        if li >= ln || ri >= rn {
            break;
        }
    }
    if done < total {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "cross-memory copy ended short",
        ));
    }
    Ok(())
}

/// Reads `total` bytes from `remote` in process `pid` into `local`.
///
/// # Safety
/// Every local range is memory of this process that may be written.
pub unsafe fn read(
    pid: i32,
    local: &[LocalRange],
    remote: &[RemoteRange],
    total: usize,
) -> io::Result<()> {
    transfer(Dir::Read, pid, local, remote, total)
}

/// Writes `total` bytes from `local` into `remote` in process `pid`.
///
/// # Safety
/// Every local range is memory of this process that may be read.
pub unsafe fn write(
    pid: i32,
    local: &[LocalRange],
    remote: &[RemoteRange],
    total: usize,
) -> io::Result<()> {
    transfer(Dir::Write, pid, local, remote, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_gather_read_from_self() {
        let src_a = vec![1u8; 3000];
        let src_b = vec![2u8; 5000];
        let mut dst_a = vec![0u8; 4096];
        let mut dst_b = vec![0u8; 4096];
        let remote = [
            RemoteRange {
                addr: src_a.as_ptr() as u64,
                len: 3000,
            },
            RemoteRange {
                addr: src_b.as_ptr() as u64,
                len: 5000,
            },
        ];
        let local = [
            LocalRange {
                ptr: dst_a.as_mut_ptr(),
                len: 4096,
            },
            LocalRange {
                ptr: dst_b.as_mut_ptr(),
                len: 4096,
            },
        ];
        // SAFETY: local ranges are our own vectors.
        unsafe { read(std::process::id() as i32, &local, &remote, 8000).unwrap() };
        assert!(dst_a[..3000].iter().all(|&b| b == 1));
        assert!(dst_a[3000..].iter().all(|&b| b == 2));
        assert!(dst_b[..3904].iter().all(|&b| b == 2));
        assert!(dst_b[3904..].iter().all(|&b| b == 0));
    }

    #[test]
    fn unmapped_remote_is_an_error() {
        let mut dst = vec![0u8; 16];
        let local = [LocalRange {
            ptr: dst.as_mut_ptr(),
            len: 16,
        }];
        let remote = [RemoteRange { addr: 8, len: 16 }];
        // SAFETY: local range is our own vector.
        let err = unsafe { read(std::process::id() as i32, &local, &remote, 16) }.unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EFAULT));
    }
}
