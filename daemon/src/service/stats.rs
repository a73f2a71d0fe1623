//! The figures `GetStats` answers: daemon-wide for a privileged caller,
//! else those of the caller's own processes and streams (the daemon-wide
//! figures, symbol layer, export, descriptors, left at zero).

use crate::authz::{self, Caller};
use crate::engine::Stats;
use crate::error::WpdError;
use crate::service::{Service, run};
use crate::symbols::SymbolStats;

/// What one caller may see of the daemon's figures.
pub struct Figures {
    /// The core's figures (the caller's own, unless privileged).
    pub core: Stats,
    /// The symbol layer's (privileged callers only).
    pub symbols: SymbolStats,
    /// The export's (privileged callers only, with an export).
    pub export: crate::export::Figures,
    /// Code-event kernel memory a caller may hold.
    pub code_event_bytes_limit: u64,
    /// Watchpoints, code events and policies the caller holds, and its
    /// limit.
    pub held: usize,
    /// The most it may hold.
    pub held_limit: usize,
    /// Descriptors open for callers (privileged callers only).
    pub caller_fds: u64,
    /// Why the daemon serves in a degraded state, if it does.
    pub degraded: String,
    /// SIGTRAPs the daemon took (privileged callers only).
    pub sigtraps: u64,
    /// Forked children being followed (privileged callers only).
    pub forked_children: u64,
    /// Exec holds: files marked, execs held, held past the bound
    /// (privileged callers only).
    pub exec_holds: (u64, u64, u64),
}

impl Service {
    /// The figures `caller` may see.
    pub async fn stats(&self, caller: &Caller) -> Result<Figures, WpdError> {
        let core = self.core().clone();
        let who = caller.clone();
        let stats = run(move || {
            Ok(if who.privileged {
                core.stats()
            } else {
                core.stats_for(who.uid, |pid| authz::check(&who, pid).is_ok())
            })
        })
        .await?;
        let core = self.core();
        let all = caller.privileged;
        Ok(Figures {
            core: stats,
            symbols: if all {
                core.symbols.stats()
            } else {
                SymbolStats::default()
            },
            export: match (all, core.export.as_ref()) {
                (true, Some(e)) => e.figures(),
                _ => Default::default(),
            },
            code_event_bytes_limit: core.limits.code_event_bytes_per_caller,
            held: core.held_by(caller.uid),
            held_limit: core.limits.watchpoints_per_caller,
            caller_fds: if all { core.caller_fds() } else { 0 },
            degraded: core.degraded().unwrap_or_default(),
            sigtraps: if all {
                core.sigtraps.load(std::sync::atomic::Ordering::Relaxed)
            } else {
                0
            },
            forked_children: if all {
                core.forked_children() as u64
            } else {
                0
            },
            exec_holds: if all {
                let (files, held, past) = core.exec_holds();
                (files as u64, held, past)
            } else {
                (0, 0, 0)
            },
        })
    }
}
