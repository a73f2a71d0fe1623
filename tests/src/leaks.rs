//! Leak accounting for the fault tests: what the daemon holds before a test (fds, memory), and
//! the checks that every fault left nothing behind: no watchpoint, process, thread or perf fd in
//! `GetStats`, `ListThreads` NOT_FOUND for pids that are gone, the daemon's fd count back exactly
//! and its RSS back near its baseline; the target alive.

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use crate::{Client, Daemon, TargetProc, poll_until, rpc, rpc_ok, status_line};
use anyhow::{Context, Result, anyhow, bail, ensure};
use tokio::time::Instant;
use tonic::{Code, Status};
use tonic_types::StatusExt;
use wpd_proto::v1::{
    DetachRequest, GetStatsRequest, GetStatsResponse, ListThreadsRequest, ListWatchpointsRequest,
    RemoveWatchpointRequest, SetWatchpointRequest, SetWatchpointResponse,
};

/// Resident memory the daemon may keep above its baseline once everything is released: 16 MiB,
/// because the allocator keeps some freed memory cached (per-connection HTTP/2 buffers, malloc
/// arenas of the blocking pool's threads, map capacity), so RSS never comes back exactly.
/// Measured: 200 connections left +5 to +11 MiB depending on machine load, and repeated rounds
/// level off (+8.2, +1.7, +0.5, +0.3 MiB): caching, not a leak. File descriptors must come
/// back exactly.
pub const RSS_SLACK_KIB: u64 = 16 * 1024;
/// How long the daemon may take to release everything after a detach or an exit.
pub const CLEAN_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on an arming RPC that races a dying target.
pub const ARM_TIMEOUT: Duration = Duration::from_secs(30);

/// The daemon's open fds and resident memory before a test's work, measured with the test's
/// main client connected (its socket is one of the daemon's fds).
#[derive(Debug, Clone, Copy)]
pub struct Baseline {
    /// Open fds.
    pub fds: usize,
    /// Resident memory, KiB.
    pub rss_kib: u64,
}

/// The daemon's open fds.
pub fn daemon_fds(pid: i32) -> Result<usize> {
    let dir = format!("/proc/{pid}/fd");
    Ok(fs::read_dir(&dir)
        .with_context(|| format!("reading {dir}"))?
        .count())
}

/// The daemon's resident memory, KiB.
pub fn daemon_rss_kib(pid: i32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS in {path}"))
}

impl Baseline {
    /// Makes one RPC on `client` (so that its connection is accepted and served), waits until
    /// the fd count holds still for 200 ms (a connection that just closed, such as the
    /// harness's readiness probe, goes away asynchronously), then measures.
    pub async fn take(daemon: &Daemon, client: &mut Client) -> Result<Baseline> {
        get_stats(client).await?;
        let pid = daemon.pid();
        let mut last = (daemon_fds(pid)?, 0);
        let deadline = Instant::now() + Duration::from_secs(3);
        while last.1 < 4 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let n = daemon_fds(pid)?;
            last = if n == last.0 { (n, last.1 + 1) } else { (n, 0) };
        }
        ensure!(
            last.1 >= 4,
            "the daemon's fd count does not settle: {}",
            fd_targets(pid)
        );
        Ok(Baseline {
            fds: last.0,
            rss_kib: daemon_rss_kib(pid)?,
        })
    }
}

/// GetStats.
pub async fn get_stats(client: &mut Client) -> Result<GetStatsResponse> {
    rpc_ok("GetStats", client.get_stats(GetStatsRequest {})).await
}

