//! What a reliable-datagram endpoint holds behind its lock: its links, the
//! receives posted and the messages that came before a receive matched
//! them, and a large send part written. No libfabric object here: the
//! completions go to a [`Sink`], so the matching is tested on its own.
//!
//! Matching is libfabric's: a message takes the first posted receive of its
//! kind (tagged or not) whose tag matches under the receive's ignore mask
//! and, for a directed receive, whose source is the message's; a receive
//! posted takes the first such message that came unexpected. Messages from
//! one peer come in the order they were sent, the ring's.

use super::av::FI_ADDR_UNSPEC;
use super::link::{Door, Head, In, Name, Out, CHUNK, DATA, HEAD_LEN, TAGGED};
use crate::sys::*;
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

/// Where completions go: the endpoint's CQs, or a test's lists.
pub trait Sink {
    fn sent(&mut self, context: *mut c_void, flags: u64, len: usize);
    #[allow(clippy::too_many_arguments)]
    fn received(&mut self, r: &Recv, len: usize, data: u64, tag: u64, src: fi_addr_t, flags: u64);
    /// A receive that failed: truncated (`olen` bytes cut) or cancelled,
    /// or a peek that found nothing.
    fn failed(&mut self, r: &Recv, len: usize, data: u64, tag: u64, olen: usize, err: c_int);
    /// A send that failed (its peer gone with part of it unwritten).
    fn send_failed(&mut self, context: *mut c_void, flags: u64, len: usize, err: c_int);
    /// The address a link's peer has in the AV, if it has one.
    fn source(&mut self, peer: &Name) -> fi_addr_t;
}

/// A posted receive.
#[derive(Clone, Copy, Debug)]
pub struct Recv {
    pub buf: *mut u8,
    pub len: usize,
    /// `FI_ADDR_UNSPEC`: any source.
    pub src: fi_addr_t,
    pub tag: u64,
    pub ignore: u64,
    pub context: *mut c_void,
    /// `FI_RECV` with `FI_TAGGED` or `FI_MSG`.
    pub flags: u64,
    /// Writes an entry when it completes (a failure always does).
    pub complete: bool,
}

impl Recv {
    #[inline]
    fn takes(&self, src: fi_addr_t, tag: u64) -> bool {
        (self.src == FI_ADDR_UNSPEC || self.src == src)
            && (tag | self.ignore) == (self.tag | self.ignore)
    }
}

/// A message that came before a receive for it.
pub struct Unexpected {
    /// The sender's address, `FI_ADDR_UNSPEC` until the AV has its name.
    pub src: fi_addr_t,
    /// The sender's name, by which `src` is found once the AV has it.
    pub peer: Name,
    pub head: Head,
    pub bytes: Vec<u8>,
    /// The context of the `FI_PEEK | FI_CLAIM` that claimed it (NULL: none).
    pub claimed: *mut c_void,
}

/// Where the rest of a message a link is in the middle of goes.
enum Dest {
    Recv(Recv),
    Held(Unexpected),
}

struct Partial {
    head: Head,
    src: fi_addr_t,
    dest: Dest,
    got: usize,
}

struct InLink {
    link: In,
    src: fi_addr_t,
    partial: Option<Partial>,
}

/// A send part written: the rest of its bytes go out as the ring frees.
struct Pending {
    bytes: Bytes,
    off: usize,
    context: *mut c_void,
    flags: u64,
    complete: bool,
}

enum Bytes {
    /// The program's buffer, valid until the send completes.
    Borrowed(*const u8, usize),
    /// A copy (an inject's, which the program may reuse at once).
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            // SAFETY: the program keeps a send's buffer until it completes.
            Bytes::Borrowed(p, n) => unsafe { std::slice::from_raw_parts(*p, *n) },
            Bytes::Owned(v) => v,
        }
    }
}

struct OutLink {
    link: Out,
    pending: Option<Pending>,
    /// Sends refused for a full ring since the peer was last checked.
    full: u32,
}

