//! Token and CA files, and where a token may be sent.
//!
//! A token file is checked as ssh checks a private key: it must belong to
//! the caller and be closed to its group and to others (`chmod 600`), and it
//! is read with a size limit. The token is held as a [`Token`], whose
//! `Debug` does not show it, and no error message quotes it. A token goes
//! over `tcp://` (plaintext) only to a loopback address: the daemon listens
//! without TLS nowhere else, so a plaintext non-loopback endpoint is either
//! a mistake or someone else's listener.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use wpd_proto::connect::Target;

/// Most bytes read from a token file (a token is at most
/// [`wpd_proto::MAX_TOKEN_LEN`] bytes; the rest is room for blanks).
pub const TOKEN_FILE_LIMIT: u64 = 64 * 1024;

/// Most bytes read from a CA file (a system bundle of every public CA is
/// about 220 KiB).
pub const CA_FILE_LIMIT: u64 = 4 * 1024 * 1024;

/// A bearer token. Its `Debug` shows only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// The token itself, for the `authorization` header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token(<{} bytes, not shown>)", self.0.len())
    }
}

/// Why a token or CA file cannot be used. No message quotes a token.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// It cannot be opened or read.
    #[error("cannot read {kind} file {path}: {source}")]
    Read {
        /// `token` or `CA`.
        kind: &'static str,
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Its group or others may read, write or execute it.
    #[error(
        "token file {path} is open to its group or to others (mode {mode:04o}): a token \
         must be readable by you only; run `chmod 600 {path}`"
    )]
    Shared {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// Another user owns it.
    #[error(
        "token file {path} belongs to uid {owner}, not to you (uid {me}): use a token file \
         of your own (`chown` it, or copy it into a file of yours and `chmod 600` that)"
    )]
    NotOwned {
        /// The file.
        path: String,
        /// Its owner.
        owner: u32,
        /// The caller's effective uid.
        me: u32,
    },
    /// More bytes than any token file needs (e.g. a device or a wrong file).
    #[error(
        "token file {path} holds more than {limit} bytes; wpd accepts tokens of at most {max} \
         bytes"
    )]
    TokenFileTooLarge {
        /// The file.
        path: String,
        /// [`TOKEN_FILE_LIMIT`].
        limit: u64,
        /// [`wpd_proto::MAX_TOKEN_LEN`].
        max: usize,
    },
    /// The token is longer than the daemon accepts.
    #[error(
        "token file {path} holds a {len}-byte token; wpd accepts tokens of at most {max} bytes"
    )]
    TokenTooLong {
        /// The file.
        path: String,
        /// The token's length.
        len: usize,
        /// [`wpd_proto::MAX_TOKEN_LEN`].
        max: usize,
    },
    /// Nothing but blanks.
    #[error("token file {path} is empty")]
    EmptyToken {
        /// The file.
        path: String,
    },
    /// Characters an HTTP header cannot carry (controls, non-ASCII).
    #[error(
        "token file {path} holds characters a header cannot carry (control characters or \
         non-ASCII): a token is printable ASCII"
    )]
    TokenNotAscii {
        /// The file.
        path: String,
    },
    /// A CA file too large to be one.
    #[error("CA file {path} is larger than {limit} bytes: not a PEM certificate file")]
    CaTooLarge {
        /// The file.
        path: String,
        /// [`CA_FILE_LIMIT`].
        limit: u64,
    },
}

/// The caller's effective uid.
fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Reads at most `limit` bytes of `file`; `None` when it holds more.
fn read_bounded(file: &mut impl Read, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::new();
    file.take(limit + 1).read_to_end(&mut buf)?;
    Ok((buf.len() as u64 <= limit).then_some(buf))
}

