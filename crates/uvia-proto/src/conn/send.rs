//! Frames going out: the handshake's and control frames first, then
//! retransmissions, then new fragments, then acks; and what the peer's
//! acks and naks say about the frames in flight.

use super::{
    Clock, Conn, Event, FailReason, Level, Memory, OutKind, OutMsg, Outcome, RnrPolicy, Sent,
    State, Timer,
};
use crate::seq;
use crate::wire::{
    self, ack_flags, bundle, data_flags, DataHeader, NakCode, Op, Repr, SackList, DATA_HEADER_LEN,
    MAX_SACK,
};
use std::time::{Duration, Instant};

impl Conn {
    /// Builds the next frame to send into `buf` (at least `max_frame`
    /// bytes) and returns its length, or `None` when there is nothing to
    /// send now. Call after every `handle_*` and `post_*` until it returns
    /// `None`. Frames of a client still connecting go to the server's
    /// address with destination id 0; all others to the peer.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        mem: &mut dyn Memory,
    ) -> Option<usize> {
        self.poll_transmit_with(&mut Clock::at(now), buf, mem)
    }

    /// [`poll_transmit`](Self::poll_transmit), the time read from `clock`
    /// only where it is needed. A new data frame needs none: it counts as
    /// sent at the next [`settle`](Self::settle), which the caller makes
    /// once the frame is out, and its timers are armed there. Whether a
    /// keep-alive is due is judged at [`Clock::at_least`].
    pub fn poll_transmit_with(
        &mut self,
        clock: &mut Clock,
        buf: &mut [u8],
        mem: &mut dyn Memory,
    ) -> Option<usize> {
        let n = self.transmit(clock, buf, mem)?;
        self.stats.frames_sent += 1;
        Some(n)
    }

    /// False only if [`poll_transmit`](Self::poll_transmit) would build
    /// nothing at `now`: no handshake or control frame, acknowledgement,
    /// keep-alive or answer owed, nothing lost to send again, no fragment
    /// waiting to be framed. A few loads, against a transmission call's
    /// setup (on AF_XDP, taking a frame from the ring and giving it back):
    /// most calls after an arrival have nothing to send. True may still
    /// build nothing (a full window, an earlier message awaited).
    pub fn may_transmit(&self, now: Instant) -> bool {
        if self.state != State::Connected {
            return true;
        }
        self.confirm_due
            || self.nak.is_some()
            || self.pong_due
            || (self.ack_now && self.cfg.level.is_reliable())
            || self.timers.expired(Timer::KeepAlive, now)
            || (!self.timers.is_set(Timer::Rnr) && (self.lost > 0 || self.unframed()))
    }

    /// A message or read response has fragments not yet framed.
    fn unframed(&self) -> bool {
        self.frame_cursor < self.msgs.len() || self.responses.iter().any(|m| !m.fully_framed())
    }

    fn transmit(
        &mut self,
        clock: &mut Clock,
        buf: &mut [u8],
        mem: &mut dyn Memory,
    ) -> Option<usize> {
        let (dst, src) = (self.peer_id, self.local_id);
        if !self.is_connected() {
            return self.transmit_unconnected(clock.now(), buf);
        }
        if self.state == State::Accepting {
            if let Some(n) = self.transmit_accept(clock.now(), buf) {
                return Some(n);
            }
        }
        if self.confirm_due {
            self.confirm_due = false;
            return Some(Repr::ConnConfirm.emit(buf, dst, src));
        }
        if let Some((code, psn)) = self.nak.take() {
            let ack = self.rcv.base();
            return Some(Repr::Nak { code, psn, ack }.emit(buf, dst, src));
        }
        if !self.timers.is_set(Timer::Rnr) {
            if self.lost > 0 {
                if let Some(n) = self.retransmit(clock.now(), buf, mem) {
                    return Some(n);
                }
            }
            if let Some(n) = self.send_new(clock, buf, mem) {
                return Some(n);
            }
        }
        let mut ping_due = self.timers.expired(Timer::KeepAlive, clock.at_least());
        if ping_due {
            let now = clock.now();
            if std::mem::take(&mut self.heard_unarmed) {
                // A frame heard, not yet settled, moves it.
                self.last_rx = self.last_rx.max(now);
                self.arm_liveness();
            }
            ping_due = self.timers.expired(Timer::KeepAlive, now);
        }
        let ack_due = self.ack_now && self.cfg.level.is_reliable();
        if ack_due || ping_due || self.pong_due {
            self.ack_now = false;
            self.ack_for_window = false;
            self.pong_due = false;
            let flags = if ping_due {
                self.last_ping = Some(clock.now());
                self.kept_elsewhere = false;
                self.arm_liveness();
                ack_flags::PING
            } else {
                0
            };
            self.ack_pending = 0;
            self.ack_bytes = 0;
            self.timers.stop(Timer::Ack);
            self.stats.acks_sent += 1;
            // The range of the newest arrival first, then the lowest ones:
            // every arrival is reported at least once even when more gaps
            // are open than an ack has room for.
            let mut sack = SackList::default();
            let newest = self.newest_rx.and_then(|n| self.rcv.range_of(n));
            if let Some((s, e)) = newest {
                sack.push(s, e);
            }
            self.rcv.ranges(MAX_SACK, |s, e| {
                if Some((s, e)) != newest {
                    sack.push(s, e);
                }
            });
            let r = Repr::Ack {
                ack: self.rcv.base(),
                done: self.in_base,
                flags,
                sack,
            };
            return Some(r.emit(buf, dst, src));
        }
        None
    }

    /// Sends a frame marked lost again, if one still is. Called with frames
    /// marked lost: the ack not yet applied may say one arrived after all,
    /// so it is settled first.
    fn retransmit(&mut self, now: Instant, buf: &mut [u8], mem: &mut dyn Memory) -> Option<usize> {
        self.settle(now);
        let (i, s, m) = loop {
            if self.lost == 0 {
                return None;
            }
            let Some(i) = self.inflight.iter().position(|s| s.lost && !s.acked) else {
                self.lost = 0;
                return None;
            };
            let s = self.inflight[i];
            let m = if s.response {
                self.responses.iter().find(|m| m.msn == s.msn).cloned()
            } else {
                // A bundle's messages are all still queued: none completes
                // before the frame's ack.
                self.msg_index(s.msn)
                    .filter(|&j| j + s.count as usize <= self.msgs.len())
                    .map(|j| self.msgs[j].clone())
            };
            if let Some(m) = m {
                break (i, s, m);
            }
            // Its message is gone (completed on the peer's word); nothing
            // to send, and it no longer counts against the window.
            self.inflight[i].lost = false;
            self.inflight[i].acked = true;
            self.inflight_bytes = self.inflight_bytes.saturating_sub(s.len);
            self.pipe = self.pipe.saturating_sub(1);
            self.lost -= 1;
        };
        let psn = self.snd_una.wrapping_add(i as u32);
        let order = self.next_order();
        let r = &mut self.inflight[i];
        r.lost = false;
        r.transmissions = s.transmissions.saturating_add(1);
        r.sent_at = now;
        r.order = order;
        self.lost -= 1;
        self.stats.retransmitted += 1;
        if !self.timers.is_set(Timer::Rto) {
            self.timers.set(Timer::Rto, now + self.rtt.rto());
        }
        if self.lost == 0 {
            self.arm_probe(now);
        }
        if s.count > 1 {
            let j = self.msg_index(s.msn)?;
            let n = self.emit_bundle(buf, psn, j, s.count as usize, data_flags::ACK_NOW, mem);
            return Some(n);
        }
        Some(self.emit_data(buf, psn, &m, s.offset, s.len, data_flags::ACK_NOW, mem))
    }

    fn next_order(&mut self) -> u64 {
        let o = self.sent_order;
        self.sent_order += 1;
        o
    }

    fn send_new(
        &mut self,
        clock: &mut Clock,
        buf: &mut [u8],
        mem: &mut dyn Memory,
    ) -> Option<usize> {
        let reliable = self.cfg.level.is_reliable();
        // Where the window is full or a message waits, an ack not yet
        // applied may open it or end the wait: applied, and looked again.
        if reliable && self.window_full() && (!self.settled(clock) || self.window_full()) {
            return None;
        }
        // Read responses first: the peer is waiting for them.
        let (response, idx) = if let Some(i) = self.responses.iter().position(|m| !m.fully_framed())
        {
            (true, i)
        } else if self.frame_cursor < self.msgs.len() {
            if reliable
                && self.waits_for_earlier(self.frame_cursor)
                && (!self.settled(clock) || self.waits_for_earlier(self.frame_cursor))
            {
                return None;
            }
            let k = self.bundle_len(self.frame_cursor);
            if k > 1 {
                return Some(self.send_bundle(buf, self.frame_cursor, k, mem));
            }
            (false, self.frame_cursor)
        } else {
            return None;
        };
        let m = if response {
            &mut self.responses[idx]
        } else {
            &mut self.msgs[idx]
        };
        let offset = m.framed;
        let len = (m.payload_len() - offset).min(self.frag);
        m.framed += len;
        m.started = true;
        m.unacked += 1;
        let m = m.clone();
        let last = m.framed >= m.payload_len();
        if !response && last {
            self.frame_cursor += 1;
        }
        let psn = self.snd_nxt;
        self.snd_nxt = psn.wrapping_add(1);
        let more = self.unframed();
        let flags = if last && !more && self.cfg.level == Level::ReliableReception {
            // Reliable reception completes on the peer's word: ask for it now.
            data_flags::ACK_NOW
        } else {
            0
        };
        if reliable {
            self.record_sent(response, m.msn, offset, len, 1);
        }
        let n = self.emit_data(buf, psn, &m, offset, len, flags, mem);
        if !reliable {
            if let Some(j) = self.msg_index(m.msn).filter(|_| !response) {
                self.msgs[j].unacked = 0;
            }
            self.complete_sends();
        }
        Some(n)
    }

    /// No room for another frame in flight.
    fn window_full(&self) -> bool {
        self.pipe >= self.cfg.window
            || self.inflight.len() as u32 >= self.cfg.window * super::SPAN
            || self.inflight_bytes >= self.byte_window()
    }

    /// The payload bytes that may be in flight: the whole window on a path
    /// that has lost nothing lately, the lossy one after a loss (every
    /// place that marks a frame lost, a probe's tail and a receiver's
    /// refusal aside, sets `clean_bytes` to 0).
    fn byte_window(&self) -> u32 {
        let lossy = self.cfg.lossy_window_bytes.min(self.cfg.window_bytes);
        if self.clean_bytes / super::CLEAN_TO_REOPEN >= lossy {
            self.cfg.window_bytes
        } else {
            lossy
        }
    }

    /// Applies a data frame's ack not yet applied, if one waits: true if
    /// one did, and the sending side may have moved.
    fn settled(&mut self, clock: &mut Clock) -> bool {
        let waiting = self.piggybacked.is_some();
        if waiting {
            self.settle(clock.now());
        }
        waiting
    }

    /// How many queued sends from `i` on go out in one frame: 1 unless
    /// several small whole sends wait together (a burst the VI held for
    /// one system call), at reliable delivery, where a send completes on
    /// its frame's ack. Consecutive sends only, each consuming the next
    /// receive descriptor, all within the frame and within the messages
    /// the receiver keeps ahead of its base.
    fn bundle_len(&self, i: usize) -> usize {
        // A lone message (a ping-pong's every one) goes as it is.
        if i + 1 >= self.msgs.len() || self.cfg.level != super::Level::ReliableDelivery {
            return 1;
        }
        let Some(oldest) = self.msgs.front().map(|m| m.msn) else {
            return 1;
        };
        let room = self.frag as usize;
        let ahead = self.cfg.window * super::SPAN;
        let first = &self.msgs[i];
        let (msn, rsn) = (first.msn, first.rsn);
        let mut bytes = 0;
        let mut k = 0;
        for m in self.msgs.range(i..) {
            let fits = matches!(m.kind, OutKind::Send)
                && !m.started
                && m.len <= super::BUNDLE_MAX_MSG
                && m.msn == msn.wrapping_add(k as u32)
                && m.rsn.is_some()
                && m.rsn == rsn.map(|r| r.wrapping_add(k as u32))
                && m.msn.wrapping_sub(oldest) < ahead
                && bytes + bundle::ENTRY_LEN + m.len as usize <= room;
            if !fits || k == super::BUNDLE_MAX_COUNT {
                break;
            }
            bytes += bundle::ENTRY_LEN + m.len as usize;
            k += 1;
        }
        k.max(1)
    }

    /// Frames the `k` sends from `msgs[i]` on as one bundle.
    fn send_bundle(&mut self, buf: &mut [u8], i: usize, k: usize, mem: &mut dyn Memory) -> usize {
        let mut bytes = 0;
        for m in self.msgs.range_mut(i..i + k) {
            m.framed = m.len;
            m.started = true;
            m.unacked += 1;
            bytes += m.len;
        }
        self.frame_cursor += k;
        let psn = self.snd_nxt;
        self.snd_nxt = psn.wrapping_add(1);
        self.record_sent(false, self.msgs[i].msn, 0, bytes, k as u16);
        self.emit_bundle(buf, psn, i, k, 0, mem)
    }

    /// Records a reliable frame sent for the first time (the next packet
    /// number's): `len` payload bytes of `count` messages from `msn` on, at
    /// `offset` of the first. It counts against the window at once; its
    /// time is the next settle's, which arms its retransmission and probe
    /// timers, once the caller's transmission is done.
    fn record_sent(&mut self, response: bool, msn: u32, offset: u32, len: u32, count: u16) {
        let order = self.next_order();
        self.inflight.push_back(Sent {
            response,
            msn,
            offset,
            len,
            count,
            // A stand-in until the settle.
            sent_at: self.last_rx,
            order,
            transmissions: 1,
            acked: false,
            lost: false,
            probe: false,
        });
        self.inflight_bytes += len;
        self.pipe += 1;
        self.sent_unarmed += 1;
    }

    /// Arms the retransmission timer and the probe for the frames sent at
    /// `at`, as [`settle`](Self::settle) does after the caller's
    /// transmission; the timer restarts if an ack applied just before
    /// brought `progress`.
    pub(super) fn arm_sent(&mut self, at: Instant, progress: bool) {
        if progress || !self.timers.is_set(Timer::Rto) {
            self.timers.set(Timer::Rto, at + self.rtt.rto());
        }
        self.arm_probe(at);
    }

    /// Writes the bundle frame of the `k` sends from `msgs[i]` on.
    fn emit_bundle(
        &mut self,
        buf: &mut [u8],
        psn: u32,
        i: usize,
        k: usize,
        flags: u8,
        mem: &mut dyn Memory,
    ) -> usize {
        let first = &self.msgs[i];
        let h = DataHeader {
            psn,
            ack: self.rcv.base(),
            msn: first.msn,
            op: Op::Send,
            flags: flags | data_flags::BUNDLE | data_flags::CONSUMES,
            offset: 0,
            total: k as u32,
            imm: 0,
            rkey: 0,
            raddr: 0,
            rsn: first.rsn.unwrap_or(0),
            done: self.in_base,
        };
        h.emit(buf, self.peer_id, self.local_id);
        let mut at = DATA_HEADER_LEN;
        for m in self.msgs.range(i..i + k) {
            bundle::emit_entry(&mut buf[at..], m.len as u16, m.imm);
            at += bundle::ENTRY_LEN;
            let end = at + m.len as usize;
            mem.read_send(m.msn, 0, &mut buf[at..end]);
            at = end;
        }
        self.data_sent(buf, at)
    }

    /// True when message `i`, not started yet, must wait for an earlier
    /// one to reach the target first: the target places RDMA frames as
    /// they arrive, not in order, so a write (or a read) overlapping an
    /// earlier write still in flight could land before it and be
    /// overwritten by a retransmission of it, and a write overlapping an
    /// earlier read could change the bytes before the target has sent them.
    /// (Addresses alone are compared: two handles may name the same memory.)
    fn waits_for_earlier(&self, i: usize) -> bool {
        let m = &self.msgs[i];
        if m.started {
            return false;
        }
        let (at, len) = match m.kind {
            OutKind::Write { raddr, .. } | OutKind::ReadRequest { raddr, .. } => (raddr, m.len),
            _ => return false,
        };
        let overlaps = |a: u64, n: u32| {
            n > 0 && len > 0 && a < at.saturating_add(len as u64) && at < a.saturating_add(n as u64)
        };
        self.msgs.iter().take(i).any(|e| match e.kind {
            // A write is placed once every frame of it has arrived.
            OutKind::Write { raddr, .. } => {
                !(e.fully_framed() && e.unacked == 0) && overlaps(raddr, e.len)
            }
            // A read is served once every byte of it is back.
            OutKind::ReadRequest { raddr, .. } => {
                matches!(m.kind, OutKind::Write { .. })
                    && e.read_got < e.len
                    && overlaps(raddr, e.len)
            }
            _ => false,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn emit_data(
        &mut self,
        buf: &mut [u8],
        psn: u32,
        m: &OutMsg,
        offset: u32,
        len: u32,
        flags: u8,
        mem: &mut dyn Memory,
    ) -> usize {
        let (raddr, rkey) = match m.kind {
            OutKind::Send => (0, 0),
            OutKind::Write { raddr, rkey }
            | OutKind::ReadRequest { raddr, rkey }
            | OutKind::ReadResponse { raddr, rkey } => (raddr, rkey),
        };
        let mut f = flags;
        if m.imm.is_some() {
            f |= data_flags::IMM;
        }
        if m.rsn.is_some() {
            f |= data_flags::CONSUMES;
        }
        let h = DataHeader {
            psn,
            ack: self.rcv.base(),
            msn: m.msn,
            op: m.op(),
            flags: f,
            offset,
            total: m.len,
            imm: m.imm.unwrap_or(0),
            rkey,
            raddr,
            rsn: m.rsn.unwrap_or(0),
            done: self.in_base,
        };
        let end = DATA_HEADER_LEN + len as usize;
        h.emit(buf, self.peer_id, self.local_id);
        let payload = &mut buf[DATA_HEADER_LEN..end];
        match m.kind {
            OutKind::Send | OutKind::Write { .. } => mem.read_send(m.msn, offset, payload),
            OutKind::ReadResponse { raddr, rkey } => {
                mem.rdma_read(rkey, raddr.wrapping_add(offset as u64), payload)
            }
            OutKind::ReadRequest { .. } => {}
        }
        self.data_sent(buf, end)
    }

    /// The end of writing a data frame of `end` bytes: its checksum, and
    /// the ack it carries. Returns `end`.
    fn data_sent(&mut self, buf: &mut [u8], end: usize) -> usize {
        // Left out (zero) when the peer's medium checks frames itself: on
        // the udp provider that is two CRCs off every message's path.
        if !self.peer.is_some_and(|p| p.intact) {
            wire::fill_checksum(&mut buf[..end]);
        }
        // The frame carries our ack: no separate one is needed.
        if self.cfg.level.is_reliable() {
            self.ack_pending = 0;
            self.ack_bytes = 0;
            self.timers.stop(Timer::Ack);
            self.ack_now = false;
            self.ack_for_window = false;
        }
        end
    }

    /// Index in `msgs` of our message `msn`.
    pub(super) fn msg_index(&self, msn: u32) -> Option<usize> {
        let first = self.msgs.front()?.msn;
        let i = msn.wrapping_sub(first) as usize;
        (i < self.msgs.len()).then_some(i)
    }

    /// Takes in the peer's acknowledgement; true if it brought progress.
    pub(super) fn on_ack(
        &mut self,
        now: Instant,
        ack: u32,
        done: u32,
        sack: &[(u32, u32)],
    ) -> bool {
        if !self.cfg.level.is_reliable() {
            return false;
        }
        // Ignore acks of psns we never sent.
        if seq::lt(self.snd_nxt, ack) {
            return false;
        }
        let mut progress = false;
        // The most recently sent frame this ack covers, and its round trip
        // (one clock subtraction a frame, for the sample and the loss
        // detection alike).
        let mut newest: Option<(Sent, Duration)> = None;
        let mut note = |s: &Sent| {
            let rtt = now.saturating_duration_since(s.sent_at);
            if newest.is_none_or(|(n, _)| n.order < s.order) {
                newest = Some((*s, rtt));
            }
            rtt
        };
        while seq::lt(self.snd_una, ack) {
            if let Some(s) = self.inflight.pop_front() {
                if s.lost {
                    self.lost -= 1;
                }
                if !s.acked {
                    let rtt = note(&s);
                    self.frame_acked(rtt, &s);
                    progress = true;
                }
            }
            self.snd_una = self.snd_una.wrapping_add(1);
        }
        // Offsets from `snd_una` bound every range by what is in flight,
        // whatever numbers the peer sent.
        let flight = self.inflight.len() as u32;
        for &(start, end) in sack {
            let hi = end.wrapping_sub(self.snd_una);
            if hi == 0 || hi > flight {
                continue;
            }
            let lo = if seq::lt(start, self.snd_una) {
                0
            } else {
                start.wrapping_sub(self.snd_una)
            };
            if lo >= hi {
                continue;
            }
            for i in lo as usize..hi as usize {
                let s = self.inflight[i];
                if !s.acked {
                    if s.lost {
                        self.inflight[i].lost = false;
                        self.lost -= 1;
                    }
                    self.inflight[i].acked = true;
                    let rtt = note(&s);
                    self.frame_acked(rtt, &s);
                    progress = true;
                }
            }
            let last = end.wrapping_sub(1);
            if self.largest_acked.is_none_or(|l| seq::lt(l, last)) {
                self.largest_acked = Some(last);
            }
        }
        if self
            .largest_acked
            .is_none_or(|l| seq::lt(l, ack.wrapping_sub(1)))
        {
            self.largest_acked = Some(ack.wrapping_sub(1));
        }
        // Fast retransmit: three later frames arrived, this one did not.
        if let Some(l) = self.largest_acked.filter(|_| !self.inflight.is_empty()) {
            for i in 0..self.inflight.len() {
                let psn = self.snd_una.wrapping_add(i as u32);
                if !seq::lt(psn.wrapping_add(3), l.wrapping_add(1)) {
                    break;
                }
                let s = &mut self.inflight[i];
                if !s.acked && !s.lost && s.transmissions == 1 {
                    s.lost = true;
                    self.lost += 1;
                    self.clean_bytes = 0;
                }
            }
        }
        if let Some((s, rtt)) = newest {
            self.detect_by_time(now, Some((&s, rtt)));
        }
        if seq::lt(self.peer_done, done) && seq::le(done, self.next_msn) {
            self.peer_done = done;
            progress = true;
        }
        if progress {
            self.timeouts_in_a_row = 0;
            self.rnr_in_a_row = 0;
            self.probes = 0;
            self.rtt.reset_backoff();
            self.complete_sends();
        }
        // Frames built since the last settle are armed by it, from the time
        // they went (a settle applies a data frame's ack after them).
        if self.sent_unarmed == 0 {
            self.arm_timers(now, progress);
        }
        progress
    }

    /// True while a frame waits for its ack.
    pub(super) fn outstanding(&self) -> bool {
        // The oldest record is almost always the one unacked.
        self.inflight.iter().any(|s| !s.acked)
    }

    /// Frame `s` acknowledged, `rtt` after it was last sent.
    fn frame_acked(&mut self, rtt: Duration, s: &Sent) {
        self.inflight_bytes = self.inflight_bytes.saturating_sub(s.len);
        self.clean_bytes = self.clean_bytes.saturating_add(s.len);
        self.pipe = self.pipe.saturating_sub(1);
        if s.transmissions == 1 {
            self.rtt.sample(rtt);
        }
        if s.response {
            if let Some(m) = self.responses.iter_mut().find(|m| m.msn == s.msn) {
                m.unacked = m.unacked.saturating_sub(1);
            }
        } else if let Some(i) = self.msg_index(s.msn) {
            let end = (i + s.count as usize).min(self.msgs.len());
            for m in self.msgs.range_mut(i..end) {
                m.unacked = m.unacked.saturating_sub(1);
            }
        }
        // Responses fully acknowledged are done.
        while matches!(self.responses.front(), Some(r) if r.fully_framed() && r.unacked == 0) {
            self.responses.pop_front();
        }
    }

    pub(super) fn on_nak(&mut self, now: Instant, code: NakCode, psn: u32) {
        if code == NakCode::ReceiverNotReady {
            if let RnrPolicy::Retry { delay, limit } = self.cfg.rnr {
                self.rnr_in_a_row += 1;
                if self.rnr_in_a_row > limit {
                    self.fail(FailReason::RnrExhausted, None);
                    return;
                }
                self.timers.set(Timer::Rnr, now + delay);
            } else {
                self.timers.set(Timer::Rnr, now + self.rtt.rto());
            }
            // The peer answered: that is no silence, whatever it said. The
            // retry limit above ends a wait too long, not the timer.
            self.timeouts_in_a_row = 0;
            self.rtt.reset_backoff();
            self.timers.stop(Timer::Probe);
            match self.timers.get(Timer::Rnr) {
                Some(t) => self.timers.set(Timer::Rto, t + self.rtt.rto()),
                None => self.timers.stop(Timer::Rto),
            }
            // Everything from `psn` on goes again after the pause.
            for i in 0..self.inflight.len() {
                let p = self.snd_una.wrapping_add(i as u32);
                let s = &mut self.inflight[i];
                if !seq::lt(p, psn) && !s.acked && !s.lost {
                    s.lost = true;
                    s.probe = false;
                    self.lost += 1;
                }
            }
            return;
        }
        // A fatal error: the message it names completes with it.
        let msn = self
            .inflight
            .get(psn.wrapping_sub(self.snd_una) as usize)
            .filter(|s| !s.response)
            .map(|s| s.msn);
        self.fail(
            FailReason::Remote(code),
            msn.map(|m| (m, Outcome::Remote(code))),
        );
    }

    /// Completes finished send-queue descriptors, in posting order.
    pub(super) fn complete_sends(&mut self) {
        let level = self.cfg.level;
        while let Some(m) = self.msgs.front() {
            let done = match m.kind {
                OutKind::ReadRequest { .. } => m.read_got >= m.len && m.fully_framed(),
                _ => match level {
                    Level::Unreliable => m.fully_framed(),
                    Level::ReliableDelivery => m.fully_framed() && m.unacked == 0,
                    Level::ReliableReception => seq::lt(m.msn, self.peer_done),
                },
            };
            if !done {
                break;
            }
            let msn = m.msn;
            self.msgs.pop_front();
            self.frame_cursor = self.frame_cursor.saturating_sub(1);
            self.events.push_back(Event::SendDone {
                msn,
                outcome: Outcome::Ok,
            });
        }
    }
}
