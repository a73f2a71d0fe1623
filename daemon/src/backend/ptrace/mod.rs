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
//! - this file: [`PtraceEngine`], the [`Backend`], and the callbacks
//!   tracers make into it ([`TraceSink`]).

pub mod code;
pub mod park;
pub mod protocol;
pub mod recovery;
pub mod regs;
pub mod shards;
pub mod signal_bp;
pub mod step;
pub mod stops;
pub mod tracer;
pub mod wake;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

use nix::errno::Errno;

use super::fanout::fan_out;
use super::probe::SlotProbe;
use super::{ArmReport, Backend, Features, HeldRegisters, Host, RunState, Unavailable};
use crate::error::WpdError;
use crate::events::{EventKind, HitEvent};
use crate::ledger::{Outcome, Reservation, Retained};
use crate::model::{BackendKind, HitAction, Pid, Piece, SlotKey, Tid};
use crate::procfs;
use crate::sched::Boost;
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
}

impl std::fmt::Debug for PtraceEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PtraceEngine")
            .field("shards", &self.shards)
            .finish()
    }
}

/// Restarts parked threads when dropped (every way out of an arm).
struct Unpark<'a>(&'a Shards, &'a [Tid]);

impl<'a> Unpark<'a> {
    /// Parks `tids` until the guard drops.
    fn park(pt: &'a Shards, tids: &'a [Tid]) -> Self {
        pt.park(tids);
        Unpark(pt, tids)
    }
}

impl Drop for Unpark<'_> {
    fn drop(&mut self) {
        self.0.unpark(self.1);
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
    };

    /// Starts the tracer shards, or says why ptrace cannot work here. The
    /// state file is at `state_file`.
    pub fn new(
        host: Weak<dyn Host>,
        probe: Option<Arc<SlotProbe>>,
        fds: Arc<crate::backend::fds::FdBudget>,
        opts: &crate::backend::SystemOptions,
    ) -> Result<Arc<PtraceEngine>, Unavailable> {
        let scope = crate::authz::yama_scope();
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
            }
        }))
    }

    /// Fault injection for the crash tests (`faults_ptrace_death.rs`): with
    /// `panic_at_hit` N, the tracer thread panics at its Nth hit.
    fn fault_panic_at_hit(&self) {
        use std::sync::atomic::Ordering;
        let at = self.panic_at_hit;
        if at != 0 && self.hits_seen.fetch_add(1, Ordering::Relaxed) + 1 == at {
            panic!("WPD_FAULT_PANIC_AT_HIT: tracer thread panics at hit {at}");
        }
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

    /// The watched bytes of a piece, read through the stopped thread
    /// itself: exact.
    fn hit_value(pid: Pid, tid: Tid, piece: Piece) -> Result<Vec<u8>, String> {
        procfs::read_memory(pid, tid, piece.addr, piece.len.bytes() as usize)
    }

    fn program_for(r: &Reservation, w: &Watch) -> SlotProgram {
        program_for(r, w)
    }
}

