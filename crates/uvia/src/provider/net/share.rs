//! A udp device address shared by the processes of one user on a host, as
//! VIA's host device is (see docs/DESIGN.md, "One device per host").
//!
//! The first process to open `udp:<ip>:<port>` binds the address and owns
//! it; a later one, finding it bound, joins the owner through
//! [`uvia_net::share`], sends from a port of its own on the same IP, and
//! tells the owner the discriminators it waits on. The owner's endpoint
//! forwards a request for one of those to that process, which takes it in
//! as if it had come from the requester and answers from the connection's
//! own socket: data never passes through the owner. A thread per shared
//! Nic serves the device while its program makes no call: the owner's
//! forwards, a member's requests handed over. When the owner exits, a
//! member takes the address over and the others join it.

use super::{udp_options, NetNic};
use crate::error::ConnectError;
use crate::nic::NicShared;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};
use uvia_net::share::{DeviceMember, DeviceOwner, Interest, Notice, ShareError, MAX_MESSAGE};
use uvia_net::{Addr, Medium};
use uvia_proto::endpoint::Wait;

/// Longest sleep of the device thread between looks at whether its Nic is
/// still open (closing it also wakes the thread at once).
const THREAD_NAP: Duration = Duration::from_millis(100);

/// The part this process plays for the device address.
enum Role {
    /// It bound the address: requests arrive here.
    Owner(DeviceOwner),
    /// Another process owns it and hands requests over.
    Member(DeviceMember),
    /// The owner exited and the address could be neither taken over nor
    /// joined again: why.
    Lost(String),
}

/// A Nic's share of its device address.
pub(crate) struct Share {
    device: SocketAddr,
    role: Mutex<Role>,
    /// The device address's socket, once this process took it over from
    /// an owner that exited (the Nic's own medium stays the socket its
    /// requests go from).
    host: OnceLock<Box<dyn Medium>>,
    /// What this process waits on, to tell a new owner.
    told: Mutex<HashSet<(Interest, Vec<u8>)>>,
    /// Wakes the device thread when the Nic closes (an eventfd).
    wake: OwnedFd,
    /// Wakes the program's connect-waits when the device thread has
    /// queued a request for them (an eventfd): the thread and a waiter
    /// wake on the same sockets, and the waiter would otherwise sleep out
    /// its nap on a request the thread took in.
    queued: OwnedFd,
}

