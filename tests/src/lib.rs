//! Harness for wpd's end-to-end tests and demo: finds the built binaries, runs `wpd` and
//! `wpd-target` under guards that stop them on every path (including panics), and wraps the
//! gRPC event stream, status checks and ledger snapshots the tests assert on.
//!
//! [`both_backends!`] runs one test body against the perf and the ptrace backend. Every daemon
//! gets a private ptrace state file (`WPD_STATE_FILE`), never `/run/wpd`.
//!
//! Guards ([`Daemon`], [`TargetProc`], [`ForeignBreakpoint`], [`ForeignTracer`]) clean up in
//! `Drop`. Children are
//! also started in their own process group (a terminal Ctrl-C reaches only the test or demo,
//! which then cleans up) and with `PR_SET_PDEATHSIG = SIGKILL`, so that they die even if the
//! test process is killed outright. The death signal fires when the *thread* that started the
//! child exits: create guards on a thread that outlives them (a test's body, `main`), never
//! inside `spawn_blocking`.

use std::collections::{HashSet, VecDeque};
use std::fmt::Debug;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail, ensure};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};
use wpd_proto::v1::watchpoints_client::WatchpointsClient;
use wpd_proto::v1::{
    Access, AttachRequest, AttachResponse, GetCapabilitiesRequest, Hit, ListThreadsRequest,
    ListThreadsResponse, ListWatchpointsRequest, ResumeRequest, SetWatchpointRequest,
    SetWatchpointResponse, SlotState, StreamEventsRequest, StreamEventsResponse, ThreadInfo,
    ThreadState, Watchpoint, WatchpointSpec,
};

pub use wpd_proto::connect::Target;
pub use wpd_proto::v1::Backend;
pub use wpd_proto::v1::stream_events_response::Event;

/// A connected gRPC client of the daemon.
pub type Client = WatchpointsClient<Channel>;

/// How long [`Daemon::start`] waits for the daemon to answer `GetCapabilities`.
pub const DAEMON_READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long [`TargetProc::start`] waits for the `READY` line.
pub const TARGET_READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long [`TargetProc::cmd`] waits for the reply line.
pub const TARGET_CMD_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a guard gives a child to exit after SIGTERM before it sends SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// Timeout of a single unary RPC made by the helpers here.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(10);

/// Value the target's `spawn` threads store into `VARS[1]`.
pub const SPAWN_MARK: u64 = 0xC0FFEE;

// ---------------------------------------------------------------------------------------------
// Binaries
// ---------------------------------------------------------------------------------------------

/// The directory holding the workspace's binaries: the running executable's directory, or its
/// parent when the executable is a test in `target/<profile>/deps/`.
pub fn bin_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the running executable")?;
    let mut dir = exe
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", exe.display()))?
        .to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    Ok(dir)
}

/// The path of the workspace binary `name` (`wpd`, `wpctl`, `wpd-target`, ...).
///
/// `$<NAME>_BIN` (e.g. `WPD_BIN`, `WPD_TARGET_BIN`) overrides the lookup; otherwise the binary
/// must sit in [`bin_dir`].
pub fn find_bin(name: &str) -> Result<PathBuf> {
    let var = format!("{}_BIN", name.to_uppercase().replace('-', "_"));
    if let Some(path) = std::env::var_os(&var) {
        let path = PathBuf::from(path);
        ensure!(
            path.is_file(),
            "${var} points to {}, which is not a file",
            path.display()
        );
        return Ok(path);
    }
    let dir = bin_dir()?;
    let path = dir.join(name);
    if path.is_file() {
        return Ok(path);
    }
    let release = if dir.file_name().is_some_and(|n| n == "release") {
        " --release"
    } else {
        ""
    };
    bail!(
        "`{name}` not found at {}: run `cargo build{release} --workspace --bins` first \
         (or set ${var} to the binary)",
        path.display()
    )
}

/// Like [`find_bin`], but panics with the explanation (for tests).
pub fn bin_path(name: &str) -> PathBuf {
    find_bin(name).unwrap_or_else(|e| panic!("{e:#}"))
}

// ---------------------------------------------------------------------------------------------
// Privileges
// ---------------------------------------------------------------------------------------------

/// The online CPUs, from `/sys/devices/system/cpu/online` ("0-3,6"): the CPUs wpd's perf
/// backend opens one event on per thread.
pub fn online_cpus() -> Vec<i32> {
    let s = fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_else(|_| "0".into());
    let mut v = Vec::new();
    for part in s.trim().split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
                    v.extend(a..=b);
                }
            }
            None => v.extend(part.parse::<i32>().ok()),
        }
    }
    v
}

/// True when this process may run the end-to-end tests: it is root and the kernel grants a
/// hardware breakpoint (checked once with a throw-away breakpoint on this thread).
///
/// Otherwise prints `SKIP <test>: <reason>` to stderr (uncaptured) and returns false; the test must return
/// right away. With `WPD_TESTS_REQUIRE=1` in the environment it panics instead, so that CI
/// cannot pass by skipping.
pub fn require_root_perf() -> bool {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    let result = PROBE.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if euid != 0 {
            return Err(format!(
                "not root (euid {euid}); wpd needs root to watch other processes \
                 (run e.g. `sudo -E cargo test -p wpd-tests`)"
            ));
        }
        static PROBE_VAR: AtomicU32 = AtomicU32::new(0);
        ForeignBreakpoint::open(0, PROBE_VAR.as_ptr() as u64, 4)
            .map(drop)
            .map_err(|e| format!("the kernel refuses hardware breakpoints here: {e:#}"))
    });
    match result {
        Ok(()) => true,
        Err(reason) => skip(reason),
    }
}

/// [`require_root_perf`], plus, for [`Backend::Ptrace`], a kernel that lets root ptrace
/// (`kernel.yama.ptrace_scope` below 3). Same skip rules.
pub fn require_backend(backend: Backend) -> bool {
    if !require_root_perf() {
        return false;
    }
    if backend == Backend::Ptrace {
        let scope = fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(0);
        if scope >= 3 {
            return skip(&format!(
                "kernel.yama.ptrace_scope={scope} forbids every ptrace attach"
            ));
        }
    }
    true
}

/// Prints `SKIP <test>: <reason>` and returns false, or panics under `WPD_TESTS_REQUIRE=1`.
fn skip(reason: &str) -> bool {
    let name = std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string();
    if std::env::var_os("WPD_TESTS_REQUIRE").is_some_and(|v| v == "1") {
        panic!("{name}: cannot run ({reason}) and WPD_TESTS_REQUIRE=1");
    }
    // Written to the real stderr, past libtest's capture, so that a skip is visible
    // even when the test "passes".
    let _ = writeln!(std::io::stderr(), "SKIP {name}: {reason}");
    false
}

