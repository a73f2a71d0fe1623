//! The daemon under test: `Daemon`, started on a private socket and state file.

use crate::*;
use std::fs::{self, File};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use tokio::time::Instant;
use wpd_proto::v1::GetCapabilitiesRequest;

/// A running `wpd` on a private Unix socket. Dropping it sends SIGTERM, waits up to 5 s, then
/// SIGKILLs, and removes its temp dir; if the thread is panicking it first prints the log.
///
/// Every daemon gets its own ptrace state file (`WPD_STATE_FILE`, by default inside its temp
/// dir): tests never share `/run/wpd`, and a daemon never "recovers" threads of another test.
pub struct Daemon {
    child: Child,
    status: Option<ExitStatus>,
    dir: PathBuf,
    socket: PathBuf,
    log_path: PathBuf,
    state_file: PathBuf,
    state_dir: PathBuf,
    /// The daemon itself when `child` runs it under a command ([`Daemon::start_in_new_pidns`]).
    inner: Option<i32>,
}

impl Daemon {
    /// Starts `wpd --listen unix:<tmp>/wpd.sock` with `WPD_STATE_FILE=<tmp>/ptrace-armed` and
    /// waits until it answers `GetCapabilities`. Panics if the `wpd` binary is missing.
    pub async fn start() -> Result<Daemon> {
        Self::spawn(&[], None, None, None, &[], None).await
    }

    /// Like [`Daemon::start`], with `RLIMIT_NOFILE` (soft and hard) set to `limit` in the
    /// daemon, so that it cannot raise it.
    pub async fn start_with_fd_limit(limit: u64) -> Result<Daemon> {
        Self::spawn(&[], None, None, Some(limit), &[], None).await
    }

    /// Like [`Daemon::start`] with extra command-line arguments.
    pub async fn start_with_args(extra: &[&str]) -> Result<Daemon> {
        Self::spawn(extra, None, None, None, &[], None).await
    }

    /// A daemon every user may connect to (`--socket-mode 666`, its directory searchable), so
    /// that authorization and the per-caller limits alone decide; `extra` arguments added.
    pub async fn start_open(extra: &[&str]) -> Result<Daemon> {
        use std::os::unix::fs::PermissionsExt;
        let args: Vec<&str> = ["--socket-mode", "666"]
            .iter()
            .chain(extra)
            .copied()
            .collect();
        let d = Self::spawn(&args, None, None, None, &[], None).await?;
        fs::set_permissions(&d.dir, fs::Permissions::from_mode(0o755))?;
        Ok(d)
    }

    /// [`Daemon::start_open`] with a fixed `RLIMIT_NOFILE` (see
    /// [`Daemon::start_with_fd_limit`]).
    pub async fn start_open_with_fd_limit(extra: &[&str], limit: u64) -> Result<Daemon> {
        use std::os::unix::fs::PermissionsExt;
        let args: Vec<&str> = ["--socket-mode", "666"]
            .iter()
            .chain(extra)
            .copied()
            .collect();
        let d = Self::spawn(&args, None, None, Some(limit), &[], None).await?;
        fs::set_permissions(&d.dir, fs::Permissions::from_mode(0o755))?;
        Ok(d)
    }

    /// Extra arguments and a fixed `RLIMIT_NOFILE` (see [`Daemon::start_with_fd_limit`]).
    pub async fn start_with_args_and_fd_limit(extra: &[&str], limit: u64) -> Result<Daemon> {
        Self::spawn(extra, None, None, Some(limit), &[], None).await
    }

