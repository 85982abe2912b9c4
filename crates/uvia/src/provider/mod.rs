//! The seam between the VI model and the media that carry it.
//!
//! A provider is a folder here: `shm` (rings in shared memory between
//! processes of one host) and `net` (the protocol engine over a frame
//! medium: kernel UDP or raw Ethernet through AF_XDP). Each fills two
//! contracts: the Nic's ([`NicOps`]: connect and listen, address checks;
//! opening is its row in [`PROVIDERS`]) and one connected VI's
//! ([`TransportOps`]: post, the fast receive path, progress, what a waiter
//! sleeps on, timers, disconnect). The enums [`NicProvider`] and
//! [`Transport`] hold one of each and dispatch with a `match`, not through
//! trait objects, so that the shm fast path stays inlined into the VI's
//! post and done calls. Nothing outside a provider's folder asks which
//! provider it is: the shared code calls these methods, and faces read the
//! Nic's capabilities ([`NicAttributes`]).
//!
//! Adding a provider: a folder beside `shm/` and `net/` that implements
//! both traits (with its `Answer` and `Sleep`), a variant in each enum
//! below, and one row in [`PROVIDERS`].

use crate::cm::{Discriminator, NetAddress, Patience, RemoteViAttributes};
use crate::desc::{Descriptor, Segment};
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
        usage: "xdp:<interface>[:<queue>][:native|:generic][:busypoll]",
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

/// What a provider's Nic half does, beyond opening (its row in
/// [`PROVIDERS`]).
pub(crate) trait NicOps {
    /// Connects `vi` (PendingConnect) to the VI waiting on `remote`; with
    /// `local`, peer to peer (this VI waits on `local` meanwhile); a
    /// request that finds nobody listening asks again for `wait.listener`.
    /// On success the VI is Connected; on failure the caller makes it Idle.
    fn connect(
        &self,
        vi: &Vi,
        remote: &NetAddress,
        local: Option<&Discriminator>,
        wait: Patience,
        private: &[u8],
    ) -> Result<RemoteViAttributes, ConnectError>;

    /// Waits up to `timeout` (`None`: forever) for a connection request on
    /// `discriminator`, listening on it from now until
    /// [`stop_listening`](Self::stop_listening).
    fn connect_wait(
        &self,
        nic: &Nic,
        discriminator: &Discriminator,
        timeout: Option<Duration>,
    ) -> Result<crate::cm::ConnRequest, ConnectError>;

    fn stop_listening(&self, discriminator: &Discriminator);

    /// True if `host` is written as one of this provider's addresses (the
    /// Nic's own is checked by the caller).
    fn is_address(&self, _host: &str) -> bool {
        false
    }

    /// The Nic is made: a provider that serves it in the background (a
    /// device shared with other processes) starts doing so. `nic` is the
    /// Nic, held weakly so that closing it ends that service.
    fn opened(&self, _nic: &std::sync::Weak<NicShared>) {}

    /// A region of `nic` was deregistered or its tag or enable bits
    /// changed: a provider whose peers write into its regions themselves
    /// withdraws that leave before the caller goes on.
    fn regions_changed(&self, _nic: &NicShared) {}
}

/// What one connected VI's transport does. The shared VI code calls these
/// under the VI's lock, with the VI's queues; a transport completes
/// descriptors through [`Vi::complete_send`], [`Vi::complete_recv`] and
/// [`Vi::fail`], and hands them back with [`Vi::pop`].
pub(crate) trait TransportOps {
    /// What a waiter sleeps on until the peer's next message.
    type Sleep;

    /// The VI's lock may be biased toward the thread that uses it
    /// ([`crate::bias`]): no other thread of the process drives the VI
    /// behind its program's back (a network Nic's polls drive whichever
    /// of its VIs have frames or due timers).
    const BIASED: bool;

    /// Checks the send `d` ([`prepare`](crate::vi::prepare)), queues it at
    /// the back of the send queue and sends what can go now. The VI is
    /// connected.
    ///
    /// # Safety
    /// As for [`Vi::post_send_raw`].
    unsafe fn post_send(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        d: NonNull<Descriptor>,
        owned: bool,
    ) -> Result<(), PostError>;

