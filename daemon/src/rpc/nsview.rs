//! The RPC boundary of pid namespaces: a caller in a pid namespace nested in
//! the daemon's names processes and threads by its own numbers, and is
//! answered in them. Requests are translated here before anything else reads
//! them (caller's numbers → the daemon's), and answers, events and errors on
//! their way out (the daemon's → the caller's); inside, the daemon keeps its
//! own numbers everywhere (journal, ledger, metrics). A process outside the
//! caller's namespace has no number there: naming one is refused
//! (`NOT_IN_PID_NAMESPACE`), and it is absent from what the caller is shown.
//! A caller the daemon cannot number at all is refused (`OTHER_PID_NAMESPACE`).
//! The translation itself, and what it remembers, is `pidns::Nested`'s.
//!
//! Every function here leaves the messages of callers of the daemon's own
//! namespace (and token holders) unchanged.

use std::os::unix::fs::MetadataExt;

use wpd_proto::v1 as pb;
use wpd_proto::v1::stream_events_response::Event as E;

use crate::authz::Caller;
use crate::error::WpdError;
use crate::model::{Pid, Tid};
use crate::pidns::{CallerNs, Identity, Nested};

/// The nested namespace of `caller`, if it is in one.
fn nested(caller: &Caller) -> Option<&Nested> {
    caller.pidns.nested().map(|n| &**n)
}

/// Whether `caller`'s numbers are translated.
pub fn translated(caller: &Caller) -> bool {
    nested(caller).is_some()
}

/// The daemon's number of the process the caller numbers `n` (`n > 0`).
pub fn pid_in(caller: &Caller, n: Pid) -> Result<Pid, WpdError> {
    match &caller.pidns {
        CallerNs::Same => Ok(n),
        CallerNs::Untranslatable(why) => Err(WpdError::OtherPidNamespace { pid: n, why }),
        CallerNs::Nested(ns) => ns.pid_in(n).ok_or(WpdError::NotInPidNamespace { pid: n }),
    }
}

/// A nested caller's own pid 1 (its namespace's init, whose death ends
/// every process of the namespace) is attached only when asked for
/// explicitly, as the daemon's pid 1 is.
pub fn init_in(
    caller: &Caller,
    asked: Pid,
    allow_init: bool,
    attached: bool,
) -> Result<(), WpdError> {
    if translated(caller) && asked == 1 && !allow_init && !attached {
        return Err(WpdError::InitProcess);
    }
    Ok(())
}

/// The daemon's numbers of threads `tids` of process `pid` (the caller's
/// number `asked`, the daemon's `pid`). Numbers that are not positive are
/// left for the request's own validation.
pub fn tids_in(caller: &Caller, asked: Pid, pid: Pid, tids: &[Tid]) -> Result<Vec<Tid>, WpdError> {
    let Some(ns) = nested(caller) else {
        return Ok(tids.to_vec());
    };
    tids.iter()
        .map(|&t| {
            if t <= 0 {
                return Ok(t);
            }
            ns.tid_in(pid, t)
                .ok_or(WpdError::NoSuchThread { pid: asked, tid: t })
        })
        .collect()
}

/// A watchpoint spec in the daemon's numbers (pid and tids).
pub fn spec_in(caller: &Caller, spec: &mut pb::WatchpointSpec) -> Result<(), WpdError> {
    if spec.pid <= 0 || matches!(caller.pidns, CallerNs::Same) {
        return Ok(());
    }
    let asked = spec.pid;
    spec.pid = pid_in(caller, asked)?;
    spec.tids = tids_in(caller, asked, spec.pid, &spec.tids)?;
    Ok(())
}

