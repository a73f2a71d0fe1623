//! The hit program: the instructions that record a hit into the ring (the
//! layout in the module's doc), judging it first where asked, and a record
//! read back ([`parse`]).

use nix::errno::Errno;

use super::judge::{Judge, judge};
use crate::bpf::{self, AsmError, Insn, Program, asm, helper};
use crate::model::SlotKey;
use crate::pidns::PidNs;

/// Where the program reads the hit's instruction pointer and breakpoint
/// address in its context (the architecture's layout).
use crate::arch::current::perf_ctx::{ADDR as CTX_ADDR, IP as CTX_IP};
/// The context starts with the user registers (`struct pt_regs`), copied
/// into the record.
use crate::arch::current::perf_regs::PT_REGS;

/// Where the copy of the context's registers starts in a record.
const REC_REGS: usize = 72;
/// The fixed part of a record: the registers end it.
const REC_FIXED: usize = REC_REGS + 8 * PT_REGS;
/// `BPF_F_USER_STACK`.
const USER_STACK: i32 = 1 << 8;
/// `bpf_ringbuf_submit`'s flags: `BPF_RB_NO_WAKEUP`. The drain reads the
/// ring on a timer. The kernel's adaptive notification (flags 0: a wake-up
/// when the record is the first after the reader's position) was measured
/// against it, a thread storing to a watched variable every 2 ms, 2,000
/// stores: 45–48 µs of the writer's CPU per hit (110–122 µs of its wall
/// time) against 19–24 µs (33–60 µs), since each sparse hit then raised an
/// `irq_work` and woke the drain; every 200 µs, 21.7 against 17.9 µs
/// (docs/benchmarks.md, "Drain wake-ups").
const SUBMIT_FLAGS: i32 = 1;

/// A hit as the program recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingHit {
    pub key: SlotKey,
    pub pid: i32,
    pub tid: i32,
    pub time: u64,
    pub ip: u64,
    pub addr: u64,
    pub cpu: u32,
    /// The watched bytes at the trap, or why they could not be read.
    pub value: Result<[u8; 8], Errno>,
    /// The user registers after the access (`struct pt_regs`), for the
    /// value its store wrote.
    pub regs: [u64; PT_REGS],
    /// Frames (the first is `ip`), when asked for.
    pub callchain: Vec<u64>,
}

/// Decodes one record (see the module's table).
pub fn parse(body: &[u8]) -> Option<RingHit> {
    if body.len() < REC_FIXED {
        return None;
    }
    let w = |i: usize| u64::from_ne_bytes(body[i * 8..i * 8 + 8].try_into().unwrap());
    let pid_tgid = w(1);
    let read_rc = w(7) as i64;
    let stack_rc = w(8) as i64;
    let frames = if stack_rc > 0 {
        ((stack_rc as usize) / 8).min((body.len() - REC_FIXED) / 8)
    } else {
        0
    };
    Some(RingHit {
        key: SlotKey::unpack(w(0)),
        pid: (pid_tgid >> 32) as i32,
        tid: pid_tgid as u32 as i32,
        time: w(2),
        ip: w(3),
        addr: w(4),
        cpu: w(5) as u32,
        value: if read_rc == 0 {
            Ok(body[48..56].try_into().unwrap())
        } else {
            Err(Errno::from_raw((-read_rc) as i32))
        },
        regs: std::array::from_fn(|i| w(REC_REGS / 8 + i)),
        callchain: (0..frames).map(|i| w(REC_FIXED / 8 + i)).collect(),
    })
}

