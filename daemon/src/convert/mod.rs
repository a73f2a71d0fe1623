//! Wire ⇄ domain conversions. Validation happens here, once: a domain value
//! that exists is valid.

use crate::filter::{Asked, CmpOp, HitFilter, Rhs};
use wpd_proto::v1 as pb;

use crate::arch::{self, SpecError};
use crate::backend::RunState;
use crate::engine::{ProcessView, SlotView, ThreadView, WatchView};
use crate::error::WpdError;
use crate::model::{
    Access, BackendKind, ByName, ExecPolicy, HitAction, Pid, Scope, Tid, WatchSpec,
};

pub use crate::wire::event::{
    access_to_pb, backend_to_pb, event_to_pb, frame_to_pb, hit_value_name, locate_hit,
    owner_from_pb, owner_to_pb, place_to_pb, symbol_to_pb, value_kind_of, value_type_to_pb,
};

/// A pid from the wire: must be positive.
pub fn pid(p: i32) -> Result<Pid, WpdError> {
    if p <= 0 {
        return Err(WpdError::InvalidArgument(format!(
            "pid must be a positive process id, got {p}"
        )));
    }
    Ok(p)
}

/// Thread ids from the wire: each positive; sorted, each once (a request
/// that names a thread 100,000 times costs what naming it once does).
pub fn tids(t: &[i32]) -> Result<Vec<Tid>, WpdError> {
    if let Some(bad) = t.iter().find(|&&t| t <= 0) {
        return Err(WpdError::InvalidArgument(format!(
            "tid must be positive, got {bad}"
        )));
    }
    let mut t = t.to_vec();
    t.sort_unstable();
    t.dedup();
    Ok(t)
}

/// Most frames GetThreadStack walks.
pub const MAX_STACK_DEPTH: u32 = 128;

/// Most bytes one ReadMemory returns.
pub const MAX_READ: u32 = 1 << 20;

/// GetThreadStack's depth: 0 means 32.
pub fn stack_depth(d: u32) -> Result<usize, WpdError> {
    match d {
        0 => Ok(32),
        d if d > MAX_STACK_DEPTH => Err(WpdError::InvalidArgument(format!(
            "depth {d} is more than {MAX_STACK_DEPTH} frames"
        ))),
        d => Ok(d as usize),
    }
}

/// ReadMemory's length: 1 to [`MAX_READ`] bytes, inside user space.
pub fn read_length(addr: u64, len: u32) -> Result<usize, WpdError> {
    if len == 0 || len > MAX_READ {
        return Err(WpdError::InvalidArgument(format!(
            "length must be 1 to {MAX_READ} bytes, got {len}"
        )));
    }
    if addr
        .checked_add(u64::from(len))
        .is_none_or(|end| end > arch::current::USER_ADDR_LIMIT)
    {
        return Err(WpdError::InvalidArgument(format!(
            "{len} bytes at {addr:#x} reach past the end of user space ({:#x})",
            arch::current::USER_ADDR_LIMIT
        )));
    }
    Ok(len as usize)
}

/// A backend from the wire (`None` = daemon default).
pub fn backend(b: i32) -> Result<Option<BackendKind>, WpdError> {
    match pb::Backend::try_from(b) {
        Ok(pb::Backend::Unspecified) => Ok(None),
        Ok(pb::Backend::Perf) => Ok(Some(BackendKind::Perf)),
        Ok(pb::Backend::Ptrace) => Ok(Some(BackendKind::Ptrace)),
        Err(_) => Err(WpdError::InvalidArgument(format!(
            "unknown backend value {b}"
        ))),
    }
}

impl TryFrom<pb::WatchpointSpec> for WatchSpec {
    type Error = WpdError;

