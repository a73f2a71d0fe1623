//! End-to-end tests of what only the ptrace backend does: holding threads at a hit (STOP,
//! STOP_ALL) until Resume, only-on-change hits, living with job control and signals, leaving
//! the target clean when the daemon is stopped or killed, refusing a thread someone else
//! traces, and reusing the slots the kernel retains after a ptrace watchpoint is removed.

use std::collections::{HashMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use tonic::Code;
use wpd_proto::v1::{
    AttachRequest, Hit, HitAction, ListWatchpointsRequest, RemoveWatchpointRequest,
    SetWatchpointRequest, SlotState, ThreadState, Watchpoint,
};
use wpd_tests::{
    Backend, Client, Daemon, Event, EventStream, ForeignTracer, TargetProc, attach, check_hit,
    describe_status, expect_status, hit_value_u64, hits_only, list_threads, numbers_in, ours,
    poll_until, read_dr7, require_backend, resume, rpc, rpc_ok, set_watchpoint, thread_states,
    write_spec,
};

const PTRACE: Backend = Backend::Ptrace;

/// How long a reply may take before we conclude that the main thread is held.
const HELD_REPLY_TIMEOUT: Duration = Duration::from_millis(500);
/// Timeout of every wait for a thread state (held, job-stopped, running again).
const STATE_TIMEOUT: Duration = Duration::from_secs(10);
/// Timeout of every wait for hits.
const HIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a variable must keep its value to count as "stopped changing" (workers store it
/// every millisecond when they run).
const STILL_PERIOD: Duration = Duration::from_millis(300);

/// Sets a ptrace watchpoint on `VARS[var]` with `action`; returns it.
async fn set_ptrace(
    client: &mut Client,
    target: &TargetProc,
    var: usize,
    action: HitAction,
) -> Result<Watchpoint> {
    let mut spec = write_spec(PTRACE, target.pid, target.vars[var]);
    spec.action = action as i32;
    Ok(set_watchpoint(client, spec)
        .await?
        .watchpoint
        .unwrap_or_default())
}

/// Waits for the next hit of watchpoint `id`.
async fn next_hit_of(events: &mut EventStream, id: u64) -> Result<Hit> {
    events
        .wait_for(HIT_TIMEOUT, &format!("a hit of watchpoint {id}"), |ev| {
            Ok(match ev {
                Event::Hit(h) if h.watchpoint_id == id => Some(h.clone()),
                _ => None,
            })
        })
        .await
}

/// Fails unless `VARS[var]` keeps one value for [`STILL_PERIOD`]; returns it.
async fn ensure_still(target: &TargetProc, var: usize, why: &str) -> Result<u64> {
    let v0 = target.read_var(var)?;
    tokio::time::sleep(STILL_PERIOD).await;
    let v1 = target.read_var(var)?;
    ensure!(
        v0 == v1,
        "VARS[{var}] went from {v0} to {v1} in {STILL_PERIOD:?} although {why}"
    );
    Ok(v1)
}

/// The target's threads and their scheduler states, for a failure message
/// when the target stopped making progress ('t': in a tracing stop).
fn stuck_report(target: &TargetProc) -> String {
    match target.thread_run_states() {
        Ok(states) => format!("thread states (tid, /proc state): {states:?}"),
        Err(e) => format!("thread states unreadable: {e:#}"),
    }
}

/// Polls `VARS[var]` (read from outside) until it is above `than`.
async fn wait_var_above(target: &TargetProc, var: usize, than: u64, why: &str) -> Result<u64> {
    poll_until(
        Duration::from_secs(5),
        &format!("VARS[{var}] to move past {than} ({why})"),
        async || {
            let v = target.read_var(var)?;
            Ok(if v > than { Ok(v) } else { Err(format!("{v}")) })
        },
    )
    .await
}

/// Polls ListThreads until `ok(tid, state)` holds for every listed thread (and the list is not
/// empty); returns the states.
async fn wait_states(
    client: &mut Client,
    pid: i32,
    what: &str,
    ok: impl Fn(i32, ThreadState) -> bool,
) -> Result<Vec<(i32, ThreadState)>> {
    poll_until(STATE_TIMEOUT, what, async || {
        let states = thread_states(client, pid).await?;
        Ok(
            if !states.is_empty() && states.iter().all(|&(t, s)| ok(t, s)) {
                Ok(states)
            } else {
                Err(format!("{states:?}"))
            },
        )
    })
    .await
}

/// What happened to a target that should have survived, for error messages.
fn fate(target: &mut TargetProc) -> String {
    if target.is_alive() {
        return "still alive".into();
    }
    let st = target.exit_status();
    let mut s = st.map(|s| describe_status(&s)).unwrap_or_default();
    if st.and_then(|s| s.signal()) == Some(libc::SIGTRAP) {
        s.push_str(": a debug register was left armed without a tracer");
    }
    s
}

/// a. Action STOP: the main thread's store is reported with `stopped`, the thread is held
/// (STOPPED_AT_HIT; the target, whose main thread reads the commands, no longer answers) while
/// the others run, and Resume lets it go — by pid, then by tid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_holds_the_hitting_thread_until_resume() -> Result<()> {
    if !require_backend(PTRACE) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "2"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let pid = target.pid;
            let mut events = EventStream::subscribe(&mut client, hits_only(pid)).await?;
            let wp = set_ptrace(&mut client, &target, 1, HitAction::Stop).await?;
            ensure!(wp.backend() == PTRACE, "watchpoint {wp:?}");

            for (round, value, by_tid) in [(1, 5u64, false), (2, 6, true)] {
                // The main thread is held right after its store: its WROTE comes only later.
                target.send(&format!("write 1 {value}"))?;
                let hit = next_hit_of(&mut events, wp.id)
                    .await
                    .with_context(|| format!("round {round}"))?;
                check_hit(&hit, &wp, &HashSet::from([pid]))?;
                ensure!(
                    hit.stopped,
                    "a STOP hit must say the thread is held: {hit:?}"
                );
                ensure!(
                    hit_value_u64(&hit) == Some(value),
                    "hit value {:x?}, expected {value} (read while the thread is stopped)",
                    hit.value
                );

                wait_states(
                    &mut client,
                    pid,
                    "the main thread STOPPED_AT_HIT, the workers RUNNING",
                    |t, s| {
                        s == if t == pid {
                            ThreadState::StoppedAtHit
                        } else {
                            ThreadState::Running
                        }
                    },
                )
                .await
                .with_context(|| format!("round {round}"))?;
                let reply = target.cmd_within("ping", HELD_REPLY_TIMEOUT).await?;
                ensure!(
                    reply.is_none(),
                    "round {round}: the target answered {reply:?} while its main thread is held"
                );
                target.ensure_alive()?;

                let tids: &[i32] = if by_tid { &[pid] } else { &[] };
                let resumed = resume(&mut client, pid, tids).await?;
                ensure!(
                    resumed == [pid],
                    "round {round}: Resume(pid {pid}, tids {tids:?}) resumed {resumed:?}, \
                     expected exactly the held main thread"
                );
                // Skips the late WROTE and PONG, then answers this ping.
                target
                    .ping()
                    .await
                    .with_context(|| format!("round {round}: ping after Resume"))?;
                wait_states(&mut client, pid, "every thread RUNNING", |_, s| {
                    s == ThreadState::Running
                })
                .await?;
            }
            let again = resume(&mut client, pid, &[]).await?;
            ensure!(
                again.is_empty(),
                "nothing is held, yet Resume resumed {again:?}"
            );
            target.ensure_alive()
        }
        .await,
    )
}

