//! The perf backend's per-thread path: one breakpoint event per (piece,
//! thread) on every CPU at once (`cpu = -1`), whose hits a small BPF
//! program writes into one BPF ring buffer shared by the whole daemon.
//!
//! Why: perf lets events share a mmapped ring only on the same CPU (or the
//! same task), and refuses to map an inherited per-task event at all, so
//! the per-CPU path needs one event per thread *per CPU* (256,000 fds for
//! a 1,000-thread process on 128 CPUs and 2 watchpoints). A program
//! attached to the event needs no ring of the event's own; the kernel
//! copies the event, program included, into threads created later, inside
//! `clone()`. The program also reads the watched bytes at the trap, so a
//! hit's value is the one the write left, not the one the daemon reads
//! later.
//!
//! One program per watchpoint piece: its packed key, the value's length
//! and the call-chain depth are immediates. Record layout (all u64, native
//! order), written by the program:
//!
//! | offset | field |
//! |---|---|
//! | 0 | packed `SlotKey` |
//! | 8 | `tgid << 32 \| tid` |
//! | 16 | CLOCK_MONOTONIC ns |
//! | 24 | instruction pointer after the access |
//! | 32 | breakpoint address |
//! | 40 | CPU |
//! | 48 | the watched bytes at the trap (`len` of them, zero-padded) |
//! | 56 | `bpf_probe_read_user`'s result (0, or a negative errno) |
//! | 64 | `bpf_get_stack`'s result: bytes of call chain, or a negative errno |
//! | 72 | the user call chain (`depth` entries) |
//!
//! A full ring makes the program count the hit in a drop counter instead
//! (read at every drain pass, reported as lost records).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use nix::errno::Errno;

use crate::bpf::{self, AsmError, Cmp, Counters, Insn, LoadError, Program, RingBuf, asm, helper};
use crate::model::SlotKey;
use crate::pidns::PidNs;

/// Ring size: 16 MiB, about 200,000 hits of 80 bytes, or 200 ms at a
/// million hits a second between two drain passes (they are 1-2 ms apart).
pub const RING_BYTES: usize = 16 << 20;

/// Where the program reads the hit's instruction pointer and breakpoint
/// address in its context (the architecture's layout).
use crate::arch::current::perf_ctx::{ADDR as CTX_ADDR, IP as CTX_IP};

const REC_FIXED: usize = 72;
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
        callchain: (0..frames).map(|i| w(9 + i)).collect(),
    })
}

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
fn judge(p: &mut Program, j: &Judge, state: i32, len: u32, report: bpf::Label) {
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

/// The program recording a hit of `key` (`len` watched bytes, up to
/// `depth` frames of call chain) into the ring buffer `ring` (its fd), or
/// counting it in the counter array `drops`: 42 instructions, 47 with a
/// call chain, 8 more for ids in the daemon's pid namespace `ns` when it
/// is not the initial one ([`bpf::current_pid_tgid`]); with a [`Judge`] (state in the array `judge.1`), the hit is
/// judged first. Registers: r6 the context, r7 the reserved record.
pub fn program(
    ring: i32,
    drops: i32,
    key: SlotKey,
    len: u32,
    depth: u16,
    judged: Option<(&Judge, i32)>,
    ns: Option<PidNs>,
) -> Result<Vec<Insn>, AsmError> {
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
        asm::mov_imm(0, 0),
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
        asm::mov_imm(0, 0),
        asm::exit(),
    ]);
    p.build()
}

/// The ring, its drop counter, and the loaded programs by piece.
#[derive(Debug)]
pub struct HitRing {
    ring: RingBuf,
    drops: Counters,
    /// Drops already reported.
    reported: Mutex<u64>,
    progs: Mutex<HashMap<u64, Arc<OwnedFd>>>,
    /// The judges' state, by watchpoint (its pieces share it).
    states: Mutex<HashMap<crate::model::WatchId, Arc<Counters>>>,
    /// Whether the kernel takes judged programs (atomic fetch and
    /// exchange, `bpf_send_signal_thread`), or why not.
    judging: Result<(), LoadError>,
    /// The daemon's pid namespace, if not the initial one: the programs
    /// record ids in it.
    ns: Option<PidNs>,
}

/// Why the per-thread path is not available.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoRing {
    /// `bpf()` refused the ring buffer or its counter.
    #[error("bpf(BPF_MAP_CREATE) refused: {}", .0.desc())]
    Map(Errno),
    /// The program was refused.
    #[error(transparent)]
    Program(LoadError),
    /// The program could not be assembled.
    #[error("the hit program does not assemble: {0}")]
    Asm(AsmError),
}

impl HitRing {
    /// The ring and its counter; loads one program as a check, so that a
    /// kernel refusing any part of it is known at start.
    pub fn new() -> Result<HitRing, NoRing> {
        Self::with_size(RING_BYTES)
    }

