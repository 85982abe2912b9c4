//! Frame formats of the VI protocol: a checked view over bytes ([`Frame`])
//! and a parsed representation ([`Repr`]) with `parse`, `emit` and
//! `buffer_len`. Every frame starts with the same 16-byte header and is
//! covered by a CRC-32 over all of its bytes, so a medium that corrupts
//! without telling (or the fault injector) cannot slip a bad frame through.
//!
//! All fields are big-endian. Byte-vector tests sit at the bottom.
//!
//! ```text
//!  0       1       2               4               8              12              16
//! +-------+-------+---------------+---------------+---------------+---------------+
//! |version| kind  |    flags      |   dst conn    |   src conn    |   checksum    |
//! +-------+-------+---------------+---------------+---------------+---------------+
//! | kind-specific body ...
//! ```
//!
//! A data frame's body ([`DataHeader`]) fills bytes 16 to 64; its payload follows:
//!
//! ```text
//! 16              20              24              28      30      32
//! +---------------+---------------+---------------+---+---+-------+
//! |      psn      |   cum. ack    |      msn      |op |flg|   0   |
//! +---------------+---------------+---------------+---+---+-------+
//! |    offset     |     total     |      imm      |     rkey      |
//! +---------------+---------------+---------------+---------------+
//! |             raddr             |      rsn      |  done count   |
//! +-------------------------------+---------------+---------------+
//! | payload ...
//! ```
//!
//! The four handshake frames (request, peer request, accept, reject) may
//! end in the application's private data: after the kind's fixed part, one
//! length byte (at most [`MAX_PRIVATE`]) and that many bytes. A frame that
//! ends at its fixed part carries none, so frames without private data are
//! the bytes they always were, and a receiver that reads only the fixed
//! part still understands the rest of the frame.

use std::fmt;

/// The protocol version this crate speaks; frames of another version are
/// dropped (and counted) before anything else is read.
pub const VERSION: u8 = 1;
/// Bytes of the header every frame starts with.
pub const HEADER_LEN: usize = 16;
/// Bytes of a data frame before its payload.
pub const DATA_HEADER_LEN: usize = field::data::PAYLOAD.start;
/// Most selective-acknowledgement ranges in one ack frame.
pub const MAX_SACK: usize = 8;
/// Most bytes in a discriminator.
pub const MAX_DISCRIMINATOR: usize = 32;
/// Most bytes of private data a handshake frame carries.
pub const MAX_PRIVATE: usize = 64;
/// Bytes of the longest frame sent in answer without a connection (a
/// reject with the most private data): the size of a buffer for one.
pub const MAX_REPLY_LEN: usize = HEADER_LEN + 4 + 1 + MAX_PRIVATE;

mod field {
    pub type Field = std::ops::Range<usize>;
    pub type Rest = std::ops::RangeFrom<usize>;

    pub const VERSION: usize = 0;
    pub const KIND: usize = 1;
    pub const FLAGS: Field = 2..4;
    pub const DST: Field = 4..8;
    pub const SRC: Field = 8..12;
    pub const CHECKSUM: Field = 12..16;

    /// A data frame's body, after the header: the fields of
    /// [`DataHeader`](super::DataHeader), then the payload.
    pub mod data {
        use super::{Field, Rest};

        pub const PSN: Field = 16..20;
        pub const ACK: Field = 20..24;
        pub const MSN: Field = 24..28;
        pub const OP: usize = 28;
        pub const FLAGS: usize = 29;
        /// Zero on the wire, not read: keeps `OFFSET` and what follows aligned.
        pub const RESERVED: Field = 30..32;
        pub const OFFSET: Field = 32..36;
        pub const TOTAL: Field = 36..40;
        pub const IMM: Field = 40..44;
        pub const RKEY: Field = 44..48;
        pub const RADDR: Field = 48..56;
        pub const RSN: Field = 56..60;
        pub const DONE: Field = 60..64;
        pub const PAYLOAD: Rest = 64..;
    }
}

/// Frame kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A client asks a server's discriminator for a connection.
    ConnRequest = 1,
    /// The server's yes, with its VI's attributes.
    ConnAccept = 2,
    /// The server's no.
    ConnReject = 3,
    /// The client saw the accept: the server may stop repeating it.
    ConnConfirm = 4,
    /// Either side ends the connection; carries its last cumulative ack, so
    /// the peer's sends that arrived complete even if the ack frame before
    /// it was lost.
    Disconnect = 5,
    /// The answer to a disconnect.
    DisconnectAck = 6,
    /// A fragment of a message, an RDMA read request, or read response data.
    Data = 7,
    /// Cumulative and selective acknowledgement (and keep-alive).
    Ack = 8,
    /// A negative acknowledgement: receiver not ready, or a fatal error.
    Nak = 9,
    /// Peer-to-peer: a side asks the other side's VI, waiting on
    /// `discriminator`, while that side asks it likewise; either request
    /// (or the accept that answers it) connects the two.
    PeerRequest = 10,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::ConnRequest,
            2 => Kind::ConnAccept,
            3 => Kind::ConnReject,
            4 => Kind::ConnConfirm,
            5 => Kind::Disconnect,
            6 => Kind::DisconnectAck,
            7 => Kind::Data,
            8 => Kind::Ack,
            9 => Kind::Nak,
            10 => Kind::PeerRequest,
            _ => return None,
        })
    }

    /// Fixed bytes of this kind of frame, header included (data frames
    /// add a payload, ack frames their ranges).
    fn fixed_len(self) -> usize {
        match self {
            Kind::ConnRequest | Kind::PeerRequest => HEADER_LEN + 16 + MAX_DISCRIMINATOR,
            Kind::ConnAccept => HEADER_LEN + 16,
            Kind::ConnReject => HEADER_LEN + 4,
            Kind::ConnConfirm | Kind::DisconnectAck => HEADER_LEN,
            Kind::Disconnect => HEADER_LEN + 8,
            Kind::Data => DATA_HEADER_LEN,
            Kind::Ack => HEADER_LEN + 12,
            Kind::Nak => HEADER_LEN + 12,
        }
    }
}

/// Why bytes are not a frame. Counted and dropped by the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the header or the kind's fixed part.
    #[error("frame truncated")]
    Truncated,
    /// A version this engine does not speak.
    #[error("unknown protocol version {0}")]
    Version(u8),
    /// A kind byte no frame has.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// The checksum does not match the bytes.
    #[error("checksum mismatch")]
    Checksum,
    /// A field holds a value no sender emits (a length past the frame, an
    /// unknown operation or reliability level).
    #[error("malformed field: {0}")]
    Malformed(&'static str),
}

/// A checked view over the bytes of one frame.
#[derive(Clone, Copy)]
pub struct Frame<T: AsRef<[u8]>> {
    buf: T,
    /// The kind byte as read when the frame was checked: there is no
    /// default to fall back on, so an unknown kind never reads as another.
    kind: Kind,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// The CRC-32 of a frame with its checksum field taken as zero.
fn crc_of(b: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&b[..field::CHECKSUM.start]);
    h.update(&[0; 4]);
    h.update(&b[field::CHECKSUM.end..]);
    h.finalize()
}

/// Writes the checksum of a fully emitted frame into its header. Call after
/// the payload is in place.
pub fn fill_checksum(frame: &mut [u8]) {
    let c = crc_of(frame);
    put32(frame, field::CHECKSUM.start, c);
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Checks length, version, kind and checksum; after this every accessor
    /// is in bounds.
    pub fn new_checked(buf: T) -> Result<Frame<T>, WireError> {
        Frame::check(buf, true)
    }

    /// Checks length, version and kind, not the checksum: for a frame from
    /// a medium that delivers frames intact or not at all. Every accessor
    /// is in bounds after this too; the bytes are as untrusted as ever.
    pub fn new_intact(buf: T) -> Result<Frame<T>, WireError> {
        Frame::check(buf, false)
    }

    fn check(buf: T, verify: bool) -> Result<Frame<T>, WireError> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if b[field::VERSION] != VERSION {
            return Err(WireError::Version(b[field::VERSION]));
        }
        let kind = Kind::from_u8(b[field::KIND]).ok_or(WireError::Kind(b[field::KIND]))?;
        if b.len() < kind.fixed_len() {
            return Err(WireError::Truncated);
        }
        if verify && be32(b, field::CHECKSUM.start) != crc_of(b) {
            return Err(WireError::Checksum);
        }
        Ok(Frame { buf, kind })
    }

    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn flags(&self) -> u16 {
        be16(self.b(), field::FLAGS.start)
    }

    /// The receiver's connection id (0 in a connection request).
    pub fn dst_conn(&self) -> u32 {
        be32(self.b(), field::DST.start)
    }

    /// The sender's connection id.
    pub fn src_conn(&self) -> u32 {
        be32(self.b(), field::SRC.start)
    }

    pub fn len(&self) -> usize {
        self.b().len()
    }

    pub fn is_empty(&self) -> bool {
        self.b().is_empty()
    }

    /// The bytes of a data frame: a frame checked as another (shorter)
    /// kind has no data fields, so only [`DataHeader::parse`] reads them,
    /// after it has matched the kind.
    fn data(&self) -> &[u8] {
        debug_assert_eq!(self.kind, Kind::Data, "a data field of another kind");
        self.b()
    }
}

