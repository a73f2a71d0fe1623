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

mod at_stop;
mod breakpoints;
mod pending;
mod removal;
mod set;
#[cfg(test)]
mod tests;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use dashmap::DashMap;

use super::Core;
use crate::model::{Pid, WatchId, WatchSpec};
use crate::state::Watch;
use crate::symbols::code::CodeSite;
use pending::{LoaderHook, pending_view};
use worker::Msg;

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

pub use pending::Pending;

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

/// The spec of one object's watchpoint: the object watch's template over
/// `range`, by address, on the whole process or (`creator_only`) on the
/// thread `tid` that made it.
fn object_spec(w: &ObjectWatch, range: crate::model::Range, tid: crate::model::Tid) -> WatchSpec {
    let mut spec = w.spec.clone();
    spec.range = range;
    spec.symbol = None;
    spec.policy = None;
    spec.scope = if w.code.creator_only {
        crate::model::Scope::Threads(vec![tid])
    } else {
        crate::model::Scope::Process
    };
    spec
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
}
