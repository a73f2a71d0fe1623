//! The few `bpf()` operations wpd needs, without a BPF toolchain: programs
//! are a handful of instructions assembled here (no compiler, no object
//! files, nothing a fresh machine lacks), maps are a ring buffer and a
//! counter array. Jumps name a [`Label`], resolved when a [`Program`] is
//! built (no offset is counted by hand).
//!
//! Users: the ptrace backend's signal stops (a program sending a signal at
//! a hit) and the perf backend's per-thread path (a program writing each
//! hit into one ring buffer shared by every breakpoint of the daemon).
//! Everything here needs CAP_BPF and CAP_PERFMON (or root).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;

/// One BPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

/// Registers r0-r10.
pub type Reg = u8;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_LINK_CREATE: libc::c_long = 28;

/// `BPF_TRACE_UPROBE_MULTI` (`enum bpf_attach_type`, Linux 6.6): a
/// `BPF_PROG_TYPE_KPROBE` program attached to uprobes through a BPF link
/// ([`uprobe_link`]).
pub const TRACE_UPROBE_MULTI: u32 = 48;
/// `BPF_F_UPROBE_MULTI_RETURN`: the link's uprobes are return probes.
const UPROBE_MULTI_RETURN: u32 = 1;
/// `BPF_F_NO_PREALLOC`: a hash map's entries are allocated as they are
/// added, not all at its creation.
const F_NO_PREALLOC: u32 = 1;

/// `BPF_PROG_TYPE_KPROBE`: runs at a kprobe or uprobe (attached to its perf
/// event), the probed task's `struct pt_regs` as context.
pub const PROG_TYPE_KPROBE: u32 = 2;
/// `BPF_PROG_TYPE_PERF_EVENT`: runs at a perf event's overflow (a hit).
pub const PROG_TYPE_PERF_EVENT: u32 = 7;
/// `BPF_PROG_TYPE_RAW_TRACEPOINT`: runs at a tracepoint, its arguments (as
/// the kernel passes them to the tracepoint, each a u64) as context. Needs
/// no tracefs: attached by name ([`raw_tracepoint_open`]).
pub const PROG_TYPE_RAW_TRACEPOINT: u32 = 17;

/// Helper ids (`enum bpf_func_id`).
pub mod helper {
    pub const MAP_LOOKUP_ELEM: i32 = 1;
    pub const MAP_UPDATE_ELEM: i32 = 2;
    pub const MAP_DELETE_ELEM: i32 = 3;
    pub const KTIME_GET_NS: i32 = 5;
    pub const GET_SMP_PROCESSOR_ID: i32 = 8;
    pub const GET_CURRENT_PID_TGID: i32 = 14;
    pub const GET_STACK: i32 = 67;
    pub const GET_NS_CURRENT_PID_TGID: i32 = 120;
    pub const PROBE_READ_USER: i32 = 112;
    pub const PROBE_READ_KERNEL: i32 = 113;
    pub const SEND_SIGNAL_THREAD: i32 = 117;
    pub const RINGBUF_RESERVE: i32 = 131;
    pub const RINGBUF_SUBMIT: i32 = 132;
    pub const GET_ATTACH_COOKIE: i32 = 174;
}

/// The instruction set, as far as wpd's programs use it.
pub mod asm {
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
}

/// A comparison of two 64-bit registers (`BPF_JMP | op | BPF_X`):
/// unsigned, or signed (`S…`, two's complement).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Cmp {
    /// `==`.
    Eq = 0x10,
    /// `!=`.
    Ne = 0x50,
    /// `>` (unsigned).
    Gt = 0x20,
    /// `>=` (unsigned).
    Ge = 0x30,
    /// `<` (unsigned).
    Lt = 0xa0,
    /// `<=` (unsigned).
    Le = 0xb0,
    /// `>` (signed, `BPF_JSGT`).
    SGt = 0x60,
    /// `>=` (signed, `BPF_JSGE`).
    SGe = 0x70,
    /// `<` (signed, `BPF_JSLT`).
    SLt = 0xc0,
    /// `<=` (signed, `BPF_JSLE`).
    SLe = 0xd0,
}

