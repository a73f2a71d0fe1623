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
}

/// Runs `wpctl stack`: one line per frame, innermost first.
pub async fn run(ctx: &Ctx, args: &StackArgs) -> Result<(), Error> {
    let request = GetThreadStackRequest {
        pid: args.pid,
        tid: args.tid,
        depth: args.depth,
        raw: false,
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
