//! The ops the provider does not offer, as libfabric's `fi_no_*` stubs:
//! each returns `-FI_ENOSYS`. libfabric's inline calls jump through the
//! tables without a NULL check, so every slot of every table the provider
//! hands out is filled, with one of these where nothing better exists.
//! They touch nothing and cannot panic, so they need no guard.

use crate::sys::*;
use std::ffi::{c_char, c_int, c_void};

/// Declares functions of the given signatures that return `-FI_ENOSYS`.
macro_rules! nosys {
    ($(fn $name:ident($($arg:ty),*) -> $ret:ty;)*) => {
        $(
            pub unsafe extern "C" fn $name($(_: $arg),*) -> $ret {
                -(FI_ENOSYS as $ret)
            }
        )*
    };
}

nosys! {
    // fi_ops (every fid)
    fn bind(*mut fid, *mut fid, u64) -> c_int;
    fn control(*mut fid, c_int, *mut c_void) -> c_int;
    fn ops_open(*mut fid, *const c_char, u64, *mut *mut c_void, *mut c_void) -> c_int;
    fn tostr(*const fid, *mut c_char, usize) -> c_int;
    fn ops_set(*mut fid, *const c_char, u64, *mut c_void, *mut c_void) -> c_int;

    // fi_ops_fabric
    fn passive_ep(*mut fid_fabric, *mut fi_info, *mut *mut fid_pep, *mut c_void) -> c_int;
    fn eq_open(*mut fid_fabric, *mut fi_eq_attr, *mut *mut fid_eq, *mut c_void) -> c_int;
    fn wait_open(*mut fid_fabric, *mut fi_wait_attr, *mut *mut fid_wait) -> c_int;
    fn trywait(*mut fid_fabric, *mut *mut fid, c_int) -> c_int;
    fn domain2(*mut fid_fabric, *mut fi_info, *mut *mut fid_domain, u64, *mut c_void) -> c_int;

    // fi_ops_domain
    fn av_open(*mut fid_domain, *mut fi_av_attr, *mut *mut fid_av, *mut c_void) -> c_int;
    fn cq_open(*mut fid_domain, *mut fi_cq_attr, *mut *mut fid_cq, *mut c_void) -> c_int;
    fn endpoint(*mut fid_domain, *mut fi_info, *mut *mut fid_ep, *mut c_void) -> c_int;
    fn scalable_ep(*mut fid_domain, *mut fi_info, *mut *mut fid_ep, *mut c_void) -> c_int;
    fn cntr_open(*mut fid_domain, *mut fi_cntr_attr, *mut *mut fid_cntr, *mut c_void) -> c_int;
    fn poll_open(*mut fid_domain, *mut fi_poll_attr, *mut *mut fid_poll) -> c_int;
    fn stx_ctx(*mut fid_domain, *mut fi_tx_attr, *mut *mut fid_stx, *mut c_void) -> c_int;
    fn srx_ctx(*mut fid_domain, *mut fi_rx_attr, *mut *mut fid_ep, *mut c_void) -> c_int;
    fn query_atomic(*mut fid_domain, fi_datatype, fi_op, *mut fi_atomic_attr, u64) -> c_int;
    fn query_collective(*mut fid_domain, fi_collective_op, *mut fi_collective_attr, u64) -> c_int;
    fn endpoint2(*mut fid_domain, *mut fi_info, *mut *mut fid_ep, u64, *mut c_void) -> c_int;

    // fi_ops_mr
    fn mr_reg(*mut fid, *const c_void, usize, u64, u64, u64, u64, *mut *mut fid_mr, *mut c_void) -> c_int;
    fn mr_regv(*mut fid, *const iovec, usize, u64, u64, u64, u64, *mut *mut fid_mr, *mut c_void) -> c_int;
    fn mr_regattr(*mut fid, *const fi_mr_attr, u64, *mut *mut fid_mr) -> c_int;
}
