//! The measured comparisons read into uvia-shaped rows and the issue's
//! headline rows: no process run, no file touched.

use super::defs::{Form, Medium, Stat};
use super::{Bare, Comparison, PeerInfo, PeerRun};
use crate::bench::Headline;
use crate::run::{CpuUse, RunResult, SizeResult};
use crate::stats::Stats;

pub(super) fn form_name(f: Form) -> &'static str {
    match f {
        Form::Latency => "latency",
        Form::Stream => "streamed bandwidth",
        Form::PingpongBw => "ping-pong bandwidth",
    }
}

/// Each peer's figures as uvia-shaped rows: one `pingpong` row (latency and
/// ping-pong bandwidth) and one `bw` row (streamed) per peer, one entry per
/// size it measured (the median of its pairs).
pub(super) fn rows(infos: &[PeerInfo], comps: &[Comparison]) -> Vec<PeerRun> {
    let mut out = Vec::new();
    for info in infos.iter().filter(|i| i.missing.is_none()) {
        for kind in ["pingpong", "bw"] {
            let mut results: Vec<SizeResult> = Vec::new();
            for c in comps.iter().filter(|c| {
                c.peer == info.name
                    && c.peer_median.is_some()
                    && (c.form == Form::Stream) == (kind == "bw")
            }) {
                let v = c.peer_median.unwrap_or(f64::NAN);
                let (t, mbps) = match c.form {
                    Form::Latency => (v, c.size as f64 / v * 1e3),
                    _ => (c.size as f64 / v * 1e3, v),
                };
                let unknown = f64::NAN;
                let lat = Stats {
                    min: unknown,
                    p50: if c.stat == Stat::P50 { t } else { unknown },
                    p99: unknown,
                    mean: if c.stat == Stat::P50 { unknown } else { t },
                };
                match results.iter_mut().find(|r| r.size == c.size) {
                    Some(r) => {
                        if c.form != Form::Latency {
                            r.mbytes_per_s = mbps;
                        }
                    }
                    None => results.push(SizeResult {
                        size: c.size,
                        iters: c.iters,
                        lat_ns: lat,
                        mbytes_per_s: mbps,
                        msgs_per_s: if t > 0.0 { 1e9 / t } else { unknown },
                        cpu: CpuUse {
                            client: unknown,
                            server: unknown,
                        },
                    }),
                }
            }
            if results.is_empty() {
                continue;
            }
            results.sort_by_key(|r| r.size);
            out.push(PeerRun {
                run: RunResult {
                    command: kind.into(),
                    provider: info.name.clone(),
                    mode: "polling".into(),
                    results,
                    lossless: Vec::new(),
                },
                version: info.version.clone().unwrap_or_default(),
            });
        }
    }
    out
}

/// What the two sides of a comparison do differently where that is known
/// to decide it, said beside a loss in the report: the peers' own tests
/// are not always doing uvia's work.
pub(super) fn difference(c: &Comparison) -> Option<&'static str> {
    match (c.peer.as_str(), c.form) {
        ("ucx-uct-am", Form::Latency) if c.size > 8 => Some(
            "the peer's test handler reads the message's first byte (its sequence number) \
             in the receive FIFO and never the payload, whose lines stay in the sender's cache; \
             uvia's receive places every byte into the posted buffer, and the payload \
             crosses the cores",
        ),
        ("ucx-uct-put", Form::Latency) => Some(
            "UCT's short put is a copy into the peer's mapped memory with no checks; \
             uvia's write by copy checks, under the VI's lock, that the VI is connected, \
             nothing is queued ahead of it and the peer's grant of the window stands \
             (about 80 instructions, the target's line asked for before them); both sit \
             near the bare exchange below, where a step of the clock either way is often \
             the host's",
        ),
        _ => None,
    }
}

/// What uvia ran in a comparison's pairs: its send, or (against a peer's
/// put) its one-sided write.
fn uvia_side(c: &Comparison) -> &'static str {
    if c.uvia_command.contains("--rdma-write") {
        "uvia's one-sided RDMA write"
    } else {
        "uvia's send"
    }
}

/// The 8-byte shared-memory latencies against the bare exchange
/// ([`Bare`]): one line per comparison, uvia's and the peer's medians as
/// multiples of it, so that a loss there reads as what it is.
pub(super) fn against_bare(comps: &[Comparison], bare: &Bare) -> Vec<String> {
    let f = bare.ns();
    if f <= 0.0 {
        return Vec::new();
    }
    comps
        .iter()
        .filter(|c| c.medium == Medium::Shm && c.form == Form::Latency && c.size == 8)
        .filter_map(|c| {
            let (u, q) = (c.uvia_median?, c.peer_median?);
            Some(format!(
                "{} 8 B: {} {u:.0} ns ({:.2}x the bare exchange), the peer {q:.0} ns ({:.2}x)",
                c.peer,
                uvia_side(c),
                u / f,
                q / f
            ))
        })
        .collect()
}

