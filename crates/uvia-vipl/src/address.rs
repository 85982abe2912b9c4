//! Host addresses as `VIP_NET_ADDRESS` carries them: binary and of M-VIA's
//! size, so that programs which keep a peer's address in a buffer sized for
//! a 6-byte MAC keep working. The core names hosts in text (`10.0.0.1:7100`,
//! `02:00:00:00:00:01`, an shm instance); this module is the one place that
//! converts between the two, at the boundary of the C API.
//!
//! | NIC | bytes | layout |
//! | --- | --- | --- |
//! | udp, IPv4 | 6 | the address's 4 bytes, then the port's 2, network order |
//! | udp, IPv6 | 18 | the address's 16 bytes, then the port's 2, network order |
//! | xdp | 6 | the MAC address |
//! | shm | 6 | the instance name (at most 6 characters), NUL-padded |

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use uvia::NicAttributes;
use uvia_net::MacAddr;

/// The longest host address any NIC has: an IPv6 udp address.
pub const MAX_LEN: usize = 18;
/// The length of every other host address (M-VIA's MAC address).
pub const SHORT_LEN: usize = 6;

/// How a NIC's provider writes its host addresses, read from its
/// attributes (never its name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// A host-local instance name (shm).
    Instance,
    /// An IP address and port (udp).
    Ip,
    /// An Ethernet address (xdp).
    Mac,
}

impl Form {
    /// The form of a NIC's addresses: what its own address looks like.
    pub fn of(a: &NicAttributes) -> Form {
        if a.host_local {
            Form::Instance
        } else if a.address.parse::<SocketAddr>().is_ok() {
            Form::Ip
        } else {
            Form::Mac
        }
    }
}

/// A host address in its binary form: `len` bytes of `bytes`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HostBytes {
    len: u8,
    bytes: [u8; MAX_LEN],
}

impl HostBytes {
    fn new(b: &[u8]) -> HostBytes {
        let mut bytes = [0u8; MAX_LEN];
        bytes[..b.len()].copy_from_slice(b);
        HostBytes {
            len: b.len() as u8,
            bytes,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl std::fmt::Debug for HostBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.as_slice() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Why an address was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum AddressError {
    /// Binary: a length this NIC's addresses never have.
    Length { form: Form, len: usize },
    /// Binary: the bytes are no address of the form.
    Malformed(Form),
    /// Text: not an address of the form, or one that does not fit (an shm
    /// instance name over 6 characters).
    Text { form: Form, text: String },
}

impl std::fmt::Display for AddressError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AddressError::Length { form, len } => {
                write!(f, "a host address of {len} bytes; {}", form.wants())
            }
            AddressError::Malformed(form) => {
                write!(
                    f,
                    "host address bytes that are no address: {}",
                    form.wants()
                )
            }
            AddressError::Text { form, text } => write!(f, "{text:?}: {}", form.wants()),
        }
    }
}

impl Form {
    /// What an address of this form is, for messages.
    fn wants(self) -> &'static str {
        match self {
            Form::Instance => {
                "an shm host address is the instance name, at most 6 letters, digits, '-' or '_', NUL-padded to 6 bytes"
            }
            Form::Ip => {
                "a udp host address is 6 bytes (IPv4 address, port) or 18 (IPv6 address, port), network order"
            }
            Form::Mac => "an xdp host address is the 6-byte MAC address",
        }
    }
}

fn instance_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// The binary form of the core's host text `text`.
pub fn encode(form: Form, text: &str) -> Result<HostBytes, AddressError> {
    let bad = || AddressError::Text {
        form,
        text: text.to_string(),
    };
    match form {
        Form::Instance => {
            let b = text.as_bytes();
            if b.is_empty() || b.len() > SHORT_LEN || !b.iter().all(|&c| instance_char(c)) {
                return Err(bad());
            }
            let mut out = [0u8; SHORT_LEN];
            out[..b.len()].copy_from_slice(b);
            Ok(HostBytes::new(&out))
        }
        Form::Ip => {
            let sa: SocketAddr = text.parse().map_err(|_| bad())?;
            let port = sa.port().to_be_bytes();
            Ok(match sa.ip() {
                IpAddr::V4(ip) => {
                    let mut out = [0u8; 6];
                    out[..4].copy_from_slice(&ip.octets());
                    out[4..].copy_from_slice(&port);
                    HostBytes::new(&out)
                }
                IpAddr::V6(ip) => {
                    let mut out = [0u8; 18];
                    out[..16].copy_from_slice(&ip.octets());
                    out[16..].copy_from_slice(&port);
                    HostBytes::new(&out)
                }
            })
        }
        Form::Mac => {
            let m: MacAddr = text.parse().map_err(|_| bad())?;
            Ok(HostBytes::new(&m.0))
        }
    }
}

