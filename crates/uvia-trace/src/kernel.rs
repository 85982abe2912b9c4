//! Kernel events on the same time line as the checkpoints: BPF programs on
//! the kernel's tracepoints, each writing when it ran, on which CPU, for
//! which task, and the tracepoint's first two arguments into a buffer of
//! the CPU it ran on, read after the measurement.
//!
//! The buffers are one array map that user space maps into its memory: a
//! counter per CPU, then each CPU's records. A program takes its record's
//! place with an atomic add on its CPU's counter (an event that interrupts
//! another's program on the same CPU gets a place of its own) and writes
//! the record there; a BPF ring buffer would cost a lock and a copy per
//! event, several times what the rest of the program costs.
//!
//! The programs are raw-tracepoint programs: attached by the tracepoint's
//! name (no tracefs needed), run at every hit on every CPU, and given the
//! tracepoint's arguments as they are, which costs less than the formatted
//! record of a perf tracepoint event. Timestamps come from
//! `bpf_ktime_get_ns`, which is `CLOCK_MONOTONIC`, the clock the
//! checkpoints are converted to. Events that only a process makes (system
//! calls, socket calls) are kept for the processes [`KernelTracer::watch`]
//! names; events of the network path, which run in whatever context the
//! kernel has at hand (a softirq on the sender's CPU, often), are kept for
//! all.
//!
//! Each event costs tens to a couple of hundred nanoseconds, which analysis
//! subtracts as it does the checkpoints' cost. [`KernelTracer::open`]
//! measures it in two kinds: a system call's entry and exit events (their
//! tracepoints also send every system call down the kernel's slower entry
//! path), timed on `getppid` with and without them; and the network path's
//! events, timed on a UDP datagram sent to itself over loopback with and
//! without them, less the system calls' share, per event recorded.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use uvia_bpf::insn::*;

/// A kernel tracepoint uvia can record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Point {
    /// A system call starts (args: registers, number).
    SysEnter,
    /// A system call returns (args: registers, return value).
    SysExit,
    /// A packet enters the device layer, `dev_queue_xmit` (arg: skb).
    NetDevQueue,
    /// The driver's transmit is called (args: skb, device).
    NetDevStartXmit,
    /// The driver's transmit returned (args: skb, status).
    NetDevXmit,
    /// A received packet is queued for the receive softirq (arg: skb).
    NetifRx,
    /// A softirq is raised (arg: vector; 3 is NET_RX).
    SoftirqRaise,
    /// A softirq starts running (arg: vector).
    SoftirqEntry,
    /// A softirq is done (arg: vector).
    SoftirqExit,
    /// The receive path takes a packet, `__netif_receive_skb` (arg: skb).
    NetifReceiveSkb,
    /// A NAPI poll (a device's, or the backlog's) is done (args: napi, work).
    NapiPoll,
    /// An XDP program redirected a frame (to an AF_XDP socket, for uvia).
    XdpRedirect,
    /// A socket has data and wakes its readers (arg: socket).
    SkDataReady,
    /// A datagram's payload is copied to the user (args: skb, length).
    SkbCopyDatagramIovec,
    /// `recvmsg` on a socket returns (args: socket, length).
    SockRecvLength,
    /// `sendmsg` on a socket returns (args: socket, length).
    SockSendLength,
    /// A task is woken (arg: the task).
    SchedWakeup,
}

impl Point {
    pub const ALL: [Point; 17] = [
        Point::SysEnter,
        Point::SysExit,
        Point::NetDevQueue,
        Point::NetDevStartXmit,
        Point::NetDevXmit,
        Point::NetifRx,
        Point::SoftirqRaise,
        Point::SoftirqEntry,
        Point::SoftirqExit,
        Point::NetifReceiveSkb,
        Point::NapiPoll,
        Point::XdpRedirect,
        Point::SkDataReady,
        Point::SkbCopyDatagramIovec,
        Point::SockRecvLength,
        Point::SockSendLength,
        Point::SchedWakeup,
    ];

