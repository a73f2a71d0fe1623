//! A real NATS server with JetStream (Debian's `nats-server`) on a loopback port of its own,
//! for the export tests: started, killed and started again on the same port and store.

use crate::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// The `nats-server` binary, if installed (`scripts/setup` installs it).
pub fn nats_server_bin() -> Option<PathBuf> {
    ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// A running `nats-server -js`. Dropping it kills it and removes its store.
pub struct NatsServer {
    child: Option<Child>,
    status: Option<ExitStatus>,
    dir: PathBuf,
    port: u16,
    bin: PathBuf,
    /// Extra server configuration (authorization, TLS), if any.
    config: Option<String>,
}

impl NatsServer {
    /// Starts a server with JetStream on a free loopback port and waits until it accepts
    /// connections.
    pub async fn start() -> Result<NatsServer> {
        Self::start_with_config(None).await
    }

    /// Like [`NatsServer::start`], with extra lines of server configuration
    /// (`authorization { token: "..." }`, `tls { cert_file: ..., key_file:
    /// ... }`).
    pub async fn start_with_config(config: Option<&str>) -> Result<NatsServer> {
        let bin = nats_server_bin().context("nats-server is not installed")?;
        let dir = unique_temp_dir("wpd-nats")?;
        let mut s = NatsServer {
            child: None,
            status: None,
            dir,
            port: free_port()?,
            bin,
            config: config.map(str::to_string),
        };
        s.spawn().await?;
        Ok(s)
    }

    async fn spawn(&mut self) -> Result<()> {
        let log = std::fs::File::create(self.dir.join("nats.log"))?;
        let mut cmd = Command::new(&self.bin);
        if let Some(extra) = &self.config {
            let conf = self.dir.join("nats.conf");
            std::fs::write(&conf, extra)?;
            cmd.arg("-c").arg(conf);
        }
        cmd.args(["-js", "-a", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .arg("-sd")
            .arg(self.dir.join("store"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        guard_child(&mut cmd);
        self.child = Some(cmd.spawn().context("starting nats-server")?);
        self.status = None;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            if let Some(c) = &mut self.child
                && let Ok(Some(st)) = c.try_wait()
            {
                bail!(
                    "nats-server exited ({}): {}",
                    describe_status(&st),
                    self.log()
                );
            }
            if tokio::time::Instant::now() > deadline {
                bail!("nats-server did not listen within 20 s: {}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// SIGKILLs the server (its store stays) and reaps it.
    pub async fn kill(&mut self) -> Result<()> {
        if let Some(c) = &mut self.child {
            signal_child(c, &mut self.status, libc::SIGKILL);
            wait_child(c, &mut self.status, Duration::from_secs(10))
                .await
                .context("nats-server did not die")?;
        }
        self.child = None;
        Ok(())
    }

    /// Starts it again on the same port and store.
    pub async fn restart(&mut self) -> Result<()> {
        self.kill().await?;
        self.spawn().await
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("nats.log")).unwrap_or_default()
    }

    /// Its pid (while it runs).
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// Its store directory.
    pub fn store(&self) -> &Path {
        &self.dir
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            signal_child(c, &mut self.status, libc::SIGKILL);
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