/// The comparisons, from the pairs already measured.
pub(super) fn headlines(comps: &[Comparison]) -> Vec<Headline> {
    let find = |peer: &str, form: Form, size: usize| {
        comps
            .iter()
            .find(|c| c.peer == peer && c.form == form && c.size == size)
    };
    let best = |medium: Medium, lat: bool, size: usize| -> Option<&Comparison> {
        let mut v: Vec<&Comparison> = comps
            .iter()
            .filter(|c| {
                c.medium == medium
                    && (c.form == Form::Latency) == lat
                    && c.size == size
                    && c.peer_median.is_some()
            })
            .collect();
        v.sort_by(|a, b| {
            let (x, y) = (a.peer_median.unwrap_or(0.0), b.peer_median.unwrap_or(0.0));
            if lat {
                x.total_cmp(&y)
            } else {
                y.total_cmp(&x)
            }
        });
        v.first().copied()
    };
    let from =
        |name: String, c: Option<&Comparison>, unit: &str, target: &str, pass: fn(f64) -> bool| {
            let ratio_is = "uvia / peer";
            match c {
                Some(c) if c.error.is_none() && !c.pairs.is_empty() => Headline::from_pairs(
                    &name,
                    ratio_is,
                    unit,
                    target,
                    Ok(c.pairs.iter().map(|p| (p.uvia, p.peer)).collect()),
                    |u, q| u / q,
                    pass,
                ),
                Some(c) => Headline::skipped(
                    &name,
                    ratio_is,
                    unit,
                    target,
                    c.error.clone().unwrap_or_else(|| "no pairs".into()),
                ),
                // (The bench's verdict reads "skipped" from the prefix.)
                None => Headline::skipped(
                    &name,
                    ratio_is,
                    unit,
                    target,
                    "skipped: its peer was not measured (left out by --only, or not installed)"
                        .into(),
                ),
            }
        };
    let mut hs = Vec::new();
    let fastest = best(Medium::Shm, true, 8);
    hs.push(from(
        format!(
            "peers: shm 8 B one-way, uvia vs the fastest peer on shared memory ({}; {})",
            fastest.map(|c| c.peer.as_str()).unwrap_or("none measured"),
            fastest.map(uvia_side).unwrap_or("-")
        ),
        fastest,
        "ns",
        "<= 1.0x",
        |r| r <= 1.0,
    ));
    hs.push(from(
        "peers: shm 8 B one-way, uvia vs Open MPI's shared-memory path (NetPIPE's best of three means)".into(),
        find("openmpi-vader", Form::Latency, 8),
        "ns",
        "<= 0.7x",
        |r| r <= 0.7,
    ));
    let top = best(Medium::Shm, false, 1 << 20);
    hs.push(from(
        format!(
            "peers: shm 1 MiB bandwidth, uvia vs the best peer ({}, {})",
            top.map(|c| c.peer.as_str()).unwrap_or("none measured"),
            top.map(|c| form_name(c.form)).unwrap_or("-")
        ),
        top,
        "MB/s",
        ">= 1.5x",
        |r| r >= 1.5,
    ));
    hs.push(from(
        "peers: udp 8 B one-way at reliable delivery, uvia vs libfabric udp;ofi_rxd (means)".into(),
        find("libfabric-udp;ofi_rxd", Form::Latency, 8),
        "ns",
        "<= 0.5x",
        |r| r <= 0.5,
    ));
    hs.push(from(
        "peers: udp 1 MiB ping-pong bandwidth, uvia vs libfabric udp;ofi_rxd".into(),
        find("libfabric-udp;ofi_rxd", Form::PingpongBw, 1 << 20),
        "MB/s",
        ">= 2x",
        |r| r >= 2.0,
    ));
    hs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::PairVal;

    fn comparison(peer: &str, form: Form, size: usize, stat: Stat, v: f64, u: f64) -> Comparison {
        Comparison {
            peer: peer.into(),
            medium: Medium::Shm,
            form,
            size,
            stat,
            unit: if form == Form::Latency { "ns" } else { "MB/s" }.into(),
            iters: 1,
            peer_command: String::new(),
            uvia_command: String::new(),
            pairs: vec![PairVal {
                uvia: u,
                peer: v,
                ratio: u / v,
            }],
            uvia_median: Some(u),
            peer_median: Some(v),
            ratio: Some(u / v),
            error: None,
        }
    }

    #[test]
    fn peer_rows_have_uvias_shape_with_unknown_figures_null() {
        let info = PeerInfo {
            name: "ucx-ucp-tag".into(),
            medium: Medium::Shm,
            tool: "ucx_perftest".into(),
            package: "ucx-utils".into(),
            version: Some("ucx-utils 1.13.1-1".into()),
            missing: None,
        };
        let comps = [
            comparison("ucx-ucp-tag", Form::Latency, 8, Stat::P50, 200.0, 100.0),
            comparison(
                "ucx-ucp-tag",
                Form::Stream,
                1 << 20,
                Stat::Mean,
                5000.0,
                6000.0,
            ),
        ];
        let rs = rows(&[info], &comps);
        assert_eq!(rs.len(), 2);
        let v = serde_json::to_value(&rs).unwrap();
        assert_eq!(v[0]["provider"], "ucx-ucp-tag");
        assert_eq!(v[0]["command"], "pingpong");
        assert_eq!(v[0]["version"], "ucx-utils 1.13.1-1");
        assert_eq!(v[0]["results"][0]["lat_ns"]["p50"], 200.0);
        // The tool gives no mean or p99 here: null, not a made-up 0.
        assert!(v[0]["results"][0]["lat_ns"]["mean"].is_null());
        assert!(v[0]["results"][0]["lat_ns"]["p99"].is_null());
        assert_eq!(v[1]["command"], "bw");
        assert_eq!(v[1]["results"][0]["mbytes_per_s"], 5000.0);
        assert_eq!(v[1]["results"][0]["size"], 1 << 20);
    }

    #[test]
    fn a_loss_whose_cause_is_known_says_it_and_others_say_nothing() {
        let am_1k = comparison("ucx-uct-am", Form::Latency, 1024, Stat::P50, 100.0, 150.0);
        assert!(difference(&am_1k).unwrap().contains("payload"));
        let am_8 = comparison("ucx-uct-am", Form::Latency, 8, Stat::P50, 80.0, 90.0);
        assert_eq!(difference(&am_8), None);
        let put = comparison("ucx-uct-put", Form::Latency, 8, Stat::P50, 50.0, 55.0);
        assert!(difference(&put).unwrap().contains("grant"));
        let shm = comparison("libfabric-shm", Form::Latency, 8, Stat::Mean, 90.0, 95.0);
        assert_eq!(difference(&shm), None);
    }

    #[test]
    fn the_bare_exchange_lines_name_the_8_byte_shared_memory_latencies_only() {
        let mut put = comparison("ucx-uct-put", Form::Latency, 8, Stat::P50, 45.0, 50.0);
        put.uvia_command = "uvia pingpong --provider shm --sizes 8 --rdma-write".into();
        let am = comparison("ucx-uct-am", Form::Latency, 8, Stat::P50, 80.0, 60.0);
        let big = comparison("ucx-uct-am", Form::Latency, 1024, Stat::P50, 100.0, 150.0);
        let mut unmeasured =
            comparison("openmpi-vader", Form::Latency, 8, Stat::BestMean, 1.0, 1.0);
        unmeasured.uvia_median = None;
        // The lower reading is the one compared with.
        let bare = Bare {
            start_ns: 60.0,
            end_ns: 50.0,
        };
        let lines = against_bare(&[put, am, big, unmeasured], &bare);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(
            lines[0],
            "ucx-uct-put 8 B: uvia's one-sided RDMA write 50 ns (1.00x the bare exchange), the peer 45 ns (0.90x)"
        );
        assert!(
            lines[1].starts_with("ucx-uct-am 8 B: uvia's send 60 ns (1.20x"),
            "{}",
            lines[1]
        );
        let none = Bare {
            start_ns: 0.0,
            end_ns: 0.0,
        };
        assert!(against_bare(
            &[comparison(
                "ucx-uct-am",
                Form::Latency,
                8,
                Stat::P50,
                1.0,
                1.0
            )],
            &none
        )
        .is_empty());
    }

    #[test]
    fn headline_takes_the_fastest_shared_memory_peer() {
        let c = |peer: &str, v: f64, u: f64| comparison(peer, Form::Latency, 8, Stat::P50, v, u);
        let hs = headlines(&[
            c("ucx-ucp-tag", 190.0, 150.0),
            c("ucx-uct-put", 80.0, 100.0),
        ]);
        assert!(hs[0].name.contains("ucx-uct-put"), "{}", hs[0].name);
        assert_eq!(hs[0].ratio, Some(1.25));
        assert_eq!(hs[0].pass, Some(false));
        // Open MPI not measured: listed with the reason, as skipped (a
        // "skipped:" reason), not as a failure.
        let why = hs[1].error.as_deref().unwrap_or("");
        assert!(why.starts_with("skipped:"), "{why}");
    }
}
