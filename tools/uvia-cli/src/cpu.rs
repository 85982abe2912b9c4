//! Per-process CPU use over a measured interval:
//! (user + system time from `getrusage(RUSAGE_SELF)`) delta / wall-clock delta.

use std::time::Instant;

/// User plus system CPU time consumed by this process so far, in seconds.
pub fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the zeroed struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Measures the CPU use of this process from `start` to `stop`.
pub struct CpuMeter {
    cpu: f64,
    wall: Instant,
}

impl CpuMeter {
    pub fn start() -> CpuMeter {
        CpuMeter {
            cpu: process_cpu_seconds(),
            wall: Instant::now(),
        }
    }

    /// CPU seconds per wall second since `start` (0..=1 for one busy thread).
    pub fn stop(&self) -> f64 {
        let wall = self.wall.elapsed().as_secs_f64();
        let cpu = process_cpu_seconds() - self.cpu;
        if wall > 0.0 {
            (cpu / wall).max(0.0)
        } else {
            0.0
        }
    }
}
