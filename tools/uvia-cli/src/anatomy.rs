//! `uvia anatomy`: where a message's one-way time goes, stage by stage,
//! from the sender's call to the receiver's return, as the source
//! documents' Tables I-III did for UDP and M-VIA.
//!
//! One ping-pong runs with the library's checkpoints recorded in both
//! processes and the kernel's tracepoints recorded by BPF programs, all on
//! `CLOCK_MONOTONIC`. Each one-way message (both directions) becomes a
//! chain of events: the sender's, forward from its send call up to the
//! moment the message is the receiver's to find (the socket or AF_XDP ring
//! is told it has data, or the shared-memory ring holds it), then the
//! receiver's, from where it found the message up to its return. The time
//! between two neighbouring events is a stage. Messages whose chain has the
//! most common shape are kept; each stage's median is reported, with the
//! checkpoints' own cost (measured at start) taken out of it.
//!
//! Each round has three slices of one ping-pong, in one pair of processes:
//! untraced (the kernel's programs detached), with the checkpoints alone,
//! and traced. The first gives the
//! one-way latency the stages should add up to; the second, beside the
//! third, what the kernel's events cost on the message's path, which is
//! taken out of the stages they fall in.

use crate::run::{self, Plan};
use crate::tracefile::{self, SideTrace};
use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use uvia_trace::kernel::{Costs, Event, KernelTracer, Point};
use uvia_trace::Stage;

pub mod compare;
mod plot;
pub mod stream;

/// The source documents' categories (000's Table III, with data movement
/// named as 004 does), in their order.
pub const CATEGORIES: [&str; 6] = [
    "user application",
    "protocol processing (send)",
    "protocol processing (recv)",
    "OS overhead (send)",
    "OS overhead (recv)",
    "data movement",
];

/// The kernel tracepoints an anatomy records.
pub const POINTS: [Point; 12] = [
    Point::SysEnter,
    Point::SysExit,
    Point::NetDevQueue,
    Point::NetDevStartXmit,
    Point::NetDevXmit,
    Point::NetifRx,
    Point::SoftirqEntry,
    Point::NetifReceiveSkb,
    Point::XdpRedirect,
    Point::SkDataReady,
    Point::SkbCopyDatagramIovec,
    Point::SockRecvLength,
];

/// The receive softirq's vector.
const NET_RX_SOFTIRQ: u64 = 3;

/// An event on the time line: a checkpoint or a kernel event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Label {
    Mark(Stage),
    Kernel(Point),
}

impl Label {
    pub fn name(self) -> &'static str {
        match self {
            Label::Mark(s) => s.name(),
            Label::Kernel(p) => p.name(),
        }
    }
}

/// Which process an event belongs to: 0 the client, 1 the server.
type Side = usize;

#[derive(Clone, Copy, Debug)]
pub struct Ev {
    pub ns: u64,
    pub label: Label,
    pub side: Side,
    /// What recording it cost, in nanoseconds.
    pub cost: f64,
    /// Whether its timestamp was taken before its cost (a checkpoint) or
    /// after (a kernel event).
    pub stamped_first: bool,
}

/// The source documents' categories (000's Table III, with data movement
/// named as 004 does).
/// `xsk`: the receiving socket is an AF_XDP socket (the xdp provider).
fn category(from: Label, to: Label, xsk: bool) -> (&'static str, &'static str) {
    use Label::{Kernel as K, Mark as M};
    use Point::*;
    use Stage::*;
    const APP: &str = "user application";
    const PSEND: &str = "protocol processing (send)";
    const PRECV: &str = "protocol processing (recv)";
    const OSEND: &str = "OS overhead (send)";
    const ORECV: &str = "OS overhead (recv)";
    const DATA: &str = "data movement";
    match (from, to) {
        (M(AppSend), M(ViPosted)) => ("VI: check and queue the descriptor", APP),
        (M(AppSend), M(ProtoBuilt)) => ("VI: build the message, copy the payload", PSEND),
        (M(AppSend), M(SyscallEnter)) => ("application to the send call", APP),
        (M(ViPosted), M(ProtoBuilt)) => ("engine: build the frame, gather the payload", PSEND),
        (M(ProtoBuilt), M(MediumQueued)) => ("medium: queue the frame", PSEND),
        (M(MediumQueued), M(SyscallEnter)) => ("medium: to the system call", PSEND),
        (M(SyscallEnter), K(SysEnter)) => ("system call entry", OSEND),
        (K(SysEnter), K(NetDevQueue)) => (
            "socket, transport (UDP or TCP) and IP send, payload copied",
            PSEND,
        ),
        (K(SysEnter), K(NetifRx)) => ("AF_XDP transmit: frame into an skb, device transmit", DATA),
        (K(NetDevQueue), K(NetDevStartXmit)) => ("device layer, queueing discipline", PSEND),
        (K(NetDevStartXmit), K(NetifRx)) => ("device transmit (the virtual wire)", DATA),
        (K(NetifRx), K(NetDevXmit)) => ("device transmit returns", PSEND),
        (_, K(SoftirqEntry)) => ("receive softirq starts", ORECV),
        (K(SoftirqEntry), K(NetifReceiveSkb)) => ("net_rx_action, backlog poll", ORECV),
        (K(NetifReceiveSkb), K(XdpRedirect)) => ("generic XDP hook, program, redirect", PRECV),
        (K(XdpRedirect), K(SkDataReady)) => ("copy into the UMEM, rx ring, wake-up", DATA),
        (K(NetifReceiveSkb), K(SkDataReady)) if xsk => (
            "generic XDP hook and redirect, copy into the UMEM, rx ring",
            PRECV,
        ),
        (K(NetifReceiveSkb), K(SkDataReady)) => {
            ("IP and transport (UDP or TCP) receive, socket queue", PRECV)
        }
        (_, K(SkbCopyDatagramIovec)) => {
            ("receiver finds it (poll or wake-up), socket receive", ORECV)
        }
        (K(SkbCopyDatagramIovec), K(SockRecvLength)) => {
            ("copy to the user, socket receive ends", DATA)
        }
        (_, K(SockRecvLength)) => (
            "receiver finds it (poll or wake-up), socket receive, copy",
            ORECV,
        ),
        (_, K(SysExit)) => ("system call exit", ORECV),
        (K(SysExit), M(RxFound)) => ("system call return", ORECV),
        (_, M(RxFound)) => ("receiver finds it (poll of the ring)", APP),
        (_, M(ProtoIn)) => ("medium: frame to its VI", PRECV),
        (_, M(ProtoPlaced)) => ("engine: checks, payload placed", PRECV),
        (_, M(ViCompleted)) => ("VI: complete the descriptor", PRECV),
        (_, M(AppReceived)) => ("to the application", APP),
        (M(AppReceived), M(AppSend)) => ("application turn-around: the server's (half)", APP),
        (_, K(SysEnter)) => ("to the system call", OSEND),
        _ => ("", ""),
    }
}

