//! Processes on behalf of a caller: attach (on the process that was
//! checked, or backed out), detach, hold and resume threads (a pause tied
//! to the caller's stream when leased), read a held thread's stack and a
//! process's memory (of the process that was checked), and what the caller
//! may list.

use super::{Service, leases, run};
use crate::authz::{self, Caller};
use crate::engine::objects::ObjectView;
use crate::engine::policy::PolicyView;
use crate::engine::{ProcessView, ThreadView, WatchView};
use crate::error::WpdError;
use crate::model::{BackendKind, Pid, Tid};

/// What a caller may list: its processes' watchpoints and code events, the
/// processes, its policies.
#[derive(Debug, Default)]
pub struct Listing {
    /// Watchpoints.
    pub watches: Vec<WatchView>,
    /// Code events, each with its process's backend.
    pub codes: Vec<(ObjectView, BackendKind)>,
    /// Processes.
    pub processes: Vec<ProcessView>,
    /// Policies.
    pub policies: Vec<PolicyView>,
}

impl Service {
    /// Attaches `pid` for `caller`: the process that was checked, or none.
    /// Whether it was attached by this call.
    pub async fn attach(
        &self,
        caller: &Caller,
        pid: Pid,
        backend: Option<BackendKind>,
        allow_init: bool,
    ) -> Result<(ProcessView, bool), WpdError> {
        let checked = self.allow(caller, pid)?;
        let (core, uid) = (self.core.clone(), caller.uid);
        run(move || {
            let (_, newly) = core.attach_for(uid, pid, backend, allow_init)?;
            if let Err(e) = checked.unchanged() {
                if newly {
                    let _ = core.detach(pid);
                }
                return Err(e);
            }
            core.process_view(pid)
                .map(|v| (v, newly))
                .ok_or(WpdError::ProcessExited(pid))
        })
        .await
    }

    /// Detaches `pid`: (watchpoints and code events removed, threads
    /// released).
    pub async fn detach(&self, caller: &Caller, pid: Pid) -> Result<(usize, usize), WpdError> {
        self.allow(caller, pid)?;
        let core = self.core.clone();
        run(move || core.detach(pid)).await
    }

    /// Resumes held threads of `pid` (all with none named).
    pub async fn resume(
        &self,
        caller: &Caller,
        pid: Pid,
        tids: Vec<Tid>,
    ) -> Result<Vec<Tid>, WpdError> {
        self.allow(caller, pid)?;
        let core = self.core.clone();
        run(move || core.resume(pid, &tids)).await
    }

    /// Holds threads of `pid` (all with none named), until resumed or the
    /// end of `lease` (0: none), which must be the caller's.
    pub async fn pause(
        &self,
        caller: &Caller,
        pid: Pid,
        tids: Vec<Tid>,
        lease: u64,
    ) -> Result<Vec<Tid>, WpdError> {
        self.allow(caller, pid)?;
        if lease != 0 {
            self.leases.check(lease, caller.uid)?;
        }
        let core = self.core.clone();
        let held = run(move || core.pause(pid, &tids)).await?;
        if lease != 0 && !self.leases.add_pause(lease, pid) {
            let core = self.core.clone();
            run(move || {
                leases::undo(&core, &[], &[pid].into());
                Ok(())
            })
            .await?;
            return Err(WpdError::LeaseEnded {
                lease,
                during: "during the pause",
                undone: "the threads run again",
            });
        }
        Ok(held)
    }

    /// The stack of held thread `tid` of `pid` (`depth` frames, their
    /// local variables with `locals`).
    pub async fn thread_stack(
        &self,
        caller: &Caller,
        pid: Pid,
        tid: Tid,
        depth: usize,
        locals: bool,
    ) -> Result<crate::engine::ThreadStack, WpdError> {
        self.allow(caller, pid)?;
        let core = self.core.clone();
        run(move || core.thread_stack(pid, tid, depth, locals)).await
    }

