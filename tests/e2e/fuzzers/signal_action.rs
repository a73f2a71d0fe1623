//! The signal action: a hit whose condition holds sends a signal to the writing thread,
//! judged at the trap, with every filter and on either backend; unusable signals are
//! refused; a signal the program later blocks removes the watchpoint; a crash carries the
//! last hits.

use super::*;

/// A process-wide write watchpoint on `VARS[i]` of `target` whose hits send `signal` to the
/// writing thread when the value is 7.
fn signal_spec(
    backend: Backend,
    target: &TargetProc,
    i: usize,
    signal: i32,
) -> SetWatchpointRequest {
    let mut spec = write_spec(backend, target.pid, target.vars[i]);
    spec.action = HitAction::Signal as i32;
    spec.signal = signal;
    spec.condition = Some(HitCondition {
        value: String::new(),
        op: Op::Eq as i32,
        operand: 7,
        mask: 0,
    });
    SetWatchpointRequest { spec: Some(spec) }
}

async fn usr1_count(target: &mut TargetProc) -> Result<u64> {
    let reply = target.cmd("usr1count").await?;
    reply
        .strip_prefix("USR1 ")
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("unexpected reply to usr1count: {reply:?}"))
}

wpd_tests::both_backends!(
    /// The signal reaches the thread that stored, at the hit, and only when the condition
    /// holds (judged at the trap: in the BPF program on perf, in the stop on ptrace): stores
    /// of 5 send nothing, a store of 7 runs the target's SIGUSR1 handler once, before the
    /// store's command is answered; a writer that blocks the signal keeps it pending for
    /// itself (it is sent to the thread, not to the process). The target lives on (its
    /// handler caught the signal).
    the_signal_action_reaches_the_writer_when_the_condition_holds
);
async fn the_signal_action_reaches_the_writer_when_the_condition_holds(
    backend: Backend,
) -> Result<()> {
    let daemon = Daemon::start().await?;
    // Workers that almost never write: the stores are the main thread's.
    let mut target = TargetProc::start(&["--threads", "2", "--interval-us", "1000000"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let mut events = EventStream::for_pid(&mut client, target.pid).await?;
        let wp = rpc_ok(
            "SetWatchpoint",
            client.set_watchpoint(signal_spec(backend, &target, 2, SIGUSR1)),
        )
        .await?
        .watchpoint
        .context("no watchpoint")?;
        let before = usr1_count(&mut target).await?;
        for _ in 0..3 {
            target.cmd("write 2 5").await?;
        }
        ensure!(
            usr1_count(&mut target).await? == before,
            "stores of 5 sent the signal"
        );
        // A thread other than the main one (the process's leader, where a signal sent to
        // the process would most likely land) stores 7.
        let (writer, on_writer) = thread_write(&mut target, 2, 7).await?;
        ensure!(
            writer != target.pid,
            "the writer is the main thread ({writer})"
        );
        // The handler ran at the store, on the storing thread, before it exited.
        ensure!(
            on_writer == 1,
            "the writer {writer}'s own handler ran {on_writer} times for its store of 7"
        );
        let after = usr1_count(&mut target).await?;
        ensure!(
            after == before + 1,
            "a store of 7 ran the handler {} times",
            after - before
        );
        let hit = events
            .wait_for(HIT_TIMEOUT, "the hit of the store of 7", |e| {
                Ok(match e {
                    Event::Hit(h) if h.watchpoint_id == wp.id => Some(h.clone()),
                    _ => None,
                })
            })
            .await?;
        ensure!(
            hit.tid == writer && hit.value == 7u64.to_le_bytes(),
            "the reported hit is not thread {writer}'s store of 7: {hit:?}"
        );
        // Sent to the thread, not to the process: a writer that blocks the signal keeps it
        // pending for itself alone (a signal sent to the process, even from the writer's own
        // context, would go to a thread that does not block it and run its handler there).
        let before = usr1_count(&mut target).await?;
        let reply = target.cmd("thread-write-blocked 2 7").await?;
        ensure!(
            reply.starts_with("THREAD-WROTE-BLOCKED") && reply.ends_with(" pending=1"),
            "the signal is not pending for the writer that blocks it: {reply:?}"
        );
        let after = usr1_count(&mut target).await?;
        ensure!(
            after == before,
            "another thread ran the handler for the blocking writer's store ({} times)",
            after - before
        );
        target.ensure_alive()
    }
    .await;
    daemon.finish(result)
}

/// `thread-write I V`: a new thread of `target` stores V into `VARS[I]`; (its tid, the SIGUSR1
/// its own handler ran).
async fn thread_write(target: &mut TargetProc, i: usize, v: u64) -> Result<(i32, u64)> {
    let reply = target.cmd(&format!("thread-write {i} {v}")).await?;
    let field = |k: &str| {
        reply
            .split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|n| n.parse::<u64>().ok())
    };
    match (
        reply.starts_with("THREAD-WROTE"),
        field("tid="),
        field("usr1="),
    ) {
        (true, Some(tid), Some(n)) => Ok((tid as i32, n)),
        _ => bail!("unexpected reply to thread-write: {reply:?}"),
    }
}

