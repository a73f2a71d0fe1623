//! ptrace backend operations of the core: seizing every thread, arming
//! through the tracer shards, the callbacks tracers make (new thread, hit,
//! exit, exec), Resume, and the state file that lets a restarted daemon
//! clear registers a killed one left behind.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Weak;
use std::sync::atomic::Ordering;

use nix::errno::Errno;

use super::perf_ops::fan_out;
use super::{Core, Job, Process, Watch};
use crate::arch::current as arch;
use crate::backend::ptrace::{
    HitVerdict, ProgramResult, PtraceBackend, SlotProgram, TraceSink, tracer_of,
};
use crate::error::WpdError;
use crate::events::{EventKind, HitEvent};
use crate::ledger::Reservation;
use crate::model::{BackendKind, HitAction, Pid, Tid, WatchId};
use crate::procfs;
use crate::sched::Boost;

/// Tracer threads (`WPD_PTRACE_SHARDS` overrides). A handful: each waits
/// only on its own tracees, and new threads join their creator's tracer.
const SHARDS: usize = 4;

/// Restarts parked threads when dropped (every way out of an arm).
struct Unpark<'a>(&'a PtraceBackend, &'a [Tid]);

impl<'a> Unpark<'a> {
    /// Parks `tids` until the guard drops.
    fn park(pt: &'a PtraceBackend, tids: &'a [Tid]) -> Self {
        pt.park(tids);
        Unpark(pt, tids)
    }
}

impl Drop for Unpark<'_> {
    fn drop(&mut self) {
        self.0.unpark(self.1);
    }
}