/// b. Action STOP_ALL: after a worker's hit every thread is held (the hitter STOPPED_AT_HIT,
/// the rest STOPPED_AT_HIT or STOPPED_BY_PEER, all in a tracing stop in /proc), the counter
/// stops, and Resume starts it again. After the watchpoint is removed and a last Resume, the
/// target runs freely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_all_holds_every_thread_until_resume() -> Result<()> {
    if !require_backend(PTRACE) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "4"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let pid = target.pid;
            let all: HashSet<i32> = target.tids()?.into_iter().collect();
            let mut events = EventStream::subscribe(&mut client, hits_only(pid)).await?;
            let wp = set_ptrace(&mut client, &target, 0, HitAction::StopAll).await?;

            let hit = next_hit_of(&mut events, wp.id).await?;
            check_hit(&hit, &wp, &all)?;
            ensure!(
                hit.stopped,
                "a STOP_ALL hit must say the thread is held: {hit:?}"
            );
            ensure!(hit.tid != pid, "only workers store VARS[0]: {hit:?}");

            let states = wait_states(
                &mut client,
                pid,
                "every thread held (STOPPED_AT_HIT or STOPPED_BY_PEER)",
                |t, s| {
                    s == ThreadState::StoppedAtHit
                        || (t != hit.tid && s == ThreadState::StoppedByPeer)
                },
            )
            .await?;
            let listed: HashSet<i32> = states.iter().map(|&(t, _)| t).collect();
            ensure!(
                listed == all,
                "ListThreads lists {listed:?}, /proc has {all:?}"
            );
            let running: Vec<(i32, char)> = target
                .thread_run_states()?
                .into_iter()
                .filter(|&(_, st)| st != 't')
                .collect();
            ensure!(
                running.is_empty(),
                "threads not in a tracing stop ('t') in /proc although all are held: {running:?}"
            );
            let stopped_at = ensure_still(&target, 0, "every thread is held").await?;

            let resumed: HashSet<i32> = resume(&mut client, pid, &[]).await?.into_iter().collect();
            ensure!(
                resumed == all,
                "Resume resumed {resumed:?}, expected every thread {all:?}"
            );
            // The watchpoint is still armed: the next store holds everything again, but only
            // after it happened. A worker that stored just before the stop-all interrupt reached
            // it still has that hit to report (its trap is queued behind the interrupt stop):
            // right after Resume it reports it and holds everything again before anyone stores.
            // Such a re-hold leaves VARS[0] where it was; resume past it (once per worker at
            // most). A store after Resume may be smaller than the held value: the workers take
            // their numbers from one counter before storing them, and one that took its number
            // before the hold stores it after.
            let mut resumes = 1;
            poll_until(
                HIT_TIMEOUT,
                "VARS[0] to change from its held value after Resume",
                async || {
                    if target.read_var(0)? != stopped_at {
                        return Ok(Ok(()));
                    }
                    let states = thread_states(&mut client, pid).await?;
                    let all_held = states.len() == all.len()
                        && states.iter().all(|&(_, s)| {
                            s == ThreadState::StoppedAtHit || s == ThreadState::StoppedByPeer
                        });
                    if all_held && target.read_var(0)? == stopped_at {
                        ensure!(
                            resumes <= all.len(),
                            "held again {resumes} times without a store: {}",
                            stuck_report(&target)
                        );
                        resume(&mut client, pid, &[]).await?;
                        resumes += 1;
                    }
                    Ok(Err(format!("{states:?}; {}", stuck_report(&target))))
                },
            )
            .await?;

            let removed = rpc_ok(
                "RemoveWatchpoint while threads may be held",
                client.remove_watchpoint(RemoveWatchpointRequest { id: wp.id }),
            )
            .await?;
            ensure!(
                removed.watchpoint.is_some(),
                "RemoveWatchpoint: {removed:?}"
            );
            resume(&mut client, pid, &[]).await?;
            wait_states(&mut client, pid, "every thread RUNNING", |_, s| {
                s == ThreadState::Running
            })
            .await?;
            let (c, _) = target.ping().await?;
            target
                .wait_counter_above(c, Duration::from_secs(5))
                .await
                .with_context(|| stuck_report(&target))?;
            target.ensure_alive()
        }
        .await,
    )
}

