//! `uvia`: the benchmark tool of the uvia project.

/// `print!` to standard output for what the user reads, except that a
/// reader who went away (`uvia ... | head`) is let go: the rest is not
/// written and the run ends as it would have, cleaning up (test hosts,
/// servers), where `print!` panics. SIGPIPE stays ignored: the tool also
/// writes to sockets whose peer may die, and wants an error there.
macro_rules! out {
    ($($t:tt)*) => { $crate::write_out(format_args!($($t)*)) };
}

/// [`out!`] with a newline.
macro_rules! outln {
    () => { out!("\n") };
    ($($t:tt)*) => { out!("{}\n", format_args!($($t)*)) };
}

mod anatomy;
mod bench;
mod clock;
mod cpu;
mod endpoint;
mod fabric;
#[path = "endpoint/kernel_tcp.rs"]
mod kernel_tcp;
#[path = "endpoint/kernel_udp.rs"]
mod kernel_udp;
mod limit;
mod mpi;
mod peers;
mod pin;
mod placement;
mod report;
mod run;
mod scale;
mod size;
#[path = "endpoint/sys.rs"]
mod sock;
mod stats;
mod torture;
mod tracefile;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use endpoint::Mode;
use run::{Kind, Level, Plan, Provider};
use std::path::PathBuf;
use std::time::Duration;

/// uvia benchmark tool: physical limits of this host, one-way latency and
/// bandwidth of uvia's providers (shm, udp) side by side with kernel UDP and TCP.
///
/// Every measurement runs two processes: this one (the client, pinned to core
/// 0) and a server it starts from its own binary (pinned to core 1). Times are
/// taken with the CPU's time stamp counter; one-way latency is half a round trip.
#[derive(Parser)]
#[command(name = "uvia", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Physical limits of this host: cache-line and futex ping-pong between
    /// two processes on two cores, memcpy bandwidth, cross-core copy bandwidth.
    Limit(LimitArgs),
    /// One-way latency by message size: round trips of one message each way.
    Pingpong(RunArgs),
    /// Bandwidth and message rate by size: back-to-back messages one way,
    /// one small ack per batch.
    Bw(BwArgs),
    /// The main job: limits, then shm, udp, kernel UDP (blocking and
    /// busy-poll) and kernel TCP ping-pong and bandwidth side by side, with
    /// headline ratios measured in interleaved rounds (xdp against kernel UDP
    /// between two test hosts when root), the peers (UCX, libfabric, Open
    /// MPI, sockperf; see `uvia peers`) when installed or with --peers,
    /// and a report folder with plots.
    Bench(BenchArgs),
    /// The libfabric provider under libfabric's own ping-pong
    /// (fi_pingpong, from libfabric-bin): uvia on udp against libfabric's
    /// tcp provider, uvia's connected and reliable-datagram endpoints on
    /// shm against libfabric's shm provider, and the provider against uvia's own pingpong (8 B, 1 MiB)
    /// and, streaming 1 MiB messages (fi_msg_bw, built here with cc from
    /// tools/uvia-cli/c), against uvia bw, in interleaved pairs (also a
    /// section of `uvia bench`). Needs the provider built beside this
    /// program (cargo build --release -p uvia-fabric) or named by
    /// UVIA_FI_LIB.
    Fabric(FabricArgs),
    /// MPI over uvia, source document 001's study redone with real MPIs:
    /// Open MPI (and MPICH with --mpich) over uvia (uvia;ofi_rxm on udp, the
    /// provider's own reliable datagrams on shm)
    /// against native uvia, against software acknowledgements over
    /// datagrams (udp;ofi_rxd), eager copies against rendezvous, polling
    /// against blocking, and beside them Open MPI over tcp;ofi_rxm and its
    /// own TCP and shared-memory paths; one-way latency by size, 1 B to
    /// 1 MiB, in interleaved rounds (also a section of `uvia bench`); as
    /// root, Open MPI over uvia on xdp across two test hosts against Open
    /// MPI's TCP path there. Needs Open MPI (openmpi-bin, libopenmpi-dev)
    /// and the provider built beside this program.
    Mpi(MpiArgs),
    /// uvia against what a user would pick instead, each measured by its
    /// own tool in the same run, in interleaved pairs with the matching
    /// uvia run: on shared memory UCX (ucx_perftest: UCT active messages
    /// and put, UCP tag matching), libfabric's shm provider (fi_pingpong)
    /// and Open MPI's shared-memory path (NetPIPE under mpirun); on
    /// loopback libfabric's udp, tcp and udp;ofi_rxd (fi_pingpong) and
    /// kernel UDP (sockperf), against uvia's udp provider at reliable
    /// delivery. Every side pinned to cores 0 and 1; one-way latency at
    /// 8 B and 1 KiB, bandwidth at 4 KiB, 64 KiB and 1 MiB; each ratio is
    /// uvia / peer, the median of the pair ratios. UCT put, a one-sided
    /// store the peer watches, is matched by uvia's one-sided ping-pong
    /// (`uvia pingpong --rdma-write`), every other peer by send and receive.
    /// A peer that is missing or fails is listed with the reason. Also a
    /// section of `uvia bench`.
    Peers(PeersArgs),
    /// Where the time of one message goes: a ping-pong traced by the
    /// library's checkpoints and the kernel's tracepoints (BPF), each stage's
    /// median time, grouped as the source documents grouped theirs, beside
    /// the untraced one-way latency. Needs root and a build with the `trace`
    /// feature.
    Anatomy(AnatomyArgs),
    /// uvia under faults, deaths and floods, counted: numbered, patterned
    /// messages through injected loss (1%, 5%, 20%) with duplication,
    /// reordering and corruption on udp and xdp at both reliable levels
    /// (lost, duplicated, reordered and corrupted must all be 0); a peer
    /// killed or stopped mid-transfer on shm, udp and xdp at every level
    /// (every outstanding descriptor fails within 1 s on shm, the idle
    /// timeout on the network); a good client's echo rate under a flood of
    /// 200,000 connection requests a second (at least half its rate alone,
    /// the server's memory bounded). xdp runs between two test hosts (root).
    /// Exits 1 if anything falls short.
    Torture(TortureArgs),
    /// What many connected VIs cost: for each count N (default 1, 10, 100,
    /// 1,000), N VI pairs connected to a server whose VIs share one CQ; the
    /// time to connect them all, one pair's 8 B ping-pong while the others
    /// sit idle, a message rate spread over all N, the server's CPU use
    /// while its CQ wait sleeps, and its memory and file descriptors per VI.
    Scale(ScaleArgs),
    /// (internal) The server half of a measurement, started by the client.
    #[command(hide = true)]
    ServePeer(PeerArgs),
    /// (internal) The server of `uvia scale`, started by the client.
    #[command(hide = true)]
    ScalePeer(ScalePeerArgs),
    /// (internal) The peer of a torture cell, started by `uvia torture`.
    #[command(hide = true)]
    TorturePeer(torture::PeerArgs),
}

