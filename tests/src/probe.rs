//! Running `wpd-probe`, the tests' hostile or unprivileged client.

use crate::*;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

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
