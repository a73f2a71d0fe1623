//! `GetStats`: the service's figures (`service/stats.rs`) and the
//! transport's connection counts, copied into one `GetStatsResponse`. The
//! metrics endpoint reads the privileged answer (`metrics/`), so a field
//! added here is one line away from a metric.

use tonic::Status;
use wpd_proto::v1 as pb;

use super::Api;
use crate::authz::Caller;
use crate::service::stats::Figures;

impl Api {
    /// What `GetStats` answers `caller`.
    pub(crate) async fn stats(&self, caller: Caller) -> Result<pb::GetStatsResponse, Status> {
        let f = self.service.stats(&caller).await?;
        let mut out = stats_out(&f);
        if caller.privileged {
            out.connections = self.conns.open() as u32;
            out.connections_refused = self.conns.refused();
            out.connections_idled = self.conns.idled();
        }
        journal_out(&mut out, &f.core.journal.unwrap_or_default());
        export_out(&mut out, &f.export);
        Ok(out)
    }
}

/// The core's, the symbol layer's and the caller's own figures.
fn stats_out(f: &Figures) -> pb::GetStatsResponse {
    let (s, sym) = (&f.core, &f.symbols);
    pb::GetStatsResponse {
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
        objects: Some(crate::convert::object_counts_to_pb(&s.objects)),
        code_events: s.code_events,
        code_event_bytes: s.code_event_bytes,
        code_event_bytes_limit: f.code_event_bytes_limit,
        held: f.held as u32,
        held_limit: f.held_limit as u32,
        caller_fds: f.caller_fds,
        degraded: f.degraded.clone(),
        sigtraps: f.sigtraps,
        forked_children: f.forked_children,
        exec_hold_files: f.exec_holds.0,
        exec_holds: f.exec_holds.1,
        exec_holds_past_bound: f.exec_holds.2,
        ..Default::default()
    }
}

/// The journal's figures.
fn journal_out(out: &mut pb::GetStatsResponse, j: &crate::journal::Figures) {
    out.journal_written_seq = j.written_seq;
    out.journal_durable_seq = j.durable_seq;
    out.journal_bytes = j.bytes;
    out.journal_segments = j.segments as u32;
    out.journal_lagged = j.lagged;
    out.journal_retired = j.retired;
    out.journal_fsyncs = j.fsyncs;
    out.journal_fsync_us = j.fsync_us;
    out.journal_torn = j.torn;
    out.journal_write_lost = j.write_lost;
    out.journal_unsynced = j.unsynced;
    out.journal_write_errors = j.write_errors;
}

/// The export's figures.
fn export_out(out: &mut pb::GetStatsResponse, x: &crate::export::Figures) {
    out.export_acked_seq = x.acked_seq;
    out.export_published = x.published;
    out.export_errors = x.errors;
    out.export_lost = x.lost;
    out.export_connected = x.connected;
}
