//! Child process plumbing: guards that stop what the tests start, on every path.

use crate::*;
use std::fs;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use tokio::time::Instant;

/// Makes a child its own process group leader and kills it when the spawning thread dies.
pub(crate) fn guard_child(cmd: &mut Command) {
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
pub(crate) fn signal_child(child: &mut Child, status: &mut Option<ExitStatus>, sig: libc::c_int) {
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
pub(crate) async fn wait_child(
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
pub(crate) fn stop_child_blocking(child: &mut Child, status: &mut Option<ExitStatus>, term: bool) {
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
pub fn unique_temp_dir(prefix: &str) -> Result<PathBuf> {
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

/// A fresh, empty directory under the system temp dir ([`unique_temp_dir`]), removed with
/// everything in it when dropped: on every path out of a test, failures and panics included.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `<temp>/<prefix>-<pid>-<seq>-<nanos>`.
    pub fn new(prefix: &str) -> Result<TempDir> {
        Ok(TempDir(unique_temp_dir(prefix)?))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A thread that reads `stdout` line by line into a channel (ends with the
/// stream or when the receiver is dropped).
pub(crate) fn read_lines(
    stdout: std::process::ChildStdout,
    thread_name: &str,
) -> Result<tokio::sync::mpsc::UnboundedReceiver<String>> {
    use std::io::BufRead;
    let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name(thread_name.into())
        .spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        })
        .context("cannot start the stdout reader thread")?;
    Ok(lines)
}
