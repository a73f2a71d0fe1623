//! `wpctl stats`: daemon counters (GetStats), every field of the answer.
//!
//! Text groups them (what is tracked, hits and losses, the ledger,
//! connections, symbols, the journal, the export); `--json` is one flat
//! object keyed by the message's field names. A unit test walks the
//! message's descriptor and fails when a field is shown in neither.

use serde_json::json;
use wpd_proto::v1::{GetStatsRequest, GetStatsResponse};

use crate::cmd::{Ctx, Report};
use crate::error::Error;
use crate::output::{self, bytes, duration_ns, plural};

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

/// Every field, under its name in the message.
fn to_json(s: &GetStatsResponse) -> serde_json::Value {
    let mut v = json!({
        "processes": s.processes,
        "threads": s.threads,
        "forked_children": s.forked_children,
        "watchpoints": s.watchpoints,
        "perf_fds": s.perf_fds,
        "uptime_s": s.uptime_s,
        "hits": s.hits,
        "kernel_lost": s.kernel_lost,
        "kernel_throttled": s.kernel_throttled,
        "subscribers": s.subscribers,
        "subscriber_dropped": s.subscriber_dropped,
        "ledger_hold_p50_ns": s.ledger_hold_p50_ns,
        "ledger_hold_p99_ns": s.ledger_hold_p99_ns,
        "ledger_hold_max_ns": s.ledger_hold_max_ns,
        "connections": s.connections,
        "connections_refused": s.connections_refused,
        "connections_idled": s.connections_idled,
        "symbol_files": s.symbol_files,
        "symbol_bytes": s.symbol_bytes,
        "locations": s.locations,
        "location_bytes": s.location_bytes,
        "symbol_maps_reads": s.symbol_maps_reads,
        "journal_written_seq": s.journal_written_seq,
        "journal_durable_seq": s.journal_durable_seq,
        "journal_bytes": s.journal_bytes,
        "journal_segments": s.journal_segments,
        "journal_lagged": s.journal_lagged,
        "journal_retired": s.journal_retired,
        "journal_fsyncs": s.journal_fsyncs,
        "journal_fsync_us": s.journal_fsync_us,
        "journal_torn": s.journal_torn,
        "journal_write_lost": s.journal_write_lost,
        "journal_unsynced": s.journal_unsynced,
        "journal_write_errors": s.journal_write_errors,
        "sigtraps": s.sigtraps,
        "objects": objects_json(s),
        "export_acked_seq": s.export_acked_seq,
        "export_published": s.export_published,
        "export_errors": s.export_errors,
        "export_lost": s.export_lost,
        "export_connected": s.export_connected,
    });
    // A second object: one json! of every field passes the macro's
    // recursion limit.
    let more = json!({
        "code_events": s.code_events,
        "code_event_bytes": s.code_event_bytes,
        "code_event_bytes_limit": s.code_event_bytes_limit,
        "held": s.held,
        "held_limit": s.held_limit,
        "caller_fds": s.caller_fds,
        "degraded": s.degraded,
        "exec_hold_files": s.exec_hold_files,
        "exec_holds": s.exec_holds,
        "exec_holds_past_bound": s.exec_holds_past_bound,
    });
    if let (Some(all), serde_json::Value::Object(more)) = (v.as_object_mut(), more) {
        all.extend(more);
    }
    v
}

/// GetStats' code-event counts.
fn objects_json(s: &GetStatsResponse) -> serde_json::Value {
    let Some(o) = s.objects else {
        return serde_json::Value::Null;
    };
    json!({
        "armed": o.armed,
        "disarmed": o.disarmed,
        "no_slot": o.no_slot,
        "over_limit": o.over_limit,
        "failed": o.failed,
        "live": o.live,
        "mean_hold_ns": o.mean_hold_ns,
        "armed_at_stop": o.armed_at_stop,
        "disarmed_at_stop": o.disarmed_at_stop,
        "freed_without_stop": o.freed_without_stop,
    })
}

