//! Message-size arguments: `8`, `1K`, `64k`, `1M`, `1MiB` (K and M are binary).

use anyhow::{bail, Context, Result};

/// The largest message the tool will send (64 MiB).
pub const MAX_SIZE: usize = 64 << 20;

/// Parses one size.
pub fn parse_size(s: &str) -> Result<usize> {
    let t = s.trim();
    if t.is_empty() {
        bail!("empty size");
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        bail!("bad size {s:?}: expected a number such as 8, 1K or 1M");
    }
    let n: usize = num.parse().with_context(|| format!("bad size {s:?}"))?;
    let mult: usize = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        other => bail!("bad size {s:?}: unknown suffix {other:?} (use K or M, binary)"),
    };
    let v = n
        .checked_mul(mult)
        .with_context(|| format!("size {s:?} is too large"))?;
    if v == 0 {
        bail!("size {s:?} is zero: messages must be at least 1 byte");
    }
    if v > MAX_SIZE {
        bail!("size {s:?} is larger than the 64 MiB limit");
    }
    Ok(v)
}

/// Parses a comma-separated list of sizes (a trailing comma is let pass;
/// an empty item between two is a typo). A size may come again: each is a
/// slice of one ping-pong, as the anatomy's traced runs take them.
pub fn parse_sizes(s: &str) -> Result<Vec<usize>> {
    let items: Vec<&str> = s.trim().trim_end_matches(',').split(',').collect();
    if items.iter().all(|p| p.trim().is_empty()) {
        bail!("no sizes given");
    }
    let mut v = Vec::with_capacity(items.len());
    for (i, p) in items.iter().enumerate() {
        if p.trim().is_empty() {
            bail!("an empty size in {s:?} (item {})", i + 1);
        }
        v.push(parse_size(p)?);
    }
    Ok(v)
}

/// A size as people write it: 8 B, 1 KiB, 64 KiB, 1 MiB.
pub fn human(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("1K").unwrap(), 1024);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("2MiB").unwrap(), 2 << 20);
        assert_eq!(parse_size(" 16 ").unwrap(), 16);
        assert_eq!(parse_sizes("1,8,1K").unwrap(), vec![1, 8, 1024]);
    }

    #[test]
    fn bad_sizes() {
        for s in [
            "",
            "0",
            "K",
            "1G",
            "abc",
            "-1",
            "1.5K",
            "65M",
            "99999999999999999999",
        ] {
            assert!(parse_size(s).is_err(), "{s:?} should be rejected");
        }
        assert!(parse_sizes(",").is_err());
        assert_eq!(parse_sizes("8,16,").unwrap(), vec![8, 16]);
        let e = parse_sizes("8,,16").unwrap_err().to_string();
        assert!(e.contains("empty size") && e.contains("item 2"), "{e}");
        assert_eq!(parse_sizes("8,8,8").unwrap(), vec![8, 8, 8]);
        assert!(parse_sizes("8,x").is_err());
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(8), "8 B");
        assert_eq!(human(1024), "1 KiB");
        assert_eq!(human(1 << 20), "1 MiB");
        assert_eq!(human(1500), "1500 B");
    }
}
