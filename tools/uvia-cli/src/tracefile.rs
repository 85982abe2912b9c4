//! Checkpoint traces of a measurement, written for `uvia anatomy`.
//!
//! When `UVIA_TRACE_DIR` names a directory and the binary was built with
//! the `trace` feature, each side of a ping-pong records checkpoints through
//! the measured round trips of each size and writes them to
//! `<dir>/<side>.trace` (the last size's are what remains). With
//! `UVIA_TRACE_SLICES` (a comma list of size positions, from 0) only those
//! positions record, each to `<dir>/<side>.<position>.trace`: one measurement
//! then holds untraced and traced slices side by side. One
//! line per checkpoint, `ns ticks stage thread`, after a header line with
//! the cost of one checkpoint, the counter's rate and the process id.

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

/// The slices (a measurement's sizes, in order, counted from 0) that
/// record, from `UVIA_TRACE_SLICES`; `None` when every one does.
fn slices() -> Result<Option<Vec<usize>>> {
    std::env::var_os("UVIA_TRACE_SLICES")
        .map(|v| parse_slices(&v.to_string_lossy()))
        .transpose()
}

/// `1,2,4`: slice numbers; an empty list is no slice at all.
fn parse_slices(v: &str) -> Result<Vec<usize>> {
    v.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse()
                .with_context(|| format!("UVIA_TRACE_SLICES {v:?}: {s:?} is not a slice number"))
        })
        .collect()
}

/// Whether `slice` records: the directory, and whether the files carry
/// the slice's number (`UVIA_TRACE_SLICES` chose it) or not (every slice
/// records, each overwriting the last).
fn recording(slice: usize) -> Result<Option<(PathBuf, bool)>> {
    let Some(d) = dir() else {
        return Ok(None);
    };
    Ok(match slices()? {
        None => Some((d, false)),
        Some(list) if list.contains(&slice) => Some((d, true)),
        Some(_) => None,
    })
}

/// Starts recording slice `slice`, if asked to, for `iters` round trips.
/// A directory that is not there is named now, before the measurement,
/// not after it.
pub fn begin(slice: usize, iters: usize) -> Result<()> {
    let Some((d, _)) = recording(slice)? else {
        return Ok(());
    };
    if !d.is_dir() {
        anyhow::bail!("UVIA_TRACE_DIR {}: not a directory", d.display());
    }
    uvia_trace::start(iters.saturating_mul(MARKS_PER_ROUND_TRIP));
    Ok(())
}

/// Stops recording slice `slice` and writes what was recorded as `side`'s
/// trace.
pub fn end(side: &str, slice: usize) -> Result<()> {
    let Some((d, numbered)) = recording(slice)? else {
        return Ok(());
    };
    let path = file(&d, side, numbered.then_some(slice));
    let t = uvia_trace::take();
    let f = std::fs::File::create(&path).with_context(|| format!("writing {}", path.display()))?;
    let mut w = std::io::BufWriter::new(f);
    writeln!(
        w,
        "# mark_cost_ns {:.2} ticks_per_ns {:.6} dropped {} pid {}",
        t.mark_cost_ns,
        t.ticks_per_ns,
        t.dropped,
        std::process::id()
    )?;
    for m in &t.marks {
        writeln!(w, "{} {} {} {}", m.ns, m.ticks, m.stage.name(), m.thread)?;
    }
    w.flush()
        .with_context(|| format!("writing {}", path.display()))
}

/// A side's trace as read back.
#[derive(Clone, Debug, Default)]
pub struct SideTrace {
    pub marks: Vec<uvia_trace::Mark>,
    pub mark_cost_ns: f64,
    pub ticks_per_ns: f64,
    pub dropped: u64,
    pub pid: u32,
}

