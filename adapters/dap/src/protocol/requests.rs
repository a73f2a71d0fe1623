//! The requests the adapter answers: one type each, with its command, the
//! arguments it reads and the body it answers with.

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use super::Request;
use super::types::{Breakpoint, Capabilities, DataBreakpoint, Scope, StackFrame, Thread, Variable};

/// Declares a request type: `Name, "command", Arguments => Result`.
macro_rules! request {
    ($(#[$doc:meta])* $name:ident, $command:literal, $args:ty => $result:ty) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $name {}

        impl Request for $name {
            type Arguments = $args;
            type Result = $result;
            const COMMAND: &'static str = $command;
        }
    };
}

request!(
    /// The client's first request: what the adapter can do.
    Initialize, "initialize", InitializeArguments => Capabilities
);
request!(
    /// Attach to a running process (the session's target).
    Attach, "attach", AttachArguments => ()
);
request!(
    /// Start a program, held before its first instruction until
    /// `configurationDone`.
    Launch, "launch", LaunchArguments => ()
);
request!(
    /// The client has sent its configuration.
    ConfigurationDone, "configurationDone", IgnoredAny => ()
);
request!(
    /// Whether and how a variable, expression or address can be watched.
    DataBreakpointInfo, "dataBreakpointInfo", DataBreakpointInfoArguments => DataBreakpointInfoBody
);
request!(
    /// The whole set of data breakpoints.
    SetDataBreakpoints, "setDataBreakpoints", SetDataBreakpointsArguments => BreakpointsBody
);
request!(
    /// The whole set of line breakpoints of one source file.
    SetBreakpoints, "setBreakpoints", SetBreakpointsArguments => BreakpointsBody
);
request!(
    /// The whole set of function breakpoints.
    SetFunctionBreakpoints, "setFunctionBreakpoints", SetFunctionBreakpointsArguments => BreakpointsBody
);
request!(
    /// Instruction breakpoints: each one refused.
    SetInstructionBreakpoints, "setInstructionBreakpoints", BreakpointList => BreakpointsBody
);
request!(
    /// Exception breakpoints: none exist.
    SetExceptionBreakpoints, "setExceptionBreakpoints", IgnoredAny => BreakpointsBody
);
request!(
    /// The target's threads.
    Threads, "threads", IgnoredAny => ThreadsBody
);
request!(
    /// A held thread's frames, symbolized.
    StackTrace, "stackTrace", StackTraceArguments => StackTraceBody
);
request!(
    /// A frame's scopes.
    Scopes, "scopes", ScopesArguments => ScopesBody
);
request!(
    /// A scope's variables.
    Variables, "variables", VariablesArguments => VariablesBody
);
request!(
    /// A global's value or address.
    Evaluate, "evaluate", EvaluateArguments => EvaluateBody
);
request!(
    /// Resume held threads.
    Continue, "continue", ContinueArguments => ContinueBody
);
request!(
    /// Stop every thread.
    Pause, "pause", PauseArguments => ()
);
request!(
    /// Read the target's memory.
    ReadMemory, "readMemory", ReadMemoryArguments => ReadMemoryBody
);
request!(
    /// Step over: to the next line (or instruction) of the thread.
    Next, "next", StepArguments => ()
);
request!(
    /// Step in: into a call with line information.
    StepIn, "stepIn", StepArguments => ()
);
request!(
    /// Step out: until the function returns.
    StepOut, "stepOut", StepArguments => ()
);
request!(
    /// Instructions around an address, as text.
    Disassemble, "disassemble", DisassembleArguments => DisassembleBody
);
request!(
    /// Write the target's memory.
    WriteMemory, "writeMemory", WriteMemoryArguments => WriteMemoryBody
);
request!(
    /// Change a held thread's local, or a member or element in memory.
    SetVariable, "setVariable", SetVariableArguments => SetVariableBody
);
request!(
    /// Step back: refused.
    StepBack, "stepBack", IgnoredAny => ()
);
request!(
    /// Run backwards: refused.
    ReverseContinue, "reverseContinue", IgnoredAny => ()
);
request!(
    /// Jump: refused.
    Goto, "goto", IgnoredAny => ()
);
request!(
    /// End the session (an attached target keeps running, a launched
    /// program is killed).
    Disconnect, "disconnect", IgnoredAny => ()
);
request!(
    /// End the session, as `disconnect`.
    Terminate, "terminate", IgnoredAny => ()
);

/// `initialize` arguments: what the client can do.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct InitializeArguments {
    /// The client answers the `runInTerminal` reverse request.
    #[serde(default)]
    pub supports_run_in_terminal_request: bool,
}

