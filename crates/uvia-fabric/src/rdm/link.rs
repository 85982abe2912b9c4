//! The links of a reliable-datagram endpoint: one ring per ordered pair of
//! endpoints, in a segment the sender creates and passes to the receiver
//! over the receiver's listening socket, so a send to a new peer needs no
//! answer before its first record is written (the connect of a Unix socket
//! completes at once while the peer listens). Each link carries one
//! direction; a pair that talks both ways has two.
//!
//! A message is a first record, its header ([`Head`]) and as much of its
//! bytes as fit a chunk, then continuation records of bare bytes until all
//! are written: the receiver knows from the header how many follow.

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;
use uvia_shm::ring::{Consumer, Producer, Record};
use uvia_shm::socket::hex_name;
use uvia_shm::{ring_bytes, Listener, Segment, SocketDir, Stream};

/// Bytes of an endpoint's name (`fi_getname`, an AV entry).
pub const NAME_LEN: usize = 16;
/// The first bytes of every name: a name from elsewhere is refused.
const MAGIC: [u8; 4] = *b"uvR1";
/// The first bytes of a link's hello.
const HELLO_MAGIC: [u8; 8] = *b"uviaRDM1";

/// An endpoint's address: the magic, its process id, a value drawn when
/// the process made its first endpoint and the endpoint's serial number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Name(pub [u8; NAME_LEN]);

impl Name {
    /// A fresh name for an endpoint of this process.
    pub fn fresh() -> Name {
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::sync::OnceLock;
        static NONCE: OnceLock<u32> = OnceLock::new();
        static SERIAL: AtomicU32 = AtomicU32::new(0);
        let nonce = *NONCE.get_or_init(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            t.subsec_nanos() ^ (t.as_secs() as u32).rotate_left(16)
        });
        let mut b = [0u8; NAME_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4..8].copy_from_slice(&std::process::id().to_le_bytes());
        b[8..12].copy_from_slice(&nonce.to_le_bytes());
        b[12..].copy_from_slice(&SERIAL.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        Name(b)
    }

    /// The name in `bytes`, if it is one.
    pub fn parse(bytes: &[u8]) -> Option<Name> {
        let b: [u8; NAME_LEN] = bytes.get(..NAME_LEN)?.try_into().ok()?;
        (b[..4] == MAGIC).then_some(Name(b))
    }

    /// The path of the socket the endpoint of this name listens on.
    pub fn socket(&self, dir: &SocketDir) -> std::path::PathBuf {
        dir.socket(&hex_name("rdm", &self.0))
    }
}

/// The header of a message's first record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Head {
    pub tag: u64,
    /// Remote CQ data (`FI_REMOTE_CQ_DATA`).
    pub data: u64,
    /// The message's whole length.
    pub len: u32,
    pub flags: u32,
}

pub const HEAD_LEN: usize = std::mem::size_of::<Head>();
/// The message is tagged (else a plain `fi_send`'s).
pub const TAGGED: u32 = 1;
/// The header's data is remote CQ data.
pub const DATA: u32 = 2;

/// Lines of a link's ring: 256 KiB, room for a few chunks in flight.
pub const RING_LINES: usize = 4096;
/// Most bytes of a message in one record (the first's header aside).
pub const CHUNK: usize = 16 * 1024;

/// The sending end of a link.
pub struct Out {
    prod: Producer,
    stream: Stream,
    /// Keeps the ring mapped.
    _seg: Segment,
}

impl Out {
    /// Makes a link to the endpoint `peer` names: connects to the peer's
    /// socket (once: an error if nobody listens or its backlog is full),
    /// creates the ring and passes it with this endpoint's name.
    pub fn connect(dir: &SocketDir, me: &Name, peer: &Name) -> io::Result<Out> {
        // One try, not a wait: the caller holds its endpoint's lock, and
        // tries again after progress while the peer's backlog is full.
        let stream = Stream::connect(&peer.socket(dir), Duration::ZERO)
            .map_err(|e| io::Error::new(io::ErrorKind::ConnectionRefused, e.to_string()))?;
        let bytes = ring_bytes(RING_LINES);
        let name = CString::new("uvia-rdm").expect("no NUL");
        let seg = Segment::create(&name, bytes)?;
        let mut hello = [0u8; 8 + NAME_LEN + 4];
        hello[..8].copy_from_slice(&HELLO_MAGIC);
        hello[8..8 + NAME_LEN].copy_from_slice(&me.0);
        hello[8 + NAME_LEN..].copy_from_slice(&(RING_LINES as u32).to_le_bytes());
        stream.send(&hello, &[seg.fd().as_raw_fd()])?;
        // SAFETY: a fresh zero-filled segment of ring_bytes(RING_LINES),
        // mapped while `_seg` lives; this is its only producer.
        let prod = unsafe { Producer::new(seg.as_ptr(), RING_LINES) };
        Ok(Out {
            prod,
            stream,
            _seg: seg,
        })
    }

