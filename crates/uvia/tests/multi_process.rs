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

// ---------------------------------------------------------------------------
// 5. RDMA protection, checked on the target.
// ---------------------------------------------------------------------------

/// (what, write?, target VI allows write, target VI allows read)
const PROT_CASES: &[(&str, bool, bool, bool)] = &[
    ("write to a region without the enable bit", true, true, true),
    (
        "read from a region without the enable bit",
        false,
        true,
        true,
    ),
    ("write with a bad memory handle", true, true, true),
    ("write out of the region's bounds", true, true, true),
    ("read out of the region's bounds", false, true, true),
    ("write to a region under another ptag", true, true, true),
    (
        "write to a VI without RDMA write enabled",
        true,
        false,
        true,
    ),
    (
        "read from a VI without RDMA read enabled",
        false,
        true,
        false,
    ),
    ("1 MiB write out of the region's bounds", true, true, true),
];

fn prot_peer(arg: &str) {
    let base: u64 = arg.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let other = nic.create_ptag().unwrap();
    let all = |p| MemAttributes::new(p).rdma_write(true).rdma_read(true);
    let mut ok = nic.alloc_region(4096, all(ptag)).unwrap();
    let mut noen = nic.alloc_region(4096, MemAttributes::new(ptag)).unwrap();
    let mut foreign = nic.alloc_region(4096, all(other)).unwrap();
    ok.as_mut_slice().copy_from_slice(&pattern(4096, 1));
    noen.as_mut_slice().copy_from_slice(&pattern(4096, 2));
    foreign.as_mut_slice().copy_from_slice(&pattern(4096, 3));
    let mut sbuf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    let rbuf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    for (i, &(what, _, w, r)) in PROT_CASES.iter().enumerate() {
        let vi = nic
            .create_vi(ViAttributes::new(ptag).rdma(w, r), None, None)
            .unwrap();
        accept(&nic, &vi, base + i as u64);
        let mut info = encode_remote(ok.remote(0)).to_vec();
        info.extend_from_slice(&encode_remote(noen.remote(0)));
        info.extend_from_slice(&encode_remote(foreign.remote(0)));
        send_bytes(&vi, &mut sbuf, 0, &info);
        // Wait (and so serve the request) until the connection ends: the
        // refused request breaks it, or the initiator disconnects.
        post_recv(&vi, &rbuf, 0, 64);
        let d = vi.recv_wait(Some(T)).unwrap();
        assert!(d.error().is_some(), "{what}: no message was expected");
        vi.disconnect();
        assert!(
            ok.as_slice() == pattern(4096, 1),
            "{what}: target memory untouched"
        );
        assert!(
            noen.as_slice() == pattern(4096, 2),
            "{what}: target memory untouched"
        );
        assert!(
            foreign.as_slice() == pattern(4096, 3),
            "{what}: target memory untouched"
        );
    }
}

#[test]
fn rdma_protection_is_enforced_on_the_target() {
    if let Some(a) = peer_arg() {
        return prot_peer(&a);
    }
    let dir = SockDir::new("prot");
    let base = disc_base(5);
    let peer = Peer::spawn(
        "rdma_protection_is_enforced_on_the_target",
        &dir,
        &base.to_string(),
    );
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let mut src = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    src.as_mut_slice().fill(0xee);
    let dst = nic.alloc_region(4096, MemAttributes::new(ptag)).unwrap();
    let rbuf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    for (i, &(what, write, _, _)) in PROT_CASES.iter().enumerate() {
        let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
        post_recv(&vi, &rbuf, 0, 64);
        connect(&vi, base + i as u64);
        assert_eq!(recv_ok(&vi), 36);
        let b = rbuf.as_slice();
        let (ok, noen, foreign) = (
            decode_remote(&b[..12]),
            decode_remote(&b[12..24]),
            decode_remote(&b[24..36]),
        );
        let (remote, len) = match i {
            0 | 1 => (noen, 100),
            2 => (Segment::remote(ok.addr, MemHandle(0x7ffe_0003)), 100),
            3 => (Segment::remote(ok.addr + 4096 - 10, ok.handle), 50),
            4 => (Segment::remote(ok.addr + 4000, ok.handle), 200),
            5 => (foreign, 100),
            6 | 7 => (ok, 100),
            8 => (Segment::remote(ok.addr + 2048, ok.handle), MIB),
            _ => unreachable!(),
        };
        let d = if write {
            Descriptor::rdma_write(remote, &[src.segment(0, len)])
        } else {
            Descriptor::rdma_read(remote, &[dst.segment(0, len)])
        };
        vi.post_send(Box::new(d)).unwrap();
        let c = vi.send_wait(Some(T)).unwrap();
        assert_eq!(
            c.error(),
            Some(CompletionError::RdmaProtection),
            "{what}: status {:#x}",
            c.cs.status
        );
        assert!(
            dst.as_slice().iter().all(|&b| b == 0),
            "{what}: nothing read"
        );
        vi.disconnect();
    }
    peer.join();
    drop(nic);
    dir.assert_empty("after both sides closed");
}

// ---------------------------------------------------------------------------
// 6. One CQ for the receive queues of several VIs; its eventfd.
// ---------------------------------------------------------------------------

fn cq_peer(arg: &str) {
    let base: u64 = arg.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let mut sbuf = nic.alloc_region(8192, MemAttributes::new(ptag)).unwrap();
    let rbuf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    let vis: Vec<Vi> = (0..3)
        .map(|_| nic.create_vi(ViAttributes::new(ptag), None, None).unwrap())
        .collect();
    post_recv(&vis[0], &rbuf, 0, 64);
    for (i, vi) in vis.iter().enumerate() {
        accept(&nic, vi, base + i as u64);
    }
    for i in [2usize, 0, 1] {
        let len = 100 + 1000 * i;
        send_bytes(&vis[i], &mut sbuf, 0, &pattern(len, i as u8));
    }
    // Wait for the go-ahead, then send once more on VI 1.
    assert_eq!(recv_ok(&vis[0]), 2);
    assert_eq!(&rbuf.as_slice()[..2], b"go");
    send_bytes(&vis[1], &mut sbuf, 0, b"late");
    for vi in &vis {
        until_peer_leaves(vi, &rbuf);
    }
}

