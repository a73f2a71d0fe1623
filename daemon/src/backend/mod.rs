//! Backends: the ways the daemon programs debug registers. One trait,
//! [`Backend`], one implementation per mechanism (`perf/`: perf_event_open
//! breakpoints; `ptrace/`: a traced process whose threads stop at a hit,
//! through signal stops — per-thread perf breakpoints whose BPF program
//! signals the thread — where `bpf()` is allowed, else DR0–DR7 written with
//! PTRACE_POKEUSER; `fake.rs`: an in-memory one for tests without a
//! kernel), and [`Host`], what a backend may see and change of the
//! daemon's state (implemented by the core).
//!
//! The core never asks which backend a process uses: it calls the
//! process's backend through the trait and reads what it can do from
//! [`Features`]. Adding a backend is one more implementation here and one
//! more entry in the core's table (see ARCHITECTURE.md, "Where changes
//! go").
//!
//! Dependencies between backends are explicit: the ptrace backend checks
//! free slots with a [`probe::SlotProbe`] (disabled perf breakpoints), which
//! it is given at start, or runs without.

pub mod exechold;
pub mod fake;
pub mod fanout;
pub mod fds;
pub mod perf;
pub mod probe;
pub mod ptrace;
pub mod step;
pub mod stored;

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use crate::error::SlotConflict;
use crate::error::WpdError;
use crate::events::EventKind;
use crate::ledger::{Ledger, Outcome, Reservation, Retained};
use crate::model::{BackendKind, Pid, Tid, WatchId};
use crate::state::{Job, OpGuard, Process, Watch};

/// What a backend can do beyond arming and reporting hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// Hold the hitting thread (or every thread) stopped until Resume.
    pub stops: bool,
    /// Report only hits that changed the value (compared while stopped).
    pub only_on_change: bool,
    /// A hit's value carries the bytes its store wrote (`backend::stored`,
    /// from the registers at the trap), whatever another thread stored
    /// there before it was read.
    pub exact_values: bool,
    /// Forked children inherit a process-wide watchpoint inside fork().
    pub follow_forks: bool,
    /// Threads chosen by name, joining and leaving as they are renamed
    /// (the backend sees renames, and disarms one thread).
    pub thread_names: bool,
    /// Send the hitting thread a signal at the hit, before its next
    /// instruction (the signal action), with the filter judged there.
    pub signal_at_hit: bool,
    /// Code events: a thread held at a function's entry or return
    /// (a uprobe) until the daemon has armed what it names.
    pub code_events: bool,
    /// Arms a process while another tracer holds it (it does not trace the
    /// process itself): policies hold a program's new processes at their
    /// exec for it (`engine/policy_hold.rs`).
    pub arms_while_traced: bool,
    /// State feedback: a breakpoint that signals the storing thread at the
    /// trap with what the preloaded library needs (perf's `sigtrap`).
    pub feedback: bool,
}

pub use ptrace::code::{
    CodeProbe, CodeRecord, FREED_SWEEP, SET_MAX as CODE_SET_MAX, kernel_bytes as code_probe_bytes,
};

/// What becomes of a thread stopped at code-event probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeHold {
    /// It runs on.
    Run,
    /// It is held.
    Hold,
    /// It is held, and so are the process's other threads (a code
    /// breakpoint that stops every thread).
    HoldAll,
}

/// Where a held thread is stopped: enough to walk its stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRegisters {
    /// Instruction pointer.
    pub ip: u64,
    /// Stack pointer.
    pub sp: u64,
    /// Frame pointer (`rbp`).
    pub fp: u64,
    /// Every general register, by name (the architecture's names).
    pub general: Vec<(&'static str, u64)>,
    /// Held right after its own hit: `ip` follows the accessing
    /// instruction (x86 data breakpoints trap after it), so `ip - 1` is
    /// what to symbolize. Otherwise (stopped by a peer's hit or a Pause)
    /// `ip` is the next instruction to run, possibly a function's first.
    pub after_hit: bool,
}

