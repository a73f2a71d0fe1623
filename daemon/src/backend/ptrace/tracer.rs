//! A tracer shard: one OS thread that owns its tracees for their whole life
//! (ptrace requests from any other thread fail), its loop, and the commands
//! the facade sends it. Stops are decoded and handled in `stops.rs`.
//!
//! A tracee's state is its [`Phase`] (running, interrupted, held, or a
//! newborn thread whose first stop is not handled yet) and what is asked of
//! its next stop ([`NextStop`]); programs wait in `pending` until a stop.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid as NixPid;

use super::park::{Countdowns, PARK_MAX, ParkQueue};
use super::protocol::{Cmd, Held, ProgramResult, SlotProgram, TraceSink, TraceeState};
use super::regs::{Regs, SharedRegs, Staged};
use super::wake::{
    Bell, CATCH_ALL, FULL_SCAN_EVERY, NAMED, OWED, STRAY_FD, bell_of, scan_all, sigchld_quiet,
    sigchld_seen,
};
use crate::backend::HeldRegisters;
use crate::model::{Pid, Tid};
use crate::procfs;

/// Where a tracee is, as its tracer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// A thread the kernel attached at clone, not armed yet. Its first stop
    /// (`stopped`) and its creator's `PTRACE_EVENT_CLONE` (which names the
    /// `parent`) come in either order; it is armed once both are in.
    Newborn {
        /// Its creator, once the CLONE event named it.
        parent: Option<Tid>,
        /// Its first stop has come (it is waiting in it).
        stopped: bool,
    },
    /// Running, or in a stop we are ending.
    Running,
    /// `PTRACE_INTERRUPT` sent at this time; the stop has not come yet.
    Interrupted(Instant),
    /// Stopped and kept stopped by us.
    Held(Held),
}

/// What a detach reports to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DetachFor {
    /// A Detach command's countdown.
    Request(u64),
    /// Nobody (a new process created by a tracee, a tracer that is ending).
    Nobody,
}

/// What is asked of a tracee's next stop. Acted on at once when it is held.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct NextStop {
    /// Park it there, for these park requests (every one waiting for this
    /// stop: a second request before the stop comes must not take the
    /// first's place, or the first waits for a stop that never comes).
    pub(super) park: Parks,
    /// Hold it there (a peer of a stop-all hit).
    pub(super) hold: bool,
    /// Detach it there (DR7 cleared first); overrides the others.
    pub(super) detach: Option<DetachFor>,
    /// With `hold`: held where a step ended (`Held::Step`), not as a peer.
    pub(super) hold_step: bool,
}

/// The park requests waiting for a tracee's next stop.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Parks(Vec<u64>);

impl Parks {
    /// Another request waits for the stop.
    pub(super) fn add(&mut self, id: u64) {
        if !self.0.contains(&id) {
            self.0.push(id);
        }
    }

    /// The requests waiting, taken (none wait any more).
    pub(super) fn take(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.0)
    }

    /// Whether any request waits.
    pub(super) fn is_some(&self) -> bool {
        !self.0.is_empty()
    }
}

/// One tracee.
pub(super) struct Tracee {
    /// Its process.
    pub(super) pid: Pid,
    /// Its debug registers.
    pub(super) regs: SharedRegs,
    /// Programs waiting for its next stop.
    pub(super) pending: Vec<Staged>,
    pub(super) phase: Phase,
    pub(super) next: NextStop,
    /// In a job-control stop (SIGSTOP & co.): restarts use PTRACE_LISTEN.
    pub(super) job_stopped: bool,
    /// Counts this tracee's parks: tells its current entry in
    /// `Tracer::parked` from those of earlier parks.
    pub(super) park_gen: u32,
    /// The leg of a step it runs (`step.rs`).
    pub(super) step: Option<Box<super::protocol::Running>>,
    /// A single step was issued and its trap not seen yet: the trap can
    /// come after the leg ended (another thread's stop-all ended it), and
    /// is then swallowed, never delivered (its default action kills).
    pub(super) single_in_flight: bool,
    /// The branch its code breakpoint's stop took back, run again when it
    /// is restarted (`rewind.rs`).
    pub(super) undone: Option<crate::arch::current::insn::Undone>,
}

