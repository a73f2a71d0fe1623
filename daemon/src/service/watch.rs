//! Setting and removing watchpoints, code events and policies on behalf of
//! a caller: checked, armed on the process that was checked or backed out,
//! tied to the caller's stream when leased, saved before the answer or
//! undone.

use std::time::Duration;

use wpd_proto::v1 as pb;

use super::{Service, leases, not_saved, persist, run};
use crate::authz::Caller;
use crate::engine::WatchView;
use crate::engine::objects::{CodeSpec, ObjectView};
use crate::engine::policy::{PolicyView, Selector};
use crate::error::WpdError;
use crate::model::{BackendKind, WatchId, WatchSpec};

/// A watchpoint or code event to set.
#[derive(Debug, Clone)]
pub struct SetWatch {
    /// The spec as asked, in the daemon's numbers: what is saved.
    pub asked: pb::WatchpointSpec,
    /// The spec.
    pub spec: WatchSpec,
    /// Its code event, if it is one (`spec` is then each object's
    /// template, or a code breakpoint's).
    pub code: Option<CodeSpec>,
    /// Set again under this id (a restore), else a new one.
    pub id: Option<WatchId>,
}

/// What was set.
#[derive(Debug, Clone)]
pub enum SetOutcome {
    /// A watchpoint, armed, and how long arming took.
    Watch {
        /// It.
        view: WatchView,
        /// The arm's duration.
        took: Duration,
    },
    /// A code event (an object watch or a code breakpoint).
    Code(ObjectView),
}

/// A policy to set.
#[derive(Debug, Clone)]
pub struct SetPolicy {
    /// The selector as asked, in the daemon's terms: what is saved.
    pub asked_selector: pb::ProcessSelector,
    /// The spec as asked: what is saved.
    pub asked_spec: pb::WatchpointSpec,
    /// The processes it covers.
    pub selector: Selector,
    /// Each instance's spec.
    pub spec: WatchSpec,
    /// Each instance's code event, if it has one.
    pub code: Option<CodeSpec>,
    /// Set again under this id (a restore), else a new one.
    pub id: Option<WatchId>,
}

/// What a removal removed.
#[derive(Debug, Clone)]
pub enum Removed {
    /// A policy and its instances.
    Policy(PolicyView),
    /// A code event, and its process's backend.
    Code(ObjectView, Option<BackendKind>),
    /// A watchpoint.
    Watch(WatchView),
}

impl Service {
    /// Sets `req` for `caller`: allowed, armed (the process attached
    /// first if needed) on the process that was checked, added to the
    /// caller's lease, saved (a watchpoint not leased) before the answer;
    /// any refusal on the way undoes what was done.
    pub async fn set_watchpoint(
        &self,
        caller: &Caller,
        req: SetWatch,
    ) -> Result<SetOutcome, WpdError> {
        let checked = self.allow(caller, req.spec.pid)?;
        let lease = req.spec.lease;
        if lease != 0 {
            self.leases.check(lease, caller.uid)?;
        }
        let (core, uid) = (self.core.clone(), caller.uid);
        let (spec, code, id) = (req.spec, req.code, req.id);
        let set = run(move || {
            let was_attached = core.process_view(spec.pid).is_some();
            let pid = spec.pid;
            let set = match code {
                Some(code) => SetOutcome::Code(core.set_object_watch(spec, code, uid)?),
                None => {
                    let (view, took) = core.set_watchpoint_with_id(spec, uid, id)?;
                    SetOutcome::Watch { view, took }
                }
            };
            // Armed on the process that was checked, or backed out.
            if let Err(e) = checked.unchanged() {
                match &set {
                    SetOutcome::Code(v) => drop(core.remove_object_watch(v.id)),
                    SetOutcome::Watch { view, .. } => drop(core.remove_watchpoint(view.id)),
                }
                if !was_attached {
                    let _ = core.detach(pid);
                }
                return Err(e);
            }
            Ok(set)
        })
        .await?;
        let id = set.id();
        let what = match &set {
            SetOutcome::Code(_) => "the code event",
            SetOutcome::Watch { .. } => "the watchpoint",
        };
        if lease != 0 && !self.leases.add_watch(lease, id) {
            // The stream ended while it was being set.
            self.undo(id).await;
            return Err(WpdError::LeaseEnded {
                lease,
                during: match set {
                    SetOutcome::Code(_) => "while the code event was being set",
                    SetOutcome::Watch { .. } => "while the watchpoint was being armed",
                },
                undone: "it was removed",
            });
        }
        if let (SetOutcome::Watch { view, .. }, 0, Some(p)) = (&set, lease, &self.persist) {
            p.record_watchpoint(id.0, caller, req.asked, view.spec.pid);
            // On disk before the answer: a daemon killed right after it
            // sets the watchpoint again. Not on disk: undone, refused.
            if let Err(e) = self.commit_saved(persist::Change::Added(id.0)).await {
                self.undo(id).await;
                return Err(not_saved(
                    format!("watchpoint {}", id.0),
                    &e,
                    "it was removed again; nothing changed",
                ));
            }
        }
        tracing::info!(id = id.0, pid = set.pid(), "{what} set");
        Ok(set)
    }