    /// The kernel's name for the tracepoint.
    pub fn name(self) -> &'static str {
        match self {
            Point::SysEnter => "sys_enter",
            Point::SysExit => "sys_exit",
            Point::NetDevQueue => "net_dev_queue",
            Point::NetDevStartXmit => "net_dev_start_xmit",
            Point::NetDevXmit => "net_dev_xmit",
            Point::NetifRx => "netif_rx",
            Point::SoftirqRaise => "softirq_raise",
            Point::SoftirqEntry => "softirq_entry",
            Point::SoftirqExit => "softirq_exit",
            Point::NetifReceiveSkb => "netif_receive_skb",
            Point::NapiPoll => "napi_poll",
            Point::XdpRedirect => "xdp_redirect",
            Point::SkDataReady => "sk_data_ready",
            Point::SkbCopyDatagramIovec => "skb_copy_datagram_iovec",
            Point::SockRecvLength => "sock_recv_length",
            Point::SockSendLength => "sock_send_length",
            Point::SchedWakeup => "sched_wakeup",
        }
    }

    pub fn from_name(name: &str) -> Option<Point> {
        Point::ALL.iter().copied().find(|p| p.name() == name)
    }

    /// How many arguments the tracepoint passes: a raw-tracepoint program
    /// may read no further (the kernel refuses to attach it otherwise).
    fn args(self) -> usize {
        match self {
            Point::NetDevQueue
            | Point::NetifRx
            | Point::SoftirqRaise
            | Point::SoftirqEntry
            | Point::SoftirqExit
            | Point::NetifReceiveSkb
            | Point::SkDataReady
            | Point::SchedWakeup => 1,
            _ => 2,
        }
    }

    /// Whether the event belongs to the process it runs in, and is kept only
    /// for watched processes.
    fn per_process(self) -> bool {
        matches!(
            self,
            Point::SysEnter
                | Point::SysExit
                | Point::SkbCopyDatagramIovec
                | Point::SockRecvLength
                | Point::SockSendLength
        )
    }
}

/// One kernel event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// `CLOCK_MONOTONIC`, in nanoseconds.
    pub ns: u64,
    pub point: Point,
    /// The process and thread the kernel ran the event for (the interrupted
    /// one, in a softirq).
    pub tgid: u32,
    pub tid: u32,
    /// The current task's address: what a wake-up's argument names.
    pub task: u64,
    pub cpu: u32,
    /// The tracepoint's first two arguments (the second is 0 where it has one).
    pub args: [u64; 2],
}

/// The record the programs write, 48 bytes: `ns, pid_tgid, task, arg0,
/// arg1, cpu: u32, point: u32`. The per-CPU counters take a record's room
/// each, at the start of the array.
const RECORD: usize = 48;

/// The tracer: programs attached, the buffers, and the processes watched.
pub struct KernelTracer {
    slots: Slots,
    watched: OwnedFd,
    /// Each attached point's program, kept so that it can be attached
    /// again after a pause.
    progs: Vec<(Point, OwnedFd)>,
    /// The attachments; closing one detaches its program.
    links: Vec<OwnedFd>,
    attached: Vec<Point>,
    missing: Vec<(Point, String)>,
    cost: Costs,
}

/// What recording an event costs the code it interrupts, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Costs {
    /// A system call's entry or exit event.
    pub syscall: f64,
    /// Any other event (the network path's).
    pub other: f64,
}

impl Costs {
    pub fn of(&self, p: Point) -> f64 {
        match p {
            Point::SysEnter | Point::SysExit => self.syscall,
            _ => self.other,
        }
    }
}

/// Processes that can be watched at once.
const MAX_WATCHED: u32 = 64;

