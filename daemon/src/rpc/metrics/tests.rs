//! The metrics families: names, encoding, bounded labels.

use super::*;

fn stats() -> pb::GetStatsResponse {
    pb::GetStatsResponse {
        processes: 2,
        threads: 17,
        forked_children: 5,
        watchpoints: 3,
        hits: 1234,
        kernel_lost: 5,
        perf_fds: 40,
        subscribers: 1,
        subscriber_dropped: 7,
        ledger_hold_p50_ns: 64,
        ledger_hold_p99_ns: 512,
        ledger_hold_max_ns: 900,
        uptime_s: 42,
        connections: 4,
        connections_refused: 1,
        connections_idled: 2,
        sigtraps: 3,
        exec_hold_files: 2,
        exec_holds: 40,
        exec_holds_past_bound: 1,
        ..Default::default()
    }
}

fn watch(id: u64, hits: u64, filtered: u64, limited: u64) -> WatchFigures {
    WatchFigures {
        id,
        hits,
        filtered,
        limited,
    }
}

/// The sample line of `name` with exactly these labels, parsed.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.split(' ').next()?.parse().ok())
}

#[test]
fn every_family_is_encoded_with_its_conventional_name() {
    let m = Metrics::new();
    m.fill(&Snapshot {
        stats: stats(),
        watchpoints: vec![watch(1, 1000, 3, 0), watch(2, 234, 0, 9)],
        policies: 1,
        slots: SlotCounts {
            ours: 5,
            foreign: 2,
            ..Default::default()
        },
    });
    m.observe_rpc(
        m.method_labels("/wpd.v1.Watchpoints/GetStats"),
        "OK",
        Duration::from_micros(300),
    );
    for text in [m.encode(false), m.encode(true)] {
        for (series, value) in [
            ("wpd_attached_processes", 2.0),
            ("wpd_tracked_threads", 17.0),
            ("wpd_forked_children", 5.0),
            ("wpd_slots_in_use{holder=\"ours\"}", 5.0),
            ("wpd_slots_in_use{holder=\"foreign\"}", 2.0),
            ("wpd_slots_in_use{holder=\"pending\"}", 0.0),
            ("wpd_watchpoints", 3.0),
            ("wpd_policies", 1.0),
            ("wpd_hits_total", 1234.0),
            ("wpd_sigtraps_total", 3.0),
            ("wpd_exec_hold_files", 2.0),
            ("wpd_exec_holds_total", 40.0),
            ("wpd_exec_holds_past_bound_total", 1.0),
            ("wpd_watchpoint_hits_total{watchpoint=\"1\"}", 1000.0),
            ("wpd_watchpoint_hits_total{watchpoint=\"2\"}", 234.0),
            ("wpd_events_dropped_total{reason=\"subscriber_lag\"}", 7.0),
            ("wpd_events_dropped_total{reason=\"kernel_ring_lost\"}", 5.0),
            ("wpd_events_dropped_total{reason=\"filtered\"}", 3.0),
            ("wpd_events_dropped_total{reason=\"rate_limited\"}", 9.0),
            ("wpd_perf_fds", 40.0),
            ("wpd_subscribers", 1.0),
            ("wpd_connections_open", 4.0),
            ("wpd_connections_refused_total", 1.0),
            ("wpd_connections_idle_closed_total", 2.0),
            ("wpd_ledger_lock_hold_seconds{quantile=\"0.99\"}", 512e-9),
            ("wpd_ledger_lock_hold_seconds{quantile=\"1\"}", 900e-9),
            ("wpd_uptime_seconds", 42.0),
            (
                "wpd_rpc_duration_seconds_count{service=\"wpd.v1.Watchpoints\",\
                 method=\"GetStats\",code=\"OK\"}",
                1.0,
            ),
        ] {
            assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
        }
        // The two formats order a bucket's labels differently.
        let bucket = |le: &str| {
            text.lines()
                .filter(|l| l.starts_with("wpd_rpc_duration_seconds_bucket{"))
                .filter(|l| l.contains("method=\"GetStats\""))
                .find(|l| l.contains(&format!("le=\"{le}\"")))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        };
        assert_eq!(bucket("0.00025"), Some(0.0), "{text}");
        assert_eq!(bucket("0.0005"), Some(1.0), "{text}");
        assert_eq!(bucket("+Inf"), Some(1.0), "{text}");
        assert!(
            text.contains(&format!(
                "wpd_build_info{{version=\"{}\",arch=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION"),
                arch::current::ARCH
            )),
            "{text}"
        );
    }
    assert!(m.encode(true).ends_with("# EOF\n"));
    assert!(!m.encode(false).contains("# EOF"));
}

