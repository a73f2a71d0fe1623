//! The gRPC layer: the only module that knows tonic. Handlers validate
//! (`convert`), translate the pids of callers in nested pid namespaces
//! (`nsview`), run the core operation on the blocking pool (it makes
//! syscalls), and map errors (`status`).
//!
//! Architecture Invariant: no ptrace/perf syscall runs on a tokio worker;
//! no lock is held across `.await`.

pub mod auth;
pub mod authority;
pub mod conn;
mod feed;
pub mod leases;
pub mod metrics;
pub mod nsview;
pub mod persist;
pub mod replay;
mod restore;
pub mod serve;
mod stats;
pub mod status;
mod step;
mod values;

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use wpd_proto::v1 as pb;
use wpd_proto::v1::watchpoints_server::Watchpoints;

use crate::convert;
use crate::arch;
use crate::authz::{self, Caller};
use crate::engine::Core;
use crate::error::WpdError;
use crate::events::EventKind;
use crate::model::{Pid, WatchId, WatchSpec};
use feed::EventFeed;

/// The service.
#[derive(Debug, Clone)]
pub struct Service {
    core: Arc<Core>,
    auth: Arc<auth::AuthConfig>,
    conns: Arc<conn::Registry>,
    leases: Arc<leases::Leases>,
    /// Saved watchpoints and policies (`--state-dir`), if kept.
    persist: Option<Arc<persist::Persist>>,
    /// Fault injection: a pause after every permission check, as a slow
    /// machine might make one (`wpd` takes it from
    /// `WPD_FAULT_AFTER_CHECK_MS`).
    fault_after_check: Option<std::time::Duration>,
}

impl Service {
    /// A service over `core`; `conns` counts its connections (stats).
    pub fn new(core: Arc<Core>, auth: auth::AuthConfig, conns: Arc<conn::Registry>) -> Self {
        Service {
            leases: leases::Leases::new(core.clone()),
            core,
            auth: Arc::new(auth),
            conns,
            persist: None,
            fault_after_check: None,
        }
    }

    /// With a pause after every permission check (fault injection).
    pub fn with_fault_after_check(mut self, d: Option<std::time::Duration>) -> Self {
        self.fault_after_check = d;
        self
    }

    /// Checks that `caller` may act on `pid` (see `authz`), noting what
    /// the process was (start time, credentials) before the check: an
    /// operation that attaches to it or reads it checks again afterwards
    /// ([`Checked::unchanged`]), since nothing ties the check to the
    /// process it then acts on (a setuid program executed in between).
    fn allow(&self, caller: &Caller, pid: Pid) -> Result<Checked, Status> {
        let checked = Checked {
            pid,
            privileged: caller.privileged,
            start: crate::procfs::start_time(pid),
            creds: crate::procfs::creds(pid),
        };
        authz::check(caller, pid).map_err(|e| nsview::error_out(caller, e))?;
        if let Some(d) = self.fault_after_check {
            std::thread::sleep(d);
        }
        Ok(checked)
    }

    /// [`Service::allow`] for a process named by a watchpoint's id: one
    /// outside a nested caller's namespace is no watchpoint of its.
    fn allow_by_id(&self, caller: &Caller, pid: Pid, id: WatchId) -> Result<Checked, Status> {
        if let Some(ns) = caller.pidns.nested()
            && !ns.sees(pid)
        {
            return Err(WpdError::NoSuchWatchpoint(id).into());
        }
        self.allow(caller, pid)
    }

    /// The service, saving what is set through it in `persist`.
    pub fn with_persist(mut self, persist: Arc<persist::Persist>) -> Self {
        self.persist = Some(persist);
        self
    }

