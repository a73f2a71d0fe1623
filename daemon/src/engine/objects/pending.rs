//! Pending code events, whose module is not loaded yet: the probe at the
//! dynamic linker's hook, and arming them once their module is mapped.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{CodeSpec, ObjectCountsView, ObjectView, event_key};
use crate::backend::CodeProbe;
use crate::engine::Core;
use crate::error::WpdError;
use crate::model::{Pid, WatchId, WatchSpec};

/// A code event set `pending` whose function's module the process has not
/// loaded yet: no probe is open. While a process has one, a probe at its
/// dynamic linker's debugger hook (`_dl_debug_state`, which glibc's
/// loader calls after each change of its list of objects, with
/// `r_state == RT_CONSISTENT` once new objects are mapped and before they
/// are relocated or their constructors run) holds the thread that loads
/// a library while the objects thread looks for the names again; a name
/// found gets its probes under the same id, before that thread goes on.
#[derive(Debug, Clone)]
pub struct Pending {
    /// Its id (the one it keeps once armed).
    pub id: WatchId,
    /// Who set it.
    pub owner: u32,
    /// As asked.
    pub spec: WatchSpec,
    /// The code event.
    pub code: CodeSpec,
    /// Why it is pending (what the names did not resolve to).
    pub why: String,
}

/// Why a name leaves a code event pending, in words that name no pid.
pub(super) fn pending_reason(e: &crate::symbols::SymbolError) -> String {
    use crate::symbols::SymbolError as S;
    match e {
        S::NoSuchModule { module, .. } | S::ModuleNotLoaded { module, .. } => {
            format!("no module {module:?} is loaded yet")
        }
        S::Unknown {
            name,
            searched,
            closest,
            ..
        } => {
            let mut s = format!(
                "no function named {name:?} in the {searched} module{} loaded",
                if *searched == 1 { "" } else { "s" }
            );
            if !closest.is_empty() {
                s.push_str(&format!(" (closest: {})", closest.join(", ")));
            }
            s
        }
        S::SourceNotLoaded {
            file,
            searched,
            closest,
            ..
        } => {
            let mut s = format!(
                "no line table names {file:?} ({searched} module{} with line tables loaded",
                if *searched == 1 { "" } else { "s" }
            );
            if !closest.is_empty() {
                s.push_str(&format!("; closest: {}", closest.join(", ")));
            }
            s.push(')');
            s
        }
        other => other.to_string(),
    }
}

/// The debugger hook's function in the dynamic linker.
const LOADER_HOOK: &str = "_dl_debug_state";

/// The dynamic linker's `struct r_debug`, whose `r_state` says why the
/// hook is called.
const LOADER_DEBUG: &str = "_r_debug";

/// `r_state`'s offset in `struct r_debug` (after `int r_version`, padded,
/// `r_map` and `r_brk`).
const R_STATE_OFFSET: u64 = 3 * std::mem::size_of::<u64>() as u64;

/// `r_state` once the loader's list is consistent again (`RT_CONSISTENT`):
/// the other values (`RT_ADD`, `RT_DELETE`) come before a change, with
/// nothing new mapped yet.
pub(super) const RT_CONSISTENT: u32 = 0;

/// A process's probe at its dynamic linker's hook.
#[derive(Debug, Clone, Copy)]
pub(super) struct LoaderHook {
    /// Its key's id.
    pub(super) id: WatchId,
    /// Where `r_state` is in the process, if the loader names `_r_debug`.
    pub(super) r_state: Option<u64>,
}

/// What the daemon says of a pending code event.
pub(super) fn pending_view(p: &Pending) -> ObjectView {
    ObjectView {
        id: p.id,
        spec: p.spec.clone(),
        code: p.code.clone(),
        counts: ObjectCountsView::default(),
        live: Vec::new(),
        place: None,
        hits: 0,
        ready: true,
        pending: true,
        pending_why: Some(p.why.clone()),
    }
}

impl Core {
    /// Registers a pending code event (its module not loaded yet) and
    /// makes sure its process has a probe at its loader's hook; then looks
    /// once more, for a module mapped meanwhile. Blocking.
    pub(super) fn set_pending(
        self: &Arc<Self>,
        mut spec: WatchSpec,
        code: CodeSpec,
        owner: u32,
        why: String,
    ) -> Result<ObjectView, WpdError> {
        let pid = spec.pid;
        self.code_backend(&mut spec);
        let (proc, newly) = self.attach_for(owner, pid, spec.backend, spec.allow_init)?;
        let id = WatchId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let p = Pending {
            id,
            owner,
            spec,
            code,
            why,
        };
        self.start_objects_thread();
        let view = pending_view(&p);
        self.objects.pending.insert(id, p);
        if let Err(e) = self.open_loader_hook(&proc) {
            self.objects.pending.remove(&id);
            if newly && proc.watch_ids().is_empty() && !self.has_object_watch(pid) {
                self.forget_process(&proc);
            }
            return Err(e);
        }
        tracing::info!(id = id.0, pid, at = %view.code.at(), "code event pending");
        // A library mapped between the first look and the hook's probe.
        self.resolve_pending(pid);
        Ok(self.object_watch(id).unwrap_or(view))
    }

