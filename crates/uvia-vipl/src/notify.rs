//! The library thread: notify handlers and the error handler run here, never
//! inside a program's own call, as the specification asks.
//!
//! A notify request waits in a list until its queue (or CQ) has a
//! completion; the thread takes the completion and calls the handler once.
//! While requests wait, the thread polls them, napping briefly between
//! rounds; with none it sleeps on a condition variable. Asynchronous errors
//! are queued by the calls that find them and delivered here too.

use crate::handle::{self, lock, CqH, ErrorCallback, NicH, ViH};
use crate::types::{async_error, CqNotifyHandler, ErrorDescriptor, ViNotifyHandler};
use crate::unwind;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;
use uvia::{Cq, Descriptor, Queue, Vi};

/// How long the thread naps between polling rounds while requests wait.
const NAP: Duration = Duration::from_micros(50);
/// How long the thread pauses after a panic in a round (the line on stderr
/// says what it was).
const AFTER_PANIC: Duration = Duration::from_millis(100);
/// How often the thread looks for VIs that lost their connection (while a
/// program's error handler is registered) and drives the VIs of providers
/// that need it.
const TICK: Duration = Duration::from_millis(1);

enum Request {
    Vi {
        vi: Vi,
        queue: Queue,
        nic_handle: usize,
        vi_handle: usize,
        context: usize,
        handler: ViNotifyHandler,
    },
    Cq {
        cq: Cq,
        nic: Arc<NicH>,
        cq_handle: usize,
        context: usize,
        handler: CqNotifyHandler,
    },
}

/// An error waiting to be delivered.
pub struct AsyncError {
    pub nic: Arc<NicH>,
    pub vi_handle: usize,
    pub descriptor: usize,
    pub op_code: u64,
    pub resource: i32,
    pub code: i32,
}

#[derive(Default)]
struct Work {
    requests: Vec<Request>,
    errors: VecDeque<AsyncError>,
    /// NICs whose program registered an error handler: their VIs are watched.
    watched: Vec<Arc<NicH>>,
    /// NICs whose provider needs driving: their VIs are driven every tick,
    /// as a NIC's processor would, so that acknowledgements, deferred sends and keep-alives go
    /// out while the program makes no call (VIA's NIC does not wait for one).
    driven: Vec<Arc<NicH>>,
}

struct Notifier {
    work: Mutex<Work>,
    wake: Condvar,
}

fn notifier() -> &'static Notifier {
    static N: OnceLock<Notifier> = OnceLock::new();
    N.get_or_init(|| {
        let n = Notifier {
            work: Mutex::new(Work::default()),
            wake: Condvar::new(),
        };
        // The thread lives as long as the process; it holds no resource
        // when it has nothing to do.
        std::thread::Builder::new()
            .name("vipl-notify".into())
            .spawn(run)
            .map(drop)
            .unwrap_or_else(|e| eprintln!("vipl: cannot start the notify thread: {e}"));
        n
    })
}

/// Asks for `handler` to be called with the next completion of `queue`.
pub fn vi_request(
    v: &ViH,
    vi_handle: *mut c_void,
    queue: Queue,
    context: usize,
    handler: ViNotifyHandler,
) {
    let n = notifier();
    lock(&n.work).requests.push(Request::Vi {
        vi: v.vi.clone(),
        queue,
        nic_handle: v.nic.handle,
        vi_handle: vi_handle as usize,
        context,
        handler,
    });
    n.wake.notify_one();
}

/// Asks for `handler` to be called with the next notice of a CQ.
pub fn cq_request(c: &CqH, cq_handle: *mut c_void, context: usize, handler: CqNotifyHandler) {
    let n = notifier();
    lock(&n.work).requests.push(Request::Cq {
        cq: c.cq.clone(),
        nic: c.nic.clone(),
        cq_handle: cq_handle as usize,
        context,
        handler,
    });
    n.wake.notify_one();
}

/// Drops the requests that name a VI or CQ handle about to be destroyed.
pub fn forget(handle: *mut c_void) {
    let h = handle as usize;
    lock(&notifier().work).requests.retain(|r| match r {
        Request::Vi { vi_handle, .. } => *vi_handle != h,
        Request::Cq { cq_handle, .. } => *cq_handle != h,
    });
}

/// Queues an error for the NIC's handler.
pub fn report(e: AsyncError) {
    let n = notifier();
    lock(&n.work).errors.push_back(e);
    n.wake.notify_one();
}

/// Starts or stops watching a NIC's VIs for lost connections.
pub fn watch(nic: Arc<NicH>, on: bool) {
    let n = notifier();
    let mut w = lock(&n.work);
    w.watched.retain(|x| !Arc::ptr_eq(x, &nic));
    if on {
        w.watched.push(nic);
    }
    n.wake.notify_one();
}

/// Starts or stops driving a NIC's VIs between the program's calls.
pub fn drive(nic: Arc<NicH>, on: bool) {
    let n = notifier();
    let mut w = lock(&n.work);
    w.driven.retain(|x| !Arc::ptr_eq(x, &nic));
    if on {
        w.driven.push(nic);
    }
    n.wake.notify_one();
}

/// Reports a VI's lost connection once (until it connects again).
pub fn conn_lost(v: &ViH, vi_handle: *mut c_void) {
    if let Some(e) = lost(v, vi_handle as usize) {
        report(e);
    }
}

