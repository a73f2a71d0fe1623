//! The perf backend: `perf_event_open` hardware breakpoints. The target
//! never stops; new threads get a process-wide watchpoint from the kernel
//! inside `clone()` (inheritance), before they run; breakpoints die with the
//! daemon's fds, so a killed daemon never leaves an armed target.
//!
//! - `kernel.rs`: the events ([`Perf`]: collectors, trackers, breakpoints),
//!   built from `attr.rs` (what each event asks of the kernel), opened
//!   through `sys.rs` (the syscalls, replaceable in unit tests), counted in
//!   `fds.rs` (the fd budget); `collector.rs` maps and reads the per-CPU
//!   rings, `record.rs` decodes their records; `ring/` is the per-thread
//!   path's BPF program and ring.
//! - `drain.rs`: the drain thread: rings → thread lifecycle and hits.
//! - this file: [`PerfEngine`], the [`Backend`]: tracking threads, arming,
//!   reconciling threads born while a watchpoint was being armed, disarming.
//!
//! What it keeps per process and watchpoint (the fds it opened, the sample
//! ids that name a watchpoint) lives here, not in the core's state.

pub mod attr;
pub mod collector;
pub mod drain;
pub mod kernel;
pub mod record;
pub mod ring;
pub mod sys;

use std::collections::HashSet;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use dashmap::DashMap;
use nix::errno::Errno;

use super::fanout::fan_out;
use super::probe::SlotProbe;
use super::{ArmReport, Backend, BackendStats, Features, Host, Unavailable};
use crate::arch;
use crate::error::WpdError;
use crate::ledger::{Inheritance, Outcome, Reservation, Retained, classify};
use crate::model::{Pid, SlotKey, Tid, WatchId};
use crate::procfs;
use crate::state::{OpGuard, Process, Watch};

/// Longest a `sync` waits for a hit record another CPU's program has
/// reserved and not submitted (microseconds, unless that CPU stalls: a
/// virtual CPU the host has descheduled).
const SYNC_BOUND: std::time::Duration = std::time::Duration::from_millis(100);
pub use attr::Inherit;
pub use kernel::{EventsPolicy, Lost, Perf, ThreadEvents};
pub use record::Record;
pub use sys::PerfError;

/// The perf backend.
pub struct PerfEngine {
    perf: Perf,
    probe: Option<Arc<SlotProbe>>,
    host: Weak<dyn Host>,
    /// Sample id (the primary id of an event we opened, also carried by its
    /// inherited copies) → the watchpoint's piece.
    event_ids: DashMap<u64, SlotKey>,
    /// Events opened explicitly, by watchpoint and thread (one per piece). Kept until the
    /// watchpoint is removed, even after the thread exits: closing one also
    /// removes the copies the kernel made for the threads it created.
    events: DashMap<WatchId, Vec<(Tid, ThreadEvents)>>,
    /// Thread-tracking events, by process; kept until detach for the same
    /// reason. On the per-thread path there are none (the collectors see
    /// every task): the entry marks the process tracked.
    trackers: DashMap<Pid, Vec<OwnedFd>>,
    /// When each process was attached on the per-thread path (kernel
    /// clock): the collectors' rings may still hold its records from
    /// before (its own exec, above all), which must not count.
    attached_at: DashMap<Pid, u64>,
    /// Forked children carrying watchpoints that follow forks (by
    /// inheritance), with those watchpoints: their own children inherit
    /// the same.
    forked: DashMap<Pid, Vec<WatchId>>,
    /// An eventfd in the drain thread's poll: written when a process gets
    /// tracked, so that a drain waiting out its idle timeout (nothing was
    /// tracked) switches to the short one at once, and a first hit does not
    /// wait up to a second.
    wake: OwnedFd,
    /// Threads whose EXIT record was read before their FORK record.
    early_exits: Mutex<drain::EarlyExits>,
    /// The same for processes that are no tracked process's threads: forked
    /// children, whose FORK sits in the parent's CPU ring and EXIT in the
    /// child's.
    early_child_exits: Mutex<drain::EarlyExits>,
    /// CLOCK_REALTIME − CLOCK_MONOTONIC at start, to date records.
    clock_offset: u64,
    /// The store instruction at each hit address, by watched process: what
    /// a hit's store wrote, from the registers its breakpoint recorded.
    stores: crate::backend::stored::Stores,
    stop: AtomicBool,
}

