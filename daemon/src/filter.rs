//! Which hits a watchpoint reports: a condition on the value at the hit,
//! the first N hits ignored, every Nth reported, a rate limit. Judged by
//! the backend where it decodes the hit, before anything is queued (and,
//! with the ptrace backend, before a thread is held: a hit that is not
//! reported never stops anyone).
//!
//! Order, as debuggers do it: the condition first; the ignore count and
//! the hit count count the hits whose condition held; the rate limit last,
//! on what would be reported. The value is the watched piece's bytes as a
//! little-endian unsigned integer (perf: read just after the hit; ptrace:
//! read while the thread is stopped). A hit whose value could not be read
//! is reported, with its error: a condition it cannot judge hides nothing.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// A comparison of the value at the hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// `==`.
    Eq,
    /// `!=`.
    Ne,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
}

/// A condition on the value at the hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// `(value & mask) OP operand`, unsigned.
    Compare {
        /// The comparison.
        op: CmpOp,
        /// The right-hand side.
        operand: u64,
        /// Bits of the value compared (all: `u64::MAX`).
        mask: u64,
    },
    /// The value differs from the one seen at the previous hit (the first
    /// hit is reported).
    Changed,
}

impl Condition {
    fn holds(&self, value: u64, previous: Option<u64>) -> bool {
        match *self {
            Condition::Changed => previous != Some(value),
            Condition::Compare { op, operand, mask } => {
                let v = value & mask;
                match op {
                    CmpOp::Eq => v == operand,
                    CmpOp::Ne => v != operand,
                    CmpOp::Lt => v < operand,
                    CmpOp::Le => v <= operand,
                    CmpOp::Gt => v > operand,
                    CmpOp::Ge => v >= operand,
                }
            }
        }
    }
}

/// What a watchpoint reports of its hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HitFilter {
    /// Report only hits where this holds.
    pub condition: Option<Condition>,
    /// Skip the first N hits (whose condition held).
    pub ignore: u64,
    /// Report every Nth of the others (0 and 1: every one).
    pub every: u64,
    /// At most this many reported hits per second (0: no limit); the
    /// others are dropped and counted.
    pub max_per_second: u32,
}

impl HitFilter {
    /// Every hit is reported.
    pub fn is_empty(&self) -> bool {
        self.condition.is_none() && self.ignore == 0 && self.every <= 1 && self.max_per_second == 0
    }
}

/// Whether `f` can apply to a watchpoint of `range` and `access`.
pub fn check(
    f: &HitFilter,
    range: &crate::model::Range,
    access: crate::model::Access,
) -> Result<(), String> {
    if f.condition.is_none() {
        return Ok(());
    }
    if access == crate::model::Access::Exec {
        return Err(
            "a condition is on the value written or read: an exec watchpoint has none".into(),
        );
    }
    if range.pieces.len() > 1 {
        return Err(format!(
            "a condition applies to a watchpoint of one slot (at most 8 aligned bytes); this one \
             takes {} (watch the member or element the condition is about)",
            range.pieces.len()
        ));
    }
    Ok(())
}

/// What becomes of one hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Reported; `limited_before` hits were dropped by the rate limit since
    /// the previous one reported.
    Report {
        /// Dropped since the previous report.
        limited_before: u64,
    },
    /// Not reported: the condition did not hold, or ignored, or not the Nth.
    Filtered,
    /// Not reported: over the rate limit.
    Limited,
}

/// A watchpoint's running counts.
#[derive(Debug, Default)]
pub struct FilterState {
    /// Hits whose condition held.
    matched: AtomicU64,
    /// Hits not reported by the condition, the ignore count or the hit
    /// count.
    filtered: AtomicU64,
    /// Hits dropped by the rate limit, in all.
    limited: AtomicU64,
    /// ... and since the last one reported.
    limited_since: AtomicU64,
    /// The value at the previous hit (`Changed`).
    previous: Mutex<Option<u64>>,
    /// Rate limit: (tokens, when last refilled, ns).
    bucket: Mutex<(f64, u64)>,
}

/// The little-endian value of up to 8 bytes.
pub fn value_u64(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = bytes.len().min(8);
    b[..n].copy_from_slice(&bytes[..n]);
    u64::from_le_bytes(b)
}