/// The core's host text for the binary address `b`.
pub fn decode(form: Form, b: &[u8]) -> Result<String, AddressError> {
    let wrong_len = || AddressError::Length { form, len: b.len() };
    match form {
        Form::Instance => {
            if b.len() != SHORT_LEN {
                return Err(wrong_len());
            }
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            let (name, pad) = b.split_at(end);
            if name.is_empty()
                || !name.iter().all(|&c| instance_char(c))
                || pad.iter().any(|&c| c != 0)
            {
                return Err(AddressError::Malformed(form));
            }
            // Checked above: every byte is an ASCII letter, digit, '-' or '_'.
            Ok(name.iter().map(|&c| c as char).collect())
        }
        Form::Ip => {
            let (ip, port): (IpAddr, [u8; 2]) = match b.len() {
                6 => (Ipv4Addr::new(b[0], b[1], b[2], b[3]).into(), [b[4], b[5]]),
                18 => {
                    let mut o = [0u8; 16];
                    o.copy_from_slice(&b[..16]);
                    (Ipv6Addr::from(o).into(), [b[16], b[17]])
                }
                _ => return Err(wrong_len()),
            };
            Ok(SocketAddr::new(ip, u16::from_be_bytes(port)).to_string())
        }
        Form::Mac => {
            let m: [u8; 6] = b.try_into().map_err(|_| wrong_len())?;
            Ok(MacAddr(m).to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_vectors() {
        // 10.1.2.3, port 7100 (0x1bbc).
        let v4 = encode(Form::Ip, "10.1.2.3:7100").unwrap();
        assert_eq!(v4.as_slice(), &[10, 1, 2, 3, 0x1b, 0xbc]);
        // ::1, port 1 (0x0001): fifteen zeros, a one, then the port.
        let v6 = encode(Form::Ip, "[::1]:1").unwrap();
        let mut want = [0u8; 18];
        want[15] = 1;
        want[17] = 1;
        assert_eq!(v6.as_slice(), &want);
        let mac = encode(Form::Mac, "02:AA:bb:0c:0d:ee").unwrap();
        assert_eq!(mac.as_slice(), &[0x02, 0xaa, 0xbb, 0x0c, 0x0d, 0xee]);
        // The default instance "0": its character, then five NULs.
        let shm = encode(Form::Instance, "0").unwrap();
        assert_eq!(shm.as_slice(), b"0\0\0\0\0\0");
        assert_eq!(
            encode(Form::Instance, "a-b_c9").unwrap().as_slice(),
            b"a-b_c9"
        );
    }

    #[test]
    fn round_trips() {
        for (form, text) in [
            (Form::Ip, "127.0.0.1:7100"),
            (Form::Ip, "10.0.0.255:0"),
            (Form::Ip, "[fe80::1:2]:65535"),
            (Form::Mac, "02:00:00:00:00:01"),
            (Form::Instance, "0"),
            (Form::Instance, "node_1"),
        ] {
            let b = encode(form, text).unwrap();
            assert_eq!(decode(form, b.as_slice()).unwrap(), text, "{text}");
            assert_eq!(
                encode(form, &decode(form, b.as_slice()).unwrap()).unwrap(),
                b
            );
        }
    }

    #[test]
    fn bad_lengths_and_bytes_are_refused() {
        for len in [0usize, 1, 5, 7, 17, 19, 48] {
            let b = vec![1u8; len];
            if len != 6 && len != 18 {
                assert_eq!(
                    decode(Form::Ip, &b),
                    Err(AddressError::Length {
                        form: Form::Ip,
                        len
                    })
                );
            }
            if len != 6 {
                assert!(matches!(
                    decode(Form::Mac, &b),
                    Err(AddressError::Length { .. })
                ));
                assert!(matches!(
                    decode(Form::Instance, &b),
                    Err(AddressError::Length { .. })
                ));
            }
        }
        let malformed = Err(AddressError::Malformed(Form::Instance));
        assert_eq!(decode(Form::Instance, b"\0\0\0\0\0\0"), malformed, "empty");
        assert_eq!(
            decode(Form::Instance, b"a\0b\0\0\0"),
            malformed,
            "bytes after the NUL"
        );
        assert_eq!(
            decode(Form::Instance, b"a/b\0\0\0"),
            malformed,
            "not an instance name"
        );
        // The old text form of an address is no binary address.
        assert!(decode(Form::Ip, b"127.0.0.1:7100").is_err());
    }

    #[test]
    fn text_that_does_not_fit_is_refused() {
        for (form, text) in [
            (Form::Instance, "seven77"),
            (Form::Instance, ""),
            (Form::Instance, "a b"),
            (Form::Ip, "10.0.0.1"),
            (Form::Ip, "host:7100"),
            (Form::Mac, "02:00:00:00:00"),
        ] {
            assert!(encode(form, text).is_err(), "{text:?}");
        }
        let e = encode(Form::Instance, "seven77").unwrap_err();
        assert!(e.to_string().contains("at most 6"), "{e}");
    }
}
