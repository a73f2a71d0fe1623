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
        output::emit_json(&json!({
            "symbol": resp.symbol.as_ref().map(output::symbol_json),
            "location": resp.location.as_ref().map(output::location_json),
            "kind": resp.kind,
            "offset": resp.offset,
            "value": (resp.kind == "value").then(|| output::hex_bytes(&resp.value)),
        }))
    } else {
        output::emit(&to_text(&resp, by_address))
    }
}

/// A value as C would print it: a pointer in hex, an integer in decimal
/// (signed unless its type says unsigned), anything else as bytes.
fn value_text(type_name: &str, bytes: &[u8]) -> String {
    let t = type_name.trim();
    let Some(v) = output::le_value(bytes).filter(|_| (1..=8).contains(&bytes.len())) else {
        return output::hex_bytes(bytes);
    };
    if t.ends_with('*') {
        return hex(v);
    }
    if t == "float" || t == "double" || t.ends_with(" double") {
        return format!("bytes {}", output::hex_bytes(bytes));
    }
    let unsigned = t.contains("unsigned") || t.starts_with("uint") || t == "size_t" || t == "_Bool";
    if unsigned {
        return v.to_string();
    }
    let width = bytes.len() as u32 * 8;
    let signed = if width == 64 {
        v as i64
    } else {
        ((v << (64 - width)) as i64) >> (64 - width)
    };
    signed.to_string()
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
                value_text(&s.type_name, &r.value),
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
