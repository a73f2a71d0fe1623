//! The end of the protocol (reserve → syscall → settle): what became of
//! each reservation once its syscall was made, as a backend reports it
//! ([`Outcome`]), and the one place the ledger turns those reports into
//! committed, foreign or free slots ([`Ledger::settle`], called by the
//! core alone).

use nix::errno::Errno;

use super::{INHERIT_MARGIN_NS, InheritWindow, Ledger, Reservation};
use crate::model::Tid;

/// What became of one reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Armed: the slot is ours. With the syscall's (start, end), kernel
    /// monotonic ns, when the watchpoint is inheritable: a thread created
    /// in between may or may not have inherited it (see `classify`).
    Armed(Option<(u64, u64)>),
    /// The kernel said ENOSPC: someone else holds the slot. The kernel has
    /// the last word: the slot is marked foreign, and an arm is refused.
    NoSpace,
    /// The thread is gone (ESRCH, or no tracer holds it any more).
    Gone,
    /// The kernel refused for another reason.
    Failed(Errno),
    /// Not tried, or undone before the report (the request was refused as
    /// a whole and what it had opened closed): nothing is held.
    NotArmed,
}

impl Outcome {
    /// The outcome of a syscall that failed with `e`.
    pub fn of_errno(e: Errno) -> Outcome {
        match e {
            Errno::ESRCH => Outcome::Gone,
            Errno::ENOSPC => Outcome::NoSpace,
            e => Outcome::Failed(e),
        }
    }
}

impl Ledger {
    /// Settles reservations as their backend reported them: an armed one
    /// is committed (with its inheritance window), one the kernel refused
    /// with ENOSPC is marked foreign, the others are rolled back. Returns
    /// the threads refused with ENOSPC, in report order (for
    /// [`Ledger::conflicts`]). One guard per reservation, none held across
    /// entries.
    pub fn settle(&self, report: &[(Reservation, Outcome)]) -> Vec<Tid> {
        let mut full = Vec::new();
        for &(r, outcome) in report {
            match outcome {
                Outcome::Armed(window) => self.commit_one(r, window),
                Outcome::NoSpace => {
                    self.mark_foreign(r);
                    full.push(r.tid);
                }
                Outcome::Gone | Outcome::Failed(_) | Outcome::NotArmed => self.rollback_one(r),
            }
        }
        full
    }

    /// Turns one reservation into a committed slot; `window`: the
    /// syscall's (start, end) when the watchpoint is inheritable.
    pub(super) fn commit_one(&self, r: Reservation, window: Option<(u64, u64)>) {
        let _t = self.timed();
        if let Some(mut row) = self.threads.get_mut(&r.tid)
            && r.holds(&row)
        {
            let bit = 1 << r.slot;
            row.pending &= !bit;
            row.foreign &= !bit;
            row.ours |= bit;
            if let Some((start, end)) = window {
                row.set_window(
                    r.slot as usize,
                    InheritWindow {
                        absent_before: start,
                        certain_from: end.saturating_add(INHERIT_MARGIN_NS),
                    },
                );
            }
        }
    }

    /// Drops one reservation.
    pub(super) fn rollback_one(&self, r: Reservation) {
        let _t = self.timed();
        if let Some(mut row) = self.threads.get_mut(&r.tid)
            && r.holds(&row)
        {
            let bit = 1 << r.slot;
            row.pending &= !bit;
            row.inheritable &= !bit;
            row.holder[r.slot as usize] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Retained;
    use crate::model::WatchId;

    #[test]
    fn settle_commits_marks_foreign_and_gives_back_as_reported() {
        let l = Ledger::new();
        for t in 1..=5 {
            l.add_thread(1, t);
        }
        let res = l
            .reserve_all(&[1, 2, 3, 4, 5], WatchId(7), 1, true, Retained::Avoid)
            .unwrap();
        let outcomes = [
            Outcome::Armed(Some((1_000, 2_000))),
            Outcome::NoSpace,
            Outcome::Gone,
            Outcome::Failed(Errno::EMFILE),
            Outcome::NotArmed,
        ];
        let report: Vec<_> = res.iter().copied().zip(outcomes).collect();
        assert_eq!(
            l.settle(&report),
            vec![2],
            "the threads refused with ENOSPC"
        );
        let one = l.get(1).unwrap();
        assert_eq!((one.ours, one.pending, one.inheritable), (1, 0, 1));
        assert_eq!(one.window(0).absent_before, 1_000);
        assert_eq!(one.window(0).certain_from, 2_000 + INHERIT_MARGIN_NS);
        let two = l.get(2).unwrap();
        assert_eq!((two.ours, two.pending, two.foreign), (0, 0, 1));
        for t in 3..=5 {
            let row = l.get(t).unwrap();
            assert_eq!(
                (
                    row.ours,
                    row.pending,
                    row.foreign,
                    row.inheritable,
                    row.holder[0]
                ),
                (0, 0, 0, 0, 0),
                "thread {t} holds nothing"
            );
        }
        // Settled twice (a report repeated): nothing changes.
        let before: Vec<_> = (1..=5).map(|t| l.get(t)).collect();
        assert_eq!(l.settle(&report), vec![2]);
        assert_eq!((1..=5).map(|t| l.get(t)).collect::<Vec<_>>(), before);
    }

    #[test]
    fn errnos_map_to_outcomes() {
        assert_eq!(Outcome::of_errno(Errno::ESRCH), Outcome::Gone);
        assert_eq!(Outcome::of_errno(Errno::ENOSPC), Outcome::NoSpace);
        assert_eq!(
            Outcome::of_errno(Errno::EINVAL),
            Outcome::Failed(Errno::EINVAL)
        );
    }
}
