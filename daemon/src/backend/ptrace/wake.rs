//! How tracer shards are woken.
//!
//! SIGCHLD is blocked in every daemon thread except a tracer waiting in
//! `ppoll`, whose mask lets it through. The kernel sends a tracee's SIGCHLD
//! to its own tracer thread when that thread can take it (it waits), else
//! to any tracer that waits; a handler records the tid the signal names, and
//! that tracer collects it (`waitpid(tid)`) or hands it to the owner's bell.
//! A stop thus costs one wake-up, of the tracer that acts on it (a router
//! thread in between cost 13-14 µs of CPU per hit more). A tracee no shard
//! owns yet (a thread just created) makes every shard scan all its tracees
//! at once. SIGCHLDs merge (standard signals do not queue): while they flow,
//! every shard is asked for a full scan at most once per millisecond and
//! does one at most every [`FULL_SCAN_EVERY`]; when they stop, the kernel is
//! asked whether any event is left uncollected (`waitid(WNOWAIT)` over every
//! tracer thread's tracees) and only then once more. Commands ring their
//! shard's eventfd. Shards also scan every 100 ms as a last safety net.

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use dashmap::DashMap;
use nix::errno::Errno;
use nix::sys::signal::Signal;

use crate::model::Tid;

/// How a shard is woken: its eventfd, the tracees whose SIGCHLD another
/// tracer took, and whether a full wait scan is owed: now (`scan`: a
/// tracee no shard owned yet, such as a thread just created), or soon
/// (`sweep`: some SIGCHLD may have merged).
pub(super) struct Bell {
    pub(super) fd: OwnedFd,
    pub(super) stopped: Mutex<Vec<Tid>>,
    pub(super) scan: AtomicBool,
    pub(super) sweep: AtomicBool,
}

impl Bell {
    pub(super) fn new() -> Self {
        Bell {
            fd: eventfd(),
            stopped: Mutex::new(Vec::new()),
            scan: AtomicBool::new(true),
            sweep: AtomicBool::new(false),
        }
    }

    pub(super) fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to an eventfd we own.
        let r = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        // Only EAGAIN can fail it (the counter at its maximum): the shard
        // is rung already, nothing is lost.
        debug_assert!(
            r == 8 || Errno::last() == Errno::EAGAIN,
            "eventfd write: {}",
            Errno::last()
        );
    }

    /// `tid` (one of this shard's tracees) has an event to collect.
    pub(super) fn stopped(&self, tid: Tid) {
        self.stopped.lock().unwrap().push(tid);
        self.ring();
    }

    /// A tracee no shard owned has an event.
    pub(super) fn scan(&self) {
        self.scan.store(true, Ordering::Release);
        self.ring();
    }

    /// Some tracee of this shard may have an event whose SIGCHLD merged.
    pub(super) fn sweep(&self) {
        self.sweep.store(true, Ordering::Release);
        self.ring();
    }
}

pub(super) fn eventfd() -> OwnedFd {
    // SAFETY: plain syscall; on failure we abort start-up below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    assert!(fd >= 0, "eventfd: {}", Errno::last());
    // SAFETY: fresh fd we own.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// True if any tracee of any tracer thread of the daemon has a stop or an
/// exit nobody collected yet. `WNOWAIT` leaves it to its tracer; without
/// `__WNOTHREAD` the kernel looks at every thread's tracees.
pub(super) fn uncollected_event() -> bool {
    // SAFETY: zeroed siginfo is a valid out-parameter for waitid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WSTOPPED | libc::WNOHANG | libc::WNOWAIT | libc::__WALL;
    // SAFETY: P_ALL with a valid siginfo pointer.
    let r = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, flags) };
    // SAFETY: si_pid is valid for the CLD_* codes waitid fills in; 0 when
    // nothing was found.
    r == 0 && unsafe { info.si_pid() } != 0
}

/// Least time between two full wait scans of one shard.
pub(super) const FULL_SCAN_EVERY: std::time::Duration = std::time::Duration::from_millis(2);

/// Blocks SIGCHLD in the calling thread (and threads it creates later).
/// `wpd`'s `main` calls this first thing, before any other thread exists:
/// only tracers waiting in `ppoll` may take it.
pub fn block_sigchld() {
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(Signal::SIGCHLD);
    let _ = set.thread_block();
}

