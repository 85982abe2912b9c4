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

    /// Process id of the client.
    pub fn peer_pid(&self) -> i32 {
        self.peer_pid
    }

    /// Connects `vi` (idle, same reliability level) to the client.
    pub fn accept(&mut self, vi: &Vi) -> Result<(), ConnectError> {
        let stream = self.stream.take().ok_or(ConnectError::Answered)?;
        let fds = std::mem::take(&mut self.fds);
        vi.accept_from(stream, fds, &self.hello, self.peer_pid)
    }

    /// Refuses the request; the client's connect returns `Rejected`.
    pub fn reject(&mut self) -> Result<(), ConnectError> {
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
                stream: Some(stream),
                fds,
                hello: h,
                peer_pid: pid,
            });
        }
    }

    /// Stops listening on `discriminator` and removes its socket file.
    pub fn stop_listening(&self, discriminator: &Discriminator) {
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
