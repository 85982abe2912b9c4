//! The shared-memory medium under uvia's `shm` provider.
//!
//! This crate moves bytes between processes of one host and knows nothing of
//! VIs or descriptors: memfd [`segment`]s mapped by both sides, single-producer
//! single-consumer [`ring`]s of cache lines inside them, futex [`doorbell`]s for
//! sleeping waiters, a [`socket`] rendezvous (owner-only Unix sockets that pass
//! segments as file descriptors and report a dead peer), and [`cma`] copies
//! between address spaces for large transfers in one copy.

pub mod cma;
pub mod doorbell;
pub mod prefetch;
pub mod ring;
pub mod segment;
pub mod socket;

pub use doorbell::{Doorbell, PeerEventfd};
pub use ring::{ring_bytes, Consumer, Corrupt, Producer, Record, RingHeader, LINE, RING_ALIGN};
pub use segment::Segment;
pub use socket::{Listener, SocketDir, Stream};

use std::io;

/// Turns a libc return value into an `io::Result`, reading `errno` on -1.
pub(crate) fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}
