//! Which hits a watchpoint reports: a condition on the value at the hit,
//! the first N hits ignored, every Nth reported, a rate limit. Judged by
//! the backend where it decodes the hit, before anything is queued (and,
//! with the ptrace backend, before a thread is held: a hit that is not
//! reported never stops anyone).
//!
//! Order, as debuggers do it: the condition first; the ignore count and
//! the hit count count the hits whose condition held; the rate limit last,
//! on what would be reported. The value is the watched piece's bytes
//! (perf: read at the trap or just after the hit; ptrace: read while the
//! thread is stopped), compared as the watched type reads them ([`View`]:
//! `value.rs` binds a condition's text to the type). A hit whose value
//! could not be read is reported, with its error: a condition it cannot
//! judge hides nothing.
//!
//! This module is the definition of what a condition means; the perf
//! backend's BPF program (`backend/perf/ring/judge.rs`) computes the same with
//! [`sign_extend`] and [`float_key`], and its tests run that program in the
//! kernel against [`Condition::holds`].

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

impl CmpOp {
    /// Whether `a OP b` holds for `a`, `b` in that order.
    pub fn of(self, order: std::cmp::Ordering) -> bool {
        use std::cmp::Ordering::*;
        match self {
            CmpOp::Eq => order == Equal,
            CmpOp::Ne => order != Equal,
            CmpOp::Lt => order == Less,
            CmpOp::Le => order != Greater,
            CmpOp::Gt => order == Greater,
            CmpOp::Ge => order != Less,
        }
    }

    /// As C writes it.
    pub fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }
}

/// How the value at a hit and a condition's operand compare: as the
/// watched type reads its bytes (as many as the watched piece has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// A little-endian unsigned integer, masked: what a watchpoint with no
    /// type reads, and any masked comparison.
    Unsigned,
    /// A two's-complement signed integer (sign-extended to 64 bits).
    Signed,
    /// IEEE 754 floating point: a `float` in 4 bytes, a `double` in 8. As
    /// IEEE 754 compares: -0.0 equals 0.0, and a NaN is unordered (only
    /// `!=` holds).
    Float,
}

/// A condition on the value at the hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// `value OP operand`, the value read as `view` reads it.
    Compare {
        /// The comparison.
        op: CmpOp,
        /// The right-hand side, as `view` holds it: unsigned bits, a
        /// signed value's 64-bit two's complement, a float's bits in the
        /// watched size (an `f32`'s in the low 32 bits).
        operand: u64,
        /// Bits of the value compared (all: `u64::MAX`); only with
        /// [`View::Unsigned`].
        mask: u64,
        /// How value and operand compare.
        view: View,
    },
    /// The value's bytes differ from those seen at the previous hit (the
    /// first hit is reported).
    Changed,
}

/// The `len`-byte (1 to 8) little-endian value `raw` as a signed integer.
pub fn sign_extend(raw: u64, len: usize) -> i64 {
    let shift = 64 - 8 * len.clamp(1, 8) as u32;
    ((raw << shift) as i64) >> shift
}

/// A float's bits (`len` 4: an `f32`'s in the low 32 bits; 8: an `f64`'s)
/// as an integer that orders as IEEE 754 orders the floats: the sign and
/// magnitude turned into a two's-complement number (the magnitude, negated
/// for a negative float). Over the floats that are not NaN, `a < b` exactly
/// when `float_key(a) < float_key(b)`, and `a == b` when the keys are equal
/// (so -0.0 and 0.0 are both 0); a NaN has no key. Exact: the magnitude's
/// bit pattern orders as the magnitudes do, and it fits 63 bits, so its
/// negation never overflows. The perf backend's BPF program computes it
/// with shifts, an xor and a subtraction, and compares keys signed.
pub fn float_key(bits: u64, len: usize) -> Option<i64> {
    let (negative, magnitude, infinity) = match len {
        4 => (bits >> 31 & 1 == 1, bits & 0x7fff_ffff, 0x7f80_0000),
        _ => (
            bits >> 63 == 1,
            bits & (u64::MAX >> 1),
            0x7ff0_0000_0000_0000,
        ),
    };
    if magnitude > infinity {
        return None;
    }
    let m = magnitude as i64;
    Some(if negative { -m } else { m })
}

