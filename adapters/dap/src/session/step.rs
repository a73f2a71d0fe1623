//! Stepping and changing the target: `next`, `stepIn`, `stepOut` (the
//! daemon's Step, run on a task of its own so that the session goes on
//! answering while the thread runs: a `pause` ends a step that does not
//! end by itself; its end comes back as an input), `disassemble` (the
//! instructions around an address, decoded here with `iced-x86`),
//! `writeMemory` and `setVariable` (a held thread's local, found where its
//! frame has it, or a member or element in memory, found by the
//! expression the daemon listed it with; the value typed as its type
//! stores it, `wpd_proto::value::encode`, and written with WriteMemory, so
//! with the caller's right to write the process's memory).

use base64::Engine as _;
use wpd_proto::v1 as pb;

use super::{Container, Handler, Input, Session, StopMode};
use crate::error::DapError;
use crate::protocol::events::Stopped;
use crate::protocol::requests::*;
use crate::protocol::types::DisassembledInstruction;
use crate::spec;

/// Which stepping request.
#[derive(Debug, Clone, Copy)]
enum What {
    Over,
    In,
    Out,
}

impl Handler<Next> for Session {
    async fn handle(&mut self, a: StepArguments) -> Result<(), DapError> {
        self.step(a, What::Over)
    }
}

impl Handler<StepIn> for Session {
    async fn handle(&mut self, a: StepArguments) -> Result<(), DapError> {
        self.step(a, What::In)
    }
}

impl Handler<StepOut> for Session {
    async fn handle(&mut self, a: StepArguments) -> Result<(), DapError> {
        self.step(a, What::Out)
    }
}

impl Session {
    fn step(&mut self, a: StepArguments, what: What) -> Result<(), DapError> {
        let pid = self.pid()?;
        if self.mode == StopMode::Never {
            return Err(DapError::PerfNeverStops);
        }
        let tid = i32::try_from(a.thread_id).map_err(|_| DapError::NoSuchThread)?;
        // With "stopOnHit": "thread" the others run anyway.
        let single = a.single_thread == Some(true) || self.mode == StopMode::Thread;
        let instruction = a.granularity.as_deref() == Some("instruction");
        let kind = match (what, instruction) {
            (What::Over, false) => pb::StepKind::Line,
            (What::Over, true) => pb::StepKind::InstructionOver,
            (What::In, false) => pb::StepKind::Into,
            (What::In, true) => pb::StepKind::Instruction,
            (What::Out, _) => pb::StepKind::Out,
        };
        self.forget_stop(if single { Some(tid) } else { None });
        let mut client = self.client();
        let request = self.daemon.request(pb::StepRequest {
            pid,
            tid,
            kind: kind as i32,
            others_run: !single,
            depth: 1,
        });
        let inputs = self.inputs.clone();
        tokio::spawn(async move {
            let result = client
                .step(request)
                .await
                .map(|r| r.into_inner())
                .map_err(|s| s.message().to_string());
            let _ = inputs
                .send(Input::Stepped {
                    tid,
                    all: !single,
                    result,
                })
                .await;
        });
        Ok(())
    }

    /// A step ended: `stopped` with reason `step`, unless what ended it
    /// (a hit, a code breakpoint, a pause, another thread's stop) reports
    /// itself.
    pub(super) fn stepped(
        &mut self,
        tid: i32,
        all: bool,
        result: Result<pb::StepResponse, String>,
    ) {
        let r = match result {
            Ok(r) => r,
            Err(why) => {
                // Refused (the thread is where it was, held): said, and
                // shown stopped again.
                self.output("important", &format!("wpd: the step failed: {why}"));
                self.stopped = true;
                self.send_event(&Stopped {
                    reason: "step",
                    description: Some(format!("step failed: {why}")),
                    thread_id: i64::from(tid),
                    all_threads_stopped: all && self.mode == StopMode::All,
                    ..Default::default()
                });
                return;
            }
        };
        match pb::StepEnd::try_from(r.end) {
            Ok(pb::StepEnd::Done | pb::StepEnd::Exec) => {
                self.stopped = true;
                let text = r.frames.first().map(|f| {
                    if f.file.is_empty() {
                        format!("{} {:#x}", f.function, f.ip)
                    } else {
                        let file = f.file.rsplit('/').next().unwrap_or(&f.file);
                        format!("{} ({file}:{})", f.function, f.line)
                    }
                });
                self.send_event(&Stopped {
                    reason: "step",
                    description: (!r.note.is_empty()).then(|| r.note.clone()),
                    text,
                    thread_id: i64::from(tid),
                    all_threads_stopped: all && self.mode == StopMode::All,
                    ..Default::default()
                });
            }
            Ok(pb::StepEnd::Exited) => {
                self.output("console", &format!("thread {tid} exited during the step"));
            }
            _ => {}
        }
    }
}

