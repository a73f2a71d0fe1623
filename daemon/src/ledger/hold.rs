//! How long the ledger's guards are held: a lock-free log2 histogram,
//! sampled one critical section in [`HOLD_SAMPLE`] per OS thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Lock hold-time histogram: bucket `i` counts holds of `[2^i, 2^(i+1))` ns.
#[derive(Debug)]
pub struct HoldHistogram {
    buckets: [AtomicU64; 40],
    max: AtomicU64,
}

impl Default for HoldHistogram {
    fn default() -> Self {
        HoldHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            max: AtomicU64::new(0),
        }
    }
}

impl HoldHistogram {
    /// Records one hold of `ns` nanoseconds.
    pub fn record(&self, ns: u64) {
        let b = (63 - ns.max(1).leading_zeros()) as usize;
        self.buckets[b.min(39)].fetch_add(1, Ordering::Relaxed);
        self.max.fetch_max(ns, Ordering::Relaxed);
    }

    /// (p50, p99, max) in ns. A percentile is the upper bound of its
    /// bucket, but never above the largest hold recorded: no percentile
    /// exceeds the maximum.
    pub fn summary(&self) -> (u64, u64, u64) {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let max = self.max.load(Ordering::Relaxed);
        let total: u64 = counts.iter().sum();
        let pct = |q: f64| {
            if total == 0 {
                return 0;
            }
            let want = ((total as f64) * q).ceil() as u64;
            let mut acc = 0;
            for (i, c) in counts.iter().enumerate() {
                acc += c;
                if acc >= want {
                    return (1u64 << (i + 1)).min(max);
                }
            }
            max
        };
        (pct(0.5), pct(0.99), max)
    }

    /// Times one critical section in every [`HOLD_SAMPLE`] (per OS thread):
    /// two clock reads cost about as much as the section itself, so timing
    /// all of them would double the ledger's cost. Sampling keeps the
    /// distribution.
    pub(super) fn timed(&self) -> Timed<'_> {
        let tick = HOLD_TICK.with(|c| {
            let v = c.get().wrapping_add(1);
            c.set(v);
            v
        });
        Timed(self, tick.is_multiple_of(HOLD_SAMPLE).then(Instant::now))
    }
}

/// One critical section in this many is timed.
pub const HOLD_SAMPLE: u32 = 64;

thread_local! {
    static HOLD_TICK: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// A timed critical section: records its length when dropped.
pub(super) struct Timed<'a>(&'a HoldHistogram, Option<Instant>);

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.1 {
            self.0.record(t.elapsed().as_nanos() as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HoldHistogram;

    #[test]
    fn no_percentile_exceeds_the_maximum() {
        let h = HoldHistogram::default();
        h.record(121); // bucket [64, 128)
        assert_eq!(h.summary(), (121, 121, 121));
        for _ in 0..98 {
            h.record(40);
        }
        h.record(3_000);
        let (p50, p99, max) = h.summary();
        assert_eq!(max, 3_000);
        assert_eq!(p50, 64, "the bucket of 40 ns ends at 64");
        assert!(p50 <= p99 && p99 <= max, "{p50} {p99} {max}");
    }

    #[test]
    fn empty_is_zero() {
        assert_eq!(HoldHistogram::default().summary(), (0, 0, 0));
    }
}
