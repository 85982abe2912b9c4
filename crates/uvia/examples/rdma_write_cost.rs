//! What the library's own calls cost on the one-sided shm path, without
//! the cores' cache-line transfers: one thread posts 8-byte RDMA writes
//! (a message and its flag word, the two segments `uvia pingpong
//! --rdma-write` posts) on a connected shm VI, taking the completions back
//! every 16 posts as `uvia pingpong` does; then the same two pieces
//! written by copy (`Vi::write_copy`, as `uvia pingpong --rdma-write` now
//! writes them). Prints the time-stamp counter ticks per post (the post
//! alone), per post with its share of the reaping, and per write by copy.
//! Run it pinned, several times, and compare minimums.
//!
//! Usage: `rdma_write_cost [POSTS]` (default 10,000,000).

mod common;

use uvia::{Descriptor, MemAttributes, Nic, Segment, Vi, ViAttributes};

/// Posts between two looks at the send completions, as in `uvia pingpong`.
const REAP_EVERY: usize = 16;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = common::count_arg(10_000_000)?;
    let nic = Nic::open("shm")?;
    let ptag = nic.create_ptag()?;
    let attrs = ViAttributes::new(ptag)
        .queue_depths(64, 64)
        .rdma(true, false);
    let a = nic.create_vi(attrs, None, None)?;
    let b = nic.create_vi(attrs, None, None)?;
    common::connect(&nic, &a, &b, 0x5a7d_0000 ^ std::process::id() as u64)?;

    let send = nic.alloc_region(64, MemAttributes::new(ptag))?;
    let target = nic.alloc_region(128, MemAttributes::new(ptag).rdma_write(true))?;
    let desc = || {
        Box::new(Descriptor::rdma_write(
            target.remote(48),
            &[send.segment(0, 8), send.segment(8, 8)],
        ))
    };
    // The first write is placed by the target, which then grants its
    // region: drive both ends until it completes.
    a.post_send(desc()).map_err(|r| r.error)?;
    let first = loop {
        let _ = b.recv_done();
        if let Some(d) = a.send_done() {
            break d;
        }
    };
    first.result()?;
    let mut free: Vec<Box<Descriptor>> = (0..REAP_EVERY * 2).map(|_| desc()).collect();
    // The clock's own cost: two reads with nothing between.
    let mut empty = 0u64;
    for _ in 0..n {
        let t0 = uvia_trace::ticks();
        let t1 = uvia_trace::ticks();
        empty += t1 - t0;
    }
    println!(
        "{:.1} ticks between two clock reads",
        empty as f64 / n as f64
    );
    let (mut post_ticks, mut all_ticks) = (0u64, 0u64);
    for i in 0..n {
        let d = free.pop().ok_or("no free descriptor")?;
        let t0 = uvia_trace::ticks();
        a.post_send(d).map_err(|r| r.error)?;
        let t1 = uvia_trace::ticks();
        if (i + 1).is_multiple_of(REAP_EVERY) {
            while let Some(d) = a.send_done() {
                d.result()?;
                free.push(d);
            }
        }
        let t2 = uvia_trace::ticks();
        post_ticks += t1 - t0;
        all_ticks += t2 - t0;
    }
    println!(
        "{:.1} ticks per post, {:.1} with the reaping",
        post_ticks as f64 / n as f64,
        all_ticks as f64 / n as f64
    );
    // The same bytes by copy (`Vi::write_copy`): no descriptor, nothing to reap.
    let bytes = send.as_slice();
    let (msg, flag) = (&bytes[..8], &bytes[8..16]);
    let copy_ticks = writes_by_copy(&a, [msg, flag], target.remote(48), n)?;
    println!(
        "{:.1} ticks per write by copy",
        copy_ticks as f64 / n as f64
    );
    Ok(())
}

/// `n` writes by copy of `parts` at `remote`, the ticks they took: a
/// function of its own, so that an instruction counter can be pointed at
/// the loop (`--toggle-collect` under callgrind) with the write inlined.
#[inline(never)]
fn writes_by_copy(
    vi: &Vi,
    parts: [&[u8]; 2],
    remote: Segment,
    n: usize,
) -> Result<u64, Box<dyn std::error::Error>> {
    let mut ticks = 0u64;
    for _ in 0..n {
        let t0 = uvia_trace::ticks();
        if !vi.write_copy(&parts, remote)? {
            return Err("the write by copy was declined".into());
        }
        ticks += uvia_trace::ticks() - t0;
    }
    Ok(ticks)
}
