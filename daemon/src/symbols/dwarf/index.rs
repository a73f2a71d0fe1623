//! The indexes a file's DWARF is searched by, each built once on first
//! use: every variable with a static location by name, and every named
//! type by its canonical name ([`canonical_type`]).

use std::collections::HashMap;

use gimli::AttributeValue;

use super::types::{name_of, type_ref};
use super::{R, TypeRef, VarDie, VarLoc};

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

pub(super) fn build_index(
    dwarf: &gimli::Dwarf<R<'_>>,
) -> Result<HashMap<String, Vec<VarDie>>, gimli::Error> {
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
pub(super) fn build_type_index(
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
}