impl Cmp {
    /// The comparison that holds exactly when this one does not.
    pub fn negated(self) -> Cmp {
        match self {
            Cmp::Eq => Cmp::Ne,
            Cmp::Ne => Cmp::Eq,
            Cmp::Gt => Cmp::Le,
            Cmp::Ge => Cmp::Lt,
            Cmp::Lt => Cmp::Ge,
            Cmp::Le => Cmp::Gt,
            Cmp::SGt => Cmp::SLe,
            Cmp::SGe => Cmp::SLt,
            Cmp::SLt => Cmp::SGe,
            Cmp::SLe => Cmp::SGt,
        }
    }
}

/// A place in a [`Program`] that jumps go to: declared by
/// [`Program::label`], placed once by [`Program::place`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label(usize);

/// Why a [`Program`] cannot be built: a label jumped to but never placed,
/// a label placed twice, a jump the instruction cannot encode, or code no
/// path reaches (the kernel's verifier refuses a program with any).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AsmError {
    /// A label jumped to but never placed.
    #[error("label {0} is never placed")]
    Unplaced(usize),
    /// An instruction no path reaches: the verifier refuses the program
    /// ("unreachable insn").
    #[error("instruction {at} is unreachable")]
    Unreachable {
        /// Its index.
        at: usize,
    },
    /// A label placed twice.
    #[error("label {0} is placed twice")]
    PlacedTwice(usize),
    /// A jump backwards: the programs here have no loops (the verifier
    /// would refuse an unbounded one).
    #[error("the jump at instruction {at} goes back to label {label}")]
    Backward {
        /// The jump's index.
        at: usize,
        /// Its label.
        label: usize,
    },
    /// A jump farther than its 16-bit offset reaches.
    #[error("the jump at instruction {at} is too far")]
    TooFar {
        /// The jump's index.
        at: usize,
    },
}

/// A program being assembled: instructions, and jumps to labels resolved
/// by [`Program::build`].
#[derive(Debug, Default)]
pub struct Program {
    insns: Vec<Insn>,
    /// Where each label is placed (index of the instruction it names).
    labels: Vec<Option<usize>>,
    /// Jumps to patch: the jump's index and its label.
    jumps: Vec<(usize, Label)>,
    /// The first label placed twice.
    twice: Option<usize>,
}

impl Program {
    /// An empty program.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends instructions.
    pub fn push(&mut self, insns: impl IntoIterator<Item = Insn>) {
        self.insns.extend(insns);
    }

    /// A new label, to place once.
    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    /// Whether a jump to `l` was emitted: code placed at a label nothing
    /// jumps to, after a `goto` or an `exit`, is unreachable.
    pub fn used(&self, l: Label) -> bool {
        self.jumps.iter().any(|&(_, j)| j == l)
    }

    /// Places `l` at the next instruction.
    pub fn place(&mut self, l: Label) {
        let at = &mut self.labels[l.0];
        if at.is_some() {
            self.twice.get_or_insert(l.0);
        }
        *at = Some(self.insns.len());
    }

    /// `if dst != imm goto l`.
    pub fn jne_imm(&mut self, dst: Reg, imm: i32, l: Label) {
        self.jumps.push((self.insns.len(), l));
        self.insns.push(asm::jne_imm(dst, imm, 0));
    }

    /// `if dst == imm goto l`.
    pub fn jeq_imm(&mut self, dst: Reg, imm: i32, l: Label) {
        self.jumps.push((self.insns.len(), l));
        self.insns.push(asm::jeq_imm(dst, imm, 0));
    }

    /// `if dst <cmp> src goto l` (comparisons of 64 bits).
    pub fn jump_if(&mut self, cmp: Cmp, dst: Reg, src: Reg, l: Label) {
        self.jumps.push((self.insns.len(), l));
        self.insns.push(Insn {
            code: 0x05 | 0x08 | cmp as u8,
            regs: (src << 4) | (dst & 0x0f),
            off: 0,
            imm: 0,
        });
    }

