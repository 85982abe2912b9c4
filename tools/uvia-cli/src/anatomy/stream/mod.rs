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
//!
//! `record` runs the two processes, `traces` reads the traced runs into
//! the path and its layers (no process or file touched), `render` writes
//! the table, the chart and the plot; this module runs the pairs.

use super::{say, Tracing};
use crate::endpoint::{EndpointConfig, Mode};
use crate::run::{self, Level, Plan, Provider};
use crate::stats::median;
use anyhow::{anyhow, bail, Result};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

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

mod record;
mod render;
mod traces;

use record::run_once;
pub use record::serve;
pub use render::{plot, table};
pub use traces::{analyse, sides, theoretical_max, Layer};

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

#[cfg(test)]
mod tests {
    use super::render::*;
    use super::traces::*;
    use super::*;
    use crate::anatomy::{Ev, Label};
    use crate::tracefile::SideTrace;
    use uvia_trace::kernel::Costs;
    use uvia_trace::kernel::Point;
    use uvia_trace::Stage;

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

    /// A side's trace, its marks in time order.
    fn side(pid: u32, marks: &[(u64, Stage)]) -> SideTrace {
        let mut t = SideTrace::of_marks(pid, marks, 1.0);
        t.marks.sort_by_key(|m| m.ns);
        t
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
