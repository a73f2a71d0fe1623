//! The DAP adapter (`wpctl dap`) driven by a real DAP client: the
//! `DebugClient` of `@vscode/debugadapter-testsupport`, with which VS Code's
//! own adapters are tested (`tests/dap/*.test.mjs`, run by node's test
//! runner). The target is a C program the tests build, whose spinning
//! threads write the watched variable all the time. After each session the
//! target is checked from outside: alive, still writing the variable (a
//! debug register left armed would have killed it with SIGTRAP), no
//! watchpoint left in the daemon, no thread held or traced-stopped.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use tokio::io::{AsyncBufReadExt, BufReader};
use wpd_proto::v1 as pb;
use wpd_tests::{CTarget, Daemon, find_bin, line_of, require_node_dap, require_root_perf};

/// Runs `tests/dap/<script>` with node's test runner; returns its output.
async fn node_test(
    script: &str,
    daemon: &Daemon,
    t: &CTarget,
    extra: &[(&str, String)],
) -> Result<String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("dap");
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg("--test")
        .arg("--test-reporter=spec")
        .arg(dir.join(script))
        .current_dir(&dir)
        .env("WPCTL", find_bin("wpctl")?)
        .env("WPD_ENDPOINT", daemon.endpoint())
        .env("TARGET_PID", t.pid.to_string())
        .env("COUNTER_ADDR", format!("{:#x}", t.addr("counter")))
        .env("BUMP_LINE", line_of("bump_counter").1.to_string())
        .env("SPIN_LINE", line_of("spin_worker").1.to_string())
        .kill_on_drop(true);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .context("the node test took more than 180 s")??;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(out.status.success(), "{script}: {}\n{text}", out.status);
    Ok(text)
}

/// The target after a session: alive, writing `counter`, with nothing of
/// the session left in the daemon, and no thread stopped.
async fn target_is_free(daemon: &Daemon, t: &mut CTarget) -> Result<()> {
    let mut client = daemon.client().await?;
    // The lease's undo runs on the daemon's blocking pool: give it a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let list = client
            .list_watchpoints(pb::ListWatchpointsRequest { pid: t.pid })
            .await?
            .into_inner();
        let held: Vec<i32> = match client
            .list_threads(pb::ListThreadsRequest {
                pid: t.pid,
                ..Default::default()
            })
            .await
        {
            Ok(r) => r
                .into_inner()
                .threads
                .iter()
                .filter(|th| th.state != pb::ThreadState::Running as i32)
                .map(|th| th.tid)
                .collect(),
            Err(s) if s.code() == tonic::Code::NotFound => vec![], // detached
            Err(s) => return Err(s.into()),
        };
        if list.watchpoints.is_empty() && held.is_empty() {
            break;
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "after the session: {} watchpoints left, threads held: {held:?}",
                list.watchpoints.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // No thread in a stop: /proc/PID/task/*/stat state t (traced) or T.
    for task in std::fs::read_dir(format!("/proc/{}/task", t.pid))? {
        let path = task?.path().join("stat");
        let stat = std::fs::read_to_string(&path).unwrap_or_default();
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        ensure!(
            !matches!(state, Some('t' | 'T')),
            "{}: state {state:?} after the session",
            path.display()
        );
    }
    // Still writing counter, still answering: a debug register left armed
    // would have killed it at its next write.
    let before = t.read_i64("counter")?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = t.read_i64("counter")?;
    ensure!(before != after, "counter stopped changing: {before}");
    let reply = t.cmd("set initialized 8").await?;
    ensure!(reply.starts_with("SET"), "the target answered {reply:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ide_session_from_attach_to_disconnect() -> Result<()> {
    if !require_root_perf() || !require_node_dap() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    t.cmd("threads 20").await?;
    t.cmd("spin 2").await?;
    let result = async {
        let out = node_test("session.test.mjs", &daemon, &t, &[]).await?;
        eprintln!("{out}");
        target_is_free(&daemon, &mut t).await
    }
    .await;
    daemon.finish(result)
}

/// Serves `wpctl dap --listen tcp://127.0.0.1:0`; returns it and its port.
async fn listening_adapter(daemon: &Daemon) -> Result<(tokio::process::Child, u16)> {
    let mut child = tokio::process::Command::new(find_bin("wpctl")?)
        .args([
            "--endpoint",
            &daemon.endpoint(),
            "dap",
            "--listen",
            "tcp://127.0.0.1:0",
        ])
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(child.stderr.take().context("no stderr")?).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .context("the adapter did not say where it listens")??
        .context("the adapter exited")?;
    let port = line
        .rsplit(':')
        .next()
        .and_then(|p| p.trim().parse().ok())
        .with_context(|| format!("no port in {line:?}"))?;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, port))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_leaves_the_target_running() -> Result<()> {
    if !require_root_perf() || !require_node_dap() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    t.cmd("spin 2").await?;
    let result = async {
        // 1. The IDE's connection closes mid-stop (no disconnect): the
        //    adapter cleans up. Over TCP, with the adapter still serving.
        let (mut adapter, port) = listening_adapter(&daemon).await?;
        node_test(
            "gone.test.mjs",
            &daemon,
            &t,
            &[("GONE", "close".into()), ("DAP_PORT", port.to_string())],
        )
        .await?;
        target_is_free(&daemon, &mut t)
            .await
            .context("after the client closed")?;
        // The adapter serves the next session on the same port.
        node_test(
            "gone.test.mjs",
            &daemon,
            &t,
            &[
                ("GONE", "disconnect".into()),
                ("DAP_PORT", port.to_string()),
            ],
        )
        .await?;
        target_is_free(&daemon, &mut t)
            .await
            .context("after a disconnect")?;
        adapter.kill().await?;
        // 2. The adapter itself is killed mid-stop (SIGKILL: no cleanup of
        //    its own): the daemon ends its lease.
        node_test("gone.test.mjs", &daemon, &t, &[("GONE", "kill".into())]).await?;
        target_is_free(&daemon, &mut t)
            .await
            .context("after the adapter was killed")
    }
    .await;
    daemon.finish(result)
}
