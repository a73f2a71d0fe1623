//! The perf backend's file-descriptor budget: the event fds it holds, the
//! room it leaves under `RLIMIT_NOFILE` for everything else (connections
//! above all), and growing the fd table in one step.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// The event fds open and what may still be opened.
#[derive(Debug, Default)]
pub struct FdBudget {
    /// Event fds open (collectors excluded).
    open: AtomicU64,
    /// Highest fd number the process's fd table is known to hold (it never
    /// shrinks); see [`FdBudget::reserve`].
    room: AtomicU64,
    /// Fds events leave free under `RLIMIT_NOFILE`; see
    /// [`FdBudget::set_headroom`].
    headroom: AtomicU64,
}

impl FdBudget {
    /// Event fds open now.
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// `n` event fds were opened.
    pub fn opened(&self, n: usize) {
        self.open.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// `n` event fds are being closed by the caller.
    pub fn closed(&self, n: usize) {
        self.open.fetch_sub(n as u64, Ordering::Relaxed);
    }

    /// Whether `more` event fds fit beside the event fds and the `fixed`
    /// ones (collectors) open now, leaving the headroom free, under the
    /// soft `RLIMIT_NOFILE`. The daemon's other fds are not counted: the
    /// headroom is for them, and the kernel's EMFILE stays the final word.
    pub fn fits(&self, fixed: usize, more: usize) -> bool {
        (self.open() + fixed as u64)
            .saturating_add(more as u64)
            .saturating_add(self.headroom())
            <= nofile_limit()
    }

    /// Sets the fds events never take: the daemon's connections (their
    /// limits, so that clients can always reach a daemon whose watchpoints
    /// fill its fd limit) and its own files.
    pub fn set_headroom(&self, fds: u64) {
        self.headroom.store(fds, Ordering::Relaxed);
    }

    /// The headroom set by [`FdBudget::set_headroom`].
    pub fn headroom(&self) -> u64 {
        self.headroom.load(Ordering::Relaxed)
    }

    /// Grows the daemon's fd table at once so that `more` event fds fit
    /// beside those open now (and the `fixed` ones; `src` is one of them,
    /// duplicated to reach the number). The kernel grows the table on
    /// demand by doubling, and every growth waits for an RCU grace period
    /// (`expand_files` → `synchronize_rcu`): 10-18 ms each on busy CPUs,
    /// five or six of them while attaching 1,000 threads on 2 CPUs, which
    /// was most of that attach's time (`perf record -e sched:sched_switch
    /// -g`). One growth instead, by duplicating a descriptor to the highest
    /// number needed and closing it. Best effort, within `RLIMIT_NOFILE`.
    pub fn reserve(&self, src: Option<RawFd>, fixed: usize, more: usize) {
        // Fds are allocated lowest-first: the next ones follow the event fds
        // and collectors already open, plus the daemon's own (sockets,
        // eventfds, files), generously counted.
        let mut want = self.open() + fixed as u64 + 256 + more as u64;
        let room = self.room.load(Ordering::Relaxed);
        if want <= room {
            return; // the common case: no syscall
        }
        want = want.min(nofile_limit().saturating_sub(1));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headroom_and_the_open_fds_count_against_the_limit() {
        let b = FdBudget::default();
        let limit = nofile_limit();
        if limit == u64::MAX {
            return; // unlimited: nothing to run out of
        }
        assert!(b.fits(2, 10));
        b.set_headroom(limit - 12);
        assert!(b.fits(2, 10), "exactly at the limit");
        assert!(!b.fits(2, 11));
        b.opened(5);
        assert!(!b.fits(2, 10));
        b.closed(5);
        assert!(b.fits(2, 10));
    }

    #[test]
    fn reserving_grows_the_table_once() {
        let b = FdBudget::default();
        let f = std::fs::File::open("/dev/null").unwrap();
        let src = std::os::fd::AsRawFd::as_raw_fd(&f);
        b.reserve(Some(src), 1, 100);
        let room = b.room.load(Ordering::Relaxed);
        assert!(room >= 100, "{room}");
        b.reserve(Some(src), 1, 10);
        assert_eq!(b.room.load(Ordering::Relaxed), room, "already there");
    }
}
