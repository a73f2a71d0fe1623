//! Events as the API's messages (`wpd.v1.StreamEventsResponse`), and the
//! parts of them other answers share (a location, a breakpoint's place, a
//! process's owner): the one conversion every encoding of an event starts
//! from (`wire`'s fast encoder is checked against it byte for byte).

use wpd_proto::v1 as pb;

use crate::events::{Event, EventKind};
use crate::model::{Access, BackendKind};
use crate::symbols::{Frame, Resolved, Source};

/// Domain backend → wire.
pub fn backend_to_pb(b: BackendKind) -> pb::Backend {
    match b {
        BackendKind::Perf => pb::Backend::Perf,
        BackendKind::Ptrace => pb::Backend::Ptrace,
    }
}
/// Domain access → wire.
pub fn access_to_pb(a: Access) -> pb::Access {
    match a {
        Access::Write => pb::Access::Write,
        Access::ReadWrite => pb::Access::ReadWrite,
        Access::Exec => pb::Access::Exec,
    }
}
/// The kind a hit's value reads as (`Hit.value_kind`).
pub fn value_kind_of(t: Option<&crate::value::ValueType>) -> pb::ValueKind {
    use crate::value::Kind;
    match t.map(|t| t.kind) {
        Some(Kind::Signed) => pb::ValueKind::Signed,
        Some(Kind::Unsigned) => pb::ValueKind::Unsigned,
        Some(Kind::Float) => pb::ValueKind::Float,
        Some(Kind::Bool) => pb::ValueKind::Bool,
        Some(Kind::Pointer) => pb::ValueKind::Pointer,
        Some(Kind::Other) | None => pb::ValueKind::Unspecified,
    }
}
/// A symbolized frame → wire.
pub fn frame_to_pb(f: &Frame) -> pb::Location {
    let p = &f.place;
    pb::Location {
        ip: f.ip,
        lookup_address: f.lookup,
        function: p.function.clone().unwrap_or_default(),
        function_offset: p.function_offset,
        file: p.file.clone().unwrap_or_default(),
        line: p.line,
        column: p.column,
        inlined: p
            .inlined
            .iter()
            .map(|(function, file, line)| pb::InlinedCall {
                function: function.clone(),
                file: file.clone().unwrap_or_default(),
                line: *line,
            })
            .collect(),
        module: p.module.clone().unwrap_or_default(),
        build_id: p
            .build_id
            .as_deref()
            .map(<[u8]>::to_vec)
            .unwrap_or_default(),
        module_address: p.module_address,
        file_offset: p.file_offset.unwrap_or(0),
        has_file_offset: p.file_offset.is_some(),
        // Numbers are for the streams that send places once (`wire.rs`).
        place_id: 0,
    }
}
/// Puts the symbolized frames of a hit in place: the first is where the
/// access was made, the others its callers.
pub fn locate_hit(item: &mut pb::StreamEventsResponse, frames: &[Frame]) {
    if let Some(pb::stream_events_response::Event::Hit(h)) = &mut item.event
        && let Some((first, callers)) = frames.split_first()
    {
        h.location = Some(frame_to_pb(first));
        h.backtrace = callers.iter().map(frame_to_pb).collect();
    }
}
/// A code breakpoint's place → wire.
pub fn place_to_pb(p: &crate::model::BreakPlace) -> pb::BreakpointPlace {
    pb::BreakpointPlace {
        function: p.function.clone(),
        file: p.file.clone(),
        line: p.line,
        address: p.address,
        module: p.module.clone(),
        offset: p.offset,
    }
}
/// The name of a hit's value its type gives (an enumerator).
pub fn hit_value_name(h: &crate::events::HitEvent) -> Option<&str> {
    h.value_type
        .as_deref()?
        .enumerator(h.value.as_deref().ok()?)
}
/// Domain event → wire.
/// A hit as sent: raw addresses (the stream fills in locations).
fn hit_to_pb(h: &crate::events::HitEvent) -> pb::Hit {
    pb::Hit {
        watchpoint_id: h.id.0,
        pid: h.pid,
        tid: h.tid,
        ip: h.ip,
        address: h.addr,
        length: h.len,
        access: access_to_pb(h.access) as i32,
        value: h.value.clone().unwrap_or_default(),
        value_error: h.value.as_ref().err().cloned().unwrap_or_default(),
        time_ns: h.time_ns,
        value_read_at_ns: h.value_read_ns,
        cpu: h.cpu,
        stopped: h.stopped,
        old_value: h.old_value.clone().unwrap_or_default(),
        backend: backend_to_pb(h.backend) as i32,
        piece: u32::from(h.piece),
        process_name: h
            .names
            .as_ref()
            .map(|n| n.0.to_string())
            .unwrap_or_default(),
        thread_name: h
            .names
            .as_ref()
            .map(|n| n.1.to_string())
            .unwrap_or_default(),
        value_kind: value_kind_of(h.value_type.as_deref()) as i32,
        value_name: hit_value_name(h).unwrap_or_default().to_string(),
        // Filled in by the stream once symbolized; raw addresses here.
        location: None,
        backtrace: h
            .callchain
            .iter()
            .map(|&ip| pb::Location {
                ip,
                ..Default::default()
            })
            .collect(),
        backtrace_note: h.callchain_note.unwrap_or_default().to_string(),
        rate_limited_before: h.rate_limited_before,
    }
}
pub fn event_to_pb(e: &Event) -> pb::StreamEventsResponse {
    use pb::stream_events_response::Event as E;
    let event = match &e.kind {
        EventKind::Hit(h) => E::Hit(hit_to_pb(h)),
        EventKind::ThreadStarted {
            pid,
            tid,
            parent,
            watchpoints,
        } => E::ThreadStarted(pb::ThreadStarted {
            pid: *pid,
            tid: *tid,
            parent_tid: *parent,
            watchpoint_ids: watchpoints.iter().map(|w| w.0).collect(),
        }),
        EventKind::ThreadExited { pid, tid } => E::ThreadExited(pb::ThreadExited {
            pid: *pid,
            tid: *tid,
        }),
        EventKind::ProcessExited { pid, watchpoints } => E::ProcessExited(pb::ProcessExited {
            pid: *pid,
            watchpoint_ids: watchpoints.iter().map(|w| w.0).collect(),
        }),
        EventKind::RecordsLost { count } => E::RecordsLost(pb::RecordsLost { count: *count }),
        EventKind::ProcessCrashed {
            pid,
            tid,
            signal,
            code,
            fatal,
            reason,
            watchpoints,
            last_hits,
        } => E::ProcessCrashed(pb::ProcessCrashed {
            pid: *pid,
            tid: *tid,
            signal: *signal,
            signal_name: crate::signals::name(*signal),
            code: *code,
            fatal: *fatal,
            reason: reason.clone(),
            watchpoint_ids: watchpoints.iter().map(|w| w.0).collect(),
            last_hits: last_hits
                .iter()
                .filter_map(|e| match &e.kind {
                    EventKind::Hit(h) => Some(hit_to_pb(h)),
                    _ => None,
                })
                .collect(),
        }),
        EventKind::ProcessLost {
            pid,
            reason,
            watchpoints,
        } => E::ProcessLost(pb::ProcessLost {
            pid: *pid,
            reason: reason.clone(),
            watchpoint_ids: watchpoints.iter().map(|w| w.0).collect(),
        }),
        EventKind::WatchpointRemoved { id, pid, reason } => {
            E::WatchpointRemoved(pb::WatchpointRemoved {
                watchpoint_id: id.0,
                pid: *pid,
                reason: reason.to_string(),
            })
        }
        EventKind::WatchpointResolved {
            id,
            pid,
            symbol,
            place,
            reason,
        } => E::WatchpointResolved(pb::WatchpointResolved {
            watchpoint_id: id.0,
            pid: *pid,
            symbol: symbol.as_ref().map(symbol_to_pb),
            reason: reason.to_string(),
            breakpoint: place.as_deref().map(place_to_pb),
        }),
        EventKind::BreakpointHit {
            id,
            pid,
            tid,
            place,
            count,
        } => E::BreakpointHit(pb::BreakpointHit {
            watchpoint_id: id.0,
            pid: *pid,
            tid: *tid,
            place: Some(place_to_pb(place)),
            count: *count,
        }),
    };
    pb::StreamEventsResponse {
        seq: e.seq,
        time_ns: e.time_ns,
        owner: e.owner.as_deref().map(owner_to_pb),
        event: Some(event),
    }
}
/// An event's process identity on the wire.
pub fn owner_to_pb(o: &crate::events::Owner) -> pb::ProcessOwner {
    pb::ProcessOwner {
        start_time: o.start_time,
        uids: o.uids.to_vec(),
        gids: o.gids.to_vec(),
        dumpable: o.dumpable,
    }
}
/// An event's process identity read back (a journaled event): `None` when
/// absent or malformed (such an event is shown to privileged callers only).
pub fn owner_from_pb(o: &pb::ProcessOwner) -> Option<crate::events::Owner> {
    Some(crate::events::Owner {
        start_time: o.start_time,
        uids: o.uids.as_slice().try_into().ok()?,
        gids: o.gids.as_slice().try_into().ok()?,
        dumpable: o.dumpable,
    })
}

