//! Thread churn (and ledger hold times): creating and joining threads under a process-wide watchpoint.

use crate::*;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use wpd_proto::v1::GetStatsResponse;
use wpd_tests::{
    Backend, Client, Daemon, TargetProc, attach, floor_collector, floor_perf_arm,
    floor_perf_inherit, floor_perf_track, set_watchpoint_within, write_spec,
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Churn {
    /// No watchpoint.
    Bare,
    /// 4 breakpoints, inherit=1, cpu=-1, opened by the bench on each creator.
    KernelInherit,
    /// wpd's event layout opened by the bench on each creator, no daemon:
    /// per CPU a thread-tracking event and 4 breakpoints, all inherited.
    Layout,
    /// A bare ptrace tracer in the bench (one thread, no daemon): the
    /// creators seized with `PTRACE_O_TRACECLONE`, each new thread's 4
    /// addresses and DR7 poked at its first stop: what the ptrace backend
    /// cannot avoid.
    PtraceTracer,
    /// 4 process-wide wpd watchpoints.
    Wpd(Backend),
}

impl Churn {
    fn describe(self) -> &'static str {
        match self {
            Churn::Bare => "no watchpoint",
            Churn::KernelInherit => "floor: 4 kernel-inherited breakpoints (inherit=1, cpu=-1)",
            Churn::Layout => "floor: wpd's perf event layout, inherited, no daemon",
            Churn::PtraceTracer => {
                "floor: bare ptrace tracer (clone stops, 4 addresses + DR7 poked per thread), no daemon"
            }
            Churn::Wpd(Backend::Ptrace) => "wpd, 4 process-wide watchpoints, ptrace backend",
            Churn::Wpd(_) => "wpd, 4 process-wide watchpoints, perf backend",
        }
    }
}

/// (p50, p99, max) ledger hold times, ns.
pub(crate) type Holds = (u64, u64, u64);

pub(crate) struct ChurnRun {
    /// µs of wall time per create+join (window / completed create+joins).
    us_per_op: f64,
    ops: u64,
    /// wpd only: holds after attach + arm (before the churn), after the churn.
    holds: Option<(Holds, Holds)>,
    /// wpd only: records the kernel dropped (ring full) during the churn.
    lost: u64,
}

pub(crate) fn holds(s: &GetStatsResponse) -> Holds {
    (
        s.ledger_hold_p50_ns,
        s.ledger_hold_p99_ns,
        s.ledger_hold_max_ns,
    )
}

pub(crate) async fn churn_once(
    k: usize,
    cfg: Churn,
    window: Duration,
    cpus: &[i32],
) -> Result<ChurnRun> {
    let mut target = TargetProc::start(&["--churn", "--threads", &k.to_string()]).await?;
    // Before churn-start, the creators are the only threads but main.
    let creators = target.worker_tids()?;
    ensure!(
        creators.len() == k,
        "expected {k} creators, found {creators:?}"
    );
    let watch: Vec<u64> = target.vars[4..8].to_vec();
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut wpd: Option<(Daemon, Client, GetStatsResponse)> = None;
    let mut tracer: Option<std::thread::JoinHandle<Result<()>>> = None;
    match cfg {
        Churn::Bare => {}
        Churn::KernelInherit => {
            for &t in &creators {
                for &a in &watch {
                    fds.push(floor_perf_inherit(t, a)?);
                }
            }
        }
        Churn::Layout => {
            let collectors: Vec<OwnedFd> = cpus
                .iter()
                .map(|&c| floor_collector(c))
                .collect::<Result<_>>()?;
            for &t in &creators {
                for (i, &cpu) in cpus.iter().enumerate() {
                    fds.push(floor_perf_track(t, cpu, &collectors[i])?);
                    for &a in &watch {
                        fds.push(floor_perf_arm(t, a, cpu, &collectors[i])?);
                    }
                }
            }
            fds.extend(collectors);
        }
        Churn::PtraceTracer => {
            tracer = Some(bare_tracer(creators.clone(), watch.clone())?);
        }
        Churn::Wpd(backend) => {
            let daemon = Daemon::start().await?;
            let mut client = daemon.client().await?;
            attach(&mut client, target.pid, backend).await?;
            for &a in &watch {
                set_watchpoint_within(
                    &mut client,
                    write_spec(backend, target.pid, a),
                    Duration::from_secs(60),
                )
                .await?;
            }
            let before = stats(&mut client).await?;
            wpd = Some((daemon, client, before));
        }
    }
    target.cmd("churn-start").await?;
    tokio::time::sleep(window / 5).await;
    target.cmd("churn-stats").await?; // starts the measured window
    // Each churn-stats reports since the previous one. On a loaded machine
    // a short window (--smoke) can end before a creator got a CPU: the
    // window is then extended, up to 40 times, until a thread was made.
    let (mut ops, mut ns, mut reply) = (0u64, 0f64, String::new());
    for _ in 0..40 {
        tokio::time::sleep(window).await;
        reply = target
            .cmd_within("churn-stats", Duration::from_secs(60))
            .await?
            .context("no reply to churn-stats")?;
        ops += wpd_tests::field::<u64>(&reply, "n")?;
        ns += wpd_tests::field::<f64>(&reply, "ns")?;
        if ops > 0 {
            break;
        }
    }
    ensure!(
        ops > 0,
        "no thread was created in 40 × {window:?} ({reply})"
    );
    let mut run = ChurnRun {
        us_per_op: ns / 1e3 / ops as f64,
        ops,
        holds: None,
        lost: 0,
    };
    if let Some((daemon, mut client, before)) = wpd {
        let after = stats(&mut client).await?;
        ensure!(
            after.watchpoints == 4 && after.processes == 1,
            "the daemon lost its watchpoints during the churn: {after:?}"
        );
        run.holds = Some((holds(&before), holds(&after)));
        run.lost = after.kernel_lost - before.kernel_lost;
        drop(target);
        drop(daemon);
    } else if let Some(t) = tracer {
        // Killed, every tracee ends, and the tracer with them.
        drop(target);
        t.join()
            .map_err(|_| anyhow::anyhow!("the bare tracer panicked"))??;
    }
    drop(fds);
    Ok(run)
}

