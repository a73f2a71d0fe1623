//! The ptrace backend: tracer threads that own the tracees and stop them at
//! a hit, by signal stops (a per-thread perf breakpoint whose BPF program
//! sends the thread a signal, `signal_bp.rs`; the default where `bpf()` is
//! allowed) or, failing that, DR0–DR7 written with `PTRACE_POKEUSER`.
//! Debugger semantics: a hit can hold the thread (or every thread) until
//! Resume, values are read while the thread is stopped (exact),
//! only-on-change compares them there.
//!
//! Rooms:
//! - `shards.rs`: the facade the daemon calls (seize, program, park,
//!   resume, detach), spreading tracees over tracer shards;
//! - `wake.rs`: how shards are woken (SIGCHLD handler, bells, scans);
//! - `tracer.rs`: a shard's loop and its commands;
//! - `stops.rs`: stops decoded once into [`stops::Stop`] and handled;
//! - `regs.rs`: the desired and applied register state of a tracee;
//! - `park.rs`: parked tracees and the batches that wait for stops;
//! - `recovery.rs`: the state file that lets a restarted daemon clear
//!   registers a killed one left armed;
//! - `arm.rs`: arming and disarming passes (parked threads, the free-slot
//!   check, each reservation's outcome reported to the core);
//! - `sink.rs`: the callbacks tracers make into the backend
//!   ([`TraceSink`]: new threads, exits, hits, code events);
//! - this file: [`PtraceEngine`], its attach and the [`Backend`].

mod arm;
pub mod code;
pub mod park;
pub mod protocol;
pub mod recovery;
pub mod regs;
mod rewind;
pub mod shards;
pub mod signal_bp;
mod sink;
pub mod step;
pub mod stops;
pub mod tracer;
pub mod wake;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

use nix::errno::Errno;

use super::probe::SlotProbe;
use super::{ArmReport, Backend, Features, HeldRegisters, Host, RunState, Unavailable};
use crate::error::WpdError;
use crate::ledger::{Reservation, Retained};
use crate::model::{BackendKind, Pid, Tid};
use crate::procfs;
use crate::state::{OpGuard, Process, Watch};
pub use shards::{Held, HitVerdict, ProgramResult, Shards, SlotProgram, TraceSink, TraceeState};
pub use wake::block_sigchld;

/// Tracer threads (`WPD_PTRACE_SHARDS` overrides). A handful: each waits
/// only on its own tracees, and new threads join their creator's tracer.
const SHARDS: usize = 4;

/// The ptrace backend.
pub struct PtraceEngine {
    shards: Shards,
    /// Free-slot checks before any address is written (see `arm`); without
    /// one, a request refused half-way may leave kernel-held slots behind.
    probe: Option<Arc<SlotProbe>>,
    host: Weak<dyn Host>,
    /// The processes attached, written to the state file on every change.
    state: recovery::StateFile,
    /// Which stops processes get (`wpd --ptrace-stops`).
    stops: signal_bp::Policy,
    /// Fault injection: the hit at which a tracer thread panics (0: none).
    panic_at_hit: u64,
    /// Hits seen, for `panic_at_hit`.
    hits_seen: std::sync::atomic::AtomicU64,
    /// The daemon's fd budget (shared with the perf backend): signal
    /// stops' breakpoints and code events' probes, programs and maps.
    fds: Arc<crate::backend::fds::FdBudget>,
    /// The store instruction at each hit address (a hit's value is what
    /// its store wrote).
    stores: crate::backend::stored::Stores,
}

impl std::fmt::Debug for PtraceEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PtraceEngine")
            .field("shards", &self.shards)
            .finish()
    }
}

impl PtraceEngine {
    /// What it can do.
    pub const FEATURES: Features = Features {
        stops: true,
        only_on_change: true,
        exact_values: true,
        follow_forks: false,
        thread_names: false,
        signal_at_hit: true,
        code_events: true,
        arms_while_traced: false,
        feedback: false,
    };

