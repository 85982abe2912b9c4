//! `uvia scale`: what many connected VIs cost.
//!
//! For each count N the client (this process, core 0) connects N VIs to a
//! server process (core 1) whose VIs all report their receives to one
//! completion queue, as a server of many clients does. Then, with the other
//! N - 1 pairs connected and idle:
//!
//! - connection set-up: the time to connect all N, one after another;
//! - one pair's ping-pong of 8 B messages (p50, p99, mean of the one-way
//!   time, half a round trip), the server taking each message off its CQ;
//! - a message rate spread over all N: one message on every VI, then the N
//!   replies, in rounds;
//! - an idle blocked wait: the server sleeps in its CQ wait with nothing
//!   arriving, and reports the CPU its whole process used meanwhile. Before
//!   it, one message on every VI and its reply, paced over half a second
//!   (a keep-alive interval): the VIs' timers are then spread over time, as
//!   a server's are whose clients came at different moments, not due all
//!   together as the rounds above leave them;
//! - memory and file descriptors per VI: the server's resident size and
//!   open descriptors after the N connections, less before, over N.
//!
//! The client's VIs have no CQ: it polls the VI it expects a reply on, so
//! only the server's side grows with N.

use crate::cpu::process_cpu_seconds;
use crate::pin;
use crate::report::{fmt_ns, text_table};
use crate::run::{spawn_server, wait_line};
use crate::stats::Stats;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use uvia::{
    Cq, Descriptor, Discriminator, MemAttributes, MemoryRegion, NetAddress, Nic, Vi, ViAttributes,
};

/// The providers a scale run can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScaleProvider {
    Shm,
    Udp,
}

impl ScaleProvider {
    fn name(self) -> &'static str {
        match self {
            ScaleProvider::Shm => "shm",
            ScaleProvider::Udp => "udp",
        }
    }

    fn nic(self) -> &'static str {
        match self {
            ScaleProvider::Shm => "shm",
            ScaleProvider::Udp => "udp:127.0.0.1",
        }
    }
}

/// The most VIs a run may ask for: each costs the server and the client a
/// few descriptors (shm) or a socket (udp), and the default open-file limit
/// is 1,024.
pub const MAX_VIS: usize = 4000;

/// The time over which one message on every VI is paced before the idle
/// wait: a keep-alive interval of the network providers' default idle
/// timeout.
const SPREAD: Duration = Duration::from_millis(500);

/// Bytes of a message and of each receive buffer.
const MSG: usize = 8;
/// Receive slots each VI keeps posted (one message in flight per VI, and
/// the next).
const RECV_PER_VI: usize = 2;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest a reply may take before the run is called failed.
const REPLY_TIMEOUT: Duration = Duration::from_secs(20);

/// What a message asks of the server, carried as its immediate data.
mod op {
    /// Echo it.
    pub const ECHO: u32 = 1;
    /// Sleep in the CQ wait until the next message; no reply.
    pub const IDLE: u32 = 2;
    /// End of the idle time: reply with the CPU microseconds used since
    /// [`IDLE`] in the reply's immediate data.
    pub const WAKE: u32 = 3;
    /// Exit.
    pub const QUIT: u32 = 4;
}

/// The figures of one VI count.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScaleResult {
    pub provider: String,
    pub vis: usize,
    /// Wall time to connect all N pairs, seconds.
    pub connect_s: f64,
    /// One pair's one-way time, ns.
    pub one_pair: Stats,
    /// Messages per second each way, spread over all N VIs.
    pub rate_msgs_per_s: f64,
    /// The server's CPU use (CPU seconds per wall second) while its CQ
    /// wait slept with nothing arriving.
    pub idle_cpu: f64,
    /// Server resident bytes per VI (after connecting, less before, over N).
    pub server_bytes_per_vi: f64,
    /// Server file descriptors per VI.
    pub server_fds_per_vi: f64,
}

/// What the server reports once its N VIs are connected.
#[derive(Serialize, Deserialize)]
struct Footprint {
    rss_before: u64,
    rss_after: u64,
    fds_before: usize,
    fds_after: usize,
}