#[test]
fn cq_with_several_vis_and_its_eventfd() {
    if let Some(a) = peer_arg() {
        return cq_peer(&a);
    }
    let dir = SockDir::new("cq");
    let base = disc_base(6);
    let peer = Peer::spawn(
        "cq_with_several_vis_and_its_eventfd",
        &dir,
        &base.to_string(),
    );
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let cq = nic.create_cq(16).unwrap();
    let rbuf = nic
        .alloc_region(3 * 8192, MemAttributes::new(ptag))
        .unwrap();
    let mut sbuf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    let vis: Vec<Vi> = (0..3)
        .map(|_| {
            nic.create_vi(ViAttributes::new(ptag), None, Some(&cq))
                .unwrap()
        })
        .collect();
    for (i, vi) in vis.iter().enumerate() {
        post_recv(vi, &rbuf, i * 8192, 8192);
        connect(vi, base + i as u64);
    }
    let mut seen = Vec::new();
    for _ in 0..3 {
        let n = cq.wait(Some(T)).unwrap();
        assert_eq!(n.queue, Queue::Recv);
        let i = vis
            .iter()
            .position(|v| v.id() == n.vi.id())
            .expect("a notice names one of the VIs");
        assert!(!seen.contains(&i), "one notice per VI");
        seen.push(i);
        let d = n.vi.recv_done().expect("the notice's descriptor is done");
        let len = 100 + 1000 * i;
        assert_eq!(d.result(), Ok(len as u32));
        assert!(rbuf.as_slice()[i * 8192..i * 8192 + len] == pattern(len, i as u8)[..]);
    }
    assert!(cq.done().unwrap().is_none(), "no more notices");
    assert_eq!(
        vis[0]
            .recv_wait(Some(Duration::from_millis(1)))
            .unwrap_err(),
        WaitError::BoundToCq
    );

    // The eventfd: armed, not readable until a message arrives.
    // As documented: drain the fd (earlier waits may have left wake-ups in
    // it), see `done` return None, then arm.
    post_recv(&vis[1], &rbuf, 8192, 64);
    cq.drain_eventfd();
    assert!(cq.done().unwrap().is_none());
    assert!(!cq.arm(), "nothing is pending yet");
    let mut pfd = libc::pollfd {
        fd: cq.eventfd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    assert_eq!(unsafe { libc::poll(&mut pfd, 1, 0) }, 0, "not readable yet");
    send_bytes(&vis[0], &mut sbuf, 0, b"go");
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::poll(&mut pfd, 1, T.as_millis() as i32) },
        1,
        "readable once the message arrived"
    );
    assert_ne!(pfd.revents & libc::POLLIN, 0);
    cq.drain_eventfd();
    let n = cq.wait(Some(T)).unwrap();
    assert_eq!((n.vi.id(), n.queue), (vis[1].id(), Queue::Recv));
    assert_eq!(vis[1].recv_done().unwrap().result(), Ok(4));
    assert_eq!(&rbuf.as_slice()[8192..8196], b"late");
    for vi in &vis {
        vi.disconnect();
    }
    peer.join();
    drop((vis, cq, nic));
    dir.assert_empty("after both sides closed");
}

// ---------------------------------------------------------------------------
// 7. Blocking waits: timeouts, and sleeping instead of spinning.
// ---------------------------------------------------------------------------

const PINGS: usize = 30;

fn ping_len(i: usize) -> usize {
    [8, 4096, 100_000][i % 3]
}

fn blocking_peer(arg: &str) {
    let d: u64 = arg.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic
        .create_vi(
            ViAttributes::new(ptag).reliability(Reliability::ReliableReception),
            None,
            None,
        )
        .unwrap();
    vi.set_wait_spin(Duration::ZERO);
    let rbuf = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    let mut sbuf = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    post_recv(&vi, &rbuf, 0, MIB);
    accept(&nic, &vi, d);
    assert_eq!(recv_ok(&vi), 2, "the go-ahead");
    // Make the other side go to sleep before the first reply.
    std::thread::sleep(Duration::from_millis(100));
    for i in 0..PINGS {
        post_recv(&vi, &rbuf, 0, MIB);
        let n = ping_len(i);
        send_bytes(&vi, &mut sbuf, 0, &pattern(n, i as u8));
        assert_eq!(recv_ok(&vi), n);
        assert!(rbuf.as_slice()[..n] == pattern(n, 100 + i as u8)[..]);
    }
    until_peer_leaves(&vi, &rbuf);
}

#[test]
fn blocking_waits_time_out_and_wake_up() {
    if let Some(a) = peer_arg() {
        return blocking_peer(&a);
    }
    let dir = SockDir::new("blocking");
    let d = disc_base(7);
    let peer = Peer::spawn("blocking_waits_time_out_and_wake_up", &dir, &d.to_string());
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let vi = nic
        .create_vi(
            ViAttributes::new(ptag).reliability(Reliability::ReliableReception),
            None,
            None,
        )
        .unwrap();
    let rbuf = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    let mut sbuf = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    connect(&vi, d);
    post_recv(&vi, &rbuf, 0, MIB);
    assert_eq!(
        vi.recv_wait(Some(Duration::from_millis(50))).unwrap_err(),
        WaitError::Timeout,
        "nothing is coming"
    );
    assert_eq!(
        vi.send_wait(Some(Duration::from_millis(50))).unwrap_err(),
        WaitError::Timeout,
        "nothing was sent"
    );
    assert_eq!(vi.state(), ViState::Connected, "a timeout changes nothing");
    vi.set_wait_spin(Duration::ZERO);
    assert_eq!(
        vi.recv_wait(Some(Duration::from_millis(50))).unwrap_err(),
        WaitError::Timeout,
        "nothing is coming (blocking mode)"
    );
    send_bytes(&vi, &mut sbuf, 0, b"go");
    for i in 0..PINGS {
        let n = ping_len(i);
        assert_eq!(recv_ok(&vi), n, "ping {i}");
        assert!(rbuf.as_slice()[..n] == pattern(n, i as u8)[..]);
        if i + 1 < PINGS {
            post_recv(&vi, &rbuf, 0, MIB);
        }
        send_bytes(&vi, &mut sbuf, 0, &pattern(n, 100 + i as u8));
    }
    vi.disconnect();
    peer.join();
    drop((vi, nic));
    dir.assert_empty("after both sides closed");
}

// ---------------------------------------------------------------------------
// 8. Bad inputs: a clear error, the descriptor back, nothing lost.
// ---------------------------------------------------------------------------

fn bad_posts_peer(arg: &str) {
    let d: u64 = arg.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let rbuf = nic.alloc_region(4096, MemAttributes::new(ptag)).unwrap();
    post_recv(&vi, &rbuf, 0, 4096);
    accept(&nic, &vi, d);
    // Exactly one message: nothing of the refused posts went out.
    assert_eq!(recv_ok(&vi), 100);
    assert!(rbuf.as_slice()[..100] == pattern(100, 77)[..]);
    until_peer_leaves(&vi, &rbuf);
}

