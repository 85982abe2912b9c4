//! The seam between the VI model and the media that carry it.
//!
//! A provider is a folder here: `shm` (rings in shared memory between
//! processes of one host) and `net` (the protocol engine over a frame
//! medium: kernel UDP or raw Ethernet through AF_XDP). Each fills two roles:
//! the Nic's ([`NicProvider`]: open, connect and listen, address checks) and
//! one connected VI's ([`Transport`]: post, progress, the fast receive path,
//! what a waiter sleeps on, timers, disconnect). Both are enums dispatched
//! with a `match`, not trait objects, so that the shm fast path stays
//! inlined into the VI's post and done calls. Nothing outside a provider's
//! folder asks which provider it is: the shared code calls these methods,
//! and faces read the Nic's capabilities ([`NicAttributes`]).
//!
//! Adding a provider: a folder beside `shm/` and `net/` with its Nic part,
//! its VI transport and its connection request, a variant in each enum
//! below, and one row in [`PROVIDERS`].

use crate::cm::{Discriminator, NetAddress, RemoteViAttributes};
use crate::desc::Descriptor;
use crate::error::{ConnectError, OpenError, PostError};
use crate::nic::{Nic, NicAttributes, NicOptions, NicShared};
use crate::vi::{Queue, Queues, Vi};
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::time::Duration;

pub(crate) mod net;
pub(crate) mod shm;

/// A row of the provider table: the names it opens and how.
pub(crate) struct Provider {
    /// The bare name (`shm`); `<name>:<rest>` opens it too.
    pub name: &'static str,
    /// The forms of a Nic name, for error messages.
    pub usage: &'static str,
    pub open: fn(&str, &NicOptions) -> Result<Opened, OpenError>,
}

/// What a provider's open makes: the Nic's attributes and its provider half.
pub(crate) type Opened = (NicAttributes, NicProvider);

/// Every provider, by name.
pub(crate) const PROVIDERS: &[Provider] = &[
    Provider {
        name: "shm",
        usage: "shm[:<instance>]",
        open: shm::open,
    },
    Provider {
        name: "udp",
        usage: "udp[:<ip>[:<port>]]",
        open: net::open_udp,
    },
    Provider {
        name: "xdp",
        usage: "xdp:<interface>[:<queue>][:native|:generic]",
        open: net::open_xdp,
    },
];

/// The provider row whose name `name` starts with (`shm`, `shm:...`).
pub(crate) fn lookup(name: &str) -> Option<&'static Provider> {
    PROVIDERS.iter().find(|p| {
        name.strip_prefix(p.name)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(':'))
    })
}

/// The Nic names every provider takes, for error messages.
pub(crate) fn usage() -> String {
    let forms: Vec<&str> = PROVIDERS.iter().map(|p| p.usage).collect();
    forms.join(", ")
}

/// A Nic's provider half. One per Nic, made once: its variants' sizes
/// differ and nothing is gained by boxing the larger.
#[allow(clippy::large_enum_variant)]
pub(crate) enum NicProvider {
    Shm(shm::ShmNic),
    Net(net::NetNic),
}

impl NicProvider {
    /// Connects `vi` to the VI waiting on `remote`; with `local`, peer to
    /// peer (this VI waits on `local` meanwhile).
    pub fn connect(
        &self,
        vi: &Vi,
        remote: &NetAddress,
        local: Option<&Discriminator>,
        timeout: Duration,
        private: &[u8],
    ) -> Result<RemoteViAttributes, ConnectError> {
        match self {
            NicProvider::Shm(n) => match local {
                None => n.connect(vi, remote, timeout, private),
                Some(_) => Err(ConnectError::Unsupported(
                    "peer-to-peer connection on this provider",
                )),
            },
            NicProvider::Net(n) => n.connect(vi, remote, local, timeout, private),
        }
    }

    /// Waits for a connection request on `discriminator`.
    pub fn connect_wait(
        &self,
        nic: &Nic,
        discriminator: &Discriminator,
        timeout: Option<Duration>,
    ) -> Result<crate::cm::ConnRequest, ConnectError> {
        match self {
            NicProvider::Shm(n) => n.connect_wait(discriminator, timeout),
            NicProvider::Net(n) => n.connect_wait(nic, discriminator, timeout),
        }
    }

    pub fn stop_listening(&self, discriminator: &Discriminator) {
        match self {
            NicProvider::Shm(n) => n.stop_listening(discriminator),
            NicProvider::Net(n) => n.stop_listening(discriminator.as_bytes()),
        }
    }

    /// True if `host` is written as one of this provider's addresses.
    pub fn is_address(&self, host: &str) -> bool {
        match self {
            NicProvider::Shm(_) => false,
            NicProvider::Net(n) => n.is_address(host),
        }
    }
}

/// A connection request's provider half: what answering it needs.
pub(crate) enum Answer {
    Shm(shm::Answer),
    Net(net::Answer),
}

impl Answer {
    pub fn accept(
        self,
        vi: &Vi,
        req: &crate::cm::ConnRequest,
        private: &[u8],
    ) -> Result<(), ConnectError> {
        match self {
            Answer::Shm(a) => a.accept(vi, req, private),
            Answer::Net(a) => a.accept(vi, private),
        }
    }

    pub fn reject(self, req: &crate::cm::ConnRequest, private: &[u8]) -> Result<(), ConnectError> {
        match self {
            Answer::Shm(a) => a.reject(req, private),
            Answer::Net(a) => a.reject(private),
        }
    }
}

