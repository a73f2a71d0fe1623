//! `wpctl list`: the daemon's watchpoints and attached processes (ListWatchpoints).

use clap::Args;
use serde_json::json;
use wpd_proto::v1::{ListWatchpointsRequest, ListWatchpointsResponse};

use crate::args::pid_parser;
use crate::cmd::{Ctx, Report};
use crate::error::Error;
use crate::output::{self, Table, hex};
use wpd_proto::text::escape;

/// `wpctl list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this process
    #[arg(long, value_parser = pid_parser())]
    pub pid: Option<i32>,
}

/// Runs `wpctl list`.
pub async fn run(ctx: &Ctx, args: &ListArgs) -> Result<(), Error> {
    report(ctx, args).await?.emit(ctx.json)
}

/// Asks the daemon and renders its answer.
pub async fn report(ctx: &Ctx, args: &ListArgs) -> Result<Report, Error> {
    let request = ListWatchpointsRequest {
        pid: args.pid.unwrap_or(0),
    };
    let resp = ctx
        .unary(
            request,
            |mut c, r| async move { c.list_watchpoints(r).await },
        )
        .await?;
    Ok(Report::new(to_text(&resp), to_json(&resp)))
}

fn to_json(resp: &ListWatchpointsResponse) -> serde_json::Value {
    json!({
        "watchpoints": resp.watchpoints.iter().map(output::watchpoint_json).collect::<Vec<_>>(),
        "processes": resp.processes.iter().map(output::process_json).collect::<Vec<_>>(),
        "policies": resp.policies.iter().map(output::policy_json).collect::<Vec<_>>(),
        "not_restored": resp.not_restored.iter().map(|n| json!({
            "saved_id": n.saved_id,
            "pid": n.spec.as_ref().map_or(0, |s| s.pid),
            "symbol": n.spec.as_ref().map(|s| s.symbol.clone()).unwrap_or_default(),
            "address": n.spec.as_ref().map_or(0, |s| s.address),
            "selector": n.selector.as_ref().map(|s| output::selector_phrase(Some(s))),
            "reason": n.reason,
            "at_ns": n.at_ns,
        })).collect::<Vec<_>>(),
    })
}

/// What a restart could not set again, one line each.
fn not_restored_text(resp: &ListWatchpointsResponse) -> String {
    let mut text = String::new();
    for n in &resp.not_restored {
        let spec = n.spec.clone().unwrap_or_default();
        let what = if !spec.symbol.is_empty() {
            escape(&spec.symbol).into_owned()
        } else {
            hex(spec.address)
        };
        let whose = match &n.selector {
            Some(s) => format!("policy on {}", output::selector_phrase(Some(s))),
            None => format!("pid {}", spec.pid),
        };
        text.push_str(&format!(
            "not set again: #{} {what} ({whose}): {}\n",
            n.saved_id,
            escape(&n.reason)
        ));
    }
    text
}

