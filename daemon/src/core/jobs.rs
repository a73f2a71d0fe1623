//! The reconcile thread: work the backends hand the core from threads that
//! must not take a process's `op` lock (tracer shards, the drain thread).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::mpsc;

use super::Core;
use crate::state::Job;

impl Core {
    pub(super) fn reconcile_loop(self: Arc<Self>, rx: mpsc::Receiver<Job>) {
        while let Ok(job) = rx.recv() {
            let mut jobs = BTreeSet::from([job]);
            while let Ok(j) = rx.try_recv() {
                jobs.insert(j);
            }
            for job in jobs {
                match job {
                    Job::CheckLost(pid) => self.check_lost(pid),
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
