//! What polling a CQ costs as its members grow: N shm VI pairs in this
//! process, the servers' receive queues on one CQ. For each N: the time
//! per `Cq::done` that finds nothing (the minimum of 5 runs), and how long
//! a message on a quiet member, chosen at random, waits to be found by
//! polls (mean and worst of 500, each after 100 us of polls that found
//! nothing). Run it pinned.
//!
//! Usage: `cq_poll_cost [N,...]` (default 1,32,100,1000).

use std::time::{Duration, Instant};
mod common;

use uvia::{Descriptor, MemAttributes, Nic, Vi, ViAttributes};

const POLLS: u32 = 1_000_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let counts: Vec<usize> = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "1,32,100,1000".into())
        .split(',')
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    for n in counts {
        let nic = Nic::open("shm")?;
        let ptag = nic.create_ptag()?;
        let cq = nic.create_cq(4096)?;
        let mut keep: Vec<Vi> = Vec::new();
        let buf = nic.alloc_region(64, MemAttributes::new(ptag))?;
        for k in 0..n {
            let a = nic.create_vi(ViAttributes::new(ptag), None, None)?;
            let b = nic.create_vi(ViAttributes::new(ptag), None, Some(&cq))?;
            b.post_recv(Box::new(Descriptor::recv(&[buf.segment(0, 64)])))?;
            common::connect(
                &nic,
                &a,
                &b,
                0xc0_0000 ^ (std::process::id() as u64) << 24 ^ k as u64,
            )?;
            keep.push(a);
            keep.push(b);
        }
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t0 = Instant::now();
            let mut polls = 0u32;
            while polls < POLLS && t0.elapsed() < Duration::from_millis(200) {
                for _ in 0..100 {
                    if cq.done()?.is_some() {
                        return Err("a notice with nothing sent".into());
                    }
                }
                polls += 100;
            }
            best = best.min(t0.elapsed().as_nanos() as f64 / polls as f64);
        }
        // A message on a random quiet member, after a spell of empty polls.
        let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ n as u64;
        let (mut sum, mut worst) = (Duration::ZERO, Duration::ZERO);
        const QUIET: u32 = 500;
        for _ in 0..QUIET {
            // Empty polls for a while: 100 us, and at least 200 polls.
            let spell = Instant::now();
            let mut k = 0;
            while k < 200 || spell.elapsed() < Duration::from_micros(100) {
                cq.done()?;
                k += 1;
            }
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let k = (rng % n as u64) as usize;
            let (a, b) = (&keep[2 * k], &keep[2 * k + 1]);
            a.post_send(Box::new(Descriptor::send(&[buf.segment(0, 8)])))?;
            let t0 = Instant::now();
            let c = loop {
                if let Some(c) = cq.done()? {
                    break c;
                }
            };
            let dt = t0.elapsed();
            if c.vi.id() != b.id() {
                return Err("the notice named another VI".into());
            }
            b.recv_done().ok_or("no receive")?;
            b.post_recv(Box::new(Descriptor::recv(&[buf.segment(0, 64)])))?;
            a.send_done().ok_or("no send completion")?;
            sum += dt;
            worst = worst.max(dt);
        }
        println!(
            "{n:>5} members: {best:.1} ns per empty poll; a quiet member's message found after {:.2} us (mean), {:.2} us (worst)",
            sum.as_secs_f64() * 1e6 / QUIET as f64,
            worst.as_secs_f64() * 1e6
        );
    }
    Ok(())
}
