//! uvia: user-level messaging in the shape of the Virtual Interface
//! Architecture.
//!
//! Open a [`Nic`], create a [`Ptag`], register memory ([`Nic::alloc_region`]
//! or [`Nic::register_mem`]), create a [`Vi`] and connect it (a server waits
//! with [`Nic::connect_wait`], a client calls [`Vi::connect_request`]). Then
//! post [`Descriptor`]s on its queues and take them back with the done
//! (poll) or wait (block) calls, or learn of completions from a [`Cq`].
//! A call that cannot be carried out returns an error and queues nothing; a
//! failure after queuing is the completed descriptor's status.
//!
//! Providers: `shm` (processes of one host, shared memory: no system call on
//! the data path), `udp` (kernel UDP sockets, no privileges) and `xdp` (raw
//! Ethernet through AF_XDP, root); see `provider` for the seam they plug into.

mod bias;
pub mod cm;
mod copy;
mod count;
pub mod cq;
pub mod desc;
pub mod error;
mod lock;
mod look;
pub mod mem;
mod membarrier;
pub mod nic;
mod progress;
mod provider;
mod ready;
pub mod vi;

pub use bias::BiasedLock;
pub use cm::{
    ConnRequest, Discriminator, NetAddress, RemoteViAttributes, MAX_DISCRIMINATOR, MAX_PRIVATE_DATA,
};
pub use count::CountGuard;
pub use cq::{Cq, CqCompletion};
pub use desc::{
    control, status, CompletionError, ControlSegment, Descriptor, MemHandle, Op, Segment,
    MAX_SEGMENTS,
};
pub use error::{
    ConnectError, CqError, MemError, OpenError, PostError, PtagError, Rejected, ViAttrError,
    WaitError,
};
pub use lock::SpinLock;
pub use look::between_looks;
pub use mem::{AccessError, MemAttributes, Ptag, RegionInfo};
pub use nic::{
    MemoryRegion, Nic, NicAttributes, NicOptions, WeakNic, DEFAULT_IDLE_TIMEOUT, MAX_TRANSFER,
};
pub use vi::{Broken, Queue, Reliability, Vi, ViAttributes, ViState, DEFAULT_WAIT_SPIN};

/// The folder where shm listeners of this process put their sockets
/// (`UVIA_SOCKET_DIR`, else `$XDG_RUNTIME_DIR/uvia`, `/run/user/<uid>/uvia`,
/// `/tmp/uvia-<uid>`; made if missing), or `None` if it cannot be had: for
/// a tool that checks what a run left there.
pub fn shm_socket_dir() -> Option<std::path::PathBuf> {
    uvia_shm::SocketDir::from_env()
        .ok()
        .map(|d| d.path().to_path_buf())
}
