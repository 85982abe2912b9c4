//! The lock of a VI (and of the libfabric provider's operation pools and
//! deferred receives): a spin lock ([`crate::lock`]) that the one thread
//! which takes it again and again comes to own, and then takes with no
//! locked instruction.
//!
//! Each post and each done call takes the VI's lock. Taken by a
//! compare-and-swap, a locked instruction that also waits for every store
//! before it to leave the core, it cost one thread posting 8 B one-sided
//! writes on shm 5 of 73.5 TSC ticks a post, and 19 of 135 with the share
//! of the reaping (`examples/rdma_write_cost.rs`). A program that drives a
//! VI from one thread pays it for nothing.
//!
//! So the lock is biased, as a JVM biases an object's monitor: once one
//! thread has taken it [`BIAS_AFTER`] times in a row, it becomes the
//! owner. The owner enters by storing `busy` and reading `owner` again,
//! with no barrier between; any other thread takes the ordinary lock,
//! clears `owner`, and then runs `membarrier(2)`'s private expedited
//! barrier, which puts a full barrier on every CPU that runs a thread of
//! this process, before it reads `busy`. Either the owner's store is seen
//! (the other waits for the owner to leave), or the owner's second read
//! sees `owner` cleared (it leaves `busy` and takes the ordinary lock): the
//! asymmetric barrier of user-space read-copy-update, as the shm direct
//! writes use it ([`crate::membarrier`]). A revocation costs a
//! system call and an interrupt of the owner's CPU, so each one doubles
//! the run that earns the bias back: a lock that two threads share for
//! real soon stays ordinary.
//!
//! The VI allows the bias on shm connections only: the network providers
//! drive each other's VIs from whichever thread polls the Nic (and a
//! library thread), and their path is a system call long.

use crate::membarrier::{self, Scope};
use std::cell::UnsafeCell;
use std::hint::spin_loop;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicUsize, Ordering};

/// Takes in a row by one thread that earn it the bias, before any
/// revocation; each revocation doubles it, up to [`BIAS_AFTER_MAX`].
pub const BIAS_AFTER: u32 = 64;
#[cfg(not(test))]
const BIAS_AFTER_MAX: u32 = 1 << 30;
/// In tests the bias comes back soon, so that every take by another
/// thread races with an owner.
#[cfg(test)]
const BIAS_AFTER_MAX: u32 = 4 * BIAS_AFTER;

/// Spins before a waiter yields its core (as in [`crate::lock`]).
const SPINS: u32 = 256;

/// A lock whose steady user takes it without a locked instruction.
pub struct BiasedLock<T> {
    /// The ordinary lock, taken by every thread but the owner.
    held: AtomicBool,
    /// The owner's [`thread_id`], 0 for none. Set under `held`.
    owner: AtomicUsize,
    /// Set by the owner while it holds the lock through the bias.
    busy: AtomicBool,
    /// Whether the bias may be given.
    allowed: AtomicBool,
    /// Under `held`: who took it last, how many times in a row, and the run
    /// that earns the bias.
    streak: UnsafeCell<Streak>,
    value: UnsafeCell<T>,
}

struct Streak {
    thread: usize,
    count: u32,
    needed: u32,
}

// SAFETY: the value is reached only through a guard, which the lock makes
// exclusive; `streak` only under `held`.
unsafe impl<T: Send> Send for BiasedLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for BiasedLock<T> {}

impl<T: Default> Default for BiasedLock<T> {
    /// A lock around `T::default()`, the bias not allowed.
    fn default() -> BiasedLock<T> {
        BiasedLock::new(T::default())
    }
}

/// The lock held; released when dropped.
pub struct Guard<'a, T> {
    lock: &'a BiasedLock<T>,
    biased: bool,
}

/// This thread's identity for the bias: its thread pointer, never 0 and
/// unique among live threads. (A thread that starts where a dead owner
/// lived inherits its bias, which is harmless: a dead thread holds
/// nothing.)
///
/// On x86-64 Linux the thread pointer is the first word of the thread's
/// control block (`%fs:0`, by the psABI's TLS rules): one load. A
/// `thread_local!` would do, but in a shared library (the libfabric
/// provider, the VIPL library) each access is a call to `__tls_get_addr`,
/// twice on a message's path.
#[inline(always)]
fn thread_id() -> usize {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let tp: usize;
        // SAFETY: reads the thread control block's self pointer, which the
        // psABI places at %fs:0 for every thread; no memory is written.
        unsafe {
            std::arch::asm!(
                "mov {}, qword ptr fs:[0]",
                out(reg) tp,
                options(nostack, readonly, preserves_flags)
            )
        };
        tp
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        thread_local!(static MARK: u8 = const { 0 });
        MARK.with(|m| m as *const u8 as usize)
    }
}

