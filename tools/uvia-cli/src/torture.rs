//! `uvia torture`: uvia under faults, deaths and floods, counted.
//!
//! - **grid**: messages numbered and filled with a pattern of their number
//!   go one way through injected loss, duplication, reordering and
//!   corruption (udp; xdp between two test hosts when root), on both
//!   reliable levels; the receiver counts what was lost, duplicated,
//!   reordered or corrupted. Each must be zero.
//! - **deaths**: a peer killed (SIGKILL) or stopped (SIGSTOP) while the
//!   other side has receives posted and keeps sending, on every provider
//!   and level: how long until every outstanding descriptor has completed
//!   with an error. Limits: 1 s on shm, the idle timeout on the network.
//! - **flood**: a good client's 8-byte echo rate on udp, alone and while
//!   forged connection requests pour onto the server's listener at 200,000
//!   a second; the server's memory is sampled meanwhile.
//!
//! Every peer is a child process of this program (`torture-peer`), so a
//! death is a real process's death.

use crate::run::{self, Level};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use uvia::{
    Descriptor, Discriminator, MemAttributes, MemoryRegion, NetAddress, Nic, NicOptions, Vi,
    ViAttributes, ViState,
};
use uvia_net::netns::{Side, TestHosts};

/// The parts of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Part {
    Grid,
    Deaths,
    Flood,
}

/// What the peer process does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Receives the grid's numbered messages and counts them.
    Grid,
    /// Answers one message, then waits in the library until it dies.
    Death,
    /// Echoes every message, listening on all the while.
    Echo,
}

/// The hidden `torture-peer` command's settings.
#[derive(clap::Args)]
pub struct PeerArgs {
    #[arg(long, value_enum)]
    pub role: Role,
    #[arg(long)]
    pub nic: String,
    #[arg(long, value_enum)]
    pub level: Level,
    #[arg(long)]
    pub disc: u64,
    #[arg(long)]
    pub inject: Option<String>,
    #[arg(long, default_value_t = 0)]
    pub messages: u64,
    #[arg(long)]
    pub cpu: Option<usize>,
}

// ------------------------------------------------------------ the messages

/// Message sizes of the grid, one after another: within a frame, exactly
/// one frame's payload and one byte more, and several frames.
const GRID_SIZES: [usize; 7] = [8, 64, 1000, 1408, 1409, 4096, 9000];
const GRID_MAX: usize = 9000;
/// Messages per acknowledgement from the receiver (the sender's window).
const BATCH: usize = 32;
/// How long the receiver waits for the next message before it counts the
/// rest lost, and the sender for an acknowledgement.
const SILENCE: Duration = Duration::from_secs(20);
const CONNECT: Duration = Duration::from_secs(20);

fn grid_size(seq: u64) -> usize {
    GRID_SIZES[(seq % GRID_SIZES.len() as u64) as usize]
}

/// Byte `i` of message `seq` after its 8-byte number: every byte depends on
/// both, so a byte from another message or place is seen.
fn pattern_byte(seq: u64, i: usize) -> u8 {
    let x =
        seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i as u64).wrapping_mul(0xff51_afd7_ed55_8ccd);
    (x >> 29) as u8
}

fn fill(buf: &mut [u8], seq: u64) {
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in buf[8..].iter_mut().enumerate() {
        *b = pattern_byte(seq, i);
    }
}

/// The number of a received message, or `None` if its length or any byte
/// is not what the sender wrote.
fn check(buf: &[u8]) -> Option<u64> {
    let seq = u64::from_le_bytes(buf.get(..8)?.try_into().ok()?);
    (buf.len() == grid_size(seq)
        && buf[8..]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern_byte(seq, i)))
    .then_some(seq)
}

/// What the grid's receiver counted.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Counts {
    pub sent: u64,
    /// Distinct messages that arrived intact.
    pub received: u64,
    pub lost: u64,
    pub duplicated: u64,
    /// Arrived after a later-numbered one.
    pub reordered: u64,
    /// A length or a byte not as sent.
    pub corrupted: u64,
    /// Why the receiver stopped early, if it did.
    pub error: Option<String>,
}

impl Counts {
    fn clean(&self) -> bool {
        self.error.is_none()
            && self.lost == 0
            && self.duplicated == 0
            && self.reordered == 0
            && self.corrupted == 0
    }
}

/// Counts the grid's messages as they arrive.
struct Tally {
    seen: Vec<bool>,
    highest: Option<u64>,
    c: Counts,
}

impl Tally {
    fn new(n: u64) -> Tally {
        Tally {
            seen: vec![false; n as usize],
            highest: None,
            c: Counts {
                sent: n,
                ..Counts::default()
            },
        }
    }

    fn add(&mut self, bytes: &[u8]) {
        let Some(seq) = check(bytes).filter(|&s| s < self.seen.len() as u64) else {
            self.c.corrupted += 1;
            return;
        };
        if std::mem::replace(&mut self.seen[seq as usize], true) {
            self.c.duplicated += 1;
            return;
        }
        self.c.received += 1;
        if self.highest.is_some_and(|h| seq < h) {
            self.c.reordered += 1;
        }
        self.highest = self.highest.max(Some(seq));
    }

    fn finish(mut self, error: Option<String>) -> Counts {
        self.c.lost = self.c.sent - self.c.received;
        self.c.error = error;
        self.c
    }
}

// ------------------------------------------------------------ one side

