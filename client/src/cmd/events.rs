//! `wpctl events`: follow hits and lifecycle events, one line (or JSON object) each (StreamEvents).

use clap::Args;
use serde_json::{Value, json};
use tonic::Streaming;
use wpd_proto::v1::stream_events_response::Event;
use wpd_proto::v1::{Hit, StreamEventsRequest, StreamEventsResponse};

use crate::args::pid_parser;
use crate::cmd::Ctx;
use crate::error::Error;
use crate::output::{self, clock, hex, id_list};
use crate::since::{self, Replay, Since};
use wpd_proto::text::escape;

/// `wpctl events`.
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only events of this process
    #[arg(long, value_parser = pid_parser())]
    pub pid: Option<i32>,
    /// Only hits of these watchpoints (repeat or comma-separate); lifecycle events still show
    #[arg(long = "id", value_name = "ID", value_delimiter = ',')]
    pub ids: Vec<u64>,
    /// Leave out lifecycle events; keep hits and drop notices
    #[arg(long)]
    pub hits_only: bool,
    /// Exit after printing N events
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Raw instruction pointers: no function, file:line or module names
    #[arg(long)]
    pub raw: bool,
    /// First replay past events from the daemon's journal (wpd --state-dir), then follow live
    /// ones: those after sequence number N (`1234`), since a time (`2026-12-02T10:00:00Z`,
    /// RFC 3339), or of a last stretch of time (`10m`, `90s`, `2h`, `1h30m`, `2d`)
    #[arg(long, value_name = "SPEC", value_parser = since::parse_arg)]
    pub since: Option<Since>,
}

/// Runs `wpctl events`: prints until the server ends the stream (exit 0),
/// `--count` events were printed (exit 0), or the stream fails.
pub async fn run(ctx: &Ctx, args: &EventsArgs) -> Result<(), Error> {
    let replay = replay(args);
    let mut stream = open(ctx, args, replay).await?;
    let endpoint = &ctx.endpoint.text;
    let mut printed = 0u64;
    let mut places = wpd_proto::places::Places::new();
    let mut pointers = PointerNames::default();
    while args.count.is_none_or(|n| printed < n) {
        let Some(mut ev) = stream
            .message()
            .await
            .map_err(|status| Error::from_status(endpoint, status))?
        else {
            break;
        };
        places.fill_event(&mut ev);
        pointers.fill(ctx, &mut ev).await;
        if ctx.json {
            output::emit_json_line(&to_json(&ev))?;
        } else {
            output::emit(&to_text(&ev))?;
        }
        printed += 1;
    }
    Ok(())
}

/// The most pointer values a stream names (the daemon is asked once for
/// each): past them, pointers show as addresses alone.
const POINTER_NAMES: usize = 4096;

/// Names of the pointer values a stream's hits carry: the symbol each
/// points into (`g_table+16`), asked of the daemon (`ResolveSymbol` by
/// address) once per process and value. A stream's hits carry an
/// enumerator's name but not a pointer's, which would cost the daemon a
/// look-up in the process's maps per hit.
#[derive(Default)]
pub struct PointerNames {
    /// By (pid, address): the name, empty where none.
    known: std::collections::HashMap<(i32, u64), String>,
    client: Option<super::Client>,
}

impl PointerNames {
    /// Fills in `Hit.value_name` of a pointer hit of `ev` where the daemon
    /// names its value; anything that fails leaves the address alone.
    pub async fn fill(&mut self, ctx: &Ctx, ev: &mut StreamEventsResponse) {
        let Some(Event::Hit(h)) = &mut ev.event else {
            return;
        };
        let pointer = wpd_proto::v1::ValueKind::Pointer as i32;
        if h.value_kind != pointer || !h.value_name.is_empty() || h.value.len() != 8 {
            return;
        }
        let addr = output::le_value(&h.value).unwrap_or(0);
        if addr == 0 {
            return;
        }
        let key = (h.pid, addr);
        if !self.known.contains_key(&key) {
            if self.known.len() >= POINTER_NAMES {
                return;
            }
            let name = self.ask(ctx, h.pid, addr).await.unwrap_or_default();
            self.known.insert(key, name);
        }
        h.value_name = self.known[&key].clone();
    }

