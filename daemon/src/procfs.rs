//! What the daemon reads from `/proc` and a few process syscalls
//! (pidfd_open, process_vm_readv).

use std::os::fd::{FromRawFd, OwnedFd};

use crate::error::WpdError;
use crate::model::{Pid, Tid};

/// Field `name:` of `/proc/PID/status`.
fn status_field(pid: Pid, name: &str) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| {
        l.strip_prefix(name)
            .map(|v| v.trim_start_matches(':').trim().to_string())
    })
}

/// Checks that `pid` is a live process (a thread-group leader, not a zombie).
pub fn check_process(pid: Pid) -> Result<(), WpdError> {
    if pid <= 0 {
        return Err(WpdError::InvalidArgument(format!(
            "pid must be positive, got {pid}"
        )));
    }
    let tgid = status_field(pid, "Tgid").ok_or(WpdError::NoSuchProcess(pid))?;
    if tgid != pid.to_string() {
        return Err(WpdError::InvalidArgument(format!(
            "{pid} is a thread of process {tgid}, not a process: use --pid {tgid} --tid {pid}"
        )));
    }
    let state = status_field(pid, "State").unwrap_or_default();
    if state.starts_with('Z') || state.starts_with('X') {
        return Err(WpdError::NoSuchProcess(pid));
    }
    Ok(())
}

/// The process a thread belongs to.
pub fn tgid_of(tid: Tid) -> Option<Pid> {
    status_field(tid, "Tgid")?.parse().ok()
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
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: skip past the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
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

/// Reads `len` bytes at `addr` in `pid` (process_vm_readv).
pub fn read_memory(pid: Pid, addr: u64, len: usize) -> Result<Vec<u8>, String> {
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
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(format!(
            "reading target memory failed: {}",
            nix::errno::Errno::last().desc()
        ));
    }
    if n as usize != len {
        return Err(format!("short read: {n} of {len} bytes"));
    }
    Ok(buf)
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
        assert!(matches!(
            check_process(0),
            Err(WpdError::InvalidArgument(_))
        ));
    }

    #[test]
    fn reads_own_memory() {
        let x: u64 = 0x1122_3344_5566_7788;
        let v = read_memory(std::process::id() as Pid, &x as *const u64 as u64, 8).unwrap();
        assert_eq!(v, x.to_le_bytes());
    }
}