/// `attach` arguments (the IDE's launch configuration).
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct AttachArguments {
    /// Process to attach to (number or numeric string).
    pub pid: Option<serde_json::Value>,
    /// Same, as VS Code's `${command:pickProcess}` fills it.
    pub process_id: Option<serde_json::Value>,
    /// `"ptrace"` (default: hits stop threads) or `"perf"` (hits are logged
    /// to the debug console; the target never stops).
    pub backend: Option<String>,
    /// `"all"` (default): a hit stops every thread; `"thread"`: only the
    /// thread that hit.
    pub stop_on_hit: Option<String>,
}

/// `launch` arguments (the IDE's launch configuration).
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct LaunchArguments {
    /// The executable.
    pub program: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables: an object (`null` removes a variable) or an
    /// array of `NAME=VALUE` strings; added to the adapter's environment.
    pub env: Option<serde_json::Value>,
    /// Working directory.
    pub cwd: Option<String>,
    /// Stop before the program's first instruction (a `stopped` event with
    /// reason `entry` after `configurationDone`).
    #[serde(default)]
    pub stop_on_entry: bool,
    /// As in `attach`.
    pub backend: Option<String>,
    /// As in `attach`.
    pub stop_on_hit: Option<String>,
}

/// `dataBreakpointInfo` arguments.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataBreakpointInfoArguments {
    /// A child of `variables_reference`, an expression, or an address.
    pub name: String,
    /// Container of `name`.
    pub variables_reference: Option<i64>,
    /// Frame to evaluate in: its parameters and locals can start the
    /// expression (watched by address, where the object is now).
    pub frame_id: Option<i64>,
    /// Bytes to watch from the address or variable.
    pub bytes: Option<u32>,
    /// `name` is an address.
    pub as_address: Option<bool>,
    /// A breakpoint mode (none advertised).
    pub mode: Option<String>,
}

/// `setDataBreakpoints` arguments.
#[derive(Debug, Deserialize)]
pub struct SetDataBreakpointsArguments {
    /// The whole new set.
    pub breakpoints: Vec<DataBreakpoint>,
}

/// `continue` arguments.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContinueArguments {
    /// The thread the user continued.
    pub thread_id: i64,
    /// Resume only it.
    pub single_thread: Option<bool>,
}

/// `next`, `stepIn`, `stepOut` arguments.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepArguments {
    /// The thread to step.
    pub thread_id: i64,
    /// The other threads stay as they are (else they run during the step
    /// and stop with it).
    pub single_thread: Option<bool>,
    /// `statement` (the default), `line` or `instruction`.
    pub granularity: Option<String>,
}

/// `disassemble` arguments.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DisassembleArguments {
    /// An address (as `instructionPointerReference` fields carry them).
    pub memory_reference: String,
    /// Bytes from it.
    pub offset: Option<i64>,
    /// Instructions from there (negative: before it).
    pub instruction_offset: Option<i64>,
    /// Instructions wanted.
    pub instruction_count: i64,
}

/// `disassemble` response body.
#[derive(Debug, Serialize)]
pub struct DisassembleBody {
    /// In address order.
    pub instructions: Vec<super::types::DisassembledInstruction>,
}

/// `writeMemory` arguments.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteMemoryArguments {
    /// An address.
    pub memory_reference: String,
    /// Bytes from it.
    pub offset: Option<i64>,
    /// The bytes, base64.
    pub data: String,
}

/// `writeMemory` response body.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteMemoryBody {
    /// Bytes written.
    pub bytes_written: u64,
}

/// `setVariable` arguments.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetVariableArguments {
    /// The container the variable is listed in (a `variables` reference).
    pub variables_reference: i64,
    /// Its name there.
    pub name: String,
    /// The new value, as a person types it (`42`, `-1`, `0x2a`, `-273.15`,
    /// `true`, `DONE`, `'A'`).
    pub value: String,
}

