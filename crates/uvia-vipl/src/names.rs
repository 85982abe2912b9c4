//! Names: device names of the time mapped to uvia providers, and the hosts
//! file of the name service. Pure functions over text and lists, so they
//! are tested without a Nic; the few that ask the system say so.

use std::net::Ipv4Addr;
use std::path::Path;

/// The udp port of `/dev/via_ethN` and of a host name the system's
/// resolver finds, unless `VIPL_PORT` says otherwise: every host of a
/// cluster then listens where the others look, with no file.
pub const DEFAULT_PORT: u16 = 7100;

/// What a device name opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Device {
    /// A uvia provider name, as mapped or as given.
    Provider(String),
    /// `/dev/via_ethN` with no mapping: udp on the N-th interface
    /// ([`nth_interface`]) at the default port.
    Ethernet(usize),
}

/// What a device name opens. `devices` is the `VIPL_DEVICES` value, `conf`
/// the text of the configuration file, if any; the first that maps the name
/// wins, then the defaults (`/dev/via_lo` is `shm`, `/dev/via_ethN` the
/// N-th interface). A name that maps nowhere is returned as it is: it may
/// be a uvia provider name.
pub fn device_for(device: &str, devices: Option<&str>, conf: Option<&str>) -> Device {
    let p = provider_for(device, devices, conf);
    if p == device {
        if let Some(n) = device
            .strip_prefix("/dev/via_eth")
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse().ok())
        {
            return Device::Ethernet(n);
        }
    }
    Device::Provider(p)
}

/// The provider name a device name is mapped to (`VIPL_DEVICES`, the
/// configuration file, then `/dev/via_lo` to `shm`), or the name itself.
fn provider_for(device: &str, devices: Option<&str>, conf: Option<&str>) -> String {
    let from_env = devices.and_then(|d| {
        d.split(';').find_map(|pair| {
            let (dev, prov) = pair.split_once('=')?;
            (dev.trim() == device).then(|| prov.trim().to_string())
        })
    });
    let from_conf = || {
        conf.and_then(|text| {
            fields(text).find_map(|f| match f.as_slice() {
                [dev, prov] if *dev == device => Some(prov.to_string()),
                _ => None,
            })
        })
    };
    if let Some(p) = from_env.or_else(from_conf) {
        return p;
    }
    match device {
        "/dev/via_lo" => "shm".to_string(),
        _ => device.to_string(),
    }
}

/// A network interface as `/dev/via_ethN` counts them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub index: u32,
    pub up: bool,
    pub loopback: bool,
    /// Its IPv4 addresses, in the system's order.
    pub ipv4: Vec<Ipv4Addr>,
}

/// The interfaces `/dev/via_ethN` counts, in order: up, not loopback, with
/// an IPv4 address; by interface index, so the count does not depend on the
/// order the system lists them in.
pub fn counted(ifaces: &[Interface]) -> Vec<&Interface> {
    let mut v: Vec<&Interface> = ifaces
        .iter()
        .filter(|i| i.up && !i.loopback && !i.ipv4.is_empty())
        .collect();
    v.sort_by_key(|i| i.index);
    v
}

/// The udp provider name `/dev/via_eth<n>` opens: the `n`-th counted
/// interface's first IPv4 address at `port`; else a line saying what was
/// looked for and what there is.
pub fn nth_interface(ifaces: &[Interface], n: usize, port: u16) -> Result<String, String> {
    let c = counted(ifaces);
    match c.get(n) {
        Some(i) => Ok(format!("udp:{}:{port}", i.ipv4[0])),
        None => {
            let have: Vec<String> = c
                .iter()
                .map(|i| format!("{} {}", i.name, i.ipv4[0]))
                .collect();
            Err(format!(
                "no interface #{n} (counting from 0) that is up, not loopback and has an IPv4 address; \
                 this host has {}{}{}; map the device in VIPL_DEVICES or /etc/vipl.conf \
                 (\"/dev/via_eth{n} udp:<ip>:<port>\")",
                c.len(),
                if have.is_empty() { "" } else { ": " },
                have.join(", ")
            ))
        }
    }
}