#[test]
fn labels_stay_bounded() {
    let m = Metrics::new();
    // Paths the daemon does not serve all count as one `unknown`.
    for path in [
        "/wpd.v1.Watchpoints/NoSuchMethod",
        "/evil.Service/1",
        "/evil.Service/2",
        "/",
        "/wpd.v1.Watchpoints/GetStats/extra",
    ] {
        assert_eq!(
            m.method_labels(path),
            (UNKNOWN.to_string(), UNKNOWN.to_string()),
            "{path}"
        );
        m.observe_rpc(m.method_labels(path), "UNIMPLEMENTED", Duration::ZERO);
    }
    for known in [
        "/wpd.v1.Watchpoints/SetWatchpoint",
        "/grpc.health.v1.Health/Check",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    ] {
        assert_ne!(m.method_labels(known).0, UNKNOWN, "{known}");
    }
    let text = m.encode(false);
    assert_eq!(
        sample(
            &text,
            "wpd_rpc_duration_seconds_count{service=\"unknown\",method=\"unknown\",\
             code=\"UNIMPLEMENTED\"}"
        ),
        Some(5.0),
        "{text}"
    );

    // A removed watchpoint's series goes; past the bound, ids are
    // counted, not listed.
    let many: Vec<WatchFigures> = (1..=MAX_WATCHPOINT_SERIES as u64 + 10)
        .map(|id| watch(id, id, 0, 0))
        .collect();
    m.fill(&Snapshot {
        watchpoints: many,
        ..Default::default()
    });
    let text = m.encode(false);
    let series = text
        .lines()
        .filter(|l| l.starts_with("wpd_watchpoint_hits_total{"))
        .count();
    assert_eq!(series, MAX_WATCHPOINT_SERIES);
    assert_eq!(sample(&text, "wpd_watchpoint_series_omitted"), Some(10.0));
    m.fill(&Snapshot {
        watchpoints: vec![watch(7, 70, 0, 0)],
        ..Default::default()
    });
    let text = m.encode(false);
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("wpd_watchpoint_hits_total{"))
        .collect();
    assert_eq!(series, ["wpd_watchpoint_hits_total{watchpoint=\"7\"} 70"]);
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        for forbidden in ["tid=", "ip=", "address=", "pid="] {
            assert!(!l.contains(forbidden), "{l}");
        }
    }
}

#[test]
fn filter_counts_outlive_their_watchpoints() {
    let m = Metrics::new();
    let filtered = |m: &Metrics| {
        sample(
            &m.encode(false),
            "wpd_events_dropped_total{reason=\"filtered\"}",
        )
    };
    m.fill(&Snapshot {
        watchpoints: vec![watch(1, 0, 10, 1), watch(2, 0, 5, 0)],
        ..Default::default()
    });
    assert_eq!(filtered(&m), Some(15.0));
    m.fill(&Snapshot {
        watchpoints: vec![watch(2, 0, 6, 0)],
        ..Default::default()
    });
    assert_eq!(filtered(&m), Some(16.0), "watchpoint 1's 10 are kept");
    m.fill(&Snapshot::default());
    assert_eq!(filtered(&m), Some(16.0));
    assert_eq!(
        sample(
            &m.encode(false),
            "wpd_events_dropped_total{reason=\"rate_limited\"}"
        ),
        Some(1.0)
    );
}
