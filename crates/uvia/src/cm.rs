//! Connection management: discriminators, addresses and incoming requests.
//!
//! A server waits on a discriminator ([`Nic::connect_wait`]) and answers each
//! request with [`ConnRequest::accept`] or [`ConnRequest::reject`]; a client
//! calls [`Vi::connect_request`](crate::Vi::connect_request). How a request
//! travels is the provider's business (`crate::provider`); both sides may
//! add up to [`MAX_PRIVATE_DATA`] bytes of their own.

use crate::error::ConnectError;
use crate::nic::Nic;
use crate::provider::Answer;
use crate::vi::{Reliability, Vi, ViAttributes};
use std::time::Duration;

/// Most bytes in a discriminator.
pub const MAX_DISCRIMINATOR: usize = 32;

/// Most bytes of private data a connection request, accept or reject carries.
pub const MAX_PRIVATE_DATA: usize = 64;

/// Refuses private data longer than [`MAX_PRIVATE_DATA`].
pub(crate) fn check_private(private: &[u8]) -> Result<(), ConnectError> {
    if private.len() > MAX_PRIVATE_DATA {
        return Err(ConnectError::PrivateDataTooLong(private.len()));
    }
    Ok(())
}

/// How long a client's connection request waits: for the whole exchange,
/// and for a listener to appear where none is yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Patience {
    /// The whole request, the server's answer included.
    pub timeout: Duration,
    /// How long a request that finds nobody listening asks again. VIA's
    /// client waits for its server to start listening (the whole
    /// timeout); a socket's connect is refused at once.
    pub listener: Duration,
}

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

/// A connection request a server has received and not yet answered.
pub struct ConnRequest {
    pub(crate) remote: RemoteViAttributes,
    pub(crate) discriminator: Discriminator,
    pub(crate) private: Vec<u8>,
    pub(crate) peer_address: Option<String>,
    pub(crate) peer_pid: i32,
    /// What answering needs; taken by the answer.
    pub(crate) answer: Option<Answer>,
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
        self.remote.clone()
    }

    /// The discriminator the client asked for.
    pub fn discriminator(&self) -> &Discriminator {
        &self.discriminator
    }

    /// The private data the client's request carried (empty if none).
    pub fn private_data(&self) -> &[u8] {
        &self.private
    }

    /// The client Nic's address, on a provider whose peers are other hosts
    /// (`None` where peers share this host).
    pub fn peer_address(&self) -> Option<String> {
        self.peer_address.clone()
    }

    /// Process id of the client, where the provider knows it (else 0).
    pub fn peer_pid(&self) -> i32 {
        self.peer_pid
    }

    /// Connects `vi` (idle, same reliability level) to the client.
    pub fn accept(&mut self, vi: &Vi) -> Result<(), ConnectError> {
        self.accept_with(vi, &[])
    }

    /// [`accept`](Self::accept) with private data for the client (its
    /// [`Vi::peer_private_data`]).
    pub fn accept_with(&mut self, vi: &Vi, private: &[u8]) -> Result<(), ConnectError> {
        check_private(private)?;
        let answer = self.answer.take().ok_or(ConnectError::Answered)?;
        answer.accept(vi, self, private)
    }

    /// Refuses the request; the client's connect returns `Rejected`.
    pub fn reject(&mut self) -> Result<(), ConnectError> {
        self.reject_with(&[])
    }

    /// [`reject`](Self::reject) with private data for the client.
    pub fn reject_with(&mut self, private: &[u8]) -> Result<(), ConnectError> {
        check_private(private)?;
        let answer = self.answer.take().ok_or(ConnectError::Answered)?;
        answer.reject(self, private)
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
        self.s.provider.connect_wait(self, discriminator, timeout)
    }

    /// Stops listening on `discriminator` (and removes its socket file, on
    /// a provider that has one).
    pub fn stop_listening(&self, discriminator: &Discriminator) {
        self.s.provider.stop_listening(discriminator)
    }
}

pub(crate) fn check_compatible(
    mine: &ViAttributes,
    theirs: &RemoteViAttributes,
) -> Result<(), ConnectError> {
    if mine.reliability != theirs.reliability {
        return Err(ConnectError::Mismatch(format!(
            "reliability level {:?} here, {:?} at the peer",
            mine.reliability, theirs.reliability
        )));
    }
    Ok(())
}
