//! A thread counted in a counter while a guard lives: how waiters tell
//! wakers that someone sleeps (a CQ's sleepers, a VI's receive sleepers,
//! the faces' own).

use std::sync::atomic::{AtomicU32, Ordering};

/// Counts a thread in a counter until dropped. The count is raised sequentially
/// consistent: a waker that publishes its work and then reads the count,
/// and a waiter that counts itself and then looks for work, cannot both
/// miss each other. It is lowered relaxed: a waker that still sees the
/// waiter only does a wake-up too many.
pub struct CountGuard<'a>(&'a AtomicU32);

impl<'a> CountGuard<'a> {
    pub fn new(n: &'a AtomicU32) -> CountGuard<'a> {
        n.fetch_add(1, Ordering::SeqCst);
        CountGuard(n)
    }
}

impl Drop for CountGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
