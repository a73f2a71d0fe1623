//! What the ptrace backend's facade (`shards.rs`) and its tracer threads
//! (`tracer.rs`) say to each other: the requests a shard takes (`Cmd`),
//! the slot programs and their outcomes, what a tracee's state is listed
//! as, and the callbacks tracers report through (`TraceSink`). Plain types,
//! below both.

use std::sync::mpsc;

use nix::errno::Errno;

use crate::backend::HeldRegisters;
use crate::ledger::Outcome;
use crate::model::{Access, Pid, SlotKey, Tid, WatchLen};

/// What to arm in one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arm {
    /// Watched address.
    pub addr: u64,
    /// Length.
    pub len: WatchLen,
    /// Access kind.
    pub access: Access,
    /// The watchpoint's piece (for DR6 → watchpoint).
    pub key: SlotKey,
}

/// One slot change on one tracee.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotProgram {
    /// Tracee.
    pub tid: Tid,
    /// Debug-register index (0–3), chosen by the ledger.
    pub slot: u8,
    /// What to arm, or `None` to disarm the slot.
    pub arm: Option<Arm>,
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

impl ProgramResult {
    /// What became of the reservation an arming program was for, as the
    /// core settles it.
    pub fn outcome(self) -> Outcome {
        match self {
            ProgramResult::Done => Outcome::Armed(None),
            ProgramResult::Gone => Outcome::Gone,
            ProgramResult::NoSpace => Outcome::NoSpace,
            ProgramResult::Failed(e) => Outcome::Failed(e),
        }
    }
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
    /// Restart it with this signal (the signal action): delivered before
    /// its next instruction.
    Signal(i32),
}

/// Why a tracee is kept stopped by us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// After its own hit (until Resume).
    Hit,
    /// Because another thread of its process hit (until Resume).
    Peer,
    /// At a code event's probe, until the daemon has armed what it names
    /// and resumes it.
    Code,
    /// Parked by `Shards::park` until `Shards::unpark` (the number of
    /// its park, to tell it from earlier ones).
    Parked(u32),
    /// Where its step ended (until Resume or its next step); true: in the
    /// SIGTRAP stop of a single step (`step.rs`).
    Step(bool),
}

/// A tracee's state as listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceeState {
    /// Kept stopped by the daemon, and why.
    pub held: Option<Held>,
    /// In a job-control stop (SIGSTOP & co.).
    pub group_stopped: bool,
    /// Running a leg of a step.
    pub stepping: bool,
}

/// Callbacks from tracer threads into the backend. Called on the tracer
/// thread: they must not block on tracer commands.
pub trait TraceSink: Send + Sync {
    /// A new thread appeared (auto-attached at clone, stopped before its
    /// first instruction). Returns the slots to program before it runs.
    fn thread_started(&self, pid: Pid, tid: Tid, parent: Tid) -> Vec<SlotProgram>;
    /// Result of programming a new thread's slots.
    fn thread_armed(&self, pid: Pid, tid: Tid, results: &[(SlotProgram, ProgramResult)]);
    /// A tracee exited.
    fn thread_exited(&self, pid: Pid, tid: Tid);
    /// A hardware-breakpoint trap: `keys` are the watchpoint pieces of the
    /// slots DR6 names; `regs` the tracee's registers at the stop (`None`:
    /// unreadable). The tracee is stopped while this runs.
    fn hit(
        &self,
        pid: Pid,
        tid: Tid,
        regs: Option<&libc::user_regs_struct>,
        keys: &[SlotKey],
    ) -> HitVerdict;
    /// The process called exec: the kernel cleared the registers.
    fn exec(&self, pid: Pid, tid: Tid);
    /// The thread stopped at code-event probes, with what they recorded.
    /// True: hold it (the daemon resumes it once done); false: it runs on
    /// (what the records asked was done through `armer`, or nothing was).
    fn code_event(
        &self,
        _pid: Pid,
        _tid: Tid,
        _records: &[super::code::CodeRecord],
        _armer: &mut dyn crate::backend::StopArmer,
    ) -> bool {
        false
    }
    /// Objects were freed without a stop (see [`Host::objects_freed`]);
    /// called at a stop of a thread of a process with probes, before its
    /// hits are looked at.
    ///
    /// [`Host::objects_freed`]: crate::backend::Host::objects_freed
    fn objects_freed(
        &self,
        _records: &[super::code::CodeRecord],
        _armer: &mut dyn crate::backend::StopArmer,
    ) {
    }
}

/// A request to a shard.
pub(super) enum Cmd {
    /// Seize these threads of `pid`.
    Seize {
        pid: Pid,
        tids: Vec<Tid>,
        reply: mpsc::Sender<Vec<(Tid, Result<(), Errno>)>>,
    },
    /// Apply these programs (at each tracee's next stop; with `in_place`,
    /// at once on tracees with signal stops, stopped or running).
    Program {
        items: Vec<SlotProgram>,
        in_place: bool,
        reply: mpsc::Sender<Vec<(SlotProgram, ProgramResult)>>,
    },
    /// Restart held tracees of `pid` (all when `tids` is empty).
    Resume {
        pid: Pid,
        tids: Vec<Tid>,
        reply: mpsc::Sender<Vec<Tid>>,
    },
    /// Stop every tracee of `pid` but `except` (a stop-all hit).
    HoldAll { pid: Pid, except: Tid },
    /// Detach every tracee of `pid`; the reply counts them.
    Detach {
        pid: Pid,
        reply: mpsc::Sender<usize>,
    },
    /// List the tracees of `pid`.
    States {
        pid: Pid,
        reply: mpsc::Sender<Vec<(Tid, TraceeState)>>,
    },
    /// Stop and keep stopped; the reply names those stopped. `hold`: keep
    /// them as held peers (until Resume), not parked for a while.
    Park {
        tids: Vec<Tid>,
        hold: bool,
        reply: mpsc::Sender<Vec<Tid>>,
    },
    /// The registers of a held tracee (`None`: not held, or not ours).
    Registers {
        tid: Tid,
        reply: mpsc::Sender<Option<HeldRegisters>>,
    },
    /// Restart parked tracees.
    Unpark { tids: Vec<Tid> },
    /// Run one leg of a step of a held tracee (`step.rs`).
    StepLeg {
        tid: Tid,
        single: bool,
        keys: Vec<u64>,
        reply: mpsc::Sender<crate::backend::step::LegOutcome>,
    },
    /// Its step is over: leave it held in a stop that outlives the daemon.
    StepDone { tid: Tid, reply: mpsc::Sender<()> },
    /// Move a tracee held in the uretprobe trampoline to its return
    /// address.
    LeaveTrampoline {
        tid: Tid,
        ret: u64,
        reply: mpsc::Sender<bool>,
    },
}

/// A leg in flight on a tracee.
#[derive(Debug)]
pub(super) struct Running {
    /// One instruction (`PTRACE_SINGLESTEP`), else run.
    pub(super) single: bool,
    /// Its breakpoints' keys in the step module's map of armed breakpoints.
    pub(super) keys: Vec<u64>,
    pub(super) reply: mpsc::Sender<crate::backend::step::LegOutcome>,
    /// Its single step's trap has come.
    pub(super) trapped: bool,
    /// Its process called exec.
    pub(super) exec: bool,
    /// Signals delivered meanwhile.
    pub(super) signals: Vec<i32>,
}
