//! The active endpoint: one uvia VI, created when the endpoint is enabled
//! (its queues report to the bound CQs), connected with `fi_connect` or
//! `fi_accept`, and the data calls that post descriptors on it.
//!
//! Connection events go to the bound EQ. `fi_connect` returns at once: the
//! core's connect request blocks until the peer answers, so a short-lived
//! thread makes it and leaves the outcome for the EQ, whose next read
//! queues `FI_CONNECTED` (with the accept data) or the error (with the
//! reject data). So an endpoint may connect to a listener whose EQ the
//! same thread reads, and two endpoints may connect to each other at once.
//! The EQ then reports `FI_SHUTDOWN` when the VI fails.

use crate::cq::{Cq, Op, OpPool};
use crate::defer::Deferred;
use crate::domain::Domain;
use crate::eq::{Eq, Outcome, Tracked};
use crate::guard;
use crate::inject::{Bounce, INJECT_SIZE};
use crate::medium::{self, Medium};
use crate::mr;
use crate::nosys;
use crate::pep::{self, ConnReq};
use crate::prov;
use crate::sys::*;
use std::ffi::{c_int, c_void};
use std::net::SocketAddrV4;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use uvia::{
    control, ConnectError, ControlSegment, Descriptor, MemHandle, PostError, Queue, Reliability,
    Segment, Vi, ViAttributes, ViState, MAX_SEGMENTS,
};

/// How long `fi_connect` waits for the peer's answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// An endpoint. `#[repr(C)]` with libfabric's `fid_ep` first.
#[repr(C)]
pub struct Ep {
    pub fid: fid_ep,
    domain: *const Domain,
    /// The info it was opened with (a copy): sizes, and a request's handle.
    info: *mut fi_info,
    eq: AtomicPtr<Eq>,
    tx_cq: AtomicPtr<Cq>,
    rx_cq: AtomicPtr<Cq>,
    vi: OnceLock<Vi>,
    /// Bounce buffers for injected operations, made with the VI.
    bounce: OnceLock<Bounce>,
    /// Room for the operations in flight on each queue, made with the VI.
    ops: OnceLock<Pools>,
    /// On shm, receives posted at the next read of the receive CQ (see
    /// `defer`); made with the VI.
    deferred: OnceLock<Arc<Deferred>>,
    peer: Mutex<Option<SocketAddrV4>>,
    /// Its connection as the EQ tracks it, once connecting or accepted.
    tracked: Mutex<Option<Arc<Mutex<Tracked>>>>,
}

/// An endpoint's operations in flight: a pool for each of its VI's
/// queues, as deep as the queue. A post that finds its pool full finds its
/// queue full, and gets `-FI_EAGAIN` as a full queue gives: on shm, where
/// receives wait for the next CQ read before they reach the VI (`defer`),
/// the receive pool is what bounds them. (`ofi_rxm` posts a fresh buffer
/// in place of one it keeps, twice for a rendezvous request that came
/// before its receive, and counts on a full queue to refuse the extra:
/// with one pool for both queues, receives took every slot and no send
/// could be posted again.)
struct Pools {
    send: OpPool,
    recv: OpPool,
}

static FI_OPS: fi_ops = fi_ops {
    size: std::mem::size_of::<fi_ops>(),
    close: Some(close),
    bind: Some(bind),
    control: Some(control),
    ops_open: Some(nosys::ops_open),
    tostr: Some(nosys::tostr),
    ops_set: Some(nosys::ops_set),
};

static EP_OPS: fi_ops_ep = fi_ops_ep {
    size: std::mem::size_of::<fi_ops_ep>(),
    cancel: Some(nosys::ep_cancel),
    getopt: Some(pep::getopt),
    setopt: Some(pep::setopt),
    tx_ctx: Some(nosys::ep_tx_ctx),
    rx_ctx: Some(nosys::ep_rx_ctx),
    rx_size_left: Some(nosys::ep_rx_size_left),
    tx_size_left: Some(nosys::ep_tx_size_left),
};

static CM_OPS: fi_ops_cm = fi_ops_cm {
    size: std::mem::size_of::<fi_ops_cm>(),
    setname: Some(nosys::cm_setname),
    getname: Some(getname),
    getpeer: Some(getpeer),
    connect: Some(connect),
    listen: Some(nosys::cm_listen),
    accept: Some(accept),
    reject: Some(nosys::cm_reject),
    shutdown: Some(shutdown),
    join: Some(nosys::cm_join),
};

static MSG_OPS: fi_ops_msg = fi_ops_msg {
    size: std::mem::size_of::<fi_ops_msg>(),
    recv: Some(recv),
    recvv: Some(recvv),
    recvmsg: Some(recvmsg),
    send: Some(send),
    sendv: Some(sendv),
    sendmsg: Some(sendmsg),
    inject: Some(inject),
    senddata: Some(senddata),
    injectdata: Some(injectdata),
};

static RMA_OPS: fi_ops_rma = fi_ops_rma {
    size: std::mem::size_of::<fi_ops_rma>(),
    read: Some(read),
    readv: Some(readv),
    readmsg: Some(readmsg),
    write: Some(write),
    writev: Some(writev),
    writemsg: Some(writemsg),
    inject: Some(inject_write),
    writedata: Some(writedata),
    injectdata: Some(inject_writedata),
};

static TAGGED_OPS: fi_ops_tagged = fi_ops_tagged {
    size: std::mem::size_of::<fi_ops_tagged>(),
    recv: Some(nosys::tagged_recv),
    recvv: Some(nosys::tagged_recvv),
    recvmsg: Some(nosys::tagged_recvmsg),
    send: Some(nosys::tagged_send),
    sendv: Some(nosys::tagged_sendv),
    sendmsg: Some(nosys::tagged_sendmsg),
    inject: Some(nosys::tagged_inject),
    senddata: Some(nosys::tagged_senddata),
    injectdata: Some(nosys::tagged_injectdata),
};

