//! What one caller cannot take from the others: the daemon's file descriptors, kernel memory
//! for code events, attached processes, and the count of what it holds (watchpoints, code
//! events and policies together). In each test an unprivileged user (uid 65534) takes as much
//! as it may on processes of its own, through `wpctl` on a socket every user may reach; the
//! test checks the typed refusal, that the kernel's side agrees (the daemon's fds, its BPF
//! maps' memory), and that root and the daemon's health are unaffected.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use tokio::io::AsyncBufReadExt;
use wpd_proto::v1::{GetStatsRequest, ListWatchpointsRequest};
use wpd_tests::{
    Backend, CTarget, CmdOutput, Daemon, TargetProc, ctarget_path, require_backend, rpc_ok,
    run_wpctl_as, unique_temp_dir, wait_for_subscribers,
};

const NOBODY: u32 = 65534;
const OTHER: u32 = 65533;
const T: Duration = Duration::from_secs(30);
/// `wpctl`'s exit code for RESOURCE_EXHAUSTED.
const EXHAUSTED: i32 = 6;

/// A copy of C target `variant` that any user may run (its own directory, 0755, removed on
/// drop), started as `uid`.
struct UsersTarget {
    target: CTarget,
    dir: PathBuf,
}

impl UsersTarget {
    async fn start(variant: &str, uid: u32) -> Result<UsersTarget> {
        use std::os::unix::fs::PermissionsExt;
        let dir = unique_temp_dir("wpd-shares")?;
        let exe = dir.join(variant);
        std::fs::copy(ctarget_path(variant), &exe)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        let target = CTarget::start_path_as(&exe, variant, uid).await?;
        Ok(UsersTarget { target, dir })
    }
}

impl Drop for UsersTarget {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `wpctl --endpoint <daemon> args`, as `uid` (root: `None`).
async fn wpctl(daemon: &Daemon, uid: Option<u32>, args: &[&str]) -> Result<CmdOutput> {
    let ep = daemon.endpoint();
    let mut all = vec!["--endpoint", ep.as_str()];
    all.extend_from_slice(args);
    run_wpctl_as(uid, &all, T).await
}

async fn ok(daemon: &Daemon, uid: Option<u32>, args: &[&str]) -> Result<CmdOutput> {
    let out = wpctl(daemon, uid, args).await?;
    ensure!(
        out.code == Some(0),
        "`wpctl {}` as {uid:?}: {out:?}",
        args.join(" ")
    );
    Ok(out)
}

/// A refusal: exit `code` and one `wpctl: ` line saying each of `says`.
fn refused(out: &CmdOutput, code: i32, says: &[&str], what: &str) -> Result<()> {
    let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.is_empty()).collect();
    ensure!(
        out.code == Some(code)
            && lines.len() == 1
            && lines[0].starts_with("wpctl: ")
            && says.iter().all(|s| lines[0].contains(s)),
        "{what}: expected exit {code} and one line saying {says:?}: {out:?}"
    );
    Ok(())
}

/// How many watchpoints and code events the daemon lists on `pid` (as root).
async fn listed(daemon: &Daemon, pid: i32) -> Result<usize> {
    let mut c = daemon.client().await?;
    let l = rpc_ok(
        "ListWatchpoints",
        c.list_watchpoints(ListWatchpointsRequest { pid }),
    )
    .await?;
    Ok(l.watchpoints.len())
}

/// A field of `wpctl --json stats` as `uid`.
async fn stat(daemon: &Daemon, uid: Option<u32>, path: &[&str]) -> Result<u64> {
    let out = ok(daemon, uid, &["--json", "stats"]).await?;
    let v: serde_json::Value = serde_json::from_str(&out.stdout)?;
    let mut at = &v;
    for p in path {
        at = &at[p];
    }
    at.as_u64()
        .with_context(|| format!("no number at {path:?} in {v}"))
}