/// A VI's provider half: its connection, while it has one. The shm
/// transport lies in the VI itself, not behind a box, so that its fast path
/// takes no extra pointer; the network one is boxed (its engine is large and
/// its path a system call long).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Transport {
    /// Not connected (idle, or after a disconnect).
    None,
    Shm(shm::ShmVi),
    Net(Box<net::NetVi>),
}

impl Transport {
    /// Checks the send `d`, queues it at the back of the send queue and
    /// sends what can go now. The VI is connected.
    ///
    /// # Safety
    /// As for [`Vi::post_send_raw`].
    #[inline(always)]
    pub unsafe fn post_send(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        d: NonNull<Descriptor>,
        owned: bool,
    ) -> Result<(), PostError> {
        match self {
            // SAFETY: forwarded from the caller.
            Transport::Shm(t) => unsafe { t.post_send(vi, q, d, owned) },
            // SAFETY: forwarded from the caller.
            Transport::Net(t) => unsafe { t.post_send(vi, q, d, owned) },
            Transport::None => Err(PostError::NotConnected(vi.state())),
        }
    }

    /// A receive was just queued at the back of the receive queue.
    #[inline(always)]
    pub fn posted_recv(&mut self, q: &mut Queues) {
        if let Transport::Net(t) = self {
            t.posted_recv(q);
        }
    }

    /// A done call found nothing completed at the head of `queue`: moves
    /// what can move and returns the head if it completed.
    #[inline(always)]
    pub fn poll(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        queue: Queue,
        owned: bool,
    ) -> Option<NonNull<Descriptor>> {
        match self {
            Transport::Shm(t) => t.poll(vi, q, queue, owned),
            Transport::Net(t) => {
                t.progress(vi, q);
                vi.pop(q, queue, owned)
            }
            Transport::None => None,
        }
    }

    /// Moves everything forward that can move without waiting. True if
    /// anything happened.
    pub fn progress(&mut self, vi: &Vi, q: &mut Queues) -> bool {
        match self {
            Transport::Shm(t) => t.progress(vi, q),
            Transport::Net(t) => t.progress(vi, q),
            Transport::None => false,
        }
    }

    /// Looks at the peer's health (a system call); fails the VI if it is
    /// gone. True if anything changed.
    pub fn check_peer(&mut self, vi: &Vi, q: &mut Queues) -> bool {
        match self {
            Transport::Shm(t) => t.check_peer(vi, q),
            Transport::Net(_) | Transport::None => false,
        }
    }

    /// Asks to be woken by the peer's next message: what a waiter sleeps
    /// on. Progress must be looked at once more after this, before sleeping.
    pub fn arm(&mut self, nic: &NicShared) -> Sleep {
        match self {
            Transport::Shm(t) => Sleep::Shm(t.arm()),
            Transport::Net(t) => Sleep::Net(t.sleep_source(nic)),
            Transport::None => Sleep::Nap,
        }
    }

    /// Takes back an [`arm`](Self::arm) that was not slept on.
    pub fn disarm(&mut self) {
        if let Transport::Shm(t) = self {
            t.disarm();
        }
    }

    /// Runs the protocol's timers (after a sleep, or between the program's
    /// calls) and sends what they produced.
    pub fn run_timers(&mut self, vi: &Vi, q: &mut Queues) {
        if let Transport::Net(t) = self {
            t.run_timers(vi, q);
        }
    }

    /// Arms the doorbell for a CQ's eventfd; true if something is already
    /// waiting to be served.
    pub fn arm_eventfd(&mut self, vi: &Vi, q: &mut Queues) -> bool {
        match self {
            Transport::Shm(t) => t.arm_eventfd(vi, q),
            // Frames wake a CQ's waiter through the medium's descriptor.
            Transport::Net(t) => t.progress(vi, q),
            Transport::None => false,
        }
    }

    /// A descriptor that becomes readable when this VI has input, for a CQ
    /// waiter to poll beside its eventfd (`None`: the eventfd is enough).
    pub fn wake_fd(&self, nic: &NicShared) -> Option<RawFd> {
        match self {
            Transport::Net(t) => Some(t.wake_fd(nic)),
            Transport::Shm(_) | Transport::None => None,
        }
    }

    /// Ends the connection: the peer is told. The caller flushes the queues.
    pub fn disconnect(&mut self, vi: &Vi, q: &mut Queues) {
        match std::mem::replace(self, Transport::None) {
            Transport::Shm(t) => t.close(),
            Transport::Net(mut t) => t.disconnect(vi, q),
            Transport::None => {}
        }
    }

    /// The VI is gone with its descriptors: tell the peer, free the medium.
    pub fn drop_connection(self, nic: &NicShared) {
        match self {
            Transport::Shm(t) => t.close(),
            Transport::Net(t) => t.drop_connection(nic),
            Transport::None => {}
        }
    }
}

/// What a waiter sleeps on until the peer's next message, or a nap's end.
pub(crate) enum Sleep {
    Shm(shm::Sleep),
    Net(net::Sleep),
    /// Nothing to wait on (not connected): a short nap.
    Nap,
}

impl Sleep {
    pub fn sleep(self, nic: &NicShared, nap: Duration) {
        match self {
            Sleep::Shm(s) => s.sleep(nap),
            Sleep::Net(s) => s.sleep(nic, nap),
            Sleep::Nap => std::thread::sleep(nap.min(Duration::from_millis(1))),
        }
    }

    /// True if the protocol's timers should run after this sleep.
    pub fn runs_timers(&self) -> bool {
        matches!(self, Sleep::Net(_))
    }
}
