//! Symbols: names to addresses, addresses to names.
//!
//! - [`Symbols::resolve`]: `[module:]name[.member][[i]][+off]` in a process
//!   → the address, size and type to watch, from DWARF (`gimli`, for types,
//!   members and elements) or the ELF symbol tables (`object`), with the
//!   load bias of the module computed from its mappings and program headers.
//! - [`Symbols::describe_address`]: an address in a process → the symbol
//!   holding it, and its source line for code.
//! - [`locate`]: instruction pointers of hits and their call chains →
//!   function, `file:line`, module, build id and file offset, symbolized by
//!   `blazesym` on a thread of its own, off the hit path, and cached per
//!   process image and per module.
//!
//! Rooms: `expr/` (the expression grammar), `eval/` (expressions over
//! DWARF types), `maps.rs` (`/proc/PID/maps`),
//! `files.rs` (the module files held loaded, each loaded on a thread of
//! its own), `open.rs` (how any file is opened: regular files only,
//! without blocking), `elf.rs` (one module file,
//! its debug file), `dwarf/` (variables and types), `resolve.rs` (a name
//! to an address, in steps), `linkmap.rs` (the order the dynamic linker
//! loaded the modules in), `error.rs` (why a name does not resolve),
//! `locate.rs` (symbolizing instruction pointers).

pub mod cfi;
pub mod children;
pub mod code;
mod codeindex;
pub mod dwarf;
pub mod elf;
mod error;
pub mod eval;
pub mod expr;
mod files;

/// Module files the symbol layer holds open at most, and loads in flight:
/// the daemon's own fds its default `--fd-headroom` leaves room for.
pub const FILES_HELD: usize = files::MAX_FILES + files::LOADS_IN_FLIGHT;
pub mod frame;
pub mod fuzzmap;
pub mod lines;
mod linkmap;
pub mod locate;
pub mod maps;
pub mod open;
pub mod plt;
mod resolve;
pub mod step;
pub mod unwind;

use std::sync::Arc;

use crate::model::Pid;
use elf::{ElfFile, SymKind};
pub use error::SymbolError;
pub use files::{EVENT_WAIT, FileKey, Files, LoadError};
pub use locate::{Frame, Image, Locator};
use maps::MappedFile;

/// Where a resolved name's address and size came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// DWARF debug information (of the file or of its debug file).
    Dwarf,
    /// The ELF `.symtab`.
    Symtab,
    /// The ELF `.dynsym`.
    Dynsym,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Dwarf => "DWARF",
            Source::Symtab => "symbol table",
            Source::Dynsym => "dynamic symbol table",
        })
    }
}

/// What a name resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The name as asked, written canonically.
    pub expr: String,
    /// The symbol found (`stats` for `stats.errors`).
    pub symbol: String,
    /// The module's path in the process.
    pub module: String,
    /// The module's identity.
    pub module_key: FileKey,
    /// The module's build id.
    pub build_id: Option<Vec<u8>>,
    /// Runtime address.
    pub address: u64,
    /// Bytes to watch by default: the object's size.
    pub size: u64,
    /// Its type, when DWARF gives it.
    pub type_name: Option<String>,
    /// How its value reads, when DWARF gives its type.
    pub value_type: Option<crate::value::ValueType>,
    /// Where the address and size came from.
    pub source: Source,
    /// The link-time address in the module (`address` − load bias).
    pub module_address: u64,
    /// Anything the caller should know (a choice made among several).
    pub note: Option<String>,
    /// For an expression that computes a value rather than naming an
    /// object (`&x`, `(T)x`): its bytes. `address` is then the address the
    /// value holds when it is a pointer (else 0); such a result is never
    /// watched ([`Symbols::resolve`] refuses it).
    pub value: Option<Vec<u8>>,
    /// What the object has under it, for variables views (none for a
    /// value, a scalar, or a name with a byte offset).
    pub children: Option<eval::Children>,
}

