//! Memory: the daemon's RSS per tracked thread, and after the threads are gone.

use crate::*;
use std::time::{Duration, Instant};

use anyhow::Result;
use wpd_proto::v1::GetCapabilitiesRequest;
use wpd_tests::{Backend, Client, Daemon};

pub(crate) struct MemRun {
    before: Mem,
    attached: Mem,
    exited: Mem,
    exited2: Mem,
}

/// One attach + arm of an `n`-thread idle target, then its exit; the daemon's
/// memory while attached and after the daemon has seen the exit.
pub(crate) async fn mem_cycle(
    daemon: &Daemon,
    client: &mut Client,
    backend: Backend,
    n: usize,
    settle: Duration,
) -> Result<(Mem, Mem)> {
    let mut target = target(n, Load::Idle).await?;
    arm_all(client, backend, &target, target.vars[QUIET_VAR], n).await?;
    wait_stats(
        client,
        Duration::from_secs(60),
        "every thread tracked",
        |s| s.threads as usize >= n,
    )
    .await?;
    tokio::time::sleep(settle).await;
    let attached = mem_of(daemon.pid())?;
    target.send("quit")?;
    target.wait_exit(Duration::from_secs(300)).await?;
    wait_stats(
        client,
        Duration::from_secs(300),
        "the process's exit",
        |s| s.processes == 0 && s.threads == 0,
    )
    .await?;
    tokio::time::sleep(settle).await;
    Ok((attached, mem_of(daemon.pid())?))
}

pub(crate) async fn mem_once(backend: Backend, n: usize, settle: Duration) -> Result<MemRun> {
    let daemon = Daemon::start().await?;
    let mut client = daemon.client().await?;
    client
        .get_capabilities(GetCapabilitiesRequest {})
        .await?
        .into_inner();
    stats(&mut client).await?;
    tokio::time::sleep(settle).await;
    let before = mem_of(daemon.pid())?;
    let (attached, exited) = mem_cycle(&daemon, &mut client, backend, n, settle).await?;
    let (_, exited2) = mem_cycle(&daemon, &mut client, backend, n, settle).await?;
    Ok(MemRun {
        before,
        attached,
        exited,
        exited2,
    })
}

pub(crate) async fn section_memory(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    println!(
        "## daemon memory: RSS before attach, with N tracked threads, after the process exits\n"
    );
    println!(
        "| backend | threads | RSS before attach KiB | RSS attached + 1 watchpoint KiB | KiB per tracked thread, rings excluded | RSS after exit KiB | after a 2nd attach + exit KiB | after exit − before KiB | perf rings resident / mapped KiB (before, attached, after) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for &n in &args.threads {
        for backend in [Backend::Perf, Backend::Ptrace] {
            if backend == Backend::Perf
                && let Some(why) = perf_fds_skip(n, wpd_tests::online_cpus().len(), 2)
            {
                println!("| perf | {n} | {why} |  |  |  |  |  |  |");
                continue;
            }
            // One run: RSS is deterministic enough, and a 10,000-thread
            // cycle takes seconds.
            let r = mem_once(backend, n, args.settle).await?;
            let per_thread =
                (r.attached.without_rings() - r.before.without_rings()) as f64 / n as f64;
            let rings = |m: Mem| format!("{} / {}", m.rings, m.rings_mapped);
            println!(
                "| {} | {n} | {} | {} | {per_thread:.2} | {} | {} | {:+} | {}, {}, {} |",
                backend_name(backend),
                r.before.rss,
                r.attached.rss,
                r.exited.rss,
                r.exited2.rss,
                r.exited.without_rings() - r.before.without_rings(),
                rings(r.before),
                rings(r.attached),
                rings(r.exited),
            );
            flush();
        }
    }
    section_done(t0);
    Ok(())
}