wpd_tests::both_backends!(
    /// Every combination of action (report, signal), condition (none, `changed`, a comparison),
    /// ignore count, hit count and rate limit is armed (on perf, a program the kernel's
    /// verifier takes), and the signal reaches the writing thread at the hit when it should:
    /// each combination's watchpoint is set on a quiet variable, a new thread stores into it
    /// once, and its own handler must have run exactly when the action signals, the hit is
    /// not skipped and the comparison (`== 7`) or `changed` holds.
    every_combination_of_filter_and_action_is_armed
);
async fn every_combination_of_filter_and_action_is_armed(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "2", "--interval-us", "1000000"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let conditions = [
            None,
            Some(HitCondition {
                op: Op::Changed as i32,
                ..Default::default()
            }),
            Some(HitCondition {
                value: String::new(),
                op: Op::Eq as i32,
                operand: 7,
                mask: 0,
            }),
        ];
        let mut n = 0;
        for signal in [false, true] {
            for condition in &conditions {
                for ignore in [0u64, 2] {
                    for every in [0u64, 3] {
                        for rate in [0u32, 1000] {
                            let mut spec = write_spec(backend, target.pid, target.vars[3]);
                            if signal {
                                spec.action = HitAction::Signal as i32;
                                spec.signal = SIGUSR1;
                            }
                            spec.condition = condition.clone();
                            spec.ignore_count = ignore;
                            spec.hit_count = every;
                            spec.max_hits_per_second = rate;
                            let what = format!(
                                "signal {signal}, condition {condition:?}, ignore {ignore}, \
                                 every {every}, rate {rate}"
                            );
                            let wp = rpc_ok(
                                &format!("SetWatchpoint({what})"),
                                client.set_watchpoint(SetWatchpointRequest { spec: Some(spec) }),
                            )
                            .await?
                            .watchpoint
                            .context("no watchpoint")?;
                            // The first store after the watchpoint is set: judged, then
                            // skipped by an ignore count of 2 or a hit count of 3 (which
                            // reports the 3rd, 6th, ...).
                            let (_, on_writer) = thread_write(&mut target, 3, 7).await?;
                            let expected = u64::from(signal && ignore == 0 && every <= 1);
                            ensure!(
                                on_writer == expected,
                                "{what}: the writer's handler ran {on_writer} times, not {expected}"
                            );
                            rpc_ok(
                                "RemoveWatchpoint",
                                client.remove_watchpoint(wpd_proto::v1::RemoveWatchpointRequest {
                                    id: wp.id,
                                }),
                            )
                            .await?;
                            // Back to a value the next `changed` sees change from.
                            target.cmd("write 3 0").await?;
                            n += 1;
                        }
                    }
                }
            }
        }
        ensure!(n == 48, "{n} combinations tried");
        target.ensure_alive()
    }
    .await;
    daemon.finish(result)
}

wpd_tests::both_backends!(
    /// A signal that cannot end a run at the hit is refused and sets nothing: SIGTRAP
    /// (debuggers own it), SIGKILL (no crash handler runs) and job control as bad requests;
    /// a signal the process ignores, or one a thread blocks (named), with SIGNAL_UNUSABLE.
    unusable_signals_are_refused
);
async fn unusable_signals_are_refused(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "2", "--interval-us", "1000000"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        ensure!(target.cmd("ignore-sig 12").await? == "IGNORED 12");
        ensure!(target.cmd("block-sig 10").await? == "BLOCKED 10");
        // Never usable: a bad request. Not usable in this process now: a precondition.
        let pid = target.pid.to_string();
        let cases: [(i32, Code, &[&str]); 5] = [
            (libc::SIGTRAP, Code::InvalidArgument, &["SIGTRAP"]),
            (libc::SIGKILL, Code::InvalidArgument, &["SIGKILL"]),
            (libc::SIGTSTP, Code::InvalidArgument, &["job control"]),
            (
                libc::SIGUSR2,
                Code::FailedPrecondition,
                &["ignores", "SIGUSR2"],
            ),
            (
                SIGUSR1,
                Code::FailedPrecondition,
                &["blocks", "SIGUSR1", &pid],
            ),
        ];
        for (sig, code, needles) in cases {
            let status = expect_status(
                &format!("SetWatchpoint with signal {sig}"),
                client
                    .set_watchpoint(signal_spec(backend, &target, 2, sig))
                    .await,
                code,
                needles,
            )?;
            if code == Code::FailedPrecondition {
                ensure!(
                    status_reason(&status).as_deref() == Some("SIGNAL_UNUSABLE"),
                    "signal {sig}: reason {:?}",
                    status_reason(&status)
                );
            }
        }
        let l = rpc_ok(
            "ListWatchpoints",
            client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
        )
        .await?;
        ensure!(
            l.watchpoints.is_empty(),
            "refusals left watchpoints: {:?}",
            l.watchpoints
        );
        target.ensure_alive()
    }
    .await;
    daemon.finish(result)
}

