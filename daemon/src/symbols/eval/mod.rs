//! Evaluation of an expression ([`super::expr::Node`]) over one module's
//! DWARF types: what it designates (an object in memory: its place and
//! type) or what it computes (a value: `&x`, a cast `(T)x`), pointers read
//! from the process as they are followed.
//!
//! Types are DWARF DIEs of any unit of the module ([`TypeRef`]), plus the
//! ones an expression makes without a DIE of their own ([`Ty`]): a pointer
//! to a type (`&x`, `(T *)`) and what is left of an array after an index
//! (`m[1]` of `int m[3][4]`).
//!
//! Rooms: `ops.rs` (the operators: `*`, `->`, `.`, `[]`, casts),
//! `scalar.rs` (how scalars read and convert). This file holds the types,
//! places and values the evaluation works with, and what it says of a type
//! (its value type, its children, the member at an offset).

mod ops;
mod scalar;

use std::collections::HashMap;

use gimli::UnitOffset;

use super::dwarf::{
    DwarfFile, Member, PathError, R, Shape, TypeRef, count_of, describe_array, type_info,
};
use super::expr::{Node, TypeName};
use scalar::{Enc, encoding, enumerators};

/// A type, as the evaluation knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ty {
    /// `void`, or a type DWARF does not give.
    Void,
    /// A DIE.
    Die(TypeRef),
    /// A pointer to a type (made by `&` or a cast).
    Ptr(Box<Ty>),
    /// The rest of an array after some of its indices.
    Sub {
        /// Element DIE.
        elem: TypeRef,
        /// The dimensions left.
        dims: Vec<Option<u64>>,
    },
}

/// Where an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// At this link-time address of the module (a variable, its members
    /// and elements).
    InModule(u64),
    /// At this runtime address (past a pointer, or an address given).
    At(u64),
}

/// Reads `len` bytes of the process at a runtime address.
pub type ReadMemory<'a> = &'a mut dyn FnMut(u64, usize) -> Result<Vec<u8>, String>;

/// What an expression is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An object in memory.
    Object {
        /// Where.
        at: Place,
        /// Its type.
        ty: Ty,
        /// Its type's name.
        type_name: String,
        /// Its size, when known.
        size: Option<u64>,
    },
    /// A value computed, not in memory.
    Value {
        /// Its bytes, as the target would hold them.
        bytes: Vec<u8>,
        /// Its type's name.
        type_name: String,
        /// For a pointer: the address it holds.
        pointer: Option<u64>,
        /// How it reads.
        value_type: Option<crate::value::ValueType>,
    },
}

/// What an object has under it, as a variables view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Children {
    /// A record's members, by name (an anonymous member's own members in
    /// its place, as C names them).
    Members(Vec<String>),
    /// An array's elements (`[i]`), this many.
    Elements(u64),
    /// A pointer's target (`*p`).
    Pointee,
}

/// What a type is, for the operators.
enum Kind {
    Scalar(Enc),
    Pointer(Ty),
    Record(Vec<Member>, usize),
    Array(TypeRef, Vec<Option<u64>>),
    Other,
}

struct View {
    name: String,
    size: Option<u64>,
    kind: Kind,
}

#[derive(Clone)]
enum Val {
    Obj {
        at: Place,
        ty: Ty,
    },
    Value {
        bytes: Vec<u8>,
        ty: Ty,
        /// Where the address came from, for `&x`: `*&x` is `x` again.
        addr_of: Option<Place>,
    },
    Num(u64),
}

const POINTER_SIZE: u64 = 8;

/// An evaluation in one module.
pub struct Eval<'a> {
    file: &'a DwarfFile,
    dwarf: gimli::Dwarf<R<'a>>,
    units: HashMap<usize, gimli::Unit<R<'a>>>,
    bias: u64,
    read: ReadMemory<'a>,
    /// The value of the expression's variable.
    root: Option<Val>,
}

