//! One module's ELF file as the symbol layer needs it, read with `object`:
//! its kind and program headers (for the load bias), build id, symbol
//! tables, and where its DWARF is (in the file itself, or in a separate
//! debug file found by build id or `.gnu_debuglink`, checked by CRC).
//! Every file is opened through `open.rs`: regular files only, without
//! blocking, without following a link out of the directory searched.

use std::path::{Path, PathBuf};

use memmap2::Mmap;
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

use super::open::{self, Links, OpenError, Opened};

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
    pub cfi: Option<super::cfi::Cfi>,
    /// Its PLT stubs, named (`plt.rs`).
    pub plt: Vec<super::plt::PltStub>,
    /// Its functions named like a name it does not define, by that name
    /// (`ElfFile::functions_like`).
    pub(super) like: std::sync::Mutex<std::collections::HashMap<String, Vec<(f64, String)>>>,
    /// Debug files looked for and refused (not a regular file, a link out
    /// of the directory searched, too large, a debug link that is not a
    /// file name), in the order they were looked for.
    pub debug_refused: Vec<OpenError>,
    /// The file the hit symbolizer reads (the separate debug file, else the
    /// module), held open: `blazesym` is given `/proc/self/fd/N`, the file
    /// checked here, never a path it would resolve (or follow links from)
    /// itself.
    symbolizer_file: std::fs::File,
    /// Whether `blazesym` may read that file's DWARF: it has some, and
    /// names no other file (`.gnu_debuglink`, `.gnu_debugaltlink`,
    /// `.debug_sup`), which `blazesym` would open by path without these
    /// checks. Else only its symbol tables are read.
    symbolizer_dwarf: bool,
    /// The module file mapped (its code, as the file has it: a uprobe's
    /// breakpoint in the process's copy is not there).
    pub(super) image: Mmap,
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

impl From<OpenError> for ElfError {
    fn from(e: OpenError) -> ElfError {
        let path = match &e {
            OpenError::NotRegular { path, .. }
            | OpenError::Escapes { path, .. }
            | OpenError::TooLarge { path, .. }
            | OpenError::NotMapped { path }
            | OpenError::Io { path, .. } => path.clone(),
            OpenError::BadLinkName { name } => name.clone(),
        };
        ElfError {
            path,
            why: e.to_string(),
        }
    }
}

/// A checked file, mapped.
fn map(f: &std::fs::File, path: &Path) -> Result<Mmap, ElfError> {
    // SAFETY: the mapping is read-only and private; a file truncated under
    // us would fault, which is why only files of mapped modules and debug
    // files are mapped (never written while in use).
    unsafe { Mmap::map(f) }.map_err(|e| ElfError {
        path: path.display().to_string(),
        why: e.to_string(),
    })
}

/// Whether `file` names other files that a DWARF reader would open:
/// `.gnu_debuglink`, `.gnu_debugaltlink` (dwz), `.debug_sup`.
fn names_other_files(file: &object::File<'_>) -> bool {
    [".gnu_debuglink", ".gnu_debugaltlink", ".debug_sup"]
        .iter()
        .any(|n| file.section_by_name(n).is_some())
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

/// The `.gnu_debuglink` of `file`: (file name as stored, CRC32).
fn debuglink(file: &object::File<'_>) -> Option<(Vec<u8>, u32)> {
    let (name, crc) = file.gnu_debuglink().ok()??;
    Some((name.to_vec(), crc))
}

/// A separate debug file found, checked and mapped.
struct DebugFile {
    path: PathBuf,
    map: Mmap,
    file: std::fs::File,
    names_others: bool,
}

/// What a debug file must match: the module's build id, or its debug
/// link's CRC.
#[derive(Clone, Copy)]
enum Want<'a> {
    BuildId(&'a [u8]),
    Crc(u32),
}

/// Where a module is, for its debug files.
pub struct Place<'a> {
    /// The module's directory as the daemon reaches it (in the process's
    /// mount namespace: `/proc/PID/root/DIR`), where `.gnu_debuglink` is
    /// looked for first; `None` to look in the debug directories only.
    pub dir: Option<&'a Path>,
    /// The module's directory in the process's namespace (for
    /// `<debug dir>/<dir>/<name>`).
    pub ns_dir: &'a Path,
}

