//! What a polling loop does between two empty looks at memory that another
//! core writes.
//!
//! A look every cycle or two is slow to notice the write: the next looks
//! are already issued when the line comes back changed, and the core
//! throws them away and starts over. A `pause` between looks avoids that,
//! but lasts some 29 ns on the EPYC this project measures on, so a message
//! waits for the pause to end. Between the two, a store to a slot of the
//! loop's own and the load of it back: measured as the wait of `uvia
//! pingpong --rdma-write` at 8 B (processes pinned to two cores, against
//! UCX's UCT put in alternation, 20 rounds each, twice), the one-way median
//! was at or below the put's in 15 and 13 rounds of 20 with it and in 11
//! and 10 with a pause (medians 50 ns against 55).

/// Paces a polling loop between two empty looks ([the module](self)).
#[inline(always)]
pub fn between_looks() {
    #[cfg(target_arch = "x86_64")]
    {
        let mut slot = 0u64;
        let mut x = 0u64;
        // SAFETY: stores to and loads from `slot`, a local of this call.
        unsafe {
            std::arch::asm!(
                "mov [{p}], {x}",
                "mov {x}, [{p}]",
                p = in(reg) &mut slot,
                x = inout(reg) x,
                options(nostack, preserves_flags)
            );
        }
        let _ = x;
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::hint::spin_loop();
}
