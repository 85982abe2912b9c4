//! The name service of the Ethernet medium: an IPv4 address (or a host name
//! that resolves to one) to the MAC address the kernel's neighbour table
//! holds for it, in the calling thread's network namespace.
//!
//! When the table has no entry yet, one empty UDP datagram to the discard
//! port of that address makes the kernel resolve it (ARP), and the table is
//! read again for up to a second. IPv6 neighbours are not looked up yet.

use crate::MacAddr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

/// How long a lookup waits for the kernel to resolve an address.
const RESOLVE_WAIT: Duration = Duration::from_secs(1);

/// Why no MAC address was found.
#[derive(Debug, thiserror::Error)]
pub enum NeighError {
    #[error("{0:?} is neither a MAC address nor a host name or IPv4 address that resolves")]
    BadHost(String),
    #[error("IPv6 neighbours are not looked up yet ({0}): give the peer's MAC address")]
    Ipv6(IpAddr),
    #[error(
        "no neighbour entry for {0} after asking the kernel to resolve it (is it on this LAN?)"
    )]
    Unresolved(Ipv4Addr),
    #[error("reading the neighbour table: {0}")]
    Io(#[from] io::Error),
}

/// The MAC address of `ip` in a neighbour table's text (the format of
/// `/proc/net/arp`): complete entries only, on `device` if given.
pub fn parse_arp(table: &str, ip: Ipv4Addr, device: Option<&str>) -> Option<MacAddr> {
    arp_entries(table, device).find_map(|(addr, hw)| (addr == ip).then_some(hw))
}

/// The complete entries of a neighbour table's text (`/proc/net/arp`), on
/// `device` if given, as (IPv4 address, MAC address).
fn arp_entries<'a>(
    table: &'a str,
    device: Option<&'a str>,
) -> impl Iterator<Item = (Ipv4Addr, MacAddr)> + 'a {
    table.lines().skip(1).filter_map(move |line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [addr, _hw_type, flags, hw, _mask, dev] = f[..] else {
            return None;
        };
        let complete = u32::from_str_radix(flags.trim_start_matches("0x"), 16).ok()? & 0x2 != 0;
        let here = device.is_none_or(|d| d == dev);
        (complete && here).then_some(())?;
        Some((addr.parse().ok()?, hw.parse().ok()?))
    })
}

/// The IPv4 address of the complete entry for `mac` in an ARP table as
/// `/proc/net/arp` prints it (on `device` when given): the reverse of
/// [`parse_arp`].
pub fn parse_arp_ip(table: &str, mac: MacAddr, device: Option<&str>) -> Option<Ipv4Addr> {
    arp_entries(table, device).find_map(|(addr, hw)| (hw == mac).then_some(addr))
}

/// The IPv4 address the neighbour table holds for `mac` (on `device` when
/// given), if any. A host that asked for this host's MAC address left its
/// own in the table as it asked, so a peer that reached us is usually there.
pub fn ipv4_of(mac: MacAddr, device: Option<&str>) -> Option<Ipv4Addr> {
    let table = std::fs::read_to_string("/proc/thread-self/net/arp").ok()?;
    parse_arp_ip(&table, mac, device)
}

fn lookup(ip: Ipv4Addr, device: Option<&str>) -> io::Result<Option<MacAddr>> {
    // The calling thread's namespace (a test thread may have entered one).
    let table = std::fs::read_to_string("/proc/thread-self/net/arp")?;
    Ok(parse_arp(&table, ip, device))
}

/// The MAC address for `host`: a MAC address as it is, else the neighbour
/// entry of the IPv4 address it names or resolves to.
pub fn resolve(host: &str, device: Option<&str>) -> Result<MacAddr, NeighError> {
    if let Ok(m) = host.parse::<MacAddr>() {
        return Ok(m);
    }
    let ip = match host.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => (host, 0)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.find(|a| a.is_ipv4()))
            .map(|a| a.ip())
            .ok_or_else(|| NeighError::BadHost(host.into()))?,
    };
    let IpAddr::V4(ip) = ip else {
        return Err(NeighError::Ipv6(ip));
    };
    if let Some(m) = lookup(ip, device)? {
        return Ok(m);
    }
    // Nothing yet: a datagram to the discard port makes the kernel ask.
    let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    let _ = s.send_to(&[], (ip, 9));
    let start = Instant::now();
    while start.elapsed() < RESOLVE_WAIT {
        if let Some(m) = lookup(ip, device)? {
            return Ok(m);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Err(NeighError::Unresolved(ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
IP address       HW type     Flags       HW address            Mask     Device
10.199.3.2       0x1         0x2         02:aa:bb:cc:dd:01     *        va1
10.199.3.9       0x1         0x0         00:00:00:00:00:00     *        va1
10.199.4.2       0x1         0x2         02:aa:bb:cc:dd:02     *        eth0
";

    #[test]
    fn complete_entries_are_found_by_address_and_device() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let m = |s: &str| Some(s.parse::<MacAddr>().unwrap());
        assert_eq!(
            parse_arp(TABLE, ip("10.199.3.2"), None),
            m("02:aa:bb:cc:dd:01")
        );
        assert_eq!(
            parse_arp(TABLE, ip("10.199.3.2"), Some("va1")),
            m("02:aa:bb:cc:dd:01")
        );
        assert_eq!(parse_arp(TABLE, ip("10.199.3.2"), Some("eth0")), None);
        assert_eq!(parse_arp(TABLE, ip("10.199.3.9"), None), None, "incomplete");
        assert_eq!(parse_arp(TABLE, ip("10.199.9.9"), None), None);
        assert_eq!(parse_arp("", ip("10.199.3.2"), None), None);
    }

    #[test]
    fn complete_entries_are_found_by_mac_address() {
        let mac = |s: &str| s.parse::<MacAddr>().unwrap();
        let ip = |s: &str| Some(s.parse::<Ipv4Addr>().unwrap());
        assert_eq!(
            parse_arp_ip(TABLE, mac("02:aa:bb:cc:dd:02"), None),
            ip("10.199.4.2")
        );
        assert_eq!(
            parse_arp_ip(TABLE, mac("02:aa:bb:cc:dd:01"), Some("va1")),
            ip("10.199.3.2")
        );
        assert_eq!(
            parse_arp_ip(TABLE, mac("02:aa:bb:cc:dd:01"), Some("eth0")),
            None
        );
        assert_eq!(
            parse_arp_ip(TABLE, mac("00:00:00:00:00:00"), None),
            None,
            "incomplete"
        );
    }

    #[test]
    fn a_mac_address_is_its_own_answer_and_ipv6_is_refused_clearly() {
        assert_eq!(
            resolve("02:aa:bb:cc:dd:01", None).unwrap(),
            MacAddr([2, 0xaa, 0xbb, 0xcc, 0xdd, 1])
        );
        assert!(matches!(resolve("fd00::1", None), Err(NeighError::Ipv6(_))));
        assert!(matches!(
            resolve("no such host.invalid", None),
            Err(NeighError::BadHost(_))
        ));
    }
}