#[test]
fn bad_posts_are_rejected_and_the_vi_stays_usable() {
    if let Some(a) = peer_arg() {
        return bad_posts_peer(&a);
    }
    let dir = SockDir::new("badpost");
    let d = disc_base(8);
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let other = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let mut buf = nic.alloc_region(4096, MemAttributes::new(ptag)).unwrap();
    let foreign = nic.alloc_region(4096, MemAttributes::new(other)).unwrap();
    let rbuf = nic.alloc_region(4096, MemAttributes::new(ptag)).unwrap();

    // Not connected yet.
    let seg = buf.segment(0, 8);
    let rej = vi
        .post_send(Box::new(Descriptor::send(&[seg]).with_immediate(5)))
        .unwrap_err();
    assert_eq!(rej.error, PostError::NotConnected(ViState::Idle));
    assert_eq!(rej.descriptor.ds[0], seg, "the same descriptor comes back");
    assert_eq!(rej.descriptor.cs.immediate_data, 5);
    assert!(!rej.error.to_string().is_empty());

    let peer = Peer::spawn(
        "bad_posts_are_rejected_and_the_vi_stays_usable",
        &dir,
        &d.to_string(),
    );
    connect(&vi, d);
    let bogus = Segment::local(buf.addr(), MemHandle(0x7ffd_0042), 8);
    let beyond = buf.segment(4000, 200);
    let wrong = foreign.segment(0, 8);
    type Check = fn(&PostError) -> bool;
    let cases: [(&str, Segment, Check); 3] = [
        ("unregistered memory", bogus, |e| {
            matches!(
                e,
                PostError::Segment {
                    index: 0,
                    error: AccessError::NotRegistered(0x7ffd_0042)
                }
            )
        }),
        ("segment beyond its region", beyond, |e| {
            matches!(
                e,
                PostError::Segment {
                    index: 0,
                    error: AccessError::OutOfBounds { .. }
                }
            )
        }),
        ("region under another ptag", wrong, |e| {
            matches!(
                e,
                PostError::Segment {
                    index: 0,
                    error: AccessError::WrongPtag { .. }
                }
            )
        }),
    ];
    for (what, bad, check) in cases {
        for (q, post) in [
            (
                "send",
                Vi::post_send as fn(&Vi, Box<Descriptor>) -> Result<(), Rejected>,
            ),
            ("recv", Vi::post_recv),
        ] {
            let rej = post(&vi, Box::new(Descriptor::send(&[bad]))).unwrap_err();
            assert!(check(&rej.error), "{q} {what}: {:?}", rej.error);
            assert!(!rej.error.to_string().is_empty());
            assert_eq!(rej.descriptor.ds[0], bad, "{q} {what}: descriptor back");
            assert_eq!(rej.descriptor.cs.seg_count, 1);
            assert_eq!(rej.descriptor.cs.status, 0, "{q} {what}: not completed");
            assert_eq!(vi.state(), ViState::Connected, "{q} {what}");
            // A bad segment after good ones names its index.
            let rej = post(
                &vi,
                Box::new(Descriptor::send(&[
                    buf.segment(0, 4),
                    buf.segment(4, 4),
                    bad,
                ])),
            )
            .unwrap_err();
            assert!(
                matches!(rej.error, PostError::Segment { index: 2, .. }),
                "{q} {what} as third segment: {:?}",
                rej.error
            );
        }
    }
    let rej = vi
        .post_send(Box::new(Descriptor::send(&[buf.segment(0, 1); 7])))
        .unwrap_err();
    assert!(matches!(rej.error, PostError::Format(_)), "{:?}", rej.error);
    assert!(vi.send_done().is_none(), "nothing was queued");
    assert!(vi.recv_done().is_none(), "nothing was queued");

    // A good post goes through, and is the only message the peer gets.
    post_recv(&vi, &rbuf, 0, 64);
    send_bytes(&vi, &mut buf, 0, &pattern(100, 77));
    vi.disconnect();
    let flushed = vi.recv_done().expect("disconnect completes the receive");
    assert_eq!(flushed.error(), Some(CompletionError::Flushed));
    peer.join();
    drop((vi, nic));
    dir.assert_empty("after both sides closed");
}

/// (sent bytes, receive buffer bytes): inline and by reference.
const SHORT_CASES: &[(usize, usize)] = &[(64, 16), (4096, 1024)];

fn short_peer(arg: &str) {
    let base: u64 = arg.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let rbuf = nic.alloc_region(8192, MemAttributes::new(ptag)).unwrap();
    let mut keep = Vec::new();
    let mut i = 0;
    for level in levels() {
        for &(n, room) in SHORT_CASES {
            let what = format!("{level:?}, {n} B into {room} B");
            let vi = nic
                .create_vi(ViAttributes::new(ptag).reliability(level), None, None)
                .unwrap();
            post_recv(&vi, &rbuf, 0, room);
            accept(&nic, &vi, base + i);
            i += 1;
            let r = vi.recv_wait(Some(T)).unwrap();
            assert_eq!(r.error(), Some(CompletionError::Length), "{what}");
            assert_eq!(r.cs.status & status::OP_MASK, status::OP_RECEIVE, "{what}");
            if level == Reliability::Unreliable {
                assert_eq!(vi.state(), ViState::Connected, "{what}: unreliable goes on");
                post_recv(&vi, &rbuf, 0, 8192);
                assert_eq!(recv_ok(&vi), 8, "{what}: the next message");
                assert_eq!(&rbuf.as_slice()[..8], b"followup");
                until_peer_leaves(&vi, &rbuf);
            } else {
                assert_eq!(vi.state(), ViState::Error, "{what}: reliable breaks");
                assert_eq!(
                    vi.post_recv(Box::new(Descriptor::recv(&[rbuf.segment(0, 64)])))
                        .unwrap_err()
                        .error,
                    PostError::ViError
                );
            }
            // Kept open until the initiator has seen the outcome.
            keep.push(vi);
        }
    }
    let last = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    accept(&nic, &last, base + 100);
    until_peer_leaves(&last, &rbuf);
}

#[test]
fn short_receive_buffer_is_a_length_error() {
    if let Some(a) = peer_arg() {
        return short_peer(&a);
    }
    let dir = SockDir::new("short");
    let base = disc_base(9);
    let peer = Peer::spawn(
        "short_receive_buffer_is_a_length_error",
        &dir,
        &base.to_string(),
    );
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let mut sbuf = nic.alloc_region(8192, MemAttributes::new(ptag)).unwrap();
    let rbuf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    let mut i = 0;
    for level in levels() {
        for &(n, room) in SHORT_CASES {
            let what = format!("{level:?}, {n} B into {room} B");
            let vi = nic
                .create_vi(ViAttributes::new(ptag).reliability(level), None, None)
                .unwrap();
            post_recv(&vi, &rbuf, 0, 64);
            connect(&vi, base + i);
            i += 1;
            sbuf.as_mut_slice()[..n].copy_from_slice(&pattern(n, 3));
            let s = send(&vi, &sbuf, 0, n);
            match level {
                Reliability::Unreliable => {
                    assert_eq!(s.result(), Ok(n as u32), "{what}: sender unaware");
                    send_bytes(&vi, &mut sbuf, 0, b"followup");
                    assert_eq!(vi.state(), ViState::Connected, "{what}");
                    vi.disconnect();
                    continue;
                }
                // Reliable delivery may complete an inline send when the
                // message is handed over, before the receiver has looked.
                Reliability::ReliableDelivery if n <= nic.attributes().inline_threshold => {
                    assert!(
                        matches!(s.result(), Ok(_) | Err(CompletionError::RemoteDescriptor)),
                        "{what}: {:?}",
                        s.result()
                    );
                }
                _ => assert_eq!(
                    s.error(),
                    Some(CompletionError::RemoteDescriptor),
                    "{what}: status {:#x}",
                    s.cs.status
                ),
            }
            // Either way the connection is broken on both sides: the
            // sender's outstanding receive comes back with an error.
            let r = vi
                .recv_wait(Some(T))
                .unwrap_or_else(|e| panic!("{what}: sender's receive: {e}; VI {:?}", vi.state()));
            assert!(
                matches!(
                    r.error(),
                    Some(CompletionError::Flushed | CompletionError::Transport)
                ),
                "{what}: sender's receive {:?}",
                r.result()
            );
            assert_eq!(vi.state(), ViState::Error, "{what}: sender's VI");
            vi.disconnect();
            assert_eq!(vi.state(), ViState::Idle);
        }
    }
    let last = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    connect(&last, base + 100);
    last.disconnect();
    peer.join();
    drop((last, nic));
    dir.assert_empty("after both sides closed");
}

