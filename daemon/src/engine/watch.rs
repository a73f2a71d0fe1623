//! Watchpoints: set (reserve → arm → commit or undo), remove, and resume
//! held threads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Core, WatchView};
use crate::arch;
use crate::arch::SpecError;
use crate::backend::Features;
use crate::error::WpdError;
use crate::events::EventKind;
use crate::ledger::Retained;
use crate::model::{HitAction, Pid, Scope, Tid, WatchId, WatchSpec};
use crate::procfs;
use crate::sched::Boost;
use crate::state::{OpGuard, Process, Watch};
use crate::symbols::{Resolved, SymbolError};

/// A held thread's stack, unsymbolized.
#[derive(Debug)]
pub struct ThreadStack {
    /// Where it is stopped, then its callers' return addresses.
    pub ips: Vec<u64>,
    /// Why the chain ended early, when known.
    pub note: Option<&'static str>,
    /// Its registers.
    pub regs: crate::backend::HeldRegisters,
    /// The process's program image, for symbolizing.
    pub image: Option<Arc<crate::symbols::Image>>,
    /// With locals asked for: each frame's parameters and variables (or why
    /// they cannot be read), frame by frame as `ips`.
    pub locals: Vec<Result<Vec<crate::symbols::frame::LocalVar>, String>>,
}

impl Core {
    /// The error for a feature the process's backend lacks, naming one
    /// that has it.
    pub(super) fn lacks(
        &self,
        feature: &'static str,
        has: fn(&Features) -> bool,
        hint: &'static str,
    ) -> WpdError {
        WpdError::NeedsBackend {
            feature,
            needs: self.backends.with_feature(has),
            hint,
        }
    }

    /// Sets a watchpoint; returns it and the time taken. A refused request
    /// changes nothing, the attach it needed included. Blocking.
    pub fn set_watchpoint(
        self: &Arc<Self>,
        spec: WatchSpec,
        owner: u32,
    ) -> Result<(WatchView, Duration), WpdError> {
        self.set_watchpoint_with_id(spec, owner, None)
    }

    /// [`Core::set_watchpoint`] under a given id (a watchpoint of a previous
    /// run set again: ids above every saved one are never handed out, see
    /// [`Core::reserve_ids`]), or a new one.
    /// What `owner` holds against `--max-watchpoints-per-caller`: its
    /// watchpoints (not the objects' own, which their object watch arms
    /// and bounds), its code events (object watches and code breakpoints,
    /// pending ones included) and its policies.
    pub fn held_by(&self, owner: u32) -> usize {
        self.watches
            .iter()
            .filter(|w| w.owner == owner && !w.object)
            .count()
            + self.objects.held_by(owner)
            + self
                .policies
                .iter()
                .filter(|p| p.caller.uid == owner)
                .count()
    }

    /// Refuses a new watchpoint, code event or policy of `owner` when it
    /// holds as many as it may.
    pub(super) fn check_held(&self, owner: u32) -> Result<(), WpdError> {
        if self.held_by(owner) >= self.limits.watchpoints_per_caller {
            return Err(WpdError::LimitReached {
                what: "watchpoints, code events and policies per caller",
                limit: self.limits.watchpoints_per_caller,
                hint: "remove some first",
            });
        }
        Ok(())
    }

