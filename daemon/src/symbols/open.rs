//! Opening the files the symbol layer reads (a process's module files and
//! their separate debug files): regular files only, opened without
//! blocking and without following a link out of where they are looked for;
//! anything else is refused with an [`OpenError`] saying why.
//!
//! Every file is first opened `O_PATH` (which never calls a driver's or a
//! FIFO's `open` and never blocks on one), its type checked with `fstat`,
//! and only a regular file is then opened for reading, through
//! `/proc/self/fd/N` of that `O_PATH` descriptor (the same inode, whatever
//! was renamed over the path meanwhile), `O_RDONLY | O_NONBLOCK |
//! O_CLOEXEC | O_NOCTTY`. So a FIFO, a socket or a device node is never
//! opened for reading at all, and an `open` that would wait for a writer
//! cannot happen.
//!
//! Where a directory bounds the lookup (a debug directory, the directory of
//! a module), the name is resolved by `openat2(2)` from that directory with
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` (and `RESOLVE_NO_SYMLINKS`
//! where the directory belongs to the process's owner), so that `..` or a
//! link cannot lead out of it; a kernel without `openat2` (before 5.6, or a
//! seccomp filter refusing it) gets the same refusals from a walk of the
//! name one component at a time, following no link at all.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

/// The largest separate debug file read: 4 GiB. A debug file is read whole
/// to check its CRC, so a larger one (a sparse file claiming terabytes)
/// would cost minutes of CPU; the debug information of the largest
/// programs (a browser, a compiler) stays below this.
pub const MAX_DEBUG_FILE_BYTES: u64 = 4 << 30;

/// What a file that is not a regular file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A named pipe.
    Fifo,
    /// A Unix socket.
    Socket,
    /// A character device node.
    CharDevice,
    /// A block device node.
    BlockDevice,
    /// A directory.
    Directory,
    /// A symbolic link (not followed).
    Symlink,
    /// Another type (`st_mode` & `S_IFMT`).
    Other(u32),
}

impl FileKind {
    /// The kind of a file of mode `mode`; `None` for a regular file.
    pub fn of(mode: u32) -> Option<FileKind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => return None,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            libc::S_IFDIR => FileKind::Directory,
            libc::S_IFLNK => FileKind::Symlink,
            other => FileKind::Other(other),
        })
    }
}

impl std::fmt::Display for FileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileKind::Fifo => f.write_str("a FIFO"),
            FileKind::Socket => f.write_str("a socket"),
            FileKind::CharDevice => f.write_str("a character device"),
            FileKind::BlockDevice => f.write_str("a block device"),
            FileKind::Directory => f.write_str("a directory"),
            FileKind::Symlink => f.write_str("a symbolic link"),
            FileKind::Other(m) => write!(f, "a file of type {m:o}"),
        }
    }
}

/// Why a file was not opened, or not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Not a regular file: never opened for reading.
    #[error("{path} is {kind}, not a regular file: not opened")]
    NotRegular {
        /// The file.
        path: String,
        /// What it is.
        kind: FileKind,
    },
    /// Its name leads out of the directory it is looked for in (`..`, an
    /// absolute link, a link where none is followed, a mount point's
    /// magic link).
    #[error("{path} leads out of {dir} (through `..` or a link): not followed")]
    Escapes {
        /// The file.
        path: String,
        /// The directory bounding the lookup.
        dir: String,
    },
    /// A debug file larger than [`MAX_DEBUG_FILE_BYTES`].
    #[error("{path} has {size} bytes, more than the {max} read of a debug file: not read")]
    TooLarge {
        /// The file.
        path: String,
        /// Its size.
        size: u64,
        /// The bound.
        max: u64,
    },
    /// Not the file the process maps (replaced since it was mapped).
    #[error("{path} is not the file the process maps (replaced since)")]
    NotMapped {
        /// The file.
        path: String,
    },
    /// A `.gnu_debuglink` name that is not a file name.
    #[error(
        "the debug link names {name:?}, which is not a file name (a debug link names a file \
         looked for beside the module, in its .debug/ and in the debug directories: no `/`, \
         not `.` or `..`): not looked for"
    )]
    BadLinkName {
        /// The name, as stored (lossily decoded).
        name: String,
    },
    /// The system refused.
    #[error("cannot open {path}: {errno}")]
    Io {
        /// The file.
        path: String,
        /// What the system said.
        errno: Errno,
    },
}

impl OpenError {
    /// The file is not there (a candidate that does not exist is no
    /// refusal).
    pub fn is_absent(&self) -> bool {
        matches!(
            self,
            OpenError::Io {
                errno: Errno::ENOENT | Errno::ENOTDIR,
                ..
            }
        )
    }
}

fn io(path: &Path, errno: Errno) -> OpenError {
    OpenError::Io {
        path: path.display().to_string(),
        errno,
    }
}

/// A checked file open for reading, and what `fstat` said of it.
#[derive(Debug)]
pub struct Opened {
    /// Open `O_RDONLY | O_NONBLOCK | O_CLOEXEC`.
    pub file: File,
    /// Its device.
    pub dev: u64,
    /// Its inode.
    pub ino: u64,
    /// Its size.
    pub size: u64,
}

/// How links are treated beneath a bounding directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Links that stay beneath the directory are followed (the debug
    /// directories, root's: `.build-id/xx/….debug` is often a relative
    /// link to the debug file).
    Beneath,
    /// No link is followed (a directory the process's owner controls).
    None,
}

/// The `O_PATH` descriptor `fd` (of `shown`), checked to be a regular file
/// and only then opened for reading.
fn reopen(fd: OwnedFd, shown: &Path) -> Result<Opened, OpenError> {
    let st = nix::sys::stat::fstat(fd.as_fd()).map_err(|e| io(shown, e))?;
    if let Some(kind) = FileKind::of(st.st_mode) {
        return Err(OpenError::NotRegular {
            path: shown.display().to_string(),
            kind,
        });
    }
    // The same inode as `fd`, whatever the path names now.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| {
            io(
                shown,
                Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
            )
        })?;
    let md = file.metadata().map_err(|e| {
        io(
            shown,
            Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        )
    })?;
    if md.dev() != st.st_dev || md.ino() != st.st_ino || !md.file_type().is_file() {
        return Err(OpenError::NotMapped {
            path: shown.display().to_string(),
        });
    }
    Ok(Opened {
        file,
        dev: md.dev(),
        ino: md.ino(),
        size: md.size(),
    })
}

/// `path`, a regular file, opened for reading; its last component is not
/// followed if it is a link (`O_NOFOLLOW`).
pub fn open_file(path: &Path) -> Result<Opened, OpenError> {
    let fd = nix::fcntl::open(
        path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io(path, e))?;
    reopen(fd, path)
}

/// `path`, a magic link of `/proc` (`/proc/PID/map_files/…`), followed to
/// the file it stands for, which must be a regular file.
pub fn open_magic(path: &Path) -> Result<Opened, OpenError> {
    let fd = nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| io(path, e))?;
    reopen(fd, path)
}

/// A directory, to look names up beneath it (`O_PATH`: not opened for
/// reading).
pub fn open_dir(path: &Path) -> Result<OwnedFd, OpenError> {
    nix::fcntl::open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io(path, e))
}

/// `rel`, resolved beneath the directory `dir` (open at `dir_path`), a
/// regular file, opened for reading. `..`, an absolute name, a link out of
/// `dir` (any link, with [`Links::None`]) and `/proc`'s magic links are
/// refused.
pub fn open_beneath(
    dir: &OwnedFd,
    dir_path: &Path,
    rel: &Path,
    links: Links,
) -> Result<Opened, OpenError> {
    let shown = dir_path.join(rel);
    let escapes = || OpenError::Escapes {
        path: shown.display().to_string(),
        dir: dir_path.display().to_string(),
    };
    if rel.is_absolute() || rel.components().any(|c| c == Component::ParentDir) {
        return Err(escapes());
    }
    let mut resolve = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS;
    let mut flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
    if links == Links::None {
        // A link as the last component is then opened as the link it is,
        // and refused as such.
        resolve |= ResolveFlag::RESOLVE_NO_SYMLINKS;
        flags |= OFlag::O_NOFOLLOW;
    }
    let how = OpenHow::new().flags(flags).resolve(resolve);
    let fd = match nix::fcntl::openat2(dir.as_fd(), rel, how) {
        Ok(fd) => fd,
        Err(Errno::EXDEV) => return Err(escapes()),
        Err(Errno::ELOOP) => return Err(escapes()),
        Err(Errno::ENOSYS | Errno::EPERM) => walk(dir, rel).map_err(|e| match e {
            Errno::ELOOP => escapes(),
            e => io(&shown, e),
        })?,
        Err(e) => return Err(io(&shown, e)),
    };
    reopen(fd, &shown)
}

/// Without `openat2`: `rel` resolved from `dir` one component at a time,
/// following no link (`ELOOP` for one, the last component included, which
/// `reopen` would see as one anyway).
fn walk(dir: &OwnedFd, rel: &Path) -> Result<OwnedFd, Errno> {
    let parts: Vec<&OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p),
            _ => None,
        })
        .collect();
    let mut at: Option<OwnedFd> = None;
    for (i, p) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let mut flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        if !last {
            flags |= OFlag::O_DIRECTORY;
        }
        let from = at.as_ref().unwrap_or(dir);
        let fd = nix::fcntl::openat(from.as_fd(), *p, flags, Mode::empty())?;
        if !last {
            let st = nix::sys::stat::fstat(fd.as_fd())?;
            if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                return Err(Errno::ELOOP);
            }
        } else if nix::sys::stat::fstat(fd.as_fd())?.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Err(Errno::ELOOP);
        }
        at = Some(fd);
    }
    at.ok_or(Errno::ENOENT)
}

/// A `.gnu_debuglink` name, checked to be a file name: not empty, no `/`,
/// not `.` or `..` (an absolute name would make every candidate the same
/// path anywhere, and `dir/sub/name` or `..` would look outside the
/// directories searched).
pub fn link_name(name: &[u8]) -> Result<&OsStr, OpenError> {
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) || name == b"." || name == b".."
    {
        return Err(OpenError::BadLinkName {
            name: String::from_utf8_lossy(name).into_owned(),
        });
    }
    Ok(OsStr::from_bytes(name))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    /// A directory of its own under the temporary directory, removed on
    /// drop.
    pub(crate) struct Scratch(pub std::path::PathBuf);

    impl Scratch {
        pub(crate) fn new(tag: &str) -> Scratch {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let d = std::env::temp_dir().join(format!("wpd-open-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    pub(crate) fn mkfifo(p: &Path) {
        nix::unistd::mkfifo(p, Mode::from_bits_truncate(0o644)).unwrap();
    }

    /// Runs `f` on a thread of its own, failing (not hanging) when it does
    /// not return within 10 s: a FIFO opened for reading waits for a writer.
    pub(crate) fn within<T: Send + 'static>(
        what: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{what}: blocked for 10 s"))
    }

    #[test]
    fn a_regular_file_opens_for_reading() {
        let s = Scratch::new("reg");
        let p = s.0.join("f");
        std::fs::write(&p, b"abc").unwrap();
        let o = open_file(&p).unwrap();
        assert_eq!(o.size, 3);
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!((o.dev, o.ino), (md.dev(), md.ino()));
        let fl = nix::fcntl::fcntl(o.file.as_fd(), nix::fcntl::FcntlArg::F_GETFL).unwrap();
        let fl = OFlag::from_bits_truncate(fl);
        assert!(fl.contains(OFlag::O_NONBLOCK), "{fl:?}");
        let fd = nix::fcntl::fcntl(o.file.as_fd(), nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_ne!(fd & libc::FD_CLOEXEC, 0, "close-on-exec");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let s = Scratch::new("fifo");
        let p = s.0.join("dl.debug");
        mkfifo(&p);
        let q = p.clone();
        let e = within("open of a FIFO", move || open_file(&q)).unwrap_err();
        assert_eq!(
            e,
            OpenError::NotRegular {
                path: p.display().to_string(),
                kind: FileKind::Fifo
            }
        );
        assert!(
            e.to_string().contains("is a FIFO, not a regular file"),
            "{e}"
        );
        let dir = open_dir(&s.0).unwrap();
        let e = within("open of a FIFO beneath", move || {
            open_beneath(&dir, Path::new("/x"), Path::new("dl.debug"), Links::None)
        })
        .unwrap_err();
        assert!(
            matches!(
                e,
                OpenError::NotRegular {
                    kind: FileKind::Fifo,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn devices_directories_and_sockets_are_refused() {
        let e = open_file(Path::new("/dev/null")).unwrap_err();
        assert!(
            matches!(
                e,
                OpenError::NotRegular {
                    kind: FileKind::CharDevice,
                    ..
                }
            ),
            "{e:?}"
        );
        let s = Scratch::new("kinds");
        let e = open_file(&s.0).unwrap_err();
        assert!(
            matches!(
                e,
                OpenError::NotRegular {
                    kind: FileKind::Directory,
                    ..
                }
            ),
            "{e:?}"
        );
        let sock = s.0.join("sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let e = open_file(&sock).unwrap_err();
        assert!(
            matches!(
                e,
                OpenError::NotRegular {
                    kind: FileKind::Socket,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn a_link_is_not_followed() {
        let s = Scratch::new("link");
        let target = s.0.join("real");
        std::fs::write(&target, b"x").unwrap();
        let link = s.0.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = open_file(&link).unwrap_err();
        assert!(
            matches!(
                e,
                OpenError::NotRegular {
                    kind: FileKind::Symlink,
                    ..
                }
            ),
            "{e:?}"
        );
        // A link to a device is refused as a link, the device never opened.
        let dev = s.0.join("null");
        std::os::unix::fs::symlink("/dev/null", &dev).unwrap();
        assert!(matches!(
            open_file(&dev).unwrap_err(),
            OpenError::NotRegular {
                kind: FileKind::Symlink,
                ..
            }
        ));
        // Beneath a directory: no link at all for Links::None; for
        // Links::Beneath, one that stays inside, not one that leaves.
        let dir = open_dir(&s.0).unwrap();
        let e = open_beneath(&dir, &s.0, Path::new("link"), Links::None).unwrap_err();
        assert!(
            matches!(
                e,
                OpenError::NotRegular {
                    kind: FileKind::Symlink,
                    ..
                }
            ),
            "{e:?}"
        );
        std::os::unix::fs::symlink("real", s.0.join("rel")).unwrap();
        assert!(open_beneath(&dir, &s.0, Path::new("rel"), Links::Beneath).is_ok());
        assert!(matches!(
            open_beneath(&dir, &s.0, Path::new("rel"), Links::None).unwrap_err(),
            OpenError::NotRegular {
                kind: FileKind::Symlink,
                ..
            }
        ));
        // A link as a directory on the way is refused too.
        std::os::unix::fs::symlink(".", s.0.join("here")).unwrap();
        assert!(matches!(
            open_beneath(&dir, &s.0, Path::new("here/real"), Links::None).unwrap_err(),
            OpenError::Escapes { .. }
        ));
        assert!(open_beneath(&dir, &s.0, Path::new("here/real"), Links::Beneath).is_ok());
        let e = open_beneath(&dir, &s.0, Path::new("link"), Links::Beneath).unwrap_err();
        assert!(
            matches!(e, OpenError::Escapes { .. }),
            "absolute link: {e:?}"
        );
        std::fs::create_dir(s.0.join("sub")).unwrap();
        std::os::unix::fs::symlink("../../etc/passwd", s.0.join("sub/up")).unwrap();
        let e = open_beneath(&dir, &s.0, Path::new("sub/up"), Links::Beneath).unwrap_err();
        assert!(matches!(e, OpenError::Escapes { .. }), "link up: {e:?}");
        for bad in ["../x", "/etc/passwd", "sub/../../x"] {
            let e = open_beneath(&dir, &s.0, Path::new(bad), Links::Beneath).unwrap_err();
            assert!(matches!(e, OpenError::Escapes { .. }), "{bad}: {e:?}");
        }
        // The walk used without openat2 refuses the same.
        assert_eq!(walk(&dir, Path::new("link")).unwrap_err(), Errno::ELOOP);
        assert_eq!(walk(&dir, Path::new("sub/up")).unwrap_err(), Errno::ELOOP);
        assert!(walk(&dir, Path::new("real")).is_ok());
        // A missing candidate is no refusal.
        assert!(
            open_beneath(&dir, &s.0, Path::new("none"), Links::None)
                .unwrap_err()
                .is_absent()
        );
    }

    #[test]
    fn a_debug_link_name_is_a_file_name() {
        assert_eq!(link_name(b"dl.debug").unwrap(), OsStr::new("dl.debug"));
        assert_eq!(
            link_name(b".hidden.debug").unwrap(),
            OsStr::new(".hidden.debug")
        );
        for bad in [
            &b"/home/u/dl.debug"[..],
            b"sub/dl.debug",
            b"..",
            b".",
            b"",
            b"../dl.debug",
            b"a\0b",
        ] {
            let e = link_name(bad).unwrap_err();
            assert!(matches!(e, OpenError::BadLinkName { .. }), "{bad:?}");
        }
        assert!(
            link_name(b"/tmp/f")
                .unwrap_err()
                .to_string()
                .contains("\"/tmp/f\", which is not a file name"),
        );
    }
}
