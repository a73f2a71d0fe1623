//! One debug session: DAP requests in, daemon calls and events out.
//!
//! Three tasks: a reader (client messages), the daemon's event stream, and
//! the session loop, which owns all state and handles one input at a time;
//! a writer numbers and sends what the loop produces. Whatever ends the
//! session (a `disconnect`, the client's input closing, a read error) ends
//! in [`Session::cleanup`].

use std::collections::HashMap;

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use wpd_proto::v1 as pb;

use crate::Daemon;
use crate::protocol::requests::*;
use crate::protocol::*;
use crate::spec::{self, Target};
use crate::wire;

/// Frames a `stackTrace` without `levels` gets.
const DEFAULT_DEPTH: u32 = 64;

/// What the loop reacts to.
enum Input {
    Request(Value),
    /// The client's side ended (EOF or a broken message).
    Closed(String),
    Event(Box<pb::StreamEventsResponse>),
    /// The daemon's event stream ended.
    EventsEnded(String),
}

/// How hits stop the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopMode {
    All,
    Thread,
    /// perf backend: nothing stops, hits go to the console.
    Never,
}

/// A breakpoint armed in the daemon.
#[derive(Debug)]
struct Armed {
    /// What the client asked (the diff key).
    asked: DataBreakpoint,
    dap_id: i64,
    wp_id: u64,
    /// Shown name.
    expr: String,
    addr: u64,
    len: u32,
    type_name: String,
    /// The bytes at arming or at the last hit shown: the "old" value of the
    /// next hit.
    last: Option<Vec<u8>>,
}

/// The last hit a thread stopped at.
#[derive(Debug, Clone)]
struct StopInfo {
    dap_id: i64,
    expr: String,
    type_name: String,
    old: Option<Vec<u8>>,
    new: Vec<u8>,
    addr: u64,
    location: String,
}

/// A `variablesReference`.
#[derive(Debug, Clone)]
enum Container {
    Watched,
    Hit(i32),
}

/// What `dataBreakpointInfo` learnt of a target.
#[derive(Debug, Clone)]
struct Known {
    expr: String,
    addr: u64,
    len: u32,
    type_name: String,
}

impl Known {
    /// `len` bytes at `addr`, of no known type.
    fn address(addr: u64, len: u32) -> Known {
        Known {
            expr: format!("{len} bytes at {addr:#x}"),
            addr,
            len,
            type_name: String::new(),
        }
    }
}

struct Session {
    daemon: Daemon,
    out: mpsc::UnboundedSender<Value>,
    inputs: mpsc::Sender<Input>,
    pid: Option<i32>,
    attached_by_us: bool,
    mode: StopMode,
    /// The event stream's lease (watchpoints die with it).
    lease: u64,
    armed: Vec<Armed>,
    next_id: i64,
    known: HashMap<Target, Known>,
    /// A stop is being shown (until continue).
    stopped: bool,
    stops: HashMap<i32, StopInfo>,
    frames: HashMap<i64, i32>,
    next_frame: i64,
    vars: HashMap<i64, Container>,
    next_var: i64,
    events: Option<tokio::task::JoinHandle<()>>,
    ended: bool,
}

/// Runs one debug session over `r`/`w` until it ends; on every way out the
/// session's breakpoints are removed and its held threads resumed.
pub async fn run<R, W>(r: R, w: W, daemon: Daemon) -> Result<(), String>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, mut out_rx) = mpsc::unbounded_channel::<Value>();
    let writer = tokio::spawn(async move {
        let mut w = w;
        let mut seq = 0i64;
        while let Some(mut m) = out_rx.recv().await {
            seq += 1;
            m["seq"] = json!(seq);
            if wire::write_message(&mut w, &m).await.is_err() {
                break;
            }
        }
    });
    let (tx, mut rx) = mpsc::channel::<Input>(1024);
    let reader_tx = tx.clone();
    let reader = tokio::spawn(async move {
        let mut r = BufReader::new(r);
        loop {
            match wire::read_message(&mut r).await {
                Ok(v) => {
                    if reader_tx.send(Input::Request(v)).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = reader_tx.send(Input::Closed(e.to_string())).await;
                    return;
                }
            }
        }
    });
    let mut s = Session {
        daemon,
        out,
        inputs: tx,
        pid: None,
        attached_by_us: false,
        mode: StopMode::All,
        lease: 0,
        armed: Vec::new(),
        next_id: 1,
        known: HashMap::new(),
        stopped: false,
        stops: HashMap::new(),
        frames: HashMap::new(),
        next_frame: 1,
        vars: HashMap::new(),
        next_var: 1,
        events: None,
        ended: false,
    };
    let mut why = Ok(());
    while let Some(input) = rx.recv().await {
        match input {
            Input::Request(req) => s.request(req).await,
            Input::Closed(e) => {
                if !e.contains("closed") {
                    why = Err(e);
                }
                break;
            }
            Input::Event(ev) => s.event(*ev).await,
            Input::EventsEnded(e) => {
                if s.pid.is_some() && !s.ended {
                    s.output("important", &format!("wpd: the event stream ended: {e}"));
                    s.event_msg("terminated", json!({}));
                }
            }
        }
        if s.ended {
            break;
        }
    }
    if let Err(e) = s.cleanup().await {
        tracing::warn!("session cleanup: {}", wpd_proto::text::escape(&e));
    }
    reader.abort();
    drop(s);
    let _ = writer.await;
    why
}

