//! What the daemon reads from `/proc` and a few process syscalls
//! (pidfd_open, process_vm_readv).

use std::os::fd::{FromRawFd, OwnedFd};

use nix::errno::Errno;

use crate::model::{Pid, Tid};

/// A `/proc/PID/status` (or `/proc/PID/task/TID/status`) file, read once:
/// the one parser of that format in the daemon.
#[derive(Debug, Clone)]
pub struct Status(String);

impl Status {
    /// `/proc/PID/status`; `None` once the process is gone.
    pub fn of(pid: Pid) -> Option<Status> {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .map(Status)
    }

    /// `/proc/PID/task/TID/status`: one thread's own (credentials and
    /// pending signals are per thread).
    pub fn of_task(pid: Pid, tid: Tid) -> Option<Status> {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
            .ok()
            .map(Status)
    }

    /// Parses a status text (tests).
    pub fn parse(text: &str) -> Status {
        Status(text.to_string())
    }

    /// The value of field `name` (`Name:\tvalue`), trimmed.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.0.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|v| v.strip_prefix(':'))
                .map(str::trim)
        })
    }

    /// A decimal field (`Tgid`, `PPid`, `TracerPid`).
    pub fn number<T: std::str::FromStr>(&self, name: &str) -> Option<T> {
        self.field(name)?.parse().ok()
    }

    /// A hexadecimal mask (`CapPrm`, `CapEff`, `SigPnd`, `SigBlk`...).
    pub fn mask(&self, name: &str) -> Option<u64> {
        u64::from_str_radix(self.field(name)?, 16).ok()
    }

    /// Real, effective and saved ids of `Uid` or `Gid`.
    pub fn ids(&self, name: &str) -> Option<[u32; 3]> {
        let mut it = self
            .field(name)?
            .split_whitespace()
            .filter_map(|v| v.parse().ok());
        Some([it.next()?, it.next()?, it.next()?])
    }
}

/// Why `pid` is not a live process ([`check_process`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotAProcess {
    /// Not a pid at all.
    #[error("pid must be positive, got {0}")]
    BadPid(Pid),
    /// No such process (or no live thread of it).
    #[error("no such process: {0}")]
    Gone(Pid),
    /// A thread of another process.
    #[error("{tid} is a thread of process {pid}, not a process")]
    Thread {
        /// The thread asked for as a process.
        tid: Tid,
        /// Its process.
        pid: Pid,
    },
}

/// Checks that `pid` is a live process: a thread-group leader with at least
/// one live thread. The leader itself may have exited (`pthread_exit` in
/// `main`): the kernel keeps it as a zombie while other threads run, and the
/// process is as alive as before.
pub fn check_process(pid: Pid) -> Result<(), NotAProcess> {
    if pid <= 0 {
        return Err(NotAProcess::BadPid(pid));
    }
    let tgid: Pid = Status::of(pid)
        .and_then(|s| s.number("Tgid"))
        .ok_or(NotAProcess::Gone(pid))?;
    if tgid != pid {
        return Err(NotAProcess::Thread {
            tid: pid,
            pid: tgid,
        });
    }
    if live_thread(pid).is_none() {
        return Err(NotAProcess::Gone(pid));
    }
    Ok(())
}

/// The scheduler state letter of thread `tid` of `pid` (field 3 of
/// `/proc/PID/task/TID/stat`: `R`, `S`, `t`, `Z`...), `None` once it is gone.
pub fn thread_state(pid: Pid, tid: Tid) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    s.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// True if thread `tid` of `pid` has exited: gone, or a zombie (a leader
/// that exited before the other threads stays one until the last exits).
pub fn thread_exited(pid: Pid, tid: Tid) -> bool {
    matches!(thread_state(pid, tid), None | Some('Z') | Some('X'))
}

/// The kernel's flag on a task that has begun to exit (`PF_EXITING`, set
/// first thing in `do_exit`): it never runs user code again.
const PF_EXITING: u64 = 0x4;

/// True if thread `tid` of `pid` has begun to exit or is gone: a thread
/// killed with its process leaves `/proc` only once the kernel has taken
/// it down (closing its perf events, whose EXIT records the daemon may
/// read first), and meanwhile shows a running state; field 9 of its
/// `stat`, the task's flags, has `PF_EXITING` from the start.
pub fn thread_exiting(pid: Pid, tid: Tid) -> bool {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) else {
        return true;
    };
    let Some((_, rest)) = s.rsplit_once(')') else {
        return true;
    };
    let mut fields = rest.split_whitespace();
    if matches!(fields.next(), None | Some("Z") | Some("X")) {
        return true;
    }
    // state, ppid, pgrp, session, tty_nr, tpgid, flags.
    fields
        .nth(5)
        .and_then(|f| f.parse::<u64>().ok())
        .is_none_or(|flags| flags & PF_EXITING != 0)
}

