//! The DAP types that requests, responses and events share, and the
//! capabilities `initialize` answers.

use serde::{Deserialize, Serialize};

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
    /// A code breakpoint's source file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    /// A code breakpoint's line (the line it resolved to).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
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

/// A thread, as `threads` lists it.
#[derive(Debug, Serialize, Clone)]
pub struct Thread {
    /// The thread's id (its tid).
    pub id: i64,
    /// Shown name.
    pub name: String,
}

/// What `initialize` answers: only what the adapter really does.
#[derive(Debug, Serialize, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// `configurationDone` is awaited.
    pub supports_configuration_done_request: bool,
    /// `dataBreakpointInfo` and `setDataBreakpoints`.
    pub supports_data_breakpoints: bool,
    /// `asAddress` and `bytes` in `dataBreakpointInfo`.
    pub supports_data_breakpoint_bytes: bool,
    /// `condition` on data breakpoints (code breakpoints refuse one, each
    /// with its message).
    pub supports_conditional_breakpoints: bool,
    /// `hitCondition` on data breakpoints.
    pub supports_hit_conditional_breakpoints: bool,
    /// `readMemory`.
    pub supports_read_memory_request: bool,
    /// `singleThread` in `continue`.
    pub supports_single_thread_execution_requests: bool,
    /// `evaluate` with `context: "hover"`.
    pub supports_evaluate_for_hovers: bool,
    /// `terminateDebuggee` in `disconnect` (never: the target keeps running).
    pub support_terminate_debuggee: bool,
    /// The `terminate` request as DAP means it (ending the target).
    pub supports_terminate_request: bool,
    /// `restart`.
    pub supports_restart_request: bool,
    /// `setVariable`.
    pub supports_set_variable: bool,
    /// `stepBack`, `reverseContinue`.
    pub supports_step_back: bool,
    /// `setFunctionBreakpoints`.
    pub supports_function_breakpoints: bool,
    /// `setInstructionBreakpoints`.
    pub supports_instruction_breakpoints: bool,
    /// `granularity` in `next`, `stepIn`, `stepOut`.
    pub supports_stepping_granularity: bool,
    /// `disassemble`.
    pub supports_disassemble_request: bool,
    /// `writeMemory`.
    pub supports_write_memory_request: bool,
}

/// One instruction of a `disassemble` response.
#[derive(Debug, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct DisassembledInstruction {
    /// Its address, `0x…`.
    pub address: String,
    /// Its bytes in hex.
    pub instruction_bytes: String,
    /// Its text.
    pub instruction: String,
    /// The function holding it, at its first instruction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symbol: Option<String>,
    /// Its source line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// Its source file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<Source>,
    /// No instruction there (unreadable memory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presentation_hint: Option<&'static str>,
}

impl Capabilities {
    /// The adapter's.
    pub fn wpd() -> Capabilities {
        Capabilities {
            supports_configuration_done_request: true,
            supports_data_breakpoints: true,
            supports_data_breakpoint_bytes: true,
            supports_conditional_breakpoints: true,
            supports_hit_conditional_breakpoints: true,
            supports_read_memory_request: true,
            supports_single_thread_execution_requests: true,
            supports_evaluate_for_hovers: true,
            support_terminate_debuggee: false,
            supports_terminate_request: false,
            supports_restart_request: false,
            supports_set_variable: true,
            supports_step_back: false,
            supports_function_breakpoints: true,
            supports_instruction_breakpoints: false,
            supports_stepping_granularity: true,
            supports_disassemble_request: true,
            supports_write_memory_request: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_are_those_the_adapter_always_answered() {
        let v = serde_json::to_value(Capabilities::wpd()).unwrap();
        assert_eq!(
            v,
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
                "supportsSetVariable": true,
                "supportsStepBack": false,
                "supportsFunctionBreakpoints": true,
                "supportsInstructionBreakpoints": false,
                "supportsSteppingGranularity": true,
                "supportsDisassembleRequest": true,
                "supportsWriteMemoryRequest": true,
            })
        );
    }
}
