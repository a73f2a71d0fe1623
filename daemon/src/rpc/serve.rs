//! Serving the API: listeners (a Unix socket by default, TCP on request —
//! loopback, or any address with TLS — or the socket systemd passes), and
//! the watchpoint service with health and reflection behind the connection
//! limits, until told to stop (then a graceful shutdown with a grace
//! period); systemd's notifications. The daemon as a whole (the service,
//! the saved state, the metrics endpoint, the watchdog, the signals) is
//! started and wired by `startup.rs`.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use tonic::transport::Server;
use wpd_proto::v1::watchpoints_server::WatchpointsServer;

use crate::engine::Core;
use crate::rpc::Api;
use crate::rpc::conn::{self, ActiveLayer, ConnLimits, Registry};
use crate::rpc::metrics::{Metrics, RpcLayer};

/// Where to listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A Unix domain socket path.
    Unix(PathBuf),
    /// A TCP address (loopback only until TLS and tokens exist).
    Tcp(SocketAddr),
}

impl std::str::FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("unix: needs a path, e.g. unix:/run/wpd/wpd.sock".into());
            }
            Ok(Listen::Unix(p.into()))
        } else if let Some(a) = s.strip_prefix("tcp://") {
            let addr: SocketAddr = a
                .parse()
                .map_err(|e| format!("bad tcp address {a:?}: {e}"))?;
            Ok(Listen::Tcp(addr))
        } else if s.starts_with('/') {
            Ok(Listen::Unix(s.into()))
        } else {
            Err(format!(
                "listen address {s:?} must be unix:PATH or tcp://127.0.0.1:PORT"
            ))
        }
    }
}

/// How long open connections may take to finish after SIGTERM/SIGINT.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Default mode of the Unix socket: owner and group. Every call is
/// authorized against the caller's credentials (`authz`), so a wider mode
/// (`--socket-mode 0666`) lets users watch their own processes and nothing
/// else; the default keeps the door closed to those not in the group.
pub const SOCKET_MODE: u32 = 0o660;

fn prepare_socket(
    path: &Path,
    mode: u32,
    gid: Option<u32>,
) -> anyhow::Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("another daemon is already listening on {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    let l = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("binding {}", path.display()))?;
    if let Some(gid) = gid {
        std::os::unix::fs::chown(path, None, Some(gid))
            .with_context(|| format!("chown {}", path.display()))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(l)
}

/// Longest a unary request may take, from its headers to its answer: a
/// client that opens a request and never finishes sending it (a half-open
/// stream) holds memory until then. Arming or detaching 10,000 threads takes
/// a few seconds.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Refuses listener set-ups that would expose the daemon: TCP without a
/// token, a non-loopback address without TLS, TLS on a Unix socket.
pub fn check_listen(listen: &Listen, opts: &Options) -> Result<(), String> {
    match listen {
        Listen::Tcp(addr) => {
            if let Some(t) = &opts.token
                && t.len() > crate::rpc::auth::MAX_TOKEN_LEN
            {
                return Err(format!(
                    "the token is {} bytes; at most {} are accepted (an HTTP/2 header that long \
                     would be refused before any check)",
                    t.len(),
                    crate::rpc::auth::MAX_TOKEN_LEN
                ));
            }
            if opts.token.as_deref().is_none_or(str::is_empty) {
                return Err(
                    "TCP needs a token: start with --token-file PATH (callers send \
                     `authorization: Bearer <token>`); the Unix socket identifies callers by their \
                     credentials instead"
                        .into(),
                );
            }
            if !addr.ip().is_loopback() && opts.tls.is_none() {
                return Err(format!(
                    "refusing to listen on {addr} without TLS: only loopback addresses may be used \
                     without --tls-cert/--tls-key (the token would travel in clear)"
                ));
            }
            Ok(())
        }
        Listen::Unix(_) if opts.tls.is_some() => {
            Err("--tls-cert/--tls-key apply to TCP listeners only".into())
        }
        Listen::Unix(_) => Ok(()),
    }
}

/// How the gRPC server serves (the daemon's flags).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Token required from TCP callers (`authorization: Bearer ...`).
    pub token: Option<String>,
    /// Mode of the Unix socket (default [`SOCKET_MODE`]).
    pub socket_mode: Option<u32>,
    /// Group owning the Unix socket (by gid).
    pub socket_gid: Option<u32>,
    /// PEM certificate chain and key for TLS on TCP.
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
    /// Connection limits.
    pub conns: ConnLimits,
    /// Where to serve Prometheus metrics (`GET /metrics`); none by default.
    pub metrics_listen: Option<SocketAddr>,
}

