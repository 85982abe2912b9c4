//! Reliable-datagram endpoints (`FI_EP_RDM`) of the provider's own, on the
//! shm domain: tagged and untagged messages to any endpoint of the host
//! named in an address vector, with libfabric's tag matching, so that an
//! MPI reaches uvia without `ofi_rxm` between.
//!
//! Each pair of endpoints that talk gets a ring a direction (`link`), made
//! by the sender on its first message: a message is one record (its header
//! carries the tag and remote data) for up to a chunk, more records after.
//! A CQ read looks at each link's next record, matches it against the
//! posted receives and copies it from the ring straight into the matched
//! buffer, or into a held copy when none matches (`state`): no descriptor,
//! bounce buffer or second queue between. A send writes the ring in the
//! program's call and completes there (a large one completes as the reads
//! of the peer free the ring and the rest is written).
//!
//! Every libfabric call on the endpoint takes its lock (`FI_THREAD_SAFE`
//! and the weaker levels alike); its CQ and counter are the objects in
//! `cq` and `cntr`, opened on a domain made for reliable datagrams.

pub mod av;
pub mod cntr;
pub mod cq;
pub mod info;
pub mod link;
pub mod state;

use crate::domain::Domain;
use crate::guard;
use crate::nosys;
use crate::sys::*;
use av::{Av, FI_ADDR_NOTAVAIL, FI_ADDR_UNSPEC};
use link::{Name, NAME_LEN};
use state::{Recv, SendError, Sink, State};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use uvia::SpinLock;

/// Longest message: the header's length is 32 bits.
pub const MAX_MSG: usize = u32::MAX as usize;
/// Longest `fi_inject`: written into the ring in the call, like any send
/// of a chunk or less.
pub const INJECT_SIZE: usize = 8192;
/// Any 64-bit tag (fi_endpoint(3)'s generic format).
pub const TAG_FORMAT: u64 = 0xAAAA_AAAA_AAAA_AAAA;

/// An endpoint. `#[repr(C)]` with libfabric's `fid_ep` first.
#[repr(C)]
pub struct Ep {
    pub fid: fid_ep,
    domain: *const Domain,
    name: Name,
    av: AtomicPtr<Av>,
    tx_cq: AtomicPtr<cq::Cq>,
    rx_cq: AtomicPtr<cq::Cq>,
    cntr: AtomicPtr<cntr::Cntr>,
    /// Bound with `FI_SELECTIVE_COMPLETION`: an operation writes an entry
    /// only with `FI_COMPLETION` (its own flags or the default below).
    tx_selective: AtomicBool,
    rx_selective: AtomicBool,
    tx_op_flags: AtomicU64,
    rx_op_flags: AtomicU64,
    /// `FI_DIRECTED_RECV`: a receive's source address is matched.
    directed: bool,
    state: SpinLock<State>,
}

// SAFETY: the objects pointed to are kept open by the counts the binds
// take; the state is behind its lock.
unsafe impl Sync for Ep {}
unsafe impl Send for Ep {}

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
    cancel: Some(cancel),
    getopt: Some(getopt),
    setopt: Some(setopt),
    tx_ctx: Some(nosys::ep_tx_ctx),
    rx_ctx: Some(nosys::ep_rx_ctx),
    rx_size_left: Some(nosys::ep_rx_size_left),
    tx_size_left: Some(nosys::ep_tx_size_left),
};