/// Runs a test body against both backends, without copying it: `both_backends!(name)` (or
/// `both_backends!(name, body)`) turns `async fn body(backend: Backend) -> anyhow::Result<()>`
/// into a module `name` with two tokio tests, `name::perf` and `name::ptrace`, each of which
/// skips as [`require_backend`] says and otherwise runs `body(Backend::Perf | Backend::Ptrace)`.
/// Attributes (e.g. a doc comment) before the name go on the module.
#[macro_export]
macro_rules! both_backends {
    ($(#[$attr:meta])* $name:ident) => {
        $crate::both_backends!($(#[$attr])* $name, $name);
    };
    ($(#[$attr:meta])* $name:ident, $body:ident) => {
        $(#[$attr])*
        mod $name {
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn perf() -> ::anyhow::Result<()> {
                if !$crate::require_backend($crate::Backend::Perf) {
                    return Ok(());
                }
                super::$body($crate::Backend::Perf).await
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn ptrace() -> ::anyhow::Result<()> {
                if !$crate::require_backend($crate::Backend::Ptrace) {
                    return Ok(());
                }
                super::$body($crate::Backend::Ptrace).await
            }
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Child process plumbing
// ---------------------------------------------------------------------------------------------

/// Makes a child its own process group leader and kills it when the spawning thread dies.
fn guard_child(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    cmd.process_group(0);
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe calls.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(std::io::Error::other("parent died before exec"));
            }
            Ok(())
        });
    }
}

/// Sends `sig` to a child that has not been reaped (so the pid cannot have been reused).
fn signal_child(child: &mut Child, status: &mut Option<ExitStatus>, sig: libc::c_int) {
    if status.is_some() {
        return;
    }
    if let Ok(Some(st)) = child.try_wait() {
        *status = Some(st);
        return;
    }
    // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// Blocking: polls for the child's exit until `timeout`.
fn wait_child_blocking(
    child: &mut Child,
    status: &mut Option<ExitStatus>,
    timeout: Duration,
) -> Option<ExitStatus> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if status.is_some() {
            return *status;
        }
        if let Ok(Some(st)) = child.try_wait() {
            *status = Some(st);
            return *status;
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Async: polls for the child's exit until `timeout`.
async fn wait_child(
    child: &mut Child,
    status: &mut Option<ExitStatus>,
    timeout: Duration,
) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if status.is_some() {
            return *status;
        }
        if let Ok(Some(st)) = child.try_wait() {
            *status = Some(st);
            return *status;
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Blocking: SIGTERM (or SIGKILL right away if `term` is false), wait, then SIGKILL, wait.
fn stop_child_blocking(child: &mut Child, status: &mut Option<ExitStatus>, term: bool) {
    if term {
        signal_child(child, status, libc::SIGTERM);
        if wait_child_blocking(child, status, STOP_GRACE).is_some() {
            return;
        }
        eprintln!(
            "harness: pid {} ignored SIGTERM for {STOP_GRACE:?}; sending SIGKILL",
            child.id()
        );
    }
    signal_child(child, status, libc::SIGKILL);
    if wait_child_blocking(child, status, STOP_GRACE).is_none() {
        eprintln!(
            "harness: pid {} did not exit after SIGKILL; leaving it",
            child.id()
        );
    }
}

/// Describes an exit status, naming the signal when there was one.
pub fn describe_status(st: &ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => {
            let name = match sig {
                libc::SIGTRAP => "SIGTRAP",
                libc::SIGKILL => "SIGKILL",
                libc::SIGTERM => "SIGTERM",
                libc::SIGSEGV => "SIGSEGV",
                libc::SIGABRT => "SIGABRT",
                libc::SIGINT => "SIGINT",
                _ => "signal",
            };
            format!(
                "killed by {name} ({sig}){}",
                if st.core_dumped() {
                    ", core dumped"
                } else {
                    ""
                }
            )
        }
        (None, None) => format!("{st}"),
    }
}

/// Removes `<prefix>-<pid>-...` directories left behind by processes that no longer exist
/// (a test run killed with SIGKILL cannot clean up after itself).
fn remove_stale_temp_dirs(base: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&format!("{prefix}-")))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// A fresh, empty directory under the system temp dir.
fn unique_temp_dir(prefix: &str) -> Result<PathBuf> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let base = std::env::temp_dir();
    remove_stale_temp_dirs(&base, prefix);
    for _ in 0..100 {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = base.join(format!(
            "{prefix}-{}-{}-{nanos:08x}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    bail!("cannot create a unique directory in {}", base.display())
}

// ---------------------------------------------------------------------------------------------
// The daemon
// ---------------------------------------------------------------------------------------------

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
}

impl Daemon {
    /// Starts `wpd --listen unix:<tmp>/wpd.sock` with `WPD_STATE_FILE=<tmp>/ptrace-armed` and
    /// waits until it answers `GetCapabilities`. Panics if the `wpd` binary is missing.
    pub async fn start() -> Result<Daemon> {
        Self::spawn(&[], None, None).await
    }

    /// Like [`Daemon::start`], with `RLIMIT_NOFILE` (soft and hard) set to `limit` in the
    /// daemon, so that it cannot raise it.
    pub async fn start_with_fd_limit(limit: u64) -> Result<Daemon> {
        Self::spawn(&[], None, Some(limit)).await
    }

    /// Like [`Daemon::start`] with extra command-line arguments.
    pub async fn start_with_args(extra: &[&str]) -> Result<Daemon> {
        Self::spawn(extra, None, None).await
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
        let d = Self::spawn(&args, None, None).await?;
        fs::set_permissions(&d.dir, fs::Permissions::from_mode(0o755))?;
        Ok(d)
    }

    /// Extra arguments and a fixed `RLIMIT_NOFILE` (see [`Daemon::start_with_fd_limit`]).
    pub async fn start_with_args_and_fd_limit(extra: &[&str], limit: u64) -> Result<Daemon> {
        Self::spawn(extra, None, Some(limit)).await
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
        Self::spawn(&[], Some(state_file.to_path_buf()), None).await
    }

    async fn spawn(
        extra: &[&str],
        state_file: Option<PathBuf>,
        fd_limit: Option<u64>,
    ) -> Result<Daemon> {
        let bin = bin_path("wpd");
        let dir = unique_temp_dir("wpd-e2e")?;
        let socket = dir.join("wpd.sock");
        let log_path = dir.join("wpd.log");
        let state_file = state_file.unwrap_or_else(|| dir.join("ptrace-armed"));
        let spawned = (|| -> Result<Child> {
            let log = File::create(&log_path)
                .with_context(|| format!("creating {}", log_path.display()))?;
            let mut cmd = Command::new(&bin);
            cmd.arg("--listen")
                .arg(format!("unix:{}", socket.display()))
                .args(extra)
                .env("NO_COLOR", "1")
                .env("WPD_STATE_FILE", &state_file)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log);
            guard_child(&mut cmd);
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
        let deadline = Instant::now() + DAEMON_READY_TIMEOUT;
        let target = self.target();
        let mut last_err = anyhow!("no attempt made");
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.status = Some(st);
                bail!("wpd exited during startup ({})", describe_status(&st));
            }
            let attempt = tokio::time::timeout(Duration::from_secs(2), async {
                let mut client = wpd_proto::connect::client(&target).await?;
                client.get_capabilities(GetCapabilitiesRequest {}).await?;
                anyhow::Ok(())
            })
            .await;
            match attempt {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => last_err = e,
                Err(_) => last_err = anyhow!("GetCapabilities timed out"),
            }
            if Instant::now() >= deadline {
                return Err(last_err.context(format!(
                    "wpd did not answer GetCapabilities within {DAEMON_READY_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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

    /// The daemon's pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
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
        signal_child(&mut self.child, &mut self.status, libc::SIGTERM);
        wait_child(&mut self.child, &mut self.status, timeout)
            .await
            .ok_or_else(|| anyhow!("wpd did not exit within {timeout:?} of SIGTERM"))
    }

    /// SIGKILLs the daemon (no cleanup of its own can run) and reaps it. The guard keeps its
    /// temp dir — log and state file — until it is dropped.
    pub async fn kill(&mut self) -> Result<ExitStatus> {
        signal_child(&mut self.child, &mut self.status, libc::SIGKILL);
        wait_child(&mut self.child, &mut self.status, STOP_GRACE)
            .await
            .ok_or_else(|| anyhow!("wpd did not exit within {STOP_GRACE:?} of SIGKILL"))
    }

    /// The ptrace state file this daemon was given (`WPD_STATE_FILE`).
    pub fn state_file(&self) -> &Path {
        &self.state_file
    }

    /// Passes `result` through; when it is an error, prints the daemon log to stderr first
    /// (libtest shows it with the failure).
    pub fn finish<T>(&self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            self.print_log("the test failed");
        }
        result
    }

    /// Prints the daemon's log (its last 64 KiB) to stderr, headed by `why`.
    pub fn print_log(&self, why: &str) {
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
        stop_child_blocking(&mut self.child, &mut self.status, true);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------------------------
// The target
// ---------------------------------------------------------------------------------------------

/// A running `wpd-target`, driven through its stdin/stdout. Dropping it SIGKILLs and reaps it.
pub struct TargetProc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    /// Commands sent whose reply line has not been read yet (a command whose reply timed out
    /// still answers later, e.g. once a held thread is resumed; that line must be skipped).
    owed: usize,
    status: Option<ExitStatus>,
    /// Process id (= tid of the main thread).
    pub pid: i32,
    /// Addresses of `VARS[0..8]`.
    pub vars: Vec<u64>,
    /// Worker threads it started with.
    pub threads: usize,
}

impl TargetProc {
    /// Starts `wpd-target` (found by [`find_bin`]) with `args` and waits for `READY`.
    pub async fn start(args: &[&str]) -> Result<TargetProc> {
        let bin = find_bin("wpd-target")?;
        Self::start_bin(&bin, args).await
    }

    /// Like [`TargetProc::start`], running as user `uid` (group = uid).
    pub async fn start_as(uid: u32, args: &[&str]) -> Result<TargetProc> {
        let bin = find_bin("wpd-target")?;
        Self::spawn_bin(&bin, args, Some((uid, uid))).await
    }

    /// Like [`TargetProc::start`], running as user `uid` and group `gid`.
    pub async fn start_as_ids(uid: u32, gid: u32, args: &[&str]) -> Result<TargetProc> {
        let bin = find_bin("wpd-target")?;
        Self::spawn_bin(&bin, args, Some((uid, gid))).await
    }

    /// Starts the given `wpd-target` binary with `args` and waits for `READY`.
    pub async fn start_bin(bin: &Path, args: &[&str]) -> Result<TargetProc> {
        Self::spawn_bin(bin, args, None).await
    }

    async fn spawn_bin(bin: &Path, args: &[&str], ids: Option<(u32, u32)>) -> Result<TargetProc> {
        let mut cmd = Command::new(bin);
        if let Some((uid, gid)) = ids {
            use std::os::unix::process::CommandExt as _;
            cmd.uid(uid).gid(gid);
        }
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        guard_child(&mut cmd);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("wpd-target-stdout".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .context("cannot start the stdout reader thread")?;
        let mut target = TargetProc {
            child,
            stdin,
            lines,
            owed: 0,
            status: None,
            pid: 0,
            vars: Vec::new(),
            threads: 0,
        };
        let ready = target
            .read_line(TARGET_READY_TIMEOUT)
            .await
            .context("waiting for wpd-target's READY line")?;
        target.parse_ready(&ready)?;
        Ok(target)
    }

    /// Makes the target exec itself (`exec N`: a fresh image with N workers)
    /// and waits for the new image's READY line; `vars` are updated.
    pub async fn exec(&mut self, workers: usize) -> Result<()> {
        ensure!(self.owed == 0, "replies still owed before exec");
        self.send(&format!("exec {workers}"))?;
        let line = self
            .read_line(TARGET_READY_TIMEOUT)
            .await
            .context("waiting for READY after exec")?;
        self.owed = 0;
        self.parse_ready(&line)
    }

    /// Makes the target exec `program` (a copy of `wpd-target`, e.g. a setuid one) with
    /// `workers` workers and waits for its READY line; `vars` are updated.
    pub async fn exec_path(&mut self, program: &Path, workers: usize) -> Result<()> {
        ensure!(self.owed == 0, "replies still owed before exec");
        self.send(&format!("exec-path {} {workers}", program.display()))?;
        let line = self
            .read_line(TARGET_READY_TIMEOUT)
            .await
            .context("waiting for READY after exec-path")?;
        self.owed = 0;
        self.parse_ready(&line)
    }

    fn parse_ready(&mut self, line: &str) -> Result<()> {
        ensure!(
            line.starts_with("READY "),
            "expected READY from wpd-target, got {line:?}"
        );
        let pid: i32 = field(line, "pid")?;
        ensure!(
            pid == self.child.id() as i32,
            "READY says pid={pid}, but the child is {}",
            self.child.id()
        );
        let vars = field_str(line, "vars")?
            .split(',')
            .map(|s| parse_hex(s).ok_or_else(|| anyhow!("bad address {s:?} in {line:?}")))
            .collect::<Result<Vec<u64>>>()?;
        ensure!(vars.len() == 8, "expected 8 vars in {line:?}");
        self.pid = pid;
        self.threads = field(line, "threads")?;
        self.vars = vars;
        Ok(())
    }

    async fn read_line(&mut self, timeout: Duration) -> Result<String> {
        self.read_line_before(Instant::now() + timeout)
            .await?
            .ok_or_else(|| anyhow!("no line from wpd-target within {timeout:?}"))
    }

    /// The next stdout line, or `None` once `deadline` has passed.
    async fn read_line_before(&mut self, deadline: Instant) -> Result<Option<String>> {
        match tokio::time::timeout_at(deadline, self.lines.recv()).await {
            Ok(Some(line)) => Ok(Some(line)),
            Ok(None) => {
                let st =
                    wait_child(&mut self.child, &mut self.status, Duration::from_secs(2)).await;
                bail!(
                    "wpd-target closed its stdout ({})",
                    st.map(|s| describe_status(&s))
                        .unwrap_or_else(|| "still running".into())
                )
            }
            Err(_) => Ok(None),
        }
    }

    /// Sends one command line without waiting for its reply (read by the next
    /// [`TargetProc::cmd`] / [`TargetProc::cmd_within`], which skip it).
    pub fn send(&mut self, command: &str) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("wpd-target's stdin is closed"))?;
        writeln!(stdin, "{command}")
            .and_then(|()| stdin.flush())
            .with_context(|| format!("sending {command:?} to wpd-target"))?;
        self.owed += 1;
        Ok(())
    }

    /// Sends one command and waits up to `timeout` for its reply: `None` when it did not come
    /// (the late reply is skipped by later commands). A reply starting with `ERR` is an error.
    pub async fn cmd_within(&mut self, command: &str, timeout: Duration) -> Result<Option<String>> {
        self.send(command)?;
        let deadline = Instant::now() + timeout;
        while self.owed > 0 {
            let Some(line) = self
                .read_line_before(deadline)
                .await
                .with_context(|| format!("waiting for the reply to {command:?}"))?
            else {
                return Ok(None);
            };
            self.owed -= 1;
            if self.owed == 0 {
                ensure!(
                    !line.starts_with("ERR"),
                    "wpd-target refused {command:?}: {line}"
                );
                return Ok(Some(line));
            }
        }
        unreachable!("send() owes at least one reply")
    }

    /// Sends one command line and returns the reply line (timeout 10 s). A reply starting with
    /// `ERR` is an error.
    pub async fn cmd(&mut self, command: &str) -> Result<String> {
        self.cmd_within(command, TARGET_CMD_TIMEOUT)
            .await?
            .ok_or_else(|| anyhow!("no reply to {command:?} within {TARGET_CMD_TIMEOUT:?}"))
    }

    /// `spawn`: a new thread stores 0xC0FFEE into `VARS[1]` first thing; returns its tid.
    pub async fn spawn_marker(&mut self) -> Result<i32> {
        let reply = self.cmd("spawn").await?;
        field(&reply, "tid")
    }

    /// `spawn-worker`: one more worker; returns its tid.
    pub async fn spawn_worker(&mut self) -> Result<i32> {
        let reply = self.cmd("spawn-worker").await?;
        field(&reply, "tid")
    }

    /// `write i value` from the main thread.
    pub async fn write(&mut self, index: usize, value: u64) -> Result<()> {
        self.cmd(&format!("write {index} {value:#x}"))
            .await
            .map(drop)
    }

    /// `stop-workers`: returns the number of threads left.
    pub async fn stop_workers(&mut self) -> Result<usize> {
        let reply = self.cmd("stop-workers").await?;
        field(&reply, "remaining")
    }

    /// `leader-exit`: the main thread ends alone (its process lives on with a zombie leader);
    /// returns the tid of the thread that now answers commands.
    pub async fn leader_exit(&mut self) -> Result<i32> {
        let reply = self.cmd("leader-exit").await?;
        field(&reply, "commander")
    }

    /// `ping`: returns (`VARS[0]`, thread count).
    pub async fn ping(&mut self) -> Result<(u64, usize)> {
        let reply = self.cmd("ping").await?;
        Ok((field(&reply, "counter")?, field(&reply, "threads")?))
    }

    /// Pings until `VARS[0]` is above `than` (workers still storing), or fails after `timeout`.
    pub async fn wait_counter_above(&mut self, than: u64, timeout: Duration) -> Result<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            let (counter, _) = self.ping().await?;
            if counter > than {
                return Ok(counter);
            }
            ensure!(
                Instant::now() < deadline,
                "VARS[0] stayed at {counter} (not above {than}) for {timeout:?}: workers stuck?"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `quit`, then waits (10 s) for the exit status.
    pub async fn quit(&mut self) -> Result<ExitStatus> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("wpd-target's stdin is closed"))?;
        writeln!(stdin, "quit")
            .and_then(|()| stdin.flush())
            .context("sending quit to wpd-target")?;
        self.stdin = None;
        let _ = self.read_line(TARGET_CMD_TIMEOUT).await; // BYE, or EOF
        self.wait_exit(Duration::from_secs(10)).await
    }

    /// Waits up to `timeout` for the target to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        wait_child(&mut self.child, &mut self.status, timeout)
            .await
            .ok_or_else(|| anyhow!("wpd-target {} did not exit within {timeout:?}", self.pid))
    }

    /// The thread ids in `/proc/<pid>/task`, sorted.
    pub fn tids(&self) -> Result<Vec<i32>> {
        let dir = format!("/proc/{}/task", self.pid);
        let mut tids = fs::read_dir(&dir)
            .with_context(|| format!("reading {dir}"))?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect::<Vec<i32>>();
        tids.sort_unstable();
        Ok(tids)
    }

    /// The tids of the worker threads (every thread but the main one).
    pub fn worker_tids(&self) -> Result<Vec<i32>> {
        Ok(self
            .tids()?
            .into_iter()
            .filter(|&t| t != self.pid)
            .collect())
    }

    /// True while the process has neither exited nor been reaped.
    pub fn is_alive(&mut self) -> bool {
        if self.status.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(Some(st)) => {
                self.status = Some(st);
                false
            }
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// The exit status once it has exited (after [`TargetProc::is_alive`] or a wait saw it).
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.status
    }

    /// Fails unless the target still runs; names the signal that killed it otherwise.
    pub fn ensure_alive(&mut self) -> Result<()> {
        if self.is_alive() {
            return Ok(());
        }
        let st = self.status.map(|s| describe_status(&s)).unwrap_or_default();
        bail!("wpd-target {} is dead: {st}", self.pid)
    }

    /// `usr1count`: how many SIGUSR1 the target's handler has run.
    pub async fn usr1_count(&mut self) -> Result<u64> {
        let reply = self.cmd("usr1count").await?;
        reply
            .strip_prefix("USR1 ")
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| anyhow!("expected `USR1 <n>`, got {reply:?}"))
    }

    /// Sends signal `sig` to the process (not reaped yet, so the pid is still ours).
    pub fn signal(&mut self, sig: libc::c_int) -> Result<()> {
        self.ensure_alive()?;
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
        if unsafe { libc::kill(self.pid, sig) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("kill({}, {sig})", self.pid));
        }
        Ok(())
    }

    /// `VARS[index]` read from outside through `/proc/<pid>/mem` (works while every thread of
    /// the target is stopped), or through a live thread's `mem` once the main thread has
    /// exited (a zombie leader has no memory to read).
    pub fn read_var(&self, index: usize) -> Result<u64> {
        use std::os::unix::fs::FileExt;
        let addr = *self
            .vars
            .get(index)
            .ok_or_else(|| anyhow!("no VARS[{index}]"))?;
        let mut paths = vec![format!("/proc/{}/mem", self.pid)];
        paths.extend(
            self.tids()
                .unwrap_or_default()
                .into_iter()
                .map(|t| format!("/proc/{}/task/{t}/mem", self.pid)),
        );
        let mut buf = [0u8; 8];
        let mut last = None;
        for path in &paths {
            match File::open(path).and_then(|f| f.read_exact_at(&mut buf, addr)) {
                Ok(()) => return Ok(u64::from_le_bytes(buf)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no thread")))
            .with_context(|| format!("reading VARS[{index}] at {addr:#x} from {paths:?}"))
    }

    /// The state letter of every thread (field 3 of `/proc/<pid>/task/<tid>/stat`: `R`, `S`,
    /// `T` stopped, `t` tracing stop...), by tid. Threads that vanish meanwhile are left out.
    pub fn thread_run_states(&self) -> Result<Vec<(i32, char)>> {
        let mut out = Vec::new();
        for tid in self.tids()? {
            let path = format!("/proc/{}/task/{tid}/stat", self.pid);
            let Ok(stat) = fs::read_to_string(&path) else {
                continue;
            };
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .and_then(|w| w.chars().next())
                .ok_or_else(|| anyhow!("cannot parse {path}: {stat:?}"))?;
            out.push((tid, state));
        }
        Ok(out)
    }

    /// `TracerPid` of every thread (from `/proc/<pid>/task/<tid>/status`), by tid. Threads
    /// that vanish meanwhile are left out.
    pub fn thread_tracer_pids(&self) -> Result<Vec<(i32, i32)>> {
        let mut out = Vec::new();
        for tid in self.tids()? {
            let path = format!("/proc/{}/task/{tid}/status", self.pid);
            let Ok(status) = fs::read_to_string(&path) else {
                continue;
            };
            out.push((tid, parse_tracer_pid(&status, &path)?));
        }
        Ok(out)
    }

    /// Polls until no thread of the target is ptrace-attached (every `TracerPid` is 0); fails
    /// after `timeout` naming the threads still traced and by whom.
    pub async fn wait_untraced(&self, timeout: Duration) -> Result<()> {
        poll_until(timeout, "TracerPid 0 on every thread", async || {
            let traced: Vec<(i32, i32)> = self
                .thread_tracer_pids()?
                .into_iter()
                .filter(|&(_, tracer)| tracer != 0)
                .collect();
            Ok(if traced.is_empty() {
                Ok(())
            } else {
                Err(format!("(tid, TracerPid) {traced:?}"))
            })
        })
        .await
    }

    /// `TracerPid` from `/proc/<pid>/status` (0 when nobody ptraces the main thread).
    pub fn tracer_pid(&self) -> Result<i32> {
        let path = format!("/proc/{}/status", self.pid);
        let status = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        parse_tracer_pid(&status, &path)
    }
}

fn parse_tracer_pid(status: &str, path: &str) -> Result<i32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .ok_or_else(|| anyhow!("no TracerPid in {path}"))?
        .trim()
        .parse()
        .with_context(|| format!("parsing TracerPid in {path}"))
}

impl Drop for TargetProc {
    fn drop(&mut self) {
        self.stdin = None;
        stop_child_blocking(&mut self.child, &mut self.status, false);
    }
}

fn field_str<'a>(line: &'a str, key: &str) -> Result<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .ok_or_else(|| anyhow!("no {key}= in {line:?}"))
}

fn field<T: std::str::FromStr>(line: &str, key: &str) -> Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    field_str(line, key)?
        .parse()
        .with_context(|| format!("bad {key}= in {line:?}"))
}

fn parse_hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim().strip_prefix("0x")?, 16).ok()
}

/// The kernel's own answer to "may user `uid` (group `gid`, no capabilities) read the memory
/// of `pid` at `addr`?": `wpd-probe access` run as that user (`process_vm_readv`, the same
/// `PTRACE_MODE_ATTACH_REALCREDS` check `PTRACE_SEIZE` makes). `Ok(true)` when allowed.
pub async fn kernel_allows_access(uid: u32, gid: u32, pid: i32, addr: u64) -> Result<bool> {
    let bin = find_bin("wpd-probe")?;
    let out = tokio::process::Command::new(&bin)
        .args(["access", &pid.to_string(), &format!("{addr:#x}")])
        .uid(uid)
        .gid(gid)
        .stdin(Stdio::null())
        .output()
        .await
        .context("running wpd-probe access")?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.trim() {
        "ALLOWED" => Ok(true),
        t if t.starts_with("DENIED") => Ok(false),
        t => bail!("wpd-probe access said {t:?} ({:?})", out.status),
    }
}

/// A setuid-root copy of `wpd-target` in a directory of its own (removed on drop), for tests of
/// a watched process that executes a program with other credentials.
pub struct SetuidTarget {
    dir: PathBuf,
    /// The copy: owned by root, mode 4755.
    pub path: PathBuf,
}

impl SetuidTarget {
    /// Makes the copy (needs root).
    pub fn new() -> Result<SetuidTarget> {
        use std::os::unix::fs::PermissionsExt;
        let dir = unique_temp_dir("wpd-setuid")?;
        let path = dir.join("wpd-target-setuid");
        let made = (|| -> Result<()> {
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
            fs::copy(find_bin("wpd-target")?, &path)?;
            std::os::unix::fs::chown(&path, Some(0), Some(0))?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o4755))?;
            Ok(())
        })();
        if let Err(e) = made {
            let _ = fs::remove_dir_all(&dir);
            return Err(e.context("making a setuid copy of wpd-target"));
        }
        Ok(SetuidTarget { dir, path })
    }
}

impl Drop for SetuidTarget {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A pid that certainly does not exist: a child we started and reaped (`true`).
pub fn dead_pid() -> Result<i32> {
    let mut child = Command::new("true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .context("running `true`")?;
    let pid = child.id() as i32;
    child.wait()?;
    Ok(pid)
}

// ---------------------------------------------------------------------------------------------
// A hardware breakpoint held by the test itself (a "foreign" slot owner)
// ---------------------------------------------------------------------------------------------

/// `struct perf_event_attr` as of PERF_ATTR_SIZE_VER7 (128 bytes).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    /// Bit field: disabled (bit 0), ..., exclude_kernel (bit 5), exclude_hv (bit 6), ...
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    bp_addr: u64,
    bp_len: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved_2: u16,
    aux_sample_size: u32,
    reserved_3: u32,
    sig_data: u64,
}

const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == 128);

const PERF_TYPE_BREAKPOINT: u32 = 5;
const HW_BREAKPOINT_W: u32 = 2;
const ATTR_EXCLUDE_KERNEL: u64 = 1 << 5;
const ATTR_EXCLUDE_HV: u64 = 1 << 6;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// An enabled, counting (never signalling) write breakpoint opened with `perf_event_open` by
/// this process on another thread: it occupies one of that thread's debug-register slots, as
/// a debugger would. Closed on drop.
pub struct ForeignBreakpoint {
    fd: OwnedFd,
    /// Thread it is on.
    pub tid: i32,
}

/// The perf syscalls the daemon makes to arm one thread on one CPU, made
/// directly (the "floor" of the benchmarks): a sampling, inheritable write
/// breakpoint on `(tid, cpu)`, its id, and its output redirected to
/// `collector` (a per-CPU ring owner from [`floor_collector`]).
pub fn floor_perf_arm(tid: i32, addr: u64, cpu: i32, collector: &OwnedFd) -> Result<OwnedFd> {
    const ATTR_INHERIT: u64 = 1 << 1;
    const PERF_EVENT_IOC_ID: libc::c_ulong = 0x8008_2407;
    const PERF_EVENT_IOC_SET_OUTPUT: libc::c_ulong = 0x2405;
    let attr = PerfEventAttr {
        type_: PERF_TYPE_BREAKPOINT,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        sample_period: 1,
        flags: ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV | ATTR_INHERIT,
        bp_type: HW_BREAKPOINT_W,
        bp_addr: addr,
        bp_len: 8,
        ..Default::default()
    };
    let fd = perf_open(&attr, tid, cpu)?;
    let mut id = 0u64;
    // SAFETY: plain ioctls on descriptors we own; `id` is a valid out pointer.
    unsafe {
        libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_ID, &mut id as *mut u64);
        libc::ioctl(
            fd.as_raw_fd(),
            PERF_EVENT_IOC_SET_OUTPUT,
            collector.as_raw_fd(),
        );
    }
    Ok(fd)
}

