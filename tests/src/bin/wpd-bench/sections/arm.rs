//! Mass-arm: wpd against the floors of the same syscalls and against its peers (gdb, perf).

use crate::*;
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use wpd_tests::{
    Backend, Daemon, floor_collector, floor_perf_arm, floor_perf_track, floor_probe_slot,
};

pub(crate) async fn section_arm(args: &Args, cpus: &[i32], load: Load) -> Result<()> {
    let t0 = Instant::now();
    match load {
        Load::Idle => println!("## mass-arm: one process-wide write watchpoint, idle target\n"),
        Load::Spin => println!(
            "## mass-arm: one process-wide write watchpoint, spinning target (SCHED_IDLE spinners)\n"
        ),
    }
    println!(
        "| threads | what | total ms (median) | min–max ms | µs/thread | ratio to its floor |"
    );
    println!("|---:|---|---:|---:|---:|---:|");
    flush();
    let sizes = match load {
        Load::Idle => &args.threads,
        Load::Spin => &args.spin_threads,
    };
    for &n in sizes {
        let row = |what: &str, t: Spread, floor: Option<f64>| {
            let range = if t.min < t.max {
                format!("{:.1}–{:.1}", t.min, t.max)
            } else {
                "–".into()
            };
            println!(
                "| {n} | {what} | {:.1} | {range} | {:.1} | {} |",
                t.med,
                t.med * 1e3 / n as f64,
                floor
                    .map(|f| format!("{:.2}×", t.med / f))
                    .unwrap_or_else(|| "–".into())
            );
            flush();
        };
        let skip = |what: &str, why: &str| {
            println!("| {n} | {what}: {why} |  |  |  |  |");
            flush();
        };
        let mut wpd_perf = None;
        match perf_fds_skip(n, cpus.len(), 1) {
            Some(why) => skip("floor: perf breakpoint syscalls", &why),
            None => {
                let t = spread(rep(args.reps, || floor_perf(n, load, cpus, false, false)).await?);
                row("floor: perf breakpoint syscalls, no daemon", t, None);
            }
        }
        match perf_fds_skip(n, cpus.len(), 2) {
            Some(why) => {
                skip("floor: perf breakpoint + thread-tracking syscalls", &why);
                skip("wpd, perf backend", &why);
                let (t, outcome) = wpd_perf_refusal(n, load).await?;
                println!("| {n} | wpd, perf backend, asked anyway: {outcome} | {t:.1} |  |  |  |");
                flush();
            }
            None => {
                let floor =
                    spread(rep(args.reps, || floor_perf(n, load, cpus, true, false)).await?);
                row(
                    "floor: perf breakpoint + thread-tracking syscalls",
                    floor,
                    None,
                );
                let per_cpu =
                    spread(rep(args.reps, || floor_perf(n, load, cpus, true, true)).await?);
                row(
                    "floor: the same, one opener thread per CPU, no daemon",
                    per_cpu,
                    Some(floor.med),
                );
                let t = spread(rep(args.reps, || wpd_arm(n, load, Backend::Perf)).await?);
                row("wpd, perf backend (attach + arm)", t, Some(floor.med));
                println!(
                    "| {n} | wpd perf is {:.2}× the per-CPU openers (medians) |  |  |  |  |",
                    t.med / per_cpu.med
                );
                wpd_perf = Some(t);
            }
        }
        let floor_bare = spread(rep(args.reps, || floor_ptrace(n, load, false)).await?);
        row("floor: ptrace syscalls, no daemon", floor_bare, None);
        let floor_probe = spread(rep(args.reps, || floor_ptrace(n, load, true)).await?);
        row(
            "floor: free-slot check + ptrace syscalls, no daemon",
            floor_probe,
            None,
        );
        let wpd_ptrace = spread(rep(args.reps, || wpd_arm(n, load, Backend::Ptrace)).await?);
        row(
            "wpd, ptrace backend (attach + arm)",
            wpd_ptrace,
            Some(floor_probe.med),
        );
        if args.peers && load == Load::Idle {
            match peers(n, Peer::Gdb, args).await? {
                Ok(t) => {
                    row("gdb -batch: attach, watch, detach", t, None);
                    let perf = wpd_perf
                        .map(|p| format!("{:.1}× wpd perf, ", t.med / p.med))
                        .unwrap_or_default();
                    println!(
                        "| {n} | gdb takes {perf}{:.1}× wpd ptrace (medians) |  |  |  |  |",
                        t.med / wpd_ptrace.med,
                    );
                    flush();
                }
                Err(why) => println!("| {n} | gdb -batch: {why} |  |  |  |  |"),
            }
            match peers(n, Peer::PerfStat, args).await? {
                Ok(t) => row("perf stat -e mem:ADDR:w -p PID", t, None),
                Err(why) => println!("| {n} | perf stat: {why} |  |  |  |  |"),
            }
        }
        flush();
    }
    section_done(t0);
    Ok(())
}

