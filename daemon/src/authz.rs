//! Caller authorization: a caller may act on a process only where the
//! kernel would let that caller ptrace it, so a daemon running as root never
//! becomes a way around the kernel's own rules.
//!
//! The rule is the kernel's `PTRACE_MODE_ATTACH_REALCREDS` check, the one
//! `PTRACE_SEIZE` and `process_vm_readv` make (`__ptrace_may_access` in
//! `kernel/ptrace.c`, `cap_ptrace_access_check` in
//! `security/commoncap.c`, `yama_ptrace_access_check`), in its order:
//! 1. the caller's real uid equals the target's real, effective and saved
//!    uids and its real gid the target's three gids, or the caller has
//!    CAP_SYS_PTRACE over the target's user namespace;
//! 2. the target is dumpable (`prctl(PR_SET_DUMPABLE)`, reset by setuid
//!    execs and credential changes), or the caller has CAP_SYS_PTRACE over
//!    it;
//! 3. the caller is in the target's user namespace and holds every
//!    capability the target has in its permitted set, or has CAP_SYS_PTRACE
//!    over it;
//! 4. Yama: with `ptrace_scope` 1 the target must descend from the caller
//!    (or the caller has CAP_SYS_PTRACE over it); with 2 the caller needs
//!    CAP_SYS_PTRACE in the initial namespace; with 3 nobody may.
//!
//! "CAP_SYS_PTRACE over the target" is `ns_capable`: the capability in the
//! caller's effective set and the caller's user namespace the target's or
//! one of its ancestors, or the caller the owner of a namespace between
//! them. Not modelled, so refused where the kernel might allow: Yama
//! exceptions a target grants with `PR_SET_PTRACER`, and other LSMs'
//! rules (SELinux, AppArmor), which can only refuse more.
//!
//! The caller's identity comes from the Unix socket (`SO_PEERCRED` and
//! `SO_PEERPIDFD`, taken by the kernel at connect time), read once per
//! connection; a caller authenticated by token on TCP is privileged.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use crate::error::WpdError;
use crate::model::Pid;
use crate::pidns::CallerNs;
use crate::procfs::{self, Status};

pub use crate::procfs::yama::CAP_SYS_PTRACE;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Real uid (the kernel compares the caller's real ids).
    pub uid: u32,
    /// Real gid.
    pub gid: u32,
    /// Process id at connect time (for Yama's descendant rule), if known.
    pub pid: Option<Pid>,
    /// Permitted capabilities (compared with the target's).
    pub cap_prm: u64,
    /// Effective capabilities (CAP_SYS_PTRACE is looked for here).
    pub cap_eff: u64,
    /// Inode of the caller's user namespace (`None`: unknown, treated as
    /// a namespace that holds nothing).
    pub userns: Option<u64>,
    /// A token holder, or CAP_SYS_PTRACE in the daemon's own user
    /// namespace: every process the daemon can see is the caller's.
    pub privileged: bool,
    /// The caller's pid namespace: the daemon's, one nested in it (the
    /// caller acts on and sees only the processes of that namespace and
    /// those below it, named by its own numbers), or one the daemon cannot
    /// number (it may neither act on nor see any process: [`check`]).
    pub pidns: CallerNs,
}

impl Caller {
    /// A caller with full rights (token holders, in-process use).
    pub fn privileged() -> Self {
        Caller {
            uid: 0,
            gid: 0,
            pid: None,
            cap_prm: u64::MAX,
            cap_eff: u64::MAX,
            userns: procfs::userns_of(std::process::id() as Pid),
            privileged: true,
            pidns: CallerNs::Same,
        }
    }

    /// A caller with the given ids and no capabilities (tests, and the
    /// fallback when a peer's process cannot be read).
    pub fn unprivileged(uid: u32, gid: u32, pid: Option<Pid>) -> Self {
        Caller {
            uid,
            gid,
            pid,
            cap_prm: 0,
            cap_eff: 0,
            userns: None,
            privileged: false,
            pidns: CallerNs::Same,
        }
    }