    fn try_from(s: pb::WatchpointSpec) -> Result<Self, WpdError> {
        let pid = pid(s.pid)?;
        let access = match pb::Access::try_from(s.access) {
            Ok(pb::Access::Write) => Access::Write,
            Ok(pb::Access::ReadWrite) => Access::ReadWrite,
            Ok(pb::Access::Exec) => Access::Exec,
            Ok(pb::Access::Read) => arch::read_only()?,
            Ok(pb::Access::Unspecified) => return Err(SpecError::NoAccess.into()),
            Err(_) => {
                return Err(WpdError::InvalidArgument(format!(
                    "unknown access value {}",
                    s.access
                )));
            }
        };
        let symbol = if s.symbol.trim().is_empty() {
            None
        } else {
            if s.address != 0 {
                return Err(WpdError::InvalidArgument(format!(
                    "give an address or a symbol, not both (address {:#x}, symbol {:?})",
                    s.address, s.symbol
                )));
            }
            Some(ByName {
                expr: s.symbol.trim().to_string(),
                len: s.length,
                on_exec: match pb::ExecPolicy::try_from(s.on_exec) {
                    Ok(pb::ExecPolicy::Unspecified | pb::ExecPolicy::ResolveAgain) => {
                        ExecPolicy::ResolveAgain
                    }
                    Ok(pb::ExecPolicy::Remove) => ExecPolicy::Remove,
                    Err(_) => {
                        return Err(WpdError::InvalidArgument(format!(
                            "unknown exec policy value {}",
                            s.on_exec
                        )));
                    }
                },
            })
        };
        if s.symbol.trim().is_empty() && s.on_exec != 0 {
            return Err(WpdError::InvalidArgument(
                "on_exec applies to a watchpoint set by name (a watchpoint set by address is \
                 always removed at exec)"
                    .into(),
            ));
        }
        if s.backtrace_depth > crate::model::MAX_BACKTRACE {
            return Err(WpdError::InvalidArgument(format!(
                "backtrace_depth {} is more than {} frames",
                s.backtrace_depth,
                crate::model::MAX_BACKTRACE
            )));
        }
        // A name is resolved by the core (in the process), and the range it
        // gives is checked then.
        let range = match &symbol {
            None => arch::validate(s.address, s.length, access)?,
            Some(_) => crate::model::Range {
                addr: 0,
                len: s.length,
                pieces: Vec::new(),
            },
        };
        let scope = if !s.thread_name.is_empty() {
            if !s.tids.is_empty() {
                return Err(WpdError::InvalidArgument(
                    "give tids or a thread_name pattern, not both".into(),
                ));
            }
            Scope::Named(
                crate::model::ThreadGlob::new(&s.thread_name).map_err(WpdError::InvalidArgument)?,
            )
        } else if s.tids.is_empty() {
            Scope::Process
        } else {
            Scope::Threads(tids(&s.tids)?)
        };
        if s.follow_forks && !s.thread_name.is_empty() {
            return Err(WpdError::InvalidArgument(
                "follow_forks applies to a process-wide watchpoint, not to threads by name".into(),
            ));
        }
        if s.follow_forks && !s.tids.is_empty() {
            return Err(WpdError::InvalidArgument(
                "follow_forks applies to a process-wide watchpoint (a forked child is a copy of \
                 the whole process), not to listed threads"
                    .into(),
            ));
        }
        Ok(WatchSpec {
            pid,
            scope,
            range,
            access,
            backend: backend(s.backend)?,
            action: match pb::HitAction::try_from(s.action) {
                Ok(a) if a != pb::HitAction::Signal && s.signal != 0 => {
                    return Err(WpdError::InvalidArgument(
                        "signal applies to the signal action (action HIT_ACTION_SIGNAL)".into(),
                    ));
                }
                Ok(pb::HitAction::Unspecified | pb::HitAction::Log) => HitAction::Log,
                Ok(pb::HitAction::Stop) => HitAction::Stop,
                Ok(pb::HitAction::StopAll) => HitAction::StopAll,
                Ok(pb::HitAction::Signal) => HitAction::Signal(
                    crate::signals::action_signal(s.signal).map_err(WpdError::InvalidArgument)?,
                ),
                Err(_) => {
                    return Err(WpdError::InvalidArgument(format!(
                        "unknown hit action value {}",
                        s.action
                    )));
                }
            },
            only_on_change: s.only_on_change,
            allow_init: s.allow_init,
            symbol,
            backtrace: s.backtrace_depth as u8,
            filter: filter_from_pb(&s)?,
            condition: match &s.condition {
                Some(c) => asked_from_pb(c)?,
                None => None,
            },
            value_type: None,
            lease: s.lease,
            keep_recent: match s.keep_recent {
                0 => crate::model::DEFAULT_KEEP_RECENT,
                n if n > crate::model::MAX_KEEP_RECENT => {
                    return Err(WpdError::InvalidArgument(format!(
                        "keep_recent {n} is more than {}",
                        crate::model::MAX_KEEP_RECENT
                    )));
                }
                n => n,
            },
            policy: None,
            follow_forks: s.follow_forks,
            aggregate: match (s.aggregate, s.exemplars_per_second) {
                (false, 0) => None,
                (false, n) => {
                    return Err(WpdError::InvalidArgument(format!(
                        "exemplars_per_second {n} applies to aggregate mode (aggregate is false)"
                    )));
                }
                (true, n) if n > crate::aggregate::MAX_EXEMPLARS => {
                    return Err(WpdError::InvalidArgument(format!(
                        "exemplars_per_second {n} is more than {}",
                        crate::aggregate::MAX_EXEMPLARS
                    )));
                }
                (true, _) if s.action != 0 && s.action != pb::HitAction::Log as i32 => {
                    return Err(WpdError::InvalidArgument(
                        "aggregate mode counts hits: its action must be log (a thread stopped \
                         at every hit is not what aggregating is for)"
                            .into(),
                    ));
                }
                (true, 0) => Some(crate::aggregate::DEFAULT_EXEMPLARS),
                (true, n) => Some(n),
            },
        })
    }
}

