//! The fast path allocates nothing: an empty poll of a VI or a CQ, and a
//! send and its receive on `shm` once connected. Counted with a global
//! allocator that tallies the allocations of the thread under test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;
use uvia::*;

struct Counting;

thread_local! {
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; the count
// is a thread-local cell, touched without allocating.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded from the caller.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded from the caller.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded from the caller.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn allocations() -> u64 {
    COUNT.with(|c| c.get())
}

#[test]
fn empty_polls_and_the_shm_fast_path_allocate_nothing() {
    let nic = Nic::open("shm").unwrap();
    let ptag = nic.create_ptag().unwrap();
    let cq = nic.create_cq(64).unwrap();
    let attrs = ViAttributes::new(ptag);
    let client = nic.create_vi(attrs, None, None).unwrap();
    let server = nic.create_vi(attrs, None, Some(&cq)).unwrap();
    let disc = Discriminator::from_u64(0xa110c000 ^ std::process::id() as u64);
    let (n2, s2, d2) = (nic.clone(), server.clone(), disc.clone());
    let t = std::thread::spawn(move || {
        let mut req = n2.connect_wait(&d2, Some(Duration::from_secs(5))).unwrap();
        req.accept(&s2).unwrap();
    });
    client
        .connect_request(&NetAddress::new("0", disc), Duration::from_secs(5))
        .unwrap();
    t.join().unwrap();
    let src = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    let dst = nic.alloc_region(64, MemAttributes::new(ptag)).unwrap();
    // Descriptors made before counting; each goes back and forth by pointer.
    let mut send = Some(Box::new(Descriptor::send(&[src.segment(0, 8)])));
    let mut recv = Some(Box::new(Descriptor::recv(&[dst.segment(0, 64)])));

    let before = allocations();
    for _ in 0..10_000 {
        assert!(cq.done().unwrap().is_none());
        assert!(client.recv_done().is_none());
        assert!(client.send_done().is_none());
    }
    assert_eq!(allocations() - before, 0, "empty polls allocated");

    let before = allocations();
    for _ in 0..1_000 {
        server.post_recv(recv.take().unwrap()).unwrap();
        client.post_send(send.take().unwrap()).unwrap();
        send = Some(loop {
            if let Some(d) = client.send_done() {
                break d;
            }
        });
        let notice = loop {
            if let Some(n) = cq.done().unwrap() {
                break n;
            }
        };
        assert_eq!(notice.queue, Queue::Recv);
        drop(notice);
        let d = server.recv_done().unwrap();
        assert_eq!(d.result(), Ok(8));
        recv = Some(d);
    }
    assert_eq!(
        allocations() - before,
        0,
        "sends and receives on shm allocated"
    );
}