/// The run's settings.
pub struct ScaleOpts {
    pub provider: ScaleProvider,
    pub counts: Vec<usize>,
    pub iters: usize,
    pub rate_rounds: usize,
    pub idle: Duration,
    pub client_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
}

pub fn check_counts(counts: &[usize]) -> Result<()> {
    if counts.is_empty() {
        bail!("--vis wants at least one count");
    }
    for &n in counts {
        if n == 0 || n > MAX_VIS {
            bail!("--vis {n}: each count must be 1 to {MAX_VIS}");
        }
    }
    Ok(())
}

/// Runs every count in turn and prints a table.
pub fn run(o: &ScaleOpts) -> Result<ScaleRun> {
    check_counts(&o.counts)?;
    raise_fd_limit(o.counts.iter().copied().max().unwrap_or(1));
    let mut out = Vec::new();
    let mut failed = Vec::new();
    for &n in &o.counts {
        eprintln!("scale: {} with {n} VI pair(s)", o.provider.name());
        match one_count(o, n) {
            Ok(r) => {
                eprint!("{}", table(std::slice::from_ref(&r)));
                out.push(r);
            }
            Err(e) => {
                eprintln!("scale: {} with {n} VIs failed: {e:#}", o.provider.name());
                failed.push(format!("{} with {n} VIs: {e:#}", o.provider.name()));
            }
        }
    }
    out!("{}", table(&out));
    for f in &failed {
        outln!("failed: {f}");
    }
    Ok(ScaleRun {
        results: out,
        failed,
    })
}

/// Every count's figures, and the counts that failed with their reasons.
#[derive(Serialize, Deserialize)]
pub struct ScaleRun {
    pub results: Vec<ScaleResult>,
    pub failed: Vec<String>,
}

pub fn table(rs: &[ScaleResult]) -> String {
    let rows: Vec<Vec<String>> = rs
        .iter()
        .map(|r| {
            vec![
                r.provider.clone(),
                r.vis.to_string(),
                format!("{:.1} ms", r.connect_s * 1e3),
                format!("{:.1} us", r.connect_s * 1e6 / r.vis as f64),
                fmt_ns(r.one_pair.p50),
                fmt_ns(r.one_pair.p99),
                fmt_ns(r.one_pair.mean),
                format!("{:.0}k", r.rate_msgs_per_s / 1e3),
                format!("{:.1}%", r.idle_cpu * 100.0),
                format!("{:.1} KiB", r.server_bytes_per_vi / 1024.0),
                format!("{:.2}", r.server_fds_per_vi),
            ]
        })
        .collect();
    text_table(
        &[
            "provider",
            "VIs",
            "connect all",
            "per VI",
            "one pair p50",
            "p99",
            "mean",
            "msgs/s (all)",
            "idle wait CPU",
            "memory/VI",
            "fds/VI",
        ],
        &rows,
    )
}

/// One side's VIs: a receive CQ, a slot region, and the descriptors.
struct Side {
    nic: Nic,
    /// The receive CQ of every VI (the server), or none (the client).
    cq: Option<Cq>,
    vis: Vec<Vi>,
    recv: MemoryRegion,
    send: MemoryRegion,
    /// Spare send descriptors; each VI has at most a few sends outstanding.
    #[allow(clippy::vec_box)]
    spare: Vec<Box<Descriptor>>,
}

