//! Watchpoints and policies that outlive the daemon: each one set through
//! the API (leases excepted: they end with their stream) is saved in
//! `<state dir>/watchpoints.pb` (`SavedState`, `proto/wpd/v1/state.proto`),
//! with who set it, and set again in that caller's name when the daemon
//! starts:
//!
//! - a policy as it was (it covers the processes that match from then on);
//! - a watchpoint of one process only in the same boot, for the same pid
//!   and process start time (a reused pid is never watched in its place).
//!
//! Who set an entry is not taken from the file as such: its privileges,
//! capabilities and user namespace are not proof of anything after a
//! restart (a namespace's number is reused once it is gone, or after a
//! reboot). [`restore_caller`] decides what the entry is set again as:
//! privileged only for root (uid 0) of the initial user namespace, whose
//! number is fixed and never given to another namespace, with the daemon
//! itself in that namespace; anyone else as a plain caller of the saved
//! uid and gid, without capabilities (docs/security.md, "Saved state and
//! restarts").
//!
//! What cannot be set again is logged, listed (`ListWatchpoints.
//! not_restored`) and published as `WatchpointRemoved` with its saved id.
//! Entries leave the file when removed through the API or when the daemon
//! lets go of them (their process exited, a detach); a SIGTERM removes
//! everything from the targets but leaves the file as it is.
//!
//! The file is replaced whole: written to a temporary file, synced, renamed
//! over the old one, the directory synced. SetWatchpoint, SetPolicy and
//! RemoveWatchpoint answer only once their change is written
//! ([`Persist::commit`]); when the write fails (a full disk) the change is
//! undone (a new entry forgotten and its watchpoint or policy removed, a
//! removal not made) and the request answered `NOT_SAVED`. It is small (one entry per
//! watchpoint set by hand or policy).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use prost::Message;
use wpd_proto::v1 as pb;

use crate::authz::Caller;
use crate::model::Pid;

/// File name in the state directory.
pub const FILE: &str = "watchpoints.pb";

/// Largest saved state read back (a damaged or forged file is refused, not
/// read whole): 64 MiB, some 100,000 entries.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// The saved entries and what a restart could not set again.
#[derive(Debug)]
pub struct Persist {
    path: PathBuf,
    boot_id: String,
    /// By id (the id this run gave them).
    entries: Mutex<BTreeMap<u64, pb::SavedEntry>>,
    /// Changed since the last write.
    dirty: AtomicBool,
    /// Set at shutdown: the detaches that follow are not removals.
    frozen: AtomicBool,
    /// The last run's entries are being set again: the file keeps them
    /// until that is done (a crash meanwhile loses none).
    restoring: AtomicBool,
    /// What the last start could not set again, with the uid of who set it.
    not_restored: Mutex<Vec<(u32, pb::NotRestored)>>,
    /// Held from taking the entries to writing them: writes happen one
    /// at a time, in order, and a change undone after a failed write is
    /// never carried by another.
    writing: Mutex<()>,
}

/// A change a request is answered for only once it is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The entry just recorded: forgotten again if it cannot be written.
    Added(u64),
    /// The entry to remove: kept if the file without it cannot be written.
    Removed(u64),
}

/// This boot's id.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Largest id read back from the file: ids are given one by one from 1, so
/// a larger one is damage (and would overflow the next id).
pub const MAX_ID: u64 = 1 << 48;

/// The user namespace inode of the initial user namespace
/// (`PROC_USER_INIT_INO`): fixed by the kernel, the same in every boot and
/// never given to another namespace.
pub const INIT_USERNS: u64 = 0xEFFF_FFFD;

/// Whether `id`, read back, can be an id this daemon gave.
pub fn id_in_range(id: u64) -> bool {
    (1..=MAX_ID).contains(&id)
}

/// The ids a restarted daemon must not give again: up to the saved next
/// id, and every saved entry's (ids out of range ignored: damage).
pub fn last_used_id(saved: &pb::SavedState) -> u64 {
    let entries = saved
        .entries
        .iter()
        .map(|e| e.id)
        .filter(|&id| id_in_range(id))
        .max()
        .unwrap_or(0);
    let next = match saved.next_id {
        n if n <= MAX_ID + 1 => n.saturating_sub(1),
        n => {
            tracing::warn!(next_id = n, "saved state: next id out of range; ignored");
            0
        }
    };
    entries.max(next)
}