/// Why a backend cannot be used on this host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// The kernel refused what the backend needs at start.
    #[error("{op} failed ({errno}): {needs}")]
    Kernel {
        /// What was tried.
        op: &'static str,
        /// The errno.
        errno: nix::errno::Errno,
        /// What it needs, and what to do.
        needs: String,
    },
    /// Yama forbids attaching.
    #[error("kernel.yama.ptrace_scope={scope} {why}")]
    Yama {
        /// The scope.
        scope: u32,
        /// What it forbids here.
        why: &'static str,
    },
    /// Not started (configuration, or a test's choice).
    #[error("{0}")]
    Disabled(&'static str),
}

/// A backend's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendStats {
    /// Kernel records lost (perf rings overflowed, the per-thread path's
    /// BPF ring full), reported or not yet.
    pub lost: u64,
    /// Times the kernel throttled one of the backend's events.
    pub throttled: u64,
    /// File descriptors the backend holds for events.
    pub fds: u64,
}

/// Run state of a thread as a backend knows it.
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
    /// Held by us where a step ended.
    StoppedAfterStep,
    /// Stepping (running until its step ends).
    Stepping,
}

/// One way of programming debug registers.
pub trait Backend: Send + Sync {
    /// Which one.
    fn kind(&self) -> BackendKind;

    /// What it can do.
    fn features(&self) -> Features;

    /// What becomes of a slot after one of our watchpoints leaves it: the
    /// ledger's slot policy reads this (ptrace breakpoints keep their slot
    /// reserved in the kernel until the thread exits or execs).
    fn retained(&self) -> Retained;

    /// Starts the backend's own threads, once the host exists.
    fn start(self: Arc<Self>) {}

    /// Hits of watchpoint `id` filtered where they trapped (not seen by the
    /// daemon's filter), if this backend judges them there.
    fn filtered_at_trap(&self, _id: WatchId) -> u64 {
        0
    }