/// A policy's selector in the daemon's terms: its pids, and its cgroup as a
/// path of the daemon's cgroup v2 hierarchy (the caller gives it as its
/// cgroup namespace shows it).
pub fn selector_in(caller: &Caller, sel: &mut pb::ProcessSelector) -> Result<(), WpdError> {
    match &caller.pidns {
        CallerNs::Same => return Ok(()),
        CallerNs::Untranslatable(why) => {
            let pid = sel.pids.first().copied().unwrap_or(0);
            return Err(WpdError::OtherPidNamespace { pid, why });
        }
        CallerNs::Nested(_) => {}
    }
    sel.pids = sel
        .pids
        .iter()
        .map(|&p| if p > 0 { pid_in(caller, p) } else { Ok(p) })
        .collect::<Result<_, _>>()?;
    if !sel.cgroup.is_empty() {
        let pid = caller.pid.unwrap_or(0);
        sel.cgroup = cgroup_in(pid, &sel.cgroup).map_err(|why| {
            WpdError::InvalidArgument(format!("selector cgroup {:?}: {why}", sel.cgroup))
        })?;
    }
    Ok(())
}

/// The number the caller knows process `pid` by, if it is in its namespace
/// (or below it) and is the process `who` says.
fn pid_out(ns: &Nested, pid: Pid, who: Identity) -> Option<Pid> {
    ns.pid_out(pid, who)
}

/// A watchpoint as the caller numbers it; `false` when its process is not
/// the caller's to see.
pub fn watchpoint_out(caller: &Caller, w: &mut pb::Watchpoint) -> bool {
    let Some(ns) = nested(caller) else {
        return true;
    };
    w.forked_children = w
        .forked_children
        .iter()
        .filter_map(|&c| pid_out(ns, c, Identity::Live))
        .collect();
    w.spec.as_mut().is_none_or(|spec| spec_out(ns, spec))
}

/// A spec's pid and tids as the caller numbers them (a policy's spec, pid 0,
/// is left alone); `false` when its process is not live in the caller's
/// namespace (then its number as last read, or 0: never the daemon's).
fn spec_out(ns: &Nested, spec: &mut pb::WatchpointSpec) -> bool {
    if spec.pid == 0 {
        return true;
    }
    let pid = spec.pid;
    let live = pid_out(ns, pid, Identity::Live);
    spec.pid = live.or_else(|| ns.last_known(pid)).unwrap_or(0);
    spec.tids = spec
        .tids
        .iter()
        .map(|&t| ns.tid_out(pid, Identity::Live, t, false).unwrap_or(0))
        .collect();
    live.is_some()
}

/// An attached process as the caller numbers it; `false` when it is not
/// the caller's to see.
pub fn process_out(caller: &Caller, p: &mut pb::ProcessInfo) -> bool {
    let Some(ns) = nested(caller) else {
        return true;
    };
    match pid_out(ns, p.pid, Identity::Live) {
        Some(n) => {
            p.pid = n;
            true
        }
        None => false,
    }
}

/// Threads of the daemon's process `pid` as the caller numbers them (a
/// thread it cannot number, one that is gone, is left out; an unknown
/// creator is 0, as for a thread created before the attach).
pub fn threads_out(caller: &Caller, pid: Pid, threads: &mut Vec<pb::ThreadInfo>) {
    let Some(ns) = nested(caller) else {
        return;
    };
    threads.retain_mut(|t| {
        let Some(n) = ns.tid_out(pid, Identity::Live, t.tid, false) else {
            return false;
        };
        t.tid = n;
        if t.parent_tid > 0 {
            t.parent_tid = ns
                .tid_out(pid, Identity::Live, t.parent_tid, false)
                .unwrap_or(0);
        }
        true
    });
}

/// Thread ids of the daemon's process `pid` (resumed, held) as the caller
/// numbers them.
pub fn tids_out(caller: &Caller, pid: Pid, tids: &mut Vec<Tid>) {
    let Some(ns) = nested(caller) else {
        return;
    };
    *tids = tids
        .iter()
        .filter_map(|&t| ns.tid_out(pid, Identity::Live, t, false))
        .collect();
}

/// A thread id in an answer about process `pid` (0 when the caller's
/// namespace cannot number it now).
pub fn tid_out(caller: &Caller, pid: Pid, tid: Tid) -> Tid {
    match nested(caller) {
        None => tid,
        Some(ns) => ns.tid_out(pid, Identity::Live, tid, false).unwrap_or(0),
    }
}

/// The caller's number of process `pid` in an answer about it (0 when its
/// namespace cannot number it now).
pub fn process_pid_out(caller: &Caller, pid: Pid) -> Pid {
    match nested(caller) {
        None => pid,
        Some(ns) => ns.last_known(pid).unwrap_or(0),
    }
}

