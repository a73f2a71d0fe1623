//! Watchpoints armed by code events (`--on-return`, `--on-entry`) against
//! `tests/c/objects.c`: objects created by a function in several threads,
//! each legitimately updated, and one rare path corrupting a field. A
//! condition catches only the corruption, and the hit names its function
//! and line; a store right after the function returns is caught (the thread
//! is held at the probe until the object is armed); `--disarm-on free` and
//! `unwatch` leave no slot held; parameters by their DWARF names, `$arg0`
//! without DWARF; every bad expression and unknown function refused; slots
//! exact after many objects on several threads in both scopes, armed at
//! the probe's stop by its tracer or, for threads of other tracers, by the
//! objects thread; policies with a code event, one object watch per
//! process, set again after a restart. Only the ptrace backend holds a
//! thread at a probe: perf is refused, with the reason.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use wpd_proto::v1::{
    Access, Backend as PbBackend, CodeEvent, GetStatsRequest, Hit, ListWatchpointsRequest,
    ObjectCounts, SlotState, WatchpointSpec,
};
use wpd_tests::{
    Backend, CTarget, Client, Daemon, EventStream, line_of, list_threads, require_backend, rpc,
    rpc_ok, run_wpctl,
};

const HIT_TIMEOUT: Duration = Duration::from_secs(20);
const CLI_TIMEOUT: Duration = Duration::from_secs(20);

async fn wpctl(daemon: &Daemon, args: &[&str]) -> Result<wpd_tests::CmdOutput> {
    let ep = daemon.endpoint();
    let mut all = vec!["--endpoint", ep.as_str()];
    all.extend_from_slice(args);
    run_wpctl(&all, CLI_TIMEOUT).await
}

/// The id in `watchpoint 7: ...`.
fn id_of(stdout: &str) -> Result<u64> {
    stdout
        .strip_prefix("watchpoint ")
        .and_then(|s| s.split(':').next())
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no watchpoint id in {stdout:?}"))
}

