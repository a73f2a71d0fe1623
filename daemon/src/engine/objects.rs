//! Watchpoints armed by code events: every object a function returns (or
//! is given) gets a watchpoint on what an expression names in it.
//!
//! An *object watch* is a template (a `WatchSpec` with its filter and
//! action, an expression, a function) and a probe at the function's
//! return or entry (`Backend::open_code_probe`). When a thread reaches the
//! probe the backend holds it and calls `Host::code_event`; the core hands
//! the record to the `wpd-objects` thread, which evaluates the expression
//! from the recorded registers, sets an ordinary watchpoint (the ledger,
//! all or nothing, like any other) and only then resumes the thread: the
//! first store to the object after the function returns is seen.
//!
//! With `disarm_on`, a second probe at that function's entry: a call whose
//! first argument is a live object's base (the value the expression
//! started from, e.g. `$ret`) ends the object. That call stops no one: the
//! probe's program takes the base out of the kernel's set of live bases
//! and records the call; from then on the object's hits are not reported,
//! and its watchpoint is removed at the next stop of a thread of the
//! process (by the tracer holding it, before that stop's hits are looked
//! at) or by the objects thread within two `FREED_SWEEP`s, whichever comes
//! first. `max_live` bounds the live objects. Every object not armed
//! (no slot, over the bound, an expression that could not be evaluated) is
//! counted on the object watch and in `GetStats`, and logged.
//!
//! A *code breakpoint* (`CodeSpec::stop`) is an object watch that arms
//! nothing: its probe is past a function's prologue or at a source line's
//! first instruction (`Symbols::break_site`), and a thread that reaches it
//! stays held, reported by a `BreakpointHit` event, until a `Resume`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use dashmap::DashMap;

use super::Core;
use crate::backend::{CodeProbe, CodeRecord, ProgramResult, StopArmer};
use crate::error::WpdError;
use crate::model::{Pid, Scope, Tid, WatchId, WatchSpec};
use crate::state::{OpGuard, Watch};
use crate::symbols::code::CodeSite;

/// What a code event is (the part of an object watch's spec beyond an
/// ordinary watchpoint's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeSpec {
    /// The function, `[MODULE:]NAME`.
    pub function: String,
    /// At its return (else at its entry).
    pub at_return: bool,
    /// The expression (`$ret->state`, `c->refs`, `$arg0+8`).
    pub expr: String,
    /// Bytes watched (0: the object's size).
    pub len: u32,
    /// A function whose call with an object's base as first argument
    /// removes that object's watchpoint (`free`).
    pub disarm_on: Option<String>,
    /// Most live objects (0: no bound).
    pub max_live: u32,
    /// Each object's watchpoint on its creating thread only.
    pub creator_only: bool,
    /// A code breakpoint: hold the thread and report it, arm nothing.
    pub stop: bool,
    /// A code breakpoint at a source line (file, line) rather than at
    /// `function`.
    pub line: Option<(String, u32)>,
    /// A code breakpoint lets the first `ignore` threads that reach it go
    /// on, then holds every `every`th (0 and 1: each one).
    pub ignore: u64,
    /// See `ignore`.
    pub every: u64,
    /// Accepted while its module is not loaded: armed when it is (see
    /// [`Pending`]).
    pub pending: bool,
}

impl CodeSpec {
    /// Where it is, as asked: `[MODULE:]NAME`, or `FILE:LINE`.
    pub fn at(&self) -> String {
        match &self.line {
            Some((file, line)) => format!("{file}:{line}"),
            None => self.function.clone(),
        }
    }
}

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
fn pending_reason(e: &crate::symbols::SymbolError) -> String {
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
const RT_CONSISTENT: u32 = 0;

/// A process's probe at its dynamic linker's hook.
#[derive(Debug, Clone, Copy)]
struct LoaderHook {
    /// Its key's id.
    id: WatchId,
    /// Where `r_state` is in the process, if the loader names `_r_debug`.
    r_state: Option<u64>,
}

pub use crate::model::BreakPlace;

/// Counts of one object watch (or of all of them).
#[derive(Debug, Default)]
pub struct ObjectCounts {
    /// Objects armed.
    pub armed: AtomicU64,
    /// Objects disarmed by `disarm_on`.
    pub disarmed: AtomicU64,
    /// Objects not armed: a thread had no free slot.
    pub no_slot: AtomicU64,
    /// Objects not armed: `max_live` objects were live.
    pub over_limit: AtomicU64,
    /// Objects not armed: the expression could not be evaluated, or the
    /// watchpoint was refused for another reason.
    pub failed: AtomicU64,
    /// Total time threads were held for arming, in ns.
    pub held_ns: AtomicU64,
    /// Of `armed`, those armed at the stop by the tracer holding the thread.
    pub armed_at_stop: AtomicU64,
    /// Of `disarmed`, those disarmed at the stop.
    pub disarmed_at_stop: AtomicU64,
    /// Freeing calls of watched objects recorded in the kernel without a
    /// stop.
    pub freed_without_stop: AtomicU64,
}

/// A snapshot of [`ObjectCounts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectCountsView {
    /// Objects armed.
    pub armed: u64,
    /// Objects disarmed by `disarm_on`.
    pub disarmed: u64,
    /// Not armed: no free slot.
    pub no_slot: u64,
    /// Not armed: over `max_live`.
    pub over_limit: u64,
    /// Not armed: evaluation or another refusal.
    pub failed: u64,
    /// Objects live now.
    pub live: u64,
    /// Mean time a thread was held to arm one object, ns.
    pub mean_hold_ns: u64,
    /// Of `armed`, those armed at the stop by the tracer holding the thread.
    pub armed_at_stop: u64,
    /// Of `disarmed`, those disarmed at the stop.
    pub disarmed_at_stop: u64,
    /// Freeing calls of watched objects recorded without a stop.
    pub freed_without_stop: u64,
}

