//! `wpctl last`: a watchpoint's last hits as the daemon kept them
//! (GetRecentHits), one line each as `wpctl events` prints them.

use clap::Args;
use serde_json::json;
use wpd_proto::v1::GetRecentHitsRequest;

use crate::cmd::Ctx;
use crate::error::Error;
use crate::output;

/// `wpctl last`.
#[derive(Debug, Args)]
pub struct LastArgs {
    /// Watchpoint
    #[arg(value_name = "ID")]
    pub id: u64,
    /// Only the last N of those kept
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: Option<u32>,
    /// Leave the hits unsymbolized
    #[arg(long)]
    pub raw: bool,
}

/// Runs `wpctl last`: oldest first, then how many there were in all.
pub async fn run(ctx: &Ctx, args: &LastArgs) -> Result<(), Error> {
    let request = GetRecentHitsRequest {
        watchpoint_id: args.id,
        limit: args.limit.unwrap_or(0),
        raw: args.raw,
    };
    let resp = ctx
        .unary(
            request,
            |mut c, r| async move { c.get_recent_hits(r).await },
        )
        .await?;
    if ctx.json {
        return output::emit_json(&json!({
            "hits": resp.hits.iter().map(super::events::to_json).collect::<Vec<_>>(),
            "total": resp.total,
        }));
    }
    let mut text = String::new();
    for h in &resp.hits {
        text.push_str(&super::events::to_text(h));
        text.push('\n');
    }
    // A code breakpoint keeps its stops.
    let stops = !resp.hits.is_empty()
        && resp.hits.iter().all(|h| {
            matches!(
                h.event,
                Some(wpd_proto::v1::stream_events_response::Event::BreakpointHit(
                    _
                ))
            )
        });
    let (what, unit) = if stops {
        ("breakpoint", "stop")
    } else {
        ("watchpoint", "hit")
    };
    text.push_str(&format!(
        "{what} {}: {} of {} shown",
        args.id,
        output::plural(resp.hits.len() as u64, unit),
        resp.total
    ));
    output::emit(&text)
}
