//! A network Nic whose program does not poll it keeps its connections:
//! the library's progress thread runs its protocol timers (acknowledgements,
//! retransmissions, keep-alives) between the program's calls. Each test
//! also opens the Nic it leaves alone with `manual_progress`, where the
//! same connection must fail: the thread, not something else, kept it.
//! Two udp Nics of this process on loopback, a short idle timeout.

use std::time::Duration;
use uvia::*;

/// Silence that breaks a connection: keep-alives go every quarter of it.
const IDLE: Duration = Duration::from_millis(400);
const T: Duration = Duration::from_secs(5);

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
    assert_eq!(exchange_after_a_quiet_while(73, false), Ok(()));
    // The client's Nic still has the thread: it finds the server's silent.
    let r = exchange_after_a_quiet_while(74, true);
    assert!(r.is_err(), "a server nobody drives: {r:?}");
}