/// Where SIGCHLD wake-ups go: every shard's bell, and which shard owns
/// each tracee (so that a stop wakes only its own tracer).
pub(super) struct Router {
    pub(super) bells: Vec<Arc<Bell>>,
    pub(super) owners: Vec<Arc<DashMap<Tid, usize>>>,
}

pub(super) static ROUTER: OnceLock<Mutex<Router>> = OnceLock::new();

/// Longest a stop whose SIGCHLD was merged with another one waits: standard
/// signals do not queue, so a SIGCHLD names only one of the tracees that
/// stopped meanwhile. While SIGCHLDs flow, uncollected events are looked
/// for at most this often; when they stop, once more.
pub(super) const CATCH_ALL: std::time::Duration = std::time::Duration::from_millis(1);

thread_local! {
    /// The tracee the last SIGCHLD taken by this thread named (0: none).
    pub(super) static NAMED: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
    /// This thread is a tracer (it waits for SIGCHLD in `ppoll`).
    pub(super) static IS_TRACER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Eventfd every tracer polls besides its own bell: rung when a thread that
/// is not a tracer took a SIGCHLD (none does in the daemon, where every
/// other thread blocks it), so that the event is still looked for.
pub(super) static STRAY_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Merged-SIGCHLD bookkeeping shared by the tracers: a catch-all is owed
/// since some SIGCHLD came, and when the last one was asked for (ms since
/// `EPOCH`).
pub(super) static OWED: AtomicBool = AtomicBool::new(false);
static LAST_ALL_MS: AtomicU64 = AtomicU64::new(0);
static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();

fn now_ms() -> u64 {
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// SIGCHLD handler: the kernel prefers the tracer of the stopped tracee
/// when it waits in `ppoll` (the only place a tracer unblocks SIGCHLD), or
/// else any tracer that does; the handler only records the tracee's tid
/// for that thread, which acts on it when `ppoll` returns.
extern "C" fn on_sigchld(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let tid = unsafe { (*info).si_pid() };
    if IS_TRACER.with(|t| t.get()) {
        NAMED.with(|n| n.set(tid));
        return;
    }
    let fd = STRAY_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: errno is saved and restored around write(2), which is
        // async-signal-safe; the eventfd lives as long as the process.
        unsafe {
            let errno = *libc::__errno_location();
            let one: u64 = 1;
            libc::write(fd, (&one as *const u64).cast(), 8);
            *libc::__errno_location() = errno;
        }
    }
}

pub(super) fn install_sigchld_handler() {
    STRAY_FD.store(eventfd().into_raw_fd(), Ordering::Relaxed);
    // SAFETY: installs a handler that is async-signal-safe (see above).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigchld as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGCHLD, &sa, std::ptr::null_mut());
    }
}

/// Asks every shard for a full scan: `urgent` (a tracee nobody owns yet,
/// such as a thread just created) now, else soon (merged SIGCHLDs).
pub(super) fn scan_all(urgent: bool) {
    if let Some(r) = ROUTER.get() {
        for b in &r.lock().unwrap().bells {
            if urgent {
                b.scan();
            } else {
                b.sweep();
            }
        }
    }
}

/// The owner's bell of `tid`, if any shard owns it.
pub(super) fn bell_of(tid: Tid) -> Option<Arc<Bell>> {
    let r = ROUTER.get()?.lock().unwrap();
    let shard = r.owners.iter().find_map(|o| o.get(&tid).map(|s| *s))?;
    r.bells.get(shard).cloned()
}

/// A SIGCHLD came: while they flow, ask every shard for a catch-all at most
/// once per `CATCH_ALL`.
pub(super) fn sigchld_seen() {
    OWED.store(true, Ordering::Release);
    let now = now_ms();
    let last = LAST_ALL_MS.load(Ordering::Acquire);
    if now.saturating_sub(last) >= CATCH_ALL.as_millis() as u64
        && LAST_ALL_MS
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    {
        scan_all(false);
    }
}

/// SIGCHLDs stopped coming: ask for one more catch-all, only if some event
/// is still uncollected (an isolated hit costs no wake-up of other shards).
pub(super) fn sigchld_quiet() {
    if OWED.swap(false, Ordering::AcqRel) {
        LAST_ALL_MS.store(now_ms(), Ordering::Release);
        if uncollected_event() {
            scan_all(false);
        }
    }
}
