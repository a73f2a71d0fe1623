//! The C targets of the symbol tests (`tests/c/`, built by `build.rs` into
//! [`CTARGETS`]): `CTarget` runs one variant and drives it through stdin;
//! [`line_of`] finds the source line a hit must name.

use crate::*;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Where `build.rs` put the C targets.
pub const CTARGETS: &str = env!("WPD_CTARGETS");

/// The sources, to find `LINE:<tag>` markers in.
const SOURCES: &[(&str, &str)] = &[
    ("ctarget.c", include_str!("../c/ctarget.c")),
    ("ctlib.c", include_str!("../c/ctlib.c")),
    ("ctplug.c", include_str!("../c/ctplug.c")),
    ("objects.c", include_str!("../c/objects.c")),
    ("breaks.c", include_str!("../c/breaks.c")),
    ("plugin.c", include_str!("../c/plugin.c")),
    ("plugins.c", include_str!("../c/plugins.c")),
    ("typed.c", include_str!("../c/typed.c")),
    ("stepping.c", include_str!("../c/stepping.c")),
];

/// The file and 1-based line of the `LINE:<tag>` marker in the C sources.
pub fn line_of(tag: &str) -> (&'static str, u32) {
    let marker = format!("LINE:{tag} ");
    let marker_end = format!("LINE:{tag} */");
    for (file, text) in SOURCES {
        for (i, l) in text.lines().enumerate() {
            if l.contains(&marker) || l.contains(&marker_end) {
                return (file, i as u32 + 1);
            }
        }
    }
    panic!("no LINE:{tag} marker in tests/c")
}

/// A path of a built C target (`ct-pie`, `ct-nopie`, ...).
pub fn ctarget_path(variant: &str) -> PathBuf {
    PathBuf::from(CTARGETS).join(variant)
}

/// A running C target. Dropping it SIGKILLs and reaps it.
pub struct CTarget {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    status: Option<ExitStatus>,
    /// Process id.
    pub pid: i32,
    /// The variant run.
    pub variant: String,
    /// Addresses from the last READY line (`counter`, `stats`, `errors`,
    /// `flag2`, `lib`, ...).
    pub addrs: HashMap<String, u64>,
}

impl CTarget {
    /// Starts `variant` and waits for its READY line.
    pub async fn start(variant: &str) -> Result<CTarget> {
        Self::start_path(&ctarget_path(variant), variant).await
    }

    /// Starts the C target at `path` (a link to or copy of a variant, e.g. under a name of
    /// the test's own), called `label` in messages, and waits for its READY line.
    pub async fn start_path(path: &Path, label: &str) -> Result<CTarget> {
        Self::spawn_path(path, label, None).await
    }

    /// Like [`CTarget::start_path`], running as user `uid` (group = uid).
    pub async fn start_path_as(path: &Path, label: &str, uid: u32) -> Result<CTarget> {
        Self::spawn_path(path, label, Some(uid)).await
    }

    async fn spawn_path(path: &Path, label: &str, uid: Option<u32>) -> Result<CTarget> {
        let variant = label;
        let path = path.to_path_buf();
        let mut cmd = Command::new(&path);
        if let Some(uid) = uid {
            use std::os::unix::process::CommandExt as _;
            cmd.uid(uid).gid(uid);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        guard_child(&mut cmd);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", path.display()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout is piped");
        let lines = read_lines(stdout, "ctarget-stdout")?;
        let mut t = CTarget {
            child,
            stdin,
            lines,
            status: None,
            pid: 0,
            variant: variant.into(),
            addrs: HashMap::new(),
        };
        t.read_ready().await?;
        Ok(t)
    }

    async fn read_line(&mut self, timeout: Duration) -> Result<String> {
        match tokio::time::timeout_at(Instant::now() + timeout, self.lines.recv()).await {
            Ok(Some(line)) => Ok(line),
            Ok(None) => {
                let st =
                    wait_child(&mut self.child, &mut self.status, Duration::from_secs(2)).await;
                bail!(
                    "{} closed its stdout ({})",
                    self.variant,
                    st.map(|s| describe_status(&s))
                        .unwrap_or_else(|| "still running".into())
                )
            }
            Err(_) => bail!("no line from {} within {timeout:?}", self.variant),
        }
    }

