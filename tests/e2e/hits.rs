//! End-to-end tests of hit delivery: hits from many threads, a new thread's very first store,
//! thread-scoped watchpoints, and silence after a watchpoint is removed.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use tonic::Code;
use wpd_proto::v1::{RemoveWatchpointRequest, SlotState, StreamEventsRequest, Watchpoint};
use wpd_tests::{
    Backend, Daemon, Event, EventStream, SPAWN_MARK, Sysctl, TargetProc, both_backends, check_hit,
    count_slots, expect_status, hit_value_u64, hits_only, list_threads, ours, poll_until, rpc,
    rpc_ok, set_watchpoint, snapshot, write_spec,
};

both_backends!(hits_come_from_many_distinct_threads);

/// a. A process-wide watchpoint on a variable 32 threads store to reports hits from at least
/// 20 distinct threads, each hit well-formed.
async fn hits_come_from_many_distinct_threads(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let target = TargetProc::start(&["--threads", "32"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let tids: HashSet<i32> = target.tids()?.into_iter().collect();
            let mut events = EventStream::subscribe(&mut client, hits_only(target.pid)).await?;

            let resp = set_watchpoint(&mut client, write_spec(backend, target.pid, target.vars[0]))
                .await?;
            let wp = resp.watchpoint.unwrap_or_default();
            ensure!(
                wp.process_wide,
                "empty tids must give a process-wide watchpoint: {wp:?}"
            );
            ensure!(
                wp.armed_threads as usize == tids.len(),
                "armed_threads = {}, but the target has {} threads",
                wp.armed_threads,
                tids.len()
            );
            ensure!(resp.arm_duration_ns > 0, "arm_duration_ns is 0");

            let mut seen = HashSet::new();
            let mut n = 0u64;
            events
                .wait_for(
                    Duration::from_secs(20),
                    "hits from 20 distinct threads",
                    |ev| {
                        if let Event::Hit(hit) = ev {
                            check_hit(hit, &wp, &tids)?;
                            n += 1;
                            seen.insert(hit.tid);
                        }
                        Ok((seen.len() >= 20).then_some(()))
                    },
                )
                .await?;
            ensure!(
                !seen.contains(&target.pid),
                "the main thread never stores VARS[0]"
            );
            eprintln!("{n} hits from {} distinct threads", seen.len());
            Ok(())
        }
        .await,
    )
}

both_backends!(new_threads_first_store_is_caught);

/// b. A thread created after a process-wide watchpoint was set is armed before it runs: its
/// very first instruction-level store (to VARS[1], which nobody else writes) is reported.
async fn new_threads_first_store_is_caught(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "4"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events = EventStream::for_pid(&mut client, target.pid).await?;
            let resp = set_watchpoint(&mut client, write_spec(backend, target.pid, target.vars[1]))
                .await?;
            let wp = resp.watchpoint.unwrap_or_default();

            let tid = target.spawn_marker().await?;
            let no_tids = HashSet::new();
            let (mut hits, mut started) = (0, false);
            events
                .wait_for(
                    Duration::from_secs(10),
                    &format!("the hit of new thread {tid} and its ThreadStarted"),
                    |ev| {
                        match ev {
                            Event::Hit(h) if h.watchpoint_id == wp.id => {
                                check_hit(h, &wp, &no_tids)?;
                                ensure!(
                                    h.tid == tid,
                                    "hit on VARS[1] from tid {}, not from {tid}",
                                    h.tid
                                );
                                ensure!(
                                    hit_value_u64(h) == Some(SPAWN_MARK),
                                    "value {:x?}, expected 0xC0FFEE",
                                    h.value
                                );
                                hits += 1;
                                ensure!(hits == 1, "the thread stored once, got hit #{hits}");
                            }
                            Event::ThreadStarted(t) if t.tid == tid => {
                                ensure!(t.pid == target.pid, "ThreadStarted {t:?}: wrong pid");
                                ensure!(
                                    t.parent_tid == target.pid,
                                    "ThreadStarted {t:?}: the main thread ({}) created it",
                                    target.pid
                                );
                                ensure!(
                                    t.watchpoint_ids.contains(&wp.id),
                                    "ThreadStarted {t:?} does not list inherited watchpoint {}",
                                    wp.id
                                );
                                started = true;
                            }
                            _ => {}
                        }
                        Ok((hits == 1 && started).then_some(()))
                    },
                )
                .await?;

            // Exactly one store happened: no second hit may follow.
            for ev in events.drain_for(Duration::from_millis(300)).await? {
                if let Event::Hit(h) = ev {
                    ensure!(h.watchpoint_id != wp.id, "extra hit on VARS[1]: {h:?}");
                }
            }
            target.ensure_alive()
        }
        .await,
    )
}