/// The thread-tracking event the daemon opens per thread and CPU at attach
/// (a dummy software event reporting FORK/EXIT/COMM, inherited by new
/// threads), output redirected to `collector`.
pub fn floor_perf_track(tid: i32, cpu: i32, collector: &OwnedFd) -> Result<OwnedFd> {
    const PERF_TYPE_SOFTWARE: u32 = 1;
    const PERF_COUNT_SW_DUMMY: u64 = 9;
    const PERF_EVENT_IOC_SET_OUTPUT: libc::c_ulong = 0x2405;
    // inherit | comm | task | sample_id_all | comm_exec | inherit_thread
    let bits = (1 << 1) | (1 << 9) | (1 << 13) | (1 << 18) | (1 << 24) | (1u64 << 35);
    let attr = PerfEventAttr {
        type_: PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_DUMMY,
        flags: ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV | bits,
        ..Default::default()
    };
    let fd = perf_open(&attr, tid, cpu)?;
    // SAFETY: plain ioctl on descriptors we own.
    unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            PERF_EVENT_IOC_SET_OUTPUT,
            collector.as_raw_fd(),
        )
    };
    Ok(fd)
}

/// The kernel's own floor for thread churn (`perf bench breakpoint thread`): a counting write
/// breakpoint of 8 bytes at `addr` on thread `tid`, all CPUs (`cpu = -1`), `inherit = 1`, so
/// that the kernel copies it into every thread `tid` creates.
pub fn floor_perf_inherit(tid: i32, addr: u64) -> Result<OwnedFd> {
    const ATTR_INHERIT: u64 = 1 << 1;
    let attr = PerfEventAttr {
        type_: PERF_TYPE_BREAKPOINT,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        flags: ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV | ATTR_INHERIT,
        bp_type: HW_BREAKPOINT_W,
        bp_addr: addr,
        bp_len: 8,
        ..Default::default()
    };
    perf_open(&attr, tid, -1)
}