/// One stage of the chain.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StageOut {
    pub name: String,
    pub from: String,
    pub to: String,
    pub category: String,
    pub side: String,
    pub ns: f64,
    pub cycles: f64,
    pub measured: bool,
}

/// The JSON of `uvia anatomy`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Anatomy {
    pub provider: String,
    pub size: usize,
    /// Median one-way latency of the untraced ping-pong.
    pub one_way_ns: f64,
    /// Median one-way latency of the traced ping-pong (tracing included).
    pub traced_one_way_ns: f64,
    /// Median one-way latency of a ping-pong with the checkpoints
    /// recorded and the kernel's tracepoints detached.
    #[serde(default)]
    pub marks_one_way_ns: f64,
    /// The measured stages' medians, summed.
    pub sum_ns: f64,
    /// Per round of runs, the traced run's stages summed over the untraced
    /// run's one-way latency.
    pub pair_ratios: Vec<f64>,
    /// Their median. (Each round's stages follow that round's most common
    /// path; the table's stages, the most common path of all rounds, can
    /// leave out the rounds of a machine phase in which another path was
    /// the usual one, so their sum over the rounds' median one-way time is
    /// the less steady figure.)
    pub ratio: f64,
    pub stages: Vec<StageOut>,
    /// Messages (both directions) whose chain had the common shape, of all.
    pub messages_kept: usize,
    pub messages: usize,
    /// What a checkpoint costs, timed at start-up.
    pub mark_cost_ns: f64,
    /// What a checkpoint costs on the message's path (taken out of the
    /// stages): the checkpoints-only one-way time less the untraced one,
    /// over the checkpoints in a one-way time.
    #[serde(default)]
    pub mark_path_cost_ns: f64,
    /// What a kernel event costs on calibration loops (a system call's
    /// entry or exit on getppid, any other on a loopback datagram).
    pub syscall_event_cost_ns: f64,
    pub kernel_event_cost_ns: f64,
    /// Kernel events inside a followed message's stages (its own and those
    /// that interrupt it), on average.
    #[serde(default)]
    pub kernel_events_per_message: f64,
    /// What the kernel events cost a message on its path: the traced
    /// one-way latency less that with the checkpoints alone. Shared out
    /// among the events in the calibration loops' proportions and taken
    /// out of the stages they fall in.
    #[serde(default)]
    pub kernel_events_path_ns: f64,
    /// Tracepoints this kernel lacks.
    pub missing: Vec<String>,
}

/// Puts checkpoints and kernel events of both sides on one time line.
/// Kernel events are the side's whose process they ran in; those of other
/// contexts (a softirq in an idle task) the side whose CPU they ran on.
pub fn timeline(traces: [&SideTrace; 2], events: &[Event], costs: Costs) -> Vec<Ev> {
    let mut out = Vec::new();
    for (side, t) in traces.iter().enumerate() {
        out.extend(t.marks.iter().map(|m| Ev {
            ns: m.ns,
            label: Label::Mark(m.stage),
            side,
            cost: t.mark_cost_ns,
            stamped_first: true,
        }));
    }
    // Each side's usual CPU, from the events of its own process.
    let mut cpu_of = [None::<u32>; 2];
    for (side, t) in traces.iter().enumerate() {
        let mut count: HashMap<u32, usize> = HashMap::new();
        for e in events.iter().filter(|e| e.tgid == t.pid) {
            *count.entry(e.cpu).or_default() += 1;
        }
        cpu_of[side] = count.into_iter().max_by_key(|&(_, n)| n).map(|(c, _)| c);
    }
    for e in events {
        if matches!(e.point, Point::SoftirqEntry | Point::SoftirqExit)
            && e.args[0] != NET_RX_SOFTIRQ
        {
            continue;
        }
        // A receive that found nothing (a poll) is not on any message's
        // path. The length is the tracepoint's `int`, which a raw
        // tracepoint passes in 64 bits without its sign: -EAGAIN arrives as
        // 0xffff_fff5.
        if e.point == Point::SockRecvLength && e.args[1] as u32 as i32 <= 0 {
            continue;
        }
        let side = if e.tgid == traces[0].pid {
            Some(0)
        } else if e.tgid == traces[1].pid {
            Some(1)
        } else {
            cpu_of.iter().position(|&c| c == Some(e.cpu))
        };
        if let Some(side) = side {
            out.push(Ev {
                ns: e.ns,
                label: Label::Kernel(e.point),
                side,
                cost: costs.of(e.point),
                stamped_first: false,
            });
        }
    }
    out.sort_by_key(|e| e.ns);
    out
}

/// Whether `l` hands the message to the receiver: the socket (or AF_XDP
/// socket) is told it has data, or the shared-memory ring holds it.
fn is_handoff(l: Label) -> bool {
    matches!(
        l,
        Label::Kernel(Point::SkDataReady) | Label::Mark(Stage::MediumQueued)
    )
}

/// Where the receiver's part starts, best first: its copy out of a socket
/// (where the kernel traces it; a copy that checks the checksum as it goes
/// is not traced), the end of the socket receive that returned it, or its
/// finding the message in a ring. The receiver's calls before that are
/// polls that found nothing, or a wait.
const RECEIVER_START: [Label; 3] = [
    Label::Kernel(Point::SkbCopyDatagramIovec),
    Label::Kernel(Point::SockRecvLength),
    Label::Mark(Stage::RxFound),
];

/// One message's chain: its events, and each stage's time with the
/// tracing's cost inside it taken out.
#[derive(Clone, Debug)]
pub(crate) struct Chain {
    pub labels: Vec<Label>,
    /// Whether each event is the sender's.
    pub sides: Vec<bool>,
    pub stage_ns: Vec<f64>,
    /// Kernel events whose cost was taken out of the stages: system
    /// calls' entries and exits, and the others.
    pub kernel_events: [usize; 2],
    /// The sender is the client (side 0), whose round trips are timed.
    pub from_client: bool,
}

