//! Typed domain errors. The RPC layer maps each to one gRPC status
//! (`rpc::status`), exhaustively.

use crate::arch::SpecError;
use crate::model::{BackendKind, Pid, Tid, WatchId};

/// Who holds a slot that a request needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// One of our watchpoints.
    Ours(WatchId),
    /// Someone else: the kernel refused the slot (ENOSPC).
    Foreign,
    /// One of our requests, in flight.
    Pending(WatchId),
    /// Freed by us but still reserved by the kernel until exec or exit
    /// (ptrace-created breakpoint).
    Retained,
}

/// A thread that had no free slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotConflict {
    /// The thread.
    pub tid: Tid,
    /// Who holds its slots.
    pub holders: Vec<Holder>,
}

/// Everything that can go wrong in the daemon, as a client should see it.
#[derive(Debug, thiserror::Error)]
pub enum WpdError {
    /// The watch spec is impossible on this architecture.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A request field is missing or malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// No such process.
    #[error("no process with pid {0}")]
    NoSuchProcess(Pid),
    /// The process exists but is not attached.
    #[error("process {0} is not attached")]
    NotAttached(Pid),
    /// The thread does not exist or belongs to another process.
    #[error("thread {tid} is not a thread of process {pid}")]
    NoSuchThread {
        /// Process asked for.
        pid: Pid,
        /// Thread asked for.
        tid: Tid,
    },
    /// The thread is running; the request needs it held stopped.
    #[error(
        "thread {tid} of process {pid} is running: its registers and stack can be read only \
         while wpd holds it stopped (after a hit with a stop action, or a pause)"
    )]
    NotHeld {
        /// Process.
        pid: Pid,
        /// Thread.
        tid: Tid,
    },
    /// A step the thread cannot take where it is.
    #[error("thread {tid} of process {pid} cannot step there: {why}")]
    CannotStep {
        /// Process.
        pid: Pid,
        /// Thread.
        tid: Tid,
        /// Why.
        why: String,
    },
    /// Unknown watchpoint id.
    #[error("no watchpoint {0}")]
    NoSuchWatchpoint(WatchId),
    /// Some threads have fewer free debug-register slots than the
    /// watchpoint needs; nothing was armed.
    #[error("{}", out_of_slots_message(*pid, *needed, conflicts))]
    OutOfSlots {
        /// Process.
        pid: Pid,
        /// Slots the watchpoint takes on each thread (its pieces).
        needed: usize,
        /// Threads without enough free slots (sorted by tid).
        conflicts: Vec<SlotConflict>,
    },
    /// The caller may not act on this process.
    #[error("permission denied for process {pid}: {detail}")]
    PermissionDenied {
        /// Process.
        pid: Pid,
        /// What refused.
        detail: String,
    },
    /// The backend cannot be used here.
    #[error("backend {backend} is not available: {reason}")]
    BackendUnavailable {
        /// Backend asked for.
        backend: BackendKind,
        /// Why not.
        reason: String,
    },
    /// The process is attached with another backend.
    #[error("process {pid} is attached with backend {attached}, not {asked}: detach first")]
    BackendMismatch {
        /// Process.
        pid: Pid,
        /// Backend in use.
        attached: BackendKind,
        /// Backend asked for.
        asked: BackendKind,
    },
    /// Another tracer (gdb, strace...) already traces a thread.
    #[error("{}", already_traced_message(*pid, *tid, *tracer, *tracer_tid, comm))]
    AlreadyTraced {
        /// Process.
        pid: Pid,
        /// Thread.
        tid: Tid,
        /// Tracer's process id (0: one the caller's pid namespace does not
        /// number).
        tracer: Pid,
        /// Tracer's thread (TracerPid in /proc).
        tracer_tid: Tid,
        /// Tracer's command name.
        comm: String,
    },
    /// A per-caller or daemon-wide limit was reached.
    #[error("limit reached: {what} (limit {limit}); {hint}")]
    LimitReached {
        /// Which limit.
        what: &'static str,
        /// Its value.
        limit: usize,
        /// What to do.
        hint: &'static str,
    },
    /// A caller's code events would take more kernel memory than it may
    /// hold (`--max-code-event-memory-per-caller`).
    #[error(
        "limit reached: kernel memory for code events per caller: this one takes up to {} beside the {} your code events take (limit {}); remove some code events, or bound the live objects of one with a disarming function (--max-live)",
        mib(*needed), mib(*held), mib(*limit)
    )]
    KernelMemory {
        /// Most bytes the new code event takes.
        needed: u64,
        /// Most bytes the caller's code events take now.
        held: u64,
        /// The caller's limit.
        limit: u64,
    },
    /// The fds a request needs (perf events, breakpoints, uprobes and
    /// their BPF programs and maps) would take the fds the daemon keeps
    /// free for connections and its own files, or the kernel said EMFILE.
    /// Nothing was changed.
    #[error(
        "not enough file descriptors: {what} needs {needed} more ({detail}); wpd has {open} fds open, keeps {headroom} free for connections, and RLIMIT_NOFILE is {limit} (nothing was changed). Remove watchpoints or breakpoints, raise wpd's limit (LimitNOFILE= in its service unit, or ulimit -n before starting it), or watch fewer threads"
    )]
    FdLimit {
        /// What was being done ("attach", "this watchpoint", "this code
        /// event").
        what: &'static str,
        /// What the fds are ("10001 threads × 2 CPUs", "a uprobe and its
        /// BPF program").
        detail: String,
        /// Fds it needed.
        needed: u64,
        /// The daemon's open fds, without the request's.
        open: u64,
        /// The daemon's soft `RLIMIT_NOFILE`.
        limit: u64,
        /// Fds kept free for connections and the daemon's own files.
        headroom: u64,
        /// The kernel said EMFILE or ENFILE (else the daemon's own count
        /// of the fds open for callers already showed they could not fit,
        /// and nothing was tried).
        by_kernel: bool,
    },
    /// The daemon cannot serve the request now: it could not tell who the
    /// caller is (out of file descriptors when the connection was
    /// accepted). Reconnect once it can (`wpctl health`).
    #[error("wpd cannot serve this connection: {0}; reconnect once `wpctl health` says serving")]
    Degraded(String),
    /// No caller identity, or a bad or missing token.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The feature needs another backend than the process's.
    #[error("{feature} needs {}{hint}", needs_text(*needs))]
    NeedsBackend {
        /// What was asked for.
        feature: &'static str,
        /// Backend that provides it (none of this daemon's: `None`).
        needs: Option<BackendKind>,
        /// Why, and what to do (starts with "; " or ": ").
        hint: &'static str,
    },
    /// The pid names a thread of another process.
    #[error("{tid} is a thread of process {pid}, not a process: use --pid {pid} --tid {tid}")]
    NotAProcess {
        /// The thread asked for as a process.
        tid: Tid,
        /// Its process.
        pid: Pid,
    },
    /// The daemon does not watch itself (its own hits would feed back).
    #[error("process {0} is the daemon itself: wpd does not watch itself")]
    OwnProcess(Pid),
    /// pid 1 is watched only when asked for explicitly.
    #[error(
        "pid 1 is the init process, whose stop or death takes the system with it: set allow_init (wpctl --allow-init) to watch it anyway"
    )]
    InitProcess,
    /// The caller runs in another pid namespace than the daemon's: its
    /// pids would name other processes (`docs/security.md`).
    #[error("{}", other_pidns_message(*pid, why))]
    OtherPidNamespace {
        /// The pid asked for, as the caller gave it (0: none named).
        pid: Pid,
        /// How the caller's namespace differs.
        why: &'static str,
    },
    /// A caller in a pid namespace nested in the daemon's named a process
    /// its namespace does not have, or one outside it (`docs/security.md`).
    #[error("{}", not_in_pidns_message(*pid))]
    NotInPidNamespace {
        /// The pid as the caller gave it (0: a process named otherwise, by
        /// a watchpoint's id).
        pid: Pid,
    },
    /// A replay was asked of a daemon that keeps no journal.
    #[error(
        "this daemon keeps no journal to replay from: start wpd with --state-dir DIR (it was \
         started with --state-dir none)"
    )]
    NoJournal,
    /// What a request set or removed could not be saved in the state
    /// directory (a full disk, an I/O error): it would not come back after
    /// a restart, so the request is refused.
    #[error("{what} could not be saved in the state directory ({error}): {outcome}")]
    NotSaved {
        /// What was asked ("watchpoint 7", "policy 3", "removing watchpoint 7").
        what: String,
        /// The system's error, with its errno.
        error: String,
        /// What the daemon did about it.
        outcome: &'static str,
    },
    /// The process can no longer be watched; the attachment ended.
    #[error("process {pid} can no longer be watched: {why}")]
    ProcessLost {
        /// Process.
        pid: Pid,
        /// What happened.
        why: String,
    },
    /// A pending code event needs the dynamic linker's debugger hook, and
    /// the process has none (a program no glibc loader runs).
    #[error(
        "a pending code event waits for the dynamic linker to load its module, and process \
         {pid} has no dynamic linker's debugger hook (_dl_debug_state: {detail})"
    )]
    NoLoaderHook {
        /// Process.
        pid: Pid,
        /// Why the hook was not found.
        detail: String,
    },
    /// A name that does not resolve to something watchable.
    #[error("{0}")]
    Symbol(#[from] crate::symbols::SymbolError),
    /// The process exited while the request ran; nothing stays armed.
    #[error("process {0} exited during the request")]
    ProcessExited(Pid),
    /// An unexpected kernel error.
    #[error("{op} failed: {err}")]
    Kernel {
        /// What the daemon was doing.
        op: String,
        /// The errno.
        err: nix::errno::Errno,
    },
    /// A lease ended (its event stream closed) while a request under it
    /// ran; what the request did was undone.
    #[error("lease {lease} ended {during}: {undone}")]
    LeaseEnded {
        /// The lease.
        lease: u64,
        /// When ("during the pause").
        during: &'static str,
        /// What was undone.
        undone: &'static str,
    },
    /// The daemon failed in a way no request causes (a task that
    /// panicked, a journal it cannot read).
    #[error("{0}")]
    Internal(String),
    /// The signal of a signal action cannot reach the process: it ignores
    /// it, or a thread blocks it.
    #[error("{0}")]
    SignalUnusable(String),
    /// State feedback cannot reach the process's fuzzer (why).
    #[error("{0}")]
    NoFeedbackPath(String),
}