/// What an address in a process is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressInfo {
    /// The module mapping it, if any.
    pub module: Option<String>,
    /// Its build id.
    pub build_id: Option<Vec<u8>>,
    /// The link-time address in the module.
    pub module_address: u64,
    /// File offset, for an address backed by the file.
    pub file_offset: Option<u64>,
    /// The symbol holding it, its start (runtime), size and kind.
    pub symbol: Option<(String, u64, u64, &'static str)>,
}

/// Names to addresses and back, for every process: loaded module files
/// (shared by every process mapping them) and the symbolizer.
#[derive(Default)]
pub struct Symbols {
    /// Loaded module files.
    pub files: Files,
    /// The instruction-pointer symbolizer (its thread starts on first use).
    pub locator: Locator,
}

impl Symbols {
    /// The symbol layer, looking for separate debug files in `debug_dirs`
    /// (`wpd --debug-dir`; [`elf::DEFAULT_DEBUG_DIRS`] when empty).
    pub fn with_debug_dirs(debug_dirs: Vec<std::path::PathBuf>) -> Self {
        let dirs = if debug_dirs.is_empty() {
            elf::default_debug_dirs()
        } else {
            debug_dirs
        };
        Symbols {
            files: Files::with_debug_dirs(dirs.clone()),
            locator: Locator::with_debug_dirs(dirs),
        }
    }
}

impl std::fmt::Debug for Symbols {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Symbols").finish_non_exhaustive()
    }
}

/// What a name names ([`Symbols::look_up`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    /// A variable (data).
    Variable,
    /// A function (code).
    Function,
    /// A value computed (`&x`, `(T)x`), in no object.
    Value,
}

impl NameKind {
    /// Its name on the wire (`ResolveSymbolResponse.kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            NameKind::Variable => "variable",
            NameKind::Function => "function",
            NameKind::Value => "value",
        }
    }
}

/// Counters of the symbol layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SymbolStats {
    /// Module files loaded.
    pub files: u64,
    /// Heap bytes they hold (symbol tables, indexes, decompressed DWARF;
    /// file mappings are the page cache's).
    pub bytes: u64,
    /// Instruction pointers symbolized (distinct, over all processes).
    pub locations: u64,
    /// Bytes the symbolizer's caches hold.
    pub location_bytes: u64,
    /// Reads of `/proc/PID/maps` since start.
    pub maps_reads: u64,
}

impl Symbols {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    fn file(&self, pid: Pid, f: &MappedFile) -> Result<Arc<ElfFile>, files::LoadError> {
        self.files.file(pid, f)
    }

    /// The file of a module `pid` maps, for an answer that needs it: `None`
    /// when it cannot be read (the module is passed over, as one without
    /// symbols), an error when it is still loading or could not be loaded
    /// yet (an answer without it could be wrong).
    fn module(&self, pid: Pid, f: &MappedFile) -> Result<Option<Arc<ElfFile>>, SymbolError> {
        match self.file(pid, f) {
            Ok(e) => Ok(Some(e)),
            Err(files::LoadError::Unreadable(e)) => {
                tracing::debug!(pid, error = %e, "module file skipped");
                Ok(None)
            }
            Err(e) => Err(SymbolError::loading(pid, e)),
        }
    }

