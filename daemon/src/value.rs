//! What a watched value is: its C type as DWARF gives it ([`ValueType`]:
//! signed, unsigned, floating point, bool, an enumeration, a pointer), and
//! what a condition's right-hand side means for that type ([`bind`]: `-1`
//! for an `int`, `-273.15` for a `double`, `DONE` for an enumeration), so
//! that conditions compare as the type does and hits are shown as it
//! reads them.
//!
//! A watchpoint reads its values with its type only when it watches
//! exactly one variable of a scalar type ([`ValueType::reads`]); otherwise
//! (set by address, no DWARF, part of a variable) it reads them as
//! unsigned integers, as it always has, and says why ([`untyped_note`]).

use crate::filter::{Asked, Condition, Rhs, View};
use crate::range::Range;

/// How a type's bytes read as a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Two's complement (an enumeration with a signed underlying type too).
    Signed,
    /// Unsigned (an enumeration with an unsigned underlying type too).
    Unsigned,
    /// IEEE 754 binary32 (4 bytes) or binary64 (8 bytes).
    Float,
    /// `_Bool`.
    Bool,
    /// An address.
    Pointer,
    /// Not a number: a struct, union, array, function (shown as bytes).
    Other,
}

/// A value's C type, as far as reading and comparing it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueType {
    /// How its bytes read.
    pub kind: Kind,
    /// Its size in bytes.
    pub size: u64,
    /// Its name as DWARF gives it (`volatile double`, `enum state`).
    pub name: String,
    /// For an enumeration: its enumerators, sorted by value.
    pub enumerators: Option<Vec<(String, i64)>>,
}

impl ValueType {
    /// Whether a watchpoint on `range` reads its values as this type: one
    /// slot holding the whole object, a number of at most 8 bytes (a
    /// float: 4 or 8).
    pub fn reads(&self, range: &Range) -> bool {
        range.pieces.len() == 1
            && u64::from(range.len) == self.size
            && match self.kind {
                Kind::Other => false,
                Kind::Float => matches!(self.size, 4 | 8),
                _ => (1..=8).contains(&self.size),
            }
    }

    /// The enumerator named by `bytes`, for an enumeration.
    pub fn enumerator(&self, bytes: &[u8]) -> Option<&str> {
        let list = self.enumerators.as_ref()?;
        if bytes.is_empty() || bytes.len() > 8 {
            return None;
        }
        let raw = crate::filter::value_u64(bytes);
        let v = match self.kind {
            Kind::Signed => crate::filter::sign_extend(raw, bytes.len()),
            _ => raw as i64,
        };
        let i = list.binary_search_by_key(&v, |(_, value)| *value).ok()?;
        Some(&list[i].0)
    }

    /// `volatile int (signed, 4 bytes)`.
    fn described(&self) -> String {
        let kind = match (self.kind, &self.enumerators) {
            (_, Some(_)) => "an enumeration",
            (Kind::Signed, _) => "signed",
            (Kind::Unsigned, _) => "unsigned",
            (Kind::Float, _) => "floating point",
            (Kind::Bool, _) => "bool",
            (Kind::Pointer, _) => "a pointer",
            (Kind::Other, _) => "not a number",
        };
        format!("{} ({kind}, {} bytes)", self.name, self.size)
    }

    /// The names of its enumerators, closest to `name` first when they
    /// are many.
    fn enumerator_names(&self, name: &str) -> String {
        let mut names: Vec<&str> = self
            .enumerators
            .iter()
            .flatten()
            .map(|(n, _)| n.as_str())
            .collect();
        if names.len() > 8 {
            names.sort_by(|a, b| {
                strsim::jaro_winkler(name, b).total_cmp(&strsim::jaro_winkler(name, a))
            });
            names.truncate(8);
            return format!("closest: {}, …", names.join(", "));
        }
        names.join(", ")
    }
}

/// Why a watchpoint on `range` reads no type, in a sentence: `ty` is its
/// name's type, if it has one; `by_name` says whether it was set by name.
pub fn untyped_note(ty: Option<&ValueType>, range: &Range, by_name: bool) -> String {
    format!(
        "{}; values and conditions read its bytes as an unsigned integer",
        untyped_reason(ty, range, by_name)
    )
}

