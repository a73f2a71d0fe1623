//! The state directory (`wpd --state-dir DIR`): private to the daemon's
//! user, whatever the umask, and refused when another user could change
//! it.
//!
//! What it holds (the journal's segments, the watchpoints saved with the
//! callers who set them, the export position) is every hit's memory bytes
//! and every caller's identity. So:
//!
//! 1. Directories are created 0700 and files 0600 (an explicit mode, and
//!    `fchmod` after creation, so the umask cannot widen or narrow them).
//!    What an earlier version left wider is narrowed at start.
//! 2. At start the directory and everything in it must belong to the
//!    daemon's effective uid, hold no symbolic link and be writable by
//!    nobody else; every directory above it must belong to root or that
//!    uid and be writable by nobody else (or sticky, as `/tmp` is). A
//!    directory that fails is refused with what is wrong, before anything
//!    is read from it or written to it.
//! 3. Files are opened with `O_NOFOLLOW`, and read with a size limit: what
//!    is read back is treated as hostile by its parser, never trusted for
//!    its size.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of the directories the daemon creates.
pub const DIR_MODE: u32 = 0o700;
/// Mode of the files the daemon creates.
pub const FILE_MODE: u32 = 0o600;

/// Why a state directory is refused.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    /// A symbolic link where the daemon keeps its state.
    #[error(
        "{path} is a symbolic link: a state directory and what it holds must be plain files and \
         directories (give --state-dir the link's target, or another directory)"
    )]
    Symlink { path: PathBuf },
    /// Neither a file nor a directory (or a file where a directory must be).
    #[error("{path} is not a {expected}")]
    WrongKind {
        path: PathBuf,
        expected: &'static str,
    },
    /// Owned by another user.
    #[error(
        "{path} belongs to uid {owner}, not to the daemon's uid {euid}: another user could read \
         or forge the daemon's state (chown it, or give --state-dir a directory of uid {euid})"
    )]
    Owner {
        path: PathBuf,
        owner: u32,
        euid: u32,
    },
    /// Writable by the group or by everyone.
    #[error(
        "{path} is writable by {who} (mode {mode:04o}): another user could forge the daemon's \
         state (chmod go-w it)"
    )]
    Writable {
        path: PathBuf,
        mode: u32,
        who: &'static str,
    },
    /// A directory above it that another user could change.
    #[error(
        "{path}, above the state directory, {why}: another user could replace the state \
         directory (give --state-dir a directory under a root-owned path)"
    )]
    UnsafeAncestor { path: PathBuf, why: String },
    /// A relative path.
    #[error("the state directory must be an absolute path, not {path}")]
    Relative { path: PathBuf },
    /// The system refused an operation.
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StateDirError + use<> {
    let path = path.to_path_buf();
    move |source| StateDirError::Io { what, path, source }
}

/// A state directory checked at start (see the module's rules).
#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
}

