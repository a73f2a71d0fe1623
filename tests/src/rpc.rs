//! RPC helpers: requests, status checks, snapshots of what the daemon holds.

use crate::*;
use std::collections::HashSet;
use std::fmt::Debug;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use tokio::time::Instant;
use tonic::{Code, Status};
use wpd_proto::v1::{
    Access, AttachRequest, AttachResponse, Hit, ListThreadsRequest, ListThreadsResponse,
    ListWatchpointsRequest, ResumeRequest, SetWatchpointRequest, SetWatchpointResponse, SlotState,
    ThreadInfo, ThreadState, Watchpoint, WatchpointSpec,
};

/// A process-wide 8-byte write watchpoint spec on `backend` (which attaches the process with
/// that backend if it is not attached yet; [`Backend::Unspecified`]: the daemon's default).
pub fn write_spec(backend: Backend, pid: i32, address: u64) -> WatchpointSpec {
    WatchpointSpec {
        pid,
        tids: Vec::new(),
        address,
        length: 8,
        access: Access::Write as i32,
        backend: backend as i32,
        ..Default::default()
    }
}

/// `Attach{pid, backend}` that must succeed; checks the process got that backend (unless
/// [`Backend::Unspecified`]).
pub async fn attach(client: &mut Client, pid: i32, backend: Backend) -> Result<AttachResponse> {
    let what = format!("Attach(pid {pid}, {backend:?})");
    let resp = rpc_ok(
        &what,
        client.attach(AttachRequest {
            pid,
            backend: backend as i32,
            ..Default::default()
        }),
    )
    .await?;
    let process = resp
        .process
        .as_ref()
        .ok_or_else(|| anyhow!("{what}: response has no process"))?;
    ensure!(
        backend == Backend::Unspecified || process.backend() == backend,
        "{what}: the process is attached with {:?}",
        process.backend()
    );
    Ok(resp)
}

/// `Resume{pid, tids}` that must succeed; returns the resumed tids, sorted.
pub async fn resume(client: &mut Client, pid: i32, tids: &[i32]) -> Result<Vec<i32>> {
    let mut resumed = rpc_ok(
        &format!("Resume(pid {pid}, tids {tids:?})"),
        client.resume(ResumeRequest {
            pid,
            tids: tids.to_vec(),
        }),
    )
    .await?
    .resumed;
    resumed.sort_unstable();
    Ok(resumed)
}

/// `(tid, state)` of every thread `ListThreads{pid}` lists.
pub async fn thread_states(client: &mut Client, pid: i32) -> Result<Vec<(i32, ThreadState)>> {
    Ok(list_threads(client, pid, false)
        .await?
        .threads
        .iter()
        .map(|t| (t.tid, t.state()))
        .collect())
}

/// `SetWatchpoint` that must succeed within [`RPC_TIMEOUT`].
pub async fn set_watchpoint(
    client: &mut Client,
    spec: WatchpointSpec,
) -> Result<SetWatchpointResponse> {
    set_watchpoint_within(client, spec, RPC_TIMEOUT).await
}

/// `SetWatchpoint` that must succeed within `timeout`.
pub async fn set_watchpoint_within(
    client: &mut Client,
    spec: WatchpointSpec,
    timeout: Duration,
) -> Result<SetWatchpointResponse> {
    let what = format!("SetWatchpoint({spec:?})");
    let spec_backend = spec.backend();
    let resp = tokio::time::timeout(
        timeout,
        client.set_watchpoint(SetWatchpointRequest { spec: Some(spec) }),
    )
    .await
    .map_err(|_| anyhow!("{what} timed out after {timeout:?}"))?
    .map_err(|s| anyhow!("{what} failed: {}", status_line(&s)))?
    .into_inner();
    let wp = resp
        .watchpoint
        .as_ref()
        .ok_or_else(|| anyhow!("{what}: response has no watchpoint"))?;
    ensure!(
        spec_backend == Backend::Unspecified || wp.backend() == spec_backend,
        "{what}: asked for {spec_backend:?}, but the watchpoint is held by {:?}",
        wp.backend()
    );
    Ok(resp)
}