    /// SetWatchpoint on behalf of `caller` (the handler, and watchpoints
    /// set again after a restart).
    pub(crate) async fn set_watchpoint_as(
        &self,
        caller: Caller,
        req: pb::SetWatchpointRequest,
        id: Option<u64>,
    ) -> Result<pb::SetWatchpointResponse, Status> {
        let mut asked = req.spec.ok_or_else(|| {
            status::to_status(&WpdError::InvalidArgument("spec is required".into()))
        })?;
        // The daemon's numbers from here on (and on disk).
        let asked_pid = asked.pid;
        nsview::spec_in(&caller, &mut asked)?;
        let code = convert::code_from_pb(&asked)?;
        let spec = if code.as_ref().is_some_and(|c| c.stop) {
            // A code breakpoint watches no memory: the rest of the spec
            // (process, backend, lease) read as an object watch's.
            WatchSpec::try_from(pb::WatchpointSpec {
                access: pb::Access::Exec as i32,
                symbol: "breakpoint".into(),
                ..asked.clone()
            })?
        } else {
            WatchSpec::try_from(asked.clone())?
        };
        let attached = self.core.process_view(spec.pid).is_some();
        if let Some(code) = code {
            nsview::init_in(&caller, asked_pid, spec.allow_init, attached)?;
            let checked = self.allow(&caller, spec.pid)?;
            let lease = spec.lease;
            if lease != 0 {
                self.leases.check(lease, caller.uid)?;
            }
            let core = self.core.clone();
            let uid = caller.uid;
            let view = blocking_as(&caller, move || {
                let view = core.set_object_watch(spec, code, uid)?;
                if let Err(e) = checked.unchanged() {
                    let _ = core.remove_object_watch(view.id);
                    return Err(e);
                }
                Ok(view)
            })
            .await?;
            if lease != 0 && !self.leases.add_watch(lease, view.id) {
                // The stream ended while the probe was being set.
                let (core, id) = (self.core.clone(), view.id);
                blocking(move || {
                    leases::undo(&core, &[id], &Default::default());
                    Ok(())
                })
                .await?;
                return Err(status::to_status(&WpdError::LeaseEnded {
                    lease,
                    during: "while the code breakpoint was being set",
                    undone: "it was removed",
                }));
            }
            let mut w = convert::object_view_to_pb(&view);
            if let Some(p) = self.core.process_view(view.spec.pid) {
                w.backend = convert::backend_to_pb(p.backend) as i32;
            }
            if let Some(s) = w.spec.as_mut() {
                s.pid = asked_pid;
            }
            let warnings = view
                .pending_why
                .iter()
                .map(|why| {
                    let what = if view.code.line.is_some() {
                        "whose line table has that line"
                    } else {
                        "that defines it"
                    };
                    format!("pending: {why}; it is set when the process loads a library {what}")
                })
                .collect();
            return Ok(pb::SetWatchpointResponse {
                watchpoint: Some(w),
                warnings,
                ..Default::default()
            });
        }
        nsview::init_in(&caller, asked_pid, spec.allow_init, attached)?;
        let checked = self.allow(&caller, spec.pid)?;
        let lease = spec.lease;
        if lease != 0 {
            self.leases.check(lease, caller.uid)?;
        }
        let core = self.core.clone();
        let uid = caller.uid;
        let (view, took) = blocking_as(&caller, move || {
            let was_attached = core.process_view(spec.pid).is_some();
            let (view, took) = core.set_watchpoint_with_id(spec, uid, id.map(WatchId))?;
            // Armed on the process that was checked, or backed out.
            if let Err(e) = checked.unchanged() {
                let _ = core.remove_watchpoint(view.id);
                if !was_attached {
                    let _ = core.detach(checked.pid);
                }
                return Err(e);
            }
            Ok((view, took))
        })
        .await?;
        if lease != 0 && !self.leases.add_watch(lease, view.id) {
            // The stream ended while the watchpoint was being armed.
            let (core, id) = (self.core.clone(), view.id);
            blocking(move || {
                leases::undo(&core, &[id], &Default::default());
                Ok(())
            })
            .await?;
            return Err(status::to_status(&WpdError::LeaseEnded {
                lease,
                during: "while the watchpoint was being armed",
                undone: "it was removed",
            }));
        }
        if lease == 0
            && let Some(p) = &self.persist
        {
            p.record_watchpoint(view.id.0, &caller, asked, view.spec.pid);
            // On disk before the answer: a daemon killed right after it
            // sets the watchpoint again. Not on disk: undone, refused.
            if let Err(e) = self.commit_saved(persist::Change::Added(view.id.0)).await {
                let (core, id) = (self.core.clone(), view.id);
                let _ = blocking(move || core.remove_watchpoint(id).map(|_| ())).await;
                return Err(not_saved(
                    format!("watchpoint {}", view.id.0),
                    &e,
                    "it was removed again; nothing changed",
                ));
            }
        }
        tracing::info!(
            id = view.id.0,
            pid = view.spec.pid,
            armed = view.armed_threads,
            ?took,
            "watchpoint set"
        );
        let mut watchpoint: pb::Watchpoint = (&view).into();
        nsview::watchpoint_out(&caller, &mut watchpoint);
        Ok(pb::SetWatchpointResponse {
            watchpoint: Some(watchpoint),
            arm_duration_ns: took.as_nanos() as u64,
            warnings: view.warnings.clone(),
            symbol: view.symbol.as_ref().map(convert::symbol_to_pb),
        })
    }

