//! `wpctl` against daemons that do not play fair, and with tokens: names
//! chosen to forge lines and drive the terminal, answers and events over the
//! size limits, endless streams of them, and which daemon gets which token.

use std::sync::{Arc, Mutex};

use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};
use wpd_proto::v1::stream_events_response::Event;
use wpd_proto::v1::watchpoints_server::{Watchpoints, WatchpointsServer};
use wpd_proto::v1::*;

use super::mock::served;
use super::{EventStream, Run, TempDir, endpoints_file, wpctl};

/// A thread or process name as a hostile program would choose it: a newline
/// and a forged host tag, a title-setting escape sequence, a bell, a
/// right-to-left override, a carriage return, Unicode line separators.
const EVIL: &str = "evil\n[other] \x1b]0;pwned\x07\u{202e}gnp.exe\r\u{2028}\u{85}end";

/// A daemon whose every name, path, reason and message is [`EVIL`], and
/// whose answers and events can be made large or endless.
#[derive(Clone, Default)]
struct Hostile {
    /// Bytes of the `comm` of the process `list` shows (0: [`EVIL`]).
    list_bytes: usize,
    /// Bytes of each hit's thread name (0: [`EVIL`]).
    event_bytes: usize,
    /// Events never end.
    endless: bool,
}

impl Hostile {
    fn padded(bytes: usize) -> String {
        if bytes == 0 {
            EVIL.into()
        } else {
            "x".repeat(bytes)
        }
    }

    fn location() -> Location {
        Location {
            ip: 0x401000,
            lookup_address: 0x400fff,
            function: EVIL.into(),
            file: EVIL.into(),
            line: 7,
            module: EVIL.into(),
            inlined: vec![InlinedCall {
                function: EVIL.into(),
                file: EVIL.into(),
                line: 3,
            }],
            ..Default::default()
        }
    }

    fn symbol() -> Symbol {
        Symbol {
            expression: EVIL.into(),
            name: EVIL.into(),
            module: EVIL.into(),
            type_name: EVIL.into(),
            size: 4,
            address: 0x4010,
            note: EVIL.into(),
            ..Default::default()
        }
    }

    fn watchpoint() -> Watchpoint {
        Watchpoint {
            id: 7,
            spec: Some(WatchpointSpec {
                pid: 123,
                address: 0x4010,
                length: 4,
                access: Access::Write as i32,
                thread_name: EVIL.into(),
                symbol: EVIL.into(),
                ..Default::default()
            }),
            symbol: Some(Self::symbol()),
            armed_threads: 1,
            ..Default::default()
        }
    }

    fn policy() -> Policy {
        Policy {
            id: 9,
            selector: Some(ProcessSelector {
                pids: vec![],
                comm: EVIL.into(),
                exe: EVIL.into(),
                cgroup: EVIL.into(),
            }),
            spec: Some(WatchpointSpec {
                symbol: EVIL.into(),
                ..Default::default()
            }),
            instances: vec![PolicyInstance {
                pid: 321,
                comm: EVIL.into(),
                watchpoint_id: 10,
                ..Default::default()
            }],
            refusals: vec![PolicyRefusal {
                pid: 322,
                comm: EVIL.into(),
                reason: EVIL.into(),
                at_ns: 1,
            }],
            ..Default::default()
        }
    }

    fn hit(&self, seq: u64) -> StreamEventsResponse {
        StreamEventsResponse {
            seq,
            time_ns: 1_700_000_000_000_000_000,
            owner: None,
            event: Some(Event::Hit(Hit {
                watchpoint_id: 7,
                pid: 123,
                tid: 124,
                process_name: EVIL.into(),
                thread_name: Self::padded(self.event_bytes),
                location: Some(Self::location()),
                backtrace: vec![Self::location()],
                backtrace_note: EVIL.into(),
                value_error: EVIL.into(),
                ..Default::default()
            })),
        }
    }
}

