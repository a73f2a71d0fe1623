//! `wpctl break`: a code breakpoint, the thread that reaches a function or a
//! source line held until `wpctl resume` (SetWatchpoint with a CodeEvent
//! whose `stop` is set); with `--wait`, until the first thread reaches it.

use clap::Args;
use serde_json::{Value, json};
use wpd_proto::text::escape;
use wpd_proto::v1::stream_events_response::Event;
use wpd_proto::v1::{
    BreakpointHit, CodeEvent, GetRecentHitsRequest, HitAction, SetWatchpointRequest,
    StreamEventsRequest, Watchpoint, WatchpointSpec,
};

use crate::args::{BackendArg, backend_value, pid_parser};
use crate::cmd::Ctx;
use crate::error::Error;
use crate::output::{self, hex};

/// `wpctl break`.
#[derive(Debug, Args)]
pub struct BreakArgs {
    /// The process (attached first if needed, with the ptrace backend)
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
    /// Where: FUNCTION (past its prologue, where its body's first line starts), MODULE:FUNCTION
    /// for a library's (`libfoo.so:parse`; `ns::f` stays one C++ name), or FILE:LINE, a source
    /// line's first instruction (`conn.c:52`, `src/net/conn.c:52`: the path or its last
    /// components). What follows the last single `:` decides: digits make a line
    #[arg(value_name = "LOCATION")]
    pub location: String,
    /// Hold every thread of the process when one reaches it (default: only that thread)
    #[arg(long)]
    pub all_threads: bool,
    /// Let the first N threads that reach it go on
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub ignore: u64,
    /// After those, hold every Nth thread that reaches it (the others go on)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub hit_count: Option<u64>,
    /// Keep its last N stops in the daemon for `wpctl last` (default 16, at most 4096)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub keep: Option<u32>,
    /// Backend to use if the process is not attached yet (code breakpoints need ptrace)
    #[arg(long, value_enum)]
    pub backend: Option<BackendArg>,
    /// Allow pid 1 (the init process, whose stop takes the system with it)
    #[arg(long)]
    pub allow_init: bool,
    /// Once it is set, wait until a thread reaches it, print where it stopped (thread, function,
    /// file:line) and exit, leaving the thread held (with --json: one document, after the stop);
    /// exit 5 if the process exits or the breakpoint is removed first
    #[arg(long)]
    pub wait: bool,
    /// Accept a MODULE:FUNCTION (or FUNCTION) of a library the process has not loaded yet, or a
    /// FILE:LINE that no loaded module's line table names: the breakpoint is pending (`wpctl
    /// list`), and set when the dynamic linker maps a library that has it (a dlopen, or
    /// startup), before any of its code runs; the first such library takes it
    #[arg(long)]
    pub pending: bool,
}

/// Where a code breakpoint goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A function, `[MODULE:]NAME`, as the daemon takes it.
    Function(String),
    /// A source line.
    Line {
        /// The file: a path or its last components.
        file: String,
        /// 1-based.
        line: u32,
    },
}

/// Source-file suffixes: `FILE:FUNCTION` is refused rather than read as a
/// module called `conn.c`.
const SOURCE_SUFFIXES: &[&str] = &[
    ".c", ".h", ".cc", ".cpp", ".cxx", ".c++", ".hh", ".hpp", ".hxx", ".rs", ".go", ".m", ".mm",
    ".s", ".S", ".f", ".f90", ".zig", ".d",
];

/// The byte index of the last `:` of `s` that is not half of a `::`.
fn last_single_colon(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    (0..b.len())
        .rev()
        .find(|&i| b[i] == b':' && (i == 0 || b[i - 1] != b':') && b.get(i + 1) != Some(&b':'))
}

