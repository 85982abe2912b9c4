//! Physical limits of this host, as probes that return samples so that the
//! bench can interleave short rounds of them with the contenders.
//!
//! Two-process probes map shared anonymous memory, fork a child pinned to core
//! 1 (the parent pins itself to core 0 for the probe and restores its mask
//! afterwards). The child only spins on atomics and makes raw system calls
//! before `_exit`, so forking from a process with other threads is safe here.
//! The child dies with its parent (PR_SET_PDEATHSIG); the parent checks every
//! so often that the child is alive and gives up after a deadline.

use crate::clock;
use crate::pin;
use crate::stats::{median, Stats};
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const CORE_A: usize = 0;
const CORE_B: usize = 1;
const DEADLINE: Duration = Duration::from_secs(30);

struct Shared {
    ptr: *mut u8,
    len: usize,
}

impl Shared {
    fn new(len: usize) -> Result<Shared> {
        let len = len.max(4096).div_ceil(4096) * 4096;
        // SAFETY: anonymous shared mapping; checked for failure.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!(
                "mmap of {len} shared bytes: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(Shared {
            ptr: p as *mut u8,
            len,
        })
    }

    /// The word at byte offset `off` (8-aligned) as an atomic.
    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: inside the page-aligned mapping, 8-aligned, lives as long as self.
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as above, 4-aligned.
        unsafe { &*(self.ptr.add(off) as *const AtomicU32) }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: unmaps what new mapped.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

/// A forked child on core B running `f`; killed and reaped on drop.
struct Peer {
    pid: libc::pid_t,
    started: Instant,
    spins: u32,
}

impl Peer {
    fn fork(f: impl FnOnce()) -> Result<Peer> {
        // SAFETY: the child runs only `f` (atomics and raw syscalls) and then _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: plain system calls in the child.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(CORE_B, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
            f();
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(0) }
        }
        Ok(Peer {
            pid,
            started: Instant::now(),
            spins: 0,
        })
    }

    /// Call while spinning; an error once the child has died or the deadline passed.
    #[inline]
    fn check(&mut self) -> Result<()> {
        self.spins = self.spins.wrapping_add(1);
        if self.spins & 0xffff != 0 {
            return Ok(());
        }
        self.check_now()
    }

    fn check_now(&mut self) -> Result<()> {
        let mut st = 0;
        // SAFETY: waits without blocking on our own child.
        if unsafe { libc::waitpid(self.pid, &mut st, libc::WNOHANG) } == self.pid {
            self.pid = 0;
            bail!("the probe's child process died");
        }
        if self.started.elapsed() > DEADLINE {
            bail!("the probe did not finish within {DEADLINE:?} (are cores {CORE_A} and {CORE_B} both available?)");
        }
        Ok(())
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if self.pid > 0 {
            let mut st = 0;
            // SAFETY: our own child.
            unsafe {
                if libc::waitpid(self.pid, &mut st, libc::WNOHANG) == 0 {
                    libc::kill(self.pid, libc::SIGKILL);
                    libc::waitpid(self.pid, &mut st, 0);
                }
            }
        }
    }
}

/// Pins this thread to core A for the probe and restores the old mask after.
struct PinA(Option<libc::cpu_set_t>);

impl PinA {
    fn new() -> PinA {
        let old = pin::current();
        let _ = pin::pin_to(CORE_A);
        PinA(old)
    }
}

impl Drop for PinA {
    fn drop(&mut self) {
        if let Some(s) = &self.0 {
            pin::restore(s);
        }
    }
}

