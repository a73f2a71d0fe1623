//! Domain types shared by every layer below the RPC boundary.

use std::fmt;

pub use crate::range::{Access, Piece, Range, WatchLen};

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

/// How a process's debug registers are programmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// perf_event_open breakpoints.
    Perf,
    /// A tracer stopping the threads at a hit: signal stops (perf
    /// breakpoints signalling the thread) or debug registers written with
    /// PTRACE_POKEUSER.
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
    /// The threads whose name (`comm`) matches, now and later: a thread
    /// joins when it is created or renamed with a matching name, and
    /// leaves when renamed to another.
    Named(ThreadGlob),
}

/// A shell pattern on thread names (`pool-*`, `worker-[0-9]*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadGlob {
    /// As given.
    pub text: String,
    pattern: glob::Pattern,
}

impl ThreadGlob {
    /// Parses `text` (`*`, `?`, `[...]`).
    pub fn new(text: &str) -> Result<ThreadGlob, String> {
        if text.is_empty() || text.len() > 64 {
            return Err(format!(
                "thread_name {text:?}: a pattern of 1 to 64 bytes is needed"
            ));
        }
        let pattern = glob::Pattern::new(text).map_err(|e| format!("thread_name {text:?}: {e}"))?;
        Ok(ThreadGlob {
            text: text.to_string(),
            pattern,
        })
    }

    /// Whether a thread called `name` is covered.
    pub fn matches(&self, name: &str) -> bool {
        self.pattern.matches(name)
    }
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
    /// Report and send the hitting thread this signal at the hit (before
    /// its next instruction).
    Signal(i32),
}

/// What a ledger slot holds: piece `piece` of watchpoint `id`. Packed into
/// one `u64` in the ledger's rows: the id in the low 60 bits, the piece
/// above them, so that piece 0 of `id` packs to `id` itself (ids stay far
/// below 2^60).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotKey {
    /// The logical watchpoint.
    pub id: WatchId,
    /// Which of its pieces.
    pub piece: u8,
}

impl SlotKey {
    const PIECE_SHIFT: u32 = 60;
    const ID_MASK: u64 = (1 << Self::PIECE_SHIFT) - 1;

    /// Piece `piece` of `id`.
    pub fn new(id: WatchId, piece: u8) -> Self {
        SlotKey { id, piece }
    }

    /// The packed form (never 0 for a valid id).
    pub fn pack(self) -> u64 {
        debug_assert!(self.id.0 <= Self::ID_MASK);
        self.id.0 | (u64::from(self.piece) << Self::PIECE_SHIFT)
    }

    /// The key a packed value stands for.
    pub fn unpack(v: u64) -> Self {
        SlotKey {
            id: WatchId(v & Self::ID_MASK),
            piece: (v >> Self::PIECE_SHIFT) as u8,
        }
    }
}

impl From<WatchId> for SlotKey {
    /// Piece 0: the only one of a watchpoint of one slot.
    fn from(id: WatchId) -> Self {
        SlotKey { id, piece: 0 }
    }
}

impl fmt::Display for SlotKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.id, self.piece)
    }
}

/// A validated watch request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSpec {
    /// Target process.
    pub pid: Pid,
    /// Threads covered.
    pub scope: Scope,
    /// The bytes watched, and their pieces.
    pub range: Range,
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
    /// Set by name: the name, and what becomes of it at exec. `range` is
    /// then what the name resolved to (empty until it is resolved).
    pub symbol: Option<ByName>,
    /// Frames of the call chain to capture with each hit (0: none).
    pub backtrace: u8,
    /// Which hits are reported (its condition bound to `value_type` when
    /// the watchpoint is set: `value::bind`).
    pub filter: crate::filter::HitFilter,
    /// The condition as asked, bound again each time the name resolves.
    pub condition: Option<crate::filter::Asked>,
    /// The watched name's type (set by name, with DWARF), as resolved;
    /// values and the condition read as it when it covers the watched
    /// bytes (`ValueType::reads`).
    pub value_type: Option<std::sync::Arc<crate::value::ValueType>>,
    /// The event-stream lease it lives under (0: none). The RPC layer
    /// checks it is the caller's and removes the watchpoint when it ends.
    pub lease: u64,
    /// Reported hits kept for GetRecentHits.
    pub keep_recent: u32,
    /// The policy this watchpoint is an instance of (set by the daemon).
    pub policy: Option<WatchId>,
    /// Forked children inherit it (process-wide, perf backend).
    pub follow_forks: bool,
    /// Aggregate mode: samples streamed per second (`None`: every hit).
    pub aggregate: Option<u32>,
    /// State feedback for a fuzzer (perf backend).
    pub feedback: Option<Feedback>,
}

/// State feedback: the watched values counted in the fuzzer's map by the
/// library preloaded into the program (`feedback/preload`), at each trap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feedback {
    /// How values count.
    pub mode: wpd_feedback_key::Mode,
    /// Another variable joining the key, by name.
    pub with: Option<String>,
    /// The breakpoint's `sig_data` in this process (`wpd_feedback_key::Trap`),
    /// set by the daemon when it arms the watchpoint (the other variable
    /// resolved in the process).
    pub sig_data: Option<u64>,
}

impl WatchSpec {
    /// The type its values read as, if they read as one.
    pub fn reading(&self) -> Option<&std::sync::Arc<crate::value::ValueType>> {
        self.value_type.as_ref().filter(|t| t.reads(&self.range))
    }

    /// Binds the condition asked to the type resolved (`value_type`) and
    /// the range: what the hits are judged by.
    pub fn bind_condition(&mut self) -> Result<(), String> {
        self.filter.condition = match &self.condition {
            None => None,
            Some(asked) => Some(crate::value::bind(
                asked,
                self.value_type.as_deref(),
                &self.range,
                self.symbol.is_some(),
            )?),
        };
        Ok(())
    }
}

/// Hits a watchpoint keeps when its spec says 0.
pub const DEFAULT_KEEP_RECENT: u32 = 16;
/// Most hits a watchpoint may keep.
pub const MAX_KEEP_RECENT: u32 = 4096;

/// A watchpoint set by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByName {
    /// The name expression (`[module:]name[.member][[i]][+off]`).
    pub expr: String,
    /// What becomes of it at exec.
    pub on_exec: ExecPolicy,
    /// The length asked for (0: the object's size).
    pub len: u32,
}

/// What becomes of a watchpoint set by name at exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExecPolicy {
    /// Removed.
    Remove,
    /// Resolved again in the new program and armed there.
    ResolveAgain,
}

/// Most frames a hit's call chain may carry (the kernel's default
/// `perf_event_max_stack`).
pub const MAX_BACKTRACE: u32 = 127;

/// Where a code breakpoint's probe is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BreakPlace {
    /// The function holding it.
    pub function: String,
    /// Its source file ("" without DWARF).
    pub file: String,
    /// Its line (0 without DWARF).
    pub line: u32,
    /// The probed instruction's runtime address.
    pub address: u64,
    /// The module's path.
    pub module: String,
    /// The instruction's offset in the module's file.
    pub offset: u64,
}