fn conn_err_peer(arg: &str) {
    let d: u64 = arg.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let rbuf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    // 1: reject.
    let mut req = nic.connect_wait(&disc(d), Some(T)).unwrap();
    assert_eq!(
        req.remote_attributes().reliability,
        Reliability::ReliableReception
    );
    assert_eq!(req.discriminator(), &disc(d));
    req.reject().unwrap();
    assert!(matches!(req.reject(), Err(ConnectError::Answered)));
    // 2: reliability mismatch (this VI is unreliable, the client's reliable reception).
    let unrel = nic
        .create_vi(
            ViAttributes::new(ptag).reliability(Reliability::Unreliable),
            None,
            None,
        )
        .unwrap();
    let mut req = nic.connect_wait(&disc(d), Some(T)).unwrap();
    let e = req.accept(&unrel).unwrap_err();
    assert!(matches!(e, ConnectError::Mismatch(_)), "{e}");
    assert_eq!(unrel.state(), ViState::Idle);
    // 3: the same level: accepted.
    let vi = nic
        .create_vi(
            ViAttributes::new(ptag).reliability(Reliability::ReliableReception),
            None,
            None,
        )
        .unwrap();
    let mut req = nic.connect_wait(&disc(d), Some(T)).unwrap();
    req.accept(&vi).unwrap();
    assert!(matches!(req.accept(&vi), Err(ConnectError::Answered)));
    until_peer_leaves(&vi, &rbuf);
}

#[test]
fn connection_errors_no_listener_rejected_mismatch() {
    if let Some(a) = peer_arg() {
        return conn_err_peer(&a);
    }
    let dir = SockDir::new("connerr");
    let d = disc_base(10);
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let vi = nic
        .create_vi(
            ViAttributes::new(ptag).reliability(Reliability::ReliableReception),
            None,
            None,
        )
        .unwrap();
    // Nobody listens.
    let e = vi
        .connect_request(
            &NetAddress::new("0", disc(d + 99)),
            Duration::from_millis(200),
        )
        .unwrap_err();
    assert!(matches!(e, ConnectError::NoListener { .. }), "{e}");
    assert_eq!(vi.state(), ViState::Idle);
    dir.assert_empty("after a connect to nobody");

    let peer = Peer::spawn(
        "connection_errors_no_listener_rejected_mismatch",
        &dir,
        &d.to_string(),
    );
    let addr = NetAddress::new("0", disc(d));
    let e = vi.connect_request(&addr, T).unwrap_err();
    assert!(matches!(e, ConnectError::Rejected), "{e}");
    assert_eq!(vi.state(), ViState::Idle, "a rejected VI is idle again");
    // The server's VI has another reliability level: refused. (The server's
    // accept reports Mismatch; the client learns of a refusal.)
    let e = vi.connect_request(&addr, T).unwrap_err();
    assert!(
        matches!(e, ConnectError::Mismatch(_) | ConnectError::Rejected),
        "{e}"
    );
    assert_eq!(vi.state(), ViState::Idle);
    let remote = vi.connect_request(&addr, T).unwrap();
    assert_eq!(remote.reliability, Reliability::ReliableReception);
    assert_eq!(vi.state(), ViState::Connected);
    assert!(matches!(
        vi.connect_request(&addr, T),
        Err(ConnectError::InvalidState(ViState::Connected))
    ));
    vi.disconnect();
    peer.join();
    drop((vi, nic));
    dir.assert_empty("after both sides closed");
}

/// The client side of a reliability mismatch: the client's own check.
fn mismatch_client_peer(arg: &str) {
    let d: u64 = arg.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic
        .create_vi(
            ViAttributes::new(ptag).reliability(Reliability::Unreliable),
            None,
            None,
        )
        .unwrap();
    let e = vi
        .connect_request(&NetAddress::new("0", disc(d)), T)
        .unwrap_err();
    assert!(matches!(e, ConnectError::Mismatch(_)), "client side: {e}");
    assert_eq!(vi.state(), ViState::Idle);
}

#[test]
fn reliability_mismatch_is_reported_to_the_client() {
    if let Some(a) = peer_arg() {
        return mismatch_client_peer(&a);
    }
    let dir = SockDir::new("mismatch");
    let d = disc_base(11);
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let vi = nic
        .create_vi(
            ViAttributes::new(ptag).reliability(Reliability::ReliableDelivery),
            None,
            None,
        )
        .unwrap();
    let peer = Peer::spawn(
        "reliability_mismatch_is_reported_to_the_client",
        &dir,
        &d.to_string(),
    );
    let mut req = nic.connect_wait(&disc(d), Some(T)).unwrap();
    let e = req.accept(&vi).unwrap_err();
    assert!(matches!(e, ConnectError::Mismatch(_)), "server side: {e}");
    assert_eq!(vi.state(), ViState::Idle);
    peer.join();
    nic.stop_listening(&disc(d));
    drop((vi, nic));
    dir.assert_empty("after both sides closed");
}

// ---------------------------------------------------------------------------
// 9. A peer killed with SIGKILL.
// ---------------------------------------------------------------------------

/// Server that also listens on a second discriminator nobody connects to,
/// then streams numbered 4 KiB messages until it is killed.
fn streaming_server_peer(arg: &str) {
    let (d, spare) = arg.split_once(':').unwrap();
    let (d, spare): (u64, u64) = (d.parse().unwrap(), spare.parse().unwrap());
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic
        .create_vi(
            ViAttributes::new(ptag).reliability(Reliability::ReliableReception),
            None,
            None,
        )
        .unwrap();
    let mut sbuf = nic.alloc_region(4096, MemAttributes::new(ptag)).unwrap();
    assert!(matches!(
        nic.connect_wait(&disc(spare), Some(Duration::from_millis(1))),
        Err(ConnectError::Timeout(_))
    ));
    accept(&nic, &vi, d);
    sbuf.as_mut_slice().copy_from_slice(&pattern(4096, 0));
    for seq in 0u64.. {
        sbuf.as_mut_slice()[..8].copy_from_slice(&seq.to_le_bytes());
        // Never returns an error before the kill; an unbounded wait is fine
        // here because the test kills this process.
        assert_eq!(send(&vi, &sbuf, 0, 4096).result(), Ok(4096));
    }
}

