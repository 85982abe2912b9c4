//! NIC, protection tags, memory registration, system management and the
//! name service.

use crate::address::{self, Form};
use crate::cm::write_host;
use crate::handle::{self, lock, ErrorCallback, NicH, PtagH};
use crate::names::{self, HostEntry};
use crate::types::*;
use crate::{notify, put, vip};
use std::ffi::{c_char, c_ulong, c_void, CStr};
use std::sync::Arc;
use uvia::{MemAttributes as CoreMem, MemError, MemHandle, Nic, OpenError, PtagError, Reliability};

/// The NIC behind a handle, or the call's error.
///
/// # Safety
/// As for [`handle::get`]: the program does not destroy the handle during
/// the call (the contract of every call, docs/VIPL.md).
pub(crate) unsafe fn nic<'a>(h: *mut c_void) -> Result<&'a NicH, VipReturn> {
    // SAFETY: forwarded.
    unsafe { handle::get(h) }.ok_or(ret::INVALID_PARAMETER)
}

/// A tag handle of this NIC, as its core tag.
///
/// # Safety
/// As for [`nic`].
pub(crate) unsafe fn ptag_of(n: &NicH, h: *mut c_void) -> Result<uvia::Ptag, VipReturn> {
    // SAFETY: forwarded.
    match unsafe { handle::get::<PtagH>(h) } {
        Some(p) if std::ptr::eq(Arc::as_ptr(&p.nic), n) => Ok(p.ptag),
        _ => Err(ret::INVALID_PTAG),
    }
}

/// The configuration file's path: `VIPL_CONF`, else `/etc/vipl.conf`.
fn conf_path() -> String {
    std::env::var("VIPL_CONF").unwrap_or_else(|_| "/etc/vipl.conf".to_string())
}

/// The configuration file's text, if there is one; a path that names
/// something else is said on stderr and read as no file.
fn read_conf() -> Option<String> {
    let p = conf_path();
    match names::read_small_file(std::path::Path::new(&p)) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            eprintln!("vipl: the configuration {p}: {e}; not read");
            None
        }
    }
}

/// The default udp port: `VIPL_PORT`, else 7100. A bad value is said once
/// per call on stderr and refused.
pub(crate) fn default_port(call: &str) -> Result<u16, VipReturn> {
    names::default_port(std::env::var("VIPL_PORT").ok().as_deref()).map_err(|e| {
        eprintln!("vipl: {call}: {e}");
        ret::INVALID_PARAMETER
    })
}

/// The uvia provider name `device` opens, or the call's error (one line
/// on stderr says why).
fn provider_of(device: &str) -> Result<String, VipReturn> {
    let env = std::env::var("VIPL_DEVICES").ok();
    match names::device_for(device, env.as_deref(), read_conf().as_deref()) {
        names::Device::Provider(p) => Ok(p),
        names::Device::Ethernet(n) => {
            let port = default_port(&format!("VipOpenNic({device:?})"))?;
            let ifs = names::system_interfaces().map_err(|e| {
                eprintln!("vipl: VipOpenNic({device:?}): listing network interfaces: {e}");
                ret::ERROR_RESOURCE
            })?;
            names::nth_interface(&ifs, n, port).map_err(|e| {
                eprintln!("vipl: VipOpenNic({device:?}): {e}");
                ret::ERROR_RESOURCE
            })
        }
    }
}

/// Most bytes a program can register: physical memory. Registration here
/// pins nothing (the providers copy from the program's pages, or share
/// them through a memfd it asked for), so the locked-memory limit does not
/// bound it; what does is that every registered byte a transfer touches
/// must be in memory, and past physical memory that would be swapping.
fn max_register_bytes() -> c_ulong {
    // SAFETY: sysconf reads system constants.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || size <= 0 {
        // Not known here: the largest a 64-bit program can address.
        return (c_ulong::MAX >> 1) as c_ulong;
    }
    (pages as u64).saturating_mul(size as u64) as c_ulong
}

