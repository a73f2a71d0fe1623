//! A daemon as a remote host runs it: `TcpDaemon`, listening on loopback TCP with TLS and a
//! bearer token, on a free port, with a private ptrace state file and state directory.

use crate::*;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use anyhow::{Context, Result, anyhow};
use wpd_proto::connect::Options;
use wpd_proto::v1::GetCapabilitiesRequest;

/// How many times [`TcpDaemon::start_tls`] tries another port when the one it picked was
/// taken before the daemon could bind it.
const PORT_ATTEMPTS: usize = 5;

/// A running `wpd --listen tcp://127.0.0.1:PORT` with `--token-file` and
/// `--tls-cert`/`--tls-key`. Dropping it sends SIGTERM, waits up to 5 s, then SIGKILLs, and
/// removes its temp dir; if the thread is panicking it first prints the log.
pub struct TcpDaemon {
    child: Child,
    status: Option<ExitStatus>,
    dir: PathBuf,
    port: u16,
    log_path: PathBuf,
    ca_pem: Vec<u8>,
    token: String,
}

impl TcpDaemon {
    /// Starts `wpd` on a free loopback port with the certificate `cert` and key `key` (PEM
    /// files; the certificate must name 127.0.0.1 and is also the CA clients trust) and the
    /// token in `token_file`, and waits until it answers `GetCapabilities` over TLS with the
    /// token.
    pub async fn start_tls(cert: &Path, key: &Path, token_file: &Path) -> Result<TcpDaemon> {
        let ca_pem = fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
        let token = fs::read_to_string(token_file)
            .with_context(|| format!("reading {}", token_file.display()))?
            .trim()
            .to_string();
        let mut last_err = anyhow!("no attempt made");
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let mut daemon = Self::spawn(port, cert, key, token_file, &ca_pem, &token)?;
            match daemon.wait_ready().await {
                Ok(()) => return Ok(daemon),
                Err(e) => {
                    let log = daemon.log();
                    let taken = daemon.status.is_some() && log.contains("in use");
                    last_err = e.context(format!("wpd did not become ready; its log:\n{log}"));
                    if !taken {
                        return Err(last_err);
                    }
                }
            }
        }
        Err(last_err)
    }

    fn spawn(
        port: u16,
        cert: &Path,
        key: &Path,
        token_file: &Path,
        ca_pem: &[u8],
        token: &str,
    ) -> Result<TcpDaemon> {
        let bin = bin_path("wpd");
        let dir = unique_temp_dir("wpd-tcp-e2e")?;
        let log_path = dir.join("wpd.log");
        let spawned = (|| -> Result<Child> {
            let log = File::create(&log_path)
                .with_context(|| format!("creating {}", log_path.display()))?;
            let mut cmd = Command::new(&bin);
            cmd.arg("--listen")
                .arg(format!("tcp://127.0.0.1:{port}"))
                .arg("--token-file")
                .arg(token_file)
                .arg("--tls-cert")
                .arg(cert)
                .arg("--tls-key")
                .arg(key)
                .env("NO_COLOR", "1")
                .env("WPD_STATE_FILE", dir.join("ptrace-armed"))
                .env("WPD_STATE_DIR", dir.join("state"))
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log);
            guard_child(&mut cmd);
            cmd.spawn()
                .with_context(|| format!("cannot start {}", bin.display()))
        })();
        match spawned {
            Ok(child) => Ok(TcpDaemon {
                child,
                status: None,
                dir,
                port,
                log_path,
                ca_pem: ca_pem.to_vec(),
                token: token.to_string(),
            }),
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let what = format!("wpd on port {}", self.port);
        let target = Target::Tls(self.endpoint());
        let opts = Options {
            tls_ca_pem: Some(self.ca_pem.clone()),
        };
        let request = self.request(GetCapabilitiesRequest {});
        wait_answering(&mut self.child, &mut self.status, &what, async || {
            let mut client = wpd_proto::connect::client_with(&target, &opts).await?;
            let mut r = tonic::Request::new(GetCapabilitiesRequest {});
            *r.metadata_mut() = request.metadata().clone();
            client.get_capabilities(r).await?;
            Ok(())
        })
        .await
    }

    /// `https://127.0.0.1:PORT`, as `wpctl --endpoint` takes it.
    pub fn endpoint(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A new TLS connection to the daemon (its certificate trusted); calls need
    /// [`TcpDaemon::request`] for the token.
    pub async fn client(&self) -> Result<Client> {
        let target = Target::Tls(self.endpoint());
        let opts = Options {
            tls_ca_pem: Some(self.ca_pem.clone()),
        };
        wpd_proto::connect::client_with(&target, &opts)
            .await
            .with_context(|| format!("connecting to {}", self.endpoint()))
    }

    /// A request carrying the daemon's token.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let value = format!("Bearer {}", self.token)
            .parse()
            .expect("the token is a valid header value");
        request.metadata_mut().insert("authorization", value);
        request
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

    /// Prints the daemon's log (its last 64 KiB) to stderr, headed by `why`.
    pub fn print_log(&self, why: &str) {
        let log = self.log();
        let mut start = log.len().saturating_sub(64 * 1024);
        while !log.is_char_boundary(start) {
            start += 1;
        }
        eprintln!(
            "----- wpd log ({why}; wpd pid {}, port {}) -----\n{}\n----- end of wpd log -----",
            self.pid(),
            self.port,
            &log[start..]
        );
    }
}

impl Drop for TcpDaemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_log("panicking");
        }
        stop_child_blocking(&mut self.child, &mut self.status, true);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A loopback port nobody listens on right now (the kernel's pick, released at once).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")
        .context("binding a loopback port")?
        .local_addr()?
        .port())
}
