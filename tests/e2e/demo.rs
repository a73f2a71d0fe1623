//! The README's first command: `wpd-demo` (here the debug build, beside the
//! debug `wpd` and `wpd-target`) starts the daemon and a 1,000-thread
//! target, sets one process-wide watchpoint, shows live hits and prints a
//! summary. It must run to its end with every thread armed and every
//! worker seen writing, and stop what it started.

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
    // Every worker writes 60 times in the 3 s: all are seen, unless the
    // summary reports events dropped (a loaded machine's subscriber lag).
    let dropped = summary
        .lines()
        .find_map(|l| l.trim().strip_prefix("events dropped"))
        .with_context(|| format!("no dropped events line:\n{stdout}"))?;
    ensure!(
        summary.contains("(1000 of 1000 workers)")
            || dropped.trim() != "0 for this subscriber · 0 records lost in the kernel",
        "workers unseen with nothing dropped:\n{stdout}"
    );
    Ok(())
}
