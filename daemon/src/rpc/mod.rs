//! The gRPC layer: the only module that knows tonic. Each handler
//! decodes its request (`convert` validates; `nsview` translates the pids
//! of callers in nested pid namespaces), makes one call to the service
//! (`crate::service`: checks, leases, persist-or-undo; it runs the core's
//! blocking work off the async workers) and encodes the answer in the
//! caller's view (`answers`), mapping errors to their status (`status`).
//!
//! Architecture Invariant: no ptrace/perf syscall runs on a tokio worker;
//! no lock is held across `.await`.

pub mod answers;
pub mod auth;
pub mod authority;
pub mod conn;
mod feed;
pub mod metrics;
pub mod nsview;
pub mod replay;
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

use crate::authz::Caller;
use crate::convert;
use crate::error::WpdError;
use crate::model::WatchId;
use crate::service::Service;
use crate::service::watch::{SetPolicy, SetWatch, policy_code_allowed};
use feed::EventFeed;

/// The gRPC service: the service layer, the callers' authentication, and
/// the connections (for stats).
#[derive(Debug, Clone)]
pub struct Api {
    service: Service,
    auth: Arc<auth::AuthConfig>,
    conns: Arc<conn::Registry>,
}

impl Api {
    /// The API over `service`; `conns` counts its connections (stats).
    pub fn new(service: Service, auth: auth::AuthConfig, conns: Arc<conn::Registry>) -> Self {
        Api {
            service,
            auth: Arc::new(auth),
            conns,
        }
    }

    /// The service it serves.
    pub fn service(&self) -> &Service {
        &self.service
    }

    /// How callers without a socket identity authenticate (TCP).
    pub fn auth_config(&self) -> auth::AuthConfig {
        (*self.auth).clone()
    }

    fn caller<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        Ok(auth::caller(&self.auth, req)?)
    }
}

/// A service error as the caller sees it: in its numbers, as a status.
fn out(caller: &Caller) -> impl Fn(WpdError) -> Status + '_ {
    move |e| nsview::error_out(caller, e).into()
}

/// A request's pid in the daemon's numbers (validated, translated).
fn pid_in(caller: &Caller, asked: i32) -> Result<crate::model::Pid, Status> {
    Ok(nsview::pid_in(caller, convert::pid(asked)?)?)
}

