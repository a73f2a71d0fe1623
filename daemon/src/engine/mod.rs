//! The daemon's state and operations, independent of gRPC: which processes
//! are attached and with which backend, the watchpoints, the slot ledger,
//! the event bus, and the operations on them (attach, arm, disarm, list,
//! detach). How registers are programmed is the backends' business: the
//! core calls a process's backend through [`crate::backend::Backend`] and
//! never asks which one it is.
//!
//! Rooms: `views.rs` (what is handed out), `lifecycle.rs` (attach, detach,
//! exit, exec, loss), `watch.rs` (set, remove, resume), `slots.rs` (the
//! ledger's protocol: reserve, arm, settle what the backend reports),
//! `jobs.rs` (the reconcile thread), `listings.rs` (lists and counters).
//!
//! Concurrency: state is in concurrent maps (`DashMap`); a process's `op`
//! lock (`state::OpGuard`) serialises arm/disarm passes of one process and
//! is taken only on blocking threads, never across `.await`. Blocking
//! syscalls run on tokio's blocking pool (see `rpc`) or on threads owned by
//! the core and the backends.

mod crashes;
pub mod feedback;
mod jobs;
mod lifecycle;
mod listings;
mod modules;
pub mod objects;
pub mod policy;
mod policy_hold;
mod slots;
pub mod step;
mod views;
mod watch;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak, mpsc};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use crate::backend::fake::FakeKernel;
use crate::backend::probe::SlotProbe;
use crate::backend::{Availability, BackendTable, Host};
use crate::events::{EventBus, EventKind};
use crate::ledger::Ledger;
use crate::model::{Pid, WatchId};
use crate::state::{Job, Process, Watch};
pub use views::{
    Limits, ProcessView, SUBSCRIBER_RESERVE, SlotView, Stats, ThreadView, WatchView,
    process_reserve,
};
pub use watch::ThreadStack;

/// Which backends the core runs.
#[derive(Debug, Clone)]
pub enum Backends {
    /// The kernel's: perf (the default) and ptrace, each where it can run.
    System(crate::backend::SystemOptions),
    /// Only the in-memory fake (tests without a kernel), over `kernel`.
    Fake(Arc<FakeKernel>),
}

/// How to start the core.
#[derive(Debug)]
pub struct Config {
    /// Limits.
    pub limits: Limits,
    /// Backends.
    pub backends: Backends,
    /// Directories of separate debug files (`--debug-dir`; empty: the
    /// defaults).
    pub debug_dirs: Vec<std::path::PathBuf>,
    /// The event bus (made first: the journal reads it from its first
    /// event on).
    pub bus: EventBus,
    /// The durable journal of every event, when the daemon keeps one.
    pub journal: Option<Arc<crate::journal::Journal>>,
    /// The exporter's counters, when events are exported.
    pub export: Option<Arc<crate::export::Stats>>,
    /// Where a policy by command name looks for the programs of that name
    /// to hold at their exec (the daemon's `PATH`).
    pub exec_search_path: Vec<std::path::PathBuf>,
}

impl Config {
    /// A core with these limits and backends and nothing else: a bus of
    /// its own, no journal, no export, the default debug directories.
    pub fn new(limits: Limits, backends: Backends) -> Config {
        Config {
            limits,
            backends,
            debug_dirs: Vec::new(),
            exec_search_path: Vec::new(),
            bus: EventBus::default(),
            journal: None,
            export: None,
        }
    }
}

