//! The objects behind the C API's handles, and the table that names them.
//!
//! A handle is not a pointer: it holds a slot's index (bits 0..32), the kind
//! of object (bits 32..40, never 0, so a handle is never NULL) and the
//! slot's generation (bits 40..64). A call looks its handle up in the table:
//! a handle of another kind (a CQ passed as a VI), a destroyed one (its
//! slot's generation has moved on) or one this library never gave out is an
//! invalid parameter, found without reading anything the handle points at.
//!
//! A lookup is two loads and no atomic read-modify-write: a call does not
//! count itself on the object. Counting would let an object outlive a
//! destroy that races with a call using it, but it cost two locked
//! instructions per call, 30 to 40 ns on the test machine against 13 ns for
//! a whole empty VipRecvDone; VIA leaves destroying a handle while another
//! call uses it undefined, and so does this library (docs/VIPL.md).

use crate::address::{Form, HostBytes};
use crate::names::HostEntry;
use crate::types::ErrorHandler;
use std::any::{Any, TypeId};
use std::cell::UnsafeCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use uvia::{ConnRequest, ConnectError, Cq, Nic, Ptag, RemoteViAttributes, Vi};

// A handle carries 64 bits in a `void *`.
const _: () = assert!(usize::BITS == 64);

/// Locks a mutex, carrying on after a panic elsewhere (the data it guards
/// stays consistent: every critical section here is a single update).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// ---- The table ----

/// What kind of object a handle names: its number in the handle's kind bits.
pub trait Kind: Any + Send + Sync {
    const KIND: u8;
}

/// Slots per chunk; chunks are made as the table grows and never freed.
const CHUNK: usize = 1024;
/// Chunks at most: 4 Mi live handles.
const CHUNKS: usize = 4096;
/// Freed slots wait in line until this many are free before one is used
/// again, so that a program making and destroying one VI at a time does not
/// get the same slot every time (a stale handle is caught as long as its
/// slot's 24-bit generation has not come round again).
const REUSE_AFTER: usize = 64;

/// One slot: the tag of the handle it names (generation and kind, the
/// handle's high 32 bits; kind 0 while it names none) and that handle's
/// object. `object` is written only with the free line locked, while the
/// tag names no handle; it is read only by a call whose handle matches the
/// tag.
struct Slot {
    tag: AtomicU32,
    object: UnsafeCell<Object>,
}

/// A slot's object: its type and address, for calls (no virtual call on
/// the data path), and the reference that keeps it.
struct Object {
    type_id: TypeId,
    ptr: *const (),
    owner: Option<Arc<dyn Any + Send + Sync>>,
}

// SAFETY: `object` is written only under the free line's lock while no
// handle names the slot, and read only through a handle the tag names
// (see `Slot`); the objects are Send + Sync, `ptr` points into `owner`.
unsafe impl Sync for Slot {}

impl Slot {
    fn new() -> Slot {
        Slot {
            tag: AtomicU32::new(0),
            object: UnsafeCell::new(Object {
                type_id: TypeId::of::<()>(),
                ptr: std::ptr::null(),
                owner: None,
            }),
        }
    }
}

/// Slot indices: freed ones in line, then the never used.
struct Free {
    line: VecDeque<u32>,
    fresh: u32,
}

struct Table {
    /// The first slot of each chunk made (`CHUNK` slots, never freed).
    chunks: [AtomicPtr<Slot>; CHUNKS],
    free: Mutex<Free>,
}

static TABLE: Table = Table {
    chunks: [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS],
    free: Mutex::new(Free {
        line: VecDeque::new(),
        fresh: 0,
    }),
};

/// The slot of an index, if its chunk has been made.
fn slot(index: u32) -> Option<&'static Slot> {
    let i = index as usize;
    // Acquire: pairs with the chunk's publication in `insert`.
    let first = TABLE.chunks.get(i / CHUNK)?.load(Ordering::Acquire);
    if first.is_null() {
        return None;
    }
    // SAFETY: a chunk is `CHUNK` initialised slots that are never freed.
    Some(unsafe { &*first.add(i % CHUNK) })
}

