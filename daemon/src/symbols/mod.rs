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
//! Rooms: `expr.rs` (the name grammar), `maps.rs` (`/proc/PID/maps`),
//! `elf.rs` (one module file, its debug file), `dwarf.rs` (variables and
//! types), `locate.rs` (symbolizing instruction pointers).

pub mod dwarf;
pub mod elf;
pub mod expr;
pub mod locate;
pub mod maps;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::model::{Access, Pid};
use elf::{DebugSource, ElfFile, SymKind, SymTable};
use expr::Expr;
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

/// Identity of a mapped file: device and inode (paths differ between mount
/// namespaces and files are replaced under their names).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    /// Device (`fd:01`).
    pub dev: String,
    /// Inode.
    pub inode: u64,
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
    /// Where the address and size came from.
    pub source: Source,
    /// The link-time address in the module (`address` − load bias).
    pub module_address: u64,
    /// Anything the caller should know (a choice made among several).
    pub note: Option<String>,
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

impl SymbolError {
    /// Whether the name may resolve in the same process a moment later: a
    /// module or name not mapped yet (a program just started or exec'd,
    /// whose dynamic linker has not loaded its libraries).
    pub fn may_resolve_later(&self) -> bool {
        matches!(
            self,
            SymbolError::NoSuchModule { .. } | SymbolError::Unknown { .. }
        )
    }
}

/// Why a name does not resolve. Each is a refusal that changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SymbolError {
    /// Not a name.
    #[error("{0}")]
    Syntax(#[from] expr::ExprError),
    /// No module of that name.
    #[error("process {pid} maps no module {module:?} (it maps {})", loaded.join(", "))]
    NoSuchModule {
        /// Process.
        pid: Pid,
        /// Asked for.
        module: String,
        /// The modules it maps.
        loaded: Vec<String>,
    },
    /// Nothing of that name.
    #[error("{}", unknown_message(name, *pid, *searched, closest, stripped))]
    Unknown {
        /// Process.
        pid: Pid,
        /// The name.
        name: String,
        /// Modules searched.
        searched: usize,
        /// The closest names found.
        closest: Vec<String>,
        /// Modules searched that have no symbol table and no debug file.
        stripped: Vec<String>,
    },
    /// Several unrelated variables of that name.
    #[error(
        "{name:?} names {} variables in process {pid}: {}; say which with MODULE:{name}",
        modules.len(),
        modules.join(", ")
    )]
    Ambiguous {
        /// Process.
        pid: Pid,
        /// The name.
        name: String,
        /// `module (static|global)` of each.
        modules: Vec<String>,
    },
    /// A function, not a variable.
    #[error(
        "{name:?} is a function in {module}, not a variable: to watch it being executed, use --access exec (a 1-byte exec watchpoint at its entry)"
    )]
    NotAVariable {
        /// The name.
        name: String,
        /// Its module.
        module: String,
    },
    /// A thread-local variable.
    #[error(
        "{name:?} in {module} is thread-local: every thread has its own copy at its own address, which one watchpoint cannot follow across threads; watch one thread's copy by its address with --tid"
    )]
    ThreadLocal {
        /// The name.
        name: String,
        /// Its module.
        module: String,
    },
    /// Members or elements asked for without DWARF.
    #[error(
        "{expr} needs the type of {name:?}, and {module} has no debug information ({why}): build it with -g, install its debug file, or give an address and --len"
    )]
    NoDebugInfo {
        /// The expression.
        expr: String,
        /// The variable.
        name: String,
        /// Its module.
        module: String,
        /// What was looked for.
        why: String,
    },
    /// A path into the variable that does not exist.
    #[error("{expr}: {error}")]
    Path {
        /// The expression.
        expr: String,
        /// What is wrong.
        error: dwarf::PathError,
    },
    /// An offset outside the object with no length given.
    #[error(
        "{expr}: offset {offset} is outside the {size} bytes of {name:?}; give --len to watch there"
    )]
    Offset {
        /// The expression.
        expr: String,
        /// The variable.
        name: String,
        /// Offset asked for.
        offset: i64,
        /// Size of the object.
        size: u64,
    },
    /// The size is not known.
    #[error("the size of {expr} is not known ({why}): give --len")]
    NoSize {
        /// The expression.
        expr: String,
        /// Why.
        why: String,
    },
    /// An object larger than a thread's slots cover.
    #[error(
        "{expr} ({}{size} bytes) needs {needed} debug-register slots per thread and a thread has {slots}: watch part of it (a member, an element, or fewer bytes with --len)",
        type_name.as_ref().map(|t| format!("{t}, ")).unwrap_or_default()
    )]
    TooLarge {
        /// The expression.
        expr: String,
        /// Its type.
        type_name: Option<String>,
        /// Its size.
        size: u64,
        /// Slots it would take.
        needed: usize,
        /// Slots per thread.
        slots: usize,
    },
    /// The process's files could not be read.
    #[error("cannot read the mappings of process {pid}: {why}")]
    Unreadable {
        /// Process.
        pid: Pid,
        /// Why.
        why: String,
    },
}

