//! Runs the `wpctl` binary against a scripted in-process mock of the wpd gRPC service (and against no daemon at all), checking output formats and exit codes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_stream::{Stream, StreamExt};
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};
use wpd_proto::v1::stream_events_response::Event;
use wpd_proto::v1::watchpoints_server::{Watchpoints, WatchpointsServer};
use wpd_proto::v1::*;

mod hostile;

/// A scripted daemon: fixed answers, and errors for particular inputs.
struct Mock;

type EventStream = Pin<Box<dyn Stream<Item = Result<StreamEventsResponse, Status>> + Send>>;

fn event(seq: u64, event: Event) -> StreamEventsResponse {
    StreamEventsResponse {
        seq,
        time_ns: 1_700_000_000_000_000_000 + seq,
        event: Some(event),
    }
}

fn hit(seq: u64) -> StreamEventsResponse {
    event(
        seq,
        Event::Hit(Hit {
            process_name: String::new(),
            thread_name: String::new(),
            watchpoint_id: 7,
            pid: 123,
            tid: 124,
            ip: 0x401000,
            address: 0x601040,
            length: 4,
            access: Access::Write as i32,
            value: vec![0x2a, 0, 0, 0],
            value_error: String::new(),
            time_ns: 0,
            value_read_at_ns: 0,
            cpu: 0,
            stopped: false,
            old_value: vec![],
            backend: Backend::Perf as i32,
            piece: 0,
            location: None,
            backtrace: vec![],
            backtrace_note: String::new(),
            rate_limited_before: 0,
        }),
    )
}

/// Where a `--backtrace` hit came from: `set_counter` at target.c:17,
/// called from `main`.
fn located_hit(seq: u64) -> StreamEventsResponse {
    let frame = |ip: u64, function: &str, line: u32| Location {
        ip,
        lookup_address: ip - 1,
        function: function.into(),
        function_offset: 0x10,
        file: "/src/target.c".into(),
        line,
        column: 3,
        inlined: vec![],
        module: "/opt/t/target".into(),
        build_id: vec![0xab, 0xcd, 0x01],
        module_address: (ip - 1) & 0xffff,
        file_offset: (ip - 1) & 0xffff,
        has_file_offset: true,
    };
    let mut ev = hit(seq);
    if let Some(Event::Hit(h)) = &mut ev.event {
        h.ip = 0x5555_0000_1111;
        h.location = Some(frame(0x5555_0000_1111, "set_counter", 17));
        h.backtrace = vec![frame(0x5555_0000_1222, "main", 42)];
    }
    ev
}

/// A hit of a `--action stop --on-change` watchpoint: old value 41, new 42,
/// thread held stopped.
fn stopping_hit(seq: u64) -> StreamEventsResponse {
    let mut ev = hit(seq);
    if let Some(Event::Hit(h)) = &mut ev.event {
        h.watchpoint_id = 8;
        h.old_value = vec![0x29, 0, 0, 0];
        h.stopped = true;
        h.backend = Backend::Ptrace as i32;
    }
    ev
}

fn watchpoint(id: u64, spec: WatchpointSpec, hits: u64) -> Watchpoint {
    Watchpoint {
        policy_id: 0,
        forked_children: vec![],
        id,
        process_wide: spec.tids.is_empty(),
        armed_threads: if spec.tids.is_empty() {
            3
        } else {
            spec.tids.len() as u32
        },
        hits,
        created_at_ns: 1,
        backend: if spec.backend == Backend::Ptrace as i32 {
            Backend::Ptrace as i32
        } else {
            Backend::Perf as i32
        },
        pieces: vec![Piece {
            address: spec.address,
            length: spec.length,
        }],
        symbol: None,
        spec: Some(spec),
        hits_filtered: 0,
        hits_rate_limited: 0,
    }
}

/// What the mock's process 123 has: `counter`, a 4-byte int in the
/// executable `/opt/t/target`, loaded at 0x5555_0000_0000.
fn counter_symbol(expression: &str) -> Symbol {
    Symbol {
        expression: expression.into(),
        name: "counter".into(),
        module: "/opt/t/target".into(),
        build_id: vec![0xab, 0xcd, 0x01],
        address: 0x5555_0000_4010,
        size: 4,
        type_name: "int".into(),
        source: SymbolSource::Dwarf as i32,
        module_address: 0x4010,
        note: String::new(),
    }
}

/// The error the daemon gives for a name no module defines.
fn unknown_symbol(name: &str) -> Status {
    let mut details = ErrorDetails::new();
    details.set_error_info(
        wpd_proto::reason::UNKNOWN_SYMBOL,
        "wpd.v1",
        HashMap::from([("closest".to_string(), "counter".to_string())]),
    );
    Status::with_error_details(
        Code::NotFound,
        format!("no variable {name:?} in process 123 (closest: counter)"),
        details,
    )
}

#[tonic::async_trait]
impl Watchpoints for Mock {
    async fn get_capabilities(
        &self,
        _: Request<GetCapabilitiesRequest>,
    ) -> Result<Response<GetCapabilitiesResponse>, Status> {
        Ok(Response::new(GetCapabilitiesResponse {
            arch: "x86_64".into(),
            slots_per_thread: 4,
            lengths: vec![1, 2, 4, 8],
            access_kinds: vec![
                Access::Write as i32,
                Access::ReadWrite as i32,
                Access::Exec as i32,
            ],
            max_user_address: 0x7fff_ffff_f000,
            backends: vec![BackendInfo {
                backend: Backend::Perf as i32,
                usable: true,
                reason: String::new(),
                is_default: true,
                stops: String::new(),
                events: String::new(),
            }],
            version: "9.9.9".into(),
            cpus: 2,
            kernel: "6.1.0-mock".into(),
        }))
    }

    async fn attach(&self, r: Request<AttachRequest>) -> Result<Response<AttachResponse>, Status> {
        let r = r.into_inner();
        match r.pid {
            123 => Ok(Response::new(AttachResponse {
                process: Some(ProcessInfo {
                    pid: 123,
                    backend: if r.backend == Backend::Ptrace as i32 {
                        Backend::Ptrace as i32
                    } else {
                        Backend::Perf as i32
                    },
                    threads: 1001,
                    watchpoints: 0,
                    comm: "target".into(),
                    attached_at_ns: 1,
                    stops: String::new(),
                }),
                newly_attached: true,
            })),
            999 => Err(Status::not_found("no process 999")),
            _ => Err(Status::permission_denied("ptrace not permitted on pid 1")),
        }
    }

    async fn detach(&self, r: Request<DetachRequest>) -> Result<Response<DetachResponse>, Status> {
        match r.into_inner().pid {
            123 => Ok(Response::new(DetachResponse {
                watchpoints_removed: 1,
                threads_released: 1001,
            })),
            pid => Err(Status::failed_precondition(format!(
                "pid {pid} is not attached"
            ))),
        }
    }

