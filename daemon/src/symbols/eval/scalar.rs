//! Scalars: how a scalar type stores its value ([`Enc`]), an enumeration's
//! enumerators, and a value converted as C converts it.

use gimli::UnitOffset;

use crate::symbols::dwarf::{self, R};

/// How a scalar's bits are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Enc {
    Signed,
    Unsigned,
    Float,
    Bool,
}

/// How the scalar type at `die` stores its value: a base type's
/// `DW_AT_encoding` (through typedefs and qualifiers), an enum's
/// underlying type's (signed when it gives none).
pub(super) fn encoding(unit: &gimli::Unit<R<'_>>, die: usize) -> Enc {
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
            gimli::DW_TAG_enumeration_type if dwarf::type_ref(&e).is_none() => {
                return Enc::Signed;
            }
            _ => cur = dwarf::type_ref(&e),
        }
    }
    Enc::Signed
}

/// The enumerators of the enumeration at `die` (through typedefs and
/// qualifiers), sorted by value: `None` when it is no enumeration. A value
/// given in a data form of no sign is read as the underlying type
/// (`signed`) reads it.
pub(super) fn enumerators(
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
            | gimli::DW_TAG_atomic_type => cur = dwarf::type_ref(&e),
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
        if let Some(name) = dwarf::name_of(dwarf, unit, c) {
            list.push((name, value));
        }
    }
    list.sort_by_key(|(_, v)| *v);
    Some(list)
}

/// `bits` (the `size`-byte little-endian value of encoding `from`)
/// converted as C converts it to a `to_size`-byte value of encoding `to`.
pub(super) fn convert(bits: u64, from: Enc, size: u64, to: Enc, to_size: u64) -> u64 {
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