/// The first half of [`untyped_note`].
fn untyped_reason(ty: Option<&ValueType>, range: &Range, by_name: bool) -> String {
    match ty {
        _ if !by_name => "set by address: no type is known".into(),
        None => "no DWARF type for its name".into(),
        Some(t) if t.kind == Kind::Other => format!("{} is not a number", t.name),
        Some(t) => format!(
            "{} of the {} bytes of {} are watched{}",
            range.len,
            t.size,
            t.name,
            if range.pieces.len() > 1 {
                format!(" in {} slots", range.pieces.len())
            } else {
                String::new()
            }
        ),
    }
}

/// A literal as written.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Lit<'a> {
    /// A decimal integer, with its sign.
    Int(i128),
    /// `0x` hex: a bit pattern.
    Bits(u64),
    /// A number with a fraction, an exponent, or infinite (its text).
    Float(&'a str),
    /// `true` or `false`.
    Bool(bool),
    /// Any other name (an enumerator, `NULL`).
    Name(&'a str),
}

fn literal(text: &str) -> Result<Lit<'_>, String> {
    let t = text.trim();
    match t {
        "true" => return Ok(Lit::Bool(true)),
        "false" => return Ok(Lit::Bool(false)),
        _ => {}
    }
    let digits = t.replace('_', "");
    let (negative, unsigned) = match digits.strip_prefix('-') {
        Some(u) => (true, u),
        None => (false, digits.strip_prefix('+').unwrap_or(&digits)),
    };
    if let Some(h) = unsigned
        .strip_prefix("0x")
        .or_else(|| unsigned.strip_prefix("0X"))
    {
        let v = u64::from_str_radix(h, 16).map_err(|_| {
            format!("{t} is not a number this daemon reads (hex of at most 64 bits)")
        })?;
        return Ok(if negative {
            Lit::Int(-i128::from(v))
        } else {
            Lit::Bits(v)
        });
    }
    if !unsigned.is_empty() && unsigned.chars().all(|c| c.is_ascii_digit()) {
        let v: i128 = unsigned
            .parse()
            .map_err(|_| format!("{t} is too large a number"))?;
        return Ok(Lit::Int(if negative { -v } else { v }));
    }
    if let Ok(f) = digits.parse::<f64>() {
        if f.is_nan() {
            return Err(
                "NaN is no value to compare with (no comparison with it holds; a NaN value \
                 satisfies `!=` whatever it is compared with)"
                    .into(),
            );
        }
        return Ok(Lit::Float(t));
    }
    if t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Ok(Lit::Name(t));
    }
    Err(format!("{t:?} is neither a number nor a name"))
}

/// The integer range of `size` bytes, signed or not.
fn bounds(size: u64, signed: bool) -> (i128, i128) {
    let bits = 8 * size.clamp(1, 8) as u32;
    if signed {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    }
}

/// `lit` as an integer of `size` bytes: a decimal in range, or hex bits of
/// that size (read as the type reads them: `0xffffffff` is -1 for an
/// `int`); the operand as [`View::Signed`] or [`View::Unsigned`] hold it.
fn integer(lit: Lit<'_>, text: &str, size: u64, signed: bool, what: &str) -> Result<u64, String> {
    let (lo, hi) = bounds(size, signed);
    match lit {
        Lit::Int(v) if (lo..=hi).contains(&v) => Ok(v as i64 as u64),
        Lit::Int(_) => Err(format!("{text} is out of range for {what} ({lo} to {hi})")),
        Lit::Bits(b) if size >= 8 || b >> (8 * size) == 0 => Ok(if signed {
            crate::filter::sign_extend(b, size as usize) as u64
        } else {
            b
        }),
        Lit::Bits(_) => Err(format!("{text} has more bits than {what} ({size} bytes)")),
        Lit::Float(_) => Err(format!("{text} is not an integer, and {what} is one")),
        Lit::Bool(_) => Err(format!(
            "{text} compares with a bool, and {what} is an integer (write 0 or 1)"
        )),
        Lit::Name(n) => Err(format!("{n} names no value of {what}")),
    }
}

