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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use wpd_proto::v1 as pb;
use wpd_tests::{
    CTarget, Daemon, ctarget_path, find_bin, line_of, require_node_dap, require_root_perf,
    run_wpctl_as, unique_temp_dir,
};

/// Runs `tests/dap/<script>` with node's test runner; returns its output.
async fn node_test(
    script: &str,
    daemon: &Daemon,
    t: &CTarget,
    extra: &[(&str, String)],
) -> Result<String> {
    node_test_as(None, script, daemon, t, extra).await
}

/// [`node_test`] as user `uid` (group = uid, no other groups) when given.
async fn node_test_as(
    uid: Option<u32>,
    script: &str,
    daemon: &Daemon,
    t: &CTarget,
    extra: &[(&str, String)],
) -> Result<String> {
    let mut vars = vec![
        ("TARGET_PID", t.pid.to_string()),
        ("COUNTER_ADDR", format!("{:#x}", t.addr("counter"))),
        ("CONN1STATE_ADDR", format!("{:#x}", t.addr("conn1state"))),
        ("ITEM_ADDR", format!("{:#x}", t.addr("item"))),
        ("BUMP_LINE", line_of("bump_counter").1.to_string()),
        ("SPIN_LINE", line_of("spin_worker").1.to_string()),
    ];
    vars.extend(extra.iter().cloned());
    node_run(uid, script, daemon, &vars).await
}

/// Runs `tests/dap/<script>` with `vars` set besides the adapter's and the
/// daemon's.
async fn node_run(
    uid: Option<u32>,
    script: &str,
    daemon: &Daemon,
    vars: &[(&str, String)],
) -> Result<String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("dap");
    let mut cmd = tokio::process::Command::new("node");
    if let Some(uid) = uid {
        // As root, std drops the supplementary groups with the ids.
        cmd.uid(uid).gid(uid);
    }
    cmd.arg("--test")
        .arg("--test-reporter=spec")
        .arg(dir.join(script))
        .current_dir(&dir)
        .env("WPCTL", find_bin("wpctl")?)
        .env("WPD_ENDPOINT", daemon.endpoint())
        .kill_on_drop(true);
    for (k, v) in vars {
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
    t.changes("counter").await.context("after the session")?;
    let reply = t.cmd("set initialized 8").await?;
    ensure!(reply.starts_with("SET"), "the target answered {reply:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ide_session_from_attach_to_disconnect() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    require_node_dap();
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

/// A function breakpoint on a running process
/// (`tests/dap/codeattach.test.mjs`): it stops a spinning thread in
/// `bump_counter`, and every thread with it; removed and continued, the
/// target runs on with nothing of the session left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_breakpoint_stops_a_running_process() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    require_node_dap();
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    t.cmd("spin 2").await?;
    let result = async {
        let out = node_test("codeattach.test.mjs", &daemon, &t, &[]).await?;
        eprintln!("{out}");
        target_is_free(&daemon, &mut t).await
    }
    .await;
    daemon.finish(result)
}

/// `evaluate` with a frameId: `c->refs` where `c` is a parameter of the
/// frame the thread is held in (`tests/dap/locals.test.mjs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evaluate_in_a_frame_follows_a_local_pointer() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    require_node_dap();
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    t.cmd("spin 1").await?;
    t.cmd("refspin").await?;
    let result = async {
        let out = node_test("locals.test.mjs", &daemon, &t, &[]).await?;
        eprintln!("{out}");
        target_is_free(&daemon, &mut t).await
    }
    .await;
    daemon.finish(result)
}

