//! A policy on a program (`--exe`) covers its new processes from their
//! first instruction: while such a policy exists, the program's file is
//! marked for the exec hold (`backend/exechold.rs`, kernel-facts §23),
//! and at a held exec every policy is tried at once, the process stopped
//! before its first instruction until it is armed (at most
//! [`HOLD_BOUND`]; then it runs on, armed when the arming ends). Execs of
//! other files pay nothing (an inode mark). Where the hold cannot be had
//! (fanotify refused: no `CAP_SYS_ADMIN`), or for a backend that cannot
//! arm a process another tracer holds (`Features::arms_while_traced`: the
//! ptrace backend's tracer could not attach it), processes are found
//! as before: by the kernel's records and the `/proc` scan, a few
//! milliseconds after their exec.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::Core;
use super::policy::{FoundBy, Policy};
use crate::backend::exechold::ExecHold;

/// Longest a process is held at its exec for its arming.
pub const HOLD_BOUND: Duration = Duration::from_secs(1);

/// The exec hold of the policies, and how many policies mark each file.
#[derive(Default)]
pub(super) struct PolicyHold {
    hold: Option<ExecHold>,
    marks: HashMap<PathBuf, usize>,
}

impl Core {
    /// `policy` names a program: its execs are held from now on (perf
    /// backend).
    pub(super) fn hold_execs_of(self: &Arc<Self>, policy: &Policy) {
        let Some(exe) = policy.selector.exe.clone() else {
            return;
        };
        if !self
            .backends
            .get(policy.spec.backend)
            .is_ok_and(|b| b.features().arms_while_traced)
        {
            return;
        }
        let mut h = self.exec_hold.lock().unwrap();
        if h.hold.is_none() {
            let core = Arc::downgrade(self);
            let at_exec = move |pid| {
                if let Some(core) = core.upgrade() {
                    let now = crate::clock::monotonic_ns();
                    core.check_all_policies(pid, now, FoundBy::ExecHold);
                }
            };
            match ExecHold::start(HOLD_BOUND, Arc::new(at_exec)) {
                Ok(hold) => h.hold = Some(hold),
                Err(e) => {
                    tracing::info!("new processes of a program are found after their exec: {e}");
                    return;
                }
            }
        }
        let Some(hold) = h.hold.as_ref() else {
            return;
        };
        if !h.marks.contains_key(&exe)
            && let Err(e) = hold.mark(&exe)
        {
            tracing::info!(exe = %exe.display(), "its execs are not held: {e}");
            return;
        }
        *h.marks.entry(exe).or_insert(0) += 1;
    }

    /// `policy` is removed: its program is held no more, unless another
    /// policy names it.
    pub(super) fn release_execs_of(&self, policy: &Policy) {
        let Some(exe) = policy.selector.exe.as_ref() else {
            return;
        };
        let mut h = self.exec_hold.lock().unwrap();
        let Some(n) = h.marks.get_mut(exe) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            h.marks.remove(exe);
            if let Some(hold) = h.hold.as_ref() {
                let _ = hold.unmark(exe);
            }
        }
    }

    /// Execs held so far, and those let go before their arming ended.
    pub fn exec_holds(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let h = self.exec_hold.lock().unwrap();
        h.hold.as_ref().map_or((0, 0), |x| {
            (
                x.counts().held.load(Relaxed),
                x.counts().past_bound.load(Relaxed),
            )
        })
    }
}