/// A code event's spec over gRPC.
fn code_spec(pid: i32, function: &str, at_return: bool, expr: &str) -> WatchpointSpec {
    WatchpointSpec {
        pid,
        symbol: expr.into(),
        access: Access::Write as i32,
        backend: PbBackend::Ptrace as i32,
        code_event: Some(CodeEvent {
            function: function.into(),
            at_return,
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn counts(client: &mut Client, pid: i32, id: u64) -> Result<ObjectCounts> {
    let l = rpc_ok(
        "ListWatchpoints",
        client.list_watchpoints(ListWatchpointsRequest { pid }),
    )
    .await?;
    l.watchpoints
        .iter()
        .find(|w| w.id == id)
        .and_then(|w| w.objects)
        .with_context(|| format!("watchpoint {id} with object counts in {l:?}"))
}

/// The counts of object watch `id` once `disarmed` of its objects are
/// off, with `slots` slots of ours held on `pid` (when given): a freeing
/// call stops no one, its object is taken off at the next stop of one of
/// the process's threads or by the daemon's sweep soon after.
async fn counts_settled(
    client: &mut Client,
    pid: i32,
    id: u64,
    disarmed: u64,
    slots: Option<usize>,
) -> Result<ObjectCounts> {
    wpd_tests::poll_until(
        Duration::from_secs(10),
        "the freed objects taken off",
        async || {
            let c = counts(client, pid, id).await?;
            let held = match slots {
                Some(_) => Some(slots_held(client, pid).await?),
                None => None,
            };
            Ok(if c.disarmed == disarmed && held == slots {
                Ok(())
            } else {
                Err(format!("{c:?}, slots held {held:?}"))
            })
        },
    )
    .await?;
    counts(client, pid, id).await
}

/// Slots of ours held on `pid`'s threads.
async fn slots_held(client: &mut Client, pid: i32) -> Result<usize> {
    let t = list_threads(client, pid, false).await?;
    Ok(t.threads
        .iter()
        .flat_map(|t| t.slots.iter())
        .filter(|s| s.state == SlotState::Ours as i32)
        .count())
}

fn check_line(hit: &Hit, function: &str, tag: &str) -> Result<()> {
    let loc = hit.location.as_ref().context("a hit without location")?;
    let (file, line) = line_of(tag);
    ensure!(
        loc.function == function && loc.line == line && loc.file.ends_with(file),
        "expected {function} ({file}:{line}), got {loc:?}"
    );
    Ok(())
}

/// `--on-return conn_new --expr '$ret->state' --condition '== 0xdead'
/// --disarm-on free`: of 3 threads × 200 objects, each updated three times,
/// only the corruption is reported, at conn_corrupt's line; a store by the
/// caller right after conn_new returns is caught; every object is disarmed
/// at its free, and nothing is held after `unwatch`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_return_catches_only_the_corruption() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-objects").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events =
                EventStream::subscribe(&mut client, wpd_tests::hits_only(t.pid)).await?;
            let pid = t.pid.to_string();
            let out = wpctl(
                &daemon,
                &[
                    "watch",
                    "--pid",
                    &pid,
                    "--backend",
                    "ptrace",
                    "--on-return",
                    "conn_new",
                    "--expr",
                    "$ret->state",
                    "--condition",
                    "== 0xdead",
                    "--disarm-on",
                    "free",
                ],
            )
            .await?;
            ensure!(out.code == Some(0), "wpctl watch: {out:?}");
            let id = id_of(&out.stdout)?;
            ensure!(
                out.stdout.contains("returned by conn_new"),
                "{}",
                out.stdout
            );

            t.cmd("run 3 200").await?;
            t.cmd("corrupt").await?;
            // Hits come in order, each reported while its thread is
            // stopped: the first is the corruption, or a legitimate update
            // got through.
            let hit = events.collect_hits(1, HIT_TIMEOUT).await?.remove(0);
            check_line(&hit, "conn_corrupt", "corrupt")?;
            ensure!(hit.value == 0xdead_u64.to_le_bytes().to_vec(), "{hit:?}");

            t.cmd("first").await?;
            let hit = events.collect_hits(1, HIT_TIMEOUT).await?.remove(0);
            check_line(&hit, "main", "first")?;

            let c = counts_settled(&mut client, t.pid, id, 602, Some(0)).await?;
            ensure!(
                c.armed == 602 && c.disarmed == 602 && c.live == 0,
                "every object armed and disarmed at free: {c:?}"
            );
            ensure!(
                c.no_slot == 0 && c.over_limit == 0 && c.failed == 0,
                "{c:?}"
            );
            // Every thread was created after the attach by the main thread:
            // all belong to its tracer, which arms objects at their stop
            // and takes the freed ones off at the next; no free stopped its
            // thread.
            ensure!(
                c.armed_at_stop > 0 && c.disarmed_at_stop > 0 && c.freed_without_stop == 602,
                "{c:?}"
            );
            let stats = rpc_ok("GetStats", client.get_stats(GetStatsRequest::default())).await?;
            ensure!(
                stats.objects.is_some_and(|o| o.armed == 602),
                "GetStats: {:?}",
                stats.objects
            );

            // Objects kept alive hold their slots until unwatch.
            t.cmd("keep 2").await?;
            ensure!(
                slots_held(&mut client, t.pid).await? == 2,
                "two live objects"
            );
            let out = wpctl(&daemon, &["unwatch", &id.to_string()]).await?;
            ensure!(out.code == Some(0), "wpctl unwatch: {out:?}");
            ensure!(
                slots_held(&mut client, t.pid).await? == 0,
                "slots held after unwatch"
            );
            // The probes went with it: new objects are not armed.
            t.cmd("keep 1").await?;
            ensure!(
                slots_held(&mut client, t.pid).await? == 0,
                "armed after unwatch"
            );
            Ok(())
        }
        .await,
    )
}

/// Sets an object watch of `conn_new`'s `$ret->state` reporting the value
/// 0xdead, disarmed at `free`, on the creating thread only or on every
/// thread; its id.
async fn watch_conns(client: &mut Client, pid: i32, creator_only: bool) -> Result<u64> {
    let mut spec = code_spec(pid, "conn_new", true, "$ret->state");
    let ce = spec.code_event.as_mut().unwrap();
    ce.creator_only = creator_only;
    ce.disarm_on = "free".into();
    // Only the corruption's value is reported (not conn_set_state's).
    spec.condition = Some(wpd_proto::v1::HitCondition {
        value: String::new(),
        op: wpd_proto::v1::hit_condition::Op::Eq as i32,
        operand: 0xdead,
        mask: 0,
    });
    let r = rpc_ok(
        "SetWatchpoint(conn_new)",
        client.set_watchpoint(wpd_proto::v1::SetWatchpointRequest { spec: Some(spec) }),
    )
    .await?;
    Ok(r.watchpoint.context("no watchpoint")?.id)
}

/// Many objects on several threads, in both scopes: every object armed is
/// disarmed at its `free`, no slot stays held, and the caller's store right
/// after `conn_new` returns is still caught. On the creating thread only,
/// each object is armed and disarmed by the tracer holding the thread, at
/// the probe's stop. On every thread, with threads that existed at attach
/// (spread over the tracer threads, four by default, one each), the same:
/// the tracer holding the creator opens the breakpoints of the other
/// tracers' threads itself, and a store by each of those threads into an
/// object it is handed is a hit, with that thread's tid, at its line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_exact_on_many_threads_in_both_scopes() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-objects").await?;
    let r = t.cmd("writers 3").await?;
    ensure!(r == "WRITERS n=3", "{r}");
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events =
                EventStream::subscribe(&mut client, wpd_tests::hits_only(t.pid)).await?;

            let id = watch_conns(&mut client, t.pid, true).await?;
            let r = t.cmd("run 4 250").await?;
            ensure!(r == "RAN n=1000", "{r}");
            let c = counts_settled(&mut client, t.pid, id, 1000, Some(0)).await?;
            ensure!(
                c.armed == 1000 && c.disarmed == 1000 && c.live == 0,
                "creator scope: {c:?}"
            );
            ensure!(
                c.no_slot == 0 && c.over_limit == 0 && c.failed == 0,
                "creator scope: {c:?}"
            );
            ensure!(
                c.armed_at_stop > 0 && c.disarmed_at_stop > 0 && c.freed_without_stop == 1000,
                "creator scope, objects armed at their stop, no free stopped: {c:?}"
            );
            t.cmd("first").await?;
            let hit = events.collect_hits(1, HIT_TIMEOUT).await?.remove(0);
            check_line(&hit, "main", "first")?;
            ensure!(hit.value == 0xdead_u64.to_le_bytes().to_vec(), "{hit:?}");
            rpc_ok(
                "RemoveWatchpoint",
                client.remove_watchpoint(wpd_proto::v1::RemoveWatchpointRequest { id }),
            )
            .await?;

            let id = watch_conns(&mut client, t.pid, false).await?;
            let r = t.cmd("run 2 100").await?;
            ensure!(r == "RAN n=200", "{r}");
            let c = counts_settled(&mut client, t.pid, id, 200, Some(0)).await?;
            ensure!(
                c.armed == 200 && c.disarmed == 200 && c.live == 0,
                "every thread: {c:?}"
            );
            ensure!(
                c.no_slot == 0 && c.over_limit == 0 && c.failed == 0,
                "every thread: {c:?}"
            );
            ensure!(
                c.armed_at_stop > 0 && c.disarmed_at_stop > 0 && c.freed_without_stop == 200,
                "objects armed and disarmed at their stops, though the writers belong to \
                 other tracers: {c:?}"
            );
            t.cmd("first").await?;
            let hit = events.collect_hits(1, HIT_TIMEOUT).await?.remove(0);
            check_line(&hit, "main", "first")?;
            // Each writer (another tracer's thread) stores into an object
            // it is handed: its breakpoint, opened by the creator's tracer,
            // is reported by its own.
            for k in 0..3 {
                let r = t.cmd(&format!("handoff {k}")).await?;
                let tid: i32 = r
                    .strip_prefix("HANDOFF tid=")
                    .and_then(|v| v.parse().ok())
                    .with_context(|| format!("handoff {k}: {r}"))?;
                let hit = events.collect_hits(1, HIT_TIMEOUT).await?.remove(0);
                check_line(&hit, "writer", "handoff")?;
                ensure!(
                    hit.tid == tid && hit.value == 0xdead_u64.to_le_bytes().to_vec(),
                    "writer {k} (tid {tid}): {hit:?}"
                );
            }
            let c = counts_settled(&mut client, t.pid, id, 204, Some(0)).await?;
            ensure!(
                c.armed == 204 && c.live == 0 && c.no_slot == 0 && c.failed == 0,
                "the first and the handed objects: {c:?}"
            );
            Ok(())
        }
        .await,
    )
}

