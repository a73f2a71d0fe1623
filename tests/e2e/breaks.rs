//! `wpctl break` against a real daemon and `tests/c/objects.c` running
//! several threads: a function breakpoint and a line breakpoint set from the
//! shell, `--wait` returning with the held thread and its place, `wpctl
//! stack --locals` reading a parameter there, `wpctl last` and `wpctl list`
//! showing the breakpoint, `wpctl unwatch` removing it (threads reach the
//! function again and run on) and `wpctl resume` letting the target
//! finish; `--all-threads` holding every thread. Refusals (unknown function
//! with the closest name, a line without code, the perf backend, a LOCATION
//! the client cannot read, a process that exits during `--wait`) exit
//! non-zero with one line on stderr and leave nothing set.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use wpd_proto::v1::{ListWatchpointsRequest, ThreadState};
use wpd_tests::{
    Backend, CTarget, CmdOutput, Daemon, bin_path, line_of, list_threads, require_backend, rpc_ok,
    run_wpctl,
};

const CLI_TIMEOUT: Duration = Duration::from_secs(20);
/// For `wpctl break --wait`: the breakpoint is set, then the target is told
/// to run into it.
const WAIT_TIMEOUT: Duration = Duration::from_secs(60);
const REPLY_TIMEOUT: Duration = Duration::from_secs(20);

async fn wpctl(daemon: &Daemon, args: &[&str]) -> Result<CmdOutput> {
    let ep = daemon.endpoint();
    let mut all = vec!["--endpoint", ep.as_str()];
    all.extend_from_slice(args);
    run_wpctl(&all, CLI_TIMEOUT).await
}

fn ensure_exit(out: &CmdOutput, code: i32, what: &str) -> Result<()> {
    ensure!(
        out.code == Some(code),
        "{what}: expected exit code {code}, got {:?}\nstdout: {}\nstderr: {}",
        out.code,
        out.stdout,
        out.stderr
    );
    Ok(())
}

/// A refusal: exit `code`, nothing on stdout, one `wpctl: ` line on
/// stderr saying `says`.
fn ensure_refused(out: &CmdOutput, code: i32, says: &str, what: &str) -> Result<()> {
    ensure_exit(out, code, what)?;
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    ensure!(
        lines.len() == 1 && lines[0].starts_with("wpctl: ") && lines[0].contains(says),
        "{what}: expected one line saying {says:?} on stderr: {:?}",
        out.stderr
    );
    ensure!(out.stdout.is_empty(), "{what}: stdout {:?}", out.stdout);
    Ok(())
}

/// Runs `wpctl args` (a `break --wait`): once it printed its first line
/// (the breakpoint is set), runs `then` (which makes the target reach it),
/// and returns what it printed in all and how it exited.
async fn break_wait(
    daemon: &Daemon,
    args: &[&str],
    then: impl std::future::Future<Output = Result<()>>,
) -> Result<CmdOutput> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
    let ep = daemon.endpoint();
    let mut child = tokio::process::Command::new(bin_path("wpctl"))
        .args(["--endpoint", ep.as_str()])
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting wpctl")?;
    let mut stdout = BufReader::new(child.stdout.take().context("no stdout")?);
    let mut stderr = child.stderr.take().context("no stderr")?;
    let shown = args.join(" ");
    let mut first = String::new();
    tokio::time::timeout(CLI_TIMEOUT, stdout.read_line(&mut first))
        .await
        .with_context(|| format!("`wpctl {shown}` printed nothing within {CLI_TIMEOUT:?}"))??;
    if !first.is_empty() {
        then.await?;
    }
    let rest = async {
        let mut out = String::new();
        let mut err = String::new();
        stdout.read_to_string(&mut out).await?;
        stderr.read_to_string(&mut err).await?;
        let status = child.wait().await?;
        anyhow::Ok((out, err, status))
    };
    let (out, err, status) = tokio::time::timeout(WAIT_TIMEOUT, rest)
        .await
        .with_context(|| format!("`wpctl {shown}` did not finish within {WAIT_TIMEOUT:?}"))??;
    Ok(CmdOutput {
        code: status.code(),
        stdout: first + &out,
        stderr: err,
    })
}

