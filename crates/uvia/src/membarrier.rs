//! `membarrier(2)`: the heavy half of an asymmetric barrier. The hot side
//! of a protocol stores and loads with no barrier between; the rare side
//! runs this, which puts a full barrier on every CPU that runs a thread of
//! the processes in scope, between its own store and load (the pattern of
//! user-space read-copy-update). Used by the shm direct writes' grants
//! (`provider::shm::conn::Grants`, across processes) and by the biased
//! lock (`bias`, within this one).

use std::sync::OnceLock;

/// Whose CPUs a barrier reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every process registered for it (the peer's too).
    Global,
    /// This process's threads only.
    Private,
}

const QUERY: libc::c_int = 0;
const GLOBAL: libc::c_int = 1 << 0;
const GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
const REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;
const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

fn membarrier(cmd: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes two integer arguments and no memory.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) }
}

impl Scope {
    fn commands(self) -> (libc::c_int, libc::c_int) {
        match self {
            Scope::Global => (GLOBAL_EXPEDITED, REGISTER_GLOBAL_EXPEDITED),
            Scope::Private => (PRIVATE_EXPEDITED, REGISTER_PRIVATE_EXPEDITED),
        }
    }
}

/// Registers this process for the expedited barrier of `scope`, once;
/// true when the kernel has it (the hot side may then skip its barrier).
pub fn register(scope: Scope) -> bool {
    static GLOBAL_DONE: OnceLock<bool> = OnceLock::new();
    static PRIVATE_DONE: OnceLock<bool> = OnceLock::new();
    let once = match scope {
        Scope::Global => &GLOBAL_DONE,
        Scope::Private => &PRIVATE_DONE,
    };
    *once.get_or_init(|| {
        let (run, register) = scope.commands();
        let cmds = membarrier(QUERY);
        cmds >= 0 && cmds & run as libc::c_long != 0 && membarrier(register) == 0
    })
}

/// Runs the expedited barrier of `scope`. Should this process be refused
/// it (a system-call filter the peer does not have), the slow global
/// barrier, and failing that a nap far longer than a store takes to leave
/// a CPU's store buffer.
pub fn run(scope: Scope) {
    if membarrier(scope.commands().0) != 0 && membarrier(GLOBAL) != 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
