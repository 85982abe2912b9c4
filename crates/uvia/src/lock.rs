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
//!
//! Even a free spin lock costs a locked compare-and-swap, which waits for
//! every store before it to reach the cache: about 9 ns here, and a VI's
//! message path takes the lock twice per message (the receive's done call,
//! the reply's post), where a program with one thread per VI needs no
//! exclusion at all. So a lock that one thread has taken many times in a
//! row is *biased* to it: that thread then takes and releases it with plain
//! stores and loads. Another thread that wants it takes the ordinary lock,
//! revokes the bias for good and, with `membarrier`, makes every running
//! thread of the process pass a full barrier before it looks whether the
//! biased thread is inside: either it sees the holder's flag, or the
//! holder's check sees the revocation (an asymmetric Dekker pair, the heavy
//! half paid once per lock). Where `membarrier` is missing no lock is biased.

use std::cell::{Cell, UnsafeCell};
use std::hint::spin_loop;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicI32, AtomicU64, Ordering};

/// Spins before a waiter starts yielding its core: a few microseconds,
/// longer than any section held under the lock on the data path.
const SPINS: u32 = 256;

/// Acquisitions in a row by one thread after which the lock is biased to it.
const BIAS_AFTER: u32 = 1024;

/// `bias` of a lock biased to nobody yet.
const UNSET: u64 = 0;
/// `bias` of a lock whose bias was revoked: never biased again, so that a
/// lock shared by several threads pays the revocation once.
const REVOKED: u64 = u64::MAX;

/// A spin lock whose waiters yield the core after [`SPINS`] tries, biased
/// to the thread that uses it alone (see the module's comment).
pub(crate) struct SpinLock<T> {
    /// The ordinary lock.
    locked: AtomicBool,
    /// [`UNSET`], [`REVOKED`] or the token of the thread the lock is biased
    /// to. Changes only while `locked` is held.
    bias: AtomicU64,
    /// Set by the biased thread while it holds the lock without `locked`.
    busy: AtomicBool,
    /// The last thread that took `locked` and how many times in a row;
    /// touched only while `locked` is held.
    streak: Cell<(u64, u32)>,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and guards exclude
// each other (the ordinary lock, or the bias with its flag and the
// revocation's barrier); `streak` is touched only under `locked`.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: moving the lock moves the value; nothing refers to a thread.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T: Default> Default for SpinLock<T> {
    fn default() -> Self {
        SpinLock::new(T::default())
    }
}

/// The lock held; released when dropped.
pub(crate) struct Guard<'a, T> {
    lock: &'a SpinLock<T>,
    /// Held through the bias (release `busy`), not `locked`.
    biased: bool,
}

/// This thread's token: non-zero, never [`REVOKED`], unique in the process.
#[inline(always)]
fn token() -> u64 {
    thread_local! {
        static TOKEN: Cell<u64> = const { Cell::new(UNSET) };
    }
    TOKEN.with(|t| {
        let v = t.get();
        if v != UNSET {
            return v;
        }
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let v = NEXT.fetch_add(1, Ordering::Relaxed);
        t.set(v);
        v
    })
}

/// `linux/membarrier.h`, which the libc crate does not declare.
const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 8;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 16;

fn membarrier(cmd: libc::c_int) -> bool {
    // SAFETY: a system call with integer arguments only.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) == 0 }
}

/// True once this process may use the expedited barrier (registered once
/// per process; a forked child registers again).
fn barrier_ready() -> bool {
    static REGISTERED_BY: AtomicI32 = AtomicI32::new(0);
    // A kernel without the call (or without this command) stays without it.
    static MISSING: AtomicBool = AtomicBool::new(false);
    if MISSING.load(Ordering::Relaxed) {
        return false;
    }
    let pid = std::process::id() as i32;
    if REGISTERED_BY.load(Ordering::Acquire) == pid {
        return true;
    }
    if membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) {
        REGISTERED_BY.store(pid, Ordering::Release);
        return true;
    }
    let e = std::io::Error::last_os_error().raw_os_error();
    if e == Some(libc::ENOSYS) || e == Some(libc::EINVAL) {
        MISSING.store(true, Ordering::Relaxed);
    }
    false
}

