//! Stepping and changing the target: `next`, `stepIn`, `stepOut` (the
//! daemon's Step, run on a task of its own so that the session goes on
//! answering while the thread runs: a `pause` ends a step that does not
//! end by itself; its end comes back as an input), `disassemble` (the
//! instructions around an address, decoded here with `iced-x86`) and
//! `writeMemory`.

use base64::Engine as _;
use wpd_proto::v1 as pb;

use super::{Handler, Input, Session, StopMode};
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
