//! The address vector of reliable-datagram endpoints: the names of peer
//! endpoints, each given an `fi_addr_t` that is its index (for `FI_AV_MAP`
//! as for `FI_AV_TABLE`: an opaque value either way), with the reverse map
//! a received message's source is found by.

use super::link::{Name, NAME_LEN};
use crate::domain::Domain;
use crate::guard;
use crate::nosys;
use crate::sys::*;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLock;

/// fabric.h's `FI_ADDR_NOTAVAIL`.
pub const FI_ADDR_NOTAVAIL: fi_addr_t = fi_addr_t::MAX;
/// fabric.h's `FI_ADDR_UNSPEC` (the same value).
pub const FI_ADDR_UNSPEC: fi_addr_t = fi_addr_t::MAX;

/// Most entries an AV holds.
const MAX_ENTRIES: usize = 1 << 24;

#[derive(Default)]
struct Table {
    /// By index; `None` where an entry was removed.
    names: Vec<Option<Name>>,
    by_name: HashMap<Name, fi_addr_t>,
}

/// An AV. `#[repr(C)]` with libfabric's `fid_av` first.
#[repr(C)]
pub struct Av {
    pub fid: fid_av,
    domain: *const Domain,
    table: RwLock<Table>,
    /// Endpoints bound to it; it closes only at zero.
    pub refs: AtomicUsize,
}

// SAFETY: the domain pointer is only read; the table is behind its lock.
unsafe impl Sync for Av {}
unsafe impl Send for Av {}

static FI_OPS: fi_ops = fi_ops {
    size: std::mem::size_of::<fi_ops>(),
    close: Some(close),
    bind: Some(nosys::bind),
    control: Some(nosys::control),
    ops_open: Some(nosys::ops_open),
    tostr: Some(nosys::tostr),
    ops_set: Some(nosys::ops_set),
};

static OPS: fi_ops_av = fi_ops_av {
    size: std::mem::size_of::<fi_ops_av>(),
    insert: Some(insert),
    insertsvc: Some(insertsvc),
    insertsym: Some(insertsym),
    remove: Some(remove),
    lookup: Some(lookup),
    straddr: Some(straddr),
    av_set: Some(av_set),
};

/// `fi_av_open` on a reliable-datagram domain.
pub unsafe extern "C" fn open(
    d: *mut fid_domain,
    attr: *mut fi_av_attr,
    av: *mut *mut fid_av,
    context: *mut c_void,
) -> c_int {
    guard::call("av_open", || {
        // SAFETY: libfabric passes the domain it was given and an attribute struct.
        let domain = unsafe { Domain::from_fid(d) }?;
        let attr = unsafe { attr.as_ref() }.ok_or(err::EINVAL)?;
        if av.is_null() {
            return Err(err::EINVAL);
        }
        match attr.type_ {
            FI_AV_UNSPEC | FI_AV_MAP | FI_AV_TABLE => {}
            _ => return Err(err::EINVAL),
        }
        // Named (shared) AVs and asynchronous inserts are not offered.
        if !attr.name.is_null() || attr.flags & (FI_EVENT | FI_READ | FI_SYMMETRIC) != 0 {
            return Err(err::ENOSYS);
        }
        if attr.rx_ctx_bits != 0 {
            return Err(err::EINVAL);
        }
        let a = Box::new(Av {
            fid: fid_av {
                fid: fid {
                    fclass: FI_CLASS_AV as usize,
                    context,
                    ops: &FI_OPS as *const fi_ops as *mut fi_ops,
                },
                ops: &OPS as *const fi_ops_av as *mut fi_ops_av,
            },
            domain,
            table: RwLock::new(Table::default()),
            refs: AtomicUsize::new(0),
        });
        domain.refs.fetch_add(1, Ordering::AcqRel);
        // SAFETY: checked non-NULL above.
        unsafe { *av = Box::into_raw(a) as *mut fid_av };
        Ok(())
    })
}

