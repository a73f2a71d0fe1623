//! Watched values as their C type reads them (`ValueKind`, from the
//! daemon): a signed or floating-point number, `true`/`false`, an address,
//! with the name the daemon gave it (an enumerator, the symbol a pointer
//! points into). One reading for `wpctl` and the DAP adapter.

use crate::v1::ValueKind;

/// A value read as its type reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Typed {
    /// A signed integer.
    Signed(i64),
    /// An unsigned integer (also what a value of no known type reads as).
    Unsigned(u64),
    /// A `float` (widened exactly) or a `double`.
    Float(f64),
    /// A `bool`.
    Bool(bool),
    /// A pointer.
    Pointer(u64),
}

impl std::fmt::Display for Typed {
    /// `-1`, `42`, `-273.15`, `3.5`, `1e300`, `NaN`, `true`, `0x1000`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Typed::Signed(v) => write!(f, "{v}"),
            Typed::Unsigned(v) => write!(f, "{v}"),
            // The shortest text that reads back as the same number, with
            // an exponent where plain digits would run long.
            Typed::Float(v) => write!(f, "{v:?}"),
            Typed::Bool(v) => write!(f, "{v}"),
            Typed::Pointer(v) => write!(f, "{v:#x}"),
        }
    }
}

/// The bytes read as an unsigned little-endian integer (1 to 8 bytes).
pub fn le_u64(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 8 {
        return None;
    }
    let mut buf = [0u8; 8];
    buf[..bytes.len()].copy_from_slice(bytes);
    Some(u64::from_le_bytes(buf))
}

/// `bytes` (little-endian, as the target stores them) read as `kind`
/// (an `i32` from the wire; unknown kinds read as unsigned); `None` when
/// they cannot be: nothing read, more than 8 bytes, a float of another
/// size than 4 or 8.
pub fn typed(kind: i32, bytes: &[u8]) -> Option<Typed> {
    let raw = le_u64(bytes)?;
    let bits = 8 * bytes.len() as u32;
    Some(
        match ValueKind::try_from(kind).unwrap_or(ValueKind::Unspecified) {
            ValueKind::Signed => Typed::Signed(((raw << (64 - bits)) as i64) >> (64 - bits)),
            ValueKind::Float => match bytes.len() {
                4 => Typed::Float(f64::from(f32::from_bits(raw as u32))),
                8 => Typed::Float(f64::from_bits(raw)),
                _ => return None,
            },
            ValueKind::Bool => Typed::Bool(raw != 0),
            ValueKind::Pointer => Typed::Pointer(raw),
            ValueKind::Unsigned | ValueKind::Unspecified => Typed::Unsigned(raw),
        },
    )
}

/// A value as a person reads it, the raw bytes beside it: `-1
/// (0xffffffffffffffff)`, `-273.15 (0xc071126666666666)`, `true (0x1)`,
/// `DONE (0x2)` (an enumerator: `name`), `0x55d0c0a01040 <g_table+16>` (a
/// pointer and the symbol `name` it points into), `42 (0x2a)` (no type);
/// more than 8 bytes in memory order (`[01 02 ff]`). `name` is shown
/// through [`crate::text::escape`] (the target chose it).
pub fn show(kind: i32, bytes: &[u8], name: &str) -> String {
    let Some(v) = typed(kind, bytes) else {
        let hex: Vec<String> = bytes.iter().take(64).map(|b| format!("{b:02x}")).collect();
        let more = if bytes.len() > 64 { " …" } else { "" };
        return format!("[{}{more}]", hex.join(" "));
    };
    let raw = le_u64(bytes).unwrap_or(0);
    let name = crate::text::escape(name);
    match v {
        Typed::Pointer(_) if name.is_empty() => v.to_string(),
        Typed::Pointer(_) => format!("{v} <{name}>"),
        _ if name.is_empty() => format!("{v} ({raw:#x})"),
        _ => format!("{name} ({raw:#x})"),
    }
}