/// A policy with a code event (`wpctl watch --pid A --pid B --on-return
/// conn_new ...`): each process it selects gets its own object watch, whose
/// objects are armed and disarmed as one set per process would be; the
/// policy lists the code event, and removing it removes every instance
/// with its objects' watchpoints. No backend is named: the instances go to
/// the one that can hold a thread, whatever the default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_with_a_code_event_arms_each_process() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut a = CTarget::start("ct-objects").await?;
    let mut b = CTarget::start("ct-objects").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut hits_b =
                EventStream::subscribe(&mut client, wpd_tests::hits_only(b.pid)).await?;
            let (pa, pb) = (a.pid.to_string(), b.pid.to_string());
            let out = wpctl(
                &daemon,
                &[
                    "watch",
                    "--pid",
                    &pa,
                    "--pid",
                    &pb,
                    "--on-return",
                    "conn_new",
                    "--expr",
                    "$ret->state",
                    "--condition",
                    "== 0xdead",
                    "--disarm-on",
                    "free",
                ],
            )
            .await?;
            ensure!(out.code == Some(0), "wpctl watch (policy): {out:?}");
            ensure!(
                out.stdout.starts_with("policy ") && out.stdout.contains("2 instances"),
                "{}",
                out.stdout
            );
            ensure!(
                out.stdout.contains("returned by conn_new"),
                "{}",
                out.stdout
            );
            let l = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            let policy = l.policies.first().context("no policy listed")?.clone();
            let code = policy
                .spec
                .as_ref()
                .and_then(|s| s.code_event.clone())
                .context("the policy lists no code event")?;
            ensure!(code.function == "conn_new" && code.at_return, "{code:?}");
            let inst = |pid: i32| {
                policy
                    .instances
                    .iter()
                    .find(|i| i.pid == pid)
                    .map(|i| i.watchpoint_id)
                    .with_context(|| format!("no instance in {pid}: {policy:?}"))
            };
            let (ia, ib) = (inst(a.pid)?, inst(b.pid)?);
            // No backend named: each instance went to the one that can
            // hold a thread at a probe, not to the default.
            ensure!(
                l.processes.len() == 2
                    && l.processes
                        .iter()
                        .all(|p| p.backend == PbBackend::Ptrace as i32),
                "instances attached with {:?}",
                l.processes
                    .iter()
                    .map(|p| (p.pid, p.backend))
                    .collect::<Vec<_>>()
            );

            let r = a.cmd("run 2 50").await?;
            ensure!(r == "RAN n=100", "{r}");
            let c = counts_settled(&mut client, a.pid, ia, 100, Some(0)).await?;
            ensure!(
                c.armed == 100 && c.disarmed == 100 && c.live == 0,
                "instance in a: {c:?}"
            );
            let c = counts(&mut client, b.pid, ib).await?;
            ensure!(c.armed == 0, "instance in b, before it made any: {c:?}");
            b.cmd("first").await?;
            let hit = hits_b.collect_hits(1, HIT_TIMEOUT).await?.remove(0);
            check_line(&hit, "main", "first")?;

            // Removing the policy removes the instances and their objects.
            a.cmd("keep 2").await?;
            ensure!(slots_held(&mut client, a.pid).await? == 2, "two live");
            rpc_ok(
                "RemoveWatchpoint(policy)",
                client.remove_watchpoint(wpd_proto::v1::RemoveWatchpointRequest { id: policy.id }),
            )
            .await?;
            ensure!(
                slots_held(&mut client, a.pid).await? == 0,
                "slots held after the policy's removal"
            );
            let l = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(
                l.watchpoints.is_empty() && l.policies.is_empty(),
                "left after the policy's removal: {l:?}"
            );

            // A code breakpoint holds a thread until a client resumes it:
            // one process at a time, never a policy's.
            let refused = client
                .set_policy(wpd_proto::v1::SetPolicyRequest {
                    selector: Some(wpd_proto::v1::ProcessSelector {
                        pids: vec![a.pid],
                        ..Default::default()
                    }),
                    spec: Some(WatchpointSpec {
                        backend: PbBackend::Ptrace as i32,
                        code_event: Some(CodeEvent {
                            function: "conn_new".into(),
                            stop: true,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                })
                .await;
            wpd_tests::expect_status(
                "SetPolicy with a code breakpoint",
                refused,
                tonic::Code::InvalidArgument,
                &["code breakpoint", "not in a policy"],
            )?;
            let l = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(
                l.watchpoints.is_empty() && l.policies.is_empty(),
                "a refused policy left something: {l:?}"
            );
            Ok(())
        }
        .await,
    )
}

/// A policy with a code event is saved like any policy: after a SIGKILL of
/// the daemon, the restarted one sets it again with its code event, the
/// process gets its object watch back, and the store right after
/// `conn_new` returns is caught again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_with_a_code_event_is_set_again_after_a_restart() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let mut first = Daemon::start().await?;
    let mut t = CTarget::start("ct-objects").await?;
    let result = async {
        let mut client = first.client().await?;
        let mut spec = code_spec(0, "conn_new", true, "$ret->state");
        spec.code_event.as_mut().unwrap().disarm_on = "free".into();
        let p = rpc_ok(
            "SetPolicy(code event)",
            client.set_policy(wpd_proto::v1::SetPolicyRequest {
                selector: Some(wpd_proto::v1::ProcessSelector {
                    pids: vec![t.pid],
                    ..Default::default()
                }),
                spec: Some(spec),
            }),
        )
        .await?
        .policy
        .context("no policy")?;
        ensure!(p.instances.len() == 1, "{p:?}");
        first.kill().await?;

        let second = Daemon::restart_from(&first, &[]).await?;
        let result = async {
            let mut client = second.client().await?;
            let mut events =
                EventStream::subscribe(&mut client, wpd_tests::hits_only(t.pid)).await?;
            let inst = wpd_tests::poll_until(HIT_TIMEOUT, "the policy's instance", async || {
                let l = rpc_ok(
                    "ListWatchpoints",
                    client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
                )
                .await?;
                Ok(match l.policies.first() {
                    Some(q)
                        if q.id == p.id
                            && q.spec.as_ref().is_some_and(|s| s.code_event.is_some())
                            && !q.instances.is_empty() =>
                    {
                        Ok(q.instances[0].watchpoint_id)
                    }
                    _ => Err(format!("{l:?}")),
                })
            })
            .await?;
            t.cmd("first").await?;
            let hit = events.collect_hits(1, HIT_TIMEOUT).await?.remove(0);
            check_line(&hit, "main", "first")?;
            ensure!(hit.watchpoint_id != inst, "a hit of an object's watchpoint");
            let c = counts_settled(&mut client, t.pid, inst, 1, None).await?;
            ensure!(c.armed == 1 && c.disarmed == 1, "{c:?}");
            Ok(())
        }
        .await;
        second.finish(result)
    }
    .await;
    first.finish(result)
}

