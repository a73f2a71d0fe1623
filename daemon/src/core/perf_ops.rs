//! perf backend operations of the core: tracking threads through
//! FORK/EXIT records, arming with kernel inheritance, reconciling threads
//! born while a watchpoint was being armed, and draining the rings.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::errno::Errno;

use std::sync::Mutex;

use super::{Core, Job, Process, Watch, perf_err};
use crate::arch;
use crate::backend::perf::{self, PerfBackend, PerfError, Record, ThreadEvents};
use crate::error::WpdError;
use crate::events::{EventKind, HitEvent};
use crate::ledger::{Inheritance, Reservation, classify};
use crate::model::{BackendKind, Pid, Tid, WatchId};

/// Fewest items per extra thread in [`fan_out`]: below this the thread's
/// start (tens of µs) costs more than the opens it takes over.
const FAN_OUT_MIN: usize = 64;

/// Runs `f` over `items` cut into contiguous chunks, one per CPU we may run
/// on (at most `cpus`), each on its own thread, the first on the caller's;
/// results in chunk order. Spreading perf_event_open over the CPUs does more
/// than divide the work: each open interrupts the CPU its target thread last
/// ran on (`perf_install_in_context`), and an IPI to a CPU busy with another
/// opener costs a fraction of one that has to wake an idle (virtual) CPU.
/// Threads started by a real-time thread inherit its policy.
pub(super) fn fan_out<T: Sync, R: Send>(
    items: &[T],
    cpus: usize,
    f: impl Fn(&[T]) -> R + Sync,
) -> Vec<R> {
    let most = cpus.min(items.len() / FAN_OUT_MIN);
    if most < 2 {
        // Most passes (one thread, a few): no affinity or cgroup lookups.
        return vec![f(items)];
    }
    let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = most.min(allowed);
    if workers < 2 {
        return vec![f(items)];
    }
    let size = items.len().div_ceil(workers);
    let f = &f;
    std::thread::scope(|s| {
        let mut chunks = items.chunks(size);
        let first = chunks.next().unwrap_or(&[]);
        // A chunk whose thread could not start runs on the caller's.
        let rest: Vec<_> = chunks
            .map(|c| {
                std::thread::Builder::new()
                    .name("wpd-open".into())
                    .spawn_scoped(s, move || f(c))
                    .map_err(|_| c)
            })
            .collect();
        let mut out = vec![f(first)];
        for h in rest {
            out.push(match h {
                Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                Err(c) => f(c),
            });
        }
        out
    })
}

/// What one [`fan_out`] worker of an arm pass did with its reservations.
struct ArmChunk {
    opened: Vec<(Tid, ThreadEvents)>,
    times: Vec<(u64, u64)>,
    ok: Vec<Reservation>,
    gone: Vec<Reservation>,
    full: Vec<Tid>,
    untried: Vec<Reservation>,
    fatal: Option<PerfError>,
}

impl ArmChunk {
    fn with_capacity(n: usize) -> Self {
        ArmChunk {
            opened: Vec::with_capacity(n),
            times: Vec::with_capacity(n),
            ok: Vec::with_capacity(n),
            gone: Vec::new(),
            full: Vec::new(),
            untried: Vec::new(),
            fatal: None,
        }
    }
}
use crate::procfs;

/// The typed refusal of `threads` × CPUs event fds that do not fit under
/// `RLIMIT_NOFILE`, by the kernel (EMFILE) or by the daemon's own count.
/// Called after what the request opened was closed.
fn fd_limit(perf: &PerfBackend, what: &'static str, threads: usize, by_kernel: bool) -> WpdError {
    let cpus = perf.cpus().len();
    WpdError::FdLimit {
        what,
        threads,
        cpus,
        needed: (threads * cpus) as u64,
        open: perf::open_fd_count(),
        limit: perf::nofile_limit(),
        headroom: perf.fd_headroom(),
        by_kernel,
    }
}

