//! `wpctl pause`: stop threads of a process and hold them until `wpctl
//! resume` (Pause).

use clap::Args;
use serde_json::json;
use wpd_proto::v1::PauseRequest;

use crate::args::pid_parser;
use crate::cmd::Ctx;
use crate::error::Error;
use crate::output;

/// `wpctl pause`.
#[derive(Debug, Args)]
pub struct PauseArgs {
    /// Process whose threads to stop
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
    /// Only these threads (repeat or comma-separate); default: every thread
    #[arg(long = "tid", value_name = "TID", value_delimiter = ',', value_parser = pid_parser())]
    pub tids: Vec<i32>,
}

/// Runs `wpctl pause`.
pub async fn run(ctx: &Ctx, args: &PauseArgs) -> Result<(), Error> {
    let request = PauseRequest {
        pid: args.pid,
        tids: args.tids.clone(),
        lease: 0,
    };
    let resp = ctx
        .unary(request, |mut c, r| async move { c.pause(r).await })
        .await?;
    if ctx.json {
        return output::emit_json(&json!({ "held": resp.held }));
    }
    output::emit(&format!(
        "holding {} of pid {}: {} (wpctl resume --pid {} lets them run)",
        output::plural(resp.held.len() as u64, "thread"),
        args.pid,
        output::id_list(&resp.held),
        args.pid
    ))
}
