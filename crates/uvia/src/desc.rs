//! Descriptors: one work request each, laid out as VIPL 1.0's `VIP_DESCRIPTOR`.
//!
//! A descriptor is a control segment followed by segments. For a send or a
//! receive every segment is a local data segment (address, memory handle,
//! length). For RDMA the first segment is the address segment (remote address
//! and remote memory handle) and the local data segments follow. The provider
//! writes the outcome into `cs.status` (and, for receives, `cs.length` and
//! `cs.immediate_data`), so a C program sees its own descriptor completed.
//! The Rust [`Descriptor`] has room for [`MAX_SEGMENTS`] segments; the core
//! reads `seg_count` segments from wherever the descriptor lives, so a C
//! descriptor with fewer segments is read the same way.

/// Segments a [`Descriptor`] has room for (address segment included).
pub const MAX_SEGMENTS: usize = 6;

/// `Control` bits (VIPL's `VIP_CONTROL_*`).
pub mod control {
    pub const OP_SENDRECV: u16 = 0x0;
    pub const OP_RDMAWRITE: u16 = 0x1;
    pub const OP_RDMAREAD: u16 = 0x2;
    pub const OP_MASK: u16 = 0x3;
    /// `immediate_data` is valid (send, RDMA write).
    pub const IMMEDIATE: u16 = 0x4;
    /// Start this descriptor only after every earlier one on the queue has completed.
    pub const QFENCE: u16 = 0x8;
    pub const RESERVED: u16 = 0xfff0;
}

/// `Status` bits (VIPL's `VIP_STATUS_*`).
pub mod status {
    pub const DONE: u32 = 0x0000_0001;
    pub const FORMAT_ERROR: u32 = 0x0000_0002;
    pub const PROTECTION_ERROR: u32 = 0x0000_0004;
    pub const LENGTH_ERROR: u32 = 0x0000_0008;
    pub const PARTIAL_ERROR: u32 = 0x0000_0010;
    pub const DESC_FLUSHED_ERROR: u32 = 0x0000_0020;
    pub const TRANSPORT_ERROR: u32 = 0x0000_0040;
    pub const RDMA_PROT_ERROR: u32 = 0x0000_0080;
    pub const REMOTE_DESC_ERROR: u32 = 0x0000_0100;
    pub const ERROR_MASK: u32 = 0x0000_01fe;
    pub const OP_SEND: u32 = 0x0000_0000;
    pub const OP_RECEIVE: u32 = 0x0001_0000;
    pub const OP_RDMA_WRITE: u32 = 0x0002_0000;
    pub const OP_REMOTE_RDMA_WRITE: u32 = 0x0003_0000;
    pub const OP_RDMA_READ: u32 = 0x0004_0000;
    pub const OP_MASK: u32 = 0x0007_0000;
    pub const IMMEDIATE: u32 = 0x0008_0000;
}

/// A registered region's handle, as VIPL's `VIP_MEM_HANDLE`.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemHandle(pub u32);

/// The control segment (`VIP_CONTROL_SEGMENT`, 32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ControlSegment {
    /// Link for the caller's own lists; the core never follows it.
    pub next: u64,
    pub next_handle: MemHandle,
    /// Segments that follow, the address segment included.
    pub seg_count: u16,
    /// [`control`] bits: operation, immediate, queue fence.
    pub control: u16,
    pub reserved: u32,
    pub immediate_data: u32,
    /// Bytes transferred; written by the provider on a receive.
    pub length: u32,
    /// [`status`] bits; 0 while the descriptor is outstanding.
    pub status: u32,
}

/// A data segment (`Local`: address, handle, length) or an address segment
/// (`Remote`: address, handle; `length` unused). 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Segment {
    pub addr: u64,
    pub handle: MemHandle,
    pub length: u32,
}

impl Segment {
    pub fn local(addr: *const u8, handle: MemHandle, length: u32) -> Segment {
        Segment {
            addr: addr as u64,
            handle,
            length,
        }
    }

    pub fn remote(addr: u64, handle: MemHandle) -> Segment {
        Segment {
            addr,
            handle,
            length: 0,
        }
    }
}