/// A daemon error as one line.
fn status_text(st: &tonic::Status) -> String {
    let m = st.message();
    if m.is_empty() {
        format!("wpd: {:?}", st.code())
    } else {
        m.to_string()
    }
}

impl Session {
    fn send(&self, m: Value) {
        let _ = self.out.send(m);
    }

    fn event_msg(&self, event: &str, body: Value) {
        self.send(json!({"type": "event", "event": event, "body": body}));
    }

    /// A line in the IDE's debug console.
    fn output(&self, category: &str, text: &str) {
        self.event_msg("output", output_body(category, text));
    }

    fn respond(&self, req: &Value, result: Result<Value, String>) {
        let mut m = json!({
            "type": "response",
            "request_seq": req["seq"],
            "command": req["command"],
            "success": result.is_ok(),
        });
        match result {
            Ok(Value::Null) => {}
            Ok(body) => m["body"] = body,
            Err(message) => {
                m["message"] = json!(message);
                m["body"] = json!({"error": {"id": 1, "format": message, "showUser": true}});
            }
        }
        self.send(m);
    }

    fn pid(&self) -> Result<i32, String> {
        self.pid
            .ok_or_else(|| "not attached: send `attach` with a pid first".to_string())
    }

    fn client(
        &self,
    ) -> wpd_proto::v1::watchpoints_client::WatchpointsClient<tonic::transport::Channel> {
        self.daemon.client.clone()
    }

    async fn request(&mut self, req: Value) {
        let command = req["command"].as_str().unwrap_or("").to_string();
        let args = req.get("arguments").cloned().unwrap_or(Value::Null);
        fn parse<T: serde::de::DeserializeOwned>(args: Value) -> Result<T, String> {
            serde_json::from_value(args).map_err(|e| format!("bad arguments: {e}"))
        }
        let result = match command.as_str() {
            "initialize" => Ok(serde_json::to_value(Capabilities::wpd()).unwrap_or(Value::Null)),
            "attach" => match parse(args) {
                Ok(a) => self.attach(a).await,
                Err(e) => Err(e),
            },
            "launch" => Err(
                "wpctl dap attaches to running processes: use an \"attach\" \
                             configuration with a pid"
                    .into(),
            ),
            "configurationDone" => Ok(Value::Null),
            "dataBreakpointInfo" => match parse(args) {
                Ok(a) => self.data_breakpoint_info(a).await,
                Err(e) => Err(e),
            },
            "setDataBreakpoints" => match parse(args) {
                Ok(a) => self.set_data_breakpoints(a).await,
                Err(e) => Err(e),
            },
            "setBreakpoints" => {
                let n = args["breakpoints"].as_array().map_or(0, Vec::len);
                let bp = json!({"verified": false, "reason": "failed",
                    "message": "wpd sets data breakpoints only (watch a variable instead)"});
                Ok(json!({"breakpoints": vec![bp; n]}))
            }
            "setExceptionBreakpoints" => Ok(json!({"breakpoints": []})),
            "setFunctionBreakpoints" | "setInstructionBreakpoints" => {
                let n = args["breakpoints"].as_array().map_or(0, Vec::len);
                let bp = json!({"verified": false, "reason": "failed",
                    "message": "wpd sets data breakpoints only"});
                Ok(json!({"breakpoints": vec![bp; n]}))
            }
            "threads" => self.threads().await,
            "stackTrace" => match parse(args) {
                Ok(a) => self.stack_trace(a).await,
                Err(e) => Err(e),
            },
            "scopes" => match parse::<ScopesArguments>(args) {
                Ok(a) => self.scopes(a.frame_id),
                Err(e) => Err(e),
            },
            "variables" => match parse::<VariablesArguments>(args) {
                Ok(a) => self.variables(a.variables_reference).await,
                Err(e) => Err(e),
            },
            "evaluate" => match parse(args) {
                Ok(a) => self.evaluate(a).await,
                Err(e) => Err(e),
            },
            "continue" => match parse(args) {
                Ok(a) => self.continue_(a).await,
                Err(e) => Err(e),
            },
            "pause" => match parse::<PauseArguments>(args) {
                Ok(a) => {
                    let r = self.pause().await;
                    if r.is_ok() {
                        self.respond(&req, Ok(Value::Null));
                        self.stopped = true;
                        self.event_msg(
                            "stopped",
                            json!({"reason": "pause", "threadId": a.thread_id,
                                   "allThreadsStopped": true}),
                        );
                        return;
                    }
                    r
                }
                Err(e) => Err(e),
            },
            "readMemory" => match parse(args) {
                Ok(a) => self.read_memory(a).await,
                Err(e) => Err(e),
            },
            "next" | "stepIn" | "stepOut" | "stepBack" | "reverseContinue" | "goto" => {
                Err("wpd does not step: continue runs to the next data breakpoint hit".into())
            }
            "disconnect" | "terminate" => {
                let r = self.cleanup().await;
                self.respond(&req, r);
                self.ended = true;
                return;
            }
            other => Err(format!("wpctl dap does not support the {other:?} request")),
        };
        let attached = command == "attach" && result.is_ok();
        self.respond(&req, result);
        if attached {
            self.event_msg("initialized", json!({}));
        }
    }