impl KernelTracer {
    /// Attaches a program to each of `points` that the kernel has, with room
    /// for `per_cpu` events on each CPU (later ones are counted, not kept).
    /// A tracepoint the kernel does not have is listed in [`missing`]; a
    /// kernel that runs none (no BPF, or no privileges) is an error that
    /// says so. The calling process is watched.
    ///
    /// [`missing`]: KernelTracer::missing
    pub fn open(points: &[Point], per_cpu: usize) -> io::Result<KernelTracer> {
        let cpus = possible_cpus();
        let entries = cpus.saturating_mul(per_cpu.saturating_add(1));
        if per_cpu == 0 || entries.saturating_mul(RECORD) > (1 << 31) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "kernel trace buffer of {per_cpu} events per CPU: must be between 1 and {}",
                    (1usize << 31) / RECORD / cpus - 1
                ),
            ));
        }
        let why = |what: &str, e: io::Error| {
            let hint = match e.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => {
                    " (kernel tracing needs root, or CAP_BPF and CAP_PERFMON)"
                }
                Some(libc::ENOSYS) | Some(libc::EINVAL) => {
                    " (this kernel lacks BPF support for it)"
                }
                _ => "",
            };
            io::Error::new(e.kind(), format!("kernel tracing: {what}: {e}{hint}"))
        };
        let array = uvia_bpf::map_create(
            uvia_bpf::BPF_MAP_TYPE_ARRAY,
            4,
            RECORD as u32,
            entries as u32,
            uvia_bpf::BPF_F_MMAPABLE,
            "uvia_events",
        )
        .map_err(|e| why("creating the event buffers", e))?;
        let watched = uvia_bpf::map_create(
            uvia_bpf::BPF_MAP_TYPE_HASH,
            4,
            4,
            MAX_WATCHED,
            0,
            "uvia_watched",
        )
        .map_err(|e| why("creating the process filter", e))?;
        let slots =
            Slots::map(array, cpus, per_cpu).map_err(|e| why("mapping the event buffers", e))?;

        let before = (syscall_ns(), loopback_ns());
        let mut links = Vec::new();
        let mut progs = Vec::new();
        let mut attached = Vec::new();
        let mut missing = Vec::new();
        for &p in points {
            let insns = program(p, slots.fd.as_raw_fd(), watched.as_raw_fd(), cpus, per_cpu);
            let prog = uvia_bpf::prog_load(
                uvia_bpf::BPF_PROG_TYPE_RAW_TRACEPOINT,
                &insns,
                0,
                &format!("uvia_{}", p.name()),
            )
            .map_err(|e| why(&format!("loading the program for {}", p.name()), e))?;
            let name = CString::new(p.name()).expect("tracepoint names have no NUL");
            match uvia_bpf::raw_tracepoint_open(&name, &prog) {
                Ok(link) => {
                    links.push(link);
                    progs.push((p, prog));
                    attached.push(p);
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    missing.push((p, "no such tracepoint in this kernel".into()))
                }
                Err(e) => return Err(why(&format!("attaching to {}", p.name()), e)),
            }
        }
        let mut t = KernelTracer {
            slots,
            watched,
            progs,
            links,
            attached,
            missing,
            cost: Costs::default(),
        };
        t.watch(std::process::id())?;
        t.cost = t.measure_costs(before);
        Ok(t)
    }

    /// The costs, from the times of `before` (a system call, a loopback
    /// datagram) before anything was attached and the same times now.
    fn measure_costs(&mut self, before: (f64, Option<f64>)) -> Costs {
        let mut c = Costs::default();
        if self.attached.contains(&Point::SysEnter) && self.attached.contains(&Point::SysExit) {
            c.syscall = ((syscall_ns() - before.0) / 2.0).max(0.0);
        }
        c.other = c.syscall;
        self.take();
        if let (Some(bare), Some(traced)) = (before.1, loopback_ns()) {
            let (ev, dropped) = self.take();
            let me = std::process::id();
            let (mut sys, mut other) = (0usize, 0usize);
            for e in ev.iter().filter(|e| e.tgid == me) {
                match e.point {
                    Point::SysEnter | Point::SysExit => sys += 1,
                    _ => other += 1,
                }
            }
            let per = |n: usize| n as f64 / (LOOPBACK_ROUNDS * LOOPBACK_TIMINGS) as f64;
            // With events lost the count is short: keep the system call's cost.
            if other > 0 && dropped == 0 {
                c.other = ((traced - bare - per(sys) * c.syscall) / per(other)).max(0.0);
            }
        }
        self.take();
        c
    }

    /// Detaches every program: until [`resume`], the kernel runs as if
    /// nothing were traced. (What a run costs with the kernel's events and
    /// without them is how their cost on a message's path is measured.)
    ///
    /// [`resume`]: KernelTracer::resume
    pub fn pause(&mut self) {
        self.links.clear();
    }

    /// Attaches again what [`pause`] detached.
    ///
    /// [`pause`]: KernelTracer::pause
    pub fn resume(&mut self) -> io::Result<()> {
        if !self.links.is_empty() {
            return Ok(());
        }
        for (p, prog) in &self.progs {
            let name = CString::new(p.name()).expect("tracepoint names have no NUL");
            let link = uvia_bpf::raw_tracepoint_open(&name, prog).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("kernel tracing: attaching to {} again: {e}", p.name()),
                )
            })?;
            self.links.push(link);
        }
        Ok(())
    }

    /// Whether the programs are attached (not paused).
    pub fn is_attached(&self) -> bool {
        !self.links.is_empty() || self.progs.is_empty()
    }

    /// Keeps the per-process events of process `tgid` from now on.
    pub fn watch(&self, tgid: u32) -> io::Result<()> {
        uvia_bpf::map_update(&self.watched, &tgid.to_ne_bytes(), &1u32.to_ne_bytes())
    }

    /// Stops keeping the per-process events of process `tgid`.
    pub fn unwatch(&self, tgid: u32) -> io::Result<()> {
        uvia_bpf::map_delete(&self.watched, &tgid.to_ne_bytes())
    }

    /// The tracepoints being recorded.
    pub fn attached(&self) -> &[Point] {
        &self.attached
    }

    /// The tracepoints asked for that this kernel does not have, and why.
    pub fn missing(&self) -> &[(Point, String)] {
        &self.missing
    }

    /// What an event costs the code it interrupts.
    pub fn costs(&self) -> Costs {
        self.cost
    }

    /// Takes every event recorded since the last take, in time order, and
    /// how many were left out because a CPU's buffer was full.
    pub fn take(&mut self) -> (Vec<Event>, u64) {
        let mut out = Vec::new();
        let dropped = self.slots.drain(|r| {
            let u64_at = |i: usize| u64::from_ne_bytes(r[i..i + 8].try_into().unwrap());
            let u32_at = |i: usize| u32::from_ne_bytes(r[i..i + 4].try_into().unwrap());
            let Some(&point) = Point::ALL.get(u32_at(44) as usize) else {
                return;
            };
            let pid_tgid = u64_at(8);
            out.push(Event {
                ns: u64_at(0),
                point,
                tgid: (pid_tgid >> 32) as u32,
                tid: pid_tgid as u32,
                task: u64_at(16),
                args: [u64_at(24), u64_at(32)],
                cpu: u32_at(40),
            });
        });
        out.sort_by_key(|e| e.ns);
        (out, dropped)
    }
}

