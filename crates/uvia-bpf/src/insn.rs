//! BPF instructions (`struct bpf_insn`) and the opcodes uvia's programs use.

/// One BPF instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    pub code: u8,
    /// Destination register in the low nibble, source in the high one.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

pub const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | src << 4,
        off,
        imm,
    }
}

// Opcodes: class | size or operation | mode or source.
/// `r_dst = *(u32 *)(r_src + off)`
pub const LDX_W: u8 = 0x61;
/// `r_dst = *(u16 *)(r_src + off)`
pub const LDX_H: u8 = 0x69;
/// `r_dst = *(u64 *)(r_src + off)`
pub const LDX_DW: u8 = 0x79;
/// `*(u32 *)(r_dst + off) = r_src`
pub const STX_W: u8 = 0x63;
/// `*(u64 *)(r_dst + off) = r_src`
pub const STX_DW: u8 = 0x7b;
/// `*(u32 *)(r_dst + off) = imm`
pub const ST_W: u8 = 0x62;
/// An atomic operation on `*(u64 *)(r_dst + off)` with `r_src`, named by
/// the immediate (see [`FETCH_ADD`]).
pub const ATOMIC_DW: u8 = 0xdb;
/// With [`ATOMIC_DW`]: add `r_src` and load the old value into `r_src`.
pub const FETCH_ADD: i32 = 0x01;
/// `r_dst = r_src`
pub const MOV_X: u8 = 0xbf;
/// `r_dst = imm`
pub const MOV_K: u8 = 0xb7;
/// `r_dst += imm`
pub const ADD_K: u8 = 0x07;
/// `r_dst *= imm`
pub const MUL_K: u8 = 0x27;
/// `r_dst += r_src`
pub const ADD_X: u8 = 0x0f;
/// `r_dst >>= imm` (logical)
pub const RSH_K: u8 = 0x77;
/// `if r_dst > r_src goto +off`
pub const JGT_X: u8 = 0x2d;
/// `if r_dst != imm goto +off`
pub const JNE_K: u8 = 0x55;
/// `if r_dst >= imm goto +off` (unsigned)
pub const JGE_K: u8 = 0x35;
/// `if r_dst == imm goto +off`
pub const JEQ_K: u8 = 0x15;
/// `r_dst = 64-bit immediate` (two slots)
pub const LD_DW: u8 = 0x18;
pub const CALL: u8 = 0x85;
pub const EXIT: u8 = 0x95;
/// In a 64-bit load, the immediate is a map's descriptor.
pub const PSEUDO_MAP_FD: u8 = 1;

/// The two slots that load map descriptor `fd` into `dst`.
pub const fn ld_map(dst: u8, fd: i32) -> [Insn; 2] {
    [insn(LD_DW, dst, PSEUDO_MAP_FD, 0, fd), insn(0, 0, 0, 0, 0)]
}

// Helper function ids (`enum bpf_func_id`).
pub const FN_MAP_LOOKUP_ELEM: i32 = 1;
pub const FN_KTIME_GET_NS: i32 = 5;
pub const FN_GET_SMP_PROCESSOR_ID: i32 = 8;
pub const FN_GET_CURRENT_PID_TGID: i32 = 14;
pub const FN_GET_CURRENT_TASK: i32 = 35;
pub const FN_REDIRECT_MAP: i32 = 51;
pub const FN_RINGBUF_OUTPUT: i32 = 130;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instruction_is_eight_bytes_with_registers_in_nibbles() {
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        let i = insn(MOV_X, 4, 2, 0, 0);
        assert_eq!(i.regs, 0x24);
        let [a, b] = ld_map(1, 9);
        assert_eq!((a.code, a.regs, a.imm), (LD_DW, 0x11, 9));
        assert_eq!(b, insn(0, 0, 0, 0, 0));
    }
}
