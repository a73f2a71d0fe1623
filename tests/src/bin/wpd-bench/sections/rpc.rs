//! RPC latency: each call against the floor of a gRPC round trip and of the syscalls it makes.

use crate::*;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use wpd_proto::v1::{
    GetCapabilitiesRequest, ListThreadsRequest, RemoveWatchpointRequest, WatchpointSpec,
};
use wpd_tests::{
    Backend, Daemon, floor_collector, floor_perf_arm, set_watchpoint_within, write_spec,
};

/// Latencies (µs) of `count` calls of `f`.
pub(crate) async fn lat<F, Fut>(count: usize, mut f: F) -> Result<Vec<f64>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut v = Vec::with_capacity(count);
    for _ in 0..count {
        let t0 = Instant::now();
        f().await?;
        v.push(us(t0.elapsed()));
    }
    Ok(v)
}

/// The perf syscalls of a thread-scoped set (one breakpoint per CPU) and
/// remove (close them), `pairs` times: (set µs, remove µs).
pub(crate) fn perf_pair_floor(
    tid: i32,
    addr: u64,
    cpus: &[i32],
    pairs: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let collectors: Vec<OwnedFd> = cpus
        .iter()
        .map(|&c| floor_collector(c))
        .collect::<Result<_>>()?;
    let (mut set, mut rm) = (Vec::new(), Vec::new());
    for _ in 0..pairs {
        let t0 = Instant::now();
        let fds = cpus
            .iter()
            .enumerate()
            .map(|(i, &cpu)| floor_perf_arm(tid, addr, cpu, &collectors[i]))
            .collect::<Result<Vec<_>>>()?;
        set.push(us(t0.elapsed()));
        let t0 = Instant::now();
        drop(fds);
        rm.push(us(t0.elapsed()));
    }
    Ok((set, rm))
}

/// The ptrace syscalls of a thread-scoped set (interrupt, wait, poke DR0 and
/// DR7, continue) and remove (interrupt, wait, poke DR7, continue) on a
/// thread already seized (not timed), `pairs` times: (set µs, remove µs).
pub(crate) fn ptrace_pair_floor(tid: i32, addr: u64, pairs: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    // SAFETY (every block below): plain ptrace requests on a thread of a
    // process we started, and waitpid on our own tracee.
    if unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) } != 0 {
        bail!("PTRACE_SEIZE {tid}: {}", std::io::Error::last_os_error());
    }
    let stop = || {
        let mut status = 0;
        // SAFETY: see above.
        unsafe {
            libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0);
            libc::waitpid(tid, &mut status, libc::__WALL);
        }
    };
    let (mut set, mut rm) = (Vec::new(), Vec::new());
    for _ in 0..pairs {
        let t0 = Instant::now();
        stop();
        // SAFETY: see above.
        unsafe {
            libc::ptrace(libc::PTRACE_POKEUSER, tid, DR0, addr);
            libc::ptrace(libc::PTRACE_POKEUSER, tid, DR7, DR7_W8_SLOT0);
            libc::ptrace(libc::PTRACE_CONT, tid, 0, 0);
        }
        set.push(us(t0.elapsed()));
        let t0 = Instant::now();
        stop();
        // SAFETY: see above.
        unsafe {
            libc::ptrace(libc::PTRACE_POKEUSER, tid, DR7, 0u64);
            libc::ptrace(libc::PTRACE_CONT, tid, 0, 0);
        }
        rm.push(us(t0.elapsed()));
    }
    stop();
    // SAFETY: see above.
    unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
    Ok((set, rm))
}

/// What ListThreads must at least do without a daemon: list
/// `/proc/PID/task` and read every thread's comm. µs.
pub(crate) fn list_floor(pid: i32) -> Result<f64> {
    let t0 = Instant::now();
    let dir = format!("/proc/{pid}/task");
    let mut names = 0usize;
    for e in std::fs::read_dir(&dir)? {
        let e = e?;
        if let Ok(c) = std::fs::read_to_string(e.path().join("comm")) {
            names += c.len();
        }
    }
    std::hint::black_box(names);
    Ok(us(t0.elapsed()))
}

