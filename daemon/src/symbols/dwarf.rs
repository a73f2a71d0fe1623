//! Variables and their types from DWARF, read with `gimli`: an index of
//! every variable with a static location (by name, built once per file),
//! and the type walk that turns `name.member[3]` into an offset, a size and
//! a type name.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::OnceLock;

use gimli::{AttributeValue, EndianSlice, RunTimeEndian, UnitOffset};
use memmap2::Mmap;

/// A type DIE: its unit (offset in `.debug_info`) and its offset there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TypeRef {
    /// The unit's offset in `.debug_info`.
    pub unit: usize,
    /// The DIE's offset in the unit.
    pub die: usize,
}
use object::{Object, ObjectSection};

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

/// Why a path into a variable fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// `.member` of something that has none.
    #[error("{what} is {}, not a struct or union: it has no members{hint}", a(ty))]
    NotARecord {
        /// What was walked so far.
        what: String,
        /// Its type.
        ty: String,
        /// More on why (empty, or a hint).
        hint: &'static str,
    },
    /// No such member.
    #[error(
        "{ty} has no member {member:?}{} (members: {})",
        if closest.is_empty() { String::new() } else { format!("; closest: {}", closest.join(", ")) },
        members.join(", ")
    )]
    NoSuchMember {
        /// The record type.
        ty: String,
        /// Asked for.
        member: String,
        /// The closest names among its members.
        closest: Vec<String>,
        /// Those it has (the first 24).
        members: Vec<String>,
    },
    /// A type name the module's DWARF does not define.
    #[error(
        "no type named {name:?} in the module's debug information{}",
        if closest.is_empty() { String::new() } else { format!(" (closest: {})", closest.join(", ")) }
    )]
    UnknownType {
        /// As written.
        name: String,
        /// The closest type names.
        closest: Vec<String>,
    },
    /// A number where an object is meant.
    #[error(
        "{what} is a number, not an object: cast it to a pointer type and follow it \
         (((struct T *){what})->member, *(int *){what})"
    )]
    Number {
        /// The number.
        what: String,
    },
    /// `*` or `->` of a number.
    #[error(
        "{what} is a number, not a pointer: cast it to a pointer type first (*(int *){what}, \
         ((struct T *){what})->member)"
    )]
    NumberNotPointer {
        /// The number.
        what: String,
    },
    /// `&` of something that is not in memory.
    #[error("cannot take the address of {what}: it is a value, not an object in memory")]
    AddressOfValue {
        /// What `&` applied to.
        what: String,
    },
    /// A local whose value cannot be had in this frame.
    #[error("{what} cannot be read in this frame: {why}")]
    LocalUnavailable {
        /// The local.
        what: String,
        /// Why not.
        why: String,
    },
    /// A cast C does not allow, or that cannot be made here.
    #[error("cannot cast {what} to {to}: {why}")]
    BadCast {
        /// What was cast.
        what: String,
        /// To what.
        to: String,
        /// Why not.
        why: String,
    },
    /// `[i]` of something that is not an array.
    #[error("{what} is {}, not an array: it cannot be indexed{hint}", a(ty))]
    NotAnArray {
        /// What was walked so far.
        what: String,
        /// Its type.
        ty: String,
        /// More on why (empty, or a hint).
        hint: &'static str,
    },
    /// Past the end.
    #[error("index {index} is past the end of {what} ({count} elements)")]
    OutOfRange {
        /// What was walked so far.
        what: String,
        /// Asked for.
        index: u64,
        /// Elements.
        count: u64,
    },
    /// `->` or `*` of something that is not a pointer.
    #[error("{what} is {}, not a pointer: it cannot be followed", a(ty))]
    NotAPointer {
        /// What was walked so far.
        what: String,
        /// Its type.
        ty: String,
    },
    /// A null pointer on the way.
    #[error("{what} is a null pointer: there is no object to watch behind it yet")]
    NullPointer {
        /// The pointer.
        what: String,
    },
    /// A pointer whose value could not be read, or that points nowhere
    /// readable.
    #[error("cannot read {what} at {addr:#x} in the process: {why}")]
    Unreadable {
        /// The pointer.
        what: String,
        /// Where it was read.
        addr: u64,
        /// Why not.
        why: String,
    },
    /// `[i]` of a pointer to something without a size.
    #[error("{what} points to {ty}, which has no size: it cannot be indexed")]
    Unsized {
        /// The pointer.
        what: String,
        /// What it points to.
        ty: String,
    },
    /// The DWARF could not be read.
    #[error("the debug information is unreadable here: {0}")]
    Dwarf(String),
}

