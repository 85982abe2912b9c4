//! Panics stop at the C boundary (`uvia-ffi`). Every exported function
//! runs its body through [`call`], and the library's own threads run their
//! work through [`catch`]: a panic there (a bug in the library or the core)
//! becomes one line on stderr naming the function and `VIP_ERROR_RESOURCE`,
//! and the program carries on instead of aborting.
//!
//! `UVIA_VIPL_TEST_PANIC`, a comma-separated list of function names (or
//! `vipl-notify`, the library thread), makes the first guarded run of each
//! named one panic, so that tests can see the above (docs/VIPL.md).

use crate::types::{ret, VipReturn};
use uvia_ffi::Boundary;

/// The test hook's environment variable.
pub const TEST_PANIC_VAR: &str = "UVIA_VIPL_TEST_PANIC";

static BOUNDARY: Boundary = Boundary::new("vipl", TEST_PANIC_VAR);

/// Runs an exported function's body; a panic is `VIP_ERROR_RESOURCE`.
pub fn call(name: &'static str, f: impl FnOnce() -> VipReturn) -> VipReturn {
    catch(name, f).unwrap_or(ret::ERROR_RESOURCE)
}

/// Runs `f`; if it panics, writes one line naming `what` to stderr and
/// returns `None`.
#[inline]
pub fn catch<R>(what: &str, f: impl FnOnce() -> R) -> Option<R> {
    BOUNDARY.catch(what, f)
}

/// Makes the next guarded run of `name` panic.
#[cfg(test)]
fn arm(name: &str) {
    BOUNDARY.arm(name);
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
        // Panics elsewhere still panic.
        assert!(std::panic::catch_unwind(|| panic!("not guarded")).is_err());
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
