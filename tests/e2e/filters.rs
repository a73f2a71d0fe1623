//! Conditions, ignore counts, hit counts and rate limits, judged in the
//! daemon where hits are decoded: only the hits they let through are
//! reported and counted as hits; the others are counted apart; with a stop
//! action, a hit that is not reported holds no thread.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use tonic::Code;
use wpd_proto::v1::hit_condition::Op;
use wpd_proto::v1::{
    Access, HitAction, HitCondition, ListWatchpointsRequest, SetWatchpointRequest, Watchpoint,
    WatchpointSpec,
};
use wpd_tests::{
    Backend, CTarget, Client, Daemon, EventStream, both_backends, expect_status, hit_value_u64,
    hits_only, leaks::remove, resume, rpc, rpc_ok, set_watchpoint,
};

fn spec(backend: Backend, pid: i32, name: &str) -> WatchpointSpec {
    WatchpointSpec {
        pid,
        symbol: name.into(),
        access: Access::Write as i32,
        backend: backend as i32,
        ..Default::default()
    }
}

fn cond(op: Op, operand: u64, mask: u64) -> Option<HitCondition> {
    Some(HitCondition {
        value: String::new(),
        op: op as i32,
        operand,
        mask,
    })
}

async fn listed(client: &mut Client, pid: i32, id: u64) -> Result<Watchpoint> {
    rpc_ok(
        "ListWatchpoints",
        client.list_watchpoints(ListWatchpointsRequest { pid }),
    )
    .await?
    .watchpoints
    .into_iter()
    .find(|w| w.id == id)
    .context("the watchpoint is not listed")
}

/// Stores `values` into `name` from the main thread, one at a time: each
/// store is judged (counted as a hit or as filtered) before the next, so
/// that perf, which reads the value just after the hit, reads that store's.
/// Returns the values of the hits of watchpoint `id` reported.
async fn reported(
    client: &mut Client,
    t: &mut CTarget,
    events: &mut EventStream,
    id: u64,
    name: &str,
    values: &[u64],
) -> Result<Vec<u64>> {
    let pid = t.pid;
    let judged = async |client: &mut Client| -> Result<u64> {
        let w = listed(client, pid, id).await?;
        Ok(w.hits + w.hits_filtered)
    };
    let start = judged(client).await?;
    for (i, v) in values.iter().enumerate() {
        t.cmd(&format!("set {name} {v}")).await?;
        let want = start + i as u64 + 1;
        wpd_tests::poll_until(
            Duration::from_secs(10),
            "the store to be judged",
            async || {
                let n = judged(client).await?;
                Ok(if n >= want {
                    Ok(())
                } else {
                    Err(format!("{n} judged, want {want}"))
                })
            },
        )
        .await?;
    }
    let w = listed(client, pid, id).await?;
    let hits = events
        .collect_hits(w.hits as usize, Duration::from_secs(10))
        .await?;
    hits.iter()
        .filter(|h| h.watchpoint_id == id)
        .map(|h| value(&h.value).with_context(|| format!("no value: {h:?}")))
        .collect()
}

/// A hit's value: its bytes, little-endian (1 to 8 of them).
fn value(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 8 {
        return None;
    }
    let mut b = [0u8; 8];
    b[..bytes.len()].copy_from_slice(bytes);
    Some(u64::from_le_bytes(b))
}

both_backends!(conditions_and_counts_choose_the_hits);

async fn conditions_and_counts_choose_the_hits(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events = EventStream::subscribe(&mut client, hits_only(t.pid)).await?;

            // == 7 on counter.
            let mut s = spec(backend, t.pid, "counter");
            s.condition = cond(Op::Eq, 7, 0);
            let id = set_watchpoint(&mut client, s)
                .await?
                .watchpoint
                .context("none")?
                .id;
            let got = reported(
                &mut client,
                &mut t,
                &mut events,
                id,
                "counter",
                &[5, 7, 9, 7],
            )
            .await?;
            ensure!(got == [7, 7], "== 7 reported {got:?}");
            let w = listed(&mut client, t.pid, id).await?;
            ensure!((w.hits, w.hits_filtered) == (2, 2), "{w:?}");
            let c = w
                .spec
                .as_ref()
                .and_then(|s| s.condition.clone())
                .context("no condition listed")?;
            ensure!(c.op == Op::Eq as i32 && c.operand == 7, "{c:?}");
            remove(&mut client, id).await?;

            // A mask: the low byte of counter == 3.
            let mut s = spec(backend, t.pid, "counter");
            s.condition = cond(Op::Eq, 3, 0xff);
            let id = set_watchpoint(&mut client, s)
                .await?
                .watchpoint
                .context("none")?
                .id;
            let got = reported(
                &mut client,
                &mut t,
                &mut events,
                id,
                "counter",
                &[3, 0x103, 4, 0x204],
            )
            .await?;
            ensure!(got == [3, 0x103], "&0xff == 3 reported {got:?}");
            remove(&mut client, id).await?;

            // changed, then the first 2 ignored and every 2nd after.
            let mut s = spec(backend, t.pid, "counter");
            s.condition = cond(Op::Changed, 0, 0);
            let id = set_watchpoint(&mut client, s)
                .await?
                .watchpoint
                .context("none")?
                .id;
            let got = reported(
                &mut client,
                &mut t,
                &mut events,
                id,
                "counter",
                &[1, 1, 2, 2, 1],
            )
            .await?;
            ensure!(got == [1, 2, 1], "changed reported {got:?}");
            remove(&mut client, id).await?;
            let mut s = spec(backend, t.pid, "initialized");
            s.ignore_count = 2;
            s.hit_count = 2;
            let id = set_watchpoint(&mut client, s)
                .await?
                .watchpoint
                .context("none")?
                .id;
            let got = reported(
                &mut client,
                &mut t,
                &mut events,
                id,
                "initialized",
                &[1, 2, 3, 4, 5, 6, 7, 8],
            )
            .await?;
            ensure!(got == [4, 6, 8], "ignore 2, every 2nd reported {got:?}");
            let w = listed(&mut client, t.pid, id).await?;
            ensure!((w.hits, w.hits_filtered) == (3, 5), "{w:?}");
            Ok(())
        }
        .await,
    )
}

