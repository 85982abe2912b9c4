//! A uvia provider (shm, udp) as a benchmark endpoint: registered send and
//! receive buffers, receives kept posted ahead, descriptors reused (no
//! allocation in the measured loop).

use super::{Endpoint, EndpointConfig, Listener, Mode};
use crate::sock::{SpinDeadline, IO_TIMEOUT};
use anyhow::{anyhow, bail, Context, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use uvia::{
    Descriptor, Discriminator, MemAttributes, MemHandle, MemoryRegion, NetAddress, Nic, NicOptions,
    Reliability, Segment, Vi, ViAttributes, ViState,
};

/// Sends between two looks at the send completions.
const REAP_EVERY: usize = 16;
/// Receive descriptors kept posted.
const RECV_AHEAD: usize = 16;
// All of them point at one receive buffer, like the source documents'
// programs: the working set stays in cache, and since messages are placed one
// at a time inside the library's calls, the last message's bytes stay put
// until the next `recv`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest wait for one message (a peer that died is noticed sooner).
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Looks at the flag word between two calls into the VI while a one-sided
/// receiver waits: they serve a write the peer sent through the ring
/// (before the grant) and notice a peer that is gone.
const SPINS_PER_CALL: u32 = 4096;

struct Side {
    nic: Nic,
    vi: Vi,
    send: MemoryRegion,
    recv: MemoryRegion,
    /// The largest message.
    max: usize,
    /// One-sided mode: where the flag word lies in both buffers (the last
    /// 8 bytes of a cache line); a message of `n` bytes lands just before
    /// it, at `flag_at - n`.
    flag_at: usize,
    cfg: EndpointConfig,
}

/// Empty polls of a receive between two drives of the connection it is not
/// waiting on ([`Endpoint::recv_driving`]): a few microseconds apart on udp.
const DRIVE_OTHER_EVERY: u32 = 16;

/// Receives kept posted: on the network providers a reliable sender's
/// whole window must find descriptors (a message without one breaks a VIA
/// connection); `shm` holds early messages in its ring.
fn recv_ahead(cfg: &EndpointConfig) -> usize {
    if cfg.nic.starts_with("shm") {
        RECV_AHEAD
    } else {
        RECV_AHEAD + cfg.window.max(1)
    }
}

fn side(cfg: &EndpointConfig) -> Result<Side> {
    let opts = NicOptions {
        inject: cfg.inject.clone(),
        ..NicOptions::default()
    };
    let nic = Nic::open_with(&cfg.nic, &opts)
        .with_context(|| format!("opening the Nic {:?}", cfg.nic))?;
    let ptag = nic.create_ptag()?;
    let max = cfg.max_size.max(1);
    // The flag word ends a cache line, so that a message of up to 56 bytes
    // and its flag travel in one line.
    let flag_at = max.next_multiple_of(64) + 56;
    let len = if cfg.rdma_write { flag_at + 8 } else { max };
    let send = nic.alloc_region(len, MemAttributes::new(ptag))?;
    let recv = nic.alloc_region(len, MemAttributes::new(ptag).rdma_write(cfg.rdma_write))?;
    let ahead = recv_ahead(cfg);
    let depth = (cfg.window.max(1) as u32).max(ahead as u32) * 2;
    let attrs = ViAttributes::new(ptag)
        .reliability(cfg.reliability)
        .max_transfer_size(len.max(1 << 20) as u32)
        .queue_depths(depth, depth)
        .rdma(cfg.rdma_write, false);
    let vi = nic.create_vi(attrs, None, None)?;
    if cfg.mode == Mode::Blocking {
        vi.set_wait_spin(Duration::ZERO);
    }
    // Touch every buffer once so page faults stay out of the measurement.
    let mut s = Side {
        nic,
        vi,
        send,
        recv,
        max,
        flag_at,
        cfg: cfg.clone(),
    };
    s.send.as_mut_slice().fill(0x5a);
    s.recv.as_mut_slice().fill(0);
    // (In one-sided mode the first receive takes the peer's buffer's
    // address, which may be longer than the largest message.)
    for _ in 0..ahead {
        s.vi.post_recv(Box::new(Descriptor::recv(&[s.recv.segment(0, len)])))
            .map_err(|e| anyhow!("posting a receive: {e}"))?;
    }
    Ok(s)
}

struct ViaListener {
    side: Side,
    disc: u64,
}

pub fn listen(cfg: &EndpointConfig) -> Result<Box<dyn Listener>> {
    let side = side(cfg)?;
    let disc = ((std::process::id() as u64) << 32)
        ^ (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .subsec_nanos() as u64);
    Ok(Box::new(ViaListener { side, disc }))
}

impl Listener for ViaListener {
    /// `<host address>/<discriminator>`.
    fn info(&self) -> String {
        format!("{}/{:x}", self.side.nic.attributes().address, self.disc)
    }

    fn accept(self: Box<Self>) -> Result<Box<dyn Endpoint>> {
        let mut req = self
            .side
            .nic
            .connect_wait(&Discriminator::from_u64(self.disc), Some(CONNECT_TIMEOUT))
            .context("waiting for the client")?;
        req.accept(&self.side.vi).context("accepting the client")?;
        self.side
            .nic
            .stop_listening(&Discriminator::from_u64(self.disc));
        Ok(Box::new(ViaEndpoint::new(self.side)?))
    }
}

pub fn connect(cfg: &EndpointConfig, info: &str) -> Result<Box<dyn Endpoint>> {
    let bad = || format!("bad listener info {info:?} (expected <host>/<discriminator>)");
    let (host, disc) = info.trim().rsplit_once('/').with_context(bad)?;
    let disc = u64::from_str_radix(disc, 16).with_context(bad)?;
    let side = side(cfg)?;
    side.vi
        .connect_request(
            &NetAddress::new(host, Discriminator::from_u64(disc)),
            CONNECT_TIMEOUT,
        )
        .with_context(|| format!("connecting to the server at {host}"))?;
    Ok(Box::new(ViaEndpoint::new(side)?))
}

struct ViaEndpoint {
    s: Side,
    /// Spare send descriptors, boxed because posting hands the box to the VI.
    #[allow(clippy::vec_box)]
    free: Vec<Box<Descriptor>>,
    in_flight: usize,
    /// Sends posted so far.
    posts: usize,
    /// The descriptor of the last message, re-posted on the next `recv`.
    current: Option<Box<Descriptor>>,
    last_len: usize,
    /// One-sided mode: the peer's receive buffer, and the messages sent
    /// and received so far (a message's number is in its flag word).
    remote: Option<(u64, MemHandle)>,
    sent: u32,
    received: u32,
}

impl ViaEndpoint {
    fn new(s: Side) -> Result<ViaEndpoint> {
        let free = (0..s.cfg.window.max(1) + 1)
            .map(|_| Box::new(Descriptor::default()))
            .collect();
        let mut ep = ViaEndpoint {
            s,
            free,
            in_flight: 0,
            posts: 0,
            current: None,
            last_len: 0,
            remote: None,
            sent: 0,
            received: 0,
        };
        if ep.s.cfg.rdma_write {
            ep.remote = Some(ep.exchange_buffers()?);
        }
        Ok(ep)
    }

    /// One-sided mode: tells the peer where this side's receive buffer is
    /// (a send into its posted receive) and learns where the peer's is.
    fn exchange_buffers(&mut self) -> Result<(u64, MemHandle)> {
        let s = &mut self.s;
        let mine = (s.recv.addr() as u64, s.recv.handle().0);
        s.send.as_mut_slice()[..8].copy_from_slice(&mine.0.to_le_bytes());
        s.send.as_mut_slice()[8..12].copy_from_slice(&mine.1.to_le_bytes());
        s.vi.post_send(Box::new(Descriptor::send(&[s.send.segment(0, 12)])))
            .map_err(|e| anyhow!("post send: {e}"))?;
        s.vi.send_wait(Some(CONNECT_TIMEOUT))
            .map_err(|e| anyhow!("sending this side's buffer: {e}"))?
            .result()
            .map_err(|e| anyhow!("sending this side's buffer: {e}"))?;
        let d =
            s.vi.recv_wait(Some(CONNECT_TIMEOUT))
                .map_err(|e| anyhow!("waiting for the peer's buffer: {e}"))?;
        if d.result() != Ok(12) {
            bail!("the peer's buffer came as {:?}, not 12 bytes", d.result());
        }
        let b = s.recv.as_slice();
        let addr = u64::from_le_bytes(b[..8].try_into()?);
        let handle = MemHandle(u32::from_le_bytes(b[8..12].try_into()?));
        Ok((addr, handle))
    }

    /// One-sided mode: waits for the next message's flag word in this
    /// side's buffer, making a call into the VI every [`SPINS_PER_CALL`]
    /// looks only. The writes the initiator places copy the message and
    /// then the flag, so the flag comes last; a write the target places
    /// (the first, before its grant) is one copy whose stores may land in
    /// any order, which only the warm-up's bytes can meet.
    #[inline]
    fn recv_watching(&mut self) -> Result<usize> {
        let want = self.received.wrapping_add(1);
        // SAFETY: the flag word lies inside the receive region (`side`),
        // 8-byte aligned; the peer writes it with plain stores, which an
        // atomic load observes whole on this architecture's aligned words.
        let flag =
            unsafe { AtomicU64::from_ptr(self.s.recv.addr().add(self.s.flag_at) as *mut u64) };
        let mut spins = 0u32;
        let mut since: Option<std::time::Instant> = None;
        loop {
            let v = flag.load(Ordering::Acquire);
            if (v >> 32) as u32 == want {
                let len = (v & 0xffff_ffff) as usize;
                if len > self.s.max {
                    bail!(
                        "the peer wrote a {len} byte message into a {} byte buffer",
                        self.s.max
                    );
                }
                self.received = want;
                self.last_len = len;
                return Ok(len);
            }
            // Paced: neither a tight spin nor a pause (measured in
            // `uvia::between_looks`).
            uvia::between_looks();
            spins += 1;
            if spins.is_multiple_of(SPINS_PER_CALL) {
                self.reap(false)?;
                if self.s.vi.state() == ViState::Error {
                    bail!("the connection failed while waiting for a message");
                }
                let t = since.get_or_insert_with(std::time::Instant::now);
                if t.elapsed() > MESSAGE_TIMEOUT {
                    bail!("no message in {MESSAGE_TIMEOUT:?}");
                }
            }
        }
    }

    /// Why the connection failed, where the VI knows (after a completion's
    /// error).
    fn broken_hint(&self) -> String {
        match self.s.vi.broken_by() {
            Some(b) => format!(" ({})", b.text().to_string_lossy()),
            None => String::new(),
        }
    }

    /// Why a wait may have ended empty-handed, for its error.
    fn lost_hint(&self) -> &'static str {
        match self.s.cfg.reliability {
            Reliability::Unreliable => {
                " (at the unreliable level a message lost or refused for want of a \
                 posted receive is gone: no retransmission; use --reliability delivery)"
            }
            _ if self.s.vi.state() == ViState::Error => " (the connection failed)",
            _ => "",
        }
    }

    /// Counts a post; takes back what has completed every few posts: off
    /// the message's path, and a network provider's posts in between leave
    /// together.
    fn posted(&mut self) -> Result<()> {
        self.in_flight += 1;
        self.posts = self.posts.wrapping_add(1);
        if self.posts.is_multiple_of(REAP_EVERY) {
            self.reap(false)?;
        }
        Ok(())
    }

    fn reap(&mut self, block: bool) -> Result<()> {
        let mut idle = SpinDeadline::new();
        loop {
            let d = if block && self.s.cfg.mode == Mode::Blocking {
                Some(
                    self.s
                        .vi
                        .send_wait(Some(Duration::from_secs(30)))
                        .map_err(|e| anyhow!("send wait: {e}"))?,
                )
            } else {
                self.s.vi.send_done()
            };
            match d {
                Some(d) => {
                    d.result().map_err(|e| {
                        anyhow!("send completed with an error: {e}{}", self.broken_hint())
                    })?;
                    self.in_flight -= 1;
                    self.free.push(d);
                    if block {
                        return Ok(());
                    }
                }
                None if block => {
                    if idle.expired() {
                        bail!("no send completed in {IO_TIMEOUT:?}{}", self.lost_hint());
                    }
                }
                None => return Ok(()),
            }
        }
    }
}

