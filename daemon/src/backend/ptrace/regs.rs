//! A tracee's debug registers as its tracer keeps them: the addresses and
//! the whole DR7 it wants, what was last written successfully, and which
//! watchpoint each slot holds. DR7 is never read back to decide what to
//! write (a new thread's DR7 reads as its creator's, kernel-facts §3): it is
//! kept here and always written whole. Every address poke is checked before
//! its slot's enable bits go into DR7 (a failed poke followed by a good DR7
//! write would arm the old address, kernel-facts §1).
//!
//! A process with signal stops (`signal_bp`) gets a perf breakpoint per
//! slot instead: the same programs, applied by opening and closing events;
//! DR7 is never written for it. Such a tracee's registers are shared
//! ([`SharedRegs`]): a perf breakpoint can be opened on a running thread
//! from any thread, so another tracer holding a thread at a code event may
//! program them (`stops::AtStop`) while their own tracer lets it
//! ([`Regs::others`]: set and cleared by the owning tracer under the same
//! lock, so no breakpoint is ever opened on a tracee being detached).

use std::sync::{Arc, Mutex, MutexGuard};

use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::unistd::Pid as NixPid;

use super::signal_bp::{self, SignalMode};
use crate::backend::fds::CountedFd;

use super::protocol::{ProgramResult, SlotProgram};
use crate::arch::current as arch;
use crate::model::{SlotKey, Tid};

/// One tracee's registers (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Regs {
    /// Addresses in DR0–DR3, as last written.
    addr: [u64; arch::SLOTS],
    /// Watchpoint piece per slot, for DR6 → watchpoint.
    ids: [Option<SlotKey>; arch::SLOTS],
    /// The DR7 we want.
    dr7: u64,
    /// DR7 as last written successfully.
    applied_dr7: u64,
    /// Slots we have ever armed on this tracee (a trap from one of them,
    /// even after disarming, is ours to swallow).
    pub(super) ever_armed: u8,
    /// Signal stops: the process's mode, and each slot's breakpoint with
    /// the hit count last seen.
    signal: Option<Arc<SignalMode>>,
    events: [Option<(CountedFd, u64)>; arch::SLOTS],
    /// Its tracer lets other tracers program it (signal stops, past its
    /// birth, nothing pending, not leaving).
    others: bool,
}

/// A tracee's registers, owned by its tracer and reachable by the others
/// (see the module doc).
#[derive(Debug, Default, Clone)]
pub(super) struct SharedRegs(Arc<Mutex<Regs>>);

impl SharedRegs {
    pub(super) fn new(regs: Regs) -> Self {
        SharedRegs(Arc::new(Mutex::new(regs)))
    }

    /// The registers (a tracer that panicked while holding them aborts the
    /// daemon, so a poisoned lock holds nothing half-done that matters).
    pub(super) fn lock(&self) -> MutexGuard<'_, Regs> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A staged program of a batch: (batch id, program).
pub(super) type Staged = (u64, SlotProgram);

impl Regs {
    /// The registers of a new tracee of `pid` (signal stops if the process
    /// has them).
    pub(super) fn for_process(pid: crate::model::Pid) -> Regs {
        Regs {
            signal: signal_bp::mode_of(pid),
            ..Regs::default()
        }
    }

    /// Whether this tracee's slots are perf breakpoints (signal stops):
    /// they can then be programmed while it runs.
    pub(super) fn has_signal_stops(&self) -> bool {
        self.signal.is_some()
    }

    /// Whether a tracer other than its own may program it now.
    pub(super) fn others(&self) -> bool {
        self.others && self.signal.is_some()
    }

    /// Its tracer opens it to the other tracers, or closes it.
    pub(super) fn set_others(&mut self, open: bool) {
        self.others = open;
    }

    /// The signal a hit of this tracee arrives as.
    pub(super) fn hit_signal(&self) -> Signal {
        self.signal.as_ref().map_or(Signal::SIGTRAP, |m| m.signal)
    }

    /// True when this tracee's hits arrive as `sig` sent by the kernel
    /// (signal stops).
    pub(super) fn is_signal_stop(&self, sig: Signal) -> bool {
        self.signal.as_ref().is_some_and(|m| m.signal == sig)
    }

    /// The watchpoint pieces whose breakpoints counted a hit since the last
    /// look (signal stops).
    pub(super) fn signal_hits(&mut self) -> Vec<SlotKey> {
        let mut out = Vec::new();
        for s in 0..arch::SLOTS {
            if let Some((fd, seen)) = &mut self.events[s] {
                let now = signal_bp::count(fd);
                if now > *seen {
                    *seen = now;
                    if let Some(k) = self.ids[s] {
                        out.push(k);
                    }
                }
            }
        }
        out
    }

    /// Signal stops: opens and closes the slots' breakpoints.
    fn apply_events(
        &mut self,
        tid: Tid,
        mode: &SignalMode,
        pending: Vec<Staged>,
        close_all: bool,
    ) -> Vec<(u64, SlotProgram, ProgramResult)> {
        let mut outcome = Vec::with_capacity(pending.len());
        for (batch, p) in pending {
            let s = p.slot as usize;
            match p.arm {
                Some(a) => {
                    // The slot's old breakpoint first: its place is needed.
                    self.events[s] = None;
                    match signal_bp::open_breakpoint(tid, a.addr, a.len, a.access, mode) {
                        Ok(fd) => {
                            self.events[s] = Some((fd, 0));
                            self.addr[s] = a.addr;
                            self.ids[s] = Some(a.key);
                            self.ever_armed |= 1 << s;
                            outcome.push((batch, p, ProgramResult::Done));
                        }
                        Err(e) => {
                            self.ids[s] = None;
                            outcome.push((batch, p, errno_result(e)));
                        }
                    }
                }
                None => {
                    self.events[s] = None;
                    self.ids[s] = None;
                    outcome.push((batch, p, ProgramResult::Done));
                }
            }
        }
        if close_all {
            self.events = Default::default();
            self.ids = [None; arch::SLOTS];
        }
        outcome
    }

