//! Nothing lost unseen: each way the daemon can lose a hit or an event is provoked and its count
//! checked in `GetStats`, the Prometheus page and `wpctl stats`. A full perf ring on either perf
//! path (rings of 4 KiB, a two-thread target storing as fast as it can) under a lowered
//! `perf_event_max_sample_rate`: every store is a hit read or a record counted lost, and none
//! is throttled; the journal's writer falling a whole event ring behind, retention deleting
//! events the export had not sent, and the export counting both as it reads past them.
//!
//! The sample-rate knob is machine-wide: these tests run in the nextest group
//! `machine-sysctl` (`.config/nextest.toml`), one at a time with the others that change it.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use wpd_proto::v1::{GetStatsRequest, GetStatsResponse, ListWatchpointsRequest};
use wpd_tests::{
    Backend, Client, Daemon, NatsServer, Sysctl, TargetProc, http_get, metric_value,
    metrics_address, nats_server_bin, poll_until, require_peer, require_root_perf, rpc_ok,
    run_wpctl, set_watchpoint, write_spec,
};

const SAMPLE_RATE: &str = "/proc/sys/kernel/perf_event_max_sample_rate";

async fn stats(c: &mut Client) -> Result<GetStatsResponse> {
    rpc_ok("GetStats", c.get_stats(GetStatsRequest {})).await
}

/// `stores=N` from the target's `HAMMER` answer.
fn stores_of(reply: &str) -> Result<u64> {
    reply
        .split_whitespace()
        .find_map(|w| w.strip_prefix("stores="))
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("hammer: {reply:?}"))
}

