//! The instruction set, as far as wpd's programs use it: one function per
//! instruction form, each returning its encoding.

use super::{Insn, Reg};

const ALU64: u8 = 0x07;
const JMP: u8 = 0x05;
const LDX: u8 = 0x01;
const STX: u8 = 0x03;
const LD: u8 = 0x00;
const K: u8 = 0x00;
const X: u8 = 0x08;
const DW: u8 = 0x18;
const MEM: u8 = 0x60;
const IMM: u8 = 0x00;
const ATOMIC: u8 = 0xc0;

fn insn(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

/// `dst = imm` (sign-extended).
pub fn mov_imm(dst: Reg, imm: i32) -> Insn {
    insn(ALU64 | 0xb0 | K, dst, 0, 0, imm)
}
/// `dst = src`.
pub fn mov(dst: Reg, src: Reg) -> Insn {
    insn(ALU64 | 0xb0 | X, dst, src, 0, 0)
}
/// `dst += imm`.
pub fn add_imm(dst: Reg, imm: i32) -> Insn {
    insn(ALU64 | K, dst, 0, 0, imm)
}
/// `dst = imm64` (two instructions); `src` 1 makes `imm` a map fd
/// (`BPF_PSEUDO_MAP_FD`), 2 the address of a map's value at offset
/// `hi` (`BPF_PSEUDO_MAP_VALUE`).
pub fn ld_imm64(dst: Reg, src: Reg, lo: i32, hi: i32) -> [Insn; 2] {
    [insn(LD | DW | IMM, dst, src, 0, lo), insn(0, 0, 0, 0, hi)]
}
/// `dst = imm64`.
pub fn ld_u64(dst: Reg, v: u64) -> [Insn; 2] {
    ld_imm64(dst, 0, v as u32 as i32, (v >> 32) as u32 as i32)
}
/// `dst = map` (a map's fd, resolved by the verifier).
pub fn ld_map(dst: Reg, fd: i32) -> [Insn; 2] {
    ld_imm64(dst, 1, fd, 0)
}
/// `dst = &map.value[0] + off` (an array map's first value).
pub fn ld_map_value(dst: Reg, fd: i32, off: i32) -> [Insn; 2] {
    ld_imm64(dst, 2, fd, off)
}
/// `dst = *(u64 *)(src + off)`.
pub fn ldx_dw(dst: Reg, src: Reg, off: i16) -> Insn {
    insn(LDX | MEM | DW, dst, src, off, 0)
}
/// `dst = *(u32 *)(src + off)` (zero-extended).
pub fn ldx_w(dst: Reg, src: Reg, off: i16) -> Insn {
    insn(LDX | MEM, dst, src, off, 0)
}
/// `if dst == imm goto +off`.
pub fn jeq_imm(dst: Reg, imm: i32, off: i16) -> Insn {
    insn(JMP | 0x10 | K, dst, 0, off, imm)
}
/// `*(u64 *)(dst + off) = src`.
pub fn stx_dw(dst: Reg, off: i16, src: Reg) -> Insn {
    insn(STX | MEM | DW, dst, src, off, 0)
}
/// `lock *(u64 *)(dst + off) += src`.
pub fn atomic_add_dw(dst: Reg, off: i16, src: Reg) -> Insn {
    insn(STX | ATOMIC | DW, dst, src, off, 0)
}
/// `src = atomic_fetch_add((u64 *)(dst + off), src)` (`BPF_FETCH`).
pub fn atomic_fetch_add_dw(dst: Reg, off: i16, src: Reg) -> Insn {
    insn(STX | ATOMIC | DW, dst, src, off, 0x01)
}
/// `src = xchg((u64 *)(dst + off), src)`.
pub fn atomic_xchg_dw(dst: Reg, off: i16, src: Reg) -> Insn {
    insn(STX | ATOMIC | DW, dst, src, off, 0xe1)
}
/// `dst &= src`.
pub fn and(dst: Reg, src: Reg) -> Insn {
    insn(ALU64 | 0x50 | X, dst, src, 0, 0)
}
/// `dst -= src`.
pub fn sub(dst: Reg, src: Reg) -> Insn {
    insn(ALU64 | 0x10 | X, dst, src, 0, 0)
}
/// `dst ^= src`.
pub fn xor(dst: Reg, src: Reg) -> Insn {
    insn(ALU64 | 0xa0 | X, dst, src, 0, 0)
}
/// `dst <<= imm`.
pub fn lsh_imm(dst: Reg, imm: i32) -> Insn {
    insn(ALU64 | 0x60 | K, dst, 0, 0, imm)
}
/// `dst >>= imm` (logical: zeroes come in).
pub fn rsh_imm(dst: Reg, imm: i32) -> Insn {
    insn(ALU64 | 0x70 | K, dst, 0, 0, imm)
}
/// `dst >>= imm` (arithmetic: copies of the sign bit come in).
pub fn arsh_imm(dst: Reg, imm: i32) -> Insn {
    insn(ALU64 | 0xc0 | K, dst, 0, 0, imm)
}
/// `dst %= src` (unsigned; the verifier makes `x % 0` leave `x`).
pub fn modulo(dst: Reg, src: Reg) -> Insn {
    insn(ALU64 | 0x90 | X, dst, src, 0, 0)
}
/// `if dst != imm goto +off`.
pub fn jne_imm(dst: Reg, imm: i32, off: i16) -> Insn {
    insn(JMP | 0x50 | K, dst, 0, off, imm)
}
/// Calls helper `id` (arguments r1-r5, result r0).
pub fn call(id: i32) -> Insn {
    insn(JMP | 0x80, 0, 0, 0, id)
}
/// Returns r0.
pub fn exit() -> Insn {
    insn(JMP | 0x90, 0, 0, 0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_as_the_kernel_reads_it() {
        // r1 = r6: BPF_ALU64|BPF_MOV|BPF_X, dst in the low nibble.
        let i = mov(1, 6);
        assert_eq!((i.code, i.regs), (0xbf, 0x61));
        // *(u64 *)(r7 + 8) = r0: BPF_STX|BPF_MEM|BPF_DW.
        let i = stx_dw(7, 8, 0);
        assert_eq!((i.code, i.regs, i.off), (0x7b, 0x07, 8));
        // r1 = *(u64 *)(r6 + 128): BPF_LDX|BPF_MEM|BPF_DW.
        let i = ldx_dw(1, 6, 128);
        assert_eq!((i.code, i.regs, i.off), (0x79, 0x61, 128));
        // lock *(u64 *)(r1 + 0) += r2: BPF_STX|BPF_ATOMIC|BPF_DW, imm BPF_ADD.
        let i = atomic_add_dw(1, 0, 2);
        assert_eq!((i.code, i.regs, i.imm), (0xdb, 0x21, 0));
        // r1 = map fd 5: BPF_LD|BPF_DW|BPF_IMM with src BPF_PSEUDO_MAP_FD.
        let [a, b] = ld_map(1, 5);
        assert_eq!(
            (a.code, a.regs, a.imm, b.code, b.imm),
            (0x18, 0x11, 5, 0, 0)
        );
        let [a, b] = ld_u64(2, 0x1234_5678_9abc_def0);
        assert_eq!((a.imm as u32, b.imm as u32), (0x9abc_def0, 0x1234_5678));
        assert_eq!(jne_imm(0, 0, 5).code, 0x55);
        assert_eq!(call(14).code, 0x85);
        assert_eq!(exit().code, 0x95);
    }
}
