//! Frames coming in: demultiplexing by kind, reassembly into receive
//! descriptors or registered memory, and what the receiver owes the peer
//! (acks, naks) for them.

use super::{
    Clock, Conn, Event, FailReason, InMsg, Memory, OutKind, OutMsg, Outcome, RnrPolicy, State,
    Timer, MAX_READS_OWED,
};
use crate::seq;
use crate::wire::{ack_flags, bundle, data_flags, DataHeader, NakCode, Op, Repr};
use std::time::Instant;

impl Conn {
    /// Takes in a frame whose destination id is this connection's (or, for
    /// a client still connecting, an answer to its request), arrived at
    /// `now`. `src` is the frame's source connection id. Returns false if
    /// the frame was dropped.
    pub fn handle_frame(
        &mut self,
        now: Instant,
        src: u32,
        frame: &Repr<'_>,
        mem: &mut dyn Memory,
    ) -> bool {
        self.handle_frame_with(&mut Clock::at(now), src, frame, mem)
    }

    /// [`handle_frame`](Self::handle_frame), the time read from `clock`
    /// only where it is needed. A data frame on a connection settled
    /// needs none: what it changes that depends on the time (its ack's
    /// round trip, the liveness timers, its own delayed ack) is done at the
    /// next [`settle`](Self::settle), with that call's time.
    pub fn handle_frame_with(
        &mut self,
        clock: &mut Clock,
        src: u32,
        frame: &Repr<'_>,
        mem: &mut dyn Memory,
    ) -> bool {
        self.stats.frames_received += 1;
        if self.unsettled() {
            self.settle(clock.now());
        }
        if self.state == State::Connecting {
            return self.on_answer(clock.now(), src, frame);
        }
        if src != self.peer_id {
            self.stats.dropped += 1;
            return false;
        }
        match frame {
            // Heard: its liveness timers move at the next settle.
            Repr::Data { .. } => self.heard_unarmed = true,
            _ => self.heard(clock.now()),
        }
        match frame {
            Repr::ConnAccept { .. } => {
                // Our confirm was lost: say it again.
                self.confirm_due = true;
                true
            }
            Repr::ConnRequest { .. } | Repr::PeerRequest { .. } => {
                // A repeated request: the accept goes out again.
                if self.is_connected() {
                    self.enter(State::Accepting);
                }
                true
            }
            Repr::ConnConfirm => {
                self.confirmed();
                true
            }
            Repr::ConnReject { .. } => {
                self.stats.dropped += 1;
                false
            }
            Repr::Disconnect { ack, done } => {
                self.disconnect_ack_due = true;
                if self.is_connected() {
                    // What the peer had before it left completes normally.
                    self.on_ack(clock.now(), *ack, *done, &[]);
                }
                if !self.is_closed() {
                    if !matches!(self.state, State::Closing { .. }) {
                        self.flush(Outcome::Transport);
                        self.events.push_back(Event::Disconnected);
                    }
                    self.enter(State::Closed);
                }
                true
            }
            Repr::DisconnectAck => {
                if matches!(self.state, State::Closing { .. }) {
                    self.enter(State::Closed);
                }
                true
            }
            Repr::Ack {
                ack,
                done,
                flags,
                sack,
            } => {
                self.confirmed();
                if !self.is_connected() {
                    return false;
                }
                if flags & ack_flags::PING != 0 {
                    self.pong_due = true;
                }
                self.on_ack(clock.now(), *ack, *done, sack.as_slice());
                true
            }
            Repr::Nak { code, psn, ack } => {
                self.confirmed();
                if !self.is_connected() {
                    return false;
                }
                let now = clock.now();
                self.on_ack(now, *ack, self.peer_done, &[]);
                self.on_nak(now, *code, *psn);
                true
            }
            Repr::Data { header, payload } => {
                self.confirmed();
                if !self.is_connected() {
                    if self.state == State::Failed && self.nak.is_none() {
                        // Our first word of the failure may have been lost.
                        self.nak = Some((NakCode::Failed, header.psn));
                    }
                    if matches!(self.state, State::Closed | State::Closing { .. })
                        && self.peer.is_some()
                    {
                        // The peer still sends: our disconnect (so far) was
                        // lost, and it waits for the ack it carries.
                        self.disconnect_due = true;
                    }
                    self.stats.dropped += 1;
                    return false;
                }
                if self.cfg.level.is_reliable() {
                    self.piggybacked = Some((header.ack, header.done));
                }
                self.on_data(header, payload, mem)
            }
        }
    }