impl Condition {
    /// Whether it holds for the value `bytes` (the watched piece's), the
    /// previous value's bytes being `previous` (`Changed`).
    pub fn holds(&self, bytes: &[u8], previous: Option<u64>) -> bool {
        let value = value_u64(bytes);
        match *self {
            Condition::Changed => previous != Some(value),
            Condition::Compare {
                op,
                operand,
                mask,
                view,
            } => match (view, bytes.len()) {
                (View::Signed, n) => op.of(sign_extend(value, n).cmp(&(operand as i64))),
                // Unordered (a NaN on either side): only `!=` holds.
                (View::Float, 4) => {
                    let (v, o) = (f32::from_bits(value as u32), f32::from_bits(operand as u32));
                    v.partial_cmp(&o)
                        .map_or(op == CmpOp::Ne, |order| op.of(order))
                }
                (View::Float, 8) => {
                    let (v, o) = (f64::from_bits(value), f64::from_bits(operand));
                    v.partial_cmp(&o)
                        .map_or(op == CmpOp::Ne, |order| op.of(order))
                }
                // A float of another size is never bound; its bits compare.
                (View::Unsigned | View::Float, _) => op.of((value & mask).cmp(&operand)),
            },
        }
    }
}

/// A condition as a client asked for it, before it is bound to the watched
/// type (`value::bind`, when the watchpoint is set and each time its name
/// is resolved again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// `changed`.
    Changed,
    /// `[& mask] OP rhs`.
    Compare {
        /// The comparison.
        op: CmpOp,
        /// The mask, if any (never 0).
        mask: Option<u64>,
        /// The right-hand side.
        rhs: Rhs,
    },
}