/// The free-slot check wpd's ptrace backend makes on a thread before arming
/// it: one disabled 1-byte write breakpoint opened on `tid` and closed
/// (disabled breakpoints hold a slot, so the open fails with ENOSPC on a
/// full thread). Returns whether the thread had a free slot.
pub fn floor_probe_slot(tid: i32) -> Result<bool> {
    const ATTR_DISABLED: u64 = 1;
    let attr = PerfEventAttr {
        type_: PERF_TYPE_BREAKPOINT,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        flags: ATTR_DISABLED | ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV,
        bp_type: HW_BREAKPOINT_W,
        bp_addr: 0x1000,
        bp_len: 1,
        ..Default::default()
    };
    match perf_open(&attr, tid, -1) {
        Ok(_fd) => Ok(true),
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .and_then(|e| e.raw_os_error())
                == Some(libc::ENOSPC) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// A per-CPU dummy event that owns output for [`floor_perf_arm`].
pub fn floor_collector(cpu: i32) -> Result<OwnedFd> {
    const PERF_TYPE_SOFTWARE: u32 = 1;
    const PERF_COUNT_SW_DUMMY: u64 = 9;
    let attr = PerfEventAttr {
        type_: PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_DUMMY,
        flags: ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV,
        ..Default::default()
    };
    perf_open(&attr, -1, cpu)
}

fn perf_open(attr: &PerfEventAttr, pid: i32, cpu: i32) -> Result<OwnedFd> {
    // SAFETY: `attr` is a valid perf_event_attr of the size it declares.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const PerfEventAttr,
            pid as libc::pid_t,
            cpu as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("perf_event_open(pid {pid}, cpu {cpu})"));
    }
    // SAFETY: the kernel just returned this new descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

impl ForeignBreakpoint {
    /// Opens a write breakpoint of `len` bytes at `addr` in thread `tid` (0: this thread).
    pub fn open(tid: i32, addr: u64, len: u64) -> Result<ForeignBreakpoint> {
        let attr = PerfEventAttr {
            type_: PERF_TYPE_BREAKPOINT,
            size: std::mem::size_of::<PerfEventAttr>() as u32,
            flags: ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV, // disabled = 0: armed at once
            bp_type: HW_BREAKPOINT_W,
            bp_addr: addr,
            bp_len: len,
            ..Default::default()
        };
        // SAFETY: `attr` is a valid perf_event_attr of the size it declares; the other
        // arguments are plain integers.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &attr as *const PerfEventAttr,
                tid as libc::pid_t,
                -1 as libc::c_int,
                -1 as libc::c_int,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| {
                format!("perf_event_open(breakpoint W len {len} at {addr:#x}, tid {tid})")
            });
        }
        // SAFETY: the kernel just returned this new descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        Ok(ForeignBreakpoint { fd, tid })
    }

    /// The perf file descriptor.
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

