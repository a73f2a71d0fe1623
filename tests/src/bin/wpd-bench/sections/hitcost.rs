//! Hit cost: what a hit costs the target, wpd against the kernel floor (for
//! perf: the same breakpoint opened by the bench itself with an empty BPF
//! program attached, no daemon).

use crate::*;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use wpd_proto::v1::ListWatchpointsRequest;
use wpd_tests::{Backend, Client, Daemon, TargetProc, attach, set_watchpoint_within, write_spec};

pub(crate) async fn section_hit_cost(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    println!("## hit cost: what one hit costs the writing thread\n");
    println!(
        "| backend | ns per write, no watchpoint | ns per write, watched | cost of one hit (µs) | floor: a bare breakpoint + empty BPF program (µs per hit) | wpd / floor | hits delivered |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for backend in [Backend::Perf, Backend::Ptrace] {
        // A ptrace hit stops the thread (tens of µs): fewer writes.
        let writes = if backend == Backend::Ptrace {
            (args.writes / 20).max(100)
        } else {
            args.writes
        };
        let (base, watched, floor, delivered) = hit_cost(backend, writes, args.reps).await?;
        let (floor, ratio) = match floor {
            Some(f) => (
                format!("{:.2}", (f - base) / 1e3),
                format!("{:.2}", (watched - base) / (f - base)),
            ),
            None => ("–".into(), "–".into()),
        };
        println!(
            "| {} | {base:.1} | {watched:.1} | {:.2} | {floor} | {ratio} | {delivered} of {} |",
            backend_name(backend),
            (watched - base) / 1e3,
            writes
        );
        flush();
    }
    section_done(t0);
    Ok(())
}

/// (ns per write without a watchpoint, with one, with the perf floor's
/// breakpoint (perf only), hits delivered).
pub(crate) async fn hit_cost(
    backend: Backend,
    writes: u64,
    reps: usize,
) -> Result<(f64, f64, Option<f64>, u64)> {
    let mut target = TargetProc::start(&["--threads", "1", "--interval-us", "1000000"]).await?;
    let daemon = Daemon::start().await?;
    let mut client = daemon.client().await?;
    let bench = |r: String| -> Result<f64> {
        let ns: f64 = r
            .strip_prefix("BENCH ns=")
            .with_context(|| format!("unexpected reply {r:?}"))?
            .parse()?;
        Ok(ns / writes as f64)
    };
    let cmd = format!("bench-writes 3 {writes}");
    let mut base = Vec::new();
    for _ in 0..reps {
        base.push(bench(
            target
                .cmd_within(&cmd, Duration::from_secs(300))
                .await?
                .context("no reply")?,
        )?);
    }
    // The kernel's part of a perf hit: the same write breakpoint on the
    // writing thread, `sample_period` 1, a BPF program that returns at once.
    let mut floor = None;
    if backend == Backend::Perf {
        let prog = wpd_tests::floor_bpf_program()?;
        let bp = wpd_tests::floor_perf_arm_bpf(target.pid, target.vars[3], &prog)?;
        let mut f = Vec::new();
        for _ in 0..reps {
            f.push(bench(
                target
                    .cmd_within(&cmd, Duration::from_secs(300))
                    .await?
                    .context("no reply")?,
            )?);
        }
        drop(bp);
        floor = Some(median(f));
    }
    attach(&mut client, target.pid, backend).await?;
    set_watchpoint_within(
        &mut client,
        write_spec(backend, target.pid, target.vars[3]),
        Duration::from_secs(30),
    )
    .await?;
    let mut watched = Vec::new();
    for _ in 0..reps {
        watched.push(bench(
            target
                .cmd_within(&cmd, Duration::from_secs(300))
                .await?
                .context("no reply")?,
        )?);
    }
    // Let the daemon drain what is in flight, then count.
    let expected = writes * reps as u64;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut delivered = 0;
    while Instant::now() < deadline {
        delivered = wp_hits(&mut client, target.pid).await?;
        if delivered >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stats(&mut client).await?;
    drop(daemon);
    drop(target);
    Ok((
        median(base),
        median(watched),
        floor,
        delivered / reps as u64,
    ))
}

/// Hits the daemon counted on the watchpoints of `pid`.
pub(crate) async fn wp_hits(client: &mut Client, pid: i32) -> Result<u64> {
    let list = client
        .list_watchpoints(ListWatchpointsRequest { pid })
        .await?
        .into_inner();
    Ok(list.watchpoints.iter().map(|w| w.hits).sum())
}