impl<'a> Frame<&'a [u8]> {
    /// A data frame's payload, borrowed for as long as the bytes (a parsed
    /// [`Repr`] keeps it).
    fn payload(&self) -> &'a [u8] {
        debug_assert_eq!(self.kind, Kind::Data, "a payload of another kind");
        &self.buf[field::data::PAYLOAD]
    }
}

/// The operation a data frame belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// A send, consuming a receive descriptor.
    Send = 1,
    /// An RDMA write into the target's registered memory.
    RdmaWrite = 2,
    /// A request to read `total` bytes of the target's memory.
    ReadRequest = 3,
    /// Bytes read on behalf of the peer's request `msn`.
    ReadResponse = 4,
}

impl Op {
    fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::Send,
            2 => Op::RdmaWrite,
            3 => Op::ReadRequest,
            4 => Op::ReadResponse,
            _ => return None,
        })
    }
}

/// Data frame flags.
pub mod data_flags {
    /// The frame carries immediate data (valid in every fragment).
    pub const IMM: u8 = 1;
    /// The message consumes a receive descriptor (a send, or a write with
    /// immediate data): `rsn` is meaningful.
    pub const CONSUMES: u8 = 2;
    /// The sender wants an acknowledgement at once (last frame of a burst,
    /// or a retransmission).
    pub const ACK_NOW: u8 = 4;
    /// The frame carries several whole sends ([`bundle`](super::bundle)):
    /// `msn` and `rsn` are the first's, `total` is how many.
    pub const BUNDLE: u8 = 8;
}

/// Several small sends in one data frame: the payload is, for each, an
/// entry header of [`ENTRY_LEN`] bytes and its bytes. The messages are
/// consecutive (`msn`, `msn + 1`, ...) and consume consecutive receive
/// descriptors (`rsn`, `rsn + 1`, ...).
///
/// ```text
/// 0               2       3       4                               8
/// +---------------+-------+-------+-------------------------------+
/// |    length     | flags |   0   |        immediate data         |
/// +---------------+-------+-------+-------------------------------+
/// | the message's bytes ...
/// ```
///
/// An entry's flags hold [`data_flags::IMM`](super::data_flags::IMM) when its
/// immediate data is meaningful.
pub mod bundle {
    use super::{data_flags, WireError};

    /// Bytes of an entry's header.
    pub const ENTRY_LEN: usize = 8;

    /// One message of a bundle.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Entry<'a> {
        pub imm: Option<u32>,
        pub bytes: &'a [u8],
    }

    /// Writes an entry's header for `len` bytes into `buf[..ENTRY_LEN]`.
    pub fn emit_entry(buf: &mut [u8], len: u16, imm: Option<u32>) {
        let b: &mut [u8; ENTRY_LEN] = (&mut buf[..ENTRY_LEN])
            .try_into()
            .expect("room for an entry");
        b[0..2].copy_from_slice(&len.to_be_bytes());
        b[2] = if imm.is_some() { data_flags::IMM } else { 0 };
        b[3] = 0;
        b[4..8].copy_from_slice(&imm.unwrap_or(0).to_be_bytes());
    }

    /// The `count` entries of `payload`, or why it is not a bundle of
    /// them: an entry past the payload's end, bytes left over, or unknown
    /// flags.
    pub fn entries(payload: &[u8], count: u32) -> Entries<'_> {
        Entries {
            rest: payload,
            left: count,
        }
    }

    /// Iterator of [`entries`]; a malformed bundle yields one error, then
    /// nothing.
    pub struct Entries<'a> {
        rest: &'a [u8],
        left: u32,
    }

    impl<'a> Iterator for Entries<'a> {
        type Item = Result<Entry<'a>, WireError>;

        fn next(&mut self) -> Option<Self::Item> {
            let bad = |e: &mut Self, why| {
                e.left = 0;
                e.rest = &[];
                Some(Err(WireError::Malformed(why)))
            };
            if self.left == 0 {
                if self.rest.is_empty() {
                    return None;
                }
                return bad(self, "bytes after a bundle's last entry");
            }
            let Some((h, rest)) = self.rest.split_first_chunk::<ENTRY_LEN>() else {
                return bad(self, "bundle entry truncated");
            };
            let len = u16::from_be_bytes([h[0], h[1]]) as usize;
            if h[2] & !data_flags::IMM != 0 || h[3] != 0 {
                return bad(self, "bundle entry flags");
            }
            if len > rest.len() {
                return bad(self, "bundle entry past the frame");
            }
            let imm =
                (h[2] & data_flags::IMM != 0).then(|| u32::from_be_bytes([h[4], h[5], h[6], h[7]]));
            let (bytes, rest) = rest.split_at(len);
            self.rest = rest;
            self.left -= 1;
            Some(Ok(Entry { imm, bytes }))
        }
    }
}

/// Ack frame flags.
pub mod ack_flags {
    /// A keep-alive: answer with an ack even if nothing new arrived.
    pub const PING: u8 = 1;
}

/// Bits of the attributes' flag byte.
pub mod attr_flags {
    /// The announcing side's medium delivers frames intact or not at all.
    pub const INTACT: u8 = 1;
    /// A request carries a job key: 8 bytes after its fixed part, before
    /// its private data.
    pub const JOB: u8 = 2;
    /// The announcing side names its Nic: 8 bytes after a request's job
    /// key (or an accept's fixed part), before the private data.
    pub const NIC: u8 = 4;
}

/// The attributes a side announces in a request or an accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnAttrs {
    /// Reliability level as its wire byte (0 unreliable, 1 delivery, 2 reception).
    pub reliability: u8,
    pub rdma_write: bool,
    pub rdma_read: bool,
    /// Largest frame the sender of these attributes accepts.
    pub max_frame: u32,
    pub max_transfer: u32,
    /// The first packet sequence number it will send.
    pub initial_psn: u32,
    /// Frames reach this side intact or not at all (its medium checksums
    /// them, as UDP does): the peer may leave the checksum of its data
    /// frames out (as zero), and this side parses them with
    /// [`parse_intact`].
    pub intact: bool,
    /// A request's job key (0: none), which a listener given a key
    /// compares with its own; never sent in an accept.
    pub job: u64,
    /// The announcing side's Nic (0: not said): a token, random for each
    /// opened Nic, the same in all of its connections. A side that knows
    /// two of its connections end at the same Nic lets one keep-alive
    /// answer for both (see [`Conn::heard_elsewhere`](crate::Conn::heard_elsewhere)).
    pub nic: u64,
}

impl ConnAttrs {
    fn parse(b: &[u8], at: usize) -> Result<ConnAttrs, WireError> {
        let reliability = b[at];
        if reliability > 2 {
            return Err(WireError::Malformed("reliability level"));
        }
        let rdma = b[at + 1];
        if rdma & !3 != 0 {
            return Err(WireError::Malformed("rdma flags"));
        }
        // (Byte 2 is a request's discriminator length.)
        // (The job flag is the request parser's: it reads the key.)
        let flags = b[at + 3];
        if flags & !(attr_flags::INTACT | attr_flags::JOB | attr_flags::NIC) != 0 {
            return Err(WireError::Malformed("attribute flags"));
        }
        Ok(ConnAttrs {
            reliability,
            rdma_write: rdma & 1 != 0,
            rdma_read: rdma & 2 != 0,
            max_frame: be32(b, at + 4),
            max_transfer: be32(b, at + 8),
            initial_psn: be32(b, at + 12),
            intact: flags & attr_flags::INTACT != 0,
            job: 0,
            nic: 0,
        })
    }

    /// True if the attributes at `at` say a job key follows.
    fn has_job(b: &[u8], at: usize) -> bool {
        b[at + 3] & attr_flags::JOB != 0
    }

    /// True if the attributes at `at` say a Nic token follows.
    fn has_nic(b: &[u8], at: usize) -> bool {
        b[at + 3] & attr_flags::NIC != 0
    }

    /// Bytes the job key and the Nic token add to a request (an accept
    /// has no job key).
    fn keys_len(&self) -> usize {
        8 * (self.job != 0) as usize + 8 * (self.nic != 0) as usize
    }

    fn emit(&self, b: &mut [u8], at: usize) {
        b[at] = self.reliability;
        b[at + 1] = self.rdma_write as u8 | (self.rdma_read as u8) << 1;
        b[at + 2] = 0;
        b[at + 3] = if self.intact { attr_flags::INTACT } else { 0 }
            | if self.job != 0 { attr_flags::JOB } else { 0 }
            | if self.nic != 0 { attr_flags::NIC } else { 0 };
        put32(b, at + 4, self.max_frame);
        put32(b, at + 8, self.max_transfer);
        put32(b, at + 12, self.initial_psn);
    }
}

/// Why a server refused a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RejectReason {
    /// The server said no.
    Refused = 1,
    /// Nobody waits on that discriminator.
    NoListener = 2,
    /// The two VIs' attributes do not match (reliability level).
    Mismatch = 3,
    /// The listener has as many requests waiting as it holds: ask again later.
    Busy = 4,
    /// The listener was given a job key and the request had another, or none.
    WrongJob = 5,
}

impl RejectReason {
    fn from_u8(v: u8) -> Option<RejectReason> {
        Some(match v {
            1 => RejectReason::Refused,
            2 => RejectReason::NoListener,
            3 => RejectReason::Mismatch,
            4 => RejectReason::Busy,
            5 => RejectReason::WrongJob,
            _ => return None,
        })
    }
}