/// The daemon core.
pub struct Core {
    /// Limits.
    pub limits: Limits,
    /// Slot accounting.
    pub ledger: Ledger,
    /// Event fan-out.
    pub bus: EventBus,
    /// The backends, by kind.
    backends: BackendTable,
    /// The free-slot probe (`ListThreads{probe}`), where the kernel allows.
    probe: Option<Arc<SlotProbe>>,
    /// Attached processes.
    procs: DashMap<Pid, Arc<Process>>,
    /// Watchpoints.
    watches: DashMap<WatchId, Arc<Watch>>,
    /// Next watchpoint id.
    next_id: AtomicU64,
    /// Hits delivered since start.
    hits: AtomicU64,
    started: Instant,
    /// Set at shutdown.
    stop: AtomicBool,
    /// Work for the reconcile thread.
    reconcile_tx: Mutex<Option<mpsc::Sender<Job>>>,
    /// Serialises the limit check and registration of new subscribers.
    subscribing: Mutex<()>,
    /// Names and addresses of the processes' modules.
    pub symbols: Arc<crate::symbols::Symbols>,
    /// Watchpoints set by name waiting to be armed again after an exec (a
    /// library's name resolves once the dynamic linker loaded it), with
    /// their deadlines.
    pending_resolve: DashMap<Pid, Vec<(Arc<Watch>, Instant)>>,
    /// Object watches (`objects/`), by id (ids shared with watchpoints).
    pub objects: objects::Objects,
    /// Policies (`policy.rs`), by id (ids shared with watchpoints).
    policies: DashMap<WatchId, Arc<policy::Policy>>,
    /// Forked children's identities, read for their hits
    /// ([`Core::child_owner`]).
    child_owners: DashMap<Pid, (Arc<crate::events::Owner>, Instant)>,
    /// Work for the policy thread, once a policy was set.
    policy_tx: Mutex<Option<mpsc::Sender<policy::PolicyMsg>>>,
    /// Programs whose execs are held for policies (`policy_hold.rs`).
    exec_hold: Mutex<policy_hold::PolicyHold>,
    /// Thread names (`comm`) by tid, for hits: read once per thread, kept
    /// while it lives, replaced when the backend reports a rename or exec.
    names: DashMap<crate::model::Tid, (Pid, Arc<str>)>,
    /// Names of threads that exited lately, newest last: a hit read after
    /// its thread's exit record (perf rings are per CPU) still gets it.
    exited_names: Mutex<std::collections::VecDeque<(crate::model::Tid, Pid, Arc<str>)>>,
    /// The durable journal of every event, when the daemon keeps one
    /// (`--state-dir`).
    pub journal: Option<Arc<crate::journal::Journal>>,
    /// The exporter's counters, when events are exported.
    pub export: Option<Arc<crate::export::Stats>>,
    /// SIGTRAPs the kernel delivered to watched processes (wpd sends none).
    pub sigtraps: AtomicU64,
    /// Why signal deliveries are not seen here, if they are not.
    pub signals_unseen: Mutex<Option<String>>,
    /// Signal deliveries to watched processes (`core/crashes.rs`).
    signal_watch: Mutex<Option<crate::signals::SignalWatch>>,
    /// Forked children covered by the watchpoints they inherited
    /// (`follow_forks`), until they exit or call exec: policies skip them
    /// (`policy.rs`), and their events are judged on the watched process.
    covered: DashMap<Pid, Vec<WatchId>>,
    /// The async runtime the core was started in (exit watches of
    /// processes attached from the core's own threads run there).
    runtime: Option<tokio::runtime::Handle>,
}

/// Names of exited threads kept for their late hits.
const EXITED_NAMES: usize = 4096;

/// How long after an exec a watchpoint set by name may wait for its name to
/// resolve in the new program (its library to be loaded).
const RESOLVE_AFTER_EXEC: Duration = Duration::from_secs(2);

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("procs", &self.procs.len())
            .field("backends", &self.backends)
            .finish()
    }
}

