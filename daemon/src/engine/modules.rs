//! Watchpoints set by name in a shared library go when the library is
//! unmapped (`dlclose`): its addresses may be reused by anything mapped
//! next, where a store would be reported under a name it no longer has.
//!
//! The kernel tells no one about an `munmap` (perf has no unmap record, and
//! ptrace sees no system call without seccomp), so a thread looks at the
//! maps of each process with such watchpoints every [`MODULE_CHECK`]: one
//! read of `/proc/PID/maps` per process, none for processes without
//! watchpoints in libraries. A module found missing twice in a row is gone
//! (once is not enough: right after an exec the dynamic linker has not
//! mapped the libraries yet, and the exec handling re-resolves those
//! watchpoints itself). Until it is noticed, which takes at most two
//! periods, a store into memory mapped at the same addresses is reported
//! under the old name.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::Core;
use crate::events::EventKind;
use crate::model::{Pid, WatchId};
use crate::symbols::{FileKey, Symbols};

/// How often the maps of processes with library watchpoints are read.
pub const MODULE_CHECK: Duration = Duration::from_millis(250);

impl Core {
    /// Starts the thread that removes watchpoints of unmapped modules (it
    /// ends with the core).
    pub(super) fn start_module_watch(self: &Arc<Self>) {
        let core: Weak<Core> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("wpd-modules".into())
            .spawn(move || {
                let mut suspects = HashSet::new();
                let mut round = 0u64;
                loop {
                    std::thread::sleep(MODULE_CHECK);
                    let Some(core) = core.upgrade() else { return };
                    if core.stop.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    core.check_modules(&mut suspects);
                    round += 1;
                    if round.is_multiple_of(4) {
                        core.check_signal_actions();
                    }
                }
            })
            .expect("spawn the module watch");
    }

    /// One round: `suspects` are the watchpoints whose module was missing
    /// in the previous round.
    fn check_modules(&self, suspects: &mut HashSet<WatchId>) {
        let mut by_pid: HashMap<Pid, Vec<(WatchId, FileKey, String)>> = HashMap::new();
        for w in self.watches.iter() {
            if let Some(r) = &w.resolved {
                by_pid.entry(w.spec.pid).or_default().push((
                    w.id,
                    r.module_key.clone(),
                    r.module.clone(),
                ));
            }
        }
        let mut missing = HashSet::new();
        for (pid, mut watches) in by_pid {
            // The executable is not unmapped short of an exec, which is the
            // exec handling's: no maps read for a process watched only there.
            // A process without an executable (read through a live thread)
            // has no memory left: it is exiting or a zombie, and its maps
            // read empty. Its watchpoints are the exit handling's, which
            // reports the hits still in the backend's rings before it
            // removes them (on a loaded machine it may come later than two
            // of these rounds).
            let Some(exe) = Symbols::exe_file(pid) else {
                continue;
            };
            watches.retain(|(_, key, _)| exe != *key);
            if watches.is_empty() {
                continue;
            }
            // A process that is gone is the exit handling's, and so is one
            // whose memory went between the two reads (no mapping at all).
            let Some(mapped) = Symbols::mapped_files(pid).filter(|m| !m.is_empty()) else {
                continue;
            };
            for (id, key, module) in watches {
                if mapped.contains(&key) {
                    continue;
                }
                if suspects.contains(&id) {
                    self.remove_unmapped(pid, id, &module);
                } else {
                    missing.insert(id);
                }
            }
        }
        *suspects = missing;
    }

    /// Each second: a watchpoint whose signal action's signal the process
    /// now ignores, or one of its threads blocks, would signal nothing (or
    /// not at the hit): it is removed, saying why, instead of missing what
    /// it was set for without a word.
    fn check_signal_actions(&self) {
        let with_signals: Vec<(Pid, WatchId, i32)> = self
            .watches
            .iter()
            .filter_map(|w| match w.spec.action {
                crate::model::HitAction::Signal(s) => Some((w.spec.pid, w.id, s)),
                _ => None,
            })
            .collect();
        for (pid, id, sig) in with_signals {
            let Err(why) = crate::signals::deliverable(pid, sig) else {
                continue;
            };
            let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
                continue;
            };
            let op = proc.lock_op();
            if proc.is_gone() {
                continue;
            }
            self.report_pending_hits(&op);
            if let Some(w) = self.take_watch(&op, id) {
                tracing::warn!(pid, id = w.id.0, why = ?why, "signal action removed");
                self.bus.publish_as(
                    EventKind::WatchpointRemoved {
                        id: w.id,
                        pid,
                        reason: format!("its signal can no longer reach the process: {why}").into(),
                    },
                    Some(proc.owner.clone()),
                );
            }
        }
    }

    fn remove_unmapped(&self, pid: Pid, id: WatchId, module: &str) {
        let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
            return;
        };
        let op = proc.lock_op();
        if proc.is_gone() {
            return;
        }
        // Taken meanwhile (removed, or by an exec) is fine: nothing to do.
        self.report_pending_hits(&op);
        if let Some(w) = self.take_watch(&op, id) {
            tracing::info!(
                pid,
                id = w.id.0,
                module,
                "module unmapped: watchpoint removed"
            );
            self.bus.publish_as(
                EventKind::WatchpointRemoved {
                    id: w.id,
                    pid,
                    reason: format!("{module} was unmapped").into(),
                },
                Some(proc.owner.clone()),
            );
        }
    }
}
