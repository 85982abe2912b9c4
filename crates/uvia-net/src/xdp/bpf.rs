//! The XDP program that steers uvia's frames to an AF_XDP socket, and the
//! four bpf(2) commands that create its socket map, load it, attach it and
//! point the map at the socket.
//!
//! The program is fifteen instructions, written out by hand (see the
//! uvia-bpf crate for why). It is attached through a BPF link: the
//! kernel detaches it when the link's descriptor closes, so a Nic that is
//! closed, or whose process dies, leaves nothing on the interface.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use uvia_bpf::insn::*;
use uvia_bpf::{BPF_MAP_TYPE_XSKMAP, BPF_PROG_TYPE_XDP};

/// The attach type of an XDP program on an interface.
const BPF_XDP: u32 = 37;
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

/// The program: frames of `ethertype` go to the socket the map holds for
/// the receiving queue; everything else, and anything shorter than an
/// Ethernet header, passes to the kernel. With no socket in the map's slot
/// the redirect also passes (its flags name the fallback action).
fn program(map: RawFd, ethertype: u16) -> [Insn; 15] {
    // The two bytes as a little-endian load sees them.
    let wire = u16::from_ne_bytes(ethertype.to_be_bytes()) as i32;
    let [map_lo, map_hi] = ld_map(1, map);
    [
        insn(LDX_W, 2, 1, 0, 0),              // 0: r2 = ctx->data
        insn(LDX_W, 3, 1, 4, 0),              // 1: r3 = ctx->data_end
        insn(MOV_X, 4, 2, 0, 0),              // 2: r4 = r2
        insn(ADD_K, 4, 0, 0, 14),             // 3: r4 += 14 (Ethernet header)
        insn(JGT_X, 4, 3, 8, 0),              // 4: too short -> 13
        insn(LDX_H, 4, 2, 12, 0),             // 5: r4 = EtherType
        insn(JNE_K, 4, 0, 6, wire),           // 6: not ours -> 13
        insn(LDX_W, 2, 1, 16, 0),             // 7: r2 = ctx->rx_queue_index
        map_lo,                               // 8: r1 = the socket map
        map_hi,                               // 9: (upper half of the immediate)
        insn(MOV_K, 3, 0, 0, XDP_PASS),       // 10: r3 = fallback action
        insn(CALL, 0, 0, 0, FN_REDIRECT_MAP), // 11
        insn(EXIT, 0, 0, 0, 0),               // 12: return its verdict
        insn(MOV_K, 0, 0, 0, XDP_PASS),       // 13: r0 = XDP_PASS
        insn(EXIT, 0, 0, 0, 0),               // 14
    ]
}

/// An XSKMAP with one slot per receive queue up to `queues`.
pub fn socket_map(queues: u32) -> io::Result<OwnedFd> {
    // Keys are queue indices, values socket descriptors.
    uvia_bpf::map_create(BPF_MAP_TYPE_XSKMAP, 4, 4, queues.max(1), 0, "uvia_xsks")
}

/// Puts the AF_XDP socket `xsk` in the map's slot for `queue`.
pub fn set_socket(map: &OwnedFd, queue: u32, xsk: RawFd) -> io::Result<()> {
    uvia_bpf::map_update(map, &queue.to_ne_bytes(), &(xsk as u32).to_ne_bytes())
}

/// Loads the program for `ethertype` over `map`. On a verifier refusal the
/// error carries the verifier's account.
pub fn load(map: &OwnedFd, ethertype: u16) -> io::Result<OwnedFd> {
    let insns = program(map.as_raw_fd(), ethertype);
    uvia_bpf::prog_load(BPF_PROG_TYPE_XDP, &insns, BPF_XDP, "uvia_xdp")
}

/// Attaches `prog` to interface `ifindex` in `mode`. The program stays
/// attached while the returned link descriptor is open.
pub fn attach(prog: &OwnedFd, ifindex: u32, mode: Mode) -> io::Result<OwnedFd> {
    uvia_bpf::link_create(prog, ifindex, BPF_XDP, mode.flags())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_encodes_as_the_kernel_reads_it() {
        let p = program(7, 0x88b5);
        // The EtherType compare sees the wire bytes 0x88 0xb5 as a
        // little-endian load does.
        assert_eq!(p[6].imm, i32::from(u16::from_le_bytes([0x88, 0xb5])));
        // Both jumps land on the pass instruction.
        assert_eq!(4 + 1 + p[4].off as usize, 13);
        assert_eq!(6 + 1 + p[6].off as usize, 13);
        assert_eq!((p[8].code, p[8].regs, p[8].imm), (LD_DW, 1 | 1 << 4, 7));
        assert_eq!(p[11].imm, FN_REDIRECT_MAP);
        assert_eq!((p[13].imm, p[14].code), (XDP_PASS, EXIT));
    }
}
