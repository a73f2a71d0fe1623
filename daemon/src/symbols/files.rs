//! The module files the symbol layer holds loaded: one [`ElfFile`] per file
//! (device and inode), shared by every process mapping it, let go of when
//! the last of those processes is, or when least recently used beyond
//! [`MAX_FILES`].
//!
//! The cache's mutex is held only to look up, insert and drop entries:
//! loading a file and asking `/proc` which processes still live happen
//! outside it.
//!
//! A file is loaded on a thread of its own (`wpd-load`), once however many
//! ask for it at once; whoever asks waits for it until a deadline counted
//! from the start of the load ([`REQUEST_WAIT`] for a request,
//! [`EVENT_WAIT`] for the hit symbolizer), and past it is told that the
//! module is still loading ([`LoadError::Loading`]), while the load goes
//! on. So a file whose reads stall (a FUSE or NFS server that does not
//! answer) holds one loader thread, never a request's thread or the
//! symbolizer's for longer than the deadline; and a process's owner has at
//! most [`LOADS_PER_OWNER`] loads in flight ([`LOADS_IN_FLIGHT`] in all):
//! more are refused ([`LoadError::Busy`]) until some end.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::elf::{self, ElfFile};
use super::maps::MappedFile;
use crate::model::Pid;

/// How long a request waits for a module file to load, from the start of
/// its load: a local file of any size loads well within it (mapping, the
/// symbol tables, a debug file's CRC); a file on a server that does not
/// answer is reported as still loading, and a request asking again after
/// the load finished finds it loaded.
pub const REQUEST_WAIT: Duration = Duration::from_secs(5);

/// How long the hit symbolizer waits for a module file to load, from the
/// start of its load: the hits of a module not loaded by then go out with
/// their module's path only (not kept), and later hits get their places
/// once it is loaded.
pub const EVENT_WAIT: Duration = Duration::from_secs(1);

/// Loads in flight for the processes of one owner (real uid).
pub const LOADS_PER_OWNER: usize = 4;

/// Loads in flight in all (each on a thread of its own).
pub const LOADS_IN_FLIGHT: usize = 64;

/// Why a module file is not there to read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// It cannot be read (refused, not an ELF file, gone).
    #[error(transparent)]
    Unreadable(#[from] elf::ElfError),
    /// Its load has not finished within the wait.
    #[error("module {module} is still loading (for {} ms): its file is slow to open or read", since.as_millis())]
    Loading {
        /// The module's path in the process.
        module: String,
        /// Since when it has been loading.
        since: Duration,
    },
    /// Its owner's processes have too many loads in flight (or the daemon
    /// has).
    #[error(
        "module {module} was not loaded: {in_flight} module files of processes of uid {uid} are          loading already (at most {max} at once)"
    )]
    Busy {
        /// The module's path in the process.
        module: String,
        /// The processes' owner.
        uid: u32,
        /// Loads in flight, for that owner (or in all).
        in_flight: usize,
        /// The bound reached.
        max: usize,
    },
}

/// Identity of a mapped file: device and inode (paths differ between mount
/// namespaces and files are replaced under their names).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    /// Device (`fd:01`).
    pub dev: String,
    /// Inode.
    pub inode: u64,
}

impl FileKey {
    /// The identity of a file of device `dev` (`st_dev`) and inode `ino`,
    /// as `/proc/PID/maps` writes it (`fd:01`).
    pub fn of_stat(dev: u64, ino: u64) -> FileKey {
        FileKey {
            dev: format!("{:02x}:{:02x}", libc::major(dev), libc::minor(dev)),
            inode: ino,
        }
    }

    /// The identity of `f`.
    pub fn of(f: &MappedFile) -> FileKey {
        FileKey {
            dev: f.dev.clone(),
            inode: f.inode,
        }
    }
}

/// Files kept loaded (least recently used ones go beyond this).
pub const MAX_FILES: usize = 512;

/// Module files loaded once per file.
pub struct Files(
    Arc<Mutex<FileCache>>,
    Arc<[std::path::PathBuf]>,
    Arc<Loads<Arc<ElfFile>>>,
);

impl Default for Files {
    fn default() -> Self {
        Files::with_debug_dirs(super::elf::default_debug_dirs())
    }
}

