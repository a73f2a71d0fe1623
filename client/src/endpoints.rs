//! `--endpoints-file`: the daemons a fleet command talks to, one per line, each
//! optionally named and with its own token (the only one it is sent) and CA.
//!
//! A line is `[NAME] ENDPOINT [token-file=FILE] [tls-ca=FILE]`: `#` starts a
//! comment (at the start of a line or after a blank), blank lines are
//! skipped. The first word is the endpoint when it reads as one (`unix:`,
//! `tcp://`, `http://`, `https://`, `/`, `.`), otherwise it is the host's name
//! and the endpoint follows. Relative option paths are taken from the file's
//! directory.

use std::io::Read;
use std::path::{Path, PathBuf};

use std::str::FromStr;

use wpd_proto::connect::Target;

/// The daemon's address: the text as given (for messages) and its parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// As given on the command line or in WPD_ENDPOINT.
    pub text: String,
    /// Where to connect.
    pub target: Target,
}

impl Default for Endpoint {
    /// The daemon wpctl talks to unless told ([`default_socket`]).
    fn default() -> Self {
        let euid = nix::unistd::geteuid().as_raw();
        let runtime = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from);
        let path = default_socket(
            euid,
            runtime.as_deref(),
            |p| nix::unistd::access(p, nix::unistd::AccessFlags::W_OK).is_ok(),
            |p| p.exists(),
        );
        Endpoint {
            text: format!("unix:{}", path.display()),
            target: Target::Unix(path),
        }
    }
}

/// The socket wpctl uses when no endpoint is given, for effective uid
/// `euid`: root's is the system daemon's; a user's is the system daemon's
/// when it is there and the user may connect to it (`may_connect`: write
/// permission, e.g. through the daemon's group), else the user's own
/// daemon's (`wpd` run by the user listens there, [`wpd_proto::user_socket`])
/// when it is there (`exists`), else the system daemon's when it is there (connecting
/// then says what is refused), else the user's own (nothing runs: the one
/// the user can start).
pub fn default_socket(
    euid: u32,
    runtime_dir: Option<&Path>,
    may_connect: impl Fn(&Path) -> bool,
    exists: impl Fn(&Path) -> bool,
) -> PathBuf {
    let system = PathBuf::from(wpd_proto::DEFAULT_SOCKET);
    if euid == 0 || may_connect(&system) {
        return system;
    }
    let own = wpd_proto::user_socket(euid, runtime_dir);
    if exists(&own) || !exists(&system) {
        own
    } else {
        system
    }
}

impl FromStr for Endpoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        Ok(Endpoint {
            target: s.parse()?,
            text: s.to_string(),
        })
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Most bytes read from an endpoints file (a line per host: thousands of
/// hosts fit).
pub const FILE_LIMIT: u64 = 1 << 20;

/// One line of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The host's name, when the line gives one (it tags the host's output).
    pub name: Option<String>,
    /// Where its daemon listens.
    pub endpoint: Endpoint,
    /// `token-file=`: this host's token (a line never gets `--token-file`'s).
    pub token_file: Option<PathBuf>,
    /// `tls-ca=`: this host's CA instead of `--tls-ca`.
    pub tls_ca: Option<PathBuf>,
    /// 1-based line number, for messages.
    pub line: usize,
}

/// What is wrong with one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// A name and nothing after it.
    #[error("no endpoint after the name {0:?}")]
    MissingEndpoint(String),
    /// The endpoint does not parse.
    #[error("{0}")]
    BadEndpoint(String),
    /// `key=value` with a key we do not know.
    #[error("unknown option {0:?} (expected token-file=FILE or tls-ca=FILE)")]
    UnknownOption(String),
    /// `token-file=` with nothing after it.
    #[error("option {0} has an empty value")]
    EmptyOption(&'static str),
    /// The same option twice on a line.
    #[error("option {0} given twice")]
    RepeatedOption(&'static str),
    /// A word after the endpoint that is not an option.
    #[error("unexpected {0:?} after the endpoint (options are token-file=FILE and tls-ca=FILE)")]
    Unexpected(String),
    /// The first word is an option: the endpoint is missing.
    #[error("the line starts with the option {0:?}: the endpoint comes first")]
    OptionFirst(String),
    /// Two lines with the same name.
    #[error("the name {name:?} is already used on line {first}")]
    DuplicateName {
        /// The name.
        name: String,
        /// Where it was first used.
        first: usize,
    },
}

/// Why the file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// It cannot be read.
    #[error("cannot read endpoints file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A line is wrong.
    #[error("{path}:{line}: {problem}")]
    Line {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        problem: LineError,
    },
    /// Only comments and blank lines.
    #[error("endpoints file {0} lists no endpoint")]
    Empty(String),
    /// Larger than [`FILE_LIMIT`].
    #[error("endpoints file {path} is larger than {limit} bytes")]
    TooLarge {
        /// The file.
        path: String,
        /// [`FILE_LIMIT`].
        limit: u64,
    },
}

