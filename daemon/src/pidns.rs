//! Pid namespaces: the daemon's own, and those of its callers.
//!
//! Every pid and tid the daemon handles is a number in its own pid
//! namespace: what `getpid`, `waitpid`, `ptrace`, `perf_event_open` and
//! its `/proc` (a mount of its namespace's procfs) use. Its BPF programs
//! read ids with `bpf_get_current_pid_tgid`, which gives those of the
//! *initial* namespace; a daemon in another namespace (a container, under
//! `unshare --pid`) asks `bpf_get_ns_current_pid_tgid` for its own instead,
//! naming its namespace by the device and inode of `/proc/self/ns/pid`
//! ([`own`]; kernel-facts "Pid namespaces").

use std::sync::OnceLock;

use crate::model::Pid;

/// Inode of the initial pid namespace (`PROC_PID_INIT_INO`, fixed by the
/// kernel: `include/linux/proc_ns.h`).
pub const INIT_INO: u64 = 0xEFFF_FFFC;

/// A pid namespace as `bpf_get_ns_current_pid_tgid` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidNs {
    /// The nsfs device as the kernel encodes a `dev_t` inside
    /// (`MKDEV`: major << 20 | minor), which is what the helper compares;
    /// `stat` gives the userspace encoding (`new_encode_dev`).
    pub dev: u64,
    /// The namespace's inode number.
    pub ino: u64,
}

impl PidNs {
    /// The namespace `/proc/self/ns/pid` (or any `ns/pid` link) names.
    pub fn at(path: &str) -> std::io::Result<PidNs> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        Ok(PidNs {
            dev: kernel_dev(m.dev()),
            ino: m.ino(),
        })
    }

    /// Whether it is the initial pid namespace.
    pub fn is_initial(&self) -> bool {
        self.ino == INIT_INO
    }
}

/// A `stat` device number (userspace encoding) as the kernel's `dev_t`.
pub fn kernel_dev(st_dev: u64) -> u64 {
    let major = libc::major(st_dev) as u64;
    let minor = libc::minor(st_dev) as u64;
    (major << 20) | minor
}

/// The daemon's pid namespace, when it is not the initial one (there
/// `bpf_get_current_pid_tgid` already gives its ids, and costs less).
/// Read once; a namespace that cannot be read counts as the initial one.
pub fn own() -> Option<PidNs> {
    static OWN: OnceLock<Option<PidNs>> = OnceLock::new();
    *OWN.get_or_init(|| match PidNs::at("/proc/self/ns/pid") {
        Ok(ns) if ns.is_initial() => None,
        Ok(ns) => {
            proc_is_ours();
            tracing::info!(
                ino = ns.ino,
                "the daemon runs in a pid namespace of its own: its programs read ids in it"
            );
            Some(ns)
        }
        Err(e) => {
            tracing::warn!("cannot read /proc/self/ns/pid ({e}): ids as the initial namespace's");
            None
        }
    })
}

/// Warns when `/proc` is not a mount of the daemon's pid namespace (a
/// daemon put in a new pid namespace without its own `/proc`, as
/// `unshare --pid --fork` without `--mount-proc` leaves it): `/proc/PID`
/// would then name other processes than the daemon's pids do.
fn proc_is_ours() {
    let seen = std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse::<u32>().ok());
    if seen != Some(std::process::id()) {
        tracing::warn!(
            "/proc is not this pid namespace's (/proc/self is {seen:?}, the daemon is pid {}): \
             mount one (unshare --mount-proc, or a container's own /proc)",
            std::process::id()
        );
    }
}

/// Inode of the pid namespace of `pid` (`/proc/PID/ns/pid`).
pub fn ino_of(pid: Pid) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}

/// Inode of the daemon's own pid namespace.
pub fn own_ino() -> Option<u64> {
    static INO: OnceLock<Option<u64>> = OnceLock::new();
    *INO.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_dev_moves_the_major_above_a_20_bit_minor() {
        // Small numbers are the same in both encodings.
        assert_eq!(kernel_dev(4), 4);
        // major 8, minor 1 (userspace 0x801) is (8 << 20) | 1 inside.
        assert_eq!(kernel_dev(0x801), (8 << 20) | 1);
        // minor 0x1234 of major 0: the upper minor bits sit above the
        // major's in userspace's encoding.
        assert_eq!(kernel_dev(libc::makedev(0, 0x1234)), 0x1234);
    }

    #[test]
    fn own_namespace_is_readable() {
        let ns = PidNs::at("/proc/self/ns/pid").unwrap();
        assert_ne!(ns.ino, 0);
        assert_eq!(own().is_none(), ns.is_initial());
    }
}