static CM_OPS: fi_ops_cm = fi_ops_cm {
    size: std::mem::size_of::<fi_ops_cm>(),
    setname: Some(nosys::cm_setname),
    getname: Some(getname),
    getpeer: Some(nosys::cm_getpeer),
    connect: Some(nosys::cm_connect),
    listen: Some(nosys::cm_listen),
    accept: Some(nosys::cm_accept),
    reject: Some(nosys::cm_reject),
    shutdown: Some(nosys::cm_shutdown),
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

static TAGGED_OPS: fi_ops_tagged = fi_ops_tagged {
    size: std::mem::size_of::<fi_ops_tagged>(),
    recv: Some(trecv),
    recvv: Some(trecvv),
    recvmsg: Some(trecvmsg),
    send: Some(tsend),
    sendv: Some(tsendv),
    sendmsg: Some(tsendmsg),
    inject: Some(tinject),
    senddata: Some(tsenddata),
    injectdata: Some(tinjectdata),
};

static RMA_OPS: fi_ops_rma = fi_ops_rma {
    size: std::mem::size_of::<fi_ops_rma>(),
    read: Some(nosys::rma_read),
    readv: Some(nosys::rma_readv),
    readmsg: Some(nosys::rma_readmsg),
    write: Some(nosys::rma_write),
    writev: Some(nosys::rma_writev),
    writemsg: Some(nosys::rma_writemsg),
    inject: Some(nosys::rma_inject),
    writedata: Some(nosys::rma_writedata),
    injectdata: Some(nosys::rma_injectdata),
};

/// `fi_endpoint` on a reliable-datagram domain: the endpoint listens for
/// its peers' links from here on.
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
        let (tx, rx) = unsafe { (info.tx_attr.as_ref(), info.rx_attr.as_ref()) };
        let dir = uvia_shm::SocketDir::from_env().map_err(|e| {
            eprintln!("libfabric:uvia: the socket directory: {e}");
            err::ENODEV
        })?;
        let name = Name::fresh();
        let state = State::new(dir, name).map_err(|e| {
            eprintln!("libfabric:uvia: listening for an endpoint's peers: {e}");
            err::ENODEV
        })?;
        let caps = info.caps | rx.map_or(0, |r| r.caps);
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
                atomic: &crate::ep::ATOMIC_OPS as *const _ as *mut _,
                collective: &crate::ep::COLLECTIVE_OPS as *const _ as *mut _,
            },
            domain,
            name,
            av: AtomicPtr::new(std::ptr::null_mut()),
            tx_cq: AtomicPtr::new(std::ptr::null_mut()),
            rx_cq: AtomicPtr::new(std::ptr::null_mut()),
            cntr: AtomicPtr::new(std::ptr::null_mut()),
            tx_selective: AtomicBool::new(false),
            rx_selective: AtomicBool::new(false),
            tx_op_flags: AtomicU64::new(tx.map_or(0, |t| t.op_flags)),
            rx_op_flags: AtomicU64::new(rx.map_or(0, |r| r.op_flags)),
            directed: caps & FI_DIRECTED_RECV != 0,
            state: SpinLock::new(state),
        });
        domain.refs.fetch_add(1, Ordering::AcqRel);
        // SAFETY: checked non-NULL above.
        unsafe { *ep = Box::into_raw(e) as *mut fid_ep };
        Ok(())
    })
}

/// What a send may do with the program's bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum How {
    /// Keep pointing at them until the send completes.
    Borrow,
    /// Copy what is not written in the call (the bytes are a gathered
    /// copy, or `FI_INJECT` asked for the buffer back at once).
    Copy,
    /// As `Copy`, and no entry when it succeeds (`fi_inject`).
    Inject,
}

impl How {
    fn copy_if(c: bool) -> How {
        if c {
            How::Copy
        } else {
            How::Borrow
        }
    }
}

/// Where an endpoint's completions go.
struct Sinks<'a>(&'a Ep);