/// A candidate debug file: opened (`open.rs`), not the module itself, at
/// most [`open::MAX_DEBUG_FILE_BYTES`], an ELF file with `.debug_info`, of
/// the module's build id or the debug link's CRC (checked last: it reads
/// the whole file). Refusals are kept in `refused`; a file that is not
/// there is no refusal.
fn check_candidate(
    opened: Result<Opened, OpenError>,
    shown: PathBuf,
    module: (u64, u64),
    want: Want<'_>,
    refused: &mut Vec<OpenError>,
) -> Option<DebugFile> {
    let o = match opened {
        Ok(o) => o,
        Err(e) if e.is_absent() => return None,
        Err(e) => {
            tracing::warn!(error = %e, "debug file refused");
            refused.push(e);
            return None;
        }
    };
    if (o.dev, o.ino) == module {
        return None;
    }
    if o.size > open::MAX_DEBUG_FILE_BYTES {
        let e = OpenError::TooLarge {
            path: shown.display().to_string(),
            size: o.size,
            max: open::MAX_DEBUG_FILE_BYTES,
        };
        tracing::warn!(error = %e, "debug file refused");
        refused.push(e);
        return None;
    }
    let map = map(&o.file, &shown).ok()?;
    let names_others = {
        let f = object::File::parse(&*map).ok()?;
        f.section_by_name(".debug_info")?;
        if let Want::BuildId(id) = want
            && f.build_id().ok().flatten() != Some(id)
        {
            tracing::debug!(path = ?shown, "debug file of another build id: skipped");
            return None;
        }
        names_other_files(&f)
    };
    if let Want::Crc(crc) = want
        && crc32fast::hash(&map) != crc
    {
        tracing::debug!(path = ?shown, "debug file CRC does not match: skipped");
        return None;
    }
    Some(DebugFile {
        path: shown,
        map,
        file: o.file,
        names_others,
    })
}

/// A separate debug file for a module (device and inode `module`), found
/// as gdb finds it: `<debug dir>/.build-id/xx/….debug` (links beneath the
/// debug directory followed), then the debug link's name (a file name,
/// nothing else) in the module's directory and its `.debug/` (no link
/// followed: the process's owner controls them), then under each debug
/// directory as `<debug dir>/<module's dir>/<name>`.
fn find_debug_file(
    debug_dirs: &[PathBuf],
    at: &Place<'_>,
    module: (u64, u64),
    build_id: Option<&[u8]>,
    link: Option<&(Vec<u8>, u32)>,
    refused: &mut Vec<OpenError>,
) -> Option<DebugFile> {
    let dirs: Vec<(&PathBuf, std::os::fd::OwnedFd)> = debug_dirs
        .iter()
        .filter_map(|d| open::open_dir(d).ok().map(|fd| (d, fd)))
        .collect();
    if let Some(id) = build_id.filter(|id| id.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let rel = Path::new(".build-id")
            .join(&hex[..2])
            .join(format!("{}.debug", &hex[2..]));
        for (d, fd) in &dirs {
            let opened = open::open_beneath(fd, d, &rel, Links::Beneath);
            if let Some(found) =
                check_candidate(opened, d.join(&rel), module, Want::BuildId(id), refused)
            {
                return Some(found);
            }
        }
    }
    let (name, crc) = link?;
    let name = match open::link_name(name) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "debug link refused");
            refused.push(e);
            return None;
        }
    };
    let want = Want::Crc(*crc);
    if let Some(dir) = at.dir
        && let Ok(fd) = open::open_dir(dir)
    {
        for rel in [
            Path::new(name).to_path_buf(),
            Path::new(".debug").join(name),
        ] {
            let opened = open::open_beneath(&fd, dir, &rel, Links::None);
            if let Some(found) = check_candidate(opened, dir.join(&rel), module, want, refused) {
                return Some(found);
            }
        }
    }
    let rel = at.ns_dir.strip_prefix("/").unwrap_or(at.ns_dir).join(name);
    for (d, fd) in &dirs {
        let opened = open::open_beneath(fd, d, &rel, Links::Beneath);
        if let Some(found) = check_candidate(opened, d.join(&rel), module, want, refused) {
            return Some(found);
        }
    }
    None
}