/// A policy of the caller's as it numbers processes: selector pids, its
/// cgroup as the caller's cgroup namespace shows it, instances and refusals.
pub fn policy_out(
    caller: &Caller,
    p: &mut pb::Policy,
    refusals: &[crate::engine::policy::Refusal],
) {
    let Some(ns) = nested(caller) else {
        return;
    };
    if let Some(sel) = p.selector.as_mut() {
        sel.pids = sel
            .pids
            .iter()
            .filter_map(|&d| pid_out(ns, d, Identity::Live))
            .collect();
        if !sel.cgroup.is_empty()
            && let Some(root) = caller.pid.and_then(|c| cgroup_root(c).ok())
        {
            sel.cgroup = cgroup_out(&root, &sel.cgroup);
        }
    }
    p.instances
        .retain_mut(|i| match pid_out(ns, i.pid, Identity::Live) {
            Some(n) => {
                i.pid = n;
                true
            }
            None => false,
        });
    let mut out = Vec::with_capacity(p.refusals.len());
    for (r, full) in p.refusals.iter().zip(refusals) {
        let Some(n) = ns.last_known(r.pid) else {
            continue;
        };
        out.push(pb::PolicyRefusal {
            pid: n,
            reason: error_out(caller, clone_error(&full.error)).to_string(),
            ..r.clone()
        });
    }
    p.refusals = out;
}

/// An event as the caller numbers it; `false` when it is not the caller's to
/// see (its process is outside the caller's namespace, or is gone and was
/// never numbered for it).
pub fn event_out(caller: &Caller, item: &mut pb::StreamEventsResponse) -> bool {
    let Some(ns) = nested(caller) else {
        return true;
    };
    // The process the event is about, as it was then.
    let Some(start) = item.owner.as_ref().map(|o| o.start_time).filter(|&s| s > 0) else {
        // Daemon-wide (records lost) or about no process the daemon knew.
        return matches!(item.event, Some(E::RecordsLost(_)));
    };
    let who = Identity::Started(start);
    let by = Identity::StartedBy(ticks_at(item.time_ns));
    let Some(ev) = item.event.as_mut() else {
        return false;
    };
    match ev {
        E::Hit(h) => hit_out(ns, h, who, by),
        E::ThreadStarted(e) => {
            let parent = ns.tid_out(e.pid, who, e.parent_tid, false).unwrap_or(0);
            let seen = set_both(ns, &mut e.pid, &mut e.tid, who, true);
            e.parent_tid = parent;
            seen
        }
        E::ThreadExited(e) => set_both(ns, &mut e.pid, &mut e.tid, who, false),
        E::ProcessCrashed(e) => {
            let pid = e.pid;
            let Some(p) = pid_out(ns, pid, who) else {
                return false;
            };
            e.tid = ns.tid_out(pid, who, e.tid, false).unwrap_or(0);
            e.pid = p;
            e.last_hits.retain_mut(|h| hit_out(ns, h, who, by));
            true
        }
        E::BreakpointHit(e) => set_both(ns, &mut e.pid, &mut e.tid, who, false),
        E::ProcessExited(e) => set(ns, &mut e.pid, who),
        E::WatchpointRemoved(e) => set(ns, &mut e.pid, who),
        E::ProcessLost(e) => set(ns, &mut e.pid, who),
        E::WatchpointResolved(e) => set(ns, &mut e.pid, who),
        E::RecordsLost(_) | E::Dropped(_) | E::Leased(_) => true,
    }
}

/// Puts the caller's numbers of the event's process and thread in their
/// places (`fresh`: the thread has just started); `false`, leaving both,
/// when the caller does not see them.
fn set_both(ns: &Nested, pid: &mut Pid, tid: &mut Tid, who: Identity, fresh: bool) -> bool {
    let (Some(p), Some(t)) = (pid_out(ns, *pid, who), ns.tid_out(*pid, who, *tid, fresh)) else {
        return false;
    };
    (*pid, *tid) = (p, t);
    true
}

/// Puts the caller's number of the event's process `field` in its place.
fn set(ns: &Nested, field: &mut Pid, who: Identity) -> bool {
    match pid_out(ns, *field, who) {
        Some(n) => {
            *field = n;
            true
        }
        None => false,
    }
}

