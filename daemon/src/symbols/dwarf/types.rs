//! The type walk: a type DIE's name, size and shape ([`type_info`]),
//! typedefs and qualifiers seen through, and the arithmetic of members and
//! array elements.

use gimli::{AttributeValue, UnitOffset};

use super::error::PathError;
use super::{Member, R, Shape, TypeInfo};

/// Elements of an array of dimensions `dims` (an unknown bound counts 0),
/// or None when the product overflows (debug information that is damaged
/// or forged: a target's DWARF is its own choice).
pub(in crate::symbols) fn count_of(dims: &[Option<u64>]) -> Option<u64> {
    dims.iter()
        .try_fold(1u64, |n, d| n.checked_mul(d.unwrap_or(0)))
}

/// The byte offset of element `i` of an array whose further dimensions are
/// `inner` and whose elements are `elem_size` bytes, or None on overflow.
pub(in crate::symbols) fn element_offset(
    i: u64,
    inner: &[Option<u64>],
    elem_size: u64,
) -> Option<u64> {
    i.checked_mul(count_of(inner)?)?.checked_mul(elem_size)
}

/// The error for an offset past 64 bits.
pub(in crate::symbols) fn overflow(what: &str, step: u64) -> PathError {
    PathError::Dwarf(format!(
        "the offset of {what} (+{step}) does not fit in 64 bits: the debug information is \
         damaged, or the index is far past any object"
    ))
}

pub(in crate::symbols) fn type_ref(e: &gimli::DebuggingInformationEntry<R<'_>>) -> Option<usize> {
    match e.attr_value(gimli::DW_AT_type) {
        Some(AttributeValue::UnitRef(o)) => Some(o.0),
        _ => None,
    }
}

pub(in crate::symbols) fn name_of(
    dwarf: &gimli::Dwarf<R<'_>>,
    unit: &gimli::Unit<R<'_>>,
    e: &gimli::DebuggingInformationEntry<R<'_>>,
) -> Option<String> {
    let v = e.attr_value(gimli::DW_AT_name)?;
    let s = dwarf.attr_string(unit, v).ok()?;
    Some(s.to_string_lossy().into_owned())
}

pub(in crate::symbols) fn find_member(
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

pub(in crate::symbols) fn describe_array(
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

#[cfg(test)]
mod tests {
    use super::*;

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