impl Tracee {
    pub(super) fn new(pid: Pid, phase: Phase) -> Self {
        Tracee {
            pid,
            regs: SharedRegs::new(Regs::for_process(pid)),
            pending: Vec::new(),
            phase,
            next: NextStop::default(),
            job_stopped: false,
            park_gen: 0,
            step: None,
            single_in_flight: false,
            undone: None,
        }
    }

    pub(super) fn is_held(&self) -> bool {
        matches!(self.phase, Phase::Held(_))
    }

    pub(super) fn held(&self) -> Option<Held> {
        match self.phase {
            Phase::Held(h) => Some(h),
            _ => None,
        }
    }
}

/// A tracer shard's state.
pub struct Tracer {
    pub(super) index: usize,
    rx: mpsc::Receiver<Cmd>,
    pub(super) bell: Arc<Bell>,
    pub(super) tracees: HashMap<Tid, Tracee>,
    /// Program requests waiting for their tracees' stops.
    pub(super) batches: Countdowns<Vec<(SlotProgram, ProgramResult)>>,
    /// Park requests waiting for their tracees to stop.
    pub(super) parks: Countdowns<Vec<Tid>>,
    /// Detach requests waiting for their tracees.
    pub(super) detaches: Countdowns<usize>,
    pub(super) next_id: u64,
    /// Parked tracees, released after `PARK_MAX` whatever happens to the
    /// request that parked them.
    pub(super) parked: ParkQueue,
    pub(super) sink: std::sync::Weak<dyn TraceSink>,
    pub(super) owner: Arc<DashMap<Tid, usize>>,
    /// The registers of every shard's tracees that their tracer lets the
    /// others program (`Regs::others`), by tid.
    pub(super) reach: Arc<DashMap<Tid, SharedRegs>>,
}

pub(super) fn npid(t: Tid) -> NixPid {
    NixPid::from_raw(t)
}

/// A shard's waits: any tracee kind, only its own, never blocking.
fn reap_flags() -> WaitPidFlag {
    WaitPidFlag::__WALL | WaitPidFlag::__WNOTHREAD | WaitPidFlag::WNOHANG
}

/// Options of every tracee.
pub(super) fn base_options() -> ptrace::Options {
    ptrace::Options::PTRACE_O_TRACECLONE | ptrace::Options::PTRACE_O_TRACEEXEC
}

/// Options of tracee `tid` of `pid`: the leader also reports its exit
/// (`PTRACE_EVENT_EXIT`). A leader that ends alone (`pthread_exit` in
/// `main`) stays a zombie until the last thread exits, and a traced zombie
/// can neither be stopped nor detached (kernel-facts §3b): it is detached at
/// that stop instead, the last moment it can. Other threads exit without
/// the stop (a thread exit costs no round trip to the tracer).
pub(super) fn seize_options(pid: Pid, tid: Tid) -> ptrace::Options {
    if tid == pid {
        base_options() | ptrace::Options::PTRACE_O_TRACEEXIT
    } else {
        base_options()
    }
}

/// How long an interrupted tracee may stay without stopping before the
/// tracer looks whether it can stop at all (a zombie never does).
const STOP_OVERDUE: Duration = Duration::from_millis(500);

impl Tracer {
    pub(super) fn new(
        index: usize,
        rx: mpsc::Receiver<Cmd>,
        bell: Arc<Bell>,
        sink: std::sync::Weak<dyn TraceSink>,
        owner: Arc<DashMap<Tid, usize>>,
        reach: Arc<DashMap<Tid, SharedRegs>>,
    ) -> Self {
        Tracer {
            index,
            rx,
            bell,
            tracees: HashMap::new(),
            batches: Countdowns::default(),
            parks: Countdowns::default(),
            detaches: Countdowns::default(),
            next_id: 0,
            parked: ParkQueue::default(),
            sink,
            owner,
            reach,
        }
    }

