//! The VIPL echo client of the source slides: connect to the echo server,
//! send each argument, print what comes back.

use std::time::Duration;
use uvia::{Descriptor, Discriminator, MemAttributes, NetAddress, Nic, ViAttributes};

const DISCRIMINATOR: u64 = 0xec40;
const BUF: usize = 4096;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let words: Vec<String> = std::env::args().skip(1).collect();
    let words = if words.is_empty() {
        vec!["hello, VIA".to_string()]
    } else {
        words
    };
    let nic = Nic::open("shm")?;
    let ptag = nic.create_ptag()?;
    let mut send_buf = nic.alloc_region(BUF, MemAttributes::new(ptag))?;
    let recv_buf = nic.alloc_region(BUF, MemAttributes::new(ptag))?;
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None)?;

    let server = NetAddress::new("0", Discriminator::from_u64(DISCRIMINATOR));
    vi.connect_request(&server, Duration::from_secs(10))?;
    for w in &words {
        let n = w.len().min(BUF);
        send_buf.as_mut_slice()[..n].copy_from_slice(&w.as_bytes()[..n]);
        vi.post_recv(Box::new(Descriptor::recv(&[recv_buf.segment(0, BUF)])))?;
        vi.post_send(Box::new(Descriptor::send(&[send_buf.segment(0, n)])))?;
        vi.send_wait(Some(Duration::from_secs(5)))?.result()?;
        let got = vi.recv_wait(Some(Duration::from_secs(5)))?.result()? as usize;
        println!(
            "echo: {}",
            String::from_utf8_lossy(&recv_buf.as_slice()[..got])
        );
    }
    vi.disconnect();
    Ok(())
}
