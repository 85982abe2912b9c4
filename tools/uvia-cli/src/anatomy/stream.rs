//! `uvia anatomy --stream K`: K messages sent back to back (the sender
//! does not wait for anything between them), one small ack from the
//! receiver when it has all K; in rounds. A traced run follows each message
//! through the stages of the ping-pong anatomy, now as the layers of 003's
//! time charts (Figs. 1 and 5): where each message is in each layer of the
//! sender and the receiver, where the two sides' work overlaps and where
//! one waits for the other.
//!
//! In a stream a layer may hold several messages at once: uvia's VIs drain
//! every queued message before the application takes the first, the udp
//! medium receives several datagrams in one system call, its engine sends
//! several posts in one. So a message is not followed in a window of its
//! own as in a ping-pong. Instead:
//!
//! - the path is that of a round's first message, which finds both sides
//!   idle and is followed as the ping-pong anatomy follows one;
//! - each message's event at each step of the path is the first of its
//!   kind after the message's previous step and after the previous
//!   message's event at that step (every layer takes messages in order); a
//!   kind rarer than the messages is a batch's, shared by the messages it
//!   carries;
//! - each CPU's time is cut at these events: the time from one to the next
//!   on a side is the work of the stage that ends at the second (shared
//!   equally when a batch's event ends several messages' stages). The
//!   stage where the receiver takes a message over counts from the
//!   hand-off (before it the receiver waits) or, for a receiver that was
//!   polling then, from the receive call that returns the message (the
//!   rest of the poll under way is waiting too); time that ends at a
//!   round's first send call (the sender waiting for the ack) is nobody's.
//!
//! Each stage is a layer, plus the sender's time from the hand-off to its
//! next send call (the send's return, its loop, completions and acks). A
//! layer's time is its mean per message (the slowest 1% left out), since a
//! throughput pays every batch's cost. 003 bounds a pipelined stream by its
//! slowest layer: Throughput_max = PacketSize / max(O_1, ..., O_s). Layers
//! on one CPU do not overlap with each other, so the bound that counts on
//! this host is the busier side's: PacketSize / max(the sender's time per
//! message, the receiver's). Both are printed, against the throughput
//! measured in untraced runs interleaved with the traced ones: K messages
//! over the time from the sender's first send call to the receiver's return
//! with the last (`CLOCK_MONOTONIC`, which both processes read). 003 timed
//! the first arrival to the last at the receiver; a receiver that drains
//! its queue returns several messages at once, so the round starts at the
//! sender here (one message's latency more).

use super::plot::{self, Bar, Chart};
use super::{describe, follow, say, Chain, Ev, Label, Span, Tracing};
use crate::endpoint::{Endpoint, EndpointConfig, Mode};
use crate::run::{self, Level, Plan, Provider};
use crate::stats::median;
use crate::{pin, tracefile};
use anyhow::{anyhow, bail, Context, Result};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use uvia_trace::kernel::Point;
use uvia_trace::Stage;

/// The receiver's ack at the end of a round.
const ACK: usize = 8;
/// Sends a sender may have outstanding (as `uvia bw`).
const WINDOW: usize = 64;
const STREAM_BYTE: u8 = 0xa5;

/// The name of the sender's layer from the hand-off to its next send call.
pub const AFTER_HANDOFF: &str = "send returns, to the next send call";

/// What the two processes of a stream agree on; the server gets it as
/// JSON on its command line.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Spec {
    pub provider: Provider,
    pub blocking: bool,
    pub size: usize,
    /// Messages per round.
    pub stream: usize,
    /// Measured (and traced) rounds, after `warm` untimed ones.
    pub rounds: usize,
    pub warm: usize,
    pub reliability: Level,
    /// This side's core, address and interface.
    pub cpu: Option<usize>,
    pub ip: IpAddr,
    pub iface: Option<String>,
}

fn config(s: &Spec) -> EndpointConfig {
    let nic = match s.provider {
        Provider::Udp => match s.ip {
            IpAddr::V6(a) => format!("udp:[{a}]"),
            a => format!("udp:{a}"),
        },
        Provider::Xdp => format!("xdp:{}", s.iface.as_deref().unwrap_or("lo")),
        _ => "shm".to_string(),
    };
    EndpointConfig {
        mode: if s.blocking {
            Mode::Blocking
        } else {
            Mode::Polling
        },
        max_size: s.size.max(ACK),
        window: WINDOW,
        nic,
        reliability: match s.reliability {
            Level::Unreliable => uvia::Reliability::Unreliable,
            Level::Delivery => uvia::Reliability::ReliableDelivery,
            Level::Reception => uvia::Reliability::ReliableReception,
        },
        inject: None,
        ip: s.ip,
        rdma_write: false,
    }
}

// ---------------------------------------------------------------- server side

/// What the server reports: per measured round, when it returned the last
/// message (`CLOCK_MONOTONIC`, which both processes read).
#[derive(Serialize, Deserialize)]
struct ServerReport {
    last_ns: Vec<u64>,
}

/// Checkpoints to make room for per round trip of the trace file: a
/// message of many frames passes a frame's checkpoints for each.
fn trace_room(s: &Spec) -> usize {
    s.rounds * (s.stream + 1) * (1 + s.size / 1024)
}

/// The hidden `uvia anatomy --serve-stream SPEC`: the receiving half of a
/// stream, started by the sender. Never returns.
pub fn serve(spec: &str) -> ! {
    run::serve_peer(|| {
        let s = serde_json::from_str::<Spec>(spec).context("reading the stream's specification")?;
        pin::pin_or_warn(s.cpu, "server");
        serve_inner(&s)
    })
}

fn serve_inner(s: &Spec) -> Result<ServerReport> {
    let cfg = config(s);
    let name = s.provider.name();
    let listener =
        run::listen(s.provider, &cfg).with_context(|| format!("{name} server: listening"))?;
    println!("READY {}", listener.info());
    std::io::stdout().flush()?;
    let mut ep = listener
        .accept()
        .with_context(|| format!("{name} server: accepting"))?;
    let mut last_ns = Vec::with_capacity(s.rounds);
    for round in 0..s.warm + s.rounds {
        for _ in 0..s.stream {
            run::expect_len(ep.recv()?, s.size)?;
        }
        let last = uvia_trace::monotonic_ns();
        if round + 1 == s.warm {
            // Recording starts before the last warm-up ack, so that no
            // measured message can arrive before it.
            tracefile::begin(0, trace_room(s))?;
        }
        ep.send(ACK)?;
        if round >= s.warm {
            last_ns.push(last);
        }
    }
    tracefile::end("server", 0)?;
    ep.flush()?;
    Ok(ServerReport { last_ns })
}

// ---------------------------------------------------------------- client side

/// Kills and reaps the server unless it has exited by itself.
struct ChildGuard {
    child: std::process::Child,
    /// Held open so that the server sees end of file only when we are done.
    _stdin: Option<std::process::ChildStdin>,
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

/// Waits for the server's line starting with `want`.
fn wait_line(rx: &mpsc::Receiver<Option<String>>, want: &str, timeout: Duration) -> Result<String> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(Some(l)) => {
                if let Some(rest) = l.strip_prefix(want) {
                    return Ok(rest.trim().to_string());
                }
                if let Some(m) = l.strip_prefix("ERROR ") {
                    bail!("the stream's server failed: {m}");
                }
            }
            Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the stream's server exited before its {}line", want)
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!("timed out after {timeout:?} waiting for the stream's server")
            }
        }
    }
}

