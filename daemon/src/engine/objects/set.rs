//! Setting an object watch: where its probes go, what its expression
//! names (evaluated once at set when it reads no memory), and opening it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::pending::pending_reason;
use super::worker::Msg;
use super::{CodeSpec, ObjectCounts, ObjectView, ObjectWatch, disarm_key, event_key, live_bound};
use crate::backend::CodeProbe;
use crate::engine::Core;
use crate::error::WpdError;
use crate::model::{BreakPlace, Scope, WatchId, WatchSpec};
use crate::symbols::code::CodeSite;

/// The probes of object watch `id`: at its function (entry or return),
/// and at its disarming function's entry, filtered on the live objects.
fn object_probes(
    id: WatchId,
    owner: u32,
    code: &CodeSpec,
    site: &CodeSite,
    disarm: Option<&CodeSite>,
) -> Vec<CodeProbe> {
    let first = site
        .elf
        .file_bytes(site.offset, crate::arch::current::insn::MAX_INSN as usize);
    let mut v = vec![CodeProbe {
        key: event_key(id),
        path: site.path.clone(),
        offset: site.offset,
        ret: code.at_return,
        first_arg_filter: false,
        without_stop: false,
        gate: None,
        set_max: 0,
        owner,
        branch: (!code.at_return)
            .then(|| crate::arch::current::insn::branch_at(first))
            .flatten(),
    }];
    if let Some(d) = disarm {
        v.push(CodeProbe {
            key: disarm_key(id),
            path: d.path.clone(),
            offset: d.offset,
            ret: false,
            first_arg_filter: true,
            without_stop: true,
            gate: None,
            set_max: live_bound(code),
            owner,
            branch: None,
        });
    }
    v
}

impl Core {
    /// Sets an object watch: `spec` is the template of each object's
    /// watchpoint (its range unused), `code` the event. Blocking.
    pub fn set_object_watch(
        self: &Arc<Self>,
        spec: WatchSpec,
        code: CodeSpec,
        owner: u32,
    ) -> Result<ObjectView, WpdError> {
        let pid = spec.pid;
        self.check_held(owner)?;
        match self.set_object_watch_as(spec.clone(), code.clone(), owner, None) {
            Err(WpdError::Symbol(e)) if code.pending && e.may_resolve_later() => {
                self.set_pending(spec, code, owner, pending_reason(&e))
            }
            Err(WpdError::Symbol(crate::symbols::SymbolError::NoSuchModule {
                module,
                loaded,
                ..
            })) => Err(crate::symbols::SymbolError::ModuleNotLoaded {
                pid,
                module,
                loaded,
            }
            .into()),
            // The event's own function, named without its module: it may
            // be a library's, loaded later.
            Err(WpdError::Symbol(crate::symbols::SymbolError::Unknown {
                pid,
                name,
                searched,
                closest,
                stripped,
            })) if code.line.is_none()
                && crate::symbols::code::split_module(&code.function) == (None, name.as_str()) =>
            {
                Err(crate::symbols::SymbolError::UnknownFunction {
                    pid,
                    name,
                    searched,
                    closest,
                    stripped,
                }
                .into())
            }
            r => r,
        }
    }

    /// The backend of a code event's process: its own, else the one asked
    /// for, else (asked for none, on a process not attached yet) the one
    /// that can hold a thread at a probe rather than a default that cannot
    /// (written into `spec`).
    pub(super) fn code_backend(&self, spec: &mut WatchSpec) -> Option<crate::model::BackendKind> {
        let kind = self
            .procs
            .get(&spec.pid)
            .map(|p| p.backend)
            .or(spec.backend);
        if kind.is_none()
            && !self.backends.features(None).is_some_and(|f| f.code_events)
            && let Some(holds) = self.backends.with_feature(|f| f.code_events)
        {
            spec.backend = Some(holds);
            return Some(holds);
        }
        kind
    }

