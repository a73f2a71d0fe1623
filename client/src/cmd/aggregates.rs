//! `wpctl aggregates`: an aggregate-mode watchpoint's hits counted per
//! instruction and thread (GetHitAggregates), most counted first.

use serde_json::json;
use wpd_proto::v1::{GetHitAggregatesRequest, GetHitAggregatesResponse};

use crate::cmd::Ctx;
use crate::cmd::last::LastArgs;
use crate::error::Error;
use crate::output::{self, Table, hex};

/// Runs `wpctl aggregates ID [--limit N] [--raw]`.
pub async fn run(ctx: &Ctx, args: &LastArgs) -> Result<(), Error> {
    let request = GetHitAggregatesRequest {
        watchpoint_id: args.id,
        limit: args.limit.unwrap_or(0),
        raw: args.raw,
    };
    let resp = ctx
        .unary(
            request,
            |mut c, r| async move { c.get_hit_aggregates(r).await },
        )
        .await?;
    if ctx.json {
        output::emit_json(&to_json(&resp))
    } else {
        output::emit(&to_text(&resp))
    }
}

fn value_text(v: &[u8]) -> String {
    let mut b = [0u8; 8];
    let n = v.len().min(8);
    b[..n].copy_from_slice(&v[..n]);
    u64::from_le_bytes(b).to_string()
}

fn to_json(r: &GetHitAggregatesResponse) -> serde_json::Value {
    json!({
        "watchpoint_id": r.watchpoint_id,
        "pid": r.pid,
        "hits": r.hits,
        "exemplars": r.exemplars,
        "overflow": r.overflow,
        "aggregates": r.aggregates.iter().map(|a| json!({
            "ip": hex(a.ip),
            "location": a.location.as_ref().map(output::location_text),
            "tid": a.tid,
            "thread_name": a.thread_name,
            "count": a.count,
            "first_ns": a.first_ns,
            "last_ns": a.last_ns,
            "values": a.values.iter().map(|v| value_text(v)).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// `COUNT TID AT VALUES LAST`, then the totals.
fn to_text(r: &GetHitAggregatesResponse) -> String {
    let mut t = Table::new(["COUNT", "THREAD", "AT", "LATEST VALUES", "LAST"]);
    for a in &r.aggregates {
        t.row(vec![
            a.count.to_string(),
            output::id_named(a.tid, &a.thread_name),
            a.location
                .as_ref()
                .map(output::location_text)
                .unwrap_or_else(|| hex(a.ip)),
            a.values
                .iter()
                .map(|v| value_text(v))
                .collect::<Vec<_>>()
                .join(" "),
            output::ago(a.last_ns),
        ]);
    }
    let mut s = if r.aggregates.is_empty() {
        "no hits yet\n".to_string()
    } else {
        t.render()
    };
    s.push_str(&format!(
        "watchpoint {} (pid {}): {} aggregated, {} streamed as samples",
        r.watchpoint_id,
        r.pid,
        output::plural(r.hits, "hit"),
        r.exemplars
    ));
    if r.overflow > 0 {
        s.push_str(&format!(
            ", {} beyond the table's instruction × thread pairs",
            r.overflow
        ));
    }
    s
}
