//! The event queue: connection events (`FI_CONNREQ`, `FI_CONNECTED`,
//! `FI_SHUTDOWN`), their errors, and events the program writes itself.
//!
//! Progress happens here: a read asks each passive endpoint bound to the
//! queue for requests that arrived (uvia's connect wait with no wait), so
//! a program that reads its EQ accepts connections without a thread.
//!
//! An EQ opened with `FI_WAIT_FD` hands out an eventfd (`FI_GETWAIT`),
//! readable while events are queued. The first such call starts a thread
//! that makes the reads' progress between the program's calls, so that a
//! request or a failed connection wakes a program asleep in `poll()`.

use crate::defer::Deferred;
use crate::fabric::Fabric;
use crate::guard::{self, lock};
use crate::nosys;
use crate::pep::Pep;
use crate::sys::*;
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One queued event.
pub enum Event {
    /// A connection event: `fi_eq_cm_entry` with private data after it.
    Cm {
        event: u32,
        fid: fid_t,
        info: *mut fi_info,
        data: Vec<u8>,
    },
    /// An error, read with `fi_eq_readerr`.
    Error {
        fid: fid_t,
        context: *mut c_void,
        err: c_int,
        data: Vec<u8>,
    },
    /// Written by the program with `fi_eq_write`: handed back as written.
    User { event: u32, bytes: Vec<u8> },
}

// SAFETY: the raw pointers are fids and infos this provider made, handed
// to whichever thread reads the queue, as libfabric hands them.
unsafe impl Send for Event {}

/// How a connection request ended, as the connecting thread found it.
pub enum Outcome {
    /// Accepted, with the server's private data.
    Connected(Vec<u8>),
    /// Refused or failed: the libfabric error code and the reject's
    /// private data (the error entry's `err_data`).
    Failed(c_int, Vec<u8>),
}

/// An endpoint whose connection the queue reports on: the answer to its
/// `fi_connect` when it comes (`FI_CONNECTED` or an error), then
/// `FI_SHUTDOWN` once if its VI fails (the peer disconnected or died).
pub struct Tracked {
    fid: fid_t,
    context: *mut c_void,
    vi: uvia::Vi,
    /// Set by the connecting thread; taken by an EQ read.
    pub outcome: Mutex<Option<Outcome>>,
    /// FI_CONNECTED was queued: the VI is watched for failure.
    connected: bool,
    /// When an EQ read last drove the VI to look for a disconnect.
    looked: Option<Instant>,
    /// The endpoint's receives held for its next CQ read (shm), posted by
    /// a look that finds the peer leaving with messages for them.
    deferred: Option<Arc<Deferred>>,
}

// SAFETY: `fid` and `context` are only copied into events (the endpoint
// untracks itself before it is freed); the VI and the outcome are shared
// under their own locks.
unsafe impl Send for Tracked {}
unsafe impl Sync for Tracked {}

impl Tracked {
    /// An endpoint `fid` with `vi`; `connected` if its FI_CONNECTED is
    /// already queued (an accept).
    pub fn new(
        fid: fid_t,
        context: *mut c_void,
        vi: uvia::Vi,
        connected: bool,
        deferred: Option<Arc<Deferred>>,
    ) -> Tracked {
        Tracked {
            fid,
            context,
            vi,
            outcome: Mutex::new(None),
            connected,
            looked: None,
            deferred,
        }
    }
}

/// An event queue. `#[repr(C)]` with libfabric's `fid_eq` first.
#[repr(C)]
pub struct Eq {
    pub fid: fid_eq,
    fabric: *const Fabric,
    events: Mutex<VecDeque<Event>>,
    /// Passive endpoints bound here, polled for requests by each read.
    listeners: Mutex<Vec<usize>>,
    /// Endpoints whose connection events come here.
    tracked: Mutex<Vec<std::sync::Arc<Mutex<Tracked>>>>,
    /// The error event last read, whose data `fi_eq_readerr` points into.
    last_error: Mutex<Vec<u8>>,
    /// Held by whoever takes events in (a read, or the wait fd's thread);
    /// a listener leaves only between two such turns.
    progressing: Mutex<()>,
    /// The wait object asked for (`FI_WAIT_NONE`, `FI_WAIT_UNSPEC`, `FI_WAIT_FD`).
    wait_obj: fi_wait_obj,
    /// The fd `FI_GETWAIT` hands out and its thread, made by the first such call.
    wait_fd: OnceLock<WaitFd>,
    pub refs: AtomicUsize,
    /// When a read that does not wait next asks the listeners and the
    /// tracked connections (ns after `epoch`): see [`LISTEN_EVERY`].
    listen_at: AtomicU64,
    epoch: Instant,
}