    /// `goto l`.
    pub fn goto(&mut self, l: Label) {
        self.jumps.push((self.insns.len(), l));
        self.insns.push(Insn {
            code: 0x05,
            regs: 0,
            off: 0,
            imm: 0,
        });
    }

    /// The instructions, every jump's offset resolved (a BPF jump goes
    /// to `its index + 1 + off`).
    pub fn build(mut self) -> Result<Vec<Insn>, AsmError> {
        if let Some(l) = self.twice {
            return Err(AsmError::PlacedTwice(l));
        }
        let mut targets = vec![false; self.insns.len() + 1];
        for &(at, Label(l)) in &self.jumps {
            let to = self.labels[l].ok_or(AsmError::Unplaced(l))?;
            if to <= at {
                return Err(AsmError::Backward { at, label: l });
            }
            self.insns[at].off = i16::try_from(to - at - 1).map_err(|_| AsmError::TooFar { at })?;
            targets[to] = true;
        }
        // Every instruction is reached by falling through or by a jump
        // (all jumps go forward, so one pass in order sees every way in).
        let mut falls_in = true;
        let mut i = 0;
        while i < self.insns.len() {
            if !falls_in && !targets[i] {
                return Err(AsmError::Unreachable { at: i });
            }
            let code = self.insns[i].code;
            // `goto` (BPF_JMP|BPF_JA) and `exit` end the straight line.
            falls_in = code != 0x05 && code != 0x95;
            // A 64-bit immediate load takes two slots.
            i += if code == 0x18 { 2 } else { 1 };
        }
        Ok(self.insns)
    }
}

/// Instructions leaving in r0 the current task's `tgid << 32 | tid` as
/// pid namespace `ns` numbers them: `bpf_get_current_pid_tgid` (the
/// initial namespace's ids) when `ns` is `None`, else
/// `bpf_get_ns_current_pid_tgid` into the stack word at `stack` (r10
/// relative), whose `{ u32 pid; u32 tgid; }` reads as that same u64. A task
/// whose own namespace is not `ns` (a descendant one, or one outside it)
/// gets 0: the helper zeroes the word when it fails. Clobbers r1-r5.
pub fn current_pid_tgid(ns: Option<crate::pidns::PidNs>, stack: i16) -> Vec<Insn> {
    let Some(ns) = ns else {
        return vec![asm::call(helper::GET_CURRENT_PID_TGID)];
    };
    let mut v = Vec::with_capacity(10);
    v.extend(asm::ld_u64(1, ns.dev));
    v.extend(asm::ld_u64(2, ns.ino));
    v.extend([
        asm::mov(3, 10),
        asm::add_imm(3, i32::from(stack)),
        asm::mov_imm(4, 8),
        asm::call(helper::GET_NS_CURRENT_PID_TGID),
        asm::ldx_dw(0, 10, stack),
    ]);
    v
}

/// `union bpf_attr` as BPF_PROG_LOAD reads it (the fields up to the log).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    _rest: [u64; 9],
}

/// `union bpf_attr` as BPF_MAP_CREATE reads it.
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    _rest: [u32; 27],
}

/// `union bpf_attr` as BPF_MAP_LOOKUP_ELEM reads it.
#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

fn sys_bpf<T>(cmd: libc::c_long, attr: &T) -> Result<libc::c_long, Errno> {
    // SAFETY: attr points to a valid, fully initialised bpf_attr prefix of
    // the size given, whose pointers outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *const T,
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 { Err(Errno::last()) } else { Ok(r) }
}

/// `union bpf_attr` as BPF_LINK_CREATE reads it for
/// `BPF_TRACE_UPROBE_MULTI`.
#[repr(C)]
#[derive(Default)]
struct UprobeLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    uprobe_flags: u32,
    pid: u32,
    _pad: u32,
}

