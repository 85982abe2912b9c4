//! Errors of calls that could not be carried out. Nothing is queued when one
//! of these is returned; failures after queuing are descriptor statuses
//! ([`CompletionError`](crate::CompletionError)).

use crate::desc::Descriptor;
use crate::mem::AccessError;
use crate::vi::ViState;
use std::io;

/// Opening a Nic failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("unknown provider {0:?} (known: {known})", known = crate::provider::usage())]
    UnknownProvider(String),
    #[error("bad address in {name:?}: {reason}")]
    BadAddress { name: String, reason: String },
    #[error("bad fault-injection spec: {0}")]
    BadInject(String),
    #[error("provider {provider} cannot start: {source}")]
    Io {
        provider: &'static str,
        source: io::Error,
    },
}

impl OpenError {
    /// `name` is not a valid name for its provider; `reason` says what is wanted.
    pub(crate) fn bad_address(name: &str, reason: &str) -> OpenError {
        OpenError::BadAddress {
            name: name.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// Creating or destroying a protection tag failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PtagError {
    #[error("all {0} protection tags of this Nic are in use")]
    TableFull(usize),
    #[error("protection tag {0} does not belong to this Nic")]
    Invalid(u32),
    #[error("protection tag {0} is still used by a memory region or a VI")]
    InUse(u32),
}

/// Registering, querying or deregistering memory failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    #[error("cannot register an empty range")]
    Empty,
    #[error("range {addr:#x}+{len} wraps around the address space")]
    Wraps { addr: u64, len: u64 },
    /// Part of the range is not mapped in this process.
    #[error("range {addr:#x}+{len} is not all mapped memory")]
    Unmapped { addr: u64, len: u64 },
    /// The range's memory cannot be written (`write`: receives and RDMA
    /// writes would store into it) or read.
    #[error("range {addr:#x}+{len} is not {} memory", if *write { "writable (receives and RDMA writes store into a registered region)" } else { "readable" })]
    NotAccessible { addr: u64, len: u64, write: bool },
    /// A region registered read only with RDMA write enabled.
    #[error("a region registered to be read only cannot take the peer's RDMA writes")]
    ReadOnlyRdmaWrite,
    #[error("protection tag {0} does not belong to this Nic")]
    InvalidPtag(u32),
    #[error("all {0} region slots of this Nic are in use")]
    TableFull(usize),
    #[error("memory handle {0:#x} does not name a registered region")]
    NotRegistered(u32),
    #[error("cannot allocate {len} bytes of shareable memory: {reason}")]
    Alloc { len: usize, reason: String },
    /// The memfd window given with a range is empty, wraps or has no descriptor.
    #[error("the shared window of a registration names no memory")]
    BadBacking,
    /// [`Nic::set_region_backing`](crate::Nic::set_region_backing) on a
    /// region that has its window already.
    #[error("region {0:#x} has a shared window already")]
    AlreadyBacked(u32),
}

/// Creating a VI or changing its attributes failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViAttrError {
    #[error("protection tag {0} does not belong to this Nic")]
    InvalidPtag(u32),
    #[error("max transfer size {asked} exceeds the Nic's {max}")]
    TransferTooLarge { asked: u32, max: u32 },
    #[error("queue depth {asked} is outside 1..={max}")]
    QueueDepth { asked: u32, max: u32 },
    #[error("the {0} provider does not offer {1}")]
    Unsupported(&'static str, &'static str),
    #[error("completion queue belongs to another Nic")]
    ForeignCq,
    #[error("attributes cannot change in state {0:?}")]
    InvalidState(ViState),
}

