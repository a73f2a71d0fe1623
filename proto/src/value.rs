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
}