    async fn set_watchpoint(
        &self,
        r: Request<SetWatchpointRequest>,
    ) -> Result<Response<SetWatchpointResponse>, Status> {
        let mut spec = r.into_inner().spec.unwrap_or_default();
        let mut symbol = None;
        if !spec.symbol.is_empty() {
            if spec.symbol != "counter" {
                return Err(unknown_symbol(&spec.symbol));
            }
            let s = counter_symbol(&spec.symbol);
            spec.address = s.address;
            if spec.length == 0 {
                spec.length = s.size as u32;
            }
            symbol = Some(s);
        }
        if spec.access == Access::Read as i32 {
            return Err(Status::invalid_argument(
                "x86-64 has no read-only watchpoints; use --access rw",
            ));
        }
        let stops =
            spec.action == HitAction::Stop as i32 || spec.action == HitAction::StopAll as i32;
        if (stops || spec.only_on_change) && spec.backend != Backend::Ptrace as i32 {
            return Err(Status::failed_precondition(
                "stop actions and only-on-change need the ptrace backend",
            ));
        }
        if spec.tids.contains(&666) {
            let mut details = ErrorDetails::new();
            details.set_error_info(
                wpd_proto::reason::OUT_OF_SLOTS,
                "wpd.v1",
                HashMap::from([("tids".to_string(), "666".to_string())]),
            );
            return Err(Status::with_error_details(
                Code::ResourceExhausted,
                "no free debug-register slot on tid 666 (slots: #1, #2, #3, foreign)",
                details,
            ));
        }
        let warnings = if spec.address < 0x1000 {
            vec![format!(
                "address {:#x} is not mapped in process {} now: the watchpoint is armed and \
                 fires once memory is mapped there",
                spec.address, spec.pid
            )]
        } else {
            vec![]
        };
        let mut wp = watchpoint(7, spec, 0);
        wp.symbol = symbol.clone();
        Ok(Response::new(SetWatchpointResponse {
            watchpoint: Some(wp),
            arm_duration_ns: 4_200_000,
            warnings,
            symbol,
        }))
    }

    /// pid 123: `counter` by name; 0x5555_0000_1234, code in `main`.
    async fn resolve_symbol(
        &self,
        r: Request<ResolveSymbolRequest>,
    ) -> Result<Response<ResolveSymbolResponse>, Status> {
        let r = r.into_inner();
        if r.pid != 123 {
            return Err(Status::not_found(format!("no process {}", r.pid)));
        }
        if !r.name.is_empty() {
            if r.name != "counter" {
                return Err(unknown_symbol(&r.name));
            }
            return Ok(Response::new(ResolveSymbolResponse {
                symbol: Some(counter_symbol(&r.name)),
                location: None,
                kind: "variable".into(),
                offset: 0,
            }));
        }
        if r.address != 0x5555_0000_1234 {
            return Ok(Response::new(ResolveSymbolResponse::default()));
        }
        Ok(Response::new(ResolveSymbolResponse {
            symbol: Some(Symbol {
                expression: String::new(),
                name: "main".into(),
                module: "/opt/t/target".into(),
                build_id: vec![0xab, 0xcd, 0x01],
                address: 0x5555_0000_1200,
                size: 0x80,
                type_name: String::new(),
                source: SymbolSource::Symtab as i32,
                module_address: 0x1200,
                note: String::new(),
            }),
            location: Some(Location {
                ip: 0x5555_0000_1234,
                lookup_address: 0x5555_0000_1234,
                function: "main".into(),
                function_offset: 0x34,
                file: "/src/target.c".into(),
                line: 42,
                column: 5,
                inlined: vec![],
                module: "/opt/t/target".into(),
                build_id: vec![0xab, 0xcd, 0x01],
                module_address: 0x1234,
                file_offset: 0x1234,
                has_file_offset: true,
            }),
            kind: "function".into(),
            offset: 0x34,
        }))
    }

    async fn remove_watchpoint(
        &self,
        r: Request<RemoveWatchpointRequest>,
    ) -> Result<Response<RemoveWatchpointResponse>, Status> {
        match r.into_inner().id {
            7 => Ok(Response::new(RemoveWatchpointResponse {
                watchpoint: Some(watchpoint(
                    7,
                    WatchpointSpec {
                        pid: 123,
                        tids: vec![],
                        address: 0x601040,
                        length: 4,
                        access: Access::Write as i32,
                        backend: 0,
                        action: HitAction::Log as i32,
                        only_on_change: false,
                        allow_init: false,
                        ..Default::default()
                    },
                    42,
                )),
            })),
            id => Err(Status::not_found(format!("no watchpoint {id}"))),
        }
    }

    /// pid 123: one stop-all, only-on-change watchpoint. Otherwise: nothing.
    async fn list_watchpoints(
        &self,
        r: Request<ListWatchpointsRequest>,
    ) -> Result<Response<ListWatchpointsResponse>, Status> {
        if r.into_inner().pid != 123 {
            return Ok(Response::new(ListWatchpointsResponse::default()));
        }
        Ok(Response::new(ListWatchpointsResponse {
            policies: vec![],
            watchpoints: vec![watchpoint(
                8,
                WatchpointSpec {
                    pid: 123,
                    tids: vec![],
                    address: 0x601040,
                    length: 4,
                    access: Access::Write as i32,
                    backend: Backend::Ptrace as i32,
                    action: HitAction::StopAll as i32,
                    only_on_change: true,
                    allow_init: false,
                    ..Default::default()
                },
                1,
            )],
            processes: vec![],
            ..Default::default()
        }))
    }

    /// pid 124: a thread stopped at its hit, one stopped by it, one in a
    /// job-control stop holding a retained slot. Otherwise: unimplemented.
    async fn list_threads(
        &self,
        r: Request<ListThreadsRequest>,
    ) -> Result<Response<ListThreadsResponse>, Status> {
        if r.into_inner().pid != 124 {
            return Err(Status::unimplemented("not in the mock"));
        }
        let slot = |index, state: SlotState, watchpoint_id| SlotInfo {
            index,
            state: state as i32,
            watchpoint_id,
            piece: 0,
        };
        let thread = |tid, state: ThreadState, slots| ThreadInfo {
            tid,
            slots,
            state: state as i32,
            parent_tid: 0,
            name: format!("t{tid}"),
        };
        Ok(Response::new(ListThreadsResponse {
            pid: 124,
            slots_per_thread: 2,
            threads: vec![
                thread(
                    124,
                    ThreadState::StoppedAtHit,
                    vec![slot(0, SlotState::Ours, 8), slot(1, SlotState::Free, 0)],
                ),
                thread(
                    125,
                    ThreadState::StoppedByPeer,
                    vec![slot(0, SlotState::Ours, 8), slot(1, SlotState::Free, 0)],
                ),
                thread(
                    126,
                    ThreadState::JobStopped,
                    vec![slot(0, SlotState::Ours, 8), slot(1, SlotState::Retained, 0)],
                ),
            ],
        }))
    }

    type StreamEventsStream = EventStream;

