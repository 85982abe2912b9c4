//! Two real processes over the shm provider: every size class, scatter and
//! gather, immediate data, RDMA, errors the receiver reports, and a peer that
//! is killed. Each test re-runs this binary as its peer.

mod peer;

use peer::*;
use std::time::{Duration, Instant};
use uvia::*;

const SIZES: &[usize] = &[
    1,
    8,
    40,
    56,
    57,
    64,
    512,
    513,
    1000,
    4096,
    8192,
    8193,
    65536,
    1 << 20,
];

fn levels() -> [Reliability; 3] {
    [
        Reliability::Unreliable,
        Reliability::ReliableDelivery,
        Reliability::ReliableReception,
    ]
}

/// The server echoes every message back until it gets a zero-length one.
fn echo_server(level: Reliability, d: u64) {
    let inst = instance("");
    let e = end(&inst, |p| ViAttributes::new(p).reliability(level));
    accept(&e, d);
    loop {
        let r = recv(&e, 0, 1 << 20);
        let n = r.result().unwrap() as usize;
        if n == 0 {
            break;
        }
        assert_eq!(send(&e, 0, n).result(), Ok(n as u32));
    }
    // Wait for the client to go before tearing down.
    until_peer_leaves(&e);
}

#[test]
fn every_size_class_on_every_reliability_level() {
    if let Some(a) = peer_arg() {
        let (lvl, d) = a.split_once(':').unwrap();
        return echo_server(levels()[lvl.parse::<usize>().unwrap()], d.parse().unwrap());
    }
    let inst = instance("sizes");
    for (li, level) in levels().into_iter().enumerate() {
        let d = 100 + li as u64;
        let peer = Peer::spawn(
            "every_size_class_on_every_reliability_level",
            &inst,
            &format!("{li}:{d}"),
        );
        let mut e = end(&inst, |p| ViAttributes::new(p).reliability(level));
        connect(&e, d);
        for (k, &n) in SIZES.iter().enumerate() {
            let data = pattern(n, k as u8);
            e.buf.as_mut_slice()[..n].copy_from_slice(&data);
            assert_eq!(
                send(&e, 0, n).result(),
                Ok(n as u32),
                "{level:?} {n} B send"
            );
            let r = recv(&e, 1 << 20, 1 << 20);
            assert_eq!(r.result(), Ok(n as u32), "{level:?} {n} B echo");
            assert_eq!(
                &e.buf.as_slice()[1 << 20..(1 << 20) + n],
                &data[..],
                "{level:?} {n} B content"
            );
        }
        send(&e, 0, 0);
        e.vi.disconnect();
        peer.join();
    }
    assert!(
        leftovers(&inst).is_empty(),
        "socket directory not empty: {:?}",
        leftovers(&inst)
    );
}

/// Memory the caller registered from its heap, which the peer cannot map:
/// a large message is read by cross-memory attach, and from 512 KiB goes
/// through the ring in pieces, which the receiver copies out in order;
/// pieces cut across the sender's segments and the receiver's alike, on
/// every reliability level.
#[test]
fn caller_memory_moves_through_the_ring_in_pieces() {
    if let Some(a) = peer_arg() {
        let (lvl, d) = a.split_once(':').unwrap();
        return echo_server(levels()[lvl.parse::<usize>().unwrap()], d.parse().unwrap());
    }
    let inst = instance("pieces");
    for (li, level) in levels().into_iter().enumerate() {
        let d = 120 + li as u64;
        let peer = Peer::spawn(
            "caller_memory_moves_through_the_ring_in_pieces",
            &inst,
            &format!("{li}:{d}"),
        );
        let e = end(&inst, |p| ViAttributes::new(p).reliability(level));
        connect(&e, d);
        let mut heap = pattern(1 << 20, 9);
        let mut back = vec![0u8; 1 << 20];
        // SAFETY: both buffers outlive their registrations and are not
        // touched while a descriptor names them.
        let (h, hb) = unsafe {
            (
                e.nic
                    .register_mem(heap.as_mut_ptr(), heap.len(), MemAttributes::new(e.ptag))
                    .unwrap(),
                e.nic
                    .register_mem(back.as_mut_ptr(), back.len(), MemAttributes::new(e.ptag))
                    .unwrap(),
            )
        };
        // By cross-memory attach; where pieces begin, a byte more (a last
        // piece of one byte), three segments cut where no piece ends, and
        // 1 MiB.
        for cuts in [
            &[0usize, 300_000][..],
            &[0, 512 << 10],
            &[0, (512 << 10) + 1],
            &[0, 70_001, 86_385, 600_001],
            &[0, 1 << 20],
        ] {
            let n = *cuts.last().unwrap();
            let segs: Vec<Segment> = cuts
                .windows(2)
                .map(|w| Segment::local(heap[w[0]..].as_ptr(), h, (w[1] - w[0]) as u32))
                .collect();
            e.vi.post_send(Box::new(Descriptor::send(&segs))).unwrap();
            assert_eq!(
                e.vi.send_wait(Some(T)).unwrap().result(),
                Ok(n as u32),
                "{level:?} {n} B send"
            );
            // The echo comes back from the peer's own region into two
            // heap segments.
            back[..n].fill(0);
            let half = n / 2 + 7;
            let r = Descriptor::recv(&[
                Segment::local(back.as_ptr(), hb, half as u32),
                Segment::local(back[half..].as_ptr(), hb, (n - half) as u32),
            ]);
            e.vi.post_recv(Box::new(r)).unwrap();
            let r = e.vi.recv_wait(Some(T)).unwrap();
            assert_eq!(r.result(), Ok(n as u32), "{level:?} {n} B echo");
            assert!(back[..n] == heap[..n], "{level:?} {n} B content");
        }
        send(&e, 0, 0);
        e.nic.deregister_mem(h).unwrap();
        e.nic.deregister_mem(hb).unwrap();
        e.vi.disconnect();
        peer.join();
    }
}

