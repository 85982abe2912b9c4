//! `uvia peers` and the peers section of `uvia bench`: uvia against what a
//! user would pick instead, each measured by its own tool in the same run,
//! interleaved with the matching uvia run.
//!
//! On shared memory: UCX's UCT active messages and put, and UCP's tag
//! matching (`ucx_perftest`, from `ucx-utils`), libfabric's `shm` provider
//! (`fi_pingpong`, from `libfabric-bin`) and Open MPI's shared-memory path
//! (NetPIPE's `NPopenmpi` under `mpirun --mca btl self,vader`). On loopback:
//! libfabric's `udp`, `tcp` and `udp;ofi_rxd` (`fi_pingpong`) and kernel UDP
//! under `sockperf`, against uvia's udp provider (reliable delivery).
//!
//! Each peer runs its two processes pinned to cores 0 and 1, like uvia's
//! (`taskset`-style affinity set before exec; `mpirun --bind-to core` for
//! NetPIPE). A comparison is one peer at one size in one form; it is
//! measured in pairs (uvia, then the peer) and its ratio is the median of
//! the pair ratios. Each pair compares like with like: the peer's own
//! statistic (median one-way time where the tool gives one, else its mean)
//! against the same statistic of uvia's run; streamed bandwidth against
//! `uvia bw`, ping-pong bandwidth (size / one-way time) against `uvia
//! pingpong`. A peer that is not installed, cannot do a size, or fails is
//! listed with the reason.

use crate::bench::{interleave, Headline};
use crate::report::{fmt_ns, md_table, push, text_table, Series};
use crate::run::{CpuUse, RunResult, SizeResult};
use crate::size::human;
use crate::stats::{median, Stats};
use anyhow::{anyhow, bail, Context, Result};
use indicatif::ProgressBar;
use serde::Serialize;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// Where the two sides meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Medium {
    /// Shared memory between two processes; uvia's shm provider.
    Shm,
    /// 127.0.0.1; uvia's udp provider at reliable delivery.
    Loopback,
}

/// What a comparison measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Form {
    /// One-way time of a ping-pong (round trip / 2), ns.
    Latency,
    /// Back-to-back messages one way, MB/s (10^6 B).
    Stream,
    /// Ping-pong bandwidth: size / one-way time, MB/s.
    PingpongBw,
}

/// Which of a run's figures is compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stat {
    /// The median of the run's samples.
    P50,
    /// The mean over the run (what the tool reports when it has no median).
    Mean,
    /// The lowest of [`BEST_OF`] runs' means: NetPIPE's statistic (it runs
    /// each size three times and reports the best), so uvia's side of such
    /// a pair is run as often and reported alike.
    #[serde(rename = "best_mean")]
    BestMean,
}

/// How many runs a [`Stat::BestMean`] takes the best of (NetPIPE's trials).
pub const BEST_OF: usize = 3;

impl Stat {
    /// Runs a side makes for one value of this statistic.
    fn runs(self) -> usize {
        match self {
            Stat::BestMean => BEST_OF,
            Stat::P50 | Stat::Mean => 1,
        }
    }

    /// Its name in the report's table.
    fn name(self) -> &'static str {
        match self {
            Stat::P50 => "p50",
            Stat::Mean => "mean",
            Stat::BestMean => "best mean of 3",
        }
    }
}

/// The tool that measures a peer.
#[derive(Clone, Copy, Debug)]
enum Tool {
    /// `ucx_perftest` on UCT over the posix transport: `-t <lat test>` /
    /// `-t <bw test>`.
    Uct {
        lat: &'static str,
        bw: &'static str,
        /// The largest message the transport takes in this form (bytes).
        bw_max: usize,
    },
    /// `ucx_perftest` on UCP tag matching, shared-memory transports only.
    UcpTag,
    /// `fi_pingpong -p <provider> -e <endpoint>`.
    Fi {
        provider: &'static str,
        ep: &'static str,
        /// Largest message it carries (datagrams: one per packet).
        max: usize,
    },
    /// NetPIPE over Open MPI's shared-memory path.
    NetPipe,
    /// `sockperf ping-pong` on kernel UDP.
    Sockperf,
}

/// One peer: its name in the rows (`provider`), tool and package.
#[derive(Clone, Copy, Debug)]
pub struct PeerDef {
    pub name: &'static str,
    medium: Medium,
    tool: Tool,
    program: &'static str,
    package: &'static str,
}

/// Every peer, in the report's order.
pub fn peers() -> Vec<PeerDef> {
    use Medium::*;
    vec![
        PeerDef {
            name: "ucx-uct-am",
            medium: Shm,
            tool: Tool::Uct {
                lat: "am_lat",
                bw: "am_bw",
                bw_max: 8192,
            },
            program: "ucx_perftest",
            package: "ucx-utils",
        },
        PeerDef {
            name: "ucx-uct-put",
            medium: Shm,
            tool: Tool::Uct {
                lat: "put_lat",
                bw: "put_bw",
                bw_max: usize::MAX,
            },
            program: "ucx_perftest",
            package: "ucx-utils",
        },
        PeerDef {
            name: "ucx-ucp-tag",
            medium: Shm,
            tool: Tool::UcpTag,
            program: "ucx_perftest",
            package: "ucx-utils",
        },
        PeerDef {
            name: "libfabric-shm",
            medium: Shm,
            tool: Tool::Fi {
                provider: "shm",
                ep: "rdm",
                max: usize::MAX,
            },
            program: "fi_pingpong",
            package: "libfabric-bin",
        },
        PeerDef {
            name: "openmpi-vader",
            medium: Shm,
            tool: Tool::NetPipe,
            program: "NPopenmpi",
            package: "netpipe-openmpi",
        },
        PeerDef {
            name: "libfabric-udp",
            medium: Loopback,
            tool: Tool::Fi {
                provider: "udp",
                ep: "dgram",
                max: 1024,
            },
            program: "fi_pingpong",
            package: "libfabric-bin",
        },
        PeerDef {
            name: "libfabric-tcp",
            medium: Loopback,
            tool: Tool::Fi {
                provider: "tcp",
                ep: "msg",
                max: usize::MAX,
            },
            program: "fi_pingpong",
            package: "libfabric-bin",
        },
        PeerDef {
            name: "libfabric-udp;ofi_rxd",
            medium: Loopback,
            tool: Tool::Fi {
                provider: "udp;ofi_rxd",
                ep: "rdm",
                max: usize::MAX,
            },
            program: "fi_pingpong",
            package: "libfabric-bin",
        },
        PeerDef {
            name: "sockperf-udp",
            medium: Loopback,
            tool: Tool::Sockperf,
            program: "sockperf",
            package: "sockperf",
        },
    ]
}

/// The smallest message `sockperf` sends (its own header).
const SOCKPERF_MIN: usize = 14;

impl PeerDef {
    /// The statistic its tool reports in `form`.
    fn stat(&self, form: Form) -> Stat {
        match (self.tool, form) {
            (Tool::NetPipe, _) => Stat::BestMean,
            (Tool::Uct { .. } | Tool::UcpTag | Tool::Sockperf, Form::Latency) => Stat::P50,
            _ => Stat::Mean,
        }
    }