impl Handler<Disassemble> for Session {
    async fn handle(&mut self, a: DisassembleArguments) -> Result<DisassembleBody, DapError> {
        let pid = self.pid()?;
        let base = spec::parse_address(&a.memory_reference)?;
        let at = base
            .checked_add_signed(a.offset.unwrap_or(0))
            .ok_or(DapError::AddressOutOfRange)?;
        let count = a.instruction_count.clamp(0, 4096) as usize;
        let before = (-a.instruction_offset.unwrap_or(0)).max(0) as u64;
        let after = a.instruction_offset.unwrap_or(0).max(0) as usize;
        // x86 instructions have no fixed length: decoding starts early
        // enough, at a place whose instructions fall on `at`.
        let back = before * 15 + 15;
        let start = at.saturating_sub(back);
        let want = (back + (count as u64 + after as u64 + 1) * 15) as u32;
        let r = self
            .client()
            .read_memory(self.daemon.request(pb::ReadMemoryRequest {
                pid,
                address: start,
                length: want.min(1 << 20),
            }))
            .await?
            .into_inner();
        let mut lines = Vec::new();
        for skip in 0..15u64 {
            let from = start + skip;
            let Some(bytes) = r.data.get(skip as usize..) else {
                break;
            };
            let v = disassemble(bytes, from);
            if let Some(i) = v.iter().position(|l| l.0 == at) {
                lines = v;
                let first = i.saturating_sub(before as usize) + after;
                lines.drain(..first.min(lines.len()));
                break;
            }
        }
        let mut instructions: Vec<DisassembledInstruction> = lines
            .into_iter()
            .take(count)
            .map(|(addr, bytes, text)| DisassembledInstruction {
                address: format!("{addr:#x}"),
                instruction_bytes: bytes.iter().map(|b| format!("{b:02x}")).collect(),
                instruction: text,
                ..Default::default()
            })
            .collect();
        while instructions.len() < count {
            let n = instructions.len() as u64;
            instructions.push(DisassembledInstruction {
                address: format!("{:#x}", at + n),
                instruction: "??".into(),
                presentation_hint: Some("invalid"),
                ..Default::default()
            });
        }
        Ok(DisassembleBody { instructions })
    }
}

/// The instructions of `bytes` from `addr`: (address, bytes, text in the
/// GNU assembler's syntax).
fn disassemble(bytes: &[u8], addr: u64) -> Vec<(u64, Vec<u8>, String)> {
    use iced_x86::{Decoder, DecoderOptions, Formatter, GasFormatter, Instruction};
    let mut d = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
    let mut f = GasFormatter::new();
    let mut out = Vec::new();
    let mut i = Instruction::default();
    while d.can_decode() {
        let pos = d.position();
        d.decode_out(&mut i);
        if i.is_invalid() {
            break;
        }
        let mut text = String::new();
        f.format(&i, &mut text);
        out.push((i.ip(), bytes[pos..pos + i.len()].to_vec(), text));
    }
    out
}

impl Handler<WriteMemory> for Session {
    async fn handle(&mut self, a: WriteMemoryArguments) -> Result<WriteMemoryBody, DapError> {
        let pid = self.pid()?;
        let base = spec::parse_address(&a.memory_reference)?;
        let address = base
            .checked_add_signed(a.offset.unwrap_or(0))
            .ok_or(DapError::AddressOutOfRange)?;
        let data = base64::engine::general_purpose::STANDARD
            .decode(a.data.as_bytes())
            .map_err(|e| DapError::BadArguments(format!("data: {e}")))?;
        let r = self
            .client()
            .write_memory(
                self.daemon
                    .request(pb::WriteMemoryRequest { pid, address, data }),
            )
            .await?
            .into_inner();
        if !r.error.is_empty() && r.written == 0 {
            return Err(DapError::Unreadable(r.error));
        }
        Ok(WriteMemoryBody {
            bytes_written: u64::from(r.written),
        })
    }
}

