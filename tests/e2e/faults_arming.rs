//! Fault injection: targets killed, or shedding threads, while being armed (faults 1 and 2).
//!
//! Every test runs the real daemon against real targets it starts itself, bounds every wait,
//! relies on the harness guards to kill everything on any path, and ends by checking that the
//! targets survived (no SIGTRAP, `ping` answers) and that nothing leaked (`wpd_tests::leaks`).

use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use tokio::time::Instant;
use tonic::{Code, Status};
use wpd_proto::v1::{ListWatchpointsRequest, SetWatchpointResponse, SlotState, Watchpoint};
use wpd_tests::leaks::*;
use wpd_tests::{
    Backend, Client, Daemon, Event, EventStream, TargetProc, attach, both_backends,
    describe_status, hits_only, list_threads, poll_until, rpc_ok, status_line, write_spec,
};

/// How long the daemon may take to release everything after a detach or an exit.
const CLEAN_TIMEOUT: Duration = Duration::from_secs(10);
/// Timeout of every wait for hits.
const HIT_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// 1. The target is SIGKILLed while 1,000 threads are being armed
// ---------------------------------------------------------------------------------------------

/// Delays between starting the process-wide `SetWatchpoint` and the SIGKILL, one target each.
const KILL_DELAYS_MS: [u64; 3] = [5, 12, 20];

both_backends!(
    /// 1. A target with 1,000 threads is SIGKILLed 5–20 ms into a process-wide arm: the RPC
    /// succeeds or fails with NotFound (no such process / process exited), and afterwards the
    /// daemon holds nothing of it.
    target_killed_while_arming_1000_threads
);

async fn target_killed_while_arming_1000_threads(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let base = Baseline::take(&daemon, &mut client).await?;
            for delay in KILL_DELAYS_MS {
                // Workers store rarely: 1,000 threads on 2 CPUs must leave the daemon room.
                let mut target =
                    TargetProc::start(&["--threads", "1000", "--interval-us", "50000"]).await?;
                let pid = target.pid;
                kill_while_arming(&daemon, &mut client, &mut target, backend, delay)
                    .await
                    .with_context(|| format!("SIGKILL {delay} ms into the arm of pid {pid}"))?;
                ensure_clean(&daemon, &mut client, base, &[pid])
                    .await
                    .with_context(|| format!("after the SIGKILL {delay} ms into the arm"))?;
            }
            Ok(())
        }
        .await,
    )
}

async fn kill_while_arming(
    daemon: &Daemon,
    client: &mut Client,
    target: &mut TargetProc,
    backend: Backend,
    delay_ms: u64,
) -> Result<()> {
    let pid = target.pid;
    let attached = attach(client, pid, backend).await?;
    let threads = attached.process.map(|p| p.threads).unwrap_or(0);
    ensure!(
        threads == 1001,
        "attach tracked {threads} threads, expected 1001"
    );

    let setter = daemon.client().await?;
    let started = Instant::now();
    let set = spawn_set(setter, write_spec(backend, pid, target.vars[1]));
    tokio::time::sleep_until(started + Duration::from_millis(delay_ms)).await;
    // Timed before the call: with perf, a SIGKILL of 1,000 threads that hold breakpoints
    // keeps the CPUs busy in the kernel's exit path, and the call itself may return late.
    let killed_after = started.elapsed();
    target.signal(libc::SIGKILL)?;
    let outcome = set.await.context("the SetWatchpoint task panicked")??;
    let what = match &outcome {
        Ok(resp) => format!(
            "succeeded (armed on {} threads at return; arm pass {:?})",
            resp.watchpoint.as_ref().map_or(0, |w| w.armed_threads),
            Duration::from_nanos(resp.arm_duration_ns)
        ),
        Err(s)
            if s.code() == Code::NotFound
                && [
                    wpd_proto::reason::NO_SUCH_PROCESS,
                    wpd_proto::reason::PROCESS_EXITED,
                ]
                .contains(&reason(s).as_str()) =>
        {
            format!("refused: {}", status_line(s))
        }
        Err(s) => bail!(
            "SetWatchpoint failed with {} (reason {:?}); expected success or NotFound \
             (NO_SUCH_PROCESS / PROCESS_EXITED)",
            status_line(s),
            reason(s)
        ),
    };
    eprintln!(
        "{backend:?}: SIGKILL sent {killed_after:?} after SetWatchpoint started; it {what}; \
         returned after {:?}",
        started.elapsed()
    );
    let st = target.wait_exit(Duration::from_secs(10)).await?;
    ensure!(
        st.signal() == Some(libc::SIGKILL),
        "the target ended with {}, expected our SIGKILL",
        describe_status(&st)
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 2. Threads exit while being armed
// ---------------------------------------------------------------------------------------------

/// Delays between starting the arms and sending `stop-workers`, one target each.
const STOP_DELAYS_MS: [u64; 3] = [0, 2, 5];

both_backends!(
    /// 2. A target with 300 workers stops them all right as a process-wide and a thread-scoped
    /// `SetWatchpoint` start: each RPC succeeds or fails cleanly (NotFound, nothing listed),
    /// `ListThreads` ends up listing exactly the live thread, no slot stays PENDING, and a
    /// successful process-wide watchpoint still fires on the survivor.
    threads_exit_while_being_armed
);

async fn threads_exit_while_being_armed(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let base = Baseline::take(&daemon, &mut client).await?;
            for delay in STOP_DELAYS_MS {
                let mut target =
                    TargetProc::start(&["--threads", "300", "--interval-us", "20000"]).await?;
                let pid = target.pid;
                exits_while_arming(&daemon, &mut client, &mut target, backend, delay)
                    .await
                    .with_context(|| format!("stop-workers {delay} ms into the arms"))?;
                ensure_survived(&mut target).await?;
                detach(&mut client, pid).await?;
                ensure_clean(&daemon, &mut client, base, &[pid])
                    .await
                    .with_context(|| format!("after stop-workers {delay} ms into the arms"))?;
                ensure_survived(&mut target).await?;
            }
            Ok(())
        }
        .await,
    )
}