pub(crate) static ATOMIC_OPS: fi_ops_atomic = fi_ops_atomic {
    size: std::mem::size_of::<fi_ops_atomic>(),
    write: Some(nosys::atomic_write),
    writev: Some(nosys::atomic_writev),
    writemsg: Some(nosys::atomic_writemsg),
    inject: Some(nosys::atomic_inject),
    readwrite: Some(nosys::atomic_readwrite),
    readwritev: Some(nosys::atomic_readwritev),
    readwritemsg: Some(nosys::atomic_readwritemsg),
    compwrite: Some(nosys::atomic_compwrite),
    compwritev: Some(nosys::atomic_compwritev),
    compwritemsg: Some(nosys::atomic_compwritemsg),
    writevalid: Some(nosys::atomic_writevalid),
    readwritevalid: Some(nosys::atomic_readwritevalid),
    compwritevalid: Some(nosys::atomic_compwritevalid),
};

pub(crate) static COLLECTIVE_OPS: fi_ops_collective = fi_ops_collective {
    size: std::mem::size_of::<fi_ops_collective>(),
    barrier: Some(nosys::collective_barrier),
    broadcast: Some(nosys::collective_broadcast),
    alltoall: Some(nosys::collective_alltoall),
    allreduce: Some(nosys::collective_allreduce),
    allgather: Some(nosys::collective_allgather),
    reduce_scatter: Some(nosys::collective_reduce_scatter),
    reduce: Some(nosys::collective_reduce),
    scatter: Some(nosys::collective_scatter),
    gather: Some(nosys::collective_gather),
    msg: Some(nosys::collective_msg),
    barrier2: Some(nosys::collective_barrier2),
};

/// `fi_endpoint`.
pub unsafe extern "C" fn open(
    d: *mut fid_domain,
    info: *mut fi_info,
    ep: *mut *mut fid_ep,
    context: *mut c_void,
) -> c_int {
    guard::call("endpoint", || {
        // SAFETY: libfabric passes the domain it was given and an info.
        let domain = unsafe { Domain::from_fid(d) }?;
        let info = unsafe { info.as_ref() }.ok_or(err::EINVAL)?;
        if ep.is_null() {
            return Err(err::EINVAL);
        }
        // SAFETY: attribute pointers are NULL or valid.
        if unsafe { info.ep_attr.as_ref() }
            .is_some_and(|a| a.type_ != FI_EP_MSG && a.type_ != FI_EP_UNSPEC)
        {
            return Err(err::EINVAL);
        }
        // SAFETY: `info` is valid; the copy is ours.
        let copy = unsafe { fi_dupinfo(info) };
        if copy.is_null() {
            return Err(err::ENOMEM);
        }
        let e = Box::new(Ep {
            fid: fid_ep {
                fid: fid {
                    fclass: FI_CLASS_EP as usize,
                    context,
                    ops: &FI_OPS as *const fi_ops as *mut fi_ops,
                },
                ops: &EP_OPS as *const _ as *mut _,
                cm: &CM_OPS as *const _ as *mut _,
                msg: &MSG_OPS as *const _ as *mut _,
                rma: &RMA_OPS as *const _ as *mut _,
                tagged: &TAGGED_OPS as *const _ as *mut _,
                atomic: &ATOMIC_OPS as *const _ as *mut _,
                collective: &COLLECTIVE_OPS as *const _ as *mut _,
            },
            domain,
            info: copy,
            eq: AtomicPtr::new(std::ptr::null_mut()),
            tx_cq: AtomicPtr::new(std::ptr::null_mut()),
            rx_cq: AtomicPtr::new(std::ptr::null_mut()),
            vi: OnceLock::new(),
            bounce: OnceLock::new(),
            ops: OnceLock::new(),
            deferred: OnceLock::new(),
            peer: Mutex::new(None),
            tracked: Mutex::new(None),
        });
        domain.refs.fetch_add(1, Ordering::AcqRel);
        // SAFETY: checked non-NULL above.
        unsafe { *ep = Box::into_raw(e) as *mut fid_ep };
        Ok(())
    })
}

impl Ep {
    /// # Safety
    /// `p` is NULL or a fid this provider handed out and has not freed.
    unsafe fn from_fid<'a>(p: *mut fid) -> Result<&'a Ep, c_int> {
        // SAFETY: per the contract, with the class checked.
        match unsafe { p.as_ref() } {
            // Both endpoint kinds share the class; the ops table tells them apart.
            Some(f) if f.fclass == FI_CLASS_EP as usize && std::ptr::eq(f.ops, &FI_OPS) => {
                Ok(unsafe { &*(p as *const Ep) })
            }
            _ => Err(err::EINVAL),
        }
    }

    fn domain(&self) -> &Domain {
        // SAFETY: an endpoint keeps its domain open.
        unsafe { &*self.domain }
    }

    fn eq(&self) -> Option<&Eq> {
        // SAFETY: a bound EQ is kept open by its count.
        unsafe { self.eq.load(Ordering::Acquire).as_ref() }
    }

    fn vi(&self) -> Result<&Vi, c_int> {
        self.vi.get().ok_or(-(FI_EOPBADSTATE as c_int))
    }

    fn fid_ptr(&self) -> fid_t {
        &self.fid.fid as *const fid as fid_t
    }

