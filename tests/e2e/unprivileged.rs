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
        let wpctl = async |args: &[&str]| -> Result<CmdOutput> {
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
        };
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