impl Side {
    fn new(p: ScaleProvider, n: usize, with_cq: bool) -> Result<Side> {
        let nic = Nic::open(p.nic()).with_context(|| format!("opening the Nic {:?}", p.nic()))?;
        let ptag = nic.create_ptag()?;
        let max = nic.attributes().max_cq_entries;
        let cq = if with_cq {
            Some(
                nic.create_cq((n * RECV_PER_VI + 16).min(max))
                    .map_err(|e| anyhow!("creating a CQ for {n} VIs: {e}"))?,
            )
        } else {
            None
        };
        let mut recv = nic.alloc_region(n * RECV_PER_VI * MSG, MemAttributes::new(ptag))?;
        let mut send = nic.alloc_region(MSG, MemAttributes::new(ptag))?;
        recv.as_mut_slice().fill(0);
        send.as_mut_slice().fill(0x3c);
        let mut vis = Vec::with_capacity(n);
        for _ in 0..n {
            let attrs = ViAttributes::new(ptag).queue_depths(8, RECV_PER_VI as u32 * 2);
            vis.push(
                nic.create_vi(attrs, None, cq.as_ref())
                    .map_err(|e| anyhow!("creating VI {} of {n}: {e}", vis.len() + 1))?,
            );
        }
        let s = Side {
            nic,
            cq,
            vis,
            recv,
            send,
            spare: Vec::new(),
        };
        for i in 0..n {
            for k in 0..RECV_PER_VI {
                s.post_recv(i, i * RECV_PER_VI + k)?;
            }
        }
        Ok(s)
    }

    fn post_recv(&self, vi: usize, slot: usize) -> Result<()> {
        let d = Descriptor::recv(&[self.recv.segment(slot * MSG, MSG)]);
        self.vis[vi]
            .post_recv(Box::new(d))
            .map_err(|e| anyhow!("posting a receive on VI {vi}: {e}"))
    }

    /// The slot a receive descriptor points at.
    fn slot_of(&self, d: &Descriptor) -> Result<usize> {
        let off = (d.ds[0].addr as usize).wrapping_sub(self.recv.addr() as usize);
        if off >= self.recv.len() {
            bail!("a receive completed into memory outside the slots");
        }
        Ok(off / MSG)
    }

    fn send(&mut self, vi: usize, imm: u32) -> Result<()> {
        // Take back this VI's finished sends first, so descriptors are reused.
        while let Some(d) = self.vis[vi].send_done() {
            d.result()
                .map_err(|e| anyhow!("a send on VI {vi} failed: {e}"))?;
            self.spare.push(d);
        }
        let mut d = self.spare.pop().unwrap_or_default();
        *d = Descriptor::send(&[self.send.segment(0, MSG)]).with_immediate(imm);
        self.vis[vi]
            .post_send(d)
            .map_err(|e| anyhow!("posting a send on VI {vi}: {e}"))
    }

    /// The next receive from the CQ: (VI index, immediate data), its slot
    /// posted again. Polls, or sleeps in the CQ's wait when `block`.
    fn next(&self, block: bool, index: &dyn Fn(&Vi) -> Option<usize>) -> Result<(usize, u32)> {
        let cq = self
            .cq
            .as_ref()
            .ok_or_else(|| anyhow!("this side has no CQ"))?;
        let deadline = Instant::now() + REPLY_TIMEOUT;
        let mut spins = 0u32;
        let c = loop {
            if block {
                break cq
                    .wait(Some(REPLY_TIMEOUT))
                    .map_err(|e| anyhow!("CQ wait: {e}"))?;
            }
            if let Some(c) = cq.done().map_err(|e| anyhow!("CQ: {e}"))? {
                break c;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096) && Instant::now() > deadline {
                bail!("no message within {REPLY_TIMEOUT:?}");
            }
        };
        let i = index(&c.vi).ok_or_else(|| anyhow!("a completion of an unknown VI"))?;
        self.finish(i, c.vi.recv_done())
    }

    /// The next receive on VI `i`, polled: its immediate data.
    fn take(&self, i: usize) -> Result<u32> {
        let deadline = Instant::now() + REPLY_TIMEOUT;
        let mut spins = 0u32;
        loop {
            if let Some(d) = self.vis[i].recv_done() {
                return Ok(self.finish(i, Some(d))?.1);
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096) && Instant::now() > deadline {
                bail!("no reply on VI {i} within {REPLY_TIMEOUT:?}");
            }
        }
    }

    fn finish(&self, i: usize, d: Option<Box<Descriptor>>) -> Result<(usize, u32)> {
        let d = d.ok_or_else(|| anyhow!("the CQ named VI {i}, whose receive queue is empty"))?;
        d.result()
            .map_err(|e| anyhow!("a receive on VI {i} failed: {e}"))?;
        let imm = d.immediate().unwrap_or(0);
        let slot = self.slot_of(&d)?;
        self.post_recv(i, slot)?;
        Ok((i, imm))
    }
}

