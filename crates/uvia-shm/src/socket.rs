//! Connection rendezvous: owner-only Unix sockets that carry descriptors.
//!
//! A server listens on one `SOCK_SEQPACKET` socket per (nic, discriminator) in
//! a private directory (0700; the socket itself 0600). Messages keep their
//! boundaries and may carry file descriptors (the shared segment). The
//! connected socket stays open for the life of a connection: when the peer
//! process dies the kernel closes its end and [`Stream::peer_gone`] sees it.
//! A socket file whose owner crashed is recognised (nobody accepts on it) and
//! removed by whoever finds it.
//!
//! Every socket is non-blocking and every wait is a `poll` with a deadline: a
//! peer that connects and says nothing, or stops reading, holds nobody up.

use crate::cvt;
use std::ffi::OsStr;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 8;

/// Most accepted connections a listener keeps waiting for their first
/// message; past it the oldest is dropped.
pub const MAX_PENDING: usize = 64;

/// The private directory that holds the listening sockets of this user.
#[derive(Debug, Clone)]
pub struct SocketDir {
    path: PathBuf,
}

impl SocketDir {
    /// `$UVIA_SOCKET_DIR`, else `$XDG_RUNTIME_DIR/uvia`, else
    /// `/run/user/<uid>/uvia` when that runtime directory is ours, else
    /// `/tmp/uvia-<uid>`. Created 0700 if missing; refused as
    /// [`at`](Self::at) says.
    pub fn from_env() -> io::Result<SocketDir> {
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let run = PathBuf::from(format!("/run/user/{uid}"));
        let path = if let Some(p) = std::env::var_os("UVIA_SOCKET_DIR") {
            PathBuf::from(p)
        } else if let Some(p) = std::env::var_os("XDG_RUNTIME_DIR") {
            Path::new(&p).join("uvia")
        } else if check_private(&run, uid).is_ok() {
            run.join("uvia")
        } else {
            PathBuf::from(format!("/tmp/uvia-{uid}"))
        };
        SocketDir::at(path)
    }

    /// Uses (and creates) `path`. Refused unless it is a directory, not a
    /// symbolic link, owned by this user and closed to everyone else (0700):
    /// in a shared place such as `/tmp` another user may have made it first.
    pub fn at(path: PathBuf) -> io::Result<SocketDir> {
        match std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(&path)
        {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("socket directory {}: {e}", path.display()),
                ))
            }
        }
        // SAFETY: getuid cannot fail.
        check_private(&path, unsafe { libc::getuid() })?;
        Ok(SocketDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The socket path for `name` (already a safe file name).
    pub fn socket(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

/// Checks that `path` itself (not what a link names) is a directory owned
/// by `uid` that no one else may enter.
fn check_private(path: &Path, uid: u32) -> io::Result<()> {
    let md = std::fs::symlink_metadata(path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("socket directory {}: {e}", path.display()),
        )
    })?;
    let why = if md.file_type().is_symlink() {
        "is a symbolic link".to_string()
    } else if !md.is_dir() {
        "is not a directory".to_string()
    } else if md.uid() != uid {
        format!("belongs to uid {}", md.uid())
    } else if md.permissions().mode() & 0o077 != 0 {
        format!("has mode {:o}", md.permissions().mode() & 0o777)
    } else {
        return Ok(());
    };
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "socket directory {} {why}: it must be a directory of uid {uid} with mode 0700 \
             (set UVIA_SOCKET_DIR or XDG_RUNTIME_DIR to use another)",
            path.display()
        ),
    ))
}

fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path {} is longer than {} bytes",
                path.display(),
                addr.sun_path.len() - 1
            ),
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    Ok((addr, len))
}

fn seqpacket() -> io::Result<OwnedFd> {
    let ty = libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    // SAFETY: plain socket creation.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, ty, 0) } as _)?;
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Waits until `fd` is readable; `false` on timeout. `None` waits forever.
fn wait_readable(fd: RawFd, timeout: Option<Duration>) -> io::Result<bool> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .as_millis()
                .min(i32::MAX as u128) as i32,
        };
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(n > 0);
    }
}

