//! Memory registration: a libfabric memory region is a uvia region of the
//! domain's Nic, under the domain's tag, with the RDMA enable bits the
//! access flags ask for. Its descriptor (`fi_mr_desc`) and its key
//! (`fi_mr_key`) are both the uvia memory handle.
//!
//! On shm a region's pages are made mappable by the peer (`share`) when
//! they are first the source of a send or RDMA write the peer reads by
//! reference (longer than the Nic's `shared_window_from`, 16 KiB), not at
//! registration: many registrations never are (`ofi_rxm`'s receive pool,
//! and its send pool until a message needs more than its eager size, both
//! registered on a connection's first message; the buffers its rendezvous
//! reads, which the target side reads itself), and the move cost each of
//! them a copy, a remap and a fault on every page written after it.

use crate::domain::Domain;
use crate::guard;
use crate::nosys;
use crate::share::{self, Remap};
use crate::sys::*;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use uvia::{MemAttributes, MemHandle, Nic};

/// A memory region. `#[repr(C)]` with libfabric's `fid_mr` first.
#[repr(C)]
pub struct Mr {
    pub fid: fid_mr,
    domain: *const Domain,
    handle: MemHandle,
    /// Its pages' move into a memfd (shm), made on first need and kept
    /// open while the region is registered.
    sharing: Option<Arc<Sharing>>,
}

/// A region on shm whose whole pages are moved into a memfd when first
/// needed: before the first send or RDMA write from it posts that the peer
/// reads by reference (`Domain::share_sources`).
pub struct Sharing {
    buf: usize,
    len: usize,
    handle: MemHandle,
    /// Unset until tried; then the memfd, or `None` where the pages cannot
    /// be moved (they stay as they are, read by cross-memory attach).
    remap: OnceLock<Option<Arc<Remap>>>,
}

/// A domain's regions whose pages are to move on first need, by handle,
/// until a send takes them. A send that finds none waiting reads one word.
#[derive(Default)]
pub struct Unshared {
    map: Mutex<HashMap<u32, Arc<Sharing>>>,
    len: AtomicUsize,
}

impl Unshared {
    fn insert(&self, s: Arc<Sharing>) {
        let mut m = guard::lock(&self.map);
        m.insert(s.handle.0, s);
        self.len.store(m.len(), Ordering::Release);
    }

    /// Takes region `h`'s pending move, if it waits: the caller makes it
    /// (another send from the region meanwhile goes as from unmoved memory).
    pub fn take(&self, h: MemHandle) -> Option<Arc<Sharing>> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut m = guard::lock(&self.map);
        let s = m.remove(&h.0);
        self.len.store(m.len(), Ordering::Release);
        s
    }
}

