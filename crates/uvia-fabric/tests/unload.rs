//! The provider stays mapped after libfabric unloads it: libfabric
//! `dlclose`s its providers as the program exits, while threads of the
//! provider (the one that keeps closing connections alive until the peer
//! has the disconnect, a domain's drive thread) may still run, and one
//! that woke after the unload ran into unmapped code.

mod common;

use common::ProviderDir;
use std::ffi::{c_void, CStr, CString};

#[test]
fn the_provider_stays_mapped_after_libfabric_unloads_it() {
    let dir = ProviderDir::new("unload");
    let lib = dir.0.join("libuvia-fi.so");
    let name = lib.to_str().unwrap().to_string();
    let mapped = || {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .any(|l| l.ends_with(&name))
    };
    let path = CString::new(name.clone()).unwrap();
    // SAFETY: loads the provider as libfabric's loader does, calls its
    // entry point (no arguments, a pointer back) and closes the handle.
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(
            !h.is_null(),
            "dlopen: {}",
            CStr::from_ptr(libc::dlerror()).to_string_lossy()
        );
        let ini = libc::dlsym(h, c"fi_prov_ini".as_ptr());
        assert!(!ini.is_null(), "no fi_prov_ini in {name}");
        let ini: extern "C" fn() -> *mut c_void = std::mem::transmute(ini);
        assert!(!ini().is_null(), "fi_prov_ini gave no provider");
        assert!(mapped(), "{name} is not mapped while loaded");
        assert_eq!(libc::dlclose(h), 0);
    }
    assert!(
        mapped(),
        "{name} was unmapped by the dlclose libfabric makes at exit; threads of the provider still running would fault"
    );
}
