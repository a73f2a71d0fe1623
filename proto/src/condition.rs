//! Hit conditions written as text, the one syntax of `wpctl --condition`
//! and of the DAP adapter's breakpoint conditions. The right-hand side is
//! sent as written (`HitCondition.value`): the daemon reads it against the
//! watched variable's type (`-1` for an `int`, `-273.15` for a `double`,
//! `DONE` for an enumeration), and refuses what the type cannot take.

use crate::v1::HitCondition;
use crate::v1::hit_condition::Op;

/// A condition as `wpctl --condition` and the DAP adapter take it:
/// `changed`, or `[&MASK] OP VALUE` with OP one of `== != < <= > >=`, MASK
/// a number (decimal or 0x hex) and VALUE a number (`42`, `-1`, `0x10`,
/// `-273.15`, `1e6`, `inf`) or a name (`DONE`, `true`, `NULL`). The value
/// goes to the daemon as written; a value that is an unsigned number is
/// also its `operand`, which daemons that predate typed conditions read.
pub fn parse(s: &str) -> Result<HitCondition, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("changed") {
        return Ok(HitCondition {
            op: Op::Changed as i32,
            operand: 0,
            mask: 0,
            value: String::new(),
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
                "{s:?}: expected `changed` or OP VALUE, OP one of == != < <= > >= (e.g. '== 42', \
                 '< -1', '>= -273.15', '== DONE')"
            )
        })?;
    let value = literal(value).map_err(|e| format!("value: {e}"))?;
    Ok(HitCondition {
        op: op as i32,
        operand: parse_number(value).unwrap_or(0),
        mask,
        value: value.to_string(),
    })
}

/// `s` if it is one literal a condition can compare with: a number
/// (decimal or `0x` hex, a sign, a fraction, an exponent, `inf`) or a name
/// (letters, digits and `_`, not starting with a digit).
pub fn literal(s: &str) -> Result<&str, String> {
    let t = s.trim();
    let name = |w: &str| {
        w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let unsigned = t.strip_prefix(['-', '+']).unwrap_or(t);
    let number = unsigned.starts_with(|c: char| c.is_ascii_digit() || c == '.')
        && match unsigned
            .strip_prefix("0x")
            .or_else(|| unsigned.strip_prefix("0X"))
        {
            Some(h) => !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit() || c == '_'),
            None => unsigned.replace('_', "").parse::<f64>().is_ok(),
        };
    let infinite = ["inf", "infinity"]
        .iter()
        .any(|w| unsigned.eq_ignore_ascii_case(w));
    if t.is_empty() {
        Err("missing: a number (42, -1, 0x10, -273.15) or a name (DONE, true, NULL)".into())
    } else if number || infinite || (name(t) && t == unsigned) {
        Ok(t)
    } else {
        Err(format!(
            "{t:?} is neither a number (42, -1, 0x10, -273.15) nor a name (DONE, true, NULL)"
        ))
    }
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

/// A condition as `wpctl` shows it: `value & 0xff == 3`, `value < -1`,
/// `value == DONE`, `value changed` (the operand of a client that predates
/// typed conditions in hex above 9).
pub fn text(c: &HitCondition) -> String {
    let op = match Op::try_from(c.op) {
        Ok(Op::Changed) => return "value changed".into(),
        Ok(Op::Eq) => "==",
        Ok(Op::Ne) => "!=",
        Ok(Op::Lt) => "<",
        Ok(Op::Le) => "<=",
        Ok(Op::Gt) => ">",
        Ok(Op::Ge) => ">=",
        _ => "?",
    };
    let operand = if !c.value.is_empty() {
        crate::text::escape(&c.value).into_owned()
    } else if c.operand > 9 {
        format!("{:#x}", c.operand)
    } else {
        c.operand.to_string()
    };
    if c.mask == 0 {
        format!("value {op} {operand}")
    } else {
        format!("value & {:#x} {op} {operand}", c.mask)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `input` parses to (op, operand, mask, value), or fails with an
    /// error containing the expected text.
    fn check(input: &str, expected: Result<(Op, u64, u64, &str), &str>) {
        let got = parse(input);
        match (got, expected) {
            (Ok(c), Ok((op, operand, mask, value))) => assert_eq!(
                (c.op, c.operand, c.mask, c.value.as_str()),
                (op as i32, operand, mask, value),
                "{input:?}"
            ),
            (Err(e), Err(want)) => assert!(e.contains(want), "{input:?}: {e}"),
            (got, want) => panic!("{input:?}: got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn conditions_parse() {
        check("changed", Ok((Op::Changed, 0, 0, "")));
        check(" CHANGED ", Ok((Op::Changed, 0, 0, "")));
        check("== 42", Ok((Op::Eq, 42, 0, "42")));
        check(">=100", Ok((Op::Ge, 100, 0, "100")));
        check("!= 0x1_0", Ok((Op::Ne, 16, 0, "0x1_0")));
        check("&0xff == 3", Ok((Op::Eq, 3, 0xff, "3")));
        // Negative, fractional and named values go as written (no operand
        // an older daemon would misread as unsigned).
        check("< -1", Ok((Op::Lt, 0, 0, "-1")));
        check("== -1", Ok((Op::Eq, 0, 0, "-1")));
        check(">= -273.15", Ok((Op::Ge, 0, 0, "-273.15")));
        check("> 1e6", Ok((Op::Gt, 0, 0, "1e6")));
        check("<= .5", Ok((Op::Le, 0, 0, ".5")));
        check("< -inf", Ok((Op::Lt, 0, 0, "-inf")));
        check("== DONE", Ok((Op::Eq, 0, 0, "DONE")));
        check("!= true", Ok((Op::Ne, 0, 0, "true")));
        check("== NULL", Ok((Op::Eq, 0, 0, "NULL")));
        check("== MODE_RUN_2", Ok((Op::Eq, 0, 0, "MODE_RUN_2")));
        check("", Err("expected `changed` or OP VALUE"));
        check("= 1", Err("expected `changed` or OP VALUE"));
        check("==", Err("value: missing"));
        check("== 1 2", Err("neither a number"));
        check("== -DONE", Err("neither a number"));
        check("== 0xg", Err("neither a number"));
        check("== 4x", Err("neither a number"));
        check("== a.b", Err("neither a number"));
        check("&0 == 1", Err("a mask of 0"));
        check("&-1 == 1", Err("mask:"));
        check("&0xff", Err("a mask needs a comparison"));
    }

    #[test]
    fn conditions_read_back() {
        for (input, shown) in [
            ("changed", "value changed"),
            ("== 42", "value == 42"),
            ("&0xff != 3", "value & 0xff != 3"),
            ("< -273.15", "value < -273.15"),
            ("== DONE", "value == DONE"),
        ] {
            assert_eq!(text(&parse(input).unwrap()), shown, "{input:?}");
        }
        let legacy = HitCondition {
            op: Op::Gt as i32,
            operand: 100,
            mask: 0,
            value: String::new(),
        };
        assert_eq!(text(&legacy), "value > 0x64");
    }
}