/// Cache-line ping-pong: a tight spin with no pause instruction on either
/// side, over one 64-byte aligned line both sides write in turn (`Lines::One`,
/// the bare hop of a line between the cores) or a line each way, each
/// written by one side only and watched by the other (`Lines::EachWay`: what
/// a message exchange moves, as uvia's rings and every shared-memory
/// messaging layer do; on this host about twice the other, as the reader of
/// a line keeps taking it back from the writer), or a line each way watched
/// as uvia's one-sided waits watch (`Lines::EachWayPaced`: paced by
/// [`uvia::between_looks`], with no work between finding a message and
/// answering it; here it reads below the tight spin). Returns one-way times in ns (round trip /
/// 2), one per measured round trip (after a tenth as many warm-up rounds).
pub fn cacheline(rounds: usize, lines: Lines) -> Result<Vec<f64>> {
    // Calibrated first (a 50 ms spin, once a process): each round's time
    // runs from the last round's end, and the first conversion in the loop
    // would put the spin into the round after it.
    clock::ns_per_tick();
    let sh = Shared::new(4096)?;
    let warm = (rounds / 10).max(100) as u64;
    let total = warm + rounds as u64;
    let _pin = PinA::new();
    let ping = sh.u64_at(0);
    // Two 128-byte blocks apart, so that the adjacent-line prefetcher does
    // not pull one with the other.
    let pong = match lines {
        Lines::One => ping,
        Lines::EachWay | Lines::EachWayPaced => sh.u64_at(256),
    };
    let paced = lines == Lines::EachWayPaced;
    let mut peer = Peer::fork(|| {
        for k in 0..total {
            while ping.load(Ordering::Acquire) != 2 * k + 1 {
                if paced {
                    uvia::between_looks();
                }
            }
            pong.store(2 * k + 2, Ordering::Release);
        }
    })?;
    let mut out = Vec::with_capacity(rounds);
    // The clock is read after each store, while the line is on its way (as
    // `uvia pingpong` does): a fenced read between the reply and the next
    // store would be in the time measured.
    ping.store(1, Ordering::Release);
    let mut t0 = clock::ticks();
    for k in 0..total {
        while pong.load(Ordering::Acquire) != 2 * k + 2 {
            if paced {
                uvia::between_looks();
            }
            peer.check()?;
        }
        if k + 1 < total {
            ping.store(2 * k + 3, Ordering::Release);
        }
        let t1 = clock::ticks();
        if k >= warm {
            out.push(clock::to_ns(t1.wrapping_sub(t0)) / 2.0);
        }
        t0 = t1;
    }
    Ok(out)
}

/// Which lines [`cacheline`] bounces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lines {
    One,
    EachWay,
    EachWayPaced,
}

fn futex(word: &AtomicU32, op: i32, val: u32) {
    // SAFETY: a shared (not private) futex on a live word in the shared mapping.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            val,
            std::ptr::null::<libc::timespec>(),
            0,
            0,
        );
    }
}

/// Futex hand-off ping-pong on a shared (not process-private) futex word:
/// each side waits in FUTEX_WAIT until the other stores its value and calls
/// FUTEX_WAKE. Returns one-way times in ns.
pub fn futex_pingpong(rounds: usize) -> Result<Vec<f64>> {
    let sh = Shared::new(4096)?;
    let warm = (rounds / 10).max(50) as u32;
    let total = warm + rounds as u32;
    let _pin = PinA::new();
    let w = sh.u32_at(0);
    let mut peer = Peer::fork(|| {
        for k in 0..total {
            loop {
                let v = w.load(Ordering::Acquire);
                if v == 2 * k + 1 {
                    break;
                }
                futex(w, libc::FUTEX_WAIT, v);
            }
            w.store(2 * k + 2, Ordering::Release);
            futex(w, libc::FUTEX_WAKE, 1);
        }
    })?;
    let mut out = Vec::with_capacity(rounds);
    for k in 0..total {
        let t0 = clock::ticks();
        w.store(2 * k + 1, Ordering::Release);
        futex(w, libc::FUTEX_WAKE, 1);
        loop {
            let v = w.load(Ordering::Acquire);
            if v == 2 * k + 2 {
                break;
            }
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 100_000_000,
            };
            // SAFETY: shared futex wait with a timeout on a live word.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    w.as_ptr(),
                    libc::FUTEX_WAIT,
                    v,
                    &ts as *const libc::timespec,
                    0,
                    0,
                );
            }
            if w.load(Ordering::Acquire) != 2 * k + 2 {
                // Rare (a timeout or a spurious wake): is the child still there?
                peer.check_now()?;
            }
        }
        let t1 = clock::ticks();
        if k >= warm {
            out.push(clock::to_ns(t1.wrapping_sub(t0)) / 2.0);
        }
    }
    Ok(out)
}