/// The error to report if a VI has lost its connection and it has not been
/// reported since it connected.
fn lost(v: &ViH, vi_handle: usize) -> Option<AsyncError> {
    let unreported = v.vi.state() == uvia::ViState::Error
        && !v
            .error_reported
            .swap(true, std::sync::atomic::Ordering::AcqRel);
    unreported.then(|| AsyncError {
        nic: v.nic.clone(),
        vi_handle,
        descriptor: 0,
        op_code: 0,
        resource: async_error::RESOURCE_VI,
        code: async_error::CONN_LOST,
    })
}

/// What one polling round found to call.
enum Call {
    Vi(ViNotifyHandler, usize, usize, usize, *mut Descriptor),
    Cq(CqNotifyHandler, usize, usize, usize, bool),
    Error(Option<ErrorCallback>, AsyncError),
}

fn run() {
    let n = notifier();
    loop {
        if unwind::catch("vipl-notify", || round(n)).is_none() {
            // A bug that repeats would otherwise write a line every round.
            std::thread::sleep(AFTER_PANIC);
        }
    }
}

/// One round: waits for work, polls the requests, watches and drives the
/// VIs, then calls the handlers found.
fn round(n: &Notifier) {
    let mut calls = Vec::new();
    let (busy, watching) = {
        let mut w = lock(&n.work);
        while w.requests.is_empty()
            && w.errors.is_empty()
            && w.watched.is_empty()
            && w.driven.is_empty()
        {
            w = n.wake.wait(w).unwrap_or_else(|e| e.into_inner());
        }
        let mut i = 0;
        while i < w.requests.len() {
            if let Some(c) = poll(&w.requests[i]) {
                calls.push(c);
                w.requests.swap_remove(i);
            } else {
                i += 1;
            }
        }
        // Queued here, not by `report`: the work is locked.
        let mut lost_vis = Vec::new();
        for nic in &w.watched {
            for &h in lock(&nic.vis).values() {
                // SAFETY: the table is locked while its VIs are used, and
                // VipDestroyVi takes a VI out of it before destroying it.
                if let Some(v) = unsafe { handle::get::<ViH>(h as *const c_void) } {
                    lost_vis.extend(lost(v, h));
                }
            }
        }
        w.errors.extend(lost_vis);
        for nic in &w.driven {
            for &h in lock(&nic.vis).values() {
                // SAFETY: as above.
                if let Some(v) = unsafe { handle::get::<ViH>(h as *const c_void) } {
                    v.vi.try_drive();
                }
            }
        }
        while let Some(e) = w.errors.pop_front() {
            let cb = *lock(&e.nic.on_error);
            calls.push(Call::Error(cb, e));
        }
        (
            !w.requests.is_empty(),
            !w.watched.is_empty() || !w.driven.is_empty(),
        )
    };
    for c in calls {
        deliver(c);
    }
    if busy {
        std::thread::sleep(NAP);
    } else if watching {
        let w = lock(&n.work);
        let _ = n.wake.wait_timeout(w, TICK);
    }
}

fn poll(r: &Request) -> Option<Call> {
    match r {
        Request::Vi {
            vi,
            queue,
            nic_handle,
            vi_handle,
            context,
            handler,
        } => {
            let d = match queue {
                Queue::Send => vi.send_done_raw(),
                Queue::Recv => vi.recv_done_raw(),
            }?;
            Some(Call::Vi(
                *handler,
                *context,
                *nic_handle,
                *vi_handle,
                d.as_ptr(),
            ))
        }
        Request::Cq {
            cq,
            nic,
            cq_handle: _,
            context,
            handler,
        } => {
            let c = cq.done().ok().flatten()?;
            let vi = lock(&nic.vis).get(&c.vi.id()).copied().unwrap_or(0);
            Some(Call::Cq(
                *handler,
                *context,
                nic.handle,
                vi,
                c.queue == Queue::Recv,
            ))
        }
    }
}

fn deliver(c: Call) {
    match c {
        Call::Vi(Some(f), ctx, nic, vi, d) => {
            // SAFETY: the program gave this handler for these arguments.
            unsafe { f(ctx as *mut c_void, nic as *mut c_void, vi as *mut c_void, d) }
        }
        Call::Cq(Some(f), ctx, nic, vi, recv) => {
            // SAFETY: as above.
            unsafe {
                f(
                    ctx as *mut c_void,
                    nic as *mut c_void,
                    vi as *mut c_void,
                    recv as i32,
                )
            }
        }
        Call::Error(cb, e) => {
            let mut d = ErrorDescriptor {
                nic_handle: e.nic.handle as *mut c_void,
                vi_handle: e.vi_handle as *mut c_void,
                cq_handle: std::ptr::null_mut(),
                descriptor_ptr: e.descriptor as *mut Descriptor,
                op_code: e.op_code as _,
                resource_code: e.resource,
                error_code: e.code,
            };
            match cb {
                Some(ErrorCallback {
                    handler: Some(f),
                    context,
                }) => {
                    // SAFETY: the program registered this handler.
                    unsafe { f(context as *mut c_void, &mut d) }
                }
                _ => {
                    // One write per line, so that lines of several
                    // processes sharing stderr do not interleave.
                    let line = format!(
                        "vipl: asynchronous error on {} (VI handle {:#x}): {}\n",
                        e.nic.nic.attributes().name,
                        e.vi_handle,
                        match e.code {
                            async_error::CONN_LOST => "connection lost",
                            _ => "descriptor refused at post",
                        }
                    );
                    let _ =
                        std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
                }
            }
        }
        Call::Vi(None, ..) | Call::Cq(None, ..) => {}
    }
}