/// How often the health service's answer is checked against the daemon's
/// state ([`Core::degraded`]).
const HEALTH_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Serves `api` on `bound` until `stop` completes (startup's signal
/// handling): the watchpoint service with health (NOT_SERVING while the
/// daemon cannot serve, `Core::degraded`) and reflection, behind the
/// connection limits, the metrics layer (`metrics`, when kept) and the
/// TCP token check. Returns once connections are closed, a grace period
/// after `stop` at most; the caller then shuts the core down.
pub async fn serve(
    bound: Bound,
    listen: &Listen,
    api: Api,
    registry: Arc<Registry>,
    metrics: Option<Arc<Metrics>>,
    opts: &Options,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let core = api.service().core().clone();
    let health_svc = health(core.clone()).await;
    let (reflection, reflection_v1alpha) = reflection()?;
    let auth_layer = conn::AuthLayer::new(api.auth_config(), &opts.conns);
    let svc = WatchpointsServer::new(api)
        .max_decoding_message_size(16 << 20)
        .max_encoding_message_size(64 << 20);
    let router = builder(opts)?
        .layer(ActiveLayer)
        .layer(RpcLayer::new(metrics))
        .layer(auth_layer)
        .add_service(health_svc)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(svc);
    let stream_core = core.clone();
    let shutdown = async move {
        stop.await;
        // Open event streams would keep the graceful shutdown waiting.
        stream_core.close_streams();
    };
    // A client that stops reading its stream would hold the graceful
    // shutdown forever: after the signal, connections get a grace period.
    let deadline = grace_over(core.bus.closed());
    let result = match bound {
        Bound::Unix { listener: l, guard } => {
            if let Listen::Unix(path) = listen {
                let how = if guard.is_some() {
                    ""
                } else {
                    " (socket from systemd)"
                };
                eprintln!("wpd: listening on unix:{}{how}", path.display());
            }
            let incoming = conn::unix_incoming(l, opts.conns, registry);
            let serve = router.serve_with_incoming_shutdown(incoming, shutdown);
            let r = tokio::select! { r = serve => r, _ = deadline => Ok(()) };
            drop(guard);
            r
        }
        Bound::Tcp(l) => {
            eprintln!("wpd: listening on tcp://{}", l.local_addr()?);
            let incoming = conn::tcp_incoming(l, opts.conns, registry);
            let serve = router.serve_with_incoming_shutdown(incoming, shutdown);
            tokio::select! { r = serve => r, _ = deadline => Ok(()) }
        }
    };
    result.context("serving")
}

/// Completes a grace period after the daemon began to stop (`closed`
/// turned true): connections still open then are closed.
async fn grace_over(mut closed: tokio::sync::watch::Receiver<bool>) {
    let _ = closed.wait_for(|c| *c).await;
    tokio::time::sleep(SHUTDOWN_GRACE).await;
    tracing::warn!("connections still open after {SHUTDOWN_GRACE:?}: closing them");
}

/// The health service, NOT_SERVING while the daemon cannot serve every
/// request (out of fds: `GetStats.degraded` says why), so that a probe or
/// an operator sees it.
async fn health(
    core: Arc<Core>,
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (health, health_svc) = tonic_health::server::health_reporter();
    health.set_serving::<WatchpointsServer<Api>>().await;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(HEALTH_CHECK);
        let mut was = None;
        loop {
            tick.tick().await;
            let now = core.degraded();
            if now.is_some() != was.is_some() {
                match &now {
                    Some(why) => {
                        tracing::warn!("health: NOT_SERVING: {why}");
                        health.set_not_serving::<WatchpointsServer<Api>>().await;
                    }
                    None => {
                        tracing::info!("health: SERVING again");
                        health.set_serving::<WatchpointsServer<Api>>().await;
                    }
                }
            }
            was = now;
        }
    });
    health_svc
}

/// Server reflection in both versions: v1, and v1alpha, which many
/// clients still speak (grpcio-reflection, older grpcurl).
fn reflection() -> anyhow::Result<(
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
)> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(wpd_proto::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((
        builder()
            .build_v1()
            .context("building reflection service")?,
        builder()
            .build_v1alpha()
            .context("building reflection service (v1alpha)")?,
    ))
}

/// The HTTP/2 server with its limits, and TLS when configured.
fn builder(opts: &Options) -> anyhow::Result<Server> {
    let mut builder = Server::builder()
        .max_concurrent_streams(opts.conns.streams)
        .http2_max_pending_accept_reset_streams(Some(64))
        .http2_max_header_list_size(32 << 10)
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(60)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
        .timeout(REQUEST_TIMEOUT);
    if let Some((cert, key)) = &opts.tls {
        let identity = tonic::transport::Identity::from_pem(cert, key);
        builder = builder
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .context("TLS configuration")?;
    }
    Ok(builder)
}

/// The listener, bound before anything else happens.
pub enum Bound {
    /// A Unix socket; `guard` removes its path when it is ours (not
    /// systemd's) however the daemon ends.
    Unix {
        listener: tokio::net::UnixListener,
        guard: Option<SocketGuard>,
    },
    /// A TCP listener.
    Tcp(tokio::net::TcpListener),
}

