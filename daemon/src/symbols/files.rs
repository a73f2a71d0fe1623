//! The module files the symbol layer holds loaded: one [`ElfFile`] per file
//! (device and inode), shared by every process mapping it, let go of when
//! the last of those processes is, or when least recently used beyond
//! [`MAX_FILES`].
//!
//! The cache's mutex is held only to look up, insert and drop entries:
//! loading a file and asking `/proc` which processes still live happen
//! outside it.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::elf::{self, ElfFile};
use super::maps::MappedFile;
use crate::model::Pid;

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
pub struct Files(Mutex<FileCache>, Arc<[std::path::PathBuf]>);

impl Default for Files {
    fn default() -> Self {
        Files::with_debug_dirs(super::elf::default_debug_dirs())
    }
}

#[derive(Default)]
struct FileCache {
    by_key: HashMap<FileKey, FileEntry>,
    tick: u64,
}

/// A loaded file, when it was last used, and the processes it was loaded
/// for (it goes when the last of them is let go of).
struct FileEntry {
    elf: Arc<ElfFile>,
    used: u64,
    pids: HashSet<Pid>,
}

impl Files {
    /// A cache whose files look for separate debug files in `debug_dirs`
    /// (`wpd --debug-dir`).
    pub fn with_debug_dirs(debug_dirs: Vec<std::path::PathBuf>) -> Self {
        Files(Mutex::default(), debug_dirs.into())
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
        c.by_key.retain(|_, e| {
            e.pids.retain(|p| *p != pid && !gone.contains(p));
            !e.pids.is_empty()
        });
    }

    /// The ELF file of a module `pid` maps, loaded once per file.
    pub fn file(&self, pid: Pid, f: &MappedFile) -> Result<Arc<ElfFile>, elf::ElfError> {
        let key = FileKey::of(f);
        {
            let mut c = self.0.lock().unwrap();
            c.tick += 1;
            let tick = c.tick;
            if let Some(e) = c.by_key.get_mut(&key) {
                e.used = tick;
                e.pids.insert(pid);
                return Ok(e.elf.clone());
            }
        }
        // Loaded outside the lock: a large file takes a while.
        let e = Arc::new(ElfFile::load(
            &f.open_path(pid),
            Path::new(&f.path),
            &self.1,
        )?);
        let mut c = self.0.lock().unwrap();
        c.tick += 1;
        let tick = c.tick;
        let entry = c.by_key.entry(key).or_insert_with(|| FileEntry {
            elf: e,
            used: tick,
            pids: Default::default(),
        });
        entry.pids.insert(pid);
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
        Ok(e)
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

#[cfg(test)]
mod tests {
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
        files.forget_with(me, |_| true);
        assert_eq!(files.usage().0, 0, "the last user gone: the file too");
    }
}
