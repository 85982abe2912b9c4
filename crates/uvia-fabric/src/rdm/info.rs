//! The `fi_info` of the reliable-datagram endpoints: listed for the shm
//! domain when the hints ask for `FI_EP_RDM`.

use super::link::{Name, NAME_LEN};
use super::{INJECT_SIZE, MAX_MSG, TAG_FORMAT};
use crate::info::Hints;
use crate::medium::Medium;
use crate::prov;
use crate::sys::*;
use std::ffi::{c_char, c_int, CString};
use std::ptr::null_mut;

/// What the endpoints offer: messages, tagged or not, with directed
/// receives, between endpoints of the host.
pub const CAPS: u64 =
    FI_MSG | FI_TAGGED | FI_SEND | FI_RECV | FI_DIRECTED_RECV | FI_LOCAL_COMM | FI_REMOTE_COMM;
/// Bytes of remote CQ data a message carries.
const CQ_DATA_SIZE: usize = 8;
/// Gathered sends (copied into one message) take this many buffers.
const TX_IOV_LIMIT: usize = 32;
/// Operations a queue is said to hold: it has no fixed size.
const QUEUE: usize = 4096;

/// The entry for the hints, if the shm domain is listed and can meet them.
pub fn entry(
    version: u32,
    hints: Option<&Hints>,
    asked: Option<&str>,
) -> Result<*mut fi_info, c_int> {
    let none = Err(err::ENODATA);
    let shm = Medium::Shm.name();
    let listed = Medium::listed(prov::settings().domain.as_deref(), asked)
        .iter()
        .any(|m| m.name() == shm);
    if !listed || asked.is_some_and(|a| a != shm) {
        return none;
    }
    let Some(h) = hints else {
        return Ok(build(version, None));
    };
    if h.info.caps & !CAPS != 0 {
        return none;
    }
    // Addresses the hints give are names of these endpoints (a program
    // that got its peer's over its own channel, as fi_pingpong does).
    if h.info.addr_format != FI_FORMAT_UNSPEC
        || !is_name(h.info.src_addr, h.info.src_addrlen)
        || !is_name(h.info.dest_addr, h.info.dest_addrlen)
    {
        return none;
    }
    if !crate::info::any_type_fits(h) || h.ep.is_some_and(|ep| ep.max_msg_size > MAX_MSG) {
        return none;
    }
    if let Some(d) = h.domain {
        if d.cq_data_size > CQ_DATA_SIZE || d.max_ep_stx_ctx > 0 || d.max_ep_srx_ctx > 0 {
            return none;
        }
        if !matches!(d.av_type, FI_AV_UNSPEC | FI_AV_MAP | FI_AV_TABLE) {
            return none;
        }
    }
    if let Some(tx) = h.tx {
        if tx.caps & !CAPS != 0 || tx.inject_size > INJECT_SIZE || tx.iov_limit > TX_IOV_LIMIT {
            return none;
        }
    }
    if let Some(rx) = h.rx {
        if rx.caps & !CAPS != 0 || rx.iov_limit > 1 || rx.op_flags & FI_MULTI_RECV != 0 {
            return none;
        }
    }
    Ok(build(version, Some(h)))
}

/// True for no address, or one that is an endpoint's name.
fn is_name(addr: *mut std::ffi::c_void, len: usize) -> bool {
    if addr.is_null() {
        return true;
    }
    // SAFETY: the hints' address holds `len` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
    len == NAME_LEN && Name::parse(bytes).is_some()
}

