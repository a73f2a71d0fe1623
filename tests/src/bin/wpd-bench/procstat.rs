//! Targets, and what `/proc` says of a process: CPU time by thread role, memory.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use wpd_proto::v1::{GetStatsRequest, GetStatsResponse};
use wpd_tests::{Backend, Client, TargetProc, attach, set_watchpoint_within, write_spec};

/// What the target's threads do while they are armed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Load {
    /// Workers store once a second and sleep.
    Idle,
    /// Workers spin (storing to `VARS[0]` every ~1000 spins) under SCHED_IDLE.
    Spin,
}

/// A target with `n` threads in all (main + n-1 workers).
pub(crate) async fn target(n: usize, load: Load) -> Result<TargetProc> {
    let workers = (n - 1).to_string();
    match load {
        Load::Idle => TargetProc::start(&["--threads", &workers, "--interval-us", "1000000"]).await,
        Load::Spin => {
            let t = TargetProc::start(&["--threads", &workers, "--spin", "--sched-idle"]).await?;
            // Let every spinner run for a while first: right after READY
            // they have just left the gate and the scheduler's queue is
            // in another state than it is for a busy process. Both the
            // floors and wpd then meet the same steady state.
            tokio::time::sleep(SPIN_SETTLE).await;
            Ok(t)
        }
    }
}

/// How long a spinning target runs before a measurement starts.
pub(crate) const SPIN_SETTLE: Duration = Duration::from_millis(500);

pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The name and the CPU time (user + system, µs) in one `/proc/.../stat`
/// text; clock-tick resolution.
pub(crate) fn stat_name_cpu_us(stat: &str) -> Option<(&str, f64)> {
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    // Fields after the comm: state is field 3, utime 14, stime 15.
    let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((&stat[open + 1..close], ticks * 1e6 / hz))
}

/// CPU time (user + system) a process has used so far, all its threads
/// (dead ones included), in µs; clock-tick resolution (`/proc/PID/stat`).
pub(crate) fn proc_cpu_us(pid: i32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    stat_name_cpu_us(&stat)
        .map(|(_, us)| us)
        .with_context(|| format!("bad {path}"))
}

/// CPU time (user + system, µs) of a process's live threads, summed by
/// role: the thread name with any `-N` suffix removed (`wpd-tracer-0` →
/// `wpd-tracer`). Threads that already exited are not counted.
pub(crate) fn thread_cpu_us_by_role(pid: i32) -> Result<BTreeMap<String, f64>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(stat) = std::fs::read_to_string(e?.path().join("stat")) else {
            continue; // exited meanwhile
        };
        let Some((comm, us)) = stat_name_cpu_us(&stat) else {
            continue;
        };
        let role = match comm.rsplit_once('-') {
            Some((head, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => head,
            _ => comm,
        };
        *out.entry(role.to_string()).or_insert(0.0) += us;
    }
    Ok(out)
}

/// Resident memory of a process: VmRSS and the part of it that is perf
/// ring buffers (mappings of `anon_inode:[perf_event]` in smaps), KiB; and
/// the size of those mappings.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Mem {
    pub(crate) rss: u64,
    pub(crate) rings: u64,
    pub(crate) rings_mapped: u64,
}

impl Mem {
    pub(crate) fn without_rings(self) -> i64 {
        self.rss as i64 - self.rings as i64
    }
}

pub(crate) fn mem_of(pid: i32) -> Result<Mem> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")?;
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let (mut rings, mut rings_mapped) = (0, 0);
    let mut in_perf = false;
    let kib = |v: &str| {
        v.split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping header: "start-end perms offset dev inode [path]".
            in_perf = line.contains("anon_inode:[perf_event]");
        } else if in_perf && let Some(v) = line.strip_prefix("Rss:") {
            rings += kib(v);
        } else if in_perf && let Some(v) = line.strip_prefix("Size:") {
            rings_mapped += kib(v);
        }
    }
    Ok(Mem {
        rss,
        rings,
        rings_mapped,
    })
}

pub(crate) async fn stats(client: &mut Client) -> Result<GetStatsResponse> {
    Ok(client.get_stats(GetStatsRequest {}).await?.into_inner())
}

/// Polls GetStats until `done` holds (every 20 ms), or fails after `timeout`.
pub(crate) async fn wait_stats(
    client: &mut Client,
    timeout: Duration,
    what: &str,
    done: impl Fn(&GetStatsResponse) -> bool,
) -> Result<GetStatsResponse> {
    let deadline = Instant::now() + timeout;
    loop {
        let s = stats(client).await?;
        if done(&s) {
            return Ok(s);
        }
        ensure!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}; last GetStats: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Arms `n` threads of a fresh daemon with one process-wide watchpoint at
/// `addr`; the watchpoint id.
pub(crate) async fn arm_all(
    client: &mut Client,
    backend: Backend,
    target: &TargetProc,
    addr: u64,
    n: usize,
) -> Result<u64> {
    attach(client, target.pid, backend).await?;
    let resp = set_watchpoint_within(
        client,
        write_spec(backend, target.pid, addr),
        Duration::from_secs(300),
    )
    .await?;
    let wp = resp.watchpoint.context("no watchpoint")?;
    ensure!(
        wp.armed_threads as usize >= n,
        "{backend:?}: armed {} of {n} threads",
        wp.armed_threads
    );
    Ok(wp.id)
}
