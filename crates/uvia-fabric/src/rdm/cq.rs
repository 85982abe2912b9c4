//! The completion queue of reliable-datagram endpoints: entries the
//! endpoints write as their operations complete, read in the format the
//! program asked for. A read first runs the progress of the endpoints bound
//! to it (their rings are looked at, their queued sends written), so a
//! program that only reads its CQ moves every message.

use super::Ep;
use crate::domain::Domain;
use crate::guard;
use crate::nosys;
use crate::sys::*;
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use uvia::SpinLock;

/// One completion: the tagged entry (the longest format) and its source.
#[derive(Clone, Copy)]
pub struct Entry {
    pub e: fi_cq_tagged_entry,
    pub src: fi_addr_t,
}

#[derive(Default)]
struct Queue {
    entries: VecDeque<Entry>,
    errors: VecDeque<fi_cq_err_entry>,
}

// SAFETY: the entries' pointers are the program's contexts and buffers,
// handed back, never followed here.
unsafe impl Send for Queue {}

/// A CQ. `#[repr(C)]` with libfabric's `fid_cq` first.
#[repr(C)]
pub struct Cq {
    pub fid: fid_cq,
    domain: *const Domain,
    format: fi_cq_format,
    queue: SpinLock<Queue>,
    /// Set while an error entry waits: a read checks it before the lock.
    erred: AtomicBool,
    /// The endpoints bound to it, whose progress a read runs.
    eps: SpinLock<Vec<*const Ep>>,
    /// Bumped by `fi_cq_signal`: a blocking read under way returns.
    signals: AtomicU32,
    /// Endpoints bound to it; it closes only at zero.
    pub refs: AtomicUsize,
}

// SAFETY: the endpoints named are kept alive by their binding (an endpoint
// unbinds itself before it is freed); the rest is atomics and locks.
unsafe impl Sync for Cq {}
unsafe impl Send for Cq {}

static FI_OPS: fi_ops = fi_ops {
    size: std::mem::size_of::<fi_ops>(),
    close: Some(close),
    bind: Some(nosys::bind),
    control: Some(nosys::control),
    ops_open: Some(nosys::ops_open),
    tostr: Some(nosys::tostr),
    ops_set: Some(nosys::ops_set),
};

static OPS: fi_ops_cq = fi_ops_cq {
    size: std::mem::size_of::<fi_ops_cq>(),
    read: Some(read),
    readfrom: Some(readfrom),
    readerr: Some(readerr),
    sread: Some(sread),
    sreadfrom: Some(sreadfrom),
    signal: Some(signal),
    strerror: Some(strerror),
};

/// `fi_cq_open` on a reliable-datagram domain.
pub unsafe extern "C" fn open(
    d: *mut fid_domain,
    attr: *mut fi_cq_attr,
    cq: *mut *mut fid_cq,
    context: *mut c_void,
) -> c_int {
    guard::call("cq_open", || {
        // SAFETY: libfabric passes the domain it was given and an attribute struct.
        let domain = unsafe { Domain::from_fid(d) }?;
        let attr = unsafe { attr.as_ref() }.ok_or(err::EINVAL)?;
        if cq.is_null() {
            return Err(err::EINVAL);
        }
        let format = match attr.format {
            FI_CQ_FORMAT_UNSPEC => FI_CQ_FORMAT_CONTEXT,
            f @ (FI_CQ_FORMAT_CONTEXT | FI_CQ_FORMAT_MSG | FI_CQ_FORMAT_DATA
            | FI_CQ_FORMAT_TAGGED) => f,
            _ => return Err(err::ENOSYS),
        };
        // A blocking read polls (with yields) rather than sleeps: no fd to
        // hand out.
        match attr.wait_obj {
            FI_WAIT_NONE | FI_WAIT_UNSPEC => {}
            _ => return Err(err::ENOSYS),
        }
        let q = Box::new(Cq {
            fid: fid_cq {
                fid: fid {
                    fclass: FI_CLASS_CQ as usize,
                    context,
                    ops: &FI_OPS as *const fi_ops as *mut fi_ops,
                },
                ops: &OPS as *const fi_ops_cq as *mut fi_ops_cq,
            },
            domain,
            format,
            queue: SpinLock::new(Queue::default()),
            erred: AtomicBool::new(false),
            eps: SpinLock::new(Vec::new()),
            signals: AtomicU32::new(0),
            refs: AtomicUsize::new(0),
        });
        domain.refs.fetch_add(1, Ordering::AcqRel);
        // SAFETY: checked non-NULL above.
        unsafe { *cq = Box::into_raw(q) as *mut fid_cq };
        Ok(())
    })
}