#[derive(Default)]
struct FileCache {
    by_key: HashMap<FileKey, FileEntry>,
    tick: u64,
    /// Files kept idle when no process uses them.
    pinned: HashSet<FileKey>,
    /// When (`tick`) each process was last let go of: a load that started
    /// before for it (a hit's, which waits for nothing) keeps no file for it
    /// when it ends, or the fd would stay while the process lives on
    /// unwatched. At most [`FORGOTTEN_MAX`], the oldest dropped first.
    forgotten: HashMap<Pid, u64>,
}

/// Processes let go of remembered at most (for the loads in flight).
const FORGOTTEN_MAX: usize = 4096;

/// A loaded file, when it was last used, and the processes it was loaded
/// for. When the last of them is let go of, it goes, unless it is pinned
/// (a program a policy holds at its exec, `engine/policy_hold.rs`): then
/// it is kept idle a while for the program's next process ([`IDLE_KEEP`],
/// at most [`IDLE_MAX`] idle files): a farm's short processes, one after
/// another, each find it loaded (a load is a few hundred µs, the whole of
/// a policy's arming at an exec otherwise). Other files go with their last
/// process: nothing of a process outlives it (an idle file holds an fd).
struct FileEntry {
    elf: Arc<ElfFile>,
    used: u64,
    pids: HashSet<Pid>,
    /// Since when no process uses it.
    idle_since: Option<Instant>,
}

/// How long a file no process uses is kept.
pub const IDLE_KEEP: Duration = Duration::from_secs(60);

/// Idle files kept at most (the least recently used go first).
pub const IDLE_MAX: usize = 16;

impl Files {
    /// A cache whose files look for separate debug files in `debug_dirs`
    /// (`wpd --debug-dir`).
    pub fn with_debug_dirs(debug_dirs: Vec<std::path::PathBuf>) -> Self {
        Files(Arc::default(), debug_dirs.into(), Arc::default())
    }

    /// `pid` is let go of: the files no remaining process was loaded for
    /// are dropped (processes that are gone, never detached because never
    /// attached, e.g. after a ResolveSymbol only, count as let go of too).
    pub fn forget(&self, pid: Pid) {
        self.forget_with(pid, |p| Path::new(&format!("/proc/{p}")).exists());
    }

    /// [`Files::forget`], asking `alive` whether a process still lives:
    /// outside the cache's lock (a `/proc` lookup each), so that symbolizing
    /// and resolving never wait behind it.
    fn forget_with(&self, pid: Pid, alive: impl Fn(Pid) -> bool) {
        self.forget_at(pid, alive, Instant::now());
    }

    /// [`Files::forget_with`] at time `now`.
    fn forget_at(&self, pid: Pid, alive: impl Fn(Pid) -> bool, now: Instant) {
        let others: HashSet<Pid> = {
            let c = self.0.lock().unwrap();
            c.by_key
                .values()
                .flat_map(|e| e.pids.iter().copied())
                .filter(|&p| p != pid)
                .collect()
        };
        let gone: HashSet<Pid> = others.into_iter().filter(|&p| !alive(p)).collect();
        let mut c = self.0.lock().unwrap();
        c.tick += 1;
        let tick = c.tick;
        if c.forgotten.len() >= FORGOTTEN_MAX {
            let mut ticks: Vec<u64> = c.forgotten.values().copied().collect();
            let (_, &mut median, _) = ticks.select_nth_unstable(FORGOTTEN_MAX / 2);
            c.forgotten.retain(|_, t| *t > median);
        }
        c.forgotten.insert(pid, tick);
        let FileCache { by_key, pinned, .. } = &mut *c;
        by_key.retain(|k, e| {
            e.pids.retain(|p| *p != pid && !gone.contains(p));
            if !e.pids.is_empty() {
                return true;
            }
            let since = *e.idle_since.get_or_insert(now);
            pinned.contains(k) && now.saturating_duration_since(since) < IDLE_KEEP
        });
        let mut idle: Vec<(u64, FileKey)> = c
            .by_key
            .iter()
            .filter(|(_, e)| e.pids.is_empty())
            .map(|(k, e)| (e.used, k.clone()))
            .collect();
        if idle.len() > IDLE_MAX {
            idle.sort_unstable_by_key(|(used, _)| *used);
            for (_, k) in &idle[..idle.len() - IDLE_MAX] {
                c.by_key.remove(k);
            }
        }
    }

    /// Keeps the file of `key` loaded while no process uses it (a program
    /// held at its exec: its next process finds it loaded).
    pub fn pin(&self, key: FileKey) {
        self.0.lock().unwrap().pinned.insert(key);
    }