#[test]
fn killed_server_mid_stream() {
    if let Some(a) = peer_arg() {
        return streaming_server_peer(&a);
    }
    let dir = SockDir::new("killsrv");
    let d = disc_base(12);
    let spare = d + 1;
    let mut peer = Peer::spawn("killed_server_mid_stream", &dir, &format!("{d}:{spare}"));
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let vi = nic
        .create_vi(
            ViAttributes::new(ptag).reliability(Reliability::ReliableReception),
            None,
            None,
        )
        .unwrap();
    const SLOTS: usize = 8;
    let rbuf = nic
        .alloc_region(SLOTS * 4096, MemAttributes::new(ptag))
        .unwrap();
    let mut sbuf = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    for k in 0..SLOTS {
        post_recv(&vi, &rbuf, k * 4096, 4096);
    }
    connect(&vi, d);
    let mut next = 0u64;
    let check = |k: usize, seq: u64| {
        let b = &rbuf.as_slice()[k * 4096..(k + 1) * 4096];
        assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), seq);
        assert!(b[8..] == pattern(4096, 0)[8..], "message {seq} content");
    };
    for _ in 0..20 {
        assert_eq!(recv_ok(&vi), 4096);
        check(next as usize % SLOTS, next);
        post_recv(&vi, &rbuf, next as usize % SLOTS * 4096, 4096);
        next += 1;
    }
    // Sends the peer never takes (it posts no receive): in flight at the kill.
    sbuf.as_mut_slice().fill(1);
    vi.post_send(Box::new(Descriptor::send(&[sbuf.segment(0, 64)])))
        .unwrap();
    vi.post_send(Box::new(Descriptor::send(&[sbuf.segment(0, 100_000)])))
        .unwrap();
    peer.kill();
    // The receives posted so far may all have been filled before the kill:
    // progress takes in whatever the peer published, up to every posted
    // receive, while the program waits on the first; and the peer, which
    // sends one message at a time, may have left one more in the ring. Two
    // receives posted after the kill cannot both be filled.
    let extra = nic
        .alloc_region(2 * 4096, MemAttributes::new(ptag))
        .unwrap();
    let mut outstanding = SLOTS;
    for k in 0..2 {
        let d = Descriptor::recv(&[extra.segment(k * 4096, 4096)]);
        outstanding += vi.post_recv(Box::new(d)).is_ok() as usize;
    }

    // Every outstanding receive completes: first the messages the peer
    // published before it died, in order, then errors only.
    let mut failed = false;
    for _ in 0..outstanding {
        let r = vi
            .recv_wait(Some(T))
            .expect("every outstanding receive completes");
        match r.result() {
            Ok(n) => {
                assert!(!failed, "a message after an error");
                assert!(
                    next <= 20 + SLOTS as u64,
                    "more messages than the peer could send"
                );
                assert_eq!(n, 4096);
                if next < 20 + SLOTS as u64 {
                    check(next as usize % SLOTS, next);
                }
                next += 1;
            }
            Err(e) => {
                failed = true;
                assert!(
                    matches!(e, CompletionError::Transport | CompletionError::Flushed),
                    "receive: {e}"
                );
            }
        }
    }
    assert!(failed, "at least one receive fails");
    for what in ["64 B send", "100 KB send"] {
        let s = vi.send_wait(Some(T)).expect("every send completes");
        assert!(
            matches!(
                s.error(),
                Some(CompletionError::Transport | CompletionError::Flushed)
            ),
            "{what}: {:?}",
            s.result()
        );
    }
    assert_eq!(vi.state(), ViState::Error);
    assert!(vi.recv_done().is_none() && vi.send_done().is_none());
    let rej = vi
        .post_send(Box::new(Descriptor::send(&[sbuf.segment(0, 8)])))
        .unwrap_err();
    assert_eq!(rej.error, PostError::ViError);
    assert!(matches!(
        vi.post_recv(Box::new(Descriptor::recv(&[rbuf.segment(0, 8)])))
            .unwrap_err()
            .error,
        PostError::ViError
    ));

    // The client removed the dead server's socket when it noticed; the
    // spare listener's file stays until a connect attempt finds it stale.
    let left = dir.entries();
    assert_eq!(left.len(), 1, "only the spare listener is left: {left:?}");
    let other = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let e = other
        .connect_request(
            &NetAddress::new("0", disc(spare)),
            Duration::from_millis(100),
        )
        .unwrap_err();
    assert!(matches!(e, ConnectError::NoListener { .. }), "{e}");
    dir.assert_empty("after the stale listener was found");
    vi.disconnect();
    assert_eq!(vi.state(), ViState::Idle, "an errored VI can be reset");
    drop((vi, other, nic));
    dir.assert_empty("after both sides are gone");
}

/// Client that says hello, then posts a receive and waits until killed.
/// `arg` is the discriminator, and `:reception` for reliable reception.
fn waiting_client_peer(arg: &str) {
    let (d, reception) = match arg.split_once(':') {
        Some((d, _)) => (d, true),
        None => (arg, false),
    };
    let d: u64 = d.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let mut attrs = ViAttributes::new(ptag);
    if reception {
        attrs = attrs.reliability(Reliability::ReliableReception);
    }
    let vi = nic.create_vi(attrs, None, None).unwrap();
    let mut sbuf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    connect(&vi, d);
    send_bytes(&vi, &mut sbuf, 0, b"hello");
    post_recv(&vi, &sbuf, 0, 64);
    loop {
        let _ = vi.recv_wait(Some(T));
    }
}

#[test]
fn killed_client_while_server_waits() {
    if let Some(a) = peer_arg() {
        return waiting_client_peer(&a);
    }
    let dir = SockDir::new("killcli");
    let d = disc_base(13);
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let rbuf = nic
        .alloc_region(4 * 4096, MemAttributes::new(ptag))
        .unwrap();
    let sbuf = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    for k in 0..4 {
        post_recv(&vi, &rbuf, k * 4096, 4096);
    }
    let mut peer = Peer::spawn("killed_client_while_server_waits", &dir, &d.to_string());
    accept(&nic, &vi, d);
    assert_eq!(recv_ok(&vi), 5);
    assert_eq!(&rbuf.as_slice()[..5], b"hello");
    // A by-reference send waits for the peer to take it; the peer's one
    // receive is too small, but the peer dies first or the error shows.
    vi.post_send(Box::new(Descriptor::send(&[sbuf.segment(0, 200_000)])))
        .unwrap();
    peer.kill();
    for k in 0..3 {
        let r = vi
            .recv_wait(Some(T))
            .expect("every outstanding receive completes");
        assert!(
            matches!(
                r.error(),
                Some(CompletionError::Transport | CompletionError::Flushed)
            ),
            "receive {k}: {:?}",
            r.result()
        );
    }
    let s = vi.send_wait(Some(T)).expect("the send completes");
    assert!(s.error().is_some(), "the send fails: {:?}", s.result());
    assert_eq!(vi.state(), ViState::Error);
    // Only the server's own listener is left, until it stops listening.
    assert_eq!(dir.entries().len(), 1, "{:?}", dir.entries());
    nic.stop_listening(&disc(d));
    dir.assert_empty("after the server stopped listening");
    drop((vi, nic));
    dir.assert_empty("after both sides are gone");
}