/// The daemon's effective uid.
fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Checks that `meta` (of `path`) belongs to `euid` and is writable by
/// nobody else.
fn check_owned(path: &Path, meta: &std::fs::Metadata, euid: u32) -> Result<(), StateDirError> {
    if meta.file_type().is_symlink() {
        return Err(StateDirError::Symlink {
            path: path.to_path_buf(),
        });
    }
    if meta.uid() != euid {
        return Err(StateDirError::Owner {
            path: path.to_path_buf(),
            owner: meta.uid(),
            euid,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(StateDirError::Writable {
            path: path.to_path_buf(),
            mode,
            who: if mode & 0o002 != 0 {
                "everyone"
            } else {
                "its group"
            },
        });
    }
    Ok(())
}

/// Checks every directory above `path`: owned by root or `euid`, and not
/// writable by others unless sticky (as `/tmp`). A symbolic link among
/// them must be root's or `euid`'s too (another user could repoint it
/// while the daemon runs, and steer its files elsewhere), and what it
/// points to is checked the same way.
fn check_ancestors(path: &Path, euid: u32) -> Result<(), StateDirError> {
    let mut cur = path.parent();
    while let Some(dir) = cur {
        if dir.as_os_str().is_empty() {
            break;
        }
        let meta = match std::fs::symlink_metadata(dir) {
            Ok(m) => m,
            // Not there yet (a new user's `~/.local/state`): made by the
            // daemon, its own, when the directory is.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                cur = dir.parent();
                continue;
            }
            Err(e) => return Err(io_err("reading", dir)(e)),
        };
        if meta.uid() != 0 && meta.uid() != euid {
            return Err(StateDirError::UnsafeAncestor {
                path: dir.to_path_buf(),
                why: if meta.file_type().is_symlink() {
                    format!("is a symbolic link of uid {}", meta.uid())
                } else {
                    format!("belongs to uid {}", meta.uid())
                },
            });
        }
        if meta.file_type().is_symlink() {
            // The link is safe; what it points to must be too, with every
            // directory above that.
            let target = std::fs::canonicalize(dir).map_err(io_err("resolving", dir))?;
            let tmeta = std::fs::metadata(&target).map_err(io_err("reading", &target))?;
            check_dir_above(&target, &tmeta, euid)?;
            return check_ancestors(&target, euid);
        }
        check_dir_above(dir, &meta, euid)?;
        cur = dir.parent();
    }
    Ok(())
}

/// One directory above the state directory (`meta` its own, not a link's).
fn check_dir_above(dir: &Path, meta: &std::fs::Metadata, euid: u32) -> Result<(), StateDirError> {
    let mode = meta.mode() & 0o7777;
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(StateDirError::UnsafeAncestor {
            path: dir.to_path_buf(),
            why: format!("belongs to uid {}", meta.uid()),
        });
    }
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(StateDirError::UnsafeAncestor {
            path: dir.to_path_buf(),
            why: format!("is writable by others without the sticky bit (mode {mode:04o})"),
        });
    }
    Ok(())
}

/// Creates `path` (0700) and whatever is missing above it, or checks the
/// directory that is there (narrowing its mode).
fn make_dir(path: &Path, euid: u32) -> Result<(), StateDirError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) => {
            check_dir(path, &meta, euid)?;
            narrow(path, &meta, DIR_MODE)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent()
                && !parent.as_os_str().is_empty()
                && !parent.exists()
            {
                // Directories above it: root's convention (0755), as
                // `install -d` makes them; only the last one is private.
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(parent)
                    .map_err(io_err("creating", parent))?;
            }
            match std::fs::DirBuilder::new().mode(DIR_MODE).create(path) {
                Ok(()) => {}
                // Made meanwhile: checked as found.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return make_dir(path, euid),
                Err(e) => return Err(io_err("creating", path)(e)),
            }
            // The umask may have narrowed it further: exactly 0700.
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(DIR_MODE))
                .map_err(io_err("setting the mode of", path))
        }
        Err(e) => Err(io_err("reading", path)(e)),
    }
}

/// Checks that `path` (`meta` its own) is a directory the daemon's user
/// owns and nobody else may write.
fn check_dir(path: &Path, meta: &std::fs::Metadata, euid: u32) -> Result<(), StateDirError> {
    check_owned(path, meta, euid)?;
    if !meta.is_dir() {
        return Err(StateDirError::WrongKind {
            path: path.to_path_buf(),
            expected: "directory",
        });
    }
    Ok(())
}

/// Narrows `path`'s mode to at most `max` (what an earlier version or an
/// operator left wider), saying so.
fn narrow(path: &Path, meta: &std::fs::Metadata, max: u32) -> Result<(), StateDirError> {
    let mode = meta.mode() & 0o7777;
    if mode & !max == 0 {
        return Ok(());
    }
    tracing::warn!(
        path = %path.display(),
        mode = format_args!("{mode:04o}"),
        now = format_args!("{:04o}", mode & max),
        "state directory: narrowing a mode others could read"
    );
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & max))
        .map_err(io_err("setting the mode of", path))
}

/// Checks what `dir` holds, down to `depth` levels, narrowing modes.
fn check_tree(dir: &Path, euid: u32, depth: u32) -> Result<(), StateDirError> {
    for entry in std::fs::read_dir(dir).map_err(io_err("listing", dir))? {
        let entry = entry.map_err(io_err("listing", dir))?;
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).map_err(io_err("reading", &path))?;
        check_owned(&path, &meta, euid)?;
        if meta.is_dir() {
            narrow(&path, &meta, DIR_MODE)?;
            if depth > 0 {
                check_tree(&path, euid, depth - 1)?;
            }
        } else if meta.is_file() {
            narrow(&path, &meta, FILE_MODE)?;
        } else {
            return Err(StateDirError::WrongKind {
                path,
                expected: "file or directory",
            });
        }
    }
    Ok(())
}

