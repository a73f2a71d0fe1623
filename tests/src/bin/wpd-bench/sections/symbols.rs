//! Symbols: what names and symbolized hits cost, against the same work by
//! address and with raw hits, in one run.
//!
//! - hit throughput with symbolized hits against raw ones (the same hammer,
//!   the same daemon build; only the subscription differs);
//! - `SetWatchpoint` by name against by address on an N-thread C target,
//!   once the module is loaded (and the first, cold, by-name call apart);
//! - a program whose 1,000 functions each store once into the watched
//!   variable: the time until all 1,000 symbolized hits arrived, first
//!   (every address new) and again (cached), against raw; `/proc/PID/maps`
//!   reads and cache sizes from `GetStats`, and the daemon's RSS.

use crate::*;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use wpd_proto::v1::{RemoveWatchpointRequest, StreamEventsRequest, WatchpointSpec};
use wpd_tests::{Backend, CTarget, Daemon, EventStream, attach, rpc_ok, set_watchpoint_within};

/// A write watchpoint on `counter` of `pid`, by name or at `addr`.
fn counter_spec(backend: Backend, pid: i32, by_name: bool, addr: u64) -> WatchpointSpec {
    WatchpointSpec {
        pid,
        symbol: if by_name {
            "counter".into()
        } else {
            String::new()
        },
        address: if by_name { 0 } else { addr },
        length: if by_name { 0 } else { 8 },
        access: wpd_proto::v1::Access::Write as i32,
        backend: backend as i32,
        ..Default::default()
    }
}

pub(crate) async fn section_symbols(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    throughput_rows(args).await?;
    by_name_rows(args).await?;
    many_ips_rows(args).await?;
    section_done(t0);
    Ok(())
}

/// Hits/s with symbolized hits against raw ones, perf and ptrace, with one
/// writer and with as many as CPUs.
async fn throughput_rows(args: &Args) -> Result<()> {
    let ncpu = wpd_tests::online_cpus().len().max(1);
    let mut writer_counts = vec![1];
    if ncpu > 1 {
        writer_counts.push(ncpu);
    }
    println!(
        "## symbols: hit throughput, symbolized hits against raw ones ({} ms of stores, one subscriber; alternated, medians of {})\n",
        args.window.as_millis(),
        args.reps
    );
    println!(
        "| backend | writers | hits/s, raw | hits/s, symbolized | symbolized / raw | daemon CPU µs per hit, raw / symbolized | subscriber (bench) CPU µs per hit, raw / symbolized |"
    );
    println!("|---|---:|---:|---:|---:|---|---|");
    for backend in [Backend::Perf, Backend::Ptrace] {
        for &writers in &writer_counts {
            // [raw, symbolized] × (hits/s, daemon CPU, bench CPU per hit).
            let mut m: [[Vec<f64>; 3]; 2] = Default::default();
            // Alternated, so that drift on the machine hits both alike.
            for _ in 0..args.reps {
                for symbolized in [false, true] {
                    let r = throughput_once(backend, writers, args.window, !symbolized, &[], false)
                        .await?;
                    let per = |cpu: f64| cpu / r.daemon_hits.max(1) as f64;
                    let v = &mut m[usize::from(symbolized)];
                    v[0].push(r.sub_hits as f64 / r.secs);
                    v[1].push(per(r.daemon_cpu_us));
                    v[2].push(per(r.bench_cpu_us));
                }
            }
            let [raw, sym] = m.map(|v| v.map(median));
            println!(
                "| {} | {writers} | {:.0} | {:.0} | {:.3}× | {:.2} / {:.2} | {:.2} / {:.2} |",
                backend_name(backend),
                raw[0],
                sym[0],
                sym[0] / raw[0],
                raw[1],
                sym[1],
                raw[2],
                sym[2]
            );
            flush();
        }
    }
    Ok(())
}

