//! Panics stop at the C boundary. Every exported function runs its body
//! through [`call`], and the library's own threads run their work through
//! [`catch`]: a panic there (a bug in the library or the core) becomes one
//! line on stderr naming the function and `VIP_ERROR_RESOURCE`, and the
//! program carries on instead of aborting.
//!
//! The default panic hook would print several lines first; the hook
//! installed here keeps quiet for panics inside a guarded body (it leaves
//! the message for the line) and hands every other panic to the hook that
//! was there before. Knowing "inside" takes a thread-local flag set and
//! cleared on every call: about 3.5 ns a call on the test machine (the
//! thread-local lookup of a shared library), the whole cost of the guard.
//!
//! `UVIA_VIPL_TEST_PANIC`, a comma-separated list of function names (or
//! `vipl-notify`, the library thread), makes the first guarded run of each
//! named one panic, so that tests can see the above (docs/VIPL.md).

use crate::handle::lock;
use crate::types::{ret, VipReturn};
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};

/// The test hook's environment variable.
pub const TEST_PANIC_VAR: &str = "UVIA_VIPL_TEST_PANIC";

thread_local! {
    /// Set while this thread runs a guarded body.
    static GUARDED: Cell<bool> = const { Cell::new(false) };
    /// The message and place of the guarded panic being unwound, from the hook.
    static MESSAGE: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Names that panic on their next guarded run, and how many there are (so
/// that a run checks the list only when it is not empty).
static ARMED: Mutex<Vec<String>> = Mutex::new(Vec::new());
static ARMED_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Runs an exported function's body; a panic is `VIP_ERROR_RESOURCE`.
pub fn call(name: &'static str, f: impl FnOnce() -> VipReturn) -> VipReturn {
    catch(name, f).unwrap_or(ret::ERROR_RESOURCE)
}

/// Runs `f`; if it panics, writes one line naming `what` to stderr and
/// returns `None`.
pub fn catch<R>(what: &str, f: impl FnOnce() -> R) -> Option<R> {
    static INIT: Once = Once::new();
    INIT.call_once(init);
    let r = GUARDED.with(|g| {
        let outer = g.replace(true);
        // AssertUnwindSafe: after a panic the call's objects are left as
        // the panic left them; the locks that guard them carry on after
        // poisoning (`handle::lock`), as the crate's data stays consistent.
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
                "vipl: {what}: internal error (panic): {}\n",
                message.replace('\n', " ")
            );
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
            None
        }
    }
}

/// Installs the hook and reads the test hook's variable, once.
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
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            arm(name);
        }
    }
}

/// Makes the next guarded run of `name` panic.
pub fn arm(name: &str) {
    lock(&ARMED).push(name.to_string());
    ARMED_COUNT.fetch_add(1, Ordering::Relaxed);
}

/// Panics if `what` is armed (and disarms it). The check is inlined: one
/// load on every call.
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

/// A panic's message, when it is text.
fn text(payload: &(dyn Any + Send)) -> &str {
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
    fn a_panic_is_caught_and_the_next_run_works() {
        assert_eq!(catch("unwind-test-a", || panic!("boom")), None::<()>);
        arm("unwind-test-b");
        assert_eq!(call("unwind-test-b", || ret::SUCCESS), ret::ERROR_RESOURCE);
        assert_eq!(call("unwind-test-b", || ret::SUCCESS), ret::SUCCESS);
        // The hook left nothing behind, and panics elsewhere still panic.
        assert!(MESSAGE.with(|m| m.borrow().is_none()));
        assert!(!GUARDED.with(Cell::get));
        assert!(panic::catch_unwind(|| panic!("not guarded")).is_err());
    }

    #[test]
    fn nested_runs_stay_guarded() {
        let r = catch("unwind-test-outer", || {
            let inner = catch("unwind-test-inner", || panic!("inner"));
            (inner, GUARDED.with(Cell::get))
        });
        assert_eq!(r, Some((None::<()>, true)));
    }

    /// Every exported function runs its body through `call` (directly or
    /// by `vip`) under its own name.
    #[test]
    fn every_exported_function_is_guarded() {
        let files = [
            include_str!("nic.rs"),
            include_str!("cm.rs"),
            include_str!("data.rs"),
        ];
        let mut n = 0;
        for file in files {
            for piece in file.split("extern \"C\" fn ").skip(1) {
                let name = &piece[..piece.find('(').unwrap()];
                let body = &piece[..piece.find("\n}\n").unwrap_or(piece.len())];
                let guarded = body.contains(&format!("vip(\"{name}\""))
                    || body.contains(&format!("call(\"{name}\""));
                assert!(guarded, "{name} does not catch panics");
                n += 1;
            }
        }
        assert_eq!(n, 41, "exported functions found");
    }
}
