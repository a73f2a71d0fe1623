//! A process whose main thread has exited (`pthread_exit` in the leader while workers carry
//! on: the kernel keeps the leader as a zombie and the process lives). The daemon must keep
//! watching it with values read through a live thread, list only live threads, detach at once
//! and leave every thread running and untraced, with either backend; and it must accept such a
//! process when the leader had already exited before the attach.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use wpd_proto::v1::{
    Access, DetachRequest, GetStatsRequest, Hit, ListWatchpointsRequest, ResolveSymbolRequest,
    Watchpoint, WatchpointSpec,
};
use wpd_tests::{
    Backend, CTarget, Client, Daemon, Event, EventStream, TargetProc, both_backends,
    describe_status, hit_value_u64, list_threads, poll_until, rpc_ok, set_watchpoint, write_spec,
};

/// Longest a Detach or a daemon's SIGTERM may take on this small target.
const PROMPT: Duration = Duration::from_secs(10);
/// Timeout of every wait for hits.
const HIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Every hit carries the watched 8 bytes, read without error, and (ptrace: read while the
/// thread is stopped) a value some worker stored.
fn check_values(hits: &[Hit], what: &str) -> Result<()> {
    for h in hits {
        ensure!(
            h.value_error.is_empty() && hit_value_u64(h).is_some(),
            "{what}: hit without a value: {h:?}"
        );
    }
    Ok(())
}

/// Polls ListThreads until it lists exactly the live threads of the target (the zombie leader
/// is not one of them).
async fn wait_live_threads_listed(client: &mut Client, target: &TargetProc) -> Result<Vec<i32>> {
    poll_until(
        Duration::from_secs(10),
        "ListThreads to list the live threads only",
        async || {
            let mut live = live_tids(target)?;
            live.sort_unstable();
            let list = list_threads(client, target.pid, false).await?;
            let mut listed: Vec<i32> = list.threads.iter().map(|t| t.tid).collect();
            listed.sort_unstable();
            Ok(if listed == live && !listed.contains(&target.pid) {
                Ok(listed)
            } else {
                Err(format!("listed {listed:?}, live {live:?}"))
            })
        },
    )
    .await
}

/// Threads of the target that are not zombies.
fn live_tids(target: &TargetProc) -> Result<Vec<i32>> {
    Ok(target
        .thread_run_states()?
        .into_iter()
        .filter(|&(_, s)| s != 'Z' && s != 'X')
        .map(|(t, _)| t)
        .collect())
}

/// The target still runs: its workers store, none is in a tracing stop, nobody traces any
/// thread (the zombie leader included), and it answers commands.
async fn ensure_running_untraced(target: &mut TargetProc) -> Result<()> {
    target.ensure_alive()?;
    target.wait_untraced(PROMPT).await?;
    let v0 = target.read_var(0)?;
    poll_until(PROMPT, "the workers to store again", async || {
        let v = target.read_var(0)?;
        Ok(if v > v0 { Ok(()) } else { Err(format!("{v}")) })
    })
    .await?;
    let stuck: Vec<(i32, char)> = target
        .thread_run_states()?
        .into_iter()
        .filter(|&(_, s)| s == 't' || s == 'T')
        .collect();
    ensure!(stuck.is_empty(), "threads left stopped: {stuck:?}");
    target.ping().await?;
    target.ensure_alive()
}

both_backends!(watched_when_the_leader_exits);

/// The watchpoint is set first, then the main thread exits: hits keep their values, the leader
/// leaves the listings, Detach answers at once and the target runs on untraced.
async fn watched_when_the_leader_exits(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "3"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let pid = target.pid;
        let mut events = EventStream::for_pid(&mut client, pid).await?;
        let wp = set_watchpoint(&mut client, write_spec(backend, pid, target.vars[0]))
            .await?
            .watchpoint
            .unwrap_or_default();
        ensure!(
            wp.armed_threads == 4,
            "armed on {} threads",
            wp.armed_threads
        );
        check_values(&events.collect_hits(5, HIT_TIMEOUT).await?, "before")?;

        target.leader_exit().await?;
        // Hits that follow the leader's exit still carry values.
        let _ = events.drain_for(Duration::from_millis(100)).await?;
        check_values(
            &events.collect_hits(20, HIT_TIMEOUT).await?,
            "after the leader exited",
        )?;
        wait_live_threads_listed(&mut client, &target).await?;

        let detach = tokio::time::timeout(PROMPT, client.detach(DetachRequest { pid }))
            .await
            .with_context(|| format!("Detach did not answer within {PROMPT:?}"))?
            .context("Detach")?
            .into_inner();
        ensure!(detach.watchpoints_removed == 1, "Detach: {detach:?}");
        let list = rpc_ok(
            "ListWatchpoints",
            client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
        )
        .await?;
        ensure!(
            list.watchpoints.is_empty() && list.processes.is_empty(),
            "still listed after Detach: {list:?}"
        );
        let stats = rpc_ok("GetStats", client.get_stats(GetStatsRequest {})).await?;
        ensure!(
            stats.threads == 0 && stats.processes == 0,
            "threads still accounted after Detach: {stats:?}"
        );
        ensure_running_untraced(&mut target).await
    }
    .await;
    daemon.finish(result)
}

