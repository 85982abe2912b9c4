//! The ping-pong and bandwidth drivers, and the two-process set-up.
//!
//! The client (this process) spawns the server as a child of its own binary
//! (`uvia serve-peer ...`), pins itself to one core and the child to another,
//! reads `READY <info>` from the child's stdout, connects, runs the schedule,
//! and finally reads the child's `RESULT <json>` line with its CPU use per
//! size. The child prints `ERROR <message>` and exits when anything fails, and
//! exits when its stdin reaches end of file (the client died). The client
//! reads the child's stdout with time limits and kills the child on error; if
//! the child dies in the middle of a measurement the client reports it and
//! exits rather than spin forever on a receive that cannot complete.

use crate::clock;
use crate::cpu::CpuMeter;
use crate::endpoint::{self, Endpoint, EndpointConfig, Listener, Mode};
use crate::stats::Stats;
use crate::{kernel_tcp, kernel_udp, pin};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// The message providers the tool can measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Provider {
    /// uvia's shared-memory provider.
    Shm,
    /// uvia's udp provider (the protocol engine over kernel UDP sockets).
    Udp,
    /// uvia's xdp provider (the protocol engine over raw Ethernet through
    /// AF_XDP); needs --netns (two test hosts) and root.
    Xdp,
    /// Kernel UDP sockets on 127.0.0.1.
    KernelUdp,
    /// Kernel TCP sockets on 127.0.0.1 (TCP_NODELAY).
    KernelTcp,
}

impl Provider {
    pub fn name(self) -> &'static str {
        match self {
            Provider::Shm => "shm",
            Provider::Udp => "udp",
            Provider::Xdp => "xdp",
            Provider::KernelUdp => "kernel-udp",
            Provider::KernelTcp => "kernel-tcp",
        }
    }
}

/// Which driver runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Round trips of one message each way.
    Pingpong,
    /// Back-to-back messages one way, one small ack per batch.
    Bw,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Pingpong => "pingpong",
            Kind::Bw => "bw",
        }
    }
}

pub fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Polling => "polling",
        Mode::Blocking => "blocking",
    }
}

/// Everything both processes must agree on.
#[derive(Clone, Debug)]
pub struct Plan {
    pub provider: Provider,
    pub mode: Mode,
    pub kind: Kind,
    pub sizes: Vec<usize>,
    pub iters: Vec<usize>,
    pub warmup: Vec<usize>,
    pub window: usize,
    /// Pause between round trips (ping-pong only), microseconds; 0 for none.
    pub interval_us: u64,
    pub client_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    /// Reliability level of uvia's VIs.
    pub reliability: Level,
    /// Faults injected on both sides' receive paths (uvia network providers).
    pub inject: Option<String>,
    /// The local address of this side (127.0.0.1, or a test host's).
    pub ip: std::net::IpAddr,
    /// This side's network interface (the xdp provider).
    pub iface: Option<String>,
    /// Runs the server in this network namespace (`--netns`), with its
    /// address and interface.
    pub server_netns: Option<(String, std::net::IpAddr, String)>,
    /// One-sided ping-pong: RDMA writes watched by the peer (`--rdma-write`).
    pub rdma_write: bool,
    /// Busy polling on the xdp provider's sockets (`--xdp-busy-poll`).
    pub xdp_busy_poll: bool,
    /// Bandwidth with faults injected: a second, lossless connection
    /// between the same two processes, the batches alternating between the
    /// two (`--lossless-twin`).
    pub lossless_twin: bool,
}

