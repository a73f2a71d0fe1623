//! Output helpers: writing to stdout (line-flushed, EPIPE-aware), plain
//! tables, JSON documents, and formatting of enums, addresses and times.
//!
//! Text a watched program or a daemon chose (names, paths, reasons) goes
//! through [`escape`] where it is put into a line, so that it stays inside
//! its field: a newline in a thread name cannot start a line of its own
//! (nor forge another host's `[host]` tag), an escape sequence cannot reach
//! the terminal. [`emit`] and [`line_safe`] are the net under that: no
//! control or bidirectional-formatting character other than the newlines
//! between lines is ever written. JSON keeps the values as they are, with
//! those characters written as `\uXXXX` ([`json_safe`]), so that a JSON Lines
//! record is always one line of ASCII controls-free text.

use std::borrow::Cow;
use std::io::{self, Write};

use serde_json::{Value, json};
use wpd_proto::text::{escape, is_plain};
use wpd_proto::v1::{
    Access, Backend, HitAction, Location, ProcessInfo, SlotState, Symbol, SymbolSource,
    ThreadState, Watchpoint, WatchpointSpec,
};

use crate::error::Error;

/// Whether `c` is written as it is by [`line_safe`] and [`json_safe`]
/// (backslashes are: they begin the escapes already made).
fn passes(c: char) -> bool {
    c == '\n' || c == '\\' || is_plain(c.encode_utf8(&mut [0; 4]))
}

/// `text` with every control and bidirectional-formatting character other
/// than `\n` written as [`escape`] writes it: what reaches a terminal can
/// move no cursor and set no title, whatever a field forgot.
pub fn line_safe(text: &str) -> Cow<'_, str> {
    if text.chars().all(passes) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if passes(c) {
            out.push(c);
        } else {
            out.push_str(&escape(c.encode_utf8(&mut [0; 4])));
        }
    }
    Cow::Owned(out)
}

