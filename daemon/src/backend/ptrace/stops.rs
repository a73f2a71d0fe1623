//! Stops, decoded once into [`Stop`] (named in ptrace(2)'s vocabulary),
//! and what the tracer does at each.
//!
//! - `PTRACE_EVENT_STOP` + SIGTRAP: our interrupt, or a new thread's first
//!   stop (armed with every process-wide watchpoint before it runs; its stop
//!   may come before or after its creator's `PTRACE_EVENT_CLONE`).
//! - `PTRACE_EVENT_STOP` + a stop signal: group-stop; restarted with
//!   `PTRACE_LISTEN` so SIGCONT still resumes it (job control works).
//! - `PTRACE_EVENT_CLONE`, `PTRACE_EVENT_EXEC` (exec cleared the registers),
//!   `PTRACE_EVENT_EXIT` (leaders only: detached there, kernel-facts §3b).
//! - SIGTRAP with `si_code == TRAP_HWBKPT`: a hit; DR6 (trusted only here)
//!   names the slots. The SIGTRAP is suppressed; the hit is logged, or the
//!   thread held until Resume.
//! - Any other signal-delivery-stop: the signal is delivered unchanged.

use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;

use super::regs::SharedRegs;
use super::shards::{Held, HitVerdict};
use super::tracer::{DetachFor, Phase, Tracee, Tracer, base_options, npid, seize_options};
use crate::arch::current as arch;
use crate::model::Tid;

/// One stop (or exit) of a tracee, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// It exited or was killed (reaped).
    Exited,
    /// `PTRACE_EVENT_STOP` (named for the common case): an interrupt, a new thread's first stop, or (with
    /// a stop signal) a group-stop.
    Interrupted {
        /// The stop signal of a group-stop.
        group: Option<Signal>,
    },
    /// `PTRACE_EVENT_CLONE`: it created a task.
    Clone,
    /// `PTRACE_EVENT_EXEC`: its process called exec.
    Exec,
    /// `PTRACE_EVENT_EXIT`: it is exiting.
    ExitEvent,
    /// Another `PTRACE_EVENT_*` (none is asked for).
    OtherEvent,
    /// A SIGTRAP whose `si_code` is `TRAP_HWBKPT`: DR6 as read at the stop.
    HwBreakpoint {
        /// DR6.
        dr6: u64,
    },
    /// A signal-delivery-stop for any other signal.
    SignalDelivery(Signal),
}

fn is_stop_signal(s: Signal) -> bool {
    matches!(
        s,
        Signal::SIGSTOP | Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU
    )
}

/// Decodes a wait status (with GETSIGINFO and a DR6 read for a SIGTRAP).
pub(super) fn decode(st: WaitStatus) -> Option<(Tid, Stop)> {
    Some(match st {
        WaitStatus::Exited(p, _) | WaitStatus::Signaled(p, _, _) => (p.as_raw(), Stop::Exited),
        WaitStatus::PtraceEvent(p, sig, ev) => {
            let stop = match ev {
                libc::PTRACE_EVENT_STOP => Stop::Interrupted {
                    group: is_stop_signal(sig).then_some(sig),
                },
                libc::PTRACE_EVENT_CLONE => Stop::Clone,
                libc::PTRACE_EVENT_EXEC => Stop::Exec,
                libc::PTRACE_EVENT_EXIT => Stop::ExitEvent,
                _ => Stop::OtherEvent,
            };
            (p.as_raw(), stop)
        }
        WaitStatus::Stopped(p, Signal::SIGTRAP) => {
            let hw = ptrace::getsiginfo(p).is_ok_and(|i| i.si_code == arch::TRAP_HWBKPT);
            let stop = if hw {
                let dr6 = ptrace::read_user(p, arch::debugreg_offset(arch::DR6) as _).unwrap_or(0);
                Stop::HwBreakpoint { dr6: dr6 as u64 }
            } else {
                Stop::SignalDelivery(Signal::SIGTRAP)
            };
            (p.as_raw(), stop)
        }
        WaitStatus::Stopped(p, sig) => (p.as_raw(), Stop::SignalDelivery(sig)),
        _ => return None,
    })
}

