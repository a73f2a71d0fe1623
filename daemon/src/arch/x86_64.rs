//! x86-64 debug registers: DR7/DR6 layout, legal lengths, alignment and
//! address limits (Intel SDM Vol. 3B §18.2 "Debug Registers").

use super::SpecError;

pub mod insn;
pub mod store;
use crate::model::{Access, Piece, Range, WatchLen};

/// Architecture name as reported to clients.
pub const ARCH: &str = "x86_64";

/// Hardware breakpoint slots per thread: DR0–DR3 (SDM §18.2.1).
pub const SLOTS: usize = 4;

/// Legal watch lengths in bytes (SDM §18.2.5, LENn encodings 00/01/11/10).
pub const LENGTHS: [u32; 4] = [1, 2, 4, 8];

/// First address the kernel refuses for a user breakpoint: `TASK_SIZE_MAX`
/// (`(1 << 47) - PAGE_SIZE`) with 4-level paging; the last user page is a
/// guard page (kernel-facts §1: `0x7ffffffff000` → EINVAL).
pub const USER_ADDR_LIMIT: u64 = 0x7fff_ffff_f000;

/// Lowest canonical kernel-half address (48-bit virtual addresses).
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;

/// DR7 fields for one slot (SDM Figure 18-1).
pub mod dr7 {
    /// Local enable bit of slot `n`: bit `2n`.
    pub const fn local_enable(n: usize) -> u64 {
        1 << (2 * n)
    }
    /// Shift of the RW field of slot `n`: bits `16 + 4n ..= 17 + 4n`.
    pub const fn rw_shift(n: usize) -> u32 {
        16 + 4 * n as u32
    }
    /// Shift of the LEN field of slot `n`: bits `18 + 4n ..= 19 + 4n`.
    pub const fn len_shift(n: usize) -> u32 {
        18 + 4 * n as u32
    }
    /// RW = 00: instruction execution.
    pub const RW_EXEC: u64 = 0b00;
    /// RW = 01: data writes.
    pub const RW_WRITE: u64 = 0b01;
    /// RW = 11: data reads or writes (there is no read-only encoding).
    pub const RW_READ_WRITE: u64 = 0b11;
    /// LEN encodings: 1 → 00, 2 → 01, 8 → 10, 4 → 11.
    pub const fn len_bits(len: u32) -> u64 {
        match len {
            1 => 0b00,
            2 => 0b01,
            8 => 0b10,
            _ => 0b11,
        }
    }
    /// Every DR7 bit of slot `n`: its local and global enable bits and its
    /// RW and LEN fields (to clear the slot out of a whole register).
    pub const fn slot_mask(n: usize) -> u64 {
        local_enable(n) | (local_enable(n) << 1) | (0b1111 << rw_shift(n))
    }
}

/// DR6 (SDM §18.2.3): bits 0–3 tell which slot's condition was met.
pub mod dr6 {
    /// Mask of the B0–B3 "breakpoint condition detected" bits.
    pub const HIT_MASK: u64 = 0b1111;
    /// The slots whose condition DR6 reports met, as a slot bitmap (bit `n`:
    /// slot `n`).
    pub const fn slots_hit(dr6: u64) -> u8 {
        (dr6 & HIT_MASK) as u8
    }
}

/// Offset of debug register `n` (0–7) in `struct user`, for
/// PTRACE_PEEKUSER/POKEUSER (`arch/x86/kernel/ptrace.c`).
pub fn debugreg_offset(n: usize) -> usize {
    std::mem::offset_of!(libc::user, u_debugreg) + n * std::mem::size_of::<u64>()
}

/// Index of DR6 (status) and DR7 (control) in `u_debugreg`.
pub const DR6: usize = 6;
/// See [`DR6`].
pub const DR7: usize = 7;

/// `si_code` of a SIGTRAP caused by a hardware breakpoint (`TRAP_HWBKPT`).
pub const TRAP_HWBKPT: i32 = 4;

/// The access kinds a slot can watch, as `GetCapabilities` advertises them:
/// the RW field encodes execution, writes, and reads or writes (SDM
/// §18.2.4); there is no read-only encoding.
pub const ACCESS_KINDS: [Access; 3] = [Access::Write, Access::ReadWrite, Access::Exec];

/// The access that watches reads only: none here (see [`ACCESS_KINDS`]).
pub fn read_only() -> Result<Access, SpecError> {
    Err(SpecError::NoReadOnly(ARCH))
}

