//! Looking at the target: `threads`, `stackTrace`, `scopes`, `variables`,
//! `evaluate`, `readMemory`.

use base64::Engine as _;
use serde::de::IgnoredAny;
use wpd_proto::v1 as pb;

use super::{Container, Handler, Session};
use crate::error::DapError;
use crate::protocol::requests::*;
use crate::protocol::{Scope, Source, StackFrame, Thread, Variable};
use crate::spec::{self, Target};

/// Children a variables view lists.
const CHILDREN: u32 = 256;

/// Frames a `stackTrace` without `levels` gets.
const DEFAULT_DEPTH: u32 = 64;

impl Handler<Threads> for Session {
    async fn handle(&mut self, _: IgnoredAny) -> Result<ThreadsBody, DapError> {
        let Some(pid) = self.pid else {
            return Ok(ThreadsBody {
                threads: Vec::new(),
            });
        };
        let r = self
            .client()
            .list_threads(self.daemon.request(pb::ListThreadsRequest {
                pid,
                ..Default::default()
            }))
            .await?
            .into_inner();
        let threads = r
            .threads
            .iter()
            .map(|t| Thread {
                id: i64::from(t.tid),
                name: if t.name.is_empty() {
                    format!("thread {}", t.tid)
                } else {
                    format!("{} [{}]", t.name, t.tid)
                },
            })
            .collect();
        Ok(ThreadsBody { threads })
    }
}

impl Handler<StackTrace> for Session {
    async fn handle(&mut self, a: StackTraceArguments) -> Result<StackTraceBody, DapError> {
        let pid = self.pid()?;
        let tid = i32::try_from(a.thread_id).map_err(|_| DapError::NoSuchThread)?;
        let start = a.start_frame.unwrap_or(0);
        let levels = a.levels.filter(|&l| l > 0).unwrap_or(DEFAULT_DEPTH);
        let depth = (start + levels).min(128);
        let r = self
            .client()
            .get_thread_stack(self.daemon.request(pb::GetThreadStackRequest {
                pid,
                tid,
                depth,
                raw: false,
                locals: false,
            }))
            .await?
            .into_inner();
        let total = r.frames.len();
        let mut frames = Vec::new();
        for (i, loc) in r.frames.iter().enumerate().skip(start as usize) {
            let id = self.next_frame;
            self.next_frame += 1;
            self.frames.insert(id, tid);
            self.frame_index.insert(id, i as u32);
            if i == 0 {
                self.frames.insert(-id, tid); // frame 0 of tid: has the hit scope
            }
            frames.push(stack_frame(id, loc));
        }
        if !r.note.is_empty() && total < depth as usize {
            self.output("console", &format!("thread {tid}: {}", r.note));
        }
        Ok(StackTraceBody {
            stack_frames: frames,
            total_frames: total,
        })
    }
}

impl Handler<Scopes> for Session {
    async fn handle(&mut self, a: ScopesArguments) -> Result<ScopesBody, DapError> {
        let frame_id = a.frame_id;
        let Some(&tid) = self.frames.get(&frame_id) else {
            return Err(DapError::StaleFrame);
        };
        let mut scopes = Vec::new();
        // The frame's parameters and local variables (DWARF), first: what an
        // IDE opens by default.
        let index = self.frame_index.get(&frame_id).copied().unwrap_or(0);
        let r = self.container(Container::Locals(tid, index));
        scopes.push(Scope {
            name: "Locals".into(),
            variables_reference: r,
            expensive: false,
            presentation_hint: Some("locals"),
        });
        if self.frames.contains_key(&-frame_id) && self.stops.get(&tid).is_some_and(|s| s.data) {
            let r = self.container(Container::Hit(tid));
            scopes.push(Scope {
                name: "Data breakpoint hit".into(),
                variables_reference: r,
                expensive: false,
                presentation_hint: None,
            });
        }
        let r = self.container(Container::Watched);
        scopes.push(Scope {
            name: "Watched".into(),
            variables_reference: r,
            expensive: false,
            presentation_hint: None,
        });
        // The executable's globals and statics, with their members and
        // elements (as lldb-dap shows them).
        let r = self.container(Container::Children(String::new()));
        scopes.push(Scope {
            name: "Globals".into(),
            variables_reference: r,
            expensive: false,
            presentation_hint: None,
        });
        // The thread's registers where it is held: its innermost frame's.
        if self.frames.contains_key(&-frame_id) {
            let r = self.container(Container::Registers(tid));
            scopes.push(Scope {
                name: "Registers".into(),
                variables_reference: r,
                expensive: false,
                presentation_hint: Some("registers"),
            });
        }
        Ok(ScopesBody { scopes })
    }
}