impl StateDir {
    /// Opens the state directory at `path`, creating it (0700) if missing,
    /// after checking it and everything in it (the module's rules).
    pub fn open(path: &Path) -> Result<StateDir, StateDirError> {
        let d = StateDir::prepare(path)?;
        d.check()?;
        Ok(d)
    }

    /// The first half of [`StateDir::open`]: the path absolute, every
    /// directory above it safe, the directory itself created if missing or
    /// else checked (kind, owner, nobody else may write it), and nothing in
    /// it looked at or changed: what a daemon does before it holds the
    /// directory's lock. [`StateDir::check`] does the rest.
    pub fn prepare(path: &Path) -> Result<StateDir, StateDirError> {
        if !path.is_absolute() {
            return Err(StateDirError::Relative {
                path: path.to_path_buf(),
            });
        }
        let euid = euid();
        check_ancestors(path, euid)?;
        match std::fs::symlink_metadata(path) {
            Ok(meta) => check_dir(path, &meta, euid)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => make_dir(path, euid)?,
            Err(e) => return Err(io_err("reading", path)(e)),
        }
        Ok(StateDir {
            path: path.to_path_buf(),
        })
    }

    /// The second half of [`StateDir::open`], once the directory's lock is
    /// held: its mode narrowed, and everything in it checked (narrowing
    /// modes an earlier version left wider).
    pub fn check(&self) -> Result<(), StateDirError> {
        let euid = euid();
        make_dir(&self.path, euid)?;
        check_tree(&self.path, euid, 2)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` under the directory, created 0700 if missing (checked and
    /// narrowed if present).
    pub fn subdir(&self, name: &str) -> Result<PathBuf, StateDirError> {
        let p = self.path.join(name);
        make_dir(&p, euid())?;
        Ok(p)
    }
}

/// Options for a private file: `O_NOFOLLOW | O_CLOEXEC`, created 0600.
fn private(opts: &mut OpenOptions) -> &mut OpenOptions {
    opts.mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
}

/// Opens `path` with `opts` as a private file: a symbolic link is refused
/// (`ELOOP`), a file it creates is 0600 whatever the umask.
pub fn open(path: &Path, opts: &mut OpenOptions) -> io::Result<File> {
    let f = private(opts).open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    if meta.mode() & 0o777 != FILE_MODE {
        // Wider (an earlier version, an operator) or narrower (a tight
        // umask at creation): exactly 0600.
        f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    }
    Ok(f)
}

/// Reads the private file `path` whole, refusing one larger than `limit`
/// bytes (a damaged or forged file is not read into memory whatever its
/// size). `Ok(None)`: no such file.
pub fn read(path: &Path, limit: u64) -> io::Result<Option<Vec<u8>>> {
    let f = match open(path, OpenOptions::new().read(true)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} holds {len} bytes, more than the {limit} it may",
                path.display()
            ),
        ));
    }
    let mut buf = Vec::with_capacity(len as usize);
    f.take(limit + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} grew past {limit} bytes while read", path.display()),
        ));
    }
    Ok(Some(buf))
}

/// Replaces `path` whole with `bytes`: a private temporary file beside it
/// (created exclusively, never through a link), synced, renamed over
/// `path`, the directory synced. A reader sees the old content or the new,
/// never part of either.
pub fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    // A leftover of a crash (ours: the directory is private) goes first.
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let result = (|| {
        let mut f = open(&tmp, OpenOptions::new().write(true).create_new(true))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests of this module one at a time: one of them changes the
    /// process's umask.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A fresh directory under the system's temporary directory (sticky,
    /// root's), removed on drop; holds [`SERIAL`].
    struct Tmp(
        PathBuf,
        #[allow(dead_code)] std::sync::MutexGuard<'static, ()>,
    );
    impl Tmp {
        fn new(tag: &str) -> Tmp {
            let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
            let p = std::env::temp_dir().join(format!("wpd-statedir-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            Tmp(p, guard)
        }
    }
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    /// Runs `f` with the process umask set to `m`.
    fn with_umask<T>(m: u32, f: impl FnOnce() -> T) -> T {
        // SAFETY: umask has no memory effects; the tests that change it
        // restore it before returning.
        let old = unsafe { libc::umask(m as libc::mode_t) };
        let r = f();
        unsafe { libc::umask(old) };
        r
    }

    #[test]
    fn created_private_whatever_the_umask() {
        let t = Tmp::new("umask");
        let sd = with_umask(0, || StateDir::open(&t.0).unwrap());
        assert_eq!(mode(&t.0), 0o700);
        let sub = with_umask(0, || sd.subdir("journal").unwrap());
        assert_eq!(mode(&sub), 0o700);
        let f = sub.join("a");
        with_umask(0, || {
            open(&f, OpenOptions::new().write(true).create(true)).unwrap();
        });
        assert_eq!(mode(&f), 0o600);
        with_umask(0, || replace(&t.0.join("b"), b"x").unwrap());
        assert_eq!(mode(&t.0.join("b")), 0o600);
        // A tight umask does not make files unreadable to the daemon.
        with_umask(0o277, || replace(&t.0.join("c"), b"y").unwrap());
        assert_eq!(mode(&t.0.join("c")), 0o600);
    }

    #[test]
    fn directories_missing_above_it_are_made() {
        // A new user's `~/.local/state/wpd`: neither `.local` nor `state`
        // exists yet.
        let t = Tmp::new("above");
        std::fs::create_dir(&t.0).unwrap();
        let dir = t.0.join(".local/state/wpd");
        StateDir::open(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert!(t.0.join(".local/state").is_dir());
    }

    #[test]
    fn wider_modes_left_behind_are_narrowed() {
        let t = Tmp::new("narrow");
        std::fs::create_dir_all(t.0.join("journal")).unwrap();
        std::fs::write(t.0.join("journal/1.wpj"), b"x").unwrap();
        std::fs::write(t.0.join("watchpoints.pb"), b"x").unwrap();
        for (p, m) in [
            (t.0.clone(), 0o755),
            (t.0.join("journal"), 0o755),
            (t.0.join("journal/1.wpj"), 0o644),
            (t.0.join("watchpoints.pb"), 0o644),
        ] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
        }
        StateDir::open(&t.0).unwrap();
        assert_eq!(mode(&t.0), 0o700);
        assert_eq!(mode(&t.0.join("journal")), 0o700);
        assert_eq!(mode(&t.0.join("journal/1.wpj")), 0o600);
        assert_eq!(mode(&t.0.join("watchpoints.pb")), 0o600);
    }

    #[test]
    fn writable_by_others_or_linked_is_refused() {
        let t = Tmp::new("refuse");
        std::fs::create_dir_all(&t.0).unwrap();
        std::fs::set_permissions(&t.0, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = StateDir::open(&t.0).unwrap_err();
        assert!(
            matches!(
                e,
                StateDirError::Writable {
                    who: "everyone",
                    ..
                }
            ),
            "{e}"
        );
        std::fs::set_permissions(&t.0, std::fs::Permissions::from_mode(0o770)).unwrap();
        let e = StateDir::open(&t.0).unwrap_err();
        assert!(
            matches!(
                e,
                StateDirError::Writable {
                    who: "its group",
                    ..
                }
            ),
            "{e}"
        );
        std::fs::set_permissions(&t.0, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", t.0.join("watchpoints.pb")).unwrap();
        let e = StateDir::open(&t.0).unwrap_err();
        assert!(matches!(e, StateDirError::Symlink { .. }), "{e}");
        assert!(e.to_string().contains("watchpoints.pb"), "{e}");
        // The directory itself as a link.
        std::fs::remove_file(t.0.join("watchpoints.pb")).unwrap();
        let link = t.0.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&t.0, &link).unwrap();
        let e = StateDir::open(&link).unwrap_err();
        std::fs::remove_file(&link).unwrap();
        assert!(matches!(e, StateDirError::Symlink { .. }), "{e}");
        assert!(matches!(
            StateDir::open(Path::new("relative/dir")),
            Err(StateDirError::Relative { .. })
        ));
    }

    #[test]
    fn files_are_never_opened_through_a_link() {
        let t = Tmp::new("nofollow");
        StateDir::open(&t.0).unwrap();
        let target = t.0.join("target");
        std::fs::write(&target, b"secret").unwrap();
        let link = t.0.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = open(&link, OpenOptions::new().read(true)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
        let e = read(&link, 100).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
        // replace() renames over the link itself, never writes through it.
        replace(&link, b"new").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"secret");
        assert!(
            !std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn another_users_directory_or_file_is_refused() {
        if !wpd_test_skip::require_root("giving a file to another uid") {
            return;
        }
        let t = Tmp::new("owner");
        StateDir::open(&t.0).unwrap();
        let f = t.0.join("watchpoints.pb");
        replace(&f, b"x").unwrap();
        std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
        let e = StateDir::open(&t.0).unwrap_err();
        assert!(
            matches!(e, StateDirError::Owner { owner: 65534, .. }),
            "{e}"
        );
        std::os::unix::fs::chown(&f, Some(0), None).unwrap();
        std::os::unix::fs::chown(&t.0, Some(65534), None).unwrap();
        let e = StateDir::open(&t.0).unwrap_err();
        assert!(
            matches!(e, StateDirError::Owner { owner: 65534, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("uid 65534"), "{e}");
    }

    /// A symbolic link above the state directory is followed only if it
    /// is root's or the daemon's user's (another user could repoint it),
    /// and what it points to is checked as any directory above is.
    #[test]
    fn a_link_above_the_directory_must_be_safe_too() {
        if !wpd_test_skip::require_root("giving a link to another uid") {
            return;
        }
        let t = Tmp::new("linkabove");
        let real = t.0.join("real");
        std::fs::create_dir_all(&real).unwrap();
        std::fs::set_permissions(&t.0, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = t.0.join("lnk");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        // Root's own link: followed, and the directory made behind it.
        StateDir::open(&link.join("sub")).unwrap();
        assert!(real.join("sub").is_dir());
        // Another user's link to the same place: refused, naming the link.
        std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
        let e = StateDir::open(&link.join("sub2")).unwrap_err();
        assert!(
            matches!(&e, StateDirError::UnsafeAncestor { path, why }
                if path == &link && why.contains("symbolic link of uid 65534")),
            "{e}"
        );
        assert!(!real.join("sub2").exists(), "nothing made behind it");
        // A link of root's to a directory another user may write: refused
        // there.
        std::os::unix::fs::lchown(&link, Some(0), Some(0)).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = StateDir::open(&link.join("sub3")).unwrap_err();
        assert!(
            matches!(&e, StateDirError::UnsafeAncestor { path, .. } if path == &real),
            "{e}"
        );
    }

    /// `prepare` (what a daemon does before it holds the lock) looks at
    /// nothing inside the directory and changes nothing there: a file of
    /// another daemon's, left wide, keeps its mode until `check`.
    #[test]
    fn prepare_touches_nothing_inside() {
        let t = Tmp::new("prepare");
        StateDir::open(&t.0).unwrap();
        let f = t.0.join("watchpoints.pb");
        replace(&f, b"x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(&t.0, std::fs::Permissions::from_mode(0o750)).unwrap();
        let d = StateDir::prepare(&t.0).unwrap();
        assert_eq!((mode(&f), mode(&t.0)), (0o644, 0o750));
        d.check().unwrap();
        assert_eq!((mode(&f), mode(&t.0)), (0o600, 0o700));
    }

    #[test]
    fn reads_are_bounded() {
        let t = Tmp::new("bounded");
        StateDir::open(&t.0).unwrap();
        let p = t.0.join("big");
        replace(&p, &[7u8; 1000]).unwrap();
        assert_eq!(read(&p, 1000).unwrap().unwrap().len(), 1000);
        let e = read(&p, 999).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(read(&t.0.join("absent"), 10).unwrap().is_none());
    }

    #[test]
    fn an_ancestor_others_can_write_is_refused_unless_sticky() {
        let t = Tmp::new("ancestor");
        let open_dir = t.0.join("open");
        std::fs::create_dir_all(&open_dir).unwrap();
        std::fs::set_permissions(&t.0, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = StateDir::open(&open_dir.join("state")).unwrap_err();
        assert!(matches!(e, StateDirError::UnsafeAncestor { .. }), "{e}");
        std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        StateDir::open(&open_dir.join("state")).unwrap();
    }
}