impl Av {
    /// # Safety
    /// `p` is NULL or a fid this provider handed out and has not freed.
    pub unsafe fn from_fid<'a>(p: *mut fid) -> Result<&'a Av, c_int> {
        // SAFETY: per the contract, with the class checked.
        match unsafe { p.as_ref() } {
            Some(f) if f.fclass == FI_CLASS_AV as usize => Ok(unsafe { &*(p as *const Av) }),
            _ => Err(err::EINVAL),
        }
    }

    pub(crate) fn domain(&self) -> &Domain {
        // SAFETY: an AV keeps its domain open.
        unsafe { &*self.domain }
    }

    /// The name at `addr`, if one is there.
    pub fn name(&self, addr: fi_addr_t) -> Option<Name> {
        let t = self.table.read().unwrap_or_else(|e| e.into_inner());
        t.names.get(usize::try_from(addr).ok()?).copied().flatten()
    }

    /// The address `name` was inserted at, if it was.
    pub fn addr_of(&self, name: &Name) -> Option<fi_addr_t> {
        let t = self.table.read().unwrap_or_else(|e| e.into_inner());
        t.by_name.get(name).copied()
    }

    /// Inserts `names`, writing each one's address (or `FI_ADDR_NOTAVAIL`
    /// for bytes that are no name) to `out`: the count inserted.
    fn insert(&self, names: &[[u8; NAME_LEN]], mut out: impl FnMut(usize, fi_addr_t)) -> usize {
        let mut t = self.table.write().unwrap_or_else(|e| e.into_inner());
        let mut n = 0;
        for (i, bytes) in names.iter().enumerate() {
            if t.names.len() >= MAX_ENTRIES {
                out(i, FI_ADDR_NOTAVAIL);
                continue;
            }
            // Every entry takes its index, a refused one too, so that the
            // addresses of `FI_AV_TABLE` stay the positions the program
            // inserted at (MPICH takes rank r's address to be r).
            let addr = t.names.len() as fi_addr_t;
            let name = Name::parse(bytes);
            t.names.push(name);
            let addr = match name {
                Some(name) => {
                    // A name inserted twice gets a second address; a
                    // message from it reports the first.
                    t.by_name.entry(name).or_insert(addr);
                    n += 1;
                    addr
                }
                None => FI_ADDR_NOTAVAIL,
            };
            out(i, addr);
        }
        n
    }
}

unsafe extern "C" fn insert(
    av: *mut fid_av,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut fi_addr_t,
    _flags: u64,
    _context: *mut c_void,
) -> c_int {
    let mut inserted = 0;
    let r = guard::call("av_insert", || {
        // SAFETY: libfabric passes the AV it was given.
        let a = unsafe { Av::from_fid(av as *mut fid) }?;
        if addr.is_null() && count > 0 {
            return Err(err::EINVAL);
        }
        // SAFETY: the caller's `count` addresses of the domain's format,
        // each NAME_LEN bytes (fi_getname's length).
        let names = unsafe { std::slice::from_raw_parts(addr as *const [u8; NAME_LEN], count) };
        inserted = a.insert(names, |i, v| {
            if !fi_addr.is_null() {
                // SAFETY: the caller's array holds `count` addresses.
                unsafe { fi_addr.add(i).write(v) };
            }
        });
        Ok(())
    });
    if r == 0 {
        inserted as c_int
    } else {
        r
    }
}

