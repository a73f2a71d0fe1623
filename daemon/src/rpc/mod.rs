//! The gRPC layer: the only module that knows tonic. Handlers validate
//! (`convert`), run the core operation on the blocking pool (it makes
//! syscalls), and map errors (`status`).
//!
//! Architecture Invariant: no ptrace/perf syscall runs on a tokio worker;
//! no lock is held across `.await`.

pub mod auth;
pub mod authority;
pub mod conn;
pub mod convert;
pub mod leases;
pub mod metrics;
pub mod persist;
pub mod replay;
pub mod serve;
pub mod status;

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tonic::{Request, Response, Status};
use wpd_proto::v1 as pb;
use wpd_proto::v1::watchpoints_server::Watchpoints;

use crate::arch;
use crate::authz::{self, Caller};
use crate::core::Core;
use crate::error::WpdError;
use crate::events::{Event, EventKind};
use crate::model::{Pid, WatchId, WatchSpec};

/// The service.
#[derive(Debug, Clone)]
pub struct Service {
    core: Arc<Core>,
    auth: Arc<auth::AuthConfig>,
    conns: Arc<conn::Registry>,
    leases: Arc<leases::Leases>,
    /// Saved watchpoints and policies (`--state-dir`), if kept.
    persist: Option<Arc<persist::Persist>>,
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
        }
    }

    /// The service, saving what is set through it in `persist`.
    pub fn with_persist(mut self, persist: Arc<persist::Persist>) -> Self {
        self.persist = Some(persist);
        self
    }

    /// Sets again, each as the caller who set it, the watchpoints and
    /// policies a previous run saved; what cannot be is reported.
    pub async fn restore(&self, saved: pb::SavedState) {
        let Some(p) = self.persist.clone() else {
            return;
        };
        let same_boot = p.same_boot(&saved);
        let (mut restored, mut refused) = (0, 0);
        for e in saved.entries {
            let caller = persist::caller_of(&e.caller.unwrap_or_default());
            let (spec, selector, outcome) = match e.what {
                Some(pb::saved_entry::What::Policy(pol)) => {
                    let r = self
                        .set_policy_as(
                            caller,
                            pb::SetPolicyRequest {
                                selector: pol.selector.clone(),
                                spec: pol.spec.clone(),
                            },
                            Some(e.id),
                        )
                        .await
                        .map(|r| r.policy.map_or(0, |p| p.id))
                        .map_err(|s| s.message().to_string());
                    (pol.spec, pol.selector, r)
                }
                Some(pb::saved_entry::What::Watchpoint(w)) => {
                    let pid = w.spec.as_ref().map_or(0, |s| s.pid);
                    let r = if !same_boot {
                        Err("the machine was restarted since it was set".to_string())
                    } else if crate::procfs::start_time(pid) != Some(w.start_time) {
                        Err(format!("process {pid} is gone"))
                    } else {
                        self.set_watchpoint_as(
                            caller,
                            pb::SetWatchpointRequest {
                                spec: w.spec.clone(),
                            },
                            Some(e.id),
                        )
                        .await
                        .map(|r| r.watchpoint.map_or(0, |w| w.id))
                        .map_err(|s| s.message().to_string())
                    };
                    (w.spec, None, r)
                }
                None => continue,
            };
            match outcome {
                Ok(id) => {
                    restored += 1;
                    tracing::info!(id, "set again after a restart");
                }
                Err(why) => {
                    refused += 1;
                    let pid = spec.as_ref().map_or(0, |s| s.pid);
                    let reason = format!("not set again after a restart: {why}");
                    tracing::warn!(saved_id = e.id, pid, why = ?why.to_string(), "not set again after a restart");
                    // Seen by whoever set it (and privileged callers): the
                    // process it named may be gone or another one now.
                    let owner = crate::events::Owner {
                        start_time: 0,
                        uids: [caller.uid; 3],
                        gids: [caller.gid; 3],
                        dumpable: true,
                    };
                    self.core.bus.publish_as(
                        EventKind::WatchpointRemoved {
                            id: WatchId(e.id),
                            pid,
                            reason: reason.clone().into(),
                        },
                        Some(Arc::new(owner)),
                    );
                    p.not_restored(
                        caller.uid,
                        pb::NotRestored {
                            saved_id: e.id,
                            spec,
                            selector,
                            reason,
                            at_ns: crate::clock::realtime_ns(),
                        },
                    );
                }
            }
        }
        if restored + refused > 0 {
            tracing::info!(restored, refused, "saved watchpoints and policies");
        }
        p.restored();
        self.sync_saved().await;
    }

    /// SetWatchpoint on behalf of `caller` (the handler, and watchpoints
    /// set again after a restart).
    pub(crate) async fn set_watchpoint_as(
        &self,
        caller: Caller,
        req: pb::SetWatchpointRequest,
        id: Option<u64>,
    ) -> Result<pb::SetWatchpointResponse, Status> {
        let asked = req.spec.ok_or_else(|| {
            status::to_status(&WpdError::InvalidArgument("spec is required".into()))
        })?;
        let spec = WatchSpec::try_from(asked.clone())?;
        allow(&caller, spec.pid)?;
        let lease = spec.lease;
        if lease != 0 {
            self.leases.check(lease, caller.uid)?;
        }
        let core = self.core.clone();
        let uid = caller.uid;
        let (view, took) =
            blocking(move || core.set_watchpoint_with_id(spec, uid, id.map(WatchId))).await?;
        if lease != 0 && !self.leases.add_watch(lease, view.id) {
            // The stream ended while the watchpoint was being armed.
            let (core, id) = (self.core.clone(), view.id);
            blocking(move || {
                leases::undo(&core, &[id], &Default::default());
                Ok(())
            })
            .await?;
            return Err(status::to_status(&WpdError::InvalidArgument(format!(
                "lease {lease} ended while the watchpoint was being armed: it was removed"
            ))));
        }
        if lease == 0
            && let Some(p) = &self.persist
        {
            p.record_watchpoint(view.id.0, &caller, asked, view.spec.pid);
            // On disk before the answer: a daemon killed right after it
            // sets the watchpoint again.
            self.sync_saved().await;
        }
        tracing::info!(
            id = view.id.0,
            pid = view.spec.pid,
            armed = view.armed_threads,
            ?took,
            "watchpoint set"
        );
        Ok(pb::SetWatchpointResponse {
            watchpoint: Some((&view).into()),
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
        let spec = convert::policy_spec_from_pb(asked.clone())?;
        let selector_asked = r.selector.clone().unwrap_or_default();
        let selector = convert::selector_from_pb(r.selector)?;
        // Named processes are checked now, as SetWatchpoint would; the
        // others when they match.
        for &pid in &selector.pids {
            allow(&caller, pid)?;
        }
        let core = self.core.clone();
        let who = caller;
        let view =
            blocking(move || core.set_policy_with_id(selector, spec, who, id.map(WatchId))).await?;
        if let Some(p) = &self.persist {
            p.record_policy(view.id.0, &caller, selector_asked, asked);
            self.sync_saved().await;
        }
        tracing::info!(
            id = view.id.0,
            instances = view.instances.len(),
            "policy set"
        );
        Ok(pb::SetPolicyResponse {
            policy: Some((&view).into()),
        })
    }

    /// Writes the saved state if it changed (watchpoints gone, new ones).
    pub async fn sync_saved(&self) {
        let Some(p) = self.persist.clone() else {
            return;
        };
        let core = self.core.clone();
        let r = tokio::task::spawn_blocking(move || {
            p.sync(
                |id| {
                    let id = WatchId(id);
                    core.policy(id).is_some() || core.watch_pid(id).is_some()
                },
                core.next_id(),
            )
        })
        .await;
        if let Ok(Err(e)) = r {
            tracing::error!(error = %e, "cannot save the watchpoints");
        }
    }

    /// `id` was removed through the API: it leaves the saved state now.
    async fn forget_saved(&self, id: u64) {
        if let Some(p) = &self.persist {
            p.forget(id);
            self.sync_saved().await;
        }
    }

    /// Stops saving (shutdown: what follows is not removal).
    pub fn freeze_saved(&self) {
        if let Some(p) = &self.persist {
            p.freeze();
        }
    }

    fn caller<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        Ok(auth::caller(&self.auth, req)?)
    }

    /// What `GetStats` answers `caller`: daemon-wide figures for a
    /// privileged caller, else those of its own processes and streams. The
    /// metrics endpoint reads the privileged answer (`metrics.rs`), so a
    /// field added here is one line away from a metric.
    pub(crate) async fn stats(&self, caller: Caller) -> Result<pb::GetStatsResponse, Status> {
        let core = self.core.clone();
        let s = blocking(move || {
            Ok(if caller.privileged {
                core.stats()
            } else {
                core.stats_for(caller.uid, |pid| authz::check(&caller, pid).is_ok())
            })
        })
        .await?;
        let sym = if caller.privileged {
            self.core.symbols.stats()
        } else {
            Default::default()
        };
        let (connections, connections_refused, connections_idled) = if caller.privileged {
            (
                self.conns.open() as u32,
                self.conns.refused(),
                self.conns.idled(),
            )
        } else {
            (0, 0, 0)
        };
        let j = s.journal.unwrap_or_default();
        let x = match (caller.privileged, self.core.export.get()) {
            (true, Some(e)) => e.figures(),
            _ => Default::default(),
        };
        Ok(pb::GetStatsResponse {
            connections,
            connections_refused,
            connections_idled,
            processes: s.processes,
            threads: s.threads,
            watchpoints: s.watchpoints,
            hits: s.hits,
            kernel_lost: s.kernel_lost,
            perf_fds: s.perf_fds,
            subscribers: s.subscribers,
            subscriber_dropped: s.subscriber_dropped,
            ledger_hold_p50_ns: s.ledger_hold.0,
            ledger_hold_p99_ns: s.ledger_hold.1,
            ledger_hold_max_ns: s.ledger_hold.2,
            uptime_s: s.uptime.as_secs(),
            symbol_files: sym.files,
            symbol_bytes: sym.bytes,
            locations: sym.locations,
            location_bytes: sym.location_bytes,
            symbol_maps_reads: sym.maps_reads,
            journal_written_seq: j.written_seq,
            journal_durable_seq: j.durable_seq,
            journal_bytes: j.bytes,
            journal_segments: j.segments as u32,
            journal_lagged: j.lagged,
            journal_retired: j.retired,
            journal_fsyncs: j.fsyncs,
            journal_fsync_us: j.fsync_us,
            journal_torn: j.torn,
            export_acked_seq: x.acked_seq,
            export_published: x.published,
            export_errors: x.errors,
            export_lost: x.lost,
            export_connected: x.connected,
        })
    }
}

