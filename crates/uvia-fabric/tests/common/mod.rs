//! What the integration tests share: the provider as libfabric loads it.

use std::path::PathBuf;

pub mod mpi;
pub mod pingpong;
pub mod suite;

/// A temporary provider folder holding this build's library under the name
/// libfabric loads (`FI_PROVIDER_PATH` names it).
pub struct ProviderDir(pub PathBuf);

impl ProviderDir {
    pub fn new(test: &str) -> ProviderDir {
        // The test binary is target/<profile>/deps/<name>; the library cargo
        // built with it is beside it (and copied up a folder only when built
        // anew, so the copy there may be missing).
        let exe = std::env::current_exe().unwrap();
        let lib = exe.parent().unwrap().join("libuvia_fi.so");
        assert!(lib.exists(), "{} not built", lib.display());
        let dir = std::env::temp_dir().join(format!("uvia-fi-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(&lib, dir.join("libuvia-fi.so")).unwrap();
        ProviderDir(dir)
    }
}

impl Drop for ProviderDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