/// A Nic, a VI and one registered buffer.
struct End {
    nic: Nic,
    vi: Vi,
    buf: MemoryRegion,
}

fn open_end(nic: &str, level: Level, inject: Option<String>, buf: usize) -> Result<End> {
    let opts = NicOptions {
        inject,
        ..NicOptions::default()
    };
    let nic = Nic::open_with(nic, &opts).with_context(|| format!("opening the Nic {nic:?}"))?;
    let ptag = nic.create_ptag()?;
    let region = nic.alloc_region(buf, MemAttributes::new(ptag))?;
    let depth = (4 * BATCH) as u32;
    let attrs = ViAttributes::new(ptag)
        .reliability(level.reliability())
        .queue_depths(depth, depth);
    let vi = nic.create_vi(attrs, None, None)?;
    Ok(End {
        nic,
        vi,
        buf: region,
    })
}

impl End {
    fn post_recv(&self, slot: usize, len: usize) -> Result<()> {
        let d = Descriptor::recv(&[self.buf.segment(slot * len, len)]);
        self.vi
            .post_recv(Box::new(d))
            .map_err(|e| anyhow!("posting a receive: {e}"))
    }

    fn post_send(&self, at: usize, len: usize) -> Result<()> {
        let d = Descriptor::send(&[self.buf.segment(at, len)]);
        self.vi
            .post_send(Box::new(d))
            .map_err(|e| anyhow!("posting a send: {e}"))
    }

    fn accept(&self, disc: u64) -> Result<()> {
        let mut req = self
            .nic
            .connect_wait(&Discriminator::from_u64(disc), Some(CONNECT))
            .context("waiting for the client")?;
        req.accept(&self.vi).context("accepting the client")?;
        Ok(())
    }

    fn connect(&self, host: &str, disc: u64) -> Result<()> {
        self.vi
            .connect_request(
                &NetAddress::new(host, Discriminator::from_u64(disc)),
                CONNECT,
            )
            .with_context(|| format!("connecting to {host}"))?;
        Ok(())
    }

    /// The slot of `len` bytes a receive descriptor of [`post_recv`] names.
    fn slot_of(&self, d: &Descriptor, len: usize) -> usize {
        (d.ds[0].addr - self.buf.addr() as u64) as usize / len
    }

    /// Waits for a completed send and checks it.
    fn sent(&self) -> Result<()> {
        let d = self
            .vi
            .send_wait(Some(SILENCE))
            .map_err(|e| anyhow!("waiting for a send: {e}"))?;
        d.result().map_err(|e| anyhow!("a send failed: {e}"))?;
        Ok(())
    }

    /// Waits for a received message; its slot of `len` bytes and length.
    fn received(&self, len: usize) -> Result<(usize, usize)> {
        let d = self
            .vi
            .recv_wait(Some(SILENCE))
            .map_err(|e| anyhow!("waiting {SILENCE:?} for a message: {e}"))?;
        let n = d.result().map_err(|e| anyhow!("a receive failed: {e}"))? as usize;
        Ok((self.slot_of(&d, len), n))
    }
}

/// The `torture-peer` command. Never returns.
pub fn peer(a: &PeerArgs) -> ! {
    crate::pin::pin_or_warn(a.cpu, "peer");
    run::serve_peer(|| -> Result<Counts> {
        match a.role {
            Role::Grid => grid_peer(a),
            Role::Death => death_peer(a).map(|()| Counts::default()),
            Role::Echo => echo_peer(a).map(|()| Counts::default()),
        }
    })
}

fn ready(end: &End) -> Result<()> {
    use std::io::Write;
    println!("READY {}", end.nic.attributes().address);
    std::io::stdout().flush()?;
    Ok(())
}

/// A peer's side: its Nic and VI, `slots` receives of `len` bytes posted
/// at the start of a buffer of `buf` bytes, `READY <address>` printed, the
/// client accepted.
fn peer_end(a: &PeerArgs, buf: usize, slots: usize, len: usize) -> Result<End> {
    let end = open_end(&a.nic, a.level, a.inject.clone(), buf)?;
    for s in 0..slots {
        end.post_recv(s, len)?;
    }
    ready(&end)?;
    end.accept(a.disc)?;
    Ok(end)
}

fn grid_peer(a: &PeerArgs) -> Result<Counts> {
    let slots = 2 * BATCH;
    let end = peer_end(a, (slots + 1) * GRID_MAX, slots, GRID_MAX)?;
    let ack_at = slots * GRID_MAX;
    let mut tally = Tally::new(a.messages);
    let mut since_ack = 0;
    let mut got = 0u64;
    let error = loop {
        if got == a.messages {
            break None;
        }
        let (slot, n) = match end.received(GRID_MAX) {
            Ok(r) => r,
            Err(e) => break Some(format!("{e:#}")),
        };
        got += 1;
        let at = slot * GRID_MAX;
        tally.add(&end.buf.as_slice()[at..at + n]);
        end.post_recv(slot, GRID_MAX)?;
        since_ack += 1;
        if since_ack == BATCH || got == a.messages {
            since_ack = 0;
            end.post_send(ack_at, 8)?;
            if let Err(e) = end.sent() {
                break Some(format!("{e:#}"));
            }
        }
    };
    Ok(tally.finish(error))
}

