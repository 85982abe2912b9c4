//! The fabric object: the root of a program's objects on the provider.
//! It holds no medium of its own; domains (one per medium) open the Nics.

use crate::domain;
use crate::guard;
use crate::nosys;
use crate::prov;
use crate::sys::*;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fabric. `#[repr(C)]` with libfabric's `fid_fabric` first, so the
/// pointer libfabric holds is a pointer to this struct.
#[repr(C)]
pub struct Fabric {
    pub fid: fid_fabric,
    /// Objects opened on it and not yet closed; it closes only at zero.
    pub refs: AtomicUsize,
}

static FI_OPS: fi_ops = fi_ops {
    size: std::mem::size_of::<fi_ops>(),
    close: Some(close),
    bind: Some(nosys::bind),
    control: Some(nosys::control),
    ops_open: Some(nosys::ops_open),
    tostr: Some(nosys::tostr),
    ops_set: Some(nosys::ops_set),
};

static OPS: fi_ops_fabric = fi_ops_fabric {
    size: std::mem::size_of::<fi_ops_fabric>(),
    domain: Some(domain::open),
    passive_ep: Some(crate::pep::open),
    eq_open: Some(crate::eq::open),
    wait_open: Some(nosys::wait_open),
    trywait: Some(trywait),
    domain2: Some(nosys::domain2),
};

/// `fi_fabric` for this provider.
pub unsafe extern "C" fn open(
    attr: *mut fi_fabric_attr,
    fabric: *mut *mut fid_fabric,
    context: *mut c_void,
) -> c_int {
    guard::call("fabric", || {
        // SAFETY: libfabric passes a valid attribute struct or NULL.
        let attr = unsafe { attr.as_ref() }.ok_or(err::EINVAL)?;
        if fabric.is_null() {
            return Err(err::EINVAL);
        }
        // SAFETY: a NUL-terminated name or NULL.
        if !attr.name.is_null() && unsafe { CStr::from_ptr(attr.name) } != prov::NAME {
            return Err(err::ENODATA);
        }
        let f = Box::new(Fabric {
            fid: fid_fabric {
                fid: fid {
                    fclass: FI_CLASS_FABRIC as usize,
                    context,
                    // libfabric reads the tables and never writes them.
                    ops: &FI_OPS as *const fi_ops as *mut fi_ops,
                },
                ops: &OPS as *const fi_ops_fabric as *mut fi_ops_fabric,
                api_version: attr.api_version,
            },
            refs: AtomicUsize::new(0),
        });
        // SAFETY: checked non-NULL above.
        unsafe { *fabric = Box::into_raw(f) as *mut fid_fabric };
        Ok(())
    })
}

impl Fabric {
    /// The fabric behind a `fid_fabric` libfabric hands back.
    ///
    /// # Safety
    /// `f` is NULL or a fid this provider handed out and has not freed.
    pub unsafe fn from_fid<'a>(f: *mut fid_fabric) -> Result<&'a Fabric, c_int> {
        // SAFETY: per the contract; the class check refuses another kind of
        // object passed where a fabric belongs.
        match unsafe { f.as_ref() } {
            Some(f) if f.fid.fclass == FI_CLASS_FABRIC as usize => {
                Ok(unsafe { &*(f as *const fid_fabric as *const Fabric) })
            }
            _ => Err(err::EINVAL),
        }
    }
}

unsafe extern "C" fn close(f: *mut fid) -> c_int {
    guard::call("fabric close", || {
        // SAFETY: libfabric calls close through the fid it was given.
        let fabric = unsafe { Fabric::from_fid(f as *mut fid_fabric) }?;
        if fabric.refs.load(Ordering::Acquire) != 0 {
            return Err(err::EBUSY);
        }
        // SAFETY: the box made in `open`; nothing refers to it any more.
        drop(unsafe { Box::from_raw(fabric as *const Fabric as *mut Fabric) });
        Ok(())
    })
}

/// `fi_trywait`: `FI_SUCCESS` when the program may sleep on every named
/// object's fd, `-FI_EAGAIN` when one of them has work waiting (CQs and
/// EQs).
unsafe extern "C" fn trywait(_fabric: *mut fid_fabric, fids: *mut *mut fid, count: c_int) -> c_int {
    guard::call("trywait", || {
        if count < 0 || (count > 0 && fids.is_null()) {
            return Err(err::EINVAL);
        }
        for i in 0..count as usize {
            // SAFETY: the caller's array of `count` fids.
            let f = unsafe { *fids.add(i) };
            match unsafe { f.as_ref() }.map(|f| f.fclass as u32) {
                // SAFETY: a CQ fid of ours, by its class.
                Some(FI_CLASS_CQ) => unsafe { crate::cq::Cq::from_fid(f) }?.trywait()?,
                // SAFETY: an EQ fid of ours, by its class.
                Some(FI_CLASS_EQ) => unsafe { crate::eq::Eq::from_fid(f) }?.trywait()?,
                Some(_) => return Err(err::ENOSYS),
                None => return Err(err::EINVAL),
            }
        }
        Ok(())
    })
}
