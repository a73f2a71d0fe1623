//! The call frame information of one module (`.eh_frame`, which every
//! x86-64 ELF object carries for C++ exceptions and `backtrace(3)`, and its
//! search table `.eh_frame_hdr`), read with gimli: for a link-time address,
//! the row of its function's table (where the canonical frame address is,
//! where the return address and the caller's frame pointer were saved).
//! Held by each loaded module (`elf.rs`); `unwind.rs` walks stacks with it.

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, EndianSlice, FrameDescriptionEntry, LittleEndian,
    RegisterRule, UnwindContext, UnwindSection,
};

use crate::arch::current::{DWARF_FP, DWARF_RA, DWARF_SP};

/// The call frame information of one file: `.eh_frame` and, when present,
/// its binary-search table `.eh_frame_hdr`, with their link-time addresses.
pub struct Cfi {
    eh_frame: Vec<u8>,
    eh_frame_addr: u64,
    hdr: Option<(Vec<u8>, u64)>,
    text_addr: u64,
}

/// How to find the caller of a frame: the canonical frame address (CFA,
/// [`Cfa`]); the return address and the caller's frame pointer were saved
/// at these offsets from it (`None` for the frame pointer: left as it is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Where the CFA is.
    pub cfa: Cfa,
    /// Where the return address is, from the CFA.
    pub ra_offset: i64,
    /// Where the caller's frame pointer is, from the CFA, if saved.
    pub fp_offset: Option<i64>,
}

/// The canonical frame address of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cfa {
    /// `register + offset`, the register the stack or the frame pointer.
    Register {
        /// The register (DWARF number).
        register: u16,
        /// Added to it.
        offset: i64,
    },
    /// A DWARF expression over the registers: what the linker writes for
    /// the lazy PLT, whose stubs push (the CFA is `rsp + 8`, or `+ 16`
    /// past a stub's push, told by the instruction pointer's low bits).
    Expression(Vec<u8>),
}

impl Row {
    /// The CFA of a frame whose instruction pointer, stack pointer and
    /// frame pointer are `ip`, `sp` and `fp` (`None`: an expression that
    /// reads other registers or memory).
    pub fn cfa(&self, ip: u64, sp: u64, fp: u64) -> Option<u64> {
        match &self.cfa {
            Cfa::Register { register, offset } => {
                let base = if *register == DWARF_SP { sp } else { fp };
                Some(base.wrapping_add_signed(*offset))
            }
            Cfa::Expression(bytes) => eval_cfa(bytes, ip, sp, fp),
        }
    }
}

/// Evaluates a CFA expression with the three registers a frame has; the
/// value it leaves is the CFA.
fn eval_cfa(bytes: &[u8], ip: u64, sp: u64, fp: u64) -> Option<u64> {
    use gimli::{EvaluationResult, Location, Value};
    let encoding = gimli::Encoding {
        format: gimli::Format::Dwarf32,
        version: 4,
        address_size: 8,
    };
    let expr = gimli::Expression(gimli::EndianSlice::new(bytes, LittleEndian));
    let mut eval = expr.evaluation(encoding);
    let mut step = eval.evaluate().ok()?;
    // Bounded: an expression asks for each register once or twice.
    for _ in 0..16 {
        match step {
            EvaluationResult::Complete => {
                return match eval.result().first()?.location {
                    Location::Address { address } => Some(address),
                    _ => None,
                };
            }
            EvaluationResult::RequiresRegister { register, .. } => {
                let v = match register.0 {
                    r if r == DWARF_SP => sp,
                    r if r == DWARF_FP => fp,
                    // The return address's column is the instruction
                    // pointer's (x86-64: 16, rip).
                    r if r == DWARF_RA => ip,
                    _ => return None,
                };
                step = eval.resume_with_register(Value::Generic(v)).ok()?;
            }
            _ => return None,
        }
    }
    None
}

impl Cfi {
    /// The call frame information of `file`, if it has an `.eh_frame`.
    pub fn of(file: &object::File<'_>) -> Option<Cfi> {
        use object::{Object, ObjectSection};
        let section = |name: &str| {
            let s = file.section_by_name(name)?;
            Some((s.uncompressed_data().ok()?.into_owned(), s.address()))
        };
        let (eh_frame, eh_frame_addr) = section(".eh_frame")?;
        Some(Cfi {
            eh_frame,
            eh_frame_addr,
            hdr: section(".eh_frame_hdr"),
            text_addr: file
                .section_by_name(".text")
                .map(|s| object::ObjectSection::address(&s))
                .unwrap_or(0),
        })
    }

