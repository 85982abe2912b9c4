//! The uvia media a domain stands for, their attributes, and how a
//! libfabric socket address maps onto each.
//!
//! One domain per medium: `shm` (this host's processes; a loopback or
//! local address stands for the host), `udp` and `xdp:<interface>`. The
//! attributes a domain reports are those of a Nic opened on the medium,
//! opened once per process and kept.

use crate::guard::lock;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::Mutex;
use uvia::{Discriminator, NetAddress, Nic, NicAttributes, NicOptions};

/// A uvia medium, as a libfabric domain names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Medium {
    Shm,
    Udp,
    Xdp(String),
}

impl Medium {
    /// The domain name: `shm`, `udp`, `xdp:<interface>`.
    pub fn name(&self) -> String {
        match self {
            Medium::Shm => "shm".into(),
            Medium::Udp => "udp".into(),
            Medium::Xdp(iface) => format!("xdp:{iface}"),
        }
    }

    pub fn parse(name: &str) -> Option<Medium> {
        match name {
            "shm" => Some(Medium::Shm),
            "udp" => Some(Medium::Udp),
            _ => name
                .strip_prefix("xdp:")
                .filter(|i| !i.is_empty() && !i.contains(':'))
                .map(|i| Medium::Xdp(i.into())),
        }
    }

    /// The media a getinfo lists, the one `FI_UVIA_DOMAIN` names first. An
    /// xdp domain is listed when named there (its Nic needs root and
    /// attaches a program to the interface, so it is not probed unasked).
    pub fn listed(first: Option<&str>) -> Vec<Medium> {
        let mut media = vec![Medium::Shm, Medium::Udp];
        if let Some(m) = first.and_then(Medium::parse) {
            media.retain(|x| *x != m);
            media.insert(0, m);
        }
        media
    }

    /// The Nic name that opens this medium with `src` as its own address
    /// (`None`: the medium's default).
    pub fn nic_name(&self, src: Option<SocketAddrV4>) -> String {
        match (self, src) {
            (Medium::Shm, _) => "shm".into(),
            (Medium::Udp, None) => "udp".into(),
            (Medium::Udp, Some(a)) if a.port() == 0 => format!("udp:{}", a.ip()),
            (Medium::Udp, Some(a)) => format!("udp:{a}"),
            (Medium::Xdp(iface), _) => format!("xdp:{iface}"),
        }
    }

    /// The Nic a listener at `a` opens: on shm the host's (the port is the
    /// discriminator), on a network medium one bound to `a` itself.
    pub fn listen_nic_name(&self, a: SocketAddrV4) -> String {
        match self {
            Medium::Shm => "shm".into(),
            _ => self.nic_name(Some(a)),
        }
    }

    /// The discriminator a listener on `port` waits on: the port itself on
    /// shm, where all of the host's listeners share one Nic; one fixed name
    /// on a network medium, whose listeners each have a Nic at their port.
    pub fn discriminator(&self, port: u16) -> Discriminator {
        match self {
            Medium::Shm => Discriminator::from_u64(port as u64),
            _ => Discriminator::from_u64(u64::from_le_bytes(*b"uvia-fi\0")),
        }
    }

    /// The uvia address of a libfabric peer at `a`, reached from `nic`.
    pub fn remote(&self, nic: &Nic, a: SocketAddrV4) -> NetAddress {
        let host = match self {
            Medium::Shm => nic.attributes().address.clone(),
            _ => a.to_string(),
        };
        NetAddress::new(&host, self.discriminator(a.port()))
    }

    /// Peers on this medium live on this host only.
    pub fn host_local(&self) -> bool {
        matches!(self, Medium::Shm)
    }

    /// The source address a domain of this medium reports, given what the
    /// caller asked for: `src` as given, else the address that reaches
    /// `dest`, else loopback. `None` if the medium cannot have that source.
    pub fn source(
        &self,
        src: Option<SocketAddrV4>,
        dest: Option<SocketAddrV4>,
    ) -> Option<SocketAddrV4> {
        let port = src.map_or(0, |a| a.port());
        match self {
            Medium::Shm => match src {
                Some(a) if !a.ip().is_unspecified() && !is_local(*a.ip()) => None,
                _ => Some(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)),
            },
            _ => match (src, dest) {
                (Some(a), _) if !a.ip().is_unspecified() => Some(a),
                (_, Some(d)) => Some(SocketAddrV4::new(route_source(*d.ip())?, port)),
                (Some(a), None) => Some(a),
                (None, None) => Some(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)),
            },
        }
    }

    /// True if a peer at `dest` can be reached on this medium.
    pub fn reaches(&self, dest: SocketAddrV4) -> bool {
        !self.host_local() || is_local(*dest.ip())
    }

    /// The attributes of a Nic on this medium, `None` if none opens here.
    pub fn attributes(&self) -> Option<NicAttributes> {
        static CACHE: Mutex<Option<HashMap<Medium, Option<NicAttributes>>>> = Mutex::new(None);
        let mut cache = lock(&CACHE);
        let cache = cache.get_or_insert_with(HashMap::new);
        cache
            .entry(self.clone())
            .or_insert_with(|| {
                Nic::open_with(&self.nic_name(None), &NicOptions::default())
                    .ok()
                    .map(|nic| nic.attributes().clone())
            })
            .clone()
    }
}