    /// Creates the VI (`fi_enable`). A connected endpoint hears of its
    /// connection through an EQ and completes through a CQ: without
    /// either bound it could do nothing, and no bind is taken once enabled.
    fn enable(&self) -> Result<(), c_int> {
        if self.vi.get().is_some() {
            return Ok(());
        }
        if self.eq().is_none() {
            return Err(-(FI_ENOEQ as c_int));
        }
        if self.tx_cq.load(Ordering::Acquire).is_null()
            && self.rx_cq.load(Ordering::Acquire).is_null()
        {
            return Err(-(FI_ENOCQ as c_int));
        }
        let d = self.domain();
        let a = d.nic.attributes();
        // SAFETY: our copy of the info, with its attribute structs.
        let (tx, rx) = unsafe { ((*self.info).tx_attr.as_ref(), (*self.info).rx_attr.as_ref()) };
        let depth = |n: Option<usize>| {
            (n.filter(|n| *n > 0)
                .unwrap_or(256)
                .min(a.max_queue_depth as usize)) as u32
        };
        let attrs = ViAttributes::new(d.ptag)
            .reliability(
                prov::settings()
                    .reliability
                    .unwrap_or(Reliability::ReliableDelivery),
            )
            .rdma(true, true)
            .max_transfer_size(a.max_transfer_size)
            .queue_depths(depth(tx.map(|t| t.size)), depth(rx.map(|r| r.size)))
            // libfabric's resource management: a message that finds no
            // receive posted waits for one instead of breaking the connection.
            .rnr_retry(true);
        // SAFETY: bound CQs are kept open by their counts.
        let (tx_cq, rx_cq) = unsafe {
            (
                self.tx_cq.load(Ordering::Acquire).as_ref(),
                self.rx_cq.load(Ordering::Acquire).as_ref(),
            )
        };
        let vi = d
            .nic
            .create_vi(attrs, tx_cq.map(|c| &c.cq), rx_cq.map(|c| &c.cq))
            .map_err(|_| err::EINVAL)?;
        if let Some(spin) = prov::settings().spin {
            vi.set_wait_spin(spin);
        }
        let bounce =
            Bounce::new(&d.nic, d.ptag, vi.attributes().send_queue_depth).ok_or(err::ENOMEM)?;
        let _ = self.bounce.set(bounce);
        let va = vi.attributes();
        let _ = self.ops.set(Pools {
            send: OpPool::new(va.send_queue_depth),
            recv: OpPool::new(va.recv_queue_depth),
        });
        d.driver.add(&vi);
        // On shm the receiver places messages only in its own reads, so a
        // receive may wait for the next one (see `defer`); without a CQ for
        // receives there is no such read, and receives are posted at once.
        let deferred = (d.medium == Medium::Shm && rx_cq.is_some()).then(|| {
            let df = Arc::new(Deferred::default());
            let _ = self.deferred.set(df.clone());
            df
        });
        // Each bound CQ reads the queues that report to it (a CQ bound for
        // both directions, both), and posts the deferred receives first.
        match (tx_cq, rx_cq) {
            (Some(t), Some(r)) if std::ptr::eq(t, r) => {
                t.attach(&vi, &[Queue::Recv, Queue::Send], deferred)
            }
            (t, r) => {
                if let Some(r) = r {
                    r.attach(&vi, &[Queue::Recv], deferred);
                }
                if let Some(t) = t {
                    t.attach(&vi, &[Queue::Send], None);
                }
            }
        }
        let _ = self.vi.set(vi);
        Ok(())
    }

    /// Hands the connection's events to the bound EQ from now on; with
    /// `connected`, FI_CONNECTED is queued now (an accept).
    fn track(&self, eq: &Eq, vi: &Vi, connected: bool) -> Arc<Mutex<Tracked>> {
        let t = Arc::new(Mutex::new(Tracked::new(
            self.fid_ptr(),
            self.fid.fid.context,
            vi.clone(),
            connected,
            self.deferred.get().cloned(),
        )));
        *crate::guard::lock(&self.tracked) = Some(t.clone());
        eq.track(t.clone());
        t
    }

    /// Places `op` in the pool of `queue`: its descriptor for the queue.
    fn place(&self, op: Op, queue: Queue) -> Result<std::ptr::NonNull<Descriptor>, c_int> {
        let ops = self.ops.get().ok_or(-(FI_EOPBADSTATE as c_int))?;
        let pool = match queue {
            Queue::Send => &ops.send,
            Queue::Recv => &ops.recv,
        };
        pool.post(op).map_err(|op| {
            // Never posted: its bounce slot, if any, goes back.
            if let Some(b) = self.bounce.get().filter(|_| !op.bounce.is_null()) {
                b.release(op.slot);
            }
            -FI_EAGAIN
        })
    }

    /// Posts `op` on the send queue.
    fn post_send(&self, op: Op) -> Result<isize, c_int> {
        let vi = self.vi()?;
        let d = self.place(op, Queue::Send)?;
        // SAFETY: the Op's slot stays taken until the CQ read takes it back.
        match unsafe { vi.post_send_raw(d, false) } {
            Ok(()) => Ok(0),
            Err(e) => {
                // SAFETY: refused, so never queued: still ours.
                let _ = unsafe { Op::take(d) };
                Err(post_error(&e))
            }
        }
    }

