//! Crash recovery of the ptrace backend: registers set through ptrace
//! outlive the tracer (kernel-facts §2), so the backend keeps a state file
//! listing the processes it has attached (pid and start time, one line each,
//! rewritten only on attach and detach), and a daemon restarted after a
//! SIGKILL clears DR7 on every thread of each of them before serving,
//! threads born after the last write included. A process whose start time
//! differs reused the pid and is left alone.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use crate::arch::current as arch;
use crate::model::{Pid, Tid};
use crate::procfs;

/// The state file of a running backend.
#[derive(Debug)]
pub struct StateFile {
    path: PathBuf,
    /// Attached processes: pid → start time.
    procs: Mutex<BTreeMap<Pid, u64>>,
}

impl StateFile {
    /// A state file at `path` (written on the first attach).
    pub fn new(path: PathBuf) -> Self {
        StateFile {
            path,
            procs: Mutex::new(BTreeMap::new()),
        }
    }

    /// Records an attached process and rewrites the file.
    pub fn add(&self, pid: Pid, start: u64) {
        let mut procs = self.procs.lock().unwrap();
        procs.insert(pid, start);
        self.write(&procs);
    }

    /// Forgets a detached process and rewrites the file (removes it when
    /// empty).
    pub fn remove(&self, pid: Pid) {
        let mut procs = self.procs.lock().unwrap();
        if procs.remove(&pid).is_some() {
            self.write(&procs);
        }
    }

    fn write(&self, procs: &BTreeMap<Pid, u64>) {
        if procs.is_empty() {
            let _ = std::fs::remove_file(&self.path);
            return;
        }
        let mut lines = String::new();
        for (pid, start) in procs {
            lines.push_str(&format!("pid {pid} start {start}\n"));
        }
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        // `<file>.tmp`, renamed over the file: private (0600), never
        // through a link, one per state file.
        if let Err(e) = crate::statedir::replace(&self.path, lines.as_bytes()) {
            tracing::warn!(
                file = ?self.path,
                error = %e,
                "cannot write the ptrace state file: a restart after a crash could not clear \
                 the debug registers it lists"
            );
        }
    }
}

/// The lock of a ptrace state file (`<file>.lock`, an exclusive `flock`
/// held for the daemon's life): two daemons never share a state file, and
/// the second is refused before it reads (and removes) the first one's.
#[derive(Debug)]
pub struct StateLock {
    _file: std::fs::File,
    /// The lock file.
    path: PathBuf,
}

impl StateLock {
    /// Lets the lock go and removes its file: the daemon that took it is
    /// refused and never ran (no state file of its is left to clean up).
    pub fn discard(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Opens the lock file `lock`. A name planted in a directory others may
/// write (a symbolic link, a file of another user or with other links,
/// something not a file) is not the daemon's: it is removed and the file
/// made anew, exclusively, before anything is written to it. The socket
/// beside it was bound already, so no other daemon uses the name.
fn open_lock(lock: &std::path::Path) -> Result<std::fs::File, String> {
    use std::os::unix::fs::MetadataExt;
    let euid = nix::unistd::geteuid().as_raw();
    let ours = |m: &std::fs::Metadata| {
        !m.file_type().is_symlink() && m.is_file() && m.uid() == euid && m.nlink() == 1
    };
    if let Ok(m) = std::fs::symlink_metadata(lock)
        && !ours(&m)
    {
        tracing::warn!(
            path = %lock.display(),
            "a lock file the daemon did not make was there: replaced"
        );
        std::fs::remove_file(lock).map_err(|e| format!("removing {}: {e}", lock.display()))?;
    }
    let open = |create_new: bool| {
        crate::statedir::open(
            lock,
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(!create_new)
                .create_new(create_new)
                .truncate(false),
        )
    };
    let f = match open(true) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            open(false).map_err(|e| format!("opening {}: {e}", lock.display()))?
        }
        Err(e) => return Err(format!("creating {}: {e}", lock.display())),
    };
    match f.metadata() {
        Ok(m) if ours(&m) => Ok(f),
        _ => Err(format!(
            "{} changed while the daemon opened it: another user may write its directory",
            lock.display()
        )),
    }
}

/// Takes the lock of the state file at `path`, or names the daemon (pid)
/// holding it.
pub fn lock_state_file(path: &std::path::Path) -> Result<StateLock, String> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let mut lock = path.as_os_str().to_owned();
    lock.push(".lock");
    let lock = PathBuf::from(lock);
    if let Some(dir) = lock.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let mut f = open_lock(&lock)?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut holder = String::new();
        let _ = f.read_to_string(&mut holder);
        return Err(format!(
            "another wpd (pid {}) uses the ptrace state file {}: give this one its own \
             --ptrace-state-file, or its own --listen address",
            holder.trim(),
            path.display()
        ));
    }
    let _ = f.set_len(0);
    let _ = f.rewind();
    let _ = writeln!(f, "{}", std::process::id());
    Ok(StateLock {
        _file: f,
        path: lock,
    })
}

/// What a state file line names: every thread of a process (`pid P start
/// S`; S = 0 when unknown), or one thread (`P T`, the older format).
#[derive(Debug, PartialEq, Eq)]
enum StateLine {
    Process { pid: Pid, start: u64 },
    Thread { pid: Pid, tid: Tid },
}