/// A page-aligned private buffer, written through before use so that no
/// page fault lands in a timed copy.
struct PageBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl PageBuf {
    fn new(size: usize, fill: u8) -> Result<PageBuf> {
        let layout = std::alloc::Layout::from_size_align(size.max(1), 4096)
            .map_err(|e| anyhow::anyhow!("a {size}-byte buffer: {e}"))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            bail!("allocating {size} bytes");
        }
        // SAFETY: `ptr` is a fresh allocation of `layout.size()` bytes.
        unsafe { std::ptr::write_bytes(ptr, fill, layout.size()) };
        Ok(PageBuf { ptr, layout })
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Single-process memcpy bandwidth at `size` bytes, MB/s (1 MB = 1e6 B):
/// the median of 5 runs of repeated copies (about 64 MiB each, at least 4
/// copies) between two page-aligned buffers written beforehand, after one
/// untimed copy.
///
/// Both buffers start on a page, as the cross-core probe's do. Two heap
/// buffers allocated one after the other put the destination a few bytes
/// past a 4 KiB multiple from the source (the allocator's header), where
/// the CPU takes every store for a possible overwrite of a load still in
/// flight (4 KiB aliasing): the string-copy instruction glibc uses from a
/// few KiB upwards then ran at 1-2.5 GB/s at 64 KiB, a twentieth of this
/// host's copy rate, and the probe measured that instead of memcpy.
pub fn memcpy_mbps(size: usize) -> Result<f64> {
    if size == 0 {
        bail!("memcpy size must be at least 1 byte");
    }
    let src = PageBuf::new(size, 0x5a)?;
    let dst = PageBuf::new(size, 0)?;
    let copy = || {
        // SAFETY: two distinct live buffers of at least `size` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                std::hint::black_box(src.ptr as *const u8),
                std::hint::black_box(dst.ptr),
                size,
            )
        };
    };
    copy();
    let reps = ((64usize << 20) / size).max(4);
    let mut runs = Vec::new();
    for _ in 0..5 {
        let t0 = clock::ticks();
        for _ in 0..reps {
            copy();
        }
        let ns = clock::to_ns(clock::ticks().wrapping_sub(t0));
        std::hint::black_box(dst.ptr);
        runs.push((reps * size) as f64 / ns * 1e3);
    }
    Ok(median(&runs))
}

/// Cross-core copy: the child on core B fills a shared buffer with a new byte
/// pattern and signals; this process (core A) copies it into private memory
/// and signals back. Returns MB/s of each timed copy.
pub fn cross_core_copy(size: usize, reps: usize) -> Result<Vec<f64>> {
    if size == 0 {
        bail!("copy size must be at least 1 byte");
    }
    let sh = Shared::new(4096 + size)?;
    let warm = 3u64;
    let total = warm + reps as u64;
    // Page-aligned and written beforehand, like memcpy's buffers.
    let private = PageBuf::new(size, 0)?;
    let _pin = PinA::new();
    let flag = sh.u64_at(0);
    // SAFETY: the buffer part of the mapping, after the flag's page.
    let buf = unsafe { sh.ptr.add(4096) };
    let mut peer = Peer::fork(|| {
        for r in 0..total {
            // SAFETY: the parent does not touch the buffer until the flag says so.
            unsafe { std::ptr::write_bytes(buf, r as u8, size) };
            flag.store(2 * r + 1, Ordering::Release);
            while flag.load(Ordering::Acquire) != 2 * r + 2 {}
        }
    })?;
    let mut out = Vec::with_capacity(reps);
    for r in 0..total {
        while flag.load(Ordering::Acquire) != 2 * r + 1 {
            peer.check()?;
        }
        let t0 = clock::ticks();
        // SAFETY: the child has finished writing (flag) and waits for our signal.
        unsafe { std::ptr::copy_nonoverlapping(buf, private.ptr, size) };
        let t1 = clock::ticks();
        std::hint::black_box(private.ptr);
        flag.store(2 * r + 2, Ordering::Release);
        if r >= warm {
            out.push(size as f64 / clock::to_ns(t1.wrapping_sub(t0)) * 1e3);
        }
    }
    Ok(out)
}