/// `a int` is `an int`.
fn a(ty: &str) -> String {
    let vowel = ty.starts_with(|c: char| "aeiouAEIOU".contains(c));
    format!("{} {ty}", if vowel { "an" } else { "a" })
}

impl PathError {
    /// No member `member` in record type `ty` of `members`: the closest
    /// of them named, and the first 24 listed.
    pub fn no_such_member(ty: String, member: &str, members: &[Member]) -> PathError {
        let names: Vec<String> = members
            .iter()
            .filter(|x| !x.name.is_empty())
            .map(|x| x.name.clone())
            .collect();
        let mut scored: Vec<(f64, &String)> = names
            .iter()
            .map(|n| (strsim::jaro_winkler(member, n), n))
            .filter(|(s, n)| *s >= 0.8 || (member.len() >= 3 && n.contains(member)))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let mut listed: Vec<String> = names.iter().take(24).cloned().collect();
        if names.len() > 24 {
            listed.push(format!("and {} more", names.len() - 24));
        }
        PathError::NoSuchMember {
            ty,
            member: member.to_string(),
            closest: scored.into_iter().take(3).map(|(_, n)| n.clone()).collect(),
            members: listed,
        }
    }
}

impl From<gimli::Error> for PathError {
    fn from(e: gimli::Error) -> Self {
        PathError::Dwarf(e.to_string())
    }
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

/// Elements of an array of dimensions `dims` (an unknown bound counts 0),
/// or None when the product overflows (debug information that is damaged
/// or forged: a target's DWARF is its own choice).
pub(super) fn count_of(dims: &[Option<u64>]) -> Option<u64> {
    dims.iter()
        .try_fold(1u64, |n, d| n.checked_mul(d.unwrap_or(0)))
}

/// The byte offset of element `i` of an array whose further dimensions are
/// `inner` and whose elements are `elem_size` bytes, or None on overflow.
pub(super) fn element_offset(i: u64, inner: &[Option<u64>], elem_size: u64) -> Option<u64> {
    i.checked_mul(count_of(inner)?)?.checked_mul(elem_size)
}

/// The error for an offset past 64 bits.
pub(super) fn overflow(what: &str, step: u64) -> PathError {
    PathError::Dwarf(format!(
        "the offset of {what} (+{step}) does not fit in 64 bits: the debug information is \
         damaged, or the index is far past any object"
    ))
}

pub(super) fn type_ref(e: &gimli::DebuggingInformationEntry<R<'_>>) -> Option<usize> {
    match e.attr_value(gimli::DW_AT_type) {
        Some(AttributeValue::UnitRef(o)) => Some(o.0),
        _ => None,
    }
}

pub(super) fn name_of(
    dwarf: &gimli::Dwarf<R<'_>>,
    unit: &gimli::Unit<R<'_>>,
    e: &gimli::DebuggingInformationEntry<R<'_>>,
) -> Option<String> {
    let v = e.attr_value(gimli::DW_AT_name)?;
    let s = dwarf.attr_string(unit, v).ok()?;
    Some(s.to_string_lossy().into_owned())
}

pub(super) fn find_member(
    dwarf: &gimli::Dwarf<R<'_>>,
    unit: &gimli::Unit<R<'_>>,
    members: &[Member],
    name: &str,
) -> Result<Option<(u64, Option<usize>)>, PathError> {
    if let Some(m) = members.iter().find(|m| m.name == name) {
        return Ok(Some((m.offset, m.ty)));
    }
    // Members of anonymous structs and unions are members of the record.
    for m in members.iter().filter(|m| m.name.is_empty()) {
        if let Shape::Record(inner) = type_info(dwarf, unit, m.ty)?.shape
            && let Some((off, ty)) = find_member(dwarf, unit, &inner, name)?
        {
            return Ok(Some((m.offset + off, ty)));
        }
    }
    Ok(None)
}

pub(super) fn describe_array(
    dwarf: &gimli::Dwarf<R<'_>>,
    unit: &gimli::Unit<R<'_>>,
    elem: usize,
    dims: &[Option<u64>],
) -> Result<String, PathError> {
    let e = type_info(dwarf, unit, Some(elem))?;
    let mut s = e.name;
    for d in dims {
        match d {
            Some(n) => s.push_str(&format!("[{n}]")),
            None => s.push_str("[]"),
        }
    }
    Ok(s)
}

/// The type at `off` (None: `void`), typedefs and qualifiers seen through
/// for the shape and size, kept in the name.
pub fn type_info(
    dwarf: &gimli::Dwarf<R<'_>>,
    unit: &gimli::Unit<R<'_>>,
    off: Option<usize>,
) -> Result<TypeInfo, PathError> {
    let mut name: Option<String> = None;
    let mut quals: Vec<&str> = Vec::new();
    let mut cur = off;
    for _ in 0..64 {
        let Some(o) = cur else {
            return Ok(TypeInfo {
                name: name.unwrap_or_else(|| "void".into()),
                size: None,
                shape: Shape::Other,
            });
        };
        let e = unit.entry(UnitOffset(o))?;
        let size = e
            .attr_value(gimli::DW_AT_byte_size)
            .and_then(|v| v.udata_value());
        let own = name_of(dwarf, unit, &e);
        let tag = e.tag();
        let named = |base: String| -> String {
            let n = name.clone().unwrap_or(base);
            if quals.is_empty() {
                n
            } else {
                format!("{} {n}", quals.join(" "))
            }
        };
        match tag {
            gimli::DW_TAG_typedef => {
                if name.is_none() {
                    name = own;
                }
                cur = type_ref(&e);
            }
            gimli::DW_TAG_const_type | gimli::DW_TAG_volatile_type | gimli::DW_TAG_atomic_type => {
                if name.is_none() {
                    quals.push(match tag {
                        gimli::DW_TAG_const_type => "const",
                        gimli::DW_TAG_volatile_type => "volatile",
                        _ => "_Atomic",
                    });
                }
                cur = type_ref(&e);
            }
            gimli::DW_TAG_restrict_type => cur = type_ref(&e),
            gimli::DW_TAG_base_type | gimli::DW_TAG_enumeration_type => {
                let base = match (tag, own) {
                    (gimli::DW_TAG_enumeration_type, Some(n)) => format!("enum {n}"),
                    (gimli::DW_TAG_enumeration_type, None) => "enum".into(),
                    (_, n) => n.unwrap_or_else(|| "?".into()),
                };
                return Ok(TypeInfo {
                    name: named(base),
                    size,
                    shape: Shape::Scalar,
                });
            }
            gimli::DW_TAG_pointer_type | gimli::DW_TAG_reference_type => {
                let target = type_info(dwarf, unit, type_ref(&e))
                    .map(|t| t.name)
                    .unwrap_or_else(|_| "?".into());
                return Ok(TypeInfo {
                    name: named(format!("{target} *")),
                    size: size.or(Some(unit.encoding().address_size.into())),
                    shape: Shape::Pointer {
                        target: type_ref(&e),
                    },
                });
            }
            gimli::DW_TAG_structure_type | gimli::DW_TAG_class_type | gimli::DW_TAG_union_type => {
                let kw = match tag {
                    gimli::DW_TAG_union_type => "union",
                    gimli::DW_TAG_class_type => "class",
                    _ => "struct",
                };
                let base = match own {
                    Some(n) => format!("{kw} {n}"),
                    None => format!("{kw} <anonymous>"),
                };
                let mut members = Vec::new();
                let mut tree = unit.entries_tree(Some(UnitOffset(o)))?;
                let root = tree.root()?;
                let mut children = root.children();
                while let Some(child) = children.next()? {
                    let c = child.entry();
                    if c.tag() != gimli::DW_TAG_member {
                        continue;
                    }
                    let offset = match c.attr_value(gimli::DW_AT_data_member_location) {
                        Some(AttributeValue::Exprloc(expr)) => {
                            let mut ops = expr.operations(unit.encoding());
                            match ops.next() {
                                Ok(Some(gimli::Operation::PlusConstant { value })) => value,
                                _ => 0,
                            }
                        }
                        Some(v) => v.udata_value().unwrap_or(0),
                        None => 0, // a union's members
                    };
                    members.push(Member {
                        name: name_of(dwarf, unit, c).unwrap_or_default(),
                        offset,
                        ty: type_ref(c),
                        bits: c.attr_value(gimli::DW_AT_bit_size).is_some(),
                    });
                }
                return Ok(TypeInfo {
                    name: named(base),
                    size,
                    shape: Shape::Record(members),
                });
            }
            gimli::DW_TAG_array_type => {
                let elem = type_ref(&e)
                    .ok_or_else(|| PathError::Dwarf("array without element type".into()))?;
                let mut dims = Vec::new();
                let mut tree = unit.entries_tree(Some(UnitOffset(o)))?;
                let root = tree.root()?;
                let mut children = root.children();
                while let Some(child) = children.next()? {
                    let c = child.entry();
                    if c.tag() != gimli::DW_TAG_subrange_type {
                        continue;
                    }
                    let count = c
                        .attr_value(gimli::DW_AT_count)
                        .and_then(|v| v.udata_value())
                        .or_else(|| {
                            c.attr_value(gimli::DW_AT_upper_bound)
                                .and_then(|v| v.udata_value())
                                .map(|u| u + 1)
                        });
                    dims.push(count);
                }
                if dims.is_empty() {
                    dims.push(None);
                }
                let e_info = type_info(dwarf, unit, Some(elem))?;
                let n: Option<u64> = dims.iter().try_fold(1u64, |a, d| d.map(|d| a * d));
                let mut s = e_info.name.clone();
                for d in &dims {
                    match d {
                        Some(n) => s.push_str(&format!("[{n}]")),
                        None => s.push_str("[]"),
                    }
                }
                return Ok(TypeInfo {
                    name: named(s),
                    size: size.or_else(|| Some(e_info.size? * n?)),
                    shape: Shape::Array { elem, dims },
                });
            }
            gimli::DW_TAG_subroutine_type => {
                return Ok(TypeInfo {
                    name: named("function".into()),
                    size: None,
                    shape: Shape::Other,
                });
            }
            _ => {
                return Ok(TypeInfo {
                    name: named(own.unwrap_or_else(|| format!("{tag}"))),
                    size,
                    shape: Shape::Other,
                });
            }
        }
    }
    Err(PathError::Dwarf("type chain too long".into()))
}

/// Where a `DW_AT_location` puts a variable, if statically.
fn location(
    dwarf: &gimli::Dwarf<R<'_>>,
    unit: &gimli::Unit<R<'_>>,
    e: &gimli::DebuggingInformationEntry<R<'_>>,
) -> Option<VarLoc> {
    let AttributeValue::Exprloc(expr) = e.attr_value(gimli::DW_AT_location)? else {
        return None;
    };
    let mut ops = expr.operations(unit.encoding());
    let mut addr = None;
    while let Ok(Some(op)) = ops.next() {
        match op {
            gimli::Operation::Address { address } => addr = Some(address),
            gimli::Operation::AddressIndex { index } => addr = dwarf.address(unit, index).ok(),
            gimli::Operation::TLS => return Some(VarLoc::Tls),
            gimli::Operation::UnsignedConstant { .. } | gimli::Operation::SignedConstant { .. } => {
            }
            // Registers, the frame base, pieces: not a static location.
            _ => return None,
        }
    }
    addr.map(VarLoc::Addr)
}

fn build_index(dwarf: &gimli::Dwarf<R<'_>>) -> Result<HashMap<String, Vec<VarDie>>, gimli::Error> {
    let mut index: HashMap<String, Vec<VarDie>> = HashMap::new();
    let mut units = dwarf.units();
    while let Some(header) = units.next()? {
        let Some(unit_off) = header.debug_info_offset() else {
            continue;
        };
        let unit = dwarf.unit(header)?;
        let mut entries = unit.entries();
        // Names of the enclosing namespaces and functions, by depth (and
        // whether it is a function).
        let mut scope: Vec<(isize, String, bool)> = Vec::new();
        while let Some(e) = entries.next_dfs()? {
            let depth = e.depth();
            while scope.last().is_some_and(|(d, _, _)| *d >= depth) {
                scope.pop();
            }
            match e.tag() {
                gimli::DW_TAG_namespace | gimli::DW_TAG_subprogram => {
                    let n = name_of(dwarf, &unit, e).or_else(|| {
                        // A definition out of line names its declaration.
                        match e.attr_value(gimli::DW_AT_specification) {
                            Some(AttributeValue::UnitRef(o)) => {
                                unit.entry(o).ok().and_then(|d| name_of(dwarf, &unit, &d))
                            }
                            _ => None,
                        }
                    });
                    scope.push((
                        depth,
                        n.unwrap_or_default(),
                        e.tag() == gimli::DW_TAG_subprogram,
                    ));
                }
                gimli::DW_TAG_variable => {
                    let loc = match location(dwarf, &unit, e) {
                        Some(loc) => loc,
                        // A definition outside any function with no
                        // location at all: the compiler left it out.
                        None if e.attr_value(gimli::DW_AT_location).is_none()
                            && e.attr_value(gimli::DW_AT_declaration).is_none()
                            && !scope.iter().any(|(_, _, f)| *f) =>
                        {
                            VarLoc::OptimizedOut
                        }
                        None => continue,
                    };
                    let spec = match e.attr_value(gimli::DW_AT_specification) {
                        Some(AttributeValue::UnitRef(o)) => unit.entry(o).ok(),
                        _ => None,
                    };
                    let name = name_of(dwarf, &unit, e)
                        .or_else(|| spec.as_ref().and_then(|d| name_of(dwarf, &unit, d)));
                    let Some(name) = name else { continue };
                    let die = if type_ref(e).is_some() {
                        e.offset().0
                    } else {
                        spec.as_ref().map_or(e.offset().0, |d| d.offset().0)
                    };
                    let external = matches!(
                        e.attr_value(gimli::DW_AT_external),
                        Some(AttributeValue::Flag(true))
                    ) || spec.as_ref().is_some_and(|d| {
                        matches!(
                            d.attr_value(gimli::DW_AT_external),
                            Some(AttributeValue::Flag(true))
                        )
                    });
                    let mut key = String::new();
                    for (_, s, _) in &scope {
                        if !s.is_empty() {
                            key.push_str(s);
                            key.push_str("::");
                        }
                    }
                    key.push_str(&name);
                    index.entry(key).or_default().push(VarDie {
                        unit: unit_off.0,
                        die,
                        loc,
                        external,
                    });
                }
                _ => {}
            }
        }
    }
    for v in index.values_mut() {
        // One variable described in several units (a declaration with a
        // location is rare, but duplicates by address are one variable).
        v.sort_by_key(|d| match d.loc {
            VarLoc::Addr(a) => a,
            VarLoc::Tls | VarLoc::OptimizedOut => 0,
        });
        v.dedup_by_key(|d| d.loc);
        // A variable left out in one unit and defined in another is the
        // defined one.
        if v.iter().any(|d| d.loc != VarLoc::OptimizedOut) {
            v.retain(|d| d.loc != VarLoc::OptimizedOut);
        }
    }
    Ok(index)
}

/// A type name as the index keys it: the words of a C base type in one
/// order (`long unsigned int` and `unsigned long` are `unsigned long`),
/// anything else as written with single spaces.
pub fn canonical_type(name: &str) -> String {
    let words: Vec<&str> = name.split_whitespace().collect();
    let base = [
        "unsigned", "signed", "long", "short", "int", "char", "float", "double", "_Bool", "bool",
    ];
    if words.is_empty() || !words.iter().all(|w| base.contains(w)) {
        return words.join(" ");
    }
    let has = |w: &str| words.contains(&w);
    let longs = words.iter().filter(|w| **w == "long").count();
    let sign = if has("unsigned") { "unsigned " } else { "" };
    if has("_Bool") || has("bool") {
        return "_Bool".into();
    }
    if has("char") {
        return match (has("unsigned"), has("signed")) {
            (true, _) => "unsigned char",
            (_, true) => "signed char",
            _ => "char",
        }
        .into();
    }
    if has("float") {
        return "float".into();
    }
    if has("double") {
        return if longs > 0 { "long double" } else { "double" }.into();
    }
    let size = if has("short") {
        "short"
    } else if longs >= 2 {
        "long long"
    } else if longs == 1 {
        "long"
    } else {
        "int"
    };
    format!("{sign}{size}")
}

/// Every named type of the module: structs, unions, enums and classes
/// (`struct NAME`), typedefs and base types, with namespaces (`ns::T`);
/// each DIE with whether it is only a declaration.
fn build_type_index(
    dwarf: &gimli::Dwarf<R<'_>>,
) -> Result<HashMap<String, Vec<(TypeRef, bool)>>, gimli::Error> {
    let mut index: HashMap<String, Vec<(TypeRef, bool)>> = HashMap::new();
    let mut units = dwarf.units();
    while let Some(header) = units.next()? {
        let Some(unit_off) = header.debug_info_offset() else {
            continue;
        };
        let unit = dwarf.unit(header)?;
        let mut entries = unit.entries();
        let mut scope: Vec<(isize, String)> = Vec::new();
        while let Some(e) = entries.next_dfs()? {
            let depth = e.depth();
            while scope.last().is_some_and(|(d, _)| *d >= depth) {
                scope.pop();
            }
            let tag = e.tag();
            let kw = match tag {
                gimli::DW_TAG_structure_type => Some("struct "),
                gimli::DW_TAG_union_type => Some("union "),
                gimli::DW_TAG_enumeration_type => Some("enum "),
                gimli::DW_TAG_class_type => Some("class "),
                gimli::DW_TAG_typedef | gimli::DW_TAG_base_type => Some(""),
                _ => None,
            };
            let name = name_of(dwarf, &unit, e);
            if tag == gimli::DW_TAG_namespace {
                scope.push((depth, name.clone().unwrap_or_default()));
                continue;
            }
            let (Some(kw), Some(name)) = (kw, name) else {
                continue;
            };
            let mut key = String::from(kw);
            for (_, s) in &scope {
                if !s.is_empty() {
                    key.push_str(s);
                    key.push_str("::");
                }
            }
            if tag == gimli::DW_TAG_base_type {
                key.push_str(&canonical_type(&name));
            } else {
                key.push_str(&name);
            }
            let decl = e.attr_value(gimli::DW_AT_declaration).is_some();
            let v = index.entry(key).or_default();
            if v.len() < 4 {
                v.push((
                    TypeRef {
                        unit: unit_off.0,
                        die: e.offset().0,
                    },
                    decl,
                ));
            }
        }
    }
    Ok(index)
}

/// Section bytes: borrowed from the mapping, or decompressed.
pub fn section_bytes<'d>(file: &object::File<'d>, name: &str) -> Option<Cow<'d, [u8]>> {
    file.section_by_name(name)?.uncompressed_data().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_type_names_have_one_spelling() {
        for (a, b) in [
            ("long unsigned int", "unsigned long"),
            ("unsigned long", "unsigned long"),
            ("unsigned", "unsigned int"),
            ("unsigned int", "unsigned int"),
            ("int", "int"),
            ("signed", "int"),
            ("short int", "short"),
            ("short unsigned int", "unsigned short"),
            ("long long int", "long long"),
            ("long long unsigned int", "unsigned long long"),
            ("char", "char"),
            ("signed char", "signed char"),
            ("unsigned char", "unsigned char"),
            ("long double", "long double"),
            ("bool", "_Bool"),
            ("uint32_t", "uint32_t"),
            ("struct  conn", "struct conn"),
        ] {
            assert_eq!(canonical_type(a), b, "{a}");
        }
    }

    #[test]
    fn array_arithmetic_never_overflows() {
        assert_eq!(element_offset(3, &[Some(4)], 8), Some(96));
        assert_eq!(element_offset(u64::MAX, &[], 8), None);
        assert_eq!(element_offset(1 << 40, &[Some(1 << 20)], 1 << 10), None);
        assert_eq!(count_of(&[Some(u64::MAX), Some(2)]), None);
        assert_eq!(count_of(&[Some(3), None]), Some(0));
        assert_eq!(count_of(&[]), Some(1));
    }
}
