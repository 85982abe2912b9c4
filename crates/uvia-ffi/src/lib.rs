//! What uvia's C faces share: panics stop at the C boundary.
//!
//! Each face (the VIPL library, the libfabric provider) has one
//! [`Boundary`] and runs the body of every function it exports, and the work
//! of its own threads, through [`Boundary::catch`]: a panic there (a bug in
//! the face or the core) becomes one line on stderr naming the function,
//! the call returns `None` (the face turns it into its error code), and the
//! program carries on instead of aborting, as unwinding into C would.
//!
//! The default panic hook would print several lines first. The hook
//! installed here keeps quiet for panics inside a guarded body (it leaves
//! the message and place for the line) and hands every other panic to the
//! hook that was there before. Knowing "inside" takes a thread-local flag
//! set and cleared on every call: about 3.5 ns a call (the thread-local
//! lookup of a shared library), the whole cost of the guard.
//!
//! A face loaded into a C program can skip that flag
//! ([`Boundary::every_panic_is_guarded`]): a shared library carries its own
//! copy of the standard library, so every panic its hook sees is the
//! library's own, and a program's thread runs the library's code only
//! inside its entries, all guarded. The library's own threads (all named
//! `uvia-...`) are told apart by name and reported in full. The flag then
//! matters only where the face is linked into a Rust program (its tests),
//! whose own panics must still reach the hook before.
//!
//! A face's test variable (`UVIA_VIPL_TEST_PANIC`, `UVIA_FI_TEST_PANIC`), a
//! comma-separated list of function names, makes the first guarded run of
//! each named one panic, so that tests can see the above.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

/// Every panic this copy of the standard library sees comes from inside a
/// guarded body ([`Boundary::every_panic_is_guarded`]).
static ALL_GUARDED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set while this thread runs a guarded body.
    static GUARDED: Cell<bool> = const { Cell::new(false) };
    /// The message and place of the guarded panic being unwound, from the hook.
    static MESSAGE: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// One face's boundary: the prefix of its lines and its test variable.
pub struct Boundary {
    prefix: &'static str,
    test_var: &'static str,
    init: Once,
    /// Names that panic on their next guarded run, and how many (so that
    /// a run reads one atomic, not a lock, when none is armed).
    armed: Mutex<Vec<String>>,
    armed_count: AtomicUsize,
}

impl Boundary {
    /// A boundary whose lines start `<prefix>: ` and whose test variable
    /// is `test_var`.
    pub const fn new(prefix: &'static str, test_var: &'static str) -> Boundary {
        Boundary {
            prefix,
            test_var,
            init: Once::new(),
            armed: Mutex::new(Vec::new()),
            armed_count: AtomicUsize::new(0),
        }
    }

    /// The test variable's name.
    pub fn test_var(&self) -> &'static str {
        self.test_var
    }

    /// Declares that every panic of this copy of the standard library
    /// happens inside a guarded body, so guarded runs need not mark
    /// themselves (see the module's text). For a shared library's entry
    /// point, called by a C program's loader: never in a Rust program,
    /// whose own panics would then lose their report.
    pub fn every_panic_is_guarded(&self) {
        ALL_GUARDED.store(true, Ordering::Relaxed);
    }

    /// Runs `f`; if it panics, writes one line naming `what` to stderr and
    /// returns `None`.
    pub fn catch<R>(&self, what: &str, f: impl FnOnce() -> R) -> Option<R> {
        self.init.call_once(|| self.start());
        // AssertUnwindSafe: after a panic the call's objects are left as
        // the panic left them; the faces' locks carry on after poisoning
        // (`lock`), and the caller is told the call failed.
        let body = AssertUnwindSafe(|| {
            self.test_panic(what);
            f()
        });
        let r = if ALL_GUARDED.load(Ordering::Relaxed) {
            panic::catch_unwind(body)
        } else {
            GUARDED.with(|g| {
                let outer = g.replace(true);
                let r = panic::catch_unwind(body);
                g.set(outer);
                r
            })
        };
        match r {
            Ok(v) => Some(v),
            Err(payload) => {
                let message = MESSAGE
                    .with(|m| m.borrow_mut().take())
                    .unwrap_or_else(|| text(&*payload).to_string());
                // One write, so that lines of several threads do not interleave.
                let line = format!(
                    "{}: {what}: internal error (panic): {}\n",
                    self.prefix,
                    message.replace('\n', " ")
                );
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
                None
            }
        }
    }

    /// Makes the next guarded run of `name` panic.
    pub fn arm(&self, name: &str) {
        lock(&self.armed).push(name.to_string());
        self.armed_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Installs the hook (once per program) and reads the test variable.
    fn start(&self) {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            let previous = panic::take_hook();
            panic::set_hook(Box::new(move |info| {
                if GUARDED.try_with(Cell::get).unwrap_or(false)
                    || (ALL_GUARDED.load(Ordering::Relaxed) && !library_thread())
                {
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
        });
        if let Ok(names) = std::env::var(self.test_var) {
            for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                self.arm(name);
            }
        }
    }

    /// Panics if `what` is armed (and disarms it). Inlined: one load on
    /// every call.
    #[inline(always)]
    fn test_panic(&self, what: &str) {
        if self.armed_count.load(Ordering::Relaxed) != 0 {
            self.armed_panic(what);
        }
    }

    #[cold]
    #[inline(never)]
    fn armed_panic(&self, what: &str) {
        let hit = {
            let mut armed = lock(&self.armed);
            let i = armed.iter().position(|n| n == what);
            i.map(|i| armed.remove(i))
        };
        if hit.is_some() {
            self.armed_count.fetch_sub(1, Ordering::Relaxed);
            panic!("provoked by {}", self.test_var);
        }
    }
}

/// This thread is one the library started (they are all named `uvia-...`),
/// not a program's thread inside a guarded call. Its panics are reported in
/// full: not all of its work runs in a guarded body.
fn library_thread() -> bool {
    std::thread::current()
        .name()
        .is_some_and(|n| n.starts_with("uvia-"))
}

/// Locks `m`, carrying on after a panic elsewhere poisoned it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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

    static B: Boundary = Boundary::new("test", "UVIA_FFI_TEST_PANIC_UNUSED");

    #[test]
    fn a_panic_is_caught_and_the_next_run_works() {
        assert_eq!(B.catch("ffi-test-a", || -> u8 { panic!("boom") }), None);
        B.arm("ffi-test-b");
        assert_eq!(B.catch("ffi-test-b", || 7), None);
        assert_eq!(B.catch("ffi-test-b", || 7), Some(7));
        // The hook left nothing behind, and panics elsewhere still panic.
        assert!(MESSAGE.with(|m| m.borrow().is_none()));
        assert!(!GUARDED.with(Cell::get));
        assert!(panic::catch_unwind(|| panic!("not guarded")).is_err());
    }

    #[test]
    fn nested_runs_stay_guarded() {
        let r = B.catch("ffi-test-outer", || {
            let inner = B.catch("ffi-test-inner", || -> u8 { panic!("inner") });
            (inner, GUARDED.with(Cell::get))
        });
        assert_eq!(r, Some((None, true)));
        assert!(!GUARDED.with(Cell::get));
    }
}