/// A stopped (not killed) client: its socket stays open, so only its
/// state says it will not answer. Every outstanding descriptor of the
/// server fails within a second, at reliable reception (whose sends wait
/// for the peer to take them).
#[test]
fn stopped_client_fails_the_servers_descriptors_within_a_second() {
    if let Some(a) = peer_arg() {
        return waiting_client_peer(&a);
    }
    let dir = SockDir::new("stopcli");
    let d = disc_base(19);
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let vi = nic
        .create_vi(
            ViAttributes::new(ptag).reliability(Reliability::ReliableReception),
            None,
            None,
        )
        .unwrap();
    let rbuf = nic
        .alloc_region(2 * 4096, MemAttributes::new(ptag))
        .unwrap();
    let sbuf = nic.alloc_region(MIB, MemAttributes::new(ptag)).unwrap();
    for k in 0..2 {
        post_recv(&vi, &rbuf, k * 4096, 4096);
    }
    let mut peer = Peer::spawn(
        "stopped_client_fails_the_servers_descriptors_within_a_second",
        &dir,
        &format!("{d}:reception"),
    );
    accept(&nic, &vi, d);
    assert_eq!(recv_ok(&vi), 5);
    // SAFETY: kill(2) on the peer process this test spawned.
    assert_eq!(
        unsafe { libc::kill(peer.pid() as i32, libc::SIGSTOP) },
        0,
        "stopping the peer"
    );
    let stopped = std::time::Instant::now();
    vi.post_send(Box::new(Descriptor::send(&[sbuf.segment(0, 200_000)])))
        .unwrap();
    let s = vi.send_wait(Some(T)).expect("the send completes");
    let took = stopped.elapsed();
    assert!(s.error().is_some(), "the send fails: {:?}", s.result());
    let r = vi.recv_wait(Some(T)).expect("the receive completes");
    assert!(r.error().is_some(), "the receive fails: {:?}", r.result());
    assert!(
        took < Duration::from_millis(1000),
        "failed after {took:?}, not within a second"
    );
    assert_eq!(vi.state(), ViState::Error);
    // SAFETY: as above; a stopped process is killed all the same.
    unsafe { libc::kill(peer.pid() as i32, libc::SIGCONT) };
    peer.kill();
    nic.stop_listening(&disc(d));
    drop((vi, nic));
    dir.assert_empty("after both sides are gone");
}

// ---------------------------------------------------------------------------
// 10. Disconnect.
// ---------------------------------------------------------------------------

fn disconnect_peer(arg: &str) {
    let d: u64 = arg.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let mut buf = nic.alloc_region(4096, MemAttributes::new(ptag)).unwrap();
    for k in 0..3 {
        post_recv(&vi, &buf, k * 64, 64);
    }
    accept(&nic, &vi, d);
    for k in 0..3 {
        let r = vi.recv_wait(Some(T)).unwrap();
        assert_eq!(
            r.error(),
            Some(CompletionError::Flushed),
            "receive {k} after the peer's disconnect"
        );
    }
    assert_eq!(vi.state(), ViState::Error);
    assert_eq!(
        vi.post_send(Box::new(Descriptor::send(&[buf.segment(0, 8)])))
            .unwrap_err()
            .error,
        PostError::ViError
    );
    // Reset and serve the same client again.
    vi.disconnect();
    assert_eq!(vi.state(), ViState::Idle);
    post_recv(&vi, &buf, 0, 64);
    accept(&nic, &vi, d);
    assert_eq!(recv_ok(&vi), 5);
    assert_eq!(&buf.as_slice()[..5], b"again");
    send_bytes(&vi, &mut buf, 1024, b"welcome back");
    until_peer_leaves(&vi, &buf);
}

#[test]
fn disconnect_flushes_the_peer_and_allows_reconnecting() {
    if let Some(a) = peer_arg() {
        return disconnect_peer(&a);
    }
    let dir = SockDir::new("disc");
    let d = disc_base(14);
    let peer = Peer::spawn(
        "disconnect_flushes_the_peer_and_allows_reconnecting",
        &dir,
        &d.to_string(),
    );
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let mut buf = nic.alloc_region(4096, MemAttributes::new(ptag)).unwrap();
    post_recv(&vi, &buf, 0, 64);
    connect(&vi, d);
    vi.disconnect();
    assert_eq!(vi.state(), ViState::Idle);
    let r = vi.recv_done().expect("own receive completes at disconnect");
    assert_eq!(r.error(), Some(CompletionError::Flushed));
    assert!(vi.remote_attributes().is_none());
    // The same VI connects again.
    post_recv(&vi, &buf, 2048, 64);
    connect(&vi, d);
    assert_eq!(vi.state(), ViState::Connected);
    send_bytes(&vi, &mut buf, 0, b"again");
    assert_eq!(recv_ok(&vi), 12);
    assert_eq!(&buf.as_slice()[2048..2060], b"welcome back");
    vi.disconnect();
    peer.join();
    drop((vi, nic));
    dir.assert_empty("after both sides closed");
}

// ---------------------------------------------------------------------------
// 11. Hostile peers: a peer is another program, not to be trusted.
// ---------------------------------------------------------------------------

/// Truncates to nothing every uvia memfd this process holds (its connection
/// segment, its regions): (how many it found, how many it could truncate).
fn truncate_own_memfds() -> (usize, usize) {
    let (mut found, mut cut) = (0, 0);
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        if !target.to_string_lossy().starts_with("/memfd:uvia") {
            continue;
        }
        let Ok(fd) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        found += 1;
        // SAFETY: resizing a descriptor of this process; that is the attack.
        cut += (unsafe { libc::ftruncate(fd, 0) } == 0) as usize;
    }
    (found, cut)
}

/// `<victim|attacker>-<server|client>:<discriminator>`. The attacker sends
/// a large message (its region is mapped by the victim), truncates its
/// memfds, and sends another; the victim receives both.
fn shrink_peer(arg: &str) {
    let (role, d) = arg.split_once(':').unwrap();
    let (who, side) = role.split_once('-').unwrap();
    let d: u64 = d.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let mut buf = nic
        .alloc_region(2 * 4096, MemAttributes::new(ptag))
        .unwrap();
    if who == "victim" {
        post_recv(&vi, &buf, 0, 4096);
        post_recv(&vi, &buf, 4096, 4096);
    }
    if side == "server" {
        accept(&nic, &vi, d);
    } else {
        connect(&vi, d);
    }
    if who == "victim" {
        for k in 0..2 {
            assert_eq!(recv_ok(&vi), 4096);
            assert!(buf.as_slice()[k * 4096..(k + 1) * 4096] == pattern(4096, k as u8)[..]);
        }
        return until_peer_leaves(&vi, &buf);
    }
    // By reference: the send completes once the victim has read the region.
    send_bytes(&vi, &mut buf, 0, &pattern(4096, 0));
    let (found, cut) = truncate_own_memfds();
    if cut > 0 {
        // This process's own mappings are gone too: leave without touching them.
        eprintln!("truncated {cut} of {found} shared memfds");
        std::thread::sleep(Duration::from_secs(1));
        std::process::exit(1);
    }
    assert!(found >= 2, "the connection segment and the region: {found}");
    send_bytes(&vi, &mut buf, 4096, &pattern(4096, 1));
    vi.disconnect();
}

/// Segments and regions are sealed against shrinking: a peer that truncates
/// its memfds after the other side mapped them cannot kill it with SIGBUS.
#[test]
fn a_peer_cannot_shrink_shared_memory() {
    if let Some(a) = peer_arg() {
        return shrink_peer(&a);
    }
    let dir = SockDir::new("shrink");
    let pairs = [
        ("victim-server", "attacker-client"),
        ("victim-client", "attacker-server"),
    ];
    for (k, (victim, attacker)) in pairs.into_iter().enumerate() {
        let d = disc_base(15) + k as u64;
        let name = "a_peer_cannot_shrink_shared_memory";
        let v = Peer::spawn(name, &dir, &format!("{victim}:{d}"));
        let a = Peer::spawn(name, &dir, &format!("{attacker}:{d}"));
        v.join();
        a.join();
    }
    dir.assert_empty("after both sides are gone");
}

/// A raw client of the shm provider, written with `uvia_shm`'s pieces: it
/// sends the connection request the provider's client sends (the layout of
/// `provider/shm/conn.rs`'s `hello`) with descriptors of its choosing.
mod raw {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use uvia_shm::{ring_bytes, SocketDir, Stream, RING_ALIGN};