/// The slot a handle of kind `T` names, and the handle's tag, if its kind
/// bits are `T`'s and its slot exists.
fn slot_of<T: Kind>(h: *const c_void) -> Option<(u32, u32, &'static Slot)> {
    let handle = h as usize as u64;
    let (index, tag) = (handle as u32, (handle >> 32) as u32);
    if tag as u8 != T::KIND {
        return None;
    }
    Some((index, tag, slot(index)?))
}

/// Puts an object in the table; `make` is given the handle that will name
/// it. The handle and the object, or `None` when the table is full.
pub fn insert<T: Kind>(make: impl FnOnce(usize) -> T) -> Option<(*mut c_void, Arc<T>)> {
    let mut free = lock(&TABLE.free);
    let index = if free.line.len() >= REUSE_AFTER || free.fresh as usize >= CHUNK * CHUNKS {
        free.line.pop_front()?
    } else {
        free.fresh += 1;
        free.fresh - 1
    };
    let chunk = &TABLE.chunks[index as usize / CHUNK];
    if chunk.load(Ordering::Relaxed).is_null() {
        let slots: Box<[Slot]> = (0..CHUNK).map(|_| Slot::new()).collect();
        // Release: a call that finds the chunk finds its slots made.
        chunk.store(Box::leak(slots).as_mut_ptr(), Ordering::Release);
    }
    let slot = slot(index)?;
    // A free slot's tag is kind 0 and the generation to use next.
    let tag = slot.tag.load(Ordering::Relaxed) | T::KIND as u32;
    let handle = ((tag as u64) << 32) | index as u64;
    let object = Arc::new(make(handle as usize));
    let owner: Arc<dyn Any + Send + Sync> = object.clone();
    // SAFETY: the free line is locked and the slot names no handle.
    unsafe {
        *slot.object.get() = Object {
            type_id: TypeId::of::<T>(),
            ptr: Arc::as_ptr(&object) as *const (),
            owner: Some(owner),
        }
    };
    // Release: a call that finds the tag finds the object.
    slot.tag.store(tag, Ordering::Release);
    Some((handle as usize as *mut c_void, object))
}

/// The object behind a handle of kind `T`, or `None` if the handle names no
/// live object of that kind.
///
/// # Safety
/// The handle is not removed while the reference is used: a program does
/// not destroy a handle while another of its calls uses it.
pub unsafe fn get<'a, T: Kind>(h: *const c_void) -> Option<&'a T> {
    let (_, tag, slot) = slot_of::<T>(h)?;
    // Acquire: pairs with `insert`'s publication of the object.
    if slot.tag.load(Ordering::Acquire) != tag {
        return None;
    }
    // SAFETY: the tag names this handle, so the slot holds its object, which
    // stays there while the reference is used (the caller's contract).
    let object = unsafe { &*slot.object.get() };
    // The kind bits name the type, so this holds whenever the tag matched.
    if object.type_id != TypeId::of::<T>() {
        return None;
    }
    // SAFETY: `ptr` is the address of the `T` that `owner` keeps.
    Some(unsafe { &*(object.ptr as *const T) })
}

/// A counted reference to the object behind a live handle of kind `T`, to
/// outlive the handle.
///
/// # Safety
/// As for [`get`].
pub unsafe fn arc<T: Kind>(h: *const c_void) -> Option<Arc<T>> {
    let (_, tag, slot) = slot_of::<T>(h)?;
    if slot.tag.load(Ordering::Acquire) != tag {
        return None;
    }
    // SAFETY: as in `get`.
    let owner = unsafe { (*slot.object.get()).owner.clone() }?;
    owner.downcast::<T>().ok()
}

/// Takes a live handle of kind `T` out of the table: later calls with it
/// fail. Its object, to be dropped by the caller, or `None` if the handle
/// names no live object of that kind (two removals of one handle give it
/// once).
///
/// # Safety
/// No reference [`get`] gave for this handle is used any more.
pub unsafe fn remove<T: Kind>(h: *const c_void) -> Option<Arc<T>> {
    let (index, tag, slot) = slot_of::<T>(h)?;
    let mut free = lock(&TABLE.free);
    if slot.tag.load(Ordering::Relaxed) != tag {
        return None;
    }
    // Kind 0 and the next generation: no handle given so far names the slot.
    slot.tag
        .store(((tag >> 8).wrapping_add(1)) << 8, Ordering::Release);
    // SAFETY: the free line is locked, the slot now names no handle, and no
    // reference to its object is used (the caller's contract).
    let owner = unsafe {
        let o = &mut *slot.object.get();
        o.ptr = std::ptr::null();
        o.owner.take()
    };
    free.line.push_back(index);
    drop(free);
    owner?.downcast::<T>().ok()
}