    /// Its bandwidth form, or why it has none.
    fn bw_form(&self) -> std::result::Result<Form, &'static str> {
        match self.tool {
            Tool::Uct { .. } | Tool::UcpTag => Ok(Form::Stream),
            Tool::Fi { ep: "dgram", .. } => {
                Err("unreliable datagrams of at most one packet: no bandwidth at these sizes")
            }
            Tool::Fi { .. } | Tool::NetPipe => Ok(Form::PingpongBw),
            Tool::Sockperf => {
                Err("sockperf's throughput mode counts what the sender sent, not what arrived")
            }
        }
    }

    /// The size it measures for a uvia size (sockperf cannot go below its header).
    fn size_for(&self, size: usize) -> usize {
        match self.tool {
            Tool::Sockperf => size.max(SOCKPERF_MIN),
            _ => size,
        }
    }

    /// Why it cannot do `size` in `form`, if it cannot.
    fn cannot(&self, form: Form, size: usize) -> Option<String> {
        match (self.tool, form) {
            (Tool::Uct { bw_max, .. }, Form::Stream) if size > bw_max => Some(format!(
                "UCT active messages over posix carry at most {} per message",
                human(bw_max)
            )),
            (Tool::Fi { max, .. }, _) if size > max => {
                Some(format!("carries at most {} per datagram here", human(max)))
            }
            _ => None,
        }
    }
}

/// Its version: the package's (dpkg), else the tool's own line.
fn version(p: &PeerDef) -> String {
    let dpkg = Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", p.package])
        .stderr(Stdio::null())
        .output();
    if let Ok(o) = dpkg {
        let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if o.status.success() && !v.is_empty() {
            return format!("{} {v}", p.package);
        }
    }
    "unknown".into()
}

/// The packages that hold the peers' tools (Debian).
pub const PACKAGES: &str = "ucx-utils, libfabric-bin, sockperf, openmpi-bin, netpipe-openmpi";

/// Whether any peer's tool is installed.
pub fn any_installed() -> bool {
    peers().iter().any(|p| installed(p).is_ok())
}

/// The program is on PATH (and `mpirun` too for NetPIPE).
fn installed(p: &PeerDef) -> std::result::Result<(), String> {
    let mut need = vec![p.program];
    if matches!(p.tool, Tool::NetPipe) {
        need.push("mpirun");
    }
    for prog in need {
        if find_on_path(prog).is_none() {
            return Err(format!(
                "{prog} is not installed (apt-get install {})",
                if prog == "mpirun" {
                    "openmpi-bin"
                } else {
                    p.package
                }
            ));
        }
    }
    Ok(())
}

/// `prog`'s path on PATH, if it is there and executable.
fn find_on_path(prog: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|f| {
            f.metadata()
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

// ---- parsers -------------------------------------------------------------

/// `ucx_perftest`'s `Final:` line: latency (one way for the latency tests)
/// and bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UcxFinal {
    /// 50th percentile of the per-iteration time, us.
    pub p50_us: f64,
    /// Mean per iteration, us.
    pub avg_us: f64,
    /// Bandwidth over the whole run, MB/s (10^6 B; the tool prints MiB/s).
    pub mbytes_per_s: f64,
}

/// Parses `ucx_perftest`'s output; its error lines when there is no result.
pub fn parse_ucx(out: &str) -> Result<UcxFinal> {
    let Some(line) = out.lines().find(|l| l.trim_start().starts_with("Final:")) else {
        let errs: Vec<&str> = out
            .lines()
            .filter(|l| l.contains("ERROR"))
            .map(|l| l.split("ERROR").nth(1).unwrap_or(l).trim())
            .collect();
        if errs.is_empty() {
            bail!("no Final: line in ucx_perftest's output");
        }
        bail!("ucx_perftest: {}", errs.join("; "));
    };
    // Final: iterations p50 average overall bw-average bw-overall rate-average rate-overall
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 9 {
        bail!(
            "ucx_perftest's Final: line has {} fields: {line:?}",
            f.len()
        );
    }
    let num = |s: &str| -> Result<f64> {
        s.replace(',', "")
            .parse::<f64>()
            .with_context(|| format!("ucx_perftest's figure {s:?} in {line:?}"))
    };
    Ok(UcxFinal {
        p50_us: num(f[2])?,
        avg_us: num(f[3])?,
        mbytes_per_s: num(f[6])? * 1.048576,
    })
}

/// NetPIPE's result line for one size: size and one-way time (us).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetPipe {
    pub size: usize,
    /// Half the round trip of its best trial, us.
    pub one_way_us: f64,
}

/// Parses NetPIPE's progress line `N: SIZE bytes REPS times --> X Mbps in T usec`.
pub fn parse_netpipe(out: &str) -> Result<NetPipe> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.contains("times -->") && l.contains("usec"))
        .ok_or_else(|| anyhow!("no result line in NetPIPE's output"))?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let at = |word: &str, off: isize| -> Result<&str> {
        let i = f
            .iter()
            .position(|w| *w == word)
            .ok_or_else(|| anyhow!("no {word:?} in NetPIPE's line {line:?}"))?;
        f.get((i as isize + off) as usize)
            .copied()
            .ok_or_else(|| anyhow!("NetPIPE's line {line:?} ends early"))
    };
    let size = at("bytes", -1)?
        .parse::<usize>()
        .with_context(|| format!("NetPIPE's size in {line:?}"))?;
    let us = at("usec", -1)?
        .parse::<f64>()
        .with_context(|| format!("NetPIPE's time in {line:?}"))?;
    Ok(NetPipe {
        size,
        one_way_us: us,
    })
}

/// `sockperf ping-pong`'s one-way latency: median and mean, us.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sockperf {
    pub p50_us: f64,
    pub avg_us: f64,
    pub observations: usize,
}

/// Drops the terminal colour sequences sockperf writes around some lines.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            if it.peek() == Some(&'[') {
                it.next();
                for d in it.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

pub fn parse_sockperf(out: &str) -> Result<Sockperf> {
    let text = strip_ansi(out);
    let after = |key: &str| -> Option<f64> {
        text.lines().find_map(|l| {
            let i = l.find(key)?;
            l[i + key.len()..]
                .trim_start()
                .split(|c: char| c.is_whitespace() || c == '(')
                .next()?
                .parse::<f64>()
                .ok()
        })
    };
    let p50 = after("percentile 50.000 =")
        .ok_or_else(|| anyhow!("no median (percentile 50.000) in sockperf's output"))?;
    let avg = after("avg-latency=").unwrap_or(f64::NAN);
    let obs = after("Total ").map(|x| x as usize).unwrap_or(0);
    Ok(Sockperf {
        p50_us: p50,
        avg_us: avg,
        observations: obs,
    })
}

// ---- running the tools -----------------------------------------------------

/// A port for the next run: this process's own range (apart from `uvia
/// fabric`'s), a fresh one per run (a server's port lingers in TIME_WAIT).
fn next_port() -> u16 {
    // Each run a port of its own for the whole bench (a full run makes
    // about 150 of them): a server that reused one could find it still held
    // by an earlier connection and fail to listen. Below Linux's ephemeral
    // ports (32768 up), so no client's own port takes it either.
    const SPAN: u32 = 400;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 10_000 + (std::process::id() % (22_000 / SPAN)) * SPAN;
    (base + NEXT.fetch_add(1, Ordering::Relaxed) as u32 % SPAN) as u16
}

/// A command line as one would type it (for the report).
fn shown(env: &[(&str, String)], core: Option<usize>, prog: &str, args: &[String]) -> String {
    let mut s = String::new();
    for (k, v) in env {
        s += &format!("{k}={v} ");
    }
    if let Some(c) = core {
        s += &format!("taskset -c {c} ");
    }
    s += prog;
    for a in args {
        if a.contains([' ', ';']) {
            s += &format!(" '{a}'");
        } else {
            s += &format!(" {a}");
        }
    }
    s
}

