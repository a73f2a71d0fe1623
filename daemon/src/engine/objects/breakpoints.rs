//! Code breakpoints (`CodeSpec::stop`): set past a function's prologue or at
//! a source line, and the stops each one kept.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{BreakPlace, CodeSpec, ObjectView};
use crate::engine::Core;
use crate::error::WpdError;
use crate::model::{Pid, WatchId, WatchSpec};

impl Core {
    /// Sets a code breakpoint (`code.stop`): its probe past a function's
    /// prologue or at a line's first instruction. Blocking.
    pub(super) fn set_code_breakpoint(
        self: &Arc<Self>,
        mut spec: WatchSpec,
        code: CodeSpec,
        owner: u32,
        id: Option<WatchId>,
    ) -> Result<ObjectView, WpdError> {
        use crate::symbols::code::BreakAt;
        let at = match &code.line {
            Some((file, line)) => BreakAt::Line {
                file: file.clone(),
                line: *line,
            },
            None => BreakAt::Function(code.function.clone()),
        };
        let b = self.symbols.break_site(spec.pid, &at)?;
        let place = BreakPlace {
            function: b.site.function.clone(),
            file: b.file,
            line: b.line,
            address: b.site.vaddr.wrapping_add(b.site.bias),
            module: b.site.module.path.clone(),
            offset: b.site.offset,
        };
        spec.symbol = None;
        spec.policy = None;
        self.open_object_watch(
            spec,
            code,
            owner,
            b.site,
            crate::symbols::code::Root::Ret,
            None,
            None,
            Some(place),
            id,
        )
    }

    /// The stops code breakpoint `id` kept (the last `limit`, or all with
    /// 0), oldest first, its process, and how many it reported in all;
    /// `None` when `id` is no code breakpoint.
    pub fn breakpoint_recent(
        &self,
        id: WatchId,
        limit: usize,
    ) -> Option<(Vec<Arc<crate::events::Event>>, Pid, u64)> {
        let w = self.objects.watches.get(&id).map(|w| w.clone())?;
        w.place.as_ref()?;
        let kept = w.recent.lock().unwrap();
        let skip = match limit {
            0 => 0,
            n => kept.len().saturating_sub(n),
        };
        let reported = w.reported.load(Ordering::Relaxed);
        Some((
            kept.iter().skip(skip).cloned().collect(),
            w.spec.pid,
            reported,
        ))
    }
}