/// A hit as the caller numbers it: of the event's process, or of a child it
/// forked (`follow_forks`), which started before the hit.
fn hit_out(ns: &Nested, h: &mut pb::Hit, who: Identity, by: Identity) -> bool {
    let pid = h.pid;
    let who = if pid_out(ns, pid, who).is_some() {
        who
    } else {
        by
    };
    let (Some(p), Some(t)) = (pid_out(ns, pid, who), ns.tid_out(pid, who, h.tid, false)) else {
        return false;
    };
    (h.pid, h.tid) = (p, t);
    true
}

/// Clock ticks after boot at `realtime_ns` (the unit of a process's start
/// time), rounded up: a process that started later is not one an event of
/// that time was about.
fn ticks_at(realtime_ns: u64) -> u64 {
    let boot = {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    };
    let booted_at = crate::clock::realtime_ns().saturating_sub(boot);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    realtime_ns.saturating_sub(booted_at) / (1_000_000_000 / hz) + 1
}

/// An error about the daemon's processes as the caller numbers them. Errors
/// already in the caller's terms (its namespace refused) are left alone.
pub fn error_out(caller: &Caller, mut e: WpdError) -> WpdError {
    let Some(ns) = nested(caller) else {
        return e;
    };
    let none = std::iter::empty();
    let seen = match &mut e {
        // The daemon itself is a process the caller cannot number.
        WpdError::OwnProcess(_) => false,
        WpdError::NoSuchProcess(pid)
        | WpdError::NotAttached(pid)
        | WpdError::ProcessExited(pid)
        | WpdError::PermissionDenied { pid, .. }
        | WpdError::BackendMismatch { pid, .. }
        | WpdError::ProcessLost { pid, .. }
        | WpdError::NoLoaderHook { pid, .. } => renumber(ns, pid, none),
        WpdError::NoSuchThread { pid, tid }
        | WpdError::NotHeld { pid, tid }
        | WpdError::NotAProcess { pid, tid } => renumber(ns, pid, std::iter::once(tid)),
        WpdError::OutOfSlots { pid, conflicts, .. } => {
            renumber(ns, pid, conflicts.iter_mut().map(|c| &mut c.tid))
        }
        WpdError::AlreadyTraced {
            pid,
            tid,
            tracer,
            tracer_tid,
            ..
        } => {
            // A tracer the caller cannot number is shown as 0, thread too.
            if !renumber(ns, tracer, std::iter::once(&mut *tracer_tid)) {
                (*tracer, *tracer_tid) = (0, 0);
            }
            renumber(ns, pid, std::iter::once(tid))
        }
        WpdError::Symbol(s) => {
            symbol_error_out(ns, s);
            true
        }
        _ => true,
    };
    if seen {
        e
    } else {
        // A process the caller cannot number: for it, there is none.
        WpdError::NotInPidNamespace { pid: 0 }
    }
}

/// Puts the caller's numbers of a process and of its threads in their
/// places (a thread it cannot number as 0); `false`, leaving them, when it
/// cannot number the process.
fn renumber<'a>(ns: &Nested, pid: &mut Pid, tids: impl Iterator<Item = &'a mut Tid>) -> bool {
    let Some(n) = ns.last_known(*pid) else {
        return false;
    };
    for t in tids {
        *t = ns.tid_out(*pid, Identity::Live, *t, false).unwrap_or(0);
    }
    *pid = n;
    true
}

/// A symbol error's process as the caller numbers it (0: one it cannot).
fn symbol_error_out(ns: &Nested, s: &mut crate::symbols::SymbolError) {
    use crate::symbols::SymbolError as S;
    match s {
        S::NoSuchModule { pid, .. }
        | S::ModuleNotLoaded { pid, .. }
        | S::Unknown { pid, .. }
        | S::UnknownFunction { pid, .. }
        | S::Ambiguous { pid, .. }
        | S::NoCodeAtLine { pid, .. }
        | S::SourceNotLoaded { pid, .. } => *pid = ns.last_known(*pid).unwrap_or(0),
        _ => {}
    }
}