/// `wpctl stats --json` of `daemon`, field `name`.
async fn wpctl_stat(daemon: &Daemon, name: &str) -> Result<u64> {
    let endpoint = daemon.endpoint();
    let out = run_wpctl(
        &["--endpoint", &endpoint, "--json", "stats"],
        Duration::from_secs(20),
    )
    .await?;
    ensure!(out.code == Some(0), "wpctl stats: {}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout)
        .with_context(|| format!("wpctl stats --json: {}", out.stdout))?;
    v[name]
        .as_u64()
        .with_context(|| format!("no {name} in {}", out.stdout))
}

/// The sample `name{labels}` of the daemon's metrics page.
async fn metric(daemon: &Daemon, name: &str, labels: &str) -> Result<u64> {
    let page = http_get(metrics_address(&daemon.log())?, "/metrics").await?;
    metric_value(&page, name, labels)
        .map(|v| v as u64)
        .with_context(|| format!("no {name}{{{labels}}} in the metrics page:\n{page}"))
}

/// A ring of 4 KiB holds about 50 hits: two threads storing for half a second, then the main
/// thread 20,000 times, overflow it many times over. Every store is then either a hit the daemon read or a record it counts in
/// `kernel_lost`: the per-CPU path's losses too, which the kernel reports only with the next
/// record that fits (kernel-facts §16). Beyond the stores, only the two threads' FORK and EXIT
/// records (per-CPU path: they share the ring) can be lost. At a sample-rate limit of 1,000 a
/// second nothing is throttled (kernel-facts §10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_ring_loses_only_what_it_counts() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let rate = Sysctl::set(SAMPLE_RATE, "1000")?;
    for path in ["per-thread", "per-cpu"] {
        let daemon = Daemon::start_with_args(&[
            "--perf-events",
            path,
            "--perf-ring-kib",
            "4",
            "--state-dir",
            "none",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .await?;
        let mut target = TargetProc::start(&["--threads", "1"]).await?;
        let result = async {
            let mut c = daemon.client().await?;
            let w = set_watchpoint(
                &mut c,
                write_spec(Backend::Perf, target.pid, target.vars[3]),
            )
            .await?
            .watchpoint
            .unwrap_or_default();
            let reply = target
                .cmd_within("hammer 3 2 500", Duration::from_secs(60))
                .await?
                .context("no reply to hammer")?;
            // Then the main thread alone, which lives on: no thread's EXIT record follows
            // its last stores into the ring, so a loss at the end stays unreported by any
            // PERF_RECORD_LOST (per-CPU path).
            let bench = target.cmd("bench-writes 3 20000").await?;
            ensure!(bench.starts_with("BENCH"), "{bench}");
            let stores = stores_of(&reply)? + 20_000;
            let seen = async |c: &mut Client| -> Result<(u64, GetStatsResponse)> {
                let list = rpc_ok(
                    "ListWatchpoints",
                    c.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
                )
                .await?;
                let hits = list
                    .watchpoints
                    .iter()
                    .find(|x| x.id == w.id)
                    .map_or(0, |x| x.hits);
                Ok((hits, stats(c).await?))
            };
            let (hits, s) = poll_until(
                Duration::from_secs(60),
                "every store read or counted lost",
                async || {
                    let (hits, s) = seen(&mut c).await?;
                    Ok(if hits + s.kernel_lost >= stores {
                        Ok((hits, s))
                    } else {
                        Err(format!(
                            "{stores} stores, {hits} hits, {} counted lost",
                            s.kernel_lost
                        ))
                    })
                },
            )
            .await?;
            ensure!(
                hits + s.kernel_lost <= stores + 4,
                "{path}: {stores} stores, {hits} hits and {} counted lost: more than the stores \
                 and the two threads' FORK and EXIT records",
                s.kernel_lost
            );
            ensure!(
                s.kernel_lost > 0 && hits < stores,
                "{path}: a 4 KiB ring took {hits} hits of {stores} stores without losing any"
            );
            ensure!(
                s.kernel_throttled == 0,
                "{path}: {} events throttled",
                s.kernel_throttled
            );
            // Nothing moves any more: the other views show the same counts.
            let lost = s.kernel_lost;
            ensure!(
                wpctl_stat(&daemon, "kernel_lost").await? == lost,
                "{path}: wpctl stats differs from GetStats ({lost})"
            );
            ensure!(
                wpctl_stat(&daemon, "kernel_throttled").await? == 0,
                "{path}: wpctl stats shows throttled events"
            );
            let dropped = metric(
                &daemon,
                "wpd_events_dropped_total",
                "reason=\"kernel_ring_lost\"",
            )
            .await?;
            ensure!(
                dropped == lost,
                "{path}: the metrics say {dropped} lost, GetStats {lost}"
            );
            ensure!(
                metric(&daemon, "wpd_kernel_throttled_total", "").await? == 0,
                "{path}: the metrics show throttled events"
            );
            eprintln!(
                "{path}: {stores} stores, {hits} hits, {lost} counted lost ({} %)",
                lost * 100 / stores
            );
            Ok(())
        }
        .await;
        daemon.finish(result)?;
    }
    ensure!(
        std::fs::read_to_string(SAMPLE_RATE)?.trim() == "1000",
        "the sample rate changed under the test"
    );
    drop(rate);
    Ok(())
}

/// The journal's writer pausing 1 s after each write falls more than the event ring (65,536)
/// behind a target storing as fast as it can: those events are counted `journal_lagged`.
/// Segments of 1 MiB under a 4 MiB limit are deleted while the NATS server is down:
/// `journal_retired`. When the server comes back, the export reads past both kinds of gap and
/// counts them (`export_lost`): every event numbered is then in the stream or counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_and_export_losses_are_counted() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    require_peer(
        nats_server_bin().is_some(),
        "nats-server",
        "Debian: nats-server",
    );
    let mut nats = NatsServer::start().await?;
    let url = nats.url();
    nats.kill().await?;
    let daemon = Daemon::start_with_env(
        &[
            "--export-nats",
            &url,
            "--export-stream",
            "WPDLOSS",
            "--journal-segment-bytes",
            "1048576",
            "--journal-max-bytes",
            "4194304",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        &[("WPD_FAULT_JOURNAL_DELAY_MS", "1000")],
    )
    .await?;
    let mut target = TargetProc::start(&["--threads", "1"]).await?;
    let result = async {
        let mut c = daemon.client().await?;
        set_watchpoint(
            &mut c,
            write_spec(Backend::Perf, target.pid, target.vars[3]),
        )
        .await?;
        let reply = target
            .cmd_within("hammer 3 2 3000", Duration::from_secs(60))
            .await?
            .context("no reply to hammer")?;
        stores_of(&reply)?;
        // The writer catches up with what it still has (the queue's last events may be the
        // ones it could not take: those stay counted as lagged, never written), and is still
        // there after more than one of its pauses.
        let mut last = 0;
        let s = poll_until(
            Duration::from_secs(90),
            "the journal's writer to settle",
            async || {
                let s = stats(&mut c).await?;
                let settled = s.journal_written_seq == last && last > 0;
                last = s.journal_written_seq;
                tokio::time::sleep(Duration::from_millis(1500)).await;
                Ok(if settled {
                    Ok(s)
                } else {
                    Err(format!("written up to {last}"))
                })
            },
        )
        .await?;
        ensure!(s.journal_lagged > 0, "the writer never fell behind: {s:?}");
        ensure!(s.journal_retired > 0, "retention deleted nothing: {s:?}");
        ensure!(s.export_acked_seq == 0, "exported without a server: {s:?}");

        nats.restart().await?;
        let s = poll_until(
            Duration::from_secs(120),
            "the export to catch up",
            async || {
                let s = stats(&mut c).await?;
                Ok(
                    if s.export_connected && s.export_acked_seq == s.journal_written_seq {
                        Ok(s)
                    } else {
                        Err(format!(
                            "acked {} of {}, {} lost",
                            s.export_acked_seq, s.journal_written_seq, s.export_lost
                        ))
                    },
                )
            },
        )
        .await?;
        let client = async_nats::connect(url.as_str()).await?;
        let js = async_nats::jetstream::new(client);
        let mut stream = js.get_stream("WPDLOSS").await?;
        let messages = stream.info().await?.state.messages;
        ensure!(
            messages + s.export_lost == s.journal_written_seq,
            "{messages} messages and {} counted lost by the export, {} events numbered: {s:?}",
            s.export_lost,
            s.journal_written_seq
        );
        // What the export missed is what retention deleted, and what the writer could not
        // take numbered before its last record (those after it were never written).
        ensure!(
            s.journal_retired <= s.export_lost
                && s.export_lost <= s.journal_lagged + s.journal_retired,
            "the export counted {} lost; the journal lagged {} and retired {}",
            s.export_lost,
            s.journal_lagged,
            s.journal_retired
        );
        for (name, labels, want) in [
            (
                "wpd_journal_events_lost_total",
                "reason=\"writer_lag\"",
                s.journal_lagged,
            ),
            (
                "wpd_journal_events_lost_total",
                "reason=\"retention\"",
                s.journal_retired,
            ),
            ("wpd_export_events_lost_total", "", s.export_lost),
        ] {
            let got = metric(&daemon, name, labels).await?;
            ensure!(got == want, "{name}{{{labels}}} = {got}, GetStats {want}");
        }
        for (name, want) in [
            ("journal_lagged", s.journal_lagged),
            ("journal_retired", s.journal_retired),
            ("export_lost", s.export_lost),
        ] {
            let got = wpctl_stat(&daemon, name).await?;
            ensure!(got == want, "wpctl stats {name} = {got}, GetStats {want}");
        }
        eprintln!(
            "{} events: {} lagged, {} retired, {} exported, {} counted lost by the export",
            s.journal_written_seq, s.journal_lagged, s.journal_retired, messages, s.export_lost
        );
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("----- nats-server log -----\n{}", nats.log());
    }
    daemon.finish(result)
}
