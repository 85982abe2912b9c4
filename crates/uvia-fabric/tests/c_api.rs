//! The provider through libfabric's C API: the conformance suite in
//! `tests/c/` (connection events with private data, RDMA write with remote
//! CQ data and read, registration errors, a peer killed mid-transfer, bad
//! calls, blocking reads and wait fds), compiled with the `cc` on PATH
//! against the installed libfabric and run once per domain, over loopback.

mod common;

use common::suite::conformance;

#[test]
fn the_c_suite_passes_on_shm() {
    conformance("shm", &[]);
}

/// The same with registered pages left private (`FI_UVIA_SHARE_MR=0`; by
/// default they are moved into shared memory): `mr/shared_pages` then
/// checks content, fork, deregistration and free() on the private path.
#[test]
fn the_c_suite_passes_on_shm_with_registered_pages_left_private() {
    conformance("shm", &[("FI_UVIA_SHARE_MR", "0")]);
}

/// The suite as a program of interface 1.4 would call it: registration
/// in the old words (`FI_LOCAL_MR`, `FI_MR_BASIC`) and error entries of
/// 1.0, which end before `err_data_size`.
#[test]
fn the_c_suite_passes_on_shm_as_an_interface_1_4_program() {
    conformance("shm", &[("FI_CONFORMANCE_API", "1.4")]);
}

#[test]
fn the_c_suite_passes_on_udp() {
    conformance("udp", &[]);
}
