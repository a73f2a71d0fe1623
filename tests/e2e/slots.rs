//! End-to-end tests of debug-register slot accounting: capabilities, four slots per thread, a
//! refused fifth watchpoint that changes nothing, and a slot held by someone else (foreign).

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Result, ensure};
use tonic::Code;
use tonic_types::StatusExt;
use wpd_proto::v1::stream_events_response::Event;
use wpd_proto::v1::{
    Access, GetCapabilitiesRequest, RemoveWatchpointRequest, SetWatchpointRequest, SlotState,
    ThreadInfo, WatchpointSpec,
};
use wpd_tests::{
    Backend, Client, Daemon, EventStream, ForeignBreakpoint, TargetProc, both_backends,
    count_slots, ensure_unchanged, expect_status, hits_only, list_threads, numbers_in, ours,
    poll_until, require_root_perf, rpc, rpc_ok, set_watchpoint, snapshot, write_spec,
};

/// Sets process-wide write watchpoints on `VARS[i]` for each `i` (variables no worker stores
/// to) with `backend` and returns their ids.
async fn set_on_vars(
    client: &mut Client,
    backend: Backend,
    target: &TargetProc,
    vars: &[usize],
) -> Result<Vec<u64>> {
    let mut ids = Vec::new();
    for &i in vars {
        let resp = set_watchpoint(client, write_spec(backend, target.pid, target.vars[i])).await?;
        ids.push(resp.watchpoint.unwrap_or_default().id);
    }
    Ok(ids)
}

/// Sets a 4th process-wide watchpoint (on `VARS[4]`) that must be refused with
/// RESOURCE_EXHAUSTED naming `full`, the thread whose slot someone else holds.
async fn fourth_is_refused_naming(
    client: &mut Client,
    backend: Backend,
    target: &TargetProc,
    full: i32,
) -> Result<()> {
    let fourth = rpc(client.set_watchpoint(SetWatchpointRequest {
        spec: Some(write_spec(backend, target.pid, target.vars[4])),
    }))
    .await?;
    let status = expect_status(
        "4th with a foreign slot",
        fourth,
        Code::ResourceExhausted,
        &[],
    )?;
    ensure!(
        numbers_in(status.message()).contains(&(full as i64)),
        "message {:?} does not name thread {full}",
        status.message()
    );
    Ok(())
}

/// All or nothing: every thread of `pid` holds exactly `ids`, in OURS slots, with nothing
/// pending. Returns how many threads were listed.
async fn every_thread_holds_exactly(client: &mut Client, pid: i32, ids: &[u64]) -> Result<usize> {
    let id_set: HashSet<u64> = ids.iter().copied().collect();
    let threads = list_threads(client, pid, false).await?.threads;
    for t in &threads {
        let held: HashSet<u64> = ours(t).into_iter().collect();
        ensure!(
            held == id_set && count_slots(t, SlotState::Ours) == ids.len(),
            "thread {} should hold exactly {ids:?}: {t:?}",
            t.tid
        );
        ensure!(
            count_slots(t, SlotState::Pending) == 0,
            "pending slot left: {t:?}"
        );
    }
    Ok(threads.len())
}

/// The kernel agrees, thread by thread (a probing listing counts free slots): 3 OURS on
/// every thread of `pid`, and one FOREIGN on `foreign_on` only.
async fn probed_three_ours_one_foreign_on(
    client: &mut Client,
    pid: i32,
    foreign_on: i32,
) -> Result<()> {
    for t in &list_threads(client, pid, true).await?.threads {
        let expected_foreign = usize::from(t.tid == foreign_on);
        ensure!(
            count_slots(t, SlotState::Foreign) == expected_foreign
                && count_slots(t, SlotState::Ours) == 3,
            "probed thread {}: expected {expected_foreign} FOREIGN and 3 OURS: {t:?}",
            t.tid
        );
    }
    Ok(())
}