// ---- The objects ----

/// A user's error handler and its context.
#[derive(Clone, Copy)]
pub struct ErrorCallback {
    pub handler: ErrorHandler,
    pub context: usize,
}

/// An opened NIC (`VIP_NIC_HANDLE`). Shared with the VIs, CQs and tags made
/// on it, so they keep working after `VipCloseNic` until they are destroyed.
pub struct NicH {
    /// Its handle, to name it in notices.
    pub handle: usize,
    pub nic: Nic,
    /// The name `VipOpenNic` was given: a device or a provider name.
    pub name: String,
    /// The NIC's host address as `VIP_NET_ADDRESS` carries it.
    pub address: HostBytes,
    /// How its provider writes host addresses.
    pub form: Form,
    /// VI id to VI handle, to name VIs in CQ notices.
    pub vis: Mutex<HashMap<u32, usize>>,
    /// Raw tag to tag handle, to name tags in queries.
    pub ptags: Mutex<HashMap<u32, usize>>,
    /// The name service's table, once read.
    pub hosts: Mutex<Option<Vec<HostEntry>>>,
    pub on_error: Mutex<Option<ErrorCallback>>,
}

impl NicH {
    pub fn new(handle: usize, nic: Nic, name: String, address: HostBytes) -> NicH {
        NicH {
            handle,
            name,
            form: Form::of(nic.attributes()),
            nic,
            address,
            vis: Mutex::new(HashMap::new()),
            ptags: Mutex::new(HashMap::new()),
            hosts: Mutex::new(None),
            on_error: Mutex::new(None),
        }
    }

    /// The provider's short name, to pick its entries in the hosts file.
    pub fn provider(&self) -> &'static str {
        self.nic.attributes().provider
    }

    /// The C handle of a tag of this NIC.
    pub fn ptag_handle(&self, p: Ptag) -> *mut c_void {
        lock(&self.ptags)
            .get(&p.raw())
            .map_or(std::ptr::null_mut(), |&h| h as *mut c_void)
    }
}

/// A protection tag (`VIP_PROTECTION_HANDLE`).
pub struct PtagH {
    pub ptag: Ptag,
    pub nic: Arc<NicH>,
}

/// A peer-to-peer connection being made in the background; the thread
/// gives `None` if it panicked (it said so on stderr).
pub enum PeerConnect {
    None,
    Pending(JoinHandle<Option<Result<RemoteViAttributes, ConnectError>>>),
}

/// A VI (`VIP_VI_HANDLE`).
pub struct ViH {
    pub vi: Vi,
    pub nic: Arc<NicH>,
    /// The tag handle its attributes name.
    pub ptag: Mutex<usize>,
    pub peer: Mutex<PeerConnect>,
    /// The loss of its connection has been reported to the error handler.
    pub error_reported: AtomicBool,
}

/// A completion queue (`VIP_CQ_HANDLE`).
pub struct CqH {
    pub cq: Cq,
    pub nic: Arc<NicH>,
}

/// A connection request a server has not answered (`VIP_CONN_HANDLE`).
pub struct ConnH {
    pub req: Mutex<ConnRequest>,
    pub nic: Arc<NicH>,
}

impl Kind for NicH {
    const KIND: u8 = 1;
}
impl Kind for PtagH {
    const KIND: u8 = 2;
}
impl Kind for ViH {
    const KIND: u8 = 3;
}
impl Kind for CqH {
    const KIND: u8 = 4;
}
impl Kind for ConnH {
    const KIND: u8 = 5;
}