/// Objects freed: `--disarm-on free` stops no one. The disarming probe's
/// program takes the object out in the kernel and mutes its breakpoint, so
/// that neither free's own store into it (glibc's tcache writes its key
/// where `state` is) nor the program's store through the dangling pointer
/// is a hit, or a stop: each object costs its thread two stops, at
/// `conn_new`'s return and at the store while it lives (the thread's
/// voluntary context switches, counted by the target, stay below 2.5 per
/// object, where a stop at `free` would make them 3, and each store into
/// the freed object one more). Every object is taken off and no slot stays
/// held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_stops_no_one_and_stores_after_it_are_not_hits() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    const N: u64 = 300;
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-objects").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events =
                EventStream::subscribe(&mut client, wpd_tests::hits_only(t.pid)).await?;
            let mut spec = code_spec(t.pid, "conn_new", true, "$ret->state");
            spec.code_event.as_mut().unwrap().disarm_on = "free".into();
            let id = rpc_ok(
                "SetWatchpoint(conn_new)",
                client.set_watchpoint(wpd_proto::v1::SetWatchpointRequest { spec: Some(spec) }),
            )
            .await?
            .watchpoint
            .context("no watchpoint")?
            .id;
            let r = t.cmd(&format!("afterfree {N}")).await?;
            let csw: u64 = r
                .strip_prefix("AFTERFREE csw=")
                .and_then(|n| n.parse().ok())
                .with_context(|| format!("the target said {r:?}"))?;
            t.cmd("first").await?;
            // In order: each object's store while live, then "first"'s;
            // a store after a free reported would come between them.
            let hits = events.collect_hits(N as usize + 1, HIT_TIMEOUT).await?;
            for h in &hits[..N as usize] {
                check_line(h, "main", "live")?;
                ensure!(h.value == 5u64.to_le_bytes().to_vec(), "{h:?}");
            }
            check_line(&hits[N as usize], "main", "first")?;
            let c = counts_settled(&mut client, t.pid, id, N + 1, Some(0)).await?;
            ensure!(
                c.armed == N + 1 && c.freed_without_stop == N + 1,
                "every object armed, every free without a stop: {c:?}"
            );
            ensure!(
                csw < N * 5 / 2,
                "{csw} voluntary context switches for {N} objects: the thread stopped at free \
                 or at the store after it"
            );
            Ok(())
        }
        .await,
    )
}

