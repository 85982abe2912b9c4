//! The headline comparisons of `uvia bench`, by provider: each a contender
//! and its baseline measured in interleaved pairs ([`interleave`]).

use super::{
    args, cfg, first, interleave, loss_pairs, sub, Blocked, Config, Headline, RunEntry, CONFIGS,
    LIGHT_LOSS_PAIRS, LOSS_PAIRS, NETNS_UDP_BP, NETNS_XDP, UDP_BP,
};
use crate::limit;
use crate::run::{RunResult, SizeResult};
use crate::stats::{median, Stats};
use anyhow::Result;
use indicatif::ProgressBar;
use std::time::Duration;

/// What every comparison of one bench shares.
pub(super) struct Run<'a> {
    pub pb: &'a ProgressBar,
    pub quick: bool,
    /// Pairs of each comparison.
    pub pairs: usize,
    /// The time limit of each measurement's process.
    pub timeout: Duration,
}

impl Run<'_> {
    /// The first size's result of `uvia <kind>` on `c` at `size`.
    fn one(&self, kind: &str, c: &Config, size: &str, extra: &[&str]) -> Result<SizeResult> {
        Ok(first(&sub(&args(kind, c, size, extra), self.timeout)?)?.clone())
    }

    /// One-way p50 of `iters` round trips.
    fn p50(&self, c: &Config, kind: &str, size: &str, iters: &str) -> Result<f64> {
        Ok(self.one(kind, c, size, &["--iters", iters])?.lat_ns.p50)
    }

    /// Round trips of a udp ping-pong.
    fn udp_iters(&self) -> &'static str {
        if self.quick {
            "5000"
        } else {
            "20000"
        }
    }

    /// Messages a second of a 64 B stream.
    fn rate(&self, c: &Config, extra: &[&str]) -> Result<f64> {
        let iters = if self.quick { "20000" } else { "100000" };
        let mut a = vec!["--iters", iters];
        a.extend_from_slice(extra);
        Ok(self.one("bw", c, "64", &a)?.msgs_per_s)
    }
}

/// Every provider and mode, ping-pong and bandwidth at `sizes`, each in
/// its own process; a run that fails is kept with its error.
pub(super) fn every_provider(run: &Run, sizes: &str, scale: &str) -> Vec<RunEntry> {
    let mut runs = Vec::new();
    for kind in ["pingpong", "bw"] {
        for c in &CONFIGS {
            run.pb.set_message(format!("{kind} {}", c.label));
            let r = sub(&args(kind, c, sizes, &["--scale", scale]), run.timeout);
            let (result, error) = match r {
                Ok(r) => (Some(r), None),
                Err(e) => {
                    run.pb.println(format!("{kind} {}: failed: {e:#}", c.label));
                    (None, Some(format!("{e:#}")))
                }
            };
            runs.push(RunEntry {
                label: c.label.into(),
                provider: c.provider.into(),
                mode: if c.flag == "--blocking" {
                    "blocking".into()
                } else {
                    "polling".into()
                },
                kind: kind.into(),
                result,
                error,
            });
            run.pb.inc(1);
        }
    }

    runs
}

