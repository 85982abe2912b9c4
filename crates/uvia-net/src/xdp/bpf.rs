//! The XDP program that steers uvia's frames to an AF_XDP socket, and the
//! four bpf(2) commands that create its socket map, load it, attach it and
//! point the map at the socket.
//!
//! The program is fifteen instructions, written out here so that nothing
//! compiles BPF at build or run time (a loader library would want an ELF
//! object from a BPF toolchain). It is attached through a BPF link: the
//! kernel detaches it when the link's descriptor closes, so a Nic that is
//! closed, or whose process dies, leaves nothing on the interface.

use std::ffi::c_int;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const BPF_MAP_CREATE: c_int = 0;
const BPF_MAP_UPDATE_ELEM: c_int = 2;
const BPF_PROG_LOAD: c_int = 5;
const BPF_LINK_CREATE: c_int = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// The attach type of an XDP program on an interface.
const BPF_XDP: u32 = 37;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
const XDP_PASS: i32 = 2;

/// Where the program runs: in the driver (native) or after the kernel has
/// built a socket buffer (generic, every interface has it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Native,
    Generic,
}

impl Mode {
    fn flags(self) -> u32 {
        match self {
            // XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE
            Mode::Native => 1 << 2,
            Mode::Generic => 1 << 1,
        }
    }
}

/// One BPF instruction (`struct bpf_insn`).
#[derive(Clone, Copy)]
#[repr(C)]
struct Insn {
    code: u8,
    /// Destination register in the low nibble, source in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | src << 4,
        off,
        imm,
    }
}

// Opcodes used below (class | size/op | mode/source).
const LDX_W: u8 = 0x61; // r_dst = *(u32 *)(r_src + off)
const LDX_H: u8 = 0x69; // r_dst = *(u16 *)(r_src + off)
const MOV_X: u8 = 0xbf; // r_dst = r_src
const MOV_K: u8 = 0xb7; // r_dst = imm
const ADD_K: u8 = 0x07; // r_dst += imm
const JGT_X: u8 = 0x2d; // if r_dst > r_src goto +off
const JNE_K: u8 = 0x55; // if r_dst != imm goto +off
const LD_DW: u8 = 0x18; // r_dst = 64-bit immediate (two slots)
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
/// In a 64-bit load, the immediate is a map's descriptor.
const PSEUDO_MAP_FD: u8 = 1;

/// The program: frames of `ethertype` go to the socket the map holds for
/// the receiving queue; everything else, and anything shorter than an
/// Ethernet header, passes to the kernel. With no socket in the map's slot
/// the redirect also passes (its flags name the fallback action).
fn program(map: RawFd, ethertype: u16) -> [Insn; 15] {
    // The two bytes as a little-endian load sees them.
    let wire = u16::from_ne_bytes(ethertype.to_be_bytes()) as i32;
    [
        insn(LDX_W, 2, 1, 0, 0),                    // 0: r2 = ctx->data
        insn(LDX_W, 3, 1, 4, 0),                    // 1: r3 = ctx->data_end
        insn(MOV_X, 4, 2, 0, 0),                    // 2: r4 = r2
        insn(ADD_K, 4, 0, 0, 14),                   // 3: r4 += 14 (Ethernet header)
        insn(JGT_X, 4, 3, 8, 0),                    // 4: too short -> 13
        insn(LDX_H, 4, 2, 12, 0),                   // 5: r4 = EtherType
        insn(JNE_K, 4, 0, 6, wire),                 // 6: not ours -> 13
        insn(LDX_W, 2, 1, 16, 0),                   // 7: r2 = ctx->rx_queue_index
        insn(LD_DW, 1, PSEUDO_MAP_FD, 0, map),      // 8: r1 = the socket map
        insn(0, 0, 0, 0, 0),                        // 9: (upper half of the immediate)
        insn(MOV_K, 3, 0, 0, XDP_PASS),             // 10: r3 = fallback action
        insn(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP), // 11
        insn(EXIT, 0, 0, 0, 0),                     // 12: return its verdict
        insn(MOV_K, 0, 0, 0, XDP_PASS),             // 13: r0 = XDP_PASS
        insn(EXIT, 0, 0, 0, 0),                     // 14
    ]
}

/// `bpf(cmd, attr, size)`: `attr` is the command's part of `union bpf_attr`,
/// laid out by hand below (the libc crate does not carry these).
fn bpf(cmd: c_int, attr: &mut [u8; 128]) -> io::Result<c_int> {
    // SAFETY: `attr` is a live, zero-padded buffer of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            attr.len() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as c_int)
    }
}

