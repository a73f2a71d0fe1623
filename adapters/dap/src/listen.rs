//! Serving DAP on a socket (`wpctl dap --listen`): one debug session per
//! connection, for the adapter's own user only.
//!
//! A session acts with the adapter's rights in the daemon (the daemon knows
//! the adapter's connection, not the IDE's), and a root adapter may attach
//! to and read any process. So every connection is identified before a byte
//! of it is read, and served only when it comes from the adapter's own uid:
//!
//! - `unix:PATH`: the socket file is made mode 0600, and the peer's uid is
//!   `SO_PEERCRED`'s.
//! - `tcp://HOST:PORT`: only loopback addresses (there is no TLS for DAP);
//!   the peer's uid is the owner of its socket, asked of the kernel
//!   ([`crate::peer`]). A peer that cannot be identified is refused.
//!
//! At most `max_sessions` sessions run at once. A refused connection is
//! answered (its first request gets an error response saying why; the
//! whole refusal takes at most a few seconds and reads a few KiB; at most
//! [`MAX_REFUSING`] are under way at once, beyond which a connection is
//! closed unanswered) and closed, and a log line says who was refused and
//! why.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Semaphore;

use crate::error::DapError;
use crate::{Daemon, peer, wire};

/// Sessions served at once unless `--max-sessions` says otherwise: an IDE
/// holds one per debug session; a few windows, not hundreds.
pub const DEFAULT_MAX_SESSIONS: usize = 8;

/// Refused connections being answered at once; more are closed unanswered.
pub const MAX_REFUSING: usize = 8;

/// How long a refused connection is kept, at most, to be answered.
const REFUSAL_TIME: Duration = Duration::from_secs(5);

/// Most bytes of a refused connection's first request.
const REFUSAL_MAX_BODY: usize = 16 << 10;

/// Most bytes read and dropped after a refusal, waiting for the peer to
/// close.
const REFUSAL_DRAIN: u64 = 64 << 10;

/// Where the adapter listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A loopback TCP address.
    Tcp(SocketAddr),
    /// A Unix socket at this path.
    Unix(PathBuf),
}

/// Why the adapter cannot listen.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Not an address the adapter understands.
    #[error("{0:?}: expected tcp://127.0.0.1:PORT, tcp://[::1]:PORT or unix:PATH")]
    Syntax(String),
    /// A TCP address other hosts (or other network namespaces) could reach.
    #[error(
        "{0}: not a loopback address. The adapter has no TLS and acts with its user's rights \
         (root's adapter may read any process), so it listens only where this host's users \
         reach it and checks who they are: use tcp://127.0.0.1:PORT or unix:PATH, and from \
         another host forward the Unix socket over SSH (ssh -L 4711:PATH HOST, then connect \
         the IDE to 127.0.0.1:4711)"
    )]
    NotLoopback(String),
    /// A Unix socket path where another adapter answers.
    #[error("{}: another process is listening there already", .0.display())]
    InUse(PathBuf),
    /// A Unix socket path that is something else.
    #[error("{}: exists and is not a socket (not replaced)", .0.display())]
    NotASocket(PathBuf),
    /// Binding or preparing the listener failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The failure.
        source: std::io::Error,
    },
}

impl std::str::FromStr for Endpoint {
    type Err = ListenError;

    fn from_str(s: &str) -> Result<Endpoint, ListenError> {
        if let Some(path) = s.strip_prefix("unix:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(ListenError::Syntax(s.into()));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        let Some(hostport) = s.strip_prefix("tcp://") else {
            return Err(ListenError::Syntax(s.into()));
        };
        let addr = match hostport.strip_prefix("localhost:") {
            Some(port) => port
                .parse()
                .map(|p| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p))
                .map_err(|_| ListenError::Syntax(s.into()))?,
            None => match hostport.parse::<SocketAddr>() {
                Ok(a) => a,
                // A host name: whatever it resolves to, it is not checked
                // to stay loopback.
                Err(_) if hostport.rsplit_once(':').is_some() => {
                    return Err(ListenError::NotLoopback(s.into()));
                }
                Err(_) => return Err(ListenError::Syntax(s.into())),
            },
        };
        if !addr.ip().is_loopback() {
            return Err(ListenError::NotLoopback(s.into()));
        }
        Ok(Endpoint::Tcp(addr))
    }
}