impl Sink for Sinks<'_> {
    #[inline]
    fn sent(&mut self, context: *mut c_void, flags: u64, len: usize) {
        if let Some(cq) = self.0.tx_cq() {
            cq.push(cq::entry(
                context,
                flags,
                len,
                std::ptr::null_mut(),
                0,
                0,
                FI_ADDR_NOTAVAIL,
            ));
        }
    }

    #[inline]
    fn received(&mut self, r: &Recv, len: usize, data: u64, tag: u64, src: fi_addr_t, flags: u64) {
        if let Some(cq) = self.0.rx_cq() {
            cq.push(cq::entry(
                r.context,
                r.flags | flags,
                len,
                r.buf as *mut c_void,
                data,
                tag,
                src,
            ));
        }
    }

    fn failed(&mut self, r: &Recv, len: usize, data: u64, tag: u64, olen: usize, err: c_int) {
        if let Some(cq) = self.0.rx_cq() {
            let e = cq::entry(r.context, r.flags, len, r.buf as *mut c_void, data, tag, 0);
            cq.push_error(cq::error(e.e, olen, err));
        }
    }

    fn send_failed(&mut self, context: *mut c_void, flags: u64, len: usize, err: c_int) {
        if let Some(cq) = self.0.tx_cq() {
            let e = cq::entry(context, flags, len, std::ptr::null_mut(), 0, 0, 0);
            cq.push_error(cq::error(e.e, 0, err));
        }
    }

    fn source(&mut self, peer: &Name) -> fi_addr_t {
        self.0
            .av()
            .and_then(|a| a.addr_of(peer))
            .unwrap_or(FI_ADDR_NOTAVAIL)
    }
}

impl Ep {
    /// # Safety
    /// `p` is NULL or a fid this provider handed out and has not freed.
    pub unsafe fn from_fid<'a>(p: *mut fid) -> Result<&'a Ep, c_int> {
        // SAFETY: per the contract; both endpoint kinds share the class,
        // this one's ops table tells them apart.
        match unsafe { p.as_ref() } {
            Some(f)
                if f.fclass == FI_CLASS_EP as usize
                    && std::ptr::eq(f.ops, &FI_OPS as *const fi_ops) =>
            {
                Ok(unsafe { &*(p as *const Ep) })
            }
            _ => Err(err::EINVAL),
        }
    }

    fn domain(&self) -> &Domain {
        // SAFETY: an endpoint keeps its domain open.
        unsafe { &*self.domain }
    }

    fn av(&self) -> Option<&Av> {
        // SAFETY: a bound AV is kept open by its count.
        unsafe { self.av.load(Ordering::Acquire).as_ref() }
    }

    #[inline]
    fn tx_cq(&self) -> Option<&cq::Cq> {
        // SAFETY: a bound CQ is kept open by its count.
        unsafe { self.tx_cq.load(Ordering::Acquire).as_ref() }
    }

    #[inline]
    fn rx_cq(&self) -> Option<&cq::Cq> {
        // SAFETY: as above.
        unsafe { self.rx_cq.load(Ordering::Acquire).as_ref() }
    }

    /// Runs the endpoint's progress: what its links brought, what waits
    /// to be written.
    #[inline]
    pub fn progress(&self) {
        self.state.lock().progress(&mut Sinks(self));
    }

    /// Whether an operation with `flags` writes an entry when it succeeds.
    #[inline]
    fn completes(&self, tx: bool, flags: u64) -> bool {
        let sel = if tx {
            &self.tx_selective
        } else {
            &self.rx_selective
        };
        !sel.load(Ordering::Relaxed) || flags & FI_COMPLETION != 0
    }

