//! Names for the stubs of a module's procedure linkage table
//! (`getpid@plt`), as gdb and objdump give them: no symbol table lists
//! them, and the symbol before them (`_init`) is not theirs, so a thread
//! stepped into a library call was shown at `_init+0x30`. Each stub jumps
//! through its GOT slot, and the dynamic relocation of that slot names the
//! function: the stubs are found by decoding `.plt`, `.plt.sec` and
//! `.plt.got` for those jumps (whatever the layout: lazy, `-z now`, with
//! indirect-branch tracking's second table).

use std::collections::HashMap;

use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, RelocationTarget};

use crate::arch::current::insn;

/// One stub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PltStub {
    /// Its link-time address.
    pub vaddr: u64,
    /// Its size.
    pub size: u64,
    /// `NAME@plt`.
    pub name: String,
}

/// The stubs of `file`, by address.
pub fn stubs(file: &object::File<'_>) -> Vec<PltStub> {
    let (Some(relocs), Some(dynsyms)) = (file.dynamic_relocations(), file.dynamic_symbol_table())
    else {
        return Vec::new();
    };
    let mut slots: HashMap<u64, String> = HashMap::new();
    for (slot, r) in relocs {
        if let RelocationTarget::Symbol(i) = r.target()
            && let Ok(sym) = dynsyms.symbol_by_index(i)
            && let Ok(name) = sym.name()
            && !name.is_empty()
        {
            slots.insert(slot, name.to_string());
        }
    }
    let mut out = Vec::new();
    if slots.is_empty() {
        return out;
    }
    for sec in file.sections() {
        let Ok(name) = sec.name() else {
            continue;
        };
        if !matches!(name, ".plt" | ".plt.sec" | ".plt.got") {
            continue;
        }
        let Ok(data) = sec.data() else {
            continue;
        };
        let start = sec.address();
        // 16-byte entries, but for a `.plt.got` of 8-byte ones.
        let entry = if name == ".plt.got" && sec.size() % 16 != 0 {
            8
        } else {
            16
        };
        for (jump, slot) in insn::rip_indirect_jumps(data, start) {
            if let Some(f) = slots.get(&slot) {
                out.push(PltStub {
                    vaddr: start + (jump - start) / entry * entry,
                    size: entry,
                    name: format!("{f}@plt"),
                });
            }
        }
    }
    out.sort_by_key(|s| s.vaddr);
    out.dedup_by_key(|s| s.vaddr);
    out
}

/// The stub of `stubs` holding link-time address `vaddr`, and the offset
/// in it.
pub fn stub_at(stubs: &[PltStub], vaddr: u64) -> Option<(&PltStub, u64)> {
    let i = stubs.partition_point(|s| s.vaddr <= vaddr).checked_sub(1)?;
    let s = &stubs[i];
    (vaddr < s.vaddr + s.size).then_some((s, vaddr - s.vaddr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_in_the_stub_that_holds_it_only() {
        let stubs = vec![
            PltStub {
                vaddr: 0x1030,
                size: 16,
                name: "getpid@plt".into(),
            },
            PltStub {
                vaddr: 0x1040,
                size: 16,
                name: "usleep@plt".into(),
            },
        ];
        assert_eq!(
            stub_at(&stubs, 0x1030).map(|(s, o)| (s.name.as_str(), o)),
            Some(("getpid@plt", 0))
        );
        assert_eq!(
            stub_at(&stubs, 0x104f).map(|(s, o)| (s.name.as_str(), o)),
            Some(("usleep@plt", 15))
        );
        assert_eq!(stub_at(&stubs, 0x1050), None);
        assert_eq!(stub_at(&stubs, 0x102f), None);
    }
}