    /// Starts tracking every thread of the locked process, existing and
    /// future ones, registering them in the ledger. On failure nothing stays
    /// behind.
    fn attach(&self, op: &OpGuard<'_>) -> Result<(), WpdError>;

    /// Makes every thread event the kernel has already produced visible in
    /// the ledger (before the core takes a snapshot of a process's threads).
    fn sync(&self) {}

    /// Programs the reserved slots for `watch`, all or nothing, and reports
    /// what became of each reservation; the core settles them in the
    /// ledger (a backend never commits or rolls back). The watch is
    /// registered with the host already, so that threads born meanwhile get
    /// it at birth. A refused arm reports what it left armed as armed (the
    /// core then disarms it, with what threads born meanwhile got) and
    /// what it closed again as not armed.
    fn arm(&self, op: &OpGuard<'_>, watch: &Arc<Watch>, res: &[Reservation]) -> ArmReport;

    /// Removes `watch` from every thread that has it and frees what the
    /// backend held for it. The caller releases the ledger's slots.
    fn disarm(&self, op: &OpGuard<'_>, watch: &Watch);

    /// Removes `watch` from `tids` only (a thread renamed out of a
    /// watchpoint by name); the caller releases their slots. Backends
    /// without [`Features::thread_names`] are never asked.
    fn disarm_threads(&self, _op: &OpGuard<'_>, _watch: &Watch, _tids: &[Tid]) {}

    /// Arms threads that missed a process-wide watchpoint (a thread born
    /// while it was being armed), when the backend can tell. The core calls
    /// it once a process-wide arm is settled, and from its reconcile
    /// thread.
    fn reconcile(&self, _op: &OpGuard<'_>) {}

    /// Stops tracking the process and leaves every thread as it was before
    /// the attach (its watchpoints already disarmed). Never fails: the
    /// target keeps running whatever happens.
    fn detach(&self, proc: &Arc<Process>);

    /// Run states of the process's threads, where the backend changes them
    /// (threads not listed run normally).
    fn thread_states(&self, _pid: Pid) -> HashMap<Tid, RunState> {
        HashMap::new()
    }

    /// Opens a code event's probe on the attached process `pid`.
    fn open_code_probe(&self, _pid: Pid, _probe: &CodeProbe) -> Result<(), WpdError> {
        Err(WpdError::NeedsBackend {
            feature: "code events",
            needs: None,
            hint: ": this process's backend cannot hold a thread at a probe",
        })
    }

    /// Closes `pid`'s code-event probes of key `key` (every one: `None`).
    fn close_code_probes(&self, _pid: Pid, _keys: Option<&[u64]>) {}

    /// Adds `base` with `value` (a watchpoint id, then its breakpoints'
    /// addresses) to (or removes it from) the first-argument set of the
    /// filtered probe of key `key` (none: nothing to do). False: the set
    /// did not take it.
    fn code_probe_member(&self, _key: u64, _base: u64, _value: &[u64], _member: bool) -> bool {
        true
    }

    /// Takes `addrs` out of `pid`'s muted addresses (the breakpoints of a
    /// freed object closed, or a new object about to be armed there).
    fn unmute(&self, _pid: Pid, _addrs: &[u64]) {}

    /// The records of disarming probes' calls that stopped no one, not yet
    /// read at a stop (see `ptrace::code`), oldest first; with `aged_only`,
    /// those a previous call already saw.
    fn take_freed(&self, _aged_only: bool) -> Vec<CodeRecord> {
        Vec::new()
    }

    /// Lets held threads of `pid` run again (all held ones when `tids` is
    /// empty); returns those resumed.
    fn resume(&self, _pid: Pid, _tids: &[Tid]) -> Result<Vec<Tid>, WpdError> {
        Err(WpdError::NeedsBackend {
            feature: "resuming threads",
            needs: None,
            hint: ": this process's backend never stops threads (nothing to resume)",
        })
    }

    /// Stops threads of `pid` (every tracked one when `tids` is empty) and
    /// holds them until resumed, as a stop-all hit holds its peers; returns
    /// those held once they are.
    fn pause(&self, _pid: Pid, _tids: &[Tid]) -> Result<Vec<Tid>, WpdError> {
        Err(WpdError::NeedsBackend {
            feature: "pausing threads",
            needs: None,
            hint: ": this process's backend never stops threads",
        })
    }

    /// Runs one leg of a step of held thread `tid` (see `step.rs`) and
    /// waits for its end; `cancel` set meanwhile stops the thread where it
    /// is (the leg then ends `Interrupted`); `running` is called as the
    /// thread is set running (its internal breakpoints set).
    fn step_leg(
        &self,
        _pid: Pid,
        _tid: Tid,
        _leg: &step::Leg,
        _cancel: &std::sync::atomic::AtomicBool,
        _running: &dyn Fn(),
    ) -> Result<step::LegOutcome, WpdError> {
        Err(WpdError::NeedsBackend {
            feature: "stepping",
            needs: None,
            hint: ": this process's backend never stops threads",
        })
    }

    /// The step of held thread `tid` is over: it stays held, in a stop
    /// that outlives the daemon (kernel-facts §22).
    fn step_done(&self, _pid: Pid, _tid: Tid) {}

    /// Held thread `tid` stopped in the kernel's uretprobe trampoline:
    /// moved on to return address `ret` without running (kernel-facts
    /// §22). False: it could not be (single-step it out).
    fn leave_trampoline(&self, _pid: Pid, _tid: Tid, _ret: u64) -> bool {
        false
    }

    /// The registers of a thread this backend holds stopped.
    fn held_registers(&self, pid: Pid, tid: Tid) -> Result<HeldRegisters, WpdError> {
        Err(WpdError::NotHeld { pid, tid })
    }

    /// How this backend stops threads at a hit, for processes attached
    /// from now on (empty: it never stops them).
    fn stops(&self) -> String {
        String::new()
    }

    /// How this backend's breakpoints are opened and its hits read
    /// (empty where there is only one way).
    fn events(&self) -> String {
        String::new()
    }

    /// How code events are caught and held here (empty: not at all).
    fn code_events(&self) -> String {
        String::new()
    }

    /// How the threads of attached process `pid` are stopped at a hit.
    fn stops_of(&self, _pid: Pid) -> String {
        String::new()
    }

    /// Counters.
    fn stats(&self) -> BackendStats {
        BackendStats::default()
    }

    /// Gives back spare memory after a large process went away.
    fn compact(&self) {}

    /// The daemon is stopping: end the backend's threads.
    fn shutdown(&self) {}
}

/// What [`Backend::arm`] did with the reservations it was handed.
#[derive(Debug)]
pub struct ArmReport {
    /// Each reservation, with what became of it: every one of the arm's.
    pub outcomes: Vec<(Reservation, Outcome)>,
    /// Why the arm was refused as a whole, when not for the kernel's
    /// ENOSPC (the fd budget, a permission, another errno); it wins over
    /// an ENOSPC, whose refusal the core writes from the ledger.
    pub refused: Option<WpdError>,
}

impl ArmReport {
    /// Nothing was tried: every reservation goes back, the arm refused for
    /// `why`.
    pub fn refused(res: &[Reservation], why: WpdError) -> ArmReport {
        ArmReport {
            outcomes: res.iter().map(|&r| (r, Outcome::NotArmed)).collect(),
            refused: Some(why),
        }
    }
}

/// Slots programmed at a code event's stop by the thread that holds the
/// stopped thread (the ptrace backend's tracer): no park, no free-slot
/// probe, no round trip to another thread. Only threads it [`reaches`]
/// are programmed; the core falls back to an ordinary arm for the others.
///
/// [`reaches`]: StopArmer::reaches
pub trait StopArmer {
    /// Whether `tid`'s slots can be programmed from here, now.
    fn reaches(&self, tid: Tid) -> bool;
    /// Arms each reservation with its piece of `watch`: what became of
    /// each (the core settles them).
    fn arm(&mut self, watch: &Watch, res: &[Reservation]) -> Vec<(Reservation, Outcome)>;
    /// Clears these slots (tid, slot).
    fn clear(&mut self, slots: &[(Tid, u8)]);
}

/// What a backend may see and change of the daemon's state. Implemented by
/// the core; backends hold it weakly (the core owns them).
pub trait Host: Send + Sync {
    /// The slot ledger: threads come and go there, rows are read; slots
    /// are reserved and settled through the two methods below.
    fn ledger(&self) -> &Ledger;
    /// Reserves on thread `tid` a slot for each piece of `w` it lacks
    /// (all of them or none), appended to `out`, for a backend arming a
    /// thread outside [`Backend::arm`] (a new thread, one that did not
    /// inherit): see `Ledger::reserve`. What became of them is then
    /// reported with [`Host::settle`].
    fn reserve_thread(
        &self,
        tid: Tid,
        w: &Watch,
        inheritable: bool,
        retained: Retained,
        out: &mut Vec<Reservation>,
    ) -> Result<(), SlotConflict>;
    /// What became of reservations made with [`Host::reserve_thread`]:
    /// committed, marked foreign or given back.
    fn settle(&self, report: &[(Reservation, Outcome)]);
    /// Publishes an event to subscribers.
    fn publish(&self, ev: EventKind);
    /// Runs `f`, whose events are published as one burst (the journal's
    /// writer is woken at its end, not at its first event).
    fn burst(&self, f: &mut dyn FnMut()) {
        f()
    }
    /// A watchpoint, if it still exists.
    fn watch(&self, id: WatchId) -> Option<Arc<Watch>>;
    /// An attached process.
    fn process(&self, pid: Pid) -> Option<Arc<Process>>;
    /// Hands work to the core's reconcile thread.
    fn schedule(&self, job: Job);
    /// Counts a hit of `w` (daemon-wide and per watchpoint).
    fn count_hit(&self, w: &Watch);
    /// Thread `tid` of `pid` is now called `name` (a rename or an exec),
    /// where the backend sees it.
    fn renamed(&self, _pid: Pid, _tid: Tid, _name: &str) {}
    /// Whether `pid` has watchpoints on threads by name (the backend then
    /// reports its new and renamed threads with `Job::Named`).
    fn has_named(&self, _pid: Pid) -> bool {
        false
    }
    /// The callers of a stopped thread of `pid` at `(ip, sp, fp)`, up to
    /// `depth`, unwound with its modules' call frame information; `read`
    /// gives the 8 bytes at an address. `None`: the host cannot (the
    /// backend then follows frame pointers).
    fn unwind(
        &self,
        _pid: Pid,
        _regs: (u64, u64, u64),
        _depth: usize,
        _read: &mut dyn FnMut(u64) -> Option<u64>,
    ) -> Option<(Vec<u64>, Option<&'static str>)> {
        None
    }
    /// Where the function holding the code address `pc` of `pid` starts
    /// (its symbol, else its call frame information entry), to read its
    /// instructions from. `None`: not known.
    /// Waits at most `wait` for its module's file to load.
    fn function_start(&self, _pid: Pid, _pc: u64, _wait: std::time::Duration) -> Option<u64> {
        None
    }
    /// A process started (fork) or called exec, at kernel monotonic ns
    /// `at`: the backend saw it in a system-wide record (policies check it).
    fn process_started(&self, _pid: Pid, _at: u64) {}
    /// Process `pid` was forked by `ppid` at `at` and carries the
    /// watchpoints `carried` from birth (the kernel copied them inside
    /// `fork()`, `follow_forks`): it is covered, not a new process to
    /// attach (policies skip it until it calls exec).
    fn process_forked(&self, _pid: Pid, _ppid: Pid, _carried: &[WatchId], _at: u64) {}
    /// A forked child reported by [`Host::process_forked`] exited or called
    /// exec: it carries nothing any more.
    fn forked_child_gone(&self, _pid: Pid) {}
    /// A thread stopped at code-event probes: hold it until the daemon has
    /// armed what they name (it then resumes it) or until a Resume (a code
    /// breakpoint), and with it the process's other threads, or let it run.
    /// What can be armed or disarmed before the thread runs on is done
    /// through `armer`, on the tracer thread that holds it.
    fn code_event(
        &self,
        _pid: Pid,
        _tid: Tid,
        _records: &[CodeRecord],
        _armer: &mut dyn StopArmer,
    ) -> CodeHold {
        CodeHold::Run
    }
    /// Objects were freed (records of disarming probes that stopped no
    /// one, `CodeRecord::freed`): their watchpoints are taken off, through
    /// `armer` where it reaches their threads (the tracer of a stopped
    /// thread, before that stop's hits are looked at), else by the
    /// daemon's objects thread; until then their hits are not reported.
    fn objects_freed(&self, _records: &[CodeRecord], _armer: Option<&mut dyn StopArmer>) {}
    /// Whether anyone wants [`Host::process_started`] calls (the backend
    /// then reads its system-wide records promptly).
    fn wants_processes(&self) -> bool {
        false
    }
    /// The current program image of `pid`, for its hits.
    fn image(&self, pid: Pid) -> Option<Arc<crate::symbols::Image>> {
        self.process(pid).map(|p| p.image())
    }
}

impl<'a> dyn Host + 'a {
    /// The process-wide watchpoints of `pid`.
    pub fn wide_watches(&self, pid: Pid) -> Vec<Arc<Watch>> {
        let Some(proc) = self.process(pid) else {
            return Vec::new();
        };
        proc.watch_ids()
            .into_iter()
            .filter_map(|id| self.watch(id))
            .filter(|w| w.process_wide)
            .collect()
    }
}

/// How the system's backends are set up (the daemon's flags).
#[derive(Debug, Clone)]
pub struct SystemOptions {
    /// The ptrace backend's state file (`--ptrace-state-file`).
    pub state_file: std::path::PathBuf,
    /// How the perf backend opens breakpoints (`--perf-events`).
    pub perf_events: perf::EventsPolicy,
    /// Size of the perf backend's rings in KiB (`--perf-ring-kib`).
    pub perf_ring_kib: Option<u32>,
    /// How the ptrace backend stops threads (`--ptrace-stops`).
    pub ptrace_stops: ptrace::signal_bp::Policy,
    /// Tracer threads of the ptrace backend (default 4).
    pub ptrace_shards: Option<usize>,
    /// Fault injection for the crash tests: a tracer thread panics at its
    /// Nth hit, as a bug would (`WPD_FAULT_PANIC_AT_HIT`).
    pub fault_panic_at_hit: Option<u64>,
}

impl SystemOptions {
    /// The defaults, with the state file at `state_file`.
    pub fn with_state_file(state_file: std::path::PathBuf) -> Self {
        SystemOptions {
            state_file,
            perf_events: perf::EventsPolicy::Auto,
            perf_ring_kib: None,
            ptrace_stops: ptrace::signal_bp::Policy::Auto,
            ptrace_shards: None,
            fault_panic_at_hit: None,
        }
    }
}

/// The backends the daemon runs, by kind, with what each can do and why it
/// cannot be used where it cannot.
pub struct BackendTable {
    entries: Vec<Entry>,
    default: BackendKind,
    /// The fds every backend opens for callers.
    fds: Arc<fds::FdBudget>,
}

/// One backend of the table.
pub struct Entry {
    /// Which one.
    pub kind: BackendKind,
    /// What it can do (known even when it cannot run here).
    pub features: Features,
    /// The running backend, or why it does not run.
    pub backend: Result<Arc<dyn Backend>, Unavailable>,
}

impl std::fmt::Debug for BackendTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| (e.kind, e.backend.is_ok())))
            .finish()
    }
}

/// Whether a backend can be used on this host, and why not.
#[derive(Debug, Clone)]
pub struct Availability {
    /// The backend.
    pub kind: BackendKind,
    /// Usable here.
    pub usable: bool,
    /// Why not (empty when usable).
    pub reason: String,
    /// Used when a request names none.
    pub is_default: bool,
    /// How it stops threads at a hit (see [`Backend::stops`]).
    pub stops: String,
    /// How its events are opened (see [`Backend::events`]).
    pub events: String,
    /// How code events are held (see [`Backend::code_events`]).
    pub code_events: String,
    /// How a policy's new processes are armed: held at their exec, or
    /// found after it, with why.
    pub new_processes: String,
}

/// How a backend with `features` arms a policy's new processes.
fn new_processes(features: &Features) -> String {
    const LATE: &str = "found after their exec (the kernel's exec records, a /proc scan) and \
                        armed a few milliseconds later";
    if !features.arms_while_traced {
        return format!(
            "{LATE}: this backend's tracer attaches each process itself, and cannot take \
             over one held at its exec"
        );
    }
    match exechold::available() {
        Ok(()) => "held at exec, before their first instruction, until armed (fanotify \
                   + ptrace, at most 1 s): every process of a policy by executable; a policy \
                   by command name or cgroup holds the programs it has seen or finds on PATH, \
                   and a program's first process found otherwise is armed after its exec"
            .into(),
        Err(e) => format!(
            "{LATE}: holding them at exec needs fanotify's permission events \
             (CAP_SYS_ADMIN): {e}"
        ),
    }
}

impl BackendTable {
    /// The kernel's backends, each where it can run: perf (the default) and
    /// ptrace (given the free-slot probe and its state file).
    pub fn system(
        host: Weak<dyn Host>,
        probe: Option<Arc<probe::SlotProbe>>,
        fd_headroom: u64,
        opts: &SystemOptions,
    ) -> BackendTable {
        // One budget for every fd opened for a caller, whichever backend
        // opens it: the headroom is the daemon's, not a backend's.
        let fds = fds::FdBudget::new(fd_headroom);
        let perf = perf::PerfEngine::new(host.clone(), probe.clone(), fds.clone(), opts)
            .map(|p| Arc::new(p) as Arc<dyn Backend>);
        if let Err(e) = &perf {
            tracing::warn!("perf backend: {e}");
        }
        let ptrace = ptrace::PtraceEngine::new(host, probe, fds.clone(), opts)
            .map(|p| p as Arc<dyn Backend>);
        if let Err(e) = &ptrace {
            tracing::warn!("ptrace backend: {e}");
        }
        // Perf where it runs (nothing of it outlives the daemon, and the
        // target never stops); else ptrace where it stops threads with
        // signals (nothing of it outlives the daemon either). A ptrace that
        // pokes debug registers is never the default: a daemon killed with
        // a hit in flight kills the program (kernel-facts §25.6); a request
        // naming no backend is refused with why perf cannot run (an
        // ordinary user's locked-memory budget spent, say), and the ptrace
        // backend is there for one that names it.
        let default = match (&perf, &ptrace) {
            (Err(e), Ok(p)) if p.stops() == "signal" => {
                tracing::warn!("default backend: ptrace (the perf backend cannot run here: {e})");
                BackendKind::Ptrace
            }
            (Err(e), Ok(p)) => {
                tracing::warn!(
                    "no default backend: perf cannot run here ({e}), and ptrace would stop \
                     threads with debug registers ({}), which a killed daemon leaves armed: \
                     requests must name --backend ptrace",
                    p.stops()
                );
                BackendKind::Perf
            }
            _ => BackendKind::Perf,
        };
        let perf_features = perf
            .as_ref()
            .map(|b| b.features())
            .unwrap_or(perf::PerfEngine::FEATURES);
        BackendTable::new(
            vec![
                Entry {
                    kind: BackendKind::Perf,
                    features: perf_features,
                    backend: perf,
                },
                Entry {
                    kind: BackendKind::Ptrace,
                    features: ptrace::PtraceEngine::FEATURES,
                    backend: ptrace,
                },
            ],
            default,
            fds,
        )
    }

