//! End-to-end tests of lifecycles: threads exiting, the process exiting, Detach, and the daemon
//! itself stopping — the target must always survive the daemon.

use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use tonic::Code;
use wpd_proto::v1::{DetachRequest, ListThreadsRequest, ListWatchpointsRequest, SlotState};
use wpd_tests::{
    Backend, Daemon, Event, EventStream, SetuidTarget, TargetProc, both_backends, count_slots,
    describe_status, expect_status, list_threads, ours, poll_until, rpc, rpc_ok, set_watchpoint,
    write_spec,
};

/// How long a target may stay ptrace-attached after a detach or the daemon's exit.
const UNTRACE_TIMEOUT: Duration = Duration::from_secs(5);

both_backends!(exited_threads_leave_the_ledger);

/// g. When the workers exit, the daemon forgets their threads (ListThreads shows only the
/// main thread, still armed) and reports each exit.
async fn exited_threads_leave_the_ledger(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "16"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let main = target.pid;
            let workers: HashSet<i32> = target.worker_tids()?.into_iter().collect();
            let mut events = EventStream::for_pid(&mut client, main).await?;
            // VARS[1]: nobody stores there, so no hits crowd out the lifecycle events.
            let wp = set_watchpoint(&mut client, write_spec(backend, main, target.vars[1]))
                .await?
                .watchpoint
                .unwrap_or_default();
            ensure!(wp.armed_threads == 17, "armed_threads {}", wp.armed_threads);

            let remaining = target.stop_workers().await?;
            ensure!(remaining == 1, "target reports {remaining} threads left");

            let main_thread = poll_until(
                Duration::from_secs(10),
                "ListThreads to show only the main thread",
                async || {
                    let list = list_threads(&mut client, main, false).await?;
                    let tids: Vec<i32> = list.threads.iter().map(|t| t.tid).collect();
                    Ok(if tids == [main] {
                        Ok(list.threads[0].clone())
                    } else {
                        Err(format!("{tids:?}"))
                    })
                },
            )
            .await?;
            ensure!(
                ours(&main_thread) == [wp.id] && count_slots(&main_thread, SlotState::Ours) == 1,
                "main thread should still hold watchpoint {}: {main_thread:?}",
                wp.id
            );

            let mut exited = HashSet::new();
            events
                .wait_for(
                    Duration::from_secs(10),
                    "ThreadExited for all 16 workers",
                    |ev| {
                        if let Event::ThreadExited(t) = ev {
                            ensure!(t.pid == main, "ThreadExited {t:?}: wrong pid");
                            ensure!(
                                workers.contains(&t.tid),
                                "ThreadExited for unknown tid: {t:?}"
                            );
                            exited.insert(t.tid);
                        }
                        Ok((exited == workers).then_some(()))
                    },
                )
                .await?;

            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: main }),
            )
            .await?;
            let listed = list.watchpoints.iter().find(|w| w.id == wp.id);
            ensure!(
                listed.is_some_and(|w| w.armed_threads == 1),
                "watchpoint should now be armed on the main thread only: {listed:?}"
            );
            target.ensure_alive()
        }
        .await,
    )
}

both_backends!(process_exit_removes_everything);

