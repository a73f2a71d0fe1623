//! The events the adapter sends: one type each, the type being the body.

use serde::Serialize;

use super::Event;
use super::types::Breakpoint;

/// Ready for configuration (after `attach`).
#[derive(Debug, Serialize)]
pub struct Initialized {}

impl Event for Initialized {
    const EVENT: &'static str = "initialized";
}

/// The session is over (the process exited, or the event stream ended).
#[derive(Debug, Serialize)]
pub struct Terminated {}

impl Event for Terminated {
    const EVENT: &'static str = "terminated";
}

/// The launched program exited.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Exited {
    /// Its exit code (128 + the signal that killed it).
    pub exit_code: i32,
}

impl Event for Exited {
    const EVENT: &'static str = "exited";
}

/// A line in the debug console.
#[derive(Debug, Serialize)]
pub struct Output {
    /// `console`, `important`...
    pub category: &'static str,
    /// The text, its line end included.
    pub output: String,
}

impl Event for Output {
    const EVENT: &'static str = "output";
}

/// The process attached to.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Process {
    /// Its command name.
    pub name: String,
    /// Its pid.
    pub system_process_id: i32,
    /// On this host.
    pub is_local_process: bool,
    /// `attach` or `launch`.
    pub start_method: &'static str,
}

impl Event for Process {
    const EVENT: &'static str = "process";
}

/// Threads stopped (a data breakpoint hit, or a pause).
#[derive(Debug, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Stopped {
    /// `data breakpoint`, `function breakpoint`, `breakpoint`, `pause` or
    /// `entry`.
    pub reason: &'static str,
    /// What happened (the breakpoint, the old and new value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Where.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The thread that stopped.
    pub thread_id: i64,
    /// Every thread stopped.
    pub all_threads_stopped: bool,
    /// Do not move the focus (a stop after the first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preserve_focus_hint: Option<bool>,
    /// The breakpoints hit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hit_breakpoint_ids: Option<Vec<i64>>,
}

impl Event for Stopped {
    const EVENT: &'static str = "stopped";
}

/// A thread started or exited.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadEvent {
    /// `started` or `exited`.
    pub reason: &'static str,
    /// Its tid.
    pub thread_id: i64,
}

impl Event for ThreadEvent {
    const EVENT: &'static str = "thread";
}

/// A breakpoint changed (the daemon removed it).
#[derive(Debug, Serialize)]
pub struct BreakpointEvent {
    /// `changed`.
    pub reason: &'static str,
    /// Its new state.
    pub breakpoint: Breakpoint,
}

impl Event for BreakpointEvent {
    const EVENT: &'static str = "breakpoint";
}