    /// Only the in-memory fake (as perf, the default), over `kernel` (with
    /// what it can do: [`fake::FakeKernel::features`]); ptrace listed as
    /// not started.
    pub fn fake(host: Weak<dyn Host>, kernel: Arc<fake::FakeKernel>) -> BackendTable {
        BackendTable::new(
            vec![
                Entry {
                    kind: BackendKind::Perf,
                    features: kernel.features(),
                    backend: Ok(Arc::new(fake::FakeBackend::new(host, kernel))),
                },
                Entry {
                    kind: BackendKind::Ptrace,
                    features: ptrace::PtraceEngine::FEATURES,
                    backend: Err(Unavailable::Disabled(
                        "not started: this daemon runs the in-memory fake backend",
                    )),
                },
            ],
            BackendKind::Perf,
            fds::FdBudget::new(0),
        )
    }

    /// A table; `default` is used when a request names no backend.
    pub fn new(entries: Vec<Entry>, default: BackendKind, fds: Arc<fds::FdBudget>) -> Self {
        BackendTable {
            entries,
            default,
            fds,
        }
    }

    /// The daemon's fd budget, every backend's.
    pub fn fds(&self) -> &fds::FdBudget {
        &self.fds
    }

    /// The backend of `kind` (the default when `None`), or why it is not
    /// available.
    pub fn get(&self, kind: Option<BackendKind>) -> Result<&Arc<dyn Backend>, WpdError> {
        let kind = kind.unwrap_or(self.default);
        match self.entries.iter().find(|e| e.kind == kind) {
            Some(Entry { backend: Ok(b), .. }) => Ok(b),
            Some(Entry {
                backend: Err(why), ..
            }) => Err(WpdError::BackendUnavailable {
                backend: kind,
                reason: why.to_string(),
            }),
            None => Err(WpdError::BackendUnavailable {
                backend: kind,
                reason: "not built into this daemon".into(),
            }),
        }
    }