fn death_peer(a: &PeerArgs) -> Result<()> {
    let end = peer_end(a, 8 * 4096, 4, 4096)?;
    end.received(4096)?;
    end.post_send(0, 8)?;
    // Alive and inside the library (acknowledging, as a live process does)
    // until killed or stopped.
    loop {
        let _ = end.vi.recv_wait(Some(Duration::from_secs(60)));
        if end.vi.state() != ViState::Connected {
            bail!("the connection ended before this peer died");
        }
    }
}

fn echo_peer(a: &PeerArgs) -> Result<()> {
    // The listener stays open after the accept: the flood's requests meet it.
    let end = peer_end(a, 64 * 64, 8, 64)?;
    let out = 63 * 64;
    loop {
        let d = loop {
            if let Some(d) = end.vi.recv_done() {
                break d;
            }
        };
        let n = d.result().map_err(|e| anyhow!("a receive failed: {e}"))? as usize;
        end.post_recv(end.slot_of(&d, 64), 64)?;
        end.post_send(out, n)?;
        loop {
            if let Some(d) = end.vi.send_done() {
                d.result().map_err(|e| anyhow!("a send failed: {e}"))?;
                break;
            }
        }
    }
}

// ------------------------------------------------------------ the client

/// Where a medium's two sides run: the Nics each opens, and the test host
/// of the peer (xdp). The guard keeps this thread on test host a.
struct Place {
    medium: &'static str,
    here: String,
    there: String,
    netns: Option<String>,
    _hosts: Option<(uvia_net::netns::NsGuard, TestHosts)>,
}

impl Place {
    fn new(medium: &'static str) -> Result<Place> {
        let local = |nic: &str| Place {
            medium,
            here: nic.into(),
            there: nic.into(),
            netns: None,
            _hosts: None,
        };
        match medium {
            "shm" => Ok(local("shm")),
            "udp" => Ok(local("udp:127.0.0.1")),
            "xdp" => {
                let hosts = TestHosts::create("torture").context("making the test hosts")?;
                let guard = hosts.enter(Side::A).context("entering test host a")?;
                Ok(Place {
                    medium,
                    here: format!("xdp:{}", hosts.iface(Side::A)),
                    there: format!("xdp:{}", hosts.iface(Side::B)),
                    netns: Some(hosts.name(Side::B).to_string()),
                    _hosts: Some((guard, hosts)),
                })
            }
            _ => bail!("unknown medium {medium}"),
        }
    }

    /// Starts a peer; returns it with the address its Nic has.
    fn peer(
        &self,
        role: Role,
        level: Level,
        disc: u64,
        inject: Option<&str>,
        messages: u64,
    ) -> Result<(run::Server, String)> {
        let role = match role {
            Role::Grid => "grid",
            Role::Death => "death",
            Role::Echo => "echo",
        };
        let mut args: Vec<String> = [
            "torture-peer",
            "--role",
            role,
            "--nic",
            &self.there,
            "--level",
            level.name(),
            "--cpu",
            "1",
        ]
        .map(String::from)
        .into();
        args.extend(["--disc".into(), disc.to_string()]);
        args.extend(["--messages".into(), messages.to_string()]);
        if let Some(i) = inject {
            args.extend(["--inject".into(), i.into()]);
        }
        let server = run::spawn_server(&args, self.netns.as_deref(), |_| {})?;
        let address = run::wait_line(&server.rx, "READY", CONNECT, "READY line")?;
        Ok((server, address))
    }
}

/// A discriminator no earlier cell of this run used.
fn next_disc() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    ((std::process::id() as u64) << 32) | NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One cell of the fault grid.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GridCell {
    pub medium: String,
    pub level: Level,
    pub faults: String,
    pub counts: Counts,
    pub seconds: f64,
    /// Payload delivered per second, MB/s.
    pub goodput_mb_s: f64,
}

/// The faults of a grid cell at `loss`: duplication, reordering and
/// corruption beside it, on both sides' receive paths (acknowledgements
/// are lost too).
fn faults(loss: f64, seed: u64) -> String {
    format!("loss={loss},dup=0.02,reorder=0.02,corrupt=0.005,seed={seed}")
}