/// One run's measurements, per measured round: from the sender's first send
/// call to the receiver's return with the last message, and to the ack.
#[derive(Debug)]
pub struct Once {
    pub delivered_ns: Vec<f64>,
    pub acked_ns: Vec<f64>,
}

/// Runs one stream between this process (the sender) and a server it
/// starts; `ready` gets the server's process id before anything is sent.
pub fn run_once(plan: &Plan, spec: &Spec, ready: &dyn Fn(u32) -> Result<()>) -> Result<Once> {
    let server = Spec {
        cpu: plan.server_cpu,
        ip: plan.server_netns.as_ref().map_or(plan.ip, |(_, ip, _)| *ip),
        iface: plan
            .server_netns
            .as_ref()
            .map(|(_, _, i)| i.clone())
            .or_else(|| plan.iface.clone()),
        ..spec.clone()
    };
    let exe = crate::self_exe()?;
    let mut cmd = match &plan.server_netns {
        Some((ns, _, _)) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns])
                .arg(std::fs::read_link(&exe).unwrap_or(exe));
            c
        }
        None => Command::new(exe),
    };
    let mut child = cmd
        .args([
            "anatomy",
            "--serve-stream",
            &serde_json::to_string(&server)?,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting the stream's server process")?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout from the stream's server"))?;
    let pid = child.id();
    let _guard = ChildGuard {
        _stdin: child.stdin.take(),
        child,
    };
    let measuring = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    {
        let measuring = measuring.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if let Some(m) = l.strip_prefix("ERROR ") {
                    eprintln!("uvia: the stream's server failed: {m}");
                }
                let _ = tx.send(Some(l));
            }
            let _ = tx.send(None);
            // A receive may never complete once the server is gone.
            std::thread::sleep(Duration::from_secs(3));
            if measuring.load(Ordering::SeqCst) {
                eprintln!(
                    "uvia: error: the stream's server stopped in the middle of the measurement"
                );
                std::process::exit(1);
            }
        });
    }
    let info = wait_line(&rx, "READY ", Duration::from_secs(30))?;
    ready(pid)?;
    pin::pin_or_warn(plan.client_cpu, "client");
    let mine = Spec {
        cpu: plan.client_cpu,
        ip: plan.ip,
        iface: plan.iface.clone(),
        ..spec.clone()
    };
    measuring.store(true, Ordering::SeqCst);
    let rounds = (|| -> Result<Vec<(u64, u64)>> {
        let mut ep = run::connect(spec.provider, &config(&mine), &info)
            .with_context(|| format!("{} client: connecting", spec.provider.name()))?;
        send_rounds(ep.as_mut(), spec)
    })();
    measuring.store(false, Ordering::SeqCst);
    let rounds = rounds.with_context(|| {
        format!(
            "a stream of {} x {} B over {}",
            spec.stream,
            spec.size,
            spec.provider.name()
        )
    })?;
    let report = wait_line(&rx, "RESULT ", Duration::from_secs(30))?;
    let report: ServerReport =
        serde_json::from_str(&report).context("reading the stream server's RESULT line")?;
    if report.last_ns.len() != rounds.len() {
        bail!(
            "the stream's server reported {} rounds of {}",
            report.last_ns.len(),
            rounds.len()
        );
    }
    Ok(Once {
        delivered_ns: rounds
            .iter()
            .zip(&report.last_ns)
            .map(|(&(start, _), &last)| last.saturating_sub(start) as f64)
            .collect(),
        acked_ns: rounds
            .iter()
            .map(|&(start, acked)| acked.saturating_sub(start) as f64)
            .collect(),
    })
}

/// Sends the rounds; returns, per measured round, when its first send call
/// was made and when the ack came (`CLOCK_MONOTONIC`).
fn send_rounds(ep: &mut dyn Endpoint, s: &Spec) -> Result<Vec<(u64, u64)>> {
    ep.send_buf()[..s.size].fill(STREAM_BYTE);
    let mut rounds = Vec::with_capacity(s.rounds);
    for round in 0..s.warm + s.rounds {
        if round == s.warm {
            tracefile::begin(0, trace_room(s))?;
        }
        let t0 = uvia_trace::monotonic_ns();
        for _ in 0..s.stream {
            ep.send(s.size)?;
        }
        ep.flush()?;
        run::expect_len(ep.recv()?, ACK)?;
        if round >= s.warm {
            rounds.push((t0, uvia_trace::monotonic_ns()));
        }
    }
    tracefile::end("client", 0)?;
    ep.flush()?;
    Ok(rounds)
}

// ---------------------------------------------------------------- the traces

/// A step of a stream's path: an event on a side (0 the sender, 1 the
/// receiver).
pub type Step = (usize, Label);

/// The kernel's transmit path and the checkpoints of sending: on the
/// receiver's side these are its own transmissions (acks), not the
/// message's path.
fn transmits(l: Label) -> bool {
    use Point::*;
    match l {
        Label::Mark(s) => s.is_send(),
        Label::Kernel(p) => matches!(
            p,
            SysEnter
                | NetDevQueue
                | NetDevStartXmit
                | NetDevXmit
                | NetifRx
                | SoftirqEntry
                | NetifReceiveSkb
                | XdpRedirect
                | SkDataReady
        ),
    }
}

/// The sender's send calls and the receiver's returns with a message: the
/// n-th of each is the n-th message's (messages arrive whole and in
/// order).
fn ends(tl: &[Ev], k: usize) -> Result<(Vec<usize>, Vec<usize>)> {
    let at = |side: usize, stage: Stage| -> Vec<usize> {
        tl.iter()
            .enumerate()
            .filter(|(_, e)| e.side == side && e.label == Label::Mark(stage))
            .map(|(i, _)| i)
            .collect()
    };
    let (sends, recvs) = (at(0, Stage::AppSend), at(1, Stage::AppReceived));
    if sends.len() != recvs.len() || sends.is_empty() || sends.len() % k != 0 {
        bail!(
            "the traces hold {} send calls and {} receives, not whole rounds of {k} messages: checkpoints were lost",
            sends.len(),
            recvs.len()
        );
    }
    Ok((sends, recvs))
}

/// The stream's path: that of the first message of each round, which finds
/// both sides idle as a ping-pong's does, followed as the ping-pong anatomy
/// follows one (the most common shape among them), less the receiver's own
/// transmissions.
pub fn template(runs: &[Vec<Ev>], k: usize) -> Result<Vec<Step>> {
    let mut chains = Vec::new();
    for tl in runs {
        let (sends, recvs) = ends(tl, k)?;
        for n in (0..sends.len()).step_by(k) {
            let (start, end) = (sends[n], recvs[n]);
            if end <= start {
                continue;
            }
            // The sender's events up to the receiver's return: a sender
            // may post several messages before it sends the first.
            chains.extend(follow(
                tl,
                &Span {
                    start,
                    end,
                    send_until: end + 1,
                    recv_after: if n > 0 {
                        recvs[n - 1].max(start)
                    } else {
                        start
                    },
                    reply: None,
                },
            ));
        }
    }
    // A receiver that polls may find a frame before the kernel records
    // the wake-up call it makes after placing it; such a message's path
    // ends at the queue. Of the paths that at least a quarter of the first
    // messages took, the one with the most steps.
    let mut shapes: Vec<(&Chain, usize)> = Vec::new();
    for c in &chains {
        match shapes
            .iter_mut()
            .find(|(x, _)| x.labels == c.labels && x.sides == c.sides)
        {
            Some((_, n)) => *n += 1,
            None => shapes.push((c, 1)),
        }
    }
    let Some(&(c, _)) = shapes
        .iter()
        .filter(|(_, n)| n * 4 >= chains.len())
        .max_by_key(|(x, n)| (x.labels.len(), *n))
    else {
        bail!("no message of the stream could be followed from the sender to the receiver");
    };
    Ok(c.labels
        .iter()
        .zip(&c.sides)
        .map(|(&l, &send)| (if send { 0 } else { 1 }, l))
        .filter(|&(side, l)| side == 0 || l == Label::Mark(Stage::AppReceived) || !transmits(l))
        .collect())
}