/// c. only_on_change: storing 7, 7 again, then 8 gives exactly two hits, (old, new) = (0, 7)
/// and (7, 8); the repeated 7 is not reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_on_change_reports_changes_with_old_values() -> Result<()> {
    if !require_backend(PTRACE) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "2"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let pid = target.pid;
            let mut events = EventStream::subscribe(&mut client, hits_only(pid)).await?;
            let mut spec = write_spec(PTRACE, pid, target.vars[2]);
            spec.only_on_change = true;
            let wp = set_watchpoint(&mut client, spec)
                .await?
                .watchpoint
                .unwrap_or_default();
            ensure!(
                wp.spec.as_ref().is_some_and(|s| s.only_on_change),
                "the watchpoint does not echo only_on_change: {wp:?}"
            );

            for v in [7, 7, 8] {
                target.write(2, v).await?;
            }
            let mut hits = events.collect_hits(2, HIT_TIMEOUT).await?;
            for ev in events.drain_for(Duration::from_millis(500)).await? {
                if let Event::Hit(h) = ev {
                    hits.push(h);
                }
            }
            let seen: Vec<(Option<u64>, Option<u64>)> = hits
                .iter()
                .map(|h| {
                    let old = <[u8; 8]>::try_from(h.old_value.as_slice())
                        .ok()
                        .map(u64::from_le_bytes);
                    (old, hit_value_u64(h))
                })
                .collect();
            ensure!(
                seen == [(Some(0), Some(7)), (Some(7), Some(8))],
                "expected exactly two hits (old, new) = (0, 7), (7, 8); got {seen:?}: {hits:?}"
            );
            for h in &hits {
                check_hit(h, &wp, &HashSet::from([pid]))?;
                ensure!(!h.stopped, "a LOG hit must not hold the thread: {h:?}");
            }
            target.ensure_alive()
        }
        .await,
    )
}