/// How often reads that do not wait look for connection requests and
/// outcomes. Asking a listener is a system call (an `accept` that finds
/// nothing), looking at the tracked connections takes three locks each,
/// and `ofi_rxm` reads its EQ every few messages to make progress: on shm
/// that was a failed `accept4` and about 2,100 instructions every fourth
/// round of an 8-byte ping-pong. An event then waits up to this long more,
/// which a connection's setup (milliseconds) does not notice.
const LISTEN_EVERY: Duration = Duration::from_micros(100);
/// How often EQ reads drive a connected VI to notice its peer's
/// disconnect: seldom enough that a program reading its EQ in its data
/// loop (ofi_rxm's connection progress) costs its VIs nothing measurable.
const WATCH_EVERY: Duration = Duration::from_millis(1);
/// The least time between two looks at one VI, per connection the EQ
/// tracks: a look (a receive call on a network medium, a `poll` of the
/// peer's socket on shm) takes some 0.5 us here, so with 1,000 connections
/// each is looked at every 50 ms, about 1% of a CPU.
const WATCH_PER_VI: Duration = Duration::from_micros(50);

/// What a program sleeps on for an EQ: an eventfd whose count is non-zero
/// exactly while events are queued (written on every push and drained when
/// a read empties the queue, both under the queue's lock), and the thread
/// that takes events in while the program sleeps.
struct WaitFd {
    fd: OwnedFd,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl WaitFd {
    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: an eventfd we own; a write of 8 bytes. It fails only when
        // the count would overflow, and it is non-zero then anyway.
        unsafe { libc::write(self.fd.as_raw_fd(), &one as *const u64 as *const c_void, 8) };
    }

    fn drain(&self) {
        let mut n: u64 = 0;
        // SAFETY: a non-blocking eventfd we own; a read of 8 bytes resets it
        // (or fails with EAGAIN when it is zero already).
        unsafe { libc::read(self.fd.as_raw_fd(), &mut n as *mut u64 as *mut c_void, 8) };
    }

    /// Stops the thread and waits for it to end.
    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = lock(&self.thread).take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

static FI_OPS: fi_ops = fi_ops {
    size: std::mem::size_of::<fi_ops>(),
    close: Some(close),
    bind: Some(nosys::bind),
    control: Some(control),
    ops_open: Some(nosys::ops_open),
    tostr: Some(nosys::tostr),
    ops_set: Some(nosys::ops_set),
};

static OPS: fi_ops_eq = fi_ops_eq {
    size: std::mem::size_of::<fi_ops_eq>(),
    read: Some(read),
    readerr: Some(readerr),
    write: Some(write),
    sread: Some(sread),
    strerror: Some(strerror),
};

/// `fi_eq_open`.
pub unsafe extern "C" fn open(
    fabric: *mut fid_fabric,
    attr: *mut fi_eq_attr,
    eq: *mut *mut fid_eq,
    context: *mut c_void,
) -> c_int {
    guard::call("eq_open", || {
        // SAFETY: libfabric passes the fabric it was given and an attribute struct.
        let f = unsafe { Fabric::from_fid(fabric) }?;
        let attr = unsafe { attr.as_ref() }.ok_or(err::EINVAL)?;
        if eq.is_null() {
            return Err(err::EINVAL);
        }
        match attr.wait_obj {
            FI_WAIT_NONE | FI_WAIT_UNSPEC | FI_WAIT_FD => {}
            _ => return Err(err::ENOSYS),
        }
        let q = Box::new(Eq {
            fid: fid_eq {
                fid: fid {
                    fclass: FI_CLASS_EQ as usize,
                    context,
                    ops: &FI_OPS as *const fi_ops as *mut fi_ops,
                },
                ops: &OPS as *const fi_ops_eq as *mut fi_ops_eq,
            },
            fabric: f,
            events: Mutex::new(VecDeque::new()),
            listeners: Mutex::new(Vec::new()),
            tracked: Mutex::new(Vec::new()),
            last_error: Mutex::new(Vec::new()),
            progressing: Mutex::new(()),
            listen_at: AtomicU64::new(0),
            epoch: Instant::now(),
            wait_obj: attr.wait_obj,
            wait_fd: OnceLock::new(),
            refs: AtomicUsize::new(0),
        });
        f.refs.fetch_add(1, Ordering::AcqRel);
        // SAFETY: checked non-NULL above.
        unsafe { *eq = Box::into_raw(q) as *mut fid_eq };
        Ok(())
    })
}

impl Eq {
    /// # Safety
    /// `p` is NULL or a fid this provider handed out and has not freed.
    pub unsafe fn from_fid<'a>(p: *mut fid) -> Result<&'a Eq, c_int> {
        // SAFETY: per the contract, with the class checked.
        match unsafe { p.as_ref() } {
            Some(f) if f.fclass == FI_CLASS_EQ as usize => Ok(unsafe { &*(p as *const Eq) }),
            _ => Err(err::EINVAL),
        }
    }

