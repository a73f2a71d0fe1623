//! The RPC layer and the core, tested in-process: a real tonic server and
//! client over `tokio::io::duplex`, the core running the in-memory fake
//! backend. No root, no kernel support, no daemon binary: `cargo nextest run
//! -p wpd` runs these as any user. Targets are `sleep` processes the tests
//! start (the core still reads their `/proc`).

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;
use wpd::authz::Caller;
use wpd::backend::fake::{FakeFailure, FakeKernel, fake_hit};
use wpd::engine::{Backends, Config, Core, Limits};
use wpd::model::WatchId;
use wpd::rpc::Api;
use wpd::rpc::auth::AuthConfig;
use wpd::rpc::conn::{ActiveLayer, Conn, ConnLimits, Registry};
use wpd::service::Service;
use wpd_proto::reason as r;
use wpd_proto::v1 as pb;
use wpd_proto::v1::watchpoints_client::WatchpointsClient;
use wpd_proto::v1::watchpoints_server::WatchpointsServer;

/// A process the test started, killed on drop.
struct Sleeper(std::process::Child);

impl Sleeper {
    fn start() -> Sleeper {
        Sleeper(
            std::process::Command::new("sleep")
                .arg("120")
                .spawn()
                .expect("start sleep"),
        )
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A core on the fake backend, served in-process.
struct Rig {
    core: Arc<Core>,
    kernel: Arc<FakeKernel>,
    registry: Arc<Registry>,
    incoming: mpsc::UnboundedSender<std::io::Result<Conn<tokio::io::DuplexStream>>>,
    limits: ConnLimits,
}

impl Rig {
    async fn start(limits: Limits, token: Option<&str>) -> Rig {
        let kernel = FakeKernel::new();
        let core = Core::start_config(Config::new(limits, Backends::Fake(kernel.clone())));
        let registry = Arc::new(Registry::default());
        let auth = AuthConfig {
            token: token.map(Into::into),
        };
        let svc =
            WatchpointsServer::new(Api::new(Service::new(core.clone()), auth, registry.clone()));
        let (tx, rx) = mpsc::unbounded_channel();
        let incoming = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
        tokio::spawn(
            Server::builder()
                .layer(ActiveLayer)
                .add_service(svc)
                .serve_with_incoming(incoming),
        );
        Rig {
            core,
            kernel,
            registry,
            incoming: tx,
            limits: ConnLimits::default(),
        }
    }

    /// A client whose connection belongs to `caller` (`None`: nobody in
    /// particular, the token decides).
    async fn client(&self, caller: Option<Caller>) -> WatchpointsClient<Channel> {
        let tx = self.incoming.clone();
        let registry = self.registry.clone();
        let limits = self.limits;
        let channel = Endpoint::from_static("http://in-process")
            .connect_with_connector(tower::service_fn(move |_| {
                let (ours, theirs) = tokio::io::duplex(1 << 20);
                let conn = Conn::in_process(theirs, caller.clone(), &registry, &limits)
                    .map_err(std::io::Error::other);
                let sent = conn.map(|c| tx.send(Ok(c)).map_err(std::io::Error::other));
                async move {
                    sent??;
                    Ok::<_, std::io::Error>(TokioIo::new(ours))
                }
            }))
            .await
            .expect("in-process channel");
        WatchpointsClient::new(channel)
    }
}

fn root() -> Option<Caller> {
    Some(Caller::privileged())
}

/// A user that owns none of the test's processes.
fn stranger() -> Option<Caller> {
    Some(Caller::unprivileged(54_321, 54_321, None))
}

fn spec(pid: i32, addr: u64) -> pb::WatchpointSpec {
    pb::WatchpointSpec {
        pid,
        address: addr,
        length: 8,
        access: pb::Access::Write as i32,
        ..Default::default()
    }
}

fn reason(s: &Status) -> String {
    s.get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

/// `got` is a refusal with `code` and `reason`, whose message mentions
/// `needle`.
fn check_refusal<T: std::fmt::Debug>(
    what: &str,
    got: Result<T, Status>,
    code: Code,
    want_reason: &str,
    needle: &str,
) {
    match got {
        Ok(v) => panic!("{what}: succeeded ({v:?}), expected {code:?}/{want_reason}"),
        Err(s) => {
            assert_eq!(s.code(), code, "{what}: {s:?}");
            assert_eq!(reason(&s), want_reason, "{what}: {s:?}");
            assert!(
                s.message().to_lowercase().contains(&needle.to_lowercase()),
                "{what}: message {:?} lacks {needle:?}",
                s.message()
            );
        }
    }
}

async fn listing(c: &mut WatchpointsClient<Channel>) -> (Vec<u64>, Vec<i32>) {
    let l = c
        .list_watchpoints(pb::ListWatchpointsRequest { pid: 0 })
        .await
        .unwrap()
        .into_inner();
    (
        l.watchpoints.iter().map(|w| w.id).collect(),
        l.processes.iter().map(|p| p.pid).collect(),
    )
}

mod auth;
mod debugger;
mod events;
mod limits;
mod ranges;
mod validation;