    /// Posts a send or RDMA write of the bytes of `iov` from a bounce
    /// buffer (`desc` with its local segment for the copy's) as `op`;
    /// `silent`: no completion entry (`fi_inject*`).
    ///
    /// # Safety
    /// `iov` holds `count` entries, each valid for reads of its length.
    unsafe fn post_injected(
        &self,
        iov: *const iovec,
        count: usize,
        make: impl FnOnce(Segment) -> Descriptor,
        context: *mut c_void,
        flags: u64,
        silent: bool,
    ) -> Result<isize, c_int> {
        if count > MAX_SEGMENTS || (count > 0 && iov.is_null()) {
            return Err(err::EINVAL);
        }
        let mut parts: [&[u8]; MAX_SEGMENTS] = [&[]; MAX_SEGMENTS];
        let mut total: usize = 0;
        for (i, part) in parts.iter_mut().enumerate().take(count) {
            // SAFETY: per the contract.
            let v = unsafe { &*iov.add(i) };
            // Summed with a check: lengths that wrap past the largest size
            // must not pass for a small message.
            total = match total.checked_add(v.iov_len) {
                Some(t) if t <= INJECT_SIZE => t,
                _ => return Err(-FI_EMSGSIZE),
            };
            if v.iov_len > 0 {
                if v.iov_base.is_null() {
                    return Err(err::EINVAL);
                }
                // SAFETY: the caller's bytes, readable for their length.
                *part = unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) };
            }
        }
        let bounce = self.bounce.get().ok_or(-(FI_EOPBADSTATE as c_int))?;
        let (slot, seg) = bounce.fill(&parts[..count]).ok_or(-FI_EAGAIN)?;
        let mut op = Op::new(make(seg), context, flags, total);
        op.bounce = bounce;
        op.slot = slot;
        op.silent = silent;
        self.post_send(op)
    }

    fn post_recv(
        &self,
        desc: Descriptor,
        context: *mut c_void,
        buf: *mut c_void,
    ) -> Result<isize, c_int> {
        let vi = self.vi()?;
        let mut op = Op::new(desc, context, FI_RECV | FI_MSG, 0);
        op.buf = buf;
        let d = self.place(op, Queue::Recv)?;
        self.submit_recv(vi, d)
    }

    /// Gives a receive's operation to its VI, or on shm to the next read
    /// of its CQ ([`Deferred`]); an endpoint that failed refuses it now.
    fn submit_recv(&self, vi: &Vi, d: NonNull<Descriptor>) -> Result<isize, c_int> {
        if let Some(df) = self.deferred.get() {
            if vi.state() == ViState::Error {
                // SAFETY: never queued: still ours.
                let _ = unsafe { Op::take(d) };
                return Err(-FI_EIO);
            }
            // SAFETY: a bound CQ is kept open by its count.
            let cq = unsafe { self.rx_cq.load(Ordering::Acquire).as_ref() };
            // A thread asleep in the CQ's blocking read would not post it
            // before its wake-up: post it now (with any before it). A
            // refusal is reported by that CQ's next read.
            if df.push(d, cq.map(|c| &c.sleepers)) {
                if let Some(cq) = cq {
                    cq.post_deferred();
                }
            }
            return Ok(0);
        }
        // SAFETY: as in post_send.
        match unsafe { vi.post_recv_raw(d, false) } {
            Ok(()) => Ok(0),
            Err(e) => {
                // SAFETY: refused, so never queued: still ours.
                let _ = unsafe { Op::take(d) };
                Err(post_error(&e))
            }
        }
    }
}

impl Ep {
    /// Posts a receive into one buffer (`fi_recv`), its operation written
    /// in place in the pool (see [`OpPool::post_with`]).
    fn post_recv_one(
        &self,
        buf: *mut c_void,
        len: u32,
        handle: MemHandle,
        context: *mut c_void,
    ) -> Result<isize, c_int> {
        let vi = self.vi()?;
        let ops = self.ops.get().ok_or(-(FI_EOPBADSTATE as c_int))?;
        let d = ops
            .recv
            .post_with(|op| {
                op.desc.cs = ControlSegment {
                    seg_count: (len > 0) as u16,
                    control: control::OP_SENDRECV,
                    ..ControlSegment::default()
                };
                op.desc.ds[0] = Segment::local(buf as *const u8, handle, len);
                op.context = context;
                op.flags = FI_RECV | FI_MSG;
                op.len = 0;
                op.buf = buf;
                op.bounce = std::ptr::null();
                op.slot = 0;
                op.silent = false;
            })
            .ok_or(-FI_EAGAIN)?;
        self.submit_recv(vi, d)
    }
}

fn post_error(e: &PostError) -> c_int {
    match e {
        PostError::QueueFull(..) => -FI_EAGAIN,
        PostError::NotConnected(_) => -(FI_EOPBADSTATE as c_int),
        PostError::ViError => -FI_EIO,
        PostError::TooLong { .. } => -FI_EMSGSIZE,
        _ => err::EINVAL,
    }
}

/// Data segments for an iovec list and its descriptors.
///
/// # Safety
/// `iov` holds `count` entries and `desc` is NULL or holds `count`.
unsafe fn segments(
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
) -> Result<([Segment; MAX_SEGMENTS], usize, usize), c_int> {
    if count > MAX_SEGMENTS || (count > 0 && iov.is_null()) {
        return Err(err::EINVAL);
    }
    let mut segs = [Segment::default(); MAX_SEGMENTS];
    let mut n = 0;
    let mut total = 0;
    for i in 0..count {
        // SAFETY: per the contract.
        let v = unsafe { &*iov.add(i) };
        // An empty entry names no memory (its buffer and descriptor may be
        // NULL, as for a zero-byte message): it takes no segment.
        if v.iov_len == 0 {
            continue;
        }
        let d = if desc.is_null() {
            std::ptr::null_mut()
        } else {
            unsafe { *desc.add(i) }
        };
        let len = u32::try_from(v.iov_len).map_err(|_| -FI_EMSGSIZE)?;
        segs[n] = Segment::local(v.iov_base as *const u8, mr::handle(d), len);
        n += 1;
        total += v.iov_len;
    }
    Ok((segs, n, total))
}

fn one(buf: *const c_void, len: usize, desc: *mut c_void) -> iovec {
    let _ = desc;
    iovec {
        iov_base: buf as *mut c_void,
        iov_len: len,
    }
}

// ---- fi_ops