impl std::fmt::Debug for PerfEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerfEngine")
            .field("perf", &self.perf)
            .finish()
    }
}

/// The typed refusal of `threads` × CPUs event fds that do not fit under
/// `RLIMIT_NOFILE`, by the kernel (EMFILE) or by the daemon's own count.
/// Called after what the request opened was closed.
fn fd_limit(perf: &Perf, what: &'static str, threads: usize, by_kernel: bool) -> WpdError {
    let cpus = perf.fds_per_thread();
    let detail = if cpus == 1 {
        format!("{threads} threads × 1 event")
    } else {
        format!("{threads} threads × {cpus} CPUs")
    };
    perf.fds().refusal(what, threads * cpus, detail, by_kernel)
}

fn perf_err(e: PerfError) -> WpdError {
    WpdError::kernel(e.op, e.errno)
}

/// What one [`fan_out`] worker of an arm pass did with its reservations.
struct ArmChunk {
    opened: Vec<(Tid, ThreadEvents)>,
    /// Each of its reservations, with what became of it.
    outcomes: Vec<(Reservation, Outcome)>,
    /// The kernel said ENOSPC on one of them.
    full: bool,
    fatal: Option<PerfError>,
}

impl ArmChunk {
    fn with_capacity(n: usize) -> Self {
        ArmChunk {
            opened: Vec::with_capacity(n),
            outcomes: Vec::with_capacity(n),
            full: false,
            fatal: None,
        }
    }
}

impl PerfEngine {
    /// What it can do.
    pub const FEATURES: Features = Features {
        stops: false,
        only_on_change: false,
        exact_values: true,
        follow_forks: true,
        thread_names: true,
        signal_at_hit: false,
        code_events: false,
        arms_while_traced: true,
        feedback: true,
    };

