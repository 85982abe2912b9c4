//! Multi-process behaviour of the shm provider. Every test runs two real
//! processes: the test re-runs its own binary as the peer (the peer branch
//! reads `UVIA_TEST_PEER`), in a socket directory of its own, and checks
//! afterwards that nothing is left behind there. Every wait is bounded.

mod common;

use common::*;
use std::time::Duration;
use uvia::*;

const MIB: usize = 1 << 20;

// ---------------------------------------------------------------------------
// 1. Every size class on every reliability level.
// ---------------------------------------------------------------------------

/// 0 and 1 B, 8 B, one line (56 B of payload), 57-64 B, the inline limit
/// and one past it, 4 KiB, 8 KiB and one past it, 64 KiB, 1 MiB.
const SIZES: &[usize] = &[
    0, 1, 8, 56, 57, 60, 64, 512, 513, 4096, 8192, 8193, 65536, MIB,
];

fn size_echo_peer(arg: &str) {
    let (lvl, d) = arg.split_once(':').unwrap();
    let level = level_from(lvl);
    let d: u64 = d.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic
        .create_vi(ViAttributes::new(ptag).reliability(level), None, None)
        .unwrap();
    let rbuf = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    let mut sbuf = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    post_recv(&vi, &rbuf, 0, MIB);
    accept(&nic, &vi, d);
    for (k, &n) in SIZES.iter().enumerate() {
        let got = recv_ok(&vi);
        assert_eq!(got, n, "{level:?}: peer got the size of class {k}");
        assert!(
            rbuf.as_slice()[..n] == pattern(n, k as u8)[..],
            "{level:?}: peer got the content of {n} B"
        );
        sbuf.as_mut_slice()[..n].copy_from_slice(&rbuf.as_slice()[..n]);
        if k + 1 < SIZES.len() {
            post_recv(&vi, &rbuf, 0, MIB);
        }
        assert_eq!(send(&vi, &sbuf, 0, n).result(), Ok(n as u32));
    }
    until_peer_leaves(&vi, &rbuf);
}

#[test]
fn send_recv_every_size_class() {
    if let Some(a) = peer_arg() {
        return size_echo_peer(&a);
    }
    let dir = SockDir::new("sizes");
    let base = disc_base(1);
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let mut sbuf = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    let rbuf = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    for level in levels() {
        let d = base + level_no(level) as u64;
        let peer = Peer::spawn(
            "send_recv_every_size_class",
            &dir,
            &format!("{}:{d}", level_no(level)),
        );
        let vi = nic
            .create_vi(ViAttributes::new(ptag).reliability(level), None, None)
            .unwrap();
        connect(&vi, d);
        for (k, &n) in SIZES.iter().enumerate() {
            let data = pattern(n, k as u8);
            sbuf.as_mut_slice()[..n].copy_from_slice(&data);
            post_recv(&vi, &rbuf, 0, MIB);
            let s = send(&vi, &sbuf, 0, n);
            assert_eq!(s.result(), Ok(n as u32), "{level:?}: send of {n} B");
            assert_eq!(s.cs.status & status::OP_MASK, status::OP_SEND);
            let r = vi.recv_wait(Some(T)).unwrap();
            assert_eq!(r.result(), Ok(n as u32), "{level:?}: echo of {n} B");
            assert_eq!(r.cs.status & status::OP_MASK, status::OP_RECEIVE);
            assert_eq!(r.immediate(), None);
            assert!(
                rbuf.as_slice()[..n] == data[..],
                "{level:?}: echoed content of {n} B"
            );
        }
        vi.disconnect();
        assert_eq!(vi.state(), ViState::Idle);
        peer.join();
    }
    drop(nic);
    dir.assert_empty("after both sides closed");
}

// ---------------------------------------------------------------------------
// 2. Scatter/gather: 3 segments from different regions into 2, and back.
// ---------------------------------------------------------------------------

/// (send segment lengths, receive segment lengths) of the peer's side.
const SG_CASES: &[([usize; 3], [usize; 2])] = &[
    ([100, 200, 150], [300, 300]),
    ([100_000, 3, 200_000], [150_000, 200_000]),
];