/// Unreliable: a message in pieces that finds too short a receive fails
/// that receive alone; its remaining pieces are dropped and the next
/// message arrives whole. An RDMA write from caller memory goes in pieces
/// too, with its immediate data at the end.
#[test]
fn a_message_in_pieces_that_does_not_fit_is_dropped_whole() {
    const N: usize = 600_000;
    if let Some(a) = peer_arg() {
        let inst = instance("");
        let e = end(&inst, |p| {
            ViAttributes::new(p)
                .rdma(true, false)
                .reliability(Reliability::Unreliable)
        });
        accept(&e, a.parse().unwrap());
        let mut info = e.nic.alloc_region(16, MemAttributes::new(e.ptag)).unwrap();
        info.as_mut_slice()[..8].copy_from_slice(&(e.buf.addr() as u64).to_le_bytes());
        info.as_mut_slice()[8..].copy_from_slice(&(e.buf.handle().0 as u64).to_le_bytes());
        // Both receives are posted before the client is told to go on.
        e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(0, 50_000)])))
            .unwrap();
        e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(1 << 20, N)])))
            .unwrap();
        e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(0, 16)])))
            .unwrap();
        e.vi.post_send(Box::new(Descriptor::send(&[info.segment(0, 16)])))
            .unwrap();
        e.vi.send_wait(Some(T)).unwrap().result().unwrap();
        let short = e.vi.recv_wait(Some(T)).unwrap();
        assert_eq!(short.error(), Some(CompletionError::Length));
        let whole = e.vi.recv_wait(Some(T)).unwrap();
        assert_eq!(whole.result(), Ok(N as u32));
        assert!(e.buf.as_slice()[1 << 20..(1 << 20) + N] == pattern(N, 2)[..]);
        let w = e.vi.recv_wait(Some(T)).unwrap();
        assert_eq!(w.immediate(), Some(0xabcd));
        assert_eq!(w.cs.status & status::OP_MASK, status::OP_REMOTE_RDMA_WRITE);
        assert!(e.buf.as_slice()[100_000..100_000 + N] == pattern(N, 3)[..]);
        until_peer_leaves(&e);
        return;
    }
    let inst = instance("pieces-drop");
    let peer = Peer::spawn(
        "a_message_in_pieces_that_does_not_fit_is_dropped_whole",
        &inst,
        "125",
    );
    let e = end(&inst, |p| {
        ViAttributes::new(p)
            .rdma(true, false)
            .reliability(Reliability::Unreliable)
    });
    connect(&e, 125);
    let r = recv(&e, 0, 16);
    assert_eq!(r.result(), Ok(16));
    let word =
        |i: usize| u64::from_le_bytes(e.buf.as_slice()[i * 8..i * 8 + 8].try_into().unwrap());
    let (addr, handle) = (word(0), MemHandle(word(1) as u32));
    let mut heap = vec![0u8; 3 * N];
    heap[..N].copy_from_slice(&pattern(N, 1));
    heap[N..2 * N].copy_from_slice(&pattern(N, 2));
    heap[2 * N..].copy_from_slice(&pattern(N, 3));
    // SAFETY: `heap` outlives its registration and is not touched while posted.
    let h = unsafe {
        e.nic
            .register_mem(heap.as_mut_ptr(), heap.len(), MemAttributes::new(e.ptag))
    }
    .unwrap();
    for k in 0..2 {
        let s = Descriptor::send(&[Segment::local(heap[k * N..].as_ptr(), h, N as u32)]);
        e.vi.post_send(Box::new(s)).unwrap();
        assert_eq!(e.vi.send_wait(Some(T)).unwrap().result(), Ok(N as u32));
    }
    let w = Descriptor::rdma_write(
        Segment::remote(addr + 100_000, handle),
        &[Segment::local(heap[2 * N..].as_ptr(), h, N as u32)],
    )
    .with_immediate(0xabcd);
    e.vi.post_send(Box::new(w)).unwrap();
    assert_eq!(e.vi.send_wait(Some(T)).unwrap().result(), Ok(N as u32));
    e.nic.deregister_mem(h).unwrap();
    e.vi.disconnect();
    peer.join();
}

#[test]
fn scatter_and_gather_keep_the_byte_order() {
    if let Some(a) = peer_arg() {
        let inst = instance("");
        let e = end(&inst, ViAttributes::new);
        accept(&e, a.parse().unwrap());
        for n in [300usize, 200_000] {
            // Receive into two segments of uneven size, then send it back as one.
            let (first, second) = (n / 3, n - n / 3);
            let segs = [e.buf.segment(0, first), e.buf.segment(1 << 20, second)];
            e.vi.post_recv(Box::new(Descriptor::recv(&segs))).unwrap();
            assert_eq!(e.vi.recv_wait(Some(T)).unwrap().result(), Ok(n as u32));
            let mut joined = e.buf.as_slice()[..first].to_vec();
            joined.extend_from_slice(&e.buf.as_slice()[1 << 20..(1 << 20) + second]);
            let mut out = e.nic.alloc_region(n, MemAttributes::new(e.ptag)).unwrap();
            out.as_mut_slice().copy_from_slice(&joined);
            e.vi.post_send(Box::new(Descriptor::send(&[out.segment(0, n)])))
                .unwrap();
            assert!(e.vi.send_wait(Some(T)).unwrap().result().is_ok());
        }
        until_peer_leaves(&e);
        return;
    }
    let inst = instance("sg");
    let peer = Peer::spawn("scatter_and_gather_keep_the_byte_order", &inst, "130");
    let mut e = end(&inst, ViAttributes::new);
    connect(&e, 130);
    for n in [300usize, 200_000] {
        let data = pattern(n, 3);
        // Three segments from three places of the buffer.
        let cuts = [0, n / 4, n / 2, n];
        let offs = [0usize, 700_000, 1_400_000];
        for i in 0..3 {
            e.buf.as_mut_slice()[offs[i]..offs[i] + cuts[i + 1] - cuts[i]]
                .copy_from_slice(&data[cuts[i]..cuts[i + 1]]);
        }
        let segs: Vec<Segment> = (0..3)
            .map(|i| e.buf.segment(offs[i], cuts[i + 1] - cuts[i]))
            .collect();
        e.vi.post_send(Box::new(Descriptor::send(&segs))).unwrap();
        assert_eq!(e.vi.send_wait(Some(T)).unwrap().result(), Ok(n as u32));
        let r = recv(&e, 1_800_000, n);
        assert_eq!(r.result(), Ok(n as u32));
        assert_eq!(&e.buf.as_slice()[1_800_000..1_800_000 + n], &data[..]);
    }
    e.vi.disconnect();
    peer.join();
}