fn grid_cell(place: &Place, level: Level, loss: f64, n: u64) -> Result<GridCell> {
    let disc = next_disc();
    let spec = faults(loss, disc & 0xffff);
    let (peer, address) = place.peer(Role::Grid, level, disc, Some(&spec), n)?;
    let mine = faults(loss, (disc & 0xffff) + 7919);
    let acks = BATCH * GRID_MAX / 64;
    let mut end = open_end(&place.here, level, Some(mine), BATCH * GRID_MAX + 4 * 64)?;
    for k in 0..4 {
        end.post_recv(acks + k, 64)?;
    }
    end.connect(&address, disc)?;
    let t0 = Instant::now();
    let mut bytes = 0u64;
    let mut sent = Ok(());
    for first in (0..n).step_by(BATCH) {
        let batch = (n - first).min(BATCH as u64);
        for k in 0..batch {
            let seq = first + k;
            let at = k as usize * GRID_MAX;
            let len = grid_size(seq);
            fill(&mut end.buf.as_mut_slice()[at..at + len], seq);
            end.post_send(at, len)?;
            bytes += len as u64;
        }
        sent = (|| {
            for _ in 0..batch {
                end.sent()?;
            }
            let (slot, _) = end.received(64).context("waiting for the receiver's ack")?;
            end.post_recv(slot, 64)
        })();
        if sent.is_err() {
            break;
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let counts: Counts = match result_line(&peer, &end) {
        Ok(l) => serde_json::from_str(&l).context("reading the receiver's count")?,
        Err(e) => Counts {
            sent: n,
            lost: n,
            error: Some(format!("{e:#}")),
            ..Counts::default()
        },
    };
    let mut counts = counts;
    if let (Err(e), None) = (&sent, &counts.error) {
        counts.error = Some(format!("sender: {e:#}"));
    }
    end.vi.disconnect();
    Ok(GridCell {
        medium: place.medium.into(),
        level,
        faults: faults(loss, 0).replace(",seed=0", ""),
        goodput_mb_s: bytes as f64 / seconds / 1e6,
        counts,
        seconds,
    })
}

/// Waits for the peer's `RESULT` line, driving this side's VI meanwhile:
/// the peer's last sends complete only when this side acknowledges them.
fn result_line(peer: &run::Server, end: &End) -> Result<String> {
    let t0 = Instant::now();
    while t0.elapsed() < SILENCE * 2 {
        end.vi.drive();
        match peer.rx.recv_timeout(Duration::from_millis(1)) {
            Ok(run::Line::Text(l)) => {
                if let Some(r) = l.strip_prefix("RESULT") {
                    return Ok(r.trim().to_string());
                }
                if let Some(m) = l.strip_prefix("ERROR ") {
                    bail!("the receiver failed: {m}");
                }
            }
            Ok(run::Line::Eof) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the receiver exited before its count")
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    bail!("no count from the receiver within {:?}", SILENCE * 2)
}

/// How a peer dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Death {
    Killed,
    Stopped,
}

/// One peer's death, timed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeathCell {
    pub medium: String,
    pub level: Level,
    pub death: Death,
    /// From the signal to the last outstanding descriptor's completion.
    pub seconds: f64,
    pub limit_seconds: f64,
    /// Receives that were outstanding, and how many completed in error.
    pub receives: usize,
    pub receives_failed: usize,
    /// Sends posted after the death, and how many completed in error.
    pub sends: usize,
    pub sends_failed: usize,
    /// The VI's state at the end.
    pub state: String,
}

impl DeathCell {
    fn pass(&self) -> bool {
        self.receives_failed == self.receives
            && self.state == "Error"
            && self.seconds <= self.limit_seconds
    }
}

fn death_cell(place: &Place, level: Level, death: Death) -> Result<DeathCell> {
    let disc = next_disc();
    let (peer, address) = place.peer(Role::Death, level, disc, None, 0)?;
    let end = open_end(&place.here, level, None, 8 * 4096)?;
    const RECEIVES: usize = 4;
    for s in 1..=RECEIVES + 1 {
        end.post_recv(s, 4096)?;
    }
    end.connect(&address, disc)?;
    end.post_send(0, 8)?;
    end.sent()?;
    end.received(4096).context("the peer's answer")?;
    let pid = peer.pid as i32;
    let signal = match death {
        Death::Killed => libc::SIGKILL,
        Death::Stopped => libc::SIGSTOP,
    };
    // SAFETY: signals the child process this run started.
    if unsafe { libc::kill(pid, signal) } != 0 {
        bail!("signalling the peer: {}", std::io::Error::last_os_error());
    }
    wait_dead(pid, death);
    let t0 = Instant::now();
    let give_up = Duration::from_secs(10);
    let (mut receives_failed, mut sends, mut sends_done, mut sends_failed) = (0, 0, 0, 0);
    let mut done_at = None;
    while t0.elapsed() < give_up {
        // The application keeps posting and polling, never waiting on an
        // empty queue.
        if end.vi.state() == ViState::Connected
            && sends - sends_done < 8
            && end.post_send(0, 1000).is_ok()
        {
            sends += 1;
        }
        while let Some(d) = end.vi.send_done() {
            sends_done += 1;
            sends_failed += d.error().is_some() as usize;
        }
        if let Some(d) = end.vi.recv_done() {
            receives_failed += d.error().is_some() as usize;
            if d.error().is_none() {
                bail!("a receive from a dead peer completed without an error");
            }
        }
        if receives_failed == RECEIVES && sends_done == sends {
            done_at = Some(t0.elapsed());
            break;
        }
    }
    // SAFETY: as above; a stopped process dies of SIGKILL too.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let limit = if place.medium == "shm" {
        SHM_DEATH_LIMIT
    } else {
        uvia::DEFAULT_IDLE_TIMEOUT
    };
    Ok(DeathCell {
        medium: place.medium.into(),
        level,
        death,
        seconds: done_at.unwrap_or(give_up).as_secs_f64(),
        limit_seconds: limit.as_secs_f64(),
        receives: RECEIVES,
        receives_failed,
        sends,
        sends_failed,
        state: format!("{:?}", end.vi.state()),
    })
}

/// How long shm may take to fail a dead or stopped peer's descriptors.
const SHM_DEATH_LIMIT: Duration = Duration::from_secs(1);

/// Waits until the signal has taken effect: the process is a zombie or
/// gone (killed), or in the stopped state.
fn wait_dead(pid: i32, death: Death) {
    let stat = format!("/proc/{pid}/stat");
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        let state = std::fs::read_to_string(&stat)
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.chars().next()))
            .flatten();
        match (death, state) {
            (Death::Killed, None | Some('Z' | 'X')) | (Death::Stopped, Some('T')) => return,
            _ => std::thread::sleep(Duration::from_micros(200)),
        }
    }
}