    /// As [`HitRing::new`], with a ring of `bytes` (a power of two, at
    /// least a page).
    pub fn with_size(bytes: usize) -> Result<HitRing, NoRing> {
        let ring = RingBuf::new(bytes).map_err(NoRing::Map)?;
        let drops = Counters::new(1).map_err(NoRing::Map)?;
        let mut r = HitRing {
            ring,
            drops,
            reported: Mutex::new(0),
            progs: Mutex::new(HashMap::new()),
            states: Mutex::new(HashMap::new()),
            judging: Ok(()),
            ns: crate::pidns::own(),
        };
        let probe = program(
            r.ring.raw_fd(),
            r.drops.raw_fd(),
            SlotKey::unpack(1),
            8,
            4,
            None,
            r.ns,
        )
        .map_err(NoRing::Asm)?;
        bpf::load_program(bpf::PROG_TYPE_PERF_EVENT, &probe).map_err(NoRing::Program)?;
        // Everything a judge may use, once: the kernel either takes it or
        // says why, and then the filter is judged by the daemon instead.
        let state = Counters::new(JUDGE_WORDS).map_err(NoRing::Map)?;
        let all = Judge {
            condition: Some(crate::filter::Condition::Changed),
            ignore: 1,
            every: 2,
            signal: Some(libc::SIGABRT),
            spacing_ns: 1,
        };
        let probe = program(
            r.ring.raw_fd(),
            r.drops.raw_fd(),
            SlotKey::unpack(1),
            8,
            4,
            Some((&all, state.raw_fd())),
            r.ns,
        )
        .map_err(NoRing::Asm)?;
        r.judging = bpf::load_program(bpf::PROG_TYPE_PERF_EVENT, &probe).map(|_| ());
        // The typed comparisons' instructions (signed jumps, shifts).
        for view in [crate::filter::View::Signed, crate::filter::View::Float] {
            let typed = Judge {
                condition: Some(crate::filter::Condition::Compare {
                    op: crate::filter::CmpOp::Lt,
                    operand: 0,
                    mask: u64::MAX,
                    view,
                }),
                ..all
            };
            let probe = program(
                r.ring.raw_fd(),
                r.drops.raw_fd(),
                SlotKey::unpack(1),
                4,
                0,
                Some((&typed, state.raw_fd())),
                r.ns,
            )
            .map_err(NoRing::Asm)?;
            if r.judging.is_ok() {
                r.judging = bpf::load_program(bpf::PROG_TYPE_PERF_EVENT, &probe).map(|_| ());
            }
        }
        if let Err(e) = &r.judging {
            tracing::warn!("hits are judged by the daemon, not at the trap: {e}");
        }
        Ok(r)
    }

    /// Whether filters and signals are judged at the trap here.
    pub fn judges(&self) -> bool {
        self.judging.is_ok()
    }

    /// (hits filtered at the trap, signals sent) of watchpoint `id`, if it
    /// is judged there.
    pub fn judged(&self, id: crate::model::WatchId) -> Option<(u64, u64)> {
        let s = self.states.lock().unwrap().get(&id).cloned()?;
        let v = s.read();
        Some((v[1], v[5]))
    }

    /// The program of `key`, loaded on first use, judging its hits with
    /// `judge` where given.
    pub fn program_for(
        &self,
        key: SlotKey,
        len: u32,
        depth: u16,
        judge: Option<&Judge>,
    ) -> Result<Arc<OwnedFd>, Errno> {
        let mut progs = self.progs.lock().unwrap();
        if let Some(p) = progs.get(&key.pack()) {
            return Ok(p.clone());
        }
        let state = match judge {
            Some(_) => {
                let mut states = self.states.lock().unwrap();
                Some(match states.get(&key.id) {
                    Some(s) => s.clone(),
                    None => {
                        let s = Arc::new(Counters::new(JUDGE_WORDS)?);
                        states.insert(key.id, s.clone());
                        s
                    }
                })
            }
            None => None,
        };
        let judged = judge.zip(state.as_ref().map(|s| s.raw_fd()));
        let insns = program(
            self.ring.raw_fd(),
            self.drops.raw_fd(),
            key,
            len,
            depth,
            judged,
            self.ns,
        )
        .map_err(|e| {
            tracing::error!(id = key.id.0, piece = key.piece, "{e}");
            Errno::EINVAL
        })?;
        let fd = bpf::load_program(bpf::PROG_TYPE_PERF_EVENT, &insns).map_err(|e| {
            tracing::warn!(id = key.id.0, piece = key.piece, "{e}");
            e.errno
        })?;
        let fd = Arc::new(fd);
        progs.insert(key.pack(), fd.clone());
        Ok(fd)
    }

    /// Forgets the program of `key` (its events hold it while they live),
    /// and its watchpoint's judge state with its first piece.
    pub fn forget(&self, key: SlotKey) {
        self.progs.lock().unwrap().remove(&key.pack());
        if key.piece == 0 {
            self.states.lock().unwrap().remove(&key.id);
        }
    }

