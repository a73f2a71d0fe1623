//! What a caller may read of a watchpoint's hits (the kept hits, the
//! aggregates), each hit judged as a stream would judge it (a forked
//! child's only to a caller who may see that child); and names: what a
//! name resolves to with its value now (of the process that was checked),
//! what an address is, the variables an expression leads to.

use std::sync::Arc;

use super::{Service, run, values};
use crate::aggregate::Agg;
use crate::authz::{Caller, Visibility};
use crate::error::WpdError;
use crate::events::Event;
use crate::model::{Pid, Tid, WatchId};
use crate::symbols::children::VariableView;
use crate::symbols::{AddressInfo, NameKind, Resolved};

/// A watchpoint's aggregates as a caller may see them.
#[derive(Debug)]
pub struct Aggregates {
    /// Its process.
    pub pid: Pid,
    /// Hits counted, samples streamed, hits past the table's size.
    pub totals: (u64, u64, u64),
    /// The places, busiest first: (ip, thread) and what was seen there.
    pub top: Vec<((u64, Tid), Agg)>,
    /// The process's image, to name the places.
    pub image: Option<Arc<crate::symbols::Image>>,
}

/// What a name resolved to, and its value now.
#[derive(Debug)]
pub struct Named {
    /// The name's object.
    pub resolved: Resolved,
    /// What it is.
    pub kind: NameKind,
    /// Found among a held frame's local variables.
    pub from_frame: bool,
    /// Its bytes now, why none, and their name (enumerator, pointee).
    pub value: (Vec<u8>, String, String),
}

impl Service {
    /// The last `limit` hits watchpoint `id` kept that `caller` may see
    /// (0: all), its process and how many it kept in all.
    pub fn recent_hits(
        &self,
        caller: &Caller,
        id: WatchId,
        limit: usize,
    ) -> Result<(Vec<Arc<Event>>, Pid, u64), WpdError> {
        let (mut kept, pid, total) = self.core.recent_hits(id, limit)?;
        self.allow_by_id(caller, pid, id)?;
        let mut visible = Visibility::default();
        kept.retain(|ev| visible.admits(caller, ev.kind.pid(), ev.owner.as_deref(), false));
        Ok((kept, pid, total))
    }

    /// Watchpoint `id`'s aggregates, the `limit` busiest places (0: all)
    /// of those `caller` may see.
    pub fn hit_aggregates(
        &self,
        caller: &Caller,
        id: WatchId,
        limit: usize,
    ) -> Result<Aggregates, WpdError> {
        let (pid, totals, mut top, image) = self.core.hit_aggregates(id, limit)?;
        self.allow_by_id(caller, pid, id)?;
        let mut visible = Visibility::default();
        top.retain(|(_, a)| visible.admits(caller, a.pid, a.owner.as_deref(), false));
        Ok(Aggregates {
            pid,
            totals,
            top,
            image,
        })
    }

    /// What `name` names in `pid` (in held thread `frame.0`'s frame
    /// `frame.1`, when given), and its value now.
    pub async fn resolve_name(
        &self,
        caller: &Caller,
        pid: Pid,
        name: String,
        frame: Option<(Tid, usize)>,
    ) -> Result<Named, WpdError> {
        let checked = self.allow(caller, pid)?;
        let core = self.core.clone();
        run(move || {
            crate::procfs::check_process(pid)?;
            let symbols = &core.symbols;
            let (resolved, kind, from_frame) = match frame {
                Some((tid, frame)) => core.resolve_in_frame(pid, tid, frame, &name)?,
                None => symbols.look_up(pid, &name).map(|(r, k)| (r, k, false))?,
            };
            // The value now, read as ReadMemory reads (the same right,
            // checked above), of the process checked.
            let value = values::of_name(symbols, pid, &resolved, kind);
            checked.unchanged()?;
            Ok(Named {
                resolved,
                kind,
                from_frame,
                value,
            })
        })
        .await
    }

    /// What is at `addr` in `pid`: its module and the symbol holding it.
    pub async fn describe_address(
        &self,
        caller: &Caller,
        pid: Pid,
        addr: u64,
    ) -> Result<AddressInfo, WpdError> {
        self.allow(caller, pid)?;
        let symbols = self.core.symbols.clone();
        run(move || {
            crate::procfs::check_process(pid)?;
            symbols.describe_address(pid, addr).map_err(WpdError::from)
        })
        .await
    }

    /// The variables `expression` leads to in `pid`, `count` from
    /// `start`, and how many there are.
    pub async fn list_variables(
        &self,
        caller: &Caller,
        pid: Pid,
        expression: String,
        start: u32,
        count: u32,
    ) -> Result<(Vec<VariableView>, u64), WpdError> {
        self.allow(caller, pid)?;
        let symbols = self.core.symbols.clone();
        run(move || {
            crate::procfs::check_process(pid)?;
            symbols
                .list_variables(pid, expression.trim(), start, count)
                .map_err(WpdError::from)
        })
        .await
    }
}
