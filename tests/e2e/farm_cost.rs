//! What a watched thread costs the daemon, in file descriptors: on the perf backend's
//! per-thread path one event per armed thread and slot, whatever the number of CPUs, plus one
//! collector per CPU for the whole daemon; threads created later cost nothing (the kernel
//! copies the event, BPF program included, inside `clone()`). The per-CPU path, measured in
//! the same run, needs a tracker and a breakpoint per thread, slot and CPU.
//!
//! The bound is checked against the daemon's own `/proc/PID/fd`, not only its statistics.

use std::time::Duration;

use anyhow::{Result, ensure};
use wpd_proto::v1::RemoveWatchpointRequest;
use wpd_tests::leaks::{detach, get_stats};
use wpd_tests::{
    Backend, Daemon, EventStream, TargetProc, attach, hits_only, machine_skip, online_cpus,
    perf_events_of, poll_until, require_backend, rpc_ok, set_watchpoint, write_spec,
};

const THREADS: usize = 200;
const HIT_TIMEOUT: Duration = Duration::from_secs(10);

/// The daemon's perf event fds, from `/proc/PID/fd`.
fn perf_fds_of(pid: i32) -> Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        if let Ok(link) = std::fs::read_link(e?.path())
            && link.to_string_lossy() == "anon_inode:[perf_event]"
        {
            n += 1;
        }
    }
    Ok(n)
}

/// One process-wide watchpoint of one slot, then a second: `threads` events each on the
/// per-thread path, and a thread created afterwards hits with no fd more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_thread_events_do_not_grow_with_the_cpus() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let cpus = online_cpus().len();
    let daemon = Daemon::start().await?;
    let events = perf_events_of(&daemon).await?;
    if !events.starts_with("per-thread") {
        // Root here, so bpf() should be allowed: only a kernel without BPF ring buffers
        // (before 5.8) or a locked-down one refuses (CI's must not: WPD_TESTS_REQUIRE=1).
        machine_skip(&format!(
            "the perf backend is not on its per-thread path here: {events}"
        ));
        return Ok(());
    }
    let n = THREADS.to_string();
    let mut target = TargetProc::start(&["--threads", &n, "--interval-us", "1000000"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let pid = target.pid;
        let dpid = daemon.pid();
        attach(&mut client, pid, Backend::Perf).await?;
        let collectors = perf_fds_of(dpid)?;
        ensure!(
            collectors <= cpus + 1,
            "{collectors} perf fds after attaching a {THREADS}-thread process on {cpus} CPUs: \
             the per-thread path opens no tracker per thread"
        );
        let mut stream = EventStream::subscribe(&mut client, hits_only(pid)).await?;
        let mut ids = Vec::new();
        for var in [0, 1] {
            let wp = set_watchpoint(
                &mut client,
                write_spec(Backend::Perf, pid, target.vars[var]),
            )
            .await?
            .watchpoint
            .unwrap_or_default();
            ids.push(wp.id);
        }
        let tasks = target.tids()?.len();
        let stats = get_stats(&mut client).await?;
        let fds = perf_fds_of(dpid)?;
        ensure!(
            stats.perf_fds == 2 * tasks as u64,
            "GetStats says {} perf fds for 2 watchpoints on {tasks} threads, expected {}",
            stats.perf_fds,
            2 * tasks
        );
        // Collectors (one per CPU) and at most a free-slot probe's event in flight.
        ensure!(
            fds >= 2 * tasks && fds <= 2 * tasks + cpus + 1,
            "the daemon holds {fds} perf fds for 2 watchpoints on {tasks} threads and {cpus} \
             CPUs; expected {} to {}",
            2 * tasks,
            2 * tasks + cpus + 1
        );
        // A thread created now inherits both watchpoints inside clone(): its store to
        // variable 1 (its first instruction of note) is a hit, and it cost no fd.
        let tid = target.spawn_marker().await?;
        let hit = stream
            .wait_for(HIT_TIMEOUT, "the new thread's hit", |e| {
                Ok(match e {
                    wpd_tests::Event::Hit(h) if h.tid == tid && h.watchpoint_id == ids[1] => {
                        Some(h.clone())
                    }
                    _ => None,
                })
            })
            .await?;
        // The value read at the trap by the BPF program: the marker's store.
        ensure!(
            hit.value.len() == 8 && hit.value_error.is_empty(),
            "the new thread's hit has no value: {hit:?}"
        );
        // Hits name the process and the thread (the target names that thread "spawned").
        ensure!(
            hit.process_name == "wpd-target" && hit.thread_name == "spawned",
            "the hit names process {:?} and thread {:?}, not wpd-target and spawned",
            hit.process_name,
            hit.thread_name
        );
        ensure!(
            perf_fds_of(dpid)? <= fds,
            "a new thread made the daemon open fds ({} > {fds})",
            perf_fds_of(dpid)?
        );
        for id in ids {
            rpc_ok(
                "RemoveWatchpoint",
                client.remove_watchpoint(RemoveWatchpointRequest { id }),
            )
            .await?;
        }
        detach(&mut client, pid).await?;
        poll_until(
            Duration::from_secs(10),
            "the daemon back to its collectors",
            async || {
                let n = perf_fds_of(dpid)?;
                Ok(if n <= cpus + 1 {
                    Ok(())
                } else {
                    Err(format!("{n} perf fds"))
                })
            },
        )
        .await?;
        target.ensure_alive()?;
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// The per-CPU path (`--perf-events per-cpu`) on the same kind of target, for the record:
/// a tracker and a breakpoint per thread, slot and CPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_cpu_events_grow_with_the_cpus() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let cpus = online_cpus().len();
    let daemon = Daemon::start_with_args(&["--perf-events", "per-cpu"]).await?;
    let events = perf_events_of(&daemon).await?;
    ensure!(
        events.starts_with("per-cpu") && events.contains("--perf-events per-cpu"),
        "GetCapabilities says {events:?} for a daemon started with --perf-events per-cpu"
    );
    let n = THREADS.to_string();
    let mut target = TargetProc::start(&["--threads", &n, "--interval-us", "1000000"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let pid = target.pid;
        attach(&mut client, pid, Backend::Perf).await?;
        for var in [0, 1] {
            set_watchpoint(
                &mut client,
                write_spec(Backend::Perf, pid, target.vars[var]),
            )
            .await?;
        }
        let tasks = target.tids()?.len();
        let stats = get_stats(&mut client).await?;
        ensure!(
            stats.perf_fds == (3 * tasks * cpus) as u64,
            "GetStats says {} perf fds on the per-CPU path, expected 3 × {tasks} threads × \
             {cpus} CPUs",
            stats.perf_fds
        );
        target.ensure_alive()?;
        Ok(())
    }
    .await;
    daemon.finish(result)
}
