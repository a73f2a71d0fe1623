//! The subcommands, one module each holding its options (`#[derive(Args)]`) beside its `run`,
//! and `Ctx`, the connection and call helper they share.

pub mod aggregates;
pub mod attach;
pub mod breakpoint;
pub mod caps;
pub mod completions;
pub mod dap;
pub mod detach;
pub mod events;
pub mod health;
pub mod last;
pub mod list;
pub mod man;
pub mod pause;
pub mod resume;
pub mod stack;
pub mod stats;
pub mod step;
pub mod symbol;
pub mod threads;
pub mod unwatch;
pub mod watch;

use std::time::Duration;

use serde_json::Value;
use tonic::transport::Channel;
use wpd_proto::v1::watchpoints_client::WatchpointsClient;

use crate::credentials::Token;
use crate::endpoints::Endpoint;
use crate::error::Error;
use crate::output;

/// A connected client.
pub type Client = WatchpointsClient<Channel>;

/// Largest answer to a unary call wpctl decodes (listings of many threads
/// are the largest); anything larger is refused, not buffered.
pub const ANSWER_LIMIT: usize = 64 << 20;

/// Largest event (`StreamEvents`) wpctl decodes: a hit with 127 frames of
/// long C++ names is well under it.
pub const EVENT_LIMIT: usize = 4 << 20;

/// What every subcommand needs: where the daemon is, how to print, how long to wait.
#[derive(Debug)]
pub struct Ctx {
    /// The daemon's endpoint.
    pub endpoint: Endpoint,
    /// `--json`.
    pub json: bool,
    /// `--timeout` for connecting and for each unary call.
    pub timeout: Duration,
    /// Bearer token (from `--token-file` or the endpoints file's
    /// `token-file=`), sent with every call.
    pub token: Option<Token>,
    /// TLS settings (`--tls-ca`).
    pub connect: wpd_proto::connect::Options,
}

impl Ctx {
    /// Connects to the daemon (bounded by `--timeout`); answers are decoded
    /// up to [`ANSWER_LIMIT`] bytes.
    pub async fn connect(&self) -> Result<Client, Error> {
        let client = self
            .bounded_connect(wpd_proto::connect::client_with(
                &self.endpoint.target,
                &self.connect,
            ))
            .await?;
        Ok(client.max_decoding_message_size(ANSWER_LIMIT))
    }

    /// Opens a channel to the daemon (bounded by `--timeout`), for services
    /// other than `wpd.v1.Watchpoints` (health).
    pub async fn channel(&self) -> Result<Channel, Error> {
        self.bounded_connect(wpd_proto::connect::channel_with(
            &self.endpoint.target,
            &self.connect,
        ))
        .await
    }

    /// Waits up to `--timeout` for a connection attempt.
    async fn bounded_connect<T>(
        &self,
        attempt: impl Future<Output = Result<T, tonic::transport::Error>>,
    ) -> Result<T, Error> {
        let ep = &self.endpoint.text;
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(connected)) => Ok(connected),
            Ok(Err(e)) => Err(Error::connect(ep, &e)),
            Err(_) => Err(Error::Unreachable {
                endpoint: ep.clone(),
                detail: format!("no connection within {} s", self.timeout.as_secs_f64()),
            }),
        }
    }

    /// Connects and makes one unary call, e.g.
    /// `ctx.unary(req, |mut c, r| async move { c.attach(r).await })`.
    /// The call carries `--timeout` as its gRPC deadline and is abandoned
    /// locally when it elapses.
    pub async fn unary<Q, R, F, Fut>(&self, message: Q, call: F) -> Result<R, Error>
    where
        F: FnOnce(Client, tonic::Request<Q>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let client = self.connect().await?;
        let request = self.deadline_request(message)?;
        self.answer(call(client, request)).await
    }

    /// A request carrying the token and `--timeout` as its deadline.
    pub fn deadline_request<Q>(&self, message: Q) -> Result<tonic::Request<Q>, Error> {
        let mut request = self.request(message)?;
        request.set_timeout(self.timeout);
        Ok(request)
    }

    /// Waits up to `--timeout` for the answer to a unary call.
    pub async fn answer<R>(
        &self,
        call: impl Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    ) -> Result<R, Error> {
        let timeout = || Error::Timeout {
            endpoint: self.endpoint.text.clone(),
            secs: self.timeout.as_secs_f64(),
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            // tonic's channel enforces the deadline itself and reports it so.
            Ok(Err(status)) if timed_out(&status) => Err(timeout()),
            Ok(Err(status)) => Err(Error::from_status(&self.endpoint.text, status)),
            Err(_) => Err(timeout()),
        }
    }
}

impl Ctx {
    /// A request carrying the token, if any.
    pub fn request<Q>(&self, message: Q) -> Result<tonic::Request<Q>, Error> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.token {
            let value = format!("Bearer {}", token.expose()).parse().map_err(|_| {
                Error::Local("the token file holds characters not allowed in a header".into())
            })?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}

/// What a subcommand prints from one daemon's answer: its text, its JSON,
/// and warnings for stderr. Printed as is for one daemon, tagged with the
/// host for several (`fleet`).
#[derive(Debug)]
pub struct Report {
    /// The human-readable output (one or more lines).
    pub text: String,
    /// The `--json` document.
    pub json: Value,
    /// Warnings the daemon sent, printed on stderr in text mode (the JSON
    /// carries them itself).
    pub warnings: Vec<String>,
}

impl Report {
    /// A report without warnings.
    pub fn new(text: String, json: Value) -> Self {
        Report {
            text,
            json,
            warnings: Vec::new(),
        }
    }

    /// Prints it as for one daemon: the warnings (text mode) on stderr, then
    /// the text, or the pretty-printed JSON document.
    pub fn emit(&self, json: bool) -> Result<(), Error> {
        if json {
            return output::emit_json(&self.json);
        }
        for w in &self.warnings {
            output::warn(&format!("wpctl: warning: {}", wpd_proto::text::escape(w)));
        }
        output::emit(&self.text)
    }
}

/// True when the client side gave up waiting (not a status sent by the daemon).
fn timed_out(status: &tonic::Status) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = cur {
        if e.is::<tonic::TimeoutExpired>() {
            return true;
        }
        cur = e.source();
    }
    false
}
