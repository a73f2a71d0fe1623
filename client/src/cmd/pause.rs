//! `wpctl pause`: stop threads of a process and hold them until `wpctl
//! resume` (Pause).

use serde_json::json;
use wpd_proto::v1::PauseRequest;

use crate::cmd::Ctx;
use crate::error::Error;
use crate::{PauseArgs, output};

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
