//! The daemon's file-descriptor budget, shared by every backend: the fds
//! opened for callers (perf events, breakpoints, uprobes and their BPF
//! programs and maps) counted, the room they leave under `RLIMIT_NOFILE`
//! for everything else (connections above all, and the `/proc` reads that
//! identify a caller), and growing the fd table in one step.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::WpdError;

/// The daemon's soft `RLIMIT_NOFILE` (unlimited reads as `u64::MAX`).
pub fn nofile_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(u64::MAX, |(soft, _)| soft)
}

/// How many fds the daemon has open now (`/proc/self/fd`, less the one
/// reading it): read only on the way out of a refused request.
pub fn open_fd_count() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| (d.count() as u64).saturating_sub(1))
}

/// Whether an error number says the process or the system is out of fds.
pub fn is_out_of_fds(e: nix::errno::Errno) -> bool {
    matches!(e, nix::errno::Errno::EMFILE | nix::errno::Errno::ENFILE)
}

/// The fds opened for callers and what may still be opened.
#[derive(Debug, Default)]
pub struct FdBudget {
    /// Fds open for callers (events, uprobes, programs, maps).
    open: AtomicU64,
    /// Fds the backends hold for good (the perf collectors, one per CPU).
    fixed: AtomicU64,
    /// Highest fd number the process's fd table is known to hold (it never
    /// shrinks); see [`FdBudget::reserve`].
    room: AtomicU64,
    /// Fds the callers' fds leave free under `RLIMIT_NOFILE`; see
    /// [`FdBudget::set_headroom`].
    headroom: AtomicU64,
    /// The limit in place of `RLIMIT_NOFILE` (unit tests).
    limit: Option<u64>,
}

impl FdBudget {
    /// A budget leaving `headroom` fds free.
    pub fn new(headroom: u64) -> Arc<FdBudget> {
        let b = FdBudget::default();
        b.set_headroom(headroom);
        Arc::new(b)
    }

    /// A budget under `limit` in place of `RLIMIT_NOFILE` (tests).
    #[cfg(test)]
    pub fn limited(limit: u64, headroom: u64) -> Arc<FdBudget> {
        let b = FdBudget {
            limit: Some(limit),
            ..FdBudget::default()
        };
        b.set_headroom(headroom);
        Arc::new(b)
    }

    fn limit(&self) -> u64 {
        self.limit.unwrap_or_else(nofile_limit)
    }