fn le(v: u64, size: u64) -> Vec<u8> {
    v.to_le_bytes()[..size.clamp(1, 8) as usize].to_vec()
}

fn from_le(b: &[u8]) -> u64 {
    let mut v = [0u8; 8];
    let n = b.len().min(8);
    v[..n].copy_from_slice(&b[..n]);
    u64::from_le_bytes(v)
}

impl<'a> Eval<'a> {
    /// An evaluation in `file`, loaded with `bias`, reading the process
    /// with `read`.
    pub fn new(file: &'a DwarfFile, bias: u64, read: ReadMemory<'a>) -> Result<Self, PathError> {
        let dwarf = file
            .dwarf()
            .ok_or_else(|| PathError::Dwarf("no DWARF".into()))?;
        Ok(Eval {
            file,
            dwarf,
            units: HashMap::new(),
            bias,
            read,
            root: None,
        })
    }

    /// The expression's variable: the DIE `v` (holding its type) at
    /// link-time address `addr`.
    pub fn with_variable(mut self, unit: usize, die: usize, addr: u64) -> Result<Self, PathError> {
        let ty = {
            let u = self.unit(unit)?;
            let e = u.entry(UnitOffset(die))?;
            super::dwarf::type_ref(&e)
        };
        let ty = match ty {
            Some(d) => Ty::Die(TypeRef { unit, die: d }),
            None => Ty::Void,
        };
        self.root = Some(Val::Obj {
            at: Place::InModule(addr),
            ty,
        });
        Ok(self)
    }

    /// The expression's variable: a local of type `ty`, in memory at
    /// runtime address `at`, else held (in registers) as `bytes`.
    pub fn with_local(mut self, ty: Option<TypeRef>, at: Option<u64>, bytes: Vec<u8>) -> Self {
        let ty = ty.map_or(Ty::Void, Ty::Die);
        self.root = Some(match at {
            Some(a) => Val::Obj {
                at: Place::At(a),
                ty,
            },
            None => Val::Value {
                bytes,
                ty,
                addr_of: None,
            },
        });
        self
    }

