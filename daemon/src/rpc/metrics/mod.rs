//! Prometheus metrics (`wpd --metrics-listen ADDR`): the families (here),
//! filled at each scrape from the same figures `GetStats` answers; the
//! gRPC latency histogram's tower layer (`layer.rs`); the plain HTTP/1
//! server answering `GET /metrics` (`http.rs`).
//!
//! Labels are bounded: no thread, instruction or address ever becomes a
//! label; watchpoint ids are those the daemon holds now (at most
//! [`MAX_WATCHPOINT_SERIES`] of them); gRPC methods are those the daemon
//! serves, any other path counted as `unknown`.

mod http;
mod layer;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use http::listen;
pub use layer::{Rpc, RpcLayer, TimedBody};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use prost::Message as _;
use wpd_proto::v1 as pb;

use crate::arch;
use crate::engine::Core;
use crate::ledger::SlotState;

/// Most watchpoints given a series of their own in
/// `wpd_watchpoint_hits_total` (those with the lowest ids, which stay in
/// the set for as long as they live); the others are counted in
/// `wpd_watchpoint_series_omitted`.
pub const MAX_WATCHPOINT_SERIES: usize = 1024;

/// Upper bounds of the gRPC latency buckets, seconds: 100 µs (a listing)
/// to 60 s (the request timeout; arming 10,000 threads takes seconds).
const RPC_BUCKETS: [f64; 18] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// The label of paths that are not one of the daemon's gRPC methods.
pub const UNKNOWN: &str = "unknown";

type GaugeU = Gauge<u64, AtomicU64>;
type GaugeF = Gauge<f64, AtomicU64>;

/// Who holds a slot (`wpd_slots_in_use`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HolderLabel {
    holder: &'static str,
}

/// One watchpoint (`wpd_watchpoint_hits_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabel {
    watchpoint: String,
}

/// Why events were not delivered (`wpd_events_dropped_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// A quantile of the ledger's hold times.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuantileLabel {
    quantile: &'static str,
}

/// A gRPC method and the status it ended with.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    service: String,
    method: String,
    code: &'static str,
}

/// Everything a scrape reports besides the gRPC latencies: `GetStats`'s
/// answer to a privileged caller plus what only listings tell.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// What `GetStats` answers a privileged caller.
    pub stats: pb::GetStatsResponse,
    /// Per watchpoint: id, hits, hits its filter held back, hits its rate
    /// limit dropped.
    pub watchpoints: Vec<WatchFigures>,
    /// Policies set.
    pub policies: u64,
    /// Slots of tracked threads, by holder.
    pub slots: SlotCounts,
}

/// One watchpoint's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchFigures {
    /// Its id.
    pub id: u64,
    /// Hits so far.
    pub hits: u64,
    /// Hits its condition, ignore or every-Nth count did not report.
    pub filtered: u64,
    /// Hits over its rate limit.
    pub limited: u64,
}

/// Slots of the tracked threads by who holds them (the ledger's
/// classification, [`SlotState`]); free slots are not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotCounts {
    /// Our committed watchpoints.
    pub ours: u64,
    /// Being armed, or inheritance not known yet.
    pub pending: u64,
    /// Someone else's (the kernel refused them to us).
    pub foreign: u64,
    /// Freed by us, still reserved by the kernel.
    pub retained: u64,
}

impl Snapshot {
    /// Reads the listings part from the core (`stats` left empty). Blocking
    /// (ledger guards, `/proc` for forked children): call it off the async
    /// workers.
    pub fn read_core(core: &Core) -> Snapshot {
        let (watches, procs) = core.list(None);
        let mut slots = SlotCounts::default();
        for p in &procs {
            for tid in core.ledger.tids(p.pid) {
                let Some(row) = core.ledger.get(tid) else {
                    continue;
                };
                for s in 0..arch::current::SLOTS {
                    match row.slot_state(s) {
                        SlotState::Free => {}
                        SlotState::Ours(_) => slots.ours += 1,
                        SlotState::Pending(_) => slots.pending += 1,
                        SlotState::Foreign => slots.foreign += 1,
                        SlotState::Retained => slots.retained += 1,
                    }
                }
            }
        }
        Snapshot {
            stats: pb::GetStatsResponse::default(),
            watchpoints: watches
                .iter()
                .map(|w| WatchFigures {
                    id: w.id.0,
                    hits: w.hits,
                    filtered: w.filtered.0,
                    limited: w.filtered.1,
                })
                .collect(),
            policies: core.list_policies(None).len() as u64,
            slots,
        }
    }
}