/// Checks that `caller` may act on `pid` (see `authz`).
fn allow(caller: &Caller, pid: Pid) -> Result<(), Status> {
    Ok(authz::check(caller, pid)?)
}

/// Runs a blocking core call off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, WpdError> + Send + 'static,
) -> Result<T, Status> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(Status::from),
        Err(e) => Err(Status::internal(format!("request task failed: {e}"))),
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::StreamEventsResponse, Status>> + Send>>;

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
        let pid = convert::pid(r.pid)?;
        let backend = convert::backend(r.backend)?;
        allow(&caller, pid)?;
        let core = self.core.clone();
        let (view, newly) = blocking(move || {
            let (_, newly) = core.attach(pid, backend, r.allow_init)?;
            core.process_view(pid)
                .map(|v| (v, newly))
                .ok_or(WpdError::ProcessExited(pid))
        })
        .await?;
        Ok(Response::new(pb::AttachResponse {
            process: Some((&view).into()),
            newly_attached: newly,
        }))
    }

    async fn detach(
        &self,
        req: Request<pb::DetachRequest>,
    ) -> Result<Response<pb::DetachResponse>, Status> {
        let caller = self.caller(&req)?;
        let pid = convert::pid(req.into_inner().pid)?;
        allow(&caller, pid)?;
        let core = self.core.clone();
        let (w, t) = blocking(move || core.detach(pid)).await?;
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
            if !caller.privileged && p.caller.uid != caller.uid {
                return Err(status::to_status(&WpdError::NoSuchWatchpoint(id)));
            }
            let core = self.core.clone();
            let view = blocking(move || core.remove_policy(id)).await?;
            self.forget_saved(id.0).await;
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
        let pid = self
            .core
            .watch_pid(id)
            .ok_or_else(|| status::to_status(&WpdError::NoSuchWatchpoint(id)))?;
        allow(&caller, pid)?;
        let core = self.core.clone();
        let view = blocking(move || core.remove_watchpoint(id)).await?;
        self.forget_saved(id.0).await;
        Ok(Response::new(pb::RemoveWatchpointResponse {
            watchpoint: Some((&view).into()),
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
        if pid > 0 {
            allow(&caller, pid)?;
        }
        let (mut ws, mut ps) = self.core.list((pid > 0).then_some(pid));
        // A caller sees only the processes it could trace itself.
        if !caller.privileged {
            ps.retain(|p| authz::check(&caller, p.pid).is_ok());
            ws.retain(|w| ps.iter().any(|p| p.pid == w.spec.pid));
        }
        let mut policies = self.core.list_policies((pid > 0).then_some(pid));
        if !caller.privileged {
            policies.retain(|p| {
                self.core
                    .policy(p.id)
                    .is_some_and(|q| q.caller.uid == caller.uid)
            });
        }
        Ok(Response::new(pb::ListWatchpointsResponse {
            watchpoints: ws.iter().map(Into::into).collect(),
            processes: ps.iter().map(Into::into).collect(),
            policies: policies.iter().map(Into::into).collect(),
            not_restored: match &self.persist {
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
        let pid = convert::pid(r.pid)?;
        let tids = convert::tids(&r.tids)?;
        allow(&caller, pid)?;
        let core = self.core.clone();
        let threads = blocking(move || core.threads(pid, &tids, r.probe)).await?;
        Ok(Response::new(pb::ListThreadsResponse {
            pid,
            threads: threads.iter().map(Into::into).collect(),
            slots_per_thread: arch::current::SLOTS as u32,
        }))
    }

    type StreamEventsStream = EventStream;

    async fn stream_events(
        &self,
        req: Request<pb::StreamEventsRequest>,
    ) -> Result<Response<Self::StreamEventsStream>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        if r.pid < 0 {
            return Err(status::to_status(&WpdError::InvalidArgument(format!(
                "pid must be 0 (all) or positive, got {}",
                r.pid
            ))));
        }
        if r.pid > 0 {
            allow(&caller, r.pid)?;
        }
        let from = match (r.after_seq, r.since_time_ns) {
            (Some(a), _) => Some(crate::journal::From::AfterSeq(a)),
            (None, Some(t)) => Some(crate::journal::From::SinceTime(t)),
            (None, None) => None,
        };
        let journal = match from {
            Some(_) => Some(
                self.core
                    .journal
                    .get()
                    .cloned()
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
            let filter = replay::Filter::new(caller, &r);
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
        let pid = convert::pid(r.pid)?;
        let tids = convert::tids(&r.tids)?;
        allow(&caller, pid)?;
        let core = self.core.clone();
        let resumed = blocking(move || core.resume(pid, &tids)).await?;
        Ok(Response::new(pb::ResumeResponse { resumed }))
    }

    async fn pause(
        &self,
        req: Request<pb::PauseRequest>,
    ) -> Result<Response<pb::PauseResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let pid = convert::pid(r.pid)?;
        let tids = convert::tids(&r.tids)?;
        allow(&caller, pid)?;
        if r.lease != 0 {
            self.leases.check(r.lease, caller.uid)?;
        }
        let core = self.core.clone();
        let held = blocking(move || core.pause(pid, &tids)).await?;
        if r.lease != 0 && !self.leases.add_pause(r.lease, pid) {
            let core = self.core.clone();
            blocking(move || {
                leases::undo(&core, &[], &[pid].into());
                Ok(())
            })
            .await?;
            return Err(status::to_status(&WpdError::InvalidArgument(format!(
                "lease {} ended during the pause: the threads run again",
                r.lease
            ))));
        }
        Ok(Response::new(pb::PauseResponse { held }))
    }

    async fn get_thread_stack(
        &self,
        req: Request<pb::GetThreadStackRequest>,
    ) -> Result<Response<pb::GetThreadStackResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let pid = convert::pid(r.pid)?;
        let tid = convert::tids(&[r.tid])?[0];
        let depth = convert::stack_depth(r.depth)?;
        allow(&caller, pid)?;
        let core = self.core.clone();
        let stack = blocking(move || core.thread_stack(pid, tid, depth)).await?;
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
        }))
    }

    async fn read_memory(
        &self,
        req: Request<pb::ReadMemoryRequest>,
    ) -> Result<Response<pb::ReadMemoryResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let pid = convert::pid(r.pid)?;
        let len = convert::read_length(r.address, r.length)?;
        allow(&caller, pid)?;
        let core = self.core.clone();
        let (data, error) = blocking(move || core.read_memory(pid, r.address, len)).await?;
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
        allow(&caller, pid)?;
        let mut hits = Vec::with_capacity(kept.len());
        for ev in kept {
            let mut item = convert::event_to_pb(&ev);
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
        Ok(Response::new(pb::GetRecentHitsResponse { hits, total }))
    }

    async fn get_hit_aggregates(
        &self,
        req: Request<pb::GetHitAggregatesRequest>,
    ) -> Result<Response<pb::GetHitAggregatesResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let id = WatchId(r.watchpoint_id);
        let (pid, (hits, exemplars, overflow), top, image) =
            self.core.hit_aggregates(id, r.limit as usize)?;
        allow(&caller, pid)?;
        let frames = match (&image, r.raw) {
            (Some(image), false) => {
                let ips: Vec<u64> = top.iter().map(|t| t.0.0).collect();
                self.core.symbols.frames(image, &ips).await
            }
            _ => Vec::new(),
        };
        let aggregates = top
            .iter()
            .enumerate()
            .map(|(i, ((ip, tid), a))| pb::HitAggregate {
                ip: *ip,
                location: frames.get(i).map(convert::frame_to_pb),
                tid: *tid,
                thread_name: a.thread_name.to_string(),
                count: a.count,
                first_ns: a.first_ns,
                last_ns: a.last_ns,
                values: a.values.clone(),
            })
            .collect();
        Ok(Response::new(pb::GetHitAggregatesResponse {
            watchpoint_id: id.0,
            pid,
            hits,
            exemplars,
            overflow,
            aggregates,
        }))
    }

    async fn get_stats(
        &self,
        req: Request<pb::GetStatsRequest>,
    ) -> Result<Response<pb::GetStatsResponse>, Status> {
        let caller = self.caller(&req)?;
        Ok(Response::new(self.stats(caller).await?))
    }

    async fn resolve_symbol(
        &self,
        req: Request<pb::ResolveSymbolRequest>,
    ) -> Result<Response<pb::ResolveSymbolResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let pid = convert::pid(r.pid)?;
        allow(&caller, pid)?;
        let name = r.name.trim().to_string();
        if name.is_empty() == (r.address == 0) {
            return Err(status::to_status(&WpdError::InvalidArgument(
                "give a name or an address (exactly one)".into(),
            )));
        }
        let symbols = self.core.symbols.clone();
        if !name.is_empty() {
            let resolved = blocking(move || {
                crate::procfs::check_process(pid)?;
                // As a watchpoint would take it: a variable, or else a
                // function (its entry).
                symbols
                    .resolve(pid, &name, crate::model::Access::Write, 0)
                    .or_else(|e| match e {
                        crate::symbols::SymbolError::NotAVariable { .. } => {
                            symbols.resolve(pid, &name, crate::model::Access::Exec, 0)
                        }
                        e => Err(e),
                    })
                    .map_err(WpdError::from)
            })
            .await?;
            let kind = if resolved.type_name.is_none() && resolved.size == 1 {
                "function"
            } else {
                "variable"
            };
            return Ok(Response::new(pb::ResolveSymbolResponse {
                symbol: Some(convert::symbol_to_pb(&resolved)),
                location: None,
                kind: kind.into(),
                offset: 0,
            }));
        }
        let addr = r.address;
        let s2 = symbols.clone();
        let info = blocking(move || {
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
        let (symbol, kind, offset) = match &info.symbol {
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
                }),
                kind.to_string(),
                addr - start,
            ),
            None => (None, String::new(), 0),
        };
        Ok(Response::new(pb::ResolveSymbolResponse {
            symbol,
            location,
            kind,
            offset,
        }))
    }
}