    /// Counters.
    pub fn stats(&self) -> SymbolStats {
        let (files, bytes) = self.files.usage();
        let (locations, location_bytes) = self.locator.cached();
        SymbolStats {
            files,
            bytes,
            locations,
            location_bytes,
            maps_reads: maps::READS.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// The load bias of `elf` as `f` maps it.
    fn bias(elf: &ElfFile, f: &MappedFile) -> Option<u64> {
        let m = f.mappings.first()?;
        elf.bias(m.start, m.offset)
    }

    /// `some` of process `pid`'s modules `files` in the order its dynamic
    /// linker loaded them: the executable first, then the libraries as its
    /// list of loaded objects has them (at a dlopen, the library opened
    /// before those it needs, whatever their addresses), then any the list
    /// does not name in address order; in address order after the
    /// executable when the list cannot be read (no dynamic linker).
    fn load_order<'f>(
        &self,
        pid: Pid,
        files: &[MappedFile],
        some: Vec<&'f MappedFile>,
    ) -> Vec<&'f MappedFile> {
        let exe = Self::exe_file(pid);
        if some.len() < 2 {
            return some;
        }
        let lds = self
            .r_debug(pid, files, exe.as_ref())
            .map(|at| {
                linkmap::dynamic_addrs(at, |a, n| crate::procfs::read_memory(pid, pid, a, n).ok())
            })
            .unwrap_or_default();
        linkmap::load_order(some, exe.as_ref(), &lds)
    }

    /// Where process `pid`'s dynamic linker keeps its `struct r_debug`:
    /// the executable's `_r_debug` if it has one (a copy relocation, which
    /// the linker then uses, or a static program's own), else that of the
    /// dynamic linker (the file loaded at `AT_BASE`).
    fn r_debug(&self, pid: Pid, files: &[MappedFile], exe: Option<&FileKey>) -> Option<u64> {
        // The leader's auxiliary vector reads empty once it has exited
        // alone (kernel-facts §3b): then a live thread's.
        let base = std::fs::read(format!("/proc/{pid}/auxv"))
            .ok()
            .filter(|a| !a.is_empty())
            .or_else(|| std::fs::read(crate::procfs::live_task_file(pid, "auxv")?).ok())
            .and_then(|auxv| linkmap::at_base(&auxv));
        let is_exe = |f: &&MappedFile| exe.is_some_and(|k| k.dev == f.dev && k.inode == f.inode);
        let loader = base.and_then(|b| files.iter().find(|f| f.contains(b)));
        files.iter().filter(is_exe).chain(loader).find_map(|f| {
            let elf = self.file(pid, f).ok()?;
            let bias = Self::bias(&elf, f)?;
            elf.lookup(linkmap::R_DEBUG)
                .into_iter()
                .find(|s| s.kind == SymKind::Object && s.vaddr != 0)
                .map(|s| s.vaddr.wrapping_add(bias))
        })
    }

    /// The runtime address and size of section `name` of `pid`'s
    /// executable, if it has one.
    pub fn exe_section(&self, pid: Pid, name: &str) -> Option<(u64, u64)> {
        let (elf, bias) = self.exe_elf(pid)?;
        let (at, size) = elf.section(name)?;
        Some((at.wrapping_add(bias), size))
    }

    /// The runtime address of data symbol `name` in the symbol tables of
    /// `pid`'s executable (or of its separate debug file, for a stripped
    /// one), if they list it: one module's tables, where a name looked up
    /// in the whole process (`resolve`) may index every library's DWARF
    /// first (a second with a C library's debug information installed).
    pub fn exe_symbol(&self, pid: Pid, name: &str) -> Option<u64> {
        let (elf, bias) = self.exe_elf(pid)?;
        elf.lookup(name)
            .into_iter()
            .find(|s| s.kind == SymKind::Object && s.vaddr != 0)
            .map(|s| s.vaddr.wrapping_add(bias))
    }

    /// `pid`'s executable's file and load bias.
    fn exe_elf(&self, pid: Pid) -> Option<(Arc<ElfFile>, u64)> {
        let files = maps::read(pid).ok()?;
        let exe = Self::exe_file(pid)?;
        let f = files
            .iter()
            .find(|f| exe.dev == f.dev && exe.inode == f.inode)?;
        let elf = self.file(pid, f).ok()?;
        let bias = Self::bias(&elf, f)?;
        Some((elf, bias))
    }