    /// Starts the tracer shards, or says why ptrace cannot work here. The
    /// state file is at `state_file`.
    pub fn new(
        host: Weak<dyn Host>,
        probe: Option<Arc<SlotProbe>>,
        fds: Arc<crate::backend::fds::FdBudget>,
        opts: &crate::backend::SystemOptions,
    ) -> Result<Arc<PtraceEngine>, Unavailable> {
        let scope = crate::procfs::yama::scope();
        if scope >= 3 {
            return Err(Unavailable::Yama {
                scope,
                why: "forbids every ptrace attach",
            });
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 && scope >= 1 {
            return Err(Unavailable::Yama {
                scope,
                why: "and not root: attaching needs CAP_SYS_PTRACE",
            });
        }
        let shards = opts
            .ptrace_shards
            .filter(|&n| (1..=64).contains(&n))
            .unwrap_or(SHARDS);
        Ok(Arc::new_cyclic(|me: &Weak<PtraceEngine>| {
            let sink: Weak<dyn TraceSink> = me.clone();
            PtraceEngine {
                shards: Shards::new(shards, sink),
                probe,
                host,
                state: recovery::StateFile::new(opts.state_file.clone()),
                stops: opts.ptrace_stops,
                panic_at_hit: opts.fault_panic_at_hit.unwrap_or(0),
                hits_seen: std::sync::atomic::AtomicU64::new(0),
                fds,
                stores: crate::backend::stored::Stores::default(),
            }
        }))
    }

    fn host(&self) -> Result<Arc<dyn Host>, WpdError> {
        self.host
            .upgrade()
            .ok_or_else(|| WpdError::kernel("daemon shutting down", Errno::ESHUTDOWN))
    }

    /// True if `tid` is one of our tracees (tests).
    pub fn traces(&self, tid: Tid) -> bool {
        self.shards.traces(tid)
    }

    /// Seizes every thread, rescanning until no thread is new (threads
    /// created by a seized thread are attached by the kernel at clone).
    fn seize_all(&self, host: &dyn Host, proc: &Process) -> Result<(), WpdError> {
        let pt = &self.shards;
        let ledger = host.ledger();
        let me = std::process::id() as Pid;
        let mut seen: HashSet<Tid> = HashSet::new();
        let result = (|| {
            loop {
                // A thread that has exited (a leader that ended alone stays
                // a zombie while the others run) cannot be seized (EPERM)
                // and runs no code: it is not watched (kernel-facts §3b).
                // Told apart by its state only when the seize fails, not
                // with a /proc read per thread.
                let tids: Vec<Tid> = procfs::tasks(proc.pid)
                    .map_err(|_| WpdError::NoSuchProcess(proc.pid))?
                    .into_iter()
                    .filter(|t| seen.insert(*t))
                    .collect();
                if tids.is_empty() {
                    return Ok(());
                }
                for (tid, r) in pt.seize(proc.pid, &tids) {
                    match r {
                        Ok(()) => {
                            ledger.add_thread(proc.pid, tid);
                        }
                        Err(Errno::ESRCH) => {}
                        Err(Errno::EPERM) if procfs::thread_exited(proc.pid, tid) => {}
                        Err(Errno::EPERM) => match tracer_of(tid) {
                            // Attached by the kernel at clone: ours already.
                            // TracerPid names the tracer *thread* (a shard).
                            Some(t) if t == me || procfs::tgid_of(t) == Some(me) => {}
                            Some(t) => {
                                let tracer = procfs::tgid_of(t).unwrap_or(t);
                                return Err(WpdError::AlreadyTraced {
                                    pid: proc.pid,
                                    tid,
                                    tracer,
                                    tracer_tid: t,
                                    comm: procfs::comm(tracer, tracer).unwrap_or_default(),
                                });
                            }
                            None => {
                                return Err(WpdError::PermissionDenied {
                                    pid: proc.pid,
                                    detail: format!("PTRACE_SEIZE of thread {tid} refused"),
                                });
                            }
                        },
                        Err(e) => return Err(WpdError::kernel("PTRACE_SEIZE", e)),
                    }
                }
            }
        })();
        if result.is_err() {
            pt.detach(proc.pid);
        } else if ledger.thread_count(proc.pid) == 0 {
            return Err(WpdError::NoSuchProcess(proc.pid));
        }
        result
    }
}

/// How often the signal of each process's signal stops is checked.
const SIGNAL_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// The `wpd-sigcheck` thread: the signal a process's signal stops use was
/// chosen at attach as one it neither catches nor blocks; a program that
/// later installs a handler for it or blocks it in a thread would have its
/// own signals swallowed or its hits lost without a word. Every
/// [`SIGNAL_CHECK`] each such process is looked at, and one that no longer
/// fits loses its attachment (`ProcessLost`, with the reason).
fn signal_check_loop(engine: Weak<PtraceEngine>) {
    let mut reported: std::collections::HashSet<(Pid, u64)> = Default::default();
    loop {
        std::thread::sleep(SIGNAL_CHECK);
        let Some(engine) = engine.upgrade() else {
            return;
        };
        let Ok(host) = engine.host() else {
            return;
        };
        for (pid, sig) in signal_bp::with_signal_stops() {
            let start = crate::procfs::start_time(pid).unwrap_or(0);
            if reported.contains(&(pid, start)) {
                continue;
            }
            if let Err(reason) = signal_bp::still_fits(pid, sig) {
                tracing::warn!(pid, %reason, "signal stops no longer fit the process");
                reported.insert((pid, start));
                host.schedule(crate::state::Job::Lose(pid, reason));
            }
        }
        if reported.len() > 4096 {
            reported.clear();
        }
    }
}

impl Backend for PtraceEngine {
    fn kind(&self) -> BackendKind {
        BackendKind::Ptrace
    }