#[tonic::async_trait]
impl Watchpoints for Hostile {
    async fn get_capabilities(
        &self,
        _: Request<GetCapabilitiesRequest>,
    ) -> Result<Response<GetCapabilitiesResponse>, Status> {
        Ok(Response::new(GetCapabilitiesResponse {
            arch: EVIL.into(),
            kernel: EVIL.into(),
            version: EVIL.into(),
            backends: vec![BackendInfo {
                backend: Backend::Perf as i32,
                reason: EVIL.into(),
                stops: EVIL.into(),
                events: EVIL.into(),
                new_processes: EVIL.into(),
                usable: true,
                ..Default::default()
            }],
            ..Default::default()
        }))
    }

    async fn attach(&self, _: Request<AttachRequest>) -> Result<Response<AttachResponse>, Status> {
        Err(Status::failed_precondition(EVIL))
    }

    async fn detach(&self, _: Request<DetachRequest>) -> Result<Response<DetachResponse>, Status> {
        Err(Status::not_found(EVIL))
    }

    async fn set_watchpoint(
        &self,
        _: Request<SetWatchpointRequest>,
    ) -> Result<Response<SetWatchpointResponse>, Status> {
        Ok(Response::new(SetWatchpointResponse {
            watchpoint: Some(Self::watchpoint()),
            warnings: vec![EVIL.into()],
            symbol: Some(Self::symbol()),
            arm_duration_ns: 1,
        }))
    }

    async fn remove_watchpoint(
        &self,
        _: Request<RemoveWatchpointRequest>,
    ) -> Result<Response<RemoveWatchpointResponse>, Status> {
        Ok(Response::new(RemoveWatchpointResponse {
            watchpoint: Some(Self::watchpoint()),
        }))
    }

    async fn list_watchpoints(
        &self,
        _: Request<ListWatchpointsRequest>,
    ) -> Result<Response<ListWatchpointsResponse>, Status> {
        Ok(Response::new(ListWatchpointsResponse {
            watchpoints: vec![Self::watchpoint()],
            processes: vec![ProcessInfo {
                pid: 123,
                comm: Self::padded(self.list_bytes),
                stops: EVIL.into(),
                ..Default::default()
            }],
            policies: vec![Self::policy()],
            not_restored: vec![NotRestored {
                saved_id: 4,
                spec: Some(WatchpointSpec {
                    symbol: EVIL.into(),
                    ..Default::default()
                }),
                reason: EVIL.into(),
                ..Default::default()
            }],
        }))
    }

    async fn list_threads(
        &self,
        _: Request<ListThreadsRequest>,
    ) -> Result<Response<ListThreadsResponse>, Status> {
        Ok(Response::new(ListThreadsResponse {
            pid: 123,
            slots_per_thread: 4,
            threads: vec![ThreadInfo {
                tid: 124,
                name: EVIL.into(),
                ..Default::default()
            }],
        }))
    }

    type StreamEventsStream = EventStream;

    async fn stream_events(
        &self,
        _: Request<StreamEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let removed = StreamEventsResponse {
            seq: 2,
            time_ns: 1,
            owner: None,
            event: Some(Event::WatchpointRemoved(WatchpointRemoved {
                watchpoint_id: 7,
                pid: 123,
                reason: EVIL.into(),
            })),
        };
        let lost = StreamEventsResponse {
            seq: 3,
            time_ns: 1,
            owner: None,
            event: Some(Event::ProcessLost(ProcessLost {
                pid: 123,
                reason: EVIL.into(),
                watchpoint_ids: vec![7],
            })),
        };
        let first = vec![Ok(self.hit(1)), Ok(removed), Ok(lost)];
        if self.endless {
            let me = self.clone();
            let more = tokio_stream::iter(4u64..).map(move |seq| Ok(me.hit(seq)));
            return Ok(Response::new(served(tokio_stream::iter(first).chain(more))));
        }
        Ok(Response::new(served(tokio_stream::iter(first))))
    }

    async fn get_stats(
        &self,
        _: Request<GetStatsRequest>,
    ) -> Result<Response<GetStatsResponse>, Status> {
        Ok(Response::new(GetStatsResponse::default()))
    }

