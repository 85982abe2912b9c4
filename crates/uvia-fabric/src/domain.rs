//! The domain object: one opened uvia Nic (the medium the domain is named
//! after) and the protection tag its endpoints and registrations share.

use crate::drive::Driver;
use crate::fabric::Fabric;
use crate::guard;
use crate::medium::{self, Medium};
use crate::mr::Unshared;
use crate::nosys;
use crate::pep::ConnReq;
use crate::prov;
use crate::sys::*;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use uvia::{MemHandle, Nic, NicOptions, Ptag, Segment};

/// A domain. `#[repr(C)]` with libfabric's `fid_domain` first.
#[repr(C)]
pub struct Domain {
    pub fid: fid_domain,
    pub fabric: *const Fabric,
    pub medium: Medium,
    pub nic: Nic,
    /// One tag for every VI and region of the domain: libfabric has no
    /// protection domains below the domain.
    pub ptag: Ptag,
    /// Its endpoints' VIs, driven between the program's calls where the
    /// Nic needs it.
    pub driver: Driver,
    /// Messages longer than this from a registered region make its pages
    /// shared with peers first (`share`): the Nic's `shared_window_from`,
    /// `None` where no peer maps memory or `FI_UVIA_SHARE_MR=0`.
    pub share_from: Option<usize>,
    /// Receives this long or longer have their regions shared too (the
    /// Nic's `shared_copy_from`): the sender writes its part of the copy
    /// into a mapping of them.
    pub share_recv_from: Option<usize>,
    /// Its regions whose pages are to be shared with peers on first need,
    /// until they are.
    pub unshared: Unshared,
    /// Objects opened on it and not yet closed; it closes only at zero.
    pub refs: AtomicUsize,
    /// Opened for reliable datagrams (`FI_EP_RDM`): its endpoints, CQs,
    /// AVs and counters are those of `rdm`.
    pub rdm: bool,
}

/// Whether `d` is a domain opened for reliable datagrams.
///
/// # Safety
/// As [`Domain::from_fid`].
unsafe fn is_rdm(d: *mut fid_domain) -> Result<bool, c_int> {
    // SAFETY: per the contract.
    Ok(unsafe { Domain::from_fid(d) }?.rdm)
}

unsafe extern "C" fn av_open(
    d: *mut fid_domain,
    attr: *mut fi_av_attr,
    av: *mut *mut fid_av,
    context: *mut c_void,
) -> c_int {
    // SAFETY: forwarded as libfabric passed them.
    unsafe {
        match is_rdm(d) {
            Ok(true) => crate::rdm::av::open(d, attr, av, context),
            Ok(false) => nosys::av_open(d, attr, av, context),
            Err(e) => e,
        }
    }
}

unsafe extern "C" fn cq_open(
    d: *mut fid_domain,
    attr: *mut fi_cq_attr,
    cq: *mut *mut fid_cq,
    context: *mut c_void,
) -> c_int {
    // SAFETY: forwarded as libfabric passed them.
    unsafe {
        match is_rdm(d) {
            Ok(true) => crate::rdm::cq::open(d, attr, cq, context),
            Ok(false) => crate::cq::open(d, attr, cq, context),
            Err(e) => e,
        }
    }
}

unsafe extern "C" fn endpoint(
    d: *mut fid_domain,
    info: *mut fi_info,
    ep: *mut *mut fid_ep,
    context: *mut c_void,
) -> c_int {
    // SAFETY: forwarded as libfabric passed them.
    unsafe {
        match is_rdm(d) {
            Ok(true) => crate::rdm::open(d, info, ep, context),
            Ok(false) => crate::ep::open(d, info, ep, context),
            Err(e) => e,
        }
    }
}

