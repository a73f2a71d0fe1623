//! Running and stopping: `continue`, `pause`, and what the adapter refuses
//! (stepping backwards, jumping).

use serde::de::IgnoredAny;
use wpd_proto::v1 as pb;

use super::{Handler, Session, StopMode};
use crate::error::DapError;
use crate::protocol::events::Stopped;
use crate::protocol::requests::*;

impl Handler<Continue> for Session {
    async fn handle(&mut self, a: ContinueArguments) -> Result<ContinueBody, DapError> {
        let pid = self.pid()?;
        let single = a.single_thread == Some(true);
        let tids = if single {
            vec![i32::try_from(a.thread_id).map_err(|_| DapError::NoSuchThread)?]
        } else {
            Vec::new()
        };
        self.forget_stop(if single { Some(tids[0]) } else { None });
        if self.mode != StopMode::Never {
            self.client()
                .resume(self.daemon.request(pb::ResumeRequest { pid, tids }))
                .await?;
        }
        Ok(ContinueBody {
            all_threads_continued: !single,
        })
    }
}

impl Handler<Pause> for Session {
    async fn handle(&mut self, a: PauseArguments) -> Result<(), DapError> {
        let pid = self.pid()?;
        if self.mode == StopMode::Never {
            return Err(DapError::PerfNeverStops);
        }
        self.client()
            .pause(self.daemon.request(pb::PauseRequest {
                pid,
                tids: vec![],
                lease: self.lease,
            }))
            .await?;
        self.stopped = true;
        self.refresh_pending().await;
        self.event_after_response(&Stopped {
            reason: "pause",
            thread_id: a.thread_id,
            all_threads_stopped: true,
            ..Default::default()
        });
        Ok(())
    }
}

/// Stepping backwards and jumping: each refused.
macro_rules! no_stepping {
    ($($r:ty),*) => {
        $(
            impl Handler<$r> for Session {
                async fn handle(&mut self, _: IgnoredAny) -> Result<(), DapError> {
                    Err(DapError::NoStepping)
                }
            }
        )*
    };
}

no_stepping!(StepBack, ReverseContinue, Goto);

impl Session {
    /// Drops what was shown of a stop (of one thread, or all).
    pub(super) fn forget_stop(&mut self, tid: Option<i32>) {
        match tid {
            Some(t) => {
                self.stops.remove(&t);
            }
            None => {
                self.stops.clear();
                self.stopped = false;
                self.frames.clear();
                self.frame_index.clear();
                self.vars.clear();
                self.named.clear();
            }
        }
    }
}