/// A condition's right-hand side as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rhs {
    /// As written (`-1`, `-273.15`, `DONE`): read against the type.
    Text(String),
    /// A number compared with the bytes as an unsigned integer, whatever
    /// the type (`HitCondition.operand` of clients that predate `value`).
    Unsigned(u64),
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
    range: &crate::range::Range,
    access: crate::range::Access,
) -> Result<(), String> {
    if f.condition.is_none() {
        return Ok(());
    }
    if access == crate::range::Access::Exec {
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
            let previous = if matches!(c, Condition::Changed) {
                self.previous.lock().unwrap().replace(value_u64(v))
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
            condition: Some(Condition::Compare {
                op,
                operand,
                mask,
                view: View::Unsigned,
            }),
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

    /// `value OP operand` read as `view` holds exactly for the `values`
    /// marked true (each a value's bytes: their length is the watched
    /// size).
    fn check(view: View, op: CmpOp, operand: u64, values: &[(&[u8], bool)]) {
        let c = Condition::Compare {
            op,
            operand,
            mask: u64::MAX,
            view,
        };
        for &(bytes, expected) in values {
            assert_eq!(
                c.holds(bytes, None),
                expected,
                "{bytes:02x?} {} {operand:#x} as {view:?}",
                op.symbol()
            );
        }
    }

    #[test]
    fn conditions_compare_as_the_type_reads_the_value() {
        let long = |v: i64| v.to_le_bytes();
        let int = |v: i32| v.to_le_bytes();
        // `> 100` on a long holding -1: not as signed, as the bytes were.
        check(
            View::Signed,
            CmpOp::Gt,
            100,
            &[(&long(-1), false), (&long(101), true)],
        );
        check(View::Unsigned, CmpOp::Gt, 100, &[(&long(-1), true)]);
        // `< 0` on an int holding -7 (4 bytes, sign-extended).
        check(
            View::Signed,
            CmpOp::Lt,
            0,
            &[(&int(-7), true), (&int(7), false), (&int(0), false)],
        );
        // `== -1` on each size.
        let minus_one = -1i64 as u64;
        for bytes in [&[0xffu8][..], &[0xff; 2], &[0xff; 4], &[0xff; 8]] {
            check(View::Signed, CmpOp::Eq, minus_one, &[(bytes, true)]);
        }
        check(
            View::Signed,
            CmpOp::Eq,
            minus_one,
            &[(&[0xff, 0x7f], false), (&[0x7f], false)],
        );
        check(
            View::Signed,
            CmpOp::Ge,
            i64::MIN as u64,
            &[(&long(i64::MIN), true), (&long(i64::MAX), true)],
        );
        check(
            View::Signed,
            CmpOp::Le,
            -128i64 as u64,
            &[(&[0x80], true), (&[0x81], false)],
        );
        // Doubles: `< -273` on -273.15 and on -272.9, NaN, the zeros.
        let d = |v: f64| v.to_le_bytes();
        let f = |v: f32| v.to_le_bytes();
        let minus_273 = (-273.0f64).to_bits();
        check(
            View::Float,
            CmpOp::Lt,
            minus_273,
            &[
                (&d(-273.15), true),
                (&d(-272.9), false),
                (&d(-273.0), false),
                (&d(f64::NEG_INFINITY), true),
                (&d(f64::NAN), false),
                (&d(-f64::NAN), false),
            ],
        );
        check(
            View::Float,
            CmpOp::Ne,
            minus_273,
            &[(&d(f64::NAN), true), (&d(-273.0), false)],
        );
        check(
            View::Float,
            CmpOp::Eq,
            0.0f64.to_bits(),
            &[(&d(-0.0), true), (&d(0.0), true)],
        );
        check(
            View::Float,
            CmpOp::Lt,
            0.0f64.to_bits(),
            &[(&d(-0.0), false), (&d(-5e-324), true)],
        );
        check(
            View::Float,
            CmpOp::Ge,
            u64::from(3.5f32.to_bits()),
            &[
                (&f(3.5), true),
                (&f(3.4999998), false),
                (&f(f32::INFINITY), true),
                (&f(f32::NAN), false),
            ],
        );
        check(
            View::Float,
            CmpOp::Eq,
            u64::from((-0.0f32).to_bits()),
            &[(&f(0.0), true)],
        );
    }

    /// Floats in IEEE 754 order, NaNs left out: for each exponent (every
    /// one of an `f32`'s, a spread of an `f64`'s), both signs, and the
    /// mantissas at its ends and between.
    fn ladder(len: usize) -> Vec<u64> {
        let (exp_bits, man_bits) = if len == 4 { (8, 23) } else { (11, 52) };
        let exps: Vec<u64> = if len == 4 {
            (0..1 << exp_bits).collect()
        } else {
            (0..1u64 << exp_bits)
                .filter(|e| *e < 4 || *e > 2043 || e % 61 == 0 || (1019..1030).contains(e))
                .collect()
        };
        let top = (1u64 << man_bits) - 1;
        let mans = [0, 1, 2, top / 3, top / 2, top - 1, top];
        let mut up = Vec::new();
        for e in exps {
            for &m in &mans {
                let bits = e << man_bits | m;
                // Past infinity: NaNs.
                if e == (1 << exp_bits) - 1 && m != 0 {
                    continue;
                }
                up.push(bits);
            }
        }
        up.dedup();
        let sign = 1u64 << (8 * len - 1);
        let mut all: Vec<u64> = up.iter().rev().map(|b| b | sign).collect();
        all.extend(up);
        all
    }

    /// The key of every float of the ladder orders as the floats do (both
    /// zeros 0), and NaNs have none: the encoding the BPF program
    /// compares is IEEE 754's order, checked pair by pair against the
    /// floats' own comparison.
    #[test]
    fn float_keys_order_as_ieee_754_does() {
        for len in [4, 8] {
            let floats = ladder(len);
            let value = |b: u64| {
                if len == 4 {
                    f64::from(f32::from_bits(b as u32))
                } else {
                    f64::from_bits(b)
                }
            };
            let keys: Vec<i64> = floats.iter().map(|&b| float_key(b, len).unwrap()).collect();
            for (i, (&a, &ka)) in floats.iter().zip(&keys).enumerate() {
                // Neighbours first (cheap and the likeliest to break).
                if let Some(&kb) = keys.get(i + 1) {
                    assert!(ka < kb || (ka == 0 && kb == 0), "{a:#x}: {ka} then {kb}");
                }
                for (&b, &kb) in floats.iter().zip(&keys).step_by(7) {
                    assert_eq!(
                        value(a).partial_cmp(&value(b)),
                        Some(ka.cmp(&kb)),
                        "{a:#x} against {b:#x}"
                    );
                }
            }
            let (nan, inf) = if len == 4 {
                (0x7fc0_0000u64, 0x7f80_0000u64)
            } else {
                (0x7ff8_0000_0000_0000, 0x7ff0_0000_0000_0000)
            };
            let sign = 1u64 << (8 * len - 1);
            for b in [
                nan,
                nan | sign,
                inf + 1,
                (inf + 1) | sign,
                inf | (inf >> 1) | sign,
            ] {
                assert_eq!(float_key(b, len), None, "{b:#x} is a NaN");
            }
        }
    }

    #[test]
    fn narrow_values_sign_extend() {
        assert_eq!(sign_extend(0xff, 1), -1);
        assert_eq!(sign_extend(0x7f, 1), 127);
        assert_eq!(sign_extend(0x8000, 2), -32768);
        assert_eq!(sign_extend(0xffff_fff9, 4), -7);
        assert_eq!(sign_extend(u64::MAX, 8), -1);
    }

    #[test]
    fn ignore_and_every_count_the_hits_whose_condition_held() {
        let f = HitFilter {
            condition: Some(Condition::Compare {
                op: CmpOp::Ne,
                operand: 0,
                mask: u64::MAX,
                view: View::Unsigned,
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