impl Tracer {
    /// Handles one wait status.
    pub(super) fn event(&mut self, st: WaitStatus) {
        let Some((tid, stop)) = decode(st) else {
            return;
        };
        tracing::trace!(
            tid,
            ?stop,
            phase = ?self.tracees.get(&tid).map(|t| t.phase),
            step = self.tracees.get(&tid).is_some_and(|t| t.step.is_some()),
            "stop"
        );
        if stop == Stop::Exited {
            self.forget(tid);
            return;
        }
        let event = matches!(
            stop,
            Stop::Interrupted { .. }
                | Stop::Clone
                | Stop::Exec
                | Stop::ExitEvent
                | Stop::OtherEvent
        );
        if event && !self.tracees.contains_key(&tid) {
            // An auto-attached new thread whose stop came before its
            // parent's CLONE event: adopt it now (pid from /proc).
            let pid = crate::procfs::tgid_of(tid).unwrap_or(tid);
            let t = Tracee::new(
                pid,
                Phase::Newborn {
                    parent: None,
                    stopped: false,
                },
            );
            self.tracees.insert(tid, t);
            self.owner.insert(tid, self.index);
        }
        match stop {
            Stop::Exited => {}
            Stop::Clone => self.clone_event(tid),
            Stop::Exec => self.exec_event(tid),
            Stop::ExitEvent => self.exit_stop(tid),
            Stop::Interrupted { group } => self.event_stop(tid, group.is_some()),
            Stop::OtherEvent => self.after_stop(tid, None),
            Stop::HwBreakpoint { dr6 } => self.hw_trap(tid, dr6),
            Stop::SignalDelivery(sig) => self.signal_stop(tid, sig),
        }
    }

    fn clone_event(&mut self, tid: Tid) {
        let child = ptrace::getevent(npid(tid)).map(|c| c as Tid).unwrap_or(0);
        let pid = self.tracees[&tid].pid;
        // A thread of the same process (the common case) is told by a path
        // lookup; reading /proc/CHILD/status for its Tgid was 14 % of the
        // daemon's CPU under thread churn.
        let child_pid = if crate::procfs::is_thread_of(pid, child) {
            pid
        } else {
            crate::procfs::tgid_of(child).unwrap_or(pid)
        };
        if child > 0 && child_pid != pid {
            // A new process (clone without CLONE_THREAD): not ours to watch.
            // Let it go at its first stop.
            let c = self.tracees.entry(child).or_insert_with(|| {
                Tracee::new(
                    child_pid,
                    Phase::Newborn {
                        parent: Some(tid),
                        stopped: false,
                    },
                )
            });
            c.next.detach = Some(DetachFor::Nobody);
            let waiting = matches!(c.phase, Phase::Newborn { stopped: true, .. });
            self.owner.insert(child, self.index);
            if waiting {
                self.after_stop(child, None);
            }
        } else if child > 0 {
            // A thread created by one being detached was not among the
            // tracees the detach named: it goes too, unarmed (armed and left
            // traced, its next hit would kill the target once the process is
            // no longer ours).
            let detaching = self.tracees[&tid].next.detach.is_some();
            let waiting = match self.tracees.get_mut(&child) {
                Some(c) => {
                    let waiting = matches!(
                        c.phase,
                        Phase::Newborn {
                            parent: None,
                            stopped: true
                        }
                    );
                    if detaching {
                        c.next.detach.get_or_insert(DetachFor::Nobody);
                    } else if let Phase::Newborn { parent, .. } = &mut c.phase {
                        *parent = Some(tid);
                    }
                    waiting
                }
                None => {
                    let mut c = Tracee::new(
                        pid,
                        Phase::Newborn {
                            parent: Some(tid),
                            stopped: false,
                        },
                    );
                    if detaching {
                        c.next.detach = Some(DetachFor::Nobody);
                    }
                    self.tracees.insert(child, c);
                    self.owner.insert(child, self.index);
                    // Its first stop may already be there, its SIGCHLD
                    // handed to nobody (no shard owned it yet): collect it
                    // by name.
                    self.collect(child);
                    false
                }
            };
            // Its stop came first: it is waiting, parent known now.
            if waiting && detaching {
                self.after_stop(child, None);
            } else if waiting {
                self.arm_fresh(child);
            }
        }
        self.after_stop(tid, None);
    }

