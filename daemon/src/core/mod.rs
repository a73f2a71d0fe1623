//! The daemon's state and operations, independent of gRPC: attach, arm,
//! disarm, track threads, turn kernel records into events.
//!
//! Concurrency: all state is in concurrent maps (`DashMap`); the only
//! per-process lock (`Process::op`) serialises arm/disarm passes of one
//! process and is held only on blocking threads, never across `.await`.
//! Blocking syscalls run on tokio's blocking pool (see `rpc`) or on the drain
//! and reconcile threads owned here.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use crate::arch;
use crate::backend::Availability;
use crate::backend::perf::{self, PerfBackend, PerfError, ThreadEvents};
use crate::error::{SlotConflict, WpdError};
use crate::events::{EventBus, EventKind};
use crate::ledger::Ledger;
use crate::model::{BackendKind, HitAction, Pid, Scope, Tid, WatchId, WatchSpec};
use crate::procfs;
use crate::sched::Boost;

mod perf_ops;
mod ptrace_ops;

pub use ptrace_ops::{recover_from_state_file, set_state_file, state_file};

/// An attached process.
#[derive(Debug)]
pub struct Process {
    /// Process id.
    pub pid: Pid,
    /// Backend programming it.
    pub backend: BackendKind,
    /// When it was attached (Unix ns).
    pub attached_at_ns: u64,
    /// Command name at attach time.
    pub comm: String,
    /// Start time (`/proc/PID/stat` field 22), to tell the process from a
    /// later one with the same pid (0 if unknown).
    pub start_time: u64,
    /// Its credentials at attach (uids, gids, permitted capabilities): an
    /// exec that changes them (a setuid or setgid program, file
    /// capabilities) ends the attachment.
    creds: Option<([u32; 3], [u32; 3], u64)>,
    /// Thread-tracking events; kept until detach because threads created by
    /// a tracked thread carry kernel copies that die with the original.
    trackers: Mutex<Vec<OwnedFd>>,
    /// Ids of its watchpoints.
    watches: Mutex<BTreeSet<u64>>,
    /// Serialises arm/disarm passes of this process (blocking threads only).
    op: Mutex<()>,
    /// Set once detached or exited.
    gone: AtomicBool,
    /// Task watching the pidfd for process exit.
    exit_watch: Mutex<Option<tokio::task::AbortHandle>>,
}

/// A watchpoint.
#[derive(Debug)]
pub struct Watch {
    /// Id.
    pub id: WatchId,
    /// What was asked for.
    pub spec: WatchSpec,
    /// Covers every thread, including future ones.
    pub process_wide: bool,
    /// When it was set (Unix ns).
    pub created_at_ns: u64,
    /// Hits delivered.
    pub hits: AtomicU64,
    /// Last value seen, for only-on-change watchpoints.
    last_value: Mutex<Option<Vec<u8>>>,
    /// Backend holding it.
    pub backend: BackendKind,
    /// uid of the caller that set it (for per-caller limits).
    pub owner: u32,
    /// Events we opened explicitly, by thread. Kept until the watchpoint is
    /// removed: closing one also removes its inherited copies.
    events: Mutex<Vec<(Tid, ThreadEvents)>>,
}

/// A watchpoint as listed.
#[derive(Debug, Clone)]
pub struct WatchView {
    /// Id.
    pub id: WatchId,
    /// Spec.
    pub spec: WatchSpec,
    /// Process-wide.
    pub process_wide: bool,
    /// Threads it is armed on now.
    pub armed_threads: u32,
    /// Hits so far.
    pub hits: u64,
    /// Creation time.
    pub created_at_ns: u64,
    /// Backend.
    pub backend: BackendKind,
}

/// A process as listed.
#[derive(Debug, Clone)]
pub struct ProcessView {
    /// Process id.
    pub pid: Pid,
    /// Backend.
    pub backend: BackendKind,
    /// Tracked threads.
    pub threads: u32,
    /// Watchpoints.
    pub watchpoints: u32,
    /// Command name.
    pub comm: String,
    /// Attach time.
    pub attached_at_ns: u64,
}

/// One slot as listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotView {
    /// Free.
    Free,
    /// Ours.
    Ours(WatchId),
    /// Someone else's.
    Foreign,
    /// Being armed or not yet known to be inherited.
    Pending(WatchId),
    /// Freed by us, still reserved by the kernel (ptrace residue).
    Retained,
}

/// Run state of a listed thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// Running normally.
    Running,
    /// Held by us after its own hit.
    StoppedAtHit,
    /// Held by us after another thread's hit.
    StoppedByPeer,
    /// Job-control stopped.
    JobStopped,
}

/// One thread as listed.
#[derive(Debug, Clone)]
pub struct ThreadView {
    /// Thread id.
    pub tid: Tid,
    /// Creator, if seen.
    pub parent: Tid,
    /// Slots.
    pub slots: Vec<SlotView>,
    /// Name.
    pub name: String,
    /// Run state.
    pub state: RunState,
}