both_backends!(thread_scoped_watchpoint_hits_only_its_thread);

/// c. A watchpoint limited to one worker thread reports hits from that thread only, is armed
/// on one thread, and occupies a slot on that thread only.
async fn thread_scoped_watchpoint_hits_only_its_thread(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let target = TargetProc::start(&["--threads", "8"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let worker = target.worker_tids()?[3];
            let mut events = EventStream::subscribe(&mut client, hits_only(target.pid)).await?;
            let mut spec = write_spec(backend, target.pid, target.vars[0]);
            spec.tids = vec![worker];
            let wp = set_watchpoint(&mut client, spec)
                .await?
                .watchpoint
                .unwrap_or_default();
            ensure!(
                !wp.process_wide,
                "a watchpoint with tids is not process-wide: {wp:?}"
            );
            ensure!(
                wp.armed_threads == 1,
                "armed_threads = {}, expected 1",
                wp.armed_threads
            );

            let only = HashSet::from([worker]);
            let hits = events.collect_hits(50, Duration::from_secs(10)).await?;
            for hit in &hits {
                check_hit(hit, &wp, &only)?;
            }

            let threads = list_threads(&mut client, target.pid, false).await?;
            let listed: HashSet<i32> = threads.threads.iter().map(|t| t.tid).collect();
            let actual: HashSet<i32> = target.tids()?.into_iter().collect();
            ensure!(
                listed == actual,
                "ListThreads lists {listed:?}, /proc has {actual:?}"
            );
            for t in &threads.threads {
                ensure!(
                    t.slots.len() == 4,
                    "thread {} has {} slots",
                    t.tid,
                    t.slots.len()
                );
                let expected: Vec<u64> = if t.tid == worker { vec![wp.id] } else { vec![] };
                ensure!(
                    ours(t) == expected,
                    "thread {}: OURS slots {:?}, expected {expected:?} ({t:?})",
                    t.tid,
                    ours(t)
                );
            }
            Ok(())
        }
        .await,
    )
}

both_backends!(removed_watchpoint_stops_hitting);

