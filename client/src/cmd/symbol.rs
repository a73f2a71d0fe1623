//! `wpctl symbol`: what a name is in a process, or what is at an address
//! (ResolveSymbol).

use clap::Args;
use serde_json::json;
use wpd_proto::v1::{ResolveSymbolRequest, ResolveSymbolResponse};

use crate::args::{parse_addr, pid_parser};
use crate::cmd::Ctx;
use crate::error::Error;
use crate::output::{self, hex};
use wpd_proto::text::escape;

/// `wpctl symbol`.
#[derive(Debug, Args)]
pub struct SymbolArgs {
    /// Process
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
    /// An expression (`[MODULE:]NAME[.MEMBER][->MEMBER][[INDEX]][+OFFSET]`, `&X`, `*P`, casts
    /// `(struct T *)0x…`) or an address (0x…)
    #[arg(value_name = "NAME|ADDR")]
    pub what: String,
    /// A thread held stopped: the expression may start from a parameter or local variable of
    /// its frame --frame (`wpctl stack --locals` lists them)
    #[arg(long, value_parser = pid_parser())]
    pub tid: Option<i32>,
    /// The frame of --tid (0: the innermost)
    #[arg(long, default_value_t = 0, requires = "tid", value_parser = clap::value_parser!(u32).range(0..=127))]
    pub frame: u32,
}

/// Runs `wpctl symbol`.
pub async fn run(ctx: &Ctx, args: &SymbolArgs) -> Result<(), Error> {
    let what = args.what.trim();
    let by_address = what.starts_with("0x") || what.starts_with("0X");
    let request = ResolveSymbolRequest {
        pid: args.pid,
        name: if by_address {
            String::new()
        } else {
            what.to_string()
        },
        address: if by_address {
            parse_addr(what).map_err(|e| Error::Local(format!("bad address {what:?}: {e}")))?
        } else {
            0
        },
        tid: if by_address { 0 } else { args.tid.unwrap_or(0) },
        frame: args.frame,
    };
    let resp = ctx
        .unary(request, |mut c, r| async move { c.resolve_symbol(r).await })
        .await?;
    if ctx.json {
        let kind = value_kind(&resp);
        let read = !resp.value.is_empty();
        output::emit_json(&json!({
            "symbol": resp.symbol.as_ref().map(output::symbol_json),
            "location": resp.location.as_ref().map(output::location_json),
            "kind": resp.kind,
            "offset": resp.offset,
            "value": read.then(|| output::hex_bytes(&resp.value)),
            "value_typed": if read { output::typed_json(kind, &resp.value) } else { serde_json::Value::Null },
            "value_name": (!resp.value_name.is_empty()).then_some(&resp.value_name),
            "value_error": (!resp.value_error.is_empty()).then_some(&resp.value_error),
        }))
    } else {
        output::emit(&to_text(&resp, by_address))
    }
}

/// How the answer's value reads: its symbol's value type's kind, when the
/// value is exactly an object of that type (0: no type).
fn value_kind(r: &ResolveSymbolResponse) -> i32 {
    r.symbol
        .as_ref()
        .and_then(|s| s.value_type.as_ref())
        .filter(|t| t.size as usize == r.value.len())
        .map_or(0, |t| t.kind)
}

/// A value as its type reads it (`-1 (0xffffffffffffffff)`, `-273.15
/// (0xc071…)`, `DONE (0x2)`, `0x55… <g_table+16>`, `42 (0x2a)` with no
/// type); larger than 8 bytes, in memory order.
fn value_text(r: &ResolveSymbolResponse) -> String {
    wpd_proto::value::show(value_kind(r), &r.value, &r.value_name)
}

