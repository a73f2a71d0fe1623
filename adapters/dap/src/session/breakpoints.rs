//! Data breakpoints: what can be watched (`dataBreakpointInfo`), the set
//! armed (`setDataBreakpoints`, diffed against what is armed), and
//! instruction breakpoints, each refused (function and line breakpoints
//! are `code.rs`'s).

use serde::de::IgnoredAny;
use wpd_proto::v1 as pb;

use super::{Armed, Container, Handler, Known, Session, StopMode};
use crate::error::{DapError, status_text};
use crate::protocol::requests::*;
use crate::protocol::{Breakpoint, DataBreakpoint};
use crate::spec::{self, Target};

impl Handler<DataBreakpointInfo> for Session {
    async fn handle(
        &mut self,
        a: DataBreakpointInfoArguments,
    ) -> Result<DataBreakpointInfoBody, DapError> {
        let pid = self.pid()?;
        let none = |why: String| {
            Ok(DataBreakpointInfoBody {
                data_id: None,
                description: why,
                ..Default::default()
            })
        };
        if a.mode.is_some() {
            return none("wpctl dap has no breakpoint modes".into());
        }
        let name = a.name.trim();
        let (target, known) = if a.as_address == Some(true) {
            let addr = match spec::parse_address(name) {
                Ok(a) => a,
                Err(e) => return none(e.to_string()),
            };
            let len = a.bytes.unwrap_or(1);
            (Target::Address { addr, len }, Known::address(addr, len))
        } else if let Some(Container::Locals(tid, index)) = a
            .variables_reference
            .and_then(|r| self.vars.get(&r).cloned())
        {
            // A local of a stopped frame: the object where it is now (gdb's
            // `watch -l`), by address.
            match self.local_in_memory(pid, tid, index, name).await? {
                Ok(mut k) => {
                    if let Some(b) = a.bytes {
                        k.len = b;
                    }
                    (
                        Target::Address {
                            addr: k.addr,
                            len: k.len,
                        },
                        k,
                    )
                }
                Err(why) => return none(why),
            }
        } else {
            // A child of one of our containers names its evaluateName; an
            // expression is a global's name, `&` allowed.
            let expr = match a
                .variables_reference
                .and_then(|r| self.vars.get(&r).cloned())
            {
                Some(Container::Watched) => name.to_string(),
                Some(Container::Children(_)) => {
                    let r = a.variables_reference.unwrap_or(0);
                    match self.named.get(&(r, name.to_string())) {
                        Some(e) => e.clone(),
                        None => return none(format!("no variable {name:?} was listed there")),
                    }
                }
                Some(Container::Hit(_)) => {
                    return none(format!("{name:?} is a property of the stop, not memory"));
                }
                Some(Container::Locals(..)) => unreachable!("handled above"),
                Some(
                    Container::Registers(_) | Container::GeneralRegisters(_) | Container::Flags(_),
                ) => {
                    return none(format!(
                        "{name:?} is a register: a data breakpoint watches memory (watch the \
                         address it holds instead)"
                    ));
                }
                None if a.variables_reference.is_some_and(|r| r != 0) => {
                    return none("that variable is from an earlier stop".into());
                }
                None => name.strip_prefix('&').unwrap_or(name).trim().to_string(),
            };
            if let Ok(addr) = spec::parse_address(&expr) {
                let len = a.bytes.unwrap_or(1);
                (Target::Address { addr, len }, Known::address(addr, len))
            } else {
                // With a frame of a held thread, the expression may start
                // from one of its parameters or locals.
                let frame = a.frame_id.and_then(|id| {
                    Some((
                        *self.frames.get(&id)?,
                        self.frame_index.get(&id).copied().unwrap_or(0),
                    ))
                });
                let ask = |(tid, frame): (i32, u32)| {
                    self.daemon.request(pb::ResolveSymbolRequest {
                        pid,
                        name: expr.clone(),
                        address: 0,
                        tid,
                        frame,
                    })
                };
                let r = match self
                    .client()
                    .resolve_symbol(ask(frame.unwrap_or((0, 0))))
                    .await
                {
                    // The frame's thread is no longer held: globals still resolve.
                    Err(s) if frame.is_some() && s.code() == tonic::Code::FailedPrecondition => {
                        self.client().resolve_symbol(ask((0, 0))).await
                    }
                    r => r,
                };
                let r = match r {
                    Ok(r) => r.into_inner(),
                    Err(s) => return none(status_text(&s)),
                };
                let Some(sym) = r.symbol else {
                    return none(format!("{expr:?} resolved to nothing"));
                };
                if r.kind != "variable" {
                    return none(format!(
                        "{} is a {}, not a variable: data breakpoints watch memory",
                        sym.expression, r.kind
                    ));
                }
                let size = a.bytes.map(u64::from).unwrap_or(sym.size);
                let len = u32::try_from(size).unwrap_or(u32::MAX);
                let target = match a.bytes {
                    // A given size watches from the variable's address; so
                    // does a name that starts from a frame's local (the
                    // object where it is now, gdb's `watch -l`).
                    Some(_) => Target::Address {
                        addr: sym.address,
                        len,
                    },
                    None if r.from_frame => Target::Address {
                        addr: sym.address,
                        len,
                    },
                    None => Target::Name(sym.expression.clone()),
                };
                let shown = match frame {
                    Some((tid, index)) if r.from_frame => {
                        format!("{} (frame {index} of thread {tid})", sym.expression)
                    }
                    _ => sym.expression.clone(),
                };
                (
                    target,
                    Known {
                        expr: shown,
                        addr: sym.address,
                        len,
                        type_name: sym.type_name,
                    },
                )
            }
        };
        let slots = spec::slots_needed(known.addr, u64::from(known.len));
        if known.len == 0 || slots > 4 {
            return none(format!(
                "{} is {} bytes at {:#x}: {} debug-register slots per thread, and a thread \
                 has 4 (watch a member or fewer bytes)",
                known.expr, known.len, known.addr, slots
            ));
        }
        let ty = if known.type_name.is_empty() {
            String::new()
        } else {
            format!(" ({})", known.type_name)
        };
        let description = format!(
            "{}{ty}: {} bytes at {:#x}, {slots} slot{} per thread. x86-64 cannot watch reads \
             alone: write, or read and write",
            known.expr,
            known.len,
            known.addr,
            if slots == 1 { "" } else { "s" }
        );
        let body = DataBreakpointInfoBody {
            data_id: Some(target.data_id()),
            description,
            access_types: Some(vec!["write", "readWrite"]),
            can_persist: Some(matches!(target, Target::Name(_))),
        };
        self.known.insert(target, known);
        Ok(body)
    }
}

