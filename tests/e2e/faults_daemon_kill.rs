//! Fault injection: the daemon SIGKILLed with the perf backend while hits stream (fault 4).
//!
//! Every test runs the real daemon against real targets it starts itself, bounds every wait,
//! relies on the harness guards to kill everything on any path, and ends by checking that the
//! targets survived (no SIGTRAP, `ping` answers) and that nothing leaked (`wpd_tests::leaks`).

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use wpd_tests::leaks::*;
use wpd_tests::{
    Backend, Daemon, EventStream, ForeignBreakpoint, TargetProc, describe_status, hits_only,
    require_backend, set_watchpoint, write_spec,
};

/// Timeout of every wait for hits.
const HIT_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// 4. The daemon is SIGKILLed with the perf backend while hits stream
// ---------------------------------------------------------------------------------------------

/// 4. SIGKILL of the daemon while perf hits stream: the target runs on untouched (the
/// breakpoints died with the daemon's perf fds: every thread has its four slots free again,
/// as the kernel confirms), and a fresh daemon can watch it again and release it cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_sigkill_perf_leaves_target_untouched() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let mut daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "8"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let pid = target.pid;
        let mut events = EventStream::subscribe(&mut client, hits_only(pid)).await?;
        set_watchpoint(&mut client, write_spec(Backend::Perf, pid, target.vars[0])).await?;
        let mut on_main = write_spec(Backend::Perf, pid, target.vars[2]);
        on_main.tids = vec![pid];
        set_watchpoint(&mut client, on_main).await?;
        events.collect_hits(50, HIT_TIMEOUT).await?;

        let st = daemon.kill().await?;
        ensure!(
            st.signal() == Some(libc::SIGKILL),
            "wpd ended with {}",
            describe_status(&st)
        );
        drop(events);
        drop(client);

        ensure_survived(&mut target).await?;
        let (c0, threads) = target.ping().await?;
        ensure!(threads == 9, "the target has {threads} threads");
        target
            .wait_counter_above(c0, Duration::from_secs(5))
            .await?;
        target.write(2, 7).await?; // the formerly watched VARS[2], from the main thread
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (c1, _) = target.ping().await?;
        target
            .wait_counter_above(c1, Duration::from_secs(5))
            .await?;
        ensure_survived(&mut target).await?;

        // The kernel agrees: four breakpoints of our own fit on every thread.
        for tid in target.tids()? {
            let held = (4..8)
                .map(|i| ForeignBreakpoint::open(tid, target.vars[i], 8))
                .collect::<Result<Vec<_>>>()
                .with_context(|| {
                    format!("thread {tid}: a slot is still held after the daemon died")
                })?;
            drop(held);
        }

        // A new daemon watches the target again, and lets it go without leaks.
        let fresh = Daemon::start().await?;
        let r = async {
            let mut client = fresh.client().await?;
            let base = Baseline::take(&fresh, &mut client).await?;
            let mut events = EventStream::subscribe(&mut client, hits_only(pid)).await?;
            let wp = set_watchpoint(&mut client, write_spec(Backend::Perf, pid, target.vars[0]))
                .await?
                .watchpoint
                .unwrap_or_default();
            ensure!(
                wp.armed_threads == 9,
                "armed on {} threads",
                wp.armed_threads
            );
            events.collect_hits(10, HIT_TIMEOUT).await?;
            drop(events);
            remove(&mut client, wp.id).await?;
            detach(&mut client, pid).await?;
            ensure_clean(&fresh, &mut client, base, &[pid]).await
        }
        .await;
        fresh.finish(r)?;
        ensure_survived(&mut target).await
    }
    .await;
    daemon.finish(result)
}