    /// Every send: `bytes` to `dest`.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &self,
        bytes: &[u8],
        dest: fi_addr_t,
        tag: u64,
        data: Option<u64>,
        tagged: bool,
        context: *mut c_void,
        flags: u64,
        how: How,
    ) -> Result<isize, c_int> {
        let inject = how == How::Inject;
        if bytes.len() > MAX_MSG || (inject && bytes.len() > INJECT_SIZE) {
            return Err(-(FI_EMSGSIZE as c_int));
        }
        let av = self.av().ok_or(-(FI_EOPBADSTATE as c_int))?;
        let complete = !inject && self.completes(true, flags);
        let copy = how != How::Borrow;
        let kind = if tagged { FI_TAGGED } else { FI_MSG };
        let head = state::head(tag, data, bytes.len(), tagged);
        let mut s = self.state.lock();
        let sinks = &mut Sinks(self);
        match s.send(
            dest,
            || av.name(dest),
            head,
            bytes,
            copy,
            context,
            FI_SEND | kind,
            complete,
            sinks,
        ) {
            Ok(()) => Ok(0),
            Err(SendError::Busy) => {
                // The peer may have freed the ring since: progress, so a
                // program that retries without reading its CQ gets on.
                s.progress(sinks);
                Err(-FI_EAGAIN)
            }
            Err(SendError::NoAddress) => Err(err::EINVAL),
            Err(SendError::Unreachable) => Err(-(FI_EHOSTUNREACH as c_int)),
        }
    }

    /// Every receive.
    #[allow(clippy::too_many_arguments)]
    fn recv(
        &self,
        buf: *mut c_void,
        len: usize,
        src: fi_addr_t,
        tag: u64,
        ignore: u64,
        context: *mut c_void,
        tagged: bool,
        flags: u64,
    ) -> Result<isize, c_int> {
        if buf.is_null() && len > 0 {
            return Err(err::EINVAL);
        }
        let r = Recv {
            buf: buf as *mut u8,
            len,
            src: if self.directed { src } else { FI_ADDR_UNSPEC },
            tag: if tagged { tag } else { 0 },
            ignore: if tagged { ignore } else { 0 },
            context,
            flags: FI_RECV | if tagged { FI_TAGGED } else { FI_MSG },
            complete: self.completes(false, flags),
        };
        let mut s = self.state.lock();
        let sinks = &mut Sinks(self);
        if flags & FI_PEEK != 0 {
            s.peek(
                &r,
                flags & FI_CLAIM != 0,
                flags & FI_DISCARD != 0,
                tagged,
                sinks,
            );
        } else if flags & FI_CLAIM != 0 {
            if !s.claimed(&r, flags & FI_DISCARD != 0, tagged, sinks) {
                return Err(err::EINVAL);
            }
        } else {
            s.post(r, tagged, sinks);
        }
        Ok(0)
    }
}

/// The bytes of a send's iov: the one buffer as it is, several gathered
/// into `keep`.
///
/// # Safety
/// `iov` holds `count` entries, each naming valid bytes.
unsafe fn gather(iov: *const iovec, count: usize, keep: &mut Vec<u8>) -> Result<&[u8], c_int> {
    if count == 0 {
        return Ok(&[]);
    }
    if iov.is_null() {
        return Err(err::EINVAL);
    }
    // SAFETY: per the contract.
    let v = unsafe { std::slice::from_raw_parts(iov, count) };
    if count == 1 {
        // SAFETY: per the contract.
        return unsafe { bytes(v[0].iov_base, v[0].iov_len) };
    }
    for e in v {
        // SAFETY: per the contract.
        keep.extend_from_slice(unsafe { bytes(e.iov_base, e.iov_len) }?);
    }
    Ok(keep)
}

/// The `len` bytes at `buf` (none for an empty buffer, which may be
/// NULL); a NULL buffer of some length is `-FI_EINVAL`.
///
/// # Safety
/// `buf` holds `len` bytes, or `len` is 0.
unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> Result<&'a [u8], c_int> {
    match (len, buf.is_null()) {
        (0, _) => Ok(&[]),
        (_, true) => Err(err::EINVAL),
        // SAFETY: per the contract.
        _ => Ok(unsafe { std::slice::from_raw_parts(buf as *const u8, len) }),
    }
}

/// Writes `name` to the caller's buffer, as `fi_getname` does.
///
/// # Safety
/// `len` is NULL or valid; `addr` is NULL or holds `*len` bytes.
pub unsafe fn put_name(name: &Name, addr: *mut c_void, len: *mut usize) -> Result<(), c_int> {
    // SAFETY: per the contract.
    let room = unsafe { len.as_mut() }.ok_or(err::EINVAL)?;
    let have = *room;
    *room = NAME_LEN;
    if addr.is_null() || have < NAME_LEN {
        return Err(-(FI_ETOOSMALL as c_int));
    }
    // SAFETY: `addr` holds at least NAME_LEN bytes.
    unsafe { std::ptr::copy_nonoverlapping(name.0.as_ptr(), addr as *mut u8, NAME_LEN) };
    Ok(())
}