/// h. When the target exits, ProcessExited names its watchpoints, which are gone, and the
/// process is no longer known.
async fn process_exit_removes_everything(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "4"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let pid = target.pid;
            let mut events = EventStream::for_pid(&mut client, pid).await?;
            let ids = [
                set_watchpoint(&mut client, write_spec(backend, pid, target.vars[0])).await?,
                set_watchpoint(&mut client, write_spec(backend, pid, target.vars[1])).await?,
            ]
            .map(|r| r.watchpoint.unwrap_or_default().id);

            let status = target.quit().await?;
            ensure!(
                status.code() == Some(0),
                "the target should exit 0, but: {}",
                describe_status(&status)
            );

            events
                .wait_for(Duration::from_secs(10), "ProcessExited", |ev| {
                    Ok(match ev {
                        Event::ProcessExited(p) if p.pid == pid => {
                            let got: HashSet<u64> = p.watchpoint_ids.iter().copied().collect();
                            ensure!(
                                got == HashSet::from(ids),
                                "ProcessExited {p:?}, expected {ids:?}"
                            );
                            Some(())
                        }
                        // exit_group makes the kernel deliver SIGKILL to the other threads:
                        // not a crash.
                        Event::ProcessCrashed(c) if c.pid == pid => {
                            anyhow::bail!("a clean exit reported as a crash: {c:?}")
                        }
                        _ => None,
                    })
                })
                .await?;

            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(
                list.watchpoints.is_empty(),
                "still listed: {:?}",
                list.watchpoints
            );
            ensure!(
                list.processes.iter().all(|p| p.pid != pid),
                "process still listed: {:?}",
                list.processes
            );
            let threads = rpc(client.list_threads(ListThreadsRequest {
                pid,
                tids: vec![],
                probe: false,
            }))
            .await?;
            expect_status(
                "ListThreads of the exited pid",
                threads,
                Code::NotFound,
                &[],
            )?;
            Ok(())
        }
        .await,
    )
}

both_backends!(exec_removes_watchpoints_and_keeps_tracking);

/// exec replaces the program image: a watchpoint on the old image's address
/// must not fire in unrelated code (perf drops it with `remove_on_exec`, the
/// kernel clears ptrace registers). The daemon reports each as removed with
/// reason "exec", the process stays attached (listed under its new command
/// name), and new watchpoints work.
async fn exec_removes_watchpoints_and_keeps_tracking(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "3"]).await?;
    // A copy of the target under another name, for the exec to change it.
    let dir = wpd_tests::unique_temp_dir("wpd-exec-comm")?;
    let renamed = dir.join("wpd-renamed");
    std::fs::copy(wpd_tests::bin_path("wpd-target"), &renamed)?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let pid = target.pid;
            let mut events = EventStream::for_pid(&mut client, pid).await?;
            let id = set_watchpoint(&mut client, write_spec(backend, pid, target.vars[0]))
                .await?
                .watchpoint
                .unwrap_or_default()
                .id;
            target.exec_path(&renamed, 2).await?;
            ensure!(target.pid == pid, "exec keeps the pid");
            events
                .wait_for(Duration::from_secs(10), "WatchpointRemoved(exec)", |ev| {
                    Ok(match ev {
                        Event::WatchpointRemoved(r) if r.watchpoint_id == id => {
                            ensure!(r.reason == "exec", "removed for {:?}, not exec", r.reason);
                            Some(())
                        }
                        _ => None,
                    })
                })
                .await?;
            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid }),
            )
            .await?;
            ensure!(
                list.watchpoints.is_empty(),
                "still listed: {:?}",
                list.watchpoints
            );
            ensure!(
                list.processes
                    .iter()
                    .any(|p| p.pid == pid && p.comm == "wpd-renamed"),
                "the process should stay attached, named as its new program: {:?}",
                list.processes
            );
            // The new image is watched again like any process.
            let resp =
                set_watchpoint(&mut client, write_spec(backend, pid, target.vars[0])).await?;
            let new_id = resp.watchpoint.unwrap_or_default().id;
            let hits = events.collect_hits(3, Duration::from_secs(10)).await?;
            ensure!(
                hits.iter().all(|h| h.watchpoint_id == new_id),
                "hits after exec must come from the new watchpoint: {hits:?}"
            );
            let pong = target.cmd("ping").await?;
            ensure!(pong.starts_with("PONG"), "target after exec: {pong}");
            let _ = std::fs::remove_dir_all(&dir);
            Ok(())
        }
        .await,
    )
}

both_backends!(setuid_exec_ends_the_attachment);