/// Filter and rate-limit counts are kept per watchpoint and go with it:
/// the daemon-wide counters add those of removed watchpoints, as last seen,
/// to those of the live ones, so they never go down. What a watchpoint held
/// back between the last scrape and its removal is not counted.
#[derive(Debug, Default)]
struct FilterTotals {
    /// Last seen, per live watchpoint: (filtered, limited).
    live: HashMap<u64, (u64, u64)>,
    /// Of watchpoints removed since start.
    retired: (u64, u64),
}

impl FilterTotals {
    fn update(&mut self, now: &[WatchFigures]) -> (u64, u64) {
        let ids: HashSet<u64> = now.iter().map(|w| w.id).collect();
        for (id, (f, l)) in &self.live {
            if !ids.contains(id) {
                self.retired.0 += f;
                self.retired.1 += l;
            }
        }
        self.live = now
            .iter()
            .map(|w| (w.id, (w.filtered, w.limited)))
            .collect();
        now.iter()
            .fold(self.retired, |(f, l), w| (f + w.filtered, l + w.limited))
    }
}

/// The daemon's metric families.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    processes: GaugeU,
    threads: GaugeU,
    forked_children: GaugeU,
    slots: Family<HolderLabel, GaugeU>,
    watchpoints: GaugeU,
    policies: GaugeU,
    hits: Counter,
    watchpoint_hits: Family<WatchLabel, Counter>,
    watchpoint_series_omitted: GaugeU,
    dropped: Family<ReasonLabel, Counter>,
    perf_fds: GaugeU,
    subscribers: GaugeU,
    connections: GaugeU,
    connections_refused: Counter,
    connections_idled: Counter,
    ledger_hold: Family<QuantileLabel, GaugeF>,
    uptime: GaugeF,
    symbol_files: GaugeU,
    symbol_bytes: GaugeU,
    symbol_locations: GaugeU,
    symbol_location_bytes: GaugeU,
    symbol_maps_reads: Counter,
    rpc: Family<RpcLabels, Histogram, fn() -> Histogram>,
    journal_written_seq: GaugeU,
    journal_durable_seq: GaugeU,
    journal_bytes: GaugeU,
    journal_segments: GaugeU,
    journal_lost: Family<ReasonLabel, Counter>,
    journal_fsyncs: Counter,
    journal_fsync_seconds: Counter<f64, AtomicU64>,
    journal_torn: Counter,
    journal_write_errors: Counter,
    sigtraps: Counter,
    exec_hold_files: GaugeU,
    exec_holds: Counter,
    exec_holds_past_bound: Counter,
    kernel_throttled: Counter,
    export_acked_seq: GaugeU,
    export_published: Counter,
    export_errors: Counter,
    export_lost: Counter,
    export_connected: GaugeU,
    /// gRPC paths the daemon serves (`/package.Service/Method`).
    methods: HashSet<String>,
    filter_totals: Mutex<FilterTotals>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Sets a counter mirrored from one of the daemon's own monotonic counters.
fn set_counter(c: &Counter, v: u64) {
    c.inner().store(v, Ordering::Relaxed);
}