/// The daemon reports what an x86-64 host offers: 4 slots, lengths 1/2/4/8, no read-only kind,
/// and both backends usable, perf the default. (Not per backend: capabilities are the
/// daemon's, whatever backend a process will use.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_describe_x86_64() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let caps = rpc_ok(
                "GetCapabilities",
                client.get_capabilities(GetCapabilitiesRequest {}),
            )
            .await?;
            ensure!(caps.arch == "x86_64", "arch {:?}", caps.arch);
            ensure!(
                caps.slots_per_thread == 4,
                "slots_per_thread {}",
                caps.slots_per_thread
            );
            let mut lengths = caps.lengths.clone();
            lengths.sort_unstable();
            ensure!(lengths == [1, 2, 4, 8], "lengths {:?}", caps.lengths);
            ensure!(
                !caps.access_kinds.contains(&(Access::Read as i32)),
                "x86-64 cannot watch loads only, yet access_kinds = {:?}",
                caps.access_kinds
            );
            for (backend, default) in [(Backend::Perf, true), (Backend::Ptrace, false)] {
                let info = caps.backends.iter().find(|b| b.backend() == backend);
                ensure!(
                    info.is_some_and(|b| b.usable
                        && b.reason.is_empty()
                        && b.is_default == default),
                    "{backend:?} should be listed as usable (default: {default}): {:?}",
                    caps.backends
                );
            }
            ensure!(
                caps.backends.iter().filter(|b| b.is_default).count() == 1,
                "exactly one default backend: {:?}",
                caps.backends
            );
            Ok(())
        }
        .await,
    )
}

both_backends!(fifth_watchpoint_is_refused_and_changes_nothing);

/// d. Four watchpoints fill every thread's four slots; a fifth (process-wide, or on one
/// thread) is refused with RESOURCE_EXHAUSTED naming a tid, and changes nothing.
async fn fifth_watchpoint_is_refused_and_changes_nothing(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let target = TargetProc::start(&["--threads", "4"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let tids: HashSet<i32> = target.tids()?.into_iter().collect();
            let ids = set_on_vars(&mut client, backend, &target, &[1, 2, 3, 4]).await?;
            let id_set: HashSet<u64> = ids.iter().copied().collect();
            ensure!(id_set.len() == 4, "ids not distinct: {ids:?}");

            let threads = list_threads(&mut client, target.pid, false).await?;
            ensure!(
                threads.slots_per_thread == 4,
                "slots_per_thread {}",
                threads.slots_per_thread
            );
            let listed: HashSet<i32> = threads.threads.iter().map(|t| t.tid).collect();
            ensure!(
                listed == tids,
                "ListThreads lists {listed:?}, /proc has {tids:?}"
            );
            for t in &threads.threads {
                let held: HashSet<u64> = ours(t).into_iter().collect();
                ensure!(
                    t.slots.len() == 4 && count_slots(t, SlotState::Ours) == 4 && held == id_set,
                    "thread {} should hold {ids:?} in 4 OURS slots: {t:?}",
                    t.tid
                );
            }

            let before = snapshot(&mut client, target.pid).await?;

            let fifth = rpc(client.set_watchpoint(SetWatchpointRequest {
                spec: Some(write_spec(backend, target.pid, target.vars[5])),
            }))
            .await?;
            let status = expect_status("process-wide 5th", fifth, Code::ResourceExhausted, &[])?;
            ensure!(
                numbers_in(status.message())
                    .iter()
                    .any(|&n| tids.contains(&(n as i32))),
                "message {:?} names none of the target's tids {tids:?}",
                status.message()
            );
            ensure_unchanged(
                "the refused 5th watchpoint",
                &before,
                &snapshot(&mut client, target.pid).await?,
            )?;

            let worker = target.worker_tids()?[1];
            let mut spec = write_spec(backend, target.pid, target.vars[5]);
            spec.tids = vec![worker];
            let fifth =
                rpc(client.set_watchpoint(SetWatchpointRequest { spec: Some(spec) })).await?;
            let status = expect_status("5th on one thread", fifth, Code::ResourceExhausted, &[])?;
            ensure!(
                numbers_in(status.message()).contains(&(worker as i64)),
                "message {:?} does not name tid {worker}",
                status.message()
            );
            ensure_unchanged(
                "the refused 5th watchpoint",
                &before,
                &snapshot(&mut client, target.pid).await?,
            )?;
            Ok(())
        }
        .await,
    )
}

