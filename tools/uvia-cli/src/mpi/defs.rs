//! The study's variants: which MPI runs each, over what, and how.

use serde::Serialize;

/// The ping-pong every MPI variant runs, compiled at run time with the
/// MPI's own compiler wrapper.
pub(super) const PINGPONG_C: &str = include_str!("../../c/mpi_pingpong.c");

/// The sizes of the study: 1 B to 1 MiB.
pub const SIZES: [usize; 8] = [1, 8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20];
/// The sizes of a quick run: what the headlines need and one in between.
pub const QUICK_SIZES: [usize; 3] = [8, 64 << 10, 1 << 20];

/// The study's rounds in `uvia bench`, whose `--pairs` counts the
/// headline pairs: at most 3, each round running every variant.
pub fn rounds(pairs: usize) -> usize {
    pairs.clamp(1, 3)
}

/// How the study is made, for the report.
pub const ABOUT: &str = "One MPI ping-pong (`tools/uvia-cli/c/mpi_pingpong.c`, built with each MPI's `mpicc`; rank r pinned to core r) under every variant, interleaved with `uvia pingpong` at reliable delivery, in rounds whose order turns; each figure is the median of the rounds' p50 one-way times. The source's MPI over unreliable VIs with acknowledgements of its own has no exact equal: uvia's provider offers no datagram endpoint, so the \"no ack\" line sets libfabric's `udp;ofi_rxd` (software acknowledgements over kernel UDP datagrams) against uvia's reliable VIs. Open MPI's MPI_Recv always polls, so the \"spin\" line is uvia's own blocking against polling waits. Debian's Open MPI 4.1 cannot use libfabric's `shm` provider (it asks for `FI_REMOTE_COMM`), so the shm comparison uses MPICH (`UVIA_MPICH`, the `mpich` wheel that scripts/bench installs). As root, one more row runs the ping-pong at 8 B across two test hosts (network namespaces joined by a veth pair, one rank on each, the launcher reaching the second host through `scripts/netns-agent` as through ssh): Open MPI over uvia on xdp against Open MPI's own TCP path.";

/// Which program runs a variant.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize)]
pub enum Runner {
    /// `uvia pingpong`.
    Native,
    OpenMpi,
    Mpich,
}

/// One line of the study.
#[derive(Clone, Debug)]
pub struct Variant {
    pub key: &'static str,
    pub label: &'static str,
    pub(super) runner: Runner,
    /// The medium whose native ping-pong it is compared with (`None`:
    /// none; kernel paths).
    pub medium: Option<&'static str>,
    /// Environment for the ranks (`FI_*`, `MPIR_CVAR_*`).
    pub(super) env: &'static [(&'static str, &'static str)],
    /// Open MPI's `--mca` pairs, or `uvia pingpong`'s arguments.
    pub(super) args: &'static [&'static str],
    /// Runs through the uvia provider (needs `FI_PROVIDER_PATH`).
    pub(super) uvia: bool,
}

const OMPI_OFI: &[&str] = &["pml", "cm", "mtl", "ofi", "btl", "self"];
/// Open MPI leaves libfabric's own sockets providers out unless told.
const OMPI_OFI_ANY: &[&str] = &[
    "pml",
    "cm",
    "mtl",
    "ofi",
    "btl",
    "self",
    "mtl_ofi_provider_exclude",
    "none",
];
const UVIA_UDP: &[(&str, &str)] = &[("FI_PROVIDER", "uvia;ofi_rxm"), ("FI_UVIA_DOMAIN", "udp")];
/// On shm the provider's own reliable-datagram endpoints carry MPI (no
/// `ofi_rxm`: the provider offers shm to no utility provider by default).
const UVIA_SHM: &[(&str, &str)] = &[("FI_PROVIDER", "uvia"), ("FI_UVIA_DOMAIN", "shm")];
pub(super) const MPICH_OFI: [(&str, &str); 2] =
    [("MPIR_CVAR_CH4_NETMOD", "ofi"), ("MPIR_CVAR_NOLOCAL", "1")];

