//! What the API says of processes and threads, and of the symbol holding
//! an address.

use wpd_proto::v1 as pb;

use crate::backend::RunState;
use crate::engine::{ProcessView, SlotView, ThreadView};
use crate::wire::event::backend_to_pb;

impl From<&ProcessView> for pb::ProcessInfo {
    fn from(p: &ProcessView) -> Self {
        pb::ProcessInfo {
            pid: p.pid,
            backend: backend_to_pb(p.backend) as i32,
            threads: p.threads,
            watchpoints: p.watchpoints,
            comm: p.comm.clone(),
            attached_at_ns: p.attached_at_ns,
            stops: p.stops.clone(),
        }
    }
}

impl From<&ThreadView> for pb::ThreadInfo {
    fn from(t: &ThreadView) -> Self {
        pb::ThreadInfo {
            tid: t.tid,
            slots: t
                .slots
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let (state, key) = match s {
                        SlotView::Free => (pb::SlotState::Free, None),
                        SlotView::Ours(k) => (pb::SlotState::Ours, Some(k)),
                        SlotView::Foreign => (pb::SlotState::Foreign, None),
                        SlotView::Pending(k) => (pb::SlotState::Pending, Some(k)),
                        SlotView::Retained => (pb::SlotState::Retained, None),
                    };
                    pb::SlotInfo {
                        index: i as u32,
                        state: state as i32,
                        watchpoint_id: key.map_or(0, |k| k.id.0),
                        piece: key.map_or(0, |k| u32::from(k.piece)),
                    }
                })
                .collect(),
            state: match t.state {
                RunState::Running => pb::ThreadState::Running,
                RunState::StoppedAtHit => pb::ThreadState::StoppedAtHit,
                RunState::StoppedByPeer => pb::ThreadState::StoppedByPeer,
                RunState::JobStopped => pb::ThreadState::JobStopped,
                RunState::StoppedAfterStep => pb::ThreadState::StoppedAfterStep,
                RunState::Stepping => pb::ThreadState::Stepping,
            } as i32,
            parent_tid: t.parent,
            name: t.name.clone(),
        }
    }
}

/// The symbol containing `addr` (`Symbols::describe_address`) on the wire:
/// the symbol, its kind, and `addr`'s offset in it.
pub fn address_to_pb(
    info: &crate::symbols::AddressInfo,
    addr: u64,
) -> (Option<pb::Symbol>, String, u64) {
    match &info.symbol {
        Some((name, start, size, kind)) => (
            Some(pb::Symbol {
                expression: name.clone(),
                name: name.clone(),
                module: info.module.clone().unwrap_or_default(),
                build_id: info.build_id.clone().unwrap_or_default(),
                address: *start,
                size: *size,
                type_name: String::new(),
                source: pb::SymbolSource::Symtab as i32,
                module_address: info.module_address.wrapping_sub(addr - start),
                note: String::new(),
                value_type: None,
            }),
            kind.to_string(),
            addr - start,
        ),
        None => (None, String::new(), 0),
    }
}