    /// Writes the first record of a message: `head` and `bytes` (at most a
    /// chunk). False if the ring has no room now.
    #[inline]
    pub fn first(&mut self, head: &Head, bytes: &[u8]) -> bool {
        debug_assert!(bytes.len() <= CHUNK);
        let Some(p) = self.prod.reserve(HEAD_LEN + bytes.len()) else {
            return false;
        };
        // SAFETY: the reservation holds HEAD_LEN + bytes.len() bytes; the
        // body is 8-byte aligned (a line plus the record header).
        unsafe {
            std::ptr::write_unaligned(p as *mut Head, *head);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.add(HEAD_LEN), bytes.len());
        }
        self.prod.commit();
        true
    }

    /// Writes a continuation record of `bytes` (at most a chunk). False if
    /// the ring has no room now.
    pub fn more(&mut self, bytes: &[u8]) -> bool {
        let Some(p) = self.prod.reserve(bytes.len()) else {
            return false;
        };
        // SAFETY: the reservation holds bytes.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
        self.prod.commit();
        true
    }

    /// True once the receiving endpoint has closed or its process died.
    /// A system call: only for a ring that stays full.
    pub fn peer_gone(&self) -> bool {
        self.stream.peer_gone()
    }
}

/// The receiving end of a link.
pub struct In {
    cons: Consumer,
    stream: Stream,
    _seg: Segment,
    /// The sending endpoint's name.
    pub peer: Name,
}

impl In {
    /// The link a connection's hello passes, or why it is refused.
    pub fn accept(stream: Stream, hello: &[u8], fds: Vec<std::os::fd::OwnedFd>) -> io::Result<In> {
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
        if hello.len() != 8 + NAME_LEN + 4 || hello[..8] != HELLO_MAGIC {
            return Err(bad("not a uvia link's hello"));
        }
        let peer = Name::parse(&hello[8..8 + NAME_LEN]).ok_or_else(|| bad("a bad name"))?;
        let lines = u32::from_le_bytes(hello[8 + NAME_LEN..].try_into().expect("4 bytes")) as usize;
        if lines != RING_LINES {
            return Err(bad("a ring of another size"));
        }
        let fd = fds
            .into_iter()
            .next()
            .ok_or_else(|| bad("no ring passed"))?;
        let seg = Segment::open_exact(fd, ring_bytes(lines))?;
        // SAFETY: the segment is ring_bytes(lines) long and line aligned
        // (a mapping), sealed against shrinking; this is its one consumer.
        let cons = unsafe { Consumer::new(seg.as_ptr(), lines) };
        Ok(In {
            cons,
            stream,
            _seg: seg,
            peer,
        })
    }

    /// The next record, if one is there. A corrupt one is an error: the
    /// link is then dropped.
    #[inline]
    pub fn peek(&mut self) -> io::Result<Option<Record>> {
        self.cons
            .peek()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
    }

    /// Gives a record's lines back to the sender.
    #[inline]
    pub fn release(&mut self, rec: Record) {
        self.cons.release(rec)
    }

    /// True once the sender has closed its end or died.
    pub fn peer_gone(&self) -> bool {
        self.stream.peer_gone()
    }
}

/// An endpoint's listening socket and the connections it accepted whose
/// hello has not come yet.
pub struct Door {
    listener: Listener,
    waiting: Vec<Stream>,
}

impl Door {
    pub fn open(dir: &SocketDir, me: &Name) -> io::Result<Door> {
        Ok(Door {
            listener: Listener::bind(&me.socket(dir))?,
            waiting: Vec::new(),
        })
    }

    /// The links whose hello has come, accepting what connected since the
    /// last look; a connection that sends something else is dropped.
    pub fn look(&mut self) -> Vec<In> {
        while let Ok(Some(s)) = self.listener.accept(Some(Duration::ZERO)) {
            self.waiting.push(s);
        }
        let mut links = Vec::new();
        let mut i = 0;
        while i < self.waiting.len() {
            let mut buf = [0u8; 64];
            match self.waiting[i].recv(&mut buf, Some(Duration::ZERO)) {
                Ok(None) => i += 1,
                Ok(Some((n, fds))) => {
                    let s = self.waiting.swap_remove(i);
                    match In::accept(s, &buf[..n], fds) {
                        Ok(l) => links.push(l),
                        Err(e) => eprintln!("libfabric:uvia: refused a link: {e}"),
                    }
                }
                Err(_) => {
                    self.waiting.swap_remove(i);
                }
            }
        }
        links
    }
}