    fn on_data(&mut self, h: &DataHeader, payload: &[u8], mem: &mut dyn Memory) -> bool {
        let reliable = self.cfg.level.is_reliable();
        // (Where the descriptor's memory went away, the write fails and the
        // general path below finds the same and completes it with the error.)
        if reliable && self.next_whole_send(h, payload) && mem.write_recv(h.rsn, 0, payload) {
            return self.took_whole_send(h, payload.len() as u32);
        }
        if !reliable {
            if !self.rcv.in_window(h.psn) {
                if seq::lt(h.psn, self.rcv.base()) {
                    self.stats.dropped += 1;
                    return false;
                }
                // Far ahead: what lay between is lost for good.
                let to = h.psn.wrapping_sub(self.rcv.size() - 1);
                self.rcv.advance(to);
            }
            if self.rcv.contains(h.psn) {
                self.stats.duplicates += 1;
                return false;
            }
        } else if self.rcv.contains(h.psn) {
            // Seen before: our ack was lost, so say it again soon.
            self.stats.duplicates += 1;
            self.ack_now = true;
            self.ack_for_window = false;
            return false;
        } else if !self.rcv.in_window(h.psn) {
            self.stats.dropped += 1;
            return false;
        }
        let accepted = match h.op {
            Op::ReadResponse => self.on_read_response(h, payload, mem),
            _ if h.flags & data_flags::BUNDLE != 0 => self.on_bundle(h, payload, mem),
            _ => self.on_message_frame(h, payload, mem),
        };
        if !accepted {
            return false;
        }
        if reliable {
            self.next_in = super::Expected::after(h, payload.len() as u32, self.frag);
        }
        self.rcv.insert(h.psn);
        if !reliable {
            return true;
        }
        self.owe_ack(h, payload.len() as u32);
        true
    }

    /// True when `h` is the common frame on a reliable connection: the
    /// next one in order with no later one waiting, carrying a whole send
    /// for the next receive descriptor, which it fits, with no message in
    /// assembly. [`on_data`](Self::on_data) takes it without the general
    /// path's window, assembly and delivery steps, to the same effect.
    #[inline]
    fn next_whole_send(&self, h: &DataHeader, payload: &[u8]) -> bool {
        h.psn == self.rcv.base()
            && !self.rcv.has_gap()
            && h.op == Op::Send
            && h.flags & (data_flags::CONSUMES | data_flags::BUNDLE) == data_flags::CONSUMES
            && h.offset == 0
            && h.total as usize == payload.len()
            && h.msn == self.in_base
            && self.in_msgs.is_empty()
            && h.rsn == self.recv_base
            && self.recvs.front().is_some_and(|&cap| h.total <= cap)
            && h.total <= self.cfg.max_transfer
    }

    /// The rest of taking a [`next_whole_send`](Self::next_whole_send)
    /// frame whose payload is placed: the message completes its descriptor
    /// and is owed an acknowledgement, as the general path would leave it.
    fn took_whole_send(&mut self, h: &DataHeader, len: u32) -> bool {
        self.next_in = super::Expected::after(h, len, self.frag);
        self.rcv.insert(h.psn);
        self.in_base = self.in_base.wrapping_add(1);
        let imm = (h.flags & data_flags::IMM != 0).then_some(h.imm);
        self.complete_recv(h.total, imm, false, Outcome::Ok);
        self.owe_ack(h, len);
        true
    }