#[no_mangle]
pub unsafe extern "C" fn VipOpenNic(device: *const c_char, out: *mut *mut c_void) -> VipReturn {
    vip("VipOpenNic", || {
        // A NULL name is a mistake, not a wish for some default device.
        if out.is_null() || device.is_null() {
            return Err(ret::INVALID_PARAMETER);
        }
        // SAFETY: a non-NULL device name is a C string.
        let device = match unsafe { CStr::from_ptr(device) }.to_str() {
            Ok(s) => s.to_string(),
            Err(_) => return Err(ret::INVALID_PARAMETER),
        };
        let provider = provider_of(&device)?;
        let n = Nic::open(&provider).map_err(|e| match e {
            OpenError::Io { .. } => {
                eprintln!("vipl: VipOpenNic({device:?}): {e}");
                ret::ERROR_RESOURCE
            }
            OpenError::UnknownProvider(_) => {
                eprintln!(
                    "vipl: VipOpenNic({device:?}): {e}; a device name opens the provider that \
                     VIPL_DEVICES (\"<device>=<provider>;...\") or {} (\"<device> <provider>\" \
                     lines) maps it to, else /dev/via_lo is shm and /dev/via_ethN udp on the N-th \
                     network interface",
                    conf_path()
                );
                ret::INVALID_PARAMETER
            }
            _ => {
                eprintln!("vipl: VipOpenNic({device:?}): {e}");
                ret::INVALID_PARAMETER
            }
        })?;
        let address =
            address::encode(Form::of(n.attributes()), &n.attributes().address).map_err(|e| {
                eprintln!("vipl: VipOpenNic({device:?}): its address {e}");
                ret::INVALID_PARAMETER
            })?;
        let driven = n.attributes().needs_driving;
        let (h, nh) =
            handle::insert(|h| NicH::new(h, n, device, address)).ok_or(ret::ERROR_RESOURCE)?;
        if driven {
            notify::drive(nh, true);
        }
        // SAFETY: checked non-NULL above.
        unsafe { out.write(h) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipCloseNic(h: *mut c_void) -> VipReturn {
    vip("VipCloseNic", || {
        // SAFETY: the handle is not used by this or another call after this.
        let nh = unsafe { handle::remove::<NicH>(h) }.ok_or(ret::INVALID_PARAMETER)?;
        notify::watch(nh.clone(), false);
        notify::drive(nh, false);
        Ok(())
    })
}

fn levels(ls: &[Reliability]) -> u16 {
    ls.iter()
        .map(|l| match l {
            Reliability::Unreliable => service::UNRELIABLE,
            Reliability::ReliableDelivery => service::RELIABLE_DELIVERY,
            Reliability::ReliableReception => service::RELIABLE_RECEPTION,
        })
        .fold(0, |a, b| a | b)
}

#[no_mangle]
pub unsafe extern "C" fn VipQueryNic(h: *mut c_void, out: *mut NicAttributes) -> VipReturn {
    vip("VipQueryNic", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        let a = n.nic.attributes();
        // The name the program opened it by (a device or a provider name),
        // as M-VIA reported its device's.
        let mut name = [0 as c_char; 64];
        for (d, s) in name.iter_mut().zip(n.name.bytes().take(63)) {
            *d = s as c_char;
        }
        let all = levels(a.reliability_levels);
        let big = max_register_bytes();
        // SAFETY: `out` is NULL or points at the caller's attributes.
        unsafe {
            put(
                out,
                NicAttributes {
                    name,
                    hardware_version: 0,
                    provider_version: 0x0001_0000,
                    nic_address_len: n.address.as_slice().len() as u16,
                    local_nic_address: n.address.as_slice().as_ptr(),
                    thread_safe: 1,
                    max_discriminator_len: uvia::cm::MAX_DISCRIMINATOR as u16,
                    max_register_bytes: big,
                    max_register_regions: a.max_registered_regions as c_ulong,
                    max_register_block_bytes: big,
                    max_vi: 1 << 16,
                    max_descriptors_per_queue: a.max_queue_depth as c_ulong,
                    max_segments_per_desc: a.max_segments_per_desc as c_ulong,
                    max_cq: 1 << 16,
                    max_cq_entries: a.max_cq_entries as c_ulong,
                    max_transfer_size: a.max_transfer_size as c_ulong,
                    // A host-local provider has no wire: its native unit is
                    // its largest transfer. The others go over Ethernet.
                    native_mtu: if a.host_local {
                        a.max_transfer_size as c_ulong
                    } else {
                        1500
                    },
                    max_ptags: a.max_ptags as c_ulong,
                    reliability_level_support: all,
                    // VIA offers RDMA read on reliable VIs only.
                    rdma_read_support: if a.rdma_read {
                        all & !service::UNRELIABLE
                    } else {
                        0
                    },
                },
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipQuerySystemManagementInfo(
    h: *mut c_void,
    info_type: c_ulong,
    out: *mut c_void,
) -> VipReturn {
    vip("VipQuerySystemManagementInfo", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        if info_type != SMI_AUTODISCOVERY || out.is_null() {
            return Err(ret::INVALID_PARAMETER);
        }
        // SAFETY: for this info type `out` is the caller's list.
        let list = unsafe { &mut *(out as *mut AutodiscoveryList) };
        let hosts = hosts_of(n)?;
        let mut filled = 0;
        for e in hosts.iter().filter(|e| e.provider == n.provider()) {
            if filled >= list.num_ad_addrs as usize || list.ad_addr_array.is_null() {
                break;
            }
            // SAFETY: the caller gave `num_ad_addrs` entries.
            let slot = unsafe { *list.ad_addr_array.add(filled) };
            if slot.is_null() {
                return Err(ret::INVALID_PARAMETER);
            }
            let Ok(b) = address::encode(n.form, &e.address) else {
                continue;
            };
            // SAFETY: each entry has room for a host address (the contract in vipl.h).
            unsafe { write_host(slot, &b) };
            filled += 1;
        }
        list.number_of_hops = 0;
        list.num_ad_addrs = filled as c_ulong;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipErrorCallback(
    h: *mut c_void,
    context: *mut c_void,
    handler: ErrorHandler,
) -> VipReturn {
    vip("VipErrorCallback", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        *lock(&n.on_error) = handler.map(|_| ErrorCallback {
            handler,
            context: context as usize,
        });
        // SAFETY: forwarded.
        let nh = unsafe { handle::arc(h) }.ok_or(ret::INVALID_PARAMETER)?;
        notify::watch(nh, handler.is_some());
        Ok(())
    })
}

// ---- Protection tags ----

#[no_mangle]
pub unsafe extern "C" fn VipCreatePtag(h: *mut c_void, out: *mut *mut c_void) -> VipReturn {
    vip("VipCreatePtag", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        if out.is_null() {
            return Err(ret::INVALID_PARAMETER);
        }
        // SAFETY: forwarded.
        let nh = unsafe { handle::arc(h) }.ok_or(ret::INVALID_PARAMETER)?;
        let p = n.nic.create_ptag().map_err(|_| ret::ERROR_RESOURCE)?;
        let Some((ph, _)) = handle::insert(|_| PtagH { ptag: p, nic: nh }) else {
            let _ = n.nic.destroy_ptag(p);
            return Err(ret::ERROR_RESOURCE);
        };
        lock(&n.ptags).insert(p.raw(), ph as usize);
        // SAFETY: checked non-NULL.
        unsafe { out.write(ph) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipDestroyPtag(h: *mut c_void, ptag: *mut c_void) -> VipReturn {
    vip("VipDestroyPtag", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        // SAFETY: forwarded.
        let p = unsafe { ptag_of(n, ptag) }?;
        n.nic.destroy_ptag(p).map_err(|e| match e {
            PtagError::InUse(_) => ret::ERROR_RESOURCE,
            _ => ret::INVALID_PTAG,
        })?;
        lock(&n.ptags).remove(&p.raw());
        // SAFETY: the tag's handle is not used after this.
        drop(unsafe { handle::remove::<PtagH>(ptag) });
        Ok(())
    })
}

// ---- Memory ----

unsafe fn mem_attrs(n: &NicH, a: *const MemAttributes) -> Result<CoreMem, VipReturn> {
    if a.is_null() {
        return Err(ret::INVALID_PARAMETER);
    }
    // SAFETY: non-NULL attributes are the caller's struct.
    let a = unsafe { *a };
    // SAFETY: forwarded.
    let p = unsafe { ptag_of(n, a.ptag) }?;
    Ok(CoreMem::new(p)
        .rdma_write(a.enable_rdma_write != 0)
        .rdma_read(a.enable_rdma_read != 0))
}

fn mem_err(e: MemError) -> VipReturn {
    match e {
        MemError::InvalidPtag(_) => ret::INVALID_PTAG,
        MemError::TableFull(_) | MemError::Alloc { .. } => ret::ERROR_RESOURCE,
        _ => ret::INVALID_PARAMETER,
    }
}

/// The region `mh` names, if `addr` lies in it.
fn region(n: &NicH, addr: *mut c_void, mh: u32) -> Result<uvia::RegionInfo, VipReturn> {
    let r = n.nic.query_mem(MemHandle(mh)).map_err(mem_err)?;
    if !r.contains(addr as u64, 1) {
        return Err(ret::INVALID_PARAMETER);
    }
    Ok(r)
}

#[no_mangle]
pub unsafe extern "C" fn VipRegisterMem(
    h: *mut c_void,
    addr: *mut c_void,
    len: c_ulong,
    attrs: *const MemAttributes,
    out: *mut u32,
) -> VipReturn {
    vip("VipRegisterMem", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        if addr.is_null() || len == 0 || out.is_null() {
            return Err(ret::INVALID_PARAMETER);
        }
        // SAFETY: forwarded.
        let a = unsafe { mem_attrs(n, attrs) }?;
        // SAFETY: the program registers its own memory and keeps it while
        // registered, the contract of VipRegisterMem.
        let mh =
            unsafe { n.nic.register_mem(addr as *mut u8, len as usize, a) }.map_err(mem_err)?;
        // SAFETY: checked non-NULL.
        unsafe { out.write(mh.0) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipDeregisterMem(h: *mut c_void, addr: *mut c_void, mh: u32) -> VipReturn {
    vip("VipDeregisterMem", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        region(n, addr, mh)?;
        n.nic.deregister_mem(MemHandle(mh)).map_err(mem_err)
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipQueryMem(
    h: *mut c_void,
    addr: *mut c_void,
    mh: u32,
    out: *mut MemAttributes,
) -> VipReturn {
    vip("VipQueryMem", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        let r = region(n, addr, mh)?;
        // SAFETY: `out` is NULL or the caller's struct.
        unsafe {
            put(
                out,
                MemAttributes {
                    ptag: n.ptag_handle(r.attrs.ptag),
                    enable_rdma_write: r.attrs.enable_rdma_write as VipBoolean,
                    enable_rdma_read: r.attrs.enable_rdma_read as VipBoolean,
                },
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipSetMemAttributes(
    h: *mut c_void,
    addr: *mut c_void,
    mh: u32,
    attrs: *const MemAttributes,
) -> VipReturn {
    vip("VipSetMemAttributes", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        // SAFETY: forwarded.
        let a = unsafe { mem_attrs(n, attrs) }?;
        region(n, addr, mh)?;
        n.nic.set_mem_attributes(MemHandle(mh), a).map_err(mem_err)
    })
}

// ---- Name service ----

/// The hosts table, read on first use.
fn hosts_of(n: &NicH) -> Result<Vec<HostEntry>, VipReturn> {
    let mut g = lock(&n.hosts);
    if g.is_none() {
        *g = Some(load_hosts(None)?);
    }
    Ok(g.clone().unwrap_or_default())
}

fn load_hosts(path: Option<&str>) -> Result<Vec<HostEntry>, VipReturn> {
    let p = match path {
        Some(p) => p.to_string(),
        None => std::env::var("VIPL_HOSTS").unwrap_or_else(|_| "/etc/vipl_hosts".to_string()),
    };
    names::read_hosts(std::path::Path::new(&p), path.is_some()).map_err(|e| {
        eprintln!("vipl: name service: {e}");
        ret::ERROR_NAMESERVICE
    })
}

/// The names this host goes by, for host-local NICs.
fn this_host(name: &str) -> bool {
    if name == "localhost" {
        return true;
    }
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into our buffer.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut c_char, buf.len()) } == 0;
    ok && CStr::from_bytes_until_nul(&buf).is_ok_and(|h| h.to_bytes() == name.as_bytes())
}

/// The addresses the system's resolver (`/etc/hosts`, DNS) gives `name`
/// on a network NIC: on udp its IP addresses of the NIC's family at the
/// default port, or the port `name:port` gives (a loopback address, when
/// the NIC is not on one, is this host: the NIC's own IP); on an Ethernet
/// NIC the MAC address the neighbour table holds for its IPv4 address. Names under
/// `.invalid` are never asked for (RFC 6761: they resolve nowhere), so a
/// program or test can name a host that does not exist without a query
/// leaving the host.
fn resolve_system(n: &NicH, name: &str) -> Result<Vec<String>, VipReturn> {
    let lower = name.to_ascii_lowercase();
    if lower == "invalid" || lower.trim_end_matches('.').ends_with(".invalid") {
        return Ok(Vec::new());
    }
    match n.form {
        Form::Instance => Ok(Vec::new()),
        Form::Mac => Ok(uvia_net::neigh::resolve(name, None)
            .map(|m| vec![m.to_string()])
            .unwrap_or_default()),
        Form::Ip => {
            use std::net::{SocketAddr, ToSocketAddrs};
            // `name:port` names its port; a bare name is at the default.
            let (name, port) = match name.rsplit_once(':') {
                Some((h, p)) if !h.is_empty() && !h.contains(':') && p.parse::<u16>().is_ok() => {
                    (h, p.parse::<u16>().unwrap_or(0))
                }
                _ => (name, default_port("VipNSGetHostByName")?),
            };
            let Ok(mine) = n.nic.attributes().address.parse::<SocketAddr>() else {
                return Ok(Vec::new());
            };
            let Ok(found) = (name, port).to_socket_addrs() else {
                return Ok(Vec::new());
            };
            let mut out: Vec<String> = Vec::new();
            for a in found.filter(|a| a.is_ipv4() == mine.is_ipv4()) {
                let ip = if a.ip().is_loopback() && !mine.ip().is_loopback() {
                    mine.ip()
                } else {
                    a.ip()
                };
                let text = SocketAddr::new(ip, port).to_string();
                if !out.contains(&text) {
                    out.push(text);
                }
            }
            Ok(out)
        }
    }
}

/// The system resolver's name for a network host address, the reverse of
/// [`resolve_system`]: on udp for an address at the default port (at
/// another port no name stands for it), on an Ethernet NIC for a MAC the
/// neighbour table knows an IPv4 address of. A name only, never the
/// address in text (`NI_NAMEREQD`).
fn name_of_system(n: &NicH, text: &str) -> Result<Option<String>, VipReturn> {
    use std::net::{IpAddr, SocketAddr};
    let ip: IpAddr = match n.form {
        Form::Instance => return Ok(None),
        Form::Ip => {
            let Ok(sa) = text.parse::<SocketAddr>() else {
                return Ok(None);
            };
            if sa.port() != default_port("VipNSGetHostByAddr")? {
                return Ok(None);
            }
            sa.ip()
        }
        Form::Mac => {
            let Ok(mac) = text.parse::<uvia_net::MacAddr>() else {
                return Ok(None);
            };
            match uvia_net::neigh::ipv4_of(mac, None) {
                Some(ip) => ip.into(),
                None => return Ok(None),
            }
        }
    };
    // By hand: std has no reverse lookup.
    let sa: SocketAddr = (ip, 0).into();
    let (storage, slen) = match sa {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: 0,
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            let mut s = std::mem::MaybeUninit::<libc::sockaddr_storage>::zeroed();
            // SAFETY: a sockaddr_in fits in a sockaddr_storage.
            unsafe { (s.as_mut_ptr() as *mut libc::sockaddr_in).write(sin) };
            (s, std::mem::size_of::<libc::sockaddr_in>())
        }
        SocketAddr::V6(a) => {
            // SAFETY: all-zero is a valid sockaddr_in6.
            let mut sin6: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_addr.s6_addr = a.ip().octets();
            let mut s = std::mem::MaybeUninit::<libc::sockaddr_storage>::zeroed();
            // SAFETY: a sockaddr_in6 fits in a sockaddr_storage.
            unsafe { (s.as_mut_ptr() as *mut libc::sockaddr_in6).write(sin6) };
            (s, std::mem::size_of::<libc::sockaddr_in6>())
        }
    };
    let mut host = [0 as c_char; 1025];
    // SAFETY: the address is initialised for `slen` bytes; getnameinfo
    // writes a C string of at most `host.len()` bytes into `host`.
    let r = unsafe {
        libc::getnameinfo(
            storage.as_ptr() as *const libc::sockaddr,
            slen as libc::socklen_t,
            host.as_mut_ptr(),
            host.len() as libc::socklen_t,
            std::ptr::null_mut(),
            0,
            libc::NI_NAMEREQD,
        )
    };
    if r != 0 {
        return Ok(None);
    }
    // SAFETY: getnameinfo succeeded and wrote a NUL-terminated name.
    let s = unsafe { CStr::from_ptr(host.as_ptr()) };
    Ok(s.to_str().ok().map(str::to_string))
}

/// Every address `name` has on this NIC's provider, in file order. Else, on
/// a host-local provider, `localhost` and this host's name resolve to the
/// NIC's own instance; a name that is itself an address of the provider
/// (the NIC's own, one the file lists, one written in the provider's form)
/// resolves to itself; and on a network provider the system's resolver
/// has the last word ([`resolve_system`]).
fn lookup(n: &NicH, name: &str) -> Result<Vec<String>, VipReturn> {
    let hosts = hosts_of(n)?;
    let mine = |e: &&HostEntry| e.provider == n.provider();
    let mut out: Vec<String> = hosts
        .iter()
        .filter(mine)
        .filter(|e| e.name == name)
        .map(|e| e.address.clone())
        .collect();
    if out.is_empty() {
        let a = n.nic.attributes();
        if a.host_local && this_host(name) {
            out.push(a.address.clone());
        } else if n.nic.is_host_address(name)
            || hosts.iter().filter(mine).any(|e| e.address == name)
        {
            out.push(name.to_string());
        } else {
            out = resolve_system(n, name)?;
        }
    }
    Ok(out)
}

#[no_mangle]
pub unsafe extern "C" fn VipNSInit(h: *mut c_void, info: *mut c_void) -> VipReturn {
    vip("VipNSInit", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        let path = if info.is_null() {
            None
        } else {
            // SAFETY: a non-NULL init info is the hosts file's path (vipl.h).
            let s = unsafe { CStr::from_ptr(info as *const c_char) };
            Some(s.to_str().map_err(|_| ret::INVALID_PARAMETER)?.to_string())
        };
        *lock(&n.hosts) = Some(load_hosts(path.as_deref())?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipNSGetHostByName(
    h: *mut c_void,
    name: *const c_char,
    out: *mut NetAddress,
    index: c_ulong,
) -> VipReturn {
    vip("VipNSGetHostByName", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        if name.is_null() || out.is_null() {
            return Err(ret::INVALID_PARAMETER);
        }
        // SAFETY: a non-NULL name is a C string.
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| ret::INVALID_PARAMETER)?;
        let addrs = lookup(n, name)?;
        let a = addrs.get(index as usize).ok_or(ret::ERROR_NAMESERVICE)?;
        let b = address::encode(n.form, a).map_err(|e| {
            eprintln!("vipl: name service: {name:?} is {e}");
            ret::ERROR_NAMESERVICE
        })?;
        // SAFETY: `out` has room for a host address (vipl.h).
        unsafe { write_host(out, &b) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipNSGetHostByAddr(
    h: *mut c_void,
    a: *const NetAddress,
    name: *mut c_char,
    len: *mut c_ulong,
) -> VipReturn {
    vip("VipNSGetHostByAddr", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        if len.is_null() || name.is_null() {
            return Err(ret::INVALID_PARAMETER);
        }
        // SAFETY: `a` is NULL or the caller's address.
        let host = unsafe { crate::cm::host_bytes_of(a) }?;
        let text = address::decode(n.form, host).map_err(|_| ret::INVALID_PARAMETER)?;
        // Compared as bytes: the file may write an address in another case
        // or form than the core does.
        let from_file = hosts_of(n)?
            .into_iter()
            .find(|e| {
                e.provider == n.provider()
                    && address::encode(n.form, &e.address).is_ok_and(|b| b.as_slice() == host)
            })
            .map(|e| e.name);
        let found = match from_file {
            Some(f) => f,
            None => name_of_system(n, &text)?.ok_or(ret::ERROR_NAMESERVICE)?,
        };
        let need = found.len() + 1;
        // SAFETY: `len` is non-NULL and the caller's.
        let room = unsafe { *len } as usize;
        // SAFETY: as above.
        unsafe { *len = need as c_ulong };
        if room < need {
            return Err(ret::ERROR_RESOURCE);
        }
        // SAFETY: `name` has `room >= need` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(found.as_ptr(), name as *mut u8, found.len());
            *name.add(found.len()) = 0;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipNSShutdown(h: *mut c_void) -> VipReturn {
    vip("VipNSShutdown", || {
        // SAFETY: forwarded.
        let n = unsafe { nic(h) }?;
        *lock(&n.hosts) = None;
        Ok(())
    })
}
