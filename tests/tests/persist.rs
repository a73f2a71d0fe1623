//! Watchpoints and policies kept in the state directory: set again after a
//! SIGKILL (a policy also covering processes started after the restart), a
//! watchpoint whose process is gone reported (listed and published), a
//! SIGTERM that removes everything from the targets but keeps the saved
//! state, and a removed policy that does not come back.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use wpd_proto::v1::stream_events_response::Event as E;
use wpd_proto::v1::*;
use wpd_tests::{
    Backend, CTarget, Client, Daemon, ctarget_path, poll_until, require_root_perf, rpc_ok,
    unique_temp_dir,
};

const WAIT: Duration = Duration::from_secs(15);

fn counter_spec(pid: i32) -> WatchpointSpec {
    WatchpointSpec {
        pid,
        symbol: "counter".into(),
        access: Access::Write as i32,
        backend: Backend::Perf as i32,
        ..Default::default()
    }
}

/// `ct-pie` started under the command name `comm` (a link in `dir`).
async fn start_as(dir: &Path, comm: &str) -> Result<CTarget> {
    let link: PathBuf = dir.join(comm);
    if !link.exists() {
        std::os::unix::fs::symlink(ctarget_path("ct-pie"), &link)?;
    }
    CTarget::start_path(&link, comm).await
}

async fn list(c: &mut Client) -> Result<ListWatchpointsResponse> {
    rpc_ok(
        "ListWatchpoints",
        c.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
    )
    .await
}

async fn watch(c: &mut Client, pid: i32) -> Result<u64> {
    Ok(rpc_ok(
        "SetWatchpoint",
        c.set_watchpoint(SetWatchpointRequest {
            spec: Some(counter_spec(pid)),
        }),
    )
    .await?
    .watchpoint
    .context("no watchpoint")?
    .id)
}

async fn policy(c: &mut Client, comm: &str) -> Result<u64> {
    Ok(rpc_ok(
        "SetPolicy",
        c.set_policy(SetPolicyRequest {
            selector: Some(ProcessSelector {
                comm: comm.into(),
                ..Default::default()
            }),
            spec: Some(counter_spec(0)),
        }),
    )
    .await?
    .policy
    .context("no policy")?
    .id)
}

/// Waits until a watchpoint on `pid` is listed; returns its id.
async fn watched(c: &mut Client, pid: i32) -> Result<u64> {
    poll_until(WAIT, &format!("a watchpoint on {pid}"), async || {
        let l = list(c).await?;
        Ok(
            match l
                .watchpoints
                .iter()
                .find(|w| w.spec.as_ref().is_some_and(|s| s.pid == pid))
            {
                Some(w) => Ok(w.id),
                None => Err(format!("{} watchpoints", l.watchpoints.len())),
            },
        )
    })
    .await
}