/// A request's pid and thread ids in the daemon's numbers.
fn tids_in(
    caller: &Caller,
    asked: i32,
    tids: &[i32],
) -> Result<(crate::model::Pid, Vec<crate::model::Tid>), Status> {
    let pid = pid_in(caller, asked)?;
    let tids = convert::tids(&nsview::tids_in(caller, convert::pid(asked)?, pid, tids)?)?;
    Ok((pid, tids))
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::StreamEventsItem, Status>> + Send>>;

#[tonic::async_trait]
impl Watchpoints for Api {
    async fn get_capabilities(
        &self,
        req: Request<pb::GetCapabilitiesRequest>,
    ) -> Result<Response<pb::GetCapabilitiesResponse>, Status> {
        self.caller(&req)?;
        Ok(Response::new(answers::capabilities(self.service.core())))
    }

    async fn attach(
        &self,
        req: Request<pb::AttachRequest>,
    ) -> Result<Response<pb::AttachResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let pid = pid_in(&caller, r.pid)?;
        let attached = self.service.core().process_view(pid).is_some();
        nsview::init_in(&caller, r.pid, r.allow_init, attached)?;
        let backend = convert::backend(r.backend)?;
        let (view, newly) = self
            .service
            .attach(&caller, pid, backend, r.allow_init)
            .await
            .map_err(out(&caller))?;
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
        let pid = pid_in(&caller, req.into_inner().pid)?;
        let (w, t) = self
            .service
            .detach(&caller, pid)
            .await
            .map_err(out(&caller))?;
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
        let mut asked = req.into_inner().spec.ok_or_else(|| {
            status::to_status(&WpdError::InvalidArgument("spec is required".into()))
        })?;
        // The daemon's numbers from here on (and on disk).
        let asked_pid = asked.pid;
        nsview::spec_in(&caller, &mut asked)?;
        let (spec, code) = convert::watch_request(&asked)?;
        let attached = self.service.core().process_view(spec.pid).is_some();
        nsview::init_in(&caller, asked_pid, spec.allow_init, attached)?;
        let req = SetWatch {
            asked,
            spec,
            code,
            id: None,
        };
        let set = self
            .service
            .set_watchpoint(&caller, req)
            .await
            .map_err(out(&caller))?;
        let backend = self
            .service
            .core()
            .process_view(set.pid())
            .map(|p| p.backend);
        Ok(Response::new(answers::set_watchpoint(
            &caller, &set, asked_pid, backend,
        )))
    }

    async fn set_policy(
        &self,
        req: Request<pb::SetPolicyRequest>,
    ) -> Result<Response<pb::SetPolicyResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let asked_spec = r.spec.ok_or_else(|| {
            status::to_status(&WpdError::InvalidArgument("spec is required".into()))
        })?;
        // In the daemon's terms (pids, cgroup path) from here on, and on
        // disk: a caller the daemon cannot number is refused.
        let mut asked_selector = r.selector.unwrap_or_default();
        nsview::selector_in(&caller, &mut asked_selector)?;
        let code = convert::code_from_pb(&asked_spec)?;
        policy_code_allowed(code.as_ref()).map_err(out(&caller))?;
        let req = SetPolicy {
            code,
            spec: convert::policy_spec_from_pb(asked_spec.clone())?,
            selector: convert::selector_from_pb(Some(asked_selector.clone()))
                .map_err(|e| nsview::error_out(&caller, e))?,
            asked_selector,
            asked_spec,
            id: None,
        };
        let view = self
            .service
            .set_policy(&caller, req)
            .await
            .map_err(out(&caller))?;
        let mut policy: pb::Policy = (&view).into();
        nsview::policy_out(&caller, &mut policy, &view.refusals);
        Ok(Response::new(pb::SetPolicyResponse {
            policy: Some(policy),
        }))
    }

    async fn remove_watchpoint(
        &self,
        req: Request<pb::RemoveWatchpointRequest>,
    ) -> Result<Response<pb::RemoveWatchpointResponse>, Status> {
        let caller = self.caller(&req)?;
        let id = WatchId(req.into_inner().id);
        let removed = self
            .service
            .remove(&caller, id)
            .await
            .map_err(out(&caller))?;
        Ok(Response::new(answers::removed(&caller, &removed)))
    }

    async fn list_watchpoints(
        &self,
        req: Request<pb::ListWatchpointsRequest>,
    ) -> Result<Response<pb::ListWatchpointsResponse>, Status> {
        let caller = self.caller(&req)?;
        let pid = match req.into_inner().pid {
            p if p > 0 => nsview::pid_in(&caller, p)?,
            p => p,
        };
        let listing = self.service.list(&caller, pid).map_err(out(&caller))?;
        let not_restored = answers::not_restored(&caller, self.service.persist(), pid);
        Ok(Response::new(answers::listing(
            &caller,
            &listing,
            not_restored,
        )))
    }

    async fn list_threads(
        &self,
        req: Request<pb::ListThreadsRequest>,
    ) -> Result<Response<pb::ListThreadsResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let (pid, tids) = tids_in(&caller, r.pid, &r.tids)?;
        let threads = self
            .service
            .threads(&caller, pid, tids, r.probe)
            .await
            .map_err(out(&caller))?;
        let mut threads: Vec<pb::ThreadInfo> = threads.iter().map(Into::into).collect();
        nsview::threads_out(&caller, pid, &mut threads);
        Ok(Response::new(pb::ListThreadsResponse {
            pid: r.pid,
            threads,
            slots_per_thread: crate::arch::current::SLOTS as u32,
        }))
    }

    type StreamEventsStream = EventStream;

    async fn stream_events(
        &self,
        req: Request<pb::StreamEventsRequest>,
    ) -> Result<Response<Self::StreamEventsStream>, Status> {
        let caller = self.caller(&req)?;
        Ok(Response::new(self.events(caller, req.into_inner())?))
    }

    async fn resume(
        &self,
        req: Request<pb::ResumeRequest>,
    ) -> Result<Response<pb::ResumeResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let (pid, tids) = tids_in(&caller, r.pid, &r.tids)?;
        let mut resumed = self
            .service
            .resume(&caller, pid, tids)
            .await
            .map_err(out(&caller))?;
        nsview::tids_out(&caller, pid, &mut resumed);
        Ok(Response::new(pb::ResumeResponse { resumed }))
    }

    async fn pause(
        &self,
        req: Request<pb::PauseRequest>,
    ) -> Result<Response<pb::PauseResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let (pid, tids) = tids_in(&caller, r.pid, &r.tids)?;
        let mut held = self
            .service
            .pause(&caller, pid, tids, r.lease)
            .await
            .map_err(out(&caller))?;
        nsview::tids_out(&caller, pid, &mut held);
        Ok(Response::new(pb::PauseResponse { held }))
    }

    async fn get_thread_stack(
        &self,
        req: Request<pb::GetThreadStackRequest>,
    ) -> Result<Response<pb::GetThreadStackResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let (pid, tids) = tids_in(&caller, r.pid, &[r.tid])?;
        let depth = convert::stack_depth(r.depth)?;
        let stack = self
            .service
            .thread_stack(&caller, pid, tids[0], depth, r.locals)
            .await
            .map_err(out(&caller))?;
        let at = answers::lookup_addresses(&stack);
        let frames = match (&stack.image, r.raw) {
            (Some(image), false) => {
                let frames = self.service.core().symbols.frames_at(image, &at).await;
                frames.iter().map(convert::frame_to_pb).collect()
            }
            _ => answers::raw_locations(&at),
        };
        Ok(Response::new(answers::thread_stack(&stack, frames)))
    }

    async fn step(
        &self,
        req: Request<pb::StepRequest>,
    ) -> Result<Response<pb::StepResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let (pid, tids) = tids_in(&caller, r.pid, &[r.tid])?;
        let (kind, depth) = step::request(&r)?;
        // Set if the call is dropped (the client went away).
        let cancel = step::Cancel(Default::default());
        let done = self
            .service
            .step(
                &caller,
                pid,
                tids[0],
                kind,
                r.others_run,
                depth,
                cancel.0.clone(),
            )
            .await
            .map_err(out(&caller))?;
        drop(cancel);
        Ok(Response::new(
            step::response(self.service.core(), done).await,
        ))
    }

    async fn write_memory(
        &self,
        req: Request<pb::WriteMemoryRequest>,
    ) -> Result<Response<pb::WriteMemoryResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let pid = pid_in(&caller, r.pid)?;
        if r.data.is_empty() || r.data.len() > step::MAX_WRITE {
            let why = format!("data: 1 to {} bytes", step::MAX_WRITE);
            return Err(WpdError::InvalidArgument(why).into());
        }
        let (written, error) = self
            .service
            .write_memory(&caller, pid, r.address, r.data)
            .await
            .map_err(out(&caller))?;
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
        let pid = pid_in(&caller, r.pid)?;
        let len = convert::read_length(r.address, r.length)?;
        let (data, error) = self
            .service
            .read_memory(&caller, pid, r.address, len)
            .await
            .map_err(out(&caller))?;
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
        let (kept, pid, total) = self
            .service
            .recent_hits(&caller, id, r.limit as usize)
            .map_err(out(&caller))?;
        let hits = values::hits_out(self.service.core(), &caller, pid, &kept, r.raw).await;
        let value_type = values::reading(self.service.core(), id).map(|r| r.0);
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
        let aggs = self
            .service
            .hit_aggregates(&caller, id, r.limit as usize)
            .map_err(out(&caller))?;
        let answer = values::aggregates_out(self.service.core(), &caller, id, &aggs, r.raw).await;
        Ok(Response::new(answer))
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
        let pid = pid_in(&caller, r.pid)?;
        let (views, total) = self
            .service
            .list_variables(&caller, pid, r.expression, r.start, r.count)
            .await
            .map_err(out(&caller))?;
        Ok(Response::new(answers::variables(views, total)))
    }

    async fn resolve_symbol(
        &self,
        req: Request<pb::ResolveSymbolRequest>,
    ) -> Result<Response<pb::ResolveSymbolResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let pid = pid_in(&caller, r.pid)?;
        let name = r.name.trim().to_string();
        if name.is_empty() == (r.address == 0) {
            let why = "give a name or an address (exactly one)".to_string();
            return Err(WpdError::InvalidArgument(why).into());
        }
        if name.is_empty() {
            return Ok(Response::new(
                self.resolve_address(&caller, pid, r.address).await?,
            ));
        }
        let frame = match r.tid {
            0 => None,
            t => Some((tids_in(&caller, r.pid, &[t])?.1[0], r.frame as usize)),
        };
        let named = self
            .service
            .resolve_name(&caller, pid, name, frame)
            .await
            .map_err(out(&caller))?;
        Ok(Response::new(values::named_out(named)))
    }
}