both_backends!(attached_after_the_leader_exited);

/// The main thread has exited before the daemon ever sees the process: Attach through
/// SetWatchpoint accepts it, arms every live thread, hits carry values, and SIGTERM of the
/// daemon finishes promptly and leaves the target running.
async fn attached_after_the_leader_exited(backend: Backend) -> Result<()> {
    let mut daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "3"]).await?;
    let result = async {
        let commander = target.leader_exit().await?;
        let mut client = daemon.client().await?;
        let pid = target.pid;
        let mut events = EventStream::for_pid(&mut client, pid).await?;
        let wp = set_watchpoint(&mut client, write_spec(backend, pid, target.vars[0]))
            .await?
            .watchpoint
            .unwrap_or_default();
        // Three workers and the thread that now serves commands; not the zombie leader.
        ensure!(
            wp.armed_threads == 4,
            "armed on {} threads",
            wp.armed_threads
        );
        let listed = wait_live_threads_listed(&mut client, &target).await?;
        ensure!(listed.contains(&commander), "listed {listed:?}");
        check_values(&events.collect_hits(20, HIT_TIMEOUT).await?, "hits")?;
        // The commander thread writes VARS[2] on request: a watchpoint there hits from it.
        let wp2 = set_watchpoint(&mut client, write_spec(backend, pid, target.vars[2]))
            .await?
            .watchpoint
            .unwrap_or_default();
        target.write(2, 0x5eed).await?;
        let hit = events
            .wait_for(HIT_TIMEOUT, "the commander's hit on VARS[2]", |ev| {
                Ok(match ev {
                    wpd_tests::Event::Hit(h) if h.watchpoint_id == wp2.id => Some(h.clone()),
                    _ => None,
                })
            })
            .await?;
        ensure!(
            hit.tid == commander && hit_value_u64(&hit) == Some(0x5eed),
            "expected the commander {commander} to store 0x5eed: {hit:?}"
        );
        drop(events);
        drop(client);

        let status = daemon.terminate(PROMPT).await?;
        if status.code() != Some(0) {
            bail!(
                "wpd should exit 0 on SIGTERM, but: {}",
                describe_status(&status)
            );
        }
        ensure_running_untraced(&mut target).await
    }
    .await;
    daemon.finish(result)
}

/// A write watchpoint on `libctplug.so:plug_counter` by name, which must land at `plug` (the
/// address the program printed).
async fn watch_plug(
    client: &mut Client,
    backend: Backend,
    pid: i32,
    plug: u64,
) -> Result<Watchpoint> {
    let wp = set_watchpoint(
        client,
        WatchpointSpec {
            pid,
            symbol: "libctplug.so:plug_counter".into(),
            access: Access::Write as i32,
            backend: backend as i32,
            ..Default::default()
        },
    )
    .await?
    .watchpoint
    .unwrap_or_default();
    ensure!(
        wp.pieces.first().map(|p| p.address) == Some(plug),
        "{wp:?} vs {plug:#x}"
    );
    Ok(wp)
}

both_backends!(library_watchpoints_stay_when_the_leader_exits);

