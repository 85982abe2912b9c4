//! Wake-ups for a waiter that sleeps instead of spinning.
//!
//! A doorbell lives in shared memory next to what its owner waits for. The
//! owner announces it is going to sleep (`arm`), checks its condition once
//! more, and sleeps on a futex (or, for completion queues, on an eventfd that
//! the waker holds). The waker publishes its data, then calls [`Doorbell::ring`],
//! which costs one load while the owner has never slept and one fence and one
//! load after that. The fences on both sides form a Dekker pair: either the
//! waker sees the armed flag, or the sleeper's re-check sees the data.
//!
//! The fence stalls the waker until its published store is visible to the
//! other core, a full cache-line transfer, so a peer that only ever polls is
//! spared it: the `sleepy` flag is set the first time the owner arms and never
//! cleared. A waker that read `sleepy` before that first arm became visible
//! can miss that one wake-up; the sleeper then wakes at the end of its sleep
//! slice. That can happen once per doorbell, at the switch from polling to
//! sleeping, and costs latency, never a lost message.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::Duration;

/// Arm flag: the owner sleeps on the futex word.
pub const FUTEX: u32 = 1;
/// Arm flag: the owner waits on its eventfd (a completion queue).
pub const EVENTFD: u32 = 2;

/// A futex word and the flags of a sleeping owner, on its own cache line.
#[repr(C, align(64))]
#[derive(Default)]
pub struct Doorbell {
    seq: AtomicU32,
    armed: AtomicU32,
    /// Set the first time the owner arms; until then wakers skip the fence.
    sleepy: AtomicU32,
}

impl Doorbell {
    /// Announces that the owner is about to sleep in the given way(s) and
    /// returns the futex sequence to pass to [`sleep`](Self::sleep). The owner
    /// must re-check its condition after this call and before sleeping.
    pub fn arm(&self, how: u32) -> u32 {
        let seq = self.seq.load(Ordering::Acquire);
        if self.sleepy.load(Ordering::Relaxed) == 0 {
            self.sleepy.store(1, Ordering::SeqCst);
        }
        self.armed.fetch_or(how, Ordering::SeqCst);
        // SeqCst fence: the re-check that follows cannot be ordered before the
        // flag store (the sleeper's half of the Dekker pair).
        fence(Ordering::SeqCst);
        seq
    }

    /// Withdraws the announcement made by [`arm`](Self::arm).
    pub fn disarm(&self, how: u32) {
        self.armed.fetch_and(!how, Ordering::Relaxed);
    }

    /// Sleeps until the sequence moves past `seq`, a wake-up, or `timeout`.
    /// Spurious returns are allowed; callers loop on their own condition.
    pub fn sleep(&self, seq: u32, timeout: Duration) {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: the futex word is a valid, aligned u32 in memory mapped for the
        // life of `self`; `ts` outlives the call. Not FUTEX_PRIVATE: the waker is
        // another process.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.seq.as_ptr(),
                libc::FUTEX_WAIT,
                seq,
                &ts as *const libc::timespec,
            )
        };
    }

    /// What [`sleep_any`] watches for this doorbell: its futex word and the
    /// sequence [`arm`](Self::arm) returned.
    pub fn watch(&self, seq: u32) -> Watch<'_> {
        Watch {
            word: &self.seq,
            seq,
            private: false,
        }
    }

    /// Wakes whoever sleeps on this doorbell now, armed or not: for a
    /// waker of the owner's own process (the peer rings with
    /// [`ring`](Self::ring)).
    pub fn wake(&self) {
        self.seq.fetch_add(1, Ordering::SeqCst);
        self.wake_sleepers();
    }

    /// Called by the waker after it has published its data. Returns the arm
    /// flags that were set (0 when nobody sleeps); wakes a futex sleeper itself
    /// and leaves an eventfd wake-up to the caller, who holds the descriptor.
    #[inline(always)]
    pub fn ring(&self) -> u32 {
        if self.sleepy.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        // SeqCst fence: our earlier publication is ordered before reading the
        // flag (the waker's half of the Dekker pair).
        fence(Ordering::SeqCst);
        if self.armed.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.ring_slow()
    }

    /// Wakes every thread asleep on the sequence word (after it moved).
    fn wake_sleepers(&self) {
        // SAFETY: valid futex word as in `sleep`.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.seq.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
            )
        };
    }

    #[cold]
    fn ring_slow(&self) -> u32 {
        let how = self.armed.swap(0, Ordering::AcqRel);
        if how & FUTEX != 0 {
            self.seq.fetch_add(1, Ordering::Release);
            self.wake_sleepers();
        }
        how
    }
}