/// This process's cores before it pinned itself.
static UNPINNED: std::sync::OnceLock<libc::cpu_set_t> = std::sync::OnceLock::new();

/// The flood's offered rate of connection requests per second.
pub const FLOOD_RATE: f64 = 200_000.0;

/// The good client's echo rate alone and under the flood.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Flood {
    /// Round trips per second, one per round of runs: alone, beside the
    /// flood sent to a socket nobody reads (the flooder's own cost on
    /// this host), and with the flood on the server's listener.
    pub alone_per_s: Vec<f64>,
    pub unread_per_s: Vec<f64>,
    pub flooded_per_s: Vec<f64>,
    /// Median over the rounds of flooded / alone.
    pub ratio: f64,
    /// Median over the rounds of unread / alone.
    pub unread_ratio: f64,
    /// Requests sent per second during the flooded runs (median).
    pub offered_per_s: f64,
    /// The server's resident memory before the flood and its largest
    /// during it (kB), largest over the runs.
    pub server_rss_kb_before: u64,
    pub server_rss_kb_max: u64,
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// What a flooder did.
struct Flooded {
    sent: u64,
    seconds: f64,
    rss_max: u64,
}

/// Sends valid connection requests for `disc`, each from a new client id,
/// to `target` at [`FLOOD_RATE`] until `stop`; samples `pid`'s memory.
fn flooder(
    target: std::net::SocketAddr,
    disc: u64,
    pid: u32,
    stop: &AtomicBool,
) -> Result<Flooded> {
    use uvia_proto::wire::{ConnAttrs, Repr};
    let sock = UdpSocket::bind("127.0.0.1:0").context("the flooder's socket")?;
    sock.set_nonblocking(true)?;
    let d = Discriminator::from_u64(disc);
    let request = Repr::ConnRequest {
        attrs: ConnAttrs {
            reliability: 1,
            rdma_write: false,
            rdma_read: false,
            max_frame: 1472,
            max_transfer: 1 << 20,
            initial_psn: 1,
            intact: true,
            job: 0,
            nic: 0,
        },
        discriminator: d.as_bytes(),
        private: &[],
    };
    sock.connect(target).context("the flooder's socket")?;
    // Requests go out in batches, one system call each: the flood is the
    // load under test, and a flooder that spends its core on system calls
    // measures the flooder.
    const BURST: usize = 64;
    let len = request.buffer_len();
    let mut frames = vec![0u8; BURST * len];
    // With UDP segmentation a burst is one datagram the kernel cuts into
    // requests: the cheapest flood this host can make, so that the
    // flooder's own cost weighs least on the two cores it shares.
    let gso = {
        use std::os::fd::AsRawFd;
        crate::sock::set_int_opt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            len as i32,
        )
        .is_ok()
    };
    let t0 = Instant::now();
    let (mut sent, mut rss_max, mut id) = (0u64, 0u64, 0x4000_0000u32);
    let mut next_sample = t0;
    while !stop.load(Ordering::Relaxed) {
        let due = (t0.elapsed().as_secs_f64() * FLOOD_RATE) as u64;
        while sent < due {
            let n = ((due - sent) as usize).min(BURST);
            for f in frames.chunks_mut(len).take(n) {
                id = id.wrapping_add(1);
                request.emit(f, 0, id);
            }
            if gso {
                // One datagram the kernel cuts into `n` requests.
                let _ = sock.send(&frames[..n * len]);
            } else {
                send_burst(&sock, &mut frames, len, n);
            }
            sent += n as u64;
        }
        if Instant::now() >= next_sample {
            rss_max = rss_max.max(rss_kb(pid));
            next_sample += Duration::from_millis(10);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(Flooded {
        sent,
        seconds: t0.elapsed().as_secs_f64(),
        rss_max,
    })
}

/// Sends the first `n` frames of `len` bytes in `frames` on the connected
/// `sock` with one `sendmmsg` (std has no batched send). A full socket
/// buffer drops what did not fit, as a network would.
fn send_burst(sock: &UdpSocket, frames: &mut [u8], len: usize, n: usize) {
    use std::os::fd::AsRawFd;
    let mut iov: Vec<libc::iovec> = frames
        .chunks_mut(len)
        .take(n)
        .map(|f| libc::iovec {
            iov_base: f.as_mut_ptr().cast(),
            iov_len: f.len(),
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iov
        .iter_mut()
        .map(|v| {
            // SAFETY: an all-zero msghdr is valid (no name, no control).
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_iov = v;
            h.msg_hdr.msg_iovlen = 1;
            h
        })
        .collect();
    // SAFETY: `msgs` holds `n` headers whose buffers live until the call
    // returns; the socket is connected, so no address is needed.
    unsafe {
        libc::sendmmsg(
            sock.as_raw_fd(),
            msgs.as_mut_ptr(),
            msgs.len() as u32,
            libc::MSG_DONTWAIT,
        );
    }
}

/// What a good client's run shares the host with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Load {
    Alone,
    /// The flood sent to a socket nobody reads: what the flooder itself
    /// costs the two cores it shares with the client and the server.
    Unread,
    /// The flood sent to the server's listener.
    Listener,
}

/// One good client's echo rate over `measure` under `load`; what the
/// flooder did, and the server's memory before the flood.
fn echo_run(load: Load, measure: Duration) -> Result<(f64, Option<Flooded>, u64)> {
    let place = Place::new("udp")?;
    let disc = next_disc();
    let (peer, address) = place.peer(Role::Echo, Level::Delivery, disc, None, 0)?;
    let end = open_end(&place.here, Level::Delivery, None, 64 * 64)?;
    for s in 1..9 {
        end.post_recv(s, 64)?;
    }
    end.connect(&address, disc)?;
    let round_trip = || -> Result<()> {
        end.post_send(0, 8)?;
        let d = loop {
            if let Some(d) = end.vi.recv_done() {
                break d;
            }
        };
        d.result().map_err(|e| anyhow!("an echo failed: {e}"))?;
        end.post_recv(end.slot_of(&d, 64), 64)?;
        while let Some(s) = end.vi.send_done() {
            s.result().map_err(|e| anyhow!("a send failed: {e}"))?;
        }
        Ok(())
    };
    for _ in 0..20_000 {
        round_trip()?;
    }
    let before = rss_kb(peer.pid);
    let unread = UdpSocket::bind("127.0.0.1:0").context("the unread socket")?;
    let target: std::net::SocketAddr = match load {
        Load::Listener => address
            .parse()
            .with_context(|| format!("the server's address {address:?}"))?,
        _ => unread.local_addr()?,
    };
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let f = (load != Load::Alone).then(|| s.spawn(|| flooder(target, disc, peer.pid, &stop)));
        let t0 = Instant::now();
        let mut n = 0u64;
        let r = loop {
            if let Err(e) = round_trip() {
                break Err(e);
            }
            n += 1;
            if n.is_multiple_of(256) && t0.elapsed() >= measure {
                break Ok(n as f64 / t0.elapsed().as_secs_f64());
            }
        };
        stop.store(true, Ordering::Relaxed);
        let flooded = match f {
            Some(h) => Some(h.join().map_err(|_| anyhow!("the flooder panicked"))??),
            None => None,
        };
        Ok((r?, flooded, before))
    })
}

