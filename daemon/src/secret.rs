//! Secrets the daemon reads from files (its bearer token, the export's
//! token or password): refused when another user could read or change
//! them, read with a size limit, never logged.
//!
//! A secret file must belong to the daemon's effective uid or to root, be
//! a regular file (not followed through a link), and give no permission to
//! its group or to others (`chmod 600`), as ssh requires of its keys.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Largest secret file read.
pub const MAX_SECRET_BYTES: u64 = 64 << 10;

/// Why a secret file is refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Cannot be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Readable or writable by others.
    #[error(
        "{path} is mode {mode:04o}: a secret file must give its group and others no access \
         (chmod 600 {path})"
    )]
    Open { path: PathBuf, mode: u32 },
    /// Owned by another user.
    #[error(
        "{path} belongs to uid {owner}: a secret file must be the daemon's (uid {euid}) or root's"
    )]
    Owner {
        path: PathBuf,
        owner: u32,
        euid: u32,
    },
    /// Not a regular file, too large, empty or not text.
    #[error("{path}: {why}")]
    Content { path: PathBuf, why: &'static str },
}

/// A secret: its bytes are never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// Reads the secret in `path` (surrounding white space trimmed) after the
/// module's checks.
pub fn read(path: &Path) -> Result<Secret, SecretError> {
    let io = |source| SecretError::Io {
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    let meta = f.metadata().map_err(io)?;
    let content = |why| SecretError::Content {
        path: path.to_path_buf(),
        why,
    };
    if !meta.is_file() {
        return Err(content("not a regular file"));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != euid && meta.uid() != 0 {
        return Err(SecretError::Owner {
            path: path.to_path_buf(),
            owner: meta.uid(),
            euid,
        });
    }
    if meta.mode() & 0o077 != 0 {
        return Err(SecretError::Open {
            path: path.to_path_buf(),
            mode: meta.mode() & 0o7777,
        });
    }
    let mut buf = Vec::new();
    f.take(MAX_SECRET_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(io)?;
    if buf.len() as u64 > MAX_SECRET_BYTES {
        return Err(content("larger than 64 KiB"));
    }
    let s = String::from_utf8(buf).map_err(|_| content("not UTF-8 text"))?;
    let s = s.trim();
    if s.is_empty() {
        return Err(content("empty"));
    }
    Ok(Secret(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_private_files_of_ours_are_read() {
        let d = std::env::temp_dir().join(format!("wpd-secret-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("token");
        std::fs::write(&p, " s3cret\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&p).unwrap().expose(), "s3cret");
        assert_eq!(format!("{:?}", read(&p).unwrap()), "Secret(6 bytes)");
        for mode in [0o640, 0o604, 0o660] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = read(&p).unwrap_err();
            assert!(matches!(e, SecretError::Open { .. }), "{mode:o}: {e}");
            assert!(e.to_string().contains("chmod 600"), "{e}");
        }
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(matches!(read(&link), Err(SecretError::Io { .. })));
        std::fs::write(&p, "\n").unwrap();
        assert!(matches!(read(&p), Err(SecretError::Content { .. })));
        if wpd_test_skip::require_root("giving a secret file to another uid") {
            std::fs::write(&p, "x").unwrap();
            std::os::unix::fs::chown(&p, Some(65534), None).unwrap();
            assert!(matches!(
                read(&p),
                Err(SecretError::Owner { owner: 65534, .. })
            ));
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
