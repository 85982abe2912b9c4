//! `fi_getinfo`: one `fi_info` per uvia medium that can do what the hints
//! ask, `-FI_ENODATA` when none can.
//!
//! Each entry is built on the stack as a template and copied with
//! libfabric's `fi_dupinfo`, so the list is libfabric's own allocation and
//! the program frees it with `fi_freeinfo`. What a domain offers: connected
//! endpoints (`FI_EP_MSG`, VIA's VIs) with messages and RDMA read and
//! write; memory registration as verbs asks for it (`FI_MR_LOCAL` and the
//! basic map: virtual addresses, allocated memory, provider keys); 4 bytes
//! of remote CQ data (VIA's immediate data); sizes from the medium's Nic.

use crate::guard;
use crate::medium::{self, Medium};
use crate::prov;
use crate::sys::*;
use std::ffi::{c_char, c_int, CStr, CString};
use std::net::{Ipv4Addr, SocketAddrV4, ToSocketAddrs};
use std::ptr::{null_mut, NonNull};
use uvia::NicAttributes;

/// Primary and secondary capabilities of every domain.
pub const CAPS: u64 = FI_MSG
    | FI_RMA
    | FI_READ
    | FI_WRITE
    | FI_SEND
    | FI_RECV
    | FI_REMOTE_READ
    | FI_REMOTE_WRITE
    | FI_LOCAL_COMM
    | FI_REMOTE_COMM;
const TX_CAPS: u64 = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_SEND;
const RX_CAPS: u64 = FI_MSG | FI_RMA | FI_RECV | FI_REMOTE_READ | FI_REMOTE_WRITE;
const DOMAIN_CAPS: u64 = FI_LOCAL_COMM | FI_REMOTE_COMM;

/// The memory registration modes required, as verbs reports them.
pub const MR_MODE: c_int =
    (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY) as c_int;

/// Messages of a VI are delivered in the order they were sent.
const MSG_ORDER: u64 = FI_ORDER_SAS;
/// A queue's completions come back in the order its operations were posted.
const COMP_ORDER: u64 = FI_ORDER_STRICT;

/// Bytes of remote CQ data: VIA's 32-bit immediate data.
pub const CQ_DATA_SIZE: usize = 4;
/// Bytes of a remote key: a uvia memory handle.
pub const MR_KEY_SIZE: usize = 4;
/// Queue depth given when the hints name none.
const DEFAULT_QUEUE: usize = 256;

/// The source and destination the caller named.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Addresses {
    pub src: Option<SocketAddrV4>,
    pub dest: Option<SocketAddrV4>,
}

/// The provider's getinfo.
pub unsafe extern "C" fn getinfo(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    flags: u64,
    hints: *const fi_info,
    info: *mut *mut fi_info,
) -> c_int {
    guard::call("getinfo", || {
        if info.is_null() {
            return Err(err::EINVAL);
        }
        // SAFETY: libfabric passes NUL-terminated strings or NULL, and hints
        // that are NULL or a valid fi_info (with its attribute structs).
        let (node, service, hints) = unsafe {
            (
                (!node.is_null()).then(|| CStr::from_ptr(node)),
                (!service.is_null()).then(|| CStr::from_ptr(service)),
                hints.as_ref().map(|h| Hints::new(h)),
            )
        };
        let list = list(version, node, service, flags, hints.as_ref())?;
        // SAFETY: checked non-NULL above.
        unsafe { *info = list };
        Ok(())
    })
}

/// The hints with their attribute structs, each `None` where NULL.
pub struct Hints<'a> {
    pub info: &'a fi_info,
    pub tx: Option<&'a fi_tx_attr>,
    pub rx: Option<&'a fi_rx_attr>,
    pub ep: Option<&'a fi_ep_attr>,
    pub domain: Option<&'a fi_domain_attr>,
    pub fabric: Option<&'a fi_fabric_attr>,
}