/// DR7 with slots 0-3 enabled (L0-L3), each a write watch of 8 bytes.
pub(crate) const DR7_W8_SLOTS0_3: u64 = 0x9999_0055;

/// Starts the bare ptrace tracer of [`Churn::PtraceTracer`] on `creators`:
/// a thread that seizes them (new threads are attached by the kernel) and
/// programs DR0-DR3 = `addrs` and DR7 on every new thread at its first
/// stop; other stops are resumed at once, signals passed on. It ends when
/// every tracee has gone (the target is killed after the window).
pub(crate) fn bare_tracer(
    creators: Vec<i32>,
    addrs: Vec<u64>,
) -> Result<std::thread::JoinHandle<Result<()>>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || -> Result<()> {
        realtime_thread();
        let seized = (|| {
            for &t in &creators {
                // SAFETY: plain ptrace request on a thread of a process we started.
                let r = unsafe {
                    libc::ptrace(
                        libc::PTRACE_SEIZE,
                        t,
                        0,
                        libc::PTRACE_O_TRACECLONE as libc::c_long,
                    )
                };
                ensure!(
                    r == 0,
                    "PTRACE_SEIZE {t}: {}",
                    std::io::Error::last_os_error()
                );
            }
            Ok(())
        })();
        let ok = seized.is_ok();
        let _ = tx.send(seized);
        if !ok {
            return Ok(());
        }
        let mut armed: std::collections::HashSet<i32> = creators.iter().copied().collect();
        loop {
            let mut status = 0;
            // SAFETY: waiting for our own tracees. `__WNOTHREAD`: only this
            // thread's, never the bench's children (targets, daemons),
            // whose exits belong to their handles.
            let t = unsafe { libc::waitpid(-1, &mut status, libc::__WALL | libc::__WNOTHREAD) };
            if t < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Ok(()); // ECHILD: every tracee is gone
            }
            if !libc::WIFSTOPPED(status) {
                armed.remove(&t);
                continue;
            }
            let sig = libc::WSTOPSIG(status);
            let event = status >> 16;
            let deliver = if event != 0 {
                if event == libc::PTRACE_EVENT_STOP && armed.insert(t) {
                    // A new thread's first stop: its registers.
                    for (i, &a) in addrs.iter().take(4).enumerate() {
                        // SAFETY: poking our own stopped tracee's user area.
                        unsafe { libc::ptrace(libc::PTRACE_POKEUSER, t, DR0 + 8 * i, a) };
                    }
                    // SAFETY: as above.
                    unsafe { libc::ptrace(libc::PTRACE_POKEUSER, t, DR7, DR7_W8_SLOTS0_3) };
                }
                0
            } else if sig == libc::SIGTRAP {
                0
            } else {
                sig
            };
            // SAFETY: restarting our own stopped tracee.
            unsafe { libc::ptrace(libc::PTRACE_CONT, t, 0, deliver as libc::c_long) };
        }
    });
    rx.recv()
        .map_err(|_| anyhow::anyhow!("the bare tracer ended before seizing"))??;
    Ok(h)
}

