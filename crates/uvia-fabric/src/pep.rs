//! The passive endpoint (a listener) and the connection requests it
//! receives.
//!
//! A listener at `ip:port` waits on a uvia discriminator (see
//! `Medium::discriminator`); each request becomes an `FI_CONNREQ` event
//! whose `fi_info` carries the request as its `handle` (a `ConnReq`,
//! class `FI_CLASS_CONNREQ`): a domain opened with that info uses the
//! listener's Nic, an endpoint opened with it answers the request with
//! `fi_accept`, the listener with `fi_reject`.

use crate::eq::{Eq, Event};
use crate::fabric::Fabric;
use crate::guard::{self, lock};
use crate::medium::{self, Medium};
use crate::nosys;
use crate::prov;
use crate::sys::*;
use std::collections::BTreeSet;
use std::ffi::{c_int, c_void, CStr};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use uvia::{ConnRequest, Discriminator, Nic, NicOptions};

/// A passive endpoint. `#[repr(C)]` with libfabric's `fid_pep` first.
#[repr(C)]
pub struct Pep {
    pub fid: fid_pep,
    fabric: *const Fabric,
    medium: Medium,
    /// The info it was opened with (a copy), the template of requests' infos.
    info: *mut fi_info,
    nic: Nic,
    addr: SocketAddrV4,
    discriminator: Discriminator,
    eq: AtomicPtr<Eq>,
    listening: AtomicBool,
}

/// An unanswered connection request, the `handle` of its `FI_CONNREQ` info.
#[repr(C)]
pub struct ConnReq {
    pub fid: fid,
    pub nic: Nic,
    pub medium: Medium,
    pub request: Mutex<Option<ConnRequest>>,
}

static FI_OPS: fi_ops = fi_ops {
    size: std::mem::size_of::<fi_ops>(),
    close: Some(close),
    bind: Some(bind),
    control: Some(nosys::control),
    ops_open: Some(nosys::ops_open),
    tostr: Some(nosys::tostr),
    ops_set: Some(nosys::ops_set),
};

static EP_OPS: fi_ops_ep = fi_ops_ep {
    size: std::mem::size_of::<fi_ops_ep>(),
    cancel: Some(nosys::ep_cancel),
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
    listen: Some(listen),
    accept: Some(nosys::cm_accept),
    reject: Some(reject),
    shutdown: Some(nosys::cm_shutdown),
    join: Some(nosys::cm_join),
};

static CONNREQ_OPS: fi_ops = fi_ops {
    size: std::mem::size_of::<fi_ops>(),
    close: Some(nosys_close),
    bind: Some(nosys::bind),
    control: Some(nosys::control),
    ops_open: Some(nosys::ops_open),
    tostr: Some(nosys::tostr),
    ops_set: Some(nosys::ops_set),
};

unsafe extern "C" fn nosys_close(_: *mut fid) -> c_int {
    err::ENOSYS
}

/// `fi_passive_ep`: a listener at the info's source address (port 0: one
/// chosen here).
pub unsafe extern "C" fn open(
    fabric: *mut fid_fabric,
    info: *mut fi_info,
    pep: *mut *mut fid_pep,
    context: *mut c_void,
) -> c_int {
    guard::call("passive_ep", || {
        // SAFETY: libfabric passes the fabric it was given and an info.
        let f = unsafe { Fabric::from_fid(fabric) }?;
        let info = unsafe { info.as_ref() }.ok_or(err::EINVAL)?;
        if pep.is_null() {
            return Err(err::EINVAL);
        }
        // SAFETY: attribute pointers are NULL or valid.
        let medium = match unsafe { info.domain_attr.as_ref() }.filter(|d| !d.name.is_null()) {
            Some(d) => Medium::parse(&unsafe { CStr::from_ptr(d.name) }.to_string_lossy())
                .ok_or(err::ENODEV)?,
            None => Medium::listed(prov::settings().domain.as_deref(), None)[0].clone(),
        };
        // SAFETY: valid for its stated length.
        let src = unsafe { medium::read_sockaddr_in(info.src_addr, info.src_addrlen) }
            .unwrap_or(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0));
        let (nic, addr) = listen_nic(&medium, src)?;
        // SAFETY: `info` is valid; the copy is ours.
        let copy = unsafe { fi_dupinfo(info) };
        if copy.is_null() {
            return Err(err::ENOMEM);
        }
        let p = Box::new(Pep {
            fid: fid_pep {
                fid: fid {
                    fclass: FI_CLASS_PEP as usize,
                    context,
                    ops: &FI_OPS as *const fi_ops as *mut fi_ops,
                },
                ops: &EP_OPS as *const fi_ops_ep as *mut fi_ops_ep,
                cm: &CM_OPS as *const fi_ops_cm as *mut fi_ops_cm,
            },
            fabric: f,
            discriminator: medium.discriminator(addr.port()),
            medium,
            info: copy,
            nic,
            addr,
            eq: AtomicPtr::new(std::ptr::null_mut()),
            listening: AtomicBool::new(false),
        });
        f.refs.fetch_add(1, Ordering::AcqRel);
        // SAFETY: checked non-NULL above.
        unsafe { *pep = Box::into_raw(p) as *mut fid_pep };
        Ok(())
    })
}

