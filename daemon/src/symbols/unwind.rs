//! A stopped thread's callers from the call frame information of its
//! modules (`.eh_frame`, which every x86-64 ELF object carries for C++
//! exceptions and `backtrace(3)`, frame pointers or not), read with gimli:
//! for each frame, the row of its function's table at the frame's address
//! gives the canonical frame address (a register plus an offset) and where
//! the return address and the caller's frame pointer were saved. Where a
//! module has no entry for an address, the frame-pointer step is tried.

use std::sync::Arc;

use super::Symbols;
use super::maps::{self, MappedFile};
use crate::arch::current::{DWARF_FP, DWARF_RA, DWARF_SP};
use crate::model::Pid;

/// A module's file and its load bias in the process.
type Module = (Arc<super::elf::ElfFile>, u64);

/// Why a walk ended early.
const NO_CFI: &str = "the call chain ended: no call frame information for an address and no \
                      frame pointer to follow";
const UNREADABLE: &str = "the call chain led to unreadable stack memory";
const BACKWARDS: &str = "the call chain ended: a frame's stack pointer did not move up";

/// A frame as unwinding recovers it: where it is, its stack and frame
/// pointers, and its canonical frame address (CFA: the caller's stack
/// pointer before its call) when the frame's row was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRegs {
    /// Its instruction pointer (a return address for all but the innermost).
    pub ip: u64,
    /// Stack pointer.
    pub sp: u64,
    /// Frame pointer.
    pub fp: u64,
    /// Canonical frame address.
    pub cfa: Option<u64>,
}

impl Symbols {
    /// The return addresses of a stopped thread's callers, innermost first,
    /// up to `depth`: from the thread's `ip`, `sp` and `fp`, each frame's
    /// caller by its module's call frame information, else by its frame
    /// pointer. `read(at)` gives the 8 bytes at `at` in the process.
    pub fn unwind(
        &self,
        pid: Pid,
        regs: (u64, u64, u64),
        depth: usize,
        read: impl FnMut(u64) -> Option<u64>,
    ) -> (Vec<u64>, Option<&'static str>) {
        let (frames, note) = self.unwind_frames(pid, regs, depth, read);
        (frames.iter().skip(1).map(|f| f.ip).collect(), note)
    }

    /// Where the function holding code address `pc` of `pid` starts: its
    /// symbol's address, else where its call frame information entry
    /// starts (a program without symbols). The module is found in `image`'s
    /// maps as last read (read again only for an address none holds), or in
    /// a read of its own without one. Waits at most `wait` (from the start
    /// of its load) for the module's file to load: the hit path's wait on
    /// ptrace, none in perf's drain, which looks again later.
    pub fn function_start(
        &self,
        pid: Pid,
        image: Option<&super::Image>,
        pc: u64,
        wait: std::time::Duration,
    ) -> Option<u64> {
        let found = match image {
            Some(i) => i.file_at(pc),
            None => maps::read(pid).ok()?.into_iter().find(|f| {
                f.mappings
                    .iter()
                    .any(|m| m.exec && m.start <= pc && pc < m.end)
            }),
        };
        let f = &found?;
        let elf = self.files.file_within(pid, f, wait).ok()?;
        let bias = Self::bias(&elf, f)?;
        let vaddr = pc.wrapping_sub(bias);
        let start = elf
            .containing(vaddr)
            .filter(|s| s.kind == super::elf::SymKind::Func && s.size > 0)
            .map(|s| s.vaddr)
            .or_else(|| elf.cfi.as_ref()?.function_start(vaddr))?;
        Some(start.wrapping_add(bias))
    }

    /// [`Symbols::unwind`], every frame (the innermost first, then up to
    /// `depth` callers) with its registers as recovered.
    pub fn unwind_frames(
        &self,
        pid: Pid,
        (ip, sp, fp): (u64, u64, u64),
        depth: usize,
        mut read: impl FnMut(u64) -> Option<u64>,
    ) -> (Vec<FrameRegs>, Option<&'static str>) {
        let files = maps::read(pid).unwrap_or_default();
        let mut cache: Vec<(usize, Option<Module>)> = Vec::new();
        let mut module = |pc: u64| -> Option<Module> {
            let (i, f): (usize, &MappedFile) = files.iter().enumerate().find(|(_, f)| {
                f.mappings
                    .iter()
                    .any(|m| m.exec && m.start <= pc && pc < m.end)
            })?;
            if let Some((_, hit)) = cache.iter().find(|(j, _)| *j == i) {
                return hit.clone();
            }
            // On the hit path (a tracer's backtraces): a module not
            // loaded within the symbolizer's wait is unwound by frame
            // pointers.
            let got = self
                .files
                .file_within(pid, f, super::files::EVENT_WAIT)
                .ok()
                .and_then(|e| Some((e.clone(), Self::bias(&e, f)?)));
            cache.push((i, got.clone()));
            got
        };
        let (mut ip, mut sp, mut fp) = (ip, sp, fp);
        let mut out: Vec<FrameRegs> = Vec::with_capacity(depth.min(128) + 1);
        loop {
            let mut frame = FrameRegs {
                ip,
                sp,
                fp,
                cfa: None,
            };
            if out.len() > depth {
                return (out, None);
            }
            // A caller's return address is just past its call: the call
            // itself is one byte before.
            let pc = if out.is_empty() {
                ip
            } else {
                ip.wrapping_sub(1)
            };
            // The row, with its CFA (an expression this frame's registers
            // cannot compute is no row).
            let row = module(pc)
                .and_then(|(elf, bias)| elf.cfi.as_ref()?.row(pc.wrapping_sub(bias)))
                .and_then(|r| Some((r.cfa(ip, sp, fp)?, r)));
            let step = match row {
                Some((cfa, r)) => {
                    frame.cfa = Some(cfa);
                    let ra = read(cfa.wrapping_add_signed(r.ra_offset));
                    let next_fp = match r.fp_offset {
                        Some(o) => read(cfa.wrapping_add_signed(o)),
                        None => Some(fp),
                    };
                    ra.zip(next_fp)
                        .map(|(ra, nfp)| (cfa, ra, nfp))
                        .ok_or(UNREADABLE)
                }
                // No table for it: the frame-pointer step, if `fp` looks
                // like a frame of this stack.
                None if fp == 0 => {
                    out.push(frame);
                    return (out, None);
                }
                None if !fp.is_multiple_of(8) || fp < sp => Err(NO_CFI),
                None => match (read(fp), read(fp.wrapping_add(8))) {
                    (Some(next), Some(ra)) => Ok((fp.wrapping_add(16), ra, next)),
                    _ => Err(UNREADABLE),
                },
            };
            out.push(frame);
            let (cfa, ra, next_fp) = match step {
                Ok(s) => s,
                Err(why) => return (out, Some(why)),
            };
            if ra == 0 {
                return (out, None); // the outermost frame
            }
            if cfa <= sp {
                return (out, Some(BACKWARDS));
            }
            if out.len() > depth {
                return (out, None);
            }
            ip = ra;
            sp = cfa;
            fp = next_fp;
        }
    }

