//! "Who wrote this last?": a watchpoint's last hits, kept by the daemon with
//! no subscriber at all, and asked for afterwards (GetRecentHits,
//! `wpctl last`), on both backends, against a C target whose stores the
//! test makes one at a time.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use tonic::Code;
use wpd_proto::v1::stream_events_response::Event;
use wpd_proto::v1::*;
use wpd_tests::{
    Backend, CTarget, Client, Daemon, both_backends, expect_status, line_of, poll_until, rpc_ok,
};

fn spec(backend: Backend, pid: i32, keep: u32) -> WatchpointSpec {
    WatchpointSpec {
        pid,
        symbol: "counter".into(),
        access: Access::Write as i32,
        backend: backend as i32,
        keep_recent: keep,
        ..Default::default()
    }
}

async fn hits_of(client: &mut Client, pid: i32, id: u64) -> Result<u64> {
    Ok(rpc_ok(
        "ListWatchpoints",
        client.list_watchpoints(ListWatchpointsRequest { pid }),
    )
    .await?
    .watchpoints
    .iter()
    .find(|w| w.id == id)
    .context("not listed")?
    .hits)
}

both_backends!(the_last_hits_are_kept_with_nobody_subscribed);

async fn the_last_hits_are_kept_with_nobody_subscribed(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    let result = async {
        let mut c = daemon.client().await?;
        let wp = rpc_ok(
            "SetWatchpoint",
            c.set_watchpoint(SetWatchpointRequest {
                spec: Some(spec(backend, t.pid, 4)),
            }),
        )
        .await?
        .watchpoint
        .context("no watchpoint")?;
        ensure!(
            wp.spec.as_ref().is_some_and(|s| s.keep_recent == 4),
            "{wp:?}"
        );
        // Six stores, each counted before the next (perf reads the value
        // just after its hit).
        for v in 1..=6u64 {
            t.cmd(&format!("set counter {v}")).await?;
            poll_until(Duration::from_secs(10), "the store's hit", async || {
                let n = hits_of(&mut c, t.pid, wp.id).await?;
                Ok(if n >= v {
                    Ok(())
                } else {
                    Err(format!("{n} hits"))
                })
            })
            .await?;
        }
        let r = rpc_ok(
            "GetRecentHits",
            c.get_recent_hits(GetRecentHitsRequest {
                watchpoint_id: wp.id,
                ..Default::default()
            }),
        )
        .await?;
        ensure!(r.total == 6, "total {}", r.total);
        let (file, line) = line_of("bump_counter");
        let mut values = Vec::new();
        let mut last_seq = 0;
        for item in &r.hits {
            let Some(Event::Hit(h)) = &item.event else {
                anyhow::bail!("not a hit: {item:?}");
            };
            ensure!(item.seq > last_seq, "not oldest first: {:?}", r.hits);
            last_seq = item.seq;
            ensure!(h.tid == t.pid && h.watchpoint_id == wp.id, "{h:?}");
            let loc = h.location.as_ref().context("not symbolized")?;
            ensure!(
                loc.function == "bump_counter" && loc.file.ends_with(file) && loc.line == line,
                "{loc:?}"
            );
            let mut b = [0u8; 8];
            b[..h.value.len()].copy_from_slice(&h.value);
            values.push(u64::from_le_bytes(b));
        }
        ensure!(
            values == [3, 4, 5, 6],
            "kept {values:?}, want the last four"
        );
        // The last two, raw.
        let r = rpc_ok(
            "GetRecentHits(limit 2, raw)",
            c.get_recent_hits(GetRecentHitsRequest {
                watchpoint_id: wp.id,
                limit: 2,
                raw: true,
            }),
        )
        .await?;
        ensure!(r.hits.len() == 2, "{r:?}");
        ensure!(
            r.hits
                .iter()
                .all(|i| matches!(&i.event, Some(Event::Hit(h)) if h.location.is_none())),
            "raw hits carry no location: {r:?}"
        );
        // Too many to keep, and a watchpoint that does not exist.
        expect_status(
            "keep_recent 4097",
            c.set_watchpoint(SetWatchpointRequest {
                spec: Some(spec(backend, t.pid, 4097)),
            })
            .await,
            Code::InvalidArgument,
            &["keep_recent", "4096"],
        )?;
        expect_status(
            "GetRecentHits of nothing",
            c.get_recent_hits(GetRecentHitsRequest {
                watchpoint_id: wp.id + 100,
                ..Default::default()
            })
            .await,
            Code::NotFound,
            &["no watchpoint"],
        )?;
        Ok(())
    }
    .await;
    daemon.finish(result)
}