/// VIA's reliability levels, as the tool names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Level {
    Unreliable,
    /// Reliable delivery: a send completes when the peer has it.
    Delivery,
    /// Reliable reception: a send completes when it is in the peer's buffer.
    Reception,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Unreliable => "unreliable",
            Level::Delivery => "delivery",
            Level::Reception => "reception",
        }
    }

    pub(crate) fn reliability(self) -> uvia::Reliability {
        match self {
            Level::Unreliable => uvia::Reliability::Unreliable,
            Level::Delivery => uvia::Reliability::ReliableDelivery,
            Level::Reception => uvia::Reliability::ReliableReception,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct CpuUse {
    pub client: f64,
    pub server: f64,
}

/// One size's result.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SizeResult {
    pub size: usize,
    pub iters: usize,
    /// Ping-pong: one-way latency (round trip / 2) per round trip.
    /// Bandwidth: time per message, from per-batch samples (batch time / batch messages).
    pub lat_ns: Stats,
    pub mbytes_per_s: f64,
    pub msgs_per_s: f64,
    pub cpu: CpuUse,
}

/// The JSON of `uvia pingpong` and `uvia bw`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResult {
    pub command: String,
    pub provider: String,
    pub mode: String,
    pub results: Vec<SizeResult>,
    /// With `--lossless-twin`: the lossless connection's result at each
    /// size, measured in the batches between those of `results`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lossless: Vec<SizeResult>,
}

/// Default round trips for a ping-pong size: 100,000 up to 1 KiB, then fewer
/// so that each size takes well under a second.
pub fn default_pp_iters(size: usize) -> usize {
    if size <= 1024 {
        100_000
    } else {
        (100_000 * 1024 / size).clamp(500, 100_000)
    }
}

/// Default messages for a bandwidth size: about 512 MiB, between 1,000 and 200,000.
pub fn default_bw_iters(size: usize) -> usize {
    ((512usize << 20) / size.max(1)).clamp(1000, 200_000)
}

pub fn default_warmup(iters: usize) -> usize {
    (iters / 10).clamp(10, 10_000)
}

/// Bandwidth batches: (count, messages per batch). Both sides compute the same.
pub fn bw_batches(iters: usize) -> (usize, usize) {
    let batches = iters.clamp(1, 20);
    (batches, iters.div_ceil(batches).max(1))
}

/// The connections bandwidth batch `b` goes over, in order, of `n` (one,
/// or the faulty connection 0 and its lossless twin 1): the twin's in the
/// order ABBA, so that a change in the host's speed during a run falls on
/// both alike. Both sides compute the same.
pub fn batch_order(b: usize, n: usize) -> &'static [usize] {
    match (n, b % 2) {
        (1, _) => &[0],
        (_, 0) => &[0, 1],
        _ => &[1, 0],
    }
}

pub fn listen(provider: Provider, cfg: &EndpointConfig) -> Result<Box<dyn Listener>> {
    match provider {
        Provider::Shm | Provider::Udp | Provider::Xdp => endpoint::via::listen(cfg),
        Provider::KernelUdp => kernel_udp::listen(cfg),
        Provider::KernelTcp => kernel_tcp::listen(cfg),
    }
}

pub fn connect(provider: Provider, cfg: &EndpointConfig, info: &str) -> Result<Box<dyn Endpoint>> {
    match provider {
        Provider::Shm | Provider::Udp | Provider::Xdp => endpoint::via::connect(cfg, info),
        Provider::KernelUdp => kernel_udp::connect(cfg, info),
        Provider::KernelTcp => kernel_tcp::connect(cfg, info),
    }
}

fn config(plan: &Plan) -> EndpointConfig {
    let nic = match plan.provider {
        Provider::Udp => match plan.ip {
            std::net::IpAddr::V6(a) => format!("udp:[{a}]"),
            a => format!("udp:{a}"),
        },
        Provider::Xdp => format!(
            "xdp:{}{}",
            plan.iface.as_deref().unwrap_or("lo"),
            if plan.xdp_busy_poll { ":busypoll" } else { "" }
        ),
        _ => "shm".to_string(),
    };
    EndpointConfig {
        mode: plan.mode,
        max_size: plan.sizes.iter().copied().max().unwrap_or(8).max(8),
        window: plan.window.max(1),
        nic,
        reliability: plan.reliability.reliability(),
        inject: plan.inject.clone(),
        ip: plan.ip,
        rdma_write: plan.rdma_write,
    }
}

/// Which connection of a run an error came from, where there are two.
fn connection_name(w: usize, n: usize) -> &'static str {
    match (n, w) {
        (1, _) => "the connection",
        (_, 0) => "the connection with faults injected",
        _ => "the lossless twin",
    }
}