    /// SetPolicy on behalf of `caller`.
    pub(crate) async fn set_policy_as(
        &self,
        caller: Caller,
        r: pb::SetPolicyRequest,
        id: Option<u64>,
    ) -> Result<pb::SetPolicyResponse, Status> {
        let asked = r.spec.ok_or_else(|| {
            status::to_status(&WpdError::InvalidArgument("spec is required".into()))
        })?;
        let code = convert::code_from_pb(&asked)?;
        if code.as_ref().is_some_and(|c| c.stop) {
            return Err(status::to_status(&WpdError::InvalidArgument(
                "a code breakpoint (code_event.stop) holds a thread until a client resumes it:                  set it on one process with SetWatchpoint, not in a policy"
                    .into(),
            )));
        }
        let spec = convert::policy_spec_from_pb(asked.clone())?;
        // In the daemon's terms (pids, cgroup path) from here on, and on
        // disk. Whatever it selects, a caller the daemon cannot number would
        // be told of processes by numbers that are not its own: refused.
        let mut selector_asked = r.selector.unwrap_or_default();
        nsview::selector_in(&caller, &mut selector_asked)?;
        let selector = convert::selector_from_pb(Some(selector_asked.clone()))
            .map_err(|e| nsview::error_out(&caller, e))?;
        // Named processes are checked now, as SetWatchpoint would; the
        // others when they match (a nested caller's: only those of its
        // namespace, `authz::check`).
        for &pid in &selector.pids {
            self.allow(&caller, pid)?;
        }
        let core = self.core.clone();
        let who = caller.clone();
        let view = blocking_as(&caller, move || {
            core.set_policy_with_id(selector, spec, code, who, id.map(WatchId))
        })
        .await?;
        if let Some(p) = &self.persist {
            p.record_policy(view.id.0, &caller, selector_asked, asked);
            if let Err(e) = self.commit_saved(persist::Change::Added(view.id.0)).await {
                let (core, id) = (self.core.clone(), view.id);
                let _ = blocking(move || core.remove_policy(id).map(|_| ())).await;
                return Err(not_saved(
                    format!("policy {}", view.id.0),
                    &e,
                    "it was removed again; nothing changed",
                ));
            }
        }
        tracing::info!(
            id = view.id.0,
            instances = view.instances.len(),
            "policy set"
        );
        let mut policy: pb::Policy = (&view).into();
        nsview::policy_out(&caller, &mut policy, &view.refusals);
        Ok(pb::SetPolicyResponse {
            policy: Some(policy),
        })
    }

    fn caller<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        Ok(auth::caller(&self.auth, req)?)
    }
}

/// The answer to a request whose change could not be saved (logged with
/// its errno).
fn not_saved(what: String, e: &std::io::Error, outcome: &'static str) -> Status {
    tracing::error!(
        error = %e,
        errno = e.raw_os_error().unwrap_or(0),
        "{what}: cannot save the watchpoints; {outcome}"
    );
    status::to_status(&WpdError::NotSaved {
        what,
        error: e.to_string(),
        outcome,
    })
}

/// A process as it was when a caller was allowed to act on it.
#[derive(Debug)]
struct Checked {
    pid: Pid,
    privileged: bool,
    start: Option<u64>,
    creds: Option<([u32; 3], [u32; 3], u64)>,
}

impl Checked {
    /// Whether it is still the process that was checked, with the same
    /// credentials (always, for a privileged caller).
    fn unchanged(&self) -> Result<(), WpdError> {
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
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, WpdError> + Send + 'static,
) -> Result<T, Status> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(Status::from),
        Err(e) => Err(status::to_status(&WpdError::Internal(format!(
            "request task failed: {e}"
        )))),
    }
}

/// [`blocking`] on behalf of `caller`: its errors in the caller's numbers.
async fn blocking_as<T: Send + 'static>(
    caller: &Caller,
    f: impl FnOnce() -> Result<T, WpdError> + Send + 'static,
) -> Result<T, Status> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| nsview::error_out(caller, e).into()),
        Err(e) => Err(status::to_status(&WpdError::Internal(format!(
            "request task failed: {e}"
        )))),
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::StreamEventsItem, Status>> + Send>>;