/// Daemon counters.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Attached processes.
    pub processes: u32,
    /// Tracked threads.
    pub threads: u64,
    /// Watchpoints.
    pub watchpoints: u32,
    /// Hits delivered.
    pub hits: u64,
    /// Kernel ring losses.
    pub kernel_lost: u64,
    /// Open perf fds.
    pub perf_fds: u64,
    /// Subscribers.
    pub subscribers: u32,
    /// Subscriber losses.
    pub subscriber_dropped: u64,
    /// Ledger hold (p50, p99, max) ns.
    pub ledger_hold: (u64, u64, u64),
    /// Uptime.
    pub uptime: Duration,
}

/// Resource limits (every one has a specific error when reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Watchpoints one caller (uid) may hold at once.
    pub watchpoints_per_caller: usize,
    /// Processes attached at once.
    pub processes: usize,
    /// Event subscribers at once.
    pub subscribers: usize,
    /// Event subscribers one unprivileged caller (uid) may have at once.
    pub subscribers_per_caller: usize,
    /// File descriptors perf events leave free under `RLIMIT_NOFILE` for
    /// connections and the daemon's own files.
    pub fd_headroom: u64,
}

/// Event subscriptions only privileged callers may take (of
/// `Limits::subscribers`): one user's streams cannot lock root out.
pub const SUBSCRIBER_RESERVE: usize = 16;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            watchpoints_per_caller: 4096,
            processes: 1024,
            subscribers: 256,
            subscribers_per_caller: 32,
            fd_headroom: 64,
        }
    }
}

/// The daemon core.
pub struct Core {
    /// Limits.
    pub limits: Limits,
    /// Slot accounting.
    pub ledger: Ledger,
    /// Event fan-out.
    pub bus: EventBus,
    procs: DashMap<Pid, Arc<Process>>,
    watches: DashMap<u64, Arc<Watch>>,
    /// perf event id → watchpoint id (samples carry the event id).
    event_ids: DashMap<u64, u64>,
    perf: Result<PerfBackend, String>,
    next_id: AtomicU64,
    hits: AtomicU64,
    started: Instant,
    /// CLOCK_REALTIME − CLOCK_MONOTONIC, to date kernel records.
    clock_offset: u64,
    stop: AtomicBool,
    reconcile_tx: Mutex<Option<mpsc::Sender<Job>>>,
    ptrace: Result<crate::backend::ptrace::PtraceBackend, String>,
    /// What the ptrace state file holds now (rewritten only on change).
    state_written: Mutex<String>,
    /// Threads whose EXIT record was read before their FORK record.
    early_exits: Mutex<perf_ops::EarlyExits>,
    /// Serialises the limit check and registration of new subscribers.
    subscribing: Mutex<()>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("procs", &self.procs.len())
            .finish()
    }
}

/// Work for the reconcile thread (it may take a process's `op` lock, which
/// the drain thread must never do).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Job {
    /// Arm threads that missed a process-wide watchpoint.
    Reconcile(Pid),
    /// The process called exec: its breakpoints are gone.
    Exec(Pid),
    /// Rewrite the ptrace state file.
    SaveState,
    /// The perf backend tracks no thread of the process any more: if the
    /// process lives on, the kernel took our events off it.
    CheckLost(Pid),
}

fn perf_err(e: PerfError) -> WpdError {
    WpdError::kernel(e.op, e.errno)
}

impl Core {
    /// Builds the core with default limits.
    pub fn start() -> Arc<Core> {
        Self::start_with(Limits::default())
    }

    /// Builds the core and starts its drain and reconcile threads.
    pub fn start_with(limits: Limits) -> Arc<Core> {
        let perf = PerfBackend::new().map_err(|e| {
            format!(
                "{} failed ({}): the perf backend needs CAP_PERFMON or root for its per-CPU rings (perf_event_paranoid={})",
                e.op,
                e.errno.desc(),
                std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap_or_default().trim()
            )
        });
        match &perf {
            Ok(p) => p.set_fd_headroom(limits.fd_headroom),
            Err(e) => tracing::warn!("{e}"),
        }
        let core = Arc::new_cyclic(|weak: &std::sync::Weak<Core>| Core {
            limits,
            ptrace: ptrace_ops::start_ptrace(weak.clone()),
            ledger: Ledger::new(),
            bus: EventBus::default(),
            procs: DashMap::new(),
            watches: DashMap::new(),
            event_ids: DashMap::new(),
            perf,
            next_id: AtomicU64::new(1),
            hits: AtomicU64::new(0),
            started: Instant::now(),
            clock_offset: crate::clock::realtime_ns().saturating_sub(crate::clock::monotonic_ns()),
            stop: AtomicBool::new(false),
            reconcile_tx: Mutex::new(None),
            state_written: Mutex::new(String::new()),
            early_exits: Mutex::new(perf_ops::EarlyExits::default()),
            subscribing: Mutex::new(()),
        });
        if core.perf.is_ok() {
            let c = core.clone();
            std::thread::Builder::new()
                .name("wpd-drain".into())
                .spawn(move || {
                    crate::sched::thread_started();
                    c.drain_loop()
                })
                .expect("spawn drain");
        }
        let (tx, rx) = mpsc::channel::<Job>();
        *core.reconcile_tx.lock().unwrap() = Some(tx);
        let c = core.clone();
        std::thread::Builder::new()
            .name("wpd-reconcile".into())
            .spawn(move || {
                crate::sched::thread_started();
                c.reconcile_loop(rx)
            })
            .expect("spawn reconcile");
        core
    }

