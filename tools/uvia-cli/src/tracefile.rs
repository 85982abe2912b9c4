//! Checkpoint traces of a measurement, written for `uvia anatomy`.
//!
//! When `UVIA_TRACE_DIR` names a directory and the binary was built with
//! the `trace` feature, each side of a ping-pong records checkpoints through
//! the measured round trips of each size and writes them to
//! `<dir>/<side>.trace` (the last size's are what remains): one
//! line per checkpoint, `ns ticks stage thread`, after a header line with
//! the cost of one checkpoint and the counter's rate.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;

/// Checkpoints a side records per round trip, at most (with room to spare).
const MARKS_PER_ROUND_TRIP: usize = 32;

fn dir() -> Option<PathBuf> {
    if !uvia_trace::COMPILED_IN {
        return None;
    }
    std::env::var_os("UVIA_TRACE_DIR").map(PathBuf::from)
}

/// Starts recording, if asked to, for `iters` round trips. A directory
/// that is not there is named now, before the measurement, not after it.
pub fn begin(iters: usize) -> Result<()> {
    if let Some(d) = dir() {
        if !d.is_dir() {
            anyhow::bail!("UVIA_TRACE_DIR {}: not a directory", d.display());
        }
        uvia_trace::start(iters.saturating_mul(MARKS_PER_ROUND_TRIP));
    }
    Ok(())
}

/// Stops recording and writes what was recorded as `side`'s trace.
pub fn end(side: &str) -> Result<()> {
    let Some(dir) = dir() else {
        return Ok(());
    };
    let t = uvia_trace::take();
    let path = dir.join(format!("{side}.trace"));
    let f = std::fs::File::create(&path).with_context(|| format!("writing {}", path.display()))?;
    let mut w = std::io::BufWriter::new(f);
    writeln!(
        w,
        "# mark_cost_ns {:.2} ticks_per_ns {:.6} dropped {}",
        t.mark_cost_ns, t.ticks_per_ns, t.dropped
    )?;
    for m in &t.marks {
        writeln!(w, "{} {} {} {}", m.ns, m.ticks, m.stage.name(), m.thread)?;
    }
    w.flush()
        .with_context(|| format!("writing {}", path.display()))
}