/// Each message's event at each step of `steps`, in order: the first event
/// of the step's side and kind after the message's previous step and after
/// the previous message's at the same step (each layer takes messages in
/// order). A kind that occurs fewer times than there are messages is a
/// batch's, shared by the messages it carries (a receive of several
/// datagrams, a frame built for several posts): a message may take the
/// previous message's. One that occurs as often or more is each message's
/// own, unless sharing it lets far more messages follow their path (a
/// system call that sends several messages, where the sender also makes
/// system calls while it polls). A message whose events cannot all be found
/// in order is left out.
pub fn fifo(tl: &[Ev], steps: &[Step], k: usize) -> Result<Vec<Option<Vec<usize>>>> {
    let (sends, recvs) = ends(tl, k)?;
    let n = sends.len();
    let carries = receives_that_returned(tl);
    let occ: Vec<Vec<usize>> = steps
        .iter()
        .map(|&(side, l)| {
            tl.iter()
                .enumerate()
                .filter(|&(i, e)| e.side == side && e.label == l && carries[i])
                .map(|(i, _)| i)
                .collect()
        })
        .collect();
    let pass = |own: &[bool]| -> Vec<Option<Vec<usize>>> {
        // Per step, where in its occurrences the next message may start.
        let mut from = vec![0usize; steps.len()];
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let mut picks = vec![sends[i]];
            for s in 1..steps.len().saturating_sub(1) {
                // The receiver's first step may come before the kernel
                // records the sender's hand-off (see `template`), not
                // before the step that leads to it.
                let after = if s >= 2 && steps[s].0 != steps[s - 1].0 {
                    picks[s - 2]
                } else {
                    picks[s - 1]
                };
                let p = from[s] + occ[s][from[s]..].partition_point(|&j| j < after);
                match occ[s].get(p) {
                    Some(&j) if j <= recvs[i] => {
                        picks.push(j);
                        from[s] = p + usize::from(own[s]);
                    }
                    _ => break,
                }
            }
            let whole = picks.len() + 1 == steps.len() && picks.last() <= Some(&recvs[i]);
            out.push(whole.then(|| {
                picks.push(recvs[i]);
                picks
            }));
        }
        out
    };
    let kept = |r: &[Option<Vec<usize>>]| r.iter().filter(|x| x.is_some()).count();
    let mut own: Vec<bool> = occ.iter().map(|o| o.len() >= n).collect();
    let mut best = pass(&own);
    for s in 1..steps.len().saturating_sub(1) {
        if !own[s] {
            continue;
        }
        own[s] = false;
        let shared = pass(&own);
        if kept(&shared) > kept(&best) + n / 20 {
            best = shared;
        } else {
            own[s] = true;
        }
    }
    Ok(best)
}

/// False for the receiver's socket-receive events (the system call's
/// entry and exit, the socket's receive and copy) of a call that returned
/// nothing: a receiver that polls a socket makes many such calls, and only
/// those followed by a frame found ([`Stage::RxFound`], before its next
/// call) carry messages. A call that returns several messages at once (a
/// batch of datagrams, or one datagram coalesced from a segmented send) is
/// then the only candidate for each of them, shared, where the empty polls
/// after it would each have been taken for the next message's own. True
/// for every other event, and for all where the receiver reads no socket
/// (the xdp medium's ring) or marks no frame found.
fn receives_that_returned(tl: &[Ev]) -> Vec<bool> {
    let mut keep = vec![true; tl.len()];
    let recv_side = 1;
    let has = |l: Label| tl.iter().any(|e| e.side == recv_side && e.label == l);
    if !has(Label::Kernel(Point::SockRecvLength)) || !has(Label::Mark(Stage::RxFound)) {
        return keep;
    }
    let per_call = |l: Label| {
        matches!(
            l,
            Label::Kernel(
                Point::SysEnter
                    | Point::SysExit
                    | Point::SockRecvLength
                    | Point::SkbCopyDatagramIovec
            )
        )
    };
    let mut call: Vec<usize> = Vec::new();
    let mut found = false;
    let mut close = |call: &mut Vec<usize>, found: bool| {
        if !found {
            for &j in call.iter() {
                keep[j] = false;
            }
        }
        call.clear();
    };
    for (j, e) in tl.iter().enumerate().filter(|(_, e)| e.side == recv_side) {
        if e.label == Label::Kernel(Point::SysEnter) {
            close(&mut call, found);
            found = false;
        }
        if e.label == Label::Mark(Stage::RxFound) {
            found = true;
        } else if per_call(e.label) {
            call.push(j);
        }
    }
    close(&mut call, found);
    keep
}

/// A message's share of a CPU's time in one layer: (from, to, ns).
pub type Piece = (u64, u64, f64);

/// One message of a traced stream: its place, and per layer (see
/// [`layer_steps`]) the pieces of CPU time it had there; `None` when its
/// path could not be followed.
#[derive(Clone, Debug)]
pub struct Msg {
    pub round: usize,
    pub index: usize,
    pub sent_ns: u64,
    pub received_ns: u64,
    pub pieces: Option<Vec<Vec<Piece>>>,
}

/// The layers' stages: the sender's stages, its time from the hand-off to
/// its next send call (`None`), then the receiver's stages. Stage `s` runs
/// from step `s` to step `s + 1`.
pub fn layer_steps(steps: &[Step]) -> Vec<Option<usize>> {
    let last = steps.len().saturating_sub(1);
    let send: Vec<Option<usize>> = (0..last)
        .filter(|&s| steps[s + 1].0 == 0)
        .map(Some)
        .collect();
    let recv = (0..last).filter(|&s| steps[s + 1].0 == 1).map(Some);
    send.into_iter()
        .chain(std::iter::once(None))
        .chain(recv)
        .collect()
}

