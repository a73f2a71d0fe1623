//! The daemon's events as DAP events: hits (a `stopped` event, or a line in
//! the console when nothing stops), threads started and exited, breakpoints
//! the daemon removed, the process's end, losses.

use wpd_proto::v1 as pb;

use super::{Session, StopInfo, StopMode};
use crate::protocol::Breakpoint;
use crate::protocol::events::{BreakpointEvent, Stopped, Terminated, ThreadEvent};
use crate::spec;

impl Session {
    /// Reacts to one event of the daemon's stream.
    pub(super) async fn event(&mut self, ev: pb::StreamEventsResponse) {
        use pb::stream_events_response::Event as E;
        match ev.event {
            Some(E::Hit(h)) => self.hit(h).await,
            Some(E::BreakpointHit(b)) => self.code_hit(b).await,
            Some(E::WatchpointResolved(r)) => self.code_resolved(r),
            Some(E::ThreadStarted(t)) => self.send_event(&ThreadEvent {
                reason: "started",
                thread_id: i64::from(t.tid),
            }),
            Some(E::ThreadExited(t)) => {
                self.stops.remove(&t.tid);
                self.send_event(&ThreadEvent {
                    reason: "exited",
                    thread_id: i64::from(t.tid),
                })
            }
            Some(E::WatchpointRemoved(w)) => {
                if let Some(pos) = self.code.iter().position(|c| c.wp_id == w.watchpoint_id) {
                    // A code breakpoint the daemon removed (an exec).
                    let c = self.code.remove(pos);
                    self.send_event(&BreakpointEvent {
                        reason: "changed",
                        breakpoint: Breakpoint {
                            id: Some(c.dap_id),
                            verified: false,
                            reason: Some("failed"),
                            message: Some(format!("removed by the daemon: {}", w.reason)),
                            ..Default::default()
                        },
                    });
                }
                if let Some(pos) = self.armed.iter().position(|a| a.wp_id == w.watchpoint_id) {
                    let a = self.armed.remove(pos);
                    self.send_event(&BreakpointEvent {
                        reason: "changed",
                        breakpoint: Breakpoint {
                            id: Some(a.dap_id),
                            verified: false,
                            reason: Some("failed"),
                            message: Some(format!("removed by the daemon: {}", w.reason)),
                            ..Default::default()
                        },
                    });
                }
            }
            Some(E::ProcessExited(_)) if self.launched.is_some() => {
                // `exited` (with its code) and `terminated` come from its
                // parent thread, after its last output.
                self.armed.clear();
                self.code.clear();
                self.pid = None;
            }
            Some(E::ProcessExited(_)) | Some(E::ProcessLost(_)) => {
                self.armed.clear();
                self.code.clear();
                self.output("console", "the process exited or can no longer be watched");
                self.send_event(&Terminated {});
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

    async fn hit(&mut self, mut h: pb::Hit) {
        let Some(pos) = self.armed.iter().position(|a| a.wp_id == h.watchpoint_id) else {
            return;
        };
        // A pointer: the symbol it points into, from the daemon (a
        // stream's hits do not carry it).
        if h.value_kind == pb::ValueKind::Pointer as i32
            && h.value_name.is_empty()
            && let Ok(bytes) = <[u8; 8]>::try_from(&h.value[..])
            && u64::from_le_bytes(bytes) != 0
        {
            let request = self.daemon.request(pb::ResolveSymbolRequest {
                pid: h.pid,
                address: u64::from_le_bytes(bytes),
                ..Default::default()
            });
            if let Ok(r) = self.client().resolve_symbol(request).await
                && let r = r.into_inner()
                && let Some(s) = r.symbol
            {
                h.value_name = match r.offset {
                    0 => s.name,
                    off => format!("{}+{off}", s.name),
                };
            }
        }
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
        let shown =
            |b: &[u8], name: &str| spec::show_typed(a.value_type.as_ref(), &a.type_name, b, name);
        let change = match (&old, h.value_error.is_empty()) {
            (_, false) => format!("value unreadable: {}", h.value_error),
            (Some(o), true) => format!("{} → {}", shown(o, ""), shown(&new, &h.value_name)),
            (None, true) => format!("now {}", shown(&new, &h.value_name)),
        };
        let description = format!("data breakpoint {} ({}): {change}", a.dap_id, a.expr);
        let info = StopInfo {
            data: true,
            dap_id: a.dap_id,
            expr: a.expr.clone(),
            type_name: a.type_name.clone(),
            value_type: a.value_type.clone(),
            old,
            new,
            new_name: h.value_name.clone(),
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
        self.refresh_pending().await;
        let first = !self.stopped;
        self.stopped = true;
        self.stops.insert(h.tid, info);
        self.send_event(&Stopped {
            reason: "data breakpoint",
            description: Some(description),
            text: Some(format!("thread {} at {location}", h.tid)),
            thread_id: i64::from(h.tid),
            all_threads_stopped: self.mode == StopMode::All,
            preserve_focus_hint: Some(!first),
            hit_breakpoint_ids: Some(vec![dap_id]),
        });
    }

    /// True when `tid` is held stopped at a hit now.
    pub(super) async fn held(&self, pid: i32, tid: i32) -> bool {
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