#[derive(Args)]
struct ScaleArgs {
    /// Provider of the VIs.
    #[arg(long, short = 'p', value_enum)]
    provider: scale::ScaleProvider,
    /// VI pair counts, comma-separated (1 to 4,000 each).
    #[arg(long, value_name = "LIST", default_value = "1,10,100,1000")]
    vis: String,
    /// Ping-pong round trips of the one pair.
    #[arg(long, default_value_t = 20_000, value_parser = counts(1, MAX_ITERS))]
    iters: usize,
    /// Rounds of the message rate over all VIs (a message on every VI and
    /// its reply each; at most 10,000).
    #[arg(long, default_value_t = 20, value_parser = counts(1, MAX_RATE_ROUNDS))]
    rate_rounds: usize,
    /// Seconds the server's CQ wait sleeps with nothing arriving.
    #[arg(long, default_value_t = 2.0)]
    idle_secs: f64,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Do not pin the client to core 0 and the server to core 1.
    #[arg(long)]
    no_pin: bool,
}

#[derive(Args)]
struct ScalePeerArgs {
    #[arg(long, value_enum)]
    provider: scale::ScaleProvider,
    #[arg(long)]
    vis: usize,
    #[arg(long)]
    cpu: Option<usize>,
}

#[derive(Args)]
struct LimitArgs {
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Fewer rounds (a few seconds in all).
    #[arg(long)]
    quick: bool,
    /// Only the futex hand-off, ROUNDS measured round trips: its one-way
    /// p50 and p99 (the baseline of blocking waits on shm).
    #[arg(long, value_name = "ROUNDS", conflicts_with = "quick", value_parser = counts(1, MAX_ITERS))]
    futex: Option<usize>,
}

