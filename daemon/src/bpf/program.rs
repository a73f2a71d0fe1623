//! A program being assembled: instructions and jumps to [`Label`]s, the
//! jumps' offsets resolved and the code checked when it is built; and the
//! instructions that read the current task's ids.

use super::{Insn, Reg, asm, helper};

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
