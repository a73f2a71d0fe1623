//! Waiting for tracees: requests that complete when a number of tracees
//! have done something ([`Countdowns`]: programs applied, threads parked,
//! threads detached), and the queue of parked tracees that a safety net
//! releases after [`PARK_MAX`] ([`ParkQueue`]).

use std::collections::HashMap;
use std::sync::mpsc;

use crate::model::Tid;

/// Longest a tracee stays parked if nobody unparks it (a safety net: the
/// core unparks on every way out of an arm, panics included).
pub const PARK_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// A request waiting for `remaining` tracees, gathering what they report
/// into `acc`, answered with it once all have.
struct Countdown<R> {
    remaining: usize,
    acc: R,
    reply: mpsc::Sender<R>,
}

/// The tracer's open [`Countdown`]s of one kind, by request id.
pub(super) struct Countdowns<R> {
    open: HashMap<u64, Countdown<R>>,
}

impl<R> Default for Countdowns<R> {
    fn default() -> Self {
        Countdowns {
            open: HashMap::new(),
        }
    }
}

impl<R> Countdowns<R> {
    /// Opens request `id`, waiting for `remaining` tracees; answered at once
    /// if none.
    pub(super) fn start(&mut self, id: u64, remaining: usize, acc: R, reply: mpsc::Sender<R>) {
        self.open.insert(
            id,
            Countdown {
                remaining,
                acc,
                reply,
            },
        );
        self.finish_if_done(id);
    }

    /// One tracee of request `id` is done; `add` records what it reports.
    pub(super) fn progress(&mut self, id: u64, add: impl FnOnce(&mut R)) {
        if let Some(c) = self.open.get_mut(&id) {
            c.remaining = c.remaining.saturating_sub(1);
            add(&mut c.acc);
        }
        self.finish_if_done(id);
    }

    fn finish_if_done(&mut self, id: u64) {
        if self.open.get(&id).is_some_and(|c| c.remaining == 0)
            && let Some(c) = self.open.remove(&id)
        {
            let _ = c.reply.send(c.acc);
        }
    }

    /// Gives back spare capacity.
    pub(super) fn shrink(&mut self) {
        if self.open.capacity() > 4 * self.open.len() + 256 {
            self.open.shrink_to_fit();
        }
    }
}

/// Parked tracees, oldest first: (when, tracee, its `park_gen` then).
/// An entry whose park is over (the tracee was unparked, is gone, or was
/// parked again since: a later entry stands for that) is dropped without
/// effect as it reaches the front, so a thread parked by one request is
/// never released early by an older one's timeout, and the queue empties
/// once the parks it records are over.
#[derive(Debug, Default)]
pub(super) struct ParkQueue(pub(super) std::collections::VecDeque<(std::time::Instant, Tid, u32)>);

impl ParkQueue {
    /// The oldest tracee whose park, still `current(tid, park_gen)`, has
    /// lasted `max` at `now`, taken off the queue; entries of parks that are
    /// over are dropped on the way.
    pub(super) fn pop_due(
        &mut self,
        now: std::time::Instant,
        max: std::time::Duration,
        current: impl Fn(Tid, u32) -> bool,
    ) -> Option<Tid> {
        while let Some(&(at, tid, generation)) = self.0.front() {
            if current(tid, generation) {
                if now.saturating_duration_since(at) < max {
                    return None;
                }
                self.0.pop_front();
                return Some(tid);
            }
            self.0.pop_front();
        }
        None
    }

    /// How long after `now` the front entry is due (after [`Self::pop_due`]
    /// returned `None`: the front is a current park or the queue is empty).
    pub(super) fn next_due(
        &self,
        now: std::time::Instant,
        max: std::time::Duration,
    ) -> Option<std::time::Duration> {
        self.0
            .front()
            .map(|&(at, _, _)| max.saturating_sub(now.saturating_duration_since(at)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_countdown_answers_once_every_tracee_reported() {
        let (tx, rx) = mpsc::channel();
        let mut c: Countdowns<Vec<Tid>> = Countdowns::default();
        c.start(1, 2, Vec::new(), tx.clone());
        c.progress(1, |v| v.push(10));
        assert!(rx.try_recv().is_err());
        c.progress(1, |v| v.push(11));
        assert_eq!(rx.try_recv().unwrap(), vec![10, 11]);
        c.progress(1, |v| v.push(12)); // over: ignored
        c.start(2, 0, vec![], tx);
        assert_eq!(
            rx.try_recv().unwrap(),
            Vec::<Tid>::new(),
            "none to wait for"
        );
    }

    #[test]
    fn a_reparked_thread_outlives_the_older_parks_timeout() {
        use std::collections::HashMap;
        use std::time::{Duration, Instant};
        let max = Duration::from_secs(30);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut q = ParkQueue::default();
        // Current park generation of each parked tracee (absent: not parked).
        let mut parked: HashMap<Tid, u32> = HashMap::new();
        // 7 parked at 0 s, unparked, parked again at 20 s; 8 parked at 5 s;
        // 9 parked at 10 s, then gone.
        q.0.push_back((t0, 7, 1));
        q.0.push_back((t0 + s(5), 8, 1));
        q.0.push_back((t0 + s(10), 9, 1));
        q.0.push_back((t0 + s(20), 7, 2));
        parked.insert(7, 2);
        parked.insert(8, 1);
        let current = |p: &HashMap<Tid, u32>| {
            let p = p.clone();
            move |tid, generation| p.get(&tid) == Some(&generation)
        };

        // At 31 s, 7's first park is over: only 8 (parked at 5 s) is due at
        // 35 s, so nothing is released and the wait is 4 s.
        let now = t0 + s(31);
        assert_eq!(q.pop_due(now, max, current(&parked)), None);
        assert_eq!(q.next_due(now, max), Some(s(4)));
        assert_eq!(q.0.len(), 3, "7's stale entry is dropped");

        // At 36 s: 8 is released; 9 is gone; 7's second park is due at 50 s.
        let now = t0 + s(36);
        assert_eq!(q.pop_due(now, max, current(&parked)), Some(8));
        parked.remove(&8);
        assert_eq!(q.pop_due(now, max, current(&parked)), None);
        assert_eq!(q.next_due(now, max), Some(s(14)));
        assert_eq!(q.0.len(), 1);

        // At 50 s, 7 is released and the queue is empty.
        let now = t0 + s(50);
        assert_eq!(q.pop_due(now, max, current(&parked)), Some(7));
        parked.remove(&7);
        assert_eq!(q.pop_due(now, max, current(&parked)), None);
        assert_eq!(q.next_due(now, max), None);
        assert!(q.0.is_empty());
    }

    #[test]
    fn park_queue_drops_finished_parks_without_releasing_anything() {
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let mut q = ParkQueue::default();
        for tid in 1..=16_384 {
            q.0.push_back((t0, tid, 1));
        }
        // Every park was ended by its request: none is current.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(q.pop_due(later, PARK_MAX, |_, _| false), None);
        assert!(q.0.is_empty());
        assert_eq!(q.next_due(later, PARK_MAX), None);
    }
}
