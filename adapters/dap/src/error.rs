//! The adapter's errors, each with its own DAP error id (the `id` of the
//! `Message` in an error response's body), so that a client can tell one
//! failure from another without reading the text. The text is the error's
//! `Display`; the ids are stable.
//!
//! | id  | meaning |
//! |-----|---------|
//! | 100 | the request is not one the adapter answers |
//! | 101 | the request's arguments do not fit it |
//! | 102 | `launch`: the program could not be started |
//! | 103 | stepping backwards or jumping (`stepBack`, `reverseContinue`, `goto`) |
//! | 110 | not attached yet (`attach` or `launch` first) |
//! | 111 | attached already (one process per session) |
//! | 112 | a frame id from an earlier stop |
//! | 113 | a `variablesReference` from an earlier stop |
//! | 114 | no such thread |
//! | 115 | `setVariable` of a local of a thread that is running |
//! | 120 | `attach` without a usable pid |
//! | 121 | `attach` with an unknown `backend` |
//! | 122 | `attach` with an unknown `stopOnHit` |
//! | 123 | the process is attached with the other backend already |
//! | 124 | the daemon granted no event lease |
//! | 125 | `pause` with the perf backend, which never stops the target |
//! | 130 | not an address |
//! | 131 | an address plus its offset is out of range |
//! | 132 | `evaluate`: nothing by that name |
//! | 133 | memory that could not be read |
//! | 134 | `setVariable`: a value its type cannot hold, or not a value |
//! | 135 | `setVariable`: a variable that cannot be changed (in a register, optimized out, a register or a hit shown) |
//! | 140 | the daemon refused or failed a call (its message follows) |
//! | 141 | ending the session: some of its breakpoints or threads could not be released |
//! | 142 | the daemon answered without what was asked |
//! | 150 | a `dataId` this adapter did not make |
//! | 151 | a condition that does not parse |
//! | 152 | a hit condition that does not parse |
//! | 153 | an access type x86-64 cannot watch (`read`) or that does not exist |
//! | 154 | a data breakpoint whose name no longer resolves |
//! | 190 | the adapter could not write its answer (a bug) |
//! | 401 | connection refused: the peer is another user than the adapter's |
//! | 402 | connection refused: who the peer is could not be found out |
//! | 403 | connection refused: `--max-sessions` sessions are open already |
//!
//! Errors about one data breakpoint (150–154, and 140 when the daemon
//! refuses it) are its `message` in a `setDataBreakpoints` response, not a
//! failed response.

use serde_json::Value;

use crate::protocol::{IncomingRequest, Response};
use crate::spec::SpecError;