fn flood(pairs: usize, measure: Duration, pb: &indicatif::ProgressBar) -> Result<Flood> {
    const LOADS: [Load; 3] = [Load::Alone, Load::Unread, Load::Listener];
    let mut rates: [Vec<f64>; 3] = Default::default();
    let (mut offered, mut ratios, mut controls) = (vec![], vec![], vec![]);
    let (mut before, mut max) = (0, 0);
    for p in 0..pairs {
        // Each round in another order, so that no load always meets a
        // fresh machine.
        let mut round = [0.0; 3];
        for k in 0..LOADS.len() {
            let i = (k + p) % LOADS.len();
            pb.set_message(format!("flood round {}: {:?}", p + 1, LOADS[i]));
            let (rate, f, b) = echo_run(LOADS[i], measure)?;
            round[i] = rate;
            if let (Load::Listener, Some(f)) = (LOADS[i], f) {
                offered.push(f.sent as f64 / f.seconds);
                before = before.max(b);
                max = max.max(f.rss_max);
            }
            pb.inc(1);
        }
        for (v, r) in rates.iter_mut().zip(round) {
            v.push(r);
        }
        ratios.push(round[2] / round[0]);
        controls.push(round[1] / round[0]);
    }
    let [alone, unread, flooded] = rates;
    Ok(Flood {
        ratio: crate::stats::median(&ratios),
        unread_ratio: crate::stats::median(&controls),
        offered_per_s: crate::stats::median(&offered),
        alone_per_s: alone,
        unread_per_s: unread,
        flooded_per_s: flooded,
        server_rss_kb_before: before,
        server_rss_kb_max: max,
    })
}

// ------------------------------------------------------------ the run

/// Everything one `uvia torture` found.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Torture {
    pub messages_per_cell: u64,
    pub grid: Vec<GridCell>,
    pub deaths: Vec<DeathCell>,
    pub flood: Option<Flood>,
    /// Media left out, and why.
    pub skipped: Vec<String>,
    /// What the run left on the system: socket files, test hosts, child
    /// processes that were not there before it (must be none).
    pub left_behind: Vec<String>,
    /// Socket files of killed listeners, found after the run and removed
    /// by the next shm listener.
    pub stale_sockets_removed: usize,
    /// What fell short of its limit, one line each.
    pub failures: Vec<String>,
}

/// The grid's loss rates.
const LOSSES: [f64; 3] = [0.01, 0.05, 0.20];
const RELIABLE: [Level; 2] = [Level::Delivery, Level::Reception];
const LEVELS: [Level; 3] = [Level::Unreliable, Level::Delivery, Level::Reception];

