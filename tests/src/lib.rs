//! Harness for wpd's end-to-end tests and demo: finds the built binaries, runs `wpd` and
//! `wpd-target` under guards that stop them on every path (including panics), and wraps the
//! gRPC event stream, status checks and ledger snapshots the tests assert on.
//!
//! [`both_backends!`] runs one test body against the perf and the ptrace backend. Every daemon
//! gets a private ptrace state file (`WPD_STATE_FILE`), never `/run/wpd`.
//!
//! Guards ([`Daemon`], [`TcpDaemon`], [`TargetProc`], [`ForeignBreakpoint`],
//! [`ForeignTracer`]) clean up in `Drop`. Children are
//! also started in their own process group (a terminal Ctrl-C reaches only the test or demo,
//! which then cleans up) and with `PR_SET_PDEATHSIG = SIGKILL`, so that they die even if the
//! test process is killed outright. The death signal fires when the *thread* that started the
//! child exits: create guards on a thread that outlives them (a test's body, `main`), never
//! inside `spawn_blocking`.

mod bins;
mod child;
mod ctarget;
mod daemon;
mod events;
mod foreign;
mod fuzzer;
pub mod leaks;
mod nats;
mod pidns;
mod probe;
mod relay;
mod rpc;
mod scrape;
mod skip;
mod sysctl;
mod target;
mod tcp_daemon;
mod tracer;
mod wpctl;

pub use bins::*;
pub use child::*;
pub use ctarget::*;
pub use daemon::*;
pub use events::*;
pub use foreign::*;
pub use fuzzer::*;
pub use nats::*;
pub use pidns::*;
pub use probe::*;
pub use relay::*;
pub use rpc::*;
pub use scrape::*;
pub use skip::*;
pub use sysctl::*;
pub use target::*;
pub use tcp_daemon::*;
pub use tracer::*;
pub use wpctl::*;

use std::time::Duration;

use tonic::transport::Channel;
use wpd_proto::v1::watchpoints_client::WatchpointsClient;

pub use wpd_proto::connect::Target;
pub use wpd_proto::v1::Backend;
pub use wpd_proto::v1::stream_events_response::Event;

/// A connected gRPC client of the daemon.
pub type Client = WatchpointsClient<Channel>;

/// How long [`Daemon::start`] waits for the daemon to answer `GetCapabilities`.
pub const DAEMON_READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long [`TargetProc::start`] waits for the `READY` line.
pub const TARGET_READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long [`TargetProc::cmd`] waits for the reply line.
pub const TARGET_CMD_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a guard gives a child to exit after SIGTERM before it sends SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// Timeout of a single unary RPC made by the helpers here.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(10);

/// Value the target's `spawn` threads store into `VARS[1]`.
pub const SPAWN_MARK: u64 = 0xC0FFEE;
