//! State feedback into libFuzzer: the library's own counters, registered with libFuzzer,
//! count the traps of the watched variable in the fuzzing process itself.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use wpd_tests::{Backend, Daemon, poll_until, require_backend, run_fuzzer};

use super::{
    Build, Maze, WIN, feedback_library, feedback_refused, loaded, replay_maze, start_waiting,
    watch_position, wpctl,
};
use crate::fuzzers::nothing_left;

/// The feedback traps the library in process `pid` has counted: `wpd_feedback_state`'s
/// fourth word, as `wpctl symbol` reads it.
async fn traps_counted(ep: &str, pid: u32) -> Result<u64> {
    let r = wpctl(
        ep,
        &[
            "--json",
            "symbol",
            "--pid",
            &pid.to_string(),
            "libwpd_feedback.so:wpd_feedback_state",
        ],
    )
    .await?;
    ensure!(r.code == Some(0), "{r:?}");
    let v: serde_json::Value = serde_json::from_str(&r.stdout)?;
    let hex = v["value"]
        .as_str()
        .with_context(|| format!("no value in {v}"))?;
    let word = hex
        .get(48..64)
        .with_context(|| format!("a state of {} hex digits", hex.len()))?;
    let mut bytes = [0u8; 8];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&word[2 * i..2 * i + 2], 16)?;
    }
    Ok(u64::from_le_bytes(bytes))
}

/// libFuzzer: the library registers counters of its own with libFuzzer (the program
/// exports its registration calls) and counts the traps there, in the same process,
/// between libFuzzer's clearing of the counters and its reading of them. Alone, libFuzzer
/// runs millions of walks without an exit; with a policy on the program (`--exe`, armed
/// before its first instruction) it reaches the exit, and the input it saves reaches it
/// replayed without wpd. A libFuzzer process without the library is refused, naming
/// `LD_PRELOAD`; a condition on a feedback watch is judged at the trap (a store it rejects
/// sends no signal and counts nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_state_feedback_walks_the_maze_to_its_exit() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let m = Maze::new("lfm", Build::LibFuzzer)?;
    let (dir, comm, bin, plain) = (&m.dir, &m.comm, &m.bin, &m.replay);
    let lib = feedback_library()?;
    ensure!(replay_maze(plain, &WIN)?.1);
    let artifacts = dir.join("artifacts");
    std::fs::create_dir(&artifacts)?;
    let libfuzzer = |corpus: &str, seconds: u32| -> Result<tokio::process::Command> {
        std::fs::create_dir_all(dir.join(corpus))?;
        let mut c = tokio::process::Command::new(bin);
        c.arg(format!("-max_total_time={seconds}"))
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg(corpus)
            .current_dir(dir)
            .env("LD_PRELOAD", &lib);
        Ok(c)
    };
    let crashes = || -> Result<Vec<Vec<u8>>> {
        let mut v = Vec::new();
        for e in std::fs::read_dir(&artifacts)? {
            let e = e?;
            if e.file_name().to_string_lossy().starts_with("crash-") {
                v.push(std::fs::read(e.path())?);
            }
        }
        Ok(v)
    };

    // Alone (the library preloaded, its counters registered and never counted): no exit.
    let o = run_fuzzer(libfuzzer("alone", 15)?, Duration::from_secs(60)).await?;
    let log = String::from_utf8_lossy(&o.stderr);
    ensure!(
        o.status.success() && crashes()?.is_empty(),
        "libFuzzer alone ended with {:?} or found the exit: {}",
        o.status,
        &log[log.len().saturating_sub(2000)..]
    );
    ensure!(
        log.contains("Loaded 2 modules") && log.contains("512 ["),
        "libFuzzer did not take the library's 512 counters: {}",
        &log[..log.len().min(2000)]
    );

    let daemon = Daemon::start().await?;
    let ep = daemon.endpoint();
    let result = async {
        // Without the library: refused, naming LD_PRELOAD.
        std::fs::create_dir_all(dir.join("bare"))?;
        let preload = format!("LD_PRELOAD={}", lib.display());
        let args = ["-max_total_time=60", "bare"];
        let settle = Duration::from_millis(300);
        feedback_refused(&ep, bin, &args, false, settle, &preload).await?;

        // A condition no store meets: the traps are judged in the kernel, none signalled.
        std::fs::create_dir_all(dir.join("probe"))?;
        let mut probe = start_waiting(bin, &["-max_total_time=60", "probe"], true)?;
        let pid = probe.id();
        let r = async {
            loaded(pid, true).await?;
            let w = wpctl(
                &ep,
                &[
                    "--json",
                    "watch",
                    "--pid",
                    &pid.to_string(),
                    "--symbol",
                    "px",
                    "--feedback",
                    "--condition",
                    "== 100",
                ],
            )
            .await?;
            ensure!(w.code == Some(0), "{w:?}");
            tokio::time::sleep(Duration::from_secs(2)).await;
            let none = traps_counted(&ep, pid).await?;
            ensure!(
                none == 0,
                "{none} traps counted under a condition no store meets"
            );
            let w = wpctl(
                &ep,
                &[
                    "watch",
                    "--pid",
                    &pid.to_string(),
                    "--symbol",
                    "py",
                    "--feedback",
                    "--condition",
                    ">= 1",
                ],
            )
            .await?;
            ensure!(w.code == Some(0), "{w:?}");
            poll_until(Duration::from_secs(10), "traps counted", async || {
                let n = traps_counted(&ep, pid).await?;
                Ok(if n > 0 {
                    Ok(())
                } else {
                    Err("none".to_string())
                })
            })
            .await
        }
        .await;
        let _ = probe.kill();
        let _ = probe.wait();
        r?;

        let policy_id = watch_position(&ep, bin, &[]).await?;
        // It stops at the exit: 16 s in the benchmark's median, longer on a loaded machine.
        let o = run_fuzzer(libfuzzer("fed", 420)?, Duration::from_secs(480)).await?;
        let log = String::from_utf8_lossy(&o.stderr);
        let found = crashes()?;
        ensure!(
            !found.is_empty(),
            "libFuzzer with state feedback found no exit in 420 s ({:?}): {}",
            o.status,
            &log[log.len().saturating_sub(2000)..]
        );
        for input in &found {
            ensure!(
                replay_maze(plain, input)?.1,
                "{input:?} does not reach the exit without wpd"
            );
        }
        nothing_left(&daemon, comm, policy_id).await
    }
    .await;
    daemon.finish(result)
}
