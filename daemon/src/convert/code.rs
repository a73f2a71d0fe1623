//! Code events (an object watched from a function's entry or return) and
//! code breakpoints from the wire, validated, and back.

use wpd_proto::v1 as pb;

use super::watch::spec_to_pb;
use crate::error::WpdError;
use crate::model::WatchSpec;
use crate::wire::event::{place_to_pb, value_type_to_pb};

/// Object counts → wire.
pub fn object_counts_to_pb(c: &crate::engine::objects::ObjectCountsView) -> pb::ObjectCounts {
    pb::ObjectCounts {
        armed: c.armed,
        disarmed: c.disarmed,
        no_slot: c.no_slot,
        over_limit: c.over_limit,
        failed: c.failed,
        live: c.live,
        mean_hold_ns: c.mean_hold_ns,
        armed_at_stop: c.armed_at_stop,
        disarmed_at_stop: c.disarmed_at_stop,
        freed_without_stop: c.freed_without_stop,
    }
}

/// A code event's watch → wire.
pub fn object_view_to_pb(v: &crate::engine::objects::ObjectView) -> pb::Watchpoint {
    let mut spec = spec_to_pb(&v.spec);
    code_to_pb(&mut spec, &v.code);
    pb::Watchpoint {
        id: v.id.0,
        spec: Some(spec),
        process_wide: !v.code.creator_only,
        hits: v.hits,
        objects: (!v.code.stop).then(|| object_counts_to_pb(&v.counts)),
        object_watchpoints: v.live.iter().map(|w| w.0).collect(),
        breakpoint: v.place.as_ref().map(place_to_pb),
        pending: v.pending,
        pending_reason: v.pending_why.clone().unwrap_or_default(),
        // Its objects' type, when the expression's evaluation at set gave it.
        value_type: v.spec.value_type.as_deref().map(value_type_to_pb),
        ..Default::default()
    }
}

/// A code event into its wire spec: the expression as `symbol`, no
/// address.
pub fn code_to_pb(spec: &mut pb::WatchpointSpec, code: &crate::engine::objects::CodeSpec) {
    spec.symbol = code.expr.clone();
    spec.length = code.len;
    spec.address = 0;
    let (file, line) = code.line.clone().unwrap_or_default();
    spec.code_event = Some(pb::CodeEvent {
        function: code.function.clone(),
        at_return: code.at_return,
        disarm_on: code.disarm_on.clone().unwrap_or_default(),
        max_live: code.max_live,
        creator_only: code.creator_only,
        stop: code.stop,
        file,
        line,
        pending: code.pending,
    });
    if code.stop {
        spec.access = pb::Access::Unspecified as i32;
    }
}

/// A `SetWatchpoint` spec (in the daemon's numbers) as the domain's: the
/// watchpoint's spec and, for a code event, its code spec. A code
/// breakpoint watches no memory: the rest of its spec (process, backend,
/// lease) is read as an object watch's.
pub fn watch_request(
    asked: &pb::WatchpointSpec,
) -> Result<(WatchSpec, Option<crate::engine::objects::CodeSpec>), WpdError> {
    let code = code_from_pb(asked)?;
    let spec = if code.as_ref().is_some_and(|c| c.stop) {
        WatchSpec::try_from(pb::WatchpointSpec {
            access: pb::Access::Exec as i32,
            symbol: "breakpoint".into(),
            ..asked.clone()
        })?
    } else {
        WatchSpec::try_from(asked.clone())?
    };
    Ok((spec, code))
}