/// Which events of a time line one message's chain may use.
pub(crate) struct Span {
    /// The sender's send call (an AppSend).
    pub start: usize,
    /// The receiver's return with the message (an AppReceived).
    pub end: usize,
    /// The sender's events before this one are its own (in a stream the
    /// next message's send call; in a ping-pong past `end`).
    pub send_until: usize,
    /// The receiver's events after this one are its own (in a stream its
    /// return with the message before; in a ping-pong `start`).
    pub recv_after: usize,
    /// An event after `end` that closes the chain (the receiver's reply).
    pub reply: Option<usize>,
}

/// The chain of the message of `span`, if it can be followed through the
/// hand-off to the receiver.
pub(crate) fn follow(tl: &[Ev], span: &Span) -> Option<Chain> {
    let s = tl[span.start].side;
    let r = 1 - s;
    let mine = |j: usize| {
        let e = &tl[j];
        (j <= span.end
            && ((e.side == s && j < span.send_until) || (e.side == r && j > span.recv_after)))
            || Some(j) == span.reply
    };
    let own: Vec<usize> = (span.start..=span.end).filter(|&j| mine(j)).collect();
    let rx_start = RECEIVER_START.iter().find_map(|&l| {
        own.iter()
            .rposition(|&j| tl[j].side == r && tl[j].label == l)
    })?;
    // The hand-off: the sender's last before the receiver's start.
    let handoff = own[..rx_start]
        .iter()
        .rposition(|&j| tl[j].side == s && is_handoff(tl[j].label))?;
    let mut picked: Vec<usize> = Vec::new();
    let mut seen: Vec<Label> = Vec::new();
    for &j in &own[..=handoff] {
        if tl[j].side == s && !seen.contains(&tl[j].label) {
            seen.push(tl[j].label);
            picked.push(j);
        }
    }
    seen.clear();
    for &j in &own[rx_start..] {
        if tl[j].side == r && !seen.contains(&tl[j].label) {
            seen.push(tl[j].label);
            picked.push(j);
        }
    }
    picked.extend(span.reply);
    let mut stage_ns = Vec::new();
    let mut kernel_events = [0, 0];
    for w in picked.windows(2) {
        let (a, b) = (w[0], w[1]);
        let side = tl[b].side;
        // The tracing's own cost inside the stage, on the side that waits
        // for its end: checkpoints cost after their stamp, kernel events
        // before theirs.
        let inside = (a..=b)
            .filter(|&j| mine(j) && tl[j].side == side)
            .filter(|&j| if tl[j].stamped_first { j < b } else { j > a });
        let mut cost = 0.0;
        for j in inside {
            cost += tl[j].cost;
            match tl[j].label {
                Label::Kernel(Point::SysEnter | Point::SysExit) => kernel_events[0] += 1,
                Label::Kernel(_) => kernel_events[1] += 1,
                Label::Mark(_) => {}
            }
        }
        // Not clamped here: a short stage less a cost it did not quite
        // have comes out below zero in some messages, and cutting those
        // off would lift the median above what the stage takes.
        let raw = (tl[b].ns - tl[a].ns) as f64;
        stage_ns.push(raw - cost);
    }
    Some(Chain {
        labels: picked.iter().map(|&j| tl[j].label).collect(),
        sides: picked.iter().map(|&j| tl[j].side == s).collect(),
        stage_ns,
        kernel_events,
        from_client: s == 0,
    })
}

/// The chain of the ping-pong message sent at `tl[start]` (an AppSend),
/// if it can be followed to the other side's AppReceived; with the
/// receiver's turn-around to its reply's send call, part of every one-way
/// time a ping-pong measures.
fn chain(tl: &[Ev], start: usize) -> Option<Chain> {
    let s = tl[start].side;
    let r = 1 - s;
    let end = start
        + tl[start..]
            .iter()
            .position(|e| e.side == r && e.label == Label::Mark(Stage::AppReceived))?;
    let reply = tl[end + 1..]
        .iter()
        .take_while(|e| !(e.side == s && e.label == Label::Mark(Stage::AppSend)))
        .position(|e| e.side == r && e.label == Label::Mark(Stage::AppSend))
        .map(|k| end + 1 + k);
    follow(
        tl,
        &Span {
            start,
            end,
            send_until: end + 1,
            recv_after: start,
            reply,
        },
    )
}

/// The chains of the most common shape (events and sides) among `chains`.
pub(crate) fn common_shape(chains: &[Chain]) -> Vec<&Chain> {
    let mut shapes: HashMap<(&[Label], &[bool]), usize> = HashMap::new();
    for c in chains {
        *shapes.entry((&c.labels, &c.sides)).or_default() += 1;
    }
    // The most common; among equals, the longest path, then by name, so
    // that the choice does not depend on the map's order.
    let Some((labels, sides)) = shapes
        .into_iter()
        .max_by(|a, b| {
            (a.1, a.0 .0.len())
                .cmp(&(b.1, b.0 .0.len()))
                .then_with(|| names(b.0 .0).cmp(&names(a.0 .0)))
        })
        .map(|(k, _)| k)
    else {
        return Vec::new();
    };
    chains
        .iter()
        .filter(|c| c.labels == labels && c.sides == sides)
        .collect()
}

fn names(l: &[Label]) -> Vec<&'static str> {
    l.iter().map(|x| x.name()).collect()
}

/// A stage's name and category: the stage from `from` to `to`, ending on
/// the sender's side when `send`.
pub(crate) fn describe(from: Label, to: Label, send: bool, xsk: bool) -> (String, &'static str) {
    let (name, cat) = category(from, to, xsk);
    let cat = match (cat, send) {
        ("", true) => "protocol processing (send)",
        ("", false) => "protocol processing (recv)",
        (c, _) => c,
    };
    let name = if name.is_empty() {
        format!("{} to {}", from.name(), to.name())
    } else {
        name.to_string()
    };
    (name, cat)
}