impl<T> BiasedLock<T> {
    pub fn new(value: T) -> BiasedLock<T> {
        BiasedLock {
            held: AtomicBool::new(false),
            owner: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            allowed: AtomicBool::new(false),
            streak: UnsafeCell::new(Streak {
                thread: 0,
                count: 0,
                needed: BIAS_AFTER,
            }),
            value: UnsafeCell::new(value),
        }
    }

    /// Allows the bias, or takes it away (from the next take on; an owner
    /// keeps it until another thread takes the lock).
    pub fn allow_bias(&self, on: bool) {
        self.allowed.store(
            on && membarrier::register(Scope::Private),
            Ordering::Relaxed,
        );
    }

    /// Takes the lock.
    #[inline]
    pub fn lock(&self) -> Guard<'_, T> {
        let me = thread_id();
        if self.enter_biased(me) {
            return Guard {
                lock: self,
                biased: true,
            };
        }
        self.lock_slow(me)
    }

    /// The lock if it is free now (a thread that must revoke the bias and
    /// finds the owner inside gives up, the bias revoked).
    #[inline]
    pub fn try_lock(&self) -> Option<Guard<'_, T>> {
        let me = thread_id();
        if self.enter_biased(me) {
            return Some(Guard {
                lock: self,
                biased: true,
            });
        }
        if !self.try_hold() {
            return None;
        }
        if !self.revoke(me, false) {
            self.held.store(false, Ordering::Release);
            return None;
        }
        self.count(me);
        Some(Guard {
            lock: self,
            biased: false,
        })
    }

    /// The value, through exclusive access (no lock needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }

    /// The owner's way in: `busy`, then `owner` again (see the module).
    #[inline(always)]
    fn enter_biased(&self, me: usize) -> bool {
        if self.owner.load(Ordering::Relaxed) != me {
            return false;
        }
        self.busy.store(true, Ordering::Relaxed);
        // The barrier between this store and the load below is the
        // revoker's membarrier.
        compiler_fence(Ordering::SeqCst);
        if self.owner.load(Ordering::Relaxed) == me {
            return true;
        }
        self.busy.store(false, Ordering::Release);
        false
    }

    #[inline(always)]
    fn try_hold(&self) -> bool {
        self.held
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    #[cold]
    fn lock_slow(&self, me: usize) -> Guard<'_, T> {
        let mut tries = 0u32;
        while !self.try_hold() {
            tries += 1;
            if tries < SPINS {
                spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        self.revoke(me, true);
        self.count(me);
        Guard {
            lock: self,
            biased: false,
        }
    }

    /// Under `held`: takes the bias from another owner, and waits for an
    /// owner inside to leave (or, unless `wait`, gives up after a few
    /// spins: false). An owner revoked earlier may still be inside, so
    /// `busy` is read whoever owns the bias now.
    #[inline]
    fn revoke(&self, me: usize, wait: bool) -> bool {
        let owner = self.owner.load(Ordering::Relaxed);
        if owner != 0 && owner != me {
            self.owner.store(0, Ordering::Relaxed);
            membarrier::run(Scope::Private);
            // SAFETY: under `held`.
            let s = unsafe { &mut *self.streak.get() };
            s.needed = s.needed.saturating_mul(2).min(BIAS_AFTER_MAX);
        }
        let mut tries = 0u32;
        while self.busy.load(Ordering::Acquire) {
            tries += 1;
            if tries < SPINS {
                spin_loop();
            } else if !wait {
                return false;
            } else {
                std::thread::yield_now();
            }
        }
        true
    }

    /// Under `held`: counts this take toward the bias, and gives it.
    #[inline]
    fn count(&self, me: usize) {
        // SAFETY: under `held`.
        let s = unsafe { &mut *self.streak.get() };
        if s.thread == me {
            s.count += 1;
        } else {
            s.thread = me;
            s.count = 1;
        }
        if s.count >= s.needed && self.allowed.load(Ordering::Relaxed) {
            self.owner.store(me, Ordering::Relaxed);
        }
    }

    /// Whether this thread owns the bias (for tests).
    #[cfg(test)]
    fn owned_here(&self) -> bool {
        self.owner.load(Ordering::Relaxed) == thread_id()
    }
}

impl<T> Drop for Guard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        if self.biased {
            self.lock.busy.store(false, Ordering::Release);
        } else {
            self.lock.held.store(false, Ordering::Release);
        }
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard makes access exclusive.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard makes access exclusive.
        unsafe { &mut *self.lock.value.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::{Arc, Barrier};

    /// A non-atomic read-modify-write under the lock, with a pause between
    /// the read and the write: any two holders at once lose an increment.
    fn bump(lock: &BiasedLock<u64>) {
        let mut g = lock.lock();
        let v = *g;
        for _ in 0..8 {
            spin_loop();
        }
        *g = v + 1;
    }

    /// A lock this thread has taken [`BIAS_AFTER`] times; `None` where the
    /// kernel has no barrier for the bias.
    fn biased_here() -> Option<Arc<BiasedLock<u64>>> {
        if !membarrier::register(Scope::Private) {
            return None;
        }
        let lock = Arc::new(BiasedLock::new(0u64));
        lock.allow_bias(true);
        for _ in 0..BIAS_AFTER {
            bump(&lock);
        }
        Some(lock)
    }

    #[test]
    fn one_thread_earns_the_bias_and_another_takes_it_away() {
        let Some(lock) = biased_here() else {
            eprintln!("skipped: this kernel has no private expedited membarrier");
            return;
        };
        assert!(
            lock.owned_here(),
            "{BIAS_AFTER} takes in a row earn the bias"
        );
        let other = lock.clone();
        std::thread::spawn(move || bump(&other)).join().unwrap();
        assert!(!lock.owned_here(), "another thread's take revokes it");
        // Earning it back takes twice the run.
        for _ in 0..BIAS_AFTER {
            bump(&lock);
        }
        assert!(!lock.owned_here());
        for _ in 0..BIAS_AFTER {
            bump(&lock);
        }
        assert!(lock.owned_here());
        assert_eq!(*lock.lock(), 3 * BIAS_AFTER as u64 + 1);
    }

    #[test]
    fn threads_have_distinct_ids() {
        let here = thread_id();
        assert_ne!(here, 0);
        assert_eq!(here, thread_id());
        let there = std::thread::spawn(thread_id).join().unwrap();
        assert_ne!(there, 0);
        assert_ne!(here, there);
    }

    #[test]
    fn a_lock_not_allowed_the_bias_never_gets_it() {
        let lock = BiasedLock::new(0u64);
        for _ in 0..10 * BIAS_AFTER {
            bump(&lock);
        }
        assert!(!lock.owned_here());
    }

    /// Three threads, one of them taking the lock all the time (so it owns
    /// it between the others' takes, which revoke it), the others every
    /// 20 us, by `try_lock` too: every increment lands.
    #[test]
    fn the_owner_and_the_others_never_hold_it_at_once() {
        let lock = Arc::new(BiasedLock::new(0u64));
        lock.allow_bias(true);
        let tries = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let start = Arc::new(Barrier::new(3));
        let owner = {
            let (lock, start, done) = (lock.clone(), start.clone(), done.clone());
            std::thread::spawn(move || {
                start.wait();
                let (mut n, mut biased) = (0u64, 0u64);
                while !done.load(Ordering::Relaxed) {
                    bump(&lock);
                    n += 1;
                    biased += lock.owned_here() as u64;
                }
                (n, biased)
            })
        };
        let others: Vec<_> = (0..2)
            .map(|k| {
                let (lock, start, tries) = (lock.clone(), start.clone(), tries.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let mut n = 0u64;
                    for i in 0..4_000 {
                        if k == 1 && i % 2 == 0 {
                            if let Some(mut g) = lock.try_lock() {
                                let v = *g;
                                spin_loop();
                                *g = v + 1;
                                n += 1;
                            }
                        } else {
                            bump(&lock);
                            n += 1;
                        }
                        std::thread::sleep(std::time::Duration::from_micros(20));
                    }
                    tries.fetch_add(n, Ordering::Relaxed);
                })
            })
            .collect();
        for t in others {
            t.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
        let (n, biased) = owner.join().unwrap();
        assert_eq!(*lock.lock(), n + tries.load(Ordering::Relaxed));
        if membarrier::register(Scope::Private) {
            assert!(
                biased > n / 20,
                "the owner held the bias {biased} of {n} takes"
            );
        }
    }

    /// An owner that sleeps inside the lock (descheduled) holds the others
    /// off, and they get it once it leaves.
    #[test]
    fn an_owner_asleep_inside_holds_the_others_off() {
        let Some(lock) = biased_here() else {
            eprintln!("skipped: this kernel has no private expedited membarrier");
            return;
        };
        assert!(lock.owned_here());
        let g = lock.lock();
        let other = lock.clone();
        let t = std::thread::spawn(move || {
            assert!(other.try_lock().is_none(), "the owner is inside");
            let t0 = std::time::Instant::now();
            *other.lock() += 1;
            t0.elapsed()
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(g);
        let waited = t.join().unwrap();
        assert!(waited >= std::time::Duration::from_millis(30), "{waited:?}");
        assert_eq!(*lock.lock(), BIAS_AFTER as u64 + 1);
    }
}