impl Metrics {
    /// The families, registered under the `wpd_` prefix.
    pub fn new() -> Metrics {
        let mut r = Registry::with_prefix("wpd");
        let m = Metrics {
            registry: Registry::default(),
            processes: GaugeU::default(),
            threads: GaugeU::default(),
            forked_children: GaugeU::default(),
            slots: Family::default(),
            watchpoints: GaugeU::default(),
            policies: GaugeU::default(),
            hits: Counter::default(),
            watchpoint_hits: Family::default(),
            watchpoint_series_omitted: GaugeU::default(),
            dropped: Family::default(),
            perf_fds: GaugeU::default(),
            subscribers: GaugeU::default(),
            connections: GaugeU::default(),
            connections_refused: Counter::default(),
            connections_idled: Counter::default(),
            ledger_hold: Family::default(),
            uptime: GaugeF::default(),
            symbol_files: GaugeU::default(),
            symbol_bytes: GaugeU::default(),
            symbol_locations: GaugeU::default(),
            symbol_location_bytes: GaugeU::default(),
            symbol_maps_reads: Counter::default(),
            rpc: Family::new_with_constructor(|| Histogram::new(RPC_BUCKETS)),
            journal_written_seq: GaugeU::default(),
            journal_durable_seq: GaugeU::default(),
            journal_bytes: GaugeU::default(),
            journal_segments: GaugeU::default(),
            journal_lost: Family::default(),
            journal_fsyncs: Counter::default(),
            journal_fsync_seconds: Counter::default(),
            journal_torn: Counter::default(),
            journal_write_errors: Counter::default(),
            sigtraps: Counter::default(),
            exec_hold_files: GaugeU::default(),
            exec_holds: Counter::default(),
            exec_holds_past_bound: Counter::default(),
            kernel_throttled: Counter::default(),
            export_acked_seq: GaugeU::default(),
            export_published: Counter::default(),
            export_errors: Counter::default(),
            export_lost: Counter::default(),
            export_connected: GaugeU::default(),
            methods: served_methods(),
            filter_totals: Mutex::default(),
        };
        for register in [
            Metrics::register_process,
            Metrics::register_hits,
            Metrics::register_journal,
            Metrics::register_export,
            Metrics::register_daemon,
        ] {
            register(&m, &mut r);
        }
        Metrics { registry: r, ..m }
    }