/// Domain spec → wire.
pub fn spec_to_pb(s: &WatchSpec) -> pb::WatchpointSpec {
    pb::WatchpointSpec {
        code_event: None,
        follow_forks: s.follow_forks,
        aggregate: s.aggregate.is_some(),
        exemplars_per_second: s.aggregate.unwrap_or(0),
        thread_name: match &s.scope {
            Scope::Named(g) => g.text.clone(),
            _ => String::new(),
        },
        lease: s.lease,
        keep_recent: s.keep_recent,
        pid: s.pid,
        tids: match &s.scope {
            Scope::Process | Scope::Named(_) => vec![],
            Scope::Threads(t) => t.clone(),
        },
        address: s.range.addr,
        length: s.range.len,
        access: access_to_pb(s.access) as i32,
        backend: s.backend.map(|b| backend_to_pb(b) as i32).unwrap_or(0),
        action: match s.action {
            HitAction::Log => pb::HitAction::Log,
            HitAction::Stop => pb::HitAction::Stop,
            HitAction::StopAll => pb::HitAction::StopAll,
            HitAction::Signal(_) => pb::HitAction::Signal,
        } as i32,
        signal: match s.action {
            HitAction::Signal(n) => n,
            _ => 0,
        },
        only_on_change: s.only_on_change,
        allow_init: s.allow_init,
        // The name when set by one; the address and length are then what it
        // resolved to.
        symbol: s
            .symbol
            .as_ref()
            .map(|b| b.expr.clone())
            .unwrap_or_default(),
        on_exec: match s.symbol.as_ref().map(|b| b.on_exec) {
            None => pb::ExecPolicy::Unspecified,
            Some(ExecPolicy::Remove) => pb::ExecPolicy::Remove,
            Some(ExecPolicy::ResolveAgain) => pb::ExecPolicy::ResolveAgain,
        } as i32,
        backtrace_depth: u32::from(s.backtrace),
        condition: s.condition.as_ref().map(condition_to_pb),
        ignore_count: s.filter.ignore,
        hit_count: s.filter.every,
        max_hits_per_second: s.filter.max_per_second,
    }
}

/// The hit filter of a wire spec; its condition is bound to the watched
/// type when the watchpoint is set (`WatchSpec::bind_condition`).
fn filter_from_pb(s: &pb::WatchpointSpec) -> Result<HitFilter, WpdError> {
    Ok(HitFilter {
        condition: None,
        ignore: s.ignore_count,
        every: s.hit_count,
        max_per_second: s.max_hits_per_second,
    })
}

/// A wire condition as asked (its text's form checked; what it means for
/// the type is decided when the watchpoint is set); `None`: no condition.
pub fn asked_from_pb(c: &pb::HitCondition) -> Result<Option<Asked>, WpdError> {
    use pb::hit_condition::Op;
    let op = match Op::try_from(c.op) {
        Ok(Op::Unspecified) => return Ok(None),
        Ok(Op::Changed) => return Ok(Some(Asked::Changed)),
        Ok(Op::Eq) => CmpOp::Eq,
        Ok(Op::Ne) => CmpOp::Ne,
        Ok(Op::Lt) => CmpOp::Lt,
        Ok(Op::Le) => CmpOp::Le,
        Ok(Op::Gt) => CmpOp::Gt,
        Ok(Op::Ge) => CmpOp::Ge,
        Err(_) => {
            return Err(WpdError::InvalidArgument(format!(
                "unknown condition operator value {}",
                c.op
            )));
        }
    };
    let rhs = if c.value.trim().is_empty() {
        Rhs::Unsigned(c.operand)
    } else {
        let text = wpd_proto::condition::literal(&c.value)
            .map_err(|e| WpdError::InvalidArgument(format!("condition value: {e}")))?;
        Rhs::Text(text.to_string())
    };
    Ok(Some(Asked::Compare {
        op,
        mask: (c.mask != 0).then_some(c.mask),
        rhs,
    }))
}