    pub fn set_watchpoint_with_id(
        self: &Arc<Self>,
        spec: WatchSpec,
        owner: u32,
        id: Option<WatchId>,
    ) -> Result<(WatchView, Duration), WpdError> {
        if let Some(id) = id
            && (self.watches.contains_key(&id) || self.policies.contains_key(&id))
        {
            return Err(WpdError::InvalidArgument(format!("id {id} is in use")));
        }
        let t_start = Instant::now();
        let (spec, resolved) = self.resolve_spec(spec)?;
        let t_resolved = t_start.elapsed();
        self.check_held(owner)?;
        // What the process's backend (attached, or to be) cannot do is
        // refused before anything is attached.
        let kind = self
            .procs
            .get(&spec.pid)
            .map(|p| p.backend)
            .or(spec.backend);
        if let Some(f) = self.backends.features(kind) {
            if matches!(spec.action, HitAction::Stop | HitAction::StopAll) && !f.stops {
                return Err(self.lacks(
                    "stopping on a hit",
                    |f| f.stops,
                    " (attach with that backend); this process's backend never stops the target",
                ));
            }
            if matches!(spec.action, HitAction::Signal(_)) && !f.signal_at_hit {
                return Err(self.lacks(
                    "a signal at the hit",
                    |f| f.signal_at_hit,
                    ", which sends it at the trap (perf's per-thread path, BPF) or while the \
                     thread is stopped (ptrace); this one sees hits only after the thread ran on",
                ));
            }
            if let HitAction::Signal(sig) = spec.action
                && let Err(why) = crate::signals::deliverable(spec.pid, sig)
            {
                return Err(WpdError::SignalUnusable(why));
            }
            if spec.follow_forks && !f.follow_forks {
                return Err(self.lacks(
                    "following forks",
                    |f| f.follow_forks,
                    ", whose breakpoints the kernel copies into a forked child; a tracer would \
                     have to seize every child",
                ));
            }
            if matches!(spec.scope, Scope::Named(_)) && !f.thread_names {
                return Err(self.lacks(
                    "threads by name",
                    |f| f.thread_names,
                    ", which sees threads renamed (the kernel's COMM records) and arms or disarms \
                     one thread at a time",
                ));
            }
            if spec.feedback.is_some() && !f.feedback {
                return Err(self.lacks(
                    "state feedback",
                    |f| f.feedback,
                    ", whose breakpoint signals the storing thread at the trap (perf's sigtrap) \
                     for the library that counts the value in the fuzzer's map",
                ));
            }
            if spec.feedback.is_some() && spec.condition.is_some() && !f.signal_at_hit {
                return Err(self.lacks(
                    "a condition on state feedback",
                    |f| f.signal_at_hit,
                    ", which judges it at the trap (perf's per-thread path, BPF); here every \
                     store would count",
                ));
            }
            if spec.only_on_change && !f.only_on_change {
                return Err(self.lacks(
                    "only-on-change",
                    |f| f.only_on_change,
                    ", which compares values while the thread is stopped; this process's backend \
                     reads values too late to tell",
                ));
            }
        }
        let (proc, newly) = self.attach_for(owner, spec.pid, spec.backend, spec.allow_init)?;
        let t_attached = t_start.elapsed();
        let set = self.set_watchpoint_on(&proc, spec, owner, resolved, id);
        tracing::debug!(
            ?t_resolved,
            ?t_attached,
            set = ?t_start.elapsed(),
            "set_watchpoint timings"
        );
        if set.is_err() && newly {
            // A refused request changes nothing: the attach it made goes too
            // (unless another request put a watchpoint there meanwhile).
            let op = proc.lock_op();
            if proc.watch_ids().is_empty() && !proc.is_gone() {
                drop(op);
                if let Some(t) = proc.exit_watch.lock().unwrap().take() {
                    t.abort();
                }
                self.forget_process(&proc);
            }
        }
        set.map(|view| (view, t_start.elapsed()))
    }

    /// A spec with its range: a name resolved in the process (the range it
    /// gives checked against the slots), an address range checked.
    pub(super) fn resolve_spec(
        &self,
        mut spec: WatchSpec,
    ) -> Result<(WatchSpec, Option<Resolved>), WpdError> {
        let Some(by) = &spec.symbol else {
            let range = arch::validate(spec.range.addr, spec.range.len, spec.access)?;
            debug_assert_eq!(
                range, spec.range,
                "the RPC layer splits ranges the same way"
            );
            check_filter(&mut spec, None)?;
            return Ok((spec, None));
        };
        procfs::check_process(spec.pid)?;
        let r = self
            .symbols
            .resolve(spec.pid, &by.expr, spec.access, spec.range.len)?;
        let len = u32::try_from(r.size).unwrap_or(u32::MAX);
        spec.range = arch::validate(r.address, len, spec.access).map_err(|e| match e {
            SpecError::TooLarge { needed, slots, .. } => WpdError::Symbol(SymbolError::TooLarge {
                expr: r.expr.clone(),
                type_name: r.type_name.clone(),
                size: r.size,
                needed,
                slots,
            }),
            other => other.into(),
        })?;
        check_filter(&mut spec, Some(&r))?;
        Ok((spec, Some(r)))
    }