/// Binds condition `asked` to a watchpoint on `range` whose name's type is
/// `ty` (none: no DWARF type, or set by address: `by_name` false). The
/// error says what the type cannot take, naming it.
pub fn bind(
    asked: &Asked,
    ty: Option<&ValueType>,
    range: &Range,
    by_name: bool,
) -> Result<Condition, String> {
    let (op, mask, rhs) = match asked {
        Asked::Changed => return Ok(Condition::Changed),
        Asked::Compare { op, mask, rhs } => (*op, *mask, rhs),
    };
    let text = match rhs {
        // A client that predates typed conditions: unsigned, as it meant.
        Rhs::Unsigned(operand) => {
            return Ok(Condition::Compare {
                op,
                operand: *operand,
                mask: mask.unwrap_or(u64::MAX),
                view: View::Unsigned,
            });
        }
        Rhs::Text(t) => t.as_str(),
    };
    let lit = literal(text)?;
    let compare = |operand, view| Condition::Compare {
        op,
        operand,
        mask: mask.unwrap_or(u64::MAX),
        view,
    };
    let Some(t) = ty.filter(|t| t.reads(range)) else {
        if let Some(t) = ty.filter(|t| t.kind == Kind::Other) {
            return Err(format!(
                "{} is not a number: a condition on it can only be `changed`",
                t.name
            ));
        }
        let untyped = || {
            format!(
                "this watchpoint has no type ({}): its {} bytes read as an unsigned integer; \
                 watch one variable by name, with DWARF, to compare it as its type",
                untyped_reason(ty, range, by_name),
                range.len
            )
        };
        return match lit {
            Lit::Int(v) if (0..=i128::from(u64::MAX)).contains(&v) => {
                Ok(compare(v as u64, View::Unsigned))
            }
            Lit::Bits(b) => Ok(compare(b, View::Unsigned)),
            _ => Err(format!("{text} is not an unsigned number: {}", untyped())),
        };
    };
    let what = t.described();
    if mask.is_some() {
        if t.kind == Kind::Float {
            return Err(format!(
                "a mask compares an integer's bits, and {what} is floating point: compare its \
                 value, or watch its bytes by address to test bits"
            ));
        }
        let operand = integer(lit, text, 8, false, "a masked value (its bits, unsigned)")?;
        return Ok(compare(operand, View::Unsigned));
    }
    match t.kind {
        Kind::Signed | Kind::Unsigned => {
            let signed = t.kind == Kind::Signed;
            let view = if signed { View::Signed } else { View::Unsigned };
            if let (Lit::Name(n), Some(list)) = (lit, &t.enumerators) {
                return match list.iter().find(|(name, _)| name == n) {
                    Some((_, v)) => Ok(compare(*v as u64, view)),
                    None => Err(format!(
                        "{n} is not an enumerator of {what}: {}",
                        t.enumerator_names(n)
                    )),
                };
            }
            Ok(compare(integer(lit, text, t.size, signed, &what)?, view))
        }
        Kind::Bool => match lit {
            Lit::Bool(b) => Ok(compare(u64::from(b), View::Unsigned)),
            Lit::Int(v @ (0 | 1)) => Ok(compare(v as u64, View::Unsigned)),
            Lit::Bits(v @ (0 | 1)) => Ok(compare(v, View::Unsigned)),
            _ => Err(format!(
                "{text} is not a value of {what}: write true or false"
            )),
        },
        Kind::Pointer => match lit {
            Lit::Name("NULL" | "nullptr") => Ok(compare(0, View::Unsigned)),
            Lit::Float(_) | Lit::Bool(_) | Lit::Name(_) => Err(format!(
                "{text} is not an address, and {what} holds one (write 0x…, or NULL)"
            )),
            _ => Ok(compare(
                integer(lit, text, t.size, false, &what)?,
                View::Unsigned,
            )),
        },
        Kind::Float => {
            let parsed = match lit {
                Lit::Int(_) | Lit::Float(_) => text.trim().replace('_', ""),
                Lit::Bits(_) => {
                    return Err(format!(
                        "{text} is a bit pattern, and {what} compares by value: write a decimal \
                         number (-273.15, 1e-3, inf)"
                    ));
                }
                Lit::Bool(_) | Lit::Name(_) => {
                    return Err(format!(
                        "{text} is not a number, and {what} is one (-273.15, 1e-3, inf)"
                    ));
                }
            };
            let infinite = parsed.to_ascii_lowercase().contains("inf");
            // Read as the type: `3.1` is the float nearest 3.1 for a
            // `float`, as `3.1f` is in C.
            let (bits, finite) = if t.size == 4 {
                let v: f32 = parsed
                    .parse()
                    .map_err(|_| format!("{text} is not a number"))?;
                (u64::from(v.to_bits()), v.is_finite())
            } else {
                let v: f64 = parsed
                    .parse()
                    .map_err(|_| format!("{text} is not a number"))?;
                (v.to_bits(), v.is_finite())
            };
            if !finite && !infinite {
                return Err(format!("{text} is out of range for {what}"));
            }
            Ok(compare(bits, View::Float))
        }
        Kind::Other => unreachable!("`reads` refuses it"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::CmpOp;
    use crate::model::{Piece, WatchLen};

    fn range(len: u32) -> Range {
        let pieces = match len {
            1 | 2 | 4 | 8 => vec![Piece {
                addr: 0x1000,
                len: WatchLen::new(len).unwrap(),
            }],
            _ => {
                crate::arch::validate(0x1000, len, crate::model::Access::Write)
                    .unwrap()
                    .pieces
            }
        };
        Range {
            addr: 0x1000,
            len,
            pieces,
        }
    }

    fn ty(kind: Kind, size: u64, name: &str) -> ValueType {
        ValueType {
            kind,
            size,
            name: name.into(),
            enumerators: None,
        }
    }

    fn state() -> ValueType {
        ValueType {
            kind: Kind::Unsigned,
            size: 4,
            name: "enum state".into(),
            enumerators: Some(vec![
                ("IDLE".into(), 0),
                ("RUN".into(), 1),
                ("DONE".into(), 2),
            ]),
        }
    }

    /// `text` (`OP VALUE`, `&MASK OP VALUE` or `changed`) bound to a
    /// watchpoint of `t` over its whole size (`None`: by address, 8 bytes)
    /// gives (operand, view), or an error containing `expected`'s text.
    fn check(t: Option<&ValueType>, text: &str, expected: Result<(u64, View), &str>) {
        let c = wpd_proto::condition::parse(text).unwrap();
        let asked = crate::convert::asked_from_pb(&c).unwrap().unwrap();
        let r = range(t.map_or(8, |t| t.size as u32));
        match (bind(&asked, t, &r, t.is_some()), expected) {
            (Ok(Condition::Compare { operand, view, .. }), Ok(want)) => {
                assert_eq!((operand, view), want, "{text:?} on {t:?}")
            }
            (Ok(Condition::Changed), Ok(_)) => {}
            (Err(e), Err(want)) => assert!(e.contains(want), "{text:?} on {t:?}: {e}"),
            (got, want) => panic!("{text:?} on {t:?}: got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn literals_bind_to_the_watched_type() {
        let long = ty(Kind::Signed, 8, "volatile long");
        let int = ty(Kind::Signed, 4, "volatile int");
        let uint = ty(Kind::Unsigned, 4, "unsigned int");
        let uchar = ty(Kind::Unsigned, 1, "unsigned char");
        let double = ty(Kind::Float, 8, "volatile double");
        let float = ty(Kind::Float, 4, "float");
        let boolean = ty(Kind::Bool, 1, "_Bool");
        let ptr = ty(Kind::Pointer, 8, "struct item *");
        let s = state();
        use View::*;
        check(Some(&long), "> 100", Ok((100, Signed)));
        check(Some(&long), "== -1", Ok((u64::MAX, Signed)));
        check(Some(&int), "< 0", Ok((0, Signed)));
        check(
            Some(&int),
            "== -2147483648",
            Ok((i64::from(i32::MIN) as u64, Signed)),
        );
        check(
            Some(&int),
            "== 2147483648",
            Err("out of range for volatile int (signed, 4 bytes) (-2147483648 to 2147483647)"),
        );
        // Hex: the type's bits.
        check(Some(&int), "== 0xffffffff", Ok((u64::MAX, Signed)));
        check(Some(&int), "== 0x1ffffffff", Err("more bits than"));
        check(
            Some(&int),
            "== 3.5",
            Err("3.5 is not an integer, and volatile int (signed, 4 bytes) is one"),
        );
        check(Some(&int), "== true", Err("compares with a bool"));
        check(
            Some(&int),
            "== DONE",
            Err("DONE names no value of volatile int"),
        );
        check(
            Some(&uint),
            "== -1",
            Err("-1 is out of range for unsigned int (unsigned, 4 bytes) (0 to 4294967295)"),
        );
        check(Some(&uint), "== 4294967295", Ok((0xffff_ffff, Unsigned)));
        check(Some(&uchar), "< 256", Err("out of range"));
        check(Some(&int), "&0xff == 3", Ok((3, Unsigned)));
        check(Some(&int), "&0xff == -1", Err("a masked value"));
        check(Some(&int), "changed", Ok((0, Unsigned)));
        // Floating point: by value, in the type's own precision.
        check(Some(&double), "< -273", Ok(((-273.0f64).to_bits(), Float)));
        check(
            Some(&double),
            ">= -273.15",
            Ok(((-273.15f64).to_bits(), Float)),
        );
        check(
            Some(&double),
            "< -inf",
            Ok((f64::NEG_INFINITY.to_bits(), Float)),
        );
        check(Some(&double), "< 1e400", Err("out of range"));
        check(
            Some(&float),
            "== 3.1",
            Ok((u64::from(3.1f32.to_bits()), Float)),
        );
        check(Some(&float), "> 1e39", Err("out of range for float"));
        check(Some(&double), "== 0x10", Err("a bit pattern"));
        check(Some(&double), "== nan", Err("NaN is no value"));
        check(Some(&double), "== NaN", Err("NaN is no value"));
        check(
            Some(&double),
            "&0xff == 3",
            Err(
                "a mask compares an integer's bits, and volatile double (floating point, 8 bytes) is floating point",
            ),
        );
        check(Some(&double), "== DONE", Err("not a number"));
        // bool, enumerations, pointers.
        check(Some(&boolean), "== true", Ok((1, Unsigned)));
        check(Some(&boolean), "!= false", Ok((0, Unsigned)));
        check(Some(&boolean), "== 1", Ok((1, Unsigned)));
        check(Some(&boolean), "== 2", Err("write true or false"));
        check(Some(&s), "== DONE", Ok((2, Unsigned)));
        check(Some(&s), "== 1", Ok((1, Unsigned)));
        check(
            Some(&s),
            "== DOEN",
            Err(
                "DOEN is not an enumerator of enum state (an enumeration, 4 bytes): IDLE, RUN, DONE",
            ),
        );
        check(Some(&ptr), "== NULL", Ok((0, Unsigned)));
        check(Some(&ptr), "> 0x1000", Ok((0x1000, Unsigned)));
        check(Some(&ptr), "== -1", Err("out of range"));
        check(Some(&ptr), "== 1.5", Err("not an address"));
        // No type: unsigned, as before; what needs a type says so.
        check(None, "> 100", Ok((100, Unsigned)));
        check(None, "== 0xffffffffffffffff", Ok((u64::MAX, Unsigned)));
        check(
            None,
            "== -1",
            Err(
                "-1 is not an unsigned number: this watchpoint has no type (set by address: no type is known): its 8 bytes",
            ),
        );
        check(None, "< 2.5", Err("2.5 is not an unsigned number"));
        // Not a number.
        let record = ty(Kind::Other, 8, "struct pair");
        check(Some(&record), "== 1", Err("struct pair is not a number"));
        check(Some(&record), "changed", Ok((0, Unsigned)));
    }

    #[test]
    fn part_of_a_variable_reads_untyped() {
        let long = ty(Kind::Signed, 8, "long");
        assert!(long.reads(&range(8)));
        assert!(!long.reads(&range(4)));
        let asked = Asked::Compare {
            op: CmpOp::Eq,
            mask: None,
            rhs: Rhs::Text("-1".into()),
        };
        let e = bind(&asked, Some(&long), &range(4), true).unwrap_err();
        assert!(e.contains("4 of the 8 bytes of long are watched"), "{e}");
        // An old client's operand: unsigned whatever the type.
        let legacy = Asked::Compare {
            op: CmpOp::Gt,
            mask: None,
            rhs: Rhs::Unsigned(100),
        };
        assert_eq!(
            bind(&legacy, Some(&long), &range(8), true),
            Ok(Condition::Compare {
                op: CmpOp::Gt,
                operand: 100,
                mask: u64::MAX,
                view: View::Unsigned
            })
        );
    }

    #[test]
    fn enumerators_name_values() {
        let s = state();
        assert_eq!(s.enumerator(&2u32.to_le_bytes()), Some("DONE"));
        assert_eq!(s.enumerator(&7u32.to_le_bytes()), None);
        let signed = ValueType {
            kind: Kind::Signed,
            size: 4,
            name: "enum dir".into(),
            enumerators: Some(vec![("BACK".into(), -1), ("STILL".into(), 0)]),
        };
        assert_eq!(signed.enumerator(&(-1i32).to_le_bytes()), Some("BACK"));
        assert_eq!(ty(Kind::Signed, 4, "int").enumerator(&[0; 4]), None);
    }
}
