//! The bytes a store wrote, from the instruction and the registers of the
//! thread that made it.
//!
//! A data breakpoint traps after the instruction, and by the time the
//! daemon reads the watched memory another thread may have stored there
//! again (on the ptrace backend about one hit in eight, when two threads
//! store into one variable without pause: kernel-facts §26). For the
//! instructions whose stored value the registers still hold after them (a
//! `mov` from a register or an immediate, `movnti`, `stos`, `push`,
//! `cmpxchg`, SSE moves from an XMM register), the hit's value is what the
//! instruction wrote, whatever happened since. Read-modify-write
//! instructions (`add`, `inc`, `xchg`, `xadd`, ...) leave no such trace:
//! their hits keep the value read from memory.

use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};

/// One decoded instruction.
pub use iced_x86::Instruction;

/// What one instruction stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// Where.
    pub addr: u64,
    /// The bytes, in memory order.
    pub bytes: Vec<u8>,
}

impl Stored {
    /// `memory` (the bytes at `at`, read after the store) with the bytes
    /// this store wrote put back where they overlap it; `None` when the
    /// store wrote none of them.
    pub fn over(&self, at: u64, memory: &[u8]) -> Option<Vec<u8>> {
        let mut out = memory.to_vec();
        self.write_over(at, &mut out).then_some(out)
    }

    /// [`Stored::over`] in place: whether the store wrote any of
    /// `memory`'s bytes (then put back).
    pub fn write_over(&self, at: u64, memory: &mut [u8]) -> bool {
        let Some((from, to)) = self.overlap(at, memory.len()) else {
            return false;
        };
        let (m, s, n) = (
            (from - at) as usize,
            (from - self.addr) as usize,
            (to - from) as usize,
        );
        memory[m..m + n].copy_from_slice(&self.bytes[s..s + n]);
        true
    }

    /// The `len` bytes at `at`, when this store wrote every one of them.
    pub fn covering(&self, at: u64, len: usize) -> Option<Vec<u8>> {
        let (from, to) = self.overlap(at, len)?;
        let s = (from - self.addr) as usize;
        (from == at && to - from == len as u64).then(|| self.bytes[s..s + len].to_vec())
    }

    /// The addresses `[from, to)` this store wrote among the `len` bytes at
    /// `at`; `None` when it wrote none of them.
    fn overlap(&self, at: u64, len: usize) -> Option<(u64, u64)> {
        let end = at.checked_add(len as u64)?;
        let store_end = self.addr.checked_add(self.bytes.len() as u64)?;
        let (from, to) = (at.max(self.addr), end.min(store_end));
        (from < to).then_some((from, to))
    }
}

/// The registers of the stopped thread, as `PTRACE_GETREGS` and (asked for
/// only when an instruction stores from an XMM register) `PTRACE_GETFPREGS`
/// give them.
pub struct Registers<'a, F> {
    /// The general registers, after the instruction.
    pub general: &'a libc::user_regs_struct,
    /// XMM0–XMM15, each in memory order; `None` when unreadable.
    pub xmm: F,
}

const EFLAGS_ZF: u64 = 1 << 6;
const EFLAGS_DF: u64 = 1 << 10;

/// The instruction of `code` (the bytes from `code_at`, where one starts:
/// a function's entry) that ends just before `ip`, read forwards. x86 code
/// cannot be read backwards: the bytes before an instruction may decode,
/// with it, as a longer instruction (a REX byte that ends the instruction
/// before reads as part of a store, `89 44 24 24` as `41 89 44 24 24`),
/// which a backward reading takes for a store of another effect in 0.2%
/// of libc's stores and of a Rust program's, and cannot decide for 1–2%
/// (kernel-facts §26). `None` when the
/// instructions from `code_at` step over `ip`.
pub fn instruction_ending_at(code: &[u8], code_at: u64, ip: u64) -> Option<Instruction> {
    let mut d = Decoder::with_ip(64, code, code_at, DecoderOptions::NONE);
    let mut i = Instruction::default();
    while d.can_decode() {
        d.decode_out(&mut i);
        if i.is_invalid() || i.next_ip() > ip {
            return None;
        }
        if i.next_ip() == ip {
            return Some(i);
        }
    }
    None
}