    /// Bytes of a connection message: 24 of header, the discriminator
    /// (at most 32), the private data (at most 64).
    const HELLO_LEN: usize = 24 + 32 + uvia::MAX_PRIVATE_DATA;
    /// The shm protocol's version (`VERSION` in the provider's `conn.rs`).
    const SHM_VERSION: u8 = 5;
    /// Bytes of the segment's header.
    pub const HEADER: usize = 128;
    /// Bytes of one side's block: 128 of doorbell and flags, 256 of the
    /// offer of a shared copy, 128 each of the direct writes' busy word
    /// and grants.
    pub const BLOCK: usize = 640;

    /// The connection segment's size: the header, two side blocks, two
    /// rings of 1024 lines.
    pub fn segment_len() -> usize {
        HEADER + 2 * BLOCK + 2 * ring_bytes(1024).next_multiple_of(RING_ALIGN)
    }

    /// A request for discriminator `d` from a Reliable Delivery VI with the
    /// default attributes.
    pub fn request_bytes(d: u64) -> Vec<u8> {
        let mut b = vec![0u8; HELLO_LEN];
        b[0..4].copy_from_slice(b"UVIA");
        b[4] = SHM_VERSION;
        b[5] = 1; // request
        b[6] = uvia::Reliability::ReliableDelivery as u8;
        b[8..12].copy_from_slice(&(1u32 << 20).to_le_bytes()); // max transfer size
        b[12] = 8; // discriminator length
        b[24..32].copy_from_slice(&d.to_le_bytes());
        b
    }

    /// A memfd of `len` bytes laid out as a connection segment's header
    /// (magic, version, lines per ring), with `seals` added.
    pub fn segment(len: usize, seals: i32) -> OwnedFd {
        // SAFETY: a literal name; flags are constants.
        let fd = unsafe {
            libc::memfd_create(c"raw".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut hdr = [0u8; 16];
        hdr[0..8].copy_from_slice(b"UVIA-SHM");
        hdr[8..12].copy_from_slice(&(SHM_VERSION as u32).to_le_bytes());
        hdr[12..16].copy_from_slice(&1024u32.to_le_bytes());
        // SAFETY: plain calls on our descriptor with a live buffer.
        unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as libc::off_t), 0);
            assert_eq!(libc::pwrite(fd.as_raw_fd(), hdr.as_ptr().cast(), 16, 0), 16);
            if seals != 0 {
                assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals), 0);
            }
        }
        fd
    }

    /// An eventfd, as a client passes for its completion queues.
    pub fn eventfd() -> OwnedFd {
        // SAFETY: plain eventfd creation.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    /// Connects to the listener of discriminator `d` in `dir`.
    pub fn connect(dir: &std::path::Path, d: u64) -> Stream {
        let dir = SocketDir::at(dir.to_owned()).unwrap();
        let name = uvia_shm::socket::hex_name("shm-0", &d.to_le_bytes());
        Stream::connect(&dir.socket(&name), super::T).unwrap()
    }

    /// Sends a request with `fds` on `s`; whether the server accepted it.
    pub fn request(s: &Stream, d: u64, fds: &[RawFd]) -> bool {
        s.send(&request_bytes(d), fds).unwrap();
        let mut buf = [0u8; HELLO_LEN + 16];
        match s.recv(&mut buf, Some(super::T)) {
            Ok(Some((n, _))) => n == HELLO_LEN && buf[5] == 2,
            Ok(None) => panic!("no answer within {:?}", super::T),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => false,
            Err(e) => panic!("{e}"),
        }
    }

    /// A pipe: (read end, write end).
    pub fn pipe() -> (OwnedFd, OwnedFd) {
        let mut p = [0; 2];
        // SAFETY: `p` has room for two descriptors.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh descriptors we own.
        unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
    }

    /// Fills an eventfd's counter to its limit: one more write would block.
    pub fn fill(fd: &OwnedFd) {
        let full: u64 = u64::MAX - 1;
        // SAFETY: writing 8 bytes from a live u64 to our descriptor.
        let n = unsafe { libc::write(fd.as_raw_fd(), (&full as *const u64).cast(), 8) };
        assert_eq!(n, 8);
    }

    pub const SEALED: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
}

fn refusing_server_peer(arg: &str) {
    let d: u64 = arg.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let mut buf = nic.alloc_region(4096, MemAttributes::new(ptag)).unwrap();
    accept(&nic, &vi, d);
    // The client claims to sleep on its CQ: this send signals its eventfd.
    send_bytes(&vi, &mut buf, 0, b"wake up");
    vi.disconnect();
}

/// Connection requests whose segment the client could shrink later, whose
/// size is not the layout's, whose wake-up descriptor is not an eventfd,
/// or that pass no eventfd for their process's agent never reach the
/// application; the server accepts the well-formed one
/// after them, and signalling its eventfd, filled to the limit by the
/// client, does not block the server.
#[test]
fn hostile_connection_requests_are_refused() {
    if let Some(a) = peer_arg() {
        return refusing_server_peer(&a);
    }
    use std::os::fd::AsRawFd;
    let dir = SockDir::new("hostile");
    let d = disc_base(16);
    let peer = Peer::spawn(
        "hostile_connection_requests_are_refused",
        &dir,
        &d.to_string(),
    );
    let len = raw::segment_len();
    let efd = raw::eventfd();
    let (pipe_r, pipe_w) = raw::pipe();
    let cases = [
        ("an unsealed segment", Some(raw::segment(len, 0)), &efd),
        (
            "a 64 MiB segment",
            Some(raw::segment(64 * MIB, raw::SEALED)),
            &efd,
        ),
        (
            "a segment one page short",
            Some(raw::segment(len - 4096, raw::SEALED)),
            &efd,
        ),
        (
            "a pipe for an eventfd",
            Some(raw::segment(len, raw::SEALED)),
            &pipe_w,
        ),
        ("no segment", None, &efd),
    ];
    for (what, seg, wake) in &cases {
        let mut fds: Vec<i32> = seg.iter().map(|s| s.as_raw_fd()).collect();
        fds.push(wake.as_raw_fd());
        let s = raw::connect(dir.path(), d);
        assert!(
            !raw::request(&s, d, &fds),
            "a request with {what} was accepted"
        );
    }
    {
        let what = "no agent eventfd";
        let seg = raw::segment(len, raw::SEALED);
        let fds = [seg.as_raw_fd()];
        let s = raw::connect(dir.path(), d);
        assert!(
            !raw::request(&s, d, &fds),
            "a request with {what} was accepted"
        );
    }
    drop((pipe_r, pipe_w));
    // Well formed, but the client's CQ eventfd is full and blocking, and its
    // side block says it sleeps on it.
    let good = raw::segment(len, raw::SEALED);
    let seg = uvia_shm::Segment::open_exact(good.try_clone().unwrap(), len).unwrap();
    // SAFETY: the client's side block starts after the 128-byte header, its
    // doorbell first; the mapping is the full layout long.
    let bell = unsafe { &*(seg.as_ptr().add(raw::HEADER) as *const uvia_shm::Doorbell) };
    bell.arm(uvia_shm::doorbell::EVENTFD);
    let full = raw::eventfd();
    raw::fill(&full);
    let agent = raw::eventfd();
    raw::fill(&agent);
    let s = raw::connect(dir.path(), d);
    assert!(
        raw::request(
            &s,
            d,
            &[good.as_raw_fd(), agent.as_raw_fd(), full.as_raw_fd()]
        ),
        "the well-formed request is accepted"
    );
    // The server's send rang the bell and went on: it disconnects.
    let mut b = [0u8; 256];
    match s.recv(&mut b, Some(T)) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
        other => panic!("the server is stuck signalling the client's eventfd: {other:?}"),
    }
    peer.join();
    dir.assert_empty("after both sides are gone");
}

