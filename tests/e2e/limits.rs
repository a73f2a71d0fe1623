//! The daemon cannot be made unreachable by others: connections are capped per caller with a
//! reserve for privileged callers, idle connections are closed (connections with a stream open
//! are not), HTTP/2 streams per connection are bounded and the memory they took comes back,
//! event subscriptions are capped per caller with a reserve, and running out of file
//! descriptors makes the accept loop back off instead of spinning. Hostile clients are
//! `wpd-probe` processes running as unprivileged users (65534, 65533, 65532), speaking raw
//! HTTP/2 where the point is to ignore the protocol's limits.

use std::time::Duration;

use anyhow::{Result, ensure};
use wpd_proto::v1::GetStatsRequest;
use wpd_tests::{
    Backend, Daemon, EventStream, Probe, TargetProc, poll_until, probe_number, require_root_perf,
    rpc_ok, run_wpctl, set_watchpoint, write_spec,
};

const NOBODY: u32 = 65534;
const OTHER: u32 = 65533;
const THIRD: u32 = 65532;
const T: Duration = Duration::from_secs(20);

/// Root's `wpctl caps` works.
async fn root_gets_in(daemon: &Daemon) -> Result<()> {
    let r = run_wpctl(&["--endpoint", &daemon.endpoint(), "caps"], T).await?;
    ensure!(r.code == Some(0), "root could not reach the daemon: {r:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_cannot_take_every_connection() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start_open(&[
        "--max-connections-per-caller",
        "8",
        "--max-connections",
        "16",
    ])
    .await?;
    let sock = daemon.socket_path().display().to_string();
    let result = async {
        let mut nobody = Probe::start(Some(NOBODY), &["hold", &sock, "40"]).await?;
        let open = probe_number(&nobody.line(T).await?, "OPEN")?;
        ensure!(
            open == 8,
            "uid {NOBODY} kept {open} of 40 connections, limit 8"
        );
        root_gets_in(&daemon).await?;
        let mut other = Probe::start(Some(OTHER), &["hold", &sock, "40"]).await?;
        let open = probe_number(&other.line(T).await?, "OPEN")?;
        ensure!(open == 8, "uid {OTHER} kept {open} connections, limit 8");
        // 16 unprivileged connections are open: a third user gets none, root still gets in.
        let mut third = Probe::start(Some(THIRD), &["hold", &sock, "4"]).await?;
        let open = probe_number(&third.line(T).await?, "OPEN")?;
        ensure!(
            open == 0,
            "uid {THIRD} got {open} connections past the daemon-wide limit"
        );
        root_gets_in(&daemon).await?;
        let mut client = daemon.client().await?;
        let stats = rpc_ok("GetStats", client.get_stats(GetStatsRequest {})).await?;
        ensure!(
            stats.connections_refused >= 32 + 32 + 4,
            "connections_refused {}",
            stats.connections_refused
        );
        for (p, who) in [(nobody, NOBODY), (other, OTHER)] {
            let kept = probe_number(&p.finish(T).await?, "KEPT")?;
            ensure!(
                kept == 8,
                "uid {who}'s admitted connections were closed: {kept} left"
            );
        }
        drop(third);
        Ok(())
    }
    .await;
    daemon.finish(result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_streams_are_not() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start_open(&["--idle-timeout", "2"]).await?;
    let sock = daemon.socket_path().display().to_string();
    let mut target = TargetProc::start(&["--threads", "2"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let mut events = EventStream::for_pid(&mut client, target.pid).await?;
        let idle = Probe::start(Some(NOBODY), &["hold", &sock, "3"]).await?;
        let mut idle = idle;
        ensure!(
            probe_number(&idle.line(T).await?, "OPEN")? == 3,
            "not admitted"
        );
        // 2 s after they went quiet the daemon closes them (it counts each as it lets it go;
        // a loaded machine may take longer to get there).
        let mut c = client.clone();
        poll_until(T, "3 connections closed as idle", async || {
            let s = rpc_ok("GetStats", c.get_stats(GetStatsRequest {})).await?;
            Ok(if s.connections_idled >= 3 {
                Ok(())
            } else {
                Err(format!("{} closed as idle", s.connections_idled))
            })
        })
        .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let kept = probe_number(&idle.finish(T).await?, "KEPT")?;
        ensure!(
            kept == 0,
            "{kept} idle connections still open after the idle timeout"
        );
        // The subscriber's connection stayed: its stream still delivers.
        set_watchpoint(
            &mut client,
            write_spec(Backend::Perf, target.pid, target.vars[2]),
        )
        .await?;
        target.write(2, 9).await?;
        events.collect_hits(1, T).await?;
        let stats = rpc_ok("GetStats", client.get_stats(GetStatsRequest {})).await?;
        ensure!(
            stats.connections_idled >= 3,
            "connections_idled {}",
            stats.connections_idled
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_streams_are_bounded_and_their_memory_returns() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start_open(&[]).await?;
    let sock = daemon.socket_path().display().to_string();
    let result = async {
        root_gets_in(&daemon).await?;
        let base = daemon.rss_kib()?;
        // 4 connections × 25,000 streams whose requests never end.
        let mut flood = Probe::start(Some(NOBODY), &["half-open", &sock, "4", "25000"]).await?;
        let line = flood.line(Duration::from_secs(60)).await?;
        let sent = probe_number(&line, "SENT")?;
        let during = daemon.rss_kib()?;
        ensure!(sent > 0, "nothing sent: {line}");
        ensure!(
            during < base + 64 * 1024,
            "RSS went from {base} KiB to {during} KiB under {sent} half-open streams ({line})"
        );
        root_gets_in(&daemon).await?;
        flood.finish(T).await?;
        poll_until(
            Duration::from_secs(10),
            "the daemon's memory back near its baseline",
            async || {
                let now = daemon.rss_kib()?;
                Ok(if now <= base + 16 * 1024 {
                    Ok(())
                } else {
                    Err(format!("{now} KiB, {base} KiB before, {during} KiB during"))
                })
            },
        )
        .await?;
        root_gets_in(&daemon).await
    }
    .await;
    daemon.finish(result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_are_capped_per_caller_with_a_reserve_for_root() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    // 40 in all, of which 24 for unprivileged callers, at most 10 each.
    let daemon = Daemon::start_open(&[
        "--max-subscribers",
        "40",
        "--max-subscribers-per-caller",
        "10",
    ])
    .await?;
    let sock = daemon.socket_path().display().to_string();
    let result = async {
        let mut held = Vec::new();
        for (uid, want) in [(NOBODY, 10), (OTHER, 10), (THIRD, 4)] {
            let mut p = Probe::start(Some(uid), &["subscribe", &sock, "20"]).await?;
            let line = p.line(T).await?;
            let got = probe_number(&line, "SUBSCRIBED")?;
            ensure!(
                got == want && line.contains("ResourceExhausted"),
                "uid {uid}: {line:?}, expected {want} subscriptions, then RESOURCE_EXHAUSTED"
            );
            held.push(p);
        }
        // Root takes the reserve: 16 more, then no more.
        let mut root = Probe::start(None, &["subscribe", &sock, "17"]).await?;
        let line = root.line(T).await?;
        ensure!(
            probe_number(&line, "SUBSCRIBED")? == 16 && line.contains("ResourceExhausted"),
            "root: {line:?}"
        );
        let mut client = daemon.client().await?;
        let stats = rpc_ok("GetStats", client.get_stats(GetStatsRequest {})).await?;
        ensure!(stats.subscribers == 40, "subscribers {}", stats.subscribers);
        drop(held);
        drop(root);
        Ok(())
    }
    .await;
    daemon.finish(result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_fds_the_accept_loop_backs_off_and_recovers() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    // Limits that do not protect: only the fd limit stops the flood.
    let daemon = Daemon::start_with_args_and_fd_limit(
        &[
            "--max-connections",
            "5000",
            "--max-connections-per-caller",
            "5000",
        ],
        160,
    )
    .await?;
    let sock = daemon.socket_path().display().to_string();
    let result = async {
        // A connection made before the flood: it asks the health service
        // and the stats while the daemon is out of fds.
        let channel = wpd_proto::connect::channel(&daemon.target()).await?;
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
        let mut client = wpd_proto::v1::watchpoints_client::WatchpointsClient::new(channel);
        let mut status = async || -> Result<_> {
            Ok(health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: wpd_proto::SERVICE_NAME.into(),
                })
                .await?
                .into_inner()
                .status())
        };
        use tonic_health::pb::health_check_response::ServingStatus;
        ensure!(status().await? == ServingStatus::Serving);
        let mut flood = Probe::start(None, &["hold", &sock, "400"]).await?;
        let open = probe_number(&flood.line(T).await?, "OPEN")?;
        ensure!(
            open < 400,
            "every connection was kept ({open}) under RLIMIT_NOFILE 160"
        );
        // The daemon says it cannot serve, and why.
        poll_until(Duration::from_secs(10), "health NOT_SERVING", async || {
            let s = status().await?;
            Ok(if s == ServingStatus::NotServing {
                Ok(())
            } else {
                Err(format!("{s:?}"))
            })
        })
        .await?;
        let stats = client.get_stats(GetStatsRequest {}).await?.into_inner();
        ensure!(
            stats.degraded.contains("out of file descriptors"),
            "GetStats.degraded: {:?}",
            stats.degraded
        );
        // Out of fds with connections still queued: no busy loop.
        let cpu0 = daemon.cpu_time()?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let used = daemon.cpu_time()? - cpu0;
        ensure!(
            used < Duration::from_millis(500),
            "the daemon used {used:?} of CPU in 2 s while out of fds"
        );
        flood.finish(T).await?;
        poll_until(
            Duration::from_secs(10),
            "health SERVING again",
            async || {
                let s = status().await?;
                Ok(if s == ServingStatus::Serving {
                    Ok(())
                } else {
                    Err(format!("{s:?}"))
                })
            },
        )
        .await?;
        poll_until(
            Duration::from_secs(10),
            "root to get in again",
            async || {
                let r = run_wpctl(&["--endpoint", &daemon.endpoint(), "caps"], T).await?;
                Ok(if r.code == Some(0) {
                    Ok(())
                } else {
                    Err(r.stderr)
                })
            },
        )
        .await?;
        let mut client = daemon.client().await?;
        let stats = rpc_ok("GetStats", client.get_stats(GetStatsRequest {})).await?;
        ensure!(
            stats.connections_refused > 0,
            "no refusal counted: {stats:?}"
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// A plain-TCP daemon on loopback with a token, killed and cleaned up on drop.
struct TokenDaemon {
    child: tokio::process::Child,
    dir: std::path::PathBuf,
    port: u16,
    token: String,
}

impl TokenDaemon {
    async fn start(extra: &[&str]) -> Result<TokenDaemon> {
        let dir = wpd_tests::unique_temp_dir("wpd-preauth")?;
        let token = "preauth-test-token-1234".to_string();
        let token_file = dir.join("token");
        std::fs::write(&token_file, &token)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600))?;
        }
        let port = wpd_tests::free_port()?;
        let child = tokio::process::Command::new(wpd_tests::bin_path("wpd"))
            .arg("--listen")
            .arg(format!("tcp://127.0.0.1:{port}"))
            .arg("--token-file")
            .arg(&token_file)
            .arg("--state-dir")
            .arg("none")
            .args(extra)
            .env("WPD_STATE_FILE", dir.join("ptrace-armed"))
            .stderr(std::fs::File::create(dir.join("wpd.log"))?)
            .kill_on_drop(true)
            .spawn()?;
        let d = TokenDaemon {
            child,
            dir,
            port,
            token,
        };
        poll_until(T, "the daemon to answer", async || {
            Ok(match d.call().await {
                Ok(()) => Ok(()),
                Err(e) => Err(format!("{e:#}")),
            })
        })
        .await?;
        Ok(d)
    }

    fn uri(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A token holder's GetStats on a connection of its own.
    async fn call(&self) -> Result<()> {
        let ch = tonic::transport::Endpoint::from_shared(self.uri())?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await?;
        let mut c = wpd_proto::v1::watchpoints_client::WatchpointsClient::new(ch);
        let mut req = tonic::Request::new(GetStatsRequest {});
        req.metadata_mut()
            .insert("authorization", format!("Bearer {}", self.token).parse()?);
        tokio::time::timeout(Duration::from_secs(5), c.get_stats(req)).await??;
        Ok(())
    }
}

impl Drop for TokenDaemon {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if std::thread::panicking()
            && let Ok(log) = std::fs::read_to_string(self.dir.join("wpd.log"))
        {
            eprintln!("----- wpd log -----\n{log}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Connections that never present the token cannot lock token holders out
/// of a TCP daemon: health and reflection streams without the token are
/// refused (UNAUTHENTICATED) instead of holding a connection forever, and
/// connections that send nothing wait in a small budget of their own, the
/// oldest closed to admit a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_without_the_token_cannot_lock_token_holders_out() -> Result<()> {
    let d = TokenDaemon::start(&["--max-connections-per-caller", "4"]).await?;
    // 12 connections, each with a health watch stream and no token.
    let mut watches = Vec::new();
    let mut refused = 0;
    for _ in 0..12 {
        let ch = tonic::transport::Endpoint::from_shared(d.uri())?
            .connect()
            .await?;
        let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
        match tokio::time::timeout(
            Duration::from_secs(5),
            h.watch(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            }),
        )
        .await?
        {
            Err(s) if s.code() == tonic::Code::Unauthenticated => refused += 1,
            other => watches.push((h, other)),
        }
    }
    ensure!(
        refused == 12,
        "{refused} of 12 health streams without the token were refused"
    );
    d.call().await?;
    // 40 connections that connect and send nothing at all.
    let mut silent = Vec::new();
    for _ in 0..40 {
        silent.push(tokio::net::TcpStream::connect(("127.0.0.1", d.port)).await?);
    }
    for round in 0..3 {
        d.call()
            .await
            .map_err(|e| e.context(format!("round {round}: the token holder was locked out")))?;
    }
    drop(watches);
    drop(silent);
    Ok(())
}