pub(crate) async fn section_rpc(args: &Args, cpus: &[i32]) -> Result<()> {
    let t0 = Instant::now();
    println!(
        "## RPC latency: SetWatchpoint/RemoveWatchpoint on one thread ({} pairs), ListThreads ({} calls)\n",
        args.rpc_pairs, args.list_calls
    );
    println!("| threads | call | p50 µs | p99 µs | p50 ratio to its floor |");
    println!("|---:|---|---:|---:|---:|");
    let row = |n: usize, what: &str, v: (f64, f64), floor: Option<f64>| {
        format!(
            "| {n} | {what} | {:.1} | {:.1} | {} |",
            v.0,
            v.1,
            floor
                .map(|f| format!("{:.2}×", v.0 / f))
                .unwrap_or_else(|| "–".into())
        )
    };
    for &n in &args.threads {
        let target = target(n, Load::Idle).await?;
        let pid = target.pid;
        let workers = target.worker_tids()?;
        // A worker in the middle (not the main thread: it reads stdin).
        let tid = workers.get(workers.len() / 2).copied().unwrap_or(pid);
        let addr = target.vars[QUIET_VAR];
        let pairs = args.rpc_pairs;
        // Floors first: the ptrace one needs the thread untraced.
        let (pf_set, pf_rm) = perf_pair_floor(tid, addr, cpus, pairs)?;
        let (pt_set, pt_rm) =
            tokio::task::spawn_blocking(move || ptrace_pair_floor(tid, addr, pairs)).await??;
        let mut lf = Vec::new();
        for _ in 0..args.list_calls {
            lf.push(list_floor(pid)?);
        }
        let lf = p50_p99(lf);
        let mut grpc = Vec::new();
        let mut rows = Vec::new();
        for backend in [Backend::Perf, Backend::Ptrace] {
            if backend == Backend::Perf
                && let Some(why) = perf_fds_skip(n, cpus.len(), 2)
            {
                rows.push(format!("| {n} | wpd perf: {why} |  |  |  |"));
                continue;
            }
            let daemon = Daemon::start().await?;
            let mut client = daemon.client().await?;
            arm_all(&mut client, backend, &target, addr, n).await?;
            // The gRPC round trip: a call that does next to nothing.
            grpc.extend(
                lat(pairs, || {
                    let mut c = client.clone();
                    async move {
                        c.get_capabilities(GetCapabilitiesRequest {}).await?;
                        Ok(())
                    }
                })
                .await?,
            );
            let (mut set, mut rm) = (Vec::new(), Vec::new());
            for i in 0..pairs {
                // Thread-scoped, in a slot the process-wide watchpoint leaves free.
                let spec = WatchpointSpec {
                    tids: vec![tid],
                    address: target.vars[4 + i % 4],
                    ..write_spec(backend, pid, 0)
                };
                let t1 = Instant::now();
                let wp = set_watchpoint_within(&mut client, spec, Duration::from_secs(30))
                    .await?
                    .watchpoint
                    .context("no watchpoint")?;
                set.push(us(t1.elapsed()));
                ensure!(wp.armed_threads == 1, "armed {} threads", wp.armed_threads);
                let t1 = Instant::now();
                client
                    .remove_watchpoint(RemoveWatchpointRequest { id: wp.id })
                    .await?;
                rm.push(us(t1.elapsed()));
            }
            let list = lat(args.list_calls, || {
                let mut c = client.clone();
                async move {
                    let r = c
                        .list_threads(ListThreadsRequest {
                            pid,
                            tids: vec![],
                            probe: false,
                        })
                        .await?
                        .into_inner();
                    ensure!(
                        r.threads.len() >= n,
                        "ListThreads listed {}",
                        r.threads.len()
                    );
                    Ok(())
                }
            })
            .await?;
            drop(daemon);
            let name = backend_name(backend);
            let (fs, fr) = if backend == Backend::Ptrace {
                (p50_p99(pt_set.clone()), p50_p99(pt_rm.clone()))
            } else {
                (p50_p99(pf_set.clone()), p50_p99(pf_rm.clone()))
            };
            let (set, rm, list) = (p50_p99(set), p50_p99(rm), p50_p99(list));
            rows.push(row(
                n,
                &format!("floor: {name} syscalls of a one-thread set, no daemon"),
                fs,
                None,
            ));
            rows.push(row(
                n,
                &format!("wpd {name}: SetWatchpoint, 1 thread"),
                set,
                Some(fs.0),
            ));
            rows.push(row(
                n,
                &format!("floor: {name} syscalls of a one-thread remove, no daemon"),
                fr,
                None,
            ));
            rows.push(row(
                n,
                &format!("wpd {name}: RemoveWatchpoint, 1 thread"),
                rm,
                Some(fr.0),
            ));
            rows.push(row(
                n,
                &format!("wpd {name}: ListThreads, all threads"),
                list,
                Some(lf.0),
            ));
        }
        let grpc = p50_p99(grpc);
        println!(
            "{}",
            row(n, "floor: gRPC round trip (GetCapabilities)", grpc, None)
        );
        println!(
            "{}",
            row(
                n,
                "floor: list /proc/PID/task + read every comm, no daemon",
                lf,
                None,
            )
        );
        for r in rows {
            println!("{r}");
        }
        drop(target);
        flush();
    }
    section_done(t0);
    Ok(())
}