    /// Sets an object watch, under `id` if given (a pending one armed).
    pub(super) fn set_object_watch_as(
        self: &Arc<Self>,
        mut spec: WatchSpec,
        code: CodeSpec,
        owner: u32,
        id: Option<WatchId>,
    ) -> Result<ObjectView, WpdError> {
        crate::procfs::check_process(spec.pid)?;
        let kind = self.code_backend(&mut spec);
        if let Some(f) = self.backends.features(kind)
            && !f.code_events
            && code.stop
        {
            return Err(self.lacks(
                "code breakpoints",
                |f| f.code_events,
                ", which holds the thread that reaches the breakpoint (a uprobe whose BPF \
                 program sends a signal the tracer catches) until it is resumed; this \
                 process's backend cannot hold a thread",
            ));
        }
        if let Some(f) = self.backends.features(kind)
            && !f.code_events
        {
            return Err(self.lacks(
                "code events (--on-return, --on-entry)",
                |f| f.code_events,
                ", which holds the thread at the probe (a uprobe whose BPF program sends a \
                 signal the tracer catches) until its object is armed; this process's backend \
                 cannot hold a thread",
            ));
        }
        if matches!(spec.scope, Scope::Named(_) | Scope::Threads(_)) {
            return Err(WpdError::InvalidArgument(
                "a code event arms each object on every thread, or on its creating thread \
                 (creator_only); it takes no thread list or name"
                    .into(),
            ));
        }
        if code.stop {
            return self.set_code_breakpoint(spec, code, owner, id);
        }
        let site = self.symbols.code_site(spec.pid, &code.function)?;
        let root = crate::symbols::Symbols::check_code_expr(&site, &code.expr, code.at_return)
            .map_err(|why| WpdError::InvalidArgument(format!("--expr {:?}: {why}", code.expr)))?;
        // Members and casts are checked against the DWARF types now, with
        // every register an address below the lowest the kernel maps
        // (`vm.mmap_min_addr`): only a pointer that must be read
        // (`$ret->next->state`) waits for a real event. Evaluated from two
        // such bases, an expression that reads nothing moves with its base:
        // its offset and size are all an event needs.
        let dry = |base: u64| {
            self.symbols.code_object(
                spec.pid,
                &site,
                &code.expr,
                code.at_return,
                &crate::symbols::code::CodeRegs {
                    ret: base,
                    args: [base; crate::symbols::code::ARG_REGISTERS],
                },
                code.len,
            )
        };
        const NOWHERE: [u64; 2] = [0x100, 0x8100];
        let linear = match (dry(NOWHERE[0]), dry(NOWHERE[1])) {
            (Ok((a, _)), Ok((b, _)))
                if b.address.wrapping_sub(a.address) == NOWHERE[1] - NOWHERE[0] =>
            {
                Some((a.address.wrapping_sub(NOWHERE[0]), a.size))
            }
            (Ok(_), Ok(_))
            | (
                Err(crate::symbols::SymbolError::Path {
                    error: crate::symbols::dwarf::PathError::Unreadable { .. },
                    ..
                }),
                _,
            ) => None,
            (Err(e), _) | (_, Err(e)) => return Err(e.into()),
        };
        let disarm = match &code.disarm_on {
            Some(f) => Some(self.symbols.code_site(spec.pid, f)?),
            None => None,
        };
        // The objects' type, as evaluated at set: their values and the
        // condition read as it (`value::bind`).
        let mut object = spec.clone();
        if let Ok((r, _)) = dry(NOWHERE[0]) {
            if let Ok(range) = crate::arch::validate(r.address, r.size as u32, spec.access) {
                object.range = range;
            }
            object.value_type = r.value_type.map(Arc::new);
        }
        object.bind_condition().map_err(WpdError::InvalidArgument)?;
        (spec.value_type, spec.filter.condition) = (object.value_type, object.filter.condition);
        spec.symbol = None;
        self.open_object_watch(spec, code, owner, site, root, linear, disarm, None, id)
    }

    /// Attaches the process, registers the watch and opens its probes; a
    /// refusal undoes all of it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn open_object_watch(
        self: &Arc<Self>,
        spec: WatchSpec,
        code: CodeSpec,
        owner: u32,
        site: CodeSite,
        root: crate::symbols::code::Root,
        linear: Option<(u64, u64)>,
        disarm: Option<CodeSite>,
        place: Option<BreakPlace>,
        id: Option<WatchId>,
    ) -> Result<ObjectView, WpdError> {
        let probes = object_probes(WatchId(0), owner, &code, &site, disarm.as_ref());
        let kernel_bytes: u64 = probes.iter().map(crate::backend::code_probe_bytes).sum();
        let held = self.objects.kernel_bytes_of(owner);
        let limit = self.limits.code_event_bytes_per_caller;
        if held.saturating_add(kernel_bytes) > limit {
            return Err(WpdError::KernelMemory {
                needed: kernel_bytes,
                held,
                limit,
            });
        }
        let (proc, newly) = self.attach_for(owner, spec.pid, spec.backend, spec.allow_init)?;
        let id = id.unwrap_or_else(|| WatchId(self.next_id.fetch_add(1, Ordering::Relaxed)));
        let w = Arc::new(ObjectWatch {
            id,
            owner,
            spec: spec.clone(),
            code: code.clone(),
            site: site.clone(),
            root,
            linear,
            live: Mutex::new(HashMap::new()),
            counts: ObjectCounts::default(),
            place: place.map(Arc::new),
            hits: AtomicU64::new(0),
            recent: Mutex::new(std::collections::VecDeque::new()),
            reported: AtomicU64::new(0),
            ready: std::sync::atomic::AtomicBool::new(false),
            kernel_bytes,
        });
        self.objects.watches.insert(id, w.clone());
        self.start_objects_thread();
        if let Some(tx) = self.objects.tx.lock().unwrap().as_ref() {
            let _ = tx.send(Msg::Wake);
        }
        let opened = (|| {
            let backend = self.backends.get(Some(proc.backend))?;
            let _op = proc.lock_op();
            for p in object_probes(id, owner, &code, &site, disarm.as_ref()) {
                backend.open_code_probe(spec.pid, &p)?;
            }
            Ok::<_, WpdError>(())
        })();
        if let Err(e) = opened {
            self.objects.watches.remove(&id);
            if let Ok(b) = self.backends.get(Some(proc.backend)) {
                b.close_code_probes(spec.pid, Some(&[event_key(id), disarm_key(id)]));
            }
            if newly
                && proc.watch_ids().is_empty()
                && !self.has_object_watch(spec.pid)
                && !self.objects.hooks.contains_key(&spec.pid)
            {
                self.forget_process(&proc);
            }
            return Err(e);
        }
        w.ready.store(true, Ordering::Release);
        tracing::info!(
            id = id.0,
            pid = spec.pid,
            function = %site.function,
            module = %site.module.path,
            offset = site.offset,
            "object watch set"
        );
        Ok(self.object_view(&w))
    }
}