/// Sends refused for a full ring between checks that the peer lives.
const FULL_CHECK: u32 = 4096;
/// How long sends to a new peer are refused with `-FI_EAGAIN` while its
/// endpoint takes no link (its socket's backlog full, the program busy
/// elsewhere) before they fail: a connect's timeout.
const CONNECT_PATIENCE: Duration = Duration::from_secs(30);
/// Door looks between looks at whether links' senders are gone (a system
/// call a link).
const SWEEP_EVERY: u32 = 64;
/// Progress calls between looks for new links (a system call or two
/// each): often while none came, rarely once some have (a new peer's first
/// message then waits a few thousand looks at the rings, some
/// milliseconds at most).
const DOOR_FIRST: u32 = 64;
const DOOR_EVERY: u32 = 4096;
/// Most records one link gives in one progress call.
const BATCH: usize = 16;

/// Why a send was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum SendError {
    /// The ring is full, or an earlier message is part written: progress,
    /// then try again (`-FI_EAGAIN`).
    Busy,
    /// The peer cannot be reached or has gone.
    Unreachable,
    /// The address names no endpoint.
    NoAddress,
}

pub struct State {
    me: Name,
    dir: uvia_shm::SocketDir,
    door: Door,
    outs: Vec<Option<OutLink>>,
    ins: Vec<InLink>,
    /// Posted receives: untagged, tagged.
    posted: [VecDeque<Recv>; 2],
    unexpected: [VecDeque<Unexpected>; 2],
    /// Links with a send part written.
    pending: usize,
    /// Unexpected messages whose sender the AV did not have when they came.
    unresolved: usize,
    /// Links being made: the address, and when its first try was.
    connecting: Vec<(usize, Instant)>,
    looks: u32,
}

// SAFETY: the raw pointers are the program's buffers and contexts, which
// libfabric lets any thread complete; the state is used under a lock.
unsafe impl Send for State {}

fn kind(tagged: bool) -> usize {
    tagged as usize
}

impl State {
    pub fn new(dir: uvia_shm::SocketDir, me: Name) -> std::io::Result<State> {
        let door = Door::open(&dir, &me)?;
        Ok(State {
            me,
            dir,
            door,
            outs: Vec::new(),
            ins: Vec::new(),
            posted: Default::default(),
            unexpected: Default::default(),
            pending: 0,
            unresolved: 0,
            connecting: Vec::new(),
            looks: 0,
        })
    }

    /// Sends a message of `bytes` to `dest` (whose name is `name`).
    /// `copy`: the bytes are the program's only until the call returns (an
    /// inject), so a part not written yet is copied.
    #[allow(clippy::too_many_arguments)]
    pub fn send(
        &mut self,
        dest: fi_addr_t,
        name: impl FnOnce() -> Option<Name>,
        head: Head,
        bytes: &[u8],
        copy: bool,
        context: *mut c_void,
        flags: u64,
        complete: bool,
        sink: &mut dyn Sink,
    ) -> Result<(), SendError> {
        let i = usize::try_from(dest).map_err(|_| SendError::Unreachable)?;
        if i >= self.outs.len() || self.outs[i].is_none() {
            let name = name().ok_or(SendError::NoAddress)?;
            let link = match Out::connect(&self.dir, &self.me, &name) {
                Ok(l) => l,
                Err(e) => return Err(self.not_yet(i, dest, e)),
            };
            self.connecting.retain(|(a, _)| *a != i);
            if i >= self.outs.len() {
                self.outs.resize_with(i + 1, || None);
            }
            self.outs[i] = Some(OutLink {
                link,
                pending: None,
                full: 0,
            });
        }
        let out = self.outs[i].as_mut().expect("made above");
        if out.pending.is_some() {
            out.full += 1;
            if out.full >= FULL_CHECK {
                out.full = 0;
                if out.link.peer_gone() {
                    self.drop_out(i, sink);
                    return Err(SendError::Unreachable);
                }
            }
            return Err(SendError::Busy);
        }
        let first = bytes.len().min(CHUNK);
        if !out.link.first(&head, &bytes[..first]) {
            out.full += 1;
            if out.full >= FULL_CHECK {
                out.full = 0;
                if out.link.peer_gone() {
                    self.outs[i] = None;
                    return Err(SendError::Unreachable);
                }
            }
            return Err(SendError::Busy);
        }
        out.full = 0;
        let mut off = first;
        while off < bytes.len() {
            let n = (bytes.len() - off).min(CHUNK);
            if !out.link.more(&bytes[off..off + n]) {
                break;
            }
            off += n;
        }
        if off == bytes.len() {
            if complete {
                sink.sent(context, flags, bytes.len());
            }
            return Ok(());
        }
        let rest = if copy {
            Bytes::Owned(bytes.to_vec())
        } else {
            Bytes::Borrowed(bytes.as_ptr(), bytes.len())
        };
        out.pending = Some(Pending {
            bytes: rest,
            off,
            context,
            flags,
            complete,
        });
        self.pending += 1;
        Ok(())
    }