/// The program recording a hit of `key` (`len` watched bytes, up to
/// `depth` frames of call chain) into the ring buffer `ring` (its fd), or
/// counting it in the counter array `drops`: 84 instructions (42 of them
/// copy the registers), 89 with a call chain, 8 more for ids in the daemon's pid namespace `ns` when it
/// is not the initial one ([`bpf::current_pid_tgid`]); with a [`Judge`] (state in the array `judge.1`), the hit is
/// judged first. Registers: r6 the context, r7 the reserved record.
/// `signals`: the hits it lets through go on to the event's overflow (its
/// `sigtrap`, a feedback breakpoint's signal).
#[allow(clippy::too_many_arguments)]
pub fn program(
    ring: i32,
    drops: i32,
    key: SlotKey,
    len: u32,
    depth: u16,
    judged: Option<(&Judge, i32)>,
    ns: Option<PidNs>,
    signals: bool,
) -> Result<Vec<Insn>, AsmError> {
    // What the program returns for a hit it lets through: 1 lets the
    // kernel go on with the event's overflow, which signals the thread on
    // a breakpoint opened with `sigtrap` (a feedback breakpoint); 0 ends
    // it there (the record is the hit's only trace).
    let through = i32::from(signals);
    let size = REC_FIXED + 8 * depth as usize;
    let mut p = Program::new();
    let reserved = p.label();
    p.push([asm::mov(6, 1)]);
    if let Some((j, state)) = judged {
        let report = p.label();
        judge(&mut p, j, state, len, report);
        p.place(report);
    }
    p.push(asm::ld_map(1, ring));
    p.push([
        asm::mov_imm(2, size as i32),
        asm::mov_imm(3, 0),
        asm::call(helper::RINGBUF_RESERVE),
    ]);
    p.jne_imm(0, 0, reserved);
    // Full: count it and return.
    p.push(asm::ld_map_value(1, drops, 0));
    p.push([
        asm::mov_imm(2, 1),
        asm::atomic_add_dw(1, 0, 2),
        asm::mov_imm(0, through),
        asm::exit(),
    ]);
    p.place(reserved);
    p.push([asm::mov(7, 0)]);
    p.push(asm::ld_u64(1, key.pack()));
    p.push([asm::stx_dw(7, 0, 1)]);
    // Ids in the daemon's pid namespace (the judge uses the word at -8).
    p.push(bpf::current_pid_tgid(ns, -16));
    p.push([
        asm::stx_dw(7, 8, 0),
        asm::call(helper::KTIME_GET_NS),
        asm::stx_dw(7, 16, 0),
        asm::ldx_dw(1, 6, CTX_IP),
        asm::stx_dw(7, 24, 1),
        asm::ldx_dw(1, 6, CTX_ADDR),
        asm::stx_dw(7, 32, 1),
        asm::call(helper::GET_SMP_PROCESSOR_ID),
        asm::stx_dw(7, 40, 0),
        asm::mov_imm(1, 0),
        asm::stx_dw(7, 48, 1),
        asm::mov(1, 7),
        asm::add_imm(1, 48),
        asm::mov_imm(2, len.clamp(1, 8) as i32),
        asm::ldx_dw(3, 7, 32),
        asm::call(helper::PROBE_READ_USER),
        asm::stx_dw(7, 56, 0),
    ]);
    for i in 0..PT_REGS {
        let at = (8 * i) as i16;
        p.push([
            asm::ldx_dw(1, 6, at),
            asm::stx_dw(7, REC_REGS as i16 + at, 1),
        ]);
    }
    if depth > 0 {
        p.push([
            asm::mov(1, 6),
            asm::mov(2, 7),
            asm::add_imm(2, REC_FIXED as i32),
            asm::mov_imm(3, 8 * i32::from(depth)),
            asm::mov_imm(4, USER_STACK),
            asm::call(helper::GET_STACK),
            asm::stx_dw(7, 64, 0),
        ]);
    } else {
        p.push([asm::mov_imm(1, 0), asm::stx_dw(7, 64, 1)]);
    }
    p.push([
        asm::mov(1, 7),
        asm::mov_imm(2, SUBMIT_FLAGS),
        asm::call(helper::RINGBUF_SUBMIT),
        asm::mov_imm(0, through),
        asm::exit(),
    ]);
    p.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_reserves_then_records_or_counts_a_drop() {
        let key = SlotKey::new(crate::model::WatchId(7), 2);
        for (depth, n) in [(0, 84), (8, 89)] {
            let p = program(3, 4, key, 8, depth, None, None, false).unwrap();
            assert_eq!(p.len(), n, "depth {depth}");
            let ns = PidNs {
                dev: 4,
                ino: 4026532000,
            };
            let in_ns = program(3, 4, key, 8, depth, None, Some(ns), false).unwrap();
            assert_eq!(in_ns.len(), n + 8, "depth {depth}, in a namespace");
            assert!(in_ns.contains(&asm::call(helper::GET_NS_CURRENT_PID_TGID)));
            assert!(!in_ns.contains(&asm::call(helper::GET_CURRENT_PID_TGID)));
            // The jump after ringbuf_reserve skips the drop count and its
            // exit, to the record being filled (r7 = r0).
            let jne = p.iter().position(|i| *i == asm::jne_imm(0, 0, 6)).unwrap();
            assert_eq!(p[jne - 1], asm::call(helper::RINGBUF_RESERVE));
            assert_eq!(p[jne + 6], asm::exit());
            assert_eq!(p[jne + 7], asm::mov(7, 0));
        }
    }

    /// Every judge a watchpoint can ask for assembles, with no code the
    /// verifier would find unreachable (`AsmError::Unreachable`): a signal
    /// with nothing that filters used to leave the filtered block behind.
    #[test]
    fn every_judge_assembles_with_no_unreachable_code() {
        use crate::filter::{CmpOp, Condition, View};
        let key = SlotKey::new(crate::model::WatchId(7), 0);
        let cmp = |op, operand, view| {
            Some(Condition::Compare {
                op,
                operand,
                mask: u64::MAX,
                view,
            })
        };
        let conditions = [
            (None, 8),
            (Some(Condition::Changed), 8),
            (cmp(CmpOp::Ge, 3, View::Unsigned), 8),
            (cmp(CmpOp::Lt, 0, View::Signed), 4),
            (cmp(CmpOp::Le, u64::MAX, View::Signed), 8),
            (cmp(CmpOp::Ne, 1.5f64.to_bits(), View::Float), 8),
            (cmp(CmpOp::Gt, u64::from(1.5f32.to_bits()), View::Float), 4),
        ];
        let mut filtering = 0;
        for (condition, len) in conditions {
            for ignore in [0, 2] {
                for every in [0, 1, 3] {
                    for signal in [None, Some(libc::SIGUSR1)] {
                        for spacing_ns in [0, 1_000_000] {
                            let j = Judge {
                                condition,
                                ignore,
                                every,
                                signal,
                                spacing_ns,
                            };
                            let p = program(3, 4, key, len, 0, Some((&j, 5)), None, false)
                                .unwrap_or_else(|e| panic!("{j:?}: {e}"));
                            // The filtered block (count, return 0) is there
                            // exactly when something filters.
                            let filters = condition.is_some() || ignore > 0 || every > 1;
                            let counts = p.windows(2).any(|w| {
                                w[0] == asm::mov_imm(1, 1) && w[1] == asm::atomic_add_dw(9, 8, 1)
                            });
                            assert_eq!(counts, filters, "{j:?}");
                            filtering += usize::from(filters);
                        }
                    }
                }
            }
        }
        assert_eq!(filtering, 16 + 24 * 6);
    }

    #[test]
    fn parses_the_programs_layout() {
        let mut b = Vec::new();
        let key = SlotKey::new(crate::model::WatchId(7), 2);
        for w in [
            key.pack(),
            (41u64 << 32) | 43,
            1_000,
            0x401000,
            0x7000,
            1,
            0x2a,
            0,
            16,
        ] {
            b.extend_from_slice(&w.to_ne_bytes());
        }
        // The registers (r15 first), then the chain.
        for w in (1000..1000 + PT_REGS as u64).chain([0x401000, 0x402000]) {
            b.extend_from_slice(&w.to_ne_bytes());
        }
        let h = parse(&b).unwrap();
        assert_eq!(h.regs[0], 1000);
        assert_eq!(h.regs[PT_REGS - 1], 1000 + PT_REGS as u64 - 1);
        assert_eq!(
            (h.key, h.pid, h.tid, h.time, h.ip),
            (key, 41, 43, 1_000, 0x401000)
        );
        assert_eq!((h.addr, h.cpu), (0x7000, 1));
        assert_eq!(h.value.unwrap()[0], 0x2a);
        assert_eq!(h.callchain, vec![0x401000, 0x402000]);
        // A failed read (-EFAULT) and no call chain.
        b[56..64].copy_from_slice(&(-14i64).to_ne_bytes());
        b[64..72].copy_from_slice(&(-14i64).to_ne_bytes());
        let h = parse(&b).unwrap();
        assert_eq!(h.value, Err(Errno::EFAULT));
        assert!(h.callchain.is_empty());
        assert!(parse(&b[..64]).is_none());
        assert!(
            parse(&b[..REC_FIXED - 8]).is_none(),
            "the registers cut short"
        );
    }
}
