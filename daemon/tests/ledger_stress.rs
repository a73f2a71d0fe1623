//! Concurrency stress test of the ledger's reservation path (reserve_all → commit or rollback, release), with real OS threads on the real `Ledger`.
//!
//! Why not loom or shuttle here: the ledger is built on `dashmap` and std
//! atomics, which neither tool can instrument, so this drives the real
//! implementation with real threads instead (`std::thread::scope`), and
//! `ledger_shuttle.rs` checks the protocol on a re-implementation under a
//! controlled scheduler.
//!
//! `WORKERS` threads share one process whose tracked tids overlap: each
//! worker draws random tid subsets (plus an exited tid now and then),
//! reserves a fresh watch id on them, yields, then commits or rolls back,
//! and releases some of its committed ids later. Worker 0 also churns
//! threads: it removes a tracked thread (exit) and adds a new one, never
//! reusing a tid. Checked while running, from each worker's own point of
//! view (only it touches its ids):
//! - `Ok`: one reservation per requested thread that still exists, all
//!   distinct; each is `pending` with the worker's id until it is resolved;
//!   after commit each is `ours`, after rollback none is left;
//! - `Err`: the conflicts are sorted, distinct, among the requested
//!   threads, each named with all `SLOTS` holders (it was full at that
//!   moment), and no requested thread keeps the id.
//!
//! After every round (all workers joined), over the whole ledger:
//! - no thread has more than `SLOTS` slots in use, bitmaps disjoint,
//!   nothing left `pending`;
//! - no (tid, slot) is claimed by two committed reservations;
//! - the committed reservations still on tracked threads are exactly the
//!   ledger's `ours` bits, holder for holder (so every reservation holds on
//!   all its still-tracked threads or, once released, on none);
//! - `tids(pid)` is exactly the set of tracked threads.
//!
//! Rounds use different seeds; the ledger and the committed reservations
//! carry over from round to round.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use wpd::arch::current::SLOTS;
use wpd::ledger::Retained;
use wpd::ledger::{Ledger, Reservation};
use wpd::model::{Tid, WatchId};

const PID: i32 = 4242;
const WORKERS: usize = 8;
const ROUNDS: u64 = 32;
const ITERS: usize = 2_500;
/// Tracked threads of the process at any time.
const POOL: Tid = 6;

/// A tiny deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A committed watchpoint of one worker.
#[derive(Debug, Clone)]
struct Committed {
    id: u64,
    res: Vec<Reservation>,
}

#[derive(Default)]
struct Counts {
    ok: AtomicUsize,
    refused: AtomicUsize,
    committed: AtomicUsize,
    rolled_back: AtomicUsize,
    released: AtomicUsize,
    churned: AtomicUsize,
}

fn bump(c: &AtomicUsize) {
    c.fetch_add(1, Ordering::Relaxed);
}

struct Shared {
    ledger: Ledger,
    next_id: AtomicU64,
    next_tid: AtomicI32,
    counts: Counts,
}

fn worker(sh: &Shared, me: usize, rng: &mut Rng, mine: &mut Vec<Committed>) {
    let l = &sh.ledger;
    for _ in 0..ITERS {
        let roll = rng.below(100);
        if me == 0 && roll < 8 {
            // Churn: a thread exits, another is born (fresh tid).
            let tids = l.tids(PID);
            if !tids.is_empty() {
                let gone = tids[rng.below(tids.len() as u64) as usize];
                assert!(
                    l.remove_thread(gone).is_some(),
                    "only worker 0 removes threads"
                );
            }
            let tid = sh.next_tid.fetch_add(1, Ordering::Relaxed);
            assert!(l.add_thread(PID, tid));
            bump(&sh.counts.churned);
        } else if roll < 45 && !mine.is_empty() {
            let c = mine.swap_remove(rng.below(mine.len() as u64) as usize);
            for r in &c.res {
                l.release(r.tid, WatchId(c.id), false);
            }
            for r in &c.res {
                assert!(
                    l.get(r.tid)
                        .is_none_or(|row| row.slot_of(WatchId(c.id)).is_none())
                );
            }
            bump(&sh.counts.released);
        } else {
            reserve_once(sh, rng, mine);
        }
    }
}