impl<'a> Hints<'a> {
    /// # Safety
    /// Every attribute pointer of `info` is NULL or valid for `'a`.
    pub unsafe fn new(info: &'a fi_info) -> Hints<'a> {
        // SAFETY: per the contract.
        unsafe {
            Hints {
                info,
                tx: info.tx_attr.as_ref(),
                rx: info.rx_attr.as_ref(),
                ep: info.ep_attr.as_ref(),
                domain: info.domain_attr.as_ref(),
                fabric: info.fabric_attr.as_ref(),
            }
        }
    }
}

/// The list getinfo returns, or `-FI_ENODATA`.
fn list(
    version: u32,
    node: Option<&CStr>,
    service: Option<&CStr>,
    flags: u64,
    hints: Option<&Hints>,
) -> Result<*mut fi_info, c_int> {
    if prov::settings().refused {
        return Err(-(FI_ENODATA as c_int));
    }
    // A domain the hints name is listed even where it is not by default
    // (an xdp domain).
    let asked = hints
        .and_then(|h| h.domain)
        .filter(|d| !d.name.is_null())
        // SAFETY: a NUL-terminated name.
        .map(|d| unsafe { CStr::from_ptr(d.name) }.to_string_lossy());
    // Reliable datagrams: the provider's own endpoints, on shm, listed
    // first; not to a utility provider looking for a core to layer on
    // (which asks for other types). A node or service is no address of
    // theirs (their names come from fi_getname, through the program's own
    // exchange, as fi_pingpong's): not looked at.
    let layering = flags & OFI_CORE_PROV_ONLY != 0;
    let ep_type = hints.and_then(|h| h.ep).map_or(FI_EP_UNSPEC, |e| e.type_);
    let mut rdm = None;
    if !layering && matches!(ep_type, FI_EP_UNSPEC | FI_EP_RDM) {
        match crate::rdm::info::entry(version, hints, asked.as_deref()) {
            Ok(e) => rdm = Some(NonNull::new(e).ok_or(err::ENOMEM)?),
            Err(e) if ep_type == FI_EP_RDM => return Err(e),
            Err(_) => {}
        }
    }
    if ep_type == FI_EP_RDM {
        return rdm.map(|e| e.as_ptr()).ok_or(err::ENODATA);
    }
    let rest = msg_list(
        version,
        node,
        service,
        flags,
        hints,
        asked.as_deref(),
        layering,
    );
    match (rdm, rest) {
        (Some(e), Ok(r)) => {
            // SAFETY: a fresh entry of ours, not chained.
            unsafe { (*e.as_ptr()).next = r };
            Ok(e.as_ptr())
        }
        (Some(e), Err(_)) => Ok(e.as_ptr()),
        (None, r) => r,
    }
}

/// A utility provider's `fi_getinfo` for the core it layers on
/// (`ofi_rxm` over connected endpoints) carries this flag (libfabric's
/// internal `OFI_CORE_PROV_ONLY`, bit 59) down to the core's getinfo.
const OFI_CORE_PROV_ONLY: u64 = 1 << 59;

/// The connected endpoints' entries: one per medium that can meet the
/// hints. The shm domain is not offered to a utility provider unless
/// `FI_UVIA_RXM_SHM` says so: on shm, reliable datagrams are the
/// provider's own.
fn msg_list(
    version: u32,
    node: Option<&CStr>,
    service: Option<&CStr>,
    flags: u64,
    hints: Option<&Hints>,
    asked: Option<&str>,
    layering: bool,
) -> Result<*mut fi_info, c_int> {
    let addrs = addresses(node, service, flags, hints)?;
    if let Some(h) = hints {
        check_common(version, h)?;
    }
    let mut entries: Vec<NonNull<fi_info>> = Vec::new();
    for medium in Medium::listed(prov::settings().domain.as_deref(), asked) {
        // Only the domain named, when one is: the others' Nics stay unopened.
        if asked.is_some_and(|a| a != medium.name()) {
            continue;
        }
        if layering && medium == Medium::Shm && !prov::settings().rxm_shm {
            continue;
        }
        if addrs.dest.is_some_and(|d| !medium.reaches(d)) {
            continue;
        }
        let Some(src) = medium.source(addrs.src, addrs.dest) else {
            continue;
        };
        let Some(attrs) = medium.attributes() else {
            continue;
        };
        if hints.is_some_and(|h| !fits(h, &attrs)) {
            continue;
        }
        let addrs = Addresses {
            src: Some(src),
            dest: addrs.dest,
        };
        match NonNull::new(build(version, &medium, &attrs, addrs, hints)) {
            Some(e) => entries.push(e),
            None => {
                free(entries);
                return Err(err::ENOMEM);
            }
        }
    }
    // Chain the entries; the first is the list.
    for w in entries.windows(2) {
        // SAFETY: both are live fi_infos from fi_dupinfo, owned here.
        unsafe { (*w[0].as_ptr()).next = w[1].as_ptr() };
    }
    entries.first().map(|e| e.as_ptr()).ok_or(err::ENODATA)
}

fn free(entries: Vec<NonNull<fi_info>>) {
    for e in entries {
        // SAFETY: each came from fi_dupinfo and is not chained.
        unsafe { fi_freeinfo(e.as_ptr()) };
    }
}

/// Source and destination from node, service, `FI_SOURCE` and the hints'
/// addresses. A node and service are the destination unless `FI_SOURCE` is
/// given or there is no node (a service alone is a local port to listen
/// on). Only IPv4 socket addresses are taken.
fn addresses(
    node: Option<&CStr>,
    service: Option<&CStr>,
    flags: u64,
    hints: Option<&Hints>,
) -> Result<Addresses, c_int> {
    if let Some(h) = hints {
        let f = h.info.addr_format;
        if f != FI_FORMAT_UNSPEC && f != FI_SOCKADDR && f != FI_SOCKADDR_IN {
            return Err(err::ENODATA);
        }
    }
    let port = match service {
        None => 0,
        Some(s) => s
            .to_str()
            .ok()
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or(err::ENODATA)?,
    };
    let ip = match node {
        None => None,
        Some(n) => Some(resolve(n.to_str().map_err(|_| err::ENODATA)?)?),
    };
    let mut a = Addresses::default();
    if node.is_some() || service.is_some() {
        let named = SocketAddrV4::new(ip.unwrap_or(Ipv4Addr::UNSPECIFIED), port);
        if flags & FI_SOURCE != 0 || node.is_none() {
            a.src = Some(named);
        } else {
            a.dest = Some(named);
        }
    }
    if let Some(h) = hints {
        let i = h.info;
        // SAFETY: the hints' address pointers are NULL or valid for their
        // stated lengths.
        let (src, dest) = unsafe {
            (
                medium::read_sockaddr_in(i.src_addr, i.src_addrlen),
                medium::read_sockaddr_in(i.dest_addr, i.dest_addrlen),
            )
        };
        if (!i.src_addr.is_null() && src.is_none()) || (!i.dest_addr.is_null() && dest.is_none()) {
            return Err(err::ENODATA);
        }
        a.src = a.src.or(src);
        a.dest = a.dest.or(dest);
    }
    Ok(a)
}

/// The first IPv4 address of a host name or address.
fn resolve(node: &str) -> Result<Ipv4Addr, c_int> {
    if let Ok(ip) = node.parse::<Ipv4Addr>() {
        return Ok(ip);
    }
    (node, 0)
        .to_socket_addrs()
        .map_err(|_| err::ENODATA)?
        .find_map(|a| match a {
            std::net::SocketAddr::V4(v4) => Some(*v4.ip()),
            std::net::SocketAddr::V6(_) => None,
        })
        .ok_or(err::ENODATA)
}

/// The checks that do not depend on the medium.
fn check_common(version: u32, h: &Hints) -> Result<(), c_int> {
    let none = Err(err::ENODATA);
    if h.info.caps & !CAPS != 0 {
        return none;
    }
    if h.ep
        .is_some_and(|ep| ep.type_ != FI_EP_UNSPEC && ep.type_ != FI_EP_MSG)
        || !any_type_fits(h)
    {
        return none;
    }
    if let Some(d) = h.domain {
        if d.caps & !DOMAIN_CAPS != 0 || d.cq_data_size > CQ_DATA_SIZE || d.mr_key_size > 8 {
            return none;
        }
        if !mr_mode_fits(version, h.info.mode, d.mr_mode) {
            return none;
        }
        if d.mr_iov_limit > 1 || d.max_ep_stx_ctx > 0 || d.max_ep_srx_ctx > 0 {
            return none;
        }
    } else if version_lt(version, API_1_5) && h.info.mode & FI_LOCAL_MR == 0 {
        return none;
    }
    if let Some(tx) = h.tx {
        if tx.caps & !TX_CAPS != 0
            || tx.msg_order & !MSG_ORDER != 0
            || tx.comp_order & !COMP_ORDER != 0
        {
            return none;
        }
        if tx.rma_iov_limit > 1 {
            return none;
        }
    }
    if let Some(rx) = h.rx {
        if rx.caps & !RX_CAPS != 0
            || rx.msg_order & !MSG_ORDER != 0
            || rx.comp_order & !COMP_ORDER != 0
        {
            return none;
        }
        if rx.op_flags & FI_MULTI_RECV != 0 {
            return none;
        }
    }
    Ok(())
}

/// The checks every endpoint type's entry makes: no protocol or
/// authorization key asked for, one transmit and one receive context per
/// endpoint (none shared), this provider's fabric, manual progress.
pub fn any_type_fits(h: &Hints) -> bool {
    if let Some(ep) = h.ep {
        if ep.protocol != FI_PROTO_UNSPEC || ep.auth_key_size != 0 {
            return false;
        }
        if ep.tx_ctx_cnt > 1 || ep.rx_ctx_cnt > 1 {
            return false;
        }
    }
    if let Some(f) = h.fabric {
        // SAFETY: a NUL-terminated name or NULL.
        if !f.name.is_null() && unsafe { CStr::from_ptr(f.name) } != prov::NAME {
            return false;
        }
    }
    let manual = |p: fi_progress| p == FI_PROGRESS_UNSPEC || p == FI_PROGRESS_MANUAL;
    h.domain
        .is_none_or(|d| manual(d.data_progress) && manual(d.control_progress))
}

/// True if a program that says `user` (mr_mode) and `mode` can use the
/// domain's registration: it must register local buffers, and take the
/// basic map (or name no mode and take ours).
fn mr_mode_fits(version: u32, mode: u64, user: c_int) -> bool {
    let local = user & FI_MR_LOCAL as c_int != 0 || mode & FI_LOCAL_MR != 0;
    if version_lt(version, API_1_5) {
        return local && (user == FI_MR_UNSPEC as c_int || user == FI_MR_BASIC as c_int);
    }
    if user & FI_MR_BASIC as c_int != 0 {
        return local && user & !(FI_MR_BASIC as c_int) == 0;
    }
    if user & FI_MR_SCALABLE as c_int != 0 {
        return false;
    }
    local && (user == FI_MR_UNSPEC as c_int || user & MR_MODE == MR_MODE)
}

/// The checks against a medium's limits (its name is checked before).
fn fits(h: &Hints, a: &NicAttributes) -> bool {
    let depth = a.max_queue_depth as usize;
    if let Some(d) = h.domain {
        if d.mr_cnt > a.max_registered_regions {
            return false;
        }
    }
    if let Some(ep) = h.ep {
        if ep.max_msg_size > a.max_transfer_size as usize {
            return false;
        }
    }
    if let Some(tx) = h.tx {
        if tx.size > depth
            || tx.iov_limit > a.max_segments_per_desc
            || tx.inject_size > crate::inject::INJECT_SIZE
        {
            return false;
        }
    }
    if let Some(rx) = h.rx {
        if rx.size > depth || rx.iov_limit > a.max_segments_per_desc {
            return false;
        }
    }
    true
}

/// `v` if the hints named it (non-zero), else `default`.
fn asked<T: PartialEq + Default>(v: Option<T>, default: T) -> T {
    v.filter(|v| *v != T::default()).unwrap_or(default)
}

/// One entry, copied with `fi_dupinfo` (NULL if that fails).
fn build(
    version: u32,
    medium: &Medium,
    a: &NicAttributes,
    addrs: Addresses,
    hints: Option<&Hints>,
) -> *mut fi_info {
    let depth = a.max_queue_depth as usize;
    let segs = a.max_segments_per_desc;
    let mut tx = fi_tx_attr {
        caps: TX_CAPS,
        mode: 0,
        op_flags: hints.and_then(|h| h.tx).map_or(0, |t| t.op_flags),
        msg_order: MSG_ORDER,
        comp_order: asked(
            hints.and_then(|h| h.tx).map(|t| t.comp_order),
            FI_ORDER_NONE,
        ),
        inject_size: crate::inject::INJECT_SIZE,
        size: asked(
            hints.and_then(|h| h.tx).map(|t| t.size),
            DEFAULT_QUEUE.min(depth),
        ),
        iov_limit: segs,
        rma_iov_limit: 1,
        tclass: 0,
    };
    let mut rx = fi_rx_attr {
        caps: RX_CAPS,
        mode: 0,
        op_flags: hints.and_then(|h| h.rx).map_or(0, |r| r.op_flags),
        msg_order: MSG_ORDER,
        comp_order: asked(
            hints.and_then(|h| h.rx).map(|r| r.comp_order),
            FI_ORDER_NONE,
        ),
        total_buffered_recv: 0,
        size: asked(
            hints.and_then(|h| h.rx).map(|r| r.size),
            DEFAULT_QUEUE.min(depth),
        ),
        iov_limit: segs,
    };
    let mut ep = fi_ep_attr {
        type_: FI_EP_MSG,
        protocol: FI_PROTO_UNSPEC,
        protocol_version: 1,
        max_msg_size: a.max_transfer_size as usize,
        msg_prefix_size: 0,
        max_order_raw_size: 0,
        max_order_war_size: 0,
        max_order_waw_size: 0,
        mem_tag_format: 0,
        tx_ctx_cnt: 1,
        rx_ctx_cnt: 1,
        auth_key_size: 0,
        auth_key: null_mut(),
    };
    // A name with a NUL in it cannot come from `Medium::name`.
    let domain_name = CString::new(medium.name()).unwrap_or_default();
    let old_mr = version_lt(version, API_1_5);
    let mut domain = fi_domain_attr {
        domain: null_mut(),
        name: domain_name.as_ptr() as *mut c_char,
        threading: FI_THREAD_SAFE,
        control_progress: FI_PROGRESS_MANUAL,
        data_progress: FI_PROGRESS_MANUAL,
        resource_mgmt: FI_RM_ENABLED,
        av_type: FI_AV_UNSPEC,
        mr_mode: if old_mr {
            FI_MR_BASIC as c_int
        } else {
            MR_MODE
        },
        mr_key_size: MR_KEY_SIZE,
        cq_data_size: CQ_DATA_SIZE,
        cq_cnt: 1 << 12,
        ep_cnt: 1 << 12,
        tx_ctx_cnt: 1 << 12,
        rx_ctx_cnt: 1 << 12,
        max_ep_tx_ctx: 1,
        max_ep_rx_ctx: 1,
        max_ep_stx_ctx: 0,
        max_ep_srx_ctx: 0,
        cntr_cnt: 0,
        mr_iov_limit: 1,
        caps: DOMAIN_CAPS,
        mode: 0,
        auth_key: null_mut(),
        auth_key_size: 0,
        max_err_data: uvia::MAX_PRIVATE_DATA,
        mr_cnt: a.max_registered_regions,
        tclass: 0,
    };
    let mut fabric = fi_fabric_attr {
        fabric: null_mut(),
        name: prov::NAME.as_ptr() as *mut c_char,
        // libfabric fills in the provider's name and version itself.
        prov_name: null_mut(),
        prov_version: 0,
        api_version: version,
    };
    let mut src = addrs.src.map(medium::sockaddr_in);
    let mut dest = addrs.dest.map(medium::sockaddr_in);
    let sin_len = std::mem::size_of::<libc::sockaddr_in>();
    let template = fi_info {
        next: null_mut(),
        caps: CAPS,
        mode: if old_mr { FI_LOCAL_MR } else { 0 },
        addr_format: FI_SOCKADDR_IN,
        src_addrlen: if src.is_some() { sin_len } else { 0 },
        dest_addrlen: if dest.is_some() { sin_len } else { 0 },
        src_addr: src.as_mut().map_or(null_mut(), |s| s as *mut _ as *mut _),
        dest_addr: dest.as_mut().map_or(null_mut(), |d| d as *mut _ as *mut _),
        handle: null_mut(),
        tx_attr: &mut tx,
        rx_attr: &mut rx,
        ep_attr: &mut ep,
        domain_attr: &mut domain,
        fabric_attr: &mut fabric,
        nic: null_mut(),
    };
    // SAFETY: the template and everything it points to live until the
    // call returns; fi_dupinfo copies them (strings and addresses too).
    unsafe { fi_dupinfo(&template) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hints_with(
        f: impl FnOnce(&mut fi_info, &mut fi_ep_attr, &mut fi_domain_attr),
    ) -> Option<usize> {
        // Connected endpoints unless `f` says otherwise.
        let mut ep = fi_ep_attr {
            type_: FI_EP_MSG,
            ..Default::default()
        };
        let mut domain = fi_domain_attr {
            mr_mode: FI_MR_LOCAL as c_int | MR_MODE,
            ..Default::default()
        };
        let mut info = fi_info::default();
        f(&mut info, &mut ep, &mut domain);
        info.ep_attr = &mut ep;
        info.domain_attr = &mut domain;
        // SAFETY: the attribute structs outlive the hints.
        let h = unsafe { Hints::new(&info) };
        let list = list(FI_VERSION_17, None, None, 0, Some(&h)).ok()?;
        let mut n = 0;
        let mut cur = list;
        while !cur.is_null() {
            n += 1;
            // SAFETY: a list getinfo built.
            cur = unsafe { (*cur).next };
        }
        // SAFETY: the list came from fi_dupinfo.
        unsafe { fi_freeinfo(list) };
        Some(n)
    }

    const FI_VERSION_17: u32 = version(1, 17);

    #[test]
    fn hints_it_can_meet_list_every_medium() {
        let every = Some(Medium::listed(None, None).len());
        assert_eq!(hints_with(|_, _, _| {}), every);
        // Any endpoint type: the reliable datagrams on shm too, first.
        assert_eq!(
            hints_with(|_, e, _| e.type_ = FI_EP_UNSPEC),
            every.map(|n| n + 1)
        );
        assert_eq!(hints_with(|_, e, _| e.type_ = FI_EP_RDM), Some(1));
        assert_eq!(
            hints_with(|i, e, _| {
                i.caps = FI_MSG | FI_RMA;
                e.type_ = FI_EP_MSG;
            }),
            every
        );
    }

    #[test]
    fn hints_it_cannot_meet_list_nothing() {
        assert_eq!(
            hints_with(|i, e, _| {
                i.caps = FI_TAGGED;
                e.type_ = FI_EP_MSG;
            }),
            None
        );
        assert_eq!(
            hints_with(|i, e, _| {
                i.caps = FI_RMA;
                e.type_ = FI_EP_RDM;
            }),
            None,
            "reliable datagrams without RMA"
        );
        assert_eq!(hints_with(|_, e, _| e.type_ = FI_EP_DGRAM), None);
        assert_eq!(
            hints_with(|_, e, _| e.rx_ctx_cnt = FI_SHARED_CONTEXT as usize),
            None
        );
        assert_eq!(hints_with(|_, e, _| e.max_msg_size = usize::MAX), None);
        assert_eq!(
            hints_with(|_, _, d| d.mr_mode = 0),
            None,
            "without FI_MR_LOCAL"
        );
        assert_eq!(
            hints_with(|_, _, d| d.mr_mode = FI_MR_LOCAL as c_int),
            None,
            "without the basic map"
        );
        assert_eq!(
            hints_with(|_, _, d| d.data_progress = FI_PROGRESS_AUTO),
            None
        );
        assert_eq!(hints_with(|_, _, d| d.cq_data_size = 8), None);
        assert_eq!(hints_with(|i, _, _| i.addr_format = FI_SOCKADDR_IN6), None);
    }

    #[test]
    fn mr_modes() {
        let v = FI_VERSION_17;
        assert!(mr_mode_fits(v, 0, MR_MODE));
        assert!(mr_mode_fits(v, 0, MR_MODE | FI_MR_ENDPOINT as c_int));
        assert!(mr_mode_fits(v, FI_LOCAL_MR, FI_MR_BASIC as c_int));
        assert!(
            !mr_mode_fits(v, 0, FI_MR_BASIC as c_int),
            "basic, but no local registration"
        );
        assert!(!mr_mode_fits(v, FI_LOCAL_MR, FI_MR_SCALABLE as c_int));
        assert!(mr_mode_fits(
            version(1, 4),
            FI_LOCAL_MR,
            FI_MR_BASIC as c_int
        ));
    }

    #[test]
    fn node_and_service() {
        let a = addresses(Some(c"127.0.0.1"), Some(c"9228"), 0, None).unwrap();
        assert_eq!(a.dest, Some("127.0.0.1:9228".parse().unwrap()));
        let a = addresses(Some(c"127.0.0.1"), Some(c"9228"), FI_SOURCE, None).unwrap();
        assert_eq!(
            (a.src, a.dest),
            (Some("127.0.0.1:9228".parse().unwrap()), None)
        );
        let a = addresses(None, Some(c"9228"), 0, None).unwrap();
        assert_eq!(a.src, Some("0.0.0.0:9228".parse().unwrap()));
        assert_eq!(
            addresses(None, Some(c"not-a-port"), 0, None),
            Err(err::ENODATA)
        );
    }
}