/// `launch` (`tests/dap/launch.test.mjs`): the adapter starts
/// `ct-launch` held before its first instruction; a data breakpoint by name
/// set during configuration stops main's first store; `stopOnEntry`; the
/// program's output and exit code; Registers and Globals; a program that
/// cannot start. Afterwards no launched program runs, and the daemon
/// watches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ide_launches_its_program() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    require_node_dap();
    let daemon = Daemon::start().await?;
    let program = ctarget_path("ct-launch");
    let result = async {
        let out = node_run(
            None,
            "launch.test.mjs",
            &daemon,
            &[
                ("TARGET_PID", "0".into()),
                ("LAUNCH_PROGRAM", program.display().to_string()),
            ],
        )
        .await?;
        eprintln!("{out}");
        let left = launched_left(&program);
        ensure!(left.is_empty(), "launched programs still running: {left:?}");
        let mut client = daemon.client().await?;
        let list = client
            .list_watchpoints(pb::ListWatchpointsRequest { pid: 0 })
            .await?
            .into_inner();
        ensure!(
            list.watchpoints.is_empty(),
            "watchpoints left: {:?}",
            list.watchpoints
        );
        Ok(())
    }
    .await;
    // Whatever failed, no launched program outlives the test.
    for pid in launched_left(&program) {
        // SAFETY: kill(2) on a pid that runs the test's own program.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    daemon.finish(result)
}

/// Function and line breakpoints (`tests/dap/codebreak.test.mjs`) on
/// `ct-breaks`, launched by the adapter: set during configuration, they
/// stop the program's first call before it runs on; a data breakpoint set
/// from the stop's locals catches the writer; names and lines without code
/// are refused one by one. Afterwards nothing is left in the daemon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_and_line_breakpoints_stop_a_launched_program() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    require_node_dap();
    let daemon = Daemon::start().await?;
    let program = ctarget_path("ct-breaks");
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("c/breaks.c");
    let result = async {
        let out = node_run(
            None,
            "codebreak.test.mjs",
            &daemon,
            &[
                ("TARGET_PID", "0".into()),
                ("BREAKS_PROGRAM", program.display().to_string()),
                ("BREAKS_SOURCE", source.display().to_string()),
            ],
        )
        .await?;
        eprintln!("{out}");
        let left = launched_left(&program);
        ensure!(left.is_empty(), "launched programs still running: {left:?}");
        let mut client = daemon.client().await?;
        let list = client
            .list_watchpoints(pb::ListWatchpointsRequest { pid: 0 })
            .await?
            .into_inner();
        ensure!(
            list.watchpoints.is_empty(),
            "watchpoints left: {:?}",
            list.watchpoints
        );
        Ok(())
    }
    .await;
    for pid in launched_left(&program) {
        // SAFETY: kill(2) on a pid that runs the test's own program.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    daemon.finish(result)
}

/// Pending breakpoints (`tests/dap/pending.test.mjs`) on `ct-pie`,
/// launched by the adapter: `libctlib.so:lib_addr` (during configuration),
/// `lib_addr` alone (at the entry stop) and a line of `ctlib.c` (during
/// configuration), set before the dynamic linker mapped the library, are
/// answered unverified and pending, then verified by a `changed` event once
/// the library is mapped, and the program's call stops there. Afterwards
/// nothing is left in the daemon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_function_and_line_breakpoints_in_a_launched_program() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    require_node_dap();
    let daemon = Daemon::start().await?;
    // A copy of its own (with the library it loads from its directory):
    // what is left running, and killed, afterwards is found by the
    // program's path, which other tests' ct-pie targets must not share.
    let dir = unique_temp_dir("wpd-dap-pending")?;
    for f in ["ct-pie", "libctlib.so"] {
        std::fs::copy(ctarget_path(f), dir.join(f)).with_context(|| format!("copying {f}"))?;
    }
    let program = dir.join("ct-pie");
    let lib_source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("c/ctlib.c");
    let result = async {
        let out = node_run(
            None,
            "pending.test.mjs",
            &daemon,
            &[
                ("TARGET_PID", "0".into()),
                ("PENDING_PROGRAM", program.display().to_string()),
                ("CTLIB_SOURCE", lib_source.display().to_string()),
                ("LIB_ADDR_LINE", line_of("lib_addr").1.to_string()),
            ],
        )
        .await?;
        eprintln!("{out}");
        let left = launched_left(&program);
        ensure!(left.is_empty(), "launched programs still running: {left:?}");
        let mut client = daemon.client().await?;
        let list = client
            .list_watchpoints(pb::ListWatchpointsRequest { pid: 0 })
            .await?
            .into_inner();
        ensure!(
            list.watchpoints.is_empty(),
            "watchpoints left: {:?}",
            list.watchpoints
        );
        Ok(())
    }
    .await;
    for pid in launched_left(&program) {
        // SAFETY: kill(2) on a pid that runs the test's own program.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = std::fs::remove_dir_all(&dir);
    daemon.finish(result)
}

