//! The accept loops of the Unix socket and TCP: each connection
//! identified and admitted under its limits before a byte of HTTP/2 is
//! read, and accepting that survives running out of file descriptors (a
//! spare fd, freed to accept and close what cannot be served; a backoff).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::mpsc;

use super::{Budget, Conn, ConnLimits, PeerInfo, Registry};
use crate::authz::{self, Caller};
use crate::rpc::authority::AuthorityFix;

/// A spare fd, freed to accept (and close) a connection when the daemon
/// is out of fds.
struct Spare(Option<OwnedFd>);

impl Spare {
    fn new() -> Self {
        Spare(open_devnull())
    }

    /// Frees the spare fd, runs `f` (an accept), and takes the fd again.
    fn with_room<T>(&mut self, f: impl FnOnce() -> T) -> T {
        self.0 = None;
        let r = f();
        self.0 = open_devnull();
        r
    }
}

fn open_devnull() -> Option<OwnedFd> {
    // SAFETY: opening /dev/null; the fd is owned below.
    let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    // SAFETY: a fresh fd.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

fn out_of_fds(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Backoff of the accept loop after running out of fds.
struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MOST: Duration = Duration::from_secs(1);

    fn new() -> Self {
        Backoff(Duration::ZERO)
    }

    async fn wait(&mut self) {
        self.0 = (self.0 * 2).clamp(Self::FIRST, Self::MOST);
        tokio::time::sleep(self.0).await;
    }

    fn reset(&mut self) {
        self.0 = Duration::ZERO;
    }
}

/// Accepts on the Unix socket; yields admitted connections with their
/// caller.
pub fn unix_incoming(
    listener: UnixListener,
    limits: ConnLimits,
    registry: Arc<Registry>,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<Conn<AuthorityFix<UnixStream>>>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut spare = Spare::new();
        let mut backoff = Backoff::new();
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                r = listener.accept() => r,
            };
            let stream = match accepted {
                Ok((s, _)) => {
                    backoff.reset();
                    s
                }
                Err(e) if out_of_fds(&e) => {
                    registry.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("accept: {e}: closing one connection, backing off");
                    spare.with_room(|| {
                        // SAFETY: accept4 on the listening socket; the new
                        // fd, if any, is closed at once.
                        let fd = unsafe {
                            libc::accept4(
                                listener.as_raw_fd(),
                                std::ptr::null_mut(),
                                std::ptr::null_mut(),
                                libc::SOCK_CLOEXEC,
                            )
                        };
                        if fd >= 0 {
                            // SAFETY: the fd accept4 just returned.
                            drop(unsafe { OwnedFd::from_raw_fd(fd) });
                        }
                    });
                    backoff.wait().await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    backoff.wait().await;
                    continue;
                }
            };
            let caller = identify(&stream);
            let budget = Budget::Uid(caller.uid);
            let conn = match registry.admit(budget, caller.privileged, &limits) {
                Ok(c) => c,
                Err(limit) => {
                    registry.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(uid = caller.uid, limit, "connection refused: limit reached");
                    continue;
                }
            };
            let info = PeerInfo {
                caller: Some(caller),
                remote: None,
                conn,
            };
            if tx
                .send(Ok(Conn::new(AuthorityFix::new(stream), info, limits.idle)))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// The caller on a Unix stream: SO_PEERCRED, and SO_PEERPIDFD to read the
/// peer's real ids and capabilities safely.
fn identify(stream: &UnixStream) -> Caller {
    let Ok(cred) = stream.peer_cred() else {
        // No credentials: nobody in particular, with no rights.
        return Caller::unprivileged(u32::MAX, u32::MAX, None);
    };
    let pidfd = authz::peer_pidfd(stream);
    Caller::from_peer(cred.uid(), cred.gid(), cred.pid(), pidfd.as_ref())
}

/// Accepts on TCP; every connection counts against the shared TCP budget.
pub fn tcp_incoming(
    listener: TcpListener,
    limits: ConnLimits,
    registry: Arc<Registry>,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<Conn<TcpStream>>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut spare = Spare::new();
        let mut backoff = Backoff::new();
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                r = listener.accept() => r,
            };
            let (stream, remote) = match accepted {
                Ok(s) => {
                    backoff.reset();
                    s
                }
                Err(e) if out_of_fds(&e) => {
                    registry.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("accept: {e}: closing one connection, backing off");
                    spare.with_room(|| {
                        // SAFETY: as in `unix_incoming`.
                        let fd = unsafe {
                            libc::accept4(
                                listener.as_raw_fd(),
                                std::ptr::null_mut(),
                                std::ptr::null_mut(),
                                libc::SOCK_CLOEXEC,
                            )
                        };
                        if fd >= 0 {
                            // SAFETY: the fd accept4 just returned.
                            drop(unsafe { OwnedFd::from_raw_fd(fd) });
                        }
                    });
                    backoff.wait().await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    backoff.wait().await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let conn = match registry.admit(Budget::Pending, false, &limits) {
                Ok(c) => c,
                Err(limit) => {
                    registry.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%remote, limit, "connection refused: limit reached");
                    continue;
                }
            };
            let info = PeerInfo {
                caller: None,
                remote: Some(remote),
                conn,
            };
            if tx
                .send(Ok(Conn::new(stream, info, limits.idle)))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
