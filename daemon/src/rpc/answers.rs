//! The answers the handlers send, built from the service's domain values
//! and shown in the caller's view (`nsview`: a caller in a nested pid
//! namespace gets its own numbers, and nothing it cannot number).

use wpd_proto::v1 as pb;

use super::nsview;
use crate::authz::Caller;
use crate::convert;
use crate::service::process::Listing;
use crate::service::watch::{Removed, SetOutcome};

/// A `SetWatchpoint` answer; `asked_pid` is the pid as the caller gave it,
/// `backend` the process's.
pub fn set_watchpoint(
    caller: &Caller,
    set: &SetOutcome,
    asked_pid: i32,
    backend: Option<crate::model::BackendKind>,
) -> pb::SetWatchpointResponse {
    match set {
        SetOutcome::Watch { view, took } => {
            let mut watchpoint: pb::Watchpoint = view.into();
            nsview::watchpoint_out(caller, &mut watchpoint);
            pb::SetWatchpointResponse {
                watchpoint: Some(watchpoint),
                arm_duration_ns: took.as_nanos() as u64,
                warnings: view.warnings.clone(),
                symbol: view.symbol.as_ref().map(convert::symbol_to_pb),
            }
        }
        SetOutcome::Code(view) => {
            let mut w = convert::object_view_to_pb(view);
            if let Some(b) = backend {
                w.backend = convert::backend_to_pb(b) as i32;
            }
            if let Some(s) = w.spec.as_mut() {
                s.pid = asked_pid;
            }
            let what = if view.code.line.is_some() {
                "whose line table has that line"
            } else {
                "that defines it"
            };
            let warnings = view
                .pending_why
                .iter()
                .map(|why| {
                    format!("pending: {why}; it is set when the process loads a library {what}")
                })
                .collect();
            pb::SetWatchpointResponse {
                watchpoint: Some(w),
                warnings,
                ..Default::default()
            }
        }
    }
}

/// A `RemoveWatchpoint` answer.
pub fn removed(caller: &Caller, r: &Removed) -> pb::RemoveWatchpointResponse {
    let watchpoint = match r {
        Removed::Policy(view) => pb::Watchpoint {
            id: view.id.0,
            policy_id: view.id.0,
            spec: Some(convert::spec_to_pb(&view.spec)),
            created_at_ns: view.created_at_ns,
            ..Default::default()
        },
        Removed::Code(view, backend) => {
            let mut w = convert::object_view_to_pb(view);
            if let Some(b) = backend {
                w.backend = convert::backend_to_pb(*b) as i32;
            }
            nsview::watchpoint_out(caller, &mut w);
            w
        }
        Removed::Watch(view) => {
            let mut w: pb::Watchpoint = view.into();
            nsview::watchpoint_out(caller, &mut w);
            w
        }
    };
    pb::RemoveWatchpointResponse {
        watchpoint: Some(watchpoint),
    }
}

/// A `ListWatchpoints` answer (`not_restored`: the saved entries of the
/// caller's that were not set again).
pub fn listing(
    caller: &Caller,
    l: &Listing,
    not_restored: Vec<pb::NotRestored>,
) -> pb::ListWatchpointsResponse {
    let mut watchpoints: Vec<pb::Watchpoint> = l.watches.iter().map(Into::into).collect();
    watchpoints.extend(l.codes.iter().map(|(o, backend)| {
        let mut w = convert::object_view_to_pb(o);
        w.backend = convert::backend_to_pb(*backend) as i32;
        w
    }));
    let mut processes: Vec<pb::ProcessInfo> = l.processes.iter().map(Into::into).collect();
    processes.retain_mut(|p| nsview::process_out(caller, p));
    watchpoints.retain_mut(|w| nsview::watchpoint_out(caller, w));
    let policies = l
        .policies
        .iter()
        .map(|v| {
            let mut p: pb::Policy = v.into();
            nsview::policy_out(caller, &mut p, &v.refusals);
            p
        })
        .collect();
    pb::ListWatchpointsResponse {
        watchpoints,
        processes,
        policies,
        not_restored,
    }
}