/// One work request with room for [`MAX_SEGMENTS`] segments, 64-byte aligned.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default)]
pub struct Descriptor {
    pub cs: ControlSegment,
    pub ds: [Segment; MAX_SEGMENTS],
}

/// The operation a descriptor asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    SendRecv,
    RdmaWrite,
    RdmaRead,
}

/// Why a completed descriptor failed (the error bits of its status).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CompletionError {
    #[error("format error: the descriptor is malformed")]
    Format,
    #[error("protection error: a segment's memory is not usable under the VI's protection tag")]
    Protection,
    #[error("length error: the data does not fit the receive buffers or exceeds the maximum transfer size")]
    Length,
    #[error("partial error: the data was only partly placed")]
    Partial,
    #[error("flushed: the VI left the connected state before this descriptor ran")]
    Flushed,
    #[error("transport error: the connection failed (peer gone or medium error)")]
    Transport,
    #[error("RDMA protection error: the target refused the remote address or handle")]
    RdmaProtection,
    #[error("remote descriptor error: the peer's receive descriptor failed")]
    RemoteDescriptor,
}

impl CompletionError {
    /// Every error, in the order a status naming several is read.
    pub const ALL: [CompletionError; 8] = [
        CompletionError::Format,
        CompletionError::Protection,
        CompletionError::Length,
        CompletionError::Partial,
        CompletionError::Flushed,
        CompletionError::Transport,
        CompletionError::RdmaProtection,
        CompletionError::RemoteDescriptor,
    ];

    /// The status bit for this error.
    pub fn bit(self) -> u32 {
        match self {
            CompletionError::Format => status::FORMAT_ERROR,
            CompletionError::Protection => status::PROTECTION_ERROR,
            CompletionError::Length => status::LENGTH_ERROR,
            CompletionError::Partial => status::PARTIAL_ERROR,
            CompletionError::Flushed => status::DESC_FLUSHED_ERROR,
            CompletionError::Transport => status::TRANSPORT_ERROR,
            CompletionError::RdmaProtection => status::RDMA_PROT_ERROR,
            CompletionError::RemoteDescriptor => status::REMOTE_DESC_ERROR,
        }
    }

    /// The first error named by `status` bits, if any.
    pub fn from_status(bits: u32) -> Option<CompletionError> {
        // Most completions succeed: one test, not one per error.
        if bits & status::ERROR_MASK == 0 {
            return None;
        }
        Self::ALL.into_iter().find(|e| bits & e.bit() != 0)
    }
}

impl Descriptor {
    /// A send of the given local segments.
    pub fn send(segs: &[Segment]) -> Descriptor {
        Descriptor::with(control::OP_SENDRECV, None, segs)
    }

    /// A receive into the given local segments.
    pub fn recv(segs: &[Segment]) -> Descriptor {
        Descriptor::with(control::OP_SENDRECV, None, segs)
    }

    /// An RDMA write of `segs` to `remote`.
    pub fn rdma_write(remote: Segment, segs: &[Segment]) -> Descriptor {
        Descriptor::with(control::OP_RDMAWRITE, Some(remote), segs)
    }

    /// An RDMA read from `remote` into `segs`.
    pub fn rdma_read(remote: Segment, segs: &[Segment]) -> Descriptor {
        Descriptor::with(control::OP_RDMAREAD, Some(remote), segs)
    }

    fn with(op: u16, remote: Option<Segment>, segs: &[Segment]) -> Descriptor {
        let mut d = Descriptor::default();
        d.cs.control = op;
        let mut i = 0;
        if let Some(r) = remote {
            d.ds[0] = r;
            i = 1;
        }
        let n = segs.len().min(MAX_SEGMENTS - i);
        d.ds[i..i + n].copy_from_slice(&segs[..n]);
        // A list longer than the room left is kept visible as an over-long
        // count, so the post reports it instead of silently truncating.
        d.cs.seg_count = (i + segs.len()) as u16;
        d
    }

    /// Adds immediate data (delivered with the receive completion).
    pub fn with_immediate(mut self, data: u32) -> Descriptor {
        self.cs.control |= control::IMMEDIATE;
        self.cs.immediate_data = data;
        self
    }

