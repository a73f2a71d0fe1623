//! A developer running `wpd` as an ordinary user, for their own processes: no CAP_PERFMON,
//! perf_event_paranoid as the machine has it, `wpctl` as the same user. The perf backend
//! cannot open events on every task of a CPU (`pid = -1`): its per-CPU rings are owned by
//! events on the daemon's own thread instead, and it stays the default (no BPF: the per-CPU
//! path), saying so in `wpctl caps`; a plain `wpctl watch` (no backend named) works on the
//! user's own process, another user's process is refused with one clear line, and a daemon
//! killed at any moment leaves the program running (its perf events go with their fds).

use std::time::Duration;

use anyhow::{Result, ensure};
use wpd_tests::{Backend, CmdOutput, Daemon, TargetProc, require_backend, run_wpctl_as};

/// `kernel.perf_event_paranoid` here.
fn paranoid() -> i32 {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(2)
}

/// `wpctl ARGS` as [`USER`] with only `env` (a user's daemon's environment: it finds that
/// daemon by itself).
async fn user_wpctl(env: &[(String, String)], args: &[&str]) -> Result<CmdOutput> {
    let mut cmd = tokio::process::Command::new(wpd_tests::bin_path("wpctl"));
    cmd.env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args(args)
        .uid(USER)
        .gid(USER)
        .kill_on_drop(true);
    let out = tokio::time::timeout(WPCTL_TIMEOUT, cmd.output()).await??;
    Ok(CmdOutput {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

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
        let perf = backend("perf");
        // The perf backend, whose events die with the daemon, is the default: on the
        // per-CPU path (bpf() needs CAP_BPF), its rings the daemon's own where
        // perf_event_paranoid > 0 forbids events on every task.
        let events = perf["events"].as_str().unwrap_or_default();
        ensure!(
            perf["usable"] == true
                && perf["default"] == true
                && events.starts_with("per-cpu")
                && (paranoid() <= 0 || events.contains("the daemon's own thread")),
            "expected perf usable, the default, per-CPU and saying why: {v}"
        );
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

/// A user starts `wpd` with no flags: it listens on the user's own socket
/// (`$XDG_RUNTIME_DIR/wpd/wpd.sock`, its directory made private), keeps its state under
/// `$XDG_STATE_HOME/wpd`, and a `wpctl` of that user with no endpoint finds it, says so in
/// `wpctl health`, and watches the user's process through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_daemon_with_no_flags_is_where_wpctl_looks() -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start_with_no_flags_as(USER).await?;
    let mut mine =
        TargetProc::start_as(USER, &["--threads", "2", "--interval-us", "20000"]).await?;
    let env = daemon.user_env();
    let result = async {
        let wpctl = async |args: &[&str]| user_wpctl(&env, args).await;
        let socket = daemon.socket_path();
        let dir = std::fs::metadata(socket.parent().unwrap())?;
        ensure!(
            dir.uid() == USER && dir.mode() & 0o777 == 0o700,
            "the socket's directory: uid {} mode {:o}",
            dir.uid(),
            dir.mode() & 0o777
        );
        ensure!(
            daemon.state_dir().join("journal").is_dir(),
            "no journal in {}",
            daemon.state_dir().display()
        );
        let h = wpctl(&["health"]).await?;
        ensure!(
            h.code == Some(0) && h.stdout.trim() == format!("serving at unix:{}", socket.display()),
            "wpctl health with no endpoint: {h:?}"
        );
        let pid = mine.pid.to_string();
        let addr = format!("{:#x}", mine.vars[0]);
        let w = wpctl(&["watch", "--pid", &pid, "--addr", &addr]).await?;
        ensure!(
            w.code == Some(0) && w.stdout.starts_with("watchpoint "),
            "wpctl watch with no endpoint: {w:?}"
        );
        let ev = wpctl(&["events", "--pid", &pid, "--count", "2"]).await?;
        ensure!(
            ev.code == Some(0) && ev.stdout.lines().filter(|l| l.contains(" hit ")).count() == 2,
            "wpctl events with no endpoint: {ev:?}"
        );
        mine.ensure_alive()?;
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// Without `XDG_RUNTIME_DIR` a user's daemon listens in `/tmp/wpd-UID`, a directory it
/// makes private; one made there first by someone else is refused, in one line naming it,
/// and nothing is bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_directory_made_by_someone_else_is_refused() -> Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // A uid of this test only: no other test uses its /tmp/wpd-UID.
    const UID: u32 = 64_917;
    let dir = std::path::PathBuf::from(format!("/tmp/wpd-{UID}"));
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let home = wpd_tests::unique_temp_dir("wpd-e2e-home")?;
    let _cleanup = (Cleanup(dir.clone()), Cleanup(home.clone()));
    let _ = std::fs::remove_dir_all(&dir);
    {
        let c = std::ffi::CString::new(home.as_os_str().as_encoded_bytes())?;
        // SAFETY: chown on a directory this test made.
        unsafe { libc::chown(c.as_ptr(), UID, UID) };
    }
    let run = || {
        let home = home.clone();
        async move {
            let mut cmd = tokio::process::Command::new(wpd_tests::bin_path("wpd"));
            cmd.env_clear()
                .env("HOME", &home)
                .env("NO_COLOR", "1")
                .uid(UID)
                .gid(UID)
                .kill_on_drop(true);
            let mut child = cmd
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()?;
            // Refused: it exits. Accepted: its socket appears, and it serves until killed.
            let socket = std::path::PathBuf::from(format!("/tmp/wpd-{UID}/wpd.sock"));
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            let out = loop {
                if let Some(status) = child.try_wait()? {
                    break Some(status);
                }
                if socket.exists() || tokio::time::Instant::now() > deadline {
                    child.start_kill()?;
                    child.wait().await?;
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use tokio::io::AsyncReadExt;
                e.read_to_string(&mut err).await?;
            }
            anyhow::Ok((out, err))
        }
    };
    // Made first by root, open to all.
    std::fs::create_dir(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
    let (status, err) = run().await?;
    ensure!(
        status.is_some_and(|s| !s.success())
            && err.contains(&format!("/tmp/wpd-{UID}"))
            && err.contains("uid 0"),
        "a daemon beside someone else's socket directory: {status:?} {err}"
    );
    ensure!(
        !dir.join("wpd.sock").exists(),
        "a socket was bound in the refused directory"
    );
    // Gone: the daemon makes it, the user's and private, and serves there.
    std::fs::remove_dir_all(&dir)?;
    let (status, err) = run().await?;
    ensure!(
        status.is_none() && dir.join("wpd.sock").exists(),
        "the daemon did not listen in /tmp/wpd-{UID}: {status:?} {err}"
    );
    let meta = std::fs::metadata(&dir)?;
    ensure!(
        meta.uid() == UID && meta.mode() & 0o777 == 0o700,
        "/tmp/wpd-{UID}: uid {} mode {:o}",
        meta.uid(),
        meta.mode() & 0o777
    );
    Ok(())
}

/// The path a user gets with no flags and no privilege: a 16-thread program of the user's,
/// storing the watched variable every 200 µs, each of its threads hit, threads it creates
/// later too (they inherit the breakpoint in `clone()`); then the daemon SIGKILLed at a random
/// moment, 20 rounds: the program runs on every time (no thread stopped, none killed: perf
/// events go with their fds and nothing of them is left in the debug registers), and the
/// daemon started again sets the watch again from its saved state, hits coming again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_daemon_killed_at_any_moment_never_takes_the_program_with_it() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let mut daemon = Daemon::start_with_no_flags_as(USER).await?;
    let mut mine = TargetProc::start_as(USER, &["--threads", "16", "--interval-us", "200"]).await?;
    let env = daemon.user_env();
    let result = async {
        let wpctl = async |args: &[&str]| user_wpctl(&env, args).await;
        let pid = mine.pid.to_string();
        let addr = format!("{:#x}", mine.vars[0]);
        let w = wpctl(&["watch", "--pid", &pid, "--addr", &addr]).await?;
        ensure!(
            w.code == Some(0) && w.stdout.starts_with("watchpoint "),
            "wpctl watch: {w:?}"
        );
        // Threads created after the watch was set.
        for _ in 0..4 {
            let r = mine.cmd("spawn-worker").await?;
            ensure!(r.starts_with("SPAWNED"), "spawn-worker: {r}");
        }
        // Every thread that stores (all but the main one) is hit.
        let workers: std::collections::BTreeSet<String> =
            std::fs::read_dir(format!("/proc/{pid}/task"))?
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|t| *t != pid)
                .collect();
        ensure!(workers.len() == 20, "workers: {workers:?}");
        // Batches of 4,000 hits (one is enough on an idle machine; on a loaded one a thread
        // may sit out a batch waiting for a CPU), 10 at most.
        let mut hit = std::collections::BTreeSet::new();
        for _ in 0..10 {
            let ev = wpctl(&["events", "--pid", &pid, "--count", "4000"]).await?;
            ensure!(ev.code == Some(0), "wpctl events: {ev:?}");
            hit.extend(
                ev.stdout
                    .lines()
                    .filter(|l| l.contains(" hit "))
                    .filter_map(|l| {
                        let t = l.split("tid=").nth(1)?;
                        Some(t.split(|c: char| !c.is_ascii_digit()).next()?.to_string())
                    }),
            );
            if workers.is_subset(&hit) {
                break;
            }
        }
        let missed: Vec<&String> = workers.difference(&hit).collect();
        ensure!(
            missed.is_empty(),
            "threads without a hit in 40,000: {missed:?}"
        );
        for round in 0..20 {
            // A moment from 0 to 190 ms after the daemon answers.
            let ms = (u64::from(std::process::id()) * 31 + round * 97 + nanos()) % 200;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            daemon.kill_and_restart_no_flags_as(USER).await?;
            mine.ensure_alive()?;
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
            let state = state
                .rsplit_once(')')
                .map(|(_, r)| r.trim_start().chars().next());
            ensure!(
                matches!(state, Some(Some('S' | 'R'))),
                "round {round}: the program is {state:?} after the daemon's death"
            );
            let ev = wpctl(&["events", "--pid", &pid, "--count", "20"]).await?;
            ensure!(
                ev.code == Some(0)
                    && ev.stdout.lines().filter(|l| l.contains(" hit ")).count() == 20,
                "round {round} (killed after {ms} ms): no hits from the restored watch: {ev:?}"
            );
        }
        let r = mine.cmd("ping").await?;
        ensure!(r.starts_with("PONG"), "the program after 20 rounds: {r}");
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// A few varying bits (a round's moment).
fn nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()))
}

/// A user whose locked-memory budget is spent (another daemon of theirs took the per-user
/// allowance, and `ulimit -l 0` leaves nothing more): the user's daemon cannot map a ring,
/// so perf cannot run, and the ptrace backend would poke debug registers (a killed daemon
/// would then kill the program): a `wpctl watch` naming no backend is refused in one line
/// naming the budget, exit 8 (precondition), and nothing is armed; the program runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_whose_locked_memory_is_spent_is_refused_whole() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    if paranoid() <= 0 {
        // Rings of events on every task are allowed: the budget is not the user's.
        wpd_tests::machine_skip("perf_event_paranoid <= 0: a user's rings are not budgeted so");
        return Ok(());
    }
    // Takes what the user's allowance holds (its rings shrink to fit, or none fits).
    let first = Daemon::start_with_no_flags_memlock_as(USER, Some(0)).await?;
    let daemon = Daemon::start_with_no_flags_memlock_as(USER, Some(0)).await?;
    let mut mine = TargetProc::start_as(USER, &["--threads", "4", "--interval-us", "1000"]).await?;
    let env = daemon.user_env();
    let result = async {
        let wpctl = async |args: &[&str]| user_wpctl(&env, args).await;
        let pid = mine.pid.to_string();
        let addr = format!("{:#x}", mine.vars[0]);
        let w = wpctl(&["watch", "--pid", &pid, "--addr", &addr]).await?;
        ensure!(
            w.code == Some(8)
                && w.stderr.lines().count() == 1
                && w.stderr.contains("locked-memory budget"),
            "a watch with the budget spent: {w:?}"
        );
        let l = wpctl(&["--json", "list"]).await?;
        ensure!(l.code == Some(0), "wpctl list: {l:?}");
        let v: serde_json::Value = serde_json::from_str(&l.stdout)?;
        ensure!(
            v["watchpoints"].as_array().is_some_and(|a| a.is_empty())
                && v["processes"].as_array().is_some_and(|a| a.is_empty()),
            "something was armed or attached: {v}"
        );
        mine.ensure_alive()?;
        Ok(())
    }
    .await;
    drop(first);
    daemon.finish(result)
}