/// Shared memory against the hardware's cache-line and futex hand-offs, a
/// cross-core copy, and kernel UDP.
pub(super) fn shm(run: &Run) -> Vec<Headline> {
    let pp_iters = if run.quick { "20000" } else { "100000" };
    let lim_rounds = if run.quick { 20_000 } else { 100_000 };
    let shm_p = cfg("shm polling");
    let shm_b = cfg("shm blocking");
    let udp = cfg(UDP_BP);
    let mut headline = Vec::new();
    headline.push(interleave(
        run.pb,
        "shm 8 B one-way p50 vs cache-line ping-pong (a line each way)",
        "shm p50 / cache-line p50",
        "ns",
        "<= 2.5x",
        run.pairs,
        || run.p50(shm_p, "pingpong", "8", pp_iters),
        || Ok(Stats::of(&limit::cacheline(lim_rounds, limit::Lines::EachWay)?).p50),
        |c, b| c / b,
        |r| r <= 2.5,
    ));
    headline.push(interleave(
        run.pb,
        "shm 8 B one-way p50 vs kernel UDP busy-poll 8 B",
        "UDP busy-poll p50 / shm p50 (times lower)",
        "ns",
        ">= 15x lower",
        run.pairs,
        || run.p50(shm_p, "pingpong", "8", pp_iters),
        || run.p50(udp, "pingpong", "8", run.udp_iters()),
        |c, b| b / c,
        |r| r >= 15.0,
    ));
    let bw_iters = if run.quick { "300" } else { "2000" };
    let copy_reps = if run.quick { 50 } else { 300 };
    headline.push(interleave(
        run.pb,
        "shm 1 MiB bandwidth vs cross-core copy 1 MiB",
        "shm MB/s / cross-core copy MB/s",
        "MB/s",
        ">= 0.8x",
        run.pairs,
        || {
            Ok(run
                .one("bw", shm_p, "1M", &["--iters", bw_iters])?
                .mbytes_per_s)
        },
        || Ok(median(&limit::cross_core_copy(1 << 20, copy_reps)?)),
        |c, b| c / b,
        |r| r >= 0.8,
    ));
    let blk_iters = if run.quick { "5000" } else { "20000" };
    headline.push(interleave(
        run.pb,
        "shm blocking 8 B one-way p50 vs futex hand-off",
        "shm blocking p50 / futex p50",
        "ns",
        "<= 1.3x",
        run.pairs,
        || run.p50(shm_b, "pingpong", "8", blk_iters),
        || {
            Ok(Stats::of(&limit::futex_pingpong(if run.quick {
                5_000
            } else {
                20_000
            })?)
            .p50)
        },
        |c, b| c / b,
        |r| r <= 1.3,
    ));

    headline
}

/// The udp provider (reliable delivery) against kernel UDP on the same
/// loopback path: latency, message rate and bandwidth.
pub(super) fn udp(run: &Run) -> Vec<Headline> {
    let udp = cfg(UDP_BP);
    let mut headline = Vec::new();
    let udp_p = cfg("udp polling");
    headline.push(interleave(
        run.pb,
        "udp 8 B one-way p50 vs kernel UDP busy-poll 8 B (reliable delivery)",
        "udp p50 / UDP busy-poll p50",
        "ns",
        "<= 1.15x",
        run.pairs,
        || run.p50(udp_p, "pingpong", "8", run.udp_iters()),
        || run.p50(udp, "pingpong", "8", run.udp_iters()),
        |c, b| c / b,
        |r| r <= 1.15,
    ));
    headline.push(interleave(
        run.pb,
        "udp 64 B message rate vs one-send-per-message kernel UDP",
        "udp msgs/s / kernel UDP msgs/s",
        "msgs/s",
        ">= 1.5x",
        run.pairs,
        || run.rate(udp_p, &[]),
        || run.rate(udp, &[]),
        |c, b| c / b,
        |r| r >= 1.5,
    ));
    // Bandwidth against kernel UDP busy-poll on the same loopback.
    let bw_of = |c: &Config, size: &str, iters: &str| -> Result<f64> {
        Ok(run.one("bw", c, size, &["--iters", iters])?.mbytes_per_s)
    };
    for (size, name, iters, want) in [
        (
            "1M",
            "udp 1 MiB bandwidth vs kernel UDP busy-poll 1 MiB (reliable delivery)",
            if run.quick { "200" } else { "1000" },
            1.0,
        ),
        (
            "64K",
            "udp 64 KiB bandwidth vs kernel UDP busy-poll 64 KiB (reliable delivery)",
            if run.quick { "2000" } else { "10000" },
            1.2,
        ),
    ] {
        headline.push(interleave(
            run.pb,
            name,
            "udp MB/s / kernel UDP MB/s",
            "MB/s",
            &format!(">= {want}x"),
            run.pairs,
            || bw_of(udp_p, size, iters),
            || bw_of(udp, size, iters),
            |c, b| c / b,
            |r| r >= want,
        ));
    }
    headline
}