    fn exec_event(&mut self, tid: Tid) {
        let former = ptrace::getevent(npid(tid)).map(|c| c as Tid).unwrap_or(tid);
        if former != tid
            && let Some(old) = self.tracees.remove(&former)
        {
            self.owner.remove(&former);
            self.unreach(former, &old);
            let mut t = old;
            t.pid = tid;
            self.tracees.insert(tid, t);
            self.owner.insert(tid, self.index);
        }
        if let Some(t) = self.tracees.get_mut(&tid) {
            t.regs.lock().reset_after_exec();
        }
        self.regate(tid);
        let pid = self.tracees.get(&tid).map(|t| t.pid).unwrap_or(tid);
        // The thread that called exec is the leader now (it took the pid):
        // it must report its exit as leaders do.
        let _ = ptrace::setoptions(npid(tid), seize_options(pid, tid));
        if let Some(sink) = self.sink.upgrade() {
            sink.exec(pid, tid);
        }
        self.step_exec(tid);
        self.after_stop(tid, None);
    }

    fn event_stop(&mut self, tid: Tid, group: bool) {
        let t = self.tracees.get_mut(&tid).expect("adopted in `event`");
        t.job_stopped = group;
        match t.phase {
            Phase::Newborn { .. } if t.next.detach.is_some() => self.after_stop(tid, None),
            Phase::Newborn { parent: None, .. } => {
                // Stop before the parent's CLONE event: wait for it (it
                // names the parent), unless this is a group-stop.
                t.phase = Phase::Newborn {
                    parent: None,
                    stopped: true,
                };
                if group {
                    self.after_stop(tid, None);
                }
            }
            Phase::Newborn {
                parent: Some(_), ..
            } => self.arm_fresh(tid),
            _ => self.after_stop(tid, None),
        }
    }

    /// `PTRACE_EVENT_EXIT` (leaders only, see [`seize_options`]): the
    /// thread is on its way out and runs no more user code. Detached here,
    /// it leaves no traced zombie behind; to the daemon it has exited.
    fn exit_stop(&mut self, tid: Tid) {
        let Some(t) = self.tracees.remove(&tid) else {
            let _ = ptrace::detach(npid(tid), None);
            return;
        };
        self.owner.remove(&tid);
        self.unreach(tid, &t);
        let _ = ptrace::detach(npid(tid), None);
        self.finish_requests(tid, &t);
        if let Some(sink) = self.sink.upgrade() {
            sink.thread_exited(t.pid, tid);
        }
    }

    /// First stop of a new thread with a known parent: arm it with the
    /// process-wide watchpoints before it runs its first instruction.
    fn arm_fresh(&mut self, tid: Tid) {
        let Some(t) = self.tracees.get_mut(&tid) else {
            return;
        };
        let Phase::Newborn { parent, .. } = t.phase else {
            return;
        };
        let parent = parent.unwrap_or(0);
        t.phase = Phase::Running;
        let pid = t.pid;
        if parent == pid || parent == 0 {
            // Created by the leader: it inherited the leader's
            // PTRACE_O_TRACEEXIT, which only a leader needs.
            let _ = ptrace::setoptions(npid(tid), base_options());
        }
        let Some(sink) = self.sink.upgrade() else {
            self.after_stop(tid, None);
            return;
        };
        let programs = sink.thread_started(pid, tid, parent);
        let id = self.next_id + 1;
        self.next_id = id;
        let (tx, rx) = std::sync::mpsc::channel();
        self.batches.start(id, programs.len(), Vec::new(), tx);
        if let Some(t) = self.tracees.get_mut(&tid) {
            t.pending.extend(programs.into_iter().map(|p| (id, p)));
        }
        self.apply(tid);
        if let Ok(results) = rx.try_recv() {
            sink.thread_armed(pid, tid, &results);
        }
        self.after_stop(tid, None);
        // Armed: the other tracers may program it from now on.
        self.regate(tid);
    }

