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

#[test]
fn the_c_suite_passes_on_udp() {
    conformance("udp", &[]);
}
