//! The durable journal (`wpd --state-dir`): events replayed after a SIGKILL
//! with nothing lost and a torn tail skipped, a reader that reconnects with
//! its last sequence number (or a time) missing nothing and getting nothing
//! twice, and the typed error of a daemon without a journal.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use tokio::time::Instant;
use tonic::Code;
use tonic_types::StatusExt;
use wpd_proto::v1::stream_events_response::Event as E;
use wpd_proto::v1::*;
use wpd_tests::{CTarget, Client, Daemon, expect_status, poll_until, require_root_perf, rpc_ok};

/// A raw subscription from the journal (or live, with `from` None).
async fn stream(
    c: &mut Client,
    after_seq: Option<u64>,
    since_time_ns: Option<u64>,
) -> Result<tonic::Streaming<StreamEventsResponse>> {
    rpc_ok(
        "StreamEvents",
        c.stream_events(StreamEventsRequest {
            raw: true,
            after_seq,
            since_time_ns,
            ..Default::default()
        }),
    )
    .await
}

/// Reads items until `stop` says so or `quiet` passes with nothing.
async fn read(
    s: &mut tonic::Streaming<StreamEventsResponse>,
    quiet: Duration,
    limit: Duration,
    mut stop: impl FnMut(&StreamEventsResponse) -> bool,
) -> Result<Vec<StreamEventsResponse>> {
    let end = Instant::now() + limit;
    let mut out = Vec::new();
    loop {
        ensure!(Instant::now() < end, "still reading after {limit:?}");
        match tokio::time::timeout(quiet, s.message()).await {
            Err(_) => return Ok(out),
            Ok(Ok(Some(m))) => {
                let done = stop(&m);
                out.push(m);
                if done {
                    return Ok(out);
                }
            }
            Ok(Ok(None)) => return Ok(out),
            Ok(Err(st)) => bail!("stream failed: {st:?}"),
        }
    }
}

async fn stats(c: &mut Client) -> Result<GetStatsResponse> {
    rpc_ok("GetStats", c.get_stats(GetStatsRequest {})).await
}

/// Watches `counter` of `t` with the perf backend.
async fn watch_counter(c: &mut Client, pid: i32) -> Result<Watchpoint> {
    rpc_ok(
        "SetWatchpoint",
        c.set_watchpoint(SetWatchpointRequest {
            spec: Some(WatchpointSpec {
                pid,
                symbol: "counter".into(),
                access: Access::Write as i32,
                backend: Backend::Perf as i32,
                ..Default::default()
            }),
        }),
    )
    .await?
    .watchpoint
    .context("no watchpoint")
}

/// Waits until the journal's writer has written everything published so
/// far (its figure stops moving), and returns that sequence number.
async fn journal_settled(c: &mut Client) -> Result<u64> {
    let mut last = u64::MAX;
    poll_until(
        Duration::from_secs(20),
        "the journal to settle",
        async || {
            let s = stats(c).await?;
            let now = s.journal_written_seq;
            let settled = now == last && now > 0;
            last = now;
            tokio::time::sleep(Duration::from_millis(150)).await;
            Ok(if settled {
                Ok(now)
            } else {
                Err(format!("written through {now}"))
            })
        },
    )
    .await
}

