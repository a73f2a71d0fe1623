//! Loading a program: `BPF_PROG_LOAD`, and the verifier's log when it
//! refuses one; for the tests, running a socket filter on demand.

#[cfg(test)]
use std::os::fd::AsRawFd;
use std::os::fd::{FromRawFd, OwnedFd};

use nix::errno::Errno;

use super::{BPF_PROG_LOAD, Insn, sys_bpf};

/// `union bpf_attr` as BPF_PROG_LOAD reads it (the fields up to the log).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    _rest: [u64; 9],
}

/// A refused program load: the errno and, for EINVAL/EACCES, the
/// verifier's log (the reason, for the daemon's log and the tests).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bpf(BPF_PROG_LOAD) refused: {}{}", errno.desc(), verifier_note(log))]
pub struct LoadError {
    /// The errno.
    pub errno: Errno,
    /// The last lines of the verifier's log (empty: none).
    pub log: String,
}

fn verifier_note(log: &str) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!(" (verifier: {})", log.trim())
    }
}

/// Loads a GPL program (its helpers are GPL-only) of `prog_type`. A
/// refusal by the verifier is loaded again with the log on, to say why.
pub fn load_program(prog_type: u32, insns: &[Insn]) -> Result<OwnedFd, LoadError> {
    load_program_for(prog_type, 0, insns)
}

/// [`load_program`] of a program attached as `expected_attach_type` says
/// (`enum bpf_attach_type`, e.g.
/// [`TRACE_UPROBE_MULTI`](super::TRACE_UPROBE_MULTI); 0: unspecified).
pub fn load_program_for(
    prog_type: u32,
    expected_attach_type: u32,
    insns: &[Insn],
) -> Result<OwnedFd, LoadError> {
    let license = c"GPL";
    let mut attr = ProgLoadAttr {
        prog_type,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        expected_attach_type,
        ..Default::default()
    };
    match sys_bpf(BPF_PROG_LOAD, &attr) {
        // SAFETY: a new fd the kernel just gave us.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) }),
        Err(errno) if matches!(errno, Errno::EINVAL | Errno::EACCES) => {
            let mut log = vec![0u8; 64 * 1024];
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            let _ = sys_bpf(BPF_PROG_LOAD, &attr);
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            // The last lines say what was rejected.
            let text = String::from_utf8_lossy(&log[..end]);
            let tail: Vec<&str> = text.lines().rev().take(4).collect();
            Err(LoadError {
                errno,
                log: tail.into_iter().rev().collect::<Vec<_>>().join("; "),
            })
        }
        Err(errno) => Err(LoadError {
            errno,
            log: String::new(),
        }),
    }
}

/// `BPF_PROG_TYPE_SOCKET_FILTER`: a program the kernel can run on demand
/// (`BPF_PROG_TEST_RUN`), which perf event programs cannot: the tests run
/// pieces of the hit program's code this way.
#[cfg(test)]
pub const PROG_TYPE_SOCKET_FILTER: u32 = 1;

/// `union bpf_attr` as BPF_PROG_TEST_RUN reads it.
#[cfg(test)]
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// Runs a [`PROG_TYPE_SOCKET_FILTER`] program once on a zeroed packet
/// (`BPF_PROG_TEST_RUN`); returns what it returned.
#[cfg(test)]
pub fn test_run(prog: &OwnedFd) -> Result<u32, Errno> {
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    let packet = [0u8; 64];
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: packet.len() as u32,
        data_in: packet.as_ptr() as u64,
        repeat: 1,
        ..Default::default()
    };
    // SAFETY: attr is a valid bpf_attr prefix of the size given, which the
    // kernel writes the result into; the packet outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &raw mut attr,
            std::mem::size_of::<TestRunAttr>(),
        )
    };
    if r < 0 {
        return Err(Errno::last());
    }
    Ok(attr.retval)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_refused_load_says_why() {
        use super::LoadError;
        use nix::errno::Errno;
        let e = LoadError {
            errno: Errno::EPERM,
            log: String::new(),
        };
        assert_eq!(
            e.to_string(),
            "bpf(BPF_PROG_LOAD) refused: Operation not permitted"
        );
        let e = LoadError {
            errno: Errno::EINVAL,
            log: " R1 invalid mem access\n".into(),
        };
        assert_eq!(
            e.to_string(),
            "bpf(BPF_PROG_LOAD) refused: Invalid argument (verifier: R1 invalid mem access)"
        );
    }
}
