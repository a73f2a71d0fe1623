//! Policies cover their new processes from the first instruction: the
//! programs they match are marked for the exec hold
//! (`backend/exechold.rs`, kernel-facts §23), and at a held exec every
//! policy is tried at once, the process stopped before its first
//! instruction until it is armed (at most [`HOLD_BOUND`]; then it runs
//! on, armed when the arming ends). Execs of files not marked pay nothing
//! (an inode mark, §23.4).
//!
//! Which files are marked:
//! - a policy by executable (`--exe`): its program, from the policy's
//!   creation;
//! - a policy by command name or cgroup (`--comm`, `--cgroup`): every
//!   program one of its processes was found running (learnt when the
//!   process is armed after its exec), and for a command name the files
//!   of that name on the daemon's `PATH`. A program's first process not
//!   found on `PATH` is armed a few milliseconds after its exec; every
//!   later run of it is held. Marking every exec of the machine instead
//!   (a filesystem mark) would cost every program on the host ~100 µs
//!   per exec (§23.4): a policy's non-matching processes pay nothing
//!   here. A held process that matches no policy after all (a program
//!   run under another name, or from another cgroup) is let go at once.
//!
//! An unprivileged caller's policy holds only files that caller owns: a
//! hold delays every process that runs the file, whoever runs it.
//!
//! Where the hold cannot be had (fanotify refused: no `CAP_SYS_ADMIN`),
//! or for a backend that cannot arm a process another tracer holds
//! (`Features::arms_while_traced`: the ptrace backend's tracer could not
//! attach it), processes are found as before: by the kernel's records and
//! the `/proc` scan, a few milliseconds after their exec. The backends'
//! capabilities say which (`new_processes`).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::Core;
use super::policy::{FoundBy, Policy};
use crate::backend::exechold::ExecHold;
use crate::model::{Pid, WatchId};

/// Longest a process is held at its exec for its arming.
pub const HOLD_BOUND: Duration = Duration::from_secs(1);

/// A file's identity: device and inode.
type FileId = (u64, u64);

/// A marked file, open (its mark is on this inode whatever is at its
/// path later), and how many policies want it.
struct Marked {
    file: File,
    path: PathBuf,
    users: usize,
}

/// The exec hold of the policies, the files it marks, and which each
/// policy asked for.
#[derive(Default)]
pub(super) struct PolicyHold {
    hold: Option<ExecHold>,
    marks: HashMap<FileId, Marked>,
    by_policy: HashMap<WatchId, HashSet<FileId>>,
    /// Where a command's programs are looked for.
    search_path: Vec<PathBuf>,
}

impl PolicyHold {
    /// No hold yet; programs of a command looked for in `search_path`.
    pub(super) fn searching(search_path: Vec<PathBuf>) -> PolicyHold {
        PolicyHold {
            search_path,
            ..Default::default()
        }
    }

    /// Marks the file at `path` for `policy` (once per policy); its
    /// identity, or None when it cannot be (no such file, refused).
    /// `owner`: the file must be this user's (an unprivileged caller's
    /// policy holds the execs of its own programs only: a hold delays every
    /// process that runs the file).
    fn add(&mut self, policy: WatchId, path: &Path, owner: Option<u32>) -> Option<FileId> {
        let hold = self.hold.as_ref()?;
        let file = File::open(path).ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() || owner.is_some_and(|uid| meta.uid() != uid) {
            return None;
        }
        let id = (meta.dev(), meta.ino());
        let mine = self.by_policy.entry(policy).or_default();
        if mine.contains(&id) {
            return Some(id);
        }
        match self.marks.get_mut(&id) {
            Some(m) => m.users += 1,
            None => {
                if let Err(e) = hold.mark_file(file.as_fd()) {
                    tracing::info!(path = ?path, "its execs are not held: {e}");
                    return None;
                }
                self.marks.insert(
                    id,
                    Marked {
                        file,
                        path: path.to_path_buf(),
                        users: 1,
                    },
                );
            }
        }
        mine.insert(id);
        tracing::debug!(policy = policy.0, path = ?path, "its execs are held");
        Some(id)
    }