    async fn attach(&mut self, a: AttachArguments) -> Result<Value, String> {
        if self.pid.is_some() {
            return Err("this session is attached already".into());
        }
        let pid = match a.pid.as_ref().or(a.process_id.as_ref()) {
            Some(Value::Number(n)) => n.as_i64(),
            Some(Value::String(s)) => s.trim().parse().ok(),
            _ => None,
        }
        .and_then(|p| i32::try_from(p).ok())
        .filter(|&p| p > 0)
        .ok_or("attach needs \"pid\": the id of a running process")?;
        let backend = match a.backend.as_deref() {
            None | Some("ptrace") => pb::Backend::Ptrace,
            Some("perf") => pb::Backend::Perf,
            Some(b) => return Err(format!("backend {b:?}: use \"ptrace\" or \"perf\"")),
        };
        self.mode = match (backend, a.stop_on_hit.as_deref()) {
            (pb::Backend::Perf, _) => StopMode::Never,
            (_, None | Some("all")) => StopMode::All,
            (_, Some("thread")) => StopMode::Thread,
            (_, Some(m)) => return Err(format!("stopOnHit {m:?}: use \"all\" or \"thread\"")),
        };
        // Subscribe first: no hit of ours can come before it.
        let mut stream = self
            .client()
            .stream_events(self.daemon.request(pb::StreamEventsRequest {
                pid,
                lease: true,
                ..Default::default()
            }))
            .await
            .map_err(|s| status_text(&s))?
            .into_inner();
        // The first item names the lease.
        match stream.next().await {
            Some(Ok(pb::StreamEventsResponse {
                event: Some(pb::stream_events_response::Event::Leased(l)),
                ..
            })) => self.lease = l.lease,
            Some(Err(s)) => return Err(status_text(&s)),
            _ => return Err("the daemon did not grant an event lease".into()),
        }
        let resp = self
            .client()
            .attach(self.daemon.request(pb::AttachRequest {
                pid,
                backend: backend as i32,
                allow_init: false,
            }))
            .await
            .map_err(|s| status_text(&s))?
            .into_inner();
        let actual = resp.process.as_ref().map(|p| p.backend).unwrap_or(0);
        if actual != backend as i32 {
            return Err(format!(
                "process {pid} is attached with the {} backend already: attach with \
                 \"backend\": \"{}\"",
                backend_name(actual),
                backend_name(actual)
            ));
        }
        self.pid = Some(pid);
        self.attached_by_us = resp.newly_attached;
        let tx = self.inputs.clone();
        self.events = Some(tokio::spawn(async move {
            loop {
                match stream.next().await {
                    Some(Ok(ev)) => {
                        if tx.send(Input::Event(Box::new(ev))).await.is_err() {
                            return;
                        }
                    }
                    Some(Err(s)) => {
                        let _ = tx.send(Input::EventsEnded(status_text(&s))).await;
                        return;
                    }
                    None => {
                        let _ = tx.send(Input::EventsEnded("closed".into())).await;
                        return;
                    }
                }
            }
        }));
        if let Some(p) = resp.process {
            self.event_msg(
                "process",
                json!({"name": p.comm, "systemProcessId": pid, "isLocalProcess": true,
                       "startMethod": "attach"}),
            );
        }
        Ok(Value::Null)
    }

    async fn data_breakpoint_info(
        &mut self,
        a: DataBreakpointInfoArguments,
    ) -> Result<Value, String> {
        let pid = self.pid()?;
        let none = |why: String| {
            serde_json::to_value(DataBreakpointInfoBody {
                data_id: None,
                description: why,
                ..Default::default()
            })
            .map_err(|e| e.to_string())
        };
        if a.mode.is_some() {
            return none("wpctl dap has no breakpoint modes".into());
        }
        let name = a.name.trim();
        let (target, known) = if a.as_address == Some(true) {
            let addr = match spec::parse_address(name) {
                Ok(a) => a,
                Err(e) => return none(e.to_string()),
            };
            let len = a.bytes.unwrap_or(1);
            (Target::Address { addr, len }, Known::address(addr, len))
        } else {
            // A child of one of our containers names its evaluateName; an
            // expression is a global's name, `&` allowed.
            let expr = match a
                .variables_reference
                .and_then(|r| self.vars.get(&r).cloned())
            {
                Some(Container::Watched) => name.to_string(),
                Some(Container::Hit(_)) => {
                    return none(format!("{name:?} is a property of the stop, not memory"));
                }
                None if a.variables_reference.is_some_and(|r| r != 0) => {
                    return none("that variable is from an earlier stop".into());
                }
                None => name.strip_prefix('&').unwrap_or(name).trim().to_string(),
            };
            if let Ok(addr) = spec::parse_address(&expr) {
                let len = a.bytes.unwrap_or(1);
                (Target::Address { addr, len }, Known::address(addr, len))
            } else {
                let r = self
                    .client()
                    .resolve_symbol(self.daemon.request(pb::ResolveSymbolRequest {
                        pid,
                        name: expr.clone(),
                        address: 0,
                    }))
                    .await;
                let r = match r {
                    Ok(r) => r.into_inner(),
                    Err(s) => return none(status_text(&s)),
                };
                let Some(sym) = r.symbol else {
                    return none(format!("{expr:?} resolved to nothing"));
                };
                if r.kind != "variable" {
                    return none(format!(
                        "{} is a {}, not a variable: data breakpoints watch memory",
                        sym.expression, r.kind
                    ));
                }
                let size = a.bytes.map(u64::from).unwrap_or(sym.size);
                let len = u32::try_from(size).unwrap_or(u32::MAX);
                let target = match a.bytes {
                    // A given size watches from the variable's address.
                    Some(_) => Target::Address {
                        addr: sym.address,
                        len,
                    },
                    None => Target::Name(sym.expression.clone()),
                };
                (
                    target,
                    Known {
                        expr: sym.expression.clone(),
                        addr: sym.address,
                        len,
                        type_name: sym.type_name,
                    },
                )
            }
        };
        let slots = spec::slots_needed(known.addr, u64::from(known.len));
        if known.len == 0 || slots > 4 {
            return none(format!(
                "{} is {} bytes at {:#x}: {} debug-register slots per thread, and a thread \
                 has 4 (watch a member or fewer bytes)",
                known.expr, known.len, known.addr, slots
            ));
        }
        let ty = if known.type_name.is_empty() {
            String::new()
        } else {
            format!(" ({})", known.type_name)
        };
        let description = format!(
            "{}{ty}: {} bytes at {:#x}, {slots} slot{} per thread. x86-64 cannot watch reads \
             alone: write, or read and write",
            known.expr,
            known.len,
            known.addr,
            if slots == 1 { "" } else { "s" }
        );
        let body = DataBreakpointInfoBody {
            data_id: Some(target.data_id()),
            description,
            access_types: Some(vec!["write", "readWrite"]),
            can_persist: Some(matches!(target, Target::Name(_))),
        };
        self.known.insert(target, known);
        serde_json::to_value(body).map_err(|e| e.to_string())
    }