    /// The parameters and local variables of `frame` of process `pid`
    /// (`innermost`: the frame the thread is stopped in, whose every general
    /// register is `general`), from its module's DWARF. `read(at, len)`
    /// reads the process. Why there are none, when there cannot be.
    pub fn frame_locals(
        &self,
        pid: Pid,
        frame: &FrameRegs,
        general: Option<&[u64; 18]>,
        read: &mut dyn FnMut(u64, usize) -> Option<Vec<u8>>,
    ) -> Result<Vec<super::frame::LocalVar>, String> {
        self.frame_scope(pid, frame, general, read).map(|s| s.vars)
    }

    /// [`Symbols::frame_locals`], with the module they are in.
    pub fn frame_scope(
        &self,
        pid: Pid,
        frame: &FrameRegs,
        general: Option<&[u64; 18]>,
        read: &mut dyn FnMut(u64, usize) -> Option<Vec<u8>>,
    ) -> Result<FrameScope, String> {
        let pc = if general.is_some() {
            frame.ip
        } else {
            frame.ip.wrapping_sub(1)
        };
        let files = maps::read(pid).map_err(|e| e.to_string())?;
        let f = files
            .iter()
            .find(|f| {
                f.mappings
                    .iter()
                    .any(|m| m.exec && m.start <= pc && pc < m.end)
            })
            .ok_or("the address is in no module")?;
        let elf = self.file(pid, f).map_err(|e| e.to_string())?;
        let bias = Self::bias(&elf, f).ok_or("the module's load address is not known")?;
        let dwarf = elf
            .dwarf
            .as_ref()
            .ok_or_else(|| format!("{} has no DWARF (build with -g)", f.name()))?;
        let register = |n: u16| match general {
            Some(g) => crate::arch::current::dwarf_register(g, n),
            None if n == DWARF_SP => Some(frame.sp),
            None if n == DWARF_FP => Some(frame.fp),
            None if n == DWARF_RA => Some(frame.ip),
            None => None,
        };
        let mut access = super::frame::FrameAccess {
            register: &register,
            cfa: frame.cfa,
            read,
            bias,
        };
        let vars = dwarf
            .frame_variables(pc.wrapping_sub(bias), &mut access)
            .ok_or("no function's debug information covers this address")?;
        Ok(FrameScope {
            file: f.clone(),
            elf: elf.clone(),
            bias,
            vars,
        })
    }
}

/// A frame's variables and the module whose DWARF describes them.
pub struct FrameScope {
    /// The module.
    pub file: MappedFile,
    /// Its file.
    pub elf: Arc<super::elf::ElfFile>,
    /// Its load bias.
    pub bias: u64,
    /// Parameters and variables, outermost scope first.
    pub vars: Vec<super::frame::LocalVar>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbols::cfi::{Cfi, Row};

    /// This test binary's own call frame information: at a function's
    /// first instruction the CFA is the stack pointer + 8 and the return
    /// address is at CFA - 8 (the call just pushed it); the frame pointer
    /// is not saved yet.
    #[test]
    fn a_functions_entry_row_is_the_calls() {
        use object::{Object, ObjectSymbol};
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let file = object::File::parse(&*exe).unwrap();
        let cfi = Cfi::of(&file).expect("the test binary has .eh_frame");
        assert!(cfi.heap_bytes() > 0);
        let f = file
            .symbols()
            .find(|s| {
                s.name()
                    .is_ok_and(|n| n.contains("a_functions_entry_row_is_the_calls"))
                    && s.kind() == object::SymbolKind::Text
                    && s.size() > 0
            })
            .expect("this test's own symbol");
        let row = cfi.row(f.address()).expect("a row at the function's entry");
        assert_eq!(
            row,
            Row {
                cfa: super::super::cfi::Cfa::Register {
                    register: DWARF_SP,
                    offset: 8,
                },
                ra_offset: -8,
                fp_offset: None,
            }
        );
        // Past the end of every function: no row.
        assert_eq!(cfi.row(u64::MAX - 16), None);
    }
}
