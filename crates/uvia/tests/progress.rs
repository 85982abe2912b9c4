//! A network Nic whose program does not poll it keeps its connections:
//! the library's progress thread runs its protocol timers (acknowledgements,
//! retransmissions, keep-alives) between the program's calls. Each test
//! also opens the Nic it leaves alone with `manual_progress`, where the
//! same connection must fail: the thread, not something else, kept it.
//! Two udp Nics of this process on loopback, a short idle timeout.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use uvia::*;

/// Silence that breaks a connection: keep-alives go every quarter of it.
const IDLE: Duration = Duration::from_millis(400);
const T: Duration = Duration::from_secs(5);

/// The tests one at a time: a child forked while another test's thread
/// held one of the library's locks would find it held for good.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}

struct End {
    nic: Nic,
    vi: Vi,
    buf: MemoryRegion,
}

fn end(manual_progress: bool) -> End {
    let nic = Nic::open_with(
        "udp",
        &NicOptions {
            idle_timeout: Some(IDLE),
            manual_progress,
            ..NicOptions::default()
        },
    )
    .expect("a udp Nic on loopback");
    let ptag = nic.create_ptag().unwrap();
    let buf = nic.alloc_region(4096, MemAttributes::new(ptag)).unwrap();
    let vi = nic.create_vi(ViAttributes::new(ptag), None, None).unwrap();
    End { nic, vi, buf }
}

/// A client and a server end (`server_manual`: its Nic without the
/// progress thread), connected on discriminator `d`; neither polled after.
fn connected(d: u64, server_manual: bool) -> (End, End) {
    let client = end(false);
    let server = end(server_manual);
    let disc = Discriminator::from_u64(d);
    let to = NetAddress::new(&server.nic.attributes().address, disc.clone());
    std::thread::scope(|s| {
        let accepting = s.spawn(|| {
            let mut req = server.nic.connect_wait(&disc, Some(T)).unwrap();
            req.accept(&server.vi).unwrap();
        });
        client.vi.connect_request(&to, T).expect("connects");
        accepting.join().unwrap();
    });
    (client, server)
}

/// A send's outcome when its peer's program makes no call meanwhile: the
/// peer's receive is posted before, and looked at only after.
fn send_to_an_unpolled_peer(d: u64, server_manual: bool) -> (Result<u32, String>, End) {
    let (client, server) = connected(d, server_manual);
    server
        .vi
        .post_recv(Box::new(Descriptor::recv(&[server.buf.segment(0, 64)])))
        .unwrap();
    client
        .vi
        .post_send(Box::new(Descriptor::send(&[client.buf.segment(0, 64)])))
        .unwrap();
    let sent = client
        .vi
        .send_wait(Some(T))
        .map_err(|e| format!("{e:?}"))
        .and_then(|d| d.result().map_err(|e| format!("{e}")));
    (sent, server)
}

#[test]
fn a_send_to_a_nic_nobody_polls_is_acknowledged() {
    let _one = one_at_a_time();
    let (sent, server) = send_to_an_unpolled_peer(71, false);
    assert_eq!(sent, Ok(64), "the unpolled peer's Nic acknowledged it");
    let got = server.vi.recv_wait(Some(T)).unwrap();
    assert_eq!(got.result(), Ok(64), "and it arrived");
    // Without the thread the peer stays silent and the send fails.
    let (sent, _) = send_to_an_unpolled_peer(72, true);
    assert!(sent.is_err(), "a peer nobody drives: {sent:?}");
}

/// Both ends idle for three idle timeouts, neither polled; then a message
/// each way.
fn exchange_after_a_quiet_while(d: u64, server_manual: bool) -> Result<(), String> {
    let (client, server) = connected(d, server_manual);
    std::thread::sleep(IDLE * 3);
    for (from, to) in [(&client, &server), (&server, &client)] {
        to.vi
            .post_recv(Box::new(Descriptor::recv(&[to.buf.segment(0, 8)])))
            .unwrap();
        from.vi
            .post_send(Box::new(Descriptor::send(&[from.buf.segment(8, 8)])))
            .map_err(|r| format!("posting: {:?}", r.error))?;
        let s = from.vi.send_wait(Some(T)).map_err(|e| format!("{e:?}"))?;
        s.result().map_err(|e| format!("send: {e}"))?;
        let r = to.vi.recv_wait(Some(T)).map_err(|e| format!("{e:?}"))?;
        r.result().map_err(|e| format!("receive: {e}"))?;
    }
    Ok(())
}

#[test]
fn an_idle_connection_nobody_polls_stays_up() {
    let _one = one_at_a_time();
    assert_eq!(exchange_after_a_quiet_while(73, false), Ok(()));
    // The client's Nic still has the thread: it finds the server's silent.
    let r = exchange_after_a_quiet_while(74, true);
    assert!(r.is_err(), "a server nobody drives: {r:?}");
}

/// A child made by `fork` after its parent's thread started has none (a
/// process's threads do not follow it into the child): its first Nic
/// starts one of its own. The parent opens a Nic, so that its thread runs,
/// and forks; the child makes the send to an unpolled peer and says by its
/// exit status whether it was acknowledged and arrived.
#[test]
fn a_forked_child_has_a_progress_thread_of_its_own() {
    let _one = one_at_a_time();
    let _parent = end(false);
    // SAFETY: the child uses the library alone (no test runs meanwhile)
    // and leaves by `_exit`, never returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let delivered = std::panic::catch_unwind(|| {
            let (sent, server) = send_to_an_unpolled_peer(75, false);
            let got = server.vi.recv_wait(Some(T)).map(|d| d.result());
            sent == Ok(64) && matches!(got, Ok(Ok(64)))
        });
        // SAFETY: ends the child at once, as `fork`'s children should.
        unsafe { libc::_exit(if matches!(delivered, Ok(true)) { 0 } else { 1 }) };
    }
    let start = Instant::now();
    let mut status = 0;
    // SAFETY: waits for the child made above; `status` is ours.
    while unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } != pid {
        if start.elapsed() > Duration::from_secs(30) {
            // SAFETY: as above; the child is ours to end.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("the forked child did not finish in 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child's send to a Nic it did not poll was not acknowledged and delivered \
         (wait status {status:#x})"
    );
}