/// Attaches `prog` (loaded for [`TRACE_UPROBE_MULTI`]) to a uprobe at file
/// offset `offset` of `path` (a return probe with `ret`) that runs for
/// process `pid` only (the kernel matches its memory): a BPF link, whose
/// fd keeps it. Unlike a uprobe perf event, a link's close does not take
/// the kernel's trace-event mutex, so closes made at once share one RCU
/// grace period (kernel-facts §21).
pub fn uprobe_link(
    prog: &impl AsRawFd,
    path: &std::ffi::CStr,
    offset: u64,
    ret: bool,
    pid: i32,
) -> Result<OwnedFd, Errno> {
    let offsets = [offset];
    let attr = UprobeLinkAttr {
        prog_fd: prog.as_raw_fd() as u32,
        attach_type: TRACE_UPROBE_MULTI,
        path: path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        cnt: 1,
        uprobe_flags: if ret { UPROBE_MULTI_RETURN } else { 0 },
        pid: pid as u32,
        ..Default::default()
    };
    let fd = sys_bpf(BPF_LINK_CREATE, &attr)?;
    // SAFETY: a new fd the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// [`uprobe_link`] of several instructions of one file at once, each
/// with its cookie (`bpf_get_attach_cookie`).
pub fn uprobe_multi_link(
    prog: &impl AsRawFd,
    path: &std::ffi::CStr,
    offsets: &[u64],
    cookies: &[u64],
    ret: bool,
    pid: i32,
) -> Result<OwnedFd, Errno> {
    if offsets.is_empty() || cookies.len() != offsets.len() {
        return Err(Errno::EINVAL);
    }
    let attr = UprobeLinkAttr {
        prog_fd: prog.as_raw_fd() as u32,
        attach_type: TRACE_UPROBE_MULTI,
        path: path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        cookies: cookies.as_ptr() as u64,
        cnt: offsets.len() as u32,
        uprobe_flags: if ret { UPROBE_MULTI_RETURN } else { 0 },
        pid: pid as u32,
        ..Default::default()
    };
    let fd = sys_bpf(BPF_LINK_CREATE, &attr)?;
    // SAFETY: a new fd the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `union bpf_attr` as BPF_RAW_TRACEPOINT_OPEN reads it.
#[repr(C)]
#[derive(Default)]
struct RawTracepointAttr {
    name: u64,
    prog_fd: u32,
    _pad: u32,
}

/// Attaches `prog` (a [`PROG_TYPE_RAW_TRACEPOINT`] program) to the
/// tracepoint `name` (e.g. `signal_deliver`) on every CPU, for as long as
/// the returned fd is open.
pub fn raw_tracepoint_open(name: &std::ffi::CStr, prog: &OwnedFd) -> Result<OwnedFd, Errno> {
    use std::os::fd::AsRawFd;
    let attr = RawTracepointAttr {
        name: name.as_ptr() as u64,
        prog_fd: prog.as_raw_fd() as u32,
        _pad: 0,
    };
    let fd = sys_bpf(BPF_RAW_TRACEPOINT_OPEN, &attr)?;
    // SAFETY: a new fd the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A refused program load: the errno and, for EINVAL/EACCES, the
/// verifier's log (the reason, for the daemon's log and the tests).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bpf(BPF_PROG_LOAD) refused: {}{}", errno.desc(), verifier_note(log))]
pub struct LoadError {
    /// The errno.
    pub errno: Errno,
    /// The last lines of the verifier's log (empty: none).
    pub log: String,
}

fn verifier_note(log: &str) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!(" (verifier: {})", log.trim())
    }
}

/// Loads a GPL program (its helpers are GPL-only) of `prog_type`. A
/// refusal by the verifier is loaded again with the log on, to say why.
pub fn load_program(prog_type: u32, insns: &[Insn]) -> Result<OwnedFd, LoadError> {
    load_program_for(prog_type, 0, insns)
}

/// [`load_program`] of a program attached as `expected_attach_type` says
/// (`enum bpf_attach_type`, e.g. [`TRACE_UPROBE_MULTI`]; 0: unspecified).
pub fn load_program_for(
    prog_type: u32,
    expected_attach_type: u32,
    insns: &[Insn],
) -> Result<OwnedFd, LoadError> {
    let license = c"GPL";
    let mut attr = ProgLoadAttr {
        prog_type,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        expected_attach_type,
        ..Default::default()
    };
    match sys_bpf(BPF_PROG_LOAD, &attr) {
        // SAFETY: a new fd the kernel just gave us.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) }),
        Err(errno) if matches!(errno, Errno::EINVAL | Errno::EACCES) => {
            let mut log = vec![0u8; 64 * 1024];
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            let _ = sys_bpf(BPF_PROG_LOAD, &attr);
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            // The last lines say what was rejected.
            let text = String::from_utf8_lossy(&log[..end]);
            let tail: Vec<&str> = text.lines().rev().take(4).collect();
            Err(LoadError {
                errno,
                log: tail.into_iter().rev().collect::<Vec<_>>().join("; "),
            })
        }
        Err(errno) => Err(LoadError {
            errno,
            log: String::new(),
        }),
    }
}

const MAP_TYPE_ARRAY: u32 = 2;
/// Bytes a hash map entry takes beyond its value, its 8-byte key
/// included: measured 104 per entry of 40-byte values (the fdinfo's
/// `memlock` after 100 entries), rounded up (kernel-facts §21).
pub const HASH_ENTRY_BYTES: u64 = 72;
const MAP_TYPE_HASH: u32 = 1;

/// A map of u64s to arrays of u64s a program looks up with
/// `bpf_map_lookup_elem` (`BPF_MAP_TYPE_HASH`, 8-byte keys, values of a
/// fixed number of u64s), kept by the daemon: a set whose members each
/// carry a value.
#[derive(Debug)]
pub struct U64Map {
    fd: OwnedFd,
    words: usize,
}

impl U64Map {
    /// An empty map of at most `max` entries, each value `words` u64s.
    /// Entries take kernel memory as they are added
    /// ([`U64Map::kernel_bytes`]), not all at creation.
    pub fn new(max: u32, words: usize) -> Result<U64Map, Errno> {
        let attr = MapCreateAttr {
            map_type: MAP_TYPE_HASH,
            key_size: 8,
            value_size: (8 * words) as u32,
            max_entries: max,
            map_flags: F_NO_PREALLOC,
            ..Default::default()
        };
        let fd = sys_bpf(BPF_MAP_CREATE, &attr)?;
        // SAFETY: a new fd the kernel just gave us.
        Ok(U64Map {
            fd: unsafe { OwnedFd::from_raw_fd(fd as i32) },
            words,
        })
    }

    /// Its fd, for [`asm::ld_map`].
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Most kernel memory a map of `max` entries of `words` u64s can hold:
    /// its bucket array (16 bytes per bucket, a power of two of them),
    /// the map itself, and `max` entries of at most [`HASH_ENTRY_BYTES`]
    /// plus the value (kernel-facts §21).
    pub fn kernel_bytes(max: u32, words: usize) -> u64 {
        let buckets = u64::from(max.max(1).next_power_of_two());
        16 * buckets + 1024 + u64::from(max) * (HASH_ENTRY_BYTES + 8 * words as u64)
    }

    /// Sets `k` to `v` (its first words; the others 0).
    pub fn insert(&self, k: u64, v: &[u64]) -> Result<(), Errno> {
        let mut value = vec![0u64; self.words];
        let n = v.len().min(self.words);
        value[..n].copy_from_slice(&v[..n]);
        let attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: (&raw const k) as u64,
            value: value.as_ptr() as u64,
            ..Default::default()
        };
        sys_bpf(BPF_MAP_UPDATE_ELEM, &attr).map(|_| ())
    }

    /// The value of `k`, if it is in the map.
    pub fn get(&self, k: u64) -> Option<Vec<u64>> {
        let mut value = vec![0u64; self.words];
        let attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: (&raw const k) as u64,
            value: value.as_mut_ptr() as u64,
            ..Default::default()
        };
        sys_bpf(BPF_MAP_LOOKUP_ELEM, &attr).ok().map(|_| value)
    }

    /// Removes `k` (absent: nothing).
    pub fn remove(&self, k: u64) {
        let attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: (&raw const k) as u64,
            ..Default::default()
        };
        let _ = sys_bpf(BPF_MAP_DELETE_ELEM, &attr);
    }
}
const MAP_TYPE_RINGBUF: u32 = 27;