/// Live (not zombie) processes running `program`.
fn launched_left(program: &std::path::Path) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == program)
                && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
                    st.rsplit_once(") ")
                        .is_some_and(|(_, rest)| rest.starts_with('Z'))
                })
        })
        .collect()
}

/// A running `wpctl dap --listen ...` and what it wrote on stderr.
struct Adapter {
    child: tokio::process::Child,
    /// The TCP port it listens on (tcp:// addresses).
    port: Option<u16>,
    /// Its stderr lines after the first (log lines).
    log: Arc<Mutex<Vec<String>>>,
}

impl Adapter {
    /// Serves `wpctl dap --listen LISTEN EXTRA...` (as root, the test's
    /// user), once it says where it listens.
    async fn start(daemon: &Daemon, listen: &str, extra: &[&str]) -> Result<Adapter> {
        let mut child = tokio::process::Command::new(find_bin("wpctl")?)
            .args(["--endpoint", &daemon.endpoint(), "dap", "--listen", listen])
            .args(extra)
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = BufReader::new(child.stderr.take().context("no stderr")?).lines();
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .context("the adapter did not say where it listens")??
            .context("the adapter exited")?;
        ensure!(line.contains("listening on"), "the adapter said {line:?}");
        let port = listen
            .starts_with("tcp://")
            .then(|| line.rsplit(':').next().and_then(|p| p.trim().parse().ok()))
            .flatten();
        ensure!(
            port.is_some() || !listen.starts_with("tcp://"),
            "no port in {line:?}"
        );
        let log = Arc::new(Mutex::new(Vec::new()));
        let keep = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(l)) = lines.next_line().await {
                keep.lock().unwrap().push(l);
            }
        });
        Ok(Adapter { child, port, log })
    }

    /// Waits (10 s at most) for a log line containing every one of `words`.
    async fn logged(&self, words: &[&str]) -> Result<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(l) = self
                .log
                .lock()
                .unwrap()
                .iter()
                .find(|l| words.iter().all(|w| l.contains(w)))
            {
                return Ok(l.clone());
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "the adapter logged no line with {words:?}; it logged:\n{}",
                    self.log.lock().unwrap().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its peak resident memory (VmHWM), in KiB.
    fn peak_kib(&self) -> Result<u64> {
        let pid = self.child.id().context("the adapter exited")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmHWM")
    }
}

