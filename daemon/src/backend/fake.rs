//! An in-memory backend, for tests of the core and the RPC layer that need
//! no root and no kernel support: it tracks the threads `/proc` lists (of
//! processes the test itself starts), and arms by recording, in a
//! [`FakeKernel`] the test controls (slots taken by others, the next
//! failure), while the test makes hits and thread births happen.
//!
//! A kernel made with [`FakeKernel::holding_threads`] also takes code
//! events, as the ptrace backend with signal stops does: it records the
//! probes opened and closed, each filtered probe's set of live bases, the
//! muted addresses, the freeing calls' records not read yet and the
//! threads resumed. The test plays the tracer: it makes the records
//! ([`FakeKernel::free_call`] does what a disarming probe's program does)
//! and hands them to the core through `Host::code_event` and
//! `Host::objects_freed`, with a `StopArmer` of its own.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use super::{ArmReport, Backend, CodeProbe, CodeRecord, Features, Host};
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
    /// Threads are held at code events (and resumed): see
    /// [`FakeKernel::holding_threads`].
    holds: bool,
    /// Code events.
    code: CodeState,
}

/// What the fake kernel holds of code events.
#[derive(Debug, Default)]
struct CodeState {
    /// Probes open, by process, in the order opened.
    open: Vec<(Pid, CodeProbe)>,
    /// Probes closed (process, key), in the order closed.
    closed: Vec<(Pid, u64)>,
    /// Each filtered probe's set (by key): base → its value (the object's
    /// watchpoint id, then its breakpoints' addresses).
    sets: HashMap<u64, HashMap<u64, Vec<u64>>>,
    /// The sets take no member (as when the kernel is out of memory).
    refuse_members: bool,
    /// A probe is refused once this many more are opened.
    fail_probe_in: Option<usize>,
    /// Breakpoint addresses muted by freeing calls, by process.
    muted: HashMap<Pid, HashSet<u64>>,
    /// Freeing calls' records not read yet, oldest first, each with
    /// whether a `take_freed` saw it already.
    freed: VecDeque<(CodeRecord, bool)>,
    /// Threads resumed (process, the tids asked), in order.
    resumed: Vec<(Pid, Vec<Tid>)>,
}

impl FakeKernel {
    /// An empty kernel.
    pub fn new() -> Arc<FakeKernel> {
        Arc::new(FakeKernel::default())
    }

    /// An empty kernel whose backend holds threads: at code events (it
    /// takes probes) and until they are resumed ([`Features::stops`] and
    /// [`Features::code_events`]).
    pub fn holding_threads() -> Arc<FakeKernel> {
        let k = FakeKernel::default();
        k.state.lock().unwrap().holds = true;
        Arc::new(k)
    }

    /// What the backend over this kernel can do.
    pub fn features(&self) -> Features {
        let holds = self.state.lock().unwrap().holds;
        Features {
            stops: holds,
            code_events: holds,
            ..FakeBackend::FEATURES
        }
    }

    /// The code-event probes open on `pid`, in the order opened.
    pub fn probes(&self, pid: Pid) -> Vec<CodeProbe> {
        let k = self.state.lock().unwrap();
        k.code
            .open
            .iter()
            .filter(|(p, _)| *p == pid)
            .map(|(_, probe)| probe.clone())
            .collect()
    }

    /// The keys of the probes closed on `pid`, in the order closed.
    pub fn closed_probes(&self, pid: Pid) -> Vec<u64> {
        let k = self.state.lock().unwrap();
        k.code
            .closed
            .iter()
            .filter(|(p, _)| *p == pid)
            .map(|(_, key)| *key)
            .collect()
    }