#[derive(Args, Clone)]
struct RunArgs {
    /// Message provider.
    #[arg(long, short = 'p', value_enum)]
    provider: Provider,
    /// Receivers spin on the receive path (the default; non-blocking socket
    /// calls for the kernel providers).
    #[arg(long, conflicts_with = "blocking")]
    polling: bool,
    /// Receivers sleep in the kernel until a message arrives.
    #[arg(long)]
    blocking: bool,
    /// Same as --polling: for kernel-udp a non-blocking receive spin
    /// (recv with MSG_DONTWAIT in a tight loop).
    #[arg(long, conflicts_with = "blocking")]
    busy_poll: bool,
    /// Message sizes, comma-separated; K and M suffixes are binary
    /// (default 1,8,64,256,1K,4K,16K,64K,256K,1M).
    #[arg(long, value_name = "LIST")]
    sizes: Option<String>,
    /// Measured iterations per size (default: ping-pong 100,000 round trips up
    /// to 1 KiB and fewer above; bandwidth about 512 MiB per size, 1,000 to 200,000 messages;
    /// at most 10,000,000).
    #[arg(long, value_name = "N", value_parser = counts(1, MAX_ITERS))]
    iters: Option<usize>,
    /// Untimed warm-up iterations per size (default: a tenth of --iters, 10 to 10,000).
    #[arg(long, value_name = "N", value_parser = counts(0, MAX_ITERS))]
    warmup: Option<usize>,
    /// Multiply the default iteration counts by F (e.g. 0.1 for a quick look).
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    scale: f64,
    /// Pause between round trips, in microseconds (ping-pong only; to measure
    /// the CPU use of a receiver that waits; at most a second).
    #[arg(long, value_name = "US", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=MAX_INTERVAL_US))]
    interval_us: u64,
    /// Core for the client (this process).
    #[arg(
        long,
        value_name = "CORE",
        default_value_t = 0,
        conflicts_with = "no_pin"
    )]
    client_cpu: usize,
    /// Core for the server process.
    #[arg(
        long,
        value_name = "CORE",
        default_value_t = 1,
        conflicts_with = "no_pin"
    )]
    server_cpu: usize,
    /// Do not pin either process.
    #[arg(long)]
    no_pin: bool,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Reliability level of uvia's VIs (shm, udp, xdp).
    #[arg(long, value_enum, default_value = "delivery")]
    reliability: Level,
    /// Faults injected on both sides' receive paths (udp, xdp), e.g.
    /// loss=0.05,dup=0.01,reorder=0.01,delay=100us,corrupt=0.001,seed=7.
    #[arg(long, value_name = "SPEC")]
    inject: Option<String>,
    /// Run the two sides on two test hosts the tool makes for the run: two
    /// network namespaces joined by a veth pair (removed afterwards; needs
    /// root). For udp, xdp, kernel-udp and kernel-tcp.
    #[arg(long)]
    netns: bool,
    /// One-sided ping-pong (shm, polling, ping-pong only): each message is
    /// an RDMA write into the peer's registered buffer that ends in an 8-byte
    /// flag word, and each side waits by watching its own buffer's flag
    /// with no receive descriptor, as a one-sided protocol does (UCX's
    /// `put_lat` measures the same). The first write goes by descriptor; once
    /// the target has granted its buffer, the initiator places each write
    /// itself, by copy with no descriptor or completion (`Vi::write_copy`),
    /// as UCX's short put does.
    #[arg(long)]
    rdma_write: bool,
    /// xdp only: busy polling on both sides' AF_XDP sockets (the Nic is
    /// opened as `xdp:<interface>:busypoll`): the queue's NAPI context is run
    /// by the Nic's own polls, each empty one a non-blocking receive call.
    #[arg(long)]
    xdp_busy_poll: bool,
}

#[derive(Args, Clone)]
struct BwArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Sends a sender may have outstanding before it waits for completions
    /// (1 to 1,024).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = counts(1, MAX_WINDOW))]
    window: usize,
    /// With --inject (udp): a second connection between the same two
    /// processes, with no faults injected, measured in the same run: the
    /// batches alternate between the two (in the order ABBA), so that the
    /// host's changes of speed fall on both alike; the report gives the
    /// goodput at the faults over the lossless twin's.
    #[arg(long, requires = "inject")]
    lossless_twin: bool,
}

#[derive(Args)]
struct BenchArgs {
    /// A short run (about a minute and a half): fewer sizes and iterations.
    #[arg(long)]
    quick: bool,
    /// Folder for report.md, results.json and the SVG plots.
    #[arg(long, value_name = "DIR", default_value = "report")]
    out: PathBuf,
    /// Interleaved pairs for each headline comparison (the full bench's
    /// goodput at 5% loss takes at least 7, judged by its worst as well,
    /// and at 1% loss at least 15).
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = counts(1, MAX_PAIRS))]
    pairs: usize,
    /// Run the peers section (`uvia peers`: UCX, libfabric, Open MPI and
    /// sockperf against uvia) even with --quick; a full bench runs it
    /// whenever a peer is installed.
    #[arg(long)]
    peers: bool,
}

#[derive(Args)]
struct FabricArgs {
    /// A short run: fewer iterations per measurement.
    #[arg(long)]
    quick: bool,
    /// Interleaved pairs for each comparison.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = counts(1, MAX_PAIRS))]
    pairs: usize,
}