/// This host's interfaces and their IPv4 addresses.
pub fn system_interfaces() -> std::io::Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out: Vec<Interface> = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is an entry of the list getifaddrs made, not yet freed.
        let e = unsafe { &*p };
        p = e.ifa_next;
        // SAFETY: ifa_name is a C string of the entry.
        let name = unsafe { std::ffi::CStr::from_ptr(e.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let i = match out.iter().position(|i| i.name == name) {
            Some(k) => k,
            None => {
                // SAFETY: ifa_name is a C string.
                let index = unsafe { libc::if_nametoindex(e.ifa_name) };
                out.push(Interface {
                    name,
                    index,
                    up: e.ifa_flags & libc::IFF_UP as u32 != 0,
                    loopback: e.ifa_flags & libc::IFF_LOOPBACK as u32 != 0,
                    ipv4: Vec::new(),
                });
                out.len() - 1
            }
        };
        // SAFETY: a non-NULL ifa_addr points at a sockaddr of its family;
        // for AF_INET it is a sockaddr_in.
        if !e.ifa_addr.is_null() && unsafe { (*e.ifa_addr).sa_family } as i32 == libc::AF_INET {
            // SAFETY: as above.
            let sin = unsafe { &*(e.ifa_addr as *const libc::sockaddr_in) };
            out[i]
                .ipv4
                .push(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
        }
    }
    // SAFETY: the list getifaddrs made, freed once; nothing points into it.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The default port: `VIPL_PORT` (1..=65535), else [`DEFAULT_PORT`].
pub fn default_port(var: Option<&str>) -> Result<u16, String> {
    match var {
        None => Ok(DEFAULT_PORT),
        Some(v) => v
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("VIPL_PORT={v:?}: want a port number, 1 to 65535")),
    }
}

/// A line of the hosts file: a name, the provider it is reached by, and its
/// address on that provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostEntry {
    pub name: String,
    pub provider: String,
    pub address: String,
}

/// Why a hosts file was refused.
#[derive(Debug, PartialEq, Eq)]
pub struct HostsError {
    pub line: usize,
    pub text: String,
}

impl std::fmt::Display for HostsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "line {}: {:?}: want \"<name> <provider> <address>\"",
            self.line, self.text
        )
    }
}

/// Parses a hosts file: `<name> <provider> <address>` lines, `#` comments.
pub fn parse_hosts(text: &str) -> Result<Vec<HostEntry>, HostsError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let body = line.split('#').next().unwrap_or("");
        let f: Vec<&str> = body.split_whitespace().collect();
        match f.as_slice() {
            [] => {}
            [name, provider, address] => out.push(HostEntry {
                name: name.to_string(),
                provider: provider.to_string(),
                address: address.to_string(),
            }),
            _ => {
                return Err(HostsError {
                    line: i + 1,
                    text: line.to_string(),
                })
            }
        }
    }
    Ok(out)
}

/// The largest configuration or hosts file read: a table of names, not
/// a device's stream.
pub const MAX_FILE: u64 = 1 << 20;

/// The text of a small regular file: `NotFound` if there is none; an
/// error for anything else at `path` (a FIFO would block, a device never
/// end) or a file over [`MAX_FILE`].
pub fn read_small_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Not blocking: a FIFO's open would wait for a writer.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut text = String::new();
    f.take(MAX_FILE + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_FILE {
        return Err(std::io::Error::other(format!(
            "longer than {MAX_FILE} bytes"
        )));
    }
    Ok(text)
}

