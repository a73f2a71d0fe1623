//! Connections: the accept loops of the Unix socket and TCP, who each
//! connection belongs to, per-caller connection limits with a reserve for
//! privileged callers, an idle timeout, and accepting that survives running
//! out of file descriptors.
//!
//! Limits are decided at accept time, before a byte of HTTP/2 is read: a
//! connection over its caller's limit is closed at once. On the Unix socket
//! the caller is the peer's uid (SO_PEERCRED). On TCP the token decides who
//! calls, and only once a request arrives, so a TCP connection starts in a
//! small budget of its own ([`Budget::Pending`]) and moves to the TCP
//! budget with its first request bearing the token ([`AuthLayer`]): until
//! then it may send nothing else but the unary health check (what
//! orchestrators' probes send, without a token; it answers at once and
//! names nothing): no health watch, no reflection, both streams that never
//! go idle. It is closed [`PREAUTH_TIMEOUT`] after it was accepted, and when
//! the pending budget is full the oldest pending connection is closed to
//! make room. So connections that never authenticate cannot lock token
//! holders out.
//!
//! Running out of fds (EMFILE/ENFILE) must not turn the accept loop into a
//! busy loop, nor keep a privileged caller out: the loop keeps one spare fd,
//! frees it to accept and close the connection it cannot serve, and backs
//! off (10 ms doubling to 1 s) until an accept succeeds again. perf events
//! leave the daemon [`FD_HEADROOM`] fds for its control plane
//! (`backend::perf::fd_room`).
//!
//! Rooms: this file (limits, the registry of connections, a connection's
//! state and its stream), `accept.rs` (the accept loops), `layers.rs` (the
//! tower layers marking a connection busy and admitting TCP connections
//! at their first request with the token).

mod accept;
mod layers;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

pub use accept::{tcp_incoming, unix_incoming};
pub use layers::{Active, ActiveBody, ActiveLayer, Auth, AuthLayer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

use crate::authz::Caller;

/// File descriptors the perf backend leaves free for connections, the
/// state files and the daemon's own needs.
pub const FD_HEADROOM: u64 = 256;

/// Connection limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections one unprivileged caller (uid, or all of TCP) may have open.
    pub per_caller: usize,
    /// Connections open at once, all unprivileged callers together.
    pub total: usize,
    /// Connections beyond `total` that only privileged callers may use, so
    /// that root's health check and `wpctl` get in whatever others do.
    pub privileged_reserve: usize,
    /// A connection with no request or stream open is closed after this long
    /// without a byte from its peer.
    pub idle: Duration,
    /// HTTP/2 streams (requests, event subscriptions) open at once on one
    /// connection (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub streams: u32,
    /// TCP connections open at once that have not yet sent a request with
    /// the token (the oldest is closed to admit a new one).
    pub pending: usize,
}

/// How long a TCP connection may stay open without a request bearing the
/// token.
pub const PREAUTH_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            per_caller: 32,
            total: 512,
            privileged_reserve: 64,
            idle: Duration::from_secs(300),
            streams: 64,
            pending: 16,
        }
    }
}

/// Who a connection counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Budget {
    /// A local user (peer uid on the Unix socket).
    Uid(u32),
    /// Every TCP peer that has presented the token, together (callers are
    /// told apart by token only).
    Tcp,
    /// TCP connections that have not presented the token yet.
    Pending,
}

/// Open connections, by budget, and counters.
#[derive(Debug, Default)]
pub struct Registry {
    open: Mutex<HashMap<Budget, usize>>,
    /// Unprivileged connections open.
    unprivileged: AtomicUsize,
    /// Every connection open.
    total: AtomicUsize,
    /// Connections refused at accept (over a limit, or out of fds).
    refused: AtomicU64,
    /// Connections closed by the idle timeout.
    idled: AtomicU64,
    /// Connections closed since the allocator was last asked to trim.
    closed_since_trim: AtomicUsize,
    next_id: AtomicU64,
    /// Connections in [`Budget::Pending`], oldest first (weak: a closed one
    /// is skipped).
    pending: Mutex<std::collections::VecDeque<std::sync::Weak<ConnState>>>,
    /// Pending connections closed without authenticating (evicted or timed
    /// out).
    preauth_closed: AtomicU64,
}