/// A copy of a kept error (the variants a policy refusal can hold; others
/// keep their text).
fn clone_error(e: &WpdError) -> WpdError {
    match e {
        WpdError::NoSuchProcess(p) => WpdError::NoSuchProcess(*p),
        WpdError::ProcessExited(p) => WpdError::ProcessExited(*p),
        WpdError::NotAProcess { tid, pid } => WpdError::NotAProcess {
            tid: *tid,
            pid: *pid,
        },
        WpdError::PermissionDenied { pid, detail } => WpdError::PermissionDenied {
            pid: *pid,
            detail: detail.clone(),
        },
        WpdError::OutOfSlots {
            pid,
            needed,
            conflicts,
        } => WpdError::OutOfSlots {
            pid: *pid,
            needed: *needed,
            conflicts: conflicts.clone(),
        },
        WpdError::AlreadyTraced {
            pid,
            tid,
            tracer,
            tracer_tid,
            comm,
        } => WpdError::AlreadyTraced {
            pid: *pid,
            tid: *tid,
            tracer: *tracer,
            tracer_tid: *tracer_tid,
            comm: comm.clone(),
        },
        WpdError::BackendMismatch {
            pid,
            attached,
            asked,
        } => WpdError::BackendMismatch {
            pid: *pid,
            attached: *attached,
            asked: *asked,
        },
        WpdError::ProcessLost { pid, why } => WpdError::ProcessLost {
            pid: *pid,
            why: why.clone(),
        },
        WpdError::Symbol(s) => WpdError::Symbol(s.clone()),
        other => WpdError::Internal(other.to_string()),
    }
}

/// The cgroup namespace of process `pid` (`/proc/PID/ns/cgroup`'s inode),
/// and the daemon's.
fn cgroupns_of(pid: &str) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/cgroup"))
        .ok()
        .map(|m| m.ino())
}

/// The cgroup v2 path in a `/proc/PID/cgroup` text (`0::/path`).
fn cgroup_line(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end().to_string())
}

/// The root of the cgroup namespace of the daemon's process `pid`, as a path
/// of the daemon's cgroup v2 hierarchy ("/" when it is the daemon's cgroup
/// namespace). `/proc/PID/cgroup` shows a path relative to the *reader's*
/// cgroup namespace (kernel-facts §12): read once by the daemon and once
/// from a thread that joined the process's cgroup namespace, the root is
/// what the first has before the second.
pub fn cgroup_root(pid: Pid) -> Result<String, String> {
    let unreadable =
        || format!("the cgroup namespace of the caller (pid {pid} here) cannot be read");
    let theirs = cgroupns_of(&pid.to_string()).ok_or_else(unreadable)?;
    if Some(theirs) == cgroupns_of("self") {
        return Ok("/".into());
    }
    let here = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()
        .and_then(|t| cgroup_line(&t))
        .ok_or_else(unreadable)?;
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/cgroup")).map_err(|_| unreadable())?;
    // setns(CLONE_NEWCGROUP) changes the calling thread only: a thread of its
    // own, which ends right after.
    let seen = std::thread::Builder::new()
        .name("wpd-cgroupns".into())
        .spawn(move || -> Option<String> {
            use std::os::fd::AsRawFd;
            // SAFETY: setns on a namespace fd we hold, for this thread only.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWCGROUP) } != 0 {
                return None;
            }
            cgroup_line(&std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?)
        })
        .map_err(|_| unreadable())?
        .join()
        .ok()
        .flatten()
        .ok_or_else(unreadable)?;
    root_of(&here, &seen).ok_or_else(|| {
        format!(
            "the caller's cgroup ({seen} in its cgroup namespace, {here} in the daemon's) is \
             outside its cgroup namespace"
        )
    })
}

/// The root of a cgroup namespace whose member's cgroup is `here` from the
/// daemon and `seen` from inside it.
fn root_of(here: &str, seen: &str) -> Option<String> {
    if seen.split('/').any(|c| c == "..") {
        return None;
    }
    let root = if seen == "/" {
        here
    } else {
        here.strip_suffix(seen)?
    };
    Some(if root.is_empty() { "/" } else { root }.to_string())
}

