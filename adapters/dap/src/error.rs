//! The adapter's errors, each with its own DAP error id (the `id` of the
//! `Message` in an error response's body), so that a client can tell one
//! failure from another without reading the text.
//!
//! | id  | meaning |
//! |-----|---------|
//! | 401 | connection refused: the peer is another user than the adapter's |
//! | 402 | connection refused: who the peer is could not be found out |
//! | 403 | connection refused: `--max-sessions` sessions are open already |

use serde_json::{Value, json};

/// An error the adapter answers a request with.
#[derive(Debug, thiserror::Error)]
pub enum DapError {
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
            DapError::NotYourAdapter { .. } => 401,
            DapError::PeerUnknown(_) => 402,
            DapError::TooManySessions(_) => 403,
        }
    }

    /// The error response to `req` (without its `seq`).
    pub fn response(&self, req: &Value) -> Value {
        let message = self.to_string();
        json!({
            "type": "response",
            "request_seq": req["seq"],
            "command": req["command"],
            "success": false,
            "message": message,
            "body": {"error": {"id": self.id(), "format": message, "showUser": true}},
        })
    }
}