unsafe extern "C" fn cntr_open(
    d: *mut fid_domain,
    attr: *mut fi_cntr_attr,
    cntr: *mut *mut fid_cntr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: forwarded as libfabric passed them.
    unsafe {
        match is_rdm(d) {
            Ok(true) => crate::rdm::cntr::open(d, attr, cntr, context),
            Ok(false) => nosys::cntr_open(d, attr, cntr, context),
            Err(e) => e,
        }
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

static OPS: fi_ops_domain = fi_ops_domain {
    size: std::mem::size_of::<fi_ops_domain>(),
    av_open: Some(av_open),
    cq_open: Some(cq_open),
    endpoint: Some(endpoint),
    scalable_ep: Some(nosys::scalable_ep),
    cntr_open: Some(cntr_open),
    poll_open: Some(nosys::poll_open),
    stx_ctx: Some(nosys::stx_ctx),
    srx_ctx: Some(nosys::srx_ctx),
    query_atomic: Some(nosys::query_atomic),
    query_collective: Some(nosys::query_collective),
    endpoint2: Some(nosys::endpoint2),
};

/// `fi_domain` for this provider: opens a Nic on the medium the info's
/// domain names, at its source address.
pub unsafe extern "C" fn open(
    fabric: *mut fid_fabric,
    info: *mut fi_info,
    domain: *mut *mut fid_domain,
    context: *mut c_void,
) -> c_int {
    guard::call("domain", || {
        // SAFETY: libfabric passes the fabric it was given and an fi_info.
        let f = unsafe { Fabric::from_fid(fabric) }?;
        let info = unsafe { info.as_ref() }.ok_or(err::EINVAL)?;
        if domain.is_null() {
            return Err(err::EINVAL);
        }
        // SAFETY: the info's attribute pointers are NULL or valid.
        let attr = unsafe { info.domain_attr.as_ref() }.ok_or(err::EINVAL)?;
        let medium = if attr.name.is_null() {
            Medium::listed(prov::settings().domain.as_deref(), None)[0].clone()
        } else {
            // SAFETY: a NUL-terminated name.
            let name = unsafe { CStr::from_ptr(attr.name) };
            Medium::parse(&name.to_string_lossy()).ok_or(err::ENODEV)?
        };
        // SAFETY: the source address is valid for its stated length.
        let src = unsafe { medium::read_sockaddr_in(info.src_addr, info.src_addrlen) };
        // The source's port is a listener's; the domain's Nic takes any.
        let src = src.map(|a| std::net::SocketAddrV4::new(*a.ip(), 0));
        let opts = NicOptions {
            inject: prov::settings().inject.clone(),
            ..NicOptions::default()
        };
        // A domain opened for a connection request uses the listener's Nic:
        // the endpoint that accepts must live where the request arrived.
        // SAFETY: a handle this provider put in the info, or none.
        let nic = match unsafe { ConnReq::peek(info.handle) } {
            Some(req) => req.nic.clone(),
            None => {
                let name = medium.nic_name(src);
                medium.open_nic(&name, &opts).map_err(|e| {
                    eprintln!("libfabric:uvia: opening the domain's Nic {name:?}: {e}");
                    match e {
                        uvia::OpenError::BadAddress { .. } | uvia::OpenError::BadInject(_) => {
                            err::EINVAL
                        }
                        _ => err::ENODEV,
                    }
                })?
            }
        };
        let ptag = nic.create_ptag().map_err(|_| err::ENOMEM)?;
        let share_from = nic
            .attributes()
            .shared_window_from
            .filter(|_| prov::settings().share_mr);
        let share_recv_from = nic
            .attributes()
            .shared_copy_from
            .filter(|_| share_from.is_some());
        let driver = Driver::new(
            nic.attributes().needs_driving,
            prov::settings().drive_thread,
        );
        let d = Box::new(Domain {
            fid: fid_domain {
                fid: fid {
                    fclass: FI_CLASS_DOMAIN as usize,
                    context,
                    ops: &FI_OPS as *const fi_ops as *mut fi_ops,
                },
                ops: &OPS as *const fi_ops_domain as *mut fi_ops_domain,
                mr: &crate::mr::OPS as *const fi_ops_mr as *mut fi_ops_mr,
            },
            fabric: f,
            medium,
            nic,
            ptag,
            driver,
            share_from,
            share_recv_from,
            unshared: Unshared::default(),
            refs: AtomicUsize::new(0),
            // SAFETY: the info's attribute pointers are NULL or valid.
            rdm: unsafe { info.ep_attr.as_ref() }.is_some_and(|e| e.type_ == FI_EP_RDM),
        });
        f.refs.fetch_add(1, Ordering::AcqRel);
        // SAFETY: checked non-NULL above.
        unsafe { *domain = Box::into_raw(d) as *mut fid_domain };
        Ok(())
    })
}

impl Domain {
    /// Shares the regions of `segs`, a send's or an RDMA write's sources,
    /// that have not been yet, before the descriptor that names them is
    /// posted, when the message is one the peer copies out of a mapping of
    /// them (longer than `share_from`).
    pub fn share_sources(&self, segs: &[Segment]) {
        let Some(from) = self.share_from else {
            return;
        };
        if segs.iter().map(|s| s.length as usize).sum::<usize>() <= from {
            return;
        }
        for s in segs.iter().filter(|s| s.length > 0) {
            if let Some(p) = self.unshared.take(s.handle) {
                p.share(&self.nic);
            }
        }
    }

    /// Shares the regions of `segs`, a receive's buffers, when it can take
    /// a message whose copy the sender shares (`share_recv_from`): the
    /// sender then writes its chunks into a mapping of them, not by
    /// cross-memory attach.
    pub fn share_destinations(&self, segs: &[Segment]) {
        let Some(from) = self.share_recv_from else {
            return;
        };
        if segs.iter().map(|s| s.length as usize).sum::<usize>() < from {
            return;
        }
        self.share_regions(segs);
    }

    /// [`share_destinations`](Self::share_destinations) for one buffer of
    /// `len` bytes: inlined into `fi_recv`, where a small receive (every
    /// message of a ping-pong) pays one compare, not a call.
    #[inline]
    pub fn share_destination(&self, buf: *const u8, handle: MemHandle, len: u32) {
        if self
            .share_recv_from
            .is_some_and(|from| len as usize >= from)
        {
            self.share_regions(&[Segment::local(buf, handle, len)]);
        }
    }

    #[cold]
    fn share_regions(&self, segs: &[Segment]) {
        for s in segs.iter().filter(|s| s.length > 0) {
            if let Some(p) = self.unshared.take(s.handle) {
                p.share(&self.nic);
            }
        }
    }

    /// The domain behind a `fid_domain` libfabric hands back.
    ///
    /// # Safety
    /// `d` is NULL or a fid this provider handed out and has not freed.
    pub unsafe fn from_fid<'a>(d: *mut fid_domain) -> Result<&'a Domain, c_int> {
        // SAFETY: per the contract, with the class checked.
        match unsafe { d.as_ref() } {
            Some(d) if d.fid.fclass == FI_CLASS_DOMAIN as usize => {
                Ok(unsafe { &*(d as *const fid_domain as *const Domain) })
            }
            _ => Err(err::EINVAL),
        }
    }
}

unsafe extern "C" fn close(d: *mut fid) -> c_int {
    guard::call("domain close", || {
        // SAFETY: libfabric calls close through the fid it was given.
        let domain = unsafe { Domain::from_fid(d as *mut fid_domain) }?;
        if domain.refs.load(Ordering::Acquire) != 0 {
            return Err(err::EBUSY);
        }
        // SAFETY: the box made in `open`; nothing refers to it any more.
        let domain = unsafe { Box::from_raw(domain as *const Domain as *mut Domain) };
        domain.driver.stop();
        // SAFETY: a domain keeps its fabric open (the count), so it is live.
        unsafe { &*domain.fabric }
            .refs
            .fetch_sub(1, Ordering::AcqRel);
        let _ = domain.nic.destroy_ptag(domain.ptag);
        Ok(())
    })
}