    /// Sets the queue fence bit.
    pub fn with_fence(mut self) -> Descriptor {
        self.cs.control |= control::QFENCE;
        self
    }

    /// Clears the provider-written fields so the descriptor can be posted again.
    pub fn reset(&mut self) {
        self.cs.status = 0;
        self.cs.length = 0;
    }

    pub fn op(&self) -> Option<Op> {
        match self.cs.control & control::OP_MASK {
            control::OP_SENDRECV => Some(Op::SendRecv),
            control::OP_RDMAWRITE => Some(Op::RdmaWrite),
            control::OP_RDMAREAD => Some(Op::RdmaRead),
            _ => None,
        }
    }

    /// True once the provider has completed the descriptor (with or without error).
    pub fn is_done(&self) -> bool {
        self.cs.status & status::DONE != 0
    }

    /// The error the descriptor completed with, if any.
    pub fn error(&self) -> Option<CompletionError> {
        CompletionError::from_status(self.cs.status)
    }

    /// `Ok(length)` for a successful completion, the error otherwise.
    pub fn result(&self) -> Result<u32, CompletionError> {
        match self.error() {
            Some(e) => Err(e),
            None => Ok(self.cs.length),
        }
    }

    /// Immediate data delivered with a receive, if the sender gave any.
    pub fn immediate(&self) -> Option<u32> {
        (self.cs.status & status::IMMEDIATE != 0).then_some(self.cs.immediate_data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn every_error_bit_is_read_back_and_success_is_none() {
        for e in CompletionError::ALL {
            let bits = status::DONE | status::OP_RECEIVE | status::IMMEDIATE | e.bit();
            assert_eq!(CompletionError::from_status(bits), Some(e));
        }
        let ok = status::DONE | status::OP_MASK | status::IMMEDIATE;
        assert_eq!(CompletionError::from_status(ok), None);
    }

    #[test]
    fn layout_matches_vipl() {
        assert_eq!(size_of::<ControlSegment>(), 32);
        assert_eq!(offset_of!(ControlSegment, next_handle), 8);
        assert_eq!(offset_of!(ControlSegment, seg_count), 12);
        assert_eq!(offset_of!(ControlSegment, control), 14);
        assert_eq!(offset_of!(ControlSegment, immediate_data), 20);
        assert_eq!(offset_of!(ControlSegment, length), 24);
        assert_eq!(offset_of!(ControlSegment, status), 28);
        assert_eq!(size_of::<Segment>(), 16);
        assert_eq!(offset_of!(Descriptor, ds), 32);
        assert_eq!(align_of::<Descriptor>(), 64);
    }

    #[test]
    fn builders_set_op_and_counts() {
        let s = Segment::local(8 as *const u8, MemHandle(3), 100);
        let d =
            Descriptor::rdma_write(Segment::remote(0x1000, MemHandle(9)), &[s]).with_immediate(7);
        assert_eq!(d.op(), Some(Op::RdmaWrite));
        assert_eq!(d.cs.seg_count, 2);
        assert_eq!(d.ds[0].handle, MemHandle(9));
        assert_eq!(d.ds[1], s);
        assert_eq!(d.cs.control & control::IMMEDIATE, control::IMMEDIATE);
        let long = Descriptor::send(&[s; 9]);
        assert_eq!(
            long.cs.seg_count, 9,
            "over-long lists stay visible to the post check"
        );
    }

    #[test]
    fn status_decodes_errors() {
        let mut d = Descriptor::default();
        assert!(!d.is_done());
        d.cs.status = status::DONE | status::LENGTH_ERROR | status::OP_RECEIVE;
        assert_eq!(d.error(), Some(CompletionError::Length));
        assert_eq!(d.result(), Err(CompletionError::Length));
        d.cs.status = status::DONE | status::IMMEDIATE;
        d.cs.immediate_data = 5;
        d.cs.length = 12;
        assert_eq!(d.result(), Ok(12));
        assert_eq!(d.immediate(), Some(5));
    }
}