    fn signal_stop(&mut self, tid: Tid, sig: Signal) {
        if !self.tracees.contains_key(&tid) {
            // Never leave a stopped thread behind, even one we lost track of.
            let _ = ptrace::cont(npid(tid), sig);
            return;
        }
        if sig == Signal::SIGTRAP && self.stepping_single(tid) {
            // A single step's trap (step.rs): never delivered.
            self.step_trap(tid);
            return;
        }
        if sig == Signal::SIGTRAP
            && self.tracees.get(&tid).is_some_and(|t| t.single_in_flight)
            && ptrace::getsiginfo(npid(tid)).is_ok_and(|i| i.si_code == libc::TRAP_TRACE)
        {
            // The trap of a single step whose leg already ended (another
            // thread's stop-all): ours, never delivered.
            if let Some(t) = self.tracees.get_mut(&tid) {
                t.single_in_flight = false;
            }
            self.after_stop(tid, None);
            return;
        }
        if sig == Signal::SIGCONT
            && let Some(t) = self.tracees.get_mut(&tid)
        {
            t.job_stopped = false;
        }
        // Objects freed since the last look go first: their breakpoints
        // are closed here where this tracer holds their threads, so that
        // a store into a freed object is not taken for a hit.
        if let Some(t) = self.tracees.get(&tid)
            && t.regs.lock().is_signal_stop(sig)
            && super::code::has_probes(t.pid)
        {
            let freed = super::code::take_freed(false);
            if !freed.is_empty()
                && let Some(s) = self.sink.upgrade()
            {
                s.objects_freed(&freed, &mut AtStop { tracer: self });
            }
        }
        // Signal stops: the signal our breakpoints' program sends (by the
        // kernel, SI_KERNEL), for the breakpoints whose counts rose. A code
        // event's record of this thread says the same (its probe's program
        // sent the signal just after writing it): then no GETSIGINFO.
        let records = match self.tracees.get(&tid) {
            Some(t) if t.regs.lock().is_signal_stop(sig) && super::code::has_probes(t.pid) => {
                super::code::take(tid)
            }
            _ => Vec::new(),
        };
        if let Some(t) = self.tracees.get_mut(&tid)
            && t.regs.lock().is_signal_stop(sig)
            && (!records.is_empty()
                || ptrace::getsiginfo(npid(tid)).is_ok_and(|i| i.si_code == libc::SI_KERNEL))
        {
            let ids = t.regs.lock().signal_hits();
            let pid = t.pid;
            if !records.is_empty() {
                if !ids.is_empty() {
                    // A hit and a code event in one stop (their signals
                    // merged): the hit is reported, the thread is not held
                    // for it.
                    if let Some(s) = self.sink.upgrade() {
                        let regs = ptrace::getregs(npid(tid)).ok();
                        let _ = s.hit(pid, tid, regs.as_ref(), &ids);
                    }
                }
                self.code_stop(tid, pid, &records);
                return;
            }
            let Some(t) = self.tracees.get_mut(&tid) else {
                return;
            };
            if ids.is_empty() {
                // One of ours that raced a disarm (its count is gone with
                // its event), or the kernel's own SIGURG: taken as ours if
                // this tracee ever had a breakpoint.
                let ours = t.regs.lock().ever_armed != 0 || t.step.is_some();
                self.after_stop(tid, if ours { None } else { Some(sig) });
            } else {
                self.hit_stop(tid, ids);
            }
            return;
        }
        // A signal-delivery-stop: deliver the signal unchanged.
        self.after_stop(tid, Some(sig));
    }

    /// A stop at code-event probes: held while the daemon arms what they
    /// name (it releases the thread with a resume), or restarted.
    fn code_stop(&mut self, tid: Tid, pid: crate::model::Pid, records: &[super::code::CodeRecord]) {
        // Shown (and held) before a branch it sits on: run again at the
        // restart.
        self.rewind_branch(tid, pid, records);
        let detaching = self
            .tracees
            .get(&tid)
            .is_some_and(|t| t.next.detach.is_some());
        let sink = self.sink.upgrade();
        let hold = !detaching
            && sink.is_some_and(|s| s.code_event(pid, tid, records, &mut AtStop { tracer: self }));
        if hold {
            self.end_leg(tid, crate::backend::step::LegEnd::Code);
            if let Some(t) = self.tracees.get_mut(&tid) {
                t.phase = Phase::Held(Held::Code);
                t.next.hold = false;
                // A park (another object being armed) waiting for this
                // stop: it is stopped, and stays so past the unpark.
                for id in t.next.park.take() {
                    self.parks.progress(id, |v| v.push(tid));
                }
            }
            self.apply(tid);
        } else {
            self.after_stop(tid, None);
        }
    }