/// f. After RemoveWatchpoint a WatchpointRemoved event arrives, and no hit of that watchpoint
/// follows it.
async fn removed_watchpoint_stops_hitting(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "4", "--interval-us", "2000"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events = EventStream::for_pid(&mut client, target.pid).await?;
            let wp: Watchpoint =
                set_watchpoint(&mut client, write_spec(backend, target.pid, target.vars[0]))
                    .await?
                    .watchpoint
                    .unwrap_or_default();
            events
                .wait_for(Duration::from_secs(10), "a first hit", |ev| {
                    Ok(matches!(ev, Event::Hit(h) if h.watchpoint_id == wp.id).then_some(()))
                })
                .await?;

            let removed = rpc_ok(
                "RemoveWatchpoint",
                client.remove_watchpoint(RemoveWatchpointRequest { id: wp.id }),
            )
            .await?
            .watchpoint
            .unwrap_or_default();
            ensure!(removed.id == wp.id, "RemoveWatchpoint returned {removed:?}");
            ensure!(
                removed.hits >= 1,
                "final hit count {} but we saw a hit",
                removed.hits
            );

            // Hits still in flight before the WatchpointRemoved event are fine.
            events
                .wait_for(Duration::from_secs(10), "WatchpointRemoved", |ev| {
                    Ok(match ev {
                        Event::WatchpointRemoved(r) if r.watchpoint_id == wp.id => {
                            ensure!(r.pid == target.pid, "WatchpointRemoved {r:?}: wrong pid");
                            Some(())
                        }
                        _ => None,
                    })
                })
                .await?;
            for ev in events.drain_for(Duration::from_millis(500)).await? {
                if let Event::Hit(h) = ev
                    && h.watchpoint_id == wp.id
                {
                    bail!("hit after WatchpointRemoved: {h:?}");
                }
            }

            // The process may stay attached (removing is not detaching); nothing stays armed.
            let snap = snapshot(&mut client, target.pid).await?;
            ensure!(
                snap.watchpoints.is_empty(),
                "still listed: {:?}",
                snap.watchpoints
            );
            for t in snap.threads.iter().flat_map(|l| &l.threads) {
                ensure!(count_slots(t, SlotState::Ours) == 0, "slot left: {t:?}");
            }
            let again =
                rpc(client.remove_watchpoint(RemoveWatchpointRequest { id: wp.id })).await?;
            expect_status("second RemoveWatchpoint", again, Code::NotFound, &[])?;

            let (c, _) = target.ping().await?;
            target.wait_counter_above(c, Duration::from_secs(5)).await?;
            target.ensure_alive()
        }
        .await,
    )
}

both_backends!(a_store_just_before_a_removal_is_reported_before_it);

/// A store made just before RemoveWatchpoint (the target's reply to `write` comes after it) is
/// reported, before the WatchpointRemoved event, and counted in the removal's answer: the
/// perf backend reads its ring a poll later (10 ms), and a removal in between must not lose
/// what was stored while the watchpoint was armed. Five rounds, each a new watchpoint.
async fn a_store_just_before_a_removal_is_reported_before_it(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "1"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events = EventStream::for_pid(&mut client, target.pid).await?;
            for round in 1..=5u64 {
                let wp: Watchpoint =
                    set_watchpoint(&mut client, write_spec(backend, target.pid, target.vars[2]))
                        .await?
                        .watchpoint
                        .unwrap_or_default();
                target.write(2, round).await?;
                let removed = rpc_ok(
                    "RemoveWatchpoint",
                    client.remove_watchpoint(RemoveWatchpointRequest { id: wp.id }),
                )
                .await?
                .watchpoint
                .unwrap_or_default();
                ensure!(
                    removed.hits == 1,
                    "round {round}: RemoveWatchpoint counts {} hits, expected the one store",
                    removed.hits
                );
                let mut seen = Vec::new();
                events
                    .wait_for(Duration::from_secs(10), "WatchpointRemoved", |ev| {
                        Ok(match ev {
                            Event::Hit(h) if h.watchpoint_id == wp.id => {
                                seen.push(hit_value_u64(h));
                                None
                            }
                            Event::WatchpointRemoved(r) if r.watchpoint_id == wp.id => Some(()),
                            _ => None,
                        })
                    })
                    .await?;
                ensure!(
                    seen == [Some(round)],
                    "round {round}: hits before the removal {seen:?}, expected one of {round}"
                );
            }
            target.ensure_alive()
        }
        .await,
    )
}

both_backends!(attach_while_threads_are_being_created);

