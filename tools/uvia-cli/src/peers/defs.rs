//! The peers: what each is, which tool measures it, and whether it is
//! installed.

use crate::size::human;
use serde::Serialize;
use std::process::{Command, Stdio};

/// Where the two sides meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Medium {
    /// Shared memory between two processes; uvia's shm provider.
    Shm,
    /// 127.0.0.1; uvia's udp provider at reliable delivery.
    Loopback,
}

/// What a comparison measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Form {
    /// One-way time of a ping-pong (round trip / 2), ns.
    Latency,
    /// Back-to-back messages one way, MB/s (10^6 B).
    Stream,
    /// Ping-pong bandwidth: size / one-way time, MB/s.
    PingpongBw,
}

/// Which of a run's figures is compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stat {
    /// The median of the run's samples.
    P50,
    /// The mean over the run (what the tool reports when it has no median).
    Mean,
    /// The lowest of [`BEST_OF`] runs' means: NetPIPE's statistic (it runs
    /// each size three times and reports the best), so uvia's side of such
    /// a pair is run as often and reported alike.
    #[serde(rename = "best_mean")]
    BestMean,
}

/// How many runs a [`Stat::BestMean`] takes the best of (NetPIPE's trials).
pub const BEST_OF: usize = 3;

impl Stat {
    /// Runs a side makes for one value of this statistic.
    pub(super) fn runs(self) -> usize {
        match self {
            Stat::BestMean => BEST_OF,
            Stat::P50 | Stat::Mean => 1,
        }
    }

    /// Its name in the report's table.
    pub(super) fn name(self) -> &'static str {
        match self {
            Stat::P50 => "p50",
            Stat::Mean => "mean",
            Stat::BestMean => "best mean of 3",
        }
    }
}

/// The tool that measures a peer.
#[derive(Clone, Copy, Debug)]
pub(super) enum Tool {
    /// `ucx_perftest` on UCT over the posix transport: `-t <lat test>` /
    /// `-t <bw test>`.
    Uct {
        lat: &'static str,
        bw: &'static str,
        /// The largest message the transport takes in this form (bytes).
        bw_max: usize,
    },
    /// `ucx_perftest` on UCP tag matching, shared-memory transports only.
    UcpTag,
    /// `fi_pingpong -p <provider> -e <endpoint>`.
    Fi {
        provider: &'static str,
        ep: &'static str,
        /// Largest message it carries (datagrams: one per packet).
        max: usize,
    },
    /// NetPIPE over Open MPI's shared-memory path.
    NetPipe,
    /// `sockperf ping-pong` on kernel UDP.
    Sockperf,
}

/// One peer: its name in the rows (`provider`), tool and package.
#[derive(Clone, Copy, Debug)]
pub struct PeerDef {
    pub name: &'static str,
    pub(super) medium: Medium,
    pub(super) tool: Tool,
    pub(super) program: &'static str,
    pub(super) package: &'static str,
}

/// Every peer, in the report's order.
pub fn peers() -> Vec<PeerDef> {
    use Medium::*;
    vec![
        PeerDef {
            name: "ucx-uct-am",
            medium: Shm,
            tool: Tool::Uct {
                lat: "am_lat",
                bw: "am_bw",
                bw_max: 8192,
            },
            program: "ucx_perftest",
            package: "ucx-utils",
        },
        PeerDef {
            name: "ucx-uct-put",
            medium: Shm,
            tool: Tool::Uct {
                lat: "put_lat",
                bw: "put_bw",
                bw_max: usize::MAX,
            },
            program: "ucx_perftest",
            package: "ucx-utils",
        },
        PeerDef {
            name: "ucx-ucp-tag",
            medium: Shm,
            tool: Tool::UcpTag,
            program: "ucx_perftest",
            package: "ucx-utils",
        },
        PeerDef {
            name: "libfabric-shm",
            medium: Shm,
            tool: Tool::Fi {
                provider: "shm",
                ep: "rdm",
                max: usize::MAX,
            },
            program: "fi_pingpong",
            package: "libfabric-bin",
        },
        PeerDef {
            name: "openmpi-vader",
            medium: Shm,
            tool: Tool::NetPipe,
            program: "NPopenmpi",
            package: "netpipe-openmpi",
        },
        PeerDef {
            name: "libfabric-udp",
            medium: Loopback,
            tool: Tool::Fi {
                provider: "udp",
                ep: "dgram",
                max: 1024,
            },
            program: "fi_pingpong",
            package: "libfabric-bin",
        },
        PeerDef {
            name: "libfabric-tcp",
            medium: Loopback,
            tool: Tool::Fi {
                provider: "tcp",
                ep: "msg",
                max: usize::MAX,
            },
            program: "fi_pingpong",
            package: "libfabric-bin",
        },
        PeerDef {
            name: "libfabric-udp;ofi_rxd",
            medium: Loopback,
            tool: Tool::Fi {
                provider: "udp;ofi_rxd",
                ep: "rdm",
                max: usize::MAX,
            },
            program: "fi_pingpong",
            package: "libfabric-bin",
        },
        PeerDef {
            name: "sockperf-udp",
            medium: Loopback,
            tool: Tool::Sockperf,
            program: "sockperf",
            package: "sockperf",
        },
    ]
}

/// The smallest message `sockperf` sends (its own header).
const SOCKPERF_MIN: usize = 14;

impl PeerDef {
    /// The statistic its tool reports in `form`.
    pub(super) fn stat(&self, form: Form) -> Stat {
        match (self.tool, form) {
            (Tool::NetPipe, _) => Stat::BestMean,
            (Tool::Uct { .. } | Tool::UcpTag | Tool::Sockperf, Form::Latency) => Stat::P50,
            _ => Stat::Mean,
        }
    }