/// A one-sided message's flag word: its number and its length.
fn flag_word(number: u32, len: usize) -> [u8; 8] {
    ((number as u64) << 32 | len as u64).to_le_bytes()
}

impl Side {
    /// Where a one-sided message of `len` bytes lands in the peer's buffer
    /// `peer`: just before the flag word.
    fn landing(&self, (addr, handle): (u64, MemHandle), len: usize) -> Segment {
        Segment::remote(addr + (self.flag_at - len) as u64, handle)
    }
}

impl Endpoint for ViaEndpoint {
    /// One-sided, one loop: each reply's flag word and place are made
    /// while its message is on the way, so that between finding the
    /// message and writing the reply there is only the write.
    fn rounds(
        &mut self,
        size: usize,
        n: usize,
        client: bool,
        mark: &mut dyn FnMut(),
    ) -> Result<()> {
        let Some(peer) = self.remote else {
            return super::rounds_by_calls(self, size, n, client, mark);
        };
        if size > self.s.max {
            // Refused there, with the reason.
            return self.send(size);
        }
        let remote = self.s.landing(peer, size);
        super::rounds_with(
            self,
            size,
            n,
            client,
            mark,
            |ep| {
                let number = ep.sent.wrapping_add(1);
                (number, flag_word(number, size))
            },
            |ep| ep.recv_watching(),
            |ep, (number, flag)| {
                let msg = &ep.s.send.as_slice()[..size];
                if ep
                    .s
                    .vi
                    .write_copy(&[msg, &flag], remote)
                    .map_err(|e| anyhow!("RDMA write by copy: {e}"))?
                {
                    ep.sent = number;
                    Ok(())
                } else {
                    ep.send(size)
                }
            },
        )
    }

