//! `wpctl watch`: set a hardware watchpoint (SetWatchpoint).

use serde_json::json;
use wpd_proto::v1::{
    Access, ExecPolicy, HitAction, Policy, ProcessSelector, SetPolicyRequest, SetWatchpointRequest,
    SetWatchpointResponse, WatchpointSpec,
};

use crate::cmd::{Ctx, Report};
use crate::error::Error;
use crate::{OnExecArg, WatchArgs, backend_value, output};
use wpd_proto::text::escape;

/// Runs `wpctl watch`.
pub async fn run(ctx: &Ctx, args: &WatchArgs) -> Result<(), Error> {
    report(ctx, args).await?.emit(ctx.json)
}

/// Sets the watchpoint (or the policy) and renders the daemon's answer.
pub async fn report(ctx: &Ctx, args: &WatchArgs) -> Result<Report, Error> {
    if args.on_exec.is_some() && args.symbol.is_none() {
        return Err(Error::Local(
            "--on-exec needs --symbol: a watchpoint set by address is always removed at exec"
                .into(),
        ));
    }
    let policy =
        args.pids.len() != 1 || args.comm.is_some() || args.exe.is_some() || args.cgroup.is_some();
    if policy && !args.tids.is_empty() {
        return Err(Error::Local(
            "--tid names threads of one process: it cannot go with a policy (several --pid, \
             --comm, --exe or --cgroup)"
                .into(),
        ));
    }
    let spec = WatchpointSpec {
        lease: 0,
        pid: if policy { 0 } else { args.pids[0] },
        tids: args.tids.clone(),
        address: args.addr.unwrap_or(0),
        length: match (args.len, &args.symbol) {
            (Some(l), _) => l,
            (None, Some(_)) => 0,
            (None, None) => 8,
        },
        access: Access::from(args.access) as i32,
        backend: backend_value(args.backend),
        action: HitAction::from(args.action) as i32,
        only_on_change: args.on_change,
        allow_init: args.allow_init,
        symbol: args.symbol.clone().unwrap_or_default(),
        on_exec: match args.on_exec {
            None => ExecPolicy::Unspecified,
            Some(OnExecArg::Resolve) => ExecPolicy::ResolveAgain,
            Some(OnExecArg::Remove) => ExecPolicy::Remove,
        } as i32,
        backtrace_depth: args.backtrace.unwrap_or(0),
        condition: args.condition,
        ignore_count: args.ignore,
        hit_count: args.hit_count.unwrap_or(0),
        max_hits_per_second: args.max_rate.unwrap_or(0),
        keep_recent: args.keep.unwrap_or(0),
        follow_forks: args.follow_forks,
        thread_name: args.thread_name.clone().unwrap_or_default(),
        aggregate: args.aggregate,
        exemplars_per_second: args.exemplars.unwrap_or(0),
    };
    if policy {
        return set_policy(ctx, args, spec).await;
    }
    let request = SetWatchpointRequest { spec: Some(spec) };
    let resp = ctx
        .unary(request, |mut c, r| async move { c.set_watchpoint(r).await })
        .await?;
    Ok(Report {
        text: to_text(&resp),
        json: to_json(&resp),
        warnings: resp.warnings.clone(),
    })
}

/// `wpctl watch` with a selector: SetPolicy.
async fn set_policy(ctx: &Ctx, args: &WatchArgs, spec: WatchpointSpec) -> Result<Report, Error> {
    let request = SetPolicyRequest {
        selector: Some(ProcessSelector {
            pids: args.pids.clone(),
            comm: args.comm.clone().unwrap_or_default(),
            exe: args.exe.clone().unwrap_or_default(),
            cgroup: args.cgroup.clone().unwrap_or_default(),
        }),
        spec: Some(spec),
    };
    let resp = ctx
        .unary(request, |mut c, r| async move { c.set_policy(r).await })
        .await?;
    let p = resp.policy.unwrap_or_default();
    Ok(Report::new(
        policy_text(&p),
        json!({ "policy": output::policy_json(&p) }),
    ))
}

/// `policy 9: write counter in every process with comm fuzzer; 3 instances now (pid 10
/// watchpoint 11, ...)`.
fn policy_text(p: &Policy) -> String {
    let mut s = format!(
        "policy {}: {} in {}; {} now",
        p.id,
        output::policy_what(p),
        output::selector_phrase(p.selector.as_ref()),
        output::plural(p.instances.len() as u32, "instance"),
    );
    if !p.instances.is_empty() {
        let list: Vec<String> = p
            .instances
            .iter()
            .map(|i| format!("pid {} watchpoint {}", i.pid, i.watchpoint_id))
            .collect();
        s.push_str(&format!(" ({})", list.join(", ")));
    }
    for r in &p.refusals {
        s.push_str(&format!(
            "\n  pid {} ({}) refused: {}",
            r.pid,
            escape(&r.comm),
            escape(&r.reason)
        ));
    }
    s
}

fn to_json(resp: &SetWatchpointResponse) -> serde_json::Value {
    json!({
        "watchpoint": resp.watchpoint.as_ref().map(output::watchpoint_json),
        "arm_duration_ns": resp.arm_duration_ns,
        "warnings": resp.warnings,
        "symbol": resp.symbol.as_ref().map(output::symbol_json),
    })
}