unsafe extern "C" fn bind(p: *mut fid, bfid: *mut fid, flags: u64) -> c_int {
    guard::call("ep bind", || {
        // SAFETY: libfabric passes fids it was given.
        let ep = unsafe { Ep::from_fid(p) }?;
        if ep.vi.get().is_some() {
            return Err(-(FI_EOPBADSTATE as c_int));
        }
        let class = unsafe { bfid.as_ref() }.ok_or(err::EINVAL)?.fclass as u32;
        match class {
            // One EQ, and one CQ a direction (fi_endpoint(3)): a second
            // bind is refused, not put in the first's place (whose count
            // would then never come down, nor its domain's).
            FI_CLASS_EQ => {
                let eq = unsafe { Eq::from_fid(bfid) }?;
                let new = eq as *const Eq as *mut Eq;
                ep.eq
                    .compare_exchange(
                        std::ptr::null_mut(),
                        new,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .map_err(|_| err::EINVAL)?;
                eq.refs.fetch_add(1, Ordering::AcqRel);
            }
            FI_CLASS_CQ => {
                let cq = unsafe { Cq::from_fid(bfid) }?;
                if flags & (FI_TRANSMIT | FI_RECV) == 0 || flags & FI_SELECTIVE_COMPLETION != 0 {
                    return Err(err::EINVAL);
                }
                if !std::ptr::eq(cq.domain(), ep.domain()) {
                    return Err(err::EINVAL);
                }
                let slots = [(FI_TRANSMIT, &ep.tx_cq), (FI_RECV, &ep.rx_cq)];
                let wanted = || slots.iter().filter(move |(bit, _)| flags & bit != 0);
                if wanted().any(|(_, slot)| !slot.load(Ordering::Acquire).is_null()) {
                    return Err(err::EINVAL);
                }
                for (_, slot) in wanted() {
                    cq.refs.fetch_add(1, Ordering::AcqRel);
                    slot.store(cq as *const Cq as *mut Cq, Ordering::Release);
                }
            }
            _ => return Err(err::ENOSYS),
        }
        Ok(())
    })
}

unsafe extern "C" fn control(p: *mut fid, command: c_int, _arg: *mut c_void) -> c_int {
    guard::call("ep control", || {
        // SAFETY: libfabric passes the fid it was given.
        let ep = unsafe { Ep::from_fid(p) }?;
        match command as u32 {
            FI_ENABLE => ep.enable(),
            _ => Err(err::ENOSYS),
        }
    })
}

unsafe extern "C" fn close(p: *mut fid) -> c_int {
    guard::call("ep close", || {
        // SAFETY: libfabric calls close through the fid it was given.
        let ep = unsafe { Ep::from_fid(p) }?;
        // SAFETY: the box made in `open`; nothing refers to it any more.
        let mut ep = unsafe { Box::from_raw(ep as *const Ep as *mut Ep) };
        if let Some(eq) = ep.eq() {
            eq.untrack(ep.fid_ptr());
        }
        if let Some(vi) = ep.vi.take() {
            ep.domain().driver.remove(&vi);
            // First out of the CQs: a read under way in another thread
            // ends before `detach` returns, and none begins after it.
            // SAFETY: bound CQs are kept open by their counts.
            for cq in [
                ep.tx_cq.load(Ordering::Acquire),
                ep.rx_cq.load(Ordering::Acquire),
            ] {
                if let Some(cq) = unsafe { cq.as_ref() } {
                    cq.detach(&vi);
                }
            }
            // Receives never posted: free their operations.
            if let Some(df) = ep.deferred.get() {
                for d in df.take_all() {
                    // SAFETY: every descriptor queued there is an Op.
                    let _ = unsafe { Op::take(d) };
                }
            }
            vi.disconnect();
            // Descriptors still queued complete flushed: free their Ops.
            while let Some(d) = vi.send_done_raw().or_else(|| vi.recv_done_raw()) {
                // SAFETY: every descriptor posted here is an Op.
                let _ = unsafe { Op::take(d) };
            }
            let _ = vi.destroy();
        }
        // SAFETY: bound objects and the domain are kept open by the counts.
        unsafe {
            if let Some(eq) = ep.eq.load(Ordering::Acquire).as_ref() {
                eq.refs.fetch_sub(1, Ordering::AcqRel);
            }
            for cq in [
                ep.tx_cq.load(Ordering::Acquire),
                ep.rx_cq.load(Ordering::Acquire),
            ] {
                if let Some(cq) = cq.as_ref() {
                    cq.refs.fetch_sub(1, Ordering::AcqRel);
                }
            }
            fi_freeinfo(ep.info);
        }
        ep.domain().refs.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    })
}

// ---- fi_ops_cm

unsafe extern "C" fn getname(p: fid_t, addr: *mut c_void, len: *mut usize) -> c_int {
    guard::call("ep getname", || {
        // SAFETY: libfabric passes the fid it was given; the info is ours.
        let ep = unsafe { Ep::from_fid(p) }?;
        let src = unsafe { medium::read_sockaddr_in((*ep.info).src_addr, (*ep.info).src_addrlen) }
            .unwrap_or(SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 0));
        // SAFETY: the caller's buffer.
        unsafe { pep::put_name(src, addr, len) }
    })
}

unsafe extern "C" fn getpeer(p: *mut fid_ep, addr: *mut c_void, len: *mut usize) -> c_int {
    guard::call("getpeer", || {
        // SAFETY: libfabric passes the fid it was given.
        let ep = unsafe { Ep::from_fid(p as *mut fid) }?;
        let peer = (*crate::guard::lock(&ep.peer)).ok_or(-(FI_ENOTCONN))?;
        // SAFETY: the caller's buffer.
        unsafe { pep::put_name(peer, addr, len) }
    })
}

