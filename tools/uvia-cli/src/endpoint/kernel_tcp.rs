//! Kernel TCP on 127.0.0.1 (or a test host's address) with TCP_NODELAY and a 4-byte length prefix per
//! message. Sends are one `writev` of prefix and payload; receives read into a
//! staging buffer (so a small message costs one system call) and move long
//! payloads straight into the message buffer.

use crate::endpoint::{Endpoint, EndpointConfig, Listener, Mode};
use crate::sock::{self as sys, SpinDeadline, IO_TIMEOUT};
use anyhow::{anyhow, bail, Context, Result};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

const STAGE: usize = 256 << 10;

pub struct TcpEndpoint {
    _stream: TcpStream,
    fd: RawFd,
    mode: Mode,
    send: Vec<u8>,
    recv: Vec<u8>,
    stage: Vec<u8>,
    head: usize,
    tail: usize,
    last_len: usize,
}

impl TcpEndpoint {
    fn new(stream: TcpStream, cfg: &EndpointConfig) -> Result<TcpEndpoint> {
        stream.set_nodelay(true).context("setting TCP_NODELAY")?;
        let fd = stream.as_raw_fd();
        sys::set_rcv_timeout(fd, IO_TIMEOUT)?;
        let max = cfg.max_size.max(8);
        Ok(TcpEndpoint {
            _stream: stream,
            fd,
            mode: cfg.mode,
            send: vec![0x5a; max],
            recv: vec![0; max],
            stage: vec![0; STAGE],
            head: 0,
            tail: 0,
            last_len: 0,
        })
    }

    /// One receive into `buf`; returns the byte count (never 0).
    fn read_some(fd: RawFd, mode: Mode, buf: &mut [u8]) -> Result<usize> {
        let flags = if mode == Mode::Polling {
            libc::MSG_DONTWAIT
        } else {
            0
        };
        let mut spin = SpinDeadline::new();
        loop {
            // SAFETY: buf is live and writable for its length.
            let n =
                unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), flags) };
            if n > 0 {
                uvia_trace::mark!(RxFound);
                return Ok(n as usize);
            }
            if n == 0 {
                bail!("TCP: the peer closed the connection");
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) if mode == Mode::Polling => {
                    if spin.expired() {
                        bail!("TCP receive timed out after {IO_TIMEOUT:?}");
                    }
                }
                Some(libc::EAGAIN) => bail!("TCP receive timed out after {IO_TIMEOUT:?}"),
                Some(libc::EINTR) => {}
                _ => return Err(anyhow!("TCP receive: {e}")),
            }
        }
    }

    fn fill_stage(&mut self) -> Result<()> {
        if self.head == self.tail {
            self.head = 0;
            self.tail = 0;
        } else if self.head > 0 {
            self.stage.copy_within(self.head..self.tail, 0);
            self.tail -= self.head;
            self.head = 0;
        }
        let n = Self::read_some(self.fd, self.mode, &mut self.stage[self.tail..])?;
        self.tail += n;
        Ok(())
    }
}

impl Endpoint for TcpEndpoint {
    fn send_buf(&mut self) -> &mut [u8] {
        &mut self.send
    }

    fn send(&mut self, len: usize) -> Result<()> {
        if len > self.send.len() {
            bail!(
                "message of {len} bytes is larger than the endpoint's {} byte buffer",
                self.send.len()
            );
        }
        uvia_trace::mark!(AppSend);
        let prefix = (len as u32).to_le_bytes();
        let mut done = 0usize;
        let total = 4 + len;
        while done < total {
            let (a, b) = if done < 4 {
                (&prefix[done..], &self.send[..len])
            } else {
                (&prefix[4..], &self.send[done - 4..len])
            };
            let iov = [
                libc::iovec {
                    iov_base: a.as_ptr() as *mut libc::c_void,
                    iov_len: a.len(),
                },
                libc::iovec {
                    iov_base: b.as_ptr() as *mut libc::c_void,
                    iov_len: b.len(),
                },
            ];
            uvia_trace::mark!(SyscallEnter);
            // SAFETY: both iovecs point into live buffers.
            let n = unsafe { libc::writev(self.fd, iov.as_ptr(), 2) };
            uvia_trace::mark!(SyscallExit);
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN)) {
                    continue;
                }
                return Err(anyhow!("TCP send: {e}"));
            }
            done += n as usize;
        }
        uvia_trace::mark!(AppSendReturned);
        Ok(())
    }

    fn recv(&mut self) -> Result<usize> {
        while self.tail - self.head < 4 {
            self.fill_stage()?;
        }
        let len =
            u32::from_le_bytes(self.stage[self.head..self.head + 4].try_into().unwrap()) as usize;
        self.head += 4;
        if len > self.recv.len() {
            bail!(
                "TCP: message of {len} bytes is larger than the {} byte receive buffer",
                self.recv.len()
            );
        }
        let have = (self.tail - self.head).min(len);
        self.recv[..have].copy_from_slice(&self.stage[self.head..self.head + have]);
        self.head += have;
        let mut got = have;
        while got < len {
            if len - got >= STAGE / 4 {
                got += Self::read_some(self.fd, self.mode, &mut self.recv[got..len])?;
            } else {
                self.fill_stage()?;
                let take = (self.tail - self.head).min(len - got);
                self.recv[got..got + take]
                    .copy_from_slice(&self.stage[self.head..self.head + take]);
                self.head += take;
                got += take;
            }
        }
        self.last_len = len;
        uvia_trace::mark!(AppReceived);
        Ok(len)
    }

    fn recv_buf(&self) -> &[u8] {
        &self.recv[..self.last_len]
    }

    fn flush(&mut self) -> Result<()> {
        Ok(())
    }
}

struct TcpListen {
    listener: TcpListener,
    cfg: EndpointConfig,
}

pub fn listen(cfg: &EndpointConfig) -> Result<Box<dyn Listener>> {
    let listener = TcpListener::bind((cfg.ip, 0))
        .with_context(|| format!("binding a TCP listener on {}", cfg.ip))?;
    Ok(Box::new(TcpListen {
        listener,
        cfg: cfg.clone(),
    }))
}

impl Listener for TcpListen {
    fn info(&self) -> String {
        self.listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    fn accept(self: Box<Self>) -> Result<Box<dyn Endpoint>> {
        self.listener.set_nonblocking(true)?;
        let start = Instant::now();
        let stream = loop {
            match self.listener.accept() {
                Ok((s, _)) => break s,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        && start.elapsed() < IO_TIMEOUT =>
                {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => return Err(e).context("waiting for the TCP client"),
            }
        };
        stream.set_nonblocking(false)?;
        Ok(Box::new(TcpEndpoint::new(stream, &self.cfg)?))
    }
}

pub fn connect(cfg: &EndpointConfig, info: &str) -> Result<Box<dyn Endpoint>> {
    let addr: std::net::SocketAddr = info
        .trim()
        .parse()
        .with_context(|| format!("bad TCP listener info {info:?} (expected ip:port)"))?;
    let stream =
        TcpStream::connect_timeout(&addr, IO_TIMEOUT).context("connecting to the TCP server")?;
    Ok(Box::new(TcpEndpoint::new(stream, cfg)?))
}