impl FilterState {
    /// Judges one hit: `value` is the watched bytes (`None`: unreadable),
    /// `now_ns` a monotonic time.
    pub fn judge(&self, f: &HitFilter, value: Option<&[u8]>, now_ns: u64) -> Verdict {
        if f.is_empty() {
            return Verdict::Report { limited_before: 0 };
        }
        if let (Some(c), Some(v)) = (&f.condition, value) {
            let v = value_u64(v);
            let previous = if matches!(c, Condition::Changed) {
                self.previous.lock().unwrap().replace(v)
            } else {
                None
            };
            if !c.holds(v, previous) {
                self.filtered.fetch_add(1, Ordering::Relaxed);
                return Verdict::Filtered;
            }
        }
        let n = self.matched.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= f.ignore || (f.every > 1 && !(n - f.ignore).is_multiple_of(f.every)) {
            self.filtered.fetch_add(1, Ordering::Relaxed);
            return Verdict::Filtered;
        }
        if f.max_per_second > 0 {
            let rate = f64::from(f.max_per_second);
            let mut b = self.bucket.lock().unwrap();
            let (tokens, last) = *b;
            // A fresh bucket is full: the first second's hits are reported.
            let tokens = if last == 0 {
                rate
            } else {
                (tokens + now_ns.saturating_sub(last) as f64 * rate / 1e9).min(rate)
            };
            if tokens < 1.0 {
                *b = (tokens, now_ns);
                drop(b);
                self.limited.fetch_add(1, Ordering::Relaxed);
                self.limited_since.fetch_add(1, Ordering::Relaxed);
                return Verdict::Limited;
            }
            *b = (tokens - 1.0, now_ns);
        }
        Verdict::Report {
            limited_before: self.limited_since.swap(0, Ordering::Relaxed),
        }
    }

    /// (hits filtered, hits dropped by the rate limit) so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.filtered.load(Ordering::Relaxed),
            self.limited.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(f: HitFilter, values: &[u64]) -> Vec<usize> {
        let s = FilterState::default();
        values
            .iter()
            .enumerate()
            .filter(|(_, v)| {
                matches!(
                    s.judge(&f, Some(&v.to_le_bytes()), 1),
                    Verdict::Report { .. }
                )
            })
            .map(|(i, _)| i)
            .collect()
    }

    #[test]
    fn conditions_compare_the_masked_value() {
        let cmp = |op, operand, mask| HitFilter {
            condition: Some(Condition::Compare { op, operand, mask }),
            ..Default::default()
        };
        let v = [5, 7, 9, 7, 0x107];
        assert_eq!(run(cmp(CmpOp::Eq, 7, u64::MAX), &v), [1, 3]);
        assert_eq!(run(cmp(CmpOp::Eq, 7, 0xff), &v), [1, 3, 4]);
        assert_eq!(run(cmp(CmpOp::Ne, 7, u64::MAX), &v), [0, 2, 4]);
        assert_eq!(run(cmp(CmpOp::Lt, 7, u64::MAX), &v), [0]);
        assert_eq!(run(cmp(CmpOp::Le, 7, u64::MAX), &v), [0, 1, 3]);
        assert_eq!(run(cmp(CmpOp::Gt, 7, u64::MAX), &v), [2, 4]);
        assert_eq!(run(cmp(CmpOp::Ge, 9, u64::MAX), &v), [2, 4]);
        let changed = HitFilter {
            condition: Some(Condition::Changed),
            ..Default::default()
        };
        assert_eq!(run(changed, &[1, 1, 2, 2, 2, 1]), [0, 2, 5]);
    }

    #[test]
    fn ignore_and_every_count_the_hits_whose_condition_held() {
        let f = HitFilter {
            condition: Some(Condition::Compare {
                op: CmpOp::Ne,
                operand: 0,
                mask: u64::MAX,
            }),
            ignore: 2,
            every: 3,
            max_per_second: 0,
        };
        // Matching: indices 0,1,3,4,5,6,7,8,9 (value 0 at 2 never counts);
        // the first two ignored, then every third of the rest.
        let v = [1, 1, 0, 1, 1, 1, 1, 1, 1, 1];
        assert_eq!(run(f, &v), [5, 8]);
        let s = FilterState::default();
        for x in v {
            s.judge(&f, Some(&[x as u8]), 1);
        }
        assert_eq!(s.counts(), (8, 0));
    }

    #[test]
    fn an_unreadable_value_is_reported() {
        let f = HitFilter {
            condition: Some(Condition::Changed),
            ..Default::default()
        };
        let s = FilterState::default();
        assert_eq!(s.judge(&f, None, 1), Verdict::Report { limited_before: 0 });
    }

    #[test]
    fn the_rate_limit_drops_and_counts() {
        let f = HitFilter {
            max_per_second: 10,
            ..Default::default()
        };
        let s = FilterState::default();
        let mut reported = 0;
        // 100 hits within 1 ms: the full bucket's 10.
        for i in 0..100 {
            if let Verdict::Report { .. } = s.judge(&f, Some(&[0]), 1_000_000_000 + i * 10_000) {
                reported += 1;
            }
        }
        assert_eq!((reported, s.counts().1), (10, 90));
        // 200 ms later, two tokens: the next report says 90 were dropped.
        assert_eq!(
            s.judge(&f, Some(&[0]), 1_200_000_000),
            Verdict::Report { limited_before: 90 }
        );
        assert_eq!(
            s.judge(&f, Some(&[0]), 1_200_000_001),
            Verdict::Report { limited_before: 0 }
        );
        assert_eq!(s.judge(&f, Some(&[0]), 1_200_000_002), Verdict::Limited);
    }

    #[test]
    fn values_are_little_endian() {
        assert_eq!(value_u64(&[0x01, 0x02]), 0x0201);
        assert_eq!(value_u64(&[0xff; 8]), u64::MAX);
        assert_eq!(value_u64(&[]), 0);
    }
}