impl ObjectCounts {
    fn view(&self, live: u64) -> ObjectCountsView {
        let armed = self.armed.load(Ordering::Relaxed);
        let tried =
            armed + self.no_slot.load(Ordering::Relaxed) + self.failed.load(Ordering::Relaxed);
        ObjectCountsView {
            armed,
            disarmed: self.disarmed.load(Ordering::Relaxed),
            no_slot: self.no_slot.load(Ordering::Relaxed),
            over_limit: self.over_limit.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            live,
            mean_hold_ns: self
                .held_ns
                .load(Ordering::Relaxed)
                .checked_div(tried)
                .unwrap_or(0),
            armed_at_stop: self.armed_at_stop.load(Ordering::Relaxed),
            disarmed_at_stop: self.disarmed_at_stop.load(Ordering::Relaxed),
            freed_without_stop: self.freed_without_stop.load(Ordering::Relaxed),
        }
    }
}

/// One object watch.
#[derive(Debug)]
pub struct ObjectWatch {
    /// Its id (shared with watchpoints).
    pub id: WatchId,
    /// Who set it.
    pub owner: u32,
    /// The template of each object's watchpoint (its range is set per
    /// object).
    pub spec: WatchSpec,
    /// The code event.
    pub code: CodeSpec,
    /// Where its probe is.
    site: CodeSite,
    /// The register the expression starts from.
    root: crate::symbols::code::Root,
    /// Where the expression ends when it reads no memory past its root
    /// (`$ret->state`, `c->refs[2]`, `$arg0+8`): its offset from the root's
    /// value and its size, found once at set. Events then cost no
    /// evaluation.
    linear: Option<(u64, u64)>,
    /// Live objects: base → their watchpoint.
    live: Mutex<HashMap<u64, WatchId>>,
    /// Its counts.
    pub counts: ObjectCounts,
    /// A code breakpoint's place.
    place: Option<Arc<BreakPlace>>,
    /// Times a code breakpoint was reached.
    hits: AtomicU64,
    /// A code breakpoint's last reported stops (`BreakpointHit` events),
    /// oldest first, at most `spec.keep_recent` (GetRecentHits).
    recent: Mutex<std::collections::VecDeque<Arc<crate::events::Event>>>,
    /// Stops a code breakpoint reported (those its ignore and hit counts
    /// let go on are not).
    reported: AtomicU64,
    /// Its probes are open: until then it is registered (a probe that
    /// fires at once finds it) but not listed.
    ready: std::sync::atomic::AtomicBool,
    /// Most kernel memory its probes, programs and sets take
    /// (`code::kernel_bytes`), counted against its owner's limit.
    pub kernel_bytes: u64,
}

/// What the daemon says of an object watch.
#[derive(Debug, Clone)]
pub struct ObjectView {
    /// Id.
    pub id: WatchId,
    /// The template spec.
    pub spec: WatchSpec,
    /// The code event.
    pub code: CodeSpec,
    /// Counts.
    pub counts: ObjectCountsView,
    /// The watchpoints of the live objects.
    pub live: Vec<WatchId>,
    /// A code breakpoint's place.
    pub place: Option<BreakPlace>,
    /// Times a code breakpoint was reached.
    pub hits: u64,
    /// Its probes are open (a watch being set is not listed yet).
    pub ready: bool,
    /// Pending: its module is not loaded yet, no probe is open.
    pub pending: bool,
    /// Why it is pending.
    pub pending_why: Option<String>,
}

/// Work for the objects thread.
enum Msg {
    /// Arm the object a probe's record names, then resume the thread.
    Arm(WatchId, CodeRecord, std::time::Instant),
    /// A thread of the process is at its loader's hook: arm the pending
    /// events whose module is mapped now, then resume the thread.
    Loaded(Pid, Tid),
    /// Disarm the object whose base is `u64`, then resume the thread.
    Disarm(WatchId, Pid, Tid, u64),
    /// The object of base `u64` was freed without a stop: remove its
    /// watchpoint (the second id) if it is still that base's.
    Freed(WatchId, u64, WatchId),
    /// An object watch was set: the thread (waiting without a deadline
    /// while no watch has a disarming probe) looks again whether it must
    /// sweep.
    Wake,
}

/// The core's object watches.
#[derive(Debug, Default)]
pub struct Objects {
    watches: DashMap<WatchId, Arc<ObjectWatch>>,
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    /// Every object watch's counts, summed (GetStats).
    pub totals: ObjectCounts,
    /// Code events waiting for their module.
    pending: DashMap<WatchId, Pending>,
    /// Processes with pending events: their loader-hook probe.
    hooks: DashMap<Pid, LoaderHook>,
    /// Held while pending events are looked for (at a hook's stop, or
    /// right after one is set): one event is never armed twice.
    resolving: Mutex<()>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Msg")
    }
}