/// Large messages: the receiver shares its copy with a sender that polls for
/// its send's completion (each copies chunks), and copies alone for one that
/// sleeps. Chunks that straddle segments on both sides keep the byte order.
#[test]
fn a_large_message_is_copied_by_both_ends_or_by_the_receiver_alone() {
    /// (bytes, the sender polls its send's completion).
    const CASES: [(usize, bool); 4] = [
        (1 << 20, true),
        ((512 << 10) + 4099, true),
        ((1 << 20) - 77, false),
        (1 << 20, true),
    ];
    /// The sender's three segments and the receiver's two: uneven, at odd offsets.
    fn send_segs(r: &MemoryRegion, n: usize) -> Vec<Segment> {
        let cuts = [0, n / 5, n / 2 + 1, n];
        (0..3)
            .map(|i| r.segment(i * (1 << 20) + 3 * i, cuts[i + 1] - cuts[i]))
            .collect()
    }
    fn fill(r: &mut MemoryRegion, n: usize, seed: u8) {
        let data = pattern(n, seed);
        let cuts = [0, n / 5, n / 2 + 1, n];
        for i in 0..3 {
            let at = i * (1 << 20) + 3 * i;
            r.as_mut_slice()[at..at + cuts[i + 1] - cuts[i]]
                .copy_from_slice(&data[cuts[i]..cuts[i + 1]]);
        }
    }
    fn recv_into(e: &End, r: &MemoryRegion, n: usize) -> Vec<u8> {
        let first = n / 3 + 5;
        let segs = [r.segment(4099, first), r.segment(2 << 20, n - first)];
        e.vi.post_recv(Box::new(Descriptor::recv(&segs))).unwrap();
        assert_eq!(e.vi.recv_wait(Some(T)).unwrap().result(), Ok(n as u32));
        let mut got = r.as_slice()[4099..4099 + first].to_vec();
        got.extend_from_slice(&r.as_slice()[2 << 20..(2 << 20) + n - first]);
        got
    }
    fn send_from(e: &End, r: &MemoryRegion, n: usize, poll: bool) {
        e.vi.post_send(Box::new(Descriptor::send(&send_segs(r, n))))
            .unwrap();
        let d = if poll {
            loop {
                if let Some(d) = e.vi.send_done() {
                    break d;
                }
            }
        } else {
            std::thread::sleep(Duration::from_millis(20));
            e.vi.send_wait(Some(T)).unwrap()
        };
        assert_eq!(d.result(), Ok(n as u32));
    }
    let region = |e: &End| {
        e.nic
            .alloc_region(4 << 20, MemAttributes::new(e.ptag))
            .unwrap()
    };
    if let Some(a) = peer_arg() {
        let inst = instance("");
        let e = end(&inst, ViAttributes::new);
        let mut r = region(&e);
        accept(&e, a.parse().unwrap());
        for (i, (n, poll)) in CASES.into_iter().enumerate() {
            let got = recv_into(&e, &r, n);
            assert!(
                got == pattern(n, i as u8),
                "case {i}: the server got other bytes"
            );
            fill(&mut r, n, 100 + i as u8);
            send_from(&e, &r, n, poll);
        }
        until_peer_leaves(&e);
        return;
    }
    let inst = instance("share");
    let peer = Peer::spawn(
        "a_large_message_is_copied_by_both_ends_or_by_the_receiver_alone",
        &inst,
        "131",
    );
    let e = end(&inst, ViAttributes::new);
    let mut r = region(&e);
    connect(&e, 131);
    for (i, (n, poll)) in CASES.into_iter().enumerate() {
        fill(&mut r, n, i as u8);
        send_from(&e, &r, n, poll);
        let got = recv_into(&e, &r, n);
        assert!(
            got == pattern(n, 100 + i as u8),
            "case {i}: the client got other bytes"
        );
    }
    e.vi.disconnect();
    peer.join();
}