/// What the daemon lists for `pid`.
async fn listed(daemon: &Daemon, pid: i32) -> Result<usize> {
    let mut client = daemon.client().await?;
    let l = rpc_ok(
        "ListWatchpoints",
        client.list_watchpoints(ListWatchpointsRequest { pid }),
    )
    .await?;
    Ok(l.watchpoints.len())
}

/// The number after `prefix` at the start of `line` (`breakpoint 7:`,
/// `thread 1234 `).
fn number_after(line: &str, prefix: &str) -> Result<i64> {
    line.strip_prefix(prefix)
        .and_then(|s| s.split([' ', ':']).next())
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no number after {prefix:?} in {line:?}"))
}

/// `wpctl break --pid P conn_new --wait` on a target whose two threads each
/// create an object: it prints the place, then the held worker thread;
/// `wpctl stack --locals` shows `conn_new`'s parameter; `wpctl list` and
/// `wpctl last` show the breakpoint and its stop; after `wpctl unwatch` and
/// `wpctl resume` the run finishes, and later calls of `conn_new` are not
/// held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_breakpoint_waits_then_stack_resume_unwatch() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-objects").await?;
    daemon.finish(
        async {
            let pid = t.pid;
            let p = pid.to_string();
            let (_, body) = line_of("new_body");
            let args = ["break", "--pid", &p, "conn_new", "--wait"];
            let out = break_wait(&daemon, &args, async { t.send("run 2 1") }).await?;
            ensure_exit(&out, 0, "wpctl break conn_new --wait")?;
            let lines: Vec<&str> = out.stdout.lines().collect();
            ensure!(
                lines.len() == 3,
                "set, stopped, what next: {:?}",
                out.stdout
            );
            let at = format!("objects.c:{body}");
            ensure!(
                lines[0].starts_with("breakpoint ")
                    && lines[0].contains("conn_new at ")
                    && lines[0].contains(&format!("{at}, 0x"))
                    && lines[0].contains("(ct-objects+0x")
                    && lines[0].contains(&format!("in pid {pid}: holds the thread")),
                "the place, past the prologue: {:?}",
                lines[0]
            );
            let id = number_after(lines[0], "breakpoint ")?;
            let tid = number_after(lines[1], "thread ")? as i32;
            ensure!(
                lines[1].contains(&format!("of pid {pid} stopped at conn_new at "))
                    && lines[1].contains(&format!("{at} (breakpoint {id}, hit 1)")),
                "{:?}",
                lines[1]
            );
            ensure!(
                tid != pid,
                "a worker thread reaches conn_new, not main: {tid}"
            );
            ensure!(
                std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists(),
                "{tid} is not a thread of {pid}"
            );
            ensure!(
                lines[2].contains(&format!("wpctl resume --pid {pid} --tid {tid}")),
                "{:?}",
                lines[2]
            );

            // Where it is held, with its parameter.
            let t_s = tid.to_string();
            let out = wpctl(&daemon, &["stack", "--pid", &p, "--tid", &t_s, "--locals"]).await?;
            ensure_exit(&out, 0, "wpctl stack --locals")?;
            let first = out.stdout.lines().next().unwrap_or_default();
            ensure!(
                first.starts_with("#0") && first.contains("conn_new") && first.contains(&at),
                "{:?}",
                out.stdout
            );
            ensure!(
                out.stdout.contains("(param) long int id = ") && out.stdout.contains("worker"),
                "conn_new's id and its caller: {:?}",
                out.stdout
            );

            // Listed as a breakpoint at its place; its stop kept.
            let out = wpctl(&daemon, &["list", "--pid", &p]).await?;
            ensure_exit(&out, 0, "wpctl list")?;
            let row = out
                .stdout
                .lines()
                .find(|l| l.starts_with(&format!("{id} ")))
                .with_context(|| format!("no row {id}: {:?}", out.stdout))?;
            ensure!(
                row.contains(" break ")
                    && row.contains(" stop ")
                    && row.contains(" ptrace ")
                    && row.ends_with(&format!("conn_new ({at})")),
                "{row:?}"
            );
            let out = wpctl(&daemon, &["last", &id.to_string()]).await?;
            ensure_exit(&out, 0, "wpctl last")?;
            ensure!(
                out.stdout
                    .contains(&format!("breakpoint wp={id} pid={pid} tid={tid} ip=0x"))
                    && out.stdout.contains("conn_new (")
                    && out.stdout.contains("count=1 STOPPED")
                    // The other worker may be held there too by now.
                    && (out
                        .stdout
                        .ends_with(&format!("breakpoint {id}: 1 stop of 1 shown\n"))
                        || out
                            .stdout
                            .ends_with(&format!("breakpoint {id}: 2 stops of 2 shown\n"))),
                "{:?}",
                out.stdout
            );

            // Removed, then resumed: the run ends, and conn_new holds no
            // thread any more.
            let out = wpctl(&daemon, &["unwatch", &id.to_string()]).await?;
            ensure_exit(&out, 0, "wpctl unwatch")?;
            ensure!(
                out.stdout
                    .starts_with(&format!("removed breakpoint {id} (conn_new at ")),
                "{:?}",
                out.stdout
            );
            ensure!(listed(&daemon, pid).await? == 0, "listed after unwatch");
            let out = wpctl(&daemon, &["resume", "--pid", &p]).await?;
            ensure_exit(&out, 0, "wpctl resume")?;
            ensure!(
                out.stdout.starts_with("resumed ") && out.stdout.contains(&t_s),
                "{:?}",
                out.stdout
            );
            let reply = t.reply(REPLY_TIMEOUT).await?;
            ensure!(reply.as_deref() == Some("RAN n=2"), "{reply:?}");
            let reply = t.cmd("run 2 3").await?;
            ensure!(reply == "RAN n=6", "{reply}");
            Ok(())
        }
        .await,
    )
}