    /// Opens tracee `tid` to the other tracers' arming at their stops, or
    /// closes it, as its state now allows: signal stops, past its birth
    /// (its first stop arms it), nothing pending (programs apply in
    /// order), no detach asked. A tracee no longer here is closed. Once
    /// opened, its registers stay in `reach` until it leaves: a closed
    /// tracee's slots can still be cleared by the others (closing a
    /// breakpoint is safe in any state; a slot is reserved to one
    /// watchpoint at a time, so no program pending here is for it).
    pub(super) fn regate(&self, tid: Tid) {
        let Some(t) = self.tracees.get(&tid) else {
            if let Some((_, r)) = self.reach.remove(&tid) {
                r.lock().set_others(false);
            }
            return;
        };
        let mut regs = t.regs.lock();
        let open = regs.has_signal_stops()
            && t.next.detach.is_none()
            && t.pending.is_empty()
            && !matches!(t.phase, Phase::Newborn { .. });
        regs.set_others(open);
        drop(regs);
        if open {
            self.reach.entry(tid).or_insert_with(|| t.regs.clone());
        }
    }

    /// Tracee `t` (`tid`) is leaving this tracer: closed to the others
    /// first.
    pub(super) fn unreach(&self, tid: Tid, t: &Tracee) {
        t.regs.lock().set_others(false);
        self.reach.remove(&tid);
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(super) fn run(&mut self) {
        let mut last_full = Instant::now();
        // The thread's signal mask with SIGCHLD let through: installed only
        // for the time of `ppoll`, so the handler runs nowhere else.
        // SAFETY: reading this thread's mask into a zeroed sigset.
        let wait_mask = unsafe {
            let mut m: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut m);
            libc::sigdelset(&mut m, libc::SIGCHLD);
            m
        };
        let stray = STRAY_FD.load(Ordering::Relaxed);
        let mut sigchld_at = Instant::now();
        loop {
            loop {
                match self.rx.try_recv() {
                    Ok(cmd) => self.command(cmd),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        self.detach_everything();
                        return;
                    }
                }
            }
            self.reap_stopped();
            let mut timeout = if self.tracees.is_empty() { -1 } else { 100 };
            if let Some(left) = self.release_stale_parks() {
                timeout = timeout.min(left.as_millis() as i32 + 1);
            }
            if self.bell.scan.swap(false, Ordering::AcqRel) {
                self.reap();
                last_full = Instant::now();
                self.bell.sweep.store(false, Ordering::Release);
            }
            if self.bell.sweep.load(Ordering::Acquire) {
                // A full scan walks every tracee of the shard, and each
                // event it finds costs another walk: while stops flow, at
                // most one per FULL_SCAN_EVERY (named stops do not wait).
                let since = last_full.elapsed();
                if since >= FULL_SCAN_EVERY {
                    self.bell.sweep.store(false, Ordering::Release);
                    self.reap();
                    last_full = Instant::now();
                } else {
                    timeout = (FULL_SCAN_EVERY - since).as_millis().max(1) as i32;
                }
            }
            // After a large process exits or is detached, give the memory
            // of its tracees back; cheap to check, rare to act.
            self.shrink_spare();
            if OWED.load(Ordering::Acquire) {
                // Once SIGCHLDs stop for CATCH_ALL, look for merged ones.
                let left = CATCH_ALL.saturating_sub(sigchld_at.elapsed());
                if left.is_zero() {
                    sigchld_quiet();
                } else {
                    timeout = timeout.min(left.as_millis().max(1) as i32);
                }
            }
            let mut pfds = [
                libc::pollfd {
                    fd: self.bell.fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: stray,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let ts = libc::timespec {
                tv_sec: (timeout / 1000) as libc::time_t,
                tv_nsec: ((timeout % 1000) as libc::c_long) * 1_000_000,
            };
            let ts_ptr = if timeout < 0 {
                std::ptr::null()
            } else {
                &ts as *const libc::timespec
            };
            // SAFETY: valid pollfds (the stray fd may be -1: ignored), a
            // valid timespec or null, and a valid mask.
            let r = unsafe { libc::ppoll(pfds.as_mut_ptr(), 2, ts_ptr, &wait_mask) };
            if r == 0 && !OWED.load(Ordering::Acquire) {
                // Quiet for 100 ms, or a deferred scan is due.
                self.bell.sweep.store(true, Ordering::Release);
                self.forget_unstoppable();
            }
            let named = NAMED.with(|n| n.replace(0));
            if named != 0 {
                sigchld_at = Instant::now();
                sigchld_seen();
                self.on_named(named);
            }
            if pfds[1].revents & libc::POLLIN != 0 {
                let mut buf = 0u64;
                // SAFETY: draining the eventfd counter into a local.
                let n = unsafe { libc::read(stray, (&mut buf as *mut u64).cast(), 8) };
                if n == 8 {
                    scan_all(true);
                }
            }
            // Drained only when rung: a stop that woke us through SIGCHLD
            // (the common case, one per hit) costs no read.
            if pfds[0].revents & libc::POLLIN != 0 {
                let mut buf = 0u64;
                // SAFETY: draining the eventfd counter into a local.
                unsafe { libc::read(self.bell.fd.as_raw_fd(), (&mut buf as *mut u64).cast(), 8) };
            }
        }
    }

    /// Clears and detaches every tracee (the facade is gone, or the thread
    /// panicked: a tracer that dies leaves armed registers, kernel-facts §2).
    pub(super) fn detach_everything(&mut self) {
        let tids: Vec<Tid> = self.tracees.keys().copied().collect();
        for tid in tids {
            self.request_detach(tid, DetachFor::Nobody);
        }
        // Bounded: tracees that never stop again (killed) are dropped.
        for _ in 0..200 {
            if self.tracees.is_empty() {
                break;
            }
            self.reap();
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Seize { pid, tids, reply } => {
                let mut out = Vec::with_capacity(tids.len());
                for tid in tids {
                    let r = ptrace::seize(npid(tid), seize_options(pid, tid));
                    if r.is_ok() {
                        self.tracees.insert(tid, Tracee::new(pid, Phase::Running));
                        self.owner.insert(tid, self.index);
                        self.regate(tid);
                    }
                    out.push((tid, r));
                }
                let _ = reply.send(out);
            }
            Cmd::Program {
                items,
                in_place,
                reply,
            } => {
                let id = self.fresh_id();
                let mut gone = Vec::new();
                let mut touched = Vec::new();
                for it in items {
                    match self.tracees.get_mut(&it.tid) {
                        // Signal stops: a perf breakpoint opens and closes
                        // on a running thread too. Only a tracee with
                        // nothing pending (programs apply in order), past
                        // its birth (its first stop arms it).
                        Some(t)
                            if in_place
                                && t.next.detach.is_none()
                                && t.pending.is_empty()
                                && t.regs.lock().has_signal_stops()
                                && !matches!(t.phase, Phase::Newborn { .. }) =>
                        {
                            let r = t.regs.lock().apply(it.tid, vec![(id, it)], false);
                            gone.extend(r.into_iter().map(|(_, p, r)| (p, r)));
                        }
                        Some(t) if t.next.detach.is_none() => {
                            t.pending.push((id, it));
                            touched.push(it.tid);
                        }
                        _ => gone.push((it, ProgramResult::Gone)),
                    }
                }
                let n = touched.len();
                self.batches.start(id, n, gone, reply);
                touched.sort_unstable();
                touched.dedup();
                // Interrupt all first; apply as the stops come in.
                for tid in touched {
                    self.regate(tid);
                    self.kick(tid);
                }
            }
            Cmd::Resume { pid, tids, reply } => {
                let all: Vec<Tid> = self
                    .tracees
                    .iter()
                    .filter(|(t, tr)| {
                        tr.pid == pid && tr.is_held() && (tids.is_empty() || tids.contains(t))
                    })
                    .map(|(t, _)| *t)
                    .collect();
                for &tid in &all {
                    if let Some(t) = self.tracees.get_mut(&tid) {
                        t.phase = Phase::Running;
                        t.next.hold = false;
                    }
                    self.restart(tid, None);
                }
                let _ = reply.send(all);
            }
            Cmd::HoldAll { pid, except } => {
                let mut kick = Vec::new();
                for (&t, tr) in self.tracees.iter_mut() {
                    if tr.pid != pid || t == except {
                        continue;
                    }
                    match tr.phase {
                        Phase::Held(Held::Parked(_)) => tr.phase = Phase::Held(Held::Peer),
                        Phase::Held(_) => {}
                        _ => {
                            tr.next.hold = true;
                            kick.push(t);
                        }
                    }
                }
                for tid in kick {
                    self.kick(tid);
                }
            }
            Cmd::Detach { pid, reply } => {
                let tids: Vec<Tid> = self
                    .tracees
                    .iter()
                    .filter(|(_, t)| t.pid == pid)
                    .map(|(t, _)| *t)
                    .collect();
                let id = self.fresh_id();
                self.detaches.start(id, tids.len(), 0, reply);
                for tid in tids {
                    self.request_detach(tid, DetachFor::Request(id));
                }
            }
            Cmd::Park { tids, hold, reply } => {
                let id = self.fresh_id();
                let mut stopped = Vec::new();
                let mut kick = Vec::new();
                for tid in tids {
                    match self.tracees.get_mut(&tid) {
                        Some(t) if t.next.detach.is_some() => {}
                        Some(t) if t.is_held() => {
                            if hold && matches!(t.phase, Phase::Held(Held::Parked(_))) {
                                t.phase = Phase::Held(Held::Peer);
                            }
                            stopped.push(tid)
                        }
                        Some(t) => {
                            t.next.park.add(id);
                            t.next.hold |= hold;
                            kick.push(tid);
                        }
                        None => {}
                    }
                }
                tracing::debug!(
                    shard = self.index,
                    id,
                    hold,
                    ?stopped,
                    kick = ?kick
                        .iter()
                        .map(|t| (*t, self.tracees.get(t).map(|x| x.phase)))
                        .collect::<Vec<_>>(),
                    "park"
                );
                self.parks.start(id, kick.len(), stopped, reply);
                for tid in kick {
                    self.kick(tid);
                }
            }
            Cmd::Registers { tid, reply } => {
                let regs = self.tracees.get(&tid).and_then(|t| {
                    let held = t.held()?;
                    let r = nix::sys::ptrace::getregs(nix::unistd::Pid::from_raw(tid)).ok()?;
                    let r = crate::arch::current::UserRegs::from(&r);
                    Some(HeldRegisters {
                        ip: r.ip,
                        sp: r.sp,
                        fp: r.fp,
                        general: crate::arch::current::GENERAL_REGISTERS
                            .into_iter()
                            .zip(r.general)
                            .collect(),
                        after_hit: held == Held::Hit,
                    })
                });
                let _ = reply.send(regs);
            }
            Cmd::Unpark { tids } => {
                for tid in tids {
                    self.unpark_one(tid);
                }
            }
            Cmd::StepLeg {
                tid,
                single,
                keys,
                reply,
            } => self.step_leg(tid, single, keys, reply),
            Cmd::StepDone { tid, reply } => {
                self.step_done(tid);
                let _ = reply.send(());
            }
            Cmd::LeaveTrampoline { tid, ret, reply } => {
                let _ = reply.send(self.leave_trampoline(tid, ret));
            }
            Cmd::States { pid, reply } => {
                let v = self
                    .tracees
                    .iter()
                    .filter(|(_, t)| t.pid == pid)
                    .map(|(tid, t)| {
                        (
                            *tid,
                            TraceeState {
                                held: t.held(),
                                group_stopped: t.job_stopped,
                                stepping: t.step.is_some(),
                            },
                        )
                    })
                    .collect();
                let _ = reply.send(v);
            }
        }
    }

    /// Makes sure `tid` reaches a stop soon: if it is held (in a stop we
    /// keep) apply right away; else interrupt it.
    pub(super) fn kick(&mut self, tid: Tid) {
        let Some(t) = self.tracees.get_mut(&tid) else {
            return;
        };
        match t.phase {
            Phase::Held(_) => {
                // Already in a ptrace-stop we own: apply now, stay stopped.
                self.apply(tid);
                if self
                    .tracees
                    .get(&tid)
                    .is_some_and(|t| t.next.detach.is_some())
                {
                    if self.trap_queued(tid) {
                        // As in `after_stop`: let the queued hit be reported
                        // (and swallowed) first; it detaches there.
                        if let Some(t) = self.tracees.get_mut(&tid) {
                            t.phase = Phase::Running;
                        }
                        self.restart(tid, None);
                    } else {
                        self.do_detach(tid, None);
                    }
                }
            }
            Phase::Running => {
                t.phase = Phase::Interrupted(Instant::now());
                if ptrace::interrupt(npid(tid)) == Err(Errno::ESRCH) {
                    // Exited (its exit is reaped later) or not stoppable.
                    self.forget(tid);
                }
            }
            // A stop is coming (or the newborn's first stop is awaited).
            Phase::Interrupted(_) | Phase::Newborn { .. } => {}
        }
    }

    /// A hit's SIGTRAP waits behind the current stop of `tid` (only
    /// possible once it was armed): detached before reporting it, the thread
    /// would receive it untraced and die.
    pub(super) fn trap_queued(&self, tid: Tid) -> bool {
        self.tracees.get(&tid).is_some_and(|t| {
            let regs = t.regs.lock();
            (regs.ever_armed != 0 && super::signal_bp::pending(tid, regs.hit_signal()))
                || ((t.single_in_flight || t.step.as_ref().is_some_and(|s| s.single))
                    && super::signal_bp::pending(tid, Signal::SIGTRAP))
        })
    }

    pub(super) fn request_detach(&mut self, tid: Tid, done: DetachFor) {
        let Some(t) = self.tracees.get_mut(&tid) else {
            if let DetachFor::Request(id) = done {
                self.detaches.progress(id, |_| {});
            }
            return;
        };
        t.next.detach = Some(done);
        // Closed to the other tracers before its slots are let go.
        self.regate(tid);
        if let Some(t) = self.tracees.get(&tid) {
            t.regs.lock().clear();
        }
        self.kick(tid);
    }

    /// Writes the desired registers; resolves pending programs.
    pub(super) fn apply(&mut self, tid: Tid) {
        let Some(t) = self.tracees.get_mut(&tid) else {
            return;
        };
        let pending = std::mem::take(&mut t.pending);
        let had = !pending.is_empty();
        let detaching = t.next.detach.is_some();
        let outcome = t.regs.lock().apply(tid, pending, detaching);
        for (batch, p, r) in outcome {
            self.batches.progress(batch, |v| v.push((p, r)));
        }
        if had {
            self.regate(tid);
        }
    }

    pub(super) fn unpark_one(&mut self, tid: Tid) {
        if let Some(t) = self.tracees.get_mut(&tid)
            && matches!(t.phase, Phase::Held(Held::Parked(_)))
        {
            t.phase = Phase::Running;
            self.restart(tid, None);
        }
    }

    /// Restarts tracees parked for longer than `PARK_MAX` (their request
    /// never came back); the time until the next one is due.
    fn release_stale_parks(&mut self) -> Option<Duration> {
        let now = Instant::now();
        loop {
            let tracees = &self.tracees;
            let due = self.parked.pop_due(now, PARK_MAX, |tid, generation| {
                tracees
                    .get(&tid)
                    .is_some_and(|t| t.phase == Phase::Held(Held::Parked(generation)))
            });
            match due {
                Some(tid) => self.unpark_one(tid),
                None => return self.parked.next_due(now, PARK_MAX),
            }
        }
    }

    /// Tracees interrupted long ago that cannot stop any more (they exited:
    /// a zombie is neither stopped nor reported until its group ends,
    /// kernel-facts §3b) are forgotten, so that nothing waits for them.
    fn forget_unstoppable(&mut self) {
        let overdue: Vec<(Tid, Pid)> = self
            .tracees
            .iter()
            .filter(
                |(_, t)| matches!(t.phase, Phase::Interrupted(at) if at.elapsed() > STOP_OVERDUE),
            )
            .map(|(&tid, t)| (tid, t.pid))
            .collect();
        for (tid, pid) in overdue {
            if procfs::thread_exited(pid, tid) {
                self.forget(tid);
            }
        }
    }

    /// Drops a tracee that vanished; fails its pending programs.
    pub(super) fn forget(&mut self, tid: Tid) {
        if let Some(t) = self.tracees.remove(&tid) {
            self.owner.remove(&tid);
            self.unreach(tid, &t);
            self.finish_requests(tid, &t);
            if let Some(sink) = self.sink.upgrade() {
                sink.thread_exited(t.pid, tid);
            }
        }
    }

    /// Answers what requests waited for of a tracee that is leaving (gone
    /// or detached).
    pub(super) fn finish_requests(&mut self, _tid: Tid, t: &Tracee) {
        for &id in &t.next.park.0 {
            self.parks.progress(id, |_| {});
        }
        for &(batch, p) in &t.pending {
            self.batches
                .progress(batch, |v| v.push((p, ProgramResult::Gone)));
        }
        if let Some(DetachFor::Request(id)) = t.next.detach {
            self.detaches.progress(id, |n| *n += 1);
        }
        if let Some(s) = &t.step {
            s.gone();
        }
    }

    /// Detaches a tracee in a ptrace-stop (its registers cleared by
    /// `apply` already), delivering `sig`.
    pub(super) fn do_detach(&mut self, tid: Tid, sig: Option<Signal>) {
        self.redo_branch(tid);
        let Some(t) = self.tracees.remove(&tid) else {
            return;
        };
        self.owner.remove(&tid);
        self.unreach(tid, &t);
        let _ = ptrace::detach(npid(tid), sig);
        self.finish_requests(tid, &t);
    }

    /// Ends the current stop: LISTEN if the process is job-control stopped
    /// (so SIGCONT still works), else CONT with `sig` (delivered unchanged).
    pub(super) fn restart(&mut self, tid: Tid, sig: Option<Signal>) {
        self.redo_branch(tid);
        if self.step_restart(tid, sig).is_some() {
            return;
        }
        let group = self.tracees.get(&tid).is_some_and(|t| t.job_stopped);
        let _ = if group && sig.is_none() {
            // SAFETY: PTRACE_LISTEN takes no addr/data.
            let r = unsafe { libc::ptrace(libc::PTRACE_LISTEN, tid, 0, 0) };
            if r < 0 { Err(Errno::last()) } else { Ok(()) }
        } else {
            ptrace::cont(npid(tid), sig)
        };
        // ESRCH: killed while stopped; its exit will be reaped.
    }

    /// A SIGCHLD this thread took named `tid`: collect it if it is ours,
    /// else hand it to its tracer; a tid nobody owns yet (a thread just
    /// created, whose creator's clone event is not handled yet) makes
    /// every shard scan.
    fn on_named(&mut self, tid: Tid) {
        if self.tracees.contains_key(&tid) {
            self.collect(tid);
        } else if let Some(bell) = bell_of(tid) {
            bell.stopped(tid);
        } else {
            scan_all(true);
        }
    }

    /// Collects the events of the tracees other tracers named.
    fn reap_stopped(&mut self) {
        let tids = std::mem::take(&mut *self.bell.stopped.lock().unwrap());
        for tid in tids {
            self.collect(tid);
        }
    }

    /// Collects `tid`'s pending event, if any, with a `waitpid` on that tid
    /// alone (the kernel finds it without walking the shard's other
    /// tracees).
    pub(super) fn collect(&mut self, tid: Tid) {
        match waitpid(npid(tid), Some(reap_flags())) {
            Ok(WaitStatus::StillAlive) | Err(_) => {}
            Ok(st) => self.event(st),
        }
    }

    /// Collects every pending event of this shard's tracees.
    pub(super) fn reap(&mut self) {
        loop {
            match waitpid(None::<NixPid>, Some(reap_flags())) {
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(st) => self.event(st),
            }
        }
    }

    /// Gives back what a large process left in the tracer's own tables: the
    /// tracee map, and the queue of parked tracees (a stop-all pass over
    /// 10,000 threads grows it to 16,384 entries, which stayed allocated
    /// after the process had gone).
    fn shrink_spare(&mut self) {
        fn spare(capacity: usize, len: usize) -> bool {
            capacity > 4 * len + 256
        }
        if spare(self.tracees.capacity(), self.tracees.len()) {
            self.tracees.shrink_to_fit();
        }
        if spare(self.parked.0.capacity(), self.parked.0.len()) {
            self.parked.0.shrink_to_fit();
        }
        self.batches.shrink();
        self.parks.shrink();
        self.detaches.shrink();
    }
}