/// Serves `wpctl dap --listen tcp://127.0.0.1:0`; returns it and its port.
async fn listening_adapter(daemon: &Daemon) -> Result<(tokio::process::Child, u16)> {
    let a = Adapter::start(daemon, "tcp://127.0.0.1:0", &[]).await?;
    let port = a.port.context("no port")?;
    Ok((a.child, port))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_leaves_the_target_running() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    require_node_dap();
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

/// The uid the attacker's client runs as.
const NOBODY: u32 = 65534;

/// Nothing of a refused connection reached the daemon: the target was never
/// attached, and has no watchpoint.
async fn never_attached(daemon: &Daemon, t: &CTarget) -> Result<()> {
    let mut client = daemon.client().await?;
    match client
        .list_threads(pb::ListThreadsRequest {
            pid: t.pid,
            ..Default::default()
        })
        .await
    {
        Err(s) if s.code() == tonic::Code::NotFound => {}
        other => bail!("process {} is attached in the daemon: {other:?}", t.pid),
    }
    let list = client
        .list_watchpoints(pb::ListWatchpointsRequest { pid: t.pid })
        .await?
        .into_inner();
    ensure!(list.watchpoints.is_empty(), "{:?}", list.watchpoints);
    Ok(())
}

/// Another local user reaches a root adapter's port or socket: its
/// connection is refused before anything is read (the real DAP client, run
/// as uid 65534, sends initialize, attach to a root process and readMemory
/// at once), the refusal is logged, and the daemon never hears of it. The
/// adapter's own user is served on the same listeners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_user_cannot_act_through_the_adapter() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    require_node_dap();
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    t.cmd("spin 2").await?;
    let dir = unique_temp_dir("wpd-dap-test")?;
    let result = async {
        // 1. Loopback TCP: uid 65534 connects to root's port.
        let tcp = Adapter::start(&daemon, "tcp://127.0.0.1:0", &[]).await?;
        let port = tcp.port.context("no port")?.to_string();
        node_test_as(
            Some(NOBODY),
            "refused.test.mjs",
            &daemon,
            &t,
            &[("DAP_PORT", port.clone()), ("EXPECT", "adapter".into())],
        )
        .await
        .context("uid 65534 over TCP")?;
        let line = tcp
            .logged(&[
                "refused a DAP connection from tcp 127.0.0.1:",
                "comes from uid 65534",
            ])
            .await?;
        eprintln!("adapter: {line}");
        never_attached(&daemon, &t).await?;
        // The adapter's own user, on the same port: a whole session.
        node_test(
            "gone.test.mjs",
            &daemon,
            &t,
            &[("GONE", "disconnect".into()), ("DAP_PORT", port)],
        )
        .await
        .context("root over TCP")?;
        target_is_free(&daemon, &mut t).await?;

        // 2. A Unix socket: mode 0600 keeps uid 65534 from connecting; with
        //    the mode widened (a mistake, or a path another program
        //    exposes), the adapter still refuses it by SO_PEERCRED.
        let path = dir.join("dap.sock");
        let listen = format!("unix:{}", path.display());
        let unix = Adapter::start(&daemon, &listen, &[]).await?;
        let socket = [("DAP_SOCKET", path.display().to_string())];
        node_test_as(
            Some(NOBODY),
            "refused.test.mjs",
            &daemon,
            &t,
            &[socket[0].clone(), ("EXPECT", "eacces".into())],
        )
        .await
        .context("uid 65534 on the socket, mode 0600")?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
        }
        node_test_as(
            Some(NOBODY),
            "refused.test.mjs",
            &daemon,
            &t,
            &[socket[0].clone(), ("EXPECT", "adapter".into())],
        )
        .await
        .context("uid 65534 on the socket, mode 0666")?;
        unix.logged(&["refused a DAP connection from unix", "comes from uid 65534"])
            .await?;
        never_attached(&daemon, &t).await?;
        node_test(
            "gone.test.mjs",
            &daemon,
            &t,
            &[socket[0].clone(), ("GONE", "close".into())],
        )
        .await
        .context("root on the socket")?;
        target_is_free(&daemon, &mut t).await?;
        drop(unix);
        drop(tcp);
        Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    daemon.finish(result)
}

/// Addresses other hosts could reach are refused at start, with the way to
/// reach the adapter safely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adapter_does_not_listen_beyond_this_host() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let result = async {
        for addr in ["tcp://0.0.0.0:0", "tcp://[::]:0"] {
            let out = run_wpctl_as(
                None,
                &["--endpoint", &daemon.endpoint(), "dap", "--listen", addr],
                Duration::from_secs(20),
            )
            .await?;
            ensure!(out.code == Some(2), "{addr}: {out:?}");
            ensure!(
                out.stderr.contains("not a loopback address") && out.stderr.contains("ssh -L"),
                "{addr}: {}",
                out.stderr
            );
        }
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// One DAP request on a raw connection; its answer (events skipped).
async fn raw_request(
    r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    w: &mut tokio::net::tcp::OwnedWriteHalf,
    command: &str,
) -> Result<serde_json::Value> {
    raw_request_with(r, w, command, serde_json::json!({"adapterID": "raw"})).await
}

