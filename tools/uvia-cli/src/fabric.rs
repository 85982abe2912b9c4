//! `uvia fabric` and the libfabric section of `uvia bench`: the libfabric
//! provider measured by libfabric's own ping-pong (`fi_pingpong`, from
//! Debian's `libfabric-bin`) against libfabric's native providers and
//! against uvia's own tools, in interleaved pairs.
//!
//! `fi_pingpong` reports the mean time per transfer (one way) and the
//! bytes per second of its ping-pong; the uvia side of the provider-cost
//! and bandwidth comparisons is taken in the same form (mean one-way time,
//! stream MB/s of `uvia bw`). Both `fi_pingpong` processes are pinned, the
//! server to core 0 and the client to core 1, like `uvia pingpong`'s.

use crate::bench::{interleave, Headline};
use anyhow::{anyhow, bail, Context, Result};
use indicatif::ProgressBar;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// The name cargo gives the provider library, next to this program.
const BUILT_NAME: &str = "libuvia_fi.so";
/// The name libfabric loads providers by (`*-fi.so`).
const LOADED_NAME: &str = "libuvia-fi.so";

/// One `fi_pingpong` size's figures.
#[derive(Debug, Clone, Copy)]
pub struct FiResult {
    /// Mean one-way time per transfer, in nanoseconds.
    pub mean_ns: f64,
}

/// A folder holding the provider under the name libfabric loads, for
/// `FI_PROVIDER_PATH`; removed when dropped.
pub struct ProviderDir(PathBuf);

impl ProviderDir {
    /// Copies the provider built beside this program (`cargo build
    /// --release -p uvia-fabric`), or the file `UVIA_FI_LIB` names.
    pub fn new() -> Result<ProviderDir> {
        let lib = match std::env::var_os("UVIA_FI_LIB") {
            Some(p) if p.is_empty() => {
                bail!("UVIA_FI_LIB is set but empty: name the provider library, or unset it")
            }
            Some(p) => {
                let lib = PathBuf::from(p);
                if !lib.is_file() {
                    bail!(
                        "UVIA_FI_LIB names {}, which is not a file (the provider library, \
                         libuvia_fi.so from cargo build --release -p uvia-fabric)",
                        lib.display()
                    );
                }
                lib
            }
            None => std::env::current_exe()
                .context("finding this program's folder")?
                .with_file_name(BUILT_NAME),
        };
        if !lib.is_file() {
            bail!(
                "the libfabric provider {} is not built (cargo build --release -p uvia-fabric, \
                 or name the library with UVIA_FI_LIB)",
                lib.display()
            );
        }
        let dir = std::env::temp_dir().join(format!("uvia-fabric-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::copy(&lib, dir.join(LOADED_NAME))
            .with_context(|| format!("copying {} to {}", lib.display(), dir.display()))?;
        Ok(ProviderDir(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ProviderDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `fi_pingpong` is installed (Debian's `libfabric-bin`).
pub fn available() -> Result<()> {
    match Command::new("fi_pingpong")
        .arg("-h")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(_) => Ok(()),
        Err(_) => bail!("fi_pingpong is not installed (apt-get install libfabric-bin)"),
    }
}

/// A control port for the next run: this process's own range, so that
/// two benches on one host do not meet, and a fresh port per run (a
/// server's port lingers in TIME_WAIT).
fn next_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 30000 + (std::process::id() % 500) as u16 * 40;
    base + NEXT.fetch_add(1, Ordering::Relaxed) % 40
}

fn spawn(dir: &Path, core: usize, args: &[String]) -> Result<Child> {
    let mut c = Command::new("fi_pingpong");
    c.args(args)
        .env("FI_PROVIDER_PATH", dir)
        .env_remove("FI_PROVIDER")
        .env_remove("FI_UVIA_DOMAIN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    crate::pin::pin_child(&mut c, core);
    c.spawn()
        .context("starting fi_pingpong (apt-get install libfabric-bin)")
}

/// Waits for `child` until `deadline`, killing it after; its stdout and
/// stderr, and whether it succeeded.
pub(crate) fn finish(mut child: Child, deadline: Instant) -> (bool, String, String) {
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let (mut o, mut e) = (String::new(), String::new());
        if let Some(s) = out.as_mut() {
            let _ = s.read_to_string(&mut o);
        }
        if let Some(s) = err.as_mut() {
            let _ = s.read_to_string(&mut e);
        }
        (o, e)
    });
    let ok = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st.success(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break false;
            }
        }
    };
    let (o, e) = reader.join().unwrap_or_default();
    (ok, o, e)
}

/// The figures of `fi_pingpong`'s result line for one size of `size`
/// bytes: `bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec`.
/// Both rates come from the same elapsed time, so the time per transfer
/// is also `size / MB/sec`, which keeps four digits where `usec/xfer`
/// prints two decimals (0.21 or 0.22 us: a step of 5% at 8 B on shm).
pub(crate) fn parse(out: &str, size: usize) -> Result<FiResult> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.split_whitespace().count() == 8 && !l.starts_with("bytes"))
        .ok_or_else(|| anyhow!("no result line in fi_pingpong's output: {out:?}"))?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let num = |s: &str| -> Result<f64> {
        s.parse::<f64>()
            .with_context(|| format!("fi_pingpong's figure {s:?} in {line:?}"))
    };
    let (mbytes_per_s, usec) = (num(f[5])?, num(f[6])?);
    let mean_ns = if mbytes_per_s > 0.0 && size > 0 {
        size as f64 / mbytes_per_s * 1000.0
    } else {
        usec * 1000.0
    };
    Ok(FiResult { mean_ns })
}

