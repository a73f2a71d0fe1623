//! Errors of `wpctl` and how each maps to a one-line message and an exit code.
//!
//! Three kinds of failure are kept apart: the daemon could not be reached
//! (transport), the daemon answered with a non-OK status (the server said no),
//! and local failures such as writing to a closed stdout.

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::io;

use serde_json::{Value, json};
use tonic::Code;
use tonic_types::StatusExt;
use wpd_proto::code_name;
use wpd_proto::text::escape;

/// Process exit codes. Documented in `wpctl --help` (see `EXIT_CODES_HELP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Success (also: stdout was closed by the reader).
    Ok = 0,
    /// Any other error reported by the daemon, or a local failure.
    Other = 1,
    /// Bad command line (clap's own exit code).
    Usage = 2,
    /// The daemon could not be reached.
    Unreachable = 3,
    /// The daemon rejected an argument.
    InvalidArgument = 4,
    /// No such process, thread or watchpoint.
    NotFound = 5,
    /// Out of debug-register slots or over a limit.
    ResourceExhausted = 6,
    /// Not allowed.
    PermissionDenied = 7,
    /// Wrong state for the request, or not supported.
    Precondition = 8,
    /// Several endpoints: some failed and others did not, or they failed
    /// in different ways.
    Partial = 9,
}

/// The exit-code table printed at the end of `wpctl --help`.
pub const EXIT_CODES_HELP: &str = "\
Exit status:
  0  success
  1  other error reported by the daemon (internal, aborted, timed out, ...)
  2  usage error (bad command line)
  3  cannot reach the daemon (not running, wrong --endpoint, connection lost)
  4  invalid argument (rejected by the daemon)
  5  not found (process, thread or watchpoint)
  6  resource exhausted (no free debug-register slot, limits)
  7  permission denied
  8  failed precondition or unimplemented (e.g. not attached, backend unusable)
  9  several endpoints: some failed (each named on stderr) while others succeeded, or they
     failed in different ways; when every endpoint fails the same way, that failure's code";

/// Exit code for a gRPC status code returned by the daemon.
pub fn exit_for_code(code: Code) -> Exit {
    match code {
        Code::Ok => Exit::Ok,
        Code::Unavailable => Exit::Unreachable,
        Code::InvalidArgument | Code::OutOfRange => Exit::InvalidArgument,
        Code::NotFound => Exit::NotFound,
        Code::ResourceExhausted => Exit::ResourceExhausted,
        Code::PermissionDenied | Code::Unauthenticated => Exit::PermissionDenied,
        Code::FailedPrecondition | Code::Unimplemented => Exit::Precondition,
        Code::Cancelled
        | Code::Unknown
        | Code::DeadlineExceeded
        | Code::AlreadyExists
        | Code::Aborted
        | Code::Internal
        | Code::DataLoss => Exit::Other,
    }
}

/// A failed `wpctl` run.
#[derive(Debug)]
pub enum Error {
    /// Nobody answered at the endpoint, or the connection broke.
    Unreachable {
        /// The endpoint as given (e.g. `unix:/run/wpd/wpd.sock`).
        endpoint: String,
        /// What went wrong, from the transport's error chain.
        detail: String,
    },
    /// The daemon did not answer a unary call in time.
    Timeout {
        /// The endpoint as given.
        endpoint: String,
        /// The `--timeout` that elapsed, in seconds.
        secs: f64,
    },
    /// The daemon answered with an error status.
    Status {
        /// The endpoint as given.
        endpoint: String,
        /// The status, with its message and any error details.
        status: tonic::Status,
    },
    /// The health service answered, but not SERVING.
    NotServing {
        /// The endpoint as given.
        endpoint: String,
        /// The status it answered (`NOT_SERVING`, `UNKNOWN`, `SERVICE_UNKNOWN`).
        status: String,
        /// Why, as the daemon says (`GetStats.degraded`), when it could say.
        why: String,
    },
    /// `--since` asked for a replay from a daemon that keeps no journal.
    NoJournal {
        /// The endpoint as given.
        endpoint: String,
        /// The daemon's refusal.
        status: tonic::Status,
    },
    /// The daemon sent more than wpctl takes: a message over the size
    /// limit, or (several endpoints) an answer that would wait for the
    /// hosts before it beyond what wpctl holds back.
    TooLarge {
        /// The endpoint as given.
        endpoint: String,
        /// How much, and the limit.
        detail: String,
    },
    /// Writing the output failed (a closed pipe is handled quietly).
    Output(io::Error),
    /// A local problem with what was given (e.g. an unreadable token file).
    Local(String),
    /// What a command waited for can no longer come (`wpctl break --wait`:
    /// the process exited, or the breakpoint was removed).
    Gone(String),
}