fn condition_to_pb(c: &Asked) -> pb::HitCondition {
    use pb::hit_condition::Op;
    match c {
        Asked::Changed => pb::HitCondition {
            op: Op::Changed as i32,
            operand: 0,
            mask: 0,
            value: String::new(),
        },
        Asked::Compare { op, mask, rhs } => pb::HitCondition {
            op: match op {
                CmpOp::Eq => Op::Eq,
                CmpOp::Ne => Op::Ne,
                CmpOp::Lt => Op::Lt,
                CmpOp::Le => Op::Le,
                CmpOp::Gt => Op::Gt,
                CmpOp::Ge => Op::Ge,
            } as i32,
            operand: match rhs {
                Rhs::Unsigned(n) => *n,
                Rhs::Text(t) => wpd_proto::condition::parse_number(t).unwrap_or(0),
            },
            mask: mask.unwrap_or(0),
            value: match rhs {
                Rhs::Unsigned(_) => String::new(),
                Rhs::Text(t) => t.clone(),
            },
        },
    }
}

/// How a watchpoint of `spec` reads its values → wire: its type, or why it
/// has none.
pub fn reading_to_pb(spec: &WatchSpec) -> pb::ValueType {
    match spec.reading() {
        Some(t) => value_type_to_pb(t),
        None => pb::ValueType {
            kind: pb::ValueKind::Unspecified as i32,
            size: spec.range.len,
            name: spec
                .value_type
                .as_ref()
                .map(|t| t.name.clone())
                .unwrap_or_default(),
            enumeration: false,
            enumerators: Vec::new(),
            note: crate::value::untyped_note(
                spec.value_type.as_deref(),
                &spec.range,
                spec.symbol.is_some(),
            ),
        },
    }
}

impl From<&WatchView> for pb::Watchpoint {
    fn from(w: &WatchView) -> Self {
        pb::Watchpoint {
            id: w.id.0,
            policy_id: w.spec.policy.map_or(0, |p| p.0),
            forked_children: w.forked_children.clone(),
            spec: Some(spec_to_pb(&w.spec)),
            process_wide: w.process_wide,
            armed_threads: w.armed_threads,
            hits: w.hits,
            created_at_ns: w.created_at_ns,
            backend: backend_to_pb(w.backend) as i32,
            pieces: w
                .spec
                .range
                .pieces
                .iter()
                .map(|p| pb::Piece {
                    address: p.addr,
                    length: p.len.bytes(),
                })
                .collect(),
            symbol: w.symbol.as_ref().map(symbol_to_pb),
            hits_filtered: w.filtered.0,
            hits_rate_limited: w.filtered.1,
            objects: None,
            object_watchpoints: Vec::new(),
            breakpoint: None,
            pending: false,
            pending_reason: String::new(),
            value_type: Some(reading_to_pb(&w.spec)),
        }
    }
}

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

impl From<&ProcessView> for pb::ProcessInfo {
    fn from(p: &ProcessView) -> Self {
        pb::ProcessInfo {
            pid: p.pid,
            backend: backend_to_pb(p.backend) as i32,
            threads: p.threads,
            watchpoints: p.watchpoints,
            comm: p.comm.clone(),
            attached_at_ns: p.attached_at_ns,
            stops: p.stops.clone(),
        }
    }
}