    /// A link to address `i` could not be made now: busy while the peer
    /// may still take it, unreachable after [`CONNECT_PATIENCE`].
    #[cold]
    fn not_yet(&mut self, i: usize, dest: fi_addr_t, e: std::io::Error) -> SendError {
        let now = Instant::now();
        let since = match self.connecting.iter().find(|(a, _)| *a == i) {
            Some(&(_, t)) => t,
            None => {
                self.connecting.push((i, now));
                now
            }
        };
        if now - since < CONNECT_PATIENCE {
            return SendError::Busy;
        }
        self.connecting.retain(|(a, _)| *a != i);
        eprintln!("libfabric:uvia: no link to the endpoint at address {dest}: {e}");
        SendError::Unreachable
    }

    /// Drops the link to address `i`, its peer gone: a send part written
    /// fails.
    #[cold]
    fn drop_out(&mut self, i: usize, sink: &mut dyn Sink) {
        if let Some(p) = self.outs[i].take().and_then(|o| o.pending) {
            self.pending -= 1;
            sink.send_failed(
                p.context,
                p.flags,
                p.bytes.as_slice().len(),
                FI_EIO as c_int,
            );
        }
    }

    /// Finds the senders of unexpected messages that came before the AV
    /// had their names, where it has them now.
    fn resolve(&mut self, sink: &mut dyn Sink) {
        if self.unresolved == 0 {
            return;
        }
        let mut left = 0;
        for u in self.unexpected.iter_mut().flatten() {
            if u.src == FI_ADDR_UNSPEC {
                u.src = sink.source(&u.peer);
                left += (u.src == FI_ADDR_UNSPEC) as usize;
            }
        }
        self.unresolved = left;
    }

    /// Posts a receive, or completes it at once with a message that came
    /// unexpected.
    pub fn post(&mut self, r: Recv, tagged: bool, sink: &mut dyn Sink) {
        self.resolve(sink);
        let k = kind(tagged);
        let found = self.unexpected[k]
            .iter()
            .position(|u| u.claimed.is_null() && r.takes(u.src, u.head.tag));
        match found {
            Some(at) => {
                let u = self.unexpected[k].remove(at).expect("found");
                self.unresolved -= (u.src == FI_ADDR_UNSPEC) as usize;
                deliver(&r, &u, sink);
            }
            None => self.posted[k].push_back(r),
        }
    }

