//! Tagged messages as an MPI library sends them: `tests/c/rdm_cost.c`
//! drives two `FI_EP_RDM` endpoints of one process (the provider's own on
//! shm, `ofi_rxm` over the provider's connected endpoints on udp, and on
//! shm when offered to it) with tagged receives, `fi_tinject`, manual progress,
//! `FI_THREAD_DOMAIN`, every message's round number checked where it
//! arrives. The same program, run under callgrind, counts what a round
//! trip costs by library (docs/BENCHMARKS.md).

mod common;

use common::{ProviderDir, WithProvider};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

fn program() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
        common::compile_c("rdm_cost", &[src.join("rdm_cost.c")], &["-O1", "-g"])
    })
}

/// Runs `rounds` round trips over `prov` on `domain` with `env`;
/// fails unless every message came with its data. `test` names the
/// provider's folder: a library copied over one a running test has mapped
/// would kill it.
fn round_trips(test: &str, prov: &str, domain: &str, rounds: u32, env: &[(&str, &str)]) {
    let dir = ProviderDir::new(test);
    let o = Command::new(program())
        .args([prov, &rounds.to_string()])
        .with_provider(&dir)
        .env("FI_UVIA_DOMAIN", domain)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && out.starts_with(&format!("{prov}: {rounds} round trips, ")),
        "status {:?}\n{out}\n{err}",
        o.status
    );
}

#[test]
fn tagged_messages_between_two_endpoints_of_one_process_on_shm() {
    round_trips("tagged-shm", "uvia", "shm", 20_000, &[]);
}

#[test]
fn tagged_messages_over_rxm_on_shm() {
    round_trips(
        "tagged-rxm-shm",
        "uvia;ofi_rxm",
        "shm",
        20_000,
        &[("FI_UVIA_RXM_SHM", "1")],
    );
}

#[test]
fn tagged_messages_between_two_endpoints_of_one_process_on_udp() {
    round_trips("tagged-udp", "uvia;ofi_rxm", "udp", 5_000, &[]);
}

/// At 5% injected loss every message still comes, in order, once.
#[test]
fn tagged_messages_on_udp_at_injected_loss() {
    round_trips(
        "tagged-udp-loss",
        "uvia;ofi_rxm",
        "udp",
        2_000,
        &[("FI_UVIA_INJECT", "loss=0.05,seed=3")],
    );
}

/// Bad arguments get the usage and exit status 2, before any libfabric
/// call.
#[test]
fn the_program_refuses_bad_arguments() {
    for args in [&[][..], &["shm"][..], &["shm", "0"][..], &["shm", "x"][..]] {
        let o = Command::new(program()).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).starts_with("usage: rdm_cost"));
    }
}
