//! Code breakpoints: `setFunctionBreakpoints` and `setBreakpoints` (a
//! source file's lines), each the whole set of its kind (of its file), set
//! in the daemon as code breakpoints (`CodeEvent.stop`: a uprobe that holds
//! the thread reaching it) under the session's lease; their stops
//! (`BreakpointHit`) become `stopped` events, released by `continue` like a
//! data breakpoint's.

use wpd_proto::v1 as pb;

use super::{CodeArmed, CodeAt, Handler, Session, StopInfo, StopMode};
use crate::error::{DapError, status_text};
use crate::protocol::events::Stopped;
use crate::protocol::requests::*;
use crate::protocol::{Breakpoint, Source};
use crate::spec;

/// One entry asked for: where, its hit count, and why it cannot be set as
/// asked.
struct Asked {
    at: CodeAt,
    hits: spec::HitCount,
    refused: Option<String>,
}

impl Asked {
    fn new(
        at: CodeAt,
        condition: &Option<String>,
        hit: &Option<String>,
        log: &Option<String>,
    ) -> Asked {
        let set = |o: &Option<String>| o.as_deref().is_some_and(|s| !s.trim().is_empty());
        let mut refused = None;
        let hits = match hit.as_deref().map(str::trim) {
            None | Some("") => spec::HitCount::default(),
            Some(h) => spec::hit_condition(h).unwrap_or_else(|e| {
                refused = Some(e.to_string());
                spec::HitCount::default()
            }),
        };
        if set(condition) {
            refused = Some(
                "a condition is not supported on code breakpoints (a hit condition is; data \
                 breakpoints take both)"
                    .into(),
            );
        } else if set(log) {
            refused = Some("code breakpoints stop the thread: log points are not supported".into());
        }
        Asked { at, hits, refused }
    }
}

fn failed(message: String) -> Breakpoint {
    Breakpoint {
        verified: false,
        reason: Some("failed"),
        message: Some(message),
        ..Default::default()
    }
}

impl Handler<SetFunctionBreakpoints> for Session {
    async fn handle(
        &mut self,
        a: SetFunctionBreakpointsArguments,
    ) -> Result<BreakpointsBody, DapError> {
        let asked = a
            .breakpoints
            .iter()
            .map(|b| {
                Asked::new(
                    CodeAt::Function(b.name.trim().to_string()),
                    &b.condition,
                    &b.hit_condition,
                    &None,
                )
            })
            .collect();
        self.replace_code(|at| matches!(at, CodeAt::Function(_)), asked)
            .await
    }
}

impl Handler<SetBreakpoints> for Session {
    async fn handle(&mut self, a: SetBreakpointsArguments) -> Result<BreakpointsBody, DapError> {
        let Some(path) = a
            .source
            .path
            .clone()
            .or(a.source.name.clone())
            .filter(|p| !p.trim().is_empty())
        else {
            return Err(DapError::BadArguments(
                "setBreakpoints needs source.path (or source.name)".into(),
            ));
        };
        let asked = a
            .breakpoints
            .iter()
            .map(|b| {
                Asked::new(
                    CodeAt::Line(path.clone(), b.line),
                    &b.condition,
                    &b.hit_condition,
                    &b.log_message,
                )
            })
            .collect();
        self.replace_code(|at| matches!(at, CodeAt::Line(p, _) if *p == path), asked)
            .await
    }
}