/// What `i` (a store that has just run) wrote into `[at, at + len)`, from
/// the registers after it; `None` when it is none of the stores above or
/// wrote none of those bytes.
pub fn stored<F>(
    i: &Instruction,
    at: u64,
    len: usize,
    regs: &mut Registers<'_, F>,
) -> Option<Stored>
where
    F: FnMut() -> Option<[[u8; 16]; 16]>,
{
    stored_by(i, regs).filter(|s| s.overlap(at, len).is_some())
}

/// What `i` stored, from the registers after it.
fn stored_by<F>(i: &Instruction, regs: &mut Registers<'_, F>) -> Option<Stored>
where
    F: FnMut() -> Option<[[u8; 16]; 16]>,
{
    let g = regs.general;
    let size = i.memory_size().size();
    let value = |v: u64, n: usize| v.to_le_bytes()[..n.min(8)].to_vec();
    let (addr, bytes) = match i.mnemonic() {
        Mnemonic::Mov | Mnemonic::Movnti if i.op0_kind() == OpKind::Memory => {
            let v = match i.op1_kind() {
                OpKind::Register => general(i.op1_register(), g)?,
                OpKind::Immediate8
                | OpKind::Immediate16
                | OpKind::Immediate32
                | OpKind::Immediate32to64 => i.immediate(1),
                _ => return None,
            };
            (address(i, g)?, value(v, size))
        }
        Mnemonic::Cmpxchg if i.op0_kind() == OpKind::Memory => {
            // Equal: the source register went in. Not: the destination was
            // written back with its own value, now in the accumulator.
            let v = if g.eflags & EFLAGS_ZF != 0 {
                general(i.op1_register(), g)?
            } else {
                g.rax
            };
            (address(i, g)?, value(v, size))
        }
        Mnemonic::Stosb | Mnemonic::Stosw | Mnemonic::Stosd | Mnemonic::Stosq => {
            // %rdi has moved past the element just stored.
            let n = size as u64;
            let addr = if g.eflags & EFLAGS_DF != 0 {
                g.rdi.wrapping_add(n)
            } else {
                g.rdi.wrapping_sub(n)
            };
            (addr, value(g.rax, size))
        }
        Mnemonic::Push => {
            // The stack's memory is no operand: the push's size is how far
            // %rsp moved (8; 2 with an operand-size prefix).
            let size = usize::try_from(-i.stack_pointer_increment()).ok()?;
            let v = match i.op0_kind() {
                // `push %rsp` stores %rsp as it was before.
                OpKind::Register if i.op0_register() == Register::RSP => g.rsp.wrapping_add(8),
                OpKind::Register => general(i.op0_register(), g)?,
                OpKind::Immediate8to64 | OpKind::Immediate32to64 => i.immediate(0),
                _ => return None,
            };
            return Some(Stored {
                addr: g.rsp,
                bytes: value(v, size),
            });
        }
        m if xmm_store(m) && i.op0_kind() == OpKind::Memory => {
            let r = i.op1_register();
            // XMM16–XMM31 (AVX-512) are not in PTRACE_GETFPREGS's area,
            // and a masked store writes only some of the elements.
            if !r.is_xmm() || r.number() >= 16 || i.op_mask() != Register::None {
                return None;
            }
            let xmm = (regs.xmm)()?;
            let v = xmm[r.number()];
            let part = if matches!(m, Mnemonic::Movhps | Mnemonic::Movhpd) {
                &v[8..16]
            } else {
                &v[..size.min(16)]
            };
            (address(i, g)?, part.to_vec())
        }
        _ => return None,
    };
    (bytes.len() == size && size > 0).then_some(Stored { addr, bytes })
}

/// XMM0–XMM15 of the stopped tracee `tid` (`PTRACE_GETFPREGS`), each in
/// memory order.
pub fn xmm_of(tid: i32) -> Option<[[u8; 16]; 16]> {
    // SAFETY: a plain C struct of integers; all-zero is valid.
    let mut fp: libc::user_fpregs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: PTRACE_GETFPREGS writes one user_fpregs_struct where the
    // pointer points, and only for a tracee of this thread in a stop (else
    // it fails and writes nothing).
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_GETFPREGS,
            tid,
            0,
            &mut fp as *mut libc::user_fpregs_struct,
        )
    };
    if r != 0 {
        return None;
    }
    let mut out = [[0u8; 16]; 16];
    for (k, w) in fp.xmm_space.iter().enumerate() {
        out[k / 4][(k % 4) * 4..(k % 4) * 4 + 4].copy_from_slice(&w.to_le_bytes());
    }
    Some(out)
}