/// Reads and checks the token file at `path`: the caller's own, mode 0600
/// or narrower (checked on the opened file), at most
/// [`TOKEN_FILE_LIMIT`] bytes, a token of printable ASCII (blanks around it
/// are dropped) of at most [`wpd_proto::MAX_TOKEN_LEN`] bytes.
pub fn read_token(path: &Path) -> Result<Token, FileError> {
    let shown = path.display().to_string();
    let read_err = |source| FileError::Read {
        kind: "token",
        path: shown.clone(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    if meta.is_dir() {
        return Err(read_err(std::io::Error::from(
            std::io::ErrorKind::IsADirectory,
        )));
    }
    let me = euid();
    if meta.uid() != me {
        return Err(FileError::NotOwned {
            path: shown,
            owner: meta.uid(),
            me,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(FileError::Shared { path: shown, mode });
    }
    let Some(bytes) = read_bounded(&mut file, TOKEN_FILE_LIMIT).map_err(read_err)? else {
        return Err(FileError::TokenFileTooLarge {
            path: shown,
            limit: TOKEN_FILE_LIMIT,
            max: wpd_proto::MAX_TOKEN_LEN,
        });
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return Err(FileError::TokenNotAscii { path: shown });
    };
    let token = text.trim();
    if token.is_empty() {
        return Err(FileError::EmptyToken { path: shown });
    }
    if token.len() > wpd_proto::MAX_TOKEN_LEN {
        return Err(FileError::TokenTooLong {
            path: shown,
            len: token.len(),
            max: wpd_proto::MAX_TOKEN_LEN,
        });
    }
    let header: Result<tonic::metadata::MetadataValue<_>, _> = format!("Bearer {token}").parse();
    if header.is_err() {
        return Err(FileError::TokenNotAscii { path: shown });
    }
    Ok(Token(token.to_string()))
}

/// Reads the CA file at `path` (at most [`CA_FILE_LIMIT`] bytes).
pub fn read_ca(path: &Path) -> Result<Vec<u8>, FileError> {
    let shown = path.display().to_string();
    let read_err = |source| FileError::Read {
        kind: "CA",
        path: shown.clone(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(read_err)?;
    read_bounded(&mut file, CA_FILE_LIMIT)
        .map_err(read_err)?
        .ok_or(FileError::CaTooLarge {
            path: shown.clone(),
            limit: CA_FILE_LIMIT,
        })
}

/// Token and CA files, each read once however many hosts use it.
#[derive(Debug, Default)]
pub struct Files {
    tokens: Vec<(PathBuf, Token)>,
    cas: Vec<(PathBuf, Vec<u8>)>,
}

impl Files {
    /// The token in `path` (see [`read_token`]).
    pub fn token(&mut self, path: &Path) -> Result<Token, FileError> {
        if let Some((_, t)) = self.tokens.iter().find(|(p, _)| p == path) {
            return Ok(t.clone());
        }
        let t = read_token(path)?;
        self.tokens.push((path.to_path_buf(), t.clone()));
        Ok(t)
    }

    /// The PEM in `path` (see [`read_ca`]).
    pub fn ca(&mut self, path: &Path) -> Result<Vec<u8>, FileError> {
        if let Some((_, pem)) = self.cas.iter().find(|(p, _)| p == path) {
            return Ok(pem.clone());
        }
        let pem = read_ca(path)?;
        self.cas.push((path.to_path_buf(), pem.clone()));
        Ok(pem)
    }
}

/// The host of a `http://HOST:PORT` URI (IPv6 without its brackets).
fn uri_host(uri: &str) -> Option<String> {
    let uri: tonic::transport::Uri = uri.parse().ok()?;
    let host = uri.host()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some(host.to_string())
}

/// True when `host` is a loopback address (`127.0.0.0/8`, `::1`, an
/// IPv4-mapped loopback) or `localhost`.
pub fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// Why a token must not go to `target`: a plaintext (`tcp://`) endpoint
/// that is not a loopback address. `None` when it may.
pub fn plaintext_refusal(endpoint_text: &str, target: &Target) -> Option<String> {
    let Target::Tcp(uri) = target else {
        return None;
    };
    let host = uri_host(uri);
    if host.as_deref().is_some_and(is_loopback_host) {
        return None;
    }
    let tls = format!("https://{}", uri.strip_prefix("http://").unwrap_or(uri));
    Some(format!(
        "refusing to send the token in plaintext to {endpoint_text}, which is not a loopback \
         address: use {tls} (the daemon's TLS listener), or no token"
    ))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn loopback_hosts() {
        fn check(endpoint: &str, refused: bool) {
            let target: Target = endpoint.parse().unwrap();
            let r = plaintext_refusal(endpoint, &target);
            assert_eq!(r.is_some(), refused, "{endpoint}: {r:?}");
            if let Some(msg) = r {
                assert!(msg.contains("https://"), "{msg}");
                assert!(!msg.contains('\n'));
            }
        }
        check("tcp://127.0.0.1:7070", false);
        check("tcp://127.9.8.7:7070", false);
        check("tcp://localhost:7070", false);
        check("tcp://LOCALHOST:7070", false);
        check("http://[::1]:7070", false);
        check("tcp://[::ffff:127.0.0.1]:7070", false);
        check("tcp://10.0.0.5:7070", true);
        check("tcp://0.0.0.0:7070", true);
        check("tcp://[::]:7070", true);
        check("tcp://wpd.example:7070", true);
        check("tcp://localhost.example:7070", true);
        check("tcp://127.0.0.1.example:7070", true);
        check("https://10.0.0.5:7070", false);
        check("unix:/run/wpd/wpd.sock", false);
        let msg = plaintext_refusal(
            "tcp://10.0.0.5:7070",
            &"tcp://10.0.0.5:7070".parse().unwrap(),
        )
        .unwrap();
        assert!(msg.contains("use https://10.0.0.5:7070 "), "{msg}");
    }

    /// A file in a fresh directory with this text and mode.
    fn file(name: &str, text: &[u8], mode: u32) -> (PathBuf, PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("wpctl-credentials-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        (dir, path)
    }

    #[test]
    fn token_files() {
        let (dir, p) = file("ok", b"  s3cret-token\n", 0o600);
        let t = read_token(&p).unwrap();
        assert_eq!(t.expose(), "s3cret-token");
        assert!(!format!("{t:?}").contains("s3cret"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(read_token(&p).is_ok(), "0400 is private too");
        for mode in [0o644, 0o640, 0o604, 0o660, 0o610] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = read_token(&p).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, FileError::Shared { .. }), "{mode:o}: {msg}");
            assert!(msg.contains(&format!("chmod 600 {}", p.display())), "{msg}");
            assert!(msg.contains(&format!("(mode {mode:04o})")), "{msg}");
            assert!(!msg.contains("s3cret"), "{msg}");
        }
        let _ = std::fs::remove_dir_all(dir);

        let (dir, _) = file("dir", b"", 0o600);
        let msg = read_token(&dir).unwrap_err().to_string();
        assert!(
            msg.starts_with("cannot read token file ") && msg.contains("directory"),
            "{msg}"
        );
        let _ = std::fs::remove_dir_all(dir);

        let (dir, p) = file("empty", b" \n", 0o600);
        assert!(matches!(read_token(&p), Err(FileError::EmptyToken { .. })));
        std::fs::write(&p, "with\x1bescape").unwrap();
        let msg = read_token(&p).unwrap_err().to_string();
        assert!(
            msg.contains("printable ASCII") && !msg.contains("escape"),
            "{msg}"
        );
        std::fs::write(&p, "x".repeat(wpd_proto::MAX_TOKEN_LEN + 1)).unwrap();
        let msg = read_token(&p).unwrap_err().to_string();
        assert!(msg.contains("at most 4096 bytes"), "{msg}");
        std::fs::write(&p, vec![b'x'; TOKEN_FILE_LIMIT as usize + 1]).unwrap();
        let msg = read_token(&p).unwrap_err().to_string();
        assert!(msg.contains("more than 65536 bytes"), "{msg}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn another_users_token_file_is_refused() {
        if !wpd_test_skip::require_root("giving a file to another uid") {
            return;
        }
        let (dir, p) = file("owner", b"tok\n", 0o600);
        std::os::unix::fs::chown(&p, Some(65534), None).unwrap();
        let e = read_token(&p).unwrap_err();
        assert!(matches!(e, FileError::NotOwned { owner: 65534, .. }), "{e}");
        assert!(e.to_string().contains("not to you (uid 0)"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
