//! Closing code events: a Detach of a process with N code breakpoints, and
//! a SIGTERM of a daemon holding them, against the kernel's floor of the
//! job, N uprobes closed together (`ct-uprobeclose`, BPF links closed from
//! N threads at once), and what the same closes cost one after another and
//! as uprobe perf events (how code events were closed before, and still
//! are on kernels without uprobe links).

use crate::*;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use wpd_tests::{CTarget, Daemon, ctarget_path, run_wpctl};

/// Milliseconds `ct-uprobeclose N THREADS MODE` took to close its probes
/// (its "close X ms" field).
async fn floor(n: usize, threads: usize, mode: u32) -> Result<f64> {
    let out = tokio::process::Command::new(ctarget_path("ct-uprobeclose"))
        .args([n.to_string(), threads.to_string(), mode.to_string()])
        .kill_on_drop(true)
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "ct-uprobeclose {n} {threads} {mode}: {}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    text.split("close ")
        .nth(1)
        .and_then(|r| r.split(" ms").next())
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no close time in {text:?}"))
}

/// A daemon with `n` code breakpoints on a `ct-objects` of its own.
async fn with_breakpoints(n: usize) -> Result<(Daemon, CTarget)> {
    let daemon = Daemon::start().await?;
    let t = CTarget::start("ct-objects").await?;
    let ep = daemon.endpoint();
    let pid = t.pid.to_string();
    for _ in 0..n {
        let out = run_wpctl(
            &["--endpoint", &ep, "break", "--pid", &pid, "conn_set_state"],
            Duration::from_secs(30),
        )
        .await?;
        ensure!(out.code == Some(0), "wpctl break: {out:?}");
    }
    Ok((daemon, t))
}

/// Milliseconds a `wpctl detach` of a process with `n` breakpoints takes.
async fn detach(n: usize) -> Result<f64> {
    let (daemon, t) = with_breakpoints(n).await?;
    let ep = daemon.endpoint();
    let pid = t.pid.to_string();
    let at = Instant::now();
    let out = run_wpctl(
        &["--endpoint", &ep, "detach", "--pid", &pid],
        Duration::from_secs(120),
    )
    .await?;
    let ms = at.elapsed().as_secs_f64() * 1e3;
    ensure!(out.code == Some(0), "wpctl detach: {out:?}");
    daemon.finish(Ok(ms))
}

/// Milliseconds from a SIGTERM to the exit of a daemon holding `n`
/// breakpoints.
async fn sigterm(n: usize) -> Result<f64> {
    let (mut daemon, _t) = with_breakpoints(n).await?;
    let at = Instant::now();
    daemon.terminate(Duration::from_secs(120)).await?;
    Ok(at.elapsed().as_secs_f64() * 1e3)
}

pub(crate) async fn section_closes(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    let n: usize = if args.smoke { 10 } else { 100 };
    println!("## closes: code events closed at a detach and at a SIGTERM\n");
    println!(
        "{n} code breakpoints (`wpctl break`) on `ct-objects`; the floor closes {n} uprobes \
         of a child (BPF links, each with a no-op program) from {n} threads at once \
         (`ct-uprobeclose`, no wpd). Milliseconds, median of {} runs.\n",
        args.reps
    );
    println!("| what | ms | / floor |");
    println!("|---|---:|---:|");
    let mut v = Vec::new();
    for _ in 0..args.reps {
        v.push(floor(n, n, 2).await?);
    }
    let base = median(v).max(0.001);
    println!("| the floor: {n} uprobe links closed at once | {base:.1} | 1.00 |");
    let rows: [(&str, u32, usize); 2] = [
        ("the same links closed one after another", 2, 1),
        (
            "uprobe perf events closed one after another (before Linux 6.6)",
            1,
            1,
        ),
    ];
    for (what, mode, threads) in rows {
        // Seconds each at full size: one run is enough to say it.
        let ms = floor(n, threads, mode).await?;
        println!("| {what} | {ms:.1} | {:.1} |", ms / base);
    }
    let mut v = Vec::new();
    for _ in 0..args.reps {
        v.push(detach(n).await?);
    }
    let ms = median(v);
    println!(
        "| wpd: `wpctl detach` of the process | {ms:.1} | {:.1} |",
        ms / base
    );
    let mut v = Vec::new();
    for _ in 0..args.reps {
        v.push(sigterm(n).await?);
    }
    let ms = median(v);
    println!("| wpd: SIGTERM to exit | {ms:.1} | {:.1} |", ms / base);
    println!("\n({:.0} s)\n", t0.elapsed().as_secs_f64());
    Ok(())
}
