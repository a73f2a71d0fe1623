//! Step and WriteMemory on the wire: requests read into the core's
//! terms, answers written back (the handlers in `mod.rs` stay thin).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use wpd_proto::v1 as pb;

use crate::engine::Core;
use crate::engine::step::{StepEnd, StepKind, StepResult};
use crate::error::WpdError;

/// Most bytes one WriteMemory writes.
pub const MAX_WRITE: usize = 64 << 10;

/// A step's kind and the frames its answer carries.
pub fn request(r: &pb::StepRequest) -> Result<(StepKind, usize), WpdError> {
    let kind = match pb::StepKind::try_from(r.kind) {
        Ok(pb::StepKind::Instruction) => StepKind::Instruction,
        Ok(pb::StepKind::InstructionOver) => StepKind::InstructionOver,
        Ok(pb::StepKind::Line) => StepKind::Line,
        Ok(pb::StepKind::Into) => StepKind::Into,
        Ok(pb::StepKind::Out) => StepKind::Out,
        _ => {
            return Err(WpdError::InvalidArgument(
                "kind: INSTRUCTION, INSTRUCTION_OVER, LINE, INTO or OUT".into(),
            ));
        }
    };
    let depth = match r.depth {
        0 => 1,
        d => crate::convert::stack_depth(d)?,
    };
    Ok((kind, depth))
}

/// Set when the call is dropped (the client went away): the step stops
/// the thread where it is.
pub struct Cancel(pub Arc<AtomicBool>);

impl Drop for Cancel {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A step's answer, its frames symbolized as GetThreadStack's.
pub async fn response(core: &Core, done: StepResult) -> pb::StepResponse {
    let end = match done.end {
        StepEnd::Done => pb::StepEnd::Done,
        StepEnd::Hit => pb::StepEnd::Hit,
        StepEnd::Breakpoint => pb::StepEnd::Breakpoint,
        StepEnd::Interrupted => pb::StepEnd::Interrupted,
        StepEnd::Exec => pb::StepEnd::Exec,
        StepEnd::Exited => pb::StepEnd::Exited,
    };
    let frames = match &done.stack {
        None => Vec::new(),
        Some(stack) => {
            let at: Vec<(u64, u64)> = stack
                .ips
                .iter()
                .enumerate()
                .map(|(i, &ip)| {
                    let exact = i == 0 && !stack.regs.after_hit;
                    (ip, if exact { ip } else { ip.saturating_sub(1) })
                })
                .collect();
            match &stack.image {
                Some(image) => core
                    .symbols
                    .frames_at(image, &at)
                    .await
                    .iter()
                    .map(crate::convert::frame_to_pb)
                    .collect(),
                None => at
                    .iter()
                    .map(|&(ip, lookup_address)| pb::Location {
                        ip,
                        lookup_address,
                        ..Default::default()
                    })
                    .collect(),
            }
        }
    };
    pb::StepResponse {
        end: end as i32,
        frames,
        signals: done.signals,
        note: done.note.unwrap_or_default(),
        legs: done.legs,
    }
}