/// Connection `w` of `eps`, and the other one if there are two: a side
/// waiting on one drives the other meanwhile, as a program with two
/// connections polls both.
fn this_and_other(
    eps: &mut [Box<dyn Endpoint>],
    w: usize,
) -> (&mut Box<dyn Endpoint>, Option<&dyn Endpoint>) {
    let (head, tail) = eps.split_at_mut(w);
    let (ep, after) = tail.split_first_mut().expect("connection w exists");
    let other = head.first().or(after.first()).map(|e| &**e);
    (ep, other)
}

fn drive(other: &Option<&dyn Endpoint>) {
    if let Some(o) = other {
        o.drive();
    }
}

/// The lossless twin's configuration: the plan's, without faults.
fn twin_config(plan: &Plan) -> EndpointConfig {
    EndpointConfig {
        inject: None,
        ..config(plan)
    }
}

const ACK: usize = 8;
/// What the server's replies carry, and what bandwidth messages carry.
const REPLY_BYTE: u8 = 0x3c;
const BW_BYTE: u8 = 0xa5;

/// Checks the first and last byte of a message (a cheap guard against a
/// provider that delivers the wrong bytes; it also makes the receiver touch
/// the data, as a real application would).
fn check_bytes(b: &[u8], want: u8) -> Result<()> {
    if b.first().is_some_and(|&x| x != want) || b.last().is_some_and(|&x| x != want) {
        bail!("received bytes differ from what was sent");
    }
    Ok(())
}

pub(crate) use crate::endpoint::expect_len;

// ---------------------------------------------------------------- server side

#[derive(Serialize, Deserialize)]
struct ServerReport {
    cpu: Vec<f64>,
}

/// The hidden `serve-peer` command: the server half of one measurement.
/// Never returns.
pub fn serve(plan: &Plan) -> ! {
    pin::pin_or_warn(plan.server_cpu, "server");
    serve_peer(|| serve_inner(plan))
}

/// Runs the server half of a two-process measurement and reports to the
/// client on stdout (`RESULT <json>` or `ERROR <text>`), then exits. The
/// process also exits when the client goes away (stdin reaches end of file).
pub fn serve_peer<T: Serialize>(body: impl FnOnce() -> Result<T>) -> ! {
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        std::process::exit(3);
    });
    match body() {
        Ok(report) => {
            println!(
                "RESULT {}",
                serde_json::to_string(&report).unwrap_or_default()
            );
            let _ = std::io::stdout().flush();
            std::process::exit(0)
        }
        Err(e) => {
            println!("ERROR {}", format!("{e:#}").replace('\n', " "));
            let _ = std::io::stdout().flush();
            std::process::exit(1)
        }
    }
}