    /// `FI_PEEK` (with `FI_CLAIM`: the message found is kept for the
    /// receive that names `r.context` with `FI_CLAIM`): the entry of the
    /// first unexpected message `r` would take, or `FI_ENOMSG`.
    pub fn peek(
        &mut self,
        r: &Recv,
        claim: bool,
        discard: bool,
        tagged: bool,
        sink: &mut dyn Sink,
    ) {
        self.resolve(sink);
        let k = kind(tagged);
        let found = self.unexpected[k]
            .iter()
            .position(|u| u.claimed.is_null() && r.takes(u.src, u.head.tag));
        let Some(at) = found else {
            sink.failed(r, 0, 0, 0, 0, FI_ENOMSG as c_int);
            return;
        };
        let u = &mut self.unexpected[k][at];
        let (len, data, tag, src, flags) = (
            u.head.len as usize,
            u.head.data,
            u.head.tag,
            u.src,
            data_flag(&u.head),
        );
        if discard {
            self.unexpected[k].remove(at);
            self.unresolved -= (src == FI_ADDR_UNSPEC) as usize;
        } else if claim {
            u.claimed = r.context;
        }
        let peeked = Recv {
            buf: std::ptr::null_mut(),
            ..*r
        };
        sink.received(&peeked, len, data, tag, src, flags);
    }

    /// The receive of a message an earlier peek claimed for `r.context`
    /// (`FI_CLAIM`), or with `discard` its removal; false if none was.
    pub fn claimed(&mut self, r: &Recv, discard: bool, tagged: bool, sink: &mut dyn Sink) -> bool {
        let k = kind(tagged);
        let Some(at) = self.unexpected[k]
            .iter()
            .position(|u| u.claimed == r.context)
        else {
            return false;
        };
        let u = self.unexpected[k].remove(at).expect("found");
        self.unresolved -= (u.src == FI_ADDR_UNSPEC) as usize;
        if discard {
            let gone = Recv {
                buf: std::ptr::null_mut(),
                len: 0,
                ..*r
            };
            sink.received(&gone, 0, u.head.data, u.head.tag, u.src, 0);
        } else {
            deliver(r, &u, sink);
        }
        true
    }

    /// Cancels the posted receive of `context`: false if there is none.
    pub fn cancel(&mut self, context: *mut c_void, sink: &mut dyn Sink) -> bool {
        for k in 0..2 {
            if let Some(at) = self.posted[k].iter().position(|r| r.context == context) {
                let r = self.posted[k].remove(at).expect("found");
                sink.failed(&r, 0, 0, r.tag, 0, FI_ECANCELED as c_int);
                return true;
            }
        }
        false
    }

    /// Looks for new links now and then, takes what the links brought and
    /// writes what waits of part-written sends.
    #[inline]
    pub fn progress(&mut self, sink: &mut dyn Sink) {
        self.looks = self.looks.wrapping_add(1);
        let every = if self.ins.is_empty() {
            DOOR_FIRST
        } else {
            DOOR_EVERY
        };
        if self.looks.is_multiple_of(every) {
            self.open_door(sink);
        }
        let mut i = 0;
        while i < self.ins.len() {
            if let Err(e) = self.drain(i, sink) {
                eprintln!("libfabric:uvia: dropped a link from a peer: {e}");
                self.drop_in(i, sink);
                continue;
            }
            i += 1;
        }
        if self.pending > 0 {
            self.push_pending(sink);
        }
    }

    /// Drops link `i` from a peer: a receive its message was going into
    /// fails (`FI_EIO`) rather than wait for bytes that cannot come.
    #[cold]
    fn drop_in(&mut self, i: usize, sink: &mut dyn Sink) {
        let l = self.ins.swap_remove(i);
        if let Some(Partial {
            head,
            dest: Dest::Recv(r),
            got,
            ..
        }) = l.partial
        {
            sink.failed(&r, got.min(r.len), head.data, head.tag, 0, FI_EIO as c_int);
        }
    }

    /// Drops the links whose senders are gone and that hold nothing more.
    #[cold]
    fn sweep(&mut self, sink: &mut dyn Sink) {
        let mut i = 0;
        while i < self.ins.len() {
            let l = &mut self.ins[i];
            // Gone first, then empty: a record written before it went is
            // still taken.
            if l.link.peer_gone() && matches!(l.link.peek(), Ok(None) | Err(_)) {
                self.drop_in(i, sink);
                continue;
            }
            i += 1;
        }
    }