    /// Opens the per-CPU rings; its events are counted in `fds`, the
    /// daemon's budget.
    pub fn new(
        host: Weak<dyn Host>,
        probe: Option<Arc<SlotProbe>>,
        fds: Arc<crate::backend::fds::FdBudget>,
        opts: &crate::backend::SystemOptions,
    ) -> Result<PerfEngine, Unavailable> {
        let ring_bytes = opts.perf_ring_kib.map(|k| k as usize * 1024);
        let perf =
            Perf::new(opts.perf_events, ring_bytes, fds).map_err(|e| Unavailable::Kernel {
                op: e.op,
                errno: e.errno,
                needs: format!(
                    "the perf backend needs CAP_PERFMON or root for its per-CPU rings \
                 (perf_event_paranoid={})",
                    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
                        .unwrap_or_default()
                        .trim()
                ),
            })?;
        // SAFETY: eventfd has no memory-safety preconditions; the fd is new
        // and owned here.
        let wake = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if wake < 0 {
            return Err(Unavailable::Kernel {
                op: "eventfd",
                errno: Errno::last(),
                needs: "a file descriptor for the drain thread's wake-ups".into(),
            });
        }
        // SAFETY: `wake` is a valid fd nobody else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        Ok(PerfEngine {
            perf,
            probe,
            host,
            event_ids: DashMap::new(),
            events: DashMap::new(),
            trackers: DashMap::new(),
            attached_at: DashMap::new(),
            forked: DashMap::new(),
            wake,
            early_exits: Mutex::new(drain::EarlyExits::default()),
            early_child_exits: Mutex::new(drain::EarlyExits::default()),
            clock_offset: crate::clock::realtime_ns().saturating_sub(crate::clock::monotonic_ns()),
            stores: Default::default(),
            stop: AtomicBool::new(false),
        })
    }

    /// Wakes the drain thread (see `wake`).
    fn wake_drain(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our eventfd; a full
        // counter (EAGAIN) means a wake-up is pending already.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Online CPUs (events are opened per CPU).
    pub fn cpus(&self) -> usize {
        self.perf.cpus().len()
    }

    fn host(&self) -> Result<Arc<dyn Host>, WpdError> {
        self.host
            .upgrade()
            .ok_or_else(|| WpdError::kernel("daemon shutting down", Errno::ESHUTDOWN))
    }

    /// Processes every record already in the rings.
    pub fn drain_now(&self) {
        if let Some(host) = self.host.upgrade() {
            let mut values = drain::ValueCache::default();
            self.perf
                .drain(&mut |r| self.on_record(&*host, r, &mut values));
        }
    }

    /// Opens piece `key` of `spec` on `tid`: one event (per-thread path) or
    /// one per CPU. `progs`: the per-thread path's programs, by piece.
    fn open_piece(
        &self,
        tid: Tid,
        key: SlotKey,
        spec: &crate::model::WatchSpec,
        inherit: bool,
        progs: &[Arc<OwnedFd>],
        sink: &dyn Fn(u64),
    ) -> Result<ThreadEvents, PerfError> {
        let piece = spec.range.piece(key.piece);
        let inherit = match (inherit, spec.follow_forks) {
            (false, _) => Inherit::No,
            (true, false) => Inherit::Threads,
            (true, true) => Inherit::ThreadsAndForks,
        };
        let signal = spec.feedback.as_ref().and_then(|f| f.sig_data);
        match progs.get(usize::from(key.piece)) {
            Some(prog) if self.perf.hit_ring().is_some() => {
                let fd = self.perf.open_breakpoint_bpf(
                    tid,
                    piece,
                    spec.access,
                    inherit,
                    prog,
                    signal,
                )?;
                Ok(ThreadEvents {
                    fds: vec![fd],
                    ids: Vec::new(),
                })
            }
            _ => self.perf.open_breakpoint(
                tid,
                piece,
                spec.access,
                inherit,
                // An aggregate watchpoint samples no registers: its ring
                // holds four times as many of its hits.
                (u16::from(spec.backtrace), spec.aggregate.is_none()),
                signal,
                sink,
            ),
        }
    }

    /// What `w`'s programs judge at the trap (per-thread path, where the
    /// kernel takes judged programs): its filter but the rate limit, and
    /// its signal action. None: the daemon judges its hits.
    pub(crate) fn judge_of(&self, w: &Watch) -> Option<ring::Judge> {
        let ring = self.perf.hit_ring()?;
        if !ring.judges() {
            return None;
        }
        ring::Judge::of(&w.spec.filter, w.spec.action)
    }

    /// The per-thread path's programs of every piece of `w` (empty on the
    /// per-CPU path).
    fn programs(&self, w: &Watch) -> Result<Vec<Arc<OwnedFd>>, PerfError> {
        let Some(ring) = self.perf.hit_ring() else {
            return Ok(Vec::new());
        };
        let depth = if w.spec.backtrace > 0 {
            (u16::from(w.spec.backtrace) + 1).min(kernel::max_stack())
        } else {
            0
        };
        let judge = self.judge_of(w);
        (0..w.spec.range.slots() as u8)
            .map(|p| {
                let key = SlotKey::new(w.id, p);
                let len = w.spec.range.piece(p).len.bytes();
                ring.program_for(key, len, depth, judge.as_ref(), w.spec.feedback.is_some())
                    .map_err(|errno| PerfError {
                        op: "bpf(BPF_PROG_LOAD)",
                        errno,
                    })
            })
            .collect()
    }

    /// Attach on the per-thread path: the collectors already see every
    /// thread created from now on, so one listing of the threads suffices.
    fn attach_per_thread(&self, op: &OpGuard<'_>) -> Result<(), WpdError> {
        let host = self.host()?;
        let ledger = host.ledger();
        let pid = op.pid();
        // Tracked from here: FORK and EXIT records of the process are kept.
        let since = crate::clock::monotonic_ns();
        self.attached_at.insert(pid, since);
        self.trackers.entry(pid).or_default();
        self.wake_drain();
        let Ok(tids) = procfs::tasks(pid) else {
            self.trackers.remove(&pid);
            self.attached_at.remove(&pid);
            return Err(WpdError::NoSuchProcess(pid));
        };
        for &tid in &tids {
            ledger.add_thread(pid, tid);
        }
        // A thread that exited after the listing may have had its EXIT
        // record read before it was added: the drain kept it among the
        // early exits (an EXIT read after it was added removed it).
        self.drain_now();
        let mut early = self.early_exits.lock().unwrap();
        for tid in tids {
            if early.take(tid, since) {
                ledger.remove_thread(tid);
            }
        }
        drop(early);
        if ledger.thread_count(pid) == 0 {
            self.trackers.remove(&pid);
            self.attached_at.remove(&pid);
            return Err(WpdError::NoSuchProcess(pid));
        }
        Ok(())
    }

    /// Makes every thread of `proc` carry every process-wide watchpoint:
    /// threads created while a watchpoint was being armed on their creator
    /// may or may not have inherited it (see `ledger::classify`); decide from
    /// timestamps where possible, else ask the kernel, and arm the ones that
    /// did not inherit.
    fn reconcile_proc(&self, host: &dyn Host, proc: &Process) {
        let wide = host.wide_watches(proc.pid);
        if wide.is_empty() {
            return;
        }
        let ledger = host.ledger();
        for _round in 0..8 {
            self.drain_now();
            let mut changed = false;
            for tid in ledger.tids(proc.pid) {
                for w in &wide {
                    let mut missing = false;
                    for piece in 0..w.spec.range.slots() as u8 {
                        let key = SlotKey::new(w.id, piece);
                        let Some(row) = ledger.get(tid) else {
                            break;
                        };
                        let slot = row.slot_of(key);
                        let uncertain = slot.is_some_and(|s| row.uncertain & (1 << s) != 0);
                        if slot.is_some() && !uncertain {
                            continue;
                        }
                        if uncertain {
                            let verdict = self.inheritance_verdict(host, &row, key, tid);
                            ledger.resolve_uncertain(tid, key, verdict, row.born());
                            if verdict {
                                continue;
                            }
                        }
                        missing = true;
                    }
                    if missing {
                        changed = true;
                        self.arm_one(host, proc, w, tid);
                    }
                }
            }
            if !changed {
                return;
            }
        }
    }

    /// Did `tid` inherit `key` from its creator? Timestamps first, then a
    /// kernel probe of free slots.
    fn inheritance_verdict(
        &self,
        host: &dyn Host,
        row: &crate::ledger::ThreadSlots,
        key: SlotKey,
        tid: Tid,
    ) -> bool {
        if let Some(parent) = host.ledger().get(row.parent)
            && let Some(s) = parent.slot_of(key)
            && parent.ours & (1 << s) != 0
        {
            let w = parent.window(s);
            match classify(row.born(), w.absent_before, w.certain_from) {
                Inheritance::Inherited => return true,
                Inheritance::Missing => return false,
                Inheritance::Unknown => {}
            }
        }
        let known = row.ours.count_ones() as usize;
        match self
            .probe
            .as_ref()
            .map(|p| p.free_slots(tid, arch::current::SLOTS))
        {
            // As many free slots as if it had none of the uncertain ones.
            Some(Ok(free)) => free + known < arch::current::SLOTS,
            _ => true,
        }
    }

    /// Arms the pieces of `w` that `tid` lacks (all of them or none),
    /// reserved and settled through the host.
    fn arm_one(&self, host: &dyn Host, proc: &Process, w: &Watch, tid: Tid) {
        let mut res = Vec::new();
        if host
            .reserve_thread(tid, w, true, Retained::Avoid, &mut res)
            .is_err()
        {
            tracing::warn!(
                pid = proc.pid,
                tid,
                id = w.id.0,
                pieces = w.spec.range.slots(),
                "new thread has too few free slots for a process-wide watchpoint"
            );
            return;
        }
        // Gone, or it has the watchpoint already: `res` is empty.
        let progs = match self.programs(w) {
            Ok(p) => p,
            Err(e) => {
                host.settle(&not_armed(&res));
                tracing::warn!(
                    pid = proc.pid,
                    tid,
                    id = w.id.0,
                    "{}: {}",
                    e.op,
                    e.errno.desc()
                );
                return;
            }
        };
        for (i, r) in res.iter().enumerate() {
            let sink = |eid: u64| {
                self.event_ids.insert(eid, r.key);
            };
            let t0 = crate::clock::monotonic_ns();
            match self.open_piece(tid, r.key, &w.spec, true, &progs, &sink) {
                Ok(ev) => {
                    let t1 = crate::clock::monotonic_ns();
                    host.settle(&[(*r, Outcome::Armed(Some((t0, t1))))]);
                    self.events.entry(w.id).or_default().push((tid, ev));
                }
                Err(e) => {
                    // The pieces armed stay (the thread's listing shows the
                    // gap); those not tried yet are given back.
                    let mut report = not_armed(&res[i..]);
                    report[0].1 = Outcome::of_errno(e.errno);
                    host.settle(&report);
                    if e.errno != Errno::ESRCH {
                        // EMFILE above all: the thread stays without this
                        // watchpoint, as `ListThreads` shows.
                        tracing::warn!(
                            pid = proc.pid,
                            tid,
                            id = w.id.0,
                            "{} failed on a new thread: {}",
                            e.op,
                            e.errno.desc()
                        );
                    }
                    return;
                }
            }
        }
    }
}