    fn send_buf(&mut self) -> &mut [u8] {
        let max = self.s.max;
        &mut self.s.send.as_mut_slice()[..max]
    }

    fn send(&mut self, len: usize) -> Result<()> {
        if len > self.s.max {
            bail!(
                "message of {len} bytes is larger than the endpoint's {} byte buffer",
                self.s.max
            );
        }
        // One-sided: the message, then its flag word `(number << 32) |
        // length`, by copy where the transport can (as UCX's short put and
        // libfabric's inject write go): no descriptor to take back.
        let one_sided = match self.remote {
            None => None,
            Some(peer) => {
                self.sent = self.sent.wrapping_add(1);
                let at = self.s.flag_at;
                let flag = flag_word(self.sent, len);
                let remote = self.s.landing(peer, len);
                // The flag word from here: by copy, the bytes need not be
                // registered, and read back from the buffer they would
                // wait for the store that put them there.
                if self
                    .s
                    .vi
                    .write_copy(&[&self.s.send.as_slice()[..len], &flag], remote)
                    .map_err(|e| anyhow!("RDMA write by copy: {e}"))?
                {
                    return Ok(());
                }
                self.s.send.as_mut_slice()[at..at + 8].copy_from_slice(&flag);
                Some((remote, at))
            }
        };
        while self.in_flight >= self.s.cfg.window.max(1) {
            self.reap(true)?;
        }
        let mut d = self
            .free
            .pop()
            .ok_or_else(|| anyhow!("no free send descriptor"))?;
        // A descriptor that moved this size before is posted as it is (its
        // segments are the same), as a program that sends one shape of
        // message keeps its descriptors built.
        let (reuse, what) = match one_sided {
            None => (
                d.cs.seg_count == 1 && d.ds[0] == self.s.send.segment(0, len),
                "post send",
            ),
            Some((remote, _)) => (d.cs.seg_count == 3 && d.ds[0] == remote, "post RDMA write"),
        };
        if reuse {
            d.cs.status = 0;
            d.cs.length = 0;
        } else {
            *d = match one_sided {
                None => Descriptor::send(&[self.s.send.segment(0, len)]),
                Some((remote, at)) => Descriptor::rdma_write(
                    remote,
                    &[self.s.send.segment(0, len), self.s.send.segment(at, 8)],
                ),
            };
        }
        self.s.vi.post_send(d).map_err(|e| anyhow!("{what}: {e}"))?;
        self.posted()
    }