/// One `fi_pingpong` run of `iters` transfers of `size` bytes: `provider`
/// (`-p`), endpoint type `ep`, domain `domain` when given. A control port
/// another socket holds (one of an earlier run's, waiting out its close)
/// makes the server fail at once: the run is made again on the next port.
pub fn pingpong(
    dir: &ProviderDir,
    provider: &str,
    ep: &str,
    domain: Option<&str>,
    size: usize,
    iters: usize,
    timeout: Duration,
) -> Result<FiResult> {
    let mut common: Vec<String> = ["-p", provider, "-e", ep, "-I"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    common.push(iters.to_string());
    common.push("-S".into());
    common.push(size.to_string());
    if let Some(d) = domain {
        common.push("-d".into());
        common.push(d.into());
    }
    let deadline = Instant::now() + timeout;
    let mut ports_tried = 0;
    loop {
        let port = next_port().to_string();
        let mut server_args = common.clone();
        server_args.extend(["-B".to_string(), port.clone()]);
        let mut server = spawn(dir.path(), 0, &server_args)?;
        let mut client_args = common.clone();
        client_args.extend(["-P".to_string(), port, "127.0.0.1".to_string()]);
        // The server opens its control socket some time after it starts;
        // the client does not retry, so it is started again while refused
        // and the server still runs.
        let mut tries = 0;
        let client = loop {
            std::thread::sleep(Duration::from_millis(if tries == 0 { 150 } else { 100 }));
            let (ok, out, err) = finish(spawn(dir.path(), 1, &client_args)?, deadline);
            tries += 1;
            let server_gone = matches!(server.try_wait(), Ok(Some(_)));
            if ok || !err.contains("Connection refused") || server_gone || tries >= 30 {
                break (ok, out, err);
            }
        };
        let (s_ok, _s_out, s_err) = finish(server, deadline);
        let (c_ok, c_out, c_err) = client;
        if !s_ok && s_err.contains("Address already in use") && ports_tried < 5 {
            ports_tried += 1;
            continue;
        }
        if !c_ok || !s_ok {
            let why = |e: &str| e.lines().last().unwrap_or("no message").trim().to_string();
            bail!(
                "fi_pingpong -p '{provider}' -e {ep}{} failed: client: {}; server: {}",
                domain.map(|d| format!(" -d {d}")).unwrap_or_default(),
                if c_ok { "ok".into() } else { why(&c_err) },
                if s_ok { "ok".into() } else { why(&s_err) },
            );
        }
        return parse(&c_out, size);
    }
}

/// The streaming bandwidth program over libfabric's connected endpoints
/// (see its head: Debian packages no bandwidth test of libfabric's own).
const BW_C: &str = include_str!("../c/fi_msg_bw.c");

/// `fi_msg_bw` built with the `cc` on PATH against the installed
/// libfabric, in `dir`.
pub fn build_bw(dir: &Path) -> Result<PathBuf> {
    let src = dir.join("fi_msg_bw.c");
    std::fs::write(&src, BW_C).with_context(|| format!("writing {}", src.display()))?;
    let exe = dir.join("fi_msg_bw");
    let o = Command::new("cc")
        .args(["-std=c11", "-O2"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg("-lfabric")
        .output()
        .context("running cc (apt-get install gcc libc6-dev)")?;
    if !o.status.success() {
        bail!(
            "building fi_msg_bw failed (libfabric-dev installed?): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(exe)
}

/// One run of `fi_msg_bw` (`exe`): `iters` messages of `size` bytes
/// streamed one way over `provider`'s connected endpoint (`domain` when
/// given), receiver on core 0, sender on core 1; its MB/s (10^6 bytes).
pub fn stream(
    dir: &ProviderDir,
    exe: &Path,
    provider: &str,
    domain: Option<&str>,
    size: usize,
    iters: usize,
    timeout: Duration,
) -> Result<f64> {
    let (size_s, iters_s) = (size.to_string(), iters.to_string());
    let secs = timeout.as_secs().max(1).to_string();
    let mut c = Command::new(exe);
    c.args(["-p", provider, "-S", &size_s, "-I", &iters_s])
        .args(["-s", "0", "-C", "1", "-t", &secs]);
    if let Some(d) = domain {
        c.args(["-d", d]);
    }
    c.env("FI_PROVIDER_PATH", dir.path())
        .env_remove("FI_PROVIDER")
        .env_remove("FI_UVIA_DOMAIN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().context("starting fi_msg_bw")?;
    let (ok, out, err) = finish(child, Instant::now() + timeout + Duration::from_secs(5));
    if !ok {
        bail!(
            "fi_msg_bw -p '{provider}'{} -S {size} failed: {}",
            domain.map(|d| format!(" -d {d}")).unwrap_or_default(),
            err.lines().last().unwrap_or("no message").trim()
        );
    }
    parse_stream(&out)
}

/// The MB/s of `fi_msg_bw`'s line `size S iters N seconds T MB/s R msgs/s M`.
fn parse_stream(out: &str) -> Result<f64> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with("size "))
        .ok_or_else(|| anyhow!("no result line in fi_msg_bw's output: {out:?}"))?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let at = f
        .iter()
        .position(|&w| w == "MB/s")
        .filter(|&i| i + 1 < f.len())
        .ok_or_else(|| anyhow!("no MB/s in fi_msg_bw's line {line:?}"))?;
    f[at + 1]
        .parse::<f64>()
        .with_context(|| format!("fi_msg_bw's MB/s in {line:?}"))
}

/// The libfabric provider's comparisons, each in `pairs` interleaved pairs.
pub fn headlines(pb: &ProgressBar, quick: bool, pairs: usize, timeout: Duration) -> Vec<Headline> {
    let names: [(&str, &str, &str, &str); 6] = [
        (
            "libfabric msg 8 B: uvia on udp vs libfabric tcp (loopback)",
            "uvia mean / tcp mean",
            "ns",
            "<= 0.6x",
        ),
        (
            "libfabric msg 8 B: uvia on shm vs libfabric shm (rdm)",
            "uvia mean / shm mean",
            "ns",
            "<= 0.5x",
        ),
        (
            "libfabric rdm 8 B: uvia (its own FI_EP_RDM) on shm vs libfabric shm",
            "uvia mean / shm mean",
            "ns",
            "<= 1.0x",
        ),
        (
            "provider cost 8 B: fi_pingpong msg on shm vs uvia pingpong shm",
            "fi_pingpong mean / uvia pingpong mean",
            "ns",
            "<= 1.2x",
        ),
        (
            "libfabric msg 1 MiB on shm: a stream (fi_msg_bw) vs uvia bw",
            "fi_msg_bw MB/s / uvia bw MB/s",
            "MB/s",
            ">= 0.8x",
        ),
        (
            "provider cost 1 MiB: fi_pingpong msg on shm vs uvia pingpong shm",
            "fi_pingpong mean / uvia pingpong mean",
            "ns",
            "<= 1.2x",
        ),
    ];
    let dir = match available().and_then(|()| ProviderDir::new()) {
        Ok(d) => d,
        Err(why) => {
            pb.inc(names.len() as u64 * pairs as u64);
            return names
                .iter()
                .map(|&(n, r, u, t)| Headline::skipped(n, r, u, t, format!("skipped: {why:#}")))
                .collect();
        }
    };
    // fi_pingpong has no warm-up. Over the provider's own FI_EP_RDM the
    // first message makes its link (a segment and a socket's connect, some
    // 100 us), so the rdm row takes 2,000,000 round trips (about a second),
    // as it did over ofi_rxm, whose connection cost 15-20 ms. Short runs
    // of 8 B on shm take a tenth of a second either way, so the quick run
    // keeps the full counts. For 1 MiB, the first messages move the
    // program's buffers into shared memory and fault in the peer's
    // mappings of them, some 2 ms (`-I 10` runs take 1.8 ms more than ten
    // round trips of 9 us), which 1,000 round trips turned into 1 us of a
    // 10 us transfer; 5,000 (a tenth of a second) make it 0.2 us, as `uvia
    // bw`, the row's baseline, leaves its own first messages out as a
    // warm-up.
    let iters = 100_000;
    let rdm_iters = 2_000_000;
    let udp_iters = if quick { 5_000 } else { 20_000 };
    let big_iters = 5_000;
    let fi = |p: &str, ep: &str, d: Option<&str>, size: usize, n: usize| {
        pingpong(&dir, p, ep, d, size, n, timeout)
    };
    // A ping-pong's bytes per second are not a stream's: the bandwidth row
    // streams over the provider (fi_msg_bw, built here) as `uvia bw`
    // streams, with the same window (64) and batches (20, each
    // acknowledged); fi_pingpong's 1 MiB round trips set the provider's
    // cost beside `uvia pingpong`'s instead.
    let bw_exe = build_bw(dir.path());
    let fi_bw = |size: usize, n: usize| match &bw_exe {
        Ok(exe) => stream(&dir, exe, "uvia", Some("shm"), size, n, timeout),
        Err(e) => Err(anyhow!("{e:#}")),
    };
    let mean = |r: Result<FiResult>| r.map(|r| r.mean_ns);
    // `uvia pingpong` or `uvia bw` (`kind`) on shm, one size.
    let uvia = |kind: &str, size: &str, n: usize| {
        let n = n.to_string();
        let a = [kind, "--provider", "shm", "--sizes", size, "--iters", &n];
        crate::bench::measure(&a, timeout)
    };
    type Side<'a> = Box<dyn FnMut() -> Result<f64> + 'a>;
    type Meets = Box<dyn Fn(f64) -> bool>;
    // Each comparison: contender, baseline, and whether a ratio meets it.
    let runs: [(Side, Side, Meets); 6] = [
        (
            Box::new(|| mean(fi("uvia", "msg", Some("udp"), 8, udp_iters))),
            Box::new(|| mean(fi("tcp", "msg", None, 8, udp_iters))),
            Box::new(|r| r <= 0.6),
        ),
        (
            Box::new(|| mean(fi("uvia", "msg", Some("shm"), 8, iters))),
            Box::new(|| mean(fi("shm", "rdm", None, 8, iters))),
            Box::new(|r| r <= 0.5),
        ),
        (
            Box::new(|| mean(fi("uvia", "rdm", Some("shm"), 8, rdm_iters))),
            Box::new(|| mean(fi("shm", "rdm", None, 8, rdm_iters))),
            Box::new(|r| r <= 1.0),
        ),
        (
            Box::new(|| mean(fi("uvia", "msg", Some("shm"), 8, iters))),
            Box::new(|| uvia("pingpong", "8", iters).map(|s| s.lat_ns.mean)),
            Box::new(|r| r <= 1.2),
        ),
        (
            Box::new(|| fi_bw(1 << 20, big_iters * 2)),
            Box::new(|| uvia("bw", "1M", big_iters * 2).map(|s| s.mbytes_per_s)),
            Box::new(|r| r >= 0.8),
        ),
        (
            Box::new(|| mean(fi("uvia", "msg", Some("shm"), 1 << 20, big_iters))),
            Box::new(|| uvia("pingpong", "1M", big_iters).map(|s| s.lat_ns.mean)),
            Box::new(|r| r <= 1.2),
        ),
    ];
    names
        .into_iter()
        .zip(runs)
        .map(|((n, r, u, t), (contender, baseline, pass))| {
            interleave(
                pb,
                n,
                r,
                u,
                t,
                pairs,
                contender,
                baseline,
                |c, b| c / b,
                pass,
            )
        })
        .collect()
}

/// `uvia fabric`: the comparisons above on their own, printed as a table.
pub fn run(quick: bool, pairs: usize) -> Result<()> {
    if pairs == 0 {
        bail!("--pairs must be at least 1");
    }
    let pb = ProgressBar::new(6 * pairs as u64);
    pb.set_style(crate::bench::progress_style());
    pb.enable_steady_tick(Duration::from_millis(200));
    let timeout = Duration::from_secs(if quick { 60 } else { 300 });
    let hs = headlines(&pb, quick, pairs, timeout);
    pb.finish_and_clear();
    out!("{}", crate::bench::headline_text(&hs));
    for h in &hs {
        if let Some(e) = &h.error {
            outln!("failed: {}: {e}", h.name);
        }
    }
    let failed = hs.iter().filter(|h| h.ratio.is_none()).count();
    if failed > 0 {
        bail!(
            "{failed} of {} comparisons were not measured (above)",
            hs.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fi_pingpongs_result_line() {
        let out =
            "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                   8       20k     =20k     312k        0.21s      1.55       5.16       0.19\n";
        let r = parse(out, 8).unwrap();
        // 8 B at 1.55 MB/s: 5.161 us, where the line prints 5.16.
        assert!((r.mean_ns - 5161.29).abs() < 0.01, "{}", r.mean_ns);
        let fast = "8       1m      =1m      15m         0.43s     37.54       0.21       4.69\n";
        assert!((parse(fast, 8).unwrap().mean_ns - 213.106).abs() < 0.001);
        // No rate to divide by: the printed time.
        let idle = "8       1m      =1m      15m         0.43s     0.00       0.21       4.69\n";
        assert_eq!(parse(idle, 8).unwrap().mean_ns, 210.0);
        assert!(parse("bytes #sent\n", 8).is_err());
    }

    #[test]
    fn parses_fi_msg_bws_result_line() {
        let out = "size 1048576 iters 10000 seconds 0.062440 MB/s 167932.6 msgs/s 160153.0\n";
        assert_eq!(parse_stream(out).unwrap(), 167932.6);
        assert!(parse_stream("size 8 iters 10 seconds 0.1\n").is_err());
        assert!(parse_stream("size 8 iters 10 seconds 0.1 MB/s fast\n").is_err());
        assert!(parse_stream("").is_err());
    }
}
