//! The handshake and the teardown: a client's request until it is
//! answered, a server's accept until it is confirmed, a disconnect until it
//! is acknowledged.

use super::{Config, Conn, Event, Level, Outcome, State, Timer, CLOSE_TRIES};
use crate::seq::SeqWindow;
use crate::wire::{self, ConnAttrs, PrivateData, RejectReason, Repr, SackList, DATA_HEADER_LEN};
use std::time::Instant;

impl Conn {
    /// A client connection: asks `discriminator` at the peer for a
    /// connection. Frames go to the server's address with destination id 0.
    pub fn connect(
        now: Instant,
        cfg: Config,
        local_id: u32,
        initial_psn: u32,
        discriminator: &[u8],
    ) -> Conn {
        let mut c = Conn::new(now, cfg, local_id, initial_psn);
        c.discriminator = wire::cut_discriminator(discriminator).to_vec();
        c.state = State::Connecting;
        c.timers
            .set(Timer::ConnectTimeout, now + c.cfg.connect_timeout);
        // The first request goes at once.
        c.timers.set(Timer::Handshake, now);
        c
    }

    /// A peer-to-peer connection: asks the VI waiting on `discriminator` at
    /// the peer's address, while that VI asks this one; whichever request
    /// arrives first connects the two (the caller hands this connection the
    /// peer's [`Repr::PeerRequest`] when one comes for it).
    pub fn connect_peer(
        now: Instant,
        cfg: Config,
        local_id: u32,
        initial_psn: u32,
        discriminator: &[u8],
    ) -> Conn {
        let mut c = Conn::connect(now, cfg, local_id, initial_psn, discriminator);
        c.peer_mode = true;
        c
    }

    /// A server connection answering a request from `peer_id` with
    /// `peer_attrs`. Connected at once; the accept repeats until the client
    /// confirms it. The caller has checked the attributes match.
    pub fn accept(
        now: Instant,
        cfg: Config,
        local_id: u32,
        initial_psn: u32,
        peer_id: u32,
        peer_attrs: ConnAttrs,
    ) -> Conn {
        let mut c = Conn::new(now, cfg, local_id, initial_psn);
        c.establish(peer_id, peer_attrs);
        c.enter(State::Accepting);
        c
    }

    /// Gives the handshake private data: the request of a client (or of a
    /// peer-to-peer side), the accept of a server. Call right after
    /// [`connect`](Self::connect), [`connect_peer`](Self::connect_peer) or
    /// [`accept`](Self::accept), before the first
    /// [`poll_transmit`](Self::poll_transmit), so every copy of the frame
    /// carries the same bytes. Its length was checked where it was made
    /// ([`PrivateData::new`]).
    pub fn with_private(mut self, private: PrivateData) -> Conn {
        self.private = private;
        self
    }

    fn establish(&mut self, peer_id: u32, attrs: ConnAttrs) {
        self.peer_id = peer_id;
        self.peer = Some(attrs);
        self.rcv = SeqWindow::new(attrs.initial_psn, self.cfg.window * super::SPAN);
        let frame = self.cfg.max_frame.min(attrs.max_frame);
        self.frag = frame.saturating_sub(DATA_HEADER_LEN as u32).max(1);
    }

    /// The frame a server sends to refuse a request; it keeps no state, so
    /// a repeated request gets the same answer.
    pub fn reject_frame(buf: &mut [u8], peer_id: u32, reason: RejectReason) -> usize {
        Conn::reject_frame_with(buf, peer_id, reason, &PrivateData::EMPTY)
    }

    /// [`reject_frame`](Self::reject_frame) carrying private data for the
    /// client. `buf` must hold [`wire::MAX_REPLY_LEN`] bytes.
    pub fn reject_frame_with(
        buf: &mut [u8],
        peer_id: u32,
        reason: RejectReason,
        private: &PrivateData,
    ) -> usize {
        let private = private.as_slice();
        Repr::ConnReject { reason, private }.emit(buf, peer_id, 0)
    }

    /// The frame that answers a disconnect for a connection that no longer exists.
    pub fn disconnect_ack_frame(buf: &mut [u8], peer_id: u32, local_id: u32) -> usize {
        Repr::DisconnectAck.emit(buf, peer_id, local_id)
    }

    /// Starts a disconnect: outstanding descriptors complete as flushed,
    /// and the peer is told.
    pub fn close(&mut self, now: Instant) {
        self.settle(now);
        if self.is_closed() || matches!(self.state, State::Closing { .. }) {
            return;
        }
        let was_connecting = self.state == State::Connecting;
        let owe_ack = self.ack_pending > 0 || self.timers.is_set(Timer::Ack) || self.ack_now;
        self.flush(Outcome::Flushed);
        self.ack_now = owe_ack && self.cfg.level.is_reliable();
        self.ack_for_window = false;
        self.enter(if was_connecting {
            State::Closed
        } else {
            State::Closing { tries: 0 }
        });
        let _ = now;
    }

    /// Anything from the peer after our accept means it has the accept.
    pub(super) fn confirmed(&mut self) {
        if self.state == State::Accepting {
            self.enter(State::Connected);
        }
    }

