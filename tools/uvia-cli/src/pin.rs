//! Pinning the calling process to one core.

use anyhow::{bail, Result};

/// The calling thread's current affinity mask.
pub fn current() -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            Some(set)
        } else {
            None
        }
    }
}

/// Restores a mask saved by [`current`].
pub fn restore(set: &libc::cpu_set_t) {
    // SAFETY: the mask came from sched_getaffinity.
    unsafe {
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set);
    }
}

/// Pins the calling thread (the whole process when it has one thread) to `core`.
pub fn pin_to(core: usize) -> Result<()> {
    if core >= libc::CPU_SETSIZE as usize {
        bail!("core {core} is out of range");
    }
    // SAFETY: CPU_SET writes inside the zeroed set; sched_setaffinity reads it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        bail!(
            "cannot pin to core {core}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Pins to `core` when given, printing a warning (not failing) when the host lacks it.
pub fn pin_or_warn(core: Option<usize>, who: &str) {
    if let Some(c) = core {
        if let Err(e) = pin_to(c) {
            eprintln!("uvia: warning: {who}: {e:#}; running unpinned");
        }
    }
}

/// Pins a program this one starts to `core`, between its fork and exec.
pub fn pin_child(c: &mut std::process::Command, core: usize) {
    // SAFETY: the closure only makes a system call (sched_setaffinity),
    // safe between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(c, move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(core, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            Ok(())
        });
    }
}