fn serve_inner(plan: &Plan) -> Result<ServerReport> {
    let cfg = config(plan);
    let listening = |cfg: &EndpointConfig| {
        listen(plan.provider, cfg)
            .with_context(|| format!("{} server: listening", plan.provider.name()))
    };
    let mut listeners = vec![listening(&cfg)?];
    if plan.lossless_twin {
        listeners.push(listening(&twin_config(plan))?);
    }
    let infos: Vec<String> = listeners.iter().map(|l| l.info()).collect();
    println!("READY {}", infos.join(" "));
    std::io::stdout().flush()?;
    let mut eps = Vec::new();
    for l in listeners {
        let mut ep = l
            .accept()
            .with_context(|| format!("{} server: accepting", plan.provider.name()))?;
        ep.send_buf().fill(REPLY_BYTE);
        eps.push(ep);
    }
    let die_after: Option<usize> = std::env::var("UVIA_TEST_SERVER_DIES_AFTER")
        .ok()
        .and_then(|v| v.parse().ok());
    let mut cpu = Vec::new();
    for (i, &size) in plan.sizes.iter().enumerate() {
        let (iters, warm) = (plan.iters[i], plan.warmup[i]);
        let c = match plan.kind {
            Kind::Pingpong => {
                let ep = &mut eps[0];
                ep.rounds(size, warm, false, &mut || {})?;
                crate::tracefile::begin(i, iters)?;
                let m = CpuMeter::start();
                match die_after {
                    Some(k) if k < iters => {
                        ep.rounds(size, k, false, &mut || {})?;
                        expect_len(ep.recv()?, size)?;
                        // Test hook: vanish without a word, as a crashed server would.
                        std::process::exit(9);
                    }
                    _ => ep.rounds(size, iters, false, &mut || {})?,
                }
                let c = m.stop();
                crate::tracefile::end("server", i)?;
                ep.flush()?;
                c
            }
            Kind::Bw => {
                for ep in eps.iter_mut() {
                    for _ in 0..warm {
                        expect_len(ep.recv()?, size)?;
                        check_bytes(ep.recv_buf(), BW_BYTE)?;
                    }
                    ep.send(ACK)?;
                }
                let (batches, per) = bw_batches(iters);
                let m = CpuMeter::start();
                let n = eps.len();
                for b in 0..batches {
                    for &w in batch_order(b, n) {
                        let (ep, other) = this_and_other(&mut eps, w);
                        (|| -> Result<()> {
                            for _ in 0..per {
                                expect_len(ep.recv_driving(&|| drive(&other))?, size)?;
                                check_bytes(ep.recv_buf(), BW_BYTE)?;
                            }
                            ep.send(ACK)
                        })()
                        .with_context(|| format!("batch {b} over {}", connection_name(w, n)))?;
                    }
                }
                let c = m.stop();
                for ep in eps.iter_mut() {
                    ep.flush()?;
                }
                c
            }
        };
        cpu.push(c);
    }
    Ok(ServerReport { cpu })
}

fn server_args(plan: &Plan) -> Vec<String> {
    let list = |v: &[usize]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut a = vec![
        "serve-peer".to_string(),
        "--provider".into(),
        plan.provider.name().into(),
        "--mode".into(),
        mode_name(plan.mode).into(),
        "--kind".into(),
        plan.kind.name().into(),
        "--sizes".into(),
        list(&plan.sizes),
        "--iters".into(),
        list(&plan.iters),
        "--warmup".into(),
        list(&plan.warmup),
        "--window".into(),
        plan.window.to_string(),
    ];
    if let Some(c) = plan.server_cpu {
        a.push("--cpu".into());
        a.push(c.to_string());
    }
    a.extend(["--reliability".into(), plan.reliability.name().into()]);
    if plan.rdma_write {
        a.push("--rdma-write".into());
    }
    if plan.xdp_busy_poll {
        a.push("--xdp-busy-poll".into());
    }
    if plan.lossless_twin {
        a.push("--lossless-twin".into());
    }
    if let Some(f) = &plan.inject {
        a.extend(["--inject".into(), f.clone()]);
    }
    let ip = plan.server_netns.as_ref().map_or(plan.ip, |(_, ip, _)| *ip);
    a.extend(["--ip".into(), ip.to_string()]);
    if let Some((_, _, iface)) = &plan.server_netns {
        a.extend(["--iface".into(), iface.clone()]);
    }
    a
}

// ---------------------------------------------------------------- client side

pub(crate) enum Line {
    Text(String),
    Eof,
}

/// Kills and reaps the child unless it has exited by itself.
pub(crate) struct ChildGuard {
    pub child: Child,
    /// Held open so the server sees end of file only when this process is done.
    pub _stdin: Option<std::process::ChildStdin>,
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const STATE_SETUP: u8 = 0;
const STATE_MEASURING: u8 = 1;
const STATE_DONE: u8 = 2;

/// Waits for a line starting with one of the expected words (skipping others);
/// turns `ERROR ...` and end of file into errors.
pub(crate) fn wait_line(
    rx: &mpsc::Receiver<Line>,
    want: &str,
    timeout: Duration,
    what: &str,
) -> Result<String> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(Line::Text(l)) => {
                if let Some(rest) = l.strip_prefix(want) {
                    return Ok(rest.trim().to_string());
                }
                if let Some(msg) = l.strip_prefix("ERROR ") {
                    bail!("the server failed: {msg}");
                }
            }
            Ok(Line::Eof) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the server process exited before {what}")
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!("timed out after {timeout:?} waiting for the server's {what}")
            }
        }
    }
}

