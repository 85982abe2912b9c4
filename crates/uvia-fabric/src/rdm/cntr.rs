//! Counters on a reliable-datagram domain. MPICH opens one and binds it to
//! its endpoint for RMA completions whatever the provider offers; RMA is
//! not offered here, so a bound counter counts only what the program adds.

use crate::domain::Domain;
use crate::guard;
use crate::nosys;
use crate::sys::*;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A counter. `#[repr(C)]` with libfabric's `fid_cntr` first.
#[repr(C)]
pub struct Cntr {
    pub fid: fid_cntr,
    domain: *const Domain,
    value: AtomicU64,
    errors: AtomicU64,
    /// Endpoints bound to it; it closes only at zero.
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

static OPS: fi_ops_cntr = fi_ops_cntr {
    size: std::mem::size_of::<fi_ops_cntr>(),
    read: Some(read),
    readerr: Some(readerr),
    add: Some(add),
    set: Some(set),
    wait: Some(wait),
    adderr: Some(adderr),
    seterr: Some(seterr),
};

/// `fi_cntr_open` on a reliable-datagram domain: completions counted, no
/// wait object (a wait polls).
pub unsafe extern "C" fn open(
    d: *mut fid_domain,
    attr: *mut fi_cntr_attr,
    cntr: *mut *mut fid_cntr,
    context: *mut c_void,
) -> c_int {
    guard::call("cntr_open", || {
        // SAFETY: libfabric passes the domain it was given.
        let domain = unsafe { Domain::from_fid(d) }?;
        if cntr.is_null() {
            return Err(err::EINVAL);
        }
        // SAFETY: NULL (the defaults) or the caller's attributes.
        if let Some(a) = unsafe { attr.as_ref() } {
            if a.events != FI_CNTR_EVENTS_COMP {
                return Err(err::ENOSYS);
            }
            if !matches!(a.wait_obj, FI_WAIT_NONE | FI_WAIT_UNSPEC) {
                return Err(err::ENOSYS);
            }
        }
        let c = Box::new(Cntr {
            fid: fid_cntr {
                fid: fid {
                    fclass: FI_CLASS_CNTR as usize,
                    context,
                    ops: &FI_OPS as *const fi_ops as *mut fi_ops,
                },
                ops: &OPS as *const fi_ops_cntr as *mut fi_ops_cntr,
            },
            domain,
            value: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            refs: AtomicUsize::new(0),
        });
        domain.refs.fetch_add(1, Ordering::AcqRel);
        // SAFETY: checked non-NULL above.
        unsafe { *cntr = Box::into_raw(c) as *mut fid_cntr };
        Ok(())
    })
}

impl Cntr {
    /// # Safety
    /// `p` is NULL or a fid this provider handed out and has not freed.
    pub unsafe fn from_fid<'a>(p: *mut fid) -> Result<&'a Cntr, c_int> {
        // SAFETY: per the contract, with the class checked.
        match unsafe { p.as_ref() } {
            Some(f) if f.fclass == FI_CLASS_CNTR as usize => Ok(unsafe { &*(p as *const Cntr) }),
            _ => Err(err::EINVAL),
        }
    }
}

/// The counter behind `c`, or `None` for a fid that is not one.
///
/// # Safety
/// As [`Cntr::from_fid`].
unsafe fn this<'a>(c: *mut fid_cntr) -> Option<&'a Cntr> {
    // SAFETY: per the contract.
    unsafe { Cntr::from_fid(c as *mut fid) }.ok()
}

unsafe extern "C" fn read(c: *mut fid_cntr) -> u64 {
    // SAFETY: libfabric calls through the fid it was given.
    unsafe { this(c) }.map_or(0, |c| c.value.load(Ordering::Acquire))
}

unsafe extern "C" fn readerr(c: *mut fid_cntr) -> u64 {
    // SAFETY: as in read.
    unsafe { this(c) }.map_or(0, |c| c.errors.load(Ordering::Acquire))
}

unsafe extern "C" fn add(c: *mut fid_cntr, v: u64) -> c_int {
    // SAFETY: as in read.
    let Some(c) = (unsafe { this(c) }) else {
        return err::EINVAL;
    };
    c.value.fetch_add(v, Ordering::AcqRel);
    0
}

unsafe extern "C" fn set(c: *mut fid_cntr, v: u64) -> c_int {
    // SAFETY: as in read.
    let Some(c) = (unsafe { this(c) }) else {
        return err::EINVAL;
    };
    c.value.store(v, Ordering::Release);
    0
}

unsafe extern "C" fn adderr(c: *mut fid_cntr, v: u64) -> c_int {
    // SAFETY: as in read.
    let Some(c) = (unsafe { this(c) }) else {
        return err::EINVAL;
    };
    c.errors.fetch_add(v, Ordering::AcqRel);
    0
}

unsafe extern "C" fn seterr(c: *mut fid_cntr, v: u64) -> c_int {
    // SAFETY: as in read.
    let Some(c) = (unsafe { this(c) }) else {
        return err::EINVAL;
    };
    c.errors.store(v, Ordering::Release);
    0
}

/// `fi_cntr_wait`: until the value reaches `threshold` (only the program's
/// own adds move it), an error is counted or the timeout passes.
unsafe extern "C" fn wait(c: *mut fid_cntr, threshold: u64, timeout_ms: c_int) -> c_int {
    // SAFETY: as in read.
    let Some(c) = (unsafe { this(c) }) else {
        return err::EINVAL;
    };
    let errors = c.errors.load(Ordering::Acquire);
    let deadline =
        (timeout_ms >= 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64));
    loop {
        if c.value.load(Ordering::Acquire) >= threshold {
            return 0;
        }
        if c.errors.load(Ordering::Acquire) != errors {
            return -(FI_EAVAIL as c_int);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return -(FI_ETIMEDOUT as c_int);
        }
        std::thread::yield_now();
    }
}

unsafe extern "C" fn close(p: *mut fid) -> c_int {
    guard::call("cntr close", || {
        // SAFETY: libfabric calls close through the fid it was given.
        let c = unsafe { Cntr::from_fid(p) }?;
        if c.refs.load(Ordering::Acquire) != 0 {
            return Err(err::EBUSY);
        }
        // SAFETY: a counter keeps its domain open.
        unsafe { &*c.domain }.refs.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: the box made in `open`; nothing refers to it any more.
        drop(unsafe { Box::from_raw(c as *const Cntr as *mut Cntr) });
        Ok(())
    })
}
