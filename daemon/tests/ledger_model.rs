//! Model-based test of the slot ledger: random operation sequences, checked after every step against a plain sequential model.
//!
//! Operations over 2 pids, tids 1..=6 and watch ids 1..=5 (few, so that
//! threads fill up): `add_thread`, `on_fork` (times before, inside and
//! after the inheritance window), `reserve_all` (random tid subsets,
//! inheritable or not, Perf or Ptrace), `commit` with and without times,
//! `rollback`, `mark_foreign`, `release` (retain or not),
//! `resolve_uncertain`, `remove_thread`, `remove_process`, a re-attach
//! (`remove_process` then `add_thread` of the same threads) and
//! `set_probed`. 512 cases of up to 150 steps; proptest shrinks a failure
//! to a minimal sequence (`PROPTEST_CASES=N` to run more).
//!
//! The model (`Model` below) keeps, per tracked thread, an array of four
//! slots, each `Free` or used by one watch id (`Ours`, `Pending`,
//! `Uncertain`) plus three flags (`foreign`, `retained`, `inheritable`) and
//! the two inheritance times. Every ledger call is replayed on it, and after
//! every step the whole observable ledger state is compared with it:
//! every row (`get`), `tids`, `thread_count`, `total_threads`, `slots_of`,
//! `armed_count`, plus invariants checked on the raw bitmaps alone (bits in
//! range, at most 4 slots in use, `ours`/`pending`/`uncertain` disjoint,
//! `foreign` disjoint from `ours|uncertain`, `inheritable` only on used
//! slots, no used slot with id 0, an id in at most one slot of a thread).
//!
//! `reserve_all` is checked against its contract rather than its code: the
//! model computes, per thread, the set of slots the request may take (Perf:
//! free, neither foreign nor retained, else a foreign one; Ptrace: retained
//! first, else free, else foreign), accepts whichever of them the ledger
//! picked, and requires all or nothing: `Ok` with exactly one new pending
//! reservation per tracked thread not already holding the id and nothing
//! else changed, or `Err` naming exactly the threads with no allowed slot
//! (sorted, holders as the ledger reports them) and no row changed.
//!
//! Reservations are used as the core uses them: committed, rolled back or
//! marked foreign while still pending, possibly after their thread exited.
//! Stale ones (slot released meanwhile, or tid reused by a new thread) are
//! dropped before the call; see `ledger_regressions.rs`.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use wpd::arch::current::SLOTS;
use wpd::error::{Holder, SlotConflict};
use wpd::ledger::Retained;
use wpd::ledger::{INHERIT_MARGIN_NS, Ledger, Reservation, ThreadSlots};
use wpd::model::{Pid, Tid, WatchId};

const PIDS: [Pid; 2] = [100, 200];
/// Tids 1..=NTIDS; few, so that threads fill up and conflicts are common.
const NTIDS: u8 = 6;
/// Watch ids 1..=NIDS.
const NIDS: u8 = 5;
/// Time unit of generated timestamps: a quarter of the inheritance margin,
/// so that fork times fall before, inside and after the uncertain window.
const UNIT: u64 = INHERIT_MARGIN_NS / 4;
const ALL: u8 = (1 << SLOTS) - 1;

// ------------------------------------------------------------------ model

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Use {
    Free,
    Ours(u64),
    Pending(u64),
    Uncertain(u64),
}

