//! The head of a stored event: its kind and whom it is about (pid, tid,
//! names), decoded from the bytes of its `wpd.v1.StreamEventsResponse`
//! without the rest, for readers that only route events (the export).

// What the exporter reads of an event for its subject and headers: its
// kind, pid, tid and a hit's names. Declared here with only those fields,
// so that prost skips the rest of the event (its value, owner, location)
// instead of decoding it; the tags are `wpd.v1.StreamEventsResponse`'s
// (checked against the full decoding by the export's tests).

/// A `StreamEventsResponse` with only its event's kind.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Head {
    /// The event.
    #[prost(
        oneof = "Event",
        tags = "10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21"
    )]
    pub event: Option<Event>,
}

/// The event's kind, and who it is about.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Event {
    /// `hit`.
    #[prost(message, tag = "10")]
    Hit(Hit),
    /// `thread_started`.
    #[prost(message, tag = "11")]
    ThreadStarted(PidTid),
    /// `thread_exited`.
    #[prost(message, tag = "12")]
    ThreadExited(PidTid),
    /// `process_exited`.
    #[prost(message, tag = "13")]
    ProcessExited(Pid1),
    /// `watchpoint_removed`.
    #[prost(message, tag = "14")]
    WatchpointRemoved(Pid2),
    /// `dropped`.
    #[prost(message, tag = "15")]
    Dropped(Nobody),
    /// `records_lost`.
    #[prost(message, tag = "16")]
    RecordsLost(Nobody),
    /// `process_lost`.
    #[prost(message, tag = "17")]
    ProcessLost(Pid1),
    /// `watchpoint_resolved`.
    #[prost(message, tag = "18")]
    WatchpointResolved(Pid2),
    /// `leased`.
    #[prost(message, tag = "19")]
    Leased(Nobody),
    /// `process_crashed`.
    #[prost(message, tag = "20")]
    ProcessCrashed(PidTid),
    /// `breakpoint_hit`.
    #[prost(message, tag = "21")]
    BreakpointHit(PidTid23),
}

/// A hit's pid 2, tid 3 and names 21, 22.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Hit {
    /// Process.
    #[prost(int32, tag = "2")]
    pub pid: i32,
    /// Thread.
    #[prost(int32, tag = "3")]
    pub tid: i32,
    /// Process name.
    #[prost(string, tag = "21")]
    pub process_name: String,
    /// Thread name.
    #[prost(string, tag = "22")]
    pub thread_name: String,
}

/// Pid 1 and tid 2.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PidTid {
    /// Process.
    #[prost(int32, tag = "1")]
    pub pid: i32,
    /// Thread.
    #[prost(int32, tag = "2")]
    pub tid: i32,
}

/// Pid 2 and tid 3.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PidTid23 {
    /// Process.
    #[prost(int32, tag = "2")]
    pub pid: i32,
    /// Thread.
    #[prost(int32, tag = "3")]
    pub tid: i32,
}

/// Pid 1.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Pid1 {
    /// Process.
    #[prost(int32, tag = "1")]
    pub pid: i32,
}

/// Pid 2.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Pid2 {
    /// Process.
    #[prost(int32, tag = "2")]
    pub pid: i32,
}

/// A daemon-wide event.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Nobody {}

impl Event {
    /// The subject kind, pid and tid (0: none).
    pub fn kind(&self) -> (&'static str, i32, i32) {
        match self {
            Event::Hit(h) => ("hit", h.pid, h.tid),
            Event::ThreadStarted(e) => ("thread_started", e.pid, e.tid),
            Event::ThreadExited(e) => ("thread_exited", e.pid, e.tid),
            Event::ProcessExited(e) => ("process_exited", e.pid, 0),
            Event::WatchpointRemoved(e) => ("watchpoint_removed", e.pid, 0),
            Event::RecordsLost(_) => ("records_lost", 0, 0),
            Event::ProcessLost(e) => ("process_lost", e.pid, 0),
            Event::ProcessCrashed(e) => ("process_crashed", e.pid, e.tid),
            Event::BreakpointHit(e) => ("breakpoint_hit", e.pid, e.tid),
            Event::WatchpointResolved(e) => ("watchpoint_resolved", e.pid, 0),
            Event::Dropped(_) => ("dropped", 0, 0),
            Event::Leased(_) => ("leased", 0, 0),
        }
    }

    /// A hit's process and thread names, taken (empty: not given).
    pub fn take_names(&mut self) -> (Option<String>, Option<String>) {
        match self {
            Event::Hit(h) => (
                Some(std::mem::take(&mut h.process_name)).filter(|s| !s.is_empty()),
                Some(std::mem::take(&mut h.thread_name)).filter(|s| !s.is_empty()),
            ),
            _ => (None, None),
        }
    }
}
