//! `wpctl detach`: remove a process's watchpoints and stop tracking it (Detach).

use clap::Args;
use serde_json::json;
use wpd_proto::v1::DetachRequest;

use crate::args::pid_parser;
use crate::cmd::Ctx;
use crate::error::Error;
use crate::output;

/// `wpctl detach`.
#[derive(Debug, Args)]
pub struct DetachArgs {
    /// Process to detach from
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
}

/// Runs `wpctl detach`: prints
/// `detached pid 123: removed 2 watchpoints, released 1001 threads`.
pub async fn run(ctx: &Ctx, args: &DetachArgs) -> Result<(), Error> {
    let resp = ctx
        .unary(DetachRequest { pid: args.pid }, |mut c, r| async move {
            c.detach(r).await
        })
        .await?;
    if ctx.json {
        output::emit_json(&json!({
            "pid": args.pid,
            "watchpoints_removed": resp.watchpoints_removed,
            "threads_released": resp.threads_released,
        }))
    } else {
        output::emit(&format!(
            "detached pid {}: removed {}, released {}",
            args.pid,
            output::plural(resp.watchpoints_removed, "watchpoint"),
            output::plural(resp.threads_released, "thread"),
        ))
    }
}