/// A watchpoint in a `dlopen`ed library stays when the main thread exits: the zombie leader's
/// `/proc/PID/maps` reads empty and its `exe` link names nothing, which must not pass for the
/// library being unmapped. The daemon reads them through a live thread: the watchpoint still
/// hits after several rounds of its module check, and still goes when the library is unloaded.
async fn library_watchpoints_stay_when_the_leader_exits(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    let result = async {
        let mut client = daemon.client().await?;
        let plug = CTarget::reply_addr(&t.cmd("dlopen").await?, "plug")?;
        let mut events = EventStream::for_pid(&mut client, t.pid).await?;
        let wp = watch_plug(&mut client, backend, t.pid, plug).await?;
        let reply = t.cmd("leader-exit").await?;
        ensure!(reply == "LEADER-EXITED", "leader-exit: {reply:?}");
        // Three more reads of the maps: three rounds of the module check at least (two rounds
        // without the library remove its watchpoints).
        let maps_reads = async || -> Result<u64> {
            let mut c = daemon.client().await?;
            Ok(rpc_ok("GetStats", c.get_stats(GetStatsRequest {}))
                .await?
                .symbol_maps_reads)
        };
        let from = maps_reads().await?;
        let rounds = poll_until(
            HIT_TIMEOUT,
            "three rounds of the module check",
            async || {
                let n = maps_reads().await?;
                Ok(if n >= from + 3 {
                    Ok(())
                } else {
                    Err(format!("{} reads of the maps", n - from))
                })
            },
        )
        .await;
        if let Err(e) = rounds {
            // A watchpoint removed takes its process out of the check: say so if it did.
            let removed: Vec<Event> = events
                .drain_for(Duration::from_millis(100))
                .await?
                .into_iter()
                .filter(|ev| matches!(ev, Event::WatchpointRemoved(_)))
                .collect();
            bail!("{e:#}; removed meanwhile: {removed:?}");
        }
        t.cmd("set plug 7").await?;
        let seen = events
            .wait_for(
                HIT_TIMEOUT,
                "the plug's hit after the leader's exit",
                |ev| {
                    Ok(match ev {
                        Event::WatchpointRemoved(r) if r.watchpoint_id == wp.id => {
                            Some(Err(r.reason.clone()))
                        }
                        Event::Hit(h) if h.watchpoint_id == wp.id => Some(Ok(hit_value_u64(h))),
                        _ => None,
                    })
                },
            )
            .await?;
        ensure!(
            seen == Ok(Some(7)),
            "after the leader's exit: {seen:?} (expected a hit of 7)"
        );
        t.cmd("dlclose").await?;
        let why = events
            .wait_for(HIT_TIMEOUT, "the plug watchpoint to go", |ev| {
                Ok(match ev {
                    Event::WatchpointRemoved(r) if r.watchpoint_id == wp.id => {
                        Some(r.reason.clone())
                    }
                    _ => None,
                })
            })
            .await?;
        ensure!(
            why.contains("libctplug.so") && why.contains("unmapped"),
            "reason {why:?}"
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}

both_backends!(names_resolve_after_the_leader_exited);

/// Names resolve in a process whose leader exited before the daemon ever saw it, in a library
/// loaded before the exit and in one loaded after: the process's root (through which the daemon
/// opens its modules) and its auxiliary vector are the leader's and gone with it, so the
/// daemon takes a live thread's. A hit in the library loaded later names its function.
async fn names_resolve_after_the_leader_exited(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    let result = async {
        let reply = t.cmd("leader-exit").await?;
        ensure!(reply == "LEADER-EXITED", "leader-exit: {reply:?}");
        let plug = CTarget::reply_addr(&t.cmd("dlopen").await?, "plug")?;
        let mut client = daemon.client().await?;
        let lib = rpc_ok(
            "ResolveSymbol(libctlib.so:lib_counter)",
            client.resolve_symbol(ResolveSymbolRequest {
                pid: t.pid,
                name: "libctlib.so:lib_counter".into(),
                ..Default::default()
            }),
        )
        .await?
        .symbol
        .unwrap_or_default();
        ensure!(
            lib.address == t.addr("lib"),
            "lib_counter resolved at {:#x}, the program prints {:#x}",
            lib.address,
            t.addr("lib")
        );
        let mut events = EventStream::for_pid(&mut client, t.pid).await?;
        let wp = watch_plug(&mut client, backend, t.pid, plug).await?;
        t.cmd("set plug 9").await?;
        let hit = events
            .wait_for(HIT_TIMEOUT, "the plug's hit", |ev| {
                Ok(match ev {
                    Event::Hit(h) if h.watchpoint_id == wp.id => Some(h.clone()),
                    _ => None,
                })
            })
            .await?;
        let function = hit.location.as_ref().map(|l| l.function.as_str());
        ensure!(
            hit_value_u64(&hit) == Some(9) && function == Some("plug_set"),
            "expected 9 stored in plug_set: {hit:?}"
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}