/// A watched process of an unprivileged user executes a setuid-root program: with perf the
/// kernel takes every event off it, with ptrace its credentials change under the tracer. The
/// daemon must not keep a dead attachment (or a watch on a now-privileged process) nor report
/// success later for a watchpoint armed on no thread: it ends the attachment with a
/// `ProcessLost` event saying why. The process runs on, untraced, and can be attached again.
async fn setuid_exec_ends_the_attachment(backend: Backend) -> Result<()> {
    const NOBODY: u32 = 65534;
    let setuid = SetuidTarget::new()?;
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start_as(NOBODY, &["--threads", "2"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let pid = target.pid;
            let mut events = EventStream::for_pid(&mut client, pid).await?;
            let id = set_watchpoint(&mut client, write_spec(backend, pid, target.vars[0]))
                .await?
                .watchpoint
                .unwrap_or_default()
                .id;
            events.collect_hits(1, Duration::from_secs(10)).await?;
            target.exec_path(&setuid.path, 2).await?;
            ensure!(target.pid == pid, "exec keeps the pid");
            let lost = events
                .wait_for(Duration::from_secs(10), "ProcessLost", |ev| {
                    Ok(match ev {
                        Event::ProcessLost(l) if l.pid == pid => Some(l.clone()),
                        _ => None,
                    })
                })
                .await?;
            ensure!(
                lost.watchpoint_ids == [id] && lost.reason.contains("setuid"),
                "ProcessLost {lost:?}: expected watchpoint {id} and the reason"
            );
            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(
                list.watchpoints.is_empty() && list.processes.is_empty(),
                "still listed after the setuid exec: {list:?}"
            );
            target.wait_untraced(UNTRACE_TIMEOUT).await?;
            target.ensure_alive()?;
            // Attached again, the new program is watched on every thread.
            let again = set_watchpoint(&mut client, write_spec(backend, pid, target.vars[0]))
                .await?
                .watchpoint
                .unwrap_or_default();
            ensure!(
                again.armed_threads == 3,
                "armed on {} threads",
                again.armed_threads
            );
            let hits = events.collect_hits(2, Duration::from_secs(10)).await?;
            ensure!(
                hits.iter().all(|h| h.watchpoint_id == again.id),
                "hits of the new watchpoint expected: {hits:?}"
            );
            rpc_ok("Detach", client.detach(DetachRequest { pid })).await?;
            target.wait_untraced(UNTRACE_TIMEOUT).await?;
            target.ensure_alive()
        }
        .await,
    )
}

both_backends!(detach_leaves_the_target_running);

/// i. Detach removes every watchpoint and forgets the process, which keeps running.
async fn detach_leaves_the_target_running(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "8"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let pid = target.pid;
            set_watchpoint(&mut client, write_spec(backend, pid, target.vars[0])).await?;
            set_watchpoint(&mut client, write_spec(backend, pid, target.vars[1])).await?;

            let detached = rpc_ok("Detach", client.detach(DetachRequest { pid })).await?;
            ensure!(detached.watchpoints_removed == 2, "Detach: {detached:?}");
            ensure!(detached.threads_released == 9, "Detach: {detached:?}");

            target.ensure_alive()?;
            let (c0, threads) = target.ping().await?;
            ensure!(threads == 9, "target has {threads} threads after detach");
            target
                .wait_counter_above(c0, Duration::from_secs(5))
                .await?;

            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(
                list.watchpoints.is_empty(),
                "still listed: {:?}",
                list.watchpoints
            );
            let threads = rpc(client.list_threads(ListThreadsRequest {
                pid,
                tids: vec![],
                probe: false,
            }))
            .await?;
            expect_status("ListThreads after Detach", threads, Code::NotFound, &[])?;
            let again = rpc(client.detach(DetachRequest { pid })).await?;
            expect_status("second Detach", again, Code::NotFound, &[])?;

            target.wait_untraced(UNTRACE_TIMEOUT).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (c1, _) = target.ping().await?;
            target
                .wait_counter_above(c1, Duration::from_secs(5))
                .await?;
            target.ensure_alive()
        }
        .await,
    )
}

