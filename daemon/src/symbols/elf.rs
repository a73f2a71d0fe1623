//! One module's ELF file as the symbol layer needs it, read with `object`:
//! its kind and program headers (for the load bias), build id, symbol
//! tables, and where its DWARF is (in the file itself, or in a separate
//! debug file found by build id or `.gnu_debuglink`, checked by CRC).

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

/// Where debug files are looked for by default, as gdb does:
/// `<dir>/.build-id/xx/….debug` and `<dir>/<binary's dir>/<debuglink name>`.
pub const DEFAULT_DEBUG_DIRS: &[&str] = &["/usr/lib/debug", "/lib/debug"];

/// [`DEFAULT_DEBUG_DIRS`] as paths.
pub fn default_debug_dirs() -> Vec<PathBuf> {
    DEFAULT_DEBUG_DIRS.iter().map(PathBuf::from).collect()
}

/// What a symbol-table entry names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymKind {
    /// A variable (STT_OBJECT, or untyped data).
    Object,
    /// Code (STT_FUNC, STT_GNU_IFUNC).
    Func,
    /// A thread-local variable (STT_TLS): its value is an offset in each
    /// thread's TLS block, not an address.
    Tls,
}

/// Which table a symbol came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymTable {
    /// `.symtab` (of the file or of its debug file).
    Symtab,
    /// `.dynsym`.
    Dynsym,
}

/// One symbol-table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sym {
    /// Name as stored (not demangled).
    pub name: String,
    /// Link-time virtual address (`st_value`).
    pub vaddr: u64,
    /// Size in bytes (`st_size`; 0 when unknown).
    pub size: u64,
    /// What it names.
    pub kind: SymKind,
    /// Visible to other modules (global or weak binding).
    pub global: bool,
    /// Which table.
    pub table: SymTable,
}

/// A `PT_LOAD` segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// File offset.
    pub offset: u64,
    /// Link-time address.
    pub vaddr: u64,
    /// Bytes in the file.
    pub filesz: u64,
    /// Bytes in memory.
    pub memsz: u64,
}

/// Where a module's DWARF came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DebugSource {
    /// The file itself.
    Own,
    /// A separate debug file.
    Separate(PathBuf),
    /// None found.
    None,
}

/// A loaded ELF file: what is parsed once and cached per file.
pub struct ElfFile {
    /// The path it was opened from.
    pub path: PathBuf,
    /// `ET_EXEC` (non-PIE executable: loaded at its link-time addresses).
    pub fixed: bool,
    /// `NT_GNU_BUILD_ID`, if present.
    pub build_id: Option<Vec<u8>>,
    /// `PT_LOAD` segments.
    pub segments: Vec<Segment>,
    /// Symbols of `.symtab` (the file's, else its debug file's), then of
    /// `.dynsym`.
    pub symbols: Vec<Sym>,
    /// The DWARF, when the file or a debug file has it.
    pub dwarf: Option<super::dwarf::DwarfFile>,
    /// Where the DWARF came from.
    pub debug_source: DebugSource,
    /// A `.symtab` was found (in the file or its debug file): not stripped.
    pub has_symtab: bool,
    /// Bytes of the file (mapped, not read).
    pub file_size: u64,
    /// Its call frame information (`.eh_frame`), for unwinding stacks.
    pub cfi: Option<super::unwind::Cfi>,
    /// Its functions named like a name it does not define, by that name
    /// (`ElfFile::functions_like`).
    pub(super) like: std::sync::Mutex<std::collections::HashMap<String, Vec<(f64, String)>>>,
}

impl std::fmt::Debug for ElfFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElfFile")
            .field("path", &self.path)
            .field("symbols", &self.symbols.len())
            .field("debug_source", &self.debug_source)
            .finish()
    }
}

/// Why a module could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read {path}: {why}")]
pub struct ElfError {
    /// The file.
    pub path: String,
    /// Why.
    pub why: String,
}

fn map(path: &Path) -> Result<Mmap, ElfError> {
    let err = |why: String| ElfError {
        path: path.display().to_string(),
        why,
    };
    let f = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    // SAFETY: the mapping is read-only and private; a file truncated under
    // us would fault, which is why only files of mapped modules and debug
    // files are mapped (never written while in use).
    unsafe { Mmap::map(&f) }.map_err(|e| err(e.to_string()))
}