/// d. Job control on a traced target: SIGSTOP stops every thread (stopped in /proc,
/// JOB_STOPPED in ListThreads) and the counter; SIGCONT starts them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_and_sigcont_work_on_a_traced_target() -> Result<()> {
    if !require_backend(PTRACE) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "4"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let pid = target.pid;
            // Watch the counter itself: hits (ptrace stops) race with the job-control stop.
            let wp = set_ptrace(&mut client, &target, 0, HitAction::Log).await?;
            let (c0, _) = target.ping().await?;
            target
                .wait_counter_above(c0, Duration::from_secs(5))
                .await?;

            target.signal(libc::SIGSTOP)?;
            poll_until(STATE_TIMEOUT, "every thread stopped in /proc", async || {
                let states = target.thread_run_states()?;
                Ok(
                    if !states.is_empty() && states.iter().all(|&(_, s)| s == 'T' || s == 't') {
                        Ok(())
                    } else {
                        Err(format!("(tid, state) {states:?}"))
                    },
                )
            })
            .await?;
            wait_states(&mut client, pid, "every thread JOB_STOPPED", |_, s| {
                s == ThreadState::JobStopped
            })
            .await?;
            let stopped_at = ensure_still(&target, 0, "the process got SIGSTOP").await?;
            target.ensure_alive()?;

            target.signal(libc::SIGCONT)?;
            wait_var_above(&target, 0, stopped_at, "after SIGCONT").await?;
            target.ping().await.context("ping after SIGCONT")?;
            wait_states(
                &mut client,
                pid,
                "every thread RUNNING after SIGCONT",
                |_, s| s == ThreadState::Running,
            )
            .await?;
            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid }),
            )
            .await?;
            ensure!(
                list.watchpoints.iter().any(|w| w.id == wp.id && w.hits > 0),
                "the watchpoint should still be there, with hits: {list:?}"
            );
            target.ensure_alive()
        }
        .await,
    )
}

