//! The session's start and end: `initialize`, `attach`, `configurationDone`,
//! and `disconnect`/`terminate` with the cleanup every way out runs.

use serde::de::IgnoredAny;
use serde_json::Value;
use tokio_stream::StreamExt as _;
use wpd_proto::v1 as pb;

use super::{Handler, Input, Session, StopMode, backend_name};
use crate::error::{DapError, status_text};
use crate::protocol::Capabilities;
use crate::protocol::events::{Initialized, Process};
use crate::protocol::requests::*;

impl Handler<Initialize> for Session {
    async fn handle(&mut self, a: InitializeArguments) -> Result<Capabilities, DapError> {
        self.terminal = a.supports_run_in_terminal_request;
        Ok(Capabilities::wpd())
    }
}

impl Handler<ConfigurationDone> for Session {
    async fn handle(&mut self, _: IgnoredAny) -> Result<(), DapError> {
        // A launched program starts now, its breakpoints armed.
        self.run_launched().await
    }
}

impl Handler<Attach> for Session {
    async fn handle(&mut self, a: AttachArguments) -> Result<(), DapError> {
        if self.pid.is_some() {
            return Err(DapError::AlreadyAttached);
        }
        let pid = match a.pid.as_ref().or(a.process_id.as_ref()) {
            Some(Value::Number(n)) => n.as_i64(),
            Some(Value::String(s)) => s.trim().parse().ok(),
            _ => None,
        }
        .and_then(|p| i32::try_from(p).ok())
        .filter(|&p| p > 0)
        .ok_or(DapError::BadPid)?;
        let (backend, mode) = modes(a.backend.as_deref(), a.stop_on_hit.as_deref())?;
        self.attach_to(pid, backend, mode, "attach").await?;
        self.event_after_response(&Initialized {});
        Ok(())
    }
}

/// The backend and stop mode an `attach` or `launch` asks for.
pub(super) fn modes(
    backend: Option<&str>,
    stop_on_hit: Option<&str>,
) -> Result<(pb::Backend, StopMode), DapError> {
    let backend = match backend {
        None | Some("ptrace") => pb::Backend::Ptrace,
        Some("perf") => pb::Backend::Perf,
        Some(b) => return Err(DapError::BadBackend(b.to_string())),
    };
    let mode = match (backend, stop_on_hit) {
        (pb::Backend::Perf, _) => StopMode::Never,
        (_, None | Some("all")) => StopMode::All,
        (_, Some("thread")) => StopMode::Thread,
        (_, Some(m)) => return Err(DapError::BadStopOnHit(m.to_string())),
    };
    Ok((backend, mode))
}

impl Session {
    /// Subscribes to `pid`'s events with a lease, then attaches it.
    pub(super) async fn attach_to(
        &mut self,
        pid: i32,
        backend: pb::Backend,
        mode: StopMode,
        start_method: &'static str,
    ) -> Result<(), DapError> {
        self.mode = mode;
        // Subscribe first: no hit of ours can come before it.
        let mut stream = self
            .client()
            .stream_events(self.daemon.request(pb::StreamEventsRequest {
                pid,
                lease: true,
                ..Default::default()
            }))
            .await?
            .into_inner();
        // The first item names the lease.
        match stream.next().await {
            Some(Ok(pb::StreamEventsResponse {
                event: Some(pb::stream_events_response::Event::Leased(l)),
                ..
            })) => self.lease = l.lease,
            Some(Err(s)) => return Err(s.into()),
            _ => return Err(DapError::NoLease),
        }
        let resp = self
            .client()
            .attach(self.daemon.request(pb::AttachRequest {
                pid,
                backend: backend as i32,
                allow_init: false,
            }))
            .await?
            .into_inner();
        let actual = resp.process.as_ref().map(|p| p.backend).unwrap_or(0);
        if actual != backend as i32 {
            return Err(DapError::BackendMismatch {
                pid,
                actual: backend_name(actual),
            });
        }
        self.pid = Some(pid);
        self.attached_by_us = resp.newly_attached;
        let tx = self.inputs.clone();
        self.events = Some(tokio::spawn(async move {
            loop {
                match stream.next().await {
                    Some(Ok(ev)) => {
                        if tx.send(Input::Event(Box::new(ev))).await.is_err() {
                            return;
                        }
                    }
                    Some(Err(s)) => {
                        let _ = tx.send(Input::EventsEnded(status_text(&s))).await;
                        return;
                    }
                    None => {
                        let _ = tx.send(Input::EventsEnded("closed".into())).await;
                        return;
                    }
                }
            }
        }));
        if let Some(p) = resp.process {
            self.send_event(&Process {
                name: p.comm,
                system_process_id: pid,
                is_local_process: true,
                start_method,
            });
        }
        Ok(())
    }
}

impl Handler<Disconnect> for Session {
    async fn handle(&mut self, _: IgnoredAny) -> Result<(), DapError> {
        self.ended = true;
        self.cleanup().await
    }
}

impl Handler<Terminate> for Session {
    async fn handle(&mut self, _: IgnoredAny) -> Result<(), DapError> {
        self.ended = true;
        self.cleanup().await
    }
}

impl Session {
    /// Removes the session's breakpoints and resumes what it held; detaches
    /// a process the session attached and nobody else watches; kills the
    /// program it launched.
    pub(super) async fn cleanup(&mut self) -> Result<(), DapError> {
        let r = self.release().await;
        self.kill_launched();
        r
    }

    /// [`Session::cleanup`] but the end of a launched program.
    async fn release(&mut self) -> Result<(), DapError> {
        let Some(pid) = self.pid else {
            return Ok(());
        };
        let mut errors = Vec::new();
        let ids: Vec<u64> = std::mem::take(&mut self.armed)
            .iter()
            .map(|a| a.wp_id)
            .chain(std::mem::take(&mut self.code).iter().map(|c| c.wp_id))
            .collect();
        for id in ids {
            if let Err(s) = self
                .client()
                .remove_watchpoint(self.daemon.request(pb::RemoveWatchpointRequest { id }))
                .await
                && s.code() != tonic::Code::NotFound
            {
                errors.push(status_text(&s));
            }
        }
        if self.mode != StopMode::Never
            && let Err(s) = self
                .client()
                .resume(self.daemon.request(pb::ResumeRequest { pid, tids: vec![] }))
                .await
            && s.code() != tonic::Code::NotFound
        {
            errors.push(status_text(&s));
        }
        if self.attached_by_us {
            let others = self
                .client()
                .list_watchpoints(self.daemon.request(pb::ListWatchpointsRequest { pid }))
                .await
                .map(|r| r.into_inner().watchpoints.len())
                .unwrap_or(1);
            if others == 0 {
                let _ = self
                    .client()
                    .detach(self.daemon.request(pb::DetachRequest { pid }))
                    .await;
            }
        }
        if let Some(t) = self.events.take() {
            t.abort();
        }
        self.pid = None;
        self.forget_stop(None);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(DapError::Cleanup(errors.join("; ")))
        }
    }
}
