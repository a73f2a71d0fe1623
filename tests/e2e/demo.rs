//! The README's first command: `wpd-demo` (here the debug build, beside the
//! debug `wpd` and `wpd-target`) starts the daemon and a 1,000-thread
//! target, sets one process-wide watchpoint, shows live hits and prints a
//! summary. It must run to its end with every thread armed and every
//! worker seen writing (but for as many as events were dropped), and stop
//! what it started.

use std::time::Duration;

use anyhow::{Context, Result, ensure};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_first_command_runs_to_its_summary() -> Result<()> {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_wpd-demo"));
    cmd.kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .context("wpd-demo did not end within 180 s")??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success(),
        "wpd-demo failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let summary = stdout
        .split_once("summary\n")
        .map(|(_, s)| s)
        .with_context(|| format!("no summary in:\n{stdout}"))?;
    for line in [
        "threads in the target      1001",
        "threads armed              1001",
        "wpd-target: exit code 0",
        "wpd: exit code 0",
    ] {
        ensure!(
            summary.contains(line),
            "the summary has no {line:?}:\n{stdout}"
        );
    }
    // Every worker writes 60 times in the 3 s: all are seen, but for as many as events were
    // dropped (a loaded machine's subscriber lag) or lost in the kernel: a worker unseen lost
    // every one of its hits.
    let (seen, workers) = summary
        .lines()
        .find_map(|l| l.trim().strip_prefix("distinct threads that hit"))
        .and_then(|l| {
            let (_, r) = l.split_once('(')?;
            let (seen, r) = r.split_once(" of ")?;
            let (workers, _) = r.split_once(" workers)")?;
            Some((
                seen.trim().parse::<u64>().ok()?,
                workers.parse::<u64>().ok()?,
            ))
        })
        .with_context(|| format!("no distinct threads line:\n{stdout}"))?;
    let (dropped, lost) = summary
        .lines()
        .find_map(|l| l.trim().strip_prefix("events dropped"))
        .and_then(|l| {
            let (dropped, r) = l.trim().split_once(" for this subscriber · ")?;
            let (lost, _) = r.split_once(" records lost in the kernel")?;
            Some((dropped.parse::<u64>().ok()?, lost.parse::<u64>().ok()?))
        })
        .with_context(|| format!("no dropped events line:\n{stdout}"))?;
    ensure!(
        workers == 1000 && workers.saturating_sub(seen) <= dropped + lost,
        "{} of {workers} workers unseen with {dropped} events dropped and {lost} lost:\n{stdout}",
        workers.saturating_sub(seen)
    );
    Ok(())
}