/// `--on-entry conn_ref --expr 'c->refs'`: the parameter by its DWARF name;
/// the increment inside conn_ref is caught at its line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_entry_by_parameter_name() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-objects").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events =
                EventStream::subscribe(&mut client, wpd_tests::hits_only(t.pid)).await?;
            let mut spec = code_spec(t.pid, "conn_ref", false, "c->refs");
            spec.code_event.as_mut().unwrap().disarm_on = "conn_free".into();
            let id = rpc_ok(
                "SetWatchpoint(on entry)",
                client.set_watchpoint(wpd_proto::v1::SetWatchpointRequest { spec: Some(spec) }),
            )
            .await?
            .watchpoint
            .context("no watchpoint")?
            .id;
            t.cmd("run 1 1").await?;
            let hit = events.collect_hits(1, HIT_TIMEOUT).await?.remove(0);
            check_line(&hit, "conn_ref", "ref")?;
            ensure!(hit.value == 1u64.to_le_bytes().to_vec(), "{hit:?}");
            // Disarmed at conn_free.
            let c = counts_settled(&mut client, t.pid, id, 1, Some(0)).await?;
            ensure!(c.freed_without_stop == 1, "{c:?}");
            Ok(())
        }
        .await,
    )
}

/// Without DWARF, `$arg0+16` (refs' offset) at conn_ref's entry: the
/// increment is caught, in conn_ref.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arg0_without_dwarf() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-objects-nodebug").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events =
                EventStream::subscribe(&mut client, wpd_tests::hits_only(t.pid)).await?;
            let pid = t.pid.to_string();
            let out = wpctl(
                &daemon,
                &[
                    "watch",
                    "--pid",
                    &pid,
                    "--backend",
                    "ptrace",
                    "--on-entry",
                    "conn_ref",
                    "--expr",
                    "$arg0+16",
                    "--len",
                    "8",
                    "--disarm-on",
                    "conn_free",
                ],
            )
            .await?;
            ensure!(out.code == Some(0), "wpctl watch: {out:?}");
            t.cmd("run 1 1").await?;
            let hit = events.collect_hits(1, HIT_TIMEOUT).await?.remove(0);
            let loc = hit.location.as_ref().context("no location")?;
            ensure!(loc.function == "conn_ref", "{loc:?}");
            ensure!(hit.value == 1u64.to_le_bytes().to_vec(), "{hit:?}");
            // A parameter name means nothing without DWARF.
            let out = wpctl(
                &daemon,
                &[
                    "watch",
                    "--pid",
                    &pid,
                    "--backend",
                    "ptrace",
                    "--on-entry",
                    "conn_ref",
                    "--expr",
                    "c->refs",
                ],
            )
            .await?;
            ensure!(
                out.code != Some(0) && out.stderr.contains("no DWARF"),
                "{out:?}"
            );
            Ok(())
        }
        .await,
    )
}