    async fn ask(&mut self, ctx: &Ctx, pid: i32, addr: u64) -> Option<String> {
        if self.client.is_none() {
            self.client = ctx.connect().await.ok();
        }
        let client = self.client.as_mut()?;
        let request = ctx
            .deadline_request(wpd_proto::v1::ResolveSymbolRequest {
                pid,
                address: addr,
                ..Default::default()
            })
            .ok()?;
        let r = client.resolve_symbol(request).await.ok()?.into_inner();
        let s = r.symbol?;
        Some(match r.offset {
            0 => s.name,
            off => format!("{}+{off}", s.name),
        })
    }
}

/// The replay fields for `--since`, an age counted back from now.
pub fn replay(args: &EventsArgs) -> Replay {
    args.since
        .map(|s| s.replay(std::time::SystemTime::now()))
        .unwrap_or_default()
}

/// Subscribes to the daemon's events as `args` say, replaying from the
/// journal per `replay`. Only opening the stream is bounded by --timeout;
/// the stream itself is not.
pub async fn open(
    ctx: &Ctx,
    args: &EventsArgs,
    replay: Replay,
) -> Result<Streaming<StreamEventsResponse>, Error> {
    let request = StreamEventsRequest {
        pid: args.pid.unwrap_or(0),
        watchpoint_ids: args.ids.clone(),
        hits_only: args.hits_only,
        raw: args.raw,
        lease: false,
        after_seq: replay.after_seq,
        since_time_ns: replay.since_time_ns,
        // Each place's fields once: `run` fills the later hits in.
        places_once: !args.raw,
    };
    stream(ctx, request).await
}

/// Opens the event stream `request` asks for, within the timeout (the
/// stream itself has none), its messages up to [`super::EVENT_LIMIT`].
pub async fn stream(
    ctx: &Ctx,
    request: StreamEventsRequest,
) -> Result<Streaming<StreamEventsResponse>, Error> {
    let request = ctx.request(request)?;
    let mut client = ctx
        .connect()
        .await?
        .max_decoding_message_size(super::EVENT_LIMIT);
    let endpoint = &ctx.endpoint.text;
    match tokio::time::timeout(ctx.timeout, client.stream_events(request)).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(Error::from_stream_status(endpoint, status)),
        Err(_) => Err(Error::Timeout {
            endpoint: endpoint.clone(),
            secs: ctx.timeout.as_secs_f64(),
        }),
    }
}

/// The value read at the hit, as its type reads it, the raw bytes beside
/// it (`value=-1 (0xffffffffffffffff)`, `value=DONE (0x2)`,
/// `value=-273.15 (0xc071126666666666)`; `value=42 (0x2a)` with no type;
/// see [`wpd_proto::value::show`]), or why it is missing.
fn value_text(hit: &Hit) -> String {
    if !hit.value_error.is_empty() {
        return format!("value=? ({})", escape(&hit.value_error));
    }
    if hit.value.is_empty() {
        return "value=?".into();
    }
    format!(
        "value={}",
        wpd_proto::value::show(hit.value_kind, &hit.value, &hit.value_name)
    )
}

/// The value part of a hit line: `value=…`, preceded by `old=… → `
/// for only-on-change watchpoints and followed by ` STOPPED` when the thread
/// is held stopped (see `wpctl resume`).
fn hit_value_text(hit: &Hit) -> String {
    let mut text = String::new();
    if !hit.old_value.is_empty() {
        text.push_str(&format!(
            "old={} → ",
            wpd_proto::value::show(hit.value_kind, &hit.old_value, "")
        ));
    }
    text.push_str(&value_text(hit));
    if hit.stopped {
        text.push_str(" STOPPED");
    }
    text
}

