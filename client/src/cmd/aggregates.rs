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

/// How the watchpoint's values read (`ValueKind`; 0: no type).
fn kind(r: &GetHitAggregatesResponse) -> i32 {
    r.value_type.as_ref().map_or(0, |t| t.kind)
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
            "typed_values": a.values.iter().map(|v| output::typed_json(kind(r), v)).collect::<Vec<_>>(),
            "value_names": a.value_names,
        })).collect::<Vec<_>>(),
        "value_type": r.value_type.as_ref().map(output::value_type_json),
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
                .enumerate()
                .map(|(i, v)| {
                    let name = a.value_names.get(i).map_or("", String::as_str);
                    wpd_proto::value::short(kind(r), v, name)
                })
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

#[cfg(test)]
mod tests {
    use super::*;
    use wpd_proto::v1::{HitAggregate, ValueKind, ValueType};

    fn response(kind: ValueKind, values: Vec<Vec<u8>>, names: &[&str]) -> GetHitAggregatesResponse {
        GetHitAggregatesResponse {
            watchpoint_id: 4,
            pid: 42,
            hits: 3,
            aggregates: vec![HitAggregate {
                ip: 0x1000,
                tid: 43,
                count: 3,
                values,
                value_names: names.iter().map(|n| n.to_string()).collect(),
                ..Default::default()
            }],
            value_type: Some(ValueType {
                kind: kind as i32,
                size: 8,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn latest_values_read_as_their_type() {
        let r = response(
            ValueKind::Signed,
            vec![(-1i64).to_le_bytes().to_vec(), 7i64.to_le_bytes().to_vec()],
            &["", ""],
        );
        assert!(to_text(&r).contains(" -1 7 "), "{}", to_text(&r));
        let v = to_json(&r);
        assert_eq!(v["aggregates"][0]["typed_values"], json!([-1, 7]));
        assert_eq!(
            v["aggregates"][0]["values"],
            json!([u64::MAX.to_string(), "7"])
        );
        assert_eq!(v["value_type"]["kind"], "signed");
        let r = response(
            ValueKind::Float,
            vec![(-273.15f64).to_le_bytes().to_vec()],
            &[""],
        );
        assert!(to_text(&r).contains(" -273.15 "), "{}", to_text(&r));
        let r = response(
            ValueKind::Unsigned,
            vec![2u64.to_le_bytes().to_vec()],
            &["DONE"],
        );
        assert!(to_text(&r).contains(" DONE "), "{}", to_text(&r));
        let r = response(
            ValueKind::Pointer,
            vec![0x4010u64.to_le_bytes().to_vec()],
            &["g_table+16"],
        );
        assert!(
            to_text(&r).contains(" 0x4010 <g_table+16> "),
            "{}",
            to_text(&r)
        );
    }
}
