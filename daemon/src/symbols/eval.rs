//! Evaluation of an expression ([`super::expr::Node`]) over one module's
//! DWARF types: what it designates (an object in memory: its place and
//! type) or what it computes (a value: `&x`, a cast `(T)x`), pointers read
//! from the process as they are followed.
//!
//! Types are DWARF DIEs of any unit of the module ([`TypeRef`]), plus the
//! ones an expression makes without a DIE of their own ([`Ty`]): a pointer
//! to a type (`&x`, `(T *)`) and what is left of an array after an index
//! (`m[1]` of `int m[3][4]`).

use std::collections::HashMap;

use gimli::UnitOffset;

use super::dwarf::{
    DwarfFile, Member, PathError, R, Shape, TypeRef, count_of, describe_array, element_offset,
    find_member, overflow, type_info,
};
use super::expr::{Node, TypeName};

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

/// How a scalar's bits are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Enc {
    Signed,
    Unsigned,
    Float,
    Bool,
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

    /// An array object as a pointer to its first element.
    fn decay(&mut self, v: Val) -> Result<Val, PathError> {
        let Val::Obj { at, ty } = &v else {
            return Ok(v);
        };
        let Kind::Array(elem, dims) = self.view(ty)?.kind else {
            return Ok(v);
        };
        let elem_ty = if dims.len() > 1 {
            Ty::Sub {
                elem,
                dims: dims[1..].to_vec(),
            }
        } else {
            Ty::Die(elem)
        };
        Ok(Val::Value {
            bytes: le(self.runtime(*at), POINTER_SIZE),
            ty: Ty::Ptr(Box::new(elem_ty)),
            addr_of: Some(*at),
        })
    }

    /// The pointer `v` (written `e`): its value, where it came from and
    /// the type it points to.
    fn pointer(&mut self, e: &Node, v: Val) -> Result<(u64, Option<Place>, Ty), PathError> {
        let v = self.decay(v)?;
        let what = e.to_string();
        // The pointer's value (or where it is stored), and where the
        // object it points to is known to be (`&x`).
        let (ty, value, pointee, stored) = match v {
            Val::Num(_) => return Err(PathError::NumberNotPointer { what }),
            Val::Value { bytes, ty, addr_of } => (ty, Some(from_le(&bytes)), addr_of, None),
            Val::Obj { at, ty } => (ty, None, None, Some(at)),
        };
        let view = self.view(&ty)?;
        let Kind::Pointer(target) = view.kind else {
            return Err(PathError::NotAPointer {
                what,
                ty: view.name,
            });
        };
        let p = match (value, stored) {
            (Some(p), _) => p,
            (None, stored) => {
                // The pointer is in memory: read it.
                let at = self.runtime(stored.expect("an object has a place"));
                let b = (self.read)(at, POINTER_SIZE as usize).map_err(|why| {
                    PathError::Unreadable {
                        what: what.clone(),
                        addr: at,
                        why,
                    }
                })?;
                from_le(&b)
            }
        };
        let from = pointee;
        if p == 0 {
            return Err(PathError::NullPointer { what });
        }
        Ok((p, from, target))
    }

    fn deref(&mut self, e: &Node, v: Val) -> Result<Val, PathError> {
        let (p, from, target) = self.pointer(e, v)?;
        Ok(Val::Obj {
            at: from.unwrap_or(Place::At(p)),
            ty: target,
        })
    }

    fn member(&mut self, e: &Node, v: Val, m: &str, arrow: bool) -> Result<Val, PathError> {
        let what = if arrow {
            format!("*{e}")
        } else {
            e.to_string()
        };
        let (at, ty) = match v {
            Val::Obj { at, ty } => (at, ty),
            Val::Value { ty, .. } => {
                let view = self.view(&ty)?;
                return Err(PathError::NotARecord {
                    what,
                    ty: view.name,
                    hint: if matches!(view.kind, Kind::Pointer(_)) {
                        " (a pointer: use '->')"
                    } else {
                        ""
                    },
                });
            }
            Val::Num(_) => {
                return Err(PathError::NotARecord {
                    what,
                    ty: "number".into(),
                    hint: " (cast it to a pointer type: ((struct T *)ADDR)->member)",
                });
            }
        };
        let view = self.view(&ty)?;
        let (members, unit) = match view.kind {
            Kind::Record(members, unit) => (members, unit),
            Kind::Pointer(_) if !arrow => {
                return Err(PathError::NotARecord {
                    what,
                    ty: view.name,
                    hint: " (a pointer: use '->')",
                });
            }
            _ => {
                return Err(PathError::NotARecord {
                    what,
                    ty: view.name,
                    hint: "",
                });
            }
        };
        self.unit(unit)?;
        let u = &self.units[&unit];
        let Some((off, mty)) = find_member(&self.dwarf, u, &members, m)? else {
            return Err(PathError::no_such_member(view.name, m, &members));
        };
        let at = match at {
            Place::InModule(a) => {
                Place::InModule(a.checked_add(off).ok_or_else(|| overflow(&what, off))?)
            }
            Place::At(a) => Place::At(a.checked_add(off).ok_or_else(|| overflow(&what, off))?),
        };
        Ok(Val::Obj {
            at,
            ty: match mty {
                Some(die) => Ty::Die(TypeRef { unit, die }),
                None => Ty::Void,
            },
        })
    }

    fn index(&mut self, e: &Node, v: Val, i: u64) -> Result<Val, PathError> {
        let what = e.to_string();
        if let Val::Obj { at, ty } = &v {
            let view = self.view(ty)?;
            if let Kind::Array(elem, dims) = view.kind {
                if let Some(c) = dims[0]
                    && i >= c
                {
                    return Err(PathError::OutOfRange {
                        what,
                        index: i,
                        count: c,
                    });
                }
                let elem_size = self.view(&Ty::Die(elem))?.size.unwrap_or(0);
                let off =
                    element_offset(i, &dims[1..], elem_size).ok_or_else(|| overflow(&what, i))?;
                let at = match *at {
                    Place::InModule(a) => {
                        Place::InModule(a.checked_add(off).ok_or_else(|| overflow(&what, i))?)
                    }
                    Place::At(a) => {
                        Place::At(a.checked_add(off).ok_or_else(|| overflow(&what, i))?)
                    }
                };
                let ty = if dims.len() > 1 {
                    Ty::Sub {
                        elem,
                        dims: dims[1..].to_vec(),
                    }
                } else {
                    Ty::Die(elem)
                };
                return Ok(Val::Obj { at, ty });
            }
            if !matches!(view.kind, Kind::Pointer(_)) {
                return Err(PathError::NotAnArray {
                    what,
                    ty: view.name,
                    hint: "",
                });
            }
        }
        if let Val::Value { ty, .. } = &v {
            let view = self.view(ty)?;
            if !matches!(view.kind, Kind::Pointer(_)) {
                return Err(PathError::NotAnArray {
                    what,
                    ty: view.name,
                    hint: "",
                });
            }
        }
        // `p[i]`: the element `i` from where `p` points.
        let (p, from, target) = self.pointer(e, v)?;
        let t = self.view(&target)?;
        let size = t
            .size
            .filter(|&s| s > 0)
            .ok_or_else(|| PathError::Unsized {
                what: what.clone(),
                ty: t.name.clone(),
            })?;
        let o = i.checked_mul(size).ok_or_else(|| overflow(&what, i))?;
        let at = match from {
            Some(Place::InModule(a)) => {
                Place::InModule(a.checked_add(o).ok_or_else(|| overflow(&what, i))?)
            }
            _ => Place::At(p.checked_add(o).ok_or_else(|| overflow(&what, i))?),
        };
        Ok(Val::Obj { at, ty: target })
    }

    fn cast(&mut self, e: &Node, v: Val, to: Ty) -> Result<Val, PathError> {
        let what = e.to_string();
        let target = self.view(&to)?;
        let (dst_enc, dst_size) = match &target.kind {
            Kind::Pointer(_) => (Enc::Unsigned, POINTER_SIZE),
            Kind::Scalar(enc) => (*enc, target.size.unwrap_or(0)),
            _ => {
                let why = format!(
                    "only scalar and pointer types can be cast to (to see {what} as a {0}, \
                     write *({0} *)&{what})",
                    target.name
                );
                return Err(PathError::BadCast {
                    what,
                    to: target.name.clone(),
                    why,
                });
            }
        };
        if dst_size == 0 || dst_size > 8 {
            return Err(PathError::BadCast {
                what,
                to: target.name,
                why: "its size is not 1 to 8 bytes".into(),
            });
        }
        let v = self.decay(v)?;
        let (bits, src_enc, src_size, addr_of) = match v {
            Val::Num(n) => (n, Enc::Unsigned, 8, None),
            Val::Value { bytes, ty, addr_of } => {
                let enc = match self.view(&ty)?.kind {
                    Kind::Scalar(e) => e,
                    _ => Enc::Unsigned,
                };
                (from_le(&bytes), enc, bytes.len() as u64, addr_of)
            }
            Val::Obj { at, ty } => {
                let view = self.view(&ty)?;
                let enc = match view.kind {
                    Kind::Scalar(e) => e,
                    Kind::Pointer(_) => Enc::Unsigned,
                    _ => {
                        return Err(PathError::BadCast {
                            what: what.clone(),
                            to: target.name.clone(),
                            why: format!(
                                "{what} is a {}, which converts to nothing (write *({} *)&{what} \
                                 to see its bytes as that type)",
                                view.name, target.name
                            ),
                        });
                    }
                };
                let size = view.size.filter(|s| (1..=8).contains(s)).ok_or_else(|| {
                    PathError::BadCast {
                        what: what.clone(),
                        to: target.name.clone(),
                        why: format!("{what} ({}) has no size of 1 to 8 bytes", view.name),
                    }
                })?;
                let addr = self.runtime(at);
                let b = (self.read)(addr, size as usize).map_err(|why| PathError::Unreadable {
                    what: what.clone(),
                    addr,
                    why,
                })?;
                (from_le(&b), enc, size, None)
            }
        };
        let bits = convert(bits, src_enc, src_size, dst_enc, dst_size);
        Ok(Val::Value {
            bytes: le(bits, dst_size),
            ty: to,
            // A pointer keeps where its address came from (`*(char *)&x`).
            addr_of: if matches!(target.kind, Kind::Pointer(_)) {
                addr_of
            } else {
                None
            },
        })
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

/// How the scalar type at `die` stores its value: a base type's
/// `DW_AT_encoding` (through typedefs and qualifiers), an enum's
/// underlying type's (signed when it gives none).
fn encoding(unit: &gimli::Unit<R<'_>>, die: usize) -> Enc {
    let mut cur = Some(die);
    for _ in 0..64 {
        let Some(o) = cur else { break };
        let Ok(e) = unit.entry(UnitOffset(o)) else {
            break;
        };
        match e.tag() {
            gimli::DW_TAG_base_type => {
                return match e.attr_value(gimli::DW_AT_encoding) {
                    Some(gimli::AttributeValue::Encoding(enc)) => match enc {
                        gimli::DW_ATE_float => Enc::Float,
                        gimli::DW_ATE_boolean => Enc::Bool,
                        gimli::DW_ATE_signed | gimli::DW_ATE_signed_char => Enc::Signed,
                        _ => Enc::Unsigned,
                    },
                    _ => Enc::Signed,
                };
            }
            gimli::DW_TAG_enumeration_type if super::dwarf::type_ref(&e).is_none() => {
                return Enc::Signed;
            }
            _ => cur = super::dwarf::type_ref(&e),
        }
    }
    Enc::Signed
}

/// The enumerators of the enumeration at `die` (through typedefs and
/// qualifiers), sorted by value: `None` when it is no enumeration. A value
/// given in a data form of no sign is read as the underlying type
/// (`signed`) reads it.
fn enumerators(
    dwarf: &gimli::Dwarf<R<'_>>,
    unit: &gimli::Unit<R<'_>>,
    die: usize,
    signed: bool,
) -> Option<Vec<(String, i64)>> {
    let mut cur = Some(die);
    for _ in 0..64 {
        let e = unit.entry(UnitOffset(cur?)).ok()?;
        match e.tag() {
            gimli::DW_TAG_enumeration_type => break,
            gimli::DW_TAG_typedef
            | gimli::DW_TAG_const_type
            | gimli::DW_TAG_volatile_type
            | gimli::DW_TAG_atomic_type => cur = super::dwarf::type_ref(&e),
            _ => return None,
        }
    }
    let extend = |v: u64, bits: u32| {
        if signed {
            ((v << (64 - bits)) as i64) >> (64 - bits)
        } else {
            v as i64
        }
    };
    let mut list = Vec::new();
    let mut tree = unit.entries_tree(Some(UnitOffset(cur?))).ok()?;
    let root = tree.root().ok()?;
    let mut children = root.children();
    while let Ok(Some(child)) = children.next() {
        let c = child.entry();
        if c.tag() != gimli::DW_TAG_enumerator {
            continue;
        }
        let value = match c.attr_value(gimli::DW_AT_const_value) {
            Some(gimli::AttributeValue::Sdata(v)) => v,
            Some(gimli::AttributeValue::Udata(v)) => v as i64,
            Some(gimli::AttributeValue::Data1(v)) => extend(u64::from(v), 8),
            Some(gimli::AttributeValue::Data2(v)) => extend(u64::from(v), 16),
            Some(gimli::AttributeValue::Data4(v)) => extend(u64::from(v), 32),
            Some(gimli::AttributeValue::Data8(v)) => v as i64,
            _ => continue,
        };
        if let Some(name) = super::dwarf::name_of(dwarf, unit, c) {
            list.push((name, value));
        }
    }
    list.sort_by_key(|(_, v)| *v);
    Some(list)
}

/// `bits` (the `size`-byte little-endian value of encoding `from`)
/// converted as C converts it to a `to_size`-byte value of encoding `to`.
fn convert(bits: u64, from: Enc, size: u64, to: Enc, to_size: u64) -> u64 {
    let width = size.clamp(1, 8) * 8;
    let raw = if width == 64 {
        bits
    } else {
        bits & ((1u64 << width) - 1)
    };
    let signed = || -> i64 {
        if width == 64 {
            raw as i64
        } else {
            ((raw << (64 - width)) as i64) >> (64 - width)
        }
    };
    let float = || -> f64 {
        if size == 4 {
            f64::from(f32::from_bits(raw as u32))
        } else {
            f64::from_bits(raw)
        }
    };
    match (from, to) {
        (_, Enc::Bool) => {
            let zero = match from {
                Enc::Float => float() == 0.0,
                _ => raw == 0,
            };
            u64::from(!zero)
        }
        (Enc::Float, Enc::Float) => {
            let f = float();
            if to_size == 4 {
                u64::from((f as f32).to_bits())
            } else {
                f.to_bits()
            }
        }
        (_, Enc::Float) => {
            let f = match from {
                Enc::Signed => signed() as f64,
                _ => raw as f64,
            };
            if to_size == 4 {
                u64::from((f as f32).to_bits())
            } else {
                f.to_bits()
            }
        }
        (Enc::Float, Enc::Signed) => float() as i64 as u64,
        (Enc::Float, _) => float() as u64,
        (Enc::Signed, _) => signed() as u64,
        (_, _) => raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_are_cs() {
        // -1 as a 4-byte int to an 8-byte long: sign-extended.
        assert_eq!(
            convert(0xffff_ffff, Enc::Signed, 4, Enc::Signed, 8) as i64,
            -1
        );
        // ... to an unsigned 4 bytes: the same bits.
        assert_eq!(
            convert(0xffff_ffff, Enc::Signed, 4, Enc::Unsigned, 4) & 0xffff_ffff,
            0xffff_ffff
        );
        // An unsigned 2-byte 0xffff widened: zero-extended.
        assert_eq!(convert(0xffff, Enc::Unsigned, 2, Enc::Signed, 8), 0xffff);
        // Bits beyond the size are not the value's.
        assert_eq!(
            convert(0x1_0000_0005, Enc::Unsigned, 4, Enc::Unsigned, 8),
            5
        );
        // double 2.75 to int: 2; int -3 to double.
        assert_eq!(convert(2.75f64.to_bits(), Enc::Float, 8, Enc::Signed, 4), 2);
        assert_eq!(
            f64::from_bits(convert(-3i64 as u64, Enc::Signed, 8, Enc::Float, 8)),
            -3.0
        );
        assert_eq!(
            f32::from_bits(convert(1.5f64.to_bits(), Enc::Float, 8, Enc::Float, 4) as u32),
            1.5
        );
        assert_eq!(convert(0x100, Enc::Unsigned, 4, Enc::Bool, 1), 1);
        assert_eq!(convert(0, Enc::Unsigned, 4, Enc::Bool, 1), 0);
    }
}
