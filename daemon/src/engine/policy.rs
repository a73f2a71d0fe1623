//! Policies: one watchpoint for every process a selector matches, now and
//! later. Each matching process gets an *instance*, an ordinary watchpoint
//! of its own (its name resolved in that process: addresses differ under
//! ASLR), whose spec names the policy.
//!
//! How new processes are found (the `wpd-policy` thread):
//! - from the kernel, where the perf backend's collectors see every task
//!   (its per-thread path): a FORK record of a new process or an exec's
//!   COMM record is handed over by the drain thread at once
//!   ([`Core::process_started`]), stamped with the kernel's time of the
//!   fork or exec;
//! - by a scan of `/proc` every [`SCAN`] for processes not seen before, and
//!   of every process every [`FULL_SCAN_EVERY`] scans (an exec in a
//!   process seen before, where no record says so).
//!
//! What may be missed: the accesses a process makes between its fork or
//! exec and the instance's arming (`PolicyInstance.latency_ns` says how
//! long that was, per process, and `found_by` which of the two found it).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Core;
use super::objects::CodeSpec;
use crate::authz::Caller;
use crate::error::WpdError;
use crate::model::{Pid, WatchId, WatchSpec};
use crate::procfs;

/// Interval of the scan for new processes.
pub const SCAN: Duration = Duration::from_millis(200);
/// Every this many scans, every process is checked again (not only new
/// pids): an exec is seen within `SCAN × FULL_SCAN_EVERY` without records.
pub const FULL_SCAN_EVERY: u32 = 5;
/// How long a matching process whose name does not resolve yet (a library
/// the dynamic linker has not loaded) is tried again, and how often.
const RETRY_FOR: Duration = Duration::from_secs(2);
const RETRY_EVERY: Duration = Duration::from_millis(10);
/// Refusals kept per policy.
const KEEP_REFUSALS: usize = 32;

/// Which processes a policy covers: those matching every field given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    /// Any of these.
    pub pids: Vec<Pid>,
    /// `/proc/PID/comm`, exactly (the first 15 bytes of a longer name).
    pub comm: Option<String>,
    /// `/proc/PID/exe`.
    pub exe: Option<PathBuf>,
    /// A cgroup v2 path relative to its root ("/a/b"): the process's
    /// cgroup is it or below it.
    pub cgroup: Option<String>,
}

/// The kernel's TASK_COMM_LEN less its NUL.
const COMM_MAX: usize = 15;

impl Selector {
    /// Checks and normalises what a client gave.
    pub fn new(pids: Vec<Pid>, comm: &str, exe: &str, cgroup: &str) -> Result<Selector, WpdError> {
        let bad = |m: String| Err(WpdError::InvalidArgument(m));
        for &p in &pids {
            procfs::check_process(p)?;
        }
        let comm = match comm {
            "" => None,
            c if c.contains('/') || c.contains('\n') => {
                return bad(format!(
                    "selector comm {c:?} is not a command name (no '/' or newline)"
                ));
            }
            // The kernel keeps 15 bytes: a longer name matches on those.
            c => Some(truncate_utf8(c, COMM_MAX).to_string()),
        };
        let exe = match exe {
            "" => None,
            e if !e.starts_with('/') => {
                return bad(format!("selector exe {e:?} must be an absolute path"));
            }
            e => Some(PathBuf::from(e)),
        };
        let cgroup = match cgroup {
            "" => None,
            c => Some(cgroup_path(c)?),
        };
        let s = Selector {
            pids,
            comm,
            exe,
            cgroup,
        };
        if s == Selector::default() {
            return bad(
                "a policy needs a selector: pids, a command name, an executable or a cgroup".into(),
            );
        }
        Ok(s)
    }

    /// Whether `pid` matches now (reads only what the fields need).
    pub fn matches(&self, pid: Pid) -> bool {
        if !self.pids.is_empty() && !self.pids.contains(&pid) {
            return false;
        }
        if let Some(c) = &self.comm
            && procfs::comm(pid, pid).as_deref() != Some(c.as_str())
        {
            return false;
        }
        if let Some(e) = &self.exe
            && std::fs::read_link(format!("/proc/{pid}/exe"))
                .ok()
                .as_deref()
                != Some(e.as_path())
        {
            return false;
        }
        if let Some(root) = &self.cgroup {
            let Some(cg) = cgroup_of(pid) else {
                return false;
            };
            if !under(&cg, root) {
                return false;
            }
        }
        true
    }
}