/// Yama's `ptrace_scope` 1 (Ubuntu's default; the kernels here have no Yama, so the daemon
/// is told to assume it and applies it to its callers and to its own attaches and memory
/// reads): the user's daemon did not start the user's program, so it may neither attach to
/// it nor read its memory, yet perf events on it open (they ask read access, which Yama
/// leaves alone). Every thread is hit, those created after the watch too; the hits carry no
/// value and say why; a watch whose hits need the value (a condition) is refused in one
/// line; the ptrace backend is refused, naming Yama; `wpctl caps` says what is covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_yama_scope_1_a_users_daemon_watches_programs_it_did_not_start() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let args: &[&str] = match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        Err(_) => &["--yama-ptrace-scope", "1"],
        Ok(s) if s.trim() == "1" => &[],
        Ok(s) => {
            wpd_tests::machine_skip(&format!(
                "kernel.yama.ptrace_scope={}: scope 1 cannot be had here",
                s.trim()
            ));
            return Ok(());
        }
    };
    let daemon = Daemon::start_users_daemon(USER, None, args).await?;
    let mut mine = TargetProc::start_as(USER, &["--threads", "4", "--interval-us", "1000"]).await?;
    let mut other = TargetProc::start_as(USER, &["--threads", "1"]).await?;
    let env = daemon.user_env();
    let result = async {
        let wpctl = async |args: &[&str]| user_wpctl(&env, args).await;
        let caps = wpctl(&["--json", "caps"]).await?;
        let v: serde_json::Value = serde_json::from_str(&caps.stdout)?;
        let backend = |name: &str| {
            v["backends"]
                .as_array()
                .and_then(|b| b.iter().find(|b| b["backend"] == name))
                .cloned()
                .unwrap_or_default()
        };
        let (perf, ptrace) = (backend("perf"), backend("ptrace"));
        ensure!(
            perf["usable"] == true
                && perf["default"] == true
                && perf["events"]
                    .as_str()
                    .is_some_and(|e| e.contains("ptrace_scope=1") && e.contains("no value"))
                && ptrace["usable"] == false
                && ptrace["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("ptrace_scope=1")),
            "caps under Yama scope 1: {v}"
        );
        let pid = mine.pid.to_string();
        let addr = format!("{:#x}", mine.vars[0]);
        let w = wpctl(&["watch", "--pid", &pid, "--addr", &addr]).await?;
        ensure!(
            w.code == Some(0) && w.stdout.starts_with("watchpoint 1:"),
            "a watch on the user's program the daemon did not start: {w:?}"
        );
        for _ in 0..2 {
            let r = mine.cmd("spawn-worker").await?;
            ensure!(r.starts_with("SPAWNED"), "spawn-worker: {r}");
        }
        let workers: std::collections::BTreeSet<u64> =
            std::fs::read_dir(format!("/proc/{pid}/task"))?
                .filter_map(|e| e.ok()?.file_name().into_string().ok()?.parse().ok())
                .filter(|&t| t != mine.pid as u64)
                .collect();
        ensure!(workers.len() == 6, "workers: {workers:?}");
        let ev = wpctl(&["--json", "events", "--pid", &pid, "--count", "3000"]).await?;
        ensure!(ev.code == Some(0), "wpctl events: {ev:?}");
        let mut hit = std::collections::BTreeSet::new();
        for line in ev.stdout.lines() {
            let e: serde_json::Value = serde_json::from_str(line)?;
            if e["type"] != "hit" {
                continue;
            }
            ensure!(
                e["value"].is_null()
                    && e["value_error"]
                        .as_str()
                        .is_some_and(|w| w.contains("ptrace_scope=1")),
                "a hit with a value, or without saying why it has none: {e}"
            );
            hit.extend(e["tid"].as_u64());
        }
        let missed: Vec<&u64> = workers.difference(&hit).collect();
        ensure!(
            missed.is_empty(),
            "threads without a hit in 3,000: {missed:?}"
        );
        let c = wpctl(&[
            "watch",
            "--pid",
            &pid,
            "--addr",
            &addr,
            "--condition",
            "== 5",
        ])
        .await?;
        ensure!(
            c.code != Some(0)
                && c.stderr.lines().count() == 1
                && c.stderr.contains("ptrace_scope=1")
                && c.stderr.contains("condition"),
            "a watch whose hits need the value: {c:?}"
        );
        let other_pid = other.pid.to_string();
        let other_addr = format!("{:#x}", other.vars[0]);
        let p = wpctl(&[
            "watch",
            "--pid",
            &other_pid,
            "--addr",
            &other_addr,
            "--backend",
            "ptrace",
        ])
        .await?;
        ensure!(
            p.code != Some(0)
                && p.stderr.lines().count() == 1
                && p.stderr.contains("ptrace_scope=1"),
            "a watch through ptrace: {p:?}"
        );
        let l = wpctl(&["--json", "list"]).await?;
        let v: serde_json::Value = serde_json::from_str(&l.stdout)?;
        ensure!(
            v["watchpoints"].as_array().map(Vec::len) == Some(1)
                && v["processes"].as_array().map(Vec::len) == Some(1),
            "only the first watch and its process: {v}"
        );
        mine.ensure_alive()?;
        other.ensure_alive()?;
        Ok(())
    }
    .await;
    daemon.finish(result)
}