    /// The step of the latency its tool prints (ns), where uvia's figure
    /// of a pair is given at the same step: ucx_perftest and sockperf print
    /// microseconds with three decimals, so that two figures the peer's
    /// print cannot tell apart compare equal (a uvia median of 50.06 ns
    /// against UCX's printed 0.050 us read as a loss of 0.1%, though both
    /// are the same step of the time-stamp counter). `None` elsewhere:
    /// fi_pingpong's time comes from its rate, with four digits, and
    /// NetPIPE's two decimals (10 ns) are coarser than the clock, where a
    /// uvia mean rounded to them would only add an error of up to 5 ns.
    pub(super) fn printed_step_ns(&self, form: Form) -> Option<f64> {
        match (self.tool, form) {
            (Tool::Uct { .. } | Tool::UcpTag | Tool::Sockperf, Form::Latency) => Some(1.0),
            _ => None,
        }
    }

    /// `v` (uvia's figure in `form`) at the step of the peer's print.
    pub(super) fn at_printed_step(&self, form: Form, v: f64) -> f64 {
        match self.printed_step_ns(form) {
            Some(step) => (v / step).round() * step,
            None => v,
        }
    }

    /// Its bandwidth form, or why it has none.
    pub(super) fn bw_form(&self) -> std::result::Result<Form, &'static str> {
        match self.tool {
            Tool::Uct { .. } | Tool::UcpTag => Ok(Form::Stream),
            Tool::Fi { ep: "dgram", .. } => {
                Err("unreliable datagrams of at most one packet: no bandwidth at these sizes")
            }
            Tool::Fi { .. } | Tool::NetPipe => Ok(Form::PingpongBw),
            Tool::Sockperf => {
                Err("sockperf's throughput mode counts what the sender sent, not what arrived")
            }
        }
    }

    /// The size it measures for a uvia size (sockperf cannot go below its header).
    pub(super) fn size_for(&self, size: usize) -> usize {
        match self.tool {
            Tool::Sockperf => size.max(SOCKPERF_MIN),
            _ => size,
        }
    }

    /// Why it cannot do `size` in `form`, if it cannot.
    pub(super) fn cannot(&self, form: Form, size: usize) -> Option<String> {
        match (self.tool, form) {
            (Tool::Uct { bw_max, .. }, Form::Stream) if size > bw_max => Some(format!(
                "UCT active messages over posix carry at most {} per message",
                human(bw_max)
            )),
            (Tool::Fi { max, .. }, _) if size > max => {
                Some(format!("carries at most {} per datagram here", human(max)))
            }
            _ => None,
        }
    }
}

/// Its version: the package's (dpkg), else the tool's own line.
pub(super) fn version(p: &PeerDef) -> String {
    let dpkg = Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", p.package])
        .stderr(Stdio::null())
        .output();
    if let Ok(o) = dpkg {
        let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if o.status.success() && !v.is_empty() {
            return format!("{} {v}", p.package);
        }
    }
    "unknown".into()
}

/// The packages that hold the peers' tools (Debian).
pub const PACKAGES: &str = "ucx-utils, libfabric-bin, sockperf, openmpi-bin, netpipe-openmpi";

/// Whether any peer's tool is installed.
pub fn any_installed() -> bool {
    peers().iter().any(|p| installed(p).is_ok())
}

/// The program is on PATH (and `mpirun` too for NetPIPE).
pub(super) fn installed(p: &PeerDef) -> std::result::Result<(), String> {
    let mut need = vec![p.program];
    if matches!(p.tool, Tool::NetPipe) {
        need.push("mpirun");
    }
    for prog in need {
        if find_on_path(prog).is_none() {
            return Err(format!(
                "{prog} is not installed (apt-get install {})",
                if prog == "mpirun" {
                    "openmpi-bin"
                } else {
                    p.package
                }
            ));
        }
    }
    Ok(())
}

/// `prog`'s path on PATH, if it is there and executable.
fn find_on_path(prog: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|f| {
            f.metadata()
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// The peer of that name (tests).
#[cfg(test)]
pub(super) fn peer(name: &str) -> PeerDef {
    peers().into_iter().find(|p| p.name == name).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uvias_latency_is_compared_at_the_step_of_the_peers_print() {
        let put = peer("ucx-uct-put");
        // The same step of the clock as UCX's printed 0.050 us.
        assert_eq!(put.at_printed_step(Form::Latency, 50.06), 50.0);
        assert_eq!(put.at_printed_step(Form::Latency, 55.07), 55.0);
        assert_eq!(put.at_printed_step(Form::Latency, 49.6), 50.0);
        // NetPIPE's coarser print leaves uvia's mean as measured.
        let np = peer("openmpi-vader");
        assert_eq!(np.at_printed_step(Form::Latency, 71.3), 71.3);
        // Bandwidth, and fi_pingpong's time from its rate, stay as measured.
        assert_eq!(put.at_printed_step(Form::Stream, 12345.6), 12345.6);
        let fi = peer("libfabric-shm");
        assert_eq!(fi.at_printed_step(Form::Latency, 71.3), 71.3);
        assert_eq!(
            peer("sockperf-udp").printed_step_ns(Form::Latency),
            Some(1.0)
        );
    }

    #[test]
    fn peers_that_cannot_do_a_size_say_why() {
        let am = peer("ucx-uct-am");
        assert!(am.cannot(Form::Stream, 64 << 10).is_some());
        assert!(am.cannot(Form::Stream, 4 << 10).is_none());
        let sp = peer("sockperf-udp");
        assert!(sp.bw_form().is_err());
        assert_eq!(sp.size_for(8), SOCKPERF_MIN);
    }
}