fn unknown_message(
    name: &str,
    pid: Pid,
    searched: usize,
    closest: &[String],
    stripped: &[String],
) -> String {
    let mut s = format!(
        "no variable or function named {name:?} in process {pid} ({searched} module{} searched",
        if searched == 1 { "" } else { "s" }
    );
    if !closest.is_empty() {
        s.push_str(&format!("; closest: {}", closest.join(", ")));
    }
    s.push(')');
    if !stripped.is_empty() {
        s.push_str(&format!(
            "; {} {} stripped (no symbol table, and no debug file was found): only {} exported names are known",
            stripped.join(", "),
            if stripped.len() == 1 { "is" } else { "are" },
            if stripped.len() == 1 { "its" } else { "their" }
        ));
    }
    s
}

/// What one candidate module has under the name.
#[derive(Debug, Clone)]
enum Hit {
    Var(dwarf::VarDie),
    Sym(elf::Sym),
}

struct Candidate<'a> {
    file: &'a MappedFile,
    elf: Arc<ElfFile>,
    bias: u64,
    hit: Hit,
}

impl Candidate<'_> {
    fn global(&self) -> bool {
        match &self.hit {
            Hit::Var(v) => v.external,
            Hit::Sym(s) => s.global,
        }
    }

    fn describe(&self) -> String {
        format!(
            "{} ({})",
            self.file.name(),
            if self.global() { "global" } else { "static" }
        )
    }
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

/// Module files loaded once per file (device and inode), the least
/// recently used dropped beyond [`MAX_FILES`].
#[derive(Default)]
pub struct Files(Mutex<FileCache>);

impl std::fmt::Debug for Symbols {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Symbols").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct FileCache {
    by_key: HashMap<FileKey, FileEntry>,
    tick: u64,
}

/// A loaded file, when it was last used, and the processes it was loaded
/// for (it goes when the last of them is let go of).
struct FileEntry {
    elf: Arc<ElfFile>,
    used: u64,
    pids: std::collections::HashSet<Pid>,
}

/// Files kept loaded (least recently used ones go beyond this).
const MAX_FILES: usize = 512;

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

fn matches_module(f: &MappedFile, want: &str) -> bool {
    if want.contains('/') {
        return f.path == want;
    }
    let name = f.name();
    name == want
        || name
            .strip_prefix(want)
            .is_some_and(|rest| rest.starts_with('.'))
}

impl Files {
    /// `pid` is let go of: the files no remaining process was loaded for
    /// are dropped (processes that are gone, never detached because never
    /// attached, e.g. after a ResolveSymbol only, count as let go of too).
    pub fn forget(&self, pid: Pid) {
        let mut c = self.0.lock().unwrap();
        let mut alive: HashMap<Pid, bool> = HashMap::new();
        c.by_key.retain(|_, e| {
            e.pids.retain(|&p| {
                p != pid
                    && *alive
                        .entry(p)
                        .or_insert_with(|| Path::new(&format!("/proc/{p}")).exists())
            });
            !e.pids.is_empty()
        });
    }

    /// The ELF file of a module `pid` maps, loaded once per file.
    pub fn file(&self, pid: Pid, f: &MappedFile) -> Result<Arc<ElfFile>, elf::ElfError> {
        let key = FileKey {
            dev: f.dev.clone(),
            inode: f.inode,
        };
        {
            let mut c = self.0.lock().unwrap();
            c.tick += 1;
            let tick = c.tick;
            if let Some(e) = c.by_key.get_mut(&key) {
                e.used = tick;
                e.pids.insert(pid);
                return Ok(e.elf.clone());
            }
        }
        // Loaded outside the lock: a large file takes a while.
        let e = Arc::new(ElfFile::load(&f.open_path(pid), Path::new(&f.path))?);
        let mut c = self.0.lock().unwrap();
        c.tick += 1;
        let tick = c.tick;
        let entry = c.by_key.entry(key).or_insert_with(|| FileEntry {
            elf: e,
            used: tick,
            pids: Default::default(),
        });
        entry.pids.insert(pid);
        let e = entry.elf.clone();
        if c.by_key.len() > MAX_FILES
            && let Some(oldest) = c
                .by_key
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
        {
            c.by_key.remove(&oldest);
        }
        Ok(e)
    }
}

