//! Watchpoints on threads by name (`thread_name`): only the threads whose name matches are
//! armed and spend a slot; threads that take a matching name later (a pool naming its
//! threads once they started, as pools do) join, threads renamed to another name leave.
//! The target is the tests' C program with named pools (`pool`, `pool-rename`).

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use tokio::time::Instant;
use tonic::Code;
use wpd_proto::v1::{
    ListThreadsRequest, ListWatchpointsRequest, SetWatchpointRequest, WatchpointSpec,
};
use wpd_tests::{
    Backend, CTarget, Daemon, Event, EventStream, expect_status, poll_until, require_backend,
    rpc_ok, set_watchpoint,
};

const TIMEOUT: Duration = Duration::from_secs(10);

fn pool_tids(reply: &str) -> Result<Vec<i32>> {
    let tids = reply
        .split_whitespace()
        .find_map(|w| w.strip_prefix("tids="))
        .with_context(|| format!("no tids in {reply:?}"))?;
    tids.split(',')
        .filter(|t| !t.is_empty())
        .map(|t| t.parse().with_context(|| format!("tid {t:?}")))
        .collect()
}

fn by_name(pid: i32, pattern: &str) -> WatchpointSpec {
    WatchpointSpec {
        pid,
        symbol: "counter".into(),
        access: wpd_proto::v1::Access::Write as i32,
        backend: Backend::Perf as i32,
        thread_name: pattern.into(),
        ..Default::default()
    }
}

/// The threads that hit watchpoint `wp` during `window`, with the names the hits gave.
async fn hitters(
    events: &mut EventStream,
    wp: u64,
    window: Duration,
) -> Result<Vec<(i32, String)>> {
    let deadline = Instant::now() + window;
    let mut v = Vec::new();
    while let Some(e) = events.next_before(deadline).await? {
        if let Event::Hit(h) = e
            && h.watchpoint_id == wp
        {
            v.push((h.tid, h.thread_name.clone()));
        }
    }
    Ok(v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_by_name_join_and_leave_as_they_are_renamed() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut target = CTarget::start("ct-pie").await?;
    let result = async {
        let mut client = daemon.client().await?;
        let pid = target.pid;
        let first = pool_tids(&target.cmd("pool pool 3").await?)?;
        ensure!(first.len() == 3, "pool of {first:?}");
        let mut events = EventStream::subscribe(&mut client, Default::default()).await?;
        let wp = set_watchpoint(&mut client, by_name(pid, "pool-*"))
            .await?
            .watchpoint
            .unwrap_or_default();
        ensure!(
            wp.armed_threads == 3 && !wp.process_wide,
            "armed on {} threads (process-wide {}), expected the 3 pool threads",
            wp.armed_threads,
            wp.process_wide
        );
        ensure!(
            wp.spec.as_ref().is_some_and(|s| s.thread_name == "pool-*"),
            "the watchpoint does not say its pattern: {wp:?}"
        );
        // The main thread (named after the program) stores too: never a hit, and it spends no
        // slot.
        target.cmd("set counter 77").await?;
        // Until each pool thread hit (they store every 2 ms, but a loaded machine may keep
        // one off the CPUs for a while).
        let mut seen = Vec::new();
        let mut missing: HashSet<i32> = first.iter().copied().collect();
        let deadline = Instant::now() + TIMEOUT;
        while !missing.is_empty() && Instant::now() < deadline {
            for h in hitters(&mut events, wp.id, Duration::from_millis(100)).await? {
                missing.remove(&h.0);
                seen.push(h);
            }
        }
        let tids: HashSet<i32> = seen.iter().map(|s| s.0).collect();
        ensure!(
            tids == first.iter().copied().collect(),
            "hits came from {tids:?}, expected exactly the pool threads {first:?}"
        );
        ensure!(
            seen.iter().all(|(_, n)| n.starts_with("pool-")),
            "hits name threads {:?}",
            seen.iter().map(|s| &s.1).collect::<HashSet<_>>()
        );
        let main = rpc_ok(
            "ListThreads",
            client.list_threads(ListThreadsRequest {
                pid,
                tids: vec![pid],
                probe: false,
            }),
        )
        .await?;
        ensure!(
            main.threads
                .iter()
                .flat_map(|t| t.slots.iter())
                .all(|s| s.watchpoint_id != wp.id),
            "the main thread holds a slot of the watchpoint: {main:?}"
        );

        // Threads created later start with their creator's name and take a pool name once
        // running: they join then.
        let later = pool_tids(&target.cmd("pool pool 2").await?)?;
        let mut missing: HashSet<i32> = later.iter().copied().collect();
        let deadline = Instant::now() + TIMEOUT;
        while !missing.is_empty() {
            ensure!(
                Instant::now() < deadline,
                "renamed pool threads {missing:?} never hit"
            );
            for (tid, _) in hitters(&mut events, wp.id, Duration::from_millis(100)).await? {
                missing.remove(&tid);
            }
        }

        // Renamed out of the pattern: they leave (and give their slots back).
        let renamed = pool_tids(&target.cmd("pool-rename other").await?)?;
        ensure!(renamed.len() == 5, "renamed {renamed:?}");
        let mut c = client.clone();
        poll_until(TIMEOUT, "every renamed thread disarmed", async || {
            let l = rpc_ok(
                "ListWatchpoints",
                c.list_watchpoints(ListWatchpointsRequest { pid }),
            )
            .await?;
            let armed = l
                .watchpoints
                .iter()
                .find(|w| w.id == wp.id)
                .map(|w| w.armed_threads);
            Ok(if armed == Some(0) {
                Ok(())
            } else {
                Err(format!("armed on {armed:?}"))
            })
        })
        .await?;
        // Hits made before the disarm may still be on their way.
        hitters(&mut events, wp.id, Duration::from_millis(100)).await?;
        let after = hitters(&mut events, wp.id, Duration::from_millis(300)).await?;
        ensure!(
            after.is_empty(),
            "hits after every thread left the pattern: {after:?}"
        );
        ensure!(target.try_status()?.is_none(), "the target died");
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// A pattern with listed threads, a bad pattern, and the ptrace backend are refused; nothing
/// changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_thread_name_watchpoints_are_refused() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let target = CTarget::start("ct-pie").await?;
    let result = async {
        let mut client = daemon.client().await?;
        let pid = target.pid;
        let cases = [
            (
                WatchpointSpec {
                    tids: vec![pid],
                    ..by_name(pid, "pool-*")
                },
                "not both",
            ),
            (by_name(pid, "pool-[x"), "thread_name"),
            (
                WatchpointSpec {
                    backend: Backend::Ptrace as i32,
                    ..by_name(pid, "pool-*")
                },
                "threads by name",
            ),
            (
                WatchpointSpec {
                    follow_forks: true,
                    ..by_name(pid, "pool-*")
                },
                "process-wide",
            ),
        ];
        for (spec, want) in cases {
            let r = client
                .set_watchpoint(SetWatchpointRequest {
                    spec: Some(spec.clone()),
                })
                .await;
            expect_status(&format!("{spec:?}"), r, Code::InvalidArgument, &[want])?;
        }
        let l = rpc_ok(
            "ListWatchpoints",
            client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
        )
        .await?;
        ensure!(
            l.watchpoints.is_empty() && l.processes.is_empty(),
            "refusals left {l:?}"
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}
