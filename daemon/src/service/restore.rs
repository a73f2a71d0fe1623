//! The saved watchpoints and policies on the service's side: set again at
//! start, each as the caller who set it (what cannot be is listed and
//! published), and kept on disk as they come and go (`persist.rs` owns the
//! file and its rules).

use std::sync::Arc;

use wpd_proto::v1 as pb;

use super::watch::{SetPolicy, SetWatch};
use super::{Service, persist};
use crate::events::EventKind;
use crate::model::WatchId;

/// Why a policy set from a nested pid namespace is not set again.
pub const NESTED_POLICY: &str = "it was set from a pid namespace nested in the daemon's, and \
     covered that namespace's processes only: after a restart the daemon cannot tell that \
     namespace from another, so it would cover others; set it again from there";

impl Service {
    /// Sets again, each as the caller who set it, the watchpoints and
    /// policies a previous run saved; what cannot be is reported.
    pub async fn restore(&self, saved: pb::SavedState) {
        let Some(p) = self.persist.clone() else {
            return;
        };
        let same_boot = p.same_boot(&saved);
        let ctx = persist::RestoreContext::current();
        let (mut restored, mut refused) = (0, 0);
        for e in saved.entries {
            // Rights re-derived, never read back (see `persist`).
            let saved_caller = e.caller.unwrap_or_default();
            let caller = persist::restore_caller(&saved_caller, ctx);
            if saved_caller.privileged && !caller.privileged {
                tracing::warn!(
                    saved_id = e.id,
                    uid = saved_caller.uid,
                    userns = saved_caller.userns,
                    "saved as privileged, set again as a plain caller of its uid: its rights \
                     cannot be proven after a restart"
                );
            }
            let (spec, selector, outcome) = match e.what {
                _ if !persist::id_in_range(e.id) => {
                    let (spec, selector) = match e.what {
                        Some(pb::saved_entry::What::Policy(pol)) => (pol.spec, pol.selector),
                        Some(pb::saved_entry::What::Watchpoint(w)) => (w.spec, None),
                        None => (None, None),
                    };
                    (
                        spec,
                        selector,
                        Err(format!("its saved id {} is out of range (damage)", e.id)),
                    )
                }
                Some(pb::saved_entry::What::Policy(pol))
                    if saved_caller.pid_namespace_level > 0 =>
                {
                    // Its processes were those of one namespace, which a
                    // restarted daemon cannot tell from another one.
                    (pol.spec, pol.selector, Err(NESTED_POLICY.to_string()))
                }
                Some(pb::saved_entry::What::Policy(pol)) => {
                    let r = self
                        .restore_policy(&caller, &pol, WatchId(e.id))
                        .await
                        .map_err(|e| e.to_string());
                    (pol.spec, pol.selector, r)
                }
                Some(pb::saved_entry::What::Watchpoint(w)) => {
                    let pid = w.spec.as_ref().map_or(0, |s| s.pid);
                    let r = if !same_boot {
                        Err("the machine was restarted since it was set".to_string())
                    } else if crate::procfs::start_time(pid) != Some(w.start_time) {
                        Err(format!("process {pid} is gone"))
                    } else {
                        self.restore_watchpoint(&caller, w.spec.clone(), WatchId(e.id))
                            .await
                            .map_err(|e| e.to_string())
                    };
                    (w.spec, None, r)
                }
                None => continue,
            };
            match outcome {
                Ok(id) => {
                    restored += 1;
                    tracing::info!(id, "set again after a restart");
                }
                Err(why) => {
                    refused += 1;
                    let pid = spec.as_ref().map_or(0, |s| s.pid);
                    let reason = format!("not set again after a restart: {why}");
                    tracing::warn!(saved_id = e.id, pid, why = ?why.to_string(), "not set again after a restart");
                    // Seen by whoever set it (and privileged callers): the
                    // process it named may be gone or another one now.
                    let owner = crate::events::Owner {
                        start_time: 0,
                        uids: [caller.uid; 3],
                        gids: [caller.gid; 3],
                        dumpable: true,
                    };
                    self.core.bus.publish_as(
                        EventKind::WatchpointRemoved {
                            id: WatchId(e.id),
                            pid,
                            reason: reason.clone().into(),
                        },
                        Some(Arc::new(owner)),
                    );
                    p.not_restored(
                        caller.uid,
                        pb::NotRestored {
                            saved_id: e.id,
                            spec,
                            selector,
                            reason,
                            at_ns: crate::clock::realtime_ns(),
                        },
                    );
                }
            }
        }
        if restored + refused > 0 {
            tracing::info!(restored, refused, "saved watchpoints and policies");
        }
        p.restored();
        self.sync_saved().await;
    }

    /// Sets saved policy `pol` again under `id`, as `caller`.
    async fn restore_policy(
        &self,
        caller: &crate::authz::Caller,
        pol: &pb::SavedPolicy,
        id: WatchId,
    ) -> Result<u64, crate::error::WpdError> {
        let asked_spec = pol.spec.clone().unwrap_or_default();
        let req = SetPolicy {
            asked_selector: pol.selector.clone().unwrap_or_default(),
            spec: crate::convert::policy_spec_from_pb(asked_spec.clone())?,
            code: crate::convert::code_from_pb(&asked_spec)?,
            selector: crate::convert::selector_from_pb(pol.selector.clone())?,
            asked_spec,
            id: Some(id),
        };
        Ok(self.set_policy(caller, req).await?.id.0)
    }

    /// Sets saved watchpoint `spec` again under `id`, as `caller`.
    async fn restore_watchpoint(
        &self,
        caller: &crate::authz::Caller,
        spec: Option<pb::WatchpointSpec>,
        id: WatchId,
    ) -> Result<u64, crate::error::WpdError> {
        let asked = spec.ok_or_else(|| {
            crate::error::WpdError::InvalidArgument("saved without a spec (damage)".into())
        })?;
        let (spec, code) = crate::convert::watch_request(&asked)?;
        let req = SetWatch {
            asked,
            spec,
            code,
            id: Some(id),
        };
        Ok(self.set_watchpoint(caller, req).await?.id().0)
    }

    /// Writes the saved state if it changed (watchpoints gone, new ones).
    pub async fn sync_saved(&self) {
        let Some(p) = self.persist.clone() else {
            return;
        };
        let core = self.core.clone();
        let r = tokio::task::spawn_blocking(move || {
            p.sync(
                |id| {
                    let id = WatchId(id);
                    core.policy(id).is_some() || core.watch_pid(id).is_some()
                },
                core.next_id(),
            )
        })
        .await;
        if let Ok(Err(e)) = r {
            tracing::error!(error = %e, "cannot save the watchpoints");
        }
    }

    /// Writes `change` to the saved state now (see `Persist::commit`).
    pub(crate) async fn commit_saved(&self, change: persist::Change) -> std::io::Result<()> {
        let Some(p) = self.persist.clone() else {
            return Ok(());
        };
        let core = self.core.clone();
        tokio::task::spawn_blocking(move || {
            p.commit(
                change,
                |id| {
                    let id = WatchId(id);
                    core.policy(id).is_some() || core.watch_pid(id).is_some()
                },
                core.next_id(),
            )
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(format!("saving task failed: {e}"))))
    }

    /// Stops saving (shutdown: what follows is not removal).
    pub fn freeze_saved(&self) {
        if let Some(p) = &self.persist {
            p.freeze();
        }
    }
}
