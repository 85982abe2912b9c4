//! The provider's own reliable-datagram endpoints (`FI_EP_RDM` on shm):
//! `tests/c/fi_rdm.c` checks libfabric's tagged-message semantics on three
//! endpoints of one process (matching under ignore bits and in order,
//! directed receives, truncation, cancel, peek and claim, remote CQ data,
//! inject, messages larger than a link's ring, bad input refused, a closed
//! peer's sends failing), each part's result on its own line.

mod common;

use common::{ProviderDir, WithProvider};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

fn program() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
        common::compile_c("fi_rdm", &[src.join("fi_rdm.c")], &["-O1", "-g"])
    })
}

#[test]
fn reliable_datagrams_keep_libfabrics_tagged_semantics() {
    let dir = ProviderDir::new("rdm-semantics");
    let o = Command::new(program())
        .with_provider(&dir)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && out.ends_with("fi_rdm: all passed\n"),
        "status {:?}\n{out}\n{err}",
        o.status
    );
    assert_eq!(
        out.lines().filter(|l| l.ends_with(" ok")).count(),
        9,
        "{out}"
    );
}

/// With udp named as the only domain there are no reliable datagrams of
/// the provider's own: the program says so and fails, it does not run over
/// something else.
#[test]
fn no_reliable_datagrams_of_its_own_off_shm() {
    let dir = ProviderDir::new("rdm-udp");
    let o = Command::new(program())
        .with_provider(&dir)
        .env("FI_UVIA_DOMAIN", "udp")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("expected info"), "{err}");
}

#[test]
fn the_program_refuses_arguments() {
    let o = Command::new(program()).arg("x").output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("usage: fi_rdm"));
}
