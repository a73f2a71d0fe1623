//! An in-memory backend, for tests of the core and the RPC layer that need
//! no root and no kernel support: it tracks the threads `/proc` lists (of
//! processes the test itself starts), and arms by recording, in a
//! [`FakeKernel`] the test controls (slots taken by others, the next
//! failure), while the test makes hits and thread births happen.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};

use super::{ArmReport, Backend, Features, Host};
use crate::arch::current::SLOTS;
use crate::error::WpdError;
use crate::events::{EventKind, HitEvent};
use crate::ledger::{Outcome, Reservation, Retained};
use crate::model::{BackendKind, Pid, SlotKey, Tid, WatchId};
use crate::state::{OpGuard, Process, Watch};

/// A failure the next arm meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeFailure {
    /// The kernel says ENOSPC on this thread.
    NoSpace(Tid),
    /// Out of file descriptors.
    Emfile,
    /// Permission denied.
    Eperm,
}

/// What the fake backend's "kernel" holds; the test reads and changes it.
#[derive(Debug, Default)]
pub struct FakeKernel {
    state: Mutex<KernelState>,
}

#[derive(Debug, Default)]
struct KernelState {
    /// Slots other owners hold, by thread.
    foreign: HashMap<Tid, usize>,
    /// Armed (watchpoint, thread) pairs.
    armed: HashSet<(SlotKey, Tid)>,
    /// Attached processes.
    attached: HashSet<Pid>,
    /// The next arm's failure.
    fail_next: Option<FakeFailure>,
}

impl FakeKernel {
    /// An empty kernel.
    pub fn new() -> Arc<FakeKernel> {
        Arc::new(FakeKernel::default())
    }

    /// `n` slots of `tid` are held by someone else.
    pub fn take_foreign_slots(&self, tid: Tid, n: usize) {
        self.state.lock().unwrap().foreign.insert(tid, n);
    }

    /// The next arm fails so.
    pub fn fail_next_arm(&self, f: FakeFailure) {
        self.state.lock().unwrap().fail_next = Some(f);
    }

    /// Threads `id` is armed on (any of its pieces).
    pub fn armed_threads(&self, id: WatchId) -> Vec<Tid> {
        let mut v: Vec<Tid> = self
            .state
            .lock()
            .unwrap()
            .armed
            .iter()
            .filter(|(k, _)| k.id == id)
            .map(|(_, t)| *t)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Slots `tid` holds for us.
    pub fn slots_armed(&self, tid: Tid) -> usize {
        let k = self.state.lock().unwrap();
        k.armed.iter().filter(|(_, t)| *t == tid).count()
    }

    /// Processes attached.
    pub fn attached(&self) -> Vec<Pid> {
        self.state
            .lock()
            .unwrap()
            .attached
            .iter()
            .copied()
            .collect()
    }
}

/// The fake backend.
pub struct FakeBackend {
    host: Weak<dyn Host>,
    kernel: Arc<FakeKernel>,
}

impl std::fmt::Debug for FakeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeBackend").finish()
    }
}

impl FakeBackend {
    /// What it can do: what perf does.
    pub const FEATURES: Features = Features {
        stops: false,
        only_on_change: false,
        exact_values: false,
        follow_forks: false,
        thread_names: false,
        signal_at_hit: false,
        code_events: false,
    };

    /// A fake backend over `kernel`.
    pub fn new(host: Weak<dyn Host>, kernel: Arc<FakeKernel>) -> Self {
        FakeBackend { host, kernel }
    }

    fn host(&self) -> Result<Arc<dyn Host>, WpdError> {
        self.host
            .upgrade()
            .ok_or_else(|| WpdError::kernel("host gone", nix::errno::Errno::ESHUTDOWN))
    }
}

