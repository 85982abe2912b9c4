//! What the cost examples share: their count argument, and connecting two
//! VIs of one Nic to each other in one process.

use std::time::Duration;
use uvia::{Discriminator, NetAddress, Nic, Vi};

/// Connects `a` to `b` (both of `nic`) under discriminator `disc`: `b`
/// accepts on a thread of its own while `a` asks.
pub fn connect(nic: &Nic, a: &Vi, b: &Vi, disc: u64) -> Result<(), Box<dyn std::error::Error>> {
    let disc = Discriminator::from_u64(disc);
    let accept = {
        let (nic, b, disc) = (nic.clone(), b.clone(), disc.clone());
        std::thread::spawn(move || -> Result<(), String> {
            let mut req = nic
                .connect_wait(&disc, Some(Duration::from_secs(5)))
                .map_err(|e| e.to_string())?;
            req.accept(&b).map_err(|e| e.to_string())
        })
    };
    // The Nic's own address: "0" on shm, ip:port on the network.
    let host = nic.attributes().address.clone();
    a.connect_request(&NetAddress::new(&host, disc), Duration::from_secs(5))?;
    accept
        .join()
        .map_err(|_| "the accepting thread panicked")??;
    Ok(())
}

/// The program's first argument as a count, `default` when absent.
// Each example builds this module for itself; `cq_poll_cost` takes a list.
#[allow(dead_code)]
pub fn count_arg(default: usize) -> Result<usize, Box<dyn std::error::Error>> {
    match std::env::args().nth(1) {
        None => Ok(default),
        Some(s) => s
            .parse()
            .map_err(|e| format!("the count {s:?} is not a whole number: {e}").into()),
    }
}
