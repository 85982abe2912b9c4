//! The library's progress thread: the protocol timers of network Nics
//! that nobody drives run between the program's calls.
//!
//! A network VI acknowledges, sends again and keeps its peer alive only
//! inside library calls ([`NicAttributes::needs_driving`]). Within one Nic
//! a VI's poll serves the others' due timers (a sweep), but nothing serves
//! a Nic whose VIs the program does not touch for a while: a program that
//! waits on a connection of one Nic while a connection of another owes its
//! peer an acknowledgement or a retransmission leaves that peer waiting,
//! and if the peer in turn waits for it before it answers, both wait until
//! their retransmissions run out (two connections between the same two
//! processes, each side waiting on the other one, broke so in seconds).
//!
//! So one thread per process looks at every open network Nic that asked
//! for it (all but those opened with [`NicOptions::manual_progress`]) and sweeps those that nobody
//! swept since its last look; a Nic its program keeps sweeping is left
//! alone, and while every Nic is so, the thread's sleep doubles up to
//! [`MAX_TICK`], so that a polling program's core is woken some 60 times a
//! second, not 1,000 (each wake-up lands between a message and its answer).
//! A sweep takes only VIs that nobody holds and whose deadlines have come,
//! so it never waits for the program.
//!
//! [`NicAttributes::needs_driving`]: crate::nic::NicAttributes::needs_driving
//! [`NicOptions::manual_progress`]: crate::nic::NicOptions::manual_progress

use crate::nic::NicShared;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The shortest sleep: a sweep serves deadlines at most this often anyway.
const TICK: Duration = Duration::from_millis(1);
/// The longest sleep while every Nic is swept by its program (a Nic that
/// stops being swept has its timers run within this much).
const MAX_TICK: Duration = Duration::from_millis(16);
/// The longest sleep while the thread serves a Nic with nothing due soon
/// (a Nic's deadlines say when the next is due; this bounds a look at a
/// Nic opened meanwhile).
const MAX_IDLE: Duration = Duration::from_millis(100);

/// A Nic the thread looks at, and the count of sweeps it saw there last.
struct Watched {
    nic: Weak<NicShared>,
    sweeps: Option<u64>,
}

/// The Nics one process's thread looks at.
struct Registry {
    /// The process whose thread this is: a child made by `fork` has no
    /// such thread (and the Nics it inherits are its parent's), so its
    /// first Nic starts a registry and a thread of its own.
    pid: u32,
    watched: Mutex<Vec<Watched>>,
}

static REGISTRY: Mutex<Option<Arc<Registry>>> = Mutex::new(None);

/// Has the progress thread look at `nic` from now on (started at the
/// first). A Nic closed is let go at the thread's next look.
pub(crate) fn watch(nic: &Arc<NicShared>) {
    lock(&registry().watched).push(Watched {
        nic: Arc::downgrade(nic),
        sweeps: None,
    });
}

/// This process's registry, its thread started if it is not running yet.
fn registry() -> Arc<Registry> {
    let mut current = lock(&REGISTRY);
    let pid = std::process::id();
    if let Some(r) = current.as_ref().filter(|r| r.pid == pid) {
        return r.clone();
    }
    let r = Arc::new(Registry {
        pid,
        watched: Mutex::new(Vec::new()),
    });
    let thread = r.clone();
    // A thread that cannot start leaves the Nics to their programs, as
    // before it was built.
    let _ = std::thread::Builder::new()
        .name("uvia-progress".into())
        .spawn(move || thread.run());
    *current = Some(r.clone());
    r
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Registry {
    fn run(&self) {
        let mut backoff = TICK;
        loop {
            let sleep = self.look(&mut backoff);
            std::thread::sleep(sleep);
        }
    }

    /// One look at every watched Nic: sweeps those nobody swept since the last
    /// look, and says how long to sleep.
    fn look(&self, backoff: &mut Duration) -> Duration {
        // The Nics taken out of the list first: a sweep may close a VI, whose
        // last reference may close its Nic, which must not find the list held.
        let nics: Vec<(usize, Arc<NicShared>, Option<u64>)> = {
            let mut w = lock(&self.watched);
            w.retain(|n| n.nic.strong_count() > 0);
            w.iter()
                .enumerate()
                .filter_map(|(i, n)| Some((i, n.nic.upgrade()?, n.sweeps)))
                .collect()
        };
        let mut next = MAX_IDLE;
        let mut driven_elsewhere = false;
        let mut seen = Vec::with_capacity(nics.len());
        for (i, nic, last) in &nics {
            let Some(now) = nic.provider.sweeps() else {
                continue;
            };
            if last.is_some_and(|l| l != now) {
                // Its program (or a face's thread) swept it since: it is driven.
                driven_elsewhere = true;
                seen.push((*i, now));
                continue;
            }
            nic.provider.run_due_timers();
            if let Some(d) = nic.provider.timers_due_in() {
                next = next.min(d);
            }
            seen.push((*i, nic.provider.sweeps().unwrap_or(now)));
        }
        {
            let mut w = lock(&self.watched);
            for (i, sweeps) in seen {
                // Only this thread takes entries out (the retain above);
                // others only push behind them: the indices still hold.
                if let Some(n) = w.get_mut(i) {
                    n.sweeps = Some(sweeps);
                }
            }
        }
        drop(nics);
        if driven_elsewhere {
            *backoff = (*backoff * 2).min(MAX_TICK);
            next = next.min(*backoff);
        } else {
            *backoff = TICK;
        }
        next.max(TICK)
    }
}