    async fn set_data_breakpoints(
        &mut self,
        a: SetDataBreakpointsArguments,
    ) -> Result<Value, String> {
        let pid = self.pid()?;
        let asked = a.breakpoints;
        // Where each entry starts, to find duplicates (the last one at an
        // address wins, as in lldb-dap's tests).
        let mut starts: Vec<Option<u64>> = Vec::with_capacity(asked.len());
        for bp in &asked {
            let start = match Target::parse(&bp.data_id) {
                Ok(t) => self.known_of(pid, &t).await.map(|k| k.addr),
                Err(_) => None,
            };
            starts.push(start);
        }
        let winner = |i: usize| match starts[i] {
            Some(a) => (i + 1..asked.len()).find(|&j| starts[j] == Some(a)),
            None => None,
        };
        // Keep what is unchanged (it keeps its slots and id); remove the
        // rest first, so that its slots are free for the new ones.
        let mut keep: Vec<Option<Armed>> = (0..asked.len()).map(|_| None).collect();
        let mut old = std::mem::take(&mut self.armed);
        for (i, bp) in asked.iter().enumerate() {
            if winner(i).is_none()
                && let Some(pos) = old.iter().position(|a| &a.asked == bp)
            {
                keep[i] = Some(old.swap_remove(pos));
            }
        }
        for gone in old {
            let _ = self
                .client()
                .remove_watchpoint(
                    self.daemon
                        .request(pb::RemoveWatchpointRequest { id: gone.wp_id }),
                )
                .await;
        }
        let mut out = Vec::with_capacity(asked.len());
        for (i, bp) in asked.iter().enumerate() {
            if let Some(j) = winner(i) {
                out.push(Breakpoint {
                    verified: false,
                    reason: Some("failed"),
                    message: Some(format!(
                        "breakpoint {} of this list watches the same address and replaces this one",
                        j + 1
                    )),
                    ..Default::default()
                });
                continue;
            }
            if let Some(a) = keep[i].take() {
                out.push(Breakpoint {
                    id: Some(a.dap_id),
                    verified: true,
                    instruction_reference: Some(format!("{:#x}", a.addr)),
                    ..Default::default()
                });
                self.armed.push(a);
                continue;
            }
            match self.arm(pid, bp).await {
                Ok(a) => {
                    out.push(Breakpoint {
                        id: Some(a.dap_id),
                        verified: true,
                        instruction_reference: Some(format!("{:#x}", a.addr)),
                        ..Default::default()
                    });
                    self.armed.push(a);
                }
                Err(message) => out.push(Breakpoint {
                    verified: false,
                    reason: Some("failed"),
                    message: Some(message),
                    ..Default::default()
                }),
            }
        }
        Ok(json!({ "breakpoints": out }))
    }

    /// What a target is now (from `dataBreakpointInfo`, else resolved).
    async fn known_of(&mut self, pid: i32, t: &Target) -> Option<Known> {
        if let Some(k) = self.known.get(t) {
            return Some(k.clone());
        }
        let k = match t {
            Target::Address { addr, len } => Known::address(*addr, *len),
            Target::Name(n) => {
                let r = self
                    .client()
                    .resolve_symbol(self.daemon.request(pb::ResolveSymbolRequest {
                        pid,
                        name: n.clone(),
                        address: 0,
                    }))
                    .await
                    .ok()?
                    .into_inner();
                let s = r.symbol?;
                Known {
                    expr: s.expression,
                    addr: s.address,
                    len: u32::try_from(s.size).ok()?,
                    type_name: s.type_name,
                }
            }
        };
        self.known.insert(t.clone(), k.clone());
        Some(k)
    }

