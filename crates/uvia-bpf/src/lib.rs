//! The bpf(2) commands uvia uses, and BPF instructions encoded by hand.
//!
//! uvia's BPF programs are a few dozen instructions each (the XDP program
//! that steers frames to an AF_XDP socket, the tracepoint programs behind
//! `uvia anatomy`). They are written out as instructions here so that
//! nothing compiles BPF at build or run time: a loader library would want
//! an ELF object made by a BPF toolchain, which the machines this runs on
//! need not have. The `union bpf_attr` parts of the commands are laid out
//! by hand because the libc crate does not carry them.

pub mod insn;

use std::ffi::{c_int, CStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub use insn::Insn;

const BPF_MAP_CREATE: c_int = 0;
const BPF_MAP_UPDATE_ELEM: c_int = 2;
const BPF_MAP_DELETE_ELEM: c_int = 3;
const BPF_PROG_LOAD: c_int = 5;
const BPF_RAW_TRACEPOINT_OPEN: c_int = 17;
const BPF_LINK_CREATE: c_int = 28;

pub const BPF_MAP_TYPE_HASH: u32 = 1;
pub const BPF_MAP_TYPE_ARRAY: u32 = 2;
/// A map flag: user space may mmap the map (arrays only).
pub const BPF_F_MMAPABLE: u32 = 1 << 10;
pub const BPF_MAP_TYPE_XSKMAP: u32 = 17;
pub const BPF_PROG_TYPE_XDP: u32 = 6;
pub const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;

/// The part of `union bpf_attr` one command reads, zero-padded.
pub struct Attr([u8; 128]);

impl Attr {
    pub fn new() -> Attr {
        Attr([0; 128])
    }

    pub fn u32(mut self, at: usize, v: u32) -> Attr {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }

    pub fn u64(mut self, at: usize, v: u64) -> Attr {
        self.0[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }

    /// A name field of 16 bytes (map and program names; cut to 15).
    pub fn name(mut self, at: usize, name: &str) -> Attr {
        let n = name.len().min(15);
        self.0[at..at + n].copy_from_slice(&name.as_bytes()[..n]);
        self
    }
}

impl Default for Attr {
    fn default() -> Attr {
        Attr::new()
    }
}

/// `bpf(cmd, attr, size)`.
pub fn bpf(cmd: c_int, attr: &mut Attr) -> io::Result<c_int> {
    // SAFETY: `attr` is a live, zero-padded buffer of the size passed, and
    // any pointers in it were put there by callers who keep them alive.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            attr.0.len() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as c_int)
    }
}

fn owned(fd: c_int) -> OwnedFd {
    // SAFETY: a descriptor the kernel just returned to us, owned by no one else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Creates a map.
pub fn map_create(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    flags: u32,
    name: &str,
) -> io::Result<OwnedFd> {
    let mut a = Attr::new()
        .u32(0, map_type)
        .u32(4, key_size)
        .u32(8, value_size)
        .u32(12, max_entries)
        .u32(16, flags)
        .name(28, name);
    bpf(BPF_MAP_CREATE, &mut a).map(owned)
}

/// Sets `key` to `value` in `map` (both as the map's sizes say).
pub fn map_update(map: &OwnedFd, key: &[u8], value: &[u8]) -> io::Result<()> {
    let mut a = Attr::new()
        .u32(0, map.as_raw_fd() as u32)
        .u64(8, key.as_ptr() as u64)
        .u64(16, value.as_ptr() as u64);
    bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(|_| ())
}

/// Removes `key` from `map`.
pub fn map_delete(map: &OwnedFd, key: &[u8]) -> io::Result<()> {
    let mut a = Attr::new()
        .u32(0, map.as_raw_fd() as u32)
        .u64(8, key.as_ptr() as u64);
    bpf(BPF_MAP_DELETE_ELEM, &mut a).map(|_| ())
}

/// Loads a program. On a verifier refusal the error carries the start of
/// the verifier's log.
pub fn prog_load(
    prog_type: u32,
    insns: &[Insn],
    expected_attach_type: u32,
    name: &str,
) -> io::Result<OwnedFd> {
    // Every helper uvia's programs call is open to this licence, and the
    // GPL-only ones (the current task) need a GPL-compatible one.
    let license = b"Dual MIT/GPL\0";
    let mut log = vec![0u8; 8192];
    let mut a = Attr::new()
        .u32(0, prog_type)
        .u32(4, insns.len() as u32)
        .u64(8, insns.as_ptr() as u64)
        .u64(16, license.as_ptr() as u64)
        .u32(24, 1) // log_level
        .u32(28, log.len() as u32)
        .u64(32, log.as_mut_ptr() as u64)
        .name(48, name)
        .u32(68, expected_attach_type);
    bpf(BPF_PROG_LOAD, &mut a).map(owned).map_err(|e| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let text = String::from_utf8_lossy(&log[..end]);
        // The end of the log says why; the start is the program's walk.
        let text = text.trim();
        let tail = &text[text.len().saturating_sub(600)..];
        if tail.is_empty() {
            e
        } else {
            io::Error::new(e.kind(), format!("{e}; verifier: {tail}"))
        }
    })
}

/// Attaches `prog` to `target` (an interface index, or a descriptor) with
/// `attach_type` and `flags`. It stays attached while the returned link
/// descriptor is open.
pub fn link_create(
    prog: &OwnedFd,
    target: u32,
    attach_type: u32,
    flags: u32,
) -> io::Result<OwnedFd> {
    let mut a = Attr::new()
        .u32(0, prog.as_raw_fd() as u32)
        .u32(4, target)
        .u32(8, attach_type)
        .u32(12, flags);
    bpf(BPF_LINK_CREATE, &mut a).map(owned)
}

/// Attaches a raw-tracepoint program to the kernel tracepoint `name`: it
/// runs at every hit on every CPU until the returned descriptor closes.
pub fn raw_tracepoint_open(name: &CStr, prog: &OwnedFd) -> io::Result<OwnedFd> {
    let mut a = Attr::new()
        .u64(0, name.as_ptr() as u64)
        .u32(8, prog.as_raw_fd() as u32);
    bpf(BPF_RAW_TRACEPOINT_OPEN, &mut a).map(owned)
}
