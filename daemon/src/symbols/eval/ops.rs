//! The operators of an expression over an [`Eval`]'s values: `*` and `->`
//! (following a pointer), `.` (a member), `[]` (an element), casts, and an
//! array decaying to a pointer to its first element.

use crate::symbols::dwarf::{PathError, TypeRef, element_offset, find_member, overflow};
use crate::symbols::expr::Node;

use super::scalar::{Enc, convert};
use super::{Eval, Kind, POINTER_SIZE, Place, Ty, Val, from_le, le};

impl<'a> Eval<'a> {
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

    pub(super) fn deref(&mut self, e: &Node, v: Val) -> Result<Val, PathError> {
        let (p, from, target) = self.pointer(e, v)?;
        Ok(Val::Obj {
            at: from.unwrap_or(Place::At(p)),
            ty: target,
        })
    }

    pub(super) fn member(
        &mut self,
        e: &Node,
        v: Val,
        m: &str,
        arrow: bool,
    ) -> Result<Val, PathError> {
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

    pub(super) fn index(&mut self, e: &Node, v: Val, i: u64) -> Result<Val, PathError> {
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

    pub(super) fn cast(&mut self, e: &Node, v: Val, to: Ty) -> Result<Val, PathError> {
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
}