impl Use {
    fn id(self) -> Option<u64> {
        match self {
            Use::Free => None,
            Use::Ours(i) | Use::Pending(i) | Use::Uncertain(i) => Some(i),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    user: Use,
    foreign: bool,
    retained: bool,
    inheritable: bool,
    absent_before: u64,
    certain_from: u64,
}

const FREE: Slot = Slot {
    user: Use::Free,
    foreign: false,
    retained: false,
    inheritable: false,
    absent_before: 0,
    certain_from: 0,
};

#[derive(Debug, Clone, PartialEq, Eq)]
struct Thread {
    pid: Pid,
    parent: Tid,
    born: u64,
    slots: [Slot; SLOTS],
}

impl Thread {
    fn new(pid: Pid, parent: Tid, born: u64) -> Self {
        Thread {
            pid,
            parent,
            born,
            slots: [FREE; SLOTS],
        }
    }

    fn holds(&self, id: u64) -> Option<usize> {
        self.slots.iter().position(|s| s.user.id() == Some(id))
    }

    /// Slots a reservation may take (empty: the thread is full).
    fn allowed(&self, backend: Retained) -> BTreeSet<usize> {
        let pick = |f: &dyn Fn(&Slot) -> bool| -> BTreeSet<usize> {
            (0..SLOTS)
                .filter(|&s| self.slots[s].user == Use::Free && f(&self.slots[s]))
                .collect()
        };
        let tiers: Vec<BTreeSet<usize>> = match backend {
            Retained::Avoid => vec![
                pick(&|s| !s.foreign && !s.retained),
                pick(&|s| s.foreign && !s.retained),
            ],
            Retained::Reuse => vec![
                pick(&|s| s.retained && !s.foreign),
                pick(&|s| !s.foreign),
                pick(&|s| s.foreign),
            ],
        };
        tiers
            .into_iter()
            .find(|t| !t.is_empty())
            .unwrap_or_default()
    }

    /// Who holds what, in the ledger's words and priority.
    fn holders(&self) -> Vec<Holder> {
        self.slots
            .iter()
            .filter_map(|s| match s.user {
                Use::Ours(i) => Some(Holder::Ours(WatchId(i))),
                Use::Pending(i) => Some(Holder::Pending(WatchId(i))),
                // An uncertain slot is busy, named like a pending one.
                Use::Uncertain(i) => Some(Holder::Pending(WatchId(i))),
                Use::Free if s.foreign => Some(Holder::Foreign),
                Use::Free if s.retained => Some(Holder::Retained),
                Use::Free => None,
            })
            .collect()
    }
}

/// One reservation handed out by `reserve_all`, with the incarnation of
/// the thread it was made on (a tid can be reused after an exit).
#[derive(Debug, Clone, Copy)]
struct Held {
    r: Reservation,
    incarnation: u64,
}

#[derive(Debug, Clone)]
struct Batch {
    id: u64,
    res: Vec<Held>,
}

#[derive(Debug, Default)]
struct Model {
    threads: BTreeMap<Tid, Thread>,
    procs: BTreeMap<Pid, BTreeSet<Tid>>,
    /// Retained slots of threads forgotten by `remove_process`.
    detached: BTreeMap<Tid, (Pid, [bool; SLOTS])>,
    incarnation: BTreeMap<Tid, u64>,
    next_incarnation: u64,
    batches: Vec<Batch>,
}

fn classify(time: u64, absent_before: u64, certain_from: u64) -> Option<bool> {
    if time < absent_before {
        Some(false)
    } else if time >= certain_from {
        Some(true)
    } else {
        None
    }
}

impl Model {
    fn track(&mut self, tid: Tid, t: Thread) {
        self.procs.entry(t.pid).or_default().insert(tid);
        self.threads.insert(tid, t);
        self.next_incarnation += 1;
        self.incarnation.insert(tid, self.next_incarnation);
    }

    fn add_thread(&mut self, pid: Pid, tid: Tid) -> bool {
        if self.threads.contains_key(&tid) {
            return false;
        }
        let mut t = Thread::new(pid, 0, 0);
        if let Some((p, bits)) = self.detached.get(&tid)
            && *p == pid
        {
            for (slot, &retained) in t.slots.iter_mut().zip(bits) {
                slot.retained = retained;
            }
        }
        self.track(tid, t);
        true
    }

    fn on_fork(&mut self, pid: Pid, parent: Tid, tid: Tid, time: u64) -> Option<Thread> {
        if self.threads.contains_key(&tid) {
            return None;
        }
        let mut t = Thread::new(pid, parent, time);
        if let Some(p) = self.threads.get(&parent) {
            for s in 0..SLOTS {
                let ps = p.slots[s];
                let c = &mut t.slots[s];
                match ps.user {
                    _ if !ps.inheritable => {}
                    Use::Free => {}
                    // Uncertain in the child, and inheritable: if it did
                    // inherit, so do the threads the child creates.
                    Use::Pending(i) | Use::Uncertain(i) => {
                        c.user = Use::Uncertain(i);
                        c.inheritable = true;
                    }
                    Use::Ours(i) => match classify(time, ps.absent_before, ps.certain_from) {
                        Some(true) => {
                            c.user = Use::Ours(i);
                            c.inheritable = true;
                            c.absent_before = time;
                            c.certain_from = time;
                        }
                        Some(false) => {}
                        None => {
                            c.user = Use::Uncertain(i);
                            c.inheritable = true;
                        }
                    },
                }
            }
        }
        self.track(tid, t.clone());
        Some(t)
    }

    fn remove_thread(&mut self, tid: Tid) -> Option<Thread> {
        let t = self.threads.remove(&tid)?;
        self.detached.remove(&tid);
        if let Some(set) = self.procs.get_mut(&t.pid) {
            set.remove(&tid);
        }
        Some(t)
    }

    fn remove_process(&mut self, pid: Pid) -> usize {
        let tids = self.procs.remove(&pid).unwrap_or_default();
        for tid in &tids {
            let t = self.threads.remove(tid).expect("indexed thread is tracked");
            let bits = t.slots.map(|s| s.retained);
            if bits.iter().any(|&b| b) {
                self.detached.insert(*tid, (pid, bits));
            }
        }
        tids.len()
    }

    /// Still worth passing to the ledger: its thread is gone (the ledger
    /// skips it; the core does pass these), or it is still the pending
    /// reservation it was made as (not released, tid not reused).
    fn live(&self, h: &Held, id: u64) -> bool {
        match self.threads.get(&h.r.tid) {
            None => true,
            Some(t) => {
                self.incarnation.get(&h.r.tid) == Some(&h.incarnation)
                    && t.slots[h.r.slot as usize].user == Use::Pending(id)
            }
        }
    }

    /// Drops stale reservations and empty batches.
    fn prune(&mut self) {
        let mut batches = std::mem::take(&mut self.batches);
        for b in &mut batches {
            b.res.retain(|h| self.live(h, b.id));
        }
        batches.retain(|b| !b.res.is_empty());
        self.batches = batches;
    }
}

// ------------------------------------------------------------- operations

#[derive(Debug, Clone)]
enum Op {
    AddThread {
        pid: usize,
        tid: u8,
    },
    OnFork {
        pid: usize,
        parent: u8,
        tid: u8,
        time: u8,
    },
    Reserve {
        tids: u8,
        id: u8,
        inheritable: bool,
        ptrace: bool,
    },
    Commit {
        batch: u8,
        /// (start, duration) in `UNIT`s, for every reservation of the batch.
        times: Option<(u8, u8)>,
    },
    Rollback {
        batch: u8,
    },
    MarkForeign {
        batch: u8,
        which: u8,
    },
    Release {
        tid: u8,
        id: u8,
        retain: bool,
    },
    ResolveUncertain {
        tid: u8,
        id: u8,
        inherited: bool,
        time: u8,
    },
    RemoveThread {
        tid: u8,
    },
    RemoveProcess {
        pid: usize,
    },
    /// Detach then attach again: `remove_process`, then `add_thread` for
    /// each of its threads (retained slots come back).
    Reattach {
        pid: usize,
    },
    SetProbed {
        tid: u8,
        free: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let tid = 1..=NTIDS;
    let id = 1..=NIDS;
    let pid = 0..PIDS.len();
    prop_oneof![
        5 => (pid.clone(), tid.clone()).prop_map(|(pid, tid)| Op::AddThread { pid, tid }),
        4 => (pid.clone(), tid.clone(), tid.clone(), 0u8..16)
            .prop_map(|(pid, parent, tid, time)| Op::OnFork { pid, parent, tid, time }),
        10 => (1u8..(1 << NTIDS), id.clone(), any::<bool>(), prop::bool::weighted(0.3))
            .prop_map(|(tids, id, inheritable, ptrace)| Op::Reserve { tids, id, inheritable, ptrace }),
        6 => (any::<u8>(), prop::option::weighted(0.6, (0u8..8, 0u8..4)))
            .prop_map(|(batch, times)| Op::Commit { batch, times }),
        2 => any::<u8>().prop_map(|batch| Op::Rollback { batch }),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(batch, which)| Op::MarkForeign { batch, which }),
        2 => (tid.clone(), id.clone(), any::<bool>())
            .prop_map(|(tid, id, retain)| Op::Release { tid, id, retain }),
        2 => (tid.clone(), id.clone(), any::<bool>(), 0u8..16)
            .prop_map(|(tid, id, inherited, time)| Op::ResolveUncertain { tid, id, inherited, time }),
        2 => tid.clone().prop_map(|tid| Op::RemoveThread { tid }),
        1 => pid.clone().prop_map(|pid| Op::RemoveProcess { pid }),
        1 => pid.prop_map(|pid| Op::Reattach { pid }),
        1 => (tid, 0u8..=SLOTS as u8).prop_map(|(tid, free)| Op::SetProbed { tid, free }),
    ]
}

// ----------------------------------------------------------------- checks

/// The raw bitmap invariants, then the row in the model's terms.
fn decode(tid: Tid, r: &ThreadSlots) -> Result<Thread, TestCaseError> {
    for (name, bits) in [
        ("ours", r.ours),
        ("pending", r.pending),
        ("uncertain", r.uncertain),
        ("foreign", r.foreign),
        ("inheritable", r.inheritable),
        ("retained", r.retained),
    ] {
        prop_assert_eq!(
            bits & !ALL,
            0,
            "tid {}: {} has bits beyond slot {}",
            tid,
            name,
            SLOTS
        );
    }
    let used = r.ours | r.pending | r.uncertain;
    prop_assert_eq!(
        r.ours & r.pending,
        0,
        "tid {}: ours & pending: {:?}",
        tid,
        r
    );
    prop_assert_eq!(
        r.ours & r.uncertain,
        0,
        "tid {}: ours & uncertain: {:?}",
        tid,
        r
    );
    prop_assert_eq!(
        r.pending & r.uncertain,
        0,
        "tid {}: pending & uncertain: {:?}",
        tid,
        r
    );
    prop_assert_eq!(
        r.foreign & (r.ours | r.uncertain),
        0,
        "tid {}: foreign slot in use: {:?}",
        tid,
        r
    );
    prop_assert_eq!(
        r.inheritable & !used,
        0,
        "tid {}: inheritable on an unused slot: {:?}",
        tid,
        r
    );
    prop_assert!((used | r.foreign | r.retained).count_ones() as usize <= SLOTS);
    let mut ids = BTreeSet::new();
    for s in 0..SLOTS {
        if used & (1 << s) != 0 {
            prop_assert!(
                r.holder[s] != 0,
                "tid {}: slot {} used by id 0: {:?}",
                tid,
                s,
                r
            );
            prop_assert!(
                ids.insert(r.holder[s]),
                "tid {}: id {} in two slots: {:?}",
                tid,
                r.holder[s],
                r
            );
        }
    }
    let slots = std::array::from_fn(|s| {
        let bit = 1 << s;
        let id = r.holder[s];
        Slot {
            user: if r.ours & bit != 0 {
                Use::Ours(id)
            } else if r.pending & bit != 0 {
                Use::Pending(id)
            } else if r.uncertain & bit != 0 {
                Use::Uncertain(id)
            } else {
                // `holder` of an unused slot is meaningless (on_fork can
                // leave a stale one); not compared.
                Use::Free
            },
            foreign: r.foreign & bit != 0,
            retained: r.retained & bit != 0,
            inheritable: r.inheritable & bit != 0,
            absent_before: r.window(s).absent_before,
            certain_from: r.window(s).certain_from,
        }
    });
    Ok(Thread {
        pid: r.pid,
        parent: r.parent,
        born: r.born(),
        slots,
    })
}

fn check_all(l: &Ledger, m: &Model) -> Result<(), TestCaseError> {
    for tid in 1..=NTIDS as Tid {
        let got = l.get(tid).map(|r| decode(tid, &r)).transpose()?;
        prop_assert_eq!(got.as_ref(), m.threads.get(&tid), "row of tid {}", tid);
    }
    prop_assert_eq!(l.total_threads(), m.threads.len());
    for pid in PIDS {
        let mut tids = l.tids(pid);
        tids.sort_unstable();
        let want: Vec<Tid> = m.procs.get(&pid).into_iter().flatten().copied().collect();
        prop_assert_eq!(&tids, &want, "tids({})", pid);
        prop_assert_eq!(l.thread_count(pid), want.len());
        for id in 1..=NIDS as u64 {
            let mut got = l.slots_of(pid, WatchId(id));
            got.sort_unstable();
            let want_slots: Vec<(Tid, u8)> = want
                .iter()
                .filter_map(|t| m.threads[t].holds(id).map(|s| (*t, s as u8)))
                .collect();
            prop_assert_eq!(got, want_slots, "slots_of({}, {})", pid, id);
            let armed = want
                .iter()
                .filter(|t| m.threads[t].slots.iter().any(|s| s.user == Use::Ours(id)))
                .count();
            prop_assert_eq!(
                l.armed_count(pid, WatchId(id)),
                armed,
                "armed_count({}, {})",
                pid,
                id
            );
        }
    }
    Ok(())
}

// ------------------------------------------------------------------- step

fn step(l: &Ledger, m: &mut Model, op: &Op) -> Result<(), TestCaseError> {
    match *op {
        Op::AddThread { pid, tid } => {
            let tid = tid as Tid;
            prop_assert_eq!(l.add_thread(PIDS[pid], tid), m.add_thread(PIDS[pid], tid));
        }
        Op::OnFork {
            pid,
            parent,
            tid,
            time,
        } => {
            let (parent, tid) = (parent as Tid, tid as Tid);
            // As the core does: a new thread of its creator's process.
            let pid = m.threads.get(&parent).map_or(PIDS[pid], |p| p.pid);
            let time = time as u64 * UNIT;
            let got = l.on_fork(pid, parent, tid, time);
            let want = m.on_fork(pid, parent, tid, time);
            let got = got.map(|r| decode(tid, &r)).transpose()?;
            prop_assert_eq!(got, want, "on_fork({}, {}, {}, {})", pid, parent, tid, time);
        }
        Op::Reserve {
            tids,
            id,
            inheritable,
            ptrace,
        } => {
            let backend = if ptrace {
                Retained::Reuse
            } else {
                Retained::Avoid
            };
            let id = id as u64;
            let tids: Vec<Tid> = (1..=NTIDS)
                .filter(|t| tids & (1 << (t - 1)) != 0)
                .map(Tid::from)
                .collect();
            let rows = |l: &Ledger| -> Vec<Option<ThreadSlots>> {
                (1..=NTIDS as Tid).map(|t| l.get(t)).collect()
            };
            let before = rows(l);
            // What the contract allows, thread by thread.
            let mut wanted: Vec<(Tid, BTreeSet<usize>)> = Vec::new();
            let mut full: Vec<SlotConflict> = Vec::new();
            for &tid in &tids {
                let Some(t) = m.threads.get(&tid) else {
                    continue; // not tracked (exited): skipped
                };
                if t.holds(id).is_some() {
                    continue; // already has it
                }
                let allowed = t.allowed(backend);
                if allowed.is_empty() {
                    full.push(SlotConflict {
                        tid,
                        holders: t.holders(),
                    });
                } else {
                    wanted.push((tid, allowed));
                }
            }
            match l.reserve_all(&tids, WatchId(id), 1, inheritable, backend) {
                Ok(res) => {
                    prop_assert!(
                        full.is_empty(),
                        "Ok although {:?} are full: {:?}",
                        full,
                        res
                    );
                    prop_assert_eq!(
                        res.len(),
                        wanted.len(),
                        "one per thread: {:?} vs {:?}",
                        res,
                        wanted
                    );
                    let mut batch = Vec::new();
                    for (r, (tid, allowed)) in res.iter().zip(&wanted) {
                        prop_assert_eq!(r.tid, *tid);
                        prop_assert!(
                            allowed.contains(&(r.slot as usize)),
                            "{:?} took slot {} of tid {}; allowed {:?} ({:?})",
                            backend,
                            r.slot,
                            tid,
                            allowed,
                            m.threads[tid]
                        );
                        let s = &mut m.threads.get_mut(tid).unwrap().slots[r.slot as usize];
                        s.user = Use::Pending(id);
                        s.inheritable = inheritable;
                        batch.push(Held {
                            r: *r,
                            incarnation: m.incarnation[tid],
                        });
                    }
                    if !batch.is_empty() {
                        m.batches.push(Batch { id, res: batch });
                    }
                }
                Err(conflicts) => {
                    prop_assert_eq!(
                        &conflicts,
                        &full,
                        "conflicts must name exactly the full threads"
                    );
                    // Compared whole, except `holder` of unused slots: `on_fork`
                    // leaves the creator's id in a slot the child did not
                    // inherit, and this rollback zeroes it (harmless: every
                    // reader masks `holder` with the used bits).
                    for (t, (b, a)) in (1..).zip(before.iter().zip(rows(l))) {
                        let b = b.as_ref().map(|r| decode(t, r)).transpose()?;
                        let a = a.as_ref().map(|r| decode(t, r)).transpose()?;
                        prop_assert_eq!(a, b, "refused reservation changed tid {}", t);
                    }
                }
            }
        }
        Op::Commit { batch, times } => {
            if m.batches.is_empty() {
                return Ok(());
            }
            let b = m.batches.remove(batch as usize % m.batches.len());
            let res: Vec<Reservation> = b.res.iter().map(|h| h.r).collect();
            let times = times.map(|(start, dur)| {
                let start = start as u64 * UNIT;
                (start, start + dur as u64 * UNIT)
            });
            let v: Vec<(u64, u64)> = times.into_iter().cycle().take(res.len()).collect();
            l.commit(&res, times.map(|_| &v[..]));
            for r in &res {
                if let Some(t) = m.threads.get_mut(&r.tid) {
                    let s = &mut t.slots[r.slot as usize];
                    s.user = Use::Ours(b.id);
                    s.foreign = false;
                    if let Some((start, end)) = times {
                        s.absent_before = start;
                        s.certain_from = end + INHERIT_MARGIN_NS;
                    }
                }
            }
        }
        Op::Rollback { batch } => {
            if m.batches.is_empty() {
                return Ok(());
            }
            let b = m.batches.remove(batch as usize % m.batches.len());
            let res: Vec<Reservation> = b.res.iter().map(|h| h.r).collect();
            l.rollback(&res);
            for r in &res {
                if let Some(t) = m.threads.get_mut(&r.tid) {
                    let s = &mut t.slots[r.slot as usize];
                    s.user = Use::Free;
                    s.inheritable = false;
                }
            }
        }
        Op::MarkForeign { batch, which } => {
            if m.batches.is_empty() {
                return Ok(());
            }
            let bi = batch as usize % m.batches.len();
            let b = &mut m.batches[bi];
            let h = b.res.remove(which as usize % b.res.len());
            l.mark_foreign(h.r);
            if let Some(t) = m.threads.get_mut(&h.r.tid) {
                let s = &mut t.slots[h.r.slot as usize];
                s.user = Use::Free;
                s.inheritable = false;
                s.foreign = true;
            }
        }
        Op::Release { tid, id, retain } => {
            let (tid, id) = (tid as Tid, id as u64);
            l.release(tid, WatchId(id), retain);
            if let Some(t) = m.threads.get_mut(&tid) {
                for s in t.slots.iter_mut().filter(|s| s.user.id() == Some(id)) {
                    s.user = Use::Free;
                    s.inheritable = false;
                    s.retained |= retain;
                }
            }
        }
        Op::ResolveUncertain {
            tid,
            id,
            inherited,
            time,
        } => {
            let (tid, id, time) = (tid as Tid, id as u64, time as u64 * UNIT);
            l.resolve_uncertain(tid, WatchId(id), inherited, time);
            if let Some(t) = m.threads.get_mut(&tid) {
                for s in t.slots.iter_mut().filter(|s| s.user == Use::Uncertain(id)) {
                    if inherited {
                        s.user = Use::Ours(id);
                        s.inheritable = true;
                        s.absent_before = time;
                        s.certain_from = time;
                    } else {
                        s.user = Use::Free;
                        s.inheritable = false;
                    }
                }
            }
        }
        Op::RemoveThread { tid } => {
            let tid = tid as Tid;
            let got = l.remove_thread(tid).map(|r| decode(tid, &r)).transpose()?;
            prop_assert_eq!(got, m.remove_thread(tid));
        }
        Op::RemoveProcess { pid } => {
            let pid = PIDS[pid];
            prop_assert_eq!(l.remove_process(pid), m.remove_process(pid));
            prop_assert!(l.tids(pid).is_empty());
            for tid in 1..=NTIDS as Tid {
                prop_assert!(
                    l.get(tid).is_none_or(|r| r.pid != pid),
                    "tid {} of {} left",
                    tid,
                    pid
                );
            }
        }
        Op::Reattach { pid } => {
            let pid = PIDS[pid];
            let tids: Vec<Tid> = m.procs.get(&pid).into_iter().flatten().copied().collect();
            prop_assert_eq!(l.remove_process(pid), m.remove_process(pid));
            for tid in tids {
                prop_assert_eq!(l.add_thread(pid, tid), m.add_thread(pid, tid));
            }
        }
        Op::SetProbed { tid, free } => {
            let tid = tid as Tid;
            l.set_probed(tid, free as usize);
            if let Some(t) = m.threads.get_mut(&tid) {
                let unowned: Vec<usize> = (0..SLOTS)
                    .filter(|&s| t.slots[s].user == Use::Free && !t.slots[s].retained)
                    .collect();
                let n = unowned.len().saturating_sub(free as usize);
                for s in &mut t.slots {
                    s.foreign = false;
                }
                // Counted, not located: the highest unowned slots.
                for &s in unowned.iter().rev().take(n) {
                    t.slots[s].foreign = true;
                }
            }
        }
    }
    m.prune();
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn ledger_matches_model(ops in prop::collection::vec(op(), 1..150)) {
        let l = Ledger::new();
        let mut m = Model::default();
        for (i, op) in ops.iter().enumerate() {
            step(&l, &mut m, op).map_err(|e| {
                TestCaseError::fail(format!("step {i} {op:?}: {e}"))
            })?;
            check_all(&l, &m).map_err(|e| {
                TestCaseError::fail(format!("after step {i} {op:?}: {e}"))
            })?;
        }
    }
}