    /// Arms one breakpoint in the daemon.
    async fn arm(&mut self, pid: i32, bp: &DataBreakpoint) -> Result<Armed, String> {
        let target = Target::parse(&bp.data_id).map_err(|e| e.to_string())?;
        let access = match bp.access_type.as_deref() {
            None | Some("write") => pb::Access::Write,
            Some("readWrite") => pb::Access::ReadWrite,
            Some("read") => {
                return Err("x86-64 debug registers cannot watch reads alone: use \
                            readWrite (reads and writes) or write"
                    .into());
            }
            Some(o) => return Err(format!("access type {o:?}: use write or readWrite")),
        };
        let known = self
            .known_of(pid, &target)
            .await
            .ok_or_else(|| format!("{} no longer resolves in process {pid}", bp.data_id))?;
        let condition = match bp.condition.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(c) => Some(
                spec::condition(
                    c,
                    match &target {
                        Target::Name(n) => Some(n.as_str()),
                        Target::Address { .. } => None,
                    },
                    u64::from(known.len),
                )
                .map_err(|e| e.to_string())?,
            ),
        };
        let hits = match bp.hit_condition.as_deref().map(str::trim) {
            None | Some("") => spec::HitCount::default(),
            Some(h) => spec::hit_condition(h).map_err(|e| e.to_string())?,
        };
        let (address, length, symbol) = match &target {
            Target::Address { addr, len } => (*addr, *len, String::new()),
            Target::Name(n) => (0, 0, n.clone()),
        };
        let action = match self.mode {
            StopMode::All => pb::HitAction::StopAll,
            StopMode::Thread => pb::HitAction::Stop,
            StopMode::Never => pb::HitAction::Log,
        };
        let spec = pb::WatchpointSpec {
            pid,
            address,
            length,
            symbol,
            access: access as i32,
            action: action as i32,
            condition,
            ignore_count: hits.ignore,
            hit_count: hits.every,
            lease: self.lease,
            ..Default::default()
        };
        let resp = match self
            .client()
            .set_watchpoint(
                self.daemon
                    .request(pb::SetWatchpointRequest { spec: Some(spec) }),
            )
            .await
        {
            Ok(r) => r.into_inner(),
            Err(st) => return Err(self.explain(&st)),
        };
        let wp = resp
            .watchpoint
            .ok_or("the daemon answered without a watchpoint")?;
        let (addr, len) = wp
            .pieces
            .first()
            .zip(wp.pieces.last())
            .map(|(f, l)| {
                (
                    f.address,
                    (l.address + u64::from(l.length) - f.address) as u32,
                )
            })
            .unwrap_or((known.addr, known.len));
        let last = self.read(pid, addr, len).await.ok();
        let dap_id = self.next_id;
        self.next_id += 1;
        for w in &resp.warnings {
            self.output("console", &format!("data breakpoint {dap_id}: {w}"));
        }
        Ok(Armed {
            asked: bp.clone(),
            dap_id,
            wp_id: wp.id,
            expr: known.expr,
            addr,
            len,
            type_name: known.type_name,
            last,
        })
    }

    /// A refusal to arm, with the daemon's watchpoint ids it names
    /// translated to this session's breakpoints.
    fn explain(&self, st: &tonic::Status) -> String {
        use tonic_types::StatusExt as _;
        let mut text = status_text(st);
        let out_of_slots = st
            .get_error_details()
            .error_info()
            .is_some_and(|i| i.reason == wpd_proto::reason::OUT_OF_SLOTS);
        if out_of_slots && !self.armed.is_empty() {
            let ours: Vec<String> = self
                .armed
                .iter()
                .map(|a| {
                    format!(
                        "watchpoint #{} is data breakpoint {} ({})",
                        a.wp_id, a.dap_id, a.expr
                    )
                })
                .collect();
            text.push_str(&format!(". In this session: {}", ours.join("; ")));
        }
        text
    }

    async fn read(&self, pid: i32, address: u64, length: u32) -> Result<Vec<u8>, String> {
        let r = self
            .client()
            .read_memory(self.daemon.request(pb::ReadMemoryRequest {
                pid,
                address,
                length,
            }))
            .await
            .map_err(|s| status_text(&s))?
            .into_inner();
        if r.unreadable > 0 {
            return Err(r.error);
        }
        Ok(r.data)
    }

    async fn threads(&mut self) -> Result<Value, String> {
        let Some(pid) = self.pid else {
            return Ok(json!({"threads": []}));
        };
        let r = self
            .client()
            .list_threads(self.daemon.request(pb::ListThreadsRequest {
                pid,
                ..Default::default()
            }))
            .await
            .map_err(|s| status_text(&s))?
            .into_inner();
        let threads: Vec<Value> = r
            .threads
            .iter()
            .map(|t| {
                let name = if t.name.is_empty() {
                    format!("thread {}", t.tid)
                } else {
                    format!("{} [{}]", t.name, t.tid)
                };
                json!({"id": t.tid, "name": name})
            })
            .collect();
        Ok(json!({ "threads": threads }))
    }

    async fn stack_trace(&mut self, a: StackTraceArguments) -> Result<Value, String> {
        let pid = self.pid()?;
        let tid = i32::try_from(a.thread_id).map_err(|_| "no such thread".to_string())?;
        let start = a.start_frame.unwrap_or(0);
        let levels = a.levels.filter(|&l| l > 0).unwrap_or(DEFAULT_DEPTH);
        let depth = (start + levels).min(128);
        let r = self
            .client()
            .get_thread_stack(self.daemon.request(pb::GetThreadStackRequest {
                pid,
                tid,
                depth,
                raw: false,
            }))
            .await
            .map_err(|s| status_text(&s))?
            .into_inner();
        let total = r.frames.len();
        let mut frames = Vec::new();
        for (i, loc) in r.frames.iter().enumerate().skip(start as usize) {
            let id = self.next_frame;
            self.next_frame += 1;
            self.frames.insert(id, tid);
            if i == 0 {
                self.frames.insert(-id, tid); // frame 0 of tid: has the hit scope
            }
            frames.push(stack_frame(id, loc));
        }
        if !r.note.is_empty() && total < depth as usize {
            self.output("console", &format!("thread {tid}: {}", r.note));
        }
        Ok(json!({"stackFrames": frames, "totalFrames": total}))
    }

    fn scopes(&mut self, frame_id: i64) -> Result<Value, String> {
        let Some(&tid) = self.frames.get(&frame_id) else {
            return Err("that frame is from an earlier stop".into());
        };
        let mut scopes = Vec::new();
        if self.frames.contains_key(&-frame_id) && self.stops.contains_key(&tid) {
            let r = self.container(Container::Hit(tid));
            scopes.push(Scope {
                name: "Data breakpoint hit".into(),
                variables_reference: r,
                expensive: false,
                presentation_hint: Some("locals"),
            });
        }
        let r = self.container(Container::Watched);
        scopes.push(Scope {
            name: "Watched".into(),
            variables_reference: r,
            expensive: false,
            presentation_hint: None,
        });
        Ok(json!({ "scopes": scopes }))
    }

    fn container(&mut self, c: Container) -> i64 {
        let id = self.next_var;
        self.next_var += 1;
        self.vars.insert(id, c);
        id
    }

    async fn variables(&mut self, reference: i64) -> Result<Value, String> {
        let pid = self.pid()?;
        let Some(c) = self.vars.get(&reference).cloned() else {
            return Err("those variables are from an earlier stop".into());
        };
        let mut out = Vec::new();
        match c {
            Container::Watched => {
                for i in 0..self.armed.len() {
                    let (addr, len, expr, ty) = {
                        let a = &self.armed[i];
                        (a.addr, a.len, a.expr.clone(), a.type_name.clone())
                    };
                    let value = match self.read(pid, addr, len).await {
                        Ok(b) => spec::show_value(&ty, &b),
                        Err(e) => format!("<{e}>"),
                    };
                    let named = matches!(
                        Target::parse(&self.armed[i].asked.data_id),
                        Ok(Target::Name(_))
                    );
                    out.push(Variable {
                        name: expr.clone(),
                        value,
                        type_name: (!ty.is_empty()).then_some(ty),
                        variables_reference: 0,
                        evaluate_name: named.then_some(expr),
                        memory_reference: Some(format!("{addr:#x}")),
                    });
                }
            }
            Container::Hit(tid) => {
                if let Some(s) = self.stops.get(&tid) {
                    let v = |name: &str, value: String| Variable {
                        name: name.into(),
                        value,
                        type_name: None,
                        variables_reference: 0,
                        evaluate_name: None,
                        memory_reference: None,
                    };
                    out.push(v("breakpoint", format!("{} ({})", s.dap_id, s.expr)));
                    out.push(Variable {
                        memory_reference: Some(format!("{:#x}", s.addr)),
                        ..v("address", format!("{:#x}", s.addr))
                    });
                    out.push(v(
                        "old value",
                        s.old
                            .as_ref()
                            .map(|o| spec::show_value(&s.type_name, o))
                            .unwrap_or_else(|| "(not known)".into()),
                    ));
                    out.push(v("new value", spec::show_value(&s.type_name, &s.new)));
                    out.push(v("accessed at", s.location.clone()));
                }
            }
        }
        Ok(json!({ "variables": out }))
    }

    async fn evaluate(&mut self, a: EvaluateArguments) -> Result<Value, String> {
        let pid = self.pid()?;
        let e = a.expression.trim();
        let (want_address, name) = match e.strip_prefix('&') {
            Some(n) => (true, n.trim()),
            None => (false, e),
        };
        let r = self
            .client()
            .resolve_symbol(self.daemon.request(pb::ResolveSymbolRequest {
                pid,
                name: name.to_string(),
                address: 0,
            }))
            .await
            .map_err(|s| status_text(&s))?
            .into_inner();
        let sym = r.symbol.ok_or("nothing by that name")?;
        let reference = format!("{:#x}", sym.address);
        if want_address || r.kind != "variable" {
            return Ok(json!({
                "result": reference,
                "type": if sym.type_name.is_empty() { r.kind } else { format!("{} *", sym.type_name) },
                "variablesReference": 0,
                "memoryReference": reference,
            }));
        }
        let len = u32::try_from(sym.size.clamp(1, 4096)).unwrap_or(4096);
        let value = match self.read(pid, sym.address, len).await {
            Ok(b) => spec::show_value(&sym.type_name, &b),
            Err(e) => return Err(e),
        };
        Ok(json!({
            "result": value,
            "type": sym.type_name,
            "variablesReference": 0,
            "memoryReference": reference,
        }))
    }

    async fn read_memory(&mut self, a: ReadMemoryArguments) -> Result<Value, String> {
        let pid = self.pid()?;
        let base = spec::parse_address(&a.memory_reference).map_err(|e| e.to_string())?;
        let address = base
            .checked_add_signed(a.offset.unwrap_or(0))
            .ok_or("address out of range")?;
        if a.count == 0 {
            return Ok(json!({"address": format!("{address:#x}"), "data": ""}));
        }
        let length = a.count.min(1 << 20) as u32;
        let r = self
            .client()
            .read_memory(self.daemon.request(pb::ReadMemoryRequest {
                pid,
                address,
                length,
            }))
            .await
            .map_err(|s| status_text(&s))?
            .into_inner();
        let unreadable = a.count - r.data.len() as u64;
        Ok(json!({
            "address": format!("{address:#x}"),
            "unreadableBytes": unreadable,
            "data": base64::engine::general_purpose::STANDARD.encode(&r.data),
        }))
    }

    async fn continue_(&mut self, a: ContinueArguments) -> Result<Value, String> {
        let pid = self.pid()?;
        let single = a.single_thread == Some(true);
        let tids = if single {
            vec![i32::try_from(a.thread_id).map_err(|_| "no such thread".to_string())?]
        } else {
            Vec::new()
        };
        self.forget_stop(if single { Some(tids[0]) } else { None });
        if self.mode != StopMode::Never {
            self.client()
                .resume(self.daemon.request(pb::ResumeRequest { pid, tids }))
                .await
                .map_err(|s| status_text(&s))?;
        }
        Ok(json!({ "allThreadsContinued": !single }))
    }

    /// Drops what was shown of a stop (of one thread, or all).
    fn forget_stop(&mut self, tid: Option<i32>) {
        match tid {
            Some(t) => {
                self.stops.remove(&t);
            }
            None => {
                self.stops.clear();
                self.stopped = false;
                self.frames.clear();
                self.vars.clear();
            }
        }
    }

    async fn pause(&mut self) -> Result<Value, String> {
        let pid = self.pid()?;
        if self.mode == StopMode::Never {
            return Err("the perf backend never stops the target: attach with \
                        \"backend\": \"ptrace\" to pause"
                .into());
        }
        self.client()
            .pause(self.daemon.request(pb::PauseRequest {
                pid,
                tids: vec![],
                lease: self.lease,
            }))
            .await
            .map_err(|s| status_text(&s))?;
        Ok(Value::Null)
    }

    async fn event(&mut self, ev: pb::StreamEventsResponse) {
        use pb::stream_events_response::Event as E;
        match ev.event {
            Some(E::Hit(h)) => self.hit(h).await,
            Some(E::ThreadStarted(t)) => {
                self.event_msg("thread", json!({"reason": "started", "threadId": t.tid}))
            }
            Some(E::ThreadExited(t)) => {
                self.stops.remove(&t.tid);
                self.event_msg("thread", json!({"reason": "exited", "threadId": t.tid}))
            }
            Some(E::WatchpointRemoved(w)) => {
                if let Some(pos) = self.armed.iter().position(|a| a.wp_id == w.watchpoint_id) {
                    let a = self.armed.remove(pos);
                    self.event_msg(
                        "breakpoint",
                        json!({"reason": "changed", "breakpoint": {"id": a.dap_id,
                            "verified": false, "reason": "failed",
                            "message": format!("removed by the daemon: {}", w.reason)}}),
                    );
                }
            }
            Some(E::ProcessExited(_)) | Some(E::ProcessLost(_)) => {
                self.armed.clear();
                self.output("console", "the process exited or can no longer be watched");
                self.event_msg("terminated", json!({}));
                self.pid = None;
            }
            Some(E::Dropped(d)) => self.output(
                "important",
                &format!("wpd: this session fell behind and lost {} events", d.count),
            ),
            Some(E::RecordsLost(r)) => self.output(
                "important",
                &format!("wpd: the kernel lost {} hit records", r.count),
            ),
            _ => {}
        }
    }

    async fn hit(&mut self, h: pb::Hit) {
        let Some(pos) = self.armed.iter().position(|a| a.wp_id == h.watchpoint_id) else {
            return;
        };
        let location = h
            .location
            .as_ref()
            .map(describe)
            .unwrap_or_else(|| format!("{:#x}", h.ip));
        let new = h.value.clone();
        let a = &mut self.armed[pos];
        // The whole watched range's previous bytes, this piece's part.
        let off = (h.address.saturating_sub(a.addr)) as usize;
        let old = if !h.old_value.is_empty() {
            Some(h.old_value.clone())
        } else {
            a.last
                .as_ref()
                .and_then(|l| l.get(off..off + new.len()).map(<[u8]>::to_vec))
        };
        if let Some(l) = a.last.as_mut()
            && let Some(part) = l.get_mut(off..off + new.len())
        {
            part.copy_from_slice(&new);
        }
        let shown = |b: &[u8]| spec::show_value(&a.type_name, b);
        let change = match (&old, h.value_error.is_empty()) {
            (_, false) => format!("value unreadable: {}", h.value_error),
            (Some(o), true) => format!("{} → {}", shown(o), shown(&new)),
            (None, true) => format!("now {}", shown(&new)),
        };
        let description = format!("data breakpoint {} ({}): {change}", a.dap_id, a.expr);
        let info = StopInfo {
            dap_id: a.dap_id,
            expr: a.expr.clone(),
            type_name: a.type_name.clone(),
            old,
            new,
            addr: h.address,
            location: location.clone(),
        };
        let dap_id = a.dap_id;
        if !h.stopped {
            self.output(
                "console",
                &format!("{description}, by thread {} at {location}", h.tid),
            );
            return;
        }
        // A thread shown stopped is not shown again until it is continued
        // (a hit queued behind the one shown, whose thread a newer hit holds).
        if self.stops.contains_key(&h.tid) {
            return;
        }
        // A hit queued before a continue reaches us after it: its thread
        // runs again. Show only threads that are held now.
        if !self.held(h.pid, h.tid).await {
            return;
        }
        let first = !self.stopped;
        self.stopped = true;
        self.stops.insert(h.tid, info);
        self.event_msg(
            "stopped",
            json!({
                "reason": "data breakpoint",
                "description": description,
                "text": format!("thread {} at {location}", h.tid),
                "threadId": h.tid,
                "allThreadsStopped": self.mode == StopMode::All,
                "preserveFocusHint": !first,
                "hitBreakpointIds": [dap_id],
            }),
        );
    }

    /// True when `tid` is held stopped at a hit now.
    async fn held(&self, pid: i32, tid: i32) -> bool {
        let r = self
            .client()
            .list_threads(self.daemon.request(pb::ListThreadsRequest {
                pid,
                tids: vec![tid],
                probe: false,
            }))
            .await;
        match r {
            Ok(r) => r
                .into_inner()
                .threads
                .iter()
                .any(|t| t.state == pb::ThreadState::StoppedAtHit as i32),
            Err(_) => false,
        }
    }

    /// Removes the session's breakpoints and resumes what it held; detaches
    /// a process the session attached and nobody else watches.
    async fn cleanup(&mut self) -> Result<Value, String> {
        let Some(pid) = self.pid else {
            return Ok(Value::Null);
        };
        let mut errors = Vec::new();
        for a in std::mem::take(&mut self.armed) {
            if let Err(s) = self
                .client()
                .remove_watchpoint(
                    self.daemon
                        .request(pb::RemoveWatchpointRequest { id: a.wp_id }),
                )
                .await
                && s.code() != tonic::Code::NotFound
            {
                errors.push(status_text(&s));
            }
        }
        if self.mode != StopMode::Never
            && let Err(s) = self
                .client()
                .resume(self.daemon.request(pb::ResumeRequest { pid, tids: vec![] }))
                .await
            && s.code() != tonic::Code::NotFound
        {
            errors.push(status_text(&s));
        }
        if self.attached_by_us {
            let others = self
                .client()
                .list_watchpoints(self.daemon.request(pb::ListWatchpointsRequest { pid }))
                .await
                .map(|r| r.into_inner().watchpoints.len())
                .unwrap_or(1);
            if others == 0 {
                let _ = self
                    .client()
                    .detach(self.daemon.request(pb::DetachRequest { pid }))
                    .await;
            }
        }
        if let Some(t) = self.events.take() {
            t.abort();
        }
        self.pid = None;
        self.forget_stop(None);
        if errors.is_empty() {
            Ok(Value::Null)
        } else {
            Err(errors.join("; "))
        }
    }
}