    /// Takes in a frame for a client still connecting: the server's
    /// answer, or peer-to-peer the other side's request; anything else is
    /// dropped. Returns false if the frame was dropped.
    pub(super) fn on_answer(&mut self, now: Instant, src: u32, frame: &Repr<'_>) -> bool {
        match frame {
            Repr::ConnAccept { attrs, private } => {
                if self.connect_to(now, src, attrs, private, State::Connected) {
                    self.confirm_due = true;
                }
                true
            }
            Repr::PeerRequest { attrs, private, .. } if self.peer_mode => {
                // The other side asked first: answer as a server would.
                self.connect_to(now, src, attrs, private, State::Accepting);
                true
            }
            Repr::ConnReject { reason, private } => {
                self.peer_private = PrivateData::of_frame(private);
                self.enter(State::Closed);
                self.events.push_back(Event::Rejected(*reason));
                true
            }
            _ => {
                self.stats.dropped += 1;
                false
            }
        }
    }

    /// Connects to the peer `src` whose accept or request carried `attrs`
    /// and `private`, entering `state`; or, if its reliability level is
    /// not ours, ends the attempt. True if connected.
    fn connect_to(
        &mut self,
        now: Instant,
        src: u32,
        attrs: &ConnAttrs,
        private: &[u8],
        state: State,
    ) -> bool {
        self.peer_private = PrivateData::of_frame(private);
        if Level::from_wire(attrs.reliability) != Some(self.cfg.level) {
            self.enter(State::Closed);
            self.events
                .push_back(Event::Rejected(RejectReason::Mismatch));
            return false;
        }
        self.establish(src, *attrs);
        self.heard(now);
        self.enter(state);
        self.events.push_back(Event::Connected);
        true
    }

    /// The accept of a server (or of a peer-to-peer side that answered),
    /// if due: at once, then every handshake retry until the peer confirms.
    pub(super) fn transmit_accept(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        if self.state != State::Accepting || !self.timers.due(Timer::Handshake, now) {
            return None;
        }
        self.timers
            .set(Timer::Handshake, now + self.cfg.handshake_retry);
        let r = Repr::ConnAccept {
            attrs: self.cfg.attrs(self.snd_una),
            private: self.private.as_slice(),
        };
        Some(r.emit(buf, self.peer_id, self.local_id))
    }

    /// Our disconnect, carrying the acknowledgement of what arrived.
    fn disconnect_frame(&self, buf: &mut [u8]) -> usize {
        let r = Repr::Disconnect {
            ack: self.rcv.base(),
            done: self.in_base,
        };
        r.emit(buf, self.peer_id, self.local_id)
    }

    /// The next frame of a side not connected: a client's request; a
    /// closing side's last ack, its disconnect, or its answer to the
    /// peer's; after the end, the answer to a peer that missed it.
    pub(super) fn transmit_unconnected(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        let (dst, src) = (self.peer_id, self.local_id);
        match self.state {
            State::Connecting => {
                if self.timers.due(Timer::Handshake, now) {
                    self.timers
                        .set(Timer::Handshake, now + self.cfg.handshake_retry);
                    let attrs = self.cfg.attrs(self.snd_nxt);
                    let discriminator = &self.discriminator[..];
                    let private = self.private.as_slice();
                    let r = Repr::request(self.peer_mode, attrs, discriminator, private);
                    return Some(r.emit(buf, 0, src));
                }
                None
            }
            State::Closing { tries } => {
                if tries == 0 && self.ack_now {
                    // Acknowledge what arrived before saying goodbye, so the
                    // peer's last sends complete rather than fail.
                    self.ack_now = false;
                    self.ack_pending = 0;
                    self.timers.stop(Timer::Ack);
                    self.stats.acks_sent += 1;
                    let r = Repr::Ack {
                        ack: self.rcv.base(),
                        done: self.in_base,
                        flags: 0,
                        sack: SackList::default(),
                    };
                    return Some(r.emit(buf, dst, src));
                }
                if self.disconnect_ack_due {
                    self.disconnect_ack_due = false;
                    return Some(Repr::DisconnectAck.emit(buf, dst, src));
                }
                if self.disconnect_due {
                    // The peer's data says it has not had the disconnect:
                    // it goes again now, outside the tries.
                    self.disconnect_due = false;
                    return Some(self.disconnect_frame(buf));
                }
                if tries < CLOSE_TRIES && self.timers.due(Timer::Close, now) {
                    self.state = State::Closing { tries: tries + 1 };
                    self.timers
                        .set(Timer::Close, now + self.cfg.handshake_retry);
                    return Some(self.disconnect_frame(buf));
                }
                None
            }
            State::Closed | State::Failed => {
                if self.disconnect_ack_due {
                    self.disconnect_ack_due = false;
                    return Some(Repr::DisconnectAck.emit(buf, dst, src));
                }
                if self.disconnect_due {
                    self.disconnect_due = false;
                    return Some(self.disconnect_frame(buf));
                }
                if let Some((code, psn)) = self.nak.take() {
                    let ack = self.rcv.base();
                    return Some(Repr::Nak { code, psn, ack }.emit(buf, dst, src));
                }
                None
            }
            State::Accepting | State::Connected => None,
        }
    }
}