unsafe extern "C" fn connect(
    p: *mut fid_ep,
    addr: *const c_void,
    param: *const c_void,
    len: usize,
) -> c_int {
    guard::call("connect", || {
        // SAFETY: libfabric passes the fid it was given; `addr` is a
        // sockaddr (read only as far as a sockaddr_in), `param` `len` bytes.
        let ep = unsafe { Ep::from_fid(p as *mut fid) }?;
        let to =
            unsafe { medium::read_sockaddr_in(addr, std::mem::size_of::<libc::sockaddr_in>()) }
                .ok_or(err::EINVAL)?;
        let data = unsafe { pep::private(param, len) }?;
        if data.len() > uvia::MAX_PRIVATE_DATA {
            return Err(err::EINVAL);
        }
        let eq = ep.eq().ok_or(-(FI_ENOEQ as c_int))?;
        let vi = ep.vi()?;
        if vi.state() != ViState::Idle || crate::guard::lock(&ep.tracked).is_some() {
            return Err(-(FI_EOPBADSTATE as c_int));
        }
        let d = ep.domain();
        let remote = d.medium.remote(&d.nic, to);
        *crate::guard::lock(&ep.peer) = Some(to);
        let t = ep.track(eq, vi, false);
        let (vi, data) = (vi.clone(), data.to_vec());
        let spawned = std::thread::Builder::new()
            .name("uvia-fi-connect".into())
            .spawn(move || {
                let outcome = match vi.connect_request_listening(&remote, CONNECT_TIMEOUT, &data) {
                    Ok(_) => Outcome::Connected(vi.peer_private_data()),
                    Err(e) => Outcome::Failed(connect_error(&e), vi.peer_private_data()),
                };
                let t = crate::guard::lock(&t);
                *crate::guard::lock(&t.outcome) = Some(outcome);
            });
        if spawned.is_err() {
            eq.untrack(ep.fid_ptr());
            *crate::guard::lock(&ep.tracked) = None;
            return Err(err::ENOMEM);
        }
        Ok(())
    })
}

/// A failed connect request as a libfabric error code.
fn connect_error(e: &ConnectError) -> c_int {
    match e {
        ConnectError::Rejected | ConnectError::WrongJob | ConnectError::NoListener { .. } => {
            FI_ECONNREFUSED
        }
        ConnectError::Timeout(_) | ConnectError::NoAnswer { .. } => FI_ETIMEDOUT,
        ConnectError::InvalidState(_) => FI_EOPBADSTATE as c_int,
        _ => FI_EIO,
    }
}

unsafe extern "C" fn accept(p: *mut fid_ep, param: *const c_void, len: usize) -> c_int {
    guard::call("accept", || {
        // SAFETY: libfabric passes the fid it was given; the info is ours
        // and its handle the request it was opened for; `param` `len` bytes.
        let ep = unsafe { Ep::from_fid(p as *mut fid) }?;
        let data = unsafe { pep::private(param, len) }?;
        if data.len() > uvia::MAX_PRIVATE_DATA {
            return Err(err::EINVAL);
        }
        let vi = ep.vi()?;
        let handle = unsafe { (*ep.info).handle };
        let req = unsafe { ConnReq::take(handle) }?;
        // The request is answered (or dropped) here: forget the handle.
        unsafe { (*ep.info).handle = std::ptr::null_mut() };
        // The peer's address as libfabric names it (on xdp the request
        // names a MAC address, found in the neighbour table).
        let peer = req.peer();
        let mut request = crate::guard::lock(&req.request).take().ok_or(err::EINVAL)?;
        match request.accept_with(vi, data) {
            Ok(()) => {
                *crate::guard::lock(&ep.peer) = peer;
                if let Some(eq) = ep.eq() {
                    eq.push(crate::eq::Event::Cm {
                        event: FI_CONNECTED,
                        fid: ep.fid_ptr(),
                        info: std::ptr::null_mut(),
                        data: vi.peer_private_data(),
                    });
                    ep.track(eq, vi, true);
                }
                Ok(())
            }
            Err(_) => Err(-(FI_ECONNABORTED)),
        }
    })
}

unsafe extern "C" fn shutdown(p: *mut fid_ep, _flags: u64) -> c_int {
    guard::call("shutdown", || {
        // SAFETY: libfabric passes the fid it was given.
        let ep = unsafe { Ep::from_fid(p as *mut fid) }?;
        ep.vi()?.disconnect();
        Ok(())
    })
}

// ---- fi_ops_msg

unsafe extern "C" fn send(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest: fi_addr_t,
    context: *mut c_void,
) -> isize {
    let v = one(buf, len, desc);
    let mut d = desc;
    // SAFETY: one entry each, on the stack.
    unsafe { sendv(ep, &v, &mut d, 1, dest, context) }
}

unsafe extern "C" fn sendv(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    _dest: fi_addr_t,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("send", || {
        // SAFETY: libfabric passes the fid it was given; iov/desc `count`.
        let ep = unsafe { Ep::from_fid(ep as *mut fid) }?;
        let (segs, n, total) = unsafe { segments(iov, desc, count) }?;
        ep.domain().share_sources(&segs[..n]);
        ep.post_send(Op::new(
            Descriptor::send(&segs[..n]),
            context,
            FI_SEND | FI_MSG,
            total,
        ))
    })
}

unsafe extern "C" fn senddata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    data: u64,
    _dest: fi_addr_t,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("senddata", || {
        // SAFETY: as in sendv, one entry on the stack.
        let ep = unsafe { Ep::from_fid(ep as *mut fid) }?;
        let v = one(buf, len, desc);
        let mut d = desc;
        let (segs, n, total) = unsafe { segments(&v, &mut d, 1) }?;
        ep.domain().share_sources(&segs[..n]);
        let desc = Descriptor::send(&segs[..n]).with_immediate(data as u32);
        ep.post_send(Op::new(desc, context, FI_SEND | FI_MSG, total))
    })
}