#[derive(Args)]
struct PeersArgs {
    /// A short run: 8 B latency, 64 KiB and 1 MiB bandwidth, a fifth of
    /// the iterations.
    #[arg(long)]
    quick: bool,
    /// Interleaved pairs (uvia, peer) for each comparison.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = counts(1, MAX_PAIRS))]
    pairs: usize,
    /// Only these peers (comma-separated): ucx-uct-am, ucx-uct-put,
    /// ucx-ucp-tag, libfabric-shm, openmpi-vader, libfabric-udp,
    /// libfabric-tcp, libfabric-udp;ofi_rxd, sockperf-udp.
    #[arg(long, value_delimiter = ',', value_name = "PEERS")]
    only: Vec<String>,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write peers.md and the plots (peers-latency.svg,
    /// peers-bandwidth.svg) into DIR.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

#[derive(Args)]
struct MpiArgs {
    /// A short run: three sizes (8 B, 64 KiB, 1 MiB), fewer round trips.
    #[arg(long)]
    quick: bool,
    /// Interleaved rounds of every variant.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = counts(1, MAX_PAIRS))]
    pairs: usize,
    /// A folder holding MPICH built with ch4:ofi (bin/mpiexec, bin/mpicc),
    /// e.g. a Python virtual environment with `pip install mpich`.
    #[arg(long, value_name = "FOLDER")]
    mpich: Option<PathBuf>,
    /// Write the study as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write its plots (SVG) into DIR.
    #[arg(long, value_name = "DIR")]
    plot_dir: Option<PathBuf>,
}

#[derive(Args)]
struct TortureArgs {
    /// A short run (under a minute): 2,000 messages per grid cell, one
    /// flood round of half-second runs.
    #[arg(long)]
    quick: bool,
    /// Messages per grid cell (default 100,000; --quick 2,000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=MAX_ITERS))]
    messages: Option<u64>,
    /// Only these parts (comma-separated; default all).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "PARTS")]
    only: Vec<torture::Part>,
    /// Rounds of flood runs (alone, beside a flood to an unread socket,
    /// with the flood on the server's listener), interleaved.
    #[arg(long, value_name = "N", value_parser = counts(1, MAX_PAIRS))]
    pairs: Option<usize>,
    /// Write the findings as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct AnatomyArgs {
    /// Message provider (not with --compare, which measures each).
    #[arg(long, short = 'p', value_enum, required_unless_present_any = ["compare", "serve_stream"], conflicts_with = "compare")]
    provider: Option<Provider>,
    /// Message size (K and M suffixes are binary).
    #[arg(long, value_name = "N", default_value = "1")]
    size: String,
    /// Compare providers category by category, as 000's Table III set UDP
    /// beside M-VIA: kernel UDP, shm and udp on this host; where two test
    /// hosts can be made (root), kernel UDP and xdp between them too. Prints
    /// one table (a column per provider; ns and share of each category, the
    /// sum and the measured one-way latency) and draws the categories
    /// stacked per provider and each provider's message on a time line.
    #[arg(long, conflicts_with = "stream")]
    compare: bool,
    /// Stream K messages back to back (one ack from the receiver after the
    /// K-th), in rounds: draws each message through each layer of sender and
    /// receiver (003's time charts), and sets the throughput measured at the
    /// receiver beside 003's maximum, size / the slowest layer's time.
    #[arg(long, value_name = "K", value_parser = counts(2, MAX_STREAM))]
    stream: Option<usize>,
    /// Rounds of K messages per run of --stream (after a few untimed ones).
    #[arg(long, value_name = "N", default_value_t = 50, requires = "stream",
          value_parser = counts(1, MAX_ANATOMY_ITERS))]
    rounds: usize,
    /// Round trips traced (and measured untraced) per ping-pong.
    #[arg(long, value_name = "N", default_value_t = 5000, value_parser = counts(1, MAX_ANATOMY_ITERS))]
    iters: usize,
    /// Receivers sleep in the kernel until a message arrives (default: they
    /// poll).
    #[arg(long)]
    blocking: bool,
    /// Reliability level of uvia's VIs.
    #[arg(long, value_enum, default_value = "delivery")]
    reliability: Level,
    /// Run the two sides on two test hosts joined by a veth pair (needed for
    /// xdp; needs root). With --compare: every network provider runs there
    /// (shm stays on this host).
    #[arg(long)]
    netns: bool,
    /// Rounds of runs, each an untraced run, one with the checkpoints alone
    /// and a traced one (interleaved, so that the runs of a round see one
    /// placement of the processes on the cores); a stream: pairs of an
    /// untraced and a traced run. Default: 9 rounds; a stream, 3 pairs.
    #[arg(long, value_name = "N", value_parser = counts(1, MAX_PAIRS))]
    pairs: Option<usize>,
    /// Write the anatomy as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Folder for the SVG plots of --compare (anatomy-categories.svg,
    /// anatomy-timeline-<provider>.svg) and --stream
    /// (anatomy-stream-<provider>.svg); made if missing. Default: the
    /// current directory.
    #[arg(long, value_name = "DIR")]
    plot_dir: Option<PathBuf>,
    /// (internal) The receiving half of --stream, started by the sender.
    #[arg(long, hide = true, value_name = "SPEC", exclusive = true)]
    serve_stream: Option<String>,
}

#[derive(Args)]
struct PeerArgs {
    #[arg(long, value_enum)]
    provider: Provider,
    #[arg(long, value_parser = parse_mode)]
    mode: Mode,
    #[arg(long, value_enum)]
    kind: Kind,
    #[arg(long)]
    sizes: String,
    #[arg(long)]
    iters: String,
    #[arg(long)]
    warmup: String,
    #[arg(long, default_value_t = 64)]
    window: usize,
    #[arg(long)]
    cpu: Option<usize>,
    #[arg(long, value_enum, default_value = "delivery")]
    reliability: Level,
    #[arg(long)]
    inject: Option<String>,
    #[arg(long, default_value = "127.0.0.1")]
    ip: std::net::IpAddr,
    #[arg(long)]
    iface: Option<String>,
    #[arg(long)]
    rdma_write: bool,
    #[arg(long)]
    xdp_busy_poll: bool,
    #[arg(long)]
    lossless_twin: bool,
}

/// Standard output went away ([`out!`]).
static OUT_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What [`out!`] writes; errors other than a reader gone go to stderr.
pub fn write_out(args: std::fmt::Arguments) {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    if OUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            OUT_GONE.store(true, Ordering::Relaxed);
        } else {
            eprintln!("uvia: writing to standard output: {e}");
        }
    }
}

