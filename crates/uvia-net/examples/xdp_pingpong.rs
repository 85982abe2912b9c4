//! The floor under the xdp provider, alone: `uvia_net::xdp::pingpong`
//! (a ping-pong of small frames between two xdp media, one on each end of
//! a pair of test hosts, with no protocol engine and no VI above them; also
//! `uvia limit`'s AF_XDP probe), with the send system call's time when
//! checkpoints are compiled in.
//!
//! `cargo run --release -p uvia-net --example xdp_pingpong [-- SIZE [ITERS [native|generic|any [busypoll]]]]`
//! (root; makes and removes its own test hosts).

use std::sync::OnceLock;
use std::time::Instant;
use uvia_net::netns::TestHosts;
use uvia_net::xdp::{bpf::Mode, pingpong};

/// Nanoseconds since the first call.
fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

const USAGE: &str = "usage: xdp_pingpong [SIZE [ITERS [native|generic|any [busypoll]]]]
  SIZE   payload bytes of each frame (default 8)
  ITERS  measured round trips (default 100000; a tenth more warm up)
  mode   where the XDP program runs (default any: the provider's choice)
  busypoll  busy polling on both sockets";

/// The command line, or the reason it is not one.
fn parse(
    mut args: impl Iterator<Item = String>,
) -> Result<(usize, usize, Option<Mode>, bool), String> {
    let count = |what: &str, s: Option<String>, default: usize| match s {
        None => Ok(default),
        Some(s) => match s.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{what} {s:?}: want a positive whole number")),
        },
    };
    let size = count("SIZE", args.next(), 8)?;
    let iters = count("ITERS", args.next(), 100_000)?;
    let mode = match args.next().as_deref() {
        None | Some("any") => None,
        Some("native") => Some(Mode::Native),
        Some("generic") => Some(Mode::Generic),
        Some(other) => return Err(format!("mode {other:?}: want native, generic or any")),
    };
    let busy_poll = match args.next().as_deref() {
        None => false,
        Some("busypoll") => true,
        Some(other) => return Err(format!("{other:?}: want busypoll or nothing")),
    };
    if let Some(extra) = args.next() {
        return Err(format!("{extra:?}: too many arguments"));
    }
    Ok((size, iters, mode, busy_poll))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return;
    }
    let (size, iters, mode, busy_poll) = match parse(args.into_iter()) {
        Ok(a) => a,
        Err(why) => {
            eprintln!("xdp_pingpong: {why}\n{USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(why) = TestHosts::available() {
        eprintln!("xdp_pingpong: skipped: {why}");
        return;
    }
    let warmup = iters / 10;
    // SAFETY: CPU_SET writes inside the zeroed set; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    now_ns();
    uvia_trace::start(16 * (warmup + iters));
    let spec = pingpong::Spec {
        size,
        rounds: iters,
        warm: warmup,
        mode,
        echo_core: Some(1),
        busy_poll,
    };
    let mut rtts = match pingpong::run(&spec, now_ns) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("xdp_pingpong: {e}");
            std::process::exit(1);
        }
    };
    // With checkpoints compiled in (`--features uvia-trace/enabled`): how
    // long the transmitting system call takes, receive work included.
    let t = uvia_trace::take();
    let (mut calls, mut delivery) = (vec![], vec![]);
    // Per thread: the start of its last system call, and whether the
    // other thread has found that call's frame yet.
    let mut entered: [Option<u64>; 2] = [None, None];
    let mut in_flight: [Option<u64>; 2] = [None, None];
    for m in &t.marks {
        let th = m.thread as usize % 2;
        match m.stage {
            uvia_trace::Stage::SyscallEnter => {
                entered[th] = Some(m.ns);
                in_flight[th] = Some(m.ns);
            }
            uvia_trace::Stage::SyscallExit => {
                if let Some(t0) = entered[th].take() {
                    calls.push(m.ns - t0);
                }
            }
            // The other thread's call put this frame in the ring.
            uvia_trace::Stage::RxFound => {
                if let Some(t0) = in_flight[1 - th].take() {
                    delivery.push(m.ns - t0);
                }
            }
            _ => {}
        }
    }
    for (what, v) in [
        ("send system call", &mut calls),
        ("system call to frame found", &mut delivery),
    ] {
        if !v.is_empty() {
            v.sort_unstable();
            println!("{what}: p50 {} ns ({} samples)", v[v.len() / 2], v.len());
        }
    }
    rtts.sort_unstable();
    let q = |p: f64| rtts[((rtts.len() - 1) as f64 * p) as usize] as f64 / 2e3;
    let mode = mode.map_or("the provider's".to_string(), |m| format!("{m:?}"));
    let busy = if busy_poll { ", busy polling" } else { "" };
    println!(
        "xdp medium ping-pong, {size} B, {iters} round trips ({mode} mode{busy}): one-way p50 {:.2} us, p99 {:.2} us, min {:.2} us",
        q(0.5),
        q(0.99),
        q(0.0)
    );
}
