//! Where the next frame of a message in progress will go, so that a medium
//! can receive its payload straight into place ([`Conn::expected`]).
//!
//! A large message comes as frames of one size, in consecutive psns, each
//! carrying the next bytes of the message. Once one has arrived, the engine
//! knows where the next one belongs: the same receive descriptor (or read
//! descriptor, or remote-write target) at the following offset; after the
//! last one of a large send, the next send's first frame is expected in the
//! next receive descriptor, at its start (a stream's messages are alike;
//! after a small one nothing is expected, and a ping-pong keeps the
//! cheapest receive). A medium
//! that can split a datagram (the kernel's scatter-gather receive) then puts
//! the header in its own buffer and the payload where it belongs, and the
//! copy out of the receive buffer goes away. The frame still comes through
//! [`Conn::handle_frame`] like any other, with its payload slice lying
//! where the memory would have copied it: the memory sees the same address
//! both sides and copies nothing.
//!
//! A frame that is not the one expected (another message's, a frame sent
//! again, a frame of another length) has written its bytes over the place
//! of one that has not arrived: memory no completed descriptor owns yet, and
//! the expected frame writes it again when it comes. Its bytes are put back
//! together and it takes the general path.

use super::Conn;
use crate::wire::{data_flags, DataHeader, Op};

/// Least payload worth placing: below it the copy out of the receive
/// buffer costs less than the separate receive it takes (a placed receive
/// takes one datagram; the general path takes a batch per system call).
pub const PLACE_FROM: u32 = 8 * 1024;

/// Where the payload of the frame expected next belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Receive descriptor `rsn`, at `offset` into its memory.
    Recv { rsn: u32, offset: u32 },
    /// The local memory of this side's read `msn`, at `offset`.
    Read { msn: u32, offset: u32 },
    /// Registered memory `rkey` at `addr` (a remote write's next bytes).
    Write { rkey: u32, addr: u64 },
}

/// The frame a reliable connection expects next, and where its payload
/// belongs ([`Conn::expected`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expected {
    pub psn: u32,
    /// Payload bytes: exactly these for the next fragment of a message in
    /// progress, at most these for the first frame of the next message.
    pub len: u32,
    pub place: Place,
    op: Op,
    msn: u32,
    offset: u32,
    /// The message's length; `None` for the first frame of a message not
    /// yet heard of.
    total: Option<u32>,
}

impl Expected {
    /// What follows data frame `h` of `len` payload bytes on a connection
    /// whose frames carry `frag` payload bytes at most: the next fragment
    /// of a large message with more to come, or, after the last fragment
    /// of a large send, the first frame of the next send (a stream's
    /// messages are alike, and each goes to the next receive descriptor).
    pub(super) fn after(h: &DataHeader, len: u32, frag: u32) -> Option<Expected> {
        let next = h.offset.checked_add(len)?;
        if h.flags & data_flags::BUNDLE != 0 {
            return None;
        }
        let send = h.op == Op::Send && h.flags & data_flags::CONSUMES != 0;
        if next >= h.total {
            // Only after a large send: a ping-pong's small messages keep
            // the cheapest receive.
            let large = h.total >= PLACE_FROM && frag >= PLACE_FROM;
            return (send && large).then(|| Expected {
                psn: h.psn.wrapping_add(1),
                len: frag,
                place: Place::Recv {
                    rsn: h.rsn.wrapping_add(1),
                    offset: 0,
                },
                op: Op::Send,
                msn: h.msn.wrapping_add(1),
                offset: 0,
                total: None,
            });
        }
        if len < PLACE_FROM {
            return None;
        }
        let place = match h.op {
            Op::Send if send => Place::Recv {
                rsn: h.rsn,
                offset: next,
            },
            Op::ReadResponse => Place::Read {
                msn: h.msn,
                offset: next,
            },
            Op::RdmaWrite => Place::Write {
                rkey: h.rkey,
                addr: h.raddr.wrapping_add(next as u64),
            },
            _ => return None,
        };
        Some(Expected {
            psn: h.psn.wrapping_add(1),
            len: len.min(h.total - next),
            place,
            op: h.op,
            msn: h.msn,
            offset: next,
            total: Some(h.total),
        })
    }

