//! The daemon's state that the core and the backends share: attached
//! processes, watchpoints, the proof that a process's operation lock is
//! held, and the work the core's reconcile thread does for backends.
//!
//! Locking rules (a process's `op` lock):
//! 1. `Process::op` serialises arm, disarm, reconcile and detach passes of
//!    one process. It is taken only on blocking threads (the RPC layer's
//!    blocking pool, the reconcile thread), never on a tracer shard, the
//!    drain thread or a tokio worker, and never across `.await`.
//! 2. Whoever needs it held takes an [`OpGuard`] ([`Process::lock_op`]);
//!    functions that need it take `&OpGuard` instead of a comment saying
//!    so.
//! 3. The ledger's guards may be taken while it is held, never the reverse.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::model::{BackendKind, Pid, WatchId, WatchSpec};

/// An attached process.
#[derive(Debug)]
pub struct Process {
    /// Process id.
    pub pid: Pid,
    /// Backend programming it.
    pub backend: BackendKind,
    /// The caller (uid) whose request attached it, or whose policy did: it
    /// counts against that caller's share of `--max-processes`.
    pub attached_by: u32,
    /// When it was attached (Unix ns).
    pub attached_at_ns: u64,
    /// Command name at attach time (listings read the current one).
    pub comm: String,
    /// Start time (`/proc/PID/stat` field 22), to tell the process from a
    /// later one with the same pid (0 if unknown).
    pub start_time: u64,
    /// Its credentials at attach (uids, gids, permitted capabilities): an
    /// exec that changes them (a setuid or setgid program, file
    /// capabilities) ends the attachment.
    pub creds: Option<([u32; 3], [u32; 3], u64)>,
    /// Its identity and owner, carried by every event about it (who may
    /// see an event is decided on it).
    pub owner: Arc<crate::events::Owner>,
    /// Ids of its watchpoints.
    pub watches: Mutex<BTreeSet<WatchId>>,
    /// Serialises arm/disarm passes of this process (rule 1 above).
    op: Mutex<()>,
    /// Set once detached, exited or lost.
    pub gone: AtomicBool,
    /// Task watching the pidfd for process exit.
    pub exit_watch: Mutex<Option<tokio::task::AbortHandle>>,
    /// Its current program's image, for symbolizing its hits (a new one at
    /// each exec).
    image: Mutex<Arc<crate::symbols::Image>>,
}

/// The identity and owner of process `pid` now. Unknown credentials (a
/// process being torn down) make an owner nobody but privileged callers
/// matches (uid `u32::MAX`, not dumpable).
pub fn owner_of(pid: Pid) -> crate::events::Owner {
    let start_time = crate::procfs::start_time(pid).unwrap_or(0);
    owner_from(
        start_time,
        crate::authz::TargetFacts::read_with(pid, false).as_ref(),
    )
}

/// The owner a process's facts make.
fn owner_from(start_time: u64, facts: Option<&crate::authz::TargetFacts>) -> crate::events::Owner {
    match facts {
        Some(f) => crate::events::Owner {
            start_time,
            uids: f.uids,
            gids: f.gids,
            dumpable: f.dumpable != crate::authz::Dumpable::No,
        },
        None => crate::events::Owner {
            start_time,
            uids: [u32::MAX; 3],
            gids: [u32::MAX; 3],
            dumpable: false,
        },
    }
}

impl Process {
    /// A process being attached now.
    pub fn new(pid: Pid, backend: BackendKind, attached_by: u32) -> Process {
        // One read of each file: attaching is on an exec's way when a
        // policy holds it (`/proc` reads cost 15-30 µs each here).
        let start_time = crate::procfs::start_time(pid).unwrap_or(0);
        let facts = crate::authz::TargetFacts::read_with(pid, false);
        Process {
            pid,
            backend,
            attached_by,
            attached_at_ns: crate::clock::realtime_ns(),
            comm: crate::procfs::comm(pid, pid).unwrap_or_default(),
            start_time,
            creds: facts.as_ref().map(|f| (f.uids, f.gids, f.cap_prm)),
            owner: Arc::new(owner_from(start_time, facts.as_ref())),
            watches: Mutex::new(BTreeSet::new()),
            op: Mutex::new(()),
            gone: AtomicBool::new(false),
            exit_watch: Mutex::new(None),
            image: Mutex::new(crate::symbols::Image::new(pid)),
        }
    }

    /// The current program's image.
    pub fn image(&self) -> Arc<crate::symbols::Image> {
        self.image.lock().unwrap().clone()
    }

    /// The process called exec: a new image (hits already published keep
    /// the old one).
    pub fn new_image(&self) {
        let mut i = self.image.lock().unwrap();
        i.retire();
        *i = crate::symbols::Image::new(self.pid);
    }

    /// The process is let go of: its image reads nothing more.
    pub fn retire_image(&self) {
        self.image.lock().unwrap().retire();
    }