impl Handler<SetVariable> for Session {
    async fn handle(&mut self, a: SetVariableArguments) -> Result<SetVariableBody, DapError> {
        let pid = self.pid()?;
        let Some(c) = self.vars.get(&a.variables_reference).cloned() else {
            return Err(DapError::StaleVariables);
        };
        let name = a.name.trim().to_string();
        let read_only = |why: &str| DapError::ReadOnly {
            name: name.clone(),
            why: why.into(),
        };
        // The expression the daemon resolves, and the held thread's frame
        // it starts from (locals), or none (an object in memory).
        let (expr, tid, frame) = match c {
            Container::Locals(tid, index) => {
                let frame = self
                    .frame_locals(pid, tid, index)
                    .await
                    .map_err(|s| held(s, tid))?;
                let v = frame
                    .as_ref()
                    .and_then(|f| f.variables.iter().find(|v| v.name == name))
                    .ok_or(DapError::NothingByThatName)?;
                if v.address == 0 {
                    return Err(read_only(&if v.error.is_empty() {
                        "it is in a register here, not in memory".to_string()
                    } else {
                        format!("{} (it is not in memory)", v.error)
                    }));
                }
                (name.clone(), tid, index)
            }
            Container::Children(_) => {
                let expr = self
                    .named
                    .get(&(a.variables_reference, name.clone()))
                    .cloned()
                    .ok_or(DapError::NothingByThatName)?;
                (expr, 0, 0)
            }
            Container::Watched => (name.clone(), 0, 0),
            Container::Registers(_) | Container::GeneralRegisters(_) | Container::Flags(_) => {
                return Err(read_only("registers are shown here, not changed"));
            }
            Container::Hit(_) => {
                return Err(read_only(
                    "it describes the data breakpoint's hit: change the variable itself",
                ));
            }
        };
        let resolve = |expr: String| {
            self.daemon.request(pb::ResolveSymbolRequest {
                pid,
                name: expr,
                address: 0,
                tid,
                frame,
            })
        };
        let r = self
            .client()
            .resolve_symbol(resolve(expr.clone()))
            .await
            .map_err(|s| held(s, tid))?
            .into_inner();
        let sym = r.symbol.ok_or(DapError::NothingByThatName)?;
        if r.kind != "variable" || sym.address == 0 {
            return Err(read_only(&format!(
                "it is a {}, not an object in memory",
                r.kind
            )));
        }
        let bad = |why: String| DapError::BadValue {
            name: name.clone(),
            value: a.value.clone(),
            why,
        };
        let mut t = sym.value_type.clone().unwrap_or_default();
        if t.name.is_empty() {
            t.name = sym.type_name.clone();
        }
        if u64::from(t.size) != sym.size {
            t.kind = pb::ValueKind::Unspecified as i32;
        }
        let data = wpd_proto::value::encode(&t, &a.value).map_err(bad)?;
        let len = data.len();
        let w = self
            .client()
            .write_memory(self.daemon.request(pb::WriteMemoryRequest {
                pid,
                address: sym.address,
                data,
            }))
            .await?
            .into_inner();
        if (w.written as usize) < len {
            return Err(DapError::Unreadable(w.error));
        }
        // Read back as the Variables view shows it.
        let r = self
            .client()
            .resolve_symbol(resolve(expr))
            .await
            .map_err(|s| held(s, tid))?
            .into_inner();
        let value = match &r.symbol {
            Some(s) if r.value.len() as u64 == s.size => {
                let pointer = s.type_name.trim_end().ends_with('*');
                let n = if pointer { "" } else { r.value_name.as_str() };
                spec::show_typed(s.value_type.as_ref(), &s.type_name, &r.value, n)
            }
            _ => a.value.trim().to_string(),
        };
        Ok(SetVariableBody {
            value,
            type_name: (!sym.type_name.is_empty()).then_some(sym.type_name),
            memory_reference: Some(format!("{:#x}", sym.address)),
        })
    }
}

/// A daemon refusal about thread `tid` (0: none): running is said so.
fn held(s: tonic::Status, tid: i32) -> DapError {
    use tonic_types::StatusExt as _;
    let not_held = s
        .get_error_details()
        .error_info()
        .is_some_and(|i| i.reason == wpd_proto::reason::THREAD_NOT_HELD);
    if tid != 0 && not_held {
        DapError::ThreadRunning(tid)
    } else {
        s.into()
    }
}