/// One user's code breakpoints (a uprobe and a BPF program each) are counted in the
/// daemon's fd budget: with `RLIMIT_NOFILE` 400 and 150 fds kept for connections, the user is
/// refused with FD_LIMIT (saying the last ones are kept for root) before the daemon runs out;
/// a ptrace watchpoint it then asks for is refused the same way (not as a failed
/// PTRACE_POKEUSER). Root's requests keep working, root sees and the user removes the user's
/// breakpoints, health says serving, and the daemon's fds stay under the limit less the
/// connections' share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_code_events_cannot_take_every_fd() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    const LIMIT: usize = 400;
    let daemon = Daemon::start_open_with_fd_limit(&["--fd-headroom", "150"], LIMIT as u64).await?;
    let users = UsersTarget::start("ct-objects", NOBODY).await?;
    let root = CTarget::start("ct-objects").await?;
    let result = async {
        let p = users.target.pid.to_string();
        let mut set = 0;
        let refusal = loop {
            let out = wpctl(
                &daemon,
                Some(NOBODY),
                &["break", "--pid", &p, "conn_set_state"],
            )
            .await?;
            if out.code != Some(0) {
                break out;
            }
            set += 1;
            ensure!(set < LIMIT, "{set} breakpoints, never refused");
        };
        refused(
            &refusal,
            EXHAUSTED,
            &[
                "not enough file descriptors",
                "kept for root",
                "RLIMIT_NOFILE is 400",
            ],
            "the breakpoint past the user's share",
        )?;
        ensure!(set >= 20, "only {set} breakpoints before the refusal");
        let fds = daemon.fd_count()?;
        ensure!(
            fds < LIMIT - 100,
            "the daemon holds {fds} fds of {LIMIT} with 150 kept for connections"
        );
        // A ptrace watchpoint of the user's needs an fd per thread: refused as FD_LIMIT.
        let out = wpctl(
            &daemon,
            Some(NOBODY),
            &["watch", "--pid", &p, "--symbol", "per_thread"],
        )
        .await?;
        refused(
            &out,
            EXHAUSTED,
            &["not enough file descriptors"],
            "the user's watchpoint",
        )?;
        ensure!(!out.stderr.contains("POKEUSER"), "{out:?}");
        // The user removes one of its own and may set one again.
        let list = ok(&daemon, Some(NOBODY), &["--json", "list"]).await?;
        let v: serde_json::Value = serde_json::from_str(&list.stdout)?;
        let id = v["watchpoints"][0]["id"]
            .as_u64()
            .with_context(|| format!("no watchpoint in {v}"))?
            .to_string();
        ok(&daemon, Some(NOBODY), &["unwatch", &id]).await?;
        ok(
            &daemon,
            Some(NOBODY),
            &["break", "--pid", &p, "conn_set_state"],
        )
        .await?;
        // Root: a breakpoint and a watchpoint on its own process, its listing, health.
        let r = root.pid.to_string();
        ok(&daemon, None, &["break", "--pid", &r, "conn_set_state"]).await?;
        ok(
            &daemon,
            None,
            &["watch", "--pid", &r, "--symbol", "per_thread"],
        )
        .await?;
        ensure!(
            listed(&daemon, users.target.pid).await? == set,
            "root does not list the user's {set} breakpoints"
        );
        let health = ok(&daemon, None, &["health"]).await?;
        ensure!(health.stdout.starts_with("serving at unix:"), "{health:?}");
        let out = ok(&daemon, Some(NOBODY), &["detach", "--pid", &p]).await?;
        ensure!(
            out.stdout.contains(&format!("removed {set} watchpoints")),
            "the detach does not count the {set} breakpoints: {out:?}"
        );
        // Code probes close in the background past a bound (the kernel's
        // uprobe release waits for its readers): their fds come back as
        // they close, within seconds even on a loaded machine.
        wpd_tests::poll_until(
            Duration::from_secs(60),
            "the user's fds given back after the detach",
            async || {
                let n = stat(&daemon, None, &["caller_fds"]).await?;
                Ok(if n <= 4 {
                    Ok(())
                } else {
                    Err(format!("{n} fds still counted"))
                })
            },
        )
        .await?;
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// Code breakpoints, object watches and policies count with watchpoints against
/// `--max-watchpoints-per-caller`: at 3, a watchpoint, a breakpoint and an object watch fill
/// it, and a fourth of any kind (a breakpoint, a policy) is refused naming the limit; `stats`
/// says what the caller holds; root is not held back by the user's count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_events_and_policies_count_toward_the_callers_limit() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start_open(&["--max-watchpoints-per-caller", "3"]).await?;
    let users = UsersTarget::start("ct-objects", NOBODY).await?;
    let root = CTarget::start("ct-objects").await?;
    let result = async {
        let p = users.target.pid.to_string();
        let u = Some(NOBODY);
        ok(
            &daemon,
            u,
            &[
                "watch",
                "--pid",
                &p,
                "--backend",
                "ptrace",
                "--symbol",
                "per_thread",
            ],
        )
        .await?;
        ok(&daemon, u, &["break", "--pid", &p, "conn_set_state"]).await?;
        ok(
            &daemon,
            u,
            &[
                "watch",
                "--pid",
                &p,
                "--on-return",
                "conn_new",
                "--expr",
                "$ret->state",
            ],
        )
        .await?;
        let says = ["watchpoints, code events and policies per caller (limit 3)"];
        let out = wpctl(&daemon, u, &["break", "--pid", &p, "conn_free"]).await?;
        refused(&out, EXHAUSTED, &says, "a fourth: a breakpoint")?;
        let out = wpctl(
            &daemon,
            u,
            &["watch", "--comm", "ct-objects", "--symbol", "per_thread"],
        )
        .await?;
        refused(&out, EXHAUSTED, &says, "a fourth: a policy")?;
        ensure!(stat(&daemon, u, &["held"]).await? == 3, "held");
        ensure!(stat(&daemon, u, &["held_limit"]).await? == 3, "held_limit");
        ensure!(
            stat(&daemon, u, &["code_events"]).await? == 2,
            "code events"
        );
        // Root's own count is its own.
        let r = root.pid.to_string();
        for _ in 0..3 {
            ok(&daemon, None, &["break", "--pid", &r, "conn_set_state"]).await?;
        }
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// The memory the daemon's BPF hash maps take, as the kernel counts it (`memlock` of each map
/// fd's fdinfo).
fn bpf_hash_map_bytes(daemon: &Daemon) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(format!("/proc/{}/fdinfo", daemon.pid()))? {
        let Ok(info) = std::fs::read_to_string(e?.path()) else {
            continue;
        };
        // BPF_MAP_TYPE_HASH is 1.
        if info
            .lines()
            .any(|l| l.split_whitespace().eq(["map_type:", "1"]))
        {
            total += info
                .lines()
                .find_map(|l| l.strip_prefix("memlock:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(total)
}

/// A code event with a disarming function takes
/// kernel memory as it holds live objects, not 7 MiB up front: the kernel's own count of the
/// daemon's hash maps stays under 1 MiB for one such event; a caller's code events are
/// bounded by `--max-code-event-memory-per-caller` (a second event refused naming the limit,
/// one bounding its live objects with `--max-live` fits); objects are armed and disarmed
/// without a `WatchpointRemoved` each (counted instead); another user's `stats` shows none
/// of these objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_event_memory_is_bounded_and_objects_do_not_flood_the_stream() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start_open(&["--max-code-event-memory-per-caller", "1"]).await?;
    let mut users = UsersTarget::start("ct-objects", NOBODY).await?;
    let result = async {
        let p = users.target.pid.to_string();
        let u = Some(NOBODY);
        let before = bpf_hash_map_bytes(&daemon)?;
        let disarming = [
            "watch",
            "--pid",
            &p,
            "--on-return",
            "conn_new",
            "--expr",
            "$ret->state",
            "--disarm-on",
            "conn_free",
        ];
        ok(&daemon, u, &disarming).await?;
        let grown = bpf_hash_map_bytes(&daemon)?.saturating_sub(before);
        ensure!(
            grown < 1 << 20,
            "one disarming code event took {grown} bytes of hash maps in the kernel"
        );
        let held = stat(&daemon, u, &["code_event_bytes"]).await?;
        ensure!(
            held > 0 && held <= 1 << 20 && held >= grown,
            "stats say the code event takes {held} bytes (the kernel: {grown})"
        );
        let out = wpctl(&daemon, u, &disarming).await?;
        refused(
            &out,
            EXHAUSTED,
            &[
                "kernel memory for code events per caller",
                "limit 1.0 MiB",
                "--max-live",
            ],
            "a second disarming code event",
        )?;
        let mut bounded = disarming.to_vec();
        bounded.extend(["--max-live", "64"]);
        ok(&daemon, u, &bounded).await?;
        // Objects come and go: counted, and the stream says nothing of each.
        let mut client = daemon.client().await?;
        let mut events = wpd_tests::EventStream::for_pid(&mut client, users.target.pid).await?;
        ensure!(users.target.cmd("run 2 50").await? == "RAN n=100");
        let seen = events.drain_for(Duration::from_millis(500)).await?;
        let removed = seen
            .iter()
            .filter(|e| matches!(e, wpd_tests::Event::WatchpointRemoved(_)))
            .count();
        ensure!(
            removed == 0,
            "{removed} WatchpointRemoved events for objects"
        );
        let armed = stat(&daemon, u, &["objects", "armed"]).await?;
        ensure!(armed >= 100, "the user's stats count {armed} objects armed");
        // Another user sees none of them.
        ensure!(
            stat(&daemon, Some(OTHER), &["objects", "armed"]).await? == 0,
            "another user's stats show the user's objects"
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// Attached processes are shared: with `--max-processes 4` (one kept for root) and
/// `--max-processes-per-caller 2`, a user's third attach is refused as over its share,
/// another user's second as over what is not root's, and root still attaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_are_shared_with_a_reserve_for_root() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let daemon =
        Daemon::start_open(&["--max-processes", "4", "--max-processes-per-caller", "2"]).await?;
    let as_user = |uid: u32| format!("{uid}:{uid}");
    let (nobody, other) = (as_user(NOBODY), as_user(OTHER));
    let mut targets = Vec::new();
    for who in [&nobody, &nobody, &nobody, &other, &other] {
        targets.push(TargetProc::start(&["--threads", "1", "--become", who, "--dumpable"]).await?);
    }
    let root = TargetProc::start(&["--threads", "1"]).await?;
    let result = async {
        let pids: Vec<String> = targets.iter().map(|t| t.pid.to_string()).collect();
        ok(&daemon, Some(NOBODY), &["attach", "--pid", &pids[0]]).await?;
        ok(&daemon, Some(NOBODY), &["attach", "--pid", &pids[1]]).await?;
        let out = wpctl(&daemon, Some(NOBODY), &["attach", "--pid", &pids[2]]).await?;
        refused(
            &out,
            EXHAUSTED,
            &["attached processes per caller (limit 2)"],
            "a third",
        )?;
        ok(&daemon, Some(OTHER), &["attach", "--pid", &pids[3]]).await?;
        let out = wpctl(&daemon, Some(OTHER), &["attach", "--pid", &pids[4]]).await?;
        refused(
            &out,
            EXHAUSTED,
            &["the last ones are kept for root", "limit 3"],
            "past what is not root's",
        )?;
        ok(&daemon, None, &["attach", "--pid", &root.pid.to_string()]).await?;
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// The `wpctl --json` hits of `out` (`last`), as (pid, value) pairs.
fn hits_of(out: &CmdOutput) -> Result<Vec<(i64, String)>> {
    let v: serde_json::Value =
        serde_json::from_str(&out.stdout).with_context(|| format!("not JSON: {}", out.stdout))?;
    let hits = v["hits"]
        .as_array()
        .with_context(|| format!("no hits in {v}"))?;
    Ok(hits
        .iter()
        .map(|h| (h["pid"].as_i64().unwrap_or(0), h["value"].to_string()))
        .collect())
}

/// How long each forked child lives after its stores.
const CHILD_LINGER_MS: u32 = 1000;

/// A forked child that makes itself non-dumpable is another user's business to none
/// but root: its hits (the values it stores) reach neither the user's stream, nor its
/// `wpctl last`, nor its aggregates, while a dumpable child's do and root sees both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undumpable_childs_hits_reach_no_read_of_its_parents_user() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let daemon = Daemon::start_open(&[]).await?;
    let who = format!("{NOBODY}:{NOBODY}");
    let mut t = TargetProc::start(&[
        "--threads",
        "1",
        "--interval-us",
        "1000000",
        "--become",
        &who,
        "--dumpable",
    ])
    .await?;
    let result = async {
        let p = t.pid.to_string();
        let addr = format!("{:#x}", t.vars[0]);
        let u = Some(NOBODY);
        let watch = |extra: &'static [&'static str]| {
            let mut v = vec![
                "--json".to_string(),
                "watch".into(),
                "--pid".into(),
                p.clone(),
                "--addr".into(),
                addr.clone(),
                "--follow-forks".into(),
            ];
            v.extend(extra.iter().map(|s| s.to_string()));
            v
        };
        let mut ids = Vec::new();
        for extra in [&["--keep", "500"][..], &["--aggregate"][..]] {
            let args = watch(extra);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = ok(&daemon, u, &args).await?;
            let v: serde_json::Value = serde_json::from_str(&out.stdout)?;
            ids.push(
                v["watchpoint"]["id"]
                    .as_u64()
                    .with_context(|| format!("no id in {v}"))?
                    .to_string(),
            );
        }
        // The user's stream, open before the children store. The count of subscribers is
        // read before it starts: read after, it may already include the stream.
        let mut root = daemon.client().await?;
        let listening = rpc_ok("GetStats", root.get_stats(GetStatsRequest {}))
            .await?
            .subscribers;
        let ep = daemon.endpoint();
        let mut stream = tokio::process::Command::new(wpd_tests::bin_path("wpctl"))
            .args(["--endpoint", &ep, "--json", "events"])
            .uid(NOBODY)
            .gid(NOBODY)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        wait_for_subscribers(&mut root, listening + 1).await?;
        // Each child lives a second after its stores: who it is (dumpable or not) is read from
        // /proc for its hits, and a child gone before its hits are read (a loaded machine can
        // delay that) is judged unknown, its hits then root's only.
        let mut children = Vec::new();
        for cmd in ["fork-undumpable", "fork"] {
            let reply = t.cmd(&format!("{cmd} {CHILD_LINGER_MS}")).await?;
            let child: i64 = reply
                .strip_prefix("FORKED pid=")
                .and_then(|s| s.trim().parse().ok())
                .with_context(|| format!("{cmd}: {reply:?}"))?;
            let waited = t.cmd(&format!("wait-child {child}")).await?;
            ensure!(waited.ends_with("code=0"), "{cmd}: {waited}");
            children.push(child);
        }
        let (hidden, shown) = (children[0], children[1]);
        let pids_in = |text: &str, pid: i64| {
            text.lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|v| v["type"] == "hit" && v["pid"].as_i64() == Some(pid))
                .count()
        };
        // What the stream printed until the shown child's hits came (20 s at most), and for
        // 300 ms more: the hidden child stored first.
        let mut lines =
            tokio::io::BufReader::new(stream.stdout.take().context("stdout is piped")?).lines();
        let mut streamed = String::new();
        let mut end = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut seen_shown = false;
        while let Ok(Ok(Some(line))) = tokio::time::timeout_at(end, lines.next_line()).await {
            if !seen_shown && pids_in(&line, shown) > 0 {
                seen_shown = true;
                end = tokio::time::Instant::now() + Duration::from_millis(300);
            }
            streamed.push_str(&line);
            streamed.push('\n');
        }
        stream.start_kill()?;
        let _ = stream.wait().await;
        ensure!(
            pids_in(&streamed, hidden) == 0 && pids_in(&streamed, shown) > 0,
            "the user's stream: {} hits of the undumpable child, {} of the other",
            pids_in(&streamed, hidden),
            pids_in(&streamed, shown)
        );
        for (uid, sees_hidden) in [(None, true), (u, false)] {
            let last = ok(&daemon, uid, &["--json", "last", &ids[0]]).await?;
            let hits = hits_of(&last)?;
            let of = |pid| hits.iter().filter(|(p, _)| *p == pid).count();
            ensure!(
                (of(hidden) > 0) == sees_hidden && of(shown) > 0,
                "`last` as {uid:?}: {} hits of the undumpable child, {} of the other",
                of(hidden),
                of(shown)
            );
            let agg = ok(&daemon, uid, &["--json", "aggregates", &ids[1]]).await?;
            let v: serde_json::Value = serde_json::from_str(&agg.stdout)?;
            let rows = v["aggregates"]
                .as_array()
                .with_context(|| format!("no aggregates in {v}"))?;
            let of = |pid: i64| {
                rows.iter()
                    .filter(|r| r["tid"].as_i64() == Some(pid))
                    .count()
            };
            ensure!(
                (of(hidden) > 0) == sees_hidden && of(shown) > 0,
                "`aggregates` as {uid:?}: {} rows of the undumpable child {hidden}, {} of the \
                 other {shown}: {v}",
                of(hidden),
                of(shown)
            );
        }
        Ok(())
    }
    .await;
    daemon.finish(result)
}