impl Handler<SetDataBreakpoints> for Session {
    async fn handle(
        &mut self,
        a: SetDataBreakpointsArguments,
    ) -> Result<BreakpointsBody, DapError> {
        let pid = self.pid()?;
        let asked = a.breakpoints;
        // Where each entry starts, to find duplicates (the last one at an
        // address wins, as in lldb-dap's tests).
        let mut starts: Vec<Option<u64>> = Vec::with_capacity(asked.len());
        for bp in &asked {
            let start = match Target::parse(&bp.data_id) {
                Ok(t) => self.known_of(pid, &t).await.map(|k| k.addr),
                Err(_) => None,
            };
            starts.push(start);
        }
        let winner = |i: usize| match starts[i] {
            Some(a) => (i + 1..asked.len()).find(|&j| starts[j] == Some(a)),
            None => None,
        };
        // Keep what is unchanged (it keeps its slots and id); remove the
        // rest first, so that its slots are free for the new ones.
        let mut keep: Vec<Option<Armed>> = (0..asked.len()).map(|_| None).collect();
        let mut old = std::mem::take(&mut self.armed);
        for (i, bp) in asked.iter().enumerate() {
            if winner(i).is_none()
                && let Some(pos) = old.iter().position(|a| &a.asked == bp)
            {
                keep[i] = Some(old.swap_remove(pos));
            }
        }
        for gone in old {
            let _ = self
                .client()
                .remove_watchpoint(
                    self.daemon
                        .request(pb::RemoveWatchpointRequest { id: gone.wp_id }),
                )
                .await;
        }
        let mut out = Vec::with_capacity(asked.len());
        for (i, bp) in asked.iter().enumerate() {
            if let Some(j) = winner(i) {
                out.push(Breakpoint {
                    verified: false,
                    reason: Some("failed"),
                    message: Some(format!(
                        "breakpoint {} of this list watches the same address and replaces this one",
                        j + 1
                    )),
                    ..Default::default()
                });
                continue;
            }
            let armed = match keep[i].take() {
                Some(a) => Ok(a),
                None => self.arm(pid, bp).await,
            };
            match armed {
                Ok(a) => {
                    out.push(Breakpoint {
                        id: Some(a.dap_id),
                        verified: true,
                        instruction_reference: Some(format!("{:#x}", a.addr)),
                        ..Default::default()
                    });
                    self.armed.push(a);
                }
                Err(e) => out.push(Breakpoint {
                    verified: false,
                    reason: Some("failed"),
                    message: Some(e.to_string()),
                    ..Default::default()
                }),
            }
        }
        Ok(BreakpointsBody { breakpoints: out })
    }
}

