//! Fleet: how long a daemon killed with a watchpoint armed on N threads
//! takes to have it armed again after its restart (against arming it on a
//! fresh daemon, in the same run); what the journal costs the daemon at full
//! hit rate (against `--state-dir none`). Export (its own section): how fast
//! a backlog of journaled events goes out to a real NATS JetStream server,
//! against the rate it was produced at.

use crate::*;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use wpd_proto::v1::{
    Access, GetStatsRequest, GetStatsResponse, ListWatchpointsRequest, SetWatchpointRequest,
    StreamEventsRequest, WatchpointSpec,
};
use wpd_tests::{Backend, CTarget, Client, Daemon, NatsServer, nats_server_bin};

pub(crate) async fn section_fleet(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    recovery(args).await?;
    journal_cost(args, false).await?;
    journal_cost(args, true).await?;
    section_done(t0);
    Ok(())
}

pub(crate) async fn section_export(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    export(args).await?;
    section_done(t0);
    Ok(())
}

/// The journal's cost at full hit rate alone (`--only journal`).
pub(crate) async fn section_journal(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    journal_cost(args, false).await?;
    journal_cost(args, true).await?;
    section_done(t0);
    Ok(())
}

fn counter(pid: i32) -> WatchpointSpec {
    WatchpointSpec {
        pid,
        symbol: "counter".into(),
        access: Access::Write as i32,
        backend: Backend::Perf as i32,
        ..Default::default()
    }
}

async fn stats(c: &mut Client) -> Result<GetStatsResponse> {
    Ok(c.get_stats(GetStatsRequest {}).await?.into_inner())
}

/// Armed threads of the only watchpoint of `pid`, if listed.
async fn armed(c: &mut Client, pid: i32) -> Result<Option<u64>> {
    let l = c
        .list_watchpoints(ListWatchpointsRequest { pid: 0 })
        .await?
        .into_inner();
    Ok(l.watchpoints
        .iter()
        .find(|w| w.spec.as_ref().is_some_and(|s| s.pid == pid))
        .map(|w| u64::from(w.armed_threads)))
}

async fn recovery(args: &Args) -> Result<()> {
    println!("## fleet: recovery after SIGKILL (perf backend, one watchpoint by name)\n");
    println!(
        "| threads | arm on a fresh daemon ms | kill → restarted daemon answers ms | kill → armed on every thread ms | ratio (armed / fresh arm + start) |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for &n in &args.threads {
        let mut t = CTarget::start("ct-pie").await?;
        let r = t.cmd(&format!("threads {}", n.saturating_sub(1))).await?;
        ensure!(r.starts_with("THREADS"), "threads: {r:?}");
        let (mut fresh, mut ready, mut total, mut start) = (vec![], vec![], vec![], vec![]);
        for _ in 0..args.reps {
            let s0 = Instant::now();
            let mut first = Daemon::start().await?;
            start.push(ms(s0.elapsed()));
            let mut c = first.client().await?;
            let a0 = Instant::now();
            c.set_watchpoint(SetWatchpointRequest {
                spec: Some(counter(t.pid)),
            })
            .await?;
            fresh.push(ms(a0.elapsed()));
            let k0 = Instant::now();
            first.kill().await?;
            let second = Daemon::restart_from(&first, &[]).await?;
            ready.push(ms(k0.elapsed()));
            let mut c = second.client().await?;
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                if armed(&mut c, t.pid).await? == Some(n as u64) {
                    break;
                }
                ensure!(Instant::now() < deadline, "not armed again within 120 s");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            total.push(ms(k0.elapsed()));
            drop(second);
            drop(first);
        }
        let (f, r, a, s) = (spread(fresh), spread(ready), spread(total), spread(start));
        println!(
            "| {n} | {:.1} ({:.1}–{:.1}) | {:.1} ({:.1}–{:.1}) | {:.1} ({:.1}–{:.1}) | {:.2} |",
            f.med,
            f.min,
            f.max,
            r.med,
            r.min,
            r.max,
            a.med,
            a.min,
            a.max,
            a.med / (f.med + s.med)
        );
    }
    println!(
        "\n(\"answers\": the restarted daemon answers GetCapabilities, polled every 50 ms; the \
         watchpoint is set again while the API is served. \"fresh daemon\": started and the same \
         watchpoint set, the sum of both is the ratio's base.)\n"
    );
    Ok(())
}

/// How long writers run: 2 s, or the smoke run's window.
fn spin_for(args: &Args) -> Duration {
    if args.smoke {
        args.window
    } else {
        Duration::from_secs(2)
    }
}