/// A thread of `pid` that has not begun to exit ([`thread_exiting`]).
pub fn running_thread(pid: Pid) -> Option<Tid> {
    if !thread_exiting(pid, pid) {
        return Some(pid);
    }
    tasks(pid)
        .ok()?
        .into_iter()
        .find(|&t| t != pid && !thread_exiting(pid, t))
}

/// A live thread of `pid`: the leader if it still runs, else another one.
pub fn live_thread(pid: Pid) -> Option<Tid> {
    if !thread_exited(pid, pid) {
        return Some(pid);
    }
    tasks(pid)
        .ok()?
        .into_iter()
        .find(|&t| t != pid && !thread_exited(pid, t))
}

/// `/proc/PID/task/TID/FILE` of a live thread other than the leader: where
/// a process's `maps`, `exe`, `root` or `auxv` are read once its leader has
/// exited alone (the leader's own, which `/proc/PID/FILE` shows, went with
/// its memory; kernel-facts §3b). `None` while the leader lives or when no
/// thread does.
pub fn live_task_file(pid: Pid, file: &str) -> Option<String> {
    let tid = live_thread(pid).filter(|&t| t != pid)?;
    Some(format!("/proc/{pid}/task/{tid}/{file}"))
}

/// Credentials of a live thread of `pid`: (uids, gids, permitted
/// capabilities).
pub fn creds(pid: Pid) -> Option<([u32; 3], [u32; 3], u64)> {
    let s = Status::of_task(pid, live_thread(pid)?)?;
    Some((s.ids("Uid")?, s.ids("Gid")?, s.mask("CapPrm")?))
}

/// The process a thread belongs to.
pub fn tgid_of(tid: Tid) -> Option<Pid> {
    Status::of(tid)?.number("Tgid")
}

/// Thread ids of a process, from `/proc/PID/task`.
pub fn tasks(pid: Pid) -> std::io::Result<Vec<Tid>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        if let Some(t) = e?.file_name().to_str().and_then(|s| s.parse().ok()) {
            v.push(t);
        }
    }
    Ok(v)
}

/// When the process started, in clock ticks after boot (field 22 of
/// `/proc/PID/stat`): with the pid, it names one process even after the pid
/// is reused.
pub fn start_time(pid: Pid) -> Option<u64> {
    stat_start_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The start time in a `/proc/PID/stat` text.
pub fn stat_start_time(stat: &str) -> Option<u64> {
    // The command name may contain spaces and parentheses: skip past the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// True if `tid` is a live thread of `pid`.
pub fn is_thread_of(pid: Pid, tid: Tid) -> bool {
    tid > 0 && std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
}

/// Thread name.
pub fn comm(pid: Pid, tid: Tid) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// True if every byte of `[addr, addr + len)` lies in a mapping of `pid`
/// (`/proc/PID/maps`), whatever its permissions. Unreadable maps count as
/// mapped (nothing to warn about).
pub fn is_mapped(pid: Pid, addr: u64, len: u64) -> bool {
    let Some(via) = live_thread(pid) else {
        return true;
    };
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/task/{via}/maps")) else {
        return true;
    };
    let end = addr.saturating_add(len.max(1));
    let mut covered = addr;
    let mut ranges: Vec<(u64, u64)> = maps
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect();
    ranges.sort_unstable();
    for (a, b) in ranges {
        if a <= covered && covered < b {
            covered = b;
            if covered >= end {
                return true;
            }
        }
    }
    false
}

/// Inode of the user namespace of `pid` (`/proc/PID/ns/user`).
pub fn userns_of(pid: Pid) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/user"))
        .ok()
        .map(|m| m.ino())
}

/// The uid, in the daemon's view, of root of `pid`'s user namespace
/// (`/proc/PID/uid_map`: the line whose inside id is 0).
pub fn userns_root_uid(pid: Pid) -> Option<u32> {
    let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).ok()?;
    map.lines().find_map(|l| {
        let mut w = l.split_whitespace().map(|v| v.parse::<u32>().ok());
        match (w.next()??, w.next()??) {
            (0, outside) => Some(outside),
            _ => None,
        }
    })
}