/// Makes a hit of `key` (a watchpoint's piece; a [`WatchId`] means piece 0)
/// happen: as the backend would, counts it and publishes it. False when no
/// such piece is armed on `tid`.
pub fn fake_hit(
    host: &dyn Host,
    kernel: &FakeKernel,
    key: impl Into<SlotKey>,
    tid: Tid,
    ip: u64,
) -> bool {
    let key = key.into();
    if !kernel.state.lock().unwrap().armed.contains(&(key, tid)) {
        return false;
    }
    let Some(w) = host.watch(key.id) else {
        return false;
    };
    // No memory to read: a condition cannot be judged (the hit is
    // reported), the counts and the rate limit apply.
    let rate_limited_before =
        match w
            .filter
            .judge(&w.spec.filter, None, crate::clock::monotonic_ns())
        {
            crate::filter::Verdict::Report { limited_before } => limited_before,
            _ => return true,
        };
    host.count_hit(&w);
    let now = crate::clock::realtime_ns();
    let piece = w.spec.range.piece(key.piece);
    host.publish(EventKind::Hit(HitEvent {
        id: key.id,
        piece: key.piece,
        pid: w.spec.pid,
        tid,
        ip,
        addr: piece.addr,
        len: piece.len.bytes(),
        access: w.spec.access,
        value: Err("the fake backend reads no memory".into()),
        time_ns: now,
        value_read_ns: now,
        cpu: 0,
        stopped: false,
        old_value: None,
        backend: w.backend,
        image: None,
        callchain: Vec::new(),
        callchain_note: None,
        rate_limited_before,
        names: None,
        value_type: None,
    }));
    true
}

impl Backend for FakeBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Perf
    }

    fn features(&self) -> Features {
        Self::FEATURES
    }

    fn retained(&self) -> Retained {
        Retained::Avoid
    }

    fn attach(&self, op: &OpGuard<'_>) -> Result<(), WpdError> {
        let host = self.host()?;
        let pid = op.pid();
        let tids = crate::procfs::tasks(pid).map_err(|_| WpdError::NoSuchProcess(pid))?;
        for tid in tids {
            if !crate::procfs::thread_exited(pid, tid) {
                host.ledger().add_thread(pid, tid);
            }
        }
        self.kernel.state.lock().unwrap().attached.insert(pid);
        Ok(())
    }

    fn arm(&self, op: &OpGuard<'_>, _watch: &Arc<Watch>, res: &[Reservation]) -> ArmReport {
        let mut k = self.kernel.state.lock().unwrap();
        match k.fail_next.take() {
            Some(FakeFailure::Emfile) => {
                return ArmReport::refused(
                    res,
                    WpdError::FdLimit {
                        what: "this watchpoint",
                        detail: format!("{} breakpoints", res.len()),
                        needed: res.len() as u64,
                        open: 0,
                        limit: 0,
                        headroom: 0,
                        by_kernel: true,
                    },
                );
            }
            Some(FakeFailure::Eperm) => {
                return ArmReport::refused(
                    res,
                    WpdError::PermissionDenied {
                        pid: op.pid(),
                        detail: "perf_event_open(breakpoint) refused: Operation not permitted"
                            .into(),
                    },
                );
            }
            Some(FakeFailure::NoSpace(tid)) => {
                k.foreign.insert(tid, SLOTS);
            }
            None => {}
        }
        // As the kernel would: one slot per piece, refused when a thread's
        // slots (ours, this request's, someone else's) run out; then
        // nothing is armed.
        let mut taken: HashMap<Tid, usize> = HashMap::new();
        let mut outcomes: Vec<(Reservation, Outcome)> = res
            .iter()
            .map(|&r| {
                let ours = k.armed.iter().filter(|(_, t)| *t == r.tid).count();
                let foreign = k.foreign.get(&r.tid).copied().unwrap_or(0);
                let now = taken.entry(r.tid).or_default();
                if ours + *now + foreign >= SLOTS {
                    (r, Outcome::NoSpace)
                } else {
                    *now += 1;
                    (r, Outcome::Armed(None))
                }
            })
            .collect();
        if outcomes.iter().any(|(_, o)| *o == Outcome::NoSpace) {
            for (_, o) in &mut outcomes {
                if *o != Outcome::NoSpace {
                    *o = Outcome::NotArmed;
                }
            }
        } else {
            for r in res {
                k.armed.insert((r.key, r.tid));
            }
        }
        ArmReport {
            outcomes,
            refused: None,
        }
    }

    fn disarm(&self, _op: &OpGuard<'_>, watch: &Watch) {
        self.kernel
            .state
            .lock()
            .unwrap()
            .armed
            .retain(|(k, _)| k.id != watch.id);
    }

    fn detach(&self, proc: &Arc<Process>) {
        self.kernel.state.lock().unwrap().attached.remove(&proc.pid);
    }
}
