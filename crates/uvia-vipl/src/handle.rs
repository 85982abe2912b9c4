//! The objects behind the C API's handles.
//!
//! Every handle is a pointer to one of these structures, whose first field
//! is a magic number naming its kind. A call checks it before anything else,
//! so a NULL handle or a handle of the wrong kind (a CQ passed as a VI) is an
//! invalid parameter instead of memory misread. Destroying an object clears
//! its magic before freeing it.

use crate::names::HostEntry;
use crate::types::{ErrorHandler, HOST_ADDRESS_LEN};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use uvia::{ConnRequest, ConnectError, Cq, Nic, Ptag, RemoteViAttributes, Vi};

pub const NIC_MAGIC: u32 = 0x7669_4e49; // "viNI"
pub const VI_MAGIC: u32 = 0x7669_5649; // "viVI"
pub const CQ_MAGIC: u32 = 0x7669_4351; // "viCQ"
pub const PTAG_MAGIC: u32 = 0x7669_5054; // "viPT"
pub const CONN_MAGIC: u32 = 0x7669_434e; // "viCN"

/// Locks a mutex, carrying on after a panic elsewhere (the data it guards
/// stays consistent: every critical section here is a single update).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A user's error handler and its context.
#[derive(Clone, Copy)]
pub struct ErrorCallback {
    pub handler: ErrorHandler,
    pub context: usize,
}

/// An opened NIC (`VIP_NIC_HANDLE`). Shared with the VIs, CQs and tags made
/// on it, so they keep working after `VipCloseNic` until they are destroyed.
#[repr(C)]
pub struct NicH {
    magic: AtomicU32,
    pub nic: Nic,
    /// The NIC's host address as `VIP_NET_ADDRESS` carries it.
    pub address: [u8; HOST_ADDRESS_LEN],
    /// VI id to VI handle, to name VIs in CQ notices.
    pub vis: Mutex<HashMap<u32, usize>>,
    /// Raw tag to tag handle, to name tags in queries.
    pub ptags: Mutex<HashMap<u32, usize>>,
    /// The name service's table, once read.
    pub hosts: Mutex<Option<Vec<HostEntry>>>,
    pub on_error: Mutex<Option<ErrorCallback>>,
}

impl NicH {
    pub fn new(nic: Nic, address: [u8; HOST_ADDRESS_LEN]) -> NicH {
        NicH {
            magic: AtomicU32::new(NIC_MAGIC),
            nic,
            address,
            vis: Mutex::new(HashMap::new()),
            ptags: Mutex::new(HashMap::new()),
            hosts: Mutex::new(None),
            on_error: Mutex::new(None),
        }
    }

    /// The provider's short name (`shm`, `udp`, `xdp`).
    pub fn provider(&self) -> &'static str {
        self.nic.attributes().provider
    }

    pub fn close(&self) {
        self.magic.store(0, Ordering::Release);
    }

    /// The C handle of a tag of this NIC.
    pub fn ptag_handle(&self, p: Ptag) -> *mut c_void {
        lock(&self.ptags)
            .get(&p.raw())
            .map_or(std::ptr::null_mut(), |&h| h as *mut c_void)
    }
}

/// A protection tag (`VIP_PROTECTION_HANDLE`).
#[repr(C)]
pub struct PtagH {
    magic: AtomicU32,
    pub ptag: Ptag,
    pub nic: Arc<NicH>,
}

/// A peer-to-peer connection being made in the background.
pub enum PeerConnect {
    None,
    Pending(JoinHandle<Result<RemoteViAttributes, ConnectError>>),
}

/// A VI (`VIP_VI_HANDLE`).
#[repr(C)]
pub struct ViH {
    magic: AtomicU32,
    pub vi: Vi,
    pub nic: Arc<NicH>,
    /// The tag handle its attributes name.
    pub ptag: Mutex<usize>,
    pub peer: Mutex<PeerConnect>,
    /// The loss of its connection has been reported to the error handler.
    pub error_reported: AtomicBool,
}

/// A completion queue (`VIP_CQ_HANDLE`).
#[repr(C)]
pub struct CqH {
    magic: AtomicU32,
    pub cq: Cq,
    pub nic: Arc<NicH>,
}