/// For a name: `stats.errors: int, 4 bytes at 0x55…c128 in ct-pie
/// (0x4128, DWARF)`; for an address: the symbol holding it and, for code,
/// its source line.
fn to_text(r: &ResolveSymbolResponse, by_address: bool) -> String {
    let mut lines = Vec::new();
    match (&r.symbol, by_address) {
        (Some(s), false) if r.kind == "value" => {
            lines.push(format!(
                "{} = {} ({}, a value: nothing in memory to watch)",
                escape(&s.expression),
                wpd_proto::value::short(value_kind(r), &r.value, &r.value_name),
                escape(&s.type_name)
            ));
        }
        (Some(s), false) => {
            let mut head = format!("{}: ", escape(&s.expression));
            if !s.type_name.is_empty() {
                head.push_str(&format!("{}, ", escape(&s.type_name)));
            }
            head.push_str(&format!(
                "{} at {} in {} ({} in the module, {})",
                output::plural(s.size, "byte"),
                hex(s.address),
                escape(output::file_name(&s.module)),
                hex(s.module_address),
                output::source_name(s.source)
            ));
            if r.kind == "function" {
                head.push_str(" [function: watch it with --access exec]");
            }
            lines.push(head);
            // Its value now, as gdb's `print` shows it.
            if !r.value.is_empty() {
                lines.push(format!("{} = {}", escape(&s.expression), value_text(r)));
            } else if !r.value_error.is_empty() {
                lines.push(format!(
                    "{}: value not read: {}",
                    escape(&s.expression),
                    escape(&r.value_error)
                ));
            }
            if !s.note.is_empty() {
                lines.push(format!("note: {}", escape(&s.note)));
            }
        }
        (Some(s), true) => lines.push(format!(
            "{} {}+{:#x} ({}, {} at {})",
            escape(&r.kind),
            escape(&s.name),
            r.offset,
            escape(output::file_name(&s.module)),
            output::plural(s.size, "byte"),
            hex(s.address)
        )),
        (None, true) => lines.push("no symbol holds this address".into()),
        (None, false) => {}
    }
    if let Some(l) = &r.location {
        if l.line > 0 {
            lines.push(format!("at {}", output::location_text(l)));
        } else if !l.module.is_empty() && r.symbol.is_none() {
            lines.push(format!(
                "in {} at {}",
                escape(output::file_name(&l.module)),
                hex(l.module_address)
            ));
        }
        if !l.build_id.is_empty() {
            lines.push(format!(
                "build id {}{}",
                output::hex_bytes(&l.build_id),
                if l.has_file_offset {
                    format!(", file offset {:#x}", l.file_offset)
                } else {
                    String::new()
                }
            ));
        }
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use wpd_proto::v1::{Symbol, ValueKind, ValueType};

    fn variable(
        kind: ValueKind,
        type_name: &str,
        value: Vec<u8>,
        name: &str,
    ) -> ResolveSymbolResponse {
        ResolveSymbolResponse {
            symbol: Some(Symbol {
                expression: "x".into(),
                name: "x".into(),
                module: "/t/ct-typed".into(),
                address: 0x4010,
                size: value.len() as u64,
                type_name: type_name.into(),
                module_address: 0x4010,
                value_type: Some(ValueType {
                    kind: kind as i32,
                    size: value.len() as u32,
                    name: type_name.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            kind: "variable".into(),
            value,
            value_name: name.into(),
            ..Default::default()
        }
    }

    /// The second line of `wpctl symbol x`: its value now.
    fn check(r: ResolveSymbolResponse, expected: &str) {
        let text = to_text(&r, false);
        assert_eq!(text.lines().nth(1), Some(expected), "{text}");
    }

    #[test]
    fn variables_show_their_value_as_their_type_reads_it() {
        use ValueKind::*;
        check(
            variable(Signed, "volatile long", (-1i64).to_le_bytes().to_vec(), ""),
            "x = -1 (0xffffffffffffffff)",
        );
        check(
            variable(
                Float,
                "volatile double",
                (-273.15f64).to_le_bytes().to_vec(),
                "",
            ),
            "x = -273.15 (0xc071126666666666)",
        );
        check(
            variable(Float, "float", 3.5f32.to_le_bytes().to_vec(), ""),
            "x = 3.5 (0x40600000)",
        );
        check(variable(Bool, "_Bool", vec![1], ""), "x = true (0x1)");
        check(
            variable(Unsigned, "enum state", 2u32.to_le_bytes().to_vec(), "DONE"),
            "x = DONE (0x2)",
        );
        check(
            variable(
                Pointer,
                "long *",
                0x4020u64.to_le_bytes().to_vec(),
                "table+8",
            ),
            "x = 0x4020 <table+8>",
        );
        // No DWARF type: unsigned.
        let mut r = variable(Signed, "", (-1i32).to_le_bytes().to_vec(), "");
        r.symbol.as_mut().unwrap().value_type = None;
        check(r, "x = 4294967295 (0xffffffff)");
        let mut r = variable(Signed, "long", Vec::new(), "");
        r.value_error = "unreadable".into();
        check(r, "x: value not read: unreadable");
    }
}
