//! The Debug Adapter Protocol as the adapter speaks it (DAP 1.71), typed.
//!
//! - [`Request`]: one type per request the adapter answers
//!   ([`requests`]), naming its command, the arguments it reads and the body
//!   it answers with. The session has one handler per request type
//!   (`session::Handler`).
//! - [`Event`]: one type per event the adapter sends ([`events`]).
//! - [`types`]: what requests, responses and events share (breakpoints,
//!   frames, variables), and the capabilities `initialize` answers.
//! - The envelopes: [`IncomingRequest`] (what the client sends), and
//!   [`Response`] and [`EventMessage`] (what the adapter sends; the writer
//!   numbers them).
//!
//! Field names follow the specification (camelCase); optional fields are
//! left out when empty. No DAP types crate is used (see ARCHITECTURE.md,
//! "Dependencies"): the crates on crates.io lack data breakpoints by
//! address (`asAddress`, `bytes`).
//!
//! Adding a request: its type here (`requests.rs`), its handler in
//! `session/`, and its name in the session's routing list.

pub mod events;
pub mod requests;
pub mod types;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use types::*;

/// A request of the protocol: its command and the types of its arguments
/// and of its response's body.
pub trait Request {
    /// What the client reads in `arguments` (absent arguments read as `{}`).
    type Arguments: DeserializeOwned;
    /// The response's `body` (`()`: none).
    type Result: Serialize;
    /// The `command` field.
    const COMMAND: &'static str;
}

/// An event of the protocol: its name; the type itself is the body.
pub trait Event: Serialize {
    /// The `event` field.
    const EVENT: &'static str;
}

/// A message from the client, read as a request (`seq`, `command`,
/// `arguments`; other fields ignored).
#[derive(Debug, Clone, Deserialize, Default)]
pub struct IncomingRequest {
    /// The client's sequence number (the response's `request_seq`).
    #[serde(default)]
    pub seq: i64,
    /// The command.
    #[serde(default)]
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub arguments: Option<Value>,
}

impl IncomingRequest {
    /// Reads `msg` as a request; a message that does not fit (its `seq` not
    /// a number...) keeps what it can, and its command is then unknown.
    pub fn from_value(msg: Value) -> IncomingRequest {
        let seq = msg.get("seq").and_then(Value::as_i64).unwrap_or(0);
        serde_json::from_value(msg).unwrap_or(IncomingRequest {
            seq,
            ..Default::default()
        })
    }

    /// Its arguments as `R` asks them.
    pub fn arguments<R: Request>(&self) -> Result<R::Arguments, serde_json::Error> {
        match &self.arguments {
            Some(a) if !a.is_null() => R::Arguments::deserialize(a),
            _ => R::Arguments::deserialize(Value::Object(Default::default())),
        }
    }
}

/// A response (its `seq` is set by the writer).
#[derive(Debug, Serialize)]
pub struct Response {
    #[serde(rename = "type")]
    kind: &'static str,
    request_seq: i64,
    command: String,
    success: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<Value>,
}

impl Response {
    /// A success with `body` (`Value::Null`: none).
    pub fn success(req: &IncomingRequest, body: Value) -> Response {
        Response {
            kind: "response",
            request_seq: req.seq,
            command: req.command.clone(),
            success: true,
            message: None,
            body: (!body.is_null()).then_some(body),
        }
    }

    /// A failure: `message`, and the body's error `Message` with its
    /// numbered id (shown to the user).
    pub fn failure(req: &IncomingRequest, id: u32, message: String) -> Response {
        let body = serde_json::json!({"error": ErrorMessage {
            id,
            format: message.clone(),
            show_user: true,
        }});
        Response {
            kind: "response",
            request_seq: req.seq,
            command: req.command.clone(),
            success: false,
            message: Some(message),
            body: Some(body),
        }
    }
}

/// DAP's `Message`: an error response's details.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorMessage {
    /// The error's id (the table in `crate::error`).
    pub id: u32,
    /// The text (no `{}` variables are used).
    pub format: String,
    /// Show it to the user.
    pub show_user: bool,
}

/// An event message (its `seq` is set by the writer).
#[derive(Debug, Serialize)]
pub struct EventMessage<'a, E: Event> {
    #[serde(rename = "type")]
    kind: &'static str,
    event: &'static str,
    body: &'a E,
}

impl<'a, E: Event> EventMessage<'a, E> {
    /// `body` as an event message.
    pub fn new(body: &'a E) -> EventMessage<'a, E> {
        EventMessage {
            kind: "event",
            event: E::EVENT,
            body,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn envelopes() {
        let req = IncomingRequest::from_value(json!({"seq": 7, "type": "request",
            "command": "threads"}));
        assert_eq!((req.seq, req.command.as_str()), (7, "threads"));
        // Absent arguments read as {}.
        let a = req.arguments::<requests::Threads>();
        assert!(a.is_ok());
        let bad = IncomingRequest::from_value(json!({"seq": 3, "command": 5}));
        assert_eq!((bad.seq, bad.command.as_str()), (3, ""));
        assert_eq!(
            serde_json::to_value(Response::success(&req, Value::Null)).unwrap(),
            json!({"type": "response", "request_seq": 7, "command": "threads", "success": true})
        );
        assert_eq!(
            serde_json::to_value(Response::failure(&req, 110, "no".into())).unwrap(),
            json!({"type": "response", "request_seq": 7, "command": "threads",
                "success": false, "message": "no",
                "body": {"error": {"id": 110, "format": "no", "showUser": true}}})
        );
        assert_eq!(
            serde_json::to_value(EventMessage::new(&events::Initialized {})).unwrap(),
            json!({"type": "event", "event": "initialized", "body": {}})
        );
    }
}