    /// Sends `bytes` (the parts one after the other) as one message copied
    /// during the call, with no descriptor and no completion, if the
    /// transport can do so now with nothing queued ahead of it; `false`
    /// leaves the caller to post a descriptor. The VI is connected.
    fn send_copy(
        &mut self,
        _vi: &Vi,
        _q: &mut Queues,
        _bytes: &[&[u8]],
        _imm: Option<u32>,
    ) -> bool {
        false
    }

    /// Writes the bytes of `bytes`, one after the other, into the peer's
    /// memory at `remote` (an address segment), copied during the call,
    /// with no descriptor and no completion, if the transport can place it
    /// now with nothing queued ahead of it; `false` leaves the caller to
    /// post a descriptor. The VI is connected.
    fn write_copy(
        &mut self,
        _vi: &Vi,
        _q: &mut Queues,
        _bytes: &[&[u8]],
        _remote: Segment,
    ) -> bool {
        false
    }

    /// A receive was just queued at the back of the receive queue.
    fn posted_recv(&mut self, _q: &mut Queues) {}

    /// A done call found nothing completed at the head of `queue`: moves
    /// what can move and returns the head if it completed. The fast paths
    /// live here.
    fn poll(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        queue: Queue,
        owned: bool,
    ) -> Option<NonNull<Descriptor>>;

    /// Moves everything forward that can move without waiting. True if
    /// anything happened.
    fn progress(&mut self, vi: &Vi, q: &mut Queues) -> bool;

    /// Looks at the peer's health (it may cost a system call); fails the
    /// VI if the peer is gone. True if anything changed.
    fn check_peer(&mut self, _vi: &Vi, _q: &mut Queues) -> bool {
        false
    }

    /// The peer has left with messages waiting for receives: the
    /// connection stays up while they are taken, for a bounded time.
    fn peer_leaving(&self) -> bool {
        false
    }

    /// Asks to be woken by the peer's next message. Progress is looked at
    /// once more after this, before sleeping.
    fn arm(&mut self, nic: &NicShared) -> Self::Sleep;

    /// Takes back an [`arm`](Self::arm) that was not slept on.
    fn disarm(&mut self) {}

    /// Runs the protocol's timers (after a sleep, or between the program's
    /// calls) and sends what they produced.
    fn run_timers(&mut self, _vi: &Vi, _q: &mut Queues) {}

    /// Arms the doorbell for a CQ's eventfd; true if something is already
    /// waiting to be served.
    fn arm_eventfd(&mut self, vi: &Vi, q: &mut Queues) -> bool;

    /// A descriptor that becomes readable when this VI has input, for a CQ
    /// waiter to poll beside its eventfd (`None`: the eventfd is enough).
    fn wake_fd(&self, _nic: &NicShared) -> Option<RawFd> {
        None
    }

    /// Ends the connection (VipDisconnect): the peer is told. The caller
    /// flushes the queues and drops the transport.
    fn disconnect(&mut self, vi: &Vi, q: &mut Queues);

