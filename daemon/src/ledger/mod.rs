//! The slot ledger: concurrent hashed accounting of every tracked thread's
//! debug-register slots.
//!
//! Locking rules:
//! 1. Per-thread state lives in `threads`, a sharded `DashMap` keyed by tid:
//!    lookup is O(1) average and only the tid's shard is locked.
//! 2. `procs` maps a pid to the (sharded) set of its tids, so process-wide
//!    operations visit only that process's threads. Lock order: a `threads`
//!    guard may be held while taking a `procs` guard (a row is indexed and
//!    unindexed under its own guard, so readers see both or neither; the
//!    tid set's shard is taken under the `procs` guard) or a `retained`
//!    guard (`add_thread`); a `procs` or `retained` guard is never held
//!    while taking another, so there is no lock-order cycle.
//! 3. No guard is held across a syscall or an `.await`: the core reserves,
//!    a backend makes the syscalls and reports what became of each
//!    reservation ([`Outcome`]), and the core settles the report
//!    ([`Ledger::settle`]: committed, marked foreign, or rolled back).
//! 4. One guard in [`HOLD_SAMPLE`] has its hold time recorded in `hold` (a
//!    lock-free histogram), per OS thread.
//!
//! Slots are a 4-bit occupancy bitmap per thread; a watchpoint whose range
//! takes several slots holds one per piece, each slot naming its
//! [`SlotKey`] (watchpoint and piece). The slot policy (`reserve`, the one
//! place it is written): a slot that is neither
//! ours, nor pending, nor uncertain (inheritance not known yet), nor foreign
//! is free; slots the kernel retains for us are reused first or never,
//! as the backend says ([`Retained`]); when only foreign-marked slots
//! remain, one of them is tried (the kernel has the last word). The first
//! candidate is found with `trailing_zeros`.
//!
//! Rooms: `row.rs` (a thread's row, the slot classification), `inherit.rs`
//! (inheritance windows), `settle.rs` (what became of a reservation, and
//! settling it), `hold.rs` (guard hold times).

mod hold;
mod inherit;
mod row;
mod settle;

use std::sync::atomic::Ordering;

use dashmap::{DashMap, DashSet};

use crate::arch::current::SLOTS;
use crate::error::SlotConflict;
use crate::model::{Pid, SlotKey, Tid, WatchId};
pub use hold::{HOLD_SAMPLE, HoldHistogram};
pub use inherit::{INHERIT_MARGIN_NS, Inheritance, classify};
pub use row::{InheritWindow, Reservation, Retained, SlotState, ThreadSlots};
pub use settle::Outcome;

const ALL: u8 = (1 << SLOTS) - 1;

/// Hashing of the ledger's keys. Tids and pids are small integers the
/// kernel hands out, not attacker-chosen strings: a fast, randomly seeded
/// hash instead of SipHash halves the cost of a lookup.
type Hash = foldhash::fast::RandomState;

