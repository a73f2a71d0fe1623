//! The DAP messages the adapter speaks (DAP 1.71), as serde types: request
//! arguments it reads, response and event bodies it writes. Field names
//! follow the specification (camelCase); optional fields are left out when
//! empty.

use serde::{Deserialize, Serialize};

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

/// `dataBreakpointInfo` arguments.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataBreakpointInfoArguments {
    /// A child of `variables_reference`, an expression, or an address.
    pub name: String,
    /// Container of `name`.
    pub variables_reference: Option<i64>,
    /// Frame to evaluate in (globals only here: ignored).
    pub frame_id: Option<i64>,
    /// Bytes to watch from the address or variable.
    pub bytes: Option<u32>,
    /// `name` is an address.
    pub as_address: Option<bool>,
    /// A breakpoint mode (none advertised).
    pub mode: Option<String>,
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

/// One entry of `setDataBreakpoints`.
#[derive(Debug, Deserialize, Clone, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct DataBreakpoint {
    /// From `dataBreakpointInfo`.
    pub data_id: String,
    /// `read`, `write` or `readWrite` (default `write`).
    pub access_type: Option<String>,
    /// A condition on the value.
    pub condition: Option<String>,
    /// A hit-count condition.
    pub hit_condition: Option<String>,
}

/// `setDataBreakpoints` arguments.
#[derive(Debug, Deserialize)]
pub struct SetDataBreakpointsArguments {
    /// The whole new set.
    pub breakpoints: Vec<DataBreakpoint>,
}

/// A breakpoint as reported to the client.
#[derive(Debug, Serialize, Clone, Default)]
#[serde(rename_all = "camelCase")]
pub struct Breakpoint {
    /// Identifier (for `hitBreakpointIds` and `breakpoint` events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<i64>,
    /// Armed.
    pub verified: bool,
    /// Why not, or what to know.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `"failed"` (or `"pending"`) when not verified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// The address armed, for the client's disassembly views.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instruction_reference: Option<String>,
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

/// A frame of `stackTrace`.
#[derive(Debug, Serialize, Clone)]
#[serde(rename_all = "camelCase")]
pub struct StackFrame {
    /// Identifier (for `scopes`).
    pub id: i64,
    /// Function, or address and module.
    pub name: String,
    /// Source file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    /// Line (0: unknown).
    pub line: u32,
    /// Column (0: unknown).
    pub column: u32,
    /// The frame's instruction pointer.
    pub instruction_pointer_reference: String,
    /// `"subtle"` for frames without source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presentation_hint: Option<&'static str>,
}

/// A source file.
#[derive(Debug, Serialize, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// File name.
    pub name: String,
    /// Path on this host.
    pub path: String,
}

/// A frame's scope.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Scope {
    /// Shown name.
    pub name: String,
    /// Its variables.
    pub variables_reference: i64,
    /// Not worth fetching eagerly.
    pub expensive: bool,
    /// `"locals"`, `"registers"`...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presentation_hint: Option<&'static str>,
}

/// A variable.
#[derive(Debug, Serialize, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Variable {
    /// Name.
    pub name: String,
    /// Value as text.
    pub value: String,
    /// Type, when known.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_name: Option<String>,
    /// 0: no children.
    pub variables_reference: i64,
    /// An expression for `evaluate` / `dataBreakpointInfo`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evaluate_name: Option<String>,
    /// Its address, for `readMemory`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_reference: Option<String>,
}

/// `evaluate` arguments.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EvaluateArguments {
    /// The expression: a global's name (`[module:]name[.member][[i]]`), or
    /// `&name` for its address.
    pub expression: String,
    /// Frame (globals only: ignored).
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

/// `threads` / `scopes` / `variables` arguments, by their one field.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RefArguments {
    /// `scopes`.
    pub frame_id: Option<i64>,
    /// `variables`.
    pub variables_reference: Option<i64>,
}

/// What `initialize` answers: only what the adapter really does.
pub fn capabilities() -> serde_json::Value {
    serde_json::json!({
        "supportsConfigurationDoneRequest": true,
        "supportsDataBreakpoints": true,
        "supportsDataBreakpointBytes": true,
        "supportsConditionalBreakpoints": true,
        "supportsHitConditionalBreakpoints": true,
        "supportsReadMemoryRequest": true,
        "supportsSingleThreadExecutionRequests": true,
        "supportsEvaluateForHovers": true,
        "supportTerminateDebuggee": false,
        "supportsTerminateRequest": false,
        "supportsRestartRequest": false,
        "supportsSetVariable": false,
        "supportsStepBack": false,
        "supportsFunctionBreakpoints": false,
        "supportsInstructionBreakpoints": false,
    })
}

#[cfg(test)]
mod tests {
    /// The VS Code manifest (`adapters/vscode/package.json`) offers exactly
    /// the attach arguments the adapter reads.
    #[test]
    fn the_vscode_manifest_matches_the_attach_arguments() {
        let text = include_str!("../../vscode/package.json");
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
}
