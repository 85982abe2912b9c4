//! VIs, data transfer and completion queues.

use crate::handle::{self, lock, CqH, NicH, ViH};
use crate::nic::{nic, ptag_of};
use crate::notify::{self, AsyncError};
use crate::types::*;
use crate::{addr, put, timeout, unwind, vip};
use std::ffi::{c_ulong, c_void};
use std::ptr::NonNull;
use uvia::{
    status, CqError, Descriptor, MemHandle, PostError, Queue, Reliability, RemoteViAttributes,
    ViAttrError, ViAttributes as CoreVi, ViState, WaitError,
};

/// The VI behind a handle, or the call's error.
///
/// # Safety
/// As for [`crate::nic::nic`].
pub(crate) unsafe fn vi<'a>(h: *mut c_void) -> Result<&'a ViH, VipReturn> {
    // SAFETY: forwarded.
    unsafe { handle::get(h) }.ok_or(ret::INVALID_PARAMETER)
}

/// # Safety
/// As for [`vi`].
unsafe fn cq<'a>(h: *mut c_void) -> Result<&'a CqH, VipReturn> {
    // SAFETY: forwarded.
    unsafe { handle::get(h) }.ok_or(ret::INVALID_PARAMETER)
}

fn level(r: Reliability) -> u16 {
    match r {
        Reliability::Unreliable => service::UNRELIABLE,
        Reliability::ReliableDelivery => service::RELIABLE_DELIVERY,
        Reliability::ReliableReception => service::RELIABLE_RECEPTION,
    }
}

/// The peer's attributes as VIPL reports them (no tag: it is the peer's).
pub(crate) fn remote_attrs(r: &RemoteViAttributes) -> ViAttributes {
    ViAttributes {
        reliability_level: level(r.reliability),
        max_transfer_size: r.max_transfer_size as c_ulong,
        qos: std::ptr::null_mut(),
        ptag: std::ptr::null_mut(),
        enable_rdma_write: r.enable_rdma_write as VipBoolean,
        enable_rdma_read: r.enable_rdma_read as VipBoolean,
    }
}

/// Checks VIPL VI attributes against the NIC and makes the core's.
unsafe fn vi_attrs(n: &NicH, a: *const ViAttributes) -> Result<CoreVi, VipReturn> {
    if a.is_null() {
        return Err(ret::INVALID_PARAMETER);
    }
    // SAFETY: non-NULL attributes are the caller's struct.
    let a = unsafe { *a };
    let na = n.nic.attributes();
    let r = match a.reliability_level {
        service::UNRELIABLE => Reliability::Unreliable,
        service::RELIABLE_DELIVERY => Reliability::ReliableDelivery,
        service::RELIABLE_RECEPTION => Reliability::ReliableReception,
        _ => return Err(ret::INVALID_RELIABILITY_LEVEL),
    };
    if !na.reliability_levels.contains(&r) {
        return Err(ret::INVALID_RELIABILITY_LEVEL);
    }
    if a.max_transfer_size == 0 || a.max_transfer_size > na.max_transfer_size as c_ulong {
        return Err(ret::INVALID_MTU);
    }
    if !a.qos.is_null() {
        return Err(ret::INVALID_QOS);
    }
    // SAFETY: forwarded.
    let p = unsafe { ptag_of(n, a.ptag) }?;
    // VIA offers RDMA read on reliable VIs only.
    if a.enable_rdma_read != 0 && (!na.rdma_read || r == Reliability::Unreliable) {
        return Err(ret::INVALID_RDMAREAD);
    }
    let depth = na.max_queue_depth;
    Ok(CoreVi::new(p)
        .reliability(r)
        .max_transfer_size(a.max_transfer_size as u32)
        .rdma(a.enable_rdma_write != 0, a.enable_rdma_read != 0)
        .queue_depths(depth, depth))
}