impl Symbols {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    fn file(&self, pid: Pid, f: &MappedFile) -> Result<Arc<ElfFile>, elf::ElfError> {
        self.files.file(pid, f)
    }

    /// Counters.
    pub fn stats(&self) -> SymbolStats {
        let c = self.files.0.lock().unwrap();
        let bytes: u64 = c
            .by_key
            .values()
            .map(|FileEntry { elf: e, .. }| {
                let syms: usize = e
                    .symbols
                    .iter()
                    .map(|s| s.name.capacity() + std::mem::size_of::<elf::Sym>())
                    .sum();
                (syms + e.dwarf.as_ref().map_or(0, |d| d.heap_bytes())) as u64
            })
            .sum();
        let (locations, location_bytes) = self.locator.cached();
        SymbolStats {
            files: c.by_key.len() as u64,
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

    /// Resolves `text` in process `pid` for a watchpoint of kind `access`;
    /// `len` is the length asked for (0: the object's size).
    pub fn resolve(
        &self,
        pid: Pid,
        text: &str,
        access: Access,
        len: u32,
    ) -> Result<Resolved, SymbolError> {
        let expr = Expr::parse(text)?;
        let files = maps::read(pid).map_err(|e| SymbolError::Unreadable {
            pid,
            why: e.to_string(),
        })?;
        let exe_key = exe_key(pid);
        let mut order: Vec<&MappedFile> = files.iter().collect();
        // The executable first: its definitions interpose on the libraries'.
        order.sort_by_key(|f| Some((f.dev.clone(), f.inode)) != exe_key);
        let searched: Vec<&MappedFile> = match &expr.module {
            Some(m) => order.into_iter().filter(|f| matches_module(f, m)).collect(),
            None => order,
        };
        if let Some(m) = &expr.module
            && searched.is_empty()
        {
            let mut loaded: Vec<String> = files.iter().map(|f| f.name().to_string()).collect();
            loaded.dedup();
            return Err(SymbolError::NoSuchModule {
                pid,
                module: m.clone(),
                loaded,
            });
        }
        let mut found: Vec<Candidate<'_>> = Vec::new();
        let mut stripped = Vec::new();
        let mut loaded = Vec::new();
        for f in &searched {
            let elf = match self.file(pid, f) {
                Ok(e) => e,
                Err(e) => {
                    tracing::debug!(pid, error = ?e.to_string(), "module file skipped");
                    continue;
                }
            };
            let Some(bias) = Self::bias(&elf, f) else {
                continue;
            };
            if !elf.has_symtab && elf.dwarf.is_none() {
                stripped.push(f.name().to_string());
            }
            let vars = elf
                .dwarf
                .as_ref()
                .map(|d| d.variables(&expr.name))
                .unwrap_or_default();
            if vars.is_empty() {
                for s in elf.lookup(&expr.name) {
                    found.push(Candidate {
                        file: f,
                        elf: elf.clone(),
                        bias,
                        hit: Hit::Sym(s.clone()),
                    });
                }
            } else {
                for v in vars {
                    found.push(Candidate {
                        file: f,
                        elf: elf.clone(),
                        bias,
                        hit: Hit::Var(v),
                    });
                }
            }
            loaded.push(elf);
            // A global definition of a variable binds the name for every
            // module after it in lookup order (the dynamic linker's rule):
            // the rest need not be read, nor their DWARF indexed.
            if expr.module.is_none()
                && access != Access::Exec
                && found.iter().any(|c| {
                    c.global()
                        && match &c.hit {
                            Hit::Var(v) => v.loc != dwarf::VarLoc::Tls,
                            Hit::Sym(s) => s.kind == SymKind::Object,
                        }
                })
            {
                break;
            }
        }
        if found.is_empty() {
            return Err(SymbolError::Unknown {
                pid,
                name: expr.name.clone(),
                searched: searched.len(),
                closest: closest(&expr.name, &loaded),
                stripped,
            });
        }
        // A function or a TLS variable is refused as such, unless a variable
        // of the name exists too.
        let is_var = |c: &Candidate<'_>| match &c.hit {
            Hit::Var(v) => v.loc != dwarf::VarLoc::Tls,
            Hit::Sym(s) => s.kind == SymKind::Object,
        };
        let is_func = |c: &Candidate<'_>| matches!(&c.hit, Hit::Sym(s) if s.kind == SymKind::Func);
        let wanted: Vec<&Candidate<'_>> = if access == Access::Exec {
            found.iter().filter(|c| is_func(c)).collect()
        } else {
            found.iter().filter(|c| is_var(c)).collect()
        };
        let pick = match wanted.as_slice() {
            [] => {
                let c = &found[0];
                let module = c.file.name().to_string();
                return Err(if is_func(c) {
                    if access == Access::Exec {
                        unreachable!("filtered above")
                    }
                    SymbolError::NotAVariable {
                        name: expr.name.clone(),
                        module,
                    }
                } else if matches!(&c.hit, Hit::Sym(s) if s.kind == SymKind::Tls)
                    || matches!(&c.hit, Hit::Var(v) if v.loc == dwarf::VarLoc::Tls)
                {
                    SymbolError::ThreadLocal {
                        name: expr.name.clone(),
                        module,
                    }
                } else {
                    // A variable asked for as code.
                    SymbolError::Unknown {
                        pid,
                        name: format!("{} (as code)", expr.name),
                        searched: searched.len(),
                        closest: Vec::new(),
                        stripped,
                    }
                });
            }
            [one] => *one,
            many => {
                // Global definitions of one name: the process uses the first
                // in lookup order (the executable, then the libraries in
                // load order), as the dynamic linker binds it.
                if many.iter().all(|c| c.global()) && expr.module.is_none() {
                    many[0]
                } else if many.iter().all(|c| std::ptr::eq(c.file, many[0].file)) {
                    // One module describing it twice (DWARF in two units).
                    many[0]
                } else {
                    return Err(SymbolError::Ambiguous {
                        pid,
                        name: expr.name.clone(),
                        modules: many.iter().map(|c| c.describe()).collect(),
                    });
                }
            }
        };
        let note = (wanted.len() > 1 && !std::ptr::eq(pick, wanted[0]) || wanted.len() > 1).then(|| {
            format!(
                "{} modules define {:?} globally; the process uses {}'s (the first in lookup order)",
                wanted.len(),
                expr.name,
                pick.file.name()
            )
        });
        self.finish(&expr, pick, access, len, note)
    }