    /// Bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.eh_frame.len() + self.hdr.as_ref().map_or(0, |h| h.0.len())
    }

    /// The entry that covers link-time address `pc`, with the section and
    /// the bases it reads with.
    #[allow(clippy::type_complexity)]
    fn fde(
        &self,
        pc: u64,
    ) -> Option<(
        EhFrame<EndianSlice<'_, LittleEndian>>,
        BaseAddresses,
        FrameDescriptionEntry<EndianSlice<'_, LittleEndian>>,
    )> {
        let eh = EhFrame::new(&self.eh_frame, LittleEndian);
        let mut bases = BaseAddresses::default()
            .set_eh_frame(self.eh_frame_addr)
            .set_text(self.text_addr);
        let fde = match &self.hdr {
            Some((hdr, addr)) => {
                bases = bases.set_eh_frame_hdr(*addr);
                let parsed = EhFrameHdr::new(hdr, LittleEndian).parse(&bases, 8).ok()?;
                match parsed.table() {
                    Some(t) => t
                        .fde_for_address(&eh, &bases, pc, EhFrame::cie_from_offset)
                        .ok()?,
                    None => eh
                        .fde_for_address(&bases, pc, EhFrame::cie_from_offset)
                        .ok()?,
                }
            }
            None => eh
                .fde_for_address(&bases, pc, EhFrame::cie_from_offset)
                .ok()?,
        };
        Some((eh, bases, fde))
    }

    /// Where the code that the entry covering link-time address `pc`
    /// describes starts: a function's entry (or the start of a part of
    /// it the compiler moved away, `foo.cold`), where instructions can be
    /// read from in a program without symbols.
    pub fn function_start(&self, pc: u64) -> Option<u64> {
        Some(self.fde(pc)?.2.initial_address())
    }

    /// The row for link-time address `pc`, if the table covers it with
    /// rules this unwinder follows (a CFA from the stack or frame pointer,
    /// registers saved at offsets from it).
    pub fn row(&self, pc: u64) -> Option<Row> {
        let (eh, bases, fde) = self.fde(pc)?;
        let mut ctx = UnwindContext::new();
        let row = fde
            .unwind_info_for_address(&eh, &bases, &mut ctx, pc)
            .ok()?;
        let cfa = match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => {
                if register.0 != DWARF_SP && register.0 != DWARF_FP {
                    return None;
                }
                Cfa::Register {
                    register: register.0,
                    offset: *offset,
                }
            }
            CfaRule::Expression(e) => Cfa::Expression(e.get(&eh).ok()?.0.slice().to_vec()),
        };
        let ra_offset = match row.register(gimli::Register(DWARF_RA)) {
            Some(RegisterRule::Offset(o)) => o,
            _ => return None,
        };
        // No rule: the register keeps its value (the default in `.eh_frame`).
        let fp_offset = match row.register(gimli::Register(DWARF_FP)) {
            Some(RegisterRule::Offset(o)) => Some(o),
            None | Some(RegisterRule::Undefined | RegisterRule::SameValue) => None,
            _ => return None,
        };
        Some(Row {
            cfa,
            ra_offset,
            fp_offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lazy PLT's rows are an expression (binutils writes it for every
    /// stub of `.plt`): the CFA is `rsp + 8` at a stub's jump and at its
    /// push, `rsp + 16` once it has pushed (its last jump), whatever the
    /// stub. Read from `/bin/ls`, which Debian links with a lazy PLT.
    #[test]
    fn the_lazy_plts_expression_gives_the_cfa() {
        use object::{Object, ObjectSection};
        let bytes = std::fs::read("/bin/ls").unwrap();
        let file = object::File::parse(&*bytes).unwrap();
        let cfi = Cfi::of(&file).expect("/bin/ls has .eh_frame");
        let plt = file
            .section_by_name(".plt")
            .expect("/bin/ls has a .plt")
            .address();
        let sp = 0x7ffd_0000_1000;
        for stub in [plt + 16, plt + 32] {
            let row = cfi.row(stub).expect("a row for a PLT stub");
            assert!(
                matches!(row.cfa, Cfa::Expression(_)),
                "the PLT's CFA is no expression here: {row:?}"
            );
            assert_eq!(row.ra_offset, -8);
            // jmp *GOT (offset 0), push $n (6), jmp PLT0 (11).
            assert_eq!(row.cfa(stub, sp, 0), Some(sp + 8));
            assert_eq!(row.cfa(stub + 6, sp, 0), Some(sp + 8));
            assert_eq!(row.cfa(stub + 11, sp, 0), Some(sp + 16));
        }
        // An expression over a register a frame does not have: no CFA.
        let r8 = Row {
            cfa: Cfa::Expression(vec![gimli::constants::DW_OP_breg8.0, 0]),
            ra_offset: -8,
            fp_offset: None,
        };
        assert_eq!(r8.cfa(0, sp, 0), None);
    }
}
