//! What the tracer threads report into the backend ([`TraceSink`]): a new
//! thread armed at its first stop (its slots reserved and what became of
//! them settled through the host), a thread's exit, a hit (read, judged
//! and published while the thread is stopped), a code event and freed
//! objects, an exec.

use super::arm::program_for;
use super::code;
use super::{HitVerdict, ProgramResult, PtraceEngine, SlotProgram, TraceSink};
use crate::backend::{CodeHold, CodeRecord, Host, StopArmer};
use crate::events::{EventKind, HitEvent};
use crate::ledger::{Outcome, Reservation, Retained};
use crate::model::{BackendKind, HitAction, Pid, SlotKey, Tid};
use crate::procfs;

impl PtraceEngine {
    /// Fault injection for the crash tests (`faults_ptrace_death.rs`): with
    /// `panic_at_hit` N, the tracer thread panics at its Nth hit.
    fn fault_panic_at_hit(&self) {
        use std::sync::atomic::Ordering;
        let at = self.panic_at_hit;
        if at != 0 && self.hits_seen.fetch_add(1, Ordering::Relaxed) + 1 == at {
            panic!("WPD_FAULT_PANIC_AT_HIT: tracer thread panics at hit {at}");
        }
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
                Ok(()) => out.extend(res.iter().map(|r| program_for(r, &w))),
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

    fn hit(
        &self,
        pid: Pid,
        tid: Tid,
        regs: Option<&libc::user_regs_struct>,
        keys: &[SlotKey],
    ) -> HitVerdict {
        self.fault_panic_at_hit();
        let ip = regs.map_or(0, |r| crate::arch::current::UserRegs::from(r).ip);
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
            let value = self.stores.hit_value(&*host, pid, tid, regs, piece);
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
                depth => match call_chain(&*host, pid, tid, regs, usize::from(depth)) {
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
        records: &[CodeRecord],
        armer: &mut dyn StopArmer,
    ) -> bool {
        let hold = self
            .host
            .upgrade()
            .map_or(CodeHold::Run, |h| h.code_event(pid, tid, records, armer));
        if hold == CodeHold::HoldAll {
            self.shards.hold_all(pid, tid);
        }
        hold != CodeHold::Run
    }

    fn objects_freed(&self, records: &[CodeRecord], armer: &mut dyn StopArmer) {
        if let Some(h) = self.host.upgrade() {
            h.objects_freed(records, Some(armer));
        }
    }

    fn exec(&self, pid: Pid, _tid: Tid) {
        self.stores.forget(pid);
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
    regs: Option<&libc::user_regs_struct>,
    depth: usize,
) -> (Vec<u64>, Option<&'static str>) {
    let Some(regs) = regs else {
        return (Vec::new(), Some("the thread's registers could not be read"));
    };
    let regs = crate::arch::current::UserRegs::from(regs);
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