/// A pidfd for `pid` (readable once the process exits).
pub fn pidfd_open(pid: Pid) -> Option<OwnedFd> {
    // SAFETY: plain syscall; the result is a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: fresh fd we own.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Reads `len` bytes at `addr` in the memory of process `pid`, through
/// thread `via` (process_vm_readv takes any thread of the process). Through
/// a thread, not the pid: once the leader has exited it is a zombie without
/// memory (ESRCH), while the process's other threads share the memory. If
/// `via` is gone too, another live thread is used.
pub fn read_memory(pid: Pid, via: Tid, addr: u64, len: usize) -> Result<Vec<u8>, String> {
    match read_memory_of(via, addr, len) {
        Err(Errno::ESRCH) => {}
        other => return other.map_err(|e| read_error(e, len)),
    }
    match live_thread(pid).filter(|&t| t != via) {
        Some(t) => read_memory_of(t, addr, len).map_err(|e| read_error(e, len)),
        None => Err(read_error(Errno::ESRCH, len)),
    }
}

fn read_error(e: Errno, len: usize) -> String {
    match e {
        // A short read: the range crosses into unmapped memory.
        Errno::EFAULT => format!("reading target memory failed: {len} bytes not all mapped"),
        Errno::EPERM if yama::refusal().is_some() => format!(
            "reading target memory failed: {}",
            yama::refusal().unwrap_or_default()
        ),
        e => format!("reading target memory failed: {}", e.desc()),
    }
}

/// Reads up to `len` bytes at `addr` in `pid`'s memory, stopping at the
/// first page that is not mapped or not readable: returns the bytes read
/// from `addr` on, and why the rest could not be read. One remote iovec per
/// page, so that the transfer ends where readable memory does whether or
/// not the kernel splits an iovec (its manual says it never does; 6.18
/// does: kernel-facts §8).
pub fn read_memory_prefix(pid: Pid, addr: u64, len: usize) -> (Vec<u8>, Option<String>) {
    const PAGE: u64 = 4096;
    let Some(via) = live_thread(pid) else {
        return (Vec::new(), Some(read_error(Errno::ESRCH, len)));
    };
    if yama::assumed_refuses(via) {
        return (Vec::new(), Some(read_error(Errno::EPERM, len)));
    }
    let mut buf = vec![0u8; len];
    let mut remote = Vec::new();
    let (mut at, end) = (addr, addr.saturating_add(len as u64));
    while at < end {
        let next = ((at / PAGE) + 1).saturating_mul(PAGE).min(end);
        remote.push(libc::iovec {
            iov_base: at as *mut libc::c_void,
            iov_len: (next - at) as usize,
        });
        at = next;
    }
    let mut done = 0usize;
    // The kernel takes at most IOV_MAX (1024) iovecs per call.
    for chunk in remote.chunks(1024) {
        let want: usize = chunk.iter().map(|v| v.iov_len).sum();
        let local = libc::iovec {
            iov_base: buf[done..].as_mut_ptr().cast(),
            iov_len: want,
        };
        // SAFETY: local points to `want` writable bytes of `buf`; the remote
        // iovecs are only read by the kernel.
        let n =
            unsafe { libc::process_vm_readv(via, &local, 1, chunk.as_ptr(), chunk.len() as _, 0) };
        if n < 0 {
            let e = Errno::last();
            buf.truncate(done);
            return (buf, Some(read_error(e, len - done)));
        }
        done += n as usize;
        if (n as usize) < want {
            buf.truncate(done);
            return (
                buf,
                Some(format!(
                    "{} bytes from {:#x} are not mapped or not readable",
                    len - done,
                    addr + done as u64
                )),
            );
        }
    }
    (buf, None)
}

/// process_vm_readv of `len` bytes at `addr` through task `tid`.
fn read_memory_of(tid: Tid, addr: u64, len: usize) -> Result<Vec<u8>, Errno> {
    if yama::assumed_refuses(tid) {
        return Err(Errno::EPERM);
    }
    let mut buf = vec![0u8; len];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: local points to `len` writable bytes; remote is only read by the kernel.
    let n = unsafe { libc::process_vm_readv(tid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(Errno::last());
    }
    if n as usize != len {
        return Err(Errno::EFAULT);
    }
    Ok(buf)
}

/// Every process's pid (the numeric entries of `/proc`).
pub fn pids() -> Vec<Pid> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<Pid>().ok())
        .collect()
}