/// What the daemon says of a pending code event.
fn pending_view(p: &Pending) -> ObjectView {
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

fn event_key(id: WatchId) -> u64 {
    id.0 << 1
}

fn disarm_key(id: WatchId) -> u64 {
    id.0 << 1 | 1
}

impl Objects {
    /// Whether `id` is an object watch.
    pub fn watch_exists(&self, id: WatchId) -> bool {
        self.watches.contains_key(&id) || self.pending.contains_key(&id)
    }

    /// Whether process `pid` has a probe at its loader's hook.
    pub fn has_loader_hook(&self, pid: Pid) -> bool {
        self.hooks.contains_key(&pid)
    }

    /// The summed counts (GetStats).
    /// Code events `owner` holds (object watches and code breakpoints,
    /// pending ones included).
    pub fn held_by(&self, owner: u32) -> usize {
        self.watches.iter().filter(|w| w.owner == owner).count()
            + self.pending.iter().filter(|p| p.owner == owner).count()
    }

    /// Most kernel memory `owner`'s code events take (their probes,
    /// programs and sets).
    pub fn kernel_bytes_of(&self, owner: u32) -> u64 {
        self.watches
            .iter()
            .filter(|w| w.owner == owner)
            .map(|w| w.kernel_bytes)
            .sum()
    }

    /// Most kernel memory every code event takes.
    pub fn kernel_bytes(&self) -> u64 {
        self.watches.iter().map(|w| w.kernel_bytes).sum()
    }

    /// The counts of `owner`'s object watches (those removed are gone).
    pub fn totals_for(&self, owner: u32) -> ObjectCountsView {
        let mut t = ObjectCountsView::default();
        let (mut held_ns, mut tried) = (0u64, 0u64);
        for w in self.watches.iter().filter(|w| w.owner == owner) {
            let v = w.counts.view(w.live.lock().unwrap().len() as u64);
            t.armed += v.armed;
            t.disarmed += v.disarmed;
            t.no_slot += v.no_slot;
            t.over_limit += v.over_limit;
            t.failed += v.failed;
            t.live += v.live;
            t.armed_at_stop += v.armed_at_stop;
            t.disarmed_at_stop += v.disarmed_at_stop;
            t.freed_without_stop += v.freed_without_stop;
            held_ns += w.counts.held_ns.load(Ordering::Relaxed);
            tried += v.armed + v.no_slot + v.failed;
        }
        t.mean_hold_ns = held_ns.checked_div(tried).unwrap_or(0);
        t
    }

    /// The ids of process `pid`'s code events (object watches, code
    /// breakpoints, pending ones), in order.
    pub fn ids_on(&self, pid: Pid) -> Vec<WatchId> {
        let mut v: Vec<WatchId> = self
            .watches
            .iter()
            .filter(|w| w.spec.pid == pid)
            .map(|w| w.id)
            .chain(
                self.pending
                    .iter()
                    .filter(|p| p.spec.pid == pid)
                    .map(|p| p.id),
            )
            .collect();
        v.sort_unstable();
        v
    }

    /// Code events held, every caller's.
    pub fn count(&self) -> usize {
        self.watches.len() + self.pending.len()
    }

    pub fn totals(&self) -> ObjectCountsView {
        let live = self
            .watches
            .iter()
            .map(|w| w.live.lock().unwrap().len() as u64)
            .sum();
        self.totals.view(live)
    }
}

/// The addresses of `w`'s breakpoints (one per piece).
fn piece_addrs(w: &Watch) -> impl Iterator<Item = u64> + '_ {
    range_addrs(&w.spec.range)
}

/// The addresses of a range's breakpoints (one per piece).
fn range_addrs(r: &crate::model::Range) -> impl Iterator<Item = u64> + '_ {
    (0..r.slots()).map(|i| r.piece(i as u8).addr)
}

/// Takes `base` out of `w`'s live objects if `child` is its object: true
/// if it was.
fn live_remove_if(w: &ObjectWatch, base: u64, child: WatchId) -> bool {
    let mut live = w.live.lock().unwrap();
    if live.get(&base) == Some(&child) {
        live.remove(&base);
        true
    } else {
        false
    }
}

fn bump(w: &ObjectWatch, totals: &ObjectCounts, f: fn(&ObjectCounts) -> &AtomicU64) {
    f(&w.counts).fetch_add(1, Ordering::Relaxed);
    f(totals).fetch_add(1, Ordering::Relaxed);
}

/// The probes of object watch `id`: at its function (entry or return),
/// and at its disarming function's entry, filtered on the live objects.
fn object_probes(
    id: WatchId,
    owner: u32,
    code: &CodeSpec,
    site: &CodeSite,
    disarm: Option<&CodeSite>,
) -> Vec<CodeProbe> {
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
        });
    }
    v
}

/// Most live objects of an object watch with a disarming function that
/// names no bound (`max_live` 0): the size of the kernel's set of live
/// bases its disarming probe filters on (kernel memory is taken per live
/// object, up to about 0.5 MiB at this bound: kernel-facts §21).
pub const DISARM_MAX_LIVE: u32 = 4096;

