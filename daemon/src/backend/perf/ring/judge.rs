//! What a watchpoint's program judges at the trap ([`Judge`]): its
//! condition, ignore and hit counts, and the signal action, assembled in
//! front of the record.

use crate::arch::current::perf_ctx::ADDR as CTX_ADDR;
use crate::bpf::{self, Cmp, Program, asm, helper};

/// What a watchpoint's program judges at the trap (issue of conditions
/// judged on a value read later, and of a signal sent after the writer ran
/// on): the filter but its rate limit (the daemon keeps that on what is
/// reported), and the signal action. Its counters live in `state`, one
/// value of [`JUDGE_WORDS`] u64s:
///
/// | word | what |
/// |---|---|
/// | 0 | hits whose condition held (ignore and hit counts count these) |
/// | 1 | hits filtered at the trap |
/// | 2 | the value at the previous hit (`changed`) |
/// | 3 | a hit was seen (`changed`: the first is reported) |
/// | 4 | when the last signal was sent (ns) |
/// | 5 | signals sent |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judge {
    /// The condition (none: every hit holds).
    pub condition: Option<crate::filter::Condition>,
    /// Hits (whose condition held) skipped first.
    pub ignore: u64,
    /// Report every Nth of the rest (0 and 1: each).
    pub every: u64,
    /// Signal the hitting thread (the signal action).
    pub signal: Option<i32>,
    /// Least time between two signals (from the rate limit; 0: none).
    pub spacing_ns: u64,
}

/// u64 words of a judge's state value.
pub const JUDGE_WORDS: usize = 6;

impl Judge {
    /// The judge of a watchpoint with `filter` and `action`, if it needs
    /// one (a filter beyond a rate limit, or a signal).
    pub fn of(filter: &crate::filter::HitFilter, action: crate::model::HitAction) -> Option<Judge> {
        let signal = match action {
            crate::model::HitAction::Signal(s) => Some(s),
            _ => None,
        };
        let j = Judge {
            condition: filter.condition,
            ignore: filter.ignore,
            every: filter.every,
            signal,
            spacing_ns: match (signal, filter.max_per_second) {
                (Some(_), r) if r > 0 => 1_000_000_000 / u64::from(r),
                _ => 0,
            },
        };
        (j.condition.is_some() || j.ignore > 0 || j.every > 1 || j.signal.is_some()).then_some(j)
    }
}

/// Judges the hit (the module's [`Judge`]): registers r6 the context;
/// uses r8 (the value) and r9 (the state); falls through to `report`, or
/// counts the hit filtered and returns.
pub(super) fn judge(p: &mut Program, j: &Judge, state: i32, len: u32, report: bpf::Label) {
    use crate::filter::Condition;
    let (filtered, held) = (p.label(), p.label());
    // The value, as the program reads it for the record: `len` bytes into
    // a zeroed stack word (little-endian, as `filter::value_u64`).
    p.push([
        asm::mov_imm(1, 0),
        asm::stx_dw(10, -8, 1),
        asm::mov(1, 10),
        asm::add_imm(1, -8),
        asm::mov_imm(2, len.clamp(1, 8) as i32),
        asm::ldx_dw(3, 6, CTX_ADDR),
        asm::call(helper::PROBE_READ_USER),
    ]);
    // Unreadable: reported, with its error (a condition it cannot judge
    // hides nothing), and nothing sent.
    p.jne_imm(0, 0, report);
    p.push([asm::ldx_dw(8, 10, -8)]);
    p.push(asm::ld_map_value(9, state, 0));
    match j.condition {
        Some(Condition::Changed) => {
            p.push([
                asm::mov(1, 8),
                asm::atomic_xchg_dw(9, 16, 1),
                asm::mov_imm(2, 1),
                asm::atomic_xchg_dw(9, 24, 2),
            ]);
            // The first hit holds; then a value equal to the previous one
            // does not.
            p.jeq_imm(2, 0, held);
            p.jump_if(Cmp::Eq, 1, 8, filtered);
        }
        Some(c @ Condition::Compare { .. }) => compare(p, &c, len, held, filtered),
        None => {}
    }
    p.place(held);
    if j.ignore > 0 || j.every > 1 {
        // n: this hit's number among those whose condition held.
        p.push([
            asm::mov_imm(1, 1),
            asm::atomic_fetch_add_dw(9, 0, 1),
            asm::add_imm(1, 1),
        ]);
        p.push(asm::ld_u64(2, j.ignore));
        p.jump_if(Cmp::Le, 1, 2, filtered);
        if j.every > 1 {
            p.push([asm::sub(1, 2)]);
            p.push(asm::ld_u64(2, j.every));
            p.push([asm::modulo(1, 2)]);
            p.jne_imm(1, 0, filtered);
        }
    }
    if let Some(sig) = j.signal {
        if j.spacing_ns > 0 {
            p.push([
                asm::call(helper::KTIME_GET_NS),
                asm::ldx_dw(1, 9, 32),
                asm::mov(2, 0),
                asm::sub(2, 1),
            ]);
            p.push(asm::ld_u64(3, j.spacing_ns));
            // Too soon after the last one: reported, not sent.
            p.jump_if(Cmp::Lt, 2, 3, report);
            p.push([asm::stx_dw(9, 32, 0)]);
        }
        p.push([
            asm::mov_imm(1, sig),
            asm::call(helper::SEND_SIGNAL_THREAD),
            asm::mov_imm(1, 1),
            asm::atomic_add_dw(9, 40, 1),
        ]);
    }
    p.goto(report);
    // Only a condition, an ignore count or a hit count filters: a judge of
    // a signal alone has no such block (the verifier refuses unreachable
    // code).
    if p.used(filtered) {
        p.place(filtered);
        p.push([
            asm::mov_imm(1, 1),
            asm::atomic_add_dw(9, 8, 1),
            asm::mov_imm(0, 0),
            asm::exit(),
        ]);
    }
}

