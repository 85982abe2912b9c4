//! Whether `MSG_ZEROCOPY` would pay for the udp provider's large sends on
//! the media this host has: kernel UDP streams sent with and without it,
//! alternated, on loopback and (as root) between two test hosts joined by
//! a veth pair. Each send is one segmented datagram (`UDP_SEGMENT`) of
//! SIZE bytes in frames of the medium's size, from one buffer, as the udp
//! provider sends from registered memory; the receiver (core 1, `UDP_GRO`
//! on) counts the bytes that arrive. Zero-copy sends are reaped from the
//! socket's error queue every 16 sends, and the kernel's notifications
//! say how many of them it copied after all (`SO_EE_CODE_ZEROCOPY_COPIED`).
//!
//! `cargo run --release -p uvia-net --example zerocopy_probe [-- MS_PER_RUN [ROUNDS]]`
//! (default 400 ms, 3 rounds). Prints MB/s received per size and mode,
//! the median of the rounds, and the ratio zero-copy / copy.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use uvia_net::netns::{Side, TestHosts};

/// Per-call payloads: what the udp provider sends in one segmented datagram.
const SIZES: [usize; 3] = [16 << 10, 32 << 10, 60 << 10];
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;
/// Sends between two reads of the error queue.
const REAP_EVERY: u64 = 16;
/// How long past its run a stream may wait for room to send.
const STALL: Duration = Duration::from_secs(1);

fn main() {
    let mut args = std::env::args().skip(1);
    let ms: u64 = match args.next().map(|s| s.parse()) {
        None => 400,
        Some(Ok(v)) if v > 0 => v,
        _ => return usage(),
    };
    let rounds: usize = match args.next().map(|s| s.parse()) {
        None => 3,
        Some(Ok(v)) if v > 0 => v,
        _ => return usage(),
    };
    let run = Duration::from_millis(ms);
    println!("medium    size    copy MB/s  zerocopy MB/s  zerocopy / copy  copied by the kernel");
    let lo = Ipv4Addr::LOCALHOST;
    // Loopback's frames: the udp provider's largest datagram there.
    if let Err(e) = medium("loopback", 65_000, run, rounds, None, lo, lo) {
        eprintln!("zerocopy_probe: loopback: {e}");
    }
    match TestHosts::available() {
        Err(why) => println!("veth: skipped: {why}"),
        Ok(()) => {
            let veth = TestHosts::create("zcp")
                .map_err(io::Error::other)
                .and_then(|h| {
                    let (a, b) = (h.ipv4(Side::A), h.ipv4(Side::B));
                    medium("veth", 1472, run, rounds, Some(&h), a, b)
                });
            if let Err(e) = veth {
                eprintln!("zerocopy_probe: veth: {e}");
            }
        }
    }
}

fn usage() {
    eprintln!("usage: zerocopy_probe [MS_PER_RUN [ROUNDS]] (both at least 1)");
    std::process::exit(2);
}

/// Every size on one medium, copy and zero-copy alternated `rounds` times.
fn medium(
    name: &str,
    seg: usize,
    run: Duration,
    rounds: usize,
    hosts: Option<&TestHosts>,
    from: Ipv4Addr,
    to: Ipv4Addr,
) -> io::Result<()> {
    for size in SIZES {
        let (mut copy, mut zc, mut copied, mut notes) = (vec![], vec![], 0, 0);
        for _ in 0..rounds {
            copy.push(stream(size, seg, false, run, hosts, from, to)?.0);
            let (mbs, c, n) = stream(size, seg, true, run, hosts, from, to)?;
            zc.push(mbs);
            copied += c;
            notes += n;
        }
        let (c, z) = (median(&mut copy), median(&mut zc));
        println!(
            "{name:<8} {:>3} KiB  {c:>10.0}  {z:>13.0}  {:>15.2}  {copied} of {notes} notified",
            size >> 10,
            z / c
        );
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One run: MB/s received, and of the zero-copy sends' notifications, how
/// many said the kernel copied and how many there were.
fn stream(
    size: usize,
    seg: usize,
    zerocopy: bool,
    run: Duration,
    hosts: Option<&TestHosts>,
    from: Ipv4Addr,
    to: Ipv4Addr,
) -> io::Result<(f64, u64, u64)> {
    let enter = |side| hosts.map(|h| h.enter(side)).transpose();
    let rx = {
        let _in = enter(Side::B)?;
        UdpSocket::bind(SocketAddrV4::new(to, 0))?
    };
    let dst = rx.local_addr()?;
    setsockopt(rx.as_raw_fd(), libc::SOL_UDP, UDP_GRO, 1)?;
    setsockopt(rx.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 16 << 20)?;
    rx.set_read_timeout(Some(Duration::from_millis(50)))?;
    let tx = {
        let _in = enter(Side::A)?;
        UdpSocket::bind(SocketAddrV4::new(from, 0))?
    };
    tx.connect(dst)?;
    if zerocopy {
        setsockopt(tx.as_raw_fd(), libc::SOL_SOCKET, libc::SO_ZEROCOPY, 1)?;
    }
    let (stop, got) = (AtomicBool::new(false), AtomicU64::new(0));
    let buf = vec![0x5a_u8; size];
    std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            pin(1);
            let mut b = vec![0u8; 1 << 17];
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: a receive into our own buffer.
                let n = unsafe { libc::recv(rx.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), 0) };
                if n > 0 {
                    got.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        });
        pin(0);
        let (mut copied, mut notes) = (0u64, 0u64);
        // The sends, apart, so that the receiver is stopped whatever ends them.
        let sent = (|| -> io::Result<(Instant, u64)> {
            let mut sends = 0u64;
            let t0 = Instant::now();
            let mut counted_from = None;
            while t0.elapsed() < run {
                // The first tenth is a warm-up: bytes count from then on.
                if counted_from.is_none() && t0.elapsed() >= run / 10 {
                    counted_from = Some((Instant::now(), got.load(Ordering::Relaxed)));
                }
                let flags = if zerocopy { libc::MSG_ZEROCOPY } else { 0 };
                while !send_segmented(tx.as_raw_fd(), &buf, seg, flags)? {
                    // Notifications not yet read hold the socket's memory:
                    // a zero-copy send waits for them as a full queue does.
                    if zerocopy {
                        reap(tx.as_raw_fd(), &mut copied, &mut notes);
                    }
                    if t0.elapsed() > run + STALL {
                        return Err(io::Error::other("the socket took no send for a second"));
                    }
                    std::thread::yield_now();
                }
                sends += 1;
                if zerocopy && sends.is_multiple_of(REAP_EVERY) {
                    reap(tx.as_raw_fd(), &mut copied, &mut notes);
                }
            }
            Ok(counted_from.unwrap_or((t0, 0)))
        })();
        let (ended, bytes_then) = (Instant::now(), got.load(Ordering::Relaxed));
        stop.store(true, Ordering::Relaxed);
        receiver
            .join()
            .map_err(|_| io::Error::other("the receiver panicked"))?;
        let (t1, at) = sent?;
        let secs = ended.duration_since(t1).as_secs_f64();
        let bytes = bytes_then - at;
        if zerocopy {
            std::thread::sleep(Duration::from_millis(5));
            reap(tx.as_raw_fd(), &mut copied, &mut notes);
        }
        Ok((bytes as f64 / secs / 1e6, copied, notes))
    })
}