/// `key: value` lines, one per group of fields (the daemon's degraded
/// state first, when it is).
fn to_text(s: &GetStatsResponse) -> String {
    let degraded = if s.degraded.is_empty() {
        String::new()
    } else {
        format!("DEGRADED: {}\n", s.degraded)
    };
    degraded
        + &output::key_values(&[
            ("processes", s.processes.to_string()),
            ("threads", s.threads.to_string()),
            (
                "children",
                format!(
                    "{} forked with inherited watchpoints, not yet gone",
                    s.forked_children
                ),
            ),
            (
                "exec holds",
                format!(
                    "{} programs held at exec; {} execs held, {} let go past the bound",
                    s.exec_hold_files, s.exec_holds, s.exec_holds_past_bound
                ),
            ),
            ("watchpoints", s.watchpoints.to_string()),
            (
                "held",
                format!(
                    "{} of {} watchpoints, code events and policies for this caller",
                    s.held, s.held_limit
                ),
            ),
            (
                "code events",
                format!(
                    "{}, taking at most {} of kernel memory (a caller may take {})",
                    s.code_events,
                    bytes(s.code_event_bytes),
                    bytes(s.code_event_bytes_limit)
                ),
            ),
            ("perf fds", s.perf_fds.to_string()),
            (
                "fds",
                format!("{} held for watchpoints and code events", s.caller_fds),
            ),
            ("uptime", output::duration_s(s.uptime_s)),
            (
                "hits",
                format!(
                    "{} delivered, {} lost in the kernel's rings, {} throttled by the kernel; \
                 {} delivered to watched processes by the kernel",
                    s.hits,
                    plural(s.kernel_lost, "record"),
                    plural(s.kernel_throttled, "event"),
                    plural(s.sigtraps, "SIGTRAP")
                ),
            ),
            (
                "objects",
                match s.objects {
                    None => "-".into(),
                    Some(o) => format!(
                        "{} armed by code events ({} live, {} disarmed, mean hold {}; {} armed and \
                     {} disarmed at a stop, {} freed without one); not armed: \
                     {} without a free slot, {} over max-live, {} failed",
                        o.armed,
                        o.live,
                        o.disarmed,
                        duration_ns(o.mean_hold_ns),
                        o.armed_at_stop,
                        o.disarmed_at_stop,
                        o.freed_without_stop,
                        o.no_slot,
                        o.over_limit,
                        o.failed
                    ),
                },
            ),
            (
                "subscribers",
                format!(
                    "{} now, {} dropped for being too slow",
                    s.subscribers,
                    plural(s.subscriber_dropped, "event")
                ),
            ),
            (
                "ledger hold",
                format!(
                    "p50 {}, p99 {}, max {}",
                    duration_ns(s.ledger_hold_p50_ns),
                    duration_ns(s.ledger_hold_p99_ns),
                    duration_ns(s.ledger_hold_max_ns)
                ),
            ),
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
                    plural(s.symbol_files, "module"),
                    bytes(s.symbol_bytes),
                    s.locations,
                    bytes(s.location_bytes),
                    s.symbol_maps_reads
                ),
            ),
            (
                "journal",
                format!(
                    "written to seq {}, durable to seq {}; {} ({}); {} ({}); \
                 {} lagged, {} retired, {} torn; {}, {} lost to them, {} not synced",
                    s.journal_written_seq,
                    s.journal_durable_seq,
                    plural(s.journal_segments, "segment"),
                    bytes(s.journal_bytes),
                    plural(s.journal_fsyncs, "fsync"),
                    duration_ns(s.journal_fsync_us.saturating_mul(1_000)),
                    s.journal_lagged,
                    s.journal_retired,
                    s.journal_torn,
                    plural(s.journal_write_errors, "write error"),
                    s.journal_write_lost,
                    s.journal_unsynced
                ),
            ),
            (
                "export",
                format!(
                    "{}; acked to seq {}; {} published, {}, {} lost",
                    if s.export_connected {
                        "connected"
                    } else {
                        "not connected"
                    },
                    s.export_acked_seq,
                    s.export_published,
                    plural(s.export_errors, "error"),
                    s.export_lost
                ),
            ),
        ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use prost::Message;
    use prost::encoding::{WireType, encode_key, encode_varint};
    use prost_types::field_descriptor_proto::Type;

    #[test]
    fn renders() {
        let s = GetStatsResponse {
            processes: 1,
            threads: 12,
            watchpoints: 2,
            perf_fds: 48,
            hits: 9,
            kernel_lost: 1,
            subscribers: 2,
            subscriber_dropped: 5,
            ledger_hold_p50_ns: 800,
            ledger_hold_p99_ns: 12_500,
            ledger_hold_max_ns: 4_200_000,
            uptime_s: 75,
            connections: 3,
            connections_refused: 1,
            symbol_files: 3,
            symbol_bytes: 3_500_000,
            locations: 12,
            location_bytes: 2048,
            symbol_maps_reads: 4,
            journal_written_seq: 120,
            journal_durable_seq: 118,
            journal_bytes: 1_300_000,
            journal_segments: 2,
            journal_fsyncs: 14,
            journal_fsync_us: 3_200,
            journal_torn: 1,
            export_acked_seq: 117,
            export_published: 119,
            export_errors: 1,
            export_connected: true,
            ..Default::default()
        };
        expect![[r#"
            processes:   1
            threads:     12
            children:    0 forked with inherited watchpoints, not yet gone
            exec holds:  0 programs held at exec; 0 execs held, 0 let go past the bound
            watchpoints: 2
            held:        0 of 0 watchpoints, code events and policies for this caller
            code events: 0, taking at most 0 B of kernel memory (a caller may take 0 B)
            perf fds:    48
            fds:         0 held for watchpoints and code events
            uptime:      1m15s
            hits:        9 delivered, 1 record lost in the kernel's rings, 0 events throttled by the kernel; 0 SIGTRAPs delivered to watched processes by the kernel
            objects:     -
            subscribers: 2 now, 5 events dropped for being too slow
            ledger hold: p50 800 ns, p99 12.5 µs, max 4.2 ms
            connections: 3 open, 1 refused, 0 closed idle
            symbols:     3 modules loaded (3.3 MiB), 12 code addresses (2.0 KiB), 4 maps reads
            journal:     written to seq 120, durable to seq 118; 2 segments (1.2 MiB); 14 fsyncs (3.2 ms); 0 lagged, 0 retired, 1 torn; 0 write errors, 0 lost to them, 0 not synced
            export:      connected; acked to seq 117; 119 published, 1 error, 0 lost
        "#]].assert_eq(&to_text(&s));
        let v = to_json(&s);
        assert_eq!(v["hits"], 9);
        assert_eq!(v["journal_fsync_us"], 3_200);
        assert_eq!(v["export_connected"], true);
    }

    /// `GetStatsResponse`'s fields, from the descriptor embedded in the
    /// proto crate: (name, number, type).
    fn fields() -> Vec<(String, i32, Type)> {
        let set = prost_types::FileDescriptorSet::decode(wpd_proto::v1::FILE_DESCRIPTOR_SET)
            .expect("the embedded descriptor set decodes");
        let message = set
            .file
            .iter()
            .filter(|f| f.package() == "wpd.v1")
            .flat_map(|f| &f.message_type)
            .find(|m| m.name() == "GetStatsResponse")
            .expect("GetStatsResponse is in wpd.v1");
        message
            .field
            .iter()
            .map(|f| (f.name().to_string(), f.number(), f.r#type()))
            .collect()
    }

    /// A `GetStatsResponse` with only field `number` set, to a value that
    /// shows (encoded by hand: the field may be one this code does not
    /// know yet).
    fn with_field(number: i32, ty: Type) -> GetStatsResponse {
        let number = number as u32;
        let mut buf = Vec::new();
        match ty {
            Type::Double | Type::Fixed64 | Type::Sfixed64 => {
                encode_key(number, WireType::SixtyFourBit, &mut buf);
                buf.extend_from_slice(&3_000_000_007u64.to_le_bytes());
            }
            Type::Float | Type::Fixed32 | Type::Sfixed32 => {
                encode_key(number, WireType::ThirtyTwoBit, &mut buf);
                buf.extend_from_slice(&3_000_007u32.to_le_bytes());
            }
            Type::String | Type::Bytes => {
                encode_key(number, WireType::LengthDelimited, &mut buf);
                encode_varint(1, &mut buf);
                buf.push(b'x');
            }
            Type::Message | Type::Group => {
                encode_key(number, WireType::LengthDelimited, &mut buf);
                encode_varint(0, &mut buf);
            }
            Type::Bool => {
                encode_key(number, WireType::Varint, &mut buf);
                encode_varint(1, &mut buf);
            }
            _ => {
                encode_key(number, WireType::Varint, &mut buf);
                encode_varint(3_000_007, &mut buf);
            }
        }
        GetStatsResponse::decode(buf.as_slice()).expect("one field decodes")
    }

    /// Every field of `GetStatsResponse` is shown in text and in JSON (under
    /// its own name): setting it alone changes both. A field added to the
    /// message and not to `wpctl stats` fails here.
    #[test]
    fn every_field_is_shown() {
        let fields = fields();
        assert!(fields.len() >= 34, "{} fields", fields.len());
        let zero = GetStatsResponse::default();
        let (text0, json0) = (to_text(&zero), to_json(&zero));
        let keys = json0.as_object().unwrap();
        let mut missing = Vec::new();
        for (name, number, ty) in &fields {
            let one = with_field(*number, *ty);
            assert_ne!(one, zero, "field {name} ({number}) was not set");
            let (text, json) = (to_text(&one), to_json(&one));
            if text == text0 {
                missing.push(format!("{name}: not in the text"));
            }
            if !keys.contains_key(name.as_str()) {
                missing.push(format!("{name}: no JSON key {name:?}"));
            } else if json[name.as_str()] == json0[name.as_str()] {
                missing.push(format!("{name}: JSON \"{name}\" does not follow the field"));
            }
        }
        assert!(
            missing.is_empty(),
            "wpctl stats leaves out:\n{}",
            missing.join("\n")
        );
        assert_eq!(
            keys.len(),
            fields.len(),
            "JSON keys that are no field: {:?}",
            keys.keys()
                .filter(|k| !fields.iter().any(|(n, _, _)| n == *k))
                .collect::<Vec<_>>()
        );
    }
}
