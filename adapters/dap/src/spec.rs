//! What a data breakpoint is, in the adapter's words: its `dataId` (which
//! stays valid across stops and sessions: a name, or an address and a
//! length), its condition and hit condition translated to the daemon's, and
//! how watched bytes are shown.

use wpd_proto::v1 as pb;
use wpd_proto::v1::HitCondition;
use wpd_proto::v1::hit_condition::Op;

/// Why a `dataId`, an address or a condition was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A `dataId` this adapter did not make.
    #[error("dataId {0:?} was not made by this adapter (ask dataBreakpointInfo for one)")]
    ForeignDataId(String),
    /// Not an address.
    #[error("{0:?} is not an address (decimal, or hex with 0x)")]
    NotAnAddress(String),
    /// A condition that does not parse.
    #[error(
        "condition {text:?}: {why}. Conditions compare the watched value: `== 42`, `x != 0`, \
         `value >= 10`, `&0xff == 3` (a mask), or `changed`"
    )]
    Condition {
        /// The condition.
        text: String,
        /// What is wrong with it.
        why: String,
    },
    /// A hit condition that does not parse.
    #[error(
        "hit condition {0:?}: expected `N` or `>= N` (stop from the Nth hit on), `> N` (after \
         the Nth) or `% N` (every Nth), N a positive number"
    )]
    HitCondition(String),
}

/// What a `dataId` names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// A variable by name, resolved by the daemon in the process
    /// (`[module:]name[.member][[i]][+off]`).
    Name(String),
    /// `len` bytes at `addr`.
    Address { addr: u64, len: u32 },
}

impl Target {
    /// The `dataId` string.
    pub fn data_id(&self) -> String {
        match self {
            Target::Name(n) => format!("name:{n}"),
            Target::Address { addr, len } => format!("addr:{addr:#x}/{len}"),
        }
    }

    /// Parses a `dataId` made by [`Target::data_id`].
    pub fn parse(id: &str) -> Result<Target, SpecError> {
        if let Some(n) = id.strip_prefix("name:")
            && !n.is_empty()
        {
            return Ok(Target::Name(n.to_string()));
        }
        if let Some(a) = id.strip_prefix("addr:")
            && let Some((addr, len)) = a.split_once('/')
            && let Ok(addr) = parse_address(addr)
            && let Ok(len) = len.parse::<u32>()
            && len > 0
        {
            return Ok(Target::Address { addr, len });
        }
        Err(SpecError::ForeignDataId(id.to_string()))
    }
}

/// An address, decimal or `0x` hex (what `asAddress` names carry).
pub fn parse_address(s: &str) -> Result<u64, SpecError> {
    let t = s.trim();
    let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => t.parse::<u64>(),
    };
    r.map_err(|_| SpecError::NotAnAddress(s.to_string()))
}

/// Debug-register slots a range takes per thread: its aligned pieces of 1,
/// 2, 4 or 8 bytes (the daemon's own split, for early answers).
pub fn slots_needed(addr: u64, len: u64) -> usize {
    let (mut at, end, mut n) = (addr, addr.saturating_add(len), 0);
    while at < end {
        let mut size = 8;
        while size > 1 && (!at.is_multiple_of(size) || at + size > end) {
            size /= 2;
        }
        at += size;
        n += 1;
    }
    n
}

/// A DAP `condition` as the daemon's [`HitCondition`]: what
/// `wpctl --condition` takes (`== 42`, `< -1`, `>= -273.15`, `== DONE`,
/// `&0xff != 0`, `changed`), optionally after the watched name or `value`
/// (`x == 10`, as lldb's tests write it). The daemon reads the value as the
/// watched variable's type; a target of no type (`typed` false: watched by
/// address) compares its `size` bytes unsigned, so a negative number for
/// `==`/`!=` is taken there as its two's complement in those bytes.
pub fn condition(
    text: &str,
    name: Option<&str>,
    size: u64,
    typed: bool,
) -> Result<HitCondition, SpecError> {
    let t = text.trim();
    let rest = strip_subject(t, name);
    if !typed
        && let Some((op, v)) = [("==", Op::Eq), ("!=", Op::Ne)]
            .iter()
            .find_map(|(sym, op)| rest.strip_prefix(sym).map(|v| (*op, v.trim())))
        && let Some(neg) = v.strip_prefix('-')
    {
        let n = wpd_proto::condition::parse_number(neg.trim()).map_err(|e| syntax(text, &e))?;
        let bits = (size.clamp(1, 8) * 8) as u32;
        let mask = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let operand = n.wrapping_neg() & mask;
        return Ok(HitCondition {
            op: op as i32,
            operand,
            mask: 0,
            value: format!("{operand:#x}"),
        });
    }
    wpd_proto::condition::parse(rest).map_err(|e| syntax(text, &e))
}