/// Starts the ptrace backend, or says why it cannot work here.
pub(super) fn start_ptrace(core: Weak<Core>) -> Result<PtraceBackend, String> {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(0);
    if scope >= 3 {
        return Err("kernel.yama.ptrace_scope=3 forbids every ptrace attach".into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 && scope >= 1 {
        return Err(format!(
            "not root and kernel.yama.ptrace_scope={scope}: attaching needs CAP_SYS_PTRACE"
        ));
    }
    let sink: Weak<dyn TraceSink> = core;
    let shards = std::env::var("WPD_PTRACE_SHARDS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| (1..=64).contains(&n))
        .unwrap_or(SHARDS);
    Ok(PtraceBackend::new(shards, sink))
}

/// The state file chosen at start-up ([`set_state_file`]).
static STATE_FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Sets where the list of ptrace-attached processes is kept (once, before
/// the core starts; the server derives it from the listen address).
pub fn set_state_file(path: PathBuf) {
    let _ = STATE_FILE.set(path);
}

/// Where the list of ptrace-attached processes is kept: what
/// [`set_state_file`] set, else `WPD_STATE_FILE`, else
/// `/run/wpd/wpd.sock.ptrace-armed` (the default socket's).
pub fn state_file() -> PathBuf {
    STATE_FILE
        .get()
        .cloned()
        .or_else(|| std::env::var_os("WPD_STATE_FILE").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(format!("{}.ptrace-armed", wpd_proto::DEFAULT_SOCKET)))
}

impl Core {
    pub(super) fn ptrace(&self) -> Result<&PtraceBackend, WpdError> {
        self.ptrace
            .as_ref()
            .map_err(|reason| WpdError::BackendUnavailable {
                backend: BackendKind::Ptrace,
                reason: reason.clone(),
            })
    }

    /// Seizes every thread, rescanning until no thread is new (threads
    /// created by a seized thread are attached by the kernel at clone).
    pub(super) fn seize_all_threads(&self, proc: &Process) -> Result<(), WpdError> {
        let pt = self.ptrace()?;
        let me = std::process::id() as Pid;
        let mut seen: HashSet<Tid> = HashSet::new();
        let result = (|| {
            loop {
                // A thread that has exited (a leader that ended alone stays
                // a zombie while the others run) cannot be seized (EPERM)
                // and runs no code: it is not watched.
                let tids: Vec<Tid> = procfs::tasks(proc.pid)
                    .map_err(|_| WpdError::NoSuchProcess(proc.pid))?
                    .into_iter()
                    .filter(|t| seen.insert(*t) && !procfs::thread_exited(proc.pid, *t))
                    .collect();
                if tids.is_empty() {
                    return Ok(());
                }
                for (tid, r) in pt.seize(proc.pid, &tids) {
                    match r {
                        Ok(()) => {
                            self.ledger.add_thread(proc.pid, tid);
                        }
                        Err(Errno::ESRCH) => {}
                        Err(Errno::EPERM) if procfs::thread_exited(proc.pid, tid) => {}
                        Err(Errno::EPERM) => match tracer_of(tid) {
                            // Attached by the kernel at clone: ours already.
                            // TracerPid names the tracer *thread* (a shard).
                            Some(t) if t == me || procfs::tgid_of(t) == Some(me) => {}
                            Some(t) => {
                                // TracerPid names the tracing *thread*.
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
        } else if self.ledger.thread_count(proc.pid) == 0 {
            return Err(WpdError::NoSuchProcess(proc.pid));
        }
        result
    }

    /// Programs the reserved slots through the tracers; all or nothing.
    /// Caller holds `proc.op`; the watch is already registered, so threads
    /// created meanwhile are armed by `thread_started`.
    pub(super) fn arm_ptrace(
        &self,
        proc: &Process,
        watch: &Watch,
        res: &[Reservation],
    ) -> Result<(), WpdError> {
        let pt = self.ptrace()?;
        let _rt = Boost::enter();
        let spec = &watch.spec;
        // A successful address poke makes the kernel reserve a slot until the
        // thread exits or execs, even if the request is then refused. So
        // that a refused request leaves nothing behind, check that every
        // thread has a free slot first (one disabled perf breakpoint, opened
        // and closed), except where the slot is one the kernel already holds
        // for us. The threads are stopped (parked) for the check: opened on
        // running threads, these breakpoints made the threads' next stops
        // slow to come (1,000 busy threads on 2 CPUs took 2.5-4.5 s to arm
        // instead of 50-70 ms without the check), and parked they are
        // programmed at once, with no second stop. Many threads are parked
        // even without the check: all stopped before any restarts (see
        // `PtraceBackend::detach`).
        let tids: Vec<Tid> = res.iter().map(|r| r.tid).collect();
        let _parked = (self.perf().is_ok() || tids.len() > 1).then(|| Unpark::park(pt, &tids));
        if let Ok(perf) = self.perf() {
            // Like a perf arm pass, from one thread per CPU: each open and
            // close interrupts the CPU the thread last ran on.
            let refused = fan_out(res, perf.cpus().len(), |chunk| {
                chunk
                    .iter()
                    .filter(|r| {
                        let retained = self
                            .ledger
                            .get(r.tid)
                            .is_some_and(|row| row.retained & (1 << r.slot) != 0);
                        !retained && perf.probe_free_slots(r.tid, 1) == Ok(0)
                    })
                    .copied()
                    .collect::<Vec<Reservation>>()
            });
            let mut full = Vec::new();
            for r in refused.into_iter().flatten() {
                self.ledger.mark_foreign(r);
                full.push(r.tid);
            }
            if !full.is_empty() {
                self.ledger.rollback(res);
                return Err(self.out_of_slots(proc.pid, full));
            }
        }
        let items: Vec<SlotProgram> = res
            .iter()
            .map(|r| SlotProgram {
                tid: r.tid,
                slot: r.slot,
                arm: Some((
                    spec.addr,
                    arch::dr7_slot_bits(r.slot as usize, spec.len, spec.access),
                    watch.id.0,
                )),
            })
            .collect();
        let results = pt.program(items);
        let mut ok = Vec::new();
        let mut gone = Vec::new();
        let mut full = Vec::new();
        let mut failed = None;
        for (p, r) in &results {
            let res = Reservation {
                tid: p.tid,
                slot: p.slot,
                id: watch.id,
            };
            match r {
                ProgramResult::Done => ok.push(res),
                ProgramResult::Gone => gone.push(res),
                ProgramResult::NoSpace => {
                    self.ledger.mark_foreign(res);
                    full.push(p.tid);
                }
                ProgramResult::Failed(e) => {
                    self.ledger.rollback(&[res]);
                    failed = Some(*e);
                }
            }
        }
        self.ledger.rollback(&gone);
        self.ledger.commit(&ok, None);
        if full.is_empty() && failed.is_none() {
            return Ok(());
        }
        // The caller undoes what was armed (also on threads born meanwhile).
        if let Some(e) = failed {
            return Err(WpdError::kernel("PTRACE_POKEUSER", e));
        }
        Err(self.out_of_slots(proc.pid, full))
    }

    /// Clears the watchpoint's slot on every thread that has it.
    pub(super) fn disarm_ptrace(&self, watch: &Watch) {
        let Ok(pt) = self.ptrace() else { return };
        let items: Vec<SlotProgram> = self
            .ledger
            .slots_on(&self.watch_tids(watch), watch.id)
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
        // behind those already restarted (see `PtraceBackend::detach`).
        let tids: Vec<Tid> = items.iter().map(|p| p.tid).collect();
        let _parked = (tids.len() > 1).then(|| Unpark::park(pt, &tids));
        pt.program(items);
    }

    /// Resumes held threads of `pid` (all when `tids` is empty). Blocking.
    pub fn resume(&self, pid: Pid, tids: &[Tid]) -> Result<Vec<Tid>, WpdError> {
        let proc = self
            .procs
            .get(&pid)
            .map(|p| p.clone())
            .ok_or(WpdError::NotAttached(pid))?;
        if proc.backend != BackendKind::Ptrace {
            return Err(WpdError::NeedsBackend {
                feature: "resuming threads",
                needs: BackendKind::Ptrace,
                hint: ": this process uses the perf backend, which never stops threads (nothing to resume)",
            });
        }
        for &t in tids {
            if self.ledger.get(t).is_none_or(|r| r.pid != pid) {
                return Err(WpdError::NoSuchThread { pid, tid: t });
            }
        }
        Ok(self.ptrace()?.resume(pid, tids))
    }

    /// Asks the reconcile thread to rewrite the state file soon (used on
    /// paths that must not do file I/O, like new threads on a tracer).
    pub(super) fn save_state(&self) {
        self.schedule(Job::SaveState);
    }

    /// Rewrites the state file: every thread of a ptrace process. A daemon
    /// restarted after a SIGKILL reads it and clears their DR7.
    pub(super) fn write_state_now(&self) {
        let mut procs: Vec<(Pid, u64)> = self
            .procs
            .iter()
            .filter(|p| p.backend == BackendKind::Ptrace)
            .map(|p| (p.pid, p.start_time))
            .collect();
        procs.sort_unstable();
        let mut lines = String::new();
        for (pid, start) in procs {
            lines.push_str(&format!("pid {pid} start {start}\n"));
        }
        // One line per process, not per thread: the file changes only on
        // attach and detach, so arming and new threads never rewrite it.
        let mut written = self.state_written.lock().unwrap();
        if *written == lines {
            return;
        }
        let path = state_file();
        if lines.is_empty() {
            let _ = std::fs::remove_file(&path);
            written.clear();
            return;
        }
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = path.with_extension("tmp");
        if std::fs::write(&tmp, &lines).is_ok() && std::fs::rename(&tmp, &path).is_ok() {
            *written = lines;
        }
    }

    /// The watched bytes, read through the stopped thread itself: exact.
    fn hit_value(pid: Pid, tid: Tid, w: &Watch) -> Result<Vec<u8>, String> {
        procfs::read_memory(pid, tid, w.spec.addr, w.spec.len.bytes() as usize)
    }
}

/// What a state file line names: every thread of a process (`pid P start
/// S`; S = 0 when unknown), or one thread (`P T`, the older format).
#[derive(Debug, PartialEq, Eq)]
enum StateLine {
    Process { pid: Pid, start: u64 },
    Thread { pid: Pid, tid: Tid },
}

fn parse_state_line(line: &str) -> Option<StateLine> {
    let w: Vec<&str> = line.split_whitespace().collect();
    match w.as_slice() {
        ["pid", pid, "start", start] => Some(StateLine::Process {
            pid: pid.parse().ok()?,
            start: start.parse().ok()?,
        }),
        [pid, tid] => Some(StateLine::Thread {
            pid: pid.parse().ok()?,
            tid: tid.parse().ok()?,
        }),
        _ => None,
    }
}

/// Clears DR7 on the threads of processes listed in the state file of a
/// daemon that died without cleaning up (SIGKILL, OOM kill): all of their
/// threads, including those born after the file was written. A process
/// whose start time differs is a different process that reused the pid,
/// and is left alone. Runs before serving. Returns how many threads were
/// cleaned.
pub fn recover_from_state_file() -> usize {
    let path = state_file();
    let Ok(text) = std::fs::read_to_string(&path) else {
        return 0;
    };
    let mut cleaned = 0;
    for line in text.lines() {
        match parse_state_line(line) {
            Some(StateLine::Process { pid, start }) => {
                if start != 0 && procfs::start_time(pid) != Some(start) {
                    continue;
                }
                for tid in procfs::tasks(pid).unwrap_or_default() {
                    cleaned += usize::from(clear_stale_registers(pid, tid));
                }
            }
            Some(StateLine::Thread { pid, tid }) => {
                cleaned += usize::from(clear_stale_registers(pid, tid));
            }
            None => tracing::warn!(line, "unreadable line in the ptrace state file"),
        }
    }
    let _ = std::fs::remove_file(&path);
    cleaned
}

/// Seizes one untraced thread, sets its DR7 to 0 and detaches. False if the
/// thread is gone, traced by someone else, or could not be stopped.
fn clear_stale_registers(pid: Pid, tid: Tid) -> bool {
    use nix::sys::ptrace;
    use nix::sys::signal::Signal;
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    if !procfs::is_thread_of(pid, tid) || tracer_of(tid).is_some() {
        return false;
    }
    let p = nix::unistd::Pid::from_raw(tid);
    if ptrace::seize(p, ptrace::Options::empty()).is_err() {
        return false;
    }
    let _ = ptrace::interrupt(p);
    // Wait for this tracee's stop. A signal that arrives first is passed on
    // at detach, except the SIGTRAP of a hit on the stale registers, which
    // would kill the target.
    let deliver = match waitpid(p, Some(WaitPidFlag::__WALL)) {
        Ok(WaitStatus::PtraceEvent(..)) => None,
        Ok(WaitStatus::Stopped(_, Signal::SIGTRAP))
            if ptrace::getsiginfo(p).is_ok_and(|i| i.si_code == arch::TRAP_HWBKPT) =>
        {
            None
        }
        Ok(WaitStatus::Stopped(_, sig)) => Some(sig),
        _ => return false,
    };
    let _ = ptrace::write_user(p, arch::debugreg_offset(arch::DR7) as _, 0);
    let _ = ptrace::detach(p, deliver);
    true
}

impl TraceSink for Core {
    fn thread_started(&self, pid: Pid, tid: Tid, parent: Tid) -> Vec<SlotProgram> {
        let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
            return Vec::new();
        };
        self.ledger.add_thread(pid, tid);
        self.ledger.set_parent(tid, parent);
        let ids: Vec<u64> = proc.watches.lock().unwrap().iter().copied().collect();
        let mut out = Vec::new();
        for id in ids {
            let Some(w) = self.watches.get(&id).map(|w| w.clone()) else {
                continue;
            };
            if !w.process_wide {
                continue;
            }
            match self
                .ledger
                .reserve_one(tid, w.id, false, BackendKind::Ptrace)
            {
                Ok(Some(r)) => out.push(SlotProgram {
                    tid,
                    slot: r.slot,
                    arm: Some((
                        w.spec.addr,
                        arch::dr7_slot_bits(r.slot as usize, w.spec.len, w.spec.access),
                        w.id.0,
                    )),
                }),
                Ok(None) => {}
                Err(_) => tracing::warn!(pid, tid, id, "new thread has no free slot"),
            }
        }
        out
    }

    fn thread_armed(&self, pid: Pid, tid: Tid, results: &[(SlotProgram, ProgramResult)]) {
        let mut armed = Vec::new();
        for (p, r) in results {
            let Some((_, _, id)) = p.arm else { continue };
            let res = Reservation {
                tid,
                slot: p.slot,
                id: WatchId(id),
            };
            match r {
                ProgramResult::Done => {
                    self.ledger.commit(&[res], None);
                    armed.push(WatchId(id));
                }
                ProgramResult::NoSpace => self.ledger.mark_foreign(res),
                _ => self.ledger.rollback(&[res]),
            }
        }
        let parent = self.ledger.get(tid).map(|r| r.parent).unwrap_or(0);
        self.bus.publish(EventKind::ThreadStarted {
            pid,
            tid,
            parent,
            watchpoints: armed,
        });
    }

    fn thread_exited(&self, pid: Pid, tid: Tid) {
        if let Some(row) = self.ledger.get(tid)
            && row.pid == pid
        {
            self.ledger.remove_thread(tid);
            self.bus.publish(EventKind::ThreadExited { pid, tid });
        }
    }

    fn hit(&self, pid: Pid, tid: Tid, ip: u64, ids: &[u64]) -> HitVerdict {
        let mut verdict = HitVerdict::Continue;
        for &id in ids {
            let Some(w) = self.watches.get(&id).map(|w| w.clone()) else {
                continue;
            };
            let value = Core::hit_value(pid, tid, &w);
            let mut old_value = None;
            if w.spec.only_on_change {
                let mut last = w.last_value.lock().unwrap();
                if let Ok(v) = &value {
                    if last.as_ref() == Some(v) {
                        continue; // stored the same bytes: not a change
                    }
                    old_value = last.replace(v.clone());
                }
            }
            let stopped = w.spec.action != HitAction::Log;
            verdict = match (verdict, w.spec.action) {
                (_, HitAction::StopAll) | (HitVerdict::HoldAll, _) => HitVerdict::HoldAll,
                (_, HitAction::Stop) | (HitVerdict::Hold, _) => HitVerdict::Hold,
                _ => HitVerdict::Continue,
            };
            w.hits.fetch_add(1, Ordering::Relaxed);
            self.hits.fetch_add(1, Ordering::Relaxed);
            let now = crate::clock::realtime_ns();
            self.bus.publish(EventKind::Hit(HitEvent {
                id: w.id,
                pid,
                tid,
                ip,
                addr: w.spec.addr,
                len: w.spec.len.bytes(),
                access: w.spec.access,
                value,
                time_ns: now,
                value_read_ns: now,
                cpu: 0,
                stopped,
                old_value,
                backend: BackendKind::Ptrace,
            }));
        }
        if verdict == HitVerdict::HoldAll
            && let Ok(pt) = self.ptrace()
        {
            pt.hold_all(pid, tid);
        }
        verdict
    }

    fn exec(&self, pid: Pid, _tid: Tid) {
        self.schedule(Job::Exec(pid));
    }
}

impl Core {
    /// Used by tests: the tracer that owns `tid`, if any.
    #[doc(hidden)]
    pub fn is_traced(&self, tid: Tid) -> bool {
        self.ptrace.as_ref().is_ok_and(|p| p.traces(tid))
    }
}

#[cfg(test)]
mod tests {
    use super::{StateLine, parse_state_line};

    #[test]
    fn state_lines_of_both_formats_parse() {
        assert_eq!(
            parse_state_line("pid 12 start 3456"),
            Some(StateLine::Process {
                pid: 12,
                start: 3456
            })
        );
        assert_eq!(
            parse_state_line("12 13"),
            Some(StateLine::Thread { pid: 12, tid: 13 })
        );
        assert_eq!(parse_state_line("pid 12"), None);
        assert_eq!(parse_state_line("pid x start 1"), None);
        assert_eq!(parse_state_line(""), None);
    }
}
