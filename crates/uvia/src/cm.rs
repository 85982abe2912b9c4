//! Connection management: discriminators, addresses and incoming requests.
//!
//! A server waits on a discriminator ([`Nic::connect_wait`]) and answers each
//! request with [`ConnRequest::accept`] or [`ConnRequest::reject`]; a client
//! calls [`Vi::connect_request`](crate::Vi::connect_request). For `shm` the
//! rendezvous is an owner-only Unix socket per (Nic instance, discriminator).

use crate::error::ConnectError;
use crate::nic::Nic;
use crate::shm::hello::{self, Hello};
use crate::vi::{Reliability, Vi, ViAttributes};
use std::os::fd::OwnedFd;
use std::time::Duration;
use uvia_shm::socket::hex_name;
use uvia_shm::{Listener, Stream};

/// Most bytes in a discriminator.
pub const MAX_DISCRIMINATOR: usize = 32;

/// Names a service on a host, as VIA's discriminator does.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Discriminator(Vec<u8>);

impl Discriminator {
    pub fn new(bytes: &[u8]) -> Result<Discriminator, ConnectError> {
        if bytes.len() > MAX_DISCRIMINATOR {
            return Err(ConnectError::DiscriminatorTooLong(bytes.len()));
        }
        Ok(Discriminator(bytes.to_vec()))
    }

    /// A discriminator made of a number's little-endian bytes.
    pub fn from_u64(v: u64) -> Discriminator {
        Discriminator(v.to_le_bytes().to_vec())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Display for Discriminator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// A host address (for `shm`, the Nic instance) and a discriminator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetAddress {
    pub host: String,
    pub discriminator: Discriminator,
}

impl NetAddress {
    pub fn new(host: &str, discriminator: Discriminator) -> NetAddress {
        NetAddress {
            host: host.to_string(),
            discriminator,
        }
    }
}

/// What the peer said about its VI when connecting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteViAttributes {
    pub reliability: Reliability,
    pub max_transfer_size: u32,
    pub enable_rdma_write: bool,
    pub enable_rdma_read: bool,
}

impl From<&Hello> for RemoteViAttributes {
    fn from(h: &Hello) -> Self {
        RemoteViAttributes {
            reliability: h.reliability,
            max_transfer_size: h.max_transfer_size,
            enable_rdma_write: h.rdma_write,
            enable_rdma_read: h.rdma_read,
        }
    }
}

pub(crate) fn socket_name(instance: &str, d: &Discriminator) -> String {
    hex_name(&format!("shm-{instance}"), d.as_bytes())
}

/// A connection request a server has received and not yet answered.
pub struct ConnRequest {
    /// A request that came over the network (the other fields are then
    /// unused but for `hello`, which describes it).
    pub(crate) net: Option<crate::vi::net::Incoming>,
    pub(crate) nic: Option<Nic>,
    pub(crate) stream: Option<Stream>,
    pub(crate) fds: Vec<OwnedFd>,
    pub(crate) hello: Hello,
    pub(crate) peer_pid: i32,
}

impl std::fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnRequest")
            .field("peer_pid", &self.peer_pid)
            .field("remote", &self.remote_attributes())
            .finish()
    }
}

impl ConnRequest {
    /// The client's VI attributes.
    pub fn remote_attributes(&self) -> RemoteViAttributes {
        (&self.hello).into()
    }

    /// The discriminator the client asked for.
    pub fn discriminator(&self) -> &Discriminator {
        &self.hello.discriminator
    }

    /// The client Nic's address, on a network provider (`None` on `shm`,
    /// whose peers share this host).
    pub fn peer_address(&self) -> Option<String> {
        self.net.as_ref().map(|r| r.from.to_string())
    }

    /// Process id of the client.
    pub fn peer_pid(&self) -> i32 {
        self.peer_pid
    }

    /// Connects `vi` (idle, same reliability level) to the client.
    pub fn accept(&mut self, vi: &Vi) -> Result<(), ConnectError> {
        if self.nic.is_some() {
            let req = self.net.take().ok_or(ConnectError::Answered)?;
            return vi.net_accept(&req);
        }
        let stream = self.stream.take().ok_or(ConnectError::Answered)?;
        let fds = std::mem::take(&mut self.fds);
        vi.accept_from(stream, fds, &self.hello, self.peer_pid)
    }