/// VI ids to indexes: ids are small and dense on a Nic.
fn index_of(vis: &[Vi]) -> impl Fn(&Vi) -> Option<usize> {
    let mut by_id = std::collections::HashMap::with_capacity(vis.len());
    for (i, v) in vis.iter().enumerate() {
        by_id.insert(v.id(), i);
    }
    move |v: &Vi| by_id.get(&v.id()).copied()
}

/// The hidden `scale-peer` command: the server of one count. Never returns.
pub fn serve(p: ScaleProvider, n: usize, cpu: Option<usize>) -> ! {
    pin::pin_or_warn(cpu, "server");
    crate::run::serve_peer(|| serve_inner(p, n))
}

fn serve_inner(p: ScaleProvider, n: usize) -> Result<()> {
    check_counts(&[n])?;
    raise_fd_limit(n);
    let rss_before = resident_bytes()?;
    let fds_before = open_fds()?;
    let mut s = Side::new(p, n, true)?;
    let disc = Discriminator::from_u64(0x5ca1e000 ^ std::process::id() as u64);
    outln!(
        "READY {}/{:x}",
        s.nic.attributes().address,
        0x5ca1e000 ^ std::process::id() as u64
    );
    use std::io::Write;
    std::io::stdout().flush()?;
    for i in 0..n {
        let mut req = s
            .nic
            .connect_wait(&disc, Some(CONNECT_TIMEOUT))
            .with_context(|| format!("waiting for connection {} of {n}", i + 1))?;
        req.accept(&s.vis[i])
            .with_context(|| format!("accepting connection {} of {n}", i + 1))?;
    }
    s.nic.stop_listening(&disc);
    let fp = Footprint {
        rss_before,
        rss_after: resident_bytes()?,
        fds_before,
        fds_after: open_fds()?,
    };
    outln!("FOOTPRINT {}", serde_json::to_string(&fp)?);
    std::io::stdout().flush()?;
    let index = index_of(&s.vis);
    let mut idle_from: Option<f64> = None;
    loop {
        let (i, imm) = s.next(idle_from.is_some(), &index)?;
        match imm {
            op::ECHO => s.send(i, op::ECHO)?,
            op::IDLE => idle_from = Some(process_cpu_seconds()),
            op::WAKE => {
                let used = idle_from.take().map_or(0.0, |t| process_cpu_seconds() - t);
                s.send(i, (used * 1e6) as u32)?;
            }
            op::QUIT => return Ok(()),
            other => bail!("unknown request {other} on VI {i}"),
        }
    }
}