    fn start(self: Arc<Self>) {
        let me = Arc::downgrade(&self);
        let _ = std::thread::Builder::new()
            .name("wpd-sigcheck".into())
            .spawn(move || signal_check_loop(me));
    }

    fn features(&self) -> Features {
        Self::FEATURES
    }

    fn retained(&self) -> Retained {
        Retained::Reuse
    }

    fn attach(&self, op: &OpGuard<'_>) -> Result<(), WpdError> {
        let host = self.host()?;
        // Signal stops are chosen before the first seize: every tracee of
        // the process is created with them.
        let signal = match self.stops {
            signal_bp::Policy::DebugRegisters => Err(signal_bp::NoSignalStops::Off),
            _ => signal_bp::enable(op.pid(), self.fds.clone()),
        };
        match &signal {
            Ok(sig) => tracing::info!(pid = op.pid(), signal = ?sig, "signal stops"),
            Err(why) => tracing::info!(pid = op.pid(), %why, "debug-register stops"),
        }
        if let Err(e) = self.seize_all(&*host, op.process()) {
            signal_bp::disable(op.pid());
            return Err(e);
        }
        if signal.is_err() {
            // Only debug registers survive the daemon: the state file lets
            // a restarted one clear them (kernel-facts §2).
            self.state.add(op.pid(), op.process().start_time);
        }
        Ok(())
    }

    /// Programs the reserved slots through the tracers; all or nothing
    /// (see `arm.rs`).
    fn arm(&self, op: &OpGuard<'_>, watch: &Arc<Watch>, res: &[Reservation]) -> ArmReport {
        self.arm_pass(op, watch, res)
    }

    /// Clears the watchpoint's slot on every thread that has it.
    fn disarm(&self, op: &OpGuard<'_>, watch: &Watch) {
        self.disarm_pass(op, watch)
    }

    fn detach(&self, proc: &Arc<Process>) {
        // DR7 = 0 (or the breakpoints closed) on every thread, then
        // PTRACE_DETACH: threads held at a hit or a breakpoint run on at
        // once. Then the code events' uprobes, whose closes take a grace
        // period each (together, see `code::close`); one reached meanwhile
        // sends a signal the process neither catches nor blocks, whose
        // default action is to ignore it.
        self.shards.detach(proc.pid);
        code::close(proc.pid, None);
        self.state.remove(proc.pid);
        signal_bp::disable(proc.pid);
        // Its pid may come back as another program.
        self.stores.forget(proc.pid);
    }

    fn stops(&self) -> String {
        match (self.stops, signal_bp::available()) {
            (signal_bp::Policy::DebugRegisters, _) => {
                "debug-registers (--ptrace-stops debug-registers)".into()
            }
            (_, Ok(())) => "signal".into(),
            (_, Err(e)) => format!(
                "debug-registers (bpf() refused: {}; signal stops need CAP_BPF and CAP_PERFMON)",
                e.desc()
            ),
        }
    }

    fn stops_of(&self, pid: Pid) -> String {
        match signal_bp::mode_of(pid) {
            Some(m) => format!("signal {:?}", m.signal),
            None => "debug-registers".into(),
        }
    }