    async fn read_ready(&mut self) -> Result<()> {
        let line = self
            .read_line(TARGET_READY_TIMEOUT)
            .await
            .with_context(|| format!("waiting for {}'s READY line", self.variant))?;
        ensure!(line.starts_with("READY "), "expected READY, got {line:?}");
        self.pid = field(&line, "pid")?;
        self.addrs.clear();
        for word in line.split_whitespace().skip(2) {
            if let Some((k, v)) = word.split_once('=') {
                let a = u64::from_str_radix(v.trim_start_matches("0x"), 16)
                    .with_context(|| format!("bad address in {word:?}"))?;
                self.addrs.insert(k.to_string(), a);
            }
        }
        Ok(())
    }

    /// How the target ended, if it has (without waiting).
    pub fn try_status(&mut self) -> Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self.child.try_wait()?;
        }
        Ok(self.status)
    }

    /// The 8 bytes at the address READY printed for `name`, read from the
    /// target's memory now (`/proc/PID/mem`), as a little-endian i64.
    pub fn read_i64(&self, name: &str) -> Result<i64> {
        use std::os::unix::fs::FileExt;
        let mem = std::fs::File::open(format!("/proc/{}/mem", self.pid))?;
        let mut b = [0u8; 8];
        mem.read_exact_at(&mut b, self.addr(name))?;
        Ok(i64::from_le_bytes(b))
    }

    /// Waits until the variable `name` changes from the value it has now (the target's
    /// spinners store to `counter` without pause), 10 s at most: a thread that is stopped,
    /// stuck or dead never changes it, while a loaded machine may keep a running one off the
    /// CPUs for longer than any short sleep.
    pub async fn changes(&self, name: &str) -> Result<()> {
        let from = self.read_i64(name)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.read_i64(name)? == from {
            ensure!(
                Instant::now() < deadline,
                "`{name}` stayed at {from} for 10 s: its writers do not run"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// The address READY printed for `name`.
    pub fn addr(&self, name: &str) -> u64 {
        *self
            .addrs
            .get(name)
            .unwrap_or_else(|| panic!("no {name}= in the READY line: {:?}", self.addrs))
    }

    /// Sends one command and returns its reply line; `ERR` replies fail.
    pub async fn cmd(&mut self, command: &str) -> Result<String> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("stdin is closed"))?;
        writeln!(stdin, "{command}")
            .and_then(|()| stdin.flush())
            .with_context(|| format!("sending {command:?}"))?;
        let reply = self
            .read_line(TARGET_CMD_TIMEOUT)
            .await
            .with_context(|| format!("waiting for the reply to {command:?}"))?;
        ensure!(
            !reply.starts_with("ERR"),
            "{} refused {command:?}: {reply}",
            self.variant
        );
        Ok(reply)
    }

    /// Sends one command without waiting for its reply (read it with
    /// [`CTarget::reply`]): for a command whose thread will be held.
    pub fn send(&mut self, command: &str) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("stdin is closed"))?;
        writeln!(stdin, "{command}")
            .and_then(|()| stdin.flush())
            .with_context(|| format!("sending {command:?}"))
    }

    /// The next reply line, within `timeout` (`None` when none came).
    pub async fn reply(&mut self, timeout: Duration) -> Result<Option<String>> {
        match tokio::time::timeout(timeout, self.lines.recv()).await {
            Ok(Some(line)) => Ok(Some(line)),
            Ok(None) => bail!("{} closed its stdout", self.variant),
            Err(_) => Ok(None),
        }
    }

    /// `exec`: the program executes itself again (same pid); waits for the
    /// new READY line (addresses updated).
    pub async fn exec(&mut self) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("stdin is closed"))?;
        writeln!(stdin, "exec")
            .and_then(|()| stdin.flush())
            .context("sending exec")?;
        self.read_ready().await
    }

    /// The `0x…` value of `key=` in a reply (`DLOPENED plug=0x…`).
    pub fn reply_addr(reply: &str, key: &str) -> Result<u64> {
        let v: String = field(reply, key)?;
        u64::from_str_radix(v.trim_start_matches("0x"), 16)
            .with_context(|| format!("bad {key}= in {reply:?}"))
    }
}

impl Drop for CTarget {
    fn drop(&mut self) {
        self.stdin = None;
        stop_child_blocking(&mut self.child, &mut self.status, false);
    }
}
