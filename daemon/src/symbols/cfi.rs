//! The call frame information of one module (`.eh_frame`, which every
//! x86-64 ELF object carries for C++ exceptions and `backtrace(3)`, and its
//! search table `.eh_frame_hdr`), read with gimli: for a link-time address,
//! the row of its function's table (where the canonical frame address is,
//! where the return address and the caller's frame pointer were saved).
//! Held by each loaded module (`elf.rs`); `unwind.rs` walks stacks with it.

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, LittleEndian, RegisterRule, UnwindContext,
    UnwindSection,
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

/// How to find the caller of a frame: the canonical frame address (CFA) is
/// `register + offset`; the return address and the caller's frame pointer
/// were saved at these offsets from it (`None` for the frame pointer: left
/// as it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// The register the CFA is computed from: the stack or the frame pointer.
    pub cfa_register: u16,
    /// Added to it.
    pub cfa_offset: i64,
    /// Where the return address is, from the CFA.
    pub ra_offset: i64,
    /// Where the caller's frame pointer is, from the CFA, if saved.
    pub fp_offset: Option<i64>,
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

    /// The row for link-time address `pc`, if the table covers it with
    /// rules this unwinder follows (a CFA from the stack or frame pointer,
    /// registers saved at offsets from it).
    pub fn row(&self, pc: u64) -> Option<Row> {
        let eh = EhFrame::new(&self.eh_frame, LittleEndian);
        let mut bases = BaseAddresses::default()
            .set_eh_frame(self.eh_frame_addr)
            .set_text(self.text_addr);
        let mut ctx = UnwindContext::new();
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
        let row = fde
            .unwind_info_for_address(&eh, &bases, &mut ctx, pc)
            .ok()?;
        let (cfa_register, cfa_offset) = match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => (register.0, *offset),
            CfaRule::Expression(_) => return None,
        };
        if cfa_register != DWARF_SP && cfa_register != DWARF_FP {
            return None;
        }
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
            cfa_register,
            cfa_offset,
            ra_offset,
            fp_offset,
        })
    }
}