    fn thread_states(&self, pid: Pid) -> HashMap<Tid, RunState> {
        self.shards
            .states(pid)
            .into_iter()
            .map(|(tid, st)| {
                let rs = match st.held {
                    Some(Held::Hit | Held::Code) => RunState::StoppedAtHit,
                    Some(Held::Peer) => RunState::StoppedByPeer,
                    Some(Held::Step(_)) => RunState::StoppedAfterStep,
                    None if st.stepping => RunState::Stepping,
                    _ if st.group_stopped => RunState::JobStopped,
                    _ => RunState::Running,
                };
                (tid, rs)
            })
            .collect()
    }

    fn code_events(&self) -> String {
        match (self.stops, signal_bp::available(), code::available()) {
            (signal_bp::Policy::DebugRegisters, _, _) => String::new(),
            (_, Ok(()), Ok(())) => "uprobe + BPF signal stop: the thread is held at the probe \
                 (its registers recorded by the probe's program) until its object is armed, \
                 or, at a code breakpoint, until resumed; \
                 no debug-register slot is spent on the probe; pending events \
                 (CodeEvent.pending) on a library not loaded yet are armed at the \
                 dynamic linker's debugger hook (_dl_debug_state), before the \
                 library's code runs"
                .into(),
            _ => String::new(),
        }
    }

    fn open_code_probe(&self, pid: Pid, probe: &super::CodeProbe) -> Result<(), WpdError> {
        let mode = signal_bp::mode_of(pid).ok_or(WpdError::NeedsBackend {
            feature: "code events",
            needs: None,
            hint: ": a code event holds the thread with a signal stop, and this process has \
                   debug-register stops (bpf() refused, or it catches SIGURG and SIGWINCH)",
        })?;
        code::open(pid, probe, &mode).map_err(|e| match e {
            code::OpenError::Fds(e) => e,
            code::OpenError::Kernel(e) => WpdError::InvalidArgument(format!(
                "the kernel refused a uprobe on {} at offset {:#x}: {}",
                probe.path.display(),
                probe.offset,
                e.desc()
            )),
        })
    }

    fn close_code_probes(&self, pid: Pid, keys: Option<&[u64]>) {
        code::close(pid, keys);
    }

    fn code_probe_member(&self, key: u64, base: u64, value: &[u64], member: bool) -> bool {
        code::set_member(key, base, value, member)
    }

    fn unmute(&self, pid: Pid, addrs: &[u64]) {
        if let Some(m) = signal_bp::mode_of(pid) {
            m.unmute(addrs);
        }
    }

    fn take_freed(&self, aged_only: bool) -> Vec<super::CodeRecord> {
        code::take_freed(aged_only)
    }

    fn resume(&self, pid: Pid, tids: &[Tid]) -> Result<Vec<Tid>, WpdError> {
        Ok(self.shards.resume(pid, tids))
    }

    fn pause(&self, pid: Pid, tids: &[Tid]) -> Result<Vec<Tid>, WpdError> {
        let mut tids = if tids.is_empty() {
            self.shards.states(pid).into_keys().collect()
        } else {
            tids.to_vec()
        };
        tids.sort_unstable();
        let mut held = self.shards.hold(&tids);
        held.sort_unstable();
        Ok(held)
    }

    fn step_leg(
        &self,
        pid: Pid,
        tid: Tid,
        leg: &crate::backend::step::Leg,
        cancel: &std::sync::atomic::AtomicBool,
        running: &dyn Fn(),
    ) -> Result<crate::backend::step::LegOutcome, WpdError> {
        step::run_leg(&self.shards, pid, tid, leg, cancel, running)
    }

    fn step_done(&self, _pid: Pid, tid: Tid) {
        self.shards.step_done(tid);
    }

    fn leave_trampoline(&self, _pid: Pid, tid: Tid, ret: u64) -> bool {
        self.shards.leave_trampoline(tid, ret)
    }

    fn held_registers(&self, pid: Pid, tid: Tid) -> Result<HeldRegisters, WpdError> {
        self.shards
            .registers(tid)
            .ok_or(WpdError::NotHeld { pid, tid })
    }

    fn compact(&self) {
        self.shards.shrink();
    }
}

/// True on a tracer thread (its panics are caught: it detaches its tracees
/// before it ends, see `Shards::new`).
pub fn is_tracer_thread() -> bool {
    wake::IS_TRACER.with(|t| t.get())
}

/// The tracer thread of `tid` from `/proc`, if another task traces it.
pub fn tracer_of(tid: Tid) -> Option<Tid> {
    let v: Tid = procfs::Status::of(tid)?.number("TracerPid")?;
    (v != 0).then_some(v)
}