impl Core {
    /// Builds the core, its backends and its reconcile thread.
    pub fn start_config(config: Config) -> Arc<Core> {
        let limits = config.limits;
        let probe = match &config.backends {
            Backends::System(_) => match SlotProbe::new() {
                Ok(p) => Some(Arc::new(p)),
                Err(e) => {
                    tracing::warn!("no free-slot probe: {e}");
                    None
                }
            },
            Backends::Fake(_) => None,
        };
        let core = Arc::new_cyclic(|weak: &Weak<Core>| {
            let host: Weak<dyn Host> = weak.clone();
            let backends = match &config.backends {
                Backends::System(opts) => {
                    BackendTable::system(host, probe.clone(), limits.fd_headroom, opts)
                }
                Backends::Fake(kernel) => BackendTable::fake(host, kernel.clone()),
            };
            Core {
                limits,
                ledger: Ledger::new(),
                bus: config.bus,
                backends,
                probe,
                procs: DashMap::new(),
                watches: DashMap::new(),
                next_id: AtomicU64::new(1),
                hits: AtomicU64::new(0),
                started: Instant::now(),
                stop: AtomicBool::new(false),
                reconcile_tx: Mutex::new(None),
                subscribing: Mutex::new(()),
                symbols: Arc::new(crate::symbols::Symbols::with_debug_dirs(config.debug_dirs)),
                pending_resolve: DashMap::new(),
                policies: DashMap::new(),
                child_owners: DashMap::new(),
                objects: objects::Objects::default(),
                policy_tx: Mutex::new(None),
                exec_hold: Mutex::new(policy_hold::PolicyHold::searching(config.exec_search_path)),
                names: DashMap::new(),
                exited_names: Mutex::new(std::collections::VecDeque::new()),
                journal: config.journal,
                export: config.export,
                sigtraps: AtomicU64::new(0),
                signals_unseen: Mutex::new(None),
                signal_watch: Mutex::new(None),
                covered: DashMap::new(),
                runtime: tokio::runtime::Handle::try_current().ok(),
            }
        });
        for b in core.backends.usable() {
            b.clone().start();
        }
        let (tx, rx) = mpsc::channel::<Job>();
        *core.reconcile_tx.lock().unwrap() = Some(tx);
        let c = core.clone();
        std::thread::Builder::new()
            .name("wpd-reconcile".into())
            .spawn(move || c.reconcile_loop(rx))
            .expect("spawn reconcile");
        core.start_module_watch();
        if matches!(config.backends, Backends::System(_)) {
            core.start_signal_watch();
        }
        core
    }

    /// Which backends work here.
    pub fn backends(&self) -> Vec<Availability> {
        self.backends.availability()
    }

    /// Online CPUs.
    pub fn cpus(&self) -> usize {
        crate::cpus::online().len()
    }
}

impl Core {
    /// Watchpoint `id`'s aggregates (aggregate mode), its process, its
    /// image (for symbolizing) and the thread names now.
    #[allow(clippy::type_complexity)]
    pub fn hit_aggregates(
        &self,
        id: WatchId,
        limit: usize,
    ) -> Result<
        (
            Pid,
            (u64, u64, u64),
            Vec<((u64, crate::model::Tid), crate::aggregate::Agg)>,
            Option<Arc<crate::symbols::Image>>,
        ),
        crate::error::WpdError,
    > {
        let w = self
            .watches
            .get(&id)
            .map(|w| w.clone())
            .ok_or(crate::error::WpdError::NoSuchWatchpoint(id))?;
        let Some(a) = &w.aggregates else {
            return Err(crate::error::WpdError::InvalidArgument(format!(
                "watchpoint {} is not in aggregate mode (set it with aggregate; its hits are \
                 streamed, see GetRecentHits)",
                id.0
            )));
        };
        let pid = w.spec.pid;
        let top = a.top(limit);
        let image = self.procs.get(&pid).map(|p| p.image());
        Ok((pid, a.totals(), top, image))
    }

    /// The name of thread `tid` of `pid` as far as it is known (the cache,
    /// else `/proc`), without caching it: for events exported later.
    pub fn known_name(&self, pid: Pid, tid: crate::model::Tid) -> Option<String> {
        if let Some(n) = self.names.get(&tid)
            && n.0 == pid
            && !n.1.is_empty()
        {
            return Some(n.1.to_string());
        }
        if let Some(n) = self.exited_name(pid, tid) {
            return Some(n.to_string());
        }
        crate::procfs::comm(pid, tid).filter(|s| !s.is_empty())
    }

