//! The host's interfaces and their IP addresses, as `getifaddrs` lists them
//! in the calling thread's network namespace.

use std::net::IpAddr;

/// One address of one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceAddr {
    /// The interface's name (`eth0`, `lo`).
    pub name: String,
    pub ip: IpAddr,
    /// The interface is administratively up (`IFF_UP`).
    pub up: bool,
    /// The interface is a loopback (`IFF_LOOPBACK`).
    pub loopback: bool,
}

/// Every IPv4 and IPv6 address of every interface, in the kernel's order;
/// empty if the kernel will not list them.
pub fn addresses() -> Vec<InterfaceAddr> {
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifap` with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return Vec::new();
    }
    let mut found = Vec::new();
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr of at most storage size.
            let ss = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_storage) };
            if let Some(a) = crate::udp::from_raw(ss) {
                let flags = ifa.ifa_flags;
                found.push(InterfaceAddr {
                    // SAFETY: ifa_name is a NUL-terminated string.
                    name: unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
                        .to_string_lossy()
                        .into_owned(),
                    ip: a.ip(),
                    up: flags & libc::IFF_UP as u32 != 0,
                    loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
                });
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: the list came from getifaddrs.
    unsafe { libc::freeifaddrs(ifap) };
    found
}

/// The first IPv4 address of interface `name`.
pub fn ipv4_of(name: &str) -> Option<std::net::Ipv4Addr> {
    addresses().into_iter().find_map(|a| match a.ip {
        IpAddr::V4(v4) if a.name == name => Some(v4),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed_up() {
        let all = addresses();
        assert!(
            all.iter()
                .any(|a| a.loopback && a.up && a.ip == IpAddr::from([127, 0, 0, 1])),
            "{all:?}"
        );
        let lo = all.iter().find(|a| a.loopback).unwrap();
        assert_eq!(ipv4_of(&lo.name), Some([127, 0, 0, 1].into()));
        assert_eq!(ipv4_of("no-such-if"), None);
    }
}
