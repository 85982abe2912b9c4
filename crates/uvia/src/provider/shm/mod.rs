//! The `shm` provider: VIs between processes of one host, over rings in a
//! memory segment the two share (`conn`), driven by the VI's own calls
//! (`vi`).
//!
//! Connection management: a server listens on an owner-only Unix socket per
//! (Nic instance, discriminator); the client creates the connection's
//! segment and passes it, with its CQ eventfds, in its request; the server
//! answers accept or reject. The socket stays open for the life of the
//! connection: the kernel closes it when a process dies, which is how a dead
//! peer is seen.

mod agent;
mod conn;
mod vi;

pub(crate) use conn::INLINE_MAX;
pub(crate) use vi::{ShmVi, Sleep};

use crate::cm::{
    check_compatible, ConnRequest, Discriminator, NetAddress, Patience, RemoteViAttributes,
};
use crate::error::{ConnectError, OpenError};
use crate::nic::{Nic, NicAttributes, NicOptions};
use crate::provider::{Answer as AnyAnswer, NicOps, NicProvider, Opened, Transport};
use crate::vi::{Vi, ViAttributes};
use conn::hello::{self, Hello};
use conn::ShmConn;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uvia_shm::socket::hex_name;
use uvia_shm::{Listener, PeerEventfd, Segment as ShmSegment, SocketDir, Stream};

/// Most eventfds a side passes: its process's agent's, then its send and
/// receive CQs'.
const MAX_EVENTFDS: usize = 3;

/// The peer's agent eventfd and CQ eventfds, if there is an agent's and
/// each is an eventfd.
fn check_eventfds(
    fds: impl ExactSizeIterator<Item = OwnedFd>,
) -> Option<(PeerEventfd, Vec<PeerEventfd>)> {
    if fds.len() > MAX_EVENTFDS {
        return None;
    }
    let mut v: Vec<PeerEventfd> = fds
        .map(|fd| PeerEventfd::check(fd).ok())
        .collect::<Option<_>>()?;
    if v.is_empty() {
        return None;
    }
    let agent = v.remove(0);
    Some((agent, v))
}

/// Longest wait for a connecting client's request, once it has connected;
/// the clients that connected are waited on together.
const HELLO_WAIT: Duration = Duration::from_secs(5);

/// An shm Nic: its instance name (the address space of its discriminators)
/// and the sockets it listens on.
pub(crate) struct ShmNic {
    instance: String,
    dir: SocketDir,
    listeners: Mutex<HashMap<Vec<u8>, Listener>>,
    /// The job key its requests carry and its listeners require (0: none).
    job: u64,
    /// Set by the first grant of its regions to a peer that was tried
    /// (`conn::Grants`): until then a region's change withdraws nothing.
    pub(crate) grants: AtomicBool,
}

/// `shm` (instance `0`) or `shm:<instance>`.
pub(crate) fn open(name: &str, opts: &NicOptions) -> Result<Opened, OpenError> {
    let instance = match name.split_once(':') {
        None => "0".to_string(),
        Some((_, inst))
            if !inst.is_empty()
                && inst
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') =>
        {
            inst.to_string()
        }
        _ => {
            return Err(OpenError::bad_address(
                name,
                "an instance name is letters, digits, '-' and '_'",
            ))
        }
    };
    let dir = SocketDir::from_env().map_err(|source| OpenError::Io {
        provider: "shm",
        source,
    })?;
    let attrs = NicAttributes {
        inline_threshold: INLINE_MAX,
        shared_window_from: Some(conn::INLINE_MAX_UNMAPPED),
        shared_copy_from: Some(conn::SHARE_COPY_FROM),
        host_local: true,
        ..NicAttributes::common(name, "shm", instance.clone())
    };
    let nic = ShmNic {
        instance,
        dir,
        listeners: Mutex::new(HashMap::new()),
        job: crate::nic::job_key(opts),
        grants: AtomicBool::new(false),
    };
    Ok((attrs, NicProvider::Shm(nic)))
}

fn socket_name(instance: &str, d: &Discriminator) -> String {
    hex_name(&format!("shm-{instance}"), d.as_bytes())
}

/// The eventfds a peer signals: this process's agent's, then those of this
/// VI's CQs.
fn wake_eventfds(agent: &agent::Agent, vi: &Vi) -> Vec<RawFd> {
    let mut v: Vec<RawFd> = vec![agent.fd()];
    v.extend(cq_eventfds(vi));
    v
}

/// The CQ eventfds a peer signals for this VI's queues.
fn cq_eventfds(vi: &Vi) -> Vec<RawFd> {
    let mut v: Vec<RawFd> = [&vi.s.send_cq, &vi.s.recv_cq]
        .into_iter()
        .flatten()
        .map(|c| c.efd.as_raw_fd())
        .collect();
    v.dedup();
    v
}

