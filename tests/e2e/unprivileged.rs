//! A developer running `wpd` as an ordinary user, for their own processes: no CAP_PERFMON,
//! perf_event_paranoid as the machine has it, `wpctl` as the same user. The perf backend
//! cannot open its collectors (`pid = -1` events), so the default is the backend that works,
//! ptrace, and `wpctl caps` says why; a plain `wpctl watch` (no backend named) works on the
//! user's own process, and another user's process is refused with one clear line.

use std::time::Duration;

use anyhow::{Result, ensure};
use wpd_tests::{Backend, CmdOutput, Daemon, TargetProc, require_backend, run_wpctl_as};

/// `nobody` on Debian.
const USER: u32 = 65534;
const WPCTL_TIMEOUT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordinary_users_daemon_watches_their_own_processes() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start_as(USER, &[]).await?;
    let mut mine =
        TargetProc::start_as(USER, &["--threads", "2", "--interval-us", "20000"]).await?;
    let theirs = TargetProc::start(&["--threads", "1"]).await?;
    let ep = daemon.endpoint();
    let result = async {
        let wpctl = async |args: &[&str]| -> Result<CmdOutput> {
            let mut all = vec!["--endpoint", ep.as_str()];
            all.extend_from_slice(args);
            run_wpctl_as(Some(USER), &all, WPCTL_TIMEOUT).await
        };
        let caps = wpctl(&["--json", "caps"]).await?;
        ensure!(caps.code == Some(0), "wpctl caps: {caps:?}");
        let v: serde_json::Value = serde_json::from_str(&caps.stdout)?;
        let backend = |name: &str| {
            v["backends"]
                .as_array()
                .and_then(|b| b.iter().find(|b| b["backend"] == name))
                .cloned()
                .unwrap_or_default()
        };
        let (perf, ptrace) = (backend("perf"), backend("ptrace"));
        if perf["usable"] == true {
            // perf_event_paranoid ≤ 0 lets ordinary users open CPU-wide events: perf stays
            // the default, and nothing falls back.
            ensure!(
                perf["default"] == true,
                "perf usable but not the default: {v}"
            );
        } else {
            ensure!(
                perf["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("CAP_PERFMON"))
                    && ptrace["usable"] == true
                    && ptrace["default"] == true,
                "expected perf unusable (needing CAP_PERFMON) and ptrace the default: {v}"
            );
        }
        let pid = mine.pid.to_string();
        let addr = format!("{:#x}", mine.vars[0]);
        let w = wpctl(&["watch", "--pid", &pid, "--addr", &addr]).await?;
        ensure!(
            w.code == Some(0) && w.stdout.starts_with("watchpoint "),
            "a plain wpctl watch of the user's own process: {w:?}"
        );
        let ev = wpctl(&["events", "--pid", &pid, "--count", "2"]).await?;
        ensure!(
            ev.code == Some(0) && ev.stdout.lines().filter(|l| l.contains(" hit ")).count() == 2,
            "wpctl events: {ev:?}"
        );
        let theirs_pid = theirs.pid.to_string();
        let theirs_addr = format!("{:#x}", theirs.vars[0]);
        let r = wpctl(&["watch", "--pid", &theirs_pid, "--addr", &theirs_addr]).await?;
        ensure!(
            r.code != Some(0)
                && r.stderr.lines().count() == 1
                && r.stderr.to_lowercase().contains("permission"),
            "a watch on root's process: {r:?}"
        );
        mine.ensure_alive()?;
        Ok(())
    }
    .await;
    daemon.finish(result)
}