/// The target exposes its buffer: the client learns address and handle from
/// a first message, then writes, reads and tries what it may not.
#[test]
fn rdma_write_read_and_immediate_are_checked_on_the_target() {
    if let Some(a) = peer_arg() {
        let inst = instance("");
        let e = end(&inst, |p| ViAttributes::new(p).rdma(true, true));
        let guarded = e
            .nic
            .alloc_region(4096, MemAttributes::new(e.ptag))
            .unwrap();
        accept(&e, a.parse().unwrap());
        let mut info = e.nic.alloc_region(64, MemAttributes::new(e.ptag)).unwrap();
        let words = [
            e.buf.addr() as u64,
            e.buf.handle().0 as u64,
            guarded.addr() as u64,
            guarded.handle().0 as u64,
        ];
        for (i, w) in words.iter().enumerate() {
            info.as_mut_slice()[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        e.vi.post_send(Box::new(Descriptor::send(&[info.segment(0, 32)])))
            .unwrap();
        e.vi.send_wait(Some(T)).unwrap().result().unwrap();
        // A write with immediate data consumes this receive.
        let r = recv(&e, 1_900_000, 16);
        assert_eq!(r.immediate(), Some(0xfeed));
        assert_eq!(r.cs.status & status::OP_MASK, status::OP_REMOTE_RDMA_WRITE);
        // Serve the client's requests until it says it is done (an empty send).
        let r = recv(&e, 1_900_000, 16);
        assert_eq!(r.result(), Ok(0));
        assert!(
            guarded.as_slice().iter().all(|&b| b == 0),
            "a region without the enable bit stays untouched"
        );
        assert_eq!(&e.buf.as_slice()[100..100 + 5000], &pattern(5000, 1)[..]);
        return;
    }
    let inst = instance("rdma");
    let peer = Peer::spawn(
        "rdma_write_read_and_immediate_are_checked_on_the_target",
        &inst,
        "140",
    );
    let mut e = end(&inst, |p| ViAttributes::new(p).rdma(true, true));
    connect(&e, 140);
    let r = recv(&e, 0, 64);
    assert_eq!(r.result(), Ok(32));
    let w = |i: usize| u64::from_le_bytes(e.buf.as_slice()[i * 8..i * 8 + 8].try_into().unwrap());
    let (addr, handle, gaddr, ghandle) =
        (w(0), MemHandle(w(1) as u32), w(2), MemHandle(w(3) as u32));
    // Large RDMA write, then read it back.
    e.buf.as_mut_slice()[4096..4096 + 5000].copy_from_slice(&pattern(5000, 1));
    let wr = Descriptor::rdma_write(
        Segment::remote(addr + 100, handle),
        &[e.buf.segment(4096, 5000)],
    );
    e.vi.post_send(Box::new(wr)).unwrap();
    assert_eq!(e.vi.send_wait(Some(T)).unwrap().result(), Ok(5000));
    let rd = Descriptor::rdma_read(
        Segment::remote(addr + 100, handle),
        &[e.buf.segment(20_000, 5000)],
    );
    e.vi.post_send(Box::new(rd)).unwrap();
    assert_eq!(e.vi.send_wait(Some(T)).unwrap().result(), Ok(5000));
    assert_eq!(&e.buf.as_slice()[20_000..25_000], &pattern(5000, 1)[..]);
    // 1 MiB each way.
    let big = 1 << 20;
    let wr = Descriptor::rdma_write(
        Segment::remote(addr + (1 << 20), handle),
        &[e.buf.segment(0, big)],
    );
    e.vi.post_send(Box::new(wr)).unwrap();
    assert_eq!(e.vi.send_wait(Some(T)).unwrap().result(), Ok(big as u32));
    let rd = Descriptor::rdma_read(
        Segment::remote(addr + (1 << 20), handle),
        &[e.buf.segment(1 << 20, big)],
    );
    e.vi.post_send(Box::new(rd)).unwrap();
    assert_eq!(e.vi.send_wait(Some(T)).unwrap().result(), Ok(big as u32));
    // Immediate data with a write.
    let wi = Descriptor::rdma_write(
        Segment::remote(addr + 50_000, handle),
        &[e.buf.segment(0, 8)],
    )
    .with_immediate(0xfeed);
    e.vi.post_send(Box::new(wi)).unwrap();
    assert_eq!(e.vi.send_wait(Some(T)).unwrap().result(), Ok(8));
    send(&e, 0, 0);
    e.vi.disconnect();
    peer.join();
    // A region without the enable bit: refused on the target (checked there
    // by the peer above; here the initiator sees the status).
    let _ = (gaddr, ghandle);
}

/// The target of a one-sided transfer makes no call: it posts its
/// receives, then sleeps in a read of its standard input. RDMA writes and
/// reads, sends into its posted receives and a write with immediate data
/// complete at the initiator all the same, whether it waits or polls, checked by the target's rules: a
/// write to a region without the enable bit still fails and breaks the
/// connection. The target checks its memory after it wakes.
#[test]
fn one_sided_transfers_complete_while_the_target_sleeps() {
    if let Some(a) = peer_arg() {
        let inst = instance("");
        let e = end(&inst, |p| ViAttributes::new(p).rdma(true, true));
        let guarded = e
            .nic
            .alloc_region(4096, MemAttributes::new(e.ptag))
            .unwrap();
        // Caller memory (reached by cross-memory attach, not mapped by the peer).
        let mut heap = vec![0u8; 100_000];
        // SAFETY: `heap` outlives its registration and is only read after
        // the connection has ended.
        let hh = unsafe {
            e.nic.register_mem(
                heap.as_mut_ptr(),
                heap.len(),
                MemAttributes::new(e.ptag).rdma_write(true).rdma_read(true),
            )
        }
        .unwrap();
        accept(&e, a.parse().unwrap());
        for (off, len) in [(1_000_000, 30_000), (1_100_000, 64), (1_200_000, 64)] {
            e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(off, len)])))
                .unwrap();
        }
        let mut info = e.nic.alloc_region(64, MemAttributes::new(e.ptag)).unwrap();
        let words = [
            e.buf.addr() as u64,
            e.buf.handle().0 as u64,
            guarded.addr() as u64,
            guarded.handle().0 as u64,
            heap.as_ptr() as u64,
            hh.0 as u64,
        ];
        for (i, w) in words.iter().enumerate() {
            info.as_mut_slice()[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        e.vi.post_send(Box::new(Descriptor::send(&[info.segment(0, 48)])))
            .unwrap();
        e.vi.send_wait(Some(T)).unwrap().result().unwrap();
        // Sleep, with no call into the library, until the initiator is done.
        let mut byte = [0u8; 1];
        let _ = std::io::Read::read(&mut std::io::stdin(), &mut byte);
        assert_eq!(&e.buf.as_slice()[..65536], &pattern(65536, 3)[..]);
        assert_eq!(&e.buf.as_slice()[300_000..300_100], &pattern(100, 4)[..]);
        assert_eq!(&e.buf.as_slice()[400_000..404_096], &pattern(4096, 6)[..]);
        assert_eq!(&e.buf.as_slice()[450_000..470_000], &pattern(20_000, 8)[..]);
        assert_eq!(&heap[..50_000], &pattern(50_000, 7)[..]);
        assert!(e.buf.as_slice()[1_300_000..1_900_000] == pattern(600_000, 9)[..]);
        let r = e.vi.recv_wait(Some(T)).unwrap();
        assert_eq!(r.result(), Ok(30_000));
        assert_eq!(
            &e.buf.as_slice()[1_000_000..1_030_000],
            &pattern(30_000, 5)[..]
        );
        let r = e.vi.recv_wait(Some(T)).unwrap();
        assert_eq!(r.result(), Ok(8));
        let r = e.vi.recv_wait(Some(T)).unwrap();
        assert_eq!(r.cs.status & status::OP_MASK, status::OP_REMOTE_RDMA_WRITE);
        assert_eq!(r.immediate(), Some(0xbeef));
        assert!(
            guarded.as_slice().iter().all(|&b| b == 0),
            "a region without the enable bit stays untouched"
        );
        assert_eq!(
            e.vi.state(),
            ViState::Error,
            "the violation broke the connection"
        );
        e.nic.deregister_mem(hh).unwrap();
        return;
    }
    let inst = instance("sleeping");
    let (peer, mut wake) = Peer::spawn_piped(
        "one_sided_transfers_complete_while_the_target_sleeps",
        &inst,
        "170",
    );
    let mut e = end(&inst, |p| ViAttributes::new(p).rdma(true, true));
    connect(&e, 170);
    let r = recv(&e, 0, 64);
    assert_eq!(r.result(), Ok(48));
    let w = |i: usize| u64::from_le_bytes(e.buf.as_slice()[i * 8..i * 8 + 8].try_into().unwrap());
    let (addr, handle) = (w(0), MemHandle(w(1) as u32));
    let (gaddr, ghandle) = (w(2), MemHandle(w(3) as u32));
    let (haddr, hhandle) = (w(4), MemHandle(w(5) as u32));
    let post = |d: Descriptor, what: &str| -> Box<Descriptor> {
        e.vi.post_send(Box::new(d)).unwrap();
        e.vi.send_wait(Some(T))
            .unwrap_or_else(|err| panic!("{what} to a sleeping target: {err:?}"))
    };
    // 64 KiB RDMA write, then read back.
    e.buf.as_mut_slice()[..65536].copy_from_slice(&pattern(65536, 3));
    e.buf.as_mut_slice()[65536..65636].copy_from_slice(&pattern(100, 4));
    e.buf.as_mut_slice()[70_000..100_000].copy_from_slice(&pattern(30_000, 5));
    e.buf.as_mut_slice()[100_000..104_096].copy_from_slice(&pattern(4096, 6));
    e.buf.as_mut_slice()[200_000..250_000].copy_from_slice(&pattern(50_000, 7));
    e.buf.as_mut_slice()[300_000..320_000].copy_from_slice(&pattern(20_000, 8));
    let src = |off: usize, len: usize| e.buf.segment(off, len);
    let d = Descriptor::rdma_write(Segment::remote(addr, handle), &[src(0, 65536)]);
    assert_eq!(post(d, "RDMA write").result(), Ok(65536));
    let d = Descriptor::rdma_read(Segment::remote(addr, handle), &[src(500_000, 65536)]);
    assert_eq!(post(d, "RDMA read").result(), Ok(65536));
    assert_eq!(&e.buf.as_slice()[500_000..565_536], &pattern(65536, 3)[..]);
    // A small write (carried inline), into caller memory, and back.
    let d = Descriptor::rdma_write(Segment::remote(addr + 300_000, handle), &[src(65536, 100)]);
    assert_eq!(post(d, "small RDMA write").result(), Ok(100));
    let d = Descriptor::rdma_write(Segment::remote(haddr, hhandle), &[src(200_000, 50_000)]);
    assert_eq!(post(d, "RDMA write to caller memory").result(), Ok(50_000));
    let d = Descriptor::rdma_read(Segment::remote(haddr, hhandle), &[src(600_000, 50_000)]);
    assert_eq!(post(d, "RDMA read of caller memory").result(), Ok(50_000));
    assert_eq!(&e.buf.as_slice()[600_000..650_000], &pattern(50_000, 7)[..]);
    // An initiator that polls instead of waiting.
    e.vi.post_send(Box::new(Descriptor::rdma_write(
        Segment::remote(addr + 450_000, handle),
        &[src(300_000, 20_000)],
    )))
    .unwrap();
    let polled = Instant::now();
    let c = loop {
        if let Some(c) = e.vi.send_done() {
            break c;
        }
        assert!(
            polled.elapsed() < T,
            "a polled RDMA write to a sleeping target never completed"
        );
    };
    assert_eq!(c.result(), Ok(20_000));
    // Sends into the receives it posted, and a write with immediate data.
    let d = Descriptor::send(&[src(70_000, 30_000)]);
    assert_eq!(post(d, "send").result(), Ok(30_000));
    let d = Descriptor::send(&[src(0, 8)]);
    assert_eq!(post(d, "small send").result(), Ok(8));
    let d = Descriptor::rdma_write(
        Segment::remote(addr + 400_000, handle),
        &[src(100_000, 4096)],
    )
    .with_immediate(0xbeef);
    assert_eq!(post(d, "RDMA write with immediate").result(), Ok(4096));
    // A write from caller memory large enough to go through the ring in
    // pieces: the target's agent takes them as they come.
    let mut big = pattern(600_000, 9);
    // SAFETY: `big` outlives its registration and is not touched while posted.
    let hb = unsafe {
        e.nic
            .register_mem(big.as_mut_ptr(), big.len(), MemAttributes::new(e.ptag))
    }
    .unwrap();
    let d = Descriptor::rdma_write(
        Segment::remote(addr + 1_300_000, handle),
        &[Segment::local(big.as_ptr(), hb, 600_000)],
    );
    assert_eq!(post(d, "RDMA write in pieces").result(), Ok(600_000));
    e.nic.deregister_mem(hb).unwrap();
    // A region without the enable bit: refused, and the connection breaks.
    let d = Descriptor::rdma_write(Segment::remote(gaddr, ghandle), &[src(0, 128)]);
    let c = post(d, "forbidden RDMA write");
    assert_eq!(c.error(), Some(CompletionError::RdmaProtection));
    assert_eq!(e.vi.state(), ViState::Error, "a reliable VI breaks");
    std::io::Write::write_all(&mut wake, b"x").unwrap();
    drop(wake);
    e.vi.disconnect();
    peer.join();
}