/// The messages of one traced run: matched to `steps`, and each side's CPU
/// time cut at the matched events. The time from one matched event of a
/// side to its next is the work of the stage that ends there (shared
/// equally when a batch's event ends several messages' stages), less the
/// checkpoints' cost inside it; the stage where the receiver takes a
/// message over counts only from the hand-off (before it the receiver was
/// waiting for the message). Time that ends at a round's first send call
/// (the sender waiting for the ack) is nobody's.
pub fn messages(tl: &[Ev], steps: &[Step], k: usize) -> Result<Vec<Msg>> {
    let (sends, recvs) = ends(tl, k)?;
    let picks = fifo(tl, steps, k)?;
    let layers = layer_steps(steps);
    let layer_of = |stage: Option<usize>| layers.iter().position(|&l| l == stage);
    // The stages each matched event ends: (message, layer).
    let mut ending: std::collections::HashMap<usize, Vec<(usize, usize)>> =
        std::collections::HashMap::new();
    let mut matched = vec![false; tl.len()];
    for (i, p) in picks.iter().enumerate() {
        let Some(p) = p else { continue };
        for (s, &j) in p.iter().enumerate() {
            matched[j] = true;
            if s > 0 {
                if let Some(l) = layer_of(Some(s - 1)) {
                    ending.entry(j).or_default().push((i, l));
                }
            }
        }
        // The sender's next send call in the round ends this message's time
        // after its hand-off.
        if (i + 1) % k != 0 && picks[i + 1].is_some() {
            if let Some(l) = layer_of(None) {
                ending.entry(sends[i + 1]).or_default().push((i, l));
            }
        }
    }
    let mut pieces: Vec<Vec<Vec<Piece>>> = vec![vec![Vec::new(); layers.len()]; picks.len()];
    for side in 0..2 {
        let mut prev: Option<usize> = None;
        for j in (0..tl.len()).filter(|&j| tl[j].side == side && matched[j]) {
            if let Some(ends) = ending.get(&j) {
                let share = ends.len() as f64;
                for &(i, l) in ends {
                    // The receiver's take-over starts no earlier than the
                    // hand-off: the sender's last step before it.
                    let handoff = match (layers[l], &picks[i]) {
                        (Some(s), Some(pk)) if steps[s].0 != side => Some(tl[pk[s]].ns),
                        _ => None,
                    };
                    let (p, mut from) = match (prev, handoff) {
                        (Some(p), h) => (p, tl[p].ns.max(h.unwrap_or(0))),
                        (None, Some(h)) => (j, h),
                        (None, None) => continue,
                    };
                    // A receiver that was idle at the hand-off was polling:
                    // the rest of a poll already under way is waiting too;
                    // its work starts with the receive call that returns
                    // the message.
                    if handoff.is_some_and(|h| prev.is_none_or(|p| h > tl[p].ns)) {
                        if let Some(call) = (prev.unwrap_or(0)..j).rev().find(|&m| {
                            tl[m].side == side && tl[m].label == Label::Kernel(Point::SysEnter)
                        }) {
                            from = from.max(tl[call].ns);
                        }
                    }
                    let to = tl[j].ns.max(from);
                    let cost: f64 = (p..=j)
                        .filter(|&m| tl[m].side == side)
                        .filter(|&m| tl[m].ns >= from)
                        .filter(|&m| if tl[m].stamped_first { m < j } else { m > p })
                        .map(|m| tl[m].cost)
                        .sum();
                    let ns = ((to - from) as f64 - cost).max(0.0) / share;
                    pieces[i][l].push((from, to, ns));
                }
            }
            prev = Some(j);
        }
    }
    Ok((0..sends.len())
        .map(|i| Msg {
            round: i / k,
            index: i % k,
            sent_ns: tl[sends[i]].ns,
            received_ns: tl[recvs[i]].ns,
            pieces: picks[i].as_ref().map(|_| std::mem::take(&mut pieces[i])),
        })
        .collect())
}

/// A layer of the time chart.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Layer {
    pub name: String,
    /// Whose CPU: "send" or "recv".
    pub side: String,
    pub category: String,
    /// A message's time in the layer: see [`layer_mean`].
    pub ns: f64,
}

/// A layer's time per message: the mean over the messages, the slowest 1%
/// left out. A mean, not a median, because a batch's cost (one system
/// call for several messages, an ack now and then) falls on some messages
/// only and a throughput pays all of it; without the slowest 1%, because
/// on a shared machine a message now and then waits for the CPU.
pub fn layer_mean(mut per_msg: Vec<f64>) -> f64 {
    per_msg.retain(|x| x.is_finite());
    if per_msg.is_empty() {
        return 0.0;
    }
    per_msg.sort_by(|a, b| a.total_cmp(b));
    let keep = per_msg.len() - per_msg.len() / 100;
    per_msg[..keep].iter().sum::<f64>() / keep as f64
}

/// The layers of `steps`, in [`layer_steps`]' order, without their times.
fn layer_defs(steps: &[Step], xsk: bool) -> Vec<Layer> {
    layer_steps(steps)
        .into_iter()
        .map(|stage| match stage {
            Some(s) => {
                let send = steps[s + 1].0 == 0;
                let (name, cat) = describe(steps[s].1, steps[s + 1].1, send, xsk);
                Layer {
                    name,
                    side: if send { "send" } else { "recv" }.into(),
                    category: cat.into(),
                    ns: 0.0,
                }
            }
            None => Layer {
                name: AFTER_HANDOFF.into(),
                side: "send".into(),
                category: "off the message's path".into(),
                ns: 0.0,
            },
        })
        .collect()
}

/// 003's theoretical maximum: PacketSize / max(O_1, ..., O_s), with the
/// layers' times in ns. Returns the slowest layer and the bound in bytes
/// per second; none when no layer takes any time.
pub fn theoretical_max(size: usize, layer_ns: &[f64]) -> Option<(usize, f64)> {
    let (i, &o) = layer_ns
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))?;
    (o > 0.0).then(|| (i, size as f64 / o * 1e9))
}

/// A bar of the chart: message `message` (from 1) in layer `row`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChartBar {
    pub message: usize,
    pub row: usize,
    /// From the round's first send call.
    pub start_ns: f64,
    pub end_ns: f64,
}

/// The JSON of `uvia anatomy --stream`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StreamOut {
    pub command: String,
    pub provider: String,
    pub mode: String,
    pub size: usize,
    pub stream: usize,
    pub rounds: usize,
    pub pairs: usize,
    /// The path's steps, as followed: "send:<event>" or "recv:<event>".
    pub path: Vec<String>,
    /// The layers, the sender's first, in path order.
    pub layers: Vec<Layer>,
    /// The slowest layer (index into `layers`).
    pub bottleneck: usize,
    /// 003's PacketSize / max(per-layer time), bytes per second.
    pub theoretical_max_bytes_per_s: f64,
    /// Measured in the untraced runs: K x size over the time from the
    /// sender's first send call to the receiver's return with the last
    /// message; the median of all their rounds.
    pub measured_bytes_per_s: f64,
    /// The same from the traced runs' checkpoints.
    pub traced_bytes_per_s: f64,
    /// The sender's view in the untraced runs: K x size over the time from
    /// its first send call to the ack (one round trip more than the
    /// receiver's view); the median of all their rounds.
    pub sender_view_bytes_per_s: f64,
    /// Measured over theoretical; per pair and their median.
    pub pair_ratios: Vec<f64>,
    pub ratio: f64,
    /// The sender's time per message (its layers summed) and the
    /// receiver's; size over the larger is the bound of two CPUs.
    pub sender_ns: f64,
    pub receiver_ns: f64,
    pub two_cpu_max_bytes_per_s: f64,
    pub messages_kept: usize,
    pub messages: usize,
    /// The round drawn (from 0) and its bars.
    pub chart_round: usize,
    pub chart: Vec<ChartBar>,
    pub mark_cost_ns: f64,
    pub missing: Vec<String>,
}

/// The analysis of the traced runs, apart from the measured throughput.
pub struct Analysis {
    pub steps: Vec<Step>,
    pub layers: Vec<Layer>,
    pub per_run_layers: Vec<Vec<f64>>,
    pub kept: usize,
    pub all: usize,
    pub traced_bytes_per_s: f64,
    pub chart_round: usize,
    pub chart: Vec<ChartBar>,
}