impl Registry {
    /// Connections open now.
    pub fn open(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// Connections refused at accept so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections closed for idleness so far.
    pub fn idled(&self) -> u64 {
        self.idled.load(Ordering::Relaxed)
    }

    /// TCP connections closed because they sent no request with the token
    /// in time, or to make room for a newer one.
    pub fn preauth_closed(&self) -> u64 {
        self.preauth_closed.load(Ordering::Relaxed)
    }

    /// Closes the oldest pending connection that is still open; false if
    /// there is none.
    fn evict_oldest_pending(&self) -> bool {
        let mut q = self.pending.lock().unwrap();
        while let Some(w) = q.pop_front() {
            if let Some(c) = w.upgrade()
                && !c.authenticated.load(Ordering::Acquire)
                && !c.evicted.swap(true, Ordering::AcqRel)
            {
                self.preauth_closed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    conn = c.id,
                    "closing a connection that has not authenticated"
                );
                c.wake();
                return true;
            }
        }
        false
    }

    /// Admits a connection of `budget` or says which limit refuses it.
    fn admit(
        self: &Arc<Self>,
        budget: Budget,
        privileged: bool,
        limits: &ConnLimits,
    ) -> Result<Arc<ConnState>, &'static str> {
        let mut open = self.open.lock().unwrap();
        if budget == Budget::Pending && open.get(&budget).copied().unwrap_or(0) >= limits.pending {
            // The oldest goes. An evicted connection counts until its task
            // sees the flag, so the pending budget may be exceeded briefly;
            // the new one is refused only when none could be evicted.
            drop(open);
            if !self.evict_oldest_pending() {
                return Err("connections waiting to authenticate");
            }
            open = self.open.lock().unwrap();
        }
        let mine = open.get(&budget).copied().unwrap_or(0);
        let total = self.total.load(Ordering::Relaxed);
        if privileged {
            if total >= limits.total + limits.privileged_reserve {
                return Err("connections (including the privileged reserve)");
            }
        } else {
            if budget != Budget::Pending && mine >= limits.per_caller {
                return Err("connections per caller");
            }
            if self.unprivileged.load(Ordering::Relaxed) >= limits.total {
                return Err("connections");
            }
            self.unprivileged.fetch_add(1, Ordering::Relaxed);
        }
        *open.entry(budget).or_default() += 1;
        self.total.fetch_add(1, Ordering::Relaxed);
        drop(open);
        let now = now_ms();
        let conn = Arc::new(ConnState {
            id: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            budget: Mutex::new(budget),
            privileged,
            active: AtomicUsize::new(0),
            last_ms: AtomicU64::new(now),
            accepted_ms: now,
            authenticated: AtomicBool::new(budget != Budget::Pending),
            evicted: AtomicBool::new(false),
            waker: Mutex::new(None),
            registry: self.clone(),
        });
        if budget == Budget::Pending {
            let mut q = self.pending.lock().unwrap();
            q.retain(|w| w.strong_count() > 0);
            q.push_back(Arc::downgrade(&conn));
        }
        Ok(conn)
    }

    /// Moves `conn` from the pending budget to the TCP one (its request
    /// bore the token), or says which limit refuses it.
    fn promote(&self, conn: &ConnState, limits_per_caller: usize) -> Result<(), &'static str> {
        let mut open = self.open.lock().unwrap();
        let mut budget = conn.budget.lock().unwrap();
        if *budget != Budget::Pending {
            return Ok(());
        }
        if open.get(&Budget::Tcp).copied().unwrap_or(0) >= limits_per_caller {
            return Err("connections per caller");
        }
        if let Some(n) = open.get_mut(&Budget::Pending) {
            *n = n.saturating_sub(1);
        }
        *open.entry(Budget::Tcp).or_default() += 1;
        *budget = Budget::Tcp;
        conn.authenticated.store(true, Ordering::Release);
        Ok(())
    }

    fn release(&self, budget: Budget, privileged: bool) {
        {
            let mut open = self.open.lock().unwrap();
            if let Some(n) = open.get_mut(&budget) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    open.remove(&budget);
                }
            }
        }
        if !privileged {
            self.unprivileged.fetch_sub(1, Ordering::Relaxed);
        }
        let left = self.total.fetch_sub(1, Ordering::Relaxed) - 1;
        // What a burst of connections allocated (HTTP/2 buffers, stream
        // state) is freed when they close, but glibc keeps the pages: give
        // them back once the burst is over.
        let closed = self.closed_since_trim.fetch_add(1, Ordering::Relaxed) + 1;
        if closed >= TRIM_AFTER_CLOSED || (left == 0 && closed >= 8) {
            self.closed_since_trim.store(0, Ordering::Relaxed);
            trim_soon();
        }
    }
}