fn sg_peer(arg: &str) {
    let d: u64 = arg.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let r1 = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    // Caller memory: moved by cross-memory attach, not through a shared mapping.
    let mut heap = vec![0u8; MIB];
    // SAFETY: `heap` outlives the registration (deregistered below) and is
    // only read while no descriptor names it.
    let h2 = unsafe { nic.register_mem(heap.as_mut_ptr(), MIB, MemAttributes::new(ptag)) }.unwrap();
    accept(&nic, &vi, d);
    for (k, (sends, recvs)) in SG_CASES.iter().enumerate() {
        let total: usize = sends.iter().sum();
        let seg2 = Segment::local(unsafe { heap.as_ptr().add(1000) }, h2, recvs[1] as u32);
        vi.post_recv(Box::new(Descriptor::recv(&[
            r1.segment(4096, recvs[0]),
            seg2,
        ])))
        .unwrap();
        let got = recv_ok(&vi);
        assert_eq!(got, total, "case {k}: length");
        let mut data = r1.as_slice()[4096..4096 + recvs[0]].to_vec();
        data.extend_from_slice(&heap[1000..1000 + total - recvs[0]]);
        assert!(data == pattern(total, 40 + k as u8), "case {k}: byte order");
        assert!(
            heap[1000 + total - recvs[0]..1000 + recvs[1]]
                .iter()
                .all(|&b| b == 0),
            "case {k}: bytes past the message untouched"
        );
        // Back: gather from the same 2 segments (the received bytes, in order).
        let seg2 = Segment::local(
            unsafe { heap.as_ptr().add(1000) },
            h2,
            (total - recvs[0]) as u32,
        );
        vi.post_send(Box::new(Descriptor::send(&[
            r1.segment(4096, recvs[0]),
            seg2,
        ])))
        .unwrap();
        assert_eq!(vi.send_wait(Some(T)).unwrap().result(), Ok(total as u32));
        heap.iter_mut().for_each(|b| *b = 0);
    }
    until_peer_leaves(&vi, &r1);
    nic.deregister_mem(h2).unwrap();
}

#[test]
fn scatter_gather_three_segments_into_two() {
    if let Some(a) = peer_arg() {
        return sg_peer(&a);
    }
    let dir = SockDir::new("sg");
    let d = disc_base(2);
    let peer = Peer::spawn(
        "scatter_gather_three_segments_into_two",
        &dir,
        &d.to_string(),
    );
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let mut a = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    let mut c = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    let mut heap = vec![0u8; MIB];
    // SAFETY: `heap` outlives the registration and is not touched while posted.
    let hb = unsafe { nic.register_mem(heap.as_mut_ptr(), MIB, MemAttributes::new(ptag)) }.unwrap();
    connect(&vi, d);
    for (k, (sends, _)) in SG_CASES.iter().enumerate() {
        let total: usize = sends.iter().sum();
        let data = pattern(total, 40 + k as u8);
        let (l0, l1, l2) = (sends[0], sends[1], sends[2]);
        a.as_mut_slice()[64..64 + l0].copy_from_slice(&data[..l0]);
        heap[128..128 + l1].copy_from_slice(&data[l0..l0 + l1]);
        c.as_mut_slice()[..l2].copy_from_slice(&data[l0 + l1..]);
        // The echo comes back into 3 segments of other lengths.
        let back = [1usize, total - 11, 10];
        let mut back_a = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
        let back_c = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
        back_a.as_mut_slice().fill(0);
        vi.post_recv(Box::new(Descriptor::recv(&[
            back_a.segment(7, back[0]),
            back_a.segment(4096, back[1]),
            back_c.segment(0, back[2]),
        ])))
        .unwrap();
        let hseg = Segment::local(unsafe { heap.as_ptr().add(128) }, hb, l1 as u32);
        vi.post_send(Box::new(Descriptor::send(&[
            a.segment(64, l0),
            hseg,
            c.segment(0, l2),
        ])))
        .unwrap();
        assert_eq!(vi.send_wait(Some(T)).unwrap().result(), Ok(total as u32));
        assert_eq!(recv_ok(&vi), total, "case {k}: echo length");
        let mut got = back_a.as_slice()[7..8].to_vec();
        got.extend_from_slice(&back_a.as_slice()[4096..4096 + back[1]]);
        got.extend_from_slice(&back_c.as_slice()[..10]);
        assert!(got == data, "case {k}: echoed bytes in order");
    }
    vi.disconnect();
    peer.join();
    nic.deregister_mem(hb).unwrap();
    drop(heap);
    drop(vi);
    drop(nic);
    dir.assert_empty("after both sides closed");
}

// ---------------------------------------------------------------------------
// 3. Immediate data: with a send and with an RDMA write.
// ---------------------------------------------------------------------------