/// The ledger.
#[derive(Debug, Default)]
pub struct Ledger {
    threads: DashMap<Tid, ThreadSlots, Hash>,
    procs: DashMap<Pid, DashSet<Tid, Hash>, Hash>,
    /// Retained slots of threads we no longer track (after a ptrace
    /// detach), restored if the thread is tracked again.
    retained: DashMap<Tid, (Pid, u8), Hash>,
    /// Entries in `retained`: usually none, and then the thread add and
    /// remove paths skip its lookups.
    retained_n: std::sync::atomic::AtomicUsize,
    hold: HoldHistogram,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    fn timed(&self) -> hold::Timed<'_> {
        self.hold.timed()
    }

    /// Lock hold-time summary (p50, p99, max), ns.
    pub fn hold_summary(&self) -> (u64, u64, u64) {
        self.hold.summary()
    }

    /// Starts tracking `tid` of `pid` with no slots known. Returns false if
    /// it was already tracked (nothing changes then).
    pub fn add_thread(&self, pid: Pid, tid: Tid) -> bool {
        let _t = self.timed();
        match self.threads.entry(tid) {
            dashmap::Entry::Occupied(_) => false,
            dashmap::Entry::Vacant(v) => {
                let mut row = ThreadSlots::new(pid, 0);
                if self.retained_n.load(Ordering::Acquire) > 0
                    && let Some((p, bits)) = self.retained.get(&tid).map(|r| *r)
                    && p == pid
                {
                    row.retained = bits;
                }
                // Indexed while the row's guard is held, so that a
                // concurrent remove_thread sees both or neither.
                let guard = v.insert(row);
                self.index_insert(pid, tid);
                drop(guard);
                true
            }
        }
    }

    /// Records who created `tid` (ptrace learns it at clone).
    pub fn set_parent(&self, tid: Tid, parent: Tid) {
        let _t = self.timed();
        if let Some(mut row) = self.threads.get_mut(&tid) {
            row.parent = parent;
        }
    }

    /// A thread was created at `time` by `parent`: it starts with the
    /// parent's inheritable watchpoints, classified by time against when each
    /// was armed on the parent. Returns the new row, or None if `tid` was
    /// already tracked or the parent is unknown.
    pub fn on_fork(&self, pid: Pid, parent: Tid, tid: Tid, time: u64) -> Option<ThreadSlots> {
        let parent_row = {
            let _t = self.timed();
            self.threads.get(&parent).map(|r| r.clone())
        };
        let mut row = ThreadSlots::new(pid, parent);
        row.set_born(time);
        if let Some(p) = parent_row {
            for s in 0..SLOTS {
                let bit = 1 << s;
                if (p.inheritable & (p.ours | p.pending | p.uncertain)) & bit == 0 {
                    continue;
                }
                let verdict = if p.ours & bit == 0 {
                    // Being armed on the parent right now, or itself unknown.
                    Inheritance::Unknown
                } else {
                    {
                        let w = p.window(s);
                        classify(time, w.absent_before, w.certain_from)
                    }
                };
                match verdict {
                    Inheritance::Inherited => {
                        row.holder[s] = p.holder[s];
                        row.ours |= bit;
                        row.inheritable |= bit;
                        row.set_window(
                            s,
                            InheritWindow {
                                absent_before: time,
                                certain_from: time,
                            },
                        );
                    }
                    Inheritance::Missing => {}
                    Inheritance::Unknown => {
                        // Inheritable too: if it did inherit, so do the
                        // threads this one creates.
                        row.holder[s] = p.holder[s];
                        row.uncertain |= bit;
                        row.inheritable |= bit;
                    }
                }
            }
        }
        let inserted = {
            let _t = self.timed();
            match self.threads.entry(tid) {
                dashmap::Entry::Occupied(_) => false,
                dashmap::Entry::Vacant(v) => {
                    let guard = v.insert(row.clone());
                    self.index_insert(pid, tid);
                    drop(guard);
                    true
                }
            }
        };
        inserted.then_some(row)
    }

    /// Forgets a thread (it exited). Returns its last row.
    pub fn remove_thread(&self, tid: Tid) -> Option<ThreadSlots> {
        let row = {
            let _t = self.timed();
            match self.threads.entry(tid) {
                dashmap::Entry::Vacant(_) => None,
                dashmap::Entry::Occupied(o) => {
                    // Unindexed under the row's guard (see add_thread).
                    if let Some(set) = self.procs.get(&o.get().pid) {
                        set.remove(&tid);
                    }
                    Some(o.remove())
                }
            }
        }?;
        if self.retained_n.load(Ordering::Acquire) > 0 && self.retained.remove(&tid).is_some() {
            self.retained_n.fetch_sub(1, Ordering::AcqRel);
        }
        Some(row)
    }

    /// Adds `tid` to its process's index. The pid's shard is only
    /// read-locked (shared) unless the process is new; the set itself is
    /// sharded, so threads of one process do not serialise here.
    fn index_insert(&self, pid: Pid, tid: Tid) {
        let _t = self.timed();
        if let Some(set) = self.procs.get(&pid) {
            set.insert(tid);
            return;
        }
        self.procs.entry(pid).or_default().insert(tid);
    }

    /// Forgets a whole process. Returns how many threads it had.
    pub fn remove_process(&self, pid: Pid) -> usize {
        let tids = {
            let _t = self.timed();
            self.procs.remove(&pid).map(|(_, s)| s).unwrap_or_default()
        };
        let tids: Vec<Tid> = tids.iter().map(|t| *t).collect();
        for tid in &tids {
            let _t = self.timed();
            if let Some((_, row)) = self.threads.remove_if(tid, |_, r| r.pid == pid)
                && row.retained != 0
                && self.retained.insert(*tid, (pid, row.retained)).is_none()
            {
                self.retained_n.fetch_add(1, Ordering::AcqRel);
            }
        }
        tids.len()
    }

    /// Drops the retained-slot records of threads that no longer exist
    /// (`alive(pid, tid)` is false): the kernel freed those slots with the
    /// thread. Returns how many were dropped.
    pub fn prune_retained(&self, alive: impl Fn(Pid, Tid) -> bool) -> usize {
        // Checked outside the shard locks (`alive` may make syscalls).
        if self.retained_n.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let all: Vec<(Tid, Pid)> = self.retained.iter().map(|e| (*e.key(), e.0)).collect();
        let dropped = all
            .into_iter()
            .filter(|&(tid, pid)| !alive(pid, tid))
            .filter(|&(tid, pid)| self.retained.remove_if(&tid, |_, r| r.0 == pid).is_some())
            .count();
        self.retained_n.fetch_sub(dropped, Ordering::AcqRel);
        dropped
    }

    /// True if the thread table holds far more room than threads (a large
    /// process went away): worth a [`Ledger::shrink_to_fit`].
    pub fn mostly_empty(&self) -> bool {
        self.threads.capacity() > 4 * self.threads.len() + 1024
    }

    /// Gives back the tables' spare capacity (after a large process went
    /// away). Takes every shard's lock in turn: not for hot paths.
    pub fn shrink_to_fit(&self) {
        self.threads.shrink_to_fit();
        self.procs.shrink_to_fit();
        self.retained.shrink_to_fit();
    }

    /// Tids of a process (unordered snapshot).
    pub fn tids(&self, pid: Pid) -> Vec<Tid> {
        let _t = self.timed();
        self.procs
            .get(&pid)
            .map(|s| s.iter().map(|t| *t).collect())
            .unwrap_or_default()
    }

    /// Number of tracked threads of a process.
    pub fn thread_count(&self, pid: Pid) -> usize {
        let _t = self.timed();
        self.procs.get(&pid).map(|s| s.len()).unwrap_or(0)
    }

    /// Total tracked threads.
    pub fn total_threads(&self) -> usize {
        self.threads.len()
    }

    /// A copy of one thread's row.
    pub fn get(&self, tid: Tid) -> Option<ThreadSlots> {
        let _t = self.timed();
        self.threads.get(&tid).map(|r| r.clone())
    }

    /// Reserves `pieces` slots for `id` (one per piece) on every thread in
    /// `tids`, all or nothing. Threads no longer tracked are skipped (they
    /// exited). On failure nothing stays reserved and the conflicts name
    /// every thread without enough free slots.
    pub fn reserve_all(
        &self,
        tids: &[Tid],
        id: WatchId,
        pieces: u8,
        inheritable: bool,
        retained: Retained,
    ) -> Result<Vec<Reservation>, Vec<SlotConflict>> {
        let mut got = Vec::with_capacity(tids.len() * usize::from(pieces));
        let mut conflicts = Vec::new();
        for &tid in tids {
            if let Err(c) = self.reserve(tid, id, pieces, inheritable, retained, &mut got) {
                conflicts.push(c);
            }
        }
        if conflicts.is_empty() {
            Ok(got)
        } else {
            self.rollback(&got);
            conflicts.sort_by_key(|c| c.tid);
            Err(conflicts)
        }
    }

    /// Reserves a slot for each of the `pieces` pieces of `id` that `tid`
    /// does not hold yet (all of them, or none: a thread born while arming
    /// may hold some already), appending the reservations to `out`. Nothing
    /// is reserved if the thread is not tracked (it exited); the conflict if
    /// it has fewer free slots than missing pieces. One guard for the whole
    /// row; no allocation beyond `out`'s.
    pub fn reserve(
        &self,
        tid: Tid,
        id: WatchId,
        pieces: u8,
        inheritable: bool,
        retained: Retained,
        out: &mut Vec<Reservation>,
    ) -> Result<(), SlotConflict> {
        let _t = self.timed();
        let Some(mut row) = self.threads.get_mut(&tid) else {
            return Ok(());
        };
        let mut missing = [0u8; SLOTS];
        let mut n = 0;
        for p in 0..pieces {
            if row.slot_of(SlotKey::new(id, p)).is_none() {
                missing[n] = p;
                n += 1;
            }
        }
        if n == 0 {
            return Ok(());
        }
        let busy = row.ours | row.pending | row.uncertain;
        let plain = match retained {
            Retained::Reuse => !(busy | row.foreign) & ALL,
            Retained::Avoid => !(busy | row.foreign | row.retained) & ALL,
        };
        // Slots marked foreign may have been freed since: when the others do
        // not suffice, the kernel decides (reserve → syscall → settle).
        let mut tried = row.foreign & !busy & ALL;
        if retained == Retained::Avoid {
            tried &= !row.retained;
        }
        if ((plain | tried).count_ones() as usize) < n {
            return Err(SlotConflict {
                tid,
                holders: row.holders(),
            });
        }
        // Order of preference: slots the kernel already holds for us (ptrace
        // only), then free ones, then foreign-marked ones.
        let reuse = match retained {
            Retained::Reuse => row.retained & plain,
            Retained::Avoid => 0,
        };
        let mut order = [reuse, plain & !reuse, tried];
        for &p in &missing[..n] {
            let from = order.iter_mut().find(|m| **m != 0).expect("counted above");
            let slot = from.trailing_zeros() as u8;
            *from &= !(1 << slot);
            row.pending |= 1 << slot;
            row.holder[slot as usize] = SlotKey::new(id, p).pack();
            if inheritable {
                row.inheritable |= 1 << slot;
            }
            out.push(Reservation {
                tid,
                slot,
                key: SlotKey::new(id, p),
            });
        }
        Ok(())
    }

    /// [`Ledger::reserve`] for a watchpoint of one slot: `None` if the
    /// thread is not tracked or already holds it.
    pub fn reserve_one(
        &self,
        tid: Tid,
        id: WatchId,
        inheritable: bool,
        retained: Retained,
    ) -> Result<Option<Reservation>, SlotConflict> {
        let mut out = Vec::new();
        self.reserve(tid, id, 1, inheritable, retained, &mut out)?;
        Ok(out.pop())
    }

    /// Turns reservations into committed slots. `times[i]` is the
    /// (syscall start, syscall end) of reservation `i`, when the watchpoint is
    /// inheritable. (The core settles what a backend reports with
    /// [`Ledger::settle`].)
    pub fn commit(&self, res: &[Reservation], inheritable: Option<&[(u64, u64)]>) {
        for (i, &r) in res.iter().enumerate() {
            self.commit_one(r, inheritable.map(|times| times[i]));
        }
    }

    /// Drops reservations.
    pub fn rollback(&self, res: &[Reservation]) {
        for &r in res {
            self.rollback_one(r);
        }
    }

    /// The kernel said ENOSPC for `r`: its slot is held by someone else.
    pub fn mark_foreign(&self, r: Reservation) {
        let _t = self.timed();
        if let Some(mut row) = self.threads.get_mut(&r.tid)
            && r.holds(&row)
        {
            let bit = 1 << r.slot;
            row.pending &= !bit;
            row.inheritable &= !bit;
            row.foreign |= bit;
            row.holder[r.slot as usize] = 0;
        }
    }

    /// Records what a kernel probe found: `free` slots really free on `tid`.
    /// Slots beyond ours and pending that the kernel refused become foreign.
    pub fn set_probed(&self, tid: Tid, free: usize) {
        let _t = self.timed();
        if let Some(mut row) = self.threads.get_mut(&tid) {
            let busy = row.ours | row.pending | row.uncertain | row.retained;
            let unowned: Vec<u8> = (0..SLOTS as u8).filter(|s| busy & (1 << s) == 0).collect();
            let foreign_n = unowned.len().saturating_sub(free);
            row.foreign = 0;
            // Foreign slots are counted, not located: mark the highest ones.
            for s in unowned.iter().rev().take(foreign_n) {
                row.foreign |= 1 << s;
            }
        }
    }

    /// Resolves an uncertain inheritance of `key` on `tid`.
    pub fn resolve_uncertain(&self, tid: Tid, key: impl Into<SlotKey>, inherited: bool, time: u64) {
        let _t = self.timed();
        let k = key.into().pack();
        if let Some(mut row) = self.threads.get_mut(&tid) {
            for s in 0..SLOTS {
                let bit = 1 << s;
                if row.uncertain & bit != 0 && row.holder[s] == k {
                    row.uncertain &= !bit;
                    if inherited {
                        row.ours |= bit;
                        row.inheritable |= bit;
                        row.set_window(
                            s,
                            InheritWindow {
                                absent_before: time,
                                certain_from: time,
                            },
                        );
                    } else {
                        row.holder[s] = 0;
                        row.inheritable &= !bit;
                    }
                }
            }
        }
    }

    /// Frees the slots of every piece of `id` on `tid` (watchpoint removed).
    /// `retain`: the kernel keeps the slots reserved (ptrace).
    pub fn release(&self, tid: Tid, id: WatchId, retain: bool) {
        let _t = self.timed();
        if let Some(mut row) = self.threads.get_mut(&tid) {
            let mine = row.mask_of(id);
            for s in 0..SLOTS {
                let bit = 1 << s;
                if mine & bit != 0 {
                    row.ours &= !bit;
                    row.pending &= !bit;
                    row.uncertain &= !bit;
                    row.inheritable &= !bit;
                    row.holder[s] = 0;
                    if retain {
                        row.retained |= bit;
                    }
                }
            }
        }
    }

    /// The refusal's details for threads without a free slot: who holds
    /// each one's slots (sorted by tid).
    pub fn conflicts(&self, mut tids: Vec<Tid>) -> Vec<SlotConflict> {
        tids.sort_unstable();
        tids.dedup();
        tids.into_iter()
            .map(|tid| SlotConflict {
                tid,
                holders: self.get(tid).map(|r| r.holders()).unwrap_or_default(),
            })
            .collect()
    }

    /// The slots of `pid`'s threads holding a piece of `id`: (tid, slot),
    /// one entry per piece.
    pub fn slots_of(&self, pid: Pid, id: WatchId) -> Vec<(Tid, u8)> {
        self.slots_on(&self.tids(pid), id)
    }

    /// The slots of those of `tids` holding a piece of `id`: (tid, slot),
    /// one entry per piece.
    pub fn slots_on(&self, tids: &[Tid], id: WatchId) -> Vec<(Tid, u8)> {
        let mut out = Vec::new();
        for &t in tids {
            if let Some(r) = self.get(t) {
                let m = r.mask_of(id);
                out.extend(
                    (0..SLOTS as u8)
                        .filter(|s| m & (1 << s) != 0)
                        .map(|s| (t, s)),
                );
            }
        }
        out
    }

    /// Threads of `pid` on which `id` is committed.
    pub fn armed_count(&self, pid: Pid, id: WatchId) -> usize {
        self.armed_on(&self.tids(pid), id)
    }

    /// How many of `tids` have `id` committed.
    pub fn armed_on(&self, tids: &[Tid], id: WatchId) -> usize {
        tids.iter()
            .filter(|&&t| self.get(t).is_some_and(|r| r.ours & r.mask_of(id) != 0))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Holder;

    fn ledger_with(pid: Pid, tids: &[Tid]) -> Ledger {
        let l = Ledger::new();
        for &t in tids {
            assert!(l.add_thread(pid, t));
        }
        l
    }

    #[test]
    fn four_slots_then_conflict_naming_holders() {
        let l = ledger_with(1, &[1, 2]);
        for id in 1..=4 {
            let r = l
                .reserve_all(&[1, 2], WatchId(id), 1, false, Retained::Avoid)
                .unwrap();
            l.commit(&r, None);
        }
        let err = l
            .reserve_all(&[1, 2], WatchId(5), 1, false, Retained::Avoid)
            .unwrap_err();
        assert_eq!(err.len(), 2);
        assert_eq!(err[0].tid, 1);
        assert_eq!(
            err[0].holders,
            (1..=4)
                .map(|i| Holder::Ours(WatchId(i)))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn all_or_nothing_rolls_back() {
        let l = ledger_with(1, &[1, 2]);
        for id in 1..=4 {
            let r = l
                .reserve_all(&[2], WatchId(id), 1, false, Retained::Avoid)
                .unwrap();
            l.commit(&r, None);
        }
        let before = l.get(1).unwrap();
        assert!(
            l.reserve_all(&[1, 2], WatchId(9), 1, false, Retained::Avoid)
                .is_err()
        );
        assert_eq!(l.get(1).unwrap(), before, "thread 1 must be unchanged");
    }

    #[test]
    fn foreign_slot_is_skipped_then_retried_when_nothing_else() {
        let l = ledger_with(1, &[1]);
        let r = l
            .reserve_all(&[1], WatchId(1), 1, false, Retained::Avoid)
            .unwrap();
        l.mark_foreign(r[0]);
        assert_eq!(l.get(1).unwrap().foreign, 1);
        let r2 = l
            .reserve_all(&[1], WatchId(2), 1, false, Retained::Avoid)
            .unwrap();
        assert_eq!(r2[0].slot, 1, "free slots come before foreign ones");
        l.commit(&r2, None);
        for id in 3..=4 {
            let r = l
                .reserve_all(&[1], WatchId(id), 1, false, Retained::Avoid)
                .unwrap();
            l.commit(&r, None);
        }
        // Only the foreign slot is left: the kernel gets to decide.
        let r5 = l
            .reserve_all(&[1], WatchId(5), 1, false, Retained::Avoid)
            .unwrap();
        assert_eq!(r5[0].slot, 0);
    }

    #[test]
    fn release_and_exit_free_everything() {
        let l = ledger_with(7, &[7, 8]);
        let r = l
            .reserve_all(&[7, 8], WatchId(1), 1, false, Retained::Avoid)
            .unwrap();
        l.commit(&r, None);
        assert_eq!(l.armed_count(7, WatchId(1)), 2);
        l.release(7, WatchId(1), false);
        assert_eq!(l.get(7).unwrap().ours, 0);
        l.remove_thread(8);
        assert_eq!(l.tids(7), vec![7]);
        assert_eq!(l.remove_process(7), 1);
        assert_eq!(l.total_threads(), 0);
    }

    #[test]
    fn fork_inherits_by_time() {
        let l = ledger_with(1, &[1]);
        let r = l
            .reserve_all(&[1], WatchId(3), 1, true, Retained::Avoid)
            .unwrap();
        l.commit(&r, Some(&[(1_000, 2_000)]));
        let before = l.on_fork(1, 1, 10, 500).unwrap();
        assert_eq!((before.ours, before.uncertain), (0, 0));
        let during = l.on_fork(1, 1, 11, 1_500).unwrap();
        assert_eq!((during.ours, during.uncertain), (0, 1));
        let after = l.on_fork(1, 1, 12, 2_000 + INHERIT_MARGIN_NS).unwrap();
        assert_eq!((after.ours, after.inheritable), (1, 1));
        // A grandchild of an inheriting thread inherits whenever it is born.
        let g = l.on_fork(1, 12, 13, 2_000 + INHERIT_MARGIN_NS + 1).unwrap();
        assert_eq!(g.ours, 1);
        assert!(
            l.on_fork(1, 1, 12, 0).is_none(),
            "duplicate fork is ignored"
        );
    }

    #[test]
    fn retained_slots_serve_ptrace_not_perf_and_survive_detach() {
        let l = ledger_with(1, &[1]);
        let r = l
            .reserve_all(&[1], WatchId(1), 1, false, Retained::Reuse)
            .unwrap();
        l.commit(&r, None);
        l.release(1, WatchId(1), true);
        assert_eq!(l.get(1).unwrap().retained, 0b0001);
        l.remove_process(1);
        l.add_thread(1, 1);
        assert_eq!(l.get(1).unwrap().retained, 0b0001, "kept across detach");
        let p = l
            .reserve_all(&[1], WatchId(2), 1, false, Retained::Avoid)
            .unwrap();
        assert_eq!(p[0].slot, 1, "perf cannot use a retained slot");
        l.rollback(&p);
        let t = l
            .reserve_all(&[1], WatchId(3), 1, false, Retained::Reuse)
            .unwrap();
        assert_eq!(t[0].slot, 0, "ptrace reuses it first");
    }

    #[test]
    fn reserve_one_skips_untracked_and_repeated_and_names_holders_when_full() {
        let l = Ledger::new();
        assert_eq!(
            l.reserve_one(1, WatchId(1), false, Retained::Avoid),
            Ok(None)
        );
        l.add_thread(10, 1);
        for id in 1..=4 {
            let r = l
                .reserve_one(1, WatchId(id), false, Retained::Avoid)
                .unwrap()
                .unwrap();
            assert_eq!(r.slot as u64, id - 1);
            assert_eq!(
                l.reserve_one(1, WatchId(id), false, Retained::Avoid),
                Ok(None),
                "a second reservation of the same watchpoint"
            );
            l.commit(&[r], None);
        }
        let full = l
            .reserve_one(1, WatchId(5), false, Retained::Avoid)
            .unwrap_err();
        assert_eq!(full.tid, 1);
        assert_eq!(full.holders.len(), 4);
    }

    #[test]
    fn retained_slots_of_dead_threads_are_pruned() {
        let l = ledger_with(1, &[1, 2]);
        for tid in [1, 2] {
            let r = l
                .reserve_all(&[tid], WatchId(tid as u64), 1, false, Retained::Reuse)
                .unwrap();
            l.commit(&r, None);
            l.release(tid, WatchId(tid as u64), true);
        }
        l.remove_process(1);
        assert_eq!(l.prune_retained(|_, tid| tid == 2), 1, "thread 1 died");
        assert_eq!(l.prune_retained(|_, tid| tid == 2), 0);
        l.add_thread(1, 2);
        assert_eq!(l.get(2).unwrap().retained, 0b0001, "the live one is kept");
        l.add_thread(1, 1);
        assert_eq!(l.get(1).unwrap().retained, 0, "the dead one is forgotten");
    }

    #[test]
    fn probe_marks_foreign() {
        let l = ledger_with(1, &[1]);
        let r = l
            .reserve_all(&[1], WatchId(1), 1, false, Retained::Avoid)
            .unwrap();
        l.commit(&r, None);
        l.set_probed(1, 2);
        let row = l.get(1).unwrap();
        assert_eq!(row.ours, 0b0001);
        assert_eq!(row.foreign, 0b1000);
    }

    #[test]
    fn hold_histogram_reports() {
        let l = ledger_with(1, &[1, 2, 3]);
        for _ in 0..4 * HOLD_SAMPLE {
            let _ = l.tids(1);
        }
        let (p50, p99, max) = l.hold_summary();
        assert!(p50 > 0 && p99 >= p50 && max > 0);
    }
}
