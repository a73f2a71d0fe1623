//! Variables and their types from DWARF, read with `gimli`: an index of
//! every variable with a static location (by name, built once per file),
//! and the type walk that turns `name.member[3]` into an offset, a size and
//! a type name.
//!
//! Rooms: `index.rs` (the indexes of variables and of type names),
//! `types.rs` (the type walk), `error.rs` (why a path into a variable
//! fails). This file holds the file's DWARF and what the rooms say of it.

mod error;
mod index;
mod types;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::OnceLock;

use gimli::{EndianSlice, RunTimeEndian};
use memmap2::Mmap;
use object::{Object, ObjectSection};

pub use error::PathError;
pub use index::canonical_type;
use index::{build_index, build_type_index};
pub use types::type_info;
pub(super) use types::{
    count_of, describe_array, element_offset, find_member, name_of, overflow, type_ref,
};

/// A type DIE: its unit (offset in `.debug_info`) and its offset there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TypeRef {
    /// The unit's offset in `.debug_info`.
    pub unit: usize,
    /// The DIE's offset in the unit.
    pub die: usize,
}

pub(super) type R<'a> = EndianSlice<'a, RunTimeEndian>;

/// Where a variable lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarLoc {
    /// At this link-time address.
    Addr(u64),
    /// In each thread's TLS block.
    Tls,
    /// Nowhere: the compiler left it out (DWARF describes it without a
    /// location).
    OptimizedOut,
}

/// A variable with a static location: where its DIE is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VarDie {
    /// Its unit's offset in `.debug_info`.
    pub unit: usize,
    /// The DIE holding its type (the definition, or the declaration a
    /// definition refers to by `DW_AT_specification`).
    pub die: usize,
    /// Where it lives.
    pub loc: VarLoc,
    /// Visible to other modules (`DW_AT_external`).
    pub external: bool,
}

/// The DWARF of one file: its mapping, sections that had to be
/// decompressed, and the variable index (built on first use).
pub struct DwarfFile {
    map: Mmap,
    owned: HashMap<gimli::SectionId, Vec<u8>>,
    index: OnceLock<HashMap<String, Vec<VarDie>>>,
    types: OnceLock<HashMap<String, Vec<(TypeRef, bool)>>>,
    /// The source files its line tables name (`DwarfFile::line_files`).
    pub(super) files: OnceLock<Vec<std::sync::Arc<str>>>,
    /// The files named closest to a file it does not name, by the file
    /// asked for (a pending breakpoint's file is asked for again at each
    /// library loaded).
    pub(super) closest: std::sync::Mutex<HashMap<String, Vec<String>>>,
    /// Line rows and functions by address, for stepping (`step.rs`).
    pub(super) code: OnceLock<super::codeindex::CodeIndex>,
}

const SECTIONS: [gimli::SectionId; 12] = [
    gimli::SectionId::DebugAbbrev,
    gimli::SectionId::DebugAddr,
    gimli::SectionId::DebugInfo,
    gimli::SectionId::DebugLine,
    gimli::SectionId::DebugLineStr,
    gimli::SectionId::DebugLoc,
    gimli::SectionId::DebugLocLists,
    gimli::SectionId::DebugRanges,
    gimli::SectionId::DebugRngLists,
    gimli::SectionId::DebugStr,
    gimli::SectionId::DebugStrOffsets,
    gimli::SectionId::DebugTypes,
];

/// What a type is, as far as watching it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// A scalar: integer, float, enum, bool.
    Scalar,
    /// A pointer (`T *`): watched as the pointer itself; `->`, `*` and
    /// `[i]` follow it to the type DIE it points to.
    Pointer {
        /// The pointed-to type (None: `void *`).
        target: Option<usize>,
    },
    /// A struct, class or union.
    Record(Vec<Member>),
    /// An array: element type and the counts of the dimensions left.
    Array {
        /// Element DIE.
        elem: usize,
        /// Element count of each dimension (None: unknown, e.g. `x[]`).
        dims: Vec<Option<u64>>,
    },
    /// Anything else (a function type, void).
    Other,
}

/// A member of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Name (empty for an anonymous struct or union member).
    pub name: String,
    /// Byte offset in the record.
    pub offset: u64,
    /// Its type DIE.
    pub ty: Option<usize>,
    /// A bit field: it shares its bytes with its neighbours.
    pub bits: bool,
}

/// A type: its name, size and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeInfo {
    /// As a C programmer writes it: `int`, `struct stats`, `short[4]`.
    pub name: String,
    /// Size in bytes, when known.
    pub size: Option<u64>,
    /// Shape.
    pub shape: Shape,
}

impl DwarfFile {
    /// The DWARF of the file mapped at `map`, if it has some.
    pub fn new(map: Mmap) -> Option<DwarfFile> {
        let mut owned = HashMap::new();
        {
            let file = object::File::parse(&*map).ok()?;
            file.section_by_name(".debug_info")?;
            for id in SECTIONS {
                if let Some(Cow::Owned(v)) = section_bytes(&file, id.name()) {
                    owned.insert(id, v);
                }
            }
        }
        Some(DwarfFile {
            map,
            owned,
            index: OnceLock::new(),
            types: OnceLock::new(),
            files: OnceLock::new(),
            closest: Default::default(),
            code: OnceLock::new(),
        })
    }

