//! The peers' tools' output, read into figures.

use anyhow::{anyhow, bail, Context, Result};

/// `ucx_perftest`'s `Final:` line: latency (one way for the latency tests)
/// and bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UcxFinal {
    /// 50th percentile of the per-iteration time, us.
    pub p50_us: f64,
    /// Mean per iteration, us.
    pub avg_us: f64,
    /// Bandwidth over the whole run, MB/s (10^6 B; the tool prints MiB/s).
    pub mbytes_per_s: f64,
}

/// Parses `ucx_perftest`'s output; its error lines when there is no result.
pub fn parse_ucx(out: &str) -> Result<UcxFinal> {
    let Some(line) = out.lines().find(|l| l.trim_start().starts_with("Final:")) else {
        let errs: Vec<&str> = out
            .lines()
            .filter(|l| l.contains("ERROR"))
            .map(|l| l.split("ERROR").nth(1).unwrap_or(l).trim())
            .collect();
        if errs.is_empty() {
            bail!("no Final: line in ucx_perftest's output");
        }
        bail!("ucx_perftest: {}", errs.join("; "));
    };
    // Final: iterations p50 average overall bw-average bw-overall rate-average rate-overall
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 9 {
        bail!(
            "ucx_perftest's Final: line has {} fields: {line:?}",
            f.len()
        );
    }
    let num = |s: &str| -> Result<f64> {
        s.replace(',', "")
            .parse::<f64>()
            .with_context(|| format!("ucx_perftest's figure {s:?} in {line:?}"))
    };
    Ok(UcxFinal {
        p50_us: num(f[2])?,
        avg_us: num(f[3])?,
        mbytes_per_s: num(f[6])? * 1.048576,
    })
}

/// NetPIPE's result line for one size: size and one-way time (us).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetPipe {
    pub size: usize,
    /// Half the round trip of its best trial, us.
    pub one_way_us: f64,
}

/// Parses NetPIPE's progress line `N: SIZE bytes REPS times --> X Mbps in T usec`.
pub fn parse_netpipe(out: &str) -> Result<NetPipe> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.contains("times -->") && l.contains("usec"))
        .ok_or_else(|| anyhow!("no result line in NetPIPE's output"))?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let at = |word: &str, off: isize| -> Result<&str> {
        let i = f
            .iter()
            .position(|w| *w == word)
            .ok_or_else(|| anyhow!("no {word:?} in NetPIPE's line {line:?}"))?;
        f.get((i as isize + off) as usize)
            .copied()
            .ok_or_else(|| anyhow!("NetPIPE's line {line:?} ends early"))
    };
    let size = at("bytes", -1)?
        .parse::<usize>()
        .with_context(|| format!("NetPIPE's size in {line:?}"))?;
    let us = at("usec", -1)?
        .parse::<f64>()
        .with_context(|| format!("NetPIPE's time in {line:?}"))?;
    Ok(NetPipe {
        size,
        one_way_us: us,
    })
}

/// `sockperf ping-pong`'s one-way latency: median and mean, us.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sockperf {
    pub p50_us: f64,
    pub avg_us: f64,
    pub observations: usize,
}

/// Drops the terminal colour sequences sockperf writes around some lines.
pub(super) fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            if it.peek() == Some(&'[') {
                it.next();
                for d in it.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

pub fn parse_sockperf(out: &str) -> Result<Sockperf> {
    let text = strip_ansi(out);
    let after = |key: &str| -> Option<f64> {
        text.lines().find_map(|l| {
            let i = l.find(key)?;
            l[i + key.len()..]
                .trim_start()
                .split(|c: char| c.is_whitespace() || c == '(')
                .next()?
                .parse::<f64>()
                .ok()
        })
    };
    let p50 = after("percentile 50.000 =")
        .ok_or_else(|| anyhow!("no median (percentile 50.000) in sockperf's output"))?;
    let avg = after("avg-latency=").unwrap_or(f64::NAN);
    let obs = after("Total ").map(|x| x as usize).unwrap_or(0);
    Ok(Sockperf {
        p50_us: p50,
        avg_us: avg,
        observations: obs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(name: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/peers")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn parses_ucx_perftest_latency() {
        let r = parse_ucx(&sample("ucx-am_lat-8.txt")).unwrap();
        assert_eq!(r.p50_us, 0.125);
        assert_eq!(r.avg_us, 0.133);
        let t = parse_ucx(&sample("ucx-tag_lat-8.txt")).unwrap();
        assert_eq!(t.p50_us, 0.196);
    }

    #[test]
    fn parses_ucx_perftest_bandwidth_in_decimal_megabytes() {
        let r = parse_ucx(&sample("ucx-put_bw-1m.txt")).unwrap();
        // 10116.51 MiB/s printed.
        assert!((r.mbytes_per_s - 10116.51 * 1.048576).abs() < 1e-6);
    }

    #[test]
    fn ucx_perftest_error_is_quoted() {
        let e = parse_ucx(&sample("ucx-am_bw-64k-unsupported.txt"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("larger than max supported"), "{e}");
        assert!(parse_ucx("nothing here").is_err());
    }

    #[test]
    fn parses_fi_pingpong_at_one_mebibyte() {
        let r = crate::fabric::parse(&sample("fi_pingpong-rxd-1m.txt"), 1 << 20).unwrap();
        // 1 MiB at 60.98 MB/s; the line prints 17195.09 us.
        assert!((r.mean_ns - 17_195_409.0).abs() < 1.0, "{}", r.mean_ns);
    }

    #[test]
    fn parses_netpipe() {
        let r = parse_netpipe(&sample("netpipe-8.txt")).unwrap();
        assert_eq!(
            r,
            NetPipe {
                size: 8,
                one_way_us: 0.51
            }
        );
        let r = parse_netpipe(&sample("netpipe-1m.txt")).unwrap();
        assert_eq!(r.size, 1 << 20);
        assert_eq!(r.one_way_us, 922.28);
        assert!(parse_netpipe("Using no perturbations\n").is_err());
    }

    #[test]
    fn parses_sockperf_through_its_colours() {
        let r = parse_sockperf(&sample("sockperf-pp-14.txt")).unwrap();
        assert_eq!(r.p50_us, 19.671);
        assert_eq!(r.avg_us, 55.338);
        assert_eq!(r.observations, 4983);
        assert!(parse_sockperf("sockperf: Test ended\n").is_err());
    }

    #[test]
    fn strips_colour_sequences() {
        assert_eq!(strip_ansi("a\u{1b}[2;35mb\u{1b}[0mc"), "abc");
    }
}