/// A child of this program started by [`spawn_server`]: killed when
/// dropped unless it has exited, its stdout's lines in `rx`.
pub(crate) struct Server {
    pub rx: mpsc::Receiver<Line>,
    pub pid: u32,
    /// The last `ERROR ...` line it printed.
    pub last_error: Arc<Mutex<Option<String>>>,
    _guard: ChildGuard,
}

/// Starts this program with `args` (on test host `netns` if given), its
/// stdout read line by line into [`Server::rx`]; `on_eof` runs on the
/// reading thread when the stdout ends (the child exited), given its last
/// error line.
pub(crate) fn spawn_server(
    args: &[String],
    netns: Option<&str>,
    on_eof: impl FnOnce(Option<String>) + Send + 'static,
) -> Result<Server> {
    let exe = crate::self_exe()?;
    let shown = exe.display().to_string();
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns])
                .arg(std::fs::read_link(&exe).unwrap_or(exe));
            c
        }
        None => Command::new(exe),
    };
    let mut child = cmd
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting the server process ({shown})"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout from the server process"))?;
    let stdin = child.stdin.take();
    let pid = child.id();
    let last_error = Arc::new(Mutex::new(None::<String>));
    let (tx, rx) = mpsc::channel();
    let seen = last_error.clone();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        loop {
            let mut l = String::new();
            match r.read_line(&mut l) {
                Ok(n) if n > 0 => {
                    let l = l.trim_end().to_string();
                    if let Some(m) = l.strip_prefix("ERROR ") {
                        *seen.lock().unwrap() = Some(m.to_string());
                    }
                    let _ = tx.send(Line::Text(l));
                }
                _ => break,
            }
        }
        let _ = tx.send(Line::Eof);
        let why = seen.lock().unwrap().clone();
        on_eof(why);
    });
    Ok(Server {
        rx,
        pid,
        last_error,
        _guard: ChildGuard {
            child,
            _stdin: stdin,
        },
    })
}

/// Runs one measurement (client half), spawning the server.
pub fn run(plan: &Plan) -> Result<RunResult> {
    run_with(plan, &|_| Ok(()))
}

/// [`run`], calling `ready` with the server's process id once the server
/// is ready and before anything is measured.
pub fn run_with(plan: &Plan, ready: &dyn Fn(u32) -> Result<()>) -> Result<RunResult> {
    run_sliced(plan, ready, &mut |_| Ok(()))
}