/// Where the caller's mount namespace mounts the cgroup v2 hierarchy, as the
/// caller's root shows it (`/proc/PID/mountinfo` is relative to the
/// process's root).
fn caller_cgroup2_mount(pid: Pid) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).ok()?;
    s.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next() == Some("cgroup2"))
            .then(|| left.split_whitespace().nth(4).map(str::to_string))
            .flatten()
    })
}

/// A selector's cgroup as the caller gave it (relative to its cgroup
/// namespace's root, or absolute under its mount of the hierarchy) → a path
/// relative to the daemon's root.
fn cgroup_in(pid: Pid, asked: &str) -> Result<String, String> {
    let rel = match caller_cgroup2_mount(pid) {
        Some(m) if m != "/" && std::path::Path::new(asked).starts_with(&m) => {
            asked[m.len()..].to_string()
        }
        _ => asked.to_string(),
    };
    let rel = format!("/{}", rel.trim_matches('/'));
    if rel.split('/').any(|c| c == ".." || c == ".") {
        return Err("'.' and '..' are not allowed in a cgroup path".into());
    }
    let root = cgroup_root(pid)?;
    Ok(join_cgroup(&root, &rel))
}

fn join_cgroup(root: &str, rel: &str) -> String {
    match (root, rel) {
        ("/", r) => r.to_string(),
        (r, "/") => r.to_string(),
        (r, rel) => format!("{}{rel}", r.trim_end_matches('/')),
    }
}