/// `n` breakpoints of a kind the adapter does not set, each refused with
/// `why`.
fn refused(n: usize, why: &str) -> BreakpointsBody {
    let bp = Breakpoint {
        verified: false,
        reason: Some("failed"),
        message: Some(why.to_string()),
        ..Default::default()
    };
    BreakpointsBody {
        breakpoints: vec![bp; n],
    }
}

impl Handler<SetInstructionBreakpoints> for Session {
    async fn handle(&mut self, a: BreakpointList) -> Result<BreakpointsBody, DapError> {
        Ok(refused(
            a.breakpoints.len(),
            "wpd sets data, function and line breakpoints, not instruction breakpoints",
        ))
    }
}

impl Handler<SetExceptionBreakpoints> for Session {
    async fn handle(&mut self, _: IgnoredAny) -> Result<BreakpointsBody, DapError> {
        Ok(BreakpointsBody {
            breakpoints: Vec::new(),
        })
    }
}

impl Session {
    /// What a target is now (from `dataBreakpointInfo`, else resolved).
    async fn known_of(&mut self, pid: i32, t: &Target) -> Option<Known> {
        if let Some(k) = self.known.get(t) {
            return Some(k.clone());
        }
        let k = match t {
            Target::Address { addr, len } => Known::address(*addr, *len),
            Target::Name(n) => {
                let r = self
                    .client()
                    .resolve_symbol(self.daemon.request(pb::ResolveSymbolRequest {
                        pid,
                        name: n.clone(),
                        address: 0,
                        ..Default::default()
                    }))
                    .await
                    .ok()?
                    .into_inner();
                let s = r.symbol?;
                Known {
                    expr: s.expression,
                    addr: s.address,
                    len: u32::try_from(s.size).ok()?,
                    type_name: s.type_name,
                }
            }
        };
        self.known.insert(t.clone(), k.clone());
        Some(k)
    }