/// Most measured iterations of a run: each is a sample kept in memory
/// (8 bytes), and at a udp round trip's pace 10,000,000 take a minute.
const MAX_ITERS: u64 = 10_000_000;
/// Most interleaved pairs or rounds of a comparison.
const MAX_PAIRS: u64 = 1_000;
/// Most sends outstanding in `uvia bw`: the VIs' queues hold twice the
/// window (and a network provider's receives as many again), at most
/// 4,096 entries.
const MAX_WINDOW: u64 = 1_024;
/// Longest pause between round trips: a second.
const MAX_INTERVAL_US: u64 = 1_000_000;
/// Most messages of a stream's round in `uvia anatomy --stream`.
const MAX_STREAM: u64 = 1_024;
/// Most round trips or rounds an anatomy traces: each leaves checkpoints
/// in memory.
const MAX_ANATOMY_ITERS: u64 = 1_000_000;
/// Most rounds of `uvia scale`'s message rate (a message on every VI each).
const MAX_RATE_ROUNDS: u64 = 10_000;

/// A count in `lo..=hi`: clap names the flag and the range when a value
/// is outside it.
fn counts(lo: u64, hi: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(lo..=hi)
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    match s {
        "polling" | "busy-poll" => Ok(Mode::Polling),
        "blocking" => Ok(Mode::Blocking),
        _ => Err(format!("unknown mode {s:?} (polling or blocking)")),
    }
}

fn parse_list(s: &str) -> Result<Vec<usize>> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .with_context(|| format!("bad number {x:?}"))
        })
        .collect()
}

/// The path to start another copy of this program. On Linux `/proc/self/exe`,
/// which keeps naming this very binary even when a rebuild replaces the file
/// on disk in the middle of a long `bench`.
pub fn self_exe() -> Result<PathBuf> {
    // Under a profiler that loads the program itself (valgrind), the
    // process's own executable is the profiler's: UVIA_SELF_EXE names this
    // program for the processes it starts.
    if let Some(p) = std::env::var_os("UVIA_SELF_EXE").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!(
                "UVIA_SELF_EXE names {}, which is not a file (it names this program, for the \
                 processes it starts)",
                p.display()
            );
        }
        return Ok(p);
    }
    let proc = PathBuf::from("/proc/self/exe");
    if proc.exists() {
        return Ok(proc);
    }
    std::env::current_exe().context("finding this program's path to start another process")
}

pub const DEFAULT_SIZES: &str = "1,8,64,256,1K,4K,16K,64K,256K,1M";

fn plan_from(a: &RunArgs, kind: Kind, window: usize) -> Result<Plan> {
    let sizes =
        size::parse_sizes(a.sizes.as_deref().unwrap_or(DEFAULT_SIZES)).context("--sizes")?;
    let (largest, of) = match a.provider {
        Provider::KernelTcp => (size::MAX_SIZE, "the tool"),
        Provider::KernelUdp => (
            kernel_udp::MAX_MESSAGE,
            "kernel UDP here (its socket buffers)",
        ),
        // The one-sided ping-pong's flag word ends the line after the message.
        _ if a.rdma_write => (
            uvia::MAX_TRANSFER as usize - 64,
            "the one-sided ping-pong (a uvia Nic's, less the flag word)",
        ),
        _ => (uvia::MAX_TRANSFER as usize, "a uvia Nic"),
    };
    if let Some(&s) = sizes.iter().find(|&&s| s > largest) {
        bail!(
            "--sizes: {} is larger than the largest message of {of}, {}",
            size::human(s),
            size::human(largest)
        );
    }
    if a.iters == Some(0) {
        bail!("--iters must be at least 1");
    }
    if window == 0 {
        bail!("--window must be at least 1");
    }
    if !(a.scale.is_finite() && a.scale > 0.0) {
        bail!("--scale must be a positive number");
    }
    if a.scale != 1.0 && a.iters.is_some() {
        bail!(
            "--scale multiplies the default iteration counts; with --iters there are none to scale"
        );
    }
    if kind == Kind::Bw && a.interval_us != 0 {
        bail!("--interval-us paces a ping-pong's round trips; a bandwidth run sends back to back");
    }
    if matches!(a.provider, Provider::KernelUdp | Provider::KernelTcp)
        && a.reliability != Level::Delivery
    {
        bail!(
            "--reliability sets the level of uvia's VIs; {} has none (kernel UDP is unreliable, TCP reliable)",
            a.provider.name()
        );
    }
    if !a.no_pin {
        // SAFETY: sysconf has no preconditions.
        let cores = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize;
        for (flag, c) in [
            ("--client-cpu", a.client_cpu),
            ("--server-cpu", a.server_cpu),
        ] {
            if c >= cores {
                bail!("{flag} {c}: this host has cores 0 to {}", cores - 1);
            }
        }
        if a.client_cpu == a.server_cpu && !a.blocking {
            bail!(
                "--client-cpu and --server-cpu are both {}: two polling sides on one core take \
                 turns by the scheduler's slices (use two cores, or --blocking)",
                a.client_cpu
            );
        }
    }
    let iters: Vec<usize> = sizes
        .iter()
        .map(|&s| {
            a.iters.unwrap_or_else(|| {
                let d = if kind == Kind::Pingpong {
                    run::default_pp_iters(s)
                } else {
                    run::default_bw_iters(s)
                };
                ((d as f64 * a.scale).min(MAX_ITERS as f64 + 1.0) as usize).max(1)
            })
        })
        .collect();
    if let Some((&size, _)) = sizes
        .iter()
        .zip(&iters)
        .find(|(_, &n)| n as u64 > MAX_ITERS)
    {
        bail!(
            "--scale {} asks for more than {MAX_ITERS} iterations at {} (at most {MAX_ITERS} a size)",
            a.scale,
            size::human(size)
        );
    }
    let warmup = iters
        .iter()
        .map(|&i| a.warmup.unwrap_or_else(|| run::default_warmup(i)))
        .collect();
    let mode = if a.blocking {
        Mode::Blocking
    } else {
        Mode::Polling
    };
    if a.xdp_busy_poll && a.provider != Provider::Xdp {
        bail!("--xdp-busy-poll is an option of the xdp provider's sockets (-p xdp --netns)");
    }
    if a.rdma_write && (a.provider != Provider::Shm || a.blocking || kind != Kind::Pingpong) {
        bail!(
            "--rdma-write is a polling ping-pong on shm: the side that waits watches its \
             memory, and only shm's writes land there while it makes no call"
        );
    }
    Ok(Plan {
        provider: a.provider,
        mode,
        kind,
        sizes,
        iters,
        warmup,
        window,
        interval_us: a.interval_us,
        client_cpu: (!a.no_pin).then_some(a.client_cpu),
        server_cpu: (!a.no_pin).then_some(a.server_cpu),
        reliability: a.reliability,
        inject: a.inject.clone(),
        ip: std::net::Ipv4Addr::LOCALHOST.into(),
        iface: None,
        server_netns: None,
        rdma_write: a.rdma_write,
        xdp_busy_poll: a.xdp_busy_poll,
        lossless_twin: false,
    })
}