    /// Removes watchpoint or code event `id` again (a refusal after it was
    /// set).
    async fn undo(&self, id: WatchId) {
        let core = self.core.clone();
        let _ = run(move || {
            leases::undo(&core, &[id], &Default::default());
            Ok(())
        })
        .await;
    }

    /// Sets policy `req` for `caller`: the processes it names checked now
    /// (the others as they match), saved before the answer or removed.
    pub async fn set_policy(
        &self,
        caller: &Caller,
        req: SetPolicy,
    ) -> Result<PolicyView, WpdError> {
        policy_code_allowed(req.code.as_ref())?;
        for &pid in &req.selector.pids {
            self.allow(caller, pid)?;
        }
        let (core, who) = (self.core.clone(), caller.clone());
        let (selector, spec, code, id) = (req.selector, req.spec, req.code, req.id);
        let view = run(move || core.set_policy_with_id(selector, spec, code, who, id)).await?;
        if let Some(p) = &self.persist {
            p.record_policy(view.id.0, caller, req.asked_selector, req.asked_spec);
            if let Err(e) = self.commit_saved(persist::Change::Added(view.id.0)).await {
                let (core, id) = (self.core.clone(), view.id);
                let _ = run(move || core.remove_policy(id).map(|_| ())).await;
                return Err(not_saved(
                    format!("policy {}", view.id.0),
                    &e,
                    "it was removed again; nothing changed",
                ));
            }
        }
        tracing::info!(
            id = view.id.0,
            instances = view.instances.len(),
            "policy set"
        );
        Ok(view)
    }

    /// Removes watchpoint, code event or policy `id` of `caller`'s: off
    /// the disk first (a removal that cannot be saved would be undone by a
    /// restart, so it is refused and changes nothing), then off the
    /// process.
    pub async fn remove(&self, caller: &Caller, id: WatchId) -> Result<Removed, WpdError> {
        if let Some(p) = self.core.policy(id) {
            // A nested caller's are those set from its own namespace.
            if !caller.privileged
                && (p.caller.uid != caller.uid
                    || (caller.pidns.nested().is_some()
                        && !p.caller.pidns.same_numbers(&caller.pidns)))
            {
                return Err(WpdError::NoSuchWatchpoint(id));
            }
            self.save_removal(
                id,
                "policy",
                "the policy stays, set and saved; nothing changed",
            )
            .await?;
            let core = self.core.clone();
            let view = run(move || core.remove_policy(id)).await?;
            tracing::info!(
                id = id.0,
                instances = view.instances.len(),
                "policy removed"
            );
            return Ok(Removed::Policy(view));
        }
        if let Some(o) = self.core.object_watch(id) {
            self.allow_by_id(caller, o.spec.pid, id)?;
            let backend = self.core.process_view(o.spec.pid).map(|p| p.backend);
            let core = self.core.clone();
            let view = run(move || core.remove_object_watch(id)).await?;
            return Ok(Removed::Code(view, backend));
        }
        let pid = self
            .core
            .watch_pid(id)
            .ok_or(WpdError::NoSuchWatchpoint(id))?;
        self.allow_by_id(caller, pid, id)?;
        self.save_removal(
            id,
            "watchpoint",
            "the watchpoint stays, armed and saved; nothing changed",
        )
        .await?;
        let core = self.core.clone();
        let view = run(move || core.remove_watchpoint(id)).await?;
        Ok(Removed::Watch(view))
    }

    /// Writes the removal of `id` (a `what`) to the saved state now; if it
    /// cannot be, `outcome` says what stays.
    async fn save_removal(
        &self,
        id: WatchId,
        what: &str,
        outcome: &'static str,
    ) -> Result<(), WpdError> {
        self.commit_saved(persist::Change::Removed(id.0))
            .await
            .map_err(|e| not_saved(format!("removing {what} {}", id.0), &e, outcome))
    }
}

impl SetOutcome {
    /// Its id.
    pub fn id(&self) -> WatchId {
        match self {
            SetOutcome::Watch { view, .. } => view.id,
            SetOutcome::Code(v) => v.id,
        }
    }

    /// Its process.
    pub fn pid(&self) -> crate::model::Pid {
        match self {
            SetOutcome::Watch { view, .. } => view.spec.pid,
            SetOutcome::Code(v) => v.spec.pid,
        }
    }
}

/// Whether a policy may carry code event `code`: an object watch may, a
/// code breakpoint (which holds a thread until a client resumes it) may
/// not. Checked before the rest of the spec, whose other fields a code
/// breakpoint does not fill.
pub fn policy_code_allowed(code: Option<&CodeSpec>) -> Result<(), WpdError> {
    if code.is_some_and(|c| c.stop) {
        return Err(WpdError::InvalidArgument(
            "a code breakpoint (code_event.stop) holds a thread until a client resumes it: \
             set it on one process with SetWatchpoint, not in a policy"
                .into(),
        ));
    }
    Ok(())
}