/// One datagram of `buf` in frames of `seg` bytes (one frame if it fits);
/// `false` if the socket has no room for it now.
fn send_segmented(fd: i32, buf: &[u8], seg: usize, flags: libc::c_int) -> io::Result<bool> {
    #[repr(C, align(8))]
    struct Cmsg([u8; 32]);
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut c = Cmsg([0; 32]);
    // SAFETY: a zeroed msghdr is valid; it points at live locals below.
    let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
    h.msg_iov = &mut iov;
    h.msg_iovlen = 1;
    if buf.len() > seg {
        h.msg_control = c.0.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE of a u16 fits the 32-byte buffer, and the
        // header written is the buffer's first.
        unsafe {
            h.msg_controllen = libc::CMSG_SPACE(2) as _;
            let cm = libc::CMSG_FIRSTHDR(&h);
            (*cm).cmsg_level = libc::SOL_UDP;
            (*cm).cmsg_type = UDP_SEGMENT;
            (*cm).cmsg_len = libc::CMSG_LEN(2) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cm) as *mut u16, seg as u16);
        }
    }
    // SAFETY: the header and what it points at live through the call.
    if unsafe { libc::sendmsg(fd, &h, flags) } >= 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOBUFS | libc::EAGAIN | libc::EINTR) => Ok(false),
        _ => Err(e),
    }
}

/// Reads the zero-copy notifications waiting on `fd`: each names a range
/// of sends, and whether the kernel copied them after all.
fn reap(fd: i32, copied: &mut u64, notes: &mut u64) {
    loop {
        let mut ctl = [0u64; 16];
        // SAFETY: a zeroed msghdr is valid; the control buffer is ours.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        h.msg_control = ctl.as_mut_ptr().cast();
        h.msg_controllen = std::mem::size_of_val(&ctl) as _;
        // SAFETY: a read of the error queue into the header above.
        if unsafe { libc::recvmsg(fd, &mut h, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) } < 0 {
            return;
        }
        // SAFETY: the kernel filled the control buffer; its first header
        // is an IP_RECVERR with a sock_extended_err.
        unsafe {
            let cm = libc::CMSG_FIRSTHDR(&h);
            if cm.is_null() {
                continue;
            }
            let e = &*(libc::CMSG_DATA(cm) as *const libc::sock_extended_err);
            if e.ee_origin == SO_EE_ORIGIN_ZEROCOPY {
                // ee_info..=ee_data: the range of sends this note covers.
                let n = u64::from(e.ee_data.wrapping_sub(e.ee_info)) + 1;
                *notes += n;
                if e.ee_code & SO_EE_CODE_ZEROCOPY_COPIED != 0 {
                    *copied += n;
                }
            }
        }
    }
}

fn setsockopt(fd: i32, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: an int option on our socket.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Pins the calling thread to `core`; left unpinned where the host lacks it.
fn pin(core: usize) {
    // SAFETY: CPU_SET writes inside the zeroed set; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