/// The saved entries of `caller`'s (all, for a privileged caller) that
/// were not set again, of process `pid` (0: all). Saved in the daemon's
/// numbers, by uid: not a nested caller's to see.
pub fn not_restored(
    caller: &Caller,
    persist: Option<&std::sync::Arc<crate::service::persist::Persist>>,
    pid: i32,
) -> Vec<pb::NotRestored> {
    let Some(p) = persist else {
        return Vec::new();
    };
    if nsview::translated(caller) {
        return Vec::new();
    }
    p.not_restored_list((!caller.privileged).then_some(caller.uid))
        .into_iter()
        .filter(|n| pid == 0 || n.spec.as_ref().is_some_and(|s| s.pid == pid))
        .collect()
}

/// A `GetThreadStack` answer: `frames` symbolized (or raw), the
/// registers and the frames' locals.
pub fn thread_stack(
    stack: &crate::engine::ThreadStack,
    frames: Vec<pb::Location>,
) -> pb::GetThreadStackResponse {
    pb::GetThreadStackResponse {
        frames,
        note: stack.note.unwrap_or_default().to_string(),
        sp: stack.regs.sp,
        fp: stack.regs.fp,
        registers: stack
            .regs
            .general
            .iter()
            .map(|&(name, value)| pb::Register {
                name: name.to_string(),
                value,
            })
            .collect(),
        locals: stack.locals.iter().map(frame_locals).collect(),
    }
}

/// A frame's variables as sent.
fn frame_locals(locals: &Result<Vec<crate::symbols::frame::LocalVar>, String>) -> pb::FrameLocals {
    match locals {
        Err(note) => pb::FrameLocals {
            variables: Vec::new(),
            note: note.clone(),
        },
        Ok(vars) => pb::FrameLocals {
            variables: vars
                .iter()
                .map(|v| pb::LocalVariable {
                    name: v.name.clone(),
                    r#type: v.type_name.clone(),
                    parameter: v.parameter,
                    address: v.address.unwrap_or(0),
                    value: v.value.clone().unwrap_or_default(),
                    error: v.value.as_ref().err().cloned().unwrap_or_default(),
                })
                .collect(),
            note: String::new(),
        },
    }
}

/// The addresses a held thread's frames are looked up at: return
/// addresses at `ret - 1` (in the call); the innermost frame at `ip - 1`
/// only right after its own hit (the trap follows the access): a thread
/// stopped anywhere else resumes at `ip`, which may be a function's first
/// instruction.
pub fn lookup_addresses(stack: &crate::engine::ThreadStack) -> Vec<(u64, u64)> {
    stack
        .ips
        .iter()
        .enumerate()
        .map(|(i, &ip)| {
            let exact = i == 0 && !stack.regs.after_hit;
            (ip, if exact { ip } else { ip.saturating_sub(1) })
        })
        .collect()
}

/// Raw locations of `at` (no symbols).
pub fn raw_locations(at: &[(u64, u64)]) -> Vec<pb::Location> {
    at.iter()
        .map(|&(ip, lookup_address)| pb::Location {
            ip,
            lookup_address,
            ..Default::default()
        })
        .collect()
}

/// The variables of `ListVariables`.
pub fn variables(
    views: Vec<crate::symbols::children::VariableView>,
    total: u64,
) -> pb::ListVariablesResponse {
    pb::ListVariablesResponse {
        variables: views
            .into_iter()
            .map(|v| pb::VariableView {
                name: v.name,
                expression: v.expression,
                type_name: v.type_name,
                address: v.address,
                size: v.size,
                value: v.value,
                error: v.error,
                children: v.children,
            })
            .collect(),
        total,
    }
}

/// The capabilities of `GetCapabilities`.
pub fn capabilities(core: &crate::engine::Core) -> pb::GetCapabilitiesResponse {
    use crate::arch;
    let backends = core
        .backends()
        .into_iter()
        .map(|a| pb::BackendInfo {
            backend: convert::backend_to_pb(a.kind) as i32,
            usable: a.usable,
            reason: a.reason,
            is_default: a.is_default,
            stops: a.stops,
            events: a.events,
            code_events: a.code_events,
            new_processes: a.new_processes,
        })
        .collect();
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    pb::GetCapabilitiesResponse {
        arch: arch::current::ARCH.into(),
        slots_per_thread: arch::current::SLOTS as u32,
        lengths: arch::current::LENGTHS.to_vec(),
        access_kinds: arch::current::ACCESS_KINDS
            .iter()
            .map(|&a| convert::access_to_pb(a) as i32)
            .collect(),
        max_user_address: arch::current::USER_ADDR_LIMIT,
        backends,
        version: env!("CARGO_PKG_VERSION").into(),
        cpus: core.cpus() as u32,
        kernel,
    }
}
