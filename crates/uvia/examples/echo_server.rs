//! The VIPL echo server of the source slides, against the Rust API: wait for
//! a client on a discriminator, then send every message back until the
//! client disconnects.
//!
//! Run `cargo run --example echo_server` in one shell and
//! `cargo run --example echo_client -- hello world` in another.

use std::time::Duration;
use uvia::{Descriptor, Discriminator, MemAttributes, Nic, ViAttributes, ViState};

const DISCRIMINATOR: u64 = 0xec40;
const BUF: usize = 4096;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nic = Nic::open("shm")?;
    let ptag = nic.create_ptag()?;
    let buf = nic.alloc_region(BUF, MemAttributes::new(ptag))?;
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None)?;

    // Post the first receive before accepting, so the client's first message has a place to land.
    vi.post_recv(Box::new(Descriptor::recv(&[buf.segment(0, BUF)])))?;
    println!("echo server: waiting on discriminator {DISCRIMINATOR:#x}");
    let mut req = nic.connect_wait(&Discriminator::from_u64(DISCRIMINATOR), None)?;
    req.accept(&vi)?;
    println!("echo server: client {} connected", req.peer_pid());

    loop {
        let mut d = vi.recv_wait(None)?;
        let n = match d.result() {
            Ok(n) => n as usize,
            // The client went away: every outstanding descriptor is flushed.
            Err(_) if vi.state() == ViState::Error => break,
            Err(e) => return Err(e.into()),
        };
        println!(
            "echo server: {} bytes: {:?}",
            n,
            String::from_utf8_lossy(&buf.as_slice()[..n])
        );
        // Send the same bytes back, then reuse the descriptor for the next receive.
        vi.post_send(Box::new(Descriptor::send(&[buf.segment(0, n)])))?;
        vi.send_wait(Some(Duration::from_secs(5)))?.result()?;
        d.reset();
        *d = Descriptor::recv(&[buf.segment(0, BUF)]);
        vi.post_recv(d)?;
    }
    println!("echo server: client disconnected");
    vi.disconnect();
    Ok(())
}