    /// The frame expected after this one, if the message goes on: a
    /// medium that receives several datagrams at once places each.
    pub fn next(&self) -> Option<Expected> {
        let total = self.total?;
        let next = self.offset.checked_add(self.len)?;
        if next >= total {
            return None;
        }
        let step = |at: u32| at.wrapping_add(self.len);
        let place = match self.place {
            Place::Recv { rsn, offset } => Place::Recv {
                rsn,
                offset: step(offset),
            },
            Place::Read { msn, offset } => Place::Read {
                msn,
                offset: step(offset),
            },
            Place::Write { rkey, addr } => Place::Write {
                rkey,
                addr: addr.wrapping_add(self.len as u64),
            },
        };
        Some(Expected {
            psn: self.psn.wrapping_add(1),
            len: self.len.min(total - next),
            place,
            offset: next,
            ..*self
        })
    }

    /// True if `h`, with `len` payload bytes, is the frame expected: then
    /// its payload is where [`place`](Self::place) says.
    pub fn matches(&self, h: &DataHeader, len: usize) -> bool {
        let place = match self.place {
            Place::Recv { rsn, .. } => h.rsn == rsn && h.flags & data_flags::CONSUMES != 0,
            Place::Read { .. } => true,
            Place::Write { rkey, addr } => {
                h.rkey == rkey && h.raddr.wrapping_add(h.offset as u64) == addr
            }
        };
        let size = match self.total {
            Some(total) => h.total == total && len == self.len as usize,
            // The sender cuts frames of the same size: a message's first
            // frame is all of it or a whole frame.
            None => len == self.payload_len(h),
        };
        h.psn == self.psn
            && size
            && h.op == self.op
            && h.msn == self.msn
            && h.offset == self.offset
            && h.flags & data_flags::BUNDLE == 0
            && place
    }

    /// The payload bytes of `h` if it is the frame expected (see
    /// [`matches`](Self::matches)).
    pub fn payload_len(&self, h: &DataHeader) -> usize {
        match self.total {
            Some(_) => self.len as usize,
            None => h.total.min(self.len) as usize,
        }
    }
}

impl Conn {
    /// The data frame this connection expects next, if a large message is
    /// in progress and the frame has not arrived: the next fragment of the
    /// message whose fragment arrived last. `None` on the unreliable levels
    /// (whose frames may be dropped on arrival, see the module's notes)
    /// and whenever nothing is in progress.
    pub fn expected(&self) -> Option<Expected> {
        self.next_in.filter(|e| self.awaits(e.psn))
    }

    /// The frame expected after `e` ([`Expected::next`]) if it has not
    /// arrived either: a frame that came early (out of order, or ahead of
    /// one sent again) holds its bytes already, and nothing may be placed
    /// over them.
    pub fn expected_after(&self, e: &Expected) -> Option<Expected> {
        e.next().filter(|n| self.awaits(n.psn))
    }