fn one_count(o: &ScaleOpts, n: usize) -> Result<ScaleResult> {
    let exe_args = {
        let mut a = vec![
            "scale-peer".to_string(),
            "--provider".into(),
            o.provider.name().into(),
            "--vis".into(),
            n.to_string(),
        ];
        if let Some(c) = o.server_cpu {
            a.push("--cpu".into());
            a.push(c.to_string());
        }
        a
    };
    pin::pin_or_warn(o.client_cpu, "client");
    let server = spawn_server(&exe_args, None, |_| {})?;
    let info = wait_line(&server.rx, "READY ", Duration::from_secs(60), "READY line")?;
    let (host, disc) = info
        .rsplit_once('/')
        .ok_or_else(|| anyhow!("bad READY line {info:?}"))?;
    let disc = Discriminator::from_u64(u64::from_str_radix(disc, 16)?);
    let mut c = Side::new(o.provider, n, false)?;
    let t0 = Instant::now();
    for (i, vi) in c.vis.iter().enumerate() {
        vi.connect_request(&NetAddress::new(host, disc.clone()), CONNECT_TIMEOUT)
            .with_context(|| format!("connecting VI {} of {n}", i + 1))?;
    }
    let connect_s = t0.elapsed().as_secs_f64();
    if let Some(i) = c
        .vis
        .iter()
        .position(|v| v.state() != uvia::ViState::Connected)
    {
        bail!(
            "VI {i} of {n} is {:?} once all were connected ({:.0} ms after the first)",
            c.vis[i].state(),
            connect_s * 1e3
        );
    }
    let fp: Footprint = serde_json::from_str(&wait_line(
        &server.rx,
        "FOOTPRINT ",
        Duration::from_secs(60),
        "footprint",
    )?)?;

    // One pair's ping-pong, the pair in the middle of the server's list.
    let pair = n / 2;
    let warm = (o.iters / 10).clamp(10, 10_000);
    let mut samples = Vec::with_capacity(o.iters);
    // The clock's calibration (a 50 ms spin, once a process) before the
    // round trips, not between two of them.
    crate::clock::ns_per_tick();
    for k in 0..warm + o.iters {
        let t = crate::clock::ticks();
        c.send(pair, op::ECHO)?;
        c.take(pair)?;
        if k >= warm {
            samples.push(crate::clock::to_ns(crate::clock::ticks() - t) / 2.0);
        }
    }
    let one_pair = Stats::of(&samples);

    // A message on every VI, then every reply, in rounds.
    let t = Instant::now();
    for _ in 0..o.rate_rounds {
        for i in 0..n {
            c.send(i, op::ECHO)?;
        }
        for i in 0..n {
            c.take(i)?;
        }
    }
    let rate_msgs_per_s = (o.rate_rounds * n) as f64 / t.elapsed().as_secs_f64();

    // Spread the VIs' timers: one exchange on each, paced over SPREAD.
    // Waiting in a receive wait runs the client's timers meanwhile.
    let t = Instant::now();
    for i in 0..n {
        c.send(i, op::ECHO)?;
        c.take(i)?;
        let next = SPREAD.mul_f64((i + 1) as f64 / n as f64);
        if let Some(gap) = next.checked_sub(t.elapsed()).filter(|g| !g.is_zero()) {
            match c.vis[i].recv_wait(Some(gap)) {
                Err(uvia::WaitError::Timeout) => {}
                Err(e) => bail!("the client's wait between paced messages failed: {e}"),
                Ok(_) => bail!("a message came between paced messages"),
            }
        }
    }

    // The idle wait: the server sleeps on its CQ; then wake it.
    c.send(pair, op::IDLE)?;
    // Waiting in a receive wait, as a program that waits does: the wait
    // runs the client's timers (its acknowledgements of the rate run's
    // replies among them), which a plain sleep would leave undone.
    match c.vis[pair].recv_wait(Some(o.idle)) {
        Err(uvia::WaitError::Timeout) => {}
        Err(e) => bail!("the client's wait during the idle time failed: {e}"),
        Ok(_) => bail!("a message came while the server was to be idle"),
    }
    let t = Instant::now();
    c.send(pair, op::WAKE)?;
    let used_us = c
        .take(pair)
        .context("waiting for the server's idle CPU figure")?;
    let idle_s = o.idle.as_secs_f64() + t.elapsed().as_secs_f64();
    c.send(pair, op::QUIT)?;
    // Let the QUIT leave before the client's VIs go away.
    std::thread::sleep(Duration::from_millis(20));

    Ok(ScaleResult {
        provider: o.provider.name().to_string(),
        vis: n,
        connect_s,
        one_pair,
        rate_msgs_per_s,
        idle_cpu: used_us as f64 * 1e-6 / idle_s,
        server_bytes_per_vi: (fp.rss_after as f64 - fp.rss_before as f64) / n as f64,
        server_fds_per_vi: (fp.fds_after as f64 - fp.fds_before as f64) / n as f64,
    })
}

/// This process's resident set, from /proc/self/status.
fn resident_bytes() -> Result<u64> {
    let s = std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let kb = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| anyhow!("no VmRSS in /proc/self/status"))?;
    Ok(kb * 1024)
}

fn open_fds() -> Result<usize> {
    Ok(std::fs::read_dir("/proc/self/fd")
        .context("reading /proc/self/fd")?
        .count())
}

