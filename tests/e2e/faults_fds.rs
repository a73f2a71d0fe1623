//! Fault injection: the perf backend out of file descriptors (fault 7).
//!
//! Every test runs the real daemon against real targets it starts itself, bounds every wait,
//! relies on the harness guards to kill everything on any path, and ends by checking that the
//! targets survived (no SIGTRAP, `ping` answers) and that nothing leaked (`wpd_tests::leaks`).

use std::time::Duration;

use anyhow::{Result, anyhow, bail, ensure};
use tonic::{Code, Status};
use tonic_types::StatusExt;
use wpd_proto::v1::{ListWatchpointsRequest, ResolveSymbolRequest, SetWatchpointRequest};
use wpd_tests::leaks::*;
use wpd_tests::{
    Backend, Daemon, EventStream, TargetProc, attach, ensure_unchanged, hits_only, machine_skip,
    online_cpus, poll_until, require_backend, rpc, rpc_ok, set_watchpoint, snapshot, status_line,
    write_spec,
};

/// How long the daemon may take to release everything after a detach or an exit.
const CLEAN_TIMEOUT: Duration = Duration::from_secs(10);
/// Timeout of every wait for hits.
const HIT_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// 7. The perf backend runs out of file descriptors
// ---------------------------------------------------------------------------------------------

/// Worker threads of the targets of test 7 (each also has its main thread).
const FD_TEST_THREADS: usize = 100;

/// How the daemon of test 7 is to find out that a watchpoint does not fit.
#[derive(Debug, Clone, Copy, PartialEq)]
enum FdRefusal {
    /// Its own count of perf fds already says so: it refuses before any syscall.
    Counted,
    /// Only the kernel knows (the daemon's other fds tip it over): EMFILE.
    Kernel,
}

/// 7a. With `RLIMIT_NOFILE` set so that a process-wide perf watchpoint on 101 threads cannot
/// fit, `SetWatchpoint` fails with RESOURCE_EXHAUSTED / FD_LIMIT naming the events needed and
/// the limit, and changes nothing; a one-thread watchpoint still works; an attach that does not
/// fit is refused the same way; all is released cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perf_out_of_fds_refused_beforehand() -> Result<()> {
    perf_out_of_fds(FdRefusal::Counted).await
}

/// 7b. The same when only the kernel can tell (EMFILE in the middle of the arm): the fds
/// opened before it are closed, and the error reports the daemon's real fd count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perf_out_of_fds_refused_by_the_kernel() -> Result<()> {
    perf_out_of_fds(FdRefusal::Kernel).await
}

/// Checks a refusal: RESOURCE_EXHAUSTED, reason FD_LIMIT, `needed` events in the message and
/// metadata, the limit named; returns the metadata's `open_fds` and `refused_by`.
fn expect_fd_limit(
    what: &str,
    r: std::result::Result<impl std::fmt::Debug, Status>,
    needed: u64,
    limit: u64,
) -> Result<(u64, String)> {
    let s = match r {
        Ok(v) => bail!("{what} succeeded ({v:?}); expected RESOURCE_EXHAUSTED / FD_LIMIT"),
        Err(s) => s,
    };
    ensure!(
        s.code() == Code::ResourceExhausted && reason(&s) == wpd_proto::reason::FD_LIMIT,
        "{what}: {}, expected RESOURCE_EXHAUSTED / FD_LIMIT",
        status_line(&s)
    );
    let want = format!("needs {needed} more (");
    ensure!(
        s.message().contains(&want)
            && s.message().contains(&format!("RLIMIT_NOFILE is {limit}"))
            && s.message().contains("nothing was changed"),
        "{what}: message {:?} lacks {want:?}, the limit {limit} or 'nothing was changed'",
        s.message()
    );
    let info = s
        .get_details_error_info()
        .ok_or_else(|| anyhow!("{what}: no ErrorInfo"))?;
    let meta = |k: &str| -> Result<u64> {
        info.metadata
            .get(k)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("{what}: ErrorInfo metadata lacks {k}: {:?}", info.metadata))
    };
    ensure!(
        meta("needed_fds")? == needed && meta("rlimit_nofile")? == limit,
        "{what}: metadata {:?}, expected needed_fds {needed}, rlimit_nofile {limit}",
        info.metadata
    );
    let by = info.metadata.get("refused_by").cloned().unwrap_or_default();
    Ok((meta("open_fds")?, by))
}