/// A cheap first look for an unprivileged caller's policy: whether `pid`
/// could be the caller's at all. Without CAP_SYS_PTRACE the kernel's rule
/// needs the caller's real uid to be the process's three uids; with it (over
/// some namespace), anything may be, and the full check decides.
fn may_be_callers(caller: &crate::authz::Caller, pid: Pid) -> bool {
    if caller.cap_eff & (1 << crate::authz::CAP_SYS_PTRACE) != 0 {
        return true;
    }
    procfs::creds(pid).is_some_and(|(uids, _, _)| uids.iter().all(|&u| u == caller.uid))
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Whether cgroup path `cg` is `root` or below it ("/a/b" is below "/a",
/// "/ab" is not).
fn under(cg: &str, root: &str) -> bool {
    root == "/"
        || cg == root
        || (cg.starts_with(root) && cg.as_bytes().get(root.len()) == Some(&b'/'))
}

/// A process's cgroup v2 path (`0::/path` in `/proc/PID/cgroup`).
fn cgroup_of(pid: Pid) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end().to_string())
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on hybrid hosts).
pub fn cgroup2_mount() -> Option<PathBuf> {
    let s = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    s.lines().find_map(|l| {
        // ... mount-point ... - fstype source options
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next() == Some("cgroup2"))
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })
}

/// A selector's cgroup as a path relative to the v2 root: an absolute path
/// under the mount point is made relative; anything else is taken as
/// relative already. It must exist.
fn cgroup_path(c: &str) -> Result<String, WpdError> {
    let mount = cgroup2_mount().ok_or_else(|| {
        WpdError::InvalidArgument(format!(
            "selector cgroup {c:?}: no cgroup v2 hierarchy is mounted on this host"
        ))
    })?;
    let p = Path::new(c);
    let rel = match p.strip_prefix(&mount) {
        Ok(r) => format!("/{}", r.display()),
        Err(_) => format!("/{}", c.trim_start_matches('/')),
    };
    let rel = if rel.len() > 1 {
        rel.trim_end_matches('/').to_string()
    } else {
        rel
    };
    let dir = mount.join(rel.trim_start_matches('/'));
    if !dir.join("cgroup.procs").exists() {
        return Err(WpdError::InvalidArgument(format!(
            "selector cgroup {c:?}: {} is not a cgroup v2 directory",
            dir.display()
        )));
    }
    Ok(rel)
}

/// How a policy found a process (`PolicyInstance.found_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoundBy {
    /// Running when the policy was set.
    SetPolicy,
    /// The kernel's FORK or exec record, handed over by the drain thread
    /// ([`Core::process_started`]).
    KernelRecord,
    /// The `/proc` scan.
    Scan,
    /// Held at its exec, before its first instruction (a policy on its
    /// program: `policy_hold.rs`).
    ExecHold,
}

/// A policy's watchpoint in one process.
#[derive(Debug, Clone)]
pub struct Instance {
    pub pid: Pid,
    pub comm: String,
    pub watch: WatchId,
    pub armed_at_ns: u64,
    pub latency_ns: u64,
    /// How the process was found.
    pub found_by: FoundBy,
    /// The process's start time (a later process with the same pid is
    /// another one).
    start_time: u64,
}

/// A matching process that got no instance.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub pid: Pid,
    pub comm: String,
    pub reason: String,
    /// The error itself (`reason` is its text), for those who word it
    /// otherwise (a caller of another pid namespace, with its numbers).
    pub error: Arc<WpdError>,
    pub at_ns: u64,
}

/// A policy.
#[derive(Debug)]
pub struct Policy {
    pub id: WatchId,
    pub selector: Selector,
    /// The instances' spec (pid 0).
    pub spec: WatchSpec,
    /// Each instance is an object watch with this code event.
    pub code: Option<CodeSpec>,
    /// Who set it: each instance is authorised as theirs.
    pub caller: Caller,
    pub created_at_ns: u64,
    state: Mutex<State>,
    /// Held while an instance is being made (by the RPC that set the
    /// policy, or the policy thread), and by its removal: one instance per
    /// process, none made after the removal.
    arming: Mutex<()>,
}

#[derive(Debug, Default)]
struct State {
    instances: BTreeMap<Pid, Instance>,
    refusals: VecDeque<Refusal>,
    made: u64,
    /// Processes refused, by pid: (start time, comm) when refused. Tried
    /// again only as another process (pid reused) or another program
    /// (exec: a new name).
    refused: HashMap<Pid, (u64, String)>,
}