/// The watchpoint an arm that raced exiting threads produced: `Some` if it succeeded, `None`
/// if it failed cleanly (NotFound).
fn raced_outcome(
    what: &str,
    outcome: Result<SetWatchpointResponse, Status>,
) -> Result<Option<Watchpoint>> {
    match outcome {
        Ok(resp) => {
            Ok(Some(resp.watchpoint.ok_or_else(|| {
                anyhow!("{what}: response without watchpoint")
            })?))
        }
        Err(s) if s.code() == Code::NotFound => Ok(None),
        Err(s) => bail!(
            "{what} failed with {} (reason {:?}); expected success or NotFound",
            status_line(&s),
            reason(&s)
        ),
    }
}

async fn exits_while_arming(
    daemon: &Daemon,
    client: &mut Client,
    target: &mut TargetProc,
    backend: Backend,
    delay_ms: u64,
) -> Result<()> {
    let pid = target.pid;
    attach(client, pid, backend).await?;
    let mut events = EventStream::subscribe(client, hits_only(pid)).await?;
    // Nobody stores to VARS[1] or VARS[2]: no hits slow the arms down.
    let wide_spec = write_spec(backend, pid, target.vars[1]);
    let mut scoped_spec = write_spec(backend, pid, target.vars[2]);
    scoped_spec.tids = target.worker_tids()?.into_iter().step_by(6).collect();

    let (wide_client, scoped_client) = (daemon.client().await?, daemon.client().await?);
    let started = Instant::now();
    let wide = spawn_set(wide_client, wide_spec);
    let scoped = spawn_set(scoped_client, scoped_spec);
    tokio::time::sleep_until(started + Duration::from_millis(delay_ms)).await;
    target.send("stop-workers")?;
    let wide = raced_outcome(
        "process-wide SetWatchpoint",
        wide.await.context("task panicked")??,
    )?;
    let scoped = raced_outcome(
        "thread-scoped SetWatchpoint",
        scoped.await.context("task panicked")??,
    )?;
    eprintln!(
        "{backend:?}: stop-workers {delay_ms} ms in: process-wide {}, thread-scoped {}",
        if wide.is_some() { "set" } else { "refused" },
        if scoped.is_some() { "set" } else { "refused" },
    );
    // `ping` skips the late STOPPED line.
    let (_, threads) = target.ping().await?;
    ensure!(threads == 1, "the target still has {threads} threads");

    let live = target.tids()?;
    let list = poll_until(
        CLEAN_TIMEOUT,
        &format!("ListThreads to list exactly the live threads {live:?}"),
        async || {
            let list = list_threads(client, pid, false).await?;
            let tids: Vec<i32> = list.threads.iter().map(|t| t.tid).collect();
            Ok(if tids == live {
                Ok(list)
            } else {
                Err(format!(
                    "{} threads: {:?}",
                    tids.len(),
                    &tids[..tids.len().min(10)]
                ))
            })
        },
    )
    .await?;
    for t in &list.threads {
        for s in &t.slots {
            ensure!(
                s.state() == SlotState::Free
                    || (s.state() == SlotState::Ours
                        && wide.as_ref().is_some_and(|w| w.id == s.watchpoint_id)),
                "thread {}: slot {s:?} should be FREE or the process-wide watchpoint ({:?}): \
                 {t:?}",
                t.tid,
                wide.as_ref().map(|w| w.id)
            );
        }
        if let Some(w) = &wide {
            ensure!(
                t.slots.iter().any(|s| s.watchpoint_id == w.id),
                "the survivor {} lacks the process-wide watchpoint {}: {t:?}",
                t.tid,
                w.id
            );
        }
    }

    let listed = rpc_ok(
        "ListWatchpoints",
        client.list_watchpoints(ListWatchpointsRequest { pid }),
    )
    .await?
    .watchpoints;
    let expected: HashSet<u64> = wide.iter().chain(&scoped).map(|w| w.id).collect();
    let got: HashSet<u64> = listed.iter().map(|w| w.id).collect();
    ensure!(
        got == expected,
        "ListWatchpoints lists {got:?}, expected {expected:?} (a refused arm must leave nothing)"
    );
    for w in &listed {
        let want = if w.process_wide { 1 } else { 0 };
        ensure!(
            w.armed_threads == want,
            "watchpoint {} armed on {} threads after the workers exited, expected {want}",
            w.id,
            w.armed_threads
        );
    }

    if let Some(w) = &wide {
        target.write(1, 0x5EED).await?;
        events
            .wait_for(HIT_TIMEOUT, "the survivor's hit", |ev| {
                Ok(
                    matches!(ev, Event::Hit(h) if h.watchpoint_id == w.id && h.tid == pid)
                        .then_some(()),
                )
            })
            .await?;
    }
    for w in wide.iter().chain(&scoped) {
        remove(client, w.id).await?;
    }
    Ok(())
}