unsafe extern "C" fn sendmsg(ep: *mut fid_ep, msg: *const fi_msg, flags: u64) -> isize {
    guard::call_ssize("sendmsg", || {
        // SAFETY: as in sendv; `msg` is the caller's.
        let ep = unsafe { Ep::from_fid(ep as *mut fid) }?;
        let m = unsafe { msg.as_ref() }.ok_or(err::EINVAL)?;
        let imm = (flags & FI_REMOTE_CQ_DATA != 0).then_some(m.data as u32);
        let with_data = |d: Descriptor| match imm {
            Some(v) => d.with_immediate(v),
            None => d,
        };
        if flags & FI_INJECT != 0 {
            // SAFETY: the caller's iovec list of `iov_count` entries.
            return unsafe {
                ep.post_injected(
                    m.msg_iov,
                    m.iov_count,
                    |s| with_data(Descriptor::send(&[s])),
                    m.context,
                    FI_SEND | FI_MSG,
                    false,
                )
            };
        }
        let (segs, n, total) = unsafe { segments(m.msg_iov, m.desc, m.iov_count) }?;
        ep.domain().share_sources(&segs[..n]);
        let desc = with_data(Descriptor::send(&segs[..n]));
        ep.post_send(Op::new(desc, m.context, FI_SEND | FI_MSG, total))
    })
}

unsafe extern "C" fn recv(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src: fi_addr_t,
    context: *mut c_void,
) -> isize {
    let _ = src;
    guard::call_ssize("recv", || {
        // SAFETY: as in sendv.
        let ep = unsafe { Ep::from_fid(ep as *mut fid) }?;
        let len = u32::try_from(len).map_err(|_| -FI_EMSGSIZE)?;
        if len > 0 && buf.is_null() {
            return Err(err::EINVAL);
        }
        let handle = mr::handle(desc);
        ep.domain().share_destination(buf as *const u8, handle, len);
        ep.post_recv_one(buf, len, handle, context)
    })
}

unsafe extern "C" fn recvv(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    _src: fi_addr_t,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("recv", || {
        // SAFETY: as in sendv.
        let ep = unsafe { Ep::from_fid(ep as *mut fid) }?;
        let (segs, n, _) = unsafe { segments(iov, desc, count) }?;
        ep.domain().share_destinations(&segs[..n]);
        let buf = if n > 0 {
            segs[0].addr as *mut c_void
        } else {
            std::ptr::null_mut()
        };
        ep.post_recv(Descriptor::recv(&segs[..n]), context, buf)
    })
}

unsafe extern "C" fn recvmsg(ep: *mut fid_ep, msg: *const fi_msg, flags: u64) -> isize {
    // A buffer for many messages is not offered (no FI_MULTI_RECV in the
    // caps): taken as one receive, a program would wait for the flag that
    // says it is used up.
    if flags & FI_MULTI_RECV != 0 {
        return -(FI_EBADFLAGS as isize);
    }
    // SAFETY: `msg` is the caller's.
    match unsafe { msg.as_ref() } {
        Some(m) => unsafe { recvv(ep, m.msg_iov, m.desc, m.iov_count, m.addr, m.context) },
        None => err::EINVAL as isize,
    }
}

// ---- fi_ops_rma

/// Posts an RDMA write (`read == false`) or read of the local iovec list
/// against the peer's `addr` under `key`.
///
/// # Safety
/// As for [`segments`].
#[allow(clippy::too_many_arguments)]
unsafe fn rma(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    addr: u64,
    key: u64,
    data: Option<u64>,
    context: *mut c_void,
    read: bool,
) -> Result<isize, c_int> {
    // SAFETY: forwarded.
    let ep = unsafe { Ep::from_fid(ep as *mut fid) }?;
    let (segs, n, total) = unsafe { segments(iov, desc, count) }?;
    let remote = Segment::remote(
        addr,
        MemHandle(u32::try_from(key).map_err(|_| err::EINVAL)?),
    );
    let (mut desc, flags) = if read {
        (Descriptor::rdma_read(remote, &segs[..n]), FI_RMA | FI_READ)
    } else {
        ep.domain().share_sources(&segs[..n]);
        (
            Descriptor::rdma_write(remote, &segs[..n]),
            FI_RMA | FI_WRITE,
        )
    };
    if let Some(d) = data {
        desc = desc.with_immediate(d as u32);
    }
    ep.post_send(Op::new(desc, context, flags, total))
}

/// `fi_inject`/`fi_injectdata` (`data`): a send from a bounce buffer that
/// completes without an entry.
fn inject_send(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    data: Option<u64>,
) -> Result<isize, c_int> {
    // SAFETY: libfabric passes the fid it was given.
    let ep = unsafe { Ep::from_fid(ep as *mut fid) }?;
    if len > INJECT_SIZE {
        return Err(-FI_EMSGSIZE);
    }
    if len > 0 && buf.is_null() {
        return Err(err::EINVAL);
    }
    // The transport copies the bytes into the message during the call
    // where it can (shm: into the ring): no bounce buffer, no descriptor,
    // nothing for a CQ read to take back.
    let bytes: &[u8] = if len == 0 {
        &[]
    } else {
        // SAFETY: the caller's `len` bytes, readable during the call.
        unsafe { std::slice::from_raw_parts(buf as *const u8, len) }
    };
    if ep
        .vi()?
        .send_copy(&[bytes], data.map(|v| v as u32))
        .map_err(|e| post_error(&e))?
    {
        return Ok(0);
    }
    let v = one(buf, len, std::ptr::null_mut());
    let make = |s: Segment| {
        let d = Descriptor::send(&[s]);
        match data {
            Some(v) => d.with_immediate(v as u32),
            None => d,
        }
    };
    // SAFETY: one entry on the stack naming the caller's `len` bytes.
    unsafe { ep.post_injected(&v, 1, make, std::ptr::null_mut(), FI_SEND | FI_MSG, true) }
}