impl ElfFile {
    /// Reads the file at `open_path` (checked by `open.rs`: a regular
    /// file, the last component not a link), looking for a separate debug
    /// file beside it and in `debug_dirs` (its path in the process's
    /// namespace is `ns_path`, for `<debug dir>/<dir>/<name>`).
    pub fn load(
        open_path: &Path,
        ns_path: &Path,
        debug_dirs: &[PathBuf],
    ) -> Result<ElfFile, ElfError> {
        let opened = open::open_file(open_path)?;
        let ns_dir = ns_path.parent().unwrap_or(Path::new("/"));
        let at = Place {
            dir: open_path.parent(),
            ns_dir,
        };
        Self::from_opened(opened, open_path, ns_path, &at, debug_dirs)
    }

    /// Reads the module file `opened` (opened from `open_path`; its path in
    /// the process's namespace is `ns_path`), looking for a separate debug
    /// file `at` its place and in `debug_dirs`.
    pub fn from_opened(
        opened: Opened,
        open_path: &Path,
        ns_path: &Path,
        at: &Place<'_>,
        debug_dirs: &[PathBuf],
    ) -> Result<ElfFile, ElfError> {
        let m = map(&opened.file, ns_path)?;
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
        let mut debug_refused = Vec::new();
        let (dwarf, debug_source, symbolizer_file, names_others) = if own_dwarf {
            (
                // A second mapping of the same file: the DWARF keeps its own.
                super::dwarf::DwarfFile::new(map(&opened.file, ns_path)?),
                DebugSource::Own,
                opened.file,
                names_other_files(&file),
            )
        } else {
            match find_debug_file(
                debug_dirs,
                at,
                (opened.dev, opened.ino),
                build_id.as_deref(),
                link.as_ref(),
                &mut debug_refused,
            ) {
                Some(d) => {
                    if symbols.is_empty()
                        && let Ok(df) = object::File::parse(&*d.map)
                    {
                        symbols = symbols_of(&df, SymTable::Symtab);
                    }
                    (
                        super::dwarf::DwarfFile::new(d.map),
                        DebugSource::Separate(d.path),
                        d.file,
                        d.names_others,
                    )
                }
                None => (None, DebugSource::None, opened.file, true),
            }
        };
        let symbolizer_dwarf = dwarf.is_some() && !names_others;
        let has_symtab = !symbols.is_empty();
        symbols.extend(symbols_of(&file, SymTable::Dynsym));
        let cfi = super::cfi::Cfi::of(&file);
        let plt = super::plt::stubs(&file);
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
            plt,
            like: Default::default(),
            debug_refused,
            symbolizer_file,
            symbolizer_dwarf,
            image: m,
        })
    }

    /// What the hit symbolizer is given: the path of the file it reads
    /// (`/proc/self/fd/N` of the file held open here, so that it opens
    /// exactly the file checked, and its `<path>.dwp` lookup finds
    /// nothing), and whether it may read that file's DWARF (it has some and
    /// names no other file: `blazesym` would open those by path itself).
    pub fn symbolizer_source(&self) -> (PathBuf, bool) {
        use std::os::fd::AsRawFd;
        (
            PathBuf::from(format!(
                "/proc/self/fd/{}",
                self.symbolizer_file.as_raw_fd()
            )),
            self.symbolizer_dwarf,
        )
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

    /// Up to `len` bytes of the file from `offset` (fewer at its end).
    pub fn file_bytes(&self, offset: u64, len: usize) -> &[u8] {
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.image.len());
        &self.image[start..start.saturating_add(len).min(self.image.len())]
    }

    /// The link-time address and size of the section `name` (one the
    /// program's own code or runtime reads, such as libFuzzer's counters,
    /// whose bounds no symbol names once linked).
    pub fn section(&self, name: &str) -> Option<(u64, u64)> {
        use object::{Object, ObjectSection};
        let file = object::File::parse(&*self.image).ok()?;
        let s = file.section_by_name(name)?;
        Some((s.address(), s.size()))
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::symbols::open::tests::{Scratch, mkfifo, within};

    /// A minimal 64-bit little-endian ELF file (no segments) with these
    /// sections: (name, `sh_type`, contents).
    pub(crate) fn elf(sections: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut names = vec![0u8];
        let mut name_at = Vec::new();
        for (n, _, _) in sections {
            name_at.push(names.len() as u32);
            names.extend_from_slice(n.as_bytes());
            names.push(0);
        }
        let shstrtab_name = names.len() as u32;
        names.extend_from_slice(b".shstrtab\0");
        let mut out = vec![0u8; 64];
        let mut placed = Vec::new();
        for (_, _, data) in sections {
            while !out.len().is_multiple_of(8) {
                out.push(0);
            }
            placed.push((out.len() as u64, data.len() as u64));
            out.extend_from_slice(data);
        }
        let names_at = out.len() as u64;
        out.extend_from_slice(&names);
        while !out.len().is_multiple_of(8) {
            out.push(0);
        }
        let shoff = out.len() as u64;
        let shnum = sections.len() as u16 + 2;
        let mut sh = |name: u32, ty: u32, off: u64, size: u64| {
            out.extend_from_slice(&name.to_le_bytes());
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&0u64.to_le_bytes()); // flags
            out.extend_from_slice(&0u64.to_le_bytes()); // addr
            out.extend_from_slice(&off.to_le_bytes());
            out.extend_from_slice(&size.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes()); // link
            out.extend_from_slice(&0u32.to_le_bytes()); // info
            out.extend_from_slice(&(if ty == 7 { 4u64 } else { 1u64 }).to_le_bytes());
            out.extend_from_slice(&0u64.to_le_bytes()); // entsize
        };
        sh(0, 0, 0, 0);
        for (i, (_, ty, _)) in sections.iter().enumerate() {
            sh(name_at[i], *ty, placed[i].0, placed[i].1);
        }
        sh(shstrtab_name, 3, names_at, names.len() as u64);
        let mut h = Vec::new();
        h.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
        h.extend_from_slice(&3u16.to_le_bytes()); // ET_DYN
        h.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
        h.extend_from_slice(&1u32.to_le_bytes());
        h.extend_from_slice(&0u64.to_le_bytes()); // entry
        h.extend_from_slice(&0u64.to_le_bytes()); // phoff
        h.extend_from_slice(&shoff.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes()); // flags
        h.extend_from_slice(&64u16.to_le_bytes());
        h.extend_from_slice(&56u16.to_le_bytes());
        h.extend_from_slice(&0u16.to_le_bytes()); // phnum
        h.extend_from_slice(&64u16.to_le_bytes());
        h.extend_from_slice(&shnum.to_le_bytes());
        h.extend_from_slice(&(shnum - 1).to_le_bytes()); // shstrndx
        out[..64].copy_from_slice(&h);
        out
    }

    /// A `.gnu_debuglink` section naming `name` with `crc`.
    fn link(name: &[u8], crc: u32) -> (&'static str, u32, Vec<u8>) {
        let mut d = name.to_vec();
        d.push(0);
        while !d.len().is_multiple_of(4) {
            d.push(0);
        }
        d.extend_from_slice(&crc.to_le_bytes());
        (".gnu_debuglink", 1, d)
    }

    /// A `.note.gnu.build-id` section.
    fn build_id(id: &[u8]) -> (&'static str, u32, Vec<u8>) {
        let mut d = Vec::new();
        d.extend_from_slice(&4u32.to_le_bytes());
        d.extend_from_slice(&(id.len() as u32).to_le_bytes());
        d.extend_from_slice(&3u32.to_le_bytes()); // NT_GNU_BUILD_ID
        d.extend_from_slice(b"GNU\0");
        d.extend_from_slice(id);
        while !d.len().is_multiple_of(4) {
            d.push(0);
        }
        (".note.gnu.build-id", 7, d)
    }

    /// A debug file: `.debug_info` (empty of units) and maybe a build id.
    fn debug_file(id: Option<&[u8]>) -> Vec<u8> {
        let mut s = vec![(".debug_info", 1, Vec::new())];
        s.extend(id.map(build_id));
        elf(&s)
    }

    /// A module without DWARF whose debug link names `name`, the CRC
    /// that of `debug`.
    fn module(name: &[u8], debug: &[u8]) -> Vec<u8> {
        elf(&[link(name, crc32fast::hash(debug))])
    }

    fn load(dir: &Path, dirs: &[PathBuf]) -> ElfFile {
        let (p, dirs) = (dir.join("dl"), dirs.to_vec());
        within("loading the module", move || {
            ElfFile::load(&p, Path::new("/home/u/dl"), &dirs).unwrap()
        })
    }

    #[test]
    fn a_debug_link_beside_the_module_is_found() {
        let s = Scratch::new("elf-beside");
        let d = debug_file(None);
        std::fs::write(s.0.join("dl"), module(b"dl.debug", &d)).unwrap();
        std::fs::write(s.0.join("dl.debug"), &d).unwrap();
        let e = load(&s.0, &[]);
        assert_eq!(e.debug_source, DebugSource::Separate(s.0.join("dl.debug")));
        assert!(e.debug_refused.is_empty(), "{:?}", e.debug_refused);
        std::fs::remove_file(s.0.join("dl.debug")).unwrap();
        std::fs::create_dir(s.0.join(".debug")).unwrap();
        std::fs::write(s.0.join(".debug/dl.debug"), &d).unwrap();
        let e = load(&s.0, &[]);
        assert_eq!(
            e.debug_source,
            DebugSource::Separate(s.0.join(".debug/dl.debug"))
        );
        let (path, dwarf) = e.symbolizer_source();
        assert!(path.starts_with("/proc/self/fd/"), "{path:?}");
        assert!(
            dwarf,
            "a debug file naming no other file: its DWARF is read"
        );
    }

    #[test]
    fn a_fifo_named_by_the_debug_link_is_not_opened() {
        let s = Scratch::new("elf-fifo");
        std::fs::write(s.0.join("dl"), module(b"dl.debug", b"x\n")).unwrap();
        mkfifo(&s.0.join("dl.debug"));
        let e = load(&s.0, &[]);
        assert_eq!(e.debug_source, DebugSource::None);
        assert!(
            matches!(
                &e.debug_refused[..],
                [OpenError::NotRegular {
                    kind: open::FileKind::Fifo,
                    ..
                }]
            ),
            "{:?}",
            e.debug_refused
        );
        // The symbolizer reads the module's symbol tables only: it would
        // follow the debug link itself.
        assert!(!e.symbolizer_source().1);
    }

    #[test]
    fn a_debug_link_name_with_a_slash_is_refused() {
        let s = Scratch::new("elf-abs");
        let other = Scratch::new("elf-abs-target");
        let d = debug_file(None);
        let target = other.0.join("real.debug");
        std::fs::write(&target, &d).unwrap();
        for name in [
            target.display().to_string(),
            "../x/real.debug".into(),
            "..".into(),
        ] {
            std::fs::write(s.0.join("dl"), module(name.as_bytes(), &d)).unwrap();
            let e = load(&s.0, &[]);
            assert_eq!(e.debug_source, DebugSource::None, "{name}");
            assert!(
                matches!(&e.debug_refused[..], [OpenError::BadLinkName { .. }]),
                "{name}: {:?}",
                e.debug_refused
            );
        }
    }

    #[test]
    fn a_link_beside_the_module_is_not_followed() {
        let s = Scratch::new("elf-link");
        let other = Scratch::new("elf-link-target");
        let d = debug_file(None);
        std::fs::write(other.0.join("real.debug"), &d).unwrap();
        std::fs::write(s.0.join("dl"), module(b"dl.debug", &d)).unwrap();
        std::os::unix::fs::symlink(other.0.join("real.debug"), s.0.join("dl.debug")).unwrap();
        let e = load(&s.0, &[]);
        assert_eq!(e.debug_source, DebugSource::None);
        assert!(
            matches!(
                &e.debug_refused[..],
                [OpenError::NotRegular {
                    kind: open::FileKind::Symlink,
                    ..
                }]
            ),
            "{:?}",
            e.debug_refused
        );
        // A device, likewise never opened.
        std::fs::remove_file(s.0.join("dl.debug")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", s.0.join("dl.debug")).unwrap();
        let e = load(&s.0, &[]);
        assert_eq!(e.debug_source, DebugSource::None);
        assert_eq!(e.debug_refused.len(), 1, "{:?}", e.debug_refused);
    }

    #[test]
    fn a_debug_file_over_the_bound_is_not_read() {
        let s = Scratch::new("elf-large");
        let d = debug_file(None);
        std::fs::write(s.0.join("dl"), module(b"dl.debug", &d)).unwrap();
        let f = std::fs::File::create(s.0.join("dl.debug")).unwrap();
        use std::io::Write;
        (&f).write_all(&d).unwrap();
        // Sparse: no disk used, and never read.
        f.set_len(open::MAX_DEBUG_FILE_BYTES + 1).unwrap();
        let t = std::time::Instant::now();
        let e = load(&s.0, &[]);
        assert_eq!(e.debug_source, DebugSource::None);
        assert!(
            matches!(
                &e.debug_refused[..],
                [OpenError::TooLarge { size, max, .. }]
                    if *size == open::MAX_DEBUG_FILE_BYTES + 1 && *max == open::MAX_DEBUG_FILE_BYTES
            ),
            "{:?}",
            e.debug_refused
        );
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn a_build_id_file_is_found_through_a_link_beneath_the_debug_dir() {
        let s = Scratch::new("elf-bid");
        let dbg = Scratch::new("elf-bid-dir");
        let id = [0xab, 0xcd, 0xef, 0x01, 0x23];
        std::fs::write(s.0.join("dl"), elf(&[build_id(&id)])).unwrap();
        // Fedora's layout: .build-id/ab/cdef0123.debug a relative link to
        // the debug file elsewhere under the debug directory.
        std::fs::create_dir_all(dbg.0.join(".build-id/ab")).unwrap();
        std::fs::create_dir_all(dbg.0.join("usr/bin")).unwrap();
        std::fs::write(dbg.0.join("usr/bin/dl.debug"), debug_file(Some(&id))).unwrap();
        std::os::unix::fs::symlink(
            "../../usr/bin/dl.debug",
            dbg.0.join(".build-id/ab/cdef0123.debug"),
        )
        .unwrap();
        let e = load(&s.0, std::slice::from_ref(&dbg.0));
        assert_eq!(
            e.debug_source,
            DebugSource::Separate(dbg.0.join(".build-id/ab/cdef0123.debug"))
        );
        // Another build id's file under that name is not the module's.
        std::fs::write(dbg.0.join("usr/bin/dl.debug"), debug_file(Some(&[1, 2, 3]))).unwrap();
        assert_eq!(
            load(&s.0, std::slice::from_ref(&dbg.0)).debug_source,
            DebugSource::None
        );
        // A link out of the debug directory is not followed.
        std::fs::remove_file(dbg.0.join(".build-id/ab/cdef0123.debug")).unwrap();
        let outside = s.0.join("outside.debug");
        std::fs::write(&outside, debug_file(Some(&id))).unwrap();
        std::os::unix::fs::symlink(&outside, dbg.0.join(".build-id/ab/cdef0123.debug")).unwrap();
        let e = load(&s.0, std::slice::from_ref(&dbg.0));
        assert_eq!(e.debug_source, DebugSource::None);
        assert!(
            matches!(&e.debug_refused[..], [OpenError::Escapes { .. }]),
            "{:?}",
            e.debug_refused
        );
    }

    #[test]
    fn a_module_that_is_a_fifo_is_refused() {
        let s = Scratch::new("elf-modfifo");
        mkfifo(&s.0.join("dl"));
        let p = s.0.join("dl");
        let e = within("loading a FIFO", move || {
            ElfFile::load(&p, Path::new("/home/u/dl"), &[]).unwrap_err()
        });
        assert!(e.why.contains("is a FIFO, not a regular file"), "{e}");
    }
}