impl Handler<Variables> for Session {
    async fn handle(&mut self, a: VariablesArguments) -> Result<VariablesBody, DapError> {
        let pid = self.pid()?;
        let Some(c) = self.vars.get(&a.variables_reference).cloned() else {
            return Err(DapError::StaleVariables);
        };
        let mut out = Vec::new();
        match c {
            Container::Watched => {
                for i in 0..self.armed.len() {
                    let (addr, len, expr, ty, vt) = {
                        let a = &self.armed[i];
                        (
                            a.addr,
                            a.len,
                            a.expr.clone(),
                            a.type_name.clone(),
                            a.value_type.clone(),
                        )
                    };
                    let value = match self.read(pid, addr, len).await {
                        Ok(b) => spec::show_typed(vt.as_ref(), &ty, &b, ""),
                        Err(e) => format!("<{e}>"),
                    };
                    let named = matches!(
                        Target::parse(&self.armed[i].asked.data_id),
                        Ok(Target::Name(_))
                    );
                    out.push(Variable {
                        name: expr.clone(),
                        value,
                        type_name: (!ty.is_empty()).then_some(ty),
                        variables_reference: 0,
                        evaluate_name: named.then_some(expr),
                        memory_reference: Some(format!("{addr:#x}")),
                    });
                }
            }
            Container::Locals(tid, index) => {
                let Some(frame) = self.frame_locals(pid, tid, index).await? else {
                    return Ok(VariablesBody { variables: out });
                };
                if !frame.note.is_empty() {
                    self.output("console", &format!("frame {index}: {}", frame.note));
                }
                for v in &frame.variables {
                    // A pointer to a record, or a record in memory: its
                    // members, as the daemon lists what the object at that
                    // address has under it.
                    let children = match object_of(v) {
                        Some(expr) => self.container(Container::Children(expr)),
                        None => 0,
                    };
                    out.push(Variable {
                        name: v.name.clone(),
                        value: if !v.error.is_empty() {
                            format!("<{}>", v.error)
                        } else if children > 0 && !v.r#type.trim_end().ends_with('*') {
                            "{…}".into()
                        } else {
                            spec::show_value(&v.r#type, &v.value)
                        },
                        type_name: (!v.r#type.is_empty()).then(|| v.r#type.clone()),
                        variables_reference: children,
                        // A variable in memory can be watched by its address.
                        evaluate_name: None,
                        memory_reference: (v.address != 0).then(|| format!("{:#x}", v.address)),
                    });
                }
            }
            Container::Children(expr) => {
                let r = self
                    .client()
                    .list_variables(self.daemon.request(pb::ListVariablesRequest {
                        pid,
                        expression: expr,
                        start: 0,
                        count: CHILDREN,
                    }))
                    .await?
                    .into_inner();
                for v in r.variables {
                    let children = if v.children > 0 {
                        self.container(Container::Children(v.expression.clone()))
                    } else {
                        0
                    };
                    self.named.insert(
                        (a.variables_reference, v.name.clone()),
                        v.expression.clone(),
                    );
                    let pointer = v.type_name.trim_end().ends_with('*');
                    out.push(Variable {
                        value: if !v.error.is_empty() {
                            format!("<{}>", v.error)
                        } else if children > 0 && !pointer {
                            // A record or an array: its children say it.
                            "{…}".into()
                        } else {
                            spec::show_value(&v.type_name, &v.value)
                        },
                        name: v.name,
                        type_name: (!v.type_name.is_empty()).then_some(v.type_name),
                        variables_reference: children,
                        evaluate_name: Some(v.expression),
                        memory_reference: (v.address != 0).then(|| format!("{:#x}", v.address)),
                    });
                }
                if r.total > u64::from(CHILDREN) {
                    self.output(
                        "console",
                        &format!("{} of {} children shown", CHILDREN, r.total),
                    );
                }
            }
            Container::Registers(tid) => {
                // Groups, as lldb-dap shows them: the general-purpose
                // registers are the ones the daemon reads.
                let r = self.container(Container::GeneralRegisters(tid));
                out.push(Variable {
                    name: "General Purpose Registers".into(),
                    value: String::new(),
                    type_name: None,
                    variables_reference: r,
                    evaluate_name: None,
                    memory_reference: None,
                });
            }
            Container::GeneralRegisters(tid) => {
                let r = self
                    .client()
                    .get_thread_stack(self.daemon.request(pb::GetThreadStackRequest {
                        pid,
                        tid,
                        depth: 1,
                        raw: true,
                        locals: false,
                    }))
                    .await?
                    .into_inner();
                for reg in &r.registers {
                    let flags = reg.name == spec::FLAGS_REGISTER;
                    let children = if flags {
                        self.container(Container::Flags(reg.value))
                    } else {
                        0
                    };
                    out.push(Variable {
                        name: reg.name.clone(),
                        value: if flags {
                            spec::show_flags(reg.value)
                        } else {
                            format!("{:#018x}", reg.value)
                        },
                        type_name: None,
                        variables_reference: children,
                        evaluate_name: None,
                        memory_reference: (!flags).then(|| format!("{:#x}", reg.value)),
                    });
                }
            }
            Container::Flags(value) => {
                out.extend(spec::FLAGS.iter().map(|&(name, bit, _)| Variable {
                    name: name.into(),
                    value: ((value >> bit) & 1).to_string(),
                    type_name: None,
                    variables_reference: 0,
                    evaluate_name: None,
                    memory_reference: None,
                }));
            }
            Container::Hit(tid) => {
                if let Some(s) = self.stops.get(&tid) {
                    let v = |name: &str, value: String| Variable {
                        name: name.into(),
                        value,
                        type_name: None,
                        variables_reference: 0,
                        evaluate_name: None,
                        memory_reference: None,
                    };
                    out.push(v("breakpoint", format!("{} ({})", s.dap_id, s.expr)));
                    out.push(Variable {
                        memory_reference: Some(format!("{:#x}", s.addr)),
                        ..v("address", format!("{:#x}", s.addr))
                    });
                    out.push(v(
                        "old value",
                        s.old
                            .as_ref()
                            .map(|o| spec::show_typed(s.value_type.as_ref(), &s.type_name, o, ""))
                            .unwrap_or_else(|| "(not known)".into()),
                    ));
                    out.push(v(
                        "new value",
                        spec::show_typed(s.value_type.as_ref(), &s.type_name, &s.new, &s.new_name),
                    ));
                    out.push(v("accessed at", s.location.clone()));
                }
            }
        }
        Ok(VariablesBody { variables: out })
    }
}

impl Handler<Evaluate> for Session {
    async fn handle(&mut self, a: EvaluateArguments) -> Result<EvaluateBody, DapError> {
        let pid = self.pid()?;
        // The daemon reads the whole expression: `&x`, casts, `->`; with a
        // frame of a held thread, from its parameters and locals too.
        let name = a.expression.trim();
        let (tid, frame) = match a.frame_id {
            Some(id) => match self.frames.get(&id) {
                Some(&tid) => (tid, self.frame_index.get(&id).copied().unwrap_or(0)),
                None => return Err(DapError::StaleFrame),
            },
            None => (0, 0),
        };
        let ask = |tid: i32, frame: u32| {
            self.daemon.request(pb::ResolveSymbolRequest {
                pid,
                name: name.to_string(),
                address: 0,
                tid,
                frame,
            })
        };
        let r = match self.client().resolve_symbol(ask(tid, frame)).await {
            // The frame's thread is no longer held: globals still read.
            Err(s) if tid != 0 && s.code() == tonic::Code::FailedPrecondition => {
                self.client().resolve_symbol(ask(0, 0)).await?
            }
            r => r?,
        }
        .into_inner();
        let sym = r.symbol.ok_or(DapError::NothingByThatName)?;
        let reference = format!("{:#x}", sym.address);
        if r.kind == "value" {
            // `&x`, `(T)x`: computed, in no object.
            let pointer = sym.type_name.trim_end().ends_with('*');
            // A pointer's result is its address alone (the IDE reads it
            // as one); an enumerator's name goes with its value.
            let name = if pointer { "" } else { r.value_name.as_str() };
            return Ok(EvaluateBody {
                result: spec::show_typed(sym.value_type.as_ref(), &sym.type_name, &r.value, name),
                type_name: sym.type_name,
                variables_reference: 0,
                memory_reference: if pointer { reference } else { String::new() },
            });
        }
        if r.kind != "variable" {
            return Ok(EvaluateBody {
                result: reference.clone(),
                type_name: r.kind,
                variables_reference: 0,
                memory_reference: reference,
            });
        }
        let len = u32::try_from(sym.size.clamp(1, 4096)).unwrap_or(4096);
        // The daemon's reading when it read the value (up to 64 bytes); a
        // pointer's result is its address alone.
        let pointer = sym
            .value_type
            .as_ref()
            .is_some_and(|t| t.kind == pb::ValueKind::Pointer as i32);
        let name = if pointer { "" } else { r.value_name.as_str() };
        let value = if r.value.len() as u64 == sym.size {
            spec::show_typed(sym.value_type.as_ref(), &sym.type_name, &r.value, name)
        } else {
            spec::show_value(&sym.type_name, &self.read(pid, sym.address, len).await?)
        };
        Ok(EvaluateBody {
            result: value,
            type_name: sym.type_name,
            variables_reference: 0,
            memory_reference: reference,
        })
    }
}

impl Handler<ReadMemory> for Session {
    async fn handle(&mut self, a: ReadMemoryArguments) -> Result<ReadMemoryBody, DapError> {
        let pid = self.pid()?;
        let base = spec::parse_address(&a.memory_reference)?;
        let address = base
            .checked_add_signed(a.offset.unwrap_or(0))
            .ok_or(DapError::AddressOutOfRange)?;
        if a.count == 0 {
            return Ok(ReadMemoryBody {
                address: format!("{address:#x}"),
                unreadable_bytes: None,
                data: String::new(),
            });
        }
        let length = a.count.min(1 << 20) as u32;
        let r = self
            .client()
            .read_memory(self.daemon.request(pb::ReadMemoryRequest {
                pid,
                address,
                length,
            }))
            .await?
            .into_inner();
        Ok(ReadMemoryBody {
            address: format!("{address:#x}"),
            unreadable_bytes: Some(a.count - r.data.len() as u64),
            data: base64::engine::general_purpose::STANDARD.encode(&r.data),
        })
    }
}

impl Session {
    /// The parameters and locals of frame `index` of held thread `tid`, as
    /// the daemon reads them (none: no such frame).
    pub(super) async fn frame_locals(
        &self,
        pid: i32,
        tid: i32,
        index: u32,
    ) -> Result<Option<pb::FrameLocals>, tonic::Status> {
        let r = self
            .client()
            .get_thread_stack(self.daemon.request(pb::GetThreadStackRequest {
                pid,
                tid,
                depth: index + 1,
                raw: true,
                locals: true,
            }))
            .await?
            .into_inner();
        Ok(r.locals.into_iter().nth(index as usize))
    }

