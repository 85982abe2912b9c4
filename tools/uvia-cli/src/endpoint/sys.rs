//! Small socket helpers shared by the kernel endpoints.

use anyhow::{bail, Result};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// How long a receive may wait for the peer before it reports an error.
pub const IO_TIMEOUT: Duration = Duration::from_secs(20);

pub fn set_int_opt(fd: RawFd, level: i32, name: i32, val: i32) -> std::io::Result<()> {
    // SAFETY: passes a valid int and its size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &val as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

pub fn get_int_opt(fd: RawFd, level: i32, name: i32) -> Option<i32> {
    let mut val: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: val and len are valid for writing.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            &mut val as *mut i32 as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0).then_some(val)
}

/// Sets a socket buffer size, forcing past the system cap where allowed (root).
pub fn set_buf(fd: RawFd, force: i32, plain: i32, bytes: i32) {
    if set_int_opt(fd, libc::SOL_SOCKET, force, bytes).is_err() {
        let _ = set_int_opt(fd, libc::SOL_SOCKET, plain, bytes);
    }
}

/// Sets the receive timeout used by blocking receives.
pub fn set_rcv_timeout(fd: RawFd, d: Duration) -> Result<()> {
    let tv = libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: passes a valid timeval and its size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        bail!(
            "setting the receive timeout: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Counts idle spins and reports when the I/O deadline has passed
/// (checking the clock only every few thousand spins).
pub struct SpinDeadline {
    spins: u32,
    deadline: Option<Instant>,
}

impl SpinDeadline {
    pub fn new() -> SpinDeadline {
        SpinDeadline {
            spins: 0,
            deadline: None,
        }
    }

    /// Call after a receive found nothing; true once the timeout has passed.
    #[inline]
    pub fn expired(&mut self) -> bool {
        self.spins = self.spins.wrapping_add(1);
        if self.spins & 0xfff != 0 {
            return false;
        }
        let now = Instant::now();
        match self.deadline {
            None => {
                self.deadline = Some(now + IO_TIMEOUT);
                false
            }
            Some(d) => now >= d,
        }
    }
}