    async fn resume(&self, _: Request<ResumeRequest>) -> Result<Response<ResumeResponse>, Status> {
        Ok(Response::new(ResumeResponse::default()))
    }

    async fn resolve_symbol(
        &self,
        _: Request<ResolveSymbolRequest>,
    ) -> Result<Response<ResolveSymbolResponse>, Status> {
        Ok(Response::new(ResolveSymbolResponse {
            value_error: String::new(),
            value_name: String::new(),
            symbol: Some(Self::symbol()),
            location: Some(Self::location()),
            kind: EVIL.into(),
            offset: 0,
            value: EVIL.as_bytes().to_vec(),
            from_frame: false,
        }))
    }

    async fn pause(&self, _: Request<PauseRequest>) -> Result<Response<PauseResponse>, Status> {
        Ok(Response::new(PauseResponse::default()))
    }

    async fn step(
        &self,
        _: Request<wpd_proto::v1::StepRequest>,
    ) -> Result<Response<wpd_proto::v1::StepResponse>, Status> {
        Ok(Response::new(wpd_proto::v1::StepResponse {
            end: wpd_proto::v1::StepEnd::Done as i32,
            frames: vec![Self::location()],
            note: EVIL.into(),
            ..Default::default()
        }))
    }

    async fn write_memory(
        &self,
        _: Request<wpd_proto::v1::WriteMemoryRequest>,
    ) -> Result<Response<wpd_proto::v1::WriteMemoryResponse>, Status> {
        Ok(Response::new(wpd_proto::v1::WriteMemoryResponse {
            written: 0,
            error: EVIL.into(),
        }))
    }

    async fn get_thread_stack(
        &self,
        _: Request<GetThreadStackRequest>,
    ) -> Result<Response<GetThreadStackResponse>, Status> {
        Ok(Response::new(GetThreadStackResponse {
            frames: vec![Self::location()],
            note: EVIL.into(),
            sp: 0,
            fp: 0,
            registers: vec![wpd_proto::v1::Register {
                name: EVIL.into(),
                value: 0,
            }],
            locals: vec![wpd_proto::v1::FrameLocals {
                variables: vec![wpd_proto::v1::LocalVariable {
                    name: EVIL.into(),
                    r#type: EVIL.into(),
                    error: EVIL.into(),
                    ..Default::default()
                }],
                note: EVIL.into(),
            }],
        }))
    }

    async fn read_memory(
        &self,
        _: Request<ReadMemoryRequest>,
    ) -> Result<Response<ReadMemoryResponse>, Status> {
        Err(Status::unimplemented(EVIL))
    }

    async fn get_recent_hits(
        &self,
        _: Request<GetRecentHitsRequest>,
    ) -> Result<Response<GetRecentHitsResponse>, Status> {
        Ok(Response::new(GetRecentHitsResponse {
            value_type: None,
            hits: vec![self.hit(1)],
            total: 1,
        }))
    }

    async fn set_policy(
        &self,
        _: Request<SetPolicyRequest>,
    ) -> Result<Response<SetPolicyResponse>, Status> {
        Ok(Response::new(SetPolicyResponse {
            policy: Some(Self::policy()),
        }))
    }

    async fn list_variables(
        &self,
        _: Request<wpd_proto::v1::ListVariablesRequest>,
    ) -> Result<Response<wpd_proto::v1::ListVariablesResponse>, Status> {
        Err(Status::unimplemented("wpctl does not list variables"))
    }

    async fn get_hit_aggregates(
        &self,
        _: Request<GetHitAggregatesRequest>,
    ) -> Result<Response<GetHitAggregatesResponse>, Status> {
        Ok(Response::new(GetHitAggregatesResponse {
            watchpoint_id: 7,
            pid: 123,
            aggregates: vec![HitAggregate {
                ip: 0x401000,
                location: Some(Self::location()),
                tid: 124,
                thread_name: EVIL.into(),
                count: 1,
                ..Default::default()
            }],
            ..Default::default()
        }))
    }
}