fn reserve_once(sh: &Shared, rng: &mut Rng, mine: &mut Vec<Committed>) {
    let l = &sh.ledger;
    let mut tids: Vec<Tid> = l.tids(PID).into_iter().filter(|_| rng.chance(50)).collect();
    if rng.chance(5) {
        tids.push(1); // never tracked: an exited thread is skipped
    }
    let id = WatchId(sh.next_id.fetch_add(1, Ordering::Relaxed));
    let inheritable = rng.chance(50);
    let backend = if rng.chance(25) {
        Retained::Reuse
    } else {
        Retained::Avoid
    };
    match l.reserve_all(&tids, id, 1, inheritable, backend) {
        Ok(res) => {
            bump(&sh.counts.ok);
            let got: BTreeSet<Tid> = res.iter().map(|r| r.tid).collect();
            assert_eq!(got.len(), res.len(), "one reservation per thread: {res:?}");
            for t in &tids {
                // Tids are never reused: one skipped was gone for good.
                assert!(
                    got.contains(t) || l.get(*t).is_none(),
                    "tracked thread {t} skipped by {id:?}: {res:?}"
                );
            }
            for r in &res {
                assert!(tids.contains(&r.tid));
                if let Some(row) = l.get(r.tid) {
                    assert!(
                        row.pending & (1 << r.slot) != 0,
                        "{r:?} of {id:?} not pending: {row:?}"
                    );
                    assert_eq!(row.holder[r.slot as usize], id.0, "{r:?}: {row:?}");
                }
            }
            if rng.chance(50) {
                std::thread::yield_now();
            }
            if rng.chance(70) {
                l.commit(&res, inheritable.then_some(&vec![(1, 2); res.len()][..]));
                for r in &res {
                    if let Some(row) = l.get(r.tid) {
                        assert!(
                            row.ours & (1 << r.slot) != 0,
                            "{r:?} of {id:?} not ours: {row:?}"
                        );
                        assert_eq!(row.holder[r.slot as usize], id.0);
                    }
                }
                bump(&sh.counts.committed);
                mine.push(Committed { id: id.0, res });
            } else {
                l.rollback(&res);
                for t in &tids {
                    assert!(l.get(*t).is_none_or(|row| row.slot_of(id).is_none()));
                }
                bump(&sh.counts.rolled_back);
            }
        }
        Err(conflicts) => {
            bump(&sh.counts.refused);
            assert!(!conflicts.is_empty());
            assert!(
                conflicts.windows(2).all(|w| w[0].tid < w[1].tid),
                "{conflicts:?}"
            );
            for c in &conflicts {
                assert!(tids.contains(&c.tid), "{c:?} not requested");
                // No foreign, retained or uncertain slots here: a full
                // thread has SLOTS holders, ours or pending.
                assert_eq!(c.holders.len(), SLOTS, "{c:?}");
            }
            for t in &tids {
                assert!(
                    l.get(*t).is_none_or(|row| row.slot_of(id).is_none()),
                    "refused {id:?} left a slot on {t}"
                );
            }
        }
    }
}

/// Whole-ledger invariants, with every worker joined.
fn check_quiescent(l: &Ledger, all: &[Vec<Committed>]) {
    let tids: BTreeSet<Tid> = l.tids(PID).into_iter().collect();
    assert_eq!(tids.len(), POOL as usize, "pool size");
    assert_eq!(l.total_threads(), tids.len());
    let mut want: BTreeMap<(Tid, u8), u64> = BTreeMap::new();
    for c in all.iter().flatten() {
        for r in &c.res {
            if tids.contains(&r.tid) {
                let prev = want.insert((r.tid, r.slot), c.id);
                assert!(prev.is_none(), "slot {r:?} held by {prev:?} and {}", c.id);
            } else {
                assert!(
                    l.get(r.tid).is_none(),
                    "tid {} tracked but not indexed",
                    r.tid
                );
            }
        }
    }
    let mut ours_total = 0;
    for &t in &tids {
        let row = l.get(t).expect("indexed tid is tracked");
        assert_eq!(row.pid, PID);
        assert_eq!(row.pending, 0, "tid {t}: unresolved reservation: {row:?}");
        assert_eq!((row.uncertain, row.foreign, row.retained), (0, 0, 0));
        assert_eq!(row.ours & !0xF, 0);
        assert!(row.ours.count_ones() as usize <= SLOTS);
        assert_eq!(row.inheritable & !row.ours, 0, "tid {t}: {row:?}");
        for s in 0..SLOTS as u8 {
            let expected = want.get(&(t, s));
            let held = (row.ours & (1 << s) != 0).then_some(row.holder[s as usize]);
            assert_eq!(held, expected.copied(), "tid {t} slot {s}: {row:?}");
        }
        ours_total += row.ours.count_ones() as usize;
    }
    assert_eq!(ours_total, want.len(), "committed reservations = ours bits");
}

#[test]
fn concurrent_reservations_keep_the_ledger_consistent() {
    let sh = Shared {
        ledger: Ledger::new(),
        next_id: AtomicU64::new(1),
        next_tid: AtomicI32::new(100 + POOL),
        counts: Counts::default(),
    };
    for t in 100..100 + POOL {
        assert!(sh.ledger.add_thread(PID, t));
    }
    let mut all: Vec<Vec<Committed>> = vec![Vec::new(); WORKERS];
    for seed in 0..ROUNDS {
        std::thread::scope(|s| {
            for (me, mine) in all.iter_mut().enumerate() {
                let sh = &sh;
                let mut rng = Rng(seed.wrapping_mul(1_000_003) ^ ((me as u64) << 32));
                std::thread::Builder::new()
                    .name(format!("ledger-stress-{me}"))
                    .spawn_scoped(s, move || worker(sh, me, &mut rng, mine))
                    .unwrap();
            }
        });
        check_quiescent(&sh.ledger, &all);
    }
    let c = &sh.counts;
    let n = |a: &AtomicUsize| a.load(Ordering::Relaxed);
    let counts = [
        ("ok", n(&c.ok)),
        ("refused", n(&c.refused)),
        ("committed", n(&c.committed)),
        ("rolled back", n(&c.rolled_back)),
        ("released", n(&c.released)),
        ("churned", n(&c.churned)),
    ];
    eprintln!("{counts:?}");
    // The run must not have degenerated into one kind of outcome.
    for (name, k) in counts {
        assert!(k >= 100, "only {k} {name}: {counts:?}");
    }
}