    /// The features of `kind` (the default when `None`), whether or not it
    /// runs here.
    pub fn features(&self, kind: Option<BackendKind>) -> Option<Features> {
        let kind = kind.unwrap_or(self.default);
        self.entries
            .iter()
            .find(|e| e.kind == kind)
            .map(|e| e.features)
    }

    /// The kind used when a request names none.
    pub fn default_kind(&self) -> BackendKind {
        self.default
    }

    /// Every usable backend.
    pub fn usable(&self) -> impl Iterator<Item = &Arc<dyn Backend>> {
        self.entries.iter().filter_map(|e| e.backend.as_ref().ok())
    }

    /// A backend that has `feature`, usable ones first (for the error that
    /// names it).
    pub fn with_feature(&self, feature: impl Fn(&Features) -> bool) -> Option<BackendKind> {
        let mut with: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| feature(&e.features))
            .collect();
        with.sort_by_key(|e| e.backend.is_err());
        with.first().map(|e| e.kind)
    }

    /// Each backend and whether it is usable.
    pub fn availability(&self) -> Vec<Availability> {
        self.entries
            .iter()
            .map(|e| Availability {
                kind: e.kind,
                usable: e.backend.is_ok(),
                reason: e
                    .backend
                    .as_ref()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default(),
                is_default: e.kind == self.default,
                stops: e.backend.as_ref().map(|b| b.stops()).unwrap_or_default(),
                events: e.backend.as_ref().map(|b| b.events()).unwrap_or_default(),
                code_events: e
                    .backend
                    .as_ref()
                    .map(|b| b.code_events())
                    .unwrap_or_default(),
                new_processes: new_processes(&e.features),
            })
            .collect()
    }
}
