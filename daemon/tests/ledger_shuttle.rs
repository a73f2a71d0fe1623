//! Shuttle check of the ledger's reserve → commit/rollback protocol, on a tiny re-implementation: this checks the protocol, not the dashmap-based `wpd::ledger::Ledger`.
//!
//! Shuttle controls scheduling only through its own `shuttle::sync` types,
//! and the real ledger is built on `dashmap` and std atomics, which it
//! cannot see; `ledger_stress.rs` drives the real ledger with real threads.
//! Here `Mini` restates what `Ledger::reserve_all`, `commit`, `rollback`,
//! `release` and `remove_thread` do to the slot bitmaps, guarded the same
//! way: one lock per thread row (a `shuttle::sync::Mutex` standing for a
//! dashmap shard guard), taken for one row at a time, never two at once,
//! and never across the "syscall" between reserve and commit. Rows start
//! half full so that requests on overlapping threads collide.
//!
//! Under Shuttle's PCT scheduler (and its random one), checked:
//! - while running, by each task for its own id: after `Ok` every
//!   reservation is pending with the id, after commit `ours`; after `Err`
//!   or rollback nothing holds the id; every conflict names a thread that
//!   was full (all `SLOTS` holders) when it was visited;
//! - at the end: nothing pending, no slot claimed twice, `ours` bits equal
//!   the committed reservations on surviving threads, each committed
//!   reservation holding on all its surviving threads (all or nothing).
//!
//! `check_then_act_is_caught` runs a deliberately broken variant (the free
//! slot is chosen under one guard and taken under another) to show that
//! the harness does find a protocol race.

use std::collections::BTreeMap;

use shuttle::sync::{Arc, Mutex};
use shuttle::thread;

const SLOTS: usize = 4;
const ALL: u8 = (1 << SLOTS) - 1;
const ROWS: usize = 3;

#[derive(Debug, Clone, Default)]
struct Row {
    ours: u8,
    pending: u8,
    holder: [u64; SLOTS],
}

impl Row {
    fn slot_of(&self, id: u64) -> Option<usize> {
        (0..SLOTS).find(|&s| (self.ours | self.pending) & (1 << s) != 0 && self.holder[s] == id)
    }

    fn holders(&self) -> usize {
        (self.ours | self.pending).count_ones() as usize
    }
}

type Res = (usize, u8);

struct Mini {
    /// One guarded row per thread; `None` once the thread exited.
    rows: Vec<Mutex<Option<Row>>>,
    /// Choose the slot under one guard and take it under another (wrong).
    check_then_act: bool,
}

impl Mini {
    fn new(check_then_act: bool) -> Self {
        // Rows start with two committed slots each (ids 100 + row).
        let rows = (0..ROWS)
            .map(|t| {
                let mut r = Row {
                    ours: 0b0011,
                    ..Row::default()
                };
                r.holder[0] = 100 + t as u64;
                r.holder[1] = 200 + t as u64;
                Mutex::new(Some(r))
            })
            .collect();
        Mini {
            rows,
            check_then_act,
        }
    }

    /// `Ledger::reserve_all`: one row at a time, all or nothing.
    fn reserve_all(&self, tids: &[usize], id: u64) -> Result<Vec<Res>, Vec<(usize, usize)>> {
        let mut got = Vec::new();
        let mut conflicts = Vec::new();
        for &t in tids {
            let slot = if self.check_then_act {
                let free = {
                    let g = self.rows[t].lock().unwrap();
                    let Some(row) = g.as_ref() else { continue };
                    if row.slot_of(id).is_some() {
                        continue;
                    }
                    !(row.ours | row.pending) & ALL
                };
                if free == 0 {
                    conflicts.push((t, SLOTS));
                    continue;
                }
                let s = free.trailing_zeros() as u8;
                let mut g = self.rows[t].lock().unwrap();
                let Some(row) = g.as_mut() else { continue };
                row.pending |= 1 << s;
                row.holder[s as usize] = id;
                s
            } else {
                let mut g = self.rows[t].lock().unwrap();
                let Some(row) = g.as_mut() else { continue };
                if row.slot_of(id).is_some() {
                    continue;
                }
                let free = !(row.ours | row.pending) & ALL;
                if free == 0 {
                    conflicts.push((t, row.holders()));
                    continue;
                }
                let s = free.trailing_zeros() as u8;
                row.pending |= 1 << s;
                row.holder[s as usize] = id;
                s
            };
            got.push((t, slot));
        }
        if conflicts.is_empty() {
            Ok(got)
        } else {
            self.rollback(&got);
            Err(conflicts)
        }
    }

    fn commit(&self, res: &[Res]) {
        for &(t, s) in res {
            if let Some(row) = self.rows[t].lock().unwrap().as_mut() {
                row.pending &= !(1 << s);
                row.ours |= 1 << s;
            }
        }
    }

    fn rollback(&self, res: &[Res]) {
        for &(t, s) in res {
            if let Some(row) = self.rows[t].lock().unwrap().as_mut()
                && row.pending & (1 << s) != 0
            {
                row.pending &= !(1 << s);
                row.holder[s as usize] = 0;
            }
        }
    }