async fn perf_out_of_fds(how: FdRefusal) -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let cpus = online_cpus().len().max(1) as u64;
    let tasks = FD_TEST_THREADS as u64 + 1;
    // One event per thread and CPU to track the threads, as many per watchpoint.
    let per_set = tasks * cpus;
    // The daemon counts its perf fds and collectors (one per CPU), not its other fds (the
    // standard streams, sockets, epoll, eventfds: more than 3). `Counted`: room for the attach
    // and half a watchpoint. `Kernel`: a watchpoint fits that count, but not the real one.
    let limit = match how {
        FdRefusal::Counted => 64 + cpus + per_set + per_set / 2,
        FdRefusal::Kernel => cpus + 2 * per_set + 3,
    };
    let mut ours = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut ours) } == 0 && ours.rlim_max < limit {
        machine_skip(&format!(
            "the daemon would need RLIMIT_NOFILE {limit} ({cpus} CPUs), above this process's \
             hard limit {}",
            ours.rlim_max
        ));
        return Ok(());
    }
    // No fds kept for connections: the limits below are computed from the perf events alone,
    // on the path whose events grow with the CPUs (trackers and breakpoints per thread and
    // CPU); the per-thread path's bound is `farm_cost.rs`'s.
    let daemon = Daemon::start_with_args_and_fd_limit(
        &["--fd-headroom", "0", "--perf-events", "per-cpu"],
        limit,
    )
    .await?;
    // Workers that write rarely: the test only needs their threads.
    let slow = ["--interval-us", "50000"];
    let n = FD_TEST_THREADS.to_string();
    let mut target = TargetProc::start(&[&["--threads", n.as_str()][..], &slow].concat()).await?;
    let n = (3 * FD_TEST_THREADS).to_string();
    let mut big = TargetProc::start(&[&["--threads", n.as_str()][..], &slow].concat()).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let base = Baseline::take(&daemon, &mut client).await?;
        let pid = target.pid;
        let dpid = daemon.pid();
        // Refused without an attach first: the attach SetWatchpoint made on its way is undone
        // too (nothing was changed, as the error says).
        let r = rpc(client.set_watchpoint(SetWatchpointRequest {
            spec: Some(write_spec(Backend::Perf, pid, target.vars[0])),
        }))
        .await?;
        expect_fd_limit("SetWatchpoint on a process not attached", r, per_set, limit)?;
        let list = rpc_ok(
            "ListWatchpoints",
            client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
        )
        .await?;
        ensure!(
            list.processes.is_empty() && list.watchpoints.is_empty(),
            "the refused SetWatchpoint left {list:?}"
        );
        ensure!(
            get_stats(&mut client).await?.perf_fds == 0,
            "perf fds left by the refused SetWatchpoint"
        );
        poll_until(
            CLEAN_TIMEOUT,
            "the daemon's fds back to their count before the refused SetWatchpoint",
            async || {
                let n = daemon_fds(dpid)?;
                Ok(if n == base.fds {
                    Ok(())
                } else {
                    Err(format!("{n} fds, {} before", base.fds))
                })
            },
        )
        .await?;
        attach(&mut client, pid, Backend::Perf).await?;
        // The program's file loaded before the counts are taken: a hit's store is read in its
        // code (`backend::stored`), and the daemon keeps the file open while it watches a
        // process mapping it, an fd of no watchpoint's (the hits of a refused arm's events
        // would load it).
        rpc_ok(
            "ResolveSymbol(a variable's address)",
            client.resolve_symbol(ResolveSymbolRequest {
                pid,
                address: target.vars[0],
                ..Default::default()
            }),
        )
        .await?;
        let attached = Baseline::take(&daemon, &mut client).await?;
        let before = snapshot(&mut client, pid).await?;

        let r = rpc(client.set_watchpoint(SetWatchpointRequest {
            spec: Some(write_spec(Backend::Perf, pid, target.vars[0])),
        }))
        .await?;
        let (open, by) = expect_fd_limit("process-wide SetWatchpoint", r, per_set, limit)?;
        let want_by = match how {
            FdRefusal::Counted => "wpd",
            FdRefusal::Kernel => "kernel",
        };
        // Counted after the rollback: exactly what the daemon had before.
        ensure!(
            open == attached.fds as u64 && by == want_by,
            "open_fds {open}, refused_by {by}; expected {} fds, refused by {want_by}",
            attached.fds
        );
        ensure_unchanged(
            "a refused SetWatchpoint",
            &before,
            &snapshot(&mut client, pid).await?,
        )?;
        ensure!(
            get_stats(&mut client).await?.perf_fds == per_set,
            "perf fds are not the trackers' {per_set} after the refusal"
        );
        poll_until(
            CLEAN_TIMEOUT,
            "the daemon's fds back to their count before the refused watchpoint",
            async || {
                let n = daemon_fds(dpid)?;
                Ok(if n == attached.fds {
                    Ok(())
                } else {
                    Err(format!("{n} fds, {} before", attached.fds))
                })
            },
        )
        .await?;

        // A watchpoint on one thread fits, and hits.
        let mut events = EventStream::subscribe(&mut client, hits_only(pid)).await?;
        let mut on_main = write_spec(Backend::Perf, pid, target.vars[2]);
        on_main.tids = vec![pid];
        let wp = set_watchpoint(&mut client, on_main)
            .await?
            .watchpoint
            .unwrap_or_default();
        ensure!(
            wp.armed_threads == 1,
            "armed on {} threads",
            wp.armed_threads
        );
        target.write(2, 0x5eed).await?;
        let hits = events.collect_hits(1, HIT_TIMEOUT).await?;
        ensure!(
            hits[0].tid == pid && hits[0].watchpoint_id == wp.id,
            "hit {:?}, expected watchpoint {} on thread {pid}",
            hits[0],
            wp.id
        );
        drop(events);

        // An attach that does not fit either (3 × the threads) is refused, and leaves nothing.
        let big_tasks = 3 * FD_TEST_THREADS as u64 + 1;
        let before_big = snapshot(&mut client, big.pid).await?;
        let fds_before_big = daemon_fds(dpid)?;
        let r = rpc(client.attach(wpd_proto::v1::AttachRequest {
            pid: big.pid,
            backend: Backend::Perf as i32,
            ..Default::default()
        }))
        .await?;
        expect_fd_limit("Attach", r, big_tasks * cpus, limit)?;
        ensure_unchanged(
            "a refused Attach",
            &before_big,
            &snapshot(&mut client, big.pid).await?,
        )?;
        poll_until(
            CLEAN_TIMEOUT,
            "the daemon's fds back to their count before the refused attach",
            async || {
                let n = daemon_fds(dpid)?;
                Ok(if n == fds_before_big {
                    Ok(())
                } else {
                    Err(format!("{n} fds, {fds_before_big} before"))
                })
            },
        )
        .await?;

        remove(&mut client, wp.id).await?;
        detach(&mut client, pid).await?;
        ensure_clean(&daemon, &mut client, base, &[pid, big.pid]).await?;
        ensure_survived(&mut target).await?;
        ensure_survived(&mut big).await
    }
    .await;
    daemon.finish(result)
}