fn symbols_of<'d>(file: &object::File<'d>, table: SymTable) -> Vec<Sym> {
    let iter: Box<dyn Iterator<Item = object::Symbol<'d, '_>>> = match table {
        SymTable::Symtab => Box::new(file.symbols()),
        SymTable::Dynsym => Box::new(file.dynamic_symbols()),
    };
    iter.filter(|s| s.is_definition() || s.kind() == SymbolKind::Tls)
        .filter_map(|s| {
            let kind = match s.kind() {
                SymbolKind::Data | SymbolKind::Unknown => SymKind::Object,
                SymbolKind::Text => SymKind::Func,
                SymbolKind::Tls => SymKind::Tls,
                _ => return None,
            };
            let name = s.name().ok()?;
            if name.is_empty() || s.is_undefined() {
                return None;
            }
            Some(Sym {
                name: name.to_string(),
                vaddr: s.address(),
                size: s.size(),
                kind,
                global: s.is_global(),
                table,
            })
        })
        .collect()
}

/// The `.gnu_debuglink` of `file`: (file name, CRC32).
fn debuglink(file: &object::File<'_>) -> Option<(String, u32)> {
    let (name, crc) = file.gnu_debuglink().ok()??;
    Some((String::from_utf8_lossy(name).into_owned(), crc))
}

/// A separate debug file for `binary` (opened from `open_path`; `ns_path`
/// is its path in the process's namespace), found as gdb finds it.
fn find_debug_file(
    debug_dirs: &[PathBuf],
    ns_path: &Path,
    open_path: &Path,
    build_id: Option<&[u8]>,
    link: Option<&(String, u32)>,
) -> Option<(PathBuf, Mmap)> {
    let check = |p: &Path, crc: Option<u32>| -> Option<(PathBuf, Mmap)> {
        if p == open_path {
            return None;
        }
        let m = map(p).ok()?;
        if let Some(want) = crc
            && crc32fast::hash(&m) != want
        {
            tracing::debug!(path = ?p, "debug file CRC does not match: skipped");
            return None;
        }
        let f = object::File::parse(&*m).ok()?;
        f.section_by_name(".debug_info")?;
        Some((p.to_path_buf(), m))
    };
    if let Some(id) = build_id.filter(|id| id.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        for d in debug_dirs {
            let p = d
                .join(".build-id")
                .join(&hex[..2])
                .join(format!("{}.debug", &hex[2..]));
            if let Some(found) = check(&p, None) {
                return Some(found);
            }
        }
    }
    let (name, crc) = link?;
    let dir = open_path.parent()?;
    let ns_dir = ns_path.parent().unwrap_or(Path::new("/"));
    let mut candidates = vec![dir.join(name), dir.join(".debug").join(name)];
    for d in debug_dirs {
        candidates.push(
            d.join(ns_dir.strip_prefix("/").unwrap_or(ns_dir))
                .join(name),
        );
    }
    candidates.into_iter().find_map(|p| check(&p, Some(*crc)))
}

impl ElfFile {
    /// Reads the file at `open_path` (its path in the process's namespace
    /// is `ns_path`, for debuglink directories), looking for a separate
    /// debug file in `debug_dirs`.
    pub fn load(
        open_path: &Path,
        ns_path: &Path,
        debug_dirs: &[PathBuf],
    ) -> Result<ElfFile, ElfError> {
        let m = map(open_path)?;
        let err = |why: String| ElfError {
            path: ns_path.display().to_string(),
            why,
        };
        let file = object::File::parse(&*m).map_err(|e| err(format!("not an ELF file ({e})")))?;
        if file.format() != object::BinaryFormat::Elf {
            return Err(err("not an ELF file".into()));
        }
        // ET_EXEC; a PIE executable is ET_DYN, like a library.
        let fixed = file.kind() == object::ObjectKind::Executable;
        let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
        let segments = file
            .segments()
            .map(|s| {
                let (offset, filesz) = s.file_range();
                Segment {
                    offset,
                    vaddr: s.address(),
                    filesz,
                    memsz: s.size(),
                }
            })
            .collect();
        let link = debuglink(&file);
        let mut symbols = symbols_of(&file, SymTable::Symtab);
        let own_dwarf = file.section_by_name(".debug_info").is_some();
        let (dwarf, debug_source) = if own_dwarf {
            (
                super::dwarf::DwarfFile::new(m_clone(&m, open_path)?),
                DebugSource::Own,
            )
        } else {
            match find_debug_file(
                debug_dirs,
                ns_path,
                open_path,
                build_id.as_deref(),
                link.as_ref(),
            ) {
                Some((p, dm)) => {
                    if symbols.is_empty()
                        && let Ok(df) = object::File::parse(&*dm)
                    {
                        symbols = symbols_of(&df, SymTable::Symtab);
                    }
                    (super::dwarf::DwarfFile::new(dm), DebugSource::Separate(p))
                }
                None => (None, DebugSource::None),
            }
        };
        let has_symtab = !symbols.is_empty();
        symbols.extend(symbols_of(&file, SymTable::Dynsym));
        let cfi = super::unwind::Cfi::of(&file);
        Ok(ElfFile {
            path: open_path.to_path_buf(),
            fixed,
            build_id,
            segments,
            symbols,
            dwarf,
            debug_source,
            has_symtab,
            file_size: m.len() as u64,
            cfi,
            like: Default::default(),
        })
    }