impl Session {
    /// Replaces the code breakpoints `mine` selects by `asked`: unchanged
    /// ones keep their probe and id, the others are removed first, then
    /// the new ones set. A refused entry changes nothing else.
    async fn replace_code(
        &mut self,
        mine: impl Fn(&CodeAt) -> bool,
        asked: Vec<Asked>,
    ) -> Result<BreakpointsBody, DapError> {
        let pid = self.pid()?;
        let (mut old, rest): (Vec<CodeArmed>, Vec<CodeArmed>) = std::mem::take(&mut self.code)
            .into_iter()
            .partition(|c| mine(&c.at));
        self.code = rest;
        let mut kept: Vec<Option<CodeArmed>> = asked
            .iter()
            .map(|a| {
                if a.refused.is_some() {
                    return None;
                }
                let pos = old.iter().position(|o| o.at == a.at && o.hits == a.hits)?;
                Some(old.swap_remove(pos))
            })
            .collect();
        for gone in old {
            self.gone_code.insert(gone.wp_id);
            let _ = self
                .client()
                .remove_watchpoint(
                    self.daemon
                        .request(pb::RemoveWatchpointRequest { id: gone.wp_id }),
                )
                .await;
        }
        let mut out = Vec::with_capacity(asked.len());
        for (i, a) in asked.into_iter().enumerate() {
            if let Some(why) = a.refused {
                out.push(failed(why));
                continue;
            }
            // The same place twice in one list: one breakpoint.
            if let Some(same) = self.code.iter().find(|c| c.at == a.at && c.hits == a.hits) {
                out.push(shown(same));
                continue;
            }
            if self.mode == StopMode::Never {
                out.push(failed(
                    "the perf backend never stops the target: code breakpoints need the \
                     ptrace backend (\"backend\": \"ptrace\", the default)"
                        .into(),
                ));
                continue;
            }
            let armed = match kept[i].take() {
                Some(k) => Ok(k),
                None => self.set_code(pid, a.at, a.hits).await,
            };
            match armed {
                Ok(c) => {
                    out.push(shown(&c));
                    self.code.push(c);
                }
                Err(why) => out.push(failed(why)),
            }
        }
        Ok(BreakpointsBody { breakpoints: out })
    }

    /// Sets one code breakpoint in the daemon; why not, as the daemon
    /// says it.
    async fn set_code(
        &mut self,
        pid: i32,
        at: CodeAt,
        hits: spec::HitCount,
    ) -> Result<CodeArmed, String> {
        let code = match &at {
            CodeAt::Function(name) if name.is_empty() => {
                return Err("a function breakpoint needs a function name".into());
            }
            // Pending if its library is not loaded yet (a launched program
            // before its dynamic linker ran, a plugin loaded later).
            CodeAt::Function(name) => pb::CodeEvent {
                function: name.clone(),
                stop: true,
                pending: true,
                ..Default::default()
            },
            CodeAt::Line(_, 0) => return Err("lines start at 1".into()),
            // Pending too if no module loaded has the file in its line
            // tables (a library's source, loaded later).
            CodeAt::Line(file, line) => pb::CodeEvent {
                file: file.clone(),
                line: *line,
                stop: true,
                pending: true,
                ..Default::default()
            },
        };
        let spec = pb::WatchpointSpec {
            pid,
            lease: self.lease,
            code_event: Some(code),
            ignore_count: hits.ignore,
            hit_count: hits.every,
            action: if self.mode == StopMode::All {
                pb::HitAction::StopAll
            } else {
                pb::HitAction::Stop
            } as i32,
            ..Default::default()
        };
        let resp = self
            .client()
            .set_watchpoint(
                self.daemon
                    .request(pb::SetWatchpointRequest { spec: Some(spec) }),
            )
            .await
            .map_err(|s| status_text(&s))?
            .into_inner();
        let why = resp.warnings.join("; ");
        let wp = resp
            .watchpoint
            .ok_or("the daemon answered without the breakpoint")?;
        let dap_id = self.next_id;
        self.next_id += 1;
        Ok(CodeArmed {
            at,
            hits,
            dap_id,
            wp_id: wp.id,
            place: wp.breakpoint.unwrap_or_default(),
            pending: wp.pending.then_some(why),
            reason: wp.pending_reason,
        })
    }

    /// Brings the messages of the session's pending code breakpoints up to
    /// date before a stop is shown: the daemon looks for their names again
    /// at each library the program loads, and a name still found nowhere
    /// gets the closest names among the modules loaded by then (a
    /// misspelled name set before the program's libraries were loaded
    /// shows what it may have meant). A `breakpoint` event `changed` for
    /// each whose reason changed.
    pub(super) async fn refresh_pending(&mut self) {
        if !self.code.iter().any(|c| c.pending.is_some()) {
            return;
        }
        let Ok(pid) = self.pid() else { return };
        let Ok(list) = self
            .client()
            .list_watchpoints(self.daemon.request(pb::ListWatchpointsRequest { pid }))
            .await
        else {
            return;
        };
        for w in list.into_inner().watchpoints {
            if !w.pending || w.pending_reason.is_empty() {
                continue;
            }
            let Some(c) = self
                .code
                .iter_mut()
                .find(|c| c.wp_id == w.id && c.pending.is_some())
            else {
                continue;
            };
            if c.reason == w.pending_reason {
                continue;
            }
            c.pending = Some(format!(
                "pending: {}; looked for again at each library the program loads",
                w.pending_reason
            ));
            c.reason = w.pending_reason;
            let breakpoint = shown(c);
            self.send_event(&crate::protocol::events::BreakpointEvent {
                reason: "changed",
                breakpoint,
            });
        }
    }