/// [`raw_request`] with these arguments.
async fn raw_request_with(
    r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    w: &mut tokio::net::tcp::OwnedWriteHalf,
    command: &str,
    arguments: serde_json::Value,
) -> Result<serde_json::Value> {
    let req = serde_json::json!({"seq": 1, "type": "request", "command": command,
        "arguments": arguments});
    wpd_dap::wire::write_message(w, &req).await?;
    loop {
        let m = tokio::time::timeout(Duration::from_secs(20), wpd_dap::wire::read_message(r))
            .await
            .context("no answer within 20 s")??;
        if m["type"] == "response" {
            return Ok(m);
        }
    }
}

/// Waits (20 s at most) for the adapter to end `r`'s connection.
async fn ended(r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> Result<()> {
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(20), r.read(&mut buf)).await {
            Err(_) => bail!("the adapter kept the connection open for 20 s"),
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(()),
            Ok(Ok(_)) => {}
        }
    }
}

async fn connect(
    port: u16,
) -> Result<(
    BufReader<tokio::net::tcp::OwnedReadHalf>,
    tokio::net::tcp::OwnedWriteHalf,
)> {
    let s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let (r, w) = s.into_split();
    Ok((BufReader::new(r), w))
}

/// `--max-sessions`: the connection past the cap gets an error response to
/// its first request (id 403) and is closed, with a log line; a session
/// that ends makes room for the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_past_the_cap_are_refused() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let result = async {
        let a = Adapter::start(&daemon, "tcp://127.0.0.1:0", &["--max-sessions", "2"]).await?;
        let port = a.port.context("no port")?;
        let mut first = connect(port).await?;
        let mut second = connect(port).await?;
        for (r, w) in [&mut first, &mut second] {
            let init = raw_request(r, w, "initialize").await?;
            ensure!(init["success"] == true, "{init}");
        }
        let (mut r, mut w) = connect(port).await?;
        let refused = raw_request(&mut r, &mut w, "initialize").await?;
        ensure!(refused["success"] == false, "{refused}");
        ensure!(refused["body"]["error"]["id"] == 403, "{refused}");
        ensure!(
            refused["message"]
                .as_str()
                .is_some_and(|m| m.contains("--max-sessions")),
            "{refused}"
        );
        ended(&mut r).await?;
        a.logged(&["refused a DAP connection from tcp", "serves 2 sessions"])
            .await?;
        // The first session ends; a new one is served (once the adapter has
        // seen the end).
        drop(first);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (mut r, mut w) = connect(port).await?;
            let init = raw_request(&mut r, &mut w, "initialize").await?;
            if init["success"] == true {
                break;
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "no session after one ended: {init}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        drop(second);
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// A peer sending an endless header line, or announcing a huge body, is cut
/// off after a bounded number of bytes, and the adapter's memory does not
/// grow with what it sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_headers_and_huge_bodies_are_cut_off() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let result = async {
        let a = Adapter::start(&daemon, "tcp://127.0.0.1:0", &[]).await?;
        let port = a.port.context("no port")?;
        let before = a.peak_kib()?;

        // 1. 256 MiB of one header line: the adapter stops reading and
        //    closes after its bound, and the writes fail long before.
        let (mut r, mut w) = connect(port).await?;
        let chunk = vec![b'a'; 64 << 10];
        let total: u64 = 256 << 20;
        let mut sent = 0u64;
        while sent < total {
            match tokio::time::timeout(Duration::from_secs(20), w.write_all(&chunk)).await {
                Err(_) => bail!("the adapter neither read nor closed after {sent} bytes"),
                Ok(Err(_)) => break,
                Ok(Ok(())) => sent += chunk.len() as u64,
            }
        }
        ensure!(
            sent < total,
            "the adapter took all {total} bytes of a header line"
        );
        ended(&mut r).await?;
        let after = a.peak_kib()?;
        eprintln!(
            "endless header: {sent} bytes written before the adapter closed; peak memory {before} KiB -> {after} KiB"
        );
        ensure!(
            after < before + 32 * 1024,
            "the adapter's peak memory grew from {before} KiB to {after} KiB"
        );

        // 2. A body of 8 MiB announced: refused at the header.
        let (mut r, mut w) = connect(port).await?;
        w.write_all(b"Content-Length: 8388608\r\n\r\n{").await?;
        ended(&mut r).await?;

        // 3. The adapter still serves.
        let (mut r, mut w) = connect(port).await?;
        let init = raw_request(&mut r, &mut w, "initialize").await?;
        ensure!(init["success"] == true, "{init}");
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// Each kind of failure answers with its own error id (the table in
/// `adapters/dap/src/error.rs`), not one id for all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_have_their_own_error_ids() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let result = async {
        let a = Adapter::start(&daemon, "tcp://127.0.0.1:0", &[]).await?;
        let (mut r, mut w) = connect(a.port.context("no port")?).await?;
        let own_pid = std::process::id();
        let cases = [
            ("frobnicate", serde_json::json!({}), 100),
            ("stackTrace", serde_json::json!({"threadId": "x"}), 101),
            (
                "launch",
                serde_json::json!({"program": "/nonexistent/program"}),
                102,
            ),
            ("stepBack", serde_json::json!({"threadId": 1}), 103),
            ("next", serde_json::json!({"threadId": 1}), 110),
            (
                "readMemory",
                serde_json::json!({"memoryReference": "0x1000", "count": 8}),
                110,
            ),
            (
                "variables",
                serde_json::json!({"variablesReference": 5}),
                110,
            ),
            ("scopes", serde_json::json!({"frameId": 5}), 112),
            ("attach", serde_json::json!({}), 120),
            (
                "attach",
                serde_json::json!({"pid": own_pid, "backend": "gdb"}),
                121,
            ),
            (
                "attach",
                serde_json::json!({"pid": own_pid, "stopOnHit": "some"}),
                122,
            ),
        ];
        for (command, args, id) in cases {
            let resp = raw_request_with(&mut r, &mut w, command, args.clone()).await?;
            ensure!(
                resp["success"] == false && resp["body"]["error"]["id"] == id,
                "{command} {args}: expected error id {id}, got {resp}"
            );
            ensure!(resp["message"] == resp["body"]["error"]["format"], "{resp}");
        }
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// `tests/c/stepping.c` (`variant`) with `workers` worker threads, killed
/// on drop.
pub(crate) struct Stepping(std::process::Child);

impl Stepping {
    pub(crate) fn start(variant: &str, workers: usize) -> Result<Stepping> {
        Self::start_with(variant, workers, &[])
    }

    /// With `args` after the workers' count (`handoff`: the stepper's loop
    /// waits each time for a worker's answer).
    pub(crate) fn start_with(variant: &str, workers: usize, args: &[&str]) -> Result<Stepping> {
        let mut child = std::process::Command::new(ctarget_path(variant))
            .arg(workers.to_string())
            .args(args)
            .stdout(Stdio::piped())
            .spawn()?;
        // "ready N" once every thread is made.
        let mut out = std::io::BufReader::new(child.stdout.take().context("stdout")?);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line)?;
        ensure!(line.starts_with("ready"), "the target said {line:?}");
        Ok(Stepping(child))
    }

    pub(crate) fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    /// Alive, no thread traced or stopped, none left held by the daemon.
    pub(crate) async fn is_free(&mut self, daemon: &Daemon) -> Result<()> {
        let pid = self.pid();
        let mut client = daemon.client().await?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let held = match client
                .list_threads(pb::ListThreadsRequest {
                    pid,
                    ..Default::default()
                })
                .await
            {
                Ok(r) => r
                    .into_inner()
                    .threads
                    .iter()
                    .filter(|th| th.state != pb::ThreadState::Running as i32)
                    .count(),
                Err(s) if s.code() == tonic::Code::NotFound => 0,
                Err(s) => return Err(s.into()),
            };
            if held == 0 {
                break;
            }
            ensure!(std::time::Instant::now() < deadline, "{held} threads held");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        client
            .detach(pb::DetachRequest { pid })
            .await
            .map(|_| ())
            .or_else(|s| {
                if s.code() == tonic::Code::NotFound {
                    Ok(())
                } else {
                    Err(s)
                }
            })?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        ensure!(self.0.try_wait()?.is_none(), "the target died");
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            let dir = task?.path();
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
            let state = stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
            ensure!(
                !matches!(state, Some('t' | 'T')),
                "{}: {state:?}",
                dir.display()
            );
            let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
            ensure!(
                status
                    .lines()
                    .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["TracerPid:", "0"]),
                "{} still traced",
                dir.display()
            );
        }
        Ok(())
    }
}