    /// What a reliable receiver owes for data frame `h` of `len` payload
    /// bytes just taken in: an ack now, or one within the ack delay.
    fn owe_ack(&mut self, h: &DataHeader, len: u32) {
        self.newest_rx = Some(h.psn);
        // A bundle counts its messages: the sender's completions (and the
        // send queue they free) wait on this ack, not the frame alone.
        self.ack_pending += if h.flags & data_flags::BUNDLE != 0 {
            h.total.max(1)
        } else {
            1
        };
        self.ack_bytes = self.ack_bytes.saturating_add(len);
        let last = h.offset.saturating_add(len) >= h.total;
        if h.flags & data_flags::ACK_NOW != 0
            || self.ack_pending >= self.cfg.ack_every
            || self.rcv.has_gap()
        {
            self.ack_now = true;
            self.ack_for_window = false;
        } else if !last
            // Large frames: a quarter of the sender's narrowest byte
            // window, so it never stalls waiting for an ack.
            && self.ack_bytes >= self.cfg.lossy_window_bytes.min(self.cfg.window_bytes) / 4
        {
            self.ack_for_window |= !self.ack_now;
            self.ack_now = true;
        } else {
            // Not for a message's last frame: the answer it may bring
            // carries the ack, and the delay is short. Nor for the
            // window, once the message is whole before the ack went out
            // (a MiB's read response on udp was acked by a datagram of its
            // own just before the receiver's next message, 2.5 us on its
            // way there).
            // Unless half the sender's narrowest window waits on it: a
            // stream of two-frame messages, each whole in one receive,
            // would otherwise be acked every `ack_every` frames, a whole
            // narrow window at 64 KiB, and its sender would stop for
            // every ack.
            let half = self.cfg.lossy_window_bytes.min(self.cfg.window_bytes) / 2;
            if last && self.ack_bytes < half && std::mem::take(&mut self.ack_for_window) {
                self.ack_now = false;
            }
            // Armed at the next settle, unless an answer carried it first.
            self.ack_unarmed = true;
        }
    }

    /// Arms the delayed ack of data taken in, if still owed, from `at`.
    pub(super) fn arm_ack(&mut self, at: Instant) {
        if self.ack_pending > 0 && !self.ack_now && !self.timers.is_set(Timer::Ack) {
            self.timers.set(Timer::Ack, at + self.cfg.ack_delay);
        }
    }

    fn on_read_response(&mut self, h: &DataHeader, payload: &[u8], mem: &mut dyn Memory) -> bool {
        let Some(i) = self.msg_index(h.msn) else {
            self.stats.dropped += 1;
            return false;
        };
        let m = &mut self.msgs[i];
        let end = h.offset as u64 + payload.len() as u64;
        if !matches!(m.kind, OutKind::ReadRequest { .. }) || end > m.len as u64 {
            self.stats.dropped += 1;
            return false;
        }
        mem.write_read(h.msn, h.offset, payload);
        m.read_got += payload.len() as u32;
        if h.total == 0 {
            m.read_got = m.len;
        }
        self.complete_sends();
        true
    }

