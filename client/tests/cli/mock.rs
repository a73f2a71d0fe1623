//! The scripted daemon the tests talk to: fixed answers per pid or id,
//! errors for particular inputs, and endless or replayed event streams
//! (see each method for its script).

use std::collections::HashMap;
use std::pin::Pin;
use std::time::Duration;

use tokio_stream::{Stream, StreamExt};
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};
use wpd_proto::v1::stream_events_response::Event;
use wpd_proto::v1::watchpoints_server::{Watchpoints, WatchpointsServer};
use wpd_proto::v1::*;

use super::TempDir;

/// A scripted daemon: fixed answers, and errors for particular inputs.
struct Mock;

/// The event streams the mock (and the hostile daemon) serve.
pub(crate) type EventStream = Pin<Box<dyn Stream<Item = Result<StreamEventsItem, Status>> + Send>>;

/// The messages the mock scripts, before they are served.
type Events = Pin<Box<dyn Stream<Item = Result<StreamEventsResponse, Status>> + Send>>;

/// `events` as the server trait sends them.
pub(crate) fn served(
    events: impl Stream<Item = Result<StreamEventsResponse, Status>> + Send + 'static,
) -> EventStream {
    Box::pin(events.map(|r| r.map(StreamEventsItem::from)))
}

fn event(seq: u64, event: Event) -> StreamEventsResponse {
    StreamEventsResponse {
        seq,
        time_ns: 1_700_000_000_000_000_000 + seq,
        owner: None,
        event: Some(event),
    }
}

/// Where the mock's code breakpoints are (id 9).
fn break_place() -> BreakpointPlace {
    BreakpointPlace {
        function: "conn_new".into(),
        file: "/src/conn.c".into(),
        line: 41,
        address: 0x5555_0000_127d,
        module: "/opt/server".into(),
        offset: 0x127d,
    }
}

/// Breakpoint 9 holds thread `tid` of pid 8.
fn break_stop(seq: u64, tid: i32) -> StreamEventsResponse {
    event(
        seq,
        Event::BreakpointHit(BreakpointHit {
            watchpoint_id: 9,
            pid: 8,
            tid,
            place: Some(break_place()),
            count: 1,
        }),
    )
}

fn hit(seq: u64) -> StreamEventsResponse {
    event(
        seq,
        Event::Hit(Hit {
            value_kind: 0,
            value_name: String::new(),
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
        place_id: 0,
    };
    let mut ev = hit(seq);
    if let Some(Event::Hit(h)) = &mut ev.event {
        h.ip = 0x5555_0000_1111;
        h.location = Some(frame(0x5555_0000_1111, "set_counter", 17));
        h.backtrace = vec![frame(0x5555_0000_1222, "main", 42)];
    }
    ev
}

/// `located_hit(seq)` as a stream with places once sends it: its place
/// numbered 1, its caller's 2, and when the stream has had them
/// (`first` false) nothing else of them.
fn numbered_hit(seq: u64, first: bool) -> StreamEventsResponse {
    let mut ev = located_hit(seq);
    if let Some(Event::Hit(h)) = &mut ev.event {
        for (loc, id) in h.location.iter_mut().chain(&mut h.backtrace).zip(1..) {
            loc.place_id = id;
            if !first {
                *loc = Location {
                    ip: loc.ip,
                    lookup_address: loc.lookup_address,
                    place_id: id,
                    ..Default::default()
                };
            }
        }
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
        value_type: None,
        objects: None,
        object_watchpoints: vec![],
        breakpoint: None,
        pending: false,
        pending_reason: String::new(),
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
        value_type: Some(wpd_proto::v1::ValueType {
            kind: wpd_proto::v1::ValueKind::Signed as i32,
            size: 4,
            name: "int".into(),
            ..Default::default()
        }),
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
                code_events: String::new(),
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

    /// pid 1: three events, then the stream ends. pid 2: a hit every 5 ms,
    /// forever. pid 3: one stopping only-on-change hit, then the end.
    /// pid 4: one symbolized hit with a backtrace, then the end.
    /// pid 6: no journal (a replay is refused with reason NO_JOURNAL).
    /// pid 7: echoes the replay fields: `after_seq` N gives the hits N+1 and
    /// N+2, `since_time_ns` T one hit at time T (seq 1), then the end.
    /// pid 4: two hits at the same places, sent once (`places_once`, which
    /// the caller must ask for).
    /// Otherwise: a hit, a drop notice, a thread start, then silence.
    async fn stream_events(
        &self,
        r: Request<StreamEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let req = r.get_ref();
        let replaying = req.after_seq.is_some() || req.since_time_ns.is_some();
        if req.pid == 4 && !req.places_once {
            return Err(Status::invalid_argument(
                "the located hits of pid 4 are for a stream with places once",
            ));
        }
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
            return Ok(Response::new(served(tokio_stream::iter(events))));
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
        let stream: Events = match r.into_inner().pid {
            // Code breakpoints (id 9): pid 8's stop is lost to a drop (the
            // stream goes on), pid 9's comes after another breakpoint's,
            // pid 10 exits.
            8 => Box::pin(
                tokio_stream::iter(vec![Ok(event(
                    1,
                    Event::Dropped(EventsDropped {
                        count: 1,
                        first_seq: 1,
                        last_seq: 1,
                    }),
                ))])
                .chain(tokio_stream::pending()),
            ),
            9 => {
                let mut other = break_stop(1, 90);
                if let Some(Event::BreakpointHit(b)) = other.event.as_mut() {
                    b.watchpoint_id = 4;
                }
                Box::pin(
                    tokio_stream::iter(vec![Ok(other), Ok(break_stop(2, 91))])
                        .chain(tokio_stream::pending()),
                )
            }
            10 => Box::pin(
                tokio_stream::iter(vec![Ok(event(
                    1,
                    Event::ProcessExited(ProcessExited {
                        pid: 10,
                        watchpoint_ids: vec![9],
                    }),
                ))])
                .chain(tokio_stream::pending()),
            ),
            1 => Box::pin(tokio_stream::iter(first)),
            3 => Box::pin(tokio_stream::iter(vec![Ok(stopping_hit(1))])),
            4 => Box::pin(tokio_stream::iter(vec![
                Ok(numbered_hit(1, true)),
                Ok(numbered_hit(2, false)),
            ])),
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
        Ok(Response::new(served(stream)))
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

    /// Watchpoint 7 kept two hits of 42 in all; others do not exist.
    async fn get_recent_hits(
        &self,
        r: Request<GetRecentHitsRequest>,
    ) -> Result<Response<GetRecentHitsResponse>, Status> {
        let r = r.into_inner();
        if r.watchpoint_id == 9 {
            return Ok(Response::new(GetRecentHitsResponse {
                value_type: None,
                hits: vec![break_stop(30, 81)],
                total: 1,
            }));
        }
        if r.watchpoint_id != 7 {
            return Err(Status::not_found(format!(
                "no watchpoint #{}",
                r.watchpoint_id
            )));
        }
        let hit = |seq: u64, tid: i32, value: u8| StreamEventsResponse {
            seq,
            time_ns: 1,
            owner: None,
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
        Ok(Response::new(GetRecentHitsResponse {
            hits,
            total: 42,
            value_type: None,
        }))
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