/// One line per event, e.g.
/// `13:04:05.123456Z hit wp=7 pid=123 tid=124 ip=0x55d0c09f1234 addr=0x55d0c0a01040 value=42 (0x2a)`,
/// or for a stopping only-on-change watchpoint
/// `… addr=0x55d0c0a01040 old=41 (0x29) → value=42 (0x2a) STOPPED`.
pub(crate) fn to_text(ev: &StreamEventsResponse) -> String {
    let t = clock(ev.time_ns);
    match &ev.event {
        Some(Event::Hit(h)) => {
            let at = match &h.location {
                Some(l) => format!("at {}", output::location_text(l)),
                None => format!("ip={}", hex(h.ip)),
            };
            // `pid=12(fuzzer) tid=14(pool-3)` when the daemon gave names.
            let named = output::id_named;
            let mut line = format!(
                "{} hit wp={} pid={} tid={} {at} addr={} {}",
                clock(if h.time_ns != 0 {
                    h.time_ns
                } else {
                    ev.time_ns
                }),
                h.watchpoint_id,
                named(h.pid, &h.process_name),
                named(h.tid, &h.thread_name),
                hex(h.address),
                hit_value_text(h)
            );
            if h.rate_limited_before > 0 {
                line.push_str(&format!(
                    " (after {} over the rate limit)",
                    output::plural(h.rate_limited_before, "hit")
                ));
            }
            for (i, f) in h.backtrace.iter().enumerate() {
                let text = if f.lookup_address == 0 && f.function.is_empty() {
                    hex(f.ip)
                } else {
                    output::location_text(f)
                };
                line.push_str(&format!("\n    #{} {text}", i + 1));
            }
            if !h.backtrace_note.is_empty() {
                line.push_str(&format!("\n    ({})", escape(&h.backtrace_note)));
            }
            line
        }
        Some(Event::WatchpointResolved(e)) if e.symbol.is_none() => format!(
            "{t} wp-resolved wp={} pid={} ({}): now {}",
            e.watchpoint_id,
            e.pid,
            escape(&e.reason),
            match &e.breakpoint {
                Some(p) => format!(
                    "a breakpoint at {}, {}",
                    output::place_text(p),
                    hex(p.address)
                ),
                None => "armed (its function's module is loaded)".into(),
            }
        ),
        Some(Event::WatchpointResolved(e)) => format!(
            "{t} wp-resolved wp={} pid={} ({}): now {} at {}",
            e.watchpoint_id,
            e.pid,
            if e.reason.is_empty() {
                "resolved".into()
            } else {
                escape(&e.reason)
            },
            e.symbol
                .as_ref()
                .map(output::symbol_text)
                .unwrap_or_default(),
            hex(e.symbol.as_ref().map_or(0, |s| s.address))
        ),
        Some(Event::ThreadStarted(e)) => format!(
            "{t} thread-start pid={} tid={} parent={} inherited={}",
            e.pid,
            e.tid,
            e.parent_tid,
            id_list(&e.watchpoint_ids)
        ),
        Some(Event::ThreadExited(e)) => format!("{t} thread-exit pid={} tid={}", e.pid, e.tid),
        Some(Event::ProcessExited(e)) => format!(
            "{t} process-exit pid={} removed={}",
            e.pid,
            id_list(&e.watchpoint_ids)
        ),
        Some(Event::WatchpointRemoved(e)) => {
            let reason = if e.reason.is_empty() {
                "removed".into()
            } else {
                escape(&e.reason)
            };
            format!(
                "{t} wp-removed wp={} pid={} ({reason})",
                e.watchpoint_id, e.pid
            )
        }
        Some(Event::Dropped(d)) => format!(
            "!! {} dropped (subscriber too slow; seq {}..={})",
            output::plural(d.count, "event"),
            d.first_seq,
            d.last_seq
        ),
        Some(Event::ProcessCrashed(e)) => {
            let mut text = format!(
                "{t} process-crashed pid={} tid={} {} code={}{} watchpoints={}: {}",
                e.pid,
                e.tid,
                escape(&e.signal_name),
                e.code,
                if e.fatal { "" } else { " (handled)" },
                id_list(&e.watchpoint_ids),
                escape(&e.reason)
            );
            // Who wrote last: `  last wp=7 tid=124 ip=0x… value=101 (0x65)`.
            for h in &e.last_hits {
                text.push_str(&format!(
                    "\n  last {} wp={} tid={} ip={} {}",
                    clock(h.time_ns),
                    h.watchpoint_id,
                    output::id_named(h.tid, &h.thread_name),
                    hex(h.ip),
                    hit_value_text(h)
                ));
                for (i, f) in h.backtrace.iter().enumerate() {
                    text.push_str(&format!("\n    #{} {}", i + 1, hex(f.ip)));
                }
            }
            text
        }
        Some(Event::ProcessLost(e)) => format!(
            "{t} process-lost pid={} removed={}: {}",
            e.pid,
            id_list(&e.watchpoint_ids),
            escape(&e.reason)
        ),
        Some(Event::RecordsLost(l)) => format!(
            "!! {} lost in the kernel ring (daemon could not keep up with the hit rate)",
            output::plural(l.count, "record")
        ),
        Some(Event::Leased(l)) => format!("{t} leased lease={}", l.lease),
        Some(Event::BreakpointHit(e)) => {
            let p = e.place.clone().unwrap_or_default();
            let mut text = format!(
                "{t} breakpoint wp={} pid={} tid={} ip={} {}",
                e.watchpoint_id,
                e.pid,
                e.tid,
                hex(p.address),
                escape(&p.function)
            );
            if !p.file.is_empty() {
                text.push_str(&format!(" ({}:{})", escape(&p.file), p.line));
            }
            text.push_str(&format!(" count={} STOPPED", e.count));
            text
        }
        None => format!("{t} unknown-event seq={}", ev.seq),
    }
}