    /// `len` bytes of `pid`'s memory at `addr`, of the process that was
    /// checked (bytes of a process that became another's are not shown):
    /// the bytes read and why the rest could not be.
    pub async fn read_memory(
        &self,
        caller: &Caller,
        pid: Pid,
        addr: u64,
        len: usize,
    ) -> Result<(Vec<u8>, Option<String>), WpdError> {
        let checked = self.allow(caller, pid)?;
        let core = self.core.clone();
        run(move || {
            let read = core.read_memory(pid, addr, len)?;
            checked.unchanged()?;
            Ok(read)
        })
        .await
    }

    /// The threads of `pid` (those named, or all), their slots probed in
    /// the kernel with `probe`.
    pub async fn threads(
        &self,
        caller: &Caller,
        pid: Pid,
        tids: Vec<Tid>,
        probe: bool,
    ) -> Result<Vec<ThreadView>, WpdError> {
        self.allow(caller, pid)?;
        let core = self.core.clone();
        run(move || core.threads(pid, &tids, probe)).await
    }

    /// What `caller` may list, of process `pid` (0: of all): the processes
    /// it could trace itself, their watchpoints and code events, the
    /// policies it set (a nested caller's: those set from its namespace).
    pub fn list(&self, caller: &Caller, pid: Pid) -> Result<Listing, WpdError> {
        if pid < 0 {
            return Err(WpdError::InvalidArgument(format!(
                "pid must be 0 (all) or positive, got {pid}"
            )));
        }
        if pid > 0 {
            self.allow(caller, pid)?;
        }
        let only = (pid > 0).then_some(pid);
        let (mut watches, mut processes) = self.core.list(only);
        if !caller.privileged {
            processes.retain(|p| authz::check(caller, p.pid).is_ok());
            watches.retain(|w| processes.iter().any(|p| p.pid == w.spec.pid));
        }
        let mut policies = self.core.list_policies(only);
        if !caller.privileged {
            let nested = caller.pidns.nested().is_some();
            policies.retain(|p| {
                self.core.policy(p.id).is_some_and(|q| {
                    q.caller.uid == caller.uid
                        && (!nested || q.caller.pidns.same_numbers(&caller.pidns))
                })
            });
        }
        let codes = self
            .core
            .object_watches()
            .into_iter()
            .filter(|o| o.ready && (pid == 0 || o.spec.pid == pid))
            .filter_map(|o| {
                let p = processes.iter().find(|p| p.pid == o.spec.pid)?;
                let backend = p.backend;
                Some((o, backend))
            })
            .collect();
        Ok(Listing {
            watches,
            codes,
            processes,
            policies,
        })
    }
}

impl Service {
    /// Steps held thread `tid` of `pid` (`kind`; the others run meanwhile
    /// with `others_run`), the answer's stack `depth` frames; `cancel`:
    /// set when the caller went away (the thread is stopped where it is).
    #[allow(clippy::too_many_arguments)]
    pub async fn step(
        &self,
        caller: &Caller,
        pid: Pid,
        tid: Tid,
        kind: crate::engine::step::StepKind,
        others_run: bool,
        depth: usize,
        cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<crate::engine::step::StepResult, WpdError> {
        self.allow(caller, pid)?;
        let core = self.core.clone();
        run(move || core.step(pid, tid, kind, others_run, depth, &cancel)).await
    }

    /// Writes `data` at `addr` of `pid`, a process still the one checked:
    /// bytes written, and why the rest could not be.
    pub async fn write_memory(
        &self,
        caller: &Caller,
        pid: Pid,
        addr: u64,
        data: Vec<u8>,
    ) -> Result<(usize, Option<String>), WpdError> {
        let checked = self.allow(caller, pid)?;
        let core = self.core.clone();
        run(move || {
            // Not into a process that became another's.
            checked.unchanged()?;
            core.write_memory(pid, addr, &data)
        })
        .await
    }
}