/// A policy as listed.
#[derive(Debug, Clone)]
pub struct PolicyView {
    pub id: WatchId,
    pub selector: Selector,
    pub spec: WatchSpec,
    pub code: Option<CodeSpec>,
    pub created_at_ns: u64,
    pub instances: Vec<Instance>,
    pub refusals: Vec<Refusal>,
    pub made: u64,
}

/// Work for the policy thread.
#[derive(Debug)]
pub enum PolicyMsg {
    /// A process started or called exec (kernel monotonic ns of that).
    Check(Pid, u64),
    /// Try `pid` again for one policy (its name did not resolve yet), as
    /// found first.
    Retry(WatchId, Pid, u64, FoundBy, Instant),
}

impl Core {
    /// Sets a policy and arms its instance in every process that matches
    /// now. Blocking.
    pub fn set_policy(
        self: &Arc<Self>,
        selector: Selector,
        spec: WatchSpec,
        code: Option<CodeSpec>,
        caller: Caller,
    ) -> Result<PolicyView, WpdError> {
        self.set_policy_with_id(selector, spec, code, caller, None)
    }

    /// [`Core::set_policy`] under a given id (a policy of a previous run
    /// set again), or a new one.
    pub fn set_policy_with_id(
        self: &Arc<Self>,
        selector: Selector,
        mut spec: WatchSpec,
        code: Option<CodeSpec>,
        caller: Caller,
        id: Option<WatchId>,
    ) -> Result<PolicyView, WpdError> {
        if let Some(id) = id
            && (self.watches.contains_key(&id) || self.policies.contains_key(&id))
        {
            return Err(WpdError::InvalidArgument(format!("id {id} is in use")));
        }
        self.check_held(caller.uid)?;
        if spec.pid != 0 {
            return Err(WpdError::InvalidArgument(format!(
                "a policy's spec must have pid 0 (its selector picks the processes), got {}",
                spec.pid
            )));
        }
        if spec.lease != 0 {
            return Err(WpdError::InvalidArgument(
                "a policy cannot be leased to an event stream".into(),
            ));
        }
        if spec.symbol.is_none() {
            // Checked once here; a name is resolved per process.
            crate::arch::validate(spec.range.addr, spec.range.len, spec.access)?;
        }
        if spec.feedback.is_some()
            && !self
                .backends
                .features(spec.backend)
                .is_some_and(|f| f.feedback)
        {
            return Err(self.lacks(
                "state feedback",
                |f| f.feedback,
                ", whose breakpoint signals the storing thread at the trap (perf's sigtrap) for \
                 the library that counts the value in the fuzzer's map",
            ));
        }
        spec.policy = None;
        let id = id.unwrap_or_else(|| {
            WatchId(
                self.next_id
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            )
        });
        let policy = Arc::new(Policy {
            id,
            selector,
            spec,
            code,
            caller,
            created_at_ns: crate::clock::realtime_ns(),
            state: Mutex::new(State::default()),
            arming: Mutex::new(()),
        });
        self.policies.insert(id, policy.clone());
        self.ensure_policy_thread();
        self.hold_execs_of(&policy);
        let now = crate::clock::monotonic_ns();
        for pid in procfs::pids() {
            self.try_policy(&policy, pid, now, FoundBy::SetPolicy);
        }
        Ok(self.policy_view(&policy))
    }

    /// The policy `id`, if it exists.
    pub fn policy(&self, id: WatchId) -> Option<Arc<Policy>> {
        self.policies.get(&id).map(|p| p.clone())
    }

    /// Removes a policy and every instance. Blocking.
    pub fn remove_policy(&self, id: WatchId) -> Result<PolicyView, WpdError> {
        let (_, policy) = self
            .policies
            .remove(&id)
            .ok_or(WpdError::NoSuchWatchpoint(id))?;
        self.release_execs_of(&policy);
        // An instance being armed now is finished first.
        let _arming = policy.arming.lock().unwrap();
        let view = self.policy_view(&policy);
        for inst in &view.instances {
            // Gone with its process meanwhile: nothing to undo.
            self.remove_instance(inst.watch);
        }
        Ok(view)
    }

    /// Every policy (with `pid`: those with an instance there).
    pub fn list_policies(&self, pid: Option<Pid>) -> Vec<PolicyView> {
        let mut v: Vec<PolicyView> = self
            .policies
            .iter()
            .map(|p| self.policy_view(&p))
            .filter(|p| pid.is_none_or(|pid| p.instances.iter().any(|i| i.pid == pid)))
            .collect();
        v.sort_by_key(|p| p.id);
        v
    }

