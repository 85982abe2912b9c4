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
    /// `n` round trips of `size`-byte messages, back to back. The client
    /// (`client`) sends first and calls `mark` after that send and after
    /// each round (its send, or the last reply: the client reads its clock
    /// there, outside the time measured); the server answers each
    /// message it receives. The same calls as [`send`](Self::send) and
    /// [`recv`](Self::recv) in a loop; an endpoint may run them in one
    /// loop of its own that prepares each reply before its message comes.
    fn rounds(
        &mut self,
        size: usize,
        n: usize,
        client: bool,
        mark: &mut dyn FnMut(),
    ) -> Result<()> {
        rounds_by_calls(self, size, n, client, mark)
    }
}

/// [`Endpoint::rounds`] as [`Endpoint::send`] and [`Endpoint::recv`] calls.
pub(crate) fn rounds_by_calls<E: Endpoint + ?Sized>(
    ep: &mut E,
    size: usize,
    n: usize,
    client: bool,
    mark: &mut dyn FnMut(),
) -> Result<()> {
    rounds_with(
        ep,
        size,
        n,
        client,
        mark,
        |_| (),
        |ep| ep.recv(),
        |ep, ()| ep.send(size),
    )
}

/// The shape of [`Endpoint::rounds`]: each round `prepare` makes what the
/// answer needs before its message comes, `recv` waits for the message and
/// `answer` sends the reply (the client's first message is a plain send).
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn rounds_with<E: Endpoint + ?Sized, T>(
    ep: &mut E,
    size: usize,
    n: usize,
    client: bool,
    mark: &mut dyn FnMut(),
    prepare: impl Fn(&E) -> T,
    recv: impl Fn(&mut E) -> Result<usize>,
    answer: impl Fn(&mut E, T) -> Result<()>,
) -> Result<()> {
    // The client's checkpoint before each send opens the stretch `uvia
    // anatomy` charges to its loop (`AppClock` to `AppSend`).
    if client {
        uvia_trace::mark!(AppClock);
        ep.send(size)?;
        mark();
    }
    for i in 0..n {
        let ready = prepare(ep);
        expect_len(recv(ep)?, size)?;
        if !client || i + 1 < n {
            if client {
                uvia_trace::mark!(AppClock);
            }
            answer(ep, ready)?;
        }
        if client {
            mark();
        }
    }
    Ok(())
}

/// A received message of `n` bytes where `want` were expected is an error.
pub(crate) fn expect_len(n: usize, want: usize) -> Result<()> {
    if n != want {
        anyhow::bail!("received a {n} byte message where {want} bytes were expected");
    }
    Ok(())
}

/// The server half before a client has connected.
pub trait Listener {
    /// A one-line string the client needs to find this listener
    /// (a port, a discriminator). Printed by the server process as `READY <info>`.
    fn info(&self) -> String;
    /// Waits for the client and returns the connected endpoint.
    fn accept(self: Box<Self>) -> Result<Box<dyn Endpoint>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers every send with a message of `reply_len` bytes; counts calls.
    struct Echo {
        buf: Vec<u8>,
        reply_len: usize,
        sends: usize,
        recvs: usize,
        pending: usize,
    }

    impl Echo {
        fn new(reply_len: usize) -> Echo {
            Echo {
                buf: vec![0; 64],
                reply_len,
                sends: 0,
                recvs: 0,
                pending: 0,
            }
        }
    }

    impl Endpoint for Echo {
        fn send_buf(&mut self) -> &mut [u8] {
            &mut self.buf
        }
        fn send(&mut self, _len: usize) -> Result<()> {
            self.sends += 1;
            self.pending += 1;
            Ok(())
        }
        fn recv(&mut self) -> Result<usize> {
            self.recvs += 1;
            // A server's peer sends whenever it is asked.
            self.pending = self.pending.saturating_sub(1);
            Ok(self.reply_len)
        }
        fn recv_buf(&self) -> &[u8] {
            &self.buf
        }
        fn flush(&mut self) -> Result<()> {
            Ok(())
        }
    }

    /// The client sends once per round, marks after the first send and
    /// after each round; the server answers each message, marks nothing.
    #[test]
    fn rounds_send_and_mark_once_a_round() {
        let mut marks = 0;
        let mut c = Echo::new(8);
        rounds_by_calls(&mut c, 8, 5, true, &mut || marks += 1).unwrap();
        assert_eq!((c.sends, c.recvs, c.pending, marks), (5, 5, 0, 6));
        let mut s = Echo::new(8);
        rounds_by_calls(&mut s, 8, 5, false, &mut || marks += 1).unwrap();
        assert_eq!((s.sends, s.recvs, marks), (5, 5, 6));
    }

    /// A message of another length stops the rounds with an error that
    /// names both lengths; nothing is sent after it.
    #[test]
    fn rounds_stop_at_a_message_of_the_wrong_length() {
        let mut s = Echo::new(7);
        let err = rounds_by_calls(&mut s, 8, 5, false, &mut || {}).unwrap_err();
        assert!(err.to_string().contains("7 byte message where 8"), "{err}");
        assert_eq!((s.sends, s.recvs), (0, 1));
    }
}