    /// The daemon set a pending code breakpoint (its library was loaded):
    /// the client is told it is verified now, and where.
    pub(super) fn code_resolved(&mut self, r: pb::WatchpointResolved) {
        let Some(c) = self.code.iter_mut().find(|c| c.wp_id == r.watchpoint_id) else {
            return;
        };
        c.pending = None;
        c.place = r.breakpoint.unwrap_or_default();
        let breakpoint = shown(c);
        self.send_event(&crate::protocol::events::BreakpointEvent {
            reason: "changed",
            breakpoint,
        });
    }

    /// A thread reached one of the session's code breakpoints: a `stopped`
    /// event while it is held.
    pub(super) async fn code_hit(&mut self, b: pb::BreakpointHit) {
        let Some(c) = self.code.iter().find(|c| c.wp_id == b.watchpoint_id) else {
            // Removed by this session while the thread reached it: it goes
            // on.
            if self.gone_code.contains(&b.watchpoint_id) {
                let _ = self
                    .client()
                    .resume(self.daemon.request(pb::ResumeRequest {
                        pid: b.pid,
                        tids: vec![b.tid],
                    }))
                    .await;
            }
            return;
        };
        let (dap_id, reason) = match c.at {
            CodeAt::Function(_) => (c.dap_id, "function breakpoint"),
            CodeAt::Line(..) => (c.dap_id, "breakpoint"),
        };
        let place = b.place.clone().unwrap_or_default();
        let location = describe(&place);
        if self.stops.contains_key(&b.tid) || !self.held(b.pid, b.tid).await {
            return;
        }
        self.refresh_pending().await;
        let first = !self.stopped;
        self.stopped = true;
        self.stops.insert(
            b.tid,
            StopInfo {
                dap_id,
                location: location.clone(),
                addr: place.address,
                ..Default::default()
            },
        );
        self.send_event(&Stopped {
            reason,
            description: Some(format!("{reason} {dap_id} at {location}")),
            text: Some(format!("thread {} at {location}", b.tid)),
            thread_id: i64::from(b.tid),
            all_threads_stopped: self.mode == StopMode::All,
            preserve_focus_hint: Some(!first),
            hit_breakpoint_ids: Some(vec![dap_id]),
        });
    }
}

/// A code breakpoint as the client is told of it.
fn shown(c: &CodeArmed) -> Breakpoint {
    if let Some(why) = &c.pending {
        let name = match &c.at {
            CodeAt::Function(name) => name.clone(),
            CodeAt::Line(path, line) => format!("{path}:{line}"),
        };
        return Breakpoint {
            id: Some(c.dap_id),
            verified: false,
            reason: Some("pending"),
            message: Some(format!("{name}: {why}")),
            ..Default::default()
        };
    }
    let p = &c.place;
    let source = match &c.at {
        // The file the client named, at the line it resolved to.
        CodeAt::Line(path, _) => Some(source_of(path)),
        CodeAt::Function(_) if !p.file.is_empty() => Some(source_of(&p.file)),
        CodeAt::Function(_) => None,
    };
    Breakpoint {
        id: Some(c.dap_id),
        verified: true,
        message: Some(describe(p)),
        instruction_reference: Some(format!("{:#x}", p.address)),
        source,
        line: (p.line > 0).then_some(p.line),
        ..Default::default()
    }
}

fn source_of(path: &str) -> Source {
    Source {
        name: path.rsplit('/').next().unwrap_or(path).to_string(),
        path: path.to_string(),
    }
}

/// `function (file.c:42)`, or the address and module.
fn describe(p: &pb::BreakpointPlace) -> String {
    let module = p.module.rsplit('/').next().unwrap_or("");
    let name = if p.function.is_empty() {
        format!("{:#x} in {module}", p.address)
    } else {
        p.function.clone()
    };
    if p.file.is_empty() {
        name
    } else {
        let file = p.file.rsplit('/').next().unwrap_or(&p.file);
        format!("{name} ({file}:{})", p.line)
    }
}
