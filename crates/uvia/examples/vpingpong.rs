//! A minimal ping-pong over the Rust API, like the source documents'
//! vpingpong: prints the median one-way latency for one message size.
//! `uvia pingpong` is the full harness; this is the shortest correct program.
//!
//! Usage: `vpingpong [SIZE] [ITERS] [poll|block]` (starts its own peer process).

use std::time::{Duration, Instant};
use uvia::{Descriptor, Discriminator, MemAttributes, NetAddress, Nic, ViAttributes};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let size: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(8);
    let iters: usize = args
        .get(2)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(100_000);
    let blocking = match args.get(3).map(String::as_str) {
        None | Some("poll") => false,
        Some("block") => true,
        Some(other) => return Err(format!("mode must be poll or block, not {other:?}").into()),
    };
    let peer = std::env::var("VPINGPONG_PEER").ok();
    let disc = match &peer {
        Some(d) => d.parse()?,
        None => std::process::id() as u64,
    };
    pin(if peer.is_some() { 1 } else { 0 });

    let nic = Nic::open("shm")?;
    let ptag = nic.create_ptag()?;
    let sbuf = nic.alloc_region(size.max(1), MemAttributes::new(ptag))?;
    let rbuf = nic.alloc_region(size.max(1), MemAttributes::new(ptag))?;
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None)?;
    let mut rd = Box::new(Descriptor::recv(&[rbuf.segment(0, size)]));
    let mut sd = Box::new(Descriptor::send(&[sbuf.segment(0, size)]));
    vi.post_recv(rd)?;

    let mut child = None;
    if peer.is_some() {
        let mut req = nic.connect_wait(
            &Discriminator::from_u64(disc),
            Some(Duration::from_secs(10)),
        )?;
        req.accept(&vi)?;
    } else {
        child = Some(
            std::process::Command::new(std::env::current_exe()?)
                .args(&args[1..])
                .env("VPINGPONG_PEER", disc.to_string())
                .spawn()?,
        );
        vi.connect_request(
            &NetAddress::new("0", Discriminator::from_u64(disc)),
            Duration::from_secs(10),
        )?;
    }
    if blocking {
        vi.set_wait_spin(Duration::ZERO);
    }
    let recv = |vi: &uvia::Vi| loop {
        if blocking {
            if let Ok(d) = vi.recv_wait(Some(Duration::from_secs(10))) {
                return d;
            }
        } else if let Some(d) = vi.recv_done() {
            return d;
        }
    };
    let mut samples = Vec::with_capacity(iters);
    for i in 0..iters + iters / 10 {
        let t = Instant::now();
        if peer.is_none() {
            vi.post_send(sd)?;
            rd = recv(&vi);
        } else {
            rd = recv(&vi);
            vi.post_send(sd)?;
        }
        rd.result()?;
        vi.post_recv(rd)?;
        sd = loop {
            if let Some(d) = vi.send_done() {
                break d;
            }
        };
        if i >= iters / 10 {
            samples.push(t.elapsed());
        }
    }
    if let Some(mut c) = child {
        samples.sort();
        let p50 = samples[samples.len() / 2] / 2;
        println!(
            "size {size} B: one-way p50 {} ns over {iters} round trips",
            p50.as_nanos()
        );
        c.wait()?;
    }
    Ok(())
}

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