fn attr_err(e: ViAttrError) -> VipReturn {
    match e {
        ViAttrError::InvalidPtag(_) => ret::INVALID_PTAG,
        ViAttrError::TransferTooLarge { .. } => ret::INVALID_MTU,
        ViAttrError::QueueDepth { .. } => ret::ERROR_RESOURCE,
        ViAttrError::Unsupported(..) => ret::INVALID_RDMAREAD,
        ViAttrError::ForeignCq => ret::INVALID_PARAMETER,
        ViAttrError::InvalidState(_) => ret::INVALID_STATE,
    }
}

/// How long VipSendWait, VipRecvWait and VipCQWait spin before they sleep, from
/// `VIPL_WAIT_SPIN_US` (the core's default when unset; 0 sleeps at once).
fn wait_spin() -> Option<std::time::Duration> {
    // A second of spinning is far past where sleeping costs less.
    const MAX_US: u64 = 1_000_000;
    let us = std::env::var("VIPL_WAIT_SPIN_US").ok()?;
    match us.trim().parse::<u64>() {
        Ok(n) if n > MAX_US => {
            eprintln!("vipl: VIPL_WAIT_SPIN_US={n} is more than a second; {MAX_US} used");
            Some(std::time::Duration::from_micros(MAX_US))
        }
        Ok(us) => Some(std::time::Duration::from_micros(us)),
        Err(_) => {
            eprintln!(
                "vipl: VIPL_WAIT_SPIN_US={us:?} is not a whole number of microseconds; ignored"
            );
            None
        }
    }
}

/// A CQ handle argument: NULL for none, else a CQ of the same NIC.
///
/// # Safety
/// As for [`vi`].
unsafe fn opt_cq<'a>(n: &NicH, h: *mut c_void) -> Result<Option<&'a CqH>, VipReturn> {
    if h.is_null() {
        return Ok(None);
    }
    // SAFETY: forwarded.
    let c = unsafe { cq(h) }?;
    if !std::ptr::eq(&*c.nic, n) {
        return Err(ret::INVALID_PARAMETER);
    }
    Ok(Some(c))
}