/// A one-element array of u64 counters (`n` of them in its value).
#[derive(Debug)]
pub struct Counters {
    fd: OwnedFd,
    n: usize,
}

impl Counters {
    /// `n` u64 counters, all 0.
    pub fn new(n: usize) -> Result<Counters, Errno> {
        let attr = MapCreateAttr {
            map_type: MAP_TYPE_ARRAY,
            key_size: 4,
            value_size: (8 * n) as u32,
            max_entries: 1,
            ..Default::default()
        };
        let fd = sys_bpf(BPF_MAP_CREATE, &attr)?;
        // SAFETY: a new fd the kernel just gave us.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(Counters { fd, n })
    }

    /// Its fd, for [`asm::ld_map_value`].
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// The counters now.
    pub fn read(&self) -> Vec<u64> {
        let key = 0u32;
        let mut out = vec![0u64; self.n];
        let attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: (&raw const key) as u64,
            value: out.as_mut_ptr() as u64,
            ..Default::default()
        };
        if sys_bpf(BPF_MAP_LOOKUP_ELEM, &attr).is_err() {
            out.fill(0);
        }
        out
    }
}

#[cfg(test)]
impl Counters {
    /// Sets the counters (tests feed a program its input through them).
    pub fn write(&self, v: &[u64]) -> Result<(), Errno> {
        let key = 0u32;
        let mut value = vec![0u64; self.n];
        let n = v.len().min(self.n);
        value[..n].copy_from_slice(&v[..n]);
        let attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: (&raw const key) as u64,
            value: value.as_ptr() as u64,
            ..Default::default()
        };
        sys_bpf(BPF_MAP_UPDATE_ELEM, &attr).map(|_| ())
    }
}