/// `setVariable` response body: the value as it now reads.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SetVariableBody {
    /// The value, read back.
    pub value: String,
    /// Its type.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_name: Option<String>,
    /// Its address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_reference: Option<String>,
}

/// `pause` arguments.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PauseArguments {
    /// The thread the user paused (every thread stops).
    pub thread_id: i64,
}

/// `stackTrace` arguments.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StackTraceArguments {
    /// Thread.
    pub thread_id: i64,
    /// First frame wanted.
    pub start_frame: Option<u32>,
    /// Frames wanted (0 or absent: all).
    pub levels: Option<u32>,
}

/// `evaluate` arguments.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EvaluateArguments {
    /// The expression, as the daemon reads it: globals (`[module:]name`),
    /// `.member`, `->member`, `[i]`, `*`, `&`, casts to the program's types.
    pub expression: String,
    /// Frame: its parameters and locals can start the expression.
    pub frame_id: Option<i64>,
    /// `watch`, `repl`, `hover`...
    pub context: Option<String>,
}

/// `readMemory` arguments.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadMemoryArguments {
    /// An address (as `memoryReference` fields carry them).
    pub memory_reference: String,
    /// Bytes from it.
    pub offset: Option<i64>,
    /// Bytes wanted.
    pub count: u64,
}

/// `dataBreakpointInfo` response body.
#[derive(Debug, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct DataBreakpointInfoBody {
    /// `None` (JSON null): nothing can be watched; `description` says why.
    pub data_id: Option<String>,
    /// What is watched, or why nothing can be.
    pub description: String,
    /// Access kinds possible.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_types: Option<Vec<&'static str>>,
    /// The dataId means the same thing in another debug session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_persist: Option<bool>,
}

/// `setBreakpoints` arguments.
#[derive(Debug, Deserialize)]
pub struct SetBreakpointsArguments {
    /// The source file.
    pub source: SourceArgument,
    /// Its breakpoints (the whole set for the file).
    #[serde(default)]
    pub breakpoints: Vec<SourceBreakpoint>,
}

/// A source as a request names it.
#[derive(Debug, Deserialize, Default)]
pub struct SourceArgument {
    /// Path on this host.
    pub path: Option<String>,
    /// File name.
    pub name: Option<String>,
}

/// One entry of `setBreakpoints`.
#[derive(Debug, Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
pub struct SourceBreakpoint {
    /// 1-based line.
    pub line: u32,
    /// A condition (refused: code breakpoints stop unconditionally).
    pub condition: Option<String>,
    /// A hit condition (refused likewise).
    pub hit_condition: Option<String>,
    /// A log point's message (refused: every code breakpoint stops).
    pub log_message: Option<String>,
}

/// `setFunctionBreakpoints` arguments.
#[derive(Debug, Deserialize)]
pub struct SetFunctionBreakpointsArguments {
    /// The whole set.
    #[serde(default)]
    pub breakpoints: Vec<FunctionBreakpoint>,
}

/// One entry of `setFunctionBreakpoints`.
#[derive(Debug, Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
pub struct FunctionBreakpoint {
    /// `[MODULE:]FUNCTION`.
    pub name: String,
    /// A condition (refused).
    pub condition: Option<String>,
    /// A hit condition (refused).
    pub hit_condition: Option<String>,
}

/// A list of breakpoints the adapter does not set (only their number is
/// read).
#[derive(Debug, Deserialize)]
pub struct BreakpointList {
    /// The breakpoints asked for.
    #[serde(default)]
    pub breakpoints: Vec<IgnoredAny>,
}

/// `scopes` arguments.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScopesArguments {
    /// The frame (0 when absent: no frame).
    #[serde(default)]
    pub frame_id: i64,
}

/// `variables` arguments.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VariablesArguments {
    /// The container (0 when absent: none).
    #[serde(default)]
    pub variables_reference: i64,
}

/// The breakpoints of a `set*Breakpoints` response, one per entry asked.
#[derive(Debug, Serialize)]
pub struct BreakpointsBody {
    /// In the order asked.
    pub breakpoints: Vec<Breakpoint>,
}

/// `threads` response body.
#[derive(Debug, Serialize)]
pub struct ThreadsBody {
    /// Every thread of the target (none when not attached).
    pub threads: Vec<Thread>,
}

