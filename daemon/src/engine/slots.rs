//! The ledger's protocol on the core's side, in one place: the core
//! reserves (all or nothing for a process-wide watchpoint), the backend
//! makes the syscalls and reports what became of each reservation
//! ([`crate::ledger::Outcome`]), and the core settles the report: armed
//! slots committed, the kernel's ENOSPC marked foreign and final, the rest
//! given back. Backends never commit or roll back; those arming a thread
//! on their own (a new thread, one that did not inherit) reserve and
//! report through [`Host::reserve_thread`] and [`Host::settle`].
//!
//! [`Host::reserve_thread`]: crate::backend::Host::reserve_thread
//! [`Host::settle`]: crate::backend::Host::settle

use std::sync::Arc;

use nix::errno::Errno;

use super::Core;
use crate::backend::{ArmReport, Backend};
use crate::error::WpdError;
use crate::ledger::{Outcome, Reservation};
use crate::state::{OpGuard, Watch};

impl Core {
    /// Arms `watch`'s reservations `res` through `backend` and settles the
    /// report in the ledger. On success a process-wide watchpoint is
    /// reconciled (threads born while it was armed that did not inherit
    /// it get it). On failure what stayed armed is committed: the caller
    /// disarms it and releases its slots (with those threads born
    /// meanwhile took).
    pub(super) fn arm_reserved(
        &self,
        op: &OpGuard<'_>,
        backend: &Arc<dyn Backend>,
        watch: &Arc<Watch>,
        res: &[Reservation],
    ) -> Result<(), WpdError> {
        let report = backend.arm(op, watch, res);
        self.settle_arm(watch, res, report)?;
        if watch.process_wide {
            backend.reconcile(op);
        }
        Ok(())
    }

    /// Settles an arm's report of `watch`'s reservations `res`: the
    /// refusal, if it was refused (one other than ENOSPC first, else the
    /// kernel's ENOSPC naming every thread it refused).
    pub(super) fn settle_arm(
        &self,
        watch: &Watch,
        res: &[Reservation],
        report: ArmReport,
    ) -> Result<(), WpdError> {
        let full = self.ledger.settle(&report.outcomes);
        if report.outcomes.len() != res.len() {
            // A reservation the backend did not report (a tracer thread
            // that died with the request): given back. Those settled are
            // left alone (a rollback drops only a pending reservation).
            tracing::warn!(
                id = watch.id.0,
                reported = report.outcomes.len(),
                reserved = res.len(),
                "an arm did not report every reservation"
            );
            self.ledger.rollback(res);
        }
        if let Some(e) = report.refused {
            return Err(e);
        }
        if let Some(e) = failed(&report.outcomes) {
            return Err(WpdError::kernel("arming a breakpoint", e));
        }
        if full.is_empty() {
            return Ok(());
        }
        Err(WpdError::OutOfSlots {
            pid: watch.spec.pid,
            needed: watch.spec.range.slots(),
            conflicts: self.ledger.conflicts(full),
        })
    }

    /// Settles what a tracer reported of the reservations `res` it armed
    /// at a stop ([`crate::backend::StopArmer::arm`]); returns the threads
    /// the kernel refused with ENOSPC. What stayed armed is committed (the
    /// caller clears it and releases its slots if the arm is refused).
    pub(super) fn settle_at_stop(
        &self,
        res: &[Reservation],
        report: &[(Reservation, Outcome)],
    ) -> Vec<crate::model::Tid> {
        let full = self.ledger.settle(report);
        if report.len() != res.len() {
            self.ledger.rollback(res);
        }
        full
    }

    /// [`crate::backend::Host::reserve_thread`]: the slots of `w`'s pieces
    /// that thread `tid` lacks, all or none.
    pub(super) fn reserve_thread_slots(
        &self,
        tid: crate::model::Tid,
        w: &Watch,
        inheritable: bool,
        retained: crate::ledger::Retained,
        out: &mut Vec<Reservation>,
    ) -> Result<(), crate::error::SlotConflict> {
        let pieces = w.spec.range.slots() as u8;
        self.ledger
            .reserve(tid, w.id, pieces, inheritable, retained, out)
    }

    /// [`crate::backend::Host::settle`]: a backend's report of a thread it
    /// armed on its own. Each reservation stands alone (a new thread keeps
    /// the pieces it got).
    pub(super) fn settle_thread(&self, report: &[(Reservation, Outcome)]) {
        self.ledger.settle(report);
    }
}

/// The last errno other than ENOSPC a report names.
pub(super) fn failed(outcomes: &[(Reservation, Outcome)]) -> Option<Errno> {
    outcomes.iter().rev().find_map(|(_, o)| match o {
        Outcome::Failed(e) => Some(*e),
        _ => None,
    })
}
