//! Panics stop at the C boundary, as in the VIPL face: every function
//! libfabric calls (the entry point, getinfo, every op in a table) runs its
//! body through [`call`]; a panic there (a bug in the provider or the
//! core) becomes one line on stderr naming the function, the call returns
//! `-FI_EOTHER`, and the program carries on.
//!
//! The hook installed here keeps the default hook's lines out of the way
//! for panics inside a guarded body and hands every other panic to the hook
//! that was there before. `UVIA_FI_TEST_PANIC`, a comma-separated list of
//! function names, makes the first guarded run of each panic, for tests.

use crate::sys::err;
use std::cell::{Cell, RefCell};
use std::ffi::c_int;
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};

/// The test hook's environment variable.
pub const TEST_PANIC_VAR: &str = "UVIA_FI_TEST_PANIC";

thread_local! {
    /// Set while this thread runs a guarded body.
    static GUARDED: Cell<bool> = const { Cell::new(false) };
    /// The message and place of the guarded panic being unwound, from the hook.
    static MESSAGE: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Names that panic on their next guarded run, and how many (so that the
/// data path reads one atomic, not a lock, when none is armed).
static ARMED: Mutex<Vec<String>> = Mutex::new(Vec::new());
static ARMED_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Runs the body of the libfabric entry `name`; a panic is `-FI_EOTHER`.
pub fn call(name: &'static str, f: impl FnOnce() -> Result<(), c_int>) -> c_int {
    match catch(name, f) {
        Some(Ok(())) => 0,
        Some(Err(e)) => e,
        None => err::EOTHER,
    }
}

/// [`call`] for the ops that return a count (`ssize_t`).
pub fn call_ssize(name: &'static str, f: impl FnOnce() -> Result<isize, c_int>) -> isize {
    match catch(name, f) {
        Some(Ok(n)) => n,
        Some(Err(e)) => e as isize,
        None => err::EOTHER as isize,
    }
}

/// Runs `f`; if it panics, writes one line naming `what` and returns `None`.
pub fn catch<R>(what: &str, f: impl FnOnce() -> R) -> Option<R> {
    static INIT: Once = Once::new();
    INIT.call_once(init);
    let r = GUARDED.with(|g| {
        let outer = g.replace(true);
        // AssertUnwindSafe: a panic leaves the call's objects as it found
        // them or half-changed; their locks carry on after poisoning
        // (`lock`), and the caller is told the call failed.
        let r = panic::catch_unwind(AssertUnwindSafe(|| {
            test_panic(what);
            f()
        }));
        g.set(outer);
        r
    });
    match r {
        Ok(v) => Some(v),
        Err(payload) => {
            let message = MESSAGE
                .with(|m| m.borrow_mut().take())
                .unwrap_or_else(|| text(&*payload).to_string());
            // One write, so that lines of several threads do not interleave.
            let line = format!(
                "libfabric:uvia: {what}: internal error (panic): {}\n",
                message.replace('\n', " ")
            );
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
            None
        }
    }
}

/// Locks `m`, carrying on after a panic elsewhere poisoned it.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn init() {
    let previous = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        if GUARDED.try_with(Cell::get).unwrap_or(false) {
            let at = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let message = format!("{}{at}", text(info.payload()));
            let _ = MESSAGE.try_with(|m| *m.borrow_mut() = Some(message));
        } else {
            previous(info);
        }
    }));
    if let Ok(names) = std::env::var(TEST_PANIC_VAR) {
        let mut armed = lock(&ARMED);
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            armed.push(name.to_string());
        }
        ARMED_COUNT.store(armed.len(), Ordering::Relaxed);
    }
}

#[inline(always)]
fn test_panic(what: &str) {
    if ARMED_COUNT.load(Ordering::Relaxed) != 0 {
        armed_panic(what);
    }
}

#[cold]
#[inline(never)]
fn armed_panic(what: &str) {
    let hit = {
        let mut armed = lock(&ARMED);
        let i = armed.iter().position(|n| n == what);
        i.map(|i| armed.remove(i))
    };
    if hit.is_some() {
        ARMED_COUNT.fetch_sub(1, Ordering::Relaxed);
        panic!("provoked by {TEST_PANIC_VAR}");
    }
}

fn text(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_eother_and_the_next_run_works() {
        assert_eq!(call("guard-test-a", || panic!("boom")), err::EOTHER);
        assert_eq!(call("guard-test-a", || Ok(())), 0);
        assert_eq!(call_ssize("guard-test-b", || Ok(7)), 7);
        assert!(!GUARDED.with(Cell::get));
        assert!(panic::catch_unwind(|| panic!("not guarded")).is_err());
    }
}