/// Attach, arm and detach three times while two threads of the target create and join
/// threads non-stop (each new thread stores once to `VARS[0]`). Threads born during the scan
/// are attached by the kernel at clone (ptrace) or tracked through their FORK record (perf):
/// neither may make Attach fail, and the process-wide watchpoint must catch the first store of
/// threads born after it was set: once it is set (while churning), the churn is stopped, then a
/// window of churn creates C threads (about 200), counted by the target once none is alive,
/// and the watchpoint's count must grow by exactly C, one hit per thread's one store, every
/// hit streamed. (`ListThreads` drains the daemon's rings: the counts read after it include
/// every store made before it.)
async fn attach_while_threads_are_being_created(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--churn", "--threads", "2"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            for round in 1..=3 {
                target.cmd("churn-start").await?;
                let mut events = EventStream::subscribe(&mut client, hits_only(target.pid)).await?;
                let wp =
                    set_watchpoint(&mut client, write_spec(backend, target.pid, target.vars[0]))
                        .await
                        .map_err(|e| {
                            anyhow::anyhow!("round {round}: attach + set while churning: {e:#}")
                        })?
                        .watchpoint
                        .unwrap_or_default();
                let born_in = |reply: &str, prefix: &str| -> Result<u64> {
                    reply
                        .strip_prefix(prefix)
                        .and_then(|r| r.split_whitespace().next())
                        .and_then(|n| n.parse().ok())
                        .with_context(|| format!("round {round}: {reply:?}"))
                };
                born_in(&target.cmd("churn-stop").await?, "CHURN-STOPPED n=")?;
                let before = counted(&mut client, target.pid, wp.id).await?;
                // The window, until 200 threads were born in it (at most 10 s on a loaded
                // machine): every one caught at its one store.
                target.cmd("churn-start").await?;
                let mut born = 0;
                let until = tokio::time::Instant::now() + Duration::from_secs(10);
                while born < 200 && tokio::time::Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    born += born_in(&target.cmd("churn-stats").await?, "CHURN n=")?;
                }
                born += born_in(&target.cmd("churn-stop").await?, "CHURN-STOPPED n=")?;
                ensure!(born >= 20, "round {round}: only {born} threads in 10 s");
                let after = counted(&mut client, target.pid, wp.id).await?;
                ensure!(
                    after - before == born,
                    "round {round}: {} hits counted for {born} threads born after the \
                     watchpoint was set",
                    after - before
                );
                // Every hit counted is streamed, once.
                let mut streamed = 0u64;
                let mut tids = HashSet::new();
                events
                    .wait_for(
                        Duration::from_secs(20),
                        &format!("round {round}: the {after} hits counted"),
                        |ev| {
                            if let Event::Hit(h) = ev
                                && h.watchpoint_id == wp.id
                            {
                                streamed += 1;
                                tids.insert(h.tid);
                            }
                            Ok((streamed >= after).then_some(()))
                        },
                    )
                    .await
                    .with_context(|| format!("{streamed} of {after} streamed"))?;
                for e in events.drain_for(Duration::from_millis(300)).await? {
                    if matches!(&e, Event::Hit(h) if h.watchpoint_id == wp.id) {
                        streamed += 1;
                    }
                }
                ensure!(
                    streamed == after,
                    "round {round}: {streamed} hits streamed, {after} counted"
                );
                eprintln!(
                    "round {round}: {before} hits while setting, then {born} threads, each \
                     caught once ({} tids in all)",
                    tids.len()
                );
                rpc_ok(
                    "Detach",
                    client.detach(wpd_proto::v1::DetachRequest { pid: target.pid }),
                )
                .await?;
            }
            target.ensure_alive()
        }
        .await,
    )
}

/// The hits watchpoint `wp` counted, once the daemon has read every record written so far
/// (`ListThreads` drains its rings first).
async fn counted(client: &mut wpd_tests::Client, pid: i32, wp: u64) -> Result<u64> {
    list_threads(client, pid, false).await?;
    let l = rpc_ok(
        "ListWatchpoints",
        client.list_watchpoints(wpd_proto::v1::ListWatchpointsRequest { pid }),
    )
    .await?;
    l.watchpoints
        .iter()
        .find(|w| w.id == wp)
        .map(|w| w.hits)
        .with_context(|| format!("watchpoint {wp} is not listed"))
}

both_backends!(churned_threads_leave_no_rows);