/// `perf_event_attr.bp_len` of a perf breakpoint on `len` bytes: an
/// execute breakpoint must say `sizeof(long)` (the kernel's
/// `arch_build_bp_info` refuses any other length for `HW_BREAKPOINT_X`),
/// a data breakpoint its length.
pub fn perf_bp_len(len: WatchLen, access: Access) -> u64 {
    match access {
        Access::Exec => std::mem::size_of::<libc::c_long>() as u64,
        _ => u64::from(len.bytes()),
    }
}

/// Offsets in `struct bpf_perf_event_data`, the context a BPF program
/// attached to a perf event reads (`include/uapi/linux/bpf_perf_event.h`):
/// the user registers (`struct pt_regs`, 21 u64s on x86-64), then
/// `sample_period`, then `addr`.
pub mod perf_ctx {
    /// The instruction pointer (`pt_regs.ip`, the 17th u64): after the
    /// access, for a data breakpoint.
    pub const IP: i16 = 16 * 8;
    /// The breakpoint's address (`addr`, after the 21 registers and
    /// `sample_period`).
    pub const ADDR: i16 = 22 * 8;
}

/// The user registers a breakpoint records at its trap, for the hit's
/// store to be read from them (`backend::stored`): a sample's
/// `PERF_SAMPLE_REGS_USER` (`arch/x86/include/uapi/asm/perf_regs.h`), and
/// the hit program's copy of its context's `struct pt_regs`.
pub mod perf_regs {
    /// `sample_regs_user`: ax, bx, cx, dx, si, di, bp, sp, ip, flags (bits
    /// 0–9) and r8–r15 (bits 16–23); the kernel refuses the segment
    /// registers' bits on x86-64, and has no `fs_base` or `gs_base`.
    pub const SAMPLE_MASK: u64 = 0x3ff | (0xff << 16);
    /// Registers a sample with [`SAMPLE_MASK`] carries, in the order of
    /// their bits.
    pub const SAMPLED: usize = SAMPLE_MASK.count_ones() as usize;
    /// Words of `struct pt_regs` (r15 first, ss last): the first 21 of
    /// `struct user_regs_struct`, in the same order.
    pub const PT_REGS: usize = 21;

    fn zeroed() -> libc::user_regs_struct {
        // SAFETY: a plain C struct of integers; all-zero is valid.
        unsafe { std::mem::zeroed() }
    }

    /// The registers of a sample (`SAMPLED` words, in bit order); the
    /// segment registers and their bases read 0.
    pub fn from_sample(w: &[u64; SAMPLED]) -> libc::user_regs_struct {
        let mut r = zeroed();
        [
            r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.rsp, r.rip, r.eflags,
        ] = w[..10].try_into().expect("ten words");
        [r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15] =
            w[10..].try_into().expect("eight words");
        r
    }

    /// The registers of a `struct pt_regs`; `fs_base` and `gs_base` (not
    /// in it) read 0.
    pub fn from_pt_regs(w: &[u64; PT_REGS]) -> libc::user_regs_struct {
        let mut r = zeroed();
        [
            r.r15, r.r14, r.r13, r.r12, r.rbp, r.rbx, r.r11, r.r10, r.r9, r.r8, r.rax, r.rcx,
            r.rdx, r.rsi, r.rdi, r.orig_rax, r.rip, r.cs, r.eflags, r.rsp, r.ss,
        ] = *w;
        r
    }
}

/// Offsets in `struct pt_regs`, the context of a BPF program attached to a
/// uprobe (`BPF_PROG_TYPE_KPROBE`; `arch/x86/include/asm/ptrace.h`), of the
/// registers a code event reads: the System V AMD64 ABI passes the first
/// six integer arguments in rdi, rsi, rdx, rcx, r8, r9 and returns an
/// integer or pointer in rax (psABI §3.2.3).
pub mod uprobe_ctx {
    /// `rax`: the return value, at a return probe.
    pub const RET: i16 = 10 * 8;
    /// The integer argument registers, in order: rdi, rsi, rdx, rcx, r8, r9.
    pub const ARGS: [i16; 6] = [14 * 8, 13 * 8, 12 * 8, 11 * 8, 9 * 8, 8 * 8];
    /// `rsp`.
    pub const SP: i16 = 19 * 8;
    /// `rip`: after a return probe, the return address.
    pub const IP: i16 = 16 * 8;
    /// The names of [`ARGS`], for messages.
    pub const ARG_NAMES: [&str; 6] = ["rdi", "rsi", "rdx", "rcx", "r8", "r9"];
}

