//! What an empty poll of a CQ costs as its members grow: N shm VI pairs in
//! this process, the servers' receive queues on one CQ, nothing sent; the
//! time per `Cq::done` that finds nothing, for each N. Run it pinned and
//! compare minimums of several runs.
//!
//! Usage: `cq_poll_cost [N,...]` (default 1,32,100,1000).

use std::time::{Duration, Instant};
use uvia::{Descriptor, Discriminator, MemAttributes, NetAddress, Nic, Vi, ViAttributes};

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
            let disc =
                Discriminator::from_u64(0xc0_0000 ^ (std::process::id() as u64) << 24 ^ k as u64);
            let accept = {
                let (nic, b, disc) = (nic.clone(), b.clone(), disc.clone());
                std::thread::spawn(move || -> Result<(), String> {
                    let mut req = nic
                        .connect_wait(&disc, Some(Duration::from_secs(5)))
                        .map_err(|e| e.to_string())?;
                    req.accept(&b).map_err(|e| e.to_string())
                })
            };
            a.connect_request(&NetAddress::new("0", disc), Duration::from_secs(5))?;
            accept
                .join()
                .map_err(|_| "the accepting thread panicked")??;
            keep.push(a);
            keep.push(b);
        }
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t0 = Instant::now();
            for _ in 0..POLLS {
                if cq.done()?.is_some() {
                    return Err("a notice with nothing sent".into());
                }
            }
            best = best.min(t0.elapsed().as_nanos() as f64 / POLLS as f64);
        }
        println!("{n:>5} members: {best:.1} ns per empty poll");
    }
    Ok(())
}