    /// True while data frame `psn` may still come: connected at a reliable
    /// level, within the receive window and not yet taken in.
    fn awaits(&self, psn: u32) -> bool {
        self.is_connected()
            && self.cfg.level.is_reliable()
            && self.rcv.in_window(psn)
            && !self.rcv.contains(psn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fragment(psn: u32, offset: u32, len: u32, total: u32) -> (DataHeader, u32) {
        let h = DataHeader {
            psn,
            ack: 0,
            msn: 7,
            op: Op::Send,
            flags: data_flags::CONSUMES,
            offset,
            total,
            imm: 0,
            rkey: 0,
            raddr: 0,
            rsn: 3,
            done: 0,
        };
        (h, len)
    }

    /// A message of three full frames and a short tail: each frame names
    /// the next, the tail is expected at its length, and nothing follows.
    #[test]
    fn fragments_name_the_next_until_the_message_ends() {
        let frag = 10_000;
        let total = 3 * frag + 1234;
        let (h, len) = fragment(100, 0, frag, total);
        let e1 = Expected::after(&h, len, frag).unwrap();
        assert_eq!(e1.psn, 101);
        assert_eq!(
            e1.place,
            Place::Recv {
                rsn: 3,
                offset: frag
            }
        );
        assert_eq!(e1.len, frag);
        let e2 = e1.next().unwrap();
        assert_eq!(
            e2.place,
            Place::Recv {
                rsn: 3,
                offset: 2 * frag
            }
        );
        let e3 = e2.next().unwrap();
        assert_eq!((e3.psn, e3.len), (103, 1234));
        assert_eq!(e3.next(), None);
        // The frame that comes matches only its own expectation.
        let (h2, len2) = fragment(102, 2 * frag, frag, total);
        assert!(e2.matches(&h2, len2 as usize));
        assert!(!e1.matches(&h2, len2 as usize));
        assert!(!e2.matches(&h2, len2 as usize - 1));
        let mut other = h2;
        other.msn = 8;
        assert!(!e2.matches(&other, len2 as usize));
        // A small fragment or a bundle expect nothing.
        let (small, n) = fragment(100, 0, PLACE_FROM - 1, total);
        assert_eq!(Expected::after(&small, n, frag), None);
        let mut bundle = h;
        bundle.flags |= data_flags::BUNDLE;
        assert_eq!(Expected::after(&bundle, len, frag), None);
    }

    /// After a large send's last fragment comes the next send's first
    /// frame, into the next receive descriptor: a whole frame, or all of
    /// a message shorter than one. After a small send, nothing.
    #[test]
    fn a_large_send_expects_the_next_sends_first_frame() {
        let frag = 10_000;
        let (last, n) = fragment(103, 30_000, 1234, 31_234);
        let e = Expected::after(&last, n, frag).unwrap();
        assert_eq!(e.place, Place::Recv { rsn: 4, offset: 0 });
        assert_eq!((e.psn, e.len), (104, frag));
        assert_eq!(e.next(), None, "the next message's length is unknown");
        let mut first = fragment(104, 0, frag, 50_000).0;
        first.msn = 8;
        first.rsn = 4;
        assert!(e.matches(&first, frag as usize));
        assert!(!e.matches(&first, 9_000), "a short first fragment");
        first.total = 9_000;
        assert!(e.matches(&first, 9_000), "a message of less than a frame");
        assert_eq!(e.payload_len(&first), 9_000);
        first.offset = 1;
        assert!(!e.matches(&first, 9_000));
        let (whole_small, n) = fragment(7, 0, 100, 100);
        assert_eq!(Expected::after(&whole_small, n, frag), None);
    }

    /// A remote write's next bytes go at the next address; a read
    /// response's into the read's memory at the next offset.
    #[test]
    fn writes_and_read_responses_place_by_their_own_keys() {
        let (mut h, len) = fragment(5, 0, 20_000, 50_000);
        h.op = Op::RdmaWrite;
        h.flags = 0;
        h.rkey = 9;
        h.raddr = 0x1000;
        let w = Expected::after(&h, len, 20_000).unwrap();
        assert_eq!(
            w.place,
            Place::Write {
                rkey: 9,
                addr: 0x1000 + 20_000
            }
        );
        assert_eq!(w.next().unwrap().len, 10_000);
        h.op = Op::ReadResponse;
        let r = Expected::after(&h, len, 20_000).unwrap();
        assert_eq!(
            r.place,
            Place::Read {
                msn: 7,
                offset: 20_000
            }
        );
        h.op = Op::ReadRequest;
        assert_eq!(Expected::after(&h, len, 20_000), None);
    }
}