fn syntax(text: &str, e: &str) -> SpecError {
    SpecError::Condition {
        text: text.to_string(),
        why: e.to_string(),
    }
}

/// `rest` without a leading subject (`value`, or the watched name).
fn strip_subject<'a>(t: &'a str, name: Option<&str>) -> &'a str {
    let ident_end = t
        .find(|c: char| !(c.is_alphanumeric() || "_.:[]".contains(c)))
        .unwrap_or(t.len());
    let (head, tail) = t.split_at(ident_end);
    let base = |n: &str| n.rsplit(':').next().unwrap_or(n).to_string();
    if !head.is_empty()
        && !head.eq_ignore_ascii_case("changed")
        && !head.starts_with(|c: char| c.is_ascii_digit())
        && (head == "value" || name.is_some_and(|n| head == n || head == base(n)))
    {
        return tail.trim_start();
    }
    t
}

/// What a DAP `hitCondition` asks of the daemon: hits to skip first, then
/// every how many to stop at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HitCount {
    /// Skip the first N hits (whose condition held).
    pub ignore: u64,
    /// Then stop at every Nth (0: every one).
    pub every: u64,
}

/// A DAP `hitCondition`: `N` or `>= N` (stop at the Nth hit and after),
/// `> N` (after the Nth), `% N` (every Nth).
pub fn hit_condition(text: &str) -> Result<HitCount, SpecError> {
    let t = text.trim();
    let num = |s: &str| {
        wpd_proto::condition::parse_number(s.trim())
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| SpecError::HitCondition(text.to_string()))
    };
    if let Some(r) = t.strip_prefix(">=") {
        return Ok(HitCount {
            ignore: num(r)? - 1,
            every: 0,
        });
    }
    if let Some(r) = t.strip_prefix('>') {
        return Ok(HitCount {
            ignore: num(r)?,
            every: 0,
        });
    }
    if let Some(r) = t.strip_prefix('%') {
        // The daemon reports hit n when (n - ignore) is a multiple of every.
        return Ok(HitCount {
            ignore: 0,
            every: num(r)?,
        });
    }
    let r = t.strip_prefix("==").unwrap_or(t);
    Ok(HitCount {
        ignore: num(r)? - 1,
        every: 0,
    })
}

/// The register whose bits are the flags (as the daemon names it).
pub const FLAGS_REGISTER: &str = "eflags";

/// The status and control flags of `eflags`: name, bit, meaning (Intel
/// SDM Vol. 1, 3.4.3 "EFLAGS Register", Figure 3-8).
pub const FLAGS: [(&str, u32, &str); 9] = [
    ("CF", 0, "carry"),
    ("PF", 2, "parity"),
    ("AF", 4, "auxiliary carry"),
    ("ZF", 6, "zero"),
    ("SF", 7, "sign"),
    ("TF", 8, "trap"),
    ("IF", 9, "interrupt enable"),
    ("DF", 10, "direction"),
    ("OF", 11, "overflow"),
];

/// An `eflags` value: hex, then the flags set (`0x246 [PF ZF IF]`).
pub fn show_flags(value: u64) -> String {
    let set: Vec<&str> = FLAGS
        .iter()
        .filter(|&&(_, bit, _)| value >> bit & 1 == 1)
        .map(|&(name, _, _)| name)
        .collect();
    format!("{value:#x} [{}]", set.join(" "))
}

/// Watched bytes as their type reads them, when the daemon gave the type
/// (`t`, the watchpoint's or the symbol's `value_type`, covering exactly
/// these bytes): `-2 (0xfffffffe)`, `-273.15`, `true`, `DONE (2)`,
/// `0x1000 <g_table>` (`name`: the daemon's name for the value, an
/// enumerator or the symbol a pointer points into); else by the type's
/// name ([`show_value`]).
pub fn show_typed(t: Option<&pb::ValueType>, type_name: &str, bytes: &[u8], name: &str) -> String {
    use wpd_proto::value::{Typed, le_u64, typed};
    let t =
        t.filter(|t| t.kind != pb::ValueKind::Unspecified as i32 && t.size as usize == bytes.len());
    let Some(v) = t.and_then(|t| typed(t.kind, bytes)) else {
        return show_value(type_name, bytes);
    };
    let raw = le_u64(bytes).unwrap_or(0);
    let enumerator = t
        .filter(|t| t.enumeration)
        .and_then(|t| {
            let n = match v {
                Typed::Signed(n) => n,
                _ => raw as i64,
            };
            t.enumerators.iter().find(|e| e.value == n)
        })
        .map(|e| e.name.as_str())
        .unwrap_or(name);
    let name = wpd_proto::text::escape(enumerator);
    match v {
        Typed::Pointer(_) if name.is_empty() => v.to_string(),
        Typed::Pointer(_) => format!("{v} <{name}>"),
        Typed::Float(_) | Typed::Bool(_) => v.to_string(),
        _ if name.is_empty() => format!("{v} ({raw:#x})"),
        _ => format!("{name} ({v})"),
    }
}

