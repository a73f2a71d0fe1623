//! A code breakpoint on a branch, held before it. A uprobe's stop comes
//! after its instruction ran, and the kernel runs a branch (a call, a
//! jump) itself: a breakpoint on a line that starts with a call would hold
//! the thread inside the callee (a libc function's PLT stub), its stack
//! and its locals the callee's, and a `next` from there would step out of
//! that. So at the stop the branch is taken back (`arch::insn::undo_branch`:
//! the thread put back at the branch, as a debugger's breakpoint holds it)
//! and, whatever restarts the thread next (a resume, a step, a detach), it
//! is run again first (`redo_branch`: the return address pushed again, the
//! thread at the target), never through the probe a second time. A thread
//! moved meanwhile (its registers set) runs on from where it was put. If
//! the daemon dies while it is held, the thread runs the branch itself:
//! its probe went with the daemon's fds.

use nix::sys::ptrace;

use super::code::CodeRecord;
use super::tracer::{Tracer, npid};
use crate::arch::current::insn;
use crate::model::{Pid, Tid};

impl Tracer {
    /// At the stop of `tid` at code-event probes (`records`): if the last
    /// record is of an entry probe on a branch, the branch is taken back.
    pub(super) fn rewind_branch(&mut self, tid: Tid, pid: Pid, records: &[CodeRecord]) {
        let Some(rec) = records.iter().rev().find(|r| r.tid == tid) else {
            return;
        };
        let Some(branch) = super::code::branch_of(pid, rec.key) else {
            return;
        };
        let Ok(mut regs) = ptrace::getregs(npid(tid)) else {
            return;
        };
        let read = |a: u64| {
            let b = crate::procfs::read_memory(pid, tid, a, 8).ok()?;
            Some(u64::from_le_bytes(b.try_into().ok()?))
        };
        let Some(undone) = insn::undo_branch(&mut regs, branch, rec.ip, rec.sp, read) else {
            return;
        };
        if ptrace::setregs(npid(tid), regs).is_ok()
            && let Some(t) = self.tracees.get_mut(&tid)
        {
            t.undone = Some(undone);
        }
    }

    /// Before `tid` is restarted or let go: the branch taken back at its
    /// stop runs again. True when it did.
    pub(super) fn redo_branch(&mut self, tid: Tid) -> bool {
        let Some(undone) = self.tracees.get_mut(&tid).and_then(|t| t.undone.take()) else {
            return false;
        };
        let Ok(mut regs) = ptrace::getregs(npid(tid)) else {
            return false;
        };
        // The word just below its stack pointer, where the call it runs
        // again pushed it.
        let write = |at: u64, v: u64| {
            ptrace::write(npid(tid), at as ptrace::AddressType, v as libc::c_long).is_ok()
        };
        insn::redo_branch(&mut regs, &undone, write) && ptrace::setregs(npid(tid), regs).is_ok()
    }
}