fn spawn(
    prog: &str,
    args: &[String],
    env: &[(&str, String)],
    core: Option<usize>,
) -> Result<Child> {
    let mut c = Command::new(prog);
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    if let Some(core) = core {
        crate::pin::pin_child(&mut c, core);
    }
    c.spawn().with_context(|| format!("starting {prog}"))
}

/// The last line worth quoting of a failed run's output.
fn why(out: &str, err: &str) -> String {
    let clean = strip_ansi(&format!("{err}\n{out}"));
    clean
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .find(|l| l.contains("ERROR") || l.contains("rror") || l.contains("nvalid"))
        .or_else(|| clean.lines().map(str::trim).rev().find(|l| !l.is_empty()))
        .unwrap_or("no message")
        .chars()
        .take(300)
        .collect()
}

/// A server on core 0 and a client on core 1; the client is started again
/// while the server is not listening yet (neither tool retries). Returns
/// the client's stdout; the server is killed once the client is done if
/// it does not end by itself (sockperf's never does).
fn client_server(
    prog: &str,
    server: &[String],
    client: &[String],
    env: &[(&str, String)],
    server_ends: bool,
    timeout: Duration,
) -> Result<String> {
    let deadline = Instant::now() + timeout;
    let srv = spawn(prog, server, env, Some(0))?;
    let mut tries = 0;
    let (c_ok, c_out, c_err) = loop {
        std::thread::sleep(Duration::from_millis(if tries == 0 { 200 } else { 100 }));
        let (ok, out, err) = crate::fabric::finish(spawn(prog, client, env, Some(1))?, deadline);
        tries += 1;
        let refused = format!("{out}{err}").contains("refused");
        if ok || !refused || tries >= 30 || Instant::now() >= deadline {
            break (ok, out, err);
        }
    };
    let srv_deadline = if server_ends && c_ok {
        deadline.min(Instant::now() + Duration::from_secs(10))
    } else {
        Instant::now()
    };
    let (s_ok, s_out, s_err) = crate::fabric::finish(srv, srv_deadline);
    if !c_ok && server_ends && !s_ok {
        bail!(
            "{prog}: client: {}; server: {}",
            why(&c_out, &c_err),
            why(&s_out, &s_err)
        );
    }
    if !c_ok {
        bail!("{prog}: client: {}", why(&c_out, &c_err));
    }
    if server_ends && !s_ok {
        bail!("{prog}: server: {}", why(&s_out, &s_err));
    }
    Ok(c_out)
}

/// Iterations for one run of `form` at `size` on `medium`.
fn iters(form: Form, medium: Medium, size: usize, quick: bool) -> usize {
    let div = if quick { 5 } else { 1 };
    match (form, medium) {
        (Form::Latency, Medium::Shm) => 100_000 / div,
        (Form::Latency, Medium::Loopback) => 20_000 / div,
        (_, m) => {
            let budget: usize = if m == Medium::Shm {
                512 << 20
            } else {
                64 << 20
            };
            (budget / div / size.max(1)).clamp(if quick { 20 } else { 50 }, 50_000)
        }
    }
}

/// One measurement by the peer's own tool: its figure (ns one way, or
/// MB/s) and the command line.
fn run_peer(p: &PeerDef, form: Form, size: usize, n: usize, timeout: Duration) -> Result<f64> {
    let s = |x: &str| x.to_string();
    let warm = (n / 10).clamp(10, 10_000).to_string();
    match p.tool {
        Tool::Uct { lat, bw, .. } => {
            let test = if form == Form::Latency { lat } else { bw };
            // Short messages go inline in the transport's descriptor; longer
            // ones are copied into its buffers (what a user of UCT picks).
            let layout = if form == Form::Latency && size <= 64 {
                "short"
            } else {
                "bcopy"
            };
            let port = next_port().to_string();
            let args: Vec<String> = vec![
                s("-t"),
                s(test),
                s("-d"),
                s("memory"),
                s("-x"),
                s("posix"),
                s("-D"),
                s(layout),
                s("-n"),
                n.to_string(),
                s("-w"),
                warm,
                s("-s"),
                size.to_string(),
                s("-p"),
                port,
            ];
            let mut client = vec![s("localhost")];
            client.extend(args.iter().cloned());
            let out = client_server("ucx_perftest", &args, &client, &[], true, timeout)?;
            let r = parse_ucx(&out)?;
            Ok(if form == Form::Latency {
                r.p50_us * 1e3
            } else {
                r.mbytes_per_s
            })
        }
        Tool::UcpTag => {
            let test = if form == Form::Latency {
                "tag_lat"
            } else {
                "tag_bw"
            };
            let port = next_port().to_string();
            let args: Vec<String> = vec![
                s("-t"),
                s(test),
                s("-n"),
                n.to_string(),
                s("-w"),
                warm,
                s("-s"),
                size.to_string(),
                s("-p"),
                port,
            ];
            let mut client = vec![s("localhost")];
            client.extend(args.iter().cloned());
            let env = [("UCX_TLS", s(UCP_TLS))];
            let out = client_server("ucx_perftest", &args, &client, &env, true, timeout)?;
            let r = parse_ucx(&out)?;
            Ok(if form == Form::Latency {
                r.p50_us * 1e3
            } else {
                r.mbytes_per_s
            })
        }
        Tool::Fi { provider, ep, .. } => {
            let port = next_port().to_string();
            let mut args: Vec<String> = vec![
                s("-p"),
                s(provider),
                s("-e"),
                s(ep),
                s("-I"),
                n.to_string(),
                s("-S"),
                size.to_string(),
            ];
            let mut client = args.clone();
            args.extend([s("-B"), port.clone()]);
            client.extend([s("-P"), port, s("127.0.0.1")]);
            let out = client_server("fi_pingpong", &args, &client, &[], true, timeout)?;
            let r = crate::fabric::parse(&out, size)?;
            Ok(if form == Form::Latency {
                r.mean_ns
            } else {
                // fi_pingpong counts both directions over the whole time: size / one-way.
                size as f64 / r.mean_ns * 1e3
            })
        }
        Tool::NetPipe => {
            let dir = std::env::temp_dir().join(format!("uvia-peers-np-{}", std::process::id()));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let out_file = dir.join("np.out");
            let args = netpipe_args(size, n, &out_file);
            let child = Command::new("mpirun")
                .args(&args)
                .current_dir(&dir)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .context("starting mpirun")?;
            let (ok, out, err) = crate::fabric::finish(child, Instant::now() + timeout);
            let _ = std::fs::remove_dir_all(&dir);
            if !ok {
                bail!("mpirun NPopenmpi: {}", why(&out, &err));
            }
            // NetPIPE prints its progress lines on stderr.
            let r = parse_netpipe(&format!("{out}\n{err}"))?;
            if r.size != size {
                bail!("NetPIPE measured {} B, not {size} B", r.size);
            }
            Ok(if form == Form::Latency {
                r.one_way_us * 1e3
            } else {
                size as f64 / r.one_way_us
            })
        }
        Tool::Sockperf => {
            let port = next_port().to_string();
            let server = vec![s("sr"), s("-i"), s("127.0.0.1"), s("-p"), port.clone()];
            let client = sockperf_client(size, n, &port);
            let out = client_server("sockperf", &server, &client, &[], false, timeout)?;
            Ok(parse_sockperf(&out)?.p50_us * 1e3)
        }
    }
}

/// UCP's transports: shared memory and loopback to itself only, so that
/// UCP picks its shared-memory path as it would between two processes of
/// one host.
const UCP_TLS: &str = "sm,self";