/// The code event of a wire spec, validated (`None`: an ordinary
/// watchpoint).
pub fn code_from_pb(
    s: &pb::WatchpointSpec,
) -> Result<Option<crate::engine::objects::CodeSpec>, WpdError> {
    let Some(c) = &s.code_event else {
        return Ok(None);
    };
    if c.stop {
        return breakpoint_from_pb(s, c).map(Some);
    }
    if !c.file.is_empty() || c.line != 0 {
        return Err(WpdError::InvalidArgument(
            "code_event.file and line place a code breakpoint: they need code_event.stop".into(),
        ));
    }
    if c.function.is_empty() {
        return Err(WpdError::InvalidArgument(
            "code_event.function is required".into(),
        ));
    }
    if s.symbol.is_empty() {
        return Err(WpdError::InvalidArgument(
            "a code event needs symbol: the expression evaluated at each event ($ret->state, \
             c->refs, $arg0+8)"
                .into(),
        ));
    }
    if s.address != 0 || !s.tids.is_empty() || !s.thread_name.is_empty() || s.follow_forks {
        return Err(WpdError::InvalidArgument(
            "a code event takes no address, tids, thread_name or follow_forks: each object's \
             address comes from its event"
                .into(),
        ));
    }
    if s.lease != 0 || s.aggregate {
        return Err(WpdError::InvalidArgument(
            "a code event takes no lease and no aggregate mode".into(),
        ));
    }
    Ok(Some(crate::engine::objects::CodeSpec {
        function: c.function.clone(),
        at_return: c.at_return,
        expr: s.symbol.clone(),
        len: s.length,
        disarm_on: (!c.disarm_on.is_empty()).then(|| c.disarm_on.clone()),
        max_live: c.max_live,
        creator_only: c.creator_only,
        stop: false,
        line: None,
        ignore: 0,
        every: 0,
        pending: c.pending,
    }))
}

/// A code breakpoint's spec (`code_event.stop`), validated.
fn breakpoint_from_pb(
    s: &pb::WatchpointSpec,
    c: &pb::CodeEvent,
) -> Result<crate::engine::objects::CodeSpec, WpdError> {
    let line = match (c.function.is_empty(), c.file.is_empty(), c.line) {
        (false, true, 0) => None,
        (true, false, l) if l > 0 => Some((c.file.clone(), l)),
        (true, false, _) => {
            return Err(WpdError::InvalidArgument(
                "a code breakpoint at a file needs code_event.line (1-based)".into(),
            ));
        }
        (true, true, _) => {
            return Err(WpdError::InvalidArgument(
                "a code breakpoint needs code_event.function, or code_event.file and line".into(),
            ));
        }
        (false, _, _) => {
            return Err(WpdError::InvalidArgument(
                "a code breakpoint is at a function or at a file's line, not both".into(),
            ));
        }
    };
    if !s.symbol.is_empty()
        || s.length != 0
        || s.address != 0
        || !s.tids.is_empty()
        || !s.thread_name.is_empty()
        || s.follow_forks
        || s.aggregate
        || s.condition.is_some()
        || c.at_return
        || !c.disarm_on.is_empty()
        || c.max_live != 0
        || c.creator_only
    {
        return Err(WpdError::InvalidArgument(
            "a code breakpoint (code_event.stop) holds the thread that reaches it and arms \
             nothing: it takes no symbol, length, address, tids, thread_name, follow_forks, \
             aggregate, condition, at_return, disarm_on, max_live or creator_only (an \
             ignore count and a hit count apply)"
                .into(),
        ));
    }
    Ok(crate::engine::objects::CodeSpec {
        function: c.function.clone(),
        at_return: false,
        expr: String::new(),
        len: 0,
        disarm_on: None,
        max_live: 0,
        creator_only: false,
        stop: true,
        line,
        ignore: s.ignore_count,
        every: s.hit_count,
        pending: c.pending,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_goes_with_a_function_or_a_line_and_round_trips() {
        let at = |function: &str, file: &str, line: u32, stop: bool| pb::WatchpointSpec {
            pid: 7,
            symbol: if stop {
                String::new()
            } else {
                "$ret->state".into()
            },
            code_event: Some(pb::CodeEvent {
                function: function.into(),
                file: file.into(),
                line,
                stop,
                pending: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        let b = code_from_pb(&at("libplugin.so:plugin_work", "", 0, true))
            .unwrap()
            .unwrap();
        assert!(b.pending && b.stop);
        let w = code_from_pb(&at("libplugin.so:plugin_new", "", 0, false))
            .unwrap()
            .unwrap();
        assert!(w.pending && !w.stop);
        let mut back = pb::WatchpointSpec::default();
        code_to_pb(&mut back, &w);
        assert!(back.code_event.unwrap().pending);
        let l = code_from_pb(&at("", "plugin.c", 12, true))
            .unwrap()
            .unwrap();
        assert!(l.pending && l.line == Some(("plugin.c".into(), 12)));
        let mut back = pb::WatchpointSpec::default();
        code_to_pb(&mut back, &l);
        let c = back.code_event.unwrap();
        assert!(c.pending && c.file == "plugin.c" && c.line == 12, "{c:?}");
    }
}