/// Two tables: watchpoints (ID PID SCOPE ADDRESS LEN ACCESS ACTION THREADS
/// HITS BACKEND, and NAME when some were set by name; ACTION is log, stop or stop-all, with `+change` for
/// only-on-change watchpoints), then attached processes (PID COMM BACKEND
/// THREADS WATCHPOINTS ATTACHED).
fn to_text(resp: &ListWatchpointsResponse) -> String {
    let mut text = not_restored_text(resp);
    if !text.is_empty() {
        text.push('\n');
    }
    // Policies first (when there are any), each with its instances.
    if !resp.policies.is_empty() {
        let mut t = Table::new([
            "POLICY",
            "WATCHES",
            "PROCESSES",
            "INSTANCES",
            "MADE",
            "REFUSED",
        ]);
        for p in &resp.policies {
            t.row(vec![
                p.id.to_string(),
                output::policy_what(p),
                output::selector_phrase(p.selector.as_ref()),
                p.instances.len().to_string(),
                p.instances_made.to_string(),
                p.refusals.len().to_string(),
            ]);
        }
        text.push_str(&t.render());
        for p in &resp.policies {
            for i in &p.instances {
                text.push_str(&format!(
                    "  policy {}: pid {} ({}) watchpoint {}, armed {} after the daemon saw it ({})\n",
                    p.id,
                    i.pid,
                    escape(&i.comm),
                    i.watchpoint_id,
                    output::duration_ns(i.latency_ns),
                    output::instance_source_name(i.found_by)
                ));
            }
            for r in &p.refusals {
                text.push_str(&format!(
                    "  policy {}: pid {} ({}) refused: {}\n",
                    p.id,
                    r.pid,
                    escape(&r.comm),
                    escape(&r.reason)
                ));
            }
        }
        text.push('\n');
    }
    if resp.watchpoints.is_empty() {
        text.push_str("no watchpoints\n");
    } else {
        // NAME only when some watchpoint was set by name.
        let named = resp
            .watchpoints
            .iter()
            .any(|w| w.symbol.is_some() || w.breakpoint.is_some() || w.pending);
        let mut header = vec![
            "ID", "PID", "SCOPE", "ADDRESS", "LEN", "ACCESS", "ACTION", "THREADS", "HITS",
            "BACKEND",
        ];
        if named {
            header.push("NAME");
        }
        let mut t = Table::new(header);
        for wp in &resp.watchpoints {
            let spec = wp.spec.clone().unwrap_or_default();
            if let Some(p) = &wp.breakpoint {
                t.row(breakpoint_row(wp, &spec, p, named));
                continue;
            }
            if wp.pending {
                t.row(pending_row(wp, &spec, named));
                continue;
            }
            let mut row = vec![
                wp.id.to_string(),
                spec.pid.to_string(),
                output::scope(wp),
                hex(spec.address),
                spec.length.to_string(),
                output::access_name(spec.access),
                output::action_short(&spec),
                wp.armed_threads.to_string(),
                wp.hits.to_string(),
                output::backend_name(wp.backend),
            ];
            if named {
                row.push(
                    wp.symbol
                        .as_ref()
                        .map(|s| escape(&s.expression).into_owned())
                        .unwrap_or_else(|| "-".into()),
                );
            }
            t.row(row);
        }
        text.push_str(&t.render());
    }
    text.push('\n');
    if resp.processes.is_empty() {
        text.push_str("no attached processes\n");
    } else {
        let mut t = Table::new([
            "PID",
            "COMM",
            "BACKEND",
            "THREADS",
            "WATCHPOINTS",
            "ATTACHED",
            "STOPS",
        ]);
        for p in &resp.processes {
            t.row(vec![
                p.pid.to_string(),
                output::name_or_dash(&p.comm),
                output::backend_name(p.backend),
                p.threads.to_string(),
                p.watchpoints.to_string(),
                output::ago(p.attached_at_ns),
                output::name_or_dash(&p.stops),
            ]);
        }
        text.push_str(&t.render());
    }
    text
}

/// A pending code event's row: `pending` for its address (its module is
/// not loaded yet), its function as its name.
fn pending_row(
    wp: &wpd_proto::v1::Watchpoint,
    spec: &wpd_proto::v1::WatchpointSpec,
    named: bool,
) -> Vec<String> {
    let code = spec.code_event.clone().unwrap_or_default();
    let mut row = vec![
        wp.id.to_string(),
        spec.pid.to_string(),
        output::scope(wp),
        "pending".into(),
        "-".into(),
        if code.stop {
            "break".into()
        } else {
            output::access_name(spec.access)
        },
        output::action_short(spec),
        "-".into(),
        "0".into(),
        output::backend_name(wp.backend),
    ];
    if named {
        row.push(format!(
            "{} (pending: not loaded yet)",
            output::code_at(&code)
        ));
    }
    row
}