/// `BPF_PROG_TYPE_SOCKET_FILTER`: a program the kernel can run on demand
/// (`BPF_PROG_TEST_RUN`), which perf event programs cannot: the tests run
/// pieces of the hit program's code this way.
#[cfg(test)]
pub const PROG_TYPE_SOCKET_FILTER: u32 = 1;

/// `union bpf_attr` as BPF_PROG_TEST_RUN reads it.
#[cfg(test)]
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// Runs a [`PROG_TYPE_SOCKET_FILTER`] program once on a zeroed packet
/// (`BPF_PROG_TEST_RUN`); returns what it returned.
#[cfg(test)]
pub fn test_run(prog: &OwnedFd) -> Result<u32, Errno> {
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    let packet = [0u8; 64];
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: packet.len() as u32,
        data_in: packet.as_ptr() as u64,
        repeat: 1,
        ..Default::default()
    };
    // SAFETY: attr is a valid bpf_attr prefix of the size given, which the
    // kernel writes the result into; the packet outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &raw mut attr,
            std::mem::size_of::<TestRunAttr>(),
        )
    };
    if r < 0 {
        return Err(Errno::last());
    }
    Ok(attr.retval)
}

/// A BPF ring buffer (`BPF_MAP_TYPE_RINGBUF`): many producers (programs on
/// every CPU), one consumer (the daemon), records in order of reservation.
/// The consumer maps the consumer position read-write, and the producer
/// position plus the data, mapped twice in a row so that a record wrapping
/// the end reads contiguously, read-only.
#[derive(Debug)]
pub struct RingBuf {
    fd: OwnedFd,
    size: usize,
    consumer: *mut u8,
    producer: *const u8,
    page: usize,
    /// Bytes consumed so far (mirrors the consumer position).
    read: AtomicU64,
}

