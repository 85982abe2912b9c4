//! The lock of a VI and of a network Nic's shared state: a spin lock that
//! gives up its core when the holder is not running.
//!
//! A spin lock's release is a plain store, where `std::sync::Mutex`'s is an
//! exchange (a full barrier that waits for the ring store just made to
//! reach the other core), so the data path keeps one. But a pure spin lock
//! fails badly when the holder is descheduled: a second thread of the same
//! process on the same core (a library thread that drives timers, woken
//! every millisecond) preempts the polling thread while it holds the lock
//! and then spins for its whole time slice, milliseconds, because the one
//! thread that could release the lock waits for that core. Measured over
//! libfabric on udp, that made the mean one-way time 3.5x the figure
//! without the library thread. So a waiter spins a little, then yields.

use std::hint::spin_loop;
use std::ops::{Deref, DerefMut};

/// Spins before a waiter starts yielding its core: a few microseconds,
/// longer than any section held under the lock on the data path.
const SPINS: u32 = 256;

/// A spin lock whose waiters yield the core after [`SPINS`] tries.
#[derive(Default)]
pub struct SpinLock<T>(spin::Mutex<T>);

/// The lock held; released when dropped.
pub struct Guard<'a, T>(spin::MutexGuard<'a, T>);

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> SpinLock<T> {
        SpinLock(spin::Mutex::new(value))
    }

    /// Takes the lock: one compare-and-swap when it is free.
    #[inline]
    pub fn lock(&self) -> Guard<'_, T> {
        match self.0.try_lock() {
            Some(g) => Guard(g),
            None => self.lock_contended(),
        }
    }

    #[cold]
    fn lock_contended(&self) -> Guard<'_, T> {
        for _ in 0..SPINS {
            spin_loop();
            if let Some(g) = self.0.try_lock() {
                return Guard(g);
            }
        }
        loop {
            std::thread::yield_now();
            if let Some(g) = self.0.try_lock() {
                return Guard(g);
            }
        }
    }

    /// The value, through exclusive access (no lock needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut()
    }

    /// The lock if it is free now.
    #[inline]
    pub fn try_lock(&self) -> Option<Guard<'_, T>> {
        self.0.try_lock().map(Guard)
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> DerefMut for Guard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// Two threads on whatever cores they get, one lock: every increment
    /// lands, and a holder that sleeps (descheduled) does not leave the
    /// other spinning forever.
    #[test]
    fn waiters_get_the_lock_from_a_holder_that_sleeps() {
        let lock = Arc::new(SpinLock::new(0u64));
        let done = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (lock, done) = (lock.clone(), done.clone());
                std::thread::spawn(move || {
                    for i in 0..2000 {
                        let mut g = lock.lock();
                        *g += 1;
                        if i % 500 == 0 {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), 4000);
        assert_eq!(done.load(Ordering::Relaxed), 2);
        let g = lock.lock();
        assert!(lock.try_lock().is_none());
        drop(g);
        assert!(lock.try_lock().is_some());
    }
}