/// The Nic a listener at `src` uses and its address (the port chosen when
/// `src` names none).
fn listen_nic(medium: &Medium, src: SocketAddrV4) -> Result<(Nic, SocketAddrV4), c_int> {
    let opts = NicOptions {
        inject: prov::settings().inject.clone(),
        ..NicOptions::default()
    };
    let nic = medium
        .open_nic(&medium.listen_nic_name(src), &opts)
        .map_err(|_| -(FI_EADDRINUSE))?;
    let mut addr = src;
    if medium.host_local() {
        addr.set_ip(Ipv4Addr::LOCALHOST);
    } else if let Ok(a) = nic.attributes().address.parse::<SocketAddrV4>() {
        addr = a;
    }
    if addr.port() == 0 {
        // A port no other listener of the host holds: try from one that
        // differs between processes.
        let start = (std::process::id() as u16 % 16384) + 49152;
        for i in 0..16384u16 {
            let port = 49152 + (start - 49152 + i) % 16384;
            let d = medium.discriminator(port);
            match nic.connect_wait(&d, Some(Duration::ZERO)) {
                Err(uvia::ConnectError::InUse(_)) => continue,
                _ => {
                    nic.stop_listening(&d);
                    addr.set_port(port);
                    return Ok((nic, addr));
                }
            }
        }
        return Err(-(FI_EADDRINUSE));
    }
    Ok((nic, addr))
}

impl Pep {
    /// # Safety
    /// `p` is NULL or a fid this provider handed out and has not freed.
    pub unsafe fn from_fid<'a>(p: *mut fid) -> Result<&'a Pep, c_int> {
        // SAFETY: per the contract, with the class checked.
        match unsafe { p.as_ref() } {
            Some(f) if f.fclass == FI_CLASS_PEP as usize => Ok(unsafe { &*(p as *const Pep) }),
            _ => Err(err::EINVAL),
        }
    }

    /// Turns requests that arrived (waiting up to `wait`) into `FI_CONNREQ`
    /// events on `eq`.
    pub fn poll(&self, eq: &Eq, wait: Duration) {
        if !self.listening.load(Ordering::Acquire) {
            return;
        }
        let mut wait = wait;
        while let Ok(req) = self.nic.connect_wait(&self.discriminator, Some(wait)) {
            wait = Duration::ZERO;
            let data = req.private_data().to_vec();
            let handle = ConnReq::hand_out(ConnReq {
                fid: fid {
                    fclass: FI_CLASS_CONNREQ as usize,
                    context: std::ptr::null_mut(),
                    ops: &CONNREQ_OPS as *const fi_ops as *mut fi_ops,
                },
                nic: self.nic.clone(),
                medium: self.medium.clone(),
                request: Mutex::new(Some(req)),
            });
            // SAFETY: our copy of the listener's info.
            let info = unsafe { fi_dupinfo(self.info) };
            if info.is_null() {
                // SAFETY: made just above and handed to no one.
                drop(unsafe { ConnReq::take(handle as fid_t) });
                continue;
            }
            // The requester's address as its dest_addr (ofi_rxm looks the
            // peer up by it, with the port its private data names): on
            // shm this host's loopback, on a network the request's source.
            // SAFETY: a fresh copy, ours until the event is read.
            let peer = match unsafe { &*handle }.peer() {
                Some(a) => a,
                None => SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0),
            };
            unsafe {
                (*info).handle = handle as fid_t;
                medium::set_addr(
                    &mut (*info).dest_addr,
                    &mut (*info).dest_addrlen,
                    Some(peer),
                );
                medium::set_addr(
                    &mut (*info).src_addr,
                    &mut (*info).src_addrlen,
                    Some(self.addr),
                );
            }
            eq.push(Event::Cm {
                event: FI_CONNREQ,
                fid: &self.fid.fid as *const fid as fid_t,
                info,
                data,
            });
        }
    }
}