/// Goodput at injected loss: each pair one run of a lossy connection and
/// its lossless twin between the same two processes, their batches
/// alternated (`uvia bw --lossless-twin`; seed 1, 2, ... so that the pairs
/// lose different frames): this host changes a stream's speed every few
/// seconds, and two runs one after the other often fell on either side of
/// such a change. At 5% at least [`LOSS_PAIRS`] pairs in the full bench,
/// whose worst is judged, at 1% at least [`LIGHT_LOSS_PAIRS`].
pub(super) fn loss(run: &Run) -> Vec<Headline> {
    let udp_p = cfg("udp polling");
    let mut headline = Vec::new();
    let lossy_iters = if run.quick { "3000" } else { "20000" };
    // The twin's goodput, measured with the contender's (the baseline's
    // "run" hands it over).
    let twin = std::cell::Cell::new(0.0);
    let goodput = |inject: &str| -> Result<f64> {
        let a = [
            "--iters",
            lossy_iters,
            "--inject",
            inject,
            "--lossless-twin",
        ];
        let r = sub(&args("bw", udp_p, "64K", &a), run.timeout)?;
        let lossless = r
            .lossless
            .first()
            .ok_or_else(|| anyhow::anyhow!("the run reported no lossless twin"))?;
        twin.set(lossless.mbytes_per_s);
        Ok(first(&r)?.mbytes_per_s)
    };
    for (loss, pct, want, worst, least) in [
        (0.05, 5, 0.8, Some(0.6), LOSS_PAIRS),
        (0.01, 1, 0.95, None, LIGHT_LOSS_PAIRS),
    ] {
        let seed = std::cell::Cell::new(0u32);
        let h = interleave(
            run.pb,
            &format!("udp 64 KiB goodput at {pct}% injected loss vs lossless (reliable delivery)"),
            &format!("MB/s at {pct}% loss / MB/s of its lossless twin in the same run"),
            "MB/s",
            &format!(">= {want}x"),
            loss_pairs(run.quick, run.pairs, least),
            || {
                seed.set(seed.get() + 1);
                goodput(&format!("loss={loss},seed={}", seed.get()))
            },
            || Ok(twin.get()),
            |c, b| c / b,
            |r| r >= want,
        );
        if let Some(w) = worst {
            headline.push(h.clone());
            headline.push(h.worst(
                &format!("udp 64 KiB goodput at {pct}% injected loss, the worst pair"),
                &format!(">= {w}x"),
                |r| r >= w,
            ));
        } else {
            headline.push(h);
        }
    }

    headline
}