/// Two threads of the target create and join threads non-stop (each lives microseconds, often
/// on another CPU than its creator) while a process-wide watchpoint is set. Once the target is
/// stopped (SIGSTOP), ListThreads must list exactly the threads in `/proc`: every thread that
/// came and went was forgotten, whichever of its FORK and EXIT records the daemon read first
/// (perf: they sit in different CPUs' rings). Then the target must run on.
async fn churned_threads_leave_no_rows(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--churn", "--threads", "2"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            set_watchpoint(&mut client, write_spec(backend, target.pid, target.vars[0])).await?;
            target.cmd("churn-start").await?;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            // Threads came and went while the watchpoint was set.
            churning(&mut target).await?;
            target.signal(libc::SIGSTOP)?;
            let pid = target.pid;
            let result = poll_until(
                Duration::from_secs(10),
                "ListThreads to list the threads of /proc",
                async || {
                    let live = target.tids()?;
                    let mut listed: Vec<i32> = list_threads(&mut client, pid, false)
                        .await?
                        .threads
                        .iter()
                        .map(|t| t.tid)
                        .collect();
                    listed.sort_unstable();
                    Ok(if listed == live {
                        Ok(())
                    } else {
                        let stale = listed.iter().filter(|t| !live.contains(t)).count();
                        Err(format!(
                            "{} listed ({stale} no longer in /proc), {} in /proc: {:?}",
                            listed.len(),
                            live.len(),
                            &live[..live.len().min(8)]
                        ))
                    })
                },
            )
            .await;
            target.signal(libc::SIGCONT)?;
            result?;
            // Churning again: threads created after SIGCONT.
            target.cmd("churn-stats").await?;
            churning(&mut target).await.context("after SIGCONT")?;
            target.ensure_alive()
        }
        .await,
    )
}

/// Waits until a `--churn` target's creators have created and joined threads since its
/// previous `churn-stats`; returns how many. A loaded machine may keep them waiting a while
/// (each new thread must run before its creator's join returns, and a test beside this one
/// may have hundreds of threads spinning on the same CPUs: 200 ms passed without one in a CI
/// run); a target that is stuck never creates one.
async fn churning(target: &mut TargetProc) -> Result<u64> {
    let mut n = 0;
    poll_until(
        Duration::from_secs(20),
        "the target to create and join threads",
        async || {
            let reply = target.cmd("churn-stats").await?;
            let created: u64 = reply
                .strip_prefix("CHURN n=")
                .and_then(|r| r.split(' ').next())
                .and_then(|c| c.parse().ok())
                .with_context(|| format!("churn-stats answered {reply:?}"))?;
            n += created;
            Ok(if n > 0 { Ok(n) } else { Err(reply) })
        },
    )
    .await
}