/// Least time between two wake-ups of a subscriber's stream while events
/// keep coming. An event after a quiet spell goes out at once; the next
/// ones within this time wait for its end and go out together. Each
/// wake-up costs the daemon tens of µs (worker unpark, HTTP/2 write), as
/// much as the work of a ptrace hit itself.
const PACE: std::time::Duration = std::time::Duration::from_millis(1);

/// One subscriber's event stream, polled by tonic itself: the event bus
/// wakes the connection's task directly, with no task or channel in
/// between, and events that are already queued go out together (tonic
/// encodes every ready message into one HTTP/2 write). While events keep
/// coming, the stream wakes at most once per [`PACE`]. It ends at daemon
/// shutdown; tonic drops it when the client goes away.
struct EventFeed {
    /// Sent before any event (the lease's name).
    greeting: Option<pb::StreamEventsResponse>,
    /// Ends with the stream (dropped with it).
    _lease: Option<leases::LeaseGuard>,
    events: tokio_stream::wrappers::BroadcastStream<Arc<Event>>,
    /// This subscriber's loss accounting.
    sub: crate::events::SubGuard,
    shutdown: tokio_stream::wrappers::WatchStream<bool>,
    caller: Caller,
    /// Only this process (0: all).
    pid: Pid,
    /// Only hits of these watchpoints (empty: all).
    ids: Vec<WatchId>,
    hits_only: bool,
    /// Who this subscriber may see, decided once per process identity.
    visible: authz::Visibility,
    /// An event taken from the bus and held until the pacer lets it go.
    stash: Option<Result<Arc<Event>, BroadcastStreamRecvError>>,
    /// The bus had nothing left at the last poll.
    dry: bool,
    pacer: Pacer,
    /// Symbolizes hits (None: the subscriber asked for raw hits).
    symbols: Option<Arc<crate::symbols::Symbols>>,
    /// A hit waiting for the symbolizer (its addresses were not cached).
    locating: Option<(pb::StreamEventsResponse, Locating)>,
}