/// Settings of a listening adapter.
#[derive(Debug, Clone)]
pub struct Options {
    /// Sessions served at once; more connections are refused.
    pub max_sessions: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            max_sessions: DEFAULT_MAX_SESSIONS,
        }
    }
}

/// Serves DAP on `endpoint` until the listener fails: one session per
/// connection of the adapter's own uid. Prints where it listens on stderr
/// (the port, for port 0). A Unix socket file is removed when this future
/// ends or is dropped.
pub async fn serve(endpoint: &Endpoint, daemon: Daemon, opts: Options) -> Result<(), ListenError> {
    let gate = Gate {
        uid: peer::own_uid(),
        max_sessions: opts.max_sessions,
        sessions: Arc::new(Semaphore::new(opts.max_sessions)),
        refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
        daemon,
    };
    match endpoint {
        Endpoint::Tcp(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ListenError::Io {
                    what: format!("binding tcp://{addr}"),
                    source,
                })?;
            let bound = listener.local_addr().map_err(|source| ListenError::Io {
                what: "the bound address".into(),
                source,
            })?;
            eprintln!("wpctl dap: listening on tcp://{bound}");
            loop {
                let (sock, from) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        accept_failed(e).await;
                        continue;
                    }
                };
                let _ = sock.set_nodelay(true);
                // Asked while the peer's socket is surely open: it has just
                // connected, and nothing of it has been read.
                let uid = sock
                    .local_addr()
                    .map_err(peer::PeerError::Io)
                    .and_then(|local| peer::tcp_peer_uid(local, from))
                    .map_err(|e| e.to_string());
                gate.admit(sock, format!("tcp {from}"), uid);
            }
        }
        Endpoint::Unix(path) => {
            let (listener, _unlink) = bind_unix(path)?;
            eprintln!("wpctl dap: listening on unix:{}", path.display());
            loop {
                let (sock, _) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        accept_failed(e).await;
                        continue;
                    }
                };
                let (uid, who) = match sock.peer_cred() {
                    Ok(c) => (
                        Ok(c.uid()),
                        match c.pid() {
                            Some(pid) => format!("unix pid {pid}"),
                            None => "unix".to_string(),
                        },
                    ),
                    Err(e) => (Err(format!("SO_PEERCRED: {e}")), "unix".to_string()),
                };
                gate.admit(sock, who, uid);
            }
        }
    }
}

/// An accept that failed (out of fds, most likely): said, then a pause
/// instead of a busy loop.
async fn accept_failed(e: std::io::Error) {
    tracing::warn!("accepting a DAP connection failed: {e}");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Removes the socket file it names when dropped.
struct Unlink(PathBuf);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Binds a Unix socket at `path`, mode 0600: replaces a stale socket (one
/// nobody answers on), refuses a live one or anything that is not a socket.
fn bind_unix(path: &Path) -> Result<(tokio::net::UnixListener, Unlink), ListenError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let io = |what: String| move |source| ListenError::Io { what, source };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ListenError::InUse(path.into()));
            }
            std::fs::remove_file(path)
                .map_err(io(format!("removing the stale socket {}", path.display())))?;
        }
        Ok(_) => return Err(ListenError::NotASocket(path.into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(format!("{}", path.display()))(e)),
    }
    let listener = tokio::net::UnixListener::bind(path)
        .map_err(io(format!("binding unix:{}", path.display())))?;
    let unlink = Unlink(path.into());
    // Until this chmod the umask decides the mode; a peer that connects in
    // that moment is still refused by its uid.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io(format!("chmod 0600 {}", path.display())))?;
    Ok((listener, unlink))
}

/// Who may have a session, and how many at once.
struct Gate {
    /// The adapter's uid: the only one served.
    uid: u32,
    max_sessions: usize,
    sessions: Arc<Semaphore>,
    refusing: Arc<Semaphore>,
    daemon: Daemon,
}