fn netpipe_args(size: usize, n: usize, out_file: &Path) -> Vec<String> {
    let mut a: Vec<String> = [
        "--allow-run-as-root",
        "-np",
        "2",
        "--map-by",
        "core",
        "--bind-to",
        "core",
        "--mca",
        "btl",
        "self,vader",
        "NPopenmpi",
        "-p",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend([
        "-l".into(),
        size.to_string(),
        "-u".into(),
        size.to_string(),
        "-n".into(),
        n.to_string(),
        "-o".into(),
        out_file.display().to_string(),
    ]);
    a
}

/// sockperf runs for a time, not a count: about `n` round trips at the
/// usual loopback rate, at least a second.
fn sockperf_client(size: usize, n: usize, port: &str) -> Vec<String> {
    let secs = (n / 20_000).max(1);
    [
        "pp",
        "-i",
        "127.0.0.1",
        "-p",
        port,
        "-m",
        &size.to_string(),
        "-t",
        &secs.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The command lines of one peer measurement, for the report.
fn peer_commands(p: &PeerDef, form: Form, size: usize, n: usize) -> String {
    let s = |x: &str| x.to_string();
    let n_s = n.to_string();
    match p.tool {
        Tool::Uct { lat, bw, .. } => {
            let test = if form == Form::Latency { lat } else { bw };
            let layout = if form == Form::Latency && size <= 64 {
                "short"
            } else {
                "bcopy"
            };
            let a: Vec<String> = [
                "-t", test, "-d", "memory", "-x", "posix", "-D", layout, "-n", &n_s, "-s",
            ]
            .iter()
            .map(|x| s(x))
            .chain([size.to_string()])
            .collect();
            let mut c = vec![s("localhost")];
            c.extend(a.iter().cloned());
            format!(
                "{} & {}",
                shown(&[], Some(0), "ucx_perftest", &a),
                shown(&[], Some(1), "ucx_perftest", &c)
            )
        }
        Tool::UcpTag => {
            let test = if form == Form::Latency {
                "tag_lat"
            } else {
                "tag_bw"
            };
            let a: Vec<String> = ["-t", test, "-n", &n_s, "-s", &size.to_string()]
                .iter()
                .map(|x| s(x))
                .collect();
            let mut c = vec![s("localhost")];
            c.extend(a.iter().cloned());
            let env = [("UCX_TLS", s(UCP_TLS))];
            format!(
                "{} & {}",
                shown(&env, Some(0), "ucx_perftest", &a),
                shown(&env, Some(1), "ucx_perftest", &c)
            )
        }
        Tool::Fi { provider, ep, .. } => {
            let a: Vec<String> = [
                "-p",
                provider,
                "-e",
                ep,
                "-I",
                &n_s,
                "-S",
                &size.to_string(),
            ]
            .iter()
            .map(|x| s(x))
            .collect();
            let mut c = a.clone();
            c.push(s("127.0.0.1"));
            format!(
                "{} & {}",
                shown(&[], Some(0), "fi_pingpong", &a),
                shown(&[], Some(1), "fi_pingpong", &c)
            )
        }
        Tool::NetPipe => {
            let mut a = netpipe_args(size, n, Path::new("np.out"));
            a.truncate(a.len() - 2);
            shown(&[], None, "mpirun", &a)
        }
        Tool::Sockperf => format!(
            "taskset -c 0 sockperf sr -i 127.0.0.1 -p PORT & {}",
            shown(&[], Some(1), "sockperf", &sockperf_client(size, n, "PORT"))
        ),
    }
}

/// The uvia run matching a comparison: its arguments. A one-sided peer's
/// latency (UCT put: a store into the peer's memory that the peer watches)
/// is matched by uvia's one-sided ping-pong (`--rdma-write`), a two-sided
/// one's by send and receive.
fn uvia_args(p: &PeerDef, form: Form, size: usize, n: usize) -> Vec<String> {
    let medium = p.medium;
    let one_sided = form == Form::Latency && matches!(p.tool, Tool::Uct { lat: "put_lat", .. });
    let kind = if form == Form::Stream {
        "bw"
    } else {
        "pingpong"
    };
    let provider = if medium == Medium::Shm { "shm" } else { "udp" };
    [
        kind,
        "--provider",
        provider,
        "--sizes",
        &size.to_string(),
        "--iters",
        &n.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(one_sided.then(|| "--rdma-write".to_string()))
    .collect()
}

/// The best of `runs` values from `run`: the least time for latency, the
/// most bytes for bandwidth. The first error ends it.
fn best_of(runs: usize, form: Form, mut run: impl FnMut() -> Result<f64>) -> Result<f64> {
    let mut best = run()?;
    for _ in 1..runs {
        let v = run()?;
        best = if form == Form::Latency {
            best.min(v)
        } else {
            best.max(v)
        };
    }
    Ok(best)
}

/// uvia's figure in the comparison's form and statistic.
fn uvia_value(r: &SizeResult, form: Form, stat: Stat) -> f64 {
    let t = match stat {
        Stat::P50 => r.lat_ns.p50,
        Stat::Mean | Stat::BestMean => r.lat_ns.mean,
    };
    match form {
        Form::Latency => t,
        Form::Stream => r.mbytes_per_s,
        Form::PingpongBw => {
            if t > 0.0 {
                r.size as f64 / t * 1e3
            } else {
                0.0
            }
        }
    }
}

// ---- the comparisons -------------------------------------------------------

/// One peer at one size in one form, against the matching uvia run.
#[derive(Serialize, Clone)]
pub struct Comparison {
    /// The peer's name (the `provider` of its rows).
    pub peer: String,
    pub medium: Medium,
    pub form: Form,
    pub size: usize,
    pub stat: Stat,
    /// `ns` (one way) or `MB/s`.
    pub unit: String,
    pub iters: usize,
    pub peer_command: String,
    pub uvia_command: String,
    /// (uvia, peer) per pair; `ratio` is uvia / peer.
    pub pairs: Vec<PairVal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uvia_median: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_median: Option<f64>,
    /// Median of the pair ratios (uvia / peer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// Why it was not measured, or how it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Serialize, Clone, Copy)]
pub struct PairVal {
    pub uvia: f64,
    pub peer: f64,
    pub ratio: f64,
}

/// A peer's entry: installed or not (with the reason), its version.
#[derive(Serialize, Clone)]
pub struct PeerInfo {
    pub name: String,
    pub medium: Medium,
    pub tool: String,
    pub package: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
}

/// A peer's figures in the shape of uvia's own rows (`provider` names the
/// peer); figures the tool does not report are null.
#[derive(Serialize, Clone)]
pub struct PeerRun {
    #[serde(flatten)]
    pub run: RunResult,
    pub version: String,
}

/// What `uvia peers` measured.
#[derive(Serialize, Clone)]
pub struct PeersResult {
    pub command: String,
    pub quick: bool,
    pub pairs: usize,
    pub peers: Vec<PeerInfo>,
    pub comparisons: Vec<Comparison>,
    /// The issue's comparisons, with targets.
    pub headline: Vec<Headline>,
    pub runs: Vec<PeerRun>,
    /// What the placement readings around every pair showed
    /// ([`crate::bench::placement_note`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
}

/// What to run: the peers (all, or those named), sizes.
pub struct Options {
    pub quick: bool,
    pub pairs: usize,
    pub only: Vec<String>,
}

/// The sizes measured: latency and bandwidth.
fn sizes(quick: bool) -> (Vec<usize>, Vec<usize>) {
    if quick {
        (vec![8], vec![64 << 10, 1 << 20])
    } else {
        (vec![8, 1 << 10], vec![4 << 10, 64 << 10, 1 << 20])
    }
}

/// Checks the names given to `--only`.
pub fn check_only(only: &[String]) -> Result<()> {
    let known: Vec<&str> = peers().iter().map(|p| p.name).collect();
    for o in only {
        if !known.contains(&o.as_str()) {
            bail!("no peer named {o:?}; the peers are: {}", known.join(", "));
        }
    }
    Ok(())
}

/// How many pairs the run will measure at most (for a progress bar).
pub fn planned(o: &Options) -> u64 {
    let (lat, bw) = sizes(o.quick);
    peers()
        .iter()
        .filter(|p| o.only.is_empty() || o.only.iter().any(|n| n == p.name))
        .map(|_| (lat.len() + bw.len()) as u64 * o.pairs as u64)
        .sum()
}

/// Runs every comparison.
pub fn run_all(pb: &ProgressBar, o: &Options, timeout: Duration) -> PeersResult {
    let (lat_sizes, bw_sizes) = sizes(o.quick);
    let mut infos = Vec::new();
    let mut comps = Vec::new();
    let mut measured = Vec::new();
    for p in peers()
        .iter()
        .filter(|p| o.only.is_empty() || o.only.iter().any(|n| n == p.name))
    {
        let missing = installed(p).err();
        infos.push(PeerInfo {
            name: p.name.into(),
            medium: p.medium,
            tool: p.program.into(),
            package: p.package.into(),
            version: missing.is_none().then(|| version(p)),
            missing: missing.clone(),
        });
        let mut plan: Vec<(Form, usize, Option<String>)> = lat_sizes
            .iter()
            .map(|&s| (Form::Latency, p.size_for(s), None))
            .collect();
        match p.bw_form() {
            Ok(f) => plan.extend(bw_sizes.iter().map(|&s| (f, s, None))),
            Err(why) => plan.extend(
                bw_sizes
                    .iter()
                    .map(|&s| (Form::PingpongBw, s, Some(why.to_string()))),
            ),
        }
        for (form, size, not_run) in plan {
            let stat = p.stat(form);
            let n = iters(form, p.medium, size, o.quick);
            let ua = uvia_args(p, form, size, n);
            let mut c = Comparison {
                peer: p.name.into(),
                medium: p.medium,
                form,
                size,
                stat,
                unit: if form == Form::Latency { "ns" } else { "MB/s" }.into(),
                iters: n,
                peer_command: peer_commands(p, form, size, n),
                uvia_command: match stat.runs() {
                    1 => format!("uvia {}", ua.join(" ")),
                    k => format!("uvia {} (run {k} times, the best kept)", ua.join(" ")),
                },
                pairs: Vec::new(),
                uvia_median: None,
                peer_median: None,
                ratio: None,
                error: None,
            };
            let skip = missing.clone().or(not_run).or_else(|| p.cannot(form, size));
            if let Some(why) = skip {
                c.error = Some(format!("not run: {why}"));
                pb.inc(o.pairs as u64);
                comps.push(c);
                continue;
            }
            let a: Vec<&str> = ua.iter().map(String::as_str).collect();
            let h = interleave(
                pb,
                &format!("{} {} {}", p.name, form_name(form), human(size)),
                "uvia / peer",
                &c.unit,
                "-",
                o.pairs,
                || {
                    best_of(stat.runs(), form, || {
                        crate::bench::measure(&a, timeout).map(|r| uvia_value(&r, form, stat))
                    })
                },
                || run_peer(p, form, size, n, timeout),
                |u, q| u / q,
                |_| true,
            );
            let done = h.pair_values();
            pb.inc((o.pairs - done.len()) as u64);
            c.pairs = done
                .iter()
                .map(|&(u, q)| PairVal {
                    uvia: u,
                    peer: q,
                    ratio: u / q,
                })
                .collect();
            if !c.pairs.is_empty() {
                c.uvia_median = Some(median(&c.pairs.iter().map(|x| x.uvia).collect::<Vec<_>>()));
                c.peer_median = Some(median(&c.pairs.iter().map(|x| x.peer).collect::<Vec<_>>()));
                c.ratio = h.ratio;
            }
            c.error = h.error.clone().map(|e| {
                e.replacen("contender:", "uvia:", 1)
                    .replacen("baseline:", "peer:", 1)
            });
            comps.push(c);
            measured.push(h);
        }
    }
    let headline = headlines(&comps);
    let runs = rows(&infos, &comps);
    PeersResult {
        command: "peers".into(),
        quick: o.quick,
        pairs: o.pairs,
        peers: infos,
        comparisons: comps,
        headline,
        runs,
        placement: crate::bench::placement_note(&measured),
    }
}

fn form_name(f: Form) -> &'static str {
    match f {
        Form::Latency => "latency",
        Form::Stream => "streamed bandwidth",
        Form::PingpongBw => "ping-pong bandwidth",
    }
}

/// Each peer's figures as uvia-shaped rows: one `pingpong` row (latency and
/// ping-pong bandwidth) and one `bw` row (streamed) per peer, one entry per
/// size it measured (the median of its pairs).
fn rows(infos: &[PeerInfo], comps: &[Comparison]) -> Vec<PeerRun> {
    let mut out = Vec::new();
    for info in infos.iter().filter(|i| i.missing.is_none()) {
        for kind in ["pingpong", "bw"] {
            let mut results: Vec<SizeResult> = Vec::new();
            for c in comps.iter().filter(|c| {
                c.peer == info.name
                    && c.peer_median.is_some()
                    && (c.form == Form::Stream) == (kind == "bw")
            }) {
                let v = c.peer_median.unwrap_or(f64::NAN);
                let (t, mbps) = match c.form {
                    Form::Latency => (v, c.size as f64 / v * 1e3),
                    _ => (c.size as f64 / v * 1e3, v),
                };
                let unknown = f64::NAN;
                let lat = Stats {
                    min: unknown,
                    p50: if c.stat == Stat::P50 { t } else { unknown },
                    p99: unknown,
                    mean: if c.stat == Stat::P50 { unknown } else { t },
                };
                match results.iter_mut().find(|r| r.size == c.size) {
                    Some(r) => {
                        if c.form != Form::Latency {
                            r.mbytes_per_s = mbps;
                        }
                    }
                    None => results.push(SizeResult {
                        size: c.size,
                        iters: c.iters,
                        lat_ns: lat,
                        mbytes_per_s: mbps,
                        msgs_per_s: if t > 0.0 { 1e9 / t } else { unknown },
                        cpu: CpuUse {
                            client: unknown,
                            server: unknown,
                        },
                    }),
                }
            }
            if results.is_empty() {
                continue;
            }
            results.sort_by_key(|r| r.size);
            out.push(PeerRun {
                run: RunResult {
                    command: kind.into(),
                    provider: info.name.clone(),
                    mode: "polling".into(),
                    results,
                },
                version: info.version.clone().unwrap_or_default(),
            });
        }
    }
    out
}

/// The issue's comparisons, from the pairs already measured.
fn headlines(comps: &[Comparison]) -> Vec<Headline> {
    let find = |peer: &str, form: Form, size: usize| {
        comps
            .iter()
            .find(|c| c.peer == peer && c.form == form && c.size == size)
    };
    let best = |medium: Medium, lat: bool, size: usize| -> Option<&Comparison> {
        let mut v: Vec<&Comparison> = comps
            .iter()
            .filter(|c| {
                c.medium == medium
                    && (c.form == Form::Latency) == lat
                    && c.size == size
                    && c.peer_median.is_some()
            })
            .collect();
        v.sort_by(|a, b| {
            let (x, y) = (a.peer_median.unwrap_or(0.0), b.peer_median.unwrap_or(0.0));
            if lat {
                x.total_cmp(&y)
            } else {
                y.total_cmp(&x)
            }
        });
        v.first().copied()
    };
    let from =
        |name: String, c: Option<&Comparison>, unit: &str, target: &str, pass: fn(f64) -> bool| {
            let ratio_is = "uvia / peer";
            match c {
                Some(c) if c.error.is_none() && !c.pairs.is_empty() => Headline::from_pairs(
                    &name,
                    ratio_is,
                    unit,
                    target,
                    Ok(c.pairs.iter().map(|p| (p.uvia, p.peer)).collect()),
                    |u, q| u / q,
                    pass,
                ),
                Some(c) => Headline::skipped(
                    &name,
                    ratio_is,
                    unit,
                    target,
                    c.error.clone().unwrap_or_else(|| "no pairs".into()),
                ),
                // (The bench's verdict reads "skipped" from the prefix.)
                None => Headline::skipped(
                    &name,
                    ratio_is,
                    unit,
                    target,
                    "skipped: its peer was not measured (left out by --only, or not installed)"
                        .into(),
                ),
            }
        };
    let mut hs = Vec::new();
    let fastest = best(Medium::Shm, true, 8);
    let uvia_form = |c: &Comparison| {
        if c.uvia_command.contains("--rdma-write") {
            "uvia's one-sided RDMA write"
        } else {
            "uvia's send"
        }
    };
    hs.push(from(
        format!(
            "peers: shm 8 B one-way, uvia vs the fastest peer on shared memory ({}; {})",
            fastest.map(|c| c.peer.as_str()).unwrap_or("none measured"),
            fastest.map(uvia_form).unwrap_or("-")
        ),
        fastest,
        "ns",
        "<= 1.0x",
        |r| r <= 1.0,
    ));
    hs.push(from(
        "peers: shm 8 B one-way, uvia vs Open MPI's shared-memory path (NetPIPE's best of three means)".into(),
        find("openmpi-vader", Form::Latency, 8),
        "ns",
        "<= 0.7x",
        |r| r <= 0.7,
    ));
    let top = best(Medium::Shm, false, 1 << 20);
    hs.push(from(
        format!(
            "peers: shm 1 MiB bandwidth, uvia vs the best peer ({}, {})",
            top.map(|c| c.peer.as_str()).unwrap_or("none measured"),
            top.map(|c| form_name(c.form)).unwrap_or("-")
        ),
        top,
        "MB/s",
        ">= 1.5x",
        |r| r >= 1.5,
    ));
    hs.push(from(
        "peers: udp 8 B one-way at reliable delivery, uvia vs libfabric udp;ofi_rxd (means)".into(),
        find("libfabric-udp;ofi_rxd", Form::Latency, 8),
        "ns",
        "<= 0.5x",
        |r| r <= 0.5,
    ));
    hs.push(from(
        "peers: udp 1 MiB ping-pong bandwidth, uvia vs libfabric udp;ofi_rxd".into(),
        find("libfabric-udp;ofi_rxd", Form::PingpongBw, 1 << 20),
        "MB/s",
        ">= 2x",
        |r| r >= 2.0,
    ));
    hs
}

// ---- the report ------------------------------------------------------------

fn fmt_val(v: Option<f64>, unit: &str) -> String {
    match v {
        Some(v) if unit == "ns" => fmt_ns(v),
        Some(v) => format!("{v:.0} MB/s"),
        None => "-".into(),
    }
}

/// Whether uvia wins a comparison (lower time, higher bandwidth).
fn uvia_wins(c: &Comparison) -> Option<bool> {
    c.ratio.map(|r| {
        if c.form == Form::Latency {
            r < 1.0
        } else {
            r > 1.0
        }
    })
}

/// The peers table: one row per comparison.
pub fn table_rows(res: &PeersResult) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let head = vec![
        "peer",
        "medium",
        "form",
        "size",
        "stat",
        "uvia (median)",
        "peer (median)",
        "uvia / peer (median of pairs)",
        "pair range",
        "uvia wins",
    ];
    let rows = res
        .comparisons
        .iter()
        .map(|c| {
            let range = if c.pairs.is_empty() {
                "-".into()
            } else {
                let rs: Vec<f64> = c.pairs.iter().map(|p| p.ratio).collect();
                let lo = rs.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = rs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                format!("{lo:.2}-{hi:.2}")
            };
            let (ratio, wins) = match (&c.error, c.ratio) {
                (Some(e), None) => (e.clone(), "-".into()),
                (_, Some(r)) => (
                    format!("{r:.2}x"),
                    match uvia_wins(c) {
                        Some(true) => "yes".into(),
                        Some(false) => "NO".into(),
                        None => "-".into(),
                    },
                ),
                (None, None) => ("-".into(), "-".into()),
            };
            vec![
                c.peer.clone(),
                format!("{:?}", c.medium).to_lowercase(),
                form_name(c.form).into(),
                human(c.size),
                if c.form == Form::Latency {
                    c.stat.name().into()
                } else {
                    // Bandwidth: bytes over the run's time.
                    match c.stat {
                        Stat::BestMean => "bytes/time, best of 3".into(),
                        _ => "bytes/time".into(),
                    }
                },
                fmt_val(c.uvia_median, &c.unit),
                fmt_val(c.peer_median, &c.unit),
                ratio,
                range,
                wins,
            ]
        })
        .collect();
    (head, rows)
}

/// How the section was measured, for the report.
pub const ABOUT: &str = "Each peer is measured by its own tool, its two processes pinned to cores 0 and 1 (NetPIPE: `mpirun --bind-to core`), interleaved with the matching uvia run (shm for the shared-memory peers, udp at reliable delivery for the loopback ones): uvia, peer, uvia, peer, ... The ratio is uvia / peer per pair and the table gives the median of the pair ratios and their range; below 1 uvia is faster for latency, above 1 uvia moves more for bandwidth. Each pair compares the same statistic: the one-way median where the tool reports one (ucx_perftest, sockperf), else the mean (fi_pingpong; NetPIPE reports the lowest of three trials' means, so its uvia pair is the lowest of three runs' means, for latency and bandwidth alike); streamed bandwidth (ucx_perftest's bandwidth tests) against `uvia bw`, ping-pong bandwidth (size / one-way mean) against `uvia pingpong`. MB/s are 10^6 B/s (ucx_perftest's MiB/s are converted). sockperf cannot send fewer than 14 B, so its latency (and its uvia pair) is at 14 B.";

/// The section as text and markdown.
pub fn render(res: &PeersResult) -> (String, String) {
    let mut text = String::new();
    let mut md = String::new();
    let (head, rows) = table_rows(res);
    let (hh, hrows) = crate::bench::headline_rows(&res.headline);
    push(&mut text, "Peers: the issue's comparisons");
    text += &text_table(
        &hh[..5],
        &hrows.iter().map(|r| r[..5].to_vec()).collect::<Vec<_>>(),
    );
    if let Some(note) = &res.placement {
        push(&mut text, note);
    }
    push(&mut text, "");
    push(
        &mut text,
        "Peers: every comparison (uvia / peer; median of interleaved pairs)",
    );
    text += &text_table(&head, &rows);
    let peer_rows: Vec<Vec<String>> = res
        .peers
        .iter()
        .map(|p| {
            vec![
                p.name.clone(),
                p.tool.clone(),
                p.version.clone().unwrap_or_else(|| "-".into()),
                p.missing
                    .clone()
                    .map(|m| format!("MISSING: {m}"))
                    .unwrap_or_else(|| "installed".into()),
            ]
        })
        .collect();
    push(&mut text, "");
    text += &text_table(&["peer", "tool", "version", "status"], &peer_rows);
    let losses: Vec<String> = res
        .comparisons
        .iter()
        .filter(|c| uvia_wins(c) == Some(false))
        .map(|c| {
            format!(
                "{} {} {}: uvia {} vs {} (x{:.2})",
                c.peer,
                form_name(c.form),
                human(c.size),
                fmt_val(c.uvia_median, &c.unit),
                fmt_val(c.peer_median, &c.unit),
                c.ratio.unwrap_or(f64::NAN)
            )
        })
        .collect();
    let failed: Vec<String> = res
        .comparisons
        .iter()
        .filter_map(|c| {
            c.error
                .as_ref()
                .map(|e| format!("{} {} {}: {e}", c.peer, form_name(c.form), human(c.size)))
        })
        .collect();

    push(
        &mut md,
        "## Peers: uvia against UCX, libfabric, Open MPI and sockperf",
    );
    push(&mut md, "");
    push(&mut md, ABOUT);
    push(&mut md, "");
    md += &md_table(&hh, &hrows);
    push(&mut md, "");
    if let Some(note) = &res.placement {
        push(&mut md, note);
        push(&mut md, "");
    }
    md += &md_table(&head, &rows);
    push(&mut md, "");
    push(
        &mut md,
        "![peers: one-way latency by size](peers-latency.svg)",
    );
    push(&mut md, "");
    push(&mut md, "![peers: bandwidth by size](peers-bandwidth.svg)");
    push(&mut md, "");
    push(&mut md, "### The peers");
    push(&mut md, "");
    md += &md_table(&["peer", "tool", "version", "status"], &peer_rows);
    push(&mut md, "");
    push(&mut md, "### Where uvia loses");
    push(&mut md, "");
    if losses.is_empty() {
        push(&mut md, "Nowhere in this run.");
        push(&mut text, "\nuvia loses: nowhere in this run");
    } else {
        push(&mut text, "\nuvia loses:");
        for l in &losses {
            push(&mut md, format!("- {l}"));
            push(&mut text, format!("  {l}"));
        }
    }
    push(&mut md, "");
    if !failed.is_empty() {
        push(&mut md, "### Not measured or failed");
        push(&mut md, "");
        push(&mut text, "\nnot measured or failed:");
        for f in &failed {
            push(&mut md, format!("- {f}"));
            push(&mut text, format!("  {f}"));
        }
        push(&mut md, "");
    }
    push(&mut md, "### Commands");
    push(&mut md, "");
    push(
        &mut md,
        "One line per comparison: the peer's, then the uvia run it is paired with.",
    );
    push(&mut md, "");
    push(&mut md, "```");
    for c in &res.comparisons {
        push(&mut md, &c.peer_command);
        push(&mut md, format!("  paired with: {}", c.uvia_command));
    }
    push(&mut md, "```");
    push(&mut md, "");
    (text, md)
}

/// The two plots: one-way latency and bandwidth by size, uvia (the median
/// over its pairs at each size) and each peer.
pub fn plots(res: &PeersResult, dir: &Path) -> Result<()> {
    for (file, title, y, lat) in [
        (
            "peers-latency.svg",
            "uvia and its peers: one-way latency by size",
            "one-way latency (us)",
            true,
        ),
        (
            "peers-bandwidth.svg",
            "uvia and its peers: bandwidth by size",
            "bandwidth (MB/s)",
            false,
        ),
    ] {
        let scale = if lat { 1e-3 } else { 1.0 };
        let mut series: Vec<Series> = Vec::new();
        let chosen: Vec<&Comparison> = res
            .comparisons
            .iter()
            .filter(|c| (c.form == Form::Latency) == lat && c.peer_median.is_some())
            .collect();
        // uvia's lines: one per medium and form, the median over its pairs.
        for medium in [Medium::Shm, Medium::Loopback] {
            for form in [Form::Latency, Form::Stream, Form::PingpongBw] {
                let mut pts: Vec<(f64, f64)> = Vec::new();
                let mut sizes: Vec<usize> = chosen
                    .iter()
                    .filter(|c| c.medium == medium && c.form == form)
                    .map(|c| c.size)
                    .collect();
                sizes.sort();
                sizes.dedup();
                for s in sizes {
                    let v: Vec<f64> = chosen
                        .iter()
                        .filter(|c| c.medium == medium && c.form == form && c.size == s)
                        .flat_map(|c| c.pairs.iter().map(|p| p.uvia))
                        .collect();
                    pts.push((s as f64, median(&v) * scale));
                }
                if !pts.is_empty() {
                    series.push(Series {
                        label: format!(
                            "uvia {} ({})",
                            if medium == Medium::Shm { "shm" } else { "udp" },
                            form_name(form)
                        ),
                        points: pts,
                        dashed: false,
                    });
                }
            }
        }
        for p in peers() {
            for form in [Form::Latency, Form::Stream, Form::PingpongBw] {
                let pts: Vec<(f64, f64)> = chosen
                    .iter()
                    .filter(|c| c.peer == p.name && c.form == form)
                    .map(|c| (c.size as f64, c.peer_median.unwrap_or(f64::NAN) * scale))
                    .collect();
                if !pts.is_empty() {
                    series.push(Series {
                        label: if lat {
                            p.name.to_string()
                        } else {
                            format!("{} ({})", p.name, form_name(form))
                        },
                        points: pts,
                        dashed: true,
                    });
                }
            }
        }
        if series.is_empty() {
            continue;
        }
        crate::report::plot(&dir.join(file), title, y, &series)?;
    }
    Ok(())
}

/// `uvia peers`.
pub fn run(o: &Options, json: Option<&Path>, out: Option<&Path>) -> Result<()> {
    if o.pairs == 0 {
        bail!("--pairs must be at least 1");
    }
    check_only(&o.only)?;
    if let Some(d) = out {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let pb = ProgressBar::new(planned(o));
    pb.set_style(crate::bench::progress_style());
    pb.enable_steady_tick(Duration::from_millis(200));
    let timeout = Duration::from_secs(if o.quick { 60 } else { 300 });
    let res = run_all(&pb, o, timeout);
    pb.finish_and_clear();
    let (text, md) = render(&res);
    print!("{text}");
    if let Some(f) = json {
        let j = serde_json::to_string_pretty(&res)? + "\n";
        std::fs::write(f, j).with_context(|| format!("writing {}", f.display()))?;
    }
    if let Some(d) = out {
        if let Err(e) = plots(&res, d) {
            println!("plots: {e:#}");
        }
        std::fs::write(d.join("peers.md"), format!("# uvia peers\n\n{md}"))
            .with_context(|| format!("writing {}", d.join("peers.md").display()))?;
        println!("report: {}", d.join("peers.md").display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peer of that name.
    fn peer(name: &str) -> PeerDef {
        peers().into_iter().find(|p| p.name == name).unwrap()
    }

    fn sample(name: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/peers")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn parses_ucx_perftest_latency() {
        let r = parse_ucx(&sample("ucx-am_lat-8.txt")).unwrap();
        assert_eq!(r.p50_us, 0.125);
        assert_eq!(r.avg_us, 0.133);
        let t = parse_ucx(&sample("ucx-tag_lat-8.txt")).unwrap();
        assert_eq!(t.p50_us, 0.196);
    }

    #[test]
    fn parses_ucx_perftest_bandwidth_in_decimal_megabytes() {
        let r = parse_ucx(&sample("ucx-put_bw-1m.txt")).unwrap();
        // 10116.51 MiB/s printed.
        assert!((r.mbytes_per_s - 10116.51 * 1.048576).abs() < 1e-6);
    }

    #[test]
    fn ucx_perftest_error_is_quoted() {
        let e = parse_ucx(&sample("ucx-am_bw-64k-unsupported.txt"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("larger than max supported"), "{e}");
        assert!(parse_ucx("nothing here").is_err());
    }

    #[test]
    fn parses_fi_pingpong_at_one_mebibyte() {
        let r = crate::fabric::parse(&sample("fi_pingpong-rxd-1m.txt"), 1 << 20).unwrap();
        // 1 MiB at 60.98 MB/s; the line prints 17195.09 us.
        assert!((r.mean_ns - 17_195_409.0).abs() < 1.0, "{}", r.mean_ns);
    }

    /// NetPIPE's pair is the best of three runs on uvia's side: the least
    /// time, or the most bytes; a failed run fails the value.
    #[test]
    fn netpipe_pairs_take_the_best_of_three_runs() {
        let np = peer("openmpi-vader");
        assert_eq!(np.stat(Form::Latency), Stat::BestMean);
        assert_eq!(np.stat(Form::PingpongBw), Stat::BestMean);
        let fi = peer("libfabric-shm");
        assert_eq!(fi.stat(Form::Latency).runs(), 1);
        let uct = peer("ucx-uct-put");
        assert_eq!(uct.stat(Form::Latency), Stat::P50);

        let runs = |vals: Vec<f64>| {
            let mut it = vals.into_iter();
            move || it.next().ok_or_else(|| anyhow!("ran too often"))
        };
        let lat = best_of(BEST_OF, Form::Latency, runs(vec![130.0, 95.0, 110.0])).unwrap();
        assert_eq!(lat, 95.0);
        let bw = best_of(BEST_OF, Form::PingpongBw, runs(vec![900.0, 1200.0, 1000.0])).unwrap();
        assert_eq!(bw, 1200.0);
        assert_eq!(best_of(1, Form::Latency, runs(vec![130.0])).unwrap(), 130.0);
        let mut n = 0;
        let failing = best_of(BEST_OF, Form::Latency, || {
            n += 1;
            if n == 2 {
                Err(anyhow!("broken"))
            } else {
                Ok(1.0)
            }
        });
        assert!(failing.is_err());
        assert_eq!(n, 2, "a failed run ends the value");
    }

    #[test]
    fn parses_netpipe() {
        let r = parse_netpipe(&sample("netpipe-8.txt")).unwrap();
        assert_eq!(
            r,
            NetPipe {
                size: 8,
                one_way_us: 0.51
            }
        );
        let r = parse_netpipe(&sample("netpipe-1m.txt")).unwrap();
        assert_eq!(r.size, 1 << 20);
        assert_eq!(r.one_way_us, 922.28);
        assert!(parse_netpipe("Using no perturbations\n").is_err());
    }

    #[test]
    fn parses_sockperf_through_its_colours() {
        let r = parse_sockperf(&sample("sockperf-pp-14.txt")).unwrap();
        assert_eq!(r.p50_us, 19.671);
        assert_eq!(r.avg_us, 55.338);
        assert_eq!(r.observations, 4983);
        assert!(parse_sockperf("sockperf: Test ended\n").is_err());
    }

    #[test]
    fn strips_colour_sequences() {
        assert_eq!(strip_ansi("a\u{1b}[2;35mb\u{1b}[0mc"), "abc");
    }

    #[test]
    fn unknown_peer_is_named_with_the_list() {
        let e = check_only(&["ucx-nope".into()]).unwrap_err().to_string();
        assert!(e.contains("ucx-nope") && e.contains("ucx-uct-am"), "{e}");
        assert!(check_only(&["sockperf-udp".into()]).is_ok());
    }

    #[test]
    fn peers_that_cannot_do_a_size_say_why() {
        let am = peer("ucx-uct-am");
        assert!(am.cannot(Form::Stream, 64 << 10).is_some());
        assert!(am.cannot(Form::Stream, 4 << 10).is_none());
        let sp = peer("sockperf-udp");
        assert!(sp.bw_form().is_err());
        assert_eq!(sp.size_for(8), SOCKPERF_MIN);
    }

    fn comparison(peer: &str, form: Form, size: usize, stat: Stat, v: f64, u: f64) -> Comparison {
        Comparison {
            peer: peer.into(),
            medium: Medium::Shm,
            form,
            size,
            stat,
            unit: if form == Form::Latency { "ns" } else { "MB/s" }.into(),
            iters: 1,
            peer_command: String::new(),
            uvia_command: String::new(),
            pairs: vec![PairVal {
                uvia: u,
                peer: v,
                ratio: u / v,
            }],
            uvia_median: Some(u),
            peer_median: Some(v),
            ratio: Some(u / v),
            error: None,
        }
    }

    #[test]
    fn peer_rows_have_uvias_shape_with_unknown_figures_null() {
        let info = PeerInfo {
            name: "ucx-ucp-tag".into(),
            medium: Medium::Shm,
            tool: "ucx_perftest".into(),
            package: "ucx-utils".into(),
            version: Some("ucx-utils 1.13.1-1".into()),
            missing: None,
        };
        let comps = [
            comparison("ucx-ucp-tag", Form::Latency, 8, Stat::P50, 200.0, 100.0),
            comparison(
                "ucx-ucp-tag",
                Form::Stream,
                1 << 20,
                Stat::Mean,
                5000.0,
                6000.0,
            ),
        ];
        let rs = rows(&[info], &comps);
        assert_eq!(rs.len(), 2);
        let v = serde_json::to_value(&rs).unwrap();
        assert_eq!(v[0]["provider"], "ucx-ucp-tag");
        assert_eq!(v[0]["command"], "pingpong");
        assert_eq!(v[0]["version"], "ucx-utils 1.13.1-1");
        assert_eq!(v[0]["results"][0]["lat_ns"]["p50"], 200.0);
        // The tool gives no mean or p99 here: null, not a made-up 0.
        assert!(v[0]["results"][0]["lat_ns"]["mean"].is_null());
        assert!(v[0]["results"][0]["lat_ns"]["p99"].is_null());
        assert_eq!(v[1]["command"], "bw");
        assert_eq!(v[1]["results"][0]["mbytes_per_s"], 5000.0);
        assert_eq!(v[1]["results"][0]["size"], 1 << 20);
    }

    #[test]
    fn headline_takes_the_fastest_shared_memory_peer() {
        let c = |peer: &str, v: f64, u: f64| comparison(peer, Form::Latency, 8, Stat::P50, v, u);
        let hs = headlines(&[
            c("ucx-ucp-tag", 190.0, 150.0),
            c("ucx-uct-put", 80.0, 100.0),
        ]);
        assert!(hs[0].name.contains("ucx-uct-put"), "{}", hs[0].name);
        assert_eq!(hs[0].ratio, Some(1.25));
        assert_eq!(hs[0].pass, Some(false));
        // Open MPI not measured: listed with the reason, as skipped (a
        // "skipped:" reason), not as a failure.
        let why = hs[1].error.as_deref().unwrap_or("");
        assert!(why.starts_with("skipped:"), "{why}");
    }
}
