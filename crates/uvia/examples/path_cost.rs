//! What the library's own calls cost on a message path, without the
//! cores' cache-line transfers: one thread drives both ends of a
//! connection through the calls `uvia pingpong` makes (post a send, the
//! receive's done call, post the receive again, a send done call every 16
//! posts), so every message has already arrived when it is looked for (in
//! the ring on shm; on udp the kernel hands a loopback datagram to the
//! peer's socket within the send call). Prints the time per round trip
//! (two messages). Run it pinned, several times, and compare minimums;
//! under an instruction counter (callgrind) the difference of two runs of
//! different lengths is the instructions per round trip.
//!
//! Usage: `path_cost [ROUND_TRIPS] [NIC]` (default 1,000,000 round trips on
//! `shm`; e.g. `udp:127.0.0.1`).

use std::time::Instant;
mod common;

use uvia::{Descriptor, MemAttributes, Nic, Vi, ViAttributes};

/// Sends between two looks at the send completions, as in `uvia pingpong`.
const REAP_EVERY: usize = 16;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = common::count_arg(1_000_000)?;
    let name = std::env::args().nth(2).unwrap_or_else(|| "shm".into());
    let nic = Nic::open(&name)?;
    let ptag = nic.create_ptag()?;
    let attrs = ViAttributes::new(ptag).queue_depths(64, 64);
    let a = nic.create_vi(attrs, None, None)?;
    let b = nic.create_vi(attrs, None, None)?;
    common::connect(&nic, &a, &b, 0x5a7c_0000 ^ std::process::id() as u64)?;

    let region = || nic.alloc_region(64, MemAttributes::new(ptag));
    let (send_a, recv_a, send_b, recv_b) = (region()?, region()?, region()?, region()?);
    let mut ends = [
        End::new(&a, &send_a, &recv_a)?,
        End::new(&b, &send_b, &recv_b)?,
    ];
    let t0 = Instant::now();
    for i in 0..n {
        for (from, to) in [(0, 1), (1, 0)] {
            ends[from].send(i)?;
            // On the network the first messages may wait for the sender's
            // next call (the connection's own socket is being joined):
            // its send completions are taken until the message is there.
            let mut tries = 0;
            while !ends[to].recv()? {
                ends[from].reap()?;
                tries += 1;
                if tries > 1_000_000 {
                    return Err("the message did not arrive".into());
                }
            }
        }
    }
    let dt = t0.elapsed();
    println!(
        "{:.1} ns per round trip",
        dt.as_nanos() as f64 / n.max(1) as f64
    );
    Ok(())
}

/// One side: its VI, its buffers and its spare send descriptors.
struct End<'a> {
    vi: &'a Vi,
    send: &'a uvia::MemoryRegion,
    recv: &'a uvia::MemoryRegion,
    #[allow(clippy::vec_box)]
    free: Vec<Box<Descriptor>>,
}

impl<'a> End<'a> {
    fn new(
        vi: &'a Vi,
        send: &'a uvia::MemoryRegion,
        recv: &'a uvia::MemoryRegion,
    ) -> Result<End<'a>, Box<dyn std::error::Error>> {
        for _ in 0..16 {
            vi.post_recv(Box::new(Descriptor::recv(&[recv.segment(0, 64)])))
                .map_err(|r| r.error)?;
        }
        let free = (0..REAP_EVERY * 2)
            .map(|_| Box::new(Descriptor::default()))
            .collect();
        Ok(End {
            vi,
            send,
            recv,
            free,
        })
    }

    fn send(&mut self, i: usize) -> Result<(), Box<dyn std::error::Error>> {
        let mut d = self.free.pop().ok_or("no free send descriptor")?;
        *d = Descriptor::send(&[self.send.segment(0, 8)]);
        self.vi.post_send(d).map_err(|r| r.error)?;
        if i.is_multiple_of(REAP_EVERY) {
            self.reap()?;
        }
        Ok(())
    }

    /// Takes the completed sends back.
    fn reap(&mut self) -> Result<(), Box<dyn std::error::Error>> {
        while let Some(d) = self.vi.send_done() {
            d.result()?;
            self.free.push(d);
        }
        Ok(())
    }

    /// Takes the message in and posts its descriptor again; false if it
    /// has not arrived.
    fn recv(&mut self) -> Result<bool, Box<dyn std::error::Error>> {
        let Some(mut d) = self.vi.recv_done() else {
            return Ok(false);
        };
        if d.result()? != 8 {
            return Err("a message of the wrong length".into());
        }
        *d = Descriptor::recv(&[self.recv.segment(0, 64)]);
        self.vi.post_recv(d).map_err(|r| r.error)?;
        Ok(true)
    }
}
