//! Generates the libfabric declarations from the installed headers.
//!
//! bindgen rather than hand-written structs: the ops tables (`fi_ops_msg`,
//! `fi_ops_rma`, `fi_ops_cm`, `fi_ops_domain`, ...) are long lists of
//! function pointers whose order and size must match the headers of the
//! libfabric the provider is loaded into exactly; a slot out of place is a
//! call through the wrong pointer. Generating them from the headers that
//! `libfabric-dev` installs makes the layout the headers' by construction.

use bindgen::callbacks::{IntKind, ParseCallbacks};
use std::env;
use std::path::PathBuf;

/// The headers' `#define`s as Rust integer types: error numbers as `i32`
/// (they are returned negated as `int`), every flag and size as `u64`
/// (capability and mode bits run up to bit 63, and bindgen would otherwise
/// give each macro the smallest type its value fits).
#[derive(Debug)]
struct MacroTypes;

impl ParseCallbacks for MacroTypes {
    fn int_macro(&self, name: &str, _value: i64) -> Option<IntKind> {
        let errno = name.starts_with("FI_E") && name != "FI_EVENT" && !name.ends_with("_H");
        Some(if errno { IntKind::I32 } else { IntKind::U64 })
    }
}

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    // fi_dupinfo, fi_freeinfo, fi_param_define/get and fi_log are libfabric's
    // own functions; a provider links against the library that loads it.
    println!("cargo:rustc-link-lib=fabric");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_type("fi_.*|fid.*")
        .allowlist_function("fi_.*")
        .allowlist_var("FI_.*")
        // Flag sets and error numbers are used as integers.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .parse_callbacks(Box::new(MacroTypes))
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .generate()
        .expect("libfabric headers (apt-get install libfabric-dev libclang-dev)");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("fabric.rs"))
        .expect("write the bindings");
}