/// Reads the hosts file at `path`; a missing file is an empty table
/// unless `required` (a path the program named).
pub fn read_hosts(path: &Path, required: bool) -> Result<Vec<HostEntry>, String> {
    match read_small_file(path) {
        Ok(text) => parse_hosts(&text).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => Ok(Vec::new()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Whitespace-separated fields of each non-empty, non-comment line.
fn fields(text: &str) -> impl Iterator<Item = Vec<&str>> {
    text.lines()
        .map(|l| {
            l.split('#')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect::<Vec<_>>()
        })
        .filter(|f| !f.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Device {
        Device::Provider(s.to_string())
    }

    #[test]
    fn devices_map_by_env_then_file_then_defaults() {
        let env = Some("/dev/via_eth0=udp:10.0.0.1 ; /dev/via_eth1=xdp:veth1");
        let conf = Some("# devices\n/dev/via_eth1 udp:10.0.0.2\n/dev/via_lo shm:7\n/dev/via_eth5 udp:10.0.0.5\n");
        assert_eq!(device_for("/dev/via_eth0", env, conf), p("udp:10.0.0.1"));
        assert_eq!(device_for("/dev/via_eth1", env, conf), p("xdp:veth1"));
        assert_eq!(device_for("/dev/via_eth5", env, conf), p("udp:10.0.0.5"));
        assert_eq!(device_for("/dev/via_lo", env, conf), p("shm:7"));
        assert_eq!(device_for("/dev/via_lo", None, None), p("shm"));
        assert_eq!(device_for("/dev/via_eth3", None, None), Device::Ethernet(3));
        assert_eq!(
            device_for("/dev/via_eth12", env, conf),
            Device::Ethernet(12)
        );
        assert_eq!(device_for("/dev/via_ethX", None, None), p("/dev/via_ethX"));
        assert_eq!(device_for("/dev/via_eth", None, None), p("/dev/via_eth"));
        assert_eq!(device_for("udp:127.0.0.1", env, conf), p("udp:127.0.0.1"));
    }

    fn iface(name: &str, index: u32, up: bool, lo: bool, ips: &[&str]) -> Interface {
        Interface {
            name: name.into(),
            index,
            up,
            loopback: lo,
            ipv4: ips.iter().map(|s| s.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn ethernet_devices_count_up_non_loopback_ipv4_interfaces_by_index() {
        // Listed out of index order; lo, a down one and one without IPv4
        // are not counted.
        let ifs = [
            iface("eth1", 4, true, false, &["10.0.1.5", "10.0.1.6"]),
            iface("lo", 1, true, true, &["127.0.0.1"]),
            iface("eth0", 2, true, false, &["10.0.0.5"]),
            iface("down0", 3, false, false, &["10.0.9.5"]),
            iface("v6only", 5, true, false, &[]),
        ];
        assert_eq!(nth_interface(&ifs, 0, 7100).unwrap(), "udp:10.0.0.5:7100");
        assert_eq!(nth_interface(&ifs, 1, 7345).unwrap(), "udp:10.0.1.5:7345");
        let e = nth_interface(&ifs, 2, 7100).unwrap_err();
        assert!(
            e.contains("no interface #2") && e.contains("has 2: eth0 10.0.0.5, eth1 10.0.1.5"),
            "{e}"
        );
        assert!(
            e.contains("VIPL_DEVICES") && e.contains("/etc/vipl.conf"),
            "{e}"
        );
        let e = nth_interface(&ifs[1..2], 0, 7100).unwrap_err();
        assert!(e.contains("this host has 0;"), "{e}");
    }

    #[test]
    fn the_port_is_vipl_port_or_7100() {
        assert_eq!(default_port(None), Ok(7100));
        assert_eq!(default_port(Some("7345")), Ok(7345));
        for bad in ["0", "65536", "http", ""] {
            let e = default_port(Some(bad)).unwrap_err();
            assert!(e.contains("VIPL_PORT"), "{e}");
        }
    }

    #[test]
    fn this_host_has_interfaces_with_names_and_indexes() {
        let ifs = system_interfaces().unwrap();
        // Every Linux host has a loopback interface, with an index.
        assert!(
            ifs.iter()
                .any(|i| i.loopback && i.index > 0 && !i.name.is_empty()),
            "{ifs:?}"
        );
    }

    /// A configuration or hosts file is a small regular file: a device
    /// or a FIFO is refused at once (neither read without end nor waited
    /// on), a large file too; a missing file is an empty table unless
    /// the program named it.
    #[test]
    fn only_small_regular_files_are_read() {
        let dir = std::env::temp_dir().join(format!("uvia-vipl-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for p in [Path::new("/dev/zero"), fifo.as_path()] {
            let e = read_small_file(p).unwrap_err();
            assert!(e.to_string().contains("not a regular file"), "{p:?}: {e}");
            assert!(read_hosts(p, false).is_err(), "{p:?}");
        }
        let big = dir.join("big");
        std::fs::write(&big, vec![b'#'; MAX_FILE as usize + 1]).unwrap();
        assert!(read_small_file(&big)
            .unwrap_err()
            .to_string()
            .contains("longer than"));
        let hosts = dir.join("hosts");
        std::fs::write(&hosts, "node1 udp 10.0.0.1:7000\n").unwrap();
        assert_eq!(read_hosts(&hosts, true).unwrap().len(), 1);
        let missing = dir.join("missing");
        assert_eq!(read_hosts(&missing, false).unwrap(), Vec::new());
        assert!(read_hosts(&missing, true).unwrap_err().contains("missing"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn hosts_file_parses_and_names_bad_lines() {
        let t = "# cluster\nnode1 udp 10.0.0.1:7000\n\nlocal shm 0 # this host\nnode1 udp 10.0.1.1:7000\n";
        let h = parse_hosts(t).unwrap();
        assert_eq!(h.len(), 3);
        assert_eq!(
            h[1],
            HostEntry {
                name: "local".into(),
                provider: "shm".into(),
                address: "0".into()
            }
        );
        let e = parse_hosts("ok udp 1.2.3.4:5\nbroken line\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.to_string().contains("broken line"));
    }
}