impl Drop for Stepping {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `tests/dap/step.test.mjs` on `variant` with `workers` workers.
async fn step_session(variant: &str, workers: usize, vars: &[(&str, &str)]) -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    require_node_dap();
    let daemon = Daemon::start().await?;
    let mut t = Stepping::start(variant, workers)?;
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("c/stepping.c");
    let result = async {
        let mut env = vec![
            ("TARGET_PID", t.pid().to_string()),
            ("STEP_SOURCE", source.display().to_string()),
        ];
        env.extend(vars.iter().map(|(k, v)| (*k, v.to_string())));
        let out = node_run(None, "step.test.mjs", &daemon, &env).await?;
        eprintln!("{out}");
        t.is_free(&daemon).await
    }
    .await;
    daemon.finish(result)
}

/// next, stepIn, stepOut and instruction steps on a program built at -O0
/// (lines checked), and the steps that end at a code breakpoint inside a
/// call and at another thread's data breakpoint; the target alive and
/// untraced after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_land_on_lines_at_o0() -> Result<()> {
    step_session("ct-step", 4, &[]).await
}

/// The same at -O2 (functions checked; lines move).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_land_in_functions_at_o2() -> Result<()> {
    step_session("ct-step-o2", 4, &[("OPT", "O2")]).await
}

