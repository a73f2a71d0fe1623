//! `wpctl stack`: the call stack of a held thread (GetThreadStack).

use clap::Args;
use serde_json::json;
use wpd_proto::v1::GetThreadStackRequest;

use crate::args::pid_parser;
use crate::cmd::Ctx;
use crate::error::Error;
use crate::output;

/// `wpctl stack`.
#[derive(Debug, Args)]
pub struct StackArgs {
    /// Process
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
    /// A thread of it held stopped (after a hit with a stop action, or `wpctl pause`)
    #[arg(long, value_parser = pid_parser())]
    pub tid: i32,
    /// Frames to show, the innermost included
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=128))]
    pub depth: u32,
    /// Also print the thread's general registers where it is held
    #[arg(long)]
    pub registers: bool,
    /// Also print each frame's parameters and local variables (DWARF)
    #[arg(long)]
    pub locals: bool,
}

/// Runs `wpctl stack`: one line per frame, innermost first.
pub async fn run(ctx: &Ctx, args: &StackArgs) -> Result<(), Error> {
    let request = GetThreadStackRequest {
        pid: args.pid,
        tid: args.tid,
        depth: args.depth,
        raw: false,
        locals: args.locals,
    };
    let resp = ctx
        .unary(
            request,
            |mut c, r| async move { c.get_thread_stack(r).await },
        )
        .await?;
    if ctx.json {
        return output::emit_json(&json!({
            "frames": resp.frames.iter().map(output::location_json).collect::<Vec<_>>(),
            "note": resp.note,
            "sp": output::hex(resp.sp),
            "fp": output::hex(resp.fp),
            "locals": resp.locals.iter().map(|f| json!({
                "variables": f.variables.iter().map(|v| json!({
                    "name": v.name,
                    "type": v.r#type,
                    "parameter": v.parameter,
                    "address": (v.address != 0).then(|| output::hex(v.address)),
                    "value": output::hex_bytes(&v.value),
                    "value_le": output::le_value(&v.value),
                    "error": (!v.error.is_empty()).then(|| v.error.clone()),
                })).collect::<Vec<_>>(),
                "note": (!f.note.is_empty()).then(|| f.note.clone()),
            })).collect::<Vec<_>>(),
            "registers": resp
                .registers
                .iter()
                .map(|r| (r.name.clone(), json!(output::hex(r.value))))
                .collect::<serde_json::Map<_, _>>(),
        }));
    }
    let mut text = String::new();
    for (i, f) in resp.frames.iter().enumerate() {
        text.push_str(&format!("#{i:<2} {}\n", output::location_text(f)));
        // `    long v = 42 (0x2a)`, or why it cannot be read.
        if let Some(frame) = resp.locals.get(i) {
            use wpd_proto::text::escape;
            for v in &frame.variables {
                let value = if v.error.is_empty() {
                    match output::le_value(&v.value) {
                        Some(n) => format!("{n} ({n:#x})"),
                        None => output::hex_bytes(&v.value),
                    }
                } else {
                    format!("<{}>", escape(&v.error))
                };
                text.push_str(&format!(
                    "    {}{} {} = {value}\n",
                    if v.parameter { "(param) " } else { "" },
                    escape(&v.r#type),
                    escape(&v.name)
                ));
            }
            if !frame.note.is_empty() {
                text.push_str(&format!("    ({})\n", escape(&frame.note)));
            }
        }
    }
    if !resp.note.is_empty() {
        text.push_str(&format!("({})\n", wpd_proto::text::escape(&resp.note)));
    }
    if args.registers {
        // Three to a line: `rax 0x0000000000000001  rbx …`.
        for row in resp.registers.chunks(3) {
            let cells: Vec<String> = row
                .iter()
                .map(|r| format!("{:<6} {:#018x}", wpd_proto::text::escape(&r.name), r.value))
                .collect();
            text.push_str(&format!("{}\n", cells.join("  ")));
        }
    }
    output::emit(text.trim_end())
}