/// Moves the calling thread to `SCHED_FIFO` priority 1, as wpd runs its
/// threads (`--priority realtime`, the default), with
/// `SCHED_RESET_ON_FORK` so that the targets and peers the bench starts run
/// at normal priority. Every thread of the bench runs so (the runtime's
/// start hook): the floors get the same scheduling as the daemon they are
/// compared with, and the client that times the daemon is not the one
/// waiting. At normal priority next to 1,000 busy `SCHED_IDLE` threads,
/// a process waited up to 0.35 s for a CPU after its reply had come
/// (`perf sched timehist`), which is the machine's scheduler, not wpd.
/// False if the kernel refused (no `CAP_SYS_NICE`).
pub(crate) fn realtime_thread() -> bool {
    let p = libc::sched_param { sched_priority: 1 };
    // SAFETY: changes only the calling thread's policy.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &p) == 0 }
}

/// The perf syscalls of a process-wide arm, in a bare loop; `tracked`: also
/// the thread-tracking events wpd opens at attach. `per_cpu`: the threads
/// cut into one contiguous range per CPU, each range opened by its own
/// thread (as wpd's arm passes do); otherwise one loop on one thread.
pub(crate) async fn floor_perf(
    n: usize,
    load: Load,
    cpus: &[i32],
    tracked: bool,
    per_cpu: bool,
) -> Result<f64> {
    let target = target(n, load).await?;
    let tids = target.tids()?;
    let addr = target.vars[QUIET_VAR];
    let collectors: Vec<OwnedFd> = cpus
        .iter()
        .map(|&c| floor_collector(c))
        .collect::<Result<_>>()?;
    let open_range = |tids: &[i32]| -> Result<Vec<OwnedFd>> {
        let mut fds = Vec::with_capacity(tids.len() * cpus.len() * 2);
        for &tid in tids {
            for (i, &cpu) in cpus.iter().enumerate() {
                if tracked {
                    fds.push(floor_perf_track(tid, cpu, &collectors[i])?);
                }
                fds.push(floor_perf_arm(tid, addr, cpu, &collectors[i])?);
            }
        }
        Ok(fds)
    };
    let t0 = Instant::now();
    let fds = if per_cpu {
        let size = tids.len().div_ceil(cpus.len().max(1));
        std::thread::scope(|s| {
            let handles: Vec<_> = tids
                .chunks(size)
                .map(|range| {
                    s.spawn(|| {
                        realtime_thread();
                        open_range(range)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .map_err(|_| anyhow::anyhow!("an opener panicked"))?
                })
                .collect::<Result<Vec<_>>>()
        })?
    } else {
        vec![open_range(&tids)?]
    };
    let t = ms(t0.elapsed());
    drop(fds);
    Ok(t)
}

/// The ptrace syscalls of a process-wide arm (seize, interrupt all, reap,
/// two pokes, continue), in a bare loop on one thread.
pub(crate) async fn floor_ptrace(n: usize, load: Load, probe: bool) -> Result<f64> {
    let target = target(n, load).await?;
    let tids = target.tids()?;
    let addr = target.vars[QUIET_VAR];
    let t =
        tokio::task::spawn_blocking(move || ptrace_floor_blocking(&tids, addr, probe)).await??;
    drop(target);
    Ok(t)
}

pub(crate) const DR0: usize = 848;
pub(crate) const DR7: usize = 848 + 7 * 8;
/// DR7: slot 0 enabled (L0), write, 8 bytes.
pub(crate) const DR7_W8_SLOT0: u64 = 0x90001;

/// `probe`: stop every thread and check its free slot before writing any
/// register, as wpd does (see `floor_probe_slot`).
pub(crate) fn ptrace_floor_blocking(tids: &[i32], addr: u64, probe: bool) -> Result<f64> {
    let t0 = Instant::now();
    for &t in tids {
        // SAFETY: plain ptrace request on a thread of a process we started.
        if unsafe { libc::ptrace(libc::PTRACE_SEIZE, t, 0, 0) } != 0 {
            bail!("PTRACE_SEIZE {t}: {}", std::io::Error::last_os_error());
        }
    }
    for &t in tids {
        // SAFETY: as above.
        unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, t, 0, 0) };
    }
    if probe {
        // wpd's order: every thread stopped, every free slot checked, then
        // the registers written.
        for &t in tids {
            let mut status = 0;
            // SAFETY: waiting for our own tracee.
            unsafe { libc::waitpid(t, &mut status, libc::__WALL) };
        }
        for &t in tids {
            ensure!(floor_probe_slot(t)?, "thread {t} has no free slot");
        }
    }
    for &t in tids {
        let mut status = 0;
        // SAFETY: waiting for (if not yet) and programming our own tracee.
        unsafe {
            if !probe {
                libc::waitpid(t, &mut status, libc::__WALL);
            }
            libc::ptrace(libc::PTRACE_POKEUSER, t, DR0, addr);
            libc::ptrace(libc::PTRACE_POKEUSER, t, DR7, DR7_W8_SLOT0);
            libc::ptrace(libc::PTRACE_CONT, t, 0, 0);
        }
    }
    let t = ms(t0.elapsed());
    // Clean up (not timed): DR7 = 0 before detaching, or the target dies
    // on its next hit.
    for &t in tids {
        // SAFETY: as above.
        unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, t, 0, 0) };
    }
    for &t in tids {
        let mut status = 0;
        // SAFETY: as above.
        unsafe {
            libc::waitpid(t, &mut status, libc::__WALL);
            libc::ptrace(libc::PTRACE_POKEUSER, t, DR7, 0u64);
            libc::ptrace(libc::PTRACE_DETACH, t, 0, 0);
        }
    }
    Ok(t)
}