    fn on_message_frame(&mut self, h: &DataHeader, payload: &[u8], mem: &mut dyn Memory) -> bool {
        let reliable = self.cfg.level.is_reliable();
        let at = h.msn.wrapping_sub(self.in_base);
        if at >= self.cfg.window * super::SPAN {
            // Below the base (already completed) or absurdly far ahead.
            self.stats.dropped += 1;
            return false;
        }
        let at = at as usize;
        let consumes = h.flags & data_flags::CONSUMES != 0;
        // The operation must be allowed here.
        let allowed = match h.op {
            Op::Send => consumes,
            Op::RdmaWrite => self.cfg.rdma_write,
            Op::ReadRequest => self.cfg.rdma_read && reliable,
            Op::ReadResponse => false,
        };
        if !allowed {
            return self.refuse(h.psn, NakCode::Operation, None);
        }
        if h.total > self.cfg.max_transfer {
            // Larger than this VI takes: a peer that ignored the
            // attributes it was given (or garbage).
            return self.refuse(h.psn, NakCode::Length, None);
        }
        let at = if !reliable && at > 0 {
            // A newer message: the ones still in assembly will never be
            // complete at this level (nothing is sent twice), and order
            // must hold, so they are dropped.
            self.abandon(at);
            0
        } else {
            at
        };
        if self.in_msgs.len() == at {
            // The next message, the usual case.
            self.in_msgs.push_back(None);
        } else if self.in_msgs.len() < at {
            self.in_msgs.resize(at + 1, None);
        }
        if self.in_msgs[at].is_none() {
            // First frame of this message to arrive.
            let bound = if !consumes {
                None
            } else if reliable {
                if !self.rsn_in_order(at, h.rsn) {
                    // Not the receive its place in the stream gives it: a
                    // peer that broke the rules, whose messages would land
                    // in one descriptor and complete another.
                    return self.refuse(h.psn, NakCode::Failed, None);
                }
                let idx = h.rsn.wrapping_sub(self.recv_base);
                if idx as usize >= self.recvs.len() {
                    return self.not_ready(h.psn);
                }
                Some(h.rsn)
            } else {
                if self.recvs_bound as usize >= self.recvs.len() {
                    self.stats.messages_dropped += 1;
                    return false;
                }
                let r = self.recv_base.wrapping_add(self.recvs_bound);
                self.recvs_bound += 1;
                Some(r)
            };
            if let Some(r) = bound {
                let cap = self.recv_cap(r);
                if h.op == Op::Send && h.total > cap {
                    // Too long for the descriptor: it completes with a
                    // length error (and a reliable connection breaks).
                    self.in_msgs[at] = Some(InMsg {
                        op: h.op,
                        total: h.total,
                        got: h.total,
                        imm: None,
                        bound: Some(r),
                        refused: false,
                    });
                    if reliable {
                        self.complete_recv_error(r, h.total, Outcome::Length);
                        return self.refuse(h.psn, NakCode::Length, None);
                    }
                    self.deliver_in_order();
                    return true;
                }
            }
            if matches!(h.op, Op::RdmaWrite | Op::ReadRequest) {
                let write = h.op == Op::RdmaWrite;
                if let Err(code) = mem.check_rdma(h.rkey, h.raddr, h.total, write) {
                    if reliable {
                        return self.refuse(h.psn, code, None);
                    }
                    self.stats.messages_dropped += 1;
                    if let Some(r) = bound {
                        // Unbind: the descriptor stays for the next message.
                        let _ = r;
                        self.recvs_bound -= 1;
                    }
                    return false;
                }
            }
            self.in_msgs[at] = Some(InMsg {
                op: h.op,
                total: h.total,
                got: 0,
                imm: (h.flags & data_flags::IMM != 0).then_some(h.imm),
                bound,
                refused: false,
            });
        }
        let Some(m) = self.in_msgs[at] else {
            return false;
        };
        if m.op != h.op || m.total != h.total {
            self.stats.dropped += 1;
            return false;
        }
        match h.op {
            Op::Send => {
                if let Some(r) = m.bound {
                    let cap = self.recv_cap(r);
                    let fits = h.offset as u64 + payload.len() as u64 <= cap as u64;
                    if fits && !m.refused && !mem.write_recv(r, h.offset, payload) {
                        // The descriptor's memory went away under it.
                        if reliable {
                            self.complete_recv_error(r, 0, Outcome::Protection);
                            return self.refuse(h.psn, NakCode::Failed, None);
                        }
                        if let Some(Some(m)) = self.in_msgs.get_mut(at) {
                            m.refused = true;
                        }
                    }
                }
            }
            Op::RdmaWrite => {
                let at = h.raddr.wrapping_add(h.offset as u64);
                if let Err(code) = mem.rdma_write(h.rkey, at, payload) {
                    return self.refuse(h.psn, code, None);
                }
            }
            Op::ReadRequest => {
                if self.responses.len() >= MAX_READS_OWED {
                    // More reads than a peer's send queue holds: one that
                    // asks and never takes the answers would grow this
                    // without end.
                    return self.refuse(h.psn, NakCode::Failed, None);
                }
                self.responses.push_back(OutMsg {
                    msn: h.msn,
                    kind: OutKind::ReadResponse {
                        raddr: h.raddr,
                        rkey: h.rkey,
                    },
                    len: h.total,
                    imm: None,
                    rsn: None,
                    framed: 0,
                    unacked: 0,
                    read_got: 0,
                    started: false,
                });
            }
            Op::ReadResponse => {}
        }
        let got = if h.op == Op::ReadRequest {
            h.total
        } else {
            m.got + payload.len() as u32
        };
        if let Some(Some(mm)) = self.in_msgs.get_mut(at) {
            mm.got = got;
        }
        self.deliver_in_order();
        true
    }