/// Every variant, in the order of the tables.
pub fn variants() -> Vec<Variant> {
    let v = |key, label, runner, medium, env, args, uvia| Variant {
        key,
        label,
        runner,
        medium,
        env,
        args,
        uvia,
    };
    use Runner::*;
    vec![
        v(
            "native-udp",
            "uvia udp (native)",
            Native,
            Some("udp"),
            &[],
            &["--provider", "udp"],
            false,
        ),
        v(
            "native-udp-blocking",
            "uvia udp, blocking waits (native)",
            Native,
            Some("udp"),
            &[],
            &["--provider", "udp", "--blocking"],
            false,
        ),
        v(
            "native-shm",
            "uvia shm (native)",
            Native,
            Some("shm"),
            &[],
            &["--provider", "shm"],
            false,
        ),
        v(
            "ompi-uvia-udp",
            "Open MPI over uvia;ofi_rxm, udp",
            OpenMpi,
            Some("udp"),
            UVIA_UDP,
            OMPI_OFI,
            true,
        ),
        v(
            "ompi-uvia-udp-eager",
            "Open MPI over uvia, udp, every message eager (copied)",
            OpenMpi,
            Some("udp"),
            &[
                ("FI_PROVIDER", "uvia;ofi_rxm"),
                ("FI_UVIA_DOMAIN", "udp"),
                // 1 MiB and ofi_rxm's header in one bounce buffer; fewer of
                // them than the default 1,024 keep memory in check.
                ("FI_OFI_RXM_BUFFER_SIZE", "1048704"),
                ("FI_OFI_RXM_RX_SIZE", "64"),
                ("FI_OFI_RXM_MSG_RX_SIZE", "64"),
            ],
            OMPI_OFI,
            true,
        ),
        v(
            "ompi-uvia-shm",
            "Open MPI over uvia (FI_EP_RDM), shm",
            OpenMpi,
            Some("shm"),
            UVIA_SHM,
            OMPI_OFI,
            true,
        ),
        v(
            "ompi-rxd",
            "Open MPI over udp;ofi_rxd (acks in software)",
            OpenMpi,
            Some("udp"),
            &[("FI_PROVIDER", "udp;ofi_rxd")],
            OMPI_OFI_ANY,
            false,
        ),
        v(
            "ompi-tcp-rxm",
            "Open MPI over tcp;ofi_rxm",
            OpenMpi,
            Some("udp"),
            &[("FI_PROVIDER", "tcp;ofi_rxm"), ("FI_TCP_IFACE", "lo")],
            OMPI_OFI_ANY,
            false,
        ),
        v(
            "ompi-tcp",
            "Open MPI's own TCP (ob1, btl tcp)",
            OpenMpi,
            Some("udp"),
            &[],
            &["pml", "ob1", "btl", "tcp,self", "btl_tcp_if_include", "lo"],
            false,
        ),
        v(
            "ompi-sm",
            "Open MPI's own shared memory (ob1, btl vader)",
            OpenMpi,
            Some("shm"),
            &[],
            &["pml", "ob1", "btl", "vader,self"],
            false,
        ),
        v(
            "mpich-uvia-shm",
            "MPICH over uvia (FI_EP_RDM), shm",
            Mpich,
            Some("shm"),
            UVIA_SHM,
            &[],
            true,
        ),
        v(
            "mpich-shm",
            "MPICH over libfabric shm",
            Mpich,
            Some("shm"),
            &[("FI_PROVIDER", "shm")],
            &[],
            false,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_has_a_native_baseline_on_its_medium() {
        let vs = variants();
        for v in &vs {
            if let Some(m) = v.medium {
                let native = format!("native-{m}");
                assert!(vs.iter().any(|n| n.key == native), "{}", v.key);
            }
        }
        let mut keys: Vec<_> = vs.iter().map(|v| v.key).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), vs.len(), "keys are unique");
    }
}
