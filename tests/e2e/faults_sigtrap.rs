//! A target watched by the default backend never dies of SIGTRAP (issue:
//! "a target watched by the default backend died of SIGTRAP").
//!
//! Rounds of: a target whose 2 threads store into a global in a tight loop
//! (every store a hit, tens of thousands a second), watched process-wide by
//! the default backend (perf, per-thread BPF path), while the machine is
//! loaded (two CPU spinners, a writer with fsyncs), a second watchpoint is
//! set and removed over and over (breakpoints opened and closed while traps
//! are in flight), threads are created, and — every other round — the
//! kernel's sample-rate limit is lowered to 1,000 a second (throttling
//! would stop the events at each tick). After each round the target must be
//! alive, and the daemon must have seen no SIGTRAP delivered to it: it sees
//! every signal delivered to a watched process (`signal:signal_deliver`),
//! and a death leaves its signal and si_code in a `ProcessCrashed` event,
//! which the failure prints.
//!
//! `WPD_SIGTRAP_ROUNDS` sets the number of rounds (default 8);
//! `scripts/soak-sigtrap` runs more and prints the figures for
//! `docs/reliability.md`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use wpd_proto::v1::stream_events_response::Event;
use wpd_proto::v1::*;
use wpd_tests::{
    Backend, Daemon, EventStream, Sysctl, TargetProc, require_root_perf, rpc_ok, write_spec,
};

/// Load: two CPU spinners, and a disk writer (`dd` run again and again by a thread of the
/// test, so that no process of it outlives the test: a `dd` under a shell loop would be left
/// orphaned when the shell is killed, and go on writing its file). All stopped when dropped.
struct Load {
    spinners: Vec<Child>,
    stop: Arc<AtomicBool>,
    writer: Option<std::thread::JoinHandle<()>>,
    file: PathBuf,
}

impl Load {
    fn start() -> Result<Load> {
        let mut spinners = Vec::new();
        for _ in 0..2 {
            spinners.push(
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdin(Stdio::null())
                    .spawn()
                    .context("a CPU spinner")?,
            );
        }
        let file = std::env::temp_dir().join(format!("wpd-sigtrap-io-{}", std::process::id()));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (stop, of) = (stop.clone(), format!("of={}", file.display()));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let Ok(mut c) = Command::new("dd")
                        .args(["if=/dev/zero", &of, "bs=1M", "count=32", "conv=fsync"])
                        .arg("status=none")
                        .stdin(Stdio::null())
                        .spawn()
                    else {
                        return;
                    };
                    // Its own child, killed by this thread when the load stops.
                    loop {
                        if !matches!(c.try_wait(), Ok(None)) {
                            break;
                        }
                        if stop.load(Ordering::SeqCst) {
                            let _ = c.kill();
                            let _ = c.wait();
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            })
        };
        Ok(Load {
            spinners,
            stop,
            writer: Some(writer),
            file,
        })
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for c in &mut self.spinners {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.stop.store(true, Ordering::SeqCst);
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        let _ = std::fs::remove_file(&self.file);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sigtrap_reaches_a_target_watched_by_the_default_backend() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let rounds: usize = std::env::var("WPD_SIGTRAP_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let daemon = Daemon::start().await?;
    let _load = Load::start()?;
    let result = async {
        let mut client = daemon.client().await?;
        let mut total_hits = 0u64;
        let started = Instant::now();
        for round in 0..rounds {
            let _rate = if round % 2 == 1 {
                Some(Sysctl::set(
                    "/proc/sys/kernel/perf_event_max_sample_rate",
                    "1000",
                )?)
            } else {
                None
            };
            let mut target = TargetProc::start(&["--threads", "2", "--spin"]).await?;
            let pid = target.pid;
            let mut events = EventStream::for_pid(&mut client, pid).await?;
            let w = rpc_ok(
                "SetWatchpoint",
                client.set_watchpoint(SetWatchpointRequest {
                    spec: Some(write_spec(Backend::Unspecified, pid, target.vars[0])),
                }),
            )
            .await?
            .watchpoint
            .context("no watchpoint")?;
            ensure!(w.backend == Backend::Perf as i32, "default backend: {w:?}");
            // Breakpoints opened and closed while traps are in flight, and
            // threads created, for a second and a half.
            let until = Instant::now() + Duration::from_millis(1500);
            let mut k = 0;
            while Instant::now() < until {
                let other = rpc_ok(
                    "SetWatchpoint",
                    client.set_watchpoint(SetWatchpointRequest {
                        spec: Some(write_spec(
                            Backend::Unspecified,
                            pid,
                            target.vars[1 + k % 4],
                        )),
                    }),
                )
                .await?
                .watchpoint
                .context("no watchpoint")?;
                if k % 4 == 0 {
                    target.spawn_worker().await?;
                }
                rpc_ok(
                    "RemoveWatchpoint",
                    client.remove_watchpoint(RemoveWatchpointRequest { id: other.id }),
                )
                .await?;
                k += 1;
            }
            rpc_ok(
                "RemoveWatchpoint",
                client.remove_watchpoint(RemoveWatchpointRequest { id: w.id }),
            )
            .await
            .map(|r| total_hits += r.watchpoint.map_or(0, |w| w.hits))?;
            // Still alive, and no signal of note delivered meanwhile.
            if !target.is_alive() {
                let crash = events
                    .wait_for(Duration::from_secs(5), "ProcessCrashed", |ev| {
                        Ok(match ev {
                            Event::ProcessCrashed(c) => Some(c.clone()),
                            _ => None,
                        })
                    })
                    .await
                    .map(|c| format!("{c:?}"))
                    .unwrap_or_else(|e| format!("no ProcessCrashed: {e:#}"));
                bail!(
                    "round {round}: the target died ({:?}); {crash}",
                    target.exit_status()
                );
            }
            target.quit().await?;
            println!("round {round}: alive, {k} watchpoints set and removed meanwhile");
        }
        let stats = rpc_ok("GetStats", client.get_stats(GetStatsRequest {})).await?;
        println!(
            "SUMMARY rounds={rounds} hits={total_hits} deaths=0 sigtraps={} in {:.1?}",
            stats.sigtraps,
            started.elapsed()
        );
        ensure!(stats.sigtraps == 0, "{} SIGTRAPs delivered", stats.sigtraps);
        ensure!(total_hits > 0, "no hits at all");
        Ok(())
    }
    .await;
    daemon.finish(result)
}