/// One entry, copied with `fi_dupinfo` (NULL if that fails). The hints'
/// destination, a name, is kept in it.
fn build(version: u32, h: Option<&Hints>) -> *mut fi_info {
    let caps = h.map_or(0, |h| h.info.caps);
    let caps = if caps != 0 { caps } else { CAPS };
    let mut tx = fi_tx_attr {
        caps: caps & !FI_RECV,
        mode: 0,
        op_flags: h.and_then(|h| h.tx).map_or(0, |t| t.op_flags),
        // A link's records are read in the order they were written: every
        // order the hints ask of messages holds.
        msg_order: FI_ORDER_SAS | h.and_then(|h| h.tx).map_or(0, |t| t.msg_order),
        comp_order: FI_ORDER_NONE,
        inject_size: INJECT_SIZE,
        size: QUEUE,
        iov_limit: TX_IOV_LIMIT,
        rma_iov_limit: 0,
        tclass: 0,
    };
    let mut rx = fi_rx_attr {
        caps: caps & !FI_SEND,
        mode: 0,
        op_flags: h.and_then(|h| h.rx).map_or(0, |r| r.op_flags),
        msg_order: FI_ORDER_SAS | h.and_then(|h| h.rx).map_or(0, |r| r.msg_order),
        comp_order: FI_ORDER_NONE,
        total_buffered_recv: 0,
        size: QUEUE,
        iov_limit: 1,
    };
    let mut ep = fi_ep_attr {
        type_: FI_EP_RDM,
        protocol: FI_PROTO_UNSPEC,
        protocol_version: 1,
        max_msg_size: MAX_MSG,
        msg_prefix_size: 0,
        max_order_raw_size: 0,
        max_order_war_size: 0,
        max_order_waw_size: 0,
        // The program's format where it names one: any 64 bits match.
        mem_tag_format: match h.and_then(|h| h.ep).map_or(0, |e| e.mem_tag_format) {
            0 => TAG_FORMAT,
            f => f,
        },
        tx_ctx_cnt: 1,
        rx_ctx_cnt: 1,
        auth_key_size: 0,
        auth_key: null_mut(),
    };
    let name = CString::new(Medium::Shm.name()).unwrap_or_default();
    let threading = h
        .and_then(|h| h.domain)
        .map_or(FI_THREAD_UNSPEC, |d| d.threading);
    let mut domain = fi_domain_attr {
        domain: null_mut(),
        name: name.as_ptr() as *mut c_char,
        // Every call takes the endpoint's lock: any level asked holds.
        threading: if threading == FI_THREAD_UNSPEC {
            FI_THREAD_SAFE
        } else {
            threading
        },
        control_progress: FI_PROGRESS_MANUAL,
        data_progress: FI_PROGRESS_MANUAL,
        resource_mgmt: FI_RM_ENABLED,
        av_type: h.and_then(|h| h.domain).map_or(FI_AV_UNSPEC, |d| d.av_type),
        // Nothing needs registering: the bytes are copied through rings.
        mr_mode: 0,
        mr_key_size: 0,
        cq_data_size: CQ_DATA_SIZE,
        cq_cnt: 1 << 12,
        ep_cnt: 1 << 12,
        tx_ctx_cnt: 1 << 12,
        rx_ctx_cnt: 1 << 12,
        max_ep_tx_ctx: 1,
        max_ep_rx_ctx: 1,
        max_ep_stx_ctx: 0,
        max_ep_srx_ctx: 0,
        cntr_cnt: 1 << 12,
        mr_iov_limit: 1,
        caps: FI_LOCAL_COMM | FI_REMOTE_COMM,
        mode: 0,
        auth_key: null_mut(),
        auth_key_size: 0,
        max_err_data: 0,
        mr_cnt: 0,
        tclass: 0,
    };
    let mut fabric = fi_fabric_attr {
        fabric: null_mut(),
        name: prov::NAME.as_ptr() as *mut c_char,
        prov_name: null_mut(),
        prov_version: 0,
        api_version: version,
    };
    let mut dest = h
        .map(|h| (h.info.dest_addr, h.info.dest_addrlen))
        .filter(|(a, _)| !a.is_null())
        // SAFETY: checked by `entry` to be a name's NAME_LEN bytes.
        .and_then(|(a, n)| Name::parse(unsafe { std::slice::from_raw_parts(a as *const u8, n) }));
    let template = fi_info {
        next: null_mut(),
        caps,
        mode: 0,
        addr_format: FI_FORMAT_UNSPEC,
        src_addrlen: 0,
        dest_addrlen: dest.map_or(0, |_| NAME_LEN),
        src_addr: null_mut(),
        dest_addr: dest
            .as_mut()
            .map_or(null_mut(), |d| d.0.as_mut_ptr() as *mut _),
        handle: null_mut(),
        tx_attr: &mut tx,
        rx_attr: &mut rx,
        ep_attr: &mut ep,
        domain_attr: &mut domain,
        fabric_attr: &mut fabric,
        nic: null_mut(),
    };
    // SAFETY: the template and everything it points to live until the
    // call returns; fi_dupinfo copies them.
    unsafe { fi_dupinfo(&template) }
}
