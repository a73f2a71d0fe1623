//! The `wpd-objects` thread: objects armed and disarmed off the tracer
//! threads, pending events looked for, freed objects swept.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;

use super::{ObjectWatch, bump, live_remove_if};
use crate::backend::CodeRecord;
use crate::engine::Core;
use crate::error::WpdError;
use crate::model::{Pid, Tid, WatchId};

/// Work for the objects thread.
pub(super) enum Msg {
    /// Arm the object a probe's record names, then resume the thread.
    Arm(WatchId, CodeRecord, std::time::Instant),
    /// A thread of the process is at its loader's hook: arm the pending
    /// events whose module is mapped now, then resume the thread.
    Loaded(Pid, Tid),
    /// Disarm the object whose base is `u64`, then resume the thread.
    Disarm(WatchId, Pid, Tid, u64),
    /// The object of base `u64` was freed without a stop: remove its
    /// watchpoint (the second id) if it is still that base's.
    Freed(WatchId, u64, WatchId),
    /// An object watch was set: the thread (waiting without a deadline
    /// while no watch has a disarming probe) looks again whether it must
    /// sweep.
    Wake,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Msg")
    }
}

impl Core {
    pub(super) fn start_objects_thread(self: &Arc<Self>) {
        let mut tx = self.objects.tx.lock().unwrap();
        if tx.is_some() {
            return;
        }
        let (t, rx) = mpsc::channel();
        *tx = Some(t);
        let core = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("wpd-objects".into())
            .spawn(move || {
                use std::time::Instant;
                let mut swept = Instant::now();
                loop {
                    // Never holds the core across a wait: the core's end
                    // (its sender dropped) ends this thread.
                    let sweep = match core.upgrade() {
                        Some(c) => c.has_disarming(),
                        None => break,
                    };
                    let sweep_at = sweep.then(|| swept + crate::backend::FREED_SWEEP);
                    let m = match sweep_at {
                        None => match rx.recv() {
                            Ok(m) => Some(m),
                            Err(_) => break,
                        },
                        Some(at) => {
                            match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                                Ok(m) => Some(m),
                                Err(mpsc::RecvTimeoutError::Timeout) => None,
                                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                            }
                        }
                    };
                    let Some(c) = core.upgrade() else { break };
                    let now = Instant::now();
                    if sweep && now >= swept + crate::backend::FREED_SWEEP {
                        swept = now;
                        c.sweep_freed();
                    }
                    if let Some(m) = m {
                        c.object_work(m);
                    }
                }
            })
            .expect("spawn objects thread");
    }

    fn object_work(self: &Arc<Self>, m: Msg) {
        match m {
            Msg::Wake => {}
            Msg::Loaded(pid, tid) => {
                self.resolve_pending(pid);
                let _ = self.resume(pid, &[tid]);
            }
            Msg::Disarm(id, pid, tid, base) => {
                let child = self
                    .objects
                    .watches
                    .get(&id)
                    .and_then(|w| w.live.lock().unwrap().remove(&base));
                if let Some(child) = child {
                    self.disarm_filter(pid, id, base, None);
                    let _ = self.remove_watchpoint(child);
                    if let Some(w) = self.objects.watches.get(&id) {
                        bump(&w, &self.objects.totals, |c| &c.disarmed);
                    }
                }
                let _ = self.resume(pid, &[tid]);
            }
            Msg::Freed(id, base, child) => {
                let w = self.objects.watches.get(&id).map(|w| w.clone());
                if let Some(w) = w
                    && live_remove_if(&w, base, child)
                {
                    let cw = self.watches.get(&child).map(|c| c.clone());
                    let _ = self.remove_watchpoint(child);
                    if let Some(cw) = cw {
                        self.unmute(&cw);
                    }
                    bump(&w, &self.objects.totals, |c| &c.disarmed);
                }
            }
            Msg::Arm(id, r, at) => {
                if let Some(w) = self.objects.watches.get(&id).map(|w| w.clone()) {
                    self.arm_object(&w, &r);
                    let ns = at.elapsed().as_nanos() as u64;
                    w.counts.held_ns.fetch_add(ns, Ordering::Relaxed);
                    self.objects.totals.held_ns.fetch_add(ns, Ordering::Relaxed);
                }
                let _ = self.resume(r.pid, &[r.tid]);
            }
        }
    }

    fn arm_object(self: &Arc<Self>, w: &ObjectWatch, r: &CodeRecord) {
        let totals = &self.objects.totals;
        let pid = w.spec.pid;
        let base = match w.root {
            crate::symbols::code::Root::Ret => r.ret,
            crate::symbols::code::Root::Arg(i) => r.args[i],
        };
        let (address, size) = match w.linear {
            _ if base == 0 => {
                bump(w, totals, |c| &c.failed);
                tracing::warn!(
                    id = w.id.0,
                    pid,
                    tid = r.tid,
                    "object not armed: {} is a null pointer",
                    w.code.expr
                );
                return;
            }
            Some((offset, size)) => (base.wrapping_add(offset), size),
            None => match self.symbols.code_object(
                pid,
                &w.site,
                &w.code.expr,
                w.code.at_return,
                &crate::symbols::code::CodeRegs {
                    ret: r.ret,
                    args: r.args,
                },
                w.code.len,
            ) {
                Ok((resolved, _)) => (resolved.address, resolved.size),
                Err(e) => {
                    bump(w, totals, |c| &c.failed);
                    tracing::warn!(id = w.id.0, pid, tid = r.tid, "object not armed: {e}");
                    return;
                }
            },
        };
        let len = u32::try_from(size).unwrap_or(u32::MAX);
        let range = match crate::arch::validate(address, len, w.spec.access) {
            Ok(r) => r,
            Err(e) => {
                bump(w, totals, |c| &c.failed);
                tracing::warn!(id = w.id.0, pid, tid = r.tid, "object not armed: {e}");
                return;
            }
        };
        let spec = super::object_spec(w, range, r.tid);
        let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
            return;
        };
        // The same base again (freed without the disarming function, and
        // handed out anew): the old object's watchpoint goes first.
        let old = w.live.lock().unwrap().remove(&base);
        if let Some(old) = old {
            self.disarm_filter(pid, w.id, base, None);
            let _ = self.remove_watchpoint(old);
        }
        // Its addresses may still be muted from an object freed there.
        self.unmute_range(pid, proc.backend, &spec.range);
        match self.set_object_child(&proc, spec, w.owner) {
            Ok(view) => {
                bump(w, totals, |c| &c.armed);
                w.live.lock().unwrap().insert(base, view.id);
                if let Some(child) = self.watches.get(&view.id).map(|c| c.clone())
                    && !self.disarm_filter(pid, w.id, base, Some(&child))
                {
                    w.live.lock().unwrap().remove(&base);
                    let _ = self.remove_watchpoint(view.id);
                    bump(w, totals, |c| &c.failed);
                }
            }
            Err(e @ WpdError::OutOfSlots { .. }) => {
                bump(w, totals, |c| &c.no_slot);
                tracing::warn!(id = w.id.0, pid, tid = r.tid, "object not armed: {e}");
            }
            Err(e) => {
                bump(w, totals, |c| &c.failed);
                tracing::warn!(id = w.id.0, pid, tid = r.tid, "object not armed: {e}");
            }
        }
    }

    /// Reads the records of freeing calls no stop has read for a whole
    /// `FREED_SWEEP` (the objects thread, every `FREED_SWEEP` while an
    /// object watch has a disarming probe): within two periods of its
    /// call, an object nobody's stop took off is taken off here.
    fn sweep_freed(&self) {
        // The backends of the processes with disarming probes.
        let mut kinds = Vec::new();
        for w in self.objects.watches.iter() {
            if w.code.disarm_on.is_some()
                && w.place.is_none()
                && let Some(p) = self.procs.get(&w.spec.pid)
                && !kinds.contains(&p.backend)
            {
                kinds.push(p.backend);
            }
        }
        for kind in kinds {
            if let Ok(b) = self.backends.get(Some(kind)) {
                let freed = b.take_freed(true);
                if !freed.is_empty() {
                    self.objects_freed_seen(&freed, None);
                }
            }
        }
    }

    /// Whether an object watch has a disarming probe (its freeing calls
    /// are then swept).
    fn has_disarming(&self) -> bool {
        self.objects
            .watches
            .iter()
            .any(|w| w.code.disarm_on.is_some() && w.place.is_none())
    }
}
