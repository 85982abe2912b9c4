//! The bench's anatomy rows, from the build with checkpoints: where the
//! time of a message goes, and the udp streams against the two-CPU bound.

use super::{sub_json, Headline};
use crate::anatomy::compare::Compare;
use anyhow::Context;
use indicatif::ProgressBar;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The command that builds the tool with checkpoints.
const TRACED_BUILD: &str =
    "cargo build --release -p uvia-cli --features trace --target-dir target/trace";

/// The build with checkpoints: the one `UVIA_TRACED_BIN` names, else the
/// workspace's `target/trace/release/uvia` (the workspace is the current
/// folder, as `scripts/bench` runs it), built or brought up to date by
/// cargo first unless `quick` (which takes it as it is). The error is the
/// reason the section is skipped.
pub(super) fn traced_build(quick: bool, pb: &ProgressBar) -> std::result::Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("UVIA_TRACED_BIN") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "UVIA_TRACED_BIN names {}, which is not there",
                p.display()
            ))
        };
    }
    let root = std::env::current_dir().map_err(|e| format!("the current folder: {e}"))?;
    let bin = root.join("target/trace/release/uvia");
    if !root.join("tools/uvia-cli/Cargo.toml").is_file() {
        return Err(
            "no build with checkpoints: run from the workspace, or name one in UVIA_TRACED_BIN"
                .into(),
        );
    }
    if quick {
        return if bin.is_file() {
            Ok(bin)
        } else {
            Err(format!(
                "no build with checkpoints in target/trace (--quick does not build it; {TRACED_BUILD})"
            ))
        };
    }
    pb.set_message("anatomy: building the tool with checkpoints (target/trace)");
    let out = Command::new("cargo")
        .args(TRACED_BUILD.split(' ').skip(1))
        .current_dir(&root)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running cargo to build it: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| l.contains("error"))
            .unwrap_or("");
        return Err(format!("building it failed ({TRACED_BUILD}): {last}"));
    }
    Ok(bin)
}

/// `uvia anatomy --compare` at 1 byte from the build with checkpoints, its
/// plots into `out`; the error is why there is none.
pub(super) fn anatomy_compare(
    traced: &std::result::Result<PathBuf, String>,
    quick: bool,
    out: &Path,
    pb: &ProgressBar,
) -> std::result::Result<Compare, String> {
    let bin = traced.clone()?;
    pb.set_message("anatomy: kernel UDP and uvia's providers, category by category");
    let mut args: Vec<String> = ["anatomy", "--compare", "--size", "1", "--plot-dir"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(out.display().to_string());
    if quick {
        args.extend(["--pairs", "1", "--iters", "500"].map(String::from));
    }
    let timeout = Duration::from_secs(if quick { 120 } else { 600 });
    let text = sub_json(&bin, &args, timeout).map_err(|e| format!("{e:#}"))?;
    serde_json::from_str(&text).map_err(|e| format!("reading its JSON: {e}"))
}

/// `uvia anatomy --stream 16 -p udp` at 64 KiB and 1 KiB, `runs` times
/// each from the build with checkpoints: the measured throughput against
/// the bound of two CPUs (size over the busier side's time per message,
/// its layers summed), with the layer that bounds the stream named.
pub(super) fn anatomy_streams(
    traced: &std::result::Result<PathBuf, String>,
    quick: bool,
    runs: usize,
    out: &Path,
    pb: &ProgressBar,
) -> Vec<Headline> {
    let names = [("64K", "64 KiB", 1usize << 16), ("1K", "1 KiB", 1 << 10)];
    let name = |what: &str| format!("udp {what} stream (anatomy --stream 16) vs the two-CPU bound");
    let (ratio_is, unit, target) = (
        "measured MB/s / the two-CPU bound's MB/s",
        "MB/s",
        ">= 0.9x",
    );
    let bin = match traced {
        Ok(b) => b,
        Err(why) => {
            pb.inc((names.len() * runs) as u64);
            return names
                .iter()
                .map(|(_, what, _)| {
                    Headline::skipped(
                        &name(what),
                        ratio_is,
                        unit,
                        target,
                        format!("skipped: {why}"),
                    )
                })
                .collect();
        }
    };
    let timeout = Duration::from_secs(if quick { 120 } else { 600 });
    names
        .iter()
        .map(|&(arg, what, size)| {
            pb.set_message(format!("anatomy: a udp stream of {what} messages"));
            let mut pairs = Vec::new();
            let mut bound_by = None;
            let mut error = None;
            for _ in 0..runs {
                let dir = out.join(format!("stream-{arg}"));
                let args: Vec<String> = ["anatomy", "-p", "udp", "--size", arg, "--stream", "16"]
                    .iter()
                    .map(|s| s.to_string())
                    .chain(["--plot-dir".to_string(), dir.display().to_string()])
                    .collect();
                let r = sub_json(bin, &args, timeout).and_then(|text| {
                    serde_json::from_str::<crate::anatomy::stream::StreamOut>(&text)
                        .context("reading its JSON")
                });
                pb.inc(1);
                match r {
                    Ok(s) if s.size == size && s.two_cpu_max_bytes_per_s > 0.0 => {
                        pairs.push((
                            s.measured_bytes_per_s / 1e6,
                            s.two_cpu_max_bytes_per_s / 1e6,
                        ));
                        bound_by = s
                            .layers
                            .get(s.bottleneck)
                            .map(|l| format!("{} ({})", l.name, l.side));
                    }
                    Ok(_) => error = Some("its report has no two-CPU bound".to_string()),
                    Err(e) => error = Some(format!("{e:#}")),
                }
            }
            // The report names the layer that bounds the stream.
            let name = match &bound_by {
                Some(b) => format!("{}; its slowest layer: {b}", name(what)),
                None => name(what),
            };
            let pairs = match error {
                Some(e) if pairs.is_empty() => Err(e),
                _ => Ok(pairs),
            };
            Headline::from_pairs(
                &name,
                ratio_is,
                unit,
                target,
                pairs,
                |c, b| c / b,
                |r| r >= 0.9,
            )
        })
        .collect()
}