    /// Refuses the request; the client's connect returns `Rejected`.
    pub fn reject(&mut self) -> Result<(), ConnectError> {
        if let Some(nic) = &self.nic {
            let req = self.net.take().ok_or(ConnectError::Answered)?;
            nic.s
                .net()
                .reject(&req, uvia_proto::wire::RejectReason::Refused);
            return Ok(());
        }
        let stream = self.stream.take().ok_or(ConnectError::Answered)?;
        let reply = Hello {
            kind: hello::REJECT,
            ..self.hello.clone()
        };
        stream.send(&reply.emit(), &[])?;
        Ok(())
    }
}

impl Nic {
    /// Waits up to `timeout` (`None`: forever) for a connection request on
    /// `discriminator`. The Nic keeps listening on it until it is closed, so
    /// requests that arrive between calls wait in a queue.
    pub fn connect_wait(
        &self,
        discriminator: &Discriminator,
        timeout: Option<Duration>,
    ) -> Result<ConnRequest, ConnectError> {
        let start = std::time::Instant::now();
        if self.s.net.is_some() {
            return self.net_connect_wait(discriminator, timeout, start);
        }
        let key = discriminator.as_bytes().to_vec();
        let mut ls = self
            .s
            .shm
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !ls.contains_key(&key) {
            let path = self
                .s
                .shm
                .dir
                .socket(&socket_name(&self.s.shm.instance, discriminator));
            ls.insert(key.clone(), Listener::bind(&path)?);
        }
        let listener = &ls[&key];
        loop {
            let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
            let Some(stream) = listener.accept(left)? else {
                return Err(ConnectError::Timeout(start.elapsed().as_millis() as u64));
            };
            // A client that connects but says nothing valid is dropped; keep waiting.
            let left = timeout
                .map(|t| t.saturating_sub(start.elapsed()))
                .unwrap_or(Duration::from_secs(5))
                .min(Duration::from_secs(5));
            let mut buf = [0u8; hello::LEN + 16];
            let Ok(Some((n, fds))) = stream.recv(&mut buf, Some(left)) else {
                continue;
            };
            let Ok(h) = Hello::parse(&buf[..n]) else {
                continue;
            };
            if h.kind != hello::REQUEST || h.discriminator != *discriminator {
                continue;
            }
            let Ok((pid, _uid)) = stream.peer_cred() else {
                continue;
            };
            return Ok(ConnRequest {
                net: None,
                nic: None,
                stream: Some(stream),
                fds,
                hello: h,
                peer_pid: pid,
            });
        }
    }

    fn net_connect_wait(
        &self,
        discriminator: &Discriminator,
        timeout: Option<Duration>,
        start: std::time::Instant,
    ) -> Result<ConnRequest, ConnectError> {
        let net = self.s.net();
        net.listen(discriminator.as_bytes());
        loop {
            if let Some(req) = net.take_request(discriminator.as_bytes()) {
                let hello = Hello {
                    kind: hello::REQUEST,
                    reliability: Reliability::from_u8(req.attrs.reliability)
                        .unwrap_or(Reliability::Unreliable),
                    rdma_write: req.attrs.rdma_write,
                    rdma_read: req.attrs.rdma_read,
                    max_transfer_size: req.attrs.max_transfer,
                    discriminator: discriminator.clone(),
                    reason: 0,
                };
                return Ok(ConnRequest {
                    net: Some(req),
                    nic: Some(self.clone()),
                    stream: None,
                    fds: Vec::new(),
                    hello,
                    peer_pid: 0,
                });
            }
            let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(ConnectError::Timeout(start.elapsed().as_millis() as u64));
            }
            // Serve the medium (frames of this Nic's connections too) and
            // sleep until the next frame.
            net.poll(None);
            let nap = left
                .unwrap_or(Duration::from_millis(20))
                .min(Duration::from_millis(20));
            let _ = net.medium.wait(Some(nap));
        }
    }

    /// Stops listening on `discriminator` and removes its socket file.
    pub fn stop_listening(&self, discriminator: &Discriminator) {
        if let Some(net) = &self.s.net {
            net.stop_listening(discriminator.as_bytes());
            return;
        }
        self.s
            .shm
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(discriminator.as_bytes());
    }
}

pub(crate) fn check_compatible(mine: &ViAttributes, theirs: &Hello) -> Result<(), ConnectError> {
    if mine.reliability != theirs.reliability {
        return Err(ConnectError::Mismatch(format!(
            "reliability level {:?} here, {:?} at the peer",
            mine.reliability, theirs.reliability
        )));
    }
    Ok(())
}
