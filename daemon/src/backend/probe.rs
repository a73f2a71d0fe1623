//! Asking the kernel how many debug-register slots a thread has free: open
//! disabled breakpoints with `perf_event_open` until ENOSPC (disabled events
//! hold slots too, kernel-facts §5), then close them. It needs only the
//! permission to open a breakpoint on the thread, not the perf backend's
//! rings, so it works where that backend cannot run.
//!
//! Users: `ListThreads{probe}` (the core), the perf backend's inheritance
//! checks, and the ptrace backend, which checks that every thread has a
//! free slot before it writes any address (a successful ptrace address
//! write makes the kernel keep a slot until the thread exits, so a request
//! refused half-way would leave slots behind).

use nix::errno::Errno;

use super::Unavailable;
use super::perf::{attr, sys};
use crate::model::Tid;

/// The free-slot probe (see the module doc).
#[derive(Debug)]
pub struct SlotProbe(());

impl SlotProbe {
    /// A probe, if this process may open breakpoints (tried on itself).
    pub fn new() -> Result<SlotProbe, Unavailable> {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let probe = SlotProbe(());
        match probe.free_slots(me, 1) {
            Ok(_) => Ok(probe),
            Err(errno) => Err(Unavailable::Kernel {
                op: "perf_event_open(probe breakpoint)",
                errno,
                needs: "opening disabled breakpoints on the daemon itself was refused".into(),
            }),
        }
    }

    /// How many of up to `max` slots `tid` has free, as the kernel says.
    pub fn free_slots(&self, tid: Tid, max: usize) -> Result<usize, Errno> {
        let mut held = Vec::with_capacity(max);
        for _ in 0..max {
            let mut a = attr::probe();
            match sys::open(&mut a, tid, -1, "perf_event_open(probe)") {
                Ok(fd) => held.push(fd),
                Err(e) if e.errno == Errno::ENOSPC => break,
                Err(e) => return Err(e.errno),
            }
        }
        Ok(held.len())
    }
}