/// A hit as JSON (`"type": "hit"`).
fn hit_json(h: &Hit) -> Value {
    json!({
        "type": "hit",
        "watchpoint_id": h.watchpoint_id,
        "pid": h.pid,
        "tid": h.tid,
        "process_name": h.process_name,
        "thread_name": h.thread_name,
        "ip": hex(h.ip),
        "address": hex(h.address),
        "length": h.length,
        "piece": h.piece,
        "access": output::access_name(h.access),
        "value": if h.value.is_empty() { Value::Null } else { json!(output::hex_bytes(&h.value)) },
        "value_le": output::le_value(&h.value),
        "value_kind": wpd_proto::value::kind_name(h.value_kind),
        "value_typed": output::typed_json(h.value_kind, &h.value),
        "value_name": if h.value_name.is_empty() { Value::Null } else { json!(h.value_name) },
        "value_error": if h.value_error.is_empty() { Value::Null } else { json!(h.value_error) },
        "hit_time_ns": h.time_ns,
        "value_read_at_ns": h.value_read_at_ns,
        "cpu": h.cpu,
        "stopped": h.stopped,
        "old_value": if h.old_value.is_empty() { Value::Null } else { json!(output::hex_bytes(&h.old_value)) },
        "old_value_le": output::le_value(&h.old_value),
        "old_value_typed": output::typed_json(h.value_kind, &h.old_value),
        "backend": output::backend_name(h.backend),
        "location": h.location.as_ref().map(output::location_json),
        "backtrace": h.backtrace.iter().map(output::location_json).collect::<Vec<_>>(),
        "backtrace_note": if h.backtrace_note.is_empty() { Value::Null } else { json!(h.backtrace_note) },
        "rate_limited_before": h.rate_limited_before,
    })
}

