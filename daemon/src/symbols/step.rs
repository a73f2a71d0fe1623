//! What stepping a held thread needs to know of its process's code: the
//! line-table row and the function holding an address, where a function's
//! body starts, the canonical frame address at an instruction (from the
//! call frame information, to tell one activation of a function from
//! another: recursion), the code bytes as the module's file has them (the
//! process's copy carries the breakpoint instructions of uprobes), and the
//! file and offset a uprobe at an address takes.
//!
//! One [`CodeView`] per step: the process's maps read once, each module
//! loaded once; a module's rows and functions are indexed by address the
//! first time a step needs them ([`CodeIndex`], kept with its DWARF).

use std::path::PathBuf;
use std::sync::Arc;

use super::Symbols;
use super::dwarf::DwarfFile;
use super::elf::{ElfFile, SymKind};
use super::maps::{self, MappedFile};
use crate::model::Pid;

use super::codeindex::{CodeIndex, Func, Row};

impl CodeIndex {
    fn build(d: &DwarfFile) -> CodeIndex {
        let mut rows = Vec::new();
        for seq in d.line_sequences() {
            // The sequence's end row is left out: a row ends where the
            // next begins, the last one 1 byte on (never probed past).
            for (i, r) in seq.iter().enumerate() {
                let end = seq.get(i + 1).map_or(r.addr + 1, |n| n.addr);
                if end <= r.addr {
                    continue;
                }
                rows.push(Row {
                    addr: r.addr,
                    end,
                    file: r.file.clone(),
                    line: r.line,
                    stmt: r.stmt,
                    prologue_end: r.prologue_end,
                });
            }
        }
        rows.sort_by_key(|r| (r.addr, r.end));
        let mut funcs = Vec::new();
        if let Some(dwarf) = d.dwarf() {
            let mut units = dwarf.units();
            while let Ok(Some(header)) = units.next() {
                let Ok(unit) = dwarf.unit(header) else {
                    continue;
                };
                let mut entries = unit.entries();
                while let Ok(Some(e)) = entries.next_dfs() {
                    if e.tag() != gimli::DW_TAG_subprogram {
                        continue;
                    }
                    let Ok(mut ranges) = dwarf.die_ranges(&unit, e) else {
                        continue;
                    };
                    let mut parts = Vec::new();
                    while let Ok(Some(r)) = ranges.next() {
                        if r.begin < r.end {
                            parts.push((r.begin, r.end));
                        }
                    }
                    let Some(first) = parts.iter().map(|p| p.0).min() else {
                        continue;
                    };
                    let entry = match e.attr_value(gimli::DW_AT_low_pc) {
                        Some(gimli::AttributeValue::Addr(a)) => a,
                        _ => first,
                    };
                    let name = super::dwarf::name_of(&dwarf, &unit, e).unwrap_or_default();
                    for (lo, hi) in parts {
                        funcs.push(Func {
                            lo,
                            hi,
                            entry,
                            name: name.clone(),
                        });
                    }
                }
            }
        }
        funcs.sort_by_key(|f| (f.lo, f.hi));
        CodeIndex { rows, funcs }
    }

    /// The row holding link-time `pc` (the narrowest, at a tie the last).
    fn row(&self, pc: u64) -> Option<&Row> {
        let i = self.rows.partition_point(|r| r.addr <= pc);
        self.rows[..i]
            .iter()
            .rev()
            .take(8)
            .filter(|r| pc < r.end)
            .min_by_key(|r| r.end - r.addr)
    }

    /// The function part holding link-time `pc`, the innermost one.
    fn func(&self, pc: u64) -> Option<&Func> {
        let i = self.funcs.partition_point(|f| f.lo <= pc);
        self.funcs[..i]
            .iter()
            .filter(|f| pc < f.hi)
            .min_by_key(|f| f.hi - f.lo)
    }
}

impl DwarfFile {
    /// Its line rows and functions by address (built on first use).
    fn code_index(&self) -> &CodeIndex {
        self.code.get_or_init(|| CodeIndex::build(self))
    }
}

/// A source line's place: the line-table row holding an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineAt {
    /// The row's first address (runtime).
    pub start: u64,
    /// Where the next row starts (runtime).
    pub end: u64,
    /// The source file.
    pub file: Arc<str>,
    /// The line (0: code the compiler gave no line).
    pub line: u32,
    /// A statement's start (`is_stmt`): a place to stop at.
    pub stmt: bool,
}