/// Reservations not armed, as reported.
fn not_armed(res: &[Reservation]) -> Vec<(Reservation, Outcome)> {
    res.iter().map(|&r| (r, Outcome::NotArmed)).collect()
}

impl Backend for PerfEngine {
    fn kind(&self) -> crate::model::BackendKind {
        crate::model::BackendKind::Perf
    }

    fn filtered_at_trap(&self, id: WatchId) -> u64 {
        self.perf
            .hit_ring()
            .and_then(|r| r.judged(id))
            .map_or(0, |(filtered, _)| filtered)
    }

    fn features(&self) -> Features {
        Features {
            // The per-thread path's program judges the filter and sends
            // the signal at the trap.
            signal_at_hit: self.perf.hit_ring().is_some_and(|r| r.judges()),
            code_events: false,
            ..Self::FEATURES
        }
    }

    fn retained(&self) -> Retained {
        Retained::Avoid
    }

    fn start(self: Arc<Self>) {
        std::thread::Builder::new()
            .name("wpd-drain".into())
            .spawn(move || self.drain_loop())
            .expect("spawn drain");
    }

    /// Opens trackers on every thread, rescanning until no thread is new:
    /// a thread created by a tracked thread is tracked by inheritance, one
    /// created by a not-yet-tracked thread shows up in the next scan.
    fn attach(&self, op: &OpGuard<'_>) -> Result<(), WpdError> {
        if self.perf.hit_ring().is_some() {
            return self.attach_per_thread(op);
        }
        let host = self.host()?;
        let ledger = host.ledger();
        let pid = op.pid();
        let by = op.process().attached_by;
        let perf = &self.perf;
        let mut tracked: HashSet<Tid> = HashSet::new();
        let result = (|| {
            loop {
                let mut tids = procfs::tasks(pid).map_err(|_| WpdError::NoSuchProcess(pid))?;
                let all = tids.len();
                tids.retain(|&t| tracked.insert(t));
                if tids.is_empty() {
                    break;
                }
                // The trackers must fit (what was tracked is undone below).
                if !perf.fd_room(by, tids.len() * perf.cpus().len()) {
                    return Err(fd_limit(perf, "attach", tids.len(), false));
                }
                // Room for the trackers and a first watchpoint's breakpoints.
                perf.reserve_fds(2 * all * perf.cpus().len());
                let chunks = fan_out(&tids, perf.cpus().len(), |chunk| {
                    let mut fds = Vec::with_capacity(chunk.len() * perf.cpus().len());
                    for &tid in chunk {
                        match perf.open_tracker(tid) {
                            Ok(f) => {
                                fds.extend(f);
                                ledger.add_thread(pid, tid);
                            }
                            // Gone, or a zombie leader (its exit is past).
                            Err(e) if e.errno == Errno::ESRCH => {}
                            Err(e) => return Err((fds, e)),
                        }
                    }
                    Ok(fds)
                });
                let mut failed = None;
                for c in chunks {
                    let fds = match c {
                        Ok(fds) => fds,
                        Err((fds, e)) => {
                            failed = failed.or(Some(e));
                            fds
                        }
                    };
                    self.trackers.entry(pid).or_default().extend(fds);
                }
                self.wake_drain();
                match failed {
                    None => {}
                    Some(e) if matches!(e.errno, Errno::EACCES | Errno::EPERM) => {
                        return Err(WpdError::PermissionDenied {
                            pid,
                            detail: format!("{} refused: {}", e.op, e.errno.desc()),
                        });
                    }
                    Some(e) if e.errno == Errno::EMFILE => {
                        return Err(fd_limit(perf, "attach", tids.len(), true));
                    }
                    Some(e) => return Err(perf_err(e)),
                }
            }
            if ledger.thread_count(pid) == 0 {
                return Err(WpdError::NoSuchProcess(pid));
            }
            Ok(())
        })();
        if result.is_err() {
            self.detach(op.process());
        }
        result
    }

