//! Names: device names of the time mapped to uvia providers, and the hosts
//! file of the name service. Pure functions over text, so they are tested
//! without a Nic.

use std::path::Path;

/// The provider name a device name opens. `devices` is the `VIPL_DEVICES`
/// value, `conf` the text of the configuration file, if any; the first that
/// maps the name wins, then the defaults (`/dev/via_lo` is `shm`,
/// `/dev/via_ethN` is `udp`). A name that maps nowhere is returned as it
/// is: it may be a uvia provider name.
pub fn provider_for(device: &str, devices: Option<&str>, conf: Option<&str>) -> String {
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
    match device.strip_prefix("/dev/via_") {
        Some("lo") => "shm".to_string(),
        Some(eth) if eth.starts_with("eth") && eth[3..].bytes().all(|b| b.is_ascii_digit()) => {
            "udp".to_string()
        }
        _ => device.to_string(),
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

/// Reads the hosts file at `path`; a missing file is an empty table.
pub fn read_hosts(path: &Path) -> Result<Vec<HostEntry>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_hosts(&text).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
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

    #[test]
    fn devices_map_by_env_then_file_then_defaults() {
        let env = Some("/dev/via_eth0=udp:10.0.0.1 ; /dev/via_eth1=xdp:veth1");
        let conf = Some("# devices\n/dev/via_eth1 udp:10.0.0.2\n/dev/via_lo shm:7\n");
        assert_eq!(provider_for("/dev/via_eth0", env, conf), "udp:10.0.0.1");
        assert_eq!(provider_for("/dev/via_eth1", env, conf), "xdp:veth1");
        assert_eq!(provider_for("/dev/via_lo", env, conf), "shm:7");
        assert_eq!(provider_for("/dev/via_lo", None, None), "shm");
        assert_eq!(provider_for("/dev/via_eth3", None, None), "udp");
        assert_eq!(provider_for("/dev/via_ethX", None, None), "/dev/via_ethX");
        assert_eq!(provider_for("udp:127.0.0.1", env, conf), "udp:127.0.0.1");
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