unsafe extern "C" fn insertsvc(
    _av: *mut fid_av,
    _node: *const c_char,
    _service: *const c_char,
    _fi_addr: *mut fi_addr_t,
    _flags: u64,
    _context: *mut c_void,
) -> c_int {
    err::ENOSYS
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn insertsym(
    _av: *mut fid_av,
    _node: *const c_char,
    _nodecnt: usize,
    _service: *const c_char,
    _svccnt: usize,
    _fi_addr: *mut fi_addr_t,
    _flags: u64,
    _context: *mut c_void,
) -> c_int {
    err::ENOSYS
}

unsafe extern "C" fn remove(
    av: *mut fid_av,
    fi_addr: *mut fi_addr_t,
    count: usize,
    _flags: u64,
) -> c_int {
    guard::call("av_remove", || {
        // SAFETY: libfabric passes the AV it was given.
        let a = unsafe { Av::from_fid(av as *mut fid) }?;
        if fi_addr.is_null() && count > 0 {
            return Err(err::EINVAL);
        }
        // SAFETY: the caller's `count` addresses.
        let addrs = unsafe { std::slice::from_raw_parts(fi_addr, count) };
        let mut t = a.table.write().unwrap_or_else(|e| e.into_inner());
        for &addr in addrs {
            let Some(slot) = usize::try_from(addr).ok().and_then(|i| t.names.get_mut(i)) else {
                return Err(err::EINVAL);
            };
            if let Some(name) = slot.take() {
                if t.by_name.get(&name) == Some(&addr) {
                    t.by_name.remove(&name);
                }
            }
        }
        Ok(())
    })
}

unsafe extern "C" fn lookup(
    av: *mut fid_av,
    fi_addr: fi_addr_t,
    addr: *mut c_void,
    addrlen: *mut usize,
) -> c_int {
    guard::call("av_lookup", || {
        // SAFETY: libfabric passes the AV it was given.
        let a = unsafe { Av::from_fid(av as *mut fid) }?;
        let name = a.name(fi_addr).ok_or(-(FI_ENOENT as c_int))?;
        // SAFETY: the caller's buffer of *addrlen bytes.
        unsafe { super::put_name(&name, addr, addrlen) }
    })
}

unsafe extern "C" fn straddr(
    _av: *mut fid_av,
    addr: *const c_void,
    buf: *mut c_char,
    len: *mut usize,
) -> *const c_char {
    if addr.is_null() || len.is_null() {
        return std::ptr::null();
    }
    // SAFETY: an address of the domain's format: NAME_LEN bytes.
    let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, NAME_LEN) };
    let mut s = String::from("fi_uvia_rdm://");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    let text = std::ffi::CString::new(s).expect("hex digits");
    // SAFETY: `buf` is NULL or holds *len bytes; copy_text cuts to fit.
    let r = unsafe { crate::eq::copy_text(&text, buf, *len) };
    // SAFETY: as above.
    unsafe { *len = text.as_bytes_with_nul().len() };
    r
}

unsafe extern "C" fn av_set(
    _av: *mut fid_av,
    _attr: *mut fi_av_set_attr,
    _set: *mut *mut fid_av_set,
    _context: *mut c_void,
) -> c_int {
    err::ENOSYS
}

unsafe extern "C" fn close(p: *mut fid) -> c_int {
    guard::call("av close", || {
        // SAFETY: libfabric calls close through the fid it was given.
        let a = unsafe { Av::from_fid(p) }?;
        if a.refs.load(Ordering::Acquire) != 0 {
            return Err(err::EBUSY);
        }
        a.domain().refs.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: the box made in `open`; nothing refers to it any more.
        drop(unsafe { Box::from_raw(a as *const Av as *mut Av) });
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn av() -> Av {
        Av {
            fid: fid_av::default(),
            domain: std::ptr::null(),
            table: RwLock::new(Table::default()),
            refs: AtomicUsize::new(0),
        }
    }

    #[test]
    fn names_get_their_index_and_bad_bytes_none() {
        let a = av();
        let (x, y) = (Name::fresh(), Name::fresh());
        let mut got = vec![];
        let n = a.insert(&[x.0, [7; NAME_LEN], y.0], |_, v| got.push(v));
        assert_eq!(n, 2);
        assert_eq!(got, vec![0, FI_ADDR_NOTAVAIL, 2]);
        assert_eq!(a.name(0), Some(x));
        assert_eq!(a.name(1), None, "the refused entry keeps its index");
        assert_eq!(a.name(2), Some(y));
        assert_eq!(a.name(3), None);
        assert_eq!(a.addr_of(&y), Some(2));
    }
}