    /// Registers the daemon's build and uptime, and what it holds: processes, threads, slots, watchpoints, policies.
    fn register_process(&self, r: &mut Registry) {
        r.register(
            "build",
            "The daemon's version and architecture",
            Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION")),
                ("arch", arch::current::ARCH),
            ]),
        );
        r.register_with_unit(
            "uptime",
            "Time since the daemon started",
            Unit::Seconds,
            self.uptime.clone(),
        );
        r.register(
            "attached_processes",
            "Processes attached",
            self.processes.clone(),
        );
        r.register(
            "tracked_threads",
            "Threads of attached processes the daemon tracks",
            self.threads.clone(),
        );
        r.register(
            "exec_hold_files",
            "Programs whose execs policies hold before their first instruction (inode marks)",
            self.exec_hold_files.clone(),
        );
        r.register(
            "exec_holds",
            "Execs held before their first instruction until the process was armed",
            self.exec_holds.clone(),
        );
        r.register(
            "exec_holds_past_bound",
            "Execs let go unarmed after the hold's bound (1 s)",
            self.exec_holds_past_bound.clone(),
        );
        r.register(
            "forked_children",
            "Forked children covered by the watchpoints they inherited, not yet seen to exit",
            self.forked_children.clone(),
        );
        r.register(
            "slots_in_use",
            "Debug-register slots of tracked threads by holder: ours (our watchpoints), pending \
             (being armed, or inheritance not known yet), foreign (the kernel refused them to us: \
             another tool holds them), retained (freed by us, still reserved by the kernel)",
            self.slots.clone(),
        );
        r.register("watchpoints", "Watchpoints held", self.watchpoints.clone());
        r.register("policies", "Policies set", self.policies.clone());
    }

    /// Registers the journal's families.
    fn register_journal(&self, r: &mut Registry) {
        r.register(
            "journal_written_seq",
            "Sequence number of the last event written to the journal (0: no journal)",
            self.journal_written_seq.clone(),
        );
        r.register(
            "journal_durable_seq",
            "Sequence number of the last journaled event on stable storage (fdatasync done)",
            self.journal_durable_seq.clone(),
        );
        r.register_with_unit(
            "journal",
            "Bytes of the journal's segment files",
            Unit::Bytes,
            self.journal_bytes.clone(),
        );
        r.register(
            "journal_segments",
            "Segment files of the journal",
            self.journal_segments.clone(),
        );
        r.register(
            "journal_events_lost",
            "Events not in the journal, by reason: writer_lag (the writer fell more than the \
             event ring behind), retention (deleted, oldest first, beyond --journal-max-bytes), \
             write_error (a write failed: a full disk, an I/O error), sync_error (written, but \
             their fdatasync failed: a machine crash may take them)",
            self.journal_lost.clone(),
        );
        r.register(
            "journal_fsyncs",
            "fdatasync calls of the journal's writer",
            self.journal_fsyncs.clone(),
        );
        r.register_with_unit(
            "journal_fsync",
            "Time spent in the journal's fdatasync calls",
            Unit::Seconds,
            self.journal_fsync_seconds.clone(),
        );
        r.register(
            "journal_torn_tails",
            "Torn or damaged tails cut off the journal at start",
            self.journal_torn.clone(),
        );
        r.register(
            "journal_write_errors",
            "Failed writes, fdatasync calls and segment creations of the journal",
            self.journal_write_errors.clone(),
        );
    }

    /// Registers the export's families.
    fn register_export(&self, r: &mut Registry) {
        r.register(
            "export_acked_seq",
            "Sequence number of the last event NATS JetStream acknowledged in order",
            self.export_acked_seq.clone(),
        );
        r.register(
            "export_published",
            "Messages published to NATS JetStream (repeats after a server error included)",
            self.export_published.clone(),
        );
        r.register(
            "export_errors",
            "Connection, publish and acknowledgement errors of the export",
            self.export_errors.clone(),
        );
        r.register(
            "export_events_lost",
            "Events deleted from the journal before they were exported",
            self.export_lost.clone(),
        );
        r.register(
            "export_connected",
            "1 while connected to the NATS server",
            self.export_connected.clone(),
        );
    }

    /// Registers hits, what was not delivered, and the kernel's side of them.
    fn register_hits(&self, r: &mut Registry) {
        r.register(
            "sigtraps",
            "SIGTRAPs the kernel delivered to watched processes (wpd sends none; each is a \
             ProcessCrashed event saying what sent it)",
            self.sigtraps.clone(),
        );
        r.register(
            "kernel_throttled",
            "Times the kernel throttled one of the daemon's perf events (perf_event_max_sample_rate); \
             a throttled event records nothing until the next tick",
            self.kernel_throttled.clone(),
        );
        r.register("hits", "Hits since start", self.hits.clone());
        r.register(
            "watchpoint_hits",
            "Hits of each watchpoint the daemon holds now, by id (a removed watchpoint's series \
             ends)",
            self.watchpoint_hits.clone(),
        );
        r.register(
            "watchpoint_series_omitted",
            "Watchpoints left out of wpd_watchpoint_hits_total (past the first 1024 by id)",
            self.watchpoint_series_omitted.clone(),
        );
        r.register(
            "events_dropped",
            "Events or hits not delivered, by reason: subscriber_lag (events a slow subscriber \
             lost, counted per subscriber), kernel_ring_lost (records the kernel or the BPF ring \
             dropped when full), filtered (hits a watchpoint's condition, ignore or every-Nth \
             count held back), rate_limited (hits over a watchpoint's rate limit)",
            self.dropped.clone(),
        );
        r.register(
            "perf_fds",
            "Open perf event file descriptors",
            self.perf_fds.clone(),
        );
        r.register(
            "subscribers",
            "Event streams open",
            self.subscribers.clone(),
        );
    }

    /// Registers connections, the ledger's hold times, the symbol layer and the gRPC requests.
    fn register_daemon(&self, r: &mut Registry) {
        r.register(
            "connections_open",
            "Client connections open",
            self.connections.clone(),
        );
        r.register(
            "connections_refused",
            "Connections refused (over a per-caller or daemon-wide limit, or out of file \
             descriptors)",
            self.connections_refused.clone(),
        );
        r.register(
            "connections_idle_closed",
            "Connections closed after the idle timeout",
            self.connections_idled.clone(),
        );
        r.register_with_unit(
            "ledger_lock_hold",
            "Hold time of the slot ledger's guards since start (one in 64 timed), as quantiles: \
             0.5, 0.99 and 1 (the maximum); each a bucket's upper bound, never above the maximum",
            Unit::Seconds,
            self.ledger_hold.clone(),
        );
        r.register(
            "symbol_files",
            "Module files the symbol layer holds loaded",
            self.symbol_files.clone(),
        );
        r.register_with_unit(
            "symbol",
            "Heap bytes of the loaded module files (symbol tables, DWARF indexes)",
            Unit::Bytes,
            self.symbol_bytes.clone(),
        );
        r.register(
            "symbol_locations",
            "Distinct code addresses symbolized",
            self.symbol_locations.clone(),
        );
        r.register_with_unit(
            "symbol_location",
            "Heap bytes of the symbolized locations",
            Unit::Bytes,
            self.symbol_location_bytes.clone(),
        );
        r.register(
            "symbol_maps_reads",
            "Reads of /proc/PID/maps by the symbol layer",
            self.symbol_maps_reads.clone(),
        );
        r.register_with_unit(
            "rpc_duration",
            "gRPC requests: time from the request's headers to the end of its response (an \
             event stream's whole life), by service, method and status code",
            Unit::Seconds,
            self.rpc.clone(),
        );
    }

    /// Sets every family from `snap`.
    pub fn fill(&self, snap: &Snapshot) {
        self.fill_stats(&snap.stats);
        self.policies.set(snap.policies);
        for (holder, n) in [
            ("ours", snap.slots.ours),
            ("pending", snap.slots.pending),
            ("foreign", snap.slots.foreign),
            ("retained", snap.slots.retained),
        ] {
            self.slots.get_or_create(&HolderLabel { holder }).set(n);
        }
        let mut ws = snap.watchpoints.clone();
        ws.sort_by_key(|w| w.id);
        self.watchpoint_hits.clear();
        for w in ws.iter().take(MAX_WATCHPOINT_SERIES) {
            let label = WatchLabel {
                watchpoint: w.id.to_string(),
            };
            set_counter(&self.watchpoint_hits.get_or_create(&label), w.hits);
        }
        self.watchpoint_series_omitted
            .set(ws.len().saturating_sub(MAX_WATCHPOINT_SERIES) as u64);
        let (filtered, limited) = self.filter_totals.lock().unwrap().update(&ws);
        for (reason, n) in [("filtered", filtered), ("rate_limited", limited)] {
            set_counter(&self.dropped.get_or_create(&ReasonLabel { reason }), n);
        }
    }

    /// The families `GetStats` carries. One line per field: a field added
    /// to `GetStatsResponse` becomes a metric here.
    fn fill_stats(&self, s: &pb::GetStatsResponse) {
        self.processes.set(s.processes.into());
        self.threads.set(s.threads);
        self.forked_children.set(s.forked_children);
        self.watchpoints.set(s.watchpoints.into());
        set_counter(&self.hits, s.hits);
        for (reason, n) in [
            ("subscriber_lag", s.subscriber_dropped),
            ("kernel_ring_lost", s.kernel_lost),
        ] {
            set_counter(&self.dropped.get_or_create(&ReasonLabel { reason }), n);
        }
        self.perf_fds.set(s.perf_fds);
        self.subscribers.set(s.subscribers.into());
        self.connections.set(s.connections.into());
        set_counter(&self.connections_refused, s.connections_refused);
        set_counter(&self.connections_idled, s.connections_idled);
        for (quantile, ns) in [
            ("0.5", s.ledger_hold_p50_ns),
            ("0.99", s.ledger_hold_p99_ns),
            ("1", s.ledger_hold_max_ns),
        ] {
            self.ledger_hold
                .get_or_create(&QuantileLabel { quantile })
                .set(ns as f64 / 1e9);
        }
        self.uptime.set(s.uptime_s as f64);
        self.symbol_files.set(s.symbol_files);
        self.symbol_bytes.set(s.symbol_bytes);
        self.symbol_locations.set(s.locations);
        self.symbol_location_bytes.set(s.location_bytes);
        set_counter(&self.symbol_maps_reads, s.symbol_maps_reads);
        self.journal_written_seq.set(s.journal_written_seq);
        self.journal_durable_seq.set(s.journal_durable_seq);
        self.journal_bytes.set(s.journal_bytes);
        self.journal_segments.set(s.journal_segments.into());
        for (reason, n) in [
            ("writer_lag", s.journal_lagged),
            ("retention", s.journal_retired),
            ("write_error", s.journal_write_lost),
            ("sync_error", s.journal_unsynced),
        ] {
            set_counter(&self.journal_lost.get_or_create(&ReasonLabel { reason }), n);
        }
        set_counter(&self.journal_fsyncs, s.journal_fsyncs);
        self.journal_fsync_seconds.inner().store(
            (s.journal_fsync_us as f64 / 1e6).to_bits(),
            Ordering::Relaxed,
        );
        set_counter(&self.journal_torn, s.journal_torn);
        set_counter(&self.journal_write_errors, s.journal_write_errors);
        set_counter(&self.sigtraps, s.sigtraps);
        self.exec_hold_files.set(s.exec_hold_files);
        set_counter(&self.exec_holds, s.exec_holds);
        set_counter(&self.exec_holds_past_bound, s.exec_holds_past_bound);
        set_counter(&self.kernel_throttled, s.kernel_throttled);
        self.export_acked_seq.set(s.export_acked_seq);
        set_counter(&self.export_published, s.export_published);
        set_counter(&self.export_errors, s.export_errors);
        set_counter(&self.export_lost, s.export_lost);
        self.export_connected.set(u64::from(s.export_connected));
    }

    /// The exposition: OpenMetrics text when `openmetrics`, else the
    /// Prometheus text format 0.0.4.
    pub fn encode(&self, openmetrics: bool) -> String {
        let mut out = String::new();
        let r = if openmetrics {
            prometheus_client::encoding::text::encode(&mut out, &self.registry)
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
        };
        // Writing into a String fails only on a metric's own encoding error.
        if let Err(e) = r {
            tracing::error!("encoding metrics: {e}");
        }
        out
    }

    /// The (service, method) labels of a request path: the path's own
    /// parts for a method the daemon serves, [`UNKNOWN`] for anything else.
    fn method_labels(&self, path: &str) -> (String, String) {
        if self.methods.contains(path)
            && let Some((service, method)) = path.trim_start_matches('/').split_once('/')
        {
            return (service.to_string(), method.to_string());
        }
        (UNKNOWN.to_string(), UNKNOWN.to_string())
    }

    /// Records one gRPC request.
    fn observe_rpc(&self, (service, method): (String, String), code: &'static str, d: Duration) {
        self.rpc
            .get_or_create(&RpcLabels {
                service,
                method,
                code,
            })
            .observe(d.as_secs_f64());
    }
}

/// `/package.Service/Method` of every method of the services `serve.rs`
/// registers, from their descriptor sets.
fn served_methods() -> HashSet<String> {
    let sets: [&[u8]; 4] = [
        wpd_proto::v1::FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
    ];
    let mut paths = HashSet::new();
    for bytes in sets {
        let Ok(set) = prost_types::FileDescriptorSet::decode(bytes) else {
            continue;
        };
        for file in &set.file {
            let package = file.package();
            for service in &file.service {
                let full = if package.is_empty() {
                    service.name().to_string()
                } else {
                    format!("{package}.{}", service.name())
                };
                for m in &service.method {
                    paths.insert(format!("/{full}/{}", m.name()));
                }
            }
        }
    }
    paths
}

#[cfg(test)]
mod tests;