    /// pid 1: three events, then the stream ends. pid 2: a hit every 5 ms,
    /// forever. pid 3: one stopping only-on-change hit, then the end.
    /// pid 4: one symbolized hit with a backtrace, then the end.
    /// pid 6: no journal (a replay is refused with reason NO_JOURNAL).
    /// pid 7: echoes the replay fields: `after_seq` N gives the hits N+1 and
    /// N+2, `since_time_ns` T one hit at time T (seq 1), then the end.
    /// Otherwise: a hit, a drop notice, a thread start, then silence.
    async fn stream_events(
        &self,
        r: Request<StreamEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let req = r.get_ref();
        let replaying = req.after_seq.is_some() || req.since_time_ns.is_some();
        if req.pid == 6 && replaying {
            let mut details = ErrorDetails::new();
            details.set_error_info(wpd_proto::reason::NO_JOURNAL, "wpd.v1", HashMap::new());
            return Err(Status::with_error_details(
                Code::FailedPrecondition,
                "no journal",
                details,
            ));
        }
        if req.pid == 7 {
            let events = match (req.after_seq, req.since_time_ns) {
                (Some(n), _) => vec![Ok(hit(n + 1)), Ok(hit(n + 2))],
                (None, Some(t)) => {
                    let mut ev = hit(1);
                    ev.time_ns = t;
                    vec![Ok(ev)]
                }
                (None, None) => vec![],
            };
            return Ok(Response::new(Box::pin(tokio_stream::iter(events))));
        }
        let first = vec![
            Ok(hit(1)),
            Ok(event(
                2,
                Event::Dropped(EventsDropped {
                    count: 5,
                    first_seq: 1,
                    last_seq: 5,
                }),
            )),
            Ok(event(
                3,
                Event::ThreadStarted(ThreadStarted {
                    pid: 123,
                    tid: 125,
                    parent_tid: 124,
                    watchpoint_ids: vec![7],
                }),
            )),
        ];
        let stream: EventStream = match r.into_inner().pid {
            1 => Box::pin(tokio_stream::iter(first)),
            3 => Box::pin(tokio_stream::iter(vec![Ok(stopping_hit(1))])),
            4 => Box::pin(tokio_stream::iter(vec![Ok(located_hit(1))])),
            2 => {
                let ticks = tokio_stream::wrappers::IntervalStream::new(tokio::time::interval(
                    Duration::from_millis(5),
                ));
                let mut seq = 0;
                Box::pin(ticks.map(move |_| {
                    seq += 1;
                    Ok(hit(seq))
                }))
            }
            _ => Box::pin(tokio_stream::iter(first).chain(tokio_stream::pending())),
        };
        Ok(Response::new(stream))
    }

    /// pid 123 holds threads 124, 125 and 126 stopped (every call finds them
    /// held again); pid 5 holds none; any other pid is not attached.
    async fn resume(&self, r: Request<ResumeRequest>) -> Result<Response<ResumeResponse>, Status> {
        let r = r.into_inner();
        let held = match r.pid {
            123 => vec![124, 125, 126],
            5 => vec![],
            pid => {
                return Err(Status::failed_precondition(format!(
                    "pid {pid} is not attached"
                )));
            }
        };
        let resumed = if r.tids.is_empty() {
            held
        } else {
            held.into_iter().filter(|t| r.tids.contains(t)).collect()
        };
        Ok(Response::new(ResumeResponse { resumed }))
    }

    /// pid 123: threads 124-126 held; anything else not attached.
    async fn pause(&self, r: Request<PauseRequest>) -> Result<Response<PauseResponse>, Status> {
        match r.into_inner().pid {
            123 => Ok(Response::new(PauseResponse {
                held: vec![124, 125, 126],
            })),
            pid => Err(Status::failed_precondition(format!(
                "pid {pid} is not attached"
            ))),
        }
    }

    /// Thread 124 of pid 123 is held at a hit in `work` called by `main`;
    /// others run.
    async fn get_thread_stack(
        &self,
        r: Request<GetThreadStackRequest>,
    ) -> Result<Response<GetThreadStackResponse>, Status> {
        let r = r.into_inner();
        if (r.pid, r.tid) != (123, 124) {
            return Err(Status::failed_precondition(format!(
                "thread {} of process {} is running",
                r.tid, r.pid
            )));
        }
        let frame = |ip: u64, function: &str, line: u32| Location {
            ip,
            lookup_address: ip - 1,
            function: function.into(),
            file: "/src/t.c".into(),
            line,
            module: "/bin/t".into(),
            ..Default::default()
        };
        let frames = vec![frame(0x1010, "work", 7), frame(0x1100, "main", 20)];
        Ok(Response::new(GetThreadStackResponse {
            frames: frames.into_iter().take(r.depth as usize).collect(),
            note: "the frame-pointer chain ended: code built without frame pointers".into(),
            sp: 0x7ff0,
            fp: 0x7ff8,
        }))
    }

    async fn read_memory(
        &self,
        _: Request<ReadMemoryRequest>,
    ) -> Result<Response<ReadMemoryResponse>, Status> {
        Err(Status::unimplemented("not in the mock"))
    }

    /// Watchpoint 7 is in aggregate mode: two instructions of two threads; others are not.
    async fn get_hit_aggregates(
        &self,
        r: Request<wpd_proto::v1::GetHitAggregatesRequest>,
    ) -> Result<Response<wpd_proto::v1::GetHitAggregatesResponse>, Status> {
        let r = r.into_inner();
        if r.watchpoint_id != 7 {
            return Err(Status::invalid_argument(format!(
                "watchpoint {} is not in aggregate mode",
                r.watchpoint_id
            )));
        }
        let agg = |tid: i32, name: &str, count: u64, v: u8| wpd_proto::v1::HitAggregate {
            ip: 0x401000 + tid as u64,
            location: None,
            tid,
            thread_name: name.into(),
            count,
            first_ns: 1,
            last_ns: 2,
            values: vec![vec![v, 0, 0, 0, 0, 0, 0, 0]],
        };
        Ok(Response::new(wpd_proto::v1::GetHitAggregatesResponse {
            watchpoint_id: 7,
            pid: 123,
            hits: 1_500,
            exemplars: 12,
            overflow: 0,
            aggregates: vec![agg(124, "pool-1", 1_000, 42), agg(125, "", 500, 43)],
        }))
    }

    /// Policies by command name get id 9 and one instance (pid 321, watchpoint 10); any
    /// other selector is refused.
    async fn set_policy(
        &self,
        r: Request<wpd_proto::v1::SetPolicyRequest>,
    ) -> Result<Response<wpd_proto::v1::SetPolicyResponse>, Status> {
        let r = r.into_inner();
        let sel = r.selector.unwrap_or_default();
        if sel.comm.is_empty() {
            return Err(Status::invalid_argument(
                "the mock takes policies by comm only",
            ));
        }
        Ok(Response::new(wpd_proto::v1::SetPolicyResponse {
            policy: Some(wpd_proto::v1::Policy {
                id: 9,
                selector: Some(sel),
                spec: r.spec,
                instances: vec![wpd_proto::v1::PolicyInstance {
                    pid: 321,
                    comm: "fuzzer".into(),
                    watchpoint_id: 10,
                    armed_at_ns: 0,
                    latency_ns: 1_500_000,
                }],
                instances_made: 1,
                ..Default::default()
            }),
        }))
    }