    fn policy_view(&self, p: &Policy) -> PolicyView {
        let mut st = p.state.lock().unwrap();
        // Instances whose watchpoint went (its process exited, or exec
        // removed it) are forgotten.
        st.instances.retain(|_, i| self.instance_exists(i.watch));
        PolicyView {
            id: p.id,
            selector: p.selector.clone(),
            spec: p.spec.clone(),
            code: p.code.clone(),
            created_at_ns: p.created_at_ns,
            instances: st.instances.values().cloned().collect(),
            refusals: st.refusals.iter().cloned().collect(),
            made: st.made,
        }
    }

    /// A forked child carrying `carried` from birth: covered by those
    /// watchpoints' policies without an instance of its own (no `/proc`
    /// read, no attach: a fork server forks thousands a second). Policies
    /// that do not cover it still look at it.
    pub fn process_forked(&self, pid: Pid, carried: &[WatchId], at: u64) {
        self.covered.insert(pid, carried.to_vec());
        if self.policies.is_empty() {
            return;
        }
        let covering: Vec<WatchId> = carried
            .iter()
            .filter_map(|id| self.watches.get(id).and_then(|w| w.spec.policy))
            .collect();
        if self.policies.iter().all(|p| covering.contains(&p.id)) {
            return;
        }
        self.process_started(pid, at);
    }

    /// Whether `pid` (found by a `/proc` scan before the drain read its
    /// FORK record: a fork server's child lives a few hundred µs) was forked
    /// by a process `policy` covers with `follow_forks`: then it carries
    /// the instance's breakpoints already, and runs the same program (an
    /// exec would have made it new). Not recorded here: the drain records
    /// it from its FORK record and forgets it at its EXIT, in that order
    /// whatever order the rings give them; a record made here could come
    /// after that EXIT and stay forever.
    fn forked_from_instance(&self, policy: &Policy, pid: Pid) -> bool {
        if !policy.spec.follow_forks {
            return false;
        }
        let Some(ppid) = procfs::Status::of(pid).and_then(|s| s.number::<Pid>("PPid")) else {
            return false;
        };
        let watch = {
            let st = policy.state.lock().unwrap();
            st.instances.get(&ppid).map(|i| i.watch)
        };
        watch.is_some() || self.covered_by(ppid, policy.id)
    }

    /// Whether `pid` is a forked child covered by an instance of `policy`
    /// through what it inherited.
    fn covered_by(&self, pid: Pid, policy: WatchId) -> bool {
        self.covered.get(&pid).is_some_and(|ids| {
            ids.iter().any(|id| {
                self.watches
                    .get(id)
                    .is_some_and(|w| w.spec.policy == Some(policy))
            })
        })
    }

    /// The drain thread saw a process start or call exec (`at`: kernel
    /// monotonic ns): the policy thread checks it now rather than at its
    /// next scan.
    pub fn process_started(&self, pid: Pid, at: u64) {
        if self.policies.is_empty() {
            return;
        }
        if let Some(tx) = self.policy_tx.lock().unwrap().as_ref() {
            let _ = tx.send(PolicyMsg::Check(pid, at));
        }
    }

    /// Forked children known as covered now.
    pub fn forked_children(&self) -> usize {
        self.covered.len()
    }

    /// Whether a policy wants to hear of new processes.
    pub fn wants_processes(&self) -> bool {
        !self.policies.is_empty()
    }

    fn ensure_policy_thread(self: &Arc<Self>) {
        let mut tx = self.policy_tx.lock().unwrap();
        if tx.is_some() {
            return;
        }
        let (t, rx) = mpsc::channel();
        *tx = Some(t);
        let weak = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("wpd-policy".into())
            .spawn(move || policy_loop(weak, rx))
            .expect("spawn policy thread");
    }