    /// A bundle of whole sends (see [`wire::bundle`](crate::wire::bundle)),
    /// each placed as a frame of its own would be. A send whose receive
    /// descriptor is not posted yet stops the bundle there: the ones
    /// before it are placed, and the frame is refused as not ready, to
    /// come again; then the ones placed are skipped (completed) or placed
    /// again (the same bytes in the same descriptor), so that a receiver
    /// that posts fewer descriptors than a bundle holds still moves.
    fn on_bundle(&mut self, h: &DataHeader, payload: &[u8], mem: &mut dyn Memory) -> bool {
        let well_formed = h.op == Op::Send
            && h.flags & data_flags::CONSUMES != 0
            && h.offset == 0
            && self.cfg.level.is_reliable()
            && bundle::entries(payload, h.total).all(|e| e.is_ok());
        if !well_formed {
            self.stats.dropped += 1;
            return false;
        }
        for (i, e) in bundle::entries(payload, h.total).flatten().enumerate() {
            let (msn, rsn) = (h.msn.wrapping_add(i as u32), h.rsn.wrapping_add(i as u32));
            if seq::lt(msn, self.in_base) {
                continue;
            }
            if rsn.wrapping_sub(self.recv_base) as usize >= self.recvs.len() {
                return self.not_ready(h.psn);
            }
            let one = DataHeader {
                msn,
                rsn,
                flags: data_flags::CONSUMES | if e.imm.is_some() { data_flags::IMM } else { 0 },
                total: e.bytes.len() as u32,
                imm: e.imm.unwrap_or(0),
                ..*h
            };
            if !self.on_message_frame(&one, e.bytes, mem) {
                return false;
            }
        }
        true
    }

    /// Drops the first `n` incoming messages (unreliable level): their
    /// descriptors go to the messages after them.
    fn abandon(&mut self, n: usize) {
        for _ in 0..n {
            if let Some(Some(m)) = self.in_msgs.pop_front() {
                self.stats.messages_dropped += 1;
                if m.bound.is_some() {
                    self.recvs_bound -= 1;
                }
            }
            self.in_base = self.in_base.wrapping_add(1);
        }
    }