/// The bound on `code`'s live objects (0: none): its `max_live`, else
/// [`DISARM_MAX_LIVE`] with a disarming function.
pub fn live_bound(code: &CodeSpec) -> u32 {
    match (code.max_live, code.disarm_on.is_some()) {
        (0, true) => DISARM_MAX_LIVE,
        (n, true) => n.min(crate::backend::CODE_SET_MAX),
        (n, false) => n,
    }
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
    fn code_backend(&self, spec: &mut WatchSpec) -> Option<crate::model::BackendKind> {
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
    fn set_object_watch_as(
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

    /// Sets a code breakpoint (`code.stop`): its probe past a function's
    /// prologue or at a line's first instruction. Blocking.
    fn set_code_breakpoint(
        self: &Arc<Self>,
        mut spec: WatchSpec,
        code: CodeSpec,
        owner: u32,
        id: Option<WatchId>,
    ) -> Result<ObjectView, WpdError> {
        use crate::symbols::code::BreakAt;
        let at = match &code.line {
            Some((file, line)) => BreakAt::Line {
                file: file.clone(),
                line: *line,
            },
            None => BreakAt::Function(code.function.clone()),
        };
        let b = self.symbols.break_site(spec.pid, &at)?;
        let place = BreakPlace {
            function: b.site.function.clone(),
            file: b.file,
            line: b.line,
            address: b.site.vaddr.wrapping_add(b.site.bias),
            module: b.site.module.path.clone(),
            offset: b.site.offset,
        };
        spec.symbol = None;
        spec.policy = None;
        self.open_object_watch(
            spec,
            code,
            owner,
            b.site,
            crate::symbols::code::Root::Ret,
            None,
            None,
            Some(place),
            id,
        )
    }

    /// Attaches the process, registers the watch and opens its probes; a
    /// refusal undoes all of it.
    #[allow(clippy::too_many_arguments)]
    fn open_object_watch(
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

    /// Registers a pending code event (its module not loaded yet) and
    /// makes sure its process has a probe at its loader's hook; then looks
    /// once more, for a module mapped meanwhile. Blocking.
    fn set_pending(
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
    fn close_loader_hook_if_idle(&self, pid: Pid) {
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
    fn resolve_pending(self: &Arc<Self>, pid: Pid) {
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

    /// The disarming probe of `id` acts only on a live base: `base` joins
    /// its set with its object's watchpoint `child` (its id and its
    /// breakpoints' addresses), or leaves it (`None`). False: it could not
    /// join (the kernel refused the entry: its memory), and the object's
    /// free would not be seen: the caller drops the object.
    fn disarm_filter(&self, pid: Pid, id: WatchId, base: u64, child: Option<&Watch>) -> bool {
        let kind = self.procs.get(&pid).map(|p| p.backend);
        let Some(b) = kind.and_then(|k| self.backends.get(Some(k)).ok()) else {
            return true;
        };
        let value: Vec<u64> = child
            .map(|c| std::iter::once(c.id.0).chain(piece_addrs(c)).collect())
            .unwrap_or_default();
        let ok = b.code_probe_member(disarm_key(id), base, &value, child.is_some());
        if !ok && let Some(c) = child {
            tracing::warn!(
                id = id.0,
                pid,
                child = c.id.0,
                "object not armed: the kernel did not take its base into the disarming \
                 probe's set"
            );
        }
        ok
    }

    /// Takes the addresses of `w`'s breakpoints out of its process's muted
    /// ones (see [`crate::backend::Backend::unmute`]).
    fn unmute(&self, w: &Watch) {
        self.unmute_range(w.spec.pid, w.backend, &w.spec.range);
    }

    fn unmute_range(&self, pid: Pid, kind: crate::model::BackendKind, range: &crate::model::Range) {
        if let Ok(b) = self.backends.get(Some(kind)) {
            b.unmute(pid, &range_addrs(range).collect::<Vec<_>>());
        }
    }

    /// Objects freed without a stop (see [`crate::backend::Host::objects_freed`]):
    /// each object's watchpoint stops reporting at once, and is removed
    /// through `armer` where it reaches the watchpoint's threads, else by
    /// the objects thread. A record whose object is no longer its base's
    /// live one (removed already, the base handed out anew) changes
    /// nothing.
    pub(super) fn objects_freed_seen(
        &self,
        records: &[CodeRecord],
        mut armer: Option<&mut dyn StopArmer>,
    ) {
        let tx = self.objects.tx.lock().unwrap().clone();
        for r in records.iter().filter(|r| r.freed) {
            let id = WatchId(r.key >> 1);
            let Some(w) = self.objects.watches.get(&id).map(|w| w.clone()) else {
                continue;
            };
            let (base, child) = (r.args[0], WatchId(r.ret));
            if w.spec.pid != r.pid || w.live.lock().unwrap().get(&base) != Some(&child) {
                continue;
            }
            if let Some(cw) = self.watches.get(&child) {
                cw.freed.store(true, Ordering::Relaxed);
            }
            bump(&w, &self.objects.totals, |c| &c.freed_without_stop);
            let done = armer
                .as_deref_mut()
                .is_some_and(|a| self.freed_at_stop(&w, base, child, a));
            if !done && let Some(tx) = &tx {
                let _ = tx.send(Msg::Freed(id, base, child));
            }
        }
    }

    /// Removes the freed object `child` of base `base` from a tracer thread
    /// at a stop, if it reaches every thread holding it; false: nothing
    /// was done.
    fn freed_at_stop(
        &self,
        w: &ObjectWatch,
        base: u64,
        child: WatchId,
        armer: &mut dyn StopArmer,
    ) -> bool {
        let Some(proc) = self.procs.get(&w.spec.pid).map(|p| p.clone()) else {
            return false;
        };
        let Some(op) = proc.try_lock_op() else {
            return false;
        };
        if w.live.lock().unwrap().get(&base) != Some(&child) {
            return true; // taken off meanwhile
        }
        let cw = self.watches.get(&child).map(|c| c.clone());
        if !self.drop_at_stop(&op, child, armer) {
            return false;
        }
        if let Some(cw) = cw {
            self.unmute(&cw);
        }
        if live_remove_if(w, base, child) {
            bump(w, &self.objects.totals, |c| &c.disarmed);
            bump(w, &self.objects.totals, |c| &c.disarmed_at_stop);
        }
        true
    }

    /// Reads the records of freeing calls no stop has read for a whole
    /// `FREED_SWEEP` (the objects thread, every `FREED_SWEEP` while an
    /// object watch has a disarming probe): within two periods of its
    /// call, an object nobody's stop took off is taken off here.
    fn sweep_freed(&self) {
        // The backends of the processes with disarming probes.
        let mut kinds = Vec::new();
        for w in self.objects.watches.iter() {
            if w.code.disarm_on.is_some()
                && w.place.is_none()
                && let Some(p) = self.procs.get(&w.spec.pid)
                && !kinds.contains(&p.backend)
            {
                kinds.push(p.backend);
            }
        }
        for kind in kinds {
            if let Ok(b) = self.backends.get(Some(kind)) {
                let freed = b.take_freed(true);
                if !freed.is_empty() {
                    self.objects_freed_seen(&freed, None);
                }
            }
        }
    }

    /// Whether an object watch has a disarming probe (its freeing calls
    /// are then swept).
    fn has_disarming(&self) -> bool {
        self.objects
            .watches
            .iter()
            .any(|w| w.code.disarm_on.is_some() && w.place.is_none())
    }

    fn has_object_watch(&self, pid: Pid) -> bool {
        self.objects.watches.iter().any(|w| w.spec.pid == pid)
    }

    /// The object watch `id`, if it is one.
    pub fn object_watch(&self, id: WatchId) -> Option<ObjectView> {
        match self.objects.watches.get(&id) {
            Some(w) if w.ready.load(Ordering::Acquire) => Some(self.object_view(&w)),
            w => self
                .objects
                .pending
                .get(&id)
                .map(|p| pending_view(&p))
                .or_else(|| w.map(|w| self.object_view(&w))),
        }
    }

    /// The stops code breakpoint `id` kept (the last `limit`, or all with
    /// 0), oldest first, its process, and how many it reported in all;
    /// `None` when `id` is no code breakpoint.
    pub fn breakpoint_recent(
        &self,
        id: WatchId,
        limit: usize,
    ) -> Option<(Vec<Arc<crate::events::Event>>, Pid, u64)> {
        let w = self.objects.watches.get(&id).map(|w| w.clone())?;
        w.place.as_ref()?;
        let kept = w.recent.lock().unwrap();
        let skip = match limit {
            0 => 0,
            n => kept.len().saturating_sub(n),
        };
        let reported = w.reported.load(Ordering::Relaxed);
        Some((
            kept.iter().skip(skip).cloned().collect(),
            w.spec.pid,
            reported,
        ))
    }

    /// Every object watch.
    pub fn object_watches(&self) -> Vec<ObjectView> {
        let mut all: Vec<ObjectView> = self
            .objects
            .watches
            .iter()
            .map(|w| self.object_view(&w))
            .collect();
        // One being armed is listed as pending until its probes are open,
        // as armed from then on.
        all.retain(|v| v.ready || !self.objects.pending.contains_key(&v.id));
        let armed: std::collections::HashSet<WatchId> = all.iter().map(|v| v.id).collect();
        all.extend(
            self.objects
                .pending
                .iter()
                .filter(|p| !armed.contains(&p.id))
                .map(|p| pending_view(&p)),
        );
        all
    }

    fn object_view(&self, w: &ObjectWatch) -> ObjectView {
        let live: Vec<WatchId> = w.live.lock().unwrap().values().copied().collect();
        ObjectView {
            id: w.id,
            spec: w.spec.clone(),
            code: w.code.clone(),
            counts: w.counts.view(live.len() as u64),
            live,
            place: w.place.as_deref().cloned(),
            hits: w.hits.load(Ordering::Relaxed),
            ready: w.ready.load(Ordering::Acquire),
            pending: false,
            pending_why: None,
        }
    }

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
    pub(super) fn remove_object_watches_at_exec(&self, op: &crate::state::OpGuard<'_>) {
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
    pub(super) fn forget_object_watches(&self, pid: Pid) {
        self.objects.watches.retain(|_, w| w.spec.pid != pid);
        self.objects.pending.retain(|_, p| p.spec.pid != pid);
        self.objects.hooks.remove(&pid);
    }

    /// A thread is stopped at probes: whether to hold it (the objects
    /// thread resumes it; a code breakpoint's stop lasts until a Resume),
    /// and the process's other threads with it. Called on the tracer thread
    /// that holds it: what can be armed or disarmed there is done there
    /// (see [`Core::arm_at_stop`]); the rest goes to the objects thread.
    pub(super) fn code_event_seen(
        &self,
        pid: Pid,
        tid: Tid,
        records: &[CodeRecord],
        armer: &mut dyn StopArmer,
    ) -> crate::backend::CodeHold {
        use crate::backend::CodeHold;
        let at = std::time::Instant::now();
        let tx = self.objects.tx.lock().unwrap().clone();
        let Some(tx) = tx else {
            return CodeHold::Run;
        };
        let mut hold = false;
        let mut stop = false;
        let mut stop_all = false;
        for r in records {
            let id = WatchId(r.key >> 1);
            let hook = self.objects.hooks.get(&pid).map(|h| *h);
            if let Some(hook) = hook
                && hook.id == id
            {
                // The loader is about to change its list of objects (read
                // here, at the stop: nothing new is mapped yet), or has
                // changed it: then the thread waits while the pending
                // events are looked for.
                let before_change = hook.r_state.is_some_and(|at| {
                    crate::procfs::read_memory(pid, tid, at, 4).is_ok_and(|b| {
                        b.len() == 4
                            && u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) != RT_CONSISTENT
                    })
                });
                if !before_change {
                    hold |= tx.send(Msg::Loaded(pid, tid)).is_ok();
                }
                continue;
            }
            let Some(w) = self.objects.watches.get(&id).map(|w| w.clone()) else {
                continue;
            };
            if w.spec.pid != pid {
                continue;
            }
            if let Some(place) = &w.place {
                // A code breakpoint: held until a Resume, if its hit count
                // says so.
                let count = w.hits.fetch_add(1, Ordering::Relaxed) + 1;
                let (ignore, every) = (w.code.ignore, w.code.every);
                if count <= ignore || (every > 1 && (count - ignore) % every != 0) {
                    continue;
                }
                let owner = self.procs.get(&pid).map(|p| p.owner.clone());
                let ev = self.bus.publish_kept(
                    crate::events::EventKind::BreakpointHit {
                        id,
                        pid,
                        tid,
                        place: place.clone(),
                        count,
                    },
                    owner,
                );
                w.reported.fetch_add(1, Ordering::Relaxed);
                let keep = w.spec.keep_recent as usize;
                let mut recent = w.recent.lock().unwrap();
                while keep > 0 && recent.len() >= keep {
                    recent.pop_front();
                }
                if keep > 0 {
                    recent.push_back(ev);
                }
                stop = true;
                stop_all |= w.spec.action == crate::model::HitAction::StopAll;
                continue;
            }
            if r.key & 1 == 1 {
                // A call of the disarming function: ours only if its first
                // argument is a live object's base.
                let base = r.args[0];
                if !w.live.lock().unwrap().contains_key(&base) {
                    continue;
                }
                // Once one record waits for the objects thread, those after
                // it wait too: they are done in order.
                if hold || !self.disarm_at_stop(&w, base, armer) {
                    hold |= tx.send(Msg::Disarm(id, pid, tid, base)).is_ok();
                }
                continue;
            }
            let bound = live_bound(&w.code);
            if bound > 0 && w.live.lock().unwrap().len() >= bound as usize {
                bump(&w, &self.objects.totals, |c| &c.over_limit);
                // Counted (ObjectCounts.over_limit); at a high rate, by design.
                tracing::debug!(
                    id = id.0,
                    pid,
                    tid,
                    max_live = bound,
                    "object not armed: max_live objects are live"
                );
                continue;
            }
            if !hold && self.arm_at_stop(&w, r, armer) {
                let ns = at.elapsed().as_nanos() as u64;
                w.counts.held_ns.fetch_add(ns, Ordering::Relaxed);
                self.objects.totals.held_ns.fetch_add(ns, Ordering::Relaxed);
                continue;
            }
            hold |= tx.send(Msg::Arm(id, *r, at)).is_ok();
        }
        match (hold || stop, stop_all) {
            (_, true) => CodeHold::HoldAll,
            (true, false) => CodeHold::Hold,
            (false, false) => CodeHold::Run,
        }
    }

    /// Arms the object of record `r` from the tracer thread holding its
    /// thread, if that thread can do it all: the process's operation lock
    /// free, the expression read no memory, every thread to arm reachable
    /// from that tracer (`armer.reaches`: with signal stops, any tracer's
    /// thread past its birth). The ledger is used as by any arm (all
    /// or nothing: the slots reserved on every thread, armed, committed,
    /// or every one undone), without a park or a free-slot probe: the
    /// tracer opens each breakpoint, and a refusal (`ENOSPC`) leaves no
    /// slot behind. False: nothing was done, the objects thread does it.
    fn arm_at_stop(&self, w: &ObjectWatch, r: &CodeRecord, armer: &mut dyn StopArmer) -> bool {
        let totals = &self.objects.totals;
        let pid = w.spec.pid;
        let Some((offset, size)) = w.linear else {
            return false;
        };
        let base = match w.root {
            crate::symbols::code::Root::Ret => r.ret,
            crate::symbols::code::Root::Arg(i) => r.args[i],
        };
        let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
            return false;
        };
        let Some(op) = proc.try_lock_op() else {
            return false;
        };
        if proc.is_gone() {
            return false;
        }
        let tids: Vec<Tid> = if w.code.creator_only {
            vec![r.tid]
        } else {
            let mut t = self.ledger.tids(pid);
            t.sort_unstable();
            t
        };
        if !tids.iter().all(|&t| armer.reaches(t)) {
            return false;
        }
        // The same base again (freed without the disarming function, and
        // handed out anew): the old object's watchpoint goes first.
        let old = w.live.lock().unwrap().get(&base).copied();
        if let Some(old) = old {
            if !self.drop_at_stop(&op, old, armer) {
                return false;
            }
            w.live.lock().unwrap().remove(&base);
            self.disarm_filter(pid, w.id, base, None);
        }
        if base == 0 {
            bump(w, totals, |c| &c.failed);
            tracing::warn!(
                id = w.id.0,
                pid,
                tid = r.tid,
                "object not armed: {} is a null pointer",
                w.code.expr
            );
            return true;
        }
        let address = base.wrapping_add(offset);
        let len = u32::try_from(size).unwrap_or(u32::MAX);
        let range = match crate::arch::validate(address, len, w.spec.access) {
            Ok(r) => r,
            Err(e) => {
                bump(w, totals, |c| &c.failed);
                tracing::warn!(id = w.id.0, pid, tid = r.tid, "object not armed: {e}");
                return true;
            }
        };
        let Ok(backend) = self.backends.get(Some(proc.backend)) else {
            return false;
        };
        let retained = backend.retained();
        let mut spec = w.spec.clone();
        spec.range = range;
        spec.symbol = None;
        spec.policy = None;
        spec.scope = if w.code.creator_only {
            Scope::Threads(vec![r.tid])
        } else {
            Scope::Process
        };
        let id = WatchId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let watch = super::watch::new_watch(id, spec, proc.backend, w.owner, None, true);
        if watch.spec.only_on_change {
            *watch.last_value.lock().unwrap() = crate::procfs::read_memory(
                pid,
                r.tid,
                watch.spec.range.addr,
                watch.spec.range.len as usize,
            )
            .ok();
        }
        // Registered first, as any arm: a thread born from here on gets it
        // at birth (its first stop, handled by this same tracer).
        self.watches.insert(id, watch.clone());
        proc.watches.lock().unwrap().insert(id);
        let unregister = || {
            self.watches.remove(&id);
            proc.watches.lock().unwrap().remove(&id);
        };
        let res = match self.ledger.reserve_all(
            &tids,
            id,
            watch.spec.range.slots() as u8,
            watch.process_wide,
            retained,
        ) {
            Ok(res) => res,
            Err(conflicts) => {
                unregister();
                bump(w, totals, |c| &c.no_slot);
                let e = WpdError::OutOfSlots {
                    pid,
                    needed: watch.spec.range.slots(),
                    conflicts,
                };
                tracing::warn!(id = w.id.0, pid, tid = r.tid, "object not armed: {e}");
                return true;
            }
        };
        // Its addresses may still be muted from an object freed there.
        self.unmute(&watch);
        let outcomes = armer.arm(&watch, &res);
        let (mut ok, mut gone, mut full, mut failed) = (Vec::new(), Vec::new(), Vec::new(), None);
        for (res, o) in res.iter().zip(outcomes) {
            match o {
                ProgramResult::Done => ok.push(*res),
                ProgramResult::Gone => gone.push(*res),
                ProgramResult::NoSpace => {
                    self.ledger.mark_foreign(*res);
                    full.push(res.tid);
                }
                ProgramResult::Failed(e) => {
                    self.ledger.rollback(&[*res]);
                    failed = Some(e);
                }
            }
        }
        self.ledger.rollback(&gone);
        self.ledger.commit(&ok, None);
        if full.is_empty() && failed.is_none() {
            bump(w, totals, |c| &c.armed);
            bump(w, totals, |c| &c.armed_at_stop);
            w.live.lock().unwrap().insert(base, id);
            if !self.disarm_filter(pid, w.id, base, Some(&watch))
                && self.drop_at_stop(&op, id, armer)
            {
                w.live.lock().unwrap().remove(&base);
                bump(w, totals, |c| &c.failed);
            }
            return true;
        }
        // All or nothing: what was armed is cleared, every slot released.
        unregister();
        armer.clear(&self.ledger.slots_on(&tids, id));
        self.release_slots(&watch, retained);
        let e = match failed {
            Some(e) => {
                bump(w, totals, |c| &c.failed);
                WpdError::kernel("perf_event_open(signal stop)", e)
            }
            None => {
                bump(w, totals, |c| &c.no_slot);
                WpdError::OutOfSlots {
                    pid,
                    needed: watch.spec.range.slots(),
                    conflicts: self.ledger.conflicts(full),
                }
            }
        };
        tracing::warn!(id = w.id.0, pid, tid = r.tid, "object not armed: {e}");
        true
    }

    /// Removes the watchpoint of the live object `base` from the tracer
    /// thread holding the thread that frees it, if that tracer reaches
    /// every thread holding it (see [`Core::arm_at_stop`]). False: nothing
    /// was done.
    fn disarm_at_stop(&self, w: &ObjectWatch, base: u64, armer: &mut dyn StopArmer) -> bool {
        let pid = w.spec.pid;
        let Some(child) = w.live.lock().unwrap().get(&base).copied() else {
            return true;
        };
        let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
            return false;
        };
        let Some(op) = proc.try_lock_op() else {
            return false;
        };
        if !self.drop_at_stop(&op, child, armer) {
            return false;
        }
        if w.live.lock().unwrap().remove(&base).is_some() {
            self.disarm_filter(pid, w.id, base, None);
            bump(w, &self.objects.totals, |c| &c.disarmed);
            bump(w, &self.objects.totals, |c| &c.disarmed_at_stop);
        }
        true
    }

    /// Takes watchpoint `id` off the locked process through `armer`
    /// (cleared, slots released), if it reaches every thread holding it;
    /// false (nothing done) if not. An object's watchpoint comes and goes
    /// with its object: counted (`ObjectCounts`), never an event.
    fn drop_at_stop(&self, op: &OpGuard<'_>, id: WatchId, armer: &mut dyn StopArmer) -> bool {
        let Some(w) = self.watches.get(&id).map(|w| w.clone()) else {
            return true; // gone already
        };
        let Ok(backend) = self.backends.get(Some(w.backend)) else {
            return false;
        };
        let slots = self.ledger.slots_on(&self.watch_tids(&w), id);
        if !slots.iter().all(|&(t, _)| armer.reaches(t)) {
            return false;
        }
        self.watches.remove(&id);
        let proc = op.process();
        proc.watches.lock().unwrap().remove(&id);
        armer.clear(&slots);
        self.release_slots(&w, backend.retained());
        true
    }

    fn start_objects_thread(self: &Arc<Self>) {
        let mut tx = self.objects.tx.lock().unwrap();
        if tx.is_some() {
            return;
        }
        let (t, rx) = mpsc::channel();
        *tx = Some(t);
        let core = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("wpd-objects".into())
            .spawn(move || {
                use std::time::Instant;
                let mut swept = Instant::now();
                loop {
                    // Never holds the core across a wait: the core's end
                    // (its sender dropped) ends this thread.
                    let sweep = match core.upgrade() {
                        Some(c) => c.has_disarming(),
                        None => break,
                    };
                    let sweep_at = sweep.then(|| swept + crate::backend::FREED_SWEEP);
                    let m = match sweep_at {
                        None => match rx.recv() {
                            Ok(m) => Some(m),
                            Err(_) => break,
                        },
                        Some(at) => {
                            match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                                Ok(m) => Some(m),
                                Err(mpsc::RecvTimeoutError::Timeout) => None,
                                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                            }
                        }
                    };
                    let Some(c) = core.upgrade() else { break };
                    let now = Instant::now();
                    if sweep && now >= swept + crate::backend::FREED_SWEEP {
                        swept = now;
                        c.sweep_freed();
                    }
                    if let Some(m) = m {
                        c.object_work(m);
                    }
                }
            })
            .expect("spawn objects thread");
    }

    fn object_work(self: &Arc<Self>, m: Msg) {
        match m {
            Msg::Wake => {}
            Msg::Loaded(pid, tid) => {
                self.resolve_pending(pid);
                let _ = self.resume(pid, &[tid]);
            }
            Msg::Disarm(id, pid, tid, base) => {
                let child = self
                    .objects
                    .watches
                    .get(&id)
                    .and_then(|w| w.live.lock().unwrap().remove(&base));
                if let Some(child) = child {
                    self.disarm_filter(pid, id, base, None);
                    let _ = self.remove_watchpoint(child);
                    if let Some(w) = self.objects.watches.get(&id) {
                        bump(&w, &self.objects.totals, |c| &c.disarmed);
                    }
                }
                let _ = self.resume(pid, &[tid]);
            }
            Msg::Freed(id, base, child) => {
                let w = self.objects.watches.get(&id).map(|w| w.clone());
                if let Some(w) = w
                    && live_remove_if(&w, base, child)
                {
                    let cw = self.watches.get(&child).map(|c| c.clone());
                    let _ = self.remove_watchpoint(child);
                    if let Some(cw) = cw {
                        self.unmute(&cw);
                    }
                    bump(&w, &self.objects.totals, |c| &c.disarmed);
                }
            }
            Msg::Arm(id, r, at) => {
                if let Some(w) = self.objects.watches.get(&id).map(|w| w.clone()) {
                    self.arm_object(&w, &r);
                    let ns = at.elapsed().as_nanos() as u64;
                    w.counts.held_ns.fetch_add(ns, Ordering::Relaxed);
                    self.objects.totals.held_ns.fetch_add(ns, Ordering::Relaxed);
                }
                let _ = self.resume(r.pid, &[r.tid]);
            }
        }
    }

    fn arm_object(self: &Arc<Self>, w: &ObjectWatch, r: &CodeRecord) {
        let totals = &self.objects.totals;
        let pid = w.spec.pid;
        let base = match w.root {
            crate::symbols::code::Root::Ret => r.ret,
            crate::symbols::code::Root::Arg(i) => r.args[i],
        };
        let (address, size) = match w.linear {
            _ if base == 0 => {
                bump(w, totals, |c| &c.failed);
                tracing::warn!(
                    id = w.id.0,
                    pid,
                    tid = r.tid,
                    "object not armed: {} is a null pointer",
                    w.code.expr
                );
                return;
            }
            Some((offset, size)) => (base.wrapping_add(offset), size),
            None => match self.symbols.code_object(
                pid,
                &w.site,
                &w.code.expr,
                w.code.at_return,
                &crate::symbols::code::CodeRegs {
                    ret: r.ret,
                    args: r.args,
                },
                w.code.len,
            ) {
                Ok((resolved, _)) => (resolved.address, resolved.size),
                Err(e) => {
                    bump(w, totals, |c| &c.failed);
                    tracing::warn!(id = w.id.0, pid, tid = r.tid, "object not armed: {e}");
                    return;
                }
            },
        };
        let len = u32::try_from(size).unwrap_or(u32::MAX);
        let range = match crate::arch::validate(address, len, w.spec.access) {
            Ok(r) => r,
            Err(e) => {
                bump(w, totals, |c| &c.failed);
                tracing::warn!(id = w.id.0, pid, tid = r.tid, "object not armed: {e}");
                return;
            }
        };
        let mut spec = w.spec.clone();
        spec.range = range;
        spec.symbol = None;
        spec.policy = None;
        spec.scope = if w.code.creator_only {
            Scope::Threads(vec![r.tid])
        } else {
            Scope::Process
        };
        let Some(proc) = self.procs.get(&pid).map(|p| p.clone()) else {
            return;
        };
        // The same base again (freed without the disarming function, and
        // handed out anew): the old object's watchpoint goes first.
        let old = w.live.lock().unwrap().remove(&base);
        if let Some(old) = old {
            self.disarm_filter(pid, w.id, base, None);
            let _ = self.remove_watchpoint(old);
        }
        // Its addresses may still be muted from an object freed there.
        self.unmute_range(pid, proc.backend, &spec.range);
        match self.set_object_child(&proc, spec, w.owner) {
            Ok(view) => {
                bump(w, totals, |c| &c.armed);
                w.live.lock().unwrap().insert(base, view.id);
                if let Some(child) = self.watches.get(&view.id).map(|c| c.clone())
                    && !self.disarm_filter(pid, w.id, base, Some(&child))
                {
                    w.live.lock().unwrap().remove(&base);
                    let _ = self.remove_watchpoint(view.id);
                    bump(w, totals, |c| &c.failed);
                }
            }
            Err(e @ WpdError::OutOfSlots { .. }) => {
                bump(w, totals, |c| &c.no_slot);
                tracing::warn!(id = w.id.0, pid, tid = r.tid, "object not armed: {e}");
            }
            Err(e) => {
                bump(w, totals, |c| &c.failed);
                tracing::warn!(id = w.id.0, pid, tid = r.tid, "object not armed: {e}");
            }
        }
    }
}