impl Core {
    /// Opens the breakpoint on every reserved thread (inheritable when
    /// process-wide); all or nothing. Caller holds `proc.op`.
    pub(super) fn arm_perf(
        &self,
        proc: &Process,
        watch: &Watch,
        res: &[Reservation],
    ) -> Result<(), WpdError> {
        let perf = self.perf()?;
        let spec = &watch.spec;
        let (pid, id, process_wide) = (proc.pid, watch.id, watch.process_wide);
        if !perf.fd_room(res.len() * perf.cpus().len()) {
            self.ledger.rollback(res);
            return Err(fd_limit(perf, "this watchpoint", res.len(), false));
        }
        perf.reserve_fds(res.len() * perf.cpus().len());
        let registered = Mutex::new(Vec::new());
        let sink = |eid: u64| {
            self.event_ids.insert(eid, id.0);
            registered.lock().unwrap().push(eid);
        };
        let stop = AtomicBool::new(false);
        let chunks = fan_out(res, perf.cpus().len(), |chunk| {
            let mut c = ArmChunk::with_capacity(chunk.len());
            for (i, r) in chunk.iter().enumerate() {
                if stop.load(Ordering::Relaxed) {
                    c.untried.extend_from_slice(&chunk[i..]);
                    break;
                }
                let t0 = crate::clock::monotonic_ns();
                match perf.open_breakpoint(
                    r.tid,
                    spec.addr,
                    spec.len,
                    spec.access,
                    process_wide,
                    &sink,
                ) {
                    Ok(ev) => {
                        c.times.push((t0, crate::clock::monotonic_ns()));
                        c.opened.push((r.tid, ev));
                        c.ok.push(*r);
                    }
                    Err(e) if e.errno == Errno::ESRCH => c.gone.push(*r),
                    Err(e) if e.errno == Errno::ENOSPC => {
                        self.ledger.mark_foreign(*r);
                        c.full.push(r.tid);
                    }
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        c.fatal = Some(e);
                        c.untried.extend_from_slice(&chunk[i + 1..]);
                        break;
                    }
                }
            }
            c
        });
        let mut all = ArmChunk::with_capacity(res.len());
        for c in chunks {
            all.opened.extend(c.opened);
            all.times.extend(c.times);
            all.ok.extend(c.ok);
            all.gone.extend(c.gone);
            all.full.extend(c.full);
            all.untried.extend(c.untried);
            all.fatal = all.fatal.or(c.fatal);
        }
        let ArmChunk {
            opened,
            times,
            ok,
            gone,
            full,
            untried,
            fatal,
        } = all;
        if !full.is_empty() || fatal.is_some() {
            let n: usize = opened.iter().map(|(_, e)| e.fds.len()).sum();
            drop(opened);
            perf.forget_fds(n);
            for eid in registered.lock().unwrap().iter() {
                self.event_ids.remove(eid);
            }
            self.ledger.rollback(&ok);
            self.ledger.rollback(&gone);
            self.ledger.rollback(&untried);
            if let Some(e) = fatal {
                if matches!(e.errno, Errno::EACCES | Errno::EPERM) {
                    return Err(WpdError::PermissionDenied {
                        pid,
                        detail: format!("{} refused: {}", e.op, e.errno.desc()),
                    });
                }
                if e.errno == Errno::EMFILE {
                    return Err(fd_limit(perf, "this watchpoint", res.len(), true));
                }
                return Err(perf_err(e));
            }
            return Err(self.out_of_slots(pid, full));
        }
        self.ledger.rollback(&gone);
        self.ledger.commit(&ok, process_wide.then_some(&times[..]));
        *watch.events.lock().unwrap() = opened;
        if process_wide {
            self.reconcile_locked(proc);
        }
        Ok(())
    }

    /// Opens trackers on every thread, rescanning until no thread is new:
    /// a thread created by a tracked thread is tracked by inheritance, one
    /// created by a not-yet-tracked thread shows up in the next scan.
    pub(super) fn track_all_threads(&self, proc: &Process) -> Result<(), WpdError> {
        let perf = self.perf()?;
        let mut tracked: HashSet<Tid> = HashSet::new();
        loop {
            let mut tids =
                procfs::tasks(proc.pid).map_err(|_| WpdError::NoSuchProcess(proc.pid))?;
            let all = tids.len();
            tids.retain(|&t| tracked.insert(t));
            if tids.is_empty() {
                break;
            }
            // The trackers must fit (the caller undoes what was tracked).
            if !perf.fd_room(tids.len() * perf.cpus().len()) {
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
                            self.ledger.add_thread(proc.pid, tid);
                        }
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
                proc.trackers.lock().unwrap().extend(fds);
            }
            match failed {
                None => {}
                Some(e) if matches!(e.errno, Errno::EACCES | Errno::EPERM) => {
                    return Err(WpdError::PermissionDenied {
                        pid: proc.pid,
                        detail: format!("{} refused: {}", e.op, e.errno.desc()),
                    });
                }
                Some(e) if e.errno == Errno::EMFILE => {
                    let n = tids.len();
                    return Err(fd_limit(perf, "attach", n, true));
                }
                Some(e) => return Err(perf_err(e)),
            }
        }
        if self.ledger.thread_count(proc.pid) == 0 {
            return Err(WpdError::NoSuchProcess(proc.pid));
        }
        Ok(())
    }

    /// Makes every thread of `proc` carry every process-wide watchpoint:
    /// threads created while a watchpoint was being armed on their creator
    /// may or may not have inherited it (see `ledger::classify`); decide from
    /// timestamps where possible, else ask the kernel, and arm the ones that
    /// did not inherit. Caller holds `proc.op`.
    pub(super) fn reconcile_locked(&self, proc: &Process) {
        let Ok(perf) = self.perf() else { return };
        let wide: Vec<Arc<Watch>> = proc
            .watches
            .lock()
            .unwrap()
            .iter()
            .filter_map(|id| self.watches.get(id).map(|w| w.clone()))
            .filter(|w| w.process_wide)
            .collect();
        if wide.is_empty() {
            return;
        }
        for _round in 0..8 {
            self.drain_now();
            let mut changed = false;
            for tid in self.ledger.tids(proc.pid) {
                for w in &wide {
                    let Some(row) = self.ledger.get(tid) else {
                        break;
                    };
                    let slot = row.slot_of(w.id);
                    let uncertain = slot.is_some_and(|s| row.uncertain & (1 << s) != 0);
                    if slot.is_some() && !uncertain {
                        continue;
                    }
                    if uncertain {
                        let verdict = self.inheritance_verdict(perf, &row, w.id, tid);
                        self.ledger
                            .resolve_uncertain(tid, w.id, verdict, row.born());
                        if verdict {
                            continue;
                        }
                    }
                    changed = true;
                    self.arm_one(perf, proc, w, tid);
                }
            }
            if !changed {
                return;
            }
        }
    }

    /// Did `tid` inherit `id` from its creator? Timestamps first, then a
    /// kernel probe of free slots.
    pub(super) fn inheritance_verdict(
        &self,
        perf: &PerfBackend,
        row: &crate::ledger::ThreadSlots,
        id: WatchId,
        tid: Tid,
    ) -> bool {
        if let Some(parent) = self.ledger.get(row.parent)
            && let Some(s) = parent.slot_of(id)
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
        match perf.probe_free_slots(tid, arch::current::SLOTS) {
            // As many free slots as if it had none of the uncertain ones.
            Ok(free) => free + known < arch::current::SLOTS,
            Err(_) => true,
        }
    }

    pub(super) fn arm_one(&self, perf: &PerfBackend, proc: &Process, w: &Watch, tid: Tid) {
        let res = match self.ledger.reserve_one(tid, w.id, true, BackendKind::Perf) {
            Ok(Some(r)) => r,
            // Gone, or it has the watchpoint already.
            Ok(None) => return,
            Err(_) => {
                tracing::warn!(
                    pid = proc.pid,
                    tid,
                    id = w.id.0,
                    "new thread has no free slot for a process-wide watchpoint"
                );
                return;
            }
        };
        let res = [res];
        let sink = |eid: u64| {
            self.event_ids.insert(eid, w.id.0);
        };
        let t0 = crate::clock::monotonic_ns();
        match perf.open_breakpoint(tid, w.spec.addr, w.spec.len, w.spec.access, true, &sink) {
            Ok(ev) => {
                let t1 = crate::clock::monotonic_ns();
                self.ledger.commit(&res, Some(&[(t0, t1)]));
                w.events.lock().unwrap().push((tid, ev));
            }
            Err(e) if e.errno == Errno::ENOSPC => {
                self.ledger.mark_foreign(res[0]);
                tracing::warn!(
                    pid = proc.pid,
                    tid,
                    id = w.id.0,
                    "kernel refused a slot (ENOSPC) on a new thread"
                );
            }
            Err(e) if e.errno == Errno::ESRCH => self.ledger.rollback(&res),
            Err(e) => {
                // EMFILE above all: the thread stays without this
                // watchpoint, as `ListThreads` shows.
                self.ledger.rollback(&res);
                tracing::warn!(
                    pid = proc.pid,
                    tid,
                    id = w.id.0,
                    "{} failed on a new thread: {}",
                    e.op,
                    e.errno.desc()
                );
            }
        }
    }

    /// Processes every record already in the rings.
    pub fn drain_now(&self) {
        if let Ok(perf) = self.perf() {
            let mut values = ValueCache::default();
            perf.drain(&mut |r| self.on_record(r, &mut values));
        }
    }

    /// Runs until the core stops: reads the rings when the kernel signals
    /// them (a quarter-full ring), at least every `QUIET_POLL_MS` while a
    /// process is tracked (a first hit is seen within 2 ms), every
    /// `IDLE_POLL_MS` while none is, and every `BUSY_PERIOD` without
    /// waiting for signals while records keep coming.
    pub(super) fn drain_loop(self: Arc<Self>) {
        let Ok(perf) = self.perf() else { return };
        let mut fds: Vec<libc::pollfd> = perf
            .collector_fds()
            .into_iter()
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let mut busy = false;
        while !self.stop.load(Ordering::Relaxed) {
            if busy {
                // Records are flowing: read them in batches every BUSY_PERIOD
                // without polling. The kernel wakes every poller of a ring
                // each time a thread with inherited events on it exits
                // (`perf_event_exit_event` kicks `perf_poll`): polled, a
                // process creating and joining 14,000 threads/s woke this
                // thread 13,000 times/s, each wake-up preempting one of its
                // threads on a busy CPU (a perf context switch out and in).
                std::thread::sleep(BUSY_PERIOD);
            } else {
                // Neither a hit nor a FORK/EXIT record wakes the poll until
                // a quarter of a ring is full (a wake-up per hit, with
                // `wakeup_events = 1`, doubled what a hit costs the writing
                // thread: 9.7 → 20.5 µs), so while some process is tracked
                // through the rings they are read every QUIET_POLL_MS. With
                // none, nothing can come.
                let tracking = self.procs.iter().any(|p| p.backend == BackendKind::Perf);
                let timeout = if tracking {
                    QUIET_POLL_MS
                } else {
                    IDLE_POLL_MS
                };
                // SAFETY: fds is a valid pollfd array.
                unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            }
            let mut values = ValueCache::default();
            busy = perf.drain(&mut |r| self.on_record(r, &mut values)) > 0;
        }
    }

    pub(super) fn on_record(&self, r: Record, values: &mut ValueCache) {
        match r {
            Record::Sample {
                id,
                ip,
                pid,
                tid,
                time,
                addr,
                cpu,
            } => {
                let Some(wid) = self.event_ids.get(&id).map(|v| *v) else {
                    return;
                };
                let Some(w) = self.watches.get(&wid).map(|w| w.clone()) else {
                    return;
                };
                w.hits.fetch_add(1, Ordering::Relaxed);
                self.hits.fetch_add(1, Ordering::Relaxed);
                let len = w.spec.len.bytes();
                let (value, value_read_ns) = values.read(pid, tid, addr, len);
                self.bus.publish(EventKind::Hit(HitEvent {
                    id: w.id,
                    pid,
                    tid,
                    ip,
                    addr,
                    len,
                    access: w.spec.access,
                    value,
                    time_ns: time + self.clock_offset,
                    value_read_ns,
                    cpu,
                    stopped: false,
                    old_value: None,
                    backend: BackendKind::Perf,
                }));
            }
            Record::Fork {
                pid,
                ppid,
                tid,
                ptid,
                time,
            } => {
                if pid != ppid || !self.procs.contains_key(&pid) {
                    return; // a new process (fork) is left alone
                }
                // Gone already: its EXIT record was read first (it sits in
                // the ring of the CPU the thread exited on, the FORK in the
                // creator's, and a pass reads one ring after the other).
                let exited = self.early_exits.lock().unwrap().take(tid, time);
                if let Some(row) = self.ledger.on_fork(pid, ptid, tid, time) {
                    // Certain and uncertain ones: the reconcile step arms any
                    // uncertain one that was not inherited.
                    let watchpoints = (0..arch::current::SLOTS)
                        .filter(|s| (row.ours | row.uncertain) & (1 << s) != 0)
                        .map(|s| WatchId(row.holder[s]))
                        .collect();
                    self.bus.publish(EventKind::ThreadStarted {
                        pid,
                        tid,
                        parent: ptid,
                        watchpoints,
                    });
                    if exited {
                        self.ledger.remove_thread(tid);
                        self.bus.publish(EventKind::ThreadExited { pid, tid });
                    } else if row.uncertain != 0 || self.missing_wide(pid, &row) {
                        self.schedule(Job::Reconcile(pid));
                    }
                }
            }
            Record::Exit { pid, tid, time } => {
                if let Some(row) = self.ledger.get(tid)
                    && row.pid == pid
                {
                    self.ledger.remove_thread(tid);
                    self.bus.publish(EventKind::ThreadExited { pid, tid });
                    if self.ledger.thread_count(pid) == 0 {
                        self.schedule(Job::CheckLost(pid));
                    }
                } else if self.procs.contains_key(&pid) {
                    self.early_exits.lock().unwrap().insert(tid, time);
                }
            }
            Record::Exec { pid, .. } => {
                if self.procs.contains_key(&pid) {
                    self.schedule(Job::Exec(pid));
                }
            }
            Record::Lost { count } => {
                tracing::warn!(count, "kernel dropped records: ring full");
                self.bus.publish(EventKind::RecordsLost { count });
            }
        }
    }

    pub(super) fn missing_wide(&self, pid: Pid, row: &crate::ledger::ThreadSlots) -> bool {
        let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
            return false;
        };
        let ids: Vec<u64> = proc.watches.lock().unwrap().iter().copied().collect();
        ids.into_iter().any(|id| {
            self.watches.get(&id).is_some_and(|w| w.process_wide)
                && row.slot_of(WatchId(id)).is_none()
        })
    }
}