    /// Opens the probe at process `pid`'s loader hook, unless it has one.
    fn open_loader_hook(&self, proc: &Arc<crate::state::Process>) -> Result<(), WpdError> {
        let pid = proc.pid;
        let _op = proc.lock_op();
        if self.objects.hooks.contains_key(&pid) {
            return Ok(());
        }
        let site =
            self.symbols
                .code_site(pid, LOADER_HOOK)
                .map_err(|e| WpdError::NoLoaderHook {
                    pid,
                    detail: e.to_string(),
                })?;
        let hook = WatchId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let r_state = site
            .elf
            .lookup(LOADER_DEBUG)
            .first()
            .map(|s| s.vaddr.wrapping_add(site.bias) + R_STATE_OFFSET);
        let backend = self.backends.get(Some(proc.backend))?;
        // Registered first: a thread at the probe as soon as it is open
        // finds it.
        self.objects
            .hooks
            .insert(pid, LoaderHook { id: hook, r_state });
        let opened = backend.open_code_probe(
            pid,
            &CodeProbe {
                key: event_key(hook),
                path: site.path.clone(),
                offset: site.offset,
                ret: false,
                first_arg_filter: false,
                without_stop: false,
                // Only the calls made once the list is consistent again.
                gate: r_state.map(|at| (at, RT_CONSISTENT)),
                set_max: 0,
                owner: proc.attached_by,
                branch: None,
            },
        );
        if let Err(e) = opened {
            self.objects.hooks.remove(&pid);
            backend.close_code_probes(pid, Some(&[event_key(hook)]));
            return Err(e);
        }
        tracing::info!(pid, module = %site.module.path, offset = site.offset, "loader hook set");
        Ok(())
    }

    /// Closes process `pid`'s loader-hook probe if no pending event is
    /// left.
    pub(super) fn close_loader_hook_if_idle(&self, pid: Pid) {
        if self.objects.pending.iter().any(|p| p.spec.pid == pid) {
            return;
        }
        let Some((_, hook)) = self.objects.hooks.remove(&pid) else {
            return;
        };
        if let Some(proc) = self.procs.get(&pid).map(|p| p.clone())
            && let Ok(b) = self.backends.get(Some(proc.backend))
        {
            b.close_code_probes(pid, Some(&[event_key(hook.id)]));
        }
        tracing::info!(pid, "loader hook closed");
    }

    /// Arms process `pid`'s pending events whose names resolve now, each
    /// under its id, with a `WatchpointResolved`; one that resolves but
    /// cannot be armed is removed, with a `WatchpointRemoved` saying why.
    /// Blocking.
    pub(super) fn resolve_pending(self: &Arc<Self>, pid: Pid) {
        let _one = self.objects.resolving.lock().unwrap();
        let todo: Vec<Pending> = self
            .objects
            .pending
            .iter()
            .filter(|p| p.spec.pid == pid)
            .map(|p| p.clone())
            .collect();
        let owner = self.procs.get(&pid).map(|p| p.owner.clone());
        for p in todo {
            let armed =
                self.set_object_watch_as(p.spec.clone(), p.code.clone(), p.owner, Some(p.id));
            match armed {
                // Still found nowhere: why, as of the modules loaded now.
                Err(WpdError::Symbol(e)) if e.may_resolve_later() => {
                    if let Some(mut q) = self.objects.pending.get_mut(&p.id) {
                        q.why = pending_reason(&e);
                    }
                    continue;
                }
                // Whatever else came of it, it is pending no more (the guard
                // takes it out), unless it was removed meanwhile.
                _ if self.objects.pending.remove(&p.id).is_none() => {
                    // Removed meanwhile: what was just set goes too.
                    if let Ok(v) = &armed {
                        let _ = self.remove_object_watch(v.id);
                    }
                }
                Ok(view) => {
                    tracing::info!(id = p.id.0, pid, at = %p.code.at(), "pending code event armed");
                    self.bus.publish_as(
                        crate::events::EventKind::WatchpointResolved {
                            id: p.id,
                            pid,
                            symbol: None,
                            place: view.place.map(Arc::new),
                            reason: "loaded",
                        },
                        owner.clone(),
                    );
                }
                Err(e) => {
                    tracing::warn!(id = p.id.0, pid, "pending code event dropped: {e}");
                    self.bus.publish_as(
                        crate::events::EventKind::WatchpointRemoved {
                            id: p.id,
                            pid,
                            reason: format!("its module was loaded, but it cannot be armed: {e}")
                                .into(),
                        },
                        owner.clone(),
                    );
                }
            }
        }
        self.close_loader_hook_if_idle(pid);
    }
}