pub fn run(parts: &[Part], messages: u64, pairs: usize, measure: Duration) -> Result<Torture> {
    if messages == 0 {
        bail!("--messages must be at least 1");
    }
    if pairs == 0 {
        bail!("--pairs must be at least 1");
    }
    if let Some(set) = crate::pin::current() {
        let _ = UNPINNED.set(set);
    }
    crate::pin::pin_or_warn(Some(0), "client");
    let before = System::now();
    let mut t = Torture {
        messages_per_cell: messages,
        ..Torture::default()
    };
    let mut networks = vec!["udp"];
    match TestHosts::available() {
        Ok(()) => networks.push("xdp"),
        Err(why) => t.skipped.push(format!("xdp: {why}")),
    }
    let has = |p| parts.contains(&p);
    let mut total = 0;
    if has(Part::Grid) {
        total += networks.len() * RELIABLE.len() * LOSSES.len();
    }
    if has(Part::Deaths) {
        total += (networks.len() + 1) * LEVELS.len() * 2;
    }
    if has(Part::Flood) {
        total += 3 * pairs;
    }
    let pb = crate::progress(total);
    if has(Part::Grid) {
        for &medium in &networks {
            let place = Place::new(medium)?;
            for level in RELIABLE {
                for loss in LOSSES {
                    pb.set_message(format!(
                        "grid: {medium} {} at {}% loss",
                        level.name(),
                        loss * 100.0
                    ));
                    let c = grid_cell(&place, level, loss, messages)
                        .with_context(|| format!("grid cell {medium} {} {loss}", level.name()))?;
                    if !c.counts.clean() {
                        t.failures.push(format!(
                            "grid {medium} {} {}: lost {}, duplicated {}, reordered {}, corrupted {}{}",
                            level.name(),
                            c.faults,
                            c.counts.lost,
                            c.counts.duplicated,
                            c.counts.reordered,
                            c.counts.corrupted,
                            c.counts.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default()
                        ));
                    }
                    t.grid.push(c);
                    pb.inc(1);
                }
            }
        }
    }
    if has(Part::Deaths) {
        for medium in std::iter::once("shm").chain(networks.iter().copied()) {
            let place = Place::new(medium)?;
            for level in LEVELS {
                for death in [Death::Killed, Death::Stopped] {
                    pb.set_message(format!("deaths: {medium} {} {death:?}", level.name()));
                    let c = death_cell(&place, level, death).with_context(|| {
                        format!("death cell {medium} {} {death:?}", level.name())
                    })?;
                    if !c.pass() {
                        t.failures.push(format!(
                            "death {medium} {} {:?}: {}/{} receives failed in {:.3} s (limit {} s), VI {}",
                            level.name(),
                            death,
                            c.receives_failed,
                            c.receives,
                            c.seconds,
                            c.limit_seconds,
                            c.state
                        ));
                    }
                    t.deaths.push(c);
                    pb.inc(1);
                }
            }
        }
    }
    if has(Part::Flood) {
        let f = flood(pairs, measure, &pb)?;
        if f.ratio < 0.5 {
            t.failures.push(format!(
                "flood: the good client kept {:.2} of its echo rate (at least 0.5)",
                f.ratio
            ));
        }
        t.flood = Some(f);
    }
    pb.finish_and_clear();
    // A killed listener cannot remove its socket file: the next shm
    // listener of the host does (its first listen removes the files whose
    // connect is refused). Be that listener, then look.
    let stale = System::now()
        .since(&before)
        .iter()
        .filter(|x| x.starts_with("socket"))
        .count();
    if stale > 0 {
        let nic = Nic::open("shm").context("opening shm to listen once")?;
        let _ = nic.connect_wait(&Discriminator::from_u64(next_disc()), Some(Duration::ZERO));
    }
    t.stale_sockets_removed = stale;
    // Peers just killed are reaped, their sockets closed, by now; give the
    // kernel's teardown of the test hosts a moment.
    let t0 = Instant::now();
    loop {
        t.left_behind = System::now().since(&before);
        if t.left_behind.is_empty() || t0.elapsed() > Duration::from_secs(3) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if !t.left_behind.is_empty() {
        t.failures
            .push(format!("left behind: {}", t.left_behind.join(", ")));
    }
    Ok(t)
}

/// What a run can leave behind: files in shm's socket folder, network
/// namespaces, child processes of this one.
struct System {
    sockets: std::collections::BTreeSet<String>,
    namespaces: std::collections::BTreeSet<String>,
    children: std::collections::BTreeSet<String>,
}

impl System {
    fn now() -> System {
        let names = |dir: &std::path::Path| -> std::collections::BTreeSet<String> {
            std::fs::read_dir(dir)
                .map(|d| {
                    d.filter_map(|e| e.ok())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default()
        };
        let me = std::process::id().to_string();
        let children = std::fs::read_dir("/proc")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter_map(|e| {
                        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
                        // "pid (comm) state ppid ...": the parent after the name.
                        let (head, rest) = stat.rsplit_once(") ")?;
                        let ppid = rest.split(' ').nth(1)?;
                        (ppid == me).then(|| format!("process {}", head.replacen(" (", " ", 1)))
                    })
                    .collect()
            })
            .unwrap_or_default();
        System {
            sockets: uvia::shm_socket_dir()
                .map(|d| names(&d))
                .unwrap_or_default(),
            namespaces: names(std::path::Path::new("/run/netns"))
                .into_iter()
                .filter(|n| n.starts_with("uvia-torture"))
                .collect(),
            children,
        }
    }

    /// What is here now and was not in `before`.
    fn since(&self, before: &System) -> Vec<String> {
        let new = |now: &std::collections::BTreeSet<String>,
                   then: &std::collections::BTreeSet<String>,
                   what: &str| {
            now.difference(then)
                .map(|x| format!("{what} {x}"))
                .collect::<Vec<_>>()
        };
        let mut v = new(&self.sockets, &before.sockets, "socket file");
        v.extend(new(
            &self.namespaces,
            &before.namespaces,
            "network namespace",
        ));
        v.extend(new(&self.children, &before.children, ""));
        v.iter().map(|x| x.trim().to_string()).collect()
    }
}

/// The report as text tables.
pub fn table(t: &Torture) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    if !t.grid.is_empty() {
        let _ = writeln!(
            s,
            "fault grid: {} numbered, patterned messages per cell ({} B to {} B), faults on both receive paths",
            t.messages_per_cell,
            GRID_SIZES[0],
            GRID_MAX
        );
        let _ = writeln!(
            s,
            "{:<6} {:<10} {:<48} {:>9} {:>6} {:>6} {:>6} {:>6} {:>8} {:>9}",
            "medium",
            "level",
            "faults",
            "received",
            "lost",
            "dup",
            "reord",
            "corr",
            "seconds",
            "MB/s"
        );
        for c in &t.grid {
            let _ = writeln!(
                s,
                "{:<6} {:<10} {:<48} {:>9} {:>6} {:>6} {:>6} {:>6} {:>8.2} {:>9.1}{}",
                c.medium,
                c.level.name(),
                c.faults,
                c.counts.received,
                c.counts.lost,
                c.counts.duplicated,
                c.counts.reordered,
                c.counts.corrupted,
                c.seconds,
                c.goodput_mb_s,
                c.counts
                    .error
                    .as_deref()
                    .map(|e| format!("  error: {e}"))
                    .unwrap_or_default()
            );
        }
        s.push('\n');
    }
    if !t.deaths.is_empty() {
        let _ = writeln!(
            s,
            "peer deaths: time from the signal until every outstanding descriptor completed"
        );
        let _ = writeln!(
            s,
            "{:<6} {:<10} {:<8} {:>9} {:>8} {:>9} {:>12} {:<6}",
            "medium", "level", "death", "seconds", "limit", "receives", "sends", "VI"
        );
        for c in &t.deaths {
            let _ = writeln!(
                s,
                "{:<6} {:<10} {:<8} {:>9.3} {:>8.1} {:>9} {:>12} {:<6}{}",
                c.medium,
                c.level.name(),
                format!("{:?}", c.death).to_lowercase(),
                c.seconds,
                c.limit_seconds,
                format!("{}/{} err", c.receives_failed, c.receives),
                format!("{}/{} err", c.sends_failed, c.sends),
                c.state,
                if c.pass() { "" } else { "  OVER" }
            );
        }
        s.push('\n');
    }
    if let Some(f) = &t.flood {
        let list = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{:.0}", x))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            s,
            "flood: {:.0} connection requests/s offered to the listener of a good client's server",
            f.offered_per_s
        );
        for (what, v) in [
            ("alone", &f.alone_per_s),
            ("beside a flood to an unread socket", &f.unread_per_s),
            ("with the flood on its listener", &f.flooded_per_s),
        ] {
            let _ = writeln!(s, "  echo rate {what:<36} (round trips/s): {}", list(v));
        }
        let _ = writeln!(
            s,
            "  flooded / alone, median of rounds: {:.2} (at least 0.5); the flooder's own cost alone leaves {:.2}",
            f.ratio, f.unread_ratio
        );
        let _ = writeln!(
            s,
            "  server memory: {} kB before the flood, {} kB at most under it",
            f.server_rss_kb_before, f.server_rss_kb_max
        );
        s.push('\n');
    }
    for k in &t.skipped {
        let _ = writeln!(s, "skipped: {k}");
    }
    if t.left_behind.is_empty() {
        let _ = writeln!(
            s,
            "left behind: nothing (shm's socket files, test hosts, child processes); {} socket files of killed peers removed by the next shm listener",
            t.stale_sockets_removed
        );
    }
    if t.failures.is_empty() {
        let _ = writeln!(s, "torture: all within limits");
    } else {
        for f in &t.failures {
            let _ = writeln!(s, "FAILED: {f}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(seq: u64) -> Vec<u8> {
        let mut m = vec![0; grid_size(seq)];
        fill(&mut m, seq);
        m
    }

    #[test]
    fn the_tally_names_each_fault() {
        let mut t = Tally::new(6);
        t.add(&message(0));
        t.add(&message(2));
        t.add(&message(1)); // after 2: reordered
        t.add(&message(2)); // again: duplicated
        let mut flipped = message(3);
        flipped[20] ^= 4;
        t.add(&flipped); // a bit flipped: corrupted
        t.add(&message(4)[..10]); // cut short: corrupted
        t.add(&message(9)); // a number never sent: corrupted
        let c = t.finish(None);
        assert_eq!(c.received, 3);
        assert_eq!(c.reordered, 1);
        assert_eq!(c.duplicated, 1);
        assert_eq!(c.corrupted, 3);
        assert_eq!(c.lost, 3, "3, 4 and 5 never arrived intact");
        assert!(!c.clean());
    }

    #[test]
    fn every_message_in_order_is_clean() {
        let mut t = Tally::new(100);
        for seq in 0..100 {
            t.add(&message(seq));
        }
        let c = t.finish(None);
        assert_eq!(c.received, 100);
        assert!(c.clean(), "{c:?}");
        // The same count with an error from the receiver is not clean.
        let mut t = Tally::new(1);
        t.add(&message(0));
        assert!(!t.finish(Some("broke".into())).clean());
    }

    #[test]
    fn a_byte_from_another_message_is_seen() {
        // Messages 6 and 13 have the same size; their bodies differ.
        assert_eq!(grid_size(6), grid_size(13));
        let (a, b) = (message(6), message(13));
        let mut mixed = a.clone();
        mixed[100..].copy_from_slice(&b[100..]);
        assert_eq!(check(&a), Some(6));
        assert_eq!(check(&mixed), None);
    }
}