both_backends!(foreign_slot_on_main_thread_limits_to_three);
both_backends!(foreign_slot_on_the_last_of_300_threads_refuses_them_all);

/// e. A breakpoint the test itself holds on the target's main thread takes one of its slots:
/// three process-wide watchpoints fit, the fourth is refused naming the main thread and leaves
/// nothing armed, and a probing ListThreads shows the foreign slot.
async fn foreign_slot_on_main_thread_limits_to_three(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let target = TargetProc::start(&["--threads", "4"]).await?;
    let foreign = ForeignBreakpoint::open(target.pid, target.vars[7], 8)?;
    let result = daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let main = target.pid;
            let ids = set_on_vars(&mut client, backend, &target, &[1, 2, 3]).await?;
            let before = snapshot(&mut client, main).await?;
            ensure!(
                before.watchpoints.len() == 3,
                "listed: {:?}",
                before.watchpoints
            );

            fourth_is_refused_naming(&mut client, backend, &target, main).await?;
            // The daemon may now mark the refused slot FOREIGN; nothing else may change. With
            // ptrace this includes RETAINED: the daemon checks every thread for a free slot
            // before writing any address, so a refused request leaves no kernel-held slot.
            let allowed: &[SlotState] = &[SlotState::Foreign];
            let after = snapshot(&mut client, main).await?;
            ensure_unchanged(
                "the refused 4th watchpoint",
                &before.shown_as_free(allowed),
                &after.shown_as_free(allowed),
            )?;

            // All or nothing: no thread holds anything but the three.
            every_thread_holds_exactly(&mut client, main, &ids).await?;

            // The threads stopped for the free-slot check run again (ptrace): none is left
            // in a tracing stop ('t') and the workers keep storing.
            let moving_from = target.read_var(0)?;
            poll_until(
                std::time::Duration::from_secs(10),
                "every thread out of tracing stop and VARS[0] moving after the refusal",
                async || {
                    let stopped: Vec<(i32, char)> = target
                        .thread_run_states()?
                        .into_iter()
                        .filter(|&(_, st)| st == 't')
                        .collect();
                    let v = target.read_var(0)?;
                    Ok(if stopped.is_empty() && v > moving_from {
                        Ok(())
                    } else {
                        Err(format!("in tracing stop: {stopped:?}; VARS[0] {v}"))
                    })
                },
            )
            .await?;

            probed_three_ours_one_foreign_on(&mut client, main, main).await
        }
        .await,
    );
    drop(foreign);
    result
}

/// f. The same on a target large enough that the daemon arms it from several threads at once
/// (one per CPU, each on a contiguous range of tids): the kernel refuses a slot only on the
/// last thread, after the other ranges have been armed; the whole watchpoint is refused naming
/// that thread, and every other thread is left with exactly the three it had.
async fn foreign_slot_on_the_last_of_300_threads_refuses_them_all(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let target = TargetProc::start(&["--threads", "300"]).await?;
    let last = target.tids()?.into_iter().max().unwrap_or(target.pid);
    let foreign = ForeignBreakpoint::open(last, target.vars[7], 8)?;
    let result = daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let main = target.pid;
            let ids = set_on_vars(&mut client, backend, &target, &[1, 2, 3]).await?;
            fourth_is_refused_naming(&mut client, backend, &target, last).await?;
            let listed = every_thread_holds_exactly(&mut client, main, &ids).await?;
            ensure!(listed == 301, "{listed} threads listed");
            probed_three_ours_one_foreign_on(&mut client, main, last).await?;
            // The slots the refused pass had taken are free again: a watchpoint on the main
            // thread alone fits.
            let mut one = write_spec(backend, main, target.vars[5]);
            one.tids = vec![main];
            set_watchpoint(&mut client, one).await?;
            Ok(())
        }
        .await,
    );
    drop(foreign);
    result
}