/// What a hit does, for the confirmation line; nothing for log.
fn action_phrase(action: i32) -> Option<String> {
    match HitAction::try_from(action) {
        Ok(HitAction::Log | HitAction::Unspecified) => None,
        Ok(HitAction::Stop) => Some("stop on hit".into()),
        Ok(HitAction::StopAll) => Some("stop all threads on hit".into()),
        Err(_) => Some(format!("action {}", output::action_name(action))),
    }
}

/// `watchpoint 7: write 8 bytes at 0x55d0c0a01040 in pid 123, armed on 1001
/// threads (process-wide, 4.2 ms)`; with `--tid`: `(tids 124,125, 0.3 ms)`;
/// with `--action stop --on-change`: `(process-wide, stop on hit, only on
/// change, 4.2 ms)`.
fn to_text(resp: &SetWatchpointResponse) -> String {
    let wp = resp.watchpoint.clone().unwrap_or_default();
    let spec = wp.spec.clone().unwrap_or_default();
    let mut notes = vec![if wp.process_wide {
        "process-wide".to_string()
    } else if !spec.thread_name.is_empty() {
        format!("threads named {}", escape(&spec.thread_name))
    } else {
        format!("tids {}", output::scope(&wp))
    }];
    if spec.follow_forks {
        notes.push("and forked children".into());
    }
    notes.extend(action_phrase(spec.action));
    if spec.only_on_change {
        notes.push("only on change".into());
    }
    if spec.backtrace_depth > 0 {
        notes.push(format!("backtraces of {} frames", spec.backtrace_depth));
    }
    notes.extend(output::filter_phrases(&spec));
    notes.push(output::duration_ns(resp.arm_duration_ns));
    format!(
        "watchpoint {}: {}, armed on {} ({})",
        wp.id,
        output::describe(&wp),
        output::plural(wp.armed_threads, "thread"),
        notes.join(", "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use wpd_proto::v1::{Backend, Watchpoint};

    fn response(tids: Vec<i32>, action: HitAction, only_on_change: bool) -> SetWatchpointResponse {
        SetWatchpointResponse {
            symbol: None,
            watchpoint: Some(Watchpoint {
                policy_id: 0,
                forked_children: vec![],
                pieces: vec![],
                hits_filtered: 0,
                hits_rate_limited: 0,
                symbol: None,
                id: 7,
                process_wide: tids.is_empty(),
                armed_threads: if tids.is_empty() {
                    1001
                } else {
                    tids.len() as u32
                },
                spec: Some(WatchpointSpec {
                    pid: 123,
                    tids,
                    address: 0x55d0c0a01040,
                    length: 8,
                    access: Access::Write as i32,
                    backend: 0,
                    action: action as i32,
                    only_on_change,
                    ..Default::default()
                }),
                hits: 0,
                created_at_ns: 5,
                backend: if action == HitAction::Log && !only_on_change {
                    Backend::Perf as i32
                } else {
                    Backend::Ptrace as i32
                },
            }),
            arm_duration_ns: 4_200_000,
            warnings: vec![],
        }
    }

    #[test]
    fn renders() {
        assert_eq!(
            to_text(&response(vec![], HitAction::Log, false)),
            "watchpoint 7: write 8 bytes at 0x55d0c0a01040 in pid 123, \
             armed on 1001 threads (process-wide, 4.2 ms)"
        );
        assert_eq!(
            to_text(&response(vec![124, 125], HitAction::Unspecified, false)),
            "watchpoint 7: write 8 bytes at 0x55d0c0a01040 in pid 123, \
             armed on 2 threads (tids 124,125, 4.2 ms)"
        );
        let v = to_json(&response(vec![], HitAction::Log, false));
        assert_eq!(v["watchpoint"]["address"], "0x55d0c0a01040");
        assert_eq!(v["watchpoint"]["access"], "write");
        assert_eq!(v["watchpoint"]["backend"], "perf");
        assert_eq!(v["watchpoint"]["action"], "log");
        assert_eq!(v["watchpoint"]["only_on_change"], false);
        assert_eq!(v["arm_duration_ns"], 4_200_000);
    }

    #[test]
    fn renders_actions_and_on_change() {
        assert_eq!(
            to_text(&response(vec![], HitAction::Stop, true)),
            "watchpoint 7: write 8 bytes at 0x55d0c0a01040 in pid 123, \
             armed on 1001 threads (process-wide, stop on hit, only on change, 4.2 ms)"
        );
        assert_eq!(
            to_text(&response(vec![124], HitAction::StopAll, false)),
            "watchpoint 7: write 8 bytes at 0x55d0c0a01040 in pid 123, \
             armed on 1 thread (tids 124, stop all threads on hit, 4.2 ms)"
        );
        assert_eq!(
            to_text(&response(vec![], HitAction::Log, true)),
            "watchpoint 7: write 8 bytes at 0x55d0c0a01040 in pid 123, \
             armed on 1001 threads (process-wide, only on change, 4.2 ms)"
        );
        let v = to_json(&response(vec![], HitAction::StopAll, true));
        assert_eq!(v["watchpoint"]["action"], "stop-all");
        assert_eq!(v["watchpoint"]["only_on_change"], true);
        assert_eq!(v["watchpoint"]["backend"], "ptrace");
    }
}