    /// `length` bytes at `address` of the target, all of them or an error.
    pub(super) async fn read(
        &self,
        pid: i32,
        address: u64,
        length: u32,
    ) -> Result<Vec<u8>, DapError> {
        let r = self
            .client()
            .read_memory(self.daemon.request(pb::ReadMemoryRequest {
                pid,
                address,
                length,
            }))
            .await?
            .into_inner();
        if r.unreadable > 0 {
            return Err(DapError::Unreadable(r.error));
        }
        Ok(r.data)
    }

    /// A new `variablesReference` for `c` (valid until the next continue).
    fn container(&mut self, c: Container) -> i64 {
        let id = self.next_var;
        self.next_var += 1;
        self.vars.insert(id, c);
        id
    }
}

/// A frame of `stackTrace` from a symbolized location.
fn stack_frame(id: i64, l: &pb::Location) -> StackFrame {
    let module = l.module.rsplit('/').next().unwrap_or("").to_string();
    let name = if l.function.is_empty() {
        format!("{:#x} ({module})", l.ip)
    } else {
        l.function.clone()
    };
    let source = (!l.file.is_empty()).then(|| Source {
        name: l.file.rsplit('/').next().unwrap_or(&l.file).to_string(),
        path: l.file.clone(),
    });
    StackFrame {
        id,
        name,
        presentation_hint: source.is_none().then_some("subtle"),
        source,
        line: l.line,
        column: l.column,
        instruction_pointer_reference: format!("{:#x}", l.ip),
    }
}

/// The object a frame's variable leads to, as an expression the daemon's
/// `ListVariables` reads without the frame: what a pointer to a record
/// points at (`*(struct conn *)0x5581…`), or a record where it is
/// (`*(struct conn *)0x7ffd…`). None for scalars, unreadable values and
/// null pointers.
fn object_of(v: &pb::LocalVariable) -> Option<String> {
    if !v.error.is_empty() {
        return None;
    }
    let ty = v.r#type.trim();
    let record = |t: &str| ["struct ", "union "].iter().any(|k| t.starts_with(k));
    if let Some(target) = ty.strip_suffix('*') {
        let target = target.trim_end();
        if !record(target) || target.ends_with('*') {
            return None;
        }
        let bytes: [u8; 8] = v.value.get(..8)?.try_into().ok()?;
        let ptr = u64::from_le_bytes(bytes);
        return (ptr != 0).then(|| format!("*({ty}){ptr:#x}"));
    }
    (record(ty) && v.address != 0).then(|| format!("*({ty} *){:#x}", v.address))
}