/// Adds one to an eventfd's count.
fn signal(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd of ours.
    unsafe { libc::write(fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
}

/// Empties an eventfd's count (non-blocking: nothing there changes nothing).
fn drain(fd: &OwnedFd) {
    let mut count = 0u64;
    // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd of ours.
    unsafe {
        libc::read(
            fd.as_raw_fd(),
            &mut count as *mut u64 as *mut libc::c_void,
            8,
        )
    };
}

fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: plain eventfd creation; the result is checked.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// A lock whose holder cannot leave its data half-changed (each critical
/// section here is one call or one insert): a poisoned one is still good.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn wait_of(i: Interest) -> Wait {
    match i {
        Interest::Listen => Wait::Listen,
        Interest::Peer => Wait::Peer,
    }
}

impl Share {
    fn new(device: SocketAddr, role: Role) -> Result<Arc<Share>, ShareError> {
        let io = |source| ShareError::Io {
            addr: device,
            source,
        };
        let wake = eventfd().map_err(io)?;
        let queued = eventfd().map_err(io)?;
        Ok(Arc::new(Share {
            device,
            role: Mutex::new(role),
            host: OnceLock::new(),
            told: Mutex::new(HashSet::new()),
            wake,
            queued,
        }))
    }

    /// This process has bound `device`: it owns it.
    pub fn owner(device: SocketAddr) -> Result<Arc<Share>, ShareError> {
        Share::new(device, Role::Owner(DeviceOwner::listen(device)?))
    }

    /// Another process has bound `device`: join it (same user only).
    pub fn member(device: SocketAddr) -> Result<Arc<Share>, ShareError> {
        Share::new(device, Role::Member(DeviceMember::join(device)?))
    }

    /// Tells the owner this process waits (`on`) or no longer waits on
    /// `discriminator`; each change once.
    pub fn tell(&self, interest: Interest, discriminator: &[u8], on: bool) {
        let key = (interest, discriminator.to_vec());
        let changed = {
            let mut told = lock(&self.told);
            match on {
                true => told.insert(key),
                false => told.remove(&key),
            }
        };
        if !changed {
            return;
        }
        if let Role::Member(m) = &*lock(&self.role) {
            // A member whose owner has gone finds out on its next look
            // and tells the new owner everything then.
            let _ = m.tell(interest, discriminator, on);
        }
    }

    /// Hands a request that came from `from` to member `member`.
    pub fn forward(&self, member: u32, from: Addr, frame: &[u8]) {
        let Addr::Ip(from) = from else {
            return;
        };
        if let Role::Owner(o) = &mut *lock(&self.role) {
            // A member gone or full: the requester asks again.
            let _ = o.forward(member, from, frame);
        }
    }

    /// Why requests no longer reach this process, if they do not.
    pub fn lost(&self) -> Option<String> {
        match &*lock(&self.role) {
            Role::Lost(why) => Some(why.clone()),
            _ => None,
        }
    }

    /// The descriptors that wake the device thread, besides the Nic's
    /// medium; and whether the medium should wake it too (an owner with
    /// members: requests for them arrive there).
    fn fds(&self) -> (Vec<RawFd>, bool) {
        let mut v = vec![self.wake.as_raw_fd()];
        if let Some(h) = self.host.get() {
            v.push(h.fd());
        }
        let serve_medium = match &*lock(&self.role) {
            Role::Owner(o) => {
                v.extend(o.fds());
                o.members() > 0 && self.host.get().is_none()
            }
            Role::Member(m) => {
                v.push(m.fd());
                false
            }
            Role::Lost(_) => false,
        };
        (v, serve_medium)
    }

    /// Wakes the device thread: its Nic has closed.
    pub fn stop(&self) {
        signal(&self.wake);
    }

    /// A request has been queued for a listener of this process: wakes
    /// the program's connect-waits.
    pub fn queued(&self) {
        signal(&self.queued);
    }

    /// The device address's socket, when this process took it over.
    pub fn host(&self) -> Option<&dyn Medium> {
        self.host.get().map(|h| &**h)
    }
}

impl NetNic {
    /// Takes in what the device's other processes said or handed over: an
    /// owner hears who waits on what, a member takes the requests handed
    /// to it (and takes the address over if its owner has gone). Returns
    /// true if requests may be waiting on the Nic's medium for members.
    pub(super) fn serve_share(&self) -> bool {
        let Some(share) = &self.share else {
            return false;
        };
        let mut notices = Vec::new();
        let mut frames: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
        let mut owner_gone = false;
        let mut has_members = false;
        {
            let mut role = lock(&share.role);
            match &mut *role {
                Role::Owner(o) => {
                    o.poll(&mut |n| notices.push(n));
                    has_members = o.members() > 0;
                }
                Role::Member(m) => {
                    let mut buf = vec![0u8; MAX_MESSAGE];
                    loop {
                        match m.recv(&mut buf) {
                            Ok(Some((from, n))) => frames.push((from, buf[..n].to_vec())),
                            Ok(None) => break,
                            Err(_) => {
                                owner_gone = true;
                                break;
                            }
                        }
                    }
                }
                Role::Lost(_) => {}
            }
            if owner_gone {
                // Under the lock: another caller that saw the same end
                // finds the role already changed.
                *role = take_over(share);
            }
        }
        if !notices.is_empty() {
            let mut ep = self.endpoint.lock();
            for n in notices {
                match n {
                    Notice::Waits {
                        member,
                        interest,
                        discriminator,
                    } => ep.forward(wait_of(interest), &discriminator, member),
                    Notice::Withdraws {
                        member,
                        interest,
                        discriminator,
                    } => ep.withdraw(wait_of(interest), &discriminator, member),
                    Notice::Gone { member } => ep.withdraw_member(member),
                }
            }
        }
        if !frames.is_empty() {
            let now = Instant::now();
            let mut reply = vec![0u8; uvia_proto::wire::MAX_REPLY_LEN];
            for (from, bytes) in frames {
                self.dispatch(Addr::Ip(from), &bytes, &mut None, now, &mut reply);
            }
        }
        has_members || share.host.get().is_some()
    }
}

/// The owner has gone: this process binds the address and owns it, or, if
/// another member was first, joins that one and tells it again what this
/// one waits on. Requests sent meanwhile went unanswered; their senders
/// ask again. Returns the new role.
fn take_over(share: &Share) -> Role {
    let device = share.device;
    match uvia_net::udp::UdpMedium::bind(device, udp_options()) {
            Ok(m) => match DeviceOwner::listen(device) {
                Ok(o) => {
                    let _ = share.host.set(Box::new(m));
                    Role::Owner(o)
                }
                Err(e) => Role::Lost(format!(
                    "the process that opened {device} first has exited, and this one could not take it over: {e}"
                )),
            },
            Err(uvia_net::udp::UdpError::InUse { .. }) => match DeviceMember::join(device) {
                Ok(m) => {
                    for (interest, d) in lock(&share.told).iter() {
                        let _ = m.tell(*interest, d, true);
                    }
                    Role::Member(m)
                }
                Err(e) => Role::Lost(format!(
                    "the process that opened {device} first has exited, and the address is now held elsewhere: {e}"
                )),
            },
            Err(e) => Role::Lost(format!(
                "the process that opened {device} first has exited, and this one could not take it over: {e}"
            )),
        }
}

impl NetNic {
    /// The error a connection call gives once requests no longer reach
    /// this process.
    pub(super) fn share_lost(&self) -> Option<ConnectError> {
        let why = self.share.as_ref()?.lost()?;
        Some(ConnectError::Io(std::io::Error::other(why)))
    }

    /// Sleeps until a frame may be ready on the Nic's medium, or, on a
    /// shared device, something came from the device's other processes.
    pub(super) fn wait_nic(&self, nap: Duration) {
        let Some(share) = &self.share else {
            let _ = self.medium.wait(Some(nap));
            return;
        };
        let (mut fds, _) = share.fds();
        fds.push(self.medium.fd());
        fds.push(share.queued.as_raw_fd());
        let _ = uvia_net::wait_any(&fds, Some(nap));
        drain(&share.queued);
    }

    /// Starts the device thread of a shared Nic.
    pub(super) fn start_share(&self, nic: &Weak<NicShared>) {
        let Some(share) = self.share.clone() else {
            return;
        };
        let nic = nic.clone();
        // Without the thread the device is still served by the program's
        // own calls; a thread that cannot start is no reason to fail.
        let _ = std::thread::Builder::new()
            .name("uvia-device".into())
            .spawn(move || serve(nic, share));
    }
}

/// The device thread: serves the device while the Nic is open.
fn serve(nic: Weak<NicShared>, share: Arc<Share>) {
    loop {
        let fds = {
            let Some(n) = nic.upgrade() else {
                return;
            };
            let Some(net) = NetNic::of(&n) else {
                return;
            };
            let serve_medium = net.serve_share();
            if serve_medium {
                // Requests for members (or, taken over, for anyone).
                net.poll(None);
            }
            let (mut fds, medium_too) = share.fds();
            if medium_too {
                fds.push(net.medium.fd());
            }
            fds
        };
        let _ = uvia_net::wait_any(&fds, Some(THREAD_NAP));
        drain(&share.wake);
    }
}