    /// The VI is gone with its descriptors: tells the peer, frees what the
    /// connection holds in the Nic. The transport is dropped next.
    fn close(&mut self, nic: &NicShared);
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
        wait: Patience,
        private: &[u8],
    ) -> Result<RemoteViAttributes, ConnectError> {
        match self {
            NicProvider::Shm(n) => n.connect(vi, remote, local, wait, private),
            NicProvider::Net(n) => n.connect(vi, remote, local, wait, private),
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
            NicProvider::Shm(n) => n.connect_wait(nic, discriminator, timeout),
            NicProvider::Net(n) => n.connect_wait(nic, discriminator, timeout),
        }
    }

    pub fn stop_listening(&self, discriminator: &Discriminator) {
        match self {
            NicProvider::Shm(n) => n.stop_listening(discriminator),
            NicProvider::Net(n) => n.stop_listening(discriminator),
        }
    }

    /// True if `host` is written as one of this provider's addresses.
    pub fn is_address(&self, host: &str) -> bool {
        match self {
            NicProvider::Shm(n) => n.is_address(host),
            NicProvider::Net(n) => n.is_address(host),
        }
    }

    /// The Nic is made (see [`NicOps::opened`]).
    pub fn opened(&self, nic: &std::sync::Weak<NicShared>) {
        match self {
            NicProvider::Shm(n) => n.opened(nic),
            NicProvider::Net(n) => n.opened(nic),
        }
    }

    /// See [`NicOps::regions_changed`].
    pub fn regions_changed(&self, nic: &NicShared) {
        match self {
            NicProvider::Shm(n) => n.regions_changed(nic),
            NicProvider::Net(n) => n.regions_changed(nic),
        }
    }

    /// Runs the due protocol timers of the Nic's VIs (a CQ's ready list
    /// drives only the VIs whose frames arrived; this keeps the others'
    /// acknowledgements and keep-alives going). Nothing where the VIs
    /// keep no timers (shm).
    pub fn run_due_timers(&self) {
        if let NicProvider::Net(n) = self {
            n.run_due_timers();
        }
    }

    /// How many sweeps of its VIs' due timers the Nic has made, by anyone
    /// (the progress thread tells a Nic its program drives by it); `None`
    /// where they keep none (shm).
    pub fn sweeps(&self) -> Option<u64> {
        match self {
            NicProvider::Net(n) => Some(n.sweeps()),
            NicProvider::Shm(_) => None,
        }
    }

    /// Has the Nic's medium give back what its receives keep for later,
    /// for a waiter about to sleep on a descriptor.
    pub fn settle(&self) {
        if let NicProvider::Net(n) = self {
            n.settle();
        }
    }

    /// How long a sleeping waiter over the Nic's VIs may sleep before one
    /// of their timers is due; `None` where they keep none (shm).
    pub fn timers_due_in(&self) -> Option<Duration> {
        match self {
            NicProvider::Net(n) => Some(n.timers_due_in()),
            NicProvider::Shm(_) => None,
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
/// An explicit tag byte (`repr(u8)`): matching it is one load and compare,
/// where a tag folded into a field's spare values took four instructions
/// more on every post and poll (counted with callgrind).
#[allow(clippy::large_enum_variant)]
#[repr(u8)]
pub(crate) enum Transport {
    /// Not connected (idle, or after a disconnect).
    None,
    Shm(shm::ShmVi),
    Net(Box<net::NetVi>),
}

/// Calls `$f` on the transport behind `$t`, or evaluates `$none` when the VI
/// has no connection. One `match`, so each arm is a direct, inlinable call.
macro_rules! dispatch {
    ($t:expr, $x:ident => $f:expr, None => $none:expr) => {
        match $t {
            Transport::Shm($x) => $f,
            Transport::Net($x) => $f,
            Transport::None => $none,
        }
    };
}

impl Transport {
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
        // SAFETY: forwarded from the caller.
        dispatch!(self, t => unsafe { t.post_send(vi, q, d, owned) },
            None => Err(PostError::NotConnected(vi.state())))
    }

    #[inline(always)]
    pub fn send_copy(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        bytes: &[&[u8]],
        imm: Option<u32>,
    ) -> bool {
        dispatch!(self, t => t.send_copy(vi, q, bytes, imm), None => false)
    }

    #[inline(always)]
    pub fn write_copy(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        bytes: &[&[u8]],
        remote: Segment,
    ) -> bool {
        dispatch!(self, t => t.write_copy(vi, q, bytes, remote), None => false)
    }

    #[inline(always)]
    pub fn posted_recv(&mut self, q: &mut Queues) {
        dispatch!(self, t => t.posted_recv(q), None => ())
    }

    #[inline(always)]
    pub fn poll(
        &mut self,
        vi: &Vi,
        q: &mut Queues,
        queue: Queue,
        owned: bool,
    ) -> Option<NonNull<Descriptor>> {
        dispatch!(self, t => t.poll(vi, q, queue, owned), None => None)
    }

    pub fn progress(&mut self, vi: &Vi, q: &mut Queues) -> bool {
        dispatch!(self, t => t.progress(vi, q), None => false)
    }

    pub fn check_peer(&mut self, vi: &Vi, q: &mut Queues) -> bool {
        dispatch!(self, t => t.check_peer(vi, q), None => false)
    }

    pub fn peer_leaving(&self) -> bool {
        dispatch!(self, t => t.peer_leaving(), None => false)
    }

    /// See [`TransportOps::BIASED`]; false with no connection.
    pub fn biased(&self) -> bool {
        match self {
            Transport::Shm(_) => shm::ShmVi::BIASED,
            Transport::Net(_) => net::NetVi::BIASED,
            Transport::None => false,
        }
    }

    /// The VI's own medium and a receive batch, lent for a sleep in the
    /// medium's receive ([`Vi::sleep_in_recv`](crate::vi::Vi)): `None`
    /// where the transport has no such medium now.
    pub fn lend_recv(&mut self) -> Option<Lent> {
        match self {
            Transport::Net(t) => t.lend_recv().map(|(medium, batch)| Lent { medium, batch }),
            _ => None,
        }
    }

    /// Moves the VI forward with the `n` frames a sleep on `lent` brought;
    /// false if there was nothing to take them (the connection changed
    /// meanwhile).
    pub fn slept_in_recv(&mut self, vi: &Vi, q: &mut Queues, lent: Lent, n: usize) -> bool {
        match self {
            Transport::Net(t) => t.slept_in_recv(vi, q, &lent.medium, lent.batch, n),
            _ => false,
        }
    }

    pub fn arm(&mut self, nic: &NicShared) -> Sleep {
        match self {
            Transport::Shm(t) => Sleep::Shm(t.arm(nic)),
            Transport::Net(t) => Sleep::Net(t.arm(nic)),
            Transport::None => Sleep::Nap,
        }
    }

    pub fn disarm(&mut self) {
        dispatch!(self, t => t.disarm(), None => ())
    }

    pub fn run_timers(&mut self, vi: &Vi, q: &mut Queues) {
        dispatch!(self, t => t.run_timers(vi, q), None => ())
    }

    pub fn arm_eventfd(&mut self, vi: &Vi, q: &mut Queues) -> bool {
        dispatch!(self, t => t.arm_eventfd(vi, q), None => false)
    }

    pub fn wake_fd(&self, nic: &NicShared) -> Option<RawFd> {
        dispatch!(self, t => t.wake_fd(nic), None => None)
    }

    /// Ends the connection; the VI has none afterwards (a network one may
    /// go on closing in the Nic, `NetVi::keep_closing`).
    pub fn disconnect(&mut self, vi: &Vi, q: &mut Queues) {
        dispatch!(self, t => t.disconnect(vi, q), None => ());
        if let Transport::Net(t) = std::mem::replace(self, Transport::None) {
            t.keep_closing(&vi.s.nic);
        }
    }

    /// The VI is gone: its connection closes.
    pub fn drop_connection(mut self, nic: &NicShared) {
        dispatch!(&mut self, t => t.close(nic), None => ());
        if let Transport::Net(t) = self {
            t.keep_closing(nic);
        }
    }
}

/// A VI's medium and receive batch, lent for a sleep in its receive
/// ([`Transport::lend_recv`]).
pub(crate) struct Lent {
    medium: std::sync::Arc<dyn uvia_net::Medium>,
    batch: uvia_net::RecvBatch,
}

impl Lent {
    /// Sleeps up to `nap` in the medium's receive: the frames it took.
    pub fn recv_wait(&mut self, nap: Duration) -> usize {
        self.medium.recv_wait(&mut self.batch, nap).unwrap_or(0)
    }
}

/// What a waiter sleeps on until the peer's next message, or a nap's end.
#[derive(Clone)]
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

    /// Wakes a thread asleep on this (from another thread of the process):
    /// a futex doorbell moves on; a descriptor cannot be woken so, and its
    /// sleeper is woken another way.
    pub fn wake(&self) {
        if let Sleep::Shm(s) = self {
            s.wake();
        }
    }

    /// True if progress must be looked at after arming, before sleeping:
    /// a doorbell rings only for what comes after the arm. A network
    /// VI's socket stays readable while a frame waits there.
    pub fn needs_recheck(&self) -> bool {
        !matches!(self, Sleep::Net(_))
    }

    /// What a completion queue's waiter sleeping on several VIs at once
    /// watches for this one: a futex word, or nothing to wait for (`Ok(None)`,
    /// a VI with no connection). `Err(())`: this sleep is on a descriptor,
    /// which a futex cannot watch.
    #[allow(clippy::result_unit_err)]
    pub fn watch(&self) -> Result<Option<uvia_shm::doorbell::Watch<'_>>, ()> {
        match self {
            Sleep::Shm(s) => Ok(Some(s.watch())),
            Sleep::Net(_) => Err(()),
            Sleep::Nap => Ok(None),
        }
    }
}
