//! Byte copies for the data path.
//!
//! Messages of a few bytes dominate latency, and a call into the C library's
//! `memcpy` (a dispatch through the dynamic linker and a size switch) costs
//! more than the copy itself. Copies up to 64 bytes are done here with two
//! possibly overlapping fixed-size moves, which compile to a handful of
//! instructions and never touch bytes outside either range.

use std::ptr::{read_unaligned, write_unaligned};

/// Copies `n` bytes from `src` to `dst`.
///
/// # Safety
/// `src` is valid for `n` reads, `dst` for `n` writes, and they do not overlap.
#[inline(always)]
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY (every arm): each move stays inside the first `n` bytes of both
    // ranges; unaligned reads and writes are used, so no alignment is assumed.
    unsafe {
        match n {
            0 => {}
            1..=3 => {
                for i in 0..n {
                    *dst.add(i) = *src.add(i);
                }
            }
            4..=7 => {
                let a = read_unaligned(src as *const u32);
                let b = read_unaligned(src.add(n - 4) as *const u32);
                write_unaligned(dst as *mut u32, a);
                write_unaligned(dst.add(n - 4) as *mut u32, b);
            }
            8..=16 => {
                let a = read_unaligned(src as *const u64);
                let b = read_unaligned(src.add(n - 8) as *const u64);
                write_unaligned(dst as *mut u64, a);
                write_unaligned(dst.add(n - 8) as *mut u64, b);
            }
            17..=32 => {
                let a = read_unaligned(src as *const [u8; 16]);
                let b = read_unaligned(src.add(n - 16) as *const [u8; 16]);
                write_unaligned(dst as *mut [u8; 16], a);
                write_unaligned(dst.add(n - 16) as *mut [u8; 16], b);
            }
            33..=64 => {
                let a = read_unaligned(src as *const [u8; 32]);
                let b = read_unaligned(src.add(n - 32) as *const [u8; 32]);
                write_unaligned(dst as *mut [u8; 32], a);
                write_unaligned(dst.add(n - 32) as *mut [u8; 32], b);
            }
            _ => std::ptr::copy_nonoverlapping(src, dst, n),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_small_length_copies_exactly() {
        let src: Vec<u8> = (0..200u8).collect();
        for n in 0..=130 {
            let mut dst = vec![0xffu8; 140];
            // SAFETY: both buffers hold more than `n + 1` bytes.
            unsafe { super::copy(dst.as_mut_ptr().add(1), src.as_ptr().add(3), n) };
            assert_eq!(dst[0], 0xff, "n={n}: byte before untouched");
            assert_eq!(&dst[1..1 + n], &src[3..3 + n], "n={n}");
            assert!(
                dst[1 + n..].iter().all(|&b| b == 0xff),
                "n={n}: bytes after untouched"
            );
        }
    }
}
