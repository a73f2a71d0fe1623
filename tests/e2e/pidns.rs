//! End-to-end tests of pid namespaces: a daemon started in a pid namespace of its own reports
//! the ids of its namespace — in hits and listings, whatever the backend — never those of the
//! initial one (its BPF programs ask the kernel for its namespace's); a caller in a pid
//! namespace nested in the daemon's names processes by its own numbers and is answered in them
//! (requests, listings, live and replayed events, errors), and reaches nothing outside its
//! namespace; a caller the daemon cannot number (an ancestor's) is refused with the reason,
//! never served with the daemon's numbers (`docs/security.md`, promise 15).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use serde_json::Value;
use tonic::Code;
use wpd_proto::reason::{INIT_PROCESS, INVALID_ARGUMENT, NO_SUCH_WATCHPOINT, NOT_IN_PID_NAMESPACE};
use wpd_proto::v1::{
    ListWatchpointsRequest, ProcessSelector, SetPolicyRequest, SetWatchpointRequest,
    StreamEventsRequest,
};
use wpd_tests::{
    Backend, Daemon, Event, EventStream, PidNamespace, Relay, SPAWN_MARK, TargetProc, bin_path,
    both_backends, expect_status, hit_value_u64, list_threads, machine_skip, nspid,
    require_root_perf, rpc_ok, set_watchpoint, threads_below, write_spec,
};

/// The first child of `pid` (`/proc/PID/task/PID/children`).
fn first_child(pid: u32) -> Result<i32> {
    let path = format!("/proc/{pid}/task/{pid}/children");
    std::fs::read_to_string(&path)
        .with_context(|| format!("reading {path}"))?
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("no child in {path}"))
}