    /// Arms one breakpoint in the daemon.
    async fn arm(&mut self, pid: i32, bp: &DataBreakpoint) -> Result<Armed, DapError> {
        let target = Target::parse(&bp.data_id)?;
        let access = match bp.access_type.as_deref() {
            None | Some("write") => pb::Access::Write,
            Some("readWrite") => pb::Access::ReadWrite,
            Some("read") => {
                return Err(DapError::AccessType(
                    "x86-64 debug registers cannot watch reads alone: use readWrite (reads \
                     and writes) or write"
                        .into(),
                ));
            }
            Some(o) => {
                return Err(DapError::AccessType(format!(
                    "access type {o:?}: use write or readWrite"
                )));
            }
        };
        let known = self
            .known_of(pid, &target)
            .await
            .ok_or_else(|| DapError::Unresolved {
                data_id: bp.data_id.clone(),
                pid,
            })?;
        let condition = match bp.condition.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(c) => Some(spec::condition(
                c,
                match &target {
                    Target::Name(n) => Some(n.as_str()),
                    Target::Address { .. } => None,
                },
                u64::from(known.len),
                // By name the daemon reads the variable's type; by address
                // it has none.
                matches!(target, Target::Name(_)),
            )?),
        };
        let hits = match bp.hit_condition.as_deref().map(str::trim) {
            None | Some("") => spec::HitCount::default(),
            Some(h) => spec::hit_condition(h)?,
        };
        let (address, length, symbol) = match &target {
            Target::Address { addr, len } => (*addr, *len, String::new()),
            Target::Name(n) => (0, 0, n.clone()),
        };
        let action = match self.mode {
            StopMode::All => pb::HitAction::StopAll,
            StopMode::Thread => pb::HitAction::Stop,
            StopMode::Never => pb::HitAction::Log,
        };
        let spec = pb::WatchpointSpec {
            pid,
            address,
            length,
            symbol,
            access: access as i32,
            action: action as i32,
            condition,
            ignore_count: hits.ignore,
            hit_count: hits.every,
            lease: self.lease,
            ..Default::default()
        };
        let resp = match self
            .client()
            .set_watchpoint(
                self.daemon
                    .request(pb::SetWatchpointRequest { spec: Some(spec) }),
            )
            .await
        {
            Ok(r) => r.into_inner(),
            Err(st) => return Err(DapError::Daemon(self.explain(&st))),
        };
        let wp = resp
            .watchpoint
            .ok_or(DapError::IncompleteAnswer("a watchpoint"))?;
        let (addr, len) = wp
            .pieces
            .first()
            .zip(wp.pieces.last())
            .map(|(f, l)| {
                (
                    f.address,
                    (l.address + u64::from(l.length) - f.address) as u32,
                )
            })
            .unwrap_or((known.addr, known.len));
        let last = self.read(pid, addr, len).await.ok();
        let dap_id = self.next_id;
        self.next_id += 1;
        for w in &resp.warnings {
            self.output("console", &format!("data breakpoint {dap_id}: {w}"));
        }
        Ok(Armed {
            asked: bp.clone(),
            dap_id,
            wp_id: wp.id,
            expr: known.expr,
            addr,
            len,
            type_name: known.type_name,
            value_type: wp.value_type,
            last,
        })
    }

    /// A refusal to arm, with the daemon's watchpoint ids it names
    /// translated to this session's breakpoints.
    fn explain(&self, st: &tonic::Status) -> String {
        use tonic_types::StatusExt as _;
        let mut text = status_text(st);
        let out_of_slots = st
            .get_error_details()
            .error_info()
            .is_some_and(|i| i.reason == wpd_proto::reason::OUT_OF_SLOTS);
        if out_of_slots && !self.armed.is_empty() {
            let ours: Vec<String> = self
                .armed
                .iter()
                .map(|a| {
                    format!(
                        "watchpoint #{} is data breakpoint {} ({})",
                        a.wp_id, a.dap_id, a.expr
                    )
                })
                .collect();
            text.push_str(&format!(". In this session: {}", ours.join("; ")));
        }
        text
    }
}

impl Session {
    /// Variable `name` of frame `index` of held thread `tid`, where it is in
    /// memory; why not, when it is not (a register, optimized out).
    async fn local_in_memory(
        &mut self,
        pid: i32,
        tid: i32,
        index: u32,
        name: &str,
    ) -> Result<Result<Known, String>, DapError> {
        if !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
            // An expression that starts from the frame's variables
            // (`c->state`): the object it names there now.
            let r = self
                .client()
                .resolve_symbol(self.daemon.request(pb::ResolveSymbolRequest {
                    pid,
                    name: name.to_string(),
                    address: 0,
                    tid,
                    frame: index,
                }))
                .await;
            let r = match r {
                Ok(r) => r.into_inner(),
                Err(s) => return Ok(Err(status_text(&s))),
            };
            let Some(sym) = r.symbol.filter(|_| r.kind == "variable") else {
                return Ok(Err(format!(
                    "{name} is a {}, not a variable: data breakpoints watch memory",
                    if r.kind.is_empty() { "value" } else { &r.kind }
                )));
            };
            return Ok(Ok(Known {
                expr: format!("{} (frame {index} of thread {tid})", sym.expression),
                addr: sym.address,
                len: u32::try_from(sym.size).unwrap_or(u32::MAX),
                type_name: sym.type_name,
            }));
        }
        let frame = self.frame_locals(pid, tid, index).await?;
        let Some(v) = frame
            .as_ref()
            .and_then(|f| f.variables.iter().find(|v| v.name == name))
        else {
            return Ok(Err(format!("frame {index} has no variable {name:?} now")));
        };
        if v.address == 0 {
            return Ok(Err(format!(
                "{name} is not in memory here ({}): a data breakpoint watches memory",
                if v.error.is_empty() {
                    "in a register"
                } else {
                    &v.error
                }
            )));
        }
        Ok(Ok(Known {
            expr: format!("{name} (frame {index} of thread {tid})"),
            addr: v.address,
            len: u32::try_from(v.value.len()).unwrap_or(u32::MAX),
            type_name: v.r#type.clone(),
        }))
    }
}