/// A code breakpoint's row: its probe's address, `break` for the access,
/// THREADS `-` (it spends no slot) and, as its name, the function and the
/// file's name and line.
fn breakpoint_row(
    wp: &wpd_proto::v1::Watchpoint,
    spec: &wpd_proto::v1::WatchpointSpec,
    p: &wpd_proto::v1::BreakpointPlace,
    named: bool,
) -> Vec<String> {
    let mut row = vec![
        wp.id.to_string(),
        spec.pid.to_string(),
        output::scope(wp),
        hex(p.address),
        "-".into(),
        "break".into(),
        output::action_short(spec),
        "-".into(),
        wp.hits.to_string(),
        output::backend_name(wp.backend),
    ];
    if named {
        let mut name = escape(&p.function).into_owned();
        if !p.file.is_empty() && p.line > 0 {
            name.push_str(&format!(
                " ({}:{})",
                escape(output::file_name(&p.file)),
                p.line
            ));
        }
        row.push(name);
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use wpd_proto::v1::{Access, Backend, HitAction, ProcessInfo, Watchpoint, WatchpointSpec};

    #[test]
    fn renders() {
        let resp = ListWatchpointsResponse {
            policies: vec![],
            watchpoints: vec![
                Watchpoint {
                    value_type: None,
                    objects: None,
                    object_watchpoints: vec![],
                    breakpoint: None,
                    pending: false,
                    pending_reason: String::new(),
                    policy_id: 0,
                    forked_children: vec![],
                    pieces: vec![],
                    hits_filtered: 0,
                    hits_rate_limited: 0,
                    symbol: None,
                    id: 7,
                    spec: Some(WatchpointSpec {
                        allow_init: false,
                        pid: 123,
                        tids: vec![124, 125],
                        address: 0x1040,
                        length: 4,
                        access: Access::ReadWrite as i32,
                        backend: 0,
                        action: HitAction::Unspecified as i32,
                        only_on_change: false,
                        ..Default::default()
                    }),
                    process_wide: false,
                    armed_threads: 2,
                    hits: 42,
                    created_at_ns: 0,
                    backend: Backend::Ptrace as i32,
                },
                Watchpoint {
                    value_type: None,
                    objects: None,
                    object_watchpoints: vec![],
                    breakpoint: None,
                    pending: false,
                    pending_reason: String::new(),
                    policy_id: 0,
                    forked_children: vec![],
                    pieces: vec![],
                    hits_filtered: 0,
                    hits_rate_limited: 0,
                    symbol: None,
                    id: 8,
                    spec: Some(WatchpointSpec {
                        allow_init: false,
                        pid: 123,
                        tids: vec![],
                        address: 0x1048,
                        length: 8,
                        access: Access::Write as i32,
                        backend: Backend::Ptrace as i32,
                        action: HitAction::StopAll as i32,
                        only_on_change: true,
                        ..Default::default()
                    }),
                    process_wide: true,
                    armed_threads: 3,
                    hits: 1,
                    created_at_ns: 0,
                    backend: Backend::Ptrace as i32,
                },
            ],
            processes: vec![ProcessInfo {
                pid: 123,
                backend: Backend::Ptrace as i32,
                threads: 3,
                watchpoints: 1,
                comm: "demo".into(),
                attached_at_ns: 0,
                stops: "signal SIGURG".into(),
            }],
            ..Default::default()
        };
        expect![[r#"
            ID  PID  SCOPE    ADDRESS  LEN  ACCESS  ACTION           THREADS  HITS  BACKEND
            7   123  124,125  0x1040   4    rw      log              2        42    ptrace
            8   123  process  0x1048   8    write   stop-all+change  3        1     ptrace

            PID  COMM  BACKEND  THREADS  WATCHPOINTS  ATTACHED  STOPS
            123  demo  ptrace   3        1            -         signal SIGURG
        "#]]
        .assert_eq(&to_text(&resp));
        let v = to_json(&resp);
        assert_eq!(v["watchpoints"][0]["tids"], json!([124, 125]));
        assert_eq!(v["watchpoints"][0]["action"], "log");
        assert_eq!(v["watchpoints"][1]["action"], "stop-all");
        assert_eq!(v["watchpoints"][1]["only_on_change"], true);
        assert_eq!(v["processes"][0]["comm"], "demo");
        assert_eq!(
            to_text(&ListWatchpointsResponse::default()),
            "no watchpoints\n\nno attached processes\n"
        );
    }

    #[test]
    fn breakpoints_show_their_place() {
        let resp = ListWatchpointsResponse {
            watchpoints: vec![Watchpoint {
                id: 9,
                process_wide: true,
                hits: 2,
                backend: Backend::Ptrace as i32,
                breakpoint: Some(wpd_proto::v1::BreakpointPlace {
                    function: "conn_new".into(),
                    file: "/src/tests/c/objects.c".into(),
                    line: 48,
                    address: 0x55d0c0a0127d,
                    module: "/src/ct-objects".into(),
                    offset: 0x127d,
                }),
                spec: Some(WatchpointSpec {
                    pid: 123,
                    action: HitAction::Stop as i32,
                    code_event: Some(wpd_proto::v1::CodeEvent {
                        function: "conn_new".into(),
                        stop: true,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        expect![[r#"
            ID  PID  SCOPE    ADDRESS         LEN  ACCESS  ACTION  THREADS  HITS  BACKEND  NAME
            9   123  process  0x55d0c0a0127d  -    break   stop    -        2     ptrace   conn_new (objects.c:48)

            no attached processes
        "#]]
        .assert_eq(&to_text(&resp));
        let v = to_json(&resp);
        assert_eq!(v["watchpoints"][0]["breakpoint"]["line"], 48);
        assert_eq!(v["watchpoints"][0]["breakpoint"]["function"], "conn_new");
    }

    #[test]
    fn what_a_restart_could_not_set_again_comes_first() {
        let resp = ListWatchpointsResponse {
            not_restored: vec![wpd_proto::v1::NotRestored {
                saved_id: 4,
                spec: Some(WatchpointSpec {
                    pid: 77,
                    symbol: "counter".into(),
                    ..Default::default()
                }),
                reason: "not set again after a restart: process 77 is gone".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = to_text(&resp);
        assert!(
            text.starts_with(
                "not set again: #4 counter (pid 77): not set again after a restart: process 77 \
                 is gone\n\nno watchpoints"
            ),
            "{text}"
        );
        let v = to_json(&resp);
        assert_eq!(v["not_restored"][0]["saved_id"], 4);
        assert_eq!(v["not_restored"][0]["pid"], 77);
    }
}