    /// Its functions named like `name` (Jaro-Winkler 0.85 or more; names
    /// starting with `_` only for a name that does): kept by name, as a
    /// pending event's name found nowhere is looked for again at each
    /// library loaded.
    pub fn functions_like(&self, name: &str) -> Vec<(f64, String)> {
        /// Names whose answers a file keeps.
        const KEPT: usize = 64;
        if let Some(v) = self.like.lock().unwrap().get(name) {
            return v.clone();
        }
        let v: Vec<(f64, String)> = self
            .symbols
            .iter()
            .filter(|s| {
                s.kind == SymKind::Func && (name.starts_with('_') || !s.name.starts_with('_'))
            })
            .map(|s| (strsim::jaro_winkler(name, &s.name), s.name.clone()))
            .filter(|(score, _)| *score >= 0.85)
            .collect();
        let mut like = self.like.lock().unwrap();
        if like.len() >= KEPT {
            like.clear();
        }
        like.insert(name.to_string(), v.clone());
        v
    }

    /// The load bias of this file in a process, from one of its mappings
    /// (`start` mapped from file offset `offset`): runtime address =
    /// link-time address + bias.
    pub fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        if self.fixed {
            return Some(0);
        }
        let seg = self
            .segments
            .iter()
            .find(|s| s.filesz > 0 && s.offset <= offset + 0xfff && offset < s.offset + s.filesz)
            .or_else(|| self.segments.first())?;
        // File byte x (in the segment) has link address vaddr + (x - offset)
        // and is mapped at start + (x - mapping offset).
        Some(
            start
                .wrapping_sub(offset)
                .wrapping_add(seg.offset)
                .wrapping_sub(seg.vaddr),
        )
    }

    /// The file offset of link-time address `vaddr`, when a segment holds
    /// it in the file (not for `.bss`).
    pub fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| s.vaddr <= vaddr && vaddr < s.vaddr + s.filesz)
            .map(|s| vaddr - s.vaddr + s.offset)
    }

    /// The symbols named `name` (several tables may list one).
    pub fn lookup(&self, name: &str) -> Vec<&Sym> {
        let mut v: Vec<&Sym> = self.symbols.iter().filter(|s| s.name == name).collect();
        // The same entry in .symtab and .dynsym: keep the first.
        v.dedup_by(|a, b| a.vaddr == b.vaddr && a.kind == b.kind);
        let mut seen = std::collections::HashSet::new();
        v.retain(|s| seen.insert((s.vaddr, s.kind == SymKind::Tls)));
        v
    }

    /// The symbol whose range holds `vaddr` (code or data), if any.
    pub fn containing(&self, vaddr: u64) -> Option<&Sym> {
        self.symbols
            .iter()
            .filter(|s| s.kind != SymKind::Tls)
            .filter(|s| s.vaddr <= vaddr && vaddr < s.vaddr + s.size.max(1))
            .min_by_key(|s| s.size)
    }
}

/// A second mapping of the same file (the DWARF keeps its own).
fn m_clone(_m: &Mmap, path: &Path) -> Result<Mmap, ElfError> {
    map(path)
}

/// Section bytes: borrowed from the mapping, or decompressed.
pub fn section_bytes<'d>(file: &object::File<'d>, name: &str) -> Option<Cow<'d, [u8]>> {
    file.section_by_name(name)?.uncompressed_data().ok()
}