    /// Watchpoint 7 kept two hits of 42 in all; others do not exist.
    async fn get_recent_hits(
        &self,
        r: Request<GetRecentHitsRequest>,
    ) -> Result<Response<GetRecentHitsResponse>, Status> {
        let r = r.into_inner();
        if r.watchpoint_id != 7 {
            return Err(Status::not_found(format!(
                "no watchpoint #{}",
                r.watchpoint_id
            )));
        }
        let hit = |seq: u64, tid: i32, value: u8| StreamEventsResponse {
            seq,
            time_ns: 1,
            event: Some(Event::Hit(Hit {
                process_name: String::new(),
                thread_name: String::new(),
                watchpoint_id: 7,
                pid: 123,
                tid,
                ip: 0x401000,
                address: 0x1040,
                length: 4,
                value: vec![value, 0, 0, 0],
                ..Default::default()
            })),
        };
        let mut hits = vec![hit(40, 124, 1), hit(41, 125, 2)];
        if r.limit == 1 {
            hits.remove(0);
        }
        Ok(Response::new(GetRecentHitsResponse { hits, total: 42 }))
    }

    async fn get_stats(
        &self,
        _: Request<GetStatsRequest>,
    ) -> Result<Response<GetStatsResponse>, Status> {
        Ok(Response::new(GetStatsResponse {
            processes: 1,
            hits: 42,
            ..Default::default()
        }))
    }
}