    #[cold]
    fn open_door(&mut self, sink: &mut dyn Sink) {
        if (self.looks / DOOR_EVERY).is_multiple_of(SWEEP_EVERY) {
            self.sweep(sink);
        }
        for link in self.door.look() {
            let src = sink.source(&link.peer);
            self.ins.push(InLink {
                link,
                src,
                partial: None,
            });
        }
    }

    #[cold]
    fn push_pending(&mut self, sink: &mut dyn Sink) {
        let mut gone = Vec::new();
        for (i, o) in self.outs.iter_mut().enumerate() {
            let Some(out) = o.as_mut() else {
                continue;
            };
            let Some(p) = out.pending.as_mut() else {
                continue;
            };
            let bytes = p.bytes.as_slice();
            let was = p.off;
            while p.off < bytes.len() {
                let n = (bytes.len() - p.off).min(CHUNK);
                if !out.link.more(&bytes[p.off..p.off + n]) {
                    break;
                }
                p.off += n;
            }
            if p.off == was {
                out.full += 1;
                if out.full >= FULL_CHECK {
                    out.full = 0;
                    if out.link.peer_gone() {
                        gone.push(i);
                    }
                }
                continue;
            }
            out.full = 0;
            if p.off == bytes.len() {
                let p = out.pending.take().expect("there");
                if p.complete {
                    sink.sent(p.context, p.flags, p.bytes.as_slice().len());
                }
                self.pending -= 1;
            }
        }
        for i in gone {
            self.drop_out(i, sink);
        }
    }

    /// Takes up to a batch of records from link `i`.
    #[inline]
    fn drain(&mut self, i: usize, sink: &mut dyn Sink) -> std::io::Result<()> {
        for _ in 0..BATCH {
            let l = &mut self.ins[i];
            let Some(rec) = l.link.peek()? else {
                return Ok(());
            };
            // SAFETY: the record's body is `len` bytes of the ring, ours
            // until released.
            let body = unsafe { std::slice::from_raw_parts(rec.as_ptr(), rec.len()) };
            match l.partial.take() {
                None => {
                    if body.len() < HEAD_LEN {
                        return Err(corrupt("a record shorter than a header"));
                    }
                    // SAFETY: HEAD_LEN bytes checked above.
                    let head = unsafe { std::ptr::read_unaligned(body.as_ptr() as *const Head) };
                    let bytes = &body[HEAD_LEN..];
                    if bytes.len() > head.len as usize {
                        return Err(corrupt("more bytes than the header says"));
                    }
                    if l.src == FI_ADDR_UNSPEC {
                        l.src = sink.source(&l.link.peer);
                    }
                    let (src, peer) = (l.src, l.link.peer);
                    let p = self.first(head, src, peer, bytes, sink)?;
                    self.ins[i].partial = p;
                }
                Some(mut p) => {
                    let total = p.head.len as usize;
                    if body.len() > total - p.got {
                        return Err(corrupt("more bytes than the message has"));
                    }
                    match &mut p.dest {
                        Dest::Recv(r) => copy_into(r, p.got, body),
                        Dest::Held(u) => u.bytes.extend_from_slice(body),
                    }
                    p.got += body.len();
                    if p.got == total {
                        self.finish(p, sink);
                    } else {
                        self.ins[i].partial = Some(p);
                    }
                }
            }
            self.ins[i].link.release(rec);
        }
        Ok(())
    }