    /// The name of `tid` of `pid` if it exited lately.
    fn exited_name(&self, pid: Pid, tid: crate::model::Tid) -> Option<Arc<str>> {
        self.exited_names
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(t, p, _)| *t == tid && *p == pid)
            .map(|(_, _, n)| n.clone())
    }

    /// The name of thread `tid` of `pid` (the process's own name for its
    /// leader), from the cache or `/proc`.
    fn name_of(&self, pid: Pid, tid: crate::model::Tid) -> Arc<str> {
        if let Some(n) = self.names.get(&tid)
            && n.0 == pid
        {
            return n.1.clone();
        }
        let Some(name) = crate::procfs::comm(pid, tid).filter(|n| !n.is_empty()) else {
            // Gone already: its name if it exited lately, else unknown (and
            // not cached: a thread id is reused).
            return self.exited_name(pid, tid).unwrap_or_else(|| Arc::from(""));
        };
        let name: Arc<str> = Arc::from(name);
        // Threads of processes that are not attached (forked children)
        // leave no exit event: the cache is bounded instead.
        if self.names.len() >= 1 << 16 {
            self.names.clear();
        }
        self.names.insert(tid, (pid, name.clone()));
        name
    }
}

/// How long a forked child's identity read for its hits is used before it
/// is read again (a child may make itself undumpable at any time; one that
/// is undumpable stays so until it execs, and then it has no watchpoints).
const CHILD_OWNER_FRESH: std::time::Duration = std::time::Duration::from_millis(10);

/// Forked children's identities kept at most (then all are read again).
const CHILD_OWNERS: usize = 4096;

impl Core {
    /// The identity of forked child `pid` for its hits: read from `/proc`,
    /// again after [`CHILD_OWNER_FRESH`] unless it was undumpable already;
    /// once it is gone, the last one read. `None`: gone unread (its hits
    /// are then privileged callers' only).
    pub(super) fn child_owner(&self, pid: Pid) -> Option<Arc<crate::events::Owner>> {
        if let Some(e) = self.child_owners.get(&pid)
            && (!e.0.dumpable || e.1.elapsed() < CHILD_OWNER_FRESH)
        {
            return Some(e.0.clone());
        }
        let o = crate::state::owner_of(pid);
        if o.start_time == 0 {
            // Gone: who it was when last read (its hits still being
            // reported were made before).
            return self.child_owners.get(&pid).map(|e| e.0.clone());
        }
        let o = Arc::new(o);
        if self.child_owners.len() >= CHILD_OWNERS {
            self.child_owners.clear();
        }
        self.child_owners.insert(pid, (o.clone(), Instant::now()));
        Some(o)
    }
}

impl Host for Core {
    fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    fn reserve_thread(
        &self,
        tid: crate::model::Tid,
        w: &Watch,
        inheritable: bool,
        retained: crate::ledger::Retained,
        out: &mut Vec<crate::ledger::Reservation>,
    ) -> Result<(), crate::error::SlotConflict> {
        self.reserve_thread_slots(tid, w, inheritable, retained, out)
    }

    fn settle(&self, report: &[(crate::ledger::Reservation, crate::ledger::Outcome)]) {
        self.settle_thread(report);
    }