impl Error {
    /// Wraps a status from a call. A status made on the client side from a
    /// transport failure (tonic attaches that failure as its source; statuses
    /// sent by the daemon have none) counts as unreachable, so its message
    /// names the endpoint.
    pub fn from_status(endpoint: &str, status: tonic::Status) -> Self {
        // tonic refuses a message over the decoding limit before reading it.
        if status.code() == Code::OutOfRange
            && let Some(detail) = status
                .message()
                .strip_prefix("Error, decoded message length too large: ")
        {
            return Error::TooLarge {
                endpoint: endpoint.to_string(),
                detail: format!("a message too large to take ({detail})"),
            };
        }
        let transport_code = matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled
        );
        if transport_code && status.source().is_some() {
            let mut detail = status.message().to_string();
            if let Some(src) = status.source() {
                append_chain(&mut detail, src);
            }
            return Error::Unreachable {
                endpoint: endpoint.to_string(),
                detail,
            };
        }
        // Something answered HTTP, but not gRPC: not the daemon.
        if status.message().starts_with("grpc-status header missing") {
            return Error::Unreachable {
                endpoint: endpoint.to_string(),
                detail: format!(
                    "the server there does not speak gRPC ({})",
                    status.message()
                ),
            };
        }
        Error::Status {
            endpoint: endpoint.to_string(),
            status,
        }
    }

    /// Wraps a refusal to open an event stream: like [`Error::from_status`],
    /// but a daemon without a journal (reason `NO_JOURNAL`) gets its own
    /// message.
    pub fn from_stream_status(endpoint: &str, status: tonic::Status) -> Self {
        let no_journal = status.code() == Code::FailedPrecondition
            && status
                .get_details_error_info()
                .is_some_and(|info| info.reason == wpd_proto::reason::NO_JOURNAL);
        if no_journal {
            return Error::NoJournal {
                endpoint: endpoint.to_string(),
                status,
            };
        }
        Error::from_status(endpoint, status)
    }

    /// Wraps a failure to connect.
    pub fn connect(endpoint: &str, err: &(dyn StdError + 'static)) -> Self {
        let mut detail = String::new();
        append_chain(&mut detail, err);
        Error::Unreachable {
            endpoint: endpoint.to_string(),
            detail,
        }
    }

    /// The process exit code for this error.
    pub fn exit(&self) -> Exit {
        match self {
            Error::Unreachable { .. } => Exit::Unreachable,
            Error::Timeout { .. } => Exit::Other,
            Error::Status { status, .. } => exit_for_code(status.code()),
            Error::NotServing { .. } => Exit::Unreachable,
            Error::NoJournal { .. } => Exit::Precondition,
            Error::TooLarge { .. } => Exit::Other,
            Error::Output(e) if e.kind() == io::ErrorKind::BrokenPipe => Exit::Ok,
            Error::Output(_) => Exit::Other,
            Error::Local(_) => Exit::Usage,
            Error::Gone(_) => Exit::NotFound,
        }
    }

    /// True when nothing should be printed (the reader closed stdout).
    pub fn is_quiet(&self) -> bool {
        matches!(self, Error::Output(e) if e.kind() == io::ErrorKind::BrokenPipe)
    }

    /// The one-line message of a host's failure in a fleet command: as
    /// [`Error::message`], but an unreachable host's line leaves out the
    /// advice to start `wpd` or to fix `--endpoint` (the host is named, and
    /// one such line comes per host).
    pub fn host_message(&self) -> String {
        match self {
            Error::Unreachable { endpoint, detail } if !detail.contains("os error 13") => {
                let detail = if detail.is_empty() {
                    "connection failed"
                } else {
                    detail
                };
                format!("cannot reach wpd at {endpoint}: {}", escape(detail))
            }
            _ => self.message(),
        }
    }

    /// The one-line message (without the `wpctl: ` prefix).
    pub fn message(&self) -> String {
        match self {
            Error::Unreachable { endpoint, detail } => {
                let detail = if detail.is_empty() {
                    "connection failed"
                } else {
                    detail
                };
                let hint = if detail.contains("os error 13") {
                    "is the socket readable and writable by you? (run as root or as a member \
                     of the socket's group)"
                } else {
                    "is the daemon running? Start it with `wpd`, or point --endpoint / \
                     WPD_ENDPOINT at it"
                };
                format!("cannot reach wpd at {endpoint}: {}; {hint}", escape(detail))
            }
            Error::Timeout { endpoint, secs } => format!(
                "wpd at {endpoint} did not answer within {secs} s (raise --timeout to wait longer)"
            ),
            Error::Status { status, .. } => {
                // The daemon's words: one line, and no terminal controls.
                let msg = escape(&single_line(status.message())).into_owned();
                if msg.is_empty() {
                    format!(
                        "the daemon failed the request: {} ({})",
                        status.code().description(),
                        code_name(status.code())
                    )
                } else if status.code() == Code::Unavailable {
                    format!("the daemon is unavailable: {msg}")
                } else {
                    msg
                }
            }
            Error::NotServing {
                endpoint,
                status,
                why,
            } if why.is_empty() => {
                format!("wpd at {endpoint} is not serving (health status {status})")
            }
            Error::NotServing {
                endpoint,
                status,
                why,
            } => format!("wpd at {endpoint} is not serving (health status {status}): {why}"),
            Error::NoJournal { endpoint, .. } => format!(
                "wpd at {endpoint} keeps no event journal, so --since has nothing to replay \
                 (start wpd with --state-dir DIR, or leave out --since for live events)"
            ),
            Error::TooLarge { endpoint, detail } => {
                format!("wpd at {endpoint} sent too much: {}", escape(detail))
            }
            Error::Output(e) => format!("cannot write output: {e}"),
            Error::Local(m) | Error::Gone(m) => m.clone(),
        }
    }

    /// The error as a JSON object, for `--json` mode:
    /// `{"error": {"code", "message", "reason", "exit_code", ...}}`.
    pub fn to_json(&self) -> Value {
        let mut err = json!({
            "code": match self {
                Error::Unreachable { .. } => "UNAVAILABLE",
                Error::Timeout { .. } => "DEADLINE_EXCEEDED",
                Error::Status { status, .. } | Error::NoJournal { status, .. } => {
                    code_name(status.code())
                }
                Error::NotServing { .. } => "UNAVAILABLE",
                Error::TooLarge { .. } => "RESOURCE_EXHAUSTED",
                Error::Output(_) => "INTERNAL",
                Error::Local(_) => "INVALID_ARGUMENT",
                Error::Gone(_) => "NOT_FOUND",
            },
            "message": self.message(),
            "reason": Value::Null,
            "exit_code": self.exit() as u8,
        });
        match self {
            Error::Unreachable { endpoint, .. }
            | Error::Timeout { endpoint, .. }
            | Error::Status { endpoint, .. }
            | Error::NoJournal { endpoint, .. }
            | Error::TooLarge { endpoint, .. } => {
                err["endpoint"] = json!(endpoint);
            }
            Error::NotServing {
                endpoint,
                status,
                why,
            } => {
                err["endpoint"] = json!(endpoint);
                err["health"] = json!(status);
                if !why.is_empty() {
                    err["degraded"] = json!(why);
                }
            }
            Error::Output(_) | Error::Local(_) | Error::Gone(_) => {}
        }
        if let Error::Status { status, .. } | Error::NoJournal { status, .. } = self
            && let Some(info) = status.get_details_error_info()
        {
            err["reason"] = json!(info.reason);
            if !info.domain.is_empty() {
                err["domain"] = json!(info.domain);
            }
            if !info.metadata.is_empty() {
                let mut meta: Vec<_> = info.metadata.iter().collect();
                meta.sort();
                err["metadata"] = meta
                    .into_iter()
                    .map(|(k, v)| (k.clone(), json!(v)))
                    .collect::<serde_json::Map<_, _>>()
                    .into();
            }
        }
        json!({ "error": err })
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Output(e)
    }
}

