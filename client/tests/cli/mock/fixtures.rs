//! The canned messages the mock answers with: events, watchpoints, the
//! symbol `counter`, and the error for a name no module defines.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};
use wpd_proto::v1::stream_events_response::Event;
use wpd_proto::v1::*;

pub(super) fn event(seq: u64, event: Event) -> StreamEventsResponse {
    StreamEventsResponse {
        seq,
        time_ns: 1_700_000_000_000_000_000 + seq,
        owner: None,
        event: Some(event),
    }
}

/// Where the mock's code breakpoints are (id 9).
pub(super) fn break_place() -> BreakpointPlace {
    BreakpointPlace {
        function: "conn_new".into(),
        file: "/src/conn.c".into(),
        line: 41,
        address: 0x5555_0000_127d,
        module: "/opt/server".into(),
        offset: 0x127d,
    }
}

/// Breakpoint 9 holds thread `tid` of pid 8.
pub(super) fn break_stop(seq: u64, tid: i32) -> StreamEventsResponse {
    event(
        seq,
        Event::BreakpointHit(BreakpointHit {
            watchpoint_id: 9,
            pid: 8,
            tid,
            place: Some(break_place()),
            count: 1,
        }),
    )
}

pub(super) fn hit(seq: u64) -> StreamEventsResponse {
    event(
        seq,
        Event::Hit(Hit {
            value_kind: 0,
            value_name: String::new(),
            process_name: String::new(),
            thread_name: String::new(),
            watchpoint_id: 7,
            pid: 123,
            tid: 124,
            ip: 0x401000,
            address: 0x601040,
            length: 4,
            access: Access::Write as i32,
            value: vec![0x2a, 0, 0, 0],
            value_error: String::new(),
            time_ns: 0,
            value_read_at_ns: 0,
            cpu: 0,
            stopped: false,
            old_value: vec![],
            backend: Backend::Perf as i32,
            piece: 0,
            location: None,
            backtrace: vec![],
            backtrace_note: String::new(),
            rate_limited_before: 0,
        }),
    )
}

/// Where a `--backtrace` hit came from: `set_counter` at target.c:17,
/// called from `main`.
pub(super) fn located_hit(seq: u64) -> StreamEventsResponse {
    let frame = |ip: u64, function: &str, line: u32| Location {
        ip,
        lookup_address: ip - 1,
        function: function.into(),
        function_offset: 0x10,
        file: "/src/target.c".into(),
        line,
        column: 3,
        inlined: vec![],
        module: "/opt/t/target".into(),
        build_id: vec![0xab, 0xcd, 0x01],
        module_address: (ip - 1) & 0xffff,
        file_offset: (ip - 1) & 0xffff,
        has_file_offset: true,
        place_id: 0,
    };
    let mut ev = hit(seq);
    if let Some(Event::Hit(h)) = &mut ev.event {
        h.ip = 0x5555_0000_1111;
        h.location = Some(frame(0x5555_0000_1111, "set_counter", 17));
        h.backtrace = vec![frame(0x5555_0000_1222, "main", 42)];
    }
    ev
}

/// `located_hit(seq)` as a stream with places once sends it: its place
/// numbered 1, its caller's 2, and when the stream has had them
/// (`first` false) nothing else of them.
pub(super) fn numbered_hit(seq: u64, first: bool) -> StreamEventsResponse {
    let mut ev = located_hit(seq);
    if let Some(Event::Hit(h)) = &mut ev.event {
        for (loc, id) in h.location.iter_mut().chain(&mut h.backtrace).zip(1..) {
            loc.place_id = id;
            if !first {
                *loc = Location {
                    ip: loc.ip,
                    lookup_address: loc.lookup_address,
                    place_id: id,
                    ..Default::default()
                };
            }
        }
    }
    ev
}

/// A hit of a `--action stop --on-change` watchpoint: old value 41, new 42,
/// thread held stopped.
pub(super) fn stopping_hit(seq: u64) -> StreamEventsResponse {
    let mut ev = hit(seq);
    if let Some(Event::Hit(h)) = &mut ev.event {
        h.watchpoint_id = 8;
        h.old_value = vec![0x29, 0, 0, 0];
        h.stopped = true;
        h.backend = Backend::Ptrace as i32;
    }
    ev
}

pub(super) fn watchpoint(id: u64, spec: WatchpointSpec, hits: u64) -> Watchpoint {
    Watchpoint {
        value_type: None,
        objects: None,
        object_watchpoints: vec![],
        breakpoint: None,
        pending: false,
        pending_reason: String::new(),
        policy_id: 0,
        forked_children: vec![],
        id,
        process_wide: spec.tids.is_empty(),
        armed_threads: if spec.tids.is_empty() {
            3
        } else {
            spec.tids.len() as u32
        },
        hits,
        created_at_ns: 1,
        backend: if spec.backend == Backend::Ptrace as i32 {
            Backend::Ptrace as i32
        } else {
            Backend::Perf as i32
        },
        pieces: vec![Piece {
            address: spec.address,
            length: spec.length,
        }],
        symbol: None,
        spec: Some(spec),
        hits_filtered: 0,
        hits_rate_limited: 0,
    }
}

/// What the mock's process 123 has: `counter`, a 4-byte int in the
/// executable `/opt/t/target`, loaded at 0x5555_0000_0000.
pub(super) fn counter_symbol(expression: &str) -> Symbol {
    Symbol {
        value_type: Some(wpd_proto::v1::ValueType {
            kind: wpd_proto::v1::ValueKind::Signed as i32,
            size: 4,
            name: "int".into(),
            ..Default::default()
        }),
        expression: expression.into(),
        name: "counter".into(),
        module: "/opt/t/target".into(),
        build_id: vec![0xab, 0xcd, 0x01],
        address: 0x5555_0000_4010,
        size: 4,
        type_name: "int".into(),
        source: SymbolSource::Dwarf as i32,
        module_address: 0x4010,
        note: String::new(),
    }
}

/// The error the daemon gives for a name no module defines.
pub(super) fn unknown_symbol(name: &str) -> Status {
    let mut details = ErrorDetails::new();
    details.set_error_info(
        wpd_proto::reason::UNKNOWN_SYMBOL,
        "wpd.v1",
        HashMap::from([("closest".to_string(), "counter".to_string())]),
    );
    Status::with_error_details(
        Code::NotFound,
        format!("no variable {name:?} in process 123 (closest: counter)"),
        details,
    )
}