unsafe extern "C" fn bind(p: *mut fid, bfid: *mut fid, _flags: u64) -> c_int {
    guard::call("pep bind", || {
        // SAFETY: libfabric passes fids it was given.
        let pep = unsafe { Pep::from_fid(p) }?;
        let eq = unsafe { Eq::from_fid(bfid) }?;
        let old = pep.eq.swap(eq as *const Eq as *mut Eq, Ordering::AcqRel);
        // SAFETY: a bound EQ is kept open by the count.
        if let Some(old) = unsafe { old.as_ref() } {
            old.remove_listener(pep);
        }
        eq.add_listener(pep);
        Ok(())
    })
}

unsafe extern "C" fn listen(p: *mut fid_pep) -> c_int {
    guard::call("listen", || {
        // SAFETY: libfabric passes the fid it was given.
        let pep = unsafe { Pep::from_fid(p as *mut fid) }?;
        if pep.eq.load(Ordering::Acquire).is_null() {
            return Err(-(FI_ENOEQ as c_int));
        }
        // The first wait makes the Nic listen on the discriminator; a
        // request already there is taken by the next EQ read.
        match pep
            .nic
            .connect_wait(&pep.discriminator, Some(Duration::ZERO))
        {
            Err(uvia::ConnectError::InUse(_)) => return Err(-(FI_EADDRINUSE)),
            Ok(mut early) => {
                let _ = early.reject();
            }
            Err(_) => {}
        }
        pep.listening.store(true, Ordering::Release);
        Ok(())
    })
}

/// The listener's address (`fi_getname`).
unsafe extern "C" fn getname(p: fid_t, addr: *mut c_void, len: *mut usize) -> c_int {
    guard::call("pep getname", || {
        // SAFETY: libfabric passes the fid it was given.
        let pep = unsafe { Pep::from_fid(p) }?;
        // SAFETY: `len` and `addr` are the caller's, `addr` of `*len` bytes.
        unsafe { put_name(pep.addr, addr, len) }
    })
}

/// Writes `a` as a `sockaddr_in` into the caller's `(addr, len)` buffer.
///
/// # Safety
/// `len` is NULL or valid; `addr` is NULL or holds `*len` bytes.
pub unsafe fn put_name(a: SocketAddrV4, addr: *mut c_void, len: *mut usize) -> Result<(), c_int> {
    // SAFETY: per the contract.
    let room = unsafe { len.as_mut() }.ok_or(err::EINVAL)?;
    let sin = medium::sockaddr_in(a);
    let need = std::mem::size_of_val(&sin);
    let have = *room;
    *room = need;
    if addr.is_null() || have < need {
        return Err(-(FI_ETOOSMALL as c_int));
    }
    // SAFETY: `addr` holds at least `need` bytes.
    unsafe { std::ptr::copy_nonoverlapping(&sin as *const _ as *const u8, addr as *mut u8, need) };
    Ok(())
}

unsafe extern "C" fn reject(
    p: *mut fid_pep,
    handle: fid_t,
    param: *const c_void,
    len: usize,
) -> c_int {
    guard::call("reject", || {
        // SAFETY: libfabric passes the fids it was given; `param` holds `len` bytes.
        let _pep = unsafe { Pep::from_fid(p as *mut fid) }?;
        let req = unsafe { ConnReq::take(handle) }?;
        let data = unsafe { private(param, len) }?;
        let r = lock(&req.request).take().map(|mut r| r.reject_with(data));
        match r {
            Some(Ok(())) => Ok(()),
            _ => Err(err::EINVAL),
        }
    })
}

/// `fi_getopt` on an endpoint or listener: `FI_OPT_CM_DATA_SIZE`, the
/// most private data a connect, accept or reject carries (ofi_rxm checks
/// that its connection data fits).
pub unsafe extern "C" fn getopt(
    _fid: fid_t,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut usize,
) -> c_int {
    guard::call("getopt", || {
        if level as u32 != FI_OPT_ENDPOINT || name as u32 != FI_OPT_CM_DATA_SIZE {
            return Err(-FI_ENOPROTOOPT);
        }
        // SAFETY: `len` is NULL or the caller's; `val` holds `*len` bytes.
        let room = unsafe { len.as_mut() }.ok_or(err::EINVAL)?;
        let have = *room;
        *room = std::mem::size_of::<usize>();
        if val.is_null() || have < std::mem::size_of::<usize>() {
            return Err(-(FI_ETOOSMALL as c_int));
        }
        // SAFETY: room for a size_t, written unaligned as the caller's
        // buffer may be.
        unsafe { (val as *mut usize).write_unaligned(uvia::MAX_PRIVATE_DATA) };
        Ok(())
    })
}

