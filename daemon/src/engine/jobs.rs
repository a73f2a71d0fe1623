//! The reconcile thread: work the backends hand the core from threads that
//! must not take a process's `op` lock (tracer shards, the drain thread).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::mpsc;

use super::Core;
use crate::state::Job;

impl Core {
    /// Sends `job` to the reconcile thread after `delay`.
    pub(super) fn schedule_later(&self, job: Job, delay: std::time::Duration) {
        let Some(tx) = self.reconcile_tx.lock().unwrap().clone() else {
            return;
        };
        std::thread::Builder::new()
            .name("wpd-later".into())
            .spawn(move || {
                std::thread::sleep(delay);
                let _ = tx.send(job);
            })
            .ok();
    }

    pub(super) fn reconcile_loop(self: Arc<Self>, rx: mpsc::Receiver<Job>) {
        while let Ok(job) = rx.recv() {
            let mut jobs = BTreeSet::from([job]);
            while let Ok(j) = rx.try_recv() {
                jobs.insert(j);
            }
            for job in jobs {
                match job {
                    Job::CheckLost(pid) => self.check_lost(pid),
                    Job::Named(pid, tid) => {
                        let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
                            continue;
                        };
                        let op = proc.lock_op();
                        if !proc.is_gone() {
                            self.named_thread(&op, tid);
                        }
                    }
                    Job::Resolve(pid) => {
                        let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
                            self.pending_resolve.remove(&pid);
                            continue;
                        };
                        let op = proc.lock_op();
                        let Some((_, todo)) = self.pending_resolve.remove(&pid) else {
                            continue;
                        };
                        if !proc.is_gone() {
                            self.resolve_again_locked(&op, todo);
                        }
                    }
                    Job::Reconcile(pid) | Job::Exec(pid) => {
                        let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
                            continue;
                        };
                        let op = proc.lock_op();
                        if proc.is_gone() {
                            continue;
                        }
                        if let Job::Exec(_) = job {
                            self.exec_locked(&op);
                        } else {
                            self.reconcile(&op);
                        }
                    }
                }
            }
        }
    }
}