    fn perf(&self) -> Result<&PerfBackend, WpdError> {
        self.perf
            .as_ref()
            .map_err(|reason| WpdError::BackendUnavailable {
                backend: BackendKind::Perf,
                reason: reason.clone(),
            })
    }

    /// Which backends work here.
    pub fn backends(&self) -> Vec<Availability> {
        vec![
            Availability {
                kind: BackendKind::Perf,
                usable: self.perf.is_ok(),
                reason: self.perf.as_ref().err().cloned().unwrap_or_default(),
            },
            Availability {
                kind: BackendKind::Ptrace,
                usable: self.ptrace.is_ok(),
                reason: self.ptrace.as_ref().err().cloned().unwrap_or_default(),
            },
        ]
    }

    /// Online CPUs.
    pub fn cpus(&self) -> usize {
        self.perf
            .as_ref()
            .map(|p| p.cpus().len())
            .unwrap_or_else(|_| perf::online_cpus().len())
    }

    // ---------------------------------------------------------------- attach

    fn check_backend(&self, asked: Option<BackendKind>) -> Result<BackendKind, WpdError> {
        match asked.unwrap_or(BackendKind::Perf) {
            BackendKind::Perf => {
                self.perf()?;
                Ok(BackendKind::Perf)
            }
            BackendKind::Ptrace => {
                self.ptrace()?;
                Ok(BackendKind::Ptrace)
            }
        }
    }

    /// Attaches `pid` (idempotent). Returns the process and whether this call
    /// attached it. The daemon itself is refused, and pid 1 unless
    /// `allow_init`. Blocking.
    pub fn attach(
        self: &Arc<Self>,
        pid: Pid,
        backend: Option<BackendKind>,
        allow_init: bool,
    ) -> Result<(Arc<Process>, bool), WpdError> {
        if pid == std::process::id() as Pid {
            return Err(WpdError::OwnProcess(pid));
        }
        if let Some(p) = self.procs.get(&pid).map(|p| p.clone()) {
            if let Some(asked) = backend
                && asked != p.backend
            {
                return Err(WpdError::BackendMismatch {
                    pid,
                    attached: p.backend,
                    asked,
                });
            }
            return Ok((p, false));
        }
        let backend = self.check_backend(backend)?;
        procfs::check_process(pid)?;
        if pid == 1 && !allow_init {
            return Err(WpdError::InitProcess);
        }
        if self.procs.len() >= self.limits.processes {
            return Err(WpdError::LimitReached {
                what: "attached processes",
                limit: self.limits.processes,
                hint: "detach a process first",
            });
        }
        let proc = Arc::new(Process {
            pid,
            backend,
            attached_at_ns: crate::clock::realtime_ns(),
            comm: procfs::comm(pid, pid).unwrap_or_default(),
            start_time: procfs::start_time(pid).unwrap_or(0),
            creds: procfs::creds(pid),
            trackers: Mutex::new(Vec::new()),
            watches: Mutex::new(BTreeSet::new()),
            op: Mutex::new(()),
            gone: AtomicBool::new(false),
            exit_watch: Mutex::new(None),
        });
        match self.procs.entry(pid) {
            dashmap::Entry::Occupied(o) => return Ok((o.get().clone(), false)),
            dashmap::Entry::Vacant(v) => {
                v.insert(proc.clone());
            }
        }
        let _op = proc.op.lock().unwrap();
        let _rt = Boost::enter();
        let tracked = match backend {
            BackendKind::Perf => self.track_all_threads(&proc),
            BackendKind::Ptrace => self.seize_all_threads(&proc),
        };
        if tracked.is_ok() {
            // A thread that exited between the scan and its tracking may
            // have had its exit handled first: drop such rows.
            // One listing, not a path lookup per thread.
            let alive: std::collections::HashSet<Tid> = procfs::tasks(pid)
                .map(|v| v.into_iter().collect())
                .unwrap_or_default();
            for tid in self.ledger.tids(pid) {
                if !alive.contains(&tid) {
                    self.ledger.remove_thread(tid);
                }
            }
        }
        if let Err(e) = tracked {
            drop(_op);
            self.forget_process(&proc);
            return Err(e);
        }
        drop(_op);
        self.watch_exit(&proc);
        tracing::info!(pid, threads = self.ledger.thread_count(pid), "attached");
        Ok((proc, true))
    }