/// An error the adapter answers a request with.
#[derive(Debug, thiserror::Error)]
pub enum DapError {
    /// A command the adapter does not answer.
    #[error("wpctl dap does not support the {0:?} request")]
    UnknownRequest(String),
    /// Arguments that do not fit the request.
    #[error("bad arguments: {0}")]
    BadArguments(String),
    /// `launch`: the program could not be started (nothing is left running).
    #[error("{0}")]
    Launch(String),
    /// Stepping backwards, or a jump.
    #[error("wpd does not step backwards or jump: it steps forwards (next, stepIn, stepOut)")]
    NoStepping,
    /// Not attached yet.
    #[error("not attached: send `attach` with a pid, or `launch`, first")]
    NotAttached,
    /// Attached already.
    #[error("this session is attached already")]
    AlreadyAttached,
    /// A frame from an earlier stop.
    #[error("that frame is from an earlier stop")]
    StaleFrame,
    /// Variables from an earlier stop.
    #[error("those variables are from an earlier stop")]
    StaleVariables,
    /// A thread id that is no thread.
    #[error("no such thread")]
    NoSuchThread,
    /// A local of a thread that runs.
    #[error(
        "thread {0} is running: its locals can be changed while it is held (pause it, or \
         stop it at a breakpoint)"
    )]
    ThreadRunning(i32),
    /// `attach` without a pid.
    #[error("attach needs \"pid\": the id of a running process")]
    BadPid,
    /// `attach` with an unknown backend.
    #[error("backend {0:?}: use \"ptrace\" or \"perf\"")]
    BadBackend(String),
    /// `attach` with an unknown `stopOnHit`.
    #[error("stopOnHit {0:?}: use \"all\" or \"thread\"")]
    BadStopOnHit(String),
    /// The process is attached with another backend.
    #[error(
        "process {pid} is attached with the {actual} backend already: attach with \
         \"backend\": \"{actual}\""
    )]
    BackendMismatch {
        /// The process.
        pid: i32,
        /// Its backend.
        actual: &'static str,
    },
    /// No event lease.
    #[error("the daemon did not grant an event lease")]
    NoLease,
    /// `pause` with the perf backend.
    #[error(
        "the perf backend never stops the target: attach with \"backend\": \"ptrace\" to pause"
    )]
    PerfNeverStops,
    /// An address plus its offset out of range.
    #[error("address out of range")]
    AddressOutOfRange,
    /// `evaluate` of a name that resolves to nothing.
    #[error("nothing by that name")]
    NothingByThatName,
    /// Memory that could not be read.
    #[error("{0}")]
    Unreadable(String),
    /// A value that does not fit the variable's type.
    #[error("{name} = {value}: {why}")]
    BadValue {
        /// The variable.
        name: String,
        /// The value asked.
        value: String,
        /// Why it does not fit.
        why: String,
    },
    /// A variable that cannot be changed.
    #[error("{name} cannot be changed: {why}")]
    ReadOnly {
        /// The variable.
        name: String,
        /// Why.
        why: String,
    },
    /// The daemon refused or failed a call.
    #[error("{0}")]
    Daemon(String),
    /// Ending the session left something behind.
    #[error("{0}")]
    Cleanup(String),
    /// The daemon's answer lacked what was asked.
    #[error("the daemon answered without {0}")]
    IncompleteAnswer(&'static str),
    /// A `dataId`, an address or a condition refused.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// An access type that cannot be watched.
    #[error("{0}")]
    AccessType(String),
    /// A name that no longer resolves.
    #[error("{data_id} no longer resolves in process {pid}")]
    Unresolved {
        /// The breakpoint's `dataId`.
        data_id: String,
        /// The process.
        pid: i32,
    },
    /// The answer could not be written.
    #[error("the adapter could not write its answer: {0}")]
    Internal(String),
    /// The connection comes from another uid than the adapter's.
    #[error(
        "this debug adapter serves uid {adapter} only, and this connection comes from uid \
         {peer}: start your own adapter (wpctl dap, or wpctl dap --listen unix:PATH)"
    )]
    NotYourAdapter {
        /// The peer's uid.
        peer: u32,
        /// The adapter's.
        adapter: u32,
    },
    /// The peer's uid could not be found out.
    #[error("who opened this connection could not be found out ({0}), so it is refused")]
    PeerUnknown(String),
    /// Too many sessions already.
    #[error(
        "the debug adapter serves {0} sessions at once and has that many open: end one, or \
         start the adapter with a larger --max-sessions"
    )]
    TooManySessions(usize),
}

impl DapError {
    /// The error's DAP id (see the table in the module's documentation).
    pub fn id(&self) -> u32 {
        match self {
            DapError::UnknownRequest(_) => 100,
            DapError::BadArguments(_) => 101,
            DapError::Launch(_) => 102,
            DapError::NoStepping => 103,
            DapError::NotAttached => 110,
            DapError::AlreadyAttached => 111,
            DapError::StaleFrame => 112,
            DapError::StaleVariables => 113,
            DapError::NoSuchThread => 114,
            DapError::ThreadRunning(_) => 115,
            DapError::BadPid => 120,
            DapError::BadBackend(_) => 121,
            DapError::BadStopOnHit(_) => 122,
            DapError::BackendMismatch { .. } => 123,
            DapError::NoLease => 124,
            DapError::PerfNeverStops => 125,
            DapError::Spec(SpecError::NotAnAddress(_)) => 130,
            DapError::AddressOutOfRange => 131,
            DapError::NothingByThatName => 132,
            DapError::Unreadable(_) => 133,
            DapError::BadValue { .. } => 134,
            DapError::ReadOnly { .. } => 135,
            DapError::Daemon(_) => 140,
            DapError::Cleanup(_) => 141,
            DapError::IncompleteAnswer(_) => 142,
            DapError::Spec(SpecError::ForeignDataId(_)) => 150,
            DapError::Spec(SpecError::Condition { .. }) => 151,
            DapError::Spec(SpecError::HitCondition(_)) => 152,
            DapError::AccessType(_) => 153,
            DapError::Unresolved { .. } => 154,
            DapError::Internal(_) => 190,
            DapError::NotYourAdapter { .. } => 401,
            DapError::PeerUnknown(_) => 402,
            DapError::TooManySessions(_) => 403,
        }
    }