/// The general registers a debugger shows, in [`UserRegs::general`]'s order.
pub const GENERAL_REGISTERS: [&str; 18] = [
    "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11", "r12", "r13",
    "r14", "r15", "rip", "eflags",
];

/// What the daemon reads of a stopped thread's registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UserRegs {
    /// Instruction pointer (`rip`).
    pub ip: u64,
    /// Stack pointer (`rsp`).
    pub sp: u64,
    /// Frame pointer (`rbp`), where [`walk_frame_pointers`] starts.
    pub fp: u64,
    /// Every general register, named by [`GENERAL_REGISTERS`].
    pub general: [u64; 18],
}

impl From<&libc::user_regs_struct> for UserRegs {
    /// From what `PTRACE_GETREGS` fills in.
    fn from(r: &libc::user_regs_struct) -> Self {
        UserRegs {
            ip: r.rip,
            sp: r.rsp,
            fp: r.rbp,
            general: [
                r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.rsp, r.r8, r.r9, r.r10, r.r11,
                r.r12, r.r13, r.r14, r.r15, r.rip, r.eflags,
            ],
        }
    }
}

/// The DR7 bits that program one slot (enable + RW + LEN), to be OR-ed into
/// the whole register the caller keeps (never read back from the thread:
/// kernel-facts §3).
pub fn dr7_slot_bits(slot: usize, len: WatchLen, access: Access) -> u64 {
    debug_assert!(slot < SLOTS);
    let rw = match access {
        Access::Exec => dr7::RW_EXEC,
        Access::Write => dr7::RW_WRITE,
        Access::ReadWrite => dr7::RW_READ_WRITE,
    };
    dr7::local_enable(slot)
        | (rw << dr7::rw_shift(slot))
        | (dr7::len_bits(len.bytes()) << dr7::len_shift(slot))
}

/// `dr7` with slot `slot` set to watch `len` bytes for `access`, the other
/// slots' bits as they were.
pub fn dr7_set_slot(dr7: u64, slot: usize, len: WatchLen, access: Access) -> u64 {
    dr7_clear_slot(dr7, slot) | dr7_slot_bits(slot, len, access)
}

/// `dr7` with every bit of slot `slot` cleared, the other slots' as they
/// were.
pub fn dr7_clear_slot(dr7: u64, slot: usize) -> u64 {
    debug_assert!(slot < SLOTS);
    dr7 & !dr7::slot_mask(slot)
}

/// Validates a request; see [`super::validate`].
pub fn validate(addr: u64, len: u32, access: Access) -> Result<Range, SpecError> {
    if len == 0 {
        return Err(SpecError::Empty);
    }
    if access == Access::Exec && len != 1 {
        return Err(SpecError::ExecLength(len));
    }
    if addr >= KERNEL_HALF {
        return Err(SpecError::NotUserAddress {
            addr,
            why: "it is in the kernel half of the address space",
        });
    }
    if addr >= 1 << 47 {
        return Err(SpecError::NotUserAddress {
            addr,
            why: "it is non-canonical (bits 47..63 must all be equal)",
        });
    }
    if addr >= USER_ADDR_LIMIT || addr + u64::from(len) > USER_ADDR_LIMIT {
        return Err(SpecError::NotUserAddress {
            addr,
            why: "user addresses end at 0x7ffffffff000",
        });
    }
    let needed = pieces_needed(addr, len);
    if needed > SLOTS {
        return Err(SpecError::TooLarge {
            addr,
            len,
            needed,
            slots: SLOTS,
            lengths: "1, 2, 4 or 8",
        });
    }
    Ok(Range {
        addr,
        len,
        pieces: split(addr, len).collect(),
    })
}

/// The aligned pieces covering `[addr, addr + len)` exactly, lowest first:
/// at each address the longest legal length the address is aligned to that
/// does not run past the end (SDM §18.2.5: a slot watches `len` bytes at a
/// multiple of `len`). Greedy from the left is minimal for power-of-two
/// pieces, and never watches a byte outside the range, so every hit is a
/// hit on the range.
fn split(addr: u64, len: u32) -> impl Iterator<Item = Piece> {
    let end = addr + u64::from(len);
    let mut at = addr;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let l = LENGTHS
            .iter()
            .rev()
            .copied()
            .find(|&l| at.is_multiple_of(u64::from(l)) && at + u64::from(l) <= end)
            .expect("length 1 always fits");
        let p = Piece {
            addr: at,
            len: WatchLen::new(l).expect("a legal length"),
        };
        at += u64::from(l);
        Some(p)
    })
}