    /// Sets a watchpoint on an attached process (see `set_watchpoint`);
    /// `reuse`: the id it keeps (a watchpoint armed again after exec).
    pub(super) fn set_watchpoint_on(
        self: &Arc<Self>,
        proc: &Arc<Process>,
        spec: WatchSpec,
        owner: u32,
        resolved: Option<Resolved>,
        reuse: Option<WatchId>,
    ) -> Result<WatchView, WpdError> {
        if let Some(asked) = spec.backend
            && asked != proc.backend
        {
            return Err(WpdError::BackendMismatch {
                pid: spec.pid,
                attached: proc.backend,
                asked,
            });
        }
        let op = proc.lock_op();
        self.set_locked(&op, spec, owner, resolved, reuse)
    }

    /// Sets the watchpoint of one object of an object watch (see
    /// `Watch::object`) on an attached process.
    pub(super) fn set_object_child(
        self: &Arc<Self>,
        proc: &Arc<Process>,
        spec: WatchSpec,
        owner: u32,
    ) -> Result<WatchView, WpdError> {
        let op = proc.lock_op();
        self.set_locked_as(&op, spec, owner, None, None, true)
    }

    /// Ids up to `last` are never handed out as new ones (they belong to
    /// saved watchpoints and policies, and to the journal's events).
    pub fn reserve_ids(&self, last: u64) {
        self.next_id.fetch_max(last + 1, Ordering::Relaxed);
    }

    /// The next id a new watchpoint or policy would get.
    pub fn next_id(&self) -> u64 {
        self.next_id.load(Ordering::Relaxed)
    }

    /// [`Core::set_watchpoint_on`] with the process's operation lock held.
    pub(super) fn set_locked(
        self: &Arc<Self>,
        op: &OpGuard<'_>,
        spec: WatchSpec,
        owner: u32,
        resolved: Option<Resolved>,
        reuse: Option<WatchId>,
    ) -> Result<WatchView, WpdError> {
        self.set_locked_as(op, spec, owner, resolved, reuse, false)
    }