impl From<crate::procfs::NotAProcess> for WpdError {
    fn from(e: crate::procfs::NotAProcess) -> Self {
        use crate::procfs::NotAProcess as N;
        match e {
            N::BadPid(_) => WpdError::InvalidArgument(e.to_string()),
            N::Gone(pid) => WpdError::NoSuchProcess(pid),
            N::Thread { tid, pid } => WpdError::NotAProcess { tid, pid },
        }
    }
}

/// `bytes` in MiB, for a message ("0.5 MiB").
fn mib(bytes: u64) -> String {
    let m = bytes as f64 / f64::from(1u32 << 20);
    if m < 10.0 {
        format!("{m:.1} MiB")
    } else {
        format!("{m:.0} MiB")
    }
}

fn needs_text(b: Option<BackendKind>) -> String {
    match b {
        Some(b) => format!("the {b} backend"),
        None => "a backend this daemon does not have".into(),
    }
}

fn out_of_slots_message(pid: Pid, needed: usize, conflicts: &[SlotConflict]) -> String {
    const SHOWN: usize = 8;
    let (n, s_) = (conflicts.len(), if conflicts.len() == 1 { "" } else { "s" });
    let mut s = if needed > 1 {
        format!(
            "out of debug-register slots in process {pid}: the watchpoint takes {needed} slots on every thread and {n} thread{s_} {have} fewer free (nothing was armed):",
            have = if n == 1 { "has" } else { "have" }
        )
    } else {
        format!(
            "out of debug-register slots in process {pid}: {n} thread{s_} cannot take another watchpoint (nothing was armed):"
        )
    };
    // A watchpoint of several pieces holds several slots: named once, with
    // its count.
    fn named(ids: &[WatchId]) -> Vec<String> {
        let mut out: Vec<(WatchId, usize)> = Vec::new();
        for id in ids {
            match out.iter_mut().find(|(i, _)| i == id) {
                Some((_, n)) => *n += 1,
                None => out.push((*id, 1)),
            }
        }
        out.into_iter()
            .map(|(id, n)| {
                if n > 1 {
                    format!("{id} ({n} slots)")
                } else {
                    id.to_string()
                }
            })
            .collect()
    }
    for c in conflicts.iter().take(SHOWN) {
        let mut ours_ids = Vec::new();
        let mut foreign = 0;
        let mut pending_ids = Vec::new();
        let mut retained = 0;
        for h in &c.holders {
            match h {
                Holder::Ours(id) => ours_ids.push(*id),
                Holder::Pending(id) => pending_ids.push(*id),
                Holder::Foreign => foreign += 1,
                Holder::Retained => retained += 1,
            }
        }
        let (ours, pending) = (named(&ours_ids), named(&pending_ids));
        let mut parts = Vec::new();
        if !ours.is_empty() {
            parts.push(format!("watchpoints {}", ours.join(",")));
        }
        if !pending.is_empty() {
            parts.push(format!("requests in flight {}", pending.join(",")));
        }
        if foreign > 0 {
            parts.push(format!(
                "{foreign} held by another owner (debugger or perf)"
            ));
        }
        if retained > 0 {
            parts.push(format!(
                "{retained} still reserved by the kernel for an earlier ptrace breakpoint (freed at exec or exit)"
            ));
        }
        s.push_str(&format!(" tid {} [{}];", c.tid, parts.join(", ")));
    }
    if conflicts.len() > SHOWN {
        s.push_str(&format!(" and {} more threads", conflicts.len() - SHOWN));
    }
    s.trim_end_matches(';').to_string()
}

