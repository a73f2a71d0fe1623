//! Self-tests of the harness and of `wpd-target`, without a daemon: the target's commands, its
//! stores as seen by a real hardware breakpoint, and the four-slot limit the other tests rely on.

use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use anyhow::{Result, ensure};
use wpd_tests::{ForeignBreakpoint, SPAWN_MARK, TargetProc, bin_dir, require_root_perf};

fn target_bin() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_BIN_EXE_wpd-target"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binaries_are_found_beside_the_test() -> Result<()> {
    let dir = bin_dir()?;
    ensure!(
        target_bin().parent() == Some(dir.as_path()),
        "bin_dir() = {} but cargo built wpd-target at {}",
        dir.display(),
        target_bin().display()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_obeys_its_commands() -> Result<()> {
    let mut target = TargetProc::start_bin(target_bin(), &["--threads", "8"]).await?;
    ensure!(target.threads == 8, "threads = {}", target.threads);
    ensure!(target.vars.len() == 8);
    for (i, pair) in target.vars.windows(2).enumerate() {
        ensure!(
            pair[0] % 64 == 0,
            "VARS[{i}] at {:#x} not on a line",
            pair[0]
        );
        ensure!(
            pair[1] - pair[0] == 64,
            "VARS not 64 bytes apart: {:x?}",
            target.vars
        );
    }
    let tids = target.tids()?;
    ensure!(tids.len() == 9, "expected 9 threads, /proc shows {tids:?}");
    ensure!(tids.contains(&target.pid));

    let (c0, threads) = target.ping().await?;
    ensure!(threads == 9, "ping says {threads} threads");
    target
        .wait_counter_above(c0, Duration::from_secs(5))
        .await?;

    let marker = target.spawn_marker().await?;
    ensure!(
        target.tids()?.contains(&marker),
        "spawned tid {marker} not in /proc"
    );
    let worker = target.spawn_worker().await?;
    ensure!(target.tids()?.contains(&worker));
    ensure!(target.ping().await?.1 == 11);

    target.write(5, 0x1234).await?;
    ensure!(
        target.cmd("write 8 1").await.is_err(),
        "write 8 must be refused"
    );
    ensure!(
        target.cmd("bogus").await.is_err(),
        "unknown commands must be refused"
    );

    let remaining = target.stop_workers().await?;
    ensure!(
        remaining == 2,
        "main + spawned marker should remain, got {remaining}"
    );
    let tids: HashSet<i32> = target.tids()?.into_iter().collect();
    ensure!(
        tids == HashSet::from([target.pid, marker]),
        "left: {tids:?}"
    );
    let (c1, _) = target.ping().await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    ensure!(
        target.ping().await?.0 == c1,
        "VARS[0] still moves after stop-workers"
    );

    let status = target.quit().await?;
    ensure!(status.success(), "quit: {status:?}");
    ensure!(!target.is_alive());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_kills_and_reaps_the_target() -> Result<()> {
    let mut target = TargetProc::start_bin(target_bin(), &["--threads", "2", "--spin"]).await?;
    ensure!(target.is_alive());
    let pid = target.pid;
    drop(target);
    ensure!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the guard left pid {pid} behind"
    );
    Ok(())
}

#[test]
fn guard_cleans_up_when_the_test_panics() {
    let (tx, rx) = std::sync::mpsc::channel();
    let joined = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let target = TargetProc::start_bin(target_bin(), &["--threads", "2"])
                .await
                .unwrap();
            tx.send(target.pid).unwrap();
            panic!("deliberate panic with a live target");
        })
    })
    .join();
    assert!(joined.is_err(), "the thread should have panicked");
    let pid = rx.recv().unwrap();
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "pid {pid} survived a panic"
    );
}

/// Reads a counting perf event.
fn read_count(bp: &ForeignBreakpoint) -> Result<u64> {
    let mut buf = [0u8; 8];
    // SAFETY: reading 8 bytes into an 8-byte buffer from a descriptor we own.
    let n = unsafe { libc::read(bp.raw_fd(), buf.as_mut_ptr().cast(), 8) };
    ensure!(n == 8, "read of the perf counter returned {n}");
    Ok(u64::from_ne_bytes(buf))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_stores_trip_a_real_breakpoint_and_slots_run_out_at_four() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let mut target = TargetProc::start_bin(target_bin(), &["--threads", "2"]).await?;
    let worker = target.worker_tids()?[0];

    // The worker's stores to VARS[0] count on a breakpoint in its thread.
    let bp = ForeignBreakpoint::open(worker, target.vars[0], 8)?;
    let counted = tokio::time::Instant::now() + Duration::from_secs(10);
    while read_count(&bp)? == 0 {
        ensure!(
            tokio::time::Instant::now() < counted,
            "no store of the worker was counted in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // A breakpoint is per thread: one on the main thread counts exactly its one `write`.
    let main_bp = ForeignBreakpoint::open(target.pid, target.vars[1], 8)?;
    target.write(1, SPAWN_MARK).await?;
    ensure!(
        read_count(&main_bp)? == 1,
        "main thread's write not counted once"
    );

    // Four slots per thread: three more fit on the worker, the fifth does not.
    let more: Vec<ForeignBreakpoint> = (2..5)
        .map(|i| ForeignBreakpoint::open(worker, target.vars[i], 8))
        .collect::<Result<_>>()?;
    let fifth = ForeignBreakpoint::open(worker, target.vars[5], 8);
    ensure!(
        fifth.is_err(),
        "a fifth breakpoint on one thread was accepted"
    );
    drop(more);
    drop(bp);
    drop(main_bp);

    ensure!(target.is_alive());
    let status = target.quit().await?;
    ensure!(
        status.success() && status.signal().is_none(),
        "target exit: {status:?}"
    );
    Ok(())
}