/// Runs an RPC future with [`RPC_TIMEOUT`], keeping the status as the error.
pub async fn rpc<T>(
    fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<Result<T, Status>> {
    match tokio::time::timeout(RPC_TIMEOUT, fut).await {
        Ok(r) => Ok(r.map(tonic::Response::into_inner)),
        Err(_) => bail!("RPC timed out after {RPC_TIMEOUT:?}"),
    }
}

/// Runs an RPC that must succeed.
pub async fn rpc_ok<T>(
    what: &str,
    fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T> {
    rpc(fut)
        .await
        .with_context(|| what.to_string())?
        .map_err(|s| anyhow!("{what} failed: {}", status_line(&s)))
}

/// `code: message` of a status.
pub fn status_line(s: &Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

/// Checks that `result` is an error with `code` whose message is not empty and contains every
/// one of `needles` (case-insensitive). Returns the status.
pub fn expect_status<T: Debug>(
    what: &str,
    result: Result<T, Status>,
    code: Code,
    needles: &[&str],
) -> Result<Status> {
    let status = match result {
        Ok(v) => bail!("{what}: expected {code:?}, but it succeeded: {v:?}"),
        Err(s) => s,
    };
    ensure!(
        status.code() == code,
        "{what}: expected {code:?}, got {}",
        status_line(&status)
    );
    let msg = status.message().to_lowercase();
    ensure!(
        !msg.trim().is_empty(),
        "{what}: {code:?} with an empty message"
    );
    for needle in needles {
        ensure!(
            msg.contains(&needle.to_lowercase()),
            "{what}: message {:?} does not mention {needle:?}",
            status.message()
        );
    }
    Ok(status)
}

/// Every decimal number in `text` (used to check that an error message names a tid).
pub fn numbers_in(text: &str) -> Vec<i64> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// The 8-byte little-endian value of a hit, if it has 8 bytes.
pub fn hit_value_u64(hit: &Hit) -> Option<u64> {
    Some(u64::from_le_bytes(hit.value.as_slice().try_into().ok()?))
}

/// Checks one hit of watchpoint `wp`: its id, pid, address, length and access, a tid among
/// `tids` (when not empty), and a value of `length` bytes.
pub fn check_hit(hit: &Hit, wp: &Watchpoint, tids: &HashSet<i32>) -> Result<()> {
    let spec = wp
        .spec
        .as_ref()
        .ok_or_else(|| anyhow!("watchpoint {} has no spec", wp.id))?;
    let ok = hit.watchpoint_id == wp.id
        && hit.pid == spec.pid
        && hit.address == spec.address
        && hit.length == spec.length
        && hit.access == spec.access
        && hit.value.len() == spec.length as usize
        && hit.backend == wp.backend
        && (tids.is_empty() || tids.contains(&hit.tid));
    ensure!(
        ok,
        "unexpected hit {hit:?}: expected watchpoint {} pid {} address {:#x} length {} access \
         {:?}, backend {:?}, a value of {} bytes and a tid among {tids:?}",
        wp.id,
        spec.pid,
        spec.address,
        spec.length,
        spec.access(),
        wp.backend(),
        spec.length
    );
    Ok(())
}

/// Watchpoint ids in the OURS slots of a thread, in slot order.
pub fn ours(thread: &ThreadInfo) -> Vec<u64> {
    thread
        .slots
        .iter()
        .filter(|s| s.state == SlotState::Ours as i32)
        .map(|s| s.watchpoint_id)
        .collect()
}

/// Number of slots of a thread in `state`.
pub fn count_slots(thread: &ThreadInfo, state: SlotState) -> usize {
    thread
        .slots
        .iter()
        .filter(|s| s.state == state as i32)
        .count()
}

/// What the daemon holds, without counters that move on their own (hit counts, times), so that
/// two snapshots compare equal when no request changed anything.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// (id, spec, process_wide, armed_threads, backend) per watchpoint.
    pub watchpoints: Vec<(u64, Option<WatchpointSpec>, bool, u32, i32)>,
    /// (pid, backend, threads, watchpoints) per attached process.
    pub processes: Vec<(i32, i32, u32, u32)>,
    /// `ListThreads{pid}` of the given pid, `None` when it answers NotFound.
    pub threads: Option<ListThreadsResponse>,
}

/// Fails when `after` differs from `before`, showing the differing lines of both.
pub fn ensure_unchanged(what: &str, before: &Snapshot, after: &Snapshot) -> Result<()> {
    if before == after {
        return Ok(());
    }
    let b = format!("{before:#?}");
    let a = format!("{after:#?}");
    let (bl, al): (Vec<&str>, Vec<&str>) = (b.lines().collect(), a.lines().collect());
    let mut diff = Vec::new();
    let mut context = "";
    for i in 0..bl.len().max(al.len()) {
        let (x, y) = (bl.get(i).copied(), al.get(i).copied());
        if let Some(line) = x.filter(|l| l.trim_start().starts_with("tid:")) {
            context = line.trim();
        }
        if x != y {
            diff.push(format!(
                "  line {i} ({context}):\n    before {}\n    after  {}",
                x.unwrap_or("<none>").trim(),
                y.unwrap_or("<none>").trim()
            ));
        }
        if diff.len() >= 12 {
            diff.push("  ...".into());
            break;
        }
    }
    bail!(
        "{what} changed the daemon's state (ListWatchpoints/ListThreads):\n{}",
        diff.join("\n")
    )
}

impl Snapshot {
    /// The same snapshot with FOREIGN slots shown as FREE: for comparisons that allow the
    /// daemon to learn, from a refusal, that the kernel gave a slot to someone else.
    pub fn foreign_as_free(&self) -> Snapshot {
        self.shown_as_free(&[SlotState::Foreign])
    }

    /// The same snapshot with slots in any of `states` shown as FREE (e.g. FOREIGN and
    /// RETAINED: what the kernel holds after a refused ptrace arm that was rolled back).
    pub fn shown_as_free(&self, states: &[SlotState]) -> Snapshot {
        let mut s = self.clone();
        for slot in s
            .threads
            .iter_mut()
            .flat_map(|l| l.threads.iter_mut())
            .flat_map(|t| t.slots.iter_mut())
        {
            if states.iter().any(|&st| slot.state == st as i32) {
                slot.state = SlotState::Free as i32;
            }
        }
        s
    }
}

/// Takes a [`Snapshot`] of all watchpoints and of `pid`'s threads.
pub async fn snapshot(client: &mut Client, pid: i32) -> Result<Snapshot> {
    let list = rpc_ok(
        "ListWatchpoints",
        client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
    )
    .await?;
    let mut watchpoints: Vec<_> = list
        .watchpoints
        .into_iter()
        .map(|w| (w.id, w.spec, w.process_wide, w.armed_threads, w.backend))
        .collect();
    watchpoints.sort_by_key(|w| w.0);
    let mut processes: Vec<_> = list
        .processes
        .into_iter()
        .map(|p| (p.pid, p.backend, p.threads, p.watchpoints))
        .collect();
    processes.sort_unstable();
    let threads = match rpc(client.list_threads(ListThreadsRequest {
        pid,
        tids: vec![],
        probe: false,
    }))
    .await?
    {
        Ok(t) => Some(t),
        Err(s) if s.code() == Code::NotFound => None,
        Err(s) => bail!("ListThreads({pid}) failed: {}", status_line(&s)),
    };
    Ok(Snapshot {
        watchpoints,
        processes,
        threads,
    })
}

/// `ListThreads{pid}` that must succeed.
pub async fn list_threads(
    client: &mut Client,
    pid: i32,
    probe: bool,
) -> Result<ListThreadsResponse> {
    rpc_ok(
        &format!("ListThreads(pid {pid}, probe {probe})"),
        client.list_threads(ListThreadsRequest {
            pid,
            tids: vec![],
            probe,
        }),
    )
    .await
}

/// Polls `f` every 50 ms until it yields `Some`, or fails after `timeout` with the last
/// observation.
pub async fn poll_until<T>(
    timeout: Duration,
    what: &str,
    mut f: impl AsyncFnMut() -> Result<Result<T, String>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        match f().await? {
            Ok(v) => return Ok(v),
            Err(last) => {
                if Instant::now() >= deadline {
                    bail!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (10 s at most) until the daemon counts `n` event subscribers (`GetStats`): a
/// subscriber started in another process (`wpctl events`) is listening once counted, and
/// not surely before, however long it was given.
pub async fn wait_for_subscribers(client: &mut Client, n: u32) -> Result<()> {
    poll_until(
        Duration::from_secs(10),
        &format!("{n} event subscribers"),
        async || {
            let s = rpc_ok(
                "GetStats",
                client.get_stats(wpd_proto::v1::GetStatsRequest {}),
            )
            .await?;
            Ok(if s.subscribers == n {
                Ok(())
            } else {
                Err(format!("{} subscribers", s.subscribers))
            })
        },
    )
    .await
}

/// A subscription to the hits of `pid` only.
pub fn hits_only(pid: i32) -> wpd_proto::v1::StreamEventsRequest {
    wpd_proto::v1::StreamEventsRequest {
        pid,
        watchpoint_ids: vec![],
        hits_only: true,
        raw: false,
        lease: false,
        ..Default::default()
    }
}

/// How the daemon's perf backend opens its events (`GetCapabilities`: "per-thread ..." where
/// `bpf()` is allowed, "per-cpu ..." where not or with `--perf-events per-cpu`).
pub async fn perf_events_of(daemon: &Daemon) -> Result<String> {
    let mut client = daemon.client().await?;
    let caps = rpc_ok(
        "GetCapabilities",
        client.get_capabilities(wpd_proto::v1::GetCapabilitiesRequest {}),
    )
    .await?;
    Ok(caps
        .backends
        .iter()
        .find(|b| b.backend == Backend::Perf as i32)
        .map(|b| b.events.clone())
        .unwrap_or_default())
}