/// e. Signals pass through the tracer unchanged: three SIGUSR1 sent to a traced target whose
/// workers keep hitting run its handler exactly three times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handled_signals_reach_the_target() -> Result<()> {
    if !require_backend(PTRACE) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "4"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            set_ptrace(&mut client, &target, 0, HitAction::Log).await?;
            ensure!(
                target.usr1_count().await? == 0,
                "SIGUSR1 counted before any was sent"
            );
            // One at a time: two SIGUSR1 pending together merge into one (standard signals).
            for n in 1..=3u64 {
                target.signal(libc::SIGUSR1)?;
                poll_until(
                    Duration::from_secs(5),
                    &format!("the handler to count SIGUSR1 #{n}"),
                    async || {
                        let count = target.usr1_count().await?;
                        ensure!(count <= n, "{count} deliveries counted after {n} SIGUSR1");
                        Ok(if count == n {
                            Ok(())
                        } else {
                            Err(format!("USR1 {count}"))
                        })
                    },
                )
                .await?;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            let count = target.usr1_count().await?;
            ensure!(count == 3, "3 SIGUSR1 sent, the handler ran {count} times");
            target.ensure_alive()
        }
        .await,
    )
}

/// f. SIGTERM with ptrace watchpoints firing on spinning threads: the daemon exits 0, no thread
/// stays traced, and the target survives a second more of stores (no stray SIGTRAP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_spinning_threads_leaves_the_target_clean() -> Result<()> {
    if !require_backend(PTRACE) {
        return Ok(());
    }
    let mut daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "4", "--spin"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let pid = target.pid;
        let wp = set_ptrace(&mut client, &target, 0, HitAction::Log).await?;
        set_ptrace(&mut client, &target, 2, HitAction::Log).await?;
        poll_until(Duration::from_secs(10), "hits on VARS[0]", async || {
            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid }),
            )
            .await?;
            let hits = list
                .watchpoints
                .iter()
                .find(|w| w.id == wp.id)
                .map(|w| w.hits);
            Ok(if hits.unwrap_or(0) > 100 {
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
        target.wait_untraced(Duration::from_secs(5)).await?;

        let survived = async {
            let (c0, _) = target.ping().await?;
            target.write(2, 7).await?; // the main thread's store to the formerly watched VARS[2]
            tokio::time::sleep(Duration::from_secs(1)).await;
            target.ensure_alive()?;
            target
                .wait_counter_above(c0, Duration::from_secs(10))
                .await?;
            target.wait_untraced(Duration::from_secs(1)).await?;
            target.ensure_alive()
        }
        .await;
        survived.with_context(|| format!("the target after wpd's exit: {}", fate(&mut target)))
    }
    .await;
    daemon.finish(result)
}

