//! Typed values in the unary answers: the names values carry (an enumerator, the symbol a pointer points
//! into) in `GetRecentHits` and `GetHitAggregates`, with the type they
//! read as. Pointers are named here, per answer, with one read of the
//! process's maps: never on the hit path (a stream's hits carry their
//! enumerator only, `wire.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use wpd_proto::v1 as pb;

use super::nsview;
use crate::authz::Caller;
use crate::convert;
use crate::engine::Core;
use crate::events::{Event, EventKind};
use crate::model::{Pid, WatchId};
use crate::service::hits::{Aggregates, Named};
use crate::symbols::Symbols;
use crate::value::{Kind, ValueType};

/// How watchpoint `id`'s values read (None: no such data watchpoint).
pub(super) fn reading(core: &Core, id: WatchId) -> Option<(pb::ValueType, Option<Arc<ValueType>>)> {
    let spec = core.watch_spec(id)?;
    Some((
        crate::convert::reading_to_pb(&spec),
        spec.reading().cloned(),
    ))
}

/// Names the pointer values among `hits` (of process `pid`) with the
/// symbols they point into (`Hit.value_name`).
pub(super) async fn name_pointers(
    symbols: Arc<Symbols>,
    pid: Pid,
    hits: &mut [pb::StreamEventsResponse],
) {
    use pb::stream_events_response::Event;
    let pointer = |h: &pb::Hit| h.value_kind == pb::ValueKind::Pointer as i32 && h.value.len() == 8;
    let addrs: Vec<u64> = hits
        .iter()
        .filter_map(|e| match &e.event {
            Some(Event::Hit(h)) if pointer(h) => Some(crate::filter::value_u64(&h.value)),
            _ => None,
        })
        .collect();
    if addrs.is_empty() {
        return;
    }
    let names = named(symbols, pid, addrs).await;
    for e in hits {
        if let Some(Event::Hit(h)) = &mut e.event
            && pointer(h)
            && let Some(Some(n)) = names.get(&crate::filter::value_u64(&h.value))
        {
            h.value_name = n.clone();
        }
    }
}

/// The names of an aggregate's `values` read as `t` (`HitAggregate.value_names`).
pub(super) async fn names_of_values(
    symbols: Arc<Symbols>,
    pid: Pid,
    t: Option<&ValueType>,
    values: &[&[Vec<u8>]],
) -> Vec<Vec<String>> {
    let Some(t) = t else {
        return values
            .iter()
            .map(|v| vec![String::new(); v.len()])
            .collect();
    };
    let pointers: HashMap<u64, Option<String>> = if t.kind == Kind::Pointer {
        let addrs = values
            .iter()
            .flat_map(|v| v.iter())
            .map(|b| crate::filter::value_u64(b))
            .collect();
        named(symbols, pid, addrs).await
    } else {
        HashMap::new()
    };
    values
        .iter()
        .map(|v| {
            v.iter()
                .map(|b| match t.kind {
                    Kind::Pointer => pointers
                        .get(&crate::filter::value_u64(b))
                        .cloned()
                        .flatten()
                        .unwrap_or_default(),
                    _ => t.enumerator(b).unwrap_or_default().to_string(),
                })
                .collect()
        })
        .collect()
}

/// The symbols each of `addrs` points into, on the blocking pool.
async fn named(
    symbols: Arc<Symbols>,
    pid: Pid,
    mut addrs: Vec<u64>,
) -> HashMap<u64, Option<String>> {
    addrs.sort_unstable();
    addrs.dedup();
    tokio::task::spawn_blocking(move || {
        let names = symbols.points_into(pid, &addrs);
        addrs.into_iter().zip(names).collect()
    })
    .await
    .unwrap_or_default()
}

/// `GetRecentHits`' hits as sent to `caller`: in its numbers, located
/// (unless `raw`), their pointers named.
pub(super) async fn hits_out(
    core: &Core,
    caller: &Caller,
    pid: Pid,
    kept: &[Arc<Event>],
    raw: bool,
) -> Vec<pb::StreamEventsResponse> {
    let mut hits = Vec::with_capacity(kept.len());
    for ev in kept {
        let mut item = convert::event_to_pb(ev);
        if !nsview::event_out(caller, &mut item) {
            continue;
        }
        if let (EventKind::Hit(h), false) = (&ev.kind, raw)
            && let Some(image) = &h.image
        {
            let mut ips = Vec::with_capacity(1 + h.callchain.len());
            ips.push(h.ip);
            ips.extend_from_slice(&h.callchain);
            let frames = core.symbols.frames(image, &ips).await;
            convert::locate_hit(&mut item, &frames);
        }
        hits.push(item);
    }
    name_pointers(core.symbols.clone(), pid, &mut hits).await;
    hits
}

/// `GetHitAggregates`' answer to `caller` for watchpoint `id`: its places
/// located (unless `raw`), its values named, in the caller's numbers.
pub(super) async fn aggregates_out(
    core: &Core,
    caller: &Caller,
    id: WatchId,
    a: &Aggregates,
    raw: bool,
) -> pb::GetHitAggregatesResponse {
    let frames = match (&a.image, raw) {
        (Some(image), false) => {
            let ips: Vec<u64> = a.top.iter().map(|t| t.0.0).collect();
            core.symbols.frames(image, &ips).await
        }
        _ => Vec::new(),
    };
    let (value_type, reading) = reading(core, id).unzip();
    let values: Vec<&[Vec<u8>]> = a.top.iter().map(|(_, a)| &a.values[..]).collect();
    let names = names_of_values(
        core.symbols.clone(),
        a.pid,
        reading.flatten().as_deref(),
        &values,
    )
    .await;
    let aggregates = a
        .top
        .iter()
        .enumerate()
        .map(|(i, ((ip, tid), g))| pb::HitAggregate {
            ip: *ip,
            location: frames.get(i).map(convert::frame_to_pb),
            tid: nsview::tid_out(caller, a.pid, *tid),
            thread_name: g.thread_name.to_string(),
            count: g.count,
            first_ns: g.first_ns,
            last_ns: g.last_ns,
            values: g.values.clone(),
            value_names: names.get(i).cloned().unwrap_or_default(),
        })
        .collect();
    let (hits, exemplars, overflow) = a.totals;
    pb::GetHitAggregatesResponse {
        watchpoint_id: id.0,
        pid: nsview::process_pid_out(caller, a.pid),
        hits,
        exemplars,
        overflow,
        aggregates,
        value_type,
    }
}

/// `ResolveSymbol`'s answer for a name.
pub(super) fn named_out(n: Named) -> pb::ResolveSymbolResponse {
    let (value, value_error, value_name) = n.value;
    pb::ResolveSymbolResponse {
        symbol: Some(convert::symbol_to_pb(&n.resolved)),
        location: None,
        kind: n.kind.as_str().into(),
        offset: 0,
        value,
        from_frame: n.from_frame,
        value_error,
        value_name,
    }
}