    /// The peer of a Unix socket: `euid`/`egid`/`pid` from SO_PEERCRED, and
    /// the real ids and capabilities of that process from `/proc`, read
    /// while `pidfd` (SO_PEERPIDFD) shows the process still alive (so the
    /// pid was not reused). If the process cannot be read, or changed its
    /// effective uid since it connected, the caller gets SO_PEERCRED's ids
    /// and no capabilities.
    pub fn from_peer(euid: u32, egid: u32, pid: Option<Pid>, pidfd: Option<&OwnedFd>) -> Self {
        let mut fallback = Caller::unprivileged(euid, egid, pid);
        // SO_PEERCRED gives 0 for a peer the daemon's pid namespace does
        // not number (one above it, or beside it); a peer in a namespace
        // below it is numbered here, but names processes by its own
        // namespace's numbers.
        let mut pidns = CallerNs::of_peer(pid);
        // Read from the process that connected only if it still lives (its
        // pid was not another's meanwhile: a namespace read from another
        // process proves nothing); without a pidfd (Linux < 6.5), as read.
        if !matches!(pidns, CallerNs::Untranslatable(_)) && pidfd.is_some() && !alive(pidfd) {
            pidns = CallerNs::Untranslatable(crate::pidns::UNREADABLE);
        }
        fallback.pidns = pidns.clone();
        let Some(p) = pid.filter(|&p| p > 0) else {
            return fallback;
        };
        let Some(status) = Status::of(p) else {
            return fallback;
        };
        let (Some(uids), Some(gids), Some(cap_prm), Some(cap_eff)) = (
            status.ids("Uid"),
            status.ids("Gid"),
            status.mask("CapPrm"),
            status.mask("CapEff"),
        ) else {
            return fallback;
        };
        let userns = procfs::userns_of(p);
        if !alive(pidfd) || uids[1] != euid || gids[1] != egid {
            return fallback;
        }
        let ours = procfs::userns_of(std::process::id() as Pid);
        // Every process the daemon sees is not the caller's to name when
        // its numbers are another namespace's: a nested caller is judged
        // process by process, among those of its namespace.
        let privileged = cap_eff & (1 << CAP_SYS_PTRACE) != 0
            && userns.is_some()
            && userns == ours
            && matches!(pidns, CallerNs::Same);
        Caller {
            uid: uids[0],
            gid: gids[0],
            pid: Some(p),
            cap_prm,
            cap_eff,
            userns,
            privileged,
            pidns,
        }
    }

    fn has_cap_sys_ptrace(&self) -> bool {
        self.cap_eff & (1 << CAP_SYS_PTRACE) != 0
    }
}

/// Whether the process of `pidfd` is still the live process that connected:
/// a pidfd names one process for good, and signal 0 fails once it has
/// exited.
fn alive(pidfd: Option<&OwnedFd>) -> bool {
    pidfd.is_some_and(|fd| {
        // SAFETY: pidfd_send_signal with signal 0 only checks the target.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                0,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            ) == 0
        }
    })
}

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the socket's peer.
const SO_PEERPIDFD: libc::c_int = 77;