/// g. A SIGKILLed daemon cannot clean up: the kernel detaches every thread but the debug
/// registers stay armed. A new daemon given the same state file clears them before serving,
/// so the target's next store to the watched variable does not kill it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_daemon_clears_registers_a_killed_one_left() -> Result<()> {
    if !require_backend(PTRACE) {
        return Ok(());
    }
    // Debug-register stops (where bpf() is refused, or asked for): the
    // registers outlive a killed daemon, and its successor clears them.
    let mut first = Daemon::start_with_args(&["--ptrace-stops", "debug-registers"]).await?;
    let mut target = TargetProc::start(&["--threads", "4"]).await?;
    let mut second: Option<Daemon> = None;
    let result = async {
        let mut client = first.client().await?;
        let pid = target.pid;
        let mut events = EventStream::subscribe(&mut client, hits_only(pid)).await?;
        // VARS[3]: workers never store there; only `write 3 ...` does.
        let wp = set_ptrace(&mut client, &target, 3, HitAction::Log).await?;
        ensure!(
            wp.armed_threads == 5,
            "armed on {} of 5 threads",
            wp.armed_threads
        );
        // Proof that the registers are live: the main thread's store is caught.
        target.write(3, 0x51).await?;
        let hit = next_hit_of(&mut events, wp.id).await?;
        ensure!(
            hit.tid == pid && hit_value_u64(&hit) == Some(0x51),
            "hit {hit:?}"
        );
        // A thread born after the watchpoint was set: armed at its first stop, and never
        // named in the state file, which lists processes, not threads.
        let newborn = target.spawn_worker().await?;
        let listed = rpc_ok(
            "ListWatchpoints",
            client.list_watchpoints(ListWatchpointsRequest { pid }),
        )
        .await?;
        let armed = listed
            .watchpoints
            .iter()
            .find(|w| w.id == wp.id)
            .map(|w| w.armed_threads);
        ensure!(
            armed == Some(6),
            "armed on {armed:?} threads after a sixth was born"
        );
        drop(events);
        drop(client);

        let state = std::fs::read_to_string(first.state_file()).with_context(|| {
            format!(
                "the daemon should keep its ptrace-armed threads in {}",
                first.state_file().display()
            )
        })?;
        ensure!(
            numbers_in(&state).contains(&(pid as i64)),
            "the state file does not mention pid {pid}: {state:?}"
        );

        let status = first.kill().await?;
        ensure!(
            status.signal() == Some(libc::SIGKILL),
            "wpd: {}",
            describe_status(&status)
        );
        target.wait_untraced(Duration::from_secs(5)).await?;
        // Nothing stores VARS[3] until the new daemon has started.
        target
            .ping()
            .await
            .context("ping between the kill and the restart")?;
        let left = read_dr7(newborn)?;
        ensure!(
            left != 0,
            "the killed daemon should have left DR7 armed on thread {newborn}, found 0"
        );

        let daemon = second.insert(Daemon::start_with_state_file(first.state_file()).await?);
        daemon.client().await?; // it answers
        for tid in target.tids()? {
            let dr7 = read_dr7(tid)?;
            ensure!(
                dr7 == 0,
                "after the restart thread {tid} still has DR7 {dr7:#x} (the newborn is {newborn})"
            );
        }
        let survived = async {
            target.write(3, 1).await?;
            let (c0, _) = target.ping().await?;
            target
                .wait_counter_above(c0, Duration::from_secs(5))
                .await?;
            target.wait_untraced(Duration::from_secs(5)).await?;
            target.ensure_alive()
        }
        .await;
        survived.with_context(|| {
            format!(
                "the target's store to VARS[3] after the restart: {}",
                fate(&mut target)
            )
        })
    }
    .await;
    if result.is_err() {
        first.print_log("the first daemon (SIGKILLed)");
    }
    match &second {
        Some(d) => d.finish(result),
        None => result,
    }
}