/// What identifies a hit across a replay.
fn hit_key(m: &StreamEventsResponse) -> Option<(u64, i32, u64, Vec<u8>, u64)> {
    match &m.event {
        Some(E::Hit(h)) => Some((h.watchpoint_id, h.tid, h.ip, h.value.clone(), h.time_ns)),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_after_a_sigkill_loses_nothing_and_skips_a_torn_tail() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let mut first = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    let result =
        async {
            let mut c = first.client().await?;
            // A live subscriber from the start, to compare the replay with.
            let mut live = stream(&mut c, None, None).await?;
            let wp = watch_counter(&mut c, t.pid).await?;
            t.cmd("spin 2").await?;
            // A few hundred ms of spinning on an idle machine; as long as it takes on a
            // loaded one.
            poll_until(
                Duration::from_secs(30),
                "100 events journaled",
                async || {
                    let n = stats(&mut c).await?.journal_written_seq;
                    Ok(if n > 100 { Ok(()) } else { Err(format!("{n}")) })
                },
            )
            .await?;
            t.cmd("stop").await?;
            let written = journal_settled(&mut c).await?;
            ensure!(written > 100, "only {written} events journaled");
            let seen = read(
                &mut live,
                Duration::from_secs(5),
                Duration::from_secs(30),
                |m| m.seq >= written,
            )
            .await?;
            let live_hits: BTreeMap<u64, _> = seen
                .iter()
                .filter_map(|m| hit_key(m).map(|k| (m.seq, k)))
                .collect();
            ensure!(live_hits.len() > 100, "{} live hits", live_hits.len());
            first.kill().await?;

            // A crash in the middle of a batch: a record header promising more
            // bytes than follow, after the last whole record.
            let dir = first.state_dir().join("journal");
            let mut segments: Vec<_> = std::fs::read_dir(&dir)?
                .map(|e| e.map(|e| e.path()))
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .filter(|p| p.extension().is_some_and(|e| e == "wpj"))
                .collect();
            segments.sort();
            let newest = segments.last().context("no journal segment")?;
            let mut bytes = std::fs::read(newest)?;
            bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7]);
            std::fs::write(newest, &bytes)?;

            let second = Daemon::restart_from(&first, &[]).await?;
            let result = async {
            let mut c = second.client().await?;
            let s = stats(&mut c).await?;
            ensure!(s.journal_torn == 1, "torn {}", s.journal_torn);
            ensure!(
                s.journal_written_seq >= written,
                "{} < {written}",
                s.journal_written_seq
            );
            let last_on_disk = s.journal_written_seq;
            let mut r = stream(&mut c, Some(0), None).await?;
            // Through the last on disk (a pause of seconds would be a stall), then whatever
            // comes after it within half a second: nothing should.
            let mut replayed = read(&mut r, Duration::from_secs(10), Duration::from_secs(60), |m| {
                m.seq >= last_on_disk
            })
            .await?;
            replayed.extend(
                read(&mut r, Duration::from_millis(500), Duration::from_secs(10), |_| false)
                    .await?,
            );
            // 1..=last_on_disk, in order, each once, no gap, nothing after.
            let seqs: Vec<u64> = replayed.iter().map(|m| m.seq).collect();
            let want: Vec<u64> = (1..=last_on_disk).collect();
            if seqs != want {
                let dropped: Vec<_> = replayed
                    .iter()
                    .filter(|m| matches!(m.event, Some(E::Dropped(_))))
                    .collect();
                bail!(
                    "replayed {} items (first {:?}, last {:?}), want 1..={last_on_disk}; drops: \
                     {dropped:?}",
                    seqs.len(),
                    seqs.first(),
                    seqs.last()
                );
            }
            // Every hit the live subscriber saw, replayed the same.
            let replayed_hits: BTreeMap<u64, _> = replayed
                .iter()
                .filter_map(|m| hit_key(m).map(|k| (m.seq, k)))
                .collect();
            for (seq, key) in &live_hits {
                ensure!(
                    replayed_hits.get(seq) == Some(key),
                    "seq {seq}: live {key:?}, replayed {:?}",
                    replayed_hits.get(seq)
                );
                ensure!(key.0 == wp.id, "{key:?}");
            }
            // Numbering goes on after the last event on disk.
            let mut next = stream(&mut c, None, None).await?;
            watch_counter(&mut c, t.pid).await?;
            t.cmd("set counter 7").await?;
            let got = read(&mut next, Duration::from_secs(10), Duration::from_secs(10), |m| {
                matches!(m.event, Some(E::Hit(_)))
            })
            .await?;
            let hit = got.last().context("no event after the restart")?;
            ensure!(hit.seq > last_on_disk, "{} <= {last_on_disk}", hit.seq);
            Ok(())
        }
        .await;
            second.finish(result)
        }
        .await;
    first.finish(result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_reconnects_misses_nothing_and_gets_nothing_twice() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    // The journal's writer 20 ms behind, as on a slow disk: each switch from
    // the journal to live events has events published but not yet written.
    let daemon = Daemon::start_with_env(&[], &[("WPD_FAULT_JOURNAL_DELAY_MS", "20")]).await?;
    let mut t = CTarget::start("ct-pie").await?;
    let result = async {
        let mut c = daemon.client().await?;
        watch_counter(&mut c, t.pid).await?;
        // Hits keep coming the whole time: each reconnection must switch
        // from the journal to live events under load.
        t.cmd("spin 2").await?;
        let mut got: Vec<u64> = Vec::new();
        let mut after = 0;
        for round in 0..30 {
            let mut s = stream(&mut c, Some(after), None).await?;
            let want = 300 * (round + 1);
            let items = read(
                &mut s,
                Duration::from_secs(5),
                Duration::from_secs(30),
                |m| m.seq >= want,
            )
            .await?;
            drop(s);
            for m in &items {
                ensure!(
                    !matches!(m.event, Some(E::Dropped(_))),
                    "round {round}: {m:?}"
                );
                got.push(m.seq);
            }
            after = *got.last().context("nothing read")?;
        }
        t.cmd("stop").await?;
        let want: Vec<u64> = (1..=after).collect();
        ensure!(
            got == want,
            "{} items, first {:?}, last {:?}, not 1..={after} exactly once",
            got.len(),
            got.first(),
            got.last()
        );

        // By time: the first item is the first event at or after it.
        let mut s = stream(&mut c, Some(after - 10), None).await?;
        let ten = read(
            &mut s,
            Duration::from_secs(5),
            Duration::from_secs(10),
            |m| m.seq >= after,
        )
        .await?;
        let pivot = &ten[3];
        drop(s);
        let mut s = stream(&mut c, None, Some(pivot.time_ns)).await?;
        let first = read(
            &mut s,
            Duration::from_secs(5),
            Duration::from_secs(10),
            |_| true,
        )
        .await?;
        let first = first.first().context("nothing since the time")?;
        ensure!(
            first.time_ns >= pivot.time_ns && first.seq <= pivot.seq,
            "first {} at {}, pivot {} at {}",
            first.seq,
            first.time_ns,
            pivot.seq,
            pivot.time_ns
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_without_a_journal_says_so() -> Result<()> {
    let daemon = Daemon::start_with_args(&["--state-dir", "none"]).await?;
    let result = async {
        let mut c = daemon.client().await?;
        let s = stats(&mut c).await?;
        ensure!(
            s.journal_written_seq == 0 && s.journal_segments == 0,
            "{s:?}"
        );
        let r = c
            .stream_events(StreamEventsRequest {
                after_seq: Some(0),
                ..Default::default()
            })
            .await;
        let status = expect_status(
            "replay without a journal",
            r,
            Code::FailedPrecondition,
            &["--state-dir"],
        )?;
        let reason = status
            .get_details_error_info()
            .map(|i| i.reason)
            .unwrap_or_default();
        ensure!(reason == wpd_proto::reason::NO_JOURNAL, "{reason}");
        Ok(())
    }
    .await;
    daemon.finish(result)
}
