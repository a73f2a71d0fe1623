//! What a request does beyond the core's one operation, whatever carried
//! it: the permission check and its re-check after the operation (a
//! process that executed a setuid program in between keeps nothing),
//! leases (what a stream's end undoes), persist-or-undo (a change not on
//! disk is not kept), and restore after a restart (from the saved state,
//! each entry as the caller who set it). Transport-free: it takes a
//! [`Caller`] and domain values, and answers domain values or a
//! [`WpdError`]; the gRPC layer (`rpc/`) decodes, calls one method here and
//! encodes, and startup restores through it.
//!
//! Architecture Invariant: nothing here knows tonic; no core call that
//! makes syscalls runs on an async worker ([`run`] moves it to the blocking
//! pool); no lock is held across `.await`.

pub mod hits;
pub mod leases;
pub mod persist;
pub mod process;
mod restore;
pub mod stats;
pub mod values;
pub mod watch;

use std::sync::Arc;
use std::time::Duration;

use crate::authz::{self, Caller};
use crate::engine::Core;
use crate::error::WpdError;
use crate::model::{Pid, WatchId};

/// The service: the core, the leases of event streams, the saved state.
#[derive(Debug, Clone)]
pub struct Service {
    core: Arc<Core>,
    leases: Arc<leases::Leases>,
    /// Saved watchpoints and policies (`--state-dir`), if kept.
    persist: Option<Arc<persist::Persist>>,
    /// Fault injection: a pause after every permission check, as a slow
    /// machine might make one (`wpd` takes it from
    /// `WPD_FAULT_AFTER_CHECK_MS`).
    fault_after_check: Option<Duration>,
}

impl Service {
    /// A service over `core`.
    pub fn new(core: Arc<Core>) -> Self {
        Service {
            leases: leases::Leases::new(core.clone()),
            core,
            persist: None,
            fault_after_check: None,
        }
    }

    /// The service, saving what is set through it in `persist`.
    pub fn with_persist(mut self, persist: Arc<persist::Persist>) -> Self {
        self.persist = Some(persist);
        self
    }

    /// With a pause after every permission check (fault injection).
    pub fn with_fault_after_check(mut self, d: Option<Duration>) -> Self {
        self.fault_after_check = d;
        self
    }

    /// The core (for the read-only views a transport encodes).
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// The event streams' leases.
    pub fn leases(&self) -> &Arc<leases::Leases> {
        &self.leases
    }

    /// The saved state, if kept.
    pub fn persist(&self) -> Option<&Arc<persist::Persist>> {
        self.persist.as_ref()
    }

    /// Checks that `caller` may act on `pid` (see `authz`), noting what
    /// the process was (start time, credentials) before the check: an
    /// operation that attaches to it or reads it checks again afterwards
    /// ([`Checked::unchanged`]), since nothing ties the check to the
    /// process it then acts on (a setuid program executed in between).
    pub fn allow(&self, caller: &Caller, pid: Pid) -> Result<Checked, WpdError> {
        let checked = Checked {
            pid,
            privileged: caller.privileged,
            start: crate::procfs::start_time(pid),
            creds: crate::procfs::creds(pid),
        };
        authz::check(caller, pid)?;
        if let Some(d) = self.fault_after_check {
            tracing::info!(pid, pause = ?d, "fault injection: pausing after the permission check");
            std::thread::sleep(d);
        }
        Ok(checked)
    }

    /// [`Service::allow`] for a process named by a watchpoint's id: one
    /// outside a nested caller's namespace is no watchpoint of its.
    pub fn allow_by_id(&self, caller: &Caller, pid: Pid, id: WatchId) -> Result<Checked, WpdError> {
        if let Some(ns) = caller.pidns.nested()
            && !ns.sees(pid)
        {
            return Err(WpdError::NoSuchWatchpoint(id));
        }
        self.allow(caller, pid)
    }
}

/// A process as it was when a caller was allowed to act on it.
#[derive(Debug)]
pub struct Checked {
    pid: Pid,
    privileged: bool,
    start: Option<u64>,
    creds: Option<([u32; 3], [u32; 3], u64)>,
}

impl Checked {
    /// Whether it is still the process that was checked, with the same
    /// credentials (always, for a privileged caller).
    pub fn unchanged(&self) -> Result<(), WpdError> {
        if self.privileged
            || (crate::procfs::start_time(self.pid) == self.start
                && crate::procfs::creds(self.pid) == self.creds)
        {
            return Ok(());
        }
        Err(WpdError::PermissionDenied {
            pid: self.pid,
            detail: "the process changed identity or credentials (it executed a setuid or \
                     setgid program, or exited) between the permission check and the \
                     operation: nothing was kept"
                .into(),
        })
    }
}

/// Runs a blocking core call off the async workers.
pub async fn run<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, WpdError> + Send + 'static,
) -> Result<T, WpdError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(WpdError::Internal(format!("request task failed: {e}"))),
    }
}

/// The refusal of a request whose change could not be saved (logged with
/// its errno).
fn not_saved(what: String, e: &std::io::Error, outcome: &'static str) -> WpdError {
    tracing::error!(
        error = %e,
        errno = e.raw_os_error().unwrap_or(0),
        "{what}: cannot save the watchpoints; {outcome}"
    );
    WpdError::NotSaved {
        what,
        error: e.to_string(),
        outcome,
    }
}