/// What a negative acknowledgement says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum NakCode {
    /// Receiver not ready: no receive descriptor for the message at `psn`;
    /// send it again later.
    ReceiverNotReady = 1,
    /// The message at `psn` does not fit the receive descriptor.
    Length = 2,
    /// An RDMA access at `psn` failed the target's protection checks.
    Protection = 3,
    /// The operation at `psn` is not enabled on the target VI.
    Operation = 4,
    /// No receive descriptor and the VI does not retry: the connection ends.
    NoDescriptor = 5,
    /// The receiving side has failed for a reason of its own.
    Failed = 6,
}

impl NakCode {
    fn from_u8(v: u8) -> Option<NakCode> {
        Some(match v {
            1 => NakCode::ReceiverNotReady,
            2 => NakCode::Length,
            3 => NakCode::Protection,
            4 => NakCode::Operation,
            5 => NakCode::NoDescriptor,
            6 => NakCode::Failed,
            _ => return None,
        })
    }

    /// True for codes that end the connection.
    pub fn is_fatal(self) -> bool {
        self != NakCode::ReceiverNotReady
    }
}

/// The fields of a data frame other than its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataHeader {
    /// Packet sequence number in the sender's stream.
    pub psn: u32,
    /// Piggybacked cumulative ack: every psn below this one arrived.
    pub ack: u32,
    /// Message sequence number (for a read response: the reader's msn).
    pub msn: u32,
    pub op: Op,
    pub flags: u8,
    /// Offset of this fragment's payload in the message.
    pub offset: u32,
    /// Length of the whole message (of the read, for read requests).
    pub total: u32,
    pub imm: u32,
    /// Remote memory handle and address (RDMA write, read request).
    pub rkey: u32,
    pub raddr: u64,
    /// Receive sequence number: which of the target's receive descriptors,
    /// counted from the start of the connection, the message consumes.
    pub rsn: u32,
    /// Piggybacked count of the peer's messages completed here (reliable
    /// reception completes sends on it).
    pub done: u32,
}

impl DataHeader {
    fn parse<T: AsRef<[u8]>>(f: &Frame<T>) -> Result<DataHeader, WireError> {
        use field::data;
        // One length check for the whole header (the frame's check made
        // sure of it) rather than one per field: every data frame comes
        // through here.
        let b: &[u8; DATA_HEADER_LEN] = f.data()[..DATA_HEADER_LEN]
            .try_into()
            .map_err(|_| WireError::Truncated)?;
        let op = Op::from_u8(b[data::OP]).ok_or(WireError::Malformed("data operation"))?;
        Ok(DataHeader {
            psn: at32(b, data::PSN.start),
            ack: at32(b, data::ACK.start),
            msn: at32(b, data::MSN.start),
            op,
            flags: b[data::FLAGS],
            offset: at32(b, data::OFFSET.start),
            total: at32(b, data::TOTAL.start),
            imm: at32(b, data::IMM.start),
            rkey: at32(b, data::RKEY.start),
            raddr: u64::from_be_bytes(fixed(b, data::RADDR.start)),
            rsn: at32(b, data::RSN.start),
            done: at32(b, data::DONE.start),
        })
    }

    /// Writes the header of a data frame (common header included, checksum
    /// left zero) into `b[..DATA_HEADER_LEN]`. The caller puts the payload
    /// after it and then calls [`fill_checksum`].
    pub fn emit(&self, b: &mut [u8], dst: u32, src: u32) {
        use field::data;
        emit_header(b, Kind::Data, dst, src);
        // As in `parse`: one length check, then fields at fixed places.
        let b: &mut [u8; DATA_HEADER_LEN] = (&mut b[..DATA_HEADER_LEN])
            .try_into()
            .expect("a data header's room");
        let mut put = |at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_be_bytes());
        put(data::PSN.start, self.psn);
        put(data::ACK.start, self.ack);
        put(data::MSN.start, self.msn);
        put(data::OFFSET.start, self.offset);
        put(data::TOTAL.start, self.total);
        put(data::IMM.start, self.imm);
        put(data::RKEY.start, self.rkey);
        put(data::RSN.start, self.rsn);
        put(data::DONE.start, self.done);
        b[data::OP] = self.op as u8;
        b[data::FLAGS] = self.flags;
        b[data::RESERVED].fill(0);
        b[data::RADDR].copy_from_slice(&self.raddr.to_be_bytes());
    }
}

/// `N` bytes of a fixed-size header at `at` (constant at every call, so
/// the bounds are checked when compiling).
#[inline(always)]
fn fixed<const L: usize, const N: usize>(b: &[u8; L], at: usize) -> [u8; N] {
    let mut x = [0u8; N];
    x.copy_from_slice(&b[at..at + N]);
    x
}

#[inline(always)]
fn at32<const L: usize>(b: &[u8; L], at: usize) -> u32 {
    u32::from_be_bytes(fixed(b, at))
}

/// A parsed frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Repr<'a> {
    ConnRequest {
        attrs: ConnAttrs,
        discriminator: &'a [u8],
        /// The client's private data for the server (at most [`MAX_PRIVATE`] bytes).
        private: &'a [u8],
    },
    ConnAccept {
        attrs: ConnAttrs,
        /// The server's private data for the client.
        private: &'a [u8],
    },
    PeerRequest {
        attrs: ConnAttrs,
        /// The discriminator the receiving side's VI waits on.
        discriminator: &'a [u8],
        /// The asking side's private data.
        private: &'a [u8],
    },
    ConnReject {
        reason: RejectReason,
        /// The server's private data for the refused client.
        private: &'a [u8],
    },
    ConnConfirm,
    Disconnect {
        /// Every psn below this one arrived.
        ack: u32,
        /// Messages of the receiver completed at the sender.
        done: u32,
    },
    DisconnectAck,
    Data {
        header: DataHeader,
        payload: &'a [u8],
    },
    Ack {
        /// Every psn below this one arrived.
        ack: u32,
        /// Messages of the ack's receiver completed at its sender.
        done: u32,
        flags: u8,
        /// Ranges `[start, end)` of psns above `ack` that arrived.
        sack: SackList,
    },
    Nak {
        code: NakCode,
        psn: u32,
        ack: u32,
    },
}

/// Up to [`MAX_SACK`] psn ranges, without allocating.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SackList {
    ranges: [(u32, u32); MAX_SACK],
    len: u8,
}

impl SackList {
    pub fn push(&mut self, start: u32, end: u32) -> bool {
        if self.len as usize == MAX_SACK {
            return false;
        }
        self.ranges[self.len as usize] = (start, end);
        self.len += 1;
        true
    }