    /// The set of the filtered probe of key `key`: each base with its
    /// value, by base.
    pub fn members(&self, key: u64) -> Vec<(u64, Vec<u64>)> {
        let k = self.state.lock().unwrap();
        let mut v: Vec<(u64, Vec<u64>)> = k
            .code
            .sets
            .get(&key)
            .map(|s| s.iter().map(|(b, v)| (*b, v.clone())).collect())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// From now on the probes' sets take no member (`refuse`), or do.
    pub fn refuse_members(&self, refuse: bool) {
        self.state.lock().unwrap().code.refuse_members = refuse;
    }

    /// The probe opened after `n` more is refused (0: the next one).
    pub fn fail_probe_after(&self, n: usize) {
        self.state.lock().unwrap().code.fail_probe_in = Some(n);
    }

    /// What a disarming probe's program does at a call of its function by
    /// `tid` with first argument `base`: a base in the set of probe `key`
    /// is taken out of it, its object's breakpoint addresses are muted,
    /// and the call's `FREED` record is returned (not queued: see
    /// [`FakeKernel::queue_freed`]); any other call does nothing.
    pub fn free_call(&self, pid: Pid, tid: Tid, key: u64, base: u64) -> Option<CodeRecord> {
        let mut k = self.state.lock().unwrap();
        let value = k.code.sets.get_mut(&key)?.remove(&base)?;
        let (child, addrs) = value.split_first()?;
        k.code
            .muted
            .entry(pid)
            .or_default()
            .extend(addrs.iter().copied());
        let mut args = [0; 6];
        args[0] = base;
        Some(CodeRecord {
            key,
            pid,
            tid,
            ret: *child,
            args,
            sp: 0,
            ip: 0,
            freed: true,
        })
    }

    /// Leaves record `r` in the ring for a `take_freed` (the objects
    /// thread's sweep).
    pub fn queue_freed(&self, r: CodeRecord) {
        self.state.lock().unwrap().code.freed.push_back((r, false));
    }

    /// The freeing calls' records not read yet.
    pub fn freed_waiting(&self) -> usize {
        self.state.lock().unwrap().code.freed.len()
    }

    /// `pid`'s muted addresses, in order.
    pub fn muted(&self, pid: Pid) -> Vec<u64> {
        let k = self.state.lock().unwrap();
        let mut v: Vec<u64> = k
            .code
            .muted
            .get(&pid)
            .map(|m| m.iter().copied().collect())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// The threads resumed: process and the tids asked, in order.
    pub fn resumed(&self) -> Vec<(Pid, Vec<Tid>)> {
        self.state.lock().unwrap().code.resumed.clone()
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
    /// What it can do over a [`FakeKernel::new`]: what perf does (see
    /// [`FakeKernel::features`]).
    pub const FEATURES: Features = Features {
        stops: false,
        only_on_change: false,
        exact_values: false,
        follow_forks: false,
        thread_names: false,
        signal_at_hit: false,
        code_events: false,
        arms_while_traced: false,
        feedback: false,
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
        self.kernel.features()
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
        let mut k = self.kernel.state.lock().unwrap();
        k.attached.remove(&proc.pid);
        k.code.open.retain(|(p, _)| *p != proc.pid);
    }

    fn open_code_probe(&self, pid: Pid, probe: &CodeProbe) -> Result<(), WpdError> {
        let mut k = self.kernel.state.lock().unwrap();
        if !k.holds {
            return Err(WpdError::NeedsBackend {
                feature: "code events",
                needs: None,
                hint: ": this process's backend cannot hold a thread at a probe",
            });
        }
        match k.code.fail_probe_in {
            Some(0) => {
                k.code.fail_probe_in = None;
                return Err(WpdError::kernel(
                    "perf_event_open(uprobe)",
                    nix::errno::Errno::EMFILE,
                ));
            }
            Some(n) => k.code.fail_probe_in = Some(n - 1),
            None => {}
        }
        k.code.open.push((pid, probe.clone()));
        if probe.first_arg_filter {
            k.code.sets.entry(probe.key).or_default();
        }
        Ok(())
    }

    fn close_code_probes(&self, pid: Pid, keys: Option<&[u64]>) {
        let mut k = self.kernel.state.lock().unwrap();
        let code = &mut k.code;
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut code.open)
            .into_iter()
            .partition(|(p, probe)| *p == pid && keys.is_none_or(|ks| ks.contains(&probe.key)));
        code.open = kept;
        for (p, probe) in gone {
            code.sets.remove(&probe.key);
            code.closed.push((p, probe.key));
        }
    }

    fn code_probe_member(&self, key: u64, base: u64, value: &[u64], member: bool) -> bool {
        let mut k = self.kernel.state.lock().unwrap();
        let code = &mut k.code;
        let Some(max) = code
            .open
            .iter()
            .find(|(_, p)| p.key == key && p.first_arg_filter)
            .map(|(_, p)| p.set_max as usize)
        else {
            return true;
        };
        let refuse = code.refuse_members;
        let set = code.sets.entry(key).or_default();
        if !member {
            set.remove(&base);
            return true;
        }
        if refuse || (!set.contains_key(&base) && set.len() >= max) {
            return false;
        }
        set.insert(base, value.to_vec());
        true
    }

    fn unmute(&self, pid: Pid, addrs: &[u64]) {
        let mut k = self.kernel.state.lock().unwrap();
        if let Some(m) = k.code.muted.get_mut(&pid) {
            for a in addrs {
                m.remove(a);
            }
        }
    }

    fn take_freed(&self, aged_only: bool) -> Vec<CodeRecord> {
        let mut k = self.kernel.state.lock().unwrap();
        let (taken, left): (Vec<_>, Vec<_>) = std::mem::take(&mut k.code.freed)
            .into_iter()
            .partition(|(_, seen)| !aged_only || *seen);
        k.code.freed = left.into_iter().map(|(r, _)| (r, true)).collect();
        taken.into_iter().map(|(r, _)| r).collect()
    }

    fn resume(&self, pid: Pid, tids: &[Tid]) -> Result<Vec<Tid>, WpdError> {
        let mut k = self.kernel.state.lock().unwrap();
        if !k.holds {
            return Err(WpdError::NeedsBackend {
                feature: "resuming threads",
                needs: None,
                hint: ": this process's backend never stops threads (nothing to resume)",
            });
        }
        k.code.resumed.push((pid, tids.to_vec()));
        Ok(tids.to_vec())
    }

    fn code_events(&self) -> String {
        if self.kernel.state.lock().unwrap().holds {
            "held at probes the fake kernel records".into()
        } else {
            String::new()
        }
    }
}