pub(crate) async fn section_churn(args: &Args, cpus: &[i32]) -> Result<()> {
    let t0 = Instant::now();
    let mut cfgs = vec![Churn::Wpd(Backend::Perf), Churn::Wpd(Backend::Ptrace)];
    if args.has("churn") {
        cfgs = vec![
            Churn::Bare,
            Churn::KernelInherit,
            Churn::Layout,
            Churn::Wpd(Backend::Perf),
            Churn::PtraceTracer,
            Churn::Wpd(Backend::Ptrace),
        ];
    }
    // results[k index][cfg index] = runs
    let mut results: Vec<Vec<Vec<ChurnRun>>> = Vec::new();
    for &k in &args.churn_threads {
        let mut per_cfg: Vec<Vec<ChurnRun>> = cfgs.iter().map(|_| Vec::new()).collect();
        // Interleaved: every configuration once per rep.
        for _ in 0..args.reps {
            for (i, &cfg) in cfgs.iter().enumerate() {
                per_cfg[i].push(
                    churn_once(k, cfg, args.window, cpus)
                        .await
                        .with_context(|| format!("churn, {k} creators, {cfg:?}"))?,
                );
            }
        }
        results.push(per_cfg);
    }
    if args.has("churn") {
        println!(
            "## thread churn: create + join while 4 watchpoints are set ({} ms windows)\n",
            args.window.as_millis()
        );
        println!(
            "| creators | what | µs per create+join | extra µs vs none | ratio to kernel-inherit floor | create+joins in window | kernel records lost |"
        );
        println!("|---:|---|---:|---:|---:|---:|---:|");
        for (ki, &k) in args.churn_threads.iter().enumerate() {
            let med: Vec<f64> = results[ki]
                .iter()
                .map(|runs| median(runs.iter().map(|r| r.us_per_op).collect()))
                .collect();
            let bare = med[0];
            let floor = med[1];
            let tracer_floor = cfgs.iter().position(|&c| c == Churn::PtraceTracer);
            for (i, &cfg) in cfgs.iter().enumerate() {
                let runs = &results[ki][i];
                let ops = median(runs.iter().map(|r| r.ops as f64).collect());
                let lost = match cfg {
                    Churn::Wpd(_) => runs.iter().map(|r| r.lost).max().unwrap_or(0).to_string(),
                    _ => "–".into(),
                };
                println!(
                    "| {k} | {} | {:.1} | {} | {} | {ops:.0} | {lost} |",
                    cfg.describe(),
                    med[i],
                    if cfg == Churn::Bare {
                        "–".to_string()
                    } else {
                        format!("{:+.1}", med[i] - bare)
                    },
                    match (cfg, tracer_floor) {
                        (Churn::Bare | Churn::KernelInherit, _) => "–".to_string(),
                        (Churn::Wpd(Backend::Ptrace), Some(t)) => format!(
                            "{:.2}× ({:.2}× the bare ptrace tracer)",
                            med[i] / floor,
                            med[i] / med[t]
                        ),
                        _ => format!("{:.2}×", med[i] / floor),
                    }
                );
            }
        }
        flush();
    }
    if args.has("ledger") {
        println!("\n## ledger lock hold times under thread churn (GetStats)\n");
        println!(
            "| creators | backend | after attach + 4 arms: p50 / p99 / max ns | after the churn: p50 / p99 / max ns | create+joins during the run |"
        );
        println!("|---:|---|---|---|---:|");
        for (ki, &k) in args.churn_threads.iter().enumerate() {
            for (i, &cfg) in cfgs.iter().enumerate() {
                let Churn::Wpd(backend) = cfg else { continue };
                let runs = &results[ki][i];
                let pick = |f: &dyn Fn(&ChurnRun) -> u64| {
                    median(runs.iter().map(|r| f(r) as f64).collect()) as u64
                };
                let b = (
                    pick(&|r| r.holds.map_or(0, |h| h.0.0)),
                    pick(&|r| r.holds.map_or(0, |h| h.0.1)),
                    pick(&|r| r.holds.map_or(0, |h| h.0.2)),
                );
                let a = (
                    pick(&|r| r.holds.map_or(0, |h| h.1.0)),
                    pick(&|r| r.holds.map_or(0, |h| h.1.1)),
                    pick(&|r| r.holds.map_or(0, |h| h.1.2)),
                );
                println!(
                    "| {k} | {} | {} / {} / {} | {} / {} / {} | {} |",
                    backend_name(backend),
                    b.0,
                    b.1,
                    b.2,
                    a.0,
                    a.1,
                    a.2,
                    pick(&|r| r.ops)
                );
            }
        }
        if args.reps > 1 {
            println!(
                "\nEach figure is the median over {} runs (one fresh daemon per run).",
                args.reps
            );
        }
        flush();
    }
    section_done(t0);
    Ok(())
}
