//! Running the peers' tools and uvia's matching runs, in interleaved
//! pairs: the measurements, as they come.

use super::analyse::{form_name, headlines, rows};
use super::defs::{installed, peers, version, Form, Medium, PeerDef, Stat, Tool};
use super::parse::{parse_netpipe, parse_sockperf, parse_ucx, strip_ansi};
use super::{sizes, Bare, Comparison, Options, PairVal, PeerInfo, PeersResult};
use crate::bench::interleave;
use crate::run::SizeResult;
use crate::size::human;
use crate::stats::median;
use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

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

/// How a peer's tool is started.
enum Launch {
    /// A server on core 0 and a client on core 1 (`server_ends`: the
    /// server ends by itself once the client is done).
    Pair {
        server: Vec<String>,
        client: Vec<String>,
        server_ends: bool,
    },
    /// One command that starts both sides itself (`mpirun`).
    Launcher(Vec<String>),
}

/// One peer measurement's command lines: built once, both run and shown
/// in the report, so what the report says is what ran.
struct Invocation {
    prog: &'static str,
    env: Vec<(&'static str, String)>,
    launch: Launch,
}

impl Invocation {
    /// The command lines as one would type them.
    fn shown(&self) -> String {
        match &self.launch {
            Launch::Pair { server, client, .. } => format!(
                "{} & {}",
                shown(&self.env, Some(0), self.prog, server),
                shown(&self.env, Some(1), self.prog, client)
            ),
            Launch::Launcher(args) => shown(&self.env, None, self.prog, args),
        }
    }

