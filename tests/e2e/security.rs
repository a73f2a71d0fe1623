//! Authorization: a caller may act on a process only where the kernel would
//! let that caller ptrace it. Callers and targets run as unprivileged users
//! (uids 65534 and 65533, started by the test); the daemon runs as root.

use std::time::Duration;

use anyhow::{Result, bail, ensure};
use wpd_tests::{
    Daemon, TargetProc, kernel_allows_access, machine_skip, require_root_perf, run_wpctl_as,
};

const NOBODY: u32 = 65534;
const OTHER: u32 = 65533;
const T: Duration = Duration::from_secs(20);

/// A daemon whose socket every user may connect to: authorization alone
/// decides.
async fn open_daemon() -> Result<Daemon> {
    Daemon::start_open(&[]).await
}

/// Yama's `kernel.yama.ptrace_scope` here (0 without Yama).
fn yama_scope() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// A user watches its own process; another user can neither watch it, nor list, inspect or
/// remove its watchpoint, nor count it, nor receive its hits. Where Yama's scope is 1 or more
/// the kernel forbids an unprivileged user to trace a process it did not start: the owner's
/// steps are skipped there (and root sets the watchpoint), the other user's run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_watch_their_own_processes_and_nothing_else() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let yama = yama_scope();
    let owner = yama == 0
        || machine_skip(&format!(
            "kernel.yama.ptrace_scope={yama} forbids the unprivileged owner's steps \
             (the other user's steps run)"
        ));
    users_and_owners(owner).await
}

/// The other user's steps as a machine with Yama scope ≥ 1 runs them (whatever the scope
/// here): root sets the watchpoint on the user's process, whose hits flow; another user is
/// refused and shown nothing all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_user_is_refused_without_the_owners_steps() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    users_and_owners(false).await
}

