//! Typed values in the unary answers: a variable's value now
//! (`ResolveSymbol`, what `wpctl symbol` prints as gdb's `print` does),
//! and the names values carry (an enumerator, the symbol a pointer points
//! into) in `GetRecentHits` and `GetHitAggregates`, with the type they
//! read as. Pointers are named here, per answer, with one read of the
//! process's maps: never on the hit path (a stream's hits carry their
//! enumerator only, `wire.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use wpd_proto::v1 as pb;

use crate::engine::Core;
use crate::model::{Pid, WatchId};
use crate::symbols::{Resolved, Symbols};
use crate::value::{Kind, ValueType};

/// The largest object whose bytes `ResolveSymbol` reads with its answer.
pub(super) const VALUE_BYTES: u64 = 64;

/// A variable's value now, as `ResolveSymbol` answers it: its bytes (or
/// why none), and their name. Blocking (reads the process's memory and,
/// for a pointer, its maps).
pub(super) fn current(symbols: &Symbols, pid: Pid, r: &Resolved) -> (Vec<u8>, String, String) {
    if r.size > VALUE_BYTES {
        return (
            Vec::new(),
            format!(
                "{} bytes: more than the {VALUE_BYTES} read with the name (read them with \
                 ReadMemory)",
                r.size
            ),
            String::new(),
        );
    }
    let Some(via) = crate::procfs::live_thread(pid) else {
        return (Vec::new(), "the process has exited".into(), String::new());
    };
    match crate::procfs::read_memory(pid, via, r.address, r.size as usize) {
        Ok(bytes) => {
            let name = name_of(symbols, pid, r.value_type.as_ref(), &bytes).unwrap_or_default();
            (bytes, String::new(), name)
        }
        Err(why) => (Vec::new(), why, String::new()),
    }
}

/// What `ResolveSymbol` answers of a name's value (bytes, why none, their
/// name), by what the name is: an object's bytes now, a value's own.
/// Blocking.
pub(super) fn of_name(
    symbols: &Symbols,
    pid: Pid,
    r: &Resolved,
    kind: crate::symbols::NameKind,
) -> (Vec<u8>, String, String) {
    use crate::symbols::NameKind;
    match (kind, &r.value) {
        (NameKind::Value, Some(bytes)) => {
            let name = name_of(symbols, pid, r.value_type.as_ref(), bytes).unwrap_or_default();
            (bytes.clone(), String::new(), name)
        }
        (NameKind::Variable, _) => current(symbols, pid, r),
        _ => (Vec::new(), String::new(), String::new()),
    }
}

/// The name of a value's `bytes` read as `t`: its enumerator, or the
/// symbol a pointer points into. Blocking for a pointer.
pub(super) fn name_of(
    symbols: &Symbols,
    pid: Pid,
    t: Option<&ValueType>,
    bytes: &[u8],
) -> Option<String> {
    let t = t?;
    if t.kind == Kind::Pointer && bytes.len() == 8 {
        let addr = crate::filter::value_u64(bytes);
        return symbols.points_into(pid, &[addr]).pop().flatten();
    }
    t.enumerator(bytes).map(str::to_string)
}

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