/// The symbolizer's answer for one hit.
type Locating = Pin<Box<dyn Future<Output = Vec<crate::symbols::Frame>> + Send>>;

/// Spaces a stream's wake-ups at least [`PACE`] apart while events keep
/// coming; the first wake-up after a quiet spell is not delayed.
#[derive(Default)]
struct Pacer {
    /// When the stream last woke up to a new event (or will, when `wait`
    /// ends).
    woke_at: Option<tokio::time::Instant>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Pacer {
    /// The stream woke up to a new event after running dry: Ready to
    /// deliver it now, Pending until the pace ends (`cx` is woken then).
    fn woken(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let now = tokio::time::Instant::now();
        match self.woke_at {
            Some(prev) if now < prev + PACE => {
                self.woke_at = Some(prev + PACE);
                let mut wait = Box::pin(tokio::time::sleep_until(prev + PACE));
                if wait.as_mut().poll(cx).is_pending() {
                    self.wait = Some(wait);
                    return std::task::Poll::Pending;
                }
                std::task::Poll::Ready(())
            }
            _ => {
                self.woke_at = Some(now);
                std::task::Poll::Ready(())
            }
        }
    }

    /// Pending while a wait started by [`Pacer::woken`] runs.
    fn poll_wait(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if let Some(wait) = self.wait.as_mut() {
            if wait.as_mut().poll(cx).is_pending() {
                return std::task::Poll::Pending;
            }
            self.wait = None;
        }
        std::task::Poll::Ready(())
    }
}

impl EventFeed {
    /// The live feed of subscription `sub` for request `r`.
    fn new(
        caller: Caller,
        r: &pb::StreamEventsRequest,
        sub: crate::events::Subscription,
        greeting: Option<pb::StreamEventsResponse>,
        lease: Option<leases::LeaseGuard>,
        closed: tokio::sync::watch::Receiver<bool>,
        symbols: Option<Arc<crate::symbols::Symbols>>,
    ) -> Self {
        EventFeed {
            greeting,
            _lease: lease,
            events: tokio_stream::wrappers::BroadcastStream::new(sub.rx),
            sub: sub.guard,
            shutdown: tokio_stream::wrappers::WatchStream::new(closed),
            caller,
            pid: r.pid,
            ids: r.watchpoint_ids.iter().map(|&i| WatchId(i)).collect(),
            hits_only: r.hits_only,
            visible: authz::Visibility::default(),
            stash: None,
            dry: true,
            pacer: Pacer::default(),
            symbols,
            locating: None,
        }
    }