impl NicOps for ShmNic {
    /// The client half of a connection (VipConnectRequest): waits up to
    /// `wait.listener` for a listener to appear and up to `wait.timeout`
    /// in all.
    fn connect(
        &self,
        vi: &Vi,
        remote: &NetAddress,
        local: Option<&Discriminator>,
        wait: Patience,
        private: &[u8],
    ) -> Result<RemoteViAttributes, ConnectError> {
        if local.is_some() {
            return Err(ConnectError::Unsupported(
                "peer-to-peer connection on this provider",
            ));
        }
        let start = Instant::now();
        let attrs = vi.attributes();
        let path = self
            .dir
            .socket(&socket_name(&remote.host, &remote.discriminator));
        let timeout = wait.timeout;
        let stream = Stream::connect(&path, wait.listener.min(timeout)).map_err(|e| match e {
            uvia_shm::socket::ConnectError::NoListener(_) => ConnectError::NoListener {
                nic: remote.host.clone(),
                discriminator: remote.discriminator.to_string(),
                waited_ms: start.elapsed().as_millis() as u64,
            },
            uvia_shm::socket::ConnectError::Io(e) => ConnectError::Io(e),
        })?;
        let agent = agent::get()?;
        let seg = ShmConn::create_segment()?;
        let mut fds: Vec<RawFd> = vec![seg.fd()];
        fds.extend(wake_eventfds(&agent, vi));
        let mut req = Hello::new(hello::REQUEST, &attrs, &remote.discriminator);
        req.private = private.to_vec();
        req.job = self.job;
        stream.send(&req.emit(), &fds)?;
        let left = timeout.saturating_sub(start.elapsed());
        let mut buf = [0u8; hello::LEN + 16];
        let (n, peer_fds) = match stream.recv(&mut buf, Some(left)) {
            Ok(Some(x)) => x,
            Ok(None) => return Err(ConnectError::Timeout(start.elapsed().as_millis() as u64)),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(ConnectError::Rejected)
            }
            Err(e) => return Err(e.into()),
        };
        let reply = Hello::parse(&buf[..n]).map_err(ConnectError::Protocol)?;
        vi.lock().q.remote_private = reply.private.clone();
        let theirs = RemoteViAttributes::from(&reply);
        match reply.kind {
            hello::REJECT if reply.reason == hello::WRONG_JOB => {
                return Err(ConnectError::WrongJob);
            }
            hello::REJECT if reply.reason == hello::MISMATCH => {
                check_compatible(&attrs, &theirs)?;
                return Err(ConnectError::Rejected);
            }
            hello::REJECT => return Err(ConnectError::Rejected),
            hello::ACCEPT => {}
            _ => {
                return Err(ConnectError::Protocol(
                    "unexpected reply to a connection request",
                ))
            }
        }
        check_compatible(&attrs, &theirs)?;
        let (peer_agent, peer_fds) = check_eventfds(peer_fds.into_iter()).ok_or(
            ConnectError::Protocol("the server's wake-up descriptors are not eventfds"),
        )?;
        let (pid, _) = stream.peer_cred()?;
        let seg = Arc::new(seg);
        let conn = ShmConn::new(seg.clone(), 0, stream, pid, Some(peer_agent), peer_fds);
        let mut t = ShmVi::new(conn, seg.clone());
        t.server_socket = Some(path);
        // Enlisted first: a grant made once it is installed must be found
        // by a withdrawal (`Agent::revoke`).
        agent.enlist(&vi.s, &seg, 0, pid);
        vi.install(&mut vi.lock(), Transport::Shm(t), theirs.clone());
        Ok(theirs)
    }

    /// Waits up to `timeout` (`None`: forever) for a connection request on
    /// `discriminator`; keeps listening on it until the Nic closes.
    fn connect_wait(
        &self,
        _nic: &Nic,
        discriminator: &Discriminator,
        timeout: Option<Duration>,
    ) -> Result<ConnRequest, ConnectError> {
        let start = Instant::now();
        let mut ls = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
        let listener = match ls.entry(discriminator.as_bytes().to_vec()) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let path = self.dir.socket(&socket_name(&self.instance, discriminator));
                e.insert(Listener::bind(&path).map_err(|e| match e.kind() {
                    std::io::ErrorKind::AddrInUse => ConnectError::InUse(discriminator.to_string()),
                    _ => e.into(),
                })?)
            }
        };
        loop {
            // Every connected client is waited on at once: one that says
            // nothing holds a place for HELLO_WAIT, never the listener.
            let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
            let mut buf = [0u8; hello::LEN + 16];
            let Some((stream, n, fds)) = listener.first_message(&mut buf, left, HELLO_WAIT)? else {
                return Err(ConnectError::Timeout(start.elapsed().as_millis() as u64));
            };
            // A client that says nothing valid is dropped; keep waiting.
            let Ok(h) = Hello::parse(&buf[..n]) else {
                continue;
            };
            if h.kind != hello::REQUEST || h.discriminator != *discriminator {
                continue;
            }
            if self.job != 0 && h.job != self.job {
                // Another job's request: refused here, never shown.
                let no = Hello {
                    kind: hello::REJECT,
                    reason: hello::WRONG_JOB,
                    job: 0,
                    private: Vec::new(),
                    ..h
                };
                let _ = stream.send(&no.emit(), &[]);
                continue;
            }
            let Ok((pid, _uid)) = stream.peer_cred() else {
                continue;
            };
            // The segment (sealed, of the layout's size, a known header)
            // and the eventfds are checked before the application hears of
            // the request.
            let mut fds = fds.into_iter();
            let Some(Ok(seg)) = fds.next().map(ShmConn::open_segment) else {
                continue;
            };
            let Some((peer_agent, eventfds)) = check_eventfds(fds) else {
                continue;
            };
            return Ok(ConnRequest {
                remote: (&h).into(),
                discriminator: h.discriminator.clone(),
                private: h.private.clone(),
                peer_address: None,
                peer_pid: pid,
                answer: Some(AnyAnswer::Shm(Answer {
                    stream,
                    seg,
                    peer_agent,
                    eventfds,
                    hello: h,
                })),
            });
        }
    }

    /// Stops listening on `discriminator` and removes its socket file.
    fn stop_listening(&self, discriminator: &Discriminator) {
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(discriminator.as_bytes());
    }

    fn regions_changed(&self, nic: &crate::nic::NicShared) {
        self.withdraw_grants(nic);
    }
}