impl Cq {
    /// # Safety
    /// `p` is NULL or a fid this provider handed out and has not freed.
    pub unsafe fn from_fid<'a>(p: *mut fid) -> Result<&'a Cq, c_int> {
        // SAFETY: per the contract, with the class checked. Both CQ kinds
        // share the class; this one's ops table tells them apart.
        match unsafe { p.as_ref() } {
            Some(f)
                if f.fclass == FI_CLASS_CQ as usize
                    && std::ptr::eq(
                        unsafe { (*(p as *const fid_cq)).ops },
                        &OPS as *const fi_ops_cq,
                    ) =>
            {
                Ok(unsafe { &*(p as *const Cq) })
            }
            _ => Err(err::EINVAL),
        }
    }

    pub(crate) fn domain(&self) -> &Domain {
        // SAFETY: a CQ keeps its domain open.
        unsafe { &*self.domain }
    }

    /// Puts `ep` among the endpoints a read drives (once).
    pub fn attach(&self, ep: *const Ep) {
        let mut eps = self.eps.lock();
        if !eps.contains(&ep) {
            eps.push(ep);
        }
    }

    /// Takes `ep` out; a read under way in another thread has ended when
    /// this returns (it holds the list while it drives them).
    pub fn detach(&self, ep: *const Ep) {
        self.eps.lock().retain(|e| *e != ep);
    }

    pub fn push(&self, e: Entry) {
        self.queue.lock().entries.push_back(e);
    }

    pub fn push_error(&self, e: fi_cq_err_entry) {
        let mut q = self.queue.lock();
        q.errors.push_back(e);
        self.erred.store(true, Ordering::Release);
    }

    fn progress(&self) {
        let eps = self.eps.lock();
        for &ep in eps.iter() {
            // SAFETY: a bound endpoint detaches itself (under this lock)
            // before it is freed.
            unsafe { &*ep }.progress();
        }
    }

    fn entry_size(&self) -> usize {
        match self.format {
            FI_CQ_FORMAT_MSG => std::mem::size_of::<fi_cq_msg_entry>(),
            FI_CQ_FORMAT_DATA => std::mem::size_of::<fi_cq_data_entry>(),
            FI_CQ_FORMAT_TAGGED => std::mem::size_of::<fi_cq_tagged_entry>(),
            _ => std::mem::size_of::<fi_cq_entry>(),
        }
    }

    /// Up to `count` entries into `buf` (and their sources into `src`):
    /// their number, `-FI_EAGAIN` for none, `-(FI_EAVAIL as c_int)` when an error
    /// waits.
    fn read_entries(
        &self,
        buf: *mut c_void,
        count: usize,
        src: *mut fi_addr_t,
    ) -> Result<isize, c_int> {
        self.progress();
        if self.erred.load(Ordering::Acquire) {
            return Err(-(FI_EAVAIL as c_int));
        }
        let mut q = self.queue.lock();
        let n = count.min(q.entries.len());
        if n == 0 {
            return Err(-FI_EAGAIN);
        }
        let size = self.entry_size();
        for i in 0..n {
            let e = q.entries.pop_front().expect("counted");
            // SAFETY: the caller's buffer holds `count` entries of the
            // CQ's format, each a prefix of the tagged entry.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    &e.e as *const fi_cq_tagged_entry as *const u8,
                    (buf as *mut u8).add(i * size),
                    size,
                );
                if !src.is_null() {
                    src.add(i).write_unaligned(e.src);
                }
            }
        }
        Ok(n as isize)
    }
}

unsafe extern "C" fn read(cq: *mut fid_cq, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: forwarded.
    unsafe { readfrom(cq, buf, count, std::ptr::null_mut()) }
}

unsafe extern "C" fn readfrom(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut fi_addr_t,
) -> isize {
    guard::call_ssize("cq_read", || {
        // SAFETY: libfabric calls through the fid it was given.
        let q = unsafe { Cq::from_fid(cq as *mut fid) }?;
        if buf.is_null() && count > 0 {
            return Err(err::EINVAL);
        }
        q.read_entries(buf, count, src)
    })
}

unsafe extern "C" fn sread(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    cond: *const c_void,
    timeout_ms: c_int,
) -> isize {
    // SAFETY: forwarded.
    unsafe { sreadfrom(cq, buf, count, std::ptr::null_mut(), cond, timeout_ms) }
}