    fn finish(
        &self,
        expr: &Expr,
        c: &Candidate<'_>,
        access: Access,
        len: u32,
        mut note: Option<String>,
    ) -> Result<Resolved, SymbolError> {
        let text = expr.to_string();
        let module = c.file.name().to_string();
        // The object named (after its members and elements): link-time
        // address, size, type; then the byte offset.
        let (vaddr, mut size, mut type_name, source) = match &c.hit {
            Hit::Var(v) => {
                let dwarf::VarLoc::Addr(a) = v.loc else {
                    unreachable!("TLS refused above")
                };
                let d = c.elf.dwarf.as_ref().expect("a DWARF hit has DWARF");
                let (off, info) =
                    d.walk(v, &expr.name, &expr.steps)
                        .map_err(|error| SymbolError::Path {
                            expr: text.clone(),
                            error,
                        })?;
                let mut size = info.as_ref().and_then(|i| i.size);
                let mut type_name = info.map(|i| i.name);
                let mut vaddr = a + off;
                if expr.offset != 0 {
                    let whole = size.unwrap_or(0);
                    let at = u64::try_from(expr.offset).ok().filter(|&o| o < whole);
                    match at {
                        // `stats+8`: from byte 8 to the end of the member
                        // holding it.
                        Some(at) => {
                            vaddr += at;
                            match d.member_at(v, &expr.steps, at) {
                                Ok(Some((m_off, m_size, m_path, m_type))) => {
                                    size = Some(m_off + m_size - at);
                                    type_name = Some(m_type);
                                    if !m_path.is_empty() {
                                        note = Some(format!(
                                            "{} is in {}{m_path}",
                                            expr.path(),
                                            expr.name
                                        ));
                                    }
                                }
                                _ => size = Some(whole - at),
                            }
                        }
                        None if len > 0 => {
                            vaddr = vaddr.wrapping_add_signed(expr.offset);
                            type_name = None;
                        }
                        None => {
                            return Err(SymbolError::Offset {
                                expr: text,
                                name: expr.name.clone(),
                                offset: expr.offset,
                                size: whole,
                            });
                        }
                    }
                }
                (vaddr, size, type_name, Source::Dwarf)
            }
            Hit::Sym(s) => {
                if !expr.steps.is_empty() {
                    return Err(SymbolError::NoDebugInfo {
                        expr: text,
                        name: expr.name.clone(),
                        module,
                        why: match c.elf.debug_source {
                            DebugSource::None => "no DWARF in it and no debug file found".into(),
                            _ => format!("its DWARF does not describe {:?}", expr.name),
                        },
                    });
                }
                let source = match s.table {
                    SymTable::Symtab => Source::Symtab,
                    SymTable::Dynsym => Source::Dynsym,
                };
                let mut vaddr = s.vaddr;
                let mut size = (s.size > 0).then_some(s.size);
                if expr.offset != 0 {
                    let whole = s.size;
                    match u64::try_from(expr.offset).ok().filter(|&o| o < whole) {
                        Some(at) => {
                            vaddr += at;
                            size = Some(whole - at);
                        }
                        None if len > 0 => vaddr = vaddr.wrapping_add_signed(expr.offset),
                        None => {
                            return Err(SymbolError::Offset {
                                expr: text,
                                name: expr.name.clone(),
                                offset: expr.offset,
                                size: whole,
                            });
                        }
                    }
                }
                (vaddr, size, None, source)
            }
        };
        if access == Access::Exec {
            size = Some(1);
            type_name = None;
        }
        let size = match (len, size) {
            (0, Some(s)) if s > 0 => s,
            (0, _) => {
                return Err(SymbolError::NoSize {
                    expr: text,
                    why: match source {
                        Source::Dwarf => "its DWARF type has no size".into(),
                        _ => "its symbol-table entry says size 0".into(),
                    },
                });
            }
            (l, _) => u64::from(l),
        };
        Ok(Resolved {
            expr: text,
            symbol: expr.name.clone(),
            module: c.file.path.clone(),
            module_key: FileKey {
                dev: c.file.dev.clone(),
                inode: c.file.inode,
            },
            build_id: c.elf.build_id.clone(),
            address: vaddr.wrapping_add(c.bias),
            size,
            type_name,
            source,
            module_address: vaddr,
            note,
        })
    }

