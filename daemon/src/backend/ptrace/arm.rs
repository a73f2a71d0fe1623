//! Arming and disarming through the tracers: the threads parked for a
//! pass (`Unpark`), the free-slot check before any address is written,
//! the program each reservation becomes, and what became of each,
//! reported to the core (which settles it in the ledger).

use std::collections::HashSet;
use std::sync::Arc;

use super::{ProgramResult, PtraceEngine, Shards, SlotProgram, shards, signal_bp};
use crate::backend::ArmReport;
use crate::backend::fanout::fan_out;
use crate::error::WpdError;
use crate::ledger::{Outcome, Reservation};
use crate::model::Tid;
use crate::sched::Boost;
use crate::state::{OpGuard, Watch};

/// Restarts parked threads when dropped (every way out of an arm).
struct Unpark<'a>(&'a Shards, &'a [Tid]);

impl<'a> Unpark<'a> {
    /// Parks `tids` until the guard drops.
    fn park(pt: &'a Shards, tids: &'a [Tid]) -> Self {
        pt.park(tids);
        Unpark(pt, tids)
    }
}

impl Drop for Unpark<'_> {
    fn drop(&mut self) {
        self.0.unpark(self.1);
    }
}

/// The program arming reservation `r` with its piece of `w`.
pub(super) fn program_for(r: &Reservation, w: &Watch) -> SlotProgram {
    let piece = w.spec.range.piece(r.key.piece);
    SlotProgram {
        tid: r.tid,
        slot: r.slot,
        arm: Some(shards::Arm {
            addr: piece.addr,
            len: piece.len,
            access: w.spec.access,
            key: r.key,
        }),
    }
}

impl PtraceEngine {
    /// Programs the reserved slots through the tracers; all or nothing (a
    /// refused arm leaves what it programmed to the core to disarm).
    pub(super) fn arm_pass(
        &self,
        op: &OpGuard<'_>,
        watch: &Arc<Watch>,
        res: &[Reservation],
    ) -> ArmReport {
        let host = match self.host() {
            Ok(h) => h,
            Err(e) => return ArmReport::refused(res, e),
        };
        let ledger = host.ledger();
        let pt = &self.shards;
        let _rt = Boost::enter();
        // A successful address poke makes the kernel reserve a slot until the
        // thread exits or execs, even if the request is then refused. So
        // that a refused request leaves nothing behind, check that every
        // thread has a free slot first (one disabled breakpoint, opened and
        // closed), except where the slot is one the kernel already holds for
        // us. The threads are stopped (parked) for the check: opened on
        // running threads, these breakpoints made the threads' next stops
        // slow to come, and parked they are programmed at once, with no
        // second stop. Many threads are parked even without the check: all
        // stopped before any restarts (see `Shards::detach`).
        //
        // An object's watchpoint with signal stops needs none of this: a
        // slot is a perf breakpoint, opened on each thread where it runs,
        // and one the kernel refuses (ENOSPC) holds nothing (kernel-facts
        // §17). (Others keep the check: a refused request then marks no
        // slot of a thread it never reached as retained.)
        let mode = signal_bp::mode_of(op.pid());
        // With signal stops each slot is a perf breakpoint's fd: they must
        // fit the daemon's budget, leaving the fds kept for connections.
        if mode.is_some()
            && let Err(e) = self.fds.check_for(
                watch.owner,
                "this watchpoint",
                res.len(),
                format!("a breakpoint per thread and piece, {} in all", res.len()),
            )
        {
            return ArmReport::refused(res, e);
        }
        let in_place = watch.object && mode.is_some();
        let mut tids: Vec<Tid> = res.iter().map(|r| r.tid).collect();
        tids.dedup(); // a thread's reservations are adjacent, one per piece
        let _parked = (!in_place && (self.probe.is_some() || tids.len() > 1))
            .then(|| Unpark::park(pt, &tids));
        if !in_place && let Some(probe) = &self.probe {
            // From one thread per CPU, as perf arm passes: each open and
            // close interrupts the CPU the thread last ran on.
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            // Per thread, the slots it needs that the kernel does not hold
            // for us already (a thread's reservations are adjacent).
            let mut groups: Vec<(Tid, usize, &[Reservation])> = Vec::new();
            for chunk in res.chunk_by(|a, b| a.tid == b.tid) {
                let row = ledger.get(chunk[0].tid);
                let fresh = chunk
                    .iter()
                    .filter(|r| {
                        row.as_ref()
                            .is_none_or(|row| row.retained & (1 << r.slot) == 0)
                    })
                    .count();
                if fresh > 0 {
                    groups.push((chunk[0].tid, fresh, chunk));
                }
            }
            let refused: HashSet<Tid> = fan_out(&groups, cpus, |chunk| {
                chunk
                    .iter()
                    .filter(|(tid, fresh, _)| {
                        probe
                            .free_slots(*tid, *fresh)
                            .is_ok_and(|free| free < *fresh)
                    })
                    .map(|(tid, _, _)| *tid)
                    .collect::<Vec<Tid>>()
            })
            .into_iter()
            .flatten()
            .collect();
            if !refused.is_empty() {
                // The probe's ENOSPC is the kernel's: every reservation of
                // a thread without room is refused, nothing is programmed.
                let outcomes = res
                    .iter()
                    .map(|r| match refused.contains(&r.tid) {
                        true => (*r, Outcome::NoSpace),
                        false => (*r, Outcome::NotArmed),
                    })
                    .collect();
                return ArmReport {
                    outcomes,
                    refused: None,
                };
            }
        }
        let items: Vec<SlotProgram> = res.iter().map(|r| program_for(r, watch)).collect();
        let mut failed = None;
        let outcomes = pt
            .program(items, in_place)
            .into_iter()
            .filter_map(|(p, r)| {
                let arm = p.arm?;
                if let ProgramResult::Failed(e) = r {
                    failed = Some(e);
                }
                Some((
                    Reservation {
                        tid: p.tid,
                        slot: p.slot,
                        key: arm.key,
                    },
                    r.outcome(),
                ))
            })
            .collect();
        let refused = failed.map(|e| match mode {
            Some(_) if crate::backend::fds::is_out_of_fds(e) => self.fds.refusal(
                "this watchpoint",
                res.len(),
                format!("a breakpoint per thread and piece, {} in all", res.len()),
                true,
            ),
            Some(_) => WpdError::kernel("perf_event_open(signal stop)", e),
            None => WpdError::kernel("PTRACE_POKEUSER", e),
        });
        // A refused arm leaves what was armed (also on threads born
        // meanwhile) for the core to undo.
        ArmReport { outcomes, refused }
    }

    /// Clears the watchpoint's slot on every thread that has it.
    pub(super) fn disarm_pass(&self, op: &OpGuard<'_>, watch: &Watch) {
        let Ok(host) = self.host() else { return };
        let ledger = host.ledger();
        let tids = match &watch.spec.scope {
            crate::model::Scope::Threads(t) => t.clone(),
            crate::model::Scope::Process | crate::model::Scope::Named(_) => ledger.tids(op.pid()),
        };
        let items: Vec<SlotProgram> = ledger
            .slots_on(&tids, watch.id)
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
        // behind those already restarted (see `Shards::detach`).
        let in_place = watch.object && signal_bp::mode_of(op.pid()).is_some();
        let mut tids: Vec<Tid> = items.iter().map(|p| p.tid).collect();
        tids.dedup(); // one item per piece, a thread's together
        let _parked = (!in_place && tids.len() > 1).then(|| Unpark::park(&self.shards, &tids));
        self.shards.program(items, in_place);
    }
}