/// wpd's attach + process-wide arm, as a client sees it.
pub(crate) async fn wpd_arm(n: usize, load: Load, backend: Backend) -> Result<f64> {
    let target = target(n, load).await?;
    let daemon = Daemon::start().await?;
    let mut client = daemon.client().await?;
    let t0 = Instant::now();
    arm_all(&mut client, backend, &target, target.vars[QUIET_VAR], n).await?;
    let t = ms(t0.elapsed());
    drop(daemon);
    drop(target);
    Ok(t)
}

/// Where the perf backend's fds cannot fit: how long wpd takes to say so
/// (an attach of the `n`-thread target), and what it said.
pub(crate) async fn wpd_perf_refusal(n: usize, load: Load) -> Result<(f64, String)> {
    let target = target(n, load).await?;
    let daemon = Daemon::start().await?;
    let mut client = daemon.client().await?;
    let t0 = Instant::now();
    let r = client
        .attach(wpd_proto::v1::AttachRequest {
            pid: target.pid,
            backend: Backend::Perf as i32,
            ..Default::default()
        })
        .await;
    let t = ms(t0.elapsed());
    let outcome = match r {
        Ok(_) => "attached (the limit was enough)".to_string(),
        Err(s) => {
            let reason = tonic_types::StatusExt::get_details_error_info(&s)
                .map(|i| i.reason)
                .unwrap_or_default();
            let first = s.message().split(" (nothing").next().unwrap_or_default();
            format!("refused, {:?} / {reason}: {first}", s.code())
        }
    };
    drop(daemon);
    drop(target);
    Ok((t, outcome))
}

/// `--reps` runs of a peer: their spread, or why there is none.
pub(crate) async fn peers(n: usize, which: Peer, args: &Args) -> Result<Result<Spread, String>> {
    let mut v = Vec::new();
    for _ in 0..args.reps {
        match peer(n, which, args.peer_timeout).await? {
            PeerResult::Took(t) => v.push(t),
            other => return Ok(Err(other.describe())),
        }
    }
    Ok(Ok(spread(v)))
}

#[derive(Clone, Copy)]
pub(crate) enum Peer {
    Gdb,
    PerfStat,
}

pub(crate) enum PeerResult {
    Took(f64),
    NotInstalled,
    Failed(String),
    TimedOut(Duration),
}

impl PeerResult {
    fn describe(&self) -> String {
        match self {
            PeerResult::Took(t) => format!("{t:.1} ms"),
            PeerResult::NotInstalled => "not installed: skipped".into(),
            PeerResult::Failed(why) => format!("failed ({why})"),
            PeerResult::TimedOut(d) => format!("did not finish within {} s: killed", d.as_secs()),
        }
    }
}

/// Wall time of a peer tool doing the same job, if it is installed.
pub(crate) async fn peer(n: usize, which: Peer, timeout: Duration) -> Result<PeerResult> {
    let tool = match which {
        Peer::Gdb => "gdb",
        Peer::PerfStat => "perf",
    };
    if std::process::Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        return Ok(PeerResult::NotInstalled);
    }
    let target = target(n, Load::Idle).await?;
    let (pid, addr) = (target.pid.to_string(), target.vars[QUIET_VAR]);
    let mut cmd = tokio::process::Command::new(tool);
    match which {
        Peer::Gdb => cmd.args([
            "-batch",
            "-nx",
            "-p",
            &pid,
            "-ex",
            &format!("watch *(long*){addr:#x}"),
            "-ex",
            "detach",
        ]),
        Peer::PerfStat => cmd.args([
            "stat",
            "-e",
            &format!("mem:{addr:#x}/8:w"),
            "-p",
            &pid,
            "--",
            "true",
        ]),
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let t0 = Instant::now();
    let out = match tokio::time::timeout(timeout, cmd.status()).await {
        Err(_) => return Ok(PeerResult::TimedOut(timeout)),
        Ok(r) => r?,
    };
    let t = ms(t0.elapsed());
    drop(target);
    Ok(if out.success() {
        PeerResult::Took(t)
    } else {
        PeerResult::Failed(out.to_string())
    })
}