    /// What `addr` is in process `pid`: its module and the symbol holding
    /// it.
    pub fn describe_address(&self, pid: Pid, addr: u64) -> Result<AddressInfo, SymbolError> {
        let files = maps::read(pid).map_err(|e| SymbolError::Unreadable {
            pid,
            why: e.to_string(),
        })?;
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
        let Ok(elf) = self.file(pid, f) else {
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
        Some(
            files
                .iter()
                .map(|f| FileKey {
                    dev: f.dev.clone(),
                    inode: f.inode,
                })
                .collect(),
        )
    }

    /// The file `pid` executes (`/proc/PID/exe`).
    pub fn exe_file(pid: Pid) -> Option<FileKey> {
        exe_key(pid).map(|(dev, inode)| FileKey { dev, inode })
    }
}

/// Device and inode of the process's executable.
fn exe_key(pid: Pid) -> Option<(String, u64)> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(format!("/proc/{pid}/exe")).ok()?;
    let d = md.dev();
    let (maj, min) = (
        ((d >> 8) & 0xfff) | ((d >> 32) & !0xfff),
        (d & 0xff) | ((d >> 12) & !0xff),
    );
    Some((format!("{maj:02x}:{min:02x}"), md.ino()))
}

/// Up to three names like `name` among the variables of `files`.
fn closest(name: &str, files: &[Arc<ElfFile>]) -> Vec<String> {
    let mut scored: Vec<(f64, String)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut consider = |n: &str| {
        if n.starts_with("_") && !name.starts_with('_') {
            return;
        }
        if !seen.insert(n.to_string()) {
            return;
        }
        let score = strsim::jaro_winkler(name, n);
        let contains = n.contains(name) || name.contains(n) && n.len() >= 3;
        if score >= 0.8 || contains {
            scored.push((
                if contains { score.max(0.85) } else { score },
                n.to_string(),
            ));
        }
    };
    for f in files {
        if let Some(d) = &f.dwarf {
            for n in d.names() {
                consider(n);
            }
        }
        for s in f.symbols.iter().filter(|s| s.kind == SymKind::Object) {
            consider(&s.name);
        }
    }
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    scored.into_iter().take(3).map(|(_, n)| n).collect()
}
