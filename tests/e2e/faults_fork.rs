//! Fault injection: a fork under watch (fault 3).
//!
//! Every test runs the real daemon against real targets it starts itself, bounds every wait,
//! relies on the harness guards to kill everything on any path, and ends by checking that the
//! targets survived (no SIGTRAP, `ping` answers) and that nothing leaked (`wpd_tests::leaks`).

use std::time::Duration;

use anyhow::{Result, anyhow, bail, ensure};
use tokio::time::Instant;
use wpd_proto::v1::{ListWatchpointsRequest, StreamEventsRequest};
use wpd_tests::leaks::*;
use wpd_tests::{
    Backend, Daemon, Event, EventStream, TargetProc, both_backends, list_threads, rpc_ok,
    set_watchpoint, write_spec,
};

/// Timeout of every wait for hits.
const HIT_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// 3. fork while watched
// ---------------------------------------------------------------------------------------------

both_backends!(
    /// 3. The watched target forks a child that stores to the watched variable: the child is
    /// left alone (exits 0, not SIGTRAP), no hit carries its pid and it is never listed.
    fork_child_is_left_alone
);

async fn fork_child_is_left_alone(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "2", "--interval-us", "5000"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let base = Baseline::take(&daemon, &mut client).await?;
            let pid = target.pid;
            // Every process's events: a hit in the child would show here.
            let mut events = EventStream::subscribe(
                &mut client,
                StreamEventsRequest {
                    pid: 0,
                    watchpoint_ids: vec![],
                    hits_only: false,
                    raw: false,
                    lease: false,
                    ..Default::default()
                },
            )
            .await?;
            let wp = set_watchpoint(&mut client, write_spec(backend, pid, target.vars[0]))
                .await?
                .watchpoint
                .unwrap_or_default();
            events.collect_hits(3, HIT_TIMEOUT).await?;

            let reply = target.cmd("fork").await?;
            let child: i32 = reply
                .strip_prefix("FORKED pid=")
                .and_then(|p| p.trim().parse().ok())
                .ok_or_else(|| anyhow!("expected `FORKED pid=<child>`, got {reply:?}"))?;
            // The child stores for ~100 ms: look for it meanwhile.
            let watch_until = Instant::now() + Duration::from_millis(300);
            while Instant::now() < watch_until {
                let threads = list_threads(&mut client, pid, false).await?;
                ensure!(
                    threads.threads.iter().all(|t| t.tid != child),
                    "the child {child} is listed as a thread of {pid}"
                );
                let list = rpc_ok(
                    "ListWatchpoints",
                    client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
                )
                .await?;
                ensure!(
                    list.processes.iter().all(|p| p.pid != child),
                    "the child {child} is listed as attached: {:?}",
                    list.processes
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let reply = target.cmd(&format!("wait-child {child}")).await?;
            ensure!(
                reply == format!("CHILD pid={child} code=0"),
                "the child should exit 0 after its stores, but: {reply:?} (signal 5 is SIGTRAP)"
            );

            let mut parent_hits = 0;
            for ev in events.drain_for(Duration::from_millis(300)).await? {
                match &ev {
                    Event::Hit(h) if h.pid == child || h.tid == child => {
                        bail!("a hit in the child: {h:?}")
                    }
                    Event::Hit(h) if h.watchpoint_id == wp.id => parent_hits += 1,
                    Event::ThreadStarted(t) if t.tid == child || t.pid == child => {
                        bail!("the child reported as a thread: {t:?}")
                    }
                    Event::ProcessExited(p) if p.pid == child => {
                        bail!("the child reported as a watched process: {p:?}")
                    }
                    _ => {}
                }
            }
            ensure!(
                events.dropped == 0,
                "{} events were dropped: cannot tell whether the child hit",
                events.dropped
            );
            ensure!(
                parent_hits > 0,
                "no hit of the parent's workers after the fork ({})",
                events.summary()
            );
            let listed = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid }),
            )
            .await?
            .watchpoints;
            ensure!(
                listed.len() == 1 && listed[0].armed_threads == 3,
                "the parent's watchpoint should stay armed on its 3 threads: {listed:?}"
            );
            ensure_survived(&mut target).await?;
            drop(events);
            remove(&mut client, wp.id).await?;
            detach(&mut client, pid).await?;
            ensure_clean(&daemon, &mut client, base, &[pid, child]).await?;
            ensure_survived(&mut target).await
        }
        .await,
    )
}