/// The saved caller of `c`.
pub fn saved_caller(c: &Caller) -> pb::SavedCaller {
    pb::SavedCaller {
        uid: c.uid,
        gid: c.gid,
        cap_prm: c.cap_prm,
        cap_eff: c.cap_eff,
        userns: c.userns.unwrap_or(0),
        privileged: c.privileged,
        pid_namespace_level: c.pidns.nested().map_or(0, |n| n.level() as u32),
    }
}

/// What the daemon knows of itself that decides how far a saved caller is
/// trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreContext {
    /// The daemon's effective uid (only it can have written the file: the
    /// state directory is its own and writable by nobody else).
    pub euid: u32,
    /// The daemon's user namespace inode.
    pub userns: Option<u64>,
}

impl RestoreContext {
    /// This daemon's.
    pub fn current() -> Self {
        RestoreContext {
            euid: nix::unistd::geteuid().as_raw(),
            userns: crate::procfs::userns_of(std::process::id() as Pid),
        }
    }
}

/// The caller a saved entry is set again as. The file's `privileged`,
/// capabilities and namespace are claims, not proof:
///
/// - privileged: only a caller saved privileged as uid 0 of the initial
///   user namespace ([`INIT_USERNS`], a number no other namespace gets, in
///   this boot or another), by a daemon running as root in that namespace
///   (so only root could have written the claim);
/// - anyone else: a plain caller of the saved uid and gid, with no
///   capability and no namespace: it may act on the processes that uid
///   could trace without privilege, nothing more. A namespace that is gone,
///   or whose number now names another, grants nothing.
pub fn restore_caller(c: &pb::SavedCaller, ctx: RestoreContext) -> Caller {
    if c.privileged
        && c.uid == 0
        && c.userns == INIT_USERNS
        && ctx.euid == 0
        && ctx.userns == Some(INIT_USERNS)
    {
        return Caller {
            uid: 0,
            gid: c.gid,
            pid: None,
            cap_prm: u64::MAX,
            cap_eff: u64::MAX,
            userns: Some(INIT_USERNS),
            privileged: true,
            pidns: crate::pidns::CallerNs::Same,
        };
    }
    let mut caller = Caller::unprivileged(c.uid, c.gid, None);
    // A caller of the daemon's own user namespace (the namespace is alive:
    // the daemon runs in it, so its inode names no other) is judged in it
    // again; another namespace, which may be gone and its number reused,
    // is known to hold nothing.
    if ctx.userns == Some(c.userns) {
        caller.userns = Some(c.userns);
    }
    caller
}

impl Persist {
    /// Opens `dir/watchpoints.pb`: the handle, and what the last run saved
    /// (None if nothing). A file that does not decode is kept aside
    /// (`.damaged`) and reported, never half-restored.
    pub fn open(dir: &Path) -> io::Result<(Persist, Option<pb::SavedState>)> {
        let path = dir.join(FILE);
        let saved = match crate::statedir::read(&path, MAX_FILE_BYTES) {
            Ok(Some(bytes)) => match pb::SavedState::decode(bytes.as_slice()) {
                Ok(s) => Some(s),
                Err(e) => {
                    let aside = dir.join(format!("{FILE}.damaged"));
                    tracing::error!(
                        file = %path.display(),
                        kept_as = %aside.display(),
                        error = %e,
                        "saved watchpoints do not decode; none is set again"
                    );
                    std::fs::rename(&path, &aside)?;
                    None
                }
            },
            Ok(None) => None,
            Err(e) => return Err(e),
        };
        Ok((
            Persist {
                path,
                boot_id: boot_id(),
                entries: Mutex::new(BTreeMap::new()),
                dirty: AtomicBool::new(false),
                frozen: AtomicBool::new(false),
                restoring: AtomicBool::new(saved.is_some()),
                not_restored: Mutex::new(Vec::new()),
                writing: Mutex::new(()),
            },
            saved,
        ))
    }

    /// Whether `saved` was written in this boot.
    pub fn same_boot(&self, saved: &pb::SavedState) -> bool {
        !self.boot_id.is_empty() && saved.boot_id == self.boot_id
    }

