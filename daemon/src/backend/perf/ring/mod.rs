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
//! later; and it copies the user registers, from which the daemon puts
//! back what the thread's store wrote (`backend::stored`), should another
//! thread have stored there between the access and the read (0.6% of the
//! hits of two threads storing without pause, kernel-facts §26).
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
//! | 72 | the user registers after the access (`struct pt_regs`, 21 on x86-64) |
//! | 240 | the user call chain (`depth` entries) |
//!
//! A full ring makes the program count the hit in a drop counter instead
//! (read at every drain pass, reported as lost records).
//!
//! Rooms: `program.rs` (the hit program, and the records it writes read
//! back), `judge.rs` (what a program judges at the trap: filters and the
//! signal action). This file holds the ring and the programs loaded.

mod judge;
mod program;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use nix::errno::Errno;

use crate::bpf::{self, AsmError, Counters, LoadError, RingBuf};
use crate::model::SlotKey;
use crate::pidns::PidNs;
pub use judge::{JUDGE_WORDS, Judge};
pub use program::{RingHit, parse, program};

/// Ring size: 16 MiB, about 67,000 hits of 248 bytes (record and header),
/// or 67 ms at a million hits a second between two drain passes (they are
/// 1-2 ms apart).
pub const RING_BYTES: usize = 16 << 20;

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
            false,
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
            false,
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
                false,
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
        signals: bool,
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
            signals,
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

    /// Bytes reserved in the ring so far, by every CPU's programs.
    pub fn produced(&self) -> u64 {
        self.ring.produced()
    }

    /// Bytes read so far.
    pub fn consumed(&self) -> u64 {
        self.ring.consumed()
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

    fn records_the_inherited_threads_hits(ring: HitRing) {
        let key = SlotKey::new(crate::model::WatchId(9), 0);
        let prog = ring.program_for(key, 8, 8, None, false).unwrap();
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
        let ev = open_breakpoint_bpf(
            creator_tid,
            piece,
            Access::Write,
            Inherit::Threads,
            &prog,
            None,
        )
        .unwrap();
        go_tx.send(()).unwrap();
        let child_tid = creator.join().unwrap();
        let mut hits = Vec::new();
        assert!(ring.produced() > ring.consumed(), "three hits reserved");
        let (_, dropped) = ring.drain(&mut |h| hits.push(h));
        drop(ev);
        assert_eq!(dropped, 0);
        // Read through what was reserved: nothing left behind a record
        // still being written.
        assert_eq!(ring.consumed(), ring.produced());
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