/// A subscriber that does not read loses events once the daemon's ring has gone round, and
/// the loss counts in GetStats when it happens, not when the subscriber reads again. When it
/// reads, it is told how many it lost and their sequence numbers, and the count is not added a
/// second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losses_count_when_they_happen_and_name_their_sequence_numbers() -> Result<()> {
    if !wpd_tests::require_backend(Backend::Perf) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    // Workers that almost never write: the hits come from `hammer`'s threads.
    let mut target = TargetProc::start(&["--threads", "1", "--interval-us", "1000000"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut reader = daemon.client().await?;
            // Every event (no filter): sequence numbers then have no gaps but losses.
            let mut stalled = reader
                .stream_events(StreamEventsRequest::default())
                .await?
                .into_inner();
            set_watchpoint(
                &mut client,
                write_spec(Backend::Perf, target.pid, target.vars[3]),
            )
            .await?;
            let stats = |c: &mut wpd_tests::Client| {
                let mut c = c.clone();
                async move {
                    rpc_ok("GetStats", c.get_stats(wpd_proto::v1::GetStatsRequest {})).await
                }
            };
            // Rounds of 2 s of stores from 2 threads (far more hits than the ring's 65,536
            // on any machine seen; more rounds where it is slower or loaded), until a loss
            // shows.
            let mut reply = None;
            let mut before_read = stats(&mut client).await?;
            for _ in 0..20 {
                reply = target.cmd_within("hammer 3 2 2000", Duration::from_secs(30)).await?;
                before_read = stats(&mut client).await?;
                if before_read.subscriber_dropped > 0 {
                    break;
                }
            }
            ensure!(
                before_read.subscriber_dropped > 0,
                "nothing counted as lost before the subscriber read ({before_read:?}, {reply:?})"
            );
            // Now read everything: buffered events, then the loss report.
            let mut told = 0u64;
            let mut last_seq = 0u64;
            loop {
                let msg = tokio::time::timeout(Duration::from_secs(10), stalled.message()).await;
                let Ok(Ok(Some(m))) = msg else { break };
                match &m.event {
                    Some(Event::Dropped(d)) => {
                        ensure!(
                            d.count > 0
                                && d.last_seq == m.seq
                                && d.last_seq - d.first_seq + 1 == d.count
                                && d.first_seq == last_seq + 1,
                            "EventsDropped {d:?} (item seq {}) after seq {last_seq}",
                            m.seq
                        );
                        told += d.count;
                    }
                    _ => ensure!(
                        last_seq == 0 || m.seq == last_seq + 1,
                        "seq {} after {last_seq}: a gap without a loss report",
                        m.seq
                    ),
                }
                last_seq = m.seq;
            }
            ensure!(told > 0, "the subscriber was never told of its losses");
            let after_read = stats(&mut client).await?;
            ensure!(
                after_read.subscriber_dropped == told,
                "GetStats says {} lost; the subscriber was told of {told}",
                after_read.subscriber_dropped
            );
            ensure!(
                before_read.subscriber_dropped <= told,
                "counted {} before the read, more than the {told} there were",
                before_read.subscriber_dropped
            );
            target.ensure_alive()
        }
        .await,
    )
}

/// The kernel throttles a sampling perf event that fires more than
/// `perf_event_max_sample_rate / HZ` times per tick; a throttled breakpoint still traps but
/// records nothing, and nobody would know. Breakpoints opened with `sample_period = 1` (wpd's)
/// are never throttled (kernel-facts §10): with the limit lowered to 1,000 a second (4 a tick
/// here), 20,000 stores in a tight loop are 20,000 hits, on both perf paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_are_not_throttled_by_the_kernels_sample_rate_limit() -> Result<()> {
    if !wpd_tests::require_root_perf() {
        return Ok(());
    }
    let _rate = Sysctl::set("/proc/sys/kernel/perf_event_max_sample_rate", "1000")?;
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "1"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let w = set_watchpoint(
                &mut client,
                write_spec(Backend::Perf, target.pid, target.vars[3]),
            )
            .await?
            .watchpoint
            .unwrap_or_default();
            let answer = target.cmd("bench-writes 3 20000").await?;
            ensure!(answer.starts_with("BENCH"), "{answer}");
            let hits = poll_until(Duration::from_secs(20), "20,000 hits", async || {
                let list = rpc_ok(
                    "ListWatchpoints",
                    client.list_watchpoints(wpd_proto::v1::ListWatchpointsRequest { pid: 0 }),
                )
                .await?;
                let n = list
                    .watchpoints
                    .iter()
                    .find(|x| x.id == w.id)
                    .map_or(0, |x| x.hits);
                Ok(if n >= 20_000 {
                    Ok(n)
                } else {
                    Err(format!("{n} hits"))
                })
            })
            .await?;
            ensure!(hits == 20_000, "{hits} hits for 20,000 stores");
            let stats = rpc_ok(
                "GetStats",
                client.get_stats(wpd_proto::v1::GetStatsRequest {}),
            )
            .await?;
            ensure!(stats.kernel_lost == 0, "{} lost", stats.kernel_lost);
            Ok(())
        }
        .await,
    )
}