fn imm_peer(arg: &str) {
    let d: u64 = arg.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic
        .create_vi(ViAttributes::new(ptag).rdma(true, false), None, None)
        .unwrap();
    let rbuf = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    let target = nic
        .alloc_region(65536, MemAttributes::new(ptag).rdma_write(true))
        .unwrap();
    let mut sbuf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    for i in 0..5 {
        post_recv(&vi, &rbuf, i * 200_000, 200_000);
    }
    accept(&nic, &vi, d);
    sbuf.as_mut_slice()[..12].copy_from_slice(&encode_remote(target.remote(0)));
    vi.post_send(Box::new(
        Descriptor::send(&[sbuf.segment(0, 12)]).with_immediate(42),
    ))
    .unwrap();
    assert_eq!(vi.send_wait(Some(T)).unwrap().result(), Ok(12));

    let r = vi.recv_wait(Some(T)).unwrap();
    assert_eq!(r.result(), Ok(40));
    assert_eq!(r.immediate(), Some(0xdead_beef), "small send's immediate");
    assert_eq!(r.cs.status & status::OP_MASK, status::OP_RECEIVE);
    assert!(rbuf.as_slice()[..40] == pattern(40, 1)[..]);

    let r = vi.recv_wait(Some(T)).unwrap();
    assert_eq!(r.result(), Ok(100_000));
    assert_eq!(r.immediate(), Some(7), "large send's immediate");
    assert!(rbuf.as_slice()[200_000..300_000] == pattern(100_000, 2)[..]);

    let r = vi.recv_wait(Some(T)).unwrap();
    assert_eq!(r.result(), Ok(8));
    assert_eq!(r.immediate(), None, "a send without immediate data");
    assert_eq!(r.cs.status & status::IMMEDIATE, 0);

    // The RDMA write without immediate data consumed no receive; the one
    // with immediate data consumed exactly one.
    let r = vi.recv_wait(Some(T)).unwrap();
    assert_eq!(
        r.error(),
        None,
        "RDMA write with immediate: {:?}",
        r.error()
    );
    assert_eq!(
        r.cs.status & status::OP_MASK,
        status::OP_REMOTE_RDMA_WRITE,
        "status {:#x}",
        r.cs.status
    );
    assert_eq!(r.immediate(), Some(0x1234));
    assert!(target.as_slice()[..1000] == pattern(1000, 4)[..]);
    assert!(target.as_slice()[2000..2500] == pattern(500, 5)[..]);
    assert!(target.as_slice()[1000..2000].iter().all(|&b| b == 0));
    assert!(rbuf.as_slice()[600_000..600_100].iter().all(|&b| b == 0));

    let r = vi.recv_wait(Some(T)).unwrap();
    assert_eq!(r.result(), Ok(4));
    assert_eq!(r.cs.status & status::OP_MASK, status::OP_RECEIVE);
    assert_eq!(&rbuf.as_slice()[800_000..800_004], b"done");
    until_peer_leaves(&vi, &rbuf);
}

#[test]
fn immediate_data_with_send_and_rdma_write() {
    if let Some(a) = peer_arg() {
        return imm_peer(&a);
    }
    let dir = SockDir::new("imm");
    let d = disc_base(3);
    let peer = Peer::spawn(
        "immediate_data_with_send_and_rdma_write",
        &dir,
        &d.to_string(),
    );
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let mut s = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    let r = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    post_recv(&vi, &r, 0, 64);
    connect(&vi, d);
    let info = vi.recv_wait(Some(T)).unwrap();
    assert_eq!(info.result(), Ok(12));
    assert_eq!(
        info.immediate(),
        Some(42),
        "immediate data towards the client"
    );
    let remote = decode_remote(&r.as_slice()[..12]);

    let mut send_imm = |len: usize, seed: u8, imm: Option<u32>| {
        s.as_mut_slice()[..len].copy_from_slice(&pattern(len, seed));
        let mut dsc = Descriptor::send(&[s.segment(0, len)]);
        if let Some(v) = imm {
            dsc = dsc.with_immediate(v);
        }
        vi.post_send(Box::new(dsc)).unwrap();
        assert_eq!(vi.send_wait(Some(T)).unwrap().result(), Ok(len as u32));
    };
    send_imm(40, 1, Some(0xdead_beef));
    send_imm(100_000, 2, Some(7));
    send_imm(8, 3, None);

    s.as_mut_slice()[..500].copy_from_slice(&pattern(500, 5));
    let w = Descriptor::rdma_write(
        Segment::remote(remote.addr + 2000, remote.handle),
        &[s.segment(0, 500)],
    );
    vi.post_send(Box::new(w)).unwrap();
    let w = vi.send_wait(Some(T)).unwrap();
    assert_eq!(w.result(), Ok(500));
    assert_eq!(w.cs.status & status::OP_MASK, status::OP_RDMA_WRITE);

    s.as_mut_slice()[4096..5096].copy_from_slice(&pattern(1000, 4));
    let w = Descriptor::rdma_write(remote, &[s.segment(4096, 1000)]).with_immediate(0x1234);
    vi.post_send(Box::new(w)).unwrap();
    assert_eq!(vi.send_wait(Some(T)).unwrap().result(), Ok(1000));

    s.as_mut_slice()[..4].copy_from_slice(b"done");
    assert_eq!(send(&vi, &s, 0, 4).result(), Ok(4));
    vi.disconnect();
    peer.join();
    drop((vi, s, r, nic));
    dir.assert_empty("after both sides closed");
}