impl LineAt {
    /// Same file and line as `other`.
    pub fn same_line(&self, other: &LineAt) -> bool {
        self.line == other.line && self.file == other.file
    }
}

/// A function of the process: its address ranges and entry (runtime).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionAt {
    /// Its name.
    pub name: String,
    /// Its first instruction.
    pub entry: u64,
    /// Its code, one range per part.
    pub ranges: Vec<(u64, u64)>,
    /// From DWARF (else from the symbol table: no line rows).
    pub dwarf: bool,
}

impl FunctionAt {
    /// Whether `pc` is in one of its parts.
    pub fn holds(&self, pc: u64) -> bool {
        self.ranges.iter().any(|&(lo, hi)| lo <= pc && pc < hi)
    }
}

/// A module as a step sees it: its file and load bias.
#[derive(Clone)]
struct Module {
    index: usize,
    elf: Arc<ElfFile>,
    bias: u64,
}

/// The code of one process as a step reads it (see the module doc).
pub struct CodeView<'s> {
    symbols: &'s Symbols,
    pid: Pid,
    files: Vec<MappedFile>,
    loaded: Vec<(usize, Option<Module>)>,
}

impl Symbols {
    /// The code of process `pid` as it is mapped now.
    pub fn code_view(&self, pid: Pid) -> std::io::Result<CodeView<'_>> {
        Ok(CodeView {
            symbols: self,
            pid,
            files: maps::read(pid)?,
            loaded: Vec::new(),
        })
    }
}

