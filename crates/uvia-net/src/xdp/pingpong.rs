//! The floor under the xdp provider: a ping-pong of small frames between
//! two xdp media, one in each of two test hosts made for it, with no
//! protocol engine and no VI above them. `uvia limit` measures it as a
//! probe and the `xdp_pingpong` example runs it alone; whatever
//! `uvia pingpong --provider xdp --netns` measures beyond it is uvia's own.

use super::{bpf::Mode, XdpMedium, XdpOptions};
use crate::netns::{Side, TestHosts};
use crate::{Medium, OutFrame, RecvBatch};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a side waits for a frame before it gives the run up (a frame
/// lost on the veth pair would stop the ping-pong).
pub const FRAME_WAIT: Duration = Duration::from_secs(2);

/// One run of the ping-pong.
pub struct Spec {
    /// Bytes of each frame's payload.
    pub size: usize,
    /// Round trips measured, after `warm` more that are not.
    pub rounds: usize,
    pub warm: usize,
    /// `None`: the mode the xdp provider picks.
    pub mode: Option<Mode>,
    /// The core the echoing side is pinned to (the caller pins itself).
    pub echo_core: Option<usize>,
    /// [`XdpOptions::busy_poll`] on both sockets.
    pub busy_poll: bool,
}

/// Makes two test hosts, bounces `spec.rounds` frames between them (this
/// thread sends, a second one echoes) and returns each measured round
/// trip as a difference of `now`, a monotonic counter the caller picks.
/// Root only; the hosts are removed afterwards.
pub fn run(spec: &Spec, now: fn() -> u64) -> io::Result<Vec<u64>> {
    TestHosts::available().map_err(io::Error::other)?;
    if spec.rounds == 0 {
        return Err(io::Error::other(
            "the ping-pong wants at least 1 round trip",
        ));
    }
    let hosts = TestHosts::create("xpp")
        .map_err(|e| io::Error::other(format!("making test hosts: {e}")))?;
    let open = |side| -> io::Result<XdpMedium> {
        let _inside = hosts.enter(side)?;
        let iface = hosts.iface(side);
        XdpMedium::open(
            &iface,
            &XdpOptions {
                queue: 0,
                mode: spec.mode,
                busy_poll: spec.busy_poll,
            },
        )
        .map_err(|e| io::Error::other(format!("opening an AF_XDP socket on {iface}: {e}")))
    };
    let (a, b) = (open(Side::A)?, open(Side::B)?);
    let max = a.caps().max_frame;
    if spec.size == 0 || spec.size > max {
        return Err(io::Error::other(format!(
            "the ping-pong's frames hold 1 to {max} bytes, not {}",
            spec.size
        )));
    }
    let (to_a, to_b) = (a.local_addr(), b.local_addr());
    let payload = vec![0x5a_u8; spec.size];
    let (stop, never) = (AtomicBool::new(false), AtomicBool::new(false));
    std::thread::scope(|s| {
        let echo = s.spawn(|| -> io::Result<()> {
            if let Some(core) = spec.echo_core {
                pin(core);
            }
            let mut batch = RecvBatch::new(64, max);
            while take(&b, &mut batch, &stop)? {
                b.send(&[OutFrame {
                    to: to_a,
                    bytes: &payload,
                }])?;
            }
            Ok(())
        });
        let mut batch = RecvBatch::new(64, max);
        let mut out = Vec::with_capacity(spec.rounds);
        let run = (|| -> io::Result<()> {
            for i in 0..spec.warm + spec.rounds {
                let t0 = now();
                a.send(&[OutFrame {
                    to: to_b,
                    bytes: &payload,
                }])?;
                take(&a, &mut batch, &never)?;
                let t1 = now();
                if i >= spec.warm {
                    out.push(t1.wrapping_sub(t0));
                }
            }
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        let echoed = echo
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the echo thread panicked")));
        // An echo that failed is why this side waited in vain: its error first.
        echoed.and(run).map(|()| out)
    })
}

/// Waits (spinning) for a frame on `m`: `Ok(false)` once `stop` is set.
fn take(m: &XdpMedium, batch: &mut RecvBatch, stop: &AtomicBool) -> io::Result<bool> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if m.recv(batch)? > 0 {
            return Ok(true);
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096) {
            if stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
            if start.elapsed() > FRAME_WAIT {
                return Err(io::Error::other(format!(
                    "no frame in {FRAME_WAIT:?}: the AF_XDP medium lost one"
                )));
            }
        }
    }
}

/// Pins the calling thread to `core`; left unpinned where the host lacks it.
fn pin(core: usize) {
    // SAFETY: CPU_SET writes inside the zeroed set; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