/// [`run_with`], also calling `before` with each size's position (a
/// slice of the measurement) before the client starts that size's
/// warm-up: between slices, with the server waiting for the first
/// message, the caller may change what is recorded.
pub fn run_sliced(
    plan: &Plan,
    ready: &dyn Fn(u32) -> Result<()>,
    before: &mut dyn FnMut(usize) -> Result<()>,
) -> Result<RunResult> {
    if plan.sizes.is_empty()
        || plan.sizes.len() != plan.iters.len()
        || plan.sizes.len() != plan.warmup.len()
    {
        bail!("internal: sizes, iterations and warm-ups differ in length");
    }
    if plan.iters.contains(&0) {
        bail!("iterations must be at least 1");
    }
    let netns = plan.server_netns.as_ref().map(|(ns, _, _)| ns.as_str());
    let state = Arc::new(AtomicU8::new(STATE_SETUP));
    let watched = state.clone();
    let server = spawn_server(&server_args(plan), netns, move |why| {
        // The server is gone. If the measurement is still running, a
        // receive may never complete: give it a moment, then give up.
        std::thread::sleep(Duration::from_secs(3));
        if watched.load(Ordering::SeqCst) == STATE_MEASURING {
            let why = why.unwrap_or_else(|| "it exited or was killed".into());
            eprintln!(
                "uvia: error: the server process stopped in the middle of the measurement: {why}"
            );
            std::process::exit(1);
        }
    })?;
    let (rx, last_error, server_pid) = (&server.rx, &server.last_error, server.pid);
    let info = wait_line(rx, "READY", Duration::from_secs(30), "READY line")?;
    ready(server_pid)?;
    pin::pin_or_warn(plan.client_cpu, "client");
    let cfg = config(plan);
    state.store(STATE_MEASURING, Ordering::SeqCst);
    let measured = (|| -> Result<(Vec<SizeResult>, Vec<SizeResult>)> {
        let connecting = |cfg: &EndpointConfig, info: &str| {
            connect(plan.provider, cfg, info)
                .with_context(|| format!("{} client: connecting", plan.provider.name()))
        };
        let mut eps = if plan.lossless_twin {
            let [faulty, twin] = info.split_whitespace().collect::<Vec<_>>()[..] else {
                bail!("the server's READY line {info:?} does not name two listeners");
            };
            vec![
                connecting(&cfg, faulty)?,
                connecting(&twin_config(plan), twin)?,
            ]
        } else {
            vec![connecting(&cfg, &info)?]
        };
        let (mut out, mut twin) = (Vec::new(), Vec::new());
        for (i, &size) in plan.sizes.iter().enumerate() {
            before(i)?;
            let what = || {
                format!(
                    "{} {} at {} bytes",
                    plan.provider.name(),
                    plan.kind.name(),
                    size
                )
            };
            match plan.kind {
                Kind::Pingpong => out.push(
                    pingpong_client(
                        eps[0].as_mut(),
                        i,
                        size,
                        plan.iters[i],
                        plan.warmup[i],
                        plan.interval_us,
                    )
                    .with_context(what)?,
                ),
                Kind::Bw => {
                    let mut r = bw_client(&mut eps, size, plan.iters[i], plan.warmup[i])
                        .with_context(what)?
                        .into_iter();
                    out.extend(r.next());
                    twin.extend(r.next());
                }
            }
        }
        Ok((out, twin))
    })();
    state.store(STATE_DONE, Ordering::SeqCst);
    let (mut results, mut lossless) = match measured {
        Ok(r) => r,
        Err(e) => {
            // Prefer the server's own account when it failed first; one that
            // comes after the client's failure is most likely its echo (the
            // client's VI went away), said after the client's own.
            let server_error = || last_error.lock().unwrap().clone();
            if let Some(m) = server_error() {
                return Err(e.context(format!("the server failed: {m}")));
            }
            std::thread::sleep(Duration::from_millis(100));
            if let Some(m) = server_error() {
                return Err(anyhow!("{e:#}; then the server: {m}"));
            }
            return Err(e);
        }
    };
    let report = wait_line(rx, "RESULT", Duration::from_secs(30), "RESULT line")?;
    let report: ServerReport =
        serde_json::from_str(&report).context("reading the server's RESULT line")?;
    for (r, c) in results.iter_mut().zip(&report.cpu) {
        r.cpu.server = *c;
    }
    for (r, c) in lossless.iter_mut().zip(&report.cpu) {
        r.cpu.server = *c;
    }
    Ok(RunResult {
        command: if plan.rdma_write {
            "pingpong --rdma-write".into()
        } else {
            plan.kind.name().into()
        },
        provider: plan.provider.name().into(),
        mode: mode_name(plan.mode).into(),
        results,
        lossless,
    })
}