/// h. A process one of whose threads another tracer (this test) holds is refused with
/// FAILED_PRECONDITION naming the tracer, and nothing stays attached. Once the other tracer
/// has let go, the same Attach works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_traced_by_another_is_refused() -> Result<()> {
    if !require_backend(PTRACE) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "4"]).await?;
    let me = std::process::id() as i32;
    let victim = target.worker_tids()?[1];
    // Declared after the target: dropped (detached) before the target is killed.
    let tracer = ForeignTracer::seize(victim)?;
    let result = daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let pid = target.pid;
            let theirs = tracer.tracer_tid;
            let traced: Vec<(i32, i32)> = target.thread_tracer_pids()?;
            ensure!(
                traced
                    .iter()
                    .all(|&(t, p)| p == if t == victim { theirs } else { 0 }),
                "before Attach: (tid, TracerPid) {traced:?}, expected only {victim} traced by \
                 {theirs} (a thread of this process, {me})"
            );

            let r = rpc(client.attach(AttachRequest {
                pid,
                backend: PTRACE as i32,
                ..Default::default()
            }))
            .await?;
            let st = expect_status(
                "Attach(ptrace) with a thread traced by the test",
                r,
                Code::FailedPrecondition,
                &[],
            )?;
            // The process to look for (a debugger's pid), not only its tracing thread. Checked
            // last, so that a bad message does not hide whether the rest holds.
            let mut message_problem = None;
            if !numbers_in(st.message()).contains(&(me as i64)) {
                message_problem = Some(format!(
                    "the message {:?} does not name the tracer's process {me} (its tracing \
                     thread is {theirs})",
                    st.message()
                ));
            }
            let r = rpc(client.set_watchpoint(SetWatchpointRequest {
                spec: Some(write_spec(PTRACE, pid, target.vars[2])),
            }))
            .await?;
            expect_status(
                "SetWatchpoint(ptrace), which attaches",
                r,
                Code::FailedPrecondition,
                &[],
            )?;

            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(
                list.watchpoints.is_empty() && list.processes.is_empty(),
                "nothing should stay attached: {list:?}"
            );
            poll_until(
                Duration::from_secs(5),
                "every other thread untraced, the victim still ours",
                async || {
                    let traced = target.thread_tracer_pids()?;
                    Ok(
                        if traced
                            .iter()
                            .all(|&(t, p)| p == if t == victim { theirs } else { 0 })
                        {
                            Ok(())
                        } else {
                            Err(format!("(tid, TracerPid) {traced:?}"))
                        },
                    )
                },
            )
            .await?;
            let (c0, _) = target.ping().await?;
            target
                .wait_counter_above(c0, Duration::from_secs(5))
                .await?;
            target.ensure_alive()?;
            Ok((client, message_problem))
        }
        .await,
    );
    let (mut client, message_problem) = result?;
    tracer.release()?;
    target.wait_untraced(Duration::from_secs(5)).await?;
    // Control: the refusal was about the other tracer.
    daemon.finish(attach(&mut client, target.pid, PTRACE).await.map(drop))?;
    target.ensure_alive()?;
    match message_problem {
        Some(problem) => daemon.finish(Err(anyhow!(
            "{problem} (everything else held: nothing stayed attached, and Attach works once \
             the other tracer let go)"
        ))),
        None => Ok(()),
    }
}