// SAFETY: the mappings are owned by the RingBuf; the consumer position is
// written only by [`RingBuf::consume`], which callers serialise.
unsafe impl Send for RingBuf {}
// SAFETY: as above; the mappings are read with atomic loads.
unsafe impl Sync for RingBuf {}

const RINGBUF_BUSY: u32 = 1 << 31;
const RINGBUF_DISCARD: u32 = 1 << 30;
const RINGBUF_HDR: usize = 8;

impl RingBuf {
    /// A ring of `size` bytes (a power of two, at least a page).
    pub fn new(size: usize) -> Result<RingBuf, Errno> {
        let page = page_size();
        let size = size.max(page).next_power_of_two();
        let attr = MapCreateAttr {
            map_type: MAP_TYPE_RINGBUF,
            max_entries: size as u32,
            ..Default::default()
        };
        let fd = sys_bpf(BPF_MAP_CREATE, &attr)?;
        // SAFETY: a new fd the kernel just gave us.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // SAFETY: mapping the consumer page of our own ring-buffer map.
        let consumer = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if consumer == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        // SAFETY: mapping the producer page and the data (twice) of the map.
        let producer = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page + 2 * size,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                page as libc::off_t,
            )
        };
        if producer == libc::MAP_FAILED {
            let e = Errno::last();
            // SAFETY: unmapping what was mapped above.
            unsafe { libc::munmap(consumer, page) };
            return Err(e);
        }
        Ok(RingBuf {
            fd,
            size,
            consumer: consumer.cast(),
            producer: producer.cast(),
            page,
            read: AtomicU64::new(0),
        })
    }

    /// Its fd, for [`asm::ld_map`] and polling.
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Its size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Hands every committed record to `sink` in order, then frees their
    /// space; stops at the first record still being written. Returns how
    /// many. Callers serialise calls.
    pub fn consume(&self, sink: &mut dyn FnMut(&[u8])) -> usize {
        // SAFETY: the positions are u64s at the start of their mapped pages,
        // written by the kernel (producer) and by us (consumer).
        let prod = unsafe { &*(self.producer as *const AtomicU64) };
        // SAFETY: as above.
        let cons = unsafe { &*(self.consumer as *const AtomicU64) };
        let mut pos = cons.load(Ordering::Relaxed);
        let mut n = 0;
        let mask = (self.size - 1) as u64;
        // SAFETY: the data starts one page after the producer position.
        let data = unsafe { self.producer.add(self.page) };
        loop {
            let end = prod.load(Ordering::Acquire);
            if pos >= end {
                break;
            }
            // SAFETY: the header is inside the (double-)mapped data.
            let hdr = unsafe { &*(data.add((pos & mask) as usize) as *const AtomicU64) };
            let len_word = hdr.load(Ordering::Acquire) as u32;
            if len_word & RINGBUF_BUSY != 0 {
                break;
            }
            let len = (len_word & !(RINGBUF_BUSY | RINGBUF_DISCARD)) as usize;
            if len_word & RINGBUF_DISCARD == 0 {
                // SAFETY: a committed record of `len` bytes follows its
                // header; the second mapping makes a wrapping one contiguous.
                let body = unsafe {
                    std::slice::from_raw_parts(data.add((pos & mask) as usize + RINGBUF_HDR), len)
                };
                sink(body);
                n += 1;
            }
            pos += ((RINGBUF_HDR + len + 7) & !7) as u64;
            // Release: every read of the record above happens before a
            // producer that reads this position (with acquire, in
            // `__bpf_ringbuf_reserve`) reuses its bytes. That is all it has
            // to order. libbpf's consumer stores the same way but also has
            // to re-check the producer position with a full barrier before
            // it sleeps, or it could sleep through a record whose producer
            // saw the old position and skipped the wake-up; wpd's programs
            // submit with `BPF_RB_NO_WAKEUP`, so no producer ever wakes
            // the consumer, and the drain polls on a timeout instead: no
            // wake-up can be lost.
            cons.store(pos, Ordering::Release);
        }
        self.read.store(pos, Ordering::Relaxed);
        n
    }
}