    /// The error response to `req` (without its `seq`).
    pub fn response(&self, req: &Value) -> Value {
        let req = IncomingRequest::from_value(req.clone());
        serde_json::to_value(Response::failure(&req, self.id(), self.to_string()))
            .unwrap_or(Value::Null)
    }
}

/// A daemon call's failure: its message, or its code when it has none.
impl From<tonic::Status> for DapError {
    fn from(st: tonic::Status) -> DapError {
        DapError::Daemon(status_text(&st))
    }
}

/// A daemon error as one line.
pub fn status_text(st: &tonic::Status) -> String {
    let m = st.message();
    if m.is_empty() {
        format!("wpd: {:?}", st.code())
    } else {
        m.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every id in the table is one variant's, and no two variants share
    /// one.
    #[test]
    fn ids_are_distinct_and_documented() {
        let all = [
            DapError::UnknownRequest(String::new()),
            DapError::BadArguments(String::new()),
            DapError::Launch(String::new()),
            DapError::NoStepping,
            DapError::NotAttached,
            DapError::AlreadyAttached,
            DapError::StaleFrame,
            DapError::StaleVariables,
            DapError::NoSuchThread,
            DapError::ThreadRunning(1),
            DapError::BadPid,
            DapError::BadBackend(String::new()),
            DapError::BadStopOnHit(String::new()),
            DapError::BackendMismatch {
                pid: 1,
                actual: "perf",
            },
            DapError::NoLease,
            DapError::PerfNeverStops,
            DapError::Spec(SpecError::NotAnAddress(String::new())),
            DapError::AddressOutOfRange,
            DapError::NothingByThatName,
            DapError::Unreadable(String::new()),
            DapError::BadValue {
                name: String::new(),
                value: String::new(),
                why: String::new(),
            },
            DapError::ReadOnly {
                name: String::new(),
                why: String::new(),
            },
            DapError::Daemon(String::new()),
            DapError::Cleanup(String::new()),
            DapError::IncompleteAnswer("x"),
            DapError::Spec(SpecError::ForeignDataId(String::new())),
            DapError::Spec(SpecError::Condition {
                text: String::new(),
                why: String::new(),
            }),
            DapError::Spec(SpecError::HitCondition(String::new())),
            DapError::AccessType(String::new()),
            DapError::Unresolved {
                data_id: String::new(),
                pid: 1,
            },
            DapError::Internal(String::new()),
            DapError::NotYourAdapter {
                peer: 1,
                adapter: 0,
            },
            DapError::PeerUnknown(String::new()),
            DapError::TooManySessions(1),
        ];
        let doc = include_str!("error.rs");
        let mut seen = std::collections::HashSet::new();
        for e in &all {
            assert!(seen.insert(e.id()), "{e:?}: id {} twice", e.id());
            assert!(
                doc.contains(&format!("//! | {} | ", e.id())),
                "{e:?}: id {} is not in the table",
                e.id()
            );
        }
        let rows = doc
            .lines()
            .filter(|l| l.starts_with("//! | ") && l[6..].starts_with(|c: char| c.is_ascii_digit()))
            .count();
        assert_eq!(rows, all.len(), "the table has rows no variant has");
    }

    #[test]
    fn an_error_response_carries_its_id() {
        let r =
            DapError::NotAttached.response(&serde_json::json!({"seq": 4, "command": "threads"}));
        assert_eq!(r["success"], false);
        assert_eq!(r["request_seq"], 4);
        assert_eq!(r["body"]["error"]["id"], 110);
        assert_eq!(
            r["message"],
            "not attached: send `attach` with a pid, or `launch`, first"
        );
    }
}