    /// [`Files::pin`] no more: the file goes now if no process uses it.
    pub fn unpin(&self, key: &FileKey) {
        let mut c = self.0.lock().unwrap();
        c.pinned.remove(key);
        if c.by_key.get(key).is_some_and(|e| e.pids.is_empty()) {
            c.by_key.remove(key);
        }
    }

    /// The ELF file of a module `pid` maps, loaded once per file, waiting
    /// for its load at most [`REQUEST_WAIT`] from its start.
    pub fn file(&self, pid: Pid, f: &MappedFile) -> Result<Arc<ElfFile>, LoadError> {
        self.file_within(pid, f, REQUEST_WAIT)
    }

    /// [`Files::file`], waiting for the load at most `wait` from its start.
    pub fn file_within(
        &self,
        pid: Pid,
        f: &MappedFile,
        wait: Duration,
    ) -> Result<Arc<ElfFile>, LoadError> {
        let key = FileKey::of(f);
        if let Some(e) = self.cached(&key, pid) {
            return Ok(e);
        }
        // A process let go of after this is kept no file by this request.
        let start = self.0.lock().unwrap().tick;
        let (debug_dirs, cache, k) = (self.1.clone(), self.0.clone(), key.clone());
        let g = f.clone();
        // Kept by the loader thread itself: a load that outlives every
        // waiter is not lost.
        let load = move || -> Result<Arc<ElfFile>, elf::ElfError> {
            let (opened, open_path) = g.open(pid)?;
            let (dir, ns_dir) = g.dir_path(pid);
            let at = elf::Place {
                dir: Some(&dir),
                ns_dir: &ns_dir,
            };
            let e = ElfFile::from_opened(opened, &open_path, Path::new(&g.path), &at, &debug_dirs)?;
            Ok(insert(&cache, k, Arc::new(e), pid, start))
        };
        let loaded = self.2.get(&key, &f.path, || owner_of(pid), wait, load)?;
        Ok(insert(&self.0, key, loaded, pid, start))
    }

    /// The file of `key`, if loaded, now used by `pid`.
    fn cached(&self, key: &FileKey, pid: Pid) -> Option<Arc<ElfFile>> {
        let mut c = self.0.lock().unwrap();
        c.tick += 1;
        let tick = c.tick;
        let e = c.by_key.get_mut(key)?;
        e.used = tick;
        e.pids.insert(pid);
        e.idle_since = None;
        Some(e.elf.clone())
    }

    /// Loads in flight.
    pub fn loading(&self) -> usize {
        self.2.0.lock().unwrap().total
    }

    /// Files loaded, and the heap bytes they hold (symbol tables, indexes,
    /// decompressed DWARF; file mappings are the page cache's).
    pub fn usage(&self) -> (u64, u64) {
        let c = self.0.lock().unwrap();
        let bytes: u64 = c
            .by_key
            .values()
            .map(|FileEntry { elf: e, .. }| {
                let syms: usize = e
                    .symbols
                    .iter()
                    .map(|s| s.name.capacity() + std::mem::size_of::<elf::Sym>())
                    .sum();
                (syms
                    + e.dwarf.as_ref().map_or(0, |d| d.heap_bytes())
                    + e.cfi.as_ref().map_or(0, |c| c.heap_bytes())) as u64
            })
            .sum();
        (c.by_key.len() as u64, bytes)
    }
}

/// Keeps `e`, loaded for `pid` by a request that started at `start` (the
/// one kept first if another load raced it), dropping the least recently
/// used beyond [`MAX_FILES`]; for no process let go of since `start`.
fn insert(
    cache: &Mutex<FileCache>,
    key: FileKey,
    e: Arc<ElfFile>,
    pid: Pid,
    start: u64,
) -> Arc<ElfFile> {
    let mut c = cache.lock().unwrap();
    if c.forgotten.get(&pid).is_some_and(|&t| t > start) {
        // Let go of while its file loaded: the file is kept for the
        // processes that use it, or idle if pinned, not for this one.
        if let Some(entry) = c.by_key.get(&key) {
            return entry.elf.clone();
        }
        if c.pinned.contains(&key) {
            let used = c.tick;
            c.by_key.insert(
                key,
                FileEntry {
                    elf: e.clone(),
                    used,
                    pids: Default::default(),
                    idle_since: Some(Instant::now()),
                },
            );
        }
        return e;
    }
    c.tick += 1;
    let tick = c.tick;
    let entry = c.by_key.entry(key).or_insert_with(|| FileEntry {
        elf: e,
        used: tick,
        pids: Default::default(),
        idle_since: None,
    });
    entry.used = tick;
    entry.pids.insert(pid);
    entry.idle_since = None;
    let e = entry.elf.clone();
    if c.by_key.len() > MAX_FILES
        && let Some(oldest) = c
            .by_key
            .iter()
            .min_by_key(|(_, e)| e.used)
            .map(|(k, _)| k.clone())
    {
        c.by_key.remove(&oldest);
    }
    e
}