/// The program arming reservation `r` with its piece of `w`.
pub(super) fn program_for(r: &Reservation, w: &Watch) -> SlotProgram {
    let piece = w.spec.range.piece(r.key.piece);
    SlotProgram {
        tid: r.tid,
        slot: r.slot,
        arm: Some(shards::Arm {
            addr: piece.addr,
            len: piece.len,
            access: w.spec.access,
            key: r.key,
        }),
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

    /// Programs the reserved slots through the tracers; all or nothing (a
    /// refused arm leaves what it programmed to the core to disarm).
    fn arm(&self, op: &OpGuard<'_>, watch: &Arc<Watch>, res: &[Reservation]) -> ArmReport {
        let host = match self.host() {
            Ok(h) => h,
            Err(e) => return ArmReport::refused(res, e),
        };
        let ledger = host.ledger();
        let pt = &self.shards;
        let _rt = Boost::enter();
        // A successful address poke makes the kernel reserve a slot until the
        // thread exits or execs, even if the request is then refused. So
        // that a refused request leaves nothing behind, check that every
        // thread has a free slot first (one disabled breakpoint, opened and
        // closed), except where the slot is one the kernel already holds for
        // us. The threads are stopped (parked) for the check: opened on
        // running threads, these breakpoints made the threads' next stops
        // slow to come, and parked they are programmed at once, with no
        // second stop. Many threads are parked even without the check: all
        // stopped before any restarts (see `Shards::detach`).
        //
        // An object's watchpoint with signal stops needs none of this: a
        // slot is a perf breakpoint, opened on each thread where it runs,
        // and one the kernel refuses (ENOSPC) holds nothing (kernel-facts
        // §17). (Others keep the check: a refused request then marks no
        // slot of a thread it never reached as retained.)
        let mode = signal_bp::mode_of(op.pid());
        // With signal stops each slot is a perf breakpoint's fd: they must
        // fit the daemon's budget, leaving the fds kept for connections.
        if mode.is_some()
            && let Err(e) = self.fds.check_for(
                watch.owner,
                "this watchpoint",
                res.len(),
                format!("a breakpoint per thread and piece, {} in all", res.len()),
            )
        {
            return ArmReport::refused(res, e);
        }
        let in_place = watch.object && mode.is_some();
        let mut tids: Vec<Tid> = res.iter().map(|r| r.tid).collect();
        tids.dedup(); // a thread's reservations are adjacent, one per piece
        let _parked = (!in_place && (self.probe.is_some() || tids.len() > 1))
            .then(|| Unpark::park(pt, &tids));
        if !in_place && let Some(probe) = &self.probe {
            // From one thread per CPU, as perf arm passes: each open and
            // close interrupts the CPU the thread last ran on.
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            // Per thread, the slots it needs that the kernel does not hold
            // for us already (a thread's reservations are adjacent).
            let mut groups: Vec<(Tid, usize, &[Reservation])> = Vec::new();
            for chunk in res.chunk_by(|a, b| a.tid == b.tid) {
                let row = ledger.get(chunk[0].tid);
                let fresh = chunk
                    .iter()
                    .filter(|r| {
                        row.as_ref()
                            .is_none_or(|row| row.retained & (1 << r.slot) == 0)
                    })
                    .count();
                if fresh > 0 {
                    groups.push((chunk[0].tid, fresh, chunk));
                }
            }
            let refused: HashSet<Tid> = fan_out(&groups, cpus, |chunk| {
                chunk
                    .iter()
                    .filter(|(tid, fresh, _)| {
                        probe
                            .free_slots(*tid, *fresh)
                            .is_ok_and(|free| free < *fresh)
                    })
                    .map(|(tid, _, _)| *tid)
                    .collect::<Vec<Tid>>()
            })
            .into_iter()
            .flatten()
            .collect();
            if !refused.is_empty() {
                // The probe's ENOSPC is the kernel's: every reservation of
                // a thread without room is refused, nothing is programmed.
                let outcomes = res
                    .iter()
                    .map(|r| match refused.contains(&r.tid) {
                        true => (*r, Outcome::NoSpace),
                        false => (*r, Outcome::NotArmed),
                    })
                    .collect();
                return ArmReport {
                    outcomes,
                    refused: None,
                };
            }
        }
        let items: Vec<SlotProgram> = res.iter().map(|r| Self::program_for(r, watch)).collect();
        let mut failed = None;
        let outcomes = pt
            .program(items, in_place)
            .into_iter()
            .filter_map(|(p, r)| {
                let arm = p.arm?;
                if let ProgramResult::Failed(e) = r {
                    failed = Some(e);
                }
                Some((
                    Reservation {
                        tid: p.tid,
                        slot: p.slot,
                        key: arm.key,
                    },
                    r.outcome(),
                ))
            })
            .collect();
        let refused = failed.map(|e| match mode {
            Some(_) if crate::backend::fds::is_out_of_fds(e) => self.fds.refusal(
                "this watchpoint",
                res.len(),
                format!("a breakpoint per thread and piece, {} in all", res.len()),
                true,
            ),
            Some(_) => WpdError::kernel("perf_event_open(signal stop)", e),
            None => WpdError::kernel("PTRACE_POKEUSER", e),
        });
        // A refused arm leaves what was armed (also on threads born
        // meanwhile) for the core to undo.
        ArmReport { outcomes, refused }
    }

    /// Clears the watchpoint's slot on every thread that has it.
    fn disarm(&self, op: &OpGuard<'_>, watch: &Watch) {
        let Ok(host) = self.host() else { return };
        let ledger = host.ledger();
        let tids = match &watch.spec.scope {
            crate::model::Scope::Threads(t) => t.clone(),
            crate::model::Scope::Process | crate::model::Scope::Named(_) => ledger.tids(op.pid()),
        };
        let items: Vec<SlotProgram> = ledger
            .slots_on(&tids, watch.id)
            .into_iter()
            .map(|(tid, slot)| SlotProgram {
                tid,
                slot,
                arm: None,
            })
            .collect();
        if items.is_empty() {
            return;
        }
        // Stopped all first, then cleared, then restarted: cleared at their
        // own stops one by one, busy threads would each wait for the CPU
        // behind those already restarted (see `Shards::detach`).
        let in_place = watch.object && signal_bp::mode_of(op.pid()).is_some();
        let mut tids: Vec<Tid> = items.iter().map(|p| p.tid).collect();
        tids.dedup(); // one item per piece, a thread's together
        let _parked = (!in_place && tids.len() > 1).then(|| Unpark::park(&self.shards, &tids));
        self.shards.program(items, in_place);
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
    ) -> Result<crate::backend::step::LegOutcome, WpdError> {
        step::run_leg(&self.shards, pid, tid, leg, cancel)
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

impl TraceSink for PtraceEngine {
    fn thread_started(&self, pid: Pid, tid: Tid, parent: Tid) -> Vec<SlotProgram> {
        let Some(host) = self.host.upgrade() else {
            return Vec::new();
        };
        if host.process(pid).is_none() {
            return Vec::new();
        }
        let ledger = host.ledger();
        ledger.add_thread(pid, tid);
        ledger.set_parent(tid, parent);
        let mut out = Vec::new();
        let mut res = Vec::new();
        for w in host.wide_watches(pid) {
            res.clear();
            match host.reserve_thread(tid, &w, false, Retained::Reuse, &mut res) {
                Ok(()) => out.extend(res.iter().map(|r| Self::program_for(r, &w))),
                Err(_) => {
                    tracing::warn!(
                        pid,
                        tid,
                        id = w.id.0,
                        pieces = w.spec.range.slots(),
                        "new thread has too few free slots"
                    )
                }
            }
        }
        out
    }

    fn thread_armed(&self, pid: Pid, tid: Tid, results: &[(SlotProgram, ProgramResult)]) {
        let Some(host) = self.host.upgrade() else {
            return;
        };
        let mut armed = Vec::new();
        let report: Vec<(Reservation, Outcome)> = results
            .iter()
            .filter_map(|(p, r)| {
                let a = p.arm?;
                if *r == ProgramResult::Done && !armed.contains(&a.key.id) {
                    armed.push(a.key.id);
                }
                let res = Reservation {
                    tid,
                    slot: p.slot,
                    key: a.key,
                };
                Some((res, r.outcome()))
            })
            .collect();
        host.settle(&report);
        let parent = host.ledger().get(tid).map(|r| r.parent).unwrap_or(0);
        host.publish(EventKind::ThreadStarted {
            pid,
            tid,
            parent,
            watchpoints: armed,
        });
    }

    fn thread_exited(&self, pid: Pid, tid: Tid) {
        code::forget(tid);
        let Some(host) = self.host.upgrade() else {
            return;
        };
        let ledger = host.ledger();
        if let Some(row) = ledger.get(tid)
            && row.pid == pid
        {
            ledger.remove_thread(tid);
            host.publish(EventKind::ThreadExited { pid, tid });
        }
    }

    fn hit(&self, pid: Pid, tid: Tid, ip: u64, keys: &[SlotKey]) -> HitVerdict {
        self.fault_panic_at_hit();
        let Some(host) = self.host.upgrade() else {
            return HitVerdict::Continue;
        };
        let mut verdict = HitVerdict::Continue;
        for &key in keys {
            let Some(w) = host.watch(key.id) else {
                continue;
            };
            if w.freed.load(std::sync::atomic::Ordering::Relaxed) {
                // Its object was freed; its breakpoints are being closed.
                continue;
            }
            let piece = w.spec.range.piece(key.piece);
            let value = Self::hit_value(pid, tid, piece);
            let mut old_value = None;
            if w.spec.only_on_change
                && let Ok(v) = &value
            {
                // The last bytes seen of the whole range; this piece's part
                // compared and updated.
                let mut last = w.last_value.lock().unwrap();
                let off = (piece.addr - w.spec.range.addr) as usize;
                let part = off..off + v.len();
                match last.as_mut().filter(|l| l.len() >= part.end) {
                    Some(l) if l[part.clone()] == v[..] => continue, // the same bytes
                    Some(l) => {
                        old_value = Some(l[part.clone()].to_vec());
                        l[part].copy_from_slice(v);
                    }
                    None => {
                        *last = procfs::read_memory(
                            pid,
                            tid,
                            w.spec.range.addr,
                            w.spec.range.len as usize,
                        )
                        .ok();
                    }
                }
            }
            // Not reported: it stops no one.
            let rate_limited_before = match w.filter.judge(
                &w.spec.filter,
                value.as_ref().ok().map(|v| &v[..]),
                crate::clock::monotonic_ns(),
            ) {
                crate::filter::Verdict::Report { limited_before } => limited_before,
                _ => continue,
            };
            let stopped = matches!(w.spec.action, HitAction::Stop | HitAction::StopAll);
            verdict = match (verdict, w.spec.action) {
                (_, HitAction::StopAll) | (HitVerdict::HoldAll, _) => HitVerdict::HoldAll,
                (_, HitAction::Stop) | (HitVerdict::Hold, _) => HitVerdict::Hold,
                (_, HitAction::Signal(n)) | (HitVerdict::Signal(n), _) => HitVerdict::Signal(n),
                _ => HitVerdict::Continue,
            };
            host.count_hit(&w);
            let now = crate::clock::realtime_ns();
            let (callchain, callchain_note) = match w.spec.backtrace {
                0 => (Vec::new(), None),
                depth => match call_chain(&*host, pid, tid, usize::from(depth)) {
                    (chain, None) if chain.is_empty() => {
                        (chain, Some(crate::events::NO_FRAME_POINTER))
                    }
                    found => found,
                },
            };
            host.publish(EventKind::Hit(HitEvent {
                id: w.id,
                piece: key.piece,
                pid,
                tid,
                ip,
                addr: piece.addr,
                len: piece.len.bytes(),
                access: w.spec.access,
                value,
                time_ns: now,
                value_read_ns: now,
                cpu: 0,
                stopped,
                old_value,
                backend: BackendKind::Ptrace,
                image: host.image(pid),
                callchain,
                callchain_note,
                rate_limited_before,
                names: None,
                value_type: None,
            }));
        }
        if verdict == HitVerdict::HoldAll {
            self.shards.hold_all(pid, tid);
        }
        verdict
    }

    fn code_event(
        &self,
        pid: Pid,
        tid: Tid,
        records: &[super::CodeRecord],
        armer: &mut dyn super::StopArmer,
    ) -> bool {
        let hold = self.host.upgrade().map_or(super::CodeHold::Run, |h| {
            h.code_event(pid, tid, records, armer)
        });
        if hold == super::CodeHold::HoldAll {
            self.shards.hold_all(pid, tid);
        }
        hold != super::CodeHold::Run
    }

    fn objects_freed(&self, records: &[super::CodeRecord], armer: &mut dyn super::StopArmer) {
        if let Some(h) = self.host.upgrade() {
            h.objects_freed(records, Some(armer));
        }
    }

    fn exec(&self, pid: Pid, _tid: Tid) {
        if let Some(host) = self.host.upgrade() {
            host.schedule(crate::state::Job::Exec(pid));
        }
    }
}

/// The return addresses of the stopped thread `tid`'s callers, innermost
/// first, up to `depth`: unwound by the host with the modules' call frame
/// information (code with or without frame pointers), else walked along
/// frame pointers as the kernel's perf call chains are
/// (`arch::current::walk_frame_pointers`), saying why it stopped early.
fn call_chain(
    host: &dyn Host,
    pid: Pid,
    tid: Tid,
    depth: usize,
) -> (Vec<u64>, Option<&'static str>) {
    let Ok(regs) = nix::sys::ptrace::getregs(nix::unistd::Pid::from_raw(tid)) else {
        return (Vec::new(), Some("the thread's registers could not be read"));
    };
    let regs = crate::arch::current::UserRegs::from(&regs);
    let mut read = |at: u64| {
        let b = procfs::read_memory(pid, tid, at, 8).ok()?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    };
    if let Some(chain) = host.unwind(pid, (regs.ip, regs.sp, regs.fp), depth, &mut read) {
        return chain;
    }
    crate::arch::current::walk_frame_pointers(
        |at| procfs::read_memory(pid, tid, at, 16).ok(),
        regs.fp,
        regs.sp,
        depth,
    )
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