/// The `authorization` header of every call a daemon received (`None`:
/// without one).
type Seen = Arc<Mutex<Vec<Option<String>>>>;

/// Serves `daemon` on a fresh Unix socket, recording the tokens it is sent.
async fn serve(daemon: Hostile) -> (String, TempDir, Seen) {
    let dir = TempDir::new("hostile");
    let path = dir.socket();
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let seen = Seen::default();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(recording(daemon, seen.clone()))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    (format!("unix:{}", path.display()), dir, seen)
}

/// `daemon` behind an interceptor that records each call's token in `seen`.
fn recording(
    daemon: Hostile,
    seen: Seen,
) -> tonic::service::interceptor::InterceptedService<
    WatchpointsServer<Hostile>,
    impl tonic::service::Interceptor + Clone,
> {
    let server = WatchpointsServer::new(daemon).max_encoding_message_size(usize::MAX);
    tonic::service::interceptor::InterceptedService::new(server, move |r: Request<()>| {
        let token = r
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().unwrap_or("<not text>").to_string());
        seen.lock().unwrap().push(token);
        Ok(r)
    })
}

/// Whether `c` may reach a terminal: printable, or the newline between lines.
fn terminal_safe(c: char) -> bool {
    c == '\n' || wpd_proto::text::is_plain(c.encode_utf8(&mut [0; 4])) || c == '\\'
}

/// Nothing in the output drives a terminal; in text mode the name shows,
/// escaped, and no line is forged: each line starts with one of `tags` (none
/// for one daemon) and none (after its tag) with `[other]`.
fn check_text(what: &str, r: &Run, tags: &[&str]) {
    for (stream, text) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
        let bad: Vec<char> = text.chars().filter(|&c| !terminal_safe(c)).collect();
        assert!(bad.is_empty(), "{what}: {stream} holds {bad:?}:\n{text}");
        for line in text.lines() {
            let line = line.trim_start_matches("wpctl: ");
            let rest = tags
                .iter()
                .find_map(|t| line.strip_prefix(t))
                .unwrap_or_else(|| {
                    assert!(
                        tags.is_empty(),
                        "{what}: {stream} line without a tag: {line:?}"
                    );
                    line
                });
            assert!(
                !rest.trim_start().starts_with("[other]"),
                "{what}: {stream} line forged: {line:?}\n{text}"
            );
        }
    }
    // A daemon's error message is shown on one line: its lines joined by `; `.
    let shown = wpd_proto::text::escape(EVIL);
    let joined = wpd_proto::text::escape(&EVIL.replace('\n', "; ")).into_owned();
    assert!(
        r.stdout.contains(&*shown) || r.stderr.contains(&*shown) || r.stderr.contains(&joined),
        "{what}: the name escaped ({shown}) is not shown:\n{}\n{}",
        r.stdout,
        r.stderr
    );
}

/// True when some string in `v` is exactly [`EVIL`].
fn holds_evil(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s == EVIL,
        serde_json::Value::Array(a) => a.iter().any(holds_evil),
        serde_json::Value::Object(m) => m.values().any(holds_evil),
        _ => false,
    }
}

