//! Hit throughput: hits per second delivered, none lost, daemon CPU per hit.

use crate::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use wpd_proto::v1::StreamEventsRequest;
use wpd_tests::{Backend, Daemon, Event, TargetProc, attach, set_watchpoint_within, write_spec};

/// What a subscriber counted.
#[derive(Default)]
pub(crate) struct SubCounts {
    hits: AtomicU64,
    dropped: AtomicU64,
    lost: AtomicU64,
    /// ns since the subscriber's start when the last hit arrived.
    last_hit_ns: AtomicU64,
}

pub(crate) struct ThroughputRun {
    writers: usize,
    pub(crate) secs: f64,
    base_rate: f64,
    stores: u64,
    pub(crate) daemon_hits: u64,
    pub(crate) sub_hits: u64,
    dropped: u64,
    records_lost: u64,
    kernel_lost: u64,
    subscriber_dropped: u64,
    lag_ms: f64,
    pub(crate) daemon_cpu_us: f64,
    daemon_idle_cpu_us: f64,
    pub(crate) bench_cpu_us: f64,
    /// Daemon CPU over the hits, by thread role (µs).
    daemon_cpu_by_role: BTreeMap<String, f64>,
}

pub(crate) async fn throughput_once(
    backend: Backend,
    writers: usize,
    window: Duration,
    raw: bool,
    daemon_args: &[&str],
    aggregate: bool,
) -> Result<ThroughputRun> {
    let mut target = TargetProc::start(&["--threads", "1", "--interval-us", "1000000"]).await?;
    let hammer_cmd = format!("hammer {HAMMER_VAR} {writers} {}", window.as_millis());
    let reply_timeout = window + Duration::from_secs(120);
    let hammer = async |t: &mut TargetProc| -> Result<(u64, f64)> {
        let r = t
            .cmd_within(&hammer_cmd, reply_timeout)
            .await?
            .context("no reply to hammer")?;
        Ok((
            wpd_tests::field(&r, "stores")?,
            wpd_tests::field::<f64>(&r, "ns")? / 1e9,
        ))
    };
    let (base_stores, base_secs) = hammer(&mut target).await?;
    let daemon = Daemon::start_with_args(daemon_args).await?;
    let dpid = daemon.pid();
    let mut client = daemon.client().await?;
    attach(&mut client, target.pid, backend).await?;
    let mut spec = write_spec(backend, target.pid, target.vars[HAMMER_VAR]);
    // Aggregate mode: counted in the daemon, 10 samples a second streamed.
    spec.aggregate = aggregate;
    let wp = set_watchpoint_within(&mut client, spec, Duration::from_secs(30))
        .await?
        .watchpoint
        .context("no watchpoint")?;
    // The subscriber: its own connection, hits of this watchpoint only.
    let mut sub_client = daemon.client().await?;
    let mut stream = sub_client
        .stream_events(StreamEventsRequest {
            raw,
            lease: false,
            pid: target.pid,
            watchpoint_ids: vec![wp.id],
            hits_only: true,
            // Each place's fields once, as a client that shows many hits
            // asks (`wpctl events` does); the subscriber fills them in.
            places_once: !raw,
            ..Default::default()
        })
        .await?
        .into_inner();
    let counts = Arc::new(SubCounts::default());
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let sub_start = Instant::now();
    let task = {
        let counts = counts.clone();
        tokio::spawn(async move {
            let mut places = wpd_proto::places::Places::new();
            loop {
                tokio::select! {
                    biased;
                    _ = &mut stop_rx => return Ok(()),
                    msg = stream.message() => match msg? {
                        None => bail!("the event stream ended"),
                        Some(mut m) => match m.event {
                            Some(Event::Hit(_)) => {
                                places.fill_event(&mut m);
                                counts.hits.fetch_add(1, Ordering::Relaxed);
                                counts.last_hit_ns.store(
                                    sub_start.elapsed().as_nanos() as u64,
                                    Ordering::Relaxed,
                                );
                            }
                            Some(Event::Dropped(d)) => {
                                counts.dropped.fetch_add(d.count, Ordering::Relaxed);
                            }
                            Some(Event::RecordsLost(l)) => {
                                counts.lost.fetch_add(l.count, Ordering::Relaxed);
                            }
                            _ => {}
                        },
                    },
                }
            }
        })
    };
    // Baseline: the daemon's CPU over the same time with no hit.
    let c0 = proc_cpu_us(dpid)?;
    tokio::time::sleep(window).await;
    let daemon_idle_cpu_us = proc_cpu_us(dpid)? - c0;
    let s0 = stats(&mut client).await?;
    let (c1, b1) = (proc_cpu_us(dpid)?, proc_cpu_us(std::process::id() as i32)?);
    let roles1 = thread_cpu_us_by_role(dpid)?;
    let (stores, secs) = hammer(&mut target).await?;
    let hammer_end = sub_start.elapsed();
    // Wait until everything arrived, or nothing moved for 5 s (lost records never come; a
    // loaded machine's stream may pause for a second or two).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = (u64::MAX, u64::MAX);
    let mut still_since = Instant::now();
    loop {
        let now = (
            counts.hits.load(Ordering::Relaxed),
            wp_hits(&mut client, target.pid).await?,
        );
        if now.0 >= stores && now.1 >= stores {
            break;
        }
        if now != last {
            last = now;
            still_since = Instant::now();
        } else if still_since.elapsed() > Duration::from_secs(5) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (c2, b2) = (proc_cpu_us(dpid)?, proc_cpu_us(std::process::id() as i32)?);
    let mut daemon_cpu_by_role = thread_cpu_us_by_role(dpid)?;
    for (role, us) in daemon_cpu_by_role.iter_mut() {
        *us -= roles1.get(role).copied().unwrap_or(0.0);
    }
    daemon_cpu_by_role.retain(|_, us| *us > 0.0);
    let s1 = stats(&mut client).await?;
    let daemon_hits = wp_hits(&mut client, target.pid).await?;
    let _ = stop_tx.send(());
    task.await??;
    let last_hit = Duration::from_nanos(counts.last_hit_ns.load(Ordering::Relaxed));
    drop(target);
    drop(daemon);
    Ok(ThroughputRun {
        writers,
        secs,
        base_rate: base_stores as f64 / base_secs,
        stores,
        daemon_hits,
        sub_hits: counts.hits.load(Ordering::Relaxed),
        dropped: counts.dropped.load(Ordering::Relaxed),
        records_lost: counts.lost.load(Ordering::Relaxed),
        kernel_lost: s1.kernel_lost - s0.kernel_lost,
        subscriber_dropped: s1.subscriber_dropped - s0.subscriber_dropped,
        lag_ms: ms(last_hit.saturating_sub(hammer_end)),
        daemon_cpu_us: c2 - c1,
        daemon_idle_cpu_us,
        bench_cpu_us: b2 - b1,
        daemon_cpu_by_role,
    })
}

pub(crate) async fn section_throughput(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    let ncpu = wpd_tests::online_cpus().len().max(1);
    let mut writer_counts = vec![1];
    if ncpu > 1 {
        writer_counts.push(ncpu);
    }
    println!(
        "## hit throughput: writers store to a watched variable for {} ms; one gRPC subscriber\n",
        args.window.as_millis()
    );
    println!(
        "| backend | writers | stores/s, no watchpoint | stores (= hits made) | hits counted by wpd | hits received by subscriber | lost: EventsDropped / RecordsLost (stream); subscriber_dropped / kernel_lost (GetStats) | hits/s received | last hit after the writers stopped (ms) | daemon CPU µs per hit | daemon CPU over the same time, no hits (ms) | subscriber (bench) CPU µs per hit | daemon CPU µs per hit by thread |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|");
    // ptrace twice: its default signal stops, and debug registers (what it
    // did before signal stops, and still does where bpf() is refused).
    // perf twice too: its per-thread path (the default where bpf() is
    // allowed: a BPF program records each hit) and its per-CPU rings.
    // And perf's per-thread path in aggregate mode: every hit counted in the
    // daemon, 10 a second streamed.
    let configs: [(Backend, &str, &[&str], bool); 5] = [
        (
            Backend::Perf,
            "perf, per-thread",
            &["--perf-events", "per-thread"],
            false,
        ),
        (
            Backend::Perf,
            "perf, per-thread, aggregate mode",
            &["--perf-events", "per-thread"],
            true,
        ),
        (
            Backend::Perf,
            "perf, per-cpu",
            &["--perf-events", "per-cpu"],
            false,
        ),
        (Backend::Ptrace, "ptrace, signal stops", &[], false),
        (
            Backend::Ptrace,
            "ptrace, debug registers",
            &["--ptrace-stops", "debug-registers"],
            false,
        ),
    ];
    for (backend, label, daemon_args, aggregate) in configs {
        for &w in &writer_counts {
            // One run per configuration (a run is the window); the median
            // over reps of hits/s picks the row.
            let mut runs = Vec::new();
            for _ in 0..args.reps {
                runs.push(
                    throughput_once(backend, w, args.window, false, daemon_args, aggregate).await?,
                );
            }
            runs.sort_by(|a, b| {
                (a.sub_hits as f64 / a.secs).total_cmp(&(b.sub_hits as f64 / b.secs))
            });
            let r = &runs[runs.len() / 2];
            let per_hit = |cpu: f64| {
                if r.daemon_hits == 0 {
                    "–".to_string()
                } else {
                    format!("{:.2}", cpu / r.daemon_hits as f64)
                }
            };
            let by_role = r
                .daemon_cpu_by_role
                .iter()
                .map(|(role, us)| format!("{role} {}", per_hit(*us)))
                .collect::<Vec<_>>()
                .join(", ");
            println!(
                "| {} | {} | {:.0} | {} | {} | {} | {} / {} / {} / {} | {:.0} | {:.1} | {} | {:.0} | {} | {} |",
                label,
                r.writers,
                r.base_rate,
                r.stores,
                r.daemon_hits,
                r.sub_hits,
                r.dropped,
                r.records_lost,
                r.subscriber_dropped,
                r.kernel_lost,
                r.sub_hits as f64 / r.secs,
                r.lag_ms,
                per_hit(r.daemon_cpu_us),
                r.daemon_idle_cpu_us / 1e3,
                per_hit(r.bench_cpu_us),
                if by_role.is_empty() {
                    "–".to_string()
                } else {
                    by_role
                },
            );
            flush();
        }
    }
    if args.reps > 1 {
        println!(
            "\nEach row is the run with the median hits/s of {} runs.",
            args.reps
        );
    }
    section_done(t0);
    Ok(())
}