    fn sync(&self) {
        // Through every hit reserved before now: a program still writing
        // one on another CPU holds back the records after it (see
        // `drain_through`; it takes microseconds, unless that CPU stalls).
        if let Some(host) = self.host.upgrade() {
            let mut values = drain::ValueCache::default();
            self.perf
                .drain_through(&mut |r| self.on_record(&*host, r, &mut values), SYNC_BOUND);
        }
    }

    /// Opens the breakpoint on every reserved thread (inheritable when
    /// process-wide); all or nothing: a refused arm closes what it opened.
    fn arm(&self, op: &OpGuard<'_>, watch: &Arc<Watch>, res: &[Reservation]) -> ArmReport {
        let perf = &self.perf;
        let spec = &watch.spec;
        let (pid, id, process_wide) = (op.pid(), watch.id, watch.process_wide);
        if !perf.fd_room(watch.owner, res.len() * perf.fds_per_thread()) {
            return ArmReport::refused(res, fd_limit(perf, "this watchpoint", res.len(), false));
        }
        let progs = match self.programs(watch) {
            Ok(p) => p,
            Err(e) => return ArmReport::refused(res, perf_err(e)),
        };
        perf.reserve_fds(res.len() * perf.fds_per_thread());
        let registered = Mutex::new(Vec::new());
        let stop = AtomicBool::new(false);
        let chunks = fan_out(res, perf.cpus().len(), |chunk| {
            let mut c = ArmChunk::with_capacity(chunk.len());
            for (i, r) in chunk.iter().enumerate() {
                if stop.load(Ordering::Relaxed) {
                    c.outcomes
                        .extend(chunk[i..].iter().map(|&r| (r, Outcome::NotArmed)));
                    break;
                }
                let sink = |eid: u64| {
                    self.event_ids.insert(eid, r.key);
                    registered.lock().unwrap().push(eid);
                };
                let t0 = crate::clock::monotonic_ns();
                match self.open_piece(r.tid, r.key, spec, process_wide, &progs, &sink) {
                    Ok(ev) => {
                        let times = (t0, crate::clock::monotonic_ns());
                        c.opened.push((r.tid, ev));
                        c.outcomes
                            .push((*r, Outcome::Armed(process_wide.then_some(times))));
                    }
                    Err(e) if matches!(e.errno, Errno::ESRCH | Errno::ENOSPC) => {
                        c.full |= e.errno == Errno::ENOSPC;
                        c.outcomes.push((*r, Outcome::of_errno(e.errno)));
                    }
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        c.fatal = Some(e);
                        c.outcomes.push((*r, Outcome::Failed(e.errno)));
                        c.outcomes
                            .extend(chunk[i + 1..].iter().map(|&r| (r, Outcome::NotArmed)));
                        break;
                    }
                }
            }
            c
        });
        let mut all = ArmChunk::with_capacity(res.len());
        for c in chunks {
            all.opened.extend(c.opened);
            all.outcomes.extend(c.outcomes);
            all.full |= c.full;
            all.fatal = all.fatal.or(c.fatal);
        }
        let ArmChunk {
            opened,
            mut outcomes,
            full,
            fatal,
        } = all;
        if !full && fatal.is_none() {
            self.events.entry(id).or_default().extend(opened);
            return ArmReport {
                outcomes,
                refused: None,
            };
        }
        // Refused: what was opened is closed again, and so not armed.
        let n: usize = opened.iter().map(|(_, e)| e.fds.len()).sum();
        drop(opened);
        perf.forget_fds(n);
        for eid in registered.lock().unwrap().iter() {
            self.event_ids.remove(eid);
        }
        for (_, o) in &mut outcomes {
            if matches!(o, Outcome::Armed(_)) {
                *o = Outcome::NotArmed;
            }
        }
        let refused = fatal.map(|e| {
            if matches!(e.errno, Errno::EACCES | Errno::EPERM) {
                WpdError::PermissionDenied {
                    pid,
                    detail: format!("{} refused: {}", e.op, e.errno.desc()),
                }
            } else if e.errno == Errno::EMFILE {
                fd_limit(perf, "this watchpoint", res.len(), true)
            } else {
                perf_err(e)
            }
        });
        // Without one, the kernel's ENOSPC: the core names the threads.
        ArmReport { outcomes, refused }
    }

    fn disarm(&self, _op: &OpGuard<'_>, watch: &Watch) {
        if let Some(ring) = self.perf.hit_ring() {
            for p in 0..watch.spec.range.slots() as u8 {
                ring.forget(SlotKey::new(watch.id, p));
            }
        }
        let Some((_, events)) = self.events.remove(&watch.id) else {
            return;
        };
        let mut n = 0;
        for (_, ev) in &events {
            n += ev.fds.len();
            for eid in &ev.ids {
                self.event_ids.remove(eid);
            }
        }
        if self.perf.hit_ring().is_none() {
            self.perf
                .closing(events.iter().flat_map(|(_, ev)| ev.fds.iter()));
        }
        drop(events);
        self.perf.forget_fds(n);
        // A drain pass that found the watchpoint before it left the tables
        // publishes its hits before the caller reports it gone.
        self.perf.barrier();
    }

    fn disarm_threads(&self, _op: &OpGuard<'_>, watch: &Watch, tids: &[Tid]) {
        let mut n = 0;
        if let Some(mut events) = self.events.get_mut(&watch.id) {
            events.retain(|(tid, ev)| {
                if !tids.contains(tid) {
                    return true;
                }
                n += ev.fds.len();
                for eid in &ev.ids {
                    self.event_ids.remove(eid);
                }
                if self.perf.hit_ring().is_none() {
                    self.perf.closing(&ev.fds);
                }
                false // closed here
            });
        }
        self.perf.forget_fds(n);
        self.perf.barrier();
    }

    fn reconcile(&self, op: &OpGuard<'_>) {
        if let Some(host) = self.host.upgrade() {
            self.reconcile_proc(&*host, op.process());
        }
    }

    fn detach(&self, proc: &Arc<Process>) {
        self.attached_at.remove(&proc.pid);
        self.stores.forget(proc.pid);
        if let Some((_, fds)) = self.trackers.remove(&proc.pid) {
            self.perf.forget_fds(fds.len());
            self.perf.closing(&fds);
            drop(fds);
        }
    }

    fn events(&self) -> String {
        match self.perf.per_cpu_reason() {
            None => "per-thread (one breakpoint event per thread and slot, hits through a BPF \
                     ring buffer)"
                .into(),
            Some(why) => {
                let note = self.perf.unprivileged_note();
                format!(
                    "per-cpu (one breakpoint event per thread, slot and CPU, {} CPUs; {why}){}",
                    self.perf.cpus().len(),
                    if note.is_empty() {
                        String::new()
                    } else {
                        format!("; {note}")
                    }
                )
            }
        }
    }

    fn stats(&self) -> BackendStats {
        // The per-CPU path's events count their own losses; the
        // per-thread path's breakpoints write into no perf ring.
        let lost = if self.perf.hit_ring().is_some() {
            self.perf.lost(&mut std::iter::empty())
        } else {
            let events = self.events.iter().flat_map(|e| {
                e.value()
                    .iter()
                    .flat_map(|(_, ev)| ev.fds.iter().map(|f| f.as_raw_fd()))
                    .collect::<Vec<_>>()
            });
            let trackers = self
                .trackers
                .iter()
                .flat_map(|e| e.value().iter().map(|f| f.as_raw_fd()).collect::<Vec<_>>());
            let lost = self.perf.lost(&mut events.chain(trackers));
            // What the events counted and no record said yet goes on the
            // event stream now: it then reports what this answer counts.
            let more = self.perf.unreported_lost(lost.perf_ring);
            if more > 0
                && let Some(host) = self.host.upgrade()
            {
                host.publish(crate::events::EventKind::RecordsLost { count: more });
            }
            lost
        };
        BackendStats {
            lost: lost.perf_ring + lost.bpf_ring,
            throttled: lost.throttled,
            fds: self.perf.open_fds(),
        }
    }

    fn compact(&self) {
        self.event_ids.shrink_to_fit();
        self.events.shrink_to_fit();
        self.trackers.shrink_to_fit();
    }

    fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