/// `--json`: nothing that drives a terminal or breaks a line; `records`
/// JSON values (one per line when `lines`, else one document), one of them
/// holding the name exactly as sent.
fn check_json(what: &str, r: &Run, lines: bool, records: usize) {
    let bad: Vec<char> = r.stdout.chars().filter(|&c| !terminal_safe(c)).collect();
    assert!(bad.is_empty(), "{what}: JSON holds {bad:?}:\n{}", r.stdout);
    let values: Vec<serde_json::Value> = if lines {
        r.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: {e}: {l:?}")))
            .collect()
    } else {
        vec![serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{what}: {e}"))]
    };
    assert_eq!(values.len(), records, "{what}:\n{}", r.stdout);
    assert!(
        values.iter().any(holds_evil),
        "{what}: the name did not come through:\n{}",
        r.stdout
    );
}

/// Every human-readable output of a target's or daemon's text escapes it
/// (no forged line, no escape sequence, no bidi override reaching the
/// terminal), on stdout and stderr, for one daemon and for several; JSON
/// keeps it exactly, one record per line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_cannot_forge_lines_or_drive_the_terminal() {
    let (ep, _dir, _) = serve(Hostile::default()).await;
    let commands: &[&[&str]] = &[
        &["caps"],
        &["list"],
        &["threads", "--pid", "123"],
        &["events", "--count", "3"],
        &["watch", "--pid", "123", "--symbol", "x"],
        &["watch", "--comm", "x", "--symbol", "x"],
        &["unwatch", "7"],
        &["symbol", "--pid", "123", "x"],
        &["symbol", "--pid", "123", "0x401000"],
        &["stack", "--pid", "123", "--tid", "124"],
        &["stack", "--pid", "123", "--tid", "124", "--registers"],
        &["stack", "--pid", "123", "--tid", "124", "--locals"],
        &["last", "7"],
        &["aggregates", "7"],
        &["attach", "--pid", "123"],
        &["detach", "--pid", "123"],
    ];
    for args in commands {
        let what = args.join(" ");
        let r = wpctl(&ep, args).await;
        check_text(&what, &r, &[]);
        let mut json = vec!["--json"];
        json.extend_from_slice(args);
        let r = wpctl(&ep, &json).await;
        if r.code == 0 {
            let lines = args[0] == "events";
            check_json(&what, &r, lines, if lines { 3 } else { 1 });
        } else {
            let v: serde_json::Value = serde_json::from_str(r.stderr.trim()).unwrap();
            assert!(v["error"]["message"].is_string(), "{what}: {v}");
            assert!(!r.stderr.trim().contains('\n'), "{what}: {}", r.stderr);
        }
    }

    // Several daemons: every line keeps its own host's tag.
    let (other, _dir2, _) = serve(Hostile::default()).await;
    let dir = TempDir::new("hostile-fleet");
    let file = endpoints_file(&dir, &[format!("a {ep}"), format!("b {other}")]);
    for args in [&["list"][..], &["events", "--count", "6"], &["caps"]] {
        let mut all = vec!["--endpoints-file", &file];
        all.extend_from_slice(args);
        let r = wpctl(&ep, &all).await;
        assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
        check_text(&args.join(" "), &r, &["[a]", "[b]"]);
        all.insert(0, "--json");
        let r = wpctl(&ep, &all).await;
        let n = if args[0] == "events" { 6 } else { 2 };
        check_json(&args.join(" "), &r, true, n);
    }
    // A daemon's refusal is one line per host.
    let r = wpctl(&ep, &["--endpoints-file", &file, "unwatch", "--id", "0"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = wpctl(
        &ep,
        &[
            "--endpoints-file",
            &file,
            "watch",
            "--comm",
            "x",
            "--symbol",
            "y",
        ],
    )
    .await;
    check_text("fleet watch", &r, &["[a]", "[b]"]);
}

/// An answer over the size wpctl takes is refused before it is read: one
/// clear line naming the daemon (exit 1); with several daemons that host
/// alone fails (exit 9) and the others answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_over_the_limit_are_refused() {
    let (huge, _dh, _) = serve(Hostile {
        list_bytes: 65 << 20,
        ..Default::default()
    })
    .await;
    let r = wpctl(&huge, &["list"]).await;
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stdout.is_empty());
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.starts_with(&format!(
            "wpctl: wpd at {huge} sent too much: a message too large to take (found "
        )),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("the limit is: 67108864 bytes"),
        "{}",
        r.stderr
    );

    let (fine, _df, _) = serve(Hostile::default()).await;
    let dir = TempDir::new("huge-fleet");
    let file = endpoints_file(&dir, &[format!("huge {huge}"), format!("fine {fine}")]);
    let r = wpctl(&fine, &["--endpoints-file", &file, "--json", "list"]).await;
    assert_eq!(r.code, 9, "{}", r.stderr);
    let records: Vec<serde_json::Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 2, "{}", r.stdout);
    assert_eq!(records[0]["host"], "huge");
    assert_eq!(records[0]["error"]["code"], "RESOURCE_EXHAUSTED");
    assert_eq!(records[1]["host"], "fine");
    assert_eq!(records[1]["processes"][0]["pid"], 123);
}