// ---------------------------------------------------------------------------------------------
// A ptrace attachment held by the test itself (another debugger)
// ---------------------------------------------------------------------------------------------

/// A `PTRACE_SEIZE` of one thread of another process, held by this (test) process as a
/// debugger would hold it. ptrace requests must come from the thread that attached, so a
/// dedicated thread seizes, passes on every stop unchanged (the tracee never stays stopped
/// because of us) and, when asked or on drop, interrupts and detaches.
pub struct ForeignTracer {
    /// The traced thread.
    pub tid: i32,
    /// The tracing thread of this process: what the tracee's `TracerPid` shows (the kernel
    /// reports the tracer *thread*, not its process).
    pub tracer_tid: i32,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

/// How long [`ForeignTracer`] waits for its tracee's stop when detaching.
const FOREIGN_DETACH_TIMEOUT: Duration = Duration::from_secs(5);

/// What `waitpid(tid, __WALL | WNOHANG)` said about a tracee.
enum TraceeWait {
    Nothing,
    Gone,
    /// Stopped: (stop signal, ptrace event or 0).
    Stopped(libc::c_int, libc::c_int),
}

fn tracee_wait(tid: i32) -> Result<TraceeWait> {
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer.
    let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
    if r == 0 {
        return Ok(TraceeWait::Nothing);
    }
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ECHILD) {
            return Ok(TraceeWait::Gone);
        }
        return Err(e).with_context(|| format!("waitpid({tid})"));
    }
    if libc::WIFSTOPPED(status) {
        Ok(TraceeWait::Stopped(libc::WSTOPSIG(status), status >> 16))
    } else {
        Ok(TraceeWait::Gone)
    }
}

