//! Hit conditions written as text, the one syntax of `wpctl --condition`
//! and of the DAP adapter's breakpoint conditions.

use crate::v1::HitCondition;
use crate::v1::hit_condition::Op;

/// A condition as `wpctl --condition` and the DAP adapter take it:
/// `changed`, or `[&MASK] OP VALUE` with OP one of `== != < <= > >=` and
/// numbers decimal or 0x hex (e.g. `== 42`, `&0xff != 0`).
pub fn parse(s: &str) -> Result<HitCondition, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("changed") {
        return Ok(HitCondition {
            op: Op::Changed as i32,
            operand: 0,
            mask: 0,
        });
    }
    let (mask, rest) = match t.strip_prefix('&') {
        Some(r) => {
            let end = r
                .find(|c: char| "=!<>".contains(c))
                .ok_or_else(|| format!("{s:?}: a mask needs a comparison after it (&0xff == 3)"))?;
            let m = parse_number(r[..end].trim()).map_err(|e| format!("mask: {e}"))?;
            if m == 0 {
                return Err("a mask of 0 compares nothing".into());
            }
            (m, r[end..].trim())
        }
        None => (0, t),
    };
    let ops = [
        ("==", Op::Eq),
        ("!=", Op::Ne),
        ("<=", Op::Le),
        (">=", Op::Ge),
        ("<", Op::Lt),
        (">", Op::Gt),
    ];
    let (op, value) = ops
        .iter()
        .find_map(|(sym, op)| rest.strip_prefix(sym).map(|v| (*op, v.trim())))
        .ok_or_else(|| {
            format!(
                "{s:?}: expected `changed` or OP VALUE, OP one of == != < <= > >= (e.g. '== 42')"
            )
        })?;
    let operand = parse_number(value).map_err(|e| format!("value: {e}"))?;
    Ok(HitCondition {
        op: op as i32,
        operand,
        mask,
    })
}

/// An unsigned number, decimal or `0x` hex, `_` allowed between digits.
pub fn parse_number(s: &str) -> Result<u64, String> {
    let t = s.replace('_', "");
    let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => t.parse::<u64>(),
    };
    r.map_err(|_| format!("{s:?} is not an unsigned number (decimal, or hex with 0x)"))
}