/// The pidfd of a Unix socket's peer, where the kernel has SO_PEERPIDFD.
pub fn peer_pidfd(socket: &impl AsRawFd) -> Option<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`.
    let r = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    // SAFETY: a fresh fd the kernel gave us.
    (r == 0 && fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether the target is dumpable, as far as `/proc` tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dumpable {
    /// `SUID_DUMP_USER`: per-task files are owned by the process's euid.
    Yes,
    /// Not dumpable: per-task files are owned by root of the mm's namespace.
    No,
    /// The process's euid is that root itself: the owner tells nothing.
    Unknown,
}

/// What the rule needs to know about a target process (one of its live
/// threads: credentials are per thread, and a leader that exited alone has
/// no memory and so no dumpability).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetFacts {
    /// Real, effective, saved uid.
    pub uids: [u32; 3],
    /// Real, effective, saved gid.
    pub gids: [u32; 3],
    /// Permitted capabilities.
    pub cap_prm: u64,
    /// Dumpability.
    pub dumpable: Dumpable,
    /// Ancestors of the target (parent first), for Yama scope 1.
    pub ancestors: Vec<Pid>,
}

/// How the caller's user namespace relates to the target's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NsRelation {
    /// Same user namespace.
    pub same: bool,
    /// The caller has CAP_SYS_PTRACE over the target's namespace
    /// (`ns_capable`).
    pub capable: bool,
    /// The caller has CAP_SYS_PTRACE in the initial namespace
    /// (`capable`, for Yama scope 2).
    pub capable_init: bool,
}

impl TargetFacts {
    /// Reads them from /proc. `None` if the process has no live thread.
    pub fn read(pid: Pid) -> Option<TargetFacts> {
        Self::read_with(pid, true)
    }

    /// [`TargetFacts::read`], its ancestors left out unless `ancestors`
    /// (only Yama's scope 1 asks for them: a `/proc` read per ancestor).
    pub fn read_with(pid: Pid, ancestors: bool) -> Option<TargetFacts> {
        let tid = procfs::live_thread(pid)?;
        let s = Status::of_task(pid, tid)?;
        let uids = s.ids("Uid")?;
        let gids = s.ids("Gid")?;
        let cap_prm = s.mask("CapPrm")?;
        // Per-task files (not the /proc/PID directory, which keeps the
        // euid) are owned by root of the mm's user namespace when the
        // process is not dumpable (`task_dump_owner` in fs/proc/base.c).
        let owner = std::fs::metadata(format!("/proc/{pid}/task/{tid}/stat"))
            .ok()?
            .uid();
        let root = procfs::userns_root_uid(pid).unwrap_or(0);
        let dumpable = if uids[1] == root {
            Dumpable::Unknown
        } else if owner == uids[1] {
            Dumpable::Yes
        } else {
            Dumpable::No
        };
        let walk = ancestors;
        let mut ancestors = Vec::new();
        let mut cur = pid;
        for _ in 0..if walk { 64 } else { 0 } {
            let Some(pp) = Status::of(cur).and_then(|s| s.number::<Pid>("PPid")) else {
                break;
            };
            if pp <= 0 {
                break;
            }
            ancestors.push(pp);
            cur = pp;
        }
        Some(TargetFacts {
            uids,
            gids,
            cap_prm,
            dumpable,
            ancestors,
        })
    }
}

impl NsRelation {
    /// Walks from the target's user namespace up to the initial one
    /// (`NS_GET_PARENT`): the caller is capable over the target if it has
    /// CAP_SYS_PTRACE and its namespace is on that path, or if it owns a
    /// namespace on the path whose parent is the caller's (the owner of a
    /// namespace has every capability in it).
    pub fn read(caller: &Caller, pid: Pid) -> NsRelation {
        let cap = caller.has_cap_sys_ptrace();
        let Some(mine) = caller.userns else {
            return NsRelation {
                same: false,
                capable: false,
                capable_init: false,
            };
        };
        let init = procfs::userns_of(1);
        let capable_init = cap && init == Some(mine);
        let Ok(file) = std::fs::File::open(format!("/proc/{pid}/ns/user")) else {
            return NsRelation {
                same: false,
                capable: false,
                capable_init,
            };
        };
        let mut ns: OwnedFd = file.into();
        let same = ino(&ns) == Some(mine);
        let mut capable = false;
        for _ in 0..33 {
            if ino(&ns) == Some(mine) {
                capable = cap;
                break;
            }
            // SAFETY: NS_GET_PARENT on a namespace fd returns a new fd or -1.
            let parent = unsafe { libc::ioctl(ns.as_raw_fd(), libc::NS_GET_PARENT) };
            if parent < 0 {
                break; // the initial namespace, or one we cannot see above
            }
            // SAFETY: a fresh fd.
            let parent = unsafe { OwnedFd::from_raw_fd(parent) };
            if ino(&parent) == Some(mine) && owner_uid(&ns).is_some_and(|o| o == caller.uid) {
                capable = true;
                break;
            }
            ns = parent;
        }
        NsRelation {
            same,
            capable,
            capable_init,
        }
    }
}

fn ino(fd: &OwnedFd) -> Option<u64> {
    std::fs::File::from(fd.try_clone().ok()?)
        .metadata()
        .ok()
        .map(|m| m.ino())
}

fn owner_uid(ns: &OwnedFd) -> Option<u32> {
    let mut uid: libc::uid_t = 0;
    // SAFETY: NS_GET_OWNER_UID writes one uid_t.
    let r = unsafe { libc::ioctl(ns.as_raw_fd(), libc::NS_GET_OWNER_UID, &mut uid) };
    (r == 0).then_some(uid)
}

/// The Yama scope a caller's request is judged under. Yama restricts
/// attaches only (`PTRACE_MODE_ATTACH`: ptrace, `process_vm_readv`,
/// `/proc/PID/mem`), not the read access a perf event on another task asks
/// (`PTRACE_MODE_READ`, kernel-facts §25.8). A daemon with CAP_SYS_PTRACE
/// could attach where its callers could not, so it applies Yama to each
/// caller as the kernel would to the caller itself. A daemon without it (a
/// user's own daemon) is under Yama itself for every attach it makes, and
/// the kernel refuses those; judging its caller by the attach rule too
/// would refuse the perf watches the kernel allows (the user's processes
/// that are not the daemon's descendants), so its callers are judged by
/// the read rule and the kernel has the last word on each attach.
pub fn yama_for_callers(scope: u32) -> u32 {
    if crate::procfs::yama::daemon_may_trace_any() {
        scope
    } else {
        0
    }
}

/// The rule itself, on facts (pure; unit-tested, and compared with the
/// kernel's own answers in `tests/e2e/security.rs`).
pub fn decide(
    caller: &Caller,
    target: &TargetFacts,
    ns: NsRelation,
    yama: u32,
) -> Result<(), String> {
    if yama >= 3 {
        return Err("kernel.yama.ptrace_scope=3: no process may be traced".into());
    }
    if caller.privileged {
        return Ok(());
    }
    // 1. Credentials.
    let ids_match = target.uids.iter().all(|&u| u == caller.uid)
        && target.gids.iter().all(|&g| g == caller.gid);
    if !ids_match && !ns.capable {
        if target.uids.iter().any(|&u| u != caller.uid) {
            return Err(format!(
                "caller uid {} does not own the process (uids {:?}) and lacks CAP_SYS_PTRACE over it",
                caller.uid, target.uids
            ));
        }
        return Err(format!(
            "caller gid {} does not match the process's gids {:?} and the caller lacks CAP_SYS_PTRACE over it",
            caller.gid, target.gids
        ));
    }
    // 2. Dumpability.
    if target.dumpable != Dumpable::Yes && !ns.capable {
        return Err(match target.dumpable {
            Dumpable::No => "the process is not dumpable (prctl(PR_SET_DUMPABLE, 0), a setuid or \
                             setgid program, or changed credentials)"
                .into(),
            _ => "the process's dumpability cannot be told from /proc (it runs as its \
                  namespace's root), and the caller lacks CAP_SYS_PTRACE over it"
                .into(),
        });
    }
    // 3. Capabilities (commoncap).
    let caps_covered = ns.same && target.cap_prm & !caller.cap_prm == 0;
    if !caps_covered && !ns.capable {
        return Err(if ns.same {
            format!(
                "the process holds capabilities the caller does not (permitted {:#x}, the caller's {:#x})",
                target.cap_prm, caller.cap_prm
            )
        } else {
            "the process is in another user namespace, over which the caller lacks CAP_SYS_PTRACE"
                .into()
        });
    }
    // 4. Yama.
    match yama {
        1 if !ns.capable && !caller.pid.is_some_and(|p| target.ancestors.contains(&p)) => Err(
            "kernel.yama.ptrace_scope=1: a caller without CAP_SYS_PTRACE may only trace its own descendants"
                .into(),
        ),
        2 if !ns.capable_init => Err(
            "kernel.yama.ptrace_scope=2: only callers with CAP_SYS_PTRACE may trace".into(),
        ),
        _ => Ok(()),
    }
}

/// Checks that `caller` may act on `pid`. A pid that does not exist is
/// reported as such only to callers that could see it anyway.
pub fn check(caller: &Caller, pid: Pid) -> Result<(), WpdError> {
    match &caller.pidns {
        CallerNs::Same => {}
        CallerNs::Untranslatable(why) => {
            return Err(WpdError::OtherPidNamespace { pid, why });
        }
        // A process outside the caller's namespace has no number there: it
        // is none of the caller's.
        CallerNs::Nested(ns) if !ns.sees(pid) => {
            return Err(WpdError::NotInPidNamespace { pid: 0 });
        }
        CallerNs::Nested(_) => {}
    }
    let yama = yama_for_callers(crate::procfs::yama::scope());
    if caller.privileged && yama < 3 {
        return Ok(());
    }
    let Some(facts) = TargetFacts::read_with(pid, yama == 1) else {
        return Err(WpdError::NoSuchProcess(pid));
    };
    decide(caller, &facts, NsRelation::read(caller, pid), yama)
        .map_err(|detail| WpdError::PermissionDenied { pid, detail })
}

/// Who may see events about processes, decided on the identity each event
/// records (pid and start time, and the owner's credentials then), never on
/// whichever process holds the pid when the event is read: a replay of a
/// process that has exited, or a live feed when its pid is reused, cannot
/// show one process's events to the owner of another.
///
/// 1. Privileged callers see every event.
/// 2. An event without an owner (one about no process the daemon knew) is
///    shown to privileged callers only.
/// 3. While the process the event names is alive (same pid, same start
///    time), the kernel's rule decides, as for acting on it ([`check`]).
/// 4. Once it is gone, its recorded credentials decide: the caller's real
///    uid equals its three uids, the caller's real gid its three gids, and
///    it was dumpable. (Capabilities over a namespace that may no longer
///    exist are not judged: privileged callers see everything anyway.)
///
/// Decisions are kept per (pid, start time), at most [`Visibility::KEPT`].
#[derive(Debug, Default)]
pub struct Visibility {
    decided: std::collections::HashMap<(Pid, u64), bool>,
}

impl Visibility {
    /// Decisions kept before they are all forgotten.
    pub const KEPT: usize = 4096;

    /// Whether `caller` may see an event about `pid` whose process identity
    /// was `owner`.
    pub fn may_see(
        &mut self,
        caller: &Caller,
        pid: Pid,
        owner: Option<&crate::events::Owner>,
    ) -> bool {
        // Events name processes by the daemon's pids, which such a caller
        // cannot be given in its own.
        if matches!(caller.pidns, CallerNs::Untranslatable(_)) {
            return false;
        }
        if caller.privileged {
            return true;
        }
        let Some(owner) = owner else {
            return false;
        };
        let key = (pid, owner.start_time);
        if let Some(&d) = self.decided.get(&key) {
            return d;
        }
        let alive =
            pid > 0 && owner.start_time != 0 && procfs::start_time(pid) == Some(owner.start_time);
        let d = if alive {
            check(caller, pid).is_ok()
        } else {
            past_owner_allows(caller, owner)
        };
        if self.decided.len() >= Self::KEPT {
            self.decided.clear();
        }
        self.decided.insert(key, d);
        d
    }

    /// Forgets the decisions about `pid` (an exec may change who may see
    /// it; an exit ends it).
    pub fn forget(&mut self, pid: Pid) {
        self.decided.retain(|(p, _), _| *p != pid);
    }

    /// The one rule every read of events goes by (live streams, replays
    /// from the journal, `GetRecentHits`, `GetHitAggregates`): whether
    /// `caller` may see an event about `pid`, whose process was `owner`
    /// when it happened (a forked child's hit: the child's own). A
    /// privileged caller sees every event; another, those of processes the
    /// kernel would let it trace ([`Visibility::may_see`]). `resets`: the
    /// event may change who may see the process (an exec's, an exit's, a
    /// removal's), so the decision is made again.
    pub fn admits(
        &mut self,
        caller: &Caller,
        pid: Pid,
        owner: Option<&crate::events::Owner>,
        resets: bool,
    ) -> bool {
        if caller.privileged {
            return true;
        }
        if resets {
            self.forget(pid);
        }
        self.may_see(caller, pid, owner)
    }
}

/// The ownership part of the kernel's rule on a gone process's recorded
/// credentials.
fn past_owner_allows(caller: &Caller, owner: &crate::events::Owner) -> bool {
    owner.dumpable
        && owner.uids.iter().all(|&u| u == caller.uid)
        && owner.gids.iter().all(|&g| g == caller.gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gone_process_is_seen_by_its_owner_only() {
        let owner = crate::events::Owner {
            start_time: 1,
            uids: [1000; 3],
            gids: [1000; 3],
            dumpable: true,
        };
        // A pid no process has: the recorded owner decides.
        let pid = i32::MAX - 7;
        // One decision cache per subscriber, that is per caller.
        let sees = |c: Caller, pid: Pid, o: Option<&crate::events::Owner>| {
            Visibility::default().may_see(&c, pid, o)
        };
        assert!(sees(
            Caller::unprivileged(1000, 1000, None),
            pid,
            Some(&owner)
        ));
        assert!(!sees(
            Caller::unprivileged(1001, 1000, None),
            pid,
            Some(&owner)
        ));
        assert!(!sees(
            Caller::unprivileged(1000, 1001, None),
            pid,
            Some(&owner)
        ));
        assert!(!sees(Caller::unprivileged(1000, 1000, None), pid, None));
        let setuid = crate::events::Owner {
            uids: [1000, 0, 0],
            ..owner.clone()
        };
        assert!(!sees(
            Caller::unprivileged(1000, 1000, None),
            pid,
            Some(&setuid)
        ));
        let undumpable = crate::events::Owner {
            dumpable: false,
            ..owner.clone()
        };
        assert!(!sees(
            Caller::unprivileged(1000, 1000, None),
            pid,
            Some(&undumpable)
        ));
        assert!(sees(Caller::privileged(), pid, None));
    }

    #[test]
    fn a_reused_pid_is_judged_as_the_process_that_had_it() {
        // This process's pid with another start time: the process the event
        // was about is gone, whoever holds the pid now.
        let me = std::process::id() as Pid;
        let now = procfs::start_time(me).unwrap();
        let other = crate::events::Owner {
            start_time: now + 1,
            uids: [4242; 3],
            gids: [4242; 3],
            dumpable: true,
        };
        let mut v = Visibility::default();
        let stranger = Caller::unprivileged(4242, 4242, None);
        assert!(v.may_see(&stranger, me, Some(&other)));
        let mine = crate::events::Owner {
            start_time: now,
            ..other
        };
        // Alive: the kernel's rule on the live process (ours, not 4242's),
        // whatever was decided for the process that had the pid before.
        assert!(!v.may_see(&stranger, me, Some(&mine)));
    }

    fn user(uid: u32) -> Caller {
        Caller {
            pid: Some(100),
            userns: Some(1),
            ..Caller::unprivileged(uid, uid, Some(100))
        }
    }

    fn target(uid: u32) -> TargetFacts {
        TargetFacts {
            uids: [uid; 3],
            gids: [uid; 3],
            cap_prm: 0,
            dumpable: Dumpable::Yes,
            ancestors: vec![100, 1],
        }
    }

    const SAME: NsRelation = NsRelation {
        same: true,
        capable: false,
        capable_init: false,
    };

    fn check_case(
        caller: Caller,
        t: TargetFacts,
        ns: NsRelation,
        yama: u32,
        want: Result<(), &str>,
    ) {
        match (decide(&caller, &t, ns, yama), want) {
            (Ok(()), Ok(())) => {}
            (Err(e), Err(w)) => assert!(e.contains(w), "{e:?} lacks {w:?}"),
            (got, want) => {
                panic!("{caller:?} on {t:?} ({ns:?}, yama {yama}): got {got:?}, want {want:?}")
            }
        }
    }

    #[test]
    fn credentials() {
        check_case(user(1000), target(1000), SAME, 0, Ok(()));
        check_case(user(1000), target(1001), SAME, 0, Err("does not own"));
        let saved_root = TargetFacts {
            uids: [1000, 1000, 0],
            ..target(1000)
        };
        check_case(user(1000), saved_root, SAME, 0, Err("does not own"));
        let other_gid = TargetFacts {
            gids: [1000, 1000, 5],
            ..target(1000)
        };
        check_case(user(1000), other_gid.clone(), SAME, 0, Err("gid"));
        let capable = NsRelation {
            capable: true,
            ..SAME
        };
        check_case(user(1000), other_gid, capable, 0, Ok(()));
    }

    #[test]
    fn dumpability() {
        for d in [Dumpable::No, Dumpable::Unknown] {
            let t = TargetFacts {
                dumpable: d,
                ..target(1000)
            };
            check_case(user(1000), t.clone(), SAME, 0, Err("dumpab"));
            let capable = NsRelation {
                capable: true,
                ..SAME
            };
            check_case(user(1000), t, capable, 0, Ok(()));
        }
    }

    #[test]
    fn capabilities_and_namespaces() {
        let with_caps = TargetFacts {
            cap_prm: 1 << 12,
            ..target(1000)
        };
        check_case(
            user(1000),
            with_caps.clone(),
            SAME,
            0,
            Err("holds capabilities"),
        );
        let covering = Caller {
            cap_prm: (1 << 12) | 1,
            ..user(1000)
        };
        check_case(covering, with_caps, SAME, 0, Ok(()));
        let elsewhere = NsRelation {
            same: false,
            ..SAME
        };
        check_case(
            user(1000),
            target(1000),
            elsewhere,
            0,
            Err("another user namespace"),
        );
    }

    #[test]
    fn privileged_and_scope_3() {
        check_case(Caller::privileged(), target(0), SAME, 0, Ok(()));
        let undumpable = TargetFacts {
            dumpable: Dumpable::No,
            ..target(0)
        };
        check_case(Caller::privileged(), undumpable, SAME, 2, Ok(()));
        check_case(Caller::privileged(), target(0), SAME, 3, Err("=3"));
    }

    #[test]
    fn yama_scopes() {
        check_case(user(1000), target(1000), SAME, 1, Ok(()));
        let orphan = TargetFacts {
            ancestors: vec![1],
            ..target(1000)
        };
        check_case(user(1000), orphan.clone(), SAME, 1, Err("descendants"));
        let capable = NsRelation {
            capable: true,
            ..SAME
        };
        check_case(user(1000), orphan, capable, 1, Ok(()));
        check_case(
            Caller {
                pid: None,
                ..user(1000)
            },
            target(1000),
            SAME,
            1,
            Err("descendants"),
        );
        check_case(user(1000), target(1000), SAME, 2, Err("=2"));
        let init = NsRelation {
            capable: true,
            capable_init: true,
            ..SAME
        };
        check_case(user(1000), target(1000), init, 2, Ok(()));
    }

    #[test]
    fn a_caller_of_an_untranslatable_pid_namespace_acts_on_and_sees_nothing() {
        use crate::pidns::{ABOVE, UNREADABLE};
        let me = std::process::id() as Pid;
        for why in [ABOVE, UNREADABLE] {
            let c = Caller {
                pidns: CallerNs::Untranslatable(why),
                ..Caller::privileged()
            };
            match check(&c, me) {
                Err(WpdError::OtherPidNamespace { pid, why: w }) => {
                    assert_eq!((pid, w), (me, why));
                }
                r => panic!("{r:?}"),
            }
            let owner = crate::events::Owner {
                start_time: procfs::start_time(me).unwrap(),
                uids: [0; 3],
                gids: [0; 3],
                dumpable: true,
            };
            assert!(!Visibility::default().may_see(&c, me, Some(&owner)));
        }
        // SO_PEERCRED's 0: a peer the daemon's namespace does not number.
        let above = Caller::from_peer(0, 0, Some(0), None);
        assert!(matches!(above.pidns, CallerNs::Untranslatable(ABOVE)));
        // This process: the daemon's own namespace.
        let same = Caller::from_peer(0, 0, Some(me), None);
        assert!(matches!(same.pidns, CallerNs::Same));
    }

    #[test]
    fn reads_own_facts() {
        let me = std::process::id() as Pid;
        let f = TargetFacts::read(me).unwrap();
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        assert_eq!(f.uids[0], uid);
        if uid != 0 {
            assert_eq!(f.dumpable, Dumpable::Yes);
        }
        assert!(!f.ancestors.is_empty());
        let me_caller = Caller {
            userns: procfs::userns_of(me),
            cap_eff: 1 << CAP_SYS_PTRACE,
            ..Caller::unprivileged(uid, 0, Some(me))
        };
        let rel = NsRelation::read(&me_caller, me);
        assert!(rel.same && rel.capable);
    }
}