/// Makes every running thread of the process pass a full memory barrier.
/// A lock is biased only after [`barrier_ready`] said yes in this process,
/// so the first call works; the global barrier (slower, no registration)
/// and retries only guard against the impossible, never going on without
/// the barrier.
#[cold]
fn barrier_all_threads() {
    loop {
        if membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)
            || (barrier_ready() && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED))
            || membarrier(MEMBARRIER_CMD_GLOBAL)
        {
            return;
        }
        std::thread::yield_now();
    }
}

impl<T> SpinLock<T> {
    pub(crate) const fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            bias: AtomicU64::new(UNSET),
            busy: AtomicBool::new(false),
            streak: Cell::new((UNSET, 0)),
            value: UnsafeCell::new(value),
        }
    }

    /// The biased thread's way in: plain stores and loads.
    #[inline(always)]
    fn try_biased(&self, me: u64) -> Option<Guard<'_, T>> {
        if self.bias.load(Ordering::Relaxed) != me {
            return None;
        }
        self.busy.store(true, Ordering::Relaxed);
        // The light half of the pair: the compiler keeps the flag's store
        // before the check; the processor may not, which the revoker's
        // barrier covers. Acquire: the value is not read before the check.
        compiler_fence(Ordering::SeqCst);
        if self.bias.load(Ordering::Acquire) == me {
            return Some(Guard {
                lock: self,
                biased: true,
            });
        }
        self.busy.store(false, Ordering::Release);
        None
    }

    #[inline(always)]
    fn try_cas(&self) -> bool {
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// With `locked` just taken: revokes another thread's bias and makes
    /// sure that thread is out (waits for it, or with `wait` false gives
    /// `locked` back and returns `None` while it is in), or counts this
    /// thread's streak and biases the lock to it once the streak is long.
    #[inline(always)]
    fn taken(&self, me: u64, wait: bool) -> Option<Guard<'_, T>> {
        let bias = self.bias.load(Ordering::Relaxed);
        if bias == UNSET {
            let (who, n) = self.streak.get();
            let n = if who == me { n.saturating_add(1) } else { 1 };
            self.streak.set((me, n));
            if n >= BIAS_AFTER {
                // Tried once per streak: where the barrier is refused, a
                // lock costs two system calls per BIAS_AFTER acquisitions.
                self.streak.set((me, 0));
                self.bias_to(me);
            }
        } else if bias != me
            // Acquire: pairs with the former biased holder's release.
            && (bias != REVOKED || self.busy.load(Ordering::Acquire))
            && !self.biased_thread_out(bias, wait)
        {
            self.locked.store(false, Ordering::Release);
            return None;
        }
        Some(Guard {
            lock: self,
            biased: false,
        })
    }

    #[cold]
    fn bias_to(&self, me: u64) {
        if barrier_ready() {
            self.bias.store(me, Ordering::Relaxed);
        }
    }

    /// The lock was biased to another thread: revokes that (once) and
    /// tells whether that thread is out of the lock, waiting for it if
    /// `wait`.
    #[cold]
    fn biased_thread_out(&self, bias: u64, wait: bool) -> bool {
        if bias != REVOKED {
            self.bias.store(REVOKED, Ordering::Relaxed);
            barrier_all_threads();
        }
        // Acquire: pairs with the biased holder's release of `busy`.
        let mut spins = 0u32;
        while self.busy.load(Ordering::Acquire) {
            if !wait {
                return false;
            }
            spins += 1;
            if spins < SPINS {
                spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        true
    }

    /// Takes the lock: plain stores for the thread it is biased to, else
    /// one compare-and-swap when it is free.
    #[inline(always)]
    pub(crate) fn lock(&self) -> Guard<'_, T> {
        let me = token();
        if let Some(g) = self.try_biased(me) {
            return g;
        }
        self.lock_unbiased(me)
    }

    #[inline(never)]
    fn lock_unbiased(&self, me: u64) -> Guard<'_, T> {
        if self.try_cas() {
            if let Some(g) = self.taken(me, true) {
                return g;
            }
        }
        self.lock_contended(me)
    }

    #[cold]
    fn lock_contended(&self, me: u64) -> Guard<'_, T> {
        for _ in 0..SPINS {
            spin_loop();
            if self.try_cas() {
                if let Some(g) = self.taken(me, true) {
                    return g;
                }
            }
        }
        loop {
            std::thread::yield_now();
            if self.try_cas() {
                if let Some(g) = self.taken(me, true) {
                    return g;
                }
            }
        }
    }

    /// The value, through exclusive access (no lock needed).
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }

    /// The lock if it is free now (a lock biased to another thread loses
    /// its bias here, and is not free while that thread holds it).
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<Guard<'_, T>> {
        let me = token();
        if self.bias.load(Ordering::Relaxed) == me {
            // The biased thread holds it already when its flag is up.
            if self.busy.load(Ordering::Relaxed) {
                return None;
            }
            if let Some(g) = self.try_biased(me) {
                return Some(g);
            }
        }
        if !self.try_cas() {
            return None;
        }
        self.taken(me, false)
    }

    #[cfg(test)]
    fn biased_to_me(&self) -> bool {
        self.bias.load(Ordering::Relaxed) == token()
    }
}