/// Waits until the daemon holds nothing: `GetStats` shows 0 processes, threads, watchpoints
/// and perf fds, `ListWatchpoints` is empty, `ListThreads` answers NotFound for each of
/// `gone`, the daemon's fd count is back to exactly the baseline and its RSS within
/// [`RSS_SLACK_KIB`] of it. Only `client` may still be connected.
pub async fn ensure_clean(
    daemon: &Daemon,
    client: &mut Client,
    base: Baseline,
    gone: &[i32],
) -> Result<()> {
    poll_until(
        CLEAN_TIMEOUT,
        "GetStats: 0 processes, 0 threads, 0 watchpoints, 0 perf fds",
        async || {
            let s = get_stats(client).await?;
            Ok(
                if s.processes == 0 && s.threads == 0 && s.watchpoints == 0 && s.perf_fds == 0 {
                    Ok(())
                } else {
                    Err(format!(
                        "processes {} threads {} watchpoints {} perf_fds {}",
                        s.processes, s.threads, s.watchpoints, s.perf_fds
                    ))
                },
            )
        },
    )
    .await?;
    let list = rpc_ok(
        "ListWatchpoints",
        client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
    )
    .await?;
    ensure!(
        list.watchpoints.is_empty() && list.processes.is_empty(),
        "ListWatchpoints still lists {:?} / processes {:?}",
        list.watchpoints,
        list.processes
    );
    for &pid in gone {
        let r = rpc(client.list_threads(ListThreadsRequest {
            pid,
            tids: vec![],
            probe: false,
        }))
        .await?;
        match r {
            Err(s) if s.code() == Code::NotFound => {}
            Err(s) => bail!(
                "ListThreads({pid}) of a gone process: {}, expected NotFound",
                status_line(&s)
            ),
            Ok(l) => bail!(
                "ListThreads({pid}) of a gone process still answers: {} threads",
                l.threads.len()
            ),
        }
    }
    let dpid = daemon.pid();
    poll_until(
        CLEAN_TIMEOUT,
        &format!("the daemon's fd count back to its baseline {}", base.fds),
        async || {
            let n = daemon_fds(dpid)?;
            Ok(if n == base.fds {
                Ok(())
            } else {
                Err(format!("{n} fds: {}", fd_targets(dpid)))
            })
        },
    )
    .await?;
    // RSS only shrinks when the allocator gives memory back; give it a moment.
    poll_until(
        Duration::from_secs(3),
        &format!(
            "the daemon's RSS within {RSS_SLACK_KIB} KiB of its baseline {} KiB",
            base.rss_kib
        ),
        async || {
            let rss = daemon_rss_kib(dpid)?;
            Ok(if rss <= base.rss_kib + RSS_SLACK_KIB {
                Ok(())
            } else {
                Err(format!("{rss} KiB"))
            })
        },
    )
    .await?;
    Ok(())
}

/// What the daemon's fds point to, counted by kind (for error messages).
fn fd_targets(pid: i32) -> String {
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    if let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in dir.flatten() {
            let target = fs::read_link(e.path())
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "?".into());
            let kind = target.split(':').next().unwrap_or("?").to_string();
            *kinds.entry(kind).or_default() += 1;
        }
    }
    format!("{kinds:?}")
}

/// Fails unless the target is alive and answers `ping`; names the signal that killed it.
pub async fn ensure_survived(target: &mut TargetProc) -> Result<()> {
    let result = async {
        target.ensure_alive()?;
        target.ping().await?;
        target.ensure_alive()
    }
    .await;
    if result.is_err() && target.exit_status().and_then(|s| s.signal()) == Some(libc::SIGTRAP) {
        return result.context("the target died of SIGTRAP: a debug register was left armed");
    }
    result
}

/// The `google.rpc.ErrorInfo` reason of a status, if any.
pub fn reason(s: &Status) -> String {
    s.get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

/// RemoveWatchpoint, expected to succeed.
pub async fn remove(client: &mut Client, id: u64) -> Result<()> {
    rpc_ok(
        &format!("RemoveWatchpoint({id})"),
        client.remove_watchpoint(RemoveWatchpointRequest { id }),
    )
    .await
    .map(drop)
}

/// Detach, expected to succeed.
pub async fn detach(client: &mut Client, pid: i32) -> Result<()> {
    rpc_ok(
        &format!("Detach({pid})"),
        client.detach(DetachRequest { pid }),
    )
    .await
    .map(drop)
}

/// Starts `SetWatchpoint(spec)` on `client` (its own connection, already open) in a task,
/// bounded by [`ARM_TIMEOUT`].
pub fn spawn_set(
    mut client: Client,
    spec: wpd_proto::v1::WatchpointSpec,
) -> tokio::task::JoinHandle<Result<Result<SetWatchpointResponse, Status>>> {
    tokio::spawn(async move {
        match tokio::time::timeout(
            ARM_TIMEOUT,
            client.set_watchpoint(SetWatchpointRequest { spec: Some(spec) }),
        )
        .await
        {
            Ok(r) => Ok(r.map(tonic::Response::into_inner)),
            Err(_) => bail!("SetWatchpoint did not return within {ARM_TIMEOUT:?}"),
        }
    })
}