impl SideTrace {
    /// A side's trace for the tests: marks at `(ns, stage)` on thread 0,
    /// in the order given, each mark's ticks its ns, checkpoints free.
    #[cfg(test)]
    pub fn of_marks(pid: u32, marks: &[(u64, uvia_trace::Stage)], ticks_per_ns: f64) -> Self {
        SideTrace {
            marks: marks
                .iter()
                .map(|&(ns, stage)| uvia_trace::Mark {
                    ns,
                    ticks: ns,
                    stage,
                    thread: 0,
                })
                .collect(),
            mark_cost_ns: 0.0,
            ticks_per_ns,
            dropped: 0,
            pid,
        }
    }
}

/// `<dir>/<side>.trace`, or with a slice `<dir>/<side>.<slice>.trace`.
fn file(dir: &std::path::Path, side: &str, slice: Option<usize>) -> PathBuf {
    match slice {
        None => dir.join(format!("{side}.trace")),
        Some(i) => dir.join(format!("{side}.{i}.trace")),
    }
}

/// Reads `<dir>/<side>.trace`, or with a slice `<dir>/<side>.<slice>.trace`.
pub fn read(dir: &std::path::Path, side: &str, slice: Option<usize>) -> Result<SideTrace> {
    let path = file(dir, side, slice);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    parse(&text).with_context(|| format!("reading {}", path.display()))
}

fn parse(text: &str) -> Result<SideTrace> {
    let mut lines = text.lines();
    let head: Vec<&str> = lines
        .next()
        .and_then(|l| l.strip_prefix("# "))
        .ok_or_else(|| anyhow::anyhow!("no header line"))?
        .split_whitespace()
        .collect();
    let field = |name: &str| -> Result<&str> {
        head.chunks(2)
            .find(|kv| kv[0] == name && kv.len() == 2)
            .map(|kv| kv[1])
            .ok_or_else(|| anyhow::anyhow!("the header has no {name}"))
    };
    let mut t = SideTrace {
        mark_cost_ns: field("mark_cost_ns")?.parse()?,
        ticks_per_ns: field("ticks_per_ns")?.parse()?,
        dropped: field("dropped")?.parse()?,
        pid: field("pid")?.parse()?,
        marks: Vec::new(),
    };
    for (i, l) in lines.enumerate() {
        let bad = || anyhow::anyhow!("line {}: {l:?} is not `ns ticks stage thread`", i + 2);
        let f: Vec<&str> = l.split_whitespace().collect();
        let [ns, ticks, stage, thread] = f[..] else {
            return Err(bad());
        };
        let stage = uvia_trace::Stage::ALL
            .into_iter()
            .find(|s| s.name() == stage)
            .ok_or_else(bad)?;
        t.marks.push(uvia_trace::Mark {
            ns: ns.parse().map_err(|_| bad())?,
            ticks: ticks.parse().map_err(|_| bad())?,
            stage,
            thread: thread.parse().map_err(|_| bad())?,
        });
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_reads_back_and_bad_lines_are_named() {
        let t = parse("# mark_cost_ns 9.50 ticks_per_ns 2.5 dropped 0 pid 42\n100 250 app-send 0\n180 450 rx-found 1\n").unwrap();
        assert_eq!((t.pid, t.dropped, t.mark_cost_ns), (42, 0, 9.5));
        assert_eq!(t.marks.len(), 2);
        assert_eq!(t.marks[1].stage, uvia_trace::Stage::RxFound);
        assert_eq!((t.marks[1].ns, t.marks[1].thread), (180, 1));
        let e =
            parse("# mark_cost_ns 1 ticks_per_ns 1 dropped 0 pid 1\n1 2 nonsense 0\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        assert!(parse("100 250 app-send 0\n").is_err());
    }

    #[test]
    fn the_slices_that_record_are_a_comma_list_and_a_bad_one_is_named() {
        assert_eq!(parse_slices("1,2, 4").unwrap(), [1, 2, 4]);
        assert_eq!(parse_slices("").unwrap(), Vec::<usize>::new());
        let e = parse_slices("1,x").unwrap_err();
        assert!(
            format!("{e:#}").contains("\"x\" is not a slice number"),
            "{e:#}"
        );
    }
}