/// Pause between ring reads while records keep coming.
const BUSY_PERIOD: std::time::Duration = std::time::Duration::from_millis(1);

/// Longest wait for records between two reads while a process is tracked
/// through the rings: what a first hit may wait.
const QUIET_POLL_MS: i32 = 2;

/// Longest wait when no process uses the perf backend (a safety net).
const IDLE_POLL_MS: i32 = 1000;

/// EXIT records of threads whose FORK record has not been read yet, by tid
/// (exit time). Records of different CPUs' rings are read one ring after
/// the other, so a thread that lives for microseconds on another CPU than
/// its creator can show its exit first: without this, a churning process
/// left a fifth of its threads in the ledger forever (5,500 rows for 5 live
/// threads after 2 s of 2 creators). Kept for [`EarlyExits::KEEP_NS`].
#[derive(Default)]
pub(super) struct EarlyExits {
    by_tid: std::collections::HashMap<Tid, u64>,
    order: std::collections::VecDeque<(u64, Tid)>,
}

impl EarlyExits {
    /// How long an early EXIT waits for its FORK (kernel clock); rings are
    /// drained every few ms.
    const KEEP_NS: u64 = 2_000_000_000;

    pub(super) fn insert(&mut self, tid: Tid, exit_ns: u64) {
        while let Some(&(t, old)) = self.order.front() {
            if t.saturating_add(Self::KEEP_NS) >= exit_ns {
                break;
            }
            self.order.pop_front();
            if self.by_tid.get(&old) == Some(&t) {
                self.by_tid.remove(&old);
            }
        }
        self.by_tid.insert(tid, exit_ns);
        self.order.push_back((exit_ns, tid));
    }