#[test]
fn rdma_protection_errors_leave_target_memory_untouched() {
    if let Some(a) = peer_arg() {
        let inst = instance("");
        let (case, d) = a.split_once(':').unwrap();
        let e = end(&inst, |p| ViAttributes::new(p).rdma(true, true));
        let other = e.nic.create_ptag().unwrap();
        let no_enable = e
            .nic
            .alloc_region(4096, MemAttributes::new(e.ptag))
            .unwrap();
        let other_tag = e
            .nic
            .alloc_region(4096, MemAttributes::new(other).rdma_write(true))
            .unwrap();
        accept(&e, d.parse().unwrap());
        let mut info = e.nic.alloc_region(64, MemAttributes::new(e.ptag)).unwrap();
        let words = [
            no_enable.addr() as u64,
            no_enable.handle().0 as u64,
            other_tag.addr() as u64,
            other_tag.handle().0 as u64,
        ];
        for (i, w) in words.iter().enumerate() {
            info.as_mut_slice()[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        e.vi.post_send(Box::new(Descriptor::send(&[info.segment(0, 32)])))
            .unwrap();
        e.vi.send_wait(Some(T)).unwrap().result().unwrap();
        // Serve until the connection ends (the violation breaks it).
        e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(0, 64)])))
            .unwrap();
        let _ = e.vi.recv_wait(Some(T));
        assert!(
            no_enable.as_slice().iter().all(|&b| b == 0),
            "{case}: no-enable region written"
        );
        assert!(
            other_tag.as_slice().iter().all(|&b| b == 0),
            "{case}: other-tag region written"
        );
        assert!(
            e.buf.as_slice()[(2 << 20) - 64..].iter().all(|&b| b == 0),
            "{case}: out-of-bounds bytes written"
        );
        return;
    }
    let inst = instance("rdmaprot");
    for (i, case) in [
        "no-enable",
        "other-ptag",
        "bad-handle",
        "out-of-bounds",
        "read-no-enable",
    ]
    .iter()
    .enumerate()
    {
        let d = 150 + i as u64;
        let peer = Peer::spawn(
            "rdma_protection_errors_leave_target_memory_untouched",
            &inst,
            &format!("{case}:{d}"),
        );
        let mut e = end(&inst, |p| ViAttributes::new(p).rdma(true, true));
        connect(&e, d);
        let r = recv(&e, 0, 64);
        assert_eq!(r.result(), Ok(32));
        let w =
            |i: usize| u64::from_le_bytes(e.buf.as_slice()[i * 8..i * 8 + 8].try_into().unwrap());
        let (na, nh, oa, oh) = (w(0), MemHandle(w(1) as u32), w(2), MemHandle(w(3) as u32));
        e.buf.as_mut_slice()[..256].fill(0xee);
        let src = [e.buf.segment(0, 128)];
        let d = match *case {
            "no-enable" => Descriptor::rdma_write(Segment::remote(na, nh), &src),
            "other-ptag" => Descriptor::rdma_write(Segment::remote(oa, oh), &src),
            "bad-handle" => {
                Descriptor::rdma_write(Segment::remote(na, MemHandle(0x4242_0007)), &src)
            }
            "out-of-bounds" => Descriptor::rdma_write(Segment::remote(na + 4000, nh), &src),
            _ => Descriptor::rdma_read(Segment::remote(na, nh), &[e.buf.segment(4096, 128)]),
        };
        e.vi.post_send(Box::new(d)).unwrap();
        let c = e.vi.send_wait(Some(T)).unwrap();
        assert_eq!(c.error(), Some(CompletionError::RdmaProtection), "{case}");
        assert_eq!(e.vi.state(), ViState::Error, "{case}: a reliable VI breaks");
        e.vi.disconnect();
        peer.join();
    }
}