    pub fn push(&self, e: Event) {
        let mut q = lock(&self.events);
        q.push_back(e);
        if let Some(w) = self.wait_fd.get() {
            w.signal();
        }
    }

    /// After events left the queue `q`: the wait fd goes quiet when it is
    /// empty.
    fn taken(&self, q: &VecDeque<Event>) {
        if let (true, Some(w)) = (q.is_empty(), self.wait_fd.get()) {
            w.drain();
        }
    }

    pub fn add_listener(&self, pep: &Pep) {
        lock(&self.listeners).push(pep as *const Pep as usize);
        self.refs.fetch_add(1, Ordering::AcqRel);
    }

    pub fn remove_listener(&self, pep: &Pep) {
        // Not while another thread's progress may be asking it for requests.
        let _turn = lock(&self.progressing);
        let mut l = lock(&self.listeners);
        if let Some(i) = l.iter().position(|p| *p == pep as *const Pep as usize) {
            l.remove(i);
            self.refs.fetch_sub(1, Ordering::AcqRel);
        }
        // Its requests not yet read go with it, refused: an event naming
        // a listener that is gone could not be answered through it.
        let fid = &pep.fid.fid as *const fid as fid_t;
        let mut unread = Vec::new();
        {
            let mut q = lock(&self.events);
            q.retain(|e| match e {
                Event::Cm { fid: f, info, .. } if *f == fid => {
                    unread.push(*info);
                    false
                }
                _ => true,
            });
            self.taken(&q);
        }
        for info in unread.into_iter().filter(|i| !i.is_null()) {
            // SAFETY: infos this provider made for the events, never read.
            unsafe {
                if let Ok(req) = crate::pep::ConnReq::take((*info).handle) {
                    if let Some(mut r) = lock(&req.request).take() {
                        let _ = r.reject();
                    }
                }
                fi_freeinfo(info);
            }
        }
    }

    /// Reports on `t`'s connection from now on.
    pub fn track(&self, t: std::sync::Arc<Mutex<Tracked>>) {
        lock(&self.tracked).push(t);
    }

    /// Forgets endpoint `fid` (it closes): no more events for it, and
    /// those queued and unread are dropped.
    pub fn untrack(&self, fid: fid_t) {
        lock(&self.tracked).retain(|t| lock(t).fid != fid);
        let mut q = lock(&self.events);
        q.retain(|e| match e {
            Event::Cm { fid: f, .. } | Event::Error { fid: f, .. } => *f != fid,
            Event::User { .. } => true,
        });
        self.taken(&q);
    }

    /// Queues what the tracked endpoints' connections did since the last look.
    fn watch(&self) {
        let mut tracked = lock(&self.tracked);
        // Each look may cost a system call: with many connections, each is
        // looked at less often, so that the looks stay about 1% of a CPU.
        let every = WATCH_EVERY.max(WATCH_PER_VI * tracked.len() as u32);
        let now = Instant::now();
        tracked.retain(|t| {
            let mut t = lock(t);
            let outcome = lock(&t.outcome).take();
            match outcome {
                Some(Outcome::Connected(data)) => {
                    self.push(Event::Cm {
                        event: FI_CONNECTED,
                        fid: t.fid,
                        info: std::ptr::null_mut(),
                        data,
                    });
                    t.connected = true;
                    true
                }
                Some(Outcome::Failed(err, data)) => {
                    self.push(Event::Error {
                        fid: t.fid,
                        context: t.context,
                        err,
                        data,
                    });
                    false
                }
                // A program waiting for FI_SHUTDOWN may read nothing but
                // the EQ: the VI learns of its peer's disconnect only when
                // driven and looking, so the look does both (unless a CQ
                // wait holds the VI: it sees the disconnect itself).
                None if t.connected && {
                    // Only a connection still up is looked at: one this side
                    // shut down itself reports no FI_SHUTDOWN for it.
                    if t.vi.state() == uvia::ViState::Connected
                        && t.looked.is_none_or(|at| now - at >= every)
                    {
                        t.looked = Some(now);
                        // A peer that left with messages waiting: the
                        // receives the program posted and no CQ read has
                        // posted yet take them before the connection
                        // fails, as they would at the program's next read.
                        // (Not where a CQ waiter drives the VI: receives
                        // posted while it sleeps go to the VI at once.)
                        if t.vi.try_watch()
                            && t.deferred.as_ref().is_some_and(|df| {
                                df.waiting() && t.vi.peer_leaving() && df.post_accepted(&t.vi)
                            })
                        {
                            t.vi.try_watch();
                        }
                    }
                    t.vi.state() == uvia::ViState::Error
                } =>
                {
                    self.push(Event::Cm {
                        event: FI_SHUTDOWN,
                        fid: t.fid,
                        info: std::ptr::null_mut(),
                        data: Vec::new(),
                    });
                    false
                }
                None => true,
            }
        });
    }

