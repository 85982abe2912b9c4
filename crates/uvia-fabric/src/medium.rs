//! The uvia media a domain stands for, their attributes, and how a
//! libfabric socket address maps onto each.
//!
//! Domains: `shm` (this host's processes; a loopback or local address
//! stands for the host), `udp` (loopback, or the address that reaches the
//! destination), `udp:<interface>` (the interface's IPv4 address, for a
//! listener its peers can reach) and `xdp:<interface>`. The attributes a
//! domain reports are those of a Nic opened on the medium, opened once per
//! process and kept.
//!
//! On udp each listener has a Nic (a socket) of its own at its port; on shm
//! and xdp the host (or interface) has one Nic and the port is the
//! listener's discriminator.

use crate::guard::lock;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::Mutex;
use uvia::{Discriminator, NetAddress, Nic, NicAttributes, NicOptions, WeakNic};

/// A uvia medium, as a libfabric domain names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Medium {
    Shm,
    /// udp at the address that reaches the peer (`None`), or at the IPv4
    /// address of the interface named.
    Udp(Option<String>),
    Xdp(String),
}

impl Medium {
    /// The domain name: `shm`, `udp`, `udp:<interface>`, `xdp:<interface>`.
    pub fn name(&self) -> String {
        match self {
            Medium::Shm => "shm".into(),
            Medium::Udp(None) => "udp".into(),
            Medium::Udp(Some(iface)) => format!("udp:{iface}"),
            Medium::Xdp(iface) => format!("xdp:{iface}"),
        }
    }

    pub fn parse(name: &str) -> Option<Medium> {
        let iface = |prefix: &str| {
            name.strip_prefix(prefix)
                .filter(|i| !i.is_empty() && !i.contains(':'))
                .map(String::from)
        };
        match name {
            "shm" => Some(Medium::Shm),
            "udp" => Some(Medium::Udp(None)),
            _ => iface("udp:")
                .map(|i| Medium::Udp(Some(i)))
                .or_else(|| iface("xdp:").map(Medium::Xdp)),
        }
    }

    /// The media a getinfo lists: shm, udp, and `udp:<interface>` for
    /// each interface that is up with an IPv4 address, loopback aside; or,
    /// when `FI_UVIA_DOMAIN` names one (`chosen`), that one alone; the one
    /// the caller's hints name (`asked`) added if missing. An xdp domain is
    /// listed only when named so (its Nic needs root and attaches a program
    /// to the interface, so it is not probed unasked).
    ///
    /// A chosen medium is listed alone, not merely first: Open MPI gives
    /// each local rank its own entry of the list ("one NIC per rank"), and
    /// ranks on different media cannot reach each other.
    pub fn listed(chosen: Option<&str>, asked: Option<&str>) -> Vec<Medium> {
        let mut media = match chosen.and_then(Medium::parse) {
            Some(m) => vec![m],
            None => {
                let mut media = vec![Medium::Shm, Medium::Udp(None)];
                for a in uvia_net::iface::addresses() {
                    let m = Medium::Udp(Some(a.name));
                    if a.ip.is_ipv4() && a.up && !a.loopback && !media.contains(&m) {
                        media.push(m);
                    }
                }
                media
            }
        };
        if let Some(m) = asked.and_then(Medium::parse) {
            if !media.contains(&m) {
                media.push(m);
            }
        }
        media
    }

    /// The IPv4 address of the interface a domain names, `None` for those
    /// that name none, or whose interface has none.
    fn interface_ip(&self) -> Option<Ipv4Addr> {
        match self {
            Medium::Udp(Some(iface)) | Medium::Xdp(iface) => uvia_net::iface::ipv4_of(iface),
            Medium::Shm | Medium::Udp(None) => None,
        }
    }

    /// The interface the medium names, if it names one.
    pub fn interface(&self) -> Option<&str> {
        match self {
            Medium::Udp(Some(iface)) | Medium::Xdp(iface) => Some(iface),
            Medium::Shm | Medium::Udp(None) => None,
        }
    }

    /// The Nic name that opens this medium with `src` as its own address
    /// (`None`: the medium's default).
    pub fn nic_name(&self, src: Option<SocketAddrV4>) -> String {
        let src = src.or_else(|| Some(SocketAddrV4::new(self.interface_ip()?, 0)));
        match (self, src) {
            (Medium::Shm, _) => "shm".into(),
            (Medium::Udp(_), None) => "udp".into(),
            (Medium::Udp(_), Some(a)) if a.port() == 0 => format!("udp:{}", a.ip()),
            (Medium::Udp(_), Some(a)) => format!("udp:{a}"),
            (Medium::Xdp(iface), _) => format!("xdp:{iface}"),
        }
    }

    /// The Nic a listener at `a` opens: the host's (shm) or the
    /// interface's (xdp), where the port is the discriminator; on udp one
    /// bound to `a` itself.
    pub fn listen_nic_name(&self, a: SocketAddrV4) -> String {
        match self {
            Medium::Udp(_) => self.nic_name(Some(a)),
            Medium::Shm | Medium::Xdp(_) => self.nic_name(None),
        }
    }

    /// Opens the Nic called `name` on this medium. On xdp the process's
    /// domains and listeners on one interface share its Nic while any of
    /// them is open (one AF_XDP socket and program per interface queue:
    /// ofi_rxm opens a domain and a listener side by side).
    pub fn open_nic(&self, name: &str, opts: &NicOptions) -> Result<Nic, uvia::OpenError> {
        if !matches!(self, Medium::Xdp(_)) {
            return Nic::open_with(name, opts);
        }
        static OPEN: Mutex<Option<HashMap<String, WeakNic>>> = Mutex::new(None);
        let mut open = lock(&OPEN);
        let open = open.get_or_insert_with(HashMap::new);
        if let Some(nic) = open.get(name).and_then(WeakNic::upgrade) {
            return Ok(nic);
        }
        let nic = Nic::open_with(name, opts)?;
        open.insert(name.to_string(), nic.downgrade());
        Ok(nic)
    }

