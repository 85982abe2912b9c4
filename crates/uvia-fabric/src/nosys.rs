//! The ops the provider does not offer, as libfabric's `fi_no_*` stubs:
//! each returns `-FI_ENOSYS`. libfabric's inline calls jump through the
//! tables without a NULL check, so every slot of every table the provider
//! hands out is filled, with one of these where nothing better exists.
//! They touch nothing and cannot panic, so they need no guard.

// The full set, used or not: a table that gains a slot takes its stub from here.
#![allow(dead_code)]

use crate::sys::*;
use std::ffi::{c_char, c_int, c_void};

// The endpoint, CM, data, EQ and CQ tables' entries below were listed
// from the generated declarations, so their signatures are the headers'.

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

    // fi_ops_ep
    fn ep_cancel(fid_t, *mut c_void) -> isize;
    fn ep_getopt(fid_t, c_int, c_int, *mut c_void, *mut usize) -> c_int;
    fn ep_setopt(fid_t, c_int, c_int, *const c_void, usize) -> c_int;
    fn ep_tx_ctx(*mut fid_ep, c_int, *mut fi_tx_attr, *mut *mut fid_ep, *mut c_void) -> c_int;
    fn ep_rx_ctx(*mut fid_ep, c_int, *mut fi_rx_attr, *mut *mut fid_ep, *mut c_void) -> c_int;
    fn ep_rx_size_left(*mut fid_ep) -> isize;
    fn ep_tx_size_left(*mut fid_ep) -> isize;

    // fi_ops_cm
    fn cm_setname(fid_t, *mut c_void, usize) -> c_int;
    fn cm_getname(fid_t, *mut c_void, *mut usize) -> c_int;
    fn cm_getpeer(*mut fid_ep, *mut c_void, *mut usize) -> c_int;
    fn cm_connect(*mut fid_ep, *const c_void, *const c_void, usize) -> c_int;
    fn cm_listen(*mut fid_pep) -> c_int;
    fn cm_accept(*mut fid_ep, *const c_void, usize) -> c_int;
    fn cm_reject(*mut fid_pep, fid_t, *const c_void, usize) -> c_int;
    fn cm_shutdown(*mut fid_ep, u64) -> c_int;
    fn cm_join(*mut fid_ep, *const c_void, u64, *mut *mut fid_mc, *mut c_void) -> c_int;

    // fi_ops_msg
    fn msg_recv(*mut fid_ep, *mut c_void, usize, *mut c_void, fi_addr_t, *mut c_void) -> isize;
    fn msg_recvv(*mut fid_ep, *const iovec, *mut *mut c_void, usize, fi_addr_t, *mut c_void) -> isize;
    fn msg_recvmsg(*mut fid_ep, *const fi_msg, u64) -> isize;
    fn msg_send(*mut fid_ep, *const c_void, usize, *mut c_void, fi_addr_t, *mut c_void) -> isize;
    fn msg_sendv(*mut fid_ep, *const iovec, *mut *mut c_void, usize, fi_addr_t, *mut c_void) -> isize;
    fn msg_sendmsg(*mut fid_ep, *const fi_msg, u64) -> isize;
    fn msg_inject(*mut fid_ep, *const c_void, usize, fi_addr_t) -> isize;
    fn msg_senddata(*mut fid_ep, *const c_void, usize, *mut c_void, u64, fi_addr_t, *mut c_void) -> isize;
    fn msg_injectdata(*mut fid_ep, *const c_void, usize, u64, fi_addr_t) -> isize;

    // fi_ops_rma
    fn rma_read(*mut fid_ep, *mut c_void, usize, *mut c_void, fi_addr_t, u64, u64, *mut c_void) -> isize;
    fn rma_readv(*mut fid_ep, *const iovec, *mut *mut c_void, usize, fi_addr_t, u64, u64, *mut c_void) -> isize;
    fn rma_readmsg(*mut fid_ep, *const fi_msg_rma, u64) -> isize;
    fn rma_write(*mut fid_ep, *const c_void, usize, *mut c_void, fi_addr_t, u64, u64, *mut c_void) -> isize;
    fn rma_writev(*mut fid_ep, *const iovec, *mut *mut c_void, usize, fi_addr_t, u64, u64, *mut c_void) -> isize;
    fn rma_writemsg(*mut fid_ep, *const fi_msg_rma, u64) -> isize;
    fn rma_inject(*mut fid_ep, *const c_void, usize, fi_addr_t, u64, u64) -> isize;
    fn rma_writedata(*mut fid_ep, *const c_void, usize, *mut c_void, u64, fi_addr_t, u64, u64, *mut c_void) -> isize;
    fn rma_injectdata(*mut fid_ep, *const c_void, usize, u64, fi_addr_t, u64, u64) -> isize;

    // fi_ops_tagged
    fn tagged_recv(*mut fid_ep, *mut c_void, usize, *mut c_void, fi_addr_t, u64, u64, *mut c_void) -> isize;
    fn tagged_recvv(*mut fid_ep, *const iovec, *mut *mut c_void, usize, fi_addr_t, u64, u64, *mut c_void) -> isize;
    fn tagged_recvmsg(*mut fid_ep, *const fi_msg_tagged, u64) -> isize;
    fn tagged_send(*mut fid_ep, *const c_void, usize, *mut c_void, fi_addr_t, u64, *mut c_void) -> isize;
    fn tagged_sendv(*mut fid_ep, *const iovec, *mut *mut c_void, usize, fi_addr_t, u64, *mut c_void) -> isize;
    fn tagged_sendmsg(*mut fid_ep, *const fi_msg_tagged, u64) -> isize;
    fn tagged_inject(*mut fid_ep, *const c_void, usize, fi_addr_t, u64) -> isize;
    fn tagged_senddata(*mut fid_ep, *const c_void, usize, *mut c_void, u64, fi_addr_t, u64, *mut c_void) -> isize;
    fn tagged_injectdata(*mut fid_ep, *const c_void, usize, u64, fi_addr_t, u64) -> isize;

    // fi_ops_atomic
    fn atomic_write(*mut fid_ep, *const c_void, usize, *mut c_void, fi_addr_t, u64, u64, fi_datatype, fi_op, *mut c_void) -> isize;
    fn atomic_writev(*mut fid_ep, *const fi_ioc, *mut *mut c_void, usize, fi_addr_t, u64, u64, fi_datatype, fi_op, *mut c_void) -> isize;
    fn atomic_writemsg(*mut fid_ep, *const fi_msg_atomic, u64) -> isize;
    fn atomic_inject(*mut fid_ep, *const c_void, usize, fi_addr_t, u64, u64, fi_datatype, fi_op) -> isize;
    fn atomic_readwrite(*mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t, u64, u64, fi_datatype, fi_op, *mut c_void) -> isize;
    fn atomic_readwritev(*mut fid_ep, *const fi_ioc, *mut *mut c_void, usize, *mut fi_ioc, *mut *mut c_void, usize, fi_addr_t, u64, u64, fi_datatype, fi_op, *mut c_void) -> isize;
    fn atomic_readwritemsg(*mut fid_ep, *const fi_msg_atomic, *mut fi_ioc, *mut *mut c_void, usize, u64) -> isize;
    fn atomic_compwrite(*mut fid_ep, *const c_void, usize, *mut c_void, *const c_void, *mut c_void, *mut c_void, *mut c_void, fi_addr_t, u64, u64, fi_datatype, fi_op, *mut c_void) -> isize;
    fn atomic_compwritev(*mut fid_ep, *const fi_ioc, *mut *mut c_void, usize, *const fi_ioc, *mut *mut c_void, usize, *mut fi_ioc, *mut *mut c_void, usize, fi_addr_t, u64, u64, fi_datatype, fi_op, *mut c_void) -> isize;
    fn atomic_compwritemsg(*mut fid_ep, *const fi_msg_atomic, *const fi_ioc, *mut *mut c_void, usize, *mut fi_ioc, *mut *mut c_void, usize, u64) -> isize;
    fn atomic_writevalid(*mut fid_ep, fi_datatype, fi_op, *mut usize) -> c_int;
    fn atomic_readwritevalid(*mut fid_ep, fi_datatype, fi_op, *mut usize) -> c_int;
    fn atomic_compwritevalid(*mut fid_ep, fi_datatype, fi_op, *mut usize) -> c_int;

    // fi_ops_collective
    fn collective_barrier(*mut fid_ep, fi_addr_t, *mut c_void) -> isize;
    fn collective_broadcast(*mut fid_ep, *mut c_void, usize, *mut c_void, fi_addr_t, fi_addr_t, fi_datatype, u64, *mut c_void) -> isize;
    fn collective_alltoall(*mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t, fi_datatype, u64, *mut c_void) -> isize;
    fn collective_allreduce(*mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t, fi_datatype, fi_op, u64, *mut c_void) -> isize;
    fn collective_allgather(*mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t, fi_datatype, u64, *mut c_void) -> isize;
    fn collective_reduce_scatter(*mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t, fi_datatype, fi_op, u64, *mut c_void) -> isize;
    fn collective_reduce(*mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t, fi_addr_t, fi_datatype, fi_op, u64, *mut c_void) -> isize;
    fn collective_scatter(*mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t, fi_addr_t, fi_datatype, u64, *mut c_void) -> isize;
    fn collective_gather(*mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t, fi_addr_t, fi_datatype, u64, *mut c_void) -> isize;
    fn collective_msg(*mut fid_ep, *const fi_msg_collective, *mut fi_ioc, *mut *mut c_void, usize, u64) -> isize;
    fn collective_barrier2(*mut fid_ep, fi_addr_t, u64, *mut c_void) -> isize;

    // fi_ops_eq
    fn eq_read(*mut fid_eq, *mut u32, *mut c_void, usize, u64) -> isize;
    fn eq_readerr(*mut fid_eq, *mut fi_eq_err_entry, u64) -> isize;
    fn eq_write(*mut fid_eq, u32, *const c_void, usize, u64) -> isize;
    fn eq_sread(*mut fid_eq, *mut u32, *mut c_void, usize, c_int, u64) -> isize;

    // fi_ops_cq
    fn cq_read(*mut fid_cq, *mut c_void, usize) -> isize;
    fn cq_readfrom(*mut fid_cq, *mut c_void, usize, *mut fi_addr_t) -> isize;
    fn cq_readerr(*mut fid_cq, *mut fi_cq_err_entry, u64) -> isize;
    fn cq_sread(*mut fid_cq, *mut c_void, usize, *const c_void, c_int) -> isize;
    fn cq_sreadfrom(*mut fid_cq, *mut c_void, usize, *mut fi_addr_t, *const c_void, c_int) -> isize;
    fn cq_signal(*mut fid_cq) -> c_int;
}
