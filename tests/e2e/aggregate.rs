//! Aggregate mode: a watchpoint hit hundreds of thousands of times a second counts its hits
//! per instruction and thread in the daemon, streams only a bounded number of samples, and
//! loses nothing silently: every store is counted in an aggregate (or in the overflow), the
//! samples are at most the rate plus its initial burst.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use tokio::time::Instant;
use tonic::Code;
use wpd_proto::v1::{GetHitAggregatesRequest, SetWatchpointRequest};
use wpd_tests::{
    Backend, Daemon, Event, EventStream, TargetProc, expect_status, perf_events_of,
    require_backend, rpc_ok, set_watchpoint, write_spec,
};

const RATE: u32 = 20;
const HAMMER_MS: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregate_mode_counts_every_hit_and_streams_samples() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "1", "--interval-us", "1000000"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let pid = target.pid;
        let mut events = EventStream::subscribe(&mut client, Default::default()).await?;
        let mut spec = write_spec(Backend::Perf, pid, target.vars[3]);
        spec.aggregate = true;
        spec.exemplars_per_second = RATE;
        let wp = set_watchpoint(&mut client, spec)
            .await?
            .watchpoint
            .unwrap_or_default();
        let hammered = Instant::now();
        let reply = target
            .cmd_within(&format!("hammer 3 2 {HAMMER_MS}"), Duration::from_secs(60))
            .await?
            .context("no reply to hammer")?;
        let stores: u64 = reply
            .split_whitespace()
            .find_map(|w| w.strip_prefix("stores="))
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("hammer: {reply:?}"))?;
        // Every store is a hit, aggregated or lost in a full kernel ring (the per-CPU path
        // under load) and reported; wait until the daemon has read every record (60 s at
        // most: a loaded machine's daemon may be seconds behind): hits alone never reach the
        // stores once some were lost.
        let mut c = client.clone();
        let deadline = Instant::now() + Duration::from_secs(60);
        let (agg, stats) = loop {
            let a = rpc_ok(
                "GetHitAggregates",
                c.get_hit_aggregates(GetHitAggregatesRequest {
                    watchpoint_id: wp.id,
                    limit: 0,
                    raw: false,
                }),
            )
            .await?;
            let stats = rpc_ok("GetStats", c.get_stats(wpd_proto::v1::GetStatsRequest {})).await?;
            if a.hits + stats.kernel_lost >= stores || Instant::now() > deadline {
                break (a, stats);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // The daemon read every hit between the hammer's start and now.
        let read_for = hammered.elapsed();
        // The per-thread path (one BPF ring of 16 MiB for the whole daemon) loses nothing
        // here: every store is aggregated. On the per-CPU path a CPU's ring can fill under
        // the hammer; the two hammer threads' FORK and EXIT records share the ring with the
        // hits, and may be among the records lost. Losses there are bounded (the daemon keeps
        // up with most of the hits) and every one is reported on the stream (checked below).
        let per_thread = perf_events_of(&daemon).await?.starts_with("per-thread");
        eprintln!(
            "{stores} stores, {} aggregated, {} lost by the kernel ({})",
            agg.hits,
            stats.kernel_lost,
            if per_thread { "per-thread" } else { "per-CPU" }
        );
        if per_thread {
            ensure!(
                agg.hits == stores && stats.kernel_lost == 0,
                "{stores} stores, {} aggregated, {} lost by the kernel",
                agg.hits,
                stats.kernel_lost
            );
        } else {
            ensure!(
                agg.hits + stats.kernel_lost >= stores
                    && agg.hits + stats.kernel_lost <= stores + 4
                    && stats.kernel_lost <= stores / 2,
                "{stores} stores, {} aggregated, {} lost by the kernel",
                agg.hits,
                stats.kernel_lost
            );
        }
        let counted: u64 = agg.aggregates.iter().map(|a| a.count).sum::<u64>() + agg.overflow;
        ensure!(
            counted == agg.hits,
            "aggregates count {counted}, the total says {}",
            agg.hits
        );
        // Two hammer threads, one storing instruction each: their aggregates lead, named.
        let hammers: Vec<_> = agg
            .aggregates
            .iter()
            .filter(|a| a.thread_name == "hammer")
            .collect();
        ensure!(
            hammers.len() == 2
                && hammers
                    .iter()
                    .all(|a| a.count > 0 && a.first_ns <= a.last_ns),
            "aggregates of the hammer threads: {:?}",
            agg.aggregates
        );
        ensure!(
            hammers
                .iter()
                .all(|a| !a.values.is_empty() && a.location.is_some()),
            "aggregates without values or location: {hammers:?}"
        );
        // Samples: at most the bucket (RATE) plus RATE a second of the time the daemon took
        // to read the hits (its clock refills the bucket: HAMMER_MS and moments on an idle
        // machine), and exactly the ones streamed.
        let budget = u64::from(RATE) + u64::from(RATE) * (read_for.as_secs() + 2);
        ensure!(
            agg.exemplars >= 1 && agg.exemplars <= budget,
            "{} samples for a rate of {RATE}/s over {read_for:?} of hits read",
            agg.exemplars
        );
        // Every sample and loss report streamed (10 s at most), then 300 ms for any more.
        let mut deadline = Instant::now() + Duration::from_secs(10);
        let mut complete = false;
        let (mut streamed, mut reported_lost) = (0, 0);
        while let Some(e) = events.next_before(deadline).await? {
            match e {
                Event::Hit(h) if h.watchpoint_id == wp.id => streamed += 1,
                Event::RecordsLost(r) => reported_lost += r.count,
                _ => {}
            }
            if !complete && streamed >= agg.exemplars && reported_lost >= stats.kernel_lost {
                complete = true;
                deadline = Instant::now() + Duration::from_millis(300);
            }
        }
        ensure!(
            streamed == agg.exemplars,
            "{streamed} hits streamed, {} samples counted",
            agg.exemplars
        );
        ensure!(
            reported_lost == stats.kernel_lost,
            "{reported_lost} records reported lost on the stream, {} counted by the daemon",
            stats.kernel_lost
        );
        // A watchpoint not in aggregate mode has no aggregates; bad specs are refused.
        let plain = set_watchpoint(&mut client, write_spec(Backend::Perf, pid, target.vars[4]))
            .await?
            .watchpoint
            .unwrap_or_default();
        let r = client
            .get_hit_aggregates(GetHitAggregatesRequest {
                watchpoint_id: plain.id,
                ..Default::default()
            })
            .await;
        expect_status(
            "aggregates of a plain watchpoint",
            r,
            Code::InvalidArgument,
            &["not in aggregate mode"],
        )?;
        let mut bad = write_spec(Backend::Perf, pid, target.vars[5]);
        bad.exemplars_per_second = 5;
        let r = client
            .set_watchpoint(SetWatchpointRequest { spec: Some(bad) })
            .await;
        expect_status(
            "exemplars without aggregate",
            r,
            Code::InvalidArgument,
            &["aggregate"],
        )?;
        target.ensure_alive()?;
        Ok(())
    }
    .await;
    daemon.finish(result)
}
