//! A watchpoint's spec from the wire, validated, and back; its condition,
//! how its values read, and the watchpoint as the API shows it.

use crate::filter::{Asked, CmpOp, HitFilter, Rhs};
use wpd_proto::v1 as pb;

use super::{backend, pid, tids};
use crate::arch::{self, SpecError};
use crate::engine::WatchView;
use crate::error::WpdError;
use crate::model::{Access, ByName, ExecPolicy, HitAction, Scope, WatchSpec};
use crate::wire::event::{access_to_pb, backend_to_pb, symbol_to_pb, value_type_to_pb};

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
            feedback: match &s.feedback {
                None => None,
                Some(f) => Some(crate::model::Feedback {
                    mode: match pb::FeedbackMode::try_from(f.mode) {
                        Ok(pb::FeedbackMode::Unspecified | pb::FeedbackMode::Values) => {
                            wpd_feedback_key::Mode::Values
                        }
                        Ok(pb::FeedbackMode::Max) => wpd_feedback_key::Mode::Max,
                        Err(_) => {
                            return Err(WpdError::InvalidArgument(format!(
                                "unknown feedback mode value {}",
                                f.mode
                            )));
                        }
                    },
                    with: (!f.with.trim().is_empty()).then(|| f.with.trim().to_string()),
                    sig_data: None,
                }),
            },
        })
    }
}

/// Domain spec → wire.
pub fn spec_to_pb(s: &WatchSpec) -> pb::WatchpointSpec {
    pb::WatchpointSpec {
        code_event: None,
        feedback: s.feedback.as_ref().map(|f| pb::Feedback {
            mode: match f.mode {
                wpd_feedback_key::Mode::Values => pb::FeedbackMode::Values,
                wpd_feedback_key::Mode::Max => pb::FeedbackMode::Max,
            } as i32,
            with: f.with.clone().unwrap_or_default(),
        }),
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
