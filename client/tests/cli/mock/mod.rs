//! The scripted daemon the tests talk to: fixed answers per pid or id,
//! errors for particular inputs, and endless or replayed event streams
//! (see each method for its script).
//!
//! The canned messages are in `fixtures.rs`, the event streams' scripts
//! (and the hits a watchpoint kept) in `events.rs`.

mod events;
mod fixtures;

use std::collections::HashMap;
use std::pin::Pin;

use tokio_stream::{Stream, StreamExt};
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};
use wpd_proto::v1::watchpoints_server::{Watchpoints, WatchpointsServer};
use wpd_proto::v1::*;

use super::TempDir;
use fixtures::{break_place, counter_symbol, unknown_symbol, watchpoint};

/// A scripted daemon: fixed answers, and errors for particular inputs.
struct Mock;

/// The event streams the mock (and the hostile daemon) serve.
pub(crate) type EventStream = Pin<Box<dyn Stream<Item = Result<StreamEventsItem, Status>> + Send>>;

/// `events` as the server trait sends them.
pub(crate) fn served(
    events: impl Stream<Item = Result<StreamEventsResponse, Status>> + Send + 'static,
) -> EventStream {
    Box::pin(events.map(|r| r.map(StreamEventsItem::from)))
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
                code_events: String::new(),
                new_processes: String::new(),
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
        if spec.code_event.as_ref().is_some_and(|c| c.stop) {
            return Ok(Response::new(SetWatchpointResponse {
                watchpoint: Some(Watchpoint {
                    id: 9,
                    process_wide: true,
                    backend: Backend::Ptrace as i32,
                    breakpoint: Some(break_place()),
                    spec: Some(spec),
                    ..Default::default()
                }),
                ..Default::default()
            }));
        }
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
            // Its value now: -7.
            return Ok(Response::new(ResolveSymbolResponse {
                value_error: String::new(),
                value_name: String::new(),
                symbol: Some(counter_symbol(&r.name)),
                location: None,
                kind: "variable".into(),
                offset: 0,
                value: (-7i32).to_le_bytes().to_vec(),
                from_frame: false,
            }));
        }
        if r.address != 0x5555_0000_1234 {
            return Ok(Response::new(ResolveSymbolResponse::default()));
        }
        Ok(Response::new(ResolveSymbolResponse {
            value_error: String::new(),
            value_name: String::new(),
            symbol: Some(Symbol {
                value_type: None,
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
                place_id: 0,
            }),
            kind: "function".into(),
            offset: 0x34,
            value: Vec::new(),
            from_frame: false,
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
            // A policy: the daemon answers with its spec, policy_id its own id.
            9 => Ok(Response::new(RemoveWatchpointResponse {
                watchpoint: Some(Watchpoint {
                    id: 9,
                    policy_id: 9,
                    spec: Some(WatchpointSpec {
                        symbol: "state.level".into(),
                        access: Access::Write as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
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

    /// The script is [`events::stream_events`]'s.
    async fn stream_events(
        &self,
        r: Request<StreamEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        events::stream_events(r)
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
    async fn step(
        &self,
        _: Request<wpd_proto::v1::StepRequest>,
    ) -> Result<Response<wpd_proto::v1::StepResponse>, Status> {
        Err(Status::unimplemented("the mock daemon does not step"))
    }

    async fn write_memory(
        &self,
        _: Request<wpd_proto::v1::WriteMemoryRequest>,
    ) -> Result<Response<wpd_proto::v1::WriteMemoryResponse>, Status> {
        Err(Status::unimplemented(
            "the mock daemon does not write memory",
        ))
    }

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
            locals: if r.locals {
                vec![
                    wpd_proto::v1::FrameLocals {
                        variables: vec![
                            wpd_proto::v1::LocalVariable {
                                name: "v".into(),
                                r#type: "long".into(),
                                parameter: true,
                                address: 0x7fe0,
                                value: 42u64.to_le_bytes().to_vec(),
                                error: String::new(),
                            },
                            wpd_proto::v1::LocalVariable {
                                name: "tmp".into(),
                                r#type: "int".into(),
                                error: "optimized out".into(),
                                ..Default::default()
                            },
                        ],
                        note: String::new(),
                    },
                    wpd_proto::v1::FrameLocals {
                        variables: vec![],
                        note: "t has no DWARF (build with -g)".into(),
                    },
                ]
            } else {
                Vec::new()
            },
            registers: ["rax", "rsp", "rip", "r\x1b[31m"]
                .iter()
                .zip([1u64, 0x7ff0, 0x1010, 2])
                .map(|(n, v)| wpd_proto::v1::Register {
                    name: n.to_string(),
                    value: v,
                })
                .collect(),
        }))
    }

    async fn read_memory(
        &self,
        _: Request<ReadMemoryRequest>,
    ) -> Result<Response<ReadMemoryResponse>, Status> {
        Err(Status::unimplemented("not in the mock"))
    }

    /// Watchpoint 7 is in aggregate mode: two instructions of two threads; others are not.
    async fn list_variables(
        &self,
        _: Request<wpd_proto::v1::ListVariablesRequest>,
    ) -> Result<Response<wpd_proto::v1::ListVariablesResponse>, Status> {
        Err(Status::unimplemented("wpctl does not list variables"))
    }

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
            value_names: Vec::new(),
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
            value_type: None,
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
                    found_by: wpd_proto::v1::InstanceSource::KernelRecord as i32,
                }],
                instances_made: 1,
                ..Default::default()
            }),
        }))
    }

    /// The script is [`events::get_recent_hits`]'s.
    async fn get_recent_hits(
        &self,
        r: Request<GetRecentHitsRequest>,
    ) -> Result<Response<GetRecentHitsResponse>, Status> {
        events::get_recent_hits(r)
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

/// Starts the mock on a Unix socket; returns its endpoint (valid while the
/// directory lives).
pub(crate) async fn start_mock() -> (String, TempDir) {
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
pub(crate) async fn start_mock_with_health(serving: bool) -> (String, TempDir) {
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