/// The path, the layers and their times (over all runs and per run), and
/// the chart of the round of the last run whose arrivals took the median
/// time.
pub fn analyse(runs: &[Vec<Ev>], size: usize, k: usize, xsk: bool) -> Result<Analysis> {
    let steps = template(runs, k)?;
    let msgs: Vec<Vec<Msg>> = runs
        .iter()
        .map(|tl| messages(tl, &steps, k))
        .collect::<Result<_>>()?;
    let defs = layer_defs(&steps, xsk);
    let all = msgs.iter().map(|r| r.len()).sum();
    let kept = msgs.iter().flatten().filter(|m| m.pieces.is_some()).count();
    if kept == 0 {
        bail!("no message of the stream could be matched to its path");
    }
    let means = |msgs: &mut dyn Iterator<Item = &Msg>| -> Vec<f64> {
        let kept: Vec<&Vec<Vec<Piece>>> = msgs.filter_map(|m| m.pieces.as_ref()).collect();
        (0..defs.len())
            .map(|l| {
                let per_msg: Vec<f64> = kept
                    .iter()
                    .filter(|p| !p[l].is_empty())
                    .map(|p| p[l].iter().map(|x| x.2).sum())
                    .collect();
                layer_mean(per_msg)
            })
            .collect()
    };
    let overall = means(&mut msgs.iter().flatten());
    let per_run_layers = msgs.iter().map(|r| means(&mut r.iter())).collect();
    let layers: Vec<Layer> = defs
        .into_iter()
        .zip(&overall)
        .map(|(l, &ns)| Layer { ns, ..l })
        .collect();
    // Throughput round by round: from the first send call to the return
    // with the last message.
    let mut tput = Vec::new();
    let mut pick = Vec::new();
    for (r, run) in msgs.iter().enumerate() {
        for round in run.chunks(k) {
            let span = round[k - 1].received_ns.saturating_sub(round[0].sent_ns);
            if span > 0 {
                tput.push((k * size) as f64 / span as f64 * 1e9);
            }
            if r + 1 == msgs.len() {
                pick.push((span, round));
            }
        }
    }
    pick.sort_by_key(|x| x.0);
    let round = pick
        .get(pick.len().saturating_sub(1) / 2)
        .map_or(&[][..], |x| x.1);
    let t0 = round.first().map_or(0, |m| m.sent_ns);
    let mut chart = Vec::new();
    for m in round {
        for (row, pieces) in m.pieces.iter().flatten().enumerate() {
            for &(a, b, _) in pieces {
                chart.push(ChartBar {
                    message: m.index + 1,
                    row,
                    start_ns: a.saturating_sub(t0) as f64,
                    end_ns: b.saturating_sub(t0) as f64,
                });
            }
        }
    }
    Ok(Analysis {
        steps,
        layers,
        per_run_layers,
        kept,
        all,
        traced_bytes_per_s: median(&tput),
        chart_round: round.first().map_or(0, |m| m.round),
        chart,
    })
}

/// The sender's and the receiver's time per message: their layers summed.
pub fn sides(layers: &[Layer]) -> (f64, f64) {
    let sum = |side: &str| layers.iter().filter(|l| l.side == side).map(|l| l.ns).sum();
    (sum("send"), sum("recv"))
}

/// Runs the stream anatomy: `pairs` times an untraced run and a traced
/// one, each `rounds` rounds of `stream` messages.
pub fn run(
    plan: &Plan,
    stream: usize,
    rounds: usize,
    pairs: usize,
    pb: Option<&ProgressBar>,
) -> Result<StreamOut> {
    let [size] = plan.sizes[..] else {
        bail!("internal: a stream anatomy measures one size");
    };
    if stream < 2 {
        bail!("--stream needs at least 2 messages: a stream of one is a ping-pong");
    }
    let mut tracing = Tracing::open(
        ((rounds + (rounds / 10).max(2)) * (stream + 1) * (1 + size / 1024)).max(2000),
    )?;
    say(
        pb,
        format!(
            "anatomy: {} {} B, {pairs} pairs of an untraced and a traced stream of {rounds} rounds of {stream} messages ({})",
            plan.provider.name(),
            size,
            tracing.describe()
        ),
    );
    let spec = Spec {
        provider: plan.provider,
        blocking: plan.mode == Mode::Blocking,
        size,
        stream,
        rounds,
        warm: (rounds / 10).max(2),
        reliability: plan.reliability,
        cpu: None,
        ip: plan.ip,
        iface: None,
    };
    let xsk = plan.provider == Provider::Xdp;
    let (mut measured, mut traced_runs, mut sender_view) = (Vec::new(), Vec::new(), Vec::new());
    let mut mark_cost = 0.0;
    let mut per_pair_measured = Vec::new();
    for _ in 0..pairs {
        // Untraced: the kernel's programs detached (attached, they run on
        // every event, watched process or not).
        tracing.tracer.pause();
        let plain = run_once(plan, &spec, &|_| Ok(()));
        tracing.tracer.resume()?;
        let plain = plain?;
        let tput: Vec<f64> = plain
            .delivered_ns
            .iter()
            .filter(|&&ns| ns > 0.0)
            .map(|ns| (stream * size) as f64 / ns * 1e9)
            .collect();
        per_pair_measured.push(median(&tput));
        measured.extend(tput);
        sender_view.extend(
            plain
                .acked_ns
                .iter()
                .filter(|&&ns| ns > 0.0)
                .map(|ns| (stream * size) as f64 / ns * 1e9),
        );
        let (_, t) = tracing.run(pb, |ready| run_once(plan, &spec, ready))?;
        traced_runs.push(t.timeline());
        mark_cost = t.client.mark_cost_ns;
        if let Some(p) = pb {
            p.inc(1);
        }
    }
    let a = analyse(&traced_runs, size, stream, xsk)?;
    let ns: Vec<f64> = a.layers.iter().map(|l| l.ns).collect();
    let (bottleneck, theoretical) = theoretical_max(size, &ns)
        .ok_or_else(|| anyhow!("no layer of the stream took any time"))?;
    let pair_ratios: Vec<f64> = a
        .per_run_layers
        .iter()
        .zip(&per_pair_measured)
        .filter_map(|(l, m)| theoretical_max(size, l).map(|(_, t)| m / t))
        .collect();
    let measured = median(&measured);
    let (sender_ns, receiver_ns) = sides(&a.layers);
    let busier = sender_ns.max(receiver_ns);
    Ok(StreamOut {
        command: "anatomy --stream".into(),
        provider: plan.provider.name().into(),
        mode: run::mode_name(plan.mode).into(),
        size,
        stream,
        rounds,
        pairs,
        bottleneck,
        theoretical_max_bytes_per_s: theoretical,
        measured_bytes_per_s: measured,
        traced_bytes_per_s: a.traced_bytes_per_s,
        sender_view_bytes_per_s: median(&sender_view),
        ratio: measured / theoretical,
        pair_ratios,
        sender_ns,
        receiver_ns,
        two_cpu_max_bytes_per_s: if busier > 0.0 {
            size as f64 / busier * 1e9
        } else {
            0.0
        },
        path: a
            .steps
            .iter()
            .map(|(side, l)| format!("{}:{}", if *side == 0 { "send" } else { "recv" }, l.name()))
            .collect(),
        messages_kept: a.kept,
        messages: a.all,
        chart_round: a.chart_round,
        chart: a.chart,
        layers: a.layers,
        mark_cost_ns: mark_cost,
        missing: tracing.missing(),
    })
}

// ---------------------------------------------------------------- output