/// How many pieces [`split`] makes (counted without allocating, so that a
/// huge length is refused in O(log) steps, not O(len)).
fn pieces_needed(addr: u64, len: u32) -> usize {
    let end = addr + u64::from(len);
    let mut at = addr;
    let mut n = 0;
    // Head: up to an 8-byte boundary; body: whole 8-byte pieces; tail.
    while at < end && !at.is_multiple_of(8) {
        let l = [4u64, 2, 1]
            .into_iter()
            .find(|&l| at.is_multiple_of(l) && at + l <= end)
            .expect("length 1 always fits");
        at += l;
        n += 1;
    }
    let body = (end - at) / 8;
    n += body as usize;
    at += body * 8;
    while at < end {
        let l = [4u64, 2, 1]
            .into_iter()
            .find(|&l| at.is_multiple_of(l) && at + l <= end)
            .expect("length 1 always fits");
        at += l;
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DWARF numbers registers in its own order (rdx before rcx and rbx).
    #[test]
    fn dwarf_register_numbers_follow_the_abi() {
        let r = libc::user_regs_struct {
            rax: 1,
            rdx: 2,
            rcx: 3,
            rbx: 4,
            rsi: 5,
            rdi: 6,
            rbp: 7,
            rsp: 8,
            r8: 9,
            r15: 16,
            rip: 17,
            // SAFETY: user_regs_struct is plain integers; all zeros is valid.
            ..unsafe { std::mem::zeroed() }
        };
        let g = UserRegs::from(&r).general;
        let want = [
            (0, 1),
            (1, 2),
            (2, 3),
            (3, 4),
            (4, 5),
            (5, 6),
            (6, 7),
            (7, 8),
            (8, 9),
            (15, 16),
            (16, 17),
        ];
        for (n, v) in want {
            assert_eq!(dwarf_register(&g, n), Some(v), "DWARF register {n}");
        }
        assert_eq!(
            dwarf_register(&g, 17),
            None,
            "xmm0 is not a general register"
        );
        assert_eq!(GENERAL_REGISTERS[usize::from(DWARF_SP)], "rsp");
    }

    #[test]
    fn setting_a_slot_leaves_the_others_as_they_were() {
        let w8 = WatchLen::new(8).unwrap();
        let three = dr7_set_slot(0, 3, WatchLen::new(4).unwrap(), Access::ReadWrite);
        let both = dr7_set_slot(three, 1, w8, Access::Write);
        assert_eq!(both, three | dr7_slot_bits(1, w8, Access::Write));
        // Set again with other bits: the slot's old fields are gone.
        let again = dr7_set_slot(both, 1, WatchLen::new(1).unwrap(), Access::Exec);
        assert_eq!(
            again,
            three | dr7_slot_bits(1, WatchLen::new(1).unwrap(), Access::Exec)
        );
        assert_eq!(dr7_clear_slot(again, 1), three);
        assert_eq!(dr7_clear_slot(three, 3), 0);
    }

    #[test]
    fn slot_mask_covers_enable_rw_len() {
        assert_eq!(dr7::slot_mask(0), 0b11 | (0b1111 << 16));
        assert_eq!(dr7::slot_mask(3), (0b11 << 6) | (0b1111 << 28));
        for s in 0..SLOTS {
            let all = dr7_slot_bits(s, WatchLen::new(8).unwrap(), Access::ReadWrite);
            assert_eq!(
                all & !dr7::slot_mask(s),
                0,
                "slot {s}'s bits inside its mask"
            );
        }
    }

    #[test]
    fn dr6_names_the_slots_hit() {
        // Seen at a hit on slot 0, and on slots 0 and 2 on one address.
        assert_eq!(dr6::slots_hit(0xffff_0ff1), 0b0001);
        assert_eq!(dr6::slots_hit(0xffff_0ff5), 0b0101);
        assert_eq!(dr6::slots_hit(0xffff_0ff0), 0);
    }

    fn check(addr: u64, len: u32, access: Access, expected: Result<&[(u64, u32)], &str>) {
        let got = validate(addr, len, access).map_err(|e| e.to_string());
        match (got, expected) {
            (Ok(r), Ok(want)) => {
                let pieces: Vec<(u64, u32)> =
                    r.pieces.iter().map(|p| (p.addr, p.len.bytes())).collect();
                assert_eq!(pieces, want, "{addr:#x}/{len}");
                assert_eq!((r.addr, r.len), (addr, len));
            }
            (Err(e), Err(want)) => {
                assert!(e.contains(want), "{addr:#x}/{len}: {e:?} lacks {want:?}")
            }
            (got, want) => panic!("{addr:#x}/{len}/{access:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn validation_table() {
        check(0x1000, 8, Access::Write, Ok(&[(0x1000, 8)]));
        check(0x1004, 4, Access::ReadWrite, Ok(&[(0x1004, 4)]));
        check(0x1001, 1, Access::Exec, Ok(&[(0x1001, 1)]));
        check(0, 8, Access::Write, Ok(&[(0, 8)]));
        // Unaligned or odd lengths: split into aligned pieces, exactly.
        check(
            0x1001,
            8,
            Access::Write,
            Ok(&[(0x1001, 1), (0x1002, 2), (0x1004, 4), (0x1008, 1)]),
        );
        check(0x1002, 4, Access::Write, Ok(&[(0x1002, 2), (0x1004, 2)]));
        check(0x1001, 2, Access::Write, Ok(&[(0x1001, 1), (0x1002, 1)]));
        check(0x1000, 3, Access::Write, Ok(&[(0x1000, 2), (0x1002, 1)]));
        check(0x1000, 16, Access::Write, Ok(&[(0x1000, 8), (0x1008, 8)]));
        check(
            0x1000,
            32,
            Access::Write,
            Ok(&[(0x1000, 8), (0x1008, 8), (0x1010, 8), (0x1018, 8)]),
        );
        check(
            0x1000,
            24,
            Access::Write,
            Ok(&[(0x1000, 8), (0x1008, 8), (0x1010, 8)]),
        );
        check(
            0x1000,
            33,
            Access::Write,
            Err("need 5 debug-register slots"),
        );
        check(
            0x1004,
            32,
            Access::Write,
            Err("need 5 debug-register slots"),
        );
        check(0x1000, u32::MAX, Access::Write, Err("need 536870914"));
        check(0x1000, 0, Access::Write, Err("length 0"));
        check(
            0x1000,
            4,
            Access::Exec,
            Err("exec watchpoint must have length 1"),
        );
        check(0xffff_ffff_8100_0000, 8, Access::Write, Err("kernel half"));
        check(
            0x0000_8000_0000_0000,
            8,
            Access::Write,
            Err("non-canonical"),
        );
        check(0x7fff_ffff_f000, 8, Access::Write, Err("end at"));
        check(
            0x7fff_ffff_eff8,
            8,
            Access::Write,
            Ok(&[(0x7fff_ffff_eff8, 8)]),
        );
    }

    #[test]
    fn the_count_agrees_with_the_split() {
        for addr in 0x1000..0x1010u64 {
            for len in 1..=40u32 {
                let pieces: Vec<Piece> = split(addr, len).collect();
                assert_eq!(pieces.len(), pieces_needed(addr, len), "{addr:#x}/{len}");
                let mut at = addr;
                for p in &pieces {
                    assert_eq!(p.addr, at, "contiguous");
                    assert!(p.addr.is_multiple_of(u64::from(p.len.bytes())), "aligned");
                    at += u64::from(p.len.bytes());
                }
                assert_eq!(at, addr + u64::from(len), "exact cover");
            }
        }
    }

    #[test]
    fn debugreg_offsets_follow_struct_user() {
        assert_eq!(debugreg_offset(1) - debugreg_offset(0), 8);
        assert_eq!(
            debugreg_offset(0),
            848,
            "offsetof(struct user, u_debugreg) on x86-64"
        );
    }

    #[test]
    fn dr7_matches_measured_encoding() {
        // kernel-facts §1: slot 0, write, 8 bytes = 0x90001.
        assert_eq!(
            dr7_slot_bits(0, WatchLen::new(8).unwrap(), Access::Write),
            0x90001
        );
        // Slot 3, rw, 4 bytes: L3 (bit 6) | RW=11 at 28 | LEN=11 at 30.
        assert_eq!(
            dr7_slot_bits(3, WatchLen::new(4).unwrap(), Access::ReadWrite),
            (1 << 6) | (0b11 << 28) | (0b11 << 30)
        );
        assert_eq!(
            dr7_slot_bits(1, WatchLen::new(1).unwrap(), Access::Exec),
            1 << 2
        );
    }
}

/// DWARF's number of the stack pointer (`rsp`), for call frame information.
pub const DWARF_SP: u16 = 7;
/// DWARF's number of the frame pointer (`rbp`).
pub const DWARF_FP: u16 = 6;
/// DWARF's number of the return address column.
pub const DWARF_RA: u16 = 16;

/// The value of DWARF register `n` among [`UserRegs::general`] (DWARF's
/// x86-64 numbering: rax, rdx, rcx, rbx, rsi, rdi, rbp, rsp, r8–r15, then
/// the return address column, which is `rip` in the innermost frame).
pub fn dwarf_register(general: &[u64; 18], n: u16) -> Option<u64> {
    let i = match n {
        0 => 0,
        1 => 3,
        2 => 2,
        3 => 1,
        4..=16 => usize::from(n),
        _ => return None,
    };
    Some(general[i])
}

/// The return addresses of a stopped thread's callers, innermost first, up
/// to `depth`, walked along frame pointers as the kernel's perf call chains
/// are (System V x86-64 ABI with `-fno-omit-frame-pointer`): `[fp]` is the
/// caller's frame pointer, `[fp + 8]` the return address. `read(at)` gives
/// the 16 bytes at `at`. The walk ends at a frame pointer that is 0,
/// unaligned, below the stack pointer `sp` or not above the previous one
/// (frames grow down), or unreadable, and says why it stopped early.
pub fn walk_frame_pointers(
    mut read: impl FnMut(u64) -> Option<Vec<u8>>,
    fp: u64,
    sp: u64,
    depth: usize,
) -> (Vec<u64>, Option<&'static str>) {
    const NO_FP: &str = "the frame-pointer chain ended: code built without frame pointers";
    let mut out = Vec::with_capacity(depth.min(128));
    let mut fp = fp;
    while out.len() < depth {
        if fp == 0 {
            return (out, None); // the outermost frame
        }
        if !fp.is_multiple_of(8) || fp < sp {
            return (out, Some(NO_FP));
        }
        let Some(b) = read(fp).filter(|b| b.len() >= 16) else {
            return (
                out,
                Some("the frame-pointer chain led to unreadable memory"),
            );
        };
        let next = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
        let ret = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
        if ret == 0 {
            return (out, None);
        }
        out.push(ret);
        if next != 0 && next <= fp {
            return (out, Some(NO_FP));
        }
        fp = next;
    }
    (out, None)
}

#[cfg(test)]
mod walk_tests {
    use super::walk_frame_pointers;

    /// A fake stack: frame at `fp` holds (next fp, return address).
    fn stack(frames: &[(u64, u64, u64)]) -> impl FnMut(u64) -> Option<Vec<u8>> {
        let frames = frames.to_vec();
        move |at| {
            frames.iter().find(|f| f.0 == at).map(|&(_, next, ret)| {
                let mut b = next.to_le_bytes().to_vec();
                b.extend_from_slice(&ret.to_le_bytes());
                b
            })
        }
    }

    #[test]
    fn walks_to_the_outermost_frame_and_stops_at_depth() {
        let s = [
            (0x1000, 0x1100, 0xa),
            (0x1100, 0x1200, 0xb),
            (0x1200, 0, 0xc),
        ];
        assert_eq!(
            walk_frame_pointers(stack(&s), 0x1000, 0xff0, 10),
            (vec![0xa, 0xb, 0xc], None)
        );
        assert_eq!(
            walk_frame_pointers(stack(&s), 0x1000, 0xff0, 2),
            (vec![0xa, 0xb], None)
        );
    }

    #[test]
    fn says_why_a_chain_ends_early() {
        // A frame pointer going down (not a frame pointer at all).
        let s = [(0x1000, 0x800, 0xa)];
        let (chain, note) = walk_frame_pointers(stack(&s), 0x1000, 0xff0, 10);
        assert_eq!(chain, vec![0xa]);
        assert!(note.unwrap().contains("without frame pointers"));
        // Unreadable, unaligned, below the stack pointer.
        let (chain, note) = walk_frame_pointers(stack(&[]), 0x1000, 0xff0, 10);
        assert!(chain.is_empty() && note.unwrap().contains("unreadable"));
        let (_, note) = walk_frame_pointers(stack(&s), 0x1003, 0xff0, 10);
        assert!(note.is_some());
        let (_, note) = walk_frame_pointers(stack(&s), 0x1000, 0x2000, 10);
        assert!(note.is_some());
    }
}