/// Whether `i` addresses memory through `%fs` or `%gs` (thread-local
/// storage), whose base registers only ptrace reads.
pub fn needs_segment_bases(i: &Instruction) -> bool {
    matches!(i.memory_segment(), Register::FS | Register::GS)
}

/// Whether `i` is one of the stores [`stored`] reads the value of.
pub fn is_decoded_store(i: &Instruction) -> bool {
    match i.mnemonic() {
        Mnemonic::Mov | Mnemonic::Movnti | Mnemonic::Cmpxchg => i.op0_kind() == OpKind::Memory,
        Mnemonic::Stosb | Mnemonic::Stosw | Mnemonic::Stosd | Mnemonic::Stosq | Mnemonic::Push => {
            true
        }
        m => xmm_store(m) && i.op0_kind() == OpKind::Memory && i.op1_register().is_xmm(),
    }
}

/// SSE and AVX moves to memory whose source XMM register keeps the value.
fn xmm_store(m: Mnemonic) -> bool {
    use Mnemonic::*;
    matches!(
        m,
        Movd | Movq
            | Movss
            | Movsd
            | Movaps
            | Movups
            | Movapd
            | Movupd
            | Movdqa
            | Movdqu
            | Movntdq
            | Movntps
            | Movntpd
            | Movlps
            | Movlpd
            | Movhps
            | Movhpd
            | Vmovd
            | Vmovq
            | Vmovss
            | Vmovsd
            | Vmovaps
            | Vmovups
            | Vmovapd
            | Vmovupd
            | Vmovdqa
            | Vmovdqu
            | Vmovntdq
            | Vmovntps
            | Vmovntpd
            | Vmovlps
            | Vmovlpd
            | Vmovhps
            | Vmovhpd
    )
}

/// The memory operand's address (operand 0), from the registers.
fn address(i: &Instruction, g: &libc::user_regs_struct) -> Option<u64> {
    i.virtual_address(0, 0, |r, _, _| match r {
        Register::ES | Register::CS | Register::SS | Register::DS => Some(0),
        Register::FS => Some(g.fs_base),
        Register::GS => Some(g.gs_base),
        r => general(r, g),
    })
}