/// Tests comparison `c` ([`Condition::Compare`](crate::filter::Condition))
/// on the value in r8 (`len` bytes, zero-extended, as the program reads
/// it): jumps to `filtered` when it does not hold, to `held` or on when it
/// does, computing what `Condition::holds` defines (`filter.rs`): masked
/// unsigned bits; a signed value sign-extended from `len` bytes and
/// compared signed; a float turned into [`crate::filter::float_key`]
/// (magnitude, negated when the sign is set) and compared signed, a NaN
/// holding `!=` only. Uses r1-r3.
fn compare(
    p: &mut Program,
    c: &crate::filter::Condition,
    len: u32,
    held: bpf::Label,
    filtered: bpf::Label,
) {
    use crate::filter::{CmpOp, Condition, View};
    let Condition::Compare {
        op,
        operand,
        mask,
        view,
    } = *c
    else {
        return;
    };
    let len = len.clamp(1, 8) as i32;
    let cmp = |signed: bool| match (op, signed) {
        (CmpOp::Eq, _) => Cmp::Eq,
        (CmpOp::Ne, _) => Cmp::Ne,
        (CmpOp::Lt, false) => Cmp::Lt,
        (CmpOp::Le, false) => Cmp::Le,
        (CmpOp::Gt, false) => Cmp::Gt,
        (CmpOp::Ge, false) => Cmp::Ge,
        (CmpOp::Lt, true) => Cmp::SLt,
        (CmpOp::Le, true) => Cmp::SLe,
        (CmpOp::Gt, true) => Cmp::SGt,
        (CmpOp::Ge, true) => Cmp::SGe,
    };
    p.push([asm::mov(1, 8)]);
    match (view, len) {
        (View::Signed, _) => {
            if len < 8 {
                let shift = 64 - 8 * len;
                p.push([asm::lsh_imm(1, shift), asm::arsh_imm(1, shift)]);
            }
            p.push(asm::ld_u64(2, operand));
            p.jump_if(cmp(true).negated(), 1, 2, filtered);
        }
        (View::Float, 4 | 8) => {
            // r2: all ones for a negative float, else 0 (its sign bit
            // spread); r1: its magnitude (the bits below the sign).
            p.push([asm::mov(2, 8)]);
            if len == 4 {
                p.push([asm::lsh_imm(2, 32)]);
            }
            let below_sign = 64 - (8 * len - 1);
            p.push([
                asm::arsh_imm(2, 63),
                asm::lsh_imm(1, below_sign),
                asm::rsh_imm(1, below_sign),
            ]);
            // Past infinity's magnitude: a NaN, which only `!=` holds for.
            let infinity: u64 = if len == 4 {
                0x7f80_0000
            } else {
                0x7ff0_0000_0000_0000
            };
            p.push(asm::ld_u64(3, infinity));
            let nan = if op == CmpOp::Ne { held } else { filtered };
            p.jump_if(Cmp::Gt, 1, 3, nan);
            // The key: the magnitude, negated when the sign is set
            // ((m ^ s) - s with s all ones or 0).
            p.push([asm::xor(1, 2), asm::sub(1, 2)]);
            // A NaN operand is never bound (`value::bind` refuses it).
            let key = crate::filter::float_key(operand, len as usize).unwrap_or(i64::MAX);
            p.push(asm::ld_u64(2, key as u64));
            p.jump_if(cmp(true).negated(), 1, 2, filtered);
        }
        (View::Unsigned | View::Float, _) => {
            p.push(asm::ld_u64(2, mask));
            p.push([asm::and(1, 2)]);
            p.push(asm::ld_u64(2, operand));
            p.jump_if(cmp(false).negated(), 1, 2, filtered);
        }
    }
}

/// Against the kernel (root only): the comparisons a judge makes, run by
/// the kernel.
#[cfg(test)]
mod kernel_tests {
    use super::*;
    use crate::bpf::Counters;
    use nix::errno::Errno;