fn put32(a: &mut [u8; 128], at: usize, v: u32) {
    a[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(a: &mut [u8; 128], at: usize, v: u64) {
    a[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

fn owned(fd: c_int) -> OwnedFd {
    // SAFETY: a descriptor the kernel just returned to us, owned by no one else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// An XSKMAP with one slot per receive queue up to `queues`.
pub fn socket_map(queues: u32) -> io::Result<OwnedFd> {
    let mut a = [0u8; 128];
    put32(&mut a, 0, BPF_MAP_TYPE_XSKMAP); // map_type
    put32(&mut a, 4, 4); // key_size: the queue index
    put32(&mut a, 8, 4); // value_size: a socket descriptor
    put32(&mut a, 12, queues.max(1)); // max_entries
    a[28..28 + 9].copy_from_slice(b"uvia_xsks"); // map_name
    bpf(BPF_MAP_CREATE, &mut a).map(owned)
}

/// Puts the AF_XDP socket `xsk` in the map's slot for `queue`.
pub fn set_socket(map: &OwnedFd, queue: u32, xsk: RawFd) -> io::Result<()> {
    let key = queue;
    let value = xsk as u32;
    let mut a = [0u8; 128];
    put32(&mut a, 0, map.as_raw_fd() as u32); // map_fd
    put64(&mut a, 8, &key as *const u32 as u64); // key
    put64(&mut a, 16, &value as *const u32 as u64); // value
    bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(|_| ())
}

/// Loads the program for `ethertype` over `map`. On a verifier refusal the
/// error carries the start of the verifier's log.
pub fn load(map: &OwnedFd, ethertype: u16) -> io::Result<OwnedFd> {
    let insns = program(map.as_raw_fd(), ethertype);
    let license = b"Dual MIT/GPL\0";
    let mut log = vec![0u8; 4096];
    let mut a = [0u8; 128];
    put32(&mut a, 0, BPF_PROG_TYPE_XDP); // prog_type
    put32(&mut a, 4, insns.len() as u32); // insn_cnt
    put64(&mut a, 8, insns.as_ptr() as u64); // insns
    put64(&mut a, 16, license.as_ptr() as u64); // license
    put32(&mut a, 24, 1); // log_level
    put32(&mut a, 28, log.len() as u32); // log_size
    put64(&mut a, 32, log.as_mut_ptr() as u64); // log_buf
    a[48..48 + 8].copy_from_slice(b"uvia_xdp"); // prog_name
    put32(&mut a, 68, BPF_XDP); // expected_attach_type
    bpf(BPF_PROG_LOAD, &mut a).map(owned).map_err(|e| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let text = String::from_utf8_lossy(&log[..end.min(600)])
            .trim()
            .to_string();
        if text.is_empty() {
            e
        } else {
            io::Error::new(e.kind(), format!("{e}; verifier: {text}"))
        }
    })
}

/// Attaches `prog` to interface `ifindex` in `mode`. The program stays
/// attached while the returned link descriptor is open.
pub fn attach(prog: &OwnedFd, ifindex: u32, mode: Mode) -> io::Result<OwnedFd> {
    let mut a = [0u8; 128];
    put32(&mut a, 0, prog.as_raw_fd() as u32); // prog_fd
    put32(&mut a, 4, ifindex); // target_ifindex
    put32(&mut a, 8, BPF_XDP); // attach_type
    put32(&mut a, 12, mode.flags()); // flags
    bpf(BPF_LINK_CREATE, &mut a).map(owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_encodes_as_the_kernel_reads_it() {
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        let p = program(7, 0x88b5);
        // The EtherType compare sees the wire bytes 0x88 0xb5 as a
        // little-endian load does.
        assert_eq!(p[6].imm, i32::from(u16::from_le_bytes([0x88, 0xb5])));
        // Both jumps land on the pass instruction.
        assert_eq!(4 + 1 + p[4].off as usize, 13);
        assert_eq!(6 + 1 + p[6].off as usize, 13);
        assert_eq!((p[8].code, p[8].regs, p[8].imm), (LD_DW, 1 | 1 << 4, 7));
        assert_eq!(p[11].imm, BPF_FUNC_REDIRECT_MAP);
        assert_eq!((p[13].imm, p[14].code), (XDP_PASS, EXIT));
    }
}
