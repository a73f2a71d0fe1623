//! A hit's value on the ptrace backend: the watched bytes read through the
//! stopped thread, with the bytes its store wrote put back over them
//! (`arch::current::store`), since another thread may have stored there
//! between the trap and the read.
//!
//! Finding the store means reading the hitting function's instructions
//! forwards from its start up to the hit's `ip`; that is done once per
//! address of a process and kept ([`Stores`]), so a hit costs a map lookup
//! (and `PTRACE_GETFPREGS` for an SSE store) beside the registers the
//! tracer read at the stop.

use dashmap::DashMap;

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
    at: DashMap<(Pid, u64), Ending>,
}

impl Stores {
    /// Forgets what was found in `pid` (its code changed, an exec; or it
    /// was detached or exited).
    pub fn forget(&self, pid: Pid) {
        self.at.retain(|&(p, _), _| p != pid);
    }

    /// The store ending at `ip` in `pid`, found once.
    fn ending_at(&self, host: &dyn Host, pid: Pid, tid: Tid, ip: u64) -> Option<Instruction> {
        let now = crate::clock::monotonic_ns();
        match self.at.get(&(pid, ip)).map(|e| *e) {
            Some(Ending::Store(i)) => return Some(i),
            Some(Ending::Other) => return None,
            Some(Ending::Unknown(after)) if now < after => return None,
            _ => {}
        }
        // The store's last byte is at ip - 1; the function holding it.
        let start = ip
            .checked_sub(1)
            .and_then(|pc| host.function_start(pid, pc))
            .filter(|&s| s < ip && ip - s <= FUNCTION_MAX);
        let found = match start {
            None => Ending::Unknown(now + RETRY_NS),
            Some(start) => procfs::read_memory(pid, tid, start, (ip - start) as usize)
                .ok()
                .and_then(|code| store::instruction_ending_at(&code, start, ip))
                .filter(store::is_decoded_store)
                .map_or(Ending::Other, Ending::Store),
        };
        if self.at.len() >= KEPT {
            self.at.clear();
        }
        self.at.insert((pid, ip), found);
        match found {
            Ending::Store(i) => Some(i),
            _ => None,
        }
    }

    /// The bytes of `piece` at a hit of the stopped thread `tid` (its
    /// registers `regs`): what its store wrote where it wrote them, the
    /// rest as read now.
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
        let ip = crate::arch::current::UserRegs::from(general).ip;
        let Some(i) = self.ending_at(host, pid, tid, ip) else {
            return Ok(memory);
        };
        let mut regs = Registers {
            general,
            xmm: || store::xmm_of(tid),
        };
        Ok(store::stored(&i, piece.addr, len, &mut regs)
            .and_then(|s| s.over(piece.addr, &memory))
            .unwrap_or(memory))
    }
}
