//! Aggregate mode (`WatchpointSpec.aggregate`): a watchpoint hit very often
//! keeps, per (instruction, thread), a count, the first and last time and
//! the latest distinct values, and streams only a bounded number of hits a
//! second as samples. Every hit is counted somewhere: in its aggregate, or,
//! past the table's bound, in `overflow`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::model::Tid;

/// Most (instruction, thread) pairs kept per watchpoint.
pub const MAX_ENTRIES: usize = 1 << 16;
/// Distinct values kept per aggregate.
pub const VALUES: usize = 4;
/// Samples streamed per second when the spec says 0.
pub const DEFAULT_EXEMPLARS: u32 = 10;
/// Most samples a second a spec may ask for.
pub const MAX_EXEMPLARS: u32 = 10_000;

/// Hits of one instruction by one thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Agg {
    pub count: u64,
    pub first_ns: u64,
    pub last_ns: u64,
    /// Latest distinct values, oldest first.
    pub values: Vec<Vec<u8>>,
    /// The thread's name at its first hit here.
    pub thread_name: std::sync::Arc<str>,
    /// The process of its thread (the watched one, or a forked child).
    pub pid: crate::model::Pid,
    /// Who that process was at its latest hit here: who may see the entry
    /// (`authz::Visibility::admits`), as for the hits themselves.
    pub owner: Option<std::sync::Arc<crate::events::Owner>>,
}

/// A watchpoint's aggregates.
#[derive(Debug)]
pub struct Aggregates {
    per_second: u32,
    table: Mutex<HashMap<(u64, Tid), Agg>>,
    hits: AtomicU64,
    exemplars: AtomicU64,
    overflow: AtomicU64,
    /// Sample budget: (tokens, last refill ns).
    bucket: Mutex<(f64, u64)>,
}

impl Aggregates {
    /// Aggregates streaming `per_second` samples a second.
    pub fn new(per_second: u32) -> Aggregates {
        Aggregates {
            per_second,
            table: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
            exemplars: AtomicU64::new(0),
            overflow: AtomicU64::new(0),
            bucket: Mutex::new((f64::from(per_second), 0)),
        }
    }

    /// Counts a hit (`name` gives the thread's name for a new pair); true
    /// when it is to be streamed as a sample.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        ip: u64,
        (pid, tid): (crate::model::Pid, Tid),
        owner: Option<&std::sync::Arc<crate::events::Owner>>,
        value: Option<&[u8]>,
        time_ns: u64,
        now_ns: u64,
        name: impl FnOnce() -> std::sync::Arc<str>,
    ) -> bool {
        self.hits.fetch_add(1, Ordering::Relaxed);
        {
            let mut t = self.table.lock().unwrap();
            let len = t.len();
            match t.get_mut(&(ip, tid)) {
                Some(a) => {
                    update(a, value, time_ns);
                    if owner.is_some() && a.owner.as_ref() != owner {
                        a.owner = owner.cloned();
                    }
                }
                None if len < MAX_ENTRIES => {
                    let mut a = Agg {
                        first_ns: time_ns,
                        thread_name: name(),
                        pid,
                        owner: owner.cloned(),
                        ..Default::default()
                    };
                    update(&mut a, value, time_ns);
                    t.insert((ip, tid), a);
                }
                None => {
                    self.overflow.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let rate = f64::from(self.per_second);
        let mut b = self.bucket.lock().unwrap();
        if b.1 != 0 {
            let dt = now_ns.saturating_sub(b.1) as f64 / 1e9;
            b.0 = (b.0 + dt * rate).min(rate.max(1.0));
        }
        b.1 = now_ns;
        if b.0 >= 1.0 {
            b.0 -= 1.0;
            self.exemplars.fetch_add(1, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// (hits, exemplars, overflow).
    pub fn totals(&self) -> (u64, u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.exemplars.load(Ordering::Relaxed),
            self.overflow.load(Ordering::Relaxed),
        )
    }

    /// The aggregates by count, highest first (the first `limit`, or all
    /// with 0).
    pub fn top(&self, limit: usize) -> Vec<((u64, Tid), Agg)> {
        let mut v: Vec<_> = self
            .table
            .lock()
            .unwrap()
            .iter()
            .map(|(k, a)| (*k, a.clone()))
            .collect();
        v.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(&b.0)));
        if limit > 0 {
            v.truncate(limit);
        }
        v
    }
}

fn update(a: &mut Agg, value: Option<&[u8]>, time_ns: u64) {
    a.count += 1;
    a.last_ns = time_ns;
    if let Some(v) = value
        && a.values.last().map(|l| &l[..]) != Some(v)
    {
        a.values.retain(|x| &x[..] != v);
        if a.values.len() >= VALUES {
            a.values.remove(0);
        }
        a.values.push(v.to_vec());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_hit_and_samples_at_the_rate() {
        let a = Aggregates::new(2);
        let mut sampled = 0;
        // 1,000 hits in one second from two instructions and two threads.
        for i in 0..1_000u64 {
            let t = i * 1_000_000;
            let v = (i % 10).to_le_bytes();
            if a.record(
                0x10 + (i % 2),
                (7, 7 + (i % 2) as i32),
                None,
                Some(&v),
                t,
                t,
                || "w".into(),
            ) {
                sampled += 1;
            }
        }
        let (hits, ex, over) = a.totals();
        assert_eq!((hits, over), (1_000, 0));
        // A full bucket (2) then 2 a second over ~1 s.
        assert!((3..=5).contains(&sampled), "{sampled} samples");
        assert_eq!(ex, sampled);
        let top = a.top(0);
        assert_eq!(top.len(), 2);
        assert_eq!(top.iter().map(|t| t.1.count).sum::<u64>(), 1_000);
        let first = &top[0].1;
        assert_eq!(first.values.len(), VALUES);
        assert!(first.first_ns < first.last_ns);
    }

    #[test]
    fn beyond_the_table_hits_are_counted_in_overflow() {
        let a = Aggregates::new(1);
        for i in 0..(MAX_ENTRIES as u64 + 10) {
            a.record(i, (1, 1), None, None, i, i, || "w".into());
        }
        let (hits, _, over) = a.totals();
        assert_eq!(hits, MAX_ENTRIES as u64 + 10);
        assert_eq!(over, 10);
        assert_eq!(a.top(5).len(), 5);
    }
}
