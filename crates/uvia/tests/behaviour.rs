//! One behaviour suite over every provider: each test below is written once
//! against a [`Link`] (two Nics that reach each other) and run over `shm`,
//! `udp` on loopback, and `xdp` between two test hosts (network namespaces
//! joined by a veth pair; root only, skipped with a reason elsewhere). Both
//! ends live in this process; a [`Driver`] thread moves their progress
//! between the test's own calls, as a VIA NIC works while the program does
//! not call in (acknowledgements, RDMA served on the target).
//!
//! What a test may expect of a provider it asks its attributes
//! (reliability levels, inline threshold, segments), never its name.

mod common;

use common::{pattern, poll_until, T};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use uvia::*;
use uvia_net::netns::{Side, TestHosts};

/// Bytes of each end's buffer (RDMA read and write enabled).
const BUF: usize = 1 << 20;
/// A wait that is meant to time out.
const SHORT: Duration = Duration::from_millis(50);

/// The provider a test runs over.
#[derive(Clone, Copy, Debug)]
enum Medium {
    Shm,
    Udp,
    Xdp,
}

static NEXT: AtomicU64 = AtomicU64::new(1);

/// A number no other pair of this run uses (discriminators, instances).
fn unique() -> u64 {
    (std::process::id() as u64) << 32 | NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Medium {
    /// Two Nics that reach each other over this medium, or why that cannot
    /// be had here.
    fn link(self) -> Result<Link, String> {
        self.link_with(&NicOptions::default(), &NicOptions::default())
    }

    /// [`link`](Self::link) with the fault injector dropping `loss` of
    /// what `b` receives (seeded with `seed`).
    fn lossy_link(self, loss: f64, seed: u8) -> Result<Link, String> {
        let lossy = NicOptions {
            inject: Some(format!("loss={loss},seed={seed}")),
            ..NicOptions::default()
        };
        self.link_with(&NicOptions::default(), &lossy)
    }

    /// [`link`](Self::link) with each Nic's settings.
    fn link_with(self, a: &NicOptions, b: &NicOptions) -> Result<Link, String> {
        let open = |name: &str, opts| {
            Nic::open_with(name, opts).unwrap_or_else(|e| panic!("opening {name}: {e}"))
        };
        match self {
            Medium::Shm => {
                let name = format!("shm:b{:x}", unique());
                Ok(Link::new(open(&name, a), open(&name, b), None))
            }
            Medium::Udp => Ok(Link::new(
                open("udp:127.0.0.1", a),
                open("udp:127.0.0.1", b),
                None,
            )),
            Medium::Xdp => {
                TestHosts::available()?;
                let hosts = TestHosts::create("bh").expect("test hosts");
                // A socket belongs to the host its thread is on when it is
                // opened; after that any thread may use it.
                let on = |side: Side, opts| {
                    let _on = hosts.enter(side).expect("enter a test host");
                    Nic::open_with(&format!("xdp:{}", hosts.iface(side)), opts)
                };
                let a = on(Side::A, a).map_err(|e| e.to_string())?;
                let b = on(Side::B, b).map_err(|e| e.to_string())?;
                Ok(Link::new(a, b, Some(hosts)))
            }
        }
    }
}

/// Runs one behaviour over `medium`, or says in one line why it cannot run.
fn run(medium: Medium, behaviour: fn(&Link)) {
    match medium.link() {
        Ok(link) => behaviour(&link),
        Err(why) => println!("skipped: {why}"),
    }
}

/// Two Nics that reach each other: `a` connects, `b` accepts.
struct Link {
    a: Nic,
    b: Nic,
    /// The host address `a` connects to.
    b_host: String,
    /// The test hosts of an xdp link; removed after the Nics are closed.
    _hosts: Option<TestHosts>,
}

/// One end of a connected pair.
struct End {
    nic: Nic,
    ptag: Ptag,
    vi: Vi,
    /// `BUF` bytes, RDMA read and write enabled.
    buf: MemoryRegion,
    /// The CQ both queues report to, when asked for.
    cq: Option<Cq>,
}

/// Two connected VIs, `a` the client and `b` the server, driven.
struct Pair {
    /// Declared first: stops before the ends close.
    _driver: Driver,
    a: End,
    b: End,
}

impl Link {
    fn new(a: Nic, b: Nic, hosts: Option<TestHosts>) -> Link {
        Link {
            b_host: b.attributes().address.clone(),
            a,
            b,
            _hosts: hosts,
        }
    }

    fn attributes(&self) -> &NicAttributes {
        self.a.attributes()
    }

    /// The reliability levels both Nics offer.
    fn levels(&self) -> Vec<Reliability> {
        let theirs = self.b.attributes().reliability_levels;
        self.attributes()
            .reliability_levels
            .iter()
            .copied()
            .filter(|l| theirs.contains(l))
            .collect()
    }

    /// The reliable levels among them (RDMA read needs one).
    fn reliable_levels(&self) -> Vec<Reliability> {
        let mut l = self.levels();
        l.retain(|&l| l != Reliability::Unreliable);
        l
    }

    /// A pair on `level` with RDMA enabled both ways.
    fn pair(&self, level: Reliability) -> Pair {
        self.pair_with(
            |p| ViAttributes::new(p).reliability(level).rdma(true, true),
            false,
        )
    }

    /// A pair whose VIs have `attrs`; with `cqs`, each end's queues report
    /// to a CQ of its own.
    fn pair_with(&self, attrs: impl Fn(Ptag) -> ViAttributes, cqs: bool) -> Pair {
        let end = |nic: &Nic| {
            let ptag = nic.create_ptag().unwrap();
            let cq = cqs.then(|| nic.create_cq(64).unwrap());
            let vi = nic
                .create_vi(attrs(ptag), cq.as_ref(), cq.as_ref())
                .unwrap();
            let rdma = MemAttributes::new(ptag).rdma_write(true).rdma_read(true);
            End {
                nic: nic.clone(),
                ptag,
                vi,
                buf: nic.alloc_region(BUF, rdma).unwrap(),
                cq,
            }
        };
        let (a, b) = (end(&self.a), end(&self.b));
        let disc = Discriminator::from_u64(unique());
        let (nic, vi, d) = (self.b.clone(), b.vi.clone(), disc.clone());
        let server = std::thread::spawn(move || {
            let mut req = nic.connect_wait(&d, Some(T)).unwrap();
            req.accept(&vi).unwrap();
            nic.stop_listening(&d);
        });
        a.vi.connect_request(&NetAddress::new(&self.b_host, disc), T)
            .unwrap();
        server.join().unwrap();
        Pair {
            _driver: Driver::start(vec![a.vi.clone(), b.vi.clone()]),
            a,
            b,
        }
    }
}

/// Plays the NIC's processor for VIs: calls [`Vi::drive`] on them until
/// dropped. Every provider needs one for an in-process pair: the `shm`
/// target serves RDMA only inside its own calls, and a network VI
/// acknowledges, retransmits and serves RDMA only inside its own calls.
struct Driver {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Driver {
    fn start(vis: Vec<Vi>) -> Driver {
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                for vi in &vis {
                    vi.drive();
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        });
        Driver {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl End {
    /// Posts a receive of `len` bytes at `off` of the buffer.
    fn post_recv(&self, off: usize, len: usize) {
        self.vi
            .post_recv(Box::new(Descriptor::recv(&[self.buf.segment(off, len)])))
            .unwrap_or_else(|r| panic!("receive refused: {}", r.error));
    }

    fn post_send(&self, d: Descriptor) {
        self.vi
            .post_send(Box::new(d))
            .unwrap_or_else(|r| panic!("send refused: {}", r.error));
    }

    /// Sends `len` bytes at `off` of the buffer.
    fn send(&self, off: usize, len: usize) {
        self.post_send(Descriptor::send(&[self.buf.segment(off, len)]));
    }

    fn send_wait(&self) -> Box<Descriptor> {
        self.vi
            .send_wait(Some(T))
            .unwrap_or_else(|e| panic!("send queue: {e} (VI {:?})", self.vi.state()))
    }

    fn recv_wait(&self) -> Box<Descriptor> {
        self.vi
            .recv_wait(Some(T))
            .unwrap_or_else(|e| panic!("receive queue: {e} (VI {:?})", self.vi.state()))
    }

    /// Waits (bounded) until the VI is in the Error state.
    fn until_error(&self, what: &str) {
        poll_until(what, || (self.vi.state() == ViState::Error).then_some(()));
    }
}

/// The post-time fields of two descriptors are the same.
fn same_request(a: &Descriptor, b: &Descriptor) -> bool {
    (a.cs.control, a.cs.seg_count, a.cs.immediate_data, a.ds)
        == (b.cs.control, b.cs.seg_count, b.cs.immediate_data, b.ds)
}

/// The descriptor completed because its connection ended: flushed before
/// it started, or failed while it was carried.
fn ended_with_the_connection(d: &Descriptor) -> bool {
    matches!(
        d.error(),
        Some(CompletionError::Flushed | CompletionError::Transport)
    )
}

/// Posts `segs` as a send (with immediate data) and as a receive; both must
/// be refused with the same descriptor handed back. The two errors.
fn refusals(vi: &Vi, segs: &[Segment]) -> [PostError; 2] {
    let send = Descriptor::send(segs).with_immediate(9);
    let recv = Descriptor::recv(segs);
    [
        (send, vi.post_send(Box::new(send))),
        (recv, vi.post_recv(Box::new(recv))),
    ]
    .map(|(d, r)| {
        let rej = r.expect_err("the post is refused");
        assert!(
            same_request(&rej.descriptor, &d),
            "the same descriptor comes back"
        );
        rej.error
    })
}

// ---------------------------------------------------------------------------
// Sends and receives.
// ---------------------------------------------------------------------------

/// 1 B, the largest inline message, one byte more (by reference on `shm`,
/// a second frame on a network), 64 KiB and four inline messages' worth,
/// on every level: the bytes, the length and the immediate data arrive,
/// and nothing past the message is written.
fn every_size_arrives_intact_with_its_immediate_data(link: &Link) {
    let inline = link.attributes().inline_threshold;
    let sizes = [1, inline, inline + 1, 64 << 10, 4 * inline + 3];
    const RX: usize = BUF / 2;
    for level in link.levels() {
        let mut p = link.pair(level);
        for (k, &n) in sizes.iter().enumerate() {
            let what = format!("{level:?}, {n} B");
            let data = pattern(n, k as u8 + 1);
            p.a.buf.as_mut_slice()[..n].copy_from_slice(&data);
            p.b.buf.as_mut_slice()[RX..].fill(0xee);
            p.b.post_recv(RX, BUF - RX - 1);
            let imm = 0x5eed_0000 | k as u32;
            p.a.post_send(Descriptor::send(&[p.a.buf.segment(0, n)]).with_immediate(imm));
            assert_eq!(p.a.send_wait().result(), Ok(n as u32), "{what}: send");
            let r = p.b.recv_wait();
            assert_eq!(r.result(), Ok(n as u32), "{what}: receive");
            assert_eq!(r.immediate(), Some(imm), "{what}: immediate data");
            assert_eq!(r.cs.status & status::OP_MASK, status::OP_RECEIVE, "{what}");
            let got = &p.b.buf.as_slice()[RX..];
            assert!(got[..n] == data[..], "{what}: the bytes");
            assert_eq!(got[n], 0xee, "{what}: nothing written past the message");
        }
    }
}

/// Sends `n` messages on `p`, message `i` of `(i * 37) % 257` bytes with
/// immediate data `i`, by copy ([`Vi::send_copy`]) where the VI takes one
/// and as a posted descriptor where it does not (every third message is
/// posted): each arrives whole, in order, the copies among the posted
/// sends. How many went by copy.
fn send_copies_and_posts(p: &mut Pair, n: usize, what: &str) -> usize {
    const SLOT: usize = 512;
    const RX: usize = BUF / 2;
    let len = |i: usize| (i * 37) % 257;
    for i in 0..n {
        p.b.post_recv(RX + i * SLOT, SLOT);
    }
    let mut copied = 0;
    for i in 0..n {
        let data = pattern(len(i), i as u8);
        let by_copy = i % 3 != 1
            && p.a
                .vi
                .send_copy(&[&data[..len(i) / 2], &data[len(i) / 2..]], Some(i as u32))
                .unwrap_or_else(|e| panic!("{what}: send_copy {i}: {e}"));
        if by_copy {
            copied += 1;
            continue;
        }
        p.a.buf.as_mut_slice()[i * SLOT..i * SLOT + len(i)].copy_from_slice(&data);
        p.a.post_send(
            Descriptor::send(&[p.a.buf.segment(i * SLOT, len(i))]).with_immediate(i as u32),
        );
        assert_eq!(
            p.a.send_wait().result(),
            Ok(len(i) as u32),
            "{what}: send {i}"
        );
    }
    for i in 0..n {
        let r = p.b.recv_wait();
        assert_eq!(r.result(), Ok(len(i) as u32), "{what}: message {i}");
        assert_eq!(
            r.immediate(),
            Some(i as u32),
            "{what}: message {i} in its place"
        );
        let got = &p.b.buf.as_slice()[RX + i * SLOT..][..len(i)];
        assert!(
            got == &pattern(len(i), i as u8)[..],
            "{what}: message {i}'s bytes"
        );
    }
    copied
}

/// Messages sent by copy and by descriptor, mixed, on every level: every
/// one arrives whole and in posting order, and the VI takes copies.
fn copied_sends_keep_their_place_among_posted_ones(link: &Link) {
    let mut copied = 0;
    for level in link.levels() {
        let mut p = link.pair(level);
        copied += send_copies_and_posts(&mut p, 60, &format!("{level:?}"));
    }
    assert!(copied > 0, "no message went by copy");
}

/// Copies through a fifth of the frames to the receiver lost (the fault
/// injector drops what a Nic receives): the engine sends a copied
/// message's bytes again from the VI's own storage, intact.
fn copied_sends_survive_loss(medium: Medium) {
    for seed in 1..=3 {
        let link = match medium.lossy_link(0.2, seed) {
            Ok(l) => l,
            Err(why) => return println!("skipped: {why}"),
        };
        let mut p = link.pair(Reliability::ReliableDelivery);
        let what = format!("{medium:?} seed {seed}");
        let copied = send_copies_and_posts(&mut p, 120, &what);
        assert!(copied >= 60, "{what}: {copied} of 120 by copy");
    }
}

#[test]
fn copied_sends_survive_loss_on_udp() {
    copied_sends_survive_loss(Medium::Udp)
}

#[test]
fn copied_sends_survive_loss_on_xdp() {
    copied_sends_survive_loss(Medium::Xdp)
}

/// Six messages of mixed sizes posted back to back: each queue hands its
/// descriptors back in posting order, each receive holding its message.
fn completions_come_in_posting_order(link: &Link) {
    let inline = link.attributes().inline_threshold;
    let lens = [7, 1, inline + 1, 300, 40_000, 2_000];
    const SLOT: usize = 128 << 10;
    for level in link.levels() {
        let mut p = link.pair(level);
        for (i, &n) in lens.iter().enumerate() {
            p.a.buf.as_mut_slice()[i * SLOT..i * SLOT + n].copy_from_slice(&pattern(n, i as u8));
            p.b.post_recv(i * SLOT, SLOT);
        }
        for (i, &n) in lens.iter().enumerate() {
            let d = Descriptor::send(&[p.a.buf.segment(i * SLOT, n)]).with_immediate(i as u32);
            p.a.post_send(d);
        }
        for (i, &n) in lens.iter().enumerate() {
            let d = p.a.send_wait();
            assert_eq!(d.result(), Ok(n as u32), "{level:?}: send {i}");
            assert_eq!(d.ds[0], p.a.buf.segment(i * SLOT, n), "{level:?}: send {i}");
        }
        for (i, &n) in lens.iter().enumerate() {
            let d = p.b.recv_wait();
            assert_eq!(
                d.ds[0],
                p.b.buf.segment(i * SLOT, SLOT),
                "{level:?}: receive {i}"
            );
            assert_eq!(d.result(), Ok(n as u32), "{level:?}: receive {i}");
            assert_eq!(d.immediate(), Some(i as u32), "{level:?}: receive {i}");
            let got = &p.b.buf.as_slice()[i * SLOT..i * SLOT + n];
            assert!(got == pattern(n, i as u8), "{level:?}: message {i}'s bytes");
        }
    }
}

/// Every refusal the post itself can make hands the same descriptor back,
/// queues nothing and leaves the VI usable.
fn refused_posts_hand_the_descriptor_back_and_queue_nothing(link: &Link) {
    const MAX: u32 = 4096;
    let ptag = link.a.create_ptag().unwrap();
    let idle = link
        .a
        .create_vi(ViAttributes::new(ptag), None, None)
        .unwrap();
    let r = link.a.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    let d = Descriptor::send(&[r.segment(0, 8)]);
    let rej = idle.post_send(Box::new(d)).unwrap_err();
    assert_eq!(rej.error, PostError::NotConnected(ViState::Idle));
    assert!(
        same_request(&rej.descriptor, &d),
        "the same descriptor comes back"
    );
    assert!(idle.queue_is_empty(Queue::Send));

    let level = link.levels()[0];
    let mut p = link.pair_with(
        |t| {
            ViAttributes::new(t)
                .reliability(level)
                .max_transfer_size(MAX)
        },
        false,
    );
    let other = link.a.create_ptag().unwrap();
    let foreign = link.a.alloc_region(64, MemAttributes::new(other)).unwrap();
    let buf = &p.a.buf;
    for e in refusals(&p.a.vi, &[buf.segment(BUF - 100, 200)]) {
        assert!(
            matches!(
                e,
                PostError::Segment {
                    index: 0,
                    error: AccessError::OutOfBounds { .. }
                }
            ),
            "out of bounds: {e:?}"
        );
    }
    for e in refusals(&p.a.vi, &[foreign.segment(0, 8)]) {
        assert!(
            matches!(
                e,
                PostError::Segment {
                    index: 0,
                    error: AccessError::WrongPtag { .. }
                }
            ),
            "another tag's memory: {e:?}"
        );
    }
    let unregistered = Segment::local(buf.addr(), MemHandle(0x7777_0001), 8);
    for e in refusals(&p.a.vi, &[buf.segment(0, 4), unregistered]) {
        assert!(
            matches!(
                e,
                PostError::Segment {
                    index: 1,
                    error: AccessError::NotRegistered(_)
                }
            ),
            "an unregistered handle: {e:?}"
        );
    }
    let too_many = vec![buf.segment(0, 1); link.attributes().max_segments_per_desc + 1];
    for e in refusals(&p.a.vi, &too_many) {
        assert!(
            matches!(e, PostError::Format(_)),
            "too many segments: {e:?}"
        );
    }
    let over = MAX as usize + 1;
    for e in refusals(&p.a.vi, &[buf.segment(0, over)]) {
        let want = PostError::TooLong {
            len: over as u64,
            max: MAX,
        };
        assert_eq!(e, want, "one segment over the VI's max transfer size");
    }
    for e in refusals(&p.a.vi, &[buf.segment(0, 3000), buf.segment(4096, 2000)]) {
        let want = PostError::TooLong {
            len: 5000,
            max: MAX,
        };
        assert_eq!(e, want, "segments over the VI's max transfer size");
    }
    assert!(
        p.a.vi.queue_is_empty(Queue::Send),
        "nothing was queued to send"
    );
    assert!(
        p.a.vi.queue_is_empty(Queue::Recv),
        "nothing was queued to receive"
    );
    assert!(p.a.vi.send_done().is_none());
    assert_eq!(p.a.vi.state(), ViState::Connected, "the VI stays usable");
    // The first completions are those of the next good posts, both ways.
    p.a.post_recv(0, 64);
    p.b.post_recv(0, 64);
    p.a.buf.as_mut_slice()[..5].copy_from_slice(b"hello");
    p.a.send(0, 5);
    assert_eq!(p.a.send_wait().result(), Ok(5));
    assert_eq!(p.b.recv_wait().result(), Ok(5));
    p.b.buf.as_mut_slice()[100..102].copy_from_slice(b"hi");
    p.b.send(100, 2);
    assert_eq!(p.b.send_wait().result(), Ok(2));
    assert_eq!(p.a.recv_wait().result(), Ok(2));
    assert_eq!(&p.a.buf.as_slice()[..2], b"hi");
}

/// A message longer than the receive descriptor completes it with a length
/// error, and nothing past the descriptor's buffer is written. Unreliable:
/// the sender is not told and the connection goes on. Reliable levels: the
/// connection breaks on both sides; reliable reception tells the sender
/// through its send's status (remote descriptor error), reliable delivery
/// may have completed the send already.
fn a_short_receive_is_a_length_error(link: &Link) {
    let inline = link.attributes().inline_threshold;
    for level in link.levels() {
        for (n, room) in [(100, 10), (64 << 10, inline + 1)] {
            let what = format!("{level:?}, {n} B into {room} B");
            let mut p = link.pair(level);
            p.a.buf.as_mut_slice()[..n].copy_from_slice(&pattern(n, 3));
            p.b.buf.as_mut_slice().fill(0xee);
            p.a.post_recv(BUF / 2, 64);
            p.b.post_recv(0, room);
            p.a.send(0, n);
            let r = p.b.recv_wait();
            assert_eq!(r.error(), Some(CompletionError::Length), "{what}: receive");
            assert_eq!(r.cs.status & status::OP_MASK, status::OP_RECEIVE, "{what}");
            assert!(
                p.b.buf.as_slice()[room..].iter().all(|&x| x == 0xee),
                "{what}: nothing written past the receive buffer"
            );
            let s = p.a.send_wait();
            match level {
                Reliability::Unreliable => {
                    assert_eq!(s.result(), Ok(n as u32), "{what}: the sender is not told");
                    assert_eq!(p.b.vi.state(), ViState::Connected, "{what}: receiver");
                    p.b.post_recv(0, 64);
                    p.a.buf.as_mut_slice()[..8].copy_from_slice(b"followup");
                    p.a.send(0, 8);
                    assert_eq!(p.a.send_wait().result(), Ok(8), "{what}: next send");
                    assert_eq!(p.b.recv_wait().result(), Ok(8), "{what}: next message");
                    assert_eq!(&p.b.buf.as_slice()[..8], b"followup", "{what}");
                    assert_eq!(p.a.vi.state(), ViState::Connected, "{what}: sender");
                }
                Reliability::ReliableDelivery => {
                    assert!(
                        matches!(s.result(), Ok(_) | Err(CompletionError::RemoteDescriptor)),
                        "{what}: send {:?}",
                        s.result()
                    );
                }
                Reliability::ReliableReception => {
                    assert_eq!(
                        s.error(),
                        Some(CompletionError::RemoteDescriptor),
                        "{what}: the sender is told"
                    );
                }
            }
            if level != Reliability::Unreliable {
                assert_eq!(
                    p.b.vi.state(),
                    ViState::Error,
                    "{what}: the receiver breaks"
                );
                let rej =
                    p.b.vi
                        .post_recv(Box::new(Descriptor::recv(&[p.b.buf.segment(0, 64)])))
                        .unwrap_err();
                assert_eq!(rej.error, PostError::ViError, "{what}");
                // On shm the receiver's report is in the sender's memory by
                // now: the sender's next post fails, though it has made no
                // other call (a send at Reliable Delivery completes when
                // written, and would complete over the broken connection).
                if link.attributes().provider == "shm" {
                    let rej =
                        p.a.vi
                            .post_send(Box::new(Descriptor::send(&[p.a.buf.segment(0, 8)])))
                            .unwrap_err();
                    assert_eq!(
                        rej.error,
                        PostError::ViError,
                        "{what}: the sender's next send"
                    );
                    assert_eq!(p.a.vi.state(), ViState::Error, "{what}: the sender breaks");
                }
                // The sender's outstanding receive comes back with an error.
                let r = p.a.recv_wait();
                assert!(
                    ended_with_the_connection(&r),
                    "{what}: the sender's receive {:?}",
                    r.result()
                );
                assert_eq!(p.a.vi.state(), ViState::Error, "{what}: the sender breaks");
            }
        }
    }
}

/// Memory deregistered under a posted receive is not written: the receive
/// completes with a protection error.
fn deregistered_memory_under_a_posted_receive_is_not_written(link: &Link) {
    for level in link.levels() {
        let mut p = link.pair(level);
        let mut mem = vec![0x5au8; 4096];
        // SAFETY: `mem` outlives the registration and is only read below,
        // after the receive that names it has completed.
        let h = unsafe {
            p.b.nic
                .register_mem(mem.as_mut_ptr(), mem.len(), MemAttributes::new(p.b.ptag))
        }
        .unwrap();
        p.b.vi
            .post_recv(Box::new(Descriptor::recv(&[Segment::local(
                mem.as_ptr(),
                h,
                4096,
            )])))
            .unwrap();
        p.b.nic.deregister_mem(h).unwrap();
        p.a.buf.as_mut_slice()[..100].fill(0x11);
        p.a.send(0, 100);
        let r = p.b.recv_wait();
        assert!(
            mem.iter().all(|&x| x == 0x5a),
            "{level:?}: memory untouched"
        );
        assert_eq!(r.error(), Some(CompletionError::Protection), "{level:?}");
    }
}

// ---------------------------------------------------------------------------
// RDMA.
// ---------------------------------------------------------------------------

/// RDMA writes land in the target's memory and RDMA reads bring it back,
/// small and over many frames, on the reliable levels; on the unreliable
/// level a write lands and a read is refused at the post.
fn rdma_write_and_read_land_on_the_target(link: &Link) {
    const AT: usize = 128 << 10;
    for level in link.levels() {
        let mut p = link.pair(level);
        for (k, n) in [50usize, 64 << 10].into_iter().enumerate() {
            let what = format!("{level:?}, {n} B");
            let data = pattern(n, k as u8 + 7);
            p.a.buf.as_mut_slice()[..n].copy_from_slice(&data);
            p.a.post_send(Descriptor::rdma_write(
                p.b.buf.remote(AT),
                &[p.a.buf.segment(0, n)],
            ));
            let s = p.a.send_wait();
            assert_eq!(s.result(), Ok(n as u32), "{what}: write");
            assert_eq!(
                s.cs.status & status::OP_MASK,
                status::OP_RDMA_WRITE,
                "{what}"
            );
            if level == Reliability::Unreliable {
                // Complete once sent: the bytes follow.
                poll_until(&what, || {
                    (p.b.buf.as_slice()[AT..AT + n] == data[..]).then_some(())
                });
                continue;
            }
            assert!(
                p.b.buf.as_slice()[AT..AT + n] == data[..],
                "{what}: written"
            );
            let back = BUF / 2 - n;
            p.a.post_send(Descriptor::rdma_read(
                p.b.buf.remote(AT),
                &[p.a.buf.segment(back, n)],
            ));
            let s = p.a.send_wait();
            assert_eq!(s.result(), Ok(n as u32), "{what}: read");
            assert_eq!(
                s.cs.status & status::OP_MASK,
                status::OP_RDMA_READ,
                "{what}"
            );
            assert!(
                p.a.buf.as_slice()[back..back + n] == data[..],
                "{what}: read back"
            );
        }
        if level == Reliability::Unreliable {
            let d = Descriptor::rdma_read(p.b.buf.remote(AT), &[p.a.buf.segment(0, 8)]);
            let rej = p.a.vi.post_send(Box::new(d)).unwrap_err();
            assert!(
                matches!(rej.error, PostError::NotEnabled(_)),
                "{:?}",
                rej.error
            );
            assert!(same_request(&rej.descriptor, &d));
        }
    }
}

/// Small RDMA writes of every shape land exactly, at aligned and odd
/// target addresses, with the bytes around them untouched: 16 bytes as two
/// ranges of 8 (a message and its flag word) or as one (on shm, once the
/// target has granted its region, the writer places them with one store),
/// and the shapes around them.
fn small_rdma_writes_land_exactly(link: &Link) {
    const AT: usize = 64 << 10;
    let shapes: [&[usize]; 6] = [&[8, 8], &[16], &[4, 12], &[12, 4], &[8], &[1, 7, 8]];
    for level in link.levels() {
        if level == Reliability::Unreliable {
            continue;
        }
        let mut p = link.pair(level);
        // The background, by RDMA write too: on shm the first write is
        // placed by the target, which then grants the region.
        p.a.buf.as_mut_slice()[..256].fill(0xee);
        p.a.post_send(Descriptor::rdma_write(
            p.b.buf.remote(AT),
            &[p.a.buf.segment(0, 256)],
        ));
        assert_eq!(p.a.send_wait().result(), Ok(256), "{level:?}: background");
        for (k, shape) in shapes.iter().enumerate() {
            for odd in [0, 3] {
                let what = format!("{level:?}, {shape:?} at +{odd}");
                let total: usize = shape.iter().sum();
                let data = pattern(total, k as u8 * 2 + odd as u8);
                // Each range from its own place in the source buffer.
                let mut segs = Vec::new();
                let (mut from, mut at) = (1024, 0);
                for &n in shape.iter() {
                    p.a.buf.as_mut_slice()[from..from + n].copy_from_slice(&data[at..at + n]);
                    segs.push(p.a.buf.segment(from, n));
                    from += n + 40;
                    at += n;
                }
                let to = AT + 64 + k * 32 + odd;
                p.a.post_send(Descriptor::rdma_write(p.b.buf.remote(to), &segs));
                assert_eq!(p.a.send_wait().result(), Ok(total as u32), "{what}");
                let b = p.b.buf.as_slice();
                assert_eq!(&b[to..to + total], &data[..], "{what}: written");
                assert_eq!(b[to - 1], 0xee, "{what}: the byte before");
                assert_eq!(b[to + total], 0xee, "{what}: the byte after");
                // Put the background back for the next shape.
                p.a.buf.as_mut_slice()[..64].fill(0xee);
                p.a.post_send(Descriptor::rdma_write(
                    p.b.buf.remote(to - 8),
                    &[p.a.buf.segment(0, total + 16)],
                ));
                assert_eq!(p.a.send_wait().result(), Ok(total as u32 + 16), "{what}");
            }
        }
    }
}

/// RDMA writes by copy (`Vi::write_copy`), mixed with posted writes and
/// sends: what a copy writes has landed when the call returns, in order
/// after the sends before it; a write the VI cannot place now (no grant
/// yet, a range past the window, an unknown region, more than two pieces)
/// is `Ok(false)` and writes nothing; a VI that is not connected refuses.
/// On shm, once the target has granted its region, copies go; the network
/// providers have no direct path to the peer's memory and always say
/// `false`.
fn rdma_writes_by_copy_land_at_once_or_are_declined(link: &Link) {
    const AT: usize = 256 << 10;
    const RX: usize = BUF / 2;
    let shm = link.attributes().provider == "shm";
    let idle = link
        .a
        .create_vi(ViAttributes::new(link.a.create_ptag().unwrap()), None, None);
    let err = idle
        .unwrap()
        .write_copy(&[&[1u8; 8]], Segment::remote(0, MemHandle(1)));
    assert!(matches!(err, Err(PostError::NotConnected(_))), "{err:?}");
    for level in link.reliable_levels() {
        let mut p = link.pair(level);
        let before_grant = p.a.vi.write_copy(&[&[7u8; 8]], p.b.buf.remote(AT)).unwrap();
        assert!(!before_grant, "{level:?}: a copy before any grant");
        assert!(p.b.buf.as_slice()[AT..AT + 8].iter().all(|&x| x == 0));
        // The grant comes with the first posted write.
        p.a.buf.as_mut_slice()[..64].fill(0xee);
        p.a.post_send(Descriptor::rdma_write(
            p.b.buf.remote(AT),
            &[p.a.buf.segment(0, 64)],
        ));
        assert_eq!(p.a.send_wait().result(), Ok(64), "{level:?}: background");
        let mut copied = 0;
        for i in 0..40usize {
            let what = format!("{level:?}, write {i}");
            let data = pattern(8 + i % 9, i as u8);
            let to = AT + 64 + i * 32 + i % 3;
            // Every fifth write follows a send the target may not have taken.
            if i % 5 == 4 {
                p.b.post_recv(RX, 64);
                let msg = pattern(40, i as u8 ^ 0x55);
                p.a.buf.as_mut_slice()[1024..1064].copy_from_slice(&msg);
                p.a.post_send(Descriptor::send(&[p.a.buf.segment(1024, 40)]));
                let by_copy =
                    p.a.vi
                        .write_copy(&[&data[..3], &data[3..]], p.b.buf.remote(to));
                if by_copy.unwrap() {
                    copied += 1;
                    assert_eq!(
                        &p.b.buf.as_slice()[RX..RX + 40],
                        &msg[..],
                        "{what}: the send before it has landed"
                    );
                    assert_eq!(p.a.send_wait().result(), Ok(40), "{what}: the send");
                } else {
                    p.a.buf.as_mut_slice()[2048..2048 + data.len()].copy_from_slice(&data);
                    p.a.post_send(Descriptor::rdma_write(
                        p.b.buf.remote(to),
                        &[p.a.buf.segment(2048, data.len())],
                    ));
                    // Completions in posting order: the send, then the write.
                    assert_eq!(p.a.send_wait().result(), Ok(40), "{what}: the send");
                    let w = p.a.send_wait().result();
                    assert_eq!(w, Ok(data.len() as u32), "{what}: the write");
                }
                assert_eq!(p.b.recv_wait().result(), Ok(40), "{what}: its receive");
            } else if p.a.vi.write_copy(&[&data], p.b.buf.remote(to)).unwrap() {
                copied += 1;
            } else {
                p.a.buf.as_mut_slice()[2048..2048 + data.len()].copy_from_slice(&data);
                p.a.post_send(Descriptor::rdma_write(
                    p.b.buf.remote(to),
                    &[p.a.buf.segment(2048, data.len())],
                ));
                let w = p.a.send_wait().result();
                assert_eq!(w, Ok(data.len() as u32), "{what}: the write");
            }
            let b = p.b.buf.as_slice();
            assert_eq!(&b[to..to + data.len()], &data[..], "{what}: written");
            assert_eq!(b[to + data.len()], 0, "{what}: the byte after");
        }
        assert_eq!(copied > 0, shm, "{level:?}: {copied} of 40 went by copy");
        // Declined, nothing written: past the window, an unknown region,
        // three pieces.
        let end = p.b.buf.remote(BUF - 4);
        assert!(!p.a.vi.write_copy(&[&[9u8; 8]], end).unwrap());
        assert!(p.b.buf.as_slice()[BUF - 4..].iter().all(|&x| x == 0));
        let stray = Segment::remote(p.b.buf.remote(AT).addr, MemHandle(0x7fff_fff0));
        assert!(!p.a.vi.write_copy(&[&[9u8; 8]], stray).unwrap());
        let three: [&[u8]; 3] = [&[9u8; 4], &[9u8; 4], &[9u8; 4]];
        assert!(!p
            .a
            .vi
            .write_copy(&three, p.b.buf.remote(AT + 8192))
            .unwrap());
        assert!(p.b.buf.as_slice()[AT + 8192..AT + 8204]
            .iter()
            .all(|&x| x == 0));
    }
}

/// What a refused RDMA request aims at.
struct Refused {
    what: &'static str,
    /// The target region's attributes.
    target: fn(Ptag) -> MemAttributes,
    /// The request, given the target region.
    request: fn(&MemoryRegion, &MemoryRegion) -> Descriptor,
}

/// RDMA the target does not allow (outside the region, or not enabled on
/// it) completes with an RDMA protection error at the initiator, leaves
/// memory on both sides untouched and breaks the reliable connection.
fn rdma_is_checked_on_the_target(link: &Link) {
    let rw = |t: Ptag| MemAttributes::new(t).rdma_write(true).rdma_read(true);
    let cases = [
        Refused {
            what: "write past the region's end",
            target: rw,
            request: |t, local| {
                Descriptor::rdma_write(t.remote(4096 - 10), &[local.segment(0, 50)])
            },
        },
        Refused {
            what: "read past the region's end",
            target: rw,
            request: |t, local| Descriptor::rdma_read(t.remote(4096 - 10), &[local.segment(0, 50)]),
        },
        Refused {
            what: "write to a region without RDMA write",
            target: |t| MemAttributes::new(t).rdma_read(true),
            request: |t, local| Descriptor::rdma_write(t.remote(0), &[local.segment(0, 50)]),
        },
        Refused {
            what: "read from a region without RDMA read",
            target: |t| MemAttributes::new(t).rdma_write(true),
            request: |t, local| Descriptor::rdma_read(t.remote(0), &[local.segment(0, 50)]),
        },
    ];
    for level in link.reliable_levels() {
        for c in &cases {
            let what = format!("{level:?}: {}", c.what);
            let mut p = link.pair(level);
            let mut target = p.b.nic.alloc_region(4096, (c.target)(p.b.ptag)).unwrap();
            target.as_mut_slice().fill(0x5a);
            p.a.buf.as_mut_slice()[..64].fill(0xa5);
            p.a.post_send((c.request)(&target, &p.a.buf));
            let s = p.a.send_wait();
            assert_eq!(s.error(), Some(CompletionError::RdmaProtection), "{what}");
            assert!(
                target.as_slice().iter().all(|&x| x == 0x5a),
                "{what}: target untouched"
            );
            assert!(
                p.a.buf.as_slice()[..64].iter().all(|&x| x == 0xa5),
                "{what}: initiator's memory untouched"
            );
            p.a.until_error(&format!("{what}: the initiator's VI breaks"));
            p.b.until_error(&format!("{what}: the target's VI breaks"));
        }
    }
}

/// An RDMA write to a VI that does not enable it never lands: the
/// providers differ in where they say so (the network providers refuse the
/// post, knowing the peer's attributes from the connection; `shm` completes
/// it with an RDMA protection error from the target), and either is taken.
fn rdma_write_to_a_vi_without_it_is_refused(link: &Link) {
    for level in link.levels() {
        let what = format!("{level:?}");
        let mut p = link.pair_with(
            |t| ViAttributes::new(t).reliability(level).rdma(false, true),
            false,
        );
        p.b.buf.as_mut_slice()[..64].fill(0x5a);
        let d = Descriptor::rdma_write(p.b.buf.remote(0), &[p.a.buf.segment(0, 50)]);
        match p.a.vi.post_send(Box::new(d)) {
            Err(rej) => {
                assert!(
                    matches!(rej.error, PostError::NotEnabled(_)),
                    "{what}: {}",
                    rej.error
                );
                assert!(same_request(&rej.descriptor, &d), "{what}");
                assert!(p.a.vi.queue_is_empty(Queue::Send), "{what}");
            }
            Ok(()) => {
                let s = p.a.send_wait();
                assert_eq!(s.error(), Some(CompletionError::RdmaProtection), "{what}");
                p.b.until_error(&format!("{what}: the target's VI breaks"));
            }
        }
        assert!(
            p.b.buf.as_slice()[..64].iter().all(|&x| x == 0x5a),
            "{what}: untouched"
        );
    }
}

/// An RDMA write with immediate data consumes the target's oldest receive
/// descriptor, which completes with the immediate data once the bytes are
/// in place; its own buffer is not written and the next send takes the
/// next receive.
fn rdma_write_with_immediate_consumes_a_receive(link: &Link) {
    const AT: usize = 128 << 10;
    const N: usize = 3000;
    for level in link.levels() {
        let what = format!("{level:?}");
        let mut p = link.pair(level);
        p.b.buf.as_mut_slice()[..128].fill(0xee);
        p.b.post_recv(0, 16);
        p.b.post_recv(64, 16);
        p.a.buf.as_mut_slice()[..N].copy_from_slice(&pattern(N, 9));
        p.a.post_send(
            Descriptor::rdma_write(p.b.buf.remote(AT), &[p.a.buf.segment(0, N)])
                .with_immediate(0xabcd),
        );
        assert_eq!(p.a.send_wait().result(), Ok(N as u32), "{what}: write");
        let r = p.b.recv_wait();
        assert_eq!(r.result(), Ok(N as u32), "{what}: the write's length");
        assert_eq!(r.immediate(), Some(0xabcd), "{what}");
        assert_eq!(
            r.cs.status & status::OP_MASK,
            status::OP_REMOTE_RDMA_WRITE,
            "{what}: the receive names the remote write"
        );
        assert!(
            p.b.buf.as_slice()[AT..AT + N] == pattern(N, 9),
            "{what}: bytes in place"
        );
        assert!(
            p.b.buf.as_slice()[..16].iter().all(|&x| x == 0xee),
            "{what}: receive buffer"
        );
        p.a.buf.as_mut_slice()[..4].copy_from_slice(b"next");
        p.a.send(0, 4);
        assert_eq!(p.a.send_wait().result(), Ok(4), "{what}");
        assert_eq!(p.b.recv_wait().result(), Ok(4), "{what}: the next receive");
        assert_eq!(&p.b.buf.as_slice()[64..68], b"next", "{what}");
    }
}

// ---------------------------------------------------------------------------
// Completion queues, waits, disconnection.
// ---------------------------------------------------------------------------

/// A CQ names the VI and queue of each completion, in completion order; the
/// VI's done call then hands the descriptor over, and a queue that reports
/// to a CQ cannot be waited on directly.
fn cq_notices_name_the_vi_and_queue(link: &Link) {
    let level = link.levels()[0];
    let mut p = link.pair_with(|t| ViAttributes::new(t).reliability(level), true);
    let (cq_a, cq_b) = (p.a.cq.clone().unwrap(), p.b.cq.clone().unwrap());
    assert_eq!(
        p.a.vi.send_wait(Some(SHORT)).unwrap_err(),
        WaitError::BoundToCq
    );
    assert_eq!(
        p.b.vi.recv_wait(Some(SHORT)).unwrap_err(),
        WaitError::BoundToCq
    );
    assert_eq!(cq_b.wait(Some(SHORT)).unwrap_err(), WaitError::Timeout);
    for i in 0..3 {
        p.b.post_recv(i * 64, 64);
    }
    for i in 0..3usize {
        p.a.buf.as_mut_slice()[i * 64..i * 64 + 10 + i].fill(i as u8);
        p.a.send(i * 64, 10 + i);
    }
    for (cq, end, queue) in [(&cq_a, &p.a, Queue::Send), (&cq_b, &p.b, Queue::Recv)] {
        for i in 0..3 {
            let c = cq.wait(Some(T)).unwrap();
            assert_eq!((c.vi.id(), c.queue), (end.vi.id(), queue), "notice {i}");
            let d = match queue {
                Queue::Send => c.vi.send_done(),
                Queue::Recv => c.vi.recv_done(),
            }
            .expect("the notice names a completed descriptor");
            assert_eq!(d.result(), Ok(10 + i as u32), "{queue:?} {i}");
        }
    }
    assert!(cq_a.done().unwrap().is_none());
    assert!(cq_b.done().unwrap().is_none());
    assert!(p.b.buf.as_slice()[128..140].iter().all(|&x| x == 2));
}

/// A thread asleep on a CQ wakes for a notice that another thread's post
/// makes, round after round. (A network VI's waiter may sleep in the VI's
/// receive, which the CQ's eventfd does not reach: the notice ends that
/// sleep within its bound, and later waits sleep where it does.)
fn a_cq_waiter_wakes_for_another_threads_notice(link: &Link) {
    for level in link.levels() {
        let mut p = link.pair_with(|t| ViAttributes::new(t).reliability(level), true);
        let (cq_a, cq_b) = (p.a.cq.clone().unwrap(), p.b.cq.clone().unwrap());
        for round in 0..4u8 {
            p.b.post_recv(0, 64);
            let waiter = std::thread::spawn({
                let cq = cq_a.clone();
                move || cq.wait(Some(T))
            });
            // The waiter asleep by then, in its first sleep or a later one.
            std::thread::sleep([Duration::from_millis(1), SHORT][round as usize % 2]);
            p.a.buf.as_mut_slice()[..8].fill(round);
            p.a.send(0, 8);
            let c = waiter
                .join()
                .unwrap()
                .unwrap_or_else(|e| panic!("{level:?} round {round}: {e}"));
            assert_eq!((c.vi.id(), c.queue), (p.a.vi.id(), Queue::Send));
            let d = c.vi.send_done().expect("the notice names a completed send");
            assert_eq!(d.result(), Ok(8), "{level:?} round {round}");
            let r = cq_b.wait(Some(T)).unwrap();
            assert_eq!(r.queue, Queue::Recv);
            let d =
                r.vi.recv_done()
                    .expect("the notice names a completed receive");
            assert_eq!(d.result(), Ok(8), "{level:?} round {round}");
            assert!(p.b.buf.as_slice()[..8].iter().all(|&x| x == round));
        }
    }
}

/// A wait with a timeout returns when it passes, and the descriptor waited
/// for stays posted.
fn a_wait_times_out_and_the_descriptor_stays(link: &Link) {
    let mut p = link.pair(link.levels()[0]);
    p.b.post_recv(0, 64);
    assert_eq!(
        p.b.vi.recv_wait(Some(SHORT)).unwrap_err(),
        WaitError::Timeout
    );
    assert_eq!(
        p.a.vi.send_wait(Some(SHORT)).unwrap_err(),
        WaitError::Timeout
    );
    assert!(!p.b.vi.queue_is_empty(Queue::Recv));
    p.a.buf.as_mut_slice()[..3].copy_from_slice(b"abc");
    p.a.send(0, 3);
    assert_eq!(p.a.send_wait().result(), Ok(3));
    assert_eq!(p.b.recv_wait().result(), Ok(3));
    assert_eq!(&p.b.buf.as_slice()[..3], b"abc");
}

/// A disconnect completes every outstanding descriptor on both sides as
/// flushed; the side that disconnected is idle, its peer in Error.
fn disconnect_flushes_both_sides(link: &Link) {
    for level in link.levels() {
        let what = format!("{level:?}");
        let p = link.pair(level);
        for i in 0..3 {
            p.b.post_recv(i * 64, 64);
        }
        for i in 0..2 {
            p.a.post_recv(i * 64, 64);
        }
        p.a.vi.disconnect();
        assert_eq!(p.a.vi.state(), ViState::Idle, "{what}");
        for i in 0..2 {
            let d = p.a.recv_wait();
            assert_eq!(
                d.error(),
                Some(CompletionError::Flushed),
                "{what}: a's receive {i}"
            );
        }
        for i in 0..3 {
            let d = p.b.recv_wait();
            assert_eq!(
                d.error(),
                Some(CompletionError::Flushed),
                "{what}: b's receive {i}"
            );
        }
        assert_eq!(p.b.vi.state(), ViState::Error, "{what}");
        let d = Descriptor::send(&[p.b.buf.segment(0, 8)]);
        assert_eq!(
            p.b.vi.post_send(Box::new(d)).unwrap_err().error,
            PostError::ViError
        );
        p.b.vi.disconnect();
        assert_eq!(p.b.vi.state(), ViState::Idle, "{what}");
    }
}

/// Sends that wait for the peer's receive descriptors are outstanding
/// descriptors too: a disconnect completes the disconnecting side's as
/// flushed and fails the peer's (reliable reception, where a send completes
/// only in a receive; `rnr_retry` keeps a network sender trying meanwhile).
fn disconnect_fails_sends_waiting_for_the_peer(link: &Link) {
    let level = Reliability::ReliableReception;
    if !link.levels().contains(&level) {
        println!("skipped: the provider does not offer {level:?}");
        return;
    }
    let p = link.pair_with(
        |t| ViAttributes::new(t).reliability(level).rnr_retry(true),
        false,
    );
    p.b.post_recv(0, 64);
    for i in 0..3 {
        p.a.send(i * 64, 8);
    }
    assert_eq!(p.a.send_wait().result(), Ok(8), "the send b had room for");
    assert_eq!(p.b.recv_wait().result(), Ok(8));
    for i in 0..2 {
        p.b.send(i * 64, 4);
    }
    assert_eq!(
        p.a.vi.send_wait(Some(SHORT)).unwrap_err(),
        WaitError::Timeout
    );
    assert_eq!(
        p.b.vi.send_wait(Some(SHORT)).unwrap_err(),
        WaitError::Timeout
    );
    p.a.vi.disconnect();
    for i in 0..2 {
        let d = p.a.send_wait();
        assert_eq!(d.error(), Some(CompletionError::Flushed), "a's send {i}");
    }
    for i in 0..2 {
        let d = p.b.send_wait();
        assert!(
            ended_with_the_connection(&d),
            "b's send {i}: {:?}",
            d.result()
        );
    }
    assert_eq!(p.a.vi.state(), ViState::Idle);
    assert_eq!(p.b.vi.state(), ViState::Error);
}

/// A send its sender saw complete is not lost when the sender leaves
/// before the receiver posted a receive for it: at the levels where a send
/// completes before a receive takes it, the receive posted after the
/// disconnect (and after the receiver looked at its peer's health) gets
/// it, intact and in order, and the connection's end reaches the receiver
/// only after it. (Where a send fails for want of a receive, as on the
/// network media, there is nothing to look for.)
fn a_completed_send_outlives_its_sender(link: &Link) {
    const WORDS: [&[u8]; 3] = [b"one", b"two", b"six"];
    for level in link.reliable_levels() {
        let what = format!("{level:?}");
        let mut p = link.pair(level);
        for (i, w) in WORDS.iter().enumerate() {
            p.a.buf.as_mut_slice()[i * 64..i * 64 + 3].copy_from_slice(w);
            p.a.send(i * 64, 3);
        }
        // (A network receiver refuses a message it has no receive for: the
        // send fails and none after it completes.)
        let mut done = 0;
        while let Ok(d) = p.a.vi.send_wait(Some(SHORT)) {
            if d.result() != Ok(3) {
                break;
            }
            done += 1;
        }
        p.a.vi.disconnect();
        if done == 0 {
            continue;
        }
        // The receiver looks at its peer's health (the driver's polls do
        // it only every few thousand times) and finds it gone.
        for _ in 0..3 {
            while !p.b.vi.try_watch() {
                std::thread::yield_now();
            }
        }
        for i in 0..WORDS.len() {
            p.b.post_recv(i * 64, 64);
        }
        for (i, w) in WORDS.iter().enumerate().take(done) {
            let d = p.b.recv_wait();
            assert_eq!(d.result(), Ok(3), "{what}: the send a saw complete, {i}");
            assert_eq!(&p.b.buf.as_slice()[i * 64..i * 64 + 3], *w, "{what}: {i}");
        }
        p.b.until_error(&what);
    }
}

// ---------------------------------------------------------------------------
// Every behaviour on every medium.
/// Private data crosses the handshake both ways: the request's reaches the
/// server, the accept's and a reject's reach the client; too much is refused
/// at the call.
fn private_data_crosses_the_handshake(link: &Link) {
    let ptag = link.a.create_ptag().unwrap();
    let server_tag = link.b.create_ptag().unwrap();
    let client = link
        .a
        .create_vi(ViAttributes::new(ptag), None, None)
        .unwrap();
    let server = link
        .b
        .create_vi(ViAttributes::new(server_tag), None, None)
        .unwrap();
    let too_long = [7u8; MAX_PRIVATE_DATA + 1];
    let disc = Discriminator::from_u64(unique());
    let to = NetAddress::new(&link.b_host, disc.clone());
    assert!(matches!(
        client.connect_request_with(&to, T, &too_long),
        Err(ConnectError::PrivateDataTooLong(n)) if n == MAX_PRIVATE_DATA + 1
    ));
    assert_eq!(
        client.state(),
        ViState::Idle,
        "a refused call changes nothing"
    );

    // Refused, with the server's reason in its private data.
    let (nic, d) = (link.b.clone(), disc.clone());
    let refuser = std::thread::spawn(move || {
        let mut req = nic.connect_wait(&d, Some(T)).unwrap();
        let asked = req.private_data().to_vec();
        req.reject_with(b"come back later").unwrap();
        asked
    });
    let r = client.connect_request_with(&to, T, b"first try");
    assert!(matches!(r, Err(ConnectError::Rejected)), "{r:?}");
    assert_eq!(refuser.join().unwrap(), b"first try");
    assert_eq!(client.peer_private_data(), b"come back later");

    // Accepted: 64 bytes each way.
    let asked: Vec<u8> = (0..MAX_PRIVATE_DATA as u8).collect();
    let answer: Vec<u8> = asked.iter().rev().copied().collect();
    let disc = Discriminator::from_u64(unique());
    let to = NetAddress::new(&link.b_host, disc.clone());
    let (nic, vi, d, reply) = (link.b.clone(), server.clone(), disc.clone(), answer.clone());
    let acceptor = std::thread::spawn(move || {
        let mut req = nic.connect_wait(&d, Some(T)).unwrap();
        assert!(matches!(
            req.accept_with(&vi, &[0; MAX_PRIVATE_DATA + 1]),
            Err(ConnectError::PrivateDataTooLong(_))
        ));
        let asked = req.private_data().to_vec();
        req.accept_with(&vi, &reply).unwrap();
        nic.stop_listening(&d);
        asked
    });
    client.connect_request_with(&to, T, &asked).unwrap();
    assert_eq!(acceptor.join().unwrap(), asked);
    assert_eq!(client.peer_private_data(), answer);
    assert_eq!(client.state(), ViState::Connected);
    client.disconnect();
}

/// A request to a discriminator nobody listens on: VIA's client asks again
/// until its timeout (its server may not listen yet), then says nobody
/// listens; a request to a server that listens already
/// (`connect_request_listening`) is refused at once; a listener that comes
/// within the timeout is found.
fn a_request_nobody_listens_to(link: &Link) {
    let ptag = link.a.create_ptag().unwrap();
    let client = link
        .a
        .create_vi(ViAttributes::new(ptag), None, None)
        .unwrap();
    let to = NetAddress::new(&link.b_host, Discriminator::from_u64(unique()));
    let patience = Duration::from_millis(300);
    // On a network somebody must be at the peer's medium to say that
    // nobody listens: a server waiting on another discriminator.
    let (nic, other) = (link.b.clone(), Discriminator::from_u64(unique()));
    let elsewhere = std::thread::spawn(move || {
        let r = nic.connect_wait(&other, Some(Duration::from_millis(1500)));
        assert!(matches!(r, Err(ConnectError::Timeout(_))), "{:?}", r.err());
        nic.stop_listening(&other);
    });

    let t0 = Instant::now();
    let r = client.connect_request(&to, patience);
    let waited = t0.elapsed();
    assert!(matches!(r, Err(ConnectError::NoListener { .. })), "{r:?}");
    assert!(waited >= patience, "gave up after {waited:?}");
    assert_eq!(client.state(), ViState::Idle);

    let t0 = Instant::now();
    let r = client.connect_request_listening(&to, T, &[]);
    let waited = t0.elapsed();
    assert!(matches!(r, Err(ConnectError::NoListener { .. })), "{r:?}");
    assert!(
        waited < Duration::from_millis(500),
        "refused after {waited:?}"
    );
    assert_eq!(client.state(), ViState::Idle);
    elsewhere.join().unwrap();

    // A server that starts listening late is still found by VIA's request.
    let server_tag = link.b.create_ptag().unwrap();
    let server = link
        .b
        .create_vi(ViAttributes::new(server_tag), None, None)
        .unwrap();
    let (nic, vi, d) = (link.b.clone(), server.clone(), to.discriminator.clone());
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let mut req = nic.connect_wait(&d, Some(T)).unwrap();
        req.accept(&vi).unwrap();
        nic.stop_listening(&d);
    });
    client.connect_request(&to, T).unwrap();
    late.join().unwrap();
    client.disconnect();
}

// ---------------------------------------------------------------------------

/// One test of a behaviour on one medium: `run`, or `bug` with what the
/// provider does instead today (ignored; `--ignored` runs it).
macro_rules! instance {
    (run $medium:ident $behaviour:ident $($bug:literal)?) => {
        #[test]
        fn $behaviour() {
            super::run(super::Medium::$medium, super::$behaviour)
        }
    };
    (bug $medium:ident $behaviour:ident $bug:literal) => {
        #[test]
        #[ignore = $bug]
        fn $behaviour() {
            super::run(super::Medium::$medium, super::$behaviour)
        }
    };
}

/// Each behaviour on each medium, in modules named after the media
/// (`cargo test --test behaviour udp::` runs one medium).
macro_rules! on_every_medium {
    ($($behaviour:ident: $shm:ident $udp:ident $xdp:ident $(= $bug:literal)?;)*) => {
        mod shm {
            $(instance!($shm Shm $behaviour $($bug)?);)*
        }
        mod udp {
            $(instance!($udp Udp $behaviour $($bug)?);)*
        }
        mod xdp {
            $(instance!($xdp Xdp $behaviour $($bug)?);)*
        }
    };
}

on_every_medium! {
    //                                                          shm udp xdp
    every_size_arrives_intact_with_its_immediate_data:          run run run;
    completions_come_in_posting_order:                          run run run;
    copied_sends_keep_their_place_among_posted_ones:            run run run;
    refused_posts_hand_the_descriptor_back_and_queue_nothing:   run run run;
    a_short_receive_is_a_length_error:                          run run run;
    deregistered_memory_under_a_posted_receive_is_not_written:  run run run;
    rdma_write_and_read_land_on_the_target:                     run run run;
    small_rdma_writes_land_exactly:                             run run run;
    rdma_writes_by_copy_land_at_once_or_are_declined:           run run run;
    rdma_is_checked_on_the_target:                              run run run;
    rdma_write_to_a_vi_without_it_is_refused:                   run run run;
    rdma_write_with_immediate_consumes_a_receive:               run run run;
    cq_notices_name_the_vi_and_queue:                           run run run;
    a_cq_waiter_wakes_for_another_threads_notice:               run run run;
    a_wait_times_out_and_the_descriptor_stays:                  run run run;
    disconnect_flushes_both_sides:                              run run run;
    disconnect_fails_sends_waiting_for_the_peer:                run run run;
    a_completed_send_outlives_its_sender:                       run run run;
    private_data_crosses_the_handshake:                         run run run;
    a_request_nobody_listens_to:                                run run run;
}

/// A server of job `job-a` and clients without a key, of job `job-b` and of
/// `job-a`: only the last is heard; the others learn why at once.
fn a_job_key_keeps_two_jobs_apart(medium: Medium) {
    let key = |k: &str| NicOptions {
        job_key: Some(k.into()),
        ..NicOptions::default()
    };
    for (client, accepted) in [("", false), ("job-b", false), ("job-a", true)] {
        let link = match medium.link_with(&key(client), &key("job-a")) {
            Ok(l) => l,
            Err(why) => return println!("skipped: {why}"),
        };
        let disc = Discriminator::from_u64(unique());
        let ptag = link.a.create_ptag().unwrap();
        let vi = link
            .a
            .create_vi(ViAttributes::new(ptag), None, None)
            .unwrap();
        let (nic, d) = (link.b.clone(), disc.clone());
        let server = std::thread::spawn(move || {
            let ptag = nic.create_ptag().unwrap();
            let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
            let mut req = nic.connect_wait(&d, Some(Duration::from_secs(1))).ok()?;
            req.accept(&vi).unwrap();
            Some(vi)
        });
        let r = vi.connect_request(&NetAddress::new(&link.b_host, disc), T);
        match accepted {
            true => assert!(r.is_ok(), "{medium:?} {client:?}: {r:?}"),
            false => assert!(
                matches!(r, Err(ConnectError::WrongJob)),
                "{medium:?} {client:?}: {r:?}"
            ),
        }
        let heard = server.join().unwrap();
        assert_eq!(
            heard.is_some(),
            accepted,
            "{medium:?} {client:?}: the server heard it"
        );
    }
}

#[test]
fn a_job_key_keeps_two_jobs_apart_on_shm() {
    a_job_key_keeps_two_jobs_apart(Medium::Shm)
}

#[test]
fn a_job_key_keeps_two_jobs_apart_on_udp() {
    a_job_key_keeps_two_jobs_apart(Medium::Udp)
}

#[test]
fn a_job_key_keeps_two_jobs_apart_on_xdp() {
    a_job_key_keeps_two_jobs_apart(Medium::Xdp)
}

/// A receiver that destroys its VI as soon as its last message is in,
/// half of its frames to the sender lost: the sender's send of that
/// message completes (the receiver's Nic keeps the closing connection and
/// answers the sender until it has the disconnect, which carries the
/// acknowledgement), and does not fail at the idle timeout. (The fault
/// injector drops what a Nic receives: the sender's Nic is the lossy one.)
fn the_last_send_completes_when_its_receiver_leaves_at_once(medium: Medium) {
    for seed in 1..=5 {
        let link = match medium.lossy_link(0.5, seed) {
            Ok(l) => l,
            Err(why) => return println!("skipped: {why}"),
        };
        let disc = Discriminator::from_u64(unique());
        let ptag = link.a.create_ptag().unwrap();
        let vi = link
            .a
            .create_vi(ViAttributes::new(ptag), None, None)
            .unwrap();
        let buf = link.a.alloc_region(64, MemAttributes::new(ptag)).unwrap();
        vi.post_recv(Box::new(Descriptor::recv(&[buf.segment(0, 64)])))
            .unwrap();
        let (nic, d) = (link.b.clone(), disc.clone());
        let server = std::thread::spawn(move || {
            let ptag = nic.create_ptag().unwrap();
            let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
            let mut buf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
            let mut req = nic.connect_wait(&d, Some(T)).unwrap();
            req.accept(&vi).unwrap();
            buf.as_mut_slice()[..8].fill(seed);
            vi.post_send(Box::new(Descriptor::send(&[buf.segment(0, 8)])))
                .unwrap();
            vi.send_wait(Some(T + T))
        });
        vi.connect_request(&NetAddress::new(&link.b_host, disc), T)
            .unwrap();
        let r = vi.recv_wait(Some(T)).unwrap();
        assert_eq!(r.result(), Ok(8), "{medium:?} seed {seed}");
        assert!(buf.as_slice()[..8].iter().all(|&x| x == seed));
        drop(vi);
        let sent = server.join().unwrap().unwrap();
        assert_eq!(
            sent.result(),
            Ok(8),
            "{medium:?} seed {seed}: the sender's send"
        );
    }
}

#[test]
fn the_last_send_completes_when_its_receiver_leaves_at_once_on_udp() {
    the_last_send_completes_when_its_receiver_leaves_at_once(Medium::Udp)
}

#[test]
fn the_last_send_completes_when_its_receiver_leaves_at_once_on_xdp() {
    the_last_send_completes_when_its_receiver_leaves_at_once(Medium::Xdp)
}

/// On xdp a closing connection stays on its Nic's medium; a program that
/// closes the Nic right after the VI gets it closed in its own call, not
/// later in the thread that serves closing connections: the AF_XDP queue
/// opens again at once.
#[test]
fn a_nic_closed_while_its_connection_closes_frees_its_queue_at_once() {
    // Closing, a connection is kept until its peer has been quiet a while
    // after the disconnect (some 200 ms): the Nic goes while it is kept.
    let opts = NicOptions::default();
    let link = match Medium::Xdp.link_with(&opts, &opts) {
        Ok(l) => l,
        Err(why) => return println!("skipped: {why}"),
    };
    let Link {
        a,
        b,
        b_host,
        _hosts: hosts,
    } = link;
    let hosts = hosts.expect("an xdp link has test hosts");
    let mut a = Some(a);
    for round in 0..3 {
        let nic = a.take().unwrap();
        let disc = Discriminator::from_u64(unique());
        let ptag = nic.create_ptag().unwrap();
        let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
        let buf = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
        vi.post_recv(Box::new(Descriptor::recv(&[buf.segment(8, 8)])))
            .unwrap();
        let (server_nic, d) = (b.clone(), disc.clone());
        // The server takes one message and answers it: its waits drive its
        // side (an accept or acknowledgement lost goes again); the answer's
        // acknowledgement comes with the client's disconnect.
        let server = std::thread::spawn(move || {
            let ptag = server_nic.create_ptag().unwrap();
            let vi = server_nic
                .create_vi(ViAttributes::new(ptag), None, None)
                .unwrap();
            let buf = server_nic
                .alloc_region(64, MemAttributes::new(ptag))
                .unwrap();
            vi.post_recv(Box::new(Descriptor::recv(&[buf.segment(0, 64)])))
                .unwrap();
            let mut req = server_nic.connect_wait(&d, Some(T)).unwrap();
            req.accept(&vi).unwrap();
            let got = vi.recv_wait(Some(T)).map(|d| d.result());
            vi.post_send(Box::new(Descriptor::send(&[buf.segment(0, 8)])))
                .unwrap();
            let answered = vi.send_wait(Some(T)).map(|d| d.result());
            (got, answered)
        });
        if let Err(e) = vi.connect_request(&NetAddress::new(&b_host, disc), T) {
            panic!("round {round}: connecting: {e}");
        }
        vi.post_send(Box::new(Descriptor::send(&[buf.segment(0, 8)])))
            .unwrap();
        let answer = vi.recv_wait(Some(T)).map(|d| d.result());
        assert_eq!(answer, Ok(Ok(8)), "round {round}");
        drop(buf);
        drop(vi);
        drop(nic);
        let (got, answered) = server.join().unwrap();
        assert_eq!(got, Ok(Ok(8)), "round {round}");
        assert_eq!(answered, Ok(Ok(8)), "round {round}: the answer's send");
        let _on = hosts.enter(Side::A).unwrap();
        let again = Nic::open_with(&format!("xdp:{}", hosts.iface(Side::A)), &opts);
        a = Some(again.unwrap_or_else(|e| panic!("round {round}: reopening the queue: {e}")));
    }
}