/// Fails now, before a run that may take minutes, if `path` (given with
/// `flag`) could not be written at its end. A file this makes to find out
/// is removed again; one already there is left as it is.
pub fn check_output(flag: &str, path: &std::path::Path) -> Result<()> {
    if path.is_dir() {
        bail!("{flag} {}: a folder, not a file", path.display());
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !parent.is_dir() {
        bail!(
            "{flag} {}: there is no folder {}",
            path.display(),
            parent.display()
        );
    }
    if existed_in_kernel_fs(path) {
        bail!(
            "{flag} {}: a file of the kernel's (/proc or /sys), not one a report goes to",
            path.display()
        );
    }
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .with_context(|| format!("{flag} {}: cannot be written", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// True if `path` exists on procfs or sysfs, whose files root may open for
/// writing (the permission bits do not stop root) but whose writes fail or
/// change the kernel's settings.
fn existed_in_kernel_fs(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: an all-zero statfs is valid; `c` is a C string.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut fs) } != 0 {
        return false;
    }
    matches!(fs.f_type, libc::PROC_SUPER_MAGIC | libc::SYSFS_MAGIC)
}

/// [`check_output`] for an optional `--json`.
fn check_json(path: &Option<PathBuf>) -> Result<()> {
    path.as_deref()
        .map_or(Ok(()), |p| check_output("--json", p))
}

fn write_json<T: serde::Serialize>(path: &Option<PathBuf>, v: &T) -> Result<()> {
    if let Some(p) = path {
        let s = serde_json::to_string_pretty(v)?;
        std::fs::write(p, s + "\n").with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// Test hosts made for one measurement, kept as long as it runs.
type Hosts = Option<(uvia_net::netns::NsGuard, uvia_net::netns::TestHosts)>;

/// Puts the two sides of `plan` on two test hosts when asked to: this
/// thread (the client) moves to host a, the server will start on host b.
fn place(plan: &mut Plan, netns: bool) -> Result<Hosts> {
    if plan.provider == Provider::Xdp && !netns {
        bail!("--provider xdp runs between two test hosts: add --netns (needs root)");
    }
    if !netns {
        return Ok(None);
    }
    if plan.provider == Provider::Shm {
        bail!("--netns needs a network provider (udp, xdp, kernel-udp, kernel-tcp)");
    }
    uvia_net::netns::TestHosts::available().map_err(|why| anyhow::anyhow!("--netns: {why}"))?;
    let hosts =
        uvia_net::netns::TestHosts::create("bench").context("--netns: making the test hosts")?;
    let guard = hosts
        .enter(uvia_net::netns::Side::A)
        .context("--netns: entering test host a")?;
    plan.ip = hosts.ipv4(uvia_net::netns::Side::A).into();
    plan.iface = Some(hosts.iface(uvia_net::netns::Side::A));
    plan.server_netns = Some((
        hosts.name(uvia_net::netns::Side::B).to_string(),
        hosts.ipv4(uvia_net::netns::Side::B).into(),
        hosts.iface(uvia_net::netns::Side::B),
    ));
    Ok(Some((guard, hosts)))
}

/// The plan of one anatomy: `provider` at `size`, ping-pong.
fn anatomy_plan(a: &AnatomyArgs, provider: Provider, size: usize) -> Result<Plan> {
    let run = RunArgs {
        provider,
        polling: false,
        blocking: a.blocking,
        busy_poll: false,
        sizes: Some(size.to_string()),
        iters: Some(a.iters),
        warmup: Some((a.iters / 10).max(10)),
        scale: 1.0,
        interval_us: 0,
        client_cpu: 0,
        server_cpu: 1,
        no_pin: false,
        json: None,
        // The kernel's sockets have no level to set.
        reliability: if matches!(provider, Provider::KernelUdp | Provider::KernelTcp) {
            Level::Delivery
        } else {
            a.reliability
        },
        inject: None,
        netns: a.netns,
        rdma_write: false,
        xdp_busy_poll: false,
    };
    plan_from(&run, Kind::Pingpong, 64)
}

fn progress(len: usize) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(len as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    pb
}

fn anatomy(a: &AnatomyArgs) -> Result<()> {
    if let Some(spec) = &a.serve_stream {
        anatomy::stream::serve(spec);
    }
    let size = size::parse_size(&a.size).context("--size")?;
    if a.iters == 0 {
        bail!("--iters must be at least 1");
    }
    if a.pairs() == 0 {
        bail!("--pairs must be at least 1");
    }
    if a.stream.is_some_and(|k| k < 2) {
        bail!("--stream needs at least 2 messages: a stream of one is a ping-pong");
    }
    if a.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if a.plot_dir.is_some() && !a.compare && a.stream.is_none() {
        bail!("--plot-dir goes with --compare or --stream (a single provider's anatomy draws no plots)");
    }
    anatomy::require_checkpoints()?;
    check_json(&a.json)?;
    let plot_dir = a.plot_dir.clone().unwrap_or_else(|| PathBuf::from("."));
    if a.compare || a.stream.is_some() {
        std::fs::create_dir_all(&plot_dir)
            .with_context(|| format!("--plot-dir: making {}", plot_dir.display()))?;
    }
    if a.compare {
        return anatomy_compare(a, size, &plot_dir);
    }
    let provider = a
        .provider
        .ok_or_else(|| anyhow::anyhow!("--provider is needed (or --compare)"))?;
    let mut plan = anatomy_plan(a, provider, size)?;
    let _hosts = place(&mut plan, a.netns)?;
    if let Some(k) = a.stream {
        let pb = progress(a.pairs());
        pb.set_message(format!("stream anatomy of {}", provider.name()));
        let r = anatomy::stream::run(&plan, k, a.rounds, a.pairs(), Some(&pb));
        pb.finish_and_clear();
        let r = r?;
        out!("{}", anatomy::stream::table(&r));
        match anatomy::stream::plot(&r, &plot_dir) {
            Ok(f) => outln!("plot: {}", plot_dir.join(f).display()),
            Err(e) => eprintln!("uvia: warning: the stream's plot: {e:#}"),
        }
        return write_json(&a.json, &r);
    }
    let r = anatomy::run(&plan, a.pairs(), None)?;
    out!("{}", anatomy::table(&r));
    write_json(&a.json, &r)
}

impl AnatomyArgs {
    /// Rounds of a ping-pong anatomy, pairs of a stream's.
    fn pairs(&self) -> usize {
        self.pairs
            .unwrap_or(if self.stream.is_some() { 3 } else { 9 })
    }
}

/// `uvia anatomy --compare`: each provider placed and measured in turn.
fn anatomy_compare(a: &AnatomyArgs, size: usize, dir: &std::path::Path) -> Result<()> {
    let (wants, skipped) =
        anatomy::compare::wants(a.netns, uvia_net::netns::TestHosts::available())?;
    let pb = progress(wants.len() * a.pairs());
    let mut c = anatomy::compare::run(&wants, skipped, size, a.pairs(), a.iters, &pb, &mut |w| {
        let mut plan = anatomy_plan(a, w.provider, size)?;
        let _hosts = place(&mut plan, w.netns)?;
        anatomy::run(&plan, a.pairs(), Some(&pb))
    });
    pb.finish_and_clear();
    if c.columns.iter().all(|x| x.anatomy.is_none()) {
        bail!("no provider could be measured");
    }
    let (done, failed) = anatomy::compare::plots(&c, dir);
    c.plots = done;
    out!("{}", anatomy::compare::table(&c));
    for f in failed {
        eprintln!("uvia: warning: plot {f}");
    }
    outln!("plots in {}", dir.display());
    write_json(&a.json, &c)
}

fn torture(a: &TortureArgs) -> Result<()> {
    let parts = if a.only.is_empty() {
        vec![
            torture::Part::Grid,
            torture::Part::Deaths,
            torture::Part::Flood,
        ]
    } else {
        a.only.clone()
    };
    let messages = a.messages.unwrap_or(if a.quick { 2_000 } else { 100_000 });
    let pairs = a.pairs.unwrap_or(if a.quick { 1 } else { 3 });
    let measure = Duration::from_millis(if a.quick { 500 } else { 2_000 });
    check_json(&a.json)?;
    let t = torture::run(&parts, messages, pairs, measure)?;
    out!("{}", torture::table(&t));
    write_json(&a.json, &t)?;
    if !t.failures.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

fn measure(a: &RunArgs, kind: Kind, window: usize, lossless_twin: bool) -> Result<()> {
    let mut plan = plan_from(a, kind, window)?;
    if lossless_twin && a.provider != Provider::Udp {
        // Two xdp Nics cannot share the interface's queue.
        bail!("--lossless-twin is for the udp provider (-p udp)");
    }
    plan.lossless_twin = lossless_twin;
    check_json(&a.json)?;
    if a.inject.is_some() && !matches!(a.provider, Provider::Udp | Provider::Xdp) {
        bail!("--inject needs a uvia network provider (--provider udp or xdp)");
    }
    if let Some(spec) = &a.inject {
        // Checked here, before a server is started, so a typo is named at once.
        let f = spec
            .parse::<uvia_net::inject::FaultSpec>()
            .map_err(|e| anyhow::anyhow!("--inject {spec:?}: {e}"))?;
        if f.loss >= 1.0 || f.corrupt >= 1.0 {
            bail!(
                "--inject {spec:?}: every frame would be lost, the connection's first \
                 too; a measurement wants loss and corrupt below 1"
            );
        }
    }
    let _hosts = place(&mut plan, a.netns)?;
    let r = run::run(&plan)?;
    out!("{}", report::run_table(&r));
    write_json(&a.json, &r)
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Limit(a) if a.futex.is_some() => (|| {
            let rounds = a.futex.unwrap_or(0);
            if rounds == 0 {
                anyhow::bail!("--futex wants at least 1 round trip");
            }
            check_json(&a.json)?;
            let r = limit::futex_only(rounds)?;
            outln!(
                "futex hand-off, one-way: p50 {:.2} us, p99 {:.2} us ({rounds} round trips)",
                r.p50 / 1e3,
                r.p99 / 1e3
            );
            write_json(&a.json, &r)
        })(),
        Cmd::Limit(a) => (|| {
            check_json(&a.json)?;
            let r = limit::run_all(a.quick)?;
            out!("{}", report::limit_table(&r));
            write_json(&a.json, &r)
        })(),
        Cmd::Pingpong(a) => measure(&a, Kind::Pingpong, 64, false),
        Cmd::Bw(a) => measure(&a.run, Kind::Bw, a.window, a.lossless_twin),
        Cmd::Bench(a) => bench::bench(a.quick, &a.out, a.pairs, a.peers),
        Cmd::Fabric(a) => fabric::run(a.quick, a.pairs),
        Cmd::Mpi(a) => mpi::run(
            a.quick,
            a.pairs,
            a.mpich.as_deref(),
            a.json.as_deref(),
            a.plot_dir.as_deref(),
        ),
        Cmd::Peers(a) => peers::run(
            &peers::Options {
                quick: a.quick,
                pairs: a.pairs,
                only: a.only,
            },
            a.json.as_deref(),
            a.out.as_deref(),
        ),
        Cmd::Anatomy(a) => anatomy(&a),
        Cmd::Torture(a) => torture(&a),
        Cmd::TorturePeer(p) => torture::peer(&p),
        Cmd::Scale(a) => (|| -> Result<()> {
            if !(a.idle_secs.is_finite() && a.idle_secs > 0.0 && a.idle_secs <= 600.0) {
                bail!("--idle-secs wants a number of seconds above 0 and at most 600");
            }
            if a.iters == 0 || a.rate_rounds == 0 {
                bail!("--iters and --rate-rounds want at least 1");
            }
            check_json(&a.json)?;
            let o = scale::ScaleOpts {
                provider: a.provider,
                counts: {
                    let v = parse_list(&a.vis).context("--vis")?;
                    if let Some(n) = v
                        .iter()
                        .enumerate()
                        .find_map(|(i, n)| v[..i].contains(n).then_some(n))
                    {
                        bail!("--vis: {n} is given twice in {:?}", a.vis);
                    }
                    v
                },
                iters: a.iters,
                rate_rounds: a.rate_rounds,
                idle: Duration::from_secs_f64(a.idle_secs),
                client_cpu: (!a.no_pin).then_some(0),
                server_cpu: (!a.no_pin).then_some(1),
            };
            let r = scale::run(&o)?;
            write_json(&a.json, &r)?;
            if !r.failed.is_empty() {
                bail!("{} of {} counts failed", r.failed.len(), o.counts.len());
            }
            Ok(())
        })(),
        Cmd::ScalePeer(p) => scale::serve(p.provider, p.vis, p.cpu),
        Cmd::ServePeer(p) => (|| -> Result<()> {
            let sizes = parse_list(&p.sizes)?;
            let iters = parse_list(&p.iters)?;
            let warmup = parse_list(&p.warmup)?;
            let plan = Plan {
                provider: p.provider,
                mode: p.mode,
                kind: p.kind,
                sizes,
                iters,
                warmup,
                window: p.window,
                interval_us: 0,
                client_cpu: None,
                server_cpu: p.cpu,
                reliability: p.reliability,
                inject: p.inject,
                ip: p.ip,
                iface: p.iface,
                server_netns: None,
                rdma_write: p.rdma_write,
                xdp_busy_poll: p.xdp_busy_poll,
                lossless_twin: p.lossless_twin,
            };
            run::serve(&plan)
        })(),
    };
    if let Err(e) = res {
        eprintln!("uvia: error: {e:#}");
        std::process::exit(1);
    }
}