    /// Drops every mark `policy` asked for; the hold goes with the last
    /// mark (its group closed: nothing of it is left in the kernel).
    /// Returns the files no longer marked.
    fn remove(&mut self, policy: WatchId) -> Vec<FileId> {
        let mut gone = Vec::new();
        for id in self.by_policy.remove(&policy).unwrap_or_default() {
            let Some(m) = self.marks.get_mut(&id) else {
                continue;
            };
            m.users -= 1;
            if m.users == 0
                && let Some(m) = self.marks.remove(&id)
            {
                gone.push(id);
                if let Some(hold) = self.hold.as_ref()
                    && let Err(e) = hold.unmark_file(m.file.as_fd())
                {
                    tracing::debug!(path = ?m.path, "unmarking: {e}");
                }
            }
        }
        if self.marks.is_empty() {
            self.hold = None;
        }
        gone
    }
}

impl Core {
    /// Whether `policy`'s new processes can be held at exec: its backend
    /// arms a process another tracer holds, and its selector names
    /// programs, command names or cgroups.
    fn holds_for(&self, policy: &Policy) -> bool {
        let s = &policy.selector;
        (s.exe.is_some() || s.comm.is_some() || s.cgroup.is_some())
            && self
                .backends
                .get(policy.spec.backend)
                .is_ok_and(|b| b.features().arms_while_traced)
    }

    /// Starts the hold if it is not running; false when it cannot be had.
    fn start_hold(self: &Arc<Self>, h: &mut PolicyHold) -> bool {
        if h.hold.is_some() {
            return true;
        }
        let core = Arc::downgrade(self);
        let at_exec = move |pid| {
            if let Some(core) = core.upgrade() {
                let now = crate::clock::monotonic_ns();
                core.check_all_policies(pid, now, FoundBy::ExecHold);
            }
        };
        match ExecHold::start(HOLD_BOUND, Arc::new(at_exec)) {
            Ok(hold) => {
                h.hold = Some(hold);
                true
            }
            Err(e) => {
                tracing::info!("new processes are found after their exec: {e}");
                false
            }
        }
    }

    /// `policy` is new: the programs it names are held from now on.
    pub(super) fn hold_execs_of(self: &Arc<Self>, policy: &Policy) {
        if !self.holds_for(policy) {
            return;
        }
        let mut h = self.exec_hold.lock().unwrap();
        if !self.start_hold(&mut h) {
            return;
        }
        let s = &policy.selector;
        let files: Vec<PathBuf> = match (&s.exe, &s.comm) {
            (Some(exe), _) => vec![exe.clone()],
            (None, Some(comm)) => on_path(&h.search_path, comm),
            (None, None) => Vec::new(),
        };
        let owner = owner_for(policy);
        for f in files {
            if let Some(id) = h.add(policy.id, &f, owner) {
                self.pin_module(id);
            }
        }
        if h.marks.is_empty() {
            h.hold = None;
        }
    }

