//! `wpctl stats`: daemon counters (GetStats).

use serde_json::json;
use wpd_proto::v1::{GetStatsRequest, GetStatsResponse};

use crate::cmd::{Ctx, Report};
use crate::error::Error;
use crate::output;

/// Runs `wpctl stats`.
pub async fn run(ctx: &Ctx) -> Result<(), Error> {
    report(ctx).await?.emit(ctx.json)
}

/// Asks the daemon and renders its answer.
pub async fn report(ctx: &Ctx) -> Result<Report, Error> {
    let s = ctx
        .unary(GetStatsRequest {}, |mut c, r| async move {
            c.get_stats(r).await
        })
        .await?;
    Ok(Report::new(to_text(&s), to_json(&s)))
}

fn to_json(s: &GetStatsResponse) -> serde_json::Value {
    json!({
        "processes": s.processes,
        "threads": s.threads,
        "watchpoints": s.watchpoints,
        "hits": s.hits,
        "kernel_lost": s.kernel_lost,
        "perf_fds": s.perf_fds,
        "subscribers": s.subscribers,
        "subscriber_dropped": s.subscriber_dropped,
        "ledger_hold_p50_ns": s.ledger_hold_p50_ns,
        "ledger_hold_p99_ns": s.ledger_hold_p99_ns,
        "ledger_hold_max_ns": s.ledger_hold_max_ns,
        "uptime_s": s.uptime_s,
        "connections": s.connections,
        "connections_refused": s.connections_refused,
        "connections_idled": s.connections_idled,
        "symbol_files": s.symbol_files,
        "symbol_bytes": s.symbol_bytes,
        "locations": s.locations,
        "location_bytes": s.location_bytes,
        "symbol_maps_reads": s.symbol_maps_reads,
    })
}

fn to_text(s: &GetStatsResponse) -> String {
    output::key_values(&[
        ("processes", s.processes.to_string()),
        ("threads", s.threads.to_string()),
        ("watchpoints", s.watchpoints.to_string()),
        ("hits", s.hits.to_string()),
        ("kernel lost", s.kernel_lost.to_string()),
        ("perf fds", s.perf_fds.to_string()),
        ("subscribers", s.subscribers.to_string()),
        ("subscriber dropped", s.subscriber_dropped.to_string()),
        (
            "ledger hold",
            format!(
                "p50 {}, p99 {}, max {}",
                output::duration_ns(s.ledger_hold_p50_ns),
                output::duration_ns(s.ledger_hold_p99_ns),
                output::duration_ns(s.ledger_hold_max_ns)
            ),
        ),
        ("uptime", output::duration_s(s.uptime_s)),
        (
            "connections",
            format!(
                "{} open, {} refused, {} closed idle",
                s.connections, s.connections_refused, s.connections_idled
            ),
        ),
        (
            "symbols",
            format!(
                "{} loaded ({}), {} code addresses ({}), {} maps reads",
                output::plural(s.symbol_files, "module"),
                output::bytes(s.symbol_bytes),
                s.locations,
                output::bytes(s.location_bytes),
                s.symbol_maps_reads
            ),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders() {
        let s = GetStatsResponse {
            processes: 1,
            hits: 9,
            ledger_hold_p50_ns: 800,
            ledger_hold_p99_ns: 12_500,
            ledger_hold_max_ns: 4_200_000,
            uptime_s: 75,
            symbol_files: 3,
            symbol_bytes: 3_500_000,
            locations: 12,
            location_bytes: 2048,
            symbol_maps_reads: 4,
            ..Default::default()
        };
        let text = to_text(&s);
        assert!(text.starts_with("processes:          1\n"), "{text}");
        assert!(
            text.contains("ledger hold:        p50 800 ns, p99 12.5 µs, max 4.2 ms\n"),
            "{text}"
        );
        assert!(text.contains("uptime:             1m15s\n"), "{text}");
        assert!(
            text.contains("connections:        0 open, 0 refused, 0 closed idle\n"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "symbols:            3 modules loaded (3.3 MiB), 12 code addresses (2.0 KiB), 4 maps reads\n"
            ),
            "{text}"
        );
        assert_eq!(to_json(&s)["hits"], 9);
    }
}