/// The stages of every message on the time line, reduced to the medians of
/// the most common chain, read on a clock that moves in steps of `step_ns`
/// (see [`crate::stats::fine_median`]). Returns the stages, the messages
/// kept, and all.
pub fn stages(
    runs: &[Vec<Ev>],
    ticks_per_ns: f64,
    step_ns: f64,
    xsk: bool,
) -> (Vec<StageOut>, usize, usize) {
    let (chains, all) = chains(runs);
    let same = common_shape(&chains);
    let mut out = summarize(&same, ticks_per_ns, step_ns, xsk);
    if !out.is_empty() {
        // The client's own stretches inside the round trips it times.
        let [to_send, from_recv] = client_timer(runs, step_ns);
        let row = |from: Stage, to: Stage, name: &str, side: &str, ns: f64| StageOut {
            name: name.into(),
            from: from.name().into(),
            to: to.name().into(),
            category: "user application".into(),
            side: side.into(),
            ns,
            cycles: ns * ticks_per_ns,
            measured: true,
        };
        if let Some(ns) = to_send {
            let name = "client: loop to the send call (half)";
            out.insert(0, row(Stage::AppClock, Stage::AppSend, name, "send", ns));
        }
        if let Some(ns) = from_recv {
            let name = "client: receive's return to the next send (half)";
            out.push(row(Stage::AppReceived, Stage::AppClock, name, "recv", ns));
        }
    }
    (out, same.len(), all)
}

/// The client's stretches inside the round trips it times that no
/// message's chain holds: from its receive's return to the mark before
/// its next send, and from that mark to the send call (the clock is read
/// after the send, outside the round trip). Half of each belongs to a
/// one-way time (half the round trip), as their medians show.
fn client_timer(runs: &[Vec<Ev>], step_ns: f64) -> [Option<f64>; 2] {
    let (mut to_send, mut from_recv) = (Vec::new(), Vec::new());
    for tl in runs {
        let client: Vec<&Ev> = tl.iter().filter(|e| e.side == 0).collect();
        let marks: Vec<usize> = (0..client.len())
            .filter(|&i| matches!(client[i].label, Label::Mark(_)))
            .collect();
        for w in marks.windows(2) {
            let (a, b) = (client[w[0]], client[w[1]]);
            let into = match (a.label, b.label) {
                (Label::Mark(Stage::AppClock), Label::Mark(Stage::AppSend)) => &mut to_send,
                (Label::Mark(Stage::AppReceived), Label::Mark(Stage::AppClock)) => &mut from_recv,
                _ => continue,
            };
            // The first checkpoint's cost and any kernel event's between.
            let cost: f64 = client[w[0]..w[1]].iter().map(|e| e.cost).sum();
            into.push((b.ns - a.ns) as f64 - cost);
        }
    }
    let half =
        |v: &[f64]| (!v.is_empty()).then(|| (crate::stats::fine_median(v, step_ns) / 2.0).max(0.0));
    [half(&to_send), half(&from_recv)]
}

/// Every ping-pong message's chain on the time lines, and how many
/// messages were sent. Chains are followed within one run's time line: a
/// message sent at the end of one run is not received in the next.
fn chains(runs: &[Vec<Ev>]) -> (Vec<Chain>, usize) {
    let chains = runs
        .iter()
        .flat_map(|tl| {
            tl.iter()
                .enumerate()
                .filter(|(_, e)| e.label == Label::Mark(Stage::AppSend))
                .filter_map(|(i, _)| chain(tl, i))
        })
        .collect();
    let all = runs
        .iter()
        .flatten()
        .filter(|e| e.label == Label::Mark(Stage::AppSend))
        .count();
    (chains, all)
}

/// The kernel events inside the stages of a message of the common shape,
/// on average: system calls' entries and exits, and the others.
pub fn path_events(runs: &[Vec<Ev>]) -> [f64; 2] {
    let (chains, _) = chains(runs);
    let same = common_shape(&chains);
    let n = same.len().max(1) as f64;
    let count = |k: usize| same.iter().map(|c| c.kernel_events[k]).sum::<usize>() as f64 / n;
    [count(0), count(1)]
}

/// The checkpoints whose cost falls in a one-way time, as the stages take
/// it out: each that starts a stage of a message of the common shape and
/// is on the side that waits for the stage's end (a sender's checkpoint
/// after the message has left runs while the receiver works), the
/// server's turn-around counting half; and the client's mark before its
/// send, half (the one after its clock read runs while the message is on
/// its way).
pub fn path_marks(runs: &[Vec<Ev>]) -> f64 {
    let (chains, _) = chains(runs);
    let same = common_shape(&chains);
    let Some(c) = same.first() else {
        return 0.0;
    };
    let turn_around = (Label::Mark(Stage::AppReceived), Label::Mark(Stage::AppSend));
    let mut n = 0.5;
    for k in 0..c.labels.len().saturating_sub(1) {
        if matches!(c.labels[k], Label::Mark(_)) && c.sides[k] == c.sides[k + 1] {
            n += if (c.labels[k], c.labels[k + 1]) == turn_around {
                0.5
            } else {
                1.0
            };
        }
    }
    n
}

/// What each kernel event costs on a message's path: the calibration
/// loops' costs, scaled so that the events of a message (`events`, as
/// [`path_events`] counts them) cost `path_ns` in all. The loops time an
/// event in a tight repetition; inside a ping-pong the same event costs
/// less or more (caches, the other CPU), and only the path itself shows
/// how much.
pub fn path_costs(calibrated: Costs, events: [f64; 2], path_ns: f64) -> Costs {
    let weighed = events[0] * calibrated.syscall + events[1] * calibrated.other;
    let n = events[0] + events[1];
    if path_ns <= 0.0 || n <= 0.0 {
        return Costs::default();
    }
    if weighed <= 0.0 {
        // No calibration to weigh by: every event alike.
        return Costs {
            syscall: path_ns / n,
            other: path_ns / n,
        };
    }
    let f = path_ns / weighed;
    Costs {
        syscall: calibrated.syscall * f,
        other: calibrated.other * f,
    }
}

/// Each stage's median over chains of one shape.
pub(crate) fn summarize(
    same: &[&Chain],
    ticks_per_ns: f64,
    step_ns: f64,
    xsk: bool,
) -> Vec<StageOut> {
    let Some(first) = same.first() else {
        return Vec::new();
    };
    let (labels, sides) = (&first.labels, &first.sides);
    let mut out = Vec::new();
    for k in 0..labels.len() - 1 {
        let (from, to) = (labels[k], labels[k + 1]);
        let turn_around =
            (from, to) == (Label::Mark(Stage::AppReceived), Label::Mark(Stage::AppSend));
        let ns = if turn_around {
            // The client times a round trip from its send call to its
            // receive's return: the server's turn-around is inside it, the
            // client's own is not. Half a round trip is the one-way time,
            // so half the server's turn-around belongs to each message.
            let server: Vec<f64> = same
                .iter()
                .filter(|c| c.from_client)
                .map(|c| c.stage_ns[k])
                .collect();
            crate::stats::fine_median(&server, step_ns) / 2.0
        } else {
            let v: Vec<f64> = same.iter().map(|c| c.stage_ns[k]).collect();
            crate::stats::fine_median(&v, step_ns)
        }
        .max(0.0);
        let (name, cat) = describe(from, to, sides[k + 1], xsk);
        out.push(StageOut {
            name,
            from: from.name().into(),
            to: to.name().into(),
            category: cat.into(),
            side: if sides[k + 1] { "send" } else { "recv" }.into(),
            ns,
            cycles: ns * ticks_per_ns,
            measured: true,
        });
    }
    out
}

