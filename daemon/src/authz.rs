//! Caller authorization: a caller may act on a process only where the
//! kernel would let that caller ptrace it (`ptrace_may_access` in
//! `kernel/ptrace.c`, plus the Yama LSM), so a daemon running as root never
//! becomes a way around the kernel's own rules.
//!
//! The rule, for a caller that is not privileged (uid 0 or CAP_SYS_PTRACE):
//! 1. the caller's uid equals the target's real, effective and saved uids,
//!    and the caller's gid equals the target's real, effective and saved gids;
//! 2. the target is dumpable (the kernel then owns `/proc/PID` by the
//!    process's uid; a non-dumpable process's `/proc/PID` belongs to root);
//! 3. Yama: with `ptrace_scope` 1 the target must be a descendant of the
//!    caller; with 2 only privileged callers may attach; with 3 nobody.
//!
//! The caller's identity comes from the Unix socket (SO_PEERCRED, taken by
//! the kernel at connect time); a caller authenticated by token on TCP is
//! privileged.

use std::os::unix::fs::MetadataExt;

use crate::error::WpdError;
use crate::model::Pid;

/// Who is calling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// Effective uid at connect time.
    pub uid: u32,
    /// Effective gid at connect time.
    pub gid: u32,
    /// Process id at connect time (for Yama's descendant rule), if known.
    pub pid: Option<Pid>,
    /// Root, CAP_SYS_PTRACE, or a token holder.
    pub privileged: bool,
}

impl Caller {
    /// A caller with full rights (token holders, in-process use).
    pub fn privileged() -> Self {
        Caller {
            uid: 0,
            gid: 0,
            pid: None,
            privileged: true,
        }
    }

    /// A caller from SO_PEERCRED: privileged if uid 0 or it holds
    /// CAP_SYS_PTRACE in its effective set.
    pub fn from_peer(uid: u32, gid: u32, pid: Option<Pid>) -> Self {
        let privileged = uid == 0 || pid.is_some_and(has_cap_sys_ptrace);
        Caller {
            uid,
            gid,
            pid,
            privileged,
        }
    }
}

/// `CAP_SYS_PTRACE` bit in `CapEff`.
const CAP_SYS_PTRACE: u32 = 19;

fn has_cap_sys_ptrace(pid: Pid) -> bool {
    status(pid)
        .and_then(|s| field(&s, "CapEff").and_then(|v| u64::from_str_radix(v.trim(), 16).ok()))
        .is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) != 0)
}

fn status(pid: Pid) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status")).ok()
}

fn field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
}

fn ids(status: &str, name: &str) -> Option<[u32; 3]> {
    let mut it = field(status, name)?
        .split_whitespace()
        .filter_map(|v| v.parse().ok());
    Some([it.next()?, it.next()?, it.next()?])
}

/// What the rule needs to know about a target process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetFacts {
    /// Real, effective, saved uid.
    pub uids: [u32; 3],
    /// Real, effective, saved gid.
    pub gids: [u32; 3],
    /// Dumpable (owner of /proc/PID is not forced to root).
    pub dumpable: bool,
    /// Ancestors of the target (parent first), for Yama scope 1.
    pub ancestors: Vec<Pid>,
}

impl TargetFacts {
    /// Reads them from /proc. `None` if the process is gone.
    pub fn read(pid: Pid) -> Option<TargetFacts> {
        let s = status(pid)?;
        let uids = ids(&s, "Uid")?;
        let gids = ids(&s, "Gid")?;
        let owner = std::fs::metadata(format!("/proc/{pid}")).ok()?.uid();
        // A non-dumpable process's /proc/PID is owned by root (or the
        // user namespace's root), whatever its uid.
        let dumpable = owner == uids[1] || uids[1] == 0;
        let mut ancestors = Vec::new();
        let mut cur = pid;
        for _ in 0..64 {
            let Some(pp) = status(cur)
                .and_then(|s| field(&s, "PPid").and_then(|v| v.trim().parse::<Pid>().ok()))
            else {
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
            dumpable,
            ancestors,
        })
    }
}