/// Events: one over the event limit (4 MiB) ends the stream with one clear
/// line. With several daemons, a host streaming such events without end is
/// cut off and named while the others' events go on (exit 9).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_over_the_limit_cut_their_host_off() {
    let flood = Hostile {
        event_bytes: 5 << 20,
        endless: true,
        ..Default::default()
    };
    let (big, _db, _) = serve(flood).await;
    let r = wpctl(&big, &["events", "--count", "10"]).await;
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.starts_with(&format!(
            "wpctl: wpd at {big} sent too much: a message too large to take (found "
        )) && r.stderr.contains("the limit is: 4194304 bytes"),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);

    let (fine, _df, _) = serve(Hostile::default()).await;
    let dir = TempDir::new("flood-fleet");
    let file = endpoints_file(&dir, &[format!("flood {big}"), format!("fine {fine}")]);
    let r = wpctl(&fine, &["--endpoints-file", &file, "events"]).await;
    assert_eq!(r.code, 9, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(
        lines.iter().all(|l| l.starts_with("[fine] ")),
        "{}",
        r.stdout
    );
    // The fine host's hit (its backtrace frame and note on lines of their
    // own), its wp-removed and process-lost lines.
    assert_eq!(lines.len(), 5, "{}", r.stdout);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr
            .starts_with(&format!("wpctl: [flood] wpd at {big} sent too much: ")),
        "{}",
        r.stderr
    );
}

/// Writes a token file with this mode; returns its path.
fn token_file(dir: &TempDir, name: &str, token: &str, mode: u32) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.0.join(name);
    std::fs::write(&path, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path.display().to_string()
}

/// The tokens a daemon received, in order.
fn tokens(seen: &Seen) -> Vec<Option<String>> {
    seen.lock().unwrap().clone()
}