// ---- fi_ops

/// Binds `new` into `slot` unless something is bound there already (one
/// of each per endpoint: a second bind is refused, not put in the first's
/// place, whose count would never come down).
fn once<T>(slot: &AtomicPtr<T>, new: *mut T) -> Result<(), c_int> {
    slot.compare_exchange(
        std::ptr::null_mut(),
        new,
        Ordering::AcqRel,
        Ordering::Acquire,
    )
    .map(|_| ())
    .map_err(|_| err::EINVAL)
}

unsafe extern "C" fn bind(p: *mut fid, bfid: *mut fid, flags: u64) -> c_int {
    guard::call("ep bind", || {
        // SAFETY: libfabric passes fids it was given.
        let ep = unsafe { Ep::from_fid(p) }?;
        let class = unsafe { bfid.as_ref() }.ok_or(err::EINVAL)?.fclass as u32;
        match class {
            FI_CLASS_AV => {
                let av = unsafe { Av::from_fid(bfid) }?;
                if !std::ptr::eq(av.domain(), ep.domain()) {
                    return Err(err::EINVAL);
                }
                once(&ep.av, av as *const Av as *mut Av)?;
                av.refs.fetch_add(1, Ordering::AcqRel);
            }
            FI_CLASS_CQ => {
                let cq = unsafe { cq::Cq::from_fid(bfid) }?;
                if flags & (FI_TRANSMIT | FI_RECV) == 0 || !std::ptr::eq(cq.domain(), ep.domain()) {
                    return Err(err::EINVAL);
                }
                let selective = flags & FI_SELECTIVE_COMPLETION != 0;
                // Both slots checked before either is taken: a bind that
                // fails binds nothing.
                let taken = |bit: u64, slot: &AtomicPtr<cq::Cq>| {
                    flags & bit != 0 && !slot.load(Ordering::Acquire).is_null()
                };
                if taken(FI_TRANSMIT, &ep.tx_cq) || taken(FI_RECV, &ep.rx_cq) {
                    return Err(err::EINVAL);
                }
                let ptr = cq as *const cq::Cq as *mut cq::Cq;
                if flags & FI_TRANSMIT != 0 {
                    once(&ep.tx_cq, ptr)?;
                    cq.refs.fetch_add(1, Ordering::AcqRel);
                    ep.tx_selective.store(selective, Ordering::Release);
                }
                if flags & FI_RECV != 0 {
                    once(&ep.rx_cq, ptr)?;
                    cq.refs.fetch_add(1, Ordering::AcqRel);
                    ep.rx_selective.store(selective, Ordering::Release);
                }
                cq.attach(ep);
            }
            FI_CLASS_CNTR => {
                // Counters of RMA (which is not offered) only: they stay
                // at zero. Counting sends or receives is not offered.
                let c = unsafe { cntr::Cntr::from_fid(bfid) }?;
                let rma = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
                if flags & !rma != 0 || flags == 0 {
                    return Err(err::ENOSYS);
                }
                once(&ep.cntr, c as *const cntr::Cntr as *mut cntr::Cntr)?;
                c.refs.fetch_add(1, Ordering::AcqRel);
            }
            _ => return Err(err::ENOSYS),
        }
        Ok(())
    })
}

unsafe extern "C" fn control(p: *mut fid, command: c_int, arg: *mut c_void) -> c_int {
    guard::call("ep control", || {
        // SAFETY: libfabric passes the fid it was given.
        let ep = unsafe { Ep::from_fid(p) }?;
        match command as u32 {
            FI_ENABLE => {
                if ep.av().is_none() || (ep.tx_cq().is_none() && ep.rx_cq().is_none()) {
                    return Err(-(FI_ENOAV as c_int));
                }
                Ok(())
            }
            FI_GETOPSFLAG | FI_SETOPSFLAG => {
                // SAFETY: the caller passes a u64 of flags.
                let f = unsafe { (arg as *mut u64).as_mut() }.ok_or(err::EINVAL)?;
                let slot = match (*f & FI_TRANSMIT != 0, *f & FI_RECV != 0) {
                    (true, false) => &ep.tx_op_flags,
                    (false, true) => &ep.rx_op_flags,
                    _ => return Err(err::EINVAL),
                };
                if command as u32 == FI_GETOPSFLAG {
                    *f = slot.load(Ordering::Acquire);
                } else {
                    slot.store(*f & !(FI_TRANSMIT | FI_RECV), Ordering::Release);
                }
                Ok(())
            }
            _ => Err(err::ENOSYS),
        }
    })
}

