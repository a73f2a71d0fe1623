//! The README's first command: `wpd-demo` (here the debug build, beside the
//! debug `wpd` and `wpd-target`) starts the daemon and a 1,000-thread
//! target, sets one process-wide watchpoint, shows live hits and prints a
//! summary. It must run to its end with every thread armed and every
//! worker seen writing (but for as many as events were dropped), name
//! the place of each hit it shows (a function and a source line, as
//! `wpctl events` does, not an address), and stop what it started.

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
    let live = stdout
        .split_once("live hits\n")
        .and_then(|(_, s)| s.split_once("\n[6/7]"))
        .map(|(s, _)| s)
        .with_context(|| format!("no live hits step in:\n{stdout}"))?;
    let hit_lines: Vec<&str> = live
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("hit "))
        .collect();
    ensure!(!hit_lines.is_empty(), "no hit shown:\n{stdout}");
    for line in &hit_lines {
        ensure!(
            names_a_place(line),
            "a hit shown without its function and line: {line:?}\n{stdout}"
        );
    }
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

/// Whether a hit line names its place as `wpctl events` does: `… at
/// FUNCTION (FILE:LINE)`, possibly followed by the functions it was
/// inlined into; not `ip 0x…`.
fn names_a_place(line: &str) -> bool {
    let Some((_, place)) = line.split_once(" at ") else {
        return false;
    };
    let Some((function, rest)) = place.split_once(" (") else {
        return false;
    };
    let Some((file_line, _)) = rest.split_once(')') else {
        return false;
    };
    let Some((file, n)) = file_line.rsplit_once(':') else {
        return false;
    };
    !function.is_empty()
        && !function.starts_with("0x")
        && !file.is_empty()
        && n.parse::<u32>().is_ok_and(|n| n > 0)
        && !line.contains(" ip 0x")
}

#[test]
fn a_place_is_a_function_and_a_line() {
    for (line, named) in [
        (
            "hit  tid   14108  value    412  at core::ptr::write_volatile (mod.rs:2178)",
            true,
        ),
        (
            "hit  tid   14108  value    412  at write_volatile<u64> (mod.rs:2178) inlined in store \
             (wpd-target.rs:91)",
            true,
        ),
        ("hit  tid   14108  ip 0x558cb04f5cf3  value 412", false),
        (
            "hit  tid   14108  value    412  at wpd-target+0x3ad12",
            false,
        ),
        (
            "hit  tid   14108  value    412  at store+0x12 (wpd-target+0x3ad12)",
            false,
        ),
    ] {
        assert_eq!(names_a_place(line), named, "{line}");
    }
}