/// i. After a ptrace watchpoint is removed, the kernel keeps its slot reserved: ListThreads
/// shows RETAINED there; the next ptrace watchpoint reuses that very slot (OURS again, same
/// index) and watches its own address, not the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_slot_is_shown_and_reused() -> Result<()> {
    if !require_backend(PTRACE) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "2"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let pid = target.pid;
            let mut events = EventStream::subscribe(&mut client, hits_only(pid)).await?;
            let first = set_ptrace(&mut client, &target, 2, HitAction::Log).await?;
            let mut slot_of = HashMap::new();
            for t in &list_threads(&mut client, pid, false).await?.threads {
                let held: Vec<_> = t
                    .slots
                    .iter()
                    .filter(|s| s.state() == SlotState::Ours && s.watchpoint_id == first.id)
                    .collect();
                ensure!(
                    held.len() == 1,
                    "thread {} should hold {} once: {t:?}",
                    t.tid,
                    first.id
                );
                slot_of.insert(t.tid, held[0].index);
            }

            rpc_ok(
                "RemoveWatchpoint",
                client.remove_watchpoint(RemoveWatchpointRequest { id: first.id }),
            )
            .await?;
            for t in &list_threads(&mut client, pid, false).await?.threads {
                let index = *slot_of
                    .get(&t.tid)
                    .ok_or_else(|| anyhow!("new thread {} listed", t.tid))?;
                let slot = t.slots.iter().find(|s| s.index == index);
                ensure!(
                    slot.is_some_and(|s| s.state() == SlotState::Retained),
                    "thread {}: slot {index} should be RETAINED after the removal: {t:?}",
                    t.tid
                );
                ensure!(ours(t).is_empty(), "thread {}: OURS left: {t:?}", t.tid);
            }

            let second = set_ptrace(&mut client, &target, 3, HitAction::Log).await?;
            for t in &list_threads(&mut client, pid, false).await?.threads {
                let index = slot_of[&t.tid];
                let slot = t.slots.iter().find(|s| s.index == index);
                ensure!(
                    slot.is_some_and(
                        |s| s.state() == SlotState::Ours && s.watchpoint_id == second.id
                    ),
                    "thread {}: slot {index} should hold watchpoint {} again: {t:?}",
                    t.tid,
                    second.id
                );
                ensure!(ours(t) == [second.id], "thread {}: {t:?}", t.tid);
                ensure!(
                    t.slots.iter().all(|s| s.state() != SlotState::Retained),
                    "thread {}: a RETAINED slot is left although it was reused: {t:?}",
                    t.tid
                );
            }

            // The reused slot watches VARS[3] now, and VARS[2] no longer.
            target.write(2, 5).await?;
            target.write(3, 9).await?;
            let hits = events.collect_hits(1, HIT_TIMEOUT).await?;
            check_hit(&hits[0], &second, &HashSet::from([pid]))?;
            ensure!(hit_value_u64(&hits[0]) == Some(9), "hit {:?}", hits[0]);
            for ev in events.drain_for(Duration::from_millis(300)).await? {
                if let Event::Hit(h) = ev {
                    bail!("unexpected hit: {h:?}");
                }
            }
            target.ensure_alive()
        }
        .await,
    )
}

/// The signal a process's signal stops use, from the listing ("signal SIGURG").
async fn stop_signal(client: &mut Client, pid: i32) -> Result<i32> {
    let list = rpc_ok(
        "ListWatchpoints",
        client.list_watchpoints(ListWatchpointsRequest { pid }),
    )
    .await?;
    let stops = list
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .map(|p| p.stops.clone())
        .context("process not listed")?;
    Ok(match stops.as_str() {
        "signal SIGURG" => libc::SIGURG,
        "signal SIGWINCH" => libc::SIGWINCH,
        other => bail!("not signal stops: {other:?}"),
    })
}

/// The signal of signal stops was chosen at attach as one the program neither catches nor
/// blocks. A program that later installs a handler for it, or blocks it in a thread, would
/// have its own signals swallowed or its hits lost without a word: the daemon notices within
/// seconds and ends the attachment with `ProcessLost` saying why; the target runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_signal_the_program_later_catches_or_blocks_is_reported() -> Result<()> {
    if !require_backend(PTRACE) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            for (cmd, said) in [("catch-sig", "handler"), ("block-sig", "blocks")] {
                let mut target = TargetProc::start(&["--threads", "2"]).await?;
                let pid = target.pid;
                let mut events = EventStream::for_pid(&mut client, pid).await?;
                set_ptrace(&mut client, &target, 0, HitAction::Log).await?;
                let sig = stop_signal(&mut client, pid).await?;
                let answer = target.cmd(&format!("{cmd} {sig}")).await?;
                ensure!(answer.ends_with(&sig.to_string()), "{cmd}: {answer}");
                let lost = events
                    .wait_for(Duration::from_secs(10), "ProcessLost", |ev| {
                        Ok(match ev {
                            Event::ProcessLost(l) if l.pid == pid => Some(l.clone()),
                            _ => None,
                        })
                    })
                    .await?;
                ensure!(
                    lost.reason.contains(said) && lost.reason.contains("another signal"),
                    "{cmd}: {lost:?}"
                );
                target.ensure_alive()?;
            }
            Ok(())
        }
        .await,
    )
}
