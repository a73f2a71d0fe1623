//! ptrace backend: tracer threads that own tracees and program DR0–DR7
//! with PTRACE_POKEUSER.
//!
//! Rules the kernel imposes (kernel-facts §1–3) and how they shape this file:
//! - ptrace requests must come from the thread that attached: each tracee
//!   belongs to one *shard*, a dedicated OS thread, for its whole life.
//!   Threads created by a tracee (`PTRACE_O_TRACECLONE`) belong to the same
//!   tracer thread as their creator.
//! - A shard waits only on its own tracees (`__WNOTHREAD`), and on a
//!   named one when it can: `waitpid(-1)` walks every tracee of the shard
//!   (O(tracees) per call, the largest cost of arming 1,000 threads), while
//!   `waitpid(tid)` looks the tracee up directly.
//! - Registers can be written only while a tracee is in a ptrace-stop:
//!   changes are recorded as the tracee's *desired* state, the tracee is
//!   interrupted, and the change is applied at its next stop. A batch over
//!   many tracees interrupts them all first, then applies as stops arrive —
//!   never interrupt-then-wait one at a time.
//! - A process-wide arm first *parks* its threads (interrupted, kept
//!   stopped), so that the core checks every thread's free slot before any
//!   address is written, on stopped threads, then programs them at that
//!   same stop and unparks them.
//! - DR7 is never read back to decide what to write: the shard keeps the
//!   whole register per tracee and always writes it whole. Every POKE is
//!   checked; a slot whose address poke failed is left out of DR7.
//! - Before detaching, DR7 is written 0: ptrace-set registers survive the
//!   tracer, and a hit with no tracer kills the target with SIGTRAP.
//!
//! Wake-ups: SIGCHLD is blocked in every daemon thread except a tracer
//! waiting in `ppoll`, whose mask lets it through. The kernel sends a
//! tracee's SIGCHLD to its own tracer thread when that thread can take it
//! (it waits), else to any tracer that waits; a handler records the tid the
//! signal names, and that tracer collects it (`waitpid(tid)`) or hands it
//! to the owner's bell. A stop thus costs one wake-up, of the tracer that
//! acts on it (a router thread in between cost 13-14 µs of CPU per hit
//! more). A tracee no shard owns yet (a thread just created) makes every
//! shard scan all its tracees at once. SIGCHLDs merge (standard signals do
//! not queue): while they flow, every shard is asked for a full scan at
//! most once per millisecond and does one at most every `FULL_SCAN_EVERY`;
//! when they stop, the kernel is asked whether any event is left
//! uncollected (`waitid(WNOWAIT)` over every tracer thread's tracees) and
//! only then once more. Commands ring their shard's eventfd. Shards also
//! scan every 100 ms as a last safety net.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};

use dashmap::DashMap;
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid as NixPid;

use crate::arch::current as arch;
use crate::model::{Pid, Tid};

/// One slot change on one tracee.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotProgram {
    /// Tracee.
    pub tid: Tid,
    /// Debug-register index (0–3), chosen by the ledger.
    pub slot: u8,
    /// `Some((address, DR7 bits of this slot, watchpoint id))` to arm,
    /// `None` to disarm.
    pub arm: Option<(u64, u64, u64)>,
}

/// Outcome of one [`SlotProgram`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramResult {
    /// Applied.
    Done,
    /// The tracee no longer exists.
    Gone,
    /// The kernel refused: no free breakpoint slot (ENOSPC).
    NoSpace,
    /// The kernel refused for another reason.
    Failed(Errno),
}

/// What the daemon decided about a hit (returned by [`TraceSink::hit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitVerdict {
    /// Record and continue.
    Continue,
    /// Keep the hitting thread stopped until resumed.
    Hold,
    /// Keep it stopped and stop every thread of the process.
    HoldAll,
}

/// Why a tracee is stopped by us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Not held: running, or in a stop we are about to end.
    No,
    /// Stopped after its own hit.
    Hit,
    /// Stopped because another thread of its process hit.
    Peer,
    /// Parked by [`PtraceBackend::park`] until [`PtraceBackend::unpark`].
    Parked,
}

/// A tracee's state as listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceeState {
    /// Held by the daemon.
    pub held: Held,
    /// In a job-control stop (SIGSTOP & co.).
    pub group_stopped: bool,
}

/// Callbacks from tracer threads into the daemon core. Called on the
/// tracer thread: they must not block on tracer commands.
pub trait TraceSink: Send + Sync {
    /// A new thread appeared (auto-attached at clone, stopped before its
    /// first instruction). Returns the slots to program before it runs.
    fn thread_started(&self, pid: Pid, tid: Tid, parent: Tid) -> Vec<SlotProgram>;
    /// Result of programming a new thread's slots.
    fn thread_armed(&self, pid: Pid, tid: Tid, results: &[(SlotProgram, ProgramResult)]);
    /// A tracee exited.
    fn thread_exited(&self, pid: Pid, tid: Tid);
    /// A hardware-breakpoint trap: `ids` are the watchpoints of the slots
    /// DR6 names. The tracee is stopped while this runs.
    fn hit(&self, pid: Pid, tid: Tid, ip: u64, ids: &[u64]) -> HitVerdict;
    /// The process called exec: the kernel cleared the registers.
    fn exec(&self, pid: Pid, tid: Tid);
}

enum Cmd {
    Seize {
        pid: Pid,
        tids: Vec<Tid>,
        reply: mpsc::Sender<Vec<(Tid, Result<(), Errno>)>>,
    },
    Program {
        items: Vec<SlotProgram>,
        reply: mpsc::Sender<Vec<(SlotProgram, ProgramResult)>>,
    },
    Resume {
        pid: Pid,
        tids: Vec<Tid>,
        reply: mpsc::Sender<Vec<Tid>>,
    },
    HoldAll {
        pid: Pid,
        except: Tid,
    },
    Detach {
        pid: Pid,
        reply: mpsc::Sender<usize>,
    },
    States {
        pid: Pid,
        reply: mpsc::Sender<Vec<(Tid, TraceeState)>>,
    },
    Park {
        tids: Vec<Tid>,
        reply: mpsc::Sender<Vec<Tid>>,
    },
    Unpark {
        tids: Vec<Tid>,
    },
}

struct Shard {
    tx: mpsc::Sender<Cmd>,
    bell: Arc<Bell>,
}

/// How a shard is woken: its eventfd, the tracees whose SIGCHLD another
/// tracer took, and whether a full wait scan is owed: now (`scan`: a
/// tracee no shard owned yet, such as a thread just created), or soon
/// (`sweep`: some SIGCHLD may have merged).
struct Bell {
    fd: OwnedFd,
    stopped: Mutex<Vec<Tid>>,
    scan: AtomicBool,
    sweep: AtomicBool,
}

impl Bell {
    fn new() -> Self {
        Bell {
            fd: eventfd(),
            stopped: Mutex::new(Vec::new()),
            scan: AtomicBool::new(true),
            sweep: AtomicBool::new(false),
        }
    }

    fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to an eventfd we own.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// `tid` (one of this shard's tracees) has an event to collect.
    fn stopped(&self, tid: Tid) {
        self.stopped.lock().unwrap().push(tid);
        self.ring();
    }

    /// A tracee no shard owned has an event.
    fn scan(&self) {
        self.scan.store(true, Ordering::Release);
        self.ring();
    }