/// The `ErrorInfo` reason of a status, if it has one.
fn status_reason(status: &tonic::Status) -> Option<String> {
    use tonic_types::StatusExt;
    status
        .get_error_details()
        .error_info()
        .map(|i| i.reason.clone())
}

/// A program that starts blocking the action's signal after the watchpoint was set would
/// keep the signal pending instead of crashing at the hit: the daemon notices within
/// seconds and removes the watchpoint, saying why; the target runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_the_program_later_blocks_removes_the_watchpoint() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "2", "--interval-us", "1000000"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let mut events = EventStream::for_pid(&mut client, target.pid).await?;
        let wp = set_watchpoint(
            &mut client,
            signal_spec(Backend::Perf, &target, 2, SIGUSR1)
                .spec
                .context("no spec")?,
        )
        .await?
        .watchpoint
        .context("no watchpoint")?;
        ensure!(target.cmd("block-sig 10").await? == "BLOCKED 10");
        let reason = events
            .wait_for(Duration::from_secs(10), "the watchpoint's removal", |e| {
                Ok(match e {
                    Event::WatchpointRemoved(r) if r.watchpoint_id == wp.id => {
                        Some(r.reason.clone())
                    }
                    _ => None,
                })
            })
            .await?;
        ensure!(
            reason.contains("blocks SIGUSR1"),
            "removed for another reason: {reason:?}"
        );
        target.ensure_alive()
    }
    .await;
    daemon.finish(result)
}

wpd_tests::both_backends!(
    /// A crash carries who wrote last: the target dies of the action's SIGABRT at a store of
    /// 7, and `ProcessCrashed` names the signal, the storing thread and, for each of the
    /// process's watchpoints, its last hits in it (here the two stores another watchpoint
    /// reported just before).
    a_crash_carries_the_last_hits
);
async fn a_crash_carries_the_last_hits(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "2", "--interval-us", "1000000"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let pid = target.pid;
        let mut events = EventStream::for_pid(&mut client, pid).await?;
        let log = set_watchpoint(&mut client, write_spec(backend, pid, target.vars[3]))
            .await?
            .watchpoint
            .context("no watchpoint")?;
        let crash = rpc_ok(
            "SetWatchpoint",
            client.set_watchpoint(signal_spec(backend, &target, 2, libc::SIGABRT)),
        )
        .await?
        .watchpoint
        .context("no watchpoint")?;
        for v in [11u64, 12] {
            target.cmd(&format!("write 3 {v}")).await?;
            events
                .wait_for(HIT_TIMEOUT, &format!("the hit of the store of {v}"), |e| {
                    Ok(match e {
                        Event::Hit(h)
                            if h.watchpoint_id == log.id && h.value == v.to_le_bytes() =>
                        {
                            Some(())
                        }
                        _ => None,
                    })
                })
                .await?;
        }
        // The store of 7 ends the target: no answer comes.
        let _ = target.cmd_within("write 2 7", Duration::from_secs(2)).await;
        let crashed = events
            .wait_for(HIT_TIMEOUT, "ProcessCrashed", |e| {
                Ok(match e {
                    Event::ProcessCrashed(c) if c.pid == pid => Some(c.clone()),
                    _ => None,
                })
            })
            .await?;
        ensure!(
            crashed.signal == libc::SIGABRT && crashed.tid == pid && crashed.fatal,
            "not the main thread's death by SIGABRT: {crashed:?}"
        );
        let mut ids = crashed.watchpoint_ids.clone();
        ids.sort_unstable();
        ensure!(ids == vec![log.id, crash.id], "watchpoints {ids:?}");
        let logged: Vec<u64> = crashed
            .last_hits
            .iter()
            .filter(|h| h.watchpoint_id == log.id)
            .map(|h| u64::from_le_bytes(h.value.clone().try_into().unwrap_or_default()))
            .collect();
        ensure!(
            logged == vec![11, 12],
            "the crash's last hits of watchpoint {} are {logged:?}, not the stores 11 and 12",
            log.id
        );
        ensure!(
            crashed.last_hits.iter().all(|h| h.pid == pid),
            "hits of another process: {:?}",
            crashed.last_hits
        );
        use std::os::unix::process::ExitStatusExt;
        let status = target.wait_exit(Duration::from_secs(5)).await?;
        ensure!(
            status.signal() == Some(libc::SIGABRT),
            "the target ended with {status:?}, not by SIGABRT"
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}