/// The bare AF_XDP medium (`uvia_net::xdp::pingpong`): `size`-byte frames
/// bounced between AF_XDP sockets in two test hosts made for it, with no
/// protocol above them, this thread on core 0 and the echo on core 1: the
/// floor under `uvia pingpong -p xdp --netns`. One-way times in ns, one
/// per measured round trip, after a tenth as many warm-up rounds. Root
/// only; the test hosts are removed afterwards.
pub fn xdp_medium(size: usize, rounds: usize) -> Result<Vec<f64>> {
    use uvia_net::xdp::pingpong;
    let spec = pingpong::Spec {
        size,
        rounds,
        warm: (rounds / 10).max(10),
        mode: None,
        echo_core: Some(CORE_B),
        busy_poll: false,
    };
    let _pin = PinA::new();
    let rtts = pingpong::run(&spec, clock::ticks)?;
    Ok(rtts.into_iter().map(|t| clock::to_ns(t) / 2.0).collect())
}

/// How each probe is measured, for the report.
pub const HOW: &str = "How each limit is measured. Cache-line ping-pong: two processes on cores 0 and 1 bounce one 64-byte line (each spins on a load until the other's store), one-way = round trip / 2, the clock read once a round trip just after the store (while the line travels, as in uvia's ping-pong), several runs, p50 the median of their medians. With a line each way, each side writes its own line and watches the other's, as a message exchange does (uvia's rings, and every shared-memory messaging layer): the floor the shm ping-pong is compared with, about twice the single line's here (the reader of a line keeps taking it back from its writer). With uvia's wait between looks, a line each way again, each side storing to a slot of its own and loading it back after every look that finds nothing, as uvia's one-sided waits do: uvia's one-sided shared-memory path with no work of its own, below the tight spin's here (a tight spin's looks, already issued when the line comes back changed, are thrown away and issued again); a wait loop that does other work between looks may read below it. Futex hand-off: the same bounce, but each side sleeps in FUTEX_WAIT on a shared word until the other stores and calls FUTEX_WAKE. memcpy: one process copies between two page-aligned private buffers, both written beforehand and one untimed copy first, about 64 MiB of copies per run, the median of 5 runs (the buffers are placed so that the destination is not a few bytes past a 4 KiB multiple from the source, where the CPU's 4 KiB aliasing slows the string copy twenty-fold). Cross-core copy: the process on core 1 writes the buffer in shared memory, the one on core 0 copies it into a page-aligned private buffer and hands it back; each copy is timed, the median taken. AF_XDP medium (root only): two network namespaces joined by a veth pair, an AF_XDP socket in each (the mode the xdp provider picks), 8-byte frames bounced between two threads on cores 0 and 1 with no protocol above them, one-way = round trip / 2, the floor under uvia's xdp provider between the same two test hosts. MB/s are 10^6 B/s; times from the TSC.";

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct MinP50 {
    pub p50: f64,
    pub min: f64,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct P50 {
    pub p50: f64,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct SizeMbps {
    pub size: usize,
    pub mbytes_per_s: f64,
}

/// The JSON of `uvia limit`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LimitResult {
    pub command: String,
    /// One line bounced between the cores.
    pub cacheline_one_way_ns: MinP50,
    /// A line each way ([`Lines::EachWay`]): the floor of a message
    /// exchange, which the shm ping-pong is compared with.
    #[serde(default)]
    pub cacheline_each_way_one_way_ns: MinP50,
    /// A line each way, watched with uvia's wait between looks
    /// ([`Lines::EachWayPaced`]). (Named `cacheline_paused_one_way_ns`
    /// while that wait was a pause.)
    #[serde(default, alias = "cacheline_paused_one_way_ns")]
    pub cacheline_paced_one_way_ns: MinP50,
    pub futex_one_way_ns: P50,
    pub memcpy: Vec<SizeMbps>,
    pub cross_core_copy: Vec<SizeMbps>,
    /// The bare AF_XDP medium between two test hosts, 8-byte frames
    /// ([`xdp_medium`]); `None` where it could not run.
    #[serde(default)]
    pub xdp_medium_one_way_ns: Option<MinP50>,
    /// Why the AF_XDP probe did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xdp_medium_skipped: Option<String>,
}

/// The JSON of `uvia limit --futex`: the futex hand-off alone.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FutexResult {
    pub command: String,
    pub rounds: usize,
    pub p50: f64,
    pub p99: f64,
}