impl From<&ThreadView> for pb::ThreadInfo {
    fn from(t: &ThreadView) -> Self {
        pb::ThreadInfo {
            tid: t.tid,
            slots: t
                .slots
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let (state, key) = match s {
                        SlotView::Free => (pb::SlotState::Free, None),
                        SlotView::Ours(k) => (pb::SlotState::Ours, Some(k)),
                        SlotView::Foreign => (pb::SlotState::Foreign, None),
                        SlotView::Pending(k) => (pb::SlotState::Pending, Some(k)),
                        SlotView::Retained => (pb::SlotState::Retained, None),
                    };
                    pb::SlotInfo {
                        index: i as u32,
                        state: state as i32,
                        watchpoint_id: key.map_or(0, |k| k.id.0),
                        piece: key.map_or(0, |k| u32::from(k.piece)),
                    }
                })
                .collect(),
            state: match t.state {
                RunState::Running => pb::ThreadState::Running,
                RunState::StoppedAtHit => pb::ThreadState::StoppedAtHit,
                RunState::StoppedByPeer => pb::ThreadState::StoppedByPeer,
                RunState::JobStopped => pb::ThreadState::JobStopped,
                RunState::StoppedAfterStep => pb::ThreadState::StoppedAfterStep,
                RunState::Stepping => pb::ThreadState::Stepping,
            } as i32,
            parent_tid: t.parent,
            name: t.name.clone(),
        }
    }
}

/// A policy's spec from the wire: a watchpoint spec whose pid is 0 (the
/// selector picks the processes), checked as any other.
pub fn policy_spec_from_pb(mut s: pb::WatchpointSpec) -> Result<WatchSpec, WpdError> {
    if s.pid != 0 {
        return Err(WpdError::InvalidArgument(format!(
            "a policy's spec must have pid 0 (its selector picks the processes), got {}",
            s.pid
        )));
    }
    if !s.tids.is_empty() {
        return Err(WpdError::InvalidArgument(
            "a policy's spec cannot name threads (tids are per process)".into(),
        ));
    }
    // Checked as a watchpoint of some process; the pid is each instance's.
    s.pid = 1;
    let mut spec = WatchSpec::try_from(s)?;
    spec.pid = 0;
    Ok(spec)
}

/// A selector from the wire.
pub fn selector_from_pb(
    s: Option<pb::ProcessSelector>,
) -> Result<crate::engine::policy::Selector, WpdError> {
    let s = s.unwrap_or_default();
    crate::engine::policy::Selector::new(s.pids, &s.comm, &s.exe, &s.cgroup)
}

/// How a policy found a process, on the wire.
fn found_by_to_pb(f: crate::engine::policy::FoundBy) -> pb::InstanceSource {
    use crate::engine::policy::FoundBy;
    match f {
        FoundBy::SetPolicy => pb::InstanceSource::SetPolicy,
        FoundBy::KernelRecord => pb::InstanceSource::KernelRecord,
        FoundBy::Scan => pb::InstanceSource::Scan,
    }
}

/// A selector to the wire.
pub fn selector_to_pb(s: &crate::engine::policy::Selector) -> pb::ProcessSelector {
    pb::ProcessSelector {
        pids: s.pids.clone(),
        comm: s.comm.clone().unwrap_or_default(),
        exe: s
            .exe
            .as_ref()
            .map(|e| e.display().to_string())
            .unwrap_or_default(),
        cgroup: s.cgroup.clone().unwrap_or_default(),
    }
}

impl From<&crate::engine::policy::PolicyView> for pb::Policy {
    fn from(p: &crate::engine::policy::PolicyView) -> Self {
        pb::Policy {
            id: p.id.0,
            selector: Some(selector_to_pb(&p.selector)),
            spec: Some({
                let mut spec = spec_to_pb(&p.spec);
                if let Some(code) = &p.code {
                    code_to_pb(&mut spec, code);
                }
                spec
            }),
            created_at_ns: p.created_at_ns,
            instances: p
                .instances
                .iter()
                .map(|i| pb::PolicyInstance {
                    pid: i.pid,
                    comm: i.comm.clone(),
                    watchpoint_id: i.watch.0,
                    armed_at_ns: i.armed_at_ns,
                    latency_ns: i.latency_ns,
                    found_by: found_by_to_pb(i.found_by) as i32,
                })
                .collect(),
            refusals: p
                .refusals
                .iter()
                .map(|r| pb::PolicyRefusal {
                    pid: r.pid,
                    comm: r.comm.clone(),
                    reason: r.reason.clone(),
                    at_ns: r.at_ns,
                })
                .collect(),
            instances_made: p.made,
        }
    }
}