/// `wpctl --json break --pid P objects.c:LINE --all-threads --wait`: the
/// line resolves to `conn_set_state`, every thread is held when one
/// reaches it, `wpctl stack --locals` reads `state` (1, the first call's),
/// and after unwatch and resume the run finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_breakpoint_holds_every_thread() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-objects").await?;
    daemon.finish(
        async {
            let pid = t.pid;
            let p = pid.to_string();
            let (_, line) = line_of("set_state");
            let at = format!("objects.c:{line}");
            let args = ["break", "--pid", &p, &at, "--all-threads", "--wait"];
            let out = break_wait(&daemon, &args, async { t.send("run 3 20") }).await?;
            ensure_exit(&out, 0, "wpctl break FILE:LINE --all-threads --wait")?;
            let lines: Vec<&str> = out.stdout.lines().collect();
            ensure!(
                lines.len() == 3,
                "set, stopped, what next: {:?}",
                out.stdout
            );
            ensure!(
                lines[0].contains("conn_set_state at ")
                    && lines[0].contains(&format!("{at}, 0x"))
                    && lines[0].ends_with("holds every thread when one reaches it"),
                "{:?}",
                lines[0]
            );
            let id = number_after(lines[0], "breakpoint ")?;
            let tid = number_after(lines[1], "thread ")? as i32;
            ensure!(
                lines[1].contains("stopped at conn_set_state at ")
                    && lines[1].contains(&format!("{at} (breakpoint {id}, hit 1)"))
                    && lines[2].starts_with(&format!("every thread of pid {pid} is held"))
                    && lines[2].ends_with(&format!("wpctl resume --pid {pid} lets it go on")),
                "{:?}",
                out.stdout
            );

            // Listed in JSON with its place.
            let out = wpctl(&daemon, &["--json", "list", "--pid", &p]).await?;
            ensure_exit(&out, 0, "wpctl --json list")?;
            let v: Value = serde_json::from_str(&out.stdout)
                .with_context(|| format!("not JSON: {:?}", out.stdout))?;
            let w = &v["watchpoints"][0];
            let place = &w["breakpoint"];
            ensure!(
                w["id"] == id
                    && place["function"] == "conn_set_state"
                    && place["line"] == line
                    && place["file"]
                        .as_str()
                        .is_some_and(|f| f.ends_with("objects.c"))
                    && w["action"] == "stop-all",
                "{v}"
            );

            // Every thread stops (the others as they are interrupted).
            let mut client = daemon.client().await?;
            let deadline = tokio::time::Instant::now() + REPLY_TIMEOUT;
            loop {
                let threads = list_threads(&mut client, pid, false).await?;
                let running: Vec<i32> = threads
                    .threads
                    .iter()
                    .filter(|x| {
                        x.state != ThreadState::StoppedAtHit as i32
                            && x.state != ThreadState::StoppedByPeer as i32
                    })
                    .map(|x| x.tid)
                    .collect();
                if running.is_empty() && threads.threads.len() > 1 {
                    break;
                }
                ensure!(
                    tokio::time::Instant::now() < deadline,
                    "threads still running: {running:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }

            let t_s = tid.to_string();
            let out = wpctl(&daemon, &["stack", "--pid", &p, "--tid", &t_s, "--locals"]).await?;
            ensure_exit(&out, 0, "wpctl stack --locals")?;
            ensure!(
                out.stdout
                    .lines()
                    .next()
                    .is_some_and(|l| l.contains("conn_set_state"))
                    && out.stdout.contains("(param) long int state = 1 (0x1)"),
                "held at the first call, conn_set_state(c, 1): {:?}",
                out.stdout
            );

            let out = wpctl(&daemon, &["unwatch", &id.to_string()]).await?;
            ensure_exit(&out, 0, "wpctl unwatch")?;
            let out = wpctl(&daemon, &["resume", "--pid", &p]).await?;
            ensure_exit(&out, 0, "wpctl resume")?;
            let reply = t.reply(REPLY_TIMEOUT).await?;
            ensure!(reply.as_deref() == Some("RAN n=60"), "{reply:?}");
            Ok(())
        }
        .await,
    )
}

/// Refusals: each exits non-zero with one line on stderr, and nothing is
/// left set. Then `--wait` on a process that exits first ends with exit 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_refusals_exit_non_zero_in_one_line() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-objects").await?;
    let t2 = CTarget::start("ct-objects").await?;
    daemon.finish(
        async {
            let pid = t.pid;
            let p = pid.to_string();
            let p2 = t2.pid.to_string();
            let cases: Vec<(Vec<&str>, i32, &str)> = vec![
                (vec!["break", "--pid", &p, "conn_nwe"], 5, "conn_new"),
                (
                    vec!["break", "--pid", &p, "objects.c:2"],
                    5,
                    "no code at objects.c:2",
                ),
                (
                    vec!["break", "--pid", &p, "nowhere.c:3"],
                    5,
                    "no line table names that file",
                ),
                (
                    vec!["break", "--pid", &p, "objects.c:conn_new"],
                    2,
                    "not a source file",
                ),
                (
                    vec!["break", "--pid", &p, "objects.c:0"],
                    2,
                    "counted from 1",
                ),
                (vec!["break", "--pid", &p, "52"], 2, "FILE:52"),
                (
                    vec!["break", "--pid", &p2, "--backend", "perf", "conn_new"],
                    4,
                    "code breakpoints",
                ),
            ];
            for (args, code, says) in &cases {
                let out = wpctl(&daemon, args).await?;
                ensure_refused(&out, *code, says, &args.join(" "))?;
            }
            ensure!(listed(&daemon, pid).await? == 0, "a refusal left something");
            ensure!(listed(&daemon, t2.pid).await? == 0, "perf left something");

            // The process exits before any thread reaches the breakpoint.
            let args = ["break", "--pid", &p, "conn_corrupt", "--wait"];
            let out = break_wait(&daemon, &args, async { t.send("quit") }).await?;
            ensure_exit(&out, 5, "wpctl break --wait on a process that exits")?;
            let lines: Vec<&str> = out
                .stderr
                .lines()
                .filter(|l| !l.trim().is_empty())
                .collect();
            ensure!(
                lines.len() == 1
                    && lines[0].contains(&format!("process {pid} exited before a thread reached")),
                "{:?}",
                out.stderr
            );
            Ok(())
        }
        .await,
    )
}