/// SetWatchpoint + RemoveWatchpoint by name and by address, alternated.
async fn by_name_rows(args: &Args) -> Result<()> {
    let n = *args.threads.first().unwrap_or(&1000);
    let calls = (args.rpc_pairs / 10).max(5);
    println!(
        "\n## symbols: SetWatchpoint by name against by address, {n} threads ({calls} calls each, alternated)\n"
    );
    println!(
        "| backend | first by name (cold: module loaded) ms | by address p50 ms | by name p50 ms | by name / by address |"
    );
    println!("|---|---:|---:|---:|---:|");
    for backend in [Backend::Perf, Backend::Ptrace] {
        let mut t = CTarget::start("ct-pie").await?;
        let reply = t.cmd(&format!("threads {}", n.saturating_sub(1))).await?;
        let idle: usize = wpd_tests::field(&reply, "n")?;
        ensure!(idle + 1 >= n, "only {idle} threads started");
        let daemon = Daemon::start().await?;
        let mut client = daemon.client().await?;
        attach(&mut client, t.pid, backend).await?;
        let addr = t.addr("counter");
        let timeout = Duration::from_secs(60);
        let mut once = async |by_name: bool| -> Result<f64> {
            let t0 = Instant::now();
            let resp = set_watchpoint_within(
                &mut client,
                counter_spec(backend, t.pid, by_name, addr),
                timeout,
            )
            .await?;
            let took = ms(t0.elapsed());
            let wp = resp.watchpoint.context("no watchpoint")?;
            ensure!(
                wp.pieces.first().map(|p| p.address) == Some(addr),
                "resolved elsewhere: {wp:?}"
            );
            rpc_ok(
                "RemoveWatchpoint",
                client.remove_watchpoint(RemoveWatchpointRequest { id: wp.id }),
            )
            .await?;
            Ok(took)
        };
        let cold = once(true).await?;
        let (mut by_addr, mut by_name) = (Vec::new(), Vec::new());
        for _ in 0..calls {
            by_addr.push(once(false).await?);
            by_name.push(once(true).await?);
        }
        let (a, b) = (median(by_addr), median(by_name));
        println!(
            "| {} | {cold:.2} | {a:.2} | {b:.2} | {:.3}× |",
            backend_name(backend),
            b / a
        );
        flush();
        drop(daemon);
    }
    Ok(())
}

/// 1,000 functions store once each: symbolized (cold, then cached) and raw.
async fn many_ips_rows(args: &Args) -> Result<()> {
    let n: usize = env!("WPD_CT_IPS").parse()?;
    println!(
        "\n## symbols: {n} distinct hitting instructions (perf; each sweep calls {n} functions that store once each)\n"
    );
    println!(
        "| subscriber | sweep | until all {n} hits arrived, ms (median) | maps reads (GetStats) | code addresses cached | cache bytes: locations / modules | daemon RSS after, MiB |"
    );
    println!("|---|---|---:|---:|---:|---|---:|");
    for raw in [true, false] {
        let (mut first, mut again) = (Vec::new(), Vec::new());
        let (mut first_stats, mut again_stats) = (None, None);
        for _ in 0..args.reps {
            let daemon = Daemon::start().await?;
            let mut client = daemon.client().await?;
            let mut t = CTarget::start("ct-ips").await?;
            let mut events = EventStream::subscribe(
                &mut client,
                StreamEventsRequest {
                    pid: t.pid,
                    watchpoint_ids: vec![],
                    hits_only: true,
                    raw,
                    lease: false,
                    ..Default::default()
                },
            )
            .await?;
            set_watchpoint_within(
                &mut client,
                counter_spec(Backend::Perf, t.pid, true, 0),
                Duration::from_secs(30),
            )
            .await?;
            for round in 0..2 {
                let s0 = stats(&mut client).await?;
                let t0 = Instant::now();
                t.cmd("sweep").await?;
                let hits = events.collect_hits(n, Duration::from_secs(60)).await?;
                let took = ms(t0.elapsed());
                ensure!(
                    raw || hits.iter().all(|h| h
                        .location
                        .as_ref()
                        .is_some_and(|l| l.function.starts_with("store_"))),
                    "a hit not symbolized to its function"
                );
                let s1 = stats(&mut client).await?;
                let row = Some(IpsStats {
                    maps_reads: s1.symbol_maps_reads - s0.symbol_maps_reads,
                    cached: s1.locations,
                    location_bytes: s1.location_bytes,
                    module_bytes: s1.symbol_bytes,
                    rss_mib: mem_of(daemon.pid())?.rss as f64 / 1024.0,
                });
                if round == 0 {
                    first.push(took);
                    first_stats = row;
                } else {
                    again.push(took);
                    again_stats = row;
                }
            }
            drop(t);
            drop(daemon);
        }
        print_ips_row(raw, "first", median(first), first_stats);
        print_ips_row(raw, "again (cached)", median(again), again_stats);
        flush();
    }
    Ok(())
}

/// What `GetStats` and `/proc` said after a sweep (the last repetition's).
struct IpsStats {
    maps_reads: u64,
    cached: u64,
    location_bytes: u64,
    module_bytes: u64,
    rss_mib: f64,
}

fn print_ips_row(raw: bool, sweep: &str, ms: f64, s: Option<IpsStats>) {
    let Some(s) = s else { return };
    println!(
        "| {} | {sweep} | {ms:.1} | {} | {} | {} / {} | {:.1} |",
        if raw { "raw" } else { "symbolized" },
        s.maps_reads,
        s.cached,
        s.location_bytes,
        s.module_bytes,
        s.rss_mib
    );
}
