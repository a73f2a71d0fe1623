//! A thread stopped at a code event's probe: what its tracer thread arms,
//! disarms or reports there, and what it hands to the objects thread.

use std::sync::atomic::Ordering;

use super::pending::RT_CONSISTENT;
use super::worker::Msg;
use super::{ObjectWatch, bump, live_bound, live_remove_if};
use crate::backend::{CodeRecord, StopArmer};
use crate::engine::Core;
use crate::error::WpdError;
use crate::model::{Pid, Tid, WatchId};
use crate::state::OpGuard;

impl Core {
    /// A thread is stopped at probes: whether to hold it (the objects
    /// thread resumes it; a code breakpoint's stop lasts until a Resume),
    /// and the process's other threads with it. Called on the tracer thread
    /// that holds it: what can be armed or disarmed there is done there
    /// (see [`Core::arm_at_stop`]); the rest goes to the objects thread.
    pub(in crate::engine) fn code_event_seen(
        &self,
        pid: Pid,
        tid: Tid,
        records: &[CodeRecord],
        armer: &mut dyn StopArmer,
    ) -> crate::backend::CodeHold {
        use crate::backend::CodeHold;
        let at = std::time::Instant::now();
        let tx = self.objects.tx.lock().unwrap().clone();
        let Some(tx) = tx else {
            return CodeHold::Run;
        };
        let mut hold = false;
        let mut stop = false;
        let mut stop_all = false;
        for r in records {
            let id = WatchId(r.key >> 1);
            let hook = self.objects.hooks.get(&pid).map(|h| *h);
            if let Some(hook) = hook
                && hook.id == id
            {
                // The loader is about to change its list of objects (read
                // here, at the stop: nothing new is mapped yet), or has
                // changed it: then the thread waits while the pending
                // events are looked for.
                let before_change = hook.r_state.is_some_and(|at| {
                    crate::procfs::read_memory(pid, tid, at, 4).is_ok_and(|b| {
                        b.len() == 4
                            && u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) != RT_CONSISTENT
                    })
                });
                if !before_change {
                    hold |= tx.send(Msg::Loaded(pid, tid)).is_ok();
                }
                continue;
            }
            let Some(w) = self.objects.watches.get(&id).map(|w| w.clone()) else {
                continue;
            };
            if w.spec.pid != pid {
                continue;
            }
            if let Some(place) = &w.place {
                // A code breakpoint: held until a Resume, if its hit count
                // says so.
                let count = w.hits.fetch_add(1, Ordering::Relaxed) + 1;
                let (ignore, every) = (w.code.ignore, w.code.every);
                if count <= ignore || (every > 1 && (count - ignore) % every != 0) {
                    continue;
                }
                let owner = self.procs.get(&pid).map(|p| p.owner.clone());
                let ev = self.bus.publish_kept(
                    crate::events::EventKind::BreakpointHit {
                        id,
                        pid,
                        tid,
                        place: place.clone(),
                        count,
                    },
                    owner,
                );
                w.reported.fetch_add(1, Ordering::Relaxed);
                let keep = w.spec.keep_recent as usize;
                let mut recent = w.recent.lock().unwrap();
                while keep > 0 && recent.len() >= keep {
                    recent.pop_front();
                }
                if keep > 0 {
                    recent.push_back(ev);
                }
                stop = true;
                stop_all |= w.spec.action == crate::model::HitAction::StopAll;
                continue;
            }
            if r.key & 1 == 1 {
                // A call of the disarming function: ours only if its first
                // argument is a live object's base.
                let base = r.args[0];
                if !w.live.lock().unwrap().contains_key(&base) {
                    continue;
                }
                // Once one record waits for the objects thread, those after
                // it wait too: they are done in order.
                if hold || !self.disarm_at_stop(&w, base, armer) {
                    hold |= tx.send(Msg::Disarm(id, pid, tid, base)).is_ok();
                }
                continue;
            }
            let bound = live_bound(&w.code);
            if bound > 0 && w.live.lock().unwrap().len() >= bound as usize {
                bump(&w, &self.objects.totals, |c| &c.over_limit);
                // Counted (ObjectCounts.over_limit); at a high rate, by design.
                tracing::debug!(
                    id = id.0,
                    pid,
                    tid,
                    max_live = bound,
                    "object not armed: max_live objects are live"
                );
                continue;
            }
            if !hold && self.arm_at_stop(&w, r, armer) {
                let ns = at.elapsed().as_nanos() as u64;
                w.counts.held_ns.fetch_add(ns, Ordering::Relaxed);
                self.objects.totals.held_ns.fetch_add(ns, Ordering::Relaxed);
                continue;
            }
            hold |= tx.send(Msg::Arm(id, *r, at)).is_ok();
        }
        match (hold || stop, stop_all) {
            (_, true) => CodeHold::HoldAll,
            (true, false) => CodeHold::Hold,
            (false, false) => CodeHold::Run,
        }
    }

    /// Arms the object of record `r` from the tracer thread holding its
    /// thread, if that thread can do it all: the process's operation lock
    /// free, the expression read no memory, every thread to arm reachable
    /// from that tracer (`armer.reaches`: with signal stops, any tracer's
    /// thread past its birth). The ledger is used as by any arm (all
    /// or nothing: the slots reserved on every thread, armed, committed,
    /// or every one undone), without a park or a free-slot probe: the
    /// tracer opens each breakpoint, and a refusal (`ENOSPC`) leaves no
    /// slot behind. False: nothing was done, the objects thread does it.
    fn arm_at_stop(&self, w: &ObjectWatch, r: &CodeRecord, armer: &mut dyn StopArmer) -> bool {
        let totals = &self.objects.totals;
        let pid = w.spec.pid;
        let Some((offset, size)) = w.linear else {
            return false;
        };
        let base = match w.root {
            crate::symbols::code::Root::Ret => r.ret,
            crate::symbols::code::Root::Arg(i) => r.args[i],
        };
        let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
            return false;
        };
        let Some(op) = proc.try_lock_op() else {
            return false;
        };
        if proc.is_gone() {
            return false;
        }
        let tids: Vec<Tid> = if w.code.creator_only {
            vec![r.tid]
        } else {
            let mut t = self.ledger.tids(pid);
            t.sort_unstable();
            t
        };
        if !tids.iter().all(|&t| armer.reaches(t)) {
            return false;
        }
        // The same base again (freed without the disarming function, and
        // handed out anew): the old object's watchpoint goes first.
        let old = w.live.lock().unwrap().get(&base).copied();
        if let Some(old) = old {
            if !self.drop_at_stop(&op, old, armer) {
                return false;
            }
            w.live.lock().unwrap().remove(&base);
            self.disarm_filter(pid, w.id, base, None);
        }
        if base == 0 {
            bump(w, totals, |c| &c.failed);
            tracing::warn!(
                id = w.id.0,
                pid,
                tid = r.tid,
                "object not armed: {} is a null pointer",
                w.code.expr
            );
            return true;
        }
        let address = base.wrapping_add(offset);
        let len = u32::try_from(size).unwrap_or(u32::MAX);
        let range = match crate::arch::validate(address, len, w.spec.access) {
            Ok(r) => r,
            Err(e) => {
                bump(w, totals, |c| &c.failed);
                tracing::warn!(id = w.id.0, pid, tid = r.tid, "object not armed: {e}");
                return true;
            }
        };
        let Ok(backend) = self.backends.get(Some(proc.backend)) else {
            return false;
        };
        let retained = backend.retained();
        let spec = super::object_spec(w, range, r.tid);
        let id = WatchId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let watch = super::super::watch::new_watch(id, spec, proc.backend, w.owner, None, true);
        if watch.spec.only_on_change {
            *watch.last_value.lock().unwrap() = crate::procfs::read_memory(
                pid,
                r.tid,
                watch.spec.range.addr,
                watch.spec.range.len as usize,
            )
            .ok();
        }
        // Registered first, as any arm: a thread born from here on gets it
        // at birth (its first stop, handled by this same tracer).
        self.watches.insert(id, watch.clone());
        proc.watches.lock().unwrap().insert(id);
        let unregister = || {
            self.watches.remove(&id);
            proc.watches.lock().unwrap().remove(&id);
        };
        let res = match self.ledger.reserve_all(
            &tids,
            id,
            watch.spec.range.slots() as u8,
            watch.process_wide,
            retained,
        ) {
            Ok(res) => res,
            Err(conflicts) => {
                unregister();
                bump(w, totals, |c| &c.no_slot);
                let e = WpdError::OutOfSlots {
                    pid,
                    needed: watch.spec.range.slots(),
                    conflicts,
                };
                tracing::warn!(id = w.id.0, pid, tid = r.tid, "object not armed: {e}");
                return true;
            }
        };
        // Its addresses may still be muted from an object freed there.
        self.unmute(&watch);
        let report = armer.arm(&watch, &res);
        let full = self.settle_at_stop(&res, &report);
        let failed = crate::engine::slots::failed(&report);
        if full.is_empty() && failed.is_none() {
            bump(w, totals, |c| &c.armed);
            bump(w, totals, |c| &c.armed_at_stop);
            w.live.lock().unwrap().insert(base, id);
            if !self.disarm_filter(pid, w.id, base, Some(&watch))
                && self.drop_at_stop(&op, id, armer)
            {
                w.live.lock().unwrap().remove(&base);
                bump(w, totals, |c| &c.failed);
            }
            return true;
        }
        // All or nothing: what was armed is cleared, every slot released.
        unregister();
        armer.clear(&self.ledger.slots_on(&tids, id));
        self.release_slots(&watch, retained);
        let e = match failed {
            Some(e) => {
                bump(w, totals, |c| &c.failed);
                WpdError::kernel("perf_event_open(signal stop)", e)
            }
            None => {
                bump(w, totals, |c| &c.no_slot);
                WpdError::OutOfSlots {
                    pid,
                    needed: watch.spec.range.slots(),
                    conflicts: self.ledger.conflicts(full),
                }
            }
        };
        tracing::warn!(id = w.id.0, pid, tid = r.tid, "object not armed: {e}");
        true
    }

    /// Removes the watchpoint of the live object `base` from the tracer
    /// thread holding the thread that frees it, if that tracer reaches
    /// every thread holding it (see [`Core::arm_at_stop`]). False: nothing
    /// was done.
    fn disarm_at_stop(&self, w: &ObjectWatch, base: u64, armer: &mut dyn StopArmer) -> bool {
        let pid = w.spec.pid;
        let Some(child) = w.live.lock().unwrap().get(&base).copied() else {
            return true;
        };
        let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
            return false;
        };
        let Some(op) = proc.try_lock_op() else {
            return false;
        };
        if !self.drop_at_stop(&op, child, armer) {
            return false;
        }
        if w.live.lock().unwrap().remove(&base).is_some() {
            self.disarm_filter(pid, w.id, base, None);
            bump(w, &self.objects.totals, |c| &c.disarmed);
            bump(w, &self.objects.totals, |c| &c.disarmed_at_stop);
        }
        true
    }

    /// Takes watchpoint `id` off the locked process through `armer`
    /// (cleared, slots released), if it reaches every thread holding it;
    /// false (nothing done) if not. An object's watchpoint comes and goes
    /// with its object: counted (`ObjectCounts`), never an event.
    fn drop_at_stop(&self, op: &OpGuard<'_>, id: WatchId, armer: &mut dyn StopArmer) -> bool {
        let Some(w) = self.watches.get(&id).map(|w| w.clone()) else {
            return true; // gone already
        };
        let Ok(backend) = self.backends.get(Some(w.backend)) else {
            return false;
        };
        let slots = self.ledger.slots_on(&self.watch_tids(&w), id);
        if !slots.iter().all(|&(t, _)| armer.reaches(t)) {
            return false;
        }
        self.watches.remove(&id);
        let proc = op.process();
        proc.watches.lock().unwrap().remove(&id);
        armer.clear(&slots);
        self.release_slots(&w, backend.retained());
        true
    }

    /// Objects freed without a stop (see [`crate::backend::Host::objects_freed`]):
    /// each object's watchpoint stops reporting at once, and is removed
    /// through `armer` where it reaches the watchpoint's threads, else by
    /// the objects thread. A record whose object is no longer its base's
    /// live one (removed already, the base handed out anew) changes
    /// nothing.
    pub(in crate::engine) fn objects_freed_seen(
        &self,
        records: &[CodeRecord],
        mut armer: Option<&mut dyn StopArmer>,
    ) {
        let tx = self.objects.tx.lock().unwrap().clone();
        for r in records.iter().filter(|r| r.freed) {
            let id = WatchId(r.key >> 1);
            let Some(w) = self.objects.watches.get(&id).map(|w| w.clone()) else {
                continue;
            };
            let (base, child) = (r.args[0], WatchId(r.ret));
            if w.spec.pid != r.pid || w.live.lock().unwrap().get(&base) != Some(&child) {
                continue;
            }
            if let Some(cw) = self.watches.get(&child) {
                cw.freed.store(true, Ordering::Relaxed);
            }
            bump(&w, &self.objects.totals, |c| &c.freed_without_stop);
            let done = armer
                .as_deref_mut()
                .is_some_and(|a| self.freed_at_stop(&w, base, child, a));
            if !done && let Some(tx) = &tx {
                let _ = tx.send(Msg::Freed(id, base, child));
            }
        }
    }

    /// Removes the freed object `child` of base `base` from a tracer thread
    /// at a stop, if it reaches every thread holding it; false: nothing
    /// was done.
    fn freed_at_stop(
        &self,
        w: &ObjectWatch,
        base: u64,
        child: WatchId,
        armer: &mut dyn StopArmer,
    ) -> bool {
        let Some(proc) = self.procs.get(&w.spec.pid).map(|p| p.clone()) else {
            return false;
        };
        let Some(op) = proc.try_lock_op() else {
            return false;
        };
        if w.live.lock().unwrap().get(&base) != Some(&child) {
            return true; // taken off meanwhile
        }
        let cw = self.watches.get(&child).map(|c| c.clone());
        if !self.drop_at_stop(&op, child, armer) {
            return false;
        }
        if let Some(cw) = cw {
            self.unmute(&cw);
        }
        if live_remove_if(w, base, child) {
            bump(w, &self.objects.totals, |c| &c.disarmed);
            bump(w, &self.objects.totals, |c| &c.disarmed_at_stop);
        }
        true
    }
}
