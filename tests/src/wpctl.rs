//! Running `wpctl`.

use crate::*;
use std::fmt::Debug;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};

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