unsafe extern "C" fn close(p: *mut fid) -> c_int {
    guard::call("ep close", || {
        // SAFETY: libfabric calls close through the fid it was given.
        let ep = unsafe { Ep::from_fid(p) }?;
        // Out of the CQs first: a read under way ends before `detach`
        // returns, and none begins after it.
        for cq in [ep.tx_cq(), ep.rx_cq()].into_iter().flatten() {
            cq.detach(ep);
        }
        // SAFETY: the box made in `open`; nothing refers to it any more.
        let ep = unsafe { Box::from_raw(ep as *const Ep as *mut Ep) };
        // SAFETY: bound objects and the domain are kept open by the counts.
        unsafe {
            if let Some(a) = ep.av.load(Ordering::Acquire).as_ref() {
                a.refs.fetch_sub(1, Ordering::AcqRel);
            }
            for cq in [
                ep.tx_cq.load(Ordering::Acquire),
                ep.rx_cq.load(Ordering::Acquire),
            ] {
                if let Some(cq) = cq.as_ref() {
                    cq.refs.fetch_sub(1, Ordering::AcqRel);
                }
            }
            if let Some(c) = ep.cntr.load(Ordering::Acquire).as_ref() {
                c.refs.fetch_sub(1, Ordering::AcqRel);
            }
        }
        ep.domain().refs.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    })
}

// ---- fi_ops_ep

unsafe extern "C" fn cancel(p: fid_t, context: *mut c_void) -> isize {
    guard::call_ssize("ep cancel", || {
        // SAFETY: libfabric passes the fid it was given.
        let ep = unsafe { Ep::from_fid(p) }?;
        let mut s = ep.state.lock();
        if s.cancel(context, &mut Sinks(ep)) {
            Ok(0)
        } else {
            Err(-(FI_ENOENT as c_int))
        }
    })
}

unsafe extern "C" fn getopt(
    _p: fid_t,
    _level: c_int,
    _name: c_int,
    _val: *mut c_void,
    _len: *mut usize,
) -> c_int {
    -(FI_ENOPROTOOPT as c_int)
}

unsafe extern "C" fn setopt(
    _p: fid_t,
    _level: c_int,
    _name: c_int,
    _val: *const c_void,
    _len: usize,
) -> c_int {
    -(FI_ENOPROTOOPT as c_int)
}

// ---- fi_ops_cm

unsafe extern "C" fn getname(p: fid_t, addr: *mut c_void, len: *mut usize) -> c_int {
    guard::call("ep getname", || {
        // SAFETY: libfabric passes the fid it was given.
        let ep = unsafe { Ep::from_fid(p) }?;
        // SAFETY: the caller's buffer.
        unsafe { put_name(&ep.name, addr, len) }
    })
}

// ---- fi_ops_msg and fi_ops_tagged

/// The endpoint behind `ep`, for the data calls.
///
/// # Safety
/// As [`Ep::from_fid`].
#[inline]
unsafe fn this<'a>(ep: *mut fid_ep) -> Result<&'a Ep, c_int> {
    // SAFETY: per the contract.
    unsafe { Ep::from_fid(ep as *mut fid) }
}

fn op_flags(ep: &Ep, tx: bool) -> u64 {
    if tx {
        ep.tx_op_flags.load(Ordering::Relaxed)
    } else {
        ep.rx_op_flags.load(Ordering::Relaxed)
    }
}