    /// Writes what `pending` asks into the stopped tracee `tid`, then DR7
    /// if it changed (or `force_dr7`, before a detach); the outcome of each
    /// program. If the DR7 write fails the kernel rolled it back: every arm
    /// of this round is reported failed and the last good DR7 kept.
    pub(super) fn apply(
        &mut self,
        tid: Tid,
        pending: Vec<Staged>,
        force_dr7: bool,
    ) -> Vec<(u64, SlotProgram, ProgramResult)> {
        if let Some(mode) = self.signal.clone() {
            return self.apply_events(tid, &mode, pending, force_dr7);
        }
        let who = NixPid::from_raw(tid);
        let mut outcome = Vec::with_capacity(pending.len());
        for (batch, p) in pending {
            let s = p.slot as usize;
            match p.arm {
                Some(a) => {
                    let r = ptrace::write_user(
                        who,
                        arch::debugreg_offset(s) as _,
                        a.addr as libc::c_long,
                    );
                    match r {
                        Ok(()) => {
                            self.addr[s] = a.addr;
                            self.ids[s] = Some(a.key);
                            self.ever_armed |= 1 << s;
                            self.dr7 = arch::dr7_set_slot(self.dr7, s, a.len, a.access);
                            outcome.push((batch, p, ProgramResult::Done));
                        }
                        Err(e) => outcome.push((batch, p, errno_result(e))),
                    }
                }
                None => {
                    self.dr7 = arch::dr7_clear_slot(self.dr7, s);
                    self.ids[s] = None;
                    outcome.push((batch, p, ProgramResult::Done));
                }
            }
        }
        if self.dr7 != self.applied_dr7 || force_dr7 {
            match ptrace::write_user(
                who,
                arch::debugreg_offset(arch::DR7) as _,
                self.dr7 as libc::c_long,
            ) {
                Ok(()) => self.applied_dr7 = self.dr7,
                Err(e) => {
                    self.dr7 = self.applied_dr7;
                    for o in outcome.iter_mut() {
                        if o.1.arm.is_some() && o.2 == ProgramResult::Done {
                            o.2 = errno_result(e);
                            self.ids[o.1.slot as usize] = None;
                        }
                    }
                }
            }
        }
        outcome
    }

    /// Before a detach: nothing armed (written at the next apply, forced).
    pub(super) fn clear(&mut self) {
        self.dr7 = 0;
        self.ids = [None; arch::SLOTS];
    }

    /// exec cleared the registers (kernel-facts §3).
    pub(super) fn reset_after_exec(&mut self) {
        self.events = Default::default();
        self.addr = [0; arch::SLOTS];
        self.ids = [None; arch::SLOTS];
        self.dr7 = 0;
        self.applied_dr7 = 0;
    }

    /// The watchpoint pieces of the armed slots DR6 names.
    pub(super) fn watches_hit(&self, dr6: u64) -> Vec<SlotKey> {
        let hit = arch::dr6::slots_hit(dr6);
        (0..arch::SLOTS)
            .filter(|&s| hit & (1 << s) != 0)
            .filter_map(|s| self.ids[s])
            .collect()
    }

    /// DR6 names a slot we once armed (a hit that raced its disarm).
    pub(super) fn was_ours(&self, dr6: u64) -> bool {
        arch::dr6::slots_hit(dr6) & self.ever_armed != 0
    }
}

/// A failed ptrace request as a program outcome.
pub(super) fn errno_result(e: Errno) -> ProgramResult {
    match e {
        Errno::ESRCH => ProgramResult::Gone,
        Errno::ENOSPC => ProgramResult::NoSpace,
        e => ProgramResult::Failed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::WatchId;

    #[test]
    fn errno_mapping() {
        assert_eq!(errno_result(Errno::ENOSPC), ProgramResult::NoSpace);
        assert_eq!(errno_result(Errno::ESRCH), ProgramResult::Gone);
        assert_eq!(
            errno_result(Errno::EINVAL),
            ProgramResult::Failed(Errno::EINVAL)
        );
    }

    #[test]
    fn dr6_maps_to_the_watchpoints_of_armed_slots() {
        let mut r = Regs::default();
        let (a, b) = (SlotKey::new(WatchId(7), 0), SlotKey::new(WatchId(7), 1));
        r.ids[1] = Some(a);
        r.ids[2] = Some(b);
        r.ever_armed = 0b0111;
        assert_eq!(r.watches_hit(0xffff_0ff2), vec![a]);
        assert_eq!(
            r.watches_hit(0xffff_0ff6),
            vec![a, b],
            "two pieces of one store"
        );
        assert!(
            r.watches_hit(0xffff_0ff1).is_empty(),
            "slot 0 holds nothing now"
        );
        assert!(r.was_ours(0xffff_0ff1), "but was armed once");
        assert!(!r.was_ours(0xffff_0ff8));
    }
}