/// How long a blocking read polls before it yields between looks.
const SPIN: Duration = Duration::from_micros(50);

/// `fi_cq_sread`: reads until an entry comes, the timeout passes or
/// `fi_cq_signal` is called. It polls (spinning, then yielding the core
/// between looks): the endpoints' peers write rings, not this process's
/// descriptors, and no doorbell is rung for them.
unsafe extern "C" fn sreadfrom(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut fi_addr_t,
    _cond: *const c_void,
    timeout_ms: c_int,
) -> isize {
    guard::call_ssize("cq_sread", || {
        // SAFETY: as in read.
        let q = unsafe { Cq::from_fid(cq as *mut fid) }?;
        if buf.is_null() && count > 0 {
            return Err(err::EINVAL);
        }
        let start = Instant::now();
        let deadline = (timeout_ms >= 0).then(|| start + Duration::from_millis(timeout_ms as u64));
        let signals = q.signals.load(Ordering::Acquire);
        loop {
            match q.read_entries(buf, count, src) {
                Err(e) if e == -FI_EAGAIN => {}
                r => return r,
            }
            if q.signals.load(Ordering::Acquire) != signals {
                return Err(-FI_EAGAIN);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Err(-FI_EAGAIN);
            }
            if now - start > SPIN {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    })
}

unsafe extern "C" fn signal(cq: *mut fid_cq) -> c_int {
    guard::call("cq_signal", || {
        // SAFETY: libfabric calls through the fid it was given.
        let q = unsafe { Cq::from_fid(cq as *mut fid) }?;
        q.signals.fetch_add(1, Ordering::AcqRel);
        Ok(())
    })
}

unsafe extern "C" fn readerr(cq: *mut fid_cq, buf: *mut fi_cq_err_entry, _flags: u64) -> isize {
    guard::call_ssize("cq_readerr", || {
        // SAFETY: as in read; `buf` is the caller's entry.
        let q = unsafe { Cq::from_fid(cq as *mut fid) }?;
        if buf.is_null() {
            return Err(err::EINVAL);
        }
        let mut queue = q.queue.lock();
        let e = queue.errors.pop_front().ok_or(-FI_EAGAIN)?;
        q.erred.store(!queue.errors.is_empty(), Ordering::Release);
        drop(queue);
        // SAFETY: a CQ keeps its domain, and the domain its fabric, open;
        // `buf` is the caller's entry.
        let api = unsafe { &*q.domain().fabric }.fid.api_version;
        unsafe { crate::cq::put_error(api, e, buf) };
        Ok(1)
    })
}

unsafe extern "C" fn strerror(
    _cq: *mut fid_cq,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    let s: &std::ffi::CStr = match prov_errno {
        0 => c"no provider error",
        _ => c"a reliable-datagram operation failed",
    };
    // SAFETY: `buf` is NULL or holds `len` bytes.
    unsafe { crate::eq::copy_text(s, buf, len) }
}

unsafe extern "C" fn close(p: *mut fid) -> c_int {
    guard::call("cq close", || {
        // SAFETY: libfabric calls close through the fid it was given.
        let q = unsafe { Cq::from_fid(p) }?;
        if q.refs.load(Ordering::Acquire) != 0 {
            return Err(err::EBUSY);
        }
        q.domain().refs.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: the box made in `open`; nothing refers to it any more.
        drop(unsafe { Box::from_raw(q as *const Cq as *mut Cq) });
        Ok(())
    })
}

/// The entry a completed operation leaves.
pub fn entry(
    context: *mut c_void,
    flags: u64,
    len: usize,
    buf: *mut c_void,
    data: u64,
    tag: u64,
    src: fi_addr_t,
) -> Entry {
    Entry {
        e: fi_cq_tagged_entry {
            op_context: context,
            flags,
            len,
            buf,
            data,
            tag,
        },
        src,
    }
}

/// The error entry of an operation that failed with `err` (positive):
/// `e`'s fields, and `olen` bytes cut (for a truncation).
pub fn error(e: fi_cq_tagged_entry, olen: usize, err: c_int) -> fi_cq_err_entry {
    fi_cq_err_entry {
        op_context: e.op_context,
        flags: e.flags,
        len: e.len,
        buf: e.buf,
        data: e.data,
        tag: e.tag,
        olen,
        err,
        prov_errno: err,
        err_data: std::ptr::null_mut(),
        err_data_size: 0,
    }
}