/// Prints a line of progress on stderr: above the bar when one is drawn (a
/// hidden bar, as when stderr is not a terminal, would drop the line).
pub(crate) fn say(pb: Option<&ProgressBar>, line: String) {
    match pb {
        Some(p) if !p.is_hidden() => p.println(line),
        _ => eprintln!("{line}"),
    }
}

/// An error that says how to build a uvia with checkpoints, in one without.
pub fn require_checkpoints() -> Result<()> {
    if !uvia_trace::COMPILED_IN {
        bail!(
            "this uvia was built without checkpoints; build one with them:\n  \
             cargo build --release -p uvia-cli --features trace --target-dir target/trace\n\
             and run target/trace/release/uvia anatomy ..."
        );
    }
    Ok(())
}

/// What a traced measurement needs: checkpoints compiled in, a folder the
/// two processes write their traces to, and the kernel's tracer.
pub(crate) struct Tracing {
    dir: std::path::PathBuf,
    pub tracer: KernelTracer,
    _cleanup: RemoveOnDrop,
}

/// What a slice of an anatomy's measurement records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slice {
    /// Nothing: the kernel's programs detached, the checkpoints off.
    Plain,
    /// The library's checkpoints alone.
    Marks,
    /// The checkpoints and the kernel's events.
    Traced,
}

/// One traced run: both sides' checkpoints and the kernel's events.
pub(crate) struct Traces {
    pub client: SideTrace,
    pub server: SideTrace,
    pub events: Vec<Event>,
}

impl Traces {
    /// Checkpoints and kernel events on one time line, with no cost
    /// counted for the kernel events.
    pub fn timeline(&self) -> Vec<Ev> {
        self.timeline_with(Costs::default())
    }

    /// Checkpoints and kernel events on one time line, the kernel events
    /// costing `costs`.
    pub fn timeline_with(&self, costs: Costs) -> Vec<Ev> {
        timeline([&self.client, &self.server], &self.events, costs)
    }
}

