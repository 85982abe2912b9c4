//! The medium's own floor: an 8-byte ping-pong through two rings between two
//! threads pinned to cores 0 and 1, no VI logic. Prints the median one-way.

use std::time::Instant;
use uvia_shm::{ring_bytes, Consumer, Producer, Segment};

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn main() {
    const LINES: usize = 1024;
    let rb = ring_bytes(LINES);
    let seg = Segment::create(c"pp", 2 * rb).unwrap();
    let base = seg.as_ptr() as usize;
    let iters = 200_000;
    // SAFETY: two zeroed rings in one segment that outlives both threads.
    let (mut ptx, mut prx) = unsafe {
        (
            Producer::new(base as *mut u8, LINES),
            Consumer::new((base + rb) as *mut u8, LINES),
        )
    };
    let t = std::thread::spawn(move || {
        pin(1);
        // SAFETY: as above, the other ends.
        let (mut ctx, mut crx) = unsafe {
            (
                Producer::new((base + rb) as *mut u8, LINES),
                Consumer::new(base as *mut u8, LINES),
            )
        };
        for _ in 0..iters {
            let r = loop {
                if let Some(r) = crx.peek().unwrap() {
                    break r;
                }
            };
            let mut b = [0u8; 8];
            r.read(0, &mut b);
            crx.release(r);
            while !ctx.push(&b) {}
        }
    });
    pin(0);
    let mut s = Vec::with_capacity(iters);
    for i in 0..iters {
        let t0 = Instant::now();
        while !ptx.push(&(i as u64).to_le_bytes()) {}
        let r = loop {
            if let Some(r) = prx.peek().unwrap() {
                break r;
            }
        };
        prx.release(r);
        s.push(t0.elapsed());
    }
    t.join().unwrap();
    s.sort();
    println!(
        "ring 8 B one-way p50 {} ns",
        (s[s.len() / 2] / 2).as_nanos()
    );
    drop(seg);
    cacheline(iters);
    futex(iters / 10);
}

/// The raw cost of a blocking hand-off: two threads take turns sleeping on a
/// futex word and waking each other.
fn futex(iters: usize) {
    use std::sync::atomic::{AtomicU32, Ordering};
    let word: &'static AtomicU32 = Box::leak(Box::new(AtomicU32::new(0)));
    let wait = |v: u32| {
        while word.load(Ordering::Acquire) == v {
            // SAFETY: a valid futex word that lives forever.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    word.as_ptr(),
                    libc::FUTEX_WAIT,
                    v,
                    std::ptr::null::<libc::timespec>(),
                )
            };
        }
    };
    let wake = |v: u32| {
        word.store(v, Ordering::Release);
        // SAFETY: as above.
        unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1) };
    };
    let t = std::thread::spawn(move || {
        pin(1);
        for i in 0..iters as u32 {
            wait(2 * i);
            wake(2 * i + 2);
        }
    });
    pin(0);
    let mut s = Vec::with_capacity(iters);
    for i in 0..iters as u32 {
        let t0 = Instant::now();
        wake(2 * i + 1);
        wait(2 * i + 1);
        s.push(t0.elapsed());
    }
    t.join().unwrap();
    s.sort();
    println!(
        "futex hand-off one-way p50 {} ns",
        (s[s.len() / 2] / 2).as_nanos()
    );
}

/// The raw limit for comparison: one shared cache line bounced between the
/// two cores, timed the same way.
fn cacheline(iters: usize) {
    use std::sync::atomic::{AtomicU64, Ordering};
    #[repr(align(128))]
    struct Line(AtomicU64);
    let line: &'static Line = Box::leak(Box::new(Line(AtomicU64::new(0))));
    let t = std::thread::spawn(move || {
        pin(1);
        for i in 0..iters as u64 {
            while line.0.load(Ordering::Acquire) != 2 * i + 1 {}
            line.0.store(2 * i + 2, Ordering::Release);
        }
    });
    pin(0);
    let mut s = Vec::with_capacity(iters);
    for i in 0..iters as u64 {
        let t0 = Instant::now();
        line.0.store(2 * i + 1, Ordering::Release);
        while line.0.load(Ordering::Acquire) != 2 * i + 2 {}
        s.push(t0.elapsed());
    }
    t.join().unwrap();
    s.sort();
    println!(
        "cache line one-way p50 {} ns",
        (s[s.len() / 2] / 2).as_nanos()
    );
}
