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

/// The indirect jumps through a word addressed relative to the
/// instruction pointer among the instructions of `bytes` (the first at
/// `addr`), each as (the jump's address, the word's address): a PLT stub's
/// jump through its GOT slot.
pub fn rip_indirect_jumps(bytes: &[u8], addr: u64) -> Vec<(u64, u64)> {
    let mut d = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
    let mut out = Vec::new();
    let mut i = Instruction::default();
    while d.can_decode() {
        d.decode_out(&mut i);
        if !i.is_invalid()
            && i.flow_control() == FlowControl::IndirectBranch
            && i.is_ip_rel_memory_operand()
        {
            out.push((i.ip(), i.ip_rel_memory_address()));
        }
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

/// A branch a code breakpoint can sit on: the kernel runs (emulates) it
/// before the probe's stop is seen, so the thread is held at its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Branch {
    /// A call (direct or not) of `len` bytes: its return address pushed.
    Call {
        /// The call's length.
        len: u8,
    },
    /// A jump, taken or not.
    Jump,
}

/// The branch the instruction at the start of `bytes` is, if it is one.
pub fn branch_at(bytes: &[u8]) -> Option<Branch> {
    let i = decode(bytes, 0).into_iter().next()?;
    match i.flow {
        Flow::Call => Some(Branch::Call { len: i.len as u8 }),
        Flow::Jump { .. } => Some(Branch::Jump),
        _ => None,
    }
}

/// A branch taken back: the thread shown before it, and what running it
/// again does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Undone {
    /// The branch's address and the stack pointer there: where the thread
    /// was put back.
    pub at: (u64, u64),
    /// Where the branch went.
    pub target: u64,
    /// A call's return address, pushed again.
    pub push: Option<u64>,
}

/// Takes back `branch`, run from `ip` with stack pointer `sp` (the probe's
/// record), when `regs` show it just ran (a call: the stack pointer 8
/// lower and the return address on it; a jump: the stack pointer
/// unchanged): `regs` put back at the branch. `None` (and `regs`
/// unchanged) when they show something else (a signal handler entered).
pub fn undo_branch(
    regs: &mut libc::user_regs_struct,
    branch: Branch,
    ip: u64,
    sp: u64,
    read: impl Fn(u64) -> Option<u64>,
) -> Option<Undone> {
    let target = regs.rip;
    let push = match branch {
        Branch::Call { len } => {
            let ret = ip.checked_add(u64::from(len))?;
            if regs.rsp != sp.wrapping_sub(8) || read(regs.rsp)? != ret {
                return None;
            }
            Some(ret)
        }
        Branch::Jump => {
            if regs.rsp != sp {
                return None;
            }
            None
        }
    };
    if target == ip {
        return None;
    }
    regs.rip = ip;
    regs.rsp = sp;
    Some(Undone {
        at: (ip, sp),
        target,
        push,
    })
}

/// Runs `undone` again on `regs` (through `write` for a call's return
/// address) if the thread is still where it was put back: false (and
/// `regs` unchanged) when it was moved meanwhile (a debugger set its
/// registers), and then runs on from where it is.
pub fn redo_branch(
    regs: &mut libc::user_regs_struct,
    undone: &Undone,
    write: impl FnOnce(u64, u64) -> bool,
) -> bool {
    if (regs.rip, regs.rsp) != undone.at {
        return false;
    }
    if let Some(ret) = undone.push {
        let sp = regs.rsp.wrapping_sub(8);
        if !write(sp, ret) {
            return false;
        }
        regs.rsp = sp;
    }
    regs.rip = undone.target;
    true
}

/// The instruction pointer and stack pointer of `regs`.
pub fn ip_sp(regs: &libc::user_regs_struct) -> (u64, u64, u64) {
    (regs.rip, regs.rsp, regs.rbp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs(ip: u64, sp: u64) -> libc::user_regs_struct {
        // SAFETY: a plain C struct of integers; all-zero is valid.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        r.rip = ip;
        r.rsp = sp;
        r
    }

    #[test]
    fn a_plt_stubs_jump_through_its_slot_is_found() {
        // endbr64; bnd jmp *0x2f9a(%rip); nopl 0(%rax,%rax,1) at 0x1030,
        // then jmp *%rax and a direct jmp: not through a slot.
        let stub = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0x9a, 0x2f, 0x00, 0x00, 0x0f, 0x1f, 0x44,
            0x00, 0x00, 0xff, 0xe0, 0xeb, 0xfe,
        ];
        assert_eq!(
            rip_indirect_jumps(&stub, 0x1030),
            vec![(0x1034, 0x1034 + 7 + 0x2f9a)]
        );
    }

    #[test]
    fn branches_are_told_from_other_instructions() {
        // call rel32; call *%rax; jmp rel8; je rel8; jmp *(%rip); mov %rsp,%rbp
        assert_eq!(
            branch_at(&[0xe8, 0, 0, 0, 0]),
            Some(Branch::Call { len: 5 })
        );
        assert_eq!(branch_at(&[0xff, 0xd0]), Some(Branch::Call { len: 2 }));
        assert_eq!(branch_at(&[0xeb, 0x05]), Some(Branch::Jump));
        assert_eq!(branch_at(&[0x74, 0x05]), Some(Branch::Jump));
        assert_eq!(branch_at(&[0xff, 0x25, 0, 0, 0, 0]), Some(Branch::Jump));
        assert_eq!(branch_at(&[0x48, 0x89, 0xe5]), None);
        assert_eq!(branch_at(&[]), None);
    }

    #[test]
    fn a_call_is_taken_back_and_run_again_as_it_ran() {
        // call at 0x1000 (5 bytes) from sp 0x8000: held at 0x2000, sp
        // 0x7ff8 holding 0x1005.
        let mut r = regs(0x2000, 0x7ff8);
        let read = |a: u64| (a == 0x7ff8).then_some(0x1005);
        let u = undo_branch(&mut r, Branch::Call { len: 5 }, 0x1000, 0x8000, read).unwrap();
        assert_eq!((r.rip, r.rsp), (0x1000, 0x8000));
        let mut wrote = None;
        assert!(redo_branch(&mut r, &u, |a, v| {
            wrote = Some((a, v));
            true
        }));
        assert_eq!((r.rip, r.rsp), (0x2000, 0x7ff8));
        assert_eq!(wrote, Some((0x7ff8, 0x1005)));
        // Anything else on the stack, or another stack pointer: not a
        // call that just ran (a signal handler entered).
        let mut r = regs(0x2000, 0x7ff8);
        assert!(
            undo_branch(&mut r, Branch::Call { len: 5 }, 0x1000, 0x8000, |_| Some(7)).is_none()
        );
        assert_eq!((r.rip, r.rsp), (0x2000, 0x7ff8));
        let mut r = regs(0x2000, 0x7000);
        assert!(undo_branch(&mut r, Branch::Call { len: 5 }, 0x1000, 0x8000, read).is_none());
    }

    #[test]
    fn a_jump_is_taken_back_unless_the_thread_was_moved_since() {
        let mut r = regs(0x1800, 0x8000);
        let u = undo_branch(&mut r, Branch::Jump, 0x1000, 0x8000, |_| None).unwrap();
        assert_eq!(r.rip, 0x1000);
        // A debugger moved it meanwhile: it runs on from there.
        r.rip = 0x1100;
        assert!(!redo_branch(&mut r, &u, |_, _| true));
        assert_eq!(r.rip, 0x1100);
        r.rip = 0x1000;
        assert!(redo_branch(&mut r, &u, |_, _| unreachable!()));
        assert_eq!((r.rip, r.rsp), (0x1800, 0x8000));
    }

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