both_backends!(a_range_takes_a_slot_per_piece_on_every_thread);

/// A range of 16 bytes is one watchpoint holding two slots (pieces 0 and 1) on every thread,
/// a thread created later included; a second range that no longer fits is refused whole,
/// naming the slots it needs, and changes nothing; a store to the first piece is reported as
/// that piece with its bytes; removed, the range gives back both slots everywhere.
async fn a_range_takes_a_slot_per_piece_on_every_thread(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "3"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let pid = target.pid;
        let vars = target.vars.clone();
        let range_spec = |var: usize, length| WatchpointSpec {
            length,
            ..write_spec(backend, pid, vars[var])
        };
        let set = set_watchpoint(&mut client, range_spec(2, 16)).await?;
        let range = set.watchpoint.unwrap_or_default();
        let pieces: Vec<(u64, u32)> = range.pieces.iter().map(|p| (p.address, p.length)).collect();
        let v2 = target.vars[2];
        ensure!(pieces == vec![(v2, 8), (v2 + 8, 8)], "pieces {pieces:?}");
        let single = set_on_vars(&mut client, backend, &target, &[3]).await?[0];
        // A thread created now gets both pieces at birth.
        let born = target.spawn_worker().await?;
        let pieces_on = |t: &ThreadInfo| -> Vec<u32> {
            t.slots
                .iter()
                .filter(|s| s.state == SlotState::Ours as i32 && s.watchpoint_id == range.id)
                .map(|s| s.piece)
                .collect()
        };
        let threads = poll_until(Duration::from_secs(5), "the new thread armed", async || {
            let threads = list_threads(&mut client, pid, false).await?.threads;
            if !threads.iter().any(|t| t.tid == born) {
                return Ok(Err(format!("{born} not listed yet")));
            }
            for t in &threads {
                let mut p = pieces_on(t);
                p.sort_unstable();
                if p != vec![0, 1] || !ours(t).contains(&single) {
                    return Ok(Err(format!(
                        "thread {} should hold pieces 0 and 1 of #{} and #{single}: {t:?}",
                        t.tid, range.id
                    )));
                }
            }
            Ok(Ok(threads))
        })
        .await?;
        ensure!(threads.len() == 5, "main + 3 workers + 1 born: {threads:?}");

        // Two more slots are not there: refused whole.
        let before = snapshot(&mut client, pid).await?;
        let refused = rpc(client.set_watchpoint(SetWatchpointRequest {
            spec: Some(range_spec(4, 16)),
        }))
        .await?;
        let status = expect_status(
            "a second range",
            refused,
            Code::ResourceExhausted,
            &["takes 2 slots on every thread", "(2 slots)"],
        )?;
        let needed = status
            .get_details_error_info()
            .and_then(|i| i.metadata.get("slots_needed").cloned());
        ensure!(needed.as_deref() == Some("2"), "slots_needed: {needed:?}");
        ensure_unchanged(
            "the refused range",
            &before,
            &snapshot(&mut client, pid).await?,
        )?;

        // A store to the first piece.
        let mut events = EventStream::subscribe(&mut client, hits_only(pid)).await?;
        target.write(2, 0x1122_3344_5566_7788).await?;
        let hit = events
            .wait_for(Duration::from_secs(10), "the store's hit", |e| {
                Ok(match e {
                    Event::Hit(h) if h.watchpoint_id == range.id => Some(h.clone()),
                    _ => None,
                })
            })
            .await?;
        ensure!(
            (hit.piece, hit.address, hit.length) == (0, v2, 8),
            "the hit names piece 0, its address and length: {hit:?}"
        );
        ensure!(
            hit.value == 0x1122_3344_5566_7788u64.to_le_bytes(),
            "the piece's bytes: {hit:?}"
        );

        rpc_ok(
            "RemoveWatchpoint",
            client.remove_watchpoint(RemoveWatchpointRequest { id: range.id }),
        )
        .await?;
        every_thread_holds_exactly(&mut client, pid, &[single]).await?;
        target.ensure_alive()
    }
    .await;
    daemon.finish(result)
}