/// The real uid of process `pid` (whose loads count together); `u32::MAX`
/// for one gone.
fn owner_of(pid: Pid) -> u32 {
    crate::procfs::creds(pid).map_or(u32::MAX, |(uids, _, _)| uids[0])
}

/// Loads in flight, one per file.
///
/// Locking: the `Mutex` is held only to find, add and remove loads and to
/// count them; a load runs on its own thread, outside it, and waiters wait
/// on the load's own condition variable.
struct Loads<T>(Mutex<InFlight<T>>);

impl<T> Default for Loads<T> {
    fn default() -> Self {
        Loads(Mutex::new(InFlight {
            by_key: HashMap::new(),
            per_owner: HashMap::new(),
            total: 0,
        }))
    }
}

struct InFlight<T> {
    /// By file.
    by_key: HashMap<FileKey, Arc<Load<T>>>,
    /// Loads in flight by owner.
    per_owner: HashMap<u32, usize>,
    /// Loads in flight in all.
    total: usize,
}

/// One load: when it started, and its result once done.
struct Load<T> {
    started: Instant,
    done: Mutex<Option<Result<T, elf::ElfError>>>,
    cv: Condvar,
}

impl<T: Clone + Send + 'static> Loads<T> {
    /// The file of `key` (the module `module`), loaded by `load` on a
    /// thread of its own unless a load of it is in flight already; waited
    /// for until `wait` after that load started. `owner` is asked only
    /// when a load starts.
    fn get(
        self: &Arc<Self>,
        key: &FileKey,
        module: &str,
        owner: impl FnOnce() -> u32,
        wait: Duration,
        load: impl FnOnce() -> Result<T, elf::ElfError> + Send + 'static,
    ) -> Result<T, LoadError> {
        let existing = self.0.lock().unwrap().by_key.get(key).cloned();
        let l = match existing {
            Some(l) => l,
            None => self.start(key, module, owner(), load)?,
        };
        let deadline = l.started + wait;
        let mut done = l.done.lock().unwrap();
        loop {
            if let Some(r) = done.as_ref() {
                return r.clone().map_err(LoadError::Unreadable);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(LoadError::Loading {
                    module: module.to_string(),
                    since: now - l.started,
                });
            }
            done = l.cv.wait_timeout(done, deadline - now).unwrap().0;
        }
    }

    /// Starts loading `key` for a process of `uid` (or joins a load that
    /// started meanwhile), within the bounds on loads in flight.
    fn start(
        self: &Arc<Self>,
        key: &FileKey,
        module: &str,
        uid: u32,
        load: impl FnOnce() -> Result<T, elf::ElfError> + Send + 'static,
    ) -> Result<Arc<Load<T>>, LoadError> {
        let l = {
            let mut f = self.0.lock().unwrap();
            if let Some(l) = f.by_key.get(key) {
                return Ok(l.clone());
            }
            let mine = f.per_owner.get(&uid).copied().unwrap_or(0);
            let busy = |in_flight, max| LoadError::Busy {
                module: module.to_string(),
                uid,
                in_flight,
                max,
            };
            if mine >= LOADS_PER_OWNER {
                return Err(busy(mine, LOADS_PER_OWNER));
            }
            if f.total >= LOADS_IN_FLIGHT {
                return Err(busy(f.total, LOADS_IN_FLIGHT));
            }
            let l = Arc::new(Load {
                started: Instant::now(),
                done: Mutex::new(None),
                cv: Condvar::new(),
            });
            f.by_key.insert(key.clone(), l.clone());
            *f.per_owner.entry(uid).or_default() += 1;
            f.total += 1;
            l
        };
        let (me, k, l2, m) = (self.clone(), key.clone(), l.clone(), module.to_string());
        let spawned = std::thread::Builder::new()
            .name("wpd-load".into())
            .spawn(move || {
                let t = Instant::now();
                let r = load();
                match &r {
                    Ok(_) => tracing::debug!(module = %m, ms = t.elapsed().as_millis() as u64, "module file loaded"),
                    Err(e) => tracing::debug!(module = %m, error = %e, "module file not loaded"),
                }
                me.finish(&k, uid, &l2, r);
            });
        if let Err(e) = spawned {
            self.finish(
                key,
                uid,
                &l,
                Err(elf::ElfError {
                    path: module.to_string(),
                    why: format!("cannot start a thread to load it: {e}"),
                }),
            );
        }
        Ok(l)
    }

    /// A load ended: its place in flight freed first, then its result
    /// given to its waiters, so that one that has it finds the bounds free
    /// already (a load ended counts no more); a new request finds the file
    /// in the cache, where `load` put it.
    fn finish(&self, key: &FileKey, uid: u32, l: &Arc<Load<T>>, r: Result<T, elf::ElfError>) {
        {
            let mut f = self.0.lock().unwrap();
            if f.by_key.get(key).is_some_and(|x| Arc::ptr_eq(x, l)) {
                f.by_key.remove(key);
            }
            if let Some(n) = f.per_owner.get_mut(&uid) {
                *n -= 1;
                if *n == 0 {
                    f.per_owner.remove(&uid);
                }
            }
            f.total -= 1;
        }
        *l.done.lock().unwrap() = Some(r);
        l.cv.notify_all();
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A module file this test process maps, loaded for `pids`.
    fn loaded_for(files: &Files, pids: &[Pid]) -> FileKey {
        let me = std::process::id() as Pid;
        let mapped = super::super::maps::read(me).unwrap();
        let f = mapped
            .iter()
            .find(|f| files.file(me, f).is_ok())
            .expect("some file this process maps loads");
        for &p in pids {
            files.file(p, f).unwrap();
        }
        FileKey::of(f)
    }

    /// A hit's request does not wait for the load it starts: a process let
    /// go of before that load ends (a refused arm's attach undone) must
    /// not have the file kept for it, or its fd stays while the process
    /// lives on unwatched.
    #[test]
    fn a_load_ending_after_its_process_was_let_go_of_keeps_no_file() {
        let files = Files::default();
        let me = std::process::id() as Pid;
        let key = loaded_for(&files, &[]);
        let elf = files.0.lock().unwrap().by_key[&key].elf.clone();
        let started = files.0.lock().unwrap().tick;
        files.forget_at(me, |_| true, Instant::now());
        assert_eq!(files.usage().0, 0);
        insert(&files.0, key.clone(), elf.clone(), me, started);
        assert_eq!(
            files.usage().0,
            0,
            "a load started before the process was let go of"
        );
        // Pinned: kept idle, for no process.
        files.pin(key.clone());
        insert(&files.0, key.clone(), elf.clone(), me, started);
        let c = files.0.lock().unwrap();
        assert!(c.by_key[&key].pids.is_empty() && c.by_key[&key].idle_since.is_some());
        drop(c);
        files.unpin(&key);
        // A request of after the process was let go of (it is watched
        // again): kept for it.
        let after = files.0.lock().unwrap().tick;
        insert(&files.0, key.clone(), elf, me, after);
        assert_eq!(
            files.0.lock().unwrap().by_key[&key].pids,
            HashSet::from([me])
        );
    }

    #[test]
    fn processes_are_asked_after_outside_the_lock() {
        let files = Files::default();
        let me = std::process::id() as Pid;
        let gone = 0x3fff_fff0; // above pid_max: never a live process
        let key = loaded_for(&files, &[gone, 77]);
        files.forget_with(77, |p| {
            assert!(files.0.try_lock().is_ok(), "asked about {p} under the lock");
            p == me
        });
        let c = files.0.lock().unwrap();
        assert_eq!(
            c.by_key[&key].pids,
            HashSet::from([me]),
            "the forgotten and the gone let go of"
        );
        drop(c);
        let now = Instant::now();
        // Not pinned: the last user gone, the file too (nothing of a
        // process outlives it).
        files.forget_at(me, |_| true, now);
        assert_eq!(files.usage().0, 0, "the last user gone: the file too");
        // Pinned (a program held at its exec): kept idle.
        let key = loaded_for(&files, &[me]);
        files.pin(key.clone());
        files.forget_at(me, |_| true, now);
        assert_eq!(files.usage().0, 1, "the last user gone: the file kept idle");
        // The next process of the program finds it loaded.
        let mapped = super::super::maps::read(me).unwrap();
        let f = mapped.iter().find(|f| FileKey::of(f) == key).unwrap();
        files.file(me, f).unwrap();
        assert!(files.0.lock().unwrap().by_key[&key].idle_since.is_none());
        files.forget_at(me, |_| true, now);
        files.forget_at(77, |_| true, now + IDLE_KEEP);
        assert_eq!(files.usage().0, 0, "idle for IDLE_KEEP: dropped");
        // Unpinned while idle: dropped at once.
        files.file(me, f).unwrap();
        files.forget_at(me, |_| true, now);
        assert_eq!(files.usage().0, 1);
        files.unpin(&key);
        assert_eq!(files.usage().0, 0, "unpinned: dropped");
    }

    /// A file's identity from `stat` is the one `/proc/PID/maps` gives.
    #[test]
    fn a_stat_names_a_file_as_the_maps_do() {
        use std::os::unix::fs::MetadataExt;
        let me = std::process::id() as Pid;
        let mapped = super::super::maps::read(me).unwrap();
        let f = mapped
            .iter()
            .find(|f| std::path::Path::new(&f.path).is_file())
            .expect("a file this process maps");
        let m = std::fs::metadata(&f.path).unwrap();
        assert_eq!(
            FileKey::of_stat(m.dev(), m.ino()),
            FileKey::of(f),
            "{}",
            f.path
        );
    }

    /// At most IDLE_MAX files are kept idle, the least recently used
    /// dropped first.
    #[test]
    fn idle_files_are_bounded() {
        let files = Files::default();
        let me = std::process::id() as Pid;
        let key = loaded_for(&files, &[me]);
        let elf = files.0.lock().unwrap().by_key[&key].elf.clone();
        let now = Instant::now();
        {
            let mut c = files.0.lock().unwrap();
            for i in 0..IDLE_MAX as u64 + 4 {
                c.by_key.insert(
                    FileKey {
                        dev: "test".into(),
                        inode: i,
                    },
                    FileEntry {
                        elf: elf.clone(),
                        used: 1_000 + i,
                        pids: HashSet::from([1_000_000 + i as Pid]),
                        idle_since: None,
                    },
                );
            }
        }
        for i in 0..IDLE_MAX as u64 + 4 {
            files.pin(FileKey {
                dev: "test".into(),
                inode: i,
            });
        }
        files.pin(key.clone());
        // Every test process gone: all idle now, the newest IDLE_MAX kept
        // (the file loaded first, least recently used, goes too).
        files.forget_at(me, |_| false, now);
        let c = files.0.lock().unwrap();
        assert_eq!(c.by_key.len(), IDLE_MAX);
        assert!(
            (4..IDLE_MAX as u64 + 4).all(|i| c.by_key.contains_key(&FileKey {
                dev: "test".into(),
                inode: i
            })),
            "the least recently used went first"
        );
    }

    /// A load held until the test lets it go: (the load, its release).
    fn held(
        calls: &Arc<std::sync::atomic::AtomicUsize>,
    ) -> (
        impl FnOnce() -> Result<u32, elf::ElfError> + Send + 'static,
        std::sync::mpsc::Sender<u32>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        let calls = calls.clone();
        let load = move || {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            rx.recv().map_err(|_| elf::ElfError {
                path: "x".into(),
                why: "released without a value".into(),
            })
        };
        (load, tx)
    }

    fn key(inode: u64) -> FileKey {
        FileKey {
            dev: "fd:01".into(),
            inode,
        }
    }

    #[test]
    fn a_load_is_shared_and_waited_for_until_its_deadline() {
        let loads: Arc<Loads<u32>> = Arc::default();
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (load, release) = held(&calls);
        let short = Duration::from_millis(50);
        let e = loads.get(&key(1), "/m", || 7, short, load).unwrap_err();
        assert!(
            matches!(&e, LoadError::Loading { module, since } if module == "/m" && *since >= short),
            "{e:?}"
        );
        // Asked again past the deadline: told at once, no second load.
        let (load2, _r2) = held(&calls);
        let t = Instant::now();
        assert!(matches!(
            loads.get(&key(1), "/m", || 7, short, load2),
            Err(LoadError::Loading { .. })
        ));
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        // A waiter with time left gets the result when the load ends.
        let l2 = loads.clone();
        let waiter = std::thread::spawn(move || {
            let (load3, _r3) = held(&Arc::default());
            l2.get(&key(1), "/m", || 7, Duration::from_secs(60), load3)
        });
        std::thread::sleep(Duration::from_millis(100));
        release.send(42).unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), 42);
        assert_eq!(
            calls.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one load"
        );
        // Done: its place is freed, and a new load may start.
        let f = loads.0.lock().unwrap();
        assert!(f.by_key.is_empty() && f.per_owner.is_empty() && f.total == 0);
    }

    #[test]
    fn an_owner_has_a_bounded_number_of_loads_in_flight() {
        let loads: Arc<Loads<u32>> = Arc::default();
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut releases = Vec::new();
        for i in 0..LOADS_PER_OWNER as u64 {
            let (load, r) = held(&calls);
            releases.push(r);
            assert!(matches!(
                loads.get(&key(i), "/slow", || 1001, Duration::ZERO, load),
                Err(LoadError::Loading { .. })
            ));
        }
        let (load, _r) = held(&calls);
        let e = loads
            .get(&key(100), "/next", || 1001, Duration::ZERO, load)
            .unwrap_err();
        assert_eq!(
            e,
            LoadError::Busy {
                module: "/next".into(),
                uid: 1001,
                in_flight: LOADS_PER_OWNER,
                max: LOADS_PER_OWNER
            }
        );
        // Another owner's load goes ahead.
        let (load, r) = held(&calls);
        r.send(5).unwrap();
        assert_eq!(
            loads
                .get(&key(101), "/other", || 0, Duration::from_secs(60), load)
                .unwrap(),
            5
        );
        for r in releases {
            r.send(1).unwrap();
        }
        let t = Instant::now();
        while loads.0.lock().unwrap().total > 0 {
            assert!(t.elapsed() < Duration::from_secs(10), "loads never ended");
            std::thread::sleep(Duration::from_millis(10));
        }
        let (load, r) = held(&calls);
        r.send(6).unwrap();
        assert_eq!(
            loads
                .get(&key(100), "/next", || 1001, Duration::from_secs(60), load)
                .unwrap(),
            6,
            "free again once its loads ended"
        );
    }

    #[test]
    fn a_load_that_outlives_its_waiters_is_kept() {
        let files = Files::default();
        let me = std::process::id() as Pid;
        let mapped = super::super::maps::read(me).unwrap();
        // Every waiter gives up at once; the loader thread keeps the file.
        let f = mapped
            .iter()
            .find(|f| f.path.ends_with(".so") || f.path.contains(".so."))
            .expect("this process maps a library");
        let _ = files.file_within(me, f, Duration::ZERO);
        let t = Instant::now();
        while files.loading() > 0 {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the load never ended"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            files.0.lock().unwrap().by_key.contains_key(&FileKey::of(f)),
            "kept by the loader"
        );
        assert!(files.file_within(me, f, Duration::ZERO).is_ok());
    }

    /// A load of `key` that started `ago` and never ends (a file on a
    /// server that does not answer).
    pub(in crate::symbols) fn stall(files: &Files, key: FileKey, ago: Duration) {
        let l = Arc::new(Load {
            started: Instant::now() - ago,
            done: Mutex::new(None),
            cv: Condvar::new(),
        });
        files.2.0.lock().unwrap().by_key.insert(key, l);
    }

    #[test]
    fn a_request_needing_a_module_still_loading_is_told_so_at_once() {
        let symbols = crate::symbols::Symbols::new();
        let me = std::process::id() as Pid;
        let exe = super::super::resolve::exe_key(me).expect("this process's executable");
        stall(&symbols.files, exe, REQUEST_WAIT + Duration::from_secs(1));
        let t = Instant::now();
        let e = symbols
            .resolve(me, "counter", crate::model::Access::Write, 0)
            .unwrap_err();
        assert!(
            matches!(&e, crate::symbols::SymbolError::ModuleLoading { pid, since_ms, .. }
                if *pid == me && *since_ms >= REQUEST_WAIT.as_millis() as u64),
            "{e:?}"
        );
        assert!(e.to_string().contains("is still loading"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
}