    /// The daemon's resident memory now (`VmRSS`), in KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        let pid = self.pid();
        let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| anyhow!("no VmRSS for wpd {pid}"))
    }

    /// CPU time the daemon has used so far (user + system, all threads).
    pub fn cpu_time(&self) -> Result<Duration> {
        let pid = self.pid();
        let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let rest = stat
            .rsplit_once(')')
            .map(|(_, r)| r)
            .ok_or_else(|| anyhow!("cannot parse /proc/{pid}/stat"))?;
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|w| w.parse().unwrap_or(0))
            .collect();
        // Fields 14 and 15 (utime, stime), counted from the state (field 3).
        let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Ok(Duration::from_millis(ticks * 1000 / hz))
    }

    /// The daemon's open file descriptors.
    pub fn fd_count(&self) -> Result<usize> {
        Ok(fs::read_dir(format!("/proc/{}/fd", self.pid()))?.count())
    }

    /// Like [`Daemon::start`], but with the ptrace state file at `state_file` (e.g. the
    /// [`Daemon::state_file`] of a daemon that was [killed](Daemon::kill), to test recovery).
    pub async fn start_with_state_file(state_file: &Path) -> Result<Daemon> {
        Self::spawn(&[], Some(state_file.to_path_buf()), None, None, &[], None).await
    }

    /// Like [`Daemon::start_with_args`], run as the ordinary user `uid` (gid the same, no
    /// supplementary groups, no capabilities): what a developer gets running `wpd` for their
    /// own processes.
    pub async fn start_as(uid: u32, extra: &[&str]) -> Result<Daemon> {
        Self::spawn(extra, None, None, None, &[], Some(uid)).await
    }

    /// `wpd` with no flags at all, run as the ordinary user `uid` with an environment of its
    /// own (nothing else inherited): `HOME`, and `XDG_RUNTIME_DIR` and `XDG_STATE_HOME` in
    /// a directory of the test's, the user's and private. Ready once it answers at the
    /// user's default socket, `$XDG_RUNTIME_DIR/wpd/wpd.sock`; [`Daemon::user_env`] is the
    /// environment a `wpctl` of that user needs to find it by itself.
    pub async fn start_with_no_flags_as(uid: u32) -> Result<Daemon> {
        Self::start_with_no_flags_memlock_as(uid, None).await
    }

    /// [`Daemon::start_with_no_flags_as`] with `RLIMIT_MEMLOCK` lowered to `memlock` bytes
    /// (`ulimit -l`), when given.
    pub async fn start_with_no_flags_memlock_as(uid: u32, memlock: Option<u64>) -> Result<Daemon> {
        Self::start_users_daemon(uid, memlock, &[]).await
    }

    /// A user's daemon as [`Daemon::start_with_no_flags_memlock_as`] starts it, with the
    /// flags `args` (none of them where it listens or keeps its state: it finds those as a
    /// user's daemon does).
    pub async fn start_users_daemon(
        uid: u32,
        memlock: Option<u64>,
        args: &[&str],
    ) -> Result<Daemon> {
        use std::os::unix::fs::PermissionsExt;
        let dir = unique_temp_dir("wpd-e2e")?;
        for sub in ["", "run", "home", "state-home"] {
            let d = dir.join(sub);
            fs::create_dir_all(&d)?;
            fs::set_permissions(&d, fs::Permissions::from_mode(0o700))?;
            let c = std::ffi::CString::new(d.as_os_str().as_encoded_bytes())?;
            // SAFETY: chown on a path we just created.
            unsafe { libc::chown(c.as_ptr(), uid, uid) };
        }
        let socket = dir.join("run/wpd/wpd.sock");
        let log_path = dir.join("wpd.log");
        let mut state_file = socket.clone().into_os_string();
        state_file.push(".ptrace-armed");
        let child = match spawn_no_flags(&dir, &log_path, uid, memlock, args) {
            Ok(c) => c,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let mut daemon = Daemon {
            child,
            status: None,
            state_dir: dir.join("state-home/wpd"),
            dir,
            socket,
            log_path,
            state_file: state_file.into(),
            inner: None,
        };
        if let Err(e) = daemon.wait_ready().await {
            return Err(e.context(format!(
                "wpd (no flags) did not answer at {}; its log:\n{}",
                daemon.socket.display(),
                daemon.log_tail(16 * 1024)
            )));
        }
        Ok(daemon)
    }

    /// A daemon of [`Daemon::start_with_no_flags_as`] killed (SIGKILL) and started again
    /// with no flags, as the same user, in the same place (its socket, state and log, which
    /// the new run appends to).
    pub async fn kill_and_restart_no_flags_as(&mut self, uid: u32) -> Result<()> {
        self.kill().await?;
        self.child = spawn_no_flags(&self.dir, &self.log_path, uid, None, &[])?;
        self.status = None;
        self.wait_ready().await.with_context(|| {
            format!(
                "wpd (no flags) restarted did not answer; its log:\n{}",
                self.log_tail(16 * 1024)
            )
        })
    }

    /// The environment of the user of [`Daemon::start_with_no_flags_as`] (its `HOME`,
    /// `XDG_RUNTIME_DIR`, `XDG_STATE_HOME`, `PATH`).
    pub fn user_env(&self) -> Vec<(String, String)> {
        user_env_in(&self.dir)
    }

    /// Like [`Daemon::start_with_args`], with its state directory (journal,
    /// saved watchpoints) at `state_dir`: on a filesystem the test made, or
    /// one a previous daemon left.
    pub async fn start_with_state_dir(state_dir: &Path, extra: &[&str]) -> Result<Daemon> {
        Self::spawn(extra, None, Some(state_dir.to_path_buf()), None, &[], None).await
    }

    /// Like [`Daemon::start_with_args`], with extra environment variables
    /// (e.g. the daemon's fault-injection hooks).
    pub async fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Result<Daemon> {
        Self::spawn(extra, None, None, None, env, None).await
    }

    async fn spawn(
        extra: &[&str],
        state_file: Option<PathBuf>,
        state_dir: Option<PathBuf>,
        fd_limit: Option<u64>,
        env: &[(&str, &str)],
        as_uid: Option<u32>,
    ) -> Result<Daemon> {
        Self::spawn_under(&[], extra, state_file, state_dir, fd_limit, env, as_uid).await
    }

    /// Like [`Daemon::start_with_args`], the daemon the first process of a new pid namespace
    /// (and mount namespace, with its own `/proc`): `unshare --pid --fork --mount-proc
    /// --kill-child=SIGTERM wpd ...`. Its socket is a path, reachable from outside;
    /// [`Daemon::inner_pid`] is its pid as the test's namespace numbers it.
    pub async fn start_in_new_pidns(extra: &[&str]) -> Result<Daemon> {
        let prefix = [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child=SIGTERM",
        ];
        let mut d = Self::spawn_under(&prefix, extra, None, None, None, &[], None).await?;
        let unshare = d.child.id();
        let children = format!("/proc/{unshare}/task/{unshare}/children");
        let inner = fs::read_to_string(&children)
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| anyhow!("no child in {children}"))?;
        d.inner = Some(inner);
        Ok(d)
    }

    #[allow(clippy::too_many_arguments)]
    async fn spawn_under(
        prefix: &[&str],
        extra: &[&str],
        state_file: Option<PathBuf>,
        state_dir: Option<PathBuf>,
        fd_limit: Option<u64>,
        env: &[(&str, &str)],
        as_uid: Option<u32>,
    ) -> Result<Daemon> {
        let bin = bin_path("wpd");
        let dir = unique_temp_dir("wpd-e2e")?;
        let socket = dir.join("wpd.sock");
        let log_path = dir.join("wpd.log");
        let state_file = state_file.unwrap_or_else(|| dir.join("ptrace-armed"));
        let state_dir = state_dir.unwrap_or_else(|| dir.join("state"));
        let spawned = (|| -> Result<Child> {
            let log = File::create(&log_path)
                .with_context(|| format!("creating {}", log_path.display()))?;
            let mut cmd = match prefix.split_first() {
                Some((first, rest)) => {
                    let mut c = Command::new(first);
                    c.args(rest).arg(&bin);
                    c
                }
                None => Command::new(&bin),
            };
            cmd.arg("--listen")
                .arg(format!("unix:{}", socket.display()))
                .args(extra)
                .env("NO_COLOR", "1")
                .env("WPD_STATE_FILE", &state_file)
                .env("WPD_STATE_DIR", &state_dir)
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log);
            guard_child(&mut cmd);
            if let Some(uid) = as_uid {
                // Its directory (socket, log, state file) must be its own.
                let c_dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
                // SAFETY: chown on a path we just created.
                unsafe { libc::chown(c_dir.as_ptr(), uid, uid) };
                use std::os::unix::process::CommandExt;
                // std drops the supplementary groups when root sets a uid.
                cmd.uid(uid).gid(uid);
            }
            if let Some(n) = fd_limit {
                let lim = libc::rlimit {
                    rlim_cur: n as libc::rlim_t,
                    rlim_max: n as libc::rlim_t,
                };
                // SAFETY: setrlimit is async-signal-safe; it runs between fork and exec.
                unsafe {
                    cmd.pre_exec(move || {
                        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
            cmd.spawn()
                .with_context(|| format!("cannot start {}", bin.display()))
        })();
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let mut daemon = Daemon {
            child,
            status: None,
            dir,
            socket,
            log_path,
            state_file,
            state_dir,
            inner: None,
        };
        if let Err(e) = daemon.wait_ready().await {
            return Err(e.context(format!(
                "wpd did not become ready; its log:\n{}",
                daemon.log_tail(16 * 1024)
            )));
        }
        Ok(daemon)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let target = self.target();
        wait_answering(&mut self.child, &mut self.status, "wpd", async || {
            let mut client = wpd_proto::connect::client(&target).await?;
            client.get_capabilities(GetCapabilitiesRequest {}).await?;
            Ok(())
        })
        .await
    }

    /// `unix:<socket path>`, as `wpctl --endpoint` takes it.
    pub fn endpoint(&self) -> String {
        format!("unix:{}", self.socket.display())
    }

    /// The endpoint as a [`Target`].
    pub fn target(&self) -> Target {
        Target::Unix(self.socket.clone())
    }

    /// The socket path.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// A new connection to the daemon.
    pub async fn client(&self) -> Result<Client> {
        wpd_proto::connect::client(&self.target())
            .await
            .with_context(|| format!("connecting to {}", self.endpoint()))
    }

    /// The daemon's pid (of the command it runs under, if any: see [`Daemon::inner_pid`]).
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The daemon's own pid when it runs under another command (in the test's pid namespace).
    pub fn inner_pid(&self) -> Option<i32> {
        self.inner
    }

    /// Signals the daemon itself when it runs under a command (which may ignore signals).
    fn signal_inner(&self, sig: libc::c_int) {
        if let Some(pid) = self.inner
            && self.status.is_none()
        {
            // SAFETY: kill(2) on the daemon this guard started (its parent has not been reaped, so
            // the pid is not reused).
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// Everything the daemon wrote to stdout and stderr so far.
    pub fn log(&self) -> String {
        fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|e| format!("<cannot read {}: {e}>", self.log_path.display()))
    }

    /// The last `max_bytes` of [`Daemon::log`].
    pub fn log_tail(&self, max_bytes: usize) -> String {
        let log = self.log();
        if log.len() <= max_bytes {
            return log;
        }
        let mut start = log.len() - max_bytes;
        while !log.is_char_boundary(start) {
            start += 1;
        }
        format!("[... {start} bytes omitted ...]\n{}", &log[start..])
    }

    /// Path of the log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// True while the daemon process runs.
    pub fn is_running(&mut self) -> bool {
        if self.status.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(Some(st)) => {
                self.status = Some(st);
                false
            }
            _ => true,
        }
    }

    /// Sends SIGTERM and waits up to `timeout` for the exit status. On timeout the daemon is
    /// left running (the guard SIGKILLs it later).
    pub async fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        self.signal_inner(libc::SIGTERM);
        signal_child(&mut self.child, &mut self.status, libc::SIGTERM);
        wait_child(&mut self.child, &mut self.status, timeout)
            .await
            .ok_or_else(|| anyhow!("wpd did not exit within {timeout:?} of SIGTERM"))
    }

    /// SIGKILLs the daemon (no cleanup of its own can run) and reaps it. The guard keeps its
    /// temp dir — log and state file — until it is dropped.
    pub async fn kill(&mut self) -> Result<ExitStatus> {
        self.signal_inner(libc::SIGKILL);
        signal_child(&mut self.child, &mut self.status, libc::SIGKILL);
        wait_child(&mut self.child, &mut self.status, STOP_GRACE)
            .await
            .ok_or_else(|| anyhow!("wpd did not exit within {STOP_GRACE:?} of SIGKILL"))
    }

    /// The ptrace state file this daemon was given (`WPD_STATE_FILE`).
    pub fn state_file(&self) -> &Path {
        &self.state_file
    }

    /// The state directory this daemon was given (`WPD_STATE_DIR`: journal,
    /// saved watchpoints and policies).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// A daemon that takes over the state of a [killed](Daemon::kill) or
    /// stopped one: its ptrace state file and state directory (journal,
    /// saved watchpoints), with `extra` arguments.
    pub async fn restart_from(previous: &Daemon, extra: &[&str]) -> Result<Daemon> {
        Self::spawn(
            extra,
            Some(previous.state_file.clone()),
            Some(previous.state_dir.clone()),
            None,
            &[],
            None,
        )
        .await
    }

    /// Passes `result` through; when it is an error (or `WPD_TEST_PRINT_LOG` is set, to
    /// look into a test that passes), prints the daemon log to stderr first (libtest shows it
    /// with the failure).
    pub fn finish<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            // Ahead of the log: a reader of a long output (a CI's excerpt) sees it first.
            eprintln!("----- the test's error -----\n{e:#}");
            self.print_log("the test failed");
        } else if std::env::var_os("WPD_TEST_PRINT_LOG").is_some() {
            self.print_log("asked for");
        }
        result
    }

    /// Prints the daemon's warnings and errors (the first 40), then its log's last 64 KiB, to
    /// stderr, headed by `why`: an anomaly early in a long run is not lost to the tail.
    pub fn print_log(&self, why: &str) {
        let log = self.log();
        let worries: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        let shown = worries.len().min(40);
        eprintln!(
            "----- wpd's warnings and errors ({} of {}; wpd pid {}) -----\n{}",
            shown,
            worries.len(),
            self.pid(),
            worries[..shown].join("\n")
        );
        eprintln!(
            "----- wpd log ({why}; wpd pid {}) -----\n{}\n----- end of wpd log -----",
            self.pid(),
            self.log_tail(64 * 1024)
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_log("panicking");
        }
        self.signal_inner(libc::SIGTERM);
        stop_child_blocking(&mut self.child, &mut self.status, true);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// `wpd` with no flags as user `uid`, in `dir` (see [`Daemon::start_with_no_flags_as`]),
/// its output appended to `log_path`, its `RLIMIT_MEMLOCK` lowered to `memlock` bytes when
/// given, with the flags `args`.
fn spawn_no_flags(
    dir: &Path,
    log_path: &Path,
    uid: u32,
    memlock: Option<u64>,
    args: &[&str],
) -> Result<Child> {
    let env = user_env_in(dir);
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)?;
    let mut cmd = Command::new(bin_path("wpd"));
    cmd.args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    guard_child(&mut cmd);
    cmd.uid(uid).gid(uid);
    if let Some(bytes) = memlock {
        // SAFETY: setrlimit is async-signal-safe; lowering a limit needs no
        // privilege (the closure runs after the switch to `uid`).
        unsafe {
            cmd.pre_exec(move || {
                let l = libc::rlimit {
                    rlim_cur: bytes,
                    rlim_max: bytes,
                };
                if libc::setrlimit(libc::RLIMIT_MEMLOCK, &l) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    Ok(cmd.spawn()?)
}

/// The environment [`Daemon::start_with_no_flags_as`] gives its user, in `dir`.
fn user_env_in(dir: &Path) -> Vec<(String, String)> {
    let sub = |s: &str| dir.join(s).display().to_string();
    vec![
        ("HOME".into(), sub("home")),
        ("XDG_RUNTIME_DIR".into(), sub("run")),
        ("XDG_STATE_HOME".into(), sub("state-home")),
        ("PATH".into(), "/usr/bin:/bin".into()),
        ("NO_COLOR".into(), "1".into()),
    ]
}

/// Waits until a daemon just started (`child`) answers `ask` (each try
/// bounded by 2 s, every 50 ms, for [`DAEMON_READY_TIMEOUT`]); fails at
/// once if it exits. `what` names it in errors.
pub(crate) async fn wait_answering(
    child: &mut Child,
    status: &mut Option<ExitStatus>,
    what: &str,
    mut ask: impl AsyncFnMut() -> Result<()>,
) -> Result<()> {
    let deadline = Instant::now() + DAEMON_READY_TIMEOUT;
    let mut last_err = anyhow!("no attempt made");
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            *status = Some(st);
            bail!("{what} exited during startup ({})", describe_status(&st));
        }
        match tokio::time::timeout(Duration::from_secs(2), ask()).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => last_err = e,
            Err(_) => last_err = anyhow!("GetCapabilities timed out"),
        }
        if Instant::now() >= deadline {
            return Err(last_err.context(format!(
                "{what} did not answer GetCapabilities within {DAEMON_READY_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
