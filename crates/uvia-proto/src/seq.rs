//! Sequence-number arithmetic and the receive window of packet numbers.
//!
//! Sequence numbers are 32-bit and wrap; every comparison goes through the
//! signed difference, so order holds across the wrap as long as the two
//! numbers are within 2^31 of each other (the window is far smaller).

/// `a` comes before `b`.
#[inline]
pub fn lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// `a` comes before or is `b`.
#[inline]
pub fn le(a: u32, b: u32) -> bool {
    !lt(b, a)
}

/// Which packet numbers of a window `[base, base + size)` have arrived.
/// Everything below `base` has.
#[derive(Clone, Debug)]
pub struct SeqWindow {
    base: u32,
    bits: Box<[u64]>,
    size: u32,
    /// Numbers above the base that have arrived (bits set): a gap is open
    /// while any has, asked on every frame.
    above: u32,
}

impl SeqWindow {
    /// A window of `size` numbers starting at `base`, rounded up to a power
    /// of two of at least 64: a number's bit is then its low bits, a mask
    /// rather than a division on every frame, and the same on both sides
    /// of the 32-bit wrap (2^32 is a multiple of the size).
    pub fn new(base: u32, size: u32) -> SeqWindow {
        let size = size.clamp(64, 1 << 31).next_power_of_two();
        SeqWindow {
            base,
            bits: vec![0; size as usize / 64].into_boxed_slice(),
            size,
            above: 0,
        }
    }

    /// Every number below this one has arrived.
    pub fn base(&self) -> u32 {
        self.base
    }

    pub fn size(&self) -> u32 {
        self.size
    }

    #[inline]
    fn bit(&self, n: u32) -> (usize, u64) {
        let i = (n & (self.size - 1)) as usize;
        (i / 64, 1u64 << (i % 64))
    }

    /// True when `n` lies in the window (not yet below the base, not too far ahead).
    pub fn in_window(&self, n: u32) -> bool {
        n.wrapping_sub(self.base) < self.size
    }

    /// True when `n` has arrived (everything below the base has).
    pub fn contains(&self, n: u32) -> bool {
        if lt(n, self.base) {
            return true;
        }
        if !self.in_window(n) {
            return false;
        }
        let (w, m) = self.bit(n);
        self.bits[w] & m != 0
    }

    /// Marks `n` arrived. Returns false if it had already, or lies beyond
    /// the window (the caller drops the frame either way). Slides the base
    /// over every number that is now contiguous.
    pub fn insert(&mut self, n: u32) -> bool {
        if !self.in_window(n) {
            return false;
        }
        let (w, m) = self.bit(n);
        if self.bits[w] & m != 0 {
            return false;
        }
        self.bits[w] |= m;
        self.above += 1;
        self.slide();
        true
    }

    /// Moves the base over every arrived number at it.
    fn slide(&mut self) {
        while self.contains_bit(self.base) {
            let (w, m) = self.bit(self.base);
            self.bits[w] &= !m;
            self.above -= 1;
            self.base = self.base.wrapping_add(1);
        }
    }

    /// Moves the base forward to `to`, forgetting what lay below (the
    /// unreliable level does this: a gap it will never fill).
    pub fn advance(&mut self, to: u32) {
        if !lt(self.base, to) {
            return;
        }
        if to.wrapping_sub(self.base) >= self.size {
            // Past the whole window: nothing in it survives. (Stepping one
            // number at a time would take up to 2^31 steps for a far jump.)
            self.bits.fill(0);
            self.above = 0;
            self.base = to;
            return;
        }
        while lt(self.base, to) {
            if self.contains_bit(self.base) {
                let (w, m) = self.bit(self.base);
                self.bits[w] &= !m;
                self.above -= 1;
            }
            self.base = self.base.wrapping_add(1);
        }
        // Everything that had arrived just past the old gap is contiguous now.
        self.slide();
    }

    fn contains_bit(&self, n: u32) -> bool {
        let (w, m) = self.bit(n);
        self.bits[w] & m != 0
    }

    /// The arrived ranges above the base, lowest first, at most `max` of
    /// them: what a selective acknowledgement reports.
    pub fn ranges(&self, max: usize, mut out: impl FnMut(u32, u32)) {
        let mut n = 0;
        let mut i = 1;
        while i < self.size && n < max {
            let s = self.base.wrapping_add(i);
            if self.contains_bit(s) {
                let mut e = i;
                while e < self.size && self.contains_bit(self.base.wrapping_add(e)) {
                    e += 1;
                }
                out(s, self.base.wrapping_add(e));
                n += 1;
                i = e;
            } else {
                // Skip empty words quickly.
                let (w, _) = self.bit(s);
                if self.bits[w] == 0 && (s % 64) == 0 {
                    i += 64;
                } else {
                    i += 1;
                }
            }
        }
    }