impl Gate {
    /// Serves `sock` in a session of its own, or refuses it.
    fn admit<S>(&self, sock: S, who: String, uid: Result<u32, String>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let refusal = match uid {
            Err(why) => Some(DapError::PeerUnknown(why)),
            Ok(u) if u != self.uid => Some(DapError::NotYourAdapter {
                peer: u,
                adapter: self.uid,
            }),
            Ok(_) => None,
        };
        if let Some(e) = refusal {
            tracing::warn!("refused a DAP connection from {who}: {e}");
            self.refuse(sock, e);
            return;
        }
        let Ok(permit) = self.sessions.clone().try_acquire_owned() else {
            let e = DapError::TooManySessions(self.max_sessions);
            tracing::warn!("refused a DAP connection from {who}: {e}");
            self.refuse(sock, e);
            return;
        };
        tracing::info!("debug session from {who} started");
        let daemon = self.daemon.clone();
        tokio::spawn(async move {
            let (r, w) = tokio::io::split(sock);
            match crate::run(r, w, daemon).await {
                Ok(()) => tracing::info!("debug session from {who} ended"),
                Err(e) => tracing::warn!(
                    "debug session from {who} ended: {}",
                    wpd_proto::text::escape(&e.to_string())
                ),
            }
            drop(permit);
        });
    }

    /// Answers the first request of `sock` with `why`, then closes it; or
    /// closes it at once when [`MAX_REFUSING`] refusals are under way.
    fn refuse<S>(&self, sock: S, why: DapError)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Ok(permit) = self.refusing.clone().try_acquire_owned() else {
            return;
        };
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REFUSAL_TIME, answer_and_close(sock, why)).await;
            drop(permit);
        });
    }
}

/// A refused connection's end: its first request answered with `why`, then
/// a clean close (our side shut, what the peer still sends read and
/// dropped until it closes too, so that the answer is not lost to a reset).
async fn answer_and_close<S>(sock: S, why: DapError)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (r, mut w) = tokio::io::split(sock);
    let mut r = BufReader::new(r);
    if let Ok(req) = wire::read_message_within(&mut r, REFUSAL_MAX_BODY).await
        && req["type"] == "request"
    {
        let mut m = why.response(&req);
        m["seq"] = 1.into();
        let _ = wire::write_message(&mut w, &m).await;
    }
    let _ = w.shutdown().await;
    let mut sink = tokio::io::sink();
    let _ = tokio::io::copy(&mut (&mut r).take(REFUSAL_DRAIN), &mut sink).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_and_unix_addresses() {
        let ok = |s: &str| s.parse::<Endpoint>().unwrap();
        assert_eq!(
            ok("tcp://127.0.0.1:4711"),
            Endpoint::Tcp("127.0.0.1:4711".parse().unwrap())
        );
        assert_eq!(
            ok("tcp://localhost:0"),
            Endpoint::Tcp("127.0.0.1:0".parse().unwrap())
        );
        assert_eq!(
            ok("tcp://[::1]:4711"),
            Endpoint::Tcp("[::1]:4711".parse().unwrap())
        );
        assert_eq!(
            ok("tcp://127.1.2.3:1"),
            Endpoint::Tcp("127.1.2.3:1".parse().unwrap())
        );
        assert_eq!(
            ok("unix:/run/user/1000/dap.sock"),
            Endpoint::Unix("/run/user/1000/dap.sock".into())
        );
        for s in [
            "tcp://0.0.0.0:4711",
            "tcp://[::]:4711",
            "tcp://192.0.2.7:4711",
            "tcp://[::ffff:127.0.0.1]:4711",
            "tcp://example.org:4711",
        ] {
            let e = s.parse::<Endpoint>().unwrap_err();
            assert!(matches!(e, ListenError::NotLoopback(_)), "{s}: {e}");
            assert!(e.to_string().contains("ssh -L"), "{e}");
        }
        for s in ["127.0.0.1:4711", "tcp://127.0.0.1", "unix:", "http://x"] {
            assert!(
                matches!(s.parse::<Endpoint>(), Err(ListenError::Syntax(_))),
                "{s}"
            );
        }
    }

    #[test]
    fn a_unix_socket_is_private_and_a_live_or_foreign_path_is_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("wpd-dap-listen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("dap.sock");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (l, unlink) = bind_unix(&path).unwrap();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            assert!(matches!(bind_unix(&path), Err(ListenError::InUse(_))));
            // Stale: the file stays, nobody answers.
            drop(l);
            std::mem::forget(unlink);
            let (_l, unlink) = bind_unix(&path).unwrap();
            drop(unlink);
            assert!(!path.exists(), "removed when dropped");
        });
        std::fs::write(&path, "not a socket").unwrap();
        assert!(matches!(
            rt.block_on(async { bind_unix(&path).map(|_| ()) }),
            Err(ListenError::NotASocket(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