#[no_mangle]
pub unsafe extern "C" fn VipCreateVi(
    h: *mut c_void,
    attrs: *const ViAttributes,
    send_cq: *mut c_void,
    recv_cq: *mut c_void,
    out: *mut *mut c_void,
) -> VipReturn {
    vip("VipCreateVi", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        // SAFETY: forwarded.
        let nh = unsafe { handle::arc(h) }.ok_or(ret::INVALID_PARAMETER)?;
        if out.is_null() {
            return Err(ret::INVALID_PARAMETER);
        }
        // SAFETY: forwarded.
        let a = unsafe { vi_attrs(n, attrs) }?;
        // SAFETY: forwarded.
        let (s, r) = unsafe { (opt_cq(n, send_cq)?, opt_cq(n, recv_cq)?) };
        let v = n
            .nic
            .create_vi(a, s.map(|c| &c.cq), r.map(|c| &c.cq))
            .map_err(attr_err)?;
        if let Some(spin) = wait_spin() {
            v.set_wait_spin(spin);
        }
        let id = v.id();
        // SAFETY: `attrs` is non-NULL (checked by `vi_attrs`).
        let ptag = unsafe { (*attrs).ptag } as usize;
        let Some((vh, _)) = handle::insert(|_| ViH::new(v.clone(), nh, ptag)) else {
            let _ = v.destroy();
            return Err(ret::ERROR_RESOURCE);
        };
        lock(&n.vis).insert(id, vh as usize);
        v.set_tag(vh as usize);
        // SAFETY: checked non-NULL.
        unsafe { out.write(vh) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipDestroyVi(vh: *mut c_void) -> VipReturn {
    vip("VipDestroyVi", || {
        // SAFETY: forwarded.
        let v = unsafe { vi(vh) }?;
        if let Err((_, e)) = v.vi.clone().destroy() {
            return Err(attr_err(e));
        }
        notify::forget(vh);
        // Out of its NIC's table first: the library thread uses the VIs
        // it finds there with the table locked. A completion's VI no
        // longer names the handle either.
        lock(&v.nic.vis).remove(&v.vi.id());
        v.vi.set_tag(0);
        // SAFETY: the handle is not used after this (`v` neither).
        drop(unsafe { handle::remove::<ViH>(vh) });
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipQueryVi(
    vh: *mut c_void,
    state_out: *mut std::ffi::c_int,
    attrs_out: *mut ViAttributes,
    send_empty: *mut VipBoolean,
    recv_empty: *mut VipBoolean,
) -> VipReturn {
    vip("VipQueryVi", || {
        // SAFETY: forwarded.
        let v = unsafe { vi(vh) }?;
        let a = v.vi.attributes();
        let st = match v.vi.state() {
            ViState::Idle => state::IDLE,
            ViState::PendingConnect => state::CONNECT_PENDING,
            ViState::Connected => state::CONNECTED,
            ViState::Error => state::ERROR,
        };
        let attrs = ViAttributes {
            reliability_level: level(a.reliability),
            max_transfer_size: a.max_transfer_size as c_ulong,
            qos: std::ptr::null_mut(),
            ptag: *lock(&v.ptag) as *mut c_void,
            enable_rdma_write: a.enable_rdma_write as VipBoolean,
            enable_rdma_read: a.enable_rdma_read as VipBoolean,
        };
        // SAFETY: each out-pointer is NULL or the caller's.
        unsafe {
            put(state_out, st)?;
            put(attrs_out, attrs)?;
            put(send_empty, v.vi.queue_is_empty(Queue::Send) as VipBoolean)?;
            put(recv_empty, v.vi.queue_is_empty(Queue::Recv) as VipBoolean)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipSetViAttributes(
    vh: *mut c_void,
    attrs: *const ViAttributes,
) -> VipReturn {
    vip("VipSetViAttributes", || {
        // SAFETY: forwarded.
        let v = unsafe { vi(vh) }?;
        // SAFETY: forwarded.
        let a = unsafe { vi_attrs(&v.nic, attrs) }?;
        v.vi.set_attributes(a).map_err(attr_err)?;
        // SAFETY: non-NULL (checked by `vi_attrs`).
        *lock(&v.ptag) = unsafe { (*attrs).ptag } as usize;
        Ok(())
    })
}

// ---- Data transfer ----

/// Posts a program's descriptor on one queue of a VI.
unsafe fn post(vh: *mut c_void, d: *mut Descriptor, mh: u32, q: Queue) -> VipReturn {
    // SAFETY: forwarded.
    let v = match unsafe { vi(vh) } {
        Ok(v) => v,
        Err(r) => return r,
    };
    let Some(p) = NonNull::new(d) else {
        return ret::INVALID_PARAMETER;
    };
    if !(d as usize).is_multiple_of(64) {
        return ret::INVALID_PARAMETER;
    }
    // The descriptor must lie in the region its handle names: its control
    // segment, then the segments it counts (an over-long count is left to
    // the core, which reports it as a format error).
    let Ok(region) = v.nic.nic.query_mem(MemHandle(mh)) else {
        return ret::INVALID_PARAMETER;
    };
    if !region.contains(d as u64, 32) {
        return ret::INVALID_PARAMETER;
    }
    // SAFETY: the control segment lies in the program's registered memory.
    let segs = unsafe { (*d).cs.seg_count }.min(uvia::MAX_SEGMENTS as u16) as u64;
    if !region.contains(d as u64, 32 + 16 * segs) {
        return ret::INVALID_PARAMETER;
    }
    // An RDMA operation the connected peer's VI does not accept is refused
    // here on every provider (the network ones know the peer's attributes
    // in the core; on shm the peer would refuse it later).
    // SAFETY: as above.
    let (control, segs) = unsafe { ((*d).cs.control, (*d).cs.seg_count) };
    let op = control & uvia::control::OP_MASK;
    // Malformed ones (no address segment, reserved bits) are the core's
    // format errors.
    let rdma = op == uvia::control::OP_RDMAWRITE || op == uvia::control::OP_RDMAREAD;
    if q == Queue::Send && rdma && segs >= 1 && control & uvia::control::RESERVED == 0 {
        if let Some(peer) = v.vi.remote_attributes() {
            let (allowed, what) = match op {
                uvia::control::OP_RDMAWRITE => (peer.enable_rdma_write, "RDMA write"),
                _ => (peer.enable_rdma_read, "RDMA read"),
            };
            if !allowed {
                // SAFETY: as in `refuse`.
                return unsafe { refuse(v, vh, d, &PostError::NotEnabled(what)) };
            }
        }
    }
    // SAFETY: the descriptor lies in registered memory the program keeps
    // until it is handed back (the contract of VipPostSend/VipPostRecv).
    let r = unsafe {
        match q {
            Queue::Send => v.vi.post_send_raw(p, false),
            Queue::Recv => v.vi.post_recv_raw(p, false),
        }
    };
    match r {
        Ok(()) => ret::SUCCESS,
        Err(PostError::QueueFull(..)) => ret::ERROR_RESOURCE,
        // Queued: its status is not the program's to be given.
        Err(PostError::AlreadyPosted) => ret::INVALID_PARAMETER,
        Err(PostError::NotConnected(_)) => ret::INVALID_STATE,
        Err(PostError::ViError) => {
            notify::conn_lost(v, vh);
            ret::INVALID_STATE
        }
        // SAFETY: the descriptor was refused, so it is the program's again.
        Err(e) => unsafe { refuse(v, vh, d, &e) },
    }
}

/// Refuses a malformed descriptor: its status gets the reason's bits (how
/// VIPL reports it) and the error handler hears of it.
///
/// # Safety
/// `d` is the program's descriptor, not queued.
unsafe fn refuse(v: &ViH, vh: *mut c_void, d: *mut Descriptor, e: &PostError) -> VipReturn {
    // SAFETY: per the contract.
    let op = unsafe {
        (*d).cs.status = status::DONE | e.status_bits();
        (*d).cs.control & uvia::control::OP_MASK
    };
    notify::report(AsyncError {
        nic: v.nic.clone(),
        vi_handle: addr(vh),
        descriptor: d as usize,
        op_code: op as u64,
        resource: async_error::RESOURCE_DESCRIPTOR,
        code: async_error::POST_DESC,
    });
    ret::DESCRIPTOR_ERROR
}

#[no_mangle]
pub unsafe extern "C" fn VipPostSend(vh: *mut c_void, d: *mut Descriptor, mh: u32) -> VipReturn {
    // SAFETY: forwarded.
    unwind::call("VipPostSend", || unsafe { post(vh, d, mh, Queue::Send) })
}

#[no_mangle]
pub unsafe extern "C" fn VipPostRecv(vh: *mut c_void, d: *mut Descriptor, mh: u32) -> VipReturn {
    // SAFETY: forwarded.
    unwind::call("VipPostRecv", || unsafe { post(vh, d, mh, Queue::Recv) })
}

/// Hands a completed descriptor to the program.
unsafe fn hand_back(
    v: &ViH,
    vh: *mut c_void,
    d: NonNull<Descriptor>,
    out: *mut *mut Descriptor,
) -> VipReturn {
    // SAFETY: `out` was checked non-NULL by the caller.
    unsafe { out.write(d.as_ptr()) };
    // SAFETY: the descriptor is complete and the program's again.
    if unsafe { d.as_ref() }.cs.status & status::ERROR_MASK != 0 {
        notify::conn_lost(v, vh);
    }
    ret::SUCCESS
}

unsafe fn done(vh: *mut c_void, out: *mut *mut Descriptor, q: Queue) -> VipReturn {
    // SAFETY: forwarded.
    let v = match unsafe { vi(vh) } {
        Ok(v) => v,
        Err(r) => return r,
    };
    if out.is_null() {
        return ret::INVALID_PARAMETER;
    }
    let d = match q {
        Queue::Send => v.vi.send_done_raw(),
        Queue::Recv => v.vi.recv_done_raw(),
    };
    match d {
        // SAFETY: forwarded.
        Some(d) => unsafe { hand_back(v, vh, d, out) },
        None => ret::NOT_DONE,
    }
}

unsafe fn wait(vh: *mut c_void, ms: c_ulong, out: *mut *mut Descriptor, q: Queue) -> VipReturn {
    // SAFETY: forwarded.
    let v = match unsafe { vi(vh) } {
        Ok(v) => v,
        Err(r) => return r,
    };
    if out.is_null() {
        return ret::INVALID_PARAMETER;
    }
    match v.vi.wait_raw(q, timeout(ms)) {
        // SAFETY: forwarded.
        Ok(d) => unsafe { hand_back(v, vh, d, out) },
        // (A VI's wait is never interrupted: only a CQ's is, by a call
        // VIPL does not have.)
        Err(WaitError::Timeout | WaitError::Interrupted) => ret::TIMEOUT,
        Err(WaitError::BoundToCq) => ret::INVALID_STATE,
        Err(WaitError::CqOverflow(_)) => ret::ERROR_RESOURCE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn VipSendDone(vh: *mut c_void, out: *mut *mut Descriptor) -> VipReturn {
    // SAFETY: forwarded.
    unwind::call("VipSendDone", || unsafe { done(vh, out, Queue::Send) })
}

#[no_mangle]
pub unsafe extern "C" fn VipRecvDone(vh: *mut c_void, out: *mut *mut Descriptor) -> VipReturn {
    // SAFETY: forwarded.
    unwind::call("VipRecvDone", || unsafe { done(vh, out, Queue::Recv) })
}

#[no_mangle]
pub unsafe extern "C" fn VipSendWait(
    vh: *mut c_void,
    ms: c_ulong,
    out: *mut *mut Descriptor,
) -> VipReturn {
    // SAFETY: forwarded.
    unwind::call("VipSendWait", || unsafe { wait(vh, ms, out, Queue::Send) })
}

#[no_mangle]
pub unsafe extern "C" fn VipRecvWait(
    vh: *mut c_void,
    ms: c_ulong,
    out: *mut *mut Descriptor,
) -> VipReturn {
    // SAFETY: forwarded.
    unwind::call("VipRecvWait", || unsafe { wait(vh, ms, out, Queue::Recv) })
}

/// # Safety
/// As for the exported functions.
unsafe fn vi_notify(
    vh: *mut c_void,
    ctx: *mut c_void,
    f: ViNotifyHandler,
    q: Queue,
) -> Result<(), VipReturn> {
    // SAFETY: forwarded.
    let v = unsafe { vi(vh) }?;
    if f.is_none() {
        return Err(ret::INVALID_PARAMETER);
    }
    notify::vi_request(v, vh, q, addr(ctx), f);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn VipSendNotify(
    vh: *mut c_void,
    ctx: *mut c_void,
    f: ViNotifyHandler,
) -> VipReturn {
    // SAFETY: forwarded.
    vip("VipSendNotify", || unsafe {
        vi_notify(vh, ctx, f, Queue::Send)
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipRecvNotify(
    vh: *mut c_void,
    ctx: *mut c_void,
    f: ViNotifyHandler,
) -> VipReturn {
    // SAFETY: forwarded.
    vip("VipRecvNotify", || unsafe {
        vi_notify(vh, ctx, f, Queue::Recv)
    })
}

// ---- Completion queues ----

#[no_mangle]
pub unsafe extern "C" fn VipCreateCQ(
    h: *mut c_void,
    entries: c_ulong,
    out: *mut *mut c_void,
) -> VipReturn {
    vip("VipCreateCQ", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        // SAFETY: forwarded.
        let nh = unsafe { handle::arc(h) }.ok_or(ret::INVALID_PARAMETER)?;
        if out.is_null() || entries == 0 {
            return Err(ret::INVALID_PARAMETER);
        }
        if entries > n.nic.attributes().max_cq_entries as c_ulong {
            return Err(ret::ERROR_RESOURCE);
        }
        let c = n
            .nic
            .create_cq(entries as usize)
            .map_err(|_| ret::ERROR_RESOURCE)?;
        if let Some(spin) = wait_spin() {
            c.set_wait_spin(spin);
        }
        let Some((ch, _)) = handle::insert(|_| CqH {
            cq: c.clone(),
            nic: nh,
        }) else {
            let _ = c.destroy();
            return Err(ret::ERROR_RESOURCE);
        };
        // SAFETY: checked non-NULL.
        unsafe { out.write(ch) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipDestroyCQ(ch: *mut c_void) -> VipReturn {
    vip("VipDestroyCQ", || {
        // SAFETY: forwarded.
        let c = unsafe { cq(ch) }?;
        if let Err((_, e)) = c.cq.clone().destroy() {
            return Err(match e {
                CqError::InUse(_) => ret::INVALID_STATE,
                _ => ret::ERROR_RESOURCE,
            });
        }
        notify::forget(ch);
        // SAFETY: the handle is not used after this (`c` neither).
        drop(unsafe { handle::remove::<CqH>(ch) });
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipResizeCQ(ch: *mut c_void, entries: c_ulong) -> VipReturn {
    vip("VipResizeCQ", || {
        // SAFETY: forwarded.
        let c = unsafe { cq(ch) }?;
        if entries > c.nic.nic.attributes().max_cq_entries as c_ulong {
            return Err(ret::ERROR_RESOURCE);
        }
        c.cq.resize(entries as usize)
            .map_err(|_| ret::INVALID_PARAMETER)
    })
}

/// Names a CQ notice's VI by its handle, kept with the VI (no table
/// looked up on the way: a lock and a hash a notice).
unsafe fn notice(
    n: uvia::CqCompletion,
    vi_out: *mut *mut c_void,
    recv_out: *mut VipBoolean,
) -> VipReturn {
    let h = n.vi.tag();
    // SAFETY: out-pointers were checked non-NULL by the callers.
    unsafe {
        vi_out.write(h as *mut c_void);
        recv_out.write((n.queue == Queue::Recv) as VipBoolean);
    }
    ret::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn VipCQDone(
    ch: *mut c_void,
    vi_out: *mut *mut c_void,
    recv_out: *mut VipBoolean,
) -> VipReturn {
    unwind::call("VipCQDone", || {
        // SAFETY: forwarded.
        let c = match unsafe { cq(ch) } {
            Ok(c) => c,
            Err(r) => return r,
        };
        if vi_out.is_null() || recv_out.is_null() {
            return ret::INVALID_PARAMETER;
        }
        match c.cq.done() {
            // SAFETY: forwarded.
            Ok(Some(n)) => unsafe { notice(n, vi_out, recv_out) },
            Ok(None) => ret::NOT_DONE,
            Err(_) => ret::ERROR_RESOURCE,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipCQWait(
    ch: *mut c_void,
    ms: c_ulong,
    vi_out: *mut *mut c_void,
    recv_out: *mut VipBoolean,
) -> VipReturn {
    unwind::call("VipCQWait", || {
        // SAFETY: forwarded.
        let c = match unsafe { cq(ch) } {
            Ok(c) => c,
            Err(r) => return r,
        };
        if vi_out.is_null() || recv_out.is_null() {
            return ret::INVALID_PARAMETER;
        }
        match c.cq.wait(timeout(ms)) {
            // SAFETY: forwarded.
            Ok(n) => unsafe { notice(n, vi_out, recv_out) },
            Err(WaitError::Timeout) => ret::TIMEOUT,
            Err(_) => ret::ERROR_RESOURCE,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipCQNotify(
    ch: *mut c_void,
    ctx: *mut c_void,
    f: CqNotifyHandler,
) -> VipReturn {
    vip("VipCQNotify", || {
        // SAFETY: forwarded.
        let c = unsafe { cq(ch) }?;
        if f.is_none() {
            return Err(ret::INVALID_PARAMETER);
        }
        notify::cq_request(c, ch, addr(ctx), f);
        Ok(())
    })
}