/// `--max-live 1`: the objects beyond the first are counted, not armed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_live_counts_what_is_not_armed() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-objects").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut spec = code_spec(t.pid, "conn_new", true, "$ret->state");
            spec.code_event.as_mut().unwrap().max_live = 1;
            let r = rpc_ok(
                "SetWatchpoint(max_live)",
                client.set_watchpoint(wpd_proto::v1::SetWatchpointRequest { spec: Some(spec) }),
            )
            .await?;
            let id = r.watchpoint.context("no watchpoint")?.id;
            t.cmd("keep 5").await?;
            let c = counts(&mut client, t.pid, id).await?;
            ensure!(c.armed == 1 && c.over_limit == 4 && c.live == 1, "{c:?}");
            ensure!(
                slots_held(&mut client, t.pid).await? == 1,
                "one object armed"
            );
            // No slot left: five live objects on 4 slots, the fifth counted.
            let mut spec = code_spec(t.pid, "conn_new", true, "$ret->state");
            spec.code_event.as_mut().unwrap().creator_only = true;
            let r = rpc_ok(
                "SetWatchpoint(creator)",
                client.set_watchpoint(wpd_proto::v1::SetWatchpointRequest { spec: Some(spec) }),
            )
            .await?;
            let id2 = r.watchpoint.context("no watchpoint")?.id;
            t.cmd("keep 4").await?;
            let c = counts(&mut client, t.pid, id2).await?;
            ensure!(c.armed == 3 && c.no_slot == 1, "{c:?}");
            Ok(())
        }
        .await,
    )
}

/// Each bad request is refused with what is wrong, and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_code_events_are_refused() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let t = CTarget::start("ct-objects").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let cases: &[(&str, bool, &str, &str)] = &[
                ("conn_nwe", true, "$ret->state", "conn_new"),
                ("conn_new", false, "$ret->state", "only with --on-return"),
                ("conn_new", true, "$arg0", "--on-entry"),
                ("conn_ref", false, "$arg7", "$arg0…$arg5"),
                ("conn_ref", false, "conn->refs", "its parameters: c"),
                (
                    "conn_ref",
                    false,
                    "c->",
                    "must be followed by a member name",
                ),
                ("conn_ref", false, "c->nosuch", "nosuch"),
            ];
            for (function, at_return, expr, says) in cases {
                let spec = code_spec(t.pid, function, *at_return, expr);
                let got =
                    rpc(client
                        .set_watchpoint(wpd_proto::v1::SetWatchpointRequest { spec: Some(spec) }))
                    .await?;
                match got {
                    Ok(r) => anyhow::bail!("{function} {expr}: set: {r:?}"),
                    Err(s) => ensure!(
                        s.message().contains(says),
                        "{function} {expr}: {:?} does not say {says:?}",
                        s.message()
                    ),
                }
            }
            ensure!(
                rpc_ok(
                    "ListWatchpoints",
                    client.list_watchpoints(ListWatchpointsRequest { pid: 0 })
                )
                .await?
                .watchpoints
                .is_empty(),
                "a refused code event left a watch"
            );
            // The perf backend cannot hold a thread at a probe.
            let mut spec = code_spec(0, "conn_new", true, "$ret->state");
            let t2 = CTarget::start("ct-objects").await?;
            spec.pid = t2.pid;
            spec.backend = PbBackend::Perf as i32;
            let s = rpc(
                client.set_watchpoint(wpd_proto::v1::SetWatchpointRequest { spec: Some(spec) })
            )
            .await?
            .err()
            .context("perf accepted a code event")?;
            ensure!(
                s.message().contains("code events") && s.message().contains("ptrace"),
                "{s:?}"
            );
            Ok(())
        }
        .await,
    )
}