    pub fn as_slice(&self) -> &[(u32, u32)] {
        &self.ranges[..self.len as usize]
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The part of a discriminator a request carries (the first
/// [`MAX_DISCRIMINATOR`] bytes): what a longer one is known by.
pub(crate) fn cut_discriminator(d: &[u8]) -> &[u8] {
    &d[..d.len().min(MAX_DISCRIMINATOR)]
}

/// A handshake frame's private data: after its kind's fixed part, a length
/// byte and exactly that many bytes; none if the frame ends at its fixed part.
fn parse_private(b: &[u8], kind: Kind) -> Result<&[u8], WireError> {
    parse_private_at(b, kind.fixed_len())
}

/// A nonzero 8-byte key at `*at` (a job key, a Nic token), which then
/// moves past it.
fn parse_key(b: &[u8], at: &mut usize, what: &'static str) -> Result<u64, WireError> {
    let k = b
        .get(*at..*at + 8)
        .map(|k| u64::from_be_bytes(k.try_into().unwrap_or_default()))
        .filter(|&k| k != 0)
        .ok_or(WireError::Malformed(what))?;
    *at += 8;
    Ok(k)
}

/// Writes a nonzero key at `*at`, which then moves past it; a zero key
/// is not written.
fn emit_key(b: &mut [u8], at: &mut usize, key: u64) {
    if key != 0 {
        b[*at..*at + 8].copy_from_slice(&key.to_be_bytes());
        *at += 8;
    }
}

/// The private data of a frame whose fixed part (and keys) end at `fixed`.
fn parse_private_at(b: &[u8], fixed: usize) -> Result<&[u8], WireError> {
    let Some(&n) = b.get(fixed) else {
        return Ok(&[]);
    };
    let n = n as usize;
    if n > MAX_PRIVATE || b.len() != fixed + 1 + n {
        return Err(WireError::Malformed("private data length"));
    }
    Ok(&b[fixed + 1..])
}

/// Bytes private data adds to a handshake frame (none when empty, so such
/// frames keep the bytes they had before private data existed).
fn private_len(private: &[u8]) -> usize {
    match private.len() {
        0 => 0,
        n => 1 + n.min(MAX_PRIVATE),
    }
}

/// Writes private data after `kind`'s fixed part; a caller's slice longer
/// than [`MAX_PRIVATE`] is cut, as a discriminator is (and
/// [`buffer_len`](Repr::buffer_len) counts it cut).
fn emit_private(b: &mut [u8], kind: Kind, private: &[u8]) {
    emit_private_at(b, kind.fixed_len(), private)
}

/// [`emit_private`] after a fixed part (and job key) ending at `at`.
fn emit_private_at(b: &mut [u8], at: usize, private: &[u8]) {
    if private.is_empty() {
        return;
    }
    let n = private.len().min(MAX_PRIVATE);
    b[at] = n as u8;
    b[at + 1..at + 1 + n].copy_from_slice(&private[..n]);
}

/// Private data kept beside a connection or a request: up to
/// [`MAX_PRIVATE`] bytes in place, no heap. Its length is checked once,
/// where it is made ([`PrivateData::new`]), so every frame that carries it
/// is well-formed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PrivateData {
    bytes: [u8; MAX_PRIVATE],
    len: u8,
}

/// Private data longer than a handshake frame carries; holds the length asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("private data of {0} bytes exceeds the {MAX_PRIVATE} a handshake frame carries")]
pub struct PrivateDataTooLong(pub usize);

impl PrivateData {
    /// No private data (what a frame without it carries).
    pub const EMPTY: PrivateData = PrivateData {
        bytes: [0; MAX_PRIVATE],
        len: 0,
    };

    /// A copy of `bytes`, refused if longer than [`MAX_PRIVATE`].
    pub fn new(bytes: &[u8]) -> Result<PrivateData, PrivateDataTooLong> {
        if bytes.len() > MAX_PRIVATE {
            return Err(PrivateDataTooLong(bytes.len()));
        }
        let mut p = PrivateData::EMPTY;
        p.bytes[..bytes.len()].copy_from_slice(bytes);
        p.len = bytes.len() as u8;
        Ok(p)
    }

    /// The private data of a parsed frame, which [`Repr::parse`] has bounded.
    pub(crate) fn of_frame(bytes: &[u8]) -> PrivateData {
        let mut p = PrivateData::EMPTY;
        let n = bytes.len().min(MAX_PRIVATE);
        p.bytes[..n].copy_from_slice(&bytes[..n]);
        p.len = n as u8;
        p
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Default for PrivateData {
    fn default() -> PrivateData {
        PrivateData::EMPTY
    }
}

impl fmt::Debug for PrivateData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PrivateData")
            .field(&self.as_slice())
            .finish()
    }
}

impl<'a> TryFrom<&'a [u8]> for PrivateData {
    type Error = PrivateDataTooLong;
    fn try_from(bytes: &'a [u8]) -> Result<PrivateData, PrivateDataTooLong> {
        PrivateData::new(bytes)
    }
}

fn emit_header(b: &mut [u8], kind: Kind, dst: u32, src: u32) {
    let b: &mut [u8; HEADER_LEN] = (&mut b[..HEADER_LEN])
        .try_into()
        .expect("a frame header's room");
    b[field::VERSION] = VERSION;
    b[field::KIND] = kind as u8;
    b[field::FLAGS].fill(0);
    b[field::DST].copy_from_slice(&dst.to_be_bytes());
    b[field::SRC].copy_from_slice(&src.to_be_bytes());
    b[field::CHECKSUM].fill(0);
}

impl<'a> Repr<'a> {
    /// A connection request, or with `peer_to_peer` a peer request.
    pub fn request(
        peer_to_peer: bool,
        attrs: ConnAttrs,
        discriminator: &'a [u8],
        private: &'a [u8],
    ) -> Repr<'a> {
        match peer_to_peer {
            true => Repr::PeerRequest {
                attrs,
                discriminator,
                private,
            },
            false => Repr::ConnRequest {
                attrs,
                discriminator,
                private,
            },
        }
    }

    /// Parses a checked frame. Never panics, whatever the bytes.
    pub fn parse(frame: Frame<&'a [u8]>) -> Result<Repr<'a>, WireError> {
        let b: &'a [u8] = frame.buf;
        let kind = frame.kind();
        Ok(match kind {
            Kind::ConnRequest | Kind::PeerRequest => {
                let attrs = ConnAttrs::parse(b, HEADER_LEN)?;
                let n = b[HEADER_LEN + 2] as usize;
                if n > MAX_DISCRIMINATOR {
                    return Err(WireError::Malformed("discriminator length"));
                }
                let at = HEADER_LEN + 16;
                let discriminator = &b[at..at + n];
                let mut attrs = attrs;
                let mut fixed = kind.fixed_len();
                if ConnAttrs::has_job(b, HEADER_LEN) {
                    attrs.job = parse_key(b, &mut fixed, "job key")?;
                }
                if ConnAttrs::has_nic(b, HEADER_LEN) {
                    attrs.nic = parse_key(b, &mut fixed, "nic token")?;
                }
                let private = parse_private_at(b, fixed)?;
                let peer_to_peer = kind == Kind::PeerRequest;
                Repr::request(peer_to_peer, attrs, discriminator, private)
            }
            Kind::ConnAccept => {
                if ConnAttrs::has_job(b, HEADER_LEN) {
                    return Err(WireError::Malformed("job key in an accept"));
                }
                let mut attrs = ConnAttrs::parse(b, HEADER_LEN)?;
                let mut fixed = kind.fixed_len();
                if ConnAttrs::has_nic(b, HEADER_LEN) {
                    attrs.nic = parse_key(b, &mut fixed, "nic token")?;
                }
                Repr::ConnAccept {
                    attrs,
                    private: parse_private_at(b, fixed)?,
                }
            }
            Kind::ConnReject => Repr::ConnReject {
                reason: RejectReason::from_u8(b[HEADER_LEN])
                    .ok_or(WireError::Malformed("reject reason"))?,
                private: parse_private(b, kind)?,
            },
            Kind::ConnConfirm => Repr::ConnConfirm,
            Kind::Disconnect => Repr::Disconnect {
                ack: be32(b, HEADER_LEN),
                done: be32(b, HEADER_LEN + 4),
            },
            Kind::DisconnectAck => Repr::DisconnectAck,
            Kind::Data => {
                let header = DataHeader::parse(&frame)?;
                let payload = frame.payload();
                // (A bundle's total counts its messages; its entries are
                // checked where it is taken in.)
                if payload.len() as u64 + header.offset as u64 > header.total as u64
                    && header.op != Op::ReadRequest
                    && header.flags & data_flags::BUNDLE == 0
                {
                    return Err(WireError::Malformed("fragment past message end"));
                }
                if header.op == Op::ReadRequest && !payload.is_empty() {
                    return Err(WireError::Malformed("read request with payload"));
                }
                Repr::Data { header, payload }
            }
            Kind::Ack => {
                let n = b[HEADER_LEN + 9] as usize;
                if n > MAX_SACK {
                    return Err(WireError::Malformed("sack count"));
                }
                let fixed = Kind::Ack.fixed_len();
                if b.len() != fixed + 8 * n {
                    return Err(WireError::Malformed("ack length"));
                }
                let mut sack = SackList::default();
                for i in 0..n {
                    let at = fixed + 8 * i;
                    sack.push(be32(b, at), be32(b, at + 4));
                }
                Repr::Ack {
                    ack: be32(b, HEADER_LEN),
                    done: be32(b, HEADER_LEN + 4),
                    flags: b[HEADER_LEN + 8],
                    sack,
                }
            }
            Kind::Nak => Repr::Nak {
                code: NakCode::from_u8(b[HEADER_LEN]).ok_or(WireError::Malformed("nak code"))?,
                psn: be32(b, HEADER_LEN + 4),
                ack: be32(b, HEADER_LEN + 8),
            },
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub fn buffer_len(&self) -> usize {
        match self {
            Repr::ConnRequest { attrs, private, .. } | Repr::PeerRequest { attrs, private, .. } => {
                Kind::ConnRequest.fixed_len() + attrs.keys_len() + private_len(private)
            }
            Repr::ConnAccept { attrs, private } => {
                let attrs = ConnAttrs { job: 0, ..*attrs };
                Kind::ConnAccept.fixed_len() + attrs.keys_len() + private_len(private)
            }
            Repr::ConnReject { private, .. } => Kind::ConnReject.fixed_len() + private_len(private),
            Repr::ConnConfirm | Repr::DisconnectAck => HEADER_LEN,
            Repr::Disconnect { .. } => Kind::Disconnect.fixed_len(),
            Repr::Data { payload, .. } => DATA_HEADER_LEN + payload.len(),
            Repr::Ack { sack, .. } => Kind::Ack.fixed_len() + 8 * sack.len(),
            Repr::Nak { .. } => Kind::Nak.fixed_len(),
        }
    }

    /// Writes the whole frame, checksum included, into `b` and returns its
    /// length. `b` must hold [`buffer_len`](Self::buffer_len) bytes.
    pub fn emit(&self, b: &mut [u8], dst: u32, src: u32) -> usize {
        let len = self.buffer_len();
        let b = &mut b[..len];
        match self {
            Repr::ConnRequest {
                attrs,
                discriminator,
                private,
            }
            | Repr::PeerRequest {
                attrs,
                discriminator,
                private,
            } => {
                let kind = if matches!(self, Repr::PeerRequest { .. }) {
                    Kind::PeerRequest
                } else {
                    Kind::ConnRequest
                };
                emit_header(b, kind, dst, src);
                attrs.emit(b, HEADER_LEN);
                let n = discriminator.len().min(MAX_DISCRIMINATOR);
                b[HEADER_LEN + 2] = n as u8;
                let at = HEADER_LEN + 16;
                b[at..at + MAX_DISCRIMINATOR].fill(0);
                b[at..at + n].copy_from_slice(&discriminator[..n]);
                let mut fixed = kind.fixed_len();
                emit_key(b, &mut fixed, attrs.job);
                emit_key(b, &mut fixed, attrs.nic);
                emit_private_at(b, fixed, private);
            }
            Repr::ConnAccept { attrs, private } => {
                emit_header(b, Kind::ConnAccept, dst, src);
                ConnAttrs { job: 0, ..*attrs }.emit(b, HEADER_LEN);
                let mut fixed = Kind::ConnAccept.fixed_len();
                emit_key(b, &mut fixed, attrs.nic);
                emit_private_at(b, fixed, private);
            }
            Repr::ConnReject { reason, private } => {
                emit_header(b, Kind::ConnReject, dst, src);
                b[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&[*reason as u8, 0, 0, 0]);
                emit_private(b, Kind::ConnReject, private);
            }
            Repr::ConnConfirm => emit_header(b, Kind::ConnConfirm, dst, src),
            Repr::Disconnect { ack, done } => {
                emit_header(b, Kind::Disconnect, dst, src);
                put32(b, HEADER_LEN, *ack);
                put32(b, HEADER_LEN + 4, *done);
            }
            Repr::DisconnectAck => emit_header(b, Kind::DisconnectAck, dst, src),
            Repr::Data { header, payload } => {
                header.emit(b, dst, src);
                b[field::data::PAYLOAD].copy_from_slice(payload);
            }
            Repr::Ack {
                ack,
                done,
                flags,
                sack,
            } => {
                emit_header(b, Kind::Ack, dst, src);
                put32(b, HEADER_LEN, *ack);
                put32(b, HEADER_LEN + 4, *done);
                b[HEADER_LEN + 8] = *flags;
                b[HEADER_LEN + 9] = sack.len() as u8;
                put16(b, HEADER_LEN + 10, 0);
                let fixed = Kind::Ack.fixed_len();
                for (i, (s, e)) in sack.as_slice().iter().enumerate() {
                    put32(b, fixed + 8 * i, *s);
                    put32(b, fixed + 8 * i + 4, *e);
                }
            }
            Repr::Nak { code, psn, ack } => {
                emit_header(b, Kind::Nak, dst, src);
                b[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&[*code as u8, 0, 0, 0]);
                put32(b, HEADER_LEN + 4, *psn);
                put32(b, HEADER_LEN + 8, *ack);
            }
        }
        fill_checksum(b);
        len
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Checks and parses bytes: the two connection ids and the representation.
pub fn parse(bytes: &[u8]) -> Result<(u32, u32, Repr<'_>), WireError> {
    let f = Frame::new_checked(bytes)?;
    Ok((f.dst_conn(), f.src_conn(), Repr::parse(f)?))
}

/// Like [`parse`], without verifying the checksum: for a side whose medium
/// delivers frames intact or not at all (it announced
/// [`ConnAttrs::intact`], so its peers may leave data frames' checksum out).
pub fn parse_intact(bytes: &[u8]) -> Result<(u32, u32, Repr<'_>), WireError> {
    let f = Frame::new_intact(bytes)?;
    Ok((f.dst_conn(), f.src_conn(), Repr::parse(f)?))
}

/// Like [`parse_intact`], for a data frame received in two pieces: its
/// first [`DATA_HEADER_LEN`] bytes in `head`, its payload where the
/// receive placed it (see [`Conn::expected`](crate::Conn::expected)).
pub fn parse_placed<'a>(head: &[u8], payload: &'a [u8]) -> Result<(u32, u32, Repr<'a>), WireError> {
    let f = Frame::new_intact(head)?;
    if f.kind() != Kind::Data || head.len() != DATA_HEADER_LEN {
        return Err(WireError::Malformed("placed frame is not a data header"));
    }
    let header = DataHeader::parse(&f)?;
    if payload.len() as u64 + header.offset as u64 > header.total as u64
        || header.op == Op::ReadRequest
        || header.flags & data_flags::BUNDLE != 0
    {
        return Err(WireError::Malformed("placed frame past its message"));
    }
    Ok((f.dst_conn(), f.src_conn(), Repr::Data { header, payload }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random and mutated inputs: the parser never panics, and what parses
    /// emits back to bytes that parse to the same thing. (The fuzz targets
    /// in `fuzz/` run this far longer; this keeps a floor in every test run.)
    #[test]
    fn arbitrary_bytes_never_panic_and_parsed_frames_round_trip() {
        let mut next = crate::xorshift(0x1234_5678_9abc_def0u64);
        let mut seed = vec![0u8; Repr::Disconnect { ack: 1, done: 2 }.buffer_len()];
        Repr::Disconnect { ack: 1, done: 2 }.emit(&mut seed, 3, 4);
        let mut parsed = 0;
        for i in 0..200_000 {
            let len = (next() % 120) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if i % 2 == 0 && b.len() >= HEADER_LEN {
                // Mostly-valid frames: a real header, random body, right checksum.
                b[0] = VERSION;
                b[1] = 1 + (next() % 9) as u8;
                fill_checksum(&mut b);
            }
            if i % 7 == 0 {
                b = seed.clone();
                let at = (next() as usize) % b.len();
                b[at] ^= 1 << (next() % 8);
            }
            if let Ok((d, s, r)) = parse(&b) {
                parsed += 1;
                let mut out = vec![0u8; r.buffer_len()];
                let n = r.emit(&mut out, d, s);
                let (d2, s2, back) = parse(&out[..n]).expect("emitted frames parse");
                assert_eq!((d2, s2, back), (d, s, r));
            }
        }
        assert!(
            parsed > 1000,
            "the generator reaches the parser's body: {parsed}"
        );
    }

    #[test]
    fn the_checksum_is_crc32() {
        // The standard check value of CRC-32 (IEEE) over "123456789".
        let mut h = crc32fast::Hasher::new();
        h.update(b"123456789");
        assert_eq!(h.finalize(), 0xcbf4_3926);
    }

    const DST: u32 = 0x0102_0304;
    const SRC: u32 = 0x0a0b_0c0d;

    fn data(op: Op, flags: u8, offset: u32, total: u32) -> DataHeader {
        DataHeader {
            psn: 0x8000_0001,
            ack: 0x7fff_fffe,
            msn: 0x0000_0102,
            op,
            flags,
            offset,
            total,
            imm: 0xcafe_f00d,
            rkey: 0x0000_0007,
            raddr: 0x0000_7f00_1234_5678,
            rsn: 0x0000_0003,
            done: 0x0000_0004,
        }
    }

    fn sack(ranges: &[(u32, u32)]) -> SackList {
        let mut s = SackList::default();
        for &(a, b) in ranges {
            assert!(s.push(a, b));
        }
        s
    }

    /// One frame of every kind (and of every data operation), each with
    /// distinct values in every field.
    fn samples() -> Vec<(&'static str, Repr<'static>)> {
        let attrs = ConnAttrs {
            reliability: 1,
            rdma_write: true,
            rdma_read: false,
            max_frame: 1472,
            max_transfer: 0x0100_0000,
            initial_psn: 0xffff_fff0,
            intact: false,
            job: 0,
            nic: 0,
        };
        let attrs2 = ConnAttrs {
            reliability: 2,
            rdma_write: false,
            rdma_read: true,
            max_frame: 9000,
            max_transfer: 65_536,
            initial_psn: 5000,
            intact: true,
            job: 0,
            nic: 0,
        };
        vec![
            (
                "request",
                Repr::ConnRequest {
                    attrs,
                    discriminator: b"sim",
                    private: b"",
                },
            ),
            (
                "accept",
                Repr::ConnAccept {
                    attrs: attrs2,
                    private: b"",
                },
            ),
            (
                "accept-private",
                Repr::ConnAccept {
                    attrs: attrs2,
                    private: b"welcome",
                },
            ),
            (
                "reject",
                Repr::ConnReject {
                    reason: RejectReason::Mismatch,
                    private: b"",
                },
            ),
            ("confirm", Repr::ConnConfirm),
            (
                "disconnect",
                Repr::Disconnect {
                    ack: 0x1122_3344,
                    done: 7,
                },
            ),
            ("disconnect-ack", Repr::DisconnectAck),
            (
                "send",
                Repr::Data {
                    header: data(
                        Op::Send,
                        data_flags::IMM | data_flags::CONSUMES | data_flags::ACK_NOW,
                        1408,
                        1413,
                    ),
                    payload: b"hello",
                },
            ),
            (
                "write",
                Repr::Data {
                    header: data(Op::RdmaWrite, 0, 0, 3),
                    payload: b"abc",
                },
            ),
            (
                "read-request",
                Repr::Data {
                    header: data(Op::ReadRequest, 0, 0, 4096),
                    payload: b"",
                },
            ),
            (
                "read-response",
                Repr::Data {
                    header: data(Op::ReadResponse, 0, 4094, 4096),
                    payload: b"yz",
                },
            ),
            (
                "ack",
                Repr::Ack {
                    ack: 0x0000_1000,
                    done: 2,
                    flags: 0,
                    sack: SackList::default(),
                },
            ),
            (
                "ack-sack",
                Repr::Ack {
                    ack: 0xffff_fffe,
                    done: 9,
                    flags: ack_flags::PING,
                    sack: sack(&[(0xffff_ffff, 2), (5, 6)]),
                },
            ),
            (
                "nak",
                Repr::Nak {
                    code: NakCode::Protection,
                    psn: 0x0000_0021,
                    ack: 0x0000_0020,
                },
            ),
            (
                "peer-request",
                Repr::PeerRequest {
                    attrs: ConnAttrs {
                        reliability: 0,
                        rdma_write: false,
                        rdma_read: false,
                        ..attrs
                    },
                    discriminator: &[0xff; MAX_DISCRIMINATOR],
                    private: b"",
                },
            ),
        ]
    }

    /// The bytes of every sample, field by field, checksum included.
    #[rustfmt::skip]
    fn expected() -> Vec<(&'static str, &'static [u8])> {
        vec![
            ("request", &[
                0x01, 0x01, 0x00, 0x00, // version 1, kind, flags 0
                0x01, 0x02, 0x03, 0x04, // destination connection
                0x0a, 0x0b, 0x0c, 0x0d, // source connection
                0xc6, 0x0a, 0x3b, 0x5e, // CRC-32
                0x01, 0x01, 0x03, 0x00, // reliability, RDMA bits, discriminator length, 0
                0x00, 0x00, 0x05, 0xc0, // largest frame
                0x01, 0x00, 0x00, 0x00, // largest transfer
                0xff, 0xff, 0xff, 0xf0, // initial psn
                0x73, 0x69, 0x6d, 0x00, 0x00, 0x00, 0x00, 0x00, // discriminator, zero-padded
                0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            ]),
            ("accept", &[
                0x01, 0x02, 0x00, 0x00, // version 1, kind, flags 0
                0x01, 0x02, 0x03, 0x04, // destination connection
                0x0a, 0x0b, 0x0c, 0x0d, // source connection
                0x5b, 0x09, 0xc8, 0xeb, // CRC-32
                0x02, 0x02, 0x00, 0x01, // reliability, RDMA bits, 0, flags (intact)
                0x00, 0x00, 0x23, 0x28, // largest frame
                0x00, 0x01, 0x00, 0x00, // largest transfer
                0x00, 0x00, 0x13, 0x88, // initial psn
            ]),
            ("accept-private", &[
                0x01, 0x02, 0x00, 0x00, // version 1, kind, flags 0
                0x01, 0x02, 0x03, 0x04, // destination connection
                0x0a, 0x0b, 0x0c, 0x0d, // source connection
                0x8c, 0xc4, 0x2f, 0x74, // CRC-32
                0x02, 0x02, 0x00, 0x01, // reliability, RDMA bits, 0, flags (intact)
                0x00, 0x00, 0x23, 0x28, // largest frame
                0x00, 0x01, 0x00, 0x00, // largest transfer
                0x00, 0x00, 0x13, 0x88, // initial psn
                0x07,                   // private data length
                0x77, 0x65, 0x6c, 0x63, 0x6f, 0x6d, 0x65, // private data "welcome"
            ]),
            ("reject", &[
                0x01, 0x03, 0x00, 0x00, // version 1, kind, flags 0
                0x01, 0x02, 0x03, 0x04, // destination connection
                0x0a, 0x0b, 0x0c, 0x0d, // source connection
                0x43, 0x02, 0x8e, 0x3d, // CRC-32
                0x03, 0x00, 0x00, 0x00, // reason 3 (mismatch), 0, 0, 0
            ]),
            ("confirm", &[
                0x01, 0x04, 0x00, 0x00, // version 1, kind, flags 0
                0x01, 0x02, 0x03, 0x04, // destination connection
                0x0a, 0x0b, 0x0c, 0x0d, // source connection
                0xa1, 0x28, 0xec, 0xfe, // CRC-32
            ]),
            ("disconnect", &[
                0x01, 0x05, 0x00, 0x00, // version 1, kind, flags 0
                0x01, 0x02, 0x03, 0x04, // destination connection
                0x0a, 0x0b, 0x0c, 0x0d, // source connection
                0x2f, 0xc2, 0xc9, 0xf2, // CRC-32
                0x11, 0x22, 0x33, 0x44, // cumulative ack
                0x00, 0x00, 0x00, 0x07, // done count
            ]),
            ("disconnect-ack", &[
                0x01, 0x06, 0x00, 0x00, // version 1, kind, flags 0
                0x01, 0x02, 0x03, 0x04, // destination connection
                0x0a, 0x0b, 0x0c, 0x0d, // source connection
                0x09, 0xae, 0x5d, 0x6f, // CRC-32
            ]),
            ("send", &[
                0x01, 0x07, 0x00, 0x00, // version 1, kind, flags 0
                0x01, 0x02, 0x03, 0x04, // destination connection
                0x0a, 0x0b, 0x0c, 0x0d, // source connection
                0xc5, 0xb0, 0xf9, 0x2a, // CRC-32
                0x80, 0x00, 0x00, 0x01, // psn
                0x7f, 0xff, 0xff, 0xfe, // cumulative ack
                0x00, 0x00, 0x01, 0x02, // msn
                0x01, 0x07, 0x00, 0x00, // operation, flags, 0, 0
                0x00, 0x00, 0x05, 0x80, // fragment offset
                0x00, 0x00, 0x05, 0x85, // total length
                0xca, 0xfe, 0xf0, 0x0d, // immediate data
                0x00, 0x00, 0x00, 0x07, // RDMA key
                0x00, 0x00, 0x7f, 0x00, 0x12, 0x34, 0x56, 0x78, // RDMA address
                0x00, 0x00, 0x00, 0x03, // rsn
                0x00, 0x00, 0x00, 0x04, // done count
                0x68, 0x65, 0x6c, 0x6c, 0x6f, // payload
            ]),
            ("write", &[
                0x01, 0x07, 0x00, 0x00, // version 1, kind, flags 0
                0x01, 0x02, 0x03, 0x04, // destination connection
                0x0a, 0x0b, 0x0c, 0x0d, // source connection
                0x5e, 0xed, 0x5c, 0xcf, // CRC-32
                0x80, 0x00, 0x00, 0x01, // psn
                0x7f, 0xff, 0xff, 0xfe, // cumulative ack
                0x00, 0x00, 0x01, 0x02, // msn
                0x02, 0x00, 0x00, 0x00, // operation, flags, 0, 0
                0x00, 0x00, 0x00, 0x00, // fragment offset
                0x00, 0x00, 0x00, 0x03, // total length
                0xca, 0xfe, 0xf0, 0x0d, // immediate data
                0x00, 0x00, 0x00, 0x07, // RDMA key
                0x00, 0x00, 0x7f, 0x00, 0x12, 0x34, 0x56, 0x78, // RDMA address
                0x00, 0x00, 0x00, 0x03, // rsn
                0x00, 0x00, 0x00, 0x04, // done count
                0x61, 0x62, 0x63, // payload
            ]),
            ("read-request", &[
                0x01, 0x07, 0x00, 0x00, // version 1, kind, flags 0
                0x01, 0x02, 0x03, 0x04, // destination connection
                0x0a, 0x0b, 0x0c, 0x0d, // source connection
                0x36, 0xb7, 0x88, 0x04, // CRC-32
                0x80, 0x00, 0x00, 0x01, // psn
                0x7f, 0xff, 0xff, 0xfe, // cumulative ack
                0x00, 0x00, 0x01, 0x02, // msn
                0x03, 0x00, 0x00, 0x00, // operation, flags, 0, 0
                0x00, 0x00, 0x00, 0x00, // fragment offset
                0x00, 0x00, 0x10, 0x00, // total length
                0xca, 0xfe, 0xf0, 0x0d, // immediate data
                0x00, 0x00, 0x00, 0x07, // RDMA key
                0x00, 0x00, 0x7f, 0x00, 0x12, 0x34, 0x56, 0x78, // RDMA address
                0x00, 0x00, 0x00, 0x03, // rsn
                0x00, 0x00, 0x00, 0x04, // done count
            ]),
            ("read-response", &[
                0x01, 0x07, 0x00, 0x00, // version 1, kind, flags 0
                0x01, 0x02, 0x03, 0x04, // destination connection
                0x0a, 0x0b, 0x0c, 0x0d, // source connection
                0x6c, 0x97, 0x87, 0x77, // CRC-32
                0x80, 0x00, 0x00, 0x01, // psn
                0x7f, 0xff, 0xff, 0xfe, // cumulative ack
                0x00, 0x00, 0x01, 0x02, // msn
                0x04, 0x00, 0x00, 0x00, // operation, flags, 0, 0
                0x00, 0x00, 0x0f, 0xfe, // fragment offset
                0x00, 0x00, 0x10, 0x00, // total length
                0xca, 0xfe, 0xf0, 0x0d, // immediate data
                0x00, 0x00, 0x00, 0x07, // RDMA key
                0x00, 0x00, 0x7f, 0x00, 0x12, 0x34, 0x56, 0x78, // RDMA address
                0x00, 0x00, 0x00, 0x03, // rsn
                0x00, 0x00, 0x00, 0x04, // done count
                0x79, 0x7a, // payload
            ]),
            ("ack", &[
                0x01, 0x08, 0x00, 0x00, // version 1, kind, flags 0
                0x01, 0x02, 0x03, 0x04, // destination connection
                0x0a, 0x0b, 0x0c, 0x0d, // source connection
                0xaa, 0xbe, 0x70, 0xc9, // CRC-32
                0x00, 0x00, 0x10, 0x00, // cumulative ack
                0x00, 0x00, 0x00, 0x02, // done count
                0x00, 0x00, 0x00, 0x00, // flags, range count, 0, 0
            ]),
            ("ack-sack", &[
                0x01, 0x08, 0x00, 0x00, // version 1, kind, flags 0
                0x01, 0x02, 0x03, 0x04, // destination connection
                0x0a, 0x0b, 0x0c, 0x0d, // source connection
                0xac, 0x32, 0x31, 0x10, // CRC-32
                0xff, 0xff, 0xff, 0xfe, // cumulative ack
                0x00, 0x00, 0x00, 0x09, // done count
                0x01, 0x02, 0x00, 0x00, // flags (ping), range count, 0, 0
                0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x02, // range [start, end)
                0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x06, // range [start, end)
            ]),
            ("nak", &[
                0x01, 0x09, 0x00, 0x00, // version 1, kind, flags 0
                0x01, 0x02, 0x03, 0x04, // destination connection
                0x0a, 0x0b, 0x0c, 0x0d, // source connection
                0x29, 0x0d, 0x4d, 0x8c, // CRC-32
                0x03, 0x00, 0x00, 0x00, // code 3 (protection), 0, 0, 0
                0x00, 0x00, 0x00, 0x21, // psn
                0x00, 0x00, 0x00, 0x20, // cumulative ack
            ]),
            ("peer-request", &[
                0x01, 0x0a, 0x00, 0x00, // version 1, kind, flags 0
                0x01, 0x02, 0x03, 0x04, // destination connection
                0x0a, 0x0b, 0x0c, 0x0d, // source connection
                0xf2, 0xb8, 0x5e, 0x24, // CRC-32
                0x00, 0x00, 0x20, 0x00, // reliability, RDMA bits, discriminator length, 0
                0x00, 0x00, 0x05, 0xc0, // largest frame
                0x01, 0x00, 0x00, 0x00, // largest transfer
                0xff, 0xff, 0xff, 0xf0, // initial psn
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // discriminator
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            ]),
        ]
    }

    fn bytes_of(r: &Repr<'_>) -> Vec<u8> {
        let mut b = vec![0u8; r.buffer_len()];
        assert_eq!(r.emit(&mut b, DST, SRC), b.len());
        b
    }

    /// CRC-32 (IEEE, reflected) one bit at a time: a check on the table-
    /// driven implementation the parser uses.
    fn reference_crc(b: &[u8]) -> u32 {
        let mut c = !0u32;
        for (i, &x) in b.iter().enumerate() {
            let x = if (12..16).contains(&i) { 0 } else { x };
            c ^= x as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0xedb8_8320
                } else {
                    c >> 1
                };
            }
        }
        !c
    }

    #[test]
    fn every_kind_emits_and_parses_its_bytes() {
        let want = expected();
        let samples = samples();
        assert_eq!(want.len(), samples.len());
        let mut kinds = vec![];
        let mut ops = vec![];
        for ((name, repr), (wname, bytes)) in samples.iter().zip(&want) {
            assert_eq!(name, wname);
            assert_eq!(bytes_of(repr), *bytes, "{name}: emitted bytes");
            assert_eq!(parse(bytes), Ok((DST, SRC, repr.clone())), "{name}: parsed");
            assert_eq!(
                reference_crc(bytes).to_be_bytes(),
                bytes[12..16],
                "{name}: checksum"
            );
            kinds.push(bytes[1]);
            if let Repr::Data { header, .. } = repr {
                ops.push(header.op as u8);
            }
        }
        kinds.sort();
        kinds.dedup();
        assert_eq!(kinds, (1..=10).collect::<Vec<u8>>(), "every kind");
        assert_eq!(ops, [1, 2, 3, 4], "every data operation");
    }

    /// Bytes with their checksum made right again, so that the parser
    /// reads past it.
    fn resealed(mut b: Vec<u8>) -> Vec<u8> {
        if b.len() >= HEADER_LEN {
            fill_checksum(&mut b);
        }
        b
    }

    #[test]
    fn a_job_key_rides_between_a_request_and_its_private_data() {
        let attrs = ConnAttrs {
            job: 0x0102_0304_0506_0708,
            nic: 0,
            ..samples_attrs()
        };
        let repr = Repr::ConnRequest {
            attrs,
            discriminator: b"sim",
            private: b"hi",
        };
        let b = bytes_of(&repr);
        let fixed = Kind::ConnRequest.fixed_len();
        assert_eq!(b.len(), fixed + 8 + 1 + 2);
        assert_eq!(b[HEADER_LEN + 3] & attr_flags::JOB, attr_flags::JOB);
        assert_eq!(b[fixed..fixed + 8], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[fixed + 8..], &[2, b'h', b'i']);
        assert_eq!(parse(&b), Ok((DST, SRC, repr.clone())));
        // Without a key the frame is the one it always was.
        let plain = Repr::ConnRequest {
            attrs: samples_attrs(),
            discriminator: b"sim",
            private: b"hi",
        };
        assert_eq!(bytes_of(&plain).len(), fixed + 3);
        // The flag with the key cut off, or a zero key: malformed.
        let cut = resealed(b[..fixed + 4].to_vec());
        assert_eq!(parse(&cut).unwrap_err(), WireError::Malformed("job key"));
        let mut zero = b.clone();
        zero[fixed..fixed + 8].fill(0);
        let zero = resealed(zero);
        assert_eq!(parse(&zero).unwrap_err(), WireError::Malformed("job key"));
        // An accept never carries one: its key is dropped when written,
        // and a flag on the wire is refused.
        let accept = Repr::ConnAccept {
            attrs,
            private: b"",
        };
        let a = bytes_of(&accept);
        assert_eq!(a[HEADER_LEN + 3] & attr_flags::JOB, 0);
        let mut flagged = a.clone();
        flagged[HEADER_LEN + 3] |= attr_flags::JOB;
        assert_eq!(
            parse(&resealed(flagged)).unwrap_err(),
            WireError::Malformed("job key in an accept")
        );
    }

    #[test]
    fn a_nic_token_rides_after_the_job_key_in_requests_and_accepts() {
        let attrs = ConnAttrs {
            job: 0x0102_0304_0506_0708,
            nic: 0x1112_1314_1516_1718,
            ..samples_attrs()
        };
        let repr = Repr::ConnRequest {
            attrs,
            discriminator: b"sim",
            private: b"hi",
        };
        let b = bytes_of(&repr);
        let fixed = Kind::ConnRequest.fixed_len();
        assert_eq!(b.len(), fixed + 16 + 3);
        assert_eq!(b[HEADER_LEN + 3] & attr_flags::NIC, attr_flags::NIC);
        assert_eq!(
            b[fixed + 8..fixed + 16],
            [0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]
        );
        assert_eq!(parse(&b), Ok((DST, SRC, repr.clone())));
        // An accept carries the token (and drops the job key).
        let accept = Repr::ConnAccept {
            attrs,
            private: b"ok",
        };
        let a = bytes_of(&accept);
        let fixed = Kind::ConnAccept.fixed_len();
        assert_eq!(a.len(), fixed + 8 + 3);
        let (_, _, got) = parse(&a).unwrap();
        match got {
            Repr::ConnAccept {
                attrs: got,
                private,
            } => {
                assert_eq!((got.nic, got.job, private), (attrs.nic, 0, &b"ok"[..]));
            }
            other => panic!("an accept parsed as {other:?}"),
        }
        // The flag with the token cut off, or a zero token: malformed.
        let cut = resealed(a[..fixed + 5].to_vec());
        assert_eq!(parse(&cut).unwrap_err(), WireError::Malformed("nic token"));
        let mut zero = a.clone();
        zero[fixed..fixed + 8].fill(0);
        assert_eq!(
            parse(&resealed(zero)).unwrap_err(),
            WireError::Malformed("nic token")
        );
    }

    fn samples_attrs() -> ConnAttrs {
        match samples()[0].1 {
            Repr::ConnRequest { attrs, .. } => attrs,
            _ => unreachable!("the first sample is a request"),
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        for (name, repr) in samples() {
            let b = bytes_of(&repr);
            let fixed = Kind::from_u8(b[1]).expect("kind").fixed_len();
            for n in 0..b.len() {
                let cut = &b[..n];
                let want = if n < fixed {
                    WireError::Truncated
                } else {
                    WireError::Checksum
                };
                assert_eq!(parse(cut).unwrap_err(), want, "{name} cut to {n}");
                // Resealed: a cut into the fixed part is still too short; a
                // cut into an ack's ranges or into private data leaves a
                // count that does not match (a cut right after the fixed
                // part, none at all); a cut into a payload is a shorter
                // fragment.
                let sealed = resealed(cut.to_vec());
                let r = parse(&sealed).map(|(_, _, r)| r);
                match (&repr, n < fixed) {
                    (_, true) => assert_eq!(r, Err(WireError::Truncated), "{name} {n}"),
                    (Repr::Ack { .. }, false) => {
                        assert_eq!(r, Err(WireError::Malformed("ack length")), "{name} {n}")
                    }
                    (Repr::ConnAccept { attrs, .. }, false) if n == fixed => assert_eq!(
                        r,
                        Ok(Repr::ConnAccept {
                            attrs: *attrs,
                            private: b"",
                        }),
                        "{name} {n}"
                    ),
                    (Repr::ConnAccept { .. }, false) => assert_eq!(
                        r,
                        Err(WireError::Malformed("private data length")),
                        "{name} {n}"
                    ),
                    (Repr::Data { header, payload }, false) => assert_eq!(
                        r,
                        Ok(Repr::Data {
                            header: *header,
                            payload: &payload[..n - DATA_HEADER_LEN],
                        }),
                        "{name} {n}"
                    ),
                    _ => unreachable!("{name}: no variable part"),
                }
            }
        }
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        for (name, repr) in samples() {
            let b = bytes_of(&repr);
            for bit in 0..b.len() * 8 {
                let mut c = b.clone();
                c[bit / 8] ^= 1 << (bit % 8);
                let e = parse(&c).expect_err(name);
                match bit / 8 {
                    0 => assert_eq!(e, WireError::Version(c[0])),
                    1 => match Kind::from_u8(c[1]) {
                        None => assert_eq!(e, WireError::Kind(c[1])),
                        // Another kind: too short for it, or its checksum fails.
                        Some(_) => assert!(
                            matches!(e, WireError::Truncated | WireError::Checksum),
                            "{name} bit {bit}: {e:?}"
                        ),
                    },
                    _ => assert_eq!(e, WireError::Checksum, "{name} bit {bit}"),
                }
            }
        }
    }

    #[test]
    fn other_versions_and_unknown_kinds_are_refused() {
        let b = bytes_of(&Repr::ConnConfirm);
        for v in [0u8, 2, 0x81, 0xff] {
            let mut c = b.clone();
            c[0] = v;
            assert_eq!(parse(&resealed(c)).unwrap_err(), WireError::Version(v));
        }
        for k in (0u8..=255).filter(|k| !(1..=10).contains(k)) {
            let mut c = vec![0u8; 200];
            c[..HEADER_LEN].copy_from_slice(&b);
            c[1] = k;
            assert_eq!(parse(&resealed(c)).unwrap_err(), WireError::Kind(k));
        }
    }

    /// A kind byte past the last kind (11), with a right checksum and the
    /// length of an ack: refused by its kind, whether or not the checksum
    /// is looked at, never read as any kind it is not.
    #[test]
    fn an_unknown_kind_is_refused() {
        let bytes: &[u8] = &[
            0x01, 0x0b, 0x00, 0x00, // version 1, kind 11 (none), flags 0
            0x01, 0x02, 0x03, 0x04, // destination connection
            0x0a, 0x0b, 0x0c, 0x0d, // source connection
            0x19, 0x2a, 0x5d, 0x0a, // CRC-32
            0x00, 0x00, 0x10, 0x00, // what would be an ack's cumulative ack
            0x00, 0x00, 0x00, 0x02, // done count
            0x00, 0x00, 0x00, 0x00, // flags, range count, 0, 0
        ];
        assert_eq!(reference_crc(bytes).to_be_bytes(), bytes[12..16]);
        assert_eq!(parse(bytes).unwrap_err(), WireError::Kind(11));
        assert_eq!(parse_intact(bytes).unwrap_err(), WireError::Kind(11));
        let mut ack = bytes.to_vec();
        ack[1] = Kind::Ack as u8;
        assert!(matches!(
            parse(&resealed(ack)),
            Ok((_, _, Repr::Ack { .. }))
        ));
        // Kind 0 and the top of the range, the header alone.
        for k in [0x00, 0xff] {
            let mut b = bytes[..HEADER_LEN].to_vec();
            b[1] = k;
            assert_eq!(parse(&resealed(b.clone())).unwrap_err(), WireError::Kind(k));
            assert_eq!(parse_intact(&b).unwrap_err(), WireError::Kind(k));
        }
    }

    fn sample(name: &str) -> Repr<'static> {
        samples()
            .into_iter()
            .find(|(n, _)| *n == name)
            .expect("sample")
            .1
    }

    /// The sample `name` with byte `at` set to `v` (checksum made right).
    fn with(name: &str, at: usize, v: u8) -> Result<Repr<'static>, WireError> {
        let mut b = bytes_of(&sample(name));
        b[at] = v;
        let b: &'static [u8] = Vec::leak(resealed(b));
        parse(b).map(|(_, _, r)| r)
    }

    #[test]
    fn malformed_fields_are_named() {
        let m = |s| Err(WireError::Malformed(s));
        for name in ["request", "accept", "peer-request"] {
            assert_eq!(with(name, 16, 3), m("reliability level"), "{name}");
            assert_eq!(with(name, 17, 4), m("rdma flags"), "{name}");
            assert_eq!(with(name, 19, 8), m("attribute flags"), "{name}");
        }
        for name in ["request", "peer-request"] {
            assert_eq!(with(name, 18, 33), m("discriminator length"), "{name}");
            assert_eq!(with(name, 18, 0xff), m("discriminator length"), "{name}");
            assert!(with(name, 18, 32).is_ok(), "{name}: the longest");
        }
        for v in [0, 6, 0xff] {
            assert_eq!(with("reject", 16, v), m("reject reason"));
        }
        // Private data: its length byte (byte 32 of an accept) past the
        // most a frame carries, or not what follows.
        assert_eq!(with("accept-private", 32, 65), m("private data length"));
        assert_eq!(with("accept-private", 32, 0xff), m("private data length"));
        assert_eq!(with("accept-private", 32, 8), m("private data length"));
        assert_eq!(with("accept-private", 32, 6), m("private data length"));
        let mut b = bytes_of(&sample("accept-private"));
        b.push(0);
        assert_eq!(
            parse(&resealed(b)).unwrap_err(),
            WireError::Malformed("private data length")
        );
        // Every handshake kind: the most private data parses, one byte
        // more is refused even when the bytes are there.
        for name in ["request", "accept", "reject", "peer-request"] {
            for (n, ok) in [(MAX_PRIVATE, true), (MAX_PRIVATE + 1, false)] {
                let mut b = bytes_of(&sample(name));
                b.push(n as u8);
                b.extend(std::iter::repeat_n(0x5a, n));
                let r = parse(&resealed(b)).map(|(_, _, r)| r.buffer_len());
                match ok {
                    true => assert_eq!(r, Ok(sample(name).buffer_len() + 1 + n), "{name}"),
                    false => assert_eq!(r, m("private data length").map(|_: Repr| 0), "{name}"),
                }
            }
        }
        for v in [0, 7, 0xff] {
            assert_eq!(with("nak", 16, v), m("nak code"));
        }
        for v in [0, 5, 0xff] {
            assert_eq!(with("send", 28, v), m("data operation"));
        }
        // The send sample carries bytes 1408..1413 of its message: a total
        // one byte shorter puts the fragment past the end, and so does an
        // offset near the top of the range (no overflow).
        assert_eq!(with("send", 39, 0x84), m("fragment past message end"));
        assert_eq!(with("send", 32, 0xff), m("fragment past message end"));
        // A read request carries no bytes.
        let mut b = bytes_of(&sample("read-request"));
        b.push(0);
        assert_eq!(
            parse(&resealed(b)).unwrap_err(),
            WireError::Malformed("read request with payload")
        );
        // Range counts: more than an ack carries, or not what follows.
        assert_eq!(with("ack", 25, 9), m("sack count"));
        assert_eq!(with("ack", 25, 0xff), m("sack count"));
        assert_eq!(with("ack", 25, 1), m("ack length"));
        assert_eq!(with("ack-sack", 25, 1), m("ack length"));
        assert_eq!(with("ack-sack", 25, 3), m("ack length"));
        let mut b = bytes_of(&sample("ack-sack"));
        b.extend_from_slice(&[0; 8]);
        assert_eq!(
            parse(&resealed(b)).unwrap_err(),
            WireError::Malformed("ack length")
        );
        // A full ack: eight ranges.
        let mut sack = SackList::default();
        for i in 0..MAX_SACK as u32 {
            assert!(sack.push(10 * i, 10 * i + 5));
        }
        assert!(!sack.push(0, 1), "no ninth range");
        let full = Repr::Ack {
            ack: 0,
            done: 0,
            flags: 0,
            sack,
        };
        assert_eq!(full.buffer_len(), 28 + 8 * MAX_SACK);
        assert_eq!(parse(&bytes_of(&full)), Ok((DST, SRC, full)));
    }

    #[test]
    fn bundle_entries_read_back_and_malformed_ones_are_named() {
        let mut b = vec![0u8; 3 * bundle::ENTRY_LEN + 5 + 3];
        bundle::emit_entry(&mut b[0..], 5, Some(0xdead_beef));
        b[8..13].copy_from_slice(b"hello");
        bundle::emit_entry(&mut b[13..], 0, None);
        bundle::emit_entry(&mut b[21..], 3, None);
        b[29..32].copy_from_slice(b"abc");
        assert_eq!(
            &b[0..8],
            &[0, 5, data_flags::IMM, 0, 0xde, 0xad, 0xbe, 0xef]
        );
        let got: Vec<_> = bundle::entries(&b, 3).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            got,
            vec![
                bundle::Entry {
                    imm: Some(0xdead_beef),
                    bytes: b"hello"
                },
                bundle::Entry {
                    imm: None,
                    bytes: b""
                },
                bundle::Entry {
                    imm: None,
                    bytes: b"abc"
                },
            ]
        );
        let err = |payload: &[u8], n| bundle::entries(payload, n).find_map(Result::err);
        assert_eq!(
            err(&b, 2),
            Some(WireError::Malformed("bytes after a bundle's last entry"))
        );
        assert_eq!(
            err(&b, 4),
            Some(WireError::Malformed("bundle entry truncated"))
        );
        assert_eq!(
            err(&b[..31], 3),
            Some(WireError::Malformed("bundle entry past the frame"))
        );
        let mut flags = b.clone();
        flags[2] |= 0x80;
        assert_eq!(
            err(&flags, 3),
            Some(WireError::Malformed("bundle entry flags"))
        );
        // An error ends the entries.
        assert_eq!(bundle::entries(&b, 4).count(), 4);
        assert_eq!(bundle::entries(&b[..31], 3).count(), 3);
    }
}