/// CPU time (user + system, all threads) of process `pid`.
fn cpu_of(pid: i32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').context("stat")?.1;
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|w| w.parse().unwrap_or(0))
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_millis((f[11] + f[12]) * 1000 / hz))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Daemon CPU per hit with a journal and without, writers storing as fast
/// as they can for 2 s, nobody subscribed or one raw subscriber of the
/// hits (which gets the bytes the journal encoded).
async fn journal_cost(args: &Args, subscribed: bool) -> Result<()> {
    println!(
        "## fleet: the journal at full hit rate (perf, 2 writers for {} ms, {})\n",
        spin_for(args).as_millis(),
        if subscribed {
            "one raw subscriber of the hits"
        } else {
            "nobody subscribed"
        }
    );
    println!(
        "| daemon | hits | daemon CPU µs/hit | of it, µs/hit: drain / journal writer / other threads | journaled | lost by the journal | fdatasyncs (mean ms) |"
    );
    println!("|---|---:|---:|---|---:|---:|---:|");
    let mut per_hit = Vec::new();
    for round in 0..args.reps.max(1) * 2 {
        let journal = round % 2 == 0;
        let extra: &[&str] = if journal {
            &[]
        } else {
            &["--state-dir", "none"]
        };
        let daemon = Daemon::start_with_args(extra).await?;
        let mut t = CTarget::start("ct-pie").await?;
        let mut c = daemon.client().await?;
        c.set_watchpoint(SetWatchpointRequest {
            spec: Some(counter(t.pid)),
        })
        .await?;
        // The subscriber reads and drops every message, on its own
        // connection, until the daemon goes.
        let reader = if subscribed {
            let mut stream = daemon
                .client()
                .await?
                .stream_events(StreamEventsRequest {
                    raw: true,
                    pid: t.pid,
                    hits_only: true,
                    ..Default::default()
                })
                .await?
                .into_inner();
            Some(tokio::spawn(async move {
                while let Ok(Some(_)) = stream.message().await {}
            }))
        } else {
            None
        };
        let before = stats(&mut c).await?;
        let cpu0 = daemon.cpu_time()?;
        let roles0 = thread_cpu_us_by_role(daemon.pid())?;
        t.cmd("spin 2").await?;
        tokio::time::sleep(spin_for(args)).await;
        t.cmd("stop").await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let cpu = daemon.cpu_time()? - cpu0;
        let roles = thread_cpu_us_by_role(daemon.pid())?;
        let after = stats(&mut c).await?;
        if let Some(r) = reader {
            r.abort();
        }
        let hits = after.hits - before.hits;
        let us = cpu.as_secs_f64() * 1e6 / hits.max(1) as f64;
        per_hit.push((journal, us));
        // Where the daemon's CPU went, per hit: the drain thread (decoding,
        // publishing, and encoding into the journal's queue), the journal's
        // writer, everything else (tokio workers, other threads).
        let role = |name: &str| {
            (roles.get(name).copied().unwrap_or(0.0) - roles0.get(name).copied().unwrap_or(0.0))
                / hits.max(1) as f64
        };
        let (drain, writer) = (role("wpd-drain"), role("wpd-journal"));
        println!(
            "| {} | {hits} | {us:.2} | {drain:.2} / {writer:.2} / {:.2} | {} | {} | {} ({:.2}) |",
            if journal {
                "journal (default)"
            } else {
                "--state-dir none"
            },
            us - drain - writer,
            after.journal_written_seq - before.journal_written_seq,
            after.journal_lagged,
            after.journal_fsyncs,
            after.journal_fsync_us as f64 / after.journal_fsyncs.max(1) as f64 / 1000.0
        );
    }
    let with: Vec<f64> = per_hit.iter().filter(|p| p.0).map(|p| p.1).collect();
    let without: Vec<f64> = per_hit.iter().filter(|p| !p.0).map(|p| p.1).collect();
    println!(
        "\ndaemon CPU per hit, journal / none (medians): {:.2}\n",
        median(with) / median(without)
    );
    Ok(())
}

/// A backlog of events journaled while the server is down, then the time
/// the export takes to have every one acknowledged once it is back.
async fn export(args: &Args) -> Result<()> {
    if nats_server_bin().is_none() {
        println!("## export — skipped, nats-server is not installed\n");
        return Ok(());
    }
    println!("## export of a backlog to NATS JetStream (file storage, same machine)\n");
    println!(
        "| backlog events | produced at (hits/s) | exported at (events/s, first ack → last) | ratio export / production | published (with repeats) | CPU while draining: wpd / nats-server (of 2 CPUs × s) | wpd CPU per exported event (µs) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for _ in 0..args.reps {
        let mut nats = NatsServer::start().await?;
        let url = nats.url();
        nats.kill().await?;
        let daemon = Daemon::start_with_args(&["--export-nats", &url]).await?;
        let mut t = CTarget::start("ct-pie").await?;
        let mut c = daemon.client().await?;
        c.set_watchpoint(SetWatchpointRequest {
            spec: Some(counter(t.pid)),
        })
        .await?;
        let p0 = Instant::now();
        t.cmd("spin 2").await?;
        tokio::time::sleep(spin_for(args)).await;
        t.cmd("stop").await?;
        let produced_for = p0.elapsed();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let written = stats(&mut c).await?.journal_written_seq;
        nats.restart().await?;
        let nats_pid = nats.pid().context("nats-server pid")?;
        let (wpd_cpu0, nats_cpu0) = (daemon.cpu_time()?, cpu_of(nats_pid)?);
        let deadline = Instant::now() + Duration::from_secs(300);
        let (mut first, mut first_acked) = (None, 0);
        let end = loop {
            let s = stats(&mut c).await?;
            if first.is_none() && s.export_acked_seq > 0 {
                first = Some(Instant::now());
                first_acked = s.export_acked_seq;
            }
            if s.export_acked_seq >= written {
                break s;
            }
            ensure!(
                Instant::now() < deadline,
                "export stuck at {} of {written}",
                s.export_acked_seq
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let (wpd_cpu, nats_cpu) = (
            (daemon.cpu_time()? - wpd_cpu0).as_secs_f64(),
            (cpu_of(nats_pid)? - nats_cpu0).as_secs_f64(),
        );
        let took = first.context("no ack")?.elapsed().as_secs_f64();
        let rate = (written - first_acked) as f64 / took.max(1e-3);
        let produced = written as f64 / produced_for.as_secs_f64();
        let exported = (written - first_acked).max(1) as f64;
        println!(
            "| {written} | {produced:.0} | {rate:.0} | {:.2} | {} | {wpd_cpu:.2} / {nats_cpu:.2} of {took:.2} | {:.1} |",
            rate / produced,
            end.export_published,
            wpd_cpu * 1e6 / exported
        );
        drop(daemon);
    }
    println!();
    Ok(())
}