    fn recv(&mut self) -> Result<usize> {
        self.recv_driving(&|| {})
    }

    fn recv_driving(&mut self, idle: &dyn Fn()) -> Result<usize> {
        if self.remote.is_some() {
            return self.recv_watching();
        }
        if let Some(mut d) = self.current.take() {
            *d = Descriptor::recv(&[self.s.recv.segment(0, self.s.max)]);
            self.s
                .vi
                .post_recv(d)
                .map_err(|e| anyhow!("post receive: {e}"))?;
        }
        let d = match self.s.cfg.mode {
            Mode::Blocking => self
                .s
                .vi
                .recv_wait(Some(Duration::from_secs(30)))
                .map_err(|e| anyhow!("receive wait: {e}"))?,
            Mode::Polling => {
                let mut idle_check = SpinDeadline::new();
                let mut spins = 0u32;
                loop {
                    if let Some(d) = self.s.vi.recv_done() {
                        break d;
                    }
                    // A pause between empty looks: on shm a look every
                    // few cycles keeps taking the ring's line back from
                    // the sender's store (8 B one way 80-85 ns without it,
                    // 75-80 with it). A look here is a whole call, and
                    // `uvia::between_looks` measured no different.
                    std::hint::spin_loop();
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(DRIVE_OTHER_EVERY) {
                        idle();
                    }
                    if idle_check.expired() {
                        bail!("no message in {IO_TIMEOUT:?}{}", self.lost_hint());
                    }
                }
            }
        };
        let n = d
            .result()
            .map_err(|e| anyhow!("receive completed with an error: {e}{}", self.broken_hint()))?
            as usize;
        self.current = Some(d);
        self.last_len = n;
        Ok(n)
    }

    fn drive(&self) {
        // Never waits for another thread that holds the VI (the library's
        // progress thread, which may have lost its core meanwhile).
        let _ = self.s.vi.try_drive();
    }

    fn recv_buf(&self) -> &[u8] {
        if self.remote.is_some() {
            let at = self.s.flag_at;
            return &self.s.recv.as_slice()[at - self.last_len..at];
        }
        match &self.current {
            Some(_) => &self.s.recv.as_slice()[..self.last_len],
            None => &[],
        }
    }

    fn flush(&mut self) -> Result<()> {
        while self.in_flight > 0 {
            self.reap(true)?;
        }
        Ok(())
    }
}