    /// Fds open for callers now.
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// `n` fds were opened for callers.
    pub fn opened(&self, n: usize) {
        self.open.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// `n` fds opened for callers are being closed.
    pub fn closed(&self, n: usize) {
        self.open.fetch_sub(n as u64, Ordering::Relaxed);
    }

    /// Counts `fd`, just opened for a caller, until it is dropped.
    pub fn adopt(self: &Arc<Self>, fd: OwnedFd) -> CountedFd {
        CountedFd {
            fd,
            _count: self.count(1),
        }
    }

    /// Counts `n` fds, just opened for a caller and kept elsewhere, until
    /// the count is dropped.
    pub fn count(self: &Arc<Self>, n: usize) -> FdCount {
        self.opened(n);
        FdCount {
            n,
            budget: self.clone(),
        }
    }

    /// Fds held for good by a backend (the perf collectors).
    pub fn set_fixed(&self, n: usize) {
        self.fixed.store(n as u64, Ordering::Relaxed);
    }

    /// Whether `more` fds fit beside those open for callers and the fixed
    /// ones, leaving the headroom free, under the soft `RLIMIT_NOFILE`.
    /// The daemon's other fds are not counted: the headroom is for them,
    /// and the kernel's EMFILE stays the final word.
    pub fn fits(&self, more: usize) -> bool {
        (self.open() + self.fixed.load(Ordering::Relaxed))
            .saturating_add(more as u64)
            .saturating_add(self.headroom())
            <= self.limit()
    }

    /// Fds only root's requests may take: a quarter of what callers may
    /// hold (the limit less the headroom and the fixed fds), at most 4,096.
    /// One user's watchpoints and code events cannot take every fd.
    pub fn root_reserve(&self) -> u64 {
        let callers = self
            .limit()
            .saturating_sub(self.headroom())
            .saturating_sub(self.fixed.load(Ordering::Relaxed));
        (callers / 4).min(4096)
    }

    /// Whether `more` fds for a request of caller `uid` fit: any caller's
    /// leave the headroom free, and a caller other than root's also leave
    /// [`FdBudget::root_reserve`].
    pub fn fits_for(&self, uid: u32, more: usize) -> bool {
        let reserve = if uid == 0 { 0 } else { self.root_reserve() };
        self.fits(more.saturating_add(reserve as usize))
    }

    /// [`FdBudget::fits_for`], or the typed refusal of `what`, which needed
    /// `more` fds (`detail` says what they are).
    pub fn check_for(
        &self,
        uid: u32,
        what: &'static str,
        more: usize,
        detail: String,
    ) -> Result<(), WpdError> {
        if self.fits_for(uid, more) {
            return Ok(());
        }
        let detail = if uid != 0 && self.fits(more) {
            format!(
                "{detail}; the last {} are kept for root",
                self.root_reserve()
            )
        } else {
            detail
        };
        Err(self.refusal(what, more, detail, false))
    }

    /// The typed refusal of `what`, which needed `more` fds (`detail` says
    /// what they are); `by_kernel`: the kernel said EMFILE or ENFILE.
    /// Built after what the request opened was closed.
    pub fn refusal(
        &self,
        what: &'static str,
        more: usize,
        detail: String,
        by_kernel: bool,
    ) -> WpdError {
        WpdError::FdLimit {
            what,
            detail,
            needed: more as u64,
            open: open_fd_count(),
            limit: self.limit(),
            headroom: self.headroom(),
            by_kernel,
        }
    }

    /// Sets the fds callers' fds never take: the daemon's connections
    /// (their limits, so that clients can always reach a daemon whose
    /// watchpoints fill its fd limit) and its own files.
    pub fn set_headroom(&self, fds: u64) {
        self.headroom.store(fds, Ordering::Relaxed);
    }

    /// The headroom set by [`FdBudget::set_headroom`].
    pub fn headroom(&self) -> u64 {
        self.headroom.load(Ordering::Relaxed)
    }

    /// Grows the daemon's fd table at once so that `more` fds fit beside
    /// those open now (`src` is one of them, duplicated to reach the
    /// number). The kernel grows the table on demand by doubling, and every
    /// growth waits for an RCU grace period (`expand_files` →
    /// `synchronize_rcu`): 10-18 ms each on busy CPUs, five or six of them
    /// while attaching 1,000 threads on 2 CPUs, which was most of that
    /// attach's time (`perf record -e sched:sched_switch -g`). One growth
    /// instead, by duplicating a descriptor to the highest number needed
    /// and closing it. Best effort, within `RLIMIT_NOFILE`.
    pub fn reserve(&self, src: Option<RawFd>, more: usize) {
        // Fds are allocated lowest-first: the next ones follow the fds and
        // collectors already open, plus the daemon's own (sockets,
        // eventfds, files), generously counted.
        let mut want = self.open() + self.fixed.load(Ordering::Relaxed) + 256 + more as u64;
        let room = self.room.load(Ordering::Relaxed);
        if want <= room {
            return; // the common case: no syscall
        }
        want = want.min(self.limit().saturating_sub(1));
        if want <= room {
            return;
        }
        let Some(src) = src else {
            return;
        };
        // SAFETY: duplicates our own fd to the lowest free number >= `want`;
        // the copy is closed at once.
        let fd = unsafe { libc::fcntl(src, libc::F_DUPFD_CLOEXEC, want as libc::c_int) };
        if fd >= 0 {
            // SAFETY: `fd` was just created here and is not shared.
            unsafe { libc::close(fd) };
            self.room.fetch_max(fd as u64, Ordering::Relaxed);
        }
    }
}

/// Fds opened for a caller, counted in an [`FdBudget`] until dropped.
#[derive(Debug)]
pub struct FdCount {
    n: usize,
    budget: Arc<FdBudget>,
}

impl Drop for FdCount {
    fn drop(&mut self) {
        self.budget.closed(self.n);
    }
}

/// An fd opened for a caller, counted in its [`FdBudget`] until dropped
/// (closed first, then uncounted).
#[derive(Debug)]
pub struct CountedFd {
    fd: OwnedFd,
    _count: FdCount,
}

impl AsRawFd for CountedFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for CountedFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(limit: u64) -> FdBudget {
        FdBudget {
            limit: Some(limit),
            ..FdBudget::default()
        }
    }

    #[test]
    fn the_headroom_the_fixed_and_the_open_fds_count_against_the_limit() {
        let b = limited(100);
        b.set_fixed(2);
        assert!(b.fits(98));
        assert!(!b.fits(99));
        b.set_headroom(88);
        assert!(b.fits(10), "exactly at the limit");
        assert!(!b.fits(11));
        b.opened(5);
        assert!(!b.fits(10));
        assert!(matches!(
            b.check_for(0, "this watchpoint", 10, "10 breakpoints".into()),
            Err(WpdError::FdLimit {
                needed: 10,
                limit: 100,
                headroom: 88,
                by_kernel: false,
                ..
            })
        ));
        b.closed(5);
        assert!(b.fits(10));
    }

    #[test]
    fn a_quarter_of_what_callers_may_hold_is_roots() {
        let b = limited(1000);
        b.set_fixed(100);
        b.set_headroom(100);
        assert_eq!(b.root_reserve(), 200);
        assert!(b.fits_for(0, 800));
        assert!(b.fits_for(1000, 600));
        assert!(!b.fits_for(1000, 601));
        match b.check_for(1000, "this code event", 601, "601 uprobes".into()) {
            Err(WpdError::FdLimit { detail, .. }) => {
                assert_eq!(detail, "601 uprobes; the last 200 are kept for root")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(limited(1 << 20).root_reserve(), 4096);
    }

    #[test]
    fn a_counted_fd_is_counted_until_dropped() {
        let b = Arc::new(limited(100));
        let fd = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let counted = b.adopt(fd);
        assert_eq!(b.open(), 1);
        assert!(counted.as_raw_fd() >= 0);
        drop(counted);
        assert_eq!(b.open(), 0);
    }

    #[test]
    fn reserving_grows_the_table_once() {
        let b = limited(1 << 16);
        let f = std::fs::File::open("/dev/null").unwrap();
        let src = std::os::fd::AsRawFd::as_raw_fd(&f);
        b.reserve(Some(src), 100);
        let room = b.room.load(Ordering::Relaxed);
        assert!(room >= 100, "{room}");
        b.reserve(Some(src), 10);
        assert_eq!(b.room.load(Ordering::Relaxed), room, "already there");
    }
}