/// LOCATION: `FUNCTION`, `MODULE:FUNCTION` or `FILE:LINE`.
pub fn parse_location(s: &str) -> Result<Location, String> {
    if s.trim().is_empty() {
        return Err("an empty location: give FUNCTION, MODULE:FUNCTION or FILE:LINE".into());
    }
    if s.starts_with('*') {
        return Err(format!(
            "{s:?} is an address: a code breakpoint goes at a function or a source line (for \
             an address, a hardware breakpoint: wpctl watch --access exec --addr ADDR --action \
             stop)"
        ));
    }
    if s.chars().any(char::is_whitespace) {
        return Err(format!(
            "{s:?} holds a space: give FUNCTION, MODULE:FUNCTION or FILE:LINE"
        ));
    }
    if s.bytes().all(|c| c.is_ascii_digit()) {
        return Err(format!(
            "{s:?} is a line without its file: give FILE:{s} (e.g. conn.c:{s})"
        ));
    }
    let Some(i) = last_single_colon(s) else {
        return Ok(Location::Function(s.to_string()));
    };
    let (head, tail) = (&s[..i], &s[i + 1..]);
    if head.is_empty() {
        return Err(format!(
            "{s:?} names nothing before `:`: give FILE:LINE or MODULE:FUNCTION"
        ));
    }
    if tail.is_empty() {
        return Err(format!(
            "{s:?} names nothing after `:`: give FILE:LINE or MODULE:FUNCTION"
        ));
    }
    if tail.bytes().all(|c| c.is_ascii_digit()) {
        let line: u32 = tail
            .parse()
            .map_err(|_| format!("{s:?}: line {tail} is out of range"))?;
        if line == 0 {
            return Err(format!("{s:?}: lines are counted from 1"));
        }
        return Ok(Location::Line {
            file: head.to_string(),
            line,
        });
    }
    if tail.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(format!(
            "{s:?}: after `:` comes a line (digits only) or a function name"
        ));
    }
    if SOURCE_SUFFIXES.iter().any(|x| head.ends_with(x)) {
        return Err(format!(
            "{s:?}: before `:` a function takes a module (libfoo.so:{tail}), not a source \
             file; give the function alone ({tail}) or a line of that file ({head}:LINE)"
        ));
    }
    Ok(Location::Function(s.to_string()))
}