    /// What `name` names in `pid`, as a watchpoint would take it: a
    /// variable (for a write watchpoint), or else a function (its entry,
    /// for an exec watchpoint); which one it is comes with it.
    pub fn look_up(&self, pid: Pid, name: &str) -> Result<(Resolved, NameKind), SymbolError> {
        match self.evaluate(pid, name, crate::model::Access::Write, 0) {
            Ok(r) if r.value.is_some() => Ok((r, NameKind::Value)),
            Ok(r) => Ok((r, NameKind::Variable)),
            Err(SymbolError::NotAVariable { .. }) => self
                .resolve(pid, name, crate::model::Access::Exec, 0)
                .map(|r| (r, NameKind::Function)),
            Err(e) => Err(e),
        }
    }

    /// What is at `addr` in `pid`: its module and the symbol containing it.
    pub fn describe_address(&self, pid: Pid, addr: u64) -> Result<AddressInfo, SymbolError> {
        let files = maps::read(pid).map_err(|e| SymbolError::Unreadable {
            pid,
            why: e.to_string(),
        })?;
        self.describe_in(pid, &files, addr)
    }

    /// The symbols the addresses `addrs` of `pid` point into, each as
    /// `name` or `name+offset` (none: in no symbol, e.g. the heap): what a
    /// pointer's value is shown with. One read of the process's maps.
    pub fn points_into(&self, pid: Pid, addrs: &[u64]) -> Vec<Option<String>> {
        let Ok(files) = maps::read(pid) else {
            return vec![None; addrs.len()];
        };
        addrs
            .iter()
            .map(|&a| {
                let (name, start, _, _) = self.describe_in(pid, &files, a).ok()?.symbol?;
                Some(match a.wrapping_sub(start) {
                    0 => name,
                    off => format!("{name}+{off}"),
                })
            })
            .collect()
    }

    /// [`Symbols::describe_address`] in the mapped `files` of `pid`.
    fn describe_in(
        &self,
        pid: Pid,
        files: &[MappedFile],
        addr: u64,
    ) -> Result<AddressInfo, SymbolError> {
        let mut info = AddressInfo {
            module: None,
            build_id: None,
            module_address: addr,
            file_offset: None,
            symbol: None,
        };
        // The module whose file mappings hold it, or whose image spans it
        // (its .bss lies past the file's mappings).
        let f = files.iter().find(|f| f.contains(addr)).or_else(|| {
            files.iter().find(|f| {
                let (lo, hi) = f.span();
                lo <= addr && addr < hi.saturating_add(16 << 20)
            })
        });
        let Some(f) = f else { return Ok(info) };
        let Some(elf) = self.module(pid, f)? else {
            return Ok(info);
        };
        let Some(bias) = Self::bias(&elf, f) else {
            return Ok(info);
        };
        let vaddr = addr.wrapping_sub(bias);
        let Some(sym) = elf.containing(vaddr) else {
            if f.contains(addr) {
                info.module = Some(f.path.clone());
                info.build_id = elf.build_id.clone();
                info.module_address = vaddr;
                info.file_offset = elf.file_offset(vaddr);
            }
            return Ok(info);
        };
        info.module = Some(f.path.clone());
        info.build_id = elf.build_id.clone();
        info.module_address = vaddr;
        info.file_offset = elf.file_offset(vaddr);
        info.symbol = Some((
            sym.name.clone(),
            sym.vaddr.wrapping_add(bias),
            sym.size,
            match sym.kind {
                SymKind::Func => "function",
                SymKind::Object => "variable",
                SymKind::Tls => "thread-local",
            },
        ));
        Ok(info)
    }

    /// The files `pid` maps now (one read of its maps); `None` when the
    /// process is gone.
    pub fn mapped_files(pid: Pid) -> Option<std::collections::HashSet<FileKey>> {
        let files = maps::read(pid).ok()?;
        Some(files.iter().map(FileKey::of).collect())
    }

    /// The file `pid` executes (`/proc/PID/exe`).
    pub fn exe_file(pid: Pid) -> Option<FileKey> {
        resolve::exe_key(pid)
    }
}