/// A futex word for [`sleep_any`] and the value it had when its owner
/// announced the sleep: the sleep ends when the word moves past it.
pub struct Watch<'a> {
    word: &'a AtomicU32,
    seq: u32,
    /// Woken only from this process (`FUTEX_PRIVATE_FLAG`, a cheaper hash).
    private: bool,
}

impl Watch<'_> {
    /// A word of this process's own memory, woken by [`wake_local`].
    pub fn local(word: &AtomicU32, seq: u32) -> Watch<'_> {
        Watch {
            word,
            seq,
            private: true,
        }
    }
}

/// The most words [`sleep_any`] watches (the kernel's `FUTEX_WAITV_MAX`).
pub const SLEEP_ANY_MAX: usize = 128;

/// The kernel's `struct futex_waitv` (linux/futex.h; the libc crate does not
/// declare it).
#[repr(C)]
struct FutexWaitv {
    val: u64,
    uaddr: u64,
    flags: u32,
    reserved: u32,
}

/// `FUTEX2_SIZE_U32` of linux/futex.h.
const FUTEX2_SIZE_U32: u32 = 2;

/// Sleeps until any of `words` moves past its value, a wake-up on one of
/// them, or `timeout`: one system call for a waiter with several doorbells
/// (a completion queue's VIs) and a word of its own. Spurious returns are
/// allowed. An error of kind `Unsupported` (ENOSYS: a kernel before 5.16)
/// or `InvalidInput` (more than [`SLEEP_ANY_MAX`] words) means nothing
/// slept: the caller waits another way.
pub fn sleep_any(words: &[Watch<'_>], timeout: Duration) -> io::Result<()> {
    if words.is_empty() || words.len() > SLEEP_ANY_MAX {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let flags = |private: bool| {
        FUTEX2_SIZE_U32
            | if private {
                libc::FUTEX_PRIVATE_FLAG as u32
            } else {
                0
            }
    };
    let v: Vec<FutexWaitv> = words
        .iter()
        .map(|w| FutexWaitv {
            val: w.seq as u64,
            uaddr: w.word.as_ptr() as u64,
            flags: flags(w.private),
            reserved: 0,
        })
        .collect();
    // futex_waitv takes an absolute time on the clock it is given.
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a live timespec for the kernel to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let ns = now.tv_nsec as u128 + timeout.subsec_nanos() as u128;
    let at = libc::timespec {
        tv_sec: (now.tv_sec as u64)
            .saturating_add(timeout.as_secs())
            .saturating_add((ns / 1_000_000_000) as u64)
            .min(i64::MAX as u64) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `v` holds `words.len()` filled entries whose addresses are
    // live, aligned u32 words (a doorbell in a mapping its caller keeps, or
    // the caller's own word); `at` outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex_waitv,
            v.as_ptr(),
            words.len() as libc::c_uint,
            0 as libc::c_uint,
            &at as *const libc::timespec,
            libc::CLOCK_MONOTONIC,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOSYS) => Err(io::Error::from(io::ErrorKind::Unsupported)),
            Some(libc::EINVAL) => Err(io::Error::from(io::ErrorKind::InvalidInput)),
            // EAGAIN (a word had moved already), ETIMEDOUT, EINTR: a return.
            _ => Ok(()),
        };
    }
    Ok(())
}

/// Moves a word of this process's memory on and wakes whoever sleeps on it
/// in [`sleep_any`] (as [`Watch::local`]).
pub fn wake_local(word: &AtomicU32) {
    word.fetch_add(1, Ordering::SeqCst);
    // SAFETY: a live, aligned u32 of this process; private futex op.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
}

/// An eventfd the peer passed for its wake-ups, checked to be one: a pipe or
/// a socket in its place could block the waker or raise SIGPIPE.
#[derive(Debug)]
pub struct PeerEventfd(OwnedFd);