/// Closed connections after which the allocator is asked to return memory.
const TRIM_AFTER_CLOSED: usize = 64;

fn trim_soon() {
    if let Ok(h) = tokio::runtime::Handle::try_current() {
        h.spawn_blocking(|| {
            #[cfg(target_env = "gnu")]
            // SAFETY: malloc_trim only releases free memory of glibc's heap.
            unsafe {
                libc::malloc_trim(0);
            }
        });
    }
}

fn now_ms() -> u64 {
    crate::clock::monotonic_ns() / 1_000_000
}

/// One open connection: what counts against its budget until it closes,
/// and whether it is in use.
#[derive(Debug)]
pub struct ConnState {
    /// Daemon-wide connection number (for logs).
    pub id: u64,
    /// What it counts against (changes once, when a pending TCP connection
    /// authenticates).
    budget: Mutex<Budget>,
    /// Admitted from the privileged reserve.
    pub privileged: bool,
    /// Requests and streams in flight.
    active: AtomicUsize,
    /// Last activity (ms on the monotonic clock): a byte read, or a request
    /// starting or ending.
    last_ms: AtomicU64,
    /// When it was accepted (ms on the monotonic clock).
    accepted_ms: u64,
    /// A request with the token was seen (always true off TCP).
    authenticated: AtomicBool,
    /// Closed to make room for a newer pending connection.
    evicted: AtomicBool,
    /// The connection's reader, woken to see `evicted`.
    waker: Mutex<Option<std::task::Waker>>,
    registry: Arc<Registry>,
}

impl ConnState {
    fn touch(&self) {
        self.last_ms.store(now_ms(), Ordering::Relaxed);
    }

    fn wake(&self) {
        if let Some(w) = self.waker.lock().unwrap().take() {
            w.wake();
        }
    }

    /// What the connection counts against now.
    pub fn budget(&self) -> Budget {
        *self.budget.lock().unwrap()
    }

    /// Whether a request with the token was seen on it (always true off
    /// TCP).
    pub fn authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Acquire)
    }

    /// Its request bore the token: it leaves the pending budget for the TCP
    /// one (refused when that is full).
    pub fn authenticate(&self, limits_per_caller: usize) -> Result<(), &'static str> {
        if self.authenticated() {
            return Ok(());
        }
        self.registry.promote(self, limits_per_caller)
    }

    /// Marks a request or stream in flight until the guard drops.
    pub fn busy(self: &Arc<Self>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::Relaxed);
        self.touch();
        ActiveGuard(self.clone())
    }
}

impl Drop for ConnState {
    fn drop(&mut self) {
        self.registry.release(self.budget(), self.privileged);
    }
}

/// A request or stream in flight on a connection (see [`ConnState::busy`]).
#[derive(Debug)]
pub struct ActiveGuard(Arc<ConnState>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a request learns about its connection (tonic puts it in the
/// request's extensions).
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The caller on the Unix socket, identified once at accept; `None` on
    /// TCP, where the token decides.
    pub caller: Option<Caller>,
    /// Why the caller on the Unix socket could not be identified (the
    /// daemon out of file descriptors): every request is refused with it,
    /// rather than served as another caller's.
    pub unidentified: Option<String>,
    /// The TCP peer.
    pub remote: Option<SocketAddr>,
    /// The connection.
    pub conn: Arc<ConnState>,
}

/// An accepted connection: the stream, its peer, and its idle timer.
pub struct Conn<S> {
    io: S,
    info: PeerInfo,
    idle: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// The timer's clock and [`now_ms`] at the same moment: deadlines are
    /// computed from the last activity, not from "now", so that a timer
    /// reset at every poll does not move away.
    epoch: (tokio::time::Instant, u64),
}

impl<S> std::fmt::Debug for Conn<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("id", &self.info.conn.id)
            .finish()
    }
}