fn parse_state_line(line: &str) -> Option<StateLine> {
    let w: Vec<&str> = line.split_whitespace().collect();
    match w.as_slice() {
        ["pid", pid, "start", start] => Some(StateLine::Process {
            pid: pid.parse().ok()?,
            start: start.parse().ok()?,
        }),
        [pid, tid] => Some(StateLine::Thread {
            pid: pid.parse().ok()?,
            tid: tid.parse().ok()?,
        }),
        _ => None,
    }
}

/// Clears DR7 on the threads of processes listed in the state file at
/// `path` of a daemon that died without cleaning up (SIGKILL, OOM kill).
/// Runs before serving. Returns how many threads were cleaned.
pub fn recover(path: &std::path::Path) -> usize {
    // A few lines per attached process; a larger file is not ours.
    let text = match crate::statedir::read(path, 16 << 20) {
        Ok(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
        Ok(None) => return 0,
        Err(e) => {
            tracing::warn!(file = ?path, error = %e, "cannot read the ptrace state file");
            return 0;
        }
    };
    let mut cleaned = 0;
    for line in text.lines() {
        match parse_state_line(line) {
            Some(StateLine::Process { pid, start }) => {
                if start != 0 && procfs::start_time(pid) != Some(start) {
                    continue;
                }
                for tid in procfs::tasks(pid).unwrap_or_default() {
                    cleaned += usize::from(clear_stale_registers(pid, tid));
                }
            }
            Some(StateLine::Thread { pid, tid }) => {
                cleaned += usize::from(clear_stale_registers(pid, tid));
            }
            None => tracing::warn!(line, "unreadable line in the ptrace state file"),
        }
    }
    let _ = std::fs::remove_file(path);
    cleaned
}

/// Seizes one untraced thread, sets its DR7 to 0 and detaches. False if the
/// thread is gone, traced by someone else, or could not be stopped.
fn clear_stale_registers(pid: Pid, tid: Tid) -> bool {
    use nix::sys::ptrace;
    use nix::sys::signal::Signal;
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    if !procfs::is_thread_of(pid, tid) || super::tracer_of(tid).is_some() {
        return false;
    }
    let p = nix::unistd::Pid::from_raw(tid);
    if ptrace::seize(p, ptrace::Options::empty()).is_err() {
        return false;
    }
    let _ = ptrace::interrupt(p);
    // Wait for this tracee's stop. A signal that arrives first is passed on
    // at detach, except the SIGTRAP of a hit on the stale registers, which
    // would kill the target.
    let deliver = match waitpid(p, Some(WaitPidFlag::__WALL)) {
        Ok(WaitStatus::PtraceEvent(..)) => None,
        Ok(WaitStatus::Stopped(_, Signal::SIGTRAP))
            if ptrace::getsiginfo(p).is_ok_and(|i| i.si_code == arch::TRAP_HWBKPT) =>
        {
            None
        }
        Ok(WaitStatus::Stopped(_, sig)) => Some(sig),
        _ => return false,
    };
    let _ = ptrace::write_user(p, arch::debugreg_offset(arch::DR7) as _, 0);
    let _ = ptrace::detach(p, deliver);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock name planted beside the socket (a link to a file of root's,
    /// a file of another user, a hard link) is replaced, never opened
    /// through or written; a refused daemon's `discard` removes its lock.
    #[test]
    fn a_planted_lock_is_replaced_and_a_discarded_one_removed() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("wpd-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, b"precious\n").unwrap();
        let state = dir.join("wpd.sock.ptrace-armed");
        let lock = dir.join("wpd.sock.ptrace-armed.lock");
        let euid = nix::unistd::geteuid().as_raw();
        let mut plants: Vec<Box<dyn Fn()>> = vec![
            Box::new(|| std::os::unix::fs::symlink(&victim, &lock).unwrap()),
            Box::new(|| std::fs::hard_link(&victim, &lock).unwrap()),
        ];
        if euid == 0 {
            plants.push(Box::new(|| {
                std::fs::write(&lock, b"").unwrap();
                std::os::unix::fs::chown(&lock, Some(65534), Some(65534)).unwrap();
            }));
        }
        for plant in plants {
            plant();
            let l = lock_state_file(&state).unwrap();
            let m = std::fs::symlink_metadata(&lock).unwrap();
            assert!(m.is_file() && m.uid() == euid && m.nlink() == 1, "{m:?}");
            assert_eq!(std::fs::read(&victim).unwrap(), b"precious\n");
            l.discard();
            assert!(std::fs::symlink_metadata(&lock).is_err(), "discarded");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn state_lines_of_both_formats_parse() {
        assert_eq!(
            parse_state_line("pid 12 start 3456"),
            Some(StateLine::Process {
                pid: 12,
                start: 3456
            })
        );
        assert_eq!(
            parse_state_line("12 13"),
            Some(StateLine::Thread { pid: 12, tid: 13 })
        );
        assert_eq!(parse_state_line("pid 12"), None);
        assert_eq!(parse_state_line("pid x start 1"), None);
        assert_eq!(parse_state_line(""), None);
    }

    #[test]
    fn the_file_lists_attached_processes_and_goes_when_none_are() {
        let dir = std::env::temp_dir().join(format!("wpd-state-{}", std::process::id()));
        let path = dir.join("s");
        let f = StateFile::new(path.clone());
        f.add(7, 70);
        f.add(3, 30);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "pid 3 start 30\npid 7 start 70\n"
        );
        f.remove(3);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "pid 7 start 70\n");
        f.remove(7);
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(dir);
    }
}