    /// Takes in the requests that arrived at the bound listeners, waiting
    /// up to `wait` on the first of them, and what the tracked
    /// connections did.
    fn progress(&self, wait: Duration) {
        // One thread at a time takes events in; another finds them queued.
        let _turn = match self.progressing.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                if !wait.is_zero() {
                    std::thread::sleep(wait.min(Duration::from_millis(1)));
                }
                return;
            }
        };
        if wait.is_zero() {
            let now = self.epoch.elapsed().as_nanos() as u64;
            if now < self.listen_at.load(Ordering::Relaxed) {
                return;
            }
            self.listen_at
                .store(now + LISTEN_EVERY.as_nanos() as u64, Ordering::Relaxed);
        }
        self.watch();
        let listeners = lock(&self.listeners).clone();
        for (i, p) in listeners.iter().enumerate() {
            // SAFETY: a passive endpoint removes itself before it is freed.
            let pep = unsafe { &*(*p as *const Pep) };
            pep.poll(self, if i == 0 { wait } else { Duration::ZERO });
        }
        if listeners.is_empty() && !wait.is_zero() {
            std::thread::sleep(wait.min(Duration::from_millis(1)));
        }
    }

    /// One event into `buf`, or `-FI_EAGAIN` / `-FI_EAVAIL`.
    fn read_one(
        &self,
        event: *mut u32,
        buf: *mut c_void,
        len: usize,
        flags: u64,
    ) -> Result<isize, c_int> {
        let mut q = lock(&self.events);
        let n = match q.front() {
            None => return Err(-FI_EAGAIN),
            Some(Event::Error { .. }) => return Err(-(FI_EAVAIL as c_int)),
            Some(Event::Cm {
                event: ev,
                fid,
                info,
                data,
            }) => {
                let head = std::mem::size_of::<fi_eq_cm_entry>();
                let n = head + data.len();
                if buf.is_null() || len < n {
                    return Err(-(FI_ETOOSMALL as c_int));
                }
                let entry = buf as *mut fi_eq_cm_entry;
                // SAFETY: `buf` holds `len >= n` bytes per the caller; the
                // entry's fields are written unaligned-safe through raw
                // field pointers, the data after the header.
                unsafe {
                    std::ptr::addr_of_mut!((*entry).fid).write_unaligned(*fid);
                    std::ptr::addr_of_mut!((*entry).info).write_unaligned(*info);
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr(),
                        (buf as *mut u8).add(head),
                        data.len(),
                    );
                    if !event.is_null() {
                        *event = *ev;
                    }
                }
                n
            }
            Some(Event::User { event: ev, bytes }) => {
                if buf.is_null() || len < bytes.len() {
                    return Err(-(FI_ETOOSMALL as c_int));
                }
                // SAFETY: as above.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, bytes.len());
                    if !event.is_null() {
                        *event = *ev;
                    }
                }
                bytes.len()
            }
        };
        if flags & FI_PEEK == 0 {
            q.pop_front();
            self.taken(&q);
        }
        Ok(n as isize)
    }

    /// The wait fd, made (with its thread) on the first call.
    fn wait_fd(&self) -> Result<&WaitFd, c_int> {
        if let Some(w) = self.wait_fd.get() {
            return Ok(w);
        }
        // SAFETY: plain eventfd creation; the descriptor is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(-FI_EMFILE);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let w = WaitFd {
            // SAFETY: a fresh descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            stop: stop.clone(),
            thread: Mutex::new(None),
        };
        // Events queued before the fd existed count too.
        let q = lock(&self.events);
        if !q.is_empty() {
            w.signal();
        }
        let w = match self.wait_fd.set(w) {
            Ok(()) => self.wait_fd.get().ok_or(err::EOTHER)?,
            // Another thread made one first: ours closes.
            Err(_) => return self.wait_fd.get().ok_or(err::EOTHER),
        };
        drop(q);
        let at = self as *const Eq as usize;
        let thread = std::thread::Builder::new()
            .name("uvia-fi-eq".into())
            .spawn(move || {
                // SAFETY: close stops and joins this thread before it frees
                // the queue.
                let q = unsafe { &*(at as *const Eq) };
                while !stop.load(Ordering::Acquire) {
                    if lock(&q.listeners).is_empty() {
                        q.progress(Duration::ZERO);
                        std::thread::park_timeout(Duration::from_millis(5));
                    } else {
                        // Sleeps in the listeners' wait for a request.
                        q.progress(Duration::from_millis(10));
                    }
                }
            })
            .map_err(|_| err::ENOMEM)?;
        *lock(&w.thread) = Some(thread);
        Ok(w)
    }

    /// `fi_trywait` for this EQ: `Ok` when the program may sleep on its
    /// fd, `-FI_EAGAIN` when an event is queued (read it first).
    pub fn trywait(&self) -> Result<(), c_int> {
        if self.wait_fd.get().is_none() {
            return Err(err::EINVAL);
        }
        self.progress(Duration::ZERO);
        if lock(&self.events).is_empty() {
            Ok(())
        } else {
            Err(-FI_EAGAIN)
        }
    }
}