/// What a name resolved to → wire.
pub fn symbol_to_pb(r: &Resolved) -> pb::Symbol {
    pb::Symbol {
        expression: r.expr.clone(),
        name: r.symbol.clone(),
        module: r.module.clone(),
        build_id: r.build_id.clone().unwrap_or_default(),
        address: r.address,
        size: r.size,
        type_name: r.type_name.clone().unwrap_or_default(),
        source: match r.source {
            Source::Dwarf => pb::SymbolSource::Dwarf,
            Source::Symtab => pb::SymbolSource::Symtab,
            Source::Dynsym => pb::SymbolSource::Dynsym,
        } as i32,
        module_address: r.module_address,
        note: r.note.clone().unwrap_or_default(),
        value_type: r.value_type.as_ref().map(value_type_to_pb),
    }
}

/// A value type → wire.
pub fn value_type_to_pb(t: &crate::value::ValueType) -> pb::ValueType {
    use crate::value::Kind;
    pb::ValueType {
        kind: match t.kind {
            Kind::Signed => pb::ValueKind::Signed,
            Kind::Unsigned => pb::ValueKind::Unsigned,
            Kind::Float => pb::ValueKind::Float,
            Kind::Bool => pb::ValueKind::Bool,
            Kind::Pointer => pb::ValueKind::Pointer,
            Kind::Other => pb::ValueKind::Unspecified,
        } as i32,
        size: u32::try_from(t.size).unwrap_or(u32::MAX),
        name: t.name.clone(),
        enumeration: t.enumerators.is_some(),
        enumerators: t
            .enumerators
            .iter()
            .flatten()
            .map(|(name, value)| pb::Enumerator {
                name: name.clone(),
                value: *value,
            })
            .collect(),
        note: String::new(),
    }
}
