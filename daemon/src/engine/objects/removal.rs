//! Object watches removed: by their caller, when their process calls exec,
//! and with their process.

use super::pending::pending_view;
use super::{ObjectView, disarm_key, event_key};
use crate::engine::Core;
use crate::error::WpdError;
use crate::model::{Pid, WatchId};

impl Core {
    /// Removes an object watch, its probes and every live object's
    /// watchpoint. Blocking.
    pub fn remove_object_watch(&self, id: WatchId) -> Result<ObjectView, WpdError> {
        if let Some((_, p)) = self.objects.pending.remove(&id) {
            self.close_loader_hook_if_idle(p.spec.pid);
            return Ok(pending_view(&p));
        }
        let (_, w) = self
            .objects
            .watches
            .remove(&id)
            .ok_or(WpdError::NoSuchWatchpoint(id))?;
        let pid = w.spec.pid;
        if let Some(proc) = self.procs.get(&pid).map(|p| p.clone())
            && let Ok(b) = self.backends.get(Some(proc.backend))
        {
            b.close_code_probes(pid, Some(&[event_key(id), disarm_key(id)]));
        }
        let view = self.object_view(&w);
        let live: Vec<WatchId> = w.live.lock().unwrap().drain().map(|(_, c)| c).collect();
        for child in live {
            let _ = self.remove_watchpoint(child);
        }
        Ok(view)
    }

    /// The process called exec: its object watches (probes in the old
    /// program's files) are removed, each with a `WatchpointRemoved`.
    pub(in crate::engine) fn remove_object_watches_at_exec(&self, op: &crate::state::OpGuard<'_>) {
        let pid = op.pid();
        let ids: Vec<WatchId> = self
            .objects
            .watches
            .iter()
            .filter(|w| w.spec.pid == pid)
            .map(|w| w.id)
            .collect();
        for id in ids {
            let Some((_, w)) = self.objects.watches.remove(&id) else {
                continue;
            };
            if let Ok(b) = self.backends.get(Some(op.process().backend)) {
                b.close_code_probes(pid, Some(&[event_key(id), disarm_key(id)]));
            }
            w.live.lock().unwrap().clear();
            self.bus.publish_as(
                crate::events::EventKind::WatchpointRemoved {
                    id,
                    pid,
                    reason: "the process called exec: the code event's function is gone".into(),
                },
                Some(op.process().owner.clone()),
            );
        }
        // Pending ones named libraries of the old program; its loader (the
        // hook's file) is gone too.
        let pending: Vec<WatchId> = self
            .objects
            .pending
            .iter()
            .filter(|p| p.spec.pid == pid)
            .map(|p| p.id)
            .collect();
        for id in pending {
            if self.objects.pending.remove(&id).is_some() {
                self.bus.publish_as(
                    crate::events::EventKind::WatchpointRemoved {
                        id,
                        pid,
                        reason: "the process called exec before the pending code event's module \
                                 was loaded"
                            .into(),
                    },
                    Some(op.process().owner.clone()),
                );
            }
        }
        if let Some((_, hook)) = self.objects.hooks.remove(&pid)
            && let Ok(b) = self.backends.get(Some(op.process().backend))
        {
            b.close_code_probes(pid, Some(&[event_key(hook.id)]));
        }
    }

    /// The process is gone or detached: its object watches go too.
    pub(in crate::engine) fn forget_object_watches(&self, pid: Pid) {
        self.objects.watches.retain(|_, w| w.spec.pid != pid);
        self.objects.pending.retain(|_, p| p.spec.pid != pid);
        self.objects.hooks.remove(&pid);
    }
}