/// After the daemon is gone: the target runs on (workers still store, including to the
/// formerly watched variables), nobody ptraces it, and no stray SIGTRAP killed it.
async fn ensure_target_survived(target: &mut TargetProc) -> Result<()> {
    let result = async {
        target.ensure_alive()?;
        let (c0, threads) = target.ping().await?;
        ensure!(threads == 9, "target has {threads} threads");
        target
            .wait_counter_above(c0, Duration::from_secs(5))
            .await?;
        target.write(2, 7).await?;
        target.wait_untraced(UNTRACE_TIMEOUT).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (c1, _) = target.ping().await?;
        target
            .wait_counter_above(c1, Duration::from_secs(5))
            .await?;
        target.ensure_alive()
    }
    .await;
    if target.exit_status().and_then(|st| st.signal()) == Some(libc::SIGTRAP) {
        eprintln!("the target died of SIGTRAP: a debug register was left armed");
    }
    result
}

both_backends!(daemon_sigterm_leaves_the_target_running);

/// j. SIGTERM makes the daemon exit 0 within 10 s with armed (firing) watchpoints; the target
/// keeps running and is not hit by a stray SIGTRAP.
async fn daemon_sigterm_leaves_the_target_running(backend: Backend) -> Result<()> {
    let mut daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "8"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let pid = target.pid;
        let id = set_watchpoint(&mut client, write_spec(backend, pid, target.vars[0]))
            .await?
            .watchpoint
            .unwrap_or_default()
            .id;
        set_watchpoint(&mut client, write_spec(backend, pid, target.vars[2])).await?;
        poll_until(Duration::from_secs(10), "hits on VARS[0]", async || {
            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid }),
            )
            .await?;
            let hits = list.watchpoints.iter().find(|w| w.id == id).map(|w| w.hits);
            Ok(if hits.unwrap_or(0) > 0 {
                Ok(())
            } else {
                Err(format!("hits {hits:?}"))
            })
        })
        .await?;
        drop(client);

        let status = daemon.terminate(Duration::from_secs(10)).await?;
        ensure!(
            status.code() == Some(0),
            "wpd should exit 0 on SIGTERM, but: {}",
            describe_status(&status)
        );
        ensure_target_survived(&mut target).await
    }
    .await;
    daemon.finish(result)
}

both_backends!(daemon_sigterm_with_open_subscriber);

/// j'. The same with a client still subscribed to the event stream (e.g. `wpctl events`): the
/// daemon must end the stream and still exit 0 within 10 s.
async fn daemon_sigterm_with_open_subscriber(backend: Backend) -> Result<()> {
    let mut daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "8"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let pid = target.pid;
        let mut events = EventStream::for_pid(&mut client, pid).await?;
        set_watchpoint(&mut client, write_spec(backend, pid, target.vars[0])).await?;
        events.collect_hits(10, Duration::from_secs(10)).await?;

        let status = daemon
            .terminate(Duration::from_secs(10))
            .await
            .context("with a StreamEvents subscriber connected")?;
        ensure!(
            status.code() == Some(0),
            "wpd should exit 0 on SIGTERM, but: {}",
            describe_status(&status)
        );
        drop(events);
        ensure_target_survived(&mut target).await
    }
    .await;
    daemon.finish(result)
}

