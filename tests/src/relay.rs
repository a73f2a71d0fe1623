//! `Relay`: connections to the daemon made from inside another pid namespace.

use crate::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// `wpd-relay` run in the pid namespace of a given process (`nsenter --target PID --pid`),
/// listening on a socket of its own and relaying to a daemon's: on a connection through it the
/// daemon's peer (`SO_PEERCRED`) is a process of that namespace. Dropping it kills `nsenter`
/// and the relay.
pub struct Relay {
    child: Child,
    status: Option<ExitStatus>,
    inner: Option<i32>,
    dir: PathBuf,
    socket: PathBuf,
}

impl Relay {
    /// Starts a relay to `daemon_socket` in the pid namespace of process `ns_of`; returns once
    /// it listens.
    pub async fn start_in_pidns_of(ns_of: i32, daemon_socket: &Path) -> Result<Relay> {
        let bin = find_bin("wpd-relay")?;
        let dir = unique_temp_dir("wpd-relay")?;
        let socket = dir.join("relay.sock");
        let mut cmd = Command::new("nsenter");
        cmd.arg("--target")
            .arg(ns_of.to_string())
            .arg("--pid")
            .arg("--")
            .arg(&bin)
            .arg(&socket)
            .arg(daemon_socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        guard_child(&mut cmd);
        let child = cmd.spawn().context("cannot start nsenter")?;
        let mut relay = Relay {
            child,
            status: None,
            inner: None,
            dir,
            socket,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !relay.socket.exists() {
            if let Ok(Some(st)) = relay.child.try_wait() {
                relay.status = Some(st);
                bail!("wpd-relay exited: {st}");
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "wpd-relay did not listen on {} within 10 s",
                    relay.socket.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let pid = relay.child.id();
        relay.inner = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok());
        Ok(relay)
    }

    /// The relay's endpoint, as a [`Target`].
    pub fn target(&self) -> Target {
        Target::Unix(self.socket.clone())
    }

    /// `unix:<relay socket>`, as `wpctl --endpoint` takes it.
    pub fn endpoint(&self) -> String {
        format!("unix:{}", self.socket.display())
    }

    /// A new connection to the daemon through the relay.
    pub async fn client(&self) -> Result<Client> {
        wpd_proto::connect::client(&self.target())
            .await
            .with_context(|| format!("connecting to {}", self.endpoint()))
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(pid) = self.inner
            && self.status.is_none()
        {
            // SAFETY: kill(2) on the relay this guard started; its parent (nsenter) has not been
            // reaped, so the pid is not reused.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        stop_child_blocking(&mut self.child, &mut self.status, false);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
