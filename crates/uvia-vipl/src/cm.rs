//! Connection management: client/server and peer to peer.

use crate::address::{self, HostBytes};
use crate::data::{remote_attrs, vi};
use crate::handle::{self, lock, ConnH, NicH, PeerConnect};
use crate::nic::nic;
use crate::types::*;
use crate::{put, timeout, unwind, vip};
use std::ffi::{c_ulong, c_void};
use std::sync::Mutex;
use std::time::Duration;
use uvia::{ConnectError, Discriminator, NetAddress as CoreAddress};

/// How long a request "without timeout" may wait for a listener.
const FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// The host address bytes of `a`, as they are.
///
/// # Safety
/// `a` is NULL or the caller's address, holding `host_address_len` bytes.
pub(crate) unsafe fn host_bytes_of<'a>(a: *const NetAddress) -> Result<&'a [u8], VipReturn> {
    if a.is_null() {
        return Err(ret::INVALID_PARAMETER);
    }
    // SAFETY: non-NULL, the caller's address.
    let len = unsafe { (*a).host_address_len } as usize;
    if len > address::MAX_LEN {
        return Err(ret::INVALID_PARAMETER);
    }
    // SAFETY: the caller's address holds `host_address_len` host bytes, and
    // no host address is longer than MAX_LEN (checked).
    Ok(unsafe { std::slice::from_raw_parts((*a).host_address.as_ptr(), len) })
}

/// The host address in `a`, in the core's text: decoded as `n`'s provider
/// writes its addresses; a length or bytes of no such address are
/// `VIP_INVALID_PARAMETER`.
///
/// # Safety
/// As for [`host_bytes_of`].
pub(crate) unsafe fn host_of(n: &NicH, a: *const NetAddress) -> Result<String, VipReturn> {
    // SAFETY: forwarded.
    let b = unsafe { host_bytes_of(a) }?;
    address::decode(n.form, b).map_err(|_| ret::INVALID_PARAMETER)
}

/// Writes a host address into `a`: its length and bytes (a discriminator
/// is the caller's, or follows).
///
/// # Safety
/// `a` has room for `h`'s bytes after its two lengths.
pub(crate) unsafe fn write_host(a: *mut NetAddress, h: &HostBytes) {
    let b = h.as_slice();
    // SAFETY: as the caller promises.
    unsafe {
        (*a).host_address_len = b.len() as u16;
        std::ptr::copy_nonoverlapping(b.as_ptr(), (*a).host_address.as_mut_ptr(), b.len());
    }
}

/// The discriminator in `a` (after its host address).
unsafe fn discriminator_of(a: *const NetAddress) -> Result<Discriminator, VipReturn> {
    if a.is_null() {
        return Err(ret::INVALID_PARAMETER);
    }
    // Lengths of no address are refused before a byte is looked at.
    // SAFETY: non-NULL, the caller's address.
    let (host_len, len) = unsafe { ((*a).host_address_len, (*a).discriminator_len) };
    if host_len as usize > address::MAX_LEN || len as usize > uvia::MAX_DISCRIMINATOR {
        return Err(ret::INVALID_PARAMETER);
    }
    // SAFETY: the caller's address holds host bytes, then `discriminator_len` bytes.
    let bytes = unsafe {
        let start = (*a)
            .host_address
            .as_ptr()
            .add((*a).host_address_len as usize);
        std::slice::from_raw_parts(start, (*a).discriminator_len as usize)
    };
    Discriminator::new(bytes).map_err(|_| ret::INVALID_PARAMETER)
}

/// The discriminator of a local address, which must be well formed: a
/// discriminator of at most 32 bytes and a host address that is empty or
/// one `n`'s provider writes.
///
/// # Safety
/// As for [`host_bytes_of`].
unsafe fn local_well_formed(
    n: &NicH,
    local: *const NetAddress,
) -> Result<Discriminator, VipReturn> {
    // SAFETY: forwarded.
    let d = unsafe { discriminator_of(local) }?;
    // SAFETY: `local` is non-NULL (checked by `discriminator_of`).
    if unsafe { (*local).host_address_len } != 0 {
        // SAFETY: forwarded.
        unsafe { host_of(n, local) }?;
    }
    Ok(d)
}

/// The one line a connection request that had no answer writes: where it
/// went and why it may be unreachable. Nothing answering at all (not even
/// "nobody listens") is what a wrong host, a firewall or another port
/// looks like, and the program's own return code cannot say which.
/// `disc`, when given, is shown as text if it is printable (programs
/// choose text discriminators), else the core's hex is.
pub(crate) fn say_unanswered(call: &str, n: &NicH, e: &ConnectError, disc: Option<&Discriminator>) {
    let ConnectError::NoAnswer {
        peer,
        discriminator,
        waited_ms,
    } = e
    else {
        return;
    };
    let discriminator = match disc.map(|d| d.as_bytes()) {
        Some(b) if b.iter().all(|c| c.is_ascii_graphic()) => {
            format!("\"{}\"", String::from_utf8_lossy(b))
        }
        _ => discriminator.clone(),
    };
    let port = match n.form {
        address::Form::Ip => {
            ", and do both hosts use the same port (VIPL_PORT; /dev/via_ethN use 7100 by default)"
        }
        _ => "",
    };
    eprintln!(
        "vipl: {call}: no listener answered at {peer} within {waited_ms} ms: is a server \
         waiting on discriminator {discriminator}, is the host reachable{port}?"
    );
}

