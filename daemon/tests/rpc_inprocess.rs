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
use wpd::rpc::Service;
use wpd::rpc::auth::AuthConfig;
use wpd::rpc::conn::{ActiveLayer, Conn, ConnLimits, Registry};
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
        let svc = WatchpointsServer::new(Service::new(core.clone(), auth, registry.clone()));
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
                let conn = Conn::in_process(theirs, caller, &registry, &limits)
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

#[tokio::test]
async fn every_handler_validates_its_request_and_changes_nothing_when_it_refuses() {
    let rig = Rig::start(Limits::default(), None).await;
    let target = Sleeper::start();
    let pid = target.pid();
    let mut c = rig.client(root()).await;
    let set = c
        .set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(pid, 0x1000)),
        })
        .await
        .unwrap()
        .into_inner();
    // Nothing is mapped at 0x1000: armed, with a warning that says so.
    assert!(
        set.warnings.len() == 1 && set.warnings[0].contains("0x1000 is not mapped"),
        "{:?}",
        set.warnings
    );
    let wp = set.watchpoint.unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mapped = u64::from_str_radix(maps.split('-').next().unwrap(), 16).unwrap();
    let on_mapped = c
        .set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(pid, mapped)),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(on_mapped.warnings.is_empty(), "{:?}", on_mapped.warnings);
    c.remove_watchpoint(pb::RemoveWatchpointRequest {
        id: on_mapped.watchpoint.unwrap().id,
    })
    .await
    .unwrap();
    let before = listing(&mut c).await;
    let dead = {
        let mut ch = std::process::Command::new("true").spawn().unwrap();
        let p = ch.id() as i32;
        ch.wait().unwrap();
        p
    };
    let with = |f: &dyn Fn(&mut pb::WatchpointSpec)| {
        let mut s = spec(pid, 0x2000);
        f(&mut s);
        pb::SetWatchpointRequest { spec: Some(s) }
    };
    let specs: Vec<(&str, pb::SetWatchpointRequest, Code, &str, &str)> = vec![
        (
            "no spec",
            pb::SetWatchpointRequest { spec: None },
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "spec is required",
        ),
        (
            "length 0",
            with(&|s| s.length = 0),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "length 0",
        ),
        (
            "a range of more slots than a thread has",
            with(&|s| s.length = 40),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "40 bytes at 0x2000 need 5 debug-register slots per thread",
        ),
        (
            "unaligned, one slot too many",
            with(&|s| {
                s.address = 0x2004;
                s.length = 32;
            }),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "need 5 debug-register slots",
        ),
        (
            "exec of 8 bytes",
            with(&|s| s.access = pb::Access::Exec as i32),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "exec watchpoint must have length 1",
        ),
        (
            "kernel address",
            with(&|s| s.address = 0xffff_ffff_8100_0000),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "kernel half",
        ),
        (
            "read only",
            with(&|s| s.access = pb::Access::Read as i32),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "cannot watch reads only",
        ),
        (
            "no access",
            with(&|s| s.access = 0),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "access kind is required",
        ),
        (
            "tid 0",
            with(&|s| s.tids = vec![0]),
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "tid must be positive",
        ),
        (
            "a tid of another process",
            with(&|s| s.tids = vec![1]),
            Code::NotFound,
            r::NO_SUCH_THREAD,
            "is not a thread of process",
        ),
        (
            "backend 99",
            with(&|s| s.backend = 99),
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "unknown backend",
        ),
        (
            "action 99",
            with(&|s| s.action = 99),
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "unknown hit action",
        ),
        (
            "stop on a backend that never stops",
            with(&|s| s.action = pb::HitAction::Stop as i32),
            Code::InvalidArgument,
            r::NEEDS_BACKEND,
            "needs the ptrace backend",
        ),
        (
            "only-on-change on it",
            with(&|s| s.only_on_change = true),
            Code::InvalidArgument,
            r::NEEDS_BACKEND,
            "only-on-change",
        ),
        (
            "pid 0",
            with(&|s| s.pid = 0),
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "positive",
        ),
        (
            "a dead pid",
            with(&|s| s.pid = dead),
            Code::NotFound,
            r::NO_SUCH_PROCESS,
            "no process",
        ),
        (
            "the ptrace backend, not running here",
            with(&|s| s.backend = pb::Backend::Ptrace as i32),
            Code::FailedPrecondition,
            r::BACKEND_MISMATCH,
            "detach first",
        ),
    ];
    for (what, req, code, reason, needle) in specs {
        check_refusal(what, c.set_watchpoint(req).await, code, reason, needle);
        assert_eq!(listing(&mut c).await, before, "{what} changed something");
    }
    // The other handlers.
    check_refusal(
        "Attach(0)",
        c.attach(pb::AttachRequest {
            pid: 0,
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        r::INVALID_ARGUMENT,
        "positive",
    );
    check_refusal(
        "Attach(dead)",
        c.attach(pb::AttachRequest {
            pid: dead,
            ..Default::default()
        })
        .await,
        Code::NotFound,
        r::NO_SUCH_PROCESS,
        "no process",
    );
    check_refusal(
        "Attach(another pid, ptrace)",
        {
            let other = Sleeper::start();
            c.attach(pb::AttachRequest {
                pid: other.pid(),
                backend: pb::Backend::Ptrace as i32,
                ..Default::default()
            })
            .await
        },
        Code::FailedPrecondition,
        r::BACKEND_UNAVAILABLE,
        "not started",
    );
    check_refusal(
        "Detach(unattached)",
        c.detach(pb::DetachRequest { pid: dead }).await,
        Code::NotFound,
        r::NOT_ATTACHED,
        "not attached",
    );
    check_refusal(
        "RemoveWatchpoint(99)",
        c.remove_watchpoint(pb::RemoveWatchpointRequest { id: 99 })
            .await,
        Code::NotFound,
        r::NO_SUCH_WATCHPOINT,
        "no watchpoint #99",
    );
    check_refusal(
        "ListWatchpoints(-1)",
        c.list_watchpoints(pb::ListWatchpointsRequest { pid: -1 })
            .await,
        Code::InvalidArgument,
        r::INVALID_ARGUMENT,
        "pid must be 0",
    );
    check_refusal(
        "ListThreads(a tid not listed)",
        c.list_threads(pb::ListThreadsRequest {
            pid,
            tids: vec![1],
            probe: false,
        })
        .await,
        Code::NotFound,
        r::NO_SUCH_THREAD,
        "thread 1",
    );
    check_refusal(
        "StreamEvents(-1)",
        c.stream_events(pb::StreamEventsRequest {
            pid: -1,
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        r::INVALID_ARGUMENT,
        "pid must be 0",
    );
    check_refusal(
        "Resume on a backend that never stops",
        c.resume(pb::ResumeRequest { pid, tids: vec![] }).await,
        Code::InvalidArgument,
        r::NEEDS_BACKEND,
        "resuming threads",
    );
    assert_eq!(listing(&mut c).await, before);
    // What works: the watchpoint holds a slot of the thread, and is removed.
    let threads = c
        .list_threads(pb::ListThreadsRequest {
            pid,
            tids: vec![pid; 1000],
            probe: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(threads.threads.len(), 1, "one thread, named 1000 times");
    assert_eq!(threads.threads[0].slots[0].watchpoint_id, wp.id);
    assert_eq!(rig.kernel.armed_threads(WatchId(wp.id)), vec![pid]);
    c.remove_watchpoint(pb::RemoveWatchpointRequest { id: wp.id })
        .await
        .unwrap();
    assert!(rig.kernel.armed_threads(WatchId(wp.id)).is_empty());
    let caps = c
        .get_capabilities(pb::GetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.slots_per_thread, 4);
    assert!(
        caps.backends
            .iter()
            .any(|b| !b.usable && !b.reason.is_empty())
    );
}

#[tokio::test]
async fn authentication_and_authorization_refusals_map_to_their_statuses() {
    let rig = Rig::start(Limits::default(), Some("s3cret")).await;
    let target = Sleeper::start();
    let pid = target.pid();
    // No caller identity on the connection: the token decides.
    let mut anon = rig.client(None).await;
    check_refusal(
        "no token",
        anon.get_stats(pb::GetStatsRequest {}).await,
        Code::Unauthenticated,
        r::UNAUTHENTICATED,
        "missing",
    );
    let with = |v: &[&str]| {
        let mut req = Request::new(pb::GetStatsRequest {});
        for t in v {
            req.metadata_mut()
                .append("authorization", t.parse().unwrap());
        }
        req
    };
    check_refusal(
        "a wrong token",
        anon.get_stats(with(&["Bearer nope"])).await,
        Code::Unauthenticated,
        r::UNAUTHENTICATED,
        "invalid token",
    );
    check_refusal(
        "two headers",
        anon.get_stats(with(&["Bearer s3cret", "Bearer s3cret"]))
            .await,
        Code::Unauthenticated,
        r::UNAUTHENTICATED,
        "2 `authorization` headers",
    );
    assert!(anon.get_stats(with(&["bearer s3cret"])).await.is_ok());
    // A caller that does not own the process.
    let mut other = rig.client(stranger()).await;
    check_refusal(
        "a stranger's watch",
        other
            .set_watchpoint(pb::SetWatchpointRequest {
                spec: Some(spec(pid, 0x1000)),
            })
            .await,
        Code::PermissionDenied,
        r::PERMISSION_DENIED,
        "caller uid 54321 does not own the process",
    );
    let mut c = rig.client(root()).await;
    check_refusal(
        "the daemon itself",
        c.attach(pb::AttachRequest {
            pid: std::process::id() as i32,
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        r::OWN_PROCESS,
        "daemon itself",
    );
    check_refusal(
        "pid 1",
        c.attach(pb::AttachRequest {
            pid: 1,
            ..Default::default()
        })
        .await,
        Code::FailedPrecondition,
        r::INIT_PROCESS,
        "--allow-init",
    );
    // The kernel's refusals, through the fake.
    rig.kernel.take_foreign_slots(pid, 4);
    let full = c
        .set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(pid, 0x1000)),
        })
        .await;
    check_refusal(
        "no free slot",
        full,
        Code::ResourceExhausted,
        r::OUT_OF_SLOTS,
        "out of debug-register slots",
    );
    rig.kernel.take_foreign_slots(pid, 0);
    rig.kernel.fail_next_arm(FakeFailure::Emfile);
    check_refusal(
        "out of fds",
        c.set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(pid, 0x1000)),
        })
        .await,
        Code::ResourceExhausted,
        r::FD_LIMIT,
        "nothing was changed",
    );
    rig.kernel.fail_next_arm(FakeFailure::Eperm);
    check_refusal(
        "refused by the kernel",
        c.set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(pid, 0x1000)),
        })
        .await,
        Code::PermissionDenied,
        r::PERMISSION_DENIED,
        "operation not permitted",
    );
    // Every refusal above left nothing, the attach they needed included.
    assert_eq!(listing(&mut c).await, (vec![], vec![]));
    assert!(rig.kernel.attached().is_empty());
}