/// A listening socket; its file is removed when dropped.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
    path: PathBuf,
    ino: u64,
    /// Accepted connections whose first message has not come yet, with the
    /// time each is given up, oldest first.
    pending: Vec<(Stream, Instant)>,
}

impl Listener {
    /// Listens on `path`. A leftover file from a crashed owner is removed;
    /// a live listener there is an `AddrInUse` error.
    ///
    /// The socket is bound and put into the listening state under a private
    /// temporary name and only then renamed into place (refusing to replace
    /// an existing file), so a file at `path` always belongs to a socket that
    /// accepts: a connect refused there means its owner is gone.
    pub fn bind(path: &Path) -> io::Result<Listener> {
        static SERIAL: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".{}.{n}.tmp", std::process::id()));
        let tmp = PathBuf::from(tmp);
        if let Some(dir) = path.parent() {
            remove_orphaned_tmp(dir);
            remove_stale_once(dir);
        }
        let (addr, len) = sockaddr(&tmp)?;
        let fd = seqpacket()?;
        let _ = std::fs::remove_file(&tmp);
        // SAFETY: `addr` is a valid sockaddr_un of length `len`.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &addr as *const _ as *const libc::sockaddr,
                len,
            )
        } as _)?;
        let tmp_guard = TmpFile(&tmp);
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        // SAFETY: listening on our bound socket.
        cvt(unsafe { libc::listen(fd.as_raw_fd(), 64) } as _)?;
        let ino = std::fs::metadata(&tmp)?.ino();
        let (from, to) = (cpath(&tmp)?, cpath(path)?);
        for _ in 0..2 {
            // SAFETY: two valid C strings; RENAME_NOREPLACE never replaces a file.
            let r = unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    from.as_ptr(),
                    libc::AT_FDCWD,
                    to.as_ptr(),
                    libc::RENAME_NOREPLACE,
                )
            };
            if r == 0 {
                std::mem::forget(tmp_guard);
                return Ok(Listener {
                    fd,
                    path: path.to_owned(),
                    ino,
                    pending: Vec::new(),
                });
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(e);
            }
            if !remove_if_stale(path)? {
                break;
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("another process listens on {}", path.display()),
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts one connection; `Ok(None)` if none arrived within `timeout`.
    pub fn accept(&self, timeout: Option<Duration>) -> io::Result<Option<Stream>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if !wait_readable(self.fd.as_raw_fd(), left)? {
                return Ok(None);
            }
            if let Some(s) = self.try_accept()? {
                return Ok(Some(s));
            }
        }
    }

    /// One connection if one is waiting, without blocking.
    fn try_accept(&self) -> io::Result<Option<Stream>> {
        // SAFETY: accepting on our listening socket; no address wanted.
        let fd = unsafe {
            libc::accept4(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                // The client gave up between its connect and our accept.
                _ if e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: a fresh descriptor we own.
        Ok(Some(Stream {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        }))
    }

    /// The first message of whichever connection sends one first, with its
    /// connection; `Ok(None)` if none came within `timeout` (`None`: no
    /// limit). Connections are accepted as they arrive and all waited on
    /// together, each for at most `patience`; one that closes, fails or
    /// stays silent that long is dropped, and the others are kept for the
    /// next call. The caller judges the message.
    pub fn first_message(
        &mut self,
        buf: &mut [u8],
        timeout: Option<Duration>,
        patience: Duration,
    ) -> io::Result<Option<(Stream, usize, Vec<OwnedFd>)>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut polls: Vec<libc::pollfd> = Vec::new();
        let mut looked = false;
        loop {
            let now = Instant::now();
            // What the last poll found, oldest connection first (`polls[0]`
            // is the listener; `polls[i + 1]` is `pending[i]`).
            let mut first = None;
            for i in 0..polls.len().saturating_sub(1) {
                if polls[i + 1].revents == 0 {
                    continue;
                }
                match self.pending[i].0.recv(buf, Some(Duration::ZERO)) {
                    Ok(Some((n, fds))) => {
                        first = Some((i, n, fds));
                        break;
                    }
                    Ok(None) => {}
                    // Closed or failed: given up below.
                    Err(_) => self.pending[i].1 = now,
                }
            }
            let first = first.map(|(i, n, fds)| (self.pending.remove(i).0, n, fds));
            self.pending.retain(|(_, until)| *until > now);
            if first.is_some() {
                return Ok(first);
            }
            while let Some(s) = self.try_accept()? {
                if self.pending.len() == MAX_PENDING {
                    self.pending.remove(0);
                }
                self.pending.push((s, now + patience));
            }
            let wake = self.pending.iter().map(|(_, until)| *until).min();
            let until = match (deadline, wake) {
                (Some(d), Some(w)) => Some(d.min(w)),
                (d, w) => d.or(w),
            };
            // Past the deadline, one look without waiting still serves what
            // has already arrived.
            let expired = deadline.is_some_and(|d| d <= now);
            if expired && looked {
                return Ok(None);
            }
            looked = true;
            polls.clear();
            polls.push(libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            polls.extend(self.pending.iter().map(|(s, _)| libc::pollfd {
                fd: s.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }));
            let ms = match until {
                _ if expired => 0,
                None => -1,
                Some(u) => u
                    .saturating_duration_since(now)
                    .as_millis()
                    .clamp(1, i32::MAX as u128) as i32,
            };
            // SAFETY: `polls` is a live array of pollfds of the given length.
            let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
                polls.iter_mut().for_each(|p| p.revents = 0);
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Remove the file only if it is still ours (a successor may have
        // replaced a file it found stale).
        if std::fs::metadata(&self.path)
            .map(|m| m.ino() == self.ino)
            .unwrap_or(false)
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Removes temporary socket files (`<name>.<pid>.<n>.tmp`) left by a
/// process that died between binding and renaming.
fn remove_orphaned_tmp(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(".tmp") else {
            continue;
        };
        let mut parts = stem.rsplitn(3, '.');
        let (_n, pid) = (
            parts.next(),
            parts.next().and_then(|p| p.parse::<i32>().ok()),
        );
        let Some(pid) = pid else { continue };
        // SAFETY: signal 0 only checks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0
            || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if !alive {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Removes the sockets of listeners that died without removing theirs
/// (killed), once per process and folder, at its first listen: a file
/// whose connect is refused has no listener ([`remove_if_stale`]). A live
/// listener sees one connection that closes at once, and drops it.
fn remove_stale_once(dir: &Path) {
    static SWEPT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    {
        let mut swept = SWEPT.lock().unwrap_or_else(|e| e.into_inner());
        if swept.iter().any(|d| d == dir) {
            return;
        }
        swept.push(dir.to_owned());
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let is_socket = e.file_type().is_ok_and(|t| {
            use std::os::unix::fs::FileTypeExt;
            t.is_socket()
        });
        // A temporary name is another process's listener between its bind
        // and its listen, which refuses connections too: removing it made
        // that listener's start fail. Those names go by their owner's
        // death (`remove_orphaned_tmp`).
        let tmp = e.file_name().to_str().is_some_and(|n| n.ends_with(".tmp"));
        if is_socket && !tmp {
            let _ = remove_if_stale(&e.path());
        }
    }
}

/// One connect attempt: the outer error is a failure to make a socket, the
/// inner one the connect's own answer (refused, not found, ...).
fn try_connect(addr: &libc::sockaddr_un, len: libc::socklen_t) -> io::Result<io::Result<OwnedFd>> {
    let fd = seqpacket()?;
    // SAFETY: `addr` is a valid sockaddr_un of length `len`.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            addr as *const _ as *const libc::sockaddr,
            len,
        )
    };
    Ok(if r == 0 {
        Ok(fd)
    } else {
        Err(io::Error::last_os_error())
    })
}

/// Removes a temporary socket file unless forgotten.
struct TmpFile<'a>(&'a Path);

impl Drop for TmpFile<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

fn cpath(p: &Path) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// Removes `path` if it is a socket nobody listens on; `true` if it is gone.
/// The file is removed only if it is still the one that refused us.
pub fn remove_if_stale(path: &Path) -> io::Result<bool> {
    let ino = match std::fs::symlink_metadata(path) {
        Ok(m) => m.ino(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(e),
    };
    let (addr, len) = sockaddr(path)?;
    let Err(e) = try_connect(&addr, len)? else {
        return Ok(false);
    };
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => {
            if std::fs::symlink_metadata(path)
                .map(|m| m.ino() == ino)
                .unwrap_or(false)
            {
                match std::fs::remove_file(path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(true)
        }
        Some(libc::ENOENT) => Ok(true),
        _ => Ok(false),
    }
}

/// One end of a connected rendezvous socket.
#[derive(Debug)]
pub struct Stream {
    fd: OwnedFd,
}

/// How a connect attempt ended without a connection.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("nobody listens on {0} (timed out)")]
    NoListener(PathBuf),
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl Stream {
    /// Connects to the listener at `path`, retrying while nobody listens
    /// there yet, until `timeout`. A file still refusing at the end is stale
    /// (its owner is gone) and is removed.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Stream, ConnectError> {
        let (addr, len) = sockaddr(path)?;
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(100);
        let mut refused;
        loop {
            let e = match try_connect(&addr, len)? {
                Ok(fd) => return Ok(Stream { fd }),
                Err(e) => e,
            };
            match e.raw_os_error() {
                Some(libc::ECONNREFUSED) => refused = true,
                Some(libc::ENOENT) | Some(libc::EAGAIN) | Some(libc::EINTR) => refused = false,
                _ => return Err(e.into()),
            }
            let now = Instant::now();
            if now >= deadline {
                if refused {
                    remove_if_stale(path)?;
                }
                return Err(ConnectError::NoListener(path.to_owned()));
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    /// Sends one message with up to [`MAX_FDS`] descriptors. Never blocks:
    /// a peer that does not read its end makes this a `WouldBlock` error.
    pub fn send(&self, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
        assert!(fds.len() <= MAX_FDS);
        let mut iov = libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        };
        let mut cbuf = [0u64; 8];
        // SAFETY: all-zero msghdr is valid; fields set below point to live buffers.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            // SAFETY: CMSG_SPACE is a pure computation.
            let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) } as usize;
            msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = space as _;
            // SAFETY: msg_control points to `space` <= 64 bytes; the header and
            // data written stay inside it.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
                std::ptr::copy_nonoverlapping(
                    fds.as_ptr(),
                    libc::CMSG_DATA(c) as *mut RawFd,
                    fds.len(),
                );
            }
        }
        loop {
            // SAFETY: `msg` describes valid buffers for the call.
            let n = unsafe {
                libc::sendmsg(
                    self.fd.as_raw_fd(),
                    &msg,
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Receives one message into `buf` with the descriptors it carried.
    /// `Ok(None)` on timeout; `UnexpectedEof` when the peer has closed.
    pub fn recv(
        &self,
        buf: &mut [u8],
        timeout: Option<Duration>,
    ) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
        if !wait_readable(self.fd.as_raw_fd(), timeout)? {
            return Ok(None);
        }
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        let mut cbuf = [0u64; 8];
        // SAFETY: all-zero msghdr is valid; fields set below point to live buffers.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = size_of::<[u64; 8]>() as _;
        // SAFETY: `msg` describes valid buffers for the call.
        let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        let mut fds = Vec::new();
        // SAFETY: walking the control buffer the kernel filled, within msg_controllen.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let count =
                        ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                    let data = libc::CMSG_DATA(c) as *const RawFd;
                    for i in 0..count {
                        fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if n == 0 && fds.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "peer closed the connection",
            ));
        }
        if msg.msg_flags & libc::MSG_TRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "rendezvous message larger than expected",
            ));
        }
        Ok(Some((n as usize, fds)))
    }

    /// True once the peer has closed its end (or died). One `poll` call:
    /// for idle loops, never for the data path.
    pub fn peer_gone(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0
    }

    /// Process id and user id of the peer, as the kernel recorded them.
    pub fn peer_cred(&self) -> io::Result<(i32, u32)> {
        // SAFETY: all-zero ucred is valid; the kernel fills it.
        let mut cred: libc::ucred = unsafe { zeroed() };
        let mut len = size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: out-parameters sized for ucred.
        cvt(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                &mut cred as *mut _ as *mut libc::c_void,
                &mut len,
            )
        } as _)?;
        Ok((cred.pid, cred.uid))
    }

    /// Shuts both directions down; the peer sees end-of-file.
    pub fn shutdown(&self) {
        // SAFETY: plain call on our descriptor.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Hex-encodes a discriminator for use in a socket file name.
pub fn hex_name(prefix: &str, bytes: &[u8]) -> String {
    let mut s = String::with_capacity(prefix.len() + 1 + bytes.len() * 2);
    s.push_str(prefix);
    s.push('.');
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    let _ = OsStr::new(&s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> SocketDir {
        let p = std::env::temp_dir().join(format!("uvia-sock-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        SocketDir::at(p).unwrap()
    }

    #[test]
    fn listener_is_owner_only_and_removed_on_drop() {
        let dir = tmpdir("perm");
        let path = dir.socket("a");
        let l = Listener::bind(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        drop(l);
        assert!(!path.exists());
        std::fs::remove_dir_all(dir.path()).unwrap();
    }

    #[test]
    fn message_with_descriptor_and_peer_death() {
        let dir = tmpdir("msg");
        let path = dir.socket("b");
        let l = Listener::bind(&path).unwrap();
        let c = Stream::connect(&path, Duration::from_secs(5)).unwrap();
        let s = l.accept(Some(Duration::from_secs(5))).unwrap().unwrap();
        let seg = crate::Segment::create(c"x", 4096).unwrap();
        c.send(b"hello", &[seg.fd()]).unwrap();
        let mut buf = [0u8; 64];
        let (n, fds) = s
            .recv(&mut buf, Some(Duration::from_secs(5)))
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 1);
        assert_eq!(s.peer_cred().unwrap().0, std::process::id() as i32);
        assert!(!s.peer_gone());
        drop(c);
        assert!(s.peer_gone());
        assert_eq!(
            s.recv(&mut buf, Some(Duration::from_secs(1)))
                .unwrap_err()
                .kind(),
            io::ErrorKind::UnexpectedEof
        );
        drop(l);
        std::fs::remove_dir_all(dir.path()).unwrap();
    }

    #[test]
    fn stale_socket_file_is_replaced_and_connect_times_out() {
        let dir = tmpdir("stale");
        let path = dir.socket("c");
        let l = Listener::bind(&path).unwrap();
        // Simulate a crash: the descriptor closes but the file stays.
        std::mem::forget(l.path.clone());
        let fd = l.fd.as_raw_fd();
        std::mem::forget(l);
        // SAFETY: closing the leaked listener's descriptor, as a crash would.
        unsafe { libc::close(fd) };
        assert!(path.exists());
        let err = Stream::connect(&path, Duration::from_millis(50)).unwrap_err();
        assert!(matches!(err, ConnectError::NoListener(_)), "{err}");
        assert!(
            !path.exists(),
            "the stale file is removed by the one who found it"
        );
        let l2 = Listener::bind(&path).unwrap();
        drop(l2);
        std::fs::remove_dir_all(dir.path()).unwrap();
    }

    /// Another process's listener between its bind and its listen (under
    /// its temporary name, refusing connections) is not taken for a dead
    /// one: its start would fail when it renames the file into place.
    #[test]
    fn a_listener_being_started_is_not_swept() {
        let dir = tmpdir("starting");
        // Bound, not listening yet, by a live process (this one).
        let mut name = dir.socket("other").into_os_string();
        name.push(format!(".{}.0.tmp", std::process::id()));
        let starting = PathBuf::from(name);
        let fd = seqpacket().unwrap();
        let (addr, len) = sockaddr(&starting).unwrap();
        // SAFETY: `addr` is a valid sockaddr_un of length `len`.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &addr as *const _ as *const libc::sockaddr,
                len,
            )
        };
        assert_eq!(r, 0);
        let l = Listener::bind(&dir.socket("new")).unwrap();
        assert!(starting.exists(), "a listener being started keeps its file");
        drop(l);
        drop(fd);
        std::fs::remove_dir_all(dir.path()).unwrap();
    }

    #[test]
    fn the_first_listener_removes_sockets_of_dead_listeners() {
        let dir = tmpdir("sweep");
        // Left by a killed process: bound, then closed, the file stays.
        let dead = dir.socket("dead");
        drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
        let live = dir.socket("live");
        let _alive = std::os::unix::net::UnixListener::bind(&live).unwrap();
        assert!(dead.exists() && live.exists());
        let l = Listener::bind(&dir.socket("new")).unwrap();
        assert!(!dead.exists(), "a dead listener's socket is removed");
        assert!(live.exists(), "a live one's is kept");
        drop(l);
        std::fs::remove_dir_all(dir.path()).unwrap();
    }

    #[test]
    fn first_message_waits_on_every_connection_at_once() {
        let dir = tmpdir("first");
        let path = dir.socket("d");
        let mut l = Listener::bind(&path).unwrap();
        let t = Duration::from_secs(5);
        let silent: Vec<_> = (0..3).map(|_| Stream::connect(&path, t).unwrap()).collect();
        let closing = Stream::connect(&path, t).unwrap();
        let talker = Stream::connect(&path, t).unwrap();
        drop(closing);
        talker.send(b"first", &[]).unwrap();
        let mut buf = [0u8; 16];
        let (s, n, _) = l.first_message(&mut buf, Some(t), t).unwrap().unwrap();
        assert_eq!(&buf[..n], b"first");
        assert_eq!(
            l.pending.len(),
            3,
            "the silent ones wait, the closed one is gone"
        );
        // A silent one that speaks later is served from the pending set.
        silent[1].send(b"second", &[]).unwrap();
        let (_, n, _) = l.first_message(&mut buf, Some(t), t).unwrap().unwrap();
        assert_eq!(&buf[..n], b"second");
        // The others are still waited for, until their patience runs out.
        let short = Some(Duration::from_millis(20));
        assert!(l.first_message(&mut buf, short, t).unwrap().is_none());
        assert_eq!(l.pending.len(), 2);
        l.pending
            .iter_mut()
            .for_each(|(_, until)| *until = Instant::now());
        assert!(l.first_message(&mut buf, short, t).unwrap().is_none());
        assert!(l.pending.is_empty());
        drop((s, silent, l));
        std::fs::remove_dir_all(dir.path()).unwrap();
    }

    /// Another user (or a link planted by one) cannot give us the directory
    /// our sockets go in.
    #[test]
    fn a_squatted_socket_directory_is_refused() {
        let base = std::env::temp_dir().join(format!("uvia-squat-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let ours = base.join("ours");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(&ours)
            .unwrap();
        assert!(SocketDir::at(ours.clone()).is_ok());

        // A link in our place, even to a private directory of ours.
        let link = base.join("link");
        std::os::unix::fs::symlink(&ours, &link).unwrap();
        let e = SocketDir::at(link).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("symbolic link"), "{e}");

        let open = base.join("open");
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&open)
            .unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = SocketDir::at(open).unwrap_err();
        assert!(e.to_string().contains("mode 755"), "{e}");

        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // Only root can make a directory another user's.
            let theirs = base.join("theirs");
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&theirs)
                .unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
            let e = SocketDir::at(theirs).unwrap_err();
            assert!(e.to_string().contains("belongs to uid 65534"), "{e}");
        }
        std::fs::remove_dir_all(&base).unwrap();
    }
}