    /// `policy` armed `pid`, found after its exec: the program it runs is
    /// held from now on, so that its later runs are covered from their
    /// first instruction (a policy by command name or cgroup).
    pub(super) fn learn_exec(self: &Arc<Self>, policy: &Policy, pid: Pid, found: FoundBy) {
        if found == FoundBy::ExecHold || policy.selector.exe.is_some() || !self.holds_for(policy) {
            return;
        }
        let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
            return;
        };
        let mut h = self.exec_hold.lock().unwrap();
        if !self.policies.contains_key(&policy.id) || !self.start_hold(&mut h) {
            return; // removed meanwhile
        }
        // Through the process's own link: the file it runs, even when its
        // path was replaced or removed since.
        let link = PathBuf::from(format!("/proc/{pid}/exe"));
        let same = File::open(&exe)
            .and_then(|f| f.metadata())
            .ok()
            .zip(std::fs::metadata(&link).ok())
            .is_some_and(|(a, b)| (a.dev(), a.ino()) == (b.dev(), b.ino()));
        h.add(
            policy.id,
            if same { &exe } else { &link },
            owner_for(policy),
        );
        if h.marks.is_empty() {
            h.hold = None;
        }
    }

    /// `policy` is removed: the files it asked for are held no more,
    /// unless another policy wants them.
    pub(super) fn release_execs_of(&self, policy: &Policy) {
        let gone = self.exec_hold.lock().unwrap().remove(policy.id);
        for (dev, ino) in gone {
            self.symbols
                .files
                .unpin(&crate::symbols::FileKey::of_stat(dev, ino));
        }
    }

    /// The module file of a program held at its exec stays loaded between
    /// its processes.
    fn pin_module(&self, (dev, ino): FileId) {
        self.symbols
            .files
            .pin(crate::symbols::FileKey::of_stat(dev, ino));
    }

    /// Whether `pid` is held at its exec now: the hold arms it, no other
    /// path need try (an arming from the kernel's exec record, read while
    /// the exec is still under way, would contend with the exec and with
    /// the hold's own).
    pub(super) fn exec_held(&self, pid: Pid) -> bool {
        self.exec_hold
            .lock()
            .unwrap()
            .hold
            .as_ref()
            .is_some_and(|h| h.holds(pid))
    }

    /// Files held now, execs held so far, and those let go before their
    /// arming ended.
    pub fn exec_holds(&self) -> (usize, u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let h = self.exec_hold.lock().unwrap();
        h.hold.as_ref().map_or((0, 0, 0), |x| {
            (
                h.marks.len(),
                x.counts().held.load(Relaxed),
                x.counts().past_bound.load(Relaxed),
            )
        })
    }
}

/// Whose files `policy` may hold: any (a privileged caller), or its
/// caller's own.
fn owner_for(policy: &Policy) -> Option<u32> {
    (!policy.caller.privileged).then_some(policy.caller.uid)
}

/// The files a command named `comm` would run from `dirs` (its name, or a
/// longer one the kernel cuts to it).
fn on_path(dirs: &[PathBuf], comm: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in dirs {
        let exact = dir.join(comm);
        if exact.is_file() {
            out.push(exact);
        }
        if comm.len() == 15
            && let Ok(rd) = std::fs::read_dir(dir)
        {
            for e in rd.flatten() {
                let name = e.file_name();
                let name = name.to_string_lossy();
                if name.len() > 15 && name.starts_with(comm) && e.path().is_file() {
                    out.push(e.path());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command's programs: its name in each directory, or, for a name the
    /// kernel cut to 15 bytes, every longer name it starts.
    #[test]
    fn a_commands_programs_are_found_by_name_and_by_the_cut_name() {
        let base = std::env::temp_dir().join(format!("wpd-on-path-{}", std::process::id()));
        let (a, b) = (base.join("a"), base.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        for f in [
            a.join("quick"),
            b.join("quick"),
            b.join("a-very-long-program"),
        ] {
            std::fs::write(&f, b"").unwrap();
        }
        std::fs::create_dir(b.join("quick-dir")).unwrap();
        let dirs = [a.clone(), b.clone(), base.join("missing")];
        assert_eq!(
            on_path(&dirs, "quick"),
            vec![a.join("quick"), b.join("quick")]
        );
        assert_eq!(
            on_path(&dirs, "a-very-long-pro"),
            vec![b.join("a-very-long-program")]
        );
        assert!(
            on_path(&dirs, "a-very").is_empty(),
            "a name is not a prefix"
        );
        let _ = std::fs::remove_dir_all(&base);
    }
}