/// True if `ip` is loopback or one of this host's addresses.
pub fn is_local(ip: Ipv4Addr) -> bool {
    // Binding to an address succeeds only for the host's own.
    ip.is_loopback() || UdpSocket::bind((IpAddr::V4(ip), 0)).is_ok()
}

/// The local address the kernel would send from to reach `dest`.
fn route_source(dest: Ipv4Addr) -> Option<Ipv4Addr> {
    if dest.is_loopback() || dest.is_unspecified() {
        return Some(Ipv4Addr::LOCALHOST);
    }
    // Connecting a UDP socket sends nothing; it only picks the route.
    let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    s.connect((dest, 9)).ok()?;
    match s.local_addr().ok()?.ip() {
        IpAddr::V4(ip) => Some(ip),
        IpAddr::V6(_) => None,
    }
}

/// `a` as a `struct sockaddr_in`.
pub fn sockaddr_in(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Replaces an info's address (`src_addr`/`dest_addr` and its length)
/// with `a` as a `sockaddr_in`, or with none. The memory is malloc'd:
/// `fi_freeinfo` frees it.
///
/// # Safety
/// `*addr` is NULL or malloc'd memory the info owns.
pub unsafe fn set_addr(addr: &mut *mut std::ffi::c_void, len: &mut usize, a: Option<SocketAddrV4>) {
    // SAFETY: per the contract; free(NULL) does nothing.
    unsafe { libc::free(*addr) };
    *addr = std::ptr::null_mut();
    *len = 0;
    if let Some(a) = a {
        let sin = sockaddr_in(a);
        let n = std::mem::size_of_val(&sin);
        // SAFETY: a fresh allocation of `n` bytes, filled before use.
        let p = unsafe { libc::malloc(n) };
        if !p.is_null() {
            // SAFETY: `p` holds `n` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(&sin as *const _ as *const u8, p as *mut u8, n)
            };
            *addr = p;
            *len = n;
        }
    }
}

/// Reads a `struct sockaddr_in` of `len` bytes at `p`; `None` if it is
/// not one.
///
/// # Safety
/// `p` is NULL or valid for reads of `len` bytes.
pub unsafe fn read_sockaddr_in(p: *const std::ffi::c_void, len: usize) -> Option<SocketAddrV4> {
    if p.is_null() || len < std::mem::size_of::<libc::sockaddr_in>() {
        return None;
    }
    // SAFETY: at least a sockaddr_in's bytes are readable; unaligned read
    // because the caller's buffer need not be aligned.
    let sin = unsafe { std::ptr::read_unaligned(p as *const libc::sockaddr_in) };
    (sin.sin_family == libc::AF_INET as libc::sa_family_t).then(|| {
        SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
            u16::from_be(sin.sin_port),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for m in [Medium::Shm, Medium::Udp, Medium::Xdp("eth0".into())] {
            assert_eq!(Medium::parse(&m.name()), Some(m));
        }
        assert_eq!(Medium::parse("xdp:"), None);
        assert_eq!(Medium::parse("tcp"), None);
        assert_eq!(Medium::listed(Some("udp")), vec![Medium::Udp, Medium::Shm]);
        assert_eq!(
            Medium::listed(Some("bogus")),
            vec![Medium::Shm, Medium::Udp]
        );
    }

    #[test]
    fn sockaddr_round_trip() {
        let a = SocketAddrV4::new(Ipv4Addr::new(10, 1, 2, 3), 9228);
        let sin = sockaddr_in(a);
        let p = &sin as *const libc::sockaddr_in as *const std::ffi::c_void;
        // SAFETY: `sin` is a live sockaddr_in.
        assert_eq!(
            unsafe { read_sockaddr_in(p, std::mem::size_of_val(&sin)) },
            Some(a)
        );
        assert_eq!(unsafe { read_sockaddr_in(p, 4) }, None);
    }

    #[test]
    fn shm_stays_on_the_host() {
        let lo = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 5);
        assert!(Medium::Shm.reaches(lo));
        assert!(!Medium::Shm.reaches(SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 1), 5)));
        assert_eq!(
            Medium::Shm.source(None, None),
            Some(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        );
        assert_eq!(
            Medium::Shm.source(Some(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 7)), None),
            Some(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7))
        );
    }
}
