//! x86-64 machine instructions as a debugger's step needs them, decoded
//! with `iced-x86`: where control can go after each one (a return, a call,
//! a jump and its target), their text for a disassembly view, and the way
//! out of the kernel's uretprobe trampoline.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Formatter, GasFormatter, Instruction};

/// Where control goes after an instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// To the next instruction.
    Next,
    /// A call (direct or not).
    Call,
    /// A return.
    Return,
    /// A jump: its target when the instruction names it.
    Jump {
        /// The target.
        target: Option<u64>,
        /// Taken or not (`jcc`, `loop`).
        conditional: bool,
    },
    /// Anything else that changes the flow (an interrupt, `syscall`, an
    /// undefined instruction).
    Other,
}

/// One instruction decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insn {
    /// Its address.
    pub addr: u64,
    /// Its length in bytes.
    pub len: usize,
    /// Where control goes after it.
    pub flow: Flow,
}

fn flow_of(i: &Instruction) -> Flow {
    let target = || match i.op0_kind() {
        iced_x86::OpKind::NearBranch16
        | iced_x86::OpKind::NearBranch32
        | iced_x86::OpKind::NearBranch64 => Some(i.near_branch_target()),
        _ => None,
    };
    match i.flow_control() {
        FlowControl::Next => Flow::Next,
        FlowControl::Call | FlowControl::IndirectCall => Flow::Call,
        FlowControl::Return => Flow::Return,
        FlowControl::UnconditionalBranch | FlowControl::IndirectBranch => Flow::Jump {
            target: target(),
            conditional: false,
        },
        FlowControl::ConditionalBranch => Flow::Jump {
            target: target(),
            conditional: true,
        },
        _ => Flow::Other,
    }
}

/// The instructions of `bytes`, the first at `addr`, in order (an invalid
/// encoding ends the list).
pub fn decode(bytes: &[u8], addr: u64) -> Vec<Insn> {
    let mut d = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
    let mut out = Vec::new();
    let mut i = Instruction::default();
    while d.can_decode() {
        d.decode_out(&mut i);
        if i.is_invalid() {
            break;
        }
        out.push(Insn {
            addr: i.ip(),
            len: i.len(),
            flow: flow_of(&i),
        });
    }
    out
}

/// One instruction of a disassembly view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Its address.
    pub addr: u64,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Its text in the GNU assembler's syntax (`mov %rsp,%rbp`).
    pub text: String,
}

/// Up to `count` instructions of `bytes` (the first at `addr`) as text;
/// an undecodable byte is shown as `(bad)` and skipped.
pub fn disassemble(bytes: &[u8], addr: u64, count: usize) -> Vec<Line> {
    let mut d = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
    let mut f = GasFormatter::new();
    f.options_mut().set_first_operand_char_index(8);
    let mut out = Vec::new();
    let mut i = Instruction::default();
    while d.can_decode() && out.len() < count {
        let at = d.position();
        d.decode_out(&mut i);
        let mut text = String::new();
        if i.is_invalid() {
            text.push_str("(bad)");
        } else {
            f.format(&i, &mut text);
        }
        out.push(Line {
            addr: i.ip(),
            bytes: bytes[at..at + i.len().max(1)].to_vec(),
            text,
        });
    }
    out
}

/// The longest instruction: a call's return address is at most this far
/// past the call's own address.
pub const MAX_INSN: u64 = 15;

/// A thread stopped in the kernel's uretprobe trampoline (Linux 6.11+:
/// `push %rax; push %rcx; push %r11; mov $__NR_uretprobe,%rax; syscall;
/// pop %r11; pop %rcx; ret`, the `ret` taking the return address the
/// system call wrote over the saved `%rax`): a probe's signal is delivered
/// at the system call's end, before the three last instructions
/// (kernel-facts §22). Moves `regs` past them when the stack holds what
/// they pop and its third word is `ret`, the return address expected;
/// false when it does not (the caller then single-steps out).
pub fn leave_return_trampoline(
    regs: &mut libc::user_regs_struct,
    read: impl Fn(u64) -> Option<u64>,
    ret: u64,
) -> bool {
    let sp = regs.rsp;
    let (Some(r11), Some(rcx), Some(ip)) = (read(sp), read(sp + 8), read(sp + 16)) else {
        return false;
    };
    if ip != ret {
        return false;
    }
    regs.r11 = r11;
    regs.rcx = rcx;
    regs.rip = ip;
    regs.rsp = sp + 24;
    true
}

/// The instruction pointer and stack pointer of `regs`.
pub fn ip_sp(regs: &libc::user_regs_struct) -> (u64, u64, u64) {
    (regs.rip, regs.rsp, regs.rbp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_are_told_apart() {
        // push %rbp; call +0; ret; jmp -2; je +0; nop
        let code = [0x55, 0xe8, 0, 0, 0, 0, 0xc3, 0xeb, 0xfe, 0x74, 0x00, 0x90];
        let v = decode(&code, 0x1000);
        let flows: Vec<Flow> = v.iter().map(|i| i.flow).collect();
        assert_eq!(
            flows,
            [
                Flow::Next,
                Flow::Call,
                Flow::Return,
                Flow::Jump {
                    target: Some(0x1007),
                    conditional: false
                },
                Flow::Jump {
                    target: Some(0x100b),
                    conditional: true
                },
                Flow::Next,
            ]
        );
        assert_eq!(v[1].addr, 0x1001);
        assert_eq!(v[1].len, 5);
        let lines = disassemble(&code, 0x1000, 2);
        assert_eq!(lines[0].text, "push    %rbp");
        assert_eq!(lines[1].bytes, [0xe8, 0, 0, 0, 0]);
    }

    #[test]
    fn the_trampoline_is_left_only_for_the_expected_return() {
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        r.rsp = 0x1000;
        let stack = |a: u64| {
            Some(match a {
                0x1000 => 11,
                0x1008 => 22,
                0x1010 => 0x4444,
                _ => return None,
            })
        };
        assert!(!leave_return_trampoline(&mut r, stack, 0x5555));
        assert_eq!(r.rsp, 0x1000);
        assert!(leave_return_trampoline(&mut r, stack, 0x4444));
        assert_eq!((r.rip, r.rsp, r.r11, r.rcx), (0x4444, 0x1018, 11, 22));
    }
}
