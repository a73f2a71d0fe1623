//! Fuzzers the tests and the benchmark start: run to their end or stopped once enough is
//! seen, and the System V segments a killed one leaves behind removed.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// Runs `cmd` to its end within `limit` (killed if it overruns); returns its output.
pub async fn run_fuzzer(
    cmd: tokio::process::Command,
    limit: Duration,
) -> Result<std::process::Output> {
    run_fuzzer_until(cmd, limit, || false).await
}

/// [`run_fuzzer`], ended early once `enough` (asked every half second) says so: the fuzzer
/// gets SIGINT and stops as at its own time limit (afl-fuzz saves its state and exits with
/// status 0).
pub async fn run_fuzzer_until(
    mut cmd: tokio::process::Command,
    limit: Duration,
    mut enough: impl FnMut() -> bool,
) -> Result<std::process::Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().context("starting the fuzzer")?;
    let pid = child.id().context("the fuzzer's pid")?;
    let out = tokio::time::timeout(limit, async {
        let wait = child.wait_with_output();
        tokio::pin!(wait);
        let mut told = false;
        loop {
            tokio::select! {
                out = &mut wait => return out,
                _ = tokio::time::sleep(Duration::from_millis(500)), if !told => {
                    if enough() {
                        // SAFETY: kill(2) of our own child, not reaped yet (its wait has
                        // not returned), so the pid is still its.
                        unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
                        told = true;
                    }
                }
            }
        }
    })
    .await;
    // Waited for, or killed on drop when it overran (a killed afl-fuzz leaves its segments).
    remove_segments_left_by(pid);
    match out {
        Ok(out) => Ok(out?),
        Err(_) => bail!("the fuzzer did not finish within {limit:?}"),
    }
}

/// Removes the System V shared memory segments that process `pid` (a fuzzer the test
/// started, now ended) created and nobody has attached any more; returns how many. afl-fuzz
/// removes its two (its 8 MiB map and its 1 MiB test-case buffer) when it ends, but not when
/// it is killed (a run over its time, a child dropped): the kernel keeps them until reboot.
/// Only segments whose creator is `pid` are touched.
pub fn remove_segments_left_by(pid: u32) -> usize {
    let Ok(table) = std::fs::read_to_string("/proc/sysvipc/shm") else {
        return 0;
    };
    let mut removed = 0;
    for line in table.lines().skip(1) {
        // key shmid perms size cpid lpid nattch ...
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(id), Some(cpid), Some(nattch)) = (
            f.get(1).and_then(|s| s.parse::<i32>().ok()),
            f.get(4).and_then(|s| s.parse::<u32>().ok()),
            f.get(6).and_then(|s| s.parse::<u64>().ok()),
        ) else {
            continue;
        };
        // SAFETY: IPC_RMID on a segment id read from the kernel's table; no memory passed.
        if cpid == pid
            && nattch == 0
            && unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) } == 0
        {
            removed += 1;
        }
    }
    removed
}