/// Bytes per second as MB/s (1 MB = 1e6 B) and messages per second.
fn rate(bytes_per_s: f64, size: usize) -> String {
    format!(
        "{:.1} MB/s ({} msgs/s)",
        bytes_per_s / 1e6,
        crate::report::fmt_rate(bytes_per_s / size.max(1) as f64)
    )
}

/// The row name of a layer.
pub fn row_name(l: &Layer) -> String {
    format!(
        "{}: {}",
        if l.side == "send" {
            "sender"
        } else {
            "receiver"
        },
        l.name
    )
}

/// How busy each CPU was at the measured rate.
fn busy(s: &StreamOut) -> String {
    if s.measured_bytes_per_s <= 0.0 {
        return String::new();
    }
    let every = s.size as f64 / s.measured_bytes_per_s * 1e9;
    let (send, recv) = (s.sender_ns / every, s.receiver_ns / every);
    let mut out = format!(
        "at the measured rate a message every {:.0} ns: the sender's CPU worked {:.0}% of it on the stream, the receiver's {:.0}%; the rest is waiting\n",
        every,
        100.0 * send,
        100.0 * recv
    );
    if send.max(recv) > 1.1 {
        out += "(over 100%: tracing slows this stream more than the checkpoints' measured cost, which is taken out; compare the traced throughput with the untraced)\n";
    }
    out
}

/// The round drawn in characters: a row per layer, each message's time in
/// it marked with its number's last digit, `width` columns for the round.
pub fn text_chart(s: &StreamOut, width: usize) -> String {
    let end = s.chart.iter().map(|b| b.end_ns).fold(0.0, f64::max);
    if end <= 0.0 || width == 0 {
        return String::new();
    }
    let names: Vec<String> = s.layers.iter().map(row_name).collect();
    let w = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for (r, name) in names.iter().enumerate() {
        let mut line = vec![' '; width];
        for b in s.chart.iter().filter(|b| b.row == r) {
            let from = ((b.start_ns / end * width as f64) as usize).min(width - 1);
            let to = ((b.end_ns / end * width as f64).ceil() as usize).clamp(from + 1, width);
            let mark = char::from_digit((b.message % 10) as u32, 10).unwrap_or('#');
            for c in &mut line[from..to] {
                *c = mark;
            }
        }
        out += &format!(
            "{name:<w$} |{}|\n",
            line.iter().collect::<String>().trim_end()
        );
    }
    out += &format!(
        "{:<w$}  0{:>width$}\n",
        "",
        format!("{:.1} us", end / 1e3),
        width = width - 1
    );
    out
}