impl PeerEventfd {
    /// Keeps `fd` if the kernel names it an eventfd, and makes it non-blocking.
    pub fn check(fd: OwnedFd) -> io::Result<PeerEventfd> {
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        if link.as_os_str() != "anon_inode:[eventfd]" {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "peer's wake-up descriptor is {}, not an eventfd",
                    link.display()
                ),
            ));
        }
        // SAFETY: plain calls on a descriptor we own.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0
            || unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(PeerEventfd(fd))
    }

    /// Adds one to the counter. Never blocks: a counter the peer filled to
    /// its limit loses the wake-up. The peer shares the file's flags and
    /// could clear `O_NONBLOCK` again, so the counter's room is polled first;
    /// only a peer racing its own counter between the two calls could still
    /// hold this write.
    pub fn signal(&self) {
        let mut p = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        if unsafe { libc::poll(&mut p, 1, 0) } != 1 || p.revents & libc::POLLOUT == 0 {
            return;
        }
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to a descriptor we hold.
        unsafe {
            libc::write(
                self.0.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn ring_without_sleeper_reports_nothing() {
        let d = Doorbell::default();
        assert_eq!(d.ring(), 0);
    }

    #[test]
    fn ring_reports_and_clears_eventfd_arm() {
        let d = Doorbell::default();
        d.arm(EVENTFD);
        assert_eq!(d.ring(), EVENTFD);
        assert_eq!(d.ring(), 0, "a ring clears the flags it reported");
    }

    #[test]
    fn sleeper_is_woken_by_ring() {
        let d = Arc::new(Doorbell::default());
        let flag = Arc::new(AtomicBool::new(false));
        let (d2, f2) = (d.clone(), flag.clone());
        let t = std::thread::spawn(move || {
            let start = Instant::now();
            while !f2.load(Ordering::Acquire) {
                let seq = d2.arm(FUTEX);
                if f2.load(Ordering::Acquire) {
                    d2.disarm(FUTEX);
                    break;
                }
                d2.sleep(seq, Duration::from_secs(30));
            }
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        flag.store(true, Ordering::Release);
        d.ring();
        let waited = t.join().unwrap();
        assert!(
            waited < Duration::from_secs(30),
            "woken by the ring, not the timeout"
        );
    }

    /// Where the kernel has futex_waitv (5.16 on): a word that moved
    /// before the sleep ends it at once; a wake of either word ends it.
    #[test]
    fn sleep_any_ends_on_any_word() {
        let (bell, own) = (Arc::new(Doorbell::default()), Arc::new(AtomicU32::new(0)));
        let seq = bell.arm(FUTEX);
        let moved = own.load(Ordering::SeqCst);
        own.fetch_add(1, Ordering::SeqCst);
        let start = Instant::now();
        match sleep_any(
            &[bell.watch(seq), Watch::local(&own, moved)],
            Duration::from_secs(30),
        ) {
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                eprintln!("skipped: no futex_waitv in this kernel");
                return;
            }
            r => r.unwrap(),
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the moved word ended it"
        );
        for wake_own in [false, true] {
            let seq = bell.arm(FUTEX);
            let mine = own.load(Ordering::SeqCst);
            let (b2, o2) = (bell.clone(), own.clone());
            let t = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                if wake_own {
                    wake_local(&o2);
                } else {
                    b2.wake();
                }
            });
            let start = Instant::now();
            sleep_any(
                &[bell.watch(seq), Watch::local(&own, mine)],
                Duration::from_secs(30),
            )
            .unwrap();
            t.join().unwrap();
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "woken by the wake (own word: {wake_own}), not the timeout"
            );
        }
        assert!(
            sleep_any(&[], Duration::from_millis(1)).is_err(),
            "no words"
        );
    }

    #[test]
    fn only_eventfds_are_kept_and_a_full_one_never_blocks() {
        use std::os::fd::FromRawFd;
        let mut p = [0; 2];
        // SAFETY: `p` has room for two descriptors.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh descriptors we own.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        assert!(PeerEventfd::check(w).is_err());
        drop(r);
        // A blocking eventfd filled to its limit by its owner.
        // SAFETY: plain eventfd creation.
        let fd = unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_CLOEXEC)) };
        let full: u64 = u64::MAX - 1;
        // SAFETY: writing 8 bytes from a live u64.
        let n = unsafe {
            libc::write(
                fd.as_raw_fd(),
                &full as *const u64 as *const libc::c_void,
                8,
            )
        };
        assert_eq!(n, 8);
        // SAFETY: duplicating a descriptor we own.
        let dup = unsafe { OwnedFd::from_raw_fd(libc::dup(fd.as_raw_fd())) };
        let e = PeerEventfd::check(dup).unwrap();
        // The owner clears O_NONBLOCK again (the flags are shared).
        // SAFETY: plain call on our descriptor.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, 0) };
        e.signal();
        let mut v = 0u64;
        // SAFETY: reading 8 bytes into a live u64.
        unsafe { libc::read(fd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
        assert_eq!(v, full, "the wake-up is lost, not waited for");
        e.signal();
        // SAFETY: as above.
        unsafe { libc::read(fd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
        assert_eq!(v, 1);
    }
}