impl CodeView<'_> {
    fn module(&mut self, pc: u64) -> Option<Module> {
        let index = self.files.iter().position(|f| {
            f.mappings
                .iter()
                .any(|m| m.exec && m.start <= pc && pc < m.end)
        })?;
        if let Some((_, m)) = self.loaded.iter().find(|(i, _)| *i == index) {
            return m.clone();
        }
        let f = &self.files[index];
        let m = self.symbols.file(self.pid, f).ok().and_then(|elf| {
            let bias = Symbols::bias(&elf, f)?;
            Some(Module { index, elf, bias })
        });
        self.loaded.push((index, m.clone()));
        m
    }

    /// The line-table row holding `pc`.
    pub fn line(&mut self, pc: u64) -> Option<LineAt> {
        let m = self.module(pc)?;
        let d = m.elf.dwarf.as_ref()?;
        let r = d.code_index().row(pc.wrapping_sub(m.bias))?;
        Some(LineAt {
            start: r.addr.wrapping_add(m.bias),
            end: r.end.wrapping_add(m.bias),
            file: r.file.clone(),
            line: r.line,
            stmt: r.stmt,
        })
    }

    /// Whether `pc` has line rows (a function built with `-g`).
    pub fn has_lines(&mut self, pc: u64) -> bool {
        self.line(pc).is_some_and(|l| l.line != 0)
    }

    /// The function holding `pc`: its DWARF ranges, else its symbol.
    pub fn function(&mut self, pc: u64) -> Option<FunctionAt> {
        let m = self.module(pc)?;
        let vaddr = pc.wrapping_sub(m.bias);
        if let Some(d) = m.elf.dwarf.as_ref() {
            let index = d.code_index();
            if let Some(f) = index.func(vaddr) {
                let ranges = index
                    .funcs
                    .iter()
                    .filter(|g| g.entry == f.entry)
                    .map(|g| (g.lo.wrapping_add(m.bias), g.hi.wrapping_add(m.bias)))
                    .collect();
                return Some(FunctionAt {
                    name: f.name.clone(),
                    entry: f.entry.wrapping_add(m.bias),
                    ranges,
                    dwarf: true,
                });
            }
        }
        let s = m
            .elf
            .containing(vaddr)
            .filter(|s| s.kind == SymKind::Func && s.size > 0)?;
        let lo = s.vaddr.wrapping_add(m.bias);
        Some(FunctionAt {
            name: s.name.clone(),
            entry: lo,
            ranges: vec![(lo, lo + s.size)],
            dwarf: false,
        })
    }

    /// Where the body of the function entered at `entry` starts: the row
    /// marked as the prologue's end, else the first statement of another
    /// line (`lines.rs`' `body_start`, by the index), else `entry`.
    pub fn body_start(&mut self, entry: u64) -> u64 {
        let Some(f) = self.function(entry).filter(|f| f.dwarf) else {
            return entry;
        };
        let Some(m) = self.module(entry) else {
            return entry;
        };
        let Some(d) = m.elf.dwarf.as_ref() else {
            return entry;
        };
        let index = d.code_index();
        let (lo, hi) = f
            .ranges
            .iter()
            .copied()
            .find(|&(lo, _)| lo == entry)
            .unwrap_or((entry, entry + 1));
        let (lo, hi) = (lo.wrapping_sub(m.bias), hi.wrapping_sub(m.bias));
        let from = index.rows.partition_point(|r| r.addr < lo);
        let rows: Vec<&Row> = index.rows[from..]
            .iter()
            .take_while(|r| r.addr < hi)
            .collect();
        let Some(first) = rows.first() else {
            return entry;
        };
        let at = rows
            .iter()
            .find(|r| r.prologue_end)
            .or_else(|| {
                rows.iter()
                    .find(|r| r.addr > lo && r.line != 0 && r.line != first.line && r.stmt)
            })
            .map_or(lo, |r| r.addr);
        at.wrapping_add(m.bias)
    }

    /// The canonical frame address of the innermost frame at `pc` with
    /// stack pointer `sp` and frame pointer `fp`, from the module's call
    /// frame information.
    pub fn cfa(&mut self, pc: u64, sp: u64, fp: u64) -> Option<u64> {
        let m = self.module(pc)?;
        let row = m.elf.cfi.as_ref()?.row(pc.wrapping_sub(m.bias))?;
        row.cfa(pc, sp, fp)
    }

    /// The bytes of `[addr, addr + len)` as the module's file has them
    /// (fewer where the file's segment ends).
    pub fn code(&mut self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let m = self.module(addr)?;
        let vaddr = addr.wrapping_sub(m.bias);
        let seg = m
            .elf
            .segments
            .iter()
            .find(|s| s.vaddr <= vaddr && vaddr < s.vaddr + s.filesz)?;
        let off = (vaddr - seg.vaddr + seg.offset) as usize;
        let seg_end = (seg.offset + seg.filesz) as usize;
        let end = (off + len).min(seg_end).min(m.elf.image.len());
        m.elf.image.get(off..end).map(<[u8]>::to_vec)
    }

    /// What a uprobe at `addr` is opened on: the module's file as the
    /// daemon opens it and the instruction's offset in it.
    pub fn probe_place(&mut self, addr: u64) -> Option<(PathBuf, u64)> {
        let m = self.module(addr)?;
        let off = m.elf.file_offset(addr.wrapping_sub(m.bias))?;
        Some((self.files[m.index].open_path(self.pid), off))
    }

    /// Whether `addr` is in the special mapping the kernel returns through
    /// from a uretprobe (`[uprobes]`), read from the process's maps now.
    pub fn in_return_trampoline(pid: Pid, addr: u64) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.ends_with("[uprobes]"))
            .filter_map(|l| {
                let (range, _) = l.split_once(' ')?;
                let (a, b) = range.split_once('-')?;
                Some((
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                ))
            })
            .any(|(a, b)| a <= addr && addr < b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(addr: u64, end: u64, line: u32) -> Row {
        Row {
            addr,
            end,
            file: "a.c".into(),
            line,
            stmt: true,
            prologue_end: false,
        }
    }

    #[test]
    fn rows_and_functions_are_found_by_address() {
        let idx = CodeIndex {
            rows: vec![row(0x10, 0x14, 3), row(0x14, 0x20, 4), row(0x20, 0x21, 5)],
            funcs: vec![
                Func {
                    lo: 0x10,
                    hi: 0x40,
                    entry: 0x10,
                    name: "f".into(),
                },
                Func {
                    lo: 0x18,
                    hi: 0x1c,
                    entry: 0x18,
                    name: "inner".into(),
                },
            ],
        };
        assert_eq!(idx.row(0x10).map(|r| r.line), Some(3));
        assert_eq!(idx.row(0x13).map(|r| r.line), Some(3));
        assert_eq!(idx.row(0x14).map(|r| r.line), Some(4));
        assert_eq!(idx.row(0x20).map(|r| r.line), Some(5));
        assert_eq!(idx.row(0x21), None, "past the last row");
        assert_eq!(idx.row(0x0f), None);
        assert_eq!(idx.func(0x19).map(|f| f.name.as_str()), Some("inner"));
        assert_eq!(idx.func(0x1c).map(|f| f.name.as_str()), Some("f"));
        assert_eq!(idx.func(0x40), None);
    }
}