/// `stackTrace` response body.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StackTraceBody {
    /// The frames asked for.
    pub stack_frames: Vec<StackFrame>,
    /// How many frames the thread has (as far as they were walked).
    pub total_frames: usize,
}

/// `scopes` response body.
#[derive(Debug, Serialize)]
pub struct ScopesBody {
    /// The frame's scopes.
    pub scopes: Vec<Scope>,
}

/// `variables` response body.
#[derive(Debug, Serialize)]
pub struct VariablesBody {
    /// The container's variables.
    pub variables: Vec<Variable>,
}

/// `evaluate` response body.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EvaluateBody {
    /// The value (or the address, for `&name` and functions).
    pub result: String,
    /// Its type.
    #[serde(rename = "type")]
    pub type_name: String,
    /// Always 0: no children.
    pub variables_reference: i64,
    /// Its address, for memory views (left out for a value in no memory).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub memory_reference: String,
}

/// `continue` response body.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContinueBody {
    /// Every thread runs (not only the one named).
    pub all_threads_continued: bool,
}

/// `readMemory` response body.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadMemoryBody {
    /// The first address read.
    pub address: String,
    /// Bytes at the end that could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable_bytes: Option<u64>,
    /// The bytes, base64.
    pub data: String,
}

#[cfg(test)]
mod tests {
    /// The VS Code manifest (`adapters/vscode/package.json`) offers exactly
    /// the attach arguments the adapter reads.
    #[test]
    fn the_vscode_manifest_matches_the_attach_arguments() {
        let text = include_str!("../../../vscode/package.json");
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        let d = &v["contributes"]["debuggers"][0];
        assert_eq!(d["type"], "wpd");
        assert_eq!(d["program"], "wpctl");
        assert_eq!(d["args"], serde_json::json!(["dap"]));
        let props = d["configurationAttributes"]["attach"]["properties"]
            .as_object()
            .unwrap();
        let mut names: Vec<&str> = props.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["backend", "pid", "stopOnHit"]);
        // Every value the manifest offers is one the adapter takes.
        let a: super::AttachArguments = serde_json::from_value(serde_json::json!({
            "pid": 1, "backend": "perf", "stopOnHit": "thread"
        }))
        .unwrap();
        assert_eq!(a.backend.as_deref(), Some("perf"));
        assert_eq!(a.stop_on_hit.as_deref(), Some("thread"));
        assert_eq!(
            props["backend"]["enum"],
            serde_json::json!(["ptrace", "perf"])
        );
        assert_eq!(
            props["stopOnHit"]["enum"],
            serde_json::json!(["all", "thread"])
        );
    }

    /// Line breakpoints can be set in the languages the debugger names.
    #[test]
    fn the_vscode_manifest_allows_line_breakpoints() {
        let text = include_str!("../../../vscode/package.json");
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        let langs: Vec<&str> = v["contributes"]["breakpoints"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|b| b["language"].as_str())
            .collect();
        assert_eq!(
            serde_json::json!(langs),
            v["contributes"]["debuggers"][0]["languages"]
        );
        let a: super::SetBreakpointsArguments = serde_json::from_value(serde_json::json!({
            "source": {"path": "/src/a.c"}, "breakpoints": [{"line": 3, "condition": "x"}]
        }))
        .unwrap();
        assert_eq!(a.source.path.as_deref(), Some("/src/a.c"));
        assert_eq!(a.breakpoints[0].line, 3);
    }

    /// The same for `launch`.
    #[test]
    fn the_vscode_manifest_matches_the_launch_arguments() {
        let text = include_str!("../../../vscode/package.json");
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        let props =
            v["contributes"]["debuggers"][0]["configurationAttributes"]["launch"]["properties"]
                .as_object()
                .unwrap();
        let mut names: Vec<&str> = props.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "args",
                "backend",
                "cwd",
                "env",
                "program",
                "stopOnEntry",
                "stopOnHit"
            ]
        );
        let a: super::LaunchArguments = serde_json::from_value(serde_json::json!({
            "program": "/bin/true", "args": ["a"], "env": {"A": "1"}, "cwd": "/",
            "stopOnEntry": true, "backend": "ptrace", "stopOnHit": "all"
        }))
        .unwrap();
        assert!(a.stop_on_entry);
        assert_eq!(a.args, ["a"]);
        assert_eq!(a.cwd.as_deref(), Some("/"));
    }
}
