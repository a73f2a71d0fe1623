//! A process's file mappings from `/proc/PID/maps`, grouped into modules
//! (one per mapped file), and where each module's file can be opened from
//! the daemon (through `/proc/PID/root`, so that a process in another mount
//! namespace is read from its own files).

use std::path::{Path, PathBuf};

use super::open::{OpenError, Opened};
use crate::model::Pid;

/// One line of `/proc/PID/maps` that maps a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// End (exclusive).
    pub end: u64,
    /// Executable.
    pub exec: bool,
    /// Offset in the file of `start`.
    pub offset: u64,
    /// Device, as the kernel prints it (`fd:01`).
    pub dev: String,
    /// Inode.
    pub inode: u64,
    /// The file's path in the process's mount namespace.
    pub path: String,
}

/// The mappings of one file in a process, in address order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedFile {
    /// The file's path in the process's mount namespace.
    pub path: String,
    /// Device and inode: what tells two files of one name apart.
    pub dev: String,
    /// Inode.
    pub inode: u64,
    /// Its mappings.
    pub mappings: Vec<Mapping>,
}

impl MappedFile {
    /// The file name (`libc.so.6`).
    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    /// Lowest and highest (exclusive) mapped address.
    pub fn span(&self) -> (u64, u64) {
        let lo = self.mappings.first().map_or(0, |m| m.start);
        let hi = self.mappings.last().map_or(0, |m| m.end);
        (lo, hi)
    }

    /// Whether `addr` is in one of its mappings.
    pub fn contains(&self, addr: u64) -> bool {
        self.mappings
            .iter()
            .any(|m| m.start <= addr && addr < m.end)
    }

    /// Where the daemon opens it: through the process's root, or, when the
    /// file was deleted or replaced since, its mapping in `map_files`.
    pub fn open_path(&self, pid: Pid) -> PathBuf {
        let root = PathBuf::from(format!("{}{}", root_dir(pid), self.path));
        if !self.path.ends_with(" (deleted)") && same_file(&root, &self.dev, self.inode) {
            return root;
        }
        match self.mappings.first() {
            Some(m) => PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end)),
            None => root,
        }
    }
}

/// The process's root directory in `/proc`: `/proc/PID/root` is its
/// leader's, gone with a leader that exited while its other threads run on
/// (kernel-facts §3b), and then a live thread's is taken. (`map_files`,
/// through which a deleted or replaced file is reached, has no per-thread
/// copy: such a file cannot be opened in such a process.)
fn root_dir(pid: Pid) -> String {
    let own = format!("/proc/{pid}/root");
    if std::fs::read_link(&own).is_ok() {
        return own;
    }
    crate::procfs::live_task_file(pid, "root").unwrap_or(own)
}

/// A device number as `/proc/PID/maps` prints it (`fd:01`).
fn dev_text(dev: u64) -> String {
    let (maj, min) = (
        ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
        (dev & 0xff) | ((dev >> 12) & !0xff),
    );
    format!("{maj:02x}:{min:02x}")
}

/// Whether `path` is the file `dev`/`inode` (a library upgraded in place
/// keeps its name, not its inode).
fn same_file(path: &Path, dev: &str, inode: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(md) = std::fs::metadata(path) else {
        return false;
    };
    md.ino() == inode && dev_text(md.dev()) == dev
}

impl MappedFile {
    /// The file opened for reading by the daemon (`open.rs`: a regular
    /// file, without blocking), checked to be the file mapped (device and
    /// inode): through the process's root, its last component not followed
    /// if a link, or else through its mapping in `map_files` (deleted or
    /// replaced since). Also where the daemon reaches the directory it is
    /// in, for its debug link: the process's root and the directory of its
    /// path.
    pub fn open(&self, pid: Pid) -> Result<(Opened, PathBuf), OpenError> {
        let mapped = |o: &Opened| o.ino == self.inode && dev_text(o.dev) == self.dev;
        let root = PathBuf::from(format!("{}{}", root_dir(pid), self.path));
        let mut refused = None;
        if !self.path.ends_with(" (deleted)") {
            match super::open::open_file(&root) {
                Ok(o) if mapped(&o) => return Ok((o, root)),
                Ok(_) => {}
                Err(e) if e.is_absent() => {}
                Err(e) => refused = Some(e),
            }
        }
        let Some(m) = self.mappings.first() else {
            return Err(refused.unwrap_or(OpenError::NotMapped {
                path: root.display().to_string(),
            }));
        };
        let via = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
        match super::open::open_magic(&via) {
            Ok(o) if mapped(&o) => Ok((o, via)),
            Ok(_) => Err(OpenError::NotMapped {
                path: via.display().to_string(),
            }),
            Err(e) => Err(refused.unwrap_or(e)),
        }
    }