#[test]
fn short_receive_buffer_is_a_length_error_on_both_sides() {
    if let Some(a) = peer_arg() {
        let inst = instance("");
        let e = end(&inst, ViAttributes::new);
        accept(&e, a.parse().unwrap());
        let r = recv(&e, 0, 10);
        assert_eq!(r.error(), Some(CompletionError::Length));
        assert_eq!(e.vi.state(), ViState::Error);
        return;
    }
    let inst = instance("length");
    let peer = Peer::spawn(
        "short_receive_buffer_is_a_length_error_on_both_sides",
        &inst,
        "160",
    );
    let e = end(&inst, ViAttributes::new);
    connect(&e, 160);
    e.vi.post_send(Box::new(Descriptor::send(&[e.buf.segment(0, 100)])))
        .unwrap();
    // Reliable delivery completes the send when written; the receiver's error
    // arrives as the VI's failure: a later send is refused or flushed.
    let first = e.vi.send_wait(Some(T)).unwrap();
    assert!(first.result().is_ok() || first.error() == Some(CompletionError::RemoteDescriptor));
    let start = Instant::now();
    while e.vi.state() != ViState::Error && start.elapsed() < T {
        let _ = e.vi.send_done();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        e.vi.state(),
        ViState::Error,
        "the receiver's length error breaks the connection"
    );
    peer.join();
}

#[test]
fn reliable_reception_reports_the_remote_descriptor_error() {
    if let Some(a) = peer_arg() {
        let inst = instance("");
        let e = end(&inst, |p| {
            ViAttributes::new(p).reliability(Reliability::ReliableReception)
        });
        accept(&e, a.parse().unwrap());
        let r = recv(&e, 0, 10);
        assert_eq!(r.error(), Some(CompletionError::Length));
        return;
    }
    let inst = instance("rr");
    let peer = Peer::spawn(
        "reliable_reception_reports_the_remote_descriptor_error",
        &inst,
        "170",
    );
    let e = end(&inst, |p| {
        ViAttributes::new(p).reliability(Reliability::ReliableReception)
    });
    connect(&e, 170);
    e.vi.post_send(Box::new(Descriptor::send(&[e.buf.segment(0, 100)])))
        .unwrap();
    let c = e.vi.send_wait(Some(T)).unwrap();
    assert_eq!(c.error(), Some(CompletionError::RemoteDescriptor));
    assert_eq!(e.vi.state(), ViState::Error);
    peer.join();
}