/// A cgroup path of the daemon's hierarchy as a cgroup namespace rooted at
/// `root` shows it (unchanged when outside it).
fn cgroup_out(root: &str, path: &str) -> String {
    if root == "/" {
        return path.to_string();
    }
    match path.strip_prefix(root) {
        Some("") => "/".into(),
        Some(rest) if rest.starts_with('/') => rest.to_string(),
        _ => path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_namespace_root_is_what_the_daemon_sees_before_what_the_member_sees() {
        assert_eq!(root_of("/a/b/c", "/c").as_deref(), Some("/a/b"));
        assert_eq!(root_of("/a/b", "/").as_deref(), Some("/a/b"));
        assert_eq!(root_of("/c", "/c").as_deref(), Some("/"));
        // A member outside its namespace's root shows `..`.
        assert_eq!(root_of("/x", "/../x"), None);
        // Not a suffix: inconsistent reads.
        assert_eq!(root_of("/a/b", "/c"), None);
    }

    #[test]
    fn cgroup_paths_go_in_under_the_root_and_come_out_relative_to_it() {
        assert_eq!(join_cgroup("/", "/farm"), "/farm");
        assert_eq!(join_cgroup("/ctr", "/"), "/ctr");
        assert_eq!(join_cgroup("/ctr", "/farm/x"), "/ctr/farm/x");
        assert_eq!(cgroup_out("/ctr", "/ctr/farm/x"), "/farm/x");
        assert_eq!(cgroup_out("/ctr", "/ctr"), "/");
        assert_eq!(cgroup_out("/ctr", "/ctrl/x"), "/ctrl/x");
        assert_eq!(cgroup_out("/", "/farm"), "/farm");
    }

    #[test]
    fn a_caller_of_the_daemons_namespace_is_left_alone() {
        let c = Caller::privileged();
        assert_eq!(pid_in(&c, 12345).unwrap(), 12345);
        let mut spec = pb::WatchpointSpec {
            pid: 7,
            tids: vec![8, 9],
            ..Default::default()
        };
        spec_in(&c, &mut spec).unwrap();
        assert_eq!((spec.pid, spec.tids.clone()), (7, vec![8, 9]));
        let mut item = pb::StreamEventsResponse {
            event: Some(E::ThreadExited(pb::ThreadExited { pid: 7, tid: 8 })),
            ..Default::default()
        };
        assert!(event_out(&c, &mut item));
        assert!(matches!(
            error_out(&c, WpdError::NoSuchProcess(7)),
            WpdError::NoSuchProcess(7)
        ));
    }

    #[test]
    fn an_untranslatable_caller_names_nothing() {
        let c = Caller {
            pidns: CallerNs::Untranslatable(crate::pidns::ABOVE),
            ..Caller::unprivileged(0, 0, Some(0))
        };
        assert!(matches!(
            pid_in(&c, 5),
            Err(WpdError::OtherPidNamespace { pid: 5, .. })
        ));
        let mut sel = pb::ProcessSelector {
            comm: "x".into(),
            ..Default::default()
        };
        assert!(matches!(
            selector_in(&c, &mut sel),
            Err(WpdError::OtherPidNamespace { pid: 0, .. })
        ));
    }

    #[test]
    fn a_nested_caller_is_answered_in_its_numbers_and_shown_nothing_else() {
        use crate::pidns::testing::{Chain, nested};
        // A caller in namespace A; its processes 1 (A's first) and 2 (B's
        // first, B nested in A).
        let chain = Chain::start();
        let c = Caller {
            pidns: CallerNs::Nested(nested(chain.a1)),
            ..Caller::unprivileged(0, 0, Some(chain.a1))
        };
        let me = std::process::id() as Pid;
        assert!(translated(&c));
        assert_eq!(pid_in(&c, 2).unwrap(), chain.b1);
        assert!(matches!(
            pid_in(&c, 77),
            Err(WpdError::NotInPidNamespace { pid: 77 })
        ));
        let mut spec = pb::WatchpointSpec {
            pid: 2,
            tids: vec![2],
            ..Default::default()
        };
        spec_in(&c, &mut spec).unwrap();
        assert_eq!((spec.pid, spec.tids.clone()), (chain.b1, vec![chain.b1]));
        let mut w = pb::Watchpoint {
            spec: Some(spec),
            ..Default::default()
        };
        assert!(watchpoint_out(&c, &mut w));
        assert_eq!(
            w.spec.as_ref().map(|s| (s.pid, s.tids.clone())),
            Some((2, vec![2]))
        );

        // Events: of its process as it was (start time), not of another
        // process holding the pid, nor of one outside its namespace.
        let event = |pid: Pid, start: u64| pb::StreamEventsResponse {
            time_ns: crate::clock::realtime_ns(),
            owner: Some(pb::ProcessOwner {
                start_time: start,
                ..Default::default()
            }),
            event: Some(E::ThreadExited(pb::ThreadExited { pid, tid: pid })),
            ..Default::default()
        };
        let start = crate::procfs::start_time(chain.b1).unwrap();
        let mut ev = event(chain.b1, start);
        assert!(event_out(&c, &mut ev));
        assert!(matches!(
            ev.event,
            Some(E::ThreadExited(pb::ThreadExited { pid: 2, tid: 2 }))
        ));
        assert!(!event_out(&c, &mut event(chain.b1, start + 1)));
        let mine = crate::procfs::start_time(me).unwrap();
        assert!(!event_out(&c, &mut event(me, mine)));
        // Daemon-wide losses are everyone's; an event about no known
        // process is nobody's here.
        let mut lost = pb::StreamEventsResponse {
            event: Some(E::RecordsLost(pb::RecordsLost { count: 1 })),
            ..Default::default()
        };
        assert!(event_out(&c, &mut lost));
        assert!(!event_out(&c, &mut event(chain.b1, 0)));

        // Errors: its numbers, and nothing of a process outside.
        assert!(matches!(
            error_out(&c, WpdError::NoSuchProcess(chain.b1)),
            WpdError::NoSuchProcess(2)
        ));
        assert!(matches!(
            error_out(
                &c,
                WpdError::PermissionDenied {
                    pid: me,
                    detail: String::new()
                }
            ),
            WpdError::NotInPidNamespace { pid: 0 }
        ));
        // A process outside is not its to act on.
        assert!(matches!(
            crate::authz::check(&c, me),
            Err(WpdError::NotInPidNamespace { pid: 0 })
        ));
    }

    #[test]
    fn event_ticks_round_up() {
        // Now, in ticks after boot: at least the uptime in ticks.
        let now = ticks_at(crate::clock::realtime_ns());
        let up: f64 = std::fs::read_to_string("/proc/uptime")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        assert!((now as f64) >= up * hz - 2.0, "{now} ticks, uptime {up} s");
        // This process started before now.
        let me = crate::procfs::start_time(std::process::id() as Pid).unwrap();
        assert!(me <= now);
    }
}