/// Stores into the target's `counter` until a hit of `pid` arrives on
/// `events`.
async fn hits(c: &mut Client, t: &mut CTarget, v: i64) -> Result<()> {
    let mut s = rpc_ok(
        "StreamEvents",
        c.stream_events(StreamEventsRequest {
            pid: t.pid,
            hits_only: true,
            raw: true,
            ..Default::default()
        }),
    )
    .await?;
    t.cmd(&format!("set counter {v}")).await?;
    let m = tokio::time::timeout(WAIT, s.message())
        .await
        .context("no hit")??
        .context("stream ended")?;
    ensure!(
        matches!(&m.event, Some(E::Hit(h)) if h.pid == t.pid),
        "{m:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sigkill_everything_is_set_again_or_reported() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-persist")?;
    let comm = format!("wpers{}", std::process::id() % 1_000_000);
    let mut first = Daemon::start().await?;
    let mut a = CTarget::start("ct-pie").await?;
    let mut gone = CTarget::start("ct-pie").await?;
    let mut early = start_as(&dir, &comm).await?;
    let result = async {
        let mut c = first.client().await?;
        let a_id = watch(&mut c, a.pid).await?;
        let gone_id = watch(&mut c, gone.pid).await?;
        let pol = policy(&mut c, &comm).await?;
        watched(&mut c, early.pid).await?;
        first.kill().await?;
        // Its process ends while no daemon runs.
        gone.cmd("quit").await?;
        let gone_pid = gone.pid;
        drop(gone);

        let second = Daemon::restart_from(&first, &[]).await?;
        let result = async {
            let mut c = second.client().await?;
            // The watchpoint (under its id) and the policy's instance, set
            // again.
            ensure!(watched(&mut c, a.pid).await? == a_id, "a new id for {a_id}");
            watched(&mut c, early.pid).await?;
            hits(&mut c, &mut a, 11).await?;
            hits(&mut c, &mut early, 12).await?;
            let l = list(&mut c).await?;
            ensure!(
                l.policies.len() == 1
                    && l.policies[0]
                        .selector
                        .as_ref()
                        .is_some_and(|s| s.comm == comm),
                "{:?}",
                l.policies
            );
            ensure!(
                l.policies[0].id == pol,
                "policy {pol} came back as {}",
                l.policies[0].id
            );
            // Nothing new reuses an id of the last run.
            let fresh = watch(&mut c, early.pid).await;
            ensure!(
                fresh.is_err() || fresh.as_ref().is_ok_and(|&id| id > pol),
                "{fresh:?}"
            );
            // The one whose process is gone: listed, and published.
            ensure!(l.not_restored.len() == 1, "{:?}", l.not_restored);
            let n = &l.not_restored[0];
            ensure!(
                n.saved_id == gone_id
                    && n.spec.as_ref().is_some_and(|s| s.pid == gone_pid)
                    && n.reason.contains("gone"),
                "{n:?}"
            );
            let mut replay = rpc_ok(
                "StreamEvents(after 0)",
                c.stream_events(StreamEventsRequest {
                    after_seq: Some(0),
                    ..Default::default()
                }),
            )
            .await?;
            let removed = poll_until(WAIT, "the removal event", async || {
                let m = tokio::time::timeout(WAIT, replay.message())
                    .await
                    .context("nothing replayed")??
                    .context("stream ended")?;
                Ok(match m.event {
                    Some(E::WatchpointRemoved(r)) if r.watchpoint_id == gone_id => Ok(r),
                    other => Err(format!("{other:?}")),
                })
            })
            .await?;
            ensure!(
                removed.pid == gone_pid && removed.reason.contains("not set again"),
                "{removed:?}"
            );
            // A process started after the restart is covered by the policy.
            let mut late = start_as(&dir, &comm).await?;
            watched(&mut c, late.pid).await?;
            hits(&mut c, &mut late, 13).await?;
            Ok(())
        }
        .await;
        second.finish(result)
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    first.finish(result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_the_saved_state_and_a_removed_policy_stays_removed() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-persist")?;
    let comm = format!("wperT{}", std::process::id() % 1_000_000);
    let mut first = Daemon::start().await?;
    let mut t = start_as(&dir, &comm).await?;
    let result = async {
        let mut c = first.client().await?;
        policy(&mut c, &comm).await?;
        watched(&mut c, t.pid).await?;
        let st = first.terminate(Duration::from_secs(10)).await?;
        ensure!(st.success(), "wpd exited {st:?}");
        ensure!(
            first.state_dir().join("watchpoints.pb").exists(),
            "the saved state is gone"
        );

        let mut second = Daemon::restart_from(&first, &[]).await?;
        let mut c = second.client().await?;
        let id = watched(&mut c, t.pid).await?;
        hits(&mut c, &mut t, 21).await?;
        let pol = list(&mut c).await?.policies[0].id;
        rpc_ok(
            "RemoveWatchpoint(policy)",
            c.remove_watchpoint(RemoveWatchpointRequest { id: pol }),
        )
        .await?;
        ensure!(id != pol, "instance and policy are different ids");
        second.kill().await?;

        let third = Daemon::restart_from(&second, &[]).await?;
        let mut c = third.client().await?;
        // Give a restore the time it would take, then nothing must be there.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let l = list(&mut c).await?;
        ensure!(
            l.policies.is_empty() && l.watchpoints.is_empty() && l.not_restored.is_empty(),
            "{l:?}"
        );
        drop(third);
        drop(second);
        Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    first.finish(result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_never_share_a_state_directory() -> Result<()> {
    let first = Daemon::start().await?;
    let result = async {
        let dir = unique_temp_dir("wpd-persist-second")?;
        let out = tokio::process::Command::new(wpd_tests::bin_path("wpd"))
            .arg("--listen")
            .arg(format!("unix:{}", dir.join("wpd.sock").display()))
            .env("WPD_STATE_FILE", dir.join("ptrace-armed"))
            .env("WPD_STATE_DIR", first.state_dir())
            .kill_on_drop(true)
            .output()
            .await?;
        let _ = std::fs::remove_dir_all(&dir);
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success()
                && err.contains(&format!("another wpd (pid {})", first.pid()))
                && err.contains("--state-dir"),
            "{out:?}"
        );
        // The first one is untouched.
        let mut c = first.client().await?;
        list(&mut c).await?;
        Ok(())
    }
    .await;
    first.finish(result)
}

/// A second daemon on the socket or the ptrace state file of a running one
/// is refused before it reads, cleans up or removes anything of the first
/// one's: the state file listing the first daemon's ptrace attachments is
/// still there afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_is_refused_before_touching_the_first_ones_files() -> Result<()> {
    let first = Daemon::start().await?;
    let result = async {
        let state_file = first.state_file().to_path_buf();
        // As a daemon with an attachment would have it (a pid that does not
        // exist: recovery would only remove the file).
        std::fs::write(&state_file, "pid 2147483000 start 0\n")?;
        let run = |socket: std::path::PathBuf| {
            let state_file = state_file.clone();
            async move {
                let dir = unique_temp_dir("wpd-second")?;
                let out = tokio::process::Command::new(wpd_tests::bin_path("wpd"))
                    .arg("--listen")
                    .arg(format!("unix:{}", socket.display()))
                    .arg("--state-dir")
                    .arg(dir.join("state"))
                    .env("WPD_STATE_FILE", &state_file)
                    .kill_on_drop(true)
                    .output()
                    .await?;
                let _ = std::fs::remove_dir_all(&dir);
                anyhow::Ok(out)
            }
        };
        // Same socket.
        let out = run(first.socket_path().to_path_buf()).await?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains("another daemon is already listening"),
            "{out:?}"
        );
        ensure!(
            state_file.exists(),
            "the second daemon removed the first one's state file"
        );
        // Another socket, the same ptrace state file.
        let other = unique_temp_dir("wpd-second-sock")?;
        let out = run(other.join("wpd.sock")).await?;
        let _ = std::fs::remove_dir_all(&other);
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success()
                && err.contains(&format!("another wpd (pid {})", first.pid()))
                && err.contains("ptrace state file"),
            "{out:?}"
        );
        ensure!(
            state_file.exists(),
            "the second daemon removed the first one's state file"
        );
        // The first one still answers on its socket.
        let mut c = first.client().await?;
        list(&mut c).await?;
        Ok(())
    }
    .await;
    first.finish(result)
}
