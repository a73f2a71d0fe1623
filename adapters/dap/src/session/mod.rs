//! One debug session: DAP requests in, daemon calls and events out.
//!
//! Three tasks: a reader (client messages), the daemon's event stream, and
//! the session loop, which owns all state ([`Session`]) and handles one
//! input at a time; a writer numbers and sends what the loop produces.
//! Whatever ends the session (a `disconnect`, the client's input closing, a
//! read error) ends in [`Session::cleanup`].
//!
//! Requests are typed ([`crate::protocol::requests`]): each has one handler,
//! an `impl Handler<R> for Session`, in the room of this module its work
//! belongs to — `attach.rs` (attach, end of the session), `breakpoints.rs`
//! (data breakpoints), `code.rs` (function and line breakpoints), `launch.rs` (a program started by the session), `inspect.rs` (threads, stacks, scopes, variables,
//! evaluate, memory), `control.rs` (continue, pause, what is refused) — and
//! one line in [`Session::route`]. Daemon events become DAP events in
//! `events.rs`.

mod attach;
mod breakpoints;
mod code;
mod control;
mod events;
mod inspect;
mod launch;
mod step;

use std::collections::HashMap;
use std::future::Future;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::sync::mpsc;
use wpd_proto::v1 as pb;

use crate::Daemon;
use crate::error::DapError;
use crate::protocol::requests::*;
use crate::protocol::{DataBreakpoint, Event, EventMessage, IncomingRequest, Request, Response};
use crate::spec::Target;
use crate::wire::{self, WireError};

/// The handler of request `R`: its arguments in, its body or an error out.
pub(crate) trait Handler<R: Request> {
    /// Answers one `R`.
    fn handle(
        &mut self,
        args: R::Arguments,
    ) -> impl Future<Output = Result<R::Result, DapError>> + Send;
}

/// What the loop reacts to.
enum Input {
    Request(Value),
    /// The client's side ended (EOF or a broken message).
    Closed(WireError),
    Event(Box<pb::StreamEventsResponse>),
    /// The daemon's event stream ended.
    EventsEnded(String),
    /// Output of the launched program (category, text).
    Output(&'static str, String),
    /// The launched program exited with this code.
    Exited(i32),
    /// A step of thread `tid` ended (`all`: the other threads ran).
    Stepped {
        tid: i32,
        all: bool,
        result: Result<pb::StepResponse, String>,
    },
}

impl Input {
    /// What it is, for the log: a request's command, or the kind of input.
    fn name(&self) -> String {
        match self {
            Input::Request(v) => v
                .get("command")
                .and_then(Value::as_str)
                .unwrap_or("request")
                .to_string(),
            Input::Closed(_) => "closed".into(),
            Input::Event(_) => "daemon event".into(),
            Input::EventsEnded(_) => "events ended".into(),
            Input::Output(..) => "output".into(),
            Input::Exited(_) => "exited".into(),
            Input::Stepped { .. } => "stepped".into(),
        }
    }
}

/// An input whose handling takes this long is logged (`info`): the
/// session answers nothing else meanwhile.
const SLOW_INPUT: std::time::Duration = std::time::Duration::from_secs(1);

/// A program the session started (`launch`).
#[derive(Debug, Clone, Copy)]
struct Launched {
    pid: i32,
    /// Hold it at its entry at `configurationDone`.
    stop_on_entry: bool,
    /// Sent on its way (`configurationDone` came).
    running: bool,
    /// Its exit was reported.
    exited: bool,
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
    /// How its values read (the daemon's `Watchpoint.value_type`).
    value_type: Option<pb::ValueType>,
    /// The bytes at arming or at the last hit shown: the "old" value of the
    /// next hit.
    last: Option<Vec<u8>>,
}

/// Where a code breakpoint was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CodeAt {
    /// `setFunctionBreakpoints`: a function.
    Function(String),
    /// `setBreakpoints`: a source file (as the client names it) and line.
    Line(String, u32),
}

/// A code breakpoint set in the daemon.
#[derive(Debug)]
struct CodeArmed {
    at: CodeAt,
    /// Its hit condition.
    hits: crate::spec::HitCount,
    dap_id: i64,
    wp_id: u64,
    /// Where the daemon put it.
    place: pb::BreakpointPlace,
    /// Its library is not loaded yet, and why: the daemon sets it when it
    /// is (a `WatchpointResolved`, then a `breakpoint` event `changed`).
    pending: Option<String>,
    /// The daemon's reason while pending (`Watchpoint.pending_reason`), as
    /// last seen.
    reason: String,
}