/// A value as its type reads it, without the raw bytes (for a table cell,
/// or a value the line names its type beside): `-1`, `-273.15`, `true`,
/// `DONE` (an enumerator: `name`), `0x55d0c0a01040 <g_table+16>`; more
/// than 8 bytes in memory order (`[01 02 ff]`).
pub fn short(kind: i32, bytes: &[u8], name: &str) -> String {
    let name = crate::text::escape(name);
    match typed(kind, bytes) {
        Some(p @ Typed::Pointer(_)) if !name.is_empty() => format!("{p} <{name}>"),
        Some(p @ Typed::Pointer(_)) => p.to_string(),
        Some(_) if !name.is_empty() => name.into_owned(),
        Some(v) => v.to_string(),
        None => show(kind, bytes, ""),
    }
}

/// The name of `kind` as `wpctl --json` and listings say it: `signed`,
/// `unsigned`, `float`, `bool`, `pointer`, or `untyped`.
pub fn kind_name(kind: i32) -> &'static str {
    match ValueKind::try_from(kind).unwrap_or(ValueKind::Unspecified) {
        ValueKind::Unspecified => "untyped",
        ValueKind::Signed => "signed",
        ValueKind::Unsigned => "unsigned",
        ValueKind::Float => "float",
        ValueKind::Bool => "bool",
        ValueKind::Pointer => "pointer",
    }
}

