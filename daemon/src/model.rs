//! Domain types shared by every layer below the RPC boundary.

use std::fmt;

/// Process id (thread-group id).
pub type Pid = i32;
/// Thread id.
pub type Tid = i32;

/// Daemon-wide watchpoint id; never reused while the daemon runs, never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchId(pub u64);

impl fmt::Display for WatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// What kind of access fires a watchpoint. (Read-only does not exist on
/// x86-64; the RPC layer refuses it with an explanation.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Stores.
    Write,
    /// Loads or stores.
    ReadWrite,
    /// Instruction fetch.
    Exec,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::Write => "write",
            Access::ReadWrite => "rw",
            Access::Exec => "exec",
        })
    }
}

/// A watch length the hardware supports (1, 2, 4 or 8 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WatchLen(u8);

impl WatchLen {
    /// `Some` for 1, 2, 4 and 8.
    pub fn new(bytes: u32) -> Option<Self> {
        matches!(bytes, 1 | 2 | 4 | 8).then_some(WatchLen(bytes as u8))
    }
    /// Length in bytes.
    pub fn bytes(self) -> u32 {
        u32::from(self.0)
    }
}

/// How a process's debug registers are programmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// perf_event_open breakpoints.
    Perf,
    /// PTRACE_POKEUSER of the debug registers.
    Ptrace,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Perf => "perf",
            BackendKind::Ptrace => "ptrace",
        })
    }
}

/// Which threads a watchpoint covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every thread, including threads created later.
    Process,
    /// Only these threads (sorted, deduplicated, non-empty).
    Threads(Vec<Tid>),
}

/// What a hit does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HitAction {
    /// Report and continue.
    Log,
    /// Report and hold the hitting thread stopped.
    Stop,
    /// Report and stop every thread of the process.
    StopAll,
}

/// A validated watch request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSpec {
    /// Target process.
    pub pid: Pid,
    /// Threads covered.
    pub scope: Scope,
    /// Start address (aligned to `len`).
    pub addr: u64,
    /// Length.
    pub len: WatchLen,
    /// Access kind.
    pub access: Access,
    /// Backend wanted if the process is not attached yet.
    pub backend: Option<BackendKind>,
    /// What a hit does.
    pub action: HitAction,
    /// Report only hits that changed the value.
    pub only_on_change: bool,
    /// pid 1 may be attached for it.
    pub allow_init: bool,
}