/// JSON text (as serde_json writes it, which escapes C0 controls, quotes
/// and backslashes) with every other control or bidirectional-formatting
/// character (DEL, C1, U+2028, overrides...) written as `\uXXXX`: the same
/// value, one line, nothing a terminal acts on. JSON's own syntax is ASCII,
/// so such a character can only be inside a string.
pub fn json_safe(text: String) -> String {
    if text.chars().all(passes) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if passes(c) {
            out.push(c);
        } else {
            for unit in c.encode_utf16(&mut [0; 2]) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// Writes `text` (a newline is added if missing) to stdout and flushes,
/// through [`line_safe`].
pub fn emit(text: &str) -> Result<(), Error> {
    let text = line_safe(text);
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    if !text.ends_with('\n') {
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// Writes `line` on stderr, through [`line_safe`].
pub fn warn(line: &str) {
    eprintln!("{}", line_safe(line));
}

/// One JSON document, pretty-printed, through [`json_safe`].
pub fn json_pretty(value: &Value) -> String {
    json_safe(serde_json::to_string_pretty(value).expect("JSON values always serialize"))
}

/// One JSON value on one line (JSON Lines), through [`json_safe`].
pub fn json_line(value: &Value) -> String {
    json_safe(serde_json::to_string(value).expect("JSON values always serialize"))
}

/// Writes one pretty-printed JSON document to stdout.
pub fn emit_json(value: &Value) -> Result<(), Error> {
    emit(&json_pretty(value))
}

/// Writes one JSON value as a single line (JSON Lines) to stdout.
pub fn emit_json_line(value: &Value) -> Result<(), Error> {
    emit(&json_line(value))
}

/// A plain text table: left-aligned columns separated by two spaces.
#[derive(Debug)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Table {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are blank).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Renders the header and rows, each line ending in a newline, without
    /// trailing spaces.
    pub fn render(&self) -> String {
        let ncols = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.header.len()])
            .max()
            .unwrap_or(0);
        let mut widths = vec![0; ncols];
        for line in std::iter::once(&self.header).chain(&self.rows) {
            for (w, cell) in widths.iter_mut().zip(line) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for line in std::iter::once(&self.header).chain(&self.rows) {
            let mut text = String::new();
            for (i, w) in widths.iter().enumerate() {
                let cell = line.get(i).map_or("", String::as_str);
                if i > 0 {
                    text.push_str("  ");
                }
                text.push_str(cell);
                text.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Renders `key: value` lines with the values aligned.
pub fn key_values(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len() + 1).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in pairs {
        out.push_str(format!("{:<width$} {v}", format!("{k}:")).trim_end());
        out.push('\n');
    }
    out
}

/// `0x`-prefixed lowercase hex.
pub fn hex(v: u64) -> String {
    format!("{v:#x}")
}

/// Bytes as contiguous lowercase hex, in memory order (no prefix).
pub fn hex_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes read as an unsigned little-endian integer (1 to 8 bytes).
pub fn le_value(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 8 {
        return None;
    }
    let mut buf = [0u8; 8];
    buf[..bytes.len()].copy_from_slice(bytes);
    Some(u64::from_le_bytes(buf))
}

/// A byte count in binary units: `512 B`, `3.4 KiB`, `12.0 MiB`.
pub fn bytes(n: u64) -> String {
    match n {
        0..1024 => format!("{n} B"),
        1024..1_048_576 => format!("{:.1} KiB", n as f64 / 1024.0),
        _ => format!("{:.1} MiB", n as f64 / 1_048_576.0),
    }
}

/// `n word` or `n words`.
pub fn plural(n: impl Into<u64>, word: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// Access kind as used on the command line: write, rw, exec, read.
pub fn access_name(v: i32) -> String {
    match Access::try_from(v) {
        Ok(Access::Write) => "write".into(),
        Ok(Access::ReadWrite) => "rw".into(),
        Ok(Access::Exec) => "exec".into(),
        Ok(Access::Read) => "read".into(),
        Ok(Access::Unspecified) => "unspecified".into(),
        Err(_) => format!("unknown({v})"),
    }
}

/// Backend name: perf, ptrace (or unspecified).
pub fn backend_name(v: i32) -> String {
    match Backend::try_from(v) {
        Ok(Backend::Perf) => "perf".into(),
        Ok(Backend::Ptrace) => "ptrace".into(),
        Ok(Backend::Unspecified) => "unspecified".into(),
        Err(_) => format!("unknown({v})"),
    }
}

/// How a policy found an instance's process: set-policy (running when the
/// policy was set), kernel-record (its fork or exec record), scan (`/proc`).
pub fn instance_source_name(v: i32) -> String {
    match wpd_proto::v1::InstanceSource::try_from(v) {
        Ok(wpd_proto::v1::InstanceSource::SetPolicy) => "set-policy".into(),
        Ok(wpd_proto::v1::InstanceSource::KernelRecord) => "kernel-record".into(),
        Ok(wpd_proto::v1::InstanceSource::Scan) => "scan".into(),
        Ok(wpd_proto::v1::InstanceSource::ExecHold) => "exec-hold".into(),
        Ok(wpd_proto::v1::InstanceSource::Unspecified) => "unspecified".into(),
        Err(_) => format!("unknown({v})"),
    }
}

/// Hit action as used on the command line: log, stop, stop-all (unspecified
/// means log).
pub fn action_name(v: i32) -> String {
    match HitAction::try_from(v) {
        Ok(HitAction::Log | HitAction::Unspecified) => "log".into(),
        Ok(HitAction::Stop) => "stop".into(),
        Ok(HitAction::StopAll) => "stop-all".into(),
        Ok(HitAction::Signal) => "signal".into(),
        Err(_) => format!("unknown({v})"),
    }
}

/// The ACTION column of `wpctl list`: the action name, with `+change` for
/// only-on-change watchpoints (`log`, `stop+change`, `stop-all`).
pub fn action_short(spec: &WatchpointSpec) -> String {
    let name = action_name(spec.action);
    if spec.only_on_change {
        format!("{name}+change")
    } else {
        name
    }
}

/// Slot state name: free, ours, foreign, pending, retained (or unspecified).
pub fn slot_state_name(v: i32) -> String {
    match SlotState::try_from(v) {
        Ok(SlotState::Free) => "free".into(),
        Ok(SlotState::Ours) => "ours".into(),
        Ok(SlotState::Foreign) => "foreign".into(),
        Ok(SlotState::Pending) => "pending".into(),
        Ok(SlotState::Retained) => "retained".into(),
        Ok(SlotState::Unspecified) => "unspecified".into(),
        Err(_) => format!("unknown({v})"),
    }
}

/// Thread state name for JSON: running, stopped_at_hit, stopped_by_peer,
/// job_stopped (or unspecified).
pub fn thread_state_name(v: i32) -> String {
    match ThreadState::try_from(v) {
        Ok(ThreadState::Running) => "running".into(),
        Ok(ThreadState::StoppedAtHit) => "stopped_at_hit".into(),
        Ok(ThreadState::StoppedByPeer) => "stopped_by_peer".into(),
        Ok(ThreadState::JobStopped) => "job_stopped".into(),
        Ok(ThreadState::StoppedAfterStep) => "stopped_after_step".into(),
        Ok(ThreadState::Stepping) => "stepping".into(),
        Ok(ThreadState::Unspecified) => "unspecified".into(),
        Err(_) => format!("unknown({v})"),
    }
}

/// Thread state for tables: running, stopped (hit), stopped (peer),
/// job-stopped (`-` when not reported).
pub fn thread_state_label(v: i32) -> String {
    match ThreadState::try_from(v) {
        Ok(ThreadState::Running) => "running".into(),
        Ok(ThreadState::StoppedAtHit) => "stopped (hit)".into(),
        Ok(ThreadState::StoppedByPeer) => "stopped (peer)".into(),
        Ok(ThreadState::JobStopped) => "job-stopped".into(),
        Ok(ThreadState::StoppedAfterStep) => "stopped (step)".into(),
        Ok(ThreadState::Stepping) => "stepping".into(),
        Ok(ThreadState::Unspecified) => "-".into(),
        Err(_) => format!("unknown({v})"),
    }
}

/// A duration in nanoseconds, e.g. `850 ns`, `12.5 µs`, `4.2 ms`, `1.25 s`.
pub fn duration_ns(ns: u64) -> String {
    let f = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} µs", f / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.1} ms", f / 1e6)
    } else {
        format!("{:.2} s", f / 1e9)
    }
}

/// A whole-second duration, e.g. `42s`, `3m07s`, `2h05m`, `4d03h`.
pub fn duration_s(s: u64) -> String {
    let (d, h, m, s) = (s / 86_400, s / 3_600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}d{h:02}h")
    } else if h > 0 {
        format!("{h}h{m:02}m")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}

/// Time of day (UTC) of a Unix-epoch nanosecond timestamp, to the
/// microsecond: `13:04:05.123456Z`. Zero (unknown) gives `-`.
pub fn clock(ns: u64) -> String {
    if ns == 0 {
        return "-".into();
    }
    let secs = ns / 1_000_000_000;
    let micros = ns % 1_000_000_000 / 1_000;
    let day = secs % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{micros:06}Z",
        day / 3_600,
        day / 60 % 60,
        day % 60
    )
}

/// How long ago a Unix-epoch nanosecond timestamp was, e.g. `3m07s ago`.
pub fn ago(ns: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    if ns == 0 || now < ns {
        return "-".into();
    }
    format!("{} ago", duration_s((now - ns) / 1_000_000_000))
}

/// A name a program or a daemon chose, [`escape`]d, or `-` when empty.
pub fn name_or_dash(name: &str) -> String {
    if name.is_empty() {
        "-".into()
    } else {
        escape(name).into_owned()
    }
}

/// `123(name)` with the name [`escape`]d, or `123` without a name.
pub fn id_named(id: impl std::fmt::Display, name: &str) -> String {
    if name.is_empty() {
        id.to_string()
    } else {
        format!("{id}({})", escape(name))
    }
}

/// A list of ids as `7,9,12` (or `-` when empty).
pub fn id_list<T: std::fmt::Display>(ids: &[T]) -> String {
    if ids.is_empty() {
        return "-".into();
    }
    ids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The scope of a watchpoint: `process` (every thread, including future
/// ones) or its thread ids.
pub fn scope(wp: &Watchpoint) -> String {
    match &wp.spec {
        _ if wp.process_wide => "process".into(),
        Some(spec) if !spec.tids.is_empty() => id_list(&spec.tids),
        Some(spec) if !spec.thread_name.is_empty() => {
            format!("named {}", escape(&spec.thread_name))
        }
        _ => "-".into(),
    }
}

/// A module's file name from its path; a place as text.
pub use wpd_proto::text::{file_name, location_text};

/// `stats.errors (int, 4 bytes, ct-pie, DWARF)`.
pub fn symbol_text(s: &Symbol) -> String {
    let mut parts = Vec::new();
    if !s.type_name.is_empty() {
        parts.push(escape(&s.type_name).into_owned());
    }
    parts.push(plural(s.size, "byte"));
    parts.push(escape(file_name(&s.module)).into_owned());
    parts.push(source_name(s.source).into());
    format!("{} ({})", escape(&s.expression), parts.join(", "))
}

/// Where a name's address came from.
pub fn source_name(v: i32) -> &'static str {
    match SymbolSource::try_from(v) {
        Ok(SymbolSource::Dwarf) => "DWARF",
        Ok(SymbolSource::Symtab) => "symbol table",
        Ok(SymbolSource::Dynsym) => "dynamic symbol table",
        _ => "?",
    }
}

/// A resolved name as JSON.
pub fn symbol_json(s: &Symbol) -> Value {
    json!({
        "expression": s.expression,
        "name": s.name,
        "module": s.module,
        "build_id": hex_bytes(&s.build_id),
        "address": hex(s.address),
        "size": s.size,
        "type": if s.type_name.is_empty() { Value::Null } else { json!(s.type_name) },
        "source": source_name(s.source),
        "module_address": hex(s.module_address),
        "note": if s.note.is_empty() { Value::Null } else { json!(s.note) },
        "value_type": s.value_type.as_ref().map(value_type_json),
    })
}

/// A location as JSON: every field.
pub fn location_json(l: &Location) -> Value {
    json!({
        "ip": hex(l.ip),
        "lookup_address": hex(l.lookup_address),
        "function": if l.function.is_empty() { Value::Null } else { json!(l.function) },
        "function_offset": l.function_offset,
        "file": if l.file.is_empty() { Value::Null } else { json!(l.file) },
        "line": l.line,
        "column": l.column,
        "inlined": l.inlined.iter().map(|i| json!({"function": i.function, "file": i.file, "line": i.line})).collect::<Vec<_>>(),
        "module": if l.module.is_empty() { Value::Null } else { json!(l.module) },
        "build_id": hex_bytes(&l.build_id),
        "module_address": hex(l.module_address),
        "file_offset": if l.has_file_offset { json!(l.file_offset) } else { Value::Null },
    })
}

/// `write 8 bytes at 0x55d0c0a01040 in pid 123`; a range of several
/// pieces adds them: `… (3 slots: 8@0x…, 8@0x…, 8@0x…)`.
pub fn describe(wp: &Watchpoint) -> String {
    let spec = wp.spec.clone().unwrap_or_default();
    let mut s = match &wp.symbol {
        // The whole object: its size is in the description already.
        Some(sym) if u64::from(spec.length) == sym.size => format!(
            "{} {} at {} in pid {}",
            access_name(spec.access),
            symbol_text(sym),
            hex(spec.address),
            spec.pid
        ),
        Some(sym) => format!(
            "{} {} of {} at {} in pid {}",
            access_name(spec.access),
            plural(spec.length, "byte"),
            symbol_text(sym),
            hex(spec.address),
            spec.pid
        ),
        None => format!(
            "{} {} at {} in pid {}",
            access_name(spec.access),
            plural(spec.length, "byte"),
            hex(spec.address),
            spec.pid
        ),
    };
    if wp.pieces.len() > 1 {
        let pieces: Vec<String> = wp
            .pieces
            .iter()
            .map(|p| format!("{}@{}", p.length, hex(p.address)))
            .collect();
        s.push_str(&format!(
            " ({} slots: {})",
            wp.pieces.len(),
            pieces.join(", ")
        ));
    }
    s
}

/// A watchpoint as JSON.
pub fn watchpoint_json(wp: &Watchpoint) -> Value {
    let spec = wp.spec.clone().unwrap_or_default();
    json!({
        "id": wp.id,
        "pid": spec.pid,
        "tids": spec.tids,
        "thread_name": spec.thread_name,
        "follow_forks": spec.follow_forks,
        "forked_children": wp.forked_children,
        "process_wide": wp.process_wide,
        "address": hex(spec.address),
        "length": spec.length,
        "pieces": wp.pieces.iter().map(|p| json!({"address": hex(p.address), "length": p.length})).collect::<Vec<_>>(),
        "access": access_name(spec.access),
        "action": action_name(spec.action),
        "symbol": wp.symbol.as_ref().map(symbol_json),
        "backtrace_depth": spec.backtrace_depth,
        "only_on_change": spec.only_on_change,
        "condition": spec.condition.as_ref().filter(|c| c.op != 0).map(condition_text),
        "value_type": wp.value_type.as_ref().map(value_type_json),
        "ignore_count": spec.ignore_count,
        "hit_count": spec.hit_count,
        "max_hits_per_second": spec.max_hits_per_second,
        "hits_filtered": wp.hits_filtered,
        "hits_rate_limited": wp.hits_rate_limited,
        "backend": backend_name(wp.backend),
        "armed_threads": wp.armed_threads,
        "hits": wp.hits,
        "created_at_ns": wp.created_at_ns,
        "policy_id": wp.policy_id,
        "breakpoint": wp.breakpoint.as_ref().map(place_json),
        "pending": wp.pending,
        "pending_reason": wp.pending.then(|| wp.pending_reason.clone()),
        "function": spec.code_event.as_ref().map(|c| c.function.clone()),
    })
}

/// Where a code event is, as asked (escaped): `[MODULE:]NAME`, or
/// `FILE:LINE` for a code breakpoint at a source line.
pub fn code_at(code: &wpd_proto::v1::CodeEvent) -> String {
    if code.file.is_empty() {
        escape(&code.function).into_owned()
    } else {
        format!("{}:{}", escape(&code.file), code.line)
    }
}

/// A code breakpoint's place: `conn_new at /src/objects.c:48`, or
/// `conn_new` without a line table.
pub fn place_text(p: &wpd_proto::v1::BreakpointPlace) -> String {
    let mut text = escape(&p.function).into_owned();
    if !p.file.is_empty() && p.line > 0 {
        text.push_str(&format!(" at {}:{}", escape(&p.file), p.line));
    }
    text
}

/// A code breakpoint's place as JSON.
pub fn place_json(p: &wpd_proto::v1::BreakpointPlace) -> Value {
    json!({
        "function": p.function,
        "file": p.file,
        "line": p.line,
        "address": hex(p.address),
        "module": p.module,
        "offset": hex(p.offset),
    })
}

/// An attached process as JSON.
pub fn process_json(p: &ProcessInfo) -> Value {
    json!({
        "pid": p.pid,
        "comm": p.comm,
        "backend": backend_name(p.backend),
        "threads": p.threads,
        "watchpoints": p.watchpoints,
        "attached_at_ns": p.attached_at_ns,
        "stops": p.stops,
    })
}

/// `value & 0xff == 3`, `value < -1`, `value == DONE`, `value changed`.
pub fn condition_text(c: &wpd_proto::v1::HitCondition) -> String {
    wpd_proto::condition::text(c)
}

/// A value read as its type (`kind`, a `ValueKind`) as JSON: a number
/// (signed, unsigned, floating point; a float that is not finite as a
/// string, `"NaN"`, `"inf"`), `true`/`false`, a pointer as a hex string;
/// null when nothing was read or it is no number.
pub fn typed_json(kind: i32, bytes: &[u8]) -> Value {
    use wpd_proto::value::Typed;
    match wpd_proto::value::typed(kind, bytes) {
        None => Value::Null,
        Some(Typed::Signed(v)) => json!(v),
        Some(Typed::Unsigned(v)) => json!(v),
        Some(Typed::Float(v)) if v.is_finite() => json!(v),
        Some(t @ Typed::Float(_)) => json!(t.to_string()),
        Some(Typed::Bool(v)) => json!(v),
        Some(Typed::Pointer(v)) => json!(hex(v)),
    }
}

/// A value type as JSON: kind, size, C name, enumerators, and why there is
/// none (`note`).
pub fn value_type_json(t: &wpd_proto::v1::ValueType) -> Value {
    json!({
        "kind": wpd_proto::value::kind_name(t.kind),
        "size": t.size,
        "name": if t.name.is_empty() { Value::Null } else { json!(t.name) },
        "enumerators": t.enumeration.then(|| t.enumerators.iter().map(|e| json!({"name": e.name, "value": e.value})).collect::<Vec<_>>()),
        "note": if t.note.is_empty() { Value::Null } else { json!(t.note) },
    })
}

/// `2nd`, `3rd`, `11th`, `21st`.
pub fn ordinal(n: u64) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// What a spec's hit filter does, as phrases for a confirmation line.
pub fn filter_phrases(spec: &wpd_proto::v1::WatchpointSpec) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(c) = spec.condition.as_ref().filter(|c| c.op != 0) {
        v.push(format!("when {}", condition_text(c)));
    }
    if spec.ignore_count > 0 {
        v.push(format!(
            "ignoring the first {}",
            plural(spec.ignore_count, "hit")
        ));
    }
    if spec.hit_count > 1 {
        v.push(format!("every {} hit", ordinal(spec.hit_count)));
    }
    if spec.max_hits_per_second > 0 {
        v.push(format!("at most {}/s", spec.max_hits_per_second));
    }
    v
}

/// What a policy watches: `write counter` or `write 8 bytes at 0x4010`.
pub fn policy_what(p: &wpd_proto::v1::Policy) -> String {
    let spec = p.spec.clone().unwrap_or_default();
    if let Some(c) = &spec.code_event {
        return format!(
            "{} {} of every object {} {}",
            access_name(spec.access),
            escape(&spec.symbol),
            if c.at_return {
                "returned by"
            } else {
                "passed to"
            },
            escape(&c.function)
        );
    }
    if spec.symbol.is_empty() {
        format!(
            "{} {} at {}",
            access_name(spec.access),
            plural(spec.length, "byte"),
            hex(spec.address)
        )
    } else {
        format!("{} {}", access_name(spec.access), escape(&spec.symbol))
    }
}

/// Which processes: `every process with comm fuzzer in cgroup /farm`, `pids 4, 5`.
pub fn selector_phrase(s: Option<&wpd_proto::v1::ProcessSelector>) -> String {
    let Some(s) = s else {
        return "no process".into();
    };
    let mut parts = Vec::new();
    if !s.comm.is_empty() {
        parts.push(format!("with comm {}", escape(&s.comm)));
    }
    if !s.exe.is_empty() {
        parts.push(format!("running {}", escape(&s.exe)));
    }
    if !s.cgroup.is_empty() {
        parts.push(format!("in cgroup {}", escape(&s.cgroup)));
    }
    let pids = s
        .pids
        .iter()
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if parts.is_empty() {
        format!("pids {pids}")
    } else if s.pids.is_empty() {
        format!("every process {}", parts.join(" "))
    } else {
        format!("pids {pids} {}", parts.join(" "))
    }
}

/// A policy as JSON.
pub fn policy_json(p: &wpd_proto::v1::Policy) -> Value {
    let spec = p.spec.clone().unwrap_or_default();
    let sel = p.selector.clone().unwrap_or_default();
    json!({
        "id": p.id,
        "selector": {
            "pids": sel.pids,
            "comm": sel.comm,
            "exe": sel.exe,
            "cgroup": sel.cgroup,
        },
        "symbol": spec.symbol,
        "address": hex(spec.address),
        "length": spec.length,
        "access": access_name(spec.access),
        "backend": backend_name(spec.backend),
        "created_at_ns": p.created_at_ns,
        "instances_made": p.instances_made,
        "instances": p.instances.iter().map(|i| json!({
            "pid": i.pid,
            "comm": i.comm,
            "watchpoint_id": i.watchpoint_id,
            "armed_at_ns": i.armed_at_ns,
            "latency_ns": i.latency_ns,
            "found_by": instance_source_name(i.found_by),
        })).collect::<Vec<_>>(),
        "refusals": p.refusals.iter().map(|r| json!({
            "pid": r.pid,
            "comm": r.comm,
            "reason": r.reason,
            "at_ns": r.at_ns,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_that_drives_a_terminal_is_written() {
        assert!(matches!(
            line_safe("plain\nlines µ → \\x1b"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            line_safe("a\x1b]0;t\x07\n\u{202e}b\r\u{85}"),
            "a\\x1b]0;t\\x07\n\\u{202e}b\\r\\u{0085}"
        );
        let v = json!({ "name": "x\n\u{1b}\u{202e}\u{2028}\u{85}\u{7f}é" });
        let line = json_line(&v);
        assert_eq!(line, r#"{"name":"x\n\u001b\u202e\u2028\u0085\u007fé"}"#);
        let back: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back, v);
        let pretty = json_pretty(&v);
        assert_eq!(serde_json::from_str::<Value>(&pretty).unwrap(), v);
        assert!(pretty.chars().all(|c| c == '\n' || !c.is_control()));
    }

    #[test]
    fn table_aligns_and_trims() {
        let mut t = Table::new(["ID", "NAME", "X"]);
        t.row(vec!["7".into(), "long-name".into(), "".into()]);
        t.row(vec!["1234".into(), "a".into(), "b".into()]);
        assert_eq!(
            t.render(),
            "ID    NAME       X\n7     long-name\n1234  a          b\n"
        );
    }

    #[test]
    fn values_and_times() {
        assert_eq!(hex(0x55d0c0a01040), "0x55d0c0a01040");
        assert_eq!(hex_bytes(&[0x2a, 0, 0, 0]), "2a000000");
        assert_eq!(le_value(&[0x2a, 0x01]), Some(0x012a));
        assert_eq!(le_value(&[]), None);
        assert_eq!(le_value(&[0xff; 8]), Some(u64::MAX));
        assert_eq!(duration_ns(4_200_000), "4.2 ms");
        assert_eq!(duration_ns(999), "999 ns");
        assert_eq!(duration_s(3_725), "1h02m");
        assert_eq!(clock(1_700_000_000_123_456_789), "22:13:20.123456Z");
        assert_eq!(plural(1u32, "thread"), "1 thread");
        assert_eq!(plural(1001u32, "thread"), "1001 threads");
        assert_eq!(id_list::<u64>(&[]), "-");
        assert_eq!(id_list(&[7u64, 9]), "7,9");
        assert_eq!(access_name(Access::ReadWrite as i32), "rw");
        assert_eq!(access_name(99), "unknown(99)");
        assert_eq!(slot_state_name(SlotState::Foreign as i32), "foreign");
        assert_eq!(slot_state_name(SlotState::Retained as i32), "retained");
    }

    #[test]
    fn actions_and_thread_states() {
        assert_eq!(action_name(HitAction::Unspecified as i32), "log");
        assert_eq!(action_name(HitAction::StopAll as i32), "stop-all");
        assert_eq!(action_name(9), "unknown(9)");
        let mut spec = WatchpointSpec {
            action: HitAction::Stop as i32,
            ..Default::default()
        };
        assert_eq!(action_short(&spec), "stop");
        spec.only_on_change = true;
        assert_eq!(action_short(&spec), "stop+change");
        spec.action = HitAction::Unspecified as i32;
        assert_eq!(action_short(&spec), "log+change");
        assert_eq!(
            thread_state_name(ThreadState::StoppedByPeer as i32),
            "stopped_by_peer"
        );
        assert_eq!(
            thread_state_name(ThreadState::JobStopped as i32),
            "job_stopped"
        );
        assert_eq!(
            thread_state_label(ThreadState::StoppedAtHit as i32),
            "stopped (hit)"
        );
        assert_eq!(
            thread_state_label(ThreadState::JobStopped as i32),
            "job-stopped"
        );
        assert_eq!(thread_state_label(ThreadState::Unspecified as i32), "-");
    }
}