/// The printed report.
pub fn table(s: &StreamOut) -> String {
    let mut out = format!(
        "stream of {} x {} B messages, {} ({}): {} rounds x {} pairs; {} of {} messages followed along the common path\n",
        s.stream, s.size, s.provider, s.mode, s.rounds, s.pairs, s.messages_kept, s.messages
    );
    let w = s
        .layers
        .iter()
        .map(|l| l.name.chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    out += &format!(
        "{:<w$} {:>4} {:>9}   (mean per message, the slowest 1% left out)\n",
        "layer", "side", "ns/msg"
    );
    for (i, l) in s.layers.iter().enumerate() {
        out += &format!(
            "{:<w$} {:>4} {:>9.0}{}\n",
            l.name,
            l.side,
            l.ns,
            if i == s.bottleneck {
                "  <- bottleneck"
            } else {
                ""
            }
        );
    }
    let b = &s.layers[s.bottleneck];
    out += &format!(
        "\nmeasured throughput (untraced: K x size / first send call to the receiver's last return, median of {} rounds): {}\n",
        s.rounds * s.pairs,
        rate(s.measured_bytes_per_s, s.size)
    );
    out += &format!(
        "measured throughput (traced runs): {}; the sender's view (untraced, K x size / first send call to the ack): {}\n",
        rate(s.traced_bytes_per_s, s.size),
        rate(s.sender_view_bytes_per_s, s.size)
    );
    out += &format!(
        "theoretical maximum (003: size / max per-layer time = {} B / {:.0} ns): {}\n",
        s.size,
        b.ns,
        rate(s.theoretical_max_bytes_per_s, s.size)
    );
    out += &format!(
        "measured / theoretical: {:.2} (pairs {})\n",
        s.ratio,
        s.pair_ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    out += &format!(
        "bottleneck layer: {} ({}, {:.0} ns per message)\n",
        b.name,
        if b.side == "send" {
            "the sender's CPU"
        } else {
            "the receiver's CPU"
        },
        b.ns
    );
    out += &format!(
        "layers on one CPU do not overlap: sender {:.0} ns, receiver {:.0} ns per message; size / the busier side ({}) = {} (measured / that: {:.2})\n",
        s.sender_ns,
        s.receiver_ns,
        if s.sender_ns >= s.receiver_ns {
            "the sender"
        } else {
            "the receiver"
        },
        rate(s.two_cpu_max_bytes_per_s, s.size),
        if s.two_cpu_max_bytes_per_s > 0.0 {
            s.measured_bytes_per_s / s.two_cpu_max_bytes_per_s
        } else {
            0.0
        }
    );
    out += &busy(s);
    out += "Figures are comparable within this run only (a shared, noisy machine).\n";
    out += &format!(
        "\nround {} drawn (the traced round of median length; digits are message numbers mod 10):\n",
        s.chart_round + 1
    );
    out += &text_chart(s, 100);
    for m in &s.missing {
        out += &format!("not seen: {m}\n");
    }
    out
}

/// The file of a stream's chart.
pub fn chart_svg(provider: &str) -> String {
    format!("anatomy-stream-{provider}.svg")
}

/// Draws the chart of the round into `dir`; returns the file's name.
pub fn plot(s: &StreamOut, dir: &Path) -> Result<String> {
    let file = chart_svg(&s.provider);
    let rows: Vec<String> = s
        .layers
        .iter()
        .map(|l| format!("{} ({:.0} ns)", row_name(l), l.ns))
        .collect();
    let bars: Vec<Bar> = s
        .chart
        .iter()
        .map(|b| Bar {
            row: b.row,
            start: b.start_ns,
            end: b.end_ns,
            color: plot::ALTERNATE[(b.message + 1) % 2],
            text: (b.row == 0).then(|| b.message.to_string()),
        })
        .collect();
    let b = &s.layers[s.bottleneck];
    let notes = vec![
        format!(
            "Measured (untraced, first send call to the receiver's last return): {}; measured / 003's maximum: {:.2}.",
            rate(s.measured_bytes_per_s, s.size),
            s.ratio
        ),
        format!(
            "003's maximum, size / max per-layer time: {} (the slowest layer: {}, {:.0} ns).",
            rate(s.theoretical_max_bytes_per_s, s.size),
            b.name,
            b.ns
        ),
        format!(
            "Per message: sender {:.0} ns, receiver {:.0} ns (layers on one CPU do not overlap); size / the busier: {}.",
            s.sender_ns,
            s.receiver_ns,
            rate(s.two_cpu_max_bytes_per_s, s.size)
        ),
        busy(s).trim_end().to_string(),
        "Messages alternate in colour; gaps on a row are waits. A row's time is its mean per message (the slowest 1% left out).".to_string(),
    ];
    let title = format!(
        "{}: a stream of {} x {} B messages through each layer (round {})",
        s.provider,
        s.stream,
        s.size,
        s.chart_round + 1
    );
    plot::chart(
        &dir.join(&file),
        &Chart {
            title: &title,
            rows: &rows,
            bars: &bars,
            legend: &[],
            notes: &notes,
        },
    )?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracefile::SideTrace;
    use uvia_trace::kernel::Costs;
    use uvia_trace::Mark;

    #[test]
    fn the_theoretical_maximum_is_size_over_the_slowest_layer() {
        // 003's formula on made-up layers: 1000 B through layers of 100,
        // 400 and 250 ns: the 400 ns layer bounds it at 2.5e9 B/s.
        let (i, t) = theoretical_max(1000, &[100.0, 400.0, 250.0]).unwrap();
        assert_eq!(i, 1);
        assert_eq!(t, 1000.0 / 400e-9);
        assert!(theoretical_max(1000, &[]).is_none());
        assert!(theoretical_max(1000, &[0.0, 0.0]).is_none());
    }

    fn side(pid: u32, marks: &[(u64, Stage)]) -> SideTrace {
        let mut marks: Vec<Mark> = marks
            .iter()
            .map(|&(ns, stage)| Mark {
                ns,
                ticks: ns,
                stage,
                thread: 0,
            })
            .collect();
        marks.sort_by_key(|m| m.ns);
        SideTrace {
            marks,
            mark_cost_ns: 0.0,
            ticks_per_ns: 1.0,
            dropped: 0,
            pid,
        }
    }

    /// A shared-memory-like stream of `k` messages a round: the sender
    /// takes 100 ns per message to the hand-off and 20 more to its next
    /// send call; the receiver takes 300 ns per message from finding it to
    /// its return, so messages queue up behind it.
    fn stream(k: usize, rounds: usize) -> Vec<Ev> {
        let (mut c, mut s) = (Vec::new(), Vec::new());
        let mut t = 0u64;
        for _ in 0..rounds {
            let mut free = t; // when the receiver can take the next message
            for j in 0..k as u64 {
                let send = t + 120 * j;
                c.push((send, Stage::AppSend));
                c.push((send + 100, Stage::MediumQueued));
                let found = (send + 150).max(free);
                s.push((found, Stage::RxFound));
                s.push((found + 300, Stage::AppReceived));
                free = found + 300 + 10;
            }
            // The ack, and the next round well after it.
            s.push((free, Stage::AppSend));
            c.push((free + 100, Stage::AppReceived));
            t = free + 1000;
        }
        super::super::timeline([&side(10, &c), &side(20, &s)], &[], Costs::default())
    }

    #[test]
    fn a_stream_is_followed_message_by_message_with_the_wait_in_the_queue_left_out() {
        let tl = stream(4, 3);
        let steps = template(std::slice::from_ref(&tl), 4).unwrap();
        let names: Vec<(usize, &str)> = steps.iter().map(|(s, l)| (*s, l.name())).collect();
        assert_eq!(
            names,
            [
                (0, "app-send"),
                (0, "medium-queued"),
                (1, "rx-found"),
                (1, "app-received")
            ]
        );
        let msgs = messages(&tl, &steps, 4).unwrap();
        assert_eq!(msgs.len(), 12);
        assert!(msgs.iter().all(|m| m.pieces.is_some()));
        assert_eq!((msgs[5].round, msgs[5].index), (1, 1));
        let a = analyse(&[tl], 1000, 4, false).unwrap();
        assert_eq!((a.kept, a.all), (12, 12));
        let names: Vec<(&str, &str)> = a
            .layers
            .iter()
            .map(|l| (l.name.as_str(), l.side.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("app-send to medium-queued", "send"),
                (AFTER_HANDOFF, "send"),
                ("receiver finds it (poll of the ring)", "recv"),
                ("to the application", "recv"),
            ]
        );
        let ns: Vec<f64> = a.layers.iter().map(|l| l.ns).collect();
        // The sender's 100 + 20; the receiver's find starts when it is free
        // (10 ns after its last return) or, for a round's first message,
        // at the hand-off (50 ns before the find): (50 + 3 x 10) / 4.
        assert_eq!(ns, [100.0, 20.0, 20.0, 300.0]);
        let (i, t) = theoretical_max(1000, &ns).unwrap();
        assert_eq!((i, t), (3, 1000.0 / 300e-9));
        assert_eq!(sides(&a.layers), (120.0, 320.0));
        // Returns are 310 ns apart once the queue forms: 4 x 1000 B over
        // the first send call to the last return.
        let last = 150.0 + 300.0 + 3.0 * 310.0;
        assert_eq!(a.traced_bytes_per_s, 4000.0 / last * 1e9);
        // The chart: every message in every layer but the last message's
        // after-the-hand-off one, times from the round's first send.
        assert_eq!(a.chart.len(), 4 * 4 - 1);
        let first_bar = &a.chart[0];
        assert_eq!(
            (first_bar.message, first_bar.row, first_bar.start_ns),
            (1, 0, 0.0)
        );
        for b in &a.chart {
            assert!(b.end_ns >= b.start_ns, "{b:?}");
        }
    }

    /// A receiver that drains the ring: finds and completes every queued
    /// message before the application takes the second (as uvia's VIs do
    /// when messages wait).
    fn batched(k: usize, rounds: usize) -> Vec<Ev> {
        let (mut c, mut s) = (Vec::new(), Vec::new());
        let mut t = 0u64;
        for _ in 0..rounds {
            for j in 0..k as u64 {
                c.push((t + 20 * j, Stage::AppSend));
                c.push((t + 20 * j + 15, Stage::MediumQueued));
            }
            // The first message is taken at once; the rest, queued by then,
            // are found and completed one by one, then returned one by one.
            s.push((t + 25, Stage::RxFound));
            s.push((t + 65, Stage::ViCompleted));
            s.push((t + 105, Stage::AppReceived));
            let mut u = t + 115;
            for _ in 1..k {
                s.push((u, Stage::RxFound));
                s.push((u + 40, Stage::ViCompleted));
                u += 50;
            }
            u -= 10;
            for _ in 1..k {
                u += 40;
                s.push((u, Stage::AppReceived));
            }
            s.push((u + 10, Stage::AppSend));
            c.push((u + 100, Stage::AppReceived));
            t = u + 1000;
        }
        super::super::timeline([&side(10, &c), &side(20, &s)], &[], Costs::default())
    }

    #[test]
    fn a_receiver_that_takes_messages_in_a_batch_is_followed_in_order() {
        let tl = batched(5, 3);
        let a = analyse(&[tl], 100, 5, false).unwrap();
        // Every message is matched: the i-th find, completion and return
        // are the i-th message's.
        assert_eq!((a.kept, a.all), (15, 15));
        let by_name = |n: &str| a.layers.iter().find(|l| l.name == n).unwrap().ns;
        // Each completion takes 40 ns, each return to the application 40
        // ns, each find 10 ns: the receiver's CPU time is cut at each
        // message's events, though a message's find, completion and return
        // are far apart.
        assert_eq!(by_name("receiver finds it (poll of the ring)"), 10.0);
        assert_eq!(by_name("VI: complete the descriptor"), 40.0);
        assert_eq!(by_name("to the application"), 40.0);
        assert_eq!(sides(&a.layers).1, 90.0);
        // The chart draws each message's find, completion and return.
        let bars = |m: usize| {
            a.chart
                .iter()
                .filter(|b| b.message == m && b.row >= 2)
                .count()
        };
        assert_eq!(bars(3), 3);
    }

    #[test]
    fn a_batch_event_is_shared_by_the_messages_it_carries() {
        // Five posts, then one frame built for all five (a batch event),
        // then a wake-up per message on the receiver.
        let (mut c, mut s) = (Vec::new(), Vec::new());
        let mut t = 0u64;
        for _ in 0..4 {
            for j in 0..5u64 {
                c.push((t + 10 * j, Stage::AppSend));
            }
            c.push((t + 100, Stage::ProtoBuilt));
            c.push((t + 150, Stage::MediumQueued));
            for j in 0..5u64 {
                s.push((t + 200 + 20 * j, Stage::RxFound));
                s.push((t + 210 + 20 * j, Stage::AppReceived));
            }
            s.push((t + 400, Stage::AppSend));
            c.push((t + 500, Stage::AppReceived));
            t += 1000;
        }
        let tl = super::super::timeline([&side(10, &c), &side(20, &s)], &[], Costs::default());
        let a = analyse(&[tl], 100, 5, false).unwrap();
        assert_eq!(a.kept, 20);
        // The 50 ns from the build to the queue, shared by five messages.
        let queue = a
            .layers
            .iter()
            .find(|l| l.name == "medium: queue the frame")
            .unwrap();
        assert_eq!(queue.ns, 10.0);
    }

    #[test]
    fn a_polling_receiver_works_from_the_call_that_returns_the_message() {
        // Kernel-UDP-like: the receiver polls with system calls (1000 ns
        // each); the datagram is handed off 300 ns into a poll that finds
        // nothing; the next call copies it 400 ns after it starts.
        let (mut c, mut s, mut k) = (Vec::new(), Vec::new(), Vec::new());
        let mut t = 0u64;
        for _ in 0..3 {
            for j in 0..2u64 {
                let send = t + 10_000 * j;
                c.push((send, Stage::AppSend));
                k.push(ev(send + 200, Point::SkDataReady, 10, 0));
                k.push(ev(send - 100, Point::SysEnter, 20, 1)); // the poll
                k.push(ev(send + 900, Point::SysEnter, 20, 1)); // the call that gets it
                let mut got = ev(send + 1300, Point::SockRecvLength, 20, 1);
                got.args[1] = 1032;
                k.push(got);
                s.push((send + 1400, Stage::AppReceived));
            }
            s.push((t + 12_000, Stage::AppSend));
            c.push((t + 12_500, Stage::AppReceived));
            t += 100_000;
        }
        k.sort_by_key(|e| e.ns);
        let tl = super::super::timeline([&side(10, &c), &side(20, &s)], &k, Costs::default());
        let a = analyse(&[tl], 1000, 2, false).unwrap();
        assert_eq!(a.kept, 6);
        let find = a
            .layers
            .iter()
            .find(|l| l.side == "recv" && l.name.starts_with("receiver finds it"))
            .unwrap();
        // From the start of the call that returned it, not the hand-off.
        assert_eq!(find.ns, 400.0);
    }

    #[test]
    fn only_the_receive_calls_that_returned_frames_carry_messages() {
        let e = |ns: u64, side, label| Ev {
            ns,
            label,
            side,
            cost: 0.0,
            stamped_first: false,
        };
        let (enter, len, exit) = (
            Label::Kernel(Point::SysEnter),
            Label::Kernel(Point::SockRecvLength),
            Label::Kernel(Point::SysExit),
        );
        let found = Label::Mark(Stage::RxFound);
        let tl = vec![
            e(0, 0, Label::Mark(Stage::AppSend)),
            e(5, 0, enter),
            // A poll that finds nothing, one that returns frames (both of
            // a coalesced send), and another empty one.
            e(10, 1, enter),
            e(11, 1, len),
            e(12, 1, exit),
            e(20, 1, enter),
            e(21, 1, len),
            e(22, 1, exit),
            e(23, 1, found),
            e(24, 1, Label::Mark(Stage::AppReceived)),
            e(30, 1, enter),
            e(31, 1, len),
            e(32, 1, exit),
            e(40, 1, Label::Mark(Stage::AppReceived)),
        ];
        let keep = receives_that_returned(&tl);
        let dropped: Vec<u64> = (0..tl.len())
            .filter(|&i| !keep[i])
            .map(|i| tl[i].ns)
            .collect();
        assert_eq!(dropped, [10, 11, 12, 30, 31, 32]);
        // A receiver that marks no frame found (kernel UDP's own loop
        // here) keeps every call.
        let bare: Vec<Ev> = tl.iter().filter(|x| x.label != found).cloned().collect();
        assert!(receives_that_returned(&bare).iter().all(|&k| k));
    }

    fn ev(ns: u64, point: Point, tgid: u32, cpu: u32) -> uvia_trace::kernel::Event {
        uvia_trace::kernel::Event {
            ns,
            point,
            tgid,
            tid: tgid,
            task: 1,
            cpu,
            args: [0, 0],
        }
    }

    #[test]
    fn lost_checkpoints_are_named_not_guessed() {
        let mut tl = stream(4, 2);
        let i = tl
            .iter()
            .position(|e| e.side == 1 && e.label == Label::Mark(Stage::AppReceived))
            .unwrap();
        tl.remove(i);
        let e = analyse(&[tl], 1, 4, false).err().unwrap().to_string();
        assert!(e.contains("checkpoints were lost"), "{e}");
    }

    fn out() -> StreamOut {
        let a = analyse(&[stream(3, 2)], 100, 3, false).unwrap();
        let ns: Vec<f64> = a.layers.iter().map(|l| l.ns).collect();
        let (bottleneck, t) = theoretical_max(100, &ns).unwrap();
        let (sender_ns, receiver_ns) = sides(&a.layers);
        StreamOut {
            command: "anatomy --stream".into(),
            provider: "shm".into(),
            mode: "polling".into(),
            size: 100,
            stream: 3,
            rounds: 2,
            pairs: 1,
            path: Vec::new(),
            layers: a.layers,
            bottleneck,
            theoretical_max_bytes_per_s: t,
            measured_bytes_per_s: t / 2.0,
            traced_bytes_per_s: a.traced_bytes_per_s,
            sender_view_bytes_per_s: t / 3.0,
            pair_ratios: vec![0.5],
            ratio: 0.5,
            sender_ns,
            receiver_ns,
            two_cpu_max_bytes_per_s: 100.0 / receiver_ns * 1e9,
            messages_kept: a.kept,
            messages: a.all,
            chart_round: a.chart_round,
            chart: a.chart,
            mark_cost_ns: 0.0,
            missing: Vec::new(),
        }
    }

    #[test]
    fn the_report_names_the_bottleneck_and_draws_each_message() {
        let s = out();
        let t = table(&s);
        assert!(t.contains("to the application"), "{t}");
        assert!(
            t.lines()
                .any(|l| l.starts_with("to the application") && l.ends_with("<- bottleneck")),
            "{t}"
        );
        assert!(t.contains("measured / theoretical: 0.50"), "{t}");
        assert!(t.contains("size / the busier side (the receiver)"), "{t}");
        let chart = text_chart(&s, 60);
        // One row per layer and the axis; each message's number appears.
        assert_eq!(chart.lines().count(), s.layers.len() + 1);
        for m in ["1", "2", "3"] {
            assert!(chart.lines().next().unwrap().contains(m), "{chart}");
        }
        let dir = std::env::temp_dir().join(format!("uvia-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = plot(&s, &dir).unwrap();
        assert_eq!(f, "anatomy-stream-shm.svg");
        let svg = std::fs::read_to_string(dir.join(&f)).unwrap();
        assert!(svg.contains("receiver: to the application"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