    /// Makes `pid` an instance of `policy` if it matches and has none.
    fn try_policy(self: &Arc<Self>, policy: &Arc<Policy>, pid: Pid, seen: u64, found: FoundBy) {
        if pid == std::process::id() as Pid
            || self.covered_by(pid, policy.id)
            || self.forked_from_instance(policy, pid)
            || (found != FoundBy::ExecHold && self.exec_held(pid))
        {
            return;
        }
        let Some(start) = procfs::start_time(pid) else {
            return;
        };
        let _arming = policy.arming.lock().unwrap();
        if !self.policies.contains_key(&policy.id) {
            return; // removed meanwhile
        }
        {
            let st = policy.state.lock().unwrap();
            if let Some(i) = st.instances.get(&pid)
                && i.start_time == start
                && self.instance_exists(i.watch)
            {
                return;
            }
            if let Some((s, c)) = st.refused.get(&pid)
                && *s == start
                && procfs::comm(pid, pid).as_deref() == Some(c.as_str())
            {
                return;
            }
        }
        // An unprivileged caller learns nothing about processes it could
        // not read itself: those are never matched against its selector
        // (the daemon reads `/proc` as root: an executable's path would be
        // an oracle through `hidepid`), and never reported as refused.
        let caller = &policy.caller;
        if !caller.privileged {
            if !may_be_callers(caller, pid) {
                return;
            }
            if crate::authz::check(caller, pid).is_err() {
                policy
                    .state
                    .lock()
                    .unwrap()
                    .refused
                    .insert(pid, (start, procfs::comm(pid, pid).unwrap_or_default()));
                return;
            }
        }
        if !policy.selector.matches(pid) {
            return;
        }
        // Its program's later runs are held at their exec.
        self.learn_exec(policy, pid, found);
        let comm = procfs::comm(pid, pid).unwrap_or_default();
        // As it was when checked: a setuid exec between the check and the
        // arming backs the instance out (checked again below; a privileged
        // caller may arm any process, so not read for one).
        let creds = if policy.caller.privileged {
            None
        } else {
            procfs::creds(pid)
        };
        if let Err(e) = crate::authz::check(&policy.caller, pid) {
            self.refuse(policy, pid, start, comm, e);
            return;
        }
        let mut spec = policy.spec.clone();
        spec.pid = pid;
        spec.policy = Some(policy.id);
        let set = match &policy.code {
            Some(code) => self
                .set_object_watch(spec, code.clone(), policy.caller.uid)
                .map(|v| (v.id, 0)),
            None => self
                .set_watchpoint(spec, policy.caller.uid)
                .map(|(v, _)| (v.id, v.armed_threads)),
        };
        match set {
            Ok((watch, _))
                if !policy.caller.privileged
                    && (procfs::creds(pid) != creds || procfs::start_time(pid) != Some(start)) =>
            {
                self.remove_instance(watch);
                self.refuse(
                    policy,
                    pid,
                    start,
                    comm,
                    WpdError::PermissionDenied {
                        pid,
                        detail: "its credentials changed while it was being armed".into(),
                    },
                );
            }
            Ok((watch, armed)) => {
                let now = crate::clock::monotonic_ns();
                let mut st = policy.state.lock().unwrap();
                st.made += 1;
                st.refused.remove(&pid);
                st.instances.insert(
                    pid,
                    Instance {
                        pid,
                        comm,
                        watch,
                        armed_at_ns: crate::clock::realtime_ns(),
                        latency_ns: now.saturating_sub(seen),
                        found_by: found,
                        start_time: start,
                    },
                );
                drop(st);
                tracing::info!(
                    policy = policy.id.0,
                    pid,
                    id = watch.0,
                    armed,
                    latency_us = now.saturating_sub(seen) / 1000,
                    "policy instance armed"
                );
            }
            Err(WpdError::Symbol(e)) if policy.spec.symbol.is_some() && e.may_resolve_later() => {
                // A library not loaded yet, or an image being mapped: try
                // again shortly.
                if let Some(tx) = self.policy_tx.lock().unwrap().as_ref() {
                    let _ = tx.send(PolicyMsg::Retry(
                        policy.id,
                        pid,
                        seen,
                        found,
                        Instant::now() + RETRY_FOR,
                    ));
                }
            }
            Err(e) => self.refuse(policy, pid, start, comm, e),
        }
    }

    /// Whether an instance's watchpoint (or object watch) still exists.
    fn instance_exists(&self, id: WatchId) -> bool {
        self.watches.contains_key(&id) || self.objects.watch_exists(id)
    }

    /// Removes an instance's watchpoint or object watch (gone already:
    /// nothing to do).
    fn remove_instance(&self, id: WatchId) {
        if self.objects.watch_exists(id) {
            let _ = self.remove_object_watch(id);
        } else {
            let _ = self.remove_watchpoint(id);
        }
    }