/// `tid`'s blocked signals (`SigBlk`), when they are the program's own
/// choice: `None` while the thread is inside the C library with every
/// signal blocked for a moment, where it runs none of the program's code
/// (so makes no hits and takes no signal that matters). glibc blocks every
/// signal, its own internal ones included, around `clone()` in
/// `pthread_create` (in the creator, and in the new thread until its first
/// instructions restore the creator's mask) and before a thread exits; a
/// thread creating threads non-stop shows that mask in about a third of
/// looks (docs/kernel-facts.md §11). The program itself cannot block
/// glibc's internal signals 32 and 33 (`pthread_sigmask` and `sigprocmask`
/// drop them), so a mask with both is the library's. Also `None` for a
/// thread that has not run yet and for one in a tracing stop (a clone
/// event, held until wpd has armed it).
pub fn settled_sigmask(pid: Pid, tid: Tid) -> Option<u64> {
    if !has_run(pid, tid) {
        return None;
    }
    let st = Status::of_task(pid, tid)?;
    if st.field("State").is_some_and(|s| s.starts_with('t')) {
        return None;
    }
    let mask = st.mask("SigBlk")?;
    let internal = (1u64 << 31) | (1u64 << 32);
    (mask & internal != internal).then_some(mask)
}

/// True once `tid` has been on a CPU (`/proc/PID/task/TID/schedstat`: its
/// first field is the time it has run, in ns).
fn has_run(pid: Pid, tid: Tid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .is_none_or(|ns| ns > 0)
}

/// Yama (`kernel.yama.ptrace_scope`): the scope, whether the daemon itself
/// is above it (CAP_SYS_PTRACE), and a scope assumed on kernels without
/// Yama (`wpd --yama-ptrace-scope`), under which the daemon refuses its own
/// attaches and memory reads as Yama would (kernel-facts §25.8).
pub mod yama {
    use super::Status;
    use crate::model::Pid;

    /// `CAP_SYS_PTRACE`'s bit in the capability masks.
    pub const CAP_SYS_PTRACE: u32 = 19;

    /// The Yama scope the daemon was told to assume (`wpd --yama-ptrace-scope`):
    /// the kernels without Yama then show the paths a user of a distribution
    /// that enables it (Ubuntu's default is 1) gets.
    static ASSUMED_YAMA: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

    /// Makes [`scope`] answer `scope` for the daemon's life, and the
    /// daemon's own attaches refused as Yama would refuse them
    /// ([`assumed_refuses`]). Once, before any request.
    pub fn assume_scope(scope: u32) {
        let _ = ASSUMED_YAMA.set(scope);
    }