both_backends!(a_rate_limit_drops_and_counts);

/// A spinning writer at a rate limit of 20 hits/s: hits are dropped and
/// counted, and the reported ones say how many were dropped before them.
async fn a_rate_limit_drops_and_counts(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events = EventStream::subscribe(&mut client, hits_only(t.pid)).await?;
            let mut s = spec(backend, t.pid, "counter");
            s.max_hits_per_second = 20;
            let id = set_watchpoint(&mut client, s)
                .await?
                .watchpoint
                .context("none")?
                .id;
            t.cmd("spin 1").await?;
            let hits = events.collect_hits(25, Duration::from_secs(20)).await?;
            t.cmd("stop").await?;
            let said: u64 = hits.iter().map(|h| h.rate_limited_before).sum();
            ensure!(said > 0, "no hit says that hits were dropped before it");
            let w = listed(&mut client, t.pid, id).await?;
            ensure!(
                w.hits_rate_limited >= said && w.hits_rate_limited > 0,
                "{said} said dropped, {w:?}"
            );
            ensure!(w.hits >= 25, "{w:?}");
            Ok(())
        }
        .await,
    )
}

/// With a stop action, only a hit that satisfies the condition holds the
/// thread (ptrace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_reported_hit_stops_the_thread() -> Result<()> {
    if !wpd_tests::require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events = EventStream::subscribe(&mut client, hits_only(t.pid)).await?;
            let mut s = spec(Backend::Ptrace, t.pid, "counter");
            s.condition = cond(Op::Gt, 100, 0);
            s.action = HitAction::Stop as i32;
            set_watchpoint(&mut client, s).await?;
            // Not > 100: the store goes on, the command is answered.
            t.cmd("set counter 5").await?;
            // > 100: held at the hit, no answer until resumed.
            t.send("set counter 500")?;
            let hit = events
                .collect_hits(1, Duration::from_secs(10))
                .await?
                .remove(0);
            ensure!(hit.stopped && hit_value_u64(&hit) == Some(500), "{hit:?}");
            ensure!(
                t.reply(Duration::from_millis(300)).await?.is_none(),
                "the thread was not held"
            );
            resume(&mut client, t.pid, &[]).await?;
            let r = t.reply(Duration::from_secs(10)).await?;
            ensure!(r.as_deref() == Some("SET"), "after resume: {r:?}");
            Ok(())
        }
        .await,
    )
}

/// Conditions the daemon cannot judge are refused, and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_it_cannot_judge_are_refused() -> Result<()> {
    if !wpd_tests::require_backend(Backend::Perf) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut over = spec(Backend::Perf, t.pid, "stats");
            over.condition = cond(Op::Eq, 1, 0);
            let mut exec = spec(Backend::Perf, t.pid, "bump_counter");
            exec.access = Access::Exec as i32;
            exec.length = 1;
            exec.condition = cond(Op::Eq, 1, 0);
            let mut unknown = spec(Backend::Perf, t.pid, "counter");
            unknown.condition = Some(HitCondition {
                value: String::new(),
                op: 99,
                operand: 0,
                mask: 0,
            });
            for (what, s, needle) in [
                ("a condition over 4 slots", over, "one slot"),
                ("a condition on exec", exec, "exec"),
                ("an unknown operator", unknown, "operator"),
            ] {
                let r = rpc(client.set_watchpoint(SetWatchpointRequest { spec: Some(s) })).await?;
                expect_status(what, r, Code::InvalidArgument, &[needle])?;
            }
            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(
                list.watchpoints.is_empty() && list.processes.is_empty(),
                "{list:?}"
            );
            Ok(())
        }
        .await,
    )
}