/// [`users_watch_their_own_processes_and_nothing_else`]'s steps; `owner`: the owner's too
/// (else root sets the watchpoint).
async fn users_and_owners(owner: bool) -> Result<()> {
    let daemon = open_daemon().await?;
    let mine = TargetProc::start_as(NOBODY, &["--threads", "2"]).await?;
    let roots = TargetProc::start(&["--threads", "2"]).await?;
    let ep = daemon.endpoint();
    let result = async {
        let addr = format!("{:#x}", mine.vars[0]);
        let pid = mine.pid.to_string();
        // The owner may watch its own process (else root sets it).
        let ok = run_wpctl_as(
            owner.then_some(NOBODY),
            &["--endpoint", &ep, "watch", "--pid", &pid, "--addr", &addr],
            T,
        )
        .await?;
        ensure!(ok.code == Some(0), "owner watch: {ok:?}");
        // Another user may not: exit 7 (permission denied), one line naming the uid.
        let other = run_wpctl_as(
            Some(OTHER),
            &["--endpoint", &ep, "watch", "--pid", &pid, "--addr", &addr],
            T,
        )
        .await?;
        ensure!(
            other.code == Some(7),
            "other user's watch must be denied: {other:?}"
        );
        ensure!(
            other.stderr.contains("uid 65533"),
            "message should say why: {other:?}"
        );
        ensure!(
            other.stderr.trim().lines().count() == 1,
            "one line: {other:?}"
        );
        // ... nor list it, see its threads or remove its watchpoint.
        let list = run_wpctl_as(Some(OTHER), &["--endpoint", &ep, "--json", "list"], T).await?;
        ensure!(list.code == Some(0), "{list:?}");
        let v: serde_json::Value = serde_json::from_str(&list.stdout)?;
        ensure!(
            v["watchpoints"].as_array().is_some_and(|a| a.is_empty()),
            "another user must not see the watchpoint: {}",
            list.stdout
        );
        let threads = run_wpctl_as(
            Some(OTHER),
            &["--endpoint", &ep, "threads", "--pid", &pid],
            T,
        )
        .await?;
        ensure!(
            threads.code == Some(7),
            "threads of another user's process: {threads:?}"
        );
        let unwatch = run_wpctl_as(Some(OTHER), &["--endpoint", &ep, "unwatch", "1"], T).await?;
        ensure!(
            unwatch.code == Some(7),
            "unwatch of another user's watchpoint: {unwatch:?}"
        );
        // An unprivileged user may not watch a root process.
        let root_pid = roots.pid.to_string();
        let root_addr = format!("{:#x}", roots.vars[0]);
        let denied = run_wpctl_as(
            Some(NOBODY),
            &[
                "--endpoint",
                &ep,
                "watch",
                "--pid",
                &root_pid,
                "--addr",
                &root_addr,
            ],
            T,
        )
        .await?;
        ensure!(
            denied.code == Some(7),
            "watching a root process: {denied:?}"
        );
        // The owner still sees its own watchpoint, and only that.
        if owner {
            let own = run_wpctl_as(Some(NOBODY), &["--endpoint", &ep, "--json", "list"], T).await?;
            let v: serde_json::Value = serde_json::from_str(&own.stdout)?;
            let ws = v["watchpoints"].as_array().cloned().unwrap_or_default();
            ensure!(
                ws.len() == 1,
                "owner should see exactly its watchpoint: {}",
                own.stdout
            );
        }
        // Nor count it in their stats; the owner counts only its own.
        let counts: &[(u32, u64)] = if owner {
            &[(OTHER, 0), (NOBODY, 1)]
        } else {
            &[(OTHER, 0)]
        };
        for &(uid, want) in counts {
            let st = run_wpctl_as(Some(uid), &["--endpoint", &ep, "--json", "stats"], T).await?;
            let v: serde_json::Value = serde_json::from_str(&st.stdout)?;
            ensure!(
                v["processes"] == want && v["watchpoints"] == want && v["perf_fds"] == 0,
                "uid {uid}'s stats must count only its own processes ({want}): {}",
                st.stdout
            );
        }
        let st = run_wpctl_as(None, &["--endpoint", &ep, "--json", "stats"], T).await?;
        let v: serde_json::Value = serde_json::from_str(&st.stdout)?;
        ensure!(
            v["processes"] == 1 && v["perf_fds"].as_u64() > Some(0),
            "root: {}",
            st.stdout
        );
        // Events: the other user's stream carries none of this process's hits.
        let ev = run_wpctl_as(
            Some(OTHER),
            &["--endpoint", &ep, "events", "--count", "1", "--hits-only"],
            Duration::from_secs(3),
        )
        .await;
        ensure!(
            ev.is_err(),
            "another user must not receive the hits: {ev:?}"
        );
        // ... while hits flow: the owner (or root) receives them.
        let mine_ev = run_wpctl_as(
            owner.then_some(NOBODY),
            &["--endpoint", &ep, "events", "--count", "3", "--hits-only"],
            T,
        )
        .await?;
        ensure!(
            mine_ev.code == Some(0) && mine_ev.stdout.lines().count() == 3,
            "owner events: {mine_ev:?}"
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// One target of [`wpd_agrees_with_the_kernel`]: how it is started, and what the kernel is
/// expected to answer an unprivileged caller of uid/gid `NOBODY`.
struct Case {
    what: &'static str,
    /// (uid, gid) it is started as; `None`: root, which then changes ids itself.
    ids: Option<(u32, u32)>,
    args: &'static [&'static str],
    allowed: bool,
}

const CASES: &[Case] = &[
    Case {
        what: "the caller's own process",
        ids: Some((NOBODY, NOBODY)),
        args: &[],
        allowed: true,
    },
    Case {
        what: "its own process after prctl(PR_SET_DUMPABLE, 0)",
        ids: Some((NOBODY, NOBODY)),
        args: &["--undumpable"],
        allowed: false,
    },
    Case {
        what: "a process that dropped from root to the caller's ids (not dumpable)",
        ids: None,
        args: &["--become", "65534:65534"],
        allowed: false,
    },
    Case {
        what: "the same, dumpable again",
        ids: None,
        args: &["--become", "65534:65534", "--dumpable"],
        allowed: true,
    },
    Case {
        what: "the caller's ids but root's permitted capabilities kept",
        ids: None,
        args: &["--become", "65534:65534", "--keep-caps", "--dumpable"],
        allowed: false,
    },
    Case {
        what: "another user's process",
        ids: Some((OTHER, OTHER)),
        args: &[],
        allowed: false,
    },
    Case {
        what: "the caller's uid with another gid",
        ids: Some((NOBODY, OTHER)),
        args: &[],
        allowed: false,
    },
];

/// The daemon's answer to an unprivileged caller is the kernel's answer to that same caller:
/// for each target, `wpctl watch` as uid 65534 succeeds exactly when the kernel lets uid 65534
/// read the target's memory (`process_vm_readv`, the check `PTRACE_SEIZE` makes). Among the
/// targets: a process of the caller's own uid that made itself non-dumpable, one that dropped
/// from root (non-dumpable by the kernel's rule), and one that kept root's capabilities. Under
/// Yama's scope 1 or more every case is one the kernel denies (none is the caller's child).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wpd_agrees_with_the_kernel() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let yama = yama_scope();
    let daemon = open_daemon().await?;
    let ep = daemon.endpoint();
    let result = async {
        let mut disagreements = Vec::new();
        for case in CASES {
            let args: Vec<&str> = ["--threads", "2"]
                .iter()
                .chain(case.args)
                .copied()
                .collect();
            let target = match case.ids {
                Some((u, g)) => TargetProc::start_as_ids(u, g, &args).await?,
                None => TargetProc::start(&args).await?,
            };
            let addr = target.vars[0];
            let kernel = kernel_allows_access(NOBODY, NOBODY, target.pid, addr).await?;
            // Yama's scope 1 lets an unprivileged caller trace its descendants only (the
            // probe is no target's ancestor), 2 only a caller with CAP_SYS_PTRACE, 3 nobody:
            // each case is denied there, and wpd must deny it too.
            let allowed = case.allowed && yama == 0;
            ensure!(
                kernel == allowed,
                "{}: the kernel says {} (the test's premise is wrong here)",
                case.what,
                if kernel { "allowed" } else { "denied" }
            );
            let pid = target.pid.to_string();
            let hex = format!("{addr:#x}");
            let watch = run_wpctl_as(
                Some(NOBODY),
                &["--endpoint", &ep, "watch", "--pid", &pid, "--addr", &hex],
                T,
            )
            .await?;
            let wpd = match watch.code {
                Some(0) => true,
                Some(7) => false,
                _ => bail!("{}: wpctl watch: {watch:?}", case.what),
            };
            if wpd != kernel {
                disagreements.push(format!(
                    "{}: kernel {}, wpd {} ({})",
                    case.what,
                    if kernel { "allows" } else { "denies" },
                    if wpd { "allowed" } else { "denied" },
                    watch.stderr.trim()
                ));
                continue;
            }
            if !kernel {
                // Nor does the caller see the process's events, nor its threads.
                let threads = run_wpctl_as(
                    Some(NOBODY),
                    &["--endpoint", &ep, "threads", "--pid", &pid],
                    T,
                )
                .await?;
                ensure!(
                    threads.code == Some(7),
                    "{}: threads: {threads:?}",
                    case.what
                );
                let events = run_wpctl_as(
                    Some(NOBODY),
                    &["--endpoint", &ep, "events", "--pid", &pid, "--count", "1"],
                    T,
                )
                .await?;
                ensure!(events.code == Some(7), "{}: events: {events:?}", case.what);
            }
        }
        ensure!(disagreements.is_empty(), "{disagreements:#?}");
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// A root watchpoint on a process the caller may not trace streams nothing to that caller,
/// even on a subscription to every process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_of_an_undumpable_process_never_reach_its_uid() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = open_daemon().await?;
    let ep = daemon.endpoint();
    let target = TargetProc::start_as(NOBODY, &["--threads", "2", "--undumpable"]).await?;
    let result = async {
        let pid = target.pid.to_string();
        let hex = format!("{:#x}", target.vars[0]);
        let root = run_wpctl_as(
            None,
            &["--endpoint", &ep, "watch", "--pid", &pid, "--addr", &hex],
            T,
        )
        .await?;
        ensure!(root.code == Some(0), "root may watch it: {root:?}");
        let root_events = run_wpctl_as(
            None,
            &["--endpoint", &ep, "events", "--count", "3", "--hits-only"],
            T,
        )
        .await?;
        ensure!(
            root_events.code == Some(0),
            "root sees the hits: {root_events:?}"
        );
        let theirs = run_wpctl_as(
            Some(NOBODY),
            &["--endpoint", &ep, "events", "--count", "1", "--hits-only"],
            Duration::from_secs(3),
        )
        .await;
        ensure!(
            theirs.is_err(),
            "uid {NOBODY} must not receive hits of its non-dumpable process: {theirs:?}"
        );
        let list = run_wpctl_as(Some(NOBODY), &["--endpoint", &ep, "--json", "list"], T).await?;
        let v: serde_json::Value = serde_json::from_str(&list.stdout)?;
        ensure!(
            v["processes"].as_array().is_some_and(|a| a.is_empty()),
            "nor see it listed: {}",
            list.stdout
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// Makes files readable and writable by their owner only (`wpctl` refuses a token file its
/// group or others may read).
fn private(paths: &[&std::path::Path]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for p in paths {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// TCP: refused without a token; with one, every call must carry it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_requires_a_token() -> Result<()> {
    use std::process::Stdio;
    let wpd = wpd_tests::find_bin("wpd")?;
    let dir = std::env::temp_dir().join(format!("wpd-tcp-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let token = dir.join("token");
    std::fs::write(&token, "correct-horse-battery-staple\n")?;
    let wrong = dir.join("wrong");
    std::fs::write(&wrong, "correct-horse-battery-stapler\n")?;
    // wpctl takes only private token files.
    private(&[&token, &wrong])?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let listen = format!("tcp://127.0.0.1:{port}");
    let state = dir.join("state");

    // Without a token the daemon refuses to listen on TCP at all.
    let no_token = tokio::process::Command::new(&wpd)
        .args(["--listen", &listen])
        .env("WPD_STATE_FILE", &state)
        .env("WPD_STATE_DIR", dir.join("state-dir"))
        .stderr(Stdio::piped())
        .output()
        .await?;
    let err = String::from_utf8_lossy(&no_token.stderr);
    ensure!(
        !no_token.status.success() && err.contains("token"),
        "{no_token:?}"
    );
    // Nor on a non-loopback address (no TLS yet).
    let wide = tokio::process::Command::new(&wpd)
        .args(["--listen", "tcp://0.0.0.0:1", "--token-file"])
        .arg(&token)
        .stderr(Stdio::piped())
        .output()
        .await?;
    ensure!(
        String::from_utf8_lossy(&wide.stderr).contains("without TLS"),
        "{wide:?}"
    );

    let mut daemon = tokio::process::Command::new(&wpd)
        .args(["--listen", &listen, "--token-file"])
        .arg(&token)
        .env("WPD_STATE_FILE", &state)
        .env("WPD_STATE_DIR", dir.join("state-dir"))
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let ep = listen.clone();
    let result = async {
        // Wait for the daemon (the token is needed even for caps).
        let token_arg = token.to_string_lossy().to_string();
        let mut up = false;
        for _ in 0..100 {
            let r = run_wpctl_as(
                None,
                &["--endpoint", &ep, "--token-file", &token_arg, "caps"],
                T,
            )
            .await?;
            if r.code == Some(0) {
                up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ensure!(up, "daemon on {ep} did not come up");
        let none = run_wpctl_as(None, &["--endpoint", &ep, "caps"], T).await?;
        ensure!(none.code == Some(7), "no token must be refused: {none:?}");
        let wrong_arg = wrong.to_string_lossy().to_string();
        let bad = run_wpctl_as(
            None,
            &["--endpoint", &ep, "--token-file", &wrong_arg, "list"],
            T,
        )
        .await?;
        ensure!(
            bad.code == Some(7) && bad.stderr.contains("invalid token"),
            "{bad:?}"
        );
        // The scheme is case-insensitive (RFC 7235 §2.1); one header only.
        let channel = wpd_proto::connect::channel(
            &ep.parse::<wpd_proto::connect::Target>()
                .map_err(anyhow::Error::msg)?,
        )
        .await?;
        let mut client = wpd_proto::v1::watchpoints_client::WatchpointsClient::new(channel.clone());
        let with = |values: &[&str]| {
            let mut r = tonic::Request::new(wpd_proto::v1::GetStatsRequest {});
            for v in values {
                r.metadata_mut().append("authorization", v.parse().unwrap());
            }
            r
        };
        for scheme in ["bearer", "BEARER", "Bearer"] {
            let r = client
                .get_stats(with(&[&format!("{scheme} correct-horse-battery-staple")]))
                .await;
            ensure!(r.is_ok(), "scheme {scheme:?} refused: {r:?}");
        }
        let two = client
            .get_stats(with(&[
                "Bearer correct-horse-battery-staple",
                "Bearer correct-horse-battery-staple",
            ]))
            .await;
        ensure!(
            matches!(&two, Err(s) if s.code() == tonic::Code::Unauthenticated
                && s.message().contains("2 `authorization` headers")),
            "two authorization headers: {two:?}"
        );
        // Health answers without a token (probes of orchestrators send none); it names no
        // process.
        let health = tonic_health::pb::health_client::HealthClient::new(channel)
            .check(tonic_health::pb::HealthCheckRequest {
                service: wpd_proto::SERVICE_NAME.into(),
            })
            .await?;
        ensure!(
            health.into_inner().status
                == tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "health without a token"
        );
        // A token too long for an HTTP/2 header: one clear line, nothing sent.
        let huge = dir.join("huge");
        std::fs::write(&huge, "x".repeat(5000))?;
        private(&[&huge])?;
        let huge_arg = huge.to_string_lossy().to_string();
        let long = run_wpctl_as(
            None,
            &["--endpoint", &ep, "--token-file", &huge_arg, "caps"],
            T,
        )
        .await?;
        ensure!(
            long.code == Some(2)
                && long.stderr.contains("at most 4096 bytes")
                && long.stderr.trim().lines().count() == 1,
            "{long:?}"
        );
        let refused = tokio::process::Command::new(&wpd)
            .args(["--listen", "tcp://127.0.0.1:1", "--token-file"])
            .arg(&huge)
            .env("WPD_STATE_FILE", &state)
            .env("WPD_STATE_DIR", dir.join("state-dir"))
            .stderr(Stdio::piped())
            .output()
            .await?;
        ensure!(
            !refused.status.success()
                && String::from_utf8_lossy(&refused.stderr).contains("at most 4096"),
            "wpd with a 5000-byte token: {refused:?}"
        );
        Ok(())
    }
    .await;
    let _ = daemon.start_kill();
    let _ = daemon.wait().await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// TLS on TCP: a client that trusts the daemon's certificate and holds the
/// token gets in; plaintext and untrusted clients do not. (Loopback only:
/// tests never listen beyond this machine.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_token_on_tcp() -> Result<()> {
    use std::process::Stdio;
    let wpd = wpd_tests::find_bin("wpd")?;
    let dir = std::env::temp_dir().join(format!("wpd-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])?;
    let (cert_pem, key_pem) = (key.cert.pem(), key.signing_key.serialize_pem());
    let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()])?;
    let paths = [
        ("cert.pem", cert_pem),
        ("key.pem", key_pem),
        ("other.pem", other.cert.pem()),
        ("token", "tls-token\n".into()),
    ];
    for (name, text) in &paths {
        std::fs::write(dir.join(name), text)?;
    }
    private(&[&dir.join("token")])?;
    let p = |n: &str| dir.join(n).to_string_lossy().to_string();
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut daemon = tokio::process::Command::new(&wpd)
        .args(["--listen", &format!("tcp://127.0.0.1:{port}")])
        .args([
            "--token-file",
            &p("token"),
            "--tls-cert",
            &p("cert.pem"),
            "--tls-key",
            &p("key.pem"),
        ])
        .env("WPD_STATE_FILE", dir.join("state"))
        .env("WPD_STATE_DIR", dir.join("state-dir"))
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let tls_ep = format!("https://127.0.0.1:{port}");
    let plain_ep = format!("tcp://127.0.0.1:{port}");
    let result = async {
        let good = [
            "--endpoint",
            &tls_ep,
            "--tls-ca",
            &p("cert.pem"),
            "--token-file",
            &p("token"),
            "caps",
        ];
        let mut up = false;
        for _ in 0..100 {
            if run_wpctl_as(None, &good, T).await?.code == Some(0) {
                up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ensure!(
            up,
            "TLS daemon on {tls_ep} never answered a trusted client with the token"
        );
        let plain = run_wpctl_as(
            None,
            &["--endpoint", &plain_ep, "--token-file", &p("token"), "caps"],
            T,
        )
        .await?;
        ensure!(
            plain.code != Some(0),
            "plaintext must not work on a TLS listener: {plain:?}"
        );
        let untrusted = run_wpctl_as(
            None,
            &[
                "--endpoint",
                &tls_ep,
                "--tls-ca",
                &p("other.pem"),
                "--token-file",
                &p("token"),
                "caps",
            ],
            T,
        )
        .await?;
        ensure!(
            untrusted.code == Some(3),
            "an untrusted certificate must fail the connection: {untrusted:?}"
        );
        let no_token = run_wpctl_as(
            None,
            &["--endpoint", &tls_ep, "--tls-ca", &p("cert.pem"), "caps"],
            T,
        )
        .await?;
        ensure!(
            no_token.code == Some(7),
            "TLS does not replace the token: {no_token:?}"
        );
        Ok(())
    }
    .await;
    let _ = daemon.start_kill();
    let _ = daemon.wait().await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Hits of watchpoint `id` a root replay of the whole journal finds.
async fn journaled_hits(daemon: &Daemon, id: u64) -> Result<usize> {
    use tokio_stream::StreamExt;
    use wpd_proto::v1::stream_events_response::Event as E;
    use wpd_proto::v1::*;
    let mut c = daemon.client().await?;
    let head = c
        .get_stats(GetStatsRequest {})
        .await?
        .into_inner()
        .journal_written_seq;
    let mut s = c
        .stream_events(StreamEventsRequest {
            raw: true,
            after_seq: Some(0),
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut n = 0;
    while let Some(m) = tokio::time::timeout(T, s.next()).await? {
        let m = m?;
        if let Some(E::Hit(h)) = &m.event
            && h.watchpoint_id == id
        {
            n += 1;
        }
        if m.seq >= head {
            break;
        }
    }
    Ok(n)
}

/// Watchpoint ids of the hits `uid` replays from the journal (`wpctl events
/// --since 0`), exactly `count` of them.
async fn replayed_hit_ids(daemon: &Daemon, uid: u32, count: usize) -> Result<Vec<u64>> {
    let out = run_wpctl_as(
        Some(uid),
        &[
            "--endpoint",
            &daemon.endpoint(),
            "--json",
            "events",
            "--since",
            "0",
            "--hits-only",
            "--count",
            &count.to_string(),
        ],
        T,
    )
    .await?;
    ensure!(out.code == Some(0), "uid {uid}: {out:?}");
    let mut ids = Vec::new();
    for line in out.stdout.lines() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        if let Some(id) = v["hit"]["watchpoint_id"]
            .as_u64()
            .or(v["watchpoint_id"].as_u64())
        {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// Who may see an event is decided on the process it was about (pid and
/// start time, and its owner then), not on whoever holds the pid when the
/// event is read: another user's process that takes over an exited
/// process's pid does not make its journaled hits that user's, and the
/// exited process's owner still gets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journaled_hits_go_to_the_owner_of_the_process_not_of_its_pid() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = open_daemon().await?;
    let result = async {
        let mut c = daemon.client().await?;
        // The first process, NOBODY's: hits, then it exits.
        let mut a =
            TargetProc::start_as(NOBODY, &["--threads", "1", "--interval-us", "2000"]).await?;
        let pid = a.pid;
        let wa = wpd_tests::set_watchpoint(
            &mut c,
            wpd_tests::write_spec(wpd_tests::Backend::Perf, pid, a.vars[0]),
        )
        .await?
        .watchpoint
        .unwrap()
        .id;
        a.wait_counter_above(50, T).await?;
        a.quit().await?;
        // OTHER's process gets the same pid (the kernel hands out the one
        // after `ns_last_pid`; other forks on the machine may take it first).
        let mut b = None;
        for _ in 0..50 {
            std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())?;
            let t =
                TargetProc::start_as(OTHER, &["--threads", "1", "--interval-us", "2000"]).await?;
            if t.pid == pid {
                b = Some(t);
                break;
            }
        }
        let Some(mut b) = b else {
            bail!("pid {pid} was never handed out again");
        };
        let wb = wpd_tests::set_watchpoint(
            &mut c,
            wpd_tests::write_spec(wpd_tests::Backend::Perf, pid, b.vars[0]),
        )
        .await?
        .watchpoint
        .unwrap()
        .id;
        b.wait_counter_above(50, T).await?;
        let r = c
            .remove_watchpoint(wpd_proto::v1::RemoveWatchpointRequest { id: wb })
            .await;
        ensure!(r.is_ok(), "{r:?}");
        // Both gone now: what the journal recorded decides (not Yama's
        // view of a live process).
        b.quit().await?;
        let (na, nb) = (
            journaled_hits(&daemon, wa).await?,
            journaled_hits(&daemon, wb).await?,
        );
        ensure!(na > 0 && nb > 0, "hits journaled: {na} and {nb}");
        // OTHER, who owns the pid now, gets its own hits and none of NOBODY's
        // (which the journal holds first).
        let ids = replayed_hit_ids(&daemon, OTHER, nb).await?;
        ensure!(
            ids.len() == nb && ids.iter().all(|&i| i == wb),
            "uid {OTHER} replayed hits of {:?}, want {nb} of {wb} only",
            ids.iter().collect::<std::collections::BTreeSet<_>>()
        );
        // NOBODY still gets those of its process, gone as it is.
        let ids = replayed_hit_ids(&daemon, NOBODY, na).await?;
        ensure!(
            ids.len() == na && ids.iter().all(|&i| i == wa),
            "uid {NOBODY} replayed hits of {:?}, want {na} of {wa} only",
            ids.iter().collect::<std::collections::BTreeSet<_>>()
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}
