//! The process's shm agent: a thread that serves this process's side of its
//! shm connections when a peer waits on it and the program makes no call.
//!
//! VIA's RDMA is one-sided: an RDMA write or read, and a send into a
//! receive the target has posted, complete at the initiator whether or not
//! the target's program is computing or asleep. On shm the target's own
//! calls move data (a NIC's processor is not there to do it), so a peer
//! that has waited a while for this side to consume its messages asks for
//! the agent: it sets the `want` word of this side's control block and,
//! if it was clear, adds one to this process's agent eventfd (which it got
//! with the connection). The agent sleeps in `poll(2)` on that eventfd, so
//! it costs nothing while nobody asks; woken, it runs progress on every
//! connected VI whose peer asked, under the VI's lock, exactly as the
//! program's own done call would: the protection checks stay on this side,
//! with this side's regions.
//!
//! A peer that is served promptly (a program polling or sleeping in a wait
//! call, whose doorbell wakes it) never asks, so the data path keeps no
//! system call.

use super::conn::{self, block_in};
use crate::provider::Transport;
use crate::vi::{Vi, ViInner, ViShared, ViState};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use uvia_shm::Segment;

/// One connection the agent serves: its VI, and the segment and side whose
/// `want` word its peer sets (read without the VI's lock, so a VI nobody
/// asked for is never locked away from a program polling it).
struct Served {
    vi: Weak<ViShared>,
    seg: Weak<Segment>,
    side: usize,
    /// The peer process (a withdrawal waits on its writes while it lives).
    peer_pid: i32,
}

/// This process's agent: the eventfd its peers signal, and the connected
/// shm VIs it serves.
pub(crate) struct Agent {
    /// The process that started the agent: a child made by `fork` has no
    /// agent thread and starts its own.
    pid: u32,
    efd: OwnedFd,
    served: Mutex<Vec<Served>>,
}

/// The agent of this process, started by the first shm connection.
static AGENT: Mutex<Option<Arc<Agent>>> = Mutex::new(None);

/// This process's agent, started if it is not running yet.
pub(crate) fn get() -> io::Result<Arc<Agent>> {
    let mut g = AGENT.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if let Some(a) = g.as_ref().filter(|a| a.pid == pid) {
        return Ok(a.clone());
    }
    // SAFETY: plain eventfd creation; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let a = Arc::new(Agent {
        pid,
        // SAFETY: a fresh descriptor nothing else owns.
        efd: unsafe { OwnedFd::from_raw_fd(fd) },
        served: Mutex::new(Vec::new()),
    });
    let run = a.clone();
    std::thread::Builder::new()
        .name("uvia-shm-agent".into())
        .spawn(move || run.run())?;
    *g = Some(a.clone());
    Ok(a)
}

impl Agent {
    /// The eventfd a peer signals to ask for service (passed at connect).
    pub fn fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }

    /// Serves `vi`'s connection (side `side` of segment `seg`) from now on,
    /// until either is dropped.
    pub fn enlist(&self, vi: &Arc<ViShared>, seg: &Arc<Segment>, side: usize, peer_pid: i32) {
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        served.retain(|s| s.vi.strong_count() > 0 && s.seg.strong_count() > 0);
        served.push(Served {
            vi: Arc::downgrade(vi),
            seg: Arc::downgrade(seg),
            side,
            peer_pid,
        });
    }

    /// Withdraws the grants of every connection of `nic` (see
    /// [`conn::revoke`]): all counts first, then one barrier, then the
    /// waits.
    pub fn revoke(&self, nic: &crate::nic::NicShared) {
        let conns: Vec<(Arc<Segment>, usize, i32)> = self
            .served
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|s| {
                s.vi.upgrade()
                    .is_some_and(|vi| std::ptr::eq(Arc::as_ptr(&vi.nic), nic))
            })
            .filter_map(|s| Some((s.seg.upgrade()?, s.side, s.peer_pid)))
            .collect();
        let mut light = false;
        for (seg, side, _) in &conns {
            light |= conn::revoke_start(seg, *side);
        }
        if light {
            conn::fence::global();
        }
        for (seg, side, pid) in &conns {
            conn::revoke_wait(seg, *side, *pid);
        }
    }

    fn run(&self) {
        loop {
            // A peer that checks the descriptor makes it non-blocking (the
            // flags belong to the file both processes hold), so the agent
            // sleeps in poll and then reads.
            let mut p = libc::pollfd {
                fd: self.efd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd; no timeout.
            if unsafe { libc::poll(&mut p, 1, -1) } < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // Polling our own eventfd cannot fail; should it, peers are
                // still served by this process's own calls.
                return;
            }
            let mut n = 0u64;
            // SAFETY: reading 8 bytes into a live u64 from our eventfd. It
            // resets the counter; a read that finds it zero (another reader
            // of a forked copy) is harmless.
            unsafe {
                libc::read(
                    self.efd.as_raw_fd(),
                    &mut n as *mut u64 as *mut libc::c_void,
                    8,
                )
            };
            let asked: Vec<Arc<ViShared>> = self
                .served
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter(|s| {
                    // Cleared before serving: an ask from now on wakes the agent again.
                    s.seg.upgrade().is_some_and(|seg| {
                        block_in(&seg, s.side).want.swap(0, Ordering::AcqRel) != 0
                    })
                })
                .filter_map(|s| s.vi.upgrade())
                .collect();
            for s in asked {
                serve(Vi { s });
            }
        }
    }
}

/// Runs progress on `vi`, whose peer asked for it, while it is connected
/// (a VI disconnected here keeps its old transport until it connects again:
/// receives posted for the next connection are not the old peer's).
fn serve(vi: Vi) {
    let mut g = vi.lock();
    if vi.state() != ViState::Connected {
        return;
    }
    let ViInner { q, t } = &mut *g;
    if let Transport::Shm(t) = t {
        crate::provider::TransportOps::progress(t, &vi, q);
    }
}