    /// Completes incoming messages whose every byte is here, in order.
    fn deliver_in_order(&mut self) {
        loop {
            let front_done = matches!(self.in_msgs.front(), Some(Some(m)) if m.got >= m.total);
            if !front_done {
                return;
            }
            let Some(Some(m)) = self.in_msgs.pop_front() else {
                return;
            };
            self.in_base = self.in_base.wrapping_add(1);
            if let Some(r) = m.bound {
                if r != self.recv_base && self.cfg.level.is_reliable() {
                    // Bound to another receive than the oldest, which a
                    // delivery completes (the checks at binding keep a
                    // peer that follows the rules from this).
                    self.fail(FailReason::Local(NakCode::Failed), None);
                    return;
                }
                let cap = self.recv_cap(r);
                let outcome = if m.op == Op::Send && m.total > cap {
                    Outcome::Length
                } else if m.refused {
                    Outcome::Protection
                } else {
                    Outcome::Ok
                };
                self.complete_recv(m.total, m.imm, m.op == Op::RdmaWrite, outcome);
            }
        }
    }

    /// The capacity of receive `r`, or 0 if no such receive is posted (a
    /// message bound to it then fits nothing and writes nothing).
    fn recv_cap(&self, r: u32) -> u32 {
        let idx = r.wrapping_sub(self.recv_base) as usize;
        self.recvs.get(idx).copied().unwrap_or(0)
    }

    /// True if a reliable message at `at` among those in assembly may take
    /// receive `rsn`: messages take receives in their order, at most one
    /// each, so `rsn` lies between the receive after the last one taken
    /// before `at` and `at` receives past the oldest, and below any taken
    /// after `at`. The receive need not be posted yet (receiver not ready).
    fn rsn_in_order(&self, at: usize, rsn: u32) -> bool {
        if rsn.wrapping_sub(self.recv_base) as u64 > at as u64 {
            return false;
        }
        let bounds = |range: std::ops::Range<usize>| {
            self.in_msgs
                .range(range)
                .filter_map(|m| m.as_ref().and_then(|m| m.bound))
        };
        bounds(0..at).all(|r| seq::lt(r, rsn))
            && bounds(at + 1..self.in_msgs.len()).all(|r| seq::lt(rsn, r))
    }

    /// Completes the oldest receive descriptor.
    pub(super) fn complete_recv(
        &mut self,
        len: u32,
        imm: Option<u32>,
        remote_write: bool,
        outcome: Outcome,
    ) {
        if self.recvs.pop_front().is_none() {
            return;
        }
        let rsn = self.recv_base;
        self.recv_base = self.recv_base.wrapping_add(1);
        if !self.cfg.level.is_reliable() {
            self.recvs_bound = self.recvs_bound.saturating_sub(1);
        }
        self.events.push_back(Event::RecvDone {
            rsn,
            len,
            imm,
            remote_write,
            outcome,
        });
    }

    /// Completes receive descriptor `r` with an error, completing those
    /// before it as flushed (a reliable connection is about to break).
    fn complete_recv_error(&mut self, r: u32, len: u32, outcome: Outcome) {
        while seq::lt(self.recv_base, r) && !self.recvs.is_empty() {
            self.complete_recv(0, None, false, Outcome::Flushed);
        }
        self.complete_recv(len, None, false, outcome);
    }

    /// No descriptor for a reliable message yet.
    fn not_ready(&mut self, psn: u32) -> bool {
        self.stats.rnr_naks += 1;
        match self.cfg.rnr {
            RnrPolicy::Retry { .. } => {
                if self.rnr_nak_at.is_none_or(|p| seq::le(psn, p)) {
                    self.rnr_nak_at = Some(psn);
                    self.nak = Some((NakCode::ReceiverNotReady, psn));
                }
                false
            }
            RnrPolicy::Fail => self.refuse(psn, NakCode::NoDescriptor, None),
        }
    }

    /// A fatal error in the peer's traffic: tell it, and break.
    fn refuse(&mut self, psn: u32, code: NakCode, _outcome: Option<Outcome>) -> bool {
        if !self.cfg.level.is_reliable() {
            self.stats.messages_dropped += 1;
            return false;
        }
        self.nak = Some((code, psn));
        self.fail(FailReason::Local(code), None);
        false
    }
}