    fn publish(&self, mut ev: EventKind) {
        let pid = ev.pid();
        let mut owner = (pid != 0)
            .then(|| self.procs.get(&pid).map(|p| p.owner.clone()))
            .flatten();
        // A forked child's hit (`follow_forks`; it is not attached): judged
        // on the child itself, which may have made itself undumpable.
        if owner.is_none()
            && let EventKind::Hit(h) = &ev
        {
            owner = self.child_owner(h.pid);
        }
        match &mut ev {
            EventKind::Hit(h) => {
                let w = self.watches.get(&h.id).map(|w| w.clone());
                // Aggregate mode: counted, and streamed only as a sample.
                if let Some(a) = w.as_ref().and_then(|w| w.aggregates.as_ref()) {
                    let now = crate::clock::realtime_ns();
                    let value = h.value.as_ref().ok().map(|v| &v[..]);
                    let (pid, tid) = (h.pid, h.tid);
                    let name = || self.name_of(pid, tid);
                    if !a.record(
                        h.ip,
                        (pid, tid),
                        owner.as_ref(),
                        value,
                        h.time_ns,
                        now,
                        name,
                    ) {
                        return;
                    }
                }
                h.names = Some((self.name_of(h.pid, h.pid), self.name_of(h.pid, h.tid)));
                h.value_type = w.as_ref().and_then(|w| w.spec.reading().cloned());
                // A hit is kept by its watchpoint too (GetRecentHits),
                // subscribers or not.
                if let Some(w) = w {
                    w.remember(self.bus.publish_kept(ev, owner));
                    return;
                }
            }
            EventKind::ThreadExited { tid, .. } => {
                if let Some((tid, (pid, name))) = self.names.remove(tid) {
                    let mut exited = self.exited_names.lock().unwrap();
                    if exited.len() >= EXITED_NAMES {
                        exited.pop_front();
                    }
                    exited.push_back((tid, pid, name));
                }
            }
            _ => {}
        }
        self.bus.publish_as(ev, owner);
    }

    fn burst(&self, f: &mut dyn FnMut()) {
        self.bus.burst(f)
    }

    fn renamed(&self, pid: Pid, tid: crate::model::Tid, name: &str) {
        if self.names.contains_key(&tid) {
            self.names.insert(tid, (pid, Arc::from(name)));
        }
        if Core::has_named(self, pid) {
            self.schedule(Job::Named(pid, tid));
        }
    }

    fn has_named(&self, pid: Pid) -> bool {
        Core::has_named(self, pid)
    }

    fn watch(&self, id: WatchId) -> Option<Arc<Watch>> {
        self.watches.get(&id).map(|w| w.clone())
    }

    fn process(&self, pid: Pid) -> Option<Arc<Process>> {
        self.procs.get(&pid).map(|p| p.clone())
    }

    fn schedule(&self, job: Job) {
        if let Some(tx) = self.reconcile_tx.lock().unwrap().as_ref() {
            let _ = tx.send(job);
        }
    }

    fn count_hit(&self, w: &Watch) {
        w.hits.fetch_add(1, Ordering::Relaxed);
        self.hits.fetch_add(1, Ordering::Relaxed);
    }

    fn process_started(&self, pid: Pid, at: u64) {
        Core::process_started(self, pid, at);
    }

    fn process_forked(&self, pid: Pid, _ppid: Pid, carried: &[WatchId], at: u64) {
        Core::process_forked(self, pid, carried, at);
    }

    fn unwind(
        &self,
        pid: Pid,
        regs: (u64, u64, u64),
        depth: usize,
        read: &mut dyn FnMut(u64) -> Option<u64>,
    ) -> Option<(Vec<u64>, Option<&'static str>)> {
        Some(self.symbols.unwind(pid, regs, depth, read))
    }

    fn function_start(&self, pid: Pid, pc: u64, wait: std::time::Duration) -> Option<u64> {
        let image = self.procs.get(&pid).map(|p| p.image());
        self.symbols.function_start(pid, image.as_deref(), pc, wait)
    }

    fn code_event(
        &self,
        pid: Pid,
        tid: crate::model::Tid,
        records: &[crate::backend::CodeRecord],
        armer: &mut dyn crate::backend::StopArmer,
    ) -> crate::backend::CodeHold {
        self.code_event_seen(pid, tid, records, armer)
    }

    fn objects_freed(
        &self,
        records: &[crate::backend::CodeRecord],
        armer: Option<&mut dyn crate::backend::StopArmer>,
    ) {
        self.objects_freed_seen(records, armer)
    }

    fn forked_child_gone(&self, pid: Pid) {
        // The signal that ended it, if one did, is reported first (while it
        // is still known as covered).
        self.drain_signals();
        self.covered.remove(&pid);
    }

    fn wants_processes(&self) -> bool {
        Core::wants_processes(self)
    }
}