#[test]
fn connection_errors_are_clear() {
    if let Some(a) = peer_arg() {
        let inst = instance("");
        let (what, d) = a.split_once(':').unwrap();
        let level = if what == "mismatch" {
            Reliability::Unreliable
        } else {
            Reliability::ReliableDelivery
        };
        let e = end(&inst, |p| ViAttributes::new(p).reliability(level));
        let mut req = e
            .nic
            .connect_wait(&disc(d.parse().unwrap()), Some(T))
            .unwrap();
        match what {
            "reject" => req.reject().unwrap(),
            _ => assert!(matches!(req.accept(&e.vi), Err(ConnectError::Mismatch(_)))),
        }
        return;
    }
    let inst = instance("cm");
    let e = end(&inst, ViAttributes::new);
    // Nobody listens: a clear error within the timeout.
    let start = Instant::now();
    let err =
        e.vi.connect_request(
            &NetAddress::new(&inst, disc(999)),
            Duration::from_millis(200),
        )
        .unwrap_err();
    assert!(matches!(err, ConnectError::NoListener { .. }), "{err}");
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(e.vi.state(), ViState::Idle);
    // Rejected, then a reliability mismatch.
    let peer = Peer::spawn("connection_errors_are_clear", &inst, "reject:180");
    assert!(matches!(
        e.vi.connect_request(&NetAddress::new(&inst, disc(180)), T),
        Err(ConnectError::Rejected)
    ));
    peer.join();
    let peer = Peer::spawn("connection_errors_are_clear", &inst, "mismatch:181");
    let err =
        e.vi.connect_request(&NetAddress::new(&inst, disc(181)), T)
            .unwrap_err();
    assert!(
        matches!(err, ConnectError::Rejected | ConnectError::Mismatch(_)),
        "{err}"
    );
    peer.join();
    assert_eq!(
        e.vi.state(),
        ViState::Idle,
        "a failed connect leaves the VI idle"
    );
    // Posting a send on an unconnected VI is refused at once.
    let rej =
        e.vi.post_send(Box::new(Descriptor::send(&[e.buf.segment(0, 8)])))
            .unwrap_err();
    assert_eq!(rej.error, PostError::NotConnected(ViState::Idle));
    assert!(leftovers(&inst).is_empty(), "{:?}", leftovers(&inst));
}

