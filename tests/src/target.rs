//! The target: `TargetProc`, the multi-threaded sample program the tests watch.

use crate::*;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use tokio::sync::mpsc;
use tokio::time::Instant;

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
    /// Started in another pid namespace: `pid` is its number there, not the child's here.
    in_pidns: bool,
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

    /// Starts `wpd-target` in the pid namespace of process `ns_of` (`nsenter --target ns_of
    /// --pid`): [`TargetProc::pid`] is its pid as that namespace numbers it (what it reports),
    /// and what reads `/proc/<pid>` here ([`TargetProc::tids`]) does not apply.
    pub async fn start_in_pidns_of(ns_of: i32, args: &[&str]) -> Result<TargetProc> {
        let bin = find_bin("wpd-target")?;
        let ns = ns_of.to_string();
        let mut full = vec!["--target", ns.as_str(), "--pid", "--"];
        let bin_str = bin
            .to_str()
            .ok_or_else(|| anyhow!("non-UTF-8 path {bin:?}"))?;
        full.push(bin_str);
        full.extend_from_slice(args);
        Self::spawn_cmd(Path::new("nsenter"), &full, None, true).await
    }

    /// Starts `wpd-target` through a launcher: `program args...` is a command line that ends by
    /// running a `wpd-target` whose stdin and stdout are the launcher's (e.g. `nsenter` into a
    /// booted system's namespaces, then `systemd-run --pipe`). [`TargetProc::pid`] is the pid
    /// the target reports, in its own pid namespace; what reads `/proc/<pid>` here
    /// ([`TargetProc::tids`]) and [`TargetProc::signal`] do not apply, and dropping the guard
    /// kills the launcher, the target seeing its stdin closed.
    pub async fn start_via(program: &Path, args: &[&str]) -> Result<TargetProc> {
        Self::spawn_cmd(program, args, None, true).await
    }

    /// The pid of the process the test started (`nsenter` for
    /// [`TargetProc::start_in_pidns_of`]).
    pub fn child_id(&self) -> u32 {
        self.child.id()
    }

    async fn spawn_bin(bin: &Path, args: &[&str], ids: Option<(u32, u32)>) -> Result<TargetProc> {
        Self::spawn_cmd(bin, args, ids, false).await
    }

    async fn spawn_cmd(
        bin: &Path,
        args: &[&str],
        ids: Option<(u32, u32)>,
        in_pidns: bool,
    ) -> Result<TargetProc> {
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
        let lines = read_lines(stdout, "wpd-target-stdout")?;
        let mut target = TargetProc {
            child,
            stdin,
            lines,
            owed: 0,
            status: None,
            pid: 0,
            vars: Vec::new(),
            threads: 0,
            in_pidns,
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
            self.in_pidns || pid == self.child.id() as i32,
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

/// The value after `key=` in a line of `key=value` words, parsed.
pub fn field<T: std::str::FromStr>(line: &str, key: &str) -> Result<T>
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