/// Yama's `kernel.yama.ptrace_scope` (0 when Yama is absent).
pub fn yama_scope() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The rule itself, on facts (pure; unit-tested).
pub fn decide(caller: &Caller, target: &TargetFacts, yama: u32) -> Result<(), String> {
    if yama >= 3 {
        return Err("kernel.yama.ptrace_scope=3: no process may be traced".into());
    }
    if caller.privileged {
        return Ok(());
    }
    if yama >= 2 {
        return Err(
            "kernel.yama.ptrace_scope=2: only callers with CAP_SYS_PTRACE may trace".into(),
        );
    }
    if target.uids.iter().any(|&u| u != caller.uid) {
        return Err(format!(
            "caller uid {} does not own the process (uids {:?})",
            caller.uid, target.uids
        ));
    }
    if target.gids.iter().any(|&g| g != caller.gid) {
        return Err(format!(
            "caller gid {} does not match the process's gids {:?}",
            caller.gid, target.gids
        ));
    }
    if !target.dumpable {
        return Err("the process is not dumpable (setuid, or prctl(PR_SET_DUMPABLE, 0))".into());
    }
    if yama == 1 && !caller.pid.is_some_and(|p| target.ancestors.contains(&p)) {
        return Err(
            "kernel.yama.ptrace_scope=1: a caller without CAP_SYS_PTRACE may only trace its own descendants"
                .into(),
        );
    }
    Ok(())
}

/// Checks that `caller` may act on `pid`. A pid that does not exist is
/// reported as such only to callers that could see it anyway.
pub fn check(caller: &Caller, pid: Pid) -> Result<(), WpdError> {
    if caller.privileged && yama_scope() < 3 {
        return Ok(());
    }
    let Some(facts) = TargetFacts::read(pid) else {
        return Err(WpdError::NoSuchProcess(pid));
    };
    decide(caller, &facts, yama_scope())
        .map_err(|detail| WpdError::PermissionDenied { pid, detail })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(uid: u32) -> Caller {
        Caller {
            uid,
            gid: uid,
            pid: Some(100),
            privileged: false,
        }
    }

    fn target(uid: u32) -> TargetFacts {
        TargetFacts {
            uids: [uid; 3],
            gids: [uid; 3],
            dumpable: true,
            ancestors: vec![100, 1],
        }
    }

    fn check_case(caller: Caller, t: TargetFacts, yama: u32, want: Result<(), &str>) {
        match (decide(&caller, &t, yama), want) {
            (Ok(()), Ok(())) => {}
            (Err(e), Err(w)) => assert!(e.contains(w), "{e:?} lacks {w:?}"),
            (got, want) => panic!("{caller:?} on {t:?} (yama {yama}): got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn the_kernels_rule() {
        check_case(user(1000), target(1000), 0, Ok(()));
        check_case(user(1000), target(1001), 0, Err("does not own"));
        check_case(
            user(1000),
            TargetFacts {
                uids: [1000, 0, 1000],
                ..target(1000)
            },
            0,
            Err("does not own"),
        );
        check_case(
            user(1000),
            TargetFacts {
                gids: [1000, 1000, 5],
                ..target(1000)
            },
            0,
            Err("gid"),
        );
        check_case(
            user(1000),
            TargetFacts {
                dumpable: false,
                ..target(1000)
            },
            0,
            Err("not dumpable"),
        );
        check_case(Caller::privileged(), target(0), 0, Ok(()));
        check_case(
            Caller::privileged(),
            TargetFacts {
                dumpable: false,
                ..target(0)
            },
            2,
            Ok(()),
        );
        check_case(Caller::privileged(), target(0), 3, Err("=3"));
    }

    #[test]
    fn yama_scopes() {
        check_case(user(1000), target(1000), 1, Ok(()));
        check_case(
            user(1000),
            TargetFacts {
                ancestors: vec![1],
                ..target(1000)
            },
            1,
            Err("descendants"),
        );
        check_case(
            Caller {
                pid: None,
                ..user(1000)
            },
            target(1000),
            1,
            Err("descendants"),
        );
        check_case(user(1000), target(1000), 2, Err("=2"));
    }

    #[test]
    fn reads_own_facts() {
        let me = std::process::id() as Pid;
        let f = TargetFacts::read(me).unwrap();
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        assert_eq!(f.uids[0], uid);
        assert!(f.dumpable);
        assert!(!f.ancestors.is_empty());
    }
}