/// Why a post was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    #[error("VI is {0:?}, not connected: sends need a connected VI")]
    NotConnected(ViState),
    #[error("VI is in the Error state; disconnect and reconnect it")]
    ViError,
    #[error("the {0} queue is full ({1} descriptors outstanding)")]
    QueueFull(&'static str, usize),
    #[error("descriptor format: {0}")]
    Format(&'static str),
    #[error("segment {index}: {error}")]
    Segment { index: usize, error: AccessError },
    #[error("total length {len} exceeds the VI's max transfer size {max}")]
    TooLong { len: u64, max: u32 },
    #[error("{0} is not enabled on this VI")]
    NotEnabled(&'static str),
    /// The descriptor is in a queue already (posted and not yet handed
    /// back by a done or wait call).
    #[error("the descriptor is posted already and not yet handed back")]
    AlreadyPosted,
}

impl PostError {
    /// The error bits of the status a face gives a refused descriptor
    /// that it reports as completed (VIA's completion errors); 0 where the
    /// refusal is not about the descriptor (the VI's state, a full queue).
    pub fn status_bits(&self) -> u32 {
        use crate::desc::status;
        match self {
            PostError::Format(_) => status::FORMAT_ERROR,
            PostError::Segment { error, .. } => match error {
                AccessError::RdmaWriteDisabled(_) | AccessError::RdmaReadDisabled(_) => {
                    status::RDMA_PROT_ERROR
                }
                _ => status::PROTECTION_ERROR,
            },
            PostError::TooLong { .. } => status::LENGTH_ERROR,
            PostError::NotEnabled(_) => status::RDMA_PROT_ERROR,
            _ => 0,
        }
    }
}

/// A post that was refused hands its descriptor back with the reason.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Rejected {
    pub error: PostError,
    pub descriptor: Box<Descriptor>,
}

/// Waiting for a completion ended without one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    #[error("timed out")]
    Timeout,
    #[error("this queue reports to a completion queue: wait on the CQ, then call done")]
    BoundToCq,
    #[error("completion queue overflowed: more completions than its {0} entries")]
    CqOverflow(usize),
    /// Another thread ended the wait ([`Cq::interrupt`](crate::Cq::interrupt)).
    #[error("the wait was interrupted")]
    Interrupted,
}

/// Connection management failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("VI is {0:?}; connection management needs an idle VI")]
    InvalidState(ViState),
    #[error("nobody listens on discriminator {discriminator} at {nic} (waited {waited_ms} ms)")]
    NoListener {
        nic: String,
        discriminator: String,
        waited_ms: u64,
    },
    #[error("timed out after {0} ms")]
    Timeout(u64),
    /// A connection request to a network peer had no answer at all, not
    /// even that nobody listens: nothing that speaks the protocol is at
    /// `peer`, or nothing reached it.
    #[error(
        "no answer from {peer} to a connection request on discriminator {discriminator} within {waited_ms} ms"
    )]
    NoAnswer {
        /// The medium address the request went to (`ip:port`, a MAC).
        peer: String,
        discriminator: String,
        waited_ms: u64,
    },
    #[error("the peer rejected the connection")]
    Rejected,
    /// The server's Nic was given a job key and this request carried
    /// another, or none (`NicOptions::job_key`, `UVIA_JOB_KEY`).
    #[error(
        "the server belongs to another job: its job key differs from this Nic's (UVIA_JOB_KEY)"
    )]
    WrongJob,
    #[error("attributes do not match: {0}")]
    Mismatch(String),
    #[error("malformed connection message from the peer: {0}")]
    Protocol(&'static str),
    #[error("discriminator is {0} bytes; at most {max} are allowed", max = crate::cm::MAX_DISCRIMINATOR)]
    DiscriminatorTooLong(usize),
    #[error("this connection request was already answered")]
    Answered,
    #[error("private data is {0} bytes; at most {max} are allowed", max = crate::cm::MAX_PRIVATE_DATA)]
    PrivateDataTooLong(usize),
    /// The host of a network address names no reachable peer; the text
    /// says what was given and what is wanted.
    #[error("cannot resolve host address {0}")]
    BadAddress(String),
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    /// Another listener holds the discriminator (on shm, another Nic of
    /// this host), or a peer-to-peer connection being made does.
    #[error("discriminator {0} is in use: another listener or a peer-to-peer connection holds it")]
    InUse(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Completion-queue management failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CqError {
    #[error("CQ size {asked} is outside 1..={max}")]
    Size { asked: usize, max: usize },
    #[error("CQ holds {0} entries; it cannot shrink below that")]
    TooSmall(usize),
    #[error("CQ still has {0} VI queue(s) attached")]
    InUse(usize),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desc::status;

    /// A refusal about the descriptor is the matching VIA completion
    /// error; one about the VI or its queue is no error of the descriptor.
    #[test]
    fn a_refusal_is_the_status_of_its_reason() {
        let seg = |error| PostError::Segment { index: 1, error };
        assert_eq!(PostError::Format("x").status_bits(), status::FORMAT_ERROR);
        assert_eq!(
            seg(AccessError::NotRegistered(3)).status_bits(),
            status::PROTECTION_ERROR
        );
        assert_eq!(
            seg(AccessError::RdmaWriteDisabled(3)).status_bits(),
            status::RDMA_PROT_ERROR
        );
        assert_eq!(
            PostError::TooLong { len: 9, max: 8 }.status_bits(),
            status::LENGTH_ERROR
        );
        assert_eq!(
            PostError::NotEnabled("RDMA read").status_bits(),
            status::RDMA_PROT_ERROR
        );
        assert_eq!(PostError::QueueFull("receive", 4).status_bits(), 0);
        assert_eq!(PostError::ViError.status_bits(), 0);
    }
}