fn pingpong_client(
    ep: &mut dyn Endpoint,
    slice: usize,
    size: usize,
    iters: usize,
    warm: usize,
    interval_us: u64,
) -> Result<SizeResult> {
    for (i, b) in ep.send_buf()[..size].iter_mut().enumerate() {
        *b = i as u8;
    }
    for _ in 0..warm {
        ep.send(size)?;
        expect_len(ep.recv()?, size)?;
    }
    let mut ticks = Vec::with_capacity(iters);
    let pause = Duration::from_micros(interval_us);
    crate::tracefile::begin(slice, iters)?;
    let m = CpuMeter::start();
    // One clock read per round trip: the read that ends a round trip
    // starts the next. Paced, a round trip runs from a read before the
    // send to the read after its reply.
    if interval_us > 0 {
        let mut t0 = clock::ticks();
        for _ in 0..iters {
            uvia_trace::mark!(AppClock);
            ep.send(size)?;
            let n = ep.recv()?;
            let t1 = clock::ticks();
            uvia_trace::mark!(AppClock);
            ticks.push(t1.wrapping_sub(t0));
            expect_len(n, size)?;
            std::thread::sleep(pause);
            t0 = clock::ticks();
        }
    } else {
        // Back to back, the clock is read after each send, while the
        // message is on its way: a round trip is the time from one send's
        // read to the next's. A fenced read of the time-stamp counter
        // (some 10 ns here) between a reply and the next send would sit in
        // the time measured; UCX's perftest likewise reads its clock once
        // an iteration, after the send.
        let mut t0 = None;
        ep.rounds(size, iters, true, &mut || {
            let t1 = clock::ticks();
            uvia_trace::mark!(AppClock);
            if let Some(t0) = t0 {
                ticks.push(t1.wrapping_sub(t0));
            }
            t0 = Some(t1);
        })?;
    }
    let cpu = m.stop();
    crate::tracefile::end("client", slice)?;
    check_bytes(ep.recv_buf(), REPLY_BYTE).context("checking the last reply")?;
    ep.flush()?;
    let samples: Vec<f64> = ticks.iter().map(|&t| clock::to_ns(t) / 2.0).collect();
    let lat = Stats::of(&samples);
    Ok(SizeResult {
        size,
        iters,
        lat_ns: lat,
        mbytes_per_s: if lat.p50 > 0.0 {
            size as f64 / lat.p50 * 1e3
        } else {
            0.0
        },
        msgs_per_s: if lat.mean > 0.0 { 1e9 / lat.mean } else { 0.0 },
        cpu: CpuUse {
            client: cpu,
            server: 0.0,
        },
    })
}

/// Bandwidth over `eps`: one connection, or a faulty one and its lossless
/// twin, whose batches alternate ([`batch_order`]); a result for each. The
/// CPU use is the whole loop's, the twins' batches together.
fn bw_client(
    eps: &mut [Box<dyn Endpoint>],
    size: usize,
    iters: usize,
    warm: usize,
) -> Result<Vec<SizeResult>> {
    // The clock's calibration (a 50 ms spin, once a process) before the
    // warm-up: converting the first batch's time would otherwise stop the
    // stream for it between two measured batches.
    clock::ns_per_tick();
    for ep in eps.iter_mut() {
        ep.send_buf()[..size].fill(BW_BYTE);
        for _ in 0..warm {
            ep.send(size)?;
        }
        ep.flush()?;
        expect_len(ep.recv()?, ACK)?;
    }
    let (batches, per) = bw_batches(iters);
    let mut per_msg = vec![Vec::with_capacity(batches); eps.len()];
    let mut total_ticks = vec![0u64; eps.len()];
    let m = CpuMeter::start();
    let n = eps.len();
    for b in 0..batches {
        for &w in batch_order(b, n) {
            let (ep, other) = this_and_other(eps, w);
            let t0 = clock::ticks();
            let got = (|| -> Result<usize> {
                for _ in 0..per {
                    ep.send(size)?;
                }
                ep.flush()?;
                ep.recv_driving(&|| drive(&other))
            })()
            .with_context(|| format!("batch {b} over {}", connection_name(w, n)))?;
            let t1 = clock::ticks();
            expect_len(got, ACK)?;
            let dt = t1.wrapping_sub(t0);
            total_ticks[w] += dt;
            per_msg[w].push(clock::to_ns(dt) / per as f64);
        }
    }
    let cpu = m.stop();
    let msgs = batches * per;
    Ok(total_ticks
        .iter()
        .zip(&per_msg)
        .map(|(&ticks, per_msg)| {
            let total_ns = clock::to_ns(ticks);
            SizeResult {
                size,
                iters: msgs,
                lat_ns: Stats::of(per_msg),
                mbytes_per_s: if total_ns > 0.0 {
                    (msgs * size) as f64 / total_ns * 1e3
                } else {
                    0.0
                },
                msgs_per_s: if total_ns > 0.0 {
                    msgs as f64 / total_ns * 1e9
                } else {
                    0.0
                },
                cpu: CpuUse {
                    client: cpu,
                    server: 0.0,
                },
            }
        })
        .collect())
}