    fn release(&self, t: usize, id: u64) {
        if let Some(row) = self.rows[t].lock().unwrap().as_mut() {
            for s in 0..SLOTS {
                if (row.ours | row.pending) & (1 << s) != 0 && row.holder[s] == id {
                    row.ours &= !(1 << s);
                    row.pending &= !(1 << s);
                    row.holder[s] = 0;
                }
            }
        }
    }

    fn remove_thread(&self, t: usize) {
        *self.rows[t].lock().unwrap() = None;
    }

    /// (pending, committed) state of `id` on `t`; None if the row is gone.
    fn state(&self, t: usize, id: u64) -> Option<Option<(usize, bool)>> {
        let g = self.rows[t].lock().unwrap();
        let row = g.as_ref()?;
        Some(row.slot_of(id).map(|s| (s, row.ours & (1 << s) != 0)))
    }
}

/// What a task leaves committed: (id, reservations).
type Outcome = Option<(u64, Vec<Res>)>;

/// One request: reserve `tids` for `id`, check, "syscall" (a scheduling
/// point), then commit (or roll back), and maybe release again.
fn request(m: &Mini, tids: &[usize], id: u64, commit: bool, release: bool) -> Outcome {
    match m.reserve_all(tids, id) {
        Ok(res) => {
            for &(t, s) in &res {
                if let Some(st) = m.state(t, id) {
                    assert_eq!(st, Some((s as usize, false)), "{id}: reserved slot of {t}");
                }
            }
            thread::yield_now(); // the syscall: no guard held
            if !commit {
                m.rollback(&res);
                for &t in tids {
                    assert_eq!(m.state(t, id).flatten(), None, "{id}: rolled back on {t}");
                }
                return None;
            }
            m.commit(&res);
            for &(t, s) in &res {
                if let Some(st) = m.state(t, id) {
                    assert_eq!(st, Some((s as usize, true)), "{id}: committed slot of {t}");
                }
            }
            if release {
                for &(t, _) in &res {
                    m.release(t, id);
                }
                return None;
            }
            Some((id, res))
        }
        Err(conflicts) => {
            for &(t, holders) in &conflicts {
                assert!(tids.contains(&t));
                assert_eq!(
                    holders, SLOTS,
                    "{id}: conflict on a thread that was not full"
                );
            }
            for &t in tids {
                assert_eq!(
                    m.state(t, id).flatten(),
                    None,
                    "{id}: refused, still on {t}"
                );
            }
            None
        }
    }
}

fn scenario(check_then_act: bool) {
    let m = Arc::new(Mini::new(check_then_act));
    let requests: [(&[usize], u64, bool, bool); 4] = [
        (&[0, 1], 1, true, false),
        (&[1, 2], 2, true, true),
        (&[0, 1, 2], 3, true, false),
        (&[2, 0], 4, false, false),
    ];
    let mut tasks = Vec::new();
    for (tids, id, commit, release) in requests {
        let m = m.clone();
        tasks.push(thread::spawn(move || {
            request(&m, tids, id, commit, release)
        }));
    }
    // A thread exits meanwhile.
    let exit = {
        let m = m.clone();
        thread::spawn(move || m.remove_thread(2))
    };
    let outcomes: Vec<Outcome> = tasks.into_iter().map(|h| h.join().unwrap()).collect();
    exit.join().unwrap();

    let mut want: BTreeMap<(usize, u8), u64> = BTreeMap::new();
    for t in 0..ROWS {
        want.insert((t, 0), 100 + t as u64);
        want.insert((t, 1), 200 + t as u64);
    }
    for (id, res) in outcomes.into_iter().flatten() {
        for (t, s) in res {
            let prev = want.insert((t, s), id);
            assert!(prev.is_none(), "slot {s} of {t}: {prev:?} and {id}");
        }
    }
    for t in 0..ROWS {
        let g = m.rows[t].lock().unwrap();
        let Some(row) = g.as_ref() else { continue };
        assert_eq!(row.pending, 0, "row {t}: {row:?}");
        for s in 0..SLOTS as u8 {
            let held = (row.ours & (1 << s) != 0).then_some(row.holder[s as usize]);
            assert_eq!(
                held,
                want.get(&(t, s)).copied(),
                "row {t} slot {s}: {row:?}"
            );
        }
    }
}

#[test]
fn reserve_commit_rollback_protocol_pct() {
    shuttle::check_pct(|| scenario(false), 3_000, 3);
}

#[test]
fn reserve_commit_rollback_protocol_random() {
    shuttle::check_random(|| scenario(false), 3_000);
}

/// What the scenario's invariants say when one breaks (any of them may be
/// the first to see the planted race, depending on the schedule).
const INVARIANTS: &[&str] = &[
    "reserved slot of",
    "rolled back on",
    "committed slot of",
    "conflict on a thread that was not full",
    "refused, still on",
    "slot ",
    "row ",
];

#[test]
fn check_then_act_is_caught() {
    let caught = std::panic::catch_unwind(|| shuttle::check_pct(|| scenario(true), 3_000, 3));
    let Err(payload) = caught else {
        panic!("the planted check-then-act race went unnoticed in 3,000 schedules");
    };
    let msg = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        INVARIANTS.iter().any(|k| msg.contains(k)),
        "the scenario failed, but not on one of its invariants: {msg:?}"
    );
}