/// `fi_control` on an EQ: `FI_GETWAIT` hands out the fd to sleep on (an
/// eventfd, readable while events are queued), `FI_GETWAITOBJ` what kind
/// of wait object that is.
unsafe extern "C" fn control(p: *mut fid, command: c_int, arg: *mut c_void) -> c_int {
    guard::call("eq control", || {
        // SAFETY: libfabric passes the fid it was given.
        let q = unsafe { Eq::from_fid(p) }?;
        crate::cq::wait_control(q.wait_obj, command, arg, || Ok(q.wait_fd()?.fd.as_raw_fd()))
    })
}

unsafe extern "C" fn read(
    eq: *mut fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    flags: u64,
) -> isize {
    guard::call_ssize("eq_read", || {
        // SAFETY: libfabric calls through the fid it was given.
        let q = unsafe { Eq::from_fid(eq as *mut fid) }?;
        q.progress(Duration::ZERO);
        q.read_one(event, buf, len, flags)
    })
}

unsafe extern "C" fn sread(
    eq: *mut fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    timeout_ms: c_int,
    flags: u64,
) -> isize {
    guard::call_ssize("eq_sread", || {
        // SAFETY: as in read.
        let q = unsafe { Eq::from_fid(eq as *mut fid) }?;
        let deadline =
            (timeout_ms >= 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64));
        loop {
            q.progress(Duration::ZERO);
            match q.read_one(event, buf, len, flags) {
                Err(e) if e == -FI_EAGAIN => {}
                r => return r,
            }
            let slice = Duration::from_millis(10);
            let wait = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(-FI_EAGAIN);
                    }
                    (d - now).min(slice)
                }
                None => slice,
            };
            q.progress(wait);
        }
    })
}