fn ptrace_req(req: libc::c_uint, tid: i32, data: usize) -> std::io::Result<()> {
    // SAFETY: these requests (SEIZE, CONT, LISTEN, INTERRUPT, DETACH) take no pointer; `data`
    // is an option mask or a signal number passed as the pointer-sized argument.
    let r = unsafe {
        libc::ptrace(
            req,
            tid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            data as *mut libc::c_void,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn is_stop_signal(sig: libc::c_int) -> bool {
    matches!(
        sig,
        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
    )
}

/// Ends a stop of our tracee: a signal-delivery-stop delivers its signal, a group-stop
/// listens (so SIGCONT still works), anything else continues.
fn pass_stop(tid: i32, sig: libc::c_int, event: libc::c_int) {
    let _ = if event == 0 {
        ptrace_req(libc::PTRACE_CONT, tid, sig as usize)
    } else if event == libc::PTRACE_EVENT_STOP && is_stop_signal(sig) {
        ptrace_req(libc::PTRACE_LISTEN, tid, 0)
    } else {
        ptrace_req(libc::PTRACE_CONT, tid, 0)
    };
}

/// Interrupts our tracee `tid` and waits for its stop. `Some(signal to pass on at detach)`
/// (0 for none: a signal-delivery-stop must not swallow its signal), or `None` if it is gone.
fn interrupt_and_wait(tid: i32) -> Result<Option<libc::c_int>> {
    match ptrace_req(libc::PTRACE_INTERRUPT, tid, 0) {
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None), // gone
        r => r.with_context(|| format!("PTRACE_INTERRUPT of {tid}"))?,
    }
    let deadline = std::time::Instant::now() + FOREIGN_DETACH_TIMEOUT;
    loop {
        match tracee_wait(tid)? {
            TraceeWait::Gone => return Ok(None),
            TraceeWait::Stopped(sig, event) => return Ok(Some(if event == 0 { sig } else { 0 })),
            TraceeWait::Nothing => {}
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "thread {tid} did not stop within {FOREIGN_DETACH_TIMEOUT:?} of PTRACE_INTERRUPT"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn foreign_detach(tid: i32) -> Result<()> {
    match interrupt_and_wait(tid)? {
        None => Ok(()),
        Some(deliver) => ptrace_req(libc::PTRACE_DETACH, tid, deliver as usize)
            .with_context(|| format!("PTRACE_DETACH of {tid}")),
    }
}

impl ForeignTracer {
    /// Seizes thread `tid` (no options: it keeps running) from a new thread of this process.
    pub fn seize(tid: i32) -> Result<ForeignTracer> {
        use std::sync::mpsc::{RecvTimeoutError, channel};
        let (ready_tx, ready_rx) = channel::<std::io::Result<i32>>();
        let (stop_tx, stop_rx) = channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("foreign-tracer-{tid}"))
            .spawn(move || -> Result<()> {
                if let Err(e) = ptrace_req(libc::PTRACE_SEIZE, tid, 0) {
                    let _ = ready_tx.send(Err(e));
                    return Ok(());
                }
                // SAFETY: gettid has no preconditions.
                let _ = ready_tx.send(Ok(unsafe { libc::gettid() }));
                // Until asked to let go (or the guard is dropped).
                while let Err(RecvTimeoutError::Timeout) =
                    stop_rx.recv_timeout(Duration::from_millis(5))
                {
                    match tracee_wait(tid)? {
                        TraceeWait::Gone => return Ok(()),
                        TraceeWait::Stopped(sig, event) => pass_stop(tid, sig, event),
                        TraceeWait::Nothing => {}
                    }
                }
                foreign_detach(tid)
            })
            .context("cannot start the foreign tracer thread")?;
        let mut tracer = ForeignTracer {
            tid,
            tracer_tid: 0,
            stop: Some(stop_tx),
            thread: Some(thread),
        };
        match ready_rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok(tracer_tid)) => {
                tracer.tracer_tid = tracer_tid;
                Ok(tracer)
            }
            Ok(Err(e)) => {
                tracer.stop = None;
                Err(e).with_context(|| format!("PTRACE_SEIZE of thread {tid}"))
            }
            Err(_) => bail!("the foreign tracer thread did not report within 5 s"),
        }
    }

    /// Detaches (interrupt, wait for the stop, detach) and reports how it went.
    pub fn release(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        drop(self.stop.take());
        match self.thread.take().map(|t| t.join()) {
            None => Ok(()),
            Some(Ok(r)) => r,
            Some(Err(_)) => bail!("the foreign tracer thread panicked"),
        }
    }
}

impl Drop for ForeignTracer {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            eprintln!(
                "harness: releasing the ptrace of thread {}: {e:#}",
                self.tid
            );
        }
    }
}

/// Byte offset of `u_debugreg[7]` (DR7) in the x86-64 `struct user` that `PTRACE_PEEKUSER`
/// reads (`offsetof(struct user, u_debugreg)` = 848).
const USER_DR7_OFFSET: usize = 848 + 7 * 8;

/// Reads thread `tid`'s DR7 as the kernel holds it: seizes it from a new thread of this
/// process, interrupts it, peeks DR7 and detaches (passing on a signal that arrived first).
/// The thread must not be traced by anyone else.
pub fn read_dr7(tid: i32) -> Result<u64> {
    std::thread::spawn(move || -> Result<u64> {
        ptrace_req(libc::PTRACE_SEIZE, tid, 0).with_context(|| format!("PTRACE_SEIZE of {tid}"))?;
        let Some(deliver) = interrupt_and_wait(tid)? else {
            bail!("thread {tid} exited before DR7 could be read");
        };
        // SAFETY: PEEKUSER reads a word of the stopped tracee's `struct user`; errno tells a
        // failure from a word equal to -1.
        let value = unsafe {
            *libc::__errno_location() = 0;
            libc::ptrace(
                libc::PTRACE_PEEKUSER,
                tid as libc::pid_t,
                USER_DR7_OFFSET as *mut libc::c_void,
                std::ptr::null_mut::<libc::c_void>(),
            )
        };
        let err = std::io::Error::last_os_error();
        let detached = ptrace_req(libc::PTRACE_DETACH, tid, deliver as usize);
        if value == -1 && err.raw_os_error().is_some_and(|e| e != 0) {
            return Err(err).with_context(|| format!("PTRACE_PEEKUSER(DR7) of {tid}"));
        }
        detached.with_context(|| format!("PTRACE_DETACH of {tid}"))?;
        Ok(value as u64)
    })
    .join()
    .map_err(|_| anyhow!("the DR7 reader thread panicked"))?
}

// ---------------------------------------------------------------------------------------------
// RPC helpers
// ---------------------------------------------------------------------------------------------

/// A process-wide 8-byte write watchpoint spec on `backend` (which attaches the process with
/// that backend if it is not attached yet; [`Backend::Unspecified`]: the daemon's default).
pub fn write_spec(backend: Backend, pid: i32, address: u64) -> WatchpointSpec {
    WatchpointSpec {
        pid,
        tids: Vec::new(),
        address,
        length: 8,
        access: Access::Write as i32,
        backend: backend as i32,
        ..Default::default()
    }
}

/// `Attach{pid, backend}` that must succeed; checks the process got that backend (unless
/// [`Backend::Unspecified`]).
pub async fn attach(client: &mut Client, pid: i32, backend: Backend) -> Result<AttachResponse> {
    let what = format!("Attach(pid {pid}, {backend:?})");
    let resp = rpc_ok(
        &what,
        client.attach(AttachRequest {
            pid,
            backend: backend as i32,
            ..Default::default()
        }),
    )
    .await?;
    let process = resp
        .process
        .as_ref()
        .ok_or_else(|| anyhow!("{what}: response has no process"))?;
    ensure!(
        backend == Backend::Unspecified || process.backend() == backend,
        "{what}: the process is attached with {:?}",
        process.backend()
    );
    Ok(resp)
}

/// `Resume{pid, tids}` that must succeed; returns the resumed tids, sorted.
pub async fn resume(client: &mut Client, pid: i32, tids: &[i32]) -> Result<Vec<i32>> {
    let mut resumed = rpc_ok(
        &format!("Resume(pid {pid}, tids {tids:?})"),
        client.resume(ResumeRequest {
            pid,
            tids: tids.to_vec(),
        }),
    )
    .await?
    .resumed;
    resumed.sort_unstable();
    Ok(resumed)
}