/// Watched bytes as a person reads them: integers by their C type (signed
/// unless the type says unsigned; with hex), floats, pointers in hex, and
/// other things as bytes.
pub fn show_value(type_name: &str, bytes: &[u8]) -> String {
    // Qualifiers change nothing of how the bytes read.
    let unqualified: Vec<&str> = type_name
        .split_whitespace()
        .filter(|w| !matches!(*w, "const" | "volatile" | "_Atomic"))
        .collect();
    let unqualified = unqualified.join(" ");
    let t = unqualified.as_str();
    let n = bytes.len();
    if n == 0 {
        return "(nothing read)".into();
    }
    let unsigned = || {
        let mut b = [0u8; 8];
        b[..n.min(8)].copy_from_slice(&bytes[..n.min(8)]);
        u64::from_le_bytes(b)
    };
    if t.ends_with('*') && n == 8 {
        return format!("{:#x}", unsigned());
    }
    if (t == "float" && n == 4) || (t == "double" && n == 8) {
        return if n == 4 {
            f32::from_le_bytes(bytes.try_into().expect("4 bytes")).to_string()
        } else {
            f64::from_le_bytes(bytes.try_into().expect("8 bytes")).to_string()
        };
    }
    if t == "_Bool" || t == "bool" {
        return (unsigned() != 0).to_string();
    }
    let integer = [
        "char",
        "short",
        "int",
        "long",
        "int8_t",
        "int16_t",
        "int32_t",
        "int64_t",
        "size_t",
        "ssize_t",
        "uint8_t",
        "uint16_t",
        "uint32_t",
        "uint64_t",
        "intptr_t",
        "uintptr_t",
    ];
    let is_int = t.is_empty()
        || t.split_whitespace()
            .any(|w| integer.contains(&w) || w == "unsigned" || w == "signed");
    if is_int && matches!(n, 1 | 2 | 4 | 8) {
        let u = unsigned();
        let signed_type = !(t.contains("unsigned") || t.starts_with("uint") || t == "size_t");
        if signed_type && !t.is_empty() {
            let shift = 64 - 8 * n as u32;
            let s = ((u << shift) as i64) >> shift;
            return format!("{s} ({u:#x})");
        }
        return format!("{u} ({u:#x})");
    }
    let hex: Vec<String> = bytes.iter().take(64).map(|b| format!("{b:02x}")).collect();
    let more = if n > 64 { " …" } else { "" };
    format!("[{}{more}]", hex.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_named() {
        assert_eq!(show_flags(0x246), "0x246 [PF ZF IF]");
        assert_eq!(show_flags(0x2), "0x2 []");
    }

    #[test]
    fn data_ids_round_trip_and_foreign_ones_are_refused() {
        for t in [
            Target::Name("libx.so:stats.flags[2]".into()),
            Target::Address {
                addr: 0x5555_0000_1008,
                len: 8,
            },
        ] {
            assert_eq!(Target::parse(&t.data_id()).unwrap(), t);
        }
        for bad in [
            "",
            "name:",
            "addr:0x10",
            "addr:0x10/0",
            "55E4971DD080/8",
            "x",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn slots_follow_alignment() {
        assert_eq!(slots_needed(0x1000, 8), 1);
        assert_eq!(slots_needed(0x1000, 4), 1);
        assert_eq!(slots_needed(0x1001, 4), 3); // 1 + 2 + 1
        assert_eq!(slots_needed(0x1000, 32), 4);
        assert_eq!(slots_needed(0x1000, 33), 5);
        assert_eq!(slots_needed(0x1003, 5), 2); // 1 + 4
    }

    #[test]
    fn conditions_take_a_subject_and_typed_values() {
        let c = |s: &str, typed| {
            condition(s, Some("x"), 4, typed).map(|c| (c.op, c.operand, c.mask, c.value))
        };
        let v = |s: &str| s.to_string();
        assert_eq!(c("== 10", true), Ok((Op::Eq as i32, 10, 0, v("10"))));
        assert_eq!(c("x==10", true), Ok((Op::Eq as i32, 10, 0, v("10"))));
        assert_eq!(
            c("value >= 0x10", true),
            Ok((Op::Ge as i32, 16, 0, v("0x10")))
        );
        assert_eq!(c("&0xff == 3", true), Ok((Op::Eq as i32, 3, 0xff, v("3"))));
        assert_eq!(c("changed", true), Ok((Op::Changed as i32, 0, 0, v(""))));
        // Typed: as written, for the daemon to read as the type.
        assert_eq!(c("x != -1", true), Ok((Op::Ne as i32, 0, 0, v("-1"))));
        assert_eq!(c("x < -1", true), Ok((Op::Lt as i32, 0, 0, v("-1"))));
        assert_eq!(c("x >= -2.5", true), Ok((Op::Ge as i32, 0, 0, v("-2.5"))));
        assert_eq!(c("x == DONE", true), Ok((Op::Eq as i32, 0, 0, v("DONE"))));
        // By address, no type: two's complement in the watched bytes.
        assert_eq!(
            c("x != -1", false),
            Ok((Op::Ne as i32, 0xffff_ffff, 0, v("0xffffffff")))
        );
        assert_eq!(
            condition("libx.so:x == 1", Some("libx.so:x"), 8, true)
                .unwrap()
                .operand,
            1
        );
        for bad in ["y == 1", "x = 1", "x == a.b", ""] {
            let e = c(bad, true).unwrap_err().to_string();
            assert!(e.contains("Conditions compare"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn hit_conditions() {
        let h = |s: &str| hit_condition(s).map(|h| (h.ignore, h.every));
        assert_eq!(h("2"), Ok((1, 0)));
        assert_eq!(h(">= 3"), Ok((2, 0)));
        assert_eq!(h("== 1"), Ok((0, 0)));
        assert_eq!(h("> 3"), Ok((3, 0)));
        assert_eq!(h("%4"), Ok((0, 4)));
        for bad in ["0", "x", "% 0", "<3", ""] {
            assert!(h(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn values_by_type() {
        assert_eq!(show_value("int", &(-2i32).to_le_bytes()), "-2 (0xfffffffe)");
        assert_eq!(show_value("unsigned int", &7u32.to_le_bytes()), "7 (0x7)");
        assert_eq!(show_value("long", &42i64.to_le_bytes()), "42 (0x2a)");
        assert_eq!(show_value("", &5u16.to_le_bytes()), "5 (0x5)");
        assert_eq!(show_value("double", &1.5f64.to_le_bytes()), "1.5");
        assert_eq!(show_value("char *", &0x1000u64.to_le_bytes()), "0x1000");
        assert_eq!(show_value("_Bool", &[1]), "true");
        assert_eq!(show_value("struct stats", &[1, 2, 0xff]), "[01 02 ff]");
        assert_eq!(show_value("int", &[]), "(nothing read)");
        assert_eq!(show_value("volatile double", &1.5f64.to_le_bytes()), "1.5");
        assert_eq!(
            show_value("const volatile int", &(-3i32).to_le_bytes()),
            "-3 (0xfffffffd)"
        );
    }

    #[test]
    fn values_by_the_daemon_s_type() {
        let t = |kind: pb::ValueKind, size: u32| pb::ValueType {
            kind: kind as i32,
            size,
            ..Default::default()
        };
        let state = pb::ValueType {
            enumeration: true,
            enumerators: vec![
                pb::Enumerator {
                    name: "IDLE".into(),
                    value: 0,
                },
                pb::Enumerator {
                    name: "DONE".into(),
                    value: 2,
                },
            ],
            ..t(pb::ValueKind::Unsigned, 4)
        };
        let show = |ty: &pb::ValueType, b: &[u8], name: &str| show_typed(Some(ty), "", b, name);
        assert_eq!(
            show(&t(pb::ValueKind::Signed, 8), &(-1i64).to_le_bytes(), ""),
            "-1 (0xffffffffffffffff)"
        );
        assert_eq!(
            show(&t(pb::ValueKind::Float, 8), &(-273.15f64).to_le_bytes(), ""),
            "-273.15"
        );
        assert_eq!(
            show(&t(pb::ValueKind::Float, 4), &3.5f32.to_le_bytes(), ""),
            "3.5"
        );
        assert_eq!(show(&t(pb::ValueKind::Bool, 1), &[1], ""), "true");
        assert_eq!(show(&state, &2u32.to_le_bytes(), ""), "DONE (2)");
        assert_eq!(show(&state, &7u32.to_le_bytes(), ""), "7 (0x7)");
        assert_eq!(
            show(
                &t(pb::ValueKind::Pointer, 8),
                &0x1000u64.to_le_bytes(),
                "g_table"
            ),
            "0x1000 <g_table>"
        );
        // Another size than the type's (a piece): by the type's name.
        assert_eq!(
            show(&t(pb::ValueKind::Signed, 8), &[0xff], ""),
            "255 (0xff)"
        );
        assert_eq!(
            show_typed(None, "int", &(-2i32).to_le_bytes(), ""),
            "-2 (0xfffffffe)"
        );
    }
}