/// Appends the messages of an error and its sources, `: `-separated, skipping
/// tonic's uninformative "transport error" and repeats.
fn append_chain(out: &mut String, err: &(dyn StdError + 'static)) {
    let mut seen: Vec<String> = out.split(": ").map(str::to_string).collect();
    let mut cur = Some(err);
    while let Some(e) = cur {
        let text = single_line(&e.to_string());
        if !text.is_empty() && text != "transport error" && !seen.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            let _ = write!(out, "{text}");
            seen.push(text);
        }
        cur = e.source();
    }
}

/// Joins the lines of a message so that the error stays on one line.
fn single_line(s: &str) -> String {
    s.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use tonic_types::ErrorDetails;

    fn check(input: Error, expected: Exit) {
        assert_eq!(input.exit(), expected, "exit code for {input:?}");
    }

    fn status(code: Code) -> Error {
        Error::from_status("unix:/x.sock", tonic::Status::new(code, "no"))
    }

    #[test]
    fn status_codes_map_to_exit_codes() {
        check(status(Code::Unknown), Exit::Other);
        check(status(Code::Internal), Exit::Other);
        check(status(Code::Aborted), Exit::Other);
        check(status(Code::AlreadyExists), Exit::Other);
        check(status(Code::DeadlineExceeded), Exit::Other);
        check(status(Code::Cancelled), Exit::Other);
        check(status(Code::DataLoss), Exit::Other);
        check(status(Code::Unavailable), Exit::Unreachable);
        check(status(Code::InvalidArgument), Exit::InvalidArgument);
        check(status(Code::OutOfRange), Exit::InvalidArgument);
        check(status(Code::NotFound), Exit::NotFound);
        check(status(Code::ResourceExhausted), Exit::ResourceExhausted);
        check(status(Code::PermissionDenied), Exit::PermissionDenied);
        check(status(Code::Unauthenticated), Exit::PermissionDenied);
        check(status(Code::FailedPrecondition), Exit::Precondition);
        check(status(Code::Unimplemented), Exit::Precondition);
    }

    #[test]
    fn local_failures_map_to_exit_codes() {
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "Connection refused");
        check(Error::connect("tcp://h:1", &refused), Exit::Unreachable);
        check(
            Error::Timeout {
                endpoint: "unix:/x".into(),
                secs: 30.0,
            },
            Exit::Other,
        );
        check(
            Error::Output(io::Error::from(io::ErrorKind::BrokenPipe)),
            Exit::Ok,
        );
        check(
            Error::Output(io::Error::from(io::ErrorKind::StorageFull)),
            Exit::Other,
        );
        // A transport failure surfacing as a status during the call.
        let broken = {
            let mut s = tonic::Status::unavailable("connection error");
            s.set_source(std::sync::Arc::new(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "reset by peer",
            )));
            s
        };
        // Statuses sent by the daemon carry no source; client-made ones do.
        check(status(Code::Unknown), Exit::Other);
        let mut lost = tonic::Status::unknown("h2 protocol error: connection reset");
        lost.set_source(std::sync::Arc::new(io::Error::from(
            io::ErrorKind::ConnectionReset,
        )));
        check(Error::from_status("unix:/x.sock", lost), Exit::Unreachable);
        let not_grpc = tonic::Status::unimplemented(
            "grpc-status header missing, mapped from HTTP status code 404",
        );
        check(
            Error::from_status("tcp://h:80", not_grpc),
            Exit::Unreachable,
        );
        let e = Error::from_status("unix:/x.sock", broken);
        check(
            Error::from_status("unix:/x.sock", tonic::Status::ok("")),
            Exit::Ok,
        );
        assert!(
            e.message()
                .starts_with("cannot reach wpd at unix:/x.sock: connection error: reset by peer;"),
            "{}",
            e.message()
        );
        check(e, Exit::Unreachable);
    }

    #[test]
    fn transport_message_names_endpoint_and_wpd() {
        let enoent = io::Error::from_raw_os_error(2);
        let msg = Error::connect("unix:/run/wpd/wpd.sock", &enoent).message();
        assert!(msg.starts_with("cannot reach wpd at unix:/run/wpd/wpd.sock: "));
        assert!(msg.contains("os error 2"));
        assert!(msg.contains("`wpd`"));
        assert!(!msg.contains('\n'));
        let eacces = io::Error::from_raw_os_error(13);
        let msg = Error::connect("unix:/run/wpd/wpd.sock", &eacces).message();
        assert!(msg.contains("socket's group"), "{msg}");
    }

    #[test]
    fn replay_without_a_journal_and_health_have_their_own_lines() {
        let mut details = ErrorDetails::new();
        details.set_error_info(wpd_proto::reason::NO_JOURNAL, "wpd.v1", HashMap::new());
        let refused = tonic::Status::with_error_details(
            Code::FailedPrecondition,
            "no journal (wpd --state-dir none)",
            details,
        );
        let e = Error::from_stream_status("tcp://h:1", refused);
        assert!(matches!(e, Error::NoJournal { .. }), "{e:?}");
        assert!(
            e.message()
                .starts_with("wpd at tcp://h:1 keeps no event journal, so --since"),
            "{}",
            e.message()
        );
        let v = e.to_json();
        assert_eq!(v["error"]["reason"], wpd_proto::reason::NO_JOURNAL);
        assert_eq!(v["error"]["code"], "FAILED_PRECONDITION");
        check(e, Exit::Precondition);
        // Another precondition is passed through as the daemon said it.
        let other = Error::from_stream_status(
            "tcp://h:1",
            tonic::Status::failed_precondition("not attached"),
        );
        assert_eq!(other.message(), "not attached");

        let e = Error::NotServing {
            endpoint: "unix:/run/wpd/wpd.sock".into(),
            status: "NOT_SERVING".into(),
            why: String::new(),
        };
        assert_eq!(
            e.message(),
            "wpd at unix:/run/wpd/wpd.sock is not serving (health status NOT_SERVING)"
        );
        assert_eq!(e.to_json()["error"]["health"], "NOT_SERVING");
        check(e, Exit::Unreachable);
        let e = Error::NotServing {
            endpoint: "unix:/run/wpd/wpd.sock".into(),
            status: "NOT_SERVING".into(),
            why: "out of file descriptors".into(),
        };
        assert_eq!(
            e.message(),
            "wpd at unix:/run/wpd/wpd.sock is not serving (health status NOT_SERVING): out of \
             file descriptors"
        );
        assert_eq!(e.to_json()["error"]["degraded"], "out of file descriptors");
    }

    #[test]
    fn host_lines_leave_out_the_advice() {
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        let e = Error::connect("https://10.0.0.1:7070", &refused);
        assert_eq!(
            e.host_message(),
            format!("cannot reach wpd at https://10.0.0.1:7070: {refused}")
        );
        assert!(e.message().contains("`wpd`"));
        let eacces = io::Error::from_raw_os_error(13);
        let e = Error::connect("unix:/run/wpd/wpd.sock", &eacces);
        assert_eq!(e.host_message(), e.message());
    }

    #[test]
    fn server_message_is_printed_as_is_on_one_line() {
        let e = Error::from_status(
            "unix:/x",
            tonic::Status::resource_exhausted(
                "no free slot on tid 124 (slots: #7, #8, foreign, foreign)\nretry later",
            ),
        );
        assert_eq!(
            e.message(),
            "no free slot on tid 124 (slots: #7, #8, foreign, foreign); retry later"
        );
        let empty = Error::from_status("unix:/x", tonic::Status::new(Code::Internal, ""));
        assert!(empty.message().contains("INTERNAL"));
    }

    #[test]
    fn json_error_carries_reason_and_metadata() {
        let mut details = ErrorDetails::new();
        details.set_error_info(
            wpd_proto::reason::OUT_OF_SLOTS,
            "wpd.v1",
            HashMap::from([("tids".to_string(), "124,125".to_string())]),
        );
        let s = tonic::Status::with_error_details(
            Code::ResourceExhausted,
            "tids 124,125 have no free slot",
            details,
        );
        let v = Error::from_status("unix:/x", s).to_json();
        assert_eq!(v["error"]["code"], "RESOURCE_EXHAUSTED");
        assert_eq!(v["error"]["reason"], wpd_proto::reason::OUT_OF_SLOTS);
        assert_eq!(v["error"]["message"], "tids 124,125 have no free slot");
        assert_eq!(v["error"]["metadata"]["tids"], "124,125");
        assert_eq!(v["error"]["exit_code"], 6);

        let plain = Error::from_status("unix:/x", tonic::Status::not_found("no watchpoint 9"));
        let v = plain.to_json();
        assert_eq!(v["error"]["code"], "NOT_FOUND");
        assert!(v["error"]["reason"].is_null());
    }
}
