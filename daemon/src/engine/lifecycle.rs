//! Processes coming and going: attach, detach, exit, exec, loss, and the
//! daemon's own shutdown; event subscriptions.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Core, RESOLVE_AFTER_EXEC, SUBSCRIBER_RESERVE};
use crate::error::WpdError;
use crate::events::EventKind;
use crate::model::{BackendKind, ExecPolicy, Pid, Tid, WatchId};
use crate::procfs;
use crate::sched::Boost;
use crate::state::{Job, OpGuard, Process, Watch};
use crate::symbols::SymbolError;

impl Core {
    /// Attaches `pid` (idempotent). Returns the process and whether this call
    /// attached it. The daemon itself is refused, and pid 1 unless
    /// `allow_init`. Blocking.
    pub fn attach_for(
        self: &Arc<Self>,
        by: u32,
        pid: Pid,
        backend: Option<BackendKind>,
        allow_init: bool,
    ) -> Result<(Arc<Process>, bool), WpdError> {
        if pid == std::process::id() as Pid {
            return Err(WpdError::OwnProcess(pid));
        }
        if let Some(p) = self.procs.get(&pid).map(|p| p.clone()) {
            if let Some(asked) = backend
                && asked != p.backend
            {
                return Err(WpdError::BackendMismatch {
                    pid,
                    attached: p.backend,
                    asked,
                });
            }
            return Ok((p, false));
        }
        let b = self.backends.get(backend)?.clone();
        procfs::check_process(pid)?;
        if pid == 1 && !allow_init {
            return Err(WpdError::InitProcess);
        }
        self.check_process_share(by)?;
        let proc = Arc::new(Process::new(pid, b.kind(), by));
        match self.procs.entry(pid) {
            dashmap::Entry::Occupied(o) => return Ok((o.get().clone(), false)),
            dashmap::Entry::Vacant(v) => {
                v.insert(proc.clone());
            }
        }
        let op = proc.lock_op();
        let _rt = Boost::enter();
        let tracked = b.attach(&op);
        if tracked.is_ok() {
            // A thread that exited between the scan and its tracking may
            // have had its exit handled first: drop such rows. One listing,
            // not a path lookup per thread.
            let alive: HashSet<Tid> = procfs::tasks(pid)
                .map(|v| v.into_iter().collect())
                .unwrap_or_default();
            for tid in self.ledger.tids(pid) {
                if !alive.contains(&tid) {
                    self.ledger.remove_thread(tid);
                }
            }
        }
        if let Err(e) = tracked {
            drop(op);
            self.forget_process(&proc);
            return Err(e);
        }
        drop(op);
        self.watch_exit(&proc);
        tracing::info!(pid, threads = self.ledger.thread_count(pid), "attached");
        Ok((proc, true))
    }

    /// Refuses a new attach for caller `by` past `--max-processes`, past
    /// the processes kept for root ([`super::process_reserve`]) when `by`
    /// is not root, or past its own share (`--max-processes-per-caller`).
    fn check_process_share(&self, by: u32) -> Result<(), WpdError> {
        let limit = self.limits.processes;
        let total = self.procs.len();
        if total >= limit {
            return Err(WpdError::LimitReached {
                what: "attached processes",
                limit,
                hint: "detach a process first",
            });
        }
        if by == 0 {
            return Ok(());
        }
        let reserve = super::process_reserve(limit);
        if total + reserve >= limit {
            return Err(WpdError::LimitReached {
                what: "attached processes (the last ones are kept for root)",
                limit: limit - reserve,
                hint: "detach a process first",
            });
        }
        let share = self.limits.processes_per_caller;
        if self.procs.iter().filter(|p| p.attached_by == by).count() >= share {
            return Err(WpdError::LimitReached {
                what: "attached processes per caller",
                limit: share,
                hint: "detach one of yours first",
            });
        }
        Ok(())
    }