impl WpdError {
    /// A kernel error during `op`.
    pub fn kernel(op: impl Into<String>, err: nix::errno::Errno) -> Self {
        WpdError::Kernel { op: op.into(), err }
    }
}

fn other_pidns_message(pid: Pid, why: &str) -> String {
    let about = if pid > 0 {
        format!("pid {pid}: ")
    } else {
        String::new()
    };
    format!(
        "{about}the caller runs in another pid namespace than the daemon's, one the daemon \
         cannot number ({why}), so wpd cannot translate the pids it gives or those it would be shown: run the client in the \
         daemon's pid namespace (nsenter --target DAEMON_PID --pid) or in one nested in it (a \
         container), whose pids the daemon translates"
    )
}

fn not_in_pidns_message(pid: Pid) -> String {
    let what = if pid > 0 {
        format!("no process has pid {pid} in the caller's pid namespace")
    } else {
        "the process is not in the caller's pid namespace".to_string()
    };
    format!(
        "{what}: the caller runs in a pid namespace nested in the daemon's, and names only the \
         processes of that namespace and of those below it, by its own numbers"
    )
}

fn already_traced_message(pid: Pid, tid: Tid, tracer: Pid, tracer_tid: Tid, comm: &str) -> String {
    let by = if tracer > 0 {
        format!("process {tracer} ({comm}, thread {tracer_tid})")
    } else {
        format!("a process outside the caller's pid namespace ({comm})")
    };
    format!(
        "thread {tid} of process {pid} is already traced by {by}: detach it first, or use the \
         perf backend"
    )
}