    fn refuse(&self, policy: &Policy, pid: Pid, start: u64, comm: String, e: WpdError) {
        tracing::info!(policy = policy.id.0, pid, "policy instance refused: {e}");
        let mut st = policy.state.lock().unwrap();
        st.refused.insert(pid, (start, comm.clone()));
        if st.refusals.len() >= KEEP_REFUSALS {
            st.refusals.pop_front();
        }
        st.refusals.push_back(Refusal {
            pid,
            comm,
            reason: e.to_string(),
            error: Arc::new(e),
            at_ns: crate::clock::realtime_ns(),
        });
    }

    pub(super) fn check_all_policies(self: &Arc<Self>, pid: Pid, seen: u64, found: FoundBy) {
        let policies: Vec<Arc<Policy>> = self.policies.iter().map(|p| p.clone()).collect();
        for p in policies {
            self.try_policy(&p, pid, seen, found);
        }
    }
}

fn policy_loop(core: std::sync::Weak<Core>, rx: mpsc::Receiver<PolicyMsg>) {
    let mut known: HashSet<Pid> = HashSet::new();
    let mut scans = 0u32;
    let mut next_scan = Instant::now() + SCAN;
    let mut retries: Vec<(WatchId, Pid, u64, FoundBy, Instant)> = Vec::new();
    loop {
        let wait = retries
            .iter()
            .map(|_| RETRY_EVERY)
            .min()
            .unwrap_or(SCAN)
            .min(next_scan.saturating_duration_since(Instant::now()));
        let msg = rx.recv_timeout(wait);
        let Some(core) = core.upgrade() else {
            return;
        };
        if core.stop.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        match msg {
            Ok(PolicyMsg::Check(pid, at)) => {
                known.insert(pid);
                core.check_all_policies(pid, at, FoundBy::KernelRecord);
            }
            Ok(PolicyMsg::Retry(id, pid, seen, found, until)) => {
                if !retries.iter().any(|r| r.0 == id && r.1 == pid) {
                    retries.push((id, pid, seen, found, until));
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        if !retries.is_empty() {
            let now = Instant::now();
            let due = std::mem::take(&mut retries);
            for (id, pid, seen, found, until) in due {
                let Some(p) = core.policy(id) else { continue };
                if now >= until {
                    // Out of time: say so.
                    let start = procfs::start_time(pid).unwrap_or(0);
                    let comm = procfs::comm(pid, pid).unwrap_or_default();
                    core.refuse(
                        &p,
                        pid,
                        start,
                        comm,
                        WpdError::InvalidArgument(format!(
                            "{:?} did not resolve in the process within {RETRY_FOR:?}",
                            p.spec
                                .symbol
                                .as_ref()
                                .map(|s| s.expr.as_str())
                                .unwrap_or("")
                        )),
                    );
                    continue;
                }
                core.try_policy(&p, pid, seen, found);
            }
        }
        if Instant::now() >= next_scan {
            next_scan = Instant::now() + SCAN;
            if core.policies.is_empty() {
                known.clear();
                continue;
            }
            scans += 1;
            let full = scans.is_multiple_of(FULL_SCAN_EVERY);
            let now = crate::clock::monotonic_ns();
            let pids = procfs::pids();
            let current: HashSet<Pid> = pids.iter().copied().collect();
            for pid in pids {
                if full || !known.contains(&pid) {
                    core.check_all_policies(pid, now, FoundBy::Scan);
                }
            }
            known = current;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_paths_nest_on_components() {
        assert!(under("/a/b", "/a"));
        assert!(under("/a", "/a"));
        assert!(!under("/ab", "/a"));
        assert!(under("/anything", "/"));
    }

    #[test]
    fn selectors_are_checked() {
        assert!(Selector::new(vec![], "", "", "").is_err());
        assert!(Selector::new(vec![], "a/b", "", "").is_err());
        assert!(Selector::new(vec![], "", "relative", "").is_err());
        assert!(Selector::new(vec![0], "", "", "").is_err());
        let s = Selector::new(vec![], "a-very-long-command-name", "", "").unwrap();
        assert_eq!(s.comm.as_deref(), Some("a-very-long-com"));
        let me = std::process::id() as Pid;
        let mine = procfs::comm(me, me).unwrap();
        assert!(Selector::new(vec![me], &mine, "", "").unwrap().matches(me));
        assert!(
            !Selector::new(vec![me], "no-such-comm", "", "")
                .unwrap()
                .matches(me)
        );
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert!(
            Selector::new(vec![], "", exe.to_str().unwrap(), "")
                .unwrap()
                .matches(me)
        );
    }
}