    fn unit(&mut self, off: usize) -> Result<&gimli::Unit<R<'a>>, PathError> {
        if !self.units.contains_key(&off) {
            let header = self
                .dwarf
                .debug_info
                .header_from_offset(gimli::DebugInfoOffset(off))?;
            let unit = self.dwarf.unit(header)?;
            self.units.insert(off, unit);
        }
        Ok(&self.units[&off])
    }

    fn runtime(&self, p: Place) -> u64 {
        match p {
            Place::InModule(a) => a.wrapping_add(self.bias),
            Place::At(a) => a,
        }
    }

    fn view(&mut self, ty: &Ty) -> Result<View, PathError> {
        match ty {
            Ty::Void => Ok(View {
                name: "void".into(),
                size: None,
                kind: Kind::Other,
            }),
            Ty::Ptr(t) => {
                let mut name = self.view(t)?.name;
                if !name.ends_with('*') {
                    name.push(' ');
                }
                name.push('*');
                Ok(View {
                    name,
                    size: Some(POINTER_SIZE),
                    kind: Kind::Pointer((**t).clone()),
                })
            }
            Ty::Sub { elem, dims } => {
                let (unit, elem) = (elem.unit, *elem);
                self.unit(unit)?;
                let dwarf = &self.dwarf;
                let u = &self.units[&unit];
                let e = type_info(dwarf, u, Some(elem.die))?;
                Ok(View {
                    name: describe_array(dwarf, u, elem.die, dims)?,
                    size: e
                        .size
                        .zip(count_of(dims))
                        .and_then(|(s, n)| s.checked_mul(n)),
                    kind: Kind::Array(elem, dims.clone()),
                })
            }
            Ty::Die(r) => {
                let r = *r;
                self.unit(r.unit)?;
                let u = &self.units[&r.unit];
                let info = type_info(&self.dwarf, u, Some(r.die))?;
                let at = |d: Option<usize>| match d {
                    Some(die) => Ty::Die(TypeRef { unit: r.unit, die }),
                    None => Ty::Void,
                };
                let kind = match info.shape {
                    Shape::Scalar => Kind::Scalar(encoding(u, r.die)),
                    Shape::Pointer { target } => Kind::Pointer(at(target)),
                    Shape::Record(m) => Kind::Record(m, r.unit),
                    Shape::Array { elem, dims } => Kind::Array(
                        TypeRef {
                            unit: r.unit,
                            die: elem,
                        },
                        dims,
                    ),
                    Shape::Other => Kind::Other,
                };
                Ok(View {
                    name: info.name,
                    size: info.size,
                    kind,
                })
            }
        }
    }

    /// How a value of type `ty` reads: its kind, size and name, and an
    /// enumeration's enumerators.
    pub fn value_type(&mut self, ty: &Ty) -> Result<crate::value::ValueType, PathError> {
        use crate::value::Kind as K;
        let v = self.view(ty)?;
        let kind = match v.kind {
            Kind::Scalar(Enc::Signed) => K::Signed,
            Kind::Scalar(Enc::Unsigned) => K::Unsigned,
            Kind::Scalar(Enc::Float) => K::Float,
            Kind::Scalar(Enc::Bool) => K::Bool,
            Kind::Pointer(_) => K::Pointer,
            Kind::Record(..) | Kind::Array(..) | Kind::Other => K::Other,
        };
        let enumerators = match (ty, kind) {
            (Ty::Die(r), K::Signed | K::Unsigned) => {
                let u = &self.units[&r.unit];
                enumerators(&self.dwarf, u, r.die, kind == K::Signed)
            }
            _ => None,
        };
        Ok(crate::value::ValueType {
            kind,
            size: v.size.unwrap_or(0),
            name: v.name,
            enumerators,
        })
    }

    /// The type a cast names, from the module's DWARF.
    fn named_type(&mut self, t: &TypeName) -> Result<Ty, PathError> {
        let mut ty = if t.base == "void" {
            Ty::Void
        } else {
            match self.file.type_named(&t.base) {
                Some(r) => Ty::Die(r),
                None => {
                    return Err(PathError::UnknownType {
                        name: t.base.clone(),
                        closest: self.file.closest_types(&t.base),
                    });
                }
            }
        };
        for _ in 0..t.stars {
            ty = Ty::Ptr(Box::new(ty));
        }
        Ok(ty)
    }

    /// Evaluates `node`.
    pub fn outcome(&mut self, node: &Node) -> Result<Outcome, PathError> {
        match self.eval(node)? {
            Val::Obj { at, ty } => {
                let v = self.view(&ty)?;
                Ok(Outcome::Object {
                    at,
                    ty,
                    type_name: v.name,
                    size: v.size,
                })
            }
            Val::Value { bytes, ty, .. } => {
                let v = self.view(&ty)?;
                let pointer = matches!(v.kind, Kind::Pointer(_)).then(|| from_le(&bytes));
                Ok(Outcome::Value {
                    bytes,
                    type_name: v.name,
                    pointer,
                    value_type: self.value_type(&ty).ok(),
                })
            }
            Val::Num(_) => Err(PathError::Number {
                what: node.to_string(),
            }),
        }
    }

    fn eval(&mut self, node: &Node) -> Result<Val, PathError> {
        match node {
            Node::Name(_) => self
                .root
                .clone()
                .ok_or_else(|| PathError::Dwarf("no variable to start from".into())),
            Node::Number(n) => Ok(Val::Num(*n)),
            Node::Member(e, m) => {
                let v = self.eval(e)?;
                self.member(e, v, m, false)
            }
            Node::Arrow(e, m) => {
                let v = self.eval(e)?;
                let v = self.deref(e, v)?;
                self.member(e, v, m, true)
            }
            Node::Deref(e) => {
                let v = self.eval(e)?;
                self.deref(e, v)
            }
            Node::Index(e, i) => {
                let v = self.eval(e)?;
                self.index(e, v, *i)
            }
            Node::AddrOf(e) => match self.eval(e)? {
                Val::Obj { at, ty } => Ok(Val::Value {
                    bytes: le(self.runtime(at), POINTER_SIZE),
                    ty: Ty::Ptr(Box::new(ty)),
                    addr_of: Some(at),
                }),
                _ => Err(PathError::AddressOfValue {
                    what: e.to_string(),
                }),
            },
            Node::Cast(t, e) => {
                let to = self.named_type(t)?;
                let v = self.eval(e)?;
                self.cast(e, v, to)
            }
        }
    }

    /// What an object of type `ty` has under it: `None` for a scalar, an
    /// untyped pointer or a pointer to a function.
    pub fn children(&mut self, ty: &Ty) -> Result<Option<Children>, PathError> {
        let view = self.view(ty)?;
        Ok(match view.kind {
            Kind::Record(members, unit) => {
                let mut names = Vec::new();
                self.member_names(&members, unit, &mut names, 0)?;
                Some(Children::Members(names))
            }
            Kind::Array(_, dims) => dims.first().copied().flatten().map(Children::Elements),
            Kind::Pointer(t) => match self.view(&t)?.kind {
                Kind::Other => None,
                _ => Some(Children::Pointee),
            },
            Kind::Scalar(_) | Kind::Other => None,
        })
    }

    /// The names of `members`, an anonymous member's members in its place
    /// (up to 8 levels deep).
    fn member_names(
        &mut self,
        members: &[Member],
        unit: usize,
        out: &mut Vec<String>,
        depth: u32,
    ) -> Result<(), PathError> {
        for m in members {
            if !m.name.is_empty() {
                out.push(m.name.clone());
            } else if let (Some(die), true) = (m.ty, depth < 8)
                && let Kind::Record(inner, u) = self.view(&Ty::Die(TypeRef { unit, die }))?.kind
            {
                self.member_names(&inner, u, out, depth + 1)?;
            }
        }
        Ok(())
    }

    /// The innermost member of an object of type `ty` holding byte `at` of
    /// it: its offset in the object, size, path (`.flags[0]`) and type
    /// name (for `name+off`).
    pub fn member_at(
        &mut self,
        ty: &Ty,
        at: u64,
    ) -> Result<Option<(u64, u64, String, String)>, PathError> {
        let mut view = self.view(ty)?;
        let mut base = 0u64;
        let mut name = String::new();
        loop {
            match &view.kind {
                Kind::Record(members, unit) => {
                    let unit = *unit;
                    let mut inner = None;
                    for m in members.iter().filter(|m| m.offset <= at - base) {
                        let t = match m.ty {
                            Some(die) => Ty::Die(TypeRef { unit, die }),
                            None => continue,
                        };
                        let v = self.view(&t)?;
                        let Some(size) = v.size else { continue };
                        if at - base < m.offset.saturating_add(size) {
                            inner = Some((m.clone(), v));
                            break;
                        }
                    }
                    let Some((m, v)) = inner else {
                        return Ok(None);
                    };
                    base += m.offset;
                    if !m.name.is_empty() {
                        name.push('.');
                        name.push_str(&m.name);
                    }
                    view = v;
                }
                Kind::Array(elem, dims) => {
                    let e = self.view(&Ty::Die(*elem))?;
                    let Some(es) = e.size.filter(|s| *s > 0) else {
                        return Ok(None);
                    };
                    let i = (at - base) / es;
                    if count_of(dims).is_none_or(|n| i >= n) {
                        return Ok(None);
                    }
                    base += i * es;
                    name.push_str(&format!("[{i}]"));
                    view = e;
                }
                _ => return Ok(view.size.map(|s| (base, s, name, view.name))),
            }
        }
    }
}