    /// A hardware-breakpoint trap: ours if an armed slot of ours fired, or
    /// one we armed before and have just disarmed (the hit raced the
    /// disarm); anything else is delivered.
    fn hw_trap(&mut self, tid: Tid, dr6: u64) {
        let Some(t) = self.tracees.get(&tid) else {
            let _ = ptrace::cont(npid(tid), Some(Signal::SIGTRAP));
            return;
        };
        let (ids, ours) = {
            let regs = t.regs.lock();
            (regs.watches_hit(dr6), regs.was_ours(dr6))
        };
        if ids.is_empty() {
            if ours {
                self.after_stop(tid, None);
            } else {
                self.after_stop(tid, Some(Signal::SIGTRAP));
            }
            return;
        }
        self.hit_stop(tid, ids);
    }

    /// A stop at a hit of the watchpoint pieces `ids`: report it, then
    /// continue or hold as the daemon decides.
    pub(super) fn hit_stop(&mut self, tid: Tid, ids: Vec<crate::model::SlotKey>) {
        let Some(t) = self.tracees.get(&tid) else {
            return;
        };
        let regs = ptrace::getregs(npid(tid)).ok();
        let pid = t.pid;
        let verdict = self
            .sink
            .upgrade()
            .map(|s| s.hit(pid, tid, regs.as_ref(), &ids))
            .unwrap_or(HitVerdict::Continue);
        match verdict {
            HitVerdict::Continue => self.after_stop(tid, None),
            HitVerdict::Signal(n) => self.after_stop(tid, Signal::try_from(n).ok()),
            HitVerdict::Hold | HitVerdict::HoldAll => {
                self.end_leg(tid, crate::backend::step::LegEnd::Hit);
                if let Some(t) = self.tracees.get_mut(&tid) {
                    t.phase = Phase::Held(Held::Hit);
                }
                // Apply anything pending; stay stopped.
                self.apply(tid);
            }
        }
    }

    /// Common end of every stop: apply pending register changes, detach if
    /// asked, hold if asked, else restart (delivering `sig`).
    pub(super) fn after_stop(&mut self, tid: Tid, sig: Option<Signal>) {
        let Some(t) = self.tracees.get_mut(&tid) else {
            return;
        };
        if let Phase::Interrupted(_) = t.phase {
            t.phase = Phase::Running;
        }
        let detach = t.next.detach.is_some();
        if !t.pending.is_empty() || detach {
            self.apply(tid);
        }
        if detach {
            // A hit's SIGTRAP can be queued behind this stop (an interrupt
            // is reported before pending signals). Detached now, the thread
            // would receive it untraced and die. Let it report the signal
            // first: `hw_trap` swallows it (the slot was ours) and detaches
            // there.
            if sig.is_none() && self.trap_queued(tid) {
                self.restart(tid, None);
                return;
            }
            self.do_detach(tid, sig);
            return;
        }
        if self.step_stop(tid, sig) {
            return;
        }
        let t = self.tracees.get_mut(&tid).expect("still there");
        if let Phase::Newborn { .. } = t.phase {
            // Not armed yet (a group-stop before its creator's CLONE
            // event): it runs on as it was; requests of its next stop are
            // answered without it.
            for id in t.next.park.take() {
                self.parks.progress(id, |_| {});
            }
            t.next.hold = false;
            self.restart(tid, sig);
            return;
        }
        if t.next.hold && sig.is_none() {
            t.next.hold = false;
            t.phase = Phase::Held(if std::mem::take(&mut t.next.hold_step) {
                Held::Step(false)
            } else {
                Held::Peer
            });
            for id in t.next.park.take() {
                self.parks.progress(id, |v| v.push(tid));
            }
            self.end_leg(tid, crate::backend::step::LegEnd::Interrupted);
            return;
        }
        if sig.is_none() && t.next.park.is_some() {
            let ids = t.next.park.take();
            t.park_gen = t.park_gen.wrapping_add(1);
            t.phase = Phase::Held(Held::Parked(t.park_gen));
            let generation = t.park_gen;
            self.parked
                .0
                .push_back((std::time::Instant::now(), tid, generation));
            for id in ids {
                self.parks.progress(id, |v| v.push(tid));
            }
            return;
        }
        self.restart(tid, sig);
    }
}

