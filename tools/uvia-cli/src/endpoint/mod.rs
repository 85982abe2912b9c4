//! One side of a benchmark connection, the same shape for every provider.
//!
//! The harness (ping-pong, bandwidth) talks only to [`Endpoint`]; each provider
//! module turns it into its own calls. Buffers belong to the endpoint so that a
//! provider that needs registered memory (uvia's) sends from and receives into
//! it without an extra copy.

use anyhow::Result;

pub mod via;

/// How a receiver waits for data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Spin on the receive path (non-blocking socket calls for the kernel).
    Polling,
    /// Sleep in the kernel until data arrives.
    Blocking,
}

/// What both sides agree on before they connect.
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    pub mode: Mode,
    /// Largest message either side will send.
    pub max_size: usize,
    /// Sends a bandwidth sender may have in flight before it waits for completions.
    pub window: usize,
    /// The uvia Nic to open (`shm`, `udp:<ip>`); unused by the kernel endpoints.
    pub nic: String,
    /// The uvia VI's reliability level.
    pub reliability: uvia::Reliability,
    /// Faults injected on a uvia network Nic's receive path.
    pub inject: Option<String>,
    /// The local address the kernel endpoints bind (127.0.0.1 by default;
    /// a test host's address with `--netns`).
    pub ip: std::net::IpAddr,
    /// One-sided messages (uvia's shm): each one an RDMA write into the
    /// peer's buffer that ends in a flag word the peer watches, no receive
    /// descriptor.
    pub rdma_write: bool,
}

/// One connected side. Messages are delivered whole and in order.
pub trait Endpoint {
    /// The buffer `send` transmits from; at least `max_size` bytes.
    fn send_buf(&mut self) -> &mut [u8];
    /// Sends the first `len` bytes of `send_buf`. May return before the data
    /// has left (up to `window` in flight); the buffer must not change until
    /// `flush` when more than one send is outstanding.
    fn send(&mut self, len: usize) -> Result<()>;
    /// Waits (per `Mode`) for the next message; returns its length. Its bytes
    /// are in `recv_buf()[..len]` until the next `recv`.
    fn recv(&mut self) -> Result<usize>;
    /// The bytes of the last message `recv` returned.
    fn recv_buf(&self) -> &[u8];
    /// [`recv`](Self::recv), calling `idle` now and then while it polls: a
    /// program with two connections drives the one it is not waiting on
    /// (uvia's network connections acknowledge and send again only in
    /// calls). Polling uvia endpoints call it; the others just receive.
    fn recv_driving(&mut self, idle: &dyn Fn()) -> Result<usize> {
        let _ = idle;
        self.recv()
    }
    /// Runs the connection's protocol for a moment (acknowledgements owed,
    /// frames to send again) without taking a message: see
    /// [`recv_driving`](Self::recv_driving). Nothing where there is none.
    fn drive(&self) {}
    /// Waits until every send has completed.
    fn flush(&mut self) -> Result<()>;
}

/// The server half before a client has connected.
pub trait Listener {
    /// A one-line string the client needs to find this listener
    /// (a port, a discriminator). Printed by the server process as `READY <info>`.
    fn info(&self) -> String;
    /// Waits for the client and returns the connected endpoint.
    fn accept(self: Box<Self>) -> Result<Box<dyn Endpoint>>;
}