impl Tracing {
    /// Checks the build and the environment and attaches the kernel's
    /// tracer, with room for about `messages` messages' events per CPU.
    pub fn open(messages: usize) -> Result<Tracing> {
        require_checkpoints()?;
        if std::env::var_os("UVIA_TRACE_DIR").is_some() {
            bail!("UVIA_TRACE_DIR is set: uvia anatomy chooses where its traces go");
        }
        let dir = std::env::temp_dir().join(format!("uvia-anatomy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("making {}", dir.display()))?;
        let cleanup = RemoveOnDrop(dir.clone());
        // Room for the polling loops' system calls as well.
        let tracer = KernelTracer::open(&POINTS, (messages * 400).clamp(1 << 16, 1 << 21))
            .context("uvia anatomy")?;
        Ok(Tracing {
            dir,
            tracer,
            _cleanup: cleanup,
        })
    }

    /// A line on what is traced and what an event costs.
    pub fn describe(&self) -> String {
        format!(
            "{} kernel tracepoints; an event costs {:.0} ns, a system call's {:.0} ns",
            self.tracer.attached().len(),
            self.tracer.costs().other,
            self.tracer.costs().syscall
        )
    }

    /// Runs `measure` (a two-process run that calls the function it is
    /// given with the server's process id) with both processes' checkpoints
    /// and the kernel's events recorded; returns its result and the traces.
    pub fn run<T>(
        &mut self,
        pb: Option<&ProgressBar>,
        measure: impl FnOnce(&dyn Fn(u32) -> Result<()>) -> Result<T>,
    ) -> Result<(T, Traces)> {
        self.tracer.take();
        // The child inherits the variable; this process reads it too.
        std::env::set_var("UVIA_TRACE_DIR", &self.dir);
        let tracer = &self.tracer;
        let r = measure(&|pid| {
            tracer
                .watch(pid)
                .context("watching the server's system calls")
        });
        std::env::remove_var("UVIA_TRACE_DIR");
        let r = r?;
        let (events, lost) = self.tracer.take();
        if lost > 0 {
            say(
                pb,
                format!("anatomy: warning: {lost} kernel events did not fit and are missing"),
            );
        }
        Ok((r, self.read(pb, None, events)?))
    }

    /// Both sides' traces of a slice (or of a run without slices), with
    /// the kernel's events.
    fn read(
        &self,
        pb: Option<&ProgressBar>,
        slice: Option<usize>,
        events: Vec<Event>,
    ) -> Result<Traces> {
        let client = tracefile::read(&self.dir, "client", slice)?;
        let server = tracefile::read(&self.dir, "server", slice)?;
        if client.dropped + server.dropped > 0 {
            say(
                pb,
                format!(
                    "anatomy: warning: {} checkpoints did not fit and are missing",
                    client.dropped + server.dropped
                ),
            );
        }
        Ok(Traces {
            client,
            server,
            events,
        })
    }

    /// Runs `plan` (a ping-pong whose sizes are the slices, in order) in
    /// one pair of processes, each slice recorded as `slices` says: the
    /// kernel's programs are attached only for a traced slice and the
    /// checkpoints record only in a traced or checkpoints-only one. The
    /// switch happens between slices, before a slice's warm-up. `done` is
    /// called with each slice's position as it ends. Returns the run and,
    /// for each traced slice, its traces.
    pub fn run_slices(
        &mut self,
        plan: &Plan,
        slices: &[Slice],
        pb: Option<&ProgressBar>,
        done: &mut dyn FnMut(usize),
    ) -> Result<(run::RunResult, Vec<Option<Traces>>)> {
        if slices.len() != plan.sizes.len() {
            bail!(
                "internal: {} slices for {} sizes",
                slices.len(),
                plan.sizes.len()
            );
        }
        let recording: Vec<String> = (0..slices.len())
            .filter(|&i| slices[i] != Slice::Plain)
            .map(|i| i.to_string())
            .collect();
        self.tracer.pause();
        self.tracer.take();
        let mut events: Vec<Option<Vec<Event>>> = vec![None; slices.len()];
        let mut lost = 0;
        // The children inherit the variables; this process reads them too.
        std::env::set_var("UVIA_TRACE_DIR", &self.dir);
        std::env::set_var("UVIA_TRACE_SLICES", recording.join(","));
        let tracer = std::cell::RefCell::new(&mut self.tracer);
        // Ends slice `i` (its events taken, the programs detached) and,
        // when there is one, readies slice `i + 1`.
        let mut turn = |i: Option<usize>, next: Option<usize>| -> Result<()> {
            let mut t = tracer.borrow_mut();
            t.pause();
            let (ev, l) = t.take();
            if let Some(i) = i {
                if slices[i] == Slice::Traced {
                    events[i] = Some(ev);
                    lost += l;
                }
                done(i);
            }
            if next.is_some_and(|n| slices[n] == Slice::Traced) {
                t.resume()?;
            }
            Ok(())
        };
        let r = run::run_sliced(
            plan,
            &|pid| {
                tracer
                    .borrow()
                    .watch(pid)
                    .context("watching the server's system calls")
            },
            &mut |i| turn(i.checked_sub(1), Some(i)),
        )
        .and_then(|r| turn(Some(slices.len() - 1), None).map(|()| r));
        std::env::remove_var("UVIA_TRACE_DIR");
        std::env::remove_var("UVIA_TRACE_SLICES");
        let resumed = self.tracer.resume();
        let r = r?;
        resumed?;
        if lost > 0 {
            say(
                pb,
                format!("anatomy: warning: {lost} kernel events did not fit and are missing"),
            );
        }
        let mut traces = Vec::with_capacity(slices.len());
        for (i, ev) in events.into_iter().enumerate() {
            traces.push(match ev {
                Some(ev) => Some(self.read(pb, Some(i), ev)?),
                None => None,
            });
        }
        Ok((r, traces))
    }

    /// The tracepoints this kernel lacks.
    pub fn missing(&self) -> Vec<String> {
        self.tracer
            .missing()
            .iter()
            .map(|(p, why)| format!("{}: {why}", p.name()))
            .collect()
    }
}

/// Runs the anatomy of `plan` (one size): `pairs` times an untraced
/// ping-pong, then a traced one. With a bar, each pair moves it on and
/// what would be printed goes above it.
pub fn run(plan: &Plan, pairs: usize, pb: Option<&ProgressBar>) -> Result<Anatomy> {
    let [size] = plan.sizes[..] else {
        bail!("internal: an anatomy measures one size");
    };
    // Room for the warm-up's events as well as the measured ones'.
    let mut tracing = Tracing::open(plan.iters[0] + plan.warmup[0])?;
    say(
        pb,
        format!(
            "anatomy: {} {} B, {pairs} rounds of an untraced ping-pong, one with the checkpoints alone and a traced one ({})",
            plan.provider.name(),
            size,
            tracing.describe()
        ),
    );
    let xsk = plan.provider == crate::run::Provider::Xdp;
    // Each round is an untraced slice, one with the checkpoints alone and
    // a traced one, all in one pair of processes, so the three see the
    // same placement of the processes on the machine's cores and the same
    // phase of its other work. The order turns from round to round, so no
    // kind of slice always follows the same other. The second kind shows
    // what the kernel's events cost the third.
    let order = [Slice::Plain, Slice::Marks, Slice::Traced];
    let slices: Vec<Slice> = (0..pairs)
        .flat_map(|r| (0..3).map(move |k| order[(r + k) % 3]))
        .collect();
    let n = slices.len();
    let sliced = Plan {
        sizes: vec![size; n],
        iters: vec![plan.iters[0]; n],
        warmup: vec![plan.warmup[0]; n],
        ..plan.clone()
    };
    let (result, mut traced) = tracing.run_slices(&sliced, &slices, pb, &mut |i| {
        if let (Some(p), 2) = (pb, i % 3) {
            p.inc(1);
        }
    })?;
    let p50 = |i: usize| result.results[i].lat_ns.p50;
    let step_ticks = uvia_trace::counter_step() as f64;
    let (mut one_way, mut marks_one_way, mut traced_one_way) = (vec![], vec![], vec![]);
    let mut traces = Vec::new();
    // Per round, the checkpoints and kernel events on a message's path
    // (counting does not depend on what they cost).
    let (mut marks_on_path, mut events_on_path) = (vec![], vec![]);
    for r in 0..pairs {
        let at = |kind| r * 3 + (0..3).find(|&k| order[(r + k) % 3] == kind).unwrap_or(0);
        let t = traced[at(Slice::Traced)]
            .take()
            .ok_or_else(|| anyhow::anyhow!("internal: a traced slice without its traces"))?;
        let tl = [t.timeline()];
        let marks = path_marks(&tl);
        if marks == 0.0 {
            bail!(
                "no message could be followed from sender to receiver ({} checkpoints, {} kernel events)",
                t.client.marks.len() + t.server.marks.len(),
                t.events.len()
            );
        }
        marks_on_path.push(marks);
        events_on_path.push(path_events(&tl));
        one_way.push(p50(at(Slice::Plain)));
        marks_one_way.push(p50(at(Slice::Marks)));
        traced_one_way.push(p50(at(Slice::Traced)));
        traces.push(t);
    }
    // What the checkpoints and the kernel events cost on the path, from the
    // rounds' medians: the rounds share a pair of processes, and one
    // slice's noise would otherwise move its round's figure. A checkpoint's
    // share is the checkpoints-only slice's one-way time less the untraced
    // one's, over the checkpoints in a one-way time ([`path_marks`]). The
    // figure timed at start-up is reported beside it: timed in a loop, it
    // moves with what the other core is doing (5 to 14 ns here, where the
    // path shows 5 to 9).
    let calibrated = tracing.tracer.costs();
    let ticks_per_ns = traces[0].client.ticks_per_ns;
    let step_ns = step_ticks / ticks_per_ns;
    let startup_mark_ns = traces[0].client.mark_cost_ns;
    let rounds_median =
        |f: &dyn Fn(usize) -> f64| crate::stats::median(&(0..pairs).map(f).collect::<Vec<_>>());
    let mark_path_ns =
        rounds_median(&|i| (marks_one_way[i] - one_way[i]).max(0.0) / marks_on_path[i]);
    for t in &mut traces {
        t.client.mark_cost_ns = mark_path_ns;
        t.server.mark_cost_ns = mark_path_ns;
    }
    let path_ns = rounds_median(&|i| (traced_one_way[i] - marks_one_way[i]).max(0.0));
    let events = [
        rounds_median(&|i| events_on_path[i][0]),
        rounds_median(&|i| events_on_path[i][1]),
    ];
    let costs = path_costs(calibrated, events, path_ns);
    let runs: Vec<Vec<Ev>> = traces.iter().map(|t| t.timeline_with(costs)).collect();
    let ratios: Vec<f64> = runs
        .iter()
        .zip(&one_way)
        .map(|(tl, ow)| {
            let (st, _, _) = stages(std::slice::from_ref(tl), ticks_per_ns, step_ns, xsk);
            st.iter().map(|s| s.ns).sum::<f64>() / ow.max(1.0)
        })
        .collect();
    let (stages, kept, all) = stages(&runs, ticks_per_ns, step_ns, xsk);
    let sum: f64 = stages.iter().filter(|s| s.measured).map(|s| s.ns).sum();
    let one_way = crate::stats::median(&one_way);
    Ok(Anatomy {
        provider: plan.provider.name().into(),
        size,
        one_way_ns: one_way,
        traced_one_way_ns: crate::stats::median(&traced_one_way),
        marks_one_way_ns: crate::stats::median(&marks_one_way),
        sum_ns: sum,
        pair_ratios: ratios.clone(),
        ratio: crate::stats::median(&ratios),
        stages,
        messages_kept: kept,
        messages: all,
        mark_cost_ns: startup_mark_ns,
        mark_path_cost_ns: mark_path_ns,
        syscall_event_cost_ns: tracing.tracer.costs().syscall,
        kernel_event_cost_ns: tracing.tracer.costs().other,
        kernel_events_per_message: events[0] + events[1],
        kernel_events_path_ns: path_ns,
        missing: tracing.missing(),
    })
}

struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The table: stages in path order, then the categories.
pub fn table(a: &Anatomy) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "anatomy of a {} B message, {}: {} of {} one-way messages followed along the common path",
        a.size, a.provider, a.messages_kept, a.messages
    );
    let _ = writeln!(
        s,
        "{:<60} {:>4} {:>8} {:>8} {:>6}  category",
        "stage", "side", "ns", "cycles", "%"
    );
    for st in &a.stages {
        let _ = writeln!(
            s,
            "{:<60} {:>4} {:>8.0} {:>8.0} {:>5.1}%  {}",
            st.name,
            st.side,
            st.ns,
            st.cycles,
            100.0 * st.ns / a.sum_ns.max(1.0),
            st.category
        );
    }
    let _ = writeln!(
        s,
        "{:<60} {:>4} {:>8.0}",
        "sum of measured stages", "", a.sum_ns
    );
    let _ = writeln!(
        s,
        "{:<60} {:>4} {:>8.0}   (sum / one-way: {:.2}, the median of the rounds' {})",
        "one-way latency, untraced ping-pong (median)",
        "",
        a.one_way_ns,
        a.ratio,
        a.pair_ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let _ = writeln!(
        s,
        "{:<60} {:>4} {:>8.0}   (checkpoints add {:+.0} ns, {:.1} ns each on the path, taken out of the stages they start; {:.1} ns each timed at start-up)",
        "one-way latency, checkpoints alone (median)", "", a.marks_one_way_ns, a.marks_one_way_ns - a.one_way_ns, a.mark_path_cost_ns, a.mark_cost_ns
    );
    if a.kernel_events_per_message > 0.0 {
        let _ = writeln!(
            s,
            "{:<60} {:>4} {:>8.0}   (the {:.1} kernel events in a message's stages add {:+.0} ns, taken out of the stages they fall in)",
            "one-way latency, checkpoints and kernel events (median)", "", a.traced_one_way_ns, a.kernel_events_per_message, a.kernel_events_path_ns
        );
    } else {
        let _ = writeln!(
            s,
            "{:<60} {:>4} {:>8.0}   (no kernel event falls in a message's stages)",
            "one-way latency, checkpoints and kernel events (median)", "", a.traced_one_way_ns
        );
    }
    let _ = writeln!(s, "\nby category:");
    for (cat, ns) in categories(a) {
        let ns = ns.max(0.0);
        let _ = writeln!(
            s,
            "  {:<34} {:>8.0} ns {:>5.1}%",
            cat,
            ns,
            100.0 * ns / a.sum_ns.max(1.0)
        );
    }
    for m in &a.missing {
        let _ = writeln!(s, "not seen: {m}");
    }
    s
}

/// The stages summed by category, in the source documents' order.
pub fn categories(a: &Anatomy) -> Vec<(String, f64)> {
    CATEGORIES
        .iter()
        .map(|c| {
            (
                c.to_string(),
                a.stages
                    .iter()
                    .filter(|s| s.category == *c)
                    .map(|s| s.ns)
                    .sum(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(pid: u32, marks: &[(u64, Stage)]) -> SideTrace {
        SideTrace::of_marks(pid, marks, 2.0)
    }

    fn ev(ns: u64, point: Point, tgid: u32, cpu: u32) -> Event {
        Event {
            ns,
            point,
            tgid,
            tid: tgid,
            task: 1,
            cpu,
            args: [if point == Point::SoftirqEntry { 3 } else { 0 }, 0],
        }
    }

    /// A side's checkpoints: (ns, stage).
    type Marks = Vec<(u64, Stage)>;

    /// A kernel-UDP-like exchange: client (pid 10, cpu 0) sends at `t`,
    /// server (pid 20, cpu 1) polls and receives.
    fn message(t: u64, from: u32, to: u32) -> (Marks, Marks, Vec<Event>) {
        let (fc, tc) = (from / 10 - 1, to / 10 - 1);
        let send = vec![(t, Stage::AppSend), (t + 900, Stage::AppSendReturned)];
        let recv = vec![
            (t + 30, Stage::RxFound),
            (t + 700, Stage::RxFound),
            (t + 720, Stage::AppReceived),
        ];
        let kernel = vec![
            ev(t + 50, Point::SysEnter, from, fc),
            ev(t + 20, Point::SysEnter, to, tc), // the receiver's poll
            ev(t + 200, Point::NetDevQueue, from, fc),
            // A softirq in an idle task on the sender's CPU counts as the sender's.
            ev(t + 300, Point::SoftirqEntry, 0, fc),
            ev(t + 400, Point::NetifReceiveSkb, from, fc),
            ev(t + 500, Point::SkDataReady, from, fc),
            ev(t + 600, Point::SkbCopyDatagramIovec, to, tc),
            ev(t + 650, Point::SysExit, to, tc),
            ev(t + 800, Point::SysExit, from, fc),
        ];
        (send, recv, kernel)
    }

    #[test]
    fn a_message_is_followed_from_send_to_return_through_the_hand_off() {
        let (mut c, mut s, mut k) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..5u64 {
            let (send, recv, kernel) = message(10_000 * i, 10, 20);
            c.extend(send);
            s.extend(recv);
            k.extend(kernel);
            // The server answers 6 us after the client's send; the client
            // sends again 4 us after that.
            let (send, recv, kernel) = message(10_000 * i + 6_000, 20, 10);
            s.extend(send);
            c.extend(recv);
            k.extend(kernel);
        }
        c.sort_by_key(|m| m.0);
        s.sort_by_key(|m| m.0);
        k.sort_by_key(|e| e.ns);
        let tl = timeline(
            [&side(10, &c), &side(20, &s)],
            &k,
            Costs {
                syscall: 5.0,
                other: 5.0,
            },
        );
        // Two system call events and five others fall in each message's stages.
        assert_eq!(path_events(std::slice::from_ref(&tl)), [2.0, 5.0]);
        // Checkpoints whose cost is on the path: the send call's and the
        // receiver's rx-found, half the server's turn-around, and half the
        // client's mark before its send. The receiver's first rx-found
        // (its poll's) and the sender's return are off it.
        assert_eq!(path_marks(std::slice::from_ref(&tl)), 3.0);
        let (st, kept, all) = stages(&[tl], 2.0, 0.0, false);
        // The last message has no reply: its chain is one stage short.
        assert_eq!((kept, all), (9, 10));
        let path: Vec<(&str, &str)> = st
            .iter()
            .map(|s| (s.to.as_str(), s.side.as_str()))
            .collect();
        assert_eq!(
            path,
            [
                ("sys_enter", "send"),
                ("net_dev_queue", "send"),
                ("softirq_entry", "send"),
                ("netif_receive_skb", "send"),
                ("sk_data_ready", "send"),
                ("skb_copy_datagram_iovec", "recv"),
                ("sys_exit", "recv"),
                ("rx-found", "recv"),
                ("app-received", "recv"),
                ("app-send", "recv"),
            ]
        );
        // Kernel events cost 5 ns each, taken out of the stage they end;
        // the receiver's poll before the copy does not count.
        let ns: Vec<f64> = st.iter().map(|s| s.ns).collect();
        assert_eq!(
            ns,
            [45.0, 145.0, 95.0, 95.0, 95.0, 95.0, 45.0, 50.0, 20.0, 2640.0]
        );
        // The turn-around is half the server's (6000 - 720 ns): the
        // client's (3280 ns) is outside the round trips it times.
        assert_eq!(st[1].cycles, 290.0);
        let sum: f64 = ns[..9].iter().sum();
        // The sum is the send-to-return time less the tracing's cost.
        assert_eq!(sum, 720.0 - 7.0 * 5.0);
        assert_eq!(st[9].category, "user application");
        assert_eq!(st[0].category, "OS overhead (send)");
        assert_eq!(st[5].category, "OS overhead (recv)");
    }

    #[test]
    fn the_kernel_events_cost_on_the_path_is_shared_out_as_the_calibration_weighs_them() {
        let cal = Costs {
            syscall: 200.0,
            other: 100.0,
        };
        // Two system call events and five others: 900 ns by the loops.
        let c = path_costs(cal, [2.0, 5.0], 450.0);
        assert_eq!((c.syscall, c.other), (100.0, 50.0));
        assert_eq!(2.0 * c.syscall + 5.0 * c.other, 450.0);
        // Nothing added on the path, or no event on it: nothing taken out.
        assert_eq!(path_costs(cal, [2.0, 5.0], -30.0), Costs::default());
        assert_eq!(path_costs(cal, [0.0, 0.0], 450.0), Costs::default());
        // No calibration: every event alike.
        let c = path_costs(Costs::default(), [1.0, 2.0], 300.0);
        assert_eq!((c.syscall, c.other), (100.0, 100.0));
    }

    #[test]
    fn the_clients_own_stretches_inside_its_round_trips_count_half() {
        // Three round trips: clock read, send 30 ns later; the reply's
        // return, clock read 10 ns later.
        let mut c = Vec::new();
        for i in 0..3u64 {
            let t = 10_000 * i;
            c.extend([
                (t, Stage::AppClock),
                (t + 30, Stage::AppSend),
                (t + 900, Stage::AppReceived),
                (t + 910, Stage::AppClock),
            ]);
        }
        let mut client = side(10, &c);
        client.mark_cost_ns = 4.0;
        let tl = timeline([&client, &side(20, &[])], &[], Costs::default());
        // Each less the first checkpoint's cost, halved.
        assert_eq!(client_timer(&[tl], 0.0), [Some(13.0), Some(3.0)]);
        assert_eq!(client_timer(&[Vec::new()], 0.0), [None, None]);
    }

    #[test]
    fn a_receive_that_found_nothing_is_left_off_the_time_line() {
        let c = side(10, &[]);
        let s = side(20, &[]);
        let mut poll = ev(100, Point::SockRecvLength, 20, 1);
        // -EAGAIN, as the raw tracepoint passes an int: 32 bits, no sign.
        poll.args[1] = (-11i32) as u32 as u64;
        let mut got = ev(200, Point::SockRecvLength, 20, 1);
        got.args[1] = 1032;
        let tl = timeline([&c, &s], &[poll, got], Costs::default());
        assert_eq!(tl.len(), 1);
        assert_eq!(tl[0].ns, 200);
    }

    #[test]
    fn a_message_that_never_arrives_is_not_followed() {
        let c = side(10, &[(0, Stage::AppSend)]);
        let s = side(20, &[]);
        let tl = timeline([&c, &s], &[], Costs::default());
        let (st, kept, all) = stages(&[tl], 1.0, 0.0, false);
        assert!(st.is_empty());
        assert_eq!((kept, all), (0, 1));
    }
}