    /// Records watchpoint `id`, set by `caller` with `spec` on `pid`.
    pub fn record_watchpoint(&self, id: u64, caller: &Caller, spec: pb::WatchpointSpec, pid: Pid) {
        let entry = pb::SavedEntry {
            id,
            caller: Some(saved_caller(caller)),
            set_at_ns: crate::clock::realtime_ns(),
            what: Some(pb::saved_entry::What::Watchpoint(pb::SavedWatchpoint {
                spec: Some(spec),
                start_time: crate::procfs::start_time(pid).unwrap_or(0),
            })),
        };
        self.entries.lock().unwrap().insert(id, entry);
        self.dirty.store(true, Ordering::Release);
    }

    /// Records policy `id`.
    pub fn record_policy(
        &self,
        id: u64,
        caller: &Caller,
        selector: pb::ProcessSelector,
        spec: pb::WatchpointSpec,
    ) {
        let entry = pb::SavedEntry {
            id,
            caller: Some(saved_caller(caller)),
            set_at_ns: crate::clock::realtime_ns(),
            what: Some(pb::saved_entry::What::Policy(pb::SavedPolicy {
                selector: Some(selector),
                spec: Some(spec),
            })),
        };
        self.entries.lock().unwrap().insert(id, entry);
        self.dirty.store(true, Ordering::Release);
    }

    /// Forgets `id` (removed through the API).
    pub fn forget(&self, id: u64) {
        if self.entries.lock().unwrap().remove(&id).is_some() {
            self.dirty.store(true, Ordering::Release);
        }
    }

    /// Notes an entry of the last run, set by `uid`, that was not set
    /// again.
    pub fn not_restored(&self, uid: u32, n: pb::NotRestored) {
        self.not_restored.lock().unwrap().push((uid, n));
    }

    /// What a restart could not set again (of `uid` only, when given).
    pub fn not_restored_list(&self, uid: Option<u32>) -> Vec<pb::NotRestored> {
        self.not_restored
            .lock()
            .unwrap()
            .iter()
            .filter(|(u, _)| uid.is_none_or(|x| x == *u))
            .map(|(_, n)| n.clone())
            .collect()
    }

