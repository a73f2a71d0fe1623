//! The accept loops of the Unix socket and TCP: each connection
//! identified and admitted under its limits before a byte of HTTP/2 is
//! read, and accepting that survives running out of file descriptors (a
//! spare fd, freed to accept and close what cannot be served; a backoff).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::mpsc;

use super::{Budget, Conn, ConnLimits, PeerInfo, Registry};
use crate::authz::{self, Caller};
use crate::rpc::authority::AuthorityFix;

/// Spare fds, freed to accept (and close) a connection when the daemon
/// is out of fds, and to identify each caller (its `/proc` files and pid
/// namespace take a few fds at once).
struct Spare(Vec<OwnedFd>);

/// Fds kept spare: as many as identifying a caller opens at once.
const SPARE_FDS: usize = 8;

impl Spare {
    fn new() -> Self {
        Spare((0..SPARE_FDS).filter_map(|_| open_devnull()).collect())
    }

    /// Frees the spare fds, runs `f`, and takes the fds again.
    fn with_room<T>(&mut self, f: impl FnOnce() -> T) -> T {
        self.0.clear();
        let r = f();
        self.0 = (0..SPARE_FDS).filter_map(|_| open_devnull()).collect();
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

/// After a failed accept, backs off; out of fds, first accepts one waiting
/// connection into the spare fd's room and closes it, so its client hears
/// the refusal and the queue moves.
async fn accept_failed(
    e: io::Error,
    listener: RawFd,
    registry: &Registry,
    spare: &mut Spare,
    backoff: &mut Backoff,
) {
    if out_of_fds(&e) {
        registry.refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("accept: {e}: closing one connection, backing off");
        spare.with_room(|| {
            // SAFETY: accept4 on the listening socket; the new fd, if any,
            // is closed at once.
            let fd = unsafe {
                libc::accept4(
                    listener,
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
    } else {
        tracing::warn!("accept: {e}");
    }
    backoff.wait().await;
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
                Err(e) => {
                    accept_failed(e, listener.as_raw_fd(), &registry, &mut spare, &mut backoff)
                        .await;
                    continue;
                }
            };
            let (caller, unidentified) = spare.with_room(|| identify(&stream));
            if let Some(why) = &unidentified {
                tracing::warn!(uid = caller.uid, "connection not identified: {why}");
            }
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
                unidentified,
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
/// peer's real ids and capabilities safely. With why it could not be
/// identified when the daemon ran out of fds reading it (then it is no
/// one: every request is refused saying so, never served as an
/// unprivileged caller or one of another pid namespace).
fn identify(stream: &UnixStream) -> (Caller, Option<String>) {
    let Ok(cred) = stream.peer_cred() else {
        // No credentials: nobody in particular, with no rights.
        return (Caller::unprivileged(u32::MAX, u32::MAX, None), None);
    };
    let pidfd = authz::peer_pidfd(stream);
    let caller = Caller::from_peer(cred.uid(), cred.gid(), cred.pid(), pidfd.as_ref());
    // Its files read (and closed): if no fd can be opened now, the reads
    // failed for the daemon's want of fds, not for anything of the caller.
    let unidentified = match open_devnull() {
        Some(_) => None,
        None => {
            let e = io::Error::last_os_error();
            out_of_fds(&e).then(|| {
                format!(
                    "the daemon ran out of file descriptors ({e}) while identifying the caller \
                     (uid {})",
                    cred.uid()
                )
            })
        }
    };
    (caller, unidentified)
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
                Err(e) => {
                    accept_failed(e, listener.as_raw_fd(), &registry, &mut spare, &mut backoff)
                        .await;
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
                unidentified: None,
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