/// The bytes (little-endian, `t.size` of them) a value typed by a person
/// stores as type `t`: what [`show`] and [`short`] print reads back (`-1`,
/// `42 (0x2a)`, `0x2a`, `-273.15`, `true`, `DONE`, `DONE (2)`, `'A'`,
/// `0x55d0c0a01040 <g_table+16>`, `NULL`); the error says why not (not a
/// number, out of the type's range, a record or array, which is set
/// member by member).
pub fn encode(t: &crate::v1::ValueType, text: &str) -> Result<Vec<u8>, String> {
    let size = t.size as usize;
    let type_name = if t.name.is_empty() {
        "this type"
    } else {
        t.name.as_str()
    };
    let kind = ValueKind::try_from(t.kind).unwrap_or(ValueKind::Unspecified);
    if kind == ValueKind::Unspecified || size == 0 || size > 8 {
        return Err(format!(
            "a value of {type_name} is not one number: set its members or elements one by one"
        ));
    }
    let full = text.trim();
    // What show() adds after the value: ` (0x2a)`, ` <g_table+16>`.
    let v = match full.find([' ', '\t']) {
        Some(i) if full[i..].trim_start().starts_with(['(', '<']) => &full[..i],
        _ => full,
    };
    if v.is_empty() {
        return Err(format!("no value given for {type_name}"));
    }
    let range = |what: &str| format!("{v} is out of the range of {type_name} ({size} bytes{what})");
    // An enumerator's name, a character literal, a number.
    let integer = |v: &str| -> Result<i128, String> {
        if let Some(e) = t.enumerators.iter().find(|e| e.name == v) {
            return Ok(i128::from(e.value));
        }
        if let Some(c) = v.strip_prefix('\'').and_then(|c| c.strip_suffix('\'')) {
            let mut chars = c.chars();
            return match (chars.next(), chars.next()) {
                (Some(ch), None) if ch.is_ascii() => Ok(ch as i128),
                _ => Err(format!("{v} is not one ASCII character")),
            };
        }
        let (neg, digits) = match v.strip_prefix('-') {
            Some(d) => (true, d),
            None => (false, v.strip_prefix('+').unwrap_or(v)),
        };
        let digits = digits.replace('_', "");
        let n = match digits
            .strip_prefix("0x")
            .or_else(|| digits.strip_prefix("0X"))
        {
            Some(h) => i128::from_str_radix(h, 16),
            None => digits.parse::<i128>(),
        }
        .map_err(|_| {
            if t.enumeration {
                let names: Vec<&str> = t.enumerators.iter().map(|e| e.name.as_str()).collect();
                format!(
                    "{v} is neither a number nor an enumerator of {type_name} ({})",
                    names.join(", ")
                )
            } else {
                format!("{v} is not a number (42, -1, 0x2a, 'A')")
            }
        })?;
        Ok(if neg { -n } else { n })
    };
    let bits = 8 * size as u32;
    let raw: u64 = match kind {
        ValueKind::Signed => {
            let n = integer(v)?;
            let (lo, hi) = (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1);
            // Hex spells the bits (0xffffffff for an int's -1), as show()
            // prints them.
            let hex = v.trim_start_matches(['-', '+']).starts_with("0x");
            if hex && n >= 0 && n < (1i128 << bits) {
                n as u64
            } else if n < lo || n > hi {
                return Err(range(&format!(", {lo} to {hi}")));
            } else {
                n as i64 as u64
            }
        }
        ValueKind::Unsigned | ValueKind::Pointer => {
            let n = if kind == ValueKind::Pointer && matches!(v, "NULL" | "nullptr") {
                0
            } else {
                integer(v)?
            };
            if n < 0 || n >= (1i128 << bits) {
                return Err(range(&format!(", 0 to {}", (1u128 << bits) - 1)));
            }
            n as u64
        }
        ValueKind::Float => {
            let f: f64 = v
                .replace('_', "")
                .parse()
                .map_err(|_| format!("{v} is not a number (-273.15, 1e-3, inf, nan)"))?;
            match size {
                4 => {
                    let g = f as f32;
                    if f.is_finite() && !g.is_finite() {
                        return Err(range(""));
                    }
                    u64::from(g.to_bits())
                }
                8 => f.to_bits(),
                _ => {
                    return Err(format!(
                        "{type_name} is a float of {size} bytes: not settable"
                    ));
                }
            }
        }
        ValueKind::Bool => match v {
            "true" | "1" => 1,
            "false" | "0" => 0,
            _ => return Err(format!("{v} is not true, false, 1 or 0")),
        },
        ValueKind::Unspecified => unreachable!("refused above"),
    };
    Ok(raw.to_le_bytes()[..size].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `bytes` read as `kind`, with `name`, shows as `expected`.
    fn check(kind: ValueKind, bytes: &[u8], name: &str, expected: &str) {
        assert_eq!(
            show(kind as i32, bytes, name),
            expected,
            "{kind:?} {bytes:?}"
        );
    }

    #[test]
    fn values_show_as_their_type_reads_them() {
        use ValueKind::*;
        check(
            Signed,
            &(-1i64).to_le_bytes(),
            "",
            "-1 (0xffffffffffffffff)",
        );
        check(Signed, &(-7i32).to_le_bytes(), "", "-7 (0xfffffff9)");
        check(Signed, &[0x80], "", "-128 (0x80)");
        check(Signed, &300i16.to_le_bytes(), "", "300 (0x12c)");
        check(
            Unsigned,
            &u64::MAX.to_le_bytes(),
            "",
            "18446744073709551615 (0xffffffffffffffff)",
        );
        check(
            Float,
            &(-273.15f64).to_le_bytes(),
            "",
            "-273.15 (0xc071126666666666)",
        );
        check(Float, &3.5f32.to_le_bytes(), "", "3.5 (0x40600000)");
        check(
            Float,
            &1e300f64.to_le_bytes(),
            "",
            "1e300 (0x7e37e43c8800759c)",
        );
        check(
            Float,
            &f64::NAN.to_le_bytes(),
            "",
            "NaN (0x7ff8000000000000)",
        );
        check(
            Float,
            &(-0.0f64).to_le_bytes(),
            "",
            "-0.0 (0x8000000000000000)",
        );
        check(Float, &[0, 0], "", "[00 00]");
        check(Bool, &[1], "", "true (0x1)");
        check(Bool, &[0], "", "false (0x0)");
        check(Unsigned, &2u32.to_le_bytes(), "DONE", "DONE (0x2)");
        check(Signed, &(-2i32).to_le_bytes(), "NEG", "NEG (0xfffffffe)");
        check(
            Pointer,
            &0x55d0_c0a0_1040u64.to_le_bytes(),
            "g_table+16",
            "0x55d0c0a01040 <g_table+16>",
        );
        check(Pointer, &0u64.to_le_bytes(), "", "0x0");
        check(Unspecified, &42u64.to_le_bytes(), "", "42 (0x2a)");
        check(
            Unspecified,
            &[1, 2, 0xff, 0, 0, 0, 0, 0, 9],
            "",
            "[01 02 ff 00 00 00 00 00 09]",
        );
        // A name the target chose is escaped.
        check(Unsigned, &[1], "A\x1b[2J", "A\\x1b[2J (0x1)");
    }

    #[test]
    fn short_values_leave_the_bytes_out() {
        use ValueKind::*;
        let short = |kind: ValueKind, b: &[u8], name: &str| short(kind as i32, b, name);
        assert_eq!(short(Signed, &(-2i32).to_le_bytes(), ""), "-2");
        assert_eq!(short(Float, &(-273.15f64).to_le_bytes(), ""), "-273.15");
        assert_eq!(short(Unsigned, &2u32.to_le_bytes(), "DONE"), "DONE");
        assert_eq!(short(Pointer, &0x10u64.to_le_bytes(), "t+8"), "0x10 <t+8>");
        assert_eq!(short(Bool, &[0], ""), "false");
        assert_eq!(
            short(Unspecified, &[1; 9], ""),
            "[01 01 01 01 01 01 01 01 01]"
        );
    }

    #[test]
    fn unknown_kinds_read_unsigned() {
        assert_eq!(typed(99, &[0xff]), Some(Typed::Unsigned(255)));
        assert_eq!(typed(ValueKind::Signed as i32, &[]), None);
        assert_eq!(kind_name(ValueKind::Float as i32), "float");
        assert_eq!(kind_name(0), "untyped");
    }

    /// `text` stored as `kind` of `size` bytes: `expected` (bytes), or an
    /// error that contains `expected_err`.
    fn enc(kind: ValueKind, size: u32, text: &str) -> Result<Vec<u8>, String> {
        let t = crate::v1::ValueType {
            kind: kind as i32,
            size,
            name: "long".into(),
            enumeration: false,
            enumerators: vec![],
            note: String::new(),
        };
        encode(&t, text)
    }

    #[test]
    fn what_a_person_types_is_stored_as_the_type_stores_it() {
        use ValueKind::*;
        assert_eq!(enc(Signed, 8, "-1").unwrap(), (-1i64).to_le_bytes());
        assert_eq!(enc(Signed, 4, "42 (0x2a)").unwrap(), 42i32.to_le_bytes());
        assert_eq!(enc(Signed, 4, "0xffffffff").unwrap(), (-1i32).to_le_bytes());
        assert_eq!(enc(Signed, 1, "'A'").unwrap(), [65]);
        assert_eq!(enc(Unsigned, 2, "65535").unwrap(), [0xff, 0xff]);
        assert_eq!(
            enc(Float, 8, "-273.15").unwrap(),
            (-273.15f64).to_le_bytes()
        );
        assert_eq!(enc(Float, 4, "0.5").unwrap(), 0.5f32.to_le_bytes());
        assert_eq!(enc(Bool, 1, "true").unwrap(), [1]);
        assert_eq!(enc(Pointer, 8, "NULL").unwrap(), 0u64.to_le_bytes());
        assert_eq!(
            enc(Pointer, 8, "0x55d0c0a01040 <g_table+16>").unwrap(),
            0x55d0c0a01040u64.to_le_bytes()
        );
        let e = crate::v1::ValueType {
            kind: Unsigned as i32,
            size: 4,
            name: "enum state".into(),
            enumeration: true,
            enumerators: vec![crate::v1::Enumerator {
                name: "DONE".into(),
                value: 2,
            }],
            note: String::new(),
        };
        assert_eq!(encode(&e, "DONE").unwrap(), 2u32.to_le_bytes());
        assert_eq!(encode(&e, "DONE (2)").unwrap(), 2u32.to_le_bytes());
        assert!(encode(&e, "LATER").unwrap_err().contains("DONE"));
    }

    #[test]
    fn values_that_do_not_fit_are_refused_saying_why() {
        use ValueKind::*;
        assert!(enc(Signed, 1, "200").unwrap_err().contains("-128 to 127"));
        assert!(
            enc(Unsigned, 4, "-1")
                .unwrap_err()
                .contains("out of the range")
        );
        assert!(
            enc(Signed, 8, "banana")
                .unwrap_err()
                .contains("not a number")
        );
        assert!(
            enc(Float, 4, "1e300")
                .unwrap_err()
                .contains("out of the range")
        );
        assert!(enc(Bool, 1, "yes").unwrap_err().contains("true, false"));
        assert!(
            enc(Unspecified, 16, "1")
                .unwrap_err()
                .contains("one by one")
        );
        assert!(enc(Signed, 8, "").unwrap_err().contains("no value"));
    }
}
