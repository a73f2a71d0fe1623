//! End-to-end tests of pid namespaces: a daemon started in a pid namespace of its own reports
//! the ids of its namespace — in hits and listings, whatever the backend — never those of the
//! initial one (its BPF programs ask the kernel for its namespace's); and a caller in another
//! pid namespace than the daemon's is refused with the reason, never served with the daemon's
//! numbers (`docs/security.md`).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use tonic::Code;
use wpd_proto::v1::{ListWatchpointsRequest, SetWatchpointRequest, StreamEventsRequest};
use wpd_tests::{
    Backend, Daemon, Event, EventStream, Relay, SPAWN_MARK, TargetProc, bin_path, both_backends,
    expect_status, hit_value_u64, list_threads, require_root_perf, rpc_ok, set_watchpoint,
    write_spec,
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

/// `wpctl watch --pid P` run in a new pid namespace (`unshare --pid --fork --mount-proc`)
/// against a daemon of the test's namespace, P being a process of the daemon's namespace: in the
/// caller's namespace P is another process (or none), so the daemon refuses, saying why, and
/// arms nothing; nor is it listed what the daemon watches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_below_the_daemons_namespace_arms_nothing() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "2"]).await?;
    daemon.finish(
        async {
            let wpctl = bin_path("wpctl");
            let wpctl = wpctl.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?;
            let endpoint = daemon.endpoint();
            let addr = format!("{:#x}", target.vars[1]);
            for pid in [target.pid.to_string(), "1".to_string()] {
                let out = tokio::process::Command::new("unshare")
                    .args(["--pid", "--fork", "--mount-proc", wpctl])
                    .args(["--endpoint", &endpoint, "watch", "--pid", &pid])
                    .args(["--addr", &addr, "--len", "8"])
                    .stdin(std::process::Stdio::null())
                    .kill_on_drop(true)
                    .output()
                    .await
                    .context("running wpctl under unshare")?;
                let stderr = String::from_utf8_lossy(&out.stderr);
                ensure!(
                    !out.status.success() && stderr.contains("another pid namespace"),
                    "wpctl watch --pid {pid} from another pid namespace: {} {stderr}",
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
            let out = tokio::process::Command::new("unshare")
                .args(["--pid", "--fork", "--mount-proc", wpctl])
                .args(["--endpoint", &endpoint, "--json", "list"])
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .output()
                .await
                .context("running wpctl list under unshare")?;
            let listed: serde_json::Value = serde_json::from_slice(&out.stdout)
                .with_context(|| format!("wpctl --json list: {out:?}"))?;
            ensure!(
                listed["watchpoints"]
                    .as_array()
                    .is_some_and(|w| w.is_empty())
                    && listed["processes"].as_array().is_some_and(|p| p.is_empty()),
                "listed to a caller of another pid namespace: {listed}"
            );
            target.ensure_alive()
        }
        .await,
    )
}

/// A client of the test's namespace, above that of a daemon started in a new one: the daemon
/// does not number it, so a pid it names is not the daemon's; refused, saying why, for setting
/// a watchpoint and for following a process's events.
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
            expect_status(
                "SetWatchpoint from above",
                r,
                Code::FailedPrecondition,
                &["another pid namespace", "no pid in the daemon's namespace"],
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