    /// The arrived range `[start, end)` above the base that holds `n`, if
    /// `n` lies above the base and has arrived: the range an ack names
    /// first, so the newest arrival is always reported even when more
    /// ranges exist than an ack carries.
    pub fn range_of(&self, n: u32) -> Option<(u32, u32)> {
        let off = n.wrapping_sub(self.base);
        if off == 0 || off >= self.size || !self.contains_bit(n) {
            return None;
        }
        let mut lo = off;
        while lo > 1 && self.contains_bit(self.base.wrapping_add(lo - 1)) {
            lo -= 1;
        }
        let mut hi = off + 1;
        while hi < self.size && self.contains_bit(self.base.wrapping_add(hi)) {
            hi += 1;
        }
        Some((self.base.wrapping_add(lo), self.base.wrapping_add(hi)))
    }

    /// True when some number above the base has arrived.
    pub fn has_gap(&self) -> bool {
        self.above > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_across_the_wrap() {
        assert!(lt(u32::MAX, 0));
        assert!(lt(u32::MAX - 5, 3));
        assert!(!lt(3, u32::MAX - 5));
        assert!(le(7, 7));
    }

    #[test]
    fn window_slides_over_contiguous_numbers_and_reports_gaps() {
        let mut w = SeqWindow::new(u32::MAX - 1, 128);
        assert!(w.insert(u32::MAX));
        assert!(!w.insert(u32::MAX), "duplicate");
        assert_eq!(w.base(), u32::MAX - 1);
        assert!(w.insert(2));
        assert!(w.insert(3));
        let mut r = vec![];
        w.ranges(8, |s, e| r.push((s, e)));
        assert_eq!(r, vec![(u32::MAX, 0), (2, 4)]);
        assert!(w.insert(u32::MAX - 1));
        assert_eq!(w.base(), 0);
        assert!(w.insert(0));
        assert!(w.insert(1));
        assert_eq!(w.base(), 4);
        assert!(!w.has_gap());
        assert!(w.contains(2), "below the base counts as arrived");
        assert!(!w.insert(4 + 128), "beyond the window");
    }

    #[test]
    fn a_far_jump_clears_the_window_at_once() {
        let mut w = SeqWindow::new(10, 64);
        assert!(w.insert(12));
        w.advance(10u32.wrapping_add(1 << 31));
        assert_eq!(w.base(), 10u32.wrapping_add(1 << 31));
        assert!(!w.has_gap());
    }

    #[test]
    fn the_range_holding_a_number() {
        let mut w = SeqWindow::new(u32::MAX - 2, 64);
        for n in [u32::MAX, 0, 1, 5] {
            assert!(w.insert(n));
        }
        assert_eq!(w.range_of(0), Some((u32::MAX, 2)));
        assert_eq!(w.range_of(5), Some((5, 6)));
        assert_eq!(w.range_of(3), None, "not arrived");
        assert_eq!(w.range_of(u32::MAX - 3), None, "below the base");
        assert_eq!(
            w.range_of((u32::MAX - 2).wrapping_add(64)),
            None,
            "past the window"
        );
    }

    #[test]
    fn sizes_round_up_to_a_power_of_two_and_hold_across_the_wrap() {
        let mut w = SeqWindow::new(u32::MAX - 40, 100);
        assert_eq!(w.size(), 128);
        // Every number from just below the wrap to well past it lands on
        // its own bit: none collides with one already there.
        for n in (0..120u32).map(|i| (u32::MAX - 39).wrapping_add(i)) {
            assert!(w.insert(n), "{n} collided");
        }
        assert!(w.insert(u32::MAX - 40));
        assert_eq!(w.base(), (u32::MAX - 39).wrapping_add(120));
        assert!(!w.has_gap());
    }

    #[test]
    fn advance_skips_a_gap() {
        let mut w = SeqWindow::new(10, 64);
        assert!(w.insert(12));
        w.advance(12);
        assert_eq!(w.base(), 13);
        assert!(!w.has_gap());
    }

    /// The count behind `has_gap` agrees with the bits themselves through
    /// any mix of arrivals, duplicates, advances and far jumps.
    #[test]
    fn the_gap_count_matches_the_bits() {
        let mut next = crate::xorshift(0x9e37_79b9_7f4a_7c15u64);
        let mut w = SeqWindow::new(u32::MAX - 300, 256);
        for _ in 0..200_000 {
            let r = next();
            match r % 16 {
                0 => w.advance(w.base().wrapping_add((r >> 8) as u32 % 300)),
                1 if r % 1000 == 1 => w.advance(w.base().wrapping_add(1 << 30)),
                _ => {
                    w.insert(w.base().wrapping_add((r >> 8) as u32 % 300));
                }
            }
            assert_eq!(w.has_gap(), w.bits.iter().any(|&b| b != 0));
        }
    }
}