impl Drop for RingBuf {
    fn drop(&mut self) {
        // SAFETY: unmapping the two mappings made in `new`.
        unsafe {
            libc::munmap(self.consumer.cast(), self.page);
            libc::munmap(
                self.producer as *mut libc::c_void,
                self.page + 2 * self.size,
            );
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

#[cfg(test)]
mod tests {
    use super::asm::*;

    /// Code after a `goto` or an `exit` that no jump reaches is refused
    /// when the program is built, as the kernel's verifier would refuse
    /// it; reached by a jump, or after a conditional jump, it is fine.
    #[test]
    fn unreachable_code_is_refused_at_build() {
        use super::{AsmError, Program};
        let mut p = Program::new();
        let l = p.label();
        p.push([mov_imm(0, 0)]);
        p.goto(l);
        p.push([mov_imm(0, 1)]);
        p.place(l);
        p.push([exit()]);
        assert_eq!(p.build(), Err(AsmError::Unreachable { at: 2 }));

        let mut p = Program::new();
        let l = p.label();
        p.jne_imm(1, 0, l);
        p.push(ld_u64(0, 1));
        p.push([exit()]);
        p.place(l);
        p.push([mov_imm(0, 0), exit()]);
        assert!(p.build().is_ok());

        // A label nothing jumps to need not be placed; one jumped to must.
        let mut p = Program::new();
        let _unused = p.label();
        let l = p.label();
        p.jne_imm(1, 0, l);
        p.push([exit()]);
        assert_eq!(p.build(), Err(AsmError::Unplaced(1)));
    }

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

    #[test]
    fn a_refused_load_says_why() {
        use super::LoadError;
        use nix::errno::Errno;
        let e = LoadError {
            errno: Errno::EPERM,
            log: String::new(),
        };
        assert_eq!(
            e.to_string(),
            "bpf(BPF_PROG_LOAD) refused: Operation not permitted"
        );
        let e = LoadError {
            errno: Errno::EINVAL,
            log: " R1 invalid mem access\n".into(),
        };
        assert_eq!(
            e.to_string(),
            "bpf(BPF_PROG_LOAD) refused: Invalid argument (verifier: R1 invalid mem access)"
        );
    }

    #[test]
    fn jumps_land_on_their_labels() {
        use super::{Program, asm};
        let mut p = Program::new();
        let out = p.label();
        let end = p.label();
        p.jne_imm(0, 0, out); // 0
        p.push([mov_imm(0, 1)]); // 1
        p.push(ld_u64(1, 7)); // 2, 3: two instructions
        p.jne_imm(1, 0, end); // 4
        p.place(out);
        p.push([mov_imm(0, 2)]); // 5
        p.place(end);
        p.push([asm::exit()]); // 6
        let insns = p.build().unwrap();
        assert_eq!(insns.len(), 7);
        assert_eq!((insns[0].off, insns[4].off), (4, 1), "index + 1 + off");
    }

    #[test]
    fn a_label_placed_other_than_once_or_behind_its_jump_fails() {
        use super::{AsmError, Program};
        // One label too few placed.
        let mut p = Program::new();
        let a = p.label();
        let b = p.label();
        p.jne_imm(0, 0, a);
        p.jne_imm(0, 0, b);
        p.place(a);
        p.push([exit()]);
        assert_eq!(p.build(), Err(AsmError::Unplaced(1)));
        // One placed twice.
        let mut p = Program::new();
        let a = p.label();
        p.jne_imm(0, 0, a);
        p.place(a);
        p.push([exit()]);
        p.place(a);
        p.push([exit()]);
        assert_eq!(p.build(), Err(AsmError::PlacedTwice(0)));
        // Backwards.
        let mut p = Program::new();
        let a = p.label();
        p.place(a);
        p.push([exit()]);
        p.jne_imm(0, 0, a);
        assert_eq!(p.build(), Err(AsmError::Backward { at: 1, label: 0 }));
    }
}