    fn watch_exit(self: &Arc<Self>, proc: &Arc<Process>) {
        // The runtime the core was started in: attaches also come from
        // threads of its own (policies), outside any runtime.
        let Some(handle) = self
            .runtime
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok())
        else {
            return;
        };
        let Some(pidfd) = procfs::pidfd_open(proc.pid) else {
            return;
        };
        let core = Arc::downgrade(self);
        let pid = proc.pid;
        let task = handle.spawn(async move {
            // SAFETY: the AsyncFd owns the pidfd; nothing else closes it.
            let Ok(afd) = (unsafe { tokio::io::unix::AsyncFd::register(pidfd) }) else {
                return;
            };
            if afd.readable().await.is_ok()
                && let Some(core) = core.upgrade()
            {
                let _ = tokio::task::spawn_blocking(move || core.process_exited(pid)).await;
            }
        });
        *proc.exit_watch.lock().unwrap() = Some(task.abort_handle());
    }

    fn process_exited(&self, pid: Pid) {
        // The signal that ended it, if one did, is reported first.
        self.drain_signals();
        let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
            return;
        };
        // The hits it made just before its exit, still in the backend's
        // rings, are reported while its watchpoints exist (a short
        // program's last stores; read a poll later they would name
        // watchpoints gone).
        if let Ok(b) = self.backends.get(Some(proc.backend)) {
            b.sync();
        }
        // Its exit is seen by the pidfd watch and by the reconcile thread
        // (no thread left): one of them reports it.
        let Some(ids) = self.release_process(&proc, "process exited") else {
            return;
        };
        self.bus.publish_as(
            EventKind::ProcessExited {
                pid,
                watchpoints: ids,
            },
            Some(proc.owner.clone()),
        );
        tracing::info!(pid, "process exited");
    }

    /// Detaches `pid`: every watchpoint removed, every event closed. Blocking.
    pub fn detach(&self, pid: Pid) -> Result<(usize, usize), WpdError> {
        let proc = self
            .procs
            .get(&pid)
            .map(|p| p.clone())
            .ok_or(WpdError::NotAttached(pid))?;
        let threads = self.ledger.thread_count(pid);
        if let Some(t) = proc.exit_watch.lock().unwrap().take() {
            t.abort();
        }
        let ids = self
            .release_process(&proc, "detached")
            .ok_or(WpdError::NotAttached(pid))?;
        tracing::info!(pid, watchpoints = ids.len(), "detached");
        Ok((ids.len(), threads))
    }

    /// Ends the attachment: its watchpoints removed (each reported with
    /// `reason`) and the process forgotten. `None` when another path (an
    /// exit, a detach, a loss) ended it first: whoever ends it reports it,
    /// once.
    fn release_process(&self, proc: &Arc<Process>, reason: &'static str) -> Option<Vec<WatchId>> {
        let op = proc.lock_op();
        if proc.gone.swap(true, Ordering::SeqCst) {
            return None;
        }
        let mut removed = self.remove_all_locked(&op, reason);
        // Its code events (object watches, code breakpoints, pending ones)
        // end with it too: reported as its watchpoints are.
        for id in self.objects.ids_on(proc.pid) {
            self.bus.publish_as(
                EventKind::WatchpointRemoved {
                    id,
                    pid: proc.pid,
                    reason: reason.into(),
                },
                Some(proc.owner.clone()),
            );
            removed.push(id);
        }
        drop(op);
        self.forget_process(proc);
        Some(removed)
    }

    /// Removes every watchpoint of the locked process, each reported with
    /// `reason`.
    fn remove_all_locked(&self, op: &OpGuard<'_>, reason: &'static str) -> Vec<WatchId> {
        let mut removed = Vec::new();
        self.report_pending_hits(op);
        for id in op.process().watch_ids() {
            if let Some(w) = self.take_watch(op, id) {
                // An object's watchpoint goes with its object watch, which
                // the caller lists: not an event, not in the list.
                if w.object {
                    continue;
                }
                self.bus.publish_as(
                    EventKind::WatchpointRemoved {
                        id: w.id,
                        pid: op.pid(),
                        reason: reason.into(),
                    },
                    Some(op.process().owner.clone()),
                );
                removed.push(w.id);
            }
        }
        removed
    }

    /// Lets the process go: the backend detaches, the ledger forgets it.
    pub(super) fn forget_process(&self, proc: &Arc<Process>) {
        proc.gone.store(true, Ordering::SeqCst);
        self.forget_object_watches(proc.pid);
        if let Ok(b) = self.backends.get(Some(proc.backend)) {
            b.detach(proc);
        }
        self.ledger.remove_process(proc.pid);
        // Slots the kernel kept for us on threads that are gone now.
        self.ledger.prune_retained(procfs::is_thread_of);
        // Most of an exited process's threads left the ledger one by one
        // before this point: judge by the table's spare room, not by what was
        // left to remove. Done before the process disappears from listings,
        // so that a client that saw it go also sees the memory returned.
        if self.ledger.mostly_empty() {
            self.compact();
        }
        self.procs.remove_if(&proc.pid, |_, p| Arc::ptr_eq(p, proc));
        // The modules only it used: their parsed symbols and open files.
        proc.retire_image();
        self.symbols.forget(proc.pid);
    }

    /// Returns memory to the system after a large process went away:
    /// shrinks the tables, and asks the allocator to release free heap
    /// (glibc keeps it otherwise, and the daemon's RSS would stay at its
    /// high-water mark). Blocking threads only.
    fn compact(&self) {
        let t0 = Instant::now();
        self.ledger.shrink_to_fit();
        self.procs.shrink_to_fit();
        self.watches.shrink_to_fit();
        for b in self.backends.usable() {
            b.compact();
        }
        // SAFETY: malloc_trim only releases free memory of glibc's heap.
        #[cfg(target_env = "gnu")]
        unsafe {
            libc::malloc_trim(0);
        }
        tracing::debug!(took_us = t0.elapsed().as_micros() as u64, "compacted");
    }

    /// After exec the kernel has dropped our breakpoints (perf's
    /// `remove_on_exec`, ptrace's cleared registers): they would otherwise
    /// fire in an unrelated program image. Each is reported removed; the
    /// process stays attached, unless the exec changed its credentials.
    pub(super) fn exec_locked(self: &Arc<Self>, op: &OpGuard<'_>) {
        let proc = op.process();
        if procfs::creds(proc.pid).is_some_and(|now| Some(now) != proc.creds) {
            self.lose_locked(
                op,
                "it executed a program that changed its credentials (setuid, setgid or file \
                 capabilities); attach again to watch the new program"
                    .into(),
            );
            return;
        }
        // Hits of the old program still unread are reported under it, while
        // their watchpoints exist.
        self.report_pending_hits(op);
        proc.new_image();
        self.symbols.sweep();
        // Code events name functions of the old program: they go.
        self.remove_object_watches_at_exec(op);
        // The kernel cleared every breakpoint (kernel-facts §3). Watchpoints
        // set by name over the whole process are resolved again in the new
        // program; the others go, and so do those whose expression starts
        // from an address (`((struct x *)0x…)->f`): it names nothing there.
        let mut again = Vec::new();
        for id in proc.watch_ids() {
            let Some(w) = self.take_watch(op, id) else {
                continue;
            };
            let resolve = w.process_wide
                && w.spec.symbol.as_ref().is_some_and(|b| {
                    b.on_exec == ExecPolicy::ResolveAgain
                        && crate::symbols::expr::Expr::parse(&b.expr)
                            .is_ok_and(|e| !e.name.is_empty())
                });
            if resolve {
                again.push((w, Instant::now() + RESOLVE_AFTER_EXEC));
            } else if !w.object {
                // An object's watchpoint goes with its object, silently
                // (counted on its object watch).
                self.bus.publish_as(
                    EventKind::WatchpointRemoved {
                        id: w.id,
                        pid: proc.pid,
                        reason: "exec".into(),
                    },
                    Some(proc.owner.clone()),
                );
            }
        }
        tracing::info!(
            pid = proc.pid,
            again = again.len(),
            "process called exec: its watchpoints were removed, those set by name are resolved again"
        );
        if !again.is_empty() {
            self.resolve_again_locked(op, again);
        }
    }

    /// Arms watchpoints set by name again after an exec, where their names
    /// resolve in the new program. A name of a library the dynamic linker
    /// has not loaded yet is tried again (every 10 ms) until its deadline,
    /// then the watchpoint is removed with the reason.
    pub(super) fn resolve_again_locked(
        self: &Arc<Self>,
        op: &OpGuard<'_>,
        todo: Vec<(Arc<Watch>, Instant)>,
    ) {
        let proc = op.process();
        let mut later = Vec::new();
        for (w, deadline) in todo {
            let mut spec = w.spec.clone();
            spec.range.pieces.clear();
            spec.range.len = spec.symbol.as_ref().map_or(0, |b| b.len);
            let outcome = self
                .resolve_spec(spec)
                .and_then(|(spec, r)| self.set_locked(op, spec, w.owner, r, Some(w.id)));
            match outcome {
                Ok(view) => {
                    if let Some(symbol) = view.symbol {
                        self.bus.publish_as(
                            EventKind::WatchpointResolved {
                                id: w.id,
                                pid: proc.pid,
                                symbol: Some(symbol),
                                place: None,
                                reason: "exec",
                            },
                            Some(proc.owner.clone()),
                        );
                    }
                }
                Err(WpdError::Symbol(
                    SymbolError::Unknown { .. } | SymbolError::NoSuchModule { .. },
                )) if Instant::now() < deadline && !proc.is_gone() => later.push((w, deadline)),
                Err(e) => self.bus.publish_as(
                    EventKind::WatchpointRemoved {
                        id: w.id,
                        pid: proc.pid,
                        reason: format!("exec: {e}").into(),
                    },
                    Some(proc.owner.clone()),
                ),
            }
        }
        if !later.is_empty() {
            self.pending_resolve.insert(proc.pid, later);
            self.schedule_later(Job::Resolve(proc.pid), Duration::from_millis(10));
        }
    }

    /// The backend tracks no thread of `pid` any more. If the process still
    /// has live threads after a moment (an exiting process has none within
    /// milliseconds), the kernel took our events off it: a setuid or setgid
    /// exec detaches every perf event (`begin_new_exec`, kernel-facts §4),
    /// and nothing would ever fire again.
    pub(super) fn check_lost(&self, pid: Pid) {
        for _ in 0..10 {
            let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
                return;
            };
            if self.ledger.thread_count(pid) > 0 {
                return;
            }
            if procfs::running_thread(pid).is_none() {
                // Gone or going: its exit (seen here first) ends the
                // attachment.
                self.process_exited(pid);
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
            if self.ledger.thread_count(pid) == 0 && procfs::running_thread(pid).is_some() {
                let op = proc.lock_op();
                if proc.is_gone() {
                    return;
                }
                if procfs::running_thread(pid).is_some() && self.ledger.thread_count(pid) == 0 {
                    self.lose_locked(
                        &op,
                        "the kernel detached every perf event from it (it executed a setuid or \
                         setgid program); attach again to watch the new program"
                            .into(),
                    );
                    return;
                }
            }
        }
    }

    /// Ends the attachment of a process the daemon can no longer watch:
    /// every watchpoint removed, the process detached, and a `ProcessLost`
    /// event saying why.
    pub(super) fn lose_locked(&self, op: &OpGuard<'_>, reason: String) {
        let proc = op.process();
        if proc.gone.swap(true, Ordering::SeqCst) {
            // Already ended (its exit or a detach), and reported.
            return;
        }
        let removed = self.remove_all_locked(op, "process lost");
        if let Some(t) = proc.exit_watch.lock().unwrap().take() {
            t.abort();
        }
        tracing::warn!(pid = proc.pid, "{reason}");
        self.bus.publish_as(
            EventKind::ProcessLost {
                pid: proc.pid,
                reason,
                watchpoints: removed,
            },
            Some(proc.owner.clone()),
        );
        self.forget_process(proc);
    }

    /// A new event subscription for caller `uid`, within the limits: at
    /// most `subscribers_per_caller` for one unprivileged uid, and the last
    /// `SUBSCRIBER_RESERVE` of `subscribers` kept for privileged callers.
    pub fn subscribe(
        &self,
        uid: u32,
        privileged: bool,
    ) -> Result<crate::events::Subscription, WpdError> {
        let _one_at_a_time = self.subscribing.lock().unwrap();
        let total = self.bus.subscribers(None);
        if privileged {
            if total >= self.limits.subscribers {
                return Err(WpdError::LimitReached {
                    what: "event subscribers",
                    limit: self.limits.subscribers,
                    hint: "close another event stream first",
                });
            }
        } else {
            let open_to_all = self.limits.subscribers.saturating_sub(SUBSCRIBER_RESERVE);
            if total >= open_to_all {
                return Err(WpdError::LimitReached {
                    what: "event subscribers (the rest is reserved for privileged callers)",
                    limit: open_to_all,
                    hint: "close another event stream first",
                });
            }
            if self.bus.subscribers(Some(uid)) >= self.limits.subscribers_per_caller {
                return Err(WpdError::LimitReached {
                    what: "event subscribers per caller",
                    limit: self.limits.subscribers_per_caller,
                    hint: "close another of your event streams first",
                });
            }
        }
        Ok(self.bus.subscribe(uid, privileged))
    }

    /// Ends every event stream (first step of shutdown).
    pub fn close_streams(&self) {
        self.bus.close();
    }

    /// Detaches everything (shutdown). Every target keeps running.
    pub fn shutdown(&self) {
        /// Threads detaching processes at once at shutdown.
        const SHUTDOWN_DETACHERS: usize = 16;
        self.stop.store(true, Ordering::SeqCst);
        let pids: Vec<Pid> = self.procs.iter().map(|p| *p.key()).collect();
        // Every process at once: a process's detach waits for the kernel
        // to close its code events' uprobes (a grace period), and the
        // waits of processes detached together overlap.
        std::thread::scope(|s| {
            for chunk in pids.chunks(pids.len().div_ceil(SHUTDOWN_DETACHERS).max(1)) {
                let spawned = std::thread::Builder::new()
                    .name("wpd-detach".into())
                    .spawn_scoped(s, move || {
                        for &pid in chunk {
                            let _ = self.detach(pid);
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!("detaching on the shutting-down thread: {e}");
                    for &pid in chunk {
                        let _ = self.detach(pid);
                    }
                }
            }
        });
        for b in self.backends.usable() {
            b.shutdown();
        }
        // Last: the detaches above are journaled too.
        if let Some(j) = &self.journal {
            j.shutdown();
        }
    }
}