    /// From now on nothing is pruned or written (shutdown: the detaches
    /// that follow are not removals).
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::Release);
    }

    /// The last run's entries were all set again or given up on: the file
    /// may be written from now on.
    pub fn restored(&self) {
        self.restoring.store(false, Ordering::Release);
        self.dirty.store(true, Ordering::Release);
    }

    /// Drops entries whose watchpoint or policy no longer exists
    /// (`exists`), then writes the file if anything changed. Blocking.
    pub fn sync(&self, exists: impl Fn(u64) -> bool, next_id: u64) -> io::Result<bool> {
        let _writing = self.writing.lock().unwrap();
        self.sync_locked(exists, next_id)
    }

    /// Writes `change` now (with whatever else changed): on a failure it
    /// is undone in the saved entries (an added entry forgotten, a removed
    /// one kept) before any other write can carry it, and the error
    /// returned. While writing is off (shutdown, the last run's entries
    /// being set again) nothing is written and the change stays.
    /// Blocking.
    pub fn commit(
        &self,
        change: Change,
        exists: impl Fn(u64) -> bool,
        next_id: u64,
    ) -> io::Result<()> {
        let _writing = self.writing.lock().unwrap();
        let removed = match change {
            Change::Removed(id) => {
                let e = self.entries.lock().unwrap().remove(&id);
                if e.is_some() {
                    self.dirty.store(true, Ordering::Release);
                }
                e
            }
            Change::Added(_) => None,
        };
        if matches!(change, Change::Removed(_)) && removed.is_none() {
            // Never saved (a lease's): nothing to write for it.
            return Ok(());
        }
        let r = self.sync_locked(exists, next_id);
        if r.is_err() {
            let mut entries = self.entries.lock().unwrap();
            match change {
                Change::Added(id) => {
                    entries.remove(&id);
                }
                Change::Removed(id) => {
                    if let Some(e) = removed {
                        entries.insert(id, e);
                    }
                }
            }
        }
        r.map(|_| ())
    }

    fn sync_locked(&self, exists: impl Fn(u64) -> bool, next_id: u64) -> io::Result<bool> {
        if self.frozen.load(Ordering::Acquire) || self.restoring.load(Ordering::Acquire) {
            return Ok(false);
        }
        let state = {
            let mut entries = self.entries.lock().unwrap();
            let before = entries.len();
            entries.retain(|&id, _| exists(id));
            if entries.len() != before {
                self.dirty.store(true, Ordering::Release);
            }
            if !self.dirty.swap(false, Ordering::AcqRel) {
                return Ok(false);
            }
            pb::SavedState {
                boot_id: self.boot_id.clone(),
                entries: entries.values().cloned().collect(),
                written_at_ns: crate::clock::realtime_ns(),
                next_id,
            }
        };
        if let Err(e) = self.write(&state) {
            self.dirty.store(true, Ordering::Release);
            return Err(e);
        }
        Ok(true)
    }

    fn write(&self, state: &pb::SavedState) -> io::Result<()> {
        crate::statedir::replace(&self.path, &state.encode_to_vec())
    }

    /// Entries saved now (tests, listings).
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }

    /// No entry saved.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "wpd-persist-{}-{}",
            std::process::id(),
            crate::clock::monotonic_ns()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn spec(pid: i32) -> pb::WatchpointSpec {
        pb::WatchpointSpec {
            pid,
            symbol: "counter".into(),
            ..Default::default()
        }
    }

    #[test]
    fn entries_survive_a_reopen_and_leave_when_gone() {
        let d = dir();
        let me = std::process::id() as i32;
        let (p, saved) = Persist::open(&d).unwrap();
        assert!(saved.is_none());
        let caller = Caller::privileged();
        p.record_watchpoint(3, &caller, spec(me), me);
        p.record_policy(
            4,
            &caller,
            pb::ProcessSelector {
                comm: "fuzzer".into(),
                ..Default::default()
            },
            spec(0),
        );
        p.record_watchpoint(5, &caller, spec(me), me);
        assert!(p.sync(|_| true, 10).unwrap(), "written");
        assert!(!p.sync(|_| true, 10).unwrap(), "nothing changed");
        // 5 went away (its process exited), 3 was removed by hand.
        p.forget(3);
        assert!(p.sync(|id| id != 5, 10).unwrap());
        p.record_watchpoint(6, &caller, spec(me), me);
        p.freeze();
        assert!(!p.sync(|_| false, 10).unwrap(), "frozen: nothing pruned");

        let (q, saved) = Persist::open(&d).unwrap();
        let saved = saved.unwrap();
        assert!(q.same_boot(&saved));
        let ids: Vec<u64> = saved.entries.iter().map(|e| e.id).collect();
        assert_eq!(ids, vec![4]);
        assert!(matches!(
            saved.entries[0].what,
            Some(pb::saved_entry::What::Policy(_))
        ));
        assert!(saved.entries[0].caller.as_ref().unwrap().privileged);
        assert_eq!(saved.next_id, 10);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_change_that_cannot_be_written_is_undone() {
        let d = dir();
        let me = std::process::id() as i32;
        let (p, _) = Persist::open(&d).unwrap();
        let caller = Caller::privileged();
        p.record_watchpoint(1, &caller, spec(me), me);
        p.commit(Change::Added(1), |_| true, 10).unwrap();
        // Writing fails from now on (the temporary file's name is taken by
        // a directory), as on a full disk.
        let tmp = d.join(format!("{FILE}.tmp"));
        std::fs::create_dir(&tmp).unwrap();
        p.record_watchpoint(2, &caller, spec(me), me);
        assert!(p.commit(Change::Added(2), |_| true, 10).is_err());
        assert_eq!(p.len(), 1, "the new entry is forgotten again");
        assert!(p.commit(Change::Removed(1), |_| true, 10).is_err());
        assert_eq!(p.len(), 1, "the removal is not made");
        // A removal of something never saved writes nothing: it succeeds.
        p.commit(Change::Removed(99), |_| true, 10).unwrap();
        let (_, saved) = Persist::open(&d).unwrap();
        let ids: Vec<u64> = saved.unwrap().entries.iter().map(|e| e.id).collect();
        assert_eq!(ids, vec![1], "the file as before the failures");
        // Room again: the removal goes through.
        std::fs::remove_dir(&tmp).unwrap();
        p.commit(Change::Removed(1), |_| true, 10).unwrap();
        assert!(p.is_empty());
        let (_, saved) = Persist::open(&d).unwrap();
        assert!(saved.unwrap().entries.is_empty());
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn saved_rights_are_claims_only_root_of_the_initial_namespace_keeps() {
        let root_daemon = RestoreContext {
            euid: 0,
            userns: Some(INIT_USERNS),
        };
        let root = pb::SavedCaller {
            uid: 0,
            gid: 0,
            cap_prm: u64::MAX,
            cap_eff: u64::MAX,
            userns: INIT_USERNS,
            privileged: true,
            pid_namespace_level: 0,
        };
        let c = restore_caller(&root, root_daemon);
        assert!(c.privileged && c.uid == 0 && c.cap_eff == u64::MAX, "{c:?}");
        // A plain caller: judged in the daemon's namespace when it was saved
        // in it, else in none.
        let plain = |c: Caller, uid: u32, saved: &pb::SavedCaller, ctx: RestoreContext| {
            let mut want = Caller::unprivileged(uid, uid, None);
            want.userns = (ctx.userns == Some(saved.userns)).then_some(saved.userns);
            c == want && c.cap_eff == 0
        };
        // Forged privilege for another uid; root of another namespace
        // (gone, or alive: the number proves nothing); privilege not
        // claimed; a daemon that is not root, or not in the initial
        // namespace: a plain caller of the saved uid.
        for (caller, ctx, uid) in [
            (
                pb::SavedCaller {
                    uid: 4242,
                    gid: 4242,
                    ..root
                },
                root_daemon,
                4242,
            ),
            (
                pb::SavedCaller {
                    userns: 4026532999,
                    ..root
                },
                root_daemon,
                0,
            ),
            (pb::SavedCaller { userns: 0, ..root }, root_daemon, 0),
            (
                pb::SavedCaller {
                    privileged: false,
                    ..root
                },
                root_daemon,
                0,
            ),
            (
                root,
                RestoreContext {
                    euid: 1000,
                    userns: Some(INIT_USERNS),
                },
                0,
            ),
            (
                root,
                RestoreContext {
                    euid: 0,
                    userns: Some(4026532999),
                },
                0,
            ),
        ] {
            let got = restore_caller(&caller, ctx);
            assert!(
                plain(got.clone(), uid, &caller, ctx),
                "{caller:?} in {ctx:?} -> {got:?}"
            );
        }
        // Ids out of range never count, nor overflow the next id.
        let saved = pb::SavedState {
            entries: vec![
                pb::SavedEntry {
                    id: u64::MAX,
                    ..Default::default()
                },
                pb::SavedEntry {
                    id: 7,
                    ..Default::default()
                },
            ],
            next_id: u64::MAX,
            ..Default::default()
        };
        assert_eq!(last_used_id(&saved), 7);
        assert!(!id_in_range(0) && !id_in_range(MAX_ID + 1) && id_in_range(1));
    }

    #[test]
    fn a_damaged_file_is_kept_aside_and_restores_nothing() {
        let d = dir();
        std::fs::write(d.join(FILE), b"\xff\xff\xff not a SavedState").unwrap();
        let (_, saved) = Persist::open(&d).unwrap();
        assert!(saved.is_none());
        assert!(d.join(format!("{FILE}.damaged")).exists());
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_watchpoint_remembers_its_process_start_time() {
        let d = dir();
        let me = std::process::id() as i32;
        let (p, _) = Persist::open(&d).unwrap();
        p.record_watchpoint(1, &Caller::privileged(), spec(me), me);
        p.sync(|_| true, 10).unwrap();
        let (_, saved) = Persist::open(&d).unwrap();
        let Some(pb::saved_entry::What::Watchpoint(w)) = &saved.unwrap().entries[0].what else {
            panic!("not a watchpoint")
        };
        assert_eq!(Some(w.start_time), crate::procfs::start_time(me));
        assert!(w.start_time > 0);
        std::fs::remove_dir_all(d).unwrap();
    }
}
