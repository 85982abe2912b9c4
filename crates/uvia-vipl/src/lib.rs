//! The VIPL 1.0 C API over uvia: `vipl.h` (in `include/`), built as
//! `libvipl.so` and `libvipl.a`.
//!
//! Each function checks its handles and arguments, maps them onto the Rust
//! core and maps the outcome back onto a `VIP_RETURN`. Descriptors are the
//! program's own memory: the core's descriptor has VIPL's layout, so a posted
//! descriptor is read and completed in place. docs/VIPL.md lists the return
//! code of every situation where the specification leaves the choice open.

#![allow(clippy::missing_safety_doc)]

mod cm;
mod data;
mod handle;
pub mod names;
mod nic;
mod notify;
pub mod types;

pub use types::ret;

use std::ffi::{c_ulong, c_void};
use std::time::Duration;
use types::{VipReturn, HOST_ADDRESS_LEN, INFINITE, INFINITE32};

/// A VIPL timeout in milliseconds; `None` is forever.
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

/// A host address as `VIP_NET_ADDRESS` carries it: text, NUL-padded.
fn host_bytes(text: &str) -> Option<[u8; HOST_ADDRESS_LEN]> {
    let b = text.as_bytes();
    if b.len() >= HOST_ADDRESS_LEN {
        return None;
    }
    let mut out = [0u8; HOST_ADDRESS_LEN];
    out[..b.len()].copy_from_slice(b);
    Some(out)
}

/// Runs a call body that returns early with an error code.
fn vip(f: impl FnOnce() -> Result<(), VipReturn>) -> VipReturn {
    match f() {
        Ok(()) => ret::SUCCESS,
        Err(r) => r,
    }
}

/// `p` as a handle-sized integer, for the notify thread.
fn addr(p: *mut c_void) -> usize {
    p as usize
}