impl Sharing {
    /// Moves the region's pages into a memfd, once, and tells the Nic.
    pub fn share(&self, nic: &Nic) {
        self.remap.get_or_init(|| {
            // SAFETY: the range was registered and stays allocated while it
            // is (fi_mr_reg's contract); writes to it meanwhile are held
            // (`share`).
            let remap = unsafe { share::share(self.buf as *const u8, self.len) };
            if let Some(m) = &remap {
                // SAFETY: a remap's memfd is sealed (a `Segment`), mapped at
                // its start for its length, and kept open by `self` as long
                // as the region is registered. A region deregistered
                // meanwhile is refused, which is what it should be.
                let _ = unsafe { nic.set_region_backing(self.handle, m.fd(), m.start(), m.len()) };
            }
            remap
        });
    }
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

pub static OPS: fi_ops_mr = fi_ops_mr {
    size: std::mem::size_of::<fi_ops_mr>(),
    reg: Some(reg),
    regv: Some(regv),
    regattr: Some(regattr),
};

/// The access bits fi_mr(3) defines. Only the remote ones change what the
/// region allows (uvia's RDMA enable bits); the local ones and
/// `FI_COLLECTIVE` are accepted as the hints they are. Any other bit is a
/// mistake of the caller's.
const ACCESS: u64 =
    FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_COLLECTIVE;

/// The uvia handle a descriptor from `fi_mr_desc` stands for.
pub fn handle(desc: *mut c_void) -> MemHandle {
    MemHandle(desc as usize as u32)
}

unsafe extern "C" fn reg(
    d: *mut fid,
    buf: *const c_void,
    len: usize,
    access: u64,
    _offset: u64,
    _requested_key: u64,
    flags: u64,
    mr: *mut *mut fid_mr,
    context: *mut c_void,
) -> c_int {
    guard::call("mr_reg", || {
        // SAFETY: libfabric passes the domain's fid.
        let domain = unsafe { Domain::from_fid(d as *mut fid_domain) }?;
        // FI_RMA_EVENT needs counters, which the provider has not; other
        // flags are hints (ofi_rxm passes libfabric's internal "do not
        // cache" bit, 1 << 60), ignored as libfabric's tcp provider does.
        if mr.is_null() || flags & FI_RMA_EVENT != 0 || access & !ACCESS != 0 {
            return Err(err::EINVAL);
        }
        // A region names memory: NULL never is (zero length is refused by
        // the core).
        if buf.is_null() {
            return Err(err::EINVAL);
        }
        // Memory only sent from or read by the peer may be read-only (a
        // constant's buffer); any access that writes it, or none named,
        // wants writable memory.
        let writes = FI_RECV | FI_READ | FI_REMOTE_WRITE;
        let attrs = MemAttributes::new(domain.ptag)
            .rdma_write(access & FI_REMOTE_WRITE != 0)
            .rdma_read(access & FI_REMOTE_READ != 0)
            .read_only(access != 0 && access & writes == 0);
        // SAFETY: the program keeps the memory allocated while registered
        // (fi_mr_reg's contract).
        let h = unsafe { domain.nic.register_mem(buf as *mut u8, len, attrs) }.map_err(
            |e| match e {
                uvia::MemError::TableFull(_) => err::ENOMEM,
                _ => err::EINVAL,
            },
        )?;
        // On shm, a range large enough is made mappable by the peer when it
        // is first needed (see the module's docs).
        let sharing = (domain.share_from.is_some() && len >= share::MIN_SHARE).then(|| {
            let s = Arc::new(Sharing {
                buf: buf as usize,
                len,
                handle: h,
                remap: OnceLock::new(),
            });
            domain.unshared.insert(s.clone());
            s
        });
        let m = Box::new(Mr {
            fid: fid_mr {
                fid: fid {
                    fclass: FI_CLASS_MR as usize,
                    context,
                    ops: &FI_OPS as *const fi_ops as *mut fi_ops,
                },
                mem_desc: h.0 as usize as *mut c_void,
                key: h.0 as u64,
            },
            domain,
            handle: h,
            sharing,
        });
        domain.refs.fetch_add(1, Ordering::AcqRel);
        // SAFETY: checked non-NULL above.
        unsafe { *mr = Box::into_raw(m) as *mut fid_mr };
        Ok(())
    })
}

unsafe extern "C" fn regv(
    d: *mut fid,
    iov: *const iovec,
    count: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    mr: *mut *mut fid_mr,
    context: *mut c_void,
) -> c_int {
    // One segment per region (mr_iov_limit 1).
    // SAFETY: `iov` holds `count` entries.
    match (count, unsafe { iov.as_ref() }) {
        (1, Some(v)) => unsafe {
            reg(
                d,
                v.iov_base,
                v.iov_len,
                access,
                offset,
                requested_key,
                flags,
                mr,
                context,
            )
        },
        _ => err::EINVAL,
    }
}

unsafe extern "C" fn regattr(
    d: *mut fid,
    attr: *const fi_mr_attr,
    flags: u64,
    mr: *mut *mut fid_mr,
) -> c_int {
    // SAFETY: `attr` is NULL or valid.
    match unsafe { attr.as_ref() } {
        Some(a) => unsafe {
            regv(
                d,
                a.mr_iov,
                a.iov_count,
                a.access,
                a.offset,
                a.requested_key,
                flags,
                mr,
                a.context,
            )
        },
        None => err::EINVAL,
    }
}

unsafe extern "C" fn close(p: *mut fid) -> c_int {
    guard::call("mr close", || {
        // SAFETY: libfabric calls close through the fid it was given.
        if unsafe { p.as_ref() }.map(|f| f.fclass) != Some(FI_CLASS_MR as usize) {
            return Err(err::EINVAL);
        }
        // SAFETY: the box made in `reg`; nothing refers to it any more.
        let m = unsafe { Box::from_raw(p as *mut Mr) };
        // SAFETY: a region keeps its domain open.
        let domain = unsafe { &*m.domain };
        if m.sharing.is_some() {
            domain.unshared.take(m.handle);
        }
        let _ = domain.nic.deregister_mem(m.handle);
        domain.refs.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    })
}