    /// Takes the process's operation lock (blocking threads only).
    pub fn lock_op(self: &Arc<Self>) -> OpGuard<'_> {
        OpGuard {
            proc: self,
            _held: self.op.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Takes the process's operation lock if nobody holds it (a tracer
    /// thread, which must never wait for an operation that may be waiting
    /// for it).
    pub fn try_lock_op(self: &Arc<Self>) -> Option<OpGuard<'_>> {
        let held = match self.op.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(OpGuard {
            proc: self,
            _held: held,
        })
    }

    /// Detached, exited or lost.
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    /// Its watchpoints' ids now.
    pub fn watch_ids(&self) -> Vec<WatchId> {
        self.watches.lock().unwrap().iter().copied().collect()
    }
}

/// Proof that the caller holds a process's operation lock: arm, disarm,
/// reconcile and detach passes take it as an argument.
#[derive(Debug)]
pub struct OpGuard<'a> {
    proc: &'a Arc<Process>,
    _held: MutexGuard<'a, ()>,
}

impl OpGuard<'_> {
    /// The locked process.
    pub fn process(&self) -> &Arc<Process> {
        self.proc
    }

    /// Its pid.
    pub fn pid(&self) -> Pid {
        self.proc.pid
    }
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
    pub last_value: Mutex<Option<Vec<u8>>>,
    /// Backend holding it.
    pub backend: BackendKind,
    /// uid of the caller that set it (for per-caller limits).
    pub owner: u32,
    /// What its name resolved to (set by name).
    pub resolved: Option<crate::symbols::Resolved>,
    /// Its filter's counts.
    pub filter: crate::filter::FilterState,
    /// Its last reported hits, oldest first (at most `spec.keep_recent`).
    pub recent: Mutex<std::collections::VecDeque<Arc<crate::events::Event>>>,
    /// Forked children carrying it now (`spec.follow_forks`): pid → when
    /// the kernel forked it (its FORK record's time); removed at its exit
    /// or exec, so it holds the live children only.
    pub forked: Mutex<std::collections::BTreeMap<Pid, u64>>,
    /// Forked children that carried it since it was set.
    pub forked_total: std::sync::atomic::AtomicU64,
    /// Aggregate mode's table (`spec.aggregate`).
    pub aggregates: Option<crate::aggregate::Aggregates>,
    /// The watchpoint of one object of an object watch (`engine/objects/`):
    /// a backend may program it without stopping the threads where it can
    /// (ptrace with signal stops); its refusals are counted, not reported.
    pub object: bool,
    /// The object of an object watch's watchpoint was freed: its hits are
    /// no longer reported while its breakpoints are being closed.
    pub freed: std::sync::atomic::AtomicBool,
}

impl Watch {
    /// Keeps `ev`, one of its hits, dropping the oldest beyond the limit.
    pub fn remember(&self, ev: Arc<crate::events::Event>) {
        let mut r = self.recent.lock().unwrap();
        if r.len() >= self.spec.keep_recent as usize {
            r.pop_front();
        }
        if self.spec.keep_recent > 0 {
            r.push_back(ev);
        }
    }
}

/// Work for the core's reconcile thread: it may take a process's `op`
/// lock, which tracer shards and the drain thread must never do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Job {
    /// Threads of the process may lack a process-wide watchpoint: the
    /// backend arms them ([`crate::backend::Backend::reconcile`]).
    Reconcile(Pid),
    /// The process called exec: its breakpoints are gone.
    Exec(Pid),
    /// The backend tracks no thread of the process any more: if the process
    /// lives on, the kernel took our events off it.
    CheckLost(Pid),
    /// Watchpoints set by name wait to be resolved again after an exec.
    Resolve(Pid),
    /// A thread was created or renamed: watchpoints on threads by name
    /// take it or let it go.
    Named(Pid, crate::model::Tid),
    /// The backend can no longer watch the process as it was set up: the
    /// attachment ends with `ProcessLost`, saying why.
    Lose(Pid, LostBecause),
}

/// Why a backend can no longer watch a process ([`Job::Lose`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LostBecause {
    /// The program installed a handler for the signal its stops send
    /// (signal number).
    SignalCaught(i32),
    /// A thread of the program blocks the signal its stops send (signal
    /// number, thread).
    SignalBlocked(i32, crate::model::Tid),
}

impl std::fmt::Display for LostBecause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = |n: i32| {
            nix::sys::signal::Signal::try_from(n)
                .map_or_else(|_| format!("signal {n}"), |s| s.to_string())
        };
        match self {
            LostBecause::SignalCaught(s) => write!(
                f,
                "the program installed a handler for {}, the signal wpd's stops on it send: its \
                 own {} would be taken for stops; watch it again (another signal is chosen)",
                name(*s),
                name(*s)
            ),
            LostBecause::SignalBlocked(s, tid) => write!(
                f,
                "thread {tid} of the program blocks {}, the signal wpd's stops on it send: its \
                 hits would be lost; watch it again (another signal is chosen)",
                name(*s)
            ),
        }
    }
}

/// Shared pointer to a watchpoint.
pub type WatchRef = Arc<Watch>;
