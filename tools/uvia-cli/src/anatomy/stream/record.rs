//! The stream's two processes: the server that takes the rounds and
//! acks each, and the client that sends them and starts the server.

use super::{config, Spec, ACK, STREAM_BYTE};
use crate::endpoint::Endpoint;
use crate::run::{self, ChildGuard, Plan};
use crate::{pin, tracefile};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

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