    /// Yama's `kernel.yama.ptrace_scope` (0 when Yama is absent), or the scope
    /// assumed ([`assume_scope`]).
    pub fn scope() -> u32 {
        if let Some(&s) = ASSUMED_YAMA.get() {
            return s;
        }
        std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Whether the daemon holds CAP_SYS_PTRACE in its effective set (read once:
    /// the daemon never changes its credentials).
    pub fn daemon_may_trace_any() -> bool {
        static CAP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *CAP.get_or_init(|| {
            Status::of(std::process::id() as Pid)
                .and_then(|s| s.mask("CapEff"))
                .is_some_and(|m| m & (1 << CAP_SYS_PTRACE) != 0)
        })
    }

    /// With an assumed scope ([`assume_scope`]; no Yama in the kernel to
    /// refuse), whether Yama would refuse the daemon's own attach to task
    /// `tid` (its memory read or written): the daemon lacks CAP_SYS_PTRACE and
    /// the scope is 2 or more, or 1 and the task's process does not descend
    /// from the daemon. `false` whenever the scope is the kernel's own: the
    /// kernel answers then.
    pub fn assumed_refuses(tid: Pid) -> bool {
        let Some(&scope) = ASSUMED_YAMA.get() else {
            return false;
        };
        if scope == 0 || daemon_may_trace_any() {
            return false;
        }
        if scope >= 2 {
            return true;
        }
        let me = std::process::id() as Pid;
        let mut cur = super::tgid_of(tid).unwrap_or(tid);
        for _ in 0..64 {
            let Some(pp) = Status::of(cur).and_then(|s| s.number::<Pid>("PPid")) else {
                return true;
            };
            if pp == me {
                return false;
            }
            if pp <= 0 {
                return true;
            }
            cur = pp;
        }
        true
    }

    /// Why an attach of the daemon's own was refused, when Yama explains it
    /// (the daemon without CAP_SYS_PTRACE under a scope of 1 or more).
    pub fn refusal() -> Option<String> {
        let scope = scope();
        (scope >= 1 && !daemon_may_trace_any()).then(|| match scope {
            1 => "kernel.yama.ptrace_scope=1 lets a daemon without CAP_SYS_PTRACE read and write \
                  the memory only of processes it started"
                .to_string(),
            n => format!(
                "kernel.yama.ptrace_scope={n} lets only CAP_SYS_PTRACE read and write another \
                 process's memory"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_checks() {
        let me = std::process::id() as Pid;
        assert!(check_process(me).is_ok());
        assert!(tasks(me).unwrap().contains(&me));
        assert!(is_thread_of(me, me));
        assert!(!is_thread_of(me, 0));
        assert_eq!(check_process(0), Err(NotAProcess::BadPid(0)));
    }

    /// This process runs; a child that has exited and is not reaped yet (a
    /// zombie) and a tid that does not exist are exiting.
    #[test]
    fn running_and_exiting_threads() {
        let me = std::process::id() as Pid;
        assert!(!thread_exiting(me, me));
        assert_eq!(running_thread(me), Some(me));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as Pid;
        // Not reaped: it stays a zombie until `wait` below.
        while thread_state(pid, pid) != Some('Z') {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(thread_exiting(pid, pid));
        assert_eq!(running_thread(pid), None);
        child.wait().unwrap();
        assert!(thread_exiting(pid, pid), "gone");
    }

    #[test]
    fn status_fields() {
        let s = Status::parse(
            "Name:\twpd-target\nTgid:\t42\nUid:\t1000\t1001\t1002\t1003\nCapPrm:\t000001ffffffffff\nTracerPid:\t0\n",
        );
        assert_eq!(s.field("Name"), Some("wpd-target"));
        assert_eq!(s.number::<i32>("Tgid"), Some(42));
        assert_eq!(s.ids("Uid"), Some([1000, 1001, 1002]));
        assert_eq!(s.mask("CapPrm"), Some(0x1ff_ffff_ffff));
        assert_eq!(s.number::<i32>("TracerPid"), Some(0));
        assert_eq!(s.field("Tgi"), None, "a prefix of a name is not the name");
        assert_eq!(s.field("Gid"), None);
    }

    /// A thread that blocks every signal itself keeps glibc's internal
    /// ones unblocked, and its mask counts; one with the library's
    /// everything-blocked mask (set here by the raw system call, as glibc
    /// does around `clone()`) does not.
    #[test]
    fn settled_sigmask_tells_the_librarys_mask_from_the_programs() {
        let me = std::process::id() as Pid;
        let look = |raw: bool| {
            let (tx, rx) = std::sync::mpsc::channel();
            let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
            let t = std::thread::spawn(move || {
                if raw {
                    let all: u64 = !0;
                    // SAFETY: rt_sigprocmask with a valid 8-byte set and no old set.
                    unsafe {
                        libc::syscall(
                            libc::SYS_rt_sigprocmask,
                            libc::SIG_BLOCK,
                            &all as *const u64,
                            std::ptr::null_mut::<u64>(),
                            8usize,
                        )
                    };
                } else {
                    // SAFETY: a zeroed sigset filled by sigfillset, applied to this thread.
                    unsafe {
                        let mut set: libc::sigset_t = std::mem::zeroed();
                        libc::sigfillset(&mut set);
                        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                    }
                }
                // SAFETY: gettid has no preconditions.
                tx.send(unsafe { libc::gettid() }).unwrap();
                done_rx.recv().unwrap();
            });
            let tid = rx.recv().unwrap();
            let mask = settled_sigmask(me, tid);
            done_tx.send(()).unwrap();
            t.join().unwrap();
            mask
        };
        let own = look(false).expect("a program's own mask counts");
        assert_ne!(own & (1 << (libc::SIGUSR1 - 1)), 0, "{own:x}");
        assert_eq!(own & (1 << 31), 0, "{own:x}");
        assert_eq!(
            look(true),
            None,
            "the library's passing mask does not count"
        );
    }

    #[test]
    fn reads_own_memory() {
        let x: u64 = 0x1122_3344_5566_7788;
        let me = std::process::id() as Pid;
        let v = read_memory(me, me, &x as *const u64 as u64, 8).unwrap();
        assert_eq!(v, x.to_le_bytes());
    }
}