unsafe extern "C" fn readerr(eq: *mut fid_eq, buf: *mut fi_eq_err_entry, flags: u64) -> isize {
    guard::call_ssize("eq_readerr", || {
        // SAFETY: as in read.
        let q = unsafe { Eq::from_fid(eq as *mut fid) }?;
        if buf.is_null() {
            return Err(err::EINVAL);
        }
        let mut events = lock(&q.events);
        let Some(Event::Error {
            fid,
            context,
            err,
            data,
        }) = events.front()
        else {
            return Err(-FI_EAGAIN);
        };
        // SAFETY: an EQ keeps its fabric open.
        let old = version_lt(unsafe { &*q.fabric }.fid.api_version, API_1_5);
        let mut e = fi_eq_err_entry {
            fid: *fid,
            context: *context,
            data: 0,
            err: *err,
            prov_errno: -*err,
            err_data: std::ptr::null_mut(),
            err_data_size: 0,
        };
        // What the caller offers for the data: read only from an entry of
        // 1.5 or later (an older one ends before `err_data_size`).
        // SAFETY: the caller's entry, of the interface's whole size.
        let offered = (!old).then(|| unsafe { ((*buf).err_data, (*buf).err_data_size) });
        if let Some((to, size)) = offered.filter(|(to, size)| *size > 0 && !to.is_null()) {
            // The caller's buffer: as much of the data as it holds.
            let n = data.len().min(size);
            // SAFETY: the caller's buffer holds `err_data_size` bytes.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), to as *mut u8, n) };
            e.err_data = to;
            e.err_data_size = n;
        } else if !data.is_empty() {
            // The error data stays readable until the next readerr, as
            // libfabric's own queues keep it.
            let mut keep = lock(&q.last_error);
            *keep = data.clone();
            e.err_data = keep.as_mut_ptr() as *mut c_void;
            e.err_data_size = keep.len();
        }
        if old {
            // The entry of 1.0, which ends before `err_data_size`.
            let n = std::mem::offset_of!(fi_eq_err_entry, err_data_size);
            // SAFETY: the caller's entry holds the 1.0 fields; `e` is ours.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    &e as *const fi_eq_err_entry as *const u8,
                    buf as *mut u8,
                    n,
                )
            };
        } else {
            // SAFETY: the caller's entry, of the interface's whole size.
            unsafe { buf.write(e) };
        }
        if flags & FI_PEEK == 0 {
            events.pop_front();
            q.taken(&events);
        }
        Ok(match old {
            true => std::mem::offset_of!(fi_eq_err_entry, err_data_size),
            false => std::mem::size_of::<fi_eq_err_entry>(),
        } as isize)
    })
}

unsafe extern "C" fn write(
    eq: *mut fid_eq,
    event: u32,
    buf: *const c_void,
    len: usize,
    _flags: u64,
) -> isize {
    guard::call_ssize("eq_write", || {
        // SAFETY: as in read; `buf` holds `len` bytes.
        let q = unsafe { Eq::from_fid(eq as *mut fid) }?;
        let bytes = match (buf.is_null(), len) {
            (_, 0) => Vec::new(),
            (true, _) => return Err(err::EINVAL),
            (false, _) => unsafe { std::slice::from_raw_parts(buf as *const u8, len) }.to_vec(),
        };
        q.push(Event::User { event, bytes });
        Ok(len as isize)
    })
}

/// `fi_eq_strerror`: libfabric's own text for the error number (an EQ
/// error's `prov_errno` is its libfabric error code).
pub unsafe extern "C" fn strerror(
    _eq: *mut fid_eq,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    // SAFETY: fi_strerror returns a static NUL-terminated string.
    let s = unsafe { std::ffi::CStr::from_ptr(fi_strerror(prov_errno.abs())) };
    // SAFETY: `buf` is NULL or holds `len` bytes.
    unsafe { copy_text(s, buf, len) }
}

/// Copies `s` into the caller's `buf` of `len` bytes (cut to fit, NUL
/// included) when one is given, and returns `s`, as the strerror calls do.
///
/// # Safety
/// `buf` is NULL or valid for writes of `len` bytes; `s` outlives the caller's use.
pub unsafe fn copy_text(s: &std::ffi::CStr, buf: *mut c_char, len: usize) -> *const c_char {
    if !buf.is_null() && len > 0 {
        let n = s.to_bytes().len().min(len - 1);
        // SAFETY: `buf` holds `len` bytes; the copy leaves room for the NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), buf, n);
            *buf.add(n) = 0;
        }
    }
    s.as_ptr()
}

unsafe extern "C" fn close(p: *mut fid) -> c_int {
    guard::call("eq close", || {
        // SAFETY: libfabric calls close through the fid it was given.
        let q = unsafe { Eq::from_fid(p) }?;
        if q.refs.load(Ordering::Acquire) != 0 {
            return Err(err::EBUSY);
        }
        if let Some(w) = q.wait_fd.get() {
            w.stop();
        }
        // SAFETY: the box made in `open`; nothing refers to it any more
        // (its thread has ended).
        let q = unsafe { Box::from_raw(q as *const Eq as *mut Eq) };
        // SAFETY: an EQ keeps its fabric open.
        unsafe { &*q.fabric }.refs.fetch_sub(1, Ordering::AcqRel);
        for e in lock(&q.events).drain(..) {
            if let Event::Cm { info, .. } = e {
                // SAFETY: an unread request's info is still ours to free.
                unsafe { fi_freeinfo(info) };
            }
        }
        Ok(())
    })
}
