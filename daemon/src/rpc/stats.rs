//! `GetStats`: the figures of the core, the symbol layer, the connections,
//! the journal and the export, copied into one `GetStatsResponse` —
//! daemon-wide for a privileged caller, else those of the caller's own
//! processes and streams. The metrics endpoint reads the privileged
//! answer (`metrics/`).

use tonic::Status;
use wpd_proto::v1 as pb;

use super::Api;
use crate::authz::{self, Caller};
use crate::service::run;

impl Api {
    /// What `GetStats` answers `caller`: daemon-wide figures for a
    /// privileged caller, else those of its own processes and streams. The
    /// metrics endpoint reads the privileged answer (`metrics/`), so a
    /// field added here is one line away from a metric.
    pub(crate) async fn stats(&self, caller: Caller) -> Result<pb::GetStatsResponse, Status> {
        let core = self.service.core().clone();
        let who = caller.clone();
        let s = run(move || {
            Ok(if who.privileged {
                core.stats()
            } else {
                core.stats_for(who.uid, |pid| authz::check(&who, pid).is_ok())
            })
        })
        .await
        .map_err(Status::from)?;
        let sym = if caller.privileged {
            self.service.core().symbols.stats()
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
        let x = match (caller.privileged, self.service.core().export.as_ref()) {
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
            kernel_throttled: s.kernel_throttled,
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
            journal_write_lost: j.write_lost,
            journal_unsynced: j.unsynced,
            journal_write_errors: j.write_errors,
            objects: Some(crate::convert::object_counts_to_pb(&s.objects)),
            code_events: s.code_events,
            code_event_bytes: s.code_event_bytes,
            code_event_bytes_limit: self.service.core().limits.code_event_bytes_per_caller,
            held: self.service.core().held_by(caller.uid) as u32,
            held_limit: self.service.core().limits.watchpoints_per_caller as u32,
            caller_fds: if caller.privileged {
                self.service.core().caller_fds()
            } else {
                0
            },
            degraded: self.service.core().degraded().unwrap_or_default(),
            sigtraps: if caller.privileged {
                self.service
                    .core()
                    .sigtraps
                    .load(std::sync::atomic::Ordering::Relaxed)
            } else {
                0
            },
            forked_children: if caller.privileged {
                self.service.core().forked_children() as u64
            } else {
                0
            },
            export_acked_seq: x.acked_seq,
            export_published: x.published,
            export_errors: x.errors,
            export_lost: x.lost,
            export_connected: x.connected,
        })
    }
}