/// The futex hand-off alone, `rounds` measured round trips (one-way ns).
pub fn futex_only(rounds: usize) -> Result<FutexResult> {
    let s = Stats::of(&futex_pingpong(rounds)?);
    Ok(FutexResult {
        command: "limit futex".into(),
        rounds,
        p50: s.p50,
        p99: s.p99,
    })
}

/// Runs every probe. Cache-line: several runs; p50 is the median of the runs'
/// medians, min the smallest sample seen.
pub fn run_all(quick: bool) -> Result<LimitResult> {
    let (runs, rounds) = if quick { (3, 50_000) } else { (5, 200_000) };
    let line = |lines| -> Result<MinP50> {
        let mut p50s = Vec::new();
        let mut min = f64::INFINITY;
        for _ in 0..runs {
            let s = Stats::of(&cacheline(rounds, lines)?);
            p50s.push(s.p50);
            min = min.min(s.min);
        }
        Ok(MinP50 {
            p50: median(&p50s),
            min,
        })
    };
    let (one, each_way, paced) = (
        line(Lines::One)?,
        line(Lines::EachWay)?,
        line(Lines::EachWayPaced)?,
    );
    let fut = Stats::of(&futex_pingpong(if quick { 5_000 } else { 20_000 })?);
    let mut memcpy = Vec::new();
    for size in [64 << 10, 1 << 20, 16 << 20] {
        memcpy.push(SizeMbps {
            size,
            mbytes_per_s: memcpy_mbps(size)?,
        });
    }
    let mut cross = Vec::new();
    for size in [64 << 10, 1 << 20] {
        let reps = if quick { 50 } else { 300 };
        cross.push(SizeMbps {
            size,
            mbytes_per_s: median(&cross_core_copy(size, reps)?),
        });
    }
    let (xdp, xdp_skipped) = match xdp_medium(8, if quick { 20_000 } else { 100_000 }) {
        Ok(v) => {
            let s = Stats::of(&v);
            (
                Some(MinP50 {
                    p50: s.p50,
                    min: s.min,
                }),
                None,
            )
        }
        Err(why) => (None, Some(format!("{why:#}"))),
    };
    Ok(LimitResult {
        command: "limit".into(),
        cacheline_one_way_ns: one,
        cacheline_each_way_one_way_ns: each_way,
        cacheline_paced_one_way_ns: paced,
        futex_one_way_ns: P50 { p50: fut.p50 },
        memcpy,
        cross_core_copy: cross,
        xdp_medium_one_way_ns: xdp,
        xdp_medium_skipped: xdp_skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_buffers_are_page_aligned_and_written() {
        let b = PageBuf::new(5000, 0x5a).unwrap();
        assert_eq!(b.ptr as usize % 4096, 0);
        // SAFETY: the buffer holds at least 5000 bytes.
        let s = unsafe { std::slice::from_raw_parts(b.ptr, 5000) };
        assert!(s.iter().all(|&x| x == 0x5a));
    }

    #[test]
    fn memcpy_probe_refuses_zero_bytes_and_measures_a_size() {
        assert!(memcpy_mbps(0).is_err());
        assert!(memcpy_mbps(4096).unwrap() > 0.0);
    }
}
