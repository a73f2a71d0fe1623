//! wpd's Debug Adapter Protocol adapter: IDEs set data breakpoints on a
//! running process through wpd. A thin client of the daemon's gRPC API
//! (`wpd_proto`): names are resolved, slots accounted, threads stopped and
//! resumed by the daemon; the adapter translates.
//!
//! One debug session per client connection (stdin/stdout, or one
//! connection of [`listen::serve`], on a Unix socket or loopback TCP, from
//! the adapter's own user only). When the session ends (a `disconnect`
//! request, the client's connection closing, or the adapter itself dying),
//! every breakpoint it set is removed and every thread it held runs again:
//! the target keeps running. The last case is the daemon's doing: the
//! adapter's watchpoints are leased to its event stream (see
//! `WatchpointSpec.lease`), which ends with the adapter's connection.

pub mod error;
pub mod launch;
pub mod listen;
pub mod peer;
pub mod protocol;
mod session;
pub mod spec;
pub mod wire;

use std::time::Duration;

use tonic::transport::Channel;
use wpd_proto::v1::watchpoints_client::WatchpointsClient;

pub use session::run;

/// How the adapter reaches the daemon.
#[derive(Debug, Clone)]
pub struct Daemon {
    /// A connected client.
    pub client: WatchpointsClient<Channel>,
    /// Bearer token sent with every call (TCP endpoints).
    pub token: Option<String>,
    /// Deadline of each unary call.
    pub timeout: Duration,
}

impl Daemon {
    /// A request carrying the token and the deadline.
    pub(crate) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        r.set_timeout(self.timeout);
        if let Some(t) = &self.token
            && let Ok(v) = format!("Bearer {t}").parse()
        {
            r.metadata_mut().insert("authorization", v);
        }
        r
    }
}