    /// The discriminator a listener on `port` waits on: the port itself on
    /// shm and xdp, where all of the host's (or interface's) listeners
    /// share one Nic; one fixed name on udp, whose listeners each have a
    /// Nic at their port.
    pub fn discriminator(&self, port: u16) -> Discriminator {
        match self {
            Medium::Shm | Medium::Xdp(_) => Discriminator::from_u64(port as u64),
            Medium::Udp(_) => Discriminator::from_u64(u64::from_le_bytes(*b"uvia-fi\0")),
        }
    }

    /// The uvia address of a libfabric peer at `a`, reached from `nic`:
    /// on xdp its IPv4 address (the Nic finds the MAC address in the
    /// neighbour table), on udp its socket address.
    pub fn remote(&self, nic: &Nic, a: SocketAddrV4) -> NetAddress {
        let host = match self {
            Medium::Shm => nic.attributes().address.clone(),
            Medium::Udp(_) => a.to_string(),
            Medium::Xdp(_) => a.ip().to_string(),
        };
        NetAddress::new(&host, self.discriminator(a.port()))
    }

    /// The libfabric address of a peer whose connection request came from
    /// uvia address `address`: on udp that socket address; on xdp the IPv4
    /// address the neighbour table holds for its MAC address, port 0 (the
    /// requester has no listener there).
    pub fn peer(&self, address: &str) -> Option<SocketAddrV4> {
        match self {
            Medium::Xdp(iface) => {
                let mac = address.parse().ok()?;
                let ip = uvia_net::neigh::ipv4_of(mac, Some(iface))?;
                Some(SocketAddrV4::new(ip, 0))
            }
            Medium::Shm | Medium::Udp(_) => address.parse().ok(),
        }
    }

    /// Peers on this medium live on this host only.
    pub fn host_local(&self) -> bool {
        matches!(self, Medium::Shm)
    }

    /// The source address a domain of this medium reports, given what the
    /// caller asked for: on shm loopback; on a domain that names an
    /// interface that interface's address; on udp `src` as given, else the
    /// address that reaches `dest`, else loopback. `None` if the medium
    /// cannot have that source.
    pub fn source(
        &self,
        src: Option<SocketAddrV4>,
        dest: Option<SocketAddrV4>,
    ) -> Option<SocketAddrV4> {
        let port = src.map_or(0, |a| a.port());
        let named = src.map(|a| *a.ip()).filter(|ip| !ip.is_unspecified());
        match self {
            Medium::Shm => match named {
                Some(ip) if !is_local(ip) => None,
                _ => Some(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)),
            },
            Medium::Udp(Some(_)) | Medium::Xdp(_) => {
                let ip = self.interface_ip()?;
                match named {
                    Some(n) if n != ip => None,
                    _ => Some(SocketAddrV4::new(ip, port)),
                }
            }
            Medium::Udp(None) => match (src, dest) {
                (Some(a), _) if named.is_some() => Some(a),
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
                self.open_nic(&self.nic_name(None), &NicOptions::default())
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
        for m in [
            Medium::Shm,
            Medium::Udp(None),
            Medium::Udp(Some("eth0".into())),
            Medium::Xdp("eth0".into()),
        ] {
            assert_eq!(Medium::parse(&m.name()), Some(m));
        }
        assert_eq!(Medium::parse("xdp:"), None);
        assert_eq!(Medium::parse("udp:"), None);
        assert_eq!(Medium::parse("udp:10.0.0.1:5"), None);
        assert_eq!(Medium::parse("tcp"), None);
        assert_eq!(Medium::listed(Some("udp"), None), [Medium::Udp(None)]);
        assert_eq!(
            Medium::listed(Some("bogus"), None)[..2],
            [Medium::Shm, Medium::Udp(None)]
        );
        let xdp = Medium::Xdp("eth9".into());
        assert!(!Medium::listed(None, None).contains(&xdp));
        assert_eq!(Medium::listed(None, Some("xdp:eth9")).last(), Some(&xdp));
        assert_eq!(
            Medium::listed(Some("xdp:eth9"), None),
            std::slice::from_ref(&xdp)
        );
        assert_eq!(
            Medium::listed(Some("shm"), Some("xdp:eth9")),
            [Medium::Shm, xdp]
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
    fn an_interface_domain_is_at_the_interface_address() {
        let lo = uvia_net::iface::addresses()
            .into_iter()
            .find(|a| a.loopback)
            .unwrap()
            .name;
        let m = Medium::Udp(Some(lo));
        let here = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);
        let far = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 1), 5);
        assert_eq!(m.source(None, Some(far)), Some(here));
        assert_eq!(
            m.source(Some(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 7)), None),
            Some(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7))
        );
        assert_eq!(m.source(Some(far), None), None, "another address");
        assert_eq!(m.nic_name(None), "udp:127.0.0.1");
        assert_eq!(
            Medium::Udp(Some("no-such-if".into())).source(None, None),
            None
        );
    }

    #[test]
    fn xdp_names_a_peer_by_its_ipv4_address_and_port_discriminator() {
        let m = Medium::Xdp("eth9".into());
        assert_eq!(m.discriminator(9228), Discriminator::from_u64(9228));
        assert_eq!(
            m.listen_nic_name(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 5)),
            "xdp:eth9"
        );
        assert_eq!(m.peer("not a mac"), None);
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
