//! What the core asks of a backend to step a held thread, one *leg* at a
//! time: run it one machine instruction (`Leg::Instruction`), or let it
//! run until one of the internal breakpoints of the leg is reached
//! (`Leg::Run`: code breakpoints at file offsets, each with the least
//! stack pointer at which it counts, so that a deeper activation of the
//! same code, in recursion, passes through). Which legs make a step
//! (next, step in, step out) is the core's (`engine/step.rs`).

use std::path::PathBuf;

/// Internal breakpoints in one module file, set for one leg.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSet {
    /// The file, as the daemon opens it (`/proc/PID/root/...`).
    pub path: PathBuf,
    /// The instructions' file offsets.
    pub offsets: Vec<u64>,
    /// At the return of the function whose first instruction is at the
    /// (one) offset (a uretprobe), rather than at the instructions.
    pub ret: bool,
    /// The thread's stack pointer must be at least this there.
    pub min_sp: u64,
}

/// One leg of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leg {
    /// One machine instruction (the trap flag).
    Instruction,
    /// Run until one of these is reached (a uprobe's stop comes after the
    /// probed instruction ran; a return probe's, at the return address).
    Run(Vec<ProbeSet>),
}

/// How a leg ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LegEnd {
    /// Its instruction ran, or one of its breakpoints was reached (at this
    /// probed address, the return address for a return probe): the thread
    /// is held there.
    Done {
        /// Where the breakpoint was (0 for an instruction).
        at: u64,
    },
    /// The thread hit a data breakpoint that holds it (reported as the
    /// hit).
    Hit,
    /// It reached a code breakpoint that holds it (reported as that stop).
    Code,
    /// Something else stopped it: a pause, or another thread's hit that
    /// stops every thread.
    Interrupted,
    /// Its process called exec: held at that stop.
    Exec,
    /// It exited, or is no longer traced.
    Gone,
    /// It was not held when the leg was asked for (running, or stepping
    /// already).
    NotHeld,
}

/// What a leg reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegOutcome {
    /// How it ended.
    pub end: LegEnd,
    /// Signals delivered to the thread meanwhile (their handlers ran).
    pub signals: Vec<i32>,
}
