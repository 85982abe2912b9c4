//! The traced runs read into the stream's path, its layers and their
//! times per message, and the chart of one round: no process run, no
//! file touched.

use super::{ChartBar, AFTER_HANDOFF};
use crate::anatomy::{describe, follow, Chain, Ev, Label, Span};
use crate::stats::median;
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use uvia_trace::kernel::Point;
use uvia_trace::Stage;

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
pub(super) fn receives_that_returned(tl: &[Ev]) -> Vec<bool> {
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