/// The tids of `pid` as the namespace of process `ns_of` numbers them: its own `/proc` mount,
/// read through `/proc/<ns_of>/root`.
fn tids_in_ns(ns_of: i32, pid: i32) -> Result<BTreeSet<i32>> {
    let dir = format!("/proc/{ns_of}/root/proc/{pid}/task");
    Ok(std::fs::read_dir(&dir)
        .with_context(|| format!("reading {dir}"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}

both_backends!(hits_and_listings_carry_the_daemons_namespace_ids);

/// The daemon and a multi-threaded target in a new pid namespace: a process-wide watchpoint set
/// with the target's namespace pid reports the stores of its main thread and of a thread
/// created afterwards with the pid and tids the target itself sees (`getpid`, `gettid`), and
/// `ListThreads` lists the namespace's tids.
async fn hits_and_listings_carry_the_daemons_namespace_ids(backend: Backend) -> Result<()> {
    let daemon = Daemon::start_in_new_pidns(&[]).await?;
    let inner = daemon.inner_pid().expect("a daemon under unshare");
    let mut target = TargetProc::start_in_pidns_of(inner, &["--threads", "2"]).await?;
    daemon.finish(
        async {
            // The namespace numbers the target differently than the test's does, or this
            // proves nothing.
            let nsenter = target.child_id();
            let host_pid = first_child(nsenter)?;
            ensure!(
                host_pid != target.pid,
                "the target is {host_pid} here and {} in the namespace",
                target.pid
            );
            let ns_tids = tids_in_ns(inner, target.pid)?;
            ensure!(
                ns_tids.len() == 3 && ns_tids.contains(&target.pid),
                "the namespace's /proc lists threads {ns_tids:?} of {}",
                target.pid
            );

            // A client in the namespace: the daemon reads its requests' pids as its own.
            let relay = Relay::start_in_pidns_of(inner, daemon.socket_path()).await?;
            let mut client = relay.client().await?;
            let mut events = EventStream::for_pid(&mut client, target.pid).await?;
            let resp = set_watchpoint(&mut client, write_spec(backend, target.pid, target.vars[1]))
                .await?;
            let wp = resp.watchpoint.unwrap_or_default();
            ensure!(wp.process_wide, "{wp:?}");
            ensure!(
                wp.armed_threads == 3,
                "armed {} threads, the target has 3",
                wp.armed_threads
            );

            let listed: BTreeSet<i32> = list_threads(&mut client, target.pid, false)
                .await?
                .threads
                .iter()
                .map(|t| t.tid)
                .collect();
            ensure!(
                listed == ns_tids,
                "ListThreads lists {listed:?}, the namespace has {ns_tids:?}"
            );

            // The main thread's store, then a new thread's first one.
            target.write(1, 0x5a).await?;
            let tid = target.spawn_marker().await?;
            let mut seen = Vec::new();
            events
                .wait_for(
                    Duration::from_secs(10),
                    &format!("hits from {} and from its new thread {tid}", target.pid),
                    |ev| {
                        if let Event::Hit(h) = ev
                            && h.watchpoint_id == wp.id
                        {
                            ensure!(
                                h.pid == target.pid,
                                "hit with pid {} (the namespace's is {}; here it is {host_pid}): {h:?}",
                                h.pid,
                                target.pid
                            );
                            let want = match hit_value_u64(h) {
                                Some(0x5a) => target.pid,
                                Some(SPAWN_MARK) => tid,
                                v => anyhow::bail!("unexpected value {v:x?} in {h:?}"),
                            };
                            ensure!(
                                h.tid == want,
                                "hit with tid {}, the storing thread is {want} in the namespace: {h:?}",
                                h.tid
                            );
                            seen.push(h.tid);
                        }
                        Ok((seen.contains(&target.pid) && seen.contains(&tid)).then_some(()))
                    },
                )
                .await?;

            let listed: BTreeSet<i32> = list_threads(&mut client, target.pid, false)
                .await?
                .threads
                .iter()
                .map(|t| t.tid)
                .collect();
            let ns_tids = tids_in_ns(inner, target.pid)?;
            ensure!(
                listed == ns_tids && listed.contains(&tid),
                "ListThreads lists {listed:?}, the namespace has {ns_tids:?} (new thread {tid})"
            );
            target.quit().await?;
            Ok(())
        }
        .await,
    )
}

/// How long one `wpctl` run in a namespace may take.
const WPCTL: Duration = Duration::from_secs(30);

/// `wpctl --endpoint <daemon> --json ARGS` run in `ns`: its JSON answer, which must be a
/// success.
async fn wpctl_ok(ns: &PidNamespace, daemon: &Daemon, args: &[&str]) -> Result<Value> {
    let endpoint = daemon.endpoint();
    let mut full = vec!["--endpoint", endpoint.as_str(), "--json"];
    full.extend_from_slice(args);
    let out = ns.wpctl(&full, WPCTL).await?;
    ensure!(
        out.code == Some(0),
        "`wpctl {}` in the namespace exited with {:?}: {}",
        args.join(" "),
        out.code,
        out.stderr
    );
    serde_json::from_str(&out.stdout)
        .with_context(|| format!("`wpctl {}` printed {:?}", args.join(" "), out.stdout))
}

/// `wpctl` run in `ns` as [`wpctl_ok`] does, which must fail with `reason`: its error's
/// message.
async fn wpctl_refused(
    ns: &PidNamespace,
    daemon: &Daemon,
    args: &[&str],
    reason: &str,
) -> Result<String> {
    let endpoint = daemon.endpoint();
    let mut full = vec!["--endpoint", endpoint.as_str(), "--json"];
    full.extend_from_slice(args);
    let out = ns.wpctl(&full, WPCTL).await?;
    ensure!(
        out.code != Some(0),
        "`wpctl {}` in the namespace succeeded: {}",
        args.join(" "),
        out.stdout
    );
    let err: Value = serde_json::from_str(out.stderr.trim())
        .with_context(|| format!("`wpctl {}` printed {:?}", args.join(" "), out.stderr))?;
    ensure!(
        err["error"]["reason"] == reason,
        "`wpctl {}` in the namespace: expected {reason}, got {err}",
        args.join(" ")
    );
    Ok(err["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// The numbers in `v[key]` (an array of objects) under `field`.
fn numbers(v: &Value, key: &str, field: &str) -> BTreeSet<i64> {
    v[key]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x[field].as_i64()).collect())
        .unwrap_or_default()
}

both_backends!(a_nested_caller_names_and_is_shown_its_own_numbers);

/// A client in a pid namespace nested in the daemon's (the test makes it: `wpctl` run there
/// with `nsenter`, and a gRPC client through `wpd-relay` run there) names a multi-threaded
/// target of that namespace by the namespace's pid: `wpctl watch --pid` arms that process — not
/// the daemon's process of that number, if any — `wpctl list` and `wpctl threads` show the
/// namespace's numbers, and its event stream, live and replayed from the journal (`wpctl events
/// --since`), carries the pid and tids the target itself sees (`getpid`, `gettid`), while a
/// client of the daemon's namespace, at the same time, sees the daemon's.
async fn a_nested_caller_names_and_is_shown_its_own_numbers(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let ns = PidNamespace::start().await?;
    let mut target = TargetProc::start_in_pidns_of(ns.init, &["--threads", "2"]).await?;
    daemon.finish(
        async {
            let inner = target.pid;
            let host = first_child(target.child_id())?;
            ensure!(
                nspid(host, host) == Some(vec![host, inner]),
                "the target is {host} here and {inner} in the namespace: NSpid {:?}",
                nspid(host, host)
            );
            let inner_tids = ns.tids(inner)?;
            ensure!(
                inner_tids.len() == 3 && inner_tids.contains(&inner),
                "the namespace's /proc lists threads {inner_tids:?} of {inner}"
            );

            let mut host_client = daemon.client().await?;
            let mut host_events = EventStream::for_pid(&mut host_client, host).await?;
            let relay = Relay::start_in_pidns_of(ns.init, daemon.socket_path()).await?;
            let mut inner_client = relay.client().await?;
            let mut inner_events = EventStream::for_pid(&mut inner_client, inner).await?;

            let backend_name = if backend == Backend::Ptrace {
                "ptrace"
            } else {
                "perf"
            };
            let addr = format!("{:#x}", target.vars[1]);
            let pid = inner.to_string();
            let v = wpctl_ok(
                &ns,
                &daemon,
                &[
                    "watch",
                    "--pid",
                    &pid,
                    "--addr",
                    &addr,
                    "--len",
                    "8",
                    "--backend",
                    backend_name,
                ],
            )
            .await?;
            let wp = &v["watchpoint"];
            ensure!(
                wp["pid"] == inner && wp["armed_threads"] == 3 && wp["process_wide"] == true,
                "`wpctl watch --pid {inner}` in the namespace answered {wp}"
            );
            ensure!(wp["backend"] == backend_name, "{wp}");
            let id = wp["id"].as_u64().ok_or_else(|| anyhow!("no id in {wp}"))?;

            // The daemon's namespace sees the same watchpoint on the target's number there, and
            // nothing on whatever process the namespace's number names there.
            let list = rpc_ok(
                "ListWatchpoints",
                host_client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            let pids: Vec<i32> = list
                .watchpoints
                .iter()
                .filter(|w| w.id == id)
                .filter_map(|w| w.spec.as_ref().map(|s| s.pid))
                .collect();
            ensure!(
                pids == [host],
                "watchpoint {id} is on {pids:?} here, the target is {host}"
            );
            ensure!(
                !list.processes.iter().any(|p| p.pid == inner),
                "process {inner} of the daemon's namespace was attached: {list:?}"
            );

            // The main thread's store, then a new thread's first one.
            target.write(1, 0x5a).await?;
            let tid = target.spawn_marker().await?;
            let host_tid = *threads_below(host)?
                .get(&tid)
                .ok_or_else(|| anyhow!("no thread {tid} of the namespace in {host}"))?;
            ensure!(
                host_tid != tid,
                "thread {tid} has the same number in both namespaces"
            );

            // Seen from inside: the namespace's numbers, for hits and the thread's start.
            let mut seen = BTreeSet::new();
            let mut started = false;
            inner_events
                .wait_for(
                    Duration::from_secs(10),
                    &format!("hits from {inner} and its new thread {tid}, in the namespace"),
                    |ev| {
                        match ev {
                            Event::Hit(h) if h.watchpoint_id == id => {
                                let want = match hit_value_u64(h) {
                                    Some(0x5a) => inner,
                                    Some(SPAWN_MARK) => tid,
                                    v => anyhow::bail!("unexpected value {v:x?} in {h:?}"),
                                };
                                ensure!(
                                    (h.pid, h.tid) == (inner, want),
                                    "hit as pid {} tid {}, the namespace's are {inner} and \
                                     {want}: {h:?}",
                                    h.pid,
                                    h.tid
                                );
                                seen.insert(h.tid);
                            }
                            Event::ThreadStarted(t) if t.tid == tid => {
                                ensure!(t.pid == inner, "{t:?}");
                                started = true;
                            }
                            Event::Hit(h) => anyhow::bail!("a hit of another watchpoint: {h:?}"),
                            _ => {}
                        }
                        Ok((seen.len() == 2 && started).then_some(()))
                    },
                )
                .await?;
            // Seen from the daemon's namespace, at the same time: its numbers.
            let mut seen = BTreeSet::new();
            host_events
                .wait_for(
                    Duration::from_secs(10),
                    &format!("hits from {host} and its new thread {host_tid}, here"),
                    |ev| {
                        if let Event::Hit(h) = ev
                            && h.watchpoint_id == id
                        {
                            let want = match hit_value_u64(h) {
                                Some(0x5a) => host,
                                Some(SPAWN_MARK) => host_tid,
                                v => anyhow::bail!("unexpected value {v:x?} in {h:?}"),
                            };
                            ensure!((h.pid, h.tid) == (host, want), "{h:?}");
                            seen.insert(h.tid);
                        }
                        Ok((seen.len() == 2).then_some(()))
                    },
                )
                .await?;

            // `wpctl list` and `wpctl threads` in the namespace: its numbers.
            let l = wpctl_ok(&ns, &daemon, &["list"]).await?;
            ensure!(
                numbers(&l, "watchpoints", "pid") == BTreeSet::from([inner.into()])
                    && numbers(&l, "watchpoints", "id") == BTreeSet::from([id as i64])
                    && numbers(&l, "processes", "pid") == BTreeSet::from([inner.into()]),
                "`wpctl list` in the namespace: {l}"
            );
            let t = wpctl_ok(&ns, &daemon, &["threads", "--pid", &pid]).await?;
            let listed: BTreeSet<i64> = numbers(&t, "threads", "tid");
            let now: BTreeSet<i64> = ns.tids(inner)?.into_iter().map(i64::from).collect();
            ensure!(
                t["pid"] == inner && listed == now && listed.contains(&tid.into()),
                "`wpctl threads --pid {inner}` in the namespace: {t}; its /proc has {now:?}"
            );

            // Replayed from the journal, through the relay and by `wpctl events`: the same.
            let mut replay = EventStream::subscribe(
                &mut inner_client,
                StreamEventsRequest {
                    pid: inner,
                    hits_only: true,
                    after_seq: Some(0),
                    ..Default::default()
                },
            )
            .await?;
            let hits = replay.collect_hits(2, Duration::from_secs(10)).await?;
            let got: BTreeSet<(i32, i32)> = hits.iter().map(|h| (h.pid, h.tid)).collect();
            ensure!(
                got == BTreeSet::from([(inner, inner), (inner, tid)]),
                "replayed hits as {got:?}, the namespace's are {inner} and {tid}"
            );
            let endpoint = daemon.endpoint();
            let out = ns
                .wpctl(
                    &[
                        "--endpoint",
                        &endpoint,
                        "--json",
                        "events",
                        "--pid",
                        &pid,
                        "--hits-only",
                        "--since",
                        "1h",
                        "--count",
                        "2",
                    ],
                    WPCTL,
                )
                .await?;
            ensure!(out.code == Some(0), "wpctl events: {}", out.stderr);
            let got: BTreeSet<(i64, i64)> = out
                .stdout
                .lines()
                .map(|l| {
                    let v: Value = serde_json::from_str(l)?;
                    Ok((
                        v["pid"].as_i64().unwrap_or(0),
                        v["tid"].as_i64().unwrap_or(0),
                    ))
                })
                .collect::<Result<_>>()?;
            ensure!(
                got == BTreeSet::from([(inner.into(), inner.into()), (inner.into(), tid.into())]),
                "`wpctl events --since 1h` in the namespace: {}",
                out.stdout
            );
            target.quit().await?;
            Ok(())
        }
        .await,
    )
}

/// Processes outside a nested caller's namespace are none of its: named by their number in
/// the daemon's namespace they are refused (`NOT_IN_PID_NAMESPACE`, saying so); by a
/// watchpoint's id they do not exist; they are absent from its listings and its event
/// stream; and its policies, by pid or by command name, cover its namespace's processes only
/// (another process of the same name here is not touched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_caller_cannot_reach_outside_its_namespace() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let ns = PidNamespace::start().await?;
    let mut outside = TargetProc::start(&["--threads", "1"]).await?;
    let mut t1 = TargetProc::start_in_pidns_of(ns.init, &["--threads", "1"]).await?;
    let t2 = TargetProc::start_in_pidns_of(ns.init, &[]).await?;
    daemon.finish(
        async {
            let (h1, h2) = (first_child(t1.child_id())?, first_child(t2.child_id())?);
            let mut host_client = daemon.client().await?;
            let mut host_events = EventStream::for_pid(&mut host_client, outside.pid).await?;
            let host_wp = set_watchpoint(
                &mut host_client,
                write_spec(Backend::Perf, outside.pid, outside.vars[1]),
            )
            .await?
            .watchpoint
            .unwrap_or_default();
            let relay = Relay::start_in_pidns_of(ns.init, daemon.socket_path()).await?;
            let mut inner_client = relay.client().await?;
            let mut inner_events =
                EventStream::subscribe(&mut inner_client, Default::default()).await?;

            // Named by its number here: the namespace has no such process.
            let out = outside.pid.to_string();
            ensure!(
                ns.tids(outside.pid).is_err(),
                "the namespace has a process {out} too: the test proves nothing"
            );
            let addr = format!("{:#x}", outside.vars[2]);
            for args in [
                vec!["watch", "--pid", &out, "--addr", &addr, "--len", "8"],
                vec!["threads", "--pid", &out],
                vec!["list", "--pid", &out],
                vec!["detach", "--pid", &out],
            ] {
                let msg = wpctl_refused(&ns, &daemon, &args, NOT_IN_PID_NAMESPACE).await?;
                ensure!(
                    msg.contains(&format!(
                        "no process has pid {out} in the caller's pid namespace"
                    )),
                    "`wpctl {}` in the namespace: {msg}",
                    args.join(" ")
                );
            }
            // By its watchpoint's id: no such watchpoint.
            let id = host_wp.id.to_string();
            wpctl_refused(&ns, &daemon, &["unwatch", &id], NO_SUCH_WATCHPOINT).await?;
            wpctl_refused(&ns, &daemon, &["last", &id], NO_SUCH_WATCHPOINT).await?;

            // Policies set inside: by pid (with a name, so that one process is selected), and
            // by command name, which processes of that name here share.
            let (p1, a1) = (t1.pid.to_string(), format!("{:#x}", t1.vars[2]));
            let by_pid = wpctl_ok(
                &ns,
                &daemon,
                &[
                    "watch",
                    "--pid",
                    &p1,
                    "--comm",
                    "wpd-target",
                    "--addr",
                    &a1,
                    "--len",
                    "8",
                ],
            )
            .await?;
            let by_comm = wpctl_ok(
                &ns,
                &daemon,
                &["watch", "--comm", "wpd-target", "--addr", &a1, "--len", "8"],
            )
            .await?;
            let inners = BTreeSet::from([i64::from(t1.pid), i64::from(t2.pid)]);
            ensure!(
                numbers(&by_pid["policy"], "instances", "pid") == BTreeSet::from([t1.pid.into()])
                    && by_pid["policy"]["selector"]["pids"] == serde_json::json!([t1.pid]),
                "the policy by pid set in the namespace: {by_pid}"
            );
            ensure!(
                numbers(&by_comm["policy"], "instances", "pid") == inners,
                "the policy by name set in the namespace covers {}, the namespace's targets are \
                 {inners:?}",
                by_comm["policy"]["instances"]
            );
            // Seen from the daemon's namespace: the same instances, by its numbers, and none
            // in the process of that name outside.
            let list = rpc_ok(
                "ListWatchpoints",
                host_client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            let comm_id = by_comm["policy"]["id"].as_u64().unwrap_or(0);
            let instances: BTreeSet<i32> = list
                .policies
                .iter()
                .filter(|p| p.id == comm_id)
                .flat_map(|p| p.instances.iter().map(|i| i.pid))
                .collect();
            ensure!(
                instances == BTreeSet::from([h1, h2]),
                "policy {comm_id} has instances {instances:?} here; the targets are {h1} and {h2}"
            );
            ensure!(
                list.watchpoints
                    .iter()
                    .filter(|w| w.spec.as_ref().is_some_and(|s| s.pid == outside.pid))
                    .map(|w| w.id)
                    .collect::<Vec<_>>()
                    == [host_wp.id],
                "the process outside got more than its own watchpoint: {list:?}"
            );

            // `wpctl list` inside: its processes, watchpoints and policies only.
            let l = wpctl_ok(&ns, &daemon, &["list"]).await?;
            ensure!(
                numbers(&l, "processes", "pid") == inners
                    && numbers(&l, "watchpoints", "pid") == inners
                    && !numbers(&l, "watchpoints", "id").contains(&(host_wp.id as i64))
                    && l["policies"].as_array().map(Vec::len) == Some(2),
                "`wpctl list` in the namespace: {l}"
            );

            // Events: a store outside, then one inside; the namespace's stream shows only the
            // second.
            outside.write(1, 0x77).await?;
            host_events
                .wait_for(Duration::from_secs(10), "the hit outside", |ev| {
                    Ok(matches!(ev, Event::Hit(h) if h.watchpoint_id == host_wp.id).then_some(()))
                })
                .await?;
            t1.write(2, 0x78).await?;
            inner_events
                .wait_for(
                    Duration::from_secs(10),
                    "the hit inside, and nothing from outside",
                    |ev| {
                        let pid = match ev {
                            Event::Hit(h) => {
                                ensure!(h.watchpoint_id != host_wp.id, "{h:?}");
                                h.pid
                            }
                            Event::ThreadStarted(e) => e.pid,
                            Event::ThreadExited(e) => e.pid,
                            Event::ProcessExited(e) => e.pid,
                            Event::WatchpointRemoved(e) => e.pid,
                            _ => t1.pid,
                        };
                        ensure!(
                            pid == t1.pid || pid == t2.pid,
                            "the namespace was shown an event about pid {pid}: {ev:?}"
                        );
                        Ok(matches!(ev, Event::Hit(h) if h.pid == t1.pid
                            && hit_value_u64(h) == Some(0x78))
                        .then_some(()))
                    },
                )
                .await?;
            outside.ensure_alive()?;
            t1.ensure_alive()
        }
        .await,
    )
}

/// A cgroup named by a caller in nested pid and cgroup namespaces is its cgroup namespace's:
/// `wpctl watch --cgroup /farm` run there covers the namespace's process in `<root>/farm`, not a
/// process of the daemon's namespace in the same cgroup, and is listed there as `/farm` and
/// here by the daemon's path; a path climbing out of the namespace with `..` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_callers_cgroup_is_its_cgroup_namespaces() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let Some(mount) = cgroup2_mount() else {
        machine_skip("no cgroup v2 here");
        return Ok(());
    };
    let name = format!("wpd-nspid-{}", std::process::id());
    let root = mount.join(&name);
    let farm = root.join("farm");
    std::fs::create_dir(&root).with_context(|| format!("mkdir {}", root.display()))?;
    let made = async {
        std::fs::create_dir(&farm).with_context(|| format!("mkdir {}", farm.display()))?;
        let daemon = Daemon::start().await?;
        let ns = PidNamespace::start_in_cgroup(&root).await?;
        let inside = TargetProc::start_in_pidns_of(ns.init, &[]).await?;
        let outside = TargetProc::start(&[]).await?;
        let host_inside = first_child(inside.child_id())?;
        let r = daemon.finish(
            async {
                for pid in [host_inside, outside.pid] {
                    std::fs::write(farm.join("cgroup.procs"), pid.to_string())
                        .with_context(|| format!("moving {pid} into {}", farm.display()))?;
                }
                let addr = format!("{:#x}", inside.vars[1]);
                let v = wpctl_ok(
                    &ns,
                    &daemon,
                    &["watch", "--cgroup", "/farm", "--addr", &addr, "--len", "8"],
                )
                .await?;
                let p = &v["policy"];
                ensure!(
                    numbers(p, "instances", "pid") == BTreeSet::from([inside.pid.into()])
                        && p["selector"]["cgroup"] == "/farm",
                    "`wpctl watch --cgroup /farm` in the namespace: {v}"
                );
                let mut client = daemon.client().await?;
                let list = rpc_ok(
                    "ListWatchpoints",
                    client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
                )
                .await?;
                let here = list
                    .policies
                    .iter()
                    .find(|q| Some(q.id) == p["id"].as_u64())
                    .ok_or_else(|| anyhow!("the policy is not listed here: {list:?}"))?;
                let cgroup = here.selector.as_ref().map(|s| s.cgroup.as_str());
                ensure!(
                    cgroup == Some(format!("/{name}/farm").as_str())
                        && here.instances.iter().map(|i| i.pid).collect::<Vec<_>>()
                            == [host_inside],
                    "listed here: {here:?}"
                );
                let msg = wpctl_refused(
                    &ns,
                    &daemon,
                    &["watch", "--cgroup", "/../x", "--addr", &addr, "--len", "8"],
                    INVALID_ARGUMENT,
                )
                .await?;
                ensure!(msg.contains("'..'"), "{msg}");
                Ok(())
            }
            .await,
        );
        // Out of the test's cgroups before they are removed.
        let top = mount.join("cgroup.procs");
        for pid in [host_inside, outside.pid, ns.init] {
            let _ = std::fs::write(&top, pid.to_string());
        }
        drop((inside, outside, ns, daemon));
        r
    }
    .await;
    for dir in [&farm, &root] {
        for _ in 0..50 {
            if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    made
}

/// Where the cgroup v2 hierarchy is mounted here.
fn cgroup2_mount() -> Option<std::path::PathBuf> {
    let s = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    s.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next() == Some("cgroup2"))
            .then(|| left.split_whitespace().nth(4).map(std::path::PathBuf::from))
            .flatten()
    })
}

/// `wpctl` as the first process of a fresh pid namespace (`unshare --pid --fork --mount-proc`,
/// so it is its namespace's pid 1), against a daemon of the test's namespace: a pid of the
/// daemon's namespace names nothing there (refused, saying so); its own pid 1 is the
/// namespace's init, refused without `--allow-init`; nothing is armed; and it is listed
/// nothing of what the daemon watches for others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_namespace_names_nothing_outside_it() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let target = TargetProc::start(&["--threads", "2"]).await?;
    daemon.finish(
        async {
            let wpctl = bin_path("wpctl");
            let wpctl = wpctl.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?;
            let endpoint = daemon.endpoint();
            let addr = format!("{:#x}", target.vars[1]);
            let unshared = |args: &[&str]| {
                let mut cmd = tokio::process::Command::new("unshare");
                cmd.args(["--pid", "--fork", "--mount-proc", wpctl])
                    .args(["--endpoint", &endpoint, "--json"])
                    .args(args)
                    .stdin(std::process::Stdio::null())
                    .kill_on_drop(true);
                cmd
            };
            let refusals = [
                (target.pid.to_string(), NOT_IN_PID_NAMESPACE),
                ("1".to_string(), INIT_PROCESS),
            ];
            for (pid, reason) in refusals {
                let out = unshared(&["watch", "--pid", &pid, "--addr", &addr, "--len", "8"])
                    .output()
                    .await
                    .context("running wpctl under unshare")?;
                let stderr = String::from_utf8_lossy(&out.stderr);
                ensure!(
                    !out.status.success() && stderr.contains(reason),
                    "wpctl watch --pid {pid} from a fresh pid namespace: {} {stderr}",
                    out.status
                );
            }
            let mut client = daemon.client().await?;
            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(list.watchpoints.is_empty(), "armed: {list:?}");

            // Nor is it shown the daemon's processes: one watched from the daemon's namespace
            // is not listed to it.
            set_watchpoint(
                &mut client,
                write_spec(Backend::Perf, target.pid, target.vars[1]),
            )
            .await?;
            let out = unshared(&["list"])
                .output()
                .await
                .context("running wpctl list under unshare")?;
            let listed: Value = serde_json::from_slice(&out.stdout)
                .with_context(|| format!("wpctl --json list: {out:?}"))?;
            ensure!(
                listed["watchpoints"]
                    .as_array()
                    .is_some_and(|w| w.is_empty())
                    && listed["processes"].as_array().is_some_and(|p| p.is_empty()),
                "listed to a caller of a fresh pid namespace: {listed}"
            );
            Ok(())
        }
        .await,
    )
}

/// A client of the test's namespace, above that of a daemon started in a new one: the daemon
/// does not number it (`SO_PEERCRED` gives pid 0), so it cannot translate the pids it names;
/// refused, saying why and what to do, for setting a watchpoint or a policy and for following
/// a process's events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_above_the_daemons_namespace_is_refused() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start_in_new_pidns(&[]).await?;
    let inner = daemon.inner_pid().expect("a daemon under unshare");
    let target = TargetProc::start_in_pidns_of(inner, &["--threads", "2"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let r = client
                .set_watchpoint(SetWatchpointRequest {
                    spec: Some(write_spec(Backend::Perf, target.pid, target.vars[1])),
                })
                .await;
            // Saying why, and what to do.
            expect_status(
                "SetWatchpoint from above",
                r,
                Code::FailedPrecondition,
                &[
                    "another pid namespace",
                    "no pid in the daemon's namespace",
                    "nsenter --target DAEMON_PID --pid",
                ],
            )?;
            let r = client
                .set_policy(SetPolicyRequest {
                    selector: Some(ProcessSelector {
                        comm: "wpd-target".into(),
                        ..Default::default()
                    }),
                    spec: Some(write_spec(Backend::Perf, 0, target.vars[1])),
                })
                .await;
            expect_status(
                "SetPolicy from above",
                r,
                Code::FailedPrecondition,
                &["another pid namespace"],
            )?;
            let r = client
                .stream_events(StreamEventsRequest {
                    pid: target.pid,
                    ..Default::default()
                })
                .await;
            expect_status(
                "StreamEvents from above",
                r.map(|_| ()),
                Code::FailedPrecondition,
                &["another pid namespace"],
            )?;
            Ok(())
        }
        .await,
    )
}