    /// [`Core::set_locked`]; `object`: the watchpoint of one object.
    fn set_locked_as(
        self: &Arc<Self>,
        op: &OpGuard<'_>,
        spec: WatchSpec,
        owner: u32,
        resolved: Option<Resolved>,
        reuse: Option<WatchId>,
        object: bool,
    ) -> Result<WatchView, WpdError> {
        let proc = op.process();
        let backend = self.backends.get(Some(proc.backend))?.clone();
        let _rt = Boost::enter();
        if proc.is_gone() {
            return Err(WpdError::ProcessExited(spec.pid));
        }
        // Make every thread event already emitted visible in the ledger.
        backend.sync();
        let pid = spec.pid;
        let process_wide = spec.scope == Scope::Process;
        if let Scope::Threads(tids) = &spec.scope {
            for &tid in tids {
                if !procfs::is_thread_of(pid, tid) || self.ledger.get(tid).is_none() {
                    return Err(WpdError::NoSuchThread { pid, tid });
                }
            }
        }
        // A watch whose hits are judged by their value cannot work where the
        // daemon may not read the process's memory (Yama: it did not start
        // the process and lacks CAP_SYS_PTRACE): refused, not armed to
        // report nothing.
        if (spec.condition.is_some() || spec.only_on_change)
            && let Some(why) = crate::procfs::yama::refusal()
            && procfs::live_thread(pid).is_some_and(|via| {
                procfs::read_memory(pid, via, spec.range.addr, spec.range.len as usize)
                    .is_err_and(|e| e.contains(&why))
            })
        {
            return Err(WpdError::PermissionDenied {
                pid,
                detail: format!(
                    "{why}, and a watch with a condition or --only-on-change needs the value at \
                     each hit: watch without them (hits are reported, without a value)"
                ),
            });
        }
        let id = reuse.unwrap_or_else(|| WatchId(self.next_id.fetch_add(1, Ordering::Relaxed)));
        let mut spec = spec;
        if let Some(fb) = &spec.feedback {
            let tag = spec.policy.unwrap_or(id).0;
            let sig_data = self.feedback_sig_data(&spec, tag)?;
            spec.feedback = Some(crate::model::Feedback {
                sig_data: Some(sig_data),
                ..fb.clone()
            });
        }
        let mut warnings = Vec::new();
        // A policy's instance has no caller to warn (its answer is the
        // policy's, given at its creation), and is armed on an exec's way
        // (`policy_hold.rs`): each `/proc` read below costs the process
        // 20-120 µs of its hold there.
        let warn = spec.policy.is_none();
        let r = &spec.range;
        // A name resolved just now was found in a mapping.
        if warn && resolved.is_none() && !procfs::is_mapped(pid, r.addr, u64::from(r.len)) {
            warnings.push(format!(
                "address {:#x} is not mapped in process {pid} now: the watchpoint is armed and \
                 fires once memory is mapped there",
                r.addr
            ));
        }
        if r.slots() > 1 {
            let pieces: Vec<String> = r
                .pieces
                .iter()
                .map(|p| format!("{}@{:#x}", p.len.bytes(), p.addr))
                .collect();
            warnings.push(format!(
                "{} bytes at {:#x} take {} slots on every thread (aligned pieces {})",
                r.len,
                r.addr,
                r.slots(),
                pieces.join(", ")
            ));
        }
        // The first data breakpoint of a process turns its string
        // instructions slow (kernel-facts §14): say so while the person can
        // still restart it with the cure.
        if warn
            && spec.access != crate::model::Access::Exec
            && proc.watches.lock().unwrap().is_empty()
            && let Some(w) = crate::faststrings::memset_warning(pid)
        {
            warnings.push(w);
        }
        let watch = new_watch(id, spec.clone(), proc.backend, owner, resolved, object);
        if spec.only_on_change {
            *watch.last_value.lock().unwrap() = procfs::live_thread(pid).and_then(|via| {
                procfs::read_memory(pid, via, spec.range.addr, spec.range.len as usize).ok()
            });
        }
        // Registered before the thread snapshot: a thread born from here on
        // gets it at birth (ptrace: at its first stop; perf: inheritance
        // and reconcile), and one already holding it is skipped by
        // `reserve_all`.
        self.watches.insert(id, watch.clone());
        proc.watches.lock().unwrap().insert(id);
        let tids: Vec<Tid> = match &spec.scope {
            // In tid order: arm passes cut it into contiguous ranges, one per
            // CPU.
            Scope::Process => {
                let mut tids = self.ledger.tids(pid);
                tids.sort_unstable();
                tids
            }
            Scope::Threads(tids) => tids.clone(),
            // The threads called so now; others join when they are.
            Scope::Named(g) => {
                let mut tids: Vec<Tid> = self
                    .ledger
                    .tids(pid)
                    .into_iter()
                    .filter(|&t| procfs::comm(pid, t).is_some_and(|n| g.matches(&n)))
                    .collect();
                tids.sort_unstable();
                tids
            }
        };
        let named = matches!(spec.scope, Scope::Named(_));
        let unregister = |why: WpdError| {
            self.watches.remove(&id);
            proc.watches.lock().unwrap().remove(&id);
            Err(why)
        };
        if tids.is_empty() && named {
            // No thread has the name yet: armed as threads take it.
            if procfs::check_process(pid).is_err() {
                return unregister(WpdError::ProcessExited(pid));
            }
            let mut view = self.view(&watch);
            view.warnings = warnings;
            view.warnings.push(format!(
                "no thread of process {pid} is called {:?} now: threads are armed as they take \
                 such a name",
                match &spec.scope {
                    Scope::Named(g) => g.text.as_str(),
                    _ => "",
                }
            ));
            return Ok(view);
        }
        if tids.is_empty() {
            // Nothing to arm: never a success that can never fire. A process
            // being killed has had its threads' exits read while some still
            // show in /proc: lost only if a thread that is not exiting stays.
            let running = (0..10).all(|_| {
                let running = procfs::running_thread(pid).is_some();
                if running {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                running
            }) && procfs::running_thread(pid).is_some();
            return unregister(if running {
                WpdError::ProcessLost {
                    pid,
                    why:
                        "the daemon tracks none of its threads any more (after a setuid or setgid \
                          exec the kernel takes perf events off a process); detach and attach again"
                            .into(),
                }
            } else {
                WpdError::ProcessExited(pid)
            });
        }
        let armed = self
            .ledger
            .reserve_all(
                &tids,
                id,
                spec.range.slots() as u8,
                process_wide,
                backend.retained(),
            )
            .map_err(|conflicts| WpdError::OutOfSlots {
                pid,
                needed: spec.range.slots(),
                conflicts,
            })
            .and_then(|res| self.arm_reserved(op, &backend, &watch, &res));
        // The process may have exited while it was being armed.
        let armed = armed.and_then(|()| {
            if procfs::check_process(pid).is_err() && self.ledger.armed_on(&tids, id) == 0 {
                Err(WpdError::ProcessExited(pid))
            } else {
                Ok(())
            }
        });
        if let Err(e) = armed {
            self.watches.remove(&id);
            proc.watches.lock().unwrap().remove(&id);
            // Threads born meanwhile may have taken it: undo those too.
            backend.disarm(op, &watch);
            self.release_slots(&watch, backend.retained());
            return Err(e);
        }
        let mut view = self.view(&watch);
        view.warnings = warnings;
        Ok(view)
    }

    /// Frees the ledger's slots of `w` on every thread that has them.
    pub(super) fn release_slots(&self, w: &Watch, retained: Retained) {
        let mut tids: Vec<Tid> = self
            .ledger
            .slots_on(&self.watch_tids(w), w.id)
            .into_iter()
            .map(|(tid, _)| tid)
            .collect();
        tids.dedup(); // one entry per piece, a thread's together
        for tid in tids {
            self.ledger.release(tid, w.id, retained == Retained::Reuse);
        }
    }

    /// Reports the hits the locked process's backend holds unread (a perf
    /// ring is read a poll later, or later still on a loaded machine)
    /// while their watchpoints still exist: called before watchpoints are
    /// taken, whose hits would otherwise name none and be lost.
    pub(super) fn report_pending_hits(&self, op: &OpGuard<'_>) {
        if let Ok(b) = self.backends.get(Some(op.process().backend)) {
            b.sync();
        }
    }

    /// Takes watchpoint `id` off its locked process: disarmed by the
    /// backend, slots released, forgotten.
    pub(super) fn take_watch(&self, op: &OpGuard<'_>, id: WatchId) -> Option<Arc<Watch>> {
        let (_, w) = self.watches.remove(&id)?;
        op.process().watches.lock().unwrap().remove(&id);
        if let Ok(b) = self.backends.get(Some(w.backend)) {
            b.disarm(op, &w);
            self.release_slots(&w, b.retained());
        }
        Some(w)
    }

    /// Threads a watchpoint can hold a slot on: its own tids when it is
    /// thread-scoped (O(scope), however many threads the process has),
    /// every tracked thread when it is process-wide.
    pub(super) fn watch_tids(&self, w: &Watch) -> Vec<Tid> {
        match &w.spec.scope {
            Scope::Threads(tids) => tids.clone(),
            Scope::Process | Scope::Named(_) => self.ledger.tids(w.spec.pid),
        }
    }

    /// The process a watchpoint belongs to.
    pub fn watch_pid(&self, id: WatchId) -> Option<Pid> {
        self.watches.get(&id).map(|w| w.spec.pid)
    }

    /// Thread `tid` of the locked process was created or renamed: every
    /// watchpoint on threads by name arms it if its name now matches and
    /// it lacks the watchpoint, or disarms it if it has it and the name
    /// no longer matches.
    pub(super) fn named_thread(&self, op: &OpGuard<'_>, tid: Tid) {
        let proc = op.process();
        let pid = proc.pid;
        let Ok(backend) = self.backends.get(Some(proc.backend)).cloned() else {
            return;
        };
        let Some(name) = procfs::comm(pid, tid) else {
            return; // gone
        };
        backend.sync();
        for id in proc.watch_ids() {
            let Some(w) = self.watches.get(&id).map(|w| w.clone()) else {
                continue;
            };
            let Scope::Named(g) = &w.spec.scope else {
                continue;
            };
            let Some(row) = self.ledger.get(tid) else {
                continue;
            };
            let has = row.mask_of(w.id) != 0;
            let want = g.matches(&name);
            if want && !has {
                let mut res = Vec::new();
                let pieces = w.spec.range.slots() as u8;
                if let Err(e) =
                    self.ledger
                        .reserve(tid, w.id, pieces, false, backend.retained(), &mut res)
                {
                    tracing::warn!(
                        pid,
                        tid,
                        id = w.id.0,
                        ?e,
                        "thread {name:?} has no free slot"
                    );
                    continue;
                }
                if let Err(e) = self.arm_reserved(op, &backend, &w, &res) {
                    tracing::warn!(pid, tid, id = w.id.0, "arming thread {name:?}: {e}");
                }
            } else if !want && has {
                backend.disarm_threads(op, &w, &[tid]);
                self.ledger
                    .release(tid, w.id, backend.retained() == Retained::Reuse);
            }
        }
    }

    /// Whether process `pid` has a watchpoint on threads by name.
    pub(super) fn has_named(&self, pid: Pid) -> bool {
        self.procs.get(&pid).is_some_and(|p| {
            p.watch_ids().iter().any(|id| {
                self.watches
                    .get(id)
                    .is_some_and(|w| matches!(w.spec.scope, Scope::Named(_)))
            })
        })
    }

    /// Removes a watchpoint. Blocking.
    pub fn remove_watchpoint(&self, id: WatchId) -> Result<WatchView, WpdError> {
        let pid = self
            .watches
            .get(&id)
            .map(|w| w.spec.pid)
            .ok_or(WpdError::NoSuchWatchpoint(id))?;
        let proc = self
            .procs
            .get(&pid)
            .map(|p| p.clone())
            .ok_or(WpdError::NoSuchWatchpoint(id))?;
        let op = proc.lock_op();
        // Its hits made before the removal are reported before it, and
        // counted in the view it answers with.
        self.report_pending_hits(&op);
        let view = self
            .watches
            .get(&id)
            .map(|w| self.view(&w))
            .ok_or(WpdError::NoSuchWatchpoint(id))?;
        let w = self
            .take_watch(&op, id)
            .ok_or(WpdError::NoSuchWatchpoint(id))?;
        // An object's watchpoint goes with its object (counted on its
        // object watch): the stream reports the watches callers set.
        if !w.object {
            self.bus.publish_as(
                EventKind::WatchpointRemoved {
                    id: w.id,
                    pid,
                    reason: "removed".into(),
                },
                Some(proc.owner.clone()),
            );
        }
        Ok(WatchView {
            hits: w.hits.load(Ordering::Relaxed),
            armed_threads: 0,
            ..view
        })
    }

    /// Resumes held threads of `pid` (all when `tids` is empty). Blocking.
    pub fn resume(&self, pid: Pid, tids: &[Tid]) -> Result<Vec<Tid>, WpdError> {
        let backend = self.stopping_backend(pid, "resuming threads", tids)?;
        backend.resume(pid, tids)
    }

    /// The hits watchpoint `id` kept, oldest first (the last `limit`, or
    /// all with 0), its process, and how many it reported in all.
    pub fn recent_hits(
        &self,
        id: WatchId,
        limit: usize,
    ) -> Result<(Vec<Arc<crate::events::Event>>, Pid, u64), WpdError> {
        let Some(w) = self.watches.get(&id).map(|w| w.clone()) else {
            return self
                .breakpoint_recent(id, limit)
                .ok_or(WpdError::NoSuchWatchpoint(id));
        };
        let kept = w.recent.lock().unwrap();
        let skip = match limit {
            0 => 0,
            n => kept.len().saturating_sub(n),
        };
        Ok((
            kept.iter().skip(skip).cloned().collect(),
            w.spec.pid,
            w.hits.load(Ordering::Relaxed),
        ))
    }

    /// Stops threads of `pid` (all when `tids` is empty) and holds them
    /// until Resume; returns those held. Blocking.
    pub fn pause(&self, pid: Pid, tids: &[Tid]) -> Result<Vec<Tid>, WpdError> {
        let backend = self.stopping_backend(pid, "pausing threads", tids)?;
        backend.pause(pid, tids)
    }

    /// Where held thread `tid` is stopped and its callers' return addresses
    /// (up to `depth` frames in all), with why the chain ended early. Blocking.
    pub fn thread_stack(
        &self,
        pid: Pid,
        tid: Tid,
        depth: usize,
        locals: bool,
    ) -> Result<ThreadStack, WpdError> {
        let backend = self.stopping_backend(pid, "reading a thread's stack", &[tid])?;
        let regs = backend.held_registers(pid, tid)?;
        // By the modules' call frame information (frame pointers or not),
        // the frame-pointer step where a module has none.
        let (frames, note) = self.symbols.unwind_frames(
            pid,
            (regs.ip, regs.sp, regs.fp),
            depth.saturating_sub(1),
            |at| {
                let b = procfs::read_memory(pid, tid, at, 8).ok()?;
                Some(u64::from_le_bytes(b.try_into().ok()?))
            },
        );
        let ips = frames.iter().map(|f| f.ip).collect();
        let mut vars = Vec::new();
        if locals {
            let general: Option<[u64; 18]> = regs
                .general
                .iter()
                .map(|&(_, v)| v)
                .collect::<Vec<_>>()
                .try_into()
                .ok();
            let mut read = |at: u64, len: usize| procfs::read_memory(pid, tid, at, len).ok();
            for (i, f) in frames.iter().enumerate() {
                let g = if i == 0 { general.as_ref() } else { None };
                vars.push(self.symbols.frame_locals(pid, f, g, &mut read));
            }
        }
        let image = self.procs.get(&pid).map(|p| p.image());
        Ok(ThreadStack {
            ips,
            note,
            regs,
            image,
            locals: vars,
        })
    }

    /// What `name` is in frame `frame` of held thread `tid`: an expression
    /// starting from one of the frame's parameters or locals, else from a
    /// global (`Symbols::look_up_in_frame`; the flag says which). Blocking.
    pub fn resolve_in_frame(
        &self,
        pid: Pid,
        tid: Tid,
        frame: usize,
        name: &str,
    ) -> Result<(crate::symbols::Resolved, crate::symbols::NameKind, bool), WpdError> {
        let backend = self.stopping_backend(pid, "reading a frame's variables", &[tid])?;
        let regs = backend.held_registers(pid, tid)?;
        let (frames, _) =
            self.symbols
                .unwind_frames(pid, (regs.ip, regs.sp, regs.fp), frame, |at| {
                    let b = procfs::read_memory(pid, tid, at, 8).ok()?;
                    Some(u64::from_le_bytes(b.try_into().ok()?))
                });
        let Some(f) = frames.get(frame) else {
            return Err(WpdError::InvalidArgument(format!(
                "thread {tid} has {} frames: there is no frame {frame}",
                frames.len()
            )));
        };
        let general: Option<[u64; 18]> = regs
            .general
            .iter()
            .map(|&(_, v)| v)
            .collect::<Vec<_>>()
            .try_into()
            .ok();
        let g = if frame == 0 { general.as_ref() } else { None };
        let mut read = |at: u64, len: usize| procfs::read_memory(pid, tid, at, len).ok();
        match self.symbols.frame_scope(pid, f, g, &mut read) {
            Ok(scope) => Ok(self.symbols.look_up_in_frame(pid, name, &scope, frame)?),
            // No DWARF for the frame: globals only.
            Err(_) => {
                let (r, k) = self.symbols.look_up(pid, name)?;
                Ok((r, k, false))
            }
        }
    }

    /// Up to `len` bytes of an attached process's memory from `addr`, and
    /// why the rest could not be read. Blocking.
    pub fn read_memory(
        &self,
        pid: Pid,
        addr: u64,
        len: usize,
    ) -> Result<(Vec<u8>, Option<String>), WpdError> {
        if !self.procs.contains_key(&pid) {
            return Err(WpdError::NotAttached(pid));
        }
        Ok(procfs::read_memory_prefix(pid, addr, len))
    }

    /// The backend of attached process `pid` if it stops threads, after
    /// checking that `tids` are its threads.
    pub(super) fn stopping_backend(
        &self,
        pid: Pid,
        feature: &'static str,
        tids: &[Tid],
    ) -> Result<&Arc<dyn crate::backend::Backend>, WpdError> {
        let proc = self
            .procs
            .get(&pid)
            .map(|p| p.clone())
            .ok_or(WpdError::NotAttached(pid))?;
        let backend = self.backends.get(Some(proc.backend))?;
        if !backend.features().stops {
            return Err(self.lacks(
                feature,
                |f| f.stops,
                if feature == "resuming threads" {
                    ": this process's backend never stops threads (nothing to resume)"
                } else {
                    ": this process's backend never stops threads"
                },
            ));
        }
        for &t in tids {
            if self.ledger.get(t).is_none_or(|r| r.pid != pid) {
                return Err(WpdError::NoSuchThread { pid, tid: t });
            }
        }
        Ok(backend)
    }

    /// Reconciles the process's threads through its backend (the reconcile
    /// thread, for threads born while a watchpoint was being armed).
    pub(super) fn reconcile(&self, op: &OpGuard<'_>) {
        if let Ok(b) = self.backends.get(Some(op.process().backend)) {
            b.reconcile(op);
        }
    }
}

/// The spec's hit filter fits its range and access, its condition bound
/// to the type `r` resolved to (`None`: set by address).
fn check_filter(spec: &mut WatchSpec, r: Option<&Resolved>) -> Result<(), WpdError> {
    spec.value_type = r.and_then(|r| r.value_type.clone()).map(Arc::new);
    spec.bind_condition().map_err(WpdError::InvalidArgument)?;
    crate::filter::check(&spec.filter, &spec.range, spec.access).map_err(WpdError::InvalidArgument)
}

/// A new watchpoint's state, not registered anywhere yet.
pub(super) fn new_watch(
    id: WatchId,
    spec: WatchSpec,
    backend: crate::model::BackendKind,
    owner: u32,
    resolved: Option<Resolved>,
    object: bool,
) -> Arc<Watch> {
    Arc::new(Watch {
        id,
        process_wide: spec.scope == Scope::Process,
        created_at_ns: crate::clock::realtime_ns(),
        hits: AtomicU64::new(0),
        last_value: Mutex::new(None),
        recent: Mutex::new(std::collections::VecDeque::new()),
        forked: Mutex::new(Default::default()),
        forked_total: std::sync::atomic::AtomicU64::new(0),
        aggregates: spec.aggregate.map(crate::aggregate::Aggregates::new),
        backend,
        owner,
        resolved,
        filter: Default::default(),
        object,
        freed: Default::default(),
        spec,
    })
}
