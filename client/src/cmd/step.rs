//! `wpctl step`: steps a held thread (Step) and prints where it stopped,
//! with its source line when the file is readable here.

use clap::Args;
use serde_json::json;
use wpd_proto::v1::{StepEnd, StepKind, StepRequest};

use crate::args::pid_parser;
use crate::cmd::Ctx;
use crate::error::Error;
use crate::output;

/// `wpctl step`.
#[derive(Debug, Args)]
pub struct StepArgs {
    /// Process
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
    /// A thread of it held stopped (after a hit with a stop action, a code breakpoint, `wpctl pause`, or a step)
    #[arg(long, value_parser = pid_parser())]
    pub tid: i32,
    /// To the next line of the function, calls run through (the default)
    #[arg(long, group = "kind")]
    pub over: bool,
    /// To the next line, entering a call whose function has line information
    #[arg(long, group = "kind")]
    pub into: bool,
    /// Until the function returns: held in the caller, after the call
    #[arg(long, group = "kind")]
    pub out: bool,
    /// One machine instruction (into a call)
    #[arg(long, group = "kind")]
    pub instruction: bool,
    /// The process's other held threads run during the step and are held again where it ends (as at a stop-all hit); otherwise they stay as they are
    #[arg(long)]
    pub all_threads: bool,
    /// Frames of the new stack to print
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=128))]
    pub depth: u32,
}

fn end_name(e: i32) -> &'static str {
    match StepEnd::try_from(e) {
        Ok(StepEnd::Done) => "done",
        Ok(StepEnd::Hit) => "a data breakpoint hit (held there)",
        Ok(StepEnd::Breakpoint) => "a code breakpoint (held there)",
        Ok(StepEnd::Interrupted) => "interrupted by a pause or another thread's stop",
        Ok(StepEnd::Exec) => "the process called exec",
        Ok(StepEnd::Exited) => "the thread exited",
        _ => "unknown",
    }
}

/// Line `n` (1-based) of `file`, if this host can read it.
fn source_line(file: &str, n: u32) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    let line = text.lines().nth(n.checked_sub(1)? as usize)?;
    Some(wpd_proto::text::escape(line.trim_end()).into_owned())
}

/// Runs `wpctl step`.
pub async fn run(ctx: &Ctx, args: &StepArgs) -> Result<(), Error> {
    let kind = if args.into {
        StepKind::Into
    } else if args.out {
        StepKind::Out
    } else if args.instruction {
        StepKind::Instruction
    } else {
        StepKind::Line
    };
    let request = StepRequest {
        pid: args.pid,
        tid: args.tid,
        kind: kind as i32,
        others_run: args.all_threads,
        depth: args.depth,
    };
    let resp = ctx
        .unary(request, |mut c, r| async move { c.step(r).await })
        .await?;
    if ctx.json {
        return output::emit_json(&json!({
            "end": end_name(resp.end),
            "frames": resp.frames.iter().map(output::location_json).collect::<Vec<_>>(),
            "signals": resp.signals,
            "note": (!resp.note.is_empty()).then(|| resp.note.clone()),
            "legs": resp.legs,
        }));
    }
    let mut text = String::new();
    if resp.end != StepEnd::Done as i32 {
        text.push_str(&format!("step ended: {}\n", end_name(resp.end)));
    }
    for (i, f) in resp.frames.iter().enumerate() {
        text.push_str(&format!("#{i:<2} {}\n", output::location_text(f)));
        if i == 0
            && f.line > 0
            && let Some(src) = source_line(&f.file, f.line)
        {
            text.push_str(&format!("{:>6}  {src}\n", f.line));
        }
        if i == 0 && f.line == 0 {
            text.push_str(&format!("       at {}\n", output::hex(f.ip)));
        }
    }
    if !resp.signals.is_empty() {
        text.push_str(&format!(
            "signals delivered meanwhile: {:?}\n",
            resp.signals
        ));
    }
    if !resp.note.is_empty() {
        text.push_str(&format!("({})\n", wpd_proto::text::escape(&resp.note)));
    }
    output::emit(text.trim_end())
}