/// The symbol containing `addr` (`Symbols::describe_address`) on the wire:
/// the symbol, its kind, and `addr`'s offset in it.
pub fn address_to_pb(
    info: &crate::symbols::AddressInfo,
    addr: u64,
) -> (Option<pb::Symbol>, String, u64) {
    match &info.symbol {
        Some((name, start, size, kind)) => (
            Some(pb::Symbol {
                expression: name.clone(),
                name: name.clone(),
                module: info.module.clone().unwrap_or_default(),
                build_id: info.build_id.clone().unwrap_or_default(),
                address: *start,
                size: *size,
                type_name: String::new(),
                source: pb::SymbolSource::Symtab as i32,
                module_address: info.module_address.wrapping_sub(addr - start),
                note: String::new(),
                value_type: None,
            }),
            kind.to_string(),
            addr - start,
        ),
        None => (None, String::new(), 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(addr: u64, len: u32, access: pb::Access) -> pb::WatchpointSpec {
        pb::WatchpointSpec {
            pid: 1,
            tids: vec![],
            address: addr,
            length: len,
            access: access as i32,
            ..Default::default()
        }
    }

    fn check(s: pb::WatchpointSpec, want: Result<(), &str>) {
        let got = WatchSpec::try_from(s.clone())
            .map(|_| ())
            .map_err(|e| e.to_string());
        match (got, want) {
            (Ok(()), Ok(())) => {}
            (Err(e), Err(w)) => assert!(e.contains(w), "{s:?}: {e:?} lacks {w:?}"),
            (g, w) => panic!("{s:?}: got {g:?}, want {w:?}"),
        }
    }

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

    #[test]
    fn signal_goes_with_the_signal_action_only() {
        let with = |action: pb::HitAction, signal: i32| pb::WatchpointSpec {
            action: action as i32,
            signal,
            ..spec(0x1000, 8, pb::Access::Write)
        };
        check(with(pb::HitAction::Signal, 0), Ok(()));
        check(with(pb::HitAction::Signal, libc::SIGUSR1), Ok(()));
        check(
            with(pb::HitAction::Signal, libc::SIGTRAP),
            Err("SIGTRAP cannot be"),
        );
        check(with(pb::HitAction::Signal, 65), Err("not a signal number"));
        for action in [
            pb::HitAction::Unspecified,
            pb::HitAction::Log,
            pb::HitAction::Stop,
            pb::HitAction::StopAll,
        ] {
            check(
                with(action, libc::SIGUSR1),
                Err("signal applies to the signal action"),
            );
        }
    }

    #[test]
    fn spec_validation_table() {
        check(spec(0x1000, 8, pb::Access::Write), Ok(()));
        check(
            spec(0x1000, 8, pb::Access::Read),
            Err("cannot watch reads only"),
        );
        check(
            spec(0x1000, 8, pb::Access::Unspecified),
            Err("access kind is required"),
        );
        // Unaligned: split into pieces (the arch tests check them).
        check(spec(0x1004, 8, pb::Access::Write), Ok(()));
        check(
            spec(0x1004, 32, pb::Access::Write),
            Err("need 5 debug-register slots"),
        );
        check(spec(0x1000, 2, pb::Access::Exec), Err("length 1"));
        check(
            pb::WatchpointSpec {
                pid: 0,
                ..spec(0x1000, 8, pb::Access::Write)
            },
            Err("pid must be"),
        );
        check(
            pb::WatchpointSpec {
                tids: vec![3, -1],
                ..spec(0x1000, 8, pb::Access::Write)
            },
            Err("tid must be"),
        );
        check(
            pb::WatchpointSpec {
                access: 99,
                ..spec(0x1000, 8, pb::Access::Write)
            },
            Err("unknown access"),
        );
        check(
            pb::WatchpointSpec {
                backend: 7,
                ..spec(0x1000, 8, pb::Access::Write)
            },
            Err("unknown backend"),
        );
    }

    #[test]
    fn hit_actions_convert() {
        let mut s = spec(0x1000, 8, pb::Access::Write);
        assert_eq!(
            WatchSpec::try_from(s.clone()).unwrap().action,
            HitAction::Log
        );
        s.action = pb::HitAction::StopAll as i32;
        s.only_on_change = true;
        let d = WatchSpec::try_from(s.clone()).unwrap();
        assert_eq!((d.action, d.only_on_change), (HitAction::StopAll, true));
        assert_eq!(spec_to_pb(&d).action, pb::HitAction::StopAll as i32);
        s.action = 42;
        check(s, Err("unknown hit action"));
    }

    #[test]
    fn threads_are_sorted_and_deduplicated() {
        let s = WatchSpec::try_from(pb::WatchpointSpec {
            tids: vec![5, 3, 5],
            ..spec(0x1000, 8, pb::Access::Write)
        })
        .unwrap();
        assert_eq!(s.scope, Scope::Threads(vec![3, 5]));
    }
}