/// The xdp provider against kernel UDP and the bare AF_XDP medium between
/// two test hosts made for each measurement (root only; skipped with the
/// reason otherwise). The last ping-pong run of each side joins `runs`.
pub(super) fn xdp(run: &Run, runs: &mut Vec<RunEntry>) -> Vec<Headline> {
    let udp = cfg(UDP_BP);
    let mut headline = Vec::new();
    let xdp = Config {
        provider: "xdp",
        flag: "--polling",
        label: "xdp polling",
    };
    let xdp_names = [
        (
            "xdp 8 B one-way p50 vs kernel UDP busy-poll 8 B, two test hosts (reliable delivery)",
            "xdp p50 / UDP busy-poll p50",
            "ns",
            "<= 0.5x",
        ),
        (
            "xdp 64 B message rate vs one-send-per-message kernel UDP, two test hosts",
            "xdp msgs/s / kernel UDP msgs/s",
            "msgs/s",
            ">= 2x",
        ),
        (
            "xdp 8 B one-way p50 vs the bare AF_XDP medium 8 B, two test hosts (reliable delivery)",
            "xdp p50 / AF_XDP medium p50",
            "ns",
            "<= 1.1x",
        ),
        (
            "xdp 64 KiB bandwidth vs kernel UDP 64 KiB, two test hosts (reliable delivery)",
            "xdp MB/s / kernel UDP MB/s",
            "MB/s",
            ">= 2x",
        ),
    ];
    match uvia_net::netns::TestHosts::available() {
        Ok(()) => {
            // Each side's last run is kept for the ping-pong table (its p99
            // and mean beside the p50 the headline compares).
            let last_xdp = std::cell::RefCell::new(None);
            let last_udp = std::cell::RefCell::new(None);
            let netns_p50 = |c: &Config, keep: &std::cell::RefCell<Option<RunResult>>| {
                let a = ["--iters", run.udp_iters(), "--netns"];
                let r = sub(&args("pingpong", c, "8", &a), run.timeout)?;
                let p50 = first(&r)?.lat_ns.p50;
                *keep.borrow_mut() = Some(r);
                Ok(p50)
            };
            let (n, r, u, t) = xdp_names[0];
            headline.push(interleave(
                run.pb,
                n,
                r,
                u,
                t,
                run.pairs,
                || netns_p50(&xdp, &last_xdp),
                || netns_p50(udp, &last_udp),
                |c, b| c / b,
                |r| r <= 0.5,
            ));
            let (n, r, u, t) = xdp_names[1];
            headline.push(interleave(
                run.pb,
                n,
                r,
                u,
                t,
                run.pairs,
                || run.rate(&xdp, &["--netns"]),
                || run.rate(udp, &["--netns"]),
                |c, b| c / b,
                |r| r >= 2.0,
            ));
            let (n, r, u, t) = xdp_names[2];
            let bare_rounds = if run.quick { 20_000 } else { 100_000 };
            headline.push(interleave(
                run.pb,
                n,
                r,
                u,
                t,
                run.pairs,
                || netns_p50(&xdp, &std::cell::RefCell::new(None)),
                || Ok(Stats::of(&limit::xdp_medium(8, bare_rounds)?).p50),
                |c, b| c / b,
                |r| r <= 1.1,
            ));
            let (n, r, u, t) = xdp_names[3];
            let xdp_bw = |c: &Config| -> Result<f64> {
                let a = [
                    "--iters",
                    if run.quick { "1000" } else { "5000" },
                    "--netns",
                ];
                Ok(run.one("bw", c, "64K", &a)?.mbytes_per_s)
            };
            headline.push(interleave(
                run.pb,
                n,
                r,
                u,
                t,
                run.pairs,
                || xdp_bw(&xdp),
                || xdp_bw(udp),
                |c, b| c / b,
                |r| r >= 2.0,
            ));
            for (label, provider, kept) in [
                (NETNS_XDP, "xdp", last_xdp),
                (NETNS_UDP_BP, "kernel-udp", last_udp),
            ] {
                if let Some(result) = kept.into_inner() {
                    runs.push(RunEntry {
                        label: label.into(),
                        provider: provider.into(),
                        mode: "polling".into(),
                        kind: "pingpong".into(),
                        result: Some(result),
                        error: None,
                    });
                }
            }
        }
        Err(why) => {
            for (n, r, u, t) in xdp_names {
                headline.push(Headline::skipped(n, r, u, t, format!("skipped: {why}")));
                run.pb.inc(run.pairs as u64);
            }
        }
    }

    headline
}

/// A paced ping-pong (one round trip per millisecond) in blocking mode:
/// the receiver's CPU while it spends nearly all its time waiting.
pub(super) fn blocked_receivers(run: &Run) -> Vec<Blocked> {
    let mut blocked = Vec::new();
    for label in ["shm blocking", "udp blocking", "kernel-udp blocking"] {
        run.pb.set_message(format!("blocked receiver CPU: {label}"));
        let c = cfg(label);
        let interval = 1000u64;
        let n = if run.quick { "300" } else { "1000" };
        let r = sub(
            &args(
                "pingpong",
                c,
                "8",
                &[
                    "--iters",
                    n,
                    "--warmup",
                    "20",
                    "--interval-us",
                    &interval.to_string(),
                ],
            ),
            run.timeout,
        );
        blocked.push(
            match r.and_then(|r| first(&r).map(|x| (x.cpu.server, x.lat_ns.p50))) {
                Ok((cpu, p50)) => Blocked {
                    label: label.into(),
                    interval_us: interval,
                    receiver_cpu: Some(cpu),
                    one_way_p50_ns: Some(p50),
                    error: None,
                },
                Err(e) => Blocked {
                    label: label.into(),
                    interval_us: interval,
                    receiver_cpu: None,
                    one_way_p50_ns: None,
                    error: Some(format!("{e:#}")),
                },
            },
        );
        run.pb.inc(1);
    }

    blocked
}