unsafe extern "C" fn send(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: fi_addr_t,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("send", || {
        let e = unsafe { this(ep) }?;
        e.send(
            unsafe { bytes(buf, len) }?,
            dest,
            0,
            None,
            false,
            context,
            op_flags(e, true),
            How::Borrow,
        )
    })
}

unsafe extern "C" fn sendv(
    ep: *mut fid_ep,
    iov: *const iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: fi_addr_t,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("sendv", || {
        let e = unsafe { this(ep) }?;
        let mut keep = Vec::new();
        let b = unsafe { gather(iov, count, &mut keep) }?;
        e.send(
            b,
            dest,
            0,
            None,
            false,
            context,
            op_flags(e, true),
            How::copy_if(count > 1),
        )
    })
}

unsafe extern "C" fn sendmsg(ep: *mut fid_ep, msg: *const fi_msg, flags: u64) -> isize {
    guard::call_ssize("sendmsg", || {
        let e = unsafe { this(ep) }?;
        let m = unsafe { msg.as_ref() }.ok_or(err::EINVAL)?;
        let mut keep = Vec::new();
        let b = unsafe { gather(m.msg_iov, m.iov_count, &mut keep) }?;
        let data = (flags & FI_REMOTE_CQ_DATA != 0).then_some(m.data);
        e.send(
            b,
            m.addr,
            0,
            data,
            false,
            m.context,
            flags,
            How::copy_if(m.iov_count > 1 || flags & FI_INJECT != 0),
        )
    })
}

unsafe extern "C" fn inject(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest: fi_addr_t,
) -> isize {
    guard::call_ssize("inject", || {
        let e = unsafe { this(ep) }?;
        e.send(
            unsafe { bytes(buf, len) }?,
            dest,
            0,
            None,
            false,
            std::ptr::null_mut(),
            0,
            How::Inject,
        )
    })
}

unsafe extern "C" fn senddata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: fi_addr_t,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("senddata", || {
        let e = unsafe { this(ep) }?;
        e.send(
            unsafe { bytes(buf, len) }?,
            dest,
            0,
            Some(data),
            false,
            context,
            op_flags(e, true),
            How::Borrow,
        )
    })
}

unsafe extern "C" fn injectdata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: fi_addr_t,
) -> isize {
    guard::call_ssize("injectdata", || {
        let e = unsafe { this(ep) }?;
        e.send(
            unsafe { bytes(buf, len) }?,
            dest,
            0,
            Some(data),
            false,
            std::ptr::null_mut(),
            0,
            How::Inject,
        )
    })
}

unsafe extern "C" fn recv(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: fi_addr_t,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("recv", || {
        let e = unsafe { this(ep) }?;
        e.recv(buf, len, src, 0, 0, context, false, op_flags(e, false))
    })
}

/// The one buffer of a receive's iov (receives take one: `iov_limit`).
///
/// # Safety
/// `iov` holds `count` entries.
unsafe fn one(iov: *const iovec, count: usize) -> Result<(*mut c_void, usize), c_int> {
    match count {
        0 => Ok((std::ptr::null_mut(), 0)),
        // SAFETY: per the contract.
        1 if !iov.is_null() => Ok(unsafe { ((*iov).iov_base, (*iov).iov_len) }),
        _ => Err(err::EINVAL),
    }
}

unsafe extern "C" fn recvv(
    ep: *mut fid_ep,
    iov: *const iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: fi_addr_t,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("recvv", || {
        let e = unsafe { this(ep) }?;
        let (b, n) = unsafe { one(iov, count) }?;
        e.recv(b, n, src, 0, 0, context, false, op_flags(e, false))
    })
}

unsafe extern "C" fn recvmsg(ep: *mut fid_ep, msg: *const fi_msg, flags: u64) -> isize {
    guard::call_ssize("recvmsg", || {
        let e = unsafe { this(ep) }?;
        let m = unsafe { msg.as_ref() }.ok_or(err::EINVAL)?;
        if flags & FI_MULTI_RECV != 0 {
            return Err(err::EINVAL);
        }
        let (b, n) = unsafe { one(m.msg_iov, m.iov_count) }?;
        e.recv(b, n, m.addr, 0, 0, m.context, false, flags)
    })
}

