//! The floor under the xdp provider: a ping-pong of small frames between
//! two xdp media, one on each end of a pair of test hosts, with no protocol
//! engine and no VI above them. Whatever `uvia pingpong --provider xdp`
//! measures beyond this is uvia's own cost.
//!
//! `cargo run --release -p uvia-net --example xdp_pingpong [-- SIZE [ITERS [native|generic]]]`
//! (root; makes and removes its own test hosts).

use std::sync::Barrier;
use std::time::Instant;
use uvia_net::netns::{Side, TestHosts};
use uvia_net::xdp::{bpf::Mode, XdpMedium, XdpOptions};
use uvia_net::{Medium, OutFrame, RecvBatch};

fn pin(core: usize) {
    // SAFETY: CPU_SET writes inside the zeroed set; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn open(hosts: &TestHosts, side: Side, mode: Option<Mode>) -> XdpMedium {
    let _in = hosts.enter(side).expect("entering the test host");
    XdpMedium::open(&hosts.iface(side), &XdpOptions { queue: 0, mode })
        .expect("opening the xdp medium")
}

/// Waits (spinning) for one frame on `m`.
fn take(m: &XdpMedium, batch: &mut RecvBatch) {
    while m.recv(batch).expect("recv") == 0 {
        std::hint::spin_loop();
    }
}

fn main() {
    if let Err(why) = TestHosts::available() {
        eprintln!("xdp_pingpong: skipped: {why}");
        return;
    }
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map_or(8, |s| s.parse().expect("SIZE"));
    let iters: usize = args.next().map_or(100_000, |s| s.parse().expect("ITERS"));
    let mode = match args.next().as_deref() {
        None => None,
        Some("native") => Some(Mode::Native),
        Some("generic") => Some(Mode::Generic),
        Some(other) => panic!("mode {other:?}: want native or generic"),
    };
    let warmup = iters / 10;
    let hosts = TestHosts::create("xpp").expect("making test hosts");
    let a = open(&hosts, Side::A, mode);
    let b = open(&hosts, Side::B, mode);
    let (to_a, to_b) = (a.local_addr(), b.local_addr());
    let payload = vec![0x5a_u8; size];
    let ready = Barrier::new(2);
    let mut rtts = std::thread::scope(|s| {
        s.spawn(|| {
            pin(1);
            let mut batch = RecvBatch::new(64, 2048);
            ready.wait();
            for _ in 0..warmup + iters {
                take(&b, &mut batch);
                let f = [OutFrame {
                    to: to_a,
                    bytes: &payload,
                }];
                b.send(&f).expect("send");
            }
        });
        pin(0);
        let mut batch = RecvBatch::new(64, 2048);
        let mut rtts = Vec::with_capacity(iters);
        ready.wait();
        uvia_trace::start(16 * (warmup + iters));
        for i in 0..warmup + iters {
            let t = Instant::now();
            let f = [OutFrame {
                to: to_b,
                bytes: &payload,
            }];
            a.send(&f).expect("send");
            take(&a, &mut batch);
            if i >= warmup {
                rtts.push(t.elapsed().as_nanos() as u64);
            }
        }
        rtts
    });
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
    println!(
        "xdp medium ping-pong, {size} B, {iters} round trips ({:?} mode): one-way p50 {:.2} us, p99 {:.2} us, min {:.2} us",
        a.mode(),
        q(0.5),
        q(0.99),
        q(0.0)
    );
}