    /// Runs it in `dir`: the output to parse (the client's stdout, or a
    /// launcher's stdout and stderr).
    fn run(&self, dir: &Path, timeout: Duration) -> Result<String> {
        match &self.launch {
            Launch::Pair {
                server,
                client,
                server_ends,
            } => client_server(self.prog, server, client, &self.env, *server_ends, timeout),
            Launch::Launcher(args) => {
                let mut c = Command::new(self.prog);
                c.args(args)
                    .current_dir(dir)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                for (k, v) in &self.env {
                    c.env(k, v);
                }
                let child = c
                    .spawn()
                    .with_context(|| format!("starting {}", self.prog))?;
                let (ok, out, err) = crate::fabric::finish(child, Instant::now() + timeout);
                if !ok {
                    bail!("{}: {}", self.prog, why(&out, &err));
                }
                Ok(format!("{out}\n{err}"))
            }
        }
    }
}

/// The command lines of `p`'s tool for one measurement: `port` the
/// server's (a placeholder in the report), `out_file` where NetPIPE writes
/// its table.
fn invocation(
    p: &PeerDef,
    form: Form,
    size: usize,
    n: usize,
    port: &str,
    out_file: &Path,
) -> Invocation {
    let strings = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let pair = |server: Vec<String>, client: Vec<String>, server_ends: bool| Launch::Pair {
        server,
        client,
        server_ends,
    };
    let (size_s, n_s) = (size.to_string(), n.to_string());
    match p.tool {
        Tool::Uct { lat, bw, .. } => {
            let test = if form == Form::Latency { lat } else { bw };
            let transport = ["-d", "memory", "-x", "posix", "-D", uct_layout(form, size)];
            ucx_perftest(test, &transport, Vec::new(), size, n, port)
        }
        Tool::UcpTag => {
            let test = if form == Form::Latency {
                "tag_lat"
            } else {
                "tag_bw"
            };
            ucx_perftest(
                test,
                &[],
                vec![("UCX_TLS", UCP_TLS.to_string())],
                size,
                n,
                port,
            )
        }
        Tool::Fi { provider, ep, .. } => {
            let args = strings(&["-p", provider, "-e", ep, "-I", &n_s, "-S", &size_s]);
            let mut server = args.clone();
            server.extend(strings(&["-B", port]));
            let mut client = args;
            client.extend(strings(&["-P", port, "127.0.0.1"]));
            Invocation {
                prog: "fi_pingpong",
                env: Vec::new(),
                launch: pair(server, client, true),
            }
        }
        Tool::NetPipe => Invocation {
            prog: "mpirun",
            env: Vec::new(),
            launch: Launch::Launcher(netpipe_args(size, n, out_file)),
        },
        Tool::Sockperf => Invocation {
            prog: "sockperf",
            env: Vec::new(),
            launch: pair(
                strings(&["sr", SOCKPERF_POLLS, "-i", "127.0.0.1", "-p", port]),
                sockperf_client(size, n, port),
                false,
            ),
        },
    }
}

/// One measurement by the peer's own tool: its figure (ns one way, or
/// MB/s).
fn run_peer(p: &PeerDef, form: Form, size: usize, n: usize, timeout: Duration) -> Result<f64> {
    // NetPIPE writes a table into the folder it runs in: one of its own.
    let dir = std::env::temp_dir().join(format!("uvia-peers-np-{}", std::process::id()));
    if matches!(p.tool, Tool::NetPipe) {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let inv = invocation(
        p,
        form,
        size,
        n,
        &next_port().to_string(),
        &dir.join("np.out"),
    );
    let out = inv.run(&dir, timeout);
    if matches!(p.tool, Tool::NetPipe) {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let out = out?;
    match p.tool {
        Tool::Uct { .. } | Tool::UcpTag => {
            let r = parse_ucx(&out)?;
            Ok(if form == Form::Latency {
                r.p50_us * 1e3
            } else {
                r.mbytes_per_s
            })
        }
        Tool::Fi { .. } => {
            let r = crate::fabric::parse(&out, size)?;
            Ok(if form == Form::Latency {
                r.mean_ns
            } else {
                // fi_pingpong counts both directions over the whole time: size / one-way.
                size as f64 / r.mean_ns * 1e3
            })
        }
        Tool::NetPipe => {
            // NetPIPE prints its progress lines on stderr, which the output holds.
            let r = parse_netpipe(&out)?;
            if r.size != size {
                bail!("NetPIPE measured {} B, not {size} B", r.size);
            }
            Ok(if form == Form::Latency {
                r.one_way_us * 1e3
            } else {
                size as f64 / r.one_way_us
            })
        }
        Tool::Sockperf => Ok(parse_sockperf(&out)?.p50_us * 1e3),
    }
}

/// UCT's data layout: short messages go inline in the transport's
/// descriptor, longer ones are copied into its buffers (what a user of UCT
/// picks).
fn uct_layout(form: Form, size: usize) -> &'static str {
    if form == Form::Latency && size <= 64 {
        "short"
    } else {
        "bcopy"
    }
}

/// A `ucx_perftest` pair for `test` (its transport arguments and
/// environment given), with a warm-up of a tenth of the iterations.
fn ucx_perftest(
    test: &str,
    transport: &[&str],
    env: Vec<(&'static str, String)>,
    size: usize,
    n: usize,
    port: &str,
) -> Invocation {
    let warm = (n / 10).clamp(10, 10_000);
    let mut args: Vec<String> = vec!["-t".into(), test.into()];
    args.extend(transport.iter().map(|x| x.to_string()));
    for (flag, v) in [("-n", n), ("-w", warm), ("-s", size)] {
        args.extend([flag.to_string(), v.to_string()]);
    }
    args.extend(["-p".to_string(), port.to_string()]);
    let mut client = vec!["localhost".to_string()];
    client.extend(args.iter().cloned());
    Invocation {
        prog: "ucx_perftest",
        env,
        launch: Launch::Pair {
            server: args,
            client,
            server_ends: true,
        },
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

/// sockperf's non-blocking sockets: each side polls its socket, as uvia's
/// ping-pong polls its VI. By default both sides sleep in `epoll_wait`,
/// and every message pays a wake-up (40 us one way on a virtual machine,
/// against 4 us polling).
const SOCKPERF_POLLS: &str = "--nonblocked";

/// sockperf runs for a time, not a count: about `n` round trips at the
/// usual loopback rate, at least a second.
fn sockperf_client(size: usize, n: usize, port: &str) -> Vec<String> {
    let secs = (n / 20_000).max(1);
    [
        "pp",
        SOCKPERF_POLLS,
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
    invocation(p, form, size, n, "PORT", Path::new("np.out")).shown()
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

/// Round trips of one reading of the bare exchange (some 10 ms).
const BARE_ROUNDS: usize = 100_000;

/// The bare exchange's one-way p50 now ([`Bare`]); `None` where the probe cannot
/// run (one core, or no shared memory).
fn bare_now() -> Option<f64> {
    if std::thread::available_parallelism().map_or(true, |n| n.get() < 2) {
        return None;
    }
    crate::limit::cacheline(BARE_ROUNDS, crate::limit::Lines::EachWayPaced)
        .ok()
        .filter(|v| !v.is_empty())
        .map(|v| median(&v))
}

/// Runs every comparison.
pub fn run_all(pb: &ProgressBar, o: &Options, timeout: Duration) -> PeersResult {
    let (lat_sizes, bw_sizes) = sizes(o.quick);
    let mut infos = Vec::new();
    let mut comps = Vec::new();
    let mut measured = Vec::new();
    let selected = |p: &&PeerDef| o.only.is_empty() || o.only.iter().any(|n| n == p.name);
    let shm = peers()
        .iter()
        .filter(selected)
        .any(|p| p.medium == Medium::Shm && installed(p).is_ok());
    let bare_start = if shm { bare_now() } else { None };
    for p in peers().iter().filter(selected) {
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
                    .map(|v| p.at_printed_step(form, v))
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
    let bare = bare_start.and_then(|start_ns| bare_now().map(|end_ns| Bare { start_ns, end_ns }));
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
        bare,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::defs::{peer, BEST_OF};
    use anyhow::anyhow;

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

    /// The report shows the command lines that ran: the same arguments,
    /// the server's port a placeholder.
    #[test]
    fn the_report_shows_the_command_lines_that_run() {
        let out = Path::new("np.out");
        let uct = invocation(&peer("ucx-uct-put"), Form::Latency, 8, 1000, "4711", out);
        let Launch::Pair { server, client, .. } = &uct.launch else {
            panic!("UCT runs as a server and a client");
        };
        assert_eq!(client[0], "localhost");
        assert_eq!(&client[1..], &server[..]);
        let shown = invocation(&peer("ucx-uct-put"), Form::Latency, 8, 1000, "PORT", out).shown();
        assert_eq!(
            shown,
            "taskset -c 0 ucx_perftest -t put_lat -d memory -x posix -D short -n 1000 -w 100 \
             -s 8 -p PORT & taskset -c 1 ucx_perftest localhost -t put_lat -d memory -x posix \
             -D short -n 1000 -w 100 -s 8 -p PORT"
        );
        assert_eq!(shown.replace("PORT", "4711"), uct.shown());

        let tag = invocation(&peer("ucx-ucp-tag"), Form::Stream, 65536, 50, "PORT", out);
        assert!(tag
            .shown()
            .starts_with("UCX_TLS=sm,self taskset -c 0 ucx_perftest -t tag_bw"));

        let rxd = invocation(
            &peer("libfabric-udp;ofi_rxd"),
            Form::Latency,
            8,
            20,
            "PORT",
            out,
        );
        assert_eq!(
            rxd.shown(),
            "taskset -c 0 fi_pingpong -p 'udp;ofi_rxd' -e rdm -I 20 -S 8 -B PORT & \
             taskset -c 1 fi_pingpong -p 'udp;ofi_rxd' -e rdm -I 20 -S 8 -P PORT 127.0.0.1"
        );

        let sp = invocation(
            &peer("sockperf-udp"),
            Form::Latency,
            14,
            40_000,
            "PORT",
            out,
        );
        assert!(matches!(
            sp.launch,
            Launch::Pair {
                server_ends: false,
                ..
            }
        ));
        assert_eq!(
            sp.shown(),
            "taskset -c 0 sockperf sr --nonblocked -i 127.0.0.1 -p PORT & \
             taskset -c 1 sockperf pp --nonblocked -i 127.0.0.1 -p PORT -m 14 -t 2"
        );

        let np = invocation(&peer("openmpi-vader"), Form::Latency, 8, 100, "PORT", out).shown();
        assert!(np.starts_with("mpirun --allow-run-as-root -np 2"), "{np}");
        assert!(np.ends_with("-l 8 -u 8 -n 100 -o np.out"), "{np}");
    }
}