/// `--token-file` goes to the `--endpoint` daemons only; each line of an
/// endpoints file gets its own `token-file=` or none. `--token-file` with
/// an endpoints file and no `--endpoint` is refused, as it would go nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_daemon_gets_its_own_token_only() {
    let (a, _da, seen_a) = serve(Hostile::default()).await;
    let (b, _db, seen_b) = serve(Hostile::default()).await;
    let (c, _dc, seen_c) = serve(Hostile::default()).await;
    let dir = TempDir::new("tokens");
    let global = token_file(&dir, "global.token", "global-secret", 0o600);
    token_file(&dir, "a.token", "a-secret", 0o600);
    let file = endpoints_file(
        &dir,
        &[format!("a {a} token-file=a.token"), format!("b {b}")],
    );

    let r = wpctl(
        &c,
        &[
            "--token-file",
            &global,
            "--endpoint",
            &c,
            "--endpoints-file",
            &file,
            "stats",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(tokens(&seen_a), [Some("Bearer a-secret".to_string())]);
    assert_eq!(tokens(&seen_b), [None]);
    assert_eq!(tokens(&seen_c), [Some("Bearer global-secret".to_string())]);

    // Events too (a stream is a call of its own).
    let r = wpctl(&c, &["--endpoints-file", &file, "events", "--count", "6"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(tokens(&seen_a)[1], Some("Bearer a-secret".to_string()));
    assert_eq!(tokens(&seen_b)[1], None);

    // The global token with nowhere to go: refused, nothing sent.
    let r = wpctl(
        &c,
        &["--token-file", &global, "--endpoints-file", &file, "stats"],
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("--token-file is sent only to the daemons named by --endpoint"),
        "{}",
        r.stderr
    );
    assert_eq!(tokens(&seen_a).len(), 2);
    assert_eq!(tokens(&seen_b).len(), 2);
    // WPD_TOKEN_FILE serves --endpoint (here WPD_ENDPOINT) and never a line.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_wpctl"))
        .args(["--endpoints-file", &file, "stats"])
        .env("WPD_TOKEN_FILE", &global)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(tokens(&seen_b)[2], None);
    assert_eq!(tokens(&seen_a)[2], Some("Bearer a-secret".to_string()));
}

/// A token file its group or others may read or write, or another user's,
/// is refused with how to fix it, before anything is sent; so is one
/// holding no token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_files_must_be_private() {
    let (ep, _d, seen) = serve(Hostile::default()).await;
    let dir = TempDir::new("token-modes");
    for mode in [0o644, 0o640, 0o620, 0o604] {
        let path = token_file(&dir, &format!("t{mode:o}"), "s3cret", mode);
        let r = wpctl(&ep, &["--token-file", &path, "caps"]).await;
        assert_eq!(r.code, 2, "{mode:o}: {}", r.stderr);
        assert_eq!(
            r.stderr,
            format!(
                "wpctl: token file {path} is open to its group or to others (mode {mode:04o}): \
                 a token must be readable by you only; run `chmod 600 {path}`\n"
            )
        );
        // The same from an endpoints file's line.
        let file = endpoints_file(&dir, &[format!("h {ep} token-file={path}")]);
        let r = wpctl(&ep, &["--endpoints-file", &file, "caps"]).await;
        assert_eq!(r.code, 2, "{mode:o}: {}", r.stderr);
        assert!(r.stderr.contains("chmod 600"), "{}", r.stderr);
        assert!(!r.stderr.contains("s3cret") && !r.stdout.contains("s3cret"));
    }
    assert!(
        tokens(&seen).is_empty(),
        "a call was made: {:?}",
        tokens(&seen)
    );
    let ok = token_file(&dir, "ok", "s3cret", 0o600);
    let r = wpctl(&ep, &["--token-file", &ok, "caps"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(tokens(&seen), [Some("Bearer s3cret".to_string())]);
    if wpd_test_skip::require_root("giving a token file to another uid") {
        std::os::unix::fs::chown(&ok, Some(65534), None).unwrap();
        let r = wpctl(&ep, &["--token-file", &ok, "caps"]).await;
        assert_eq!(r.code, 2, "{}", r.stderr);
        assert!(
            r.stderr
                .contains("belongs to uid 65534, not to you (uid 0)"),
            "{}",
            r.stderr
        );
    }
    let empty = token_file(&dir, "empty", "", 0o600);
    let r = wpctl(&ep, &["--token-file", &empty, "caps"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("is empty"), "{}", r.stderr);
    assert_eq!(tokens(&seen).len(), 1);
}

/// A token goes over plaintext TCP to loopback only: to another address the
/// command is refused before connecting, naming https://.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_over_plaintext_beyond_loopback() {
    let dir = TempDir::new("plaintext");
    let token = token_file(&dir, "token", "s3cret", 0o600);
    for remote in ["tcp://192.0.2.1:7070", "tcp://wpd.example:7070"] {
        let r = wpctl(remote, &["--timeout", "3", "--token-file", &token, "caps"]).await;
        assert_eq!(r.code, 2, "{remote}: {}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
        let tls = remote.replace("tcp://", "https://");
        assert!(
            r.stderr.starts_with(&format!(
                "wpctl: refusing to send the token in plaintext to {remote}, which is not a \
                 loopback address: use {tls} "
            )),
            "{}",
            r.stderr
        );
        assert!(!r.stderr.contains("s3cret"));
        // From an endpoints file's line too.
        let file = endpoints_file(&dir, &[format!("far {remote} token-file=token")]);
        let r = wpctl(remote, &["--endpoints-file", &file, "caps"]).await;
        assert_eq!(r.code, 2, "{}", r.stderr);
        assert!(
            r.stderr.contains("refusing to send the token"),
            "{}",
            r.stderr
        );
    }
    // Loopback TCP: sent.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Seen::default();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(recording(Hostile::default(), seen.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let ep = format!("tcp://127.0.0.1:{port}");
    let r = wpctl(&ep, &["--token-file", &token, "stats"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(tokens(&seen), [Some("Bearer s3cret".to_string())]);
}