/// One JSON object per event, with `seq`, `time_ns` and `type`.
pub(crate) fn to_json(ev: &StreamEventsResponse) -> Value {
    let mut v = match &ev.event {
        Some(Event::Hit(h)) => hit_json(h),
        Some(Event::WatchpointResolved(e)) => json!({
            "type": "watchpoint_resolved",
            "watchpoint_id": e.watchpoint_id,
            "pid": e.pid,
            "reason": e.reason,
            "symbol": e.symbol.as_ref().map(output::symbol_json),
            "breakpoint": e.breakpoint.as_ref().map(output::place_json),
        }),
        Some(Event::ThreadStarted(e)) => json!({
            "type": "thread_started",
            "pid": e.pid,
            "tid": e.tid,
            "parent_tid": e.parent_tid,
            "watchpoint_ids": e.watchpoint_ids,
        }),
        Some(Event::ThreadExited(e)) => json!({
            "type": "thread_exited",
            "pid": e.pid,
            "tid": e.tid,
        }),
        Some(Event::ProcessExited(e)) => json!({
            "type": "process_exited",
            "pid": e.pid,
            "watchpoint_ids": e.watchpoint_ids,
        }),
        Some(Event::WatchpointRemoved(e)) => json!({
            "type": "watchpoint_removed",
            "watchpoint_id": e.watchpoint_id,
            "pid": e.pid,
            "reason": e.reason,
        }),
        Some(Event::Dropped(d)) => json!({
            "type": "dropped",
            "count": d.count,
            "first_seq": d.first_seq,
            "last_seq": d.last_seq,
        }),
        Some(Event::ProcessCrashed(e)) => json!({
            "type": "process_crashed",
            "pid": e.pid,
            "tid": e.tid,
            "signal": e.signal,
            "signal_name": e.signal_name,
            "code": e.code,
            "fatal": e.fatal,
            "reason": e.reason,
            "watchpoint_ids": e.watchpoint_ids,
            "last_hits": e.last_hits.iter().map(hit_json).collect::<Vec<_>>(),
        }),
        Some(Event::ProcessLost(e)) => json!({
            "type": "process_lost",
            "pid": e.pid,
            "reason": e.reason,
            "watchpoint_ids": e.watchpoint_ids,
        }),
        Some(Event::RecordsLost(l)) => json!({
            "type": "records_lost",
            "count": l.count,
        }),
        Some(Event::Leased(l)) => json!({ "type": "leased", "lease": l.lease }),
        Some(Event::BreakpointHit(e)) => {
            let p = e.place.clone().unwrap_or_default();
            json!({
                "type": "breakpoint_hit",
                "watchpoint_id": e.watchpoint_id,
                "pid": e.pid,
                "tid": e.tid,
                "address": hex(p.address),
                "function": p.function,
                "file": p.file,
                "line": p.line,
                "count": e.count,
            })
        }
        None => json!({ "type": "unknown" }),
    };
    v["seq"] = json!(ev.seq);
    v["time_ns"] = json!(ev.time_ns);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use wpd_proto::v1::{
        Access, Backend, EventsDropped, ThreadStarted, ValueKind, WatchpointRemoved,
    };

    fn ev(event: Event) -> StreamEventsResponse {
        StreamEventsResponse {
            seq: 9,
            time_ns: 1_700_000_000_123_456_789,
            owner: None,
            event: Some(event),
        }
    }

    fn hit(value: Vec<u8>, value_error: &str) -> Event {
        Event::Hit(Hit {
            process_name: String::new(),
            thread_name: String::new(),
            piece: 0,
            location: None,
            backtrace: vec![],
            backtrace_note: String::new(),
            rate_limited_before: 0,
            watchpoint_id: 7,
            pid: 123,
            tid: 124,
            ip: 0x55d0c09f1234,
            address: 0x55d0c0a01040,
            length: 8,
            access: Access::Write as i32,
            value,
            value_error: value_error.into(),
            time_ns: 1_700_000_000_000_001_000,
            value_read_at_ns: 0,
            cpu: 3,
            stopped: false,
            old_value: vec![],
            backend: Backend::Perf as i32,
            value_kind: 0,
            value_name: String::new(),
        })
    }

    /// A hit of a typed watchpoint: `value` read as `kind`, named `name`.
    fn typed(kind: ValueKind, value: Vec<u8>, name: &str) -> Event {
        let Event::Hit(mut h) = hit(value, "") else {
            unreachable!()
        };
        h.value_kind = kind as i32;
        h.value_name = name.into();
        Event::Hit(h)
    }

    #[test]
    fn typed_values() {
        let line = |e| to_text(&ev(e)).split(" value=").nth(1).unwrap().to_string();
        let json = |e| to_json(&ev(e));
        let minus_one = typed(ValueKind::Signed, (-1i64).to_le_bytes().to_vec(), "");
        assert_eq!(line(minus_one.clone()), "-1 (0xffffffffffffffff)");
        let v = json(minus_one);
        assert_eq!(
            (v["value_kind"].clone(), v["value_typed"].clone()),
            (json!("signed"), json!(-1))
        );
        assert_eq!(v["value_le"], json!(u64::MAX));
        let cold = typed(ValueKind::Float, (-273.15f64).to_le_bytes().to_vec(), "");
        assert_eq!(line(cold.clone()), "-273.15 (0xc071126666666666)");
        assert_eq!(json(cold)["value_typed"], json!(-273.15));
        let nan = typed(ValueKind::Float, f64::NAN.to_le_bytes().to_vec(), "");
        assert_eq!(json(nan)["value_typed"], json!("NaN"));
        let half = typed(ValueKind::Float, 3.5f32.to_le_bytes().to_vec(), "");
        assert_eq!(line(half), "3.5 (0x40600000)");
        let done = typed(ValueKind::Unsigned, 2u32.to_le_bytes().to_vec(), "DONE");
        assert_eq!(line(done.clone()), "DONE (0x2)");
        assert_eq!(
            (
                json(done.clone())["value_typed"].clone(),
                json(done)["value_name"].clone()
            ),
            (json!(2), json!("DONE"))
        );
        let yes = typed(ValueKind::Bool, vec![1], "");
        assert_eq!(line(yes.clone()), "true (0x1)");
        assert_eq!(json(yes)["value_typed"], json!(true));
        let p = typed(
            ValueKind::Pointer,
            0x5555_0000_1040u64.to_le_bytes().to_vec(),
            "g_table+16",
        );
        assert_eq!(line(p.clone()), "0x555500001040 <g_table+16>");
        assert_eq!(json(p)["value_typed"], json!("0x555500001040"));
        // No type: as before.
        let v = json(hit(vec![42, 0, 0, 0, 0, 0, 0, 0], ""));
        assert_eq!(
            (v["value_kind"].clone(), v["value_typed"].clone()),
            (json!("untyped"), json!(42))
        );
    }

    /// A hit of a `--action stop --on-change` watchpoint (ptrace backend).
    fn stopping_hit() -> Event {
        let Event::Hit(mut h) = hit(vec![42, 0, 0, 0, 0, 0, 0, 0], "") else {
            unreachable!()
        };
        h.stopped = true;
        h.old_value = vec![41, 0, 0, 0, 0, 0, 0, 0];
        h.backend = Backend::Ptrace as i32;
        h.cpu = 0;
        Event::Hit(h)
    }

    #[test]
    fn text_lines() {
        assert_eq!(
            to_text(&ev(hit(vec![42, 0, 0, 0, 0, 0, 0, 0], ""))),
            "22:13:20.000001Z hit wp=7 pid=123 tid=124 ip=0x55d0c09f1234 \
             addr=0x55d0c0a01040 value=42 (0x2a)"
        );
        assert!(to_text(&ev(hit(vec![], "process exited"))).ends_with(" value=? (process exited)"));
        assert_eq!(
            to_text(&ev(stopping_hit())),
            "22:13:20.000001Z hit wp=7 pid=123 tid=124 ip=0x55d0c09f1234 \
             addr=0x55d0c0a01040 old=41 (0x29) → value=42 (0x2a) STOPPED"
        );
        assert_eq!(
            to_text(&ev(Event::Dropped(EventsDropped {
                count: 12,
                first_seq: 3,
                last_seq: 14,
            }))),
            "!! 12 events dropped (subscriber too slow; seq 3..=14)"
        );
        assert_eq!(
            to_text(&ev(Event::ThreadStarted(ThreadStarted {
                pid: 1,
                tid: 2,
                parent_tid: 1,
                watchpoint_ids: vec![7, 8],
            }))),
            "22:13:20.123456Z thread-start pid=1 tid=2 parent=1 inherited=7,8"
        );
        assert_eq!(
            to_text(&ev(Event::WatchpointRemoved(WatchpointRemoved {
                watchpoint_id: 7,
                pid: 1,
                reason: "process exited".into(),
            }))),
            "22:13:20.123456Z wp-removed wp=7 pid=1 (process exited)"
        );
    }

    #[test]
    fn breakpoint_stops() {
        let e = ev(Event::BreakpointHit(wpd_proto::v1::BreakpointHit {
            watchpoint_id: 3,
            pid: 123,
            tid: 124,
            place: Some(wpd_proto::v1::BreakpointPlace {
                function: "handle_conn".into(),
                file: "/src/breaks.c".into(),
                line: 23,
                address: 0x55d0c09f117d,
                module: "/src/a.out".into(),
                offset: 0x117d,
            }),
            count: 2,
        }));
        assert_eq!(
            to_text(&e),
            "22:13:20.123456Z breakpoint wp=3 pid=123 tid=124 ip=0x55d0c09f117d handle_conn \
             (/src/breaks.c:23) count=2 STOPPED"
        );
        let v = to_json(&e);
        assert_eq!(v["type"], "breakpoint_hit");
        assert_eq!(v["address"], "0x55d0c09f117d");
        assert_eq!(v["line"], 23);
        assert_eq!(v["count"], 2);
    }

    #[test]
    fn json_lines() {
        let v = to_json(&ev(hit(vec![1, 1], "")));
        assert_eq!(v["type"], "hit");
        assert_eq!(v["ip"], "0x55d0c09f1234");
        assert_eq!(v["value"], "0101");
        assert_eq!(v["value_le"], 257);
        assert!(v["value_error"].is_null());
        assert_eq!(v["seq"], 9);
        assert_eq!(v["stopped"], false);
        assert!(v["old_value"].is_null() && v["old_value_le"].is_null());
        assert_eq!(v["backend"], "perf");
        let v = to_json(&ev(stopping_hit()));
        assert_eq!(v["stopped"], true);
        assert_eq!(v["old_value"], "2900000000000000");
        assert_eq!(v["old_value_le"], 41);
        assert_eq!(v["value_le"], 42);
        assert_eq!(v["backend"], "ptrace");
        let v = to_json(&ev(hit(vec![], "gone")));
        assert!(v["value"].is_null() && v["value_le"].is_null());
        assert_eq!(v["value_error"], "gone");
        assert!(!serde_json::to_string(&v).unwrap().contains('\n'));
    }
}