    /// A message's first record: into the receive it matches, or held
    /// until it is whole. What is left to come, if anything.
    #[inline]
    fn first(
        &mut self,
        head: Head,
        src: fi_addr_t,
        peer: Name,
        bytes: &[u8],
        sink: &mut dyn Sink,
    ) -> std::io::Result<Option<Partial>> {
        let k = kind(head.flags & TAGGED != 0);
        let whole = bytes.len() == head.len as usize;
        let at = self.posted[k].iter().position(|r| r.takes(src, head.tag));
        Ok(match at {
            Some(at) => {
                let r = self.posted[k].remove(at).expect("found");
                copy_into(&r, 0, bytes);
                if whole {
                    complete(&r, &head, src, sink);
                    None
                } else {
                    Some(Partial {
                        head,
                        src,
                        dest: Dest::Recv(r),
                        got: bytes.len(),
                    })
                }
            }
            None => {
                // The whole message is held: room for what the header
                // says, refused (the link dropped) where memory has none.
                let mut v = Vec::new();
                v.try_reserve_exact(head.len as usize).map_err(|_| {
                    corrupt("no memory for a message of the length its header says")
                })?;
                v.extend_from_slice(bytes);
                let u = Unexpected {
                    src,
                    peer,
                    head,
                    bytes: v,
                    claimed: std::ptr::null_mut(),
                };
                if whole {
                    self.hold(k, u);
                    None
                } else {
                    Some(Partial {
                        head,
                        src,
                        dest: Dest::Held(u),
                        got: bytes.len(),
                    })
                }
            }
        })
    }

    /// A message whose last record came: its receive completes, or, held,
    /// it is matched now as if it had just come whole.
    fn finish(&mut self, p: Partial, sink: &mut dyn Sink) {
        match p.dest {
            Dest::Recv(r) => complete(&r, &p.head, p.src, sink),
            Dest::Held(mut u) => {
                if u.src == FI_ADDR_UNSPEC {
                    u.src = sink.source(&u.peer);
                }
                let k = kind(u.head.flags & TAGGED != 0);
                match self.posted[k]
                    .iter()
                    .position(|r| r.takes(u.src, u.head.tag))
                {
                    Some(at) => {
                        let r = self.posted[k].remove(at).expect("found");
                        deliver(&r, &u, sink);
                    }
                    None => self.hold(k, u),
                }
            }
        }
    }

    /// Keeps a whole message no receive took, counting it among those to
    /// resolve if the AV has no name for its sender yet.
    fn hold(&mut self, k: usize, u: Unexpected) {
        self.unresolved += (u.src == FI_ADDR_UNSPEC) as usize;
        self.unexpected[k].push_back(u);
    }
}

fn corrupt(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string())
}

fn data_flag(head: &Head) -> u64 {
    if head.flags & DATA != 0 {
        FI_REMOTE_CQ_DATA
    } else {
        0
    }
}

/// Copies `bytes`, the part of a message at `off`, into `r`'s buffer, cut
/// at its end.
#[inline]
fn copy_into(r: &Recv, off: usize, bytes: &[u8]) {
    if off >= r.len {
        return;
    }
    let n = bytes.len().min(r.len - off);
    // SAFETY: the program's buffer holds r.len bytes until the receive
    // completes; off + n <= r.len.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), r.buf.add(off), n) };
}

/// The entry of a receive whose message (`head`) is in its buffer.
#[inline]
fn complete(r: &Recv, head: &Head, src: fi_addr_t, sink: &mut dyn Sink) {
    let len = head.len as usize;
    if len > r.len {
        sink.failed(
            r,
            r.len,
            head.data,
            head.tag,
            len - r.len,
            FI_ETRUNC as c_int,
        );
    } else if r.complete {
        sink.received(r, len, head.data, head.tag, src, data_flag(head));
    }
}

/// A message that came unexpected, into the receive that takes it.
fn deliver(r: &Recv, u: &Unexpected, sink: &mut dyn Sink) {
    copy_into(r, 0, &u.bytes);
    complete(r, &u.head, u.src, sink);
}