/// An `output` event's body: one line of the IDE's debug console. The text
/// may name what the target chose (its functions, files, variables, the
/// daemon's words about them): escaped, so that it stays one line of
/// printable text.
fn output_body(category: &str, text: &str) -> Value {
    let text = wpd_proto::text::escape(text);
    json!({"category": category, "output": format!("{text}\n")})
}

fn backend_name(b: i32) -> &'static str {
    match pb::Backend::try_from(b) {
        Ok(pb::Backend::Perf) => "perf",
        Ok(pb::Backend::Ptrace) => "ptrace",
        _ => "default",
    }
}

/// `function+0x1c (file.c:42)`, or the address and module.
fn describe(l: &pb::Location) -> String {
    let module = l.module.rsplit('/').next().unwrap_or("");
    let place = if l.function.is_empty() {
        format!("{:#x} in {module}", l.ip)
    } else {
        format!("{}+{:#x}", l.function, l.function_offset)
    };
    if l.file.is_empty() {
        place
    } else {
        let file = l.file.rsplit('/').next().unwrap_or(&l.file);
        format!("{place} ({file}:{})", l.line)
    }
}

fn stack_frame(id: i64, l: &pb::Location) -> StackFrame {
    let module = l.module.rsplit('/').next().unwrap_or("").to_string();
    let name = if l.function.is_empty() {
        format!("{:#x} ({module})", l.ip)
    } else {
        l.function.clone()
    };
    let source = (!l.file.is_empty()).then(|| Source {
        name: l.file.rsplit('/').next().unwrap_or(&l.file).to_string(),
        path: l.file.clone(),
    });
    StackFrame {
        id,
        name,
        presentation_hint: source.is_none().then_some("subtle"),
        source,
        line: l.line,
        column: l.column,
        instruction_pointer_reference: format!("{:#x}", l.ip),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines_escape_what_the_target_chose() {
        let b = output_body(
            "console",
            "hit at evil\x1b]0;owned\x07\nfake line+0x4 (a\u{202e}b.c:3)",
        );
        assert_eq!(
            b["output"],
            "hit at evil\\x1b]0;owned\\x07\\nfake line+0x4 (a\\u{202e}b.c:3)\n"
        );
        assert_eq!(output_body("console", "plain")["output"], "plain\n");
    }
}