fn possible_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    (n.max(1) as usize).max(
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
    )
}

/// Datagrams [`loopback_ns`] sends per timing, and its timings.
const LOOPBACK_ROUNDS: usize = 500;
const LOOPBACK_TIMINGS: usize = 5;

/// Median time of a one-byte UDP datagram sent to its own socket over
/// loopback and received, in nanoseconds: the kernel's whole network path
/// in one process. `None` where there is no loopback to send on.
fn loopback_ns() -> Option<f64> {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").ok()?;
    let me = sock.local_addr().ok()?;
    sock.set_read_timeout(Some(std::time::Duration::from_secs(1)))
        .ok()?;
    let mut buf = [0u8; 8];
    let mut round = || -> Option<f64> {
        let t0 = crate::monotonic_ns();
        for _ in 0..LOOPBACK_ROUNDS {
            sock.send_to(&[1], me).ok()?;
            sock.recv(&mut buf).ok()?;
        }
        Some((crate::monotonic_ns() - t0) as f64 / LOOPBACK_ROUNDS as f64)
    };
    let mut v = Vec::new();
    for _ in 0..LOOPBACK_TIMINGS {
        v.push(round()?);
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// Median time of a cheap system call, in nanoseconds.
pub fn syscall_ns() -> f64 {
    let mut v: Vec<f64> = (0..15)
        .map(|_| {
            const N: u32 = 2000;
            let t0 = crate::monotonic_ns();
            for _ in 0..N {
                // SAFETY: getppid has no arguments and no failure.
                unsafe { libc::syscall(libc::SYS_getppid) };
            }
            (crate::monotonic_ns() - t0) as f64 / f64::from(N)
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The program for `point`: keep the event if it is not per process or
/// its process is watched; take the next place in this CPU's buffer; write
/// the record there.
fn program(point: Point, array: i32, watched: i32, cpus: usize, per_cpu: usize) -> Vec<Insn> {
    let id = Point::ALL.iter().position(|&p| p == point).unwrap() as i32;
    // Registers kept across helper calls: r6 the arguments, r7 pid_tgid,
    // r8 the CPU, r9 the record.
    let mut p = vec![
        insn(MOV_X, 6, 1, 0, 0),
        insn(CALL, 0, 0, 0, FN_GET_CURRENT_PID_TGID),
        insn(MOV_X, 7, 0, 0, 0),
    ];
    // Each jump to the end is written as its distance from here: the
    // instructions between are counted when the program is done.
    let mut to_end = Vec::new();
    // `r0 = lookup(map, key in register key)`, on to the end when missing.
    let lookup = |p: &mut Vec<Insn>, to_end: &mut Vec<usize>, map: i32, key: u8| {
        let [m0, m1] = ld_map(1, map);
        p.extend([
            insn(STX_W, 10, key, -4, 0), // the key, on the stack
            m0,
            m1,
            insn(MOV_X, 2, 10, 0, 0),
            insn(ADD_K, 2, 0, 0, -4),
            insn(CALL, 0, 0, 0, FN_MAP_LOOKUP_ELEM),
        ]);
        to_end.push(p.len());
        p.push(insn(JEQ_K, 0, 0, 0, 0));
    };
    if point.per_process() {
        // Not watched: nothing recorded.
        p.extend([insn(MOV_X, 1, 0, 0, 0), insn(RSH_K, 1, 0, 0, 32)]);
        lookup(&mut p, &mut to_end, watched, 1);
    }
    p.extend([
        insn(CALL, 0, 0, 0, FN_GET_SMP_PROCESSOR_ID),
        insn(MOV_X, 8, 0, 0, 0),
    ]);
    to_end.push(p.len());
    p.push(insn(JGE_K, 8, 0, 0, cpus as i32));
    lookup(&mut p, &mut to_end, array, 8); // the CPU's counter
    p.extend([
        insn(MOV_K, 1, 0, 0, 1),
        insn(ATOMIC_DW, 0, 1, 0, FETCH_ADD), // r1 = this event's place
    ]);
    to_end.push(p.len());
    p.extend([
        insn(JGE_K, 1, 0, 0, per_cpu as i32), // full: counted, not kept
        insn(MOV_X, 2, 8, 0, 0),
        insn(MUL_K, 2, 0, 0, per_cpu as i32),
        insn(ADD_X, 2, 1, 0, 0),
        insn(ADD_K, 2, 0, 0, cpus as i32),
    ]);
    lookup(&mut p, &mut to_end, array, 2); // the record
    p.extend([
        insn(MOV_X, 9, 0, 0, 0),
        insn(STX_DW, 9, 7, 8, 0),
        insn(STX_W, 9, 8, 40, 0),
        insn(ST_W, 9, 0, 44, id),
        insn(LDX_DW, 1, 6, 0, 0),
        insn(STX_DW, 9, 1, 24, 0),
    ]);
    if point.args() >= 2 {
        p.push(insn(LDX_DW, 1, 6, 8, 0));
    } else {
        p.push(insn(MOV_K, 1, 0, 0, 0));
    }
    p.extend([
        insn(STX_DW, 9, 1, 32, 0),
        insn(CALL, 0, 0, 0, FN_GET_CURRENT_TASK),
        insn(STX_DW, 9, 0, 16, 0),
        // The time last, nearest the code that follows the event.
        insn(CALL, 0, 0, 0, FN_KTIME_GET_NS),
        insn(STX_DW, 9, 0, 0, 0),
    ]);
    let end = p.len();
    for at in to_end {
        p[at].off = (end - at - 1) as i16;
    }
    p.extend([insn(MOV_K, 0, 0, 0, 0), insn(EXIT, 0, 0, 0, 0)]);
    p
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// The event array as user space sees it: `cpus` counters, then `per_cpu`
/// records for each CPU.
struct Slots {
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
    cpus: usize,
    per_cpu: usize,
}

impl Slots {
    fn map(fd: OwnedFd, cpus: usize, per_cpu: usize) -> io::Result<Slots> {
        let len = (cpus * (per_cpu + 1) * RECORD).next_multiple_of(page_size());
        // SAFETY: an mmapable array map of at least `len` bytes, mapped
        // shared; failure checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Slots {
            fd,
            base: base.cast(),
            len,
            cpus,
            per_cpu,
        })
    }

    fn counter(&self, cpu: usize) -> &AtomicU64 {
        // SAFETY: counters are the first `cpus` records, 8-byte aligned,
        // inside the mapping; programs change them only atomically.
        unsafe { &*(self.base.add(cpu * RECORD) as *const AtomicU64) }
    }

    /// Hands every recorded event to `f`, empties the buffers, and returns
    /// how many events did not fit. Events recorded while this runs may be
    /// lost; it is meant for after a measurement.
    fn drain(&mut self, mut f: impl FnMut(&[u8])) -> u64 {
        let mut dropped = 0;
        for cpu in 0..self.cpus {
            let c = self.counter(cpu);
            // A record is written after its place is taken: the records
            // below the count are complete once the programs that took
            // them have finished, which an ended measurement guarantees.
            let n = c.swap(0, Ordering::AcqRel) as usize;
            dropped += n.saturating_sub(self.per_cpu) as u64;
            for i in 0..n.min(self.per_cpu) {
                let at = (self.cpus + cpu * self.per_cpu + i) * RECORD;
                // SAFETY: a record inside the mapping.
                f(unsafe { std::slice::from_raw_parts(self.base.add(at), RECORD) });
            }
        }
        dropped
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_programs_read_no_further_than_their_arguments() {
        for p in Point::ALL {
            assert_eq!(Point::from_name(p.name()), Some(p));
            let prog = program(p, 3, 4, 2, 100);
            let reads_second = prog
                .iter()
                .any(|i| i.code == LDX_DW && i.off == 8 && i.regs == 1 | 6 << 4);
            assert_eq!(reads_second, p.args() >= 2, "{}", p.name());
            let lookups = prog
                .iter()
                .filter(|i| i.imm == FN_MAP_LOOKUP_ELEM && i.code == CALL)
                .count();
            assert_eq!(lookups, 2 + usize::from(p.per_process()), "{}", p.name());
            // Every jump lands on the final `r0 = 0; exit`.
            for (at, i) in prog.iter().enumerate() {
                if matches!(i.code, JEQ_K | JGE_K) {
                    assert_eq!(
                        at + 1 + i.off as usize,
                        prog.len() - 2,
                        "{} at {at}",
                        p.name()
                    );
                }
            }
            assert_eq!(prog.last().unwrap().code, EXIT);
        }
    }

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn system_calls_of_a_watched_process_come_back_in_order_with_their_numbers() {
        if !root() {
            eprintln!("skipped: kernel tracing needs root");
            return;
        }
        let mut t = match KernelTracer::open(&[Point::SysEnter, Point::SysExit], 1 << 12) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        let c = t.costs();
        assert!(c.syscall > 0.0 && c.syscall < 10_000.0, "{c:?}");
        assert!(c.other < 10_000.0, "{c:?}");
        let before = crate::monotonic_ns();
        // SAFETY: getppid has no arguments and no failure.
        unsafe { libc::syscall(libc::SYS_getppid) };
        let after = crate::monotonic_ns();
        let me = std::process::id();
        let (ev, dropped) = t.take();
        assert_eq!(dropped, 0);
        let ev: Vec<Event> = ev
            .into_iter()
            .filter(|e| {
                e.tgid == me
                    && e.args[0] != 0
                    && (e.point == Point::SysEnter && e.args[1] == libc::SYS_getppid as u64)
            })
            .collect();
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert!(
            ev[0].ns >= before && ev[0].ns <= after,
            "{:?} not in {before}..{after}",
            ev[0]
        );
        assert!(ev[0].task != 0);
        // A process not watched leaves no system calls in the buffer.
        let child = std::process::Command::new("true").status().unwrap();
        assert!(child.success());
        let others = t.take().0.into_iter().filter(|e| e.tgid != me).count();
        assert_eq!(others, 0);
        // Paused, nothing is recorded (but the detaching calls themselves,
        // which the programs see as they go); resumed, recording goes on.
        let getppid = |e: &Event| e.tgid == me && e.args[1] == libc::SYS_getppid as u64;
        t.pause();
        assert!(!t.is_attached());
        // SAFETY: as above.
        unsafe { libc::syscall(libc::SYS_getppid) };
        let paused = t.take().0;
        assert!(!paused.iter().any(getppid), "{paused:?}");
        t.resume().unwrap();
        assert!(t.is_attached());
        // SAFETY: as above.
        unsafe { libc::syscall(libc::SYS_getppid) };
        let again = t.take().0;
        assert!(again.iter().any(getppid), "{again:?}");
        // A full buffer keeps what fits and counts the rest.
        drop(t);
        let mut t = KernelTracer::open(&[Point::SysEnter, Point::SysExit], 8).unwrap();
        for _ in 0..100 {
            // SAFETY: as above.
            unsafe { libc::syscall(libc::SYS_getppid) };
        }
        let (ev, dropped) = t.take();
        assert!(ev.len() <= 8 * possible_cpus(), "{}", ev.len());
        assert!(
            ev.len() as u64 + dropped >= 200,
            "{} kept, {dropped} dropped",
            ev.len()
        );
    }

    #[test]
    fn a_bad_buffer_size_is_named() {
        let e = KernelTracer::open(&[Point::SysEnter], 0).err().unwrap();
        assert!(e.to_string().contains("events per CPU"), "{e}");
    }
}