pub(crate) fn connect_err(e: ConnectError) -> VipReturn {
    match e {
        ConnectError::InvalidState(_) => ret::INVALID_STATE,
        ConnectError::NoListener { .. } => ret::NO_MATCH,
        ConnectError::Timeout(_) | ConnectError::NoAnswer { .. } => ret::TIMEOUT,
        ConnectError::Rejected | ConnectError::WrongJob => ret::REJECT,
        ConnectError::Mismatch(_) => ret::INVALID_RELIABILITY_LEVEL,
        ConnectError::DiscriminatorTooLong(_)
        | ConnectError::PrivateDataTooLong(_)
        | ConnectError::Answered => ret::INVALID_PARAMETER,
        ConnectError::BadAddress(_) => ret::NOT_REACHABLE,
        ConnectError::Unsupported(_) => ret::ERROR_NOT_SUPPORTED,
        ConnectError::InUse(_) => ret::INVALID_STATE,
        ConnectError::Protocol(_) | ConnectError::Io(_) => ret::ERROR_RESOURCE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn VipConnectWait(
    h: *mut c_void,
    local: *const NetAddress,
    ms: c_ulong,
    remote: *mut NetAddress,
    remote_attrs_out: *mut ViAttributes,
    out: *mut *mut c_void,
) -> VipReturn {
    vip("VipConnectWait", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        if remote.is_null() || out.is_null() {
            return Err(ret::INVALID_PARAMETER);
        }
        // SAFETY: forwarded.
        let d = unsafe { local_well_formed(n, local) }?;
        let req = n.nic.connect_wait(&d, timeout(ms)).map_err(|e| match e {
            // Another process's listener holds the discriminator: a
            // resource taken, not a state of this NIC.
            ConnectError::InUse(_) => {
                eprintln!("vipl: VipConnectWait: {e}");
                ret::ERROR_RESOURCE
            }
            e => connect_err(e),
        })?;
        let from = req
            .peer_address()
            .unwrap_or_else(|| n.nic.attributes().address.clone());
        let attrs = remote_attrs(&req.remote_attributes());
        let host = address::encode(n.form, &from).map_err(|e| {
            eprintln!("vipl: VipConnectWait: the client's address {e}");
            ret::ERROR_RESOURCE
        })?;
        // SAFETY: `remote` has room for a host address of the NIC's
        // NicAddressLen and the discriminator of `local`'s length (vipl.h).
        unsafe {
            write_host(remote, &host);
            (*remote).discriminator_len = d.as_bytes().len() as u16;
            let p = (*remote)
                .host_address
                .as_mut_ptr()
                .add(host.as_slice().len());
            std::ptr::copy_nonoverlapping(d.as_bytes().as_ptr(), p, d.as_bytes().len());
        }
        if !remote_attrs_out.is_null() {
            // SAFETY: non-NULL, the caller's struct.
            unsafe { remote_attrs_out.write(attrs) };
        }
        // SAFETY: forwarded.
        let nh = unsafe { handle::arc(h) }.ok_or(ret::INVALID_PARAMETER)?;
        let (c, _) = handle::insert(|_| ConnH {
            req: Mutex::new(req),
            nic: nh,
        })
        .ok_or(ret::ERROR_RESOURCE)?;
        // SAFETY: checked non-NULL.
        unsafe { out.write(c) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipConnectAccept(ch: *mut c_void, vh: *mut c_void) -> VipReturn {
    vip("VipConnectAccept", || {
        // SAFETY: forwarded.
        let c = unsafe { handle::get::<ConnH>(ch) }.ok_or(ret::INVALID_PARAMETER)?;
        // SAFETY: forwarded.
        let v = unsafe { vi(vh) }?;
        if !std::ptr::eq(&*c.nic, &*v.nic) {
            return Err(ret::INVALID_PARAMETER);
        }
        lock(&c.req).accept(&v.vi).map_err(connect_err)?;
        v.error_reported
            .store(false, std::sync::atomic::Ordering::Release);
        // SAFETY: the request is answered; its handle is not used after this.
        drop(unsafe { handle::remove::<ConnH>(ch) });
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipConnectReject(ch: *mut c_void) -> VipReturn {
    vip("VipConnectReject", || {
        // SAFETY: forwarded.
        let c = unsafe { handle::get::<ConnH>(ch) }.ok_or(ret::INVALID_PARAMETER)?;
        lock(&c.req).reject().map_err(connect_err)?;
        // SAFETY: as in VipConnectAccept.
        drop(unsafe { handle::remove::<ConnH>(ch) });
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipConnectRequest(
    vh: *mut c_void,
    local: *const NetAddress,
    remote: *const NetAddress,
    ms: c_ulong,
    remote_attrs_out: *mut ViAttributes,
) -> VipReturn {
    vip("VipConnectRequest", || {
        // SAFETY: forwarded.
        let v = unsafe { vi(vh) }?;
        // The local address is this NIC's and names no service a request
        // uses; it must at least be well formed, as VipConnectWait's.
        // SAFETY: forwarded (NULL refused there).
        unsafe { local_well_formed(&v.nic, local) }?;
        // SAFETY: forwarded.
        let (host, d) = unsafe { (host_of(&v.nic, remote)?, discriminator_of(remote)?) };
        let t = timeout(ms).unwrap_or(FOREVER);
        let r =
            v.vi.connect_request(&CoreAddress::new(&host, d.clone()), t)
                .map_err(|e| {
                    say_unanswered("VipConnectRequest", &v.nic, &e, Some(&d));
                    connect_err(e)
                })?;
        v.error_reported
            .store(false, std::sync::atomic::Ordering::Release);
        if !remote_attrs_out.is_null() {
            // SAFETY: non-NULL, the caller's struct.
            unsafe { remote_attrs_out.write(remote_attrs(&r)) };
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipDisconnect(vh: *mut c_void) -> VipReturn {
    vip("VipDisconnect", || {
        // SAFETY: forwarded.
        let v = unsafe { vi(vh) }?;
        v.vi.disconnect();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipConnectPeerRequest(
    vh: *mut c_void,
    local: *const NetAddress,
    remote: *const NetAddress,
    ms: c_ulong,
) -> VipReturn {
    vip("VipConnectPeerRequest", || {
        // SAFETY: forwarded.
        let v = unsafe { vi(vh) }?;
        if !v.nic.nic.attributes().peer_to_peer {
            return Err(ret::ERROR_NOT_SUPPORTED);
        }
        // SAFETY: forwarded.
        let (mine, host, theirs) = unsafe {
            (
                discriminator_of(local)?,
                host_of(&v.nic, remote)?,
                discriminator_of(remote)?,
            )
        };
        let mut p = lock(&v.peer);
        if matches!(*p, PeerConnect::Pending(_)) || v.vi.state() != uvia::ViState::Idle {
            return Err(ret::INVALID_STATE);
        }
        let t = timeout(ms).unwrap_or(FOREVER);
        let core = v.vi.clone();
        let job = std::thread::Builder::new()
            .name("vipl-peer".into())
            .spawn(move || {
                unwind::catch("VipConnectPeerRequest", || {
                    core.connect_peer_request(&mine, &CoreAddress::new(&host, theirs), t)
                })
            })
            .map_err(|_| ret::ERROR_RESOURCE)?;
        *p = PeerConnect::Pending(job);
        Ok(())
    })
}

/// Finishes a peer request: `wait` joins it, otherwise only a finished one.
///
/// # Safety
/// As for the exported functions: `vh` is a handle not destroyed meanwhile,
/// `out` NULL or the caller's struct.
unsafe fn peer_finish(
    vh: *mut c_void,
    out: *mut ViAttributes,
    wait: bool,
) -> Result<(), VipReturn> {
    // SAFETY: forwarded.
    let v = unsafe { vi(vh) }?;
    let mut p = lock(&v.peer);
    let job = match std::mem::replace(&mut *p, PeerConnect::None) {
        PeerConnect::None => return Err(ret::INVALID_STATE),
        PeerConnect::Pending(j) if !wait && !j.is_finished() => {
            *p = PeerConnect::Pending(j);
            return Err(ret::NOT_DONE);
        }
        PeerConnect::Pending(j) => j,
    };
    drop(p);
    // `None`: the thread panicked, and said so on stderr.
    let r = job
        .join()
        .ok()
        .flatten()
        .ok_or(ret::ERROR_RESOURCE)?
        .map_err(|e| {
            let call = if wait {
                "VipConnectPeerWait"
            } else {
                "VipConnectPeerDone"
            };
            say_unanswered(call, &v.nic, &e, None);
            connect_err(e)
        })?;
    v.error_reported
        .store(false, std::sync::atomic::Ordering::Release);
    if !out.is_null() {
        // SAFETY: non-NULL, the caller's struct.
        unsafe { put(out, remote_attrs(&r)) }?;
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn VipConnectPeerDone(vh: *mut c_void, out: *mut ViAttributes) -> VipReturn {
    // SAFETY: forwarded.
    vip("VipConnectPeerDone", || unsafe {
        peer_finish(vh, out, false)
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipConnectPeerWait(vh: *mut c_void, out: *mut ViAttributes) -> VipReturn {
    // SAFETY: forwarded.
    vip("VipConnectPeerWait", || unsafe {
        peer_finish(vh, out, true)
    })
}
