//! Test hosts: two network namespaces joined by a veth pair, with IPv4 and
//! IPv6 addresses that exist only inside them. Made with the `ip` command
//! (iproute2) and removed when dropped, so traffic between them never
//! leaves this machine.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Command;

/// One of the two hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

/// Making the test hosts failed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// Root, the `ip` command or namespace support is missing.
    #[error("test hosts unavailable: {0}")]
    Unavailable(String),
    /// An `ip` command failed.
    #[error("`ip {args}` failed: {stderr}")]
    Command { args: String, stderr: String },
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Two network namespaces `uvia-<tag>-a` and `uvia-<tag>-b` joined by a veth pair.
#[derive(Debug)]
pub struct TestHosts {
    names: [String; 2],
    net: u8,
    /// Both ends of the pair have the same name ([`ALIKE`]).
    alike: bool,
}

/// The interface name of both hosts made by [`TestHosts::create_alike`].
pub const ALIKE: &str = "uvia0";

fn ip(args: &[&str]) -> Result<(), NetnsError> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetnsError::Command {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

impl TestHosts {
    /// Whether test hosts can be made here; the reason when not, in one line.
    pub fn available() -> Result<(), String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root (network namespaces need CAP_SYS_ADMIN)".into());
        }
        match Command::new("ip").arg("-V").output() {
            Ok(o) if o.status.success() => {}
            _ => return Err("the `ip` command (iproute2) is not installed".into()),
        }
        if !std::path::Path::new("/proc/self/ns/net").exists() {
            return Err("the kernel has no network namespaces".into());
        }
        Ok(())
    }

    /// Makes the two hosts. `tag` (shortened, letters and digits kept)
    /// and this process's id name them, so concurrent runs do not collide.
    pub fn create(tag: &str) -> Result<TestHosts, NetnsError> {
        TestHosts::make(tag, false)
    }

    /// Makes two hosts whose ends of the pair are both named [`ALIKE`], as
    /// cluster nodes whose interfaces are named alike: a job that gives
    /// every host one interface name (an MPI job's
    /// `FI_UVIA_DOMAIN=udp:uvia0`) finds each host's own end.
    pub fn create_alike(tag: &str) -> Result<TestHosts, NetnsError> {
        TestHosts::make(tag, true)
    }

    fn make(tag: &str, alike: bool) -> Result<TestHosts, NetnsError> {
        TestHosts::available().map_err(NetnsError::Unavailable)?;
        let clean: String = tag
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(6)
            .collect();
        let pid = std::process::id();
        let seq = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("{clean}{:x}", (pid << 4) ^ seq);
        // A /24 inside 10.0.0.0/8 of the namespaces only, one per pair of
        // hosts on this machine: a launcher agent finds a host by its
        // address, so two pairs made at once must not share one.
        let names = [format!("uvia-{id}-a"), format!("uvia-{id}-b")];
        let net = claim_net(((pid ^ seq.wrapping_mul(97)) % NETS) as u8 + 1, &names)?;
        let hosts = TestHosts { names, net, alike };
        if let Err(e) = hosts.build() {
            // Dropping removes what was made and gives the /24 back.
            drop(hosts);
            return Err(e);
        }
        Ok(hosts)
    }

    fn build(&self) -> Result<(), NetnsError> {
        let [a, b] = &self.names;
        // veth names are at most 15 bytes.
        let (va, vb) = (self.iface(Side::A), self.iface(Side::B));
        ip(&["netns", "add", a])?;
        ip(&["netns", "add", b])?;
        ip(&[
            "link", "add", &va, "netns", a, "type", "veth", "peer", "name", &vb, "netns", b,
        ])?;
        for (ns, dev, side) in [(a, &va, Side::A), (b, &vb, Side::B)] {
            let v4 = format!("{}/24", self.ipv4(side));
            let v6 = format!("{}/64", self.ipv6(side));
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "addr", "add", &v4, "dev", dev])?;
            ip(&["-n", ns, "addr", "add", &v6, "dev", dev, "nodad"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(())
    }

    pub fn name(&self, side: Side) -> &str {
        &self.names[side as usize]
    }

    /// The host's end of the veth pair.
    pub fn iface(&self, side: Side) -> String {
        if self.alike {
            return ALIKE.into();
        }
        let a = &self.names[0];
        let tail = &a[5..a.len() - 2];
        let short = &tail[tail.len().saturating_sub(9)..];
        match side {
            Side::A => format!("va{short}"),
            Side::B => format!("vb{short}"),
        }
    }

    pub fn ipv4(&self, side: Side) -> Ipv4Addr {
        Ipv4Addr::new(10, 199, self.net, 1 + side as u8)
    }

    pub fn ipv6(&self, side: Side) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 0x7576, self.net as u16, 0, 0, 0, 0, 1 + side as u16)
    }

    /// A command that runs `program` on one host.
    pub fn command(&self, side: Side, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", self.name(side)]).arg(program);
        c
    }

    /// Moves the calling thread onto one host until the guard is dropped.
    /// Sockets the thread opens meanwhile belong to that host.
    pub fn enter(&self, side: Side) -> io::Result<NsGuard> {
        let here = std::fs::File::open("/proc/thread-self/ns/net")?;
        let there = std::fs::File::open(format!("/run/netns/{}", self.name(side)))?;
        // SAFETY: setns on a namespace file we opened; affects this thread only.
        if unsafe { libc::setns(there.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(NsGuard { back: here.into() })
    }
}

static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// How many /24s test hosts take from: 10.199.1.0 to 10.199.250.0.
const NETS: u32 = 250;

/// Where each pair of test hosts claims its /24: a file named for it,
/// holding the claiming process's id and the hosts' names.
const CLAIMS: &str = "/run/uvia-test-hosts";

fn claim_path(net: u8) -> std::path::PathBuf {
    std::path::Path::new(CLAIMS).join(format!("10.199.{net}"))
}

/// Claims a /24 no other pair of test hosts on this machine holds, trying
/// `first` and then the next ones, for the hosts `names`. A claim is a file
/// made only if absent, holding the claiming process's id and the hosts'
/// names, so two processes never take the same one; a claim whose process
/// has died (killed before it could remove its hosts) is taken over, and
/// the hosts it names, still holding the addresses, are removed first.
fn claim_net(first: u8, names: &[String; 2]) -> Result<u8, NetnsError> {
    use std::io::Write;
    std::fs::create_dir_all(CLAIMS)?;
    let me = std::process::id();
    for i in 0..NETS {
        let net = ((u32::from(first) - 1 + i) % NETS) as u8 + 1;
        let path = claim_path(net);
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    f.write_all(format!("{me} {} {}", names[0], names[1]).as_bytes())?;
                    return Ok(net);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&path).unwrap_or_default();
                    let mut words = holder.split_whitespace();
                    let dead = words
                        .next()
                        .and_then(|w| w.parse::<libc::pid_t>().ok())
                        .is_some_and(|p| {
                            // SAFETY: signal 0 only checks that the process exists.
                            let gone = unsafe { libc::kill(p, 0) } != 0;
                            gone && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
                        });
                    if !dead {
                        break;
                    }
                    for stale in words.filter(|w| w.starts_with("uvia-")) {
                        if std::path::Path::new("/run/netns").join(stale).exists() {
                            let _ = ip(&["netns", "del", stale]);
                        }
                    }
                    let _ = std::fs::remove_file(&path);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    Err(NetnsError::Unavailable(format!(
        "all {NETS} test host networks 10.199.x.0/24 are held (claims in {CLAIMS})"
    )))
}

/// Returns the thread to the namespace it came from when dropped.
pub struct NsGuard {
    back: OwnedFd,
}

impl Drop for NsGuard {
    fn drop(&mut self) {
        // SAFETY: setns back to the namespace file opened in `enter`.
        if unsafe { libc::setns(self.back.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            eprintln!(
                "uvia-net: could not return to the original network namespace: {}",
                io::Error::last_os_error()
            );
        }
    }
}

impl Drop for TestHosts {
    fn drop(&mut self) {
        // The veth pair first, while we wait: deleting a link is done when
        // the command returns, where a namespace's deletion leaves its
        // devices (and any XDP program and socket on them) to the kernel's
        // background cleanup, whose work then lands in whatever runs next.
        let (a, va) = (&self.names[0], self.iface(Side::A));
        let _ = ip(&["-n", a, "link", "del", &va]);
        for n in &self.names {
            if let Err(e) = ip(&["netns", "del", n]) {
                eprintln!("uvia-net: removing test host {n}: {e}");
            }
        }
        let _ = std::fs::remove_file(claim_path(self.net));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::udp::{UdpMedium, UdpOptions};
    use crate::{Medium, OutFrame, RecvBatch};
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    fn listed() -> String {
        Command::new("ip")
            .args(["netns", "list"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// Two pairs made at once never share a /24, even when both start
    /// from the same one; a claim left by a dead process is taken over (its
    /// hosts removed), and dropping the hosts gives their /24 back.
    #[test]
    fn each_pair_of_hosts_has_a_network_of_its_own() {
        if let Err(why) = TestHosts::available() {
            println!("skipped: {why}");
            return;
        }
        let one = TestHosts::create("claim").unwrap();
        let first = one.net;
        let stale = format!("uvia-stale{}-a", std::process::id());
        let names = [stale.clone(), "uvia-never-b".to_string()];
        let next = claim_net(first, &names).unwrap();
        assert_ne!(next, first);
        assert_eq!(
            std::fs::read_to_string(claim_path(first)).unwrap(),
            format!("{} {} {}", std::process::id(), one.names[0], one.names[1])
        );
        // A claim whose process has exited is free again, and the hosts it
        // names, left behind, are removed.
        let mut child = Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        ip(&["netns", "add", &stale]).unwrap();
        std::fs::write(claim_path(next), format!("{dead} {stale} uvia-never-b")).unwrap();
        assert_eq!(claim_net(next, &names).unwrap(), next);
        assert!(!listed().contains(&stale), "{}", listed());
        std::fs::remove_file(claim_path(next)).unwrap();
        drop(one);
        assert!(!claim_path(first).exists());
    }

    #[test]
    fn alike_hosts_name_both_ends_the_same() {
        if let Err(why) = TestHosts::available() {
            println!("skipped: {why}");
            return;
        }
        let hosts = TestHosts::create_alike("alike").unwrap();
        for side in [Side::A, Side::B] {
            assert_eq!(hosts.iface(side), ALIKE);
            let o = Command::new("ip")
                .args(["-n", hosts.name(side), "-4", "-o", "addr", "show", ALIKE])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&o.stdout);
            assert!(
                text.contains(&format!("inet {}/24", hosts.ipv4(side))),
                "{text}"
            );
        }
    }

    #[test]
    fn frames_cross_the_veth_pair_and_the_hosts_are_removed() {
        if let Err(why) = TestHosts::available() {
            println!("skipped: {why}");
            return;
        }
        let hosts = TestHosts::create("nt").unwrap();
        let names = [
            hosts.name(Side::A).to_string(),
            hosts.name(Side::B).to_string(),
        ];
        for v6 in [false, true] {
            let addr = |s| -> SocketAddr {
                if v6 {
                    (hosts.ipv6(s), 0).into()
                } else {
                    (hosts.ipv4(s), 0).into()
                }
            };
            let b = {
                let _g = hosts.enter(Side::B).unwrap();
                UdpMedium::bind(addr(Side::B), UdpOptions::default()).unwrap()
            };
            let a = {
                let _g = hosts.enter(Side::A).unwrap();
                UdpMedium::bind(addr(Side::A), UdpOptions::default()).unwrap()
            };
            assert!(
                a.caps().max_frame <= 1472,
                "veth MTU: {}",
                a.caps().max_frame
            );
            let data: Vec<Vec<u8>> = (0..20).map(|i| vec![i as u8; 1000]).collect();
            let out: Vec<OutFrame<'_>> = data
                .iter()
                .map(|d| OutFrame {
                    to: b.local_addr(),
                    bytes: d,
                })
                .collect();
            let mut got = vec![];
            let mut batch = RecvBatch::new(64, 65_536);
            let start = Instant::now();
            // Neighbour discovery may drop the first frames; send until they pass.
            while got.len() < data.len() && start.elapsed() < Duration::from_secs(5) {
                if got.is_empty() {
                    a.send(&out).unwrap();
                }
                b.wait(Some(Duration::from_millis(50))).unwrap();
                b.recv(&mut batch).unwrap();
                got.extend(batch.iter().map(|(from, f)| {
                    assert_eq!(from, a.local_addr());
                    f.to_vec()
                }));
            }
            assert!(got.len() >= data.len(), "frames crossed (v6: {v6})");
            let sa = a.local_ip();
            assert_eq!(sa.is_ipv6(), v6);
        }
        drop(hosts);
        let after = listed();
        for n in names {
            assert!(!after.contains(&n), "{n} removed");
        }
    }
}