    /// Programs loaded (one per armed piece).
    pub fn programs(&self) -> usize {
        self.progs.lock().unwrap().len()
    }

    /// The ring's fd (polled).
    pub fn raw_fd(&self) -> i32 {
        self.ring.raw_fd()
    }

    /// Hands every hit recorded so far to `sink`; returns how many records
    /// were read and how many hits were dropped since the last call.
    /// Callers serialise calls.
    pub fn drain(&self, sink: &mut dyn FnMut(RingHit)) -> (usize, u64) {
        let n = self.ring.consume(&mut |body| {
            if let Some(h) = parse(body) {
                sink(h)
            }
        });
        let total = self.drops.read().first().copied().unwrap_or(0);
        let mut reported = self.reported.lock().unwrap();
        let new = total.saturating_sub(*reported);
        *reported = total;
        (n, new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_reserves_then_records_or_counts_a_drop() {
        let key = SlotKey::new(crate::model::WatchId(7), 2);
        for (depth, n) in [(0, 42), (8, 47)] {
            let p = program(3, 4, key, 8, depth, None, None).unwrap();
            assert_eq!(p.len(), n, "depth {depth}");
            let ns = PidNs {
                dev: 4,
                ino: 4026532000,
            };
            let in_ns = program(3, 4, key, 8, depth, None, Some(ns)).unwrap();
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
                            let p = program(3, 4, key, len, 0, Some((&j, 5)), None)
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
            0x401000,
            0x402000,
        ] {
            b.extend_from_slice(&w.to_ne_bytes());
        }
        let h = parse(&b).unwrap();
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
    }
}

/// Against the kernel (root only): a breakpoint opened on one thread with
/// the program attached records the hits of a thread that thread creates
/// afterwards (the program is inherited with the event), with the value
/// the write left.
#[cfg(test)]
mod kernel_tests {
    use super::super::attr::Inherit;
    use super::super::kernel::open_breakpoint_bpf;
    use super::*;
    use crate::model::{Access, Piece, WatchLen};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::mpsc;

    static WATCHED: AtomicU64 = AtomicU64::new(0);

    /// The hit ring, or None (skipped) where `bpf()` is refused.
    fn hit_ring() -> Option<HitRing> {
        match HitRing::new() {
            Ok(r) => Some(r),
            Err(e @ NoRing::Map(Errno::EPERM)) => {
                wpd_test_skip::machine_skip(&e.to_string());
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn inherited_events_keep_the_program() {
        let Some(ring) = hit_ring() else { return };
        records_the_inherited_threads_hits(ring);
    }

    /// The same through `bpf_get_ns_current_pid_tgid`, naming the test's
    /// own namespace (whichever it is): the verifier takes the program, the
    /// device number is encoded as the helper compares it, and the ids are
    /// the test's.
    #[test]
    fn ids_in_a_named_pid_namespace() {
        let Some(mut ring) = hit_ring() else { return };
        ring.ns = Some(PidNs::at("/proc/self/ns/pid").unwrap());
        records_the_inherited_threads_hits(ring);
    }

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

    fn records_the_inherited_threads_hits(ring: HitRing) {
        let key = SlotKey::new(crate::model::WatchId(9), 0);
        let prog = ring.program_for(key, 8, 8, None).unwrap();
        let (tid_tx, tid_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let creator = std::thread::spawn(move || {
            tid_tx.send(nix::unistd::gettid().as_raw()).unwrap();
            go_rx.recv().unwrap();
            // Created after the breakpoint was opened on its creator.
            std::thread::spawn(|| {
                for i in 1..=3u64 {
                    WATCHED.store(0x1000 + i, Ordering::SeqCst);
                }
                nix::unistd::gettid().as_raw()
            })
            .join()
            .unwrap()
        });
        let creator_tid = tid_rx.recv().unwrap();
        let piece = Piece {
            addr: WATCHED.as_ptr() as u64,
            len: WatchLen::new(8).unwrap(),
        };
        let ev = open_breakpoint_bpf(creator_tid, piece, Access::Write, Inherit::Threads, &prog)
            .unwrap();
        go_tx.send(()).unwrap();
        let child_tid = creator.join().unwrap();
        let mut hits = Vec::new();
        let (_, dropped) = ring.drain(&mut |h| hits.push(h));
        drop(ev);
        assert_eq!(dropped, 0);
        assert_eq!(hits.len(), 3, "{hits:?}");
        for (i, h) in hits.iter().enumerate() {
            assert_eq!(h.key, key);
            assert_eq!(h.tid, child_tid);
            assert_eq!(h.pid, std::process::id() as i32);
            assert_eq!(u64::from_ne_bytes(h.value.unwrap()), 0x1001 + i as u64);
            assert!(!h.callchain.is_empty());
            assert_eq!(h.callchain[0], h.ip);
        }
    }
}