/// `fi_setopt`: `FI_OPT_CM_DATA_SIZE` up to what a connection carries;
/// no other option.
pub unsafe extern "C" fn setopt(
    _fid: fid_t,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: usize,
) -> c_int {
    guard::call("setopt", || {
        if level as u32 != FI_OPT_ENDPOINT || name as u32 != FI_OPT_CM_DATA_SIZE {
            return Err(-FI_ENOPROTOOPT);
        }
        if val.is_null() || len < std::mem::size_of::<usize>() {
            return Err(err::EINVAL);
        }
        // SAFETY: a size_t's bytes, read unaligned.
        let want = unsafe { (val as *const usize).read_unaligned() };
        if want > uvia::MAX_PRIVATE_DATA {
            return Err(err::EINVAL);
        }
        Ok(())
    })
}

/// The private data of a CM call; a length with no bytes (NULL `param`)
/// is `-FI_EINVAL`, not a request that quietly carries none.
///
/// # Safety
/// `param` is NULL or holds `len` bytes.
pub unsafe fn private<'a>(param: *const c_void, len: usize) -> Result<&'a [u8], c_int> {
    if len == 0 {
        return Ok(&[]);
    }
    if param.is_null() {
        return Err(err::EINVAL);
    }
    // SAFETY: per the contract.
    Ok(unsafe { std::slice::from_raw_parts(param as *const u8, len) })
}

impl ConnReq {
    /// The requester's address on a network medium.
    pub fn peer(&self) -> Option<SocketAddrV4> {
        lock(&self.request)
            .as_ref()
            .and_then(|r| r.peer_address())
            .and_then(|a| self.medium.peer(&a))
    }

    /// The handles of requests not yet answered. A handle is looked up
    /// here before it is read, so that one answered twice (a reject after
    /// an accept, a second reject) or never handed out is refused instead
    /// of read after it was freed: the application's copy of the info
    /// keeps the handle after the answer ended it.
    fn live() -> std::sync::MutexGuard<'static, BTreeSet<usize>> {
        static LIVE: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());
        lock(&LIVE)
    }

    /// `req` boxed as a handle for an info, known as live until taken.
    fn hand_out(req: ConnReq) -> *mut ConnReq {
        let h = Box::into_raw(Box::new(req));
        ConnReq::live().insert(h as usize);
        h
    }

    /// The request behind a `handle`, as a box that frees it when dropped:
    /// answering a request ends it. A handle that is not live is
    /// `-FI_EINVAL`.
    ///
    /// # Safety
    /// `h` is NULL or a handle this provider put in an info.
    pub unsafe fn take(h: fid_t) -> Result<Box<ConnReq>, c_int> {
        if !ConnReq::live().remove(&(h as usize)) {
            return Err(err::EINVAL);
        }
        // SAFETY: live, so a box made by `hand_out` and not yet freed.
        Ok(unsafe { Box::from_raw(h as *mut ConnReq) })
    }

    /// The request behind a live `handle`, borrowed.
    ///
    /// # Safety
    /// As for [`take`](Self::take), and the request is not answered while
    /// the borrow lasts (opening a domain for a request before answering it).
    pub unsafe fn peek<'a>(h: fid_t) -> Option<&'a ConnReq> {
        if !ConnReq::live().contains(&(h as usize)) {
            return None;
        }
        // SAFETY: live, so a box made by `hand_out` and not yet freed.
        Some(unsafe { &*(h as *const ConnReq) })
    }
}

unsafe extern "C" fn close(p: *mut fid) -> c_int {
    guard::call("pep close", || {
        // SAFETY: libfabric calls close through the fid it was given.
        let pep = unsafe { Pep::from_fid(p) }?;
        // SAFETY: a bound EQ is kept open by the count.
        if let Some(eq) = unsafe { pep.eq.load(Ordering::Acquire).as_ref() } {
            eq.remove_listener(pep);
        }
        // SAFETY: the box made in `open`; nothing refers to it any more.
        let pep = unsafe { Box::from_raw(pep as *const Pep as *mut Pep) };
        pep.nic.stop_listening(&pep.discriminator);
        // SAFETY: our copy; the fabric is kept open by the count.
        unsafe {
            fi_freeinfo(pep.info);
            &*pep.fabric
        }
        .refs
        .fetch_sub(1, Ordering::AcqRel);
        Ok(())
    })
}