/// `fi_inject_write`/`fi_inject_writedata` (`data`): an RDMA write from a
/// bounce buffer that completes without an entry.
fn inject_rma(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    addr: u64,
    key: u64,
    data: Option<u64>,
) -> Result<isize, c_int> {
    // SAFETY: libfabric passes the fid it was given.
    let ep = unsafe { Ep::from_fid(ep as *mut fid) }?;
    let remote = Segment::remote(
        addr,
        MemHandle(u32::try_from(key).map_err(|_| err::EINVAL)?),
    );
    let v = one(buf, len, std::ptr::null_mut());
    let make = |s: Segment| {
        let d = Descriptor::rdma_write(remote, &[s]);
        match data {
            Some(v) => d.with_immediate(v as u32),
            None => d,
        }
    };
    // SAFETY: as in inject_send.
    unsafe { ep.post_injected(&v, 1, make, std::ptr::null_mut(), FI_RMA | FI_WRITE, true) }
}

unsafe extern "C" fn inject(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    _dest: fi_addr_t,
) -> isize {
    guard::call_ssize("inject", || inject_send(ep, buf, len, None))
}

unsafe extern "C" fn injectdata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    _dest: fi_addr_t,
) -> isize {
    guard::call_ssize("injectdata", || inject_send(ep, buf, len, Some(data)))
}

unsafe extern "C" fn inject_write(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    _dest: fi_addr_t,
    addr: u64,
    key: u64,
) -> isize {
    guard::call_ssize("inject_write", || inject_rma(ep, buf, len, addr, key, None))
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn inject_writedata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    _dest: fi_addr_t,
    addr: u64,
    key: u64,
) -> isize {
    guard::call_ssize("inject_writedata", || {
        inject_rma(ep, buf, len, addr, key, Some(data))
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn write(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    _dest: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("write", || {
        let v = one(buf, len, desc);
        let mut d = desc;
        // SAFETY: one entry each, on the stack.
        unsafe { rma(ep, &v, &mut d, 1, addr, key, None, context, false) }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn writev(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    _dest: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the caller's lists.
    guard::call_ssize("writev", || unsafe {
        rma(ep, iov, desc, count, addr, key, None, context, false)
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn writedata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    data: u64,
    _dest: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("writedata", || {
        let v = one(buf, len, desc);
        let mut d = desc;
        // SAFETY: one entry each, on the stack.
        unsafe { rma(ep, &v, &mut d, 1, addr, key, Some(data), context, false) }
    })
}

/// The one remote range of an RMA message, refused (`-FI_EINVAL`) when
/// the local entries hold more bytes than it: the target named where the
/// data may go, and a longer transfer would run past it (the region's own
/// bounds would still stop it, but not at the range's end).
///
/// # Safety
/// `m`'s lists hold their counts of entries (a count over the limit or a
/// NULL list is left to the post, which refuses it).
unsafe fn remote_range(m: &fi_msg_rma) -> Result<&fi_rma_iov, c_int> {
    // SAFETY: per the contract.
    let r = unsafe { m.rma_iov.as_ref() }
        .filter(|_| m.rma_iov_count == 1)
        .ok_or(err::EINVAL)?;
    if m.iov_count <= MAX_SEGMENTS && !m.msg_iov.is_null() {
        let mut total: usize = 0;
        for i in 0..m.iov_count {
            // SAFETY: per the contract.
            let len = unsafe { (*m.msg_iov.add(i)).iov_len };
            total = total.checked_add(len).ok_or(err::EINVAL)?;
        }
        if total > r.len {
            return Err(err::EINVAL);
        }
    }
    Ok(r)
}

unsafe extern "C" fn writemsg(ep: *mut fid_ep, msg: *const fi_msg_rma, flags: u64) -> isize {
    guard::call_ssize("writemsg", || {
        // SAFETY: the caller's message.
        let m = unsafe { msg.as_ref() }.ok_or(err::EINVAL)?;
        // SAFETY: the caller's lists.
        let r = unsafe { remote_range(m) }?;
        let data = (flags & FI_REMOTE_CQ_DATA != 0).then_some(m.data);
        if flags & FI_INJECT != 0 {
            let e = unsafe { Ep::from_fid(ep as *mut fid) }?;
            let remote = Segment::remote(
                r.addr,
                MemHandle(u32::try_from(r.key).map_err(|_| err::EINVAL)?),
            );
            let make = |s: Segment| {
                let d = Descriptor::rdma_write(remote, &[s]);
                match data {
                    Some(v) => d.with_immediate(v as u32),
                    None => d,
                }
            };
            // SAFETY: the caller's iovec list of `iov_count` entries.
            return unsafe {
                e.post_injected(
                    m.msg_iov,
                    m.iov_count,
                    make,
                    m.context,
                    FI_RMA | FI_WRITE,
                    false,
                )
            };
        }
        unsafe {
            rma(
                ep,
                m.msg_iov,
                m.desc,
                m.iov_count,
                r.addr,
                r.key,
                data,
                m.context,
                false,
            )
        }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn read(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    _src: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("read", || {
        let v = one(buf, len, desc);
        let mut d = desc;
        // SAFETY: one entry each, on the stack.
        unsafe { rma(ep, &v, &mut d, 1, addr, key, None, context, true) }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn readv(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    _src: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the caller's lists.
    guard::call_ssize("readv", || unsafe {
        rma(ep, iov, desc, count, addr, key, None, context, true)
    })
}

unsafe extern "C" fn readmsg(ep: *mut fid_ep, msg: *const fi_msg_rma, _flags: u64) -> isize {
    guard::call_ssize("readmsg", || {
        // SAFETY: the caller's message.
        let m = unsafe { msg.as_ref() }.ok_or(err::EINVAL)?;
        // SAFETY: the caller's lists.
        let r = unsafe { remote_range(m) }?;
        unsafe {
            rma(
                ep,
                m.msg_iov,
                m.desc,
                m.iov_count,
                r.addr,
                r.key,
                None,
                m.context,
                true,
            )
        }
    })
}