/// Programs slots for the daemon at a code event's stop: the stopped
/// thread, and (signal stops) any other of the process, running or not,
/// this tracer's own tracees or the other tracers' that they let be
/// programmed (`Regs::others`): a perf breakpoint is opened on a running
/// thread as well, and from any thread, so neither a park, an interrupt
/// nor a round trip to another tracer is needed. A perf breakpoint that
/// cannot be opened takes no slot (unlike a debug-register poke), so no
/// free-slot probe comes first: its `ENOSPC` is the answer.
pub(super) struct AtStop<'a> {
    pub(super) tracer: &'a mut Tracer,
}

impl AtStop<'_> {
    /// Another tracer's tracee `tid`, if that tracer ever let the others
    /// program it (its `Regs::others` says whether it does now).
    fn elsewhere(&self, tid: Tid) -> Option<SharedRegs> {
        if self.tracer.tracees.contains_key(&tid) {
            return None;
        }
        self.tracer.reach.get(&tid).map(|r| r.clone())
    }
}

impl crate::backend::StopArmer for AtStop<'_> {
    fn reaches(&self, tid: Tid) -> bool {
        match self.tracer.tracees.get(&tid) {
            Some(t) => {
                t.regs.lock().has_signal_stops()
                    && t.next.detach.is_none()
                    && !matches!(t.phase, Phase::Newborn { .. })
            }
            None => self.elsewhere(tid).is_some_and(|r| r.lock().others()),
        }
    }

    fn arm(
        &mut self,
        watch: &crate::state::Watch,
        res: &[crate::ledger::Reservation],
    ) -> Vec<(crate::ledger::Reservation, crate::ledger::Outcome)> {
        use crate::ledger::Outcome;
        let mut out = Vec::with_capacity(res.len());
        // A thread's reservations are adjacent (one per piece).
        for chunk in res.chunk_by(|a, b| a.tid == b.tid) {
            let tid = chunk[0].tid;
            let staged = || {
                chunk
                    .iter()
                    .map(|r| (0, super::arm::program_for(r, watch)))
                    .collect()
            };
            let gone = || chunk.iter().map(|&r| (r, Outcome::Gone));
            let applied = |o: Vec<(u64, super::shards::SlotProgram, super::ProgramResult)>| {
                o.into_iter().filter_map(|(_, p, result)| {
                    let r = crate::ledger::Reservation {
                        tid: p.tid,
                        slot: p.slot,
                        key: p.arm?.key,
                    };
                    Some((r, result.outcome()))
                })
            };
            if let Some(regs) = self.elsewhere(tid) {
                // Another tracer's: programmed here, under the lock its
                // tracer takes to close it (a detach, an exit, a program
                // of its own pending), so never on a tracee it has let go.
                let mut regs = regs.lock();
                if regs.others() {
                    out.extend(applied(regs.apply(tid, staged(), false)));
                } else {
                    out.extend(gone());
                }
                continue;
            }
            if !self.reaches(tid) {
                out.extend(gone());
                continue;
            }
            let Some(t) = self.tracer.tracees.get_mut(&tid) else {
                out.extend(gone());
                continue;
            };
            out.extend(applied(t.regs.lock().apply(tid, staged(), false)));
        }
        out
    }

    fn clear(&mut self, slots: &[(Tid, u8)]) {
        for &(tid, slot) in slots {
            let p = super::shards::SlotProgram {
                tid,
                slot,
                arm: None,
            };
            if let Some(t) = self.tracer.tracees.get_mut(&tid) {
                t.regs.lock().apply(tid, vec![(0, p)], false);
            } else if let Some(regs) = self.elsewhere(tid) {
                regs.lock().apply(tid, vec![(0, p)], false);
            }
        }
    }
}