/// A user asks to watch its own process, which executes a setuid-root program between the
/// daemon's permission check and the attach (the check is made to take 3 s): the daemon
/// checks again once armed, backs out, and answers PERMISSION_DENIED; nothing stays
/// attached to the now-privileged process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setuid_exec_between_check_and_attach_is_backed_out() -> Result<()> {
    if !wpd_tests::require_root_perf() {
        return Ok(());
    }
    use std::os::unix::fs::PermissionsExt;
    const NOBODY: u32 = 65534;
    let setuid = SetuidTarget::new()?;
    let daemon = Daemon::start_with_env(
        &["--socket-mode", "666"],
        &[("WPD_FAULT_AFTER_CHECK_MS", "3000")],
    )
    .await?;
    if let Some(dir) = daemon.socket_path().parent() {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    let mut target = TargetProc::start_as(NOBODY, &["--threads", "2"]).await?;
    daemon.finish(
        async {
            let pid = target.pid;
            let ep = daemon.endpoint();
            let addr = format!("{:#x}", target.vars[0]);
            let watch = tokio::spawn(async move {
                wpd_tests::run_wpctl_as(
                    Some(NOBODY),
                    &[
                        "--endpoint",
                        &ep,
                        "watch",
                        "--pid",
                        &pid.to_string(),
                        "--addr",
                        &addr,
                    ],
                    Duration::from_secs(30),
                )
                .await
            });
            // While the daemon sits between its check and the attach (it says when it got
            // there: a loaded machine may take a while to start wpctl).
            poll_until(
                Duration::from_secs(20),
                "the daemon to pause after its check",
                async || {
                    Ok(
                        if daemon.log().contains("pausing after the permission check") {
                            Ok(())
                        } else {
                            Err(String::from("not yet"))
                        },
                    )
                },
            )
            .await?;
            target.exec_path(&setuid.path, 2).await?;
            let out = watch.await??;
            ensure!(
                out.code == Some(7) && out.stderr.contains("setuid"),
                "the watch of a process that became root's: {out:?}"
            );
            let mut client = daemon.client().await?;
            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(
                list.watchpoints.is_empty() && list.processes.is_empty(),
                "left attached: {list:?}"
            );
            target.ensure_alive()?;
            Ok(())
        }
        .await,
    )
}

/// A watched process that dies of a signal is reported as the signal is delivered, before it
/// is gone: which signal, which thread, its si_code and what it means (for a SIGTRAP, what in
/// the kernel or the machine sent it: wpd sends none), and the watchpoints it had. SIGTRAPs
/// are counted in GetStats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_process_that_dies_of_a_signal_is_reported_with_why() -> Result<()> {
    if !wpd_tests::require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            for (cmd, sig, code, says) in [
                ("int3", libc::SIGTRAP, 0x80, "int3"),
                ("abort", libc::SIGABRT, -6, "SIGABRT"),
            ] {
                let mut target = TargetProc::start(&["--threads", "2"]).await?;
                let pid = target.pid;
                let mut events = EventStream::for_pid(&mut client, pid).await?;
                let id =
                    set_watchpoint(&mut client, write_spec(Backend::Perf, pid, target.vars[0]))
                        .await?
                        .watchpoint
                        .unwrap_or_default()
                        .id;
                target.send(cmd)?;
                let crashed = events
                    .wait_for(Duration::from_secs(10), "ProcessCrashed", |ev| {
                        Ok(match ev {
                            Event::ProcessCrashed(c) if c.pid == pid => Some(c.clone()),
                            _ => None,
                        })
                    })
                    .await?;
                ensure!(
                    crashed.signal == sig
                        && crashed.code == code
                        && crashed.fatal
                        && crashed.watchpoint_ids == [id]
                        && crashed.reason.contains(says),
                    "{cmd}: {crashed:?}"
                );
                let st = target.wait_exit(Duration::from_secs(10)).await?;
                ensure!(st.signal() == Some(sig), "{cmd}: exit {st:?}");
            }
            let stats = rpc_ok(
                "GetStats",
                client.get_stats(wpd_proto::v1::GetStatsRequest {}),
            )
            .await?;
            ensure!(stats.sigtraps == 1, "sigtraps {}", stats.sigtraps);
            Ok(())
        }
        .await,
    )
}