    /// Each comparison the hit program makes, run by the kernel, judges
    /// as `Condition::holds` defines: the same instructions ([`compare`])
    /// in a socket filter, which `BPF_PROG_TEST_RUN` runs on demand (a
    /// perf event program cannot be), fed each value through an array map,
    /// for every operator, operands at each type's edges and values of
    /// every sign, size and class (NaNs, zeros, infinities, subnormals).
    #[test]
    fn comparisons_judge_in_the_kernel_as_the_daemon_does() {
        use crate::filter::{CmpOp, Condition, View, sign_extend};
        let input = match Counters::new(1) {
            Ok(c) => c,
            Err(Errno::EPERM) => {
                wpd_test_skip::machine_skip("bpf() refused (needs CAP_BPF)");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let ints: Vec<i64> = vec![
            0,
            1,
            -1,
            7,
            -7,
            100,
            -273,
            i64::from(i8::MIN),
            i64::from(i8::MAX),
            i64::from(i16::MIN),
            i64::from(u16::MAX),
            i64::from(i32::MIN),
            i64::from(i32::MAX),
            i64::from(u32::MAX),
            i64::MIN,
            i64::MAX,
            i64::MIN + 1,
        ];
        let f64s = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            3.5,
            -273.0,
            -273.15,
            -272.9,
            5e-324,
            -5e-324,
            f64::MAX,
            f64::MIN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        let f32s: Vec<f32> = f64s
            .iter()
            .map(|&f| f as f32)
            .chain([1e-45, -1e-45])
            .collect();
        let nans64 = [
            f64::NAN.to_bits(),
            (-f64::NAN).to_bits(),
            0x7ff0_0000_0000_0001,
        ];
        let nans32 = [f32::NAN.to_bits(), (-f32::NAN).to_bits(), 0x7f80_0001];
        let trunc = |v: u64, len: usize| {
            if len == 8 {
                v
            } else {
                v & ((1 << (8 * len)) - 1)
            }
        };
        // (view, len, mask, operands as bound, values as read).
        type Case = (View, usize, u64, Vec<u64>, Vec<u64>);
        let mut cases: Vec<Case> = Vec::new();
        for len in [1, 2, 4, 8] {
            let values: Vec<u64> = ints.iter().map(|&v| trunc(v as u64, len)).collect();
            // Operands as `value::bind` makes them: the type's values.
            let signed: Vec<u64> = values.iter().map(|&v| sign_extend(v, len) as u64).collect();
            cases.push((View::Signed, len, u64::MAX, signed, values.clone()));
            cases.push((View::Unsigned, len, u64::MAX, values.clone(), values));
        }
        let all: Vec<u64> = ints.iter().map(|&v| v as u64).collect();
        cases.push((View::Unsigned, 8, 0xff, vec![0, 7, 0xff, 0x1ff], all));
        let bits64: Vec<u64> = f64s.iter().map(|f| f.to_bits()).collect();
        let mut values64 = bits64.clone();
        values64.extend(nans64);
        cases.push((View::Float, 8, u64::MAX, bits64, values64));
        let bits32: Vec<u64> = f32s.iter().map(|f| u64::from(f.to_bits())).collect();
        let mut values32 = bits32.clone();
        values32.extend(nans32.iter().map(|&b| u64::from(b)));
        cases.push((View::Float, 4, u64::MAX, bits32, values32));
        let mut runs = 0;
        for (view, len, mask, operands, values) in &cases {
            for op in [
                CmpOp::Eq,
                CmpOp::Ne,
                CmpOp::Lt,
                CmpOp::Le,
                CmpOp::Gt,
                CmpOp::Ge,
            ] {
                for &operand in operands {
                    let c = Condition::Compare {
                        op,
                        operand,
                        mask: *mask,
                        view: *view,
                    };
                    let mut p = Program::new();
                    let (held, filtered) = (p.label(), p.label());
                    p.push(asm::ld_map_value(9, input.raw_fd(), 0));
                    p.push([asm::ldx_dw(8, 9, 0)]);
                    compare(&mut p, &c, *len as u32, held, filtered);
                    p.place(held);
                    p.push([asm::mov_imm(0, 1), asm::exit()]);
                    p.place(filtered);
                    p.push([asm::mov_imm(0, 0), asm::exit()]);
                    let insns = p.build().unwrap_or_else(|e| panic!("{c:?}: {e}"));
                    let prog = bpf::load_program(bpf::PROG_TYPE_SOCKET_FILTER, &insns)
                        .unwrap_or_else(|e| panic!("{c:?}: {e}"));
                    for &v in values {
                        input.write(&[v]).unwrap();
                        let kernel = bpf::test_run(&prog).unwrap() == 1;
                        let daemon = c.holds(&v.to_le_bytes()[..*len], None);
                        assert_eq!(kernel, daemon, "{v:#x} ({len} bytes) under {c:?}");
                        runs += 1;
                    }
                }
            }
        }
        assert!(runs > 10_000, "{runs}");
    }
}