/// A fresh temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "wpctl-test-{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn socket(&self) -> PathBuf {
        self.0.join("wpd.sock")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts the mock on a Unix socket; returns its endpoint (valid while the
/// directory lives).
async fn start_mock() -> (String, TempDir) {
    let dir = TempDir::new("mock");
    let path = dir.socket();
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(WatchpointsServer::new(Mock))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    (format!("unix:{}", path.display()), dir)
}

/// Like [`start_mock`], with the standard health service saying SERVING
/// for `wpd.v1.Watchpoints`, or NOT_SERVING.
async fn start_mock_with_health(serving: bool) -> (String, TempDir) {
    let dir = TempDir::new("mock-health");
    let path = dir.socket();
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let (reporter, health) = tonic_health::server::health_reporter();
    if serving {
        reporter.set_serving::<WatchpointsServer<Mock>>().await;
    } else {
        reporter.set_not_serving::<WatchpointsServer<Mock>>().await;
    }
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .add_service(WatchpointsServer::new(Mock))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    (format!("unix:{}", path.display()), dir)
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn wpctl(endpoint: &str, args: &[&str]) -> Run {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_wpctl"))
        .args(args)
        .env("WPD_ENDPOINT", endpoint)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), out)
        .await
        .expect("wpctl did not finish")
        .unwrap();
    Run {
        code: out.status.code().expect("exited normally"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

#[tokio::test]
async fn no_daemon_is_a_transport_error_with_exit_3() {
    let dir = TempDir::new("none");
    let endpoint = format!("unix:{}", dir.socket().display());
    let r = wpctl(&endpoint, &["caps"]).await;
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stdout.is_empty());
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr
            .starts_with(&format!("wpctl: cannot reach wpd at {endpoint}: ")),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("`wpd`"), "{}", r.stderr);

    let r = wpctl(&endpoint, &["caps", "--json"]).await;
    assert_eq!(r.code, 3);
    let v: serde_json::Value = serde_json::from_str(&r.stderr).unwrap();
    assert_eq!(v["error"]["code"], "UNAVAILABLE");
    assert_eq!(v["error"]["exit_code"], 3);

    // `--access read` passes the parser (the daemon is the one to refuse it).
    let r = wpctl(
        &endpoint,
        &["watch", "--pid", "1", "--addr", "4096", "--access", "read"],
    )
    .await;
    assert_eq!(r.code, 3, "{}", r.stderr);
}

#[tokio::test]
async fn usage_errors_exit_2() {
    let r = wpctl(
        "unix:/nonexistent",
        &["watch", "--pid", "1", "--addr", "0xzz"],
    )
    .await;
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("is not a hex number"), "{}", r.stderr);
    let r = wpctl("unix:/nonexistent", &["frobnicate"]).await;
    assert_eq!(r.code, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_calls_print_and_map_errors() {
    let (ep, _dir) = start_mock().await;

    let r = wpctl(&ep, &["attach", "--pid", "123"]).await;
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, "attached pid 123 (perf): 1001 threads\n")
    );

    let r = wpctl(
        &ep,
        &["watch", "--pid", "123", "--addr", "0x601040", "--len", "4"],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "watchpoint 7: write 4 bytes at 0x601040 in pid 123, armed on 3 threads (process-wide, 4.2 ms)\n"
    );
    assert_eq!(r.stderr, "", "no warning for a mapped address");

    // An unmapped address is armed, with a warning on stderr (and in --json).
    let r = wpctl(&ep, &["watch", "--pid", "123", "--addr", "0x10"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stderr,
        "wpctl: warning: address 0x10 is not mapped in process 123 now: the watchpoint is armed \
         and fires once memory is mapped there\n"
    );
    let r = wpctl(&ep, &["--json", "watch", "--pid", "123", "--addr", "0x10"]).await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert!(
        v["warnings"][0].as_str().unwrap().contains("not mapped"),
        "{v}"
    );

    let r = wpctl(
        &ep,
        &[
            "watch", "--pid", "123", "--addr", "0x601040", "--access", "read",
        ],
    )
    .await;
    assert_eq!(r.code, 4);
    assert_eq!(
        r.stderr,
        "wpctl: x86-64 has no read-only watchpoints; use --access rw\n"
    );

    let r = wpctl(
        &ep,
        &[
            "watch", "--pid", "123", "--tid", "666", "--addr", "0x601040",
        ],
    )
    .await;
    assert_eq!(r.code, 6);
    assert_eq!(
        r.stderr,
        "wpctl: no free debug-register slot on tid 666 (slots: #1, #2, #3, foreign)\n"
    );
    let r = wpctl(
        &ep,
        &[
            "--json", "watch", "--pid", "123", "--tid", "666", "--addr", "0x601040",
        ],
    )
    .await;
    assert_eq!(r.code, 6);
    assert!(r.stdout.is_empty());
    let v: serde_json::Value = serde_json::from_str(&r.stderr).unwrap();
    assert_eq!(v["error"]["code"], "RESOURCE_EXHAUSTED");
    assert_eq!(v["error"]["reason"], wpd_proto::reason::OUT_OF_SLOTS);
    assert_eq!(v["error"]["metadata"]["tids"], "666");

    let r = wpctl(&ep, &["unwatch", "7"]).await;
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (
            0,
            "removed watchpoint 7 (write 4 bytes at 0x601040 in pid 123): 42 hits\n"
        )
    );
    let r = wpctl(&ep, &["unwatch", "--id", "8"]).await;
    assert_eq!((r.code, r.stderr.as_str()), (5, "wpctl: no watchpoint 8\n"));

    assert_eq!(wpctl(&ep, &["attach", "--pid", "999"]).await.code, 5);
    assert_eq!(wpctl(&ep, &["attach", "--pid", "1"]).await.code, 7);
    assert_eq!(wpctl(&ep, &["detach", "--pid", "5"]).await.code, 8);
    assert_eq!(wpctl(&ep, &["threads", "--pid", "123"]).await.code, 8);

    let r = wpctl(&ep, &["detach", "--pid", "123"]).await;
    assert_eq!(
        r.stdout,
        "detached pid 123: removed 1 watchpoint, released 1001 threads\n"
    );

    let r = wpctl(&ep, &["caps", "--json"]).await;
    assert_eq!(r.code, 0);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(
        v["access_kinds"],
        serde_json::json!(["write", "rw", "exec"])
    );
    assert_eq!(v["backends"][0]["backend"], "perf");

    let r = wpctl(&ep, &["list"]).await;
    assert_eq!(r.stdout, "no watchpoints\n\nno attached processes\n");
    let r = wpctl(&ep, &["list", "--pid", "123"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "ID  PID  SCOPE    ADDRESS   LEN  ACCESS  ACTION           THREADS  HITS  BACKEND\n\
         8   123  process  0x601040  4    write   stop-all+change  3        1     ptrace\n\
         \n\
         no attached processes\n"
    );
    let r = wpctl(&ep, &["stats", "--json"]).await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["hits"], 42);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_actions_and_on_change() {
    let (ep, _dir) = start_mock().await;
    let watch = ["watch", "--pid", "123", "--addr", "0x601040", "--len", "4"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        watch.iter().chain(extra).copied().collect()
    };

    let r = wpctl(
        &ep,
        &with(&["--backend", "ptrace", "--action", "stop", "--on-change"]),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "watchpoint 7: write 4 bytes at 0x601040 in pid 123, armed on 3 threads \
         (process-wide, stop on hit, only on change, 4.2 ms)\n"
    );

    let r = wpctl(
        &ep,
        &with(&[
            "--backend",
            "ptrace",
            "--action",
            "stop-all",
            "--tid",
            "124",
        ]),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "watchpoint 7: write 4 bytes at 0x601040 in pid 123, armed on 1 thread \
         (tids 124, stop all threads on hit, 4.2 ms)\n"
    );

    // `--action log` is the default and adds nothing to the line.
    let r = wpctl(&ep, &with(&["--action", "log"])).await;
    assert_eq!(
        r.stdout,
        "watchpoint 7: write 4 bytes at 0x601040 in pid 123, armed on 3 threads (process-wide, 4.2 ms)\n"
    );

    let r = wpctl(
        &ep,
        &with(&[
            "--json",
            "--backend",
            "ptrace",
            "--action",
            "stop-all",
            "--on-change",
        ]),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["watchpoint"]["action"], "stop-all");
    assert_eq!(v["watchpoint"]["only_on_change"], true);
    assert_eq!(v["watchpoint"]["backend"], "ptrace");

    // The flags reach the daemon, which refuses them without ptrace.
    let r = wpctl(&ep, &with(&["--action", "stop"])).await;
    assert_eq!(r.code, 8);
    assert_eq!(
        r.stderr,
        "wpctl: stop actions and only-on-change need the ptrace backend\n"
    );
    assert_eq!(wpctl(&ep, &with(&["--on-change"])).await.code, 8);

    let r = wpctl(&ep, &with(&["--action", "halt"])).await;
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("stop-all"), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_prints_resumed_threads() {
    let (ep, _dir) = start_mock().await;

    let r = wpctl(&ep, &["resume", "--pid", "123"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, "resumed 3 threads: 124,125,126\n");

    let r = wpctl(&ep, &["resume", "--pid", "123", "--tid", "125"]).await;
    assert_eq!((r.code, r.stdout.as_str()), (0, "resumed 1 thread: 125\n"));
    let r = wpctl(
        &ep,
        &["resume", "--pid", "123", "--tid", "124,126", "--tid", "999"],
    )
    .await;
    assert_eq!(r.stdout, "resumed 2 threads: 124,126\n");

    // Nothing held is not an error.
    let r = wpctl(&ep, &["resume", "--pid", "5"]).await;
    assert_eq!(
        (r.code, r.stdout.as_str(), r.stderr.as_str()),
        (0, "no held threads in pid 5\n", "")
    );
    let r = wpctl(&ep, &["resume", "--pid", "123", "--tid", "7"]).await;
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, "no held threads in pid 123 among tids 7\n")
    );

    let r = wpctl(&ep, &["resume", "--pid", "123", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v, serde_json::json!({ "resumed": [124, 125, 126] }));
    let r = wpctl(&ep, &["--json", "resume", "--pid", "5"]).await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v, serde_json::json!({ "resumed": [] }));

    let r = wpctl(&ep, &["resume", "--pid", "77"]).await;
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (8, "wpctl: pid 77 is not attached\n")
    );
    assert_eq!(wpctl(&ep, &["resume"]).await.code, 2);
    assert_eq!(
        wpctl(&ep, &["resume", "--pid", "1", "--tid", "x"])
            .await
            .code,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_show_states_and_retained_slots() {
    let (ep, _dir) = start_mock().await;
    let r = wpctl(&ep, &["threads", "--pid", "124"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "TID  NAME  STATE           SLOT0  SLOT1\n\
         124  t124  stopped (hit)   #8     -\n\
         125  t125  stopped (peer)  #8     -\n\
         126  t126  job-stopped     #8     retained\n\
         \n\
         pid 124: 3 threads, 2 stopped by wpd, 1 job-stopped; \
         slots: 2 free, 3 ours, 0 foreign, 0 pending, 1 retained\n"
    );
    let r = wpctl(&ep, &["threads", "--pid", "124", "--json"]).await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let states: Vec<_> = v["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["stopped_at_hit", "stopped_by_peer", "job_stopped"]);
    assert_eq!(v["threads"][2]["slots"][1]["state"], "retained");
    assert_eq!(v["counts"]["retained"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_show_stopped_hits_and_old_values() {
    let (ep, _dir) = start_mock().await;
    let r = wpctl(&ep, &["events", "--pid", "3"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.ends_with(
            " hit wp=8 pid=123 tid=124 ip=0x401000 addr=0x601040 \
             old=41 (0x29) → value=42 (0x2a) STOPPED\n"
        ),
        "{}",
        r.stdout
    );
    let r = wpctl(&ep, &["events", "--pid", "3", "--json"]).await;
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim_end()).unwrap();
    assert_eq!(v["stopped"], true);
    assert_eq!(v["old_value"], "29000000");
    assert_eq!(v["value"], "2a000000");
    assert_eq!(v["backend"], "ptrace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_stream_count_and_end() {
    let (ep, _dir) = start_mock().await;

    // The server ends the stream: exit 0 after all its events.
    let r = wpctl(&ep, &["events", "--pid", "1"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<_> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", r.stdout);
    assert!(
        lines[0].ends_with(" hit wp=7 pid=123 tid=124 ip=0x401000 addr=0x601040 value=42 (0x2a)"),
        "{}",
        lines[0]
    );
    assert_eq!(
        lines[1],
        "!! 5 events dropped (subscriber too slow; seq 1..=5)"
    );
    assert!(lines[2].ends_with(" thread-start pid=123 tid=125 parent=124 inherited=7"));

    // --count stops a stream that would go on forever, counting the drop notice.
    let r = wpctl(&ep, &["events", "--count", "2", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<serde_json::Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["type"], "hit");
    assert_eq!(lines[0]["value"], "2a000000");
    assert_eq!(lines[0]["value_le"], 42);
    assert_eq!(lines[0]["stopped"], false);
    assert!(lines[0]["old_value"].is_null());
    assert_eq!(lines[0]["backend"], "perf");
    assert_eq!(lines[1]["type"], "dropped");
    assert_eq!(lines[1]["count"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_exit_quietly_when_stdout_closes() {
    let (ep, _dir) = start_mock().await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_wpctl"))
        .args(["events", "--pid", "2"])
        .env("WPD_ENDPOINT", &ep)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next_line().await.unwrap().expect("a first event");
    assert!(first.contains(" hit wp=7 "), "{first}");
    drop(lines); // Like `wpctl events | head -1`.
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("wpctl kept running after its stdout closed")
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_in_watch_symbol_and_events() {
    let (ep, _dir) = start_mock().await;

    // By name: the answer says what was resolved, and from where.
    let r = wpctl(&ep, &["watch", "--pid", "123", "--symbol", "counter"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "watchpoint 7: write counter (int, 4 bytes, target, DWARF) at 0x555500004010 in pid 123, \
         armed on 3 threads (process-wide, 4.2 ms)\n"
    );
    // --len narrows it: the description says so.
    let r = wpctl(
        &ep,
        &["watch", "--pid", "123", "--symbol", "counter", "--len", "2"],
    )
    .await;
    assert!(
        r.stdout
            .starts_with("watchpoint 7: write 2 bytes of counter (int, 4 bytes, target, DWARF)"),
        "{}",
        r.stdout
    );
    let r = wpctl(
        &ep,
        &["--json", "watch", "--pid", "123", "--symbol", "counter"],
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["symbol"]["module"], "/opt/t/target");
    assert_eq!(v["symbol"]["source"], "DWARF");
    assert_eq!(v["symbol"]["size"], 4);
    assert_eq!(v["watchpoint"]["address"], "0x555500004010");
    assert_eq!(v["watchpoint"]["length"], 4);

    // An unknown name: one line with the closest names, exit 5 (not found);
    // --json carries the reason and the suggestions.
    let r = wpctl(&ep, &["watch", "--pid", "123", "--symbol", "countr"]).await;
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (
            5,
            "wpctl: no variable \"countr\" in process 123 (closest: counter)\n"
        )
    );
    let r = wpctl(&ep, &["--json", "symbol", "--pid", "123", "countr"]).await;
    assert_eq!(r.code, 5);
    let v: serde_json::Value = serde_json::from_str(&r.stderr).unwrap();
    assert_eq!(v["error"]["reason"], wpd_proto::reason::UNKNOWN_SYMBOL);
    assert_eq!(v["error"]["metadata"]["closest"], "counter");
    // --symbol and --addr exclude each other.
    let r = wpctl(
        &ep,
        &[
            "watch", "--pid", "123", "--symbol", "counter", "--addr", "0x10",
        ],
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    let r = wpctl(
        &ep,
        &[
            "watch",
            "--pid",
            "123",
            "--addr",
            "0x10",
            "--on-exec",
            "remove",
        ],
    )
    .await;
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (
            2,
            "wpctl: --on-exec needs --symbol: a watchpoint set by address is always removed at exec\n"
        )
    );

    // `wpctl symbol`: a name, an address in code, an address in nothing.
    let r = wpctl(&ep, &["symbol", "--pid", "123", "counter"]).await;
    assert_eq!(
        r.stdout,
        "counter: int, 4 bytes at 0x555500004010 in target (0x4010 in the module, DWARF)\n"
    );
    let r = wpctl(&ep, &["symbol", "--pid", "123", "0x555500001234"]).await;
    assert_eq!(
        r.stdout,
        "function main+0x34 (target, 128 bytes at 0x555500001200)\n\
         at main (target.c:42)\n\
         build id abcd01, file offset 0x1234\n"
    );
    let r = wpctl(&ep, &["symbol", "--pid", "123", "0x10"]).await;
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, "no symbol holds this address\n")
    );
    let r = wpctl(&ep, &["symbol", "--pid", "123", "0xzz"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);

    // A symbolized hit: function (file:line), then the backtrace.
    let r = wpctl(&ep, &["events", "--pid", "4"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", r.stdout);
    assert!(
        lines[0].ends_with(
            " hit wp=7 pid=123 tid=124 at set_counter (target.c:17) addr=0x601040 value=42 (0x2a)"
        ),
        "{}",
        lines[0]
    );
    assert_eq!(lines[1], "    #1 main (target.c:42)");
    // --json: every field of the location, the raw ip and the address
    // symbolized (one byte before it).
    let r = wpctl(&ep, &["events", "--pid", "4", "--json"]).await;
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v["ip"], "0x555500001111");
    assert_eq!(v["location"]["lookup_address"], "0x555500001110");
    assert_eq!(v["location"]["function"], "set_counter");
    assert_eq!(v["location"]["file"], "/src/target.c");
    assert_eq!(v["location"]["line"], 17);
    assert_eq!(v["location"]["build_id"], "abcd01");
    assert_eq!(v["location"]["file_offset"], 0x1110);
    assert_eq!(v["backtrace"][0]["function"], "main");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_stack_print_threads_and_frames() {
    let (ep, _dir) = start_mock().await;

    let r = wpctl(&ep, &["pause", "--pid", "123"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "holding 3 threads of pid 123: 124,125,126 (wpctl resume --pid 123 lets them run)\n"
    );
    let r = wpctl(&ep, &["pause", "--pid", "9"]).await;
    assert_eq!(r.code, 8, "{}", r.stderr);
    assert_eq!(r.stderr, "wpctl: pid 9 is not attached\n");

    let r = wpctl(&ep, &["stack", "--pid", "123", "--tid", "124"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", r.stdout);
    assert!(
        lines[0].starts_with("#0  ") && lines[0].contains("work"),
        "{}",
        r.stdout
    );
    assert!(lines[0].contains("t.c:7"), "{}", r.stdout);
    assert!(
        lines[1].starts_with("#1  ") && lines[1].contains("main"),
        "{}",
        r.stdout
    );
    assert!(lines[2].contains("without frame pointers"), "{}", r.stdout);

    let r = wpctl(
        &ep,
        &[
            "--json", "stack", "--pid", "123", "--tid", "124", "--depth", "1",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["frames"].as_array().unwrap().len(), 1);
    assert_eq!(v["frames"][0]["function"], "work");

    let r = wpctl(&ep, &["stack", "--pid", "123", "--tid", "125"]).await;
    assert_eq!(r.code, 8);
    assert!(r.stderr.contains("running"), "{}", r.stderr);
    let r = wpctl(
        &ep,
        &["stack", "--pid", "123", "--tid", "125", "--depth", "0"],
    )
    .await;
    assert_eq!(r.code, 2, "depth 0 is a usage error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_prints_the_kept_hits_oldest_first() {
    let (ep, _dir) = start_mock().await;
    let r = wpctl(&ep, &["last", "7"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", r.stdout);
    assert!(
        lines[0].contains("tid=124") && lines[0].contains("value=1"),
        "{}",
        r.stdout
    );
    assert!(
        lines[1].contains("tid=125") && lines[1].contains("value=2"),
        "{}",
        r.stdout
    );
    assert_eq!(lines[2], "watchpoint 7: 2 hits of 42 shown");
    let r = wpctl(&ep, &["--json", "last", "7", "--limit", "1"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["total"], 42);
    assert_eq!(v["hits"].as_array().unwrap().len(), 1);
    assert_eq!(v["hits"][0]["tid"], 125);
    let r = wpctl(&ep, &["last", "8"]).await;
    assert_eq!(r.code, 5);
    assert_eq!(r.stderr, "wpctl: no watchpoint #8\n");
}

/// `wpctl watch --comm` sets a policy (SetPolicy) and names its instances; `--tid` cannot go
/// with a policy; a watch without any target is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_with_a_selector_sets_a_policy() {
    let (ep, _dir) = start_mock().await;
    let r = wpctl(&ep, &["watch", "--comm", "fuzzer", "--symbol", "counter"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "policy 9: write counter in every process with comm fuzzer; 1 instance now \
         (pid 321 watchpoint 10)\n"
    );
    let r = wpctl(
        &ep,
        &["--json", "watch", "--comm", "fuzzer", "--symbol", "counter"],
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["policy"]["instances"][0]["watchpoint_id"], 10);
    assert_eq!(v["policy"]["selector"]["comm"], "fuzzer");
    let r = wpctl(
        &ep,
        &["watch", "--comm", "fuzzer", "--tid", "5", "--addr", "0x10"],
    )
    .await;
    assert_ne!(r.code, 0);
    assert!(
        r.stderr.contains("--tid names threads of one process"),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    let r = wpctl(&ep, &["watch", "--addr", "0x10"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    let r = wpctl(&ep, &["watch", "--exe", "/bin/true", "--addr", "0x10"]).await;
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("policies by comm only"), "{}", r.stderr);
}

/// `wpctl aggregates ID`: the counts per instruction and thread, most counted first, and the
/// totals; a watchpoint not in aggregate mode is one clear error line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregates_are_listed_by_count() {
    let (ep, _dir) = start_mock().await;
    let r = wpctl(&ep, &["aggregates", "7"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(lines[0].starts_with("COUNT"), "{}", r.stdout);
    assert!(
        lines[1].starts_with("1000 ") && lines[1].contains("124(pool-1)"),
        "{}",
        r.stdout
    );
    assert!(
        lines[1].contains("0x40107c") && lines[1].contains(" 42 "),
        "{}",
        r.stdout
    );
    assert!(
        lines[2].starts_with("500 ") && lines[2].contains(" 125 "),
        "{}",
        r.stdout
    );
    assert_eq!(
        lines[3],
        "watchpoint 7 (pid 123): 1500 hits aggregated, 12 streamed as samples"
    );
    let r = wpctl(&ep, &["--json", "aggregates", "7"]).await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["aggregates"][0]["count"], 1000);
    assert_eq!(v["aggregates"][0]["values"][0], "42");
    let r = wpctl(&ep, &["aggregates", "8"]).await;
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("not in aggregate mode"), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
}

/// An endpoints file in `dir` with these lines.
fn endpoints_file(dir: &TempDir, lines: &[String]) -> String {
    let path = dir.0.join("fleet");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path.display().to_string()
}

/// Several endpoints: every host's answer, each line tagged `[name]` and
/// aligned; a host that cannot be reached is one stderr line naming it, the
/// others still answer, and the exit status is 9 (3 when all fail alike).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_endpoints_tag_each_host_and_survive_a_dead_one() {
    let (a, _da) = start_mock().await;
    let (b, _db) = start_mock().await;
    let dir = TempDir::new("fleet");
    let gone = format!("unix:{}", dir.socket().display());
    let file = endpoints_file(
        &dir,
        &[
            "# the farm".into(),
            format!("alpha {a}"),
            String::new(),
            format!("b {b}   # second"),
            format!("gone {gone}"),
        ],
    );

    let r = wpctl(&a, &["--endpoints-file", &file, "stats"]).await;
    assert_eq!(r.code, 9, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(lines[0].starts_with("[alpha] processes:"), "{}", r.stdout);
    assert!(
        lines.iter().any(|l| l.starts_with("[b]     hits:")),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .lines()
            .all(|l| l.starts_with("[alpha] ") || l.starts_with("[b]     "))
    );
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr
            .starts_with(&format!("wpctl: [gone] cannot reach wpd at {gone}: ")),
        "{}",
        r.stderr
    );

    // JSON Lines, one record per host, the failure included.
    let r = wpctl(
        &a,
        &["--endpoints-file", &file, "--json", "list", "--pid", "123"],
    )
    .await;
    assert_eq!(r.code, 9, "{}", r.stderr);
    let records: Vec<serde_json::Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 3, "{}", r.stdout);
    assert_eq!(records[0]["host"], "alpha");
    assert_eq!(records[0]["watchpoints"][0]["id"], 8);
    assert_eq!(records[1]["host"], "b");
    assert_eq!(records[2]["host"], "gone");
    assert_eq!(records[2]["error"]["code"], "UNAVAILABLE");
    assert_eq!(records[2]["error"]["exit_code"], 3);
    let err: serde_json::Value = serde_json::from_str(r.stderr.trim()).unwrap();
    assert_eq!(err, records[2]);

    // Repeated --endpoint (on both sides of the subcommand): tagged by the
    // endpoint; all succeed: exit 0.
    let r = wpctl(&a, &["--endpoint", &a, "caps", "--endpoint", &b]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.starts_with(&format!("[{a}] arch:")),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains(&format!("\n[{b}] arch:")), "{}", r.stdout);
    assert!(r.stderr.is_empty(), "{}", r.stderr);

    // --endpoint and the file together: the --endpoint hosts first.
    let r = wpctl(&a, &["--endpoint", &b, "--endpoints-file", &file, "health"]).await;
    assert_eq!(r.code, 9, "{}", r.stderr);
    let tags: Vec<&str> = r
        .stdout
        .lines()
        .chain(r.stderr.lines())
        .map(|l| l.trim_start_matches("wpctl: ").split(']').next().unwrap())
        .collect();
    assert_eq!(tags, [format!("[{b}").as_str(), "[alpha", "[b", "[gone"]);
    // The same tag twice is refused.
    let r = wpctl(&a, &["--endpoint", &a, "--endpoint", &a, "stats"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("both be tagged"), "{}", r.stderr);

    // Every host failing the same way: that code.
    let r = wpctl(
        &a,
        &[
            "--endpoint",
            &gone,
            "--endpoint",
            "unix:/nonexistent.sock",
            "list",
        ],
    )
    .await;
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 2, "{}", r.stderr);

    // Per-host failures from the daemon: each its own line, exit 9 (5 and 0).
    let r = wpctl(&a, &["--endpoint", &a, "--endpoint", &b, "unwatch", "999"]).await;
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 2, "{}", r.stderr);

    // Subcommands about one process or id refuse several endpoints.
    let r = wpctl(&a, &["--endpoints-file", &file, "attach", "--pid", "123"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("wpctl attach acts on one daemon"),
        "{}",
        r.stderr
    );
    // ...but a file of one endpoint is one daemon, printed as ever.
    let one_dir = TempDir::new("one");
    let one = endpoints_file(&one_dir, &[format!("solo {a}")]);
    let r = wpctl(
        "unix:/nonexistent",
        &["--endpoints-file", &one, "attach", "--pid", "123"],
    )
    .await;
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, "attached pid 123 (perf): 1001 threads\n"),
        "{}",
        r.stderr
    );
}

/// Several endpoints' event streams merged, each line tagged with its host;
/// a bad endpoints file is one line and exit 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_endpoints_merge_event_streams() {
    let (a, _da) = start_mock().await;
    let (b, _db) = start_mock().await;
    let dir = TempDir::new("fleet-events");
    let file = endpoints_file(&dir, &[format!("a {a}"), format!("b {b}")]);
    let r = wpctl(&a, &["--endpoints-file", &file, "events", "--pid", "1"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 6, "{}", r.stdout);
    for host in ["a", "b"] {
        let mine: Vec<&&str> = lines
            .iter()
            .filter(|l| l.starts_with(&format!("[{host}] ")))
            .collect();
        assert_eq!(mine.len(), 3, "{}", r.stdout);
        assert!(
            mine[0].contains(" hit wp=7 pid=123 tid=124 "),
            "{}",
            mine[0]
        );
        assert_eq!(
            *mine[1],
            format!("[{host}] !! 5 events dropped (subscriber too slow; seq 1..=5)")
        );
    }
    // --count counts across hosts; JSON records carry the host.
    let r = wpctl(
        &a,
        &[
            "--endpoints-file",
            &file,
            "--json",
            "events",
            "--count",
            "4",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let records: Vec<serde_json::Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 4, "{}", r.stdout);
    assert!(records.iter().all(|v| v["host"] == "a" || v["host"] == "b"));

    std::fs::write(dir.0.join("bad"), "a tcp://h:1\nb tcp://h:2 junk\n").unwrap();
    let bad = dir.0.join("bad").display().to_string();
    let r = wpctl(&a, &["--endpoints-file", &bad, "list"]).await;
    assert_eq!(r.code, 2);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!("{bad}:2: unexpected \"junk\"")),
        "{}",
        r.stderr
    );
}

/// `events --since`: a sequence number sets `after_seq`, a time or an age
/// `since_time_ns`; a daemon without a journal is one clear line (exit 8);
/// a bad SPEC is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_since_sets_the_replay_fields() {
    let (ep, _dir) = start_mock().await;
    let r = wpctl(&ep, &["--json", "events", "--pid", "7", "--since", "1234"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let seqs: Vec<u64> = r
        .stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, [1235, 1236]);

    let r = wpctl(
        &ep,
        &[
            "--json",
            "events",
            "--pid",
            "7",
            "--since",
            "2026-12-02T11:00:00+01:00",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v["time_ns"], 1_796_205_600_000_000_000u64);

    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let r = wpctl(&ep, &["--json", "events", "--pid", "7", "--since", "10m"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    let t = v["time_ns"].as_u64().unwrap();
    let ten_minutes = 600_000_000_000u64;
    assert!(
        t >= before - ten_minutes && t < before - ten_minutes + 30_000_000_000,
        "since_time_ns {t}, now {before}"
    );

    let r = wpctl(&ep, &["events", "--pid", "6", "--since", "5"]).await;
    assert_eq!(r.code, 8, "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr
            .starts_with(&format!("wpctl: wpd at {ep} keeps no event journal")),
        "{}",
        r.stderr
    );
    let r = wpctl(&ep, &["--json", "events", "--pid", "6", "--since", "5"]).await;
    let v: serde_json::Value = serde_json::from_str(r.stderr.trim()).unwrap();
    assert_eq!(v["error"]["reason"], wpd_proto::reason::NO_JOURNAL);
    assert_eq!(v["error"]["code"], "FAILED_PRECONDITION");

    for bad in ["yesterday", "2026-12-02T10:00:00", "1mo"] {
        let r = wpctl(&ep, &["events", "--since", bad]).await;
        assert_eq!(r.code, 2, "--since {bad}: {}", r.stderr);
        assert!(r.stderr.contains("--since"), "{}", r.stderr);
    }
}

/// `wpctl health`: 0 and `serving` when the daemon serves; one line and 3
/// when it does not, or cannot be reached; one line per host with several.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_the_standard_service() {
    let (up, _du) = start_mock_with_health(true).await;
    let (down, _dd) = start_mock_with_health(false).await;
    let r = wpctl(&up, &["health"]).await;
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, "serving\n"),
        "{}",
        r.stderr
    );
    let r = wpctl(&up, &["--json", "health"]).await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["status"], "SERVING");
    assert_eq!(v["service"], "wpd.v1.Watchpoints");

    let r = wpctl(&down, &["health"]).await;
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(
        r.stderr,
        format!("wpctl: wpd at {down} is not serving (health status NOT_SERVING)\n")
    );
    let r = wpctl("unix:/nonexistent.sock", &["health"]).await;
    assert_eq!(r.code, 3, "{}", r.stderr);

    let dir = TempDir::new("fleet-health");
    let file = endpoints_file(&dir, &[format!("up {up}"), format!("down {down}")]);
    let r = wpctl(&up, &["--endpoints-file", &file, "health"]).await;
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (9, "[up]   serving\n"),
        "{}",
        r.stderr
    );
    assert_eq!(
        r.stderr,
        format!("wpctl: [down] wpd at {down} is not serving (health status NOT_SERVING)\n")
    );
}