impl<S> Conn<S> {
    /// A connection made in the same process (an in-process client over
    /// `tokio::io::duplex`, as the RPC tests use): `caller` is who calls on
    /// it (`None`: nobody in particular, so the token decides, as on TCP).
    /// Counted and limited like an accepted one.
    pub fn in_process(
        io: S,
        caller: Option<Caller>,
        registry: &Arc<Registry>,
        limits: &ConnLimits,
    ) -> Result<Self, &'static str> {
        let budget = caller
            .as_ref()
            .map_or(Budget::Pending, |c| Budget::Uid(c.uid));
        let privileged = caller.as_ref().is_some_and(|c| c.privileged);
        let conn = registry.admit(budget, privileged, limits)?;
        Ok(Conn::new(
            io,
            PeerInfo {
                caller,
                unidentified: None,
                remote: None,
                conn,
            },
            limits.idle,
        ))
    }

    fn new(io: S, info: PeerInfo, idle: Duration) -> Self {
        Conn {
            io,
            info,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            epoch: (tokio::time::Instant::now(), now_ms()),
        }
    }

    /// Whether the connection must close: evicted, not authenticated within
    /// [`PREAUTH_TIMEOUT`] (however busy), or idle for longer than allowed
    /// (no request or stream in flight and nothing read for `idle`).
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Option<&'static str> {
        let c = self.info.conn.clone();
        let idle_ms = self.idle.as_millis() as u64;
        let preauth_ms = PREAUTH_TIMEOUT.as_millis() as u64;
        *c.waker.lock().unwrap() = Some(cx.waker().clone());
        loop {
            if c.evicted.load(Ordering::Acquire) {
                return Some("evicted");
            }
            let pending = !c.authenticated();
            if pending && now_ms() >= c.accepted_ms + preauth_ms {
                c.registry.preauth_closed.fetch_add(1, Ordering::Relaxed);
                return Some("not authenticated in time");
            }
            let last = c.last_ms.load(Ordering::Relaxed);
            if c.active.load(Ordering::Relaxed) == 0 && now_ms() >= last + idle_ms {
                c.registry.idled.fetch_add(1, Ordering::Relaxed);
                return Some("idle");
            }
            // In use, or not idle long enough: look again when it could be.
            let from = if c.active.load(Ordering::Relaxed) > 0 {
                now_ms()
            } else {
                last
            };
            let mut due_ms = from + idle_ms;
            if pending {
                due_ms = due_ms.min(c.accepted_ms + preauth_ms);
            }
            let due = self.epoch.0 + Duration::from_millis(due_ms.saturating_sub(self.epoch.1));
            if self.timer.deadline() != due {
                self.timer.as_mut().reset(due);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return None;
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Conn<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.info.conn.touch();
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                if let Some(why) = self.poll_idle(cx) {
                    tracing::debug!(conn = self.info.conn.id, why, "closing a connection");
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why)));
                }
                Poll::Pending
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Conn<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<S> Connected for Conn<S> {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_per_caller_total_and_the_privileged_reserve() {
        let r = Arc::new(Registry::default());
        let limits = ConnLimits {
            per_caller: 2,
            total: 3,
            privileged_reserve: 1,
            ..ConnLimits::default()
        };
        let a1 = r.admit(Budget::Uid(1000), false, &limits).unwrap();
        let _a2 = r.admit(Budget::Uid(1000), false, &limits).unwrap();
        assert_eq!(
            r.admit(Budget::Uid(1000), false, &limits).unwrap_err(),
            "connections per caller"
        );
        let _b1 = r.admit(Budget::Uid(1001), false, &limits).unwrap();
        assert_eq!(
            r.admit(Budget::Uid(1002), false, &limits).unwrap_err(),
            "connections"
        );
        // Root gets in through the reserve, once.
        let root = r.admit(Budget::Uid(0), true, &limits).unwrap();
        assert!(r.admit(Budget::Uid(0), true, &limits).is_err());
        assert_eq!(r.open(), 4);
        drop(a1);
        drop(root);
        assert_eq!(r.open(), 2);
        let _a3 = r.admit(Budget::Uid(1000), false, &limits).unwrap();
        assert_eq!(r.open(), 3);
    }
}
