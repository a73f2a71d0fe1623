//! What the core hands out: views of watchpoints, processes and threads,
//! counters, and the limits it enforces.

use std::time::Duration;

use crate::backend::RunState;
use crate::ledger::SlotState;
use crate::model::{BackendKind, Pid, Tid, WatchId, WatchSpec};

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
    /// Things the caller should know (e.g. the address is not mapped now).
    pub warnings: Vec<String>,
    /// What its name resolved to (set by name).
    pub symbol: Option<crate::symbols::Resolved>,
    /// Hits its filter did not report, and those its rate limit dropped.
    pub filtered: (u64, u64),
    /// Forked children carrying it now.
    pub forked_children: Vec<Pid>,
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
    /// How its threads are stopped at a hit (backend's words).
    pub stops: String,
}

/// One slot as listed: the ledger's one classification.
pub type SlotView = SlotState;

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
    /// Times the kernel throttled one of the daemon's events.
    pub kernel_throttled: u64,
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
    /// The journal's figures, when there is one (privileged callers).
    pub journal: Option<crate::journal::Figures>,
    /// Code events (object watches, code breakpoints, pending ones).
    pub code_events: u32,
    /// Most kernel memory their probes, programs and sets take, bytes.
    pub code_event_bytes: u64,
    /// Objects armed by code events and what became of them.
    pub objects: super::objects::ObjectCountsView,
}

/// Resource limits (every one has a specific error when reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Watchpoints one caller (uid) may hold at once.
    pub watchpoints_per_caller: usize,
    /// Processes attached at once.
    pub processes: usize,
    /// Processes one caller other than root may have attached at once (of
    /// `processes`, less [`process_reserve`]).
    pub processes_per_caller: usize,
    /// Kernel memory one caller's code events may take (their uprobes,
    /// BPF programs and sets, counted at most), bytes.
    pub code_event_bytes_per_caller: u64,
    /// Event subscribers at once.
    pub subscribers: usize,
    /// Event subscribers one unprivileged caller (uid) may have at once.
    pub subscribers_per_caller: usize,
    /// File descriptors perf events leave free under `RLIMIT_NOFILE` for
    /// connections and the daemon's own files.
    pub fd_headroom: u64,
}

/// Attached processes only root may add (of `processes`): one user's
/// attaches, or their policy's, cannot lock root out. 16, or a quarter of
/// a smaller limit (at least one).
pub fn process_reserve(processes: usize) -> usize {
    (processes / 4).clamp(1, 16)
}

/// Event subscriptions only privileged callers may take (of
/// `Limits::subscribers`): one user's streams cannot lock root out.
pub const SUBSCRIBER_RESERVE: usize = 16;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            watchpoints_per_caller: 4096,
            processes: 1024,
            processes_per_caller: 256,
            code_event_bytes_per_caller: 64 << 20,
            subscribers: 256,
            subscribers_per_caller: 32,
            fd_headroom: 64,
        }
    }
}