    /// Its directory as the daemon reaches it: through the process's root.
    pub fn dir_path(&self, pid: Pid) -> (PathBuf, PathBuf) {
        let ns_dir = Path::new(&self.path)
            .parent()
            .unwrap_or(Path::new("/"))
            .to_path_buf();
        (
            PathBuf::from(format!("{}{}", root_dir(pid), ns_dir.display())),
            ns_dir,
        )
    }
}

/// Parses one line of `/proc/PID/maps`; `None` for anonymous and special
/// mappings (`[heap]`, `[stack]`, `[vdso]`…).
pub fn parse_line(line: &str) -> Option<Mapping> {
    let mut f = line.splitn(6, ' ');
    let range = f.next()?;
    let perms = f.next()?;
    let offset = u64::from_str_radix(f.next()?, 16).ok()?;
    let dev = f.next()?.to_string();
    let inode: u64 = f.next()?.parse().ok()?;
    let path = f.next().unwrap_or("").trim_start();
    if inode == 0 || !path.starts_with('/') {
        return None;
    }
    let (s, e) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        exec: perms.as_bytes().get(2) == Some(&b'x'),
        offset,
        dev,
        inode,
        path: path.to_string(),
    })
}

/// The files a process maps, in order of their lowest address.
pub fn parse(text: &str) -> Vec<MappedFile> {
    let mut out: Vec<MappedFile> = Vec::new();
    for m in text.lines().filter_map(parse_line) {
        match out
            .iter_mut()
            .find(|f| f.inode == m.inode && f.dev == m.dev && f.path == m.path)
        {
            Some(f) => f.mappings.push(m),
            None => out.push(MappedFile {
                path: m.path.clone(),
                dev: m.dev.clone(),
                inode: m.inode,
                mappings: vec![m],
            }),
        }
    }
    out.sort_by_key(|f| f.span().0);
    out
}

/// Reads of `/proc/PID/maps` since start (`GetStats`): the hit path makes
/// none for addresses in modules it knows.
pub static READS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The files `pid` maps now. `/proc/PID/maps` is the leader's view: a
/// process whose leader has exited while its other threads run on reads
/// empty there (the zombie leader has no memory left), so an empty read is
/// made again through a live thread; a process with no live thread maps
/// nothing.
pub fn read(pid: Pid) -> std::io::Result<Vec<MappedFile>> {
    READS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    if !text.is_empty() {
        return Ok(parse(&text));
    }
    match crate::procfs::live_task_file(pid, "maps") {
        Some(path) => Ok(parse(&std::fs::read_to_string(path)?)),
        None => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c09ee000-55d0c09ef000 r--p 00000000 fd:01 1234   /opt/app/bin/app
55d0c09ef000-55d0c09f0000 r-xp 00001000 fd:01 1234   /opt/app/bin/app
55d0c09f0000-55d0c09f1000 rw-p 00002000 fd:01 1234   /opt/app/bin/app
55d0c09f1000-55d0c09f2000 rw-p 00000000 00:00 0
55d0c1a00000-55d0c1a21000 rw-p 00000000 00:00 0      [heap]
7f1e2c000000-7f1e2c028000 r--p 00000000 fd:01 99     /usr/lib/x86_64-linux-gnu/libc.so.6
7f1e2c028000-7f1e2c1bd000 r-xp 00028000 fd:01 99     /usr/lib/x86_64-linux-gnu/libc.so.6
7f1e2c300000-7f1e2c301000 rw-p 00000000 fd:01 77     /tmp/lib with space.so (deleted)
7ffd5d3c0000-7ffd5d3e1000 rw-p 00000000 00:00 0      [stack]
7ffd5d3fc000-7ffd5d3fe000 r-xp 00000000 00:00 0      [vdso]
";

    #[test]
    fn files_are_grouped_in_address_order() {
        let files = parse(MAPS);
        let names: Vec<&str> = files.iter().map(|f| f.name()).collect();
        assert_eq!(names, ["app", "libc.so.6", "lib with space.so (deleted)"]);
        let app = &files[0];
        assert_eq!(app.mappings.len(), 3);
        assert_eq!(app.span(), (0x55d0c09ee000, 0x55d0c09f1000));
        assert!(app.mappings[1].exec && !app.mappings[0].exec);
        assert_eq!(app.mappings[2].offset, 0x2000);
        assert!(app.contains(0x55d0c09ef123));
        assert!(
            !app.contains(0x55d0c09f1000),
            "the anonymous .bss tail is not the file's"
        );
        assert_eq!(files[1].dev, "fd:01");
        assert_eq!(files[1].inode, 99);
    }
}