/// Raises the soft open-file limit to the hard one when N VIs need more
/// than it (a udp VI holds a socket).
fn raise_fd_limit(n: usize) {
    // SAFETY: getrlimit/setrlimit fill and read a plain struct we own.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && (r.rlim_cur as usize) < 4 * n + 64 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// The bench's comparisons of many VIs: for each provider, `pairs` runs
/// of 1,000 VI pairs and of a lone pair (`uvia scale --vis 1000,1` as a
/// child process): one pair's 8 B p50 among the 1,000 against the lone
/// pair's, and, of the 1,000, the set-up time (udp), the idle blocked
/// wait's CPU and the server's memory per VI, each against its bound.
pub(crate) fn headlines(
    pb: &indicatif::ProgressBar,
    pairs: usize,
    timeout: Duration,
) -> Vec<crate::bench::Headline> {
    use crate::bench::{interleave, Headline};
    use std::cell::RefCell;
    let mut out = Vec::new();
    for p in ["shm", "udp"] {
        // The 1,000's figures of each run, and the lone pair's p50.
        let many: RefCell<Vec<ScaleResult>> = RefCell::new(Vec::new());
        let lone = RefCell::new(0.0);
        let run = || -> Result<f64> {
            let args: Vec<String> = [
                "scale",
                "--provider",
                p,
                "--vis",
                "1000,1",
                "--iters",
                "20000",
                "--idle-secs",
                "1",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let text = crate::bench::sub_json(&crate::self_exe()?, &args, timeout)?;
            let r: ScaleRun =
                serde_json::from_str(&text).context("parsing the scale run's JSON")?;
            if let Some(f) = r.failed.first() {
                bail!("{f}");
            }
            let of = |n: usize| {
                r.results
                    .iter()
                    .find(|x| x.vis == n)
                    .cloned()
                    .ok_or_else(|| anyhow!("no result for {n} VI pairs"))
            };
            let (m, one) = (of(1000)?, of(1)?);
            *lone.borrow_mut() = one.one_pair.p50;
            let p50 = m.one_pair.p50;
            many.borrow_mut().push(m);
            Ok(p50)
        };
        let h = interleave(
            pb,
            &format!("{p}: one pair's 8 B p50 among 1,000 VI pairs on one CQ vs a lone pair"),
            "p50 with 999 pairs idle / p50 alone",
            "ns",
            "<= 1.2x",
            pairs,
            run,
            || Ok(*lone.borrow()),
            |c, b| c / b,
            |r| r <= 1.2,
        );
        // The rows below take the runs of the pairs kept, not those made
        // again because the host moved the cores during them.
        let many = h.kept(many.into_inner());
        out.push(h);
        let against = |name: String,
                       ratio_is: &str,
                       unit: &str,
                       target: &str,
                       v: &dyn Fn(&ScaleResult) -> f64,
                       bound: f64,
                       pass: fn(f64) -> bool| {
            let values = if many.is_empty() {
                Err("the scale runs failed (see the comparison above)".to_string())
            } else {
                Ok(many.iter().map(|r| (v(r), bound)).collect())
            };
            Headline::from_pairs(&name, ratio_is, unit, target, values, |c, b| c / b, pass)
        };
        if p == "udp" {
            out.push(against(
                "udp: connecting 1,000 VI pairs, one after another, vs 1 s".into(),
                "seconds / 1 s",
                "s",
                "<= 1x",
                &|r| r.connect_s,
                1.0,
                |r| r <= 1.0,
            ));
        }
        out.push(against(
            format!("{p}: CPU of an idle blocked CQ wait over 1,000 VIs vs 2%"),
            "CPU % / 2%",
            "%",
            "< 1x",
            &|r| r.idle_cpu * 100.0,
            2.0,
            |r| r < 1.0,
        ));
        out.push(against(
            format!("{p}: server memory per VI among 1,000 vs 64 KiB"),
            "KiB per VI / 64 KiB",
            "KiB",
            "<= 1x",
            &|r| r.server_bytes_per_vi / 1024.0,
            64.0,
            |r| r <= 1.0,
        ));
    }
    out
}