/// A range longer than one slot is one watchpoint holding a slot per piece
/// on every thread, reserved all or nothing; a refusal says how many slots
/// it needs and names who holds the others; a hit names its piece.
#[tokio::test]
async fn a_range_is_one_watchpoint_over_several_slots_all_or_nothing() {
    let rig = Rig::start(Limits::default(), None).await;
    let target = Sleeper::start();
    let pid = target.pid();
    let mut c = rig.client(root()).await;
    let ranged = |addr, length| pb::SetWatchpointRequest {
        spec: Some(pb::WatchpointSpec {
            length,
            ..spec(pid, addr)
        }),
    };
    let set = c
        .set_watchpoint(ranged(0x1000, 24))
        .await
        .unwrap()
        .into_inner();
    let wp = set.watchpoint.unwrap();
    let pieces: Vec<(u64, u32)> = wp.pieces.iter().map(|p| (p.address, p.length)).collect();
    assert_eq!(pieces, vec![(0x1000, 8), (0x1008, 8), (0x1010, 8)]);
    assert!(
        set.warnings
            .iter()
            .any(|w| w.contains("take 3 slots on every thread")),
        "{:?}",
        set.warnings
    );
    let slots = |c: &mut WatchpointsClient<Channel>| {
        let mut c = c.clone();
        async move {
            let t = c
                .list_threads(pb::ListThreadsRequest {
                    pid,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(t.threads.len(), 1);
            t.threads[0]
                .slots
                .iter()
                .map(|s| (s.state, s.watchpoint_id, s.piece))
                .collect::<Vec<_>>()
        }
    };
    let ours = pb::SlotState::Ours as i32;
    let free = pb::SlotState::Free as i32;
    let three = vec![
        (ours, wp.id, 0),
        (ours, wp.id, 1),
        (ours, wp.id, 2),
        (free, 0, 0),
    ];
    assert_eq!(slots(&mut c).await, three, "one id, three pieces");
    assert_eq!(rig.kernel.slots_armed(pid), 3);
    // Two more slots do not fit: refused whole, naming the need and the holder.
    let refused = c.set_watchpoint(ranged(0x2000, 16)).await;
    let status = refused.as_ref().unwrap_err().clone();
    check_refusal(
        "a second range",
        refused,
        Code::ResourceExhausted,
        r::OUT_OF_SLOTS,
        "takes 2 slots on every thread and 1 thread has fewer free",
    );
    assert!(
        status
            .message()
            .contains(&format!("watchpoints #{} (3 slots)", wp.id)),
        "{}",
        status.message()
    );
    let info = status.get_details_error_info().unwrap();
    assert_eq!(info.metadata["slots_needed"], "2");
    assert_eq!(slots(&mut c).await, three, "the refusal changed nothing");
    assert_eq!(rig.kernel.slots_armed(pid), 3);
    // One slot does fit.
    let one = c
        .set_watchpoint(ranged(0x2000, 8))
        .await
        .unwrap()
        .into_inner()
        .watchpoint
        .unwrap();
    assert_eq!(one.pieces.len(), 1);
    // A hit of the third piece names it and its bytes.
    let mut events = c
        .stream_events(pb::StreamEventsRequest {
            pid,
            hits_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(fake_hit(
        &*rig.core,
        &rig.kernel,
        wpd::model::SlotKey::new(WatchId(wp.id), 2),
        pid,
        0x401000
    ));
    let m = tokio::time::timeout(Duration::from_secs(5), events.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match m.event {
        Some(pb::stream_events_response::Event::Hit(h)) => {
            assert_eq!(
                (h.watchpoint_id, h.piece, h.address, h.length),
                (wp.id, 2, 0x1010, 8)
            );
        }
        other => panic!("expected the hit, got {other:?}"),
    }
    // Removed, it gives back every slot.
    c.remove_watchpoint(pb::RemoveWatchpointRequest { id: wp.id })
        .await
        .unwrap();
    assert_eq!(
        slots(&mut c).await,
        vec![(free, 0, 0), (free, 0, 0), (free, 0, 0), (ours, one.id, 0)]
    );
    assert_eq!(rig.kernel.slots_armed(pid), 1);
}

#[tokio::test]
async fn limits_are_refused_with_their_names() {
    let limits = Limits {
        watchpoints_per_caller: 2,
        processes: 1,
        subscribers: 20,
        subscribers_per_caller: 2,
        ..Limits::default()
    };
    let rig = Rig::start(limits, None).await;
    let (a, b) = (Sleeper::start(), Sleeper::start());
    let mut c = rig.client(root()).await;
    for addr in [0x1000, 0x2000] {
        c.set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(a.pid(), addr)),
        })
        .await
        .unwrap();
    }
    check_refusal(
        "a third watchpoint",
        c.set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(a.pid(), 0x3000)),
        })
        .await,
        Code::ResourceExhausted,
        r::LIMIT_REACHED,
        "watchpoints per caller (limit 2)",
    );
    check_refusal(
        "a second process",
        c.attach(pb::AttachRequest {
            pid: b.pid(),
            ..Default::default()
        })
        .await,
        Code::ResourceExhausted,
        r::LIMIT_REACHED,
        "attached processes (limit 1)",
    );
    // Subscriptions: two per unprivileged caller; root has its reserve.
    let mut user = rig.client(stranger()).await;
    let _s1 = user
        .stream_events(pb::StreamEventsRequest::default())
        .await
        .unwrap();
    let _s2 = user
        .stream_events(pb::StreamEventsRequest::default())
        .await
        .unwrap();
    check_refusal(
        "a third subscription",
        user.stream_events(pb::StreamEventsRequest::default()).await,
        Code::ResourceExhausted,
        r::LIMIT_REACHED,
        "event subscribers per caller (limit 2)",
    );
    let _s3 = c
        .stream_events(pb::StreamEventsRequest::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn hits_reach_subscribers_and_losses_count_when_they_happen() {
    let rig = Rig::start(Limits::default(), None).await;
    let target = Sleeper::start();
    let pid = target.pid();
    let mut c = rig.client(root()).await;
    let wp = c
        .set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(pid, 0x1000)),
        })
        .await
        .unwrap()
        .into_inner()
        .watchpoint
        .unwrap();
    let id = WatchId(wp.id);
    let mut reader = c
        .stream_events(pb::StreamEventsRequest {
            pid,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let stalled_client = rig.client(root()).await;
    let mut stalled = stalled_client
        .clone()
        .stream_events(pb::StreamEventsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(fake_hit(&*rig.core, &rig.kernel, id, pid, 0x401000));
    let first = tokio::time::timeout(Duration::from_secs(5), reader.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match first.event {
        Some(pb::stream_events_response::Event::Hit(h)) => {
            assert_eq!((h.watchpoint_id, h.tid, h.ip), (wp.id, pid, 0x401000));
        }
        other => panic!("expected the hit, got {other:?}"),
    }
    drop(reader);
    // Until the server has seen the reader go, it loses events too.
    for _ in 0..200 {
        let s = c
            .get_stats(pb::GetStatsRequest {})
            .await
            .unwrap()
            .into_inner();
        if s.subscribers == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Far more than the ring holds, while `stalled` does not read.
    let n = 3 * wpd::events::BUS_CAPACITY;
    for _ in 0..n {
        fake_hit(&*rig.core, &rig.kernel, id, pid, 0x401000);
    }
    let stats = c
        .get_stats(pb::GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(stats.subscriber_dropped > 0, "{stats:?}");
    assert_eq!(stats.hits, n as u64 + 1);
    // Reading now: what was kept, and one report of what was lost.
    let mut told = 0;
    let mut last = 0u64;
    while let Ok(Ok(Some(m))) =
        tokio::time::timeout(Duration::from_millis(500), stalled.message()).await
    {
        if let Some(pb::stream_events_response::Event::Dropped(d)) = &m.event {
            assert_eq!(d.last_seq, m.seq);
            assert_eq!(d.last_seq - d.first_seq + 1, d.count);
            told += d.count;
        } else if last != 0 {
            assert_eq!(m.seq, last + 1, "a gap without a loss report");
        }
        last = m.seq;
    }
    assert!(told > 0);
    let after = c
        .get_stats(pb::GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        stats.subscriber_dropped, told,
        "counted before the read = told after"
    );
    assert_eq!(after.subscriber_dropped, told, "and not counted twice");
}

#[tokio::test]
async fn debugger_calls_validate_and_leases_end_with_their_stream() {
    let rig = Rig::start(Limits::default(), None).await;
    let target = Sleeper::start();
    let pid = target.pid();
    let mut c = rig.client(root()).await;

    // Not attached: nothing to pause, read or walk.
    let s = c
        .read_memory(pb::ReadMemoryRequest {
            pid,
            address: 0x1000,
            length: 8,
        })
        .await
        .unwrap_err();
    assert_eq!(
        (s.code(), reason(&s).as_str()),
        (Code::NotFound, r::NOT_ATTACHED)
    );
    for (len, addr) in [(0, 0x1000), ((1 << 20) + 1, 0x1000), (16, 0x7fff_ffff_eff8)] {
        let s = c
            .read_memory(pb::ReadMemoryRequest {
                pid,
                address: addr,
                length: len,
            })
            .await
            .unwrap_err();
        assert_eq!(
            (s.code(), reason(&s).as_str()),
            (Code::InvalidArgument, r::INVALID_ARGUMENT),
            "{len} bytes at {addr:#x}: {s:?}"
        );
    }
    let s = c
        .get_thread_stack(pb::GetThreadStackRequest {
            pid,
            tid: pid,
            depth: 129,
            raw: false,
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    // The fake backend, like perf, never stops threads.
    c.attach(pb::AttachRequest {
        pid,
        ..Default::default()
    })
    .await
    .unwrap();
    for s in [
        c.pause(pb::PauseRequest {
            pid,
            ..Default::default()
        })
        .await
        .unwrap_err(),
        c.get_thread_stack(pb::GetThreadStackRequest {
            pid,
            tid: pid,
            ..Default::default()
        })
        .await
        .unwrap_err(),
    ] {
        assert_eq!(
            (s.code(), reason(&s).as_str()),
            (Code::InvalidArgument, r::NEEDS_BACKEND),
            "{s:?}"
        );
    }
    // Memory of the attached process (the fake backend reads the real one).
    let mapped = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let start = u64::from_str_radix(mapped.split('-').next().unwrap(), 16).unwrap();
    let m = c
        .read_memory(pb::ReadMemoryRequest {
            pid,
            address: start,
            length: 4,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(m.data, b"\x7fELF", "the first mapping is the ELF header");

    // Leases: a number nobody opened is refused and arms nothing; one that
    // is open ties the watchpoint to its stream.
    let mut leased = spec(pid, 0x1000);
    leased.lease = 12_345;
    let s = c
        .set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(leased.clone()),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert!(listing(&mut c).await.0.is_empty());
    let mut stream = c
        .stream_events(pb::StreamEventsRequest {
            pid,
            lease: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let lease = match stream.message().await.unwrap().unwrap().event {
        Some(pb::stream_events_response::Event::Leased(l)) => l.lease,
        other => panic!("the first item is the lease, got {other:?}"),
    };
    // Another user cannot use it, even on a process of their own (as root,
    // the test can start one as that user).
    if nix::unistd::geteuid().is_root() {
        use std::os::unix::process::CommandExt as _;
        let theirs = Sleeper(
            std::process::Command::new("sleep")
                .arg("120")
                .uid(4242)
                .gid(4242)
                .spawn()
                .expect("start sleep as uid 4242"),
        );
        let me = std::process::id() as i32;
        let user = Caller {
            userns: wpd::procfs::userns_of(me),
            ..Caller::unprivileged(4242, 4242, Some(me))
        };
        let mut other = rig.client(Some(user)).await;
        let mut foreign = spec(theirs.pid(), 0x1000);
        foreign.lease = lease;
        let s = other
            .set_watchpoint(pb::SetWatchpointRequest {
                spec: Some(foreign),
            })
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert!(
            s.message()
                .contains("not an open event stream of this caller"),
            "{s:?}"
        );
        assert!(listing(&mut c).await.0.is_empty(), "nothing armed");
    }
    leased.lease = lease;
    let wp = c
        .set_watchpoint(pb::SetWatchpointRequest { spec: Some(leased) })
        .await
        .unwrap()
        .into_inner()
        .watchpoint
        .unwrap();
    assert_eq!(wp.spec.unwrap().lease, lease);
    // A watchpoint without a lease outlives the stream.
    let kept = c
        .set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(pid, 0x2000)),
        })
        .await
        .unwrap()
        .into_inner()
        .watchpoint
        .unwrap();
    assert_eq!(listing(&mut c).await.0, vec![wp.id, kept.id]);
    drop(stream);
    let mut left = Vec::new();
    for _ in 0..500 {
        left = listing(&mut c).await.0;
        if left == vec![kept.id] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        left,
        vec![kept.id],
        "the leased watchpoint ends with its stream"
    );
}