/// Steps of one thread of a process of 1,000 more (`singleThread`: the
/// others stay held while it steps). The steps only: the stops at a code
/// breakpoint and at a data breakpoint every worker writes are checked
/// beside 4 workers (above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_beside_a_thousand_threads() -> Result<()> {
    step_session("ct-step", 1000, &[("SINGLE", "1"), ("STEPS_ONLY", "1")]).await
}

/// Steps of one thread while 1,000 others run (`"stopOnHit": "thread"`,
/// `singleThread: false`), the function breakpoint kept and hit again
/// after `continue`: every step ends with its `stopped` and removing the
/// breakpoint at `disconnect` answers (closing a step's uprobes, whose
/// kernel grace period the running threads can stretch to tens of
/// seconds, is never waited for on a request's way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_while_a_thousand_threads_run() -> Result<()> {
    step_session(
        "ct-step",
        1000,
        &[("STOP_ON_HIT", "thread"), ("SINGLE", "0")],
    )
    .await
}

/// `tests/dap/setvar.test.mjs`: setVariable changes a local and a struct's
/// member in a held thread's caller frame, and the program's next call
/// gets the values they make; a bad value, a register and a running
/// thread's local are refused, each with its DAP error id; the target
/// alive and untraced after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_variable_changes_what_the_program_does() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    require_node_dap();
    let daemon = Daemon::start().await?;
    let mut t = Stepping::start("ct-step", 4)?;
    let result = async {
        let env = [("TARGET_PID", t.pid().to_string())];
        let out = node_run(None, "setvar.test.mjs", &daemon, &env).await?;
        eprintln!("{out}");
        t.is_free(&daemon).await
    }
    .await;
    daemon.finish(result)
}