/// A code breakpoint's spec over gRPC: at `function`, or at `file`:`line`.
fn break_spec(pid: i32, function: &str, file: &str, line: u32) -> WatchpointSpec {
    WatchpointSpec {
        pid,
        backend: PbBackend::Ptrace as i32,
        code_event: Some(CodeEvent {
            function: function.into(),
            file: file.into(),
            line,
            stop: true,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Code breakpoints (`CodeEvent.stop`): one past `conn_corrupt`'s
/// prologue holds the thread that calls it (`corrupt` gets no answer until
/// Resume) and reports a `BreakpointHit` naming the thread and the line;
/// one at a source line resolves to that line. Unknown functions (with the
/// closest name), lines without code, unknown files, the perf backend and
/// breakpoints with a watchpoint's fields are refused with their reasons,
/// leaving nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_breakpoints_hold_the_thread_and_bad_ones_are_refused() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-objects").await?;
    daemon.finish(
        async {
            use wpd_proto::reason as r;
            use wpd_proto::v1::{
                RemoveWatchpointRequest, ResumeRequest, SetWatchpointRequest, ThreadState,
            };
            use wpd_tests::leaks::{reason, remove};
            let mut client = daemon.client().await?;
            let set = |spec: WatchpointSpec| SetWatchpointRequest { spec: Some(spec) };
            // Refusals first: each leaves nothing behind.
            let (file, no_code) = ("objects.c", 2);
            let cases: Vec<(WatchpointSpec, &str, &str)> = vec![
                (
                    break_spec(t.pid, "conn_corupt", "", 0),
                    r::UNKNOWN_SYMBOL,
                    "closest: conn_corrupt",
                ),
                (
                    break_spec(t.pid, "", file, no_code),
                    r::NO_CODE_AT_LINE,
                    "no code at objects.c:2",
                ),
                (
                    break_spec(t.pid, "", file, 100_000),
                    r::NO_CODE_AT_LINE,
                    "its last line with code is",
                ),
                (
                    break_spec(t.pid, "", "nowhere.c", 3),
                    r::SOURCE_NOT_LOADED,
                    "no line table names that file",
                ),
                (
                    break_spec(t.pid, "conn_ref", file, 3),
                    r::INVALID_ARGUMENT,
                    "not both",
                ),
                (
                    WatchpointSpec {
                        symbol: "c->refs".into(),
                        ..break_spec(t.pid, "conn_ref", "", 0)
                    },
                    r::INVALID_ARGUMENT,
                    "arms nothing",
                ),
            ];
            for (spec, want, says) in cases {
                let what = format!("{:?}", spec.code_event);
                let s = rpc(client.set_watchpoint(set(spec)))
                    .await?
                    .err()
                    .with_context(|| format!("{what} was set"))?;
                ensure!(
                    reason(&s) == want && s.message().contains(says),
                    "{what}: {} {:?}, expected {want} saying {says:?}",
                    reason(&s),
                    s.message()
                );
            }
            // The perf backend cannot hold a thread: refused, with why.
            let t2 = CTarget::start("ct-objects").await?;
            let s = rpc(client.set_watchpoint(set(WatchpointSpec {
                backend: PbBackend::Perf as i32,
                ..break_spec(t2.pid, "conn_corrupt", "", 0)
            })))
            .await?
            .err()
            .context("perf accepted a code breakpoint")?;
            ensure!(
                reason(&s) == r::NEEDS_BACKEND
                    && s.message().contains("code breakpoints")
                    && s.message().contains("ptrace"),
                "{s:?}"
            );
            let left = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(left.watchpoints.is_empty(), "refusals left {left:?}");

            // A line breakpoint resolves to its line.
            let (_, ref_line) = line_of("ref");
            let w = rpc_ok(
                "SetWatchpoint(line)",
                client.set_watchpoint(set(break_spec(t.pid, "", file, ref_line))),
            )
            .await?
            .watchpoint
            .context("no watchpoint")?;
            let p = w.breakpoint.context("no place")?;
            ensure!(
                p.function == "conn_ref" && p.line == ref_line && p.file.ends_with(file),
                "{p:?}"
            );
            remove(&mut client, w.id).await?;

            // With a hit count, every 2nd call of 5 is held (calls 2 and
            // 4); the others go on.
            let mut events = EventStream::for_pid(&mut client, t.pid).await?;
            let w = rpc_ok(
                "SetWatchpoint(hit count)",
                client.set_watchpoint(set(WatchpointSpec {
                    hit_count: 2,
                    ..break_spec(t.pid, "conn_ref", "", 0)
                })),
            )
            .await?
            .watchpoint
            .context("no watchpoint")?;
            t.send("run 1 5")?;
            for want in [2, 4] {
                let hit = events
                    .wait_for(HIT_TIMEOUT, "a BreakpointHit", |e| match e {
                        wpd_tests::Event::BreakpointHit(b) => Ok(Some(b.clone())),
                        _ => Ok(None),
                    })
                    .await?;
                ensure!(
                    hit.watchpoint_id == w.id && hit.count == want,
                    "expected the stop of call {want}: {hit:?}"
                );
                rpc_ok(
                    "Resume",
                    client.resume(ResumeRequest {
                        pid: t.pid,
                        tids: vec![hit.tid],
                    }),
                )
                .await?;
            }
            let reply = t.reply(HIT_TIMEOUT).await?;
            ensure!(
                reply.as_deref().is_some_and(|r| r.starts_with("RAN")),
                "{reply:?}"
            );
            remove(&mut client, w.id).await?;

            // With STOP_ALL the other threads are held too, until Resume.
            let w = rpc_ok(
                "SetWatchpoint(stop all)",
                client.set_watchpoint(set(WatchpointSpec {
                    action: wpd_proto::v1::HitAction::StopAll as i32,
                    ..break_spec(t.pid, "conn_ref", "", 0)
                })),
            )
            .await?
            .watchpoint
            .context("no watchpoint")?;
            t.send("run 3 200")?;
            let hit = events
                .wait_for(HIT_TIMEOUT, "a BreakpointHit", |e| match e {
                    wpd_tests::Event::BreakpointHit(b) if b.watchpoint_id == w.id => {
                        Ok(Some(b.clone()))
                    }
                    _ => Ok(None),
                })
                .await?;
            // Every thread stops (the peers as they are interrupted).
            let deadline = tokio::time::Instant::now() + HIT_TIMEOUT;
            loop {
                let threads = list_threads(&mut client, t.pid, false).await?;
                let running: Vec<i32> = threads
                    .threads
                    .iter()
                    .filter(|x| {
                        x.state != ThreadState::StoppedAtHit as i32
                            && x.state != ThreadState::StoppedByPeer as i32
                    })
                    .map(|x| x.tid)
                    .collect();
                let at_hit = threads
                    .threads
                    .iter()
                    .any(|x| x.tid == hit.tid && x.state == ThreadState::StoppedAtHit as i32);
                if running.is_empty() && at_hit && threads.threads.len() > 1 {
                    break;
                }
                ensure!(
                    tokio::time::Instant::now() < deadline,
                    "threads still running: {running:?} ({threads:?})"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            remove(&mut client, w.id).await?;
            rpc_ok(
                "Resume",
                client.resume(ResumeRequest {
                    pid: t.pid,
                    tids: vec![],
                }),
            )
            .await?;
            let reply = t.reply(HIT_TIMEOUT).await?;
            ensure!(
                reply.as_deref().is_some_and(|r| r.starts_with("RAN")),
                "{reply:?}"
            );
            drop(events);

            // A function breakpoint holds the caller until Resume.
            let mut events = EventStream::for_pid(&mut client, t.pid).await?;
            let w = rpc_ok(
                "SetWatchpoint(function)",
                client.set_watchpoint(set(break_spec(t.pid, "conn_corrupt", "", 0))),
            )
            .await?
            .watchpoint
            .context("no watchpoint")?;
            let p = w.breakpoint.clone().context("no place")?;
            let (_, corrupt_line) = line_of("corrupt");
            ensure!(
                p.function == "conn_corrupt" && p.line == corrupt_line,
                "past the prologue, at the body's first line: {p:?}"
            );
            t.send("corrupt")?;
            let hit = events
                .wait_for(HIT_TIMEOUT, "a BreakpointHit", |e| match e {
                    wpd_tests::Event::BreakpointHit(b) => Ok(Some(b.clone())),
                    _ => Ok(None),
                })
                .await?;
            ensure!(
                hit.watchpoint_id == w.id && hit.pid == t.pid && hit.count == 1,
                "{hit:?}"
            );
            ensure!(hit.place.as_ref() == Some(&p), "{hit:?}");
            let threads = list_threads(&mut client, t.pid, false).await?;
            let held = threads
                .threads
                .iter()
                .find(|x| x.tid == hit.tid)
                .context("the hit's thread")?;
            ensure!(
                held.state == ThreadState::StoppedAtHit as i32,
                "not held: {held:?}"
            );
            let stack = rpc_ok(
                "GetThreadStack",
                client.get_thread_stack(wpd_proto::v1::GetThreadStackRequest {
                    pid: t.pid,
                    tid: hit.tid,
                    depth: 2,
                    locals: true,
                    ..Default::default()
                }),
            )
            .await?;
            let top = stack.frames.first().context("no frame")?;
            ensure!(
                top.function == "conn_corrupt" && top.line == corrupt_line,
                "{top:?}"
            );
            ensure!(
                stack
                    .locals
                    .first()
                    .is_some_and(|f| f.variables.iter().any(|v| v.name == "c")),
                "the parameter c is readable: {:?}",
                stack.locals
            );
            rpc_ok(
                "RemoveWatchpoint",
                client.remove_watchpoint(RemoveWatchpointRequest { id: w.id }),
            )
            .await?;
            rpc_ok(
                "Resume",
                client.resume(ResumeRequest {
                    pid: t.pid,
                    tids: vec![hit.tid],
                }),
            )
            .await?;
            let reply = t.reply(HIT_TIMEOUT).await?;
            ensure!(
                reply.as_deref() == Some("CORRUPTED"),
                "after Resume: {reply:?}"
            );
            Ok(())
        }
        .await,
    )
}
