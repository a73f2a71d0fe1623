//! `wpctl unwatch`: remove a watchpoint and report its final hit count (RemoveWatchpoint).

use serde_json::json;
use wpd_proto::v1::RemoveWatchpointRequest;

use crate::cmd::{Ctx, Report};
use crate::error::Error;
use crate::{UnwatchArgs, output};

/// Runs `wpctl unwatch`: prints
/// `removed watchpoint 7 (write 8 bytes at 0x55d0c0a01040 in pid 123): 42 hits`.
pub async fn run(ctx: &Ctx, args: &UnwatchArgs) -> Result<(), Error> {
    report(ctx, args).await?.emit(ctx.json)
}

/// Asks the daemon and renders its answer.
pub async fn report(ctx: &Ctx, args: &UnwatchArgs) -> Result<Report, Error> {
    let id = args.id();
    let resp = ctx
        .unary(RemoveWatchpointRequest { id }, |mut c, r| async move {
            c.remove_watchpoint(r).await
        })
        .await?;
    let wp = resp.watchpoint.unwrap_or_default();
    let mut v = output::watchpoint_json(&wp);
    v["id"] = json!(id);
    let text = format!(
        "removed watchpoint {id} ({}): {}",
        output::describe(&wp),
        output::plural(wp.hits, "hit")
    );
    Ok(Report::new(text, json!({ "watchpoint": v })))
}
