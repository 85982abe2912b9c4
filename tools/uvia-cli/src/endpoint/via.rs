//! A uvia provider (shm, udp) as a benchmark endpoint: registered send and
//! receive buffers, receives kept posted ahead, descriptors reused (no
//! allocation in the measured loop).

use super::{Endpoint, EndpointConfig, Listener, Mode};
use anyhow::{anyhow, bail, Context, Result};
use std::time::Duration;
use uvia::{
    Descriptor, Discriminator, MemAttributes, MemoryRegion, NetAddress, Nic, NicOptions, Vi,
    ViAttributes,
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

struct Side {
    nic: Nic,
    vi: Vi,
    send: MemoryRegion,
    recv: MemoryRegion,
    cfg: EndpointConfig,
}

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
    let send = nic.alloc_region(max, MemAttributes::new(ptag))?;
    let recv = nic.alloc_region(max, MemAttributes::new(ptag))?;
    let ahead = recv_ahead(cfg);
    let depth = (cfg.window.max(1) as u32).max(ahead as u32) * 2;
    let attrs = ViAttributes::new(ptag)
        .reliability(cfg.reliability)
        .max_transfer_size(max.max(1 << 20) as u32)
        .queue_depths(depth, depth);
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
        cfg: cfg.clone(),
    };
    s.send.as_mut_slice().fill(0x5a);
    s.recv.as_mut_slice().fill(0);
    for _ in 0..ahead {
        s.vi.post_recv(Box::new(Descriptor::recv(&[s.recv.segment(0, max)])))
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
        Ok(Box::new(ViaEndpoint::new(self.side)))
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
    Ok(Box::new(ViaEndpoint::new(side)))
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
}

impl ViaEndpoint {
    fn new(s: Side) -> ViaEndpoint {
        let free = (0..s.cfg.window.max(1) + 1)
            .map(|_| Box::new(Descriptor::default()))
            .collect();
        ViaEndpoint {
            s,
            free,
            in_flight: 0,
            posts: 0,
            current: None,
            last_len: 0,
        }
    }

    fn reap(&mut self, block: bool) -> Result<()> {
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
                    d.result()
                        .map_err(|e| anyhow!("send completed with an error: {e}"))?;
                    self.in_flight -= 1;
                    self.free.push(d);
                    if block {
                        return Ok(());
                    }
                }
                None if block => continue,
                None => return Ok(()),
            }
        }
    }
}

impl Endpoint for ViaEndpoint {
    fn send_buf(&mut self) -> &mut [u8] {
        self.s.send.as_mut_slice()
    }

    fn send(&mut self, len: usize) -> Result<()> {
        if len > self.s.send.len() {
            bail!(
                "message of {len} bytes is larger than the endpoint's {} byte buffer",
                self.s.send.len()
            );
        }
        while self.in_flight >= self.s.cfg.window.max(1) {
            self.reap(true)?;
        }
        let mut d = self
            .free
            .pop()
            .ok_or_else(|| anyhow!("no free send descriptor"))?;
        *d = Descriptor::send(&[self.s.send.segment(0, len)]);
        self.s
            .vi
            .post_send(d)
            .map_err(|e| anyhow!("post send: {e}"))?;
        self.in_flight += 1;
        // Take back what has completed every few posts: off the message's
        // path, and a network provider's posts in between leave together.
        self.posts = self.posts.wrapping_add(1);
        if self.posts.is_multiple_of(REAP_EVERY) {
            self.reap(false)?;
        }
        Ok(())
    }

    fn recv(&mut self) -> Result<usize> {
        if let Some(mut d) = self.current.take() {
            *d = Descriptor::recv(&[self.s.recv.segment(0, self.s.recv.len())]);
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
            Mode::Polling => loop {
                if let Some(d) = self.s.vi.recv_done() {
                    break d;
                }
            },
        };
        let n = d
            .result()
            .map_err(|e| anyhow!("receive completed with an error: {e}"))? as usize;
        self.current = Some(d);
        self.last_len = n;
        Ok(n)
    }

    fn recv_buf(&self) -> &[u8] {
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