/// `(tid, state)` of every thread `ListThreads{pid}` lists.
pub async fn thread_states(client: &mut Client, pid: i32) -> Result<Vec<(i32, ThreadState)>> {
    Ok(list_threads(client, pid, false)
        .await?
        .threads
        .iter()
        .map(|t| (t.tid, t.state()))
        .collect())
}

/// `SetWatchpoint` that must succeed within [`RPC_TIMEOUT`].
pub async fn set_watchpoint(
    client: &mut Client,
    spec: WatchpointSpec,
) -> Result<SetWatchpointResponse> {
    set_watchpoint_within(client, spec, RPC_TIMEOUT).await
}

/// `SetWatchpoint` that must succeed within `timeout`.
pub async fn set_watchpoint_within(
    client: &mut Client,
    spec: WatchpointSpec,
    timeout: Duration,
) -> Result<SetWatchpointResponse> {
    let what = format!("SetWatchpoint({spec:?})");
    let spec_backend = spec.backend();
    let resp = tokio::time::timeout(
        timeout,
        client.set_watchpoint(SetWatchpointRequest { spec: Some(spec) }),
    )
    .await
    .map_err(|_| anyhow!("{what} timed out after {timeout:?}"))?
    .map_err(|s| anyhow!("{what} failed: {}", status_line(&s)))?
    .into_inner();
    let wp = resp
        .watchpoint
        .as_ref()
        .ok_or_else(|| anyhow!("{what}: response has no watchpoint"))?;
    ensure!(
        spec_backend == Backend::Unspecified || wp.backend() == spec_backend,
        "{what}: asked for {spec_backend:?}, but the watchpoint is held by {:?}",
        wp.backend()
    );
    Ok(resp)
}