/// Reads and parses the file at `path`.
pub fn load(path: &Path) -> Result<Vec<Entry>, FileError> {
    let shown = path.display().to_string();
    let read_err = |source| FileError::Read {
        path: shown.clone(),
        source,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(FILE_LIMIT + 1).read_to_string(&mut text))
        .map_err(read_err)?;
    if text.len() as u64 > FILE_LIMIT {
        return Err(FileError::TooLarge {
            path: shown,
            limit: FILE_LIMIT,
        });
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let entries = parse(&text, base).map_err(|(line, problem)| FileError::Line {
        path: shown.clone(),
        line,
        problem,
    })?;
    if entries.is_empty() {
        return Err(FileError::Empty(shown));
    }
    Ok(entries)
}

/// Parses the file's text; relative option paths are joined to `base`. An
/// error names its 1-based line.
pub fn parse(text: &str, base: &Path) -> Result<Vec<Entry>, (usize, LineError)> {
    let mut entries: Vec<Entry> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let words: Vec<&str> = strip_comment(raw).split_whitespace().collect();
        if words.is_empty() {
            continue;
        }
        let entry = parse_line(&words, base, line).map_err(|e| (line, e))?;
        if let Some(name) = &entry.name
            && let Some(first) = entries.iter().find(|e| e.name.as_ref() == Some(name))
        {
            return Err((
                line,
                LineError::DuplicateName {
                    name: name.clone(),
                    first: first.line,
                },
            ));
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// The line without its comment: `#` at the start or after a blank.
fn strip_comment(line: &str) -> &str {
    let mut prev_blank = true;
    for (i, c) in line.char_indices() {
        if c == '#' && prev_blank {
            return &line[..i];
        }
        prev_blank = c.is_whitespace();
    }
    line
}

/// True when `word` reads as an endpoint rather than a name.
fn looks_like_endpoint(word: &str) -> bool {
    word.starts_with("unix:")
        || word.contains("://")
        || word.starts_with('/')
        || word.starts_with('.')
}

fn parse_line(words: &[&str], base: &Path, line: usize) -> Result<Entry, LineError> {
    let first = words[0];
    if !looks_like_endpoint(first) && first.contains('=') {
        return Err(LineError::OptionFirst(first.to_string()));
    }
    let (name, rest) = if looks_like_endpoint(first) {
        (None, words)
    } else {
        match words.get(1) {
            Some(_) => (Some(first.to_string()), &words[1..]),
            None => return Err(LineError::MissingEndpoint(first.to_string())),
        }
    };
    let endpoint: Endpoint = rest[0].parse().map_err(LineError::BadEndpoint)?;
    let mut entry = Entry {
        name,
        endpoint,
        token_file: None,
        tls_ca: None,
        line,
    };
    for word in &rest[1..] {
        let Some((key, value)) = word.split_once('=') else {
            return Err(LineError::Unexpected(word.to_string()));
        };
        let (slot, key) = match key {
            "token-file" => (&mut entry.token_file, "token-file"),
            "tls-ca" => (&mut entry.tls_ca, "tls-ca"),
            _ => return Err(LineError::UnknownOption(word.to_string())),
        };
        if value.is_empty() {
            return Err(LineError::EmptyOption(key));
        }
        if slot.is_some() {
            return Err(LineError::RepeatedOption(key));
        }
        *slot = Some(base.join(value));
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_socket_is_the_systems_or_the_users_own() {
        use std::path::Path;
        let rt = Some(Path::new("/run/user/1000"));
        let own = Path::new("/run/user/1000/wpd/wpd.sock");
        let system = Path::new(wpd_proto::DEFAULT_SOCKET);
        let pick = |euid, connect: bool, have: &[&Path]| {
            super::default_socket(euid, rt, |_| connect, |p| have.contains(&p))
        };
        // Root: the system's, always.
        assert_eq!(pick(0, false, &[]), system);
        // A user who may connect to the system's daemon: that one.
        assert_eq!(pick(1000, true, &[system, own]), system);
        // One who may not: their own daemon's when it runs.
        assert_eq!(pick(1000, false, &[system, own]), own);
        // Neither runs: their own (the one they can start).
        assert_eq!(pick(1000, false, &[]), own);
        // Only the system's, not theirs to use: that one (connecting says why).
        assert_eq!(pick(1000, false, &[system]), system);
        // No runtime directory: the private one in /tmp.
        assert_eq!(
            super::default_socket(1000, None, |_| false, |_| false),
            Path::new("/tmp/wpd-1000/wpd.sock")
        );
    }

    use super::*;
    use wpd_proto::connect::Target;

    /// (name, endpoint text, token file, CA file) of each entry.
    type Row = (
        Option<&'static str>,
        &'static str,
        Option<&'static str>,
        Option<&'static str>,
    );

    fn check(input: &str, expected: Result<Vec<Row>, (usize, &str)>) {
        let got = parse(input, Path::new("/etc/wpd"));
        match expected {
            Ok(rows) => {
                let got = got.unwrap_or_else(|(l, e)| panic!("{input:?}: line {l}: {e}"));
                let got: Vec<_> = got
                    .iter()
                    .map(|e| {
                        (
                            e.name.clone(),
                            e.endpoint.text.clone(),
                            e.token_file.clone(),
                            e.tls_ca.clone(),
                        )
                    })
                    .collect();
                let want: Vec<_> = rows
                    .iter()
                    .map(|(n, ep, t, c)| {
                        (
                            n.map(String::from),
                            ep.to_string(),
                            t.map(PathBuf::from),
                            c.map(PathBuf::from),
                        )
                    })
                    .collect();
                assert_eq!(got, want, "{input:?}");
            }
            Err((line, part)) => {
                let (l, e) = got.expect_err(input);
                assert_eq!(l, line, "{input:?}: {e}");
                let msg = e.to_string();
                assert!(msg.contains(part), "{input:?}: {msg}");
                assert!(!msg.contains('\n'));
            }
        }
    }

    #[test]
    fn lines_names_and_comments() {
        check(
            "# the farm\n\
             \n\
             host1 tcp://10.0.0.1:7070\n\
             https://h2.example:7070   # unnamed\n\
             \thost-3\thttps://10.0.0.3:7070 \n\
             local unix:/run/wpd/wpd.sock\n\
             /run/wpd/other.sock\n",
            Ok(vec![
                (Some("host1"), "tcp://10.0.0.1:7070", None, None),
                (None, "https://h2.example:7070", None, None),
                (Some("host-3"), "https://10.0.0.3:7070", None, None),
                (Some("local"), "unix:/run/wpd/wpd.sock", None, None),
                (None, "/run/wpd/other.sock", None, None),
            ]),
        );
        // A `#` inside a word is not a comment.
        check(
            "a unix:/tmp/w#1.sock",
            Ok(vec![(Some("a"), "unix:/tmp/w#1.sock", None, None)]),
        );
        check("", Ok(vec![]));
        check("# nothing\n   \n", Ok(vec![]));
    }

    #[test]
    fn options_per_line() {
        check(
            "h1 https://10.0.0.1:7070 token-file=h1.token tls-ca=/pki/ca.pem\n\
             https://10.0.0.2:7070 tls-ca=ca.pem\n",
            Ok(vec![
                (
                    Some("h1"),
                    "https://10.0.0.1:7070",
                    Some("/etc/wpd/h1.token"),
                    Some("/pki/ca.pem"),
                ),
                (None, "https://10.0.0.2:7070", None, Some("/etc/wpd/ca.pem")),
            ]),
        );
        let entries = parse("h tcp://h:1", Path::new(".")).unwrap();
        assert_eq!(entries[0].endpoint.target, Target::Tcp("http://h:1".into()));
        assert_eq!(entries[0].line, 1);
    }

    #[test]
    fn bad_lines_name_their_line() {
        check(
            "ok tcp://a:1\nlonely\n",
            Err((2, "no endpoint after the name \"lonely\"")),
        );
        check("h tcp://nohostport", Err((1, "HOST:PORT")));
        check("h wpd.sock", Err((1, "neither")));
        check("h tcp://a:1 token=x", Err((1, "unknown option")));
        check("h tcp://a:1 token-file=", Err((1, "empty value")));
        check(
            "h tcp://a:1 tls-ca=a tls-ca=b",
            Err((1, "tls-ca given twice")),
        );
        check("h tcp://a:1 extra", Err((1, "unexpected \"extra\"")));
        check("token-file=x tcp://a:1", Err((1, "endpoint comes first")));
        check(
            "a tcp://a:1\n\nb tcp://b:1\na tcp://c:1\n",
            Err((4, "already used on line 1")),
        );
    }

    #[test]
    fn load_reports_the_file() {
        let missing = load(Path::new("/nonexistent/wpd-endpoints"));
        let msg = missing.unwrap_err().to_string();
        assert!(
            msg.starts_with("cannot read endpoints file /nonexistent/wpd-endpoints: "),
            "{msg}"
        );
        let dir = std::env::temp_dir().join(format!("wpctl-endpoints-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("fleet");
        std::fs::write(&file, "# only a comment\n").unwrap();
        let msg = load(&file).unwrap_err().to_string();
        assert!(msg.ends_with("lists no endpoint"), "{msg}");
        std::fs::write(&file, "h1 tcp://a:1\nh2 tcp://b:1 bogus\n").unwrap();
        let msg = load(&file).unwrap_err().to_string();
        assert_eq!(
            msg,
            format!(
                "{}:2: unexpected \"bogus\" after the endpoint (options are token-file=FILE and tls-ca=FILE)",
                file.display()
            )
        );
        std::fs::write(&file, "h1 tcp://a:1 token-file=t\n").unwrap();
        let entries = load(&file).unwrap();
        assert_eq!(entries[0].token_file, Some(dir.join("t")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
