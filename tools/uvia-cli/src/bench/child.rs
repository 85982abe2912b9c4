//! The bench's measurements, each in a child process of its own under a
//! time limit.

use super::first;
use crate::run::RunResult;
use anyhow::{anyhow, Context, Result};
use indicatif::ProgressStyle;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `uvia <args> --json FILE` as a child process under a time limit.
pub(crate) fn sub(args: &[String], timeout: Duration) -> Result<RunResult> {
    let text = sub_json(&crate::self_exe()?, args, timeout)?;
    serde_json::from_str::<RunResult>(&text).context("parsing the measurement's JSON")
}

/// Runs `<exe> <args> --json FILE` as a child process under a time limit;
/// returns the JSON it wrote, or its error.
pub(crate) fn sub_json(exe: &Path, args: &[String], timeout: Duration) -> Result<String> {
    let tmp = std::env::temp_dir().join(format!(
        "uvia-bench-{}-{}.json",
        std::process::id(),
        COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&tmp);
    let mut child = Command::new(exe)
        .args(args)
        .arg("--json")
        .arg(&tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting a measurement process")?;
    let mut stderr = child.stderr.take();
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let err_text = errs.join().unwrap_or_default();
    let msg = err_text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim_start_matches("uvia: error: ").trim().to_string())
        .collect::<Vec<_>>()
        .join("; ");
    let r = match status {
        None => Err(anyhow!(
            "did not finish within {timeout:?}{}",
            if msg.is_empty() {
                String::new()
            } else {
                format!(" ({msg})")
            }
        )),
        Some(st) if !st.success() => Err(anyhow!(
            "{}",
            if msg.is_empty() {
                format!("exited with {st}")
            } else {
                msg
            }
        )),
        Some(_) => std::fs::read_to_string(&tmp).context("reading the measurement's JSON"),
    };
    let _ = std::fs::remove_file(&tmp);
    r
}

static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One measurement of the first size of `uvia <args>` in its own process.
pub(crate) fn measure(args: &[&str], timeout: Duration) -> Result<crate::run::SizeResult> {
    let a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let r = sub(&a, timeout)?;
    Ok(first(&r)?.clone())
}

pub(crate) fn progress_style() -> ProgressStyle {
    ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}