impl BreakArgs {
    /// The SetWatchpoint spec; a LOCATION that names no place is refused
    /// here, in one line.
    fn spec(&self) -> Result<WatchpointSpec, Error> {
        let location = parse_location(&self.location).map_err(Error::Local)?;
        let (function, file, line) = match location {
            Location::Function(f) => (f, String::new(), 0),
            Location::Line { file, line } => (String::new(), file, line),
        };
        Ok(WatchpointSpec {
            pid: self.pid,
            backend: backend_value(self.backend),
            action: if self.all_threads {
                HitAction::StopAll
            } else {
                HitAction::Stop
            } as i32,
            allow_init: self.allow_init,
            ignore_count: self.ignore,
            hit_count: self.hit_count.unwrap_or(0),
            keep_recent: self.keep.unwrap_or(0),
            code_event: Some(CodeEvent {
                function,
                file,
                line,
                stop: true,
                pending: self.pending,
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

/// Runs `wpctl break`.
pub async fn run(ctx: &Ctx, args: &BreakArgs) -> Result<(), Error> {
    let spec = args.spec()?;
    // With --wait the stream is open before the breakpoint is set: a
    // thread that reaches it at once is not missed.
    let stream = if args.wait {
        Some(open_stream(ctx, args.pid).await?)
    } else {
        None
    };
    let resp = ctx
        .unary(
            SetWatchpointRequest { spec: Some(spec) },
            |mut c, r| async move { c.set_watchpoint(r).await },
        )
        .await?;
    let wp = resp.watchpoint.unwrap_or_default();
    let set_json = breakpoint_json(&wp);
    let Some(mut stream) = stream else {
        if ctx.json {
            return output::emit_json(&json!({ "breakpoint": set_json }));
        }
        for w in &resp.warnings {
            output::warn(&format!("wpctl: warning: {}", escape(w)));
        }
        return output::emit(&set_text(&wp));
    };
    if !ctx.json {
        for w in &resp.warnings {
            output::warn(&format!("wpctl: warning: {}", escape(w)));
        }
        output::emit(&set_text(&wp))?;
    }
    let hit = wait_for_stop(ctx, &mut stream, args.pid, wp.id).await?;
    if ctx.json {
        return output::emit_json(&json!({
            "breakpoint": set_json,
            "stopped": hit_json(&hit),
        }));
    }
    output::emit(&stopped_text(&hit, args.all_threads))
}

async fn open_stream(
    ctx: &Ctx,
    pid: i32,
) -> Result<tonic::Streaming<wpd_proto::v1::StreamEventsResponse>, Error> {
    let request = StreamEventsRequest {
        pid,
        ..Default::default()
    };
    super::events::stream(ctx, request).await
}

/// Reads events until breakpoint `id` holds a thread; fails when the
/// process exits, the breakpoint is removed, or the stream ends first.
async fn wait_for_stop(
    ctx: &Ctx,
    stream: &mut tonic::Streaming<wpd_proto::v1::StreamEventsResponse>,
    pid: i32,
    id: u64,
) -> Result<BreakpointHit, Error> {
    let endpoint = &ctx.endpoint.text;
    loop {
        let Some(ev) = stream
            .message()
            .await
            .map_err(|status| Error::from_status(endpoint, status))?
        else {
            return Err(Error::Unreachable {
                endpoint: endpoint.clone(),
                detail: format!(
                    "the daemon ended the event stream before a thread reached breakpoint {id}"
                ),
            });
        };
        match ev.event {
            Some(Event::BreakpointHit(h)) if h.watchpoint_id == id => return Ok(h),
            // Removed because its process exited: said as such (the
            // ProcessExited event follows the removals it causes).
            Some(Event::WatchpointRemoved(r))
                if r.watchpoint_id == id && r.reason == "process exited" =>
            {
                return Err(Error::Gone(format!(
                    "process {pid} exited before a thread reached breakpoint {id}"
                )));
            }
            Some(Event::WatchpointRemoved(r)) if r.watchpoint_id == id => {
                return Err(Error::Gone(format!(
                    "breakpoint {id} was removed before a thread reached it ({})",
                    escape(&r.reason)
                )));
            }
            Some(Event::ProcessExited(e)) if e.pid == pid => {
                return Err(Error::Gone(format!(
                    "process {pid} exited before a thread reached breakpoint {id}"
                )));
            }
            Some(Event::ProcessLost(e)) if e.pid == pid => {
                return Err(Error::Gone(format!(
                    "the daemon lost process {pid} before a thread reached breakpoint {id}: {}",
                    escape(&e.reason)
                )));
            }
            // This stream fell behind: the stop may be among what it lost,
            // and the daemon keeps a breakpoint's last stops.
            Some(Event::Dropped(_)) => {
                if let Some(h) = first_kept_stop(ctx, id).await? {
                    return Ok(h);
                }
            }
            _ => {}
        }
    }
}

/// The first stop breakpoint `id` kept, if any (GetRecentHits).
async fn first_kept_stop(ctx: &Ctx, id: u64) -> Result<Option<BreakpointHit>, Error> {
    let resp = ctx
        .unary(
            GetRecentHitsRequest {
                watchpoint_id: id,
                limit: 0,
                raw: true,
            },
            |mut c, r| async move { c.get_recent_hits(r).await },
        )
        .await?;
    Ok(resp.hits.into_iter().find_map(|e| match e.event {
        Some(Event::BreakpointHit(h)) => Some(h),
        _ => None,
    }))
}

/// `breakpoint 7: conn_new at /src/objects.c:48, 0x55d0c0a0127d
/// (ct-objects+0x127d), in pid 123: holds the thread that reaches it`.
pub fn set_text(wp: &Watchpoint) -> String {
    let spec = wp.spec.clone().unwrap_or_default();
    if wp.pending {
        let code = spec.code_event.clone().unwrap_or_default();
        return format!(
            "breakpoint {}: {} in pid {}: pending (its module is not loaded yet; set when it is)",
            wp.id,
            output::code_at(&code),
            spec.pid
        );
    }
    let p = wp.breakpoint.clone().unwrap_or_default();
    let mut notes = vec![if spec.action == HitAction::StopAll as i32 {
        "holds every thread when one reaches it".to_string()
    } else {
        "holds the thread that reaches it".to_string()
    }];
    notes.extend(output::filter_phrases(&spec));
    format!(
        "breakpoint {}: {}, {} ({}+{}), in pid {}: {}",
        wp.id,
        output::place_text(&p),
        hex(p.address),
        escape(output::file_name(&p.module)),
        hex(p.offset),
        spec.pid,
        notes.join(", ")
    )
}

/// `thread 124 of pid 123 stopped at conn_new at /src/objects.c:48
/// (breakpoint 7, hit 1)`, then what to do next.
fn stopped_text(h: &BreakpointHit, all_threads: bool) -> String {
    let p = h.place.clone().unwrap_or_default();
    let (held, resume) = if all_threads {
        (
            format!("every thread of pid {} is held", h.pid),
            format!("wpctl resume --pid {}", h.pid),
        )
    } else {
        (
            format!("thread {} is held", h.tid),
            format!("wpctl resume --pid {} --tid {}", h.pid, h.tid),
        )
    };
    format!(
        "thread {} of pid {} stopped at {} (breakpoint {}, hit {})\n{held}: wpctl stack --pid {} \
         --tid {} --locals shows where; {resume} lets it go on",
        h.tid,
        h.pid,
        output::place_text(&p),
        h.watchpoint_id,
        h.count,
        h.pid,
        h.tid,
    )
}

/// A code breakpoint as JSON: the watchpoint's fields that apply, and its
/// place.
fn breakpoint_json(wp: &Watchpoint) -> Value {
    let spec = wp.spec.clone().unwrap_or_default();
    let code = spec.code_event.clone().unwrap_or_default();
    json!({
        "id": wp.id,
        "pid": spec.pid,
        "function": code.function,
        "file": code.file,
        "line": code.line,
        "action": output::action_name(spec.action),
        "ignore_count": spec.ignore_count,
        "hit_count": spec.hit_count,
        "backend": output::backend_name(wp.backend),
        "hits": wp.hits,
        "place": wp.breakpoint.as_ref().map(output::place_json),
        "pending": wp.pending,
        "pending_reason": wp.pending.then(|| wp.pending_reason.clone()),
    })
}

/// A stop as JSON.
fn hit_json(h: &BreakpointHit) -> Value {
    json!({
        "watchpoint_id": h.watchpoint_id,
        "pid": h.pid,
        "tid": h.tid,
        "count": h.count,
        "place": h.place.as_ref().map(output::place_json),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, parse};
    use wpd_proto::v1::BreakpointPlace;

    fn func(s: &str) -> Location {
        Location::Function(s.into())
    }

    fn line(file: &str, line: u32) -> Location {
        Location::Line {
            file: file.into(),
            line,
        }
    }

    #[test]
    fn locations() {
        assert_eq!(parse_location("conn_new"), Ok(func("conn_new")));
        assert_eq!(parse_location("objects.c:52"), Ok(line("objects.c", 52)));
        assert_eq!(
            parse_location("tests/c/objects.c:7"),
            Ok(line("tests/c/objects.c", 7))
        );
        assert_eq!(
            parse_location("/src/a:b/x.c:9"),
            Ok(line("/src/a:b/x.c", 9)),
            "the last colon splits"
        );
        assert_eq!(
            parse_location("libctlib.so:lib_bump"),
            Ok(func("libctlib.so:lib_bump"))
        );
        assert_eq!(
            parse_location("ns::conn::open"),
            Ok(func("ns::conn::open")),
            "a C++ name is one function"
        );
        assert_eq!(
            parse_location("libfoo.so:ns::open"),
            Ok(func("libfoo.so:ns::open"))
        );
        for (bad, says) in [
            ("", "empty"),
            ("42", "FILE:42"),
            ("objects.c:0", "from 1"),
            ("objects.c:", "after `:`"),
            (":12", "before `:`"),
            ("objects.c:99999999999", "out of range"),
            ("objects.c:conn_new", "not a source file"),
            ("objects.c:4x", "digits only"),
            ("*0x401000", "wpctl watch --access exec"),
            ("conn new", "space"),
        ] {
            let err = parse_location(bad).expect_err(bad);
            assert!(err.contains(says), "{bad:?}: {err}");
            assert!(!err.contains('\n'), "{bad:?}: one line: {err}");
        }
    }

    fn break_args(args: &[&str]) -> Result<BreakArgs, clap::Error> {
        let mut all = vec!["break", "--pid", "9"];
        all.extend_from_slice(args);
        match parse(&all)?.command {
            Command::Break(b) => Ok(*b),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn specs() {
        let b = break_args(&["conn_new"]).unwrap();
        let s = b.spec().unwrap();
        let c = s.code_event.clone().unwrap();
        assert_eq!((c.function.as_str(), c.stop, c.line), ("conn_new", true, 0));
        assert_eq!(s.action, HitAction::Stop as i32);
        assert_eq!((s.pid, s.ignore_count, s.hit_count), (9, 0, 0));
        assert!(!b.wait);
        let b = break_args(&[
            "objects.c:52",
            "--all-threads",
            "--ignore",
            "3",
            "--hit-count",
            "2",
            "--wait",
        ])
        .unwrap();
        let s = b.spec().unwrap();
        let c = s.code_event.clone().unwrap();
        assert_eq!(
            (c.function.as_str(), c.file.as_str(), c.line),
            ("", "objects.c", 52)
        );
        assert_eq!(s.action, HitAction::StopAll as i32);
        assert_eq!((s.ignore_count, s.hit_count), (3, 2));
        assert!(b.wait);
        assert!(break_args(&[]).is_err(), "a location is needed");
        let bad = break_args(&["objects.c:x:"]).unwrap().spec().unwrap_err();
        assert!(
            matches!(&bad, Error::Local(m) if m.contains("after `:`")),
            "{bad:?}"
        );
        assert!(break_args(&["f", "--hit-count", "0"]).is_err());
        assert!(parse(&["break", "f"]).is_err(), "--pid is needed");
    }

    fn place() -> BreakpointPlace {
        BreakpointPlace {
            function: "conn_new".into(),
            file: "/src/objects.c".into(),
            line: 48,
            address: 0x55d0c0a0127d,
            module: "/src/ct-objects".into(),
            offset: 0x127d,
        }
    }

    #[test]
    fn renders() {
        let wp = Watchpoint {
            id: 7,
            spec: Some(WatchpointSpec {
                pid: 123,
                action: HitAction::Stop as i32,
                code_event: Some(CodeEvent {
                    function: "conn_new".into(),
                    stop: true,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            breakpoint: Some(place()),
            ..Default::default()
        };
        assert_eq!(
            set_text(&wp),
            "breakpoint 7: conn_new at /src/objects.c:48, 0x55d0c0a0127d (ct-objects+0x127d), \
             in pid 123: holds the thread that reaches it"
        );
        let v = breakpoint_json(&wp);
        assert_eq!(v["place"]["line"], 48);
        assert_eq!(v["place"]["address"], "0x55d0c0a0127d");
        assert_eq!(v["action"], "stop");
        let h = BreakpointHit {
            watchpoint_id: 7,
            pid: 123,
            tid: 124,
            place: Some(place()),
            count: 1,
        };
        assert_eq!(
            stopped_text(&h, false),
            "thread 124 of pid 123 stopped at conn_new at /src/objects.c:48 (breakpoint 7, \
             hit 1)\nthread 124 is held: wpctl stack --pid 123 --tid 124 --locals shows where; \
             wpctl resume --pid 123 --tid 124 lets it go on"
        );
        assert_eq!(hit_json(&h)["tid"], 124);
        assert_eq!(output::ordinal(3), "3rd");
        assert_eq!(output::ordinal(12), "12th");
        assert_eq!(output::ordinal(22), "22nd");
    }
}