    /// Whether the thread `tid` created at `fork_ns` has exited already
    /// (an exit of an older thread with the same tid does not count).
    pub(super) fn take(&mut self, tid: Tid, fork_ns: u64) -> bool {
        if self.by_tid.is_empty() {
            return false;
        }
        match self.by_tid.get(&tid) {
            Some(&exit_ns) if exit_ns >= fork_ns => {
                self.by_tid.remove(&tid);
                true
            }
            _ => false,
        }
    }
}

/// Values read during one drain pass, by (pid, address, length). The perf
/// backend reads a hit's value after the fact, when the daemon handles the
/// record (`value_read_ns` says when), so every hit on the same bytes in one
/// pass would read the same memory within microseconds: one
/// `process_vm_readv` serves them all. At high hit rates that read is the
/// largest part of the daemon's work per hit.
#[derive(Default)]
pub(super) struct ValueCache {
    read: Vec<ReadValue>,
}

/// (pid, address, length), what reading it gave, and when (Unix ns).
type ReadValue = ((Pid, u64, u32), Result<Vec<u8>, String>, u64);

impl ValueCache {
    /// Distinct (pid, address, length) kept per pass; a pass over more
    /// watched ranges than this reads the others every time.
    const CAP: usize = 64;

    fn read(&mut self, pid: Pid, via: Tid, addr: u64, len: u32) -> (Result<Vec<u8>, String>, u64) {
        let key = (pid, addr, len);
        if let Some((_, v, ns)) = self.read.iter().find(|(k, _, _)| *k == key) {
            return (v.clone(), *ns);
        }
        let v = procfs::read_memory(pid, via, addr, len as usize);
        let ns = crate::clock::realtime_ns();
        if self.read.len() < Self::CAP {
            self.read.push((key, v.clone(), ns));
        }
        (v, ns)
    }
}