impl Api {
    /// `ResolveSymbol` of an address.
    async fn resolve_address(
        &self,
        caller: &Caller,
        pid: crate::model::Pid,
        addr: u64,
    ) -> Result<pb::ResolveSymbolResponse, Status> {
        let info = self
            .service
            .describe_address(caller, pid, addr)
            .await
            .map_err(out(caller))?;
        let image = crate::symbols::Image::new(pid);
        // At the address itself (no `- 1`: it is not a return address).
        let frames = self
            .service
            .core()
            .symbols
            .frames(&image, &[addr.wrapping_add(1)])
            .await;
        let mut location = frames.first().map(convert::frame_to_pb);
        if let Some(l) = &mut location {
            l.ip = addr;
        }
        let (symbol, kind, offset) = convert::address_to_pb(&info, addr);
        Ok(pb::ResolveSymbolResponse {
            symbol,
            location,
            kind,
            offset,
            ..Default::default()
        })
    }

    /// A `StreamEvents` stream for `caller`: live, or replayed from the
    /// journal first when it asks to start from a point.
    fn events(
        &self,
        caller: Caller,
        mut r: pb::StreamEventsRequest,
    ) -> Result<EventStream, Status> {
        if r.pid < 0 {
            let why = format!("pid must be 0 (all) or positive, got {}", r.pid);
            return Err(WpdError::InvalidArgument(why).into());
        }
        let core = self.service.core().clone();
        if r.pid > 0 {
            // The feed filters by the daemon's number (and translates what
            // it sends back).
            r.pid = nsview::pid_in(&caller, r.pid)?;
            self.service.allow(&caller, r.pid).map_err(out(&caller))?;
        }
        let replay = replay_from(&r, &core)?;
        // A replay subscribes once it has caught up; the limits apply now.
        let sub = core.subscribe(caller.uid, caller.privileged)?;
        let lease = r.lease.then(|| self.service.leases().open(caller.uid));
        let greeting = lease.as_ref().map(|l| pb::StreamEventsResponse {
            seq: 0,
            time_ns: crate::clock::realtime_ns(),
            owner: None,
            event: Some(pb::stream_events_response::Event::Leased(pb::Leased {
                lease: l.id,
            })),
        });
        let symbols = (!r.raw).then(|| core.symbols.clone());
        let closed = core.bus.closed();
        let Some((from, journal)) = replay else {
            return Ok(Box::pin(EventFeed::new(
                caller, &r, sub, greeting, lease, closed, symbols,
            )));
        };
        drop(sub);
        let filter = replay::Filter::new(caller.clone(), &r);
        let steps = replay::start(core, journal, from, filter);
        let shutdown = tokio_stream::wrappers::WatchStream::new(closed.clone());
        let make_live = Box::new(move |sub: crate::events::Subscription| {
            EventFeed::new(caller, &r, sub, None, lease, closed, symbols)
        });
        Ok(Box::pin(replay::ReplayFeed {
            greeting,
            steps,
            make_live: Some(make_live),
            live: None,
            shutdown,
        }))
    }
}

/// Where a replay asked by `r` starts, and the journal it reads; `None`
/// for a live stream.
fn replay_from(
    r: &pb::StreamEventsRequest,
    core: &crate::engine::Core,
) -> Result<Option<(crate::journal::Start, Arc<crate::journal::Journal>)>, Status> {
    let from = match (r.after_seq, r.since_time_ns) {
        (Some(a), _) => crate::journal::Start::AfterSeq(a),
        (None, Some(t)) => crate::journal::Start::SinceTime(t),
        (None, None) => return Ok(None),
    };
    let journal = core
        .journal
        .clone()
        .ok_or_else(|| status::to_status(&WpdError::NoJournal))?;
    Ok(Some((from, journal)))
}