/// A connection request a server has not answered (`VIP_CONN_HANDLE`).
#[repr(C)]
pub struct ConnH {
    magic: AtomicU32,
    pub req: Mutex<ConnRequest>,
    pub nic: Arc<NicH>,
}

macro_rules! handle_kind {
    ($t:ident, $magic:ident) => {
        impl $t {
            /// The object behind a handle, if the handle names one of this kind.
            ///
            /// # Safety
            /// `h` is NULL or a pointer a program received from this library
            /// (possibly of another kind) whose object has not been freed.
            pub unsafe fn from_handle<'a>(h: *const c_void) -> Option<&'a $t> {
                if h.is_null() || (h as usize) % std::mem::align_of::<$t>() != 0 {
                    return None;
                }
                // SAFETY: every handle kind starts with an AtomicU32 magic
                // (repr(C)), so reading it through any handle is in bounds.
                let magic = unsafe { &*(h as *const AtomicU32) };
                if magic.load(Ordering::Acquire) != $magic {
                    return None;
                }
                // SAFETY: the magic says `h` points at a live `$t`.
                Some(unsafe { &*(h as *const $t) })
            }

            /// Frees the object behind a handle made by `into_handle`.
            ///
            /// # Safety
            /// `h` came from `into_handle` and is not used again.
            pub unsafe fn free(h: *const c_void) {
                // SAFETY: per the contract, `h` is a live box of `$t`.
                let b = unsafe { Box::from_raw(h as *mut $t) };
                b.magic.store(0, Ordering::Release);
                drop(b);
            }

            pub fn into_handle(self) -> *mut c_void {
                Box::into_raw(Box::new(self)) as *mut c_void
            }
        }
    };
}

handle_kind!(PtagH, PTAG_MAGIC);
handle_kind!(ViH, VI_MAGIC);
handle_kind!(CqH, CQ_MAGIC);
handle_kind!(ConnH, CONN_MAGIC);

impl PtagH {
    pub fn new(ptag: Ptag, nic: Arc<NicH>) -> PtagH {
        PtagH {
            magic: AtomicU32::new(PTAG_MAGIC),
            ptag,
            nic,
        }
    }
}

impl ViH {
    pub fn new(vi: Vi, nic: Arc<NicH>, ptag: usize) -> ViH {
        ViH {
            magic: AtomicU32::new(VI_MAGIC),
            vi,
            nic,
            ptag: Mutex::new(ptag),
            peer: Mutex::new(PeerConnect::None),
            error_reported: AtomicBool::new(false),
        }
    }
}

impl CqH {
    pub fn new(cq: Cq, nic: Arc<NicH>) -> CqH {
        CqH {
            magic: AtomicU32::new(CQ_MAGIC),
            cq,
            nic,
        }
    }
}

impl ConnH {
    pub fn new(req: ConnRequest, nic: Arc<NicH>) -> ConnH {
        ConnH {
            magic: AtomicU32::new(CONN_MAGIC),
            req: Mutex::new(req),
            nic,
        }
    }
}

/// NIC handles are `Arc`s, so VIs and CQs can share them.
impl NicH {
    /// # Safety
    /// As for the other kinds' `from_handle`.
    pub unsafe fn from_handle<'a>(h: *const c_void) -> Option<&'a NicH> {
        if h.is_null() || (h as usize) % std::mem::align_of::<NicH>() != 0 {
            return None;
        }
        // SAFETY: as in `handle_kind!`.
        let magic = unsafe { &*(h as *const AtomicU32) };
        if magic.load(Ordering::Acquire) != NIC_MAGIC {
            return None;
        }
        // SAFETY: the magic says `h` points at a live `NicH` inside an Arc.
        Some(unsafe { &*(h as *const NicH) })
    }

    /// A new counted reference to the NIC behind a checked handle.
    ///
    /// # Safety
    /// `h` passed `from_handle`.
    pub unsafe fn arc(h: *const c_void) -> Arc<NicH> {
        // SAFETY: `h` came from `Arc::into_raw` and its count is at least one.
        unsafe {
            Arc::increment_strong_count(h as *const NicH);
            Arc::from_raw(h as *const NicH)
        }
    }
}