/// A general register's value (any width), from `g`.
fn general(r: Register, g: &libc::user_regs_struct) -> Option<u64> {
    let full = match r.full_register() {
        Register::RAX => g.rax,
        Register::RBX => g.rbx,
        Register::RCX => g.rcx,
        Register::RDX => g.rdx,
        Register::RSI => g.rsi,
        Register::RDI => g.rdi,
        Register::RBP => g.rbp,
        Register::RSP => g.rsp,
        Register::R8 => g.r8,
        Register::R9 => g.r9,
        Register::R10 => g.r10,
        Register::R11 => g.r11,
        Register::R12 => g.r12,
        Register::R13 => g.r13,
        Register::R14 => g.r14,
        Register::R15 => g.r15,
        _ => return None,
    };
    Some(match r {
        Register::AH | Register::BH | Register::CH | Register::DH => (full >> 8) & 0xff,
        r => match r.size() {
            8 => full,
            n => full & ((1u64 << (8 * n)) - 1),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs() -> libc::user_regs_struct {
        // SAFETY: a plain C struct of integers; all-zero is valid.
        unsafe { std::mem::zeroed() }
    }

    fn no_xmm() -> Option<[[u8; 16]; 16]> {
        None
    }

    /// `code`, one instruction ending at `ip`: what it stored into
    /// `[at, at + len)`.
    fn store(
        code: &[u8],
        ip: u64,
        at: u64,
        len: usize,
        g: &libc::user_regs_struct,
    ) -> Option<Stored> {
        store_with(
            code,
            ip,
            at,
            len,
            &mut Registers {
                general: g,
                xmm: no_xmm,
            },
        )
    }

    fn store_with<F: FnMut() -> Option<[[u8; 16]; 16]>>(
        code: &[u8],
        ip: u64,
        at: u64,
        len: usize,
        r: &mut Registers<'_, F>,
    ) -> Option<Stored> {
        let start = ip - code.len() as u64;
        let i = instruction_ending_at(code, start, ip)?;
        assert_eq!(i.ip(), start, "{code:x?} is one instruction");
        stored(&i, at, len, r)
    }

    #[test]
    fn a_rip_relative_mov_from_a_register_stored_the_register() {
        // mov %rax,0x2ee5(%rip) at 0x1000 (7 bytes): stores at 0x1007+0x2ee5.
        let code = [0x48, 0x89, 0x05, 0xe5, 0x2e, 0x00, 0x00];
        let mut g = regs();
        g.rax = 0x1122_3344_5566_7788;
        let s = store(&code, 0x1007, 0x3eec, 8, &g).unwrap();
        assert_eq!(s.addr, 0x3eec);
        assert_eq!(s.bytes, 0x1122_3344_5566_7788u64.to_le_bytes());
        // Not where it stored: not this store.
        assert_eq!(store(&code, 0x1007, 0x5000, 8, &g), None);
    }

    #[test]
    fn narrow_registers_and_immediates_store_their_width() {
        let mut g = regs();
        g.rbx = 0x1000;
        g.rax = 0xaabb_ccdd;
        // mov %eax,(%rbx)
        let s = store(&[0x89, 0x03], 0x40_0002, 0x1000, 4, &g).unwrap();
        assert_eq!(s.bytes, vec![0xdd, 0xcc, 0xbb, 0xaa]);
        // mov %ah,(%rbx)
        let s = store(&[0x88, 0x23], 0x40_0002, 0x1000, 1, &g).unwrap();
        assert_eq!(s.bytes, vec![0xcc]);
        // movq $-2,0x8(%rbx): the immediate sign-extended to 8 bytes.
        let code = [0x48, 0xc7, 0x43, 0x08, 0xfe, 0xff, 0xff, 0xff];
        let s = store(&code, 0x40_0008, 0x1008, 8, &g).unwrap();
        assert_eq!(s.bytes, (-2i64).to_le_bytes());
        // movw $0x1234,(%rbx)
        let s = store(&[0x66, 0xc7, 0x03, 0x34, 0x12], 0x40_0005, 0x1000, 2, &g).unwrap();
        assert_eq!(s.bytes, vec![0x34, 0x12]);
    }

    #[test]
    fn a_thread_local_store_adds_the_fs_base() {
        // mov %rdx,%fs:0xfffffffffffffff8 (64 48 89 14 25 f8 ff ff ff)
        let code = [0x64, 0x48, 0x89, 0x14, 0x25, 0xf8, 0xff, 0xff, 0xff];
        let mut g = regs();
        g.fs_base = 0x7f00_0000_1000;
        g.rdx = 7;
        let s = store(&code, 0x40_0009, 0x7f00_0000_0ff8, 8, &g).unwrap();
        assert_eq!(s.addr, 0x7f00_0000_0ff8);
        assert_eq!(s.bytes, 7u64.to_le_bytes());
    }

    #[test]
    fn read_modify_write_instructions_are_not_decoded() {
        let mut g = regs();
        g.rbx = 0x1000;
        // add %eax,(%rbx); lock xadd %eax,(%rbx); xchg %eax,(%rbx); incl (%rbx)
        for code in [
            &[0x01, 0x03][..],
            &[0xf0, 0x0f, 0xc1, 0x03],
            &[0x87, 0x03],
            &[0xff, 0x03],
        ] {
            let ip = 0x40_0000 + code.len() as u64;
            assert_eq!(store(code, ip, 0x1000, 4, &g), None, "{code:x?}");
        }
    }

    #[test]
    fn cmpxchg_stores_the_source_when_equal_and_the_old_value_when_not() {
        // lock cmpxchg %ecx,(%rbx)
        let code = [0xf0, 0x0f, 0xb1, 0x0b];
        let mut g = regs();
        g.rbx = 0x1000;
        g.rcx = 5;
        g.rax = 9;
        g.eflags = EFLAGS_ZF;
        assert_eq!(
            store(&code, 0x40_0004, 0x1000, 4, &g).unwrap().bytes,
            5u32.to_le_bytes()
        );
        g.eflags = 0;
        assert_eq!(
            store(&code, 0x40_0004, 0x1000, 4, &g).unwrap().bytes,
            9u32.to_le_bytes()
        );
    }

    #[test]
    fn stos_and_push_store_behind_the_registers_they_moved() {
        let mut g = regs();
        g.rdi = 0x1008;
        g.rax = 0x55;
        // stosq, direction flag clear: stored at %rdi - 8.
        let s = store(&[0x48, 0xab], 0x40_0002, 0x1000, 8, &g).unwrap();
        assert_eq!((s.addr, s.bytes), (0x1000, 0x55u64.to_le_bytes().to_vec()));
        // push %rbx: stored at %rsp.
        g.rsp = 0x7ff0;
        g.rbx = 0xdead;
        let s = store(&[0x53], 0x40_0001, 0x7ff0, 8, &g).unwrap();
        assert_eq!(s.bytes, 0xdeadu64.to_le_bytes());
        // push %rsp stores %rsp as it was.
        let s = store(&[0x54], 0x40_0001, 0x7ff0, 8, &g).unwrap();
        assert_eq!(s.bytes, 0x7ff8u64.to_le_bytes());
    }

    #[test]
    fn an_xmm_store_reads_the_register_only_then() {
        // movups %xmm1,(%rbx) then movhps %xmm1,(%rbx)
        let mut g = regs();
        g.rbx = 0x1000;
        let mut x = [[0u8; 16]; 16];
        x[1] = std::array::from_fn(|k| k as u8);
        let mut asked = 0;
        let mut r = Registers {
            general: &g,
            xmm: || {
                asked += 1;
                Some(x)
            },
        };
        let s = store_with(&[0x0f, 0x11, 0x0b], 0x40_0003, 0x1000, 16, &mut r).unwrap();
        assert_eq!(s.bytes, x[1].to_vec());
        let s = store_with(&[0x0f, 0x17, 0x0b], 0x40_0003, 0x1000, 8, &mut r).unwrap();
        assert_eq!(s.bytes, x[1][8..].to_vec());
        // A general store does not read the XMM registers.
        store_with(&[0x89, 0x03], 0x40_0002, 0x1000, 4, &mut r).unwrap();
        assert_eq!(asked, 2);
    }

    #[test]
    fn avx512_registers_and_masked_stores_are_not_decoded() {
        let mut g = regs();
        g.rbx = 0x1000;
        let mut r = Registers {
            general: &g,
            xmm: || Some([[7u8; 16]; 16]),
        };
        // vmovdqu64 %xmm16,(%rbx) and vmovdqu32 %xmm1,(%rbx){%k1}
        for code in [
            &[0x62, 0xe1, 0xfe, 0x08, 0x7f, 0x03][..],
            &[0x62, 0xf1, 0x7e, 0x09, 0x7f, 0x0b],
        ] {
            let ip = 0x40_0000 + code.len() as u64;
            assert_eq!(store_with(code, ip, 0x1000, 16, &mut r), None, "{code:x?}");
        }
    }

    #[test]
    fn the_store_is_put_over_the_bytes_read_where_they_overlap() {
        let s = Stored {
            addr: 0x1004,
            bytes: vec![1, 2, 3, 4, 5, 6, 7, 8],
        };
        // The watched 8 bytes at 0x1000: the store covers their upper half.
        assert_eq!(s.over(0x1000, &[9; 8]), Some(vec![9, 9, 9, 9, 1, 2, 3, 4]));
        assert_eq!(s.over(0x2000, &[9; 8]), None);
    }

    #[test]
    fn instructions_are_read_forwards_from_a_known_start() {
        // mov $0x48,%al; mov %eax,(%rbx): read backwards from the end, the
        // 0x48 would make the store `mov %rax,(%rbx)`.
        let code = [0xb0, 0x48, 0x89, 0x03];
        let i = instruction_ending_at(&code, 0x1000, 0x1004).unwrap();
        assert_eq!((i.ip(), i.len()), (0x1002, 2));
        let mut g = regs();
        g.rbx = 0x2000;
        g.rax = 0x1_0000_0048;
        let s = stored(
            &i,
            0x2000,
            8,
            &mut Registers {
                general: &g,
                xmm: no_xmm,
            },
        )
        .unwrap();
        assert_eq!(s.bytes, vec![0x48, 0, 0, 0]);
        // An end inside an instruction: none ends there.
        assert_eq!(instruction_ending_at(&code, 0x1000, 0x1003), None);
    }
}

#[cfg(test)]
mod measured {
    use super::*;
    use crate::symbols::cfi::Cfi;
    use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

    /// The longest decoding that ends at `ip` and is a store, of the bytes
    /// `code` before it, when the others are it less leading prefixes: the
    /// best a backward reading can do.
    fn backwards(code: &[u8], ip: u64) -> Option<Instruction> {
        let mut longest: Option<Instruction> = None;
        let mut shortest = usize::MAX;
        for back in 1..=code.len() {
            let mut d = Decoder::with_ip(64, &code[code.len() - back..], ip - back as u64, 0);
            let i = d.decode();
            if !i.is_invalid() && i.len() == back && is_decoded_store(&i) {
                shortest = shortest.min(back);
                longest = Some(i);
            }
        }
        let l = longest?;
        let extra = &code[code.len() - l.len()..code.len() - shortest];
        let prefix = |b: &u8| {
            matches!(
                b,
                0x26 | 0x2e | 0x36 | 0x3e | 0x64..=0x67 | 0xf0 | 0xf2 | 0xf3 | 0x40..=0x4f
            )
        };
        extra.iter().all(prefix).then_some(l)
    }

    /// What `i` stores with every register holding a value of its own: two
    /// decodings with the same effect differ at most in prefixes that
    /// change nothing here (`xrelease`, a segment override of a flat
    /// segment, a REX that widens no operand).
    fn effect(i: &Instruction) -> Option<Stored> {
        // SAFETY: a plain C struct of integers; all-zero is valid.
        let mut g: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        let v: [u64; 18] =
            std::array::from_fn(|k| (k as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let r = &mut g;
        [r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.rsp, r.r8] = v[..9].try_into().unwrap();
        [
            r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.fs_base, r.gs_base,
        ] = v[9..].try_into().unwrap();
        let xmm = || Some(std::array::from_fn(|k| [k as u8 + 1; 16]));
        stored_by(i, &mut Registers { general: &g, xmm })
    }

    /// Every store [`stored`] reads, in every function of `path` (decoded
    /// from its symbol): (how many, found reading forwards from the start
    /// of its call frame information entry, found reading backwards (or an
    /// instruction with the same effect), another instruction taken for it
    /// reading backwards).
    fn count(path: &str) -> (usize, usize, usize, usize) {
        let data = std::fs::read(path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let cfi = Cfi::of(&file).unwrap();
        let text = file.section_by_name(".text").unwrap();
        let (base, bytes) = (text.address(), text.data().unwrap());
        let at = |a: u64| (a - base) as usize;
        let (mut all, mut forwards, mut back, mut wrong) = (0, 0, 0, 0);
        for sym in file.symbols().chain(file.dynamic_symbols()) {
            let (lo, hi) = (sym.address(), sym.address() + sym.size());
            if sym.kind() != SymbolKind::Text || lo == hi || lo < base || at(hi) > bytes.len() {
                continue;
            }
            let mut d = Decoder::with_ip(64, &bytes[at(lo)..at(hi)], lo, 0);
            for i in d.iter().filter(|i| !i.is_invalid() && is_decoded_store(i)) {
                all += 1;
                let ip = i.next_ip();
                let from = cfi
                    .function_start(i.ip())
                    .filter(|&f| f >= base && f <= i.ip());
                if let Some(f) = from
                    && instruction_ending_at(&bytes[at(f)..at(ip)], f, ip) == Some(i)
                {
                    forwards += 1;
                }
                match backwards(&bytes[at(ip).saturating_sub(15)..at(ip)], ip) {
                    Some(b) if effect(&b) == effect(&i) => back += 1,
                    Some(_) => wrong += 1,
                    None => {}
                }
            }
        }
        (all, forwards, back, wrong)
    }

    /// kernel-facts §26: read forwards from where their call frame
    /// information starts, every store of libc is found; read backwards,
    /// some are taken for another instruction. (`/proc/self/exe`, this
    /// test program, shows the same in 30 s instead of 1.)
    #[test]
    fn stores_are_found_forwards_from_their_functions_and_not_always_backwards() {
        let path = "/lib/x86_64-linux-gnu/libc.so.6";
        let (all, forwards, back, wrong) = count(path);
        eprintln!(
            "{path}: {all} stores; forwards from their CFI entry {forwards}; \
             backwards {back}, another instruction {wrong}"
        );
        assert!(all > 10_000, "{path}: {all} stores");
        assert_eq!(forwards, all, "{path}");
        assert!(wrong > 0, "{path}");
    }
}