impl<T> Drop for Guard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // Release: what was written under the lock is seen by the next holder.
        if self.biased {
            self.lock.busy.store(false, Ordering::Release);
        } else {
            self.lock.locked.store(false, Ordering::Release);
        }
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard excludes every other guard of the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and the guard is borrowed mutably.
        unsafe { &mut *self.lock.value.get() }
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

    /// A lock one thread has used alone becomes biased to it; a second
    /// thread then revokes the bias, and from then on the two exclude each
    /// other: every unlocked increment of a plain counter lands.
    #[test]
    fn bias_is_granted_then_revoked_without_losing_exclusion() {
        let lock = Arc::new(SpinLock::new(0u64));
        for _ in 0..2 * BIAS_AFTER {
            *lock.lock() += 1;
        }
        if !barrier_ready() {
            eprintln!("skipped the bias half: no membarrier on this kernel");
        } else {
            assert!(
                lock.biased_to_me(),
                "a lock used by one thread is biased to it"
            );
        }
        let n = 200_000u64;
        let other = {
            let lock = lock.clone();
            std::thread::spawn(move || {
                for _ in 0..n {
                    let mut g = lock.lock();
                    // A read and a later write: a second holder in between loses one.
                    let v = *g;
                    std::hint::spin_loop();
                    *g = v + 1;
                }
            })
        };
        for _ in 0..n {
            let mut g = lock.lock();
            let v = *g;
            std::hint::spin_loop();
            *g = v + 1;
        }
        other.join().unwrap();
        assert_eq!(*lock.lock(), 2 * BIAS_AFTER as u64 + 2 * n);
        assert!(!lock.biased_to_me(), "revoked for good once shared");
    }

    /// `try_lock` from another thread while the lock is biased: it revokes
    /// the bias and then refuses while the former holder holds the lock.
    #[test]
    fn try_lock_from_another_thread_revokes_the_bias() {
        let lock = Arc::new(SpinLock::new(0u64));
        for _ in 0..2 * BIAS_AFTER {
            *lock.lock() += 1;
        }
        let g = lock.lock();
        assert!(
            lock.try_lock().is_none(),
            "a holder's second take is refused"
        );
        drop(g);
        let l2 = lock.clone();
        let got = std::thread::spawn(move || l2.try_lock().map(|mut g| *g += 1).is_some())
            .join()
            .unwrap();
        assert!(got, "a free lock is taken");
        let g = lock.lock();
        let l2 = lock.clone();
        let refused = std::thread::spawn(move || l2.try_lock().is_none())
            .join()
            .unwrap();
        assert!(refused, "the holder keeps it");
        drop(g);
        assert_eq!(*lock.lock(), 2 * BIAS_AFTER as u64 + 1);
    }
}
