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
//!
//! Callers are numbered by their own namespace ([`CallerNs`]): one in the
//! daemon's uses the daemon's numbers; one in a namespace nested below it
//! (a container that mounts the daemon's socket) uses its own, which
//! [`Nested`] translates both ways — the kernel's translation ioctls
//! (`NS_GET_PID_FROM_PIDNS`, Linux 6.7) or a scan of `NSpid` in `/proc`,
//! and `NSpid` read through a process's own `/proc` directory for the way
//! out (kernel-facts §12); one in an ancestor or unrelated namespace cannot
//! be numbered at all. The daemon keeps its own numbers everywhere: only
//! the RPC layer translates (`rpc/nsview.rs`).

use std::collections::HashMap;
use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::model::{Pid, Tid};

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

/// A namespace while it lives: device and inode of its nsfs file (`stat`'s
/// encoding). An inode is given again once its namespace is freed, so it
/// names one namespace only while something holds that one open ([`Nested`]
/// does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NsId {
    /// The nsfs device.
    pub dev: u64,
    /// The namespace's inode.
    pub ino: u64,
}

impl NsId {
    fn of(fd: &OwnedFd) -> Option<NsId> {
        let st = nix::sys::stat::fstat(fd).ok()?;
        Some(NsId {
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }
}

/// The daemon's own pid namespace, as an [`NsId`].
fn own_id() -> Option<NsId> {
    static ID: OnceLock<Option<NsId>> = OnceLock::new();
    *ID.get_or_init(|| {
        let fd = open_path("/proc/self/ns/pid", 0)?;
        NsId::of(&fd)
    })
}

fn open_path(path: &str, flags: libc::c_int) -> Option<OwnedFd> {
    let c = CString::new(path).ok()?;
    // SAFETY: open(2) of a NUL-terminated path; the result is a new fd or -1.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC | flags) };
    // SAFETY: a fresh fd we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The parent of pid namespace `ns` (`NS_GET_PARENT`); `None` above the
/// daemon's own (the kernel answers EPERM there) or on error.
fn parent(ns: &OwnedFd) -> Option<OwnedFd> {
    // SAFETY: NS_GET_PARENT on a namespace fd returns a new fd or -1.
    let p = unsafe { libc::ioctl(ns.as_raw_fd(), libc::NS_GET_PARENT) };
    // SAFETY: a fresh fd we own.
    (p >= 0).then(|| unsafe { OwnedFd::from_raw_fd(p) })
}

/// The numbers of a task at each level (`NSpid:` of a `/proc` status text),
/// from the namespace of that `/proc` mount down to the task's own.
pub fn parse_nspid(status: &str) -> Option<Vec<Pid>> {
    let v: Vec<Pid> = crate::procfs::Status::parse(status)
        .field("NSpid")?
        .split_whitespace()
        .map(|n| n.parse().ok())
        .collect::<Option<_>>()?;
    (!v.is_empty()).then_some(v)
}

/// A process's `/proc/PID` directory, held open: whatever is read through it
/// is that process's, even once its pid is another's (lookups under it fail
/// once the process is gone: kernel-facts §12).
struct ProcDir(OwnedFd);

impl ProcDir {
    fn open(pid: Pid) -> Option<ProcDir> {
        if pid <= 0 {
            return None;
        }
        open_path(&format!("/proc/{pid}"), libc::O_DIRECTORY).map(ProcDir)
    }

    fn open_at(&self, rel: &str) -> Option<OwnedFd> {
        let c = CString::new(rel).ok()?;
        // SAFETY: openat(2) relative to a directory fd we hold, of a
        // NUL-terminated path; the result is a new fd or -1.
        let fd = unsafe {
            libc::openat(
                self.0.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        // SAFETY: a fresh fd we own.
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn read(&self, rel: &str) -> Option<String> {
        let mut s = String::new();
        std::fs::File::from(self.open_at(rel)?)
            .read_to_string(&mut s)
            .ok()?;
        Some(s)
    }

    fn start_time(&self) -> Option<u64> {
        crate::procfs::stat_start_time(&self.read("stat")?)
    }

    /// `NSpid` of the process (`status`) or of one of its threads
    /// (`task/TID/status`).
    fn nspid(&self, status: &str) -> Option<Vec<Pid>> {
        parse_nspid(&self.read(status)?)
    }
}

/// How a caller's pid namespace stands to the daemon's: whose numbers its
/// pids are.
#[derive(Debug, Clone)]
pub enum CallerNs {
    /// The daemon's own: its numbers are the daemon's (also token holders
    /// and the daemon's own requests).
    Same,
    /// Nested below the daemon's: its numbers are translated both ways.
    Nested(Arc<Nested>),
    /// A namespace the daemon cannot number (why): nothing it names or would
    /// be shown can be translated.
    Untranslatable(&'static str),
}

/// [`CallerNs::Untranslatable`] of a peer the daemon's namespace does not
/// number (`SO_PEERCRED` pid 0).
pub const ABOVE: &str = "its process has no pid in the daemon's namespace: it runs in an \
                         ancestor of that namespace or an unrelated one, whose numbers the \
                         daemon cannot see";
/// [`CallerNs::Untranslatable`] of a peer whose namespace cannot be read.
pub const UNREADABLE: &str = "its pid namespace cannot be read from the daemon's /proc (the \
                              process that connected is gone, or /proc is not the daemon's \
                              namespace's)";

impl CallerNs {
    /// Where the socket peer `pid` (`SO_PEERCRED`, read in the daemon's
    /// namespace) runs. `None`: not known (counted as the daemon's).
    pub fn of_peer(pid: Option<Pid>) -> CallerNs {
        match pid {
            Some(0) => CallerNs::Untranslatable(ABOVE),
            Some(p) if p > 0 => Nested::of(p),
            _ => CallerNs::Same,
        }
    }

    /// The nested namespace, if it is one.
    pub fn nested(&self) -> Option<&Arc<Nested>> {
        match self {
            CallerNs::Nested(n) => Some(n),
            _ => None,
        }
    }

    /// Whether two callers number processes alike (same namespace).
    pub fn same_numbers(&self, other: &CallerNs) -> bool {
        match (self, other) {
            (CallerNs::Same, CallerNs::Same) => true,
            (CallerNs::Nested(a), CallerNs::Nested(b)) => a.id == b.id,
            _ => false,
        }
    }
}

impl PartialEq for CallerNs {
    fn eq(&self, other: &CallerNs) -> bool {
        match (self, other) {
            (CallerNs::Untranslatable(a), CallerNs::Untranslatable(b)) => a == b,
            _ => self.same_numbers(other),
        }
    }
}

impl Eq for CallerNs {}

/// Which process an outgoing pid must be to be translated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// The one that started at this time (clock ticks after boot): an
    /// event's process.
    Started(u64),
    /// One that started no later than this (a forked child of the event's
    /// process, which started before the event): a later process holding
    /// the pid is not it.
    StartedBy(u64),
    /// Whichever holds the pid now (a listing of live processes).
    Live,
}

/// What one nested namespace's translations remember: a process's number
/// once read stays valid for that process (pid and start time), and a
/// thread's for that thread of it, so events about processes and threads
/// that are gone by the time they are sent can still be translated.
#[derive(Debug, Default)]
struct Known {
    /// (daemon pid, start time) → its number in the namespace (`None`: not
    /// in it).
    procs: HashMap<(Pid, u64), Option<Pid>>,
    /// (daemon pid, start time, daemon tid) → the thread's number.
    threads: HashMap<(Pid, u64, Tid), Tid>,
}

/// Entries kept per map before they are all forgotten.
const KNOWN_KEPT: usize = 1 << 16;

/// A pid namespace nested below the daemon's, as its callers' requests see
/// it: held open (its identity cannot be given to another while the daemon
/// holds it), with its depth and what was translated so far. One per
/// namespace, shared by every connection from it.
#[derive(Debug)]
pub struct Nested {
    ns: OwnedFd,
    id: NsId,
    /// How many levels below the daemon's: the index of its numbers in
    /// `NSpid` as the daemon's `/proc` shows it.
    level: usize,
    /// The kernel has the translation ioctls (else `/proc` is scanned).
    ioctls: AtomicBool,
    known: Mutex<Known>,
}

impl Nested {
    /// The namespace of the daemon's process `pid`, if it is nested below
    /// the daemon's.
    fn of(pid: Pid) -> CallerNs {
        let Some(own) = own_id() else {
            // Cannot tell: as before namespaces were told apart.
            return CallerNs::Same;
        };
        let Some(dir) = ProcDir::open(pid) else {
            return CallerNs::Untranslatable(UNREADABLE);
        };
        let (Some(ns), Some(nspid)) = (dir.open_at("ns/pid"), dir.nspid("status")) else {
            return CallerNs::Untranslatable(UNREADABLE);
        };
        let Some(id) = NsId::of(&ns) else {
            return CallerNs::Untranslatable(UNREADABLE);
        };
        if id == own {
            return CallerNs::Same;
        }
        let level = nspid.len() - 1;
        // Its ancestor `level` levels up must be the daemon's own.
        let mut up = match ns.try_clone() {
            Ok(fd) => fd,
            Err(_) => return CallerNs::Untranslatable(UNREADABLE),
        };
        for _ in 0..level {
            match parent(&up) {
                Some(p) => up = p,
                None => return CallerNs::Untranslatable(UNREADABLE),
            }
        }
        if level == 0 || NsId::of(&up) != Some(own) {
            return CallerNs::Untranslatable(UNREADABLE);
        }
        static REGISTRY: OnceLock<Mutex<HashMap<NsId, Weak<Nested>>>> = OnceLock::new();
        let mut reg = REGISTRY.get_or_init(Default::default).lock().unwrap();
        if let Some(n) = reg.get(&id).and_then(Weak::upgrade) {
            return CallerNs::Nested(n);
        }
        reg.retain(|_, w| w.strong_count() > 0);
        let n = Arc::new(Nested {
            ns,
            id,
            level,
            ioctls: AtomicBool::new(true),
            known: Mutex::new(Known::default()),
        });
        reg.insert(id, Arc::downgrade(&n));
        tracing::info!(
            ino = id.ino,
            level,
            "a caller in a pid namespace nested in the daemon's: its pids are translated"
        );
        CallerNs::Nested(n)
    }

    /// How many levels below the daemon's namespace it is.
    pub fn level(&self) -> usize {
        self.level
    }

    /// Its identity.
    pub fn id(&self) -> NsId {
        self.id
    }

    /// Whether the process `dir`, whose numbers are `nspid`, is in this
    /// namespace or one below it: its namespace, walked up to this one's
    /// level, is this one.
    fn holds(&self, dir: &ProcDir, nspid: &[Pid]) -> bool {
        let depth = nspid.len().saturating_sub(1);
        if nspid.len() <= self.level {
            return false;
        }
        let Some(mut ns) = dir.open_at("ns/pid") else {
            return false;
        };
        for _ in self.level..depth {
            match parent(&ns) {
                Some(p) => ns = p,
                None => return false,
            }
        }
        NsId::of(&ns) == Some(self.id)
    }

    /// Whether the daemon's process `pid` is in this namespace or below it
    /// (a process its callers can name).
    pub fn sees(&self, pid: Pid) -> bool {
        self.pid_out(pid, Identity::Live).is_some()
    }

    /// The daemon's number of the task the namespace numbers `n` (a process
    /// or a thread), if it has one.
    pub fn pid_in(&self, n: Pid) -> Option<Pid> {
        if n <= 0 {
            return None;
        }
        let candidate = match self.kernel_in(n) {
            Ok(d) => d?,
            Err(()) => self.scan_in(n)?,
        };
        // Read back through the task's own directory: its number here is
        // `n` (it was not replaced meanwhile) and it is in this namespace.
        let dir = ProcDir::open(candidate)?;
        let start = dir.start_time()?;
        let nspid = dir.nspid("status")?;
        if nspid.get(self.level) != Some(&n) || !self.holds(&dir, &nspid) {
            return None;
        }
        self.remember_proc(candidate, start, Some(n));
        Some(candidate)
    }

    /// The kernel's translation (`NS_GET_PID_FROM_PIDNS`): `Err` where the
    /// kernel has no such ioctl.
    fn kernel_in(&self, n: Pid) -> Result<Option<Pid>, ()> {
        if !self.ioctls.load(Ordering::Relaxed) {
            return Err(());
        }
        // SAFETY: an ioctl on a namespace fd we hold, taking the number as
        // its argument; it returns a pid or -1.
        let r = unsafe {
            libc::ioctl(
                self.ns.as_raw_fd(),
                libc::NS_GET_PID_FROM_PIDNS,
                n as libc::c_ulong,
            )
        };
        if r > 0 {
            return Ok(Some(r));
        }
        match nix::errno::Errno::last() {
            nix::errno::Errno::ENOTTY | nix::errno::Errno::EINVAL => {
                self.ioctls.store(false, Ordering::Relaxed);
                tracing::info!(
                    "the kernel has no pid translation ioctls (Linux 6.7): callers' pids are \
                     found by scanning /proc"
                );
                Err(())
            }
            _ => Ok(None),
        }
    }

    /// The process whose `NSpid` has `n` at this namespace's level, by a
    /// scan of `/proc` (kernels without the translation ioctls).
    fn scan_in(&self, n: Pid) -> Option<Pid> {
        crate::procfs::pids().into_iter().find(|&p| {
            ProcDir::open(p).is_some_and(|dir| {
                dir.nspid("status").is_some_and(|nspid| {
                    nspid.get(self.level) == Some(&n) && self.holds(&dir, &nspid)
                })
            })
        })
    }

    /// The daemon's number of the thread the namespace numbers `n`, which
    /// must be a thread of the daemon's process `pid`.
    pub fn tid_in(&self, pid: Pid, n: Tid) -> Option<Tid> {
        if n <= 0 {
            return None;
        }
        let dir = ProcDir::open(pid)?;
        let start = dir.start_time()?;
        let found = match self.kernel_in(n) {
            Ok(Some(t)) => dir
                .nspid(&format!("task/{t}/status"))
                .filter(|ns| ns.get(self.level) == Some(&n))
                .map(|_| t),
            Ok(None) => None,
            Err(()) => crate::procfs::tasks(pid).ok()?.into_iter().find(|&t| {
                dir.nspid(&format!("task/{t}/status"))
                    .is_some_and(|ns| ns.get(self.level) == Some(&n))
            }),
        }?;
        self.remember_thread(pid, start, found, n);
        Some(found)
    }

    /// The number in this namespace of the daemon's process `pid`, if it is
    /// in it or below it and is the process `who` says.
    pub fn pid_out(&self, pid: Pid, who: Identity) -> Option<Pid> {
        if pid <= 0 {
            return None;
        }
        if let Identity::Started(s) = who
            && let Some(&n) = self.known.lock().unwrap().procs.get(&(pid, s))
        {
            return n;
        }
        let dir = ProcDir::open(pid)?;
        let start = dir.start_time()?;
        match who {
            Identity::Started(s) if s != start => return None,
            Identity::StartedBy(t) if start > t => return None,
            _ => {}
        }
        if let Some(&n) = self.known.lock().unwrap().procs.get(&(pid, start)) {
            return n;
        }
        let nspid = dir.nspid("status")?;
        let n = self
            .holds(&dir, &nspid)
            .then(|| nspid.get(self.level).copied())
            .flatten();
        self.remember_proc(pid, start, n);
        n
    }

    /// The number in this namespace of thread `tid` of the daemon's process
    /// `pid` (which `who` says). `fresh`: read again while the thread lives,
    /// rather than remembered (a new thread: its tid may be that of one gone
    /// before it).
    pub fn tid_out(&self, pid: Pid, who: Identity, tid: Tid, fresh: bool) -> Option<Tid> {
        if tid == pid {
            return self.pid_out(pid, who);
        }
        if tid <= 0 {
            return None;
        }
        // The process must be in the namespace, and the one `who` says.
        self.pid_out(pid, who)?;
        let dir = ProcDir::open(pid);
        let live_start = dir.as_ref().and_then(ProcDir::start_time);
        let start = match who {
            Identity::Started(s) => s,
            _ => live_start?,
        };
        let known = self
            .known
            .lock()
            .unwrap()
            .threads
            .get(&(pid, start, tid))
            .copied();
        if !fresh && known.is_some() {
            return known;
        }
        // Through the process's own directory, while it is that process.
        let read = dir
            .filter(|_| live_start == Some(start))
            .and_then(|d| d.nspid(&format!("task/{tid}/status")))
            .and_then(|ns| ns.get(self.level).copied());
        match read {
            Some(n) => {
                self.remember_thread(pid, start, tid, n);
                Some(n)
            }
            None => known,
        }
    }

    /// The number of the daemon's process `pid` as last read, whoever holds
    /// the pid now: for an error about a process that exited during the
    /// request that named it.
    pub fn last_known(&self, pid: Pid) -> Option<Pid> {
        if let Some(n) = self.pid_out(pid, Identity::Live) {
            return Some(n);
        }
        let known = self.known.lock().unwrap();
        known
            .procs
            .iter()
            .filter(|((p, _), n)| *p == pid && n.is_some())
            .max_by_key(|((_, start), _)| *start)
            .and_then(|(_, n)| *n)
    }

    fn remember_proc(&self, pid: Pid, start: u64, n: Option<Pid>) {
        let mut k = self.known.lock().unwrap();
        if k.procs.len() >= KNOWN_KEPT {
            k.procs.clear();
        }
        k.procs.insert((pid, start), n);
    }

    fn remember_thread(&self, pid: Pid, start: u64, tid: Tid, n: Tid) {
        let mut k = self.known.lock().unwrap();
        if k.threads.len() >= KNOWN_KEPT {
            k.threads.clear();
        }
        k.threads.insert((pid, start, tid), n);
    }

    /// Forgets what the kernel's translation ioctls say (tests: the `/proc`
    /// scan alone).
    #[cfg(test)]
    fn without_ioctls(&self) {
        self.ioctls.store(false, Ordering::Relaxed);
        *self.known.lock().unwrap() = Known::default();
    }
}

/// Nested pid namespaces for tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Two pid namespaces, B nested in A nested in this process's: `unshare`
    /// (here) runs a second `unshare` (pid 1 of A), which runs `sleep` (pid 2
    /// of A, pid 1 of B). Killed, with everything in A, when dropped.
    pub(crate) struct Chain {
        outer: std::process::Child,
        /// The second `unshare` and `sleep`, as this namespace numbers them.
        pub(crate) a1: Pid,
        pub(crate) b1: Pid,
    }

    impl Chain {
        pub(crate) fn start() -> Chain {
            // SAFETY: geteuid has no preconditions.
            let root = unsafe { libc::geteuid() } == 0;
            let mut cmd = std::process::Command::new("unshare");
            if !root {
                cmd.args(["--user", "--map-root-user"]);
            }
            cmd.args([
                "--pid",
                "--fork",
                "--kill-child",
                "unshare",
                "--pid",
                "--fork",
            ])
            .args(["--kill-child", "sleep", "1000"]);
            let outer = cmd.spawn().expect("unshare (util-linux) runs");
            let child_of = |p: u32| {
                for _ in 0..500 {
                    if let Some(c) = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children"))
                        .ok()
                        .and_then(|s| s.split_whitespace().next()?.parse::<Pid>().ok())
                    {
                        return c;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                panic!("process {p} started no child");
            };
            let a1 = child_of(outer.id());
            let b1 = child_of(a1 as u32);
            // Until the child has executed `sleep`.
            for _ in 0..500 {
                if crate::procfs::Status::of(b1)
                    .and_then(|s| Some(s.field("Name")? == "sleep"))
                    .unwrap_or(false)
                {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Chain { outer, a1, b1 }
        }
    }

    impl Drop for Chain {
        fn drop(&mut self) {
            let _ = self.outer.kill();
            let _ = self.outer.wait();
        }
    }

    /// The namespace of process `pid`, which must be nested.
    pub(crate) fn nested(pid: Pid) -> Arc<Nested> {
        match CallerNs::of_peer(Some(pid)) {
            CallerNs::Nested(n) => n,
            other => panic!("process {pid}: {other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{Chain, nested};
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

    #[test]
    fn nspid_lists_every_level() {
        let st = "Name:\tsleep\nTgid:\t31072\nNSpid:\t31072\t18\t1\nNSsid:\t1\n";
        assert_eq!(parse_nspid(st), Some(vec![31072, 18, 1]));
        assert_eq!(parse_nspid("NSpid:\t42\n"), Some(vec![42]));
        assert_eq!(parse_nspid("Name:\tx\n"), None);
        assert_eq!(parse_nspid("NSpid:\t4x\n"), None);
    }

    #[test]
    fn a_nested_namespace_numbers_its_processes_and_those_below_it_only() {
        let chain = Chain::start();
        let me = std::process::id() as Pid;
        let status = |p: Pid| std::fs::read_to_string(format!("/proc/{p}/status")).unwrap();
        assert_eq!(parse_nspid(&status(chain.a1)), Some(vec![chain.a1, 1]));
        assert_eq!(parse_nspid(&status(chain.b1)), Some(vec![chain.b1, 2, 1]));

        // A caller in A (the second unshare) and one in B (sleep).
        let a = nested(chain.a1);
        let b = nested(chain.b1);
        assert_eq!((a.level(), b.level()), (1, 2));
        // One per namespace, shared by its callers.
        assert!(Arc::ptr_eq(&a, &nested(chain.a1)));
        assert!(matches!(CallerNs::of_peer(Some(me)), CallerNs::Same));

        for scan in [false, true] {
            if scan {
                a.without_ioctls();
                b.without_ioctls();
            }
            // In: A's numbers, B's, and numbers they do not have.
            assert_eq!(a.pid_in(1), Some(chain.a1), "scan {scan}");
            assert_eq!(a.pid_in(2), Some(chain.b1), "scan {scan}");
            assert_eq!(a.pid_in(3), None, "scan {scan}");
            assert_eq!(b.pid_in(1), Some(chain.b1), "scan {scan}");
            assert_eq!(b.pid_in(2), None, "scan {scan}");
            // This process's own number means nothing there (or another).
            assert_ne!(a.pid_in(me), Some(me), "scan {scan}");
            // Out: a process of A, one of B (below A), one of neither.
            assert_eq!(a.pid_out(chain.a1, Identity::Live), Some(1));
            assert_eq!(a.pid_out(chain.b1, Identity::Live), Some(2));
            assert_eq!(b.pid_out(chain.b1, Identity::Live), Some(1));
            assert_eq!(b.pid_out(chain.a1, Identity::Live), None);
            assert_eq!(a.pid_out(me, Identity::Live), None);
            assert!(a.sees(chain.b1) && !b.sees(chain.a1) && !a.sees(me));
            // Threads: a single-threaded process's only thread is itself.
            assert_eq!(a.tid_in(chain.b1, 2), Some(chain.b1));
            assert_eq!(a.tid_in(chain.b1, 1), None);
            assert_eq!(
                a.tid_out(chain.b1, Identity::Live, chain.b1, false),
                Some(2)
            );
        }

        // A process named by its start time: another start time is another
        // process; once gone, its number is remembered.
        let start = crate::procfs::start_time(chain.b1).unwrap();
        assert_eq!(a.pid_out(chain.b1, Identity::Started(start + 1)), None);
        assert_eq!(a.pid_out(chain.b1, Identity::Started(start)), Some(2));
        assert_eq!(a.pid_out(chain.b1, Identity::StartedBy(start - 1)), None);
        assert_eq!(a.pid_out(chain.b1, Identity::StartedBy(start)), Some(2));
        let dir = ProcDir::open(chain.b1).unwrap();
        let b1 = chain.b1;
        drop(chain);
        for _ in 0..500 {
            if !std::path::Path::new(&format!("/proc/{b1}")).exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // A directory held open reads nothing of a process that is gone.
        assert_eq!(dir.start_time(), None);
        assert_eq!(a.pid_out(b1, Identity::Started(start)), Some(2));
        assert_eq!(a.pid_out(b1, Identity::Live), None);
        assert_eq!(a.last_known(b1), Some(2));
    }

    #[test]
    fn the_kernel_translates_between_a_nested_namespace_and_this_one() {
        // NS_GET_PID_FROM_PIDNS (Linux 6.7) on this kernel: the facts the
        // scan stands in for (kernel-facts §12).
        let chain = Chain::start();
        let a = nested(chain.a1);
        assert_eq!(a.kernel_in(1), Ok(Some(chain.a1)));
        assert_eq!(a.kernel_in(2), Ok(Some(chain.b1)));
        assert_eq!(a.kernel_in(99), Ok(None));
    }
}