#[cfg(test)]
mod tests {
    use super::{EarlyExits, FAN_OUT_MIN, fan_out};

    #[test]
    fn fan_out_covers_every_item_once_in_order() {
        for n in [
            0,
            1,
            FAN_OUT_MIN,
            2 * FAN_OUT_MIN - 1,
            2 * FAN_OUT_MIN,
            1_000,
        ] {
            let items: Vec<usize> = (0..n).collect();
            for cpus in 1..=4 {
                let threads = std::sync::Mutex::new(std::collections::HashSet::new());
                let chunks = fan_out(&items, cpus, |c| {
                    threads.lock().unwrap().insert(std::thread::current().id());
                    c.to_vec()
                });
                let flat: Vec<usize> = chunks.iter().flatten().copied().collect();
                assert_eq!(flat, items, "n {n} cpus {cpus}");
                let allowed = std::thread::available_parallelism().map_or(1, |p| p.get());
                let expect = cpus.min(allowed).min(n / FAN_OUT_MIN).max(1);
                assert_eq!(chunks.len(), expect, "n {n} cpus {cpus}");
                assert_eq!(threads.lock().unwrap().len(), expect, "n {n} cpus {cpus}");
            }
        }
    }

    #[test]
    fn early_exit_matches_only_its_own_fork() {
        let mut e = EarlyExits::default();
        e.insert(7, 1_000);
        // An older thread that had the same tid (created before, exited
        // before): not this one.
        assert!(!e.take(8, 500));
        // The thread created at 900 and gone at 1,000.
        assert!(e.take(7, 900));
        // Taken once.
        assert!(!e.take(7, 900));
        // A fork after the recorded exit is a new thread reusing the tid.
        e.insert(9, 2_000);
        assert!(!e.take(9, 2_500));
    }

    #[test]
    fn early_exits_expire() {
        let mut e = EarlyExits::default();
        e.insert(1, 0);
        e.insert(2, EarlyExits::KEEP_NS + 1);
        assert!(!e.take(1, 0), "expired when a later exit came");
        assert!(e.take(2, 1));
        assert!(e.order.len() <= 1);
    }
}