/// A message's header.
pub fn head(tag: u64, data: Option<u64>, len: usize, tagged: bool) -> Head {
    Head {
        tag,
        data: data.unwrap_or(0),
        len: len as u32,
        flags: if tagged { TAGGED } else { 0 } | if data.is_some() { DATA } else { 0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Log {
        sent: Vec<usize>,
        got: Vec<(usize, u64, fi_addr_t)>,
        failed: Vec<(usize, c_int)>,
        /// The address the AV gives every peer.
        src: fi_addr_t,
    }

    impl Sink for Log {
        fn sent(&mut self, _c: *mut c_void, _f: u64, len: usize) {
            self.sent.push(len);
        }
        fn received(&mut self, _r: &Recv, len: usize, _d: u64, tag: u64, src: fi_addr_t, _f: u64) {
            self.got.push((len, tag, src));
        }
        fn failed(&mut self, _r: &Recv, _len: usize, _d: u64, _t: u64, olen: usize, err: c_int) {
            self.failed.push((olen, err));
        }
        fn send_failed(&mut self, _c: *mut c_void, _f: u64, _len: usize, err: c_int) {
            self.failed.push((0, err));
        }
        fn source(&mut self, _peer: &Name) -> fi_addr_t {
            self.src
        }
    }

    fn pair() -> (State, State, Name, tempdir::Dir) {
        let d = tempdir::Dir::new();
        let dir = uvia_shm::SocketDir::at(d.path().to_owned()).unwrap();
        let (a, b) = (Name::fresh(), Name::fresh());
        (
            State::new(dir.clone(), a).unwrap(),
            State::new(dir, b).unwrap(),
            b,
            d,
        )
    }

    mod tempdir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let p = std::env::temp_dir().join(format!(
                    "uvia-rdm-test-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                Dir(p)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn recv(buf: &mut [u8], tag: u64, ignore: u64) -> Recv {
        Recv {
            buf: buf.as_mut_ptr(),
            len: buf.len(),
            src: FI_ADDR_UNSPEC,
            tag,
            ignore,
            context: buf.as_mut_ptr() as *mut c_void,
            flags: FI_RECV | FI_TAGGED,
            complete: true,
        }
    }

    fn spin(b: &mut State, log: &mut Log, until: impl Fn(&Log) -> bool) {
        for _ in 0..1_000_000 {
            b.progress(log);
            if until(log) {
                return;
            }
        }
        panic!("no progress");
    }

    #[test]
    fn expected_and_unexpected_messages_match_by_tag_in_order() {
        let (mut a, mut b, bname, _d) = pair();
        let (mut la, mut lb) = (Log::default(), Log::default());
        let mut r1 = [0u8; 8];
        b.post(recv(&mut r1, 7, 0), true, &mut lb);
        for (tag, v) in [(9u64, 1u8), (7, 2), (9, 3)] {
            let m = [v; 8];
            a.send(
                0,
                || Some(bname),
                head(tag, None, 8, true),
                &m,
                true,
                std::ptr::null_mut(),
                0,
                true,
                &mut la,
            )
            .unwrap();
        }
        spin(&mut b, &mut lb, |l| !l.got.is_empty());
        assert_eq!(r1, [2; 8], "tag 7 went to the posted receive");
        // Both tag-9 messages wait; a receive of any tag takes the first.
        for _ in 0..1000 {
            b.progress(&mut lb);
        }
        let mut r2 = [0u8; 8];
        b.post(recv(&mut r2, 0, u64::MAX), true, &mut lb);
        assert_eq!(r2, [1; 8]);
        let mut r3 = [0u8; 8];
        b.post(recv(&mut r3, 9, 0), true, &mut lb);
        assert_eq!(r3, [3; 8]);
        assert_eq!(lb.got.len(), 3);
        assert_eq!(la.sent, vec![8, 8, 8]);
    }

    #[test]
    fn a_large_message_crosses_in_chunks_expected_or_not() {
        let (mut a, mut b, bname, _d) = pair();
        let (mut la, mut lb) = (Log::default(), Log::default());
        let big: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for round in 0..2 {
            let mut out = vec![0u8; big.len()];
            if round == 0 {
                b.post(recv(&mut out, 1, 0), true, &mut lb);
            }
            let mut sent = false;
            let mut off_done = false;
            for _ in 0..10_000_000 {
                if !sent {
                    match a.send(
                        0,
                        || Some(bname),
                        head(1, Some(5), big.len(), true),
                        &big,
                        false,
                        std::ptr::null_mut(),
                        0,
                        true,
                        &mut la,
                    ) {
                        Ok(()) => sent = true,
                        Err(SendError::Busy) => {}
                        Err(e) => panic!("{e:?}"),
                    }
                }
                a.progress(&mut la);
                b.progress(&mut lb);
                if sent && la.sent.len() == round + 1 {
                    off_done = true;
                    if round == 0 && lb.got.len() == 1 {
                        break;
                    }
                    if round == 1 {
                        // Whole once the ring is empty.
                        for _ in 0..1000 {
                            b.progress(&mut lb);
                        }
                        b.post(recv(&mut out, 1, 0), true, &mut lb);
                        break;
                    }
                }
            }
            assert!(off_done);
            assert_eq!(lb.got.len(), round + 1);
            assert!(out == big, "round {round}: the bytes arrived intact");
        }
    }

    #[test]
    fn truncation_cancel_and_peek_report_errors() {
        let (mut a, mut b, bname, _d) = pair();
        let (mut la, mut lb) = (Log::default(), Log::default());
        let mut small = [0u8; 4];
        b.post(recv(&mut small, 3, 0), true, &mut lb);
        a.send(
            0,
            || Some(bname),
            head(3, None, 8, true),
            &[9; 8],
            true,
            std::ptr::null_mut(),
            0,
            true,
            &mut la,
        )
        .unwrap();
        spin(&mut b, &mut lb, |l| !l.failed.is_empty());
        assert_eq!(lb.failed[0], (4, FI_ETRUNC as c_int));
        assert_eq!(small, [9; 4]);
        let mut r = [0u8; 4];
        let rr = recv(&mut r, 4, 0);
        b.post(rr, true, &mut lb);
        assert!(b.cancel(rr.context, &mut lb));
        assert_eq!(lb.failed[1].1, FI_ECANCELED as c_int);
        assert!(!b.cancel(rr.context, &mut lb), "cancelled once");
        b.peek(&rr, false, false, true, &mut lb);
        assert_eq!(lb.failed[2].1, FI_ENOMSG as c_int);
        a.send(
            0,
            || Some(bname),
            head(4, None, 2, true),
            &[1, 2],
            true,
            std::ptr::null_mut(),
            0,
            true,
            &mut la,
        )
        .unwrap();
        for _ in 0..1000 {
            b.progress(&mut lb);
        }
        b.peek(&rr, true, false, true, &mut lb);
        assert_eq!(lb.got.last(), Some(&(2, 4, 0)));
        // Claimed: a plain receive does not take it, the claim does.
        let mut other = [0u8; 4];
        b.post(recv(&mut other, 4, 0), true, &mut lb);
        assert_eq!(other, [0; 4]);
        assert!(b.claimed(&rr, false, true, &mut lb));
        assert_eq!(r[..2], [1, 2]);
    }

    /// A message that came before the AV had its sender's name is taken
    /// by a receive directed at that sender once the AV has it.
    #[test]
    fn a_sender_the_av_learns_later_is_matched_by_address() {
        let (mut a, mut b, bname, _d) = pair();
        let (mut la, mut lb) = (Log::default(), Log::default());
        lb.src = FI_ADDR_UNSPEC;
        a.send(
            0,
            || Some(bname),
            head(6, None, 4, true),
            &[4; 4],
            true,
            std::ptr::null_mut(),
            0,
            true,
            &mut la,
        )
        .unwrap();
        for _ in 0..1000 {
            b.progress(&mut lb);
        }
        lb.src = 3;
        let mut buf = [0u8; 4];
        b.post(
            Recv {
                src: 3,
                ..recv(&mut buf, 6, 0)
            },
            true,
            &mut lb,
        );
        assert_eq!(buf, [4; 4]);
        assert_eq!(lb.got, vec![(4, 6, 3)]);
    }
}