    /// Some tracee of this shard may have an event whose SIGCHLD merged.
    fn sweep(&self) {
        self.sweep.store(true, Ordering::Release);
        self.ring();
    }
}

/// The backend: shards and tracee ownership.
pub struct PtraceBackend {
    shards: Vec<Shard>,
    /// Tracee → shard index (a tracee's requests must go to its tracer).
    owner: Arc<DashMap<Tid, usize>>,
    next: AtomicU64,
}

impl std::fmt::Debug for PtraceBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PtraceBackend")
            .field("shards", &self.shards.len())
            .finish()
    }
}

fn eventfd() -> OwnedFd {
    // SAFETY: plain syscall; on failure we abort start-up below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    assert!(fd >= 0, "eventfd: {}", Errno::last());
    // SAFETY: fresh fd we own.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// True if SIGTRAP is pending for thread `tid` (its own pending set,
/// where a hardware breakpoint's trap is queued).
fn sigtrap_pending(tid: Tid) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigPnd:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGTRAP - 1)) != 0)
}

/// True if any tracee of any tracer thread of the daemon has a stop or an
/// exit nobody collected yet. `WNOWAIT` leaves it to its tracer; without
/// `__WNOTHREAD` the kernel looks at every thread's tracees.
fn uncollected_event() -> bool {
    // SAFETY: zeroed siginfo is a valid out-parameter for waitid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WSTOPPED | libc::WNOHANG | libc::WNOWAIT | libc::__WALL;
    // SAFETY: P_ALL with a valid siginfo pointer.
    let r = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, flags) };
    // SAFETY: si_pid is valid for the CLD_* codes waitid fills in; 0 when
    // nothing was found.
    r == 0 && unsafe { info.si_pid() } != 0
}

/// Longest a tracee stays parked if nobody unparks it (a safety net: the
/// core unparks on every way out of an arm, panics included).
const PARK_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// Least time between two full wait scans of one shard.
const FULL_SCAN_EVERY: std::time::Duration = std::time::Duration::from_millis(2);

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
struct Router {
    bells: Vec<Arc<Bell>>,
    owners: Vec<Arc<DashMap<Tid, usize>>>,
}

static ROUTER: OnceLock<Mutex<Router>> = OnceLock::new();

/// Longest a stop whose SIGCHLD was merged with another one waits: standard
/// signals do not queue, so a SIGCHLD names only one of the tracees that
/// stopped meanwhile. While SIGCHLDs flow, uncollected events are looked
/// for at most this often; when they stop, once more.
const CATCH_ALL: std::time::Duration = std::time::Duration::from_millis(1);