/// Removes the socket file the daemon created when dropped.
pub struct SocketGuard(PathBuf);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Binds `listen` (or takes the socket systemd passed): a second daemon on
/// the same socket or port is refused here, before it reads or writes
/// anything.
pub async fn bind(
    listen: &Listen,
    activated: Option<(tokio::net::UnixListener, PathBuf)>,
    opts: &Options,
) -> anyhow::Result<Bound> {
    Ok(match (listen, activated) {
        // systemd's socket is systemd's: its path, mode and owner stay.
        (_, Some((listener, _))) => Bound::Unix {
            listener,
            guard: None,
        },
        (Listen::Unix(path), None) => {
            let listener = prepare_socket(
                path,
                opts.socket_mode.unwrap_or(SOCKET_MODE),
                opts.socket_gid,
            )?;
            Bound::Unix {
                listener,
                guard: Some(SocketGuard(path.clone())),
            }
        }
        (Listen::Tcp(addr), None) => Bound::Tcp(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding {addr}"))?,
        ),
    })
}

/// The listening Unix socket systemd passed (socket activation:
/// `LISTEN_PID` names this process, `LISTEN_FDS` one socket), and its path.
pub fn activated_socket() -> anyhow::Result<Option<(tokio::net::UnixListener, PathBuf)>> {
    use nix::sys::socket::{SockType, getsockopt, sockopt};
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds: Vec<OwnedFd> = sd_notify::listen_fds()
        .context("reading LISTEN_FDS")?
        // SAFETY: systemd passed these descriptors to this process
        // (LISTEN_PID) for it to own; nothing else in it uses them.
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    if fds.len() > 1 {
        bail!(
            "systemd passed {} sockets: wpd serves one (one ListenStream= in wpd.socket)",
            fds.len()
        );
    }
    let Some(fd) = fds.pop() else {
        return Ok(None);
    };
    let listening = getsockopt(&fd, sockopt::AcceptConn).unwrap_or(false);
    if !listening || getsockopt(&fd, sockopt::SockType).ok() != Some(SockType::Stream) {
        bail!("the socket systemd passed is not a listening stream socket (ListenStream=)");
    }
    let l = std::os::unix::net::UnixListener::from(fd);
    let path = l
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_path_buf))
        .context(
            "the socket systemd passed is not a Unix socket with a path (ListenStream=PATH)",
        )?;
    l.set_nonblocking(true)?;
    Ok(Some((tokio::net::UnixListener::from_std(l)?, path)))
}

/// Tells systemd (`NOTIFY_SOCKET`, `Type=notify`) about the daemon; nothing
/// without it.
pub fn notify_systemd(state: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::warn!("cannot notify systemd: {e}");
    }
}

/// The API is served: `READY=1`, and with `WatchdogSec=` (`WATCHDOG_USEC`)
/// a ping every half interval from a task of the async runtime, so that a
/// wedged runtime stops pinging and systemd restarts the daemon.
pub fn systemd_ready() {
    notify_systemd(&[sd_notify::NotifyState::Ready]);
    if let Some(interval) = sd_notify::watchdog_enabled() {
        tokio::spawn(async move {
            let half = (interval / 2).max(std::time::Duration::from_millis(1));
            let mut tick = tokio::time::interval(half);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                notify_systemd(&[sd_notify::NotifyState::Watchdog]);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_parsing() {
        assert_eq!(
            "unix:/tmp/x.sock".parse::<Listen>(),
            Ok(Listen::Unix("/tmp/x.sock".into()))
        );
        assert_eq!(
            "/tmp/y".parse::<Listen>(),
            Ok(Listen::Unix("/tmp/y".into()))
        );
        assert!(matches!(
            "tcp://127.0.0.1:5000".parse::<Listen>(),
            Ok(Listen::Tcp(_))
        ));
        let wide: Listen = "tcp://0.0.0.0:5000".parse().unwrap();
        let local: Listen = "tcp://127.0.0.1:5000".parse().unwrap();
        let token = Options {
            token: Some("t".into()),
            ..Default::default()
        };
        let tls = Options {
            tls: Some((vec![], vec![])),
            ..token.clone()
        };
        assert!(
            check_listen(&local, &Options::default())
                .unwrap_err()
                .contains("needs a token")
        );
        assert!(check_listen(&local, &token).is_ok());
        assert!(
            check_listen(&wide, &token)
                .unwrap_err()
                .contains("without TLS")
        );
        assert!(check_listen(&wide, &tls).is_ok());
        let unix: Listen = "unix:/x".parse().unwrap();
        assert!(
            check_listen(&unix, &tls)
                .unwrap_err()
                .contains("TCP listeners only")
        );
        assert!("tcp://nonsense".parse::<Listen>().is_err());
        let long = Options {
            token: Some("x".repeat(crate::rpc::auth::MAX_TOKEN_LEN + 1)),
            ..Default::default()
        };
        assert!(
            check_listen(&local, &long)
                .unwrap_err()
                .contains("at most 4096")
        );
        assert!("unix:".parse::<Listen>().is_err());
        assert!("foo".parse::<Listen>().is_err());
    }
}