unsafe extern "C" fn tsend(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("tsend", || {
        let e = unsafe { this(ep) }?;
        e.send(
            unsafe { bytes(buf, len) }?,
            dest,
            tag,
            None,
            true,
            context,
            op_flags(e, true),
            How::Borrow,
        )
    })
}

unsafe extern "C" fn tsendv(
    ep: *mut fid_ep,
    iov: *const iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("tsendv", || {
        let e = unsafe { this(ep) }?;
        let mut keep = Vec::new();
        let b = unsafe { gather(iov, count, &mut keep) }?;
        e.send(
            b,
            dest,
            tag,
            None,
            true,
            context,
            op_flags(e, true),
            How::copy_if(count > 1),
        )
    })
}

unsafe extern "C" fn tsendmsg(ep: *mut fid_ep, msg: *const fi_msg_tagged, flags: u64) -> isize {
    guard::call_ssize("tsendmsg", || {
        let e = unsafe { this(ep) }?;
        let m = unsafe { msg.as_ref() }.ok_or(err::EINVAL)?;
        let mut keep = Vec::new();
        let b = unsafe { gather(m.msg_iov, m.iov_count, &mut keep) }?;
        let data = (flags & FI_REMOTE_CQ_DATA != 0).then_some(m.data);
        e.send(
            b,
            m.addr,
            m.tag,
            data,
            true,
            m.context,
            flags,
            How::copy_if(m.iov_count > 1 || flags & FI_INJECT != 0),
        )
    })
}

unsafe extern "C" fn tinject(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest: fi_addr_t,
    tag: u64,
) -> isize {
    guard::call_ssize("tinject", || {
        let e = unsafe { this(ep) }?;
        e.send(
            unsafe { bytes(buf, len) }?,
            dest,
            tag,
            None,
            true,
            std::ptr::null_mut(),
            0,
            How::Inject,
        )
    })
}

unsafe extern "C" fn tsenddata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("tsenddata", || {
        let e = unsafe { this(ep) }?;
        e.send(
            unsafe { bytes(buf, len) }?,
            dest,
            tag,
            Some(data),
            true,
            context,
            op_flags(e, true),
            How::Borrow,
        )
    })
}

unsafe extern "C" fn tinjectdata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: fi_addr_t,
    tag: u64,
) -> isize {
    guard::call_ssize("tinjectdata", || {
        let e = unsafe { this(ep) }?;
        e.send(
            unsafe { bytes(buf, len) }?,
            dest,
            tag,
            Some(data),
            true,
            std::ptr::null_mut(),
            0,
            How::Inject,
        )
    })
}

unsafe extern "C" fn trecv(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: fi_addr_t,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("trecv", || {
        let e = unsafe { this(ep) }?;
        e.recv(
            buf,
            len,
            src,
            tag,
            ignore,
            context,
            true,
            op_flags(e, false),
        )
    })
}

unsafe extern "C" fn trecvv(
    ep: *mut fid_ep,
    iov: *const iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: fi_addr_t,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
) -> isize {
    guard::call_ssize("trecvv", || {
        let e = unsafe { this(ep) }?;
        let (b, n) = unsafe { one(iov, count) }?;
        e.recv(b, n, src, tag, ignore, context, true, op_flags(e, false))
    })
}

unsafe extern "C" fn trecvmsg(ep: *mut fid_ep, msg: *const fi_msg_tagged, flags: u64) -> isize {
    guard::call_ssize("trecvmsg", || {
        let e = unsafe { this(ep) }?;
        let m = unsafe { msg.as_ref() }.ok_or(err::EINVAL)?;
        if flags & FI_MULTI_RECV != 0 {
            return Err(err::EINVAL);
        }
        let (b, n) = unsafe { one(m.msg_iov, m.iov_count) }?;
        e.recv(b, n, m.addr, m.tag, m.ignore, m.context, true, flags)
    })
}