/// The last hit a thread stopped at (a data breakpoint's, with its values;
/// a code breakpoint's, with its place only).
#[derive(Debug, Clone, Default)]
struct StopInfo {
    /// A data breakpoint's hit (its values are a scope of the stop).
    data: bool,
    dap_id: i64,
    expr: String,
    type_name: String,
    /// How the values read (the watchpoint's value type).
    value_type: Option<pb::ValueType>,
    old: Option<Vec<u8>>,
    new: Vec<u8>,
    /// The daemon's name for the new value (an enumerator).
    new_name: String,
    addr: u64,
    location: String,
}

/// A `variablesReference`.
#[derive(Debug, Clone)]
enum Container {
    Watched,
    Hit(i32),
    /// The register groups of a held thread (its innermost frame).
    Registers(i32),
    /// A held thread's general-purpose registers.
    GeneralRegisters(i32),
    /// The flags of an `eflags` value.
    Flags(u64),
    /// The parameters and locals of frame `.1` (0: innermost) of thread `.0`.
    Locals(i32, u32),
    /// What an expression has under it (the daemon's `ListVariables`); the
    /// empty expression: the executable's globals.
    Children(String),
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

/// A session's state, owned by its loop.
pub(crate) struct Session {
    daemon: Daemon,
    out: mpsc::UnboundedSender<Value>,
    inputs: mpsc::Sender<Input>,
    pid: Option<i32>,
    attached_by_us: bool,
    /// The program `launch` started (killed when the session ends).
    launched: Option<Launched>,
    /// The client runs programs in its terminal (`runInTerminal`).
    terminal: bool,
    mode: StopMode,
    /// The event stream's lease (watchpoints die with it).
    lease: u64,
    armed: Vec<Armed>,
    /// Function and line breakpoints.
    code: Vec<CodeArmed>,
    /// Code breakpoints this session removed (a thread that reached one
    /// meanwhile is let go).
    gone_code: std::collections::HashSet<u64>,
    next_id: i64,
    known: HashMap<Target, Known>,
    /// A stop is being shown (until continue).
    stopped: bool,
    stops: HashMap<i32, StopInfo>,
    frames: HashMap<i64, i32>,
    /// A frame's index in its thread's stack (0: innermost).
    frame_index: HashMap<i64, u32>,
    next_frame: i64,
    vars: HashMap<i64, Container>,
    /// The expression of each variable listed in a `Children` container,
    /// by (container, name): what `dataBreakpointInfo` watches.
    named: HashMap<(i64, String), String>,
    next_var: i64,
    events: Option<tokio::task::JoinHandle<()>>,
    /// Events a handler sends after its response (`initialized` after
    /// `attach`, `stopped` after `pause`).
    after_response: Vec<Value>,
    ended: bool,
}

/// Runs one debug session over `r`/`w` until it ends; on every way out the
/// session's breakpoints are removed and its held threads resumed. An error
/// is a broken message from the client (its closing is not one).
pub async fn run<R, W>(r: R, w: W, daemon: Daemon) -> Result<(), WireError>
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
            m["seq"] = seq.into();
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
                    let _ = reader_tx.send(Input::Closed(e)).await;
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
        launched: None,
        terminal: false,
        mode: StopMode::All,
        lease: 0,
        armed: Vec::new(),
        code: Vec::new(),
        gone_code: Default::default(),
        next_id: 1,
        known: HashMap::new(),
        stopped: false,
        stops: HashMap::new(),
        frames: HashMap::new(),
        frame_index: HashMap::new(),
        next_frame: 1,
        vars: HashMap::new(),
        named: HashMap::new(),
        next_var: 1,
        events: None,
        after_response: Vec::new(),
        ended: false,
    };
    let mut why = Ok(());
    while let Some(input) = rx.recv().await {
        let started = std::time::Instant::now();
        let what = input.name();
        match input {
            Input::Request(req) => s.request(req).await,
            Input::Closed(e) => {
                if !matches!(e, WireError::Closed) {
                    why = Err(e);
                }
                break;
            }
            Input::Event(ev) => s.event(*ev).await,
            Input::Output(category, text) => s.send_event(&crate::protocol::events::Output {
                category,
                output: text,
            }),
            Input::Exited(code) => s.program_exited(code),
            Input::Stepped { tid, all, result } => s.stepped(tid, all, result),
            Input::EventsEnded(e) => {
                if s.pid.is_some() && !s.ended {
                    s.output("important", &format!("wpd: the event stream ended: {e}"));
                    s.send_event(&crate::protocol::events::Terminated {});
                }
            }
        }
        let took = started.elapsed();
        if took >= SLOW_INPUT {
            tracing::info!(%what, ?took, "slow to handle");
        } else {
            tracing::debug!(%what, ?took, "handled");
        }
        if s.ended {
            break;
        }
    }
    if let Err(e) = s.cleanup().await {
        tracing::warn!(
            "session cleanup: {}",
            wpd_proto::text::escape(&e.to_string())
        );
    }
    reader.abort();
    drop(s);
    let _ = writer.await;
    why
}