    /// The message for `ev`, or None if this subscriber does not get it.
    fn pass(&mut self, ev: &Event) -> Option<pb::StreamEventsResponse> {
        let global = matches!(ev.kind, EventKind::RecordsLost { .. });
        if self.pid != 0 && ev.kind.pid() != self.pid && !global {
            return None;
        }
        if !global && !self.caller.privileged {
            let pid = ev.kind.pid();
            // An exec may have changed who may see the process (a setuid
            // program), an exit ends it: decide again from the next event
            // on.
            if matches!(
                &ev.kind,
                EventKind::WatchpointRemoved { .. }
                    | EventKind::WatchpointResolved { .. }
                    | EventKind::ProcessLost { .. }
                    | EventKind::ProcessExited { .. }
            ) {
                self.visible.forget(pid);
            }
            if !self.visible.may_see(&self.caller, pid, ev.owner.as_deref()) {
                return None;
            }
        }
        match &ev.kind {
            EventKind::Hit(h) if !self.ids.is_empty() && !self.ids.contains(&h.id) => None,
            EventKind::Hit(_) => Some(convert::event_to_pb(ev)),
            _ if self.hits_only => None,
            _ => Some(convert::event_to_pb(ev)),
        }
    }
}

impl Stream for EventFeed {
    type Item = Result<pb::StreamEventsResponse, Status>;

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = self.get_mut();
        // The first poll yields the current value; later ones, changes.
        while let Poll::Ready(closed) = Pin::new(&mut this.shutdown).poll_next(cx) {
            if closed != Some(false) {
                return Poll::Ready(None);
            }
        }
        if let Some(g) = this.greeting.take() {
            return Poll::Ready(Some(Ok(g)));
        }
        if let Some((_, fut)) = &mut this.locating {
            let Poll::Ready(frames) = fut.as_mut().poll(cx) else {
                return Poll::Pending;
            };
            let (mut item, _) = this.locating.take().expect("just polled");
            convert::locate_hit(&mut item, &frames);
            return Poll::Ready(Some(Ok(item)));
        }
        if this.pacer.poll_wait(cx).is_pending() {
            return Poll::Pending;
        }
        loop {
            let got =
                match this.stash.take() {
                    Some(got) => got,
                    // Outside tokio's cooperative budget: a Pending here must
                    // mean "nothing left", not "budget spent", or a backlog
                    // would be paced every 128 events.
                    None => match std::pin::pin!(tokio::task::unconstrained(std::future::poll_fn(
                        |cx| Pin::new(&mut this.events).poll_next(cx)
                    )))
                    .poll(cx)
                    {
                        Poll::Pending => {
                            this.dry = true;
                            return Poll::Pending;
                        }
                        Poll::Ready(None) => return Poll::Ready(None),
                        Poll::Ready(Some(got)) => got,
                    },
                };
            if std::mem::take(&mut this.dry) && this.pacer.woken(cx).is_pending() {
                this.stash = Some(got);
                return Poll::Pending;
            }
            match got {
                Ok(ev) => {
                    this.sub.state.received(ev.seq);
                    if let Some(mut item) = this.pass(&ev) {
                        if let (EventKind::Hit(h), Some(symbols)) = (&ev.kind, &this.symbols)
                            && let Some(image) = &h.image
                        {
                            // The common case, a hit without a call chain at a
                            // known address: one lookup, nothing allocated.
                            if h.callchain.is_empty()
                                && let Some(frame) =
                                    crate::symbols::locate::cached_frame(image, h.ip)
                            {
                                convert::locate_hit(&mut item, std::slice::from_ref(&frame));
                                return Poll::Ready(Some(Ok(item)));
                            }
                            let mut ips = Vec::with_capacity(1 + h.callchain.len());
                            ips.push(h.ip);
                            ips.extend_from_slice(&h.callchain);
                            match crate::symbols::locate::cached_frames(image, &ips) {
                                Some(frames) => convert::locate_hit(&mut item, &frames),
                                None => {
                                    let (symbols, image) = (symbols.clone(), image.clone());
                                    let fut: Locating =
                                        Box::pin(async move { symbols.frames(&image, &ips).await });
                                    this.locating = Some((item, fut));
                                    return Pin::new(this).poll_next(cx);
                                }
                            }
                        }
                        return Poll::Ready(Some(Ok(item)));
                    }
                }
                Err(BroadcastStreamRecvError::Lagged(n)) => {
                    let (first_seq, last_seq) = this.sub.state.lost(n);
                    return Poll::Ready(Some(Ok(pb::StreamEventsResponse {
                        seq: last_seq,
                        time_ns: crate::clock::realtime_ns(),
                        owner: None,
                        event: Some(pb::stream_events_response::Event::Dropped(
                            pb::EventsDropped {
                                count: n,
                                first_seq,
                                last_seq,
                            },
                        )),
                    })));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{PACE, Pacer};
    use std::task::Context;

    #[tokio::test(start_paused = true)]
    async fn pacer_lets_a_wake_up_after_quiet_through_and_spaces_the_next_ones() {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut p = Pacer::default();
        assert!(p.woken(&mut cx).is_ready(), "first wake-up goes at once");
        assert!(p.poll_wait(&mut cx).is_ready());

        assert!(
            p.woken(&mut cx).is_pending(),
            "a second one within PACE waits"
        );
        assert!(p.poll_wait(&mut cx).is_pending());
        tokio::time::advance(PACE / 2).await;
        assert!(p.poll_wait(&mut cx).is_pending(), "still within the pace");
        tokio::time::advance(PACE / 2).await;
        assert!(
            p.poll_wait(&mut cx).is_ready(),
            "released when the pace ends"
        );

        tokio::time::advance(PACE / 4).await;
        assert!(
            p.woken(&mut cx).is_pending(),
            "the released batch counts as a wake-up: the next one waits again"
        );
        tokio::time::advance(PACE).await;
        assert!(p.poll_wait(&mut cx).is_ready());

        tokio::time::advance(PACE * 5).await;
        assert!(p.woken(&mut cx).is_ready(), "after a quiet spell, at once");
    }
}