impl ShmNic {
    /// [`NicOps::regions_changed`]: withdraws every grant of the Nic's
    /// connections, once a grant was tried.
    fn withdraw_grants(&self, nic: &crate::nic::NicShared) {
        // After the region table's change, before the count: a grant
        // counts itself before it looks the region up (`ShmConn::grant`),
        // so either it finds the change or this finds the count.
        std::sync::atomic::fence(Ordering::SeqCst);
        if !self.grants.load(Ordering::SeqCst) {
            return;
        }
        if let Ok(a) = agent::get() {
            a.revoke(nic);
        }
    }
}

impl Drop for ShmNic {
    fn drop(&mut self) {
        // Listener sockets remove their files as they drop.
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// What answering a request needs: the client's socket, the segment it
/// passed, its agent's and CQs' eventfds (all checked) and its request.
pub(crate) struct Answer {
    stream: Stream,
    seg: ShmSegment,
    peer_agent: PeerEventfd,
    eventfds: Vec<PeerEventfd>,
    hello: Hello,
}

impl Answer {
    /// Connects `vi` (idle, same reliability level) to the client.
    pub fn accept(self, vi: &Vi, req: &ConnRequest, private: &[u8]) -> Result<(), ConnectError> {
        // Started before the VI is locked: starting it spawns a thread.
        let agent = agent::get()?;
        let mut g = vi.lock();
        let st = vi.state();
        if st != crate::ViState::Idle {
            let _ = self
                .stream
                .send(&self.reply(hello::REJECT, &g.q.attrs, 0, &[]).emit(), &[]);
            return Err(ConnectError::InvalidState(st));
        }
        if let Err(e) = check_compatible(&g.q.attrs, &req.remote) {
            // Tell the client why, with this side's attributes.
            let why = self.reply(hello::REJECT, &g.q.attrs, hello::MISMATCH, &[]);
            let _ = self.stream.send(&why.emit(), &[]);
            return Err(e);
        }
        let ok = self.reply(hello::ACCEPT, &g.q.attrs, 0, private);
        self.stream.send(&ok.emit(), &wake_eventfds(&agent, vi))?;
        let seg = Arc::new(self.seg);
        let conn = ShmConn::new(
            seg.clone(),
            1,
            self.stream,
            req.peer_pid,
            Some(self.peer_agent),
            self.eventfds,
        );
        // Enlisted first, as in `connect`.
        agent.enlist(&vi.s, &seg, 1, req.peer_pid);
        vi.install(
            &mut g,
            Transport::Shm(ShmVi::new(conn, seg.clone())),
            req.remote.clone(),
        );
        drop(g);
        Ok(())
    }

    /// Refuses the request; the client's connect returns `Rejected`.
    pub fn reject(self, _req: &ConnRequest, private: &[u8]) -> Result<(), ConnectError> {
        let mut reply = Hello {
            kind: hello::REJECT,
            ..self.hello.clone()
        };
        reply.private = private.to_vec();
        self.stream.send(&reply.emit(), &[])?;
        Ok(())
    }

    /// This side's answer, with its VI's attributes.
    fn reply(&self, kind: u8, attrs: &ViAttributes, reason: u8, private: &[u8]) -> Hello {
        let mut h = Hello::new(kind, attrs, &self.hello.discriminator);
        h.reason = reason;
        h.private = private.to_vec();
        h
    }
}