// ---------------------------------------------------------------------------
// 4. RDMA write and read, small and 1 MiB.
// ---------------------------------------------------------------------------

fn rdma_peer(arg: &str) {
    let d: u64 = arg.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic
        .create_vi(ViAttributes::new(ptag).rdma(true, true), None, None)
        .unwrap();
    let mut target = nic
        .alloc_region(
            4 * MIB,
            MemAttributes::new(ptag).rdma_write(true).rdma_read(true),
        )
        .unwrap();
    target.as_mut_slice()[2 * MIB..3 * MIB].copy_from_slice(&pattern(MIB, 9));
    target.as_mut_slice()[3 * MIB..3 * MIB + 100].copy_from_slice(&pattern(100, 10));
    let mut sbuf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    let rbuf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    post_recv(&vi, &rbuf, 0, 64);
    accept(&nic, &vi, d);
    send_bytes(&vi, &mut sbuf, 0, &encode_remote(target.remote(0)));
    // The target makes progress (serves the RDMA requests) while it waits
    // for the initiator's final message.
    assert_eq!(recv_ok(&vi), 4);
    assert_eq!(&rbuf.as_slice()[..4], b"done");
    let t = target.as_slice();
    assert!(t[..100] == pattern(100, 11)[..], "small RDMA write landed");
    assert!(t[100..MIB].iter().all(|&b| b == 0), "nothing past it");
    assert!(
        t[MIB..2 * MIB] == pattern(MIB, 12)[..],
        "1 MiB RDMA write landed"
    );
    assert!(
        t[2 * MIB..3 * MIB] == pattern(MIB, 9)[..],
        "read source intact"
    );
    until_peer_leaves(&vi, &rbuf);
}

#[test]
fn rdma_write_and_read_small_and_1mib() {
    if let Some(a) = peer_arg() {
        return rdma_peer(&a);
    }
    let dir = SockDir::new("rdma");
    let d = disc_base(4);
    let peer = Peer::spawn("rdma_write_and_read_small_and_1mib", &dir, &d.to_string());
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let mut small = nic.alloc_region(4096, MemAttributes::new(ptag)).unwrap();
    let rbuf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    // The 1 MiB source and destination are caller memory (cross-memory attach).
    let mut big = pattern(MIB, 12);
    let mut big_dst = vec![0u8; MIB];
    // SAFETY: both vectors outlive their registrations and are not touched while posted.
    let (hb, hd) = unsafe {
        (
            nic.register_mem(big.as_mut_ptr(), MIB, MemAttributes::new(ptag))
                .unwrap(),
            nic.register_mem(big_dst.as_mut_ptr(), MIB, MemAttributes::new(ptag))
                .unwrap(),
        )
    };
    post_recv(&vi, &rbuf, 0, 64);
    connect(&vi, d);
    assert_eq!(recv_ok(&vi), 12);
    let remote = decode_remote(&rbuf.as_slice()[..12]);
    let at = |off: usize| Segment::remote(remote.addr + off as u64, remote.handle);

    small.as_mut_slice()[..100].copy_from_slice(&pattern(100, 11));
    vi.post_send(Box::new(Descriptor::rdma_write(
        at(0),
        &[small.segment(0, 100)],
    )))
    .unwrap();
    assert_eq!(vi.send_wait(Some(T)).unwrap().result(), Ok(100));

    vi.post_send(Box::new(Descriptor::rdma_write(
        at(MIB),
        &[Segment::local(big.as_ptr(), hb, MIB as u32)],
    )))
    .unwrap();
    assert_eq!(vi.send_wait(Some(T)).unwrap().result(), Ok(MIB as u32));

    vi.post_send(Box::new(Descriptor::rdma_read(
        at(3 * MIB),
        &[small.segment(1000, 100)],
    )))
    .unwrap();
    let r = vi.send_wait(Some(T)).unwrap();
    assert_eq!(r.result(), Ok(100));
    assert_eq!(r.cs.status & status::OP_MASK, status::OP_RDMA_READ);
    assert!(small.as_slice()[1000..1100] == pattern(100, 10)[..]);

    vi.post_send(Box::new(Descriptor::rdma_read(
        at(2 * MIB),
        &[Segment::local(big_dst.as_ptr(), hd, MIB as u32)],
    )))
    .unwrap();
    assert_eq!(vi.send_wait(Some(T)).unwrap().result(), Ok(MIB as u32));
    assert!(big_dst == pattern(MIB, 9), "1 MiB RDMA read");

    small.as_mut_slice()[..4].copy_from_slice(b"done");
    assert_eq!(send(&vi, &small, 0, 4).result(), Ok(4));
    vi.disconnect();
    peer.join();
    nic.deregister_mem(hb).unwrap();
    nic.deregister_mem(hd).unwrap();
    drop((vi, small, rbuf, nic));
    dir.assert_empty("after both sides closed");
}