    /// Bytes held: the decompressed sections and the index (the mapping is
    /// the page cache's).
    pub fn heap_bytes(&self) -> usize {
        let sections: usize = self.owned.values().map(Vec::len).sum();
        let index: usize = self.index.get().map_or(0, |i| {
            i.iter()
                .map(|(k, v)| k.len() + 24 + v.len() * std::mem::size_of::<VarDie>() + 48)
                .sum()
        });
        let types: usize = self.types.get().map_or(0, |t| {
            t.iter()
                .map(|(k, v)| k.len() + 24 + v.len() * 24 + 48)
                .sum()
        });
        let files: usize = self
            .files
            .get()
            .map_or(0, |f| f.iter().map(|n| n.len() + 32).sum());
        sections + index + types + files
    }

    /// The type named `name` (`struct conn`, `uint32_t`, `unsigned long`;
    /// in C++ a class without its keyword): a definition rather than a
    /// declaration where the module has one.
    pub fn type_named(&self, name: &str) -> Option<TypeRef> {
        let types = self.types();
        let key = canonical_type(name);
        let pick = |v: &Vec<(TypeRef, bool)>| {
            v.iter()
                .find(|(_, decl)| !decl)
                .or_else(|| v.first())
                .map(|(r, _)| *r)
        };
        if let Some(r) = types.get(&key).and_then(pick) {
            return Some(r);
        }
        if !key.contains(' ') {
            for kw in ["struct", "class", "union", "enum"] {
                if let Some(r) = types.get(&format!("{kw} {key}")).and_then(pick) {
                    return Some(r);
                }
            }
        }
        None
    }

    /// Up to three type names like `name`.
    pub fn closest_types(&self, name: &str) -> Vec<String> {
        let key = canonical_type(name);
        let bare = key
            .split_once(' ')
            .filter(|(k, _)| ["struct", "class", "union", "enum"].contains(k))
            .map_or(key.as_str(), |(_, n)| n);
        let mut scored: Vec<(f64, &String)> = self
            .types()
            .keys()
            .filter(|k| !k.starts_with("__") || bare.starts_with("__"))
            .filter_map(|k| {
                let kb = k
                    .split_once(' ')
                    .filter(|(kw, _)| ["struct", "class", "union", "enum"].contains(kw))
                    .map_or(k.as_str(), |(_, n)| n);
                let score = strsim::jaro_winkler(&key, k).max(strsim::jaro_winkler(bare, kb));
                let contains = bare.len() >= 3 && kb.contains(bare);
                (score >= 0.85 || contains)
                    .then_some((score.max(if contains { 0.85 } else { 0.0 }), k))
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        scored.into_iter().take(3).map(|(_, k)| k.clone()).collect()
    }

    fn types(&self) -> &HashMap<String, Vec<(TypeRef, bool)>> {
        self.types.get_or_init(|| {
            let t0 = std::time::Instant::now();
            let types = self
                .dwarf()
                .map(|d| build_type_index(&d).unwrap_or_default())
                .unwrap_or_default();
            tracing::debug!(names = types.len(), took = ?t0.elapsed(), "DWARF type index built");
            types
        })
    }

    pub(super) fn dwarf(&self) -> Option<gimli::Dwarf<R<'_>>> {
        let file = object::File::parse(&*self.map).ok()?;
        let endian = if file.is_little_endian() {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
        let load = |id: gimli::SectionId| -> Result<R<'_>, gimli::Error> {
            let data: &[u8] = match self.owned.get(&id) {
                Some(v) => v,
                None => file
                    .section_by_name(id.name())
                    .and_then(|s| s.data().ok())
                    .unwrap_or(&[]),
            };
            Ok(EndianSlice::new(data, endian))
        };
        gimli::Dwarf::load(load).ok()
    }

    /// The variables named `name` (`function::name` for a static inside a
    /// function, `ns::name` inside a namespace).
    pub fn variables(&self, name: &str) -> Vec<VarDie> {
        self.index().get(name).cloned().unwrap_or_default()
    }

    /// Every indexed name (for suggestions).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index().keys().map(String::as_str)
    }

    fn index(&self) -> &HashMap<String, Vec<VarDie>> {
        self.index.get_or_init(|| {
            let t0 = std::time::Instant::now();
            let index = self
                .dwarf()
                .map(|d| build_index(&d).unwrap_or_default())
                .unwrap_or_default();
            tracing::debug!(names = index.len(), took = ?t0.elapsed(), "DWARF variable index built");
            index
        })
    }
}

/// Section bytes: borrowed from the mapping, or decompressed.
pub fn section_bytes<'d>(file: &object::File<'d>, name: &str) -> Option<Cow<'d, [u8]>> {
    file.section_by_name(name)?.uncompressed_data().ok()
}