    fn watch_exit(self: &Arc<Self>, proc: &Arc<Process>) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Some(pidfd) = procfs::pidfd_open(proc.pid) else {
            return;
        };
        let core = Arc::downgrade(self);
        let pid = proc.pid;
        let task = handle.spawn(async move {
            // SAFETY: the AsyncFd owns the pidfd; nothing else closes it.
            let Ok(afd) = (unsafe { tokio::io::unix::AsyncFd::register(pidfd) }) else {
                return;
            };
            if afd.readable().await.is_ok()
                && let Some(core) = core.upgrade()
            {
                let _ = tokio::task::spawn_blocking(move || core.process_exited(pid)).await;
            }
        });
        *proc.exit_watch.lock().unwrap() = Some(task.abort_handle());
    }

    fn process_exited(&self, pid: Pid) {
        let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
            return;
        };
        let ids = self.release_process(&proc, "process exited");
        self.bus.publish(EventKind::ProcessExited {
            pid,
            watchpoints: ids,
        });
        tracing::info!(pid, "process exited");
    }

    /// Detaches `pid`: every watchpoint removed, every event closed. Blocking.
    pub fn detach(&self, pid: Pid) -> Result<(usize, usize), WpdError> {
        let proc = self
            .procs
            .get(&pid)
            .map(|p| p.clone())
            .ok_or(WpdError::NotAttached(pid))?;
        let threads = self.ledger.thread_count(pid);
        if let Some(t) = proc.exit_watch.lock().unwrap().take() {
            t.abort();
        }
        let ids = self.release_process(&proc, "detached");
        tracing::info!(pid, watchpoints = ids.len(), "detached");
        Ok((ids.len(), threads))
    }

    /// Removes all watchpoints and trackers of a process and forgets it.
    fn release_process(&self, proc: &Arc<Process>, reason: &'static str) -> Vec<WatchId> {
        let _op = proc.op.lock().unwrap();
        proc.gone.store(true, Ordering::SeqCst);
        let ids: Vec<u64> = proc.watches.lock().unwrap().iter().copied().collect();
        let mut removed = Vec::new();
        for id in ids {
            if let Some(w) = self.take_watch(proc, id) {
                self.bus.publish(EventKind::WatchpointRemoved {
                    id: w.id,
                    pid: proc.pid,
                    reason,
                });
                removed.push(w.id);
            }
        }
        drop(_op);
        self.forget_process(proc);
        removed
    }

    fn forget_process(&self, proc: &Arc<Process>) {
        proc.gone.store(true, Ordering::SeqCst);
        if proc.backend == BackendKind::Ptrace
            && let Ok(p) = self.ptrace()
        {
            // DR7 = 0 on every thread, then PTRACE_DETACH.
            p.detach(proc.pid);
        }
        let fds = std::mem::take(&mut *proc.trackers.lock().unwrap());
        if let Ok(p) = self.perf() {
            p.forget_fds(fds.len());
        }
        drop(fds);
        self.ledger.remove_process(proc.pid);
        // Slots the kernel kept for us on threads that are gone now.
        self.ledger.prune_retained(procfs::is_thread_of);
        // Most of an exited process's threads left the ledger one by one
        // (exit records or exit stops) before this point: judge by the
        // table's spare room, not by what was left to remove. Done before
        // the process disappears from listings, so that a client that saw
        // it go also sees the memory returned.
        if self.ledger.mostly_empty() {
            self.compact();
        }
        self.procs.remove_if(&proc.pid, |_, p| Arc::ptr_eq(p, proc));
        self.save_state();
    }

    /// Returns memory to the system after a large process went away:
    /// shrinks the tables, and asks
    /// the allocator to release free heap (glibc keeps it otherwise, and the
    /// daemon's RSS would stay at its high-water mark). Blocking threads only.
    fn compact(&self) {
        let t0 = Instant::now();
        self.ledger.shrink_to_fit();
        self.procs.shrink_to_fit();
        self.watches.shrink_to_fit();
        self.event_ids.shrink_to_fit();
        if let Ok(p) = self.ptrace() {
            p.shrink();
        }
        // SAFETY: malloc_trim only releases free memory of glibc's heap.
        #[cfg(target_env = "gnu")]
        unsafe {
            libc::malloc_trim(0);
        }
        tracing::debug!(took_us = t0.elapsed().as_micros() as u64, "compacted");
    }

    /// The process a watchpoint belongs to.
    pub fn watch_pid(&self, id: u64) -> Option<Pid> {
        self.watches.get(&id).map(|w| w.spec.pid)
    }

    /// A new event subscription for caller `uid`, within the limits: at
    /// most `subscribers_per_caller` for one unprivileged uid, and the last
    /// `SUBSCRIBER_RESERVE` of `subscribers` kept for privileged callers.
    pub fn subscribe(
        &self,
        uid: u32,
        privileged: bool,
    ) -> Result<crate::events::Subscription, WpdError> {
        let _one_at_a_time = self.subscribing.lock().unwrap();
        let total = self.bus.subscribers(None);
        if privileged {
            if total >= self.limits.subscribers {
                return Err(WpdError::LimitReached {
                    what: "event subscribers",
                    limit: self.limits.subscribers,
                    hint: "close another event stream first",
                });
            }
        } else {
            let open_to_all = self.limits.subscribers.saturating_sub(SUBSCRIBER_RESERVE);
            if total >= open_to_all {
                return Err(WpdError::LimitReached {
                    what: "event subscribers (the rest is reserved for privileged callers)",
                    limit: open_to_all,
                    hint: "close another event stream first",
                });
            }
            if self.bus.subscribers(Some(uid)) >= self.limits.subscribers_per_caller {
                return Err(WpdError::LimitReached {
                    what: "event subscribers per caller",
                    limit: self.limits.subscribers_per_caller,
                    hint: "close another of your event streams first",
                });
            }
        }
        Ok(self.bus.subscribe(uid, privileged))
    }

    /// Ends every event stream (first step of shutdown).
    pub fn close_streams(&self) {
        self.bus.close();
    }

    /// Detaches everything (shutdown). Every target keeps running.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let pids: Vec<Pid> = self.procs.iter().map(|p| *p.key()).collect();
        for pid in pids {
            let _ = self.detach(pid);
        }
        self.write_state_now();
    }

    // ------------------------------------------------------------------ arm

    /// Sets a watchpoint; returns it and the time taken. Blocking.
    pub fn set_watchpoint(
        self: &Arc<Self>,
        spec: WatchSpec,
        owner: u32,
    ) -> Result<(WatchView, Duration), WpdError> {
        let t_start = Instant::now();
        arch::validate(spec.addr, spec.len.bytes(), spec.access)?;
        let held = self.watches.iter().filter(|w| w.owner == owner).count();
        if held >= self.limits.watchpoints_per_caller {
            return Err(WpdError::LimitReached {
                what: "watchpoints per caller",
                limit: self.limits.watchpoints_per_caller,
                hint: "remove some first",
            });
        }
        // What a perf watchpoint cannot do is refused before anything is
        // attached.
        let backend = self
            .procs
            .get(&spec.pid)
            .map(|p| p.backend)
            .or(spec.backend)
            .unwrap_or(BackendKind::Perf);
        if backend == BackendKind::Perf {
            if spec.action != HitAction::Log {
                return Err(WpdError::NeedsBackend {
                    feature: "stopping on a hit",
                    needs: BackendKind::Ptrace,
                    hint: " (attach with backend ptrace); the perf backend never stops the target",
                });
            }
            if spec.only_on_change {
                return Err(WpdError::NeedsBackend {
                    feature: "only-on-change",
                    needs: BackendKind::Ptrace,
                    hint: ", which compares values while the thread is stopped; perf reads values \
                           too late to tell",
                });
            }
        }
        let (proc, newly) = self.attach(spec.pid, spec.backend, spec.allow_init)?;
        let set = self.set_watchpoint_on(&proc, spec, owner);
        if set.is_err() && newly {
            // A refused request changes nothing: the attach it made goes too
            // (unless another request put a watchpoint there meanwhile).
            let _op = proc.op.lock().unwrap();
            if proc.watches.lock().unwrap().is_empty() && !proc.gone.load(Ordering::SeqCst) {
                drop(_op);
                if let Some(t) = proc.exit_watch.lock().unwrap().take() {
                    t.abort();
                }
                self.forget_process(&proc);
            }
        }
        set.map(|view| (view, t_start.elapsed()))
    }

    /// Sets a watchpoint on an attached process (see `set_watchpoint`).
    fn set_watchpoint_on(
        self: &Arc<Self>,
        proc: &Arc<Process>,
        spec: WatchSpec,
        owner: u32,
    ) -> Result<WatchView, WpdError> {
        if let Some(asked) = spec.backend
            && asked != proc.backend
        {
            return Err(WpdError::BackendMismatch {
                pid: spec.pid,
                attached: proc.backend,
                asked,
            });
        }
        let _op = proc.op.lock().unwrap();
        let _rt = Boost::enter();
        if proc.gone.load(Ordering::SeqCst) {
            return Err(WpdError::ProcessExited(spec.pid));
        }
        if proc.backend == BackendKind::Perf {
            // Make every FORK/EXIT already emitted visible in the ledger.
            self.drain_now();
        }
        let pid = spec.pid;
        let process_wide = spec.scope == Scope::Process;
        if let Scope::Threads(tids) = &spec.scope {
            for &tid in tids {
                if !procfs::is_thread_of(pid, tid) || self.ledger.get(tid).is_none() {
                    return Err(WpdError::NoSuchThread { pid, tid });
                }
            }
        }
        let id = WatchId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let watch = Arc::new(Watch {
            id,
            spec: spec.clone(),
            process_wide,
            created_at_ns: crate::clock::realtime_ns(),
            hits: AtomicU64::new(0),
            last_value: Mutex::new(None),
            backend: proc.backend,
            owner,
            events: Mutex::new(Vec::new()),
        });
        if spec.only_on_change {
            *watch.last_value.lock().unwrap() = procfs::live_thread(pid).and_then(|via| {
                procfs::read_memory(pid, via, spec.addr, spec.len.bytes() as usize).ok()
            });
        }
        // Registered before the thread snapshot: a thread born from here on
        // gets it at birth (ptrace: `thread_started`; perf: reconcile), and
        // one already holding it is skipped by `reserve_all`.
        self.watches.insert(id.0, watch.clone());
        proc.watches.lock().unwrap().insert(id.0);
        let tids: Vec<Tid> = match &spec.scope {
            // In tid order: a perf arm pass cuts it into contiguous ranges,
            // one per CPU (`perf_ops::fan_out`).
            Scope::Process => {
                let mut tids = self.ledger.tids(pid);
                tids.sort_unstable();
                tids
            }
            Scope::Threads(tids) => tids.clone(),
        };
        if tids.is_empty() {
            // Nothing to arm: never a success that can never fire.
            self.watches.remove(&id.0);
            proc.watches.lock().unwrap().remove(&id.0);
            return Err(if procfs::live_thread(pid).is_some() {
                WpdError::ProcessLost {
                    pid,
                    why:
                        "the daemon tracks none of its threads any more (after a setuid or setgid \
                          exec the kernel takes perf events off a process); detach and attach again"
                            .into(),
                }
            } else {
                WpdError::ProcessExited(pid)
            });
        }
        let armed = self
            .ledger
            .reserve_all(&tids, id, process_wide, proc.backend)
            .map_err(|conflicts| WpdError::OutOfSlots { pid, conflicts })
            .and_then(|res| match proc.backend {
                BackendKind::Perf => self.arm_perf(proc, &watch, &res),
                BackendKind::Ptrace => self.arm_ptrace(proc, &watch, &res),
            });
        // The process may have exited while it was being armed.
        let armed = armed.and_then(|()| {
            if procfs::check_process(pid).is_err() && self.ledger.armed_on(&tids, id) == 0 {
                Err(WpdError::ProcessExited(pid))
            } else {
                Ok(())
            }
        });
        if let Err(e) = armed {
            self.watches.remove(&id.0);
            proc.watches.lock().unwrap().remove(&id.0);
            // Threads born meanwhile may have taken it: undo those too.
            if proc.backend == BackendKind::Ptrace {
                self.disarm_ptrace(&watch);
            }
            for (tid, _) in self.ledger.slots_on(&self.watch_tids(&watch), id) {
                self.ledger
                    .release(tid, id, proc.backend == BackendKind::Ptrace);
            }
            return Err(e);
        }
        self.write_state_now();
        drop(_op);
        Ok(self.view(&watch))
    }

    fn reconcile_loop(self: Arc<Self>, rx: mpsc::Receiver<Job>) {
        while let Ok(job) = rx.recv() {
            let mut jobs = BTreeSet::from([job]);
            while let Ok(j) = rx.try_recv() {
                jobs.insert(j);
            }
            for job in jobs {
                let (Job::Reconcile(pid) | Job::Exec(pid) | Job::CheckLost(pid)) = job else {
                    self.write_state_now();
                    continue;
                };
                if let Job::CheckLost(pid) = job {
                    self.check_lost(pid);
                    continue;
                }
                let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
                    continue;
                };
                let _op = proc.op.lock().unwrap();
                if proc.gone.load(Ordering::SeqCst) {
                    continue;
                }
                match job {
                    Job::Reconcile(_) => self.reconcile_locked(&proc),
                    Job::Exec(_) => self.exec_locked(&proc),
                    Job::SaveState | Job::CheckLost(_) => {}
                }
            }
        }
    }

    /// After exec the kernel has dropped our breakpoints (`remove_on_exec`):
    /// they would otherwise fire in an unrelated program image. Report each
    /// as removed; the process stays attached (trackers survive exec).
    fn exec_locked(&self, proc: &Arc<Process>) {
        if procfs::creds(proc.pid).is_some_and(|now| Some(now) != proc.creds) {
            self.lose_locked(
                proc,
                "it executed a program that changed its credentials (setuid, setgid or file \
                 capabilities); attach again to watch the new program"
                    .into(),
            );
            return;
        }
        let ids: Vec<u64> = proc.watches.lock().unwrap().iter().copied().collect();
        for id in ids {
            if let Some(w) = self.take_watch(proc, id) {
                self.bus.publish(EventKind::WatchpointRemoved {
                    id: w.id,
                    pid: proc.pid,
                    reason: "exec",
                });
            }
        }
        tracing::info!(
            pid = proc.pid,
            "process called exec: its watchpoints were removed"
        );
    }

    /// The perf backend lost every thread of `pid`. If the process still
    /// has live threads after a moment (an exiting process has none within
    /// milliseconds), the kernel took our events off it: a setuid or setgid
    /// exec detaches every perf event (`begin_new_exec`), and nothing would
    /// ever fire again.
    fn check_lost(&self, pid: Pid) {
        for _ in 0..10 {
            let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
                return;
            };
            if self.ledger.thread_count(pid) > 0 || procfs::live_thread(pid).is_none() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
            if self.ledger.thread_count(pid) == 0 && procfs::live_thread(pid).is_some() {
                let _op = proc.op.lock().unwrap();
                if proc.gone.load(Ordering::SeqCst) {
                    return;
                }
                if procfs::live_thread(pid).is_some() && self.ledger.thread_count(pid) == 0 {
                    self.lose_locked(
                        &proc,
                        "the kernel detached every perf event from it (it executed a setuid or \
                         setgid program); attach again to watch the new program"
                            .into(),
                    );
                    return;
                }
            }
        }
    }

    /// Ends the attachment of a process the daemon can no longer watch:
    /// every watchpoint removed, the process detached, and a
    /// `ProcessLost` event saying why. Caller holds `proc.op`.
    fn lose_locked(&self, proc: &Arc<Process>, reason: String) {
        proc.gone.store(true, Ordering::SeqCst);
        let ids: Vec<u64> = proc.watches.lock().unwrap().iter().copied().collect();
        let mut removed = Vec::new();
        for id in ids {
            if let Some(w) = self.take_watch(proc, id) {
                self.bus.publish(EventKind::WatchpointRemoved {
                    id: w.id,
                    pid: proc.pid,
                    reason: "process lost",
                });
                removed.push(w.id);
            }
        }
        if let Some(t) = proc.exit_watch.lock().unwrap().take() {
            t.abort();
        }
        tracing::warn!(pid = proc.pid, "{reason}");
        self.bus.publish(EventKind::ProcessLost {
            pid: proc.pid,
            reason,
            watchpoints: removed,
        });
        self.forget_process(proc);
    }

    fn schedule(&self, job: Job) {
        if let Some(tx) = self.reconcile_tx.lock().unwrap().as_ref() {
            let _ = tx.send(job);
        }
    }

    // --------------------------------------------------------------- disarm

    fn take_watch(&self, proc: &Process, id: u64) -> Option<Arc<Watch>> {
        let (_, w) = self.watches.remove(&id)?;
        proc.watches.lock().unwrap().remove(&id);
        let events = std::mem::take(&mut *w.events.lock().unwrap());
        let mut n = 0;
        for (_, ev) in &events {
            n += ev.fds.len();
            for eid in &ev.ids {
                self.event_ids.remove(eid);
            }
        }
        drop(events);
        if let Ok(p) = self.perf() {
            p.forget_fds(n);
            // A drain pass that found the watchpoint before it left the
            // tables publishes its hits before the caller reports it gone.
            if proc.backend == BackendKind::Perf {
                p.barrier();
            }
        }
        let retain = proc.backend == BackendKind::Ptrace;
        if retain {
            self.disarm_ptrace(&w);
        }
        for tid in self.watch_tids(&w) {
            self.ledger.release(tid, w.id, retain);
        }
        Some(w)
    }

    /// Threads a watchpoint can hold a slot on: its own tids when it is
    /// thread-scoped (O(scope), however many threads the process has),
    /// every tracked thread when it is process-wide.
    fn watch_tids(&self, w: &Watch) -> Vec<Tid> {
        match &w.spec.scope {
            Scope::Threads(tids) => tids.clone(),
            Scope::Process => self.ledger.tids(w.spec.pid),
        }
    }

    /// The error for threads the kernel refused (ENOSPC), naming holders.
    fn out_of_slots(&self, pid: Pid, full: Vec<Tid>) -> WpdError {
        let conflicts = full
            .into_iter()
            .map(|tid| SlotConflict {
                tid,
                holders: self
                    .ledger
                    .get(tid)
                    .map(|r| holders_of(&r))
                    .unwrap_or_default(),
            })
            .collect();
        WpdError::OutOfSlots { pid, conflicts }
    }

    /// Removes a watchpoint. Blocking.
    pub fn remove_watchpoint(&self, id: u64) -> Result<WatchView, WpdError> {
        let pid = self
            .watches
            .get(&id)
            .map(|w| w.spec.pid)
            .ok_or(WpdError::NoSuchWatchpoint(id))?;
        let proc = self
            .procs
            .get(&pid)
            .map(|p| p.clone())
            .ok_or(WpdError::NoSuchWatchpoint(id))?;
        let _op = proc.op.lock().unwrap();
        let view = self
            .watches
            .get(&id)
            .map(|w| self.view(&w))
            .ok_or(WpdError::NoSuchWatchpoint(id))?;
        let w = self
            .take_watch(&proc, id)
            .ok_or(WpdError::NoSuchWatchpoint(id))?;
        self.bus.publish(EventKind::WatchpointRemoved {
            id: w.id,
            pid,
            reason: "removed",
        });
        Ok(WatchView {
            hits: w.hits.load(Ordering::Relaxed),
            armed_threads: 0,
            ..view
        })
    }

    // ---------------------------------------------------------------- views

    fn view(&self, w: &Watch) -> WatchView {
        WatchView {
            id: w.id,
            spec: w.spec.clone(),
            process_wide: w.process_wide,
            armed_threads: self.ledger.armed_on(&self.watch_tids(w), w.id) as u32,
            hits: w.hits.load(Ordering::Relaxed),
            created_at_ns: w.created_at_ns,
            backend: w.backend,
        }
    }

    /// Watchpoints (and processes), optionally of one pid, by id.
    pub fn list(&self, pid: Option<Pid>) -> (Vec<WatchView>, Vec<ProcessView>) {
        let mut ws: Vec<WatchView> = self
            .watches
            .iter()
            .filter(|w| pid.is_none_or(|p| w.spec.pid == p))
            .map(|w| self.view(&w))
            .collect();
        ws.sort_by_key(|w| w.id);
        let mut ps: Vec<ProcessView> = self
            .procs
            .iter()
            .filter(|p| pid.is_none_or(|x| p.pid == x))
            .map(|p| ProcessView {
                pid: p.pid,
                backend: p.backend,
                threads: self.ledger.thread_count(p.pid) as u32,
                watchpoints: p.watches.lock().unwrap().len() as u32,
                comm: p.comm.clone(),
                attached_at_ns: p.attached_at_ns,
            })
            .collect();
        ps.sort_by_key(|p| p.pid);
        (ws, ps)
    }

    /// A process as listed.
    pub fn process_view(&self, pid: Pid) -> Option<ProcessView> {
        self.list(Some(pid)).1.into_iter().next()
    }

    /// Threads of an attached process. `probe`: ask the kernel. Blocking.
    pub fn threads(
        &self,
        pid: Pid,
        only: &[Tid],
        probe: bool,
    ) -> Result<Vec<ThreadView>, WpdError> {
        if !self.procs.contains_key(&pid) {
            return Err(WpdError::NotAttached(pid));
        }
        self.drain_now();
        let mut tids = self.ledger.tids(pid);
        if !only.is_empty() {
            let known: std::collections::HashSet<Tid> = tids.iter().copied().collect();
            if let Some(&t) = only.iter().find(|t| !known.contains(t)) {
                return Err(WpdError::NoSuchThread { pid, tid: t });
            }
            tids = only.to_vec();
        }
        tids.sort_unstable();
        let mut out = Vec::with_capacity(tids.len());
        let states = match (self.procs.get(&pid).map(|p| p.backend), self.ptrace()) {
            (Some(BackendKind::Ptrace), Ok(pt)) => pt.states(pid),
            _ => Default::default(),
        };
        for tid in tids {
            if probe
                && let Ok(perf) = self.perf()
                && let Ok(free) = perf.probe_free_slots(tid, arch::current::SLOTS)
            {
                self.ledger.set_probed(tid, free);
            }
            let Some(row) = self.ledger.get(tid) else {
                continue;
            };
            let slots = (0..arch::current::SLOTS)
                .map(|s| {
                    let bit = 1 << s;
                    if row.ours & bit != 0 {
                        SlotView::Ours(WatchId(row.holder[s]))
                    } else if (row.pending | row.uncertain) & bit != 0 {
                        SlotView::Pending(WatchId(row.holder[s]))
                    } else if row.foreign & bit != 0 {
                        SlotView::Foreign
                    } else if row.retained & bit != 0 {
                        SlotView::Retained
                    } else {
                        SlotView::Free
                    }
                })
                .collect();
            use crate::backend::ptrace::Held;
            let state = match states.get(&tid) {
                Some(st) if st.held == Held::Hit => RunState::StoppedAtHit,
                Some(st) if st.held == Held::Peer => RunState::StoppedByPeer,
                Some(st) if st.group_stopped => RunState::JobStopped,
                _ => RunState::Running,
            };
            out.push(ThreadView {
                tid,
                parent: row.parent,
                slots,
                name: procfs::comm(pid, tid).unwrap_or_default(),
                state,
            });
        }
        Ok(out)
    }

    /// Daemon-wide counters.
    pub fn stats(&self) -> Stats {
        Stats {
            processes: self.procs.len() as u32,
            threads: self.ledger.total_threads() as u64,
            watchpoints: self.watches.len() as u32,
            hits: self.hits.load(Ordering::Relaxed),
            kernel_lost: self.perf.as_ref().map(|p| p.lost()).unwrap_or(0),
            perf_fds: self.perf.as_ref().map(|p| p.open_fds()).unwrap_or(0),
            subscribers: self.bus.subscribers(None) as u32,
            subscriber_dropped: self.bus.dropped(None),
            ledger_hold: self.ledger.hold_summary(),
            uptime: self.started.elapsed(),
        }
    }

    /// The counters one unprivileged caller may see: of the processes
    /// `visible` to it (hits of their current watchpoints) and of its own
    /// subscriptions; daemon-wide figures are left at 0.
    pub fn stats_for(&self, uid: u32, visible: impl Fn(Pid) -> bool) -> Stats {
        let pids: Vec<Pid> = self
            .procs
            .iter()
            .map(|p| p.pid)
            .filter(|&p| visible(p))
            .collect();
        let (mut watchpoints, mut hits) = (0, 0);
        for w in self.watches.iter() {
            if pids.contains(&w.spec.pid) {
                watchpoints += 1;
                hits += w.hits.load(Ordering::Relaxed);
            }
        }
        Stats {
            processes: pids.len() as u32,
            threads: pids
                .iter()
                .map(|&p| self.ledger.thread_count(p) as u64)
                .sum(),
            watchpoints,
            hits,
            subscribers: self.bus.subscribers(Some(uid)) as u32,
            subscriber_dropped: self.bus.dropped(Some(uid)),
            uptime: self.started.elapsed(),
            ..Stats::default()
        }
    }

    // ---------------------------------------------------------------- drain
}

fn holders_of(r: &crate::ledger::ThreadSlots) -> Vec<crate::error::Holder> {
    use crate::error::Holder;
    (0..arch::current::SLOTS)
        .filter_map(|s| {
            let bit = 1 << s;
            if r.ours & bit != 0 {
                Some(Holder::Ours(WatchId(r.holder[s])))
            } else if r.foreign & bit != 0 {
                Some(Holder::Foreign)
            } else if (r.pending | r.uncertain) & bit != 0 {
                Some(Holder::Pending(WatchId(r.holder[s])))
            } else {
                None
            }
        })
        .collect()
}