#[tonic::async_trait]
impl Watchpoints for Service {
    async fn get_capabilities(
        &self,
        req: Request<pb::GetCapabilitiesRequest>,
    ) -> Result<Response<pb::GetCapabilitiesResponse>, Status> {
        self.caller(&req)?;
        let backends = self
            .core
            .backends()
            .into_iter()
            .map(|a| pb::BackendInfo {
                backend: convert::backend_to_pb(a.kind) as i32,
                usable: a.usable,
                reason: a.reason,
                is_default: a.is_default,
                stops: a.stops,
                events: a.events,
                code_events: a.code_events,
            })
            .collect();
        let kernel = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Response::new(pb::GetCapabilitiesResponse {
            arch: arch::current::ARCH.into(),
            slots_per_thread: arch::current::SLOTS as u32,
            lengths: arch::current::LENGTHS.to_vec(),
            access_kinds: arch::current::ACCESS_KINDS
                .iter()
                .map(|&a| convert::access_to_pb(a) as i32)
                .collect(),
            max_user_address: arch::current::USER_ADDR_LIMIT,
            backends,
            version: env!("CARGO_PKG_VERSION").into(),
            cpus: self.core.cpus() as u32,
            kernel,
        }))
    }

    async fn attach(
        &self,
        req: Request<pb::AttachRequest>,
    ) -> Result<Response<pb::AttachResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let pid = nsview::pid_in(&caller, convert::pid(r.pid)?)?;
        let attached = self.core.process_view(pid).is_some();
        nsview::init_in(&caller, r.pid, r.allow_init, attached)?;
        let backend = convert::backend(r.backend)?;
        let checked = self.allow(&caller, pid)?;
        let core = self.core.clone();
        let caller_uid = caller.uid;
        let (view, newly) = blocking_as(&caller, move || {
            let (_, newly) = core.attach_for(caller_uid, pid, backend, r.allow_init)?;
            if let Err(e) = checked.unchanged() {
                if newly {
                    let _ = core.detach(pid);
                }
                return Err(e);
            }
            core.process_view(pid)
                .map(|v| (v, newly))
                .ok_or(WpdError::ProcessExited(pid))
        })
        .await?;
        let mut process: pb::ProcessInfo = (&view).into();
        if !nsview::process_out(&caller, &mut process) {
            return Err(nsview::error_out(&caller, WpdError::ProcessExited(pid)).into());
        }
        Ok(Response::new(pb::AttachResponse {
            process: Some(process),
            newly_attached: newly,
        }))
    }

    async fn detach(
        &self,
        req: Request<pb::DetachRequest>,
    ) -> Result<Response<pb::DetachResponse>, Status> {
        let caller = self.caller(&req)?;
        let pid = nsview::pid_in(&caller, convert::pid(req.into_inner().pid)?)?;
        self.allow(&caller, pid)?;
        let core = self.core.clone();
        let (w, t) = blocking_as(&caller, move || core.detach(pid)).await?;
        Ok(Response::new(pb::DetachResponse {
            watchpoints_removed: w as u32,
            threads_released: t as u32,
        }))
    }

    async fn set_watchpoint(
        &self,
        req: Request<pb::SetWatchpointRequest>,
    ) -> Result<Response<pb::SetWatchpointResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = self
            .set_watchpoint_as(caller, req.into_inner(), None)
            .await?;
        Ok(Response::new(r))
    }

    async fn set_policy(
        &self,
        req: Request<pb::SetPolicyRequest>,
    ) -> Result<Response<pb::SetPolicyResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = self.set_policy_as(caller, req.into_inner(), None).await?;
        Ok(Response::new(r))
    }

    async fn remove_watchpoint(
        &self,
        req: Request<pb::RemoveWatchpointRequest>,
    ) -> Result<Response<pb::RemoveWatchpointResponse>, Status> {
        let caller = self.caller(&req)?;
        let id = WatchId(req.into_inner().id);
        if let Some(p) = self.core.policy(id) {
            // A nested caller's are those set from its own namespace.
            if !caller.privileged
                && (p.caller.uid != caller.uid
                    || (nsview::translated(&caller) && !p.caller.pidns.same_numbers(&caller.pidns)))
            {
                return Err(status::to_status(&WpdError::NoSuchWatchpoint(id)));
            }
            // Off the disk first: a removal that cannot be saved would be
            // undone by a restart, so it is refused and changes nothing.
            self.commit_saved(persist::Change::Removed(id.0))
                .await
                .map_err(|e| {
                    not_saved(
                        format!("removing policy {}", id.0),
                        &e,
                        "the policy stays, set and saved; nothing changed",
                    )
                })?;
            let core = self.core.clone();
            let view = blocking(move || core.remove_policy(id)).await?;
            tracing::info!(
                id = id.0,
                instances = view.instances.len(),
                "policy removed"
            );
            return Ok(Response::new(pb::RemoveWatchpointResponse {
                watchpoint: Some(pb::Watchpoint {
                    id: view.id.0,
                    policy_id: view.id.0,
                    spec: Some(convert::spec_to_pb(&view.spec)),
                    created_at_ns: view.created_at_ns,
                    ..Default::default()
                }),
            }));
        }
        if let Some(o) = self.core.object_watch(id) {
            self.allow_by_id(&caller, o.spec.pid, id)?;
            let core = self.core.clone();
            let backend = self.core.process_view(o.spec.pid).map(|p| p.backend);
            let view = blocking(move || core.remove_object_watch(id)).await?;
            let mut w = convert::object_view_to_pb(&view);
            if let Some(b) = backend {
                w.backend = convert::backend_to_pb(b) as i32;
            }
            nsview::watchpoint_out(&caller, &mut w);
            return Ok(Response::new(pb::RemoveWatchpointResponse {
                watchpoint: Some(w),
            }));
        }
        let pid = self
            .core
            .watch_pid(id)
            .ok_or_else(|| status::to_status(&WpdError::NoSuchWatchpoint(id)))?;
        self.allow_by_id(&caller, pid, id)?;
        self.commit_saved(persist::Change::Removed(id.0))
            .await
            .map_err(|e| {
                not_saved(
                    format!("removing watchpoint {}", id.0),
                    &e,
                    "the watchpoint stays, armed and saved; nothing changed",
                )
            })?;
        let core = self.core.clone();
        let view = blocking_as(&caller, move || core.remove_watchpoint(id)).await?;
        let mut watchpoint: pb::Watchpoint = (&view).into();
        nsview::watchpoint_out(&caller, &mut watchpoint);
        Ok(Response::new(pb::RemoveWatchpointResponse {
            watchpoint: Some(watchpoint),
        }))
    }

    async fn list_watchpoints(
        &self,
        req: Request<pb::ListWatchpointsRequest>,
    ) -> Result<Response<pb::ListWatchpointsResponse>, Status> {
        let caller = self.caller(&req)?;
        let pid = req.into_inner().pid;
        if pid < 0 {
            return Err(status::to_status(&WpdError::InvalidArgument(format!(
                "pid must be 0 (all) or positive, got {pid}"
            ))));
        }
        let pid = if pid > 0 {
            nsview::pid_in(&caller, pid)?
        } else {
            0
        };
        if pid > 0 {
            self.allow(&caller, pid)?;
        }
        let (mut ws, mut ps) = self.core.list((pid > 0).then_some(pid));
        // A caller sees only the processes it could trace itself.
        if !caller.privileged {
            ps.retain(|p| authz::check(&caller, p.pid).is_ok());
            ws.retain(|w| ps.iter().any(|p| p.pid == w.spec.pid));
        }
        let mut policies = self.core.list_policies((pid > 0).then_some(pid));
        if !caller.privileged {
            // A nested caller's own are those it set from its namespace.
            let translated = nsview::translated(&caller);
            policies.retain(|p| {
                self.core.policy(p.id).is_some_and(|q| {
                    q.caller.uid == caller.uid
                        && (!translated || q.caller.pidns.same_numbers(&caller.pidns))
                })
            });
        }
        let mut watchpoints: Vec<pb::Watchpoint> = ws.iter().map(Into::into).collect();
        watchpoints.extend(
            self.core
                .object_watches()
                .iter()
                .filter(|o| o.ready && (pid == 0 || o.spec.pid == pid))
                .filter_map(|o| {
                    let p = ps.iter().find(|p| p.pid == o.spec.pid)?;
                    let mut w = convert::object_view_to_pb(o);
                    w.backend = convert::backend_to_pb(p.backend) as i32;
                    Some(w)
                }),
        );
        let mut processes: Vec<pb::ProcessInfo> = ps.iter().map(Into::into).collect();
        processes.retain_mut(|p| nsview::process_out(&caller, p));
        watchpoints.retain_mut(|w| nsview::watchpoint_out(&caller, w));
        let policies = policies
            .iter()
            .map(|v| {
                let mut p: pb::Policy = v.into();
                nsview::policy_out(&caller, &mut p, &v.refusals);
                p
            })
            .collect();
        Ok(Response::new(pb::ListWatchpointsResponse {
            watchpoints,
            processes,
            policies,
            not_restored: match &self.persist {
                // Saved in the daemon's numbers, by uid: not a nested
                // caller's to see.
                _ if nsview::translated(&caller) => Vec::new(),
                Some(p) if pid == 0 => {
                    p.not_restored_list((!caller.privileged).then_some(caller.uid))
                }
                Some(p) => p
                    .not_restored_list((!caller.privileged).then_some(caller.uid))
                    .into_iter()
                    .filter(|n| n.spec.as_ref().is_some_and(|s| s.pid == pid))
                    .collect(),
                None => Vec::new(),
            },
        }))
    }

    async fn list_threads(
        &self,
        req: Request<pb::ListThreadsRequest>,
    ) -> Result<Response<pb::ListThreadsResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let asked = convert::pid(r.pid)?;
        let pid = nsview::pid_in(&caller, asked)?;
        let tids = convert::tids(&nsview::tids_in(&caller, asked, pid, &r.tids)?)?;
        self.allow(&caller, pid)?;
        let core = self.core.clone();
        let threads = blocking_as(&caller, move || core.threads(pid, &tids, r.probe)).await?;
        let mut threads: Vec<pb::ThreadInfo> = threads.iter().map(Into::into).collect();
        nsview::threads_out(&caller, pid, &mut threads);
        Ok(Response::new(pb::ListThreadsResponse {
            pid: asked,
            threads,
            slots_per_thread: arch::current::SLOTS as u32,
        }))
    }

    type StreamEventsStream = EventStream;

    async fn stream_events(
        &self,
        req: Request<pb::StreamEventsRequest>,
    ) -> Result<Response<Self::StreamEventsStream>, Status> {
        let caller = self.caller(&req)?;
        let mut r = req.into_inner();
        if r.pid < 0 {
            return Err(status::to_status(&WpdError::InvalidArgument(format!(
                "pid must be 0 (all) or positive, got {}",
                r.pid
            ))));
        }
        if r.pid > 0 {
            // The feed filters by the daemon's number (and translates what
            // it sends back).
            r.pid = nsview::pid_in(&caller, r.pid)?;
            self.allow(&caller, r.pid)?;
        }
        let from = match (r.after_seq, r.since_time_ns) {
            (Some(a), _) => Some(crate::journal::Start::AfterSeq(a)),
            (None, Some(t)) => Some(crate::journal::Start::SinceTime(t)),
            (None, None) => None,
        };
        let journal = match from {
            Some(_) => Some(
                self.core
                    .journal
                    .clone()
                    .ok_or_else(|| status::to_status(&WpdError::NoJournal))?,
            ),
            None => None,
        };
        // A replay subscribes once it has caught up; the limits apply now.
        let sub = self.core.subscribe(caller.uid, caller.privileged)?;
        let lease = r.lease.then(|| self.leases.open(caller.uid));
        let greeting = lease.as_ref().map(|l| pb::StreamEventsResponse {
            seq: 0,
            time_ns: crate::clock::realtime_ns(),
            owner: None,
            event: Some(pb::stream_events_response::Event::Leased(pb::Leased {
                lease: l.id,
            })),
        });
        let symbols = (!r.raw).then(|| self.core.symbols.clone());
        let closed = self.core.bus.closed();
        if let (Some(from), Some(journal)) = (from, journal) {
            drop(sub);
            let filter = replay::Filter::new(caller.clone(), &r);
            let steps = replay::start(self.core.clone(), journal, from, filter);
            let shutdown = tokio_stream::wrappers::WatchStream::new(closed.clone());
            let make_live = Box::new(move |sub: crate::events::Subscription| {
                EventFeed::new(caller, &r, sub, None, lease, closed, symbols)
            });
            return Ok(Response::new(Box::pin(replay::ReplayFeed {
                greeting,
                steps,
                make_live: Some(make_live),
                live: None,
                shutdown,
            })));
        }
        let feed = EventFeed::new(caller, &r, sub, greeting, lease, closed, symbols);
        Ok(Response::new(Box::pin(feed)))
    }

    async fn resume(
        &self,
        req: Request<pb::ResumeRequest>,
    ) -> Result<Response<pb::ResumeResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let asked = convert::pid(r.pid)?;
        let pid = nsview::pid_in(&caller, asked)?;
        let tids = convert::tids(&nsview::tids_in(&caller, asked, pid, &r.tids)?)?;
        self.allow(&caller, pid)?;
        let core = self.core.clone();
        let mut resumed = blocking_as(&caller, move || core.resume(pid, &tids)).await?;
        nsview::tids_out(&caller, pid, &mut resumed);
        Ok(Response::new(pb::ResumeResponse { resumed }))
    }

    async fn pause(
        &self,
        req: Request<pb::PauseRequest>,
    ) -> Result<Response<pb::PauseResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let asked = convert::pid(r.pid)?;
        let pid = nsview::pid_in(&caller, asked)?;
        let tids = convert::tids(&nsview::tids_in(&caller, asked, pid, &r.tids)?)?;
        self.allow(&caller, pid)?;
        if r.lease != 0 {
            self.leases.check(r.lease, caller.uid)?;
        }
        let core = self.core.clone();
        let mut held = blocking_as(&caller, move || core.pause(pid, &tids)).await?;
        nsview::tids_out(&caller, pid, &mut held);
        if r.lease != 0 && !self.leases.add_pause(r.lease, pid) {
            let core = self.core.clone();
            blocking(move || {
                leases::undo(&core, &[], &[pid].into());
                Ok(())
            })
            .await?;
            return Err(status::to_status(&WpdError::LeaseEnded {
                lease: r.lease,
                during: "during the pause",
                undone: "the threads run again",
            }));
        }
        Ok(Response::new(pb::PauseResponse { held }))
    }

    async fn get_thread_stack(
        &self,
        req: Request<pb::GetThreadStackRequest>,
    ) -> Result<Response<pb::GetThreadStackResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let asked = convert::pid(r.pid)?;
        let pid = nsview::pid_in(&caller, asked)?;
        let tid = convert::tids(&nsview::tids_in(&caller, asked, pid, &[r.tid])?)?[0];
        let depth = convert::stack_depth(r.depth)?;
        self.allow(&caller, pid)?;
        let core = self.core.clone();
        let locals = r.locals;
        let stack =
            blocking_as(&caller, move || core.thread_stack(pid, tid, depth, locals)).await?;
        // Return addresses are looked up at `ret - 1` (in the call); the
        // innermost frame at `ip - 1` only right after its own hit (the trap
        // follows the access): a thread stopped anywhere else resumes at
        // `ip`, which may be a function's first instruction.
        let at: Vec<(u64, u64)> = stack
            .ips
            .iter()
            .enumerate()
            .map(|(i, &ip)| {
                let exact = i == 0 && !stack.regs.after_hit;
                (ip, if exact { ip } else { ip.saturating_sub(1) })
            })
            .collect();
        let frames = match (&stack.image, r.raw) {
            (Some(image), false) => self
                .core
                .symbols
                .frames_at(image, &at)
                .await
                .iter()
                .map(convert::frame_to_pb)
                .collect(),
            _ => at
                .iter()
                .map(|&(ip, lookup_address)| pb::Location {
                    ip,
                    lookup_address,
                    ..Default::default()
                })
                .collect(),
        };
        Ok(Response::new(pb::GetThreadStackResponse {
            frames,
            note: stack.note.unwrap_or_default().to_string(),
            sp: stack.regs.sp,
            fp: stack.regs.fp,
            registers: stack
                .regs
                .general
                .iter()
                .map(|&(name, value)| pb::Register {
                    name: name.to_string(),
                    value,
                })
                .collect(),
            locals: stack.locals.iter().map(frame_locals_to_pb).collect(),
        }))
    }

    async fn step(
        &self,
        req: Request<pb::StepRequest>,
    ) -> Result<Response<pb::StepResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let asked = convert::pid(r.pid)?;
        let pid = nsview::pid_in(&caller, asked)?;
        let tid = convert::tids(&nsview::tids_in(&caller, asked, pid, &[r.tid])?)?[0];
        let (kind, depth) = step::request(&r)?;
        self.allow(&caller, pid)?;
        let core = self.core.clone();
        let cancel = step::Cancel(Default::default());
        let flag = cancel.0.clone();
        let done = blocking_as(&caller, move || {
            core.step(pid, tid, kind, r.others_run, depth, &flag)
        })
        .await?;
        drop(cancel);
        Ok(Response::new(step::response(&self.core, done).await))
    }

    async fn write_memory(
        &self,
        req: Request<pb::WriteMemoryRequest>,
    ) -> Result<Response<pb::WriteMemoryResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let pid = nsview::pid_in(&caller, convert::pid(r.pid)?)?;
        if r.data.is_empty() || r.data.len() > step::MAX_WRITE {
            return Err(
                WpdError::InvalidArgument(format!("data: 1 to {} bytes", step::MAX_WRITE)).into(),
            );
        }
        let checked = self.allow(&caller, pid)?;
        let core = self.core.clone();
        let (written, error) = blocking_as(&caller, move || {
            // Not into a process that became another's.
            checked.unchanged()?;
            core.write_memory(pid, r.address, &r.data)
        })
        .await?;
        Ok(Response::new(pb::WriteMemoryResponse {
            written: written as u32,
            error: error.unwrap_or_default(),
        }))
    }

    async fn read_memory(
        &self,
        req: Request<pb::ReadMemoryRequest>,
    ) -> Result<Response<pb::ReadMemoryResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let pid = nsview::pid_in(&caller, convert::pid(r.pid)?)?;
        let len = convert::read_length(r.address, r.length)?;
        let checked = self.allow(&caller, pid)?;
        let core = self.core.clone();
        let (data, error) = blocking_as(&caller, move || {
            let read = core.read_memory(pid, r.address, len)?;
            // Bytes of a process that became another's are not shown.
            checked.unchanged()?;
            Ok(read)
        })
        .await?;
        Ok(Response::new(pb::ReadMemoryResponse {
            unreadable: (len - data.len()) as u32,
            data,
            error: error.unwrap_or_default(),
        }))
    }

    async fn get_recent_hits(
        &self,
        req: Request<pb::GetRecentHitsRequest>,
    ) -> Result<Response<pb::GetRecentHitsResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let id = WatchId(r.watchpoint_id);
        let (kept, pid, total) = self.core.recent_hits(id, r.limit as usize)?;
        self.allow_by_id(&caller, pid, id)?;
        let mut hits = Vec::with_capacity(kept.len());
        // Each hit as a stream would show it: a forked child's only to a
        // caller who may see that child.
        let mut visible = authz::Visibility::default();
        for ev in kept {
            if !visible.admits(&caller, ev.kind.pid(), ev.owner.as_deref(), false) {
                continue;
            }
            let mut item = convert::event_to_pb(&ev);
            if !nsview::event_out(&caller, &mut item) {
                continue;
            }
            if let (EventKind::Hit(h), false) = (&ev.kind, r.raw)
                && let Some(image) = &h.image
            {
                let mut ips = Vec::with_capacity(1 + h.callchain.len());
                ips.push(h.ip);
                ips.extend_from_slice(&h.callchain);
                let frames = self.core.symbols.frames(image, &ips).await;
                convert::locate_hit(&mut item, &frames);
            }
            hits.push(item);
        }
        let value_type = values::reading(&self.core, id).map(|r| r.0);
        values::name_pointers(self.core.symbols.clone(), pid, &mut hits).await;
        Ok(Response::new(pb::GetRecentHitsResponse {
            hits,
            total,
            value_type,
        }))
    }

    async fn get_hit_aggregates(
        &self,
        req: Request<pb::GetHitAggregatesRequest>,
    ) -> Result<Response<pb::GetHitAggregatesResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let id = WatchId(r.watchpoint_id);
        let (pid, (hits, exemplars, overflow), mut top, image) =
            self.core.hit_aggregates(id, r.limit as usize)?;
        self.allow_by_id(&caller, pid, id)?;
        // Each place as a stream would show its hits: a forked child's only
        // to a caller who may see that child.
        let mut visible = authz::Visibility::default();
        top.retain(|(_, a)| visible.admits(&caller, a.pid, a.owner.as_deref(), false));
        let frames = match (&image, r.raw) {
            (Some(image), false) => {
                let ips: Vec<u64> = top.iter().map(|t| t.0.0).collect();
                self.core.symbols.frames(image, &ips).await
            }
            _ => Vec::new(),
        };
        let (value_type, reading) = values::reading(&self.core, id).unzip();
        let values: Vec<&[Vec<u8>]> = top.iter().map(|(_, a)| &a.values[..]).collect();
        let names = values::names_of_values(
            self.core.symbols.clone(),
            pid,
            reading.flatten().as_deref(),
            &values,
        )
        .await;
        let aggregates = top
            .iter()
            .enumerate()
            .map(|(i, ((ip, tid), a))| pb::HitAggregate {
                ip: *ip,
                location: frames.get(i).map(convert::frame_to_pb),
                tid: nsview::tid_out(&caller, pid, *tid),
                thread_name: a.thread_name.to_string(),
                count: a.count,
                first_ns: a.first_ns,
                last_ns: a.last_ns,
                values: a.values.clone(),
                value_names: names.get(i).cloned().unwrap_or_default(),
            })
            .collect();
        Ok(Response::new(pb::GetHitAggregatesResponse {
            watchpoint_id: id.0,
            pid: nsview::process_pid_out(&caller, pid),
            hits,
            exemplars,
            overflow,
            aggregates,
            value_type,
        }))
    }

    async fn get_stats(
        &self,
        req: Request<pb::GetStatsRequest>,
    ) -> Result<Response<pb::GetStatsResponse>, Status> {
        let caller = self.caller(&req)?;
        Ok(Response::new(self.stats(caller).await?))
    }

    async fn list_variables(
        &self,
        req: Request<pb::ListVariablesRequest>,
    ) -> Result<Response<pb::ListVariablesResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let pid = nsview::pid_in(&caller, convert::pid(r.pid)?)?;
        self.allow(&caller, pid)?;
        let symbols = self.core.symbols.clone();
        let (views, total) = blocking_as(&caller, move || {
            crate::procfs::check_process(pid)?;
            symbols
                .list_variables(pid, r.expression.trim(), r.start, r.count)
                .map_err(WpdError::from)
        })
        .await?;
        Ok(Response::new(pb::ListVariablesResponse {
            variables: views
                .into_iter()
                .map(|v| pb::VariableView {
                    name: v.name,
                    expression: v.expression,
                    type_name: v.type_name,
                    address: v.address,
                    size: v.size,
                    value: v.value,
                    error: v.error,
                    children: v.children,
                })
                .collect(),
            total,
        }))
    }

    async fn resolve_symbol(
        &self,
        req: Request<pb::ResolveSymbolRequest>,
    ) -> Result<Response<pb::ResolveSymbolResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let pid = nsview::pid_in(&caller, convert::pid(r.pid)?)?;
        let checked = self.allow(&caller, pid)?;
        let name = r.name.trim().to_string();
        if name.is_empty() == (r.address == 0) {
            return Err(status::to_status(&WpdError::InvalidArgument(
                "give a name or an address (exactly one)".into(),
            )));
        }
        let symbols = self.core.symbols.clone();
        if !name.is_empty() {
            let core = self.core.clone();
            let in_frame = if r.tid != 0 {
                let tid = convert::tids(&[r.tid])?[0];
                let tid = nsview::tids_in(&caller, convert::pid(r.pid)?, pid, &[tid])?[0];
                Some((tid, r.frame as usize))
            } else {
                None
            };
            let (resolved, kind, from_frame, (value, value_error, value_name)) =
                blocking_as(&caller, move || {
                    crate::procfs::check_process(pid)?;
                    let (r, kind, from_frame) = match in_frame {
                        Some((tid, frame)) => core.resolve_in_frame(pid, tid, frame, &name)?,
                        None => symbols.look_up(pid, &name).map(|(r, k)| (r, k, false))?,
                    };
                    // The value now, read as ReadMemory reads (the same
                    // right, checked above), of the process checked.
                    let now = values::of_name(&symbols, pid, &r, kind);
                    checked.unchanged()?;
                    Ok((r, kind, from_frame, now))
                })
                .await?;
            return Ok(Response::new(pb::ResolveSymbolResponse {
                symbol: Some(convert::symbol_to_pb(&resolved)),
                location: None,
                kind: kind.as_str().into(),
                offset: 0,
                value,
                from_frame,
                value_error,
                value_name,
            }));
        }
        let addr = r.address;
        let s2 = symbols.clone();
        let info = blocking_as(&caller, move || {
            crate::procfs::check_process(pid)?;
            s2.describe_address(pid, addr).map_err(WpdError::from)
        })
        .await?;
        let image = crate::symbols::Image::new(pid);
        // At the address itself (no `- 1`: it is not a return address).
        let frames = symbols.frames(&image, &[addr.wrapping_add(1)]).await;
        let mut location = frames.first().map(convert::frame_to_pb);
        if let Some(l) = &mut location {
            l.ip = addr;
        }
        let (symbol, kind, offset) = convert::address_to_pb(&info, addr);
        Ok(Response::new(pb::ResolveSymbolResponse {
            symbol,
            location,
            kind,
            offset,
            value: Vec::new(),
            from_frame: false,
            value_error: String::new(),
            value_name: String::new(),
        }))
    }
}

/// A frame's variables as sent.
fn frame_locals_to_pb(
    locals: &Result<Vec<crate::symbols::frame::LocalVar>, String>,
) -> pb::FrameLocals {
    match locals {
        Err(note) => pb::FrameLocals {
            variables: Vec::new(),
            note: note.clone(),
        },
        Ok(vars) => pb::FrameLocals {
            variables: vars
                .iter()
                .map(|v| pb::LocalVariable {
                    name: v.name.clone(),
                    r#type: v.type_name.clone(),
                    parameter: v.parameter,
                    address: v.address.unwrap_or(0),
                    value: v.value.clone().unwrap_or_default(),
                    error: v.value.as_ref().err().cloned().unwrap_or_default(),
                })
                .collect(),
            note: String::new(),
        },
    }
}
