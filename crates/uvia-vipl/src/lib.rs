//! The VIPL 1.0 C API over uvia: `vipl.h` (in `include/`), built as
//! `libvipl.so` and `libvipl.a`.
//!
//! Each function checks its handles and arguments, maps them onto the Rust
//! core and maps the outcome back onto a `VIP_RETURN`. Descriptors are the
//! program's own memory: the core's descriptor has VIPL's layout, so a posted
//! descriptor is read and completed in place. docs/VIPL.md lists the return
//! code of every situation where the specification leaves the choice open.

#![allow(clippy::missing_safety_doc)]

pub mod address;
mod cm;
mod data;
mod handle;
pub mod names;
mod nic;
mod notify;
pub mod types;
mod unwind;

pub use types::ret;

use std::ffi::{c_ulong, c_void};
use std::time::Duration;
use types::{VipReturn, INFINITE, INFINITE32};

/// A VIPL timeout in milliseconds; `None` is forever.
#[allow(clippy::unnecessary_cast)] // c_ulong is not u64 on every target
fn timeout(ms: c_ulong) -> Option<Duration> {
    (ms != INFINITE && ms != INFINITE32).then(|| Duration::from_millis(ms as u64))
}

/// Writes `v` through an out-pointer, or says the pointer was NULL.
///
/// # Safety
/// `p` is NULL or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> Result<(), VipReturn> {
    if p.is_null() {
        return Err(ret::INVALID_PARAMETER);
    }
    // SAFETY: non-NULL and valid per the contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Runs the body of the exported function `name`, which returns early with
/// an error code; a panic is `VIP_ERROR_RESOURCE` (see [`unwind`]).
fn vip(name: &'static str, f: impl FnOnce() -> Result<(), VipReturn>) -> VipReturn {
    unwind::call(name, || match f() {
        Ok(()) => ret::SUCCESS,
        Err(r) => r,
    })
}

/// `p` as a handle-sized integer, for the notify thread.
fn addr(p: *mut c_void) -> usize {
    p as usize
}

#[cfg(test)]
mod tests {
    //! Handles through the C functions: stale, of the wrong kind, destroyed
    //! twice. Each test opens a shm instance of its own.
    use super::*;
    use std::ffi::CString;
    use std::ptr::null_mut;
    use types::{NicAttributes, ViAttributes};

    // SAFETY (every call below): the pointers are live locals, the handles
    // came from the library, and no call uses a handle another one destroys.

    /// An shm instance of the test's own: its letter and the pid in base
    /// 36 (an instance name is at most 6 characters).
    fn open(test: char) -> *mut c_void {
        let (mut pid, mut inst) = (std::process::id(), String::new());
        while pid > 0 {
            inst.insert(0, char::from_digit(pid % 36, 36).unwrap());
            pid /= 36;
        }
        let name = CString::new(format!("shm:{test}{inst}")).unwrap();
        let mut h = null_mut();
        assert_eq!(
            unsafe { nic::VipOpenNic(name.as_ptr(), &mut h) },
            ret::SUCCESS
        );
        h
    }

    /// A tag and a VI on `n`.
    fn vi(n: *mut c_void) -> (*mut c_void, *mut c_void) {
        let (mut p, mut v) = (null_mut(), null_mut());
        assert_eq!(unsafe { nic::VipCreatePtag(n, &mut p) }, ret::SUCCESS);
        let a = ViAttributes {
            reliability_level: types::service::RELIABLE_DELIVERY,
            max_transfer_size: 1024,
            qos: null_mut(),
            ptag: p,
            enable_rdma_write: 0,
            enable_rdma_read: 0,
        };
        let r = unsafe { data::VipCreateVi(n, &a, null_mut(), null_mut(), &mut v) };
        assert_eq!(r, ret::SUCCESS);
        (p, v)
    }

    fn query_nic(n: *mut c_void) -> VipReturn {
        let mut a = std::mem::MaybeUninit::<NicAttributes>::uninit();
        unsafe { nic::VipQueryNic(n, a.as_mut_ptr()) }
    }

    #[test]
    fn handles_of_another_kind_are_refused() {
        let n = open('k');
        let (p, v) = vi(n);
        let mut c = null_mut();
        assert_eq!(unsafe { data::VipCreateCQ(n, 4, &mut c) }, ret::SUCCESS);
        for wrong in [p, v, c] {
            assert_eq!(query_nic(wrong), ret::INVALID_PARAMETER);
            assert_eq!(unsafe { nic::VipCloseNic(wrong) }, ret::INVALID_PARAMETER);
        }
        assert_eq!(unsafe { data::VipDestroyVi(c) }, ret::INVALID_PARAMETER);
        assert_eq!(unsafe { data::VipDestroyVi(n) }, ret::INVALID_PARAMETER);
        assert_eq!(unsafe { data::VipDestroyCQ(v) }, ret::INVALID_PARAMETER);
        assert_eq!(unsafe { nic::VipDestroyPtag(n, v) }, ret::INVALID_PTAG);
        // Everything still works.
        assert_eq!(query_nic(n), ret::SUCCESS);
        assert_eq!(unsafe { data::VipDestroyVi(v) }, ret::SUCCESS);
        assert_eq!(unsafe { data::VipDestroyCQ(c) }, ret::SUCCESS);
        assert_eq!(unsafe { nic::VipDestroyPtag(n, p) }, ret::SUCCESS);
        assert_eq!(unsafe { nic::VipCloseNic(n) }, ret::SUCCESS);
    }

    #[test]
    fn destroyed_handles_are_refused_and_destroy_twice_fails() {
        let n = open('s');
        let (p, v) = vi(n);
        let mut c = null_mut();
        assert_eq!(unsafe { data::VipCreateCQ(n, 4, &mut c) }, ret::SUCCESS);
        assert_eq!(unsafe { data::VipDestroyVi(v) }, ret::SUCCESS);
        assert_eq!(unsafe { data::VipDestroyVi(v) }, ret::INVALID_PARAMETER);
        let mut st = 0;
        let r = unsafe { data::VipQueryVi(v, &mut st, null_mut(), null_mut(), null_mut()) };
        assert_eq!(r, ret::INVALID_PARAMETER);
        let mut got = null_mut();
        assert_eq!(
            unsafe { data::VipRecvDone(v, &mut got) },
            ret::INVALID_PARAMETER
        );
        assert_eq!(unsafe { data::VipDestroyCQ(c) }, ret::SUCCESS);
        assert_eq!(unsafe { data::VipDestroyCQ(c) }, ret::INVALID_PARAMETER);
        assert_eq!(unsafe { data::VipResizeCQ(c, 8) }, ret::INVALID_PARAMETER);
        assert_eq!(unsafe { nic::VipDestroyPtag(n, p) }, ret::SUCCESS);
        assert_eq!(unsafe { nic::VipDestroyPtag(n, p) }, ret::INVALID_PTAG);
        // New objects may take the freed slots; the old handles stay refused.
        let (p2, v2) = vi(n);
        assert_eq!(unsafe { data::VipDestroyVi(v) }, ret::INVALID_PARAMETER);
        assert_eq!(unsafe { data::VipDestroyVi(v2) }, ret::SUCCESS);
        assert_eq!(unsafe { nic::VipDestroyPtag(n, p2) }, ret::SUCCESS);
        assert_eq!(unsafe { nic::VipCloseNic(n) }, ret::SUCCESS);
        assert_eq!(unsafe { nic::VipCloseNic(n) }, ret::INVALID_PARAMETER);
        assert_eq!(query_nic(n), ret::INVALID_PARAMETER);
    }
}