thread_local! {
    /// The tracee the last SIGCHLD taken by this thread named (0: none).
    static NAMED: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
    /// This thread is a tracer (it waits for SIGCHLD in `ppoll`).
    static IS_TRACER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Eventfd every tracer polls besides its own bell: rung when a thread that
/// is not a tracer took a SIGCHLD (none does in the daemon, where every
/// other thread blocks it), so that the event is still looked for.
static STRAY_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Merged-SIGCHLD bookkeeping shared by the tracers: a catch-all is owed
/// since some SIGCHLD came, and when the last one was asked for (ms since
/// `EPOCH`).
static OWED: AtomicBool = AtomicBool::new(false);
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

fn install_sigchld_handler() {
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
fn scan_all(urgent: bool) {
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
fn bell_of(tid: Tid) -> Option<Arc<Bell>> {
    let r = ROUTER.get()?.lock().unwrap();
    let shard = r.owners.iter().find_map(|o| o.get(&tid).map(|s| *s))?;
    r.bells.get(shard).cloned()
}

/// A SIGCHLD came: while they flow, ask every shard for a catch-all at most
/// once per `CATCH_ALL`.
fn sigchld_seen() {
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
fn sigchld_quiet() {
    if OWED.swap(false, Ordering::AcqRel) {
        LAST_ALL_MS.store(now_ms(), Ordering::Release);
        if uncollected_event() {
            scan_all(false);
        }
    }
}

impl PtraceBackend {
    /// Starts `shards` tracer threads delivering events to `sink`.
    pub fn new(shards: usize, sink: std::sync::Weak<dyn TraceSink>) -> Self {
        let first = ROUTER.get().is_none();
        let router = ROUTER.get_or_init(|| {
            Mutex::new(Router {
                bells: Vec::new(),
                owners: Vec::new(),
            })
        });
        if first {
            install_sigchld_handler();
        }
        let owner = Arc::new(DashMap::new());
        // Shard indices are per backend; with one backend per process (the
        // daemon) they match the bell order. Another backend (tests) falls
        // back to ringing every shard.
        {
            let mut r = router.lock().unwrap();
            if r.owners.is_empty() {
                r.owners.push(owner.clone());
            }
        }
        let mut v = Vec::with_capacity(shards);
        for i in 0..shards.max(1) {
            let (tx, rx) = mpsc::channel();
            let bell = Arc::new(Bell::new());
            router.lock().unwrap().bells.push(bell.clone());
            let mut tracer = Tracer {
                index: i,
                rx,
                bell: bell.clone(),
                tracees: HashMap::new(),
                batches: HashMap::new(),
                next_batch: 0,
                parks: HashMap::new(),
                parked: ParkQueue::default(),
                sink: sink.clone(),
                owner: owner.clone(),
            };
            std::thread::Builder::new()
                .name(format!("wpd-tracer-{i}"))
                .spawn(move || {
                    crate::sched::thread_started();
                    IS_TRACER.with(|t| t.set(true));
                    // A tracer that dies leaves its tracees detached with
                    // armed registers (kernel-facts §2): on a panic, clear
                    // and detach them before the thread ends.
                    let run =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tracer.run()));
                    if run.is_err() {
                        tracer.detach_everything();
                    }
                })
                .expect("spawn tracer");
            v.push(Shard { tx, bell });
        }
        PtraceBackend {
            shards: v,
            owner,
            next: AtomicU64::new(0),
        }
    }

    fn send(&self, shard: usize, cmd: Cmd) {
        let s = &self.shards[shard];
        let _ = s.tx.send(cmd);
        s.bell.ring();
    }

    /// Seizes `tids` of `pid`, spread over the shards. Per-tid results.
    pub fn seize(&self, pid: Pid, tids: &[Tid]) -> Vec<(Tid, Result<(), Errno>)> {
        let n = self.shards.len();
        let mut per: Vec<Vec<Tid>> = vec![Vec::new(); n];
        for &t in tids {
            let s = (self.next.fetch_add(1, Ordering::Relaxed) as usize) % n;
            per[s].push(t);
        }
        let (tx, rx) = mpsc::channel();
        let mut waiting = 0;
        for (s, tids) in per.into_iter().enumerate() {
            if !tids.is_empty() {
                waiting += 1;
                self.send(
                    s,
                    Cmd::Seize {
                        pid,
                        tids,
                        reply: tx.clone(),
                    },
                );
            }
        }
        (0..waiting)
            .flat_map(|_| rx.recv().unwrap_or_default())
            .collect()
    }

    /// Programs slots; waits until every change is applied (or failed).
    pub fn program(&self, items: Vec<SlotProgram>) -> Vec<(SlotProgram, ProgramResult)> {
        let mut per: HashMap<usize, Vec<SlotProgram>> = HashMap::new();
        let mut out = Vec::new();
        for it in items {
            match self.owner.get(&it.tid).map(|s| *s) {
                Some(s) => per.entry(s).or_default().push(it),
                None => out.push((it, ProgramResult::Gone)),
            }
        }
        let (tx, rx) = mpsc::channel();
        let waiting = per.len();
        for (s, items) in per {
            self.send(
                s,
                Cmd::Program {
                    items,
                    reply: tx.clone(),
                },
            );
        }
        for _ in 0..waiting {
            out.extend(rx.recv().unwrap_or_default());
        }
        out
    }

    /// Stops `tids` and keeps them stopped until [`PtraceBackend::unpark`]
    /// (or `PARK_MAX`); returns those that are stopped (parked, or already
    /// held by a hit). Programs sent meanwhile apply at once and leave them
    /// stopped.
    pub fn park(&self, tids: &[Tid]) -> Vec<Tid> {
        let mut per: HashMap<usize, Vec<Tid>> = HashMap::new();
        for &t in tids {
            if let Some(s) = self.owner.get(&t).map(|s| *s) {
                per.entry(s).or_default().push(t);
            }
        }
        let (tx, rx) = mpsc::channel();
        let waiting = per.len();
        for (s, tids) in per {
            self.send(
                s,
                Cmd::Park {
                    tids,
                    reply: tx.clone(),
                },
            );
        }
        (0..waiting)
            .flat_map(|_| rx.recv().unwrap_or_default())
            .collect()
    }

    /// Restarts the tracees of `tids` that are still parked.
    pub fn unpark(&self, tids: &[Tid]) {
        let mut per: HashMap<usize, Vec<Tid>> = HashMap::new();
        for &t in tids {
            if let Some(s) = self.owner.get(&t).map(|s| *s) {
                per.entry(s).or_default().push(t);
            }
        }
        for (s, tids) in per {
            self.send(s, Cmd::Unpark { tids });
        }
    }

    /// Resumes held tracees of `pid` (all held ones when `tids` is empty).
    pub fn resume(&self, pid: Pid, tids: &[Tid]) -> Vec<Tid> {
        self.broadcast(|reply| Cmd::Resume {
            pid,
            tids: tids.to_vec(),
            reply,
        })
        .into_iter()
        .flatten()
        .collect()
    }

    /// Stops every tracee of `pid` except `except` (peer stop after a hit).
    pub fn hold_all(&self, pid: Pid, except: Tid) {
        for s in 0..self.shards.len() {
            self.send(s, Cmd::HoldAll { pid, except });
        }
    }

    /// Detaches every tracee of `pid`, DR7 cleared first. Returns the count.
    ///
    /// Every tracee is stopped (parked) before any is released: a thread
    /// detached at its own stop runs again at once, and on a busy process
    /// those still to stop would wait behind it for the CPU (1,000
    /// spinning threads on 2 CPUs took 3-8 s to detach one by one, against
    /// tens of ms this way).
    pub fn detach(&self, pid: Pid) -> usize {
        let tids: Vec<Tid> = self.states(pid).into_keys().collect();
        if tids.len() > 1 {
            self.park(&tids);
        }
        self.broadcast(|reply| Cmd::Detach { pid, reply })
            .into_iter()
            .sum()
    }

    /// Held / job-control state of every tracee of `pid`.
    pub fn states(&self, pid: Pid) -> HashMap<Tid, TraceeState> {
        self.broadcast(|reply| Cmd::States { pid, reply })
            .into_iter()
            .flatten()
            .collect()
    }

    /// Sends one command per shard and collects one reply from each.
    fn broadcast<R: Send + 'static>(&self, mk: impl Fn(mpsc::Sender<R>) -> Cmd) -> Vec<R> {
        let (tx, rx) = mpsc::channel();
        for s in 0..self.shards.len() {
            self.send(s, mk(tx.clone()));
        }
        (0..self.shards.len())
            .filter_map(|_| rx.recv().ok())
            .collect()
    }

    /// Gives back the tracee map's spare capacity (after a large process
    /// went away).
    pub fn shrink(&self) {
        self.owner.shrink_to_fit();
    }

    /// True if `tid` is one of our tracees.
    pub fn traces(&self, tid: Tid) -> bool {
        self.owner.contains_key(&tid)
    }
}

struct Tracee {
    pid: Pid,
    /// Addresses we want in DR0–DR3.
    addr: [u64; arch::SLOTS],
    /// Watchpoint per slot (0: none), for DR6 → watchpoint.
    ids: [u64; arch::SLOTS],
    /// The DR7 we want.
    dr7: u64,
    /// Addresses and DR7 as last written successfully.
    applied_addr: [u64; arch::SLOTS],
    applied_dr7: u64,
    /// Programs waiting for the next stop: (batch, item).
    pending: Vec<(u64, SlotProgram)>,
    /// PTRACE_INTERRUPT sent, stop not seen yet.
    interrupting: bool,
    /// Waiting for the first stop of an auto-attached new thread.
    fresh: Option<Tid>,
    held: Held,
    group_stopped: bool,
    /// Detach at the next stop.
    detach: Option<mpsc::Sender<usize>>,
    /// Slots we have ever armed on this tracee.
    ever_armed: u8,
    /// Hold at the next stop (peer stop).
    hold_next: bool,
    /// Park at the next stop, for this park request.
    park_next: Option<u64>,
    /// Counts this tracee's parks: tells its current entry in
    /// `Tracer::parked` from those of earlier parks.
    park_gen: u32,
}

impl Tracee {
    fn new(pid: Pid) -> Self {
        Tracee {
            pid,
            addr: [0; arch::SLOTS],
            ids: [0; arch::SLOTS],
            dr7: 0,
            applied_addr: [0; arch::SLOTS],
            applied_dr7: 0,
            pending: Vec::new(),
            interrupting: false,
            fresh: None,
            held: Held::No,
            group_stopped: false,
            detach: None,
            ever_armed: 0,
            hold_next: false,
            park_next: None,
            park_gen: 0,
        }
    }
}

struct Batch {
    remaining: usize,
    results: Vec<(SlotProgram, ProgramResult)>,
    reply: mpsc::Sender<Vec<(SlotProgram, ProgramResult)>>,
}

/// A park request waiting for its tracees to stop.
struct ParkWait {
    remaining: usize,
    stopped: Vec<Tid>,
    reply: mpsc::Sender<Vec<Tid>>,
}

/// Parked tracees, oldest first: (when, tracee, its `park_gen` then).
/// An entry whose park is over (the tracee was unparked, is gone, or was
/// parked again since: a later entry stands for that) is dropped without
/// effect as it reaches the front, so a thread parked by one request is
/// never released early by an older one's timeout, and the queue empties
/// once the parks it records are over.
#[derive(Debug, Default)]
struct ParkQueue(std::collections::VecDeque<(std::time::Instant, Tid, u32)>);

impl ParkQueue {
    /// The oldest tracee whose park, still `current(tid, park_gen)`, has
    /// lasted `max` at `now`, taken off the queue; entries of parks that are
    /// over are dropped on the way.
    fn pop_due(
        &mut self,
        now: std::time::Instant,
        max: std::time::Duration,
        current: impl Fn(Tid, u32) -> bool,
    ) -> Option<Tid> {
        while let Some(&(at, tid, generation)) = self.0.front() {
            if current(tid, generation) {
                if now.saturating_duration_since(at) < max {
                    return None;
                }
                self.0.pop_front();
                return Some(tid);
            }
            self.0.pop_front();
        }
        None
    }

    /// How long after `now` the front entry is due (after [`Self::pop_due`]
    /// returned `None`: the front is a current park or the queue is empty).
    fn next_due(
        &self,
        now: std::time::Instant,
        max: std::time::Duration,
    ) -> Option<std::time::Duration> {
        self.0
            .front()
            .map(|&(at, _, _)| max.saturating_sub(now.saturating_duration_since(at)))
    }
}

struct Tracer {
    index: usize,
    rx: mpsc::Receiver<Cmd>,
    bell: Arc<Bell>,
    tracees: HashMap<Tid, Tracee>,
    batches: HashMap<u64, Batch>,
    next_batch: u64,
    parks: HashMap<u64, ParkWait>,
    /// Parked tracees, released after `PARK_MAX` whatever happens to the
    /// request that parked them.
    parked: ParkQueue,
    sink: std::sync::Weak<dyn TraceSink>,
    owner: Arc<DashMap<Tid, usize>>,
}

fn npid(t: Tid) -> NixPid {
    NixPid::from_raw(t)
}

/// A shard's waits: any tracee kind, only its own, never blocking.
fn reap_flags() -> WaitPidFlag {
    WaitPidFlag::__WALL | WaitPidFlag::__WNOTHREAD | WaitPidFlag::WNOHANG
}

/// Options of every tracee.
fn base_options() -> ptrace::Options {
    ptrace::Options::PTRACE_O_TRACECLONE | ptrace::Options::PTRACE_O_TRACEEXEC
}

/// Options of tracee `tid` of `pid`: the leader also reports its exit
/// (`PTRACE_EVENT_EXIT`). A leader that ends alone (`pthread_exit` in
/// `main`) stays a zombie until the last thread exits, and a traced zombie
/// can neither be stopped nor detached (kernel-facts §3b): it is detached at
/// that stop instead, the last moment it can be. Other threads exit without
/// the stop (a thread exit costs no round trip to the tracer).
fn seize_options(pid: Pid, tid: Tid) -> ptrace::Options {
    if tid == pid {
        base_options() | ptrace::Options::PTRACE_O_TRACEEXIT
    } else {
        base_options()
    }
}

fn is_stop_signal(s: Signal) -> bool {
    matches!(
        s,
        Signal::SIGSTOP | Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU
    )
}

impl Tracer {
    fn run(&mut self) {
        let mut last_full = std::time::Instant::now();
        // The thread's signal mask with SIGCHLD let through: installed only
        // for the time of `ppoll`, so the handler runs nowhere else.
        // SAFETY: reading this thread's mask into a zeroed sigset.
        let wait_mask = unsafe {
            let mut m: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut m);
            libc::sigdelset(&mut m, libc::SIGCHLD);
            m
        };
        let stray = STRAY_FD.load(Ordering::Relaxed);
        let mut sigchld_at = std::time::Instant::now();
        loop {
            loop {
                match self.rx.try_recv() {
                    Ok(cmd) => self.command(cmd),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        self.detach_everything();
                        return;
                    }
                }
            }
            self.reap_stopped();
            let mut timeout = if self.tracees.is_empty() { -1 } else { 100 };
            if let Some(left) = self.release_stale_parks() {
                timeout = timeout.min(left.as_millis() as i32 + 1);
            }
            if self.bell.scan.swap(false, Ordering::AcqRel) {
                self.reap();
                last_full = std::time::Instant::now();
                self.bell.sweep.store(false, Ordering::Release);
            }
            if self.bell.sweep.load(Ordering::Acquire) {
                // A full scan walks every tracee of the shard, and each
                // event it finds costs another walk: while stops flow, at
                // most one per FULL_SCAN_EVERY (named stops do not wait).
                let since = last_full.elapsed();
                if since >= FULL_SCAN_EVERY {
                    self.bell.sweep.store(false, Ordering::Release);
                    self.reap();
                    last_full = std::time::Instant::now();
                } else {
                    timeout = (FULL_SCAN_EVERY - since).as_millis().max(1) as i32;
                }
            }
            // After a large process exits or is detached, give the memory
            // of its tracees back (the daemon's RSS returns to its
            // baseline); cheap to check, rare to act.
            self.shrink_spare();
            if OWED.load(Ordering::Acquire) {
                // Once SIGCHLDs stop for CATCH_ALL, look for merged ones.
                let left = CATCH_ALL.saturating_sub(sigchld_at.elapsed());
                if left.is_zero() {
                    sigchld_quiet();
                } else {
                    timeout = timeout.min(left.as_millis().max(1) as i32);
                }
            }
            let mut pfds = [
                libc::pollfd {
                    fd: self.bell.fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: stray,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let ts = libc::timespec {
                tv_sec: (timeout / 1000) as libc::time_t,
                tv_nsec: ((timeout % 1000) as libc::c_long) * 1_000_000,
            };
            let ts_ptr = if timeout < 0 {
                std::ptr::null()
            } else {
                &ts as *const libc::timespec
            };
            // SAFETY: valid pollfds (the stray fd may be -1: ignored), a
            // valid timespec or null, and a valid mask.
            let r = unsafe { libc::ppoll(pfds.as_mut_ptr(), 2, ts_ptr, &wait_mask) };
            if r == 0 && !OWED.load(Ordering::Acquire) {
                // Quiet for 100 ms, or a deferred scan is due.
                self.bell.sweep.store(true, Ordering::Release);
            }
            let named = NAMED.with(|n| n.replace(0));
            if named != 0 {
                sigchld_at = std::time::Instant::now();
                sigchld_seen();
                self.on_named(named);
            }
            if pfds[1].revents & libc::POLLIN != 0 {
                let mut buf = 0u64;
                // SAFETY: draining the eventfd counter into a local.
                let n = unsafe { libc::read(stray, (&mut buf as *mut u64).cast(), 8) };
                if n == 8 {
                    scan_all(true);
                }
            }
            // Drained only when rung: a stop that woke us through SIGCHLD
            // (the common case, one per hit) costs no read.
            if pfds[0].revents & libc::POLLIN != 0 {
                let mut buf = 0u64;
                // SAFETY: draining the eventfd counter into a local.
                unsafe { libc::read(self.bell.fd.as_raw_fd(), (&mut buf as *mut u64).cast(), 8) };
            }
        }
    }

    fn detach_everything(&mut self) {
        let tids: Vec<Tid> = self.tracees.keys().copied().collect();
        for tid in tids {
            self.request_detach(tid, None);
        }
        // Bounded: tracees that never stop again (killed) are dropped.
        for _ in 0..200 {
            if self.tracees.is_empty() {
                break;
            }
            self.reap();
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Seize { pid, tids, reply } => {
                let mut out = Vec::with_capacity(tids.len());
                for tid in tids {
                    let r = ptrace::seize(npid(tid), seize_options(pid, tid));
                    if r.is_ok() {
                        self.tracees.insert(tid, Tracee::new(pid));
                        self.owner.insert(tid, self.index);
                    }
                    out.push((tid, r));
                }
                let _ = reply.send(out);
            }
            Cmd::Program { items, reply } => {
                let id = self.next_batch;
                self.next_batch += 1;
                let mut batch = Batch {
                    remaining: 0,
                    results: Vec::new(),
                    reply,
                };
                let mut touched = Vec::new();
                for it in items {
                    match self.tracees.get_mut(&it.tid) {
                        Some(t) if t.detach.is_none() => {
                            t.pending.push((id, it));
                            batch.remaining += 1;
                            touched.push(it.tid);
                        }
                        _ => batch.results.push((it, ProgramResult::Gone)),
                    }
                }
                self.batches.insert(id, batch);
                touched.sort_unstable();
                touched.dedup();
                // Interrupt all first; apply as the stops come in.
                for tid in touched {
                    self.kick(tid);
                }
                self.finish_batch_if_done(id);
            }
            Cmd::Resume { pid, tids, reply } => {
                let mut resumed = Vec::new();
                let all: Vec<Tid> = self
                    .tracees
                    .iter()
                    .filter(|(t, tr)| {
                        tr.pid == pid
                            && tr.held != Held::No
                            && (tids.is_empty() || tids.contains(t))
                    })
                    .map(|(t, _)| *t)
                    .collect();
                for tid in all {
                    if let Some(t) = self.tracees.get_mut(&tid) {
                        t.held = Held::No;
                        t.hold_next = false;
                    }
                    self.restart(tid, None);
                    resumed.push(tid);
                }
                let _ = reply.send(resumed);
            }
            Cmd::HoldAll { pid, except } => {
                for (t, tr) in self.tracees.iter_mut() {
                    if tr.pid == pid && *t != except && tr.held == Held::Parked {
                        tr.held = Held::Peer;
                    }
                }
                let tids: Vec<Tid> = self
                    .tracees
                    .iter()
                    .filter(|(t, tr)| tr.pid == pid && **t != except && tr.held == Held::No)
                    .map(|(t, _)| *t)
                    .collect();
                for tid in tids {
                    if let Some(t) = self.tracees.get_mut(&tid) {
                        t.hold_next = true;
                    }
                    self.kick(tid);
                }
            }
            Cmd::Detach { pid, reply } => {
                let tids: Vec<Tid> = self
                    .tracees
                    .iter()
                    .filter(|(_, t)| t.pid == pid)
                    .map(|(t, _)| *t)
                    .collect();
                if tids.is_empty() {
                    let _ = reply.send(0);
                    return;
                }
                // One reply per tracee; the caller sums them per shard below.
                let (tx, rx) = mpsc::channel();
                let n = tids.len();
                for tid in tids {
                    self.request_detach(tid, Some(tx.clone()));
                }
                // Collect asynchronously: forward the sum when all are done.
                std::thread::spawn(move || {
                    let done: usize = (0..n).filter_map(|_| rx.recv().ok()).sum();
                    let _ = reply.send(done);
                });
            }
            Cmd::Park { tids, reply } => {
                let id = self.next_batch;
                self.next_batch += 1;
                let mut wait = ParkWait {
                    remaining: 0,
                    stopped: Vec::new(),
                    reply,
                };
                let mut kick = Vec::new();
                for tid in tids {
                    match self.tracees.get_mut(&tid) {
                        Some(t) if t.detach.is_some() => {}
                        Some(t) if t.held != Held::No => wait.stopped.push(tid),
                        Some(t) => {
                            t.park_next = Some(id);
                            wait.remaining += 1;
                            kick.push(tid);
                        }
                        None => {}
                    }
                }
                self.parks.insert(id, wait);
                for tid in kick {
                    self.kick(tid);
                }
                self.finish_park_if_done(id);
            }
            Cmd::Unpark { tids } => {
                for tid in tids {
                    self.unpark_one(tid);
                }
            }
            Cmd::States { pid, reply } => {
                let v = self
                    .tracees
                    .iter()
                    .filter(|(_, t)| t.pid == pid)
                    .map(|(tid, t)| {
                        (
                            *tid,
                            TraceeState {
                                held: t.held,
                                group_stopped: t.group_stopped,
                            },
                        )
                    })
                    .collect();
                let _ = reply.send(v);
            }
        }
    }

    /// Makes sure `tid` reaches a stop soon: if it is held (in a stop we
    /// keep) apply right away; else interrupt it.
    fn kick(&mut self, tid: Tid) {
        let Some(t) = self.tracees.get_mut(&tid) else {
            return;
        };
        if t.held != Held::No {
            // Already in a ptrace-stop we own: apply now, stay stopped.
            self.apply(tid);
            if self.tracees.get(&tid).is_some_and(|t| t.detach.is_some()) {
                if self.trap_queued(tid) {
                    // As in `after_stop`: let the queued hit be reported
                    // (and swallowed) first; it detaches there.
                    if let Some(t) = self.tracees.get_mut(&tid) {
                        t.held = Held::No;
                    }
                    self.restart(tid, None);
                } else {
                    self.do_detach(tid);
                }
            }
            return;
        }
        if !t.interrupting && t.fresh.is_none() {
            t.interrupting = true;
            if ptrace::interrupt(npid(tid)) == Err(Errno::ESRCH) {
                // Exited (its exit is reaped later) or not stoppable.
                self.forget(tid);
            }
        }
    }

    /// A hit's SIGTRAP waits behind the current stop of `tid` (only
    /// possible once it was armed): detached before reporting it, the thread
    /// would receive it untraced and die.
    fn trap_queued(&self, tid: Tid) -> bool {
        self.tracees.get(&tid).is_some_and(|t| t.ever_armed != 0) && sigtrap_pending(tid)
    }

    fn request_detach(&mut self, tid: Tid, done: Option<mpsc::Sender<usize>>) {
        let Some(t) = self.tracees.get_mut(&tid) else {
            if let Some(d) = done {
                let _ = d.send(0);
            }
            return;
        };
        t.detach = Some(done.unwrap_or_else(|| mpsc::channel().0));
        t.dr7 = 0;
        t.ids = [0; arch::SLOTS];
        self.kick(tid);
    }

    /// Writes the desired registers; resolves pending programs.
    fn apply(&mut self, tid: Tid) {
        let Some(t) = self.tracees.get_mut(&tid) else {
            return;
        };
        let pending = std::mem::take(&mut t.pending);
        let mut outcome: Vec<(u64, SlotProgram, ProgramResult)> = Vec::new();
        for (batch, p) in pending {
            let s = p.slot as usize;
            let slot_mask = slot_dr7_mask(s);
            match p.arm {
                Some((addr, bits, id)) => {
                    // Address first; a failed address poke must not be
                    // followed by enabling the slot (it would arm the old one).
                    let r = ptrace::write_user(
                        npid(tid),
                        arch::debugreg_offset(s) as _,
                        addr as libc::c_long,
                    );
                    match r {
                        Ok(()) => {
                            t.addr[s] = addr;
                            t.applied_addr[s] = addr;
                            t.ids[s] = id;
                            t.ever_armed |= 1 << s;
                            t.dr7 = (t.dr7 & !slot_mask) | bits;
                            outcome.push((batch, p, ProgramResult::Done));
                        }
                        Err(e) => outcome.push((batch, p, errno_result(e))),
                    }
                }
                None => {
                    t.dr7 &= !slot_mask;
                    t.ids[s] = 0;
                    outcome.push((batch, p, ProgramResult::Done));
                }
            }
        }
        if t.dr7 != t.applied_dr7 || t.detach.is_some() {
            match ptrace::write_user(
                npid(tid),
                arch::debugreg_offset(arch::DR7) as _,
                t.dr7 as libc::c_long,
            ) {
                Ok(()) => t.applied_dr7 = t.dr7,
                Err(e) => {
                    // The kernel rolled DR7 back: report every arm of this
                    // round as failed and keep the last good register.
                    t.dr7 = t.applied_dr7;
                    for o in outcome.iter_mut() {
                        if o.1.arm.is_some() && o.2 == ProgramResult::Done {
                            o.2 = errno_result(e);
                            t.ids[o.1.slot as usize] = 0;
                        }
                    }
                }
            }
        }
        for (batch, p, r) in outcome {
            self.resolve(batch, p, r);
        }
    }

    fn resolve(&mut self, batch: u64, p: SlotProgram, r: ProgramResult) {
        if let Some(b) = self.batches.get_mut(&batch) {
            b.results.push((p, r));
            b.remaining = b.remaining.saturating_sub(1);
        }
        self.finish_batch_if_done(batch);
    }

    fn finish_batch_if_done(&mut self, batch: u64) {
        if self.batches.get(&batch).is_some_and(|b| b.remaining == 0)
            && let Some(b) = self.batches.remove(&batch)
        {
            let _ = b.reply.send(b.results);
        }
    }

    /// One tracee of park request `id` stopped (`Some`) or vanished.
    fn park_progress(&mut self, id: u64, stopped: Option<Tid>) {
        if let Some(w) = self.parks.get_mut(&id) {
            w.remaining = w.remaining.saturating_sub(1);
            w.stopped.extend(stopped);
        }
        self.finish_park_if_done(id);
    }

    fn finish_park_if_done(&mut self, id: u64) {
        if self.parks.get(&id).is_some_and(|w| w.remaining == 0)
            && let Some(w) = self.parks.remove(&id)
        {
            let _ = w.reply.send(w.stopped);
        }
    }

    fn unpark_one(&mut self, tid: Tid) {
        if let Some(t) = self.tracees.get_mut(&tid)
            && t.held == Held::Parked
        {
            t.held = Held::No;
            self.restart(tid, None);
        }
    }

    /// Restarts tracees parked for longer than `PARK_MAX` (their request
    /// never came back); the time until the next one is due.
    fn release_stale_parks(&mut self) -> Option<std::time::Duration> {
        let now = std::time::Instant::now();
        loop {
            let tracees = &self.tracees;
            let due = self.parked.pop_due(now, PARK_MAX, |tid, generation| {
                tracees
                    .get(&tid)
                    .is_some_and(|t| t.held == Held::Parked && t.park_gen == generation)
            });
            match due {
                Some(tid) => self.unpark_one(tid),
                None => return self.parked.next_due(now, PARK_MAX),
            }
        }
    }

    /// Drops a tracee that vanished; fails its pending programs.
    fn forget(&mut self, tid: Tid) {
        if let Some(t) = self.tracees.remove(&tid) {
            if let Some(id) = t.park_next {
                self.park_progress(id, None);
            }
            self.owner.remove(&tid);
            for (batch, p) in t.pending {
                self.resolve(batch, p, ProgramResult::Gone);
            }
            if let Some(d) = t.detach {
                let _ = d.send(1);
            }
            if let Some(sink) = self.sink.upgrade() {
                sink.thread_exited(t.pid, tid);
            }
        }
    }

    fn do_detach(&mut self, tid: Tid) {
        let Some(t) = self.tracees.remove(&tid) else {
            return;
        };
        if let Some(id) = t.park_next {
            self.park_progress(id, None);
        }
        self.owner.remove(&tid);
        // DR7 = 0 was written by `apply` (it always writes when detaching).
        let _ = ptrace::detach(npid(tid), None);
        for (batch, p) in t.pending {
            self.resolve(batch, p, ProgramResult::Gone);
        }
        if let Some(d) = t.detach {
            let _ = d.send(1);
        }
    }

    /// Ends the current stop: LISTEN if the process is job-control stopped
    /// (so SIGCONT still works), else CONT with `sig` (delivered unchanged).
    fn restart(&mut self, tid: Tid, sig: Option<Signal>) {
        let group = self.tracees.get(&tid).is_some_and(|t| t.group_stopped);
        let r = if group && sig.is_none() {
            // SAFETY: PTRACE_LISTEN takes no addr/data.
            let r = unsafe { libc::ptrace(libc::PTRACE_LISTEN, tid, 0, 0) };
            if r < 0 { Err(Errno::last()) } else { Ok(()) }
        } else {
            ptrace::cont(npid(tid), sig)
        };
        if r == Err(Errno::ESRCH) {
            // Killed while stopped; its exit will be reaped.
        }
    }

    /// A SIGCHLD this thread took named `tid`: collect it if it is ours,
    /// else hand it to its tracer; a tid nobody owns yet (a thread just
    /// created, whose creator's clone event is not handled yet) makes
    /// every shard scan.
    fn on_named(&mut self, tid: Tid) {
        if self.tracees.contains_key(&tid) {
            self.collect(tid);
        } else if let Some(bell) = bell_of(tid) {
            bell.stopped(tid);
        } else {
            scan_all(true);
        }
    }

    /// Collects the events of the tracees other tracers named.
    fn reap_stopped(&mut self) {
        let tids = std::mem::take(&mut *self.bell.stopped.lock().unwrap());
        for tid in tids {
            self.collect(tid);
        }
    }

    /// Collects `tid`'s pending event, if any, with a `waitpid` on that tid
    /// alone (the kernel finds it without walking the shard's other
    /// tracees).
    fn collect(&mut self, tid: Tid) {
        match waitpid(npid(tid), Some(reap_flags())) {
            Ok(WaitStatus::StillAlive) | Err(_) => {}
            Ok(st) => self.event(st),
        }
    }

    /// Collects every pending event of this shard's tracees.
    fn reap(&mut self) {
        loop {
            match waitpid(None::<NixPid>, Some(reap_flags())) {
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(st) => self.event(st),
            }
        }
    }

    fn event(&mut self, st: WaitStatus) {
        match st {
            WaitStatus::Exited(p, _) | WaitStatus::Signaled(p, _, _) => self.forget(p.as_raw()),
            WaitStatus::PtraceEvent(p, sig, ev) => self.ptrace_event(p.as_raw(), sig, ev),
            WaitStatus::Stopped(p, sig) => self.signal_stop(p.as_raw(), sig),
            _ => {}
        }
    }

    fn ptrace_event(&mut self, tid: Tid, sig: Signal, ev: i32) {
        if let std::collections::hash_map::Entry::Vacant(v) = self.tracees.entry(tid) {
            // An auto-attached new thread whose stop came before its
            // parent's CLONE event: adopt it now (pid from /proc).
            let pid = crate::procfs::tgid_of(tid).unwrap_or(tid);
            let mut t = Tracee::new(pid);
            t.fresh = Some(0);
            v.insert(t);
            self.owner.insert(tid, self.index);
        }
        match ev {
            libc::PTRACE_EVENT_CLONE => {
                let child = ptrace::getevent(npid(tid)).map(|c| c as Tid).unwrap_or(0);
                let pid = self.tracees[&tid].pid;
                // A thread of the same process (the common case) is told by
                // a path lookup; reading /proc/CHILD/status for its Tgid was
                // 14 % of the daemon's CPU under thread churn.
                let child_pid = if crate::procfs::is_thread_of(pid, child) {
                    pid
                } else {
                    crate::procfs::tgid_of(child).unwrap_or(pid)
                };
                if child > 0 && child_pid != pid {
                    // A new process (clone without CLONE_THREAD): not ours
                    // to watch. Let it go at its first stop.
                    let mut c = Tracee::new(child_pid);
                    c.detach = Some(mpsc::channel().0);
                    self.tracees.entry(child).or_insert(c).fresh = None;
                    self.owner.insert(child, self.index);
                } else if child > 0 {
                    // A thread created by one being detached was not among
                    // the tracees the detach named: it goes too, unarmed
                    // (armed and left traced, its next hit would kill the
                    // target once the process is no longer ours).
                    let detaching = self.tracees[&tid].detach.is_some();
                    let waiting = match self.tracees.get_mut(&child) {
                        Some(c) => {
                            let waiting = c.fresh == Some(0);
                            if detaching {
                                c.fresh = None;
                                c.detach.get_or_insert_with(|| mpsc::channel().0);
                            } else if waiting {
                                c.fresh = Some(tid);
                            }
                            waiting
                        }
                        None => {
                            let mut c = Tracee::new(pid);
                            if detaching {
                                c.detach = Some(mpsc::channel().0);
                            } else {
                                c.fresh = Some(tid);
                            }
                            self.tracees.insert(child, c);
                            self.owner.insert(child, self.index);
                            // Its first stop may already be there, its
                            // SIGCHLD handed to nobody (no shard owned it
                            // yet): collect it by name.
                            self.collect(child);
                            false
                        }
                    };
                    // Its stop came first: it is waiting, parent known now.
                    if waiting && detaching {
                        self.after_stop(child, None);
                    } else if waiting {
                        self.arm_fresh(child);
                    }
                }
                self.after_stop(tid, None);
            }
            libc::PTRACE_EVENT_EXEC => {
                let former = ptrace::getevent(npid(tid)).map(|c| c as Tid).unwrap_or(tid);
                if former != tid
                    && let Some(old) = self.tracees.remove(&former)
                {
                    self.owner.remove(&former);
                    let mut t = old;
                    t.pid = tid;
                    self.tracees.insert(tid, t);
                }
                if let Some(t) = self.tracees.get_mut(&tid) {
                    // exec cleared the registers (kernel-facts §3).
                    t.addr = [0; arch::SLOTS];
                    t.applied_addr = [0; arch::SLOTS];
                    t.ids = [0; arch::SLOTS];
                    t.dr7 = 0;
                    t.applied_dr7 = 0;
                }
                let pid = self.tracees.get(&tid).map(|t| t.pid).unwrap_or(tid);
                // The thread that called exec is the leader now (it took
                // the pid): it must report its exit as leaders do.
                let _ = ptrace::setoptions(npid(tid), seize_options(pid, tid));
                if let Some(sink) = self.sink.upgrade() {
                    sink.exec(pid, tid);
                }
                self.after_stop(tid, None);
            }
            libc::PTRACE_EVENT_EXIT => self.exit_stop(tid),
            libc::PTRACE_EVENT_STOP => {
                let group = is_stop_signal(sig);
                let t = self.tracees.get_mut(&tid).expect("adopted above");
                t.group_stopped = group;
                t.interrupting = false;
                if t.detach.is_some() {
                    t.fresh = None;
                }
                if let Some(parent) = t.fresh {
                    if parent == 0 {
                        // Stop before the parent's CLONE event: wait for it
                        // (it names the parent), unless we cannot tell.
                        if group {
                            self.after_stop(tid, None);
                        }
                        return;
                    }
                    self.arm_fresh(tid);
                    return;
                }
                self.after_stop(tid, None);
            }
            _ => self.after_stop(tid, None),
        }
    }

    /// `PTRACE_EVENT_EXIT` (leaders only, see [`seize_options`]): the
    /// thread is on its way out and runs no more user code. Detached here,
    /// it leaves no traced zombie behind; to the daemon it has exited.
    fn exit_stop(&mut self, tid: Tid) {
        let Some(t) = self.tracees.remove(&tid) else {
            let _ = ptrace::detach(npid(tid), None);
            return;
        };
        self.owner.remove(&tid);
        let _ = ptrace::detach(npid(tid), None);
        if let Some(id) = t.park_next {
            self.park_progress(id, None);
        }
        for (batch, p) in t.pending {
            self.resolve(batch, p, ProgramResult::Gone);
        }
        if let Some(d) = t.detach {
            let _ = d.send(1);
        }
        if let Some(sink) = self.sink.upgrade() {
            sink.thread_exited(t.pid, tid);
        }
    }

    /// First stop of a new thread with a known parent: arm it with the
    /// process-wide watchpoints before it runs its first instruction.
    fn arm_fresh(&mut self, tid: Tid) {
        let Some(t) = self.tracees.get_mut(&tid) else {
            return;
        };
        let parent = t.fresh.take().unwrap_or(0);
        let pid = t.pid;
        if parent == pid || parent == 0 {
            // Created by the leader: it inherited the leader's
            // PTRACE_O_TRACEEXIT, which only a leader needs.
            let _ = ptrace::setoptions(npid(tid), base_options());
        }
        let Some(sink) = self.sink.upgrade() else {
            self.after_stop(tid, None);
            return;
        };
        let programs = sink.thread_started(pid, tid, parent);
        let id = self.next_batch;
        self.next_batch += 1;
        let (tx, rx) = mpsc::channel();
        self.batches.insert(
            id,
            Batch {
                remaining: programs.len(),
                results: Vec::new(),
                reply: tx,
            },
        );
        if let Some(t) = self.tracees.get_mut(&tid) {
            t.pending.extend(programs.into_iter().map(|p| (id, p)));
        }
        self.apply(tid);
        self.finish_batch_if_done(id);
        if let Ok(results) = rx.try_recv() {
            sink.thread_armed(pid, tid, &results);
        }
        self.after_stop(tid, None);
    }

    fn signal_stop(&mut self, tid: Tid, sig: Signal) {
        if !self.tracees.contains_key(&tid) {
            // Never leave a stopped thread behind, even one we lost track of.
            let _ = ptrace::cont(npid(tid), sig);
            return;
        }
        if sig == Signal::SIGTRAP && self.hw_trap(tid) {
            return;
        }
        if sig == Signal::SIGCONT
            && let Some(t) = self.tracees.get_mut(&tid)
        {
            t.group_stopped = false;
        }
        // A signal-delivery-stop: deliver the signal unchanged.
        self.after_stop(tid, Some(sig));
    }

    /// Handles a SIGTRAP that is ours (TRAP_HWBKPT on a slot we armed).
    /// Returns false when the trap is not ours (then it is delivered).
    /// Gives back what a large process left in the tracer's own tables: the
    /// tracee map, and the queue of parked tracees (a stop-all pass over
    /// 10,000 threads grows it to 16,384 entries, 400 KiB, which stayed
    /// allocated after the process had gone: found with heaptrack).
    fn shrink_spare(&mut self) {
        fn spare(capacity: usize, len: usize) -> bool {
            capacity > 4 * len + 256
        }
        if spare(self.tracees.capacity(), self.tracees.len()) {
            self.tracees.shrink_to_fit();
        }
        if spare(self.parked.0.capacity(), self.parked.0.len()) {
            self.parked.0.shrink_to_fit();
        }
        if spare(self.batches.capacity(), self.batches.len()) {
            self.batches.shrink_to_fit();
        }
        if spare(self.parks.capacity(), self.parks.len()) {
            self.parks.shrink_to_fit();
        }
    }

    fn hw_trap(&mut self, tid: Tid) -> bool {
        let Ok(info) = ptrace::getsiginfo(npid(tid)) else {
            return false;
        };
        if info.si_code != arch::TRAP_HWBKPT {
            return false;
        }
        let dr6 =
            ptrace::read_user(npid(tid), arch::debugreg_offset(arch::DR6) as _).unwrap_or(0) as u64;
        let t = &self.tracees[&tid];
        let ids: Vec<u64> = (0..arch::SLOTS)
            .filter(|&s| dr6 & (1 << s) != 0 && t.ids[s] != 0)
            .map(|s| t.ids[s])
            .collect();
        if ids.is_empty() {
            // No armed slot of ours fired. A slot we armed before and have
            // just disarmed can still trap once (the hit raced the disarm):
            // that trap is ours to swallow. Anything else is delivered.
            if dr6 & arch::dr6::HIT_MASK & u64::from(t.ever_armed) != 0 {
                self.after_stop(tid, None);
                return true;
            }
            return false;
        }
        let ip = ptrace::getregs(npid(tid)).map(|r| r.rip).unwrap_or(0);
        let pid = t.pid;
        let verdict = self
            .sink
            .upgrade()
            .map(|s| s.hit(pid, tid, ip, &ids))
            .unwrap_or(HitVerdict::Continue);
        match verdict {
            HitVerdict::Continue => self.after_stop(tid, None),
            HitVerdict::Hold | HitVerdict::HoldAll => {
                if let Some(t) = self.tracees.get_mut(&tid) {
                    t.held = Held::Hit;
                }
                // Apply anything pending; stay stopped.
                self.apply(tid);
            }
        }
        true
    }

    /// Common end of every stop: apply pending register changes, detach if
    /// asked, hold if asked, else restart (delivering `sig`).
    fn after_stop(&mut self, tid: Tid, sig: Option<Signal>) {
        let Some(t) = self.tracees.get_mut(&tid) else {
            return;
        };
        t.interrupting = false;
        let detach = t.detach.is_some();
        let hold = t.hold_next;
        if !t.pending.is_empty() || detach {
            self.apply(tid);
        }
        if detach {
            // A hit's SIGTRAP can be queued behind this stop (an interrupt
            // is reported before pending signals). Detached now, the thread
            // would receive it untraced and die. Let it report the signal
            // first: `hw_trap` swallows it (the slot was ours) and detaches
            // there.
            if sig.is_none() && self.trap_queued(tid) {
                self.restart(tid, None);
                return;
            }
            let Some(t) = self.tracees.remove(&tid) else {
                return;
            };
            self.owner.remove(&tid);
            let _ = ptrace::detach(npid(tid), sig);
            for (batch, p) in t.pending {
                self.resolve(batch, p, ProgramResult::Gone);
            }
            if let Some(d) = t.detach {
                let _ = d.send(1);
            }
            return;
        }
        if hold && sig.is_none() {
            if let Some(t) = self.tracees.get_mut(&tid) {
                t.hold_next = false;
                t.held = Held::Peer;
                if let Some(id) = t.park_next.take() {
                    self.park_progress(id, Some(tid));
                }
            }
            return;
        }
        if sig.is_none()
            && let Some(t) = self.tracees.get_mut(&tid)
            && let Some(id) = t.park_next.take()
        {
            t.held = Held::Parked;
            t.park_gen = t.park_gen.wrapping_add(1);
            self.parked
                .0
                .push_back((std::time::Instant::now(), tid, t.park_gen));
            self.park_progress(id, Some(tid));
            return;
        }
        self.restart(tid, sig);
    }
}

fn slot_dr7_mask(slot: usize) -> u64 {
    arch::dr7::local_enable(slot)
        | (arch::dr7::local_enable(slot) << 1)
        | (0b1111u64 << arch::dr7::rw_shift(slot))
}

fn errno_result(e: Errno) -> ProgramResult {
    match e {
        Errno::ESRCH => ProgramResult::Gone,
        Errno::ENOSPC => ProgramResult::NoSpace,
        e => ProgramResult::Failed(e),
    }
}

/// The tracer pid of `tid` from `/proc`, if another process traces it.
pub fn tracer_of(tid: Tid) -> Option<Pid> {
    let s = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    let v: Pid = s
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))?
        .trim()
        .parse()
        .ok()?;
    (v != 0).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_mask_covers_enable_rw_len() {
        assert_eq!(slot_dr7_mask(0), 0b11 | (0b1111 << 16));
        assert_eq!(slot_dr7_mask(3), (0b11 << 6) | (0b1111 << 28));
    }

    #[test]
    fn a_reparked_thread_outlives_the_older_parks_timeout() {
        use std::collections::HashMap;
        use std::time::{Duration, Instant};
        let max = Duration::from_secs(30);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut q = ParkQueue::default();
        // Current park generation of each parked tracee (absent: not parked).
        let mut parked: HashMap<Tid, u32> = HashMap::new();
        // 7 parked at 0 s, unparked, parked again at 20 s; 8 parked at 5 s;
        // 9 parked at 10 s, then gone.
        q.0.push_back((t0, 7, 1));
        q.0.push_back((t0 + s(5), 8, 1));
        q.0.push_back((t0 + s(10), 9, 1));
        q.0.push_back((t0 + s(20), 7, 2));
        parked.insert(7, 2);
        parked.insert(8, 1);
        let current = |p: &HashMap<Tid, u32>| {
            let p = p.clone();
            move |tid, generation| p.get(&tid) == Some(&generation)
        };

        // At 31 s, 7's first park is over: only 8 (parked at 5 s) is due at
        // 35 s, so nothing is released and the wait is 4 s.
        let now = t0 + s(31);
        assert_eq!(q.pop_due(now, max, current(&parked)), None);
        assert_eq!(q.next_due(now, max), Some(s(4)));
        assert_eq!(q.0.len(), 3, "7's stale entry is dropped");

        // At 36 s: 8 is released; 9 is gone; 7's second park is due at 50 s.
        let now = t0 + s(36);
        assert_eq!(q.pop_due(now, max, current(&parked)), Some(8));
        parked.remove(&8);
        assert_eq!(q.pop_due(now, max, current(&parked)), None);
        assert_eq!(q.next_due(now, max), Some(s(14)));
        assert_eq!(q.0.len(), 1);

        // At 50 s, 7 is released and the queue is empty.
        let now = t0 + s(50);
        assert_eq!(q.pop_due(now, max, current(&parked)), Some(7));
        parked.remove(&7);
        assert_eq!(q.pop_due(now, max, current(&parked)), None);
        assert_eq!(q.next_due(now, max), None);
        assert!(q.0.is_empty());
    }

    #[test]
    fn park_queue_drops_finished_parks_without_releasing_anything() {
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let mut q = ParkQueue::default();
        for tid in 1..=16_384 {
            q.0.push_back((t0, tid, 1));
        }
        // Every park was ended by its request: none is current.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(q.pop_due(later, PARK_MAX, |_, _| false), None);
        assert!(q.0.is_empty());
        assert_eq!(q.next_due(later, PARK_MAX), None);
    }

    #[test]
    fn errno_mapping() {
        assert_eq!(errno_result(Errno::ENOSPC), ProgramResult::NoSpace);
        assert_eq!(errno_result(Errno::ESRCH), ProgramResult::Gone);
        assert_eq!(
            errno_result(Errno::EINVAL),
            ProgramResult::Failed(Errno::EINVAL)
        );
    }
}