/// Client side: a server whose answer carries a pipe instead of its CQ's
/// eventfd is refused.
fn client_of_hostile_server_peer(arg: &str) {
    let d: u64 = arg.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let e = vi
        .connect_request(&NetAddress::new("0", disc(d)), T)
        .unwrap_err();
    assert!(matches!(e, ConnectError::Protocol(_)), "{e}");
    assert_eq!(vi.state(), ViState::Idle);
}

#[test]
fn a_server_passing_a_pipe_for_an_eventfd_is_refused() {
    if let Some(a) = peer_arg() {
        return client_of_hostile_server_peer(&a);
    }
    use std::os::fd::AsRawFd;
    let dir = SockDir::new("hostsrv");
    let d = disc_base(17);
    let sd = uvia_shm::SocketDir::at(dir.path().to_owned()).unwrap();
    let name = uvia_shm::socket::hex_name("shm-0", &d.to_le_bytes());
    let l = uvia_shm::Listener::bind(&sd.socket(&name)).unwrap();
    let peer = Peer::spawn(
        "a_server_passing_a_pipe_for_an_eventfd_is_refused",
        &dir,
        &d.to_string(),
    );
    let s = l.accept(Some(T)).unwrap().expect("the client connects");
    let mut b = [0u8; 256];
    let (n, _) = s.recv(&mut b, Some(T)).unwrap().unwrap();
    b[5] = 2; // accept, with the client's own attributes
    let (pipe_r, pipe_w) = raw::pipe();
    s.send(&b[..n], &[pipe_w.as_raw_fd()]).unwrap();
    peer.join();
    drop((pipe_r, pipe_w, s, l));
    dir.assert_empty("after both sides are gone");
}

fn patient_server_peer(arg: &str) {
    let d: u64 = arg.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let buf = nic.alloc_region(4096, MemAttributes::new(ptag)).unwrap();
    post_recv(&vi, &buf, 0, 64);
    accept(&nic, &vi, d);
    assert_eq!(recv_ok(&vi), 5);
    assert_eq!(&buf.as_slice()[..5], b"hello");
    until_peer_leaves(&vi, &buf);
}

/// Clients that connect and then say nothing (or nonsense) do not hold up
/// the listener: a good client that connects after them is accepted well
/// within the time the listener grants each of them for its request (5 s).
#[test]
fn silent_connections_do_not_stall_the_listener() {
    if let Some(a) = peer_arg() {
        return patient_server_peer(&a);
    }
    let dir = SockDir::new("silent");
    let d = disc_base(18);
    let peer = Peer::spawn(
        "silent_connections_do_not_stall_the_listener",
        &dir,
        &d.to_string(),
    );
    let silent: Vec<_> = (0..3).map(|_| raw::connect(dir.path(), d)).collect();
    let noisy = raw::connect(dir.path(), d);
    noisy.send(b"nonsense", &[]).unwrap();
    let nic = open_nic(&dir);
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let mut buf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    vi.connect_request(&NetAddress::new("0", disc(d)), Duration::from_secs(3))
        .expect("the good client is accepted while the silent ones wait");
    send_bytes(&vi, &mut buf, 0, b"hello");
    vi.disconnect();
    peer.join();
    drop(silent);
    dir.assert_empty("after both sides are gone");
}

/// Server side: a receive posted for a message that arrives as a piece
/// out of order completes with an error; nothing else reaches the program.
fn piece_out_of_order_server_peer(arg: &str) {
    let d: u64 = arg.parse().unwrap();
    let nic = open_peer_nic();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    let buf = nic.alloc_region(1 << 20, MemAttributes::new(ptag)).unwrap();
    accept(&nic, &vi, d);
    vi.post_recv(Box::new(Descriptor::recv(&[buf.segment(0, 1 << 20)])))
        .unwrap();
    let r = vi.recv_wait(Some(T)).expect("the receive completes");
    assert!(
        r.error().is_some(),
        "a piece out of order was taken: {:?}",
        r.result()
    );
    assert_eq!(vi.state(), ViState::Error);
    assert!(
        buf.as_slice()[..1 << 16].iter().all(|&b| b == 0),
        "the piece's bytes were not placed"
    );
}

/// A peer that writes the second piece of a message with no first one (a
/// record the provider never writes) fails the connection: the receiver
/// completes its receive with an error and places nothing.
#[test]
fn a_piece_out_of_order_fails_the_connection() {
    if let Some(a) = peer_arg() {
        return piece_out_of_order_server_peer(&a);
    }
    use std::os::fd::AsRawFd;
    let dir = SockDir::new("piece");
    let d = disc_base(20);
    let peer = Peer::spawn(
        "a_piece_out_of_order_fails_the_connection",
        &dir,
        &d.to_string(),
    );
    let len = raw::segment_len();
    let good = raw::segment(len, raw::SEALED);
    let seg = uvia_shm::Segment::open_exact(good.try_clone().unwrap(), len).unwrap();
    let agent = raw::eventfd();
    let efd = raw::eventfd();
    let s = raw::connect(dir.path(), d);
    assert!(
        raw::request(
            &s,
            d,
            &[good.as_raw_fd(), agent.as_raw_fd(), efd.as_raw_fd()]
        ),
        "the request is accepted"
    );
    // The client's ring is the first, after the header and the two side
    // blocks (`layout` in the provider's conn.rs).
    // SAFETY: the segment is the full layout long, the ring's offset is
    // aligned, and this side is the ring's only producer.
    let mut tx =
        unsafe { uvia_shm::Producer::new(seg.as_ptr().add(raw::HEADER + 2 * raw::BLOCK), 1024) };
    const PIECE: usize = 16 << 10;
    let p = tx.reserve(24 + PIECE).expect("room in an empty ring");
    let mut hdr = [0u8; 24];
    hdr[0] = 1; // a send
    hdr[1] = 8 | 4; // a piece, rung after it is taken
    hdr[8..12].copy_from_slice(&600_000u32.to_le_bytes()); // the whole message
    hdr[16..20].copy_from_slice(&(PIECE as u32).to_le_bytes()); // where it starts
    hdr[20..24].copy_from_slice(&(PIECE as u32).to_le_bytes()); // its bytes
                                                                // SAFETY: `reserve` gave 24 + PIECE writable bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(hdr.as_ptr(), p, 24);
        p.add(24).write_bytes(0xab, PIECE);
    }
    tx.commit();
    // The server's side block (after the header and ours) starts with its
    // doorbell: wake it if it sleeps.
    // SAFETY: the mapping is the full layout long.
    let bell =
        unsafe { &*(seg.as_ptr().add(raw::HEADER + raw::BLOCK) as *const uvia_shm::Doorbell) };
    bell.ring();
    peer.join();
    drop(s);
}
