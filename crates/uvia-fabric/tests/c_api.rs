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

#[test]
fn the_c_suite_passes_on_udp() {
    conformance("udp", &[]);
}
