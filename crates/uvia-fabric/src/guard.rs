//! Panics stop at the C boundary, as in the VIPL face (`uvia-ffi`): every
//! function libfabric calls (the entry point, getinfo, every op in a table)
//! runs its body through [`call`]; a panic there (a bug in the provider or
//! the core) becomes one line on stderr naming the function, the call
//! returns `-FI_EOTHER`, and the program carries on. `UVIA_FI_TEST_PANIC`, a
//! comma-separated list of function names, makes the first guarded run of
//! each panic, for tests.

use crate::sys::err;
use std::ffi::c_int;
use uvia_ffi::Boundary;

pub use uvia_ffi::lock;

/// The test hook's environment variable.
pub const TEST_PANIC_VAR: &str = "UVIA_FI_TEST_PANIC";

static BOUNDARY: Boundary = Boundary::new("libfabric:uvia", TEST_PANIC_VAR);

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

/// Guarded runs stop marking themselves: the provider is loaded by a C
/// program (`fi_prov_ini`).
pub fn every_panic_is_guarded() {
    BOUNDARY.every_panic_is_guarded();
}

/// Runs `f`; if it panics, writes one line naming `what` and returns `None`.
#[inline]
pub fn catch<R>(what: &str, f: impl FnOnce() -> R) -> Option<R> {
    BOUNDARY.catch(what, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_eother_and_the_next_run_works() {
        assert_eq!(call("guard-test-a", || panic!("boom")), err::EOTHER);
        assert_eq!(call("guard-test-a", || Ok(())), 0);
        assert_eq!(call_ssize("guard-test-b", || Ok(7)), 7);
        assert!(std::panic::catch_unwind(|| panic!("not guarded")).is_err());
    }
}
