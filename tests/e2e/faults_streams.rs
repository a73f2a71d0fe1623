//! Fault injection: clients vanishing mid-stream (fault 5).
//!
//! Every test runs the real daemon against real targets it starts itself, bounds every wait,
//! relies on the harness guards to kill everything on any path, and ends by checking that the
//! targets survived (no SIGTRAP, `ping` answers) and that nothing leaked (`wpd_tests::leaks`).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use wpd_proto::v1::ListWatchpointsRequest;
use wpd_tests::leaks::*;
use wpd_tests::{
    Backend, Daemon, EventStream, TargetProc, both_backends, require_backend, rpc_ok,
    set_watchpoint, wait_for_subscribers, write_spec,
};

/// Timeout of every wait for hits.
const HIT_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// 5. A client disconnects mid-stream
// ---------------------------------------------------------------------------------------------

both_backends!(
    /// 5. A subscriber reads a few hits and goes away — first dropping only its stream, then
    /// its whole connection: `GetStats.subscribers` is back to its previous value each time
    /// (moments later), and the daemon keeps serving (a new stream gets hits).
    client_disconnects_mid_stream
);

async fn client_disconnects_mid_stream(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "4"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let base = Baseline::take(&daemon, &mut client).await?;
            let pid = target.pid;
            let wp = set_watchpoint(&mut client, write_spec(backend, pid, target.vars[0]))
                .await?
                .watchpoint
                .unwrap_or_default();
            let before = get_stats(&mut client).await?.subscribers;

            // The stream goes, the connection stays (HTTP/2 RST_STREAM).
            let mut sub = daemon.client().await?;
            let mut stream = EventStream::for_pid(&mut sub, pid).await?;
            stream.collect_hits(5, HIT_TIMEOUT).await?;
            wait_for_subscribers(&mut client, before + 1)
                .await
                .context("subscribed")?;
            drop(stream);
            wait_for_subscribers(&mut client, before)
                .await
                .context("stream dropped, connection open")?;

            // The whole connection goes.
            let mut sub2 = daemon.client().await?;
            let mut stream = EventStream::for_pid(&mut sub2, pid).await?;
            stream.collect_hits(5, HIT_TIMEOUT).await?;
            wait_for_subscribers(&mut client, before + 1)
                .await
                .context("subscribed again")?;
            drop(stream);
            drop(sub2);
            wait_for_subscribers(&mut client, before)
                .await
                .context("connection closed")?;

            // The daemon keeps serving, on the old connection and on a new one.
            let mut stream = EventStream::for_pid(&mut sub, pid).await?;
            let hits = stream.collect_hits(5, HIT_TIMEOUT).await?;
            ensure!(
                hits.iter().all(|h| h.watchpoint_id == wp.id),
                "unexpected hits {hits:?}"
            );
            drop(stream);
            drop(sub);
            let mut other = daemon.client().await?;
            let listed = rpc_ok(
                "ListWatchpoints",
                other.list_watchpoints(ListWatchpointsRequest { pid }),
            )
            .await?;
            ensure!(
                listed
                    .watchpoints
                    .iter()
                    .any(|w| w.id == wp.id && w.hits > 0),
                "watchpoint {} not listed with hits: {:?}",
                wp.id,
                listed.watchpoints
            );
            drop(other);
            wait_for_subscribers(&mut client, before)
                .await
                .context("every subscriber gone")?;

            ensure_survived(&mut target).await?;
            remove(&mut client, wp.id).await?;
            detach(&mut client, pid).await?;
            ensure_clean(&daemon, &mut client, base, &[pid]).await?;
            let (c, _) = target.ping().await?;
            target.wait_counter_above(c, Duration::from_secs(5)).await?;
            ensure_survived(&mut target).await
        }
        .await,
    )
}

/// 5'. The same disconnect on a stream that carries nothing (e.g. an idle `wpctl events`): the
/// daemon must notice it without waiting for an event, or every abandoned idle subscriber
/// counts against the subscriber limit forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_stream_disconnect_is_noticed() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let base = Baseline::take(&daemon, &mut client).await?;
            let before = get_stats(&mut client).await?.subscribers;
            let mut sub = daemon.client().await?;
            let stream = EventStream::for_pid(&mut sub, 0).await?;
            wait_for_subscribers(&mut client, before + 1)
                .await
                .context("subscribed")?;
            drop(stream);
            drop(sub);
            wait_for_subscribers(&mut client, before)
                .await
                .context("idle stream and its connection closed")?;
            ensure_clean(&daemon, &mut client, base, &[]).await
        }
        .await,
    )
}