impl ViH {
    pub fn new(vi: Vi, nic: Arc<NicH>, ptag: usize) -> ViH {
        ViH {
            vi,
            nic,
            ptag: Mutex::new(ptag),
            peer: Mutex::new(PeerConnect::None),
            error_reported: AtomicBool::new(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A test object that counts its drops.
    struct Probe(Arc<AtomicUsize>);
    impl Kind for Probe {
        const KIND: u8 = 0x7e;
    }
    impl Drop for Probe {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    /// Another kind, to be confused with it; it keeps its handle.
    struct Other(usize);
    impl Kind for Other {
        const KIND: u8 = 0x7f;
    }

    fn probe() -> (*mut c_void, Arc<AtomicUsize>) {
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        (insert(move |_| Probe(d)).unwrap().0, drops)
    }

    // SAFETY (every test): no test removes a handle while it uses it.

    #[test]
    fn handles_are_not_null_and_name_their_object() {
        let (h, _) = probe();
        assert!(!h.is_null());
        assert_eq!((h as usize >> 32) as u8, Probe::KIND);
        // The object is told its own handle.
        let (o, other) = insert(Other).unwrap();
        assert_eq!(other.0, o as usize);
        assert!(std::ptr::eq(unsafe { get::<Other>(o) }.unwrap(), &*other));
        assert!(unsafe { remove::<Other>(o) }.is_some());
        assert!(unsafe { remove::<Probe>(h) }.is_some());
    }

    #[test]
    fn a_destroyed_handle_is_refused() {
        let (h, drops) = probe();
        assert!(unsafe { get::<Probe>(h) }.is_some());
        drop(unsafe { remove::<Probe>(h) });
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert!(unsafe { get::<Probe>(h) }.is_none());
        // Its slot names new objects later; the stale handle still fails.
        let fresh: Vec<_> = (0..4 * REUSE_AFTER).map(|_| probe()).collect();
        assert!(unsafe { get::<Probe>(h) }.is_none());
        assert!(unsafe { arc::<Probe>(h) }.is_none());
        for (f, _) in fresh {
            assert!(unsafe { remove::<Probe>(f) }.is_some());
        }
    }

    #[test]
    fn a_handle_of_another_kind_is_refused() {
        let (h, drops) = probe();
        let (other, _) = insert(Other).unwrap();
        assert!(unsafe { get::<Other>(h) }.is_none());
        assert!(unsafe { get::<Probe>(other) }.is_none());
        assert!(unsafe { remove::<Other>(h) }.is_none());
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        assert!(unsafe { remove::<Other>(other) }.is_some());
        assert!(unsafe { remove::<Probe>(h) }.is_some());
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn destroying_twice_fails_the_second_time() {
        let (h, drops) = probe();
        assert!(unsafe { remove::<Probe>(h) }.is_some());
        assert!(unsafe { remove::<Probe>(h) }.is_none());
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn values_that_were_never_handles_are_refused() {
        let (h, _) = probe();
        let beyond = (h as usize & !0xffff_ffff) | 0xffff_fff0;
        for v in [0usize, 1, 64, 0x7f00_dead_beef, usize::MAX, beyond] {
            assert!(
                unsafe { get::<Probe>(v as *const c_void) }.is_none(),
                "{v:#x}"
            );
        }
        // A pointer to memory of the program's that looks like anything.
        let bytes = [0x7eu8; 64];
        assert!(unsafe { get::<Probe>(bytes.as_ptr() as *const c_void) }.is_none());
        assert!(unsafe { remove::<Probe>(h) }.is_some());
    }

    #[test]
    fn an_object_outlives_its_handle_while_counted() {
        let (h, drops) = probe();
        let kept = unsafe { arc::<Probe>(h) }.unwrap();
        drop(unsafe { remove::<Probe>(h) });
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        drop(kept);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn threads_racing_to_destroy_get_the_object_once() {
        for _ in 0..100 {
            let (h, drops) = probe();
            let h = h as usize;
            let wins: usize = std::thread::scope(|s| {
                let t: Vec<_> = (0..4)
                    .map(|_| {
                        s.spawn(move || {
                            unsafe { remove::<Probe>(h as *const c_void) }.is_some() as usize
                        })
                    })
                    .collect();
                t.into_iter().map(|t| t.join().unwrap()).sum()
            });
            assert_eq!(wins, 1);
            assert_eq!(drops.load(Ordering::SeqCst), 1);
        }
    }
}
