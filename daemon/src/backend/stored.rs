//! A hit's exact value: the watched bytes as read, with the bytes the
//! hitting thread's store wrote put back over them
//! (`arch::current::store`), since another thread may have stored there
//! between the trap and the read. Both backends use it: ptrace with the
//! registers of the stopped thread, perf with those its breakpoint recorded
//! at the trap (a sample's `PERF_SAMPLE_REGS_USER`, or the hit program's
//! copy of its context).
//!
//! Finding the store means reading the hitting function's instructions
//! forwards from its start up to the hit's `ip`; that is done once per
//! address of a process and kept ([`Stores`]), so a hit costs a map lookup
//! (and `PTRACE_GETFPREGS` for an SSE store on ptrace) beside the registers.

use dashmap::DashMap;

use std::time::Duration;

use crate::arch::current::store::{self, Instruction, Registers};
use crate::backend::Host;
use crate::model::{Pid, Piece, Tid};
use crate::procfs;

/// Addresses kept at most (all processes); past it the map starts again.
const KEPT: usize = 65_536;
/// A function read from its start up to a hit at most this far in (bytes).
const FUNCTION_MAX: u64 = 1 << 20;

/// How long an address whose function was not known is left before it is
/// looked up again (its module may not have loaded within the hit path's
/// wait, or may be loaded later).
const RETRY_NS: u64 = 1_000_000_000;

/// How long an address whose function's module was still loading is left
/// before it is looked up again, when the caller does not wait for loads
/// (perf's drain: [`Stores::value`] with a zero `wait`).
const LOADING_RETRY_NS: u64 = 20_000_000;

/// What ends at a hit address.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// A store whose value the registers tell.
    Store(Instruction),
    /// Another instruction.
    Other,
    /// Its function is not known (yet): looked up again after this
    /// monotonic time.
    Unknown(u64),
}

/// The instruction that ends at each hit address seen, per process.
#[derive(Debug, Default)]
pub struct Stores {
    /// Keyed with `foldhash` (looked up at every hit; addresses are not
    /// attacker-chosen in any way that matters here).
    at: DashMap<(Pid, u64), Ending, foldhash::fast::RandomState>,
}

impl Stores {
    /// Forgets what was found in `pid` (its code changed, an exec; or it
    /// was detached or exited).
    pub fn forget(&self, pid: Pid) {
        self.at.retain(|&(p, _), _| p != pid);
    }

    /// The store ending at `ip` in the code of `code_of`, found once
    /// (read through `pid`'s thread `tid` when it is `code_of`), waiting at most `wait` for the
    /// function's module to load.
    fn ending_at(
        &self,
        host: &dyn Host,
        (code_of, pid, tid): (Pid, Pid, Tid),
        ip: u64,
        wait: Duration,
    ) -> Option<Instruction> {
        let known = self.at.get(&(code_of, ip)).map(|e| *e);
        let now = match known {
            Some(Ending::Store(i)) => return Some(i),
            Some(Ending::Other) => return None,
            Some(Ending::Unknown(after)) => {
                let now = crate::clock::monotonic_ns();
                if now < after {
                    return None;
                }
                now
            }
            None => crate::clock::monotonic_ns(),
        };
        let retry = now
            + if wait.is_zero() {
                LOADING_RETRY_NS
            } else {
                RETRY_NS
            };
        // The code is read in the process it is kept under (a forked
        // child may be gone already, its parent not).
        let (pid, tid) = if code_of == pid {
            (pid, tid)
        } else {
            (code_of, code_of)
        };
        // The store's last byte is at ip - 1; the function holding it.
        let start = ip
            .checked_sub(1)
            .and_then(|pc| host.function_start(pid, pc, wait))
            .filter(|&s| s < ip && ip - s <= FUNCTION_MAX);
        let found = match start {
            None => Ending::Unknown(retry),
            // Code that cannot be read now (the process is going) is looked
            // at again, not taken for another instruction.
            Some(start) => match procfs::read_memory(pid, tid, start, (ip - start) as usize) {
                Err(_) => Ending::Unknown(retry),
                Ok(code) => store::instruction_ending_at(&code, start, ip)
                    .filter(store::is_decoded_store)
                    .map_or(Ending::Other, Ending::Store),
            },
        };
        if self.at.len() >= KEPT {
            self.at.clear();
        }
        self.at.insert((code_of, ip), found);
        match found {
            Ending::Store(i) => Some(i),
            _ => None,
        }
    }

    /// The `len` bytes at `addr` at a hit (`trap`, with `xmm` reading the
    /// thread's XMM registers if a store needs them): what its store wrote
    /// where it wrote them, the rest as `memory` (read after the trap)
    /// holds them. Memory that could not be read is no loss when the store
    /// wrote every byte.
    pub fn value<F>(
        &self,
        host: &dyn Host,
        trap: &Trap<'_>,
        xmm: F,
        (addr, len): (u64, usize),
        memory: Result<Vec<u8>, String>,
        wait: Duration,
    ) -> Result<Vec<u8>, String>
    where
        F: FnMut() -> Option<[[u8; 16]; 16]>,
    {
        let ip = crate::arch::current::UserRegs::from(trap.general).ip;
        let Some(i) = self.ending_at(host, (trap.code_of, trap.pid, trap.tid), ip, wait) else {
            return memory;
        };
        if !trap.segment_bases && store::needs_segment_bases(&i) {
            return memory;
        }
        let mut regs = Registers {
            general: trap.general,
            xmm,
        };
        let Some(s) = store::stored(&i, addr, len, &mut regs) else {
            return memory;
        };
        match memory {
            Ok(mut m) => {
                s.write_over(addr, &mut m);
                Ok(m)
            }
            Err(e) => s.covering(addr, len).ok_or(e),
        }
    }

    /// The bytes of `piece` at a hit of the stopped thread `tid` (its
    /// registers `regs`, when read): what its store wrote where it wrote
    /// them, the rest as read now (ptrace).
    pub fn hit_value(
        &self,
        host: &dyn Host,
        pid: Pid,
        tid: Tid,
        regs: Option<&libc::user_regs_struct>,
        piece: Piece,
    ) -> Result<Vec<u8>, String> {
        let len = piece.len.bytes() as usize;
        let memory = procfs::read_memory(pid, tid, piece.addr, len)?;
        let Some(general) = regs else {
            return Ok(memory);
        };
        let trap = Trap {
            code_of: pid,
            pid,
            tid,
            general,
            segment_bases: true,
        };
        self.value(
            host,
            &trap,
            || store::xmm_of(tid),
            (piece.addr, len),
            Ok(memory),
            crate::symbols::EVENT_WAIT,
        )
    }
}

/// A hit's trap: who made it, and the registers after its instruction.
pub struct Trap<'a> {
    /// The process whose code ran, which what is found of it is kept under:
    /// a forked child runs its parent's (perf keeps it under the
    /// watchpoint's process).
    pub code_of: Pid,
    /// The process that hit.
    pub pid: Pid,
    /// The thread that hit.
    pub tid: Tid,
    /// The general registers after the instruction.
    pub general: &'a libc::user_regs_struct,
    /// Whether `general`'s `fs_base` and `gs_base` are the thread's
    /// (ptrace reads them; perf records none).
    pub segment_bases: bool,
}