impl Session {
    fn send(&self, m: Value) {
        let _ = self.out.send(m);
    }

    /// Sends event `body` now.
    fn send_event<E: Event>(&self, body: &E) {
        if let Ok(m) = serde_json::to_value(EventMessage::new(body)) {
            self.send(m);
        }
    }

    /// Sends event `body` after the response being prepared.
    fn event_after_response<E: Event>(&mut self, body: &E) {
        if let Ok(m) = serde_json::to_value(EventMessage::new(body)) {
            self.after_response.push(m);
        }
    }

    /// A line in the IDE's debug console.
    fn output(&self, category: &'static str, text: &str) {
        self.send_event(&output_body(category, text));
    }

    fn pid(&self) -> Result<i32, DapError> {
        self.pid.ok_or(DapError::NotAttached)
    }

    fn client(
        &self,
    ) -> wpd_proto::v1::watchpoints_client::WatchpointsClient<tonic::transport::Channel> {
        self.daemon.client.clone()
    }

    /// Answers one client message, then sends what its handler left for
    /// after the response.
    async fn request(&mut self, msg: Value) {
        if msg.get("type").and_then(Value::as_str) == Some("response") {
            // The answer to a reverse request (`runInTerminal`): what it
            // started reports on its own socket; a refusal is told.
            if msg.get("success") == Some(&Value::Bool(false)) {
                let why = msg.get("message").and_then(Value::as_str).unwrap_or("");
                self.output(
                    "important",
                    &format!("the client's terminal refused: {why}"),
                );
            }
            return;
        }
        let req = IncomingRequest::from_value(msg);
        let response = match self.route(&req).await {
            Ok(body) => Response::success(&req, body),
            Err(e) => Response::failure(&req, e.id(), e.to_string()),
        };
        if let Ok(m) = serde_json::to_value(response) {
            self.send(m);
        }
        for m in std::mem::take(&mut self.after_response) {
            self.send(m);
        }
    }

    /// The handler of `req`'s command. Every request the adapter answers is
    /// listed here, once.
    async fn route(&mut self, req: &IncomingRequest) -> Result<Value, DapError> {
        macro_rules! route {
            ($($r:ty),* $(,)?) => {
                $(
                    if req.command == <$r as Request>::COMMAND {
                        return self.call::<$r>(req).await;
                    }
                )*
            };
        }
        route!(
            Initialize,
            Attach,
            Launch,
            ConfigurationDone,
            DataBreakpointInfo,
            SetDataBreakpoints,
            SetBreakpoints,
            SetFunctionBreakpoints,
            SetInstructionBreakpoints,
            SetExceptionBreakpoints,
            Threads,
            StackTrace,
            Scopes,
            Variables,
            Evaluate,
            Continue,
            Pause,
            ReadMemory,
            WriteMemory,
            SetVariable,
            Disassemble,
            Next,
            StepIn,
            StepOut,
            StepBack,
            ReverseContinue,
            Goto,
            Disconnect,
            Terminate,
        );
        Err(DapError::UnknownRequest(req.command.clone()))
    }

    /// Reads `R`'s arguments, runs its handler, writes its body.
    async fn call<R: Request>(&mut self, req: &IncomingRequest) -> Result<Value, DapError>
    where
        Self: Handler<R>,
    {
        let args = req
            .arguments::<R>()
            .map_err(|e| DapError::BadArguments(e.to_string()))?;
        let result = <Self as Handler<R>>::handle(self, args).await?;
        serde_json::to_value(result).map_err(|e| DapError::Internal(e.to_string()))
    }
}

/// An `output` event: one line of the IDE's debug console. The text may
/// name what the target chose (its functions, files, variables, the
/// daemon's words about them): escaped, so that it stays one line of
/// printable text.
fn output_body(category: &'static str, text: &str) -> crate::protocol::events::Output {
    let text = wpd_proto::text::escape(text);
    crate::protocol::events::Output {
        category,
        output: format!("{text}\n"),
    }
}

fn backend_name(b: i32) -> &'static str {
    match pb::Backend::try_from(b) {
        Ok(pb::Backend::Perf) => "perf",
        Ok(pb::Backend::Ptrace) => "ptrace",
        _ => "default",
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
            b.output,
            "hit at evil\\x1b]0;owned\\x07\\nfake line+0x4 (a\\u{202e}b.c:3)\n"
        );
        assert_eq!(output_body("console", "plain").output, "plain\n");
    }
}