/// Runs an RPC future with [`RPC_TIMEOUT`], keeping the status as the error.
pub async fn rpc<T>(
    fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<Result<T, Status>> {
    match tokio::time::timeout(RPC_TIMEOUT, fut).await {
        Ok(r) => Ok(r.map(tonic::Response::into_inner)),
        Err(_) => bail!("RPC timed out after {RPC_TIMEOUT:?}"),
    }
}

/// Runs an RPC that must succeed.
pub async fn rpc_ok<T>(
    what: &str,
    fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T> {
    rpc(fut)
        .await
        .with_context(|| what.to_string())?
        .map_err(|s| anyhow!("{what} failed: {}", status_line(&s)))
}

/// `code: message` of a status.
pub fn status_line(s: &Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

/// Checks that `result` is an error with `code` whose message is not empty and contains every
/// one of `needles` (case-insensitive). Returns the status.
pub fn expect_status<T: Debug>(
    what: &str,
    result: Result<T, Status>,
    code: Code,
    needles: &[&str],
) -> Result<Status> {
    let status = match result {
        Ok(v) => bail!("{what}: expected {code:?}, but it succeeded: {v:?}"),
        Err(s) => s,
    };
    ensure!(
        status.code() == code,
        "{what}: expected {code:?}, got {}",
        status_line(&status)
    );
    let msg = status.message().to_lowercase();
    ensure!(
        !msg.trim().is_empty(),
        "{what}: {code:?} with an empty message"
    );
    for needle in needles {
        ensure!(
            msg.contains(&needle.to_lowercase()),
            "{what}: message {:?} does not mention {needle:?}",
            status.message()
        );
    }
    Ok(status)
}

/// Every decimal number in `text` (used to check that an error message names a tid).
pub fn numbers_in(text: &str) -> Vec<i64> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// The 8-byte little-endian value of a hit, if it has 8 bytes.
pub fn hit_value_u64(hit: &Hit) -> Option<u64> {
    Some(u64::from_le_bytes(hit.value.as_slice().try_into().ok()?))
}

/// Checks one hit of watchpoint `wp`: its id, pid, address, length and access, a tid among
/// `tids` (when not empty), and a value of `length` bytes.
pub fn check_hit(hit: &Hit, wp: &Watchpoint, tids: &HashSet<i32>) -> Result<()> {
    let spec = wp
        .spec
        .as_ref()
        .ok_or_else(|| anyhow!("watchpoint {} has no spec", wp.id))?;
    let ok = hit.watchpoint_id == wp.id
        && hit.pid == spec.pid
        && hit.address == spec.address
        && hit.length == spec.length
        && hit.access == spec.access
        && hit.value.len() == spec.length as usize
        && hit.backend == wp.backend
        && (tids.is_empty() || tids.contains(&hit.tid));
    ensure!(
        ok,
        "unexpected hit {hit:?}: expected watchpoint {} pid {} address {:#x} length {} access \
         {:?}, backend {:?}, a value of {} bytes and a tid among {tids:?}",
        wp.id,
        spec.pid,
        spec.address,
        spec.length,
        spec.access(),
        wp.backend(),
        spec.length
    );
    Ok(())
}

/// Watchpoint ids in the OURS slots of a thread, in slot order.
pub fn ours(thread: &ThreadInfo) -> Vec<u64> {
    thread
        .slots
        .iter()
        .filter(|s| s.state == SlotState::Ours as i32)
        .map(|s| s.watchpoint_id)
        .collect()
}

/// Number of slots of a thread in `state`.
pub fn count_slots(thread: &ThreadInfo, state: SlotState) -> usize {
    thread
        .slots
        .iter()
        .filter(|s| s.state == state as i32)
        .count()
}

/// What the daemon holds, without counters that move on their own (hit counts, times), so that
/// two snapshots compare equal when no request changed anything.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// (id, spec, process_wide, armed_threads, backend) per watchpoint.
    pub watchpoints: Vec<(u64, Option<WatchpointSpec>, bool, u32, i32)>,
    /// (pid, backend, threads, watchpoints) per attached process.
    pub processes: Vec<(i32, i32, u32, u32)>,
    /// `ListThreads{pid}` of the given pid, `None` when it answers NotFound.
    pub threads: Option<ListThreadsResponse>,
}

/// Fails when `after` differs from `before`, showing the differing lines of both.
pub fn ensure_unchanged(what: &str, before: &Snapshot, after: &Snapshot) -> Result<()> {
    if before == after {
        return Ok(());
    }
    let b = format!("{before:#?}");
    let a = format!("{after:#?}");
    let (bl, al): (Vec<&str>, Vec<&str>) = (b.lines().collect(), a.lines().collect());
    let mut diff = Vec::new();
    let mut context = "";
    for i in 0..bl.len().max(al.len()) {
        let (x, y) = (bl.get(i).copied(), al.get(i).copied());
        if let Some(line) = x.filter(|l| l.trim_start().starts_with("tid:")) {
            context = line.trim();
        }
        if x != y {
            diff.push(format!(
                "  line {i} ({context}):\n    before {}\n    after  {}",
                x.unwrap_or("<none>").trim(),
                y.unwrap_or("<none>").trim()
            ));
        }
        if diff.len() >= 12 {
            diff.push("  ...".into());
            break;
        }
    }
    bail!(
        "{what} changed the daemon's state (ListWatchpoints/ListThreads):\n{}",
        diff.join("\n")
    )
}

impl Snapshot {
    /// The same snapshot with FOREIGN slots shown as FREE: for comparisons that allow the
    /// daemon to learn, from a refusal, that the kernel gave a slot to someone else.
    pub fn foreign_as_free(&self) -> Snapshot {
        self.shown_as_free(&[SlotState::Foreign])
    }

    /// The same snapshot with slots in any of `states` shown as FREE (e.g. FOREIGN and
    /// RETAINED: what the kernel holds after a refused ptrace arm that was rolled back).
    pub fn shown_as_free(&self, states: &[SlotState]) -> Snapshot {
        let mut s = self.clone();
        for slot in s
            .threads
            .iter_mut()
            .flat_map(|l| l.threads.iter_mut())
            .flat_map(|t| t.slots.iter_mut())
        {
            if states.iter().any(|&st| slot.state == st as i32) {
                slot.state = SlotState::Free as i32;
            }
        }
        s
    }
}

/// Takes a [`Snapshot`] of all watchpoints and of `pid`'s threads.
pub async fn snapshot(client: &mut Client, pid: i32) -> Result<Snapshot> {
    let list = rpc_ok(
        "ListWatchpoints",
        client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
    )
    .await?;
    let mut watchpoints: Vec<_> = list
        .watchpoints
        .into_iter()
        .map(|w| (w.id, w.spec, w.process_wide, w.armed_threads, w.backend))
        .collect();
    watchpoints.sort_by_key(|w| w.0);
    let mut processes: Vec<_> = list
        .processes
        .into_iter()
        .map(|p| (p.pid, p.backend, p.threads, p.watchpoints))
        .collect();
    processes.sort_unstable();
    let threads = match rpc(client.list_threads(ListThreadsRequest {
        pid,
        tids: vec![],
        probe: false,
    }))
    .await?
    {
        Ok(t) => Some(t),
        Err(s) if s.code() == Code::NotFound => None,
        Err(s) => bail!("ListThreads({pid}) failed: {}", status_line(&s)),
    };
    Ok(Snapshot {
        watchpoints,
        processes,
        threads,
    })
}

/// `ListThreads{pid}` that must succeed.
pub async fn list_threads(
    client: &mut Client,
    pid: i32,
    probe: bool,
) -> Result<ListThreadsResponse> {
    rpc_ok(
        &format!("ListThreads(pid {pid}, probe {probe})"),
        client.list_threads(ListThreadsRequest {
            pid,
            tids: vec![],
            probe,
        }),
    )
    .await
}

/// Polls `f` every 50 ms until it yields `Some`, or fails after `timeout` with the last
/// observation.
pub async fn poll_until<T>(
    timeout: Duration,
    what: &str,
    mut f: impl AsyncFnMut() -> Result<Result<T, String>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        match f().await? {
            Ok(v) => return Ok(v),
            Err(last) => {
                if Instant::now() >= deadline {
                    bail!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The event stream
// ---------------------------------------------------------------------------------------------

/// A `StreamEvents` subscription with timeouts and bookkeeping (counts, drops, recent events
/// for error messages).
pub struct EventStream {
    stream: Streaming<StreamEventsResponse>,
    /// Events received so far.
    pub received: u64,
    /// Hits received so far.
    pub hits: u64,
    /// Sum of `EventsDropped.count` received so far.
    pub dropped: u64,
    recent: VecDeque<String>,
}

impl EventStream {
    /// Subscribes; once this returns the daemon has the subscription, so events caused after
    /// it will be delivered.
    pub async fn subscribe(client: &mut Client, req: StreamEventsRequest) -> Result<EventStream> {
        let what = format!("StreamEvents({req:?})");
        let stream = rpc_ok(&what, client.stream_events(req)).await?;
        Ok(EventStream {
            stream,
            received: 0,
            hits: 0,
            dropped: 0,
            recent: VecDeque::new(),
        })
    }

    /// Subscribes to every event of `pid`.
    pub async fn for_pid(client: &mut Client, pid: i32) -> Result<EventStream> {
        Self::subscribe(
            client,
            StreamEventsRequest {
                pid,
                watchpoint_ids: vec![],
                hits_only: false,
            },
        )
        .await
    }

    /// The next event, or `None` once `deadline` has passed. Errors when the stream ends.
    pub async fn next_before(&mut self, deadline: Instant) -> Result<Option<Event>> {
        loop {
            let msg = match tokio::time::timeout_at(deadline, self.stream.message()).await {
                Err(_) => return Ok(None),
                Ok(Ok(Some(msg))) => msg,
                Ok(Ok(None)) => bail!("the event stream ended ({})", self.summary()),
                Ok(Err(s)) => bail!(
                    "the event stream failed: {} ({})",
                    status_line(&s),
                    self.summary()
                ),
            };
            self.received += 1;
            let Some(event) = msg.event else { continue };
            match &event {
                Event::Hit(_) => self.hits += 1,
                Event::Dropped(d) => self.dropped += d.count,
                _ => {}
            }
            if self.recent.len() == 8 {
                self.recent.pop_front();
            }
            let mut text = format!("{event:?}");
            text.truncate(300);
            self.recent.push_back(text);
            return Ok(Some(event));
        }
    }

    /// Feeds every event to `f` until it returns `Some` (or an error); fails after `timeout`.
    pub async fn wait_for<T>(
        &mut self,
        timeout: Duration,
        what: &str,
        mut f: impl FnMut(&Event) -> Result<Option<T>>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            let Some(event) = self.next_before(deadline).await? else {
                bail!(
                    "timed out after {timeout:?} waiting for {what} ({})",
                    self.summary()
                );
            };
            if let Some(v) = f(&event).with_context(|| format!("while waiting for {what}"))? {
                return Ok(v);
            }
        }
    }

    /// The next `n` hits (other events are skipped); fails after `timeout`.
    pub async fn collect_hits(&mut self, n: usize, timeout: Duration) -> Result<Vec<Hit>> {
        let mut hits = Vec::with_capacity(n);
        if n == 0 {
            return Ok(hits);
        }
        self.wait_for(timeout, &format!("{n} hits"), |ev| {
            if let Event::Hit(h) = ev {
                hits.push(h.clone());
            }
            Ok((hits.len() >= n).then_some(()))
        })
        .await?;
        Ok(hits)
    }

    /// Every event that arrives during `period`.
    pub async fn drain_for(&mut self, period: Duration) -> Result<Vec<Event>> {
        let deadline = Instant::now() + period;
        let mut events = Vec::new();
        while let Some(ev) = self.next_before(deadline).await? {
            events.push(ev);
        }
        Ok(events)
    }

    /// Counts and the last few events, for error messages.
    pub fn summary(&self) -> String {
        format!(
            "{} events received ({} hits, {} reported dropped); last: [{}]",
            self.received,
            self.hits,
            self.dropped,
            self.recent.iter().cloned().collect::<Vec<_>>().join(", ")
        )
    }
}

/// Reads the next `n` hits of `stream` within `timeout`.
pub async fn collect_hits(
    stream: &mut EventStream,
    n: usize,
    timeout: Duration,
) -> Result<Vec<Hit>> {
    stream.collect_hits(n, timeout).await
}

// ---------------------------------------------------------------------------------------------
// Running wpd-probe
// ---------------------------------------------------------------------------------------------

/// A running `wpd-probe` (see its doc): reads its lines, ends it by closing its stdin, kills it
/// on drop.
pub struct Probe {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Probe {
    /// Starts `wpd-probe args`, as user `uid` (group = uid) when given.
    pub async fn start(uid: Option<u32>, args: &[&str]) -> Result<Probe> {
        use tokio::io::AsyncBufReadExt;
        let bin = find_bin("wpd-probe")?;
        let mut cmd = tokio::process::Command::new(&bin);
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        let mut child = cmd
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting wpd-probe {args:?}"))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        Ok(Probe {
            child,
            lines: tokio::io::BufReader::new(stdout).lines(),
        })
    }

    /// The next line it prints (within `timeout`).
    pub async fn line(&mut self, timeout: Duration) -> Result<String> {
        let line = tokio::time::timeout(timeout, self.lines.next_line())
            .await
            .map_err(|_| anyhow!("wpd-probe printed nothing within {timeout:?}"))??;
        match line {
            Some(l) => Ok(l),
            None => {
                let st = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
                bail!("wpd-probe ended without a line ({st:?})")
            }
        }
    }

    /// Closes its stdin (the probe then finishes), returns its last line, and waits for it.
    pub async fn finish(mut self, timeout: Duration) -> Result<String> {
        drop(self.child.stdin.take());
        let line = self.line(timeout).await?;
        let _ = tokio::time::timeout(timeout, self.child.wait()).await;
        Ok(line)
    }
}

/// The number after `key` in a probe's line (`OPEN 8` → 8).
pub fn probe_number(line: &str, key: &str) -> Result<u64> {
    let mut words = line.split_whitespace();
    while let Some(w) = words.next() {
        if w == key {
            return words
                .next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| anyhow!("no number after {key} in {line:?}"));
        }
    }
    bail!("no {key} in {line:?}")
}

// ---------------------------------------------------------------------------------------------
// Running wpctl
// ---------------------------------------------------------------------------------------------

/// What a finished command printed and how it exited.
#[derive(Debug, Clone)]
pub struct CmdOutput {
    /// Exit code (`None` if killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `wpctl` with `args`; kills it and fails after `timeout`.
pub async fn run_wpctl(args: &[&str], timeout: Duration) -> Result<CmdOutput> {
    run_wpctl_as(None, args, timeout).await
}

/// Like [`run_wpctl`], as user `uid` (group = uid) when given.
pub async fn run_wpctl_as(uid: Option<u32>, args: &[&str], timeout: Duration) -> Result<CmdOutput> {
    let bin = bin_path("wpctl");
    let mut cmd = tokio::process::Command::new(&bin);
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .map_err(|_| {
            anyhow!(
                "`wpctl {}` did not finish within {timeout:?}",
                args.join(" ")
            )
        })?
        .with_context(|| format!("running {}", bin.display()))?;
    Ok(CmdOutput {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}