#[test]
fn a_killed_peer_fails_every_outstanding_descriptor() {
    if let Some(a) = peer_arg() {
        let inst = instance("");
        let (role, d) = a.split_once(':').unwrap();
        let e = end(&inst, ViAttributes::new);
        if role == "server" {
            accept(&e, d.parse().unwrap());
        } else {
            connect(&e, d.parse().unwrap());
        }
        // Take two messages, then stop receiving and wait to be killed.
        recv(&e, 0, 64);
        recv(&e, 0, 64);
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    for (i, role) in ["server", "client"].iter().enumerate() {
        let inst = instance(&format!("kill-{role}"));
        let d = 190 + i as u64;
        let mut peer = Peer::spawn(
            "a_killed_peer_fails_every_outstanding_descriptor",
            &inst,
            &format!("{role}:{d}"),
        );
        let e = end(&inst, ViAttributes::new);
        if *role == "server" {
            connect(&e, d);
        } else {
            accept(&e, d);
        }
        for _ in 0..2 {
            send(&e, 0, 8);
        }
        // Fill the peer's ring (it no longer receives), leave sends queued,
        // and post receives that will never be answered.
        for _ in 0..200 {
            e.vi.post_send(Box::new(Descriptor::send(&[e.buf.segment(0, 4000)])))
                .unwrap();
        }
        for _ in 0..3 {
            e.vi.post_recv(Box::new(Descriptor::recv(&[e.buf.segment(0, 64)])))
                .unwrap();
        }
        peer.kill();
        let start = Instant::now();
        let mut errors = 0;
        for _ in 0..3 {
            let r = e.vi.recv_wait(Some(T)).expect("every receive completes");
            assert!(r.error().is_some());
            errors += 1;
        }
        let mut sends = 0;
        while let Ok(s) = e.vi.send_wait(Some(Duration::from_millis(100))) {
            sends += 1;
            let _ = s.result();
        }
        assert_eq!(sends, 200, "every send comes back");
        assert_eq!(errors, 3);
        assert!(start.elapsed() < T, "noticed within the timeout");
        assert_eq!(e.vi.state(), ViState::Error);
        e.vi.disconnect();
        drop(e);
        assert!(
            leftovers(&inst).is_empty(),
            "{role} killed: left {:?}",
            leftovers(&inst)
        );
    }
}

/// Reads `len` bytes another process writes into `p`, byte by byte.
fn read_shared(p: *const u8, len: usize) -> Vec<u8> {
    // SAFETY: `p` points into a live region of at least `len` bytes; the
    // peer writes it concurrently, so every byte is read as it is now.
    (0..len)
        .map(|i| unsafe { std::ptr::read_volatile(p.add(i)) })
        .collect()
}

/// The target's side of the RDMA-write tests: accepts the initiator on
/// discriminator `d` and sends it where its buffer (the window) is; the
/// window's address and a control region for later messages.
fn offer_window(e: &End, d: u64) -> (*mut u8, MemoryRegion) {
    let mut ctl = e.nic.alloc_region(64, MemAttributes::new(e.ptag)).unwrap();
    accept(e, d);
    let window = e.buf.addr();
    ctl.as_mut_slice()[..8].copy_from_slice(&(window as u64).to_le_bytes());
    ctl.as_mut_slice()[8..12].copy_from_slice(&e.buf.handle().0.to_le_bytes());
    e.vi.post_send(Box::new(Descriptor::send(&[ctl.segment(0, 12)])))
        .unwrap();
    assert_eq!(e.vi.send_wait(Some(T)).unwrap().result(), Ok(12));
    (window, ctl)
}

/// The initiator's side of [`offer_window`]: the window's address and handle.
fn learn_window(e: &End) -> (u64, MemHandle) {
    assert_eq!(recv(e, 0, 64).result(), Ok(12));
    let s = e.buf.as_slice();
    let addr = u64::from_le_bytes(s[..8].try_into().unwrap());
    (
        addr,
        MemHandle(u32::from_le_bytes(s[8..12].try_into().unwrap())),
    )
}

/// Posts an RDMA write of 64 bytes of `pattern(64, seed)` to `addr` in `h`.
fn write_pattern(e: &mut End, addr: u64, h: MemHandle, seed: u8) -> Result<(), Rejected> {
    e.buf.as_mut_slice()[4096..4096 + 64].copy_from_slice(&pattern(64, seed));
    let wr = Descriptor::rdma_write(Segment::remote(addr, h), &[e.buf.segment(4096, 64)]);
    e.vi.post_send(Box::new(wr))
}

/// An RDMA write into a region whose earlier write the target placed is
/// placed by the initiator itself: it is complete at the post, while the
/// target makes no call at all (it watches its memory, as a one-sided
/// protocol does). Once the target deregisters the region, a write goes
/// back through the target's checks, fails, and the memory stays as it was.
#[test]
fn rdma_writes_complete_while_the_target_makes_no_call_and_stop_at_deregistration() {
    const ROUNDS: u8 = 100;
    if let Some(a) = peer_arg() {
        let inst = instance("");
        let e = end(&inst, |p| ViAttributes::new(p).rdma(true, false));
        let (window, ctl) = offer_window(&e, a.parse().unwrap());
        // No call from here until the last write has landed.
        let last = pattern(64, ROUNDS - 1);
        let start = Instant::now();
        while read_shared(window, 64) != last {
            assert!(start.elapsed() < T, "the last RDMA write never landed");
            std::hint::spin_loop();
        }
        e.nic.deregister_mem(e.buf.handle()).unwrap();
        e.vi.post_send(Box::new(Descriptor::send(&[ctl.segment(0, 1)])))
            .unwrap();
        assert_eq!(e.vi.send_wait(Some(T)).unwrap().result(), Ok(1));
        // The initiator's next write is refused here; the VI then fails.
        e.vi.post_recv(Box::new(Descriptor::recv(&[ctl.segment(0, 64)])))
            .unwrap();
        assert!(e.vi.recv_wait(Some(T)).unwrap().error().is_some());
        assert_eq!(e.vi.state(), ViState::Error);
        assert_eq!(
            read_shared(window, 64),
            last,
            "a write after deregistration landed"
        );
        return;
    }
    let inst = instance("direct");
    let _peer = Peer::spawn(
        "rdma_writes_complete_while_the_target_makes_no_call_and_stop_at_deregistration",
        &inst,
        "141",
    );
    let mut e = end(&inst, |p| ViAttributes::new(p).rdma(true, false));
    connect(&e, 141);
    let (addr, handle) = learn_window(&e);
    for k in 0..ROUNDS {
        write_pattern(&mut e, addr, handle, k).unwrap();
        if k == 0 {
            // The first goes through the ring: the target's agent places it
            // and grants the region.
            assert_eq!(e.vi.send_wait(Some(T)).unwrap().result(), Ok(64));
        } else {
            let d =
                e.vi.send_done()
                    .expect("a granted write completes at the post");
            assert_eq!(d.result(), Ok(64), "write {k}");
        }
    }
    // The target deregistered the region.
    assert_eq!(recv(&e, 0, 64).result(), Ok(1));
    write_pattern(&mut e, addr, handle, 200).unwrap();
    let d = e.vi.send_wait(Some(T)).unwrap();
    assert!(
        d.error().is_some(),
        "a write after deregistration completed: {d:?}"
    );
}

/// Once the connection broke (here on an RDMA write the target refuses),
/// a write into a window the target granted before neither lands nor
/// completes as done.
#[test]
fn a_granted_window_takes_no_write_after_the_connection_broke() {
    if let Some(a) = peer_arg() {
        let inst = instance("");
        let e = end(&inst, |p| ViAttributes::new(p).rdma(true, false));
        let (window, ctl) = offer_window(&e, a.parse().unwrap());
        // The refused write breaks the connection: this receive is flushed.
        e.vi.post_recv(Box::new(Descriptor::recv(&[ctl.segment(0, 64)])))
            .unwrap();
        assert!(e.vi.recv_wait(Some(T)).unwrap().error().is_some());
        // Give a write after the break every chance to land.
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(read_shared(window, 64), pattern(64, 1));
        return;
    }
    let inst = instance("broken");
    let _peer = Peer::spawn(
        "a_granted_window_takes_no_write_after_the_connection_broke",
        &inst,
        "142",
    );
    let mut e = end(&inst, |p| {
        ViAttributes::new(p)
            .rdma(true, false)
            .reliability(Reliability::ReliableDelivery)
    });
    connect(&e, 142);
    let (addr, handle) = learn_window(&e);
    // The first through the ring (granting the window), the second placed here.
    for seed in 0..2 {
        write_pattern(&mut e, addr, handle, seed).unwrap();
        assert_eq!(e.vi.send_wait(Some(T)).unwrap().result(), Ok(64));
    }
    // A write the target refuses: the connection breaks. The next write is
    // posted once the target has refused it, before this side has looked:
    // the post finds the target's report and is refused, or, taken, ends
    // with an error; either way it lands nowhere (the target's side looks).
    write_pattern(&mut e, addr, MemHandle(handle.0 ^ 0x5a5a), 9).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let later = write_pattern(&mut e, addr, handle, 7);
    assert!(e.vi.send_wait(Some(T)).unwrap().error().is_some());
    match later {
        Err(rej) => assert_eq!(rej.error, PostError::ViError),
        Ok(()) => {
            let d = e.vi.send_wait(Some(T)).unwrap();
            assert!(
                d.error().is_some(),
                "a write after the break completed: {d:?}"
            );
        }
    }
}
